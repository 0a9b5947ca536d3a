//! Behaviour of every backend through the one `Device` contract, on a real
//! io_uring runtime.

mod common;

use checksum::{Appender, Crc32c};
use std::sync::Arc;

use blockdev::{BlockDevice, Device, Error, IoBuf, Kind};
use common::{is_zero, pattern, read, run, write, LoopDev, TempDir};

const MIB: u64 = 1 << 20;
const DEV_SIZE: u64 = 8 * MIB;

// ---------------------------------------------------------------------------
// Scenarios shared by every backend that stores data.

/// Writes patterns of several sizes (one block, odd block counts that are not
/// 4096-aligned, 64 KiB, 1 MiB) at the start, an odd LBA and the very end,
/// and reads each back.
async fn write_then_read_back(dev: &Device) {
    let bs = dev.geometry().block_size as usize;
    let blocks = dev.geometry().blocks;
    let sizes = [bs, 3 * bs, 8 * bs, 64 << 10, 1 << 20];
    for (seed, &len) in sizes.iter().enumerate() {
        let n = (len / bs) as u64;
        for lba in [0, 1, 7, blocks / 2 + 3, blocks - n] {
            let offset = lba * bs as u64;
            let data = pattern(offset, len, seed as u8);
            let expect = data.to_vec();
            write(dev, lba, data, false).await;
            let got = read(dev, lba, len).await;
            assert!(got[..] == expect[..], "{}: mismatch reading back {len} bytes at lba {lba}", dev.name());
        }
    }
}

async fn rejects_out_of_range(dev: &Device) {
    let bs = dev.geometry().block_size as usize;
    let cap = dev.geometry().blocks;
    let is_oor = |r: Result<(), Error>| matches!(r, Err(Error::OutOfRange { .. }));

    let (res, _) = dev.read(cap, IoBuf::with_len(bs)).await;
    assert!(is_oor(res), "read at capacity");
    let (res, _) = dev.read(cap - 1, IoBuf::with_len(2 * bs)).await;
    assert!(is_oor(res), "read straddling the end");
    let (res, _) = dev.read(u64::MAX, IoBuf::with_len(2 * bs)).await;
    assert!(is_oor(res), "read whose lba + blocks overflows");
    let (res, _) = dev.write(cap, IoBuf::with_len(bs), false).await;
    assert!(is_oor(res), "write at capacity");
    let (res, _) = dev.write(u64::MAX, IoBuf::with_len(bs), true).await;
    assert!(is_oor(res), "write at u64::MAX");
    assert!(is_oor(dev.write_zeroes(cap - 1, 2, false).await));
    assert!(is_oor(dev.write_zeroes(1, u64::MAX, true).await));
    assert!(is_oor(dev.deallocate(cap, 1).await));
    assert!(is_oor(dev.deallocate(u64::MAX, 2).await));
    // The very last block is in range.
    let (res, _) = dev.read(cap - 1, IoBuf::with_len(bs)).await;
    assert!(res.is_ok(), "last block must be readable: {res:?}");
}

async fn rejects_misaligned_length(dev: &Device) {
    let bs = dev.geometry().block_size as usize;
    let block_size = dev.geometry().block_size;
    let (res, _) = dev.read(0, IoBuf::with_len(bs + 1)).await;
    assert!(
        matches!(res, Err(Error::Misaligned { len, block_size: b }) if len == bs + 1 && b == block_size),
        "read: {res:?}"
    );
    let (res, _) = dev.write(0, IoBuf::with_len(bs / 2), false).await;
    assert!(matches!(res, Err(Error::Misaligned { .. })), "write: {res:?}");
}

