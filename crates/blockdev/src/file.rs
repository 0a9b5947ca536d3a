//! File and block-device backend: reads, writes, flushes, write zeroes and
//! deallocate go through the calling reactor thread's io_uring (the same
//! ring as its sockets). Zeroing is a ring `FALLOCATE`, which the kernel
//! runs in its io-wq workers, and a block device's discard a ring command:
//! no zeroing or discard of any size is a synchronous syscall on a reactor
//! thread. The only block ioctls left are the logical block size, read
//! once when the device is opened, and the size, read then and once a
//! second by the daemon's size watch (off the reactors), which follows a
//! device grown under it. One other call is synchronous, and rare: GET LBA
//! STATUS asks a regular file for its holes with `lseek` (`SEEK_DATA`,
//! `SEEK_HOLE`), a lookup in its extent map that io_uring has no operation
//! for.
//!
//! On a block device `fallocate` means (Linux `block/fops.c`,
//! `blkdev_fallocate`, unchanged since 4.9): `ZERO_RANGE | KEEP_SIZE` zeroes
//! without unmapping (`blkdev_issue_zeroout` with `BLKDEV_ZERO_NOUNMAP`,
//! which writes zero pages itself when the device has no Write Zeroes);
//! `PUNCH_HOLE | KEEP_SIZE` zeroes by unmapping and fails with EOPNOTSUPP
//! where the device cannot (`BLKDEV_ZERO_NOFALLBACK`); `PUNCH_HOLE |
//! KEEP_SIZE | NO_HIDE_STALE` was meant to discard but `vfs_fallocate`
//! always refused that flag (it was removed in 6.12), so a discard is the
//! block device's io_uring command `BLOCK_URING_CMD_DISCARD` (6.12). On
//! older kernels a deallocate zeroes by unmapping where the device can
//! (`PUNCH_HOLE | KEEP_SIZE`), and is otherwise skipped (it is a hint).
//!
//! The device keeps one `O_DIRECT` descriptor (when the file system or device
//! accepts it) and one buffered descriptor, shared by every reactor. An I/O
//! whose offset, length or buffer address is not aligned for `O_DIRECT` goes
//! through the buffered descriptor instead, so 512-byte blocks always work.
//! Every descriptor is a reopen of the one object the path resolved to
//! ([`crate::resolve`]), never a second lookup of the path.
//! An I/O borrows its descriptor from the backend, so the device outlives
//! it; a ring operation dropped before the kernel took it submits it
//! first ([`reactor::fs`]), so a device removed then never lets the number
//! be reused under the kernel, and no I/O counts a reference on anything
//! that other reactors share.
//!
//! A third descriptor serves flushes only. The kernel reports a writeback
//! error once per open file description (`errseq_t`), to whichever
//! `fsync`-like call comes first on it; an `RWF_DSYNC` write on the
//! buffered descriptor would be such a call. Flushing through a descriptor
//! nothing else syncs means every writeback error since the device opened
//! reaches a flush, which is what lets [`crate::Device::flush`] latch it.
//! For the same reason a FUA write carries `RWF_DSYNC` only where it goes
//! `O_DIRECT` (the error of that I/O is its own); what goes through the
//! page cache is written plainly and followed by the device's flush, since
//! of two FUA writes syncing the shared buffered descriptor at once, one
//! would be told of a writeback error that lost both.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use reactor::fs::SharedFile;

use crate::iobuf::{IoBuf, IO_BUF_ALIGN};
use crate::resolve::Resolved;
use reactor::buf::{IoBuf as _, IoBufMut as _};

/// Linux `<linux/fs.h>` block ioctls missing from `libc`, encoded for the
/// asm-generic ioctl layout (x86, arm, riscv, loongarch, s390).
#[cfg(any(
    target_arch = "x86",
    target_arch = "x86_64",
    target_arch = "arm",
    target_arch = "aarch64",
    target_arch = "riscv64",
    target_arch = "loongarch64",
    target_arch = "s390x"
))]
mod ioctl {
    /// `_IOR(0x12, 114, size_t)`: device size in bytes (`u64`).
    pub const BLKGETSIZE64: libc::Ioctl = (2 << 30) | (8 << 16) | (0x12 << 8) | 114;
    /// `_IO(0x12, 104)`: logical block size (`int`).
    pub const BLKSSZGET: libc::Ioctl = 0x1268;
}

