//! The Prometheus endpoint (`[metrics] listen`): `GET /metrics` answers
//! the counters of `stats` in the text exposition format 0.0.4.
//!
//! It runs on a thread of its own with blocking std I/O, like the control
//! socket, and never on a reactor: a scrape costs the reactors only the
//! table locks `stats::snapshot` takes. It is bounded: at most four
//! clients at once, each on a thread of its own (more wait in the listen
//! backlog until a place is free), a request head of at most 8 KiB that
//! must arrive within 5 s, and an answer the client must take within 5 s,
//! so a client that stalls or trickles holds one place for seconds at most
//! and delays no scrape.
//! Every refusal is logged with its reason (at most ten lines in ten
//! seconds; the rest are counted).

use crate::stats::{self, Scope, Snapshot, Totals};
use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The longest request head (request line and headers) read.
const MAX_REQUEST: usize = 8192;
/// How long a client may take to send its whole request head, and then
/// to take the whole answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Clients served at once, each on a thread of its own.
const MAX_CLIENTS: usize = 4;

/// Binds `addr` (so that a taken address fails the start) and serves it
/// from a thread named `metrics`, which hands each client to a thread of
/// its own; returns the bound address.
pub fn spawn(addr: SocketAddr) -> Result<SocketAddr> {
    let listener = TcpListener::bind(addr).with_context(|| format!("[metrics] listen {addr}"))?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new().name("metrics".into()).spawn(move || {
        let refusals = Arc::new(Mutex::new(Refusals::default()));
        let places = Arc::new(Places::default());
        loop {
            places.wait_for_one();
            match listener.accept() {
                Ok((s, _)) => serve_apart(s, &places, &refusals),
                Err(e) => {
                    log::warn!("metrics: accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    })?;
    log::info!("metrics: serving Prometheus text on http://{bound}/metrics");
    Ok(bound)
}

/// The clients being served, at most [`MAX_CLIENTS`].
#[derive(Default)]
struct Places {
    taken: Mutex<usize>,
    freed: Condvar,
}

impl Places {
    /// Waits until fewer than [`MAX_CLIENTS`] are being served.
    fn wait_for_one(&self) {
        let taken = self.taken.lock().unwrap_or_else(PoisonError::into_inner);
        drop(self.freed.wait_while(taken, |t| *t >= MAX_CLIENTS).unwrap_or_else(PoisonError::into_inner));
    }
}

/// A client's place among [`MAX_CLIENTS`], given back when dropped.
struct Place(Arc<Places>);

impl Place {
    fn take(places: &Arc<Places>) -> Place {
        *places.taken.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        Place(places.clone())
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut taken = self.0.taken.lock().unwrap_or_else(PoisonError::into_inner);
        *taken = taken.saturating_sub(1);
        self.0.freed.notify_one();
    }
}

/// Serves `s` on a thread of its own, which holds a place until it ends.
fn serve_apart(s: TcpStream, places: &Arc<Places>, refusals: &Arc<Mutex<Refusals>>) {
    let (place, refusals, peer) = (Place::take(places), refusals.clone(), peer_of(&s));
    let spawned = std::thread::Builder::new().name("metrics-client".into()).spawn(move || {
        let _place = place;
        serve_client(s, &refusals);
    });
    if let Err(e) = spawned {
        log::warn!("metrics: cannot start a thread for {peer}: {e}");
    }
}

fn peer_of(s: &TcpStream) -> String {
    s.peer_addr().map_or_else(|_| "a client".to_string(), |a| a.to_string())
}

/// Logs a refusal through the shared [`Refusals`].
fn refused(refusals: &Mutex<Refusals>, peer: &str, why: &str) {
    refusals.lock().unwrap_or_else(PoisonError::into_inner).log(peer, why);
}

/// Why a request is not answered with the figures: the status, and the
/// reason the log gives.
struct Refusal {
    status: &'static str,
    why: String,
}

/// Reads a request head (through the blank line) that must arrive whole
/// by `deadline`: a per-read timeout alone would let a client that sends
/// a byte every few seconds hold the endpoint for hours. `None` when the
/// client closed or broke the connection before a whole head.
fn read_head(s: &mut TcpStream, deadline: Instant) -> Option<Result<Vec<u8>, Refusal>> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_REQUEST {
            let why = format!("request head longer than {MAX_REQUEST} bytes");
            return Some(Err(Refusal { status: "431 Request Header Fields Too Large", why }));
        }
        let timed_out = || {
            let why = format!("request head not complete within {} s", CLIENT_TIMEOUT.as_secs());
            Some(Err(Refusal { status: "408 Request Timeout", why }))
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            return timed_out();
        }
        match s.read(&mut buf) {
            Ok(0) => return None,
            Ok(n) => head.extend_from_slice(buf.get(..n).unwrap_or_default()),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return timed_out()
            }
            Err(_) => return None,
        }
    }
    Some(Ok(head))
}

/// Logs refusals, at most [`REFUSALS_LOGGED`] in each
/// [`REFUSAL_WINDOW`]: an unauthenticated client (a scanner) must not
/// flood the log. The lines left out are counted and said with the next
/// one logged.
#[derive(Default)]
struct Refusals {
    window_start: Option<Instant>,
    logged: u32,
    left_out: u64,
}

const REFUSAL_WINDOW: Duration = Duration::from_secs(10);
const REFUSALS_LOGGED: u32 = 10;

impl Refusals {
    fn log(&mut self, peer: &str, why: &str) {
        let now = Instant::now();
        if self.window_start.is_none_or(|t| now.duration_since(t) >= REFUSAL_WINDOW) {
            self.window_start = Some(now);
            self.logged = 0;
        }
        if self.logged >= REFUSALS_LOGGED {
            self.left_out = self.left_out.saturating_add(1);
            return;
        }
        self.logged += 1;
        match std::mem::take(&mut self.left_out) {
            0 => log::warn!("metrics: refused {peer}: {why}"),
            n => log::warn!("metrics: refused {peer}: {why} ({n} more refused before, not logged)"),
        }
    }
}

fn serve_client(mut s: TcpStream, refusals: &Mutex<Refusals>) {
    let peer = peer_of(&s);
    let head = match read_head(&mut s, Instant::now() + CLIENT_TIMEOUT) {
        None => return,
        Some(Ok(head)) => head,
        Some(Err(r)) => {
            refused(refusals, &peer, &r.why);
            respond(&mut s, &peer, r.status, "text/plain", &format!("{}\n", r.why), true);
            return;
        }
    };
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split(' ');
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    // HEAD is GET without the body (RFC 9110 section 9.3.2).
    let body = method == "GET";
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let text = render(&stats::snapshot(), &stats::hosts());
            respond(&mut s, &peer, "200 OK", "text/plain; version=0.0.4; charset=utf-8", &text, body);
        }
        ("GET" | "HEAD", "/") => {
            respond(&mut s, &peer, "200 OK", "text/plain", "ironwire: metrics at /metrics\n", body)
        }
        ("GET" | "HEAD", _) => {
            refused(refusals, &peer, &format!("no page at {path:?}"));
            respond(&mut s, &peer, "404 Not Found", "text/plain", "not found; try /metrics\n", body);
        }
        _ => {
            refused(refusals, &peer, &format!("method {method:?} (only GET and HEAD)"));
            respond(&mut s, &peer, "405 Method Not Allowed", "text/plain", "only GET and HEAD\n", true);
        }
    }
}

/// Sends the answer, which the client must take within [`CLIENT_TIMEOUT`]
/// as a whole (each write is given what is left of it), and closes.
fn respond(s: &mut TcpStream, peer: &str, status: &str, content_type: &str, body: &str, with_body: bool) {
    // A 405 must say which methods are (RFC 9110 section 15.5.6).
    let allow = if status.starts_with("405 ") { "Allow: GET, HEAD\r\n" } else { "" };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        body.len()
    );
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    let mut out = head.into_bytes();
    if with_body {
        out.extend_from_slice(body.as_bytes());
    }
    let mut rest = out.as_slice();
    while !rest.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        let written = if left.is_zero() {
            Err(std::io::ErrorKind::TimedOut.into())
        } else {
            s.set_write_timeout(Some(left)).and_then(|()| s.write(rest))
        };
        match written {
            Ok(0) => return,
            Ok(n) => rest = rest.get(n..).unwrap_or_default(),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                log::warn!("metrics: {peer} did not take the answer within {} s; closed", CLIENT_TIMEOUT.as_secs());
                return;
            }
            Err(_) => return,
        }
    }
}

