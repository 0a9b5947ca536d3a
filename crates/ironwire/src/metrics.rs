//! The Prometheus endpoint (`[metrics] listen`): `GET /metrics` answers
//! the counters of `stats` in the text exposition format 0.0.4.
//!
//! It runs on a thread of its own with blocking std I/O, like the control
//! socket, and never on a reactor: a scrape costs the reactors only the
//! table locks `stats::snapshot` takes. It is bounded: one client at a
//! time, a request head of at most 8 KiB, and read and write timeouts, so
//! a client that stalls holds the endpoint for seconds at most.

use crate::stats::{self, Scope, Snapshot, Totals};
use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// The longest request head (request line and headers) read.
const MAX_REQUEST: usize = 8192;
/// How long a client may take to send its request, or to take the answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds `addr` (so that a taken address fails the start) and serves it
/// from a thread named `metrics`; returns the bound address.
pub fn spawn(addr: SocketAddr) -> Result<SocketAddr> {
    let listener = TcpListener::bind(addr).with_context(|| format!("[metrics] listen {addr}"))?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new().name("metrics".into()).spawn(move || {
        for stream in listener.incoming() {
            match stream {
                Ok(s) => serve_client(s),
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

fn serve_client(mut s: TcpStream) {
    let _ = s.set_read_timeout(Some(CLIENT_TIMEOUT));
    let _ = s.set_write_timeout(Some(CLIENT_TIMEOUT));
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_REQUEST {
            respond(&mut s, "431 Request Header Fields Too Large", "text/plain", "request head too large\n");
            return;
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(buf.get(..n).unwrap_or_default()),
        }
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split(' ');
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => {
            let body = render(&stats::snapshot(), &stats::hosts());
            respond(&mut s, "200 OK", "text/plain; version=0.0.4; charset=utf-8", &body);
        }
        ("GET", "/") => respond(&mut s, "200 OK", "text/plain", "ironwire: metrics at /metrics\n"),
        ("GET", _) => respond(&mut s, "404 Not Found", "text/plain", "not found; try /metrics\n"),
        _ => respond(&mut s, "405 Method Not Allowed", "text/plain", "only GET\n"),
    }
}

fn respond(s: &mut TcpStream, status: &str, content_type: &str, body: &str) {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(head.as_bytes()).and_then(|()| s.write_all(body.as_bytes()));
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
