//! Operating the daemon: a refused reload changes nothing, check-config
//! refuses what serve refuses, saved files stay private, sizes TOML cannot
//! hold are refused up front, the control socket's group reaches it
//! through a directory made before, and the metrics exposition is
//! well-formed with counters that never go back.

mod common;

use common::{block_on, bounded, Daemon};
use initiator::{Controller, Options};
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const NQN_A: &str = "nqn.2026-11.io.ironwire:ops-a";
const NQN_B: &str = "nqn.2026-11.io.ironwire:ops-b";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:ops-host";

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ironwire"))
}

fn ok(d: &Daemon, words: &str) -> String {
    d.ctl(words).unwrap_or_else(|e| panic!("ctl {words}: {e}\nlog:\n{}", d.log()))
}

fn show(d: &Daemon) -> serde_json::Value {
    serde_json::from_str(&ok(d, "show --json")).expect("show --json is JSON")
}

/// nvmf's derivation of a namespace's NGUID (crates/nvmf/src/model.rs
/// `hash128` of "NQN/NSID/DEVICE"), to configure one equal to it.
fn derived_nguid(nqn: &str, nsid: u32, device: &str) -> String {
    let bytes = format!("{nqn}/{nsid}/{device}");
    let mut a: u64 = 0xcbf2_9ce4_8422_2325;
    let mut b: u64 = 0x8422_2325_cbf2_9ce4;
    for &x in bytes.as_bytes() {
        a = (a ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3);
        b = (b ^ u64::from(x.rotate_left(3))).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{a:016x}{b:016x}")
}

/// Two RAM devices, subsystem A (ns 1 on r0) and B (ns 1 on r1); `extra`
/// is appended to B's namespaces and `extra_a` to A's.
fn two_subsystems(port: u16, extra_a: &str, extra_b: &str) -> String {
    format!(
        "[[device]]\nname = \"r0\"\nkind = \"ram\"\nsize = \"1MiB\"\n\n\
         [[device]]\nname = \"r1\"\nkind = \"ram\"\nsize = \"1MiB\"\n\n\
         [[subsystem]]\nnqn = \"{NQN_A}\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nnsid = 1\ndevice = \"r0\"\n{extra_a}\n\
         [[subsystem]]\nnqn = \"{NQN_B}\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nnsid = 1\ndevice = \"r1\"\n{extra_b}\n\
         [[port]]\naddress = \"127.0.0.1:{port}\"\n\n[reactor]\ncores = [0]\n"
    )
}

/// B's namespace 2 configured with the NGUID B's namespace 1 derives:
/// `validate` (check-config) checks only configured identifiers against
/// each other, `Subsystem::add_namespace` refuses the duplicate.
fn colliding_b() -> String {
    format!("[[subsystem.namespace]]\nnsid = 2\ndevice = \"r0\"\nnguid = \"{}\"\n", derived_nguid(NQN_B, 1, "r1"))
}

/// A reload refused for what adding a namespace would refuse (a
/// duplicate NGUID) changes nothing: before, the steps applied before the
/// failure stayed live while `save` kept the old configuration, so `show`
/// and `save` disagreed and a restart dropped what hosts saw.
#[test]
fn a_reload_that_fails_while_applying_changes_nothing() {
    let d = Daemon::start_with("ops-reload", |_, port| two_subsystems(port, "", ""));
    let before = show(&d);
    // A gains namespace 2 (applied first), B's namespace 2 then fails.
    let text = std::fs::read_to_string(d.dir.join("ironwire.toml")).expect("config");
    let port: u16 = d.addr.port();
    assert!(text.contains(&port.to_string()));
    let a_ns2 = "[[subsystem.namespace]]\nnsid = 2\ndevice = \"r1\"\n";
    std::fs::write(d.dir.join("ironwire.toml"), two_subsystems(port, a_ns2, &colliding_b())).expect("rewrite");
    let e = d.ctl("reload").expect_err("the reload is refused (duplicate NGUID)");
    assert!(e.contains("NGUID"), "{e}");
    let after = show(&d);
    assert_eq!(after["config"], before["config"], "the running configuration is unchanged");
    let nsids = |v: &serde_json::Value| -> Vec<u64> {
        v["live"]["subsystems"][0]["namespaces"]
            .as_array()
            .expect("ns")
            .iter()
            .filter_map(|n| n["nsid"].as_u64())
            .collect()
    };
    assert_eq!(
        nsids(&after),
        nsids(&before),
        "a refused reload left subsystem {NQN_A} with other namespaces live than `save` reports:\nsave:\n{}",
        ok(&d, "save")
    );
}

/// check-config refuses what serve refuses: a configured NGUID equal to
/// another namespace's derived one (it said OK before).
#[test]
fn check_config_refuses_what_serve_refuses() {
    let dir = std::env::temp_dir().join(format!("ironwire-test-ops-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
    let cfg = dir.join("c.toml");
    std::fs::write(&cfg, two_subsystems(port, "", &colliding_b())).expect("write");
    let check = Command::new(exe()).arg("check-config").arg(&cfg).output().expect("check-config");
    let sock = dir.join("ctl.sock");
    let (status, err) =
        common::serve_until_exit(&["--config".as_ref(), cfg.as_os_str(), "--ctl-socket".as_ref(), sock.as_os_str()]);
    let _ = std::fs::remove_dir_all(&dir);
    let serve_failed = status.is_some_and(|s| !s.success());
    assert!(serve_failed, "serve was expected to refuse the file");
    assert!(
        !check.status.success(),
        "check-config accepted a file serve refuses:\ncheck-config: {}serve: {err}",
        String::from_utf8_lossy(&check.stdout)
    );
}

/// `serve --persist` rewrites the configuration file (which may hold CHAP
/// secrets) with the file's own mode: a 0600 file stays 0600 (it became
/// 0644, the umask's, after the first ctl change).
#[test]
fn persist_keeps_the_configuration_file_private() {
    let d = Daemon::start_args("ops-persist", &["--persist"], |_, port| {
        two_subsystems(port, "", "")
            + "\n[[port]]\ntransport = \"iscsi\"\naddress = \"127.0.0.1:"
            + &(port + 1).to_string()
            + "\"\n"
    });
    let cfg = d.dir.join("ironwire.toml");
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
    ok(&d, "set discovery_chap user=disc secret=discovery-secret-0123");
    let text = std::fs::read_to_string(&cfg).expect("persisted");
    assert!(text.contains("discovery-secret-0123"), "{text}");
    let mode = std::fs::metadata(&cfg).expect("stat").mode() & 0o777;
    assert_eq!(mode, 0o600, "--persist rewrote a 0600 file holding CHAP secrets as {mode:o}");
}

/// A size the parser would accept but TOML cannot hold (more than
/// i64::MAX bytes) is refused up front, naming it: accepted, it made
/// `save` fail, and with it every later ctl edit.
#[test]
fn a_size_toml_cannot_hold_is_refused_and_save_and_later_edits_work() {
    let d = Daemon::start_with("ops-bigsize", |_, port| two_subsystems(port, "", ""));
    // 9000000 TiB: 9.9e18 bytes, above i64::MAX (9.2e18), below u64::MAX.
    let added = d.ctl("add device name=big kind=null size=9000000T");
    let e = added.expect_err("refused");
    assert!(e.contains("9000000T") && e.contains("9223372036854775807"), "{e}");
    d.ctl("save").expect("save");
    d.ctl("add device name=x kind=ram size=1MiB").expect("a later add");
}

/// With `[control] group`, a socket directory that already exists 0700
/// (what the shipped unit's RuntimeDirectoryMode=0700 makes of
/// /run/ironwire) is given to the group, 0750, so its members reach the
/// 0660 socket (they were refused before, without a word at start).
#[test]
fn with_a_group_an_existing_0700_directory_still_lets_members_in() {
    assert_eq!(unsafe { libc::geteuid() }, 0, "run as root");
    let groups = std::fs::read_to_string("/etc/group").expect("/etc/group");
    let group = groups
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.get(2) == Some(&"65534")).then(|| f[0].to_string())
        })
        .expect("a group with gid 65534");
    let d = Daemon::start_with_config_socket("ops-group", |dir, port| {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).expect("chmod");
        // As systemd's RuntimeDirectory=ironwire, RuntimeDirectoryMode=0700.
        let run = dir.join("run");
        let _ = std::fs::create_dir(&run);
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).expect("chmod run");
        two_subsystems(port, "", "")
            + &format!("\n[control]\nsocket = \"{}/run/ctl.sock\"\ngroup = \"{group}\"\n", dir.display())
    });
    let sock = d.dir.join("run/ctl.sock");
    use std::os::unix::process::CommandExt;
    let out = Command::new(exe())
        .args(["ctl", "--socket"])
        .arg(&sock)
        .arg("show")
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::null())
        .output()
        .expect("ctl as nobody");
    assert!(
        out.status.success(),
        "a member of [control] group {group} cannot use the socket (dir mode {:o}): {}",
        std::fs::metadata(d.dir.join("run")).expect("stat").mode() & 0o777,
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---- metrics: a strict exposition-format checker ----

#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

fn valid_metric_name(n: &str) -> bool {
    let mut c = n.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

fn valid_label_name(n: &str) -> bool {
    let mut c = n.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
        && !n.starts_with("__")
}

/// Parses `name{a="b",...} value` strictly; panics naming the line.
fn parse_sample(line: &str) -> Sample {
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => panic!("no value: {line}"),
    };
    assert!(valid_metric_name(name), "bad metric name in {line}");
    let mut labels = BTreeMap::new();
    let rest = if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices().peekable();
        let end;
        loop {
            // label name
            let start = chars.peek().map(|(i, _)| *i).expect("label");
            if body[start..].starts_with('}') {
                end = Some(start + 1);
                break;
            }
            let mut lname = String::new();
            while let Some(&(_, ch)) = chars.peek() {
                if ch == '=' {
                    break;
                }
                lname.push(ch);
                chars.next();
            }
            assert!(valid_label_name(&lname), "bad label name {lname:?} in {line}");
            assert_eq!(chars.next().map(|c| c.1), Some('='), "{line}");
            assert_eq!(chars.next().map(|c| c.1), Some('"'), "{line}");
            let mut v = String::new();
            loop {
                match chars.next().map(|c| c.1) {
                    Some('\\') => match chars.next().map(|c| c.1) {
                        Some('\\') => v.push('\\'),
                        Some('"') => v.push('"'),
                        Some('n') => v.push('\n'),
                        other => panic!("bad escape {other:?} in {line}"),
                    },
                    Some('"') => break,
                    Some('\n') | None => panic!("unterminated label value in {line}"),
                    Some(c) => v.push(c),
                }
            }
            assert!(labels.insert(lname.clone(), v).is_none(), "label {lname} twice in {line}");
            match chars.next() {
                Some((_, ',')) => continue,
                Some((i, '}')) => {
                    end = Some(i + 1);
                    break;
                }
                other => panic!("expected , or }} after a label, got {other:?} in {line}"),
            }
        }
        &body[end.expect("end")..]
    } else {
        rest
    };
    let rest = rest.strip_prefix(' ').unwrap_or_else(|| panic!("no space before the value: {line}"));
    let mut parts = rest.split(' ');
    let v = parts.next().expect("value");
    let value = match v {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        _ => v.parse::<f64>().unwrap_or_else(|_| panic!("bad value {v:?} in {line}")),
    };
    if let Some(ts) = parts.next() {
        ts.parse::<i64>().unwrap_or_else(|_| panic!("bad timestamp in {line}"));
    }
    assert!(parts.next().is_none(), "trailing text in {line}");
    Sample { name: name.to_string(), labels, value }
}

