//! Controller behaviour through `Queue::execute`, no transport, no I/O.

use block::Described;
use nvme_spec::fabrics::ConnectData;
use nvme_spec::log::AnaState;
use nvme_spec::{Cqe, Sgl, Sqe, Status};
use nvmf::{BlockOp, Transport};

type Target = nvmf::Target<Described>;
type Subsystem = nvmf::Subsystem<Described>;
type Namespace = nvmf::Namespace<Described>;
type Queue = nvmf::Queue<Described>;
type QueueKind = nvmf::QueueKind<Described>;
type Outcome<B> = nvmf::Outcome<B, Described>;
use nvmf::Settings;
use std::net::SocketAddr;
use std::sync::Arc;
use zerocopy::IntoBytes;

const SUB: &str = "nqn.2026-11.io.ironwire:test";
const SECRET: &str = "nqn.2026-11.io.ironwire:secret";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:host-a";
const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:host-b";

/// A transport as a binding describes itself (NVMe/TCP's values).
const TCP: Transport =
    Transport { name: "tcp", trtype: 3, treq: 2, tsas: [0; 16], sgls: 1 | (1 << 20), in_capsule: 8192, icdoff: 0 };

fn addr() -> SocketAddr {
    "127.0.0.1:4420".parse().expect("addr")
}

fn target() -> Arc<Target> {
    let t = Target::new(Settings { max_transfer: 128 * 1024, ..Default::default() });
    let s = t.add_subsystem(Subsystem::new(SUB, "SN1", true, Vec::new())).expect("sub");
    let dev = Arc::new(Described::new("r0", 512, 2048));
    s.add_namespace(Namespace::new(SUB, 1, dev)).expect("ns");
    let s2 = t.add_subsystem(Subsystem::new(SECRET, "SN2", false, vec![OTHER.to_string()])).expect("sub2");
    s2.add_namespace(Namespace::new(SECRET, 1, Arc::new(Described::new("n0", 4096, 256)))).expect("ns");
    t.add_port(addr(), TCP, false);
    t.add_port("127.0.0.1:8009".parse().expect("addr"), TCP, true);
    Arc::new(t)
}

/// A command as every fabrics host sends it: PSDT 01b (an SGL).
fn sqe(opcode: u8, cid: u16) -> Sqe {
    let mut s = Sqe { opcode, flags: Sqe::PSDT_SGL, ..Default::default() };
    s.cid = cid.into();
    s
}

fn fabrics(fctype: u8, cid: u16) -> Sqe {
    let mut s = sqe(0x7f, cid);
    s.nsid = u32::from(fctype).into();
    s
}

/// Executes `s` the way a transport does: the transfer length from the
/// SGL, data handed over after the queue asks for it.
fn run(q: &mut Queue, s: &Sqe, data: Option<Vec<u8>>) -> Outcome<Vec<u8>> {
    match ex(q, 0, s) {
        Outcome::NeedData { len, .. } => {
            let d = data.expect("command wants data");
            assert_eq!(len as usize, d.len());
            q.data_arrived(0, s.cid.get(), d)
        }
        other => other,
    }
}

fn ex(q: &mut Queue, now_ms: u64, s: &Sqe) -> Outcome<Vec<u8>> {
    q.execute(now_ms, s, s.dptr.length.get(), None::<Vec<u8>>)
}

fn status(o: &Outcome<Vec<u8>>) -> Status {
    match o {
        Outcome::Complete { cqe, .. }
        | Outcome::Connected { cqe, .. }
        | Outcome::CompleteAndClose { cqe }
        | Outcome::Shutdown { cqe, .. }
        | Outcome::FlushThenComplete { cqe, .. } => cqe.status(),
        other => panic!("no completion: {other:?}"),
    }
}

fn cqe_of(o: Outcome<Vec<u8>>) -> (Cqe, Vec<u8>) {
    match o {
        Outcome::Complete { cqe, data } => (cqe, data),
        Outcome::Connected { cqe, .. } | Outcome::CompleteAndClose { cqe } | Outcome::FlushThenComplete { cqe, .. } => {
            (cqe, Vec::new())
        }
        other => panic!("no completion: {other:?}"),
    }
}

fn connect_sqe(qid: u16, sqsize: u16, kato: u32) -> Sqe {
    let mut s = fabrics(0x01, 1);
    s.cdw10 = (u32::from(qid) << 16).into();
    s.cdw11 = u32::from(sqsize).into();
    s.cdw12 = kato.into();
    s.dptr = Sgl::in_capsule(1024);
    s
}

fn connect(q: &mut Queue, qid: u16, cntlid: u16, sub: &str, host: &str) -> Outcome<Vec<u8>> {
    let data = ConnectData::new([1; 16], cntlid, sub, host).as_bytes().to_vec();
    run(q, &connect_sqe(qid, 31, 5000), Some(data))
}

fn prop_set_cc(q: &mut Queue, v: u32) -> Status {
    let mut s = fabrics(0x00, 2);
    s.cdw11 = 0x14.into();
    s.cdw12 = v.into();
    status(&run(q, &s, None))
}

fn prop_get(q: &mut Queue, off: u32, eight: bool) -> (Status, u64) {
    let mut s = fabrics(0x04, 3);
    s.cdw10 = u32::from(eight).into();
    s.cdw11 = off.into();
    let (cqe, _) = cqe_of(run(q, &s, None));
    (cqe.status(), cqe.result_u64())
}

/// An enabled admin queue and its controller ID.
fn admin(t: &Arc<Target>) -> (Queue, u16) {
    let mut q = Queue::new(t.clone(), TCP, addr(), addr());
    let (cqe, _) = cqe_of(connect(&mut q, 0, 0xffff, SUB, HOST));
    assert!(cqe.status().is_success());
    assert_eq!(prop_set_cc(&mut q, 0x0046_0001), Status::SUCCESS);
    (q, cqe.dw0.get() as u16)
}

fn io_queue(t: &Arc<Target>, cntlid: u16, qid: u16) -> Queue {
    let mut q = Queue::new(t.clone(), TCP, addr(), addr());
    assert!(status(&connect(&mut q, qid, cntlid, SUB, HOST)).is_success());
    q
}

fn read_sqe(cid: u16, nsid: u32, lba: u64, blocks: u32, bs: u32) -> Sqe {
    let mut s = sqe(0x02, cid);
    s.nsid = nsid.into();
    s.cdw10 = (lba as u32).into();
    s.cdw11 = ((lba >> 32) as u32).into();
    s.cdw12 = (blocks - 1).into();
    s.dptr = Sgl::transport(blocks * bs);
    s
}

#[test]
fn enables_the_controller_through_cc_and_reports_ready() {
    let t = target();
    let mut q = Queue::new(t.clone(), TCP, addr(), addr());
    assert!(status(&connect(&mut q, 0, 0xffff, SUB, HOST)).is_success());
    assert_eq!(prop_get(&mut q, 0x1c, false), (Status::SUCCESS, 0));
    let (st, cap) = prop_get(&mut q, 0x00, true);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(cap & 0xffff, 1023, "MQES");
    assert_eq!(prop_get(&mut q, 0x08, false).1, 0x0001_0400);
    prop_set_cc(&mut q, 0x0046_0001);
    assert_eq!(prop_get(&mut q, 0x1c, false).1 & 1, 1, "CSTS.RDY");
    // Shutdown notification: the caller is to flush the namespace's
    // device; until it says so, SHST is "occurring".
    let mut s = fabrics(0x00, 2);
    s.cdw11 = 0x14.into();
    s.cdw12 = 0x0046_4001.into();
    let controller = match run(&mut q, &s, None) {
        Outcome::Shutdown { cqe, devices, shutdown } => {
            assert!(cqe.status().is_success());
            assert_eq!(devices.len(), 1, "the subsystem's one namespace");
            (q.controller().expect("connected").clone(), shutdown)
        }
        other => panic!("expected a shutdown, got {other:?}"),
    };
    assert_eq!(prop_get(&mut q, 0x1c, false).1 & 0xc, 0x4, "SHST occurring");
    // Written again while it runs, CC.SHN starts no second shutdown.
    assert_eq!(prop_set_cc(&mut q, 0x0046_4001), Status::SUCCESS);
    // Cleared and set again, it does: the first one's flush no longer
    // completes anything (writes may have come in between).
    assert_eq!(prop_set_cc(&mut q, 0x0046_0001), Status::SUCCESS);
    let Outcome::Shutdown { shutdown: again, .. } = run(&mut q, &s, None) else { panic!("a second shutdown") };
    let (controller, first) = controller;
    assert_ne!(first, again);
    controller.shutdown_complete(first);
    assert_eq!(prop_get(&mut q, 0x1c, false).1 & 0xc, 0x4, "SHST still occurring");
    controller.shutdown_complete(again);
    assert_eq!(prop_get(&mut q, 0x1c, false).1 & 0xc, 0x8, "SHST complete");
    // Clearing SHN ends the shutdown state.
    assert_eq!(prop_set_cc(&mut q, 0x0046_0001), Status::SUCCESS);
    assert_eq!(prop_get(&mut q, 0x1c, false).1 & 0xc, 0, "SHST cleared");
    assert_eq!(prop_get(&mut q, 0x40, false).0, Status::INVALID_FIELD.dnr());
}

#[test]
fn rejects_commands_before_connect_and_before_enable() {
    let t = target();
    let mut q = Queue::new(t.clone(), TCP, addr(), addr());
    assert_eq!(status(&run(&mut q, &read_sqe(1, 1, 0, 1, 512), None)), Status::COMMAND_SEQUENCE_ERROR.dnr());
    assert!(status(&connect(&mut q, 0, 0xffff, SUB, HOST)).is_success());
    let mut id = sqe(0x06, 4);
    id.cdw10 = 1.into();
    id.dptr = Sgl::transport(4096);
    assert_eq!(status(&run(&mut q, &id, None)), Status::COMMAND_SEQUENCE_ERROR.dnr());
}

#[test]
fn refuses_a_host_not_on_the_list_with_invalid_host() {
    let t = target();
    let mut q = Queue::new(t.clone(), TCP, addr(), addr());
    let (cqe, _) = cqe_of(connect(&mut q, 0, 0xffff, SECRET, HOST));
    assert_eq!(cqe.status(), Status::CONNECT_INVALID_HOST.dnr());
    assert_eq!(cqe.dw0.get(), (1 << 16) | 512, "IPO names HOSTNQN in the connect data");
    assert!(matches!(q.kind(), QueueKind::Unconnected));
    let mut q2 = Queue::new(t, TCP, addr(), addr());
    assert!(status(&connect(&mut q2, 0, 0xffff, SECRET, OTHER)).is_success());
}

#[test]
fn lets_an_empty_host_nqn_into_subsystems_open_to_any_host_only() {
    // spdk_nvme_perf connects with no host NQN unless given one.
    let t = target();
    let mut q = Queue::new(t.clone(), TCP, addr(), addr());
    let (cqe, _) = cqe_of(connect(&mut q, 0, 0xffff, SUB, ""));
    assert!(cqe.status().is_success(), "{:?}", cqe.status());
    assert_eq!(prop_set_cc(&mut q, 0x0046_0001), Status::SUCCESS);
    let cntlid = cqe.dw0.get() as u16;
    let mut io = Queue::new(t.clone(), TCP, addr(), addr());
    assert!(status(&connect(&mut io, 1, cntlid, SUB, "")).is_success());
    let mut q2 = Queue::new(t, TCP, addr(), addr());
    let (cqe, _) = cqe_of(connect(&mut q2, 0, 0xffff, SECRET, ""));
    assert_eq!(cqe.status(), Status::CONNECT_INVALID_HOST.dnr());
}

#[test]
fn rejects_unknown_subsystem_and_bad_connect_parameters() {
    let t = target();
    let mut q = Queue::new(t.clone(), TCP, addr(), addr());
    let (cqe, _) = cqe_of(connect(&mut q, 0, 0xffff, "nqn.2026-11.none:x", HOST));
    assert_eq!(cqe.status(), Status::CONNECT_INVALID_PARAMETERS.dnr());
    assert_eq!(cqe.dw0.get(), (1 << 16) | 256);
    let data = ConnectData::new([1; 16], 0xffff, SUB, HOST).as_bytes().to_vec();
    let (cqe, _) = cqe_of(run(&mut q, &connect_sqe(0, 0, 0), Some(data)));
    assert_eq!(cqe.dw0.get(), 44, "IPO names SQSIZE in the SQE");
    let (_a, cntlid) = admin(&t);
    let mut io = Queue::new(t.clone(), TCP, addr(), addr());
    assert_eq!(
        status(&connect(&mut io, 1, cntlid.wrapping_add(100), SUB, HOST)),
        Status::CONNECT_INVALID_PARAMETERS.dnr()
    );
    assert_eq!(status(&connect(&mut io, 1, cntlid, SUB, OTHER)), Status::CONNECT_INVALID_PARAMETERS.dnr());
    assert_eq!(status(&connect(&mut io, 999, cntlid, SUB, HOST)), Status::CONNECT_INVALID_PARAMETERS.dnr());
    let _q1 = io_queue(&t, cntlid, 1);
    let mut dup = Queue::new(t.clone(), TCP, addr(), addr());
    assert_eq!(
        status(&connect(&mut dup, 1, cntlid, SUB, HOST)),
        Status::CONNECT_INVALID_PARAMETERS.dnr(),
        "qid 1 twice"
    );
}

/// A Connect refused with Connect Invalid Parameters (or Invalid Host)
/// names the field in Dword 0: IPO, its byte offset, in bits 15:00, and
/// IATTR in bit 16, set when the field is in the Connect data and clear
/// when it is in the SQE (NVMe-oF Connect response). The Linux host reads
/// it so (`offset >> 16` for IATTR, `offset & 0xffff` for IPO, in
/// nvmf_log_connect_error) to log the field, as nvmet and SPDK write it.
#[test]
fn a_refused_connect_names_the_field_as_hosts_read_it() {
    let t = target();
    let (_a, cntlid) = admin(&t);
    let iattr_ipo = |o: Outcome<Vec<u8>>| {
        let (cqe, _) = cqe_of(o);
        (cqe.dw0.get() >> 16, cqe.dw0.get() & 0xffff)
    };
    let mut q = Queue::new(t.clone(), TCP, addr(), addr());
    assert_eq!(iattr_ipo(connect(&mut q, 0, 0xffff, "nqn.2026-11.none:x", HOST)), (1, 256), "SUBNQN");
    assert_eq!(iattr_ipo(connect(&mut q, 0, 0xffff, SECRET, HOST)), (1, 512), "HOSTNQN");
    assert_eq!(iattr_ipo(connect(&mut q, 0, 7, SUB, HOST)), (1, 16), "CNTLID");
    let data = ConnectData::new([1; 16], 0xffff, SUB, HOST).as_bytes().to_vec();
    assert_eq!(iattr_ipo(run(&mut q, &connect_sqe(0, 0, 0), Some(data))), (0, 44), "SQSIZE");
    let mut io = Queue::new(t.clone(), TCP, addr(), addr());
    assert_eq!(iattr_ipo(connect(&mut io, 999, cntlid, SUB, HOST)), (0, 42), "QID");
}

#[test]
fn gives_each_admin_connect_its_own_controller_id() {
    let t = target();
    let (_a, c1) = admin(&t);
    let (_b, c2) = admin(&t);
    assert_ne!(c1, c2);
    assert_eq!(t.subsystem(SUB).expect("sub").controller_count(), 2);
}

