//! The block-device contract, as the protocol cores see it.
//!
//! `nvmf` and `scsi` decide what a command means and hand storage work back
//! to the daemon as requests; they never do I/O. What they need from a
//! device is here: its [`Geometry`], the one range check every operation
//! goes through ([`Geometry::check_range`]), the few properties hosts are
//! told about ([`BlockDevice`]), and the one [`Error`] type that each
//! protocol maps once (to NVMe status, to SCSI sense). The backends that do
//! the I/O (`blockdev`: null, ram, file, block) implement [`BlockDevice`];
//! the cores are generic over it, so they depend on no runtime and no
//! backend.
//!
//! [`DataBuffer`] is the buffer type a transport receives host data into,
//! so that the daemon can hand it a buffer its backend writes from.
//! [`take_transmit`] and [`take_transmit_parts`] hand over what a
//! transport queued to send, with the zeros of a read of a device that
//! holds nothing left out of its buffer.
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

use std::io;
use std::path::PathBuf;

/// Smallest accepted block size in bytes.
pub const MIN_BLOCK_SIZE: u32 = 512;
/// Largest accepted block size in bytes.
pub const MAX_BLOCK_SIZE: u32 = 65536;

/// Size and shape of a device as the protocols advertise it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Logical block size in bytes (a power of two, 512..=65536).
    pub block_size: u32,
    /// Capacity in blocks.
    pub blocks: u64,
}

impl Geometry {
    /// Capacity in bytes (saturating; a device's geometry is checked when it
    /// opens).
    pub fn size_bytes(&self) -> u64 {
        self.blocks.saturating_mul(u64::from(self.block_size))
    }

    /// The one range check: `blocks` blocks starting at `lba` must lie within
    /// the device (`lba + blocks <= capacity`, computed without overflow).
    pub fn check_range(&self, lba: u64, blocks: u64) -> Result<(), Error> {
        match lba.checked_add(blocks) {
            Some(end) if end <= self.blocks => Ok(()),
            _ => Err(Error::OutOfRange { lba, blocks, capacity: self.blocks }),
        }
    }
}

/// A run of blocks in one provisioning state (SBC-3 4.7.1), as a backend
/// reports it for SCSI GET LBA STATUS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Blocks in the run (at least one).
    pub blocks: u64,
    /// The run holds no storage (a hole of a regular file): deallocated,
    /// reading as [`BlockDevice::deallocate_reads_zeroes`] says. `false`
    /// is mapped, or not known.
    pub deallocated: bool,
}

/// Everything a device operation or constructor can fail with.
#[derive(thiserror::Error, Debug)]
pub enum Error {
    /// The request reaches past the last block (or `lba + blocks` overflows).
    #[error("lba {lba} + {blocks} blocks is out of range (capacity {capacity} blocks)")]
    OutOfRange { lba: u64, blocks: u64, capacity: u64 },
    /// A buffer length that is not a whole number of blocks.
    #[error("buffer length {len} is not a multiple of block size {block_size}")]
    Misaligned { len: usize, block_size: u32 },
    /// The backend cannot do this operation.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    /// A block size outside 512..=65536 or not a power of two.
    #[error("block size {0} unsupported (expected a power of two in 512..=65536)")]
    InvalidBlockSize(u32),
    /// A device size of zero or not a whole number of blocks.
    #[error("device size {size_bytes} bytes is not a non-zero multiple of block size {block_size}")]
    InvalidSize { size_bytes: u64, block_size: u32 },
    /// A block size below the block device's logical block size.
    #[error("block size {requested} is smaller than the device's logical block size {logical}")]
    BlockSizeBelowLogical { requested: u32, logical: u32 },
    /// A block device was asked for and this is something else.
    #[error("{0} is not a block device (use a file device for regular files)")]
    NotBlockDevice(PathBuf),
    /// A regular file was asked for and this is something else.
    #[error("{0} is not a regular file (use a block device for block devices)")]
    NotRegularFile(PathBuf),
    /// Opening or sizing the backing file or device failed. The OS error is
    /// part of the message and deliberately not a `source()`, so that a
    /// printed error chain names it once.
    #[error("cannot open {path}: {reason}")]
    Open { path: PathBuf, reason: io::Error },
    /// An I/O error from the backing file or device (in the message, not a
    /// `source()`, as for `Open`).
    #[error("I/O error: {0}")]
    Io(io::Error),
    /// An earlier flush of this device failed: writes acknowledged before
    /// it may not be on stable storage, and the kernel reports such an
    /// error only once (fsyncgate), so every later flush fails too until
    /// the device is reopened.
    #[error("an earlier flush failed ({0}); writes acknowledged before it may be lost until the device is reopened")]
    EarlierFlushFailed(String),
}

