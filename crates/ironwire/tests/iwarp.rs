//! NVMe/RDMA over iWARP against the real daemon on loopback, with the
//! sans-IO `iwarp` connection as the host's RNIC: the MPA handshake with the
//! NVMe/RDMA CM private data, a Fabrics Connect whose data the target
//! fetches by RDMA Read, the completion as a Send with Invalidate; and
//! hostile FPDUs answered with a Terminate while other connections go on.

mod common;

use common::Daemon;
use iwarp::error::ErrorCode;
use iwarp::{Access, Config, Connection, Event, Received};
use nvme_spec::fabrics::ConnectData;
use nvme_spec::{Cqe, Sqe};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use zerocopy::{FromBytes, IntoBytes};

const NQN: &str = "nqn.2026-11.io.ironwire:iwarp";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:iwarp-host";

fn start(tag: &str) -> Daemon {
    Daemon::start_with(&format!("iwarp-{tag}"), |_, port| {
        format!(
            "[[device]]\nname = \"r\"\nkind = \"ram\"\nsize = \"16MiB\"\n\n[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n[[subsystem.namespace]]\ndevice = \"r\"\n\n[[port]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{port}\"\n\n[[port]]\ntransport = \"rdma\"\naddress = \"127.0.0.1:{port}\"\n\n[reactor]\ncores = [0]\n"
        )
    })
}

/// A keyed SGL data block descriptor: `len` bytes at `addr` under `stag`,
/// with Invalidate asked for or not.
fn keyed_sgl(addr: u64, len: u32, stag: u32, invalidate: bool) -> nvme_spec::Sgl {
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&addr.to_le_bytes());
    d[8..11].copy_from_slice(&len.to_le_bytes()[..3]);
    d[11..15].copy_from_slice(&stag.to_le_bytes());
    d[15] = if invalidate { 0x4f } else { 0x40 }; // keyed data block
    nvme_spec::Sgl::read_from_bytes(&d).expect("sgl")
}

/// A blocking host queue: a socket and the host's iWARP connection.
struct Host {
    sock: TcpStream,
    conn: Connection<Vec<u8>>,
    /// Every byte received from the target.
    received: Vec<u8>,
}

/// A TCP connection to `addr` whose maximum segment size is set to `mss`
/// before it connects, so that both ends' segments carry at most `mss`
/// bytes.
fn connect_with_mss(addr: SocketAddr, mss: u32) -> TcpStream {
    use std::os::fd::{FromRawFd, OwnedFd};
    let SocketAddr::V4(v4) = addr else { panic!("IPv4 only") };
    // SAFETY: socket() returns a new descriptor or -1; OwnedFd takes it.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    // SAFETY: fd is ours and open.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let v = mss as libc::c_int;
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*v4.ip()).to_be() },
        sin_zero: [0; 8],
    };
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscalls on our descriptor with pointers to locals of
    // the sizes passed.
    unsafe {
        let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        let rc = libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_MAXSEG,
            (&v as *const libc::c_int).cast(),
            len,
        );
        assert_eq!(rc, 0, "TCP_MAXSEG: {}", std::io::Error::last_os_error());
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let rc = libc::connect(fd.as_raw_fd(), (&sin as *const libc::sockaddr_in).cast(), len);
        assert_eq!(rc, 0, "connect: {}", std::io::Error::last_os_error());
    }
    TcpStream::from(fd)
}

impl Host {
    /// Opens queue `qid` (32 entries) and waits for the MPA reply.
    fn connect(addr: SocketAddr, crc: bool, qid: u16) -> Host {
        Host::on(TcpStream::connect(addr).expect("connect"), crc, qid)
    }

