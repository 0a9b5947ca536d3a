//! What the daemon shows about itself: the Prometheus endpoint (`[metrics]
//! listen`) scraped over real HTTP while an NVMe/TCP controller and an
//! iSCSI session do known I/O, whose counters must move by exactly that
//! I/O; `ctl hosts` / `ctl stats` (text and `--json`, through the real
//! `ironwire ctl`) naming who is connected and what failed; and `ctl
//! disconnect` (and `remove host`) closing exactly the connections named.

mod common;

use common::{block_on, bounded, Daemon};
use initiator::iscsi::{cdb, LoginOptions, Session};
use initiator::{cmd, Controller, Options};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

const NQN: &str = "nqn.2026-11.io.ironwire:metrics";
const IQN: &str = "iqn.2026-11.io.ironwire:metrics";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:metrics-host";
const INITIATOR: &str = "iqn.2026-11.io.ironwire:metrics-initiator";

/// NVMe port P, iSCSI port P+1, metrics P+2. Namespace/LUN 1 is RAM
/// (answered in place), namespace/LUN 2 a file (io_uring).
fn start(tag: &str) -> Daemon {
    Daemon::start_with(&format!("metrics-{tag}"), |dir, port| {
        format!(
            "[[device]]\nname = \"r\"\nkind = \"ram\"\nsize = \"16MiB\"\nblock_size = 4096\n\n\
             [[device]]\nname = \"f\"\nkind = \"file\"\nsize = \"16MiB\"\nblock_size = 4096\npath = \"{}\"\n\n\
             [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n\
             [[subsystem.namespace]]\nnsid = 1\ndevice = \"r\"\n[[subsystem.namespace]]\nnsid = 2\ndevice = \"f\"\n\n\
             [[iscsi_target]]\niqn = \"{IQN}\"\nallow_any_initiator = true\n\
             [[iscsi_target.lun]]\nlun = 1\ndevice = \"r\"\n[[iscsi_target.lun]]\nlun = 2\ndevice = \"f\"\n\n\
             [[port]]\naddress = \"127.0.0.1:{port}\"\n\n\
             [[port]]\ntransport = \"iscsi\"\naddress = \"127.0.0.1:{}\"\n\n\
             [reactor]\ncores = [0]\n\n[metrics]\nlisten = \"127.0.0.1:{}\"\n",
            dir.join("f.img").display(),
            port + 1,
            port + 2
        )
    })
}

fn iscsi_portal(d: &Daemon) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], d.addr.port() + 1))
}

fn metrics_addr(d: &Daemon) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], d.addr.port() + 2))
}

/// One HTTP/1.1 request over a plain TcpStream: (status line, headers,
/// body).
fn http(addr: SocketAddr, request: &[u8]) -> (String, String, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.write_all(request).expect("send request");
    let mut reply = String::new();
    s.read_to_string(&mut reply).expect("read reply");
    let (head, body) = reply.split_once("\r\n\r\n").expect("a header block");
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_string(), body.to_string())
}

/// `GET /metrics`: the exposition text.
fn scrape(d: &Daemon) -> String {
    let (status, headers, body) =
        http(metrics_addr(d), b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: text/plain\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(headers.contains("Content-Type: text/plain; version=0.0.4"), "{headers}");
    body
}

/// The value of the sample `series` (name and labels, as written), 0 when
/// it is absent.
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{series}: {v:?} is not a number")))
        .unwrap_or(0.0)
}

/// How much each series moved between two scrapes.
fn delta(before: &str, after: &str, series: &str) -> f64 {
    value(after, series) - value(before, series)
}

fn ns(nsid: u32) -> String {
    format!("subsystem=\"{NQN}\",nsid=\"{nsid}\"")
}

fn lun(n: u64) -> String {
    format!("target=\"{IQN}\",lun=\"{n}\"")
}