impl Error {
    /// The backing is out of space, or over a quota (ENOSPC, EDQUOT: a
    /// file system's quota, or a Ceph pool's): a write the protocols
    /// answer as out of space, not as a medium error.
    pub fn out_of_space(&self) -> bool {
        matches!(self, Error::Io(e) if matches!(e.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded))
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        Error::Io(e)
    }
}

/// What the protocol cores know of a device. Every method is a cheap,
/// non-blocking read of state fixed when the device opened.
pub trait BlockDevice: Send + Sync + std::fmt::Debug + 'static {
    /// The name the device was configured with (log lines, identifiers
    /// derived from it).
    fn name(&self) -> &str;

    /// The backend's name as hosts may see it in product strings: `null`,
    /// `ram`, `file`, `block`.
    fn backend(&self) -> &'static str;

    /// Block size and capacity.
    fn geometry(&self) -> Geometry;

    /// Whether completed writes may sit in a volatile cache until a flush
    /// (NVMe VWC, SCSI WCE).
    fn volatile_write_cache(&self) -> bool;

    /// Whether deallocated blocks are guaranteed to read back as zeros
    /// (NVMe DLFEAT, SCSI LBPRZ).
    fn deallocate_reads_zeroes(&self) -> bool;

    /// A name for the storage behind this device that is the same in
    /// every process that opens it, on any machine (rbd:
    /// `ceph:<fsid>:<image id>`). Several gateways exporting one image
    /// derive the identifiers hosts group paths by from it. `None` for
    /// storage only this process reaches.
    fn shared_identity(&self) -> Option<&str> {
        None
    }

    /// Whether the device never reads the data written to it (null): a
    /// transport may receive a write's payload without placing it in a
    /// buffer (it still checks it: lengths, digests).
    fn discards_writes(&self) -> bool {
        false
    }

    /// Whether the device is exported read-only: the cores refuse every
    /// command that would write it (NVMe Namespace Is Write Protected,
    /// SCSI DATA PROTECT / WRITE PROTECTED) and tell hosts so (NVMe
    /// NSATTR, SCSI MODE SENSE WP).
    fn read_only(&self) -> bool {
        false
    }

    /// [`Geometry::check_range`] on this device.
    fn check_range(&self, lba: u64, blocks: u64) -> Result<(), Error> {
        self.geometry().check_range(lba, blocks)
    }
}

/// A device known only by its description, with no backend behind it:
/// what the cores' own tests run against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Described {
    /// [`BlockDevice::name`].
    pub name: String,
    /// [`BlockDevice::backend`].
    pub backend: &'static str,
    /// [`BlockDevice::geometry`].
    pub geometry: Geometry,
    /// [`BlockDevice::volatile_write_cache`].
    pub volatile_write_cache: bool,
    /// [`BlockDevice::deallocate_reads_zeroes`].
    pub deallocate_reads_zeroes: bool,
    /// [`BlockDevice::shared_identity`].
    pub shared_identity: Option<String>,
    /// [`BlockDevice::read_only`].
    pub read_only: bool,
}

impl Described {
    /// A memory-like device: no volatile cache, deallocated blocks read
    /// zeros.
    pub fn new(name: &str, block_size: u32, blocks: u64) -> Self {
        Described {
            name: name.to_owned(),
            backend: "ram",
            geometry: Geometry { block_size, blocks },
            volatile_write_cache: false,
            deallocate_reads_zeroes: true,
            shared_identity: None,
            read_only: false,
        }
    }
}

impl BlockDevice for Described {
    fn name(&self) -> &str {
        &self.name
    }

    fn backend(&self) -> &'static str {
        self.backend
    }

    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn volatile_write_cache(&self) -> bool {
        self.volatile_write_cache
    }

    fn deallocate_reads_zeroes(&self) -> bool {
        self.deallocate_reads_zeroes
    }

    fn shared_identity(&self) -> Option<&str> {
        self.shared_identity.as_deref()
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    /// A described `null` device discards writes, as the real one does.
    fn discards_writes(&self) -> bool {
        self.backend == "null"
    }
}