/// A label value with `\`, `"` and newlines escaped.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// One metric family: its HELP and TYPE lines, then its samples.
struct Family<'a> {
    out: &'a mut String,
}

impl<'a> Family<'a> {
    fn new(out: &'a mut String, name: &str, kind: &str, help: &str) -> Self {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        Family { out }
    }

    fn sample(&mut self, name: &str, labels: &str, value: impl std::fmt::Display) {
        let _ = writeln!(self.out, "{name}{{{labels}}} {value}");
    }
}

fn scope_labels(s: &Scope) -> String {
    match s {
        Scope::Namespace { subsystem, nsid } => format!("subsystem=\"{}\",nsid=\"{nsid}\"", esc(subsystem)),
        Scope::Lun { target, lun } => format!("target=\"{}\",lun=\"{lun}\"", esc(target)),
    }
}

/// The I/O families of one kind of object (`namespace`, `lun`, `port`).
fn io_families<'a>(out: &mut String, object: &str, rows: impl Iterator<Item = (String, &'a Totals)> + Clone) {
    type Get = fn(&Totals) -> u64;
    let counters: [(&str, &str, Get); 6] = [
        ("reads_total", "Read commands completed.", |t| t.reads),
        ("writes_total", "Write commands completed.", |t| t.writes),
        ("other_commands_total", "Other commands that reached the device (flush, unmap, ...).", |t| t.other),
        ("read_bytes_total", "Bytes read.", |t| t.read_bytes),
        ("write_bytes_total", "Bytes written.", |t| t.write_bytes),
        ("errors_total", "Commands completed with an error status.", |t| t.errors),
    ];
    for (suffix, help, get) in counters {
        let name = format!("ironwire_{object}_{suffix}");
        let mut f = Family::new(out, &name, "counter", help);
        for (labels, t) in rows.clone() {
            f.sample(&name, &labels, get(t));
        }
    }
    let name = format!("ironwire_{object}_io_latency_seconds");
    let mut f = Family::new(
        out,
        &name,
        "histogram",
        "Time from the command's block request to its completion, on the reactor's loop clock.",
    );
    for (labels, t) in rows {
        for (op, l) in ["read", "write", "other"].iter().zip(&t.latency) {
            let mut cumulative = 0u64;
            for (i, b) in l.buckets.iter().enumerate() {
                cumulative += b;
                let le = match stats::bucket_bound_us(i) {
                    Some(us) => format!("{}", us as f64 / 1e6),
                    None => "+Inf".to_string(),
                };
                f.sample(&format!("{name}_bucket"), &format!("{labels},op=\"{op}\",le=\"{le}\""), cumulative);
            }
            f.sample(&format!("{name}_sum"), &format!("{labels},op=\"{op}\""), l.sum_us as f64 / 1e6);
            f.sample(&format!("{name}_count"), &format!("{labels},op=\"{op}\""), cumulative);
        }
    }
}

