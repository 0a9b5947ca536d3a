//! Acknowledged writes are where the daemon said they are.
//!
//! The kill tests write a known image to a file device over NVMe/TCP and
//! over iSCSI (half of it with plain writes and a flush, half with FUA
//! writes and no flush), kill the daemon with SIGKILL, check the file on
//! disk, restart the daemon on the same file and read every block back. A
//! SIGKILL loses what the process holds, not the kernel's page cache: these
//! tests prove nothing acknowledged was still in the daemon, and that a
//! restart serves it. That flushes and FUA reach stable storage is shown by
//! the FUA tests, which count the flush requests a loop device receives
//! (root only: they need `losetup`); the same count shows that a device
//! removed at run time is flushed before `ctl` returns.

mod common;

use common::{block_on, bounded, Daemon};
use initiator::iscsi::{cdb, LoginOptions, Residual, Session};
use initiator::{cmd, Controller, Options};
use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const NQN: &str = "nqn.2026-11.io.ironwire:durability";
const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:durability-host";
const IQN: &str = "iqn.2026-11.io.ironwire.test:durability";
const HOST_IQN: &str = "iqn.2026-11.io.ironwire.test:durability-host";

const BS: usize = 512;
/// 4 MiB of 512-byte blocks.
const BLOCKS: u64 = 8192;
const SIZE: usize = BLOCKS as usize * BS;

#[derive(Clone, Copy)]
enum Proto {
    Nvme,
    Iscsi,
}

/// A daemon serving the device `dev` (kind `kind` at `path`) as namespace 1
/// of [`NQN`] or LUN 0 of [`IQN`].
fn start(tag: &str, proto: Proto, kind: &str, path: &Path) -> Daemon {
    let size = if kind == "file" { format!("size = \"{SIZE}\"\n") } else { String::new() };
    let device = format!(
        "[[device]]\nname = \"dev\"\nkind = \"{kind}\"\npath = \"{}\"\n{size}block_size = {BS}\n\n",
        path.display()
    );
    Daemon::start_with(&format!("durability-{tag}"), |_, port| {
        let export = match proto {
            Proto::Nvme => format!(
                "[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n[[subsystem.namespace]]\ndevice = \"dev\"\n\n\
                 [[port]]\naddress = \"127.0.0.1:{port}\"\n"
            ),
            Proto::Iscsi => format!(
                "[[iscsi_target]]\niqn = \"{IQN}\"\nallow_any_initiator = true\n[[iscsi_target.lun]]\nlun = 0\n\
                 device = \"dev\"\n\n[[port]]\ntransport = \"iscsi\"\naddress = \"127.0.0.1:{port}\"\n"
            ),
        };
        format!("{device}{export}\n[reactor]\ncores = [0]\n")
    })
}

/// One host, either protocol: writes with or without FUA, flush, read.
enum Host {
    Nvme(Controller),
    Iscsi(Session),
}

impl Host {
    async fn connect(proto: Proto, addr: SocketAddr) -> Host {
        match proto {
            Proto::Nvme => {
                let opts = Options { io_queues: 1, queue_size: 32, ..Options::default() };
                Host::Nvme(Controller::connect(addr, NQN, HOST_NQN, opts).await.expect("NVMe/TCP connect"))
            }
            Proto::Iscsi => {
                Host::Iscsi(Session::connect(addr, LoginOptions::new(HOST_IQN, Some(IQN))).await.expect("iSCSI login"))
            }
        }
    }

    async fn write(&mut self, lba: u64, data: Vec<u8>, fua: bool) {
        let blocks = (data.len() / BS) as u32;
        match self {
            Host::Nvme(c) => {
                let mut sqe = cmd::write(1, lba, blocks);
                // CDW12 bit 30: Force Unit Access (NVM Command Set 1.0 §3.2.6).
                sqe.cdw12 = (sqe.cdw12.get() | u32::from(fua) << 30).into();
                c.io_queue(0).expect("queue").execute(sqe, data, 0).await.expect("NVMe write");
            }
            Host::Iscsi(s) => {
                let mut c = cdb::write16(lba, blocks);
                // Byte 1 bit 3: FUA (SBC-4 §5.48).
                c[1] |= u8::from(fua) << 3;
                s.scsi(0, &c, data, 0).await.expect("WRITE(16)").check().expect("WRITE(16) status");
            }
        }
    }

