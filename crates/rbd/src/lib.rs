//! A small binding to Ceph's librados and librbd: open an RBD image, and
//! read, write, flush, discard, write zeroes and compare-and-write it with
//! librbd's asynchronous calls, completed on the reactor thread that
//! submitted them.
//!
//! The libraries are loaded at run time (`dlopen` of `librados.so.2` and
//! `librbd.so.1`), so building needs no Ceph packages and only opening an
//! image needs librbd1. This is the only crate with Ceph's unsafe code.
//!
//! It must never block a reactor on I/O (every data call is librbd AIO;
//! [`Image::open`], [`Image::close`] and dropping an [`Image`] block and
//! belong on a thread that is not a reactor), never hang on an unreachable
//! cluster (every monitor and OSD operation has the connect timeout), and
//! never let librbd write into freed memory (see the `aio` module).

mod aio;
mod ffi;

use std::ffi::{c_char, CStr, CString};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use reactor::buf::{IoBuf, IoBufMut};

pub use aio::SLOTS;

/// The configuration file of the Ceph cluster the test suites run against
/// (`scripts/test` starts one with ceph-peer and names it in
/// `IRONWIRE_CEPH_CONF`), for the tests of this crate and of the crates
/// built on it: `None`, with a line on stderr, when there is none outside
/// CI; under CI (`CI=true`) a missing cluster is a failure.
pub fn test_cluster() -> Option<PathBuf> {
    match std::env::var_os("IRONWIRE_CEPH_CONF") {
        Some(p) => Some(PathBuf::from(p)),
        None if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("CI=true but IRONWIRE_CEPH_CONF is not set: scripts/test starts the Ceph cluster these tests need")
        }
        None => {
            eprintln!("skipped: no Ceph cluster (set IRONWIRE_CEPH_CONF, as scripts/test does with ceph-peer)");
            None
        }
    }
}

/// Everything opening an image can fail with; each message names what was
/// being done and with which value.
#[derive(thiserror::Error, Debug)]
pub enum Error {
    /// librados or librbd could not be loaded (not installed, or too old).
    #[error("{0}")]
    Library(String),
    /// A setting contained a NUL byte.
    #[error("{field} {value:?} contains a NUL byte")]
    Nul { field: &'static str, value: String },
    /// `rados_create2` failed.
    #[error("cannot create a Ceph client handle for client.{client}: {source}")]
    Create { client: String, source: io::Error },
    /// The configuration file could not be read.
    #[error("ceph_conf {path}: {source}")]
    Conf { path: PathBuf, source: io::Error },
    /// A configuration option was refused.
    #[error("ceph option {option} = {value:?}: {source}")]
    Option { option: &'static str, value: String, source: io::Error },
    /// The monitors could not be reached or refused us within the timeout.
    #[error(
        "cannot connect to the Ceph cluster (monitors {monitors}) as client.{client} within {timeout_s} s: {source}"
    )]
    Connect { monitors: String, client: String, timeout_s: u64, source: io::Error },
    /// The pool does not exist or cannot be used.
    #[error("pool {pool:?}: {source}")]
    Pool { pool: String, source: io::Error },
    /// The image does not exist or cannot be opened.
    #[error("image {pool}/{image}: {source}")]
    Image { pool: String, image: String, source: io::Error },
    /// The image's or its pool's configuration turns librbd's cache on,
    /// over the client's `rbd_cache = false`.
    #[error(
        "image {spec}: its {level} configuration sets rbd_cache = true, which overrides this gateway's \
         rbd_cache = false: with librbd's cache writes would be acknowledged before the OSDs have them, and \
         other gateways exporting the image would not see them; remove it (rbd config {fix} rbd_cache)"
    )]
    Cache { spec: String, level: &'static str, fix: String },
    /// The image's, its pool's or the client's configuration loads
    /// librbd's persistent write-log cache.
    #[error(
        "image {spec}: its {level} configuration sets rbd_plugins = {value:?}: the pwl_cache plugin acknowledges \
         writes from a local log before the OSDs have them, which a gateway must not do; remove it"
    )]
    Plugin { spec: String, level: &'static str, value: String },
}

