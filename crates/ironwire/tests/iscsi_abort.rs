//! iSCSI task management against the real daemon with commands really in
//! flight: LUNs on devices that hold every read or write for a while
//! (`read_latency_us`, `write_latency_us`), so an abort arrives while the
//! I/O runs. An aborted command's late completion must never answer the
//! command that reuses its ITT, and nothing an aborted command does may
//! reach the device after the abort was answered (RFC 7143 4.2.3, 11.5).

mod common;

use common::{block_on, bounded, toml, Daemon};
use initiator::iscsi::{cdb, LoginOptions, Session};
use std::time::Duration;

const TARGET: &str = "iqn.2026-11.io.ironwire.test:slow";
const HOST: &str = "iqn.2026-11.io.ironwire.test:host";
const BLOCK: u32 = 512;

/// How long each slow device holds an I/O.
const HOLD: Duration = Duration::from_millis(400);
/// Long enough for a command to reach the target and start its I/O.
const SETTLE: Duration = Duration::from_millis(50);

const ABORT_TASK: u8 = 1;
const ABORT_TASK_SET: u8 = 2;
const CLEAR_TASK_SET: u8 = 4;
const LOGICAL_UNIT_RESET: u8 = 5;
const TARGET_WARM_RESET: u8 = 6;

/// LUN 0: reads are slow. LUN 1: writes are slow.
fn start(tag: &str) -> Daemon {
    let hold = HOLD.as_micros();
    Daemon::start_with(&format!("iscsi-abort-{tag}"), |_, port| {
        format!(
            "{}{}{}{}[reactor]\ncores = [0]\n",
            toml::ram("slow-reads", hold, 0),
            toml::ram("slow-writes", 0, hold),
            toml::iscsi_target(TARGET, &["slow-reads", "slow-writes"]),
            toml::iscsi_port(port)
        )
    })
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..BLOCK as usize).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

async fn session(d: &Daemon) -> Session {
    let mut s = Session::connect(d.addr, LoginOptions::new(HOST, Some(TARGET))).await.expect("login");
    s.clear_unit_attentions(0).await.expect("LUN 0 ready");
    s.clear_unit_attentions(1).await.expect("LUN 1 ready");
    s
}

async fn read(s: &mut Session, lun: u64, lba: u64) -> Vec<u8> {
    s.clear_unit_attentions(lun).await.expect("unit attentions cleared");
    s.read16(lun, lba, 1, BLOCK).await.expect("read")
}

#[test]
fn late_read_of_an_aborted_task_does_not_answer_the_command_reusing_its_itt() {
    let d = start("itt-reuse");
    block_on(bounded(30, async {
        let mut s = session(&d).await;
        s.write16(0, 0, BLOCK, pattern(0xa0)).await.expect("write A");
        s.write16(0, 8, BLOCK, pattern(0xb0)).await.expect("write B");
        // A read of block 0 that the device holds; abort it while it runs.
        let victim = s.submit(0, &cdb::read16(0, 1), Vec::new(), BLOCK).expect("submit");
        s.flush().await.expect("send");
        reactor::sleep(SETTLE).await;
        assert_eq!(s.task_mgmt(ABORT_TASK, 0, victim).await.expect("abort answered"), 0, "function complete");
        // The initiator reuses the tag at once for a read of block 8: it
        // must get block 8, not the aborted read's block 0.
        s.connection_mut().set_next_itt(victim);
        let again = s.submit(0, &cdb::read16(8, 1), Vec::new(), BLOCK).expect("submit");
        assert_eq!(again, victim);
        let (itt, r) = s.next_completion().await.expect("the new read completes");
        assert_eq!(itt, victim);
        let r = r.check().expect("GOOD");
        assert!(r.data == pattern(0xb0), "the read reusing the ITT got another command's data");
        // Nothing else arrives for the tag: the next command is answered normally.
        assert_eq!(read(&mut s, 0, 0).await, pattern(0xa0));
    }));
}

/// Starts a held write of `pattern(seed)` to block `lba` of LUN 1 (the
/// device holds every write), then lets it reach the device.
async fn held_write(s: &mut Session, lba: u64, seed: u8) -> u32 {
    let itt = s.submit(1, &cdb::write16(lba, 1), pattern(seed), 0).expect("submit");
    s.flush().await.expect("send");
    itt
}

