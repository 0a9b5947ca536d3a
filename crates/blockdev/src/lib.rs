//! The block-device backends: null, ram, file, raw block device and Ceph
//! RBD image (through the `rbd` binding), all
//! behind [`Device`], which implements the contract the protocol cores see
//! ([`BlockDevice`], from the runtime-free `block` crate: geometry, the one
//! range check, the one [`Error`] type).
//!
//! This crate does the I/O and owns the aligned [`IoBuf`] pool. It must never panic on any LBA or length a peer sends, never form a Rust
//! reference to memory other threads write (the ram region), and never block
//! a reactor on data I/O: reads, writes and flushes go through the calling
//! thread's io_uring (or, for rbd, librbd's asynchronous calls completed on
//! the calling reactor), and so do write zeroes and deallocate (ring
//! `FALLOCATE`, run by the kernel off the reactor thread). Opening an rbd
//! device blocks up to its connect timeout and is done off the reactors.
//!
//! A [`Device`] is `Send + Sync` and shared as `Arc<Device>` by all reactor
//! threads; each thread lazily opens its own io_uring view of file and block
//! devices.

mod file;
mod fixed;
mod iobuf;
mod ram;
mod range_lock;
mod resolve;

use checksum::Appender;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

pub use block::{BlockDevice, Error, Extent, Geometry, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE};
pub use fixed::{arena_usage, register_buffers, MAX_REGISTERED_BYTES};
pub use iobuf::{IoBuf, IO_BUF_ALIGN};
pub use range_lock::RangeLock;
pub use rbd::Options as RbdOptions;
pub use resolve::Symlinks;

use file::FileBackend;
use ram::RamRegion;
use range_lock::{Range, WriteGate};
use resolve::Resolved;

/// Which backend a device uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Reads zeros, discards writes (like Linux `null_blk`).
    Null,
    /// Anonymous memory, lost when the device is dropped.
    Ram,
    /// A regular file.
    File,
    /// A raw block device.
    Block,
    /// A Ceph RBD image.
    Rbd,
}

impl Kind {
    /// The backend's name, as configured and as hosts see it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Null => "null",
            Kind::Ram => "ram",
            Kind::File => "file",
            Kind::Block => "block",
            Kind::Rbd => "rbd",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl BlockDevice for Device {
    fn name(&self) -> &str {
        &self.name
    }

    fn backend(&self) -> &'static str {
        self.kind.name()
    }

    fn geometry(&self) -> Geometry {
        Geometry { block_size: self.geometry.block_size, blocks: self.blocks.load(Ordering::Acquire) }
    }

    /// True for file and block devices (page cache, disk cache): completed
    /// writes are durable after [`Device::flush`]. False for rbd: librbd's
    /// client cache is off, so a write completes when the OSDs have it and
    /// every gateway of the image reads it.
    fn volatile_write_cache(&self) -> bool {
        matches!(self.kind, Kind::File | Kind::Block)
    }

    /// False for block devices, whose discard behaviour this crate does not
    /// know, and for rbd, where librbd leaves parts of a discard smaller
    /// than its discard granularity unchanged.
    fn deallocate_reads_zeroes(&self) -> bool {
        !matches!(self.kind, Kind::Block | Kind::Rbd)
    }

    fn shared_identity(&self) -> Option<&str> {
        self.shared.as_deref()
    }

    fn discards_writes(&self) -> bool {
        matches!(self.backend, Backend::Null)
    }

    fn read_only(&self) -> bool {
        self.read_only
    }
}

enum Backend {
    Null,
    Ram(RamRegion),
    File(FileBackend),
    Rbd(rbd::Image),
}

/// A block device shared by every reactor thread.
pub struct Device {
    name: String,
    kind: Kind,
    /// The block size; `blocks` here is the size at open.
    geometry: Geometry,
    /// The capacity in blocks now: an rbd image, a block device or a file
    /// whose length is the device's size may be resized while it is
    /// exported ([`Device::refresh_size`]), and a null device or a file
    /// device with a configured size may be grown ([`Device::grow`]).
    blocks: AtomicU64,
    /// The size is the backing's, re-read by [`Device::refresh_size`]: a
    /// block device, or a file device configured without `size`.
    follows_backing: bool,
    path: Option<PathBuf>,
    backend: Backend,
    latency: Latency,
    /// The first failed flush of a file or block device, latched: the
    /// kernel reports a writeback error once, so a later fdatasync may
    /// succeed although the writes it lost were acknowledged (fsyncgate).
    /// Every flush fails from then on, until the device is reopened.
    /// Shared with the syncs of flushes whose futures were dropped
    /// ([`LostFlush`]).
    flush_failed: Arc<OnceLock<String>>,
    /// The flushes in flight, so that a successful one is reported only
    /// once those started before it ended are over ([`Flushes`]).
    flushes: Arc<Flushes>,
    /// [`BlockDevice::shared_identity`]: rbd images only.
    shared: Option<String>,
    /// The LBA range lock every write passes (docs/architecture.md).
    gate: WriteGate,
    /// [`BlockDevice::read_only`]: the protocols refuse writes; a file or
    /// block device's descriptors are opened read-only.
    read_only: bool,
}

