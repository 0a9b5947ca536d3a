//! Peers that hold resources without using them, against the real daemon
//! on loopback: connections that never finish their handshake, more
//! connections than a port or a host may hold, and a flood that runs the
//! process out of descriptors. Each is refused or timed out with a log line
//! naming the limit, and a fresh well-behaved host is still served.

mod common;

use common::{block_on, bounded, Daemon};
use initiator::{Controller, Options};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2026-11.io.ironwire:hostile";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:hostile-host";

/// One RAM namespace on NVMe/TCP + NVMe/RDMA (one address), an iSCSI
/// portal on the next port, one reactor, and `extra` config.
fn config(port: u16, extra: &str) -> String {
    format!(
        "[[device]]\nname = \"r\"\nkind = \"ram\"\nsize = \"16MiB\"\n\n[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n[[subsystem.namespace]]\ndevice = \"r\"\n\n[[iscsi_target]]\niqn = \"iqn.2026-11.io.ironwire:hostile\"\nallow_any_initiator = true\n[[iscsi_target.lun]]\ndevice = \"r\"\n\n[[port]]\naddress = \"127.0.0.1:{port}\"\n[[port]]\ntransport = \"rdma\"\naddress = \"127.0.0.1:{port}\"\n[[port]]\ntransport = \"iscsi\"\naddress = \"127.0.0.1:{}\"\n\n[reactor]\ncores = [0]\n\n{extra}",
        port + 1
    )
}

/// An NVMe/TCP ICReq (PFV 0, no digests, HPDA 0, MAXR2T 0).
fn icreq() -> [u8; 128] {
    let mut b = [0u8; 128];
    b[2] = 128;
    b[4] = 128;
    b
}

/// Whether the daemon closes `sock` within `within`; data it sends first
/// (an ICResp) is read and dropped.
fn closed_within(sock: &mut TcpStream, within: Duration) -> bool {
    sock.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match sock.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
    false
}

/// A host connects, writes and reads back 4 KiB.
fn io_works(addr: SocketAddr) {
    block_on(bounded(20, async {
        let mut c =
            Controller::connect(addr, NQN, HOST, Options { io_queues: 1, queue_size: 16, ..Options::default() })
                .await
                .expect("a fresh host connects");
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        c.write(0, 1, 8, data.clone()).await.expect("write");
        assert_eq!(c.read(0, 1, 8, 8).await.expect("read"), data);
        c.disconnect().await.expect("disconnect");
    }));
}

fn count(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn stalled_handshakes_are_closed_at_the_deadline() {
    let mut d = Daemon::start_with("hostile-handshake", |_, port| config(port, "[timeouts]\nhandshake_ms = 600\n"));
    let nvme = d.addr;
    let iscsi = SocketAddr::from(([127, 0, 0, 1], nvme.port() + 1));
    // Silent on the shared NVMe address (the first-byte sniff waits).
    let mut silent = TcpStream::connect(nvme).expect("connect");
    // Half an ICReq: the PDU never completes.
    let mut half = TcpStream::connect(nvme).expect("connect");
    half.write_all(&icreq()[..40]).expect("half ICReq");
    // A whole ICReq, then no Fabrics Connect.
    let mut no_connect = TcpStream::connect(nvme).expect("connect");
    no_connect.write_all(&icreq()).expect("ICReq");
    // An MPA request that never completes its key.
    let mut mpa = TcpStream::connect(nvme).expect("connect");
    mpa.write_all(b"MPA ID Req").expect("half MPA key");
    // A silent iSCSI connection: its login deadline is the iSCSI driver's,
    // checked here only for its not disturbing the NVMe side.
    let _iscsi = TcpStream::connect(iscsi).expect("connect iscsi");
    for (name, sock) in [("silent", &mut silent), ("half ICReq", &mut half), ("no Connect", &mut no_connect)] {
        assert!(closed_within(sock, Duration::from_secs(10)), "{name}: still open past the 600 ms handshake deadline");
    }
    assert!(closed_within(&mut mpa, Duration::from_secs(10)), "half MPA request still open");
    // A well-behaved host is served as before, its connection outliving the
    // deadline once connected.
    block_on(bounded(20, async {
        let mut c =
            Controller::connect(nvme, NQN, HOST, Options { io_queues: 1, queue_size: 16, ..Options::default() })
                .await
                .expect("connect");
        reactor::sleep(Duration::from_millis(1500)).await;
        c.read(0, 1, 0, 8).await.expect("a connected host outlives the handshake deadline");
        c.disconnect().await.expect("disconnect");
    }));
    d.assert_alive();
    let log = d.log();
    assert!(count(&log, "sent nothing within 600 ms ([timeouts] handshake_ms)") >= 1, "{log}");
    assert!(count(&log, "no Fabrics Connect within the handshake deadline") >= 3, "{log}");
}

#[test]
fn connections_past_the_port_limit_are_refused_until_one_closes() {
    let mut d = Daemon::start_with("hostile-port-limit", |_, port| {
        config(port, "[limits]\nconnections_per_port = 4\n[timeouts]\nhandshake_ms = 60000\n")
    });
    let mut held: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(d.addr).expect("connect")).collect();
    for s in &mut held {
        s.write_all(&icreq()).expect("ICReq");
    }
    let mut fifth = TcpStream::connect(d.addr).expect("the kernel accepts; the daemon closes");
    assert!(closed_within(&mut fifth, Duration::from_secs(5)), "a fifth connection on a port limited to 4");
    for (i, s) in held.iter_mut().enumerate() {
        assert!(!closed_within(s, Duration::from_millis(100)), "held connection {i} was closed");
    }
    // The limit is per address: the iSCSI portal still takes connections.
    let mut iscsi = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], d.addr.port() + 1))).expect("iscsi");
    assert!(!closed_within(&mut iscsi, Duration::from_millis(300)), "the iSCSI port shares no count with NVMe's");
    held.pop();
    // The slot comes back once the daemon sees the close.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut s = TcpStream::connect(d.addr).expect("connect");
        if !closed_within(&mut s, Duration::from_millis(200)) {
            break;
        }
        assert!(Instant::now() < deadline, "no room after a held connection closed");
    }
    d.assert_alive();
    let log = d.log();
    assert!(count(&log, "([limits] connections_per_port)") >= 1, "{log}");
}

