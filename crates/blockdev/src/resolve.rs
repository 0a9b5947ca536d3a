//! Resolving a file or block device path once. A device opens its path
//! several times (create and size, then buffered, flush-only and `O_DIRECT`
//! descriptors); each open after the first goes through `/proc/self/fd/N`
//! of the first one, which names that inode and is not looked up again, so
//! renaming a directory on the path in between changes nothing. This module
//! must never look the path string up a second time.
//!
//! A path checked against an allow list (ctl's `[control] allow_paths`) is
//! resolved with [`Symlinks::Refuse`]: `openat2(2)` with
//! `RESOLVE_NO_SYMLINKS` (Linux 5.6), and a file to create is created by
//! `openat(O_CREAT | O_NOFOLLOW)` in its directory opened that way, so no
//! symlink swapped in after the check can lead the open elsewhere.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Whether resolving a device path may follow symlinks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Symlinks {
    /// Follow them: paths from the configuration file, which may name
    /// `/dev/disk/by-id/...` links.
    #[default]
    Follow,
    /// Refuse a symlink anywhere on the path, a directory or the last
    /// component: paths that were checked as they resolved then, so that a
    /// symlink swapped in since cannot make the open reach something else.
    Refuse,
}

/// The object a device path named when it was resolved.
pub(crate) struct Resolved(File, Access);

/// How [`Resolved::reopen`] opens the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    ReadWrite,
    ReadOnly,
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the path contains a NUL byte"))
}

/// ELOOP and ENOSYS said in words: what was refused and why.
fn explain(e: io::Error, symlinks: Symlinks) -> io::Error {
    match (symlinks, e.raw_os_error()) {
        (Symlinks::Refuse, Some(libc::ELOOP)) => io::Error::new(
            io::ErrorKind::InvalidInput,
            "a symlink on the path (refused: a checked path is opened only without symlinks)",
        ),
        (Symlinks::Refuse, Some(libc::ENOSYS)) => {
            io::Error::new(io::ErrorKind::Unsupported, "openat2 is unavailable (Linux 5.6 or later is needed)")
        }
        _ => e,
    }
}

/// `openat(dirfd, path, flags, mode)`, through `openat2` with
/// `RESOLVE_NO_SYMLINKS` when symlinks are refused.
fn open_at(dirfd: RawFd, path: &Path, flags: libc::c_int, mode: libc::mode_t, symlinks: Symlinks) -> io::Result<File> {
    let c = c_path(path)?;
    let flags = flags | libc::O_CLOEXEC;
    let fd = match symlinks {
        // SAFETY: `c` is a live NUL-terminated string; the returned
        // descriptor is checked below.
        Symlinks::Follow => unsafe { libc::openat(dirfd, c.as_ptr(), flags, libc::c_uint::from(mode)) },
        Symlinks::Refuse => {
            // SAFETY: open_how is plain integers; all-zero is valid.
            let mut how: libc::open_how = unsafe { std::mem::zeroed() };
            // Open flags are non-negative bit sets.
            how.flags = u64::try_from(flags).unwrap_or_default();
            how.mode = u64::from(mode);
            how.resolve = libc::RESOLVE_NO_SYMLINKS;
            // SAFETY: `c` is NUL-terminated and `how` a live open_how whose
            // size is passed with it; the returned descriptor is checked.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_openat2,
                    dirfd,
                    c.as_ptr(),
                    &how as *const libc::open_how,
                    std::mem::size_of::<libc::open_how>(),
                )
            };
            libc::c_int::try_from(rc).unwrap_or(-1)
        }
    };
    if fd < 0 {
        return Err(explain(io::Error::last_os_error(), symlinks));
    }
    // SAFETY: `fd` is a descriptor the kernel just returned to us alone.
    Ok(unsafe { File::from_raw_fd(fd) })
}

impl Resolved {
    /// Resolves `path`, which must exist, to an `O_PATH` descriptor
    /// (opening nothing: a FIFO does not block, a device is not claimed).
    pub(crate) fn existing(path: &Path, symlinks: Symlinks) -> io::Result<Resolved> {
        open_at(libc::AT_FDCWD, path, libc::O_PATH, 0, symlinks).map(|f| Resolved(f, Access::ReadWrite))
    }

    /// This object, reopened read-only from now on.
    pub(crate) fn read_only(self) -> Resolved {
        Resolved(self.0, Access::ReadOnly)
    }