/// How often a successful flush looks again whether the flushes started
/// before it ended are over (only while flushes overlap).
const FLUSH_OVERLAP_POLL: Duration = Duration::from_millis(1);

/// A device's flushes in flight, by ticket. Every reactor flushes through
/// the one flush descriptor, and the kernel reports a writeback error to
/// one `fsync` on it: of two flushes that overlap, one may succeed while
/// the other learns of lost writes both covered. A failed flush latches
/// the error before it ends; a successful one waits for every flush that
/// started before it ended, then checks the latch. Flushes are rare: a
/// mutex here costs no I/O anything.
#[derive(Default)]
struct Flushes {
    next: AtomicU64,
    running: Mutex<Vec<u64>>,
}

/// One flush's place among [`Flushes`]; ends when dropped.
struct FlushTicket {
    flushes: Arc<Flushes>,
    id: u64,
}

impl Flushes {
    fn start(self: &Arc<Self>) -> FlushTicket {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        running.push(id);
        FlushTicket { flushes: self.clone(), id }
    }

    /// Whether a flush with a ticket below `horizon` is still running.
    fn any_before(&self, horizon: u64) -> bool {
        self.running.lock().unwrap_or_else(PoisonError::into_inner).iter().any(|&t| t < horizon)
    }
}

impl FlushTicket {
    /// Ends this flush: the tickets of the flushes started so far end below
    /// the returned horizon.
    fn end(self) -> u64 {
        let mut running = self.flushes.running.lock().unwrap_or_else(PoisonError::into_inner);
        running.retain(|&t| t != self.id);
        let horizon = self.flushes.next.load(Ordering::Relaxed);
        drop(running);
        horizon
    }
}

impl Drop for FlushTicket {
    fn drop(&mut self) {
        self.flushes.running.lock().unwrap_or_else(PoisonError::into_inner).retain(|&t| t != self.id);
    }
}

/// What a file device's sync keeps until it ends even when the flush
/// that started it was dropped (its command aborted, its connection
/// gone): the kernel tells a writeback error to that sync alone, so its
/// error must still latch, and its ticket must hold the successful
/// flushes that overlap it until it has.
struct LostFlush {
    latch: Arc<OnceLock<String>>,
    ticket: FlushTicket,
    device: String,
}

impl LostFlush {
    /// The sync of a dropped flush ended with `res`.
    fn ended(&self, res: i32) {
        // Cancelled before it ran: it saw no error.
        if res >= 0 || res == -libc::ECANCELED {
            return;
        }
        let e = io::Error::from_raw_os_error(-res);
        if self.latch.set(e.to_string()).is_ok() {
            log::error!(
                "device {}: a flush whose command went away failed: {e}; writes acknowledged before it may be \
                 lost, and every later flush of this device fails until it is reopened",
                self.device
            );
        }
    }
}

/// Latency added to every read and every write, for tests of what happens
/// while I/O is in flight (aborts, resets, slow backends); the idea of
/// SPDK's delay bdev. Zero (the default) adds nothing and costs nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Latency {
    /// Added before each read completes.
    pub read: Duration,
    /// Added before each write reaches the backend.
    pub write: Duration,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("geometry", &self.geometry())
            .field("path", &self.path)
            .field("direct_io", &self.direct_io())
            .field("latency", &self.latency)
            .finish()
    }
}

fn check_block_size(block_size: u32) -> Result<(), Error> {
    if block_size.is_power_of_two() && (MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size) {
        Ok(())
    } else {
        Err(Error::InvalidBlockSize(block_size))
    }
}

/// Geometry for an exact byte size, which must be a non-zero whole number of
/// blocks.
fn exact_geometry(size_bytes: u64, block_size: u32) -> Result<Geometry, Error> {
    check_block_size(block_size)?;
    let bs = u64::from(block_size);
    if size_bytes == 0 || !size_bytes.is_multiple_of(bs) {
        return Err(Error::InvalidSize { size_bytes, block_size });
    }
    Ok(Geometry { block_size, blocks: size_bytes / bs })
}

fn open_err(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |reason| Error::Open { path: path.to_path_buf(), reason }
}

/// A device growth checked and with its file extended, not yet adopted
/// ([`Device::prepare_grow`]).
#[must_use = "the device keeps its size until the growth is committed"]
pub struct Growth<'a> {
    device: &'a Device,
    blocks: u64,
}

impl Growth<'_> {
    /// Adopts the new capacity: `true` when it changed, so hosts must be
    /// told.
    #[must_use = "hosts must be told when the capacity changed"]
    pub fn commit(self) -> bool {
        self.device.blocks.swap(self.blocks, Ordering::AcqRel) != self.blocks
    }
}

