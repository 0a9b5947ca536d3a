//! COMPARE AND WRITE is atomic against every write to the same blocks of
//! the device (issue 12, item 3): a plain write that is under way when a
//! COMPARE AND WRITE arrives, over iSCSI or NVMe/TCP, lands wholly before
//! it, never between its compare and its write; writes to other blocks go
//! on while it holds its range. The devices hold every write (or read)
//! for a while (`write_latency_us`, `read_latency_us`), so that the
//! commands really overlap.

mod common;

use common::{block_on, bounded, toml, Daemon};
use initiator::iscsi::{cdb, LoginOptions, ScsiResult, Session};
use initiator::{cmd, Controller, Options, Status};
use std::net::SocketAddr;
use std::time::Duration;

const IQN: &str = "iqn.2026-11.io.ironwire.test:caw";
const NQN: &str = "nqn.2026-11.io.ironwire.test:caw";
const INITIATOR: &str = "iqn.2026-11.io.ironwire.test:caw-host";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:caw-host";
const BLOCK: u32 = 512;

/// How long the slow devices hold each write (or read).
const HOLD: Duration = Duration::from_millis(400);
/// Long enough for a command to reach the target and start its I/O.
const SETTLE: Duration = Duration::from_millis(50);

/// Two reactors, on the first two CPUs this process may use (one on a
/// one-CPU machine).
fn cores() -> Vec<usize> {
    reactor::available_cpus().into_iter().take(2).collect()
}

/// LUN 0 / namespace 1: writes are slow. LUN 1 / namespace 2: reads are
/// slow. Both exported over iSCSI and NVMe/TCP, on two reactors.
fn start(tag: &str) -> Daemon {
    let hold = HOLD.as_micros();
    let cores = cores();
    Daemon::start_with(&format!("caw-{tag}"), |_, port| {
        format!(
            "{}{}{}[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n\
             [[subsystem.namespace]]\nnsid = 1\ndevice = \"slow-writes\"\n\
             [[subsystem.namespace]]\nnsid = 2\ndevice = \"slow-reads\"\n\n\
             [[port]]\naddress = \"127.0.0.1:{port}\"\n\n{}[reactor]\ncores = {cores:?}\n",
            toml::ram("slow-writes", 0, hold),
            toml::ram("slow-reads", hold, 0),
            toml::iscsi_target(IQN, &["slow-writes", "slow-reads"]),
            toml::iscsi_port(port + 1)
        )
    })
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..BLOCK as usize).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

/// COMPARE AND WRITE (16) of one block at `lba`.
fn compare_and_write16(lba: u64) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x89;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[13] = 1;
    c
}

async fn session(d: &Daemon) -> Session {
    session_as(d, INITIATOR).await
}

async fn session_as(d: &Daemon, initiator: &str) -> Session {
    let portal = SocketAddr::from(([127, 0, 0, 1], d.addr.port() + 1));
    let mut s = Session::connect(portal, LoginOptions::new(initiator, Some(IQN))).await.expect("login");
    s.clear_unit_attentions(0).await.expect("LUN 0 ready");
    s.clear_unit_attentions(1).await.expect("LUN 1 ready");
    s
}

/// The reactor serving `initiator`'s session (`ctl hosts --json`).
fn reactor_of(d: &Daemon, initiator: &str) -> u64 {
    let hosts: serde_json::Value = serde_json::from_str(&d.ctl("hosts --json").expect("ctl hosts")).expect("JSON");
    let sessions = hosts["iscsi"].as_array().expect("iscsi sessions");
    let s = sessions.iter().find(|s| s["initiator"] == initiator).unwrap_or_else(|| panic!("{initiator}: {hosts:#}"));
    s["reactor"].as_u64().expect("reactor index")
}

