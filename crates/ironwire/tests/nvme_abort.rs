//! NVMe Abort against the real daemon on loopback, from a raw NVMe/TCP
//! host whose admin queue and I/O queue live on different reactors (two
//! reactors; the test checks where each queue landed). A write whose R2T
//! the host never answers, and a write held in a device's injected
//! latency, are aborted before they reach the device: the write completes
//! with Command Abort Requested, the Abort says "aborted", the data the
//! host sends afterwards is dropped, the device is unchanged and the queue
//! keeps working. A command that already completed or never existed is
//! "not aborted", and the Abort Command Limit is advertised and enforced.

mod common;

use common::Daemon;
use nvme_spec::fabrics::ConnectData;
use nvme_spec::{Cqe, Sgl, Sqe, Status};
use nvmf_tcp::pdu::{common_header, encode, flags, CapsuleCmd, DataHeader, Framing, PduType};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use zerocopy::{FromBytes, IntoBytes};

const NQN: &str = "nqn.2026-11.io.ironwire:abort";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:abort-host";
const PLAIN: Framing = Framing { hdgst: false, ddgst: false, data_align: 4 };
/// Write latency of namespace 2.
const HOLD_US: u64 = 1_500_000;

/// Namespace 1: RAM. Namespace 2: RAM whose writes wait `HOLD_US`. Two
/// reactors.
fn start(tag: &str) -> Daemon {
    start_with_extra(tag, "")
}

/// As [`start`], with `extra` appended to the configuration.
fn start_with_extra(tag: &str, extra: &str) -> Daemon {
    Daemon::start_with(&format!("nvme-abort-{tag}"), |_, port| {
        format!(
            r#"
[[device]]
name = "r"
kind = "ram"
size = "4MiB"

[[device]]
name = "slow"
kind = "ram"
size = "4MiB"
write_latency_us = {HOLD_US}

[[subsystem]]
nqn = "{NQN}"
allow_any_host = true
[[subsystem.namespace]]
device = "r"
[[subsystem.namespace]]
device = "slow"

[[port]]
address = "127.0.0.1:{port}"

[reactor]
cores = [0, 1]
{extra}"#
        )
    })
}

/// A blocking raw NVMe/TCP host connection: PDUs built and read by hand,
/// so that it can leave an R2T unanswered and send data after the fact.
struct Raw {
    sock: TcpStream,
    rx: Vec<u8>,
}

enum Pdu {
    Resp(Cqe),
    R2t { cid: u16, ttag: u16, len: u32 },
    Data(Vec<u8>),
}

impl Raw {
    fn connect(addr: SocketAddr) -> Raw {
        let sock = TcpStream::connect(addr).expect("connect");
        sock.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
        let mut r = Raw { sock, rx: Vec::new() };
        let mut icreq = [0u8; 128];
        icreq[2] = 128; // HLEN
        icreq[4] = 128; // PLEN
        r.send(&icreq);
        let icresp = r.next_raw();
        assert_eq!(icresp[0], PduType::IC_RESP.0, "ICResp");
        r
    }

    fn send(&mut self, bytes: &[u8]) {
        self.sock.write_all(bytes).expect("send");
    }

