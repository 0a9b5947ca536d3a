//! iSCSI session reinstatement against the real daemon (RFC 7143 sections
//! 5.3.5 and 6.3.5): a login with the initiator name and ISID of a live
//! session and TSIH 0 ends that session (its connection closed, its tasks
//! finished or cancelled, its nexus and reservations released) before the
//! new login is answered. A different ISID is another session.

mod common;

use common::{block_on, bounded, toml, Daemon};
use initiator::iscsi::{cdb, LoginOptions, Session};
use std::time::Duration;

const TARGET: &str = "iqn.2026-11.io.ironwire.test:reinstate";
const HOST: &str = "iqn.2026-11.io.ironwire.test:host";
const OTHER_HOST: &str = "iqn.2026-11.io.ironwire.test:other";
const BLOCK: u32 = 512;
const ISID: [u8; 6] = [0x80, 0x12, 0x34, 0x56, 0x78, 0x9a];

/// How long the slow device holds each write.
const HOLD: Duration = Duration::from_millis(400);
/// Long enough for a command to reach the target and start its I/O.
const SETTLE: Duration = Duration::from_millis(50);

/// LUN 0: writes are slow. LUN 1: a plain RAM disk. Every reactor the
/// machine has, so the old and the new connection may land on different
/// threads.
fn start(tag: &str) -> Daemon {
    let hold = HOLD.as_micros();
    Daemon::start_with(&format!("iscsi-reinstate-{tag}"), |_, port| {
        format!(
            "{}{}{}{}",
            toml::ram("slow-writes", 0, hold),
            toml::ram("fast", 0, 0),
            toml::iscsi_target(TARGET, &["slow-writes", "fast"]),
            toml::iscsi_port(port)
        )
    })
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..BLOCK as usize).map(|i| (i as u8).wrapping_mul(29) ^ seed).collect()
}

async fn login(d: &Daemon, host: &str, isid: Option<[u8; 6]>) -> Session {
    let mut opts = LoginOptions::new(host, Some(TARGET));
    if let Some(isid) = isid {
        opts.isid = isid;
    }
    let mut s = Session::connect(d.addr, opts).await.expect("login");
    s.clear_unit_attentions(0).await.expect("LUN 0 ready");
    s.clear_unit_attentions(1).await.expect("LUN 1 ready");
    s
}

/// The iSCSI sessions `ctl sessions --json` lists: (ISID, TSIH).
fn sessions(d: &Daemon) -> Vec<(String, u64)> {
    let out = d.ctl("sessions --json").expect("ctl sessions");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let list = v["iscsi"].as_array().expect("iscsi sessions").clone();
    let mut s: Vec<(String, u64)> = list
        .iter()
        .map(|s| (s["isid"].as_str().unwrap_or_default().to_string(), s["tsih"].as_u64().unwrap_or_default()))
        .collect();
    s.sort();
    s
}

fn isid_hex(isid: [u8; 6]) -> String {
    format!("0x{}", isid.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

#[test]
fn reinstating_login_is_answered_after_the_old_write_and_leaves_one_session() {
    let d = start("write");
    block_on(bounded(30, async {
        let mut old = login(&d, HOST, Some(ISID)).await;
        old.write16(0, 0, BLOCK, pattern(0xa0)).await.expect("write A");
        // A write the device holds, still running when the login comes.
        old.submit(0, &cdb::write16(0, 1), pattern(0xb0), 0).expect("submit B");
        old.flush().await.expect("send B");
        reactor::sleep(SETTLE).await;

        let mut new = login(&d, HOST, Some(ISID)).await;
        assert_ne!(new.tsih(), old.tsih(), "a new session gets a new TSIH");
        // The target closed the old session's connection.
        old.wait_closed().await.expect("the old connection is closed");
        // The old write was over before the login was answered: the new
        // session reads it at once, and the block no longer changes.
        let first = new.read16(0, 0, 1, BLOCK).await.expect("read");
        assert!(first == pattern(0xb0), "the new session read the block before the old session's write landed");
        assert_eq!(sessions(&d), vec![(isid_hex(ISID), u64::from(new.tsih()))]);
        reactor::sleep(HOLD * 2).await;
        assert!(new.read16(0, 0, 1, BLOCK).await.expect("read") == first, "the block changed after the login");

        // Another ISID of the same initiator is a second session.
        let mut second = login(&d, HOST, None).await;
        assert_eq!(sessions(&d).len(), 2);
        second.write16(1, 8, BLOCK, pattern(0xc0)).await.expect("write on the second session");
        assert!(new.read16(1, 8, 1, BLOCK).await.expect("read") == pattern(0xc0));
        new.test_unit_ready(0).await.expect("the reinstated session still works");
    }));
    assert!(d.log().contains("reinstates its session"), "{}", d.log());
}

#[test]
fn reinstatement_releases_the_old_sessions_reservation() {
    let d = start("reserve");
    block_on(bounded(30, async {
        let mut holder = login(&d, HOST, Some(ISID)).await;
        let mut other = login(&d, OTHER_HOST, None).await;
        let reserve6 = [0x16u8, 0, 0, 0, 0, 0];
        holder.scsi(1, &reserve6, Vec::new(), 0).await.expect("RESERVE").check().expect("reserved");
        let conflict = other.scsi(1, &cdb::write16(0, 1), pattern(1), 0).await.expect("write");
        assert_eq!(conflict.status, 0x18, "RESERVATION CONFLICT while the reservation is held");

        // The holder's initiator comes back with the same ISID: its old
        // I_T nexus is lost, and with it the SPC-2 reservation.
        let mut back = login(&d, HOST, Some(ISID)).await;
        holder.wait_closed().await.expect("the old connection is closed");
        other.clear_unit_attentions(1).await.expect("LUN 1 ready");
        other.write16(1, 0, BLOCK, pattern(2)).await.expect("the reservation is gone");
        assert!(back.read16(1, 0, 1, BLOCK).await.expect("read") == pattern(2));
        assert_eq!(sessions(&d).len(), 2);
    }));
}