    /// Opens `path` read-write, creating a regular file if it is missing.
    /// Its directory is resolved as `existing` resolves; with
    /// [`Symlinks::Refuse`] a symlink as the last component is refused too.
    /// A file created here has its directory synced before this returns, so
    /// the name of a file whose data a host later flushes survives a power
    /// loss (fsync(2): syncing the file does not sync its directory entry).
    pub(crate) fn create(path: &Path, symlinks: Symlinks) -> io::Result<Resolved> {
        let Some(name) = path.file_name() else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "the path does not end in a file name"));
        };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let dir = open_at(libc::AT_FDCWD, dir, libc::O_RDONLY | libc::O_DIRECTORY, 0, symlinks)?;
        let nofollow = if symlinks == Symlinks::Refuse { libc::O_NOFOLLOW } else { 0 };
        // The name is one component: nothing is left for openat2 to check.
        let flags = libc::O_RDWR | libc::O_CREAT | nofollow;
        let open = |flags| {
            open_at(dir.as_raw_fd(), Path::new(name), flags, 0o666, Symlinks::Follow).map_err(|e| explain(e, symlinks))
        };
        let file = match open(flags | libc::O_EXCL) {
            Ok(created) => {
                #[cfg(test)]
                hook::dir_synced();
                dir.sync_all()?;
                created
            }
            // There already (or a symlink, which O_EXCL does not follow):
            // open it as before.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => open(flags)?,
            Err(e) => return Err(e),
        };
        Ok(Resolved(file, Access::ReadWrite))
    }

    /// The resolved object's descriptor (`O_PATH` from [`Resolved::existing`]).
    pub(crate) fn file(&self) -> &File {
        &self.0
    }

    /// Opens the resolved object again, read-write (read-only after
    /// [`Resolved::read_only`]) with `flags`, through `/proc/self/fd/N`:
    /// the same inode whatever the path names now.
    pub(crate) fn reopen(&self, flags: libc::c_int) -> io::Result<File> {
        #[cfg(test)]
        hook::run_before_reopen();
        let proc = format!("/proc/self/fd/{}", self.0.as_raw_fd());
        let write = self.1 == Access::ReadWrite;
        OpenOptions::new().read(true).write(write).custom_flags(flags | libc::O_CLOEXEC).open(&proc).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                io::Error::new(e.kind(), format!("{proc}: {e} (is /proc mounted?)"))
            } else {
                e
            }
        })
    }
}

/// A test's hook between a path's resolution and its reopens, where a
/// test swaps the path for another.
#[cfg(test)]
mod hook {
    use std::cell::RefCell;

    thread_local! {
        static BEFORE_REOPEN: RefCell<Option<Box<dyn FnOnce()>>> = RefCell::new(None);
    }

    /// Runs `f` once, on this thread, before the next reopen.
    pub(super) fn before_reopen(f: impl FnOnce() + 'static) {
        BEFORE_REOPEN.with(|h| *h.borrow_mut() = Some(Box::new(f)));
    }

    pub(super) fn run_before_reopen() {
        if let Some(f) = BEFORE_REOPEN.with(|h| h.borrow_mut().take()) {
            f();
        }
    }

    thread_local! {
        static DIR_SYNCS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }

    /// Counts a directory sync after a create, on this thread.
    pub(super) fn dir_synced() {
        DIR_SYNCS.with(|c| c.set(c.get() + 1));
    }

    /// Directory syncs after creates on this thread so far.
    pub(super) fn dir_syncs() -> u32 {
        DIR_SYNCS.with(std::cell::Cell::get)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, Error};
    use std::os::unix::fs::{symlink, MetadataExt};
    use std::path::PathBuf;

    const MIB: u64 = 1 << 20;

    /// A fresh directory with no symlink on its path, removed on drop.
    struct Dir(PathBuf);