/// Fills 40 blocks with a pattern, zeroes (or deallocates) blocks 9..14 and
/// a 256 KiB aligned span, and checks that exactly those read as zeros.
async fn zeroing_reads_zeros(dev: &Device, how: Zeroing) {
    let bs = dev.geometry().block_size as u64;
    let first = 8u64;
    let len = (40 * bs) as usize;
    write(dev, first, pattern(first * bs, len, 0x5a), false).await;
    let (zlba, zblocks) = (9u64, 5u64);
    let res = match how {
        Zeroing::WriteZeroes { deallocate } => dev.write_zeroes(zlba, zblocks, deallocate).await,
        Zeroing::Deallocate => dev.deallocate(zlba, zblocks).await,
    };
    res.unwrap_or_else(|e| panic!("{}: zeroing failed: {e}", dev.name()));
    let got = read(dev, first, len).await;
    let expect = pattern(first * bs, len, 0x5a);
    for blk in 0..40u64 {
        let lba = first + blk;
        let range = (blk * bs) as usize..((blk + 1) * bs) as usize;
        if (zlba..zlba + zblocks).contains(&lba) {
            assert!(is_zero(&got[range]), "{}: lba {lba} not zeroed ({how:?})", dev.name());
        } else {
            assert!(got[range.clone()] == expect[range], "{}: lba {lba} clobbered ({how:?})", dev.name());
        }
    }

    // A larger span that covers whole pages (ram madvise, file extents).
    let big = 256 * 1024u64;
    let lba = MIB / bs;
    write(dev, lba, pattern(lba * bs, big as usize, 3), false).await;
    let res = match how {
        Zeroing::WriteZeroes { deallocate } => dev.write_zeroes(lba, big / bs, deallocate).await,
        Zeroing::Deallocate => dev.deallocate(lba, big / bs).await,
    };
    res.unwrap_or_else(|e| panic!("{}: zeroing failed: {e}", dev.name()));
    assert!(is_zero(&read(dev, lba, big as usize).await), "{}: big span not zero", dev.name());
}

#[derive(Clone, Copy, Debug)]
enum Zeroing {
    WriteZeroes { deallocate: bool },
    Deallocate,
}

async fn flush_and_fua_write(dev: &Device) {
    let bs = dev.geometry().block_size as usize;
    let data = pattern(0, 4 * bs, 9);
    let expect = data.to_vec();
    write(dev, 2, data, true).await;
    dev.flush().await.expect("flush");
    assert_eq!(read(dev, 2, 4 * bs).await[..], expect[..]);
}

/// Everything a data-storing backend must do.
async fn full_contract(dev: &Device, deallocate_reads_zeroes: bool) {
    write_then_read_back(dev).await;
    rejects_out_of_range(dev).await;
    rejects_misaligned_length(dev).await;
    zeroing_reads_zeros(dev, Zeroing::WriteZeroes { deallocate: false }).await;
    zeroing_reads_zeros(dev, Zeroing::WriteZeroes { deallocate: true }).await;
    if deallocate_reads_zeroes {
        zeroing_reads_zeros(dev, Zeroing::Deallocate).await;
    } else {
        dev.deallocate(8, 5).await.expect("deallocate");
    }
    flush_and_fua_write(dev).await;
}

// ---------------------------------------------------------------------------
// ram

#[test]
fn ram_device_with_512_byte_blocks_meets_contract() {
    let dev = Device::ram("ram512", DEV_SIZE, 512).expect("ram device");
    assert_eq!(dev.kind(), Kind::Ram);
    assert!(!dev.volatile_write_cache());
    assert!(dev.deallocate_reads_zeroes());
    run(full_contract(&dev, true));
}

#[test]
fn ram_device_with_4096_byte_blocks_meets_contract() {
    let dev = Device::ram("ram4k", DEV_SIZE, 4096).expect("ram device");
    run(full_contract(&dev, true));
}

#[test]
fn ram_device_with_65536_byte_blocks_round_trips() {
    let dev = Device::ram("ram64k", DEV_SIZE, 65536).expect("ram device");
    run(write_then_read_back(&dev));
}

#[test]
fn ram_device_of_1_gib_is_created_lazily_and_reads_zeros() {
    let dev = Device::ram("big", 1 << 30, 4096).expect("1 GiB ram device");
    assert_eq!(dev.geometry().blocks, (1 << 30) / 4096);
    run(async {
        assert!(is_zero(&read(&dev, 0, MIB as usize).await));
        let last_mib = dev.geometry().blocks - MIB / 4096;
        assert!(is_zero(&read(&dev, last_mib, MIB as usize).await));
        write(&dev, dev.geometry().blocks - 1, IoBuf::from_slice(&[0xee; 4096]), false).await;
        assert!(read(&dev, dev.geometry().blocks - 1, 4096).await.iter().all(|&b| b == 0xee));
    });
}