/// A session served by another reactor than `initiator`'s: SO_REUSEPORT
/// spreads connections by their addresses, so a few tries find one.
async fn session_on_another_reactor(d: &Daemon, initiator: &str) -> Session {
    if cores().len() < 2 {
        eprintln!("one CPU only: the writing session shares the reactor");
        return session_as(d, &format!("{INITIATOR}-0")).await;
    }
    let theirs = reactor_of(d, initiator);
    for i in 0..32 {
        let name = format!("{INITIATOR}-{i}");
        let s = session_as(d, &name).await;
        if reactor_of(d, &name) != theirs {
            return s;
        }
        s.logout().await.expect("logout");
    }
    panic!("32 sessions all landed on reactor {theirs}");
}

async fn controller(d: &Daemon) -> Controller {
    Controller::connect(d.addr, NQN, HOST, Options { io_queues: 1, queue_size: 16, ..Options::default() })
        .await
        .expect("NVMe/TCP connect")
}

/// Whether `r` is GOOD, or the MISCOMPARE of a compare that failed;
/// anything else fails the test.
fn compared(r: &ScsiResult) -> bool {
    if r.is_good() {
        return true;
    }
    let sense = r.sense_code().expect("sense with CHECK CONDITION");
    assert_eq!((sense.key, sense.asc), (0x0e, 0x1d), "MISCOMPARE DURING VERIFY OPERATION, got {sense}");
    false
}

// Block 0 of LUN 0 holds A; a plain write of B is under way when a
// COMPARE AND WRITE of A -> C arrives. Done atomically, the compare sees
// B (miscompare) or the write follows C; either way the block ends as B.
// Without the range lock the compare read A before B landed, and C
// overwrote B.

/// COMPARE AND WRITE A -> C of block 0 of LUN 0: whether it matched.
async fn compare_a_write_c(caw: &mut Session) -> bool {
    let r = caw.scsi(0, &compare_and_write16(0), [pattern(0xa), pattern(0xc)].concat(), 0).await.expect("CAW");
    compared(&r)
}

async fn assert_block_0_holds_b(caw: &mut Session, matched: bool) {
    let now = caw.read16(0, 0, 1, BLOCK).await.expect("read back");
    assert!(
        now == pattern(0xb),
        "block 0 holds {} after the plain write B and a COMPARE AND WRITE A -> C that {}",
        if now == pattern(0xc) { "C" } else { "neither B nor C" },
        if matched { "matched" } else { "miscompared" }
    );
}

/// The plain write comes from a session on the other reactor.
#[test]
fn iscsi_write_under_way_is_not_overwritten_by_a_compare_and_write_that_read_before_it() {
    let d = start("iscsi-write");
    block_on(bounded(30, async {
        let mut caw = session(&d).await;
        let mut w = session_on_another_reactor(&d, INITIATOR).await;
        caw.write16(0, 0, BLOCK, pattern(0xa)).await.expect("write A");
        let itt = w.submit(0, &cdb::write16(0, 1), pattern(0xb), 0).expect("submit B");
        w.flush().await.expect("send B");
        reactor::sleep(SETTLE).await;
        let matched = compare_a_write_c(&mut caw).await;
        let (done, r) = w.next_completion().await.expect("write B completes");
        assert_eq!(done, itt);
        r.check().expect("write B GOOD");
        assert_block_0_holds_b(&mut caw, matched).await;
    }));
}

#[test]
fn nvme_write_under_way_is_not_overwritten_by_an_iscsi_compare_and_write_that_read_before_it() {
    let d = start("nvme-write");
    block_on(bounded(30, async {
        let mut caw = session(&d).await;
        let mut c = controller(&d).await;
        caw.write16(0, 0, BLOCK, pattern(0xa)).await.expect("write A");
        let q = c.io_queue(0).expect("I/O queue");
        q.submit(cmd::write(1, 0, 1), pattern(0xb), 0).expect("submit B");
        q.flush().await.expect("send B");
        reactor::sleep(SETTLE).await;
        let matched = compare_a_write_c(&mut caw).await;
        let done = q.next_completion().await.expect("write B completes");
        assert!(done.cqe.status().is_success(), "write B: {}", done.cqe.status());
        assert_block_0_holds_b(&mut caw, matched).await;
    }));
}

