//! Registered (fixed) I/O buffers.
//!
//! [`register_buffers`] gives the calling reactor thread an arena of
//! 4096-aligned memory registered with an io_uring of its own. `IoBuf`s the
//! thread allocates come out of the arena while it lasts, and file and block
//! device reads and writes on such a buffer go to that ring as
//! `READ_FIXED` / `WRITE_FIXED`: the kernel pinned the pages once at
//! registration instead of on every `O_DIRECT` I/O. FUA writes carry
//! `RWF_DSYNC` instead of a separate fdatasync.
//!
//! monoio 0.2 keeps its own ring private, so the registered ring is a
//! second one per thread. It signals an eventfd on every completion; a task
//! on the thread's monoio runtime reads the eventfd and wakes the waiting
//! I/Os. Everything here is thread-local: a buffer that moves to another
//! thread is used there as an ordinary buffer (the range check fails).
//!
//! The arena is never freed (reactor threads live as long as the process),
//! so a buffer the kernel may still touch is never handed to the allocator.

use crate::iobuf::IoBuf;
use io_uring::{opcode, squeue, types, IoUring};
use std::any::Any;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::os::fd::{FromRawFd, RawFd};
use std::pin::Pin;
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

/// Submission queue entries of a thread's registered ring.
const RING_ENTRIES: u32 = 1024;
/// Completion queue entries: room for many I/Os in flight. Beyond that the
/// kernel keeps completions on its overflow list (NODROP) until `reap`
/// flushes them.
const CQ_ENTRIES: u32 = 16384;

/// What keeps an I/O's file descriptor open until its completion.
pub(crate) type KeepOpen = Arc<dyn Any + Send + Sync>;

/// The descriptor of an I/O and what keeps it open until the kernel is
/// done with it (even if the I/O's future and the device are dropped).
pub(crate) struct FileRef {
    pub fd: RawFd,
    pub owner: KeepOpen,
}

struct Op {
    /// The buffer the kernel reads or writes; kept here (not in the future)
    /// so that dropping the future early leaves it alive until completion.
    buf: Option<IoBuf>,
    /// The owner of the descriptor in the entry: a dropped device must not
    /// let the number be reused while the entry may still be issued.
    _fd_owner: KeepOpen,
    result: Option<i32>,
    waker: Option<Waker>,
    /// The future was dropped: free the slot when the completion arrives.
    abandoned: bool,
}

/// One thread's registered ring and arena.
pub(crate) struct Ring {
    ring: RefCell<IoUring>,
    base: usize,
    len: usize,
    /// Bytes of the arena handed out so far (bump allocation; buffers come
    /// back through the `IoBuf` pool, never to the arena).
    used: Cell<usize>,
    ops: RefCell<Vec<Option<Op>>>,
    free: RefCell<Vec<usize>>,
    /// Entries are queued but not yet submitted: the submitter task hands
    /// them to the kernel in one system call when the I/Os of this loop
    /// turn have queued theirs.
    unsubmitted: Cell<bool>,
    submitter: RefCell<Option<Waker>>,
    /// Wakers of the I/Os one reap completed, reused so reaping does not
    /// allocate.
    woken: RefCell<Vec<Waker>>,
}

thread_local! {
    static RING: RefCell<Option<Rc<Ring>>> = const { RefCell::new(None) };
}