/// An owned byte buffer of a fixed length that a transport receives host
/// data into. The daemon's buffers are aligned and pooled so the backend
/// writes from them directly; tests use `Vec<u8>`.
pub trait DataBuffer: AsRef<[u8]> + AsMut<[u8]> {
    /// A buffer of `len` initialized bytes.
    fn alloc(len: usize) -> Self;
}

impl DataBuffer for Vec<u8> {
    fn alloc(len: usize) -> Self {
        vec![0; len]
    }
}

/// Moves the bytes a connection queued, `tx`, to the end of `out`, with
/// the runs of zeros it left out of them written in: `zeros` holds each
/// run's position in `tx` (the run goes before that byte) and length, in
/// order. Both are emptied. The zeros of a read of a device that holds
/// nothing are queued this way, so that a sender that can splice them in
/// from a shared page ([`take_transmit_parts`]) never writes them.
pub fn take_transmit(tx: &mut Vec<u8>, zeros: &mut Vec<(usize, usize)>, out: &mut Vec<u8>) {
    if !zeros.is_empty() {
        let mut from = 0;
        for (at, len) in zeros.drain(..) {
            out.extend_from_slice(tx.get(from..at).unwrap_or_default());
            out.resize(out.len().saturating_add(len), 0);
            from = at;
        }
        out.extend_from_slice(tx.get(from..).unwrap_or_default());
        tx.clear();
    } else if out.is_empty() {
        std::mem::swap(out, tx);
    } else {
        out.append(tx);
    }
}

/// Whether a transfer of `len` bytes may take buffers now, with `held`
/// bytes of a `budget` already taken: while it fits, and always when
/// nothing is held (a transfer larger than the budget still proceeds
/// alone). NVMe/TCP's R2Ts and NVMe/RDMA's RDMA Reads follow it.
pub fn fits_budget(held: u64, len: u32, budget: u32) -> bool {
    held == 0 || held.saturating_add(u64::from(len)) <= u64::from(budget)
}

/// Bytes queued to send: `tx` and the runs of zeros left out of it.
pub fn transmit_len(tx: &[u8], zeros: &[(usize, usize)]) -> usize {
    zeros.iter().fold(tx.len(), |n, &(_, len)| n.saturating_add(len))
}

/// As [`take_transmit`], except that the zeros are not written:
/// `run(at, len)` says that `len` zero bytes go before byte `at` of `out`.
pub fn take_transmit_parts(
    tx: &mut Vec<u8>,
    zeros: &mut Vec<(usize, usize)>,
    out: &mut Vec<u8>,
    mut run: impl FnMut(usize, usize),
) {
    let base = out.len();
    for (at, len) in zeros.drain(..) {
        run(base.saturating_add(at), len);
    }
    if out.is_empty() {
        std::mem::swap(out, tx);
    } else {
        out.append(tx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_range_accepts_last_block_and_rejects_overflow() {
        let geo = Geometry { block_size: 4096, blocks: 256 };
        assert!(geo.check_range(255, 1).is_ok());
        assert!(geo.check_range(0, 256).is_ok());
        assert!(geo.check_range(256, 0).is_ok(), "an empty range at the end is in range");
        assert!(matches!(geo.check_range(256, 1), Err(Error::OutOfRange { .. })));
        assert!(matches!(geo.check_range(1, u64::MAX), Err(Error::OutOfRange { .. })));
        assert!(matches!(geo.check_range(u64::MAX, 2), Err(Error::OutOfRange { .. })));
    }

    #[test]
    fn out_of_range_message_names_request_and_capacity() {
        let geo = Geometry { block_size: 512, blocks: 2048 };
        let err = geo.check_range(2040, 16).expect_err("past the end");
        assert_eq!(err.to_string(), "lba 2040 + 16 blocks is out of range (capacity 2048 blocks)");
    }

    #[test]
    fn size_bytes_saturates() {
        assert_eq!(Geometry { block_size: 512, blocks: 8 }.size_bytes(), 4096);
        assert_eq!(Geometry { block_size: 4096, blocks: u64::MAX }.size_bytes(), u64::MAX);
    }
}