/// LUN 1 holds every read, so a COMPARE AND WRITE holds its block for
/// that long: a write elsewhere completes before it, a write to its block
/// after it (and lands after its write).
#[test]
fn compare_and_write_holds_only_its_own_blocks() {
    let d = start("other-blocks");
    block_on(bounded(30, async {
        let mut s = session(&d).await;
        s.write16(1, 0, BLOCK, pattern(0xa)).await.expect("write A");
        let caw = s.submit(1, &compare_and_write16(0), [pattern(0xa), pattern(0xc)].concat(), 0).expect("CAW");
        s.flush().await.expect("send CAW");
        reactor::sleep(SETTLE).await;
        let elsewhere = s.submit(1, &cdb::write16(8, 1), pattern(0xe), 0).expect("write elsewhere");
        let same = s.submit(1, &cdb::write16(0, 1), pattern(0xb), 0).expect("write to the CAW's block");
        s.flush().await.expect("send writes");
        let mut order = Vec::new();
        for _ in 0..3 {
            let (itt, r) = s.next_completion().await.expect("completion");
            assert!(r.is_good(), "ITT {itt:#x}: {r:?}");
            order.push(itt);
        }
        assert_eq!(order, [elsewhere, caw, same], "completion order (write elsewhere, CAW, write to its block)");
        assert!(s.read16(1, 0, 1, BLOCK).await.expect("read") == pattern(0xb), "the waiting write landed last");
        assert!(s.read16(1, 8, 1, BLOCK).await.expect("read") == pattern(0xe));
    }));
}

/// `sqe` with CDW0 FUSE set to `fuse` (01b first, 10b second).
fn fused(mut sqe: nvme_spec::Sqe, fuse: u8) -> nvme_spec::Sqe {
    sqe.flags |= fuse;
    sqe
}

/// Sends a fused Compare (`expected`) + Write (`data`) of block `lba` of
/// namespace 1 and returns both statuses (Compare's, Write's).
async fn fused_compare_and_write(
    q: &mut initiator::Queue,
    lba: u64,
    expected: Vec<u8>,
    data: Vec<u8>,
) -> (Status, Status) {
    let compare = q.submit(fused(cmd::compare(1, lba, 1), 0b01), expected, 0).expect("submit Compare");
    let write = q.submit(fused(cmd::write(1, lba, 1), 0b10), data, 0).expect("submit Write");
    q.flush().await.expect("send the pair");
    let (mut c, mut w) = (None, None);
    for _ in 0..2 {
        let done = q.next_completion().await.expect("completion");
        let cid = done.cqe.cid.get();
        if cid == compare {
            c = Some(done.cqe.status());
        } else {
            assert_eq!(cid, write, "a completion for neither half");
            w = Some(done.cqe.status());
        }
    }
    (c.expect("Compare completed"), w.expect("Write completed"))
}

async fn nvme_read_block(q: &mut initiator::Queue, lba: u64) -> Vec<u8> {
    let done = q.execute(cmd::read(1, lba, 1), Vec::new(), BLOCK).await.expect("read");
    assert!(done.cqe.status().is_success(), "read: {}", done.cqe.status());
    done.data
}

#[test]
fn nvme_fused_compare_and_write_writes_on_a_match_and_aborts_the_write_on_a_mismatch() {
    let d = start("fused");
    block_on(bounded(30, async {
        let mut c = controller(&d).await;
        let q = c.io_queue(0).expect("I/O queue");
        let done = q.execute(cmd::write(1, 3, 1), pattern(0xa), 0).await.expect("write A");
        assert!(done.cqe.status().is_success());
        let (cs, ws) = fused_compare_and_write(q, 3, pattern(0xa), pattern(0xc)).await;
        assert_eq!((cs, ws), (Status::SUCCESS, Status::SUCCESS), "matching pair");
        assert!(nvme_read_block(q, 3).await == pattern(0xc), "the matching pair wrote");
        let (cs, ws) = fused_compare_and_write(q, 3, pattern(0xa), pattern(0xd)).await;
        assert_eq!((cs, ws), (Status::COMPARE_FAILURE, Status::ABORTED_FAILED_FUSED), "stale compare");
        assert!(nvme_read_block(q, 3).await == pattern(0xc), "a miscompare leaves the block unchanged");
        // A second half alone is refused, and writes nothing.
        let done = q.execute_raw(fused(cmd::write(1, 3, 1), 0b10), pattern(0xe), 0).await.expect("lone Write");
        assert_eq!(done.cqe.status(), Status::ABORTED_MISSING_FUSED);
        assert!(nvme_read_block(q, 3).await == pattern(0xc), "the lone half wrote nothing");
    }));
}