/// Registers `bytes` (rounded up to 4 KiB) of I/O buffer memory for the
/// calling thread, which must be running a monoio runtime with io_uring.
/// Later `IoBuf`s of this thread come from it until it is used up, and
/// file and block device I/O on them uses fixed-buffer operations. Once
/// per thread; a second call is an error.
pub fn register_buffers(bytes: usize) -> io::Result<()> {
    if RING.with(|r| r.borrow().is_some()) {
        return Err(io::Error::new(io::ErrorKind::AlreadyExists, "this thread already registered its buffers"));
    }
    let len = bytes.checked_next_multiple_of(4096).filter(|&l| l > 0 && l <= 1 << 30).ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("{bytes} bytes of registered buffers (1 B..1 GiB)"))
    })?;
    let ring = IoUring::builder().setup_cqsize(CQ_ENTRIES).build(RING_ENTRIES)?;
    if !ring.params().is_feature_nodrop() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the kernel's io_uring may drop completions (no NODROP)",
        ));
    }
    let layout = std::alloc::Layout::from_size_align(len, 4096).map_err(io::Error::other)?;
    // SAFETY: the layout has a non-zero size.
    let base = unsafe { std::alloc::alloc_zeroed(layout) };
    if base.is_null() {
        return Err(io::Error::new(io::ErrorKind::OutOfMemory, "registered buffer arena"));
    }
    let iov = libc::iovec { iov_base: base.cast(), iov_len: len };
    // SAFETY: the arena is valid for `len` bytes and is never freed (it is
    // leaked on purpose, see the module documentation).
    if let Err(e) = unsafe { ring.submitter().register_buffers(&[iov]) } {
        // SAFETY: nothing was registered; the memory was allocated above
        // with this layout and is not referenced anywhere else.
        unsafe { std::alloc::dealloc(base, layout) };
        return Err(e);
    }
    // SAFETY: eventfd has no memory preconditions; the result is checked.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if efd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `efd` is a fresh descriptor owned by nobody else.
    let efd_file = unsafe { std::fs::File::from_raw_fd(efd as RawFd) };
    ring.submitter().register_eventfd(efd)?;
    let efd = monoio::fs::File::from_std(efd_file)?;
    let r = Rc::new(Ring {
        ring: RefCell::new(ring),
        base: base as usize,
        len,
        used: Cell::new(0),
        ops: RefCell::new(Vec::new()),
        free: RefCell::new(Vec::new()),
        unsubmitted: Cell::new(false),
        submitter: RefCell::new(None),
        woken: RefCell::new(Vec::new()),
    });
    RING.with(|cell| *cell.borrow_mut() = Some(r.clone()));
    crate::iobuf::release_pooled();
    monoio::spawn(Submitter(r.clone()));
    monoio::spawn(reap_loop(r, efd));
    Ok(())
}

/// Bytes of this thread's arena, and how many of them buffers took.
pub fn arena_usage() -> Option<(usize, usize)> {
    RING.with(|r| r.borrow().as_ref().map(|r| (r.len, r.used.get())))
}

/// `cap` fresh bytes from this thread's arena, if it has them.
pub(crate) fn alloc(cap: usize) -> Option<NonNull<u8>> {
    RING.try_with(|r| {
        let r = r.borrow();
        let r = r.as_ref()?;
        let used = r.used.get();
        let end = used.checked_add(cap).filter(|&e| e <= r.len)?;
        r.used.set(end);
        NonNull::new((r.base + used) as *mut u8)
    })
    .ok()
    .flatten()
}

/// This thread's ring when `len` bytes at `ptr` lie inside its arena.
pub(crate) fn ring_for(ptr: *const u8, len: usize) -> Option<Rc<Ring>> {
    RING.try_with(|r| {
        let r = r.borrow();
        let ring = r.as_ref()?;
        let start = ptr as usize;
        let inside = start >= ring.base && start.checked_add(len)? <= ring.base + ring.len;
        inside.then(|| ring.clone())
    })
    .ok()
    .flatten()
}

/// The task that submits the queued entries, once per wake-up.
struct Submitter(Rc<Ring>);

impl Future for Submitter {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let ring = &self.0;
        if ring.unsubmitted.replace(false) {
            let mut r = ring.ring.borrow_mut();
            let res = r.submit();
            let left = r.submission().len();
            drop(r);
            if let Err(e) = &res {
                log::warn!("registered ring: submit failed ({e}); retrying");
            }
            if res.is_err() || left > 0 {
                // Entries are still queued: run again on the next turn.
                ring.unsubmitted.set(true);
                cx.waker().wake_by_ref();
            }
        }
        *ring.submitter.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}

async fn reap_loop(ring: Rc<Ring>, efd: monoio::fs::File) {
    let mut buf = vec![0u8; 8];
    loop {
        let (res, b) = efd.read_at(buf, 0).await;
        buf = b;
        if let Err(e) = res {
            // Without the reaper nothing would complete: later I/O on this
            // thread takes the ordinary path (arena buffers stay usable).
            log::error!("registered-buffer ring: reading its eventfd failed ({e}); no fixed I/O on this thread now");
            RING.with(|r| r.borrow_mut().take());
            return;
        }
        ring.reap();
    }
}

