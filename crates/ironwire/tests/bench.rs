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
    /// as namespace 1 of `NQN`, and waits for its ready line. A port taken
    /// between probing and binding is retried on another.
    fn start(tag: &str, device: &str) -> Daemon {
        Daemon::start_with(&format!("bench-{tag}"), |dir, port| {
            let device = device.replace("{dir}", &dir.display().to_string());
            format!(
                "[[device]]\nname = \"d\"\n{device}\n\n[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n\
                 [[subsystem.namespace]]\ndevice = \"d\"\n\n[[port]]\naddress = \"127.0.0.1:{port}\"\n\n\
                 [reactor]\ncores = [0]\n"
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

#[test]
fn bench_run_iscsi_randrw_verify_against_the_daemon_is_clean_and_consistent() {
    let d = Daemon::start_with("bench-iscsi", |_, port| {
        format!(
            "[[device]]\nname = \"d\"\nkind = \"ram\"\nsize = \"16MiB\"\nblock_size = 512\n\n\
             [[iscsi_target]]\niqn = \"{IQN}\"\nallow_any_initiator = true\n\
             chap = {{ user = \"alice\", secret = \"alice-secret-1234\" }}\n\
             [[iscsi_target.lun]]\nlun = 0\ndevice = \"d\"\n\n\
             [[port]]\ntransport = \"iscsi\"\naddress = \"127.0.0.1:{port}\"\n\n[reactor]\ncores = [0]\n"
        )
    });
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
