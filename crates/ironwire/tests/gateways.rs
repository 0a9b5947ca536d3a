//! Several gateways, one namespace (docs/ceph.md, "Several gateways"): two
//! `ironwire serve` processes export the same storage under one subsystem
//! NQN and NSID. A host connected to both sees one shared namespace
//! (identical NGUID, EUI-64 and UUID; NMIC shared, CMIC multi-controller
//! with ANA), controller IDs from each gateway's own range, and each
//! gateway's ANA state; `ctl set namespace ... ana_state=` on one gateway
//! reaches the host as an ANA change event and in the ANA log page, and
//! I/O there is answered with the path-related ANA status while the other
//! gateway serves it. For iSCSI, the same image reports the same device
//! identification (VPD 0x83, 0x80) through every gateway. Every wait is
//! bounded.

mod common;

use common::{block_on, bounded, Daemon};
use initiator::iscsi::{LoginOptions, Session};
use initiator::{cmd, Controller, Options, Status};
use nvme_spec::opcode::{Cns, FeatureId};
use std::path::{Path, PathBuf};
use std::process::Command;

const NQN: &str = "nqn.2026-11.io.ironwire:gw";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:gw-host";

/// A gateway exporting `device` (a `[[device]]` table, name `name`) as
/// namespace 1, handing out controller IDs `cntlids`, in `ana_state`.
fn gateway(tag: &str, name: &str, device: String, cntlids: (u16, u16), ana_state: &str) -> Daemon {
    let (name, ana_state) = (name.to_string(), ana_state.to_string());
    Daemon::start_with(&format!("gw-{tag}"), move |_, port| {
        format!(
            "{device}\n[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\nmin_cntlid = {}\nmax_cntlid = {}\n\
             [[subsystem.namespace]]\ndevice = \"{name}\"\nana_state = \"{ana_state}\"\n\n\
             [[port]]\naddress = \"127.0.0.1:{port}\"\n\n[reactor]\ncores = [0]\n",
            cntlids.0, cntlids.1
        )
    })
}

fn ctl(d: &Daemon, words: &str) {
    if let Err(e) = d.ctl(words) {
        panic!("ctl {words}: {e}\nlog:\n{}", d.log());
    }
}

fn opts() -> Options {
    Options { io_queues: 1, queue_size: 32, ..Options::default() }
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// What a host groups paths by: the EUI-64, NGUID and UUID descriptors.
async fn identifiers(c: &mut Controller) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let raw = c.admin_command(cmd::identify(Cns::NS_DESCRIPTORS, 1), Vec::new(), 4096).await.expect("descriptors").data;
    let (mut eui, mut nguid, mut uuid) = (Vec::new(), Vec::new(), Vec::new());
    let mut at = 0;
    while at + 4 <= raw.len() && raw[at] != 0 {
        let len = usize::from(raw[at + 1]);
        let value = raw[at + 4..at + 4 + len].to_vec();
        match raw[at] {
            1 => eui = value,
            2 => nguid = value,
            3 => uuid = value,
            _ => {}
        }
        at += 4 + len;
    }
    assert_eq!((eui.len(), nguid.len(), uuid.len()), (8, 16, 16), "EUI-64, NGUID and UUID descriptors");
    (eui, nguid, uuid)
}

/// Group 1's ANA state in the ANA log page, after checking the page lists
/// namespace 1 in it.
async fn ana_log_state(c: &mut Controller) -> (u64, u8) {
    let log = c.get_log_page(0x0c, 4096, 0).await.expect("ANA log page");
    assert_eq!(u16::from_le_bytes([log[8], log[9]]), 1, "one ANA group");
    assert_eq!((le32(&log, 16), le32(&log, 20), le32(&log, 48)), (1, 1, 1), "group 1 holds namespace 1");
    (u64::from_le_bytes(log[0..8].try_into().expect("8")), log[32])
}