impl Ring {
    fn reap(&self) {
        let mut wake = std::mem::take(&mut *self.woken.borrow_mut());
        let mut dead = Vec::new();
        loop {
            {
                let mut ring = self.ring.borrow_mut();
                let mut ops = self.ops.borrow_mut();
                for cqe in ring.completion() {
                    let idx = cqe.user_data() as usize;
                    let Some(slot) = ops.get_mut(idx) else { continue };
                    match slot {
                        Some(op) if op.abandoned => {
                            dead.push(slot.take());
                            self.free.borrow_mut().push(idx);
                        }
                        Some(op) => {
                            op.result = Some(cqe.result());
                            wake.extend(op.waker.take());
                        }
                        None => {}
                    }
                }
                // Completions that did not fit wait on the kernel's overflow
                // list; an enter with GETEVENTS moves them to the queue.
                if !ring.submission().cq_overflow() {
                    break;
                }
                if let Err(e) = ring.submitter().submit_and_wait(0) {
                    log::warn!("registered ring: flushing overflowed completions failed: {e}");
                    break;
                }
            }
        }
        // Wake and drop with no borrow held: a waker may run code that
        // starts or drops I/O on this ring.
        drop(dead);
        for w in wake.drain(..) {
            w.wake();
        }
        *self.woken.borrow_mut() = wake;
    }

    fn start(
        self: &Rc<Self>,
        entry: squeue::Entry,
        buf: IoBuf,
        fd_owner: KeepOpen,
    ) -> Result<FixedIo, (io::Error, IoBuf)> {
        let idx = {
            let mut ops = self.ops.borrow_mut();
            let op = Op { buf: Some(buf), _fd_owner: fd_owner, result: None, waker: None, abandoned: false };
            match self.free.borrow_mut().pop() {
                Some(i) => {
                    if let Some(slot) = ops.get_mut(i) {
                        *slot = Some(op);
                    }
                    i
                }
                None => {
                    ops.push(Some(op));
                    ops.len() - 1
                }
            }
        };
        let entry = entry.user_data(idx as u64);
        let mut ring = self.ring.borrow_mut();
        // SAFETY: the entry's buffer is owned by the op slot until its
        // completion is reaped, and its descriptor outlives the I/O (the
        // device keeps it open).
        let mut pushed = unsafe { ring.submission().push(&entry).is_ok() };
        if !pushed {
            // The queue is full: hand the kernel what is queued and retry.
            let _ = ring.submit();
            // SAFETY: as above.
            pushed = unsafe { ring.submission().push(&entry).is_ok() };
        }
        if !pushed {
            drop(ring);
            let buf = self.ops.borrow_mut().get_mut(idx).and_then(Option::take).and_then(|op| op.buf);
            self.free.borrow_mut().push(idx);
            return Err((io::Error::other("registered ring: submission queue full"), buf.unwrap_or_default()));
        }
        drop(ring);
        if !self.unsubmitted.replace(true) {
            if let Some(w) = self.submitter.borrow().as_ref() {
                w.wake_by_ref();
            }
        }
        Ok(FixedIo { ring: self.clone(), idx, done: false })
    }

    /// Reads `len` bytes at `pos` of `file` into `buf[at..at + len]`.
    pub(crate) fn read(
        self: &Rc<Self>,
        file: FileRef,
        mut buf: IoBuf,
        at: usize,
        len: usize,
        pos: u64,
    ) -> Result<FixedIo, (io::Error, IoBuf)> {
        let Some(ptr) = buf.get_mut(at..at.saturating_add(len)).map(|s| s.as_mut_ptr()) else {
            return Err((io::Error::other("fixed read beyond its buffer"), buf));
        };
        let entry = opcode::ReadFixed::new(types::Fd(file.fd), ptr, len as u32, 0).offset(pos).build();
        self.start(entry, buf, file.owner)
    }

    /// Writes `buf[at..at + len]` at `pos` of `file`, with `RWF_DSYNC` if
    /// `dsync`.
    pub(crate) fn write(
        self: &Rc<Self>,
        file: FileRef,
        buf: IoBuf,
        at: usize,
        len: usize,
        pos: u64,
        dsync: bool,
    ) -> Result<FixedIo, (io::Error, IoBuf)> {
        let Some(ptr) = buf.get(at..at.saturating_add(len)).map(<[u8]>::as_ptr) else {
            return Err((io::Error::other("fixed write beyond its buffer"), buf));
        };
        let flags = if dsync { libc::RWF_DSYNC } else { 0 };
        let entry = opcode::WriteFixed::new(types::Fd(file.fd), ptr, len as u32, 0).offset(pos).rw_flags(flags).build();
        self.start(entry, buf, file.owner)
    }
}