    /// The next whole PDU, within 5 s.
    fn next_raw(&mut self) -> Vec<u8> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if self.rx.len() >= 8 {
                let plen = u32::from_le_bytes(self.rx[4..8].try_into().expect("4")) as usize;
                if self.rx.len() >= plen {
                    return self.rx.drain(..plen).collect();
                }
            }
            assert!(Instant::now() < deadline, "no PDU within 5 s");
            let mut chunk = [0u8; 65536];
            match self.sock.read(&mut chunk) {
                Ok(0) => panic!("the daemon closed the connection"),
                Ok(n) => self.rx.extend_from_slice(&chunk[..n]),
                Err(_) => {}
            }
        }
    }

    fn next(&mut self) -> Pdu {
        let p = self.next_raw();
        let u16_at = |at: usize| u16::from_le_bytes([p[at], p[at + 1]]);
        match PduType(p[0]) {
            PduType::CAPSULE_RESP => Pdu::Resp(Cqe::read_from_bytes(&p[8..24]).expect("cqe")),
            PduType::R2T => {
                Pdu::R2t { cid: u16_at(8), ttag: u16_at(10), len: u32::from_le_bytes(p[16..20].try_into().expect("4")) }
            }
            PduType::C2H_DATA => {
                let pdo = usize::from(p[3]);
                Pdu::Data(p[pdo..].to_vec())
            }
            PduType::C2H_TERM_REQ => panic!("C2HTermReq: {p:?}"),
            other => panic!("unexpected PDU type {:#x}", other.0),
        }
    }

    fn completion(&mut self) -> Cqe {
        self.completion_with_data().0
    }

    /// The next completion and the C2HData before it.
    fn completion_with_data(&mut self) -> (Cqe, Vec<u8>) {
        let mut data = Vec::new();
        loop {
            match self.next() {
                Pdu::Resp(cqe) => return (cqe, data),
                Pdu::Data(d) => data.extend_from_slice(&d),
                Pdu::R2t { cid, .. } => panic!("unexpected R2T for cid {cid}"),
            }
        }
    }

    /// Sends a command; in-capsule `data` when there is some, else a
    /// transport SGL of `len` bytes.
    fn submit(&mut self, mut sqe: Sqe, data: &[u8], len: u32) {
        sqe.dptr = if data.is_empty() { Sgl::transport(len) } else { Sgl::in_capsule(data.len() as u32) };
        let cmd = CapsuleCmd { ch: common_header(PduType::CAPSULE_CMD, 0), sqe };
        let mut out = Vec::new();
        encode(&mut out, cmd.as_bytes(), data, PLAIN);
        self.send(&out);
    }

    fn execute(&mut self, sqe: Sqe, data: &[u8], len: u32) -> (Cqe, Vec<u8>) {
        self.submit(sqe, data, len);
        self.completion_with_data()
    }

    fn h2c(&mut self, cid: u16, ttag: u16, data: &[u8]) {
        let hdr = DataHeader {
            ch: common_header(PduType::H2C_DATA, flags::LAST_PDU),
            cccid: cid.into(),
            ttag: ttag.into(),
            datao: 0.into(),
            datal: (data.len() as u32).into(),
            rsvd: [0; 4],
        };
        let mut out = Vec::new();
        encode(&mut out, hdr.as_bytes(), data, PLAIN);
        self.send(&out);
    }
}

/// A command as every host sends it: PSDT 01b (an SGL).
fn sqe(opcode: u8, cid: u16) -> Sqe {
    let mut s = Sqe { opcode, flags: Sqe::PSDT_SGL, ..Default::default() };
    s.cid = cid.into();
    s
}

fn connect_sqe(qid: u16) -> Sqe {
    let mut s = sqe(0x7f, 1);
    s.nsid = 0x01.into(); // fctype Connect
    s.cdw10 = (u32::from(qid) << 16).into();
    s.cdw11 = 31.into();
    s.cdw12 = 30_000.into();
    s
}

/// `opcode` (Read 02h, Write 01h) of `blocks` 512-byte blocks at `lba`.
fn rw(opcode: u8, cid: u16, nsid: u32, lba: u32, blocks: u32) -> Sqe {
    let mut s = sqe(opcode, cid);
    s.nsid = nsid.into();
    s.cdw10 = lba.into();
    s.cdw12 = (blocks - 1).into();
    s
}

fn abort(cid: u16, sqid: u16, victim: u16) -> Sqe {
    let mut s = sqe(0x08, cid);
    s.cdw10 = ((u32::from(victim) << 16) | u32::from(sqid)).into();
    s
}

/// Whether an Abort's completion says the command was aborted (Dword 0
/// bit 0 clear).
fn aborted(cqe: &Cqe) -> bool {
    assert_eq!(cqe.status(), Status::SUCCESS, "Abort failed: {cqe:?}");
    cqe.dw0.get() & 1 == 0
}

struct Host {
    admin: Raw,
    io: Raw,
    qid: u16,
    /// Queues that landed on the admin queue's reactor, kept open.
    _others: Vec<Raw>,
}