#[test]
fn nvme_write_under_way_is_not_overwritten_by_a_fused_compare_and_write_that_read_before_it() {
    let d = start("fused-race");
    block_on(bounded(30, async {
        let mut c = controller(&d).await;
        let mut other = controller(&d).await;
        let q = c.io_queue(0).expect("I/O queue");
        let done = q.execute(cmd::write(1, 0, 1), pattern(0xa), 0).await.expect("write A");
        assert!(done.cqe.status().is_success());
        let w = other.io_queue(0).expect("I/O queue");
        w.submit(cmd::write(1, 0, 1), pattern(0xb), 0).expect("submit B");
        w.flush().await.expect("send B");
        reactor::sleep(SETTLE).await;
        let (cs, ws) = fused_compare_and_write(q, 0, pattern(0xa), pattern(0xc)).await;
        assert!(
            (cs, ws) == (Status::SUCCESS, Status::SUCCESS)
                || (cs, ws) == (Status::COMPARE_FAILURE, Status::ABORTED_FAILED_FUSED),
            "fused pair: {cs} / {ws}"
        );
        let done = w.next_completion().await.expect("write B completes");
        assert!(done.cqe.status().is_success(), "write B: {}", done.cqe.status());
        assert!(nvme_read_block(q, 0).await == pattern(0xb), "block 0 must end as B, whichever went first");
    }));
}

/// ABORT TASK (RFC 7143 section 11.5.1, function 1).
const ABORT_TASK: u8 = 1;

/// A COMPARE AND WRITE waiting for a range another one holds ends at
/// once when aborted: ABORT TASK is answered while the holder still reads
/// (LUN 1 holds every read), and the aborted one, which would have
/// matched after the holder, writes nothing.
#[test]
fn an_iscsi_compare_and_write_waiting_for_its_range_is_aborted_at_once() {
    let d = start("abort-waiting");
    block_on(bounded(30, async {
        let mut s = session(&d).await;
        s.write16(1, 0, BLOCK, pattern(0xa)).await.expect("write A");
        let holder = s.submit(1, &compare_and_write16(0), [pattern(0xa), pattern(0xc)].concat(), 0).expect("CAW A->C");
        s.flush().await.expect("send the holder");
        reactor::sleep(SETTLE).await;
        let waiter = s.submit(1, &compare_and_write16(0), [pattern(0xc), pattern(0xd)].concat(), 0).expect("CAW C->D");
        s.flush().await.expect("send the waiter");
        reactor::sleep(SETTLE).await;
        assert_eq!(s.task_mgmt(ABORT_TASK, 1, waiter).await.expect("ABORT TASK"), 0, "function complete");
        assert!(s.answered().is_empty(), "ABORT TASK waited for the holder ({:x?} answered first)", s.answered());
        let (itt, r) = s.next_completion().await.expect("the holder completes");
        assert_eq!(itt, holder);
        assert!(r.is_good(), "holder: {r:?}");
        assert!(s.read16(1, 0, 1, BLOCK).await.expect("read") == pattern(0xc), "the aborted CAW wrote");
    }));
}