/// Checks the whole exposition; returns the samples with their family's
/// type.
fn check_exposition(text: &str) -> Vec<(String, Sample)> {
    assert!(text.ends_with('\n'), "the exposition must end with a newline");
    let mut types: HashMap<String, String> = HashMap::new();
    let mut helps: HashMap<String, ()> = HashMap::new();
    let mut done: Vec<String> = Vec::new();
    let mut current: Option<String> = None;
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for line in text.lines() {
        assert!(!line.is_empty(), "empty line in the exposition");
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            assert!(valid_metric_name(name), "{line}");
            // Only \\ and \n are escapes in HELP.
            let mut it = help.chars();
            while let Some(c) = it.next() {
                if c == '\\' {
                    assert!(matches!(it.next(), Some('\\' | 'n')), "bad escape in HELP: {line}");
                }
            }
            assert!(helps.insert(name.to_string(), ()).is_none(), "HELP twice for {name}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(valid_metric_name(name), "{line}");
            assert!(matches!(kind, "counter" | "gauge" | "histogram" | "summary" | "untyped"), "{line}");
            assert!(types.insert(name.to_string(), kind.to_string()).is_none(), "TYPE twice for {name}");
            assert!(!done.contains(&name.to_string()), "family {name} declared after its samples");
            if let Some(c) = current.replace(name.to_string()) {
                done.push(c);
            }
            continue;
        }
        assert!(!line.starts_with('#') || line.starts_with("# "), "{line}");
        if line.starts_with('#') {
            continue;
        }
        let s = parse_sample(line);
        let family = types
            .iter()
            .filter(|(f, kind)| match kind.as_str() {
                "histogram" => [format!("{f}_bucket"), format!("{f}_sum"), format!("{f}_count")].contains(&s.name),
                _ => s.name == **f,
            })
            .map(|(f, _)| f.clone())
            .next()
            .unwrap_or_else(|| panic!("sample with no TYPE line: {line}"));
        assert_eq!(current.as_deref(), Some(family.as_str()), "sample of {family} outside its family's block: {line}");
        let kind = types.get(&family).cloned().unwrap_or_default();
        if kind == "counter" {
            assert!(s.value >= 0.0 && s.value.is_finite(), "negative or non-finite counter: {line}");
            assert!(s.name.ends_with("_total"), "counter without _total: {line}");
        }
        let key = format!("{}{:?}", s.name, s.labels);
        assert!(seen.insert(key), "duplicate series: {line}");
        out.push((kind, s));
    }
    // Histograms: per label set (without le), buckets ascending in le,
    // cumulative, ending at +Inf, with _count equal to +Inf and a _sum.
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut counts: BTreeMap<String, f64> = BTreeMap::new();
    let mut sums: BTreeMap<String, f64> = BTreeMap::new();
    for (kind, s) in &out {
        if kind != "histogram" {
            continue;
        }
        let mut l = s.labels.clone();
        let le = l.remove("le");
        if let Some(base) = s.name.strip_suffix("_bucket") {
            let le = le.expect("a bucket has le");
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().expect("le is a float") };
            series.entry(format!("{base}{l:?}")).or_default().push((le, s.value));
        } else if let Some(base) = s.name.strip_suffix("_count") {
            assert!(le.is_none());
            counts.insert(format!("{base}{l:?}"), s.value);
        } else if let Some(base) = s.name.strip_suffix("_sum") {
            sums.insert(format!("{base}{l:?}"), s.value);
        }
    }
    for (k, buckets) in &series {
        for w in buckets.windows(2) {
            assert!(w[0].0 < w[1].0, "{k}: le not ascending");
            assert!(w[0].1 <= w[1].1, "{k}: buckets not cumulative");
        }
        let last = buckets.last().expect("bucket");
        assert!(last.0.is_infinite(), "{k}: no +Inf bucket");
        assert_eq!(counts.get(k), Some(&last.1), "{k}: _count differs from the +Inf bucket");
        assert!(sums.contains_key(k), "{k}: no _sum");
    }
    out
}

