//! `ironwire bench` end to end: the binary loads the real daemon (started
//! on its own port with its own control socket) over NVMe/TCP and over
//! iSCSI, its in-process local baseline and its TCP ceiling, and the
//! numbers it prints must agree with each other (I/Os × block size =
//! bytes, reads + writes = I/Os). Verify runs clean against the daemon and
//! reports the first block the test corrupts behind the daemon's back.
//! Runs are 1–2 s; no figure is judged.

mod common;

use common::Daemon;
use serde_json::Value;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const NQN: &str = "nqn.2026-11.io.ironwire:bench";

impl Daemon {
    /// Starts the daemon serving `device` (a `[[device]]` body named "d")
    /// as namespace 1 of `NQN` over NVMe/TCP and NVMe/RDMA (one port), and waits for its ready line. A port taken
    /// between probing and binding is retried on another.
    fn start(tag: &str, device: &str) -> Daemon {
        Daemon::start_with(&format!("bench-{tag}"), |dir, port| {
            let device = device.replace("{dir}", &dir.display().to_string());
            format!(
                "[[device]]\nname = \"d\"\n{device}\n\n[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n\
                 [[subsystem.namespace]]\ndevice = \"d\"\n\n[[port]]\naddress = \"127.0.0.1:{port}\"\n\n\
                 [[port]]\ntransport = \"rdma\"\naddress = \"127.0.0.1:{port}\"\n\n[reactor]\ncores = [0]\n"
            )
        })
    }

    fn bench(&self, args: &[&str]) -> Output {
        let addr = self.addr.to_string();
        let mut all = vec!["run", "--nvme", &addr, "--nqn", NQN];
        all.extend_from_slice(args);
        bench(&all)
    }
}

/// Runs `ironwire bench ARGS...` with a bound on its run time.
fn bench(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ironwire"))
        .arg("bench")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ironwire bench");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("ironwire bench {args:?} did not finish in 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{v} is not an unsigned integer"))
}

/// The counts of a JSON result agree with each other and with `bs`.
fn assert_consistent(j: &Value, bs: u64) {
    let job = &j["jobs"][0];
    let (r, w) = (&job["read"], &job["write"]);
    let ios = u(&j["ironwire"]["ios"]);
    assert!(ios > 0, "{j}");
    assert_eq!(u(&r["total_ios"]) + u(&w["total_ios"]), ios, "reads + writes = I/Os");
    assert_eq!(u(&r["io_bytes"]), u(&r["total_ios"]) * bs, "read I/Os × bs = read bytes");
    assert_eq!(u(&w["io_bytes"]), u(&w["total_ios"]) * bs, "write I/Os × bs = written bytes");
    assert_eq!(u(&j["ironwire"]["bytes"]), ios * bs, "I/Os × bs = bytes");
    assert_eq!(u(&j["ironwire"]["lat_ns"]["N"]), ios, "one latency sample per I/O");
    for dir in [r, w] {
        if u(&dir["total_ios"]) > 0 {
            let p = &dir["clat_ns"]["percentile"];
            assert!(u(&dir["lat_ns"]["min"]) <= u(&p["50.000000"]));
            assert!(u(&p["50.000000"]) <= u(&p["99.000000"]) && u(&p["99.000000"]) <= u(&dir["lat_ns"]["max"]));
        }
    }
}