/// Where an image is and how to reach its cluster.
#[derive(Clone, Debug)]
pub struct Options {
    /// The Ceph configuration file (monitors, and usually the keyring).
    pub ceph_conf: PathBuf,
    /// The cephx user, without `client.`.
    pub client: String,
    /// A keyring to use instead of the one the configuration names.
    pub keyring: Option<PathBuf>,
    /// The pool.
    pub pool: String,
    /// The image.
    pub image: String,
    /// How long connecting, and each monitor and OSD operation, may take
    /// before it fails (`client_mount_timeout`, `rados_mon_op_timeout`,
    /// `rados_osd_op_timeout`); whole seconds, at least one.
    pub timeout: Duration,
    /// Opens the image read-only (`rbd_open_read_only`): librbd refuses
    /// writes itself, takes no exclusive lock and needs only read caps.
    pub read_only: bool,
}

/// The default `ceph_conf`.
pub const DEFAULT_CEPH_CONF: &str = "/etc/ceph/ceph.conf";
/// The default connect and operation timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// An open RBD image. Shared by all reactor threads; each I/O completes on
/// the thread that submitted it.
pub struct Image {
    cluster: ffi::Rados,
    ioctx: ffi::Ioctx,
    image: ffi::RbdImage,
    size: u64,
    spec: String,
    fsid: String,
    id: String,
    /// Calls into librbd with the handles under way ([`Image::enter`]);
    /// [`Image::close`] waits for them to end.
    users: AtomicUsize,
    /// Set by [`Image::close`]: no call into librbd starts any more.
    closed: AtomicBool,
}

// SAFETY: librados cluster and ioctx handles and librbd image handles are
// thread-safe for the calls made here (AIO submission from any thread);
// they are closed once, by `close` or Drop, when no call can use them any
// more (`enter`).
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Image").field("spec", &self.spec).field("size", &self.size).finish()
    }
}

fn errno(rc: i64) -> io::Error {
    io::Error::from_raw_os_error(i32::try_from(-rc).unwrap_or(libc::EIO))
}

fn cstring(field: &'static str, value: &str) -> Result<CString, Error> {
    CString::new(value).map_err(|_| Error::Nul { field, value: value.to_owned() })
}

/// A cluster handle that shuts down on drop unless handed to an [`Image`].
struct Handle(ffi::Rados);

impl Drop for Handle {
    fn drop(&mut self) {
        if let Ok(lib) = ffi::lib() {
            // SAFETY: a handle from rados_create2, shut down once.
            unsafe { (lib.rados_shutdown)(self.0) };
        }
    }
}

impl Handle {
    fn set(&self, lib: &ffi::Lib, option: &'static str, value: &str) -> Result<(), Error> {
        let name = cstring("option", option)?;
        let v = cstring(option, value)?;
        // SAFETY: a live, unconnected handle; both strings NUL-terminated.
        let rc = unsafe { (lib.rados_conf_set)(self.0, name.as_ptr(), v.as_ptr()) };
        if rc < 0 {
            return Err(Error::Option { option, value: value.to_owned(), source: errno(rc.into()) });
        }
        Ok(())
    }