impl Device {
    /// A device that reads zeros and discards writes, like `null_blk`.
    pub fn null(name: &str, size_bytes: u64, block_size: u32) -> Result<Device, Error> {
        let geometry = exact_geometry(size_bytes, block_size)?;
        Ok(Device {
            name: name.to_owned(),
            kind: Kind::Null,
            geometry,
            blocks: AtomicU64::new(geometry.blocks),
            follows_backing: false,
            path: None,
            backend: Backend::Null,
            latency: Latency::default(),
            flush_failed: Arc::default(),
            flushes: Arc::default(),
            shared: None,
            gate: WriteGate::new(),
            read_only: false,
        })
    }

    /// A device in anonymous memory, committed lazily as it is written, in
    /// transparent huge pages where the kernel grants them.
    pub fn ram(name: &str, size_bytes: u64, block_size: u32) -> Result<Device, Error> {
        Device::ram_with(name, size_bytes, block_size, true)
    }

    /// As [`ram`](Self::ram); with `huge_pages` false the memory is never
    /// in transparent huge pages (`MADV_NOHUGEPAGE`), so it is committed
    /// and given back by deallocate 4 KiB at a time.
    pub fn ram_with(name: &str, size_bytes: u64, block_size: u32, huge_pages: bool) -> Result<Device, Error> {
        let geometry = exact_geometry(size_bytes, block_size)?;
        Ok(Device {
            name: name.to_owned(),
            kind: Kind::Ram,
            geometry,
            blocks: AtomicU64::new(geometry.blocks),
            follows_backing: false,
            path: None,
            backend: Backend::Ram(RamRegion::new(size_bytes, huge_pages)?),
            latency: Latency::default(),
            flush_failed: Arc::default(),
            flushes: Arc::default(),
            shared: None,
            gate: WriteGate::new(),
            read_only: false,
        })
    }

    /// A device on a regular file. With `size_bytes` the file is created if
    /// missing and extended if shorter (a longer file exposes only its first
    /// `size_bytes`); without it the file's length is the size. Symlinks
    /// on `path` are followed ([`Device::file_with`] can refuse them).
    pub fn file(name: &str, path: &Path, size_bytes: Option<u64>, block_size: u32) -> Result<Device, Error> {
        Device::file_with(name, path, size_bytes, block_size, Symlinks::Follow, false)
    }

    /// [`Device::file`], resolving `path` once as `symlinks` says: every
    /// descriptor of the device is a reopen of that one object, whatever
    /// the path names later. `read_only`: every descriptor is opened
    /// read-only, and the file must exist and give the size (no
    /// `size_bytes`).
    pub fn file_with(
        name: &str,
        path: &Path,
        size_bytes: Option<u64>,
        block_size: u32,
        symlinks: Symlinks,
        read_only: bool,
    ) -> Result<Device, Error> {
        check_block_size(block_size)?;
        if let Some(size) = size_bytes {
            if read_only {
                return Err(Error::Unsupported("a size for a read-only file device (its file's length is its size)"));
            }
            exact_geometry(size, block_size)?;
        }
        let resolved = match size_bytes {
            Some(_) => Resolved::create(path, symlinks),
            None if read_only => Resolved::existing(path, symlinks).map(Resolved::read_only),
            None => Resolved::existing(path, symlinks),
        }
        .map_err(open_err(path))?;
        let meta = resolved.file().metadata().map_err(open_err(path))?;
        if !meta.is_file() {
            return Err(Error::NotRegularFile(path.to_path_buf()));
        }
        if let Some(size) = size_bytes.filter(|&s| meta.len() < s) {
            resolved.file().set_len(size).map_err(open_err(path))?;
        }
        let opened = FileBackend::open(&resolved, false).map_err(open_err(path))?;
        let size = size_bytes.unwrap_or(opened.size_bytes);
        let geometry = exact_geometry(size, block_size)?;
        Ok(Device {
            name: name.to_owned(),
            kind: Kind::File,
            geometry,
            blocks: AtomicU64::new(geometry.blocks),
            follows_backing: size_bytes.is_none(),
            path: Some(path.to_path_buf()),
            backend: Backend::File(opened.backend),
            latency: Latency::default(),
            flush_failed: Arc::default(),
            flushes: Arc::default(),
            shared: None,
            gate: WriteGate::new(),
            read_only,
        })
    }

    /// A device on a raw block device. Its size comes from `BLKGETSIZE64`;
    /// `block_size` defaults to its logical block size and may not be smaller.
    /// The device is opened `O_EXCL`, so a mounted one is refused. Symlinks
    /// on `path` are followed ([`Device::block_with`] can refuse them).
    pub fn block(name: &str, path: &Path, block_size: Option<u32>) -> Result<Device, Error> {
        Device::block_with(name, path, block_size, Symlinks::Follow, false)
    }