/// Runs task management `function` against writes in flight and checks
/// that once it is answered, the blocks no longer change.
async fn aborted_writes_never_land_after_the_answer(function: u8) {
    let d = start(&format!("tmf{function}"));
    let mut s = session(&d).await;
    let lbas = [0u64, 8, 16];
    for &lba in &lbas {
        s.write16(1, lba, BLOCK, vec![0; BLOCK as usize]).await.expect("zero");
    }
    let mut itts = Vec::new();
    for (i, &lba) in lbas.iter().enumerate() {
        itts.push(held_write(&mut s, lba, 0x10 + i as u8).await);
    }
    reactor::sleep(SETTLE).await;
    let referenced = if function == ABORT_TASK { itts[0] } else { u32::MAX };
    assert_eq!(s.task_mgmt(function, 1, referenced).await.expect("answered"), 0, "function complete");
    // ABORT TASK ends the first write only; the others carry on.
    let watched = if function == ABORT_TASK { &lbas[..1] } else { &lbas[..] };
    let mut first = Vec::new();
    for &lba in watched {
        first.push(read(&mut s, 1, lba).await);
    }
    if function == ABORT_TASK {
        for _ in 0..2 {
            let (_, r) = s.next_completion().await.expect("unaffected write completes");
            r.check().expect("GOOD");
        }
    }
    // Well past the device's hold: whatever was aborted is over by now.
    reactor::sleep(HOLD * 2).await;
    for (i, &lba) in watched.iter().enumerate() {
        assert!(
            read(&mut s, 1, lba).await == first[i],
            "block {lba} changed after task management function {function} was answered"
        );
    }
    // The session is healthy and no answer for an aborted command arrives.
    s.write16(1, 32, BLOCK, pattern(0x77)).await.expect("write after the abort");
    assert_eq!(read(&mut s, 1, 32).await, pattern(0x77));
    assert_eq!(s.outstanding(), 0);
    let tur = s.scsi(1, &cdb::test_unit_ready(), Vec::new(), 0).await.expect("TEST UNIT READY");
    assert!(tur.is_good() || tur.sense_code().is_some());
}

#[test]
fn abort_task_is_answered_only_after_its_write_can_no_longer_land() {
    block_on(bounded(30, aborted_writes_never_land_after_the_answer(ABORT_TASK)));
}

#[test]
fn abort_task_set_is_answered_only_after_its_writes_can_no_longer_land() {
    block_on(bounded(30, aborted_writes_never_land_after_the_answer(ABORT_TASK_SET)));
}

#[test]
fn clear_task_set_is_answered_only_after_its_writes_can_no_longer_land() {
    block_on(bounded(30, aborted_writes_never_land_after_the_answer(CLEAR_TASK_SET)));
}

#[test]
fn lun_reset_is_answered_only_after_its_writes_can_no_longer_land() {
    block_on(bounded(30, aborted_writes_never_land_after_the_answer(LOGICAL_UNIT_RESET)));
}

#[test]
fn target_reset_is_answered_only_after_its_writes_can_no_longer_land() {
    block_on(bounded(30, aborted_writes_never_land_after_the_answer(TARGET_WARM_RESET)));
}

/// A write and the ABORT TASK naming it arrive together: the abort is
/// handled before the write's I/O task first runs, and the write never
/// reaches the device (before, it ran to the end and the abort waited for
/// it).
#[test]
fn a_write_aborted_before_its_io_starts_never_reaches_the_device() {
    let d = start("abort-unstarted");
    block_on(bounded(30, async {
        let mut s = session(&d).await;
        s.write16(1, 0, BLOCK, vec![0; BLOCK as usize]).await.expect("zero");
        // Queued, not sent: the abort's wait sends both in one segment.
        let itt = s.submit(1, &cdb::write16(0, 1), pattern(0x42), 0).expect("submit");
        assert_eq!(s.task_mgmt(ABORT_TASK, 1, itt).await.expect("answered"), 0, "function complete");
        reactor::sleep(HOLD * 2).await;
        assert_eq!(read(&mut s, 1, 0).await, vec![0; BLOCK as usize], "the aborted write landed");
        assert_eq!(s.outstanding(), 0);
    }));
}
/// LUN 1 as the wire carries it (peripheral addressing), for task
/// management requests sent without waiting for their answer.
const LUN1_WIRE: u64 = 0x0001_0000_0000_0000;