/// Connects to both gateways and checks they show one shared namespace;
/// returns the two controllers.
async fn one_namespace_two_paths(a: &Daemon, b: &Daemon) -> (Controller, Controller) {
    let mut ca = Controller::connect(a.addr, NQN, HOST, opts()).await.expect("connect to gateway a");
    let mut cb = Controller::connect(b.addr, NQN, HOST, opts()).await.expect("connect to gateway b");
    assert!((1..=99).contains(&ca.cntlid()), "gateway a's range: {}", ca.cntlid());
    assert!((100..=199).contains(&cb.cntlid()), "gateway b's range: {}", cb.cntlid());
    for c in [&ca, &cb] {
        let raw = &c.identity().raw;
        assert_eq!(raw[76], 0x0b, "CMIC: multi-port, multi-controller, ANA reporting");
        assert_eq!(&raw[768..768 + NQN.len()], NQN.as_bytes());
    }
    assert_eq!(ca.identity().serial, cb.identity().serial, "one subsystem, one serial");
    let ids_a = identifiers(&mut ca).await;
    let ids_b = identifiers(&mut cb).await;
    assert_eq!(ids_a, ids_b, "EUI-64, NGUID and UUID match on both gateways");
    let ns = ca.identify_namespace(1).await.expect("identify namespace");
    assert_eq!(ns.raw[30], 1, "NMIC: shared");
    assert_eq!(le32(&ns.raw, 92), 1, "ANA group 1");
    assert_eq!(&ns.raw[104..120], &ids_a.1[..], "Identify Namespace NGUID");
    (ca, cb)
}

/// The host's view while gateway a's namespace goes inaccessible: the ANA
/// change event, the log page, the path status, the other path serving.
async fn fail_over(a: &Daemon, ca: &mut Controller, cb: &mut Controller) {
    assert_eq!(ana_log_state(ca).await, (0, 1), "gateway a: optimized, no change yet");
    assert_eq!(ana_log_state(cb).await.1, 2, "gateway b: non-optimized");
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    ca.write(0, 1, 8, data.clone()).await.expect("write through the optimized path");

    ca.admin_command(cmd::set_features(FeatureId::ASYNC_EVENT_CONFIG, 1 << 11), Vec::new(), 0).await.expect("AEC");
    let aer = nvme_spec::Sqe { opcode: nvme_spec::opcode::Admin::ASYNC_EVENT_REQUEST.0, ..Default::default() };
    ca.admin().submit(aer, Vec::new(), 0).expect("post an AER");
    ca.admin().flush().await.expect("send the AER");
    ctl(a, &format!("set namespace nqn={NQN} nsid=1 ana_state=inaccessible"));
    let ev = ca.admin().next_completion().await.expect("the ANA change event");
    assert!(ev.cqe.status().is_success());
    assert_eq!(ev.cqe.dw0.get(), 0x02 | (0x03 << 8) | (0x0c << 16), "notice: ANA change, log page 0Ch");
    assert_eq!(ana_log_state(ca).await, (1, 3), "gateway a: inaccessible, change count 1");

    let e = ca.read(0, 1, 8, 8).await.expect_err("I/O on an inaccessible path");
    let st = e.status().expect("an NVMe status");
    assert_eq!(st.0 & !Status::DNR_BIT, Status::ANA_INACCESSIBLE.0, "{e}");
    assert_eq!(st.0 & Status::DNR_BIT, 0, "no DNR: the host retries on another path");
    assert_eq!(cb.read(0, 1, 8, 8).await.expect("read through gateway b"), data, "the other path reads the data");
}