    /// [`Device::block`], resolving `path` once as `symlinks` says, as
    /// [`Device::file_with`] does; `read_only` opens it read-only.
    pub fn block_with(
        name: &str,
        path: &Path,
        block_size: Option<u32>,
        symlinks: Symlinks,
        read_only: bool,
    ) -> Result<Device, Error> {
        use std::os::unix::fs::FileTypeExt;
        let resolved = Resolved::existing(path, symlinks).map_err(open_err(path))?;
        let resolved = if read_only { resolved.read_only() } else { resolved };
        let meta = resolved.file().metadata().map_err(open_err(path))?;
        if !meta.file_type().is_block_device() {
            return Err(Error::NotBlockDevice(path.to_path_buf()));
        }
        let opened = FileBackend::open(&resolved, true).map_err(open_err(path))?;
        let logical = opened.logical_block_size.unwrap_or(MIN_BLOCK_SIZE);
        let block_size = block_size.unwrap_or(logical);
        check_block_size(block_size)?;
        if block_size < logical {
            return Err(Error::BlockSizeBelowLogical { requested: block_size, logical });
        }
        // A device size that is not a whole number of blocks exposes the
        // whole blocks only.
        let blocks = opened.size_bytes / u64::from(block_size);
        if blocks == 0 {
            return Err(Error::InvalidSize { size_bytes: opened.size_bytes, block_size });
        }
        Ok(Device {
            name: name.to_owned(),
            kind: Kind::Block,
            geometry: Geometry { block_size, blocks },
            blocks: AtomicU64::new(blocks),
            follows_backing: true,
            path: Some(path.to_path_buf()),
            backend: Backend::File(opened.backend),
            latency: Latency::default(),
            flush_failed: Arc::default(),
            flushes: Arc::default(),
            shared: None,
            gate: WriteGate::new(),
            read_only,
        })
    }

    /// A device on a Ceph RBD image, its size the image's (whole blocks of
    /// `block_size`). Connects to the cluster and opens the image, which
    /// blocks for up to `options.timeout` per step: call it off the
    /// reactor threads. Every later I/O is asynchronous.
    pub fn rbd(name: &str, options: &rbd::Options, block_size: u32) -> Result<Device, Error> {
        check_block_size(block_size)?;
        let spec = PathBuf::from(format!("rbd:{}/{}", options.pool, options.image));
        let image = rbd::Image::open(options)
            .map_err(|e| Error::Open { path: spec.clone(), reason: io::Error::other(e.to_string()) })?;
        let blocks = image.size() / u64::from(block_size);
        if blocks == 0 {
            return Err(Error::InvalidSize { size_bytes: image.size(), block_size });
        }
        Ok(Device {
            name: name.to_owned(),
            kind: Kind::Rbd,
            geometry: Geometry { block_size, blocks },
            blocks: AtomicU64::new(blocks),
            follows_backing: false,
            path: Some(spec),
            shared: Some(format!("ceph:{}:{}", image.fsid(), image.id())),
            backend: Backend::Rbd(image),
            latency: Latency::default(),
            flush_failed: Arc::default(),
            flushes: Arc::default(),
            gate: WriteGate::new(),
            read_only: options.read_only,
        })
    }

    /// Re-reads the size of an rbd image (which `rbd resize` may change
    /// while it is exported), of a block device (`lvextend`, `losetup -c`)
    /// or of a file device configured without `size` (`truncate -s`), and
    /// adopts it (whole blocks): `Ok(true)` when the capacity changed, so
    /// hosts must be told. Other devices have the size they were given.
    /// May wait on the cluster for up to its operation timeout: call it
    /// off the reactor threads.
    pub fn refresh_size(&self) -> io::Result<bool> {
        let bytes = match &self.backend {
            Backend::Rbd(image) => image.current_size()?,
            Backend::File(f) if self.follows_backing => f.current_size()?,
            _ => return Ok(false),
        };
        let blocks = bytes / u64::from(self.geometry.block_size);
        let now = self.blocks.load(Ordering::Acquire);
        if blocks == now {
            return Ok(false);
        }
        if blocks == 0 {
            // A file cut to nothing is not a device of no blocks: keep the
            // size hosts know (their I/O past the file's end fails or
            // extends it, as before) until it has blocks again.
            log::warn!("device {}: its backing now holds less than one block; keeping {now} blocks", self.name);
            return Ok(false);
        }
        if blocks < now {
            log::warn!("device {}: its backing shrank from {now} to {blocks} blocks; hosts will be told", self.name);
        }
        self.blocks.store(blocks, Ordering::Release);
        Ok(true)
    }

    /// Closes an rbd image now, when the daemon stops (its watch and
    /// exclusive lock go with it, so that other clients of the image need
    /// not wait for the OSDs to time them out); later I/O to it fails.
    /// Blocks until librbd has closed it: call it off the reactor threads.
    /// Other devices close when dropped.
    pub fn close(&self) {
        if let Backend::Rbd(image) = &self.backend {
            image.close();
        }
    }

    /// Grows a null device, or a file device configured with a `size`, to
    /// `size_bytes` while it is in use: the file is extended first (never
    /// shrunk), then the capacity adopted. `Ok(true)` when it changed, so
    /// hosts must be told. A smaller size is refused (blocks hosts may be
    /// using would be cut off), as is any other kind of device: a RAM
    /// device's memory is mapped once, and the others follow their
    /// backing ([`refresh_size`](Self::refresh_size)).
    pub fn grow(&self, size_bytes: u64) -> Result<bool, Error> {
        Ok(self.prepare_grow(size_bytes)?.commit())
    }