/// A fixed-buffer read or write in flight: the bytes transferred (or the
/// error) and the buffer back.
pub(crate) struct FixedIo {
    ring: Rc<Ring>,
    idx: usize,
    done: bool,
}

impl Future for FixedIo {
    type Output = (io::Result<usize>, IoBuf);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let idx = self.idx;
        let mut ops = self.ring.ops.borrow_mut();
        let Some(Some(op)) = ops.get_mut(idx) else {
            drop(ops);
            self.done = true;
            return Poll::Ready((Err(io::Error::other("fixed I/O slot vanished")), IoBuf::default()));
        };
        let Some(res) = op.result else {
            op.waker = Some(cx.waker().clone());
            return Poll::Pending;
        };
        let buf = op.buf.take().unwrap_or_default();
        if let Some(slot) = ops.get_mut(idx) {
            *slot = None;
        }
        drop(ops);
        self.ring.free.borrow_mut().push(idx);
        self.done = true;
        let out = if res < 0 { Err(io::Error::from_raw_os_error(-res)) } else { Ok(res as usize) };
        Poll::Ready((out, buf))
    }
}

impl Drop for FixedIo {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut ops = self.ring.ops.borrow_mut();
        if let Some(slot) = ops.get_mut(self.idx) {
            match slot {
                // Completed but never polled: the buffer can go.
                Some(op) if op.result.is_some() => {
                    *slot = None;
                    self.ring.free.borrow_mut().push(self.idx);
                }
                Some(op) => op.abandoned = true,
                None => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;
    use std::os::fd::AsRawFd;
    use std::path::PathBuf;

    fn run<F: Future>(f: F) -> F::Output {
        let mut rt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new().enable_timer().build().expect("runtime");
        rt.block_on(f)
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
            assert!(ring_for(IoBuf::with_len(4096).as_ptr(), 4096).is_none(), "no arena before registering");
            register_buffers(1 << 20).expect("register 1 MiB");
            assert!(register_buffers(1 << 20).is_err(), "once per thread");
            for (i, len) in [4096usize, 65536, 131_072].into_iter().enumerate() {
                let data = pattern(i as u8, len);
                let buf = IoBuf::from_slice(&data);
                assert!(ring_for(buf.as_ptr(), buf.len()).is_some(), "a {len}-byte buffer from the arena");
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
            assert!(held.iter().all(|b| ring_for(b.as_ptr(), 4096).is_some()));
            let extra = IoBuf::from_slice(&pattern(7, 4096));
            assert!(ring_for(extra.as_ptr(), 4096).is_none(), "the arena is used up");
            let (r, _) = dev.write(3, extra, false).await;
            r.expect("ordinary write");
            // Unaligned to the 4096-byte direct path: the buffered descriptor,
            // still with a registered buffer.
            drop(held);
            let buf = IoBuf::with_len(512);
            assert!(ring_for(buf.as_ptr(), 512).is_some(), "arena buffers come back through the pool");
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
            assert!(ring_for(big.as_ptr(), big.len()).is_none());
            assert_eq!(arena_usage(), Some((16 << 20, 0)));
            drop(big);
            let small = IoBuf::with_len(8192);
            assert!(ring_for(small.as_ptr(), small.len()).is_some());
        });
    }

    #[test]
    fn dropping_an_io_in_flight_keeps_its_buffer_until_the_kernel_is_done() {
        let f = temp("abandon");
        let dev = Device::file("f", &f.0, Some(4 << 20), 4096).expect("file device");
        run(async {
            register_buffers(1 << 20).expect("register");
            let ring = ring_for(IoBuf::with_len(4096).as_ptr(), 4096).expect("ring");
            let file = std::fs::OpenOptions::new().read(true).open(&f.0).expect("open");
            let fd = file.as_raw_fd();
            let file = FileRef { fd, owner: Arc::new(file) };
            let io = ring.read(file, IoBuf::with_len(65536), 0, 65536, 0).map_err(|e| e.0);
            drop(io.expect("submitted"));
            // Later I/O still completes, and the abandoned slot is freed when
            // its completion is reaped.
            for _ in 0..4 {
                let (r, _) = dev.read(0, IoBuf::with_len(65536)).await;
                r.expect("read after an abandoned one");
            }
            monoio::time::sleep(std::time::Duration::from_millis(20)).await;
            let live = ring.ops.borrow().iter().filter(|o| o.is_some()).count();
            assert_eq!(live, 0, "every slot freed");
        });
    }
}