/// Two task management requests wait for I/O at the same time: both are
/// answered (each waiter wakes when an I/O task ends, not only the last
/// to start waiting).
#[test]
fn two_aborts_waiting_at_once_are_both_answered() {
    let d = start("two-aborts");
    block_on(bounded(30, async {
        let mut s = session(&d).await;
        let a = held_write(&mut s, 0, 1).await;
        reactor::sleep(HOLD / 2).await;
        let b = held_write(&mut s, 8, 2).await;
        reactor::sleep(SETTLE).await;
        let ta = s.connection_mut().task_mgmt(ABORT_TASK, LUN1_WIRE, a);
        s.flush().await.expect("send");
        reactor::sleep(SETTLE).await;
        let tb = s.connection_mut().task_mgmt(ABORT_TASK, LUN1_WIRE, b);
        s.flush().await.expect("send");
        s.set_timeout(HOLD * 10);
        let mut answered = Vec::new();
        while answered.len() < 2 {
            match s.next_event().await.expect("both answers before the timeout") {
                iscsi::host::HostEvent::TaskMgmt { itt, response } => answered.push((itt, response)),
                other => panic!("unexpected {other:?}"),
            }
        }
        answered.sort_unstable();
        let mut want = vec![(ta, 0), (tb, 0)];
        want.sort_unstable();
        assert_eq!(answered, want, "both ABORT TASKs answered function complete");
    }));
}

/// An abort waits for its write when the initiator drops the connection
/// (what open-iscsi does when a task management request times out): once
/// the write is over the connection ends, so a login reinstating the
/// session (same initiator name and ISID) is answered.
#[test]
fn a_session_dropped_while_an_abort_waits_can_be_reinstated() {
    let d = start("tmf-drop");
    block_on(bounded(40, async {
        let options = LoginOptions::new(HOST, Some(TARGET));
        let isid = options.isid;
        let mut s = Session::connect(d.addr, options).await.expect("login");
        s.clear_unit_attentions(1).await.expect("LUN 1 ready");
        let a = held_write(&mut s, 0, 3).await;
        reactor::sleep(SETTLE).await;
        let _ = s.connection_mut().task_mgmt(ABORT_TASK, LUN1_WIRE, a);
        s.flush().await.expect("send");
        reactor::sleep(SETTLE).await;
        drop(s);
        reactor::sleep(HOLD * 2).await;
        let mut again = LoginOptions::new(HOST, Some(TARGET));
        again.isid = isid;
        again.timeout = HOLD * 10;
        Session::connect(d.addr, again).await.expect("the reinstating login is answered");
    }));
}

/// Task management functions whose scope is the whole task set (SAM-5
/// 7.7: the task set is shared, TST 000b) reach other sessions' writes
/// too: one running on the device is waited for before the answer, and
/// one still collecting its data when the function arrives never runs.
async fn other_sessions_writes_never_land_after_the_answer(function: u8) {
    let d = start(&format!("others{function}"));
    let mut a = session(&d).await;
    let mut b = session(&d).await;
    for lun in [0, 1] {
        a.write16(lun, 0, BLOCK, vec![0; BLOCK as usize]).await.expect("zero");
    }
    // LUN 1 holds B's write on the device.
    let held = held_write(&mut b, 0, 0x5a).await;
    // LUN 0: a write of 1 MiB, more than the first burst; B sends the
    // unsolicited part and does not read the target's R2Ts until after
    // the function is answered.
    let big = (0..1024 * 1024).map(|i| (i % 251) as u8).collect::<Vec<u8>>();
    let collecting = b.submit(0, &cdb::write16(0, 2048), big.clone(), 0).expect("submit");
    b.flush().await.expect("send");
    reactor::sleep(SETTLE).await;
    // A target reset covers both LUNs; the others go to LUN 1, then 0.
    let luns: &[u64] = if function == TARGET_WARM_RESET { &[0] } else { &[1, 0] };
    for &lun in luns {
        assert_eq!(a.task_mgmt(function, lun, u32::MAX).await.expect("answered"), 0, "function complete");
    }
    let first = read(&mut a, 1, 0).await;
    assert!(first == pattern(0x5a), "the write running when the function arrived ended before the answer");
    // B now sends the rest of the 1 MiB: the command never runs.
    b.set_timeout(HOLD * 10);
    let mut outcomes = std::collections::HashMap::new();
    for _ in 0..2 {
        let (itt, r) = b.next_completion().await.expect("B's commands are answered");
        outcomes.insert(itt, r.status);
    }
    assert_eq!(outcomes[&held], 0, "the running write completed: GOOD");
    assert_eq!(outcomes[&collecting], scsi::status::TASK_ABORTED, "the collecting write: TASK ABORTED");
    reactor::sleep(HOLD * 2).await;
    assert_eq!(read(&mut a, 1, 0).await, first);
    let head = read(&mut a, 0, 0).await;
    assert!(head == vec![0; BLOCK as usize], "the aborted write of another session reached the device");
    // B carries on: its next write lands.
    b.clear_unit_attentions(0).await.expect("B's unit attentions");
    b.write16(0, 0, BLOCK, pattern(0x3c)).await.expect("B writes again");
    assert_eq!(read(&mut a, 0, 0).await, pattern(0x3c));
}