    /// The half of [`grow`](Self::grow) that may fail: checks the new size
    /// and extends the file. The device keeps its capacity until
    /// [`Growth::commit`], which cannot fail, so that several devices grow
    /// together or not at all (an extended file alone changes nothing).
    pub fn prepare_grow(&self, size_bytes: u64) -> Result<Growth<'_>, Error> {
        let block_size = self.geometry.block_size;
        let blocks = exact_geometry(size_bytes, block_size)?.blocks;
        let now = self.blocks.load(Ordering::Acquire);
        if blocks < now {
            return Err(Error::Unsupported("shrinking a device in use"));
        }
        match &self.backend {
            Backend::Null => {}
            Backend::File(f) if !self.follows_backing => f.extend_to(size_bytes)?,
            Backend::Ram(_) => {
                return Err(Error::Unsupported("growing a RAM device in use (its memory is mapped once)"))
            }
            _ => return Err(Error::Unsupported("growing a device that follows its backing (resize the backing)")),
        }
        Ok(Growth { device: self, blocks })
    }

    /// Which backend this is.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Backing file or device path (file and block devices), or
    /// `rbd:pool/image`.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Whether aligned I/O bypasses the page cache (`O_DIRECT`).
    pub fn direct_io(&self) -> bool {
        match &self.backend {
            Backend::File(f) => f.direct_io(),
            _ => false,
        }
    }

    /// Range-checks `blocks` at `lba` and returns the byte offset and length.
    fn byte_range(&self, lba: u64, blocks: u64) -> Result<(u64, u64), Error> {
        let geometry = self.geometry();
        geometry.check_range(lba, blocks)?;
        let bs = u64::from(geometry.block_size);
        let out_of_range = || Error::OutOfRange { lba, blocks, capacity: geometry.blocks };
        let offset = lba.checked_mul(bs).ok_or_else(out_of_range)?;
        let len = blocks.checked_mul(bs).ok_or_else(out_of_range)?;
        Ok((offset, len))
    }

    /// Byte offset for an I/O of `len` bytes at `lba`, after the length and
    /// range checks.
    fn io_offset(&self, lba: u64, len: usize) -> Result<u64, Error> {
        let block_size = self.geometry.block_size;
        let bs = block_size as usize;
        if !len.is_multiple_of(bs) {
            return Err(Error::Misaligned { len, block_size });
        }
        Ok(self.byte_range(lba, (len / bs) as u64)?.0)
    }

    /// Whether reads complete at once, without I/O (null and ram devices
    /// without injected read latency): [`read_now`](Self::read_now) serves
    /// them.
    pub fn reads_from_memory(&self) -> bool {
        matches!(self.backend, Backend::Null | Backend::Ram(_)) && self.latency.read.is_zero()
    }

    /// This device, exported read-only (null and RAM devices: the
    /// protocols refuse writes; file, block and rbd devices take
    /// `read_only` when opened, so that their backing refuses writes too).
    pub fn with_read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// The same device with `latency` added to every read and write.
    pub fn with_latency(mut self, latency: Latency) -> Self {
        self.latency = latency;
        self
    }

    /// Whether `len` bytes at `lba` read as zeros with no I/O and nothing
    /// to copy (a null device): `None` for every other device, else the
    /// range check's verdict. Lets a transport send them from a shared page
    /// of zeros instead of writing them.
    pub fn zeros_now(&self, lba: u64, len: usize) -> Option<Result<(), Error>> {
        if !matches!(self.backend, Backend::Null) || !self.latency.read.is_zero() {
            return None;
        }
        Some(self.io_offset(lba, len).map(|_| ()))
    }

    /// Appends `len` bytes (a whole number of blocks) read at `lba` to
    /// `out` when the device needs no I/O for it (null, ram): `None` for
    /// file and block devices. Lets a transport copy device data once,
    /// straight into its send buffer (not even over zeros written first),
    /// with no task and no intermediate buffer, and a digest over it
    /// computed by the copy's own loads. On an error nothing is appended.
    pub fn read_now(&self, lba: u64, len: usize, out: &mut Appender<'_>) -> Option<Result<(), Error>> {
        if !self.latency.read.is_zero() {
            return None;
        }
        let offset = match self.io_offset(lba, len) {
            Ok(offset) => offset,
            Err(e) => return Some(Err(e)),
        };
        match &self.backend {
            Backend::Null => {
                out.extend_zeros(len);
                Some(Ok(()))
            }
            Backend::Ram(ram) => Some(ram.read_append(offset, len, out).map_err(Error::from)),
            Backend::File(_) | Backend::Rbd(_) => None,
        }
    }

    /// Writes `src` (a whole number of blocks) at `lba` at once when the
    /// device needs no I/O for it (null, ram, with no injected write
    /// latency): `None` for file and block devices. Memory devices have no
    /// cache, so the write is as durable as they get (FUA needs nothing).
    /// Lets a transport complete such writes where the command arrived,
    /// with no task.
    pub fn write_now(&self, lba: u64, src: &[u8]) -> Option<Result<(), Error>> {
        if !self.latency.write.is_zero() {
            return None;
        }
        let offset = match self.io_offset(lba, src.len()) {
            Ok(offset) => offset,
            Err(e) => return Some(Err(e)),
        };
        if matches!(self.backend, Backend::File(_) | Backend::Rbd(_)) {
            return None;
        }
        // A write that would wait for a locked range goes the async way.
        let _token = self.gate.try_write(self.block_range(lba, src.len()))?;
        match &self.backend {
            Backend::Null => Some(Ok(())),
            Backend::Ram(ram) => Some(ram.write(offset, src).map_err(Error::from)),
            Backend::File(_) | Backend::Rbd(_) => None,
        }
    }

    /// The latency injected before each read and write reaches the backend.
    pub fn latency(&self) -> Latency {
        self.latency
    }

    /// Reads `buf.len()` bytes (a whole number of blocks) starting at `lba`.
    pub async fn read(&self, lba: u64, buf: IoBuf) -> (Result<(), Error>, IoBuf) {
        if !self.latency.read.is_zero() {
            reactor::sleep(self.latency.read).await;
        }
        self.read_undelayed(lba, buf).await
    }

    /// As [`read`](Self::read) without the injected latency, for a caller
    /// that waits it out itself so that it can give the I/O up before the
    /// backend sees it (an aborted command).
    pub async fn read_undelayed(&self, lba: u64, mut buf: IoBuf) -> (Result<(), Error>, IoBuf) {
        let offset = match self.io_offset(lba, buf.len()) {
            Ok(offset) => offset,
            Err(e) => return (Err(e), buf),
        };
        match &self.backend {
            Backend::Null => {
                buf.fill(0);
                (Ok(()), buf)
            }
            Backend::Ram(ram) => {
                let res = ram.read(offset, &mut buf).map_err(Error::from);
                (res, buf)
            }
            Backend::File(file) => {
                let (res, buf) = file.read(offset, buf).await;
                (res.map_err(Error::from), buf)
            }
            Backend::Rbd(image) => {
                let (res, buf) = image.read(offset, buf).await;
                (res.map_err(Error::from), buf)
            }
        }
    }

    /// Writes `buf` (a whole number of blocks) starting at `lba`. With `fua`
    /// the data is durable when this returns (on a file or block device,
    /// what went through the page cache is followed by [`flush`](Self::flush),
    /// so such a write fails once a flush failed). Waits while the blocks
    /// overlap a [`RangeLock`].
    pub async fn write(&self, lba: u64, buf: IoBuf, fua: bool) -> (Result<(), Error>, IoBuf) {
        if !self.latency.write.is_zero() {
            reactor::sleep(self.latency.write).await;
        }
        self.write_undelayed(lba, buf, fua).await
    }

    /// As [`write`](Self::write) without the injected latency (see
    /// [`read_undelayed`](Self::read_undelayed)): the transport has waited
    /// it out where an abort can still cancel the command. Waits while the
    /// blocks overlap a [`RangeLock`].
    pub async fn write_undelayed(&self, lba: u64, buf: IoBuf, fua: bool) -> (Result<(), Error>, IoBuf) {
        let _token = match self.gate.write(self.block_range(lba, buf.len())).await {
            Ok(token) => token,
            Err(e) => return (Err(Error::Io(e)), buf),
        };
        self.write_unchecked(lba, buf, fua).await
    }

    /// Writes `buf` at `lba` inside the range `lock` holds (the second
    /// half of a compare-and-write), without waiting for the lock.
    /// [`Error::Unsupported`] when the blocks are not all inside it.
    pub async fn write_locked(
        &self,
        lock: &RangeLock<'_>,
        lba: u64,
        buf: IoBuf,
        fua: bool,
    ) -> (Result<(), Error>, IoBuf) {
        if !std::ptr::eq(lock.gate(), &self.gate) || !lock.covers(lba, self.block_count(buf.len())) {
            return (Err(Error::Unsupported("write outside the locked range")), buf);
        }
        self.write_unchecked(lba, buf, fua).await
    }

    /// Locks `blocks` blocks at `lba` against every other write to them
    /// (from any reactor, protocol or export of this device): waits,
    /// without blocking the reactor, for the writes already under way on
    /// the device and for earlier locks of overlapping blocks. Writes to
    /// other blocks go on. For compare-and-write: read, compare and
    /// [`write_locked`](Self::write_locked) while holding it.
    pub async fn lock_range(&self, lba: u64, blocks: u64) -> Result<RangeLock<'_>, Error> {
        self.byte_range(lba, blocks)?;
        self.gate.lock(Range::new(lba, blocks)).await.map_err(Error::Io)
    }

    /// The blocks `len` bytes at `lba` cover (range-checked later).
    fn block_range(&self, lba: u64, len: usize) -> Range {
        Range::new(lba, self.block_count(len))
    }

    fn block_count(&self, len: usize) -> u64 {
        (len as u64).div_ceil(u64::from(self.geometry.block_size))
    }

    async fn write_unchecked(&self, lba: u64, buf: IoBuf, fua: bool) -> (Result<(), Error>, IoBuf) {
        let offset = match self.io_offset(lba, buf.len()) {
            Ok(offset) => offset,
            Err(e) => return (Err(e), buf),
        };
        match &self.backend {
            Backend::Null => (Ok(()), buf),
            Backend::Ram(ram) => {
                let res = ram.write(offset, &buf).map_err(Error::from);
                (res, buf)
            }
            Backend::File(file) => {
                let (res, buf) = file.write(offset, buf, fua).await;
                let res = match res {
                    // A FUA write partly through the page cache: durable
                    // once a flush has reported no writeback error (the
                    // latch and the overlap of flushes see to every one).
                    Ok(true) => self.flush().await,
                    Ok(false) => Ok(()),
                    Err(e) => Err(Error::from(e)),
                };
                (res, buf)
            }
            // With librbd's cache off a completed write is on the OSDs:
            // FUA needs nothing more.
            Backend::Rbd(image) => {
                let (res, buf) = image.write(offset, buf).await;
                (res.map_err(Error::from), buf)
            }
        }
    }

    /// Makes every completed write durable (fdatasync for file and block
    /// devices, `rbd_aio_flush` for rbd; nothing to do for null and ram).
    /// Once a file or block device's flush failed, every later one fails
    /// too ([`Error::EarlierFlushFailed`]), until the device is reopened:
    /// the failed one may have lost acknowledged writes, and the kernel
    /// would not say so a second time.
    pub async fn flush(&self) -> Result<(), Error> {
        // A read-only device was never written through: nothing to make
        // durable. (A file on squashfs, erofs or iso9660 has no fsync at
        // all: fdatasync is EINVAL there, which would fail the flush and
        // latch that failure for every later one.)
        if self.read_only {
            return Ok(());
        }
        self.check_flush_latch()?;
        let ticket = self.flushes.start();
        let (res, ticket) = match &self.backend {
            Backend::Null | Backend::Ram(_) => (Ok(()), ticket),
            Backend::File(file) => {
                let keep = LostFlush { latch: self.flush_failed.clone(), ticket, device: self.name.clone() };
                let (res, keep) = file.flush(keep, LostFlush::ended).await;
                (res, keep.ticket)
            }
            Backend::Rbd(image) => (image.flush().await, ticket),
        };
        match res {
            Ok(()) => {
                // A flush that ran beside this one may have been told of
                // the writeback error instead (the kernel tells one
                // `fsync` per descriptor); it latches it before it ends.
                let horizon = ticket.end();
                // Only a file's flushes share one descriptor (rbd reports
                // an error to every flush it concerns).
                while matches!(self.backend, Backend::File(_)) && self.flushes.any_before(horizon) {
                    reactor::sleep(FLUSH_OVERLAP_POLL).await;
                }
                self.check_flush_latch()
            }
            // librbd's cache is off, so every acknowledged write is on the
            // OSDs: a failed rbd flush (one that timed out while an OSD did
            // not answer) lost none, and the next one may succeed.
            Err(e) if matches!(self.backend, Backend::Rbd(_)) => Err(Error::Io(e)),
            Err(e) => {
                if self.flush_failed.set(e.to_string()).is_ok() {
                    log::error!(
                        "device {} ({}): flush failed: {e}; writes acknowledged before it may be lost, \
                         and every later flush of this device fails until it is reopened",
                        self.name,
                        self.path.as_deref().unwrap_or(Path::new("-")).display()
                    );
                }
                Err(Error::Io(e))
            }
        }
    }

    fn check_flush_latch(&self) -> Result<(), Error> {
        match self.flush_failed.get() {
            Some(first) => Err(Error::EarlierFlushFailed(first.clone())),
            None => Ok(()),
        }
    }

    /// Makes `blocks` blocks at `lba` read as zeros. With `deallocate` the
    /// backend may also release their storage (hole punch, unmap).
    pub async fn write_zeroes(&self, lba: u64, blocks: u64, deallocate: bool) -> Result<(), Error> {
        let (offset, len) = self.byte_range(lba, blocks)?;
        let _token = self.gate.write(Range::new(lba, blocks)).await?;
        match &self.backend {
            Backend::Null => Ok(()),
            Backend::Ram(ram) => Ok(ram.zero(offset, usize_len(len)?)?),
            Backend::File(file) => Ok(file.write_zeroes(offset, len, deallocate).await?),
            // librbd releases whole objects it zeroes on its own.
            Backend::Rbd(image) => Ok(image.write_zeroes(offset, len).await?),
        }
    }

    /// Releases `blocks` blocks at `lba`. Null, ram and file devices read
    /// zeros there afterwards; on block and rbd devices this is a discard
    /// hint.
    pub async fn deallocate(&self, lba: u64, blocks: u64) -> Result<(), Error> {
        let (offset, len) = self.byte_range(lba, blocks)?;
        let _token = self.gate.write(Range::new(lba, blocks)).await?;
        match &self.backend {
            Backend::Null => Ok(()),
            Backend::Ram(ram) => Ok(ram.zero(offset, usize_len(len)?)?),
            Backend::File(file) => Ok(file.deallocate(offset, len).await?),
            Backend::Rbd(image) => Ok(image.discard(offset, len).await?),
        }
    }
}

