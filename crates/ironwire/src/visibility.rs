//! The control socket's read commands on what the daemon is doing: `stats`
//! (per namespace, LUN, port and reactor) and `hosts` / `sessions` (who is
//! connected), as text lines or, with `--json`, one JSON document.
//! Statuses and sense appear by name. Besides reading `stats`, it picks
//! the connections `disconnect` shuts down.

use crate::stats::{self, Failure, Host, Latency, Login, Scope, Snapshot, Totals};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::time::SystemTime;

/// The quantiles `ctl stats` shows.
const QUANTILES: [(&str, f64); 4] = [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)];

fn latency_text(name: &str, l: &Latency) -> String {
    if l.count() == 0 {
        return String::new();
    }
    let mut out = format!(" {name}_lat_us");
    for (q, v) in QUANTILES {
        match l.quantile_us(v) {
            Some(us) => {
                let _ = write!(out, " {q}<={us}");
            }
            None => {
                let _ = write!(out, " {q}>{}", stats::bucket_bound_us(stats::BUCKETS - 2).unwrap_or(0));
            }
        }
    }
    out
}

fn totals_text(t: &Totals) -> String {
    let mut out = format!(
        "reads={} writes={} other={} read_bytes={} write_bytes={} errors={}",
        t.reads, t.writes, t.other, t.read_bytes, t.write_bytes, t.errors
    );
    for (name, l) in ["read", "write", "other"].iter().zip(&t.latency) {
        out.push_str(&latency_text(name, l));
    }
    if let Some(f) = t.last_error {
        let _ = write!(out, " last_error=\"{f}\"");
    }
    out
}

/// `stats` lines after the process's CPU: reactors, namespaces, LUNs,
/// ports.
pub fn stats_text(snap: &Snapshot) -> String {
    let mut out = String::new();
    for r in &snap.reactors {
        let _ = writeln!(
            out,
            "reactor {} busy={:.1}% connections={} cpu_us={} idle_poll_us={} receive_dry={} allocs={}",
            r.index,
            r.busy_percent,
            r.connections,
            r.cpu.as_micros(),
            r.idle_poll.as_micros(),
            r.receive_dry,
            r.allocations
        );
    }
    for (s, t) in &snap.scopes {
        let what = match s {
            Scope::Namespace { subsystem, nsid } => format!("namespace {subsystem} {nsid}"),
            Scope::Lun { target, lun } => format!("lun {target} {lun}"),
        };
        let _ = writeln!(out, "{what} {}", totals_text(t));
    }
    for (a, p) in &snap.ports {
        let _ = writeln!(out, "port {a} connections={} accepted={} {}", p.open, p.accepted, totals_text(&p.io));
    }
    out
}

fn latency_json(l: &Latency) -> Value {
    let mut v = json!({ "count": l.count(), "sum_us": l.sum_us });
    for (q, x) in QUANTILES {
        v[format!("{q}_us")] = json!(l.quantile_us(x));
    }
    v["buckets"] = Value::Array(
        l.buckets.iter().enumerate().map(|(i, n)| json!({ "le_us": stats::bucket_bound_us(i), "count": n })).collect(),
    );
    v
}

fn failure_json(f: Option<Failure>) -> Value {
    match f {
        None => Value::Null,
        Some(f) => {
            let code = match f {
                Failure::Nvme(s) => {
                    json!({ "sct": s.sct(), "sc": s.sc(), "dnr": s.0 & nvme_spec::Status::DNR_BIT != 0 })
                }
                Failure::Scsi { key, asc, ascq } => json!({ "key": key, "asc": asc, "ascq": ascq }),
                Failure::ScsiStatus(st) => json!({ "status": st }),
            };
            json!({ "name": f.to_string(), "code": code })
        }
    }
}

fn totals_json(t: &Totals) -> Value {
    json!({
        "reads": t.reads,
        "writes": t.writes,
        "other": t.other,
        "read_bytes": t.read_bytes,
        "write_bytes": t.write_bytes,
        "errors": t.errors,
        "last_error": failure_json(t.last_error),
        "latency": {
            "read": latency_json(&t.latency[0]),
            "write": latency_json(&t.latency[1]),
            "other": latency_json(&t.latency[2]),
        },
    })
}