    fn get(&self, lib: &ffi::Lib, option: &CStr) -> Option<String> {
        let mut buf = [0 as c_char; 1024];
        // SAFETY: a live handle; librados writes at most buf.len() bytes,
        // NUL-terminated on success.
        let rc = unsafe { (lib.rados_conf_get)(self.0, option.as_ptr(), buf.as_mut_ptr(), buf.len()) };
        if rc < 0 {
            return None;
        }
        // SAFETY: NUL-terminated inside buf (above).
        Some(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
    }
}

impl Image {
    /// Connects to the cluster and opens the image. Blocks for up to the
    /// timeout (per step): call it off the reactor threads.
    pub fn open(o: &Options) -> Result<Image, Error> {
        let lib = ffi::lib().map_err(Error::Library)?;
        let client = cstring("client", &format!("client.{}", o.client))?;
        let mut raw: ffi::Rados = std::ptr::null_mut();
        // SAFETY: `raw` receives the handle; the strings are NUL-terminated.
        let rc = unsafe { (lib.rados_create2)(&mut raw, c"ceph".as_ptr(), client.as_ptr(), 0) };
        if rc < 0 {
            return Err(Error::Create { client: o.client.clone(), source: errno(rc.into()) });
        }
        let h = Handle(raw);
        let conf = cstring("ceph_conf", &o.ceph_conf.to_string_lossy())?;
        // SAFETY: a live, unconnected handle; a NUL-terminated path.
        let rc = unsafe { (lib.rados_conf_read_file)(h.0, conf.as_ptr()) };
        if rc < 0 {
            return Err(Error::Conf { path: o.ceph_conf.clone(), source: errno(rc.into()) });
        }
        if let Some(k) = &o.keyring {
            h.set(lib, "keyring", &k.to_string_lossy())?;
        }
        let timeout_s = o.timeout.as_secs().max(1);
        let secs = timeout_s.to_string();
        for option in ["client_mount_timeout", "rados_mon_op_timeout", "rados_osd_op_timeout"] {
            h.set(lib, option, &secs)?;
        }
        // No cache in the gateway: another gateway exporting the same image
        // must see every acknowledged write, so a write completes only when
        // the OSDs have it (and a flush has nothing left to do).
        h.set(lib, "rbd_cache", "false")?;
        let monitors = h.get(lib, c"mon_host").filter(|m| !m.is_empty()).unwrap_or_else(|| "(none configured)".into());
        // SAFETY: a live handle, configured above.
        let rc = unsafe { (lib.rados_connect)(h.0) };
        if rc < 0 {
            return Err(Error::Connect { monitors, client: o.client.clone(), timeout_s, source: errno(rc.into()) });
        }
        let pool = cstring("pool", &o.pool)?;
        let mut ioctx: ffi::Ioctx = std::ptr::null_mut();
        // SAFETY: a connected handle; `ioctx` receives the context.
        let rc = unsafe { (lib.rados_ioctx_create)(h.0, pool.as_ptr(), &mut ioctx) };
        if rc < 0 {
            return Err(Error::Pool { pool: o.pool.clone(), source: errno(rc.into()) });
        }
        let name = cstring("image", &o.image)?;
        let mut image: ffi::RbdImage = std::ptr::null_mut();
        let image_err = |rc: i64| Error::Image { pool: o.pool.clone(), image: o.image.clone(), source: errno(rc) };
        let open = if o.read_only { lib.rbd_open_read_only } else { lib.rbd_open };
        // SAFETY: a live ioctx; `image` receives the handle; no snapshot.
        let rc = unsafe { open(ioctx, name.as_ptr(), &mut image, std::ptr::null()) };
        if rc < 0 {
            // SAFETY: the context created above, destroyed once.
            unsafe { (lib.rados_ioctx_destroy)(ioctx) };
            return Err(image_err(rc.into()));
        }
        let mut size = 0u64;
        // SAFETY: an open image; `size` receives its size.
        let rc = unsafe { (lib.rbd_get_size)(image, &mut size) };
        // The cluster's fsid and the image's id name the image the same
        // way on every client, whatever pool or image name it is opened by.
        // SAFETY: a connected handle; librados writes at most the length
        // given, NUL-terminated when it fits.
        let fsid = read_text(|buf, len| unsafe { (lib.rados_cluster_fsid)(h.0, buf, len) });
        // SAFETY: an open image; as above.
        let id = read_text(|buf, len| unsafe { (lib.rbd_get_id)(image, buf, len) });
        let cluster = h.0;
        std::mem::forget(h);
        let mut img = Image {
            cluster,
            ioctx,
            image,
            size,
            spec: format!("{}/{}", o.pool, o.image),
            fsid: String::new(),
            id: String::new(),
            users: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        };
        if rc < 0 {
            return Err(image_err(rc.into()));
        }
        img.fsid = fsid.map_err(|rc| image_err(rc.into()))?;
        img.id = id.map_err(|rc| image_err(rc.into()))?;
        // Pool and image configuration (`rbd config pool|image set`)
        // override what the client set: read back what this open uses.
        // librbd's persistent write-log cache (`rbd_plugins = pwl_cache`)
        // acknowledges writes from a local log just the same.
        let plugins = img.config("rbd_plugins").map_err(|rc| image_err(rc.into()))?;
        if let Some((value, source)) = plugins.filter(|(v, _)| v.split(',').any(|p| p.trim() == "pwl_cache")) {
            let level = match source {
                2 => "image",
                1 => "pool",
                _ => "client",
            };
            return Err(Error::Plugin { spec: img.spec.clone(), level, value });
        }
        match img.config("rbd_cache").map_err(|rc| image_err(rc.into()))? {
            Some((value, source)) if value == "true" => {
                let (level, fix) = match source {
                    2 => ("image", format!("image rm {}/{}", o.pool, o.image)),
                    1 => ("pool", format!("pool rm {}", o.pool)),
                    _ => (
                        "client",
                        format!("global rm client rbd_cache (or the [client] section of {})", o.ceph_conf.display()),
                    ),
                };
                Err(Error::Cache { spec: img.spec.clone(), level, fix })
            }
            _ => Ok(img),
        }
    }