// ---------------------------------------------------------------------------
// null

#[test]
fn null_device_reads_zeros_and_ignores_writes() {
    let dev = Device::null("null", DEV_SIZE, 512).expect("null device");
    assert_eq!(dev.kind(), Kind::Null);
    assert_eq!(dev.path(), None);
    assert!(!dev.volatile_write_cache());
    run(async {
        write(&dev, 0, IoBuf::from_slice(&[0xff; 4096]), true).await;
        // A reused, dirty buffer must still come back zeroed.
        let mut dirty = IoBuf::with_len(4096);
        dirty.fill(0xab);
        let (res, buf) = dev.read(0, dirty).await;
        res.expect("null read");
        assert!(is_zero(&buf));
        dev.write_zeroes(0, 8, true).await.expect("write zeroes");
        dev.deallocate(0, 8).await.expect("deallocate");
        dev.flush().await.expect("flush");
        rejects_out_of_range(&dev).await;
        rejects_misaligned_length(&dev).await;
    });
}

// ---------------------------------------------------------------------------
// geometry validation

#[test]
fn rejects_block_sizes_that_are_not_powers_of_two_in_512_to_65536() {
    for bs in [0, 1, 256, 1000, 4095, 131072] {
        let err = Device::ram("r", DEV_SIZE, bs).expect_err("bad block size");
        assert!(matches!(err, Error::InvalidBlockSize(b) if b == bs), "{bs}: {err}");
        assert!(Device::null("n", DEV_SIZE, bs).is_err());
    }
    for bs in [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536] {
        assert!(Device::null("n", DEV_SIZE, bs).is_ok(), "{bs}");
    }
}

#[test]
fn rejects_size_that_is_zero_or_not_a_multiple_of_block_size() {
    assert!(matches!(Device::ram("r", 0, 512), Err(Error::InvalidSize { .. })));
    assert!(matches!(Device::ram("r", 4096 + 512, 4096), Err(Error::InvalidSize { .. })));
    assert!(matches!(Device::null("n", 1000, 512), Err(Error::InvalidSize { .. })));
}

// ---------------------------------------------------------------------------
// file

fn is_ext4(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("path");
    // SAFETY: statfs is plain data; zeroed is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: NUL-terminated path and a writable statfs.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    rc == 0 && st.f_type as i64 == 0xEF53
}

fn is_tmpfs(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("path");
    // SAFETY: statfs is plain data; zeroed is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: NUL-terminated path and a writable statfs.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    rc == 0 && st.f_type as i64 == 0x0102_1994
}

#[test]
fn file_device_with_512_byte_blocks_meets_contract() {
    let dir = TempDir::new("file512");
    let path = dir.join("disk.img");
    let dev = Device::file("file512", &path, Some(DEV_SIZE), 512).expect("file device");
    assert_eq!(dev.kind(), Kind::File);
    assert_eq!(dev.path(), Some(path.as_path()));
    assert!(dev.volatile_write_cache());
    run(full_contract(&dev, true));
}

#[test]
fn file_device_with_4096_byte_blocks_meets_contract() {
    let dir = TempDir::new("file4k");
    let dev = Device::file("file4k", &dir.join("disk.img"), Some(DEV_SIZE), 4096).expect("file device");
    run(full_contract(&dev, true));
}

/// The access mode (`O_ACCMODE` of `flags` in `/proc/self/fdinfo`) of each
/// descriptor this process holds on `path`.
fn access_modes(path: &std::path::Path) -> Vec<u32> {
    let mut modes = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd").expect("fd dir").flatten() {
        if std::fs::read_link(e.path()).ok().as_deref() != Some(path) {
            continue;
        }
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", e.file_name().to_string_lossy()));
        let flags = info.ok().and_then(|i| {
            i.lines().find_map(|l| l.strip_prefix("flags:").and_then(|f| u32::from_str_radix(f.trim(), 8).ok()))
        });
        modes.push(flags.expect("flags in fdinfo") & libc::O_ACCMODE as u32);
    }
    modes
}