    impl Dir {
        fn new(tag: &str) -> Dir {
            let tmp = std::fs::canonicalize(std::env::temp_dir()).expect("temp dir");
            let d = tmp.join(format!("blockdev-resolve-{}-{tag}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).expect("create dir");
            Dir(d)
        }

        fn file(&self, rel: &str, len: u64) -> PathBuf {
            let p = self.0.join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("dirs");
            std::fs::File::create(&p).and_then(|f| f.set_len(len)).expect("file");
            p
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn refused_for_a_symlink(res: Result<Device, Error>, what: &str) {
        match res {
            Err(Error::Open { reason, .. }) => assert!(reason.to_string().contains("symlink"), "{what}: {reason}"),
            other => panic!("{what}: expected a refusal naming the symlink, got {other:?}"),
        }
    }

    #[test]
    fn refusing_symlinks_refuses_a_symlinked_directory_or_last_component_and_opens_the_plain_path() {
        let dir = Dir::new("refuse");
        let d = &dir.0;
        dir.file("outside/existing.img", MIB);
        dir.file("allowed/plain.img", MIB);
        symlink(d.join("outside"), d.join("allowed/sub")).expect("symlink");
        symlink(d.join("outside/existing.img"), d.join("allowed/link.img")).expect("symlink");
        symlink(d.join("outside/dangling.img"), d.join("allowed/dangling.img")).expect("symlink");
        let refuse = Symlinks::Refuse;
        let file = |p: &str, size: Option<u64>| Device::file_with("f", &d.join(p), size, 512, refuse, false);

        refused_for_a_symlink(file("allowed/sub/existing.img", None), "existing file, symlinked directory");
        refused_for_a_symlink(file("allowed/sub/new.img", Some(MIB)), "new file, symlinked directory");
        refused_for_a_symlink(file("allowed/link.img", None), "existing file, symlinked last component");
        refused_for_a_symlink(file("allowed/link.img", Some(MIB)), "sized file, symlinked last component");
        refused_for_a_symlink(file("allowed/dangling.img", Some(MIB)), "new file, dangling symlink");
        refused_for_a_symlink(
            Device::block_with("b", &d.join("allowed/link.img"), None, refuse, false),
            "block device, symlinked last component",
        );
        assert!(!d.join("outside/new.img").exists(), "created through a symlinked directory");
        assert!(!d.join("outside/dangling.img").exists(), "created through a dangling symlink");
        assert_eq!(std::fs::metadata(d.join("outside/existing.img")).expect("meta").len(), MIB);

        let plain = file("allowed/plain.img", None).expect("existing plain path");
        assert_eq!(plain.path(), Some(d.join("allowed/plain.img").as_path()));
        file("allowed/new.img", Some(MIB)).expect("new plain path");
        assert_eq!(std::fs::metadata(d.join("allowed/new.img")).expect("created").len(), MIB);
        // The configuration file's devices still follow symlinks.
        Device::file_with("f", &d.join("allowed/sub/existing.img"), None, 512, Symlinks::Follow, false)
            .expect("followed symlink");
        assert!(matches!(
            Device::block_with("b", &d.join("allowed/link.img"), None, Symlinks::Follow, false),
            Err(Error::NotBlockDevice(_))
        ));
    }

    #[test]
    fn creating_a_file_syncs_its_directory_and_opening_an_existing_one_does_not() {
        let dir = Dir::new("dirsync");
        for symlinks in [Symlinks::Follow, Symlinks::Refuse] {
            let path = dir.0.join(format!("new-{symlinks:?}.img"));
            let before = hook::dir_syncs();
            Device::file_with("f", &path, Some(MIB), 512, symlinks, false).expect("created");
            assert_eq!(hook::dir_syncs(), before + 1, "{symlinks:?}: a new file's directory entry synced");
            Device::file_with("f", &path, Some(2 * MIB), 512, symlinks, false).expect("reopened and grown");
            assert_eq!(hook::dir_syncs(), before + 1, "{symlinks:?}: an existing file creates no entry");
            assert_eq!(std::fs::metadata(&path).expect("file").len(), 2 * MIB);
        }
    }

    #[test]
    fn every_descriptor_is_the_inode_resolved_first_even_when_the_path_is_swapped_before_the_reopens() {
        for (i, symlinks) in [Symlinks::Follow, Symlinks::Refuse].into_iter().enumerate() {
            for size in [None, Some(MIB)] {
                let dir = Dir::new(&format!("swap{i}-{}", size.is_some()));
                let d = dir.0.clone();
                if size.is_none() {
                    dir.file("dev/disk.img", MIB);
                } else {
                    std::fs::create_dir(d.join("dev")).expect("dir");
                }
                let other = dir.file("other/disk.img", MIB);
                let other_ino = std::fs::metadata(&other).expect("other").ino();
                let swap = d.clone();
                hook::before_reopen(move || {
                    std::fs::rename(swap.join("dev"), swap.join("dev.orig")).expect("rename");
                    symlink(swap.join("other"), swap.join("dev")).expect("symlink");
                });
                let path = d.join("dev/disk.img");
                let dev = Device::file_with("f", &path, size, 512, symlinks, false).expect("device");
                let first_ino = std::fs::metadata(d.join("dev.orig/disk.img")).expect("original").ino();
                assert!(std::fs::symlink_metadata(d.join("dev")).expect("swapped").is_symlink(), "not swapped");
                let crate::Backend::File(backend) = &dev.backend else { panic!("not a file backend") };
                let inodes = backend.inodes();
                assert!(inodes.len() >= 2, "{inodes:?}");
                assert!(
                    inodes.iter().all(|&ino| ino == first_ino),
                    "{symlinks:?} {size:?}: {inodes:?} vs {first_ino} (other {other_ino})"
                );
                assert_eq!(dev.path(), Some(path.as_path()), "the recorded path is the one given");
            }
        }
    }
}