/// Checks that the counters of `labels` under `object` moved by `reads`
/// reads of `rb` bytes each and `writes` writes of `wb` bytes each, with
/// as many latency samples and no errors.
fn assert_moved(
    before: &str,
    after: &str,
    object: &str,
    labels: &str,
    (reads, rb): (u64, u64),
    (writes, wb): (u64, u64),
) {
    let d = |suffix: &str| delta(before, after, &format!("ironwire_{object}_{suffix}{{{labels}}}"));
    let moved = (d("reads_total"), d("writes_total"), d("read_bytes_total"), d("write_bytes_total"), d("errors_total"));
    let want = (reads as f64, writes as f64, (reads * rb) as f64, (writes * wb) as f64, 0.0);
    assert_eq!(moved, want, "{object} {labels}: (reads, writes, read bytes, write bytes, errors)");
    let count =
        |op: &str| delta(before, after, &format!("ironwire_{object}_io_latency_seconds_count{{{labels},op=\"{op}\"}}"));
    assert_eq!(count("read"), reads as f64, "{object} {labels}: read latency samples");
    assert_eq!(count("write"), writes as f64, "{object} {labels}: write latency samples");
    let inf = delta(
        before,
        after,
        &format!("ironwire_{object}_io_latency_seconds_bucket{{{labels},op=\"read\",le=\"+Inf\"}}"),
    );
    assert_eq!(inf, reads as f64, "{object} {labels}: the +Inf bucket counts every read");
}

/// An NVMe/TCP controller with one I/O queue and an iSCSI session (LUN 1's
/// power-on unit attention cleared).
async fn connect_both(d: &Daemon) -> (Controller, Session) {
    let c =
        Controller::connect(d.addr, NQN, HOST, Options { io_queues: 1, ..Options::default() }).await.expect("connect");
    let mut s = Session::connect(iscsi_portal(d), LoginOptions::new(INITIATOR, Some(IQN))).await.expect("login");
    s.clear_unit_attentions(1).await.expect("clear unit attentions");
    (c, s)
}

