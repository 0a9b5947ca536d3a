//! Data safety under real faults: I/O errors (a full file system) and
//! size changes under the device (a loop device or file cut short) are
//! never acknowledged as success, and reads never return bytes the device
//! does not hold.

mod common;

use std::process::Command;

use blockdev::{BlockDevice, Device, Error, IoBuf};
use common::{pattern, read, run, write, LoopDev, TempDir};

const MIB: u64 = 1 << 20;

/// A file system mounted on a fresh directory, unmounted on drop.
struct Mounted(TempDir);

impl Mounted {
    /// `mount ARGS SOURCE DIR` on a fresh directory named after `tag`;
    /// `None` (with a message naming `what`) when that fails.
    fn mount(tag: &str, what: &str, args: &[&str], source: &std::ffi::OsStr) -> Option<Mounted> {
        let dir = TempDir::new(tag);
        match Command::new("mount").args(args).arg(source).arg(dir.path()).status() {
            Ok(s) if s.success() => Some(Mounted(dir)),
            _ => {
                eprintln!("skipping: cannot mount {what}");
                None
            }
        }
    }

    /// A tmpfs of `bytes`.
    fn tmpfs(tag: &str, bytes: u64) -> Option<Mounted> {
        Mounted::mount(tag, "a small tmpfs", &["-t", "tmpfs", "-o", &format!("size={bytes}")], "tmpfs".as_ref())
    }

