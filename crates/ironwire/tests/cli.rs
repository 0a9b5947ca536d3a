//! The command line as a new user meets it: `--help`, error messages, the
//! ready lines, and the shipped example configurations, each run through
//! `check-config` and `serve`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ironwire"))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(args: &[&str]) -> Output {
    Command::new(exe()).args(args).stdin(Stdio::null()).output().expect("run ironwire")
}

/// A fresh private temp dir for one test.
fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ironwire-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("chmod temp dir");
    dir
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port()
}

/// Runs `serve` with `args` until its ready line and the lines after it
/// (bounded), kills it, and returns stdout's lines; panics with the log if
/// it never became ready.
fn serve_until_ready(args: &[&str], dir: &Path, prefix: &[&str]) -> Vec<String> {
    let log = std::fs::File::create(dir.join("daemon.log")).expect("log file");
    let mut command = match prefix.split_first() {
        Some((p, rest)) => {
            let mut c = Command::new(p);
            c.args(rest).arg(exe());
            c
        }
        None => Command::new(exe()),
    };
    let mut child = command
        .arg("serve")
        .args(args)
        .arg("--ctl-socket")
        .arg(dir.join("ctl.sock"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("spawn serve");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let mut ready = false;
    // After the ready line, the rest of the block arrives at once.
    while let Ok(l) = rx.recv_timeout(Duration::from_secs(if ready { 1 } else { 15 })) {
        ready |= l.starts_with("ready:");
        lines.push(l);
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(dir.join("daemon.log")).unwrap_or_default();
    assert!(ready, "serve {args:?} did not become ready; stdout {lines:?}; log:\n{log}");
    lines.push(log);
    lines
}

#[test]
fn help_names_all_three_protocols() {
    let out = run(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for p in ["NVMe/TCP", "NVMe/RDMA", "iSCSI"] {
        assert!(help.contains(p), "--help does not name {p}:\n{help}");
    }
}

#[test]
fn an_os_error_is_printed_once() {
    let dir = temp_dir("os-error");
    // A file device whose path is a dangling symlink: its directory exists,
    // so the configuration is valid, and opening it fails with ENOENT.
    let link = dir.join("disk.img");
    std::os::unix::fs::symlink(dir.join("missing/disk.img"), &link).expect("symlink");
    let cfg = dir.join("ironwire.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[device]]\nname = \"f\"\nkind = \"file\"\nsize = \"1MiB\"\npath = \"{}\"\n[[port]]\naddress = \"127.0.0.1:{}\"\n",
            link.display(),
            free_port()
        ),
    )
    .expect("config");
    let out = Command::new(exe())
        .args(["serve", "--config"])
        .arg(&cfg)
        .arg("--ctl-socket")
        .arg(dir.join("ctl.sock"))
        .stdin(Stdio::null())
        .output()
        .expect("serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "serve opened a dangling symlink: {err}");
    assert!(err.contains(&format!("cannot open {}", link.display())), "{err}");
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    assert_eq!(err.matches("os error 2").count(), 1, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The shipped example configurations.
fn examples() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("docs/examples"))
        .expect("docs/examples")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no examples in docs/examples");
    files
}

/// `text` with every listening address moved to a free loopback port and
/// /var/lib/ironwire moved to `dir`, so that the example can run here.
fn localised(text: &str, dir: &Path) -> String {
    let text = text.replace("/var/lib/ironwire", &dir.display().to_string());
    text.lines()
        .map(|l| match l.trim_start().strip_prefix("address = ") {
            Some(_) => format!("address = \"127.0.0.1:{}\"", free_port()),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn check_config_and_serve_agree_on_every_example() {
    for example in examples() {
        let name = example.file_name().expect("name").to_string_lossy().to_string();
        let text = std::fs::read_to_string(&example).expect("example");
        // As shipped: check-config passes, or names the missing directory
        // that would make serve fail.
        let out = run(&["check-config", example.to_str().expect("utf-8 path")]);
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            assert!(
                text.contains("/var/lib/ironwire/") && !Path::new("/var/lib/ironwire").is_dir(),
                "{name}: check-config failed: {err}"
            );
            assert!(err.contains("directory /var/lib/ironwire does not exist"), "{name}: {err}");
        }
        // Where its directory exists, check-config passes and serve comes up.
        let dir = temp_dir(&format!("example-{name}"));
        let cfg = dir.join(&name);
        std::fs::write(&cfg, localised(&text, &dir)).expect("localised example");
        let out = run(&["check-config", cfg.to_str().expect("utf-8 path")]);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let lines = serve_until_ready(&["--config", cfg.to_str().expect("utf-8 path")], &dir, &[]);
        let at = lines.iter().position(|l| l.starts_with("ready:")).expect("ready line");
        let commands: Vec<&String> = lines[at + 1..lines.len() - 1].iter().collect();
        assert!(!commands.is_empty(), "{name}: no connect commands after the ready line: {lines:?}");
        for c in commands {
            let c = c.trim();
            assert!(
                (c.starts_with("nvme connect ") || c.starts_with("iscsiadm ")) && !c.contains(" | "),
                "{name}: not one command per line: {c:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