#[test]
fn scraped_counters_move_by_exactly_the_io_done_over_nvme_tcp_and_iscsi() {
    let d = start("exact");
    block_on(bounded(60, async {
        let (mut c, mut s) = connect_both(&d).await;
        // Identify (the initiator's block size lookups) before the first
        // scrape, so that only the I/O below happens between the two.
        c.read(0, 1, 0, 1).await.expect("warm-up read nsid 1");
        c.read(0, 2, 0, 1).await.expect("warm-up read nsid 2");
        let before = scrape(&d);

        // NVMe/TCP: 37 reads of 4 KiB and 23 writes of 8 KiB to the RAM
        // namespace, 5 reads of 16 KiB and 7 writes of 4 KiB to the file.
        for i in 0..23u64 {
            c.write(0, 1, i * 2, vec![0xa5; 8192]).await.expect("write nsid 1");
        }
        for i in 0..37u64 {
            c.read(0, 1, i, 1).await.expect("read nsid 1");
        }
        for i in 0..7u64 {
            c.write(0, 2, i, vec![0x5a; 4096]).await.expect("write nsid 2");
        }
        // A scrape while reads are in flight is a consistent document.
        let q = c.io_queue(0).expect("queue");
        for i in 0..5u64 {
            q.submit(cmd::read(2, i * 4, 4), Vec::new(), 16384).expect("submit read nsid 2");
        }
        let during = scrape(&d);
        assert!(during.ends_with('\n') && during.contains("ironwire_namespace_reads_total{"), "{during}");
        for _ in 0..5 {
            let r = q.next_completion().await.expect("completion");
            assert!(r.cqe.status().is_success(), "{}", r.cqe.status());
        }

        // iSCSI: 11 reads of 8 KiB and 13 writes of 4 KiB to LUN 1, 3
        // reads of 4 KiB and 2 writes of 12 KiB to LUN 2.
        for i in 0..13u64 {
            s.write16(1, i, 4096, vec![0x11; 4096]).await.expect("write lun 1");
        }
        for i in 0..11u64 {
            s.read16(1, i * 2, 2, 4096).await.expect("read lun 1");
        }
        for i in 0..2u64 {
            s.write16(2, i * 3, 4096, vec![0x22; 12288]).await.expect("write lun 2");
        }
        for i in 0..3u64 {
            s.read16(2, i, 1, 4096).await.expect("read lun 2");
        }
        let after = scrape(&d);

        assert_moved(&before, &after, "namespace", &ns(1), (37, 4096), (23, 8192));
        assert_moved(&before, &after, "namespace", &ns(2), (5, 16384), (7, 4096));
        assert_moved(&before, &after, "lun", &lun(1), (11, 8192), (13, 4096));
        assert_moved(&before, &after, "lun", &lun(2), (3, 4096), (2, 12288));
        let nvme_port = format!("port=\"{}\"", d.addr);
        let iscsi_port = format!("port=\"{}\"", iscsi_portal(&d));
        let port_delta =
            |port: &str, suffix: &str| delta(&before, &after, &format!("ironwire_port_{suffix}{{{port}}}"));
        assert_eq!(port_delta(&nvme_port, "reads_total"), 42.0);
        assert_eq!(port_delta(&nvme_port, "write_bytes_total"), (23 * 8192 + 7 * 4096) as f64);
        assert_eq!(port_delta(&iscsi_port, "reads_total"), 14.0);
        assert_eq!(port_delta(&iscsi_port, "writes_total"), 15.0);
        // The admin queue, the I/O queue and the session.
        assert_eq!(value(&after, &format!("ironwire_port_connections{{{nvme_port}}}")), 2.0);
        assert_eq!(value(&after, &format!("ironwire_port_connections{{{iscsi_port}}}")), 1.0);
        assert_eq!(value(&after, "ironwire_reactor_connections{reactor=\"0\"}"), 3.0);
        assert_eq!(value(&after, "ironwire_hosts_connected{protocol=\"iscsi\"}"), 1.0);
        assert_eq!(value(&after, "ironwire_hosts_connected{protocol=\"nvme-tcp\"}"), 2.0);

        // A read past the end fails in the core: the port counts the error.
        let blocks = 16 * 1024 * 1024 / 4096;
        let r = c.io_queue(0).expect("queue").execute_raw(cmd::read(1, blocks, 1), Vec::new(), 4096).await;
        assert!(!r.expect("completion").cqe.status().is_success(), "a read past the end succeeded");
        let failed = scrape(&d);
        assert_eq!(delta(&after, &failed, &format!("ironwire_port_errors_total{{{nvme_port}}}")), 1.0);
        assert_eq!(delta(&after, &failed, &format!("ironwire_port_reads_total{{{nvme_port}}}")), 0.0);
    }));
}