fn scrape(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).expect("connect metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").expect("send");
    let mut reply = String::new();
    s.read_to_string(&mut reply).expect("read");
    let (head, body) = reply.split_once("\r\n\r\n").expect("head");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("Content-Length");
    assert_eq!(len, body.len(), "Content-Length");
    body.to_string()
}

fn nvme_io(addr: SocketAddr, nqn: &str, nsid: u32, rounds: usize) {
    block_on(bounded(30, async {
        let opts = Options { io_queues: 1, queue_size: 16, ..Options::default() };
        let mut c = Controller::connect(addr, nqn, HOST, opts).await.expect("connect");
        for i in 0..rounds {
            let data = vec![(i % 251) as u8; 4096];
            c.write(0, nsid, 0, data.clone()).await.expect("write");
            assert_eq!(c.read(0, nsid, 0, 8).await.expect("read"), data);
        }
        c.disconnect().await.expect("disconnect");
    }));
}

/// Sound check: the exposition is well formed and every counter series
/// only grows across connection churn, a reload that removes and re-adds
/// a namespace, and more I/O; the removed namespace's series goes with it
/// and comes back counting afresh (a counter reset, as Prometheus reads
/// one), not with counts from before.
#[test]
fn metrics_are_well_formed_and_counters_never_go_back() {
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("p").port();
    let body = move |port: u16, extra_b: &str| {
        two_subsystems(port, "", extra_b) + &format!("\n[metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n")
    };
    let d = Daemon::start_with("ops-metrics", |_, port| body(port, ""));
    let m = SocketAddr::from(([127, 0, 0, 1], metrics_port));
    nvme_io(d.addr, NQN_A, 1, 20);
    nvme_io(d.addr, NQN_B, 1, 5);
    let first = check_exposition(&scrape(m));
    // Reload without B's namespace 1, then with it again.
    let cfg = d.dir.join("ironwire.toml");
    let text = std::fs::read_to_string(&cfg).expect("cfg");
    let without = text.replace("[[subsystem.namespace]]\nnsid = 1\ndevice = \"r1\"\n", "");
    assert_ne!(without, text);
    std::fs::write(&cfg, &without).expect("write");
    ok(&d, "reload");
    let removed = check_exposition(&scrape(m));
    let is_b1 = |labels: &BTreeMap<String, String>| {
        labels.get("subsystem").map(String::as_str) == Some(NQN_B)
            && labels.get("nsid").map(String::as_str) == Some("1")
    };
    assert!(!removed.iter().any(|(_, s)| is_b1(&s.labels)), "the removed namespace's series stayed");
    std::fs::write(&cfg, &text).expect("write");
    ok(&d, "reload");
    for _ in 0..5 {
        nvme_io(d.addr, NQN_A, 1, 2);
    }
    nvme_io(d.addr, NQN_B, 1, 1);
    let second = check_exposition(&scrape(m));
    let b1_reads = second.iter().find(|(_, t)| t.name == "ironwire_namespace_reads_total" && is_b1(&t.labels));
    assert_eq!(b1_reads.map(|(_, t)| t.value), Some(1.0), "the re-added namespace counts its one read afresh");
    for (kind, s) in &first {
        if kind != "counter" && kind != "histogram" || is_b1(&s.labels) {
            continue;
        }
        if s.name.ends_with("_sum") || kind == "counter" || s.name.ends_with("_count") || s.name.ends_with("_bucket") {
            let after = second.iter().find(|(_, t)| t.name == s.name && t.labels == s.labels);
            let after = after.unwrap_or_else(|| panic!("{} {:?} disappeared", s.name, s.labels));
            assert!(after.1.value >= s.value, "{} {:?} went back: {} -> {}", s.name, s.labels, s.value, after.1.value);
        }
    }
}