/// A read-only file or block device: every descriptor on the backing is
/// read-only, the device says so, reads work and writes fail; a read-only
/// file device does not take a size.
#[test]
fn read_only_file_and_block_devices_open_every_descriptor_read_only() {
    let dir = TempDir::new("ro");
    let path = dir.join("golden.img");
    let data: Vec<u8> = (0..MIB as usize).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &data).expect("write the file");
    let dev = Device::file_with("ro", &path, None, 512, blockdev::Symlinks::Follow, true).expect("read-only file");
    assert!(dev.read_only());
    let modes = access_modes(&path);
    assert!(modes.len() >= 2, "the device's descriptors: {modes:?}");
    assert!(modes.iter().all(|&m| m == libc::O_RDONLY as u32), "every descriptor read-only: {modes:?}");
    run(async {
        assert!(read(&dev, 3, 4096).await[..] == data[3 * 512..3 * 512 + 4096], "reads the file");
        let (res, _) = dev.write(0, IoBuf::with_len(512), false).await;
        assert!(res.is_err(), "a write through a read-only descriptor fails: {res:?}");
    });
    assert!(std::fs::read(&path).expect("read the file") == data, "the file is unchanged");
    let writable = Device::file("rw", &path, None, 512).expect("writable file");
    assert!(!writable.read_only());
    assert!(access_modes(&path).contains(&(libc::O_RDWR as u32)), "a writable device opens read-write");
    drop((dev, writable));
    let sized = Device::file_with("ro", &path, Some(MIB), 512, blockdev::Symlinks::Follow, true);
    assert!(matches!(sized, Err(Error::Unsupported(_))), "{sized:?}");
    let Some(lo) = LoopDev::attach(4 * MIB, 512) else {
        eprintln!("skipping the block device: no loop device");
        return;
    };
    let dev = Device::block_with("rob", &lo.dev, None, blockdev::Symlinks::Follow, true).expect("read-only block");
    let modes = access_modes(&lo.dev);
    assert!(!modes.is_empty() && modes.iter().all(|&m| m == libc::O_RDONLY as u32), "{modes:?}");
    run(async {
        let (res, _) = dev.write(0, IoBuf::with_len(512), false).await;
        assert!(res.is_err(), "a write to a read-only block device fails: {res:?}");
    });
}

#[test]
fn file_device_on_ext4_uses_direct_io() {
    let dir = TempDir::new("direct");
    if !is_ext4(dir.path()) {
        eprintln!("skipping: {} is not on ext4", dir.path().display());
        return;
    }
    let dev = Device::file("d", &dir.join("disk.img"), Some(DEV_SIZE), 4096).expect("file device");
    assert!(dev.direct_io(), "O_DIRECT expected on ext4");
    let dev512 = Device::file("d512", &dir.join("disk512.img"), Some(DEV_SIZE), 512).expect("file device");
    assert!(dev512.direct_io(), "O_DIRECT expected on ext4");
}

#[test]
fn file_device_on_tmpfs_round_trips_with_or_without_direct_io() {
    let shm = std::path::Path::new("/dev/shm");
    if !is_tmpfs(shm) {
        eprintln!("skipping: /dev/shm is not tmpfs");
        return;
    }
    let path = shm.join(format!("blockdev-test-{}.img", std::process::id()));
    struct Remove<'a>(&'a std::path::Path);
    impl Drop for Remove<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.0);
        }
    }
    let _remove = Remove(&path);
    // tmpfs refuses O_DIRECT before Linux 6.6 and accepts it since.
    let dev = Device::file("shm", &path, Some(DEV_SIZE), 512).expect("file device on tmpfs");
    eprintln!("tmpfs direct_io = {}", dev.direct_io());
    run(write_then_read_back(&dev));
}

