//! The daemon on Ceph RBD images of a real cluster (the one `scripts/test`
//! starts with ceph-peer and names in `IRONWIRE_CEPH_CONF`): NVMe/TCP and
//! iSCSI write patterns through the daemon that the `rbd` CLI then finds in
//! the image, flush, deallocate, write zeroes, compare and COMPARE AND
//! WRITE (one `rbd_aio_compare_and_write`); and a cluster
//! that cannot be reached fails `serve` with a message naming the monitors.
//! Each test makes its own small image; every wait is bounded.

mod common;

use common::{block_on, bounded, Daemon};
use initiator::iscsi::{cdb, LoginOptions, Session};
use initiator::{Controller, Options, Status};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const NQN: &str = "nqn.2026-11.io.ironwire:rbd";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:rbd-host";
const IQN: &str = "iqn.2026-11.io.ironwire.test:rbd";
const INITIATOR: &str = "iqn.2026-11.io.ironwire.test:rbd-host";
const IMAGE_BYTES: usize = 16 << 20;

/// The test cluster's configuration file, or `None` (with a message) when
/// there is none outside CI. Under CI the rbd tests must run.
fn cluster() -> Option<PathBuf> {
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

fn rbd_cli(conf: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("timeout")
        .arg("60")
        .arg("rbd")
        .arg("-c")
        .arg(conf)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run the rbd CLI");
    assert!(out.status.success(), "rbd {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// A fresh 16 MiB image. It is not removed: the daemon is killed, and its
/// watch on the image would make `rbd rm` wait for the OSD's watch timeout;
/// `scripts/test` destroys the whole cluster afterwards.
struct TestImage {
    conf: PathBuf,
    name: String,
}

impl TestImage {
    fn new(conf: &Path, tag: &str) -> TestImage {
        let name = format!("ironwire-{tag}-{}", std::process::id());
        let spec = format!("rbd/{name}");
        let _ = Command::new("rbd").arg("-c").arg(conf).args(["rm", "--no-progress", &spec]).output();
        rbd_cli(conf, &["create", "--size", "16M", &spec]);
        TestImage { conf: conf.to_path_buf(), name }
    }

    /// The image's bytes, read by the `rbd` CLI outside the daemon.
    fn export(&self) -> Vec<u8> {
        let data = rbd_cli(&self.conf, &["export", "--no-progress", &format!("rbd/{}", self.name), "-"]);
        assert_eq!(data.len(), IMAGE_BYTES, "rbd export size");
        data
    }

    fn device(&self, block_size: u32) -> String {
        format!(
            "[[device]]\nname = \"ceph\"\nkind = \"rbd\"\npool = \"rbd\"\nimage = \"{}\"\nceph_conf = \"{}\"\n\
             block_size = {block_size}\nconnect_timeout = 10\n",
            self.name,
            self.conf.display()
        )
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 9) as u8).collect()
}

fn nvme_daemon(tag: &str, img: &TestImage, block_size: u32) -> Daemon {
    let device = img.device(block_size);
    Daemon::start_with(&format!("rbd-{tag}"), move |_, port| {
        format!(
            "{device}\n[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n[[subsystem.namespace]]\n\
             device = \"ceph\"\n\n[[port]]\naddress = \"127.0.0.1:{port}\"\n\n[reactor]\ncores = [0]\n"
        )
    })
}

fn opts() -> Options {
    Options { io_queues: 2, queue_size: 64, ..Options::default() }
}

/// The status code type and code, without DNR/More/CRD.
fn code(e: &initiator::Error) -> u16 {
    match e.status() {
        Some(s) => s.0 & 0x7ff,
        None => panic!("expected an NVMe status, got {e}"),
    }
}

#[test]
fn nvme_tcp_writes_land_in_the_rbd_image() {
    let Some(conf) = cluster() else { return };
    let img = TestImage::new(&conf, "nvme");
    let mut d = nvme_daemon("nvme", &img, 512);
    // (LBA, bytes): in-capsule and R2T sizes, one crossing a 4 MiB object.
    let writes = [(0u64, 4096usize), (9, 512), (100, 65536), ((4 << 20) / 512 - 8, 1 << 20)];
    block_on(bounded(60, async {
        let mut c = Controller::connect(d.addr, NQN, HOST, opts()).await.expect("connect");
        let ns = c.identify_namespace(1).await.expect("identify namespace");
        assert_eq!((ns.block_size, ns.size_bytes()), (512, IMAGE_BYTES as u64), "size from the image");
        let vwc = c.identity().raw.get(nvme_spec::identify::ctrl::VWC).copied().unwrap_or(0xff);
        assert_eq!(vwc & 1, 0, "no volatile write cache advertised: librbd's cache is off");
        for (i, &(lba, len)) in writes.iter().enumerate() {
            c.write(i % 2, 1, lba, pattern(len, i as u8)).await.unwrap_or_else(|e| panic!("write at {lba}: {e}"));
        }
        c.flush(0, 1).await.expect("flush");
        for (i, &(lba, len)) in writes.iter().enumerate() {
            let got = c.read((i + 1) % 2, 1, lba, (len / 512) as u32).await.expect("read");
            assert!(got == pattern(len, i as u8), "read back at lba {lba} differs");
        }
    }));
    d.assert_alive();
    drop(d);
    let image = img.export();
    for (i, &(lba, len)) in writes.iter().enumerate() {
        let off = lba as usize * 512;
        assert!(image[off..off + len] == pattern(len, i as u8), "rbd export at byte {off} differs");
    }
}

#[test]
fn nvme_tcp_write_zeroes_deallocate_and_compare_on_rbd() {
    let Some(conf) = cluster() else { return };
    let img = TestImage::new(&conf, "cmds");
    let mut d = nvme_daemon("cmds", &img, 4096);
    block_on(bounded(60, async {
        let mut c = Controller::connect(d.addr, NQN, HOST, opts()).await.expect("connect");
        let data = pattern(4 * 4096, 3);
        c.write(0, 1, 16, data.clone()).await.expect("write");
        c.write_zeroes(0, 1, 17, 2).await.expect("write zeroes");
        let got = c.read(0, 1, 16, 4).await.expect("read");
        assert!(got[..4096] == data[..4096], "block before the zeroed range kept");
        assert!(got[4096..3 * 4096].iter().all(|&b| b == 0), "zeroed blocks read zero");
        assert!(got[3 * 4096..] == data[3 * 4096..], "block after the zeroed range kept");

        // Compare: equal succeeds, different is Compare Failure.
        c.compare(1, 1, 16, got[..4096].to_vec()).await.expect("compare equal");
        let e = c.compare(1, 1, 16, pattern(4096, 99)).await.expect_err("compare different");
        assert_eq!(code(&e), Status::COMPARE_FAILURE.0, "{e}");

        // A whole 4 MiB object deallocated reads zero (librbd removes it).
        let obj = (4 << 20) / 4096;
        c.write(0, 1, obj, pattern(4096, 5)).await.expect("write");
        c.deallocate(0, 1, &[(obj, 1024)]).await.expect("deallocate");
        assert!(c.read(0, 1, obj, 1).await.expect("read").iter().all(|&b| b == 0), "deallocated object");
    }));
    d.assert_alive();
}

fn iscsi_daemon(tag: &str, img: &TestImage, block_size: u32) -> Daemon {
    let device = img.device(block_size);
    Daemon::start_with(&format!("rbd-{tag}"), move |_, port| {
        format!(
            "{device}\n[[iscsi_target]]\niqn = \"{IQN}\"\nallow_any_initiator = true\n[[iscsi_target.lun]]\n\
             lun = 0\ndevice = \"ceph\"\n\n[[port]]\ntransport = \"iscsi\"\naddress = \"127.0.0.1:{port}\"\n\n\
             [reactor]\ncores = [0]\n"
        )
    })
}

/// COMPARE AND WRITE (16) of one block at `lba`.
fn compare_and_write16(lba: u64) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x89;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[13] = 1;
    c
}

#[test]
fn iscsi_compare_and_write_on_rbd_writes_only_on_a_match() {
    let Some(conf) = cluster() else { return };
    let img = TestImage::new(&conf, "caw");
    let mut d = iscsi_daemon("caw", &img, 512);
    let (old, new, other) = (pattern(512, 1), pattern(512, 2), pattern(512, 3));
    block_on(bounded(60, async {
        let mut s = Session::connect(d.addr, LoginOptions::new(INITIATOR, Some(IQN))).await.expect("login");
        s.write16(0, 5, 512, old.clone()).await.expect("write");
        let r = s.scsi(0, &compare_and_write16(5), [old.clone(), new.clone()].concat(), 0).await.expect("caw");
        r.check().expect("a matching COMPARE AND WRITE succeeds");
        // `old` is stale now: MISCOMPARE, and nothing written.
        let r = s.scsi(0, &compare_and_write16(5), [old.clone(), other.clone()].concat(), 0).await.expect("caw");
        let sense = r.sense_code().expect("sense for the miscompare");
        assert_eq!((sense.key, sense.asc), (0x0e, 0x1d), "MISCOMPARE DURING VERIFY OPERATION");
        assert!(s.read16(0, 5, 1, 512).await.expect("read") == new, "only the matching one wrote");
        s.logout().await.expect("logout");
    }));
    d.assert_alive();
    drop(d);
    assert!(img.export()[5 * 512..6 * 512] == new[..], "the image holds the compared-and-written block");
}

#[test]
fn iscsi_writes_land_in_the_rbd_image() {
    let Some(conf) = cluster() else { return };
    let img = TestImage::new(&conf, "iscsi");
    let mut d = iscsi_daemon("iscsi", &img, 4096);
    let writes = [(0u64, 4096usize), (3, 256 << 10), (1023, 8192)];
    block_on(bounded(60, async {
        let mut s = Session::connect(d.addr, LoginOptions::new(INITIATOR, Some(IQN))).await.expect("login");
        let cap = s.read_capacity16(0).await.expect("read capacity");
        assert_eq!((cap.block_len, cap.blocks), (4096, (IMAGE_BYTES / 4096) as u64), "size from the image");
        for (i, &(lba, len)) in writes.iter().enumerate() {
            s.write16(0, lba, 4096, pattern(len, 40 + i as u8)).await.unwrap_or_else(|e| panic!("write {lba}: {e}"));
        }
        // SYNCHRONIZE CACHE (10) of the whole LUN.
        s.scsi(0, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], Vec::new(), 0)
            .await
            .expect("synchronize cache")
            .check()
            .expect("synchronize cache status");
        for (i, &(lba, len)) in writes.iter().enumerate() {
            let got = s.read16(0, lba, (len / 4096) as u32, 4096).await.expect("read");
            assert!(got == pattern(len, 40 + i as u8), "read back at lba {lba} differs");
        }
        s.scsi(0, &cdb::test_unit_ready(), Vec::new(), 0).await.expect("tur").check().expect("tur status");
        s.logout().await.expect("logout");
    }));
    d.assert_alive();
    drop(d);
    let image = img.export();
    for (i, &(lba, len)) in writes.iter().enumerate() {
        let off = lba as usize * 4096;
        assert!(image[off..off + len] == pattern(len, 40 + i as u8), "rbd export at byte {off} differs");
    }
}

