//! Registered (fixed) I/O buffers.
//!
//! [`register_buffers`] gives the calling reactor thread an arena of
//! 4096-aligned memory registered with its ring. `IoBuf`s the thread
//! allocates come out of the arena while it lasts, and file and block
//! device reads and writes on such a buffer go to the ring as
//! `READ_FIXED` / `WRITE_FIXED` (the reactor sees the address is inside
//! the registered region): the kernel pinned the pages once at registration
//! instead of on every `O_DIRECT` I/O. Everything here is thread-local: a
//! buffer that moves to another thread is used there as an ordinary buffer.
//!
//! The arena is never freed (reactor threads live as long as the process),
//! so a buffer the kernel may still touch is never handed to the allocator.

use std::cell::Cell;
use std::io;
use std::ptr::NonNull;

#[derive(Clone, Copy)]
struct Arena {
    base: usize,
    len: usize,
    /// Bytes handed out so far (bump allocation; buffers come back through
    /// the `IoBuf` pool, never to the arena).
    used: usize,
}

thread_local! {
    static ARENA: Cell<Option<Arena>> = const { Cell::new(None) };
}

/// The most [`register_buffers`] takes: io_uring registers at most 1 GiB
/// in one buffer.
pub const MAX_REGISTERED_BYTES: usize = 1 << 30;

/// Registers `bytes` (rounded up to 4 KiB) of I/O buffer memory with the
/// calling thread's reactor ring. Later `IoBuf`s of this thread come from it
/// until it is used up, and file and block device I/O on them uses
/// fixed-buffer operations. Once per thread; a second call is an error.
pub fn register_buffers(bytes: usize) -> io::Result<()> {
    if ARENA.with(Cell::get).is_some() {
        return Err(io::Error::new(io::ErrorKind::AlreadyExists, "this thread already registered its buffers"));
    }
    let len =
        bytes.checked_next_multiple_of(4096).filter(|&l| l > 0 && l <= MAX_REGISTERED_BYTES).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{bytes} bytes of registered buffers (1 B..1 GiB)"))
        })?;
    let layout = std::alloc::Layout::from_size_align(len, 4096).map_err(io::Error::other)?;
    // SAFETY: the layout has a non-zero size.
    let base = unsafe { std::alloc::alloc_zeroed(layout) };
    if base.is_null() {
        return Err(io::Error::new(io::ErrorKind::OutOfMemory, "registered buffer arena"));
    }
    // SAFETY: the arena is valid for `len` bytes and is never freed (it is
    // leaked on purpose, see the module documentation).
    if let Err(e) = unsafe { reactor::fs::register_fixed_buffer(base, len) } {
        // SAFETY: nothing was registered; the memory was allocated above
        // with this layout and is not referenced anywhere else.
        unsafe { std::alloc::dealloc(base, layout) };
        return Err(e);
    }
    ARENA.with(|a| a.set(Some(Arena { base: base as usize, len, used: 0 })));
    crate::iobuf::release_pooled();
    Ok(())
}

/// Bytes of this thread's arena, and how many of them buffers took.
pub fn arena_usage() -> Option<(usize, usize)> {
    ARENA.with(Cell::get).map(|a| (a.len, a.used))
}

/// `cap` fresh bytes from this thread's arena, if it has them.
pub(crate) fn alloc(cap: usize) -> Option<NonNull<u8>> {
    ARENA
        .try_with(|cell| {
            let mut a = cell.get()?;
            let end = a.used.checked_add(cap).filter(|&e| e <= a.len)?;
            let p = NonNull::new((a.base + a.used) as *mut u8);
            a.used = end;
            cell.set(Some(a));
            p
        })
        .ok()
        .flatten()
}