#[test]
fn file_device_is_created_with_given_size() {
    let dir = TempDir::new("create");
    let path = dir.join("new.img");
    let dev = Device::file("f", &path, Some(3 * MIB), 4096).expect("file device");
    assert_eq!(std::fs::metadata(&path).expect("stat").len(), 3 * MIB);
    assert_eq!(dev.geometry().blocks, 3 * MIB / 4096);
    assert_eq!(dev.geometry().size_bytes(), 3 * MIB);
    run(async { assert!(is_zero(&read(&dev, 0, MIB as usize).await)) });
}

#[test]
fn file_device_extends_shorter_file_and_keeps_its_data() {
    let dir = TempDir::new("extend");
    let path = dir.join("short.img");
    std::fs::write(&path, vec![0x11u8; 8192]).expect("write file");
    let dev = Device::file("f", &path, Some(MIB), 512).expect("file device");
    assert_eq!(std::fs::metadata(&path).expect("stat").len(), MIB);
    run(async {
        assert!(read(&dev, 0, 8192).await.iter().all(|&b| b == 0x11));
        assert!(is_zero(&read(&dev, 16, 8192).await));
    });
}

#[test]
fn file_device_without_size_uses_file_length() {
    let dir = TempDir::new("existing");
    let path = dir.join("existing.img");
    std::fs::write(&path, vec![0u8; 64 * 1024]).expect("write file");
    let dev = Device::file("f", &path, None, 4096).expect("file device");
    assert_eq!(dev.geometry().blocks, 16);
}

#[test]
fn file_device_without_size_follows_the_file_length() {
    let dir = TempDir::new("follow");
    let path = dir.join("follow.img");
    std::fs::write(&path, vec![0u8; 64 * 1024]).expect("write file");
    let dev = Device::file("f", &path, None, 4096).expect("file device");
    assert!(!dev.refresh_size().expect("refresh"), "nothing changed");
    std::fs::OpenOptions::new().write(true).open(&path).and_then(|f| f.set_len(128 * 1024 + 100)).expect("grow");
    assert!(dev.refresh_size().expect("refresh"), "the file grew");
    assert_eq!(dev.geometry().blocks, 32, "whole blocks of the new length");
    run(async {
        write(&dev, 31, pattern(0, 4096, 3), false).await;
        assert!(read(&dev, 31, 4096).await[..] == pattern(0, 4096, 3)[..]);
    });
    assert!(matches!(dev.grow(256 * 1024), Err(Error::Unsupported(_))), "its size is the file's");
    let file = std::fs::OpenOptions::new().write(true).open(&path).expect("open");
    file.set_len(0).expect("cut");
    assert!(!dev.refresh_size().expect("refresh"), "a file cut to nothing is not a device of no blocks");
    assert_eq!(dev.geometry().blocks, 32);
    file.set_len(64 * 1024).expect("shrink");
    assert!(dev.refresh_size().expect("refresh"), "the file shrank");
    assert_eq!(dev.geometry().blocks, 16);
}

#[test]
fn file_device_with_size_grows_in_place_and_never_shrinks() {
    let dir = TempDir::new("grow");
    let path = dir.join("grow.img");
    let dev = Device::file("f", &path, Some(MIB), 4096).expect("file device");
    run(async { write(&dev, 0, pattern(0, 4096, 1), false).await });
    assert!(dev.grow(2 * MIB).expect("grow"), "it grew");
    assert_eq!(std::fs::metadata(&path).expect("stat").len(), 2 * MIB, "the file was extended first");
    assert_eq!(dev.geometry().blocks, 2 * MIB / 4096);
    run(async {
        write(&dev, 2 * MIB / 4096 - 1, pattern(0, 4096, 2), false).await;
        assert!(read(&dev, 2 * MIB / 4096 - 1, 4096).await[..] == pattern(0, 4096, 2)[..]);
        assert!(read(&dev, 0, 4096).await[..] == pattern(0, 4096, 1)[..], "the data before stays");
    });
    assert!(!dev.grow(2 * MIB).expect("same size"), "no change");
    assert!(matches!(dev.grow(MIB), Err(Error::Unsupported(_))), "no shrinking in use");
    assert!(matches!(dev.grow(2 * MIB + 512), Err(Error::InvalidSize { .. })), "whole blocks only");
    std::fs::OpenOptions::new().write(true).open(&path).and_then(|f| f.set_len(4 * MIB)).expect("grow file");
    assert!(!dev.refresh_size().expect("refresh"), "a configured size does not follow the file");
    assert_eq!(dev.geometry().blocks, 2 * MIB / 4096);
}