/// An enabled controller and an I/O queue on another reactor than its
/// admin queue.
fn host(d: &Daemon) -> Host {
    let mut admin = Raw::connect(d.addr);
    let connect_data = |cntlid: u16| ConnectData::new([7; 16], cntlid, NQN, HOST).as_bytes().to_vec();
    let (cqe, _) = admin.execute(connect_sqe(0), &connect_data(0xffff), 0);
    assert!(cqe.status().is_success(), "admin Connect: {cqe:?}");
    let cntlid = cqe.dw0.get() as u16;
    let mut cc = sqe(0x7f, 2);
    cc.cdw11 = 0x14.into();
    cc.cdw12 = 0x0046_0001.into();
    assert!(admin.execute(cc, &[], 0).0.status().is_success(), "CC.EN");
    let reactor_of = |qid: u64| -> u64 {
        let hosts: serde_json::Value = serde_json::from_str(&d.ctl("hosts --json").expect("ctl hosts")).expect("json");
        let queues = hosts["nvme"][0]["queues"].as_array().expect("queues").clone();
        let q = queues.iter().find(|q| q["qid"].as_u64() == Some(qid)).expect("queue listed");
        q["reactor"].as_u64().expect("reactor")
    };
    let admin_reactor = reactor_of(0);
    let mut others = Vec::new();
    // The kernel spreads connections over the reactors' listeners by
    // their addresses: new connections until one lands elsewhere.
    for qid in 1..=40u16 {
        let mut io = Raw::connect(d.addr);
        let (cqe, _) = io.execute(connect_sqe(qid), &connect_data(cntlid), 0);
        assert!(cqe.status().is_success(), "I/O queue {qid} Connect: {cqe:?}");
        if reactor_of(u64::from(qid)) != admin_reactor {
            return Host { admin, io, qid, _others: others };
        }
        others.push(io);
    }
    panic!("40 I/O queues all landed on the admin queue's reactor");
}

#[test]
fn a_write_whose_r2t_is_unanswered_is_aborted_and_its_late_data_dropped() {
    let mut d = start("r2t");
    let mut h = host(&d);
    // A 4 KiB write: the target asks for its data, which does not come.
    h.io.submit(rw(0x01, 5, 1, 0, 8), &[], 4096);
    let Pdu::R2t { cid: 5, ttag, len: 4096 } = h.io.next() else { panic!("expected an R2T for cid 5") };
    let done = h.admin.execute(abort(100, h.qid, 5), &[], 0).0;
    assert_eq!(done.cid.get(), 100);
    assert!(aborted(&done), "the write waiting for its data is aborted: {done:?}");
    let write = h.io.completion();
    assert_eq!((write.cid.get(), write.status()), (5, Status::ABORT_REQUESTED));
    // The data the host sends anyway is dropped: no error, and the device
    // is unchanged.
    h.io.h2c(5, ttag, &[0xab; 4096]);
    let (cqe, data) = h.io.execute(rw(0x02, 6, 1, 0, 8), &[], 4096);
    assert!(cqe.status().is_success(), "{cqe:?}");
    assert_eq!(data, vec![0u8; 4096], "the aborted write's data reached the device");
    // The queue works on, with the aborted command's CID too.
    let fresh = vec![0x5a; 4096];
    h.io.submit(rw(0x01, 5, 1, 0, 8), &[], 4096);
    let Pdu::R2t { cid: 5, ttag, len: 4096 } = h.io.next() else { panic!("expected an R2T for the reused cid 5") };
    h.io.h2c(5, ttag, &fresh);
    assert!(h.io.completion().status().is_success());
    assert_eq!(h.io.execute(rw(0x02, 7, 1, 0, 8), &[], 4096).1, fresh);
    // A command that completed already, and one that never existed.
    assert!(!aborted(&h.admin.execute(abort(101, h.qid, 5), &[], 0).0), "a completed command");
    assert!(!aborted(&h.admin.execute(abort(102, h.qid, 77), &[], 0).0), "an unknown CID");
    assert!(!aborted(&h.admin.execute(abort(103, 0, 1), &[], 0).0), "an admin command");
    d.assert_alive();
}

#[test]
fn a_write_held_in_a_devices_latency_is_aborted_before_it_reaches_the_device() {
    let mut d = start("latency");
    let mut h = host(&d);
    // Namespace 2 holds every write for HOLD_US before the backend.
    h.io.submit(rw(0x01, 9, 2, 0, 1), &[0xee; 512], 0);
    // A read behind it on the same queue: once it is answered, the write
    // was taken and is waiting out its latency.
    assert!(h.io.execute(rw(0x02, 10, 1, 0, 1), &[], 512).0.status().is_success());
    let done = h.admin.execute(abort(110, h.qid, 9), &[], 0).0;
    assert!(aborted(&done), "the write in its delay is aborted: {done:?}");
    let write = h.io.completion();
    assert_eq!((write.cid.get(), write.status()), (9, Status::ABORT_REQUESTED));
    // A second write starts its delay after the aborted one's: once it
    // completed, the aborted one would have reached the device too.
    h.io.submit(rw(0x01, 11, 2, 8, 1), &[0x11; 512], 0);
    let second = h.io.completion();
    assert_eq!((second.cid.get(), second.status()), (11, Status::SUCCESS));
    assert_eq!(h.io.execute(rw(0x02, 12, 2, 0, 1), &[], 512).1, vec![0u8; 512], "the aborted write was written");
    assert_eq!(h.io.execute(rw(0x02, 13, 2, 8, 1), &[], 512).1, vec![0x11u8; 512]);
    // A command already on the device is past aborting.
    assert!(!aborted(&h.admin.execute(abort(111, h.qid, 11), &[], 0).0));
    d.assert_alive();
}