/// Whether `len` bytes at `ptr` lie inside this thread's arena.
#[cfg(test)]
fn in_arena(ptr: *const u8, len: usize) -> bool {
    reactor::fs::is_fixed(ptr, len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, IoBuf};
    use std::path::PathBuf;

    fn run<F: std::future::Future>(f: F) -> F::Output {
        reactor::Runtime::new(reactor::Config::default()).expect("runtime").block_on(f)
    }

    struct TempFile(PathBuf);

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn temp(tag: &str) -> TempFile {
        // Not /tmp: it may be tmpfs, where O_DIRECT is refused and every
        // I/O would take the buffered descriptor.
        let dir = std::env::var_os("CARGO_TARGET_TMPDIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        TempFile(dir.join(format!("blockdev-fixed-{tag}-{}", std::process::id())))
    }

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed)).collect()
    }

    // Each test runs on its own thread (the test harness's), so each
    // registers its own arena.

    #[test]
    fn io_on_arena_buffers_goes_through_the_registered_ring_and_round_trips() {
        let f = temp("rt");
        let dev = Device::file("f", &f.0, Some(4 << 20), 4096).expect("file device");
        run(async {
            assert!(!in_arena(IoBuf::with_len(4096).as_ptr(), 4096), "no arena before registering");
            register_buffers(1 << 20).expect("register 1 MiB");
            assert!(register_buffers(1 << 20).is_err(), "once per thread");
            for (i, len) in [4096usize, 65536, 131_072].into_iter().enumerate() {
                let data = pattern(i as u8, len);
                let buf = IoBuf::from_slice(&data);
                assert!(in_arena(buf.as_ptr(), buf.len()), "a {len}-byte buffer from the arena");
                let lba = 64 * i as u64;
                let (r, _) = dev.write(lba, buf, i == 1).await;
                r.expect("fixed write");
                let (r, back) = dev.read(lba, IoBuf::with_len(len)).await;
                r.expect("fixed read");
                assert!(back[..] == data[..], "{len} bytes read back");
            }
            let (size, used) = arena_usage().expect("arena");
            assert_eq!(size, 1 << 20);
            assert!(used >= 4096 + 65536 + 131_072, "{used}");
        });
        // The file holds what the ring wrote, seen through another path.
        let on_disk = std::fs::read(&f.0).expect("read file");
        assert!(on_disk[64 * 4096..][..65536] == pattern(1, 65536)[..]);
    }

    #[test]
    fn buffers_past_the_arena_fall_back_to_ordinary_memory_and_still_work() {
        let f = temp("fallback");
        let dev = Device::file("f", &f.0, Some(1 << 20), 512).expect("file device");
        run(async {
            register_buffers(8192).expect("register 8 KiB");
            let held: Vec<IoBuf> = (0..2).map(|_| IoBuf::with_len(4096)).collect();
            assert!(held.iter().all(|b| in_arena(b.as_ptr(), 4096)));
            let extra = IoBuf::from_slice(&pattern(7, 4096));
            assert!(!in_arena(extra.as_ptr(), 4096), "the arena is used up");
            let (r, _) = dev.write(3, extra, false).await;
            r.expect("ordinary write");
            // Unaligned to the 4096-byte direct path: the buffered descriptor,
            // still with a registered buffer.
            drop(held);
            let buf = IoBuf::with_len(512);
            assert!(in_arena(buf.as_ptr(), 512), "arena buffers come back through the pool");
            let (r, back) = dev.read(3, buf).await;
            r.expect("fixed read of 512 bytes");
            assert!(back[..] == pattern(7, 4096)[..512]);
        });
    }

    #[test]
    fn buffers_too_big_to_pool_never_take_arena_memory() {
        run(async {
            register_buffers(16 << 20).expect("register");
            let big = IoBuf::with_len(5 << 20);
            assert!(!in_arena(big.as_ptr(), big.len()));
            assert_eq!(arena_usage(), Some((16 << 20, 0)));
            drop(big);
            let small = IoBuf::with_len(8192);
            assert!(in_arena(small.as_ptr(), small.len()));
        });
    }
}
