//! Write zeroes and deallocate on a real loop device: they zero (or discard)
//! exactly the range asked for, and they reach the kernel as io_uring
//! `FALLOCATE`s, never as a synchronous `BLKZEROOUT` / `BLKDISCARD` ioctl or
//! `fallocate(2)` on the reactor thread, whatever the size of the range.
//!
//! The test runs its workload in a child copy of this test binary under
//! `strace`, which records every `ioctl` and `fallocate` system call the
//! process makes (a ring operation is not one), and reads the record.
//! Without `losetup` (not root) it is skipped; without `strace` only the
//! data checks run (`scripts/test` installs strace).

mod common;

use std::path::Path;
use std::process::Command;

use blockdev::{BlockDevice, Device};
use common::{is_zero, pattern, read, run, write, LoopDev, TempDir};

const MIB: u64 = 1 << 20;
/// The loop device the child workload runs on (set by the parent).
const DEV_ENV: &str = "BLOCKDEV_ZEROING_DEVICE";
/// Printed by the child when every data check passed.
const DONE: &str = "zeroing workload done";

/// Whether the loop device forwards discards (its backing file system can
/// punch holes); then a discarded range reads zeros.
fn discard_supported(dev: &Path) -> bool {
    let name = dev.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    std::fs::read_to_string(format!("/sys/block/{name}/queue/discard_max_bytes"))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .is_some_and(|n| n > 0)
}

/// Fills 24 MiB, then zeroes 16 MiB of it in one request (one NVMe Write
/// Zeroes of 32768 blocks), zeroes with unmap allowed, and discards, each
/// time checking the blocks on both sides are untouched.
fn workload(path: &Path) {
    let dev = Device::block("loop", path, None).expect("open the loop device");
    let bs = u64::from(dev.geometry().block_size);
    let total = 24 * MIB;
    run(async {
        write(&dev, 0, pattern(0, total as usize, 0x42), false).await;
        let check = |got: &[u8], zeroed: std::ops::Range<u64>, what: &str| {
            let expect = pattern(0, total as usize, 0x42);
            let (lo, hi) = (zeroed.start as usize, zeroed.end as usize);
            assert!(got[..lo] == expect[..lo], "{what}: bytes before the range changed");
            assert!(is_zero(&got[lo..hi]), "{what}: range not zeroed");
            assert!(got[hi..] == expect[hi..], "{what}: bytes after the range changed");
        };

        dev.write_zeroes(MIB / bs, 16 * MIB / bs, false).await.expect("write zeroes, no unmap");
        check(&read(&dev, 0, total as usize).await, MIB..17 * MIB, "write zeroes");

        write(&dev, 0, pattern(0, total as usize, 0x42), false).await;
        dev.write_zeroes(2 * MIB / bs, 4 * MIB / bs, true).await.expect("write zeroes, unmap allowed");
        check(&read(&dev, 0, total as usize).await, 2 * MIB..6 * MIB, "write zeroes with unmap");

        write(&dev, 0, pattern(0, total as usize, 0x42), false).await;
        dev.deallocate(8 * MIB / bs, 8 * MIB / bs).await.expect("deallocate is advisory, never an error");
        let got = read(&dev, 0, total as usize).await;
        if discard_supported(path) {
            check(&got, 8 * MIB..16 * MIB, "discard");
        } else {
            let expect = pattern(0, total as usize, 0x42);
            assert!(got[..8 * MIB as usize] == expect[..8 * MIB as usize], "discard touched other blocks");
        }
    });
    println!("{DONE}");
}

#[test]
fn zeroing_and_discard_on_a_loop_device_run_on_the_ring_not_as_ioctls() {
    if let Some(path) = std::env::var_os(DEV_ENV) {
        // The child: only the workload, under strace.
        workload(Path::new(&path));
        return;
    }
    let Some(lo) = LoopDev::attach(32 * MIB, 512) else {
        return;
    };
    let dir = TempDir::new("strace");
    let log = dir.join("trace.log");
    let exe = std::env::current_exe().expect("test binary path");
    let out = Command::new("strace")
        .args(["-f", "-qq", "-e", "trace=ioctl,fallocate", "-o"])
        .arg(&log)
        .arg(&exe)
        .args(["--exact", "zeroing_and_discard_on_a_loop_device_run_on_the_ring_not_as_ioctls", "--nocapture"])
        .env(DEV_ENV, &lo.dev)
        .output();
    let out = match out {
        Ok(out) => out,
        Err(e) => {
            eprintln!("strace unavailable ({e}): checking the data only, not the system calls");
            workload(&lo.dev);
            return;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stdout.contains(DONE), "workload under strace failed:\n{stdout}\n{stderr}");
    let trace = std::fs::read_to_string(&log).expect("read the strace log");
    // The device's open asks for its size and block size; that is all.
    assert!(trace.contains("BLKGETSIZE64"), "strace recorded no ioctl at all, is it tracing?\n{trace}");
    for call in ["BLKZEROOUT", "BLKDISCARD", "fallocate("] {
        let hits: Vec<&str> = trace.lines().filter(|l| l.contains(call)).collect();
        assert!(hits.is_empty(), "{call} ran as a synchronous system call:\n{}", hits.join("\n"));
    }
}