/// Session reinstatement (a login with the old session's initiator name
/// and ISID, RFC 7143 section 6.3.5) ends that session's COMPARE AND
/// WRITE waiting for its range as an abort does: it writes nothing,
/// although it would have matched once the holder (another initiator's,
/// LUN 1 holds its read) was done.
#[test]
fn an_iscsi_compare_and_write_waiting_for_its_range_ends_with_its_reinstated_session() {
    let d = start("reinstate-waiting");
    block_on(bounded(30, async {
        let isid = [0x80, 0x0c, 0xa5, 0x00, 0x00, 0x01];
        let portal = SocketAddr::from(([127, 0, 0, 1], d.addr.port() + 1));
        let login = || async {
            let mut opts = LoginOptions::new(INITIATOR, Some(IQN));
            opts.isid = isid;
            let mut s = Session::connect(portal, opts).await.expect("login");
            s.clear_unit_attentions(1).await.expect("LUN 1 ready");
            s
        };
        let mut other = session_as(&d, "iqn.2026-11.io.ironwire.test:caw-other").await;
        let mut old = login().await;
        other.write16(1, 0, BLOCK, pattern(0xa)).await.expect("write A");
        let holder =
            other.submit(1, &compare_and_write16(0), [pattern(0xa), pattern(0xc)].concat(), 0).expect("CAW A->C");
        other.flush().await.expect("send the holder");
        reactor::sleep(SETTLE).await;
        old.submit(1, &compare_and_write16(0), [pattern(0xc), pattern(0xd)].concat(), 0).expect("CAW C->D");
        old.flush().await.expect("send the waiter");
        reactor::sleep(SETTLE).await;

        let mut new = login().await;
        old.wait_closed().await.expect("the old connection is closed");
        let (itt, r) = other.next_completion().await.expect("the holder completes");
        assert_eq!(itt, holder);
        assert!(r.is_good(), "holder: {r:?}");
        assert!(
            new.read16(1, 0, 1, BLOCK).await.expect("read") == pattern(0xc),
            "the reinstated session's waiting COMPARE AND WRITE wrote"
        );
    }));
}

/// The same over NVMe/TCP: an Abort of the Write of a fused pair waiting
/// for its range (namespace 2 holds the first pair's compare read) ends the wait;
/// the pair is answered (Abort Requested, Failed Fused) before the first
/// pair, and writes nothing.
#[test]
fn an_nvme_fused_compare_and_write_waiting_for_its_range_is_aborted_at_once() {
    let d = start("fused-abort");
    block_on(bounded(30, async {
        let mut c = controller(&d).await;
        let mut queues = c.take_io_queues();
        let q = queues.first_mut().expect("I/O queue");
        let done = q.execute(cmd::write(2, 5, 1), pattern(0xa), 0).await.expect("write A");
        assert!(done.cqe.status().is_success());
        let pair = |q: &mut initiator::Queue, expected: u8, data: u8| {
            let compare = q.submit(fused(cmd::compare(2, 5, 1), 0b01), pattern(expected), 0).expect("Compare");
            let write = q.submit(fused(cmd::write(2, 5, 1), 0b10), pattern(data), 0).expect("Write");
            (compare, write)
        };
        let holder = pair(q, 0xa, 0xc);
        q.flush().await.expect("send the holder");
        reactor::sleep(SETTLE).await;
        let waiter = pair(q, 0xc, 0xd);
        q.flush().await.expect("send the waiter");
        reactor::sleep(SETTLE).await;
        let done = c.admin_command(cmd::abort(1, waiter.1), Vec::new(), 0).await.expect("Abort");
        assert!(done.cqe.status().is_success(), "Abort: {}", done.cqe.status());
        assert_eq!(done.cqe.dw0.get() & 1, 0, "the waiting Write was not aborted");
        let mut order = Vec::new();
        for _ in 0..4 {
            let done = q.next_completion().await.expect("completion");
            order.push((done.cqe.cid.get(), done.cqe.status()));
        }
        let (first, last) = order.split_at(2);
        let mut first = first.to_vec();
        first.sort_by_key(|(cid, _)| *cid == waiter.1);
        assert_eq!(
            first,
            [(waiter.0, Status::ABORTED_FAILED_FUSED), (waiter.1, Status::ABORT_REQUESTED)],
            "the aborted pair is answered first: {order:?}"
        );
        assert!(last.iter().all(|(cid, s)| [holder.0, holder.1].contains(cid) && *s == Status::SUCCESS), "{order:?}");
        let done = q.execute(cmd::read(2, 5, 1), Vec::new(), BLOCK).await.expect("read");
        assert!(done.data == pattern(0xc), "the aborted pair wrote");
    }));
}