/// Namespace 1's ANA group and state as `ctl show` and `ctl show --json`
/// print them; asserts the two agree.
fn shown_ana(d: &Daemon) -> (u64, String) {
    let text = d.ctl("show").expect("ctl show");
    let line = text.lines().find(|l| l.trim_start().starts_with("namespace 1 ")).expect("namespace 1 in ctl show");
    let field = |key: &str| {
        line.split_whitespace().find_map(|w| w.strip_prefix(key)).unwrap_or_else(|| panic!("{key} in {line:?}"))
    };
    let json: serde_json::Value = serde_json::from_str(&d.ctl("show --json").expect("ctl show --json")).expect("JSON");
    let ns = &json["live"]["subsystems"][0]["namespaces"][0];
    let (group, state) = (ns["ana_group"].as_u64().expect("ana_group"), ns["ana_state"].as_str().expect("ana_state"));
    assert_eq!(
        (field("ana_group=").to_string(), field("ana_state=")),
        (group.to_string(), state),
        "text and JSON agree"
    );
    (group, state.to_string())
}

/// Each gateway's `ctl show` names the ANA state it serves: a's after the
/// fail-over, b's as configured.
fn assert_shown_after_fail_over(a: &Daemon, b: &Daemon) {
    assert_eq!(shown_ana(a), (1, "inaccessible".to_string()), "gateway a after ctl set ana_state");
    assert_eq!(shown_ana(b), (1, "non-optimized".to_string()), "gateway b as configured");
}

