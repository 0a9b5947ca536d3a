//! The librados/librbd functions this crate calls, resolved at run time
//! with `dlopen`/`dlsym` so that a build needs no Ceph development
//! packages and a machine without librbd1 fails only when an rbd device is
//! opened, with a message saying what to install.
//!
//! The signatures follow `rados/librados.h` and `rbd/librbd.h` (Ceph 16).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

pub type Rados = *mut c_void;
pub type Ioctx = *mut c_void;
pub type RbdImage = *mut c_void;
pub type Completion = *mut c_void;
pub type Callback = unsafe extern "C" fn(Completion, *mut c_void);

/// `rbd_config_option_t`: one option of an open image's configuration.
#[repr(C)]
pub struct ConfigOption {
    pub name: *mut c_char,
    pub value: *mut c_char,
    /// `RBD_CONFIG_SOURCE_CONFIG` (0), `_POOL` (1) or `_IMAGE` (2).
    pub source: c_int,
}

/// The resolved entry points. Both libraries stay loaded for the life of
/// the process.
pub struct Lib {
    pub rados_create2: unsafe extern "C" fn(*mut Rados, *const c_char, *const c_char, u64) -> c_int,
    pub rados_conf_read_file: unsafe extern "C" fn(Rados, *const c_char) -> c_int,
    pub rados_conf_set: unsafe extern "C" fn(Rados, *const c_char, *const c_char) -> c_int,
    pub rados_conf_get: unsafe extern "C" fn(Rados, *const c_char, *mut c_char, usize) -> c_int,
    pub rados_connect: unsafe extern "C" fn(Rados) -> c_int,
    pub rados_shutdown: unsafe extern "C" fn(Rados),
    pub rados_ioctx_create: unsafe extern "C" fn(Rados, *const c_char, *mut Ioctx) -> c_int,
    pub rados_ioctx_destroy: unsafe extern "C" fn(Ioctx),
    pub rados_cluster_fsid: unsafe extern "C" fn(Rados, *mut c_char, usize) -> c_int,
    pub rbd_open: unsafe extern "C" fn(Ioctx, *const c_char, *mut RbdImage, *const c_char) -> c_int,
    pub rbd_open_read_only: unsafe extern "C" fn(Ioctx, *const c_char, *mut RbdImage, *const c_char) -> c_int,
    pub rbd_close: unsafe extern "C" fn(RbdImage) -> c_int,
    pub rbd_get_size: unsafe extern "C" fn(RbdImage, *mut u64) -> c_int,
    pub rbd_get_id: unsafe extern "C" fn(RbdImage, *mut c_char, usize) -> c_int,
    pub rbd_config_image_list: unsafe extern "C" fn(RbdImage, *mut ConfigOption, *mut c_int) -> c_int,
    pub rbd_config_image_list_cleanup: unsafe extern "C" fn(*mut ConfigOption, c_int),
    pub rbd_aio_create_completion: unsafe extern "C" fn(*mut c_void, Callback, *mut Completion) -> c_int,
    pub rbd_aio_get_return_value: unsafe extern "C" fn(Completion) -> isize,
    pub rbd_aio_release: unsafe extern "C" fn(Completion),
    pub rbd_aio_readv: unsafe extern "C" fn(RbdImage, *const libc::iovec, c_int, u64, Completion) -> c_int,
    pub rbd_aio_writev: unsafe extern "C" fn(RbdImage, *const libc::iovec, c_int, u64, Completion) -> c_int,
    pub rbd_aio_flush: unsafe extern "C" fn(RbdImage, Completion) -> c_int,
    pub rbd_aio_discard: unsafe extern "C" fn(RbdImage, u64, u64, Completion) -> c_int,
    pub rbd_aio_write_zeroes: unsafe extern "C" fn(RbdImage, u64, usize, Completion, c_int, c_int) -> c_int,
    #[allow(clippy::type_complexity)]
    pub rbd_aio_compare_and_write:
        unsafe extern "C" fn(RbdImage, u64, usize, *const c_char, *const c_char, Completion, *mut u64, c_int) -> isize,
}