#[test]
fn bench_run_randrw_verify_against_the_daemon_is_clean_and_consistent() {
    let d = Daemon::start("randrw", "kind = \"ram\"\nsize = \"16MiB\"");
    let pid = d.pid().to_string();
    let out = d.bench(&[
        "--rw",
        "randrw",
        "--bs",
        "16k",
        "--qd",
        "8",
        "--jobs",
        "2",
        "--time",
        "1",
        "--ramp",
        "0.2",
        "--verify",
        "--hdgst",
        "--ddgst",
        "--target-pid",
        &pid,
        "--output",
        "json",
    ]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let j = json(&out);
    assert_consistent(&j, 16 << 10);
    let job = &j["jobs"][0];
    assert!(u(&job["read"]["total_ios"]) > 0 && u(&job["write"]["total_ios"]) > 0, "{j}");
    assert_eq!(u(&job["verify_errors"]), 0);
    assert!(job["first_verify_error"].is_null());
    assert_eq!(j["global options"]["numjobs"], 2);
    assert!(j["ironwire"]["target_cpu_percent"].is_number(), "target CPU is sampled from /proc/PID/stat");
    assert!(j["ironwire"]["load_cpu_percent"].is_number());
    assert!(out.stderr.is_empty() || !String::from_utf8_lossy(&out.stderr).contains("IOPS"), "no progress in json");
}

const IQN: &str = "iqn.2026-11.io.ironwire.test:bench";

/// The daemon serving a 16 MiB RAM LU 0 of `IQN` to any initiator over
/// iSCSI; `target_extra` adds lines to the `[[iscsi_target]]` table.
fn iscsi_daemon(tag: &str, target_extra: &str) -> Daemon {
    Daemon::start_with(tag, |_, port| {
        format!(
            "[[device]]\nname = \"d\"\nkind = \"ram\"\nsize = \"16MiB\"\nblock_size = 512\n\n\
             [[iscsi_target]]\niqn = \"{IQN}\"\nallow_any_initiator = true\n{target_extra}\
             [[iscsi_target.lun]]\nlun = 0\ndevice = \"d\"\n\n\
             [[port]]\ntransport = \"iscsi\"\naddress = \"127.0.0.1:{port}\"\n\n[reactor]\ncores = [0]\n"
        )
    })
}

#[test]
fn bench_run_iscsi_randrw_verify_against_the_daemon_is_clean_and_consistent() {
    let d = iscsi_daemon("bench-iscsi", "chap = { user = \"alice\", secret = \"alice-secret-1234\" }\n");
    let portal = d.addr.to_string();
    let out = bench(&[
        "run",
        "--iscsi",
        &portal,
        "--iqn",
        IQN,
        "--lun",
        "0",
        "--chap-user",
        "alice",
        "--chap-secret",
        "alice-secret-1234",
        "--hdgst",
        "--ddgst",
        "--rw",
        "randrw",
        "--bs",
        "16k",
        "--qd",
        "8",
        "--jobs",
        "2",
        "--time",
        "1",
        "--verify",
        "--output",
        "json",
    ]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let j = json(&out);
    assert_consistent(&j, 16 << 10);
    let job = &j["jobs"][0];
    assert!(u(&job["read"]["total_ios"]) > 0 && u(&job["write"]["total_ios"]) > 0, "{j}");
    assert_eq!(u(&job["verify_errors"]), 0);
    assert!(job["first_verify_error"].is_null());
    assert_eq!(j["global options"]["numjobs"], 2, "one session per job");
    assert!(j["target"].as_str().is_some_and(|t| t.starts_with("iscsi ")), "{j}");
}

fn corrupt(path: &Path, byte: u64, len: usize) {
    let mut f = std::fs::OpenOptions::new().write(true).open(path).expect("open backing file");
    f.seek(SeekFrom::Start(byte)).expect("seek");
    f.write_all(&vec![0x5a; len]).expect("write garbage");
    f.sync_all().expect("sync");
}

#[test]
fn bench_verify_reports_the_first_block_corrupted_behind_the_daemon() {
    let d = Daemon::start("corrupt", "kind = \"file\"\npath = \"{dir}/backing.img\"\nsize = \"1MiB\"");
    let backing = d.dir.join("backing.img");
    let range = ["--size", "256k", "--bs", "4k", "--qd", "4", "--jobs", "2", "--time", "1", "--verify"];
    let phase = |rw: &str| {
        let mut a = vec!["--rw", rw, "--output", "json"];
        a.extend_from_slice(&range);
        d.bench(&a)
    };
    // Write phase: sequential writes cover the 64-I/O range many times.
    let w = phase("write");
    assert!(w.status.success(), "stderr: {}", String::from_utf8_lossy(&w.stderr));
    assert!(u(&json(&w)["jobs"][0]["write"]["total_ios"]) >= 64);
    let clean = phase("read");
    assert!(clean.status.success(), "stderr: {}", String::from_utf8_lossy(&clean.stderr));
    assert_eq!(u(&json(&clean)["jobs"][0]["verify_errors"]), 0);
    // 512-byte blocks: garbage over LBA 77 only.
    corrupt(&backing, 77 * 512, 512);
    let bad = phase("read");
    assert!(!bad.status.success(), "verify must fail the run");
    let j = json(&bad);
    assert!(u(&j["jobs"][0]["verify_errors"]) >= 1);
    assert_eq!(j["jobs"][0]["first_verify_error"]["lba"], 77, "{j}");
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("LBA 77"), "{stderr}");
}

#[test]
fn bench_local_and_ceiling_report_the_same_consistent_result() {
    let out = bench(&[
        "local", "--device", "ram", "--size", "8MiB", "--rw", "randrw", "--mix", "70", "--bs", "8k", "--qd", "4",
        "--jobs", "2", "--time", "1", "--verify", "--output", "json",
    ]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let j = json(&out);
    assert_consistent(&j, 8 << 10);
    assert_eq!(j["mode"], "local");
    assert_eq!(u(&j["jobs"][0]["verify_errors"]), 0);

    for rw in ["randread", "randwrite"] {
        let out = bench(&[
            "ceiling", "--rw", rw, "--bs", "64k", "--qd", "4", "--jobs", "2", "--time", "1", "--output", "json",
        ]);
        assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
        let j = json(&out);
        assert_consistent(&j, 64 << 10);
        assert_eq!(j["mode"], "ceiling");
        assert!(j["ironwire"]["target_cpu_percent"].is_number(), "the peer thread's CPU is the target's");
    }
}

#[test]
fn bench_human_output_has_a_progress_line_and_the_table() {
    let out = bench(&["local", "--device", "null", "--size", "64MiB", "--time", "1.5", "--qd", "1"]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("IOPS=") && stdout.contains("lat (usec)") && stdout.contains("%CPU/Gbps"), "{stdout}");
    assert!(stderr.lines().any(|l| l.starts_with("[   1 s] run")), "one progress line a second: {stderr}");
}

/// Runs `bench report` with 0.3 s cells into `out` and returns report.md
/// and report.json.
fn report(target: &[&str], extra: &[&str], out: &Path) -> (String, Value) {
    let out_s = out.display().to_string();
    let mut args = vec!["report"];
    args.extend_from_slice(target);
    args.extend_from_slice(&["--sizes", "4k,16k", "--time", "0.3", "--ramp", "0.1", "--jobs", "2", "--out", &out_s]);
    args.extend_from_slice(&["--ceiling-runs", "2"]);
    args.extend_from_slice(extra);
    let run = bench(&args);
    assert!(run.status.success(), "stderr: {}", String::from_utf8_lossy(&run.stderr));
    let md = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    let j: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).expect("json")).expect("JSON");
    for svg in ["bandwidth.svg", "cpu-per-gbps.svg"] {
        let text = std::fs::read_to_string(out.join(svg)).expect(svg);
        assert!(text.starts_with("<svg ") && text.trim_end().ends_with("</svg>"), "{svg}");
        assert!(text.matches("<polyline").count() >= 4, "{svg}: {text}");
    }
    (md, j)
}