#[test]
fn two_gateways_on_one_file_show_one_namespace_and_fail_over_by_ana_state() {
    let dir = std::env::temp_dir().join(format!("ironwire-gw-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path: PathBuf = dir.join("shared.img");
    // Both gateways open the same file under the same device name: a
    // local device's identifiers come from the NQN, NSID and that name.
    let device =
        format!("[[device]]\nname = \"shared\"\nkind = \"file\"\npath = \"{}\"\nsize = \"4MiB\"\n", path.display());
    let a = gateway("fa", "shared", device.clone(), (1, 99), "optimized");
    let b = gateway("fb", "shared", device, (100, 199), "non-optimized");
    assert_eq!(shown_ana(&a), (1, "optimized".to_string()), "gateway a as configured");
    block_on(bounded(60, async {
        let (mut ca, mut cb) = one_namespace_two_paths(&a, &b).await;
        fail_over(&a, &mut ca, &mut cb).await;
    }));
    assert_shown_after_fail_over(&a, &b);
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh 16 MiB image with the features docs/ceph.md recommends for
/// several gateways (layering only: no exclusive-lock). Left for
/// `scripts/test` to destroy with the cluster, as in rbd.rs.
fn image(conf: &Path, tag: &str) -> String {
    let name = format!("ironwire-gw{tag}-{}", std::process::id());
    let out = Command::new("timeout")
        .args(["60", "rbd", "-c"])
        .arg(conf)
        .args(["create", "--size", "16M", "--image-feature", "layering", &format!("rbd/{name}")])
        .output()
        .expect("run the rbd CLI");
    assert!(out.status.success(), "rbd create: {}", String::from_utf8_lossy(&out.stderr));
    name
}

#[test]
fn two_gateways_on_one_rbd_image_show_one_namespace_whatever_they_call_it() {
    let Some(conf) = rbd::test_cluster() else { return };
    let name = image(&conf, "");
    // The gateways give the device different names: the identifiers come
    // from the cluster fsid and the image id alone.
    let device = |dev: &str| {
        format!(
            "[[device]]\nname = \"{dev}\"\nkind = \"rbd\"\npool = \"rbd\"\nimage = \"{name}\"\n\
             ceph_conf = \"{}\"\nconnect_timeout = 10\n",
            conf.display()
        )
    };
    let a = gateway("ra", "ceph-a", device("ceph-a"), (1, 99), "optimized");
    let b = gateway("rb", "ceph-b", device("ceph-b"), (100, 199), "non-optimized");
    block_on(bounded(90, async {
        let (mut ca, mut cb) = one_namespace_two_paths(&a, &b).await;
        fail_over(&a, &mut ca, &mut cb).await;
    }));
    assert_shown_after_fail_over(&a, &b);
}

/// INQUIRY of vital product data page `page`.
fn inquiry_vpd(page: u8) -> [u8; 6] {
    [0x12, 1, page, 0x04, 0x00, 0]
}

/// The logical unit's designators (association 0) of a VPD 0x83 page; the
/// target port and target device ones name each gateway's own target.
fn lu_designators(page: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = 4;
    while at + 4 <= page.len() {
        let len = usize::from(page[at + 3]);
        let d = &page[at..(at + 4 + len).min(page.len())];
        if (page[at + 1] >> 4) & 3 == 0 {
            out.push(d.to_vec());
        }
        at += 4 + len;
    }
    out
}

/// One gateway's iSCSI view of an rbd image: VPD 0x83 and 0x80 of the
/// image, exported as LUN `lun` of `iqn` under the device name `dev`.
fn iscsi_view(tag: &str, conf: &Path, image: &str, dev: &str, iqn: &str, lun: u64) -> (Daemon, Vec<u8>, Vec<u8>) {
    let (conf, image, dev, iqn) = (conf.display().to_string(), image.to_string(), dev.to_string(), iqn.to_string());
    let d = Daemon::start_with(&format!("gw-{tag}"), {
        let iqn = iqn.clone();
        move |_, port| {
            format!(
                "[[device]]\nname = \"{dev}\"\nkind = \"rbd\"\npool = \"rbd\"\nimage = \"{image}\"\n\
                 ceph_conf = \"{conf}\"\nconnect_timeout = 10\n\n[[iscsi_target]]\niqn = \"{iqn}\"\n\
                 allow_any_initiator = true\n[[iscsi_target.lun]]\nlun = {lun}\ndevice = \"{dev}\"\n\n\
                 [[port]]\ntransport = \"iscsi\"\naddress = \"127.0.0.1:{port}\"\n\n[reactor]\ncores = [0]\n"
            )
        }
    });
    let (p83, p80) = block_on(bounded(60, async {
        let opts = LoginOptions::new("iqn.2026-11.io.ironwire:gw-initiator", Some(&iqn));
        let mut s = Session::connect(d.addr, opts).await.expect("login");
        let p83 =
            s.scsi(lun, &inquiry_vpd(0x83), Vec::new(), 1024).await.expect("VPD 0x83").check().expect("good").data;
        let p80 =
            s.scsi(lun, &inquiry_vpd(0x80), Vec::new(), 1024).await.expect("VPD 0x80").check().expect("good").data;
        s.logout().await.expect("logout");
        (p83, p80)
    }));
    (d, p83, p80)
}

#[test]
fn two_iscsi_gateways_on_one_rbd_image_report_the_same_device_identification() {
    let Some(conf) = rbd::test_cluster() else { return };
    let name = image(&conf, "-iscsi");
    // Other target names, LUNs and device names on each gateway: dm-multipath
    // groups paths by VPD 0x83, which must come from the image alone.
    let (a, a83, a80) = iscsi_view("ia", &conf, &name, "ceph-a", "iqn.2026-11.io.ironwire:gw-a", 0);
    let (b, b83, b80) = iscsi_view("ib", &conf, &name, "ceph-b", "iqn.2026-11.io.ironwire:gw-b", 3);
    assert_eq!(a83[1], 0x83, "a VPD 0x83 page: {a83:02x?}");
    let (a_lu, b_lu) = (lu_designators(&a83), lu_designators(&b83));
    assert!(a_lu.iter().any(|d| d[1] & 0x0f == 3), "an NAA designator for the logical unit: {a83:02x?}");
    assert_eq!(a_lu, b_lu, "the logical unit's VPD 0x83 designators through both gateways");
    assert_ne!(a83, b83, "the target port designators name each gateway's target");
    assert_eq!(a80, b80, "unit serial number through both gateways");
    // A second image is another logical unit.
    let other = image(&conf, "-iscsi-other");
    let (c, c83, _) = iscsi_view("ic", &conf, &other, "ceph-a", "iqn.2026-11.io.ironwire:gw-a", 0);
    assert_ne!(a_lu, lu_designators(&c83), "another image has its own identification");
    for mut d in [a, b, c] {
        d.assert_alive();
    }
}