#[test]
fn lun_reset_reaches_the_writes_of_other_sessions() {
    block_on(bounded(40, other_sessions_writes_never_land_after_the_answer(LOGICAL_UNIT_RESET)));
}

#[test]
fn clear_task_set_reaches_the_writes_of_other_sessions() {
    block_on(bounded(40, other_sessions_writes_never_land_after_the_answer(CLEAR_TASK_SET)));
}

#[test]
fn target_reset_reaches_the_writes_of_other_sessions() {
    block_on(bounded(40, other_sessions_writes_never_land_after_the_answer(TARGET_WARM_RESET)));
}

/// While a LUN reset waits for another session's write, new commands to
/// the unit get BUSY (and run once the reset is answered).
#[test]
fn commands_arriving_while_a_reset_waits_get_busy() {
    let d = start("busy");
    block_on(bounded(30, async {
        let mut a = session(&d).await;
        let mut b = session(&d).await;
        let mut c = session(&d).await;
        let _held = held_write(&mut b, 0, 0x21).await;
        reactor::sleep(SETTLE).await;
        let reset = a.connection_mut().task_mgmt(LOGICAL_UNIT_RESET, LUN1_WIRE, u32::MAX);
        a.flush().await.expect("send");
        reactor::sleep(SETTLE).await;
        let r = c.scsi(1, &cdb::test_unit_ready(), Vec::new(), 0).await.expect("TEST UNIT READY");
        assert_eq!(r.status, scsi::status::BUSY, "{r:?}");
        match a.next_event().await.expect("the reset is answered") {
            iscsi::host::HostEvent::TaskMgmt { itt, response } => assert_eq!((itt, response), (reset, 0)),
            other => panic!("unexpected {other:?}"),
        }
        c.clear_unit_attentions(1).await.expect("unit attentions");
        let r = c.scsi(1, &cdb::test_unit_ready(), Vec::new(), 0).await.expect("TEST UNIT READY");
        assert!(r.is_good(), "{r:?}");
    }));
}

/// PERSISTENT RESERVE OUT, service action `sa`, type `rtype`, 24 bytes of
/// parameters.
fn prout(sa: u8, rtype: u8) -> [u8; 10] {
    [0x5F, sa, rtype, 0, 0, 0, 0, 0, 24, 0]
}

/// PR OUT parameters: reservation key, service action reservation key.
fn params(key: u64, sa_key: u64) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    p[..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    p
}

