//! Hostile NVMe/TCP input against the real daemon on loopback: each class of
//! malformed PDU ends its own connection with a C2HTermReq naming the field,
//! leaves a log line, and does not disturb other connections.

mod common;

use common::Daemon;
use nvme_spec::fabrics::ConnectData;
use nvme_spec::{Sgl, Sqe, Status};
use nvmf_tcp::host::{Completion, HostConfig, HostConnection};
use nvmf_tcp::Fes;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2026-11.io.ironwire:bad-input";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:bad-input-host";

impl Daemon {
    /// Starts the daemon with one RAM namespace on a free port.
    fn start(tag: &str) -> Daemon {
        Daemon::start_with(&format!("bad-{tag}"), |_, port| {
            format!(
                "[[device]]\nname = \"r\"\nkind = \"ram\"\nsize = \"16MiB\"\n\n[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n[[subsystem.namespace]]\ndevice = \"r\"\n\n[[port]]\naddress = \"127.0.0.1:{port}\"\n\n[reactor]\ncores = [0]\n"
            )
        })
    }
}

/// A blocking NVMe/TCP host connection for tests.
struct Client {
    sock: TcpStream,
    conn: HostConnection,
}

enum Reply {
    Done(Completion),
    Terminated(nvmf_tcp::Fatal),
    Closed,
}

impl Client {
    fn connect(addr: SocketAddr, hdgst: bool) -> Client {
        Client::connect_with(addr, HostConfig { header_digest: hdgst, data_digest: false, max_in_capsule: 8192 })
    }

    fn connect_with(addr: SocketAddr, cfg: HostConfig) -> Client {
        let sock = TcpStream::connect(addr).expect("connect");
        sock.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
        let mut c = Client { sock, conn: HostConnection::new(cfg) };
        c.flush();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !c.conn.is_ready() {
            assert!(Instant::now() < deadline, "no ICResp");
            c.pump().expect("ICResp");
        }
        c
    }

    fn flush(&mut self) {
        let mut out = Vec::new();
        self.conn.take_transmit(&mut out);
        if !out.is_empty() {
            let _ = self.sock.write_all(&out);
        }
    }

    /// Reads what arrived; returns false when the peer closed.
    fn pump(&mut self) -> Result<bool, nvmf_tcp::Fatal> {
        let mut buf = [0u8; 65536];
        match self.sock.read(&mut buf) {
            Ok(0) => Ok(false),
            Ok(n) => {
                self.conn.handle_input(&buf[..n])?;
                self.flush();
                Ok(true)
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => Ok(true),
            Err(_) => Ok(false),
        }
    }

    fn wait(&mut self) -> Reply {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(c) = self.conn.poll_completion() {
                return Reply::Done(c);
            }
            assert!(Instant::now() < deadline, "no reply within 5 s");
            match self.pump() {
                Ok(true) => {}
                Ok(false) => return Reply::Closed,
                Err(e) => return Reply::Terminated(e),
            }
        }
    }

    fn execute(&mut self, sqe: Sqe, write: Vec<u8>, read_len: u32) -> Completion {
        self.conn.submit(sqe, write, read_len);
        self.flush();
        match self.wait() {
            Reply::Done(c) => c,
            Reply::Terminated(e) => panic!("terminated: {e}"),
            Reply::Closed => panic!("closed"),
        }
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        self.sock.write_all(bytes).expect("send");
    }

    /// Reads raw PDUs until one of `pdu_type` arrives and returns it whole.
    fn expect_raw(&mut self, pdu_type: u8) -> Vec<u8> {
        let mut buf = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            while buf.len() >= 8 {
                let plen = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize;
                if buf.len() < plen {
                    break;
                }
                let pdu: Vec<u8> = buf.drain(..plen).collect();
                if pdu[0] == pdu_type {
                    return pdu;
                }
            }
            assert!(Instant::now() < deadline, "no PDU of type {pdu_type:#x}");
            let mut chunk = [0u8; 65536];
            match self.sock.read(&mut chunk) {
                Ok(0) => panic!("closed before a PDU of type {pdu_type:#x}"),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(_) => {}
            }
        }
    }

    fn expect_term(&mut self) -> nvmf_tcp::Fatal {
        match self.wait() {
            Reply::Terminated(e) => e,
            Reply::Done(c) => panic!("expected C2HTermReq, got completion {:?}", c.cqe),
            Reply::Closed => panic!("closed without C2HTermReq"),
        }
    }
}