    /// As [`connect`](Self::connect), over `sock`.
    fn on(sock: TcpStream, crc: bool, qid: u16) -> Host {
        sock.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
        let mut cm = [0u8; 32];
        cm[2..4].copy_from_slice(&qid.to_le_bytes());
        cm[4..6].copy_from_slice(&32u16.to_le_bytes()); // hrqsize
        cm[6..8].copy_from_slice(&31u16.to_le_bytes()); // hsqsize
        let cfg =
            Config { crc, ird: 128, ord: 0, require_reads: false, max_segment: 1424, recv_head: 16, recv_max: 16 };
        let mut h = Host { sock, conn: Connection::initiator(cfg, &cm), received: Vec::new() };
        h.flush();
        match h.next_event() {
            Some(Event::Established { private_data }) => {
                assert_eq!(&private_data[2..4], &32u16.to_le_bytes(), "CRQSIZE = HSQSIZE + 1");
            }
            other => panic!("expected the MPA reply, got {other:?}"),
        }
        h.conn.post_receives(32);
        h
    }

    fn flush(&mut self) {
        let mut out = Vec::new();
        self.conn.take_transmit(&mut out);
        if !out.is_empty() {
            let _ = self.sock.write_all(&out);
        }
    }

    /// The next event, reading the socket (and answering the target's RDMA
    /// Reads) until one comes; `None` when the target closed.
    fn next_event(&mut self) -> Option<Event<Vec<u8>>> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(e) = self.conn.poll_event() {
                return Some(e);
            }
            assert!(Instant::now() < deadline, "no event from the target");
            let mut buf = [0u8; 65536];
            match self.sock.read(&mut buf) {
                Ok(0) => return None,
                Ok(n) => {
                    self.received.extend_from_slice(&buf[..n]);
                    let _ = self.conn.handle_input(&buf[..n]);
                    self.flush();
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => return None,
            }
        }
    }

    fn completion(&mut self) -> (Cqe, Received<Vec<u8>>) {
        match self.next_event() {
            Some(Event::Send(m)) => {
                let cqe = Cqe::read_from_bytes(m.head()).expect("a 16-byte CQE");
                (cqe, m)
            }
            other => panic!("expected a completion, got {other:?}"),
        }
    }

    /// Fabrics Connect for queue `qid`, its data in a registered buffer the
    /// target reads (the Linux host's admin queue way).
    fn fabrics_connect(&mut self, qid: u16, cntlid: u16) -> (Cqe, Received<Vec<u8>>, u32) {
        let data = ConnectData::new([7; 16], cntlid, NQN, HOST).as_bytes().to_vec();
        let addr = 0xffff_8880_0000_0000u64;
        let stag = self.conn.register(data, addr, Access::RemoteRead);
        let mut sqe = Sqe { opcode: 0x7f, flags: 0x40, ..Default::default() };
        sqe.cid = 7.into();
        sqe.nsid = 1.into(); // fctype Connect
        sqe.cdw10 = (u32::from(qid) << 16).into();
        sqe.cdw11 = 31.into();
        sqe.cdw12 = 30_000.into();
        sqe.dptr = keyed_sgl(addr, 1024, stag, true);
        self.conn.send(sqe.as_bytes(), &[], None);
        self.flush();
        let (cqe, m) = self.completion();
        (cqe, m, stag)
    }
}

#[test]
fn connect_data_is_fetched_by_rdma_read_and_completed_with_invalidate() {
    let mut d = start("connect");
    for crc in [false, true] {
        let mut h = Host::connect(d.addr, crc, 0);
        assert!(h.conn.crc(), "the port asks for CRC, so it is on either way");
        let (cqe, m, stag) = h.fabrics_connect(0, 0xffff);
        assert!(cqe.status().is_success(), "{cqe:?}");
        assert_eq!(cqe.cid.get(), 7);
        assert_eq!(m.invalidated, Some(stag), "Send with Invalidate of the host's key");
        assert!(h.conn.deregister(stag).is_some());
    }
    d.assert_alive();
    assert!(d.log().contains("created controller"), "{}", d.log());
}

