//! iSCSI LUNs added and removed with `ironwire ctl` while sessions are
//! logged in (docs/ctl.md): each session's I_T nexus gets REPORTED LUNS
//! DATA HAS CHANGED (06/3F/0E) once, on its next command other than
//! INQUIRY, REPORT LUNS or REQUEST SENSE (SAM-5 5.14), and a REPORT LUNS
//! clears it (SPC-4 6.33); REPORT LUNS lists the new set; I/O to the other
//! LUNs goes on; removing a LUN with a write in flight returns once that
//! write is answered and on the device. Our initiator's iSCSI host, real
//! sockets on loopback, every wait bounded.

mod common;

use common::iscsi_raw::Raw;
use common::{block_on, bounded, Daemon};
use initiator::iscsi::{cdb, LoginOptions, ScsiResult, SenseCode, Session};
use std::net::SocketAddr;
use std::path::Path;

const IQN: &str = "iqn.2026-11.io.ironwire:luns";
const BS: u32 = 4096;
/// Added to every write of the file device behind LUN 1.
const SLOW_WRITE_MS: u64 = 300;

/// LUN 0 on RAM, LUN 1 on a file whose writes take `SLOW_WRITE_MS`, and a
/// second RAM device not exported yet; ctl may add and remove LUNs.
fn config(dir: &Path, port: u16) -> String {
    format!(
        "[[device]]\nname = \"r0\"\nkind = \"ram\"\nsize = \"1MiB\"\nblock_size = {BS}\n\n\
         [[device]]\nname = \"slow\"\nkind = \"file\"\npath = \"{}\"\nsize = \"1MiB\"\nblock_size = {BS}\n\
         write_latency_us = {}\n\n\
         [[device]]\nname = \"r2\"\nkind = \"ram\"\nsize = \"1MiB\"\nblock_size = {BS}\n\n\
         [[iscsi_target]]\niqn = \"{IQN}\"\nallow_any_initiator = true\n\
         [[iscsi_target.lun]]\nlun = 0\ndevice = \"r0\"\n[[iscsi_target.lun]]\nlun = 1\ndevice = \"slow\"\n\n\
         [[port]]\ntransport = \"iscsi\"\naddress = \"127.0.0.1:{port}\"\n\n[reactor]\ncores = [0]\n",
        dir.join("slow.img").display(),
        SLOW_WRITE_MS * 1000
    )
}

async fn login(addr: SocketAddr, initiator: &str) -> Session {
    let mut s = Session::connect(addr, LoginOptions::new(initiator, Some(IQN))).await.expect("login");
    assert_eq!(s.clear_unit_attentions(0).await.expect("TEST UNIT READY"), 0, "a new session starts clean");
    s
}