impl Device {
    /// The provisioning state of the blocks from `lba`: the run of at most
    /// `blocks` (non-zero) blocks from it that share one. A regular file
    /// tells its holes (`lseek` `SEEK_DATA`/`SEEK_HOLE`): a block wholly
    /// inside one is deallocated. Other backends cannot tell (a null or ram
    /// device keeps no map of what was written; a block device or rbd image
    /// does not say), and report the whole range mapped, SBC-4's "mapped or
    /// unknown".
    pub fn extent(&self, lba: u64, blocks: u64) -> Result<Extent, Error> {
        let (offset, len) = self.byte_range(lba, blocks)?;
        let mapped = Extent { blocks, deallocated: false };
        let bs = u64::from(self.geometry.block_size);
        match &self.backend {
            Backend::File(file) if blocks > 0 => Ok(file
                .extent(offset, len, bs)?
                .map_or(mapped, |(deallocated, bytes)| Extent { blocks: (bytes / bs).clamp(1, blocks), deallocated })),
            _ => Ok(mapped),
        }
    }
}

impl Device {
    /// Whether [`compare_and_write`](Self::compare_and_write) of `len`
    /// bytes at `lba` is one atomic backend operation: on rbd devices a
    /// range inside one 512-byte sector (Ceph 16's limit for
    /// `rbd_aio_compare_and_write`), which is atomic across every gateway
    /// of the image. Other devices and ranges compare and write in the
    /// caller, under [`lock_range`](Self::lock_range).
    pub fn atomic_compare_and_write(&self, lba: u64, len: usize) -> bool {
        let Ok((offset, _)) = self.byte_range(lba, 0) else { return false };
        matches!(self.backend, Backend::Rbd(_)) && len > 0 && (offset % 512) as usize + len <= 512
    }