/// Largest chunk written at a time when zeroing by writing zeros.
const ZERO_CHUNK: usize = 1 << 20;

struct Fds {
    /// Registered in each reactor's file table where the ring has one,
    /// except a block device's, which holds the device's `O_EXCL` claim.
    buffered: SharedFile,
    direct: Option<SharedFile>,
    /// Used by [`FileBackend::flush`] and nothing else (see the module
    /// documentation).
    sync: File,
}

pub(crate) struct FileBackend {
    fds: Fds,
    /// Offset and length alignment `O_DIRECT` needs (0 when not direct).
    dio_align: u64,
    /// Buffer address alignment `O_DIRECT` needs.
    dio_mem_align: usize,
    is_block: bool,
}

/// What `open` found out about a regular file or block device.
pub(crate) struct Opened {
    pub backend: FileBackend,
    pub size_bytes: u64,
    /// Logical block size of a block device (None for regular files).
    pub logical_block_size: Option<u32>,
}

fn cvt(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn is_unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::ENOTTY))
}

fn to_i64(v: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(v).map_err(|_| io::Error::other(format!("offset {v} exceeds off_t")))
}

/// `O_DIRECT` alignment of a regular file from `statx(STATX_DIOALIGN)`
/// (Linux 6.1+): (offset/length alignment, memory alignment).
fn file_dio_align(file: &File) -> Option<(u32, u32)> {
    // SAFETY: statx is plain data; all-zero bytes are a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd, NUL-terminated empty path with AT_EMPTY_PATH, and
    // `stx` is a writable statx the kernel fills.
    let rc =
        unsafe { libc::statx(file.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut stx) };
    if rc != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 || stx.stx_dio_offset_align == 0 {
        return None;
    }
    Some((stx.stx_dio_offset_align, stx.stx_dio_mem_align))
}

fn block_size_bytes(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points
    // at a live local u64.
    cvt(unsafe { libc::ioctl(file.as_raw_fd(), ioctl::BLKGETSIZE64, &mut size as *mut u64) })?;
    Ok(size)
}

fn block_logical_size(file: &File) -> io::Result<u32> {
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which points at
    // a live local c_int.
    cvt(unsafe { libc::ioctl(file.as_raw_fd(), ioctl::BLKSSZGET, &mut size as *mut libc::c_int) })?;
    u32::try_from(size).map_err(|_| io::Error::other(format!("BLKSSZGET returned {size}")))
}

/// Opens the resolved file again with `O_DIRECT`; `None` when the file
/// system refuses it (EINVAL at open, as tmpfs does, or at the first aligned
/// read).
fn open_direct(resolved: &Resolved, align: u64) -> io::Result<Option<File>> {
    let file = match resolved.reopen(libc::O_DIRECT) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
        Err(e) => return Err(e),
    };
    // Some file systems accept O_DIRECT at open and fail the I/O: probe with
    // one aligned read at offset 0 (a short read or EOF is fine).
    let probe_len = usize::try_from(align).unwrap_or(IO_BUF_ALIGN).max(IO_BUF_ALIGN);
    let mut probe = IoBuf::with_len(probe_len);
    // SAFETY: `probe` is a live, writable buffer of `probe.len()` bytes.
    let rc = unsafe { libc::pread(file.as_raw_fd(), probe.as_mut_ptr().cast(), probe.len(), 0) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINVAL) {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(Some(file))
}

impl FileBackend {
    /// The backing file's length or block device's size now.
    pub(crate) fn current_size(&self) -> io::Result<u64> {
        if self.is_block {
            block_size_bytes(self.fds.buffered.file())
        } else {
            Ok(self.fds.buffered.file().metadata()?.len())
        }
    }

    /// Extends the backing file to `len` bytes; a longer file is left as
    /// it is.
    pub(crate) fn extend_to(&self, len: u64) -> io::Result<()> {
        if self.is_block {
            return Err(io::Error::other("a block device's size is its own"));
        }
        let file = self.fds.buffered.file();
        if file.metadata()?.len() < len {
            file.set_len(len)?;
        }
        Ok(())
    }