#[test]
fn an_io_command_after_its_controller_is_gone_is_aborted_for_the_host_to_retry() {
    let t = target();
    let (mut a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    assert!(matches!(run(&mut io, &read_sqe(1, 1, 0, 1, 512), None), Outcome::Io(_)));
    a.close();
    assert!(io.expired(0), "the I/O queue must close with its controller");
    // No DNR: a restart or a lost admin connection is not the command's
    // fault, and the Linux host fails a DNR completion to the application
    // instead of retrying it after it reconnects.
    assert_eq!(status(&run(&mut io, &read_sqe(2, 1, 0, 1, 512), None)), Status::ABORTED_SQ_DELETION);
}

#[test]
fn checks_lba_range_transfer_size_and_sgl_length() {
    let t = target();
    let (_a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    // 1 MiB of 512-byte blocks = 2048 blocks.
    assert_eq!(status(&run(&mut io, &read_sqe(1, 1, 2047, 2, 512), None)), Status::LBA_OUT_OF_RANGE.dnr());
    assert_eq!(status(&run(&mut io, &read_sqe(1, 1, u64::MAX, 1, 512), None)), Status::LBA_OUT_OF_RANGE.dnr());
    assert_eq!(
        status(&run(&mut io, &read_sqe(1, 1, 0, 512, 512), None)),
        Status::INVALID_FIELD.dnr(),
        "256 KiB > MDTS"
    );
    let mut bad = read_sqe(1, 1, 0, 8, 512);
    bad.dptr = Sgl::transport(512);
    assert_eq!(status(&run(&mut io, &bad, None)), Status::SGL_DATA_LENGTH_INVALID.dnr());
    assert_eq!(status(&run(&mut io, &read_sqe(1, 7, 0, 1, 512), None)), Status::INVALID_NAMESPACE.dnr());
    let mut unknown = read_sqe(1, 1, 0, 1, 512);
    unknown.opcode = 0x7e;
    assert_eq!(status(&run(&mut io, &unknown, None)), Status::INVALID_OPCODE.dnr());
    match run(&mut io, &read_sqe(1, 1, 2040, 8, 512), None) {
        Outcome::Io(req) => assert!(matches!(req.op, BlockOp::Read { lba: 2040, len_bytes: 4096 })),
        other => panic!("{other:?}"),
    }
}

#[test]
fn requests_share_the_queues_handle_on_the_device_not_its_atomic_count() {
    let t = target();
    let (_a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    let device = t.subsystem(SUB).and_then(|s| s.namespace(1)).expect("namespace 1").device.clone();
    let first = match run(&mut io, &read_sqe(1, 1, 0, 1, 512), None) {
        Outcome::Io(req) => req,
        other => panic!("{other:?}"),
    };
    // The queue's cache took one reference to the device (and this test
    // one); every request after that shares the queue's own handle.
    let shared = Arc::strong_count(&device);
    let mut held = vec![first];
    for cid in 2..=64 {
        match run(&mut io, &read_sqe(cid, 1, u64::from(cid), 1, 512), None) {
            Outcome::Io(req) => held.push(req),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(Arc::strong_count(&device), shared, "a request cloned the device's Arc");
    assert!(held.iter().all(|r| Arc::ptr_eq(&r.device, &device)), "a request names another device");
    assert_eq!(std::rc::Rc::strong_count(&held[0].device), 1 + held.len(), "the queue's handle and the requests");
}

#[test]
fn write_asks_for_data_then_becomes_a_block_request() {
    let t = target();
    let (_a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    let mut w = read_sqe(9, 1, 4, 2, 512);
    w.opcode = 0x01;
    w.cdw12 = (1 | (1 << 30)).into();
    assert!(matches!(ex(&mut io, 0, &w), Outcome::NeedData { len: 1024, .. }));
    assert_eq!(io.awaiting_data(), 1);
    match io.data_arrived(0, 9, vec![7u8; 1024]) {
        Outcome::Io(req) => {
            assert_eq!(req.cid, 9);
            assert!(matches!(req.op, BlockOp::Write { lba: 4, fua: true, .. }));
        }
        other => panic!("{other:?}"),
    }
}

/// The test target with a null device as namespace 2, and an I/O queue.
fn with_null_ns2() -> (Arc<Target>, Queue) {
    let t = target();
    let sub = t.subsystem(SUB).expect("subsystem");
    let null = Described { backend: "null", ..Described::new("null0", 512, 2048) };
    sub.add_namespace(Namespace::new(SUB, 2, Arc::new(null))).expect("ns 2");
    let (_a, cntlid) = admin(&t);
    let io = io_queue(&t, cntlid, 1);
    (t, io)
}

#[test]
fn only_a_plain_write_to_a_null_device_may_discard_its_data() {
    let (_t, mut io) = with_null_ns2();
    let on = |opcode: u8, cid: u16, nsid: u32, fuse: u8| {
        let mut s = read_sqe(cid, nsid, 0, 1, 512);
        s.opcode = opcode;
        s.flags |= fuse;
        s
    };
    let discard = |out: Outcome<Vec<u8>>| match out {
        Outcome::NeedData { len: 512, discard } => discard,
        other => panic!("{other:?}"),
    };
    assert!(discard(ex(&mut io, 0, &on(0x01, 1, 2, 0))), "a write to the null device");
    assert!(!discard(ex(&mut io, 0, &on(0x01, 2, 1, 0))), "a write to a RAM device");
    assert!(!discard(ex(&mut io, 0, &on(0x05, 3, 2, 0))), "a Compare reads its data");
    assert!(!discard(ex(&mut io, 0, &on(0x05, 4, 2, 1))), "the Compare half of a fused pair");
    assert!(!discard(ex(&mut io, 0, &on(0x01, 5, 2, 2))), "the Write half of a fused pair");
}

#[test]
fn discarded_data_never_lands_on_a_device_that_replaced_the_null_one_meanwhile() {
    let (t, mut io) = with_null_ns2();
    let sub = t.subsystem(SUB).expect("subsystem");
    let mut w = read_sqe(7, 2, 0, 1, 512);
    w.opcode = 0x01;
    assert!(matches!(ex(&mut io, 0, &w), Outcome::NeedData { len: 512, discard: true }));
    // The namespace is now a RAM device; the data the transport did not
    // keep arrives.
    sub.remove_namespace(2).expect("removed");
    sub.add_namespace(Namespace::new(SUB, 2, Arc::new(Described::new("ram0", 512, 2048)))).expect("ns 2 again");
    assert_eq!(status(&io.data_arrived(0, 7, vec![0u8; 512])), Status::NAMESPACE_NOT_READY);
    // A write solicited for the RAM device lands as usual.
    w.cid = 8.into();
    assert!(matches!(ex(&mut io, 0, &w), Outcome::NeedData { len: 512, discard: false }));
    assert!(matches!(io.data_arrived(0, 8, vec![1u8; 512]), Outcome::Io(_)));
}

#[test]
fn data_solicited_for_a_removed_namespace_never_lands_on_the_one_that_took_its_nsid() {
    let t = target();
    let sub = t.subsystem(SUB).expect("subsystem");
    let (_a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    let mut w = read_sqe(7, 1, 0, 1, 512);
    w.opcode = 0x01;
    assert!(matches!(ex(&mut io, 0, &w), Outcome::NeedData { len: 512, discard: false }));
    let (d, ranges) = dsm_sqe(8, &[(0, 16)]);
    assert!(matches!(ex(&mut io, 0, &d), Outcome::NeedData { len: 16, .. }));
    // Namespace 1 is replaced by one on another device (a reload that
    // changes its device: removed, its holders waited out, added again)
    // while the host's data for both commands is on its way.
    sub.remove_namespace(1).expect("removed");
    sub.add_namespace(Namespace::new(SUB, 1, Arc::new(Described::new("other", 512, 2048)))).expect("ns 1 again");
    for (cid, data) in [(7, vec![0x5a; 512]), (8, ranges)] {
        match io.data_arrived(0, cid, data) {
            Outcome::Io(req) => panic!("cid {cid}, addressed to the removed namespace, ran on {}", req.device.name),
            out => assert_eq!(status(&out), Status::INVALID_NAMESPACE.dnr(), "cid {cid}"),
        }
    }
    // A write solicited for the new namespace lands as usual.
    w.cid = 9.into();
    assert!(matches!(ex(&mut io, 0, &w), Outcome::NeedData { len: 512, .. }));
    assert!(matches!(io.data_arrived(0, 9, vec![1u8; 512]), Outcome::Io(_)));
}

#[test]
fn dataset_management_deallocates_the_listed_ranges() {
    let t = target();
    let (_a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    let mut d = sqe(0x09, 5);
    d.nsid = 1.into();
    d.cdw10 = 1.into(); // two ranges
    d.cdw11 = 4.into(); // AD
    d.dptr = Sgl::in_capsule(32);
    let mut ranges = Vec::new();
    for (slba, nlb) in [(8u64, 16u32), (100, 4)] {
        ranges.extend_from_slice(&0u32.to_le_bytes());
        ranges.extend_from_slice(&nlb.to_le_bytes());
        ranges.extend_from_slice(&slba.to_le_bytes());
    }
    match run(&mut io, &d, Some(ranges.clone())) {
        Outcome::Io(req) => match req.op {
            BlockOp::Deallocate { ranges, .. } => assert_eq!(ranges, vec![(8, 16), (100, 4)]),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
    ranges[8..16].copy_from_slice(&4000u64.to_le_bytes());
    assert_eq!(status(&run(&mut io, &d, Some(ranges))), Status::LBA_OUT_OF_RANGE.dnr());
}

/// A Dataset Management (AD set) of `ranges` `(slba, nlb)` on namespace 1.
fn dsm_sqe(cid: u16, ranges: &[(u64, u32)]) -> (Sqe, Vec<u8>) {
    let mut d = sqe(0x09, cid);
    d.nsid = 1.into();
    d.cdw10 = (ranges.len() as u32 - 1).into();
    d.cdw11 = 4.into();
    d.dptr = Sgl::in_capsule(16 * ranges.len() as u32);
    let mut data = Vec::new();
    for &(slba, nlb) in ranges {
        data.extend_from_slice(&0u32.to_le_bytes());
        data.extend_from_slice(&nlb.to_le_bytes());
        data.extend_from_slice(&slba.to_le_bytes());
    }
    (d, data)
}

#[test]
fn dataset_management_beyond_dmsl_is_refused_with_command_size_limit_exceeded() {
    let t = target();
    let (_a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    // Two ranges of the largest NLB: each within DMRSL, together past DMSL.
    // The limit is checked before the LBA range (the 2048-block namespace
    // could not hold either), so the status names the size.
    let (d, data) = dsm_sqe(7, &[(0, u32::MAX), (0, u32::MAX)]);
    assert_eq!(status(&run(&mut io, &d, Some(data))), Status::COMMAND_SIZE_LIMIT_EXCEEDED.dnr());
    assert_eq!(nvmf::limits::DMSL, u64::from(u32::MAX));
    // One such range is within every limit, and then out of range.
    let (d, data) = dsm_sqe(8, &[(0, u32::MAX)]);
    assert_eq!(status(&run(&mut io, &d, Some(data))), Status::LBA_OUT_OF_RANGE.dnr());
    // 256 ranges (NR 255), every one the command can carry, are accepted.
    let many: Vec<(u64, u32)> = (0..256).map(|i| (i * 8, 8)).collect();
    let (d, data) = dsm_sqe(9, &many);
    match run(&mut io, &d, Some(data)) {
        Outcome::Io(req) => match req.op {
            BlockOp::Deallocate { ranges, .. } => assert_eq!(ranges.len(), 256),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

#[test]
fn write_zeroes_beyond_wzsl_is_refused_with_command_size_limit_exceeded() {
    let t = target();
    let sub = t.subsystem(SUB).expect("subsystem");
    sub.add_namespace(Namespace::new(SUB, 2, Arc::new(Described::new("big4k", 4096, 1 << 20)))).expect("ns 2");
    let (_a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    let wz = |cid: u16, nsid: u32, blocks: u32| {
        let mut s = sqe(0x08, cid);
        s.nsid = nsid.into();
        s.cdw12 = (blocks - 1).into();
        s
    };
    let limit_blocks = (nvmf::limits::WZSL_BYTES / 4096) as u32;
    assert_eq!(limit_blocks, 8192, "32 MiB of 4 KiB blocks");
    match ex(&mut io, 0, &wz(1, 2, limit_blocks)) {
        Outcome::Io(req) => assert!(matches!(req.op, BlockOp::WriteZeroes { blocks: 8192, .. }), "{:?}", req.op),
        other => panic!("{other:?}"),
    }
    assert_eq!(status(&ex(&mut io, 0, &wz(2, 2, limit_blocks + 1))), Status::COMMAND_SIZE_LIMIT_EXCEEDED.dnr());
    // A 512-byte namespace cannot exceed it: 65536 blocks are 32 MiB (and
    // more than the 2048-block device holds).
    assert_eq!(status(&ex(&mut io, 0, &wz(3, 1, 65536))), Status::LBA_OUT_OF_RANGE.dnr());
}

#[test]
fn identify_nvm_controller_reports_the_enforced_limits() {
    let t = target();
    let (mut a, _) = admin(&t);
    let (st, page) = identify(&mut a, 0x06, 0);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(page[0], 0, "VSL: no Verify");
    assert_eq!(page[1], nvmf::limits::WZSL, "WZSL");
    assert_eq!(4096u64 << page[1], nvmf::limits::WZSL_BYTES);
    assert_eq!(page[3], 0, "DMRL: every range NR can carry");
    assert_eq!(u32::from_le_bytes(page[4..8].try_into().expect("4")), u32::MAX, "DMRSL");
    assert_eq!(u64::from_le_bytes(page[8..16].try_into().expect("8")), nvmf::limits::DMSL, "DMSL");
    assert!(page[16..].iter().all(|&b| b == 0));
}

fn identify(q: &mut Queue, cns: u8, nsid: u32) -> (Status, Vec<u8>) {
    let mut s = sqe(0x06, 6);
    s.cdw10 = u32::from(cns).into();
    s.nsid = nsid.into();
    s.dptr = Sgl::transport(4096);
    let (cqe, data) = cqe_of(run(q, &s, None));
    (cqe.status(), data)
}

#[test]
fn identify_reports_controller_namespace_and_descriptors() {
    let t = target();
    let (mut a, cntlid) = admin(&t);
    let (st, ctrl) = identify(&mut a, 1, 0);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(&ctrl[24..32], b"ironwire");
    assert_eq!(u16::from_le_bytes([ctrl[78], ctrl[79]]), cntlid);
    assert_eq!(ctrl[77], 5, "MDTS 128 KiB = 2^5 pages");
    assert_eq!(&ctrl[768..768 + SUB.len()], SUB.as_bytes());
    assert_eq!(ctrl[525], 0x04, "memory namespaces only: no volatile write cache; no broadcast flush");
    assert_eq!(u32::from_le_bytes([ctrl[1792], ctrl[1793], ctrl[1794], ctrl[1795]]), (64 + 8192) / 16);
    let (_, ns) = identify(&mut a, 0, 1);
    assert_eq!(u64::from_le_bytes(ns[0..8].try_into().expect("8")), 2048);
    assert_eq!(ns[128 + 2], 9, "LBADS 512");
    let (_, list) = identify(&mut a, 2, 0);
    assert_eq!(&list[0..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
    let (_, descs) = identify(&mut a, 3, 1);
    assert_eq!((descs[0], descs[1]), (1, 8), "EUI-64 first");
    assert_eq!(&descs[4..12], &ns[120..128], "the EUI-64 Identify Namespace shows");
    assert_eq!((descs[12], descs[13]), (2, 16), "then NGUID");
    assert_eq!(&descs[16..32], &ns[104..120], "the NGUID Identify Namespace shows");
    assert_eq!((descs[32], descs[33]), (3, 16), "then UUID");
    assert_eq!((descs[52], descs[53], descs[56]), (4, 1, 0), "then CSI = NVM");
    assert_eq!(identify(&mut a, 0, 0).0, Status::INVALID_NAMESPACE.dnr());
    assert_eq!(identify(&mut a, 3, 9).0, Status::INVALID_NAMESPACE.dnr());
    assert_eq!(identify(&mut a, 0x42, 0).0, Status::INVALID_FIELD.dnr());
    let (_, zeros) = identify(&mut a, 0, 9);
    assert!(zeros.iter().all(|&b| b == 0), "inactive NSID reads as zeroes");
}

fn get_log(q: &mut Queue, lid: u8, len: u32, offset: u64) -> (Status, Vec<u8>) {
    let mut s = sqe(0x02, 7);
    let numd = len / 4 - 1;
    s.cdw10 = (u32::from(lid) | ((numd & 0xffff) << 16)).into();
    s.cdw11 = (numd >> 16).into();
    s.cdw12 = (offset as u32).into();
    s.cdw13 = ((offset >> 32) as u32).into();
    s.dptr = Sgl::transport(len);
    let (cqe, data) = cqe_of(run(q, &s, None));
    (cqe.status(), data)
}

fn discovery_admin(t: &Arc<Target>, host: &str) -> Queue {
    let mut q = Queue::new(t.clone(), TCP, addr(), addr());
    assert!(status(&connect(&mut q, 0, 0xffff, nvme_spec::DISCOVERY_NQN, host)).is_success());
    prop_set_cc(&mut q, 1);
    q
}

fn discovery_nqns(page: &[u8]) -> Vec<String> {
    let n = u64::from_le_bytes(page[8..16].try_into().expect("8")) as usize;
    (0..n)
        .map(|i| {
            let e = &page[1024 + i * 1024..2048 + i * 1024];
            String::from_utf8_lossy(&e[256..512]).trim_end_matches('\0').to_string()
        })
        .collect()
}

#[test]
fn discovery_log_lists_only_what_the_host_may_reach() {
    let t = target();
    let mut d = discovery_admin(&t, HOST);
    let (_, page) = get_log(&mut d, 0x70, 4096, 0);
    let nqns = discovery_nqns(&page);
    let disc = nvme_spec::DISCOVERY_NQN.to_string();
    assert_eq!(nqns, vec![SUB.to_string(), disc.clone(), disc], "one discovery entry per port");
    let e = &page[1024..2048];
    assert_eq!((e[0], e[1], e[2]), (3, 1, 2), "TCP, IPv4, NVM subsystem");
    assert_eq!(&e[32..36], b"4420");
    assert_eq!(&e[512..521], b"127.0.0.1");
    let mut d2 = discovery_admin(&t, OTHER);
    let (_, page) = get_log(&mut d2, 0x70, 8192, 0);
    assert_eq!(discovery_nqns(&page).len(), 4);
    // Paging: the second entry read on its own at offset 2048.
    let (_, window) = get_log(&mut d2, 0x70, 1024, 2048);
    assert_eq!(&window[256..256 + SECRET.len()], SECRET.as_bytes());
    // Discovery controllers have no I/O queues and no other logs.
    assert_eq!(get_log(&mut d2, 0x02, 512, 0).0, Status::INVALID_LOG_PAGE.dnr());
    assert_eq!(identify(&mut d2, 1, 0).1[111], 2, "CNTRLTYPE discovery");
}

#[test]
fn log_pages_answer_and_unknown_ones_are_refused() {
    let t = target();
    let (mut a, _) = admin(&t);
    let (st, smart) = get_log(&mut a, 0x02, 512, 0);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(smart[3], 100, "available spare");
    let (_, fw) = get_log(&mut a, 0x03, 512, 0);
    assert_eq!(fw[0], 1);
    let (_, effects) = get_log(&mut a, 0x05, 4096, 0);
    assert_eq!(effects[1024 + 4] & 3, 3, "Write: supported, changes LBA content");
    assert_eq!(get_log(&mut a, 0x01, 64, 0).0, Status::SUCCESS);
    assert_eq!(get_log(&mut a, 0x7a, 512, 0).0, Status::INVALID_LOG_PAGE.dnr());
    assert_eq!(get_log(&mut a, 0x02, 512, 8192).0, Status::INVALID_FIELD.dnr());
}

fn set_feature(q: &mut Queue, fid: u8, value: u32) -> (Status, u32) {
    let mut s = sqe(0x09, 8);
    s.cdw10 = u32::from(fid).into();
    s.cdw11 = value.into();
    let (cqe, _) = cqe_of(run(q, &s, None));
    (cqe.status(), cqe.dw0.get())
}

fn get_feature(q: &mut Queue, fid: u8) -> (Status, u32) {
    let mut s = sqe(0x0a, 8);
    s.cdw10 = u32::from(fid).into();
    let (cqe, _) = cqe_of(run(q, &s, None));
    (cqe.status(), cqe.dw0.get())
}

#[test]
fn features_are_stored_and_number_of_queues_is_granted() {
    let t = target();
    let (mut a, _) = admin(&t);
    assert_eq!(set_feature(&mut a, 0x07, 0x0003_0003), (Status::SUCCESS, 0x0003_0003));
    assert_eq!(get_feature(&mut a, 0x07).1, 0x0003_0003);
    assert_eq!(set_feature(&mut a, 0x07, 0xfffe_fffe).1, 0x007f_007f, "capped at 128 queues");
    assert_eq!(set_feature(&mut a, 0x0f, 15000).0, Status::SUCCESS);
    assert_eq!(get_feature(&mut a, 0x0f).1, 15000);
    assert_eq!(get_feature(&mut a, 0x06).0, Status::INVALID_FIELD.dnr(), "no volatile write cache to enable");
    assert_eq!(set_feature(&mut a, 0x06, 1).0, Status::INVALID_FIELD.dnr());
    assert_eq!(set_feature(&mut a, 0x02, 3).0, Status::INVALID_FIELD.dnr(), "only power state 0");
    assert_eq!(set_feature(&mut a, 0x55, 0).0, Status::INVALID_FIELD.dnr());
    let mut saved = sqe(0x09, 8);
    saved.cdw10 = (0x0b | (1 << 31)).into();
    assert_eq!(status(&run(&mut a, &saved, None)), Status::FEATURE_NOT_SAVEABLE.dnr());
}

/// Get Features with SEL 011b (supported capabilities) answers only for a
/// feature the controller has (NVMe base 2.0 5.27: an unsupported FID is
/// Invalid Field, whatever SEL), and the reserved SEL values are refused.
/// Get Features SEL 001b reports a feature's default value, 010b its saved
/// one (nothing is saveable: the default), 000b the current one (NVMe base
/// 2.0 5.27.1, Select).
#[test]
fn get_features_default_and_saved_values_are_not_the_current_ones() {
    let t = target();
    let (mut a, _) = admin(&t);
    let get = |q: &mut Queue, fid: u8, sel: u32, cdw11: u32| {
        let mut s = sqe(0x0a, 8);
        s.cdw10 = (u32::from(fid) | (sel << 8)).into();
        s.cdw11 = cdw11.into();
        let (cqe, _) = cqe_of(run(q, &s, None));
        (cqe.status(), cqe.dw0.get())
    };
    let (_, queues) = get(&mut a, 0x07, 0, 0);
    assert_eq!(set_feature(&mut a, 0x01, 0x0302_0103).0, Status::SUCCESS, "arbitration");
    assert_eq!(set_feature(&mut a, 0x04, 300).0, Status::SUCCESS, "over temperature threshold");
    assert_eq!(set_feature(&mut a, 0x0f, 2000).0, Status::SUCCESS, "KATO");
    assert_eq!(set_feature(&mut a, 0x0b, 0x100).0, Status::SUCCESS, "AEC");
    assert_eq!(set_feature(&mut a, 0x07, 0).0, Status::SUCCESS, "one I/O queue");
    let current = [(0x01, 0x0302_0103), (0x04, 300), (0x0f, 2000), (0x0b, 0x100), (0x07, 0)];
    for (fid, value) in current {
        assert_eq!(get(&mut a, fid, 0, 0), (Status::SUCCESS, value), "current value of {fid:#04x}");
    }
    // The defaults: what the controller started with (KATO from Connect).
    let defaults = [(0x01, 0), (0x04, 0x0157), (0x0f, 5000), (0x0b, 0), (0x07, queues)];
    for sel in [1, 2] {
        for (fid, value) in defaults {
            assert_eq!(get(&mut a, fid, sel, 0), (Status::SUCCESS, value), "SEL {sel} of {fid:#04x}");
        }
    }
}

/// The controller answers every SEL value and refuses SV with Feature
/// Identifier Not Saveable, so Identify Controller ONCS says it supports
/// both (SSFS, bit 4; NVMe Base 2.0 5.15, Select: the controller indicates
/// in SSFS whether SEL is supported).
#[test]
fn get_features_capabilities_only_of_features_that_exist() {
    let t = target();
    let (mut a, _) = admin(&t);
    let get = |q: &mut Queue, fid: u8, sel: u32| {
        let mut s = sqe(0x0a, 8);
        s.cdw10 = (u32::from(fid) | (sel << 8)).into();
        let (cqe, _) = cqe_of(run(q, &s, None));
        (cqe.status(), cqe.dw0.get())
    };
    let oncs = u16::from_le_bytes(identify(&mut a, 1, 0).1[520..522].try_into().expect("2"));
    assert_ne!(oncs & (1 << 4), 0, "ONCS SSFS: Get Features SEL and Set Features SV are supported");
    assert_eq!(get(&mut a, 0x0b, 3), (Status::SUCCESS, 0b100), "AEC: changeable");
    assert_eq!(get(&mut a, 0x55, 3).0, Status::INVALID_FIELD.dnr(), "no such feature");
    assert_eq!(get(&mut a, 0x06, 3).0, Status::INVALID_FIELD.dnr(), "no volatile write cache");
    assert_eq!(get(&mut a, 0x0b, 4).0, Status::INVALID_FIELD.dnr(), "SEL 100b is reserved");
    let mut d = discovery_admin(&t, HOST);
    assert_eq!(get(&mut d, 0x07, 3).0, Status::INVALID_FIELD.dnr(), "no queues on a discovery controller");
    assert_eq!(get(&mut d, 0x0f, 3).0, Status::SUCCESS);
}

/// Host Identifier (81h) on a fabrics controller is the HOSTID of Connect:
/// Get Features returns it (128-bit, EXHID set; EXHID clear is Invalid
/// Field), Set Features is Command Sequence Error (NVMe Base 2.0 5.27.1,
/// Host Identifier), so its supported capabilities (SEL 011b) say it is not
/// changeable, nor saveable, nor namespace specific.
#[test]
fn host_identifier_is_connects_and_not_changeable() {
    let t = target();
    let (mut a, _) = admin(&t);
    let get = |q: &mut Queue, sel: u32, exhid: u32| {
        let mut s = sqe(0x0a, 8);
        s.cdw10 = (0x81 | (sel << 8)).into();
        s.cdw11 = exhid.into();
        s.dptr = Sgl::transport(16);
        cqe_of(run(q, &s, None))
    };
    let (cqe, data) = get(&mut a, 0, 1);
    assert_eq!((cqe.status(), data), (Status::SUCCESS, vec![1; 16]), "the HOSTID Connect gave");
    assert_eq!(get(&mut a, 0, 0).0.status(), Status::INVALID_FIELD.dnr(), "only the 128-bit form");
    assert_eq!(set_feature(&mut a, 0x81, 1).0, Status::COMMAND_SEQUENCE_ERROR.dnr());
    let (cqe, _) = get(&mut a, 3, 0);
    assert_eq!((cqe.status(), cqe.dw0.get()), (Status::SUCCESS, 0), "not saveable, per namespace or changeable");
}

/// A device with a volatile write cache, as file and block devices have.
fn cached(name: &str) -> Arc<Described> {
    Arc::new(Described { backend: "file", volatile_write_cache: true, ..Described::new(name, 512, 2048) })
}

/// The `fua` of the block request a one-block write becomes.
fn write_fua(io: &mut Queue, cid: u16, nsid: u32, fua: bool) -> bool {
    let mut w = read_sqe(cid, nsid, 0, 1, 512);
    w.opcode = 0x01;
    w.cdw12 = (u32::from(fua) << 30).into();
    match run(io, &w, Some(vec![1; 512])) {
        Outcome::Io(req) => match req.op {
            BlockOp::Write { fua, .. } => fua,
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

#[test]
fn volatile_write_cache_is_advertised_and_switchable_when_a_namespace_has_one() {
    let t = target();
    t.subsystem(SUB).expect("sub").add_namespace(Namespace::new(SUB, 2, cached("f2"))).expect("add");
    let (mut a, cntlid) = admin(&t);
    assert_eq!(identify(&mut a, 1, 0).1[525], 0x05, "VWC present");
    assert_eq!(get_feature(&mut a, 0x06), (Status::SUCCESS, 1), "and enabled");
    let mut io = io_queue(&t, cntlid, 1);
    assert!(!write_fua(&mut io, 10, 2, false), "a cached write stays cached");
    assert!(write_fua(&mut io, 11, 2, true), "FUA is kept");
    // The host turns the cache off: every write must be durable at once,
    // and what it wrote before too (it sends no Flush from now on), so
    // the cached namespace's device is flushed before the completion.
    let mut off = sqe(0x09, 8);
    off.cdw10 = 0x06.into();
    match run(&mut a, &off, None) {
        Outcome::FlushThenComplete { cqe, devices } => {
            assert!(cqe.status().is_success());
            assert_eq!(devices.len(), 1, "only the namespace with a volatile cache");
        }
        other => panic!("turning the cache off flushes nothing: {other:?}"),
    }
    assert_eq!(get_feature(&mut a, 0x06).1, 0);
    assert_eq!(set_feature(&mut a, 0x06, 0).0, Status::SUCCESS, "already off: nothing to flush");
    assert!(write_fua(&mut io, 12, 2, false), "written through with the cache disabled");
    assert_eq!(set_feature(&mut a, 0x06, 1).0, Status::SUCCESS);
    assert!(!write_fua(&mut io, 13, 2, false));
}

/// The `fua` of the block requests a one-block Write Zeroes (with or
/// without its FUA bit) and a one-range Deallocate of `nsid` become.
fn zeroing_fua(io: &mut Queue, cid: u16, nsid: u32, fua_bit: bool) -> (bool, bool) {
    let mut wz = sqe(0x08, cid);
    wz.nsid = nsid.into();
    wz.cdw12 = (u32::from(fua_bit) << 30).into();
    let zeroes = match ex(io, 0, &wz) {
        Outcome::Io(req) => match req.op {
            BlockOp::WriteZeroes { fua, .. } => fua,
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    let mut d = sqe(0x09, cid.wrapping_add(1));
    d.nsid = nsid.into();
    d.cdw11 = 4.into(); // AD
    d.dptr = Sgl::in_capsule(16);
    let mut range = Vec::new();
    range.extend_from_slice(&0u32.to_le_bytes());
    range.extend_from_slice(&8u32.to_le_bytes());
    range.extend_from_slice(&0u64.to_le_bytes());
    let deallocate = match run(io, &d, Some(range)) {
        Outcome::Io(req) => match req.op {
            BlockOp::Deallocate { fua, .. } => fua,
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    (zeroes, deallocate)
}

#[test]
fn write_zeroes_and_deallocate_are_durable_when_writes_would_be() {
    let t = target();
    t.subsystem(SUB).expect("sub").add_namespace(Namespace::new(SUB, 2, cached("f2"))).expect("add");
    let (mut a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    assert_eq!(zeroing_fua(&mut io, 10, 2, false), (false, false), "cached, as writes are");
    assert!(zeroing_fua(&mut io, 12, 2, true).0, "Write Zeroes keeps its FUA bit");
    assert_eq!(set_feature(&mut a, 0x06, 0).0, Status::SUCCESS);
    assert_eq!(zeroing_fua(&mut io, 14, 2, false), (true, true), "the host turned the cache off");
    // A controller told of no write cache, then given a cached namespace.
    let t = target();
    let (_a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    t.subsystem(SUB).expect("sub").add_namespace(Namespace::new(SUB, 2, cached("f2"))).expect("add");
    assert_eq!(zeroing_fua(&mut io, 10, 2, false), (true, true), "written through");
}

#[test]
fn a_controller_told_of_no_write_cache_writes_through_a_cached_namespace_added_later() {
    let t = target();
    let (mut a, cntlid) = admin(&t);
    assert_eq!(identify(&mut a, 1, 0).1[525] & 1, 0, "memory namespace only: no VWC");
    let mut io = io_queue(&t, cntlid, 1);
    assert!(!write_fua(&mut io, 10, 1, false), "a memory namespace needs no FUA");
    // The host never flushes a controller without a write cache, so writes
    // to a cached namespace that arrives later must be durable on their own.
    t.subsystem(SUB).expect("sub").add_namespace(Namespace::new(SUB, 2, cached("f2"))).expect("add");
    assert!(write_fua(&mut io, 11, 2, false), "written through");
    assert_eq!(identify(&mut a, 1, 0).1[525] & 1, 0, "what the controller said at Connect stays true");
}

#[test]
fn namespace_added_at_runtime_raises_an_async_event() {
    let t = target();
    let (mut a, _) = admin(&t);
    set_feature(&mut a, 0x0b, 1 << 8);
    assert!(matches!(ex(&mut a, 0, &sqe(0x0c, 40)), Outcome::Deferred));
    assert!(a.poll_event().is_none());
    let sub = t.subsystem(SUB).expect("sub");
    sub.add_namespace(Namespace::new(SUB, 5, Arc::new(Described::new("n5", 512, 2048)))).expect("add");
    let ev = a.poll_event().expect("event");
    assert_eq!(ev.cid.get(), 40);
    assert_eq!(ev.dw0.get(), nvme_spec::log::AEN_NS_CHANGED);
    let (_, changed) = get_log(&mut a, 0x04, 4096, 0);
    assert_eq!(&changed[0..8], &[5, 0, 0, 0, 0, 0, 0, 0]);
    let (_, again) = get_log(&mut a, 0x04, 4096, 0);
    assert!(again.iter().all(|&b| b == 0), "reading the log cleared it");
    assert_eq!(identify(&mut a, 2, 0).1[4], 5, "active list shows nsid 5");
    for cid in 41..45 {
        assert!(matches!(ex(&mut a, 0, &sqe(0x0c, cid)), Outcome::Deferred));
    }
    assert_eq!(status(&ex(&mut a, 0, &sqe(0x0c, 45))), Status::ASYNC_EVENT_LIMIT.dnr());
}

/// NVMe base 2.0 5.16.1.5: the Changed Namespace List holds the NSIDs in
/// increasing order, and more than 1,024 of them read as FFFFFFFFh alone;
/// what the controller remembers for it stays that small however many
/// namespaces change before the host reads it.
#[test]
fn changed_namespace_list_is_ascending_and_overflows_past_1024() {
    let t = target();
    let (mut a, _) = admin(&t);
    let sub = t.subsystem(SUB).expect("sub");
    for nsid in [9, 3, 7] {
        sub.add_namespace(Namespace::new(SUB, nsid, Arc::new(Described::new(&format!("n{nsid}"), 512, 64))))
            .expect("add");
    }
    sub.remove_namespace(3);
    let (_, changed) = get_log(&mut a, 0x04, 4096, 0);
    let listed: Vec<u32> = (0..5).map(|i| u32_at(&changed, i * 4)).collect();
    assert_eq!(listed, [3, 7, 9, 0, 0], "ascending, each once");
    for nsid in 100..1200 {
        sub.add_namespace(Namespace::new(SUB, nsid, Arc::new(Described::new(&format!("n{nsid}"), 512, 8))))
            .expect("add");
        sub.remove_namespace(nsid);
    }
    let (_, changed) = get_log(&mut a, 0x04, 4096, 0);
    assert_eq!(u32_at(&changed, 0), 0xffff_ffff, "more than 1,024 changed");
    assert!(changed[4..].iter().all(|&b| b == 0), "and nothing else");
    sub.add_namespace(Namespace::new(SUB, 2, Arc::new(Described::new("n2", 512, 64)))).expect("add");
    let (_, changed) = get_log(&mut a, 0x04, 4096, 0);
    assert_eq!((u32_at(&changed, 0), u32_at(&changed, 4)), (2, 0), "reading it began a new list");
}

/// A Get Log Page that fails (an offset past the page) has no effect: the
/// Changed Namespace List and its event are cleared only by a read that
/// returns them (NVMe base 2.0 5.16: a failed command changes nothing).
#[test]
fn a_failed_get_log_page_clears_neither_the_log_nor_its_event() {
    let t = target();
    let (mut a, _) = admin(&t);
    set_feature(&mut a, 0x0b, (1 << 8) | (1 << 11));
    let sub = t.subsystem(SUB).expect("sub");
    sub.add_namespace(Namespace::new(SUB, 5, Arc::new(Described::new("n5", 512, 2048)))).expect("add");
    assert!(sub.set_ana_state(1, AnaState::INACCESSIBLE));
    assert_eq!(get_log(&mut a, 0x04, 4096, 8192).0, Status::INVALID_FIELD.dnr(), "offset past the page");
    assert_eq!(get_log(&mut a, 0x0c, 4096, 1 << 20).0, Status::INVALID_FIELD.dnr(), "offset past the page");
    assert!(matches!(ex(&mut a, 0, &sqe(0x0c, 40)), Outcome::Deferred));
    assert!(matches!(ex(&mut a, 0, &sqe(0x0c, 41)), Outcome::Deferred));
    let events: Vec<u32> = std::iter::from_fn(|| a.poll_event()).map(|c| c.dw0.get()).collect();
    assert_eq!(events, [nvme_spec::log::AEN_NS_CHANGED, nvme_spec::log::AEN_ANA_CHANGE], "both still to tell");
    let (st, changed) = get_log(&mut a, 0x04, 4096, 0);
    assert_eq!((st, u32_at(&changed, 0)), (Status::SUCCESS, 5), "the list is still there");
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4"))
}

#[test]
fn identify_reports_a_shared_namespace_with_ana_reporting() {
    let t = target();
    let (mut a, _) = admin(&t);
    let (_, ctrl) = identify(&mut a, 1, 0);
    assert_eq!(ctrl[76], 0x0b, "CMIC: multi-port, multi-controller, ANA reporting");
    assert_ne!(u32_at(&ctrl, 92) & (1 << 11), 0, "OAES: ANA change notices");
    assert_eq!(u32_at(&ctrl, 88), 30_000_000, "RTD3E: a shutdown, which flushes the devices, may take 30 s");
    assert_ne!(ctrl[342], 0, "ANATT");
    assert_eq!(ctrl[343], 0x5f, "ANACAP: all five states, group ID fixed while attached");
    assert_eq!((u32_at(&ctrl, 344), u32_at(&ctrl, 348)), (1024, 1024), "ANAGRPMAX, NANAGRPID");
    let (_, ns) = identify(&mut a, 0, 1);
    assert_eq!(ns[30], 1, "NMIC: shared");
    assert_eq!(u32_at(&ns, 92), 1, "ANAGRPID is the NSID");
}

/// The I/O Command Set Independent Identify Namespace data structure (CNS
/// 08h, NVMe Base 2.0 section 5.17.2; nvmet's `nvmet_execute_id_cs_indep`):
/// NMIC at byte 1, ANAGRPID at 7:4, NSATTR at 8, NSTAT at 14 (its bit 0,
/// NRDY, says the namespace is ready: a host that reads this page ignores a
/// namespace without it); an inactive NSID reads as zeroes.
#[test]
fn identify_command_set_independent_namespace_puts_each_field_at_its_offset() {
    let t = target();
    let ro = Arc::new(Described { read_only: true, ..Described::new("ro", 512, 2048) });
    t.subsystem(SUB).expect("sub").add_namespace(Namespace::new(SUB, 3, ro)).expect("add");
    let (mut a, _) = admin(&t);
    let (st, page) = identify(&mut a, 0x08, 1);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(page[1], 0x01, "NMIC: shared");
    assert_eq!(u32_at(&page, 4), 1, "ANAGRPID is the NSID, as in Identify Namespace");
    assert_eq!(page[8], 0x00, "NSATTR: a writable namespace");
    assert_eq!(page[14], 0x01, "NSTAT: namespace ready");
    assert!(page[9..14].iter().chain(&page[15..]).all(|&b| b == 0), "NVMSETID, ENDGID and the rest zero");
    let (_, ro) = identify(&mut a, 0x08, 3);
    assert_eq!((u32_at(&ro, 4), ro[8], ro[14]), (3, 0x01, 0x01), "NSATTR: write protected");
    let (st, zeros) = identify(&mut a, 0x08, 9);
    assert_eq!(st, Status::SUCCESS);
    assert!(zeros.iter().all(|&b| b == 0), "inactive NSID reads as zeroes");
    assert_eq!(identify(&mut a, 0x08, 0).0, Status::INVALID_NAMESPACE.dnr());
}

#[test]
fn one_shared_storage_identity_gives_the_same_identifiers_on_every_gateway() {
    let shared = |name: &str, id: Option<&str>| {
        Arc::new(Described { shared_identity: id.map(str::to_string), ..Described::new(name, 512, 2048) })
    };
    let img = Some("ceph:0b1d2c3e-0000-4000-8000-00000000abcd:10a2b3c4d5e6");
    // Another gateway may name the device and even the subsystem otherwise.
    let a = Namespace::new(SUB, 1, shared("ceph", img));
    let b = Namespace::new(SECRET, 1, shared("rbd0", img));
    assert_eq!((a.nguid, a.eui64, a.uuid), (b.nguid, b.eui64, b.uuid));
    assert_eq!((a.uuid[6] >> 4, a.uuid[8] >> 6), (4, 2), "a version 4, variant 1 UUID");
    let other = Namespace::new(SUB, 1, shared("ceph", Some("ceph:0b1d2c3e-0000-4000-8000-00000000abcd:99")));
    assert_ne!(a.nguid, other.nguid, "another image");
    let local = Namespace::new(SUB, 1, shared("ceph", None));
    assert_eq!(local.nguid, Namespace::new(SUB, 1, shared("ceph", None)).nguid, "stable across restarts");
    assert_ne!(local.nguid, Namespace::new(SECRET, 1, shared("ceph", None)).nguid, "local storage: per subsystem");
    let set = Namespace::new(SUB, 1, shared("ceph", img)).with_nguid([7; 16]).with_uuid([8; 16]);
    assert_eq!((set.nguid, set.uuid, set.eui64), ([7; 16], [8; 16], a.eui64), "configured values win");
}

#[test]
fn ana_state_change_raises_an_event_and_shows_in_the_ana_log() {
    let t = target();
    let (mut a, cntlid) = admin(&t);
    set_feature(&mut a, 0x0b, 1 << 11);
    assert!(matches!(ex(&mut a, 0, &sqe(0x0c, 40)), Outcome::Deferred));
    let sub = t.subsystem(SUB).expect("sub");
    let (_, log) = get_log(&mut a, 0x0c, 4096, 0);
    assert_eq!(u64::from_le_bytes(log[0..8].try_into().expect("8")), 0, "no change yet");
    assert_eq!(u16::from_le_bytes([log[8], log[9]]), 1, "one group");
    assert_eq!((u32_at(&log, 16), u32_at(&log, 20), log[32], u32_at(&log, 48)), (1, 1, 1, 1), "group 1 optimized");
    assert!(sub.set_ana_state(1, AnaState::OPTIMIZED), "no change");
    assert!(a.poll_event().is_none(), "the same state is no event");

    assert!(sub.set_ana_state(1, AnaState::INACCESSIBLE));
    let ev = a.poll_event().expect("event");
    assert_eq!((ev.cid.get(), ev.dw0.get()), (40, nvme_spec::log::AEN_ANA_CHANGE));
    let (_, log) = get_log(&mut a, 0x0c, 4096, 0);
    assert_eq!(u64::from_le_bytes(log[0..8].try_into().expect("8")), 1, "CHGCNT");
    assert_eq!(u64::from_le_bytes(log[24..32].try_into().expect("8")), 1, "group CHGCNT");
    assert_eq!(log[32], 3, "inaccessible");
    let mut rgo = sqe(0x02, 8);
    rgo.cdw10 = (0x0c | (1 << 8) | ((64 / 4 - 1) << 16)).into();
    rgo.dptr = Sgl::transport(64);
    let (_, groups) = cqe_of(run(&mut a, &rgo, None));
    assert_eq!((u32_at(&groups, 16), u32_at(&groups, 20), groups[32]), (1, 0, 3), "RGO: no NSID list");
    assert!(!sub.set_ana_state(9, AnaState::OPTIMIZED), "no namespace 9");

    let mut io = io_queue(&t, cntlid, 1);
    let st = status(&ex(&mut io, 0, &read_sqe(1, 1, 0, 1, 512)));
    assert_eq!(st, Status::ANA_INACCESSIBLE, "path-related, no DNR: the host retries on another path");
    assert_eq!((st.sct(), st.sc()), (3, 2));
    assert!(sub.set_ana_state(1, AnaState::CHANGE));
    assert_eq!(status(&ex(&mut io, 0, &read_sqe(2, 1, 0, 1, 512))), Status::ANA_TRANSITION);
    assert!(sub.set_ana_state(1, AnaState::PERSISTENT_LOSS));
    assert_eq!(status(&ex(&mut io, 0, &read_sqe(3, 1, 0, 1, 512))), Status::ANA_PERSISTENT_LOSS);
    assert!(sub.set_ana_state(1, AnaState::NON_OPTIMIZED));
    assert!(matches!(ex(&mut io, 0, &read_sqe(4, 1, 0, 1, 512)), Outcome::Io(_)), "non-optimized still serves I/O");

    // One event until the log is read; the reads above re-armed it, but no
    // AER was outstanding: the later changes wait for the next one.
    assert!(matches!(ex(&mut a, 0, &sqe(0x0c, 41)), Outcome::Deferred));
    assert_eq!(a.poll_event().expect("queued event").dw0.get(), nvme_spec::log::AEN_ANA_CHANGE);
    assert!(a.poll_event().is_none(), "one event for several changes before the log was read");
}

/// NVMe Base 2.0, Identify Namespace NUSE: while the namespace is in the
/// ANA Inaccessible or Persistent Loss state on this controller, NUSE is
/// cleared to 0h (as nvmet reports it); NSZE and NCAP still give its size.
/// In the other states it is the size, as before.
#[test]
fn identify_namespace_reports_no_utilization_while_the_namespace_is_inaccessible() {
    let t = target();
    let (mut a, _) = admin(&t);
    let sub = t.subsystem(SUB).expect("sub");
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
    for (state, nuse) in [
        (AnaState::INACCESSIBLE, 0),
        (AnaState::PERSISTENT_LOSS, 0),
        (AnaState::CHANGE, 2048),
        (AnaState::NON_OPTIMIZED, 2048),
        (AnaState::OPTIMIZED, 2048),
    ] {
        sub.set_ana_state(1, state);
        let (st, page) = identify(&mut a, 0x00, 1);
        assert_eq!(st, Status::SUCCESS);
        assert_eq!((u64_at(&page, 0), u64_at(&page, 8)), (2048, 2048), "{state:?}: NSZE and NCAP");
        assert_eq!(u64_at(&page, 16), nuse, "{state:?}: NUSE");
    }
}

/// A namespace replaced under its NSID (another device or identifiers:
/// removed and added again) may come back in another ANA state. Its group
/// ID is its NSID, the group a host already holds in its copy of the ANA
/// log (Linux looks a namespace's group up there when it appears and reads
/// the log again only for a group it does not know): the host must be
/// told the log changed, or it keeps the state the old namespace had.
#[test]
fn a_namespace_added_again_in_another_ana_state_raises_an_ana_change() {
    let t = target();
    let (mut a, _) = admin(&t);
    set_feature(&mut a, 0x0b, (1 << 8) | (1 << 11));
    let sub = t.subsystem(SUB).expect("sub");
    let (_, log) = get_log(&mut a, 0x0c, 4096, 0);
    let before = u64::from_le_bytes(log[0..8].try_into().expect("8"));
    assert_eq!((u32_at(&log, 16), log[32]), (1, 1), "group 1 optimized, as the host now knows");
    sub.remove_namespace(1);
    let again = Namespace::new(SUB, 1, Arc::new(Described::new("r1", 512, 2048)));
    sub.add_namespace(again.with_ana_state(AnaState::INACCESSIBLE)).expect("add");
    assert!(matches!(ex(&mut a, 0, &sqe(0x0c, 40)), Outcome::Deferred));
    assert!(matches!(ex(&mut a, 0, &sqe(0x0c, 41)), Outcome::Deferred));
    let events: Vec<u32> = std::iter::from_fn(|| a.poll_event()).map(|c| c.dw0.get()).collect();
    assert!(events.contains(&nvme_spec::log::AEN_ANA_CHANGE), "no ANA change notice: {events:x?}");
    let (_, log) = get_log(&mut a, 0x0c, 4096, 0);
    assert!(u64::from_le_bytes(log[0..8].try_into().expect("8")) > before, "CHGCNT did not move");
    assert_eq!((u32_at(&log, 16), log[32]), (1, 3), "group 1 inaccessible");
}

#[test]
fn reading_the_log_clears_an_event_not_yet_reported() {
    // NVMe Base 2.0 5.2: an event is cleared by reading its log page
    // without RAE, reported or not: a notice still waiting for an AER
    // after that read names a change the host has already seen.
    let t = target();
    let (mut a, _) = admin(&t);
    set_feature(&mut a, 0x0b, (1 << 8) | (1 << 11));
    let sub = t.subsystem(SUB).expect("sub");
    assert!(sub.set_ana_state(1, AnaState::INACCESSIBLE));
    sub.add_namespace(Namespace::new(SUB, 5, Arc::new(Described::new("n5", 512, 2048)))).expect("add");
    assert_eq!(get_log(&mut a, 0x0c, 4096, 0).0, Status::SUCCESS);
    assert_eq!(get_log(&mut a, 0x04, 4096, 0).0, Status::SUCCESS);
    assert!(matches!(ex(&mut a, 0, &sqe(0x0c, 40)), Outcome::Deferred));
    assert!(a.poll_event().is_none(), "both events were cleared by reading their logs");
    // A change after the read is a new event.
    assert!(sub.set_ana_state(1, AnaState::OPTIMIZED));
    assert_eq!(a.poll_event().expect("new event").dw0.get(), nvme_spec::log::AEN_ANA_CHANGE);
}

#[test]
fn keep_alive_expiry_tears_the_controller_down() {
    let t = target();
    let mut a = Queue::new(t.clone(), TCP, addr(), addr());
    let data = ConnectData::new([1; 16], 0xffff, SUB, HOST).as_bytes().to_vec();
    let mut s = connect_sqe(0, 31, 1000);
    s.dptr = Sgl::in_capsule(1024);
    let (cqe, _) = cqe_of(run(&mut a, &s, Some(data)));
    let cntlid = cqe.dw0.get() as u16;
    prop_set_cc(&mut a, 0x0046_0001);
    let io = io_queue(&t, cntlid, 1);
    assert!(!a.expired(900));
    assert_eq!(status(&ex(&mut a, 900, &sqe(0x18, 9))), Status::SUCCESS);
    assert!(!a.expired(1800), "keep alive at 900 restarted the timer");
    assert!(a.expired(2000));
    assert!(io.expired(2000), "I/O queues follow their controller");
    assert_eq!(t.subsystem(SUB).expect("sub").controller_count(), 0);
}

/// The controller rounds a Keep Alive Timeout up to the granularity
/// Identify Controller KAS reports, 100 ms, whether Connect or Set Features
/// gives it, and Get Features reports the value in use (NVMe Base 2.0
/// 3.9.1 and 5.27.1.12): a host that asked for 1050 ms is not cut off
/// after 1051.
#[test]
fn a_keep_alive_timeout_is_rounded_up_to_the_kas_granularity() {
    let t = target();
    let mut a = Queue::new(t.clone(), TCP, addr(), addr());
    let data = ConnectData::new([1; 16], 0xffff, SUB, HOST).as_bytes().to_vec();
    assert!(status(&run(&mut a, &connect_sqe(0, 31, 1050), Some(data))).is_success());
    prop_set_cc(&mut a, 0x0046_0001);
    assert_eq!(identify(&mut a, 1, 0).1[320], 1, "KAS: 100 ms");
    assert_eq!(get_feature(&mut a, 0x0f), (Status::SUCCESS, 1100), "Connect's KATO, rounded up");
    assert!(!a.expired(1100), "1100 ms without a command is within the timeout");
    assert!(a.expired(1101));
    let (mut a, _) = admin(&t);
    assert_eq!(set_feature(&mut a, 0x0f, 2001).0, Status::SUCCESS);
    assert_eq!(get_feature(&mut a, 0x0f).1, 2100, "Set Features' KATO, rounded up");
    assert_eq!(set_feature(&mut a, 0x0f, 3000).0, Status::SUCCESS);
    assert_eq!(get_feature(&mut a, 0x0f).1, 3000, "a multiple of 100 ms is kept");
}

#[test]
fn disconnect_completes_then_closes_and_frees_the_queue_id() {
    let t = target();
    let (_a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    assert!(matches!(run(&mut io, &fabrics(0x08, 3), None), Outcome::CompleteAndClose { .. }));
    io.close();
    let _again = io_queue(&t, cntlid, 1);
}

#[test]
fn abort_is_answered_as_not_aborted() {
    let t = target();
    let (mut a, _) = admin(&t);
    let (cqe, _) = cqe_of(run(&mut a, &sqe(0x08, 3), None));
    assert_eq!((cqe.status(), cqe.dw0.get() & 1), (Status::SUCCESS, 1));
}

#[test]
fn dedicated_discovery_port_serves_only_discovery() {
    let t = target();
    let disc: SocketAddr = "127.0.0.1:8009".parse().expect("addr");
    let mut q = Queue::new(t.clone(), TCP, disc, disc);
    let (cqe, _) = cqe_of(connect(&mut q, 0, 0xffff, SUB, HOST));
    assert_eq!(cqe.status(), Status::CONNECT_INVALID_PARAMETERS.dnr());
    let mut d = Queue::new(t.clone(), TCP, disc, disc);
    assert!(status(&connect(&mut d, 0, 0xffff, nvme_spec::DISCOVERY_NQN, HOST)).is_success());
    prop_set_cc(&mut d, 1);
    let (_, page) = get_log(&mut d, 0x70, 4096, 0);
    let n = u64::from_le_bytes(page[8..16].try_into().expect("8")) as usize;
    let entries: Vec<(u8, String)> = (0..n)
        .map(|i| {
            let e = &page[1024 + i * 1024..2048 + i * 1024];
            (e[2], String::from_utf8_lossy(&e[32..64]).trim_end_matches('\0').to_string())
        })
        .collect();
    // The subsystem is advertised on 4420 only; discovery on both ports.
    assert_eq!(entries, vec![(2, "4420".to_string()), (3, "4420".to_string()), (3, "8009".to_string())]);
}

/// An RDMA-like binding: every transport-dependent field differs from TCP's.
const RDMA: Transport = Transport {
    name: "rdma",
    trtype: 1,
    treq: 0,
    tsas: [1, 5, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    sgls: 1 | (1 << 2) | (1 << 20),
    in_capsule: 4096,
    icdoff: 0,
};

#[test]
fn identify_describes_the_transport_the_queue_runs_on() {
    let t = target();
    let rdma_addr: SocketAddr = "127.0.0.1:4421".parse().expect("addr");
    t.add_port(rdma_addr, RDMA, false);
    for (transport, local) in [(TCP, addr()), (RDMA, rdma_addr)] {
        let mut q = Queue::new(t.clone(), transport, local, local);
        assert!(status(&connect(&mut q, 0, 0xffff, SUB, HOST)).is_success());
        assert_eq!(prop_set_cc(&mut q, 0x0046_0001), Status::SUCCESS);
        let (st, id) = identify(&mut q, 1, 0);
        assert_eq!(st, Status::SUCCESS);
        let u32_at = |off: usize| u32::from_le_bytes(id[off..off + 4].try_into().expect("4"));
        assert_eq!(u32_at(536), transport.sgls, "SGLS of {}", transport.name);
        assert_eq!(u32_at(1792), (64 + transport.in_capsule) / 16, "IOCCSZ of {}", transport.name);
        assert_eq!(u16::from_le_bytes([id[1800], id[1801]]), transport.icdoff);
    }
}

#[test]
fn discovery_log_entries_carry_each_ports_transport() {
    let t = target();
    t.add_port("127.0.0.1:4421".parse().expect("addr"), RDMA, false);
    let mut d = discovery_admin(&t, HOST);
    let (st, page) = get_log(&mut d, 0x70, 8192, 0);
    assert_eq!(st, Status::SUCCESS);
    let n = u64::from_le_bytes(page[8..16].try_into().expect("8")) as usize;
    let mut seen = Vec::new();
    for i in 0..n {
        let e = &page[1024 + i * 1024..2048 + i * 1024];
        let svc = String::from_utf8_lossy(&e[32..64]).trim_end_matches('\0').to_string();
        // TRTYPE, TREQ and the leading TSAS bytes per port.
        seen.push((svc, e[0], e[3], e[768..771].to_vec()));
    }
    assert!(seen.contains(&("4420".into(), 3, 2, vec![0, 0, 0])), "{seen:?}");
    assert!(seen.contains(&("4421".into(), 1, 0, vec![1, 5, 1])), "{seen:?}");
    assert!(!seen.iter().any(|(svc, trtype, ..)| svc == "4421" && *trtype == 3), "{seen:?}");
}

#[test]
fn a_dual_stack_wildcard_port_is_advertised_to_an_ipv4_host_as_ipv4() {
    // A host that reached a `[::]` listener over IPv4 is seen at an
    // IPv4-mapped local address; the log must give it IPv4 and the dotted
    // address, not ADRFAM IPv6 and "::ffff:a.b.c.d" (which a host without
    // IPv6, or an RDMA CM that does not map, cannot connect to).
    let t = Arc::new(Target::new(Settings::default()));
    t.add_subsystem(Subsystem::new(SUB, "SN1", true, Vec::new())).expect("sub");
    t.add_port("[::]:4420".parse().expect("addr"), TCP, false);
    let local: SocketAddr = "[::ffff:192.0.2.10]:4420".parse().expect("addr");
    let peer: SocketAddr = "[::ffff:192.0.2.99]:50000".parse().expect("addr");
    let mut d = Queue::new(t.clone(), TCP, local, peer);
    assert!(status(&connect(&mut d, 0, 0xffff, nvme_spec::DISCOVERY_NQN, HOST)).is_success());
    prop_set_cc(&mut d, 1);
    let (_, page) = get_log(&mut d, 0x70, 3072, 0);
    let e = &page[1024..2048];
    assert_eq!(&page[2048 + 256..2048 + 256 + 9], b"nqn.2014-", "then the discovery entry");
    assert_eq!((e[1], &e[512..524], e[524]), (1, &b"192.0.2.10\0\0"[..], 0), "ADRFAM IPv4, dotted TRADDR");
}

#[test]
fn a_command_waiting_for_data_keeps_its_cid_and_unknown_data_is_refused() {
    let t = target();
    let (_a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    let mut w = read_sqe(9, 1, 4, 2, 512);
    w.opcode = 0x01;
    assert!(matches!(ex(&mut io, 0, &w), Outcome::NeedData { len: 1024, .. }));
    // The same CID again before the data: a conflict, the first one stays.
    assert_eq!(status(&ex(&mut io, 0, &read_sqe(9, 1, 0, 1, 512))), Status::CID_CONFLICT.dnr());
    assert_eq!(io.awaiting_data(), 1);
    // Data nobody asked for.
    assert_eq!(status(&io.data_arrived(0, 10, vec![0u8; 512])), Status::COMMAND_SEQUENCE_ERROR.dnr());
    // A failed transfer forgets the command; its CID is free again.
    io.data_failed(9);
    assert_eq!(io.awaiting_data(), 0);
    assert!(matches!(ex(&mut io, 0, &read_sqe(9, 1, 0, 1, 512)), Outcome::Io(_)));
}

#[test]
fn controllers_per_subsystem_are_limited_and_busy_is_not_final() {
    let t = Target::new(Settings { max_controllers: 2, ..Default::default() });
    t.add_subsystem(Subsystem::new(SUB, "SN1", true, Vec::new())).expect("sub");
    let t = Arc::new(t);
    let mut a = Queue::new(t.clone(), TCP, addr(), addr());
    let mut b = Queue::new(t.clone(), TCP, addr(), addr());
    let mut c = Queue::new(t.clone(), TCP, addr(), addr());
    assert!(status(&connect(&mut a, 0, 0xffff, SUB, HOST)).is_success());
    assert!(status(&connect(&mut b, 0, 0xffff, SUB, OTHER)).is_success());
    let refused = status(&connect(&mut c, 0, 0xffff, SUB, HOST));
    assert_eq!(
        refused,
        Status::CONNECT_CONTROLLER_BUSY,
        "a third controller past the limit of 2, without DNR: the host may retry"
    );
    a.close();
    let mut d = Queue::new(t.clone(), TCP, addr(), addr());
    assert!(status(&connect(&mut d, 0, 0xffff, SUB, HOST)).is_success(), "room again after a controller closed");
}

/// `max_controllers_per_host`: one peer address holds at most that many
/// controllers of a subsystem, so it cannot take all of `max_controllers`;
/// another address still gets one.
#[test]
fn controllers_per_host_are_limited_and_other_hosts_get_in() {
    let t = Target::new(Settings { max_controllers: 10, max_controllers_per_host: 2, ..Default::default() });
    t.add_subsystem(Subsystem::new(SUB, "SN1", true, Vec::new())).expect("sub");
    let t = Arc::new(t);
    let from = |ip: [u8; 4]| SocketAddr::from((ip, 40000));
    let mut a = Queue::new(t.clone(), TCP, addr(), from([10, 0, 0, 1]));
    let mut b = Queue::new(t.clone(), TCP, addr(), from([10, 0, 0, 1]));
    let mut c = Queue::new(t.clone(), TCP, addr(), from([10, 0, 0, 1]));
    let mut d = Queue::new(t.clone(), TCP, addr(), from([10, 0, 0, 2]));
    assert!(status(&connect(&mut a, 0, 0xffff, SUB, HOST)).is_success());
    assert!(status(&connect(&mut b, 0, 0xffff, SUB, OTHER)).is_success());
    assert_eq!(
        status(&connect(&mut c, 0, 0xffff, SUB, HOST)),
        Status::CONNECT_CONTROLLER_BUSY,
        "a third from one host"
    );
    assert!(status(&connect(&mut d, 0, 0xffff, SUB, HOST)).is_success(), "another host gets in");
    a.close();
    let mut e = Queue::new(t.clone(), TCP, addr(), from([10, 0, 0, 1]));
    assert!(status(&connect(&mut e, 0, 0xffff, SUB, HOST)).is_success(), "room again after one closed");
}

#[test]
fn cntlid_never_wraps_onto_a_live_controller() {
    let t = Target::new(Settings { max_controllers: u32::MAX, ..Default::default() });
    t.add_subsystem(Subsystem::new(SUB, "SN1", true, Vec::new())).expect("sub");
    let t = Arc::new(t);
    let cntlid = |o: Outcome<Vec<u8>>| cqe_of(o).0.dw0.get() as u16;
    let mut first = Queue::new(t.clone(), TCP, addr(), addr());
    let held = cntlid(connect(&mut first, 0, 0xffff, SUB, HOST));
    // Go round the whole ID space (0xffef IDs) with short-lived controllers.
    let mut seen_wrap = false;
    for _ in 0..0xfff0u32 {
        let mut q = Queue::new(t.clone(), TCP, addr(), addr());
        let id = cntlid(connect(&mut q, 0, 0xffff, SUB, HOST));
        assert!((1..0xfff0).contains(&id), "reserved or zero CNTLID {id:#x}");
        assert_ne!(id, held, "a new controller took the live controller's ID");
        seen_wrap |= id < held.saturating_add(2);
        q.close();
    }
    assert!(seen_wrap, "the counter went round");
}

#[test]
fn controller_ids_stay_within_the_subsystem_range_and_skip_live_ones() {
    let t = Target::new(Settings::default());
    t.add_subsystem(Subsystem::new(SUB, "SN1", true, Vec::new()).with_cntlid_range(10..=12)).expect("sub");
    let t = Arc::new(t);
    let cntlid = |o: Outcome<Vec<u8>>| cqe_of(o).0.dw0.get() as u16;
    let mut qs: Vec<Queue> = (0..3).map(|_| Queue::new(t.clone(), TCP, addr(), addr())).collect();
    let ids: Vec<u16> = qs.iter_mut().map(|q| cntlid(connect(q, 0, 0xffff, SUB, HOST))).collect();
    assert_eq!(ids, [10, 11, 12]);
    let mut full = Queue::new(t.clone(), TCP, addr(), addr());
    assert_eq!(status(&connect(&mut full, 0, 0xffff, SUB, HOST)), Status::CONNECT_CONTROLLER_BUSY, "range used up");
    qs[1].close();
    let mut again = Queue::new(t.clone(), TCP, addr(), addr());
    assert_eq!(cntlid(connect(&mut again, 0, 0xffff, SUB, HOST)), 11, "the freed ID, not a live one");
    let clamped = Subsystem::new(SECRET, "SN2", true, Vec::new()).with_cntlid_range(0..=0xffff);
    assert_eq!(clamped.cntlid_range(), nvmf::CNTLID_MIN..=nvmf::CNTLID_MAX);
}

#[test]
fn a_subsystem_with_a_controller_is_not_removed_and_an_idle_one_is() {
    let t = target();
    let gen = t.genctr();
    let (q, _) = admin(&t);
    // All or nothing: the idle one stays too when the other has a
    // controller (a change that removes both changes nothing).
    let e = t.remove_subsystems(&[SECRET, SUB]).expect_err("a controller is connected");
    assert!(e.contains(&format!("subsystem {SUB} has 1 connected controller")), "{e}");
    assert!(t.subsystem(SUB).is_some() && t.subsystem(SECRET).is_some(), "removed in part");
    assert_eq!(t.genctr(), gen, "the discovery log changed for nothing");
    let gone = t.remove_subsystems(&[SECRET]).expect("no controller on it");
    assert_eq!(gone.iter().map(|s| s.nqn.as_str()).collect::<Vec<_>>(), [SECRET]);
    assert!(t.subsystem(SECRET).is_none());
    assert!(t.genctr() > gen, "the discovery log changed");
    assert!(t.remove_subsystems(&[SECRET]).is_err(), "already gone");
    drop(q);
}

/// Discovery Log Page Change notice (NVMe-oF 1.1 5.3): type notice,
/// information F0h, log page 70h, what Linux's udev rule matches
/// (`NVME_AEN=0x70f002`) to connect to what a persistent discovery
/// controller now lists.
const AEN_DISCOVERY_CHANGE: u32 = 0x70_f0_02;

#[test]
fn a_persistent_discovery_controller_is_told_of_log_changes_once_until_it_reads_the_log() {
    let t = target();
    let mut d = discovery_admin(&t, HOST);
    let (_, id) = identify(&mut d, 1, 0);
    assert_ne!(u32_at(&id, 92) & (1 << 31), 0, "OAES: discovery log page change notices");
    // A discovery controller whose host did not enable the notice gets none.
    let mut quiet = discovery_admin(&t, OTHER);
    assert!(matches!(ex(&mut quiet, 0, &sqe(0x0c, 50)), Outcome::Deferred));

    assert_eq!(set_feature(&mut d, 0x0b, 1 << 31).0, Status::SUCCESS);
    assert!(matches!(ex(&mut d, 0, &sqe(0x0c, 40)), Outcome::Deferred));
    assert!(d.poll_event().is_none());
    t.add_subsystem(Subsystem::new("nqn.2026-11.io.ironwire:new", "SN3", true, Vec::new())).expect("sub");
    let ev = d.poll_event().expect("discovery log change event");
    assert_eq!((ev.cid.get(), ev.dw0.get()), (40, AEN_DISCOVERY_CHANGE));
    assert!(quiet.poll_event().is_none(), "masked");

    // No second notice until the host reads the log (without RAE).
    assert!(matches!(ex(&mut d, 0, &sqe(0x0c, 41)), Outcome::Deferred));
    t.add_port("127.0.0.1:4430".parse().expect("addr"), TCP, false);
    assert!(d.poll_event().is_none(), "one notice until the log is read");
    let (st, _) = get_log(&mut d, 0x70, 4096, 0);
    assert_eq!(st, Status::SUCCESS);
    assert!(d.poll_event().is_none(), "reading the log is no change");
    let sub = t.subsystem(SUB).expect("sub");
    t.set_access(&sub, false, vec![OTHER.to_string()]);
    assert_eq!(d.poll_event().expect("re-armed").dw0.get(), AEN_DISCOVERY_CHANGE);
}

/// The notice goes only to the discovery controllers whose host's log
/// changed (as Linux's nvmet does): a subsystem added, removed or opened
/// for another host is no change to this host's log; a port is a change
/// to every host's (its discovery entry).
#[test]
fn a_discovery_log_change_is_told_only_to_the_hosts_whose_log_changed() {
    let t = target();
    let armed = |host: &str, cid: u16| {
        let mut d = discovery_admin(&t, host);
        assert_eq!(set_feature(&mut d, 0x0b, 1 << 31).0, Status::SUCCESS);
        assert!(matches!(ex(&mut d, 0, &sqe(0x0c, cid)), Outcome::Deferred));
        d
    };
    let (mut a, mut b) = (armed(HOST, 40), armed(OTHER, 50));
    let told = |q: &mut Queue| q.poll_event().map(|e| e.dw0.get());
    let reread = |q: &mut Queue, cid: u16| {
        assert_eq!(get_log(q, 0x70, 4096, 0).0, Status::SUCCESS);
        assert!(matches!(ex(q, 0, &sqe(0x0c, cid)), Outcome::Deferred));
    };
    // A subsystem only OTHER may reach.
    let only_b = t
        .add_subsystem(Subsystem::new("nqn.2026-11.io.ironwire:b-only", "SN4", false, vec![OTHER.to_string()]))
        .expect("sub");
    assert_eq!(told(&mut b), Some(AEN_DISCOVERY_CHANGE), "OTHER's log lists it");
    assert_eq!(told(&mut a), None, "HOST's log is the same");
    reread(&mut b, 51);
    // Opened to HOST too: HOST's log changed, and OTHER's did not.
    t.set_access(&only_b, false, vec![OTHER.to_string(), HOST.to_string()]);
    assert_eq!(told(&mut a), Some(AEN_DISCOVERY_CHANGE), "HOST now sees it");
    assert_eq!(told(&mut b), None, "OTHER saw it before");
    reread(&mut a, 41);
    // Closed to both: both logs change.
    t.set_access(&only_b, false, Vec::new());
    assert_eq!((told(&mut a), told(&mut b)), (Some(AEN_DISCOVERY_CHANGE), Some(AEN_DISCOVERY_CHANGE)));
    reread(&mut a, 42);
    reread(&mut b, 52);
    // Removed while nobody may reach it: no host's log changes.
    t.remove_subsystems(&["nqn.2026-11.io.ironwire:b-only"]).expect("remove");
    assert_eq!((told(&mut a), told(&mut b)), (None, None));
    // A port: every host's log has the discovery entry of it.
    t.add_port("127.0.0.1:4431".parse().expect("addr"), TCP, false);
    assert_eq!((told(&mut a), told(&mut b)), (Some(AEN_DISCOVERY_CHANGE), Some(AEN_DISCOVERY_CHANGE)));
}

#[test]
fn a_removed_port_leaves_the_discovery_log_and_its_id_is_not_reused() {
    let t = target();
    let ids: Vec<u16> = t.ports().iter().map(|p| p.id).collect();
    assert!(t.remove_port(addr(), &TCP));
    assert!(!t.remove_port(addr(), &TCP), "removed twice");
    assert!(t.ports().iter().all(|p| p.addr != addr()));
    let id = t.add_port("127.0.0.1:4421".parse().expect("addr"), TCP, false);
    assert!(!ids.contains(&id), "port id {id} reused ({ids:?})");
}

#[test]
fn device_timeout_is_namespace_not_ready_without_dnr() {
    let late = block::Error::Io(std::io::Error::from_raw_os_error(110));
    for write in [false, true] {
        assert_eq!(nvmf::io_error_status(&late, write), Status::NAMESPACE_NOT_READY, "retryable, no DNR");
    }
    let eio = block::Error::Io(std::io::Error::from_raw_os_error(5));
    assert_eq!(nvmf::io_error_status(&eio, true), Status::WRITE_FAULT);
}

#[test]
fn out_of_space_is_capacity_exceeded_with_dnr_on_writes_only() {
    let full = block::Error::Io(std::io::Error::from(std::io::ErrorKind::StorageFull));
    assert_eq!(nvmf::io_error_status(&full, true), Status::CAPACITY_EXCEEDED.dnr(), "hosts report ENOSPC");
    assert_eq!(nvmf::io_error_status(&full, false), Status::UNRECOVERED_READ, "a read allocates nothing");
    // EDQUOT: a file system's quota, or an rbd pool's, is full.
    let quota = block::Error::Io(std::io::Error::from(std::io::ErrorKind::QuotaExceeded));
    assert_eq!(nvmf::io_error_status(&quota, true), Status::CAPACITY_EXCEEDED.dnr(), "EDQUOT");
}

/// A Compare (FUSE 01b) or Write (FUSE 10b) of one block at `lba`, its
/// data in the capsule.
fn fused_sqe(opcode: u8, fuse: u8, cid: u16, lba: u64) -> Sqe {
    let mut s = read_sqe(cid, 1, lba, 1, 512);
    s.opcode = opcode;
    s.flags |= fuse;
    s
}

fn in_capsule(q: &mut Queue, s: &Sqe, byte: u8) -> Outcome<Vec<u8>> {
    q.execute(0, s, 512, Some(vec![byte; 512]))
}

#[test]
fn fused_compare_and_write_becomes_one_block_request_once_both_halves_are_in() {
    let t = target();
    let (mut a, cntlid) = admin(&t);
    let (st, page) = identify(&mut a, 1, 0);
    assert!(st.is_success());
    assert_eq!(page.get(522..524), Some(&[1u8, 0][..]), "FUSES: Compare and Write");
    let mut io = io_queue(&t, cntlid, 1);
    // Data in the capsules.
    assert!(matches!(in_capsule(&mut io, &fused_sqe(0x05, 1, 3, 7), 0xa), Outcome::Deferred));
    match in_capsule(&mut io, &fused_sqe(0x01, 2, 4, 7), 0xc) {
        Outcome::Io(req) => {
            assert_eq!(req.cid, 4, "the request carries the Write's CID");
            match req.op {
                BlockOp::CompareAndWrite { compare_cid: 3, lba: 7, expected, data, fua: false } => {
                    assert_eq!((expected, data), (vec![0xa; 512], vec![0xc; 512]));
                }
                other => panic!("{other:?}"),
            }
        }
        other => panic!("{other:?}"),
    }
    assert!(io.poll_completion().is_none());
    // Data solicited, the Write's arriving first.
    assert!(matches!(ex(&mut io, 0, &fused_sqe(0x05, 1, 5, 9)), Outcome::NeedData { len: 512, .. }));
    assert!(matches!(ex(&mut io, 0, &fused_sqe(0x01, 2, 6, 9)), Outcome::NeedData { len: 512, .. }));
    assert!(matches!(io.data_arrived(0, 6, vec![2; 512]), Outcome::Deferred));
    match io.data_arrived(0, 5, vec![1; 512]) {
        Outcome::Io(req) => assert!(matches!(req.op, BlockOp::CompareAndWrite { compare_cid: 5, lba: 9, .. })),
        other => panic!("{other:?}"),
    }
    assert_eq!(io.awaiting_data(), 0);
}

/// A command the transport lost (its capsule's data failed its digest) or
/// withdrew (an Abort) still came next in the queue: a Compare waiting for its Write ends at
/// once, Failed Fused Command if the lost one was that Write, Missing Fused
/// Command if not; a lost Compare makes its Write fail with it.
#[test]
fn a_lost_capsule_ends_the_fused_pair_it_belongs_to() {
    let t = target();
    let (_a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    let ended = |io: &mut Queue| io.poll_completion().map(|c| (c.cid.get(), c.status()));
    assert!(matches!(in_capsule(&mut io, &fused_sqe(0x05, 1, 3, 7), 0), Outcome::Deferred));
    io.command_lost(&fused_sqe(0x01, 2, 4, 7));
    assert_eq!(ended(&mut io), Some((3, Status::ABORTED_FAILED_FUSED)), "its Write lost");
    assert!(matches!(in_capsule(&mut io, &fused_sqe(0x05, 1, 5, 7), 0), Outcome::Deferred));
    io.command_lost(&read_sqe(6, 1, 0, 1, 512));
    assert_eq!(ended(&mut io), Some((5, Status::ABORTED_MISSING_FUSED)), "another command lost");
    io.command_lost(&fused_sqe(0x05, 1, 7, 7));
    assert_eq!(status(&in_capsule(&mut io, &fused_sqe(0x01, 2, 8, 7), 0)), Status::ABORTED_FAILED_FUSED);
    assert_eq!(ended(&mut io), None);
    // The queue runs pairs as before.
    assert!(matches!(in_capsule(&mut io, &fused_sqe(0x05, 1, 9, 7), 0), Outcome::Deferred));
    assert!(matches!(in_capsule(&mut io, &fused_sqe(0x01, 2, 10, 7), 0), Outcome::Io(_)));
}

/// A read-only device: Identify Namespace says so (NSATTR bit 0), every
/// command that would write it ends in Namespace Is Write Protected with
/// DNR (a fused Compare and Write too: its Compare is aborted as failed),
/// and reads, Compare, Flush and a DSM without the deallocate hint run.
#[test]
fn a_read_only_namespace_refuses_every_write_and_says_so() {
    let t = target();
    let ro = Arc::new(Described { read_only: true, ..Described::new("ro", 512, 2048) });
    t.subsystem(SUB).expect("sub").add_namespace(Namespace::new(SUB, 3, ro)).expect("add");
    let (mut a, cntlid) = admin(&t);
    assert_eq!(identify(&mut a, 0, 3).1[99], 0x01, "NSATTR: write protected");
    assert_eq!(identify(&mut a, 0, 1).1[99], 0x00, "a writable namespace");
    let mut io = io_queue(&t, cntlid, 1);
    let on3 = |mut s: Sqe| {
        s.nsid = 3.into();
        s
    };
    let protected = Status::NS_WRITE_PROTECTED.dnr();
    let mut w = on3(read_sqe(1, 3, 4, 1, 512));
    w.opcode = 0x01;
    assert_eq!(status(&ex(&mut io, 0, &w)), protected, "Write, before any data is asked for");
    assert_eq!(status(&in_capsule(&mut io, &w, 1)), protected, "Write with in-capsule data");
    let mut wz = on3(read_sqe(2, 3, 4, 1, 512));
    wz.opcode = 0x08;
    wz.dptr = Sgl::default();
    assert_eq!(status(&ex(&mut io, 0, &wz)), protected, "Write Zeroes");
    let (dsm, ranges) = dsm_sqe(3, &[(0, 8)]);
    assert_eq!(status(&io.execute(0, &on3(dsm), 16, Some(ranges.clone()))), protected, "DSM deallocate");
    let (mut hint, _) = dsm_sqe(4, &[(0, 8)]);
    hint.cdw11 = 0.into();
    assert_eq!(status(&io.execute(0, &on3(hint), 16, Some(ranges))), Status::SUCCESS, "DSM without AD");
    assert!(matches!(ex(&mut io, 0, &on3(read_sqe(5, 3, 0, 1, 512))), Outcome::Io(_)), "Read");
    let mut flush = sqe(0x00, 6);
    flush.nsid = 3.into();
    assert!(matches!(ex(&mut io, 0, &flush), Outcome::Io(_)), "Flush");
    assert!(matches!(in_capsule(&mut io, &on3(fused_sqe(0x05, 0, 7, 0)), 0), Outcome::Io(_)), "Compare");
    // Fused Compare and Write: the Write is refused, the Compare aborted.
    assert!(matches!(in_capsule(&mut io, &on3(fused_sqe(0x05, 1, 8, 0)), 0), Outcome::Deferred));
    assert_eq!(status(&in_capsule(&mut io, &on3(fused_sqe(0x01, 2, 9, 0)), 0)), protected);
    let cqe = io.poll_completion().expect("the Compare's completion");
    assert_eq!((cqe.cid.get(), cqe.status()), (8, Status::ABORTED_FAILED_FUSED));
    // Namespace 1, on a writable device, still takes writes.
    let mut w1 = read_sqe(10, 1, 4, 1, 512);
    w1.opcode = 0x01;
    assert!(matches!(ex(&mut io, 0, &w1), Outcome::NeedData { .. }));
}

#[test]
fn lone_fused_halves_are_aborted_as_missing_their_partner() {
    let t = target();
    let (_a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    // A second half with no first.
    assert_eq!(status(&in_capsule(&mut io, &fused_sqe(0x01, 2, 1, 0), 0)), Status::ABORTED_MISSING_FUSED);
    // A first half followed by a plain command: the command runs, the
    // Compare is aborted.
    assert!(matches!(in_capsule(&mut io, &fused_sqe(0x05, 1, 2, 0), 0), Outcome::Deferred));
    assert!(matches!(ex(&mut io, 0, &read_sqe(3, 1, 0, 1, 512)), Outcome::Io(_)));
    let cqe = io.poll_completion().expect("the Compare's completion");
    assert_eq!((cqe.cid.get(), cqe.status()), (2, Status::ABORTED_MISSING_FUSED));
    // A Write to other blocks is not the partner: both are aborted (as
    // invalid, a_fused_pair_of_different_blocks_...), and nothing is written.
    assert!(matches!(in_capsule(&mut io, &fused_sqe(0x05, 1, 4, 0), 0), Outcome::Deferred));
    assert_eq!(status(&in_capsule(&mut io, &fused_sqe(0x01, 2, 5, 1), 0)), Status::INVALID_FIELD.dnr());
    let cqe = io.poll_completion().expect("the Compare's completion");
    assert_eq!((cqe.cid.get(), cqe.status()), (4, Status::INVALID_FIELD.dnr()));
    assert!(io.poll_completion().is_none());
    // Only Compare may be a first half; 11b is reserved.
    assert_eq!(status(&in_capsule(&mut io, &fused_sqe(0x01, 1, 6, 0), 0)), Status::INVALID_FIELD.dnr());
    assert_eq!(status(&in_capsule(&mut io, &fused_sqe(0x01, 3, 7, 0), 0)), Status::INVALID_FIELD.dnr());
}

#[test]
fn a_fused_compare_waiting_for_its_write_lets_go_of_a_removed_namespace() {
    let t = target();
    let (_a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    let sub = t.subsystem(SUB).expect("subsystem");
    let ns = sub.namespace(1).expect("namespace 1");
    assert!(matches!(in_capsule(&mut io, &fused_sqe(0x05, 1, 1, 3), 0), Outcome::Deferred));
    sub.remove_namespace(1).expect("removed");
    // Rung by the removal, the queue looks again: the pair can never run,
    // so the Compare ends and nothing holds the namespace any more.
    io.refresh_namespaces();
    let cqe = io.poll_completion().expect("the Compare's completion");
    assert_eq!((cqe.cid.get(), cqe.status()), (1, Status::ABORTED_MISSING_FUSED));
    assert_eq!(ns.holders(), 0, "the held Compare let go");
    // Its Write arriving late finds no Compare before it.
    assert_eq!(status(&in_capsule(&mut io, &fused_sqe(0x01, 2, 2, 3), 0)), Status::ABORTED_MISSING_FUSED);
    // A pair on a namespace that stays is not touched by another's removal.
    let other = Arc::new(Described::new("r2", 512, 2048));
    sub.add_namespace(Namespace::new(SUB, 2, other)).expect("add 2");
    let mut c = fused_sqe(0x05, 1, 3, 3);
    c.nsid = 2.into();
    assert!(matches!(in_capsule(&mut io, &c, 0), Outcome::Deferred));
    sub.add_namespace(Namespace::new(SUB, 5, Arc::new(Described::new("r5", 512, 8)))).expect("add 5");
    sub.remove_namespace(5).expect("removed 5");
    io.refresh_namespaces();
    assert!(io.poll_completion().is_none(), "the pair on namespace 2 still waits for its Write");
    let mut w = fused_sqe(0x01, 2, 4, 3);
    w.nsid = 2.into();
    assert!(matches!(in_capsule(&mut io, &w, 0), Outcome::Io(_)));
}

#[test]
fn a_fused_pair_does_not_run_on_a_namespace_removed_under_it() {
    let t = target();
    let (_a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    let sub = t.subsystem(SUB).expect("subsystem");
    assert!(matches!(in_capsule(&mut io, &fused_sqe(0x05, 1, 1, 3), 0), Outcome::Deferred));
    // Namespace 1 is removed and another takes its NSID before the queue
    // is rung: the Write, checked against the new one, must not run the
    // pair on the old device.
    sub.remove_namespace(1).expect("removed");
    sub.add_namespace(Namespace::new(SUB, 1, Arc::new(Described::new("new1", 512, 2048)))).expect("re-added");
    assert_eq!(status(&in_capsule(&mut io, &fused_sqe(0x01, 2, 2, 3), 0)), Status::ABORTED_FAILED_FUSED);
    let cqe = io.poll_completion().expect("the Compare's completion");
    assert_eq!((cqe.cid.get(), cqe.status()), (1, Status::INVALID_NAMESPACE.dnr()));
    assert!(io.poll_completion().is_none());
}

/// The same for a pair whose data was solicited: sent to namespace 1
/// before it was replaced under its NSID, its halves' data arriving after
/// must not run the pair on the namespace that took the NSID.
#[test]
fn a_fused_pair_whose_data_came_after_its_namespace_was_replaced_does_not_run() {
    let t = target();
    let (_a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    let sub = t.subsystem(SUB).expect("subsystem");
    assert!(matches!(ex(&mut io, 0, &fused_sqe(0x05, 1, 1, 3)), Outcome::NeedData { len: 512, .. }));
    assert!(matches!(ex(&mut io, 0, &fused_sqe(0x01, 2, 2, 3)), Outcome::NeedData { len: 512, .. }));
    sub.remove_namespace(1).expect("removed");
    sub.add_namespace(Namespace::new(SUB, 1, Arc::new(Described::new("new1", 512, 2048)))).expect("re-added");
    let outs = [io.data_arrived(0, 1, vec![0; 512]), io.data_arrived(0, 2, vec![1; 512])];
    for out in &outs {
        if let Outcome::Io(req) = out {
            panic!("the pair sent to the removed namespace ran on {}", req.device.name);
        }
    }
    let mut statuses: Vec<(u16, Status)> = std::iter::from_fn(|| io.poll_completion())
        .map(|c| (c.cid.get(), c.status()))
        .chain(outs.iter().filter_map(|o| match o {
            Outcome::Complete { cqe, .. } => Some((cqe.cid.get(), cqe.status())),
            _ => None,
        }))
        .collect();
    statuses.sort_by_key(|&(cid, _)| cid);
    assert_eq!(statuses.len(), 2, "both halves complete: {statuses:?}");
    assert!(statuses.iter().all(|(_, s)| !s.is_success()), "{statuses:?}");
    assert_eq!(io.awaiting_data(), 0);
}

#[test]
fn fused_write_that_fails_its_checks_aborts_the_compare_as_failed_fused() {
    let t = target();
    let (_a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    assert!(matches!(in_capsule(&mut io, &fused_sqe(0x05, 1, 1, 3), 0), Outcome::Deferred));
    let mut w = fused_sqe(0x01, 2, 2, 3);
    w.dptr = Sgl::transport(1024); // the SGL says two blocks, NLB one
    assert_eq!(status(&io.execute(0, &w, 1024, None::<Vec<u8>>)), Status::SGL_DATA_LENGTH_INVALID.dnr());
    let cqe = io.poll_completion().expect("the Compare's completion");
    assert_eq!((cqe.cid.get(), cqe.status()), (1, Status::ABORTED_FAILED_FUSED));
}

/// DLFEAT says deallocated blocks read as zeros only where the device
/// promises it (not a block device's discard hint); Write Zeroes may
/// deallocate on both.
#[test]
fn dlfeat_promises_zeros_only_where_the_device_does() {
    let t = target();
    let hint = Arc::new(Described {
        backend: "block",
        volatile_write_cache: true,
        deallocate_reads_zeroes: false,
        ..Described::new("b3", 512, 2048)
    });
    t.subsystem(SUB).expect("sub").add_namespace(Namespace::new(SUB, 3, hint)).expect("add");
    let (mut a, _) = admin(&t);
    assert_eq!(identify(&mut a, 0, 1).1[33], 0x09, "memory: zeros, and Write Zeroes may deallocate");
    assert_eq!(identify(&mut a, 0, 3).1[33], 0x08, "a discard hint: nothing promised of what it reads");
}

#[test]
fn a_removed_namespace_is_held_until_every_queue_and_request_lets_go() {
    let t = target();
    let (_a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    let mut idle = io_queue(&t, cntlid, 2);
    let sub = t.subsystem(SUB).expect("subsystem");
    let ns = sub.namespace(1).expect("namespace 1");
    assert_eq!(ns.holders(), 0, "no queue used it yet");
    // The second queue reads once, then has nothing more to send.
    assert!(matches!(ex(&mut idle, 0, &read_sqe(9, 1, 0, 1, 512)), Outcome::Io(_)));
    let Outcome::Io(first) = ex(&mut io, 0, &read_sqe(1, 1, 0, 1, 512)) else { panic!("a read") };
    let Outcome::Io(second) = ex(&mut io, 0, &read_sqe(2, 1, 8, 1, 512)) else { panic!("a read") };
    assert_eq!(ns.holders(), 2, "one per queue, however many requests");
    drop(first);
    sub.remove_namespace(1).expect("removed");
    // The first queue's next command finds it gone and its cache lets go,
    // but the request still running holds it.
    assert_eq!(status(&ex(&mut io, 0, &read_sqe(3, 1, 0, 1, 512))), Status::INVALID_NAMESPACE.dnr());
    assert_eq!(ns.holders(), 2);
    drop(second);
    assert_eq!(ns.holders(), 1, "the idle queue's cache");
    // The idle queue, rung and told to look again, lets go of it.
    idle.refresh_namespaces();
    assert_eq!(ns.holders(), 0);
    assert_eq!(Arc::strong_count(&ns), 1, "only the test holds it now");
}

/// NVMe-oF 1.1 / Base 2.0 Discovery Log Page: GENCTR is incremented each
/// time the log changes. Adding a host to a subsystem's list adds that
/// subsystem to the host's discovery log, so GENCTR must move.
#[test]
fn discovery_genctr_changes_when_a_hosts_access_changes() {
    let t = target();
    let mut d = discovery_admin(&t, HOST);
    let (_, before) = get_log(&mut d, 0x70, 8192, 0);
    assert!(!discovery_nqns(&before).contains(&SECRET.to_string()));
    let sub = t.subsystem(SECRET).expect("sub2");
    t.set_access(&sub, false, vec![OTHER.to_string(), HOST.to_string()]);
    let (_, after) = get_log(&mut d, 0x70, 8192, 0);
    assert!(discovery_nqns(&after).contains(&SECRET.to_string()), "the log changed for this host");
    assert_ne!(before[0..8], after[0..8], "GENCTR must change when the log's contents change");
}

/// Property Get/Set are admin-queue fabrics commands (nvmet answers them
/// on an I/O queue with Invalid Opcode, nvmet_parse_fabrics_io_cmd); here
/// an I/O queue could otherwise clear CC.EN and take the whole
/// controller down.
#[test]
fn property_set_on_an_io_queue_is_refused() {
    let t = target();
    let (mut a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    let st = prop_set_cc(&mut io, 0);
    let (_, csts) = prop_get(&mut a, 0x1c, false);
    assert_eq!(csts & 1, 1, "CSTS.RDY cleared by a Property Set sent on I/O queue 1");
    assert_eq!(st, Status::INVALID_OPCODE.dnr());
}

/// Base 2.0 Get Log Page: NUMD is the number of dwords to return; an SGL
/// that does not describe that length is Data SGL Length Invalid (SGLS
/// bit 16 is clear), as is an Identify whose SGL is not 4 KiB.
#[test]
fn get_log_page_and_identify_transfer_exactly_what_they_name() {
    let t = target();
    let (mut a, _) = admin(&t);
    let smart = |cid: u16, numd: u32, sgl: u32| {
        let mut s = sqe(0x02, cid);
        s.cdw10 = (0x02 | (numd << 16)).into();
        s.dptr = Sgl::transport(sgl);
        s
    };
    // NUMD 0 (4 bytes) in a 512-byte SGL; NUMD 127 (512 bytes) in 64.
    for (cid, numd, sgl) in [(7, 0, 512), (8, 127, 64)] {
        let (cqe, data) = cqe_of(run(&mut a, &smart(cid, numd, sgl), None));
        assert_eq!(cqe.status(), Status::SGL_DATA_LENGTH_INVALID.dnr(), "NUMD {numd}, SGL {sgl}");
        assert!(data.is_empty());
    }
    let (cqe, data) = cqe_of(run(&mut a, &smart(9, 127, 512), None));
    assert_eq!((cqe.status(), data.len()), (Status::SUCCESS, 512));
    let mut id = sqe(0x06, 10);
    id.cdw10 = 1.into();
    id.dptr = Sgl::transport(512);
    let (cqe, _) = cqe_of(run(&mut a, &id, None));
    assert_eq!(cqe.status(), Status::SGL_DATA_LENGTH_INVALID.dnr(), "Identify into 512 bytes");
}

#[test]
fn dataset_management_with_fewer_bytes_than_ranges_is_refused() {
    let t = target();
    let (_a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    let (mut d, data) = dsm_sqe(5, &[(8, 16)]);
    d.cdw10 = 3.into(); // NR: four ranges, 64 bytes
    let out = run(&mut io, &d, Some(data));
    if let Outcome::Io(req) = &out {
        panic!("ran {:?} with 3 of the 4 ranges missing", req.op);
    }
    assert_eq!(status(&out), Status::SGL_DATA_LENGTH_INVALID.dnr());
}

/// Base 2.0 5.16.1.3: when LPA bit 0 (SMART per namespace) is clear, a
/// SMART / Health log request naming an NSID other than 0h or FFFFFFFFh is
/// aborted with Invalid Field in Command.
#[test]
fn smart_log_for_one_namespace_is_refused_without_lpa_bit_0() {
    let t = target();
    let (mut a, _) = admin(&t);
    let (_, ctrl) = identify(&mut a, 1, 0);
    assert_eq!(ctrl[261] & 1, 0, "LPA: SMART per namespace not supported");
    let mut s = sqe(0x02, 7);
    s.nsid = 1.into();
    s.cdw10 = (0x02 | (127 << 16)).into();
    s.dptr = Sgl::transport(512);
    let (cqe, _) = cqe_of(run(&mut a, &s, None));
    assert_eq!(cqe.status(), Status::INVALID_FIELD.dnr());
    // A discovery controller has no SMART / Health log at all, whatever
    // the NSID: Invalid Log Page, as for every log but the discovery log.
    let mut d = discovery_admin(&t, HOST);
    assert_eq!(status(&run(&mut d, &s, None)), Status::INVALID_LOG_PAGE.dnr());
}

/// NVMe-oF Disconnect deletes the I/O queue it is sent on; on the admin
/// queue it is "Invalid Queue Type: the command was sent on the wrong
/// queue type" (SCT 1h, SC 85h), and the admin queue stays.
#[test]
fn disconnect_on_the_admin_queue_is_invalid_queue_type() {
    let t = target();
    let (mut a, _) = admin(&t);
    let out = run(&mut a, &fabrics(0x08, 3), None);
    assert!(!matches!(out, Outcome::CompleteAndClose { .. }), "Disconnect closed the admin queue: {out:?}");
    assert_eq!(status(&out), Status(0x185).dnr());
}

/// Base 2.0: an NGUID / EUI-64 / UUID identifies one namespace. Two NSIDs
/// of one subsystem backed by the same rbd image get the same three
/// identifiers, and add_namespace takes both (Linux then refuses the second
/// with "duplicate IDs"); nothing in config validation catches configured
/// duplicates either (crates/ironwire/src/config.rs:834-855).
#[test]
fn two_namespaces_never_share_identifiers() {
    let t = target();
    let sub = t.subsystem(SUB).expect("sub");
    let img = || {
        Arc::new(Described {
            shared_identity: Some("ceph:0b1d2c3e-0000-4000-8000-00000000abcd:10a2b3c4d5e6".to_string()),
            ..Described::new("rbd0", 512, 2048)
        })
    };
    sub.add_namespace(Namespace::new(SUB, 2, img())).expect("ns 2");
    let dup = sub.add_namespace(Namespace::new(SUB, 3, img()));
    let ids: Vec<_> = sub.namespaces().iter().map(|n| (n.nguid, n.uuid)).collect();
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert!(dup.is_err() || unique.len() == ids.len(), "namespaces 2 and 3 report the same NGUID and UUID");
}

/// Base 2.0 CAP.MQES: "For NVMe over Fabrics implementations, this value
/// applies to only the I/O Submission Queues". The config accepts
/// queue_entries from 2 (crates/ironwire/src/config.rs:976); below 32 an
/// admin Connect with Linux's SQSIZE 31 (NVME_AQ_DEPTH 32) is refused.
#[test]
fn mqes_does_not_limit_the_admin_queue() {
    let t = Target::new(Settings { queue_entries: 16, ..Default::default() });
    t.add_subsystem(Subsystem::new(SUB, "SN1", true, Vec::new())).expect("sub");
    t.add_port(addr(), TCP, false);
    let t = Arc::new(t);
    let mut q = Queue::new(t.clone(), TCP, addr(), addr());
    let data = ConnectData::new([1; 16], 0xffff, SUB, HOST).as_bytes().to_vec();
    let out = run(&mut q, &connect_sqe(0, 31, 5000), Some(data));
    assert_eq!(status(&out), Status::SUCCESS, "admin queue of 32 entries refused because MQES is 15");
}

/// NVMe base 2.0 5.27.1 (Feature Identifiers): Interrupt Coalescing (08h)
/// is a feature of PCIe controllers only, prohibited on a fabrics
/// controller (there are no interrupts to coalesce): Set and Get Features
/// are Invalid Field, as for any feature the controller lacks, and as
/// nvmet answers.
#[test]
fn interrupt_coalescing_is_not_a_feature_of_a_fabrics_controller() {
    let t = target();
    let (mut a, _) = admin(&t);
    assert_eq!(set_feature(&mut a, 0x08, 0x0000_0a04).0, Status::INVALID_FIELD.dnr());
    assert_eq!(get_feature(&mut a, 0x08).0, Status::INVALID_FIELD.dnr());
    let mut caps = sqe(0x0a, 8);
    caps.cdw10 = (0x08 | (3 << 8)).into();
    assert_eq!(status(&run(&mut a, &caps, None)), Status::INVALID_FIELD.dnr(), "SEL 011b: no such feature");
}

/// NVMe base 2.0 5.27.1.5: Dword 0 of the Set Features completion says how
/// many I/O submission and completion queues were allocated, and Get
/// Features returns the same. A fabrics I/O queue is one of each, so the
/// controller allocates the smaller of the two counts to both: a host told
/// it has four submission queues must be able to connect four I/O queues.
#[test]
fn number_of_queues_answers_the_queues_it_allocates() {
    let t = target();
    let (mut a, cntlid) = admin(&t);
    // Four submission queues, two completion queues asked for.
    assert_eq!(set_feature(&mut a, 0x07, 0x0001_0003), (Status::SUCCESS, 0x0001_0001), "two of each");
    assert_eq!(get_feature(&mut a, 0x07), (Status::SUCCESS, 0x0001_0001), "Get says what Set did");
    let _q2 = io_queue(&t, cntlid, 2);
    let mut q3 = Queue::new(t.clone(), TCP, addr(), addr());
    assert_eq!(status(&connect(&mut q3, 3, cntlid, SUB, HOST)), Status::CONNECT_INVALID_PARAMETERS.dnr());
}

/// NVMe base 2.0 5.17 (CNS values): CNS 05h for an inactive NSID returns
/// a zero filled data structure, as CNS 00h and 08h do; NSID 0 and FFFFFFFFh are
/// Invalid Namespace or Format.
#[test]
fn identify_nvm_namespace_of_an_inactive_nsid_reads_as_zeroes() {
    let t = target();
    let (mut a, _) = admin(&t);
    let (st, page) = identify(&mut a, 0x05, 9);
    assert_eq!(st, Status::SUCCESS);
    assert!(page.iter().all(|&b| b == 0));
    assert_eq!(identify(&mut a, 0x05, 1).0, Status::SUCCESS);
    assert_eq!(identify(&mut a, 0x05, 0).0, Status::INVALID_NAMESPACE.dnr());
    assert_eq!(identify(&mut a, 0x05, u32::MAX).0, Status::INVALID_NAMESPACE.dnr());
    assert_eq!(identify(&mut a, 0x08, 9), (Status::SUCCESS, vec![0; 4096]), "CNS 08h alike");
}

/// NVMe base 2.0 3.7.2: a Controller Level Reset (CC.EN 1 to 0) stops
/// processing every outstanding admin command, Asynchronous Event Requests
/// included; the host forgets them. Kept, they would count against AERL
/// once it is enabled again, and an event would complete a command ID the
/// host may have given to another command since.
#[test]
fn a_controller_reset_ends_its_outstanding_async_event_requests() {
    let t = target();
    let (mut a, _) = admin(&t);
    set_feature(&mut a, 0x0b, 1 << 8);
    for cid in 40..44 {
        assert!(matches!(ex(&mut a, 0, &sqe(0x0c, cid)), Outcome::Deferred));
    }
    assert_eq!(prop_set_cc(&mut a, 0x0046_0000), Status::SUCCESS);
    assert_eq!(prop_get(&mut a, 0x1c, false).1 & 1, 0, "CSTS.RDY clear");
    assert_eq!(prop_set_cc(&mut a, 0x0046_0001), Status::SUCCESS);
    set_feature(&mut a, 0x0b, 1 << 8);
    for cid in 50..54 {
        assert!(matches!(ex(&mut a, 0, &sqe(0x0c, cid)), Outcome::Deferred), "AER {cid} refused");
    }
    let sub = t.subsystem(SUB).expect("sub");
    sub.add_namespace(Namespace::new(SUB, 5, Arc::new(Described::new("n5", 512, 2048)))).expect("add");
    assert_eq!(a.poll_event().expect("event").cid.get(), 50, "completes a request made after the reset");
}

/// NVMe base 2.0 3.1.3.5 (CC) with the CAP and Identify values this
/// controller reports: an I/O controller's queues take 64-byte SQEs and 16-byte CQEs (IOSQES 6,
/// IOCQES 4), CAP.MPSMIN = MPSMAX = 0 allows only 4 KiB pages, CAP.AMS
/// only round robin, and CAP.CSS the NVM command set (000b) or all I/O
/// command sets (110b). A host enabling the controller with anything else
/// gets CSTS.CFS, not CSTS.RDY, and its commands are refused, as nvmet
/// does; a reset (CC.EN 0) clears it.
#[test]
fn enabling_with_an_unsupported_configuration_sets_controller_fatal_status() {
    let t = target();
    for (cc, what) in [
        (0x0000_0001, "IOSQES and IOCQES 0"),
        (0x0047_0001, "IOSQES 7"),
        (0x0045_0001, "IOSQES 5"),
        (0x0036_0001, "IOCQES 3"),
        (0x0046_0081, "MPS 1 (8 KiB)"),
        (0x0046_0801, "AMS weighted round robin"),
        (0x0046_0011, "CSS 001b"),
        (0x0046_0071, "CSS 111b (admin only)"),
    ] {
        let mut q = Queue::new(t.clone(), TCP, addr(), addr());
        assert!(status(&connect(&mut q, 0, 0xffff, SUB, HOST)).is_success());
        assert_eq!(prop_set_cc(&mut q, cc), Status::SUCCESS, "{what}: the Property Set itself succeeds");
        assert_eq!(prop_get(&mut q, 0x1c, false).1 & 3, 2, "{what}: CSTS.CFS, not CSTS.RDY");
        let mut id = sqe(0x06, 4);
        id.cdw10 = 1.into();
        id.dptr = Sgl::transport(4096);
        assert_eq!(status(&run(&mut q, &id, None)), Status::COMMAND_SEQUENCE_ERROR.dnr(), "{what}");
        assert_eq!(prop_set_cc(&mut q, 0x0046_0000), Status::SUCCESS);
        assert_eq!(prop_get(&mut q, 0x1c, false).1 & 3, 0, "{what}: a reset clears CSTS.CFS");
        assert_eq!(prop_set_cc(&mut q, 0x0046_0001), Status::SUCCESS);
        assert_eq!(prop_get(&mut q, 0x1c, false).1 & 3, 1, "{what}: then a valid CC enables it");
        q.close();
    }
    let mut q = Queue::new(t.clone(), TCP, addr(), addr());
    assert!(status(&connect(&mut q, 0, 0xffff, SUB, HOST)).is_success());
    assert_eq!(prop_set_cc(&mut q, 0x0046_0061), Status::SUCCESS);
    assert_eq!(prop_get(&mut q, 0x1c, false).1 & 3, 1, "CSS 110b (all I/O command sets, CAP.CSS bit 43)");
    // A discovery controller has no I/O queues: its IOSQES and IOCQES are
    // not looked at (hosts write 0 or the I/O values), the rest is.
    let mut d = Queue::new(t.clone(), TCP, addr(), addr());
    assert!(status(&connect(&mut d, 0, 0xffff, nvme_spec::DISCOVERY_NQN, HOST)).is_success());
    assert_eq!(prop_set_cc(&mut d, 1), Status::SUCCESS);
    assert_eq!(prop_get(&mut d, 0x1c, false).1 & 3, 1);
    let mut d = Queue::new(t.clone(), TCP, addr(), addr());
    assert!(status(&connect(&mut d, 0, 0xffff, nvme_spec::DISCOVERY_NQN, HOST)).is_success());
    assert_eq!(prop_set_cc(&mut d, 0x0046_0061), Status::SUCCESS);
    assert_eq!(prop_get(&mut d, 0x1c, false).1 & 3, 2, "CAP.CSS bit 43 is clear on a discovery controller");
}

/// NVMe base 2.0 5.27.1, Temperature Threshold (04h): the feature holds an over and an
/// under threshold per sensor; CDW11 TMPSEL and THSEL select which one a
/// Set writes and a Get reads (Linux's hwmon reads both as temp1_max and
/// temp1_min), Dword 0 of a Get carries that threshold. A sensor that is
/// not implemented (only the composite temperature is) and the reserved
/// THSEL values are Invalid Field.
#[test]
fn temperature_threshold_keeps_over_and_under_apart() {
    let t = target();
    let (mut a, _) = admin(&t);
    let get = |q: &mut Queue, cdw11: u32| {
        let mut s = sqe(0x0a, 8);
        s.cdw10 = 0x04.into();
        s.cdw11 = cdw11.into();
        let (cqe, _) = cqe_of(run(q, &s, None));
        (cqe.status(), cqe.dw0.get())
    };
    const UNDER: u32 = 1 << 20;
    assert_eq!(get(&mut a, 0), (Status::SUCCESS, 0x0157), "over: WCTEMP by default");
    assert_eq!(get(&mut a, UNDER), (Status::SUCCESS, 0), "under: none by default");
    assert_eq!(set_feature(&mut a, 0x04, UNDER | 273).0, Status::SUCCESS);
    assert_eq!(get(&mut a, UNDER), (Status::SUCCESS, 273));
    assert_eq!(get(&mut a, 0), (Status::SUCCESS, 0x0157), "setting under left over alone");
    assert_eq!(set_feature(&mut a, 0x04, 330).0, Status::SUCCESS);
    assert_eq!((get(&mut a, 0).1, get(&mut a, UNDER).1), (330, 273));
    assert_eq!(set_feature(&mut a, 0x04, (0xf << 16) | 340).0, Status::SUCCESS, "TMPSEL 1111b: every sensor");
    assert_eq!(get(&mut a, 0).1, 340);
    assert_eq!(set_feature(&mut a, 0x04, (1 << 16) | 300).0, Status::INVALID_FIELD.dnr(), "no sensor 1");
    assert_eq!(get(&mut a, 1 << 16).0, Status::INVALID_FIELD.dnr(), "no sensor 1");
    assert_eq!(set_feature(&mut a, 0x04, (2 << 20) | 300).0, Status::INVALID_FIELD.dnr(), "THSEL 10b reserved");
    assert_eq!(get(&mut a, 0).1, 340, "a refused Set changes nothing");
}

/// What was checked against NVMe base 2.0 and found right, kept so: the
/// active NSID list starts after the NSID given and refuses FFFFFFFEh and
/// FFFFFFFFh (5.17, CNS 02h); a CNS the controller lacks is Invalid Field;
/// a log page offset that is not dword aligned is Invalid Field (5.16);
/// RAE keeps the Changed Namespace List and its event; Number of Queues
/// after an I/O queue exists is Command Sequence Error (5.27.1); a KATO of
/// 0 never expires.
#[test]
fn identify_log_page_and_feature_edges_answer_as_the_spec_says() {
    let t = target();
    let (mut a, cntlid) = admin(&t);
    set_feature(&mut a, 0x0b, 1 << 8);
    let sub = t.subsystem(SUB).expect("sub");
    sub.add_namespace(Namespace::new(SUB, 5, Arc::new(Described::new("n5", 512, 64)))).expect("add");
    let (st, list) = identify(&mut a, 0x02, 1);
    assert_eq!((st, u32_at(&list, 0), u32_at(&list, 4)), (Status::SUCCESS, 5, 0), "after NSID 1: 5 alone");
    assert_eq!(identify(&mut a, 0x02, 5).1, vec![0; 4096], "nothing after 5");
    assert_eq!(identify(&mut a, 0x02, 0xffff_fffe).0, Status::INVALID_NAMESPACE.dnr());
    assert_eq!(identify(&mut a, 0x02, u32::MAX).0, Status::INVALID_NAMESPACE.dnr());
    assert_eq!(identify(&mut a, 0x04, 0).0, Status::INVALID_FIELD.dnr(), "no NVM Set List");
    assert_eq!(get_log(&mut a, 0x02, 256, 2).0, Status::INVALID_FIELD.dnr(), "offset not dword aligned");
    let mut rae = sqe(0x02, 9);
    rae.cdw10 = (0x04 | (1 << 15) | ((4096 / 4 - 1) << 16)).into();
    rae.dptr = Sgl::transport(4096);
    let (cqe, changed) = cqe_of(run(&mut a, &rae, None));
    assert_eq!((cqe.status(), u32_at(&changed, 0)), (Status::SUCCESS, 5));
    assert!(matches!(ex(&mut a, 0, &sqe(0x0c, 40)), Outcome::Deferred));
    assert_eq!(a.poll_event().expect("RAE kept the event").dw0.get(), nvme_spec::log::AEN_NS_CHANGED);
    assert_eq!(u32_at(&get_log(&mut a, 0x04, 4096, 0).1, 0), 5, "and the list");
    let _io = io_queue(&t, cntlid, 1);
    assert_eq!(set_feature(&mut a, 0x07, 0x0001_0001).0, Status::COMMAND_SEQUENCE_ERROR.dnr());
    assert_eq!(set_feature(&mut a, 0x0f, 0), (Status::SUCCESS, 0));
    assert!(!a.expired(u64::MAX), "KATO 0: no keep-alive timer");
}

/// A discovery controller connected with KATO 0 still expires, after
/// 120 s without a command (nvmet's stale-discovery cleanup): a host gone
/// without closing its connection does not hold it for ever. An I/O
/// controller given KATO 0 has no timer, as on nvmet.
#[test]
fn a_discovery_controller_without_kato_expires_after_120_s() {
    let t = target();
    let data = |sub: &str| ConnectData::new([1; 16], 0xffff, sub, HOST).as_bytes().to_vec();
    let mut d = Queue::new(t.clone(), TCP, addr(), addr());
    assert!(status(&run(&mut d, &connect_sqe(0, 31, 0), Some(data(nvme_spec::DISCOVERY_NQN)))).is_success());
    assert!(!d.expired(120_000), "within 120 s");
    assert!(d.expired(120_001), "a discovery controller with KATO 0 expires after 120 s");
    let mut a = Queue::new(t, TCP, addr(), addr());
    assert!(status(&run(&mut a, &connect_sqe(0, 31, 0), Some(data(SUB)))).is_success());
    assert!(!a.expired(u64::MAX), "an I/O controller with KATO 0 has no timer");
}

/// NVMe base 2.0 3.4.2: when the first command of a fused operation
/// fails, the second is aborted, with Command Aborted due to Failed Fused
/// Command (its partner was there; it failed): a Compare that fails its
/// checks, one whose data never came, or a first half that is no Compare.
#[test]
fn a_fused_write_after_its_compare_failed_is_aborted_as_failed_fused() {
    let t = target();
    let (_a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    // The Compare is past the 2048-block namespace.
    let c = fused_sqe(0x05, 1, 1, 4000);
    assert_eq!(status(&in_capsule(&mut io, &c, 0)), Status::LBA_OUT_OF_RANGE.dnr());
    assert_eq!(status(&in_capsule(&mut io, &fused_sqe(0x01, 2, 2, 4000), 0)), Status::ABORTED_FAILED_FUSED);
    // Its data did not arrive (a digest error): the transport completes it.
    assert!(matches!(ex(&mut io, 0, &fused_sqe(0x05, 1, 3, 0)), Outcome::NeedData { .. }));
    io.data_failed(3);
    assert_eq!(status(&in_capsule(&mut io, &fused_sqe(0x01, 2, 4, 0), 0)), Status::ABORTED_FAILED_FUSED);
    // A Write as the first half is refused, and takes its second with it.
    assert_eq!(status(&in_capsule(&mut io, &fused_sqe(0x01, 1, 5, 0), 0)), Status::INVALID_FIELD.dnr());
    assert_eq!(status(&in_capsule(&mut io, &fused_sqe(0x01, 2, 6, 0), 0)), Status::ABORTED_FAILED_FUSED);
    assert!(io.poll_completion().is_none());
    // Only the command right after the failed first: a plain one clears it,
    // and a second half after that has no first.
    assert_eq!(status(&in_capsule(&mut io, &fused_sqe(0x05, 1, 7, 4000), 0)), Status::LBA_OUT_OF_RANGE.dnr());
    assert!(matches!(ex(&mut io, 0, &read_sqe(8, 1, 0, 1, 512)), Outcome::Io(_)));
    assert_eq!(status(&in_capsule(&mut io, &fused_sqe(0x01, 2, 9, 0), 0)), Status::ABORTED_MISSING_FUSED);
    // And a good pair still runs.
    assert!(matches!(in_capsule(&mut io, &fused_sqe(0x05, 1, 10, 0), 0), Outcome::Deferred));
    assert!(matches!(in_capsule(&mut io, &fused_sqe(0x01, 2, 11, 0), 0), Outcome::Io(_)));
}

/// NVMe base 2.0 3.4.2: the LBA range of a fused pair is the same for
/// both commands; if they do not match, both are aborted with Invalid
/// Field in Command. A fused combination the controller does not support
/// (a second half that is no Write, or any fused command on the admin
/// queue) is Invalid Field too.
#[test]
fn a_fused_pair_of_different_blocks_or_an_unsupported_second_half_is_invalid_field() {
    let t = target();
    let (mut a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    let ranges: [(u64, u32, u32); 3] = [(1, 1, 1), (0, 2, 1), (0, 1, 2)];
    for (i, (lba, blocks, nsid)) in ranges.into_iter().enumerate() {
        let cid = 10 * i as u16;
        assert!(matches!(in_capsule(&mut io, &fused_sqe(0x05, 1, cid, 0), 0), Outcome::Deferred));
        let mut w = fused_sqe(0x01, 2, cid + 1, lba);
        w.cdw12 = (blocks - 1).into();
        w.nsid = nsid.into();
        let data = vec![0; 512 * blocks as usize];
        let out = io.execute(0, &w, data.len() as u32, Some(data));
        assert_eq!(status(&out), Status::INVALID_FIELD.dnr(), "Write {lba}+{blocks} nsid {nsid}");
        let cqe = io.poll_completion().expect("the Compare's completion");
        assert_eq!((cqe.cid.get(), cqe.status()), (cid, Status::INVALID_FIELD.dnr()));
    }
    // The Compare's data still on its way when the mismatched Write came.
    assert!(matches!(ex(&mut io, 0, &fused_sqe(0x05, 1, 40, 0)), Outcome::NeedData { .. }));
    assert_eq!(status(&in_capsule(&mut io, &fused_sqe(0x01, 2, 41, 3), 0)), Status::INVALID_FIELD.dnr());
    assert!(matches!(io.data_arrived(0, 40, vec![0; 512]), Outcome::Deferred));
    let cqe = io.poll_completion().expect("the Compare's completion");
    assert_eq!((cqe.cid.get(), cqe.status()), (40, Status::INVALID_FIELD.dnr()));
    // A Read as the second half: not a fused operation of the NVM command
    // set; the Compare before it lost its partner.
    assert!(matches!(in_capsule(&mut io, &fused_sqe(0x05, 1, 50, 0), 0), Outcome::Deferred));
    let mut r = read_sqe(51, 1, 0, 1, 512);
    r.flags |= 2;
    assert_eq!(status(&ex(&mut io, 0, &r)), Status::INVALID_FIELD.dnr());
    let cqe = io.poll_completion().expect("the Compare's completion");
    assert_eq!((cqe.cid.get(), cqe.status()), (50, Status::ABORTED_MISSING_FUSED));
    // No admin command fuses.
    for fuse in 1..=3 {
        let mut k = sqe(0x18, 60 + u16::from(fuse));
        k.flags |= fuse;
        assert_eq!(status(&ex(&mut a, 0, &k)), Status::INVALID_FIELD.dnr(), "admin FUSE {fuse:02b}");
    }
}

/// The NVM I/O command edges (NVMe base 2.0 7.1, NVM Command Set 1.0
/// 3.2, 4.1.5): Flush to NSID FFFFFFFFh is Invalid Namespace or Format,
/// as VWC bits 2:1 = 10b say, and so are NSID 0 and an inactive NSID;
/// commands ONCS does not list are Invalid Opcode, as are admin opcodes on
/// an I/O queue and I/O opcodes on the admin queue; the hints no namespace
/// here acts on (LR, PRINFO without protection information, DSM hints in
/// CDW13, a Dataset Management without Attribute Deallocate) change
/// nothing; zero-length deallocate ranges are dropped; Write Zeroes keeps
/// DEAC, which DLFEAT bit 3 allows.
#[test]
fn io_command_edges_answer_as_the_spec_says() {
    let t = target();
    let (mut a, cntlid) = admin(&t);
    let ctrl = identify(&mut a, 1, 0).1;
    assert_eq!(ctrl[525] & 0x06, 0x04, "VWC: Flush to NSID FFFFFFFFh unsupported");
    assert_eq!(u16::from_le_bytes([ctrl[520], ctrl[521]]), 0x1d, "ONCS: Compare, DSM, Write Zeroes; SSFS");
    assert_eq!(identify(&mut a, 0, 1).1[33] & 0x08, 0x08, "DLFEAT: Write Zeroes may deallocate");
    let mut io = io_queue(&t, cntlid, 1);
    for nsid in [u32::MAX, 0, 9] {
        let mut f = sqe(0x00, 1);
        f.nsid = nsid.into();
        assert_eq!(status(&ex(&mut io, 0, &f)), Status::INVALID_NAMESPACE.dnr(), "Flush nsid {nsid:#x}");
    }
    let mut f = sqe(0x00, 1);
    f.nsid = 1.into();
    assert!(matches!(ex(&mut io, 0, &f), Outcome::Io(req) if matches!(req.op, BlockOp::Flush)));
    // Write Uncorrectable, Verify, Reservation Register, Copy; Identify and
    // Keep Alive are admin commands.
    for opcode in [0x04, 0x0c, 0x0d, 0x19, 0x06, 0x18] {
        let mut s = read_sqe(2, 1, 0, 1, 512);
        s.opcode = opcode;
        s.dptr = Sgl::default();
        assert_eq!(status(&ex(&mut io, 0, &s)), Status::INVALID_OPCODE.dnr(), "opcode {opcode:#04x}");
    }
    // Flush, Write, Compare: Delete and Create I/O queues on the admin queue.
    for opcode in [0x00, 0x01, 0x05] {
        let mut s = read_sqe(3, 1, 0, 1, 512);
        s.opcode = opcode;
        s.dptr = Sgl::default();
        assert_eq!(status(&ex(&mut a, 0, &s)), Status::INVALID_OPCODE.dnr(), "opcode {opcode:#04x} on admin");
    }
    let mut r = read_sqe(4, 1, 8, 2, 512);
    r.cdw12 = (1 | (1 << 31) | (0xf << 26)).into(); // LR, PRINFO
    r.cdw13 = 0x07.into(); // DSM: frequent writes
    match ex(&mut io, 0, &r) {
        Outcome::Io(req) => assert!(matches!(req.op, BlockOp::Read { lba: 8, len_bytes: 1024 })),
        other => panic!("{other:?}"),
    }
    let mut wz = sqe(0x08, 5);
    wz.nsid = 1.into();
    wz.cdw10 = 16.into();
    wz.cdw12 = (7 | (1 << 25)).into();
    match ex(&mut io, 0, &wz) {
        Outcome::Io(req) => {
            assert!(matches!(req.op, BlockOp::WriteZeroes { lba: 16, blocks: 8, deallocate: true, fua: false }))
        }
        other => panic!("{other:?}"),
    }
    let (d, data) = dsm_sqe(6, &[(0, 0), (8, 8), (5000, 0)]);
    match run(&mut io, &d, Some(data)) {
        Outcome::Io(req) => match req.op {
            BlockOp::Deallocate { ranges, .. } => assert_eq!(ranges, vec![(8, 8)]),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
    // Integral read/write hints only: nothing to do, but the ranges are
    // received.
    let (mut hint, data) = dsm_sqe(7, &[(5000, 8)]);
    hint.cdw11 = 0x3.into();
    assert_eq!(status(&run(&mut io, &hint, Some(data))), Status::SUCCESS);
}

/// NVMe Base 2.0 5.27.1, Asynchronous Event Configuration: a host may
/// enable only the events the controller can report. An I/O controller
/// sends namespace attribute and ANA change notices (Identify OAES bits 8
/// and 11) and takes the SMART / Health critical warning bits 4:0 (it
/// never raises one); a discovery controller only the discovery log page
/// change notice (bit 31). Any other bit is Invalid Field and changes
/// nothing, as on nvmet (its NVMET_AEN_CFG_ALL and
/// NVMET_DISC_AEN_CFG_OPTIONAL masks): Get Features never reports an
/// event enabled that will never come.
#[test]
fn async_event_configuration_enables_only_events_the_controller_reports() {
    let t = target();
    let (mut a, _) = admin(&t);
    let oaes = u32_at(&identify(&mut a, 1, 0).1, 92);
    assert_eq!(oaes, (1 << 8) | (1 << 11), "OAES: namespace attribute and ANA change notices");
    assert_eq!(set_feature(&mut a, 0x0b, oaes | 0x1f).0, Status::SUCCESS);
    assert_eq!(get_feature(&mut a, 0x0b), (Status::SUCCESS, oaes | 0x1f));
    for (bits, what) in [
        (0xff, "critical warning bits 7:5"),
        (1 << 9, "firmware activation notices"),
        (1 << 10, "telemetry log notices"),
        (1 << 31, "discovery log page change notices"),
        (1 << 16, "a reserved bit"),
    ] {
        assert_eq!(set_feature(&mut a, 0x0b, bits).0, Status::INVALID_FIELD.dnr(), "{what}");
    }
    assert_eq!(get_feature(&mut a, 0x0b).1, oaes | 0x1f, "a refused Set changes nothing");
    let mut d = discovery_admin(&t, HOST);
    let oaes = u32_at(&identify(&mut d, 1, 0).1, 92);
    assert_eq!(oaes, 1 << 31, "OAES: discovery log page change notices");
    assert_eq!(set_feature(&mut d, 0x0b, oaes).0, Status::SUCCESS);
    for bits in [1 << 8, 1 << 11, 0x1f] {
        assert_eq!(set_feature(&mut d, 0x0b, bits | oaes).0, Status::INVALID_FIELD.dnr(), "{bits:#x}");
    }
    assert_eq!(get_feature(&mut d, 0x0b), (Status::SUCCESS, oaes));
}

/// Property Get and Property Set (NVMe-oF 1.1; NVMe Base 2.0 figure 36
/// gives each property's size): ATTRIB bits 2:0 are the size, 000b 4
/// bytes and 001b 8 bytes, the other values reserved, and a property is
/// read and written at its own size. A reserved size is Invalid Field, as
/// SPDK answers, not a 4-byte access: a Property Set of CC with size 010b
/// used to reset the controller.
#[test]
fn property_get_and_set_with_a_reserved_size_or_the_wrong_size_are_invalid_field() {
    let t = target();
    let (mut a, _) = admin(&t);
    let prop = |q: &mut Queue, fctype: u8, attrib: u32, offset: u32, value: u32| {
        let mut s = fabrics(fctype, 3);
        s.cdw10 = attrib.into();
        s.cdw11 = offset.into();
        s.cdw12 = value.into();
        status(&run(q, &s, None))
    };
    for attrib in 2..=7 {
        assert_eq!(prop(&mut a, 0x00, attrib, 0x14, 0), Status::INVALID_FIELD.dnr(), "Set CC, size {attrib:03b}");
        assert_eq!(prop(&mut a, 0x04, attrib, 0x14, 0), Status::INVALID_FIELD.dnr(), "Get CC, size {attrib:03b}");
        assert_eq!(prop(&mut a, 0x04, attrib, 0x00, 0), Status::INVALID_FIELD.dnr(), "Get CAP, size {attrib:03b}");
    }
    assert_eq!(prop_get(&mut a, 0x1c, false).1 & 1, 1, "CSTS.RDY: no reset happened");
    assert_eq!(prop(&mut a, 0x00, 1, 0x14, 0), Status::INVALID_FIELD.dnr(), "Set CC (4 bytes) with size 8");
    assert_eq!(prop(&mut a, 0x00, 0, 0x00, 0), Status::INVALID_FIELD.dnr(), "Set CAP (read-only)");
    assert_eq!(prop(&mut a, 0x00, 1, 0x00, 0), Status::INVALID_FIELD.dnr(), "Set CAP (read-only), size 8");
    assert_eq!(prop(&mut a, 0x04, 0, 0x00, 0), Status::INVALID_FIELD.dnr(), "Get CAP (8 bytes) with size 4");
    assert_eq!(prop(&mut a, 0x04, 1, 0x08, 0), Status::INVALID_FIELD.dnr(), "Get VS (4 bytes) with size 8");
    assert_eq!(prop_get(&mut a, 0x1c, false), (Status::SUCCESS, 1));
}

/// Over fabrics the data pointer is an SGL and every command, Fabrics
/// commands included, carries PSDT (CDW0 bits 15:14) 01b (NVMe Base 2.0
/// 4.2; what Linux and SPDK hosts send).
/// nvmet refuses any other value with Invalid Field before it looks at
/// the command (nvmet_req_init); so does this controller, on every queue.
#[test]
fn a_command_whose_psdt_is_not_01b_is_invalid_field() {
    let t = target();
    for psdt in [0x00, 0x80, 0xc0] {
        let mut q = Queue::new(t.clone(), TCP, addr(), addr());
        let mut c = connect_sqe(0, 31, 5000);
        c.flags = psdt;
        let data = ConnectData::new([1; 16], 0xffff, SUB, HOST).as_bytes().to_vec();
        assert_eq!(status(&run(&mut q, &c, Some(data))), Status::INVALID_FIELD.dnr(), "Connect, PSDT {psdt:#04x}");
        assert!(matches!(q.kind(), QueueKind::Unconnected));
    }
    let (mut a, cntlid) = admin(&t);
    let mut io = io_queue(&t, cntlid, 1);
    for psdt in [0x00, 0x80, 0xc0] {
        let mut id = sqe(0x06, 4);
        id.cdw10 = 1.into();
        id.dptr = Sgl::transport(4096);
        id.flags = psdt;
        assert_eq!(status(&run(&mut a, &id, None)), Status::INVALID_FIELD.dnr(), "Identify, PSDT {psdt:#04x}");
        let mut get = fabrics(0x04, 5);
        get.cdw11 = 0x1c.into();
        get.flags = psdt;
        assert_eq!(status(&run(&mut a, &get, None)), Status::INVALID_FIELD.dnr(), "Property Get, PSDT {psdt:#04x}");
        let mut r = read_sqe(6, 1, 0, 1, 512);
        r.flags = psdt;
        assert_eq!(status(&ex(&mut io, 0, &r)), Status::INVALID_FIELD.dnr(), "Read, PSDT {psdt:#04x}");
    }
    assert!(matches!(ex(&mut io, 0, &read_sqe(7, 1, 0, 1, 512)), Outcome::Io(_)), "PSDT 01b");
}

/// A Controller Level Reset (CC.EN from 1 to 0; NVMe Base 2.0 3.7.2)
/// returns every feature this controller has to its default, none being
/// saveable (5.27: a current value that is not saved does not outlive a
/// reset): what Get Features SEL 001b reports, KATO the one Connect gave.
#[test]
fn a_controller_reset_returns_features_to_their_defaults() {
    let t = target();
    t.subsystem(SUB).expect("sub").add_namespace(Namespace::new(SUB, 2, cached("f2"))).expect("add");
    let (mut a, _) = admin(&t);
    let changed = [
        (0x01, 0x0302_0103, "arbitration"),
        (0x04, 300, "over temperature threshold"),
        (0x04, (1 << 20) | 273, "under temperature threshold"),
        (0x05, 1, "error recovery"),
        (0x06, 0, "volatile write cache"),
        (0x0a, 1, "write atomicity normal"),
        (0x0b, 1 << 8, "asynchronous event configuration"),
        (0x0f, 2000, "keep alive timer"),
    ];
    for (fid, value, what) in changed {
        assert_eq!(set_feature(&mut a, fid, value).0, Status::SUCCESS, "{what}");
    }
    let ctrl = a.controller().expect("connected").clone();
    assert!(ctrl.write_through());
    assert_eq!(prop_set_cc(&mut a, 0x0046_0000), Status::SUCCESS);
    assert_eq!(prop_set_cc(&mut a, 0x0046_0001), Status::SUCCESS);
    let get = |q: &mut Queue, fid: u8, cdw11: u32| {
        let mut s = sqe(0x0a, 8);
        s.cdw10 = u32::from(fid).into();
        s.cdw11 = cdw11.into();
        let (cqe, _) = cqe_of(run(q, &s, None));
        (cqe.status(), cqe.dw0.get())
    };
    for (fid, cdw11, default, what) in [
        (0x01, 0, 0, "arbitration"),
        (0x04, 0, 0x0157, "over temperature threshold: WCTEMP"),
        (0x04, 1 << 20, 0, "under temperature threshold: none"),
        (0x05, 0, 0, "error recovery"),
        (0x06, 0, 1, "volatile write cache: enabled"),
        (0x0a, 0, 0, "write atomicity normal"),
        (0x0b, 0, 0, "asynchronous event configuration: none"),
        (0x0f, 0, 5000, "keep alive timer: Connect's KATO"),
    ] {
        assert_eq!(get(&mut a, fid, cdw11), (Status::SUCCESS, default), "{what} after the reset");
    }
    assert!(!ctrl.write_through(), "writes are cached again");
    assert_eq!(ctrl.kato_ms(), 5000);
}

/// A Controller Level Reset deletes the controller's I/O queues (NVMe
/// Base 2.0 3.7.2; over fabrics their connections go, as SPDK's target
/// disconnects them): their commands are aborted as on a deleted queue and
/// their connections close, and the host creates them again, with the
/// same queue IDs, once the controller is enabled, after Set Features
/// Number of Queues if it likes. The old queue closing later frees
/// nothing of the new one's.
#[test]
fn a_controller_reset_deletes_its_io_queues() {
    let t = target();
    let (mut a, cntlid) = admin(&t);
    let mut old = io_queue(&t, cntlid, 1);
    assert_eq!(prop_set_cc(&mut a, 0x0046_0000), Status::SUCCESS);
    assert_eq!(prop_set_cc(&mut a, 0x0046_0001), Status::SUCCESS);
    assert!(old.expired(0), "the deleted queue's connection closes");
    assert_eq!(status(&ex(&mut old, 0, &read_sqe(1, 1, 0, 1, 512))), Status::ABORTED_SQ_DELETION);
    assert_eq!(set_feature(&mut a, 0x07, 0x0001_0001), (Status::SUCCESS, 0x0001_0001));
    let mut new = io_queue(&t, cntlid, 1);
    old.close();
    assert!(!new.expired(0));
    assert!(a.has_io_queues(), "queue 1 is the new one's");
    let mut again = Queue::new(t.clone(), TCP, addr(), addr());
    assert_eq!(status(&connect(&mut again, 1, cntlid, SUB, HOST)), Status::CONNECT_INVALID_PARAMETERS.dnr());
    assert!(matches!(ex(&mut new, 0, &read_sqe(2, 1, 0, 1, 512)), Outcome::Io(_)));
}