/// The capsules of 1 MiB reads of namespace `nsid` (512-byte blocks at
/// LBA 0), one per CID of `cids`, back to back for one send: a host that
/// then reads none of the replies fills the socket.
fn reads_of_1_mib(nsid: u32, cids: std::ops::RangeInclusive<u16>) -> Vec<u8> {
    let mut burst = Vec::new();
    for cid in cids {
        let mut s = rw(0x02, cid, nsid, 0, 2048);
        s.dptr = Sgl::transport(1 << 20);
        encode(&mut burst, CapsuleCmd { ch: common_header(PduType::CAPSULE_CMD, 0), sqe: s }.as_bytes(), &[], PLAIN);
    }
    burst
}

#[test]
fn a_command_held_back_while_the_host_does_not_read_is_aborted_before_it_starts() {
    let mut d = start_with_extra("held", "\n[limits]\nsend_high_water = \"64KiB\"\n");
    let mut h = host(&d);
    // 24 reads of 1 MiB, then a write, in one segment. The first read's
    // reply passes the high-water mark, and the host reads none of them,
    // so the write waits behind the reads, parsed but not started.
    let mut burst = reads_of_1_mib(1, 1..=24);
    let mut w = rw(0x01, 25, 1, 4000, 1);
    w.dptr = Sgl::in_capsule(512);
    encode(
        &mut burst,
        CapsuleCmd { ch: common_header(PduType::CAPSULE_CMD, 0), sqe: w }.as_bytes(),
        &[0xcd; 512],
        PLAIN,
    );
    h.io.send(&burst);
    std::thread::sleep(Duration::from_millis(500));
    let done = h.admin.execute(abort(120, h.qid, 25), &[], 0).0;
    assert!(aborted(&done), "the write held behind unread replies is aborted: {done:?}");
    // The host reads again: every read is answered in full, the write
    // with Abort Requested.
    let mut reads = 0;
    for _ in 0..25 {
        let (cqe, data) = h.io.completion_with_data();
        if cqe.cid.get() == 25 {
            assert_eq!(cqe.status(), Status::ABORT_REQUESTED, "{cqe:?}");
        } else {
            assert!(cqe.status().is_success(), "{cqe:?}");
            assert_eq!(data.len(), 1 << 20, "read {} data", cqe.cid.get());
            reads += 1;
        }
    }
    assert_eq!(reads, 24);
    assert_eq!(h.io.execute(rw(0x02, 26, 1, 4000, 1), &[], 512).1, vec![0u8; 512], "the aborted write was written");
    // The queue's accounting survived: a full queue's worth of commands
    // still goes through.
    for cid in 30..60u16 {
        assert!(h.io.execute(rw(0x02, cid, 1, 0, 1), &[], 512).0.status().is_success());
    }
    d.assert_alive();
}

/// The Write of a fused Compare and Write, held back while the host does
/// not read its replies and aborted there, never reaches the controller:
/// its Compare, which does, must end with it (Failed Fused Command, NVMe
/// Base 2.0 section 3.4.2), not wait for a next command that never comes.
#[test]
fn aborting_a_held_back_fused_write_ends_its_compare() {
    let mut d = start_with_extra("held-fused", "\n[limits]\nsend_high_water = \"64KiB\"\n");
    let mut h = host(&d);
    let mut burst = reads_of_1_mib(1, 1..=24);
    for (opcode, fuse, cid) in [(0x05, 0b01, 25u16), (0x01, 0b10, 26)] {
        let mut s = rw(opcode, cid, 1, 4000, 1);
        s.flags |= fuse;
        s.dptr = Sgl::in_capsule(512);
        let cmd = CapsuleCmd { ch: common_header(PduType::CAPSULE_CMD, 0), sqe: s };
        encode(&mut burst, cmd.as_bytes(), &[0; 512], PLAIN);
    }
    h.io.send(&burst);
    std::thread::sleep(Duration::from_millis(500));
    let done = h.admin.execute(abort(130, h.qid, 26), &[], 0).0;
    assert!(aborted(&done), "the fused Write held behind unread replies is aborted: {done:?}");
    let mut ended = Vec::new();
    for _ in 0..26 {
        let (cqe, _) = h.io.completion_with_data();
        if cqe.cid.get() > 24 {
            ended.push((cqe.cid.get(), cqe.status()));
        }
    }
    ended.sort_by_key(|&(cid, _)| cid);
    assert_eq!(ended, [(25, Status::ABORTED_FAILED_FUSED), (26, Status::ABORT_REQUESTED)]);
    assert_eq!(h.io.execute(rw(0x02, 27, 1, 4000, 1), &[], 512).1, vec![0u8; 512], "the aborted write was written");
    d.assert_alive();
}