    /// A write of `data` at `lba` without FUA: the failure a host sees
    /// (NVMe: the whole status field, DNR included).
    async fn try_write(&mut self, lba: u64, data: Vec<u8>) -> Result<(), String> {
        let blocks = (data.len() / BS) as u32;
        match self {
            Host::Nvme(c) => {
                let q = c.io_queue(0).expect("queue");
                q.execute(cmd::write(1, lba, blocks), data, 0).await.map(drop).map_err(|e| match e.status() {
                    Some(s) => format!("NVMe status {:#06x}", s.0),
                    None => panic!("write failed without a status: {e}"),
                })
            }
            Host::Iscsi(s) => {
                let r = s.scsi(0, &cdb::write16(lba, blocks), data, 0).await.expect("WRITE(16) delivered");
                match r.sense_code() {
                    Some(sense) => Err(format!("sense {:#04x}/{:#04x}/{:#04x}", sense.key, sense.asc, sense.ascq)),
                    None => r.check().map(drop).map_err(|e| e.to_string()),
                }
            }
        }
    }

    async fn flush(&mut self) {
        self.try_flush().await.expect("flush");
    }

    /// NVMe Flush or SCSI SYNCHRONIZE CACHE (10): the failure a host sees.
    async fn try_flush(&mut self) -> Result<(), String> {
        match self {
            Host::Nvme(c) => c.flush(0, 1).await.map_err(|e| match e.status() {
                Some(s) => format!("NVMe status {:#05x}", s.0 & 0x7ff),
                None => panic!("flush failed without a status: {e}"),
            }),
            Host::Iscsi(s) => {
                let sync = [0x35u8, 0, 0, 0, 0, 0, 0, 0, 0, 0];
                let r = s.scsi(0, &sync, Vec::new(), 0).await.expect("SYNCHRONIZE CACHE delivered");
                match r.sense_code() {
                    Some(sense) => Err(format!("sense {sense:?}")),
                    None => r.check().map(drop).map_err(|e| e.to_string()),
                }
            }
        }
    }

    /// Turns the device's volatile write cache on or off: NVMe Set
    /// Features Volatile Write Cache, SCSI MODE SELECT (6) of the caching
    /// page's WCE.
    async fn write_cache(&mut self, on: bool) {
        match self {
            Host::Nvme(c) => {
                let sqe = cmd::set_features(nvme_spec::opcode::FeatureId::VOLATILE_WRITE_CACHE, u32::from(on));
                c.admin_command(sqe, Vec::new(), 0).await.expect("Set Features Volatile Write Cache");
            }
            Host::Iscsi(s) => {
                let mut list = vec![0u8; 4 + 20];
                list[4] = 0x08; // caching page
                list[5] = 0x12;
                list[6] = u8::from(on) << 2; // WCE
                let select = [0x15u8, 0x10, 0, 0, list.len() as u8, 0];
                s.scsi(0, &select, list, 0).await.expect("MODE SELECT delivered").check().expect("MODE SELECT status");
            }
        }
    }

    async fn read(&mut self, lba: u64, blocks: u32) -> Vec<u8> {
        match self {
            Host::Nvme(c) => c.read(0, 1, lba, blocks).await.expect("NVMe read"),
            Host::Iscsi(s) => s.read16(0, lba, blocks, BS as u32).await.expect("READ(16)"),
        }
    }
}

/// The image the tests write: every block distinct, none all zeros.
fn image() -> Vec<u8> {
    (0..SIZE).map(|i| ((i / BS) as u8).wrapping_mul(37) ^ (i as u8).wrapping_mul(11) ^ 0x5a).collect()
}

/// Writes of 1, 3, 8, 16 and 128 blocks in turn over `lbas`, so both the
/// 4 KiB-aligned (O_DIRECT) and the unaligned (buffered) paths are used.
async fn write_range(h: &mut Host, img: &[u8], lbas: std::ops::Range<u64>, fua: bool) {
    let mut lba = lbas.start;
    for blocks in [1u64, 3, 8, 16, 128].into_iter().cycle() {
        if lba >= lbas.end {
            break;
        }
        let n = blocks.min(lbas.end - lba) as usize;
        let at = lba as usize * BS;
        h.write(lba, img[at..at + n * BS].to_vec(), fua).await;
        lba += n as u64;
    }
}