    /// A squashfs image of `src`, mounted read-only (the loop device holds
    /// the image once mounted); `None` without mksquashfs too.
    fn squashfs(src: &std::path::Path) -> Option<Mounted> {
        let img = TempDir::new("sqimg");
        let image = img.join("ro.sqfs");
        let made = Command::new("mksquashfs").arg(src).arg(&image).args(["-noappend", "-quiet"]).output();
        if !made.as_ref().is_ok_and(|o| o.status.success()) {
            eprintln!("skipping: cannot make a squashfs image (mksquashfs): {made:?}");
            return None;
        }
        Mounted::mount("sqmnt", "a squashfs image", &["-t", "squashfs", "-o", "loop,ro"], image.as_os_str())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

/// A file device larger than the tmpfs under it: a write that runs out of
/// space (a short write, then ENOSPC) fails; so does zeroing that has to
/// write zeros (tmpfs has no ZERO_RANGE); punching a hole frees space and
/// reads zeros.
#[test]
fn file_device_out_of_space_write_and_zeroing_fail_and_are_never_acknowledged() {
    let Some(fs) = Mounted::tmpfs("enospc", 256 << 10) else { return };
    let path = fs.0.join("dev.img");
    let dev = Device::file("enospc", &path, Some(4 * MIB), 512).expect("file device");
    run(async {
        // 1 MiB into 256 KiB of space: part of it fits (a short write).
        let (res, _) = dev.write(0, pattern(0, MIB as usize, 1), false).await;
        let err = res.expect_err("a write that ran out of space must fail");
        assert!(matches!(err, Error::Io(ref e) if e.kind() == std::io::ErrorKind::StorageFull), "{err}");
        let (res, _) = dev.write(4096, pattern(4096 * 512, 4096, 2), true).await;
        assert!(res.is_err(), "a FUA write into a full file system must fail");
        let zeroed = dev.write_zeroes(3 * MIB / 512, MIB / 512 / 2, false).await;
        assert!(zeroed.is_err(), "zeroing that must write zeros into a full file system must fail");
        // Deallocate punches holes: it frees space and reads zeros.
        dev.deallocate(0, MIB / 512).await.expect("punch");
        assert!(common::is_zero(&read(&dev, 0, MIB as usize).await));
        dev.flush().await.expect("flush");
    });
}

/// The kernel shrinks a block device before the size watch re-reads it:
/// I/O past the new end, still in range for the device's stale capacity,
/// fails (never "succeeds" past the end or reads zeros), and once the
/// size is re-read the range check refuses it.
#[test]
fn block_device_io_past_a_shrunk_end_fails_before_and_after_the_size_is_reread() {
    let Some(lo) = LoopDev::attach(8 * MIB, 512) else { return };
    let dev = Device::block("shrink", &lo.dev, None).expect("block device");
    let last = 8 * MIB / 512 - 8;
    run(async { write(&dev, last, pattern(last * 512, 4096, 3), false).await });
    lo.grow(4 * MIB); // set_len + losetup -c: shrinks too
    run(async {
        let (res, _) = dev.write(last, pattern(last * 512, 4096, 4), false).await;
        assert!(res.is_err(), "a write past the shrunk end must fail: {res:?}");
        let (res, _) = dev.write(last, pattern(last * 512, 4096, 4), true).await;
        assert!(res.is_err(), "a FUA write past the shrunk end must fail: {res:?}");
        let (res, _) = dev.read(last, IoBuf::with_len(4096)).await;
        assert!(res.is_err(), "a read past the shrunk end must fail: {res:?}");
    });
    assert!(dev.refresh_size().expect("refresh"), "the device shrank");
    assert_eq!(dev.geometry().blocks, 4 * MIB / 512);
    run(async {
        let (res, _) = dev.write(last, pattern(0, 4096, 4), false).await;
        assert!(matches!(res, Err(Error::OutOfRange { .. })), "{res:?}");
        assert!(matches!(dev.write_zeroes(last, 8, true).await, Err(Error::OutOfRange { .. })));
        assert!(matches!(dev.deallocate(last, 8).await, Err(Error::OutOfRange { .. })));
    });
}

/// A file device with a configured size whose file is cut short under
/// it: reads past the file's end fail (not zeros, not stale bytes).
#[test]
fn file_device_read_past_a_truncated_file_fails() {
    let dir = TempDir::new("cut");
    let path = dir.join("dev.img");
    let dev = Device::file("cut", &path, Some(4 * MIB), 512).expect("file device");
    run(async { write(&dev, 4096, pattern(4096 * 512, 64 << 10, 5), true).await });
    std::fs::OpenOptions::new().write(true).open(&path).and_then(|f| f.set_len(2 * MIB + 512)).expect("cut");
    run(async {
        for (lba, len) in [(4096u64, 4096usize), (4095, 4096), (4096 + 8, 512), (4096, 64 << 10)] {
            let (res, _) = dev.read(lba, IoBuf::with_len(len)).await;
            assert!(res.is_err(), "read of {len} at lba {lba} past the end: {res:?}");
        }
        // Half inside the file (its last 512 bytes), half past its end.
        let (res, _) = dev.read(4096, IoBuf::with_len(1024)).await;
        assert!(res.is_err());
        // Wholly inside the file: still served.
        let got = read(&dev, 4095, 1024).await;
        assert!(got[512..] == pattern(4096 * 512, 512, 5)[..]);
    });
}

/// 512-byte blocks on a file system that wants 4 KiB for O_DIRECT: the
/// unaligned write goes through the page cache and an aligned read of the
/// same page (O_DIRECT) must see it, and after a deallocate of one block
/// inside a page the rest of the page keeps its data.
#[test]
fn file_device_buffered_and_direct_paths_stay_coherent() {
    let dir = TempDir::new("coherent");
    let dev = Device::file("coh", &dir.join("dev.img"), Some(4 * MIB), 512).expect("file device");
    run(async {
        write(&dev, 0, pattern(0, 8192, 6), false).await; // direct (when available)
        write(&dev, 3, pattern(3 * 512, 512, 7), false).await; // buffered
        let got = read(&dev, 0, 8192).await; // direct
        let mut want = pattern(0, 8192, 6).to_vec();
        want[1536..2048].copy_from_slice(&pattern(3 * 512, 512, 7));
        assert!(got[..] == want[..], "the direct read missed the buffered write");
        dev.deallocate(5, 1).await.expect("deallocate one block");
        let got = read(&dev, 0, 8192).await;
        want[2560..3072].fill(0);
        assert!(got[..] == want[..], "deallocate of one block changed others or left data");
        write(&dev, 0, pattern(0, 4096, 8), true).await; // direct over the cached page
        let got = read(&dev, 1, 512).await; // buffered
        assert!(got[..] == pattern(512, 512, 8)[..], "a buffered read returned a stale cached page");
    });
}

/// A read-only file device on a read-only file system whose files have no
/// `fsync` (squashfs, erofs, iso9660: `fdatasync` is EINVAL there): it was
/// written by nobody, so a flush (an NVMe Flush, SYNCHRONIZE CACHE, the
/// stop's flush) has nothing to do and succeeds, and does not latch a
/// failure that fails every later flush.
#[test]
fn a_read_only_file_device_on_a_file_system_without_fsync_flushes() {
    let src = TempDir::new("sqsrc");
    let data: Vec<u8> = (0..MIB as usize).map(|i| (i % 249) as u8).collect();
    std::fs::write(src.join("golden.img"), &data).expect("write the file");
    let Some(fs) = Mounted::squashfs(src.path()) else { return };
    let path = fs.0.join("golden.img");
    let dev = Device::file_with("ro", &path, None, 512, blockdev::Symlinks::Follow, true).expect("read-only file");
    run(async {
        assert!(read(&dev, 0, 4096).await[..] == data[..4096], "reads the file");
        dev.flush().await.expect("a flush of a read-only device");
        dev.flush().await.expect("and the next one");
    });
}