#[test]
fn a_malformed_fpdu_gets_a_terminate_and_other_connections_go_on() {
    let mut d = start("terminate");
    let mut good = Host::connect(d.addr, false, 0);
    let mut bad = Host::connect(d.addr, false, 0);
    // A Send whose MSN skips ahead: 5 where 1 is due.
    let mut fpdu = Vec::new();
    let hdr = [0u8, 0, 0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0];
    iwarp::wire::put_fpdu(&mut fpdu, &hdr, 64, true, |p| p.fill(0));
    bad.sock.write_all(&fpdu).expect("send");
    match bad.next_event() {
        Some(Event::Terminated(code)) => assert_eq!(code, ErrorCode::DDP_UNTAGGED_MSN_RANGE),
        other => panic!("expected a Terminate, got {other:?}"),
    }
    let (cqe, _, _) = good.fabrics_connect(0, 0xffff);
    assert!(cqe.status().is_success(), "the other connection still works: {cqe:?}");
    d.assert_alive();
    let log = d.log();
    assert!(log.contains("fatal iWARP error") && log.contains("MSN 5 (expected 1)"), "{log}");
}

#[test]
fn a_send_beyond_the_queue_size_is_refused() {
    let mut d = start("overrun");
    let mut h = Host::connect(d.addr, false, 0);
    h.conn.post_receives(1000);
    // 200 Keep Alive commands in one burst on a 32-entry admin queue: the
    // target posts one receive per entry and reposts it only when that
    // command completes, so a burst beyond the queue finds no receive.
    let mut burst = Vec::new();
    for cid in 0..200u16 {
        let mut sqe = Sqe { opcode: 0x18, flags: 0x40, ..Default::default() };
        sqe.cid = cid.into();
        let mut one = Vec::new();
        let mut hdr = [0u8; 20];
        hdr[2..4].copy_from_slice(&0x4143u16.to_be_bytes());
        hdr[12..16].copy_from_slice(&(u32::from(cid) + 1).to_be_bytes());
        iwarp::wire::put_fpdu(&mut one, &hdr, 64, h.conn.crc(), |p| p.copy_from_slice(sqe.as_bytes()));
        burst.extend_from_slice(&one);
    }
    h.sock.write_all(&burst).expect("send");
    let mut terminated = None;
    while let Some(e) = h.next_event() {
        if let Event::Terminated(code) = e {
            terminated = Some(code);
            break;
        }
    }
    assert_eq!(terminated, Some(ErrorCode::DDP_UNTAGGED_NO_BUFFER));
    d.assert_alive();
}

/// A command of `opcode` on namespace 1, block `lba`, with FUSE `fuse`
/// and `data` in the capsule (or a zero-length keyed SGL without data).
fn capsule(opcode: u8, fuse: u8, cid: u16, lba: u64, data: &[u8]) -> Sqe {
    let mut sqe = Sqe { opcode, flags: 0x40 | fuse, ..Default::default() };
    sqe.cid = cid.into();
    sqe.nsid = 1.into();
    sqe.cdw10 = (lba as u32).into();
    sqe.cdw11 = ((lba >> 32) as u32).into();
    sqe.dptr = if data.is_empty() {
        let mut d = [0u8; 16];
        d[15] = 0x40; // keyed data block, no data
        nvme_spec::Sgl::read_from_bytes(&d).expect("sgl")
    } else {
        nvme_spec::Sgl::in_capsule(data.len() as u32)
    };
    sqe
}

impl Host {
    /// Sends `cmds` (with their in-capsule data) and returns each one's
    /// completion status, in the order of `cmds`.
    fn run(&mut self, cmds: &[(Sqe, &[u8])]) -> Vec<nvme_spec::Status> {
        for (sqe, data) in cmds {
            self.conn.send(sqe.as_bytes(), data, None);
        }
        self.flush();
        let mut statuses = vec![None; cmds.len()];
        for _ in cmds {
            let (cqe, _) = self.completion();
            let at = cmds.iter().position(|(s, _)| s.cid == cqe.cid).expect("a completion for a command sent");
            statuses[at] = Some(cqe.status());
        }
        statuses.into_iter().map(|s| s.expect("completed")).collect()
    }
}