#[test]
fn the_endpoint_answers_only_get_metrics_and_bounds_the_request() {
    let d = start("http");
    let a = metrics_addr(&d);
    let (status, _, body) = http(a, b"GET /nothing HTTP/1.1\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 404 Not Found", "{body}");
    let (status, _, _) = http(a, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
    let huge = format!("GET /metrics HTTP/1.1\r\nX-Filler: {}\r\n\r\n", "x".repeat(20_000));
    let mut s = TcpStream::connect(a).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    // The endpoint may close before taking all of it; its answer counts.
    let _ = s.write_all(huge.as_bytes());
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 431 "), "{reply:?}");
    assert!(d.log().contains("request head longer than 8192 bytes"), "{}", d.log());
    // And it still serves the next client.
    let text = scrape(&d);
    assert!(text.contains("# TYPE ironwire_reactor_cpu_seconds_total counter"));
    assert!(text.contains("# TYPE ironwire_reactor_idle_poll_seconds_total counter"), "{text}");
    assert!(text.contains("ironwire_reactor_idle_poll_seconds_total{reactor=\"0\"} "), "{text}");
    // 512 receive buffers never ran out for these few clients.
    assert!(text.contains("ironwire_reactor_receive_dry_total{reactor=\"0\"} 0\n"), "{text}");
}

#[test]
fn a_client_trickling_its_request_is_cut_off_and_the_next_scrape_is_answered() {
    let d = start("slow");
    let a = metrics_addr(&d);
    // A byte a second, each within the 5 s read timeout, for 20 s: a head
    // that never ends while every read succeeds.
    let mut slow = TcpStream::connect(a).expect("connect");
    slow.set_read_timeout(Some(Duration::from_secs(25))).expect("timeout");
    let mut w = slow.try_clone().expect("clone");
    let trickler = std::thread::spawn(move || {
        let _ = w.write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ");
        for _ in 0..20 {
            if w.write_all(b"a").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    // Served beside the trickler, on a thread of its own.
    let (status, _, _) = http(a, b"GET /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 200 OK");
    let mut reply = String::new();
    let _ = slow.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 408 "), "{reply:?}");
    trickler.join().expect("trickler");
    assert!(d.log().contains("request head not complete within 5 s"), "{}", d.log());
}

/// True while the server has neither answered nor closed `s`.
fn still_waiting(s: &TcpStream) -> bool {
    s.set_nonblocking(true).expect("nonblocking");
    let mut b = [0u8; 1];
    let waiting = matches!((&*s).read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    s.set_nonblocking(false).expect("blocking");
    waiting
}

#[test]
fn silent_clients_delay_no_scrape_until_all_four_places_are_taken() {
    let d = start("silent");
    let a = metrics_addr(&d);
    // Three clients that connect and send nothing hold their places for
    // 5 s each; a scrape is answered while they still wait (served one
    // at a time, it would wait 15 s behind them).
    let silent: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(a).expect("connect")).collect();
    std::thread::sleep(Duration::from_millis(200));
    let (status, _, body) = http(a, b"GET /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(body.contains("ironwire_"), "{body}");
    assert!(silent.iter().all(still_waiting), "the silent clients were answered or closed before the scrape");
    // A fourth silent one takes the last place: the next scrape waits in
    // the backlog until a silent one is cut off (408), then is answered.
    let fourth = TcpStream::connect(a).expect("connect");
    std::thread::sleep(Duration::from_millis(200));
    let (status, _, _) = http(a, b"GET /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 200 OK");
    let cut_off = silent.iter().chain([&fourth]).filter(|s| !still_waiting(s)).count();
    assert!(cut_off >= 1, "a scrape was answered while all four places were taken");
}

#[test]
fn head_is_answered_without_a_body_and_a_405_names_get_and_head() {
    let d = start("methods");
    let a = metrics_addr(&d);
    let (status, headers, body) = http(a, b"HEAD /metrics?x=1 HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 200 OK", "{headers}");
    assert!(headers.contains("Content-Type: text/plain; version=0.0.4"), "{headers}");
    assert!(!headers.contains("Content-Length: 0\r"), "{headers}");
    assert_eq!(body, "", "HEAD got a body");
    let (status, headers, _) = http(a, b"DELETE /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
    assert!(headers.contains("Allow: GET, HEAD"), "{headers}");
    assert!(d.log().contains("method \"DELETE\""), "{}", d.log());
}

/// `ironwire ctl --socket S ARGS...`, the real client: its stdout.
fn ctl(socket: &Path, args: &[&str]) -> String {
    common::ctl(socket, args).unwrap_or_else(|e| panic!("ctl {args:?}: {e}"))
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn ctl_hosts_and_stats_name_the_connected_hosts_and_the_failures() {
    let d = start("ctl");
    let sock = d.dir.join("ctl.sock");
    block_on(bounded(60, async {
        let opts = Options { io_queues: 2, queue_size: 64, header_digest: true, ..Options::default() };
        let mut c = Controller::connect(d.addr, NQN, HOST, opts).await.expect("connect");
        let mut s = Session::connect(iscsi_portal(&d), LoginOptions::new(INITIATOR, Some(IQN))).await.expect("login");
        s.clear_unit_attentions(1).await.expect("clear unit attentions");

        let hosts = json(&ctl(&sock, &["hosts", "--json"]));
        let nvme = hosts["nvme"].as_array().expect("nvme list");
        assert_eq!(nvme.len(), 1, "{hosts:#}");
        assert_eq!(nvme[0]["hostnqn"], HOST);
        assert_eq!(nvme[0]["subsystem"], NQN);
        assert_eq!(nvme[0]["protocol"], "nvme-tcp");
        let queues: Vec<(u64, u64, bool)> = nvme[0]["queues"]
            .as_array()
            .expect("queues")
            .iter()
            .map(|q| {
                (
                    q["qid"].as_u64().expect("qid"),
                    q["depth"].as_u64().expect("depth"),
                    q["header_digest"].as_bool().expect("digest"),
                )
            })
            .collect();
        assert_eq!(queues.iter().map(|q| q.0).collect::<Vec<_>>(), [0, 1, 2], "{hosts:#}");
        assert_eq!(queues[1].1, 64, "I/O queue depth: {hosts:#}");
        assert!(queues.iter().all(|q| q.2), "header digest on every queue: {hosts:#}");
        let iscsi = hosts["iscsi"].as_array().expect("iscsi list");
        assert_eq!(iscsi.len(), 1, "{hosts:#}");
        assert_eq!(iscsi[0]["initiator"], INITIATOR);
        assert_eq!(iscsi[0]["target"], IQN);
        assert_eq!(iscsi[0]["tsih"].as_u64(), Some(u64::from(s.tsih())));
        assert_eq!(iscsi[0]["chap"], "none");
        assert_eq!(iscsi[0]["header_digest"], false);

        let text = ctl(&sock, &["hosts"]);
        assert!(text.contains(&format!("nvme-tcp host={HOST} subsystem={NQN} cntlid=")), "{text}");
        assert!(text.contains("queues=0:"), "{text}");
        assert!(text.contains(&format!("iscsi initiator={INITIATOR} target={IQN} tsih={}", s.tsih())), "{text}");
        assert_eq!(ctl(&sock, &["sessions"]).lines().count(), text.lines().count());

        // Failures by name: a read past the end over each protocol.
        let errors_before = |stats: &serde_json::Value, addr: SocketAddr| {
            let ports = stats["ports"].as_array().cloned().unwrap_or_default();
            ports.iter().find(|p| p["port"] == addr.to_string()).and_then(|p| p["errors"].as_u64()).unwrap_or(0)
        };
        let earlier = json(&ctl(&sock, &["stats", "--json"]));
        let blocks = 16 * 1024 * 1024 / 4096;
        let r = c.io_queue(0).expect("queue").execute_raw(cmd::read(1, blocks, 1), Vec::new(), 4096).await;
        assert!(!r.expect("completion").cqe.status().is_success());
        let r = s.scsi(1, &cdb::read16(blocks, 1), Vec::new(), 4096).await.expect("SCSI answer");
        assert!(!r.is_good());
        c.write(0, 1, 0, vec![1; 4096]).await.expect("write");

        let stats = json(&ctl(&sock, &["stats", "--json"]));
        let port = |addr: SocketAddr| {
            stats["ports"].as_array().expect("ports").iter().find(|p| p["port"] == addr.to_string()).cloned()
        };
        let nvme_port = port(d.addr).expect("NVMe port in stats");
        assert_eq!(nvme_port["errors"].as_u64(), Some(errors_before(&earlier, d.addr) + 1));
        let name = nvme_port["last_error"]["name"].as_str().expect("a named error");
        assert!(name.starts_with("LBA Out of Range (sct 0x0 sc 0x80"), "{name}");
        let iscsi_port = port(iscsi_portal(&d)).expect("iSCSI port in stats");
        assert_eq!(iscsi_port["errors"].as_u64(), Some(errors_before(&earlier, iscsi_portal(&d)) + 1));
        let name = iscsi_port["last_error"]["name"].as_str().expect("a named error");
        assert!(name.starts_with("ILLEGAL REQUEST: LOGICAL BLOCK ADDRESS OUT OF RANGE"), "{name}");
        let ns1 = stats["namespaces"].as_array().expect("namespaces").iter().find(|n| n["nsid"] == 1).cloned();
        let ns1 = ns1.expect("namespace 1 in stats");
        assert_eq!((ns1["writes"].as_u64(), ns1["write_bytes"].as_u64()), (Some(1), Some(4096)), "{ns1:#}");
        assert_eq!(ns1["latency"]["write"]["count"], 1);
        assert_eq!(stats["reactors"][0]["connections"], 4, "{stats:#}");
        // The default poll_us spins after each burst of work before it
        // sleeps: some of the reactor's CPU time was idle spin.
        let idle = stats["reactors"][0]["idle_poll_us"].as_u64().expect("idle_poll_us");
        assert!(idle > 0, "no idle spin counted: {stats:#}");
        assert_eq!(stats["reactors"][0]["receive_dry"], 0, "{stats:#}");

        let text = ctl(&sock, &["stats"]);
        assert!(text.lines().any(|l| l.starts_with("cpu ")), "the bench's line stays first: {text}");
        assert!(text.contains(&format!("namespace {NQN} 1 reads=0 writes=1 ")), "{text}");
        assert!(text.contains("last_error=\"LBA Out of Range"), "{text}");
        assert!(text.contains("reactor 0 busy="), "{text}");
        assert!(text.contains(" idle_poll_us="), "{text}");
        assert!(text.contains(" receive_dry=0 "), "{text}");
    }));
}

/// Polls `ctl hosts --json` until `done` holds of it (connections leave the
/// table once their driver has finished), at most 10 s.
/// A host NQN is the host's to choose (any UTF-8 up to a NUL, let into a
/// subsystem open to any host): it must not end the reply early (a line
/// `ok`), fail it (`error: `) or make up fields or lines of its own.
#[test]
fn ctl_hosts_text_keeps_a_hostile_host_nqn_on_its_line() {
    let d = start("hostile-nqn");
    let sock = d.dir.join("ctl.sock");
    let forged = "nqn.2014-08.org.nvmexpress:x subsystem=forged\nok\nerror: forged";
    block_on(bounded(60, async {
        let c = Controller::connect(d.addr, NQN, forged, Options::default()).await.expect("connect");
        let text = ctl(&sock, &["hosts"]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "one controller, one line: {text:?}");
        assert!(lines[0].contains(&format!(" subsystem={NQN} ")), "{text:?}");
        assert!(!lines[0].contains(" subsystem=forged"), "{text:?}");
        assert_eq!(json(&ctl(&sock, &["hosts", "--json"]))["nvme"][0]["hostnqn"], forged);
        drop(c);
    }));
}

async fn hosts_until(sock: &Path, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    for _ in 0..100 {
        let hosts = json(&ctl(sock, &["hosts", "--json"]));
        if done(&hosts) {
            return hosts;
        }
        reactor::sleep(Duration::from_millis(100)).await;
    }
    panic!("ctl hosts never showed the change: {}", ctl(sock, &["hosts"]));
}

#[test]
fn ctl_disconnect_closes_only_the_connections_named_and_remove_host_revokes_at_once() {
    let d = start("disconnect");
    let sock = d.dir.join("ctl.sock");
    block_on(bounded(60, async {
        let mut c = Controller::connect(d.addr, NQN, HOST, Options::default()).await.expect("connect");
        let mut s = Session::connect(iscsi_portal(&d), LoginOptions::new(INITIATOR, Some(IQN))).await.expect("login");
        s.clear_unit_attentions(1).await.expect("clear unit attentions");

        for bad in [&["disconnect"][..], &["disconnect", "who=me"], &["disconnect", "host=h", "iqn=t"]] {
            let e = common::ctl(&sock, bad).expect_err("refused");
            assert!(e.contains("host") && e.contains("iqn"), "{bad:?}: {e}");
        }
        let none = ctl(&sock, &["disconnect", "initiator=iqn.2026-11.io.ironwire:nobody"]);
        assert!(none.starts_with("closed 0 connection(s)"), "{none}");

        // The iSCSI session goes; the NVMe controller stays.
        let out = ctl(&sock, &["disconnect", &format!("initiator={INITIATOR}")]);
        assert!(out.starts_with("closed 1 connection(s)"), "{out}");
        assert!(out.contains(&format!("iscsi initiator={INITIATOR} target={IQN}")), "{out}");
        assert!(s.scsi(1, &cdb::read16(0, 1), Vec::new(), 4096).await.is_err(), "the session was closed");
        hosts_until(&sock, |h| h["iscsi"].as_array().is_some_and(Vec::is_empty)).await;
        c.write(0, 1, 0, vec![7; 4096]).await.expect("the NVMe controller still works");

        // Taking a host off a subsystem's list closes its controller at
        // once; another host's list entry, or allow_any_host, keeps one.
        for h in [HOST, "nqn.2014-08.org.nvmexpress:uuid:other", "nqn.2014-08.org.nvmexpress:uuid:third"] {
            ctl(&sock, &["add", "host", &format!("nqn={NQN}"), &format!("host={h}")]);
        }
        ctl(&sock, &["set", "subsystem", &format!("nqn={NQN}"), "allow_any_host=false"]);
        let kept = ctl(&sock, &["remove", "host", &format!("nqn={NQN}"), "host=nqn.2014-08.org.nvmexpress:uuid:other"]);
        assert_eq!(kept, "", "no connection of that host");
        c.write(0, 1, 0, vec![8; 4096]).await.expect("still allowed, still connected");
        let out = ctl(&sock, &["remove", "host", &format!("nqn={NQN}"), &format!("host={HOST}")]);
        assert_eq!(out, "closed 2 connection(s) of hosts no longer allowed in\n", "admin + I/O queue");
        assert!(c.write(0, 1, 0, vec![9; 4096]).await.is_err(), "the controller was closed");
        hosts_until(&sock, |h| h["nvme"].as_array().is_some_and(Vec::is_empty)).await;
        assert!(Controller::connect(d.addr, NQN, HOST, Options::default()).await.is_err(), "no longer allowed");

        // Turning allow_any_initiator off keeps a session whose initiator
        // is on the list (names compare without case, as at login); taking
        // it off the list closes the session.
        let mixed = INITIATOR.replace("metrics", "Metrics");
        let mut s = Session::connect(iscsi_portal(&d), LoginOptions::new(&mixed, Some(IQN))).await.expect("login");
        s.clear_unit_attentions(1).await.expect("clear unit attentions");
        let listed = INITIATOR;
        ctl(&sock, &["add", "initiator", &format!("iqn={IQN}"), "initiator=iqn.2026-11.io.ironwire:someone-else"]);
        ctl(&sock, &["add", "initiator", &format!("iqn={IQN}"), &format!("initiator={listed}")]);
        let out = ctl(&sock, &["set", "target", &format!("iqn={IQN}"), "allow_any_initiator=false"]);
        assert_eq!(out, "", "still allowed");
        s.scsi(1, &cdb::read16(0, 1), Vec::new(), 4096).await.expect("the session still works").check().expect("good");
        let out = ctl(&sock, &["remove", "initiator", &format!("iqn={IQN}"), &format!("initiator={listed}")]);
        assert_eq!(out, "closed 1 connection(s) of hosts no longer allowed in\n");
        assert!(s.scsi(1, &cdb::read16(0, 1), Vec::new(), 4096).await.is_err(), "the session was closed");
    }));
}

#[test]
fn removed_namespaces_and_luns_leave_the_metrics_and_come_back_counted_afresh() {
    let d = start("forget");
    let sock = d.dir.join("ctl.sock");
    block_on(bounded(60, async {
        let (mut c, mut s) = connect_both(&d).await;
        c.read(0, 1, 0, 1).await.expect("read nsid 1");
        s.read16(1, 0, 1, 4096).await.expect("read lun 1");
        for i in 0..4u64 {
            c.read(0, 2, i, 1).await.expect("read nsid 2");
            s.read16(2, i, 1, 4096).await.expect("read lun 2");
        }
        let first = scrape(&d);
        let reads =
            |text: &str, object: &str, labels: &str| value(text, &format!("ironwire_{object}_reads_total{{{labels}}}"));
        assert_eq!(reads(&first, "namespace", &ns(2)), 4.0);
        assert_eq!(reads(&first, "lun", &lun(2)), 4.0);

        ctl(&sock, &["remove", "namespace", &format!("nqn={NQN}"), "nsid=2"]);
        ctl(&sock, &["remove", "lun", &format!("iqn={IQN}"), "lun=2"]);
        let gone = scrape(&d);
        for (object, labels) in [("namespace", ns(2)), ("lun", lun(2))] {
            let prefix = format!("{{{labels}");
            assert!(
                !gone.lines().any(|l| l.starts_with(&format!("ironwire_{object}_")) && l.contains(&prefix)),
                "{object} {labels} is still reported after its removal:\n{gone}"
            );
        }
        assert!(gone.contains(&format!("ironwire_namespace_reads_total{{{}}}", ns(1))), "{gone}");
        assert!(gone.contains(&format!("ironwire_lun_reads_total{{{}}}", lun(1))), "{gone}");
        let stats = ctl(&sock, &["stats", "--json"]);
        assert!(!stats.contains("\"nsid\": 2") && !stats.contains("\"nsid\":2"), "{stats}");

        // Back under the same NSID and LUN: the live controller and session
        // (which cached the old counters) count into fresh ones.
        ctl(&sock, &["add", "namespace", &format!("nqn={NQN}"), "nsid=2", "device=f"]);
        ctl(&sock, &["add", "lun", &format!("iqn={IQN}"), "lun=2", "device=f"]);
        s.clear_unit_attentions(2).await.expect("clear unit attentions");
        for i in 0..3u64 {
            c.read(0, 2, i, 1).await.expect("read nsid 2 again");
            s.read16(2, i, 1, 4096).await.expect("read lun 2 again");
        }
        let back = scrape(&d);
        assert_eq!(reads(&back, "namespace", &ns(2)), 3.0, "{back}");
        assert_eq!(reads(&back, "lun", &lun(2)), 3.0, "{back}");
    }));
}

/// A port removed while a connection it accepted is still open keeps its
/// series until that connection closes, and then leaves them
/// (docs/observability.md), without waiting for another change.
#[test]
fn a_removed_port_leaves_the_metrics_once_its_last_connection_closes() {
    let d = start("port-forget");
    let sock = d.dir.join("ctl.sock");
    let free = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port");
    let extra = SocketAddr::from(([127, 0, 0, 1], free.port()));
    ctl(&sock, &["add", "port", &format!("address={extra}")]);
    let series = format!("ironwire_port_connections{{port=\"{extra}\"}}");
    let open = |want: f64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let text = scrape(&d);
            let now = text.lines().find(|l| l.starts_with(&series)).map(|_| value(&text, &series));
            if now == Some(want) || std::time::Instant::now() > deadline {
                return (now, text);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let conn = TcpStream::connect(extra).expect("connect to the added port");
    assert_eq!(open(1.0).0, Some(1.0), "the connection is counted");
    ctl(&sock, &["remove", "port", &format!("address={extra}")]);
    let (still, text) = open(1.0);
    assert_eq!(still, Some(1.0), "removed, but its connection is open: still reported\n{text}");
    drop(conn);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = scrape(&d);
        if !text.contains(&format!("port=\"{extra}\"")) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the removed port is still reported after its last connection closed:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let stats = ctl(&sock, &["stats", "--json"]);
    assert!(!stats.contains(&extra.to_string()), "{stats}");
}