/// A Fabrics command as every host sends it: PSDT 01b (an SGL).
fn fabrics(fctype: u8, cid: u16) -> Sqe {
    let mut s = Sqe { opcode: 0x7f, flags: Sqe::PSDT_SGL, ..Default::default() };
    s.cid = cid.into();
    s.nsid = u32::from(fctype).into();
    s
}

fn connect_sqe(qid: u16) -> Sqe {
    let mut s = fabrics(0x01, 1);
    s.cdw10 = (u32::from(qid) << 16).into();
    s.cdw11 = 31.into();
    s.cdw12 = 30_000.into();
    s
}

fn connect_data(cntlid: u16) -> Vec<u8> {
    use zerocopy::IntoBytes;
    ConnectData::new([3; 16], cntlid, NQN, HOST).as_bytes().to_vec()
}

/// An admin queue with CC.EN set; returns the client and controller ID.
fn admin(addr: SocketAddr) -> (Client, u16) {
    let mut c = Client::connect(addr, false);
    let done = c.execute(connect_sqe(0), connect_data(0xffff), 0);
    assert!(done.cqe.status().is_success(), "{:?}", done.cqe);
    let cntlid = done.cqe.dw0.get() as u16;
    let mut set = fabrics(0x00, 2);
    set.cdw11 = 0x14.into();
    set.cdw12 = 0x0046_0001.into();
    assert!(c.execute(set, Vec::new(), 0).cqe.status().is_success());
    (c, cntlid)
}

fn io_queue(addr: SocketAddr, cntlid: u16, qid: u16) -> Client {
    let mut c = Client::connect(addr, false);
    let done = c.execute(connect_sqe(qid), connect_data(cntlid), 0);
    assert!(done.cqe.status().is_success(), "{:?}", done.cqe);
    c
}

fn property_get_works(c: &mut Client) -> bool {
    let mut get = fabrics(0x04, 9);
    get.cdw11 = 0x1c.into();
    c.execute(get, Vec::new(), 0).cqe.status().is_success()
}

fn read_sqe(cid: u16, lba: u32, blocks: u32) -> Sqe {
    let mut s = Sqe { opcode: 0x02, flags: Sqe::PSDT_SGL, ..Default::default() };
    s.cid = cid.into();
    s.nsid = 1.into();
    s.cdw10 = lba.into();
    s.cdw12 = (blocks - 1).into();
    s
}

