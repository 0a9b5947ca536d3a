//! Shared helpers: a reactor (io_uring) runtime, temp dirs, loop devices and
//! data patterns.

#![allow(dead_code)]

use blockdev::BlockDevice;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use blockdev::{Device, IoBuf};

pub fn run<F: Future>(fut: F) -> F::Output {
    reactor::Runtime::new(reactor::Config::default()).expect("build io_uring runtime").block_on(fut)
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "blockdev-test-{}-{}-{tag}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loop device attached to a backing file, detached on drop.
pub struct LoopDev {
    pub dev: PathBuf,
    backing: PathBuf,
    _dir: TempDir,
}

impl LoopDev {
    /// Attaches a `size`-byte file with the given logical sector size, or
    /// returns None (with a message) where losetup is not permitted.
    pub fn attach(size: u64, sector_size: u32) -> Option<LoopDev> {
        let dir = TempDir::new("loop");
        let backing = dir.join("backing.img");
        let f = std::fs::File::create(&backing).expect("create backing file");
        f.set_len(size).expect("size backing file");
        drop(f);
        let out = Command::new("losetup").args(["-f", "--show", "-b", &sector_size.to_string()]).arg(&backing).output();
        match out {
            Ok(out) if out.status.success() => {
                let dev = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                Some(LoopDev { dev: PathBuf::from(dev), backing, _dir: dir })
            }
            Ok(out) => {
                eprintln!(
                    "skipping block-device test: losetup failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("skipping block-device test: cannot run losetup: {e}");
                None
            }
        }
    }

    /// Grows the backing file to `size` bytes and has the loop device take
    /// the new size (`losetup -c`), as `lvextend` grows a logical volume.
    #[allow(dead_code)] // not every test binary that shares this module resizes
    pub fn grow(&self, size: u64) {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&self.backing)
            .and_then(|f| f.set_len(size))
            .expect("grow backing");
        let out = Command::new("losetup").arg("-c").arg(&self.dev).output().expect("run losetup -c");
        assert!(out.status.success(), "losetup -c: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

/// A recognisable pattern: each byte depends on its absolute device offset
/// and a seed, so misplaced or stale data shows up.
pub fn pattern(offset: u64, len: usize, seed: u8) -> IoBuf {
    let mut buf = IoBuf::with_len(len);
    for (i, b) in buf.iter_mut().enumerate() {
        let pos = offset.wrapping_add(i as u64);
        *b = (pos.wrapping_mul(31) ^ (pos >> 9) ^ u64::from(seed)) as u8;
    }
    buf
}

pub async fn write(dev: &Device, lba: u64, buf: IoBuf, fua: bool) {
    let (res, _) = dev.write(lba, buf, fua).await;
    res.unwrap_or_else(|e| panic!("write lba {lba} on {}: {e}", dev.name()));
}

pub async fn read(dev: &Device, lba: u64, len: usize) -> IoBuf {
    let (res, buf) = dev.read(lba, IoBuf::with_len(len)).await;
    res.unwrap_or_else(|e| panic!("read lba {lba} on {}: {e}", dev.name()));
    buf
}

pub fn is_zero(buf: &[u8]) -> bool {
    buf.iter().all(|&b| b == 0)
}
