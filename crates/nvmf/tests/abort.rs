//! Abort through the controller's mailbox, no transport, no I/O: the
//! admin queue posts, the I/O queue looks the command up in its own state
//! and answers, the admin queue completes the Abort.

use block::Described;
use nvme_spec::fabrics::ConnectData;
use nvme_spec::{Cqe, Sgl, Sqe, Status};
use nvmf::{Settings, Transport};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use zerocopy::IntoBytes;

type Target = nvmf::Target<Described>;
type Queue = nvmf::Queue<Described>;
type Outcome = nvmf::Outcome<Vec<u8>, Described>;

const SUB: &str = "nqn.2026-11.io.ironwire:abort";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:abort-host";
const TCP: Transport =
    Transport { name: "tcp", trtype: 3, treq: 2, tsas: [0; 16], sgls: 1 | (1 << 20), in_capsule: 8192, icdoff: 0 };

fn addr() -> SocketAddr {
    "127.0.0.1:4420".parse().expect("addr")
}

fn target() -> Arc<Target> {
    let t = Target::new(Settings::default());
    let s = t.add_subsystem(nvmf::Subsystem::new(SUB, "SN1", true, Vec::new())).expect("sub");
    s.add_namespace(nvmf::Namespace::new(SUB, 1, Arc::new(Described::new("r0", 512, 2048)))).expect("ns");
    t.add_port(addr(), TCP, false);
    Arc::new(t)
}

/// A command as every fabrics host sends it: PSDT 01b (an SGL).
fn sqe(opcode: u8, cid: u16) -> Sqe {
    let mut s = Sqe { opcode, flags: Sqe::PSDT_SGL, ..Default::default() };
    s.cid = cid.into();
    s
}

fn complete(o: Outcome) -> Cqe {
    match o {
        Outcome::Complete { cqe, .. } | Outcome::Connected { cqe, .. } => cqe,
        other => panic!("no completion: {other:?}"),
    }
}

fn connect(q: &mut Queue, qid: u16, cntlid: u16) -> Cqe {
    let mut s = sqe(0x7f, 1);
    s.nsid = 1.into(); // fctype Connect
    s.cdw10 = (u32::from(qid) << 16).into();
    s.cdw11 = 31.into();
    s.dptr = Sgl::in_capsule(1024);
    let data = ConnectData::new([1; 16], cntlid, SUB, HOST).as_bytes().to_vec();
    complete(q.execute(0, &s, 1024, Some(data)))
}

/// A doorbell that counts its rings.
fn doorbell() -> (nvmf::Doorbell, Arc<AtomicUsize>) {
    let rings = Arc::new(AtomicUsize::new(0));
    let r = rings.clone();
    let ring = move || {
        r.fetch_add(1, Ordering::SeqCst);
    };
    (Arc::new(ring), rings)
}

struct Pair {
    admin: Queue,
    io: Queue,
    admin_rings: Arc<AtomicUsize>,
    io_rings: Arc<AtomicUsize>,
}

/// An enabled controller with I/O queue 1, both with doorbells.
fn pair(t: &Arc<Target>) -> Pair {
    let mut admin = Queue::new(t.clone(), TCP, addr(), addr());
    let cqe = connect(&mut admin, 0, 0xffff);
    assert!(cqe.status().is_success());
    let cntlid = cqe.dw0.get() as u16;
    let mut cc = sqe(0x7f, 2);
    cc.cdw11 = 0x14.into();
    cc.cdw12 = 0x0046_0001.into();
    assert!(complete(admin.execute(0, &cc, 0, None::<Vec<u8>>)).status().is_success());
    let mut io = Queue::new(t.clone(), TCP, addr(), addr());
    assert!(connect(&mut io, 1, cntlid).status().is_success());
    let (bell, admin_rings) = doorbell();
    admin.set_abort_doorbell(bell);
    let (bell, io_rings) = doorbell();
    io.set_abort_doorbell(bell);
    Pair { admin, io, admin_rings, io_rings }
}

fn abort_sqe(cid: u16, sqid: u16, target_cid: u16) -> Sqe {
    let mut s = sqe(0x08, cid);
    s.cdw10 = (u32::from(target_cid) << 16 | u32::from(sqid)).into();
    s
}

/// A 4 KiB write of cid `cid` to LBA 0, waiting for its data.
fn write_waiting(io: &mut Queue, cid: u16) {
    let mut w = sqe(0x01, cid);
    w.nsid = 1.into();
    w.cdw12 = 7.into();
    assert!(matches!(io.execute(0, &w, 4096, None::<Vec<u8>>), Outcome::NeedData { len: 4096, .. }));
}

