//! File and block-device I/O on the reactor's ring, including registered
//! (fixed) buffers and registered files: the same ring as the sockets, so
//! a completed disk read and the send of its data happen in the same loop
//! turn.

use crate::buf::{IoBuf, IoBufMut};
use crate::op::{result, Op};
use crate::rt::{with_core, Remote};
use io_uring::{opcode, squeue, types};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// A file that every reactor may do I/O on (a device's descriptor). Each
/// reactor puts it in its ring's registered file table the first time it
/// does ([`crate::Features::fixed_files`], kernel 6.13+), and its reads and
/// writes then name the slot: the kernel takes no reference on the file
/// per operation, an atomic count that every reactor serving the device
/// would write. Dropped, on whatever thread, it asks each of those
/// reactors to empty its slot (waking it if it sleeps); the file closes
/// once they have and its requests in flight are done. Where a reactor
/// has no table, or it is full, that reactor uses the descriptor.
pub struct SharedFile {
    file: std::fs::File,
    /// False: always by descriptor ([`SharedFile::by_descriptor`]).
    register: bool,
    /// Names the file in each reactor's map of slots; never reused.
    key: u64,
    /// The reactors that gave it a slot, and the slot.
    homes: Mutex<Vec<(Arc<Remote>, u32)>>,
}

impl SharedFile {
    pub fn new(file: std::fs::File) -> SharedFile {
        static KEYS: AtomicU64 = AtomicU64::new(0);
        SharedFile { file, register: true, key: KEYS.fetch_add(1, Ordering::Relaxed), homes: Mutex::new(Vec::new()) }
    }

    /// A file that is never registered: closing its descriptor must let go
    /// of it at once (an `O_EXCL` claim on a block device, which a slot
    /// would hold until its reactor got round to emptying it).
    pub fn by_descriptor(file: std::fs::File) -> SharedFile {
        let mut f = SharedFile::new(file);
        f.register = false;
        f
    }

    /// The file, for everything but ring I/O.
    pub fn file(&self) -> &std::fs::File {
        &self.file
    }

    /// What this thread's ring names the file by, and the flags for it.
    fn target(&self) -> (types::Fd, squeue::Flags) {
        let fd = self.file.as_raw_fd();
        if !self.register {
            return (types::Fd(fd), squeue::Flags::empty());
        }
        match crate::rt::try_with_core(|c| c.shared_slot(self.key, fd, &self.homes)).flatten() {
            // A slot is below the table's size, which fits an i32.
            Some(slot) => (types::Fd(slot as i32), squeue::Flags::FIXED_FILE),
            None => (types::Fd(fd), squeue::Flags::empty()),
        }
    }
}

impl Drop for SharedFile {
    fn drop(&mut self) {
        for (home, slot) in self.homes.get_mut().unwrap_or_else(PoisonError::into_inner).drain(..) {
            home.release(self.key, slot);
        }
    }
}

impl AsFd for SharedFile {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// The file of a read or write: a descriptor, or a [`SharedFile`] by its
/// slot in this reactor's table where it has one.
#[derive(Clone, Copy)]
pub enum FileRef<'a> {
    Fd(BorrowedFd<'a>),
    Shared(&'a SharedFile),
}

impl FileRef<'_> {
    fn target(self) -> (types::Fd, squeue::Flags) {
        match self {
            FileRef::Fd(fd) => (types::Fd(fd.as_raw_fd()), squeue::Flags::empty()),
            FileRef::Shared(f) => f.target(),
        }
    }
}

impl<'a> From<BorrowedFd<'a>> for FileRef<'a> {
    fn from(fd: BorrowedFd<'a>) -> Self {
        FileRef::Fd(fd)
    }
}

impl<'a> From<&'a SharedFile> for FileRef<'a> {
    fn from(f: &'a SharedFile) -> Self {
        FileRef::Shared(f)
    }
}

/// Registers `len` bytes at `base` as this reactor's fixed buffer (index
/// 0). Reads and writes whose bytes lie inside it may use
/// [`read_at`]/[`write_at`] with `fixed` set.
///
/// # Safety
///
/// The memory must stay valid for as long as the reactor runs (it is
/// never unregistered).
pub unsafe fn register_fixed_buffer(base: *mut u8, len: usize) -> io::Result<()> {
    with_core(|core| {
        if core.fixed_region().is_some() {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, "this reactor already registered its buffers"));
        }
        let iov = libc::iovec { iov_base: base.cast(), iov_len: len };
        // SAFETY: the caller keeps the memory valid for the ring's life.
        unsafe { core.ring().submitter().register_buffers(&[iov])? };
        core.set_fixed_region((base as usize, len));
        Ok(())
    })
}

/// Whether `len` bytes at `ptr` lie in this reactor's fixed buffer.
pub fn is_fixed(ptr: *const u8, len: usize) -> bool {
    crate::rt::try_with_core(|c| {
        c.fixed_region().is_some_and(|(base, blen)| {
            let p = ptr as usize;
            p >= base && p.checked_add(len).is_some_and(|e| e <= base + blen)
        })
    })
    .unwrap_or(false)
}