/// Runs `attack` on a fresh connection and checks the answer, the log line
/// and that a bystander connection still works.
fn check_class(
    tag: &str,
    log_needle: &str,
    want_fes: Fes,
    want_fei: Option<u32>,
    attack: impl FnOnce(&mut Client, SocketAddr),
) {
    let mut d = Daemon::start(tag);
    let (mut bystander, _) = admin(d.addr);
    let mut victim = Client::connect(d.addr, tag == "hdgst");
    attack(&mut victim, d.addr);
    let term = victim.expect_term();
    assert_eq!(term.fes, want_fes, "{tag}: {term}");
    if let Some(fei) = want_fei {
        assert_eq!(term.fei, fei, "{tag}: {term}");
    }
    assert!(property_get_works(&mut bystander), "{tag}: other connection broken");
    assert!(d.alive(), "{tag}: daemon died");
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let log = d.log();
        if log.contains("C2HTermReq") && log.contains(log_needle) {
            break;
        }
        assert!(Instant::now() < deadline, "{tag}: log lacks {log_needle:?}:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pdu(bytes: &mut [u8], f: impl FnOnce(&mut [u8])) -> Vec<u8> {
    f(bytes);
    bytes.to_vec()
}

fn capsule_bytes(sqe: Sqe, data: &[u8]) -> Vec<u8> {
    use nvmf_tcp::pdu::{common_header, encode, CapsuleCmd, Framing, PduType};
    use zerocopy::IntoBytes;
    let cmd = CapsuleCmd { ch: common_header(PduType::CAPSULE_CMD, 0), sqe };
    let mut out = Vec::new();
    encode(&mut out, cmd.as_bytes(), data, Framing { hdgst: false, ddgst: false, data_align: 4 });
    out
}

#[test]
fn bad_pdu_type_gets_invalid_header_field() {
    check_class("type", "PDU type", Fes::INVALID_HEADER_FIELD, Some(0), |c, _| {
        let mut b = capsule_bytes(read_sqe(1, 0, 1), &[]);
        c.send_raw(&pdu(&mut b, |b| b[0] = 0x0d));
    });
}

#[test]
fn inconsistent_hlen_gets_invalid_header_field() {
    check_class("hlen", "hlen", Fes::INVALID_HEADER_FIELD, Some(2), |c, _| {
        let mut b = capsule_bytes(read_sqe(1, 0, 1), &[]);
        c.send_raw(&pdu(&mut b, |b| b[2] = 64));
    });
}

#[test]
fn inconsistent_pdo_gets_invalid_header_field() {
    check_class("pdo", "pdo", Fes::INVALID_HEADER_FIELD, Some(3), |c, _| {
        let mut sqe = read_sqe(1, 0, 1);
        sqe.dptr = Sgl::in_capsule(8);
        let mut b = capsule_bytes(sqe, &[0; 8]);
        c.send_raw(&pdu(&mut b, |b| b[3] = 12));
    });
}

#[test]
fn plen_shorter_than_header_gets_invalid_header_field() {
    check_class("plen", "plen", Fes::INVALID_HEADER_FIELD, Some(4), |c, _| {
        let mut b = capsule_bytes(read_sqe(1, 0, 1), &[]);
        c.send_raw(&pdu(&mut b, |b| b[4] = 16));
    });
}

#[test]
fn plen_beyond_limits_gets_data_limit_exceeded() {
    check_class("limit", "limit", Fes::DATA_LIMIT_EXCEEDED, None, |c, _| {
        // Only the header of a 1 GiB capsule: the target must not wait for it.
        let mut b = capsule_bytes(read_sqe(1, 0, 1), &[]);
        let b = pdu(&mut b, |b| {
            b[3] = 72;
            b[4..8].copy_from_slice(&(1u32 << 30).to_le_bytes());
        });
        c.send_raw(&b[..72]);
    });
}

#[test]
fn header_digest_mismatch_gets_header_digest_error() {
    check_class("hdgst", "header digest", Fes::HEADER_DIGEST_ERROR, None, |c, _| {
        use nvmf_tcp::pdu::{common_header, encode, CapsuleCmd, Framing, PduType};
        use zerocopy::IntoBytes;
        let cmd = CapsuleCmd { ch: common_header(PduType::CAPSULE_CMD, 0), sqe: read_sqe(1, 0, 1) };
        let mut out = Vec::new();
        encode(&mut out, cmd.as_bytes(), &[], Framing { hdgst: true, ddgst: false, data_align: 4 });
        out[73] ^= 0xff;
        c.send_raw(&out);
    });
}

fn h2c_bytes(cid: u16, ttag: u16, datao: u32, data: &[u8]) -> Vec<u8> {
    use nvmf_tcp::pdu::{common_header, encode, flags, DataHeader, Framing, PduType};
    use zerocopy::IntoBytes;
    let h = DataHeader {
        ch: common_header(PduType::H2C_DATA, flags::LAST_PDU),
        cccid: cid.into(),
        ttag: ttag.into(),
        datao: datao.into(),
        datal: (data.len() as u32).into(),
        rsvd: [0; 4],
    };
    let mut out = Vec::new();
    encode(&mut out, h.as_bytes(), data, Framing { hdgst: false, ddgst: false, data_align: 4 });
    out
}

#[test]
fn h2c_data_with_unknown_ttag_gets_invalid_header_field() {
    check_class("ttag", "ttag", Fes::INVALID_HEADER_FIELD, Some(10), |c, _| {
        c.send_raw(&h2c_bytes(1, 77, 0, &[0; 512]));
    });
}

#[test]
fn h2c_data_outside_its_r2t_gets_data_out_of_range() {
    let mut d = Daemon::start("r2t");
    let (mut bystander, cntlid) = admin(d.addr);
    let mut io = io_queue(d.addr, cntlid, 1);
    // A 64 KiB write goes by R2T; answer the R2T with too much data.
    let mut w = read_sqe(5, 0, 128);
    w.opcode = 0x01;
    w.dptr = Sgl::transport(65536);
    let mut b = capsule_bytes(w, &[]);
    io.send_raw(&pdu(&mut b, |_| {}));
    let r2t = io.expect_raw(0x09);
    let ttag = u16::from_le_bytes([r2t[10], r2t[11]]);
    io.send_raw(&h2c_bytes(5, ttag, 0, &[1; 69632]));
    let term = io.expect_raw(0x03);
    let (fes, fei) =
        (u16::from_le_bytes([term[8], term[9]]), u32::from_le_bytes([term[10], term[11], term[12], term[13]]));
    // FEI is reserved for this FES; the log names DATAL.
    assert_eq!((Fes(fes), fei), (Fes::DATA_OUT_OF_RANGE, 0));
    assert!(property_get_works(&mut bystander));
    assert!(d.alive());
    assert!(d.log().contains("outside the R2T"), "{}", d.log());
}

/// An H2CTermReq whose PLEN is out of bounds ends its connection at once:
/// no C2HTermReq answers it, none of the bytes it announces is waited for,
/// the log line names the field, and other connections go on.
#[test]
fn a_malformed_h2c_term_req_closes_quietly_with_a_log_line_naming_plen() {
    let mut d = Daemon::start("term");
    let (mut bystander, _) = admin(d.addr);
    let mut victim = Client::connect(d.addr, false);
    let mut term = [0u8; 24];
    term[0] = 0x02; // H2CTermReq
    term[2] = 24; // HLEN
    term[4..8].copy_from_slice(&(1u32 << 30).to_le_bytes());
    term[8] = 0x01; // FES
    victim.send_raw(&term);
    let mut rest = Vec::new();
    let _ = victim.sock.set_read_timeout(Some(Duration::from_secs(5)));
    let closed = victim.sock.read_to_end(&mut rest);
    assert!(closed.is_ok() && rest.is_empty(), "answered or left open: {closed:?} {rest:02x?}");
    assert!(property_get_works(&mut bystander));
    assert!(d.alive());
    let deadline = Instant::now() + Duration::from_secs(2);
    while !d.log().contains("malformed H2CTermReq (plen 1073741824") {
        assert!(Instant::now() < deadline, "log lacks the malformed H2CTermReq:\n{}", d.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn io_before_connect_and_out_of_range_get_statuses_not_termination() {
    let mut d = Daemon::start("status");
    let mut raw = Client::connect(d.addr, false);
    let mut r = read_sqe(1, 0, 1);
    r.dptr = Sgl::transport(512);
    assert_eq!(raw.execute(r, Vec::new(), 512).cqe.status(), Status::COMMAND_SEQUENCE_ERROR.dnr());
    let (_admin, cntlid) = admin(d.addr);
    let mut io = io_queue(d.addr, cntlid, 1);
    // 16 MiB / 512 = 32768 blocks.
    let mut r = read_sqe(2, 32767, 2);
    r.dptr = Sgl::transport(1024);
    assert_eq!(io.execute(r, Vec::new(), 1024).cqe.status(), Status::LBA_OUT_OF_RANGE.dnr());
    // Oversized: 2 MiB is beyond the 1 MiB MDTS.
    let mut r = read_sqe(3, 0, 4096);
    r.dptr = Sgl::transport(2 << 20);
    assert_eq!(io.execute(r, Vec::new(), 2 << 20).cqe.status(), Status::SGL_DATA_LENGTH_INVALID.dnr());
    // The queue still serves I/O.
    let mut r = read_sqe(4, 0, 8);
    r.dptr = Sgl::transport(4096);
    let done = io.execute(r, Vec::new(), 4096);
    assert!(done.cqe.status().is_success());
    assert_eq!(done.data.len(), 4096);
    assert!(d.alive());
    assert!(d.log().contains("before Connect"), "{}", d.log());
}

fn write_sqe(cid: u16, lba: u32, blocks: u32) -> Sqe {
    let mut s = read_sqe(cid, lba, blocks);
    s.opcode = 0x01;
    s.dptr = Sgl::transport(blocks * 512);
    s
}

#[test]
fn a_command_beyond_the_queue_size_gets_pdu_sequence_error() {
    check_class("sqsize", "beyond the queue", Fes::PDU_SEQUENCE_ERROR, None, |victim, addr| {
        let (_admin, cntlid) = admin(addr);
        let done = victim.execute(connect_sqe(1), connect_data(cntlid), 0);
        assert!(done.cqe.status().is_success(), "{:?}", done.cqe);
        // SQSIZE 31: 32 writes waiting for their data fill the queue; the
        // 33rd does not fit.
        let mut burst = Vec::new();
        for cid in 0..33 {
            burst.extend(capsule_bytes(write_sqe(100 + cid, cid.into(), 128), &[]));
        }
        victim.send_raw(&burst);
    });
}

#[test]
fn a_host_that_never_reads_costs_bounded_memory_and_stalls_nobody() {
    let mut d = Daemon::start_with("bad-never-reads", |_, port| {
        format!(
            "[[device]]\nname = \"n\"\nkind = \"null\"\nsize = \"1GiB\"\n\n[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n[[subsystem.namespace]]\ndevice = \"n\"\n\n[[port]]\naddress = \"127.0.0.1:{port}\"\n\n[reactor]\ncores = [0]\n"
        )
    });
    let (mut bystander, cntlid) = admin(d.addr);
    // The largest queue the daemon allows (1,024 entries), so that what
    // bounds the daemon below is not the queue's size.
    let mut greedy = Client::connect(d.addr, false);
    let mut big = connect_sqe(1);
    big.cdw11 = 1023.into();
    let done = greedy.execute(big, connect_data(cntlid), 0);
    assert!(done.cqe.status().is_success(), "{:?}", done.cqe);
    let before = d.rss_kib();
    // 3,200 reads of 128 KiB (400 MiB of replies) from a host that never
    // reads its socket, sent 64 at a time (well inside its queue) so that
    // each burst is answered before the next arrives. Our own sends may block
    // once the daemon stops reading: they give up after a second.
    greedy.sock.set_write_timeout(Some(Duration::from_secs(1))).expect("timeout");
    for burst in 0..50u32 {
        let mut bytes = Vec::new();
        for i in burst * 64..burst * 64 + 64 {
            let mut s = read_sqe((i % 1024) as u16, i * 256, 256);
            s.dptr = Sgl::transport(128 * 1024);
            bytes.extend(capsule_bytes(s, &[]));
        }
        if greedy.sock.write_all(&bytes).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(500));
    let grown = d.rss_kib().saturating_sub(before);
    assert!(grown < 64 * 1024, "daemon grew by {grown} KiB for a host that does not read");
    // Other connections on the same reactor are still served.
    assert!(property_get_works(&mut bystander));
    let mut other = io_queue(d.addr, cntlid, 2);
    let done = other.execute(read_sqe(7, 0, 8), Vec::new(), 4096);
    assert!(done.cqe.status().is_success(), "{:?}", done.cqe);
    d.assert_alive();
    drop(greedy);
}

/// NVMe Base 2.0 section 3.4.2: when either command of a fused operation
/// fails, the other is aborted with Failed Fused Command. A fused Write
/// whose in-capsule data fails its digest never reaches the controller; its
/// Compare, waiting for it, must end with it, not wait for whatever command
/// the host sends next (a host waiting for the pair sends none).
#[test]
fn a_fused_write_whose_capsule_fails_its_data_digest_ends_its_compare() {
    let d = Daemon::start("fused-ddgst");
    let (_admin, cntlid) = admin(d.addr);
    let mut io =
        Client::connect_with(d.addr, HostConfig { header_digest: false, data_digest: true, max_in_capsule: 8192 });
    let done = io.execute(connect_sqe(1), connect_data(cntlid), 0);
    assert!(done.cqe.status().is_success(), "{:?}", done.cqe);
    let mut compare = write_sqe(10, 3, 1);
    compare.opcode = 0x05;
    compare.flags |= 0b01;
    let mut write = write_sqe(11, 3, 1);
    write.flags |= 0b10;
    io.conn.submit(compare, vec![0; 512], 0);
    io.flush();
    io.conn.submit(write, vec![7; 512], 0);
    let mut bytes = Vec::new();
    io.conn.take_transmit(&mut bytes);
    let last = bytes.len() - 1;
    bytes[last] ^= 1; // the Write capsule's data digest
    io.send_raw(&bytes);
    let mut statuses = Vec::new();
    for _ in 0..2 {
        match io.wait() {
            Reply::Done(c) => statuses.push((c.cqe.cid.get(), c.cqe.status())),
            Reply::Terminated(e) => panic!("terminated: {e}"),
            Reply::Closed => panic!("closed"),
        }
    }
    statuses.sort_by_key(|&(cid, _)| cid);
    assert_eq!(statuses, [(10, Status::ABORTED_FAILED_FUSED), (11, Status::TRANSIENT_TRANSPORT_ERROR)]);
}
