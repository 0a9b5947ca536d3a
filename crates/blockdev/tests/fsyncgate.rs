//! A real failing fdatasync, and the latch that keeps reporting it.
//!
//! The failing disk is a loop device whose backing file is sparse and lives
//! on a tmpfs smaller than the loop device: pages written into the loop
//! device's page cache are accepted, and their writeback fails (the loop
//! driver's write into the full tmpfs gets ENOSPC, the block layer reports
//! EIO). Setting that up needs root (mount, losetup); without it the test
//! says so and passes, as the other root-only tests of this workspace do.

use blockdev::{Device, Error};
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn run<F: std::future::Future>(f: F) -> F::Output {
    reactor::Runtime::new(reactor::Config::default()).expect("io_uring runtime").block_on(f)
}

fn sh(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd).args(args).output().map_err(|e| format!("{cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A loop device over a sparse file on a tmpfs of `tmpfs_bytes`; detached
/// and unmounted on drop.
struct FullDisk {
    dir: PathBuf,
    dev: PathBuf,
}

impl FullDisk {
    fn new(tag: &str, tmpfs_bytes: u64, disk_bytes: u64) -> Result<FullDisk, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        let base = std::env::var_os("CARGO_TARGET_TMPDIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!("fsyncgate-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let dirs = dir.to_str().ok_or("path")?;
        sh("mount", &["-t", "tmpfs", "-o", &format!("size={tmpfs_bytes}"), "tmpfs", dirs])?;
        let mut disk = FullDisk { dir, dev: PathBuf::new() };
        let img = disk.dir.join("backing.img");
        std::fs::File::create(&img).and_then(|f| f.set_len(disk_bytes)).map_err(|e| e.to_string())?;
        disk.dev = PathBuf::from(sh("losetup", &["-f", "--show", img.to_str().ok_or("path")?])?);
        Ok(disk)
    }

    /// Makes room on the tmpfs: writeback into it works again.
    fn grow(&self, bytes: u64) {
        let dir = self.dir.to_str().expect("path");
        sh("mount", &["-o", &format!("remount,size={bytes}"), dir]).expect("remount tmpfs larger");
    }
}

impl Drop for FullDisk {
    fn drop(&mut self) {
        if !self.dev.as_os_str().is_empty() {
            let _ = sh("losetup", &["-d", self.dev.to_str().unwrap_or_default()]);
        }
        // Lazy: the loop driver may let go of its backing file a moment
        // after `losetup -d` returns.
        let _ = sh("umount", &["-l", self.dir.to_str().unwrap_or_default()]);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn fdatasync(f: &std::fs::File) -> std::io::Result<()> {
    f.sync_data()
}

#[test]
fn a_failed_flush_keeps_failing_until_the_device_is_reopened() {
    let disk = match FullDisk::new("latch", 1 << 20, 16 << 20) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("skipping: cannot build a failing disk ({e})");
            return;
        }
    };
    let dev = Device::block("b", &disk.dev, None).expect("block device on the loop device");
    // A descriptor opened before the failure, to show what the kernel
    // itself reports to a second fdatasync.
    let witness = OpenOptions::new().read(true).write(true).open(&disk.dev).expect("witness fd");
    // The device's own aligned writes go O_DIRECT and would fail at once;
    // dirty the shared page cache of the same block device instead, as the
    // buffered path does: 4 MiB that cannot fit in the 1 MiB tmpfs.
    let writer = OpenOptions::new().write(true).open(&disk.dev).expect("writer fd");
    writer.write_all_at(&vec![0xab; 4 << 20], 0).expect("buffered write is accepted");
    run(async {
        let first = dev.flush().await.expect_err("writeback into the full tmpfs fails");
        assert!(matches!(first, Error::Io(_)), "{first}");
    });
    // The kernel reports the error once per open file, then forgets it.
    disk.grow(64 << 20);
    assert!(fdatasync(&witness).is_err(), "the witness sees the error once");
    fdatasync(&witness).expect("and a second fdatasync succeeds: the kernel forgot");
    run(async {
        for _ in 0..2 {
            let again = dev.flush().await.expect_err("the device remembers");
            assert!(matches!(again, Error::EarlierFlushFailed(ref m) if !m.is_empty()), "{again}");
        }
    });
    drop(dev);
    // The O_EXCL claim can be held a moment after our descriptors close by
    // someone else's open (udev probing the loop device after its resize)
    // or the kernel's asynchronous teardown of the ring: EBUSY is retried
    // for a while.
    let mut reopened = Device::block("b", &disk.dev, None);
    for _ in 0..100 {
        match &reopened {
            Err(Error::Open { reason, .. }) if reason.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(std::time::Duration::from_millis(20));
                reopened = Device::block("b", &disk.dev, None);
            }
            _ => break,
        }
    }
    let reopened = reopened.expect("reopen");
    run(async { reopened.flush().await.expect("a reopened device starts clean") });
}

#[test]
fn flushes_of_a_healthy_loop_device_succeed() {
    let disk = match FullDisk::new("healthy", 64 << 20, 16 << 20) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("skipping: cannot build a loop device ({e})");
            return;
        }
    };
    let dev = Device::block("b", Path::new(&disk.dev), None).expect("block device");
    let writer = OpenOptions::new().write(true).open(&disk.dev).expect("writer fd");
    writer.write_all_at(&vec![0xab; 4 << 20], 0).expect("buffered write");
    run(async {
        dev.flush().await.expect("flush");
        dev.flush().await.expect("flush again");
    });
}