/// Every cell of a report: bytes = I/Os × size, rates from the same window.
fn cells(j: &Value) -> &Vec<Value> {
    let cells = j["cells"].as_array().expect("cells");
    for c in cells {
        assert!(u(&c["ios"]) > 0, "{c}");
        assert_eq!(u(&c["bytes"]), u(&c["ios"]) * u(&c["bs"]), "{c}");
        let (iops, gbps) = (c["iops"].as_f64().unwrap_or_default(), c["gbit_per_s"].as_f64().unwrap_or_default());
        let implied = iops * u(&c["bs"]) as f64 * 8.0 / 1e9;
        assert!((gbps - implied).abs() <= implied * 1e-6, "{c}");
    }
    cells
}

fn find<'a>(cells: &'a [Value], section: &str, kind: &str, rw: &str, bs: u64) -> &'a Value {
    cells
        .iter()
        .find(|c| c["section"] == section && c["kind"] == kind && c["rw"] == rw && c["bs"] == bs)
        .unwrap_or_else(|| panic!("no {section} {kind} {rw} {bs} cell"))
}

#[test]
fn bench_report_over_nvme_has_the_papers_tables_with_the_ceiling_and_target_cpu() {
    let mut d = Daemon::start("report", "kind = \"ram\"\nsize = \"64MiB\"\nblock_size = 512");
    let (addr, sock, out) = (d.addr.to_string(), d.dir.join("ctl.sock"), d.dir.join("report"));
    let sock = sock.display().to_string();
    let (md, j) = report(
        &["--nvme", &addr, "--nqn", NQN],
        &["--target-ctl", &sock, "--local", "ram", "--size", "64m", "--jitter", "16"],
        &out,
    );
    let cells = cells(&j);
    // 2 sizes x 2 directions x (remote, ceiling) + IOPS 4 + latency 6 + jitter 4.
    assert_eq!(cells.len(), 8 + 4 + 6 + 4, "{j}");
    for c in cells {
        let target = &c["target_cpu_percent"];
        match c["kind"].as_str() {
            // The daemon's own stats name its CPU; a CPU-bound run keeps it busy.
            Some("remote") => assert!(target.as_f64().is_some_and(|t| t > 0.0), "{c}"),
            Some("local") => assert!(target.is_null(), "{c}"),
            // The echo peer is the ceiling's target.
            _ => assert!(target.as_f64().is_some(), "{c}"),
        }
    }
    for section in [
        "## Random READ and WRITE: bandwidth and %CPU/Gbps against I/O size",
        "| Random READ | BW (Gbit/s) |",
        "| Random WRITE | BW (Gbit/s) |",
        "## 4K random IOPS",
        "| 4K Random Latency | Read Local | Read Remote | Read Delta | Write Local | Write Remote | Write Delta |",
        "## Jitter: 4K QD 1 read latency while 16 TCP connections stream",
        "## Machine",
        "## Commands",
        "![Bandwidth against I/O size](bandwidth.svg)",
    ] {
        assert!(md.contains(section), "{section:?} missing:\n{md}");
    }
    // The 16K read row shows the bandwidth and its fraction of the ceiling.
    let (r, c) =
        (find(cells, "bandwidth", "remote", "randread", 16384), find(cells, "bandwidth", "ceiling", "randread", 16384));
    let (rg, cg) = (r["gbit_per_s"].as_f64().unwrap_or_default(), c["gbit_per_s"].as_f64().unwrap_or_default());
    let row = md.lines().find(|l| l.starts_with("| 16K |")).expect("16K row");
    assert!(row.starts_with(&format!("| 16K | {rg:.3}")), "{row}");
    assert!(row.contains(&format!("| {cg:.3} | {:.0} % |", rg / cg * 100.0)), "{row}");
    // The latency table: delta = remote - local.
    let (l, r) =
        (find(cells, "latency", "local", "randread", 4096), find(cells, "latency", "remote", "randread", 4096));
    let (la, ra) = (l["lat_us"]["mean"].as_f64().unwrap_or_default(), r["lat_us"]["mean"].as_f64().unwrap_or_default());
    assert!(md.contains(&format!("| {la:.2} | {ra:.2} | {:.2} |", ra - la)), "{md}");
    assert_eq!(u(&j["background"]["connections"]), 16);
    // Each figure's command is listed and runs as written.
    let cmd = r["command"].as_str().expect("command");
    assert!(md.contains(cmd) && cmd.starts_with("ironwire bench run --nvme"), "{cmd}");
    d.assert_alive();
}