#[test]
fn serve_fails_naming_the_monitors_when_the_cluster_is_unreachable() {
    // Needs librbd only: nothing listens on the monitor address.
    if cluster().is_none() && !Path::new("/usr/lib/x86_64-linux-gnu/librbd.so.1").exists() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ironwire-rbd-unreachable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let conf = dir.join("ceph.conf");
    std::fs::write(&conf, "[global]\nmon host = 127.0.0.1:9\nauth client required = none\n").expect("ceph.conf");
    let cfg = dir.join("ironwire.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[device]]\nname = \"gone\"\nkind = \"rbd\"\npool = \"rbd\"\nimage = \"x\"\nceph_conf = \"{}\"\n\
             connect_timeout = 2\n\n[[port]]\naddress = \"127.0.0.1:0\"\n",
            conf.display()
        ),
    )
    .expect("config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ironwire"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ironwire");
    // Bounded: the daemon must give up on its own (connect_timeout = 2 s);
    // the bound only keeps a hang from stalling the suite.
    let mut status = None;
    for _ in 0..600 {
        if let Some(s) = child.try_wait().expect("wait") {
            status = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("serve did not give up on an unreachable cluster");
    }
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err).expect("stderr");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!status.expect("exited").success(), "serve must fail; stderr:\n{err}");
    assert!(err.contains("127.0.0.1:9") && err.contains("gone"), "the error names the device and monitors:\n{err}");
}