/// A fused half of cid `cid` on LBA 0 (4 KiB), waiting for its data.
fn fused_waiting(io: &mut Queue, opcode: u8, cid: u16, fuse: u8) {
    let mut c = sqe(opcode, cid);
    c.nsid = 1.into();
    c.cdw12 = 7.into();
    c.flags |= fuse;
    assert!(matches!(io.execute(0, &c, 4096, None::<Vec<u8>>), Outcome::NeedData { len: 4096, .. }));
}

#[test]
fn aborting_a_fused_half_waiting_for_data_ends_its_partner_too() {
    let t = target();
    for aborted_first in [true, false] {
        let mut p = pair(&t);
        fused_waiting(&mut p.io, 0x05, 5, 0b01);
        fused_waiting(&mut p.io, 0x01, 6, 0b10);
        let (victim, partner) = if aborted_first { (5, 6) } else { (6, 5) };
        p.admin.execute(0, &abort_sqe(40, 1, victim), 0, None::<Vec<u8>>);
        let req = p.io.poll_abort().expect("request");
        let cqe = p.io.abort(req, |_, awaiting| awaiting).expect("aborted");
        assert_eq!((cqe.cid.get(), cqe.status()), (victim, Status::ABORT_REQUESTED));
        // The partner's data comes: it ends with Failed Fused Command,
        // as a completion now or the outcome of its data.
        let out = p.io.data_arrived(0, partner, vec![0u8; 4096]);
        let mut ended: Vec<Cqe> = std::iter::from_fn(|| p.io.poll_completion()).collect();
        if let Outcome::Complete { cqe, .. } = out {
            ended.push(cqe);
        }
        assert_eq!(ended.len(), 1, "{ended:?}");
        assert_eq!((ended[0].cid.get(), ended[0].status()), (partner, Status::ABORTED_FAILED_FUSED));
        // The queue takes a new pair.
        fused_waiting(&mut p.io, 0x05, 7, 0b01);
    }
}

#[test]
fn a_write_waiting_for_its_data_is_aborted_through_the_mailbox() {
    let t = target();
    let mut p = pair(&t);
    write_waiting(&mut p.io, 5);
    assert!(matches!(p.admin.execute(0, &abort_sqe(40, 1, 5), 0, None::<Vec<u8>>), Outcome::Deferred));
    assert_eq!(p.io_rings.load(Ordering::SeqCst), 1, "the I/O queue's doorbell rings");
    let req = p.io.poll_abort().expect("request for the I/O queue");
    assert_eq!(req.cid, 5);
    assert!(p.io.poll_abort().is_none());
    let mut asked = None;
    let cqe = p.io.abort(req, |cid, awaiting| {
        asked = Some((cid, awaiting));
        true
    });
    assert_eq!(asked, Some((5, true)), "the transport is asked about a command waiting for data");
    let cqe = cqe.expect("the aborted write's completion");
    assert_eq!((cqe.cid.get(), cqe.status()), (5, Status::ABORT_REQUESTED));
    assert_eq!(p.io.awaiting_data(), 0, "the queue forgot the write");
    assert_eq!(p.admin_rings.load(Ordering::SeqCst), 1, "the admin queue's doorbell rings");
    let answer = p.admin.poll_abort_answer().expect("the Abort's completion");
    assert_eq!((answer.cid.get(), answer.status(), answer.dw0.get() & 1), (40, Status::SUCCESS, 0));
    assert!(p.admin.poll_abort_answer().is_none());
    // The CID is free again: a new write with it is taken.
    write_waiting(&mut p.io, 5);
}

#[test]
fn a_command_the_transport_cannot_stop_or_an_unknown_cid_is_not_aborted() {
    let t = target();
    let mut p = pair(&t);
    write_waiting(&mut p.io, 7);
    assert!(matches!(p.admin.execute(0, &abort_sqe(41, 1, 7), 0, None::<Vec<u8>>), Outcome::Deferred));
    let req = p.io.poll_abort().expect("request");
    assert!(p.io.abort(req, |_, _| false).is_none());
    assert_eq!(p.io.awaiting_data(), 1, "the write still waits for its data");
    let answer = p.admin.poll_abort_answer().expect("answer");
    assert_eq!((answer.cid.get(), answer.dw0.get() & 1), (41, 1));
    // A CID the queue does not hold: the driver is asked with no data
    // outstanding, and says no.
    assert!(matches!(p.admin.execute(0, &abort_sqe(42, 1, 99), 0, None::<Vec<u8>>), Outcome::Deferred));
    let req = p.io.poll_abort().expect("request");
    let mut asked = None;
    assert!(p
        .io
        .abort(req, |cid, awaiting| {
            asked = Some((cid, awaiting));
            false
        })
        .is_none());
    assert_eq!(asked, Some((99, false)));
    assert_eq!(p.admin.poll_abort_answer().map(|c| c.dw0.get() & 1), Some(1));
}