#[test]
fn fused_compare_and_write_over_rdma_writes_only_on_a_match() {
    use nvme_spec::Status;
    let mut d = start("fused");
    let mut admin = Host::connect(d.addr, false, 0);
    let (cqe, _, _) = admin.fabrics_connect(0, 0xffff);
    assert!(cqe.status().is_success(), "{cqe:?}");
    let cntlid = cqe.dw0.get() as u16;
    let mut cc = capsule(0x7f, 0, 8, 0, &[]);
    cc.nsid = 0.into(); // fctype Property Set
    cc.cdw11 = 0x14.into();
    cc.cdw12 = 0x0046_0001.into();
    assert_eq!(admin.run(&[(cc, &[])]), [Status::SUCCESS], "CC.EN = 1");
    let mut io = Host::connect(d.addr, false, 1);
    let (cqe, _, _) = io.fabrics_connect(1, cntlid);
    assert!(cqe.status().is_success(), "{cqe:?}");
    let (a, c, e) = ([0xa; 512], [0xc; 512], [0xe; 512]);
    assert_eq!(io.run(&[(capsule(0x01, 0, 1, 5, &a), &a)]), [Status::SUCCESS], "write A");
    let pair = |cid, expected, data| {
        [(capsule(0x05, 1, cid, 5, expected), expected), (capsule(0x01, 2, cid + 1, 5, data), data)]
    };
    assert_eq!(io.run(&pair(2, &a, &c)), [Status::SUCCESS, Status::SUCCESS], "matching pair");
    assert_eq!(io.run(&pair(4, &a, &e)), [Status::COMPARE_FAILURE, Status::ABORTED_FAILED_FUSED], "stale pair");
    assert_eq!(io.run(&[(capsule(0x01, 2, 6, 5, &e), &e)]), [Status::ABORTED_MISSING_FUSED], "lone second half");
    assert_eq!(io.run(&[(capsule(0x05, 0, 7, 5, &c), &c)]), [Status::SUCCESS], "the block holds C");
    d.assert_alive();
}

/// The wire length of every FPDU the target sent on `h` (after its MPA
/// reply).
fn fpdu_lens(h: &Host) -> Vec<usize> {
    let b = &h.received;
    let mut at = 20 + usize::from(u16::from_be_bytes([b[18], b[19]]));
    let mut lens = Vec::new();
    while at + 2 <= b.len() {
        let unpadded = 2 + usize::from(u16::from_be_bytes([b[at], b[at + 1]]));
        let len = unpadded + iwarp::wire::pad_len(unpadded) + iwarp::wire::CRC_LEN;
        lens.push(len);
        at += len;
    }
    assert_eq!(at, b.len(), "the stream ends at an FPDU boundary");
    lens
}