    /// Compares the blocks at `lba` with `expected` and, if equal, writes
    /// `data` (the same length) there, atomically in the backend: `None`
    /// when written, `Some(offset)` of the first differing byte when not.
    /// [`Error::Unsupported`] where
    /// [`atomic_compare_and_write`](Self::atomic_compare_and_write) is
    /// false. A write as any other here: it waits for range locks over its
    /// blocks, so that a longer compare-and-write done under one stays
    /// atomic against it.
    pub async fn compare_and_write(&self, lba: u64, expected: IoBuf, data: IoBuf) -> Result<Option<u64>, Error> {
        let offset = self.io_offset(lba, data.len())?;
        if expected.len() != data.len() || !self.atomic_compare_and_write(lba, data.len()) {
            return Err(Error::Unsupported("atomic compare-and-write of this range"));
        }
        let Backend::Rbd(image) = &self.backend else {
            return Err(Error::Unsupported("atomic compare-and-write of this range"));
        };
        let _token = self.gate.write(self.block_range(lba, data.len())).await?;
        match image.compare_and_write(offset, expected, data).await.0 {
            Ok(()) => Ok(None),
            Err(rbd::CompareError::Miscompare { offset }) => Ok(Some(offset)),
            Err(rbd::CompareError::Io(e)) => Err(Error::Io(e)),
        }
    }
}