/// A directory of the test's own, outside the daemon's (which goes with
/// the daemon), removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ironwire-durability-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn acknowledged_writes_survive_sigkill(proto: Proto, tag: &str) {
    let scratch = Scratch::new(tag);
    let file = scratch.0.join("dev.img");
    let img = image();
    let half = BLOCKS / 2;
    let d = start(&format!("{tag}-1"), proto, "file", &file);
    block_on(bounded(60, async {
        let mut h = Host::connect(proto, d.addr).await;
        // First half: cached writes made durable by a flush.
        write_range(&mut h, &img, 0..half, false).await;
        h.flush().await;
        // Second half: FUA writes, no flush after them.
        write_range(&mut h, &img, half..BLOCKS, true).await;
    }));
    // Child::kill is SIGKILL: no shutdown path runs.
    drop(d);
    let on_disk = std::fs::read(&file).expect("read the device file");
    assert_eq!(on_disk.len(), SIZE);
    if let Some(at) = on_disk.iter().zip(&img).position(|(a, b)| a != b) {
        panic!("the file differs from what was acknowledged at byte {at} (block {})", at / BS);
    }
    let mut d = start(&format!("{tag}-2"), proto, "file", &file);
    block_on(bounded(60, async {
        let mut h = Host::connect(proto, d.addr).await;
        for lba in (0..BLOCKS).step_by(256) {
            let got = h.read(lba, 256).await;
            let at = lba as usize * BS;
            assert!(got == img[at..at + got.len()], "blocks {lba}..{} read back different after restart", lba + 256);
        }
    }));
    d.assert_alive();
}

#[test]
fn nvme_writes_acknowledged_before_sigkill_are_all_read_back_after_restart() {
    acknowledged_writes_survive_sigkill(Proto::Nvme, "nvme-kill");
}

#[test]
fn iscsi_writes_acknowledged_before_sigkill_are_all_read_back_after_restart() {
    acknowledged_writes_survive_sigkill(Proto::Iscsi, "iscsi-kill");
}

/// A loop device over a sparse file, detached on drop: a block device of
/// the test's own, whose flush requests nothing else sends.
struct LoopDevice {
    dev: PathBuf,
    name: String,
}