    /// The value of configuration option `name` this open image uses, and
    /// where it comes from (`RBD_CONFIG_SOURCE_*`: 0 the client, 1 the
    /// pool, 2 the image); `None` when librbd lists no such option.
    fn config(&self, name: &str) -> Result<Option<(String, std::ffi::c_int)>, std::ffi::c_int> {
        let lib = ffi::loaded();
        let mut options: Vec<ffi::ConfigOption> = Vec::new();
        let mut n: std::ffi::c_int = 128;
        loop {
            let cap = usize::try_from(n).unwrap_or(0);
            options.clear();
            options.resize_with(cap, || ffi::ConfigOption {
                name: std::ptr::null_mut(),
                value: std::ptr::null_mut(),
                source: 0,
            });
            // SAFETY: an open image; `options` has room for `n` entries,
            // and librbd sets `n` to how many it filled (or needs).
            let rc = unsafe { (lib.rbd_config_image_list)(self.image, options.as_mut_ptr(), &mut n) };
            if rc == -libc::ERANGE && usize::try_from(n).unwrap_or(0) > cap {
                continue;
            }
            if rc < 0 {
                return Err(rc);
            }
            break;
        }
        let filled = options.get(..usize::try_from(n).unwrap_or(0)).unwrap_or_default();
        let found = filled.iter().find_map(|o| {
            // SAFETY: librbd filled the entry with NUL-terminated strings.
            let (k, v) = unsafe { (CStr::from_ptr(o.name), CStr::from_ptr(o.value)) };
            (k.to_bytes() == name.as_bytes()).then(|| (v.to_string_lossy().into_owned(), o.source))
        });
        // SAFETY: the entries librbd filled, released once.
        unsafe { (lib.rbd_config_image_list_cleanup)(options.as_mut_ptr(), n) };
        Ok(found)
    }

    /// The image's size in bytes when it was opened.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The image's size in bytes now. librbd watches the image header and
    /// re-reads it after a resize (`rbd resize` anywhere in the cluster),
    /// so this sees the new size; that re-read may wait on the cluster for
    /// up to the operation timeout: call it off the reactor threads.
    pub fn current_size(&self) -> io::Result<u64> {
        let lib = ffi::lib().map_err(io::Error::other)?;
        let Some(_open) = self.enter() else { return Err(io::Error::from_raw_os_error(libc::ESHUTDOWN)) };
        let mut size = 0u64;
        // SAFETY: an open image (entered above); `size` receives its size.
        // librbd's image calls are thread-safe.
        let rc = unsafe { (lib.rbd_get_size)(self.image, &mut size) };
        if rc < 0 {
            return Err(errno(rc.into()));
        }
        Ok(size)
    }

    /// `pool/image`.
    pub fn spec(&self) -> &str {
        &self.spec
    }

    /// The cluster's fsid (`rados_cluster_fsid`).
    pub fn fsid(&self) -> &str {
        &self.fsid
    }

    /// The image's id within its pool (`rbd_get_id`), which a rename keeps.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Closes the image now rather than when it is dropped, so that its
    /// watch and the exclusive lock a write took go at once: a client that
    /// ends without closing leaves them to the OSDs' watch timeout, and
    /// other clients' writes wait for it. Every later I/O fails with
    /// `ESHUTDOWN`. Waits for the submissions under way, then in
    /// `rbd_close` for the I/O in flight and for an OSD to answer: call
    /// it off the reactor threads.
    pub fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        // A call that entered before the flag was set is counted here; one
        // after it sees the flag (both sides sequentially consistent).
        while self.users.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(Closing { cluster: self.cluster, ioctx: self.ioctx, image: self.image, spec: self.spec.clone() });
    }