fn block(seed: u8) -> Vec<u8> {
    (0..BS as usize).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

const REPORTED_LUNS_CHANGED: SenseCode = SenseCode { key: 0x6, asc: 0x3F, ascq: 0x0E };
const LUN_NOT_SUPPORTED: SenseCode = SenseCode { key: 0x5, asc: 0x25, ascq: 0x00 };

fn sense(r: &ScsiResult) -> Option<SenseCode> {
    (!r.is_good()).then(|| r.sense_code()).flatten()
}

async fn read(s: &mut Session, lun: u64, lba: u64) -> ScsiResult {
    s.scsi(lun, &cdb::read16(lba, 1), Vec::new(), BS).await.expect("READ (16) answered")
}

#[test]
fn luns_change_under_logged_in_sessions_with_one_unit_attention_per_nexus() {
    let d = Daemon::start_with("iscsi-luns", config);
    let addr = d.addr;
    block_on(bounded(60, async {
        let mut a = login(addr, "iqn.2026-11.io.test:a").await;
        let mut b = login(addr, "iqn.2026-11.io.test:b").await;
        a.write16(0, 3, BS, block(1)).await.expect("write LUN 0");
        assert_eq!(a.report_luns().await.expect("REPORT LUNS"), [0, 1]);

        // Add LUN 2 under both sessions.
        d.ctl(&format!("add lun iqn={IQN} lun=2 device=r2")).expect("ctl add lun with sessions logged in");
        // Session a: its next command (to LUN 0, unchanged) gets the unit
        // attention, once; the retry and every later command run.
        let r = read(&mut a, 0, 3).await;
        assert_eq!(sense(&r), Some(REPORTED_LUNS_CHANGED), "a's first command after the change");
        let r = read(&mut a, 0, 3).await;
        assert!(r.is_good(), "a: the retry runs: {:?}", r.sense_code());
        assert_eq!(r.data, block(1), "LUN 0's data is undisturbed");
        a.test_unit_ready(1).await.expect("a: no second unit attention on another LUN");
        assert_eq!(a.report_luns().await.expect("REPORT LUNS"), [0, 1, 2]);
        a.write16(2, 0, BS, block(2)).await.expect("a writes the new LUN 2");
        // Session b: REPORT LUNS is never answered with the unit attention
        // and clears it, so b's I/O after it runs at once.
        assert_eq!(b.report_luns().await.expect("b: REPORT LUNS"), [0, 1, 2]);
        assert_eq!(b.read16(2, 0, 1, BS).await.expect("b reads LUN 2"), block(2));
        assert_eq!(b.read16(0, 3, 1, BS).await.expect("b reads LUN 0"), block(1));

        // Remove LUN 1 while a write to it is in flight: ctl returns once
        // the write is answered, and the write is on the file.
        let itt = a.submit(1, &cdb::write16(5, 1), block(3), 0).expect("submit a write to LUN 1");
        a.flush().await.expect("send the write");
        let sock = d.dir.join("ctl.sock");
        let remover = std::thread::spawn(move || {
            // Waits until the target runs the write (`busy` in show --json).
            let busy = || {
                let v: serde_json::Value =
                    serde_json::from_str(&common::ctl(&sock, &["show", "--json"]).expect("show")).expect("JSON");
                v["live"]["iscsi_targets"][0]["luns"][1]["busy"].as_u64()
            };
            for tries in 0.. {
                match busy() {
                    Some(1) => break,
                    _ if tries == 3000 => panic!("the write never showed as running on LUN 1"),
                    _ => std::thread::sleep(std::time::Duration::from_millis(10)),
                }
            }
            let r = common::ctl(&sock, &["remove", "lun", &format!("iqn={IQN}"), "lun=1"]);
            let on_file = std::fs::read(sock.with_file_name("slow.img")).expect("read the file");
            (r, on_file[5 * BS as usize..6 * BS as usize].to_vec())
        });
        let (done, r) = a.next_completion().await.expect("the in-flight write is answered");
        assert_eq!(done, itt);
        assert!(r.is_good(), "the write in flight at the removal succeeded: {:?}", r.sense_code());
        let (removed, on_file) = remover.join().expect("ctl thread");
        removed.expect("ctl remove lun with a write in flight");
        assert_eq!(on_file, block(3), "ctl returned before the write in flight reached the file");

        // Both nexuses learn it once; LUN 1 is gone; LUNs 0 and 2 serve.
        for (name, s) in [("a", &mut a), ("b", &mut b)] {
            let r = read(s, 0, 3).await;
            assert_eq!(sense(&r), Some(REPORTED_LUNS_CHANGED), "{name}: first command after the removal");
            let r = read(s, 1, 5).await;
            assert_eq!(sense(&r), Some(LUN_NOT_SUPPORTED), "{name}: the removed LUN");
            assert_eq!(s.report_luns().await.expect("REPORT LUNS"), [0, 2], "{name}");
            assert_eq!(s.read16(0, 3, 1, BS).await.expect("LUN 0"), block(1), "{name}");
            assert_eq!(s.read16(2, 0, 1, BS).await.expect("LUN 2"), block(2), "{name}");
        }
        a.logout().await.expect("logout a");
        b.logout().await.expect("logout b");
    }));
    let show: serde_json::Value = serde_json::from_str(&d.ctl("show --json").expect("show")).expect("JSON");
    let luns: Vec<u64> = show["live"]["iscsi_targets"][0]["luns"]
        .as_array()
        .expect("luns")
        .iter()
        .filter_map(|l| l["lun"].as_u64())
        .collect();
    assert_eq!(luns, [0, 2], "ctl show");
    assert!(d.log().contains(&format!("iSCSI target {IQN}: LUN 1 removed")), "log:\n{}", d.log());
}

/// A LUN removed, then its device: logged-in sessions that stay idle let
/// go of the device within their next tick, so its file closes (and an rbd
/// image's watch goes, which `rbd rm` waits for) while they stay logged in;
/// their next command still gets the unit attention.
#[test]
fn idle_sessions_let_go_of_a_removed_luns_device() {
    let d = Daemon::start_with("iscsi-luns-release", config);
    let file = d.dir.join("slow.img");
    let pid = d.pid();
    let open_fds = || common::open_fds(pid, &file);
    let addr = d.addr;
    block_on(bounded(60, async {
        let mut a = login(addr, "iqn.2026-11.io.test:a").await;
        let mut b = login(addr, "iqn.2026-11.io.test:b").await;
        a.write16(1, 5, BS, block(4)).await.expect("write LUN 1");
        assert_eq!(b.read16(1, 5, 1, BS).await.expect("read LUN 1"), block(4));
        assert!(open_fds() > 0, "the file device is open while exported");
        d.ctl(&format!("remove lun iqn={IQN} lun=1")).expect("ctl remove lun");
        d.ctl("remove device name=slow").expect("ctl remove device");
        let mut open = open_fds();
        for _ in 0..300 {
            if open == 0 {
                break;
            }
            reactor::sleep(std::time::Duration::from_millis(10)).await;
            open = open_fds();
        }
        assert_eq!(open, 0, "the removed LUN's device is still open under idle sessions");
        for (name, s) in [("a", &mut a), ("b", &mut b)] {
            let r = read(s, 0, 3).await;
            assert_eq!(sense(&r), Some(REPORTED_LUNS_CHANGED), "{name}: first command after the removal");
            assert!(read(s, 0, 3).await.is_good(), "{name}: LUN 0 serves on");
        }
        a.logout().await.expect("logout a");
        b.logout().await.expect("logout b");
    }));
}

/// Writes whose data is still on its way when their LUN's device is
/// replaced (`ctl set lun ... device=`) were meant for the old device:
/// each is answered with REPORTED LUNS DATA HAS CHANGED, not only the
/// session's first command after the change, and none lands on the new
/// device. A write sent after the change runs there.
#[test]
fn writes_whose_data_came_after_their_luns_device_changed_never_land_on_the_new_one() {
    let d = Daemon::start_with("iscsi-luns-replaced", config);
    let mut raw = Raw::login(&d, "iqn.2026-11.io.test:raw", IQN);
    let (cmd_sn, exp_stat_sn, _, _) = raw.host.sequence();
    for i in 0..2u32 {
        raw.announce_write(0x100 + i, 0, &cdb::write16(u64::from(i), 1), BS, cmd_sn.wrapping_add(i), exp_stat_sn);
    }
    let r2ts = raw.r2ts_until_ping(cmd_sn.wrapping_add(2), exp_stat_sn);
    assert_eq!(r2ts.iter().map(|r| r.0).collect::<Vec<_>>(), [0x100, 0x101], "both writes solicited");
    d.ctl(&format!("set lun iqn={IQN} lun=0 device=r2")).expect("ctl: LUN 0 on r2");
    for (i, &r2t) in r2ts.iter().enumerate() {
        raw.data_out(r2t, &block(7 + i as u8), exp_stat_sn);
    }
    for itt in [0x100, 0x101] {
        let (status, sense) = raw.response(itt);
        let code = SenseCode::parse(&sense);
        assert_eq!((status, code), (scsi::status::CHECK_CONDITION, Some(REPORTED_LUNS_CHANGED)), "ITT {itt:#x}");
    }
    block_on(bounded(30, async {
        let mut s = login(d.addr, "iqn.2026-11.io.test:check").await;
        assert_eq!(s.read16(0, 0, 2, BS).await.expect("read r2"), vec![0; 2 * BS as usize], "r2 was written");
        s.write16(0, 1, BS, block(9)).await.expect("a write sent after the change");
        assert_eq!(s.read16(0, 1, 1, BS).await.expect("read it back"), block(9));
        s.logout().await.expect("logout");
    }));
}