    /// Opens a regular file (`is_block == false`) or block device, each
    /// descriptor a reopen of `resolved`. The caller has already checked
    /// the kind and created / sized a regular file.
    pub(crate) fn open(resolved: &Resolved, is_block: bool) -> io::Result<Opened> {
        // O_EXCL on a block device: refuse one that is mounted or claimed.
        let buffered = resolved.reopen(if is_block { libc::O_EXCL } else { 0 })?;
        // Not O_EXCL: the buffered descriptor holds the claim.
        let sync = resolved.reopen(0)?;
        let meta = buffered.metadata()?;
        let (size_bytes, logical, dio_align, dio_mem_align) = if is_block {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_block_device() {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a block device"));
            }
            let logical = block_logical_size(&buffered)?;
            (block_size_bytes(&buffered)?, Some(logical), logical, logical)
        } else {
            let (off, mem) = file_dio_align(&buffered).unwrap_or((4096, 4096));
            (meta.len(), None, off, mem)
        };
        let mem_ok = usize::try_from(dio_mem_align).is_ok_and(|m| m <= IO_BUF_ALIGN);
        let direct =
            if mem_ok && dio_align.is_power_of_two() { open_direct(resolved, u64::from(dio_align))? } else { None };
        let dio_align = if direct.is_some() { u64::from(dio_align) } else { 0 };
        Ok(Opened {
            backend: FileBackend {
                fds: Fds {
                    buffered: if is_block { SharedFile::by_descriptor(buffered) } else { SharedFile::new(buffered) },
                    direct: direct.map(SharedFile::new),
                    sync,
                },
                dio_align,
                dio_mem_align: usize::try_from(dio_mem_align).unwrap_or(IO_BUF_ALIGN).max(1),
                is_block,
            },
            size_bytes,
            logical_block_size: logical,
        })
    }

    /// The inode of each descriptor (buffered, flush-only, then direct).
    #[cfg(test)]
    pub(crate) fn inodes(&self) -> Vec<u64> {
        use std::os::unix::fs::MetadataExt;
        let fds =
            [Some(self.fds.buffered.file()), Some(&self.fds.sync), self.fds.direct.as_ref().map(SharedFile::file)];
        fds.into_iter().flatten().map(|f| f.metadata().expect("fstat").ino()).collect()
    }

    pub(crate) fn direct_io(&self) -> bool {
        self.fds.direct.is_some()
    }

    /// Whether an I/O of `len` bytes at `pos` from `addr` is aligned for
    /// the O_DIRECT descriptor.
    fn direct_fits(&self, pos: u64, len: usize, addr: usize) -> bool {
        self.dio_align != 0
            && pos.is_multiple_of(self.dio_align)
            && (len as u64).is_multiple_of(self.dio_align)
            && addr.is_multiple_of(self.dio_mem_align)
    }

    /// The file for an I/O of `len` bytes at `pos` from `addr`: direct
    /// when everything is aligned for it, buffered otherwise.
    fn pick(&self, pos: u64, len: usize, addr: usize) -> &SharedFile {
        match &self.fds.direct {
            Some(direct) if self.direct_fits(pos, len, addr) => direct,
            _ => &self.fds.buffered,
        }
    }