/// `stats --json`.
pub fn stats_json(snap: &Snapshot) -> String {
    let (user, system) = crate::cpu::self_cpu();
    let mut namespaces = Vec::new();
    let mut luns = Vec::new();
    for (s, t) in &snap.scopes {
        let mut v = totals_json(t);
        match s {
            Scope::Namespace { subsystem, nsid } => {
                v["subsystem"] = json!(subsystem);
                v["nsid"] = json!(nsid);
                namespaces.push(v);
            }
            Scope::Lun { target, lun } => {
                v["target"] = json!(target);
                v["lun"] = json!(lun);
                luns.push(v);
            }
        }
    }
    let ports: Vec<Value> = snap
        .ports
        .iter()
        .map(|(a, p)| {
            let mut v = totals_json(&p.io);
            v["port"] = json!(a.to_string());
            v["connections"] = json!(p.open);
            v["accepted"] = json!(p.accepted);
            v
        })
        .collect();
    let reactors: Vec<Value> = snap
        .reactors
        .iter()
        .map(|r| {
            json!({
                "reactor": r.index,
                "busy_percent": (r.busy_percent * 10.0).round() / 10.0,
                "connections": r.connections,
                "cpu_us": r.cpu.as_micros() as u64,
                "idle_poll_us": r.idle_poll.as_micros() as u64,
                "receive_dry": r.receive_dry,
                "allocations": r.allocations,
            })
        })
        .collect();
    let doc = json!({
        "process": { "user_us": user.as_micros() as u64, "system_us": system.as_micros() as u64 },
        "reactors": reactors,
        "namespaces": namespaces,
        "luns": luns,
        "ports": ports,
    });
    format!("{doc:#}\n")
}