#[test]
fn fpdus_fit_the_tcp_segment_size() {
    use nvme_spec::Status;
    let mut d = start("mss");
    let mut h = Host::on(connect_with_mss(d.addr, 1000), true, 0);
    let (cqe, _, _) = h.fabrics_connect(0, 0xffff);
    assert!(cqe.status().is_success(), "{cqe:?}");
    let mut cc = capsule(0x7f, 0, 8, 0, &[]);
    cc.nsid = 0.into(); // fctype Property Set
    cc.cdw11 = 0x14.into();
    cc.cdw12 = 0x0046_0001.into();
    assert_eq!(h.run(&[(cc, &[])]), [Status::SUCCESS], "CC.EN = 1");
    // Identify Controller: 4 KiB RDMA Written into a registered buffer.
    let addr = 0x10_0000u64;
    let stag = h.conn.register(vec![0u8; 4096], addr, Access::RemoteWrite);
    let mut id = Sqe { opcode: 0x06, flags: 0x40, ..Default::default() };
    id.cid = 9.into();
    id.cdw10 = 1.into();
    id.dptr = keyed_sgl(addr, 4096, stag, false);
    assert_eq!(h.run(&[(id, &[])]), [Status::SUCCESS], "Identify");
    let data = h.conn.deregister(stag).expect("registered");
    assert_ne!(&data[..2], &[0, 0], "VID filled in");
    let lens = fpdu_lens(&h);
    let mss = {
        use std::os::fd::AsRawFd;
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt into a local of the size passed.
        let rc = unsafe {
            libc::getsockopt(
                h.sock.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_MAXSEG,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        v as usize
    };
    assert!(mss <= 1000, "MSS {mss}");
    assert!(lens.len() >= 5, "4 KiB of data took at least 5 FPDUs: {lens:?}");
    assert!(lens.iter().all(|&l| l <= mss), "every FPDU fits a {mss}-byte segment: {lens:?}");
    d.assert_alive();
}

/// A second command with the CID of one still running is answered
/// Command ID Conflict and must neither take nor invalidate the first
/// one's key, whatever it is: here its SGL is refused (a keyed block longer
/// than MDTS). Before, such a command went up as a plain one, and its
/// answer took the running command's key and invalidated its STag: the
/// running read then failed (or, had a third command taken the CID, its
/// data would have gone into that command's buffer).
#[test]
fn a_duplicate_cid_with_a_refused_sgl_leaves_the_running_commands_key_alone() {
    use nvme_spec::Status;
    let mut d = Daemon::start_with("iwarp-dup-cid", |_, port| {
        format!(
            "[[device]]\nname = \"r\"\nkind = \"ram\"\nsize = \"16MiB\"\nblock_size = 512\nread_latency_us = 300000\n\n[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n[[subsystem.namespace]]\ndevice = \"r\"\n\n[[port]]\ntransport = \"rdma\"\naddress = \"127.0.0.1:{port}\"\n\n[reactor]\ncores = [0]\n"
        )
    });
    let mut admin = Host::connect(d.addr, false, 0);
    let (cqe, _, _) = admin.fabrics_connect(0, 0xffff);
    assert!(cqe.status().is_success(), "{cqe:?}");
    let cntlid = cqe.dw0.get() as u16;
    let mut cc = capsule(0x7f, 0, 8, 0, &[]);
    cc.nsid = 0.into(); // fctype Property Set
    cc.cdw11 = 0x14.into();
    cc.cdw12 = 0x0046_0001.into();
    assert_eq!(admin.run(&[(cc, &[])]), [Status::SUCCESS], "CC.EN = 1");
    let mut io = Host::connect(d.addr, false, 1);
    let (cqe, _, _) = io.fabrics_connect(1, cntlid);
    assert!(cqe.status().is_success(), "{cqe:?}");
    // A: a 4 KiB read into the host's buffer, its key to be invalidated
    // with A's completion; it runs 300 ms.
    let addr = 0x1000_0000u64;
    let stag = io.conn.register(vec![0u8; 4096], addr, Access::RemoteWrite);
    let mut a = Sqe { opcode: 0x02, flags: 0x40, ..Default::default() };
    a.cid = 9.into();
    a.nsid = 1.into();
    a.cdw12 = 7.into(); // 8 blocks
    a.dptr = keyed_sgl(addr, 4096, stag, true);
    // B: the same CID while A runs, with a keyed SGL past MDTS.
    let mut b = a;
    b.dptr = keyed_sgl(0x2000_0000, 0x00ff_ffff, 0x1234_5600, false);
    io.conn.send(a.as_bytes(), &[], None);
    io.conn.send(b.as_bytes(), &[], None);
    io.flush();
    let (first, m1) = io.completion();
    let (second, m2) = io.completion();
    assert_eq!(first.status(), Status::CID_CONFLICT.dnr(), "B answered first");
    assert_eq!(m1.invalidated, None, "the answer to B invalidated A's STag {stag:#x}");
    assert!(second.status().is_success(), "A failed: {:?}", second.status());
    assert_eq!(m2.invalidated, Some(stag), "A's answer invalidates its own STag");
    d.assert_alive();
}