#[test]
fn null_devices_grow_and_ram_devices_refuse_to() {
    let null = Device::null("n", MIB, 512).expect("null");
    assert!(null.grow(4 * MIB).expect("grow null"));
    assert_eq!(null.geometry().blocks, 4 * MIB / 512);
    let ram = Device::ram("r", MIB, 512).expect("ram");
    assert!(matches!(ram.grow(2 * MIB), Err(Error::Unsupported(_))));
    assert_eq!(ram.geometry().blocks, MIB / 512);
}

#[test]
fn file_device_without_size_rejects_missing_empty_or_unaligned_file() {
    let dir = TempDir::new("reject");
    let missing = dir.join("missing.img");
    assert!(matches!(Device::file("f", &missing, None, 512), Err(Error::Open { .. })));
    assert!(!missing.exists(), "must not create a file without a size");

    let empty = dir.join("empty.img");
    std::fs::write(&empty, b"").expect("write");
    let err = Device::file("f", &empty, None, 512).expect_err("empty file");
    assert!(matches!(err, Error::InvalidSize { size_bytes: 0, .. }), "{err}");

    let odd = dir.join("odd.img");
    std::fs::write(&odd, vec![0u8; 4096 + 512]).expect("write");
    assert!(matches!(Device::file("f", &odd, None, 4096), Err(Error::InvalidSize { .. })));
    assert!(Device::file("f", &odd, None, 512).is_ok());
}

#[test]
fn file_device_rejects_directory() {
    let dir = TempDir::new("dir");
    let err = Device::file("f", dir.path(), None, 512).expect_err("directory");
    assert!(matches!(err, Error::NotRegularFile(_) | Error::Open { .. }), "{err}");
}

#[test]
fn file_device_deallocate_punches_hole() {
    let dir = TempDir::new("hole");
    let path = dir.join("disk.img");
    let dev = Device::file("f", &path, Some(DEV_SIZE), 4096).expect("file device");
    run(async {
        write(&dev, 0, pattern(0, MIB as usize, 1), true).await;
        let before = allocated_bytes(&path);
        dev.deallocate(0, MIB / 4096).await.expect("deallocate");
        assert!(is_zero(&read(&dev, 0, MIB as usize).await));
        assert!(allocated_bytes(&path) + MIB / 2 <= before, "hole not punched");
    });
}

#[test]
fn file_device_extents_follow_the_holes_in_whole_blocks() {
    use blockdev::Extent;
    let dir = TempDir::new("extent");
    let path = dir.join("disk.img");
    // 64 KiB blocks; 4 KiB of data inside block 1 (from 72 KiB), the rest
    // of the 1 MiB file a hole: a block with data in any part is mapped.
    let file = std::fs::File::create(&path).expect("create file");
    file.set_len(MIB).expect("set_len");
    std::os::unix::fs::FileExt::write_all_at(&file, &[0x5A; 4096], 72 << 10).expect("write");
    drop(file);
    let dev = Device::file("f", &path, None, 65536).expect("file device");
    let extent = |lba, blocks| dev.extent(lba, blocks).expect("extent");
    assert_eq!(extent(0, 16), Extent { blocks: 1, deallocated: true });
    assert_eq!(extent(1, 15), Extent { blocks: 1, deallocated: false });
    assert_eq!(extent(2, 14), Extent { blocks: 14, deallocated: true }, "to the end");
    assert_eq!(extent(2, 3), Extent { blocks: 3, deallocated: true }, "within the range asked");
    assert!(matches!(dev.extent(15, 2), Err(Error::OutOfRange { .. })));
    run(async {
        dev.deallocate(1, 1).await.expect("deallocate");
        write(&dev, 15, pattern(0, 65536, 3), false).await;
    });
    assert_eq!(extent(0, 16), Extent { blocks: 15, deallocated: true }, "the punched block joins the hole");
    assert_eq!(extent(15, 1), Extent { blocks: 1, deallocated: false });
    // A RAM device keeps no map of what was written: mapped, or unknown.
    let ram = Device::ram("r", MIB, 4096).expect("ram device");
    assert_eq!(ram.extent(3, 10).expect("extent"), Extent { blocks: 10, deallocated: false });
}