/// PREEMPT AND ABORT (SPC-4 5.9.11.5) ends the preempted nexus's tasks
/// before GOOD: its write running on the device has ended, so nothing of
/// it lands afterwards (what fencing a cluster node relies on).
#[test]
fn preempt_and_abort_is_good_only_after_the_preempted_write_ended() {
    let d = start("preempt-abort");
    block_on(bounded(30, async {
        let mut a = session(&d).await;
        let mut b = session(&d).await;
        a.write16(1, 0, BLOCK, vec![0; BLOCK as usize]).await.expect("zero");
        assert!(a.scsi(1, &prout(0, 0), params(0, 0xA), 0).await.expect("register A").is_good());
        assert!(b.scsi(1, &prout(0, 0), params(0, 0xB), 0).await.expect("register B").is_good());
        // B holds a Write Exclusive reservation and writes.
        assert!(b.scsi(1, &prout(1, 1), params(0xB, 0), 0).await.expect("reserve").is_good());
        let _w = held_write(&mut b, 0, 0x66).await;
        reactor::sleep(SETTLE).await;
        let r = a.scsi(1, &prout(5, 1), params(0xA, 0xB), 0).await.expect("PREEMPT AND ABORT");
        assert!(r.is_good(), "{r:?}");
        let first = read(&mut a, 1, 0).await;
        assert!(first == pattern(0x66), "the preempted write still ran when GOOD was sent");
        reactor::sleep(HOLD * 2).await;
        assert_eq!(read(&mut a, 1, 0).await, first);
        // B is fenced: its next write conflicts.
        b.clear_unit_attentions(1).await.expect("unit attentions");
        let w = b.scsi(1, &cdb::write16(8, 1), pattern(1), 0).await.expect("write");
        assert_eq!(w.status, scsi::status::RESERVATION_CONFLICT);
    }));
}

/// PREEMPT AND ABORT aborts only the preempted nexus's tasks (SPC-4
/// 5.12.11.2.6): of two writes still collecting their data when it
/// arrives, the preempted session's never runs (TASK ABORTED) and the one
/// of a registrant that was not preempted lands (GOOD).
#[test]
fn preempt_and_abort_spares_the_tasks_of_nexuses_it_did_not_preempt() {
    let d = start("preempt-others");
    block_on(bounded(40, async {
        let (mut a, mut b, mut c) = (session(&d).await, session(&d).await, session(&d).await);
        for (s, key) in [(&mut a, 0xA), (&mut b, 0xB), (&mut c, 0xC)] {
            assert!(s.scsi(1, &prout(0, 0), params(0, key), 0).await.expect("register").is_good());
        }
        // WRITE EXCLUSIVE - REGISTRANTS ONLY, held by B: C writes too.
        assert!(b.scsi(1, &prout(1, 5), params(0xB, 0), 0).await.expect("reserve").is_good());
        for lba in [2048u64, 4096] {
            a.write16(1, lba, BLOCK, vec![0; BLOCK as usize]).await.expect("zero");
        }
        // B and C each start a 1 MiB write to LUN 1 and hold back the data
        // the target's R2Ts ask for until the preemption is answered.
        let big = |seed: u8| (0..1024 * 1024).map(|i| (i % 251) as u8 ^ seed).collect::<Vec<u8>>();
        let from_b = b.submit(1, &cdb::write16(2048, 2048), big(0x11), 0).expect("submit B");
        b.flush().await.expect("send B");
        let from_c = c.submit(1, &cdb::write16(4096, 2048), big(0x22), 0).expect("submit C");
        c.flush().await.expect("send C");
        reactor::sleep(SETTLE).await;
        let r = a.scsi(1, &prout(5, 5), params(0xA, 0xB), 0).await.expect("PREEMPT AND ABORT");
        assert!(r.is_good(), "{r:?}");
        b.set_timeout(HOLD * 10);
        c.set_timeout(HOLD * 10);
        let (itt, r) = b.next_completion().await.expect("B's write is answered");
        assert_eq!((itt, r.status), (from_b, scsi::status::TASK_ABORTED), "the preempted session's write");
        let (itt, r) = c.next_completion().await.expect("C's write is answered");
        assert_eq!((itt, r.status), (from_c, scsi::status::GOOD), "a registrant not preempted: {r:?}");
        assert_eq!(read(&mut a, 1, 2048).await, vec![0; BLOCK as usize], "the aborted write reached the device");
        assert_eq!(read(&mut a, 1, 4096).await, big(0x22)[..BLOCK as usize], "C's write is on the device");
    }));
}