    /// Lets one call into librbd use the handles until the guard is
    /// dropped; `None` once the image is closed.
    fn enter(&self) -> Option<Entered<'_>> {
        self.users.fetch_add(1, Ordering::SeqCst);
        let entered = Entered(&self.users);
        (!self.closed.load(Ordering::SeqCst)).then_some(entered)
    }

    /// [`aio::run`] of one call into librbd with the image's handles
    /// ([`Image::enter`]); `ESHUTDOWN` once [`Image::close`] began.
    ///
    /// # Safety
    ///
    /// As [`aio::run`]'s.
    async unsafe fn run<T: 'static>(
        &self,
        keep: T,
        start: impl FnOnce(&mut T, *mut libc::iovec, *mut u64, ffi::Completion) -> std::ffi::c_int,
    ) -> (aio::Done, T) {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            aio::run(keep, move |k, iov, mismatch, c| match self.enter() {
                Some(_open) => start(k, iov, mismatch, c),
                None => -libc::ESHUTDOWN,
            })
        }
        .await
    }

    /// Reads `buf`'s total length at `offset`.
    pub async fn read<B: IoBufMut>(&self, offset: u64, buf: B) -> (io::Result<()>, B) {
        let image = self.image;
        // SAFETY: one readv into the memory `buf` owns, described by the
        // slot's iovec.
        let (done, mut buf) = unsafe {
            self.run(buf, move |b: &mut B, iov, _, c| {
                let len = b.bytes_total();
                *iov = libc::iovec { iov_base: b.write_ptr().cast(), iov_len: len };
                (ffi::loaded().rbd_aio_readv)(image, iov, 1, offset, c)
            })
        }
        .await;
        let len = buf.bytes_total();
        let res = match done.ret {
            r if r < 0 => Err(errno(r)),
            r if r as u64 != len as u64 => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("rbd read of {len} bytes at {offset} returned {r}"),
            )),
            _ => {
                // SAFETY: librbd filled all `len` bytes.
                unsafe { buf.set_init(len) };
                Ok(())
            }
        };
        (res, buf)
    }

    /// Writes `buf`'s bytes at `offset`. With the client cache off, the
    /// write is on the OSDs when this returns.
    pub async fn write<B: IoBuf>(&self, offset: u64, buf: B) -> (io::Result<()>, B) {
        let image = self.image;
        // SAFETY: one writev from the memory `buf` owns.
        let (done, buf) = unsafe {
            self.run(buf, move |b: &mut B, iov, _, c| {
                *iov = libc::iovec { iov_base: b.read_ptr().cast_mut().cast(), iov_len: b.bytes_init() };
                (ffi::loaded().rbd_aio_writev)(image, iov, 1, offset, c)
            })
        }
        .await;
        (status(done.ret), buf)
    }

    /// Waits until every completed write is durable.
    pub async fn flush(&self) -> io::Result<()> {
        let image = self.image;
        // SAFETY: a flush touches no memory of ours.
        let (done, ()) = unsafe { self.run((), move |_, _, _, c| (ffi::loaded().rbd_aio_flush)(image, c)) }.await;
        status(done.ret)
    }

    /// Discards `len` bytes at `offset`. librbd may leave parts of the
    /// range smaller than its discard granularity unchanged: use
    /// [`write_zeroes`](Self::write_zeroes) when zeros must be read back.
    pub async fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let image = self.image;
        // SAFETY: a discard touches no memory of ours.
        let (done, ()) =
            unsafe { self.run((), move |_, _, _, c| (ffi::loaded().rbd_aio_discard)(image, offset, len, c)) }.await;
        status(done.ret)
    }

    /// Makes `len` bytes at `offset` read as zeros (releasing whole objects
    /// where it can).
    pub async fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        let Ok(len) = usize::try_from(len) else { return Err(io::ErrorKind::InvalidInput.into()) };
        let image = self.image;
        // SAFETY: a write-zeroes touches no memory of ours.
        let (done, ()) = unsafe {
            self.run((), move |_, _, _, c| (ffi::loaded().rbd_aio_write_zeroes)(image, offset, len, c, 0, 0))
        }
        .await;
        status(done.ret)
    }

    /// Atomically (on the OSD, so across every client of the image)
    /// compares the image at `offset` with `expected` and, if equal, writes
    /// `data` (of the same length) there.
    pub async fn compare_and_write<C: IoBuf, B: IoBuf>(
        &self,
        offset: u64,
        expected: C,
        data: B,
    ) -> (Result<(), CompareError>, (C, B)) {
        if expected.bytes_init() != data.bytes_init() {
            return (Err(CompareError::Io(io::ErrorKind::InvalidInput.into())), (expected, data));
        }
        let image = self.image;
        // SAFETY: librbd reads both buffers, owned by the pair, and writes
        // the mismatch offset into the slot.
        let (done, bufs) = unsafe {
            self.run((expected, data), move |(e, d): &mut (C, B), _, mismatch, c| {
                let rc = (ffi::loaded().rbd_aio_compare_and_write)(
                    image,
                    offset,
                    d.bytes_init(),
                    e.read_ptr().cast(),
                    d.read_ptr().cast(),
                    c,
                    mismatch,
                    0,
                );
                i32::try_from(rc).unwrap_or(-libc::EIO)
            })
        }
        .await;
        let res = match done.ret {
            r if r == -i64::from(libc::EILSEQ) => {
                let reported = done.mismatch.wrapping_sub(offset);
                let reported = if reported < bufs.0.bytes_init() as u64 { reported } else { 0 };
                Err(CompareError::Miscompare {
                    offset: self.first_difference(offset, &bufs.0).await.unwrap_or(reported),
                })
            }
            r => status(r).map_err(CompareError::Io),
        };
        (res, bufs)
    }

    /// The index of the first byte at `offset` that differs from
    /// `expected`, read back after a miscompare: librbd's own answer
    /// depends on its version. Ceph 16 reports the image offset of the
    /// object's start plus the index (its ObjectCompareAndWriteRequest
    /// takes the index for an offset in the object), so a range that does
    /// not start an object would be told a wrong offset, mostly 0. `None`
    /// when the read fails or finds no difference (another client wrote
    /// meanwhile); librbd's answer is used then, if it lies in the range.
    async fn first_difference<C: IoBuf>(&self, offset: u64, expected: &C) -> Option<u64> {
        let len = expected.bytes_init();
        // SAFETY: an IoBuf's first bytes_init bytes are initialized and
        // stay put while it is borrowed.
        let expected = unsafe { std::slice::from_raw_parts(expected.read_ptr(), len) };
        let (res, now) = self.read(offset, Vec::with_capacity(len)).await;
        res.ok()?;
        expected.iter().zip(&now).position(|(a, b)| a != b).map(|i| i as u64)
    }
}

