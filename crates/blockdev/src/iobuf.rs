//! `IoBuf`: an owned, 4096-byte aligned, always-initialized byte buffer that
//! io_uring can read into and write from (including with `O_DIRECT`).
//!
//! Buffers come from a per-thread free list per power-of-two size class and go
//! back to the free list of the thread that drops them, so the I/O hot path
//! does not touch the global allocator. No locks: each pool is thread-local.

use std::alloc::{self, Layout};
use std::cell::RefCell;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every buffer: the largest logical block size `O_DIRECT`
/// needs on common devices, and the page size on x86-64 / most aarch64.
pub const IO_BUF_ALIGN: usize = 4096;

/// Smallest size class (log2): 4 KiB.
const MIN_CLASS_SHIFT: u32 = 12;
/// Largest pooled size class (log2): 4 MiB, so a 1 MiB transfer plus slack
/// and the biggest MDTS we plan to advertise stay pooled.
const MAX_CLASS_SHIFT: u32 = 22;
const CLASSES: usize = (MAX_CLASS_SHIFT - MIN_CLASS_SHIFT + 1) as usize;
/// Bytes each thread may keep idle per size class (at least
/// `MIN_POOLED_PER_CLASS` and at most `MAX_POOLED_PER_CLASS` buffers).
const POOL_BYTES_PER_CLASS: usize = 8 << 20;
const MIN_POOLED_PER_CLASS: usize = 4;
const MAX_POOLED_PER_CLASS: usize = 256;

/// An owned, 4096-aligned buffer of initialized bytes.
///
/// `len()` is the number of bytes an I/O reads or writes; the allocation
/// behind it (`capacity()`) is a size class and may be larger. New memory is
/// zeroed once when first allocated; a reused buffer holds whatever its last
/// user left, so callers that need zeros must fill them (`fill(0)`).
pub struct IoBuf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
    /// The memory is part of a registered arena (`fixed`): it is pooled
    /// whatever the pool's limit and never freed.
    arena: bool,
}

impl Default for IoBuf {
    /// An empty buffer.
    fn default() -> IoBuf {
        IoBuf::with_len(0)
    }
}

// SAFETY: an IoBuf uniquely owns its allocation (no aliasing handles exist),
// so moving it to another thread is like moving a Vec<u8>.
unsafe impl Send for IoBuf {}
// SAFETY: shared access only hands out `&[u8]`; mutation needs `&mut IoBuf`.
unsafe impl Sync for IoBuf {}

struct Pool {
    /// Idle buffers per class, with whether each is arena memory.
    free: [Vec<(NonNull<u8>, bool)>; CLASSES],
}

impl Drop for Pool {
    fn drop(&mut self) {
        for (class, list) in self.free.iter_mut().enumerate() {
            let cap = class_size(class);
            for (ptr, arena) in list.drain(..) {
                if !arena {
                    dealloc(ptr, cap);
                }
            }
        }
    }
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool { free: Default::default() });
}

/// Frees this thread's idle ordinary buffers, so that the next ones come
/// from a just-registered arena instead.
pub(crate) fn release_pooled() {
    let _ = POOL.try_with(|pool| {
        for (class, list) in pool.borrow_mut().free.iter_mut().enumerate() {
            list.retain(|&(ptr, arena)| {
                if !arena {
                    dealloc(ptr, class_size(class));
                }
                arena
            });
        }
    });
}

fn class_size(class: usize) -> usize {
    1usize << (class as u32 + MIN_CLASS_SHIFT)
}

/// Size class index for a capacity, if that capacity is pooled.
fn class_of(cap: usize) -> Option<usize> {
    if !cap.is_power_of_two() {
        return None;
    }
    let shift = cap.trailing_zeros();
    if (MIN_CLASS_SHIFT..=MAX_CLASS_SHIFT).contains(&shift) {
        Some((shift - MIN_CLASS_SHIFT) as usize)
    } else {
        None
    }
}

fn pool_limit(class: usize) -> usize {
    (POOL_BYTES_PER_CLASS / class_size(class)).clamp(MIN_POOLED_PER_CLASS, MAX_POOLED_PER_CLASS)
}

fn layout(cap: usize) -> Layout {
    match Layout::from_size_align(cap, IO_BUF_ALIGN) {
        Ok(layout) => layout,
        Err(_) => panic!("IoBuf capacity {cap} exceeds the address space"),
    }
}

fn alloc_zeroed(cap: usize) -> NonNull<u8> {
    let layout = layout(cap);
    // SAFETY: `cap` is never zero (the smallest class is 4096 bytes), so the
    // layout has non-zero size as `alloc_zeroed` requires.
    let ptr = unsafe { alloc::alloc_zeroed(layout) };
    match NonNull::new(ptr) {
        Some(ptr) => ptr,
        None => alloc::handle_alloc_error(layout),
    }
}

fn dealloc(ptr: NonNull<u8>, cap: usize) {
    // SAFETY: `ptr` was returned by `alloc_zeroed(layout(cap))` with this
    // very `cap`, and ownership of it ends here.
    unsafe { alloc::dealloc(ptr.as_ptr(), layout(cap)) }
}

/// Capacity that holds `len` bytes: a pooled power-of-two class, or for very
/// large buffers `len` rounded up to the alignment.
fn capacity_for(len: usize) -> usize {
    let min = 1usize << MIN_CLASS_SHIFT;
    if len <= 1usize << MAX_CLASS_SHIFT {
        len.max(min).next_power_of_two()
    } else {
        match len.checked_next_multiple_of(IO_BUF_ALIGN) {
            Some(cap) => cap,
            None => panic!("IoBuf length {len} exceeds the address space"),
        }
    }
}