#[test]
fn bench_report_with_rdma_puts_iwarp_beside_tcp() {
    let mut d = Daemon::start("report-rdma", "kind = \"ram\"\nsize = \"64MiB\"\nblock_size = 512");
    let (addr, sock, out) = (d.addr.to_string(), d.dir.join("ctl.sock"), d.dir.join("report"));
    let sock = sock.display().to_string();
    let (md, j) = report(
        &["--nvme", &addr, "--nqn", NQN],
        &["--target-ctl", &sock, "--local", "ram", "--size", "64m", "--with-rdma"],
        &out,
    );
    let cells = cells(&j);
    // Every remote cell has its iWARP twin: 2 sizes x 2 directions x
    // (remote, remote-rdma, ceiling) + IOPS 6 + latency 8.
    assert_eq!(cells.len(), 12 + 6 + 8, "{j}");
    assert_eq!(
        cells.iter().filter(|c| c["kind"] == "remote").count(),
        cells.iter().filter(|c| c["kind"] == "remote-rdma").count()
    );
    for c in cells.iter().filter(|c| c["kind"] == "remote-rdma") {
        assert!(c["target_cpu_percent"].as_f64().is_some_and(|t| t > 0.0), "{c}");
        let cmd = c["command"].as_str().expect("command");
        assert!(cmd.contains("--transport rdma") && md.contains(cmd), "{cmd}");
    }
    for section in [
        "## NVMe/RDMA (iWARP) beside NVMe/TCP",
        "| Random READ | TCP Gbit/s | iWARP Gbit/s | ÷ TCP |",
        "| Random WRITE | TCP Gbit/s | iWARP Gbit/s | ÷ TCP |",
        "| 4K random, QD 32 x 2 | TCP IOPS | iWARP IOPS | ÷ TCP |",
        "| 4K QD 1 latency (µs) | local avg | TCP remote avg | iWARP remote avg |",
    ] {
        assert!(md.contains(section), "{section:?} missing:\n{md}");
    }
    // The 16K write row: both transports' bandwidth and their ratio.
    let (t, r) = (
        find(cells, "bandwidth", "remote", "randwrite", 16384),
        find(cells, "bandwidth", "remote-rdma", "randwrite", 16384),
    );
    let (tg, rg) = (t["gbit_per_s"].as_f64().unwrap_or_default(), r["gbit_per_s"].as_f64().unwrap_or_default());
    let section = md.split("## NVMe/RDMA (iWARP) beside NVMe/TCP").nth(1).expect("iWARP section");
    let writes = section.split("| Random WRITE |").nth(1).expect("iWARP write table");
    let row = writes.lines().find(|l| l.starts_with("| 16K |")).expect("16K row");
    assert!(row.starts_with(&format!("| 16K | {tg:.3}")), "{row}");
    assert!(row.contains(&format!("| {rg:.3} | {:.2} |", rg / tg)), "{row}");
    // Refused: --with-rdma on an RDMA report.
    let o = bench(&["report", "--nvme", &addr, "--nqn", NQN, "--transport", "rdma", "--with-rdma"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("leave out --transport rdma"), "{o:?}");
    d.assert_alive();
}

#[test]
fn bench_report_over_iscsi_without_a_local_device() {
    let d = iscsi_daemon("bench-report-iscsi", "");
    let (portal, out) = (d.addr.to_string(), d.dir.join("report"));
    let pid = d.pid().to_string();
    let (md, j) = report(&["--iscsi", &portal, "--iqn", IQN], &["--local", "none", "--target-pid", &pid], &out);
    let cells = cells(&j);
    assert_eq!(cells.len(), 8 + 4 + 4, "no local cells, no jitter: {j}");
    assert!(cells.iter().all(|c| c["kind"] != "local"));
    assert!(j["target"].as_str().is_some_and(|t| t.starts_with("iscsi ")), "{j}");
    let row = md.lines().find(|l| l.starts_with("| iscsi ")).expect("latency row");
    assert!(row.contains("| – |"), "no local figure: {row}");
    assert!(!md.contains("## Jitter"));
}