/// A NUL-terminated text `call` writes into a buffer of the length it is
/// given (a negative errno on failure).
fn read_text(call: impl FnOnce(*mut c_char, usize) -> std::ffi::c_int) -> Result<String, std::ffi::c_int> {
    let mut buf = [0 as c_char; 128];
    let rc = call(buf.as_mut_ptr(), buf.len() - 1);
    if rc < 0 {
        return Err(rc);
    }
    // SAFETY: the last byte was never handed out and is still NUL.
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

/// A call into librbd with an image's handles ([`Image::enter`]).
struct Entered<'a>(&'a AtomicUsize);

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn status(ret: i64) -> io::Result<()> {
    if ret < 0 {
        Err(errno(ret))
    } else {
        Ok(())
    }
}

/// Why a compare-and-write did not write.
#[derive(thiserror::Error, Debug)]
pub enum CompareError {
    /// The data differed, first at byte `offset` of the range.
    #[error("miscompare at byte {offset}")]
    Miscompare { offset: u64 },
    /// The I/O failed.
    #[error("{0}")]
    Io(io::Error),
}

impl Drop for Image {
    /// Closes the image, unless [`Image::close`] did. `rbd_close`
    /// unregisters the image's watch on an OSD and waits for the answer:
    /// milliseconds, or as long as an OSD that does not answer takes. A
    /// reactor thread (where the last holder of a removed device may let
    /// go of it) must not wait for that, so there the close runs on a
    /// thread of its own.
    fn drop(&mut self) {
        if *self.closed.get_mut() {
            return;
        }
        let closing = Closing { cluster: self.cluster, ioctx: self.ioctx, image: self.image, spec: self.spec.clone() };
        if reactor::on_reactor_thread() {
            let spawned = std::thread::Builder::new().name("rbd-close".into()).spawn(move || drop(closing));
            if let Err(e) = spawned {
                // The closure, and `closing` with it, was dropped: the
                // image closed on this thread.
                log::warn!("rbd: no thread to close an image on ({e}); closed on a reactor");
            }
        }
    }
}

/// The handles of an image being closed; closing them is its drop.
struct Closing {
    cluster: ffi::Rados,
    ioctx: ffi::Ioctx,
    image: ffi::RbdImage,
    spec: String,
}

// SAFETY: as for `Image`: librados and librbd handles may be closed from
// any thread, and no I/O is submitted on them any more.
unsafe impl Send for Closing {}

impl Drop for Closing {
    fn drop(&mut self) {
        let lib = ffi::loaded();
        // SAFETY: handles from Image::open, each closed once, image first.
        unsafe {
            (lib.rbd_close)(self.image);
            (lib.rados_ioctx_destroy)(self.ioctx);
            (lib.rados_shutdown)(self.cluster);
        }
        log::debug!("rbd: {} closed", self.spec);
    }
}