/// A session's own fence on one LUN does not lift another session's fence
/// from its commands on another: B's write to LUN 0, in the scope of A's
/// CLEAR TASK SET there, stays aborted when B clears LUN 1's task set.
#[test]
fn own_task_management_on_another_lun_does_not_lift_another_sessions_fence() {
    let d = start("restamp");
    block_on(bounded(30, async {
        let mut a = session(&d).await;
        let mut b = session(&d).await;
        a.write16(0, 0, BLOCK, vec![0; BLOCK as usize]).await.expect("zero");
        let big = (0..1024 * 1024).map(|i| (i % 251) as u8).collect::<Vec<u8>>();
        let w = b.submit(0, &cdb::write16(0, 2048), big, 0).expect("submit");
        b.flush().await.expect("send");
        reactor::sleep(SETTLE).await;
        assert_eq!(a.task_mgmt(CLEAR_TASK_SET, 0, u32::MAX).await.expect("answered"), 0, "function complete");
        let tmf = b.connection_mut().task_mgmt(CLEAR_TASK_SET, LUN1_WIRE, u32::MAX);
        b.flush().await.expect("send");
        b.set_timeout(HOLD * 10);
        match b.next_event().await.expect("B's CLEAR TASK SET is answered") {
            iscsi::host::HostEvent::TaskMgmt { itt, response } => assert_eq!((itt, response), (tmf, 0)),
            other => panic!("unexpected {other:?}"),
        }
        let (itt, r) = b.next_completion().await.expect("B's write is answered");
        assert_eq!(itt, w);
        assert_eq!(r.status, scsi::status::TASK_ABORTED, "{r:?}");
        let head = read(&mut a, 0, 0).await;
        assert!(head == vec![0; BLOCK as usize], "a write in A's CLEAR TASK SET scope landed after it was answered");
    }));
}

/// A reset whose scope does not drain in time (another session's write
/// stuck on the device) is not answered: its connection closes (the
/// initiator recovers the session), and the unit takes commands again.
#[test]
fn a_reset_whose_scope_does_not_drain_closes_its_connection() {
    let d = Daemon::start_with("iscsi-abort-stuck", |_, port| {
        format!(
            "{}{}{}{}[reactor]\ncores = [0]\n",
            toml::ram("fast", 0, 0),
            toml::ram("stuck-writes", 0, 40_000_000),
            toml::iscsi_target(TARGET, &["fast", "stuck-writes"]),
            toml::iscsi_port(port)
        )
    });
    block_on(bounded(90, async {
        let mut a = session(&d).await;
        let mut b = session(&d).await;
        let _stuck = held_write(&mut b, 0, 0x44).await;
        reactor::sleep(SETTLE).await;
        let _ = a.connection_mut().task_mgmt(LOGICAL_UNIT_RESET, LUN1_WIRE, u32::MAX);
        a.flush().await.expect("send");
        a.set_timeout(Duration::from_secs(45));
        let events = a.wait_closed().await.expect("the connection closes");
        assert!(
            !events.iter().any(|e| matches!(e, iscsi::host::HostEvent::TaskMgmt { .. })),
            "the reset was answered: {events:?}"
        );
        let mut c = session(&d).await;
        let r = c.scsi(1, &cdb::test_unit_ready(), Vec::new(), 0).await.expect("TEST UNIT READY");
        assert!(r.is_good(), "{r:?}");
    }));
}

/// TARGET COLD RESET (RFC 7143 11.5.1): answered "function complete",
/// then every connection of the target's sessions closes, the
/// requester's included; the target takes new logins at once.
#[test]
fn target_cold_reset_closes_every_session_after_its_answer() {
    const TARGET_COLD_RESET: u8 = 7;
    let d = start("cold");
    block_on(bounded(30, async {
        let mut a = session(&d).await;
        let mut b = session(&d).await;
        let reset = a.connection_mut().task_mgmt(TARGET_COLD_RESET, 0, u32::MAX);
        a.flush().await.expect("send");
        let events = a.wait_closed().await.expect("the requester's connection closes");
        assert!(
            events.iter().any(|e| matches!(e, iscsi::host::HostEvent::TaskMgmt { itt, response: 0 } if *itt == reset)),
            "the reset was answered before the close: {events:?}"
        );
        b.wait_closed().await.expect("the other session's connection closes");
        let mut c = session(&d).await;
        assert!(c.scsi(1, &cdb::test_unit_ready(), Vec::new(), 0).await.expect("TEST UNIT READY").is_good());
    }));
}