fn allocated_bytes(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).expect("stat").blocks() * 512
}

// ---------------------------------------------------------------------------
// block

#[test]
fn block_device_rejects_regular_file_path() {
    let dir = TempDir::new("notblock");
    let path = dir.join("plain.img");
    std::fs::write(&path, vec![0u8; 4096]).expect("write");
    let err = Device::block("b", &path, None).expect_err("regular file");
    assert!(matches!(err, Error::NotBlockDevice(_)), "{err}");
    assert!(err.to_string().contains("is not a block device"), "{err}");
}

#[test]
fn block_device_rejects_missing_path() {
    let err = Device::block("b", std::path::Path::new("/nonexistent/dev"), None).expect_err("missing");
    assert!(matches!(err, Error::Open { .. }), "{err}");
}

#[test]
fn block_device_on_512_byte_loop_device_meets_contract() {
    let Some(lo) = LoopDev::attach(DEV_SIZE, 512) else {
        return;
    };
    let dev = Device::block("loop512", &lo.dev, None).expect("block device");
    assert_eq!(dev.kind(), Kind::Block);
    assert_eq!(dev.geometry().block_size, 512);
    assert_eq!(dev.geometry().blocks, DEV_SIZE / 512);
    assert!(dev.volatile_write_cache());
    assert!(dev.direct_io());
    run(full_contract(&dev, false));
}

#[test]
fn block_device_on_4096_byte_loop_device_meets_contract() {
    let Some(lo) = LoopDev::attach(DEV_SIZE, 4096) else {
        return;
    };
    let dev = Device::block("loop4k", &lo.dev, None).expect("block device");
    assert_eq!(dev.geometry().block_size, 4096);
    run(full_contract(&dev, false));
}

#[test]
fn block_device_follows_its_size_when_the_loop_device_grows() {
    let Some(lo) = LoopDev::attach(DEV_SIZE, 512) else {
        return;
    };
    let dev = Device::block("loopgrow", &lo.dev, None).expect("block device");
    assert!(!dev.refresh_size().expect("refresh"));
    lo.grow(2 * DEV_SIZE);
    assert!(dev.refresh_size().expect("refresh"), "the device grew");
    assert_eq!(dev.geometry().blocks, 2 * DEV_SIZE / 512);
    run(async {
        write(&dev, 2 * DEV_SIZE / 512 - 8, pattern(0, 4096, 5), false).await;
        assert!(read(&dev, 2 * DEV_SIZE / 512 - 8, 4096).await[..] == pattern(0, 4096, 5)[..]);
    });
}

#[test]
fn block_device_accepts_larger_block_size_and_rejects_smaller_than_logical() {
    let Some(lo) = LoopDev::attach(DEV_SIZE, 4096) else {
        return;
    };
    let err = Device::block("b", &lo.dev, Some(512)).expect_err("below logical");
    assert!(matches!(err, Error::BlockSizeBelowLogical { requested: 512, logical: 4096 }), "{err}");
    drop(err);
    let dev = Device::block("b", &lo.dev, Some(8192)).expect("8 KiB blocks on 4 KiB device");
    assert_eq!(dev.geometry().blocks, DEV_SIZE / 8192);
    run(write_then_read_back(&dev));
}

// ---------------------------------------------------------------------------
// several reactor threads