/// `2026-11-25T00:59:19Z`.
fn utc(t: SystemTime) -> String {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (the proleptic Gregorian
    // calendar, eras of 400 years).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// An NVMe controller: its queues, which are connections of their own.
struct Controller<'a> {
    hostnqn: &'a str,
    subsystem: &'a str,
    cntlid: u16,
    queues: Vec<(&'a Host, u16, u32, (bool, bool))>,
}

fn controllers(hosts: &[Host]) -> Vec<Controller<'_>> {
    let mut out: Vec<Controller> = Vec::new();
    for h in hosts {
        let Some(Login::Nvme { hostnqn, subsystem, cntlid, qid, depth, digests }) = &h.login else { continue };
        let q = (h, *qid, *depth, *digests);
        match out.iter_mut().find(|c| c.subsystem == subsystem && c.cntlid == *cntlid) {
            Some(c) => c.queues.push(q),
            None => out.push(Controller { hostnqn, subsystem, cntlid: *cntlid, queues: vec![q] }),
        }
    }
    for c in &mut out {
        c.queues.sort_by_key(|q| q.1);
    }
    out
}

/// A name a host chose (its NQN, an initiator or target name it sent) as
/// one word of a `hosts` line: a space would make up a field, a newline a
/// line, and a line `ok` or `error: ...` would end the ctl reply there.
/// Those, other control characters and `\` are written `\u{a}`.
fn word(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if c == '\\' || c.is_whitespace() || c.is_control() {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// `hosts` (and `sessions`): one line per NVMe controller and per iSCSI
/// session, then connections that have not logged in yet.
pub fn hosts_text(hosts: &[Host]) -> String {
    let mut out = String::new();
    for c in controllers(hosts) {
        let Some(&(first, _, _, (hd, dd))) = c.queues.first() else { continue };
        let queues: Vec<String> = c.queues.iter().map(|(_, qid, depth, _)| format!("{qid}:{depth}")).collect();
        let _ = writeln!(
            out,
            "{} host={} subsystem={} cntlid={} address={} port={} queues={} hdgst={} ddgst={} chap=none since={}",
            first.protocol,
            word(c.hostnqn),
            c.subsystem,
            c.cntlid,
            first.peer.ip(),
            first.port,
            queues.join(","),
            on_off(hd),
            on_off(dd),
            utc(first.since)
        );
    }
    for h in hosts {
        match &h.login {
            Some(Login::Iscsi { initiator, target, tsih, isid, depth, digests, chap }) => {
                let _ = writeln!(
                    out,
                    "iscsi initiator={} target={} tsih={tsih} isid=0x{isid} address={} port={} \
                     queue_depth={depth} header_digest={} data_digest={} chap={} since={}",
                    word(initiator),
                    target.as_deref().map_or_else(|| "(discovery)".to_string(), word),
                    h.peer,
                    h.port,
                    on_off(digests.0),
                    on_off(digests.1),
                    chap.replace(' ', "-"),
                    utc(h.since)
                );
            }
            Some(Login::Nvme { .. }) => {}
            None => {
                let _ = writeln!(
                    out,
                    "{} connecting address={} port={} since={}",
                    h.protocol,
                    h.peer,
                    h.port,
                    utc(h.since)
                );
            }
        }
    }
    out
}

/// `hosts --json`.
pub fn hosts_json(hosts: &[Host]) -> String {
    let nvme: Vec<Value> = controllers(hosts)
        .iter()
        .map(|c| {
            let queues: Vec<Value> = c
                .queues
                .iter()
                .map(|(h, qid, depth, (hd, dd))| {
                    json!({
                        "qid": qid,
                        "depth": depth,
                        "address": h.peer.to_string(),
                        "reactor": h.reactor,
                        "header_digest": hd,
                        "data_digest": dd,
                        "since": utc(h.since),
                    })
                })
                .collect();
            let first = c.queues.first().map(|q| q.0);
            json!({
                "protocol": first.map(|h| h.protocol),
                "hostnqn": c.hostnqn,
                "subsystem": c.subsystem,
                "cntlid": c.cntlid,
                "port": first.map(|h| h.port.to_string()),
                "chap": "none",
                "since": first.map(|h| utc(h.since)),
                "connected_s": first.map(|h| h.connected.as_secs()),
                "queues": queues,
            })
        })
        .collect();
    let mut iscsi = Vec::new();
    let mut connecting = Vec::new();
    for h in hosts {
        match &h.login {
            Some(Login::Iscsi { initiator, target, tsih, isid, depth, digests, chap }) => iscsi.push(json!({
                "initiator": initiator,
                "target": target,
                "tsih": tsih,
                "isid": format!("0x{isid}"),
                "address": h.peer.to_string(),
                "port": h.port.to_string(),
                "reactor": h.reactor,
                "queue_depth": depth,
                "header_digest": digests.0,
                "data_digest": digests.1,
                "chap": chap,
                "since": utc(h.since),
                "connected_s": h.connected.as_secs(),
            })),
            Some(Login::Nvme { .. }) => {}
            None => connecting.push(json!({
                "protocol": h.protocol,
                "address": h.peer.to_string(),
                "port": h.port.to_string(),
                "since": utc(h.since),
            })),
        }
    }
    format!("{:#}\n", json!({ "nvme": nvme, "iscsi": iscsi, "connecting": connecting }))
}

/// Runs a read command (`stats`, `hosts`, `sessions`, each with an
/// optional `--json`); `None` when `words` is not one.
pub fn handle(words: &[&str], process_lines: impl FnOnce() -> String) -> Option<anyhow::Result<String>> {
    let (cmd, json) = match words {
        [cmd] => (*cmd, false),
        [cmd, "--json"] => (*cmd, true),
        _ => return None,
    };
    Some(Ok(match (cmd, json) {
        ("stats", false) => process_lines() + &stats_text(&stats::snapshot()),
        ("stats", true) => stats_json(&stats::snapshot()),
        ("hosts" | "sessions", false) => hosts_text(&stats::hosts()),
        ("hosts" | "sessions", true) => hosts_json(&stats::hosts()),
        _ => return None,
    }))
}

/// Which connections `ctl disconnect` closes: every key given must match.
/// NVMe keys (`host`, `nqn`, `cntlid`) pick the queues of NVMe
/// controllers, iSCSI keys (`initiator`, `iqn`) the connections of
/// sessions, and `address` any connection from that IP address (logged in
/// or not).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Selector {
    host: Option<String>,
    nqn: Option<String>,
    cntlid: Option<u16>,
    initiator: Option<String>,
    iqn: Option<String>,
    address: Option<std::net::IpAddr>,
}

impl Selector {
    /// Parses `key=value` words; at least one key is needed.
    pub fn parse(args: &[&str]) -> anyhow::Result<Selector> {
        let mut s = Selector::default();
        for a in args {
            let Some((k, v)) = a.split_once('=') else {
                anyhow::bail!("{a:?}: expected key=value (keys: {})", Self::KEYS);
            };
            let v = v.to_string();
            match k {
                "host" => s.host = Some(v),
                "nqn" => s.nqn = Some(v),
                "cntlid" => s.cntlid = Some(v.parse().map_err(|_| anyhow::anyhow!("cntlid={v}: expected 0..=65535"))?),
                "initiator" => s.initiator = Some(v),
                "iqn" => s.iqn = Some(v),
                "address" => {
                    s.address = Some(v.parse().map_err(|_| anyhow::anyhow!("address={v}: expected an IP address"))?)
                }
                _ => anyhow::bail!("unknown key {k:?} (keys: {})", Self::KEYS),
            }
        }
        if s == Selector::default() {
            anyhow::bail!("say which connections: one or more of {}", Self::KEYS);
        }
        if (s.host.is_some() || s.nqn.is_some() || s.cntlid.is_some()) && (s.initiator.is_some() || s.iqn.is_some()) {
            anyhow::bail!("NVMe keys (host, nqn, cntlid) and iSCSI keys (initiator, iqn) pick different connections: give one kind");
        }
        Ok(s)
    }

    const KEYS: &'static str = "host=, nqn=, cntlid= (NVMe), initiator=, iqn= (iSCSI), address=";

    /// Whether the connection `h` is one of those picked.
    pub fn matches(&self, h: &Host) -> bool {
        let same = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        // iSCSI names compare without case, as at login (RFC 3722).
        let same_name =
            |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w.eq_ignore_ascii_case(have));
        if self.address.is_some_and(|a| a.to_canonical() != h.peer.ip().to_canonical()) {
            return false;
        }
        let nvme_keys = self.host.is_some() || self.nqn.is_some() || self.cntlid.is_some();
        let iscsi_keys = self.initiator.is_some() || self.iqn.is_some();
        match &h.login {
            Some(Login::Nvme { hostnqn, subsystem, cntlid, .. }) => {
                !iscsi_keys
                    && same(&self.host, hostnqn)
                    && same(&self.nqn, subsystem)
                    && self.cntlid.is_none_or(|c| c == *cntlid)
            }
            Some(Login::Iscsi { initiator, target, .. }) => {
                !nvme_keys
                    && same_name(&self.initiator, initiator)
                    && self.iqn.as_deref().is_none_or(|w| target.as_deref().is_some_and(|t| t.eq_ignore_ascii_case(w)))
            }
            None => !nvme_keys && !iscsi_keys,
        }
    }
}

/// Runs `ctl disconnect key=value...`: shuts down the connections picked
/// and lists them (in the `hosts` form).
pub fn disconnect(args: &[&str]) -> anyhow::Result<String> {
    let select = Selector::parse(args)?;
    let closed = stats::disconnect(|h| select.matches(h));
    Ok(format!("closed {} connection(s)\n{}", closed.len(), hosts_text(&closed)))
}

#[cfg(test)]
mod tests {
    use super::{utc, Selector};
    use crate::stats::{Host, Login};
    use std::time::{Duration, SystemTime};

    fn host(peer: &str, login: Option<Login>) -> Host {
        Host {
            protocol: if matches!(login, Some(Login::Iscsi { .. })) { "iscsi" } else { "nvme-tcp" },
            port: "127.0.0.1:4420".parse().expect("addr"),
            peer: peer.parse().expect("addr"),
            reactor: 0,
            since: SystemTime::UNIX_EPOCH,
            connected: Duration::ZERO,
            login,
        }
    }

    fn nvme(hostnqn: &str, subsystem: &str, cntlid: u16) -> Option<Login> {
        let (hostnqn, subsystem) = (hostnqn.to_string(), subsystem.to_string());
        Some(Login::Nvme { hostnqn, subsystem, cntlid, qid: 0, depth: 32, digests: (false, false) })
    }

    fn iscsi(initiator: &str, target: Option<&str>) -> Option<Login> {
        Some(Login::Iscsi {
            initiator: initiator.to_string(),
            target: target.map(str::to_string),
            tsih: 1,
            isid: "00".into(),
            depth: 32,
            digests: (false, false),
            chap: "none",
        })
    }

    #[test]
    fn disconnect_keys_must_name_some_connections_of_one_kind() {
        for bad in [&[][..], &["bogus=1"], &["host"], &["cntlid=x"], &["address=host"], &["host=h", "iqn=t"]] {
            assert!(Selector::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Selector::parse(&["host=h", "nqn=n", "cntlid=3", "address=10.0.0.1"]).is_ok());
    }

    #[test]
    fn disconnect_picks_by_every_key_given() {
        let a = host("10.0.0.1:5000", nvme("h1", "s1", 1));
        let b = host("10.0.0.2:5000", nvme("h2", "s1", 2));
        let c = host("10.0.0.1:6000", iscsi("i1", Some("t1")));
        let d = host("10.0.0.1:7000", iscsi("i1", None));
        let e = host("10.0.0.1:8000", None);
        let picks = |args: &[&str]| -> Vec<bool> {
            let s = Selector::parse(args).expect("selector");
            [&a, &b, &c, &d, &e].iter().map(|h| s.matches(h)).collect()
        };
        assert_eq!(picks(&["host=h1"]), [true, false, false, false, false]);
        assert_eq!(picks(&["nqn=s1"]), [true, true, false, false, false]);
        assert_eq!(picks(&["nqn=s1", "cntlid=2"]), [false, true, false, false, false]);
        assert_eq!(picks(&["initiator=i1"]), [false, false, true, true, false]);
        assert_eq!(picks(&["initiator=i1", "iqn=t1"]), [false, false, true, false, false]);
        assert_eq!(picks(&["address=10.0.0.1"]), [true, false, true, true, true]);
        assert_eq!(picks(&["address=10.0.0.1", "nqn=s1"]), [true, false, false, false, false]);
        assert!(
            !Selector::parse(&["initiator=i1", "iqn=t1"]).expect("sel").matches(&d),
            "a discovery session has no target"
        );
    }

    #[test]
    fn formats_utc_dates() {
        let at = |s: u64| utc(SystemTime::UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_795_564_759), "2026-11-24T23:59:19Z");
    }
}