#[test]
fn a_read_waiting_for_read_budget_is_aborted_before_it_reaches_the_device() {
    // Namespace 3 reads through a task (a millisecond of injected latency),
    // which holds its buffer against a small read budget.
    let extra = "\n[limits]\nread_budget = \"64KiB\"\n\n[[device]]\nname = \"slow-reads\"\nkind = \"ram\"\n\
                 size = \"4MiB\"\nread_latency_us = 1000\n\n[[subsystem.namespace]]\ndevice = \"slow-reads\"\n";
    let mut d = start_with_extra("budget", extra);
    let mut h = host(&d);
    // 30 reads of 1 MiB the host does not read: once the socket is full,
    // the replies being sent keep the budget full and the last reads wait.
    let burst = reads_of_1_mib(3, 1..=30);
    h.io.send(&burst);
    std::thread::sleep(Duration::from_millis(500));
    let done = h.admin.execute(abort(120, h.qid, 30), &[], 0).0;
    assert!(aborted(&done), "the read waiting for budget is aborted: {done:?}");
    let mut reads = 0;
    for _ in 0..30 {
        let (cqe, data) = h.io.completion_with_data();
        if cqe.cid.get() == 30 {
            assert_eq!(cqe.status(), Status::ABORT_REQUESTED, "{cqe:?}");
            assert!(data.is_empty(), "the aborted read sent data");
        } else {
            assert!(cqe.status().is_success(), "{cqe:?}");
            assert_eq!(data.len(), 1 << 20, "read {} data", cqe.cid.get());
            reads += 1;
        }
    }
    assert_eq!(reads, 29);
    let stats = d.ctl("stats").expect("stats");
    let line = stats.lines().find(|l| l.starts_with(&format!("namespace {NQN} 3 "))).expect("namespace 3 counted");
    assert!(line.contains(" reads=29 "), "the aborted read reached the device: {line}");
    d.assert_alive();
}

#[test]
fn aborts_beyond_the_advertised_limit_are_refused() {
    let mut d = start("acl");
    let mut h = host(&d);
    let mut identify = sqe(0x06, 20);
    identify.cdw10 = 1.into(); // CNS Controller
    let (cqe, page) = h.admin.execute(identify, &[], 4096);
    assert!(cqe.status().is_success());
    let limit = usize::from(page[258]) + 1; // ACL, 0-based
    assert_eq!(limit, 4, "ACL");
    // One more Abort than the limit, in one segment: they arrive together,
    // before any is answered.
    let mut burst = Vec::new();
    for i in 0..=limit as u16 {
        let mut sqe = abort(30 + i, h.qid, 200 + i);
        sqe.dptr = Sgl::transport(0);
        let cmd = CapsuleCmd { ch: common_header(PduType::CAPSULE_CMD, 0), sqe };
        encode(&mut burst, cmd.as_bytes(), &[], PLAIN);
    }
    h.admin.send(&burst);
    let mut answers: Vec<Cqe> = (0..=limit).map(|_| h.admin.completion()).collect();
    answers.sort_by_key(|c| c.cid.get());
    let over: Vec<u16> =
        answers.iter().filter(|c| c.status() == Status::ABORT_COMMAND_LIMIT).map(|c| c.cid.get()).collect();
    assert_eq!(over, vec![30 + limit as u16], "only the Abort past the limit is refused: {answers:?}");
    assert!(answers.iter().filter(|c| c.status().is_success()).all(|c| c.dw0.get() & 1 == 1));
    // Answered, they no longer count.
    assert!(!aborted(&h.admin.execute(abort(40, h.qid, 250), &[], 0).0));
    d.assert_alive();
}