#[test]
fn admin_commands_and_unknown_queues_are_answered_not_aborted_at_once() {
    let t = target();
    let mut p = pair(&t);
    for (sqid, why) in [(0, "admin queue"), (9, "no such I/O queue")] {
        let cqe = complete(p.admin.execute(0, &abort_sqe(43, sqid, 1), 0, None::<Vec<u8>>));
        assert_eq!((cqe.status(), cqe.dw0.get() & 1), (Status::SUCCESS, 1), "{why}");
    }
    assert_eq!(p.io_rings.load(Ordering::SeqCst), 0);
}

#[test]
fn aborts_beyond_the_advertised_limit_are_refused_until_one_completes() {
    let t = target();
    let mut p = pair(&t);
    // Identify Controller: ACL (byte 258) is the limit, 0-based.
    let mut id = sqe(0x06, 50);
    id.cdw10 = 1.into();
    let page = match p.admin.execute(0, &id, 4096, None::<Vec<u8>>) {
        Outcome::Complete { data, .. } => data,
        other => panic!("{other:?}"),
    };
    let limit = usize::from(page[258]) + 1;
    for i in 0..limit {
        let cid = 60 + i as u16;
        assert!(matches!(p.admin.execute(0, &abort_sqe(cid, 1, 1), 0, None::<Vec<u8>>), Outcome::Deferred));
    }
    let over = complete(p.admin.execute(0, &abort_sqe(70, 1, 1), 0, None::<Vec<u8>>));
    assert_eq!(over.status(), Status::ABORT_COMMAND_LIMIT);
    let req = p.io.poll_abort().expect("request");
    assert!(p.io.abort(req, |_, _| false).is_none());
    assert!(p.admin.poll_abort_answer().is_some());
    assert!(matches!(p.admin.execute(0, &abort_sqe(71, 1, 1), 0, None::<Vec<u8>>), Outcome::Deferred));
}

#[test]
fn an_io_queue_that_closes_answers_its_posted_aborts() {
    let t = target();
    let mut p = pair(&t);
    write_waiting(&mut p.io, 3);
    assert!(matches!(p.admin.execute(0, &abort_sqe(44, 1, 3), 0, None::<Vec<u8>>), Outcome::Deferred));
    p.io.close();
    assert_eq!(p.admin.poll_abort_answer().map(|c| (c.cid.get(), c.dw0.get() & 1)), Some((44, 1)));
    // The closed queue's ID takes no more requests.
    let cqe = complete(p.admin.execute(0, &abort_sqe(45, 1, 3), 0, None::<Vec<u8>>));
    assert_eq!(cqe.dw0.get() & 1, 1);
}

/// A Controller Level Reset (CC.EN from 1 to 0) ends every outstanding
/// admin command, an Abort waiting for its I/O queue's answer too (NVMe
/// Base 2.0 3.7.2): the host may use its CID again at once, so an answer
/// to an Abort from before the reset never completes anything after it,
/// and the Aborts it counted no longer count against ACL.
#[test]
fn an_abort_outstanding_at_a_controller_reset_never_completes_after_it() {
    let t = target();
    let mut p = pair(&t);
    write_waiting(&mut p.io, 5);
    assert!(matches!(p.admin.execute(0, &abort_sqe(40, 1, 5), 0, None::<Vec<u8>>), Outcome::Deferred));
    let req = p.io.poll_abort().expect("posted to the I/O queue");
    for (cid, value) in [(2, 0x0046_0000u32), (3, 0x0046_0001)] {
        let mut cc = sqe(0x7f, cid);
        cc.cdw11 = 0x14.into();
        cc.cdw12 = value.into();
        assert!(complete(p.admin.execute(0, &cc, 0, None::<Vec<u8>>)).status().is_success());
    }
    p.io.abort(req, |_, _| true);
    assert!(p.admin.poll_abort_answer().is_none(), "the Abort ended with the reset");
    let mut io = Queue::new(t.clone(), TCP, addr(), addr());
    let cntlid = p.admin.controller().expect("connected").cntlid;
    assert!(connect(&mut io, 1, cntlid).status().is_success());
    let (bell, _) = doorbell();
    io.set_abort_doorbell(bell);
    for cid in 41..45 {
        write_waiting(&mut io, cid);
        let out = p.admin.execute(0, &abort_sqe(cid, 1, cid), 0, None::<Vec<u8>>);
        assert!(matches!(out, Outcome::Deferred), "Abort {cid} within ACL");
    }
    let req = io.poll_abort().expect("the new queue's request");
    assert!(p.io.poll_abort().is_none(), "the deleted queue takes none of the new one's");
    io.abort(req, |_, _| true);
    assert!(p.admin.poll_abort_answer().is_some());
}