#[test]
fn connections_past_the_host_limit_are_refused_across_ports() {
    let mut d = Daemon::start_with("hostile-host-limit", |_, port| {
        config(port, "[limits]\nconnections_per_host = 3\n[timeouts]\nhandshake_ms = 60000\n")
    });
    let iscsi = SocketAddr::from(([127, 0, 0, 1], d.addr.port() + 1));
    let mut held = vec![
        TcpStream::connect(d.addr).expect("nvme 1"),
        TcpStream::connect(d.addr).expect("nvme 2"),
        TcpStream::connect(iscsi).expect("iscsi 1"),
    ];
    for s in &mut held {
        assert!(!closed_within(s, Duration::from_millis(100)), "within the limit");
    }
    let mut fourth = TcpStream::connect(iscsi).expect("connect");
    assert!(closed_within(&mut fourth, Duration::from_secs(5)), "a fourth connection from one host limited to 3");
    drop(held);
    std::thread::sleep(Duration::from_millis(300));
    io_works(d.addr);
    d.assert_alive();
    let log = d.log();
    assert!(count(&log, "([limits] connections_per_host)") >= 1, "{log}");
}

fn limits_of(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = text.lines().find(|l| l.starts_with("Max open files")).expect("open files line");
    let n: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    (n[0], n[1])
}

#[test]
fn serve_raises_its_open_file_limit_to_the_hard_limit() {
    let d = Daemon::start_under("hostile-nofile", &["prlimit", "--nofile=100:3000", "--"], |_, port| config(port, ""));
    assert_eq!(limits_of(d.pid()), (3000, 3000), "soft limit raised to the hard limit");
}

#[test]
fn out_of_descriptors_the_listener_backs_off_and_recovers() {
    // Hard limit 64: the daemon's own descriptors leave room for a few
    // dozen connections; the rest wait in the listen backlog.
    let mut d = Daemon::start_under("hostile-emfile", &["prlimit", "--nofile=64:64", "--"], |_, port| {
        config(port, "[timeouts]\nhandshake_ms = 60000\n")
    });
    let mut flood = Vec::new();
    for _ in 0..100 {
        match TcpStream::connect_timeout(&d.addr, Duration::from_secs(2)) {
            Ok(s) => flood.push(s),
            Err(_) => break,
        }
    }
    assert!(flood.len() > 64, "only {} connections reached the backlog", flood.len());
    // Stay out of descriptors for a while: an accept loop that retried at
    // once (or every few ms, logging each time) would fill the log.
    std::thread::sleep(Duration::from_secs(2));
    d.assert_alive();
    let log = d.log();
    assert_eq!(count(&log, "backing off until descriptors or memory free up"), 1, "one line per episode:\n{log}");
    assert!(count(&log, "accept failed") <= 1, "{log}");
    drop(flood);
    // Descriptors come back as the daemon sees the closes; a fresh host is
    // served again.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let ok = std::panic::catch_unwind(|| io_works(d.addr)).is_ok();
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "no recovery after the flood closed:\n{}", d.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(count(&d.log(), "accepting again after") >= 1, "{}", d.log());
}