/// The exposition text of `snap` and `hosts`.
pub fn render(snap: &Snapshot, hosts: &[stats::Host]) -> String {
    let mut out = String::new();
    let mut f = Family::new(&mut out, "ironwire_build_info", "gauge", "The daemon's version.");
    f.sample("ironwire_build_info", &format!("version=\"{}\"", env!("CARGO_PKG_VERSION")), 1);
    let nvme = snap.scopes.iter().filter(|(s, _)| matches!(s, Scope::Namespace { .. }));
    io_families(&mut out, "namespace", nvme.map(|(s, t)| (scope_labels(s), t)));
    let luns = snap.scopes.iter().filter(|(s, _)| matches!(s, Scope::Lun { .. }));
    io_families(&mut out, "lun", luns.map(|(s, t)| (scope_labels(s), t)));
    io_families(&mut out, "port", snap.ports.iter().map(|(a, p)| (format!("port=\"{a}\""), &p.io)));
    let mut f = Family::new(&mut out, "ironwire_port_connections", "gauge", "Connections open on the port.");
    for (a, p) in &snap.ports {
        f.sample("ironwire_port_connections", &format!("port=\"{a}\""), p.open);
    }
    let name = "ironwire_port_connections_accepted_total";
    let mut f = Family::new(&mut out, name, "counter", "Connections accepted on the port (after admission).");
    for (a, p) in &snap.ports {
        f.sample(name, &format!("port=\"{a}\""), p.accepted);
    }
    let name = "ironwire_reactor_cpu_seconds_total";
    let mut f = Family::new(&mut out, name, "counter", "CPU time of the reactor's thread (user and system).");
    for r in &snap.reactors {
        f.sample(name, &format!("reactor=\"{}\"", r.index), r.cpu.as_secs_f64());
    }
    let name = "ironwire_reactor_idle_poll_seconds_total";
    let help = "Part of the reactor's CPU time spent spinning ([reactor] poll_us) without finding work; \
                its CPU time less this is its busy time.";
    let mut f = Family::new(&mut out, name, "counter", help);
    for r in &snap.reactors {
        f.sample(name, &format!("reactor=\"{}\"", r.index), r.idle_poll.as_secs_f64());
    }
    let name = "ironwire_reactor_receive_dry_total";
    let help = "Receives that found every buffer of the reactor's receive ring lent out and waited for one \
                (rising: raise [reactor] receive_buffers).";
    let mut f = Family::new(&mut out, name, "counter", help);
    for r in &snap.reactors {
        f.sample(name, &format!("reactor=\"{}\"", r.index), r.receive_dry);
    }
    let name = "ironwire_reactor_connections";
    let mut f = Family::new(&mut out, name, "gauge", "Connections the reactor serves.");
    for r in &snap.reactors {
        f.sample(name, &format!("reactor=\"{}\"", r.index), r.connections);
    }
    let name = "ironwire_reactor_allocations_total";
    let mut f = Family::new(&mut out, name, "counter", "Heap allocations made by the reactor's thread.");
    for r in &snap.reactors {
        f.sample(name, &format!("reactor=\"{}\"", r.index), r.allocations);
    }
    let name = "ironwire_hosts_connected";
    let mut f =
        Family::new(&mut out, name, "gauge", "Connections logged in (NVMe queues, iSCSI sessions), by protocol.");
    for proto in ["nvme-tcp", "nvme-rdma", "iscsi"] {
        let n = hosts.iter().filter(|h| h.protocol == proto && h.login.is_some()).count();
        f.sample(name, &format!("protocol=\"{proto}\""), n);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_logged_ten_in_ten_seconds_and_the_rest_counted() {
        let mut r = Refusals::default();
        for _ in 0..12 {
            r.log("peer", "why");
        }
        assert_eq!((r.logged, r.left_out), (10, 2), "a scanner's flood is counted, not logged");
        r.window_start = r.window_start.and_then(|t| t.checked_sub(REFUSAL_WINDOW));
        r.log("peer", "why");
        assert_eq!((r.logged, r.left_out), (1, 0), "a new window logs again and says how many were left out");
    }

    #[test]
    fn the_grafana_dashboard_uses_only_metrics_we_serve() {
        let dashboard = include_str!("../../../docs/grafana/ironwire.json");
        let served = render(&Snapshot::default(), &[]);
        let mut checked = 0;
        for (at, _) in dashboard.match_indices("ironwire_") {
            let name: String = dashboard
                .get(at..)
                .unwrap_or_default()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let family = name.strip_suffix("_bucket").unwrap_or(&name);
            assert!(served.contains(&format!("# TYPE {family} ")), "the dashboard's {name} is not served");
            checked += 1;
        }
        assert!(checked > 10, "only {checked} metric names found in the dashboard");
    }

    #[test]
    fn renders_counters_and_cumulative_buckets_with_escaped_labels() {
        let mut snap = Snapshot::default();
        let mut t = Totals { reads: 3, read_bytes: 12288, ..Totals::default() };
        t.latency[0].buckets[0] = 2;
        t.latency[0].buckets[3] = 1;
        t.latency[0].sum_us = 9;
        snap.scopes.insert(Scope::Namespace { subsystem: "nqn.a\"b".into(), nsid: 1 }, t);
        let text = render(&snap, &[]);
        assert!(text.contains("# TYPE ironwire_namespace_reads_total counter\n"), "{text}");
        assert!(text.contains("ironwire_namespace_reads_total{subsystem=\"nqn.a\\\"b\",nsid=\"1\"} 3\n"), "{text}");
        assert!(text.contains("ironwire_namespace_read_bytes_total{subsystem=\"nqn.a\\\"b\",nsid=\"1\"} 12288\n"));
        let bucket = "ironwire_namespace_io_latency_seconds_bucket{subsystem=\"nqn.a\\\"b\",nsid=\"1\",op=\"read\"";
        assert!(text.contains(&format!("{bucket},le=\"0.000001\"}} 2\n")), "{text}");
        assert!(text.contains(&format!("{bucket},le=\"0.000004\"}} 2\n")), "{text}");
        assert!(text.contains(&format!("{bucket},le=\"0.000008\"}} 3\n")), "{text}");
        assert!(text.contains(&format!("{bucket},le=\"+Inf\"}} 3\n")), "{text}");
        assert!(text.contains(
            "ironwire_namespace_io_latency_seconds_sum{subsystem=\"nqn.a\\\"b\",nsid=\"1\",op=\"read\"} 0.000009\n"
        ));
        assert!(text.contains(
            "ironwire_namespace_io_latency_seconds_count{subsystem=\"nqn.a\\\"b\",nsid=\"1\",op=\"read\"} 3\n"
        ));
        // Every sample line belongs to a family declared before it.
        let mut declared = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                declared.push(rest.split(' ').next().unwrap_or_default().to_string());
            } else if !line.starts_with('#') {
                let name = line.split('{').next().unwrap_or_default();
                assert!(
                    declared
                        .iter()
                        .any(|d| name == d || name.strip_prefix(d.as_str()).is_some_and(|s| s.starts_with('_'))),
                    "{line} has no TYPE line"
                );
            }
        }
    }
}