    fn buffered(&self) -> BorrowedFd<'_> {
        self.fds.buffered.as_fd()
    }

    /// Reads all of `buf` at `offset`, in as many reads as it takes (fixed
    /// reads when `buf` is registered memory of this thread).
    pub(crate) async fn read(&self, offset: u64, mut buf: IoBuf) -> (io::Result<()>, IoBuf) {
        let len = buf.len();
        let mut done = 0usize;
        while done < len {
            let Some(pos) = offset.checked_add(done as u64) else {
                return (Err(io::Error::other("read offset overflow")), buf);
            };
            let addr = (buf.as_ptr() as usize).wrapping_add(done);
            let file = self.pick(pos, len - done, addr);
            let (res, slice) = reactor::fs::read_at(file, buf.slice_mut(done..len), pos).await;
            buf = slice.into_inner();
            match res {
                Ok(0) => {
                    let msg = format!("read at byte {pos} hit end of file (was it truncated?)");
                    return (Err(io::Error::new(io::ErrorKind::UnexpectedEof, msg)), buf);
                }
                Ok(n) => done = done.saturating_add(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return (Err(e), buf),
            }
        }
        (Ok(()), buf)
    }

    /// Writes all of `buf` at `offset`. With `fua`, what goes through the
    /// `O_DIRECT` descriptor carries `RWF_DSYNC` (the kernel returns that
    /// I/O's own error); `Ok(true)` says some of it went through the page
    /// cache instead and is durable only after the device's flush. There
    /// `RWF_DSYNC` is a sync of the shared buffered descriptor, and of
    /// concurrent syncs on one descriptor the kernel reports a writeback
    /// error to the first only: another FUA write whose data was lost
    /// would succeed (see the module documentation).
    pub(crate) async fn write(&self, offset: u64, mut buf: IoBuf, fua: bool) -> (io::Result<bool>, IoBuf) {
        let len = buf.len();
        let mut done = 0usize;
        let mut needs_flush = false;
        while done < len {
            let Some(pos) = offset.checked_add(done as u64) else {
                return (Err(io::Error::other("write offset overflow")), buf);
            };
            let addr = (buf.as_ptr() as usize).wrapping_add(done);
            let file = self.pick(pos, len - done, addr);
            // `dio_align` is 0 without an O_DIRECT descriptor.
            let direct = self.direct_fits(pos, len - done, addr);
            needs_flush |= fua && !direct;
            let (res, slice) = reactor::fs::write_at(file, buf.slice(done..len), pos, fua && direct).await;
            buf = slice.into_inner();
            match res {
                Ok(0) => {
                    let msg = format!("write at byte {pos} wrote nothing");
                    return (Err(io::Error::new(io::ErrorKind::WriteZero, msg)), buf);
                }
                Ok(n) => done = done.saturating_add(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return (Err(e), buf),
            }
        }
        (Ok(needs_flush), buf)
    }

    /// fdatasync through the flush-only descriptor. On a block device it
    /// also flushes the device's volatile write cache.
    /// `keep` comes back with the result; if this future is dropped first,
    /// `on_lost` gets it and the result when the sync ends
    /// ([`reactor::fs::sync_keeping`]).
    pub(crate) async fn flush<T: 'static>(&self, keep: T, on_lost: fn(&T, i32)) -> (io::Result<()>, T) {
        reactor::fs::sync_keeping(self.fds.sync.as_fd(), true, keep, on_lost).await
    }

    /// fallocate on the ring: the kernel runs it off this thread.
    async fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        to_i64(offset)?;
        to_i64(len)?;
        loop {
            match reactor::fs::fallocate(self.buffered(), mode, offset, len).await {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }

    /// Zeroes `[offset, offset + len)` by writing zero buffers.
    async fn write_zero_buffers(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut done = 0u64;
        while done < len {
            let chunk = usize::try_from(len - done).map_or(ZERO_CHUNK, |r| r.min(ZERO_CHUNK));
            let pos = offset.checked_add(done).ok_or_else(|| io::Error::other("zero offset overflow"))?;
            let (res, _buf) = self.write(pos, IoBuf::zeroed(chunk), false).await;
            res?;
            done = done.saturating_add(chunk as u64);
        }
        Ok(())
    }

    /// Makes `[offset, offset + len)` read as zeros; with `deallocate` the
    /// backing storage may be released.
    pub(crate) async fn write_zeroes(&self, offset: u64, len: u64, deallocate: bool) -> io::Result<()> {
        const KEEP: libc::c_int = libc::FALLOC_FL_KEEP_SIZE;
        if len == 0 {
            return Ok(());
        }
        // Unmapping first where allowed (a hole in a file; on a block device
        // zeroes by unmap, refused unless the device guarantees them), then
        // zeroing in place (ZERO_RANGE; on a block device the kernel falls
        // back to writing zero pages itself), then zero buffers through the
        // ring where neither exists (old kernels, file systems without
        // ZERO_RANGE).
        let unmap = [libc::FALLOC_FL_PUNCH_HOLE | KEEP, libc::FALLOC_FL_ZERO_RANGE | KEEP];
        let attempts = if deallocate { &unmap[..] } else { &unmap[1..] };
        for &mode in attempts {
            match self.fallocate(mode, offset, len).await {
                Ok(()) => return Ok(()),
                Err(e) if is_unsupported(&e) => continue,
                Err(e) => return Err(e),
            }
        }
        self.write_zero_buffers(offset, len).await
    }

    /// The provisioning state at `offset` (a multiple of `block_size`, `len`
    /// non-zero): `(deallocated, bytes)` of the run from `offset`, within
    /// `len`, of whole `block_size` blocks that the file's holes cover
    /// (deallocated) or that hold data; `None` for a block device, whose
    /// allocation is not known. A block with data in any part of it is
    /// mapped.
    pub(crate) fn extent(&self, offset: u64, len: u64, block_size: u64) -> io::Result<Option<(bool, u64)>> {
        if self.is_block {
            return Ok(None);
        }
        let end = offset.saturating_add(len);
        let fd = self.buffered().as_raw_fd();
        let seek = |from: u64, whence: libc::c_int| -> io::Result<u64> {
            // SAFETY: lseek on a descriptor the backend keeps open; it
            // moves only the buffered descriptor's file position, which no
            // I/O uses (every read and write gives its own offset).
            let at = unsafe { libc::lseek(fd, to_i64(from)?, whence) };
            if let Ok(at) = u64::try_from(at) {
                return Ok(at.min(end));
            }
            let e = io::Error::last_os_error();
            // ENXIO: past the last data (or the end of the file), a hole to the end.
            if e.raw_os_error() == Some(libc::ENXIO) {
                Ok(end)
            } else {
                Err(e)
            }
        };
        let data = seek(offset, libc::SEEK_DATA)?;
        if data.saturating_sub(offset) >= block_size {
            let whole = data.saturating_sub(offset) / block_size * block_size;
            return Ok(Some((true, whole)));
        }
        // Data in the first block: mapped up to the block the next hole
        // starts in, that block included when the hole starts inside it.
        let hole = seek(data, libc::SEEK_HOLE)?;
        let mapped = hole.saturating_sub(offset).div_ceil(block_size).saturating_mul(block_size);
        Ok(Some((false, mapped.min(len))))
    }

    /// Releases `[offset, offset + len)`. Regular files read zeros afterwards
    /// (hole punch, else zeroing); block devices get a discard, a hint that
    /// is skipped when the kernel or the device cannot discard (a block
    /// device never claims that deallocated blocks read zeros).
    pub(crate) async fn deallocate(&self, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        if self.is_block {
            to_i64(offset)?;
            to_i64(len)?;
            // The discard command first (6.12); then zeroing by unmap,
            // which releases the blocks on devices that can.
            let err = match reactor::fs::discard(self.buffered(), offset, len).await {
                Err(e) if is_unsupported(&e) => e,
                other => return other,
            };
            return match self.fallocate(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset, len).await {
                Err(e) if is_unsupported(&e) => {
                    log::debug!("discard unsupported ({err}), nor zeroing by unmap ({e}): deallocate ignored");
                    Ok(())
                }
                other => other,
            };
        }
        self.write_zeroes(offset, len, true).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::Symlinks;

    fn run<F: std::future::Future>(fut: F) -> F::Output {
        reactor::Runtime::new(reactor::Config::default()).expect("io_uring runtime").block_on(fut)
    }

    /// A sized temp file, removed on drop (also when a test panics).
    struct TempFile(std::path::PathBuf);

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn temp_file(tag: &str, len: u64) -> TempFile {
        let path = std::env::temp_dir().join(format!("blockdev-unit-{}-{tag}.img", std::process::id()));
        let f = File::create(&path).expect("create");
        f.set_len(len).expect("set_len");
        TempFile(path)
    }

    #[test]
    fn unaligned_io_uses_buffered_fd_when_direct_needs_4096() {
        let tmp = temp_file("unaligned", 1 << 20);
        let mut opened =
            FileBackend::open(&Resolved::existing(&tmp.0, Symlinks::Follow).expect("resolve"), false).expect("open");
        if !opened.backend.direct_io() {
            eprintln!("skipping: no O_DIRECT on {}", tmp.0.display());
            return;
        }
        // Pretend the file system needs 4096-byte alignment.
        opened.backend.dio_align = 4096;
        opened.backend.dio_mem_align = 4096;
        let backend = opened.backend;
        run(async {
            let direct = backend.fds.direct.as_ref().expect("direct fd").file().as_raw_fd();
            assert_eq!(backend.pick(8192, 4096, 4096).file().as_raw_fd(), direct);
            assert_ne!(backend.pick(512, 4096, 4096).file().as_raw_fd(), direct);
            assert_ne!(backend.pick(4096, 512, 4096).file().as_raw_fd(), direct);
            assert_ne!(backend.pick(4096, 4096, 4096 + 512).file().as_raw_fd(), direct);

            let (res, _) = backend.write(512, IoBuf::from_slice(&[0x3c; 1536]), false).await;
            res.expect("unaligned write");
            let (res, _) = backend.write(8192, IoBuf::from_slice(&[0x7e; 4096]), false).await;
            res.expect("aligned write");
            let (res, buf) = backend.read(0, IoBuf::with_len(12288)).await;
            res.expect("aligned read");
            assert!(buf[..512].iter().all(|&b| b == 0));
            assert!(buf[512..2048].iter().all(|&b| b == 0x3c));
            assert!(buf[2048..8192].iter().all(|&b| b == 0));
            assert!(buf[8192..].iter().all(|&b| b == 0x7e));
            let (res, buf) = backend.read(1024, IoBuf::with_len(512)).await;
            res.expect("unaligned read");
            assert!(buf.iter().all(|&b| b == 0x3c));
        });
    }

    #[test]
    fn zero_buffer_fallback_zeroes_exactly_the_range() {
        let tmp = temp_file("zerofill", 4 << 20);
        let backend = FileBackend::open(&Resolved::existing(&tmp.0, Symlinks::Follow).expect("resolve"), false)
            .expect("open")
            .backend;
        run(async {
            let (res, _) = backend.write(0, IoBuf::from_slice(&vec![0xa1; 4 << 20]), false).await;
            res.expect("fill");
            // 1.5 MiB + 512 bytes: more than one chunk, unaligned tail.
            let len = (3 << 19) + 512;
            backend.write_zero_buffers(512, len).await.expect("zero fill");
            let (res, buf) = backend.read(0, IoBuf::with_len(4 << 20)).await;
            res.expect("read");
            let end = 512 + len as usize;
            assert!(buf[..512].iter().all(|&b| b == 0xa1));
            assert!(buf[512..end].iter().all(|&b| b == 0));
            assert!(buf[end..].iter().all(|&b| b == 0xa1));
        });
    }

    #[test]
    fn read_past_truncated_end_is_an_error_not_a_hang() {
        let tmp = temp_file("truncated", 8192);
        let backend = FileBackend::open(&Resolved::existing(&tmp.0, Symlinks::Follow).expect("resolve"), false)
            .expect("open")
            .backend;
        std::fs::OpenOptions::new().write(true).open(&tmp.0).and_then(|f| f.set_len(4096)).expect("truncate");
        run(async {
            let (res, _) = backend.read(0, IoBuf::with_len(8192)).await;
            let err = res.expect_err("short file");
            assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        });
    }

    /// A loop device over a sparse file on a tmpfs of `tmpfs_bytes`: its
    /// writeback fails (EIO) once the tmpfs is full. Detached and
    /// unmounted on drop; `None` (with a message) without root.
    struct FullDisk {
        dir: std::path::PathBuf,
        image: std::path::PathBuf,
        dev: String,
    }

    impl FullDisk {
        fn new(tag: &str, tmpfs_bytes: u64, disk_bytes: u64) -> Option<FullDisk> {
            let sh = |cmd: &str, args: &[&str]| {
                let out = std::process::Command::new(cmd).args(args).output().ok()?;
                out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
            };
            let dir = std::env::temp_dir().join(format!("blockdev-unit-{}-{tag}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("dir");
            let d = dir.to_str().expect("path");
            if sh("mount", &["-t", "tmpfs", "-o", &format!("size={tmpfs_bytes}"), "tmpfs", d]).is_none() {
                eprintln!("skipping: cannot mount a tmpfs (not root?)");
                let _ = std::fs::remove_dir(&dir);
                return None;
            }
            let image = dir.join("backing.img");
            File::create(&image).and_then(|f| f.set_len(disk_bytes)).expect("backing file");
            let mut disk = FullDisk { dir, image, dev: String::new() };
            match sh("losetup", &["-f", "--show", disk.image.to_str().expect("path")]) {
                Some(dev) => disk.dev = dev,
                None => eprintln!("skipping: cannot attach a loop device"),
            }
            (!disk.dev.is_empty()).then_some(disk)
        }
    }

    impl Drop for FullDisk {
        fn drop(&mut self) {
            if !self.dev.is_empty() {
                let _ = std::process::Command::new("losetup").args(["-d", &self.dev]).status();
            }
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.dir).status();
            let _ = std::fs::remove_dir(&self.dir);
        }
    }

    /// A flush whose future is dropped before its sync ends (its command
    /// aborted, its connection closed) on a disk whose writeback fails:
    /// the kernel tells the error to that sync alone, so unless it is
    /// latched anyway, the next flush succeeds although acknowledged
    /// writes were lost.
    #[test]
    fn a_dropped_flush_still_latches_the_writeback_error_it_was_told() {
        let Some(disk) = FullDisk::new("lostflush", 1 << 20, 64 << 20) else { return };
        let mut dev = crate::Device::block("b", std::path::Path::new(&disk.dev), None).expect("block device");
        let crate::Backend::File(backend) = &mut dev.backend else { panic!("not a file backend") };
        backend.dio_align = 0;
        run(async {
            // 4 MiB into the page cache of a disk whose backing holds 1 MiB.
            for k in 0..16u64 {
                let (res, _) = dev.write(k * 512, IoBuf::from_slice(&[k as u8 | 1; 256 << 10]), false).await;
                res.expect("a buffered write lands in the page cache");
            }
            // Its sync submitted and given time to run (one cancelled
            // before it starts sees nothing), then the flush dropped
            // before the reactor took its result.
            use std::future::Future;
            let mut flush = Box::pin(dev.flush());
            std::future::poll_fn(|cx| {
                assert!(flush.as_mut().poll(cx).is_pending(), "the sync cannot end before the ring is entered");
                std::task::Poll::Ready(())
            })
            .await;
            reactor::sleep(std::time::Duration::from_millis(1)).await;
            std::thread::sleep(std::time::Duration::from_millis(300));
            drop(flush);
            for _ in 0..500 {
                if dev.flush_failed.get().is_some() {
                    break;
                }
                reactor::sleep(std::time::Duration::from_millis(10)).await;
            }
            let e = dev.flush().await.expect_err("the writeback error the dropped flush was told");
            assert!(matches!(e, crate::Error::EarlierFlushFailed(_)), "{e}");
        });
    }

    /// FUA writes that go through the page cache, several at once on a
    /// disk whose writeback fails: the kernel reports the error to one
    /// sync of the shared descriptor, so an `RWF_DSYNC` write could be
    /// acknowledged while its data never reached the disk. Every write
    /// acknowledged here must be in the disk's backing file.
    #[test]
    fn concurrent_fua_writes_through_the_page_cache_are_acknowledged_only_when_on_the_disk() {
        const LEN: usize = 64 << 10;
        let Some(disk) = FullDisk::new("fua", 1 << 20, 64 << 20) else { return };
        let mut dev = crate::Device::block("b", std::path::Path::new(&disk.dev), None).expect("block device");
        // Every I/O through the buffered descriptor, as an unaligned one
        // (or any on a file system without O_DIRECT) goes.
        let crate::Backend::File(backend) = &mut dev.backend else { panic!("not a file backend") };
        backend.dio_align = 0;
        let dev = std::rc::Rc::new(dev);
        let mut acknowledged = Vec::new();
        run(async {
            // Four rounds fit in the tmpfs, the rest do not.
            for round in 0..24u64 {
                let writes: Vec<_> = (0..4u64)
                    .map(|k| {
                        let (dev, offset) = (dev.clone(), (round * 4 + k) * (256 << 10));
                        let seed = (round * 4 + k) as u8 | 1;
                        reactor::spawn(async move {
                            let (res, _) = dev.write(offset / 512, IoBuf::from_slice(&[seed; LEN]), true).await;
                            (offset, seed, res.is_ok())
                        })
                    })
                    .collect();
                for w in writes {
                    let (offset, seed, ok) = w.await;
                    if ok {
                        acknowledged.push((offset, seed));
                    }
                }
            }
        });
        assert!(!acknowledged.is_empty(), "the writes that fit must succeed");
        let image = File::open(&disk.image).expect("backing file");
        for (offset, seed) in acknowledged {
            let mut on_disk = vec![0u8; LEN];
            std::os::unix::fs::FileExt::read_exact_at(&image, &mut on_disk, offset).expect("read backing");
            assert!(on_disk.iter().all(|&b| b == seed), "FUA write at byte {offset} acknowledged but not on the disk");
        }
    }
}