/// Reads `buf`'s writable bytes at `pos` of `file`: bytes read and the
/// buffer. The borrow keeps the descriptor open until the kernel has the
/// request (see [`crate::op`]); nothing is counted per operation. The
/// future must be awaited or dropped, never leaked (`mem::forget`): a
/// leaked one's queued entry would outlive the borrow. The same holds for
/// every function here that takes a borrowed descriptor.
///
/// The future holds a slot of this thread's ring, and the kernel writes
/// into `buf` until its completion: it cannot move to another thread,
/// where dropping it would free `buf` under the kernel.
///
/// ```no_run
/// use std::os::fd::AsFd;
/// fn here<T>(_: T) {}
/// let file = std::fs::File::open("/dev/zero").unwrap();
/// here(reactor::fs::read_at(file.as_fd(), vec![0u8; 8], 0));
/// ```
///
/// ```compile_fail
/// use std::os::fd::AsFd;
/// fn elsewhere<T: Send>(_: T) {}
/// let file = std::fs::File::open("/dev/zero").unwrap();
/// elsewhere(reactor::fs::read_at(file.as_fd(), vec![0u8; 8], 0));
/// ```
pub async fn read_at<'a, B: IoBufMut>(file: impl Into<FileRef<'a>>, mut buf: B, pos: u64) -> (io::Result<usize>, B) {
    let (ptr, len) = (buf.write_ptr(), buf.bytes_total());
    let (fd, flags) = file.into().target();
    let entry = if is_fixed(ptr, len) {
        opcode::ReadFixed::new(fd, ptr, len as u32, 0).offset(pos).build()
    } else {
        opcode::Read::new(fd, ptr, len as u32).offset(pos).build()
    }
    .flags(flags);
    let done = Op::submit_borrowed(entry, buf).await;
    let mut buf = done.data;
    let n = result(done.res);
    if let Ok(n) = n {
        // SAFETY: the kernel wrote `n` bytes.
        unsafe { buf.set_init(n) };
    }
    (n, buf)
}

/// Writes `buf`'s bytes at `pos` of `file`; with `dsync` the write is
/// durable when it completes (`RWF_DSYNC`, the FUA of a file).
pub async fn write_at<'a, B: IoBuf>(
    file: impl Into<FileRef<'a>>,
    buf: B,
    pos: u64,
    dsync: bool,
) -> (io::Result<usize>, B) {
    let (ptr, len) = (buf.read_ptr(), buf.bytes_init());
    let (fd, sqe_flags) = file.into().target();
    let flags = if dsync { libc::RWF_DSYNC } else { 0 };
    let entry = if is_fixed(ptr, len) {
        opcode::WriteFixed::new(fd, ptr, len as u32, 0).offset(pos).rw_flags(flags).build()
    } else {
        opcode::Write::new(fd, ptr, len as u32).offset(pos).rw_flags(flags).build()
    }
    .flags(sqe_flags);
    let done = Op::submit_borrowed(entry, buf).await;
    (result(done.res), done.data)
}

/// `fdatasync` (or `fsync` with `data_only` false) of `file`.
pub async fn sync(file: BorrowedFd<'_>, data_only: bool) -> io::Result<()> {
    sync_keeping(file, data_only, (), |_, _| {}).await.0
}

/// [`sync`] whose result is never lost: if the future is dropped before the
/// kernel completes the sync, `on_lost` is called with `keep` and the
/// result when it does (the sync is not cancelled), and `keep` lives until
/// then; otherwise `keep` comes back with the result. The kernel reports a
/// writeback error to one sync of a descriptor only: a caller that latches
/// sync errors must hear of one that its dropped future would have seen.
pub async fn sync_keeping<T: 'static>(
    file: BorrowedFd<'_>,
    data_only: bool,
    keep: T,
    on_lost: fn(&T, i32),
) -> (io::Result<()>, T) {
    let mut op = opcode::Fsync::new(types::Fd(file.as_raw_fd()));
    if data_only {
        op = op.flags(types::FsyncFlags::DATASYNC);
    }
    let done = Op::submit_borrowed(op.build(), keep).on_lost(on_lost).await;
    (result(done.res).map(drop), done.data)
}

/// `fallocate(mode, offset, len)` of `file`, off the thread.
pub async fn fallocate(file: BorrowedFd<'_>, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    let entry = opcode::Fallocate::new(types::Fd(file.as_raw_fd()), len).offset(offset).mode(mode).build();
    let done = Op::submit_borrowed(entry, ()).await;
    result(done.res).map(drop)
}

/// `BLOCK_URING_CMD_DISCARD` (`<linux/blkdev.h>`, `_IO(0x12, 0)`): the
/// block device's io_uring command that discards `[addr, addr + addr3)`.
const BLOCK_URING_CMD_DISCARD: u32 = 0x1200;

/// Discards `[offset, offset + len)` of a block device opened for writing,
/// without blocking the thread: the kernel (6.12 and later) submits the
/// discard bios itself and completes the command when they finish. Older
/// kernels, and devices without discard, answer `EOPNOTSUPP`. There is no
/// `fallocate` mode for this: `FALLOC_FL_NO_HIDE_STALE`, which
/// `blkdev_fallocate` once mapped to a discard, was always refused by
/// `vfs_fallocate` and was dropped in 6.12.
pub async fn discard(file: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    let entry = opcode::UringCmd16::new(types::Fd(file.as_raw_fd()), BLOCK_URING_CMD_DISCARD)
        .addr(Some(offset))
        .cmd(pack_u64(len))
        .build();
    let done = Op::submit_borrowed(entry, ()).await;
    result(done.res).map(drop)
}

/// The 16 command bytes of a `UringCmd16` start at the SQE's `addr3`: `v`
/// there, the rest zero.
fn pack_u64(v: u64) -> [u8; 16] {
    let mut cmd = [0u8; 16];
    let (head, _) = cmd.split_at_mut(8);
    head.copy_from_slice(&v.to_ne_bytes());
    cmd
}
