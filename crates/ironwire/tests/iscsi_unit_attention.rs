//! Unit attentions across iSCSI session reinstatement, against the real
//! daemon.

mod common;

use common::{block_on, bounded, toml, Daemon};
use initiator::iscsi::{cdb, LoginOptions, Session};

const TARGET: &str = "iqn.2026-11.io.ironwire.test:ua";
const HOST: &str = "iqn.2026-11.io.ironwire.test:host-a";
const OTHER_HOST: &str = "iqn.2026-11.io.ironwire.test:host-b";
const ISID: [u8; 6] = [0x80, 0x12, 0x34, 0x56, 0x78, 0x9b];
/// LUNs 0 and 1 on RAM disks.
fn start(tag: &str) -> Daemon {
    Daemon::start_with(&format!("iscsi-ua-{tag}"), |_, port| {
        format!(
            "{}{}{}{}",
            toml::ram("r0", 0, 0),
            toml::ram("r1", 0, 0),
            toml::iscsi_target(TARGET, &["r0", "r1"]),
            toml::iscsi_port(port)
        )
    })
}

async fn connect(d: &Daemon, host: &str, isid: Option<[u8; 6]>) -> Session {
    let mut opts = LoginOptions::new(host, Some(TARGET));
    if let Some(isid) = isid {
        opts.isid = isid;
    }
    Session::connect(d.addr, opts).await.expect("login")
}

/// SAM-5 5.14 / 6.3.4: a unit attention persists for its I_T nexus until
/// reported, and an I_T nexus loss establishes I_T NEXUS LOSS OCCURRED
/// (29h/07h) for it. The I_T nexus of iSCSI is (InitiatorName + ISID,
/// TargetName + TPGT): an initiator that reinstates its session (same
/// name and ISID, TSIH 0, RFC 7143 6.3.5) is the same nexus. Here another
/// initiator's LUN RESET queues BUS DEVICE RESET for A's nexus; A's
/// session is then reinstated before its next command. The new session's
/// first command must meet that unit attention (before, the session's end
/// dropped it, and the reset went unreported).
#[test]
fn reinstated_session_still_learns_of_a_reset_it_had_not_seen() {
    let d = start("ua");
    block_on(bounded(30, async {
        let mut a = connect(&d, HOST, Some(ISID)).await;
        a.clear_unit_attentions(1).await.expect("LUN 1 ready");
        let mut b = connect(&d, OTHER_HOST, None).await;
        b.clear_unit_attentions(1).await.expect("LUN 1 ready");
        // Control: a third nexus that stays logged in.
        let mut c = connect(&d, HOST, Some([0x80, 0, 0, 0, 0, 0x77])).await;
        c.clear_unit_attentions(1).await.expect("LUN 1 ready");
        // LOGICAL UNIT RESET of LUN 1 by B: A's nexus gets a unit attention.
        assert_eq!(b.task_mgmt(5, 1, 0xffff_ffff).await.expect("LUN reset"), 0);
        let r = c.scsi(1, &cdb::test_unit_ready(), Vec::new(), 0).await.expect("TUR");
        assert!(r.status == 0x02 && r.sense_code().is_some_and(|s| s.key == 0x06), "control nexus saw the reset");

        // A's initiator loses its connection and logs in again with the
        // same ISID (session reinstatement).
        let mut a2 = connect(&d, HOST, Some(ISID)).await;
        a.wait_closed().await.expect("the old connection is closed");
        let r = a2.scsi(1, &cdb::test_unit_ready(), Vec::new(), 0).await.expect("TUR");
        let sense = r.sense_code();
        assert!(
            r.status == 0x02 && sense.is_some_and(|s| s.key == 0x06 && s.asc == 0x29),
            "first command after reinstatement: status {:#04x}, sense {:?}; expected UNIT ATTENTION 29h/xx",
            r.status,
            sense.map(|s| s.to_string())
        );
    }));
}
