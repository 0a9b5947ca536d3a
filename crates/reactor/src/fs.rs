//! File and block-device I/O on the reactor's ring, including registered
//! (fixed) buffers: the same ring as the sockets, so a completed disk read
//! and the send of its data happen in the same loop turn.

use crate::buf::{IoBuf, IoBufMut};
use crate::op::{result, Op};
use crate::rt::with_core;
use io_uring::{opcode, types};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

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
/// request (see [`crate::op`]); nothing is counted per operation.
pub async fn read_at<B: IoBufMut>(file: BorrowedFd<'_>, mut buf: B, pos: u64) -> (io::Result<usize>, B) {
    let (ptr, len) = (buf.write_ptr(), buf.bytes_total());
    let fd = types::Fd(file.as_raw_fd());
    let entry = if is_fixed(ptr, len) {
        opcode::ReadFixed::new(fd, ptr, len as u32, 0).offset(pos).build()
    } else {
        opcode::Read::new(fd, ptr, len as u32).offset(pos).build()
    };
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
pub async fn write_at<B: IoBuf>(file: BorrowedFd<'_>, buf: B, pos: u64, dsync: bool) -> (io::Result<usize>, B) {
    let (ptr, len) = (buf.read_ptr(), buf.bytes_init());
    let fd = types::Fd(file.as_raw_fd());
    let flags = if dsync { libc::RWF_DSYNC } else { 0 };
    let entry = if is_fixed(ptr, len) {
        opcode::WriteFixed::new(fd, ptr, len as u32, 0).offset(pos).rw_flags(flags).build()
    } else {
        opcode::Write::new(fd, ptr, len as u32).offset(pos).rw_flags(flags).build()
    };
    let done = Op::submit_borrowed(entry, buf).await;
    (result(done.res), done.data)
}

/// `fdatasync` (or `fsync` with `data_only` false) of `file`.
pub async fn sync(file: BorrowedFd<'_>, data_only: bool) -> io::Result<()> {
    let mut op = opcode::Fsync::new(types::Fd(file.as_raw_fd()));
    if data_only {
        op = op.flags(types::FsyncFlags::DATASYNC);
    }
    let done = Op::submit_borrowed(op.build(), ()).await;
    result(done.res).map(drop)
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