/// A write of a session that another's PREEMPT AND ABORT preempted (a
/// fence of its nexus) stays aborted when that session, registered again,
/// sends a PREEMPT AND ABORT of its own that fences the whole unit (past
/// the unit's 256 preempted nexuses), which restamps the session's own
/// commands but must not rescue that one (found by review).
#[test]
fn a_preempted_write_stays_aborted_past_its_sessions_own_whole_unit_preemption() {
    let d = start("preempt-fallback");
    block_on(bounded(120, async {
        let mut a = session(&d).await;
        // V's write moves a burst of 512 bytes per R2T, one R2T at a time:
        // its data is still coming in while V sends its other commands.
        let mut opts = LoginOptions::new(HOST, Some(TARGET));
        opts.params.initial_r2t = true;
        opts.params.immediate_data = false;
        opts.params.max_burst_length = 512;
        opts.params.first_burst_length = 512;
        opts.params.max_outstanding_r2t = 1;
        let mut v = Session::connect(d.addr, opts).await.expect("login V");
        v.clear_unit_attentions(1).await.expect("LUN 1 ready");
        assert!(a.scsi(1, &prout(0, 0), params(0, 0xA), 0).await.expect("register A").is_good());
        assert!(v.scsi(1, &prout(0, 0), params(0, 0xB), 0).await.expect("register V").is_good());
        // 257 other nexuses registered with key 0xC, their sessions gone.
        for i in 0..257 {
            let mut s = session(&d).await;
            assert!(s.scsi(1, &prout(0, 0), params(0, 0xC), 0).await.expect("register").is_good(), "{i}");
            s.logout().await.expect("logout");
        }
        // V starts a 2 MiB write whose data trickles in.
        let big = (0..2 * 1024 * 1024).map(|i| (i % 251) as u8 ^ 0x33).collect::<Vec<u8>>();
        let w = v.submit(1, &cdb::write16(4096, 4096), big, 0).expect("submit V");
        v.flush().await.expect("send V");
        reactor::sleep(SETTLE).await;
        // A preempts V alone: a fence of V's nexus; GOOD.
        let r = a.scsi(1, &prout(5, 5), params(0xA, 0xB), 0).await.expect("PREEMPT AND ABORT by A");
        assert!(r.is_good(), "{r:?}");
        // V registers again and preempts the 257: past the unit's 256
        // nexuses, a whole-unit fence, which restamps V's own commands.
        v.set_timeout(HOLD * 20);
        let mut tries = 0;
        loop {
            let r = v.scsi(1, &prout(0, 0), params(0, 0xD), 0).await.expect("register V again");
            if r.is_good() {
                break;
            }
            tries += 1;
            assert!(tries < 5, "{r:?}");
        }
        let r = v.scsi(1, &prout(5, 5), params(0xD, 0xC), 0).await.expect("PREEMPT AND ABORT by V");
        assert!(r.is_good(), "{r:?}");
        let (itt, r) = v.next_completion().await.expect("V's write is answered");
        assert_eq!(
            (itt, r.status),
            (w, scsi::status::TASK_ABORTED),
            "V's write, in the scope of A's PREEMPT AND ABORT"
        );
        assert_eq!(read(&mut a, 1, 4096).await, vec![0; BLOCK as usize], "the preempted write reached the device");
    }));
}

/// A task set function or LUN reset addressed to a LUN with no logical
/// unit behind it names no task set: "LUN does not exist" (RFC 7143
/// 11.6.1, response 2), as the Linux target answers every function that
/// names a LUN, not "function complete" for a task set that is not there.
#[test]
fn task_set_functions_on_a_lun_without_a_unit_answer_lun_does_not_exist() {
    let d = start("no-unit");
    block_on(bounded(30, async {
        let mut s = session(&d).await;
        for function in [ABORT_TASK_SET, CLEAR_TASK_SET, LOGICAL_UNIT_RESET] {
            let response = s.task_mgmt(function, 7, u32::MAX).await.expect("answered");
            assert_eq!(response, 2, "function {function} on LUN 7");
        }
        assert_eq!(s.task_mgmt(CLEAR_TASK_SET, 1, u32::MAX).await.expect("answered"), 0, "LUN 1 exists");
    }));
}