impl LoopDevice {
    fn new(backing: &Path) -> Result<LoopDevice, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        std::fs::File::create(backing).and_then(|f| f.set_len(SIZE as u64)).map_err(|e| e.to_string())?;
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(backing)
            .output()
            .map_err(|e| format!("losetup: {e}"))?;
        if !out.status.success() {
            return Err(format!("losetup: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let name = dev.file_name().and_then(|n| n.to_str()).ok_or("loop device name")?.to_owned();
        Ok(LoopDevice { dev, name })
    }

    /// Flush requests the device completed (`/sys/block/*/stat` field 16).
    fn flushes(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/sys/block/{}/stat", self.name)).expect("block stat");
        stat.split_whitespace().nth(15).and_then(|v| v.parse().ok()).expect("flush count in stat")
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

/// The daemon serving a fresh loop device as its block device "dev" over
/// `proto` (with the scratch directory holding its backing file); `None`,
/// said on stderr, where no loop device can be set up.
fn on_a_loop_device(tag: &str, proto: Proto) -> Option<(Scratch, LoopDevice, Daemon)> {
    let scratch = Scratch::new(tag);
    let lo = match LoopDevice::new(&scratch.0.join("backing.img")) {
        Ok(lo) => lo,
        Err(e) => {
            eprintln!("skipping: no loop device ({e})");
            return None;
        }
    };
    let d = start(tag, proto, "block", &lo.dev);
    Some((scratch, lo, d))
}

/// FUA writes reach the device as flush/FUA requests, plain writes don't,
/// and a flush command flushes: counted at the block layer of a loop
/// device the daemon serves as a block device.
fn fua_and_flush_reach_the_block_device(proto: Proto, tag: &str) {
    let Some((_scratch, lo, mut d)) = on_a_loop_device(tag, proto) else { return };
    let img = image();
    block_on(bounded(60, async {
        let mut h = Host::connect(proto, d.addr).await;
        let before = lo.flushes();
        for i in 0..8u64 {
            h.write(i * 8, img[..4096].to_vec(), false).await;
        }
        assert_eq!(lo.flushes(), before, "plain writes to a write-back device need no flush");
        for i in 0..8u64 {
            h.write(64 + i * 8, img[..4096].to_vec(), true).await;
        }
        let after_fua = lo.flushes();
        assert!(after_fua >= before + 8, "8 FUA writes made {} flush requests", after_fua - before);
        h.flush().await;
        assert!(lo.flushes() > after_fua, "the flush command reached the device");
        if let Host::Nvme(c) = &mut h {
            // Write Zeroes is an fallocate, which no RWF_DSYNC covers: with
            // FUA it is followed by the device's flush, without it is not.
            let q = c.io_queue(0).expect("queue");
            let before = lo.flushes();
            q.execute(cmd::write_zeroes(1, 256, 64, false), Vec::new(), 0).await.expect("Write Zeroes");
            assert_eq!(lo.flushes(), before, "a plain Write Zeroes needs no flush");
            let mut sqe = cmd::write_zeroes(1, 512, 64, false);
            sqe.cdw12 = (sqe.cdw12.get() | 1 << 30).into();
            q.execute(sqe, Vec::new(), 0).await.expect("Write Zeroes with FUA");
            assert!(lo.flushes() > before, "Write Zeroes with FUA reached the device as a flush");
        }
        // Turning the write cache off: the host sends no flush after it,
        // so the plain writes it made before must be flushed by the change.
        let before = lo.flushes();
        h.write(1024, img[..4096].to_vec(), false).await;
        h.write_cache(false).await;
        assert!(lo.flushes() > before, "turning the write cache off did not flush the device");
    }));
    d.assert_alive();
}

#[test]
fn nvme_fua_writes_and_flush_reach_the_block_device_and_plain_writes_do_not() {
    fua_and_flush_reach_the_block_device(Proto::Nvme, "nvme-fua");
}

#[test]
fn iscsi_fua_writes_and_synchronize_cache_reach_the_block_device_and_plain_writes_do_not() {
    fua_and_flush_reach_the_block_device(Proto::Iscsi, "iscsi-fua");
}

/// A namespace or LUN removed at run time has its device flushed before
/// `ctl remove` returns, though the device stays, and so has a device
/// removed, as a stop flushes every device: a host told of a volatile
/// write cache can no longer send the flush that would have made its plain
/// writes durable. Counted at the block layer of a loop device the daemon
/// serves as a block device.
fn a_removed_device_is_flushed(proto: Proto, tag: &str) {
    let Some((_scratch, lo, mut d)) = on_a_loop_device(tag, proto) else { return };
    let img = image();
    block_on(bounded(60, async {
        let mut h = Host::connect(proto, d.addr).await;
        for i in 0..8u64 {
            h.write(i * 8, img[..4096].to_vec(), false).await;
        }
        let before = lo.flushes();
        let user = match proto {
            Proto::Nvme => format!("remove namespace nqn={NQN} nsid=1"),
            Proto::Iscsi => format!("remove lun iqn={IQN} lun=0"),
        };
        d.ctl(&user).unwrap_or_else(|e| panic!("ctl {user}: {e}"));
        let unexported = lo.flushes();
        assert!(unexported > before, "the device of the removed namespace or LUN was not flushed");
        d.ctl("remove device name=dev").unwrap_or_else(|e| panic!("ctl remove device: {e}"));
        assert!(lo.flushes() > unexported, "the removed device was closed without a flush");
        drop(h);
    }));
    d.assert_alive();
}

#[test]
fn a_device_removed_under_nvme_writes_is_flushed_before_ctl_returns() {
    a_removed_device_is_flushed(Proto::Nvme, "nvme-remove-flush");
}

#[test]
fn a_device_removed_under_iscsi_writes_is_flushed_before_ctl_returns() {
    a_removed_device_is_flushed(Proto::Iscsi, "iscsi-remove-flush");
}

/// A tmpfs of a given size mounted on `dir`, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, bytes: u64) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir)
            .status()
            .map_err(|e| format!("mount: {e}"))?;
        if !st.success() {
            return Err(format!("mount tmpfs: {st}"));
        }
        Ok(Tmpfs(dir.to_path_buf()))
    }

    fn resize(&self, bytes: u64) {
        let st = Command::new("mount").args(["-o", &format!("remount,size={bytes}")]).arg(&self.0).status();
        assert!(st.is_ok_and(|s| s.success()), "remount tmpfs");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: the loop driver may let go of its backing file a moment
        // after `losetup -d` returns.
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A loop device whose sparse backing file sits on a 1 MiB tmpfs, so that
/// writing back more than that fails; `None` (and a line saying why the
/// test is skipped) where the machine cannot make one.
fn failing_loop_device(scratch: &Scratch) -> Option<(Tmpfs, LoopDevice)> {
    let fs = match Tmpfs::mount(&scratch.0.join("tmpfs"), 1 << 20) {
        Ok(fs) => fs,
        Err(e) => {
            eprintln!("skipping: cannot mount a small tmpfs ({e})");
            return None;
        }
    };
    match LoopDevice::new(&fs.0.join("backing.img")) {
        Ok(lo) => Some((fs, lo)),
        Err(e) => {
            eprintln!("skipping: no loop device ({e})");
            None
        }
    }
}

/// A real failing fdatasync: the daemon serves a loop device whose sparse
/// backing file sits on a 1 MiB tmpfs, and 2 MiB of the loop device's page
/// cache are dirtied (by the test, through a descriptor of its own: the
/// daemon's aligned writes go O_DIRECT and would fail at once instead). The
/// flush that writes them back fails; after the tmpfs is grown the kernel
/// would let the next fdatasync succeed, but the daemon keeps failing
/// flushes (fsyncgate) and says why once.
fn a_failed_flush_fails_every_later_flush(proto: Proto, tag: &str) {
    let scratch = Scratch::new(tag);
    let Some((fs, lo)) = failing_loop_device(&scratch) else { return };
    let mut d = start(tag, proto, "block", &lo.dev);
    block_on(bounded(60, async {
        let mut h = Host::connect(proto, d.addr).await;
        let writer = OpenOptions::new().write(true).open(&lo.dev).expect("writer");
        writer.write_all_at(&vec![0xab; 2 << 20], 0).expect("buffered writes are accepted");
        let first = h.try_flush().await.expect_err("writeback into the full tmpfs fails");
        fs.resize(64 << 20);
        for _ in 0..2 {
            let again = h.try_flush().await.expect_err("and every later flush fails too");
            assert_eq!(again, first, "the same error as the first time");
        }
        if let Proto::Nvme = proto {
            assert_eq!(first, "NVMe status 0x280", "Write Fault");
        }
    }));
    let log = d.log();
    assert_eq!(log.matches("every later flush of this device fails").count(), 1, "logged once:\n{log}");
    d.assert_alive();
}

#[test]
fn nvme_flush_keeps_failing_after_a_failed_fdatasync() {
    a_failed_flush_fails_every_later_flush(Proto::Nvme, "nvme-fsyncgate");
}

#[test]
fn iscsi_synchronize_cache_keeps_failing_after_a_failed_fdatasync() {
    a_failed_flush_fails_every_later_flush(Proto::Iscsi, "iscsi-fsyncgate");
}

/// Two flushes in flight together when writeback fails: the kernel tells
/// one `fdatasync` on the shared flush descriptor, and the other would
/// succeed; both must fail, whichever completes first.
#[test]
fn two_flushes_in_flight_when_writeback_fails_both_fail() {
    let scratch = Scratch::new("nvme-flush-pair");
    let Some((_fs, lo)) = failing_loop_device(&scratch) else { return };
    let mut d = start("nvme-flush-pair", Proto::Nvme, "block", &lo.dev);
    block_on(bounded(60, async {
        let Host::Nvme(mut c) = Host::connect(Proto::Nvme, d.addr).await else { unreachable!() };
        let writer = OpenOptions::new().write(true).open(&lo.dev).expect("writer");
        writer.write_all_at(&vec![0xab; 2 << 20], 0).expect("buffered writes are accepted");
        let q = c.io_queue(0).expect("queue");
        q.submit(cmd::flush(1), Vec::new(), 0).expect("first flush");
        q.submit(cmd::flush(1), Vec::new(), 0).expect("second flush");
        for _ in 0..2 {
            let done = q.next_completion().await.expect("a flush answered");
            assert!(!done.cqe.status().is_success(), "a flush succeeded though writeback failed");
        }
    }));
    d.assert_alive();
}

/// A write into a sparse device file on a file system that has run out
/// of space fails, and says so: NVMe Capacity Exceeded with DNR (what
/// nvmet answers to ENOSPC; a Linux host reports ENOSPC rather than
/// retrying a Write Fault and then calling it a medium error), SCSI DATA
/// PROTECT / SPACE ALLOCATION FAILED WRITE PROTECT.
fn a_write_into_a_full_file_system_is_reported_as_out_of_space(proto: Proto, tag: &str) {
    let scratch = Scratch::new(tag);
    let fs = match Tmpfs::mount(&scratch.0.join("tmpfs"), 1 << 20) {
        Ok(fs) => fs,
        Err(e) => {
            eprintln!("skipping: cannot mount a small tmpfs ({e})");
            return;
        }
    };
    // A 4 MiB device whose file sits on a 1 MiB file system.
    let mut d = start(tag, proto, "file", &fs.0.join("dev.img"));
    let img = image();
    block_on(bounded(60, async {
        let mut h = Host::connect(proto, d.addr).await;
        for lba in (0..BLOCKS).step_by(128) {
            let at = lba as usize * BS;
            let Err(failed) = h.try_write(lba, img[at..at + 128 * BS].to_vec()).await else { continue };
            let expected = match proto {
                Proto::Nvme => "NVMe status 0x4081",
                Proto::Iscsi => "sense 0x07/0x27/0x07",
            };
            assert_eq!(failed, expected, "the write at lba {lba} into the full file system");
            return;
        }
        panic!("{SIZE} bytes written into a 1 MiB file system");
    }));
    d.assert_alive();
}

#[test]
fn nvme_write_into_a_full_file_system_is_capacity_exceeded_without_retry() {
    a_write_into_a_full_file_system_is_reported_as_out_of_space(Proto::Nvme, "nvme-enospc");
}

#[test]
fn iscsi_write_into_a_full_file_system_is_space_allocation_failed() {
    a_write_into_a_full_file_system_is_reported_as_out_of_space(Proto::Iscsi, "iscsi-enospc");
}

/// A normal shutdown (CC.SHN, what `nvme disconnect` sends) flushes the
/// namespaces' devices before CSTS.SHST says complete: plain writes
/// before it are durable once the host sees the shutdown done.
#[test]
fn nvme_controller_shutdown_flushes_the_device() {
    let Some((_scratch, lo, mut d)) = on_a_loop_device("nvme-shutdown", Proto::Nvme) else { return };
    let img = image();
    block_on(bounded(60, async {
        let Host::Nvme(mut c) = Host::connect(Proto::Nvme, d.addr).await else { unreachable!() };
        let before = lo.flushes();
        for i in 0..8u64 {
            c.write(0, 1, i * 8, img[..4096].to_vec()).await.expect("write");
        }
        assert_eq!(lo.flushes(), before, "plain writes to a write-back device need no flush");
        c.disconnect().await.expect("shutdown completes");
        assert!(lo.flushes() > before, "the shutdown reached the device as a flush");
    }));
    d.assert_alive();
}

/// A write the device fails reports its residual like any other answer:
/// a WRITE (16) of 128 blocks sent with one block more than it describes
/// ends, once the file system behind the device is full, in CHECK
/// CONDITION (SPACE ALLOCATION FAILED) with the underflow of that block
/// (RFC 7143 11.4.5.1), as a write refused before reaching the device
/// does.
#[test]
fn iscsi_write_failed_by_the_device_reports_its_residual() {
    let scratch = Scratch::new("iscsi-enospc-residual");
    let fs = match Tmpfs::mount(&scratch.0.join("tmpfs"), 1 << 20) {
        Ok(fs) => fs,
        Err(e) => {
            eprintln!("skipping: cannot mount a small tmpfs ({e})");
            return;
        }
    };
    let mut d = start("iscsi-enospc-residual", Proto::Iscsi, "file", &fs.0.join("dev.img"));
    block_on(bounded(60, async {
        let mut s = Session::connect(d.addr, LoginOptions::new(HOST_IQN, Some(IQN))).await.expect("login");
        s.clear_unit_attentions(0).await.expect("LUN 0 ready");
        for lba in (0..BLOCKS).step_by(128) {
            let data = vec![0x5a; 129 * BS];
            let r = s.scsi(0, &cdb::write16(lba, 128), data, 0).await.expect("WRITE (16) answered");
            if r.is_good() {
                assert_eq!(r.residual, Some(Residual::Underflow(BS as u32)), "GOOD at lba {lba}");
                continue;
            }
            let code = r.sense_code().map(|c| (c.key, c.asc, c.ascq));
            assert_eq!(code, Some((0x07, 0x27, 0x07)), "the write at lba {lba} into the full file system");
            assert_eq!(r.residual, Some(Residual::Underflow(BS as u32)), "CHECK CONDITION at lba {lba}");
            return;
        }
        panic!("{SIZE} bytes written into a 1 MiB file system");
    }));
    d.assert_alive();
}