static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();

/// The loaded libraries, or why they could not be loaded.
pub fn lib() -> Result<&'static Lib, String> {
    LIB.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// The loaded libraries, once [`lib`] succeeded (a completion exists only
/// then).
pub fn loaded() -> &'static Lib {
    match LIB.get() {
        Some(Ok(lib)) => lib,
        _ => unreachable!("a librbd completion fired before librbd was loaded"),
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string owned by the
    // C library, valid until the next dl* call on this thread.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".to_owned()
    } else {
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

fn open(name: &CStr, package: &str) -> Result<*mut c_void, String> {
    // SAFETY: name is NUL-terminated; loading librados/librbd runs their
    // initializers, which have no preconditions.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        return Err(format!(
            "{} not found ({}): install {package} (apt install {package}) to use rbd devices",
            name.to_string_lossy(),
            dlerror()
        ));
    }
    Ok(h)
}

/// # Safety
///
/// `T` must be the `unsafe extern "C" fn` type of the symbol `name`.
unsafe fn sym<T: Copy>(handle: *mut c_void, lib: &str, name: &CStr) -> Result<T, String> {
    // SAFETY: handle came from dlopen; name is NUL-terminated.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    if p.is_null() {
        return Err(format!("{lib} has no symbol {} ({})", name.to_string_lossy(), dlerror()));
    }
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: a function pointer has the size of a data pointer on the
    // platforms dlsym exists on; the caller names the right type.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

fn load() -> Result<Lib, String> {
    let rados = open(c"librados.so.2", "librados2")?;
    let rbd = open(c"librbd.so.1", "librbd1")?;
    let (ra, rb) = ("librados.so.2", "librbd.so.1");
    // SAFETY: each type below is the function's prototype in librados.h or
    // librbd.h (Ceph 16).
    unsafe {
        Ok(Lib {
            rados_create2: sym(rados, ra, c"rados_create2")?,
            rados_conf_read_file: sym(rados, ra, c"rados_conf_read_file")?,
            rados_conf_set: sym(rados, ra, c"rados_conf_set")?,
            rados_conf_get: sym(rados, ra, c"rados_conf_get")?,
            rados_connect: sym(rados, ra, c"rados_connect")?,
            rados_shutdown: sym(rados, ra, c"rados_shutdown")?,
            rados_ioctx_create: sym(rados, ra, c"rados_ioctx_create")?,
            rados_ioctx_destroy: sym(rados, ra, c"rados_ioctx_destroy")?,
            rados_cluster_fsid: sym(rados, ra, c"rados_cluster_fsid")?,
            rbd_open: sym(rbd, rb, c"rbd_open")?,
            rbd_open_read_only: sym(rbd, rb, c"rbd_open_read_only")?,
            rbd_close: sym(rbd, rb, c"rbd_close")?,
            rbd_get_size: sym(rbd, rb, c"rbd_get_size")?,
            rbd_get_id: sym(rbd, rb, c"rbd_get_id")?,
            rbd_config_image_list: sym(rbd, rb, c"rbd_config_image_list")?,
            rbd_config_image_list_cleanup: sym(rbd, rb, c"rbd_config_image_list_cleanup")?,
            rbd_aio_create_completion: sym(rbd, rb, c"rbd_aio_create_completion")?,
            rbd_aio_get_return_value: sym(rbd, rb, c"rbd_aio_get_return_value")?,
            rbd_aio_release: sym(rbd, rb, c"rbd_aio_release")?,
            rbd_aio_readv: sym(rbd, rb, c"rbd_aio_readv")?,
            rbd_aio_writev: sym(rbd, rb, c"rbd_aio_writev")?,
            rbd_aio_flush: sym(rbd, rb, c"rbd_aio_flush")?,
            rbd_aio_discard: sym(rbd, rb, c"rbd_aio_discard")?,
            rbd_aio_write_zeroes: sym(rbd, rb, c"rbd_aio_write_zeroes")?,
            rbd_aio_compare_and_write: sym(rbd, rb, c"rbd_aio_compare_and_write")?,
        })
    }
}