fn usize_len(len: u64) -> Result<usize, Error> {
    usize::try_from(len).map_err(|_| Error::Unsupported("range larger than the address space"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn device_is_send_and_sync() {
        assert_send_sync::<Device>();
        assert_send_sync::<IoBuf>();
    }

    #[test]
    fn kind_displays_lowercase_names() {
        let names: Vec<String> =
            [Kind::Null, Kind::Ram, Kind::File, Kind::Block, Kind::Rbd].iter().map(ToString::to_string).collect();
        assert_eq!(names, ["null", "ram", "file", "block", "rbd"]);
    }

    #[test]
    fn memory_devices_write_at_once_and_others_decline() {
        let ram = Device::ram("r", 1 << 20, 512).expect("ram device");
        assert!(matches!(ram.write_now(3, &[0x5a; 1024]), Some(Ok(()))));
        let mut back = vec![7u8; 2];
        assert!(matches!(ram.read_now(3, 1024, &mut Appender::new(&mut back, None)), Some(Ok(()))));
        assert_eq!(back.len(), 2 + 1024, "appended after what was there");
        assert_eq!(back[..2], [7, 7]);
        assert!(back[2..].iter().all(|&b| b == 0x5a));
        assert!(matches!(ram.write_now(2047, &[0; 1024]), Some(Err(Error::OutOfRange { .. }))));
        let null = Device::null("n", 1 << 20, 512).expect("null device");
        assert!(matches!(null.write_now(0, &[1; 512]), Some(Ok(()))));
        let slow = Device::ram("s", 1 << 20, 512)
            .expect("ram device")
            .with_latency(Latency { read: Duration::ZERO, write: Duration::from_millis(1) });
        assert!(slow.write_now(0, &[1; 512]).is_none(), "injected latency needs the async path");
        assert!(slow.reads_from_memory());
    }
}