impl IoBuf {
    /// A buffer of `len` initialized bytes (contents unspecified: zeros when
    /// fresh, old data when reused from the pool).
    pub fn with_len(len: usize) -> IoBuf {
        let cap = capacity_for(len);
        let pooled =
            class_of(cap).and_then(|class| POOL.try_with(|pool| pool.borrow_mut().free[class].pop()).ok().flatten());
        // Only pooled sizes come from the arena: a buffer that is not
        // pooled would leave the arena for good when dropped.
        let from_arena = || class_of(cap).and_then(|_| crate::fixed::alloc(cap));
        let (ptr, arena) = pooled.unwrap_or_else(|| match from_arena() {
            Some(ptr) => (ptr, true),
            None => (alloc_zeroed(cap), false),
        });
        IoBuf { ptr, len, cap, arena }
    }

    /// A buffer of `len` zero bytes.
    pub fn zeroed(len: usize) -> IoBuf {
        let mut buf = IoBuf::with_len(len);
        buf.fill(0);
        buf
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> IoBuf {
        let mut buf = IoBuf::with_len(data.len());
        buf.copy_from_slice(data);
        buf
    }

    /// Bytes an I/O on this buffer transfers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when `len()` is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes allocated (a size class, at least `len()`).
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Shortens the buffer to `len` bytes; a longer `len` does nothing.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Sets the length to `len` if it fits in `capacity()`, returning whether
    /// it did. Bytes past the old length keep their (initialized) old values.
    pub fn set_len(&mut self, len: usize) -> bool {
        if len <= self.cap {
            self.len = len;
            true
        } else {
            false
        }
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        if let Some(class) = class_of(self.cap) {
            let (ptr, arena) = (self.ptr, self.arena);
            let kept = POOL
                .try_with(|pool| {
                    let mut pool = pool.borrow_mut();
                    let list = &mut pool.free[class];
                    if arena || list.len() < pool_limit(class) {
                        list.push((ptr, arena));
                        true
                    } else {
                        false
                    }
                })
                .unwrap_or(false);
            if kept {
                return;
            }
        }
        if !self.arena {
            dealloc(self.ptr, self.cap);
        }
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `cap >= len` bytes, all initialized
        // (zeroed at allocation, only ever overwritten with bytes since), and
        // `&self` guarantees no `&mut` access for the returned lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoBuf").field("len", &self.len).field("capacity", &self.cap).finish()
    }
}

// SAFETY: `read_ptr` points at `bytes_init() == len` initialized bytes that
// stay valid and unmoved while the IoBuf is alive, even when the IoBuf value
// itself moves (the allocation is on the heap); io_uring holds the IoBuf
// until the operation completes.
unsafe impl reactor::buf::IoBuf for IoBuf {
    fn read_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    fn bytes_init(&self) -> usize {
        self.len
    }
}

// SAFETY: `write_ptr` points at `bytes_total() == len` writable bytes that
// stay valid and unmoved while the IoBuf is alive. All of them are already
// initialized, so the kernel writing any prefix keeps the buffer valid and
// `set_init` has nothing to record (the length is the I/O size, fixed by the
// caller, not the number of bytes read).
unsafe impl reactor::buf::IoBufMut for IoBuf {
    fn write_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn bytes_total(&mut self) -> usize {
        self.len
    }

    unsafe fn set_init(&mut self, _pos: usize) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_4096_aligned_for_every_size() {
        for len in [0, 1, 512, 4096, 4097, 65536, 1 << 20, (4 << 20) + 1] {
            let buf = IoBuf::with_len(len);
            assert_eq!(buf.as_ptr() as usize % IO_BUF_ALIGN, 0, "len {len}");
            assert_eq!(buf.len(), len);
            assert!(buf.capacity() >= len);
        }
    }

    #[test]
    fn dropped_buffer_is_reused_by_same_size_class() {
        let first = IoBuf::with_len(8192);
        let addr = first.as_ptr();
        drop(first);
        let second = IoBuf::with_len(5000);
        assert_eq!(second.as_ptr(), addr);
        assert_eq!(second.capacity(), 8192);
    }

    #[test]
    fn from_slice_copies_and_truncate_shortens() {
        let mut buf = IoBuf::from_slice(b"hello world");
        assert_eq!(&buf[..], b"hello world");
        buf.truncate(5);
        assert_eq!(&buf[..], b"hello");
        buf.truncate(100);
        assert_eq!(buf.len(), 5);
        assert!(buf.set_len(11));
        assert_eq!(&buf[..], b"hello world");
        assert!(!buf.set_len(buf.capacity() + 1));
    }

    #[test]
    fn zeroed_buffer_is_zero_even_when_reused() {
        let mut dirty = IoBuf::with_len(4096);
        dirty.fill(0xa5);
        drop(dirty);
        let clean = IoBuf::zeroed(4096);
        assert!(clean.iter().all(|&b| b == 0));
    }

    #[test]
    fn buffer_dropped_on_another_thread_is_freed_safely() {
        let buf = IoBuf::from_slice(&[7u8; 10000]);
        std::thread::spawn(move || assert_eq!(buf[9999], 7)).join().expect("thread");
    }
}