fn two_threads_write_disjoint_ranges(dev: Arc<Device>) {
    const THREADS: u64 = 4;
    let bs = dev.geometry().block_size as u64;
    let per_thread = dev.geometry().blocks / THREADS;
    let chunk = 64 * 1024 / bs;
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let dev = Arc::clone(&dev);
            std::thread::spawn(move || {
                run(async {
                    let start = t * per_thread;
                    let mut lba = start;
                    while lba < start + per_thread {
                        write(&dev, lba, pattern(lba * bs, (chunk * bs) as usize, t as u8), false).await;
                        lba += chunk;
                    }
                    dev.flush().await.expect("flush");
                    let got = read(&dev, start, (per_thread * bs) as usize).await;
                    assert!(got[..] == pattern(start * bs, got.len(), t as u8)[..]);
                })
            })
        })
        .collect();
    for h in handles {
        h.join().expect("writer thread");
    }
    // This thread sees every other thread's writes.
    run(async {
        for t in 0..THREADS {
            let start = t * per_thread;
            let got = read(&dev, start, (per_thread * bs) as usize).await;
            assert!(got[..] == pattern(start * bs, got.len(), t as u8)[..], "range of thread {t}");
        }
    });
}

#[test]
fn ram_device_serves_several_threads_writing_disjoint_ranges() {
    two_threads_write_disjoint_ranges(Arc::new(Device::ram("r", DEV_SIZE, 512).expect("ram")));
}

#[test]
fn file_device_serves_several_threads_writing_disjoint_ranges() {
    let dir = TempDir::new("threads");
    let dev = Device::file("f", &dir.join("disk.img"), Some(DEV_SIZE), 4096).expect("file");
    two_threads_write_disjoint_ranges(Arc::new(dev));
}

#[test]
fn device_dropped_and_reopened_on_same_thread_uses_fresh_descriptors() {
    let dir = TempDir::new("reopen");
    let path = dir.join("disk.img");
    run(async {
        let dev = Device::file("f", &path, Some(MIB), 4096).expect("file");
        write(&dev, 0, IoBuf::from_slice(&[0x42; 4096]), true).await;
        drop(dev);
        let dev = Device::file("f", &path, None, 4096).expect("reopen");
        assert!(read(&dev, 0, 4096).await.iter().all(|&b| b == 0x42));
    });
}

#[test]
fn read_now_serves_memory_devices_at_once_and_declines_files() {
    let ram = Device::ram("r", 1 << 20, 512).expect("ram");
    let null = Device::null("n", 1 << 20, 512).expect("null");
    let dir = TempDir::new("read-now");
    let file = Device::file("f", &dir.path().join("f.img"), Some(1 << 20), 512).expect("file");
    let data = pattern(8 * 512, 4096, 5).to_vec();
    run(async {
        write(&ram, 8, IoBuf::from_slice(&data), false).await;
        write(&file, 8, IoBuf::from_slice(&data), false).await;
    });
    assert!(ram.reads_from_memory() && null.reads_from_memory() && !file.reads_from_memory());
    // The data is appended to what the buffer holds (a PDU's header), and
    // fed to the appender's CRC where it keeps one.
    let mut dst = vec![0xffu8; 24];
    let mut crc = Crc32c::new();
    assert!(matches!(ram.read_now(8, 4096, &mut Appender::new(&mut dst, Some(&mut crc))), Some(Ok(()))));
    assert_eq!(dst[..24], [0xff; 24]);
    assert_eq!(dst[24..], data[..]);
    assert_eq!(crc.value(), checksum::crc32c(&data));
    dst.truncate(24);
    let mut crc = Crc32c::new();
    assert!(matches!(null.read_now(8, 4096, &mut Appender::new(&mut dst, Some(&mut crc))), Some(Ok(()))));
    assert_eq!(dst.len(), 24 + 4096);
    assert!(is_zero(&dst[24..]));
    assert_eq!(crc.value(), checksum::crc32c_of_zeros(4096));
    dst.truncate(24);
    let mut out = Appender::new(&mut dst, None);
    assert!(file.read_now(8, 4096, &mut out).is_none(), "a file needs I/O");
    // The range check still applies, and a failed read appends nothing.
    assert!(matches!(ram.read_now(2047, 4096, &mut out), Some(Err(Error::OutOfRange { .. }))));
    assert!(matches!(ram.read_now(0, 100, &mut out), Some(Err(_))), "not a whole number of blocks");
    assert_eq!(dst.len(), 24);
}
