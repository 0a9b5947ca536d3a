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

/// A fixture under tests/fixtures.
fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// `ironwire import FORMAT FILE`: stdout, stderr and success.
fn import(format: &str, file: &Path) -> (String, String, bool) {
    let out = run(&["import", format, file.to_str().expect("utf-8 path")]);
    (String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into(), out.status.success())
}

fn array<'a>(t: &'a toml::Table, key: &str) -> &'a Vec<toml::Value> {
    t.get(key).and_then(toml::Value::as_array).unwrap_or_else(|| panic!("no [[{key}]] in {t}"))
}

fn find<'a>(list: &'a [toml::Value], key: &str, value: &str) -> &'a toml::Value {
    list.iter()
        .find(|v| v.get(key).and_then(toml::Value::as_str) == Some(value))
        .unwrap_or_else(|| panic!("no {key} = {value:?}"))
}

#[test]
fn import_nvmetcli_maps_ports_subsystems_namespaces_and_hosts() {
    let (out, err, _) = import("nvmetcli", &fixture("nvmetcli.json"));
    let t: toml::Table = out.parse().unwrap_or_else(|e| panic!("not TOML ({e}):\n{out}\n{err}"));
    let ports = array(&t, "port");
    let addrs: Vec<String> = ports
        .iter()
        .map(|p| format!("{} {}", p["transport"].as_str().unwrap_or(""), p["address"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(addrs, ["tcp 192.168.10.5:4420", "rdma 192.168.10.5:4420", "tcp 192.168.10.5:8009"]);
    assert_eq!(ports[2].get("discovery_only").and_then(toml::Value::as_bool), Some(true), "a port with no subsystems");
    let subs = array(&t, "subsystem");
    assert_eq!(subs.len(), 2, "the subsystem no host may use is left out: {subs:?}");
    let fast = find(subs, "nqn", "nqn.2026-11.com.example:fast");
    assert_eq!(fast["allow_any_host"].as_bool(), Some(false));
    assert_eq!(fast["hosts"].as_array().map(Vec::len), Some(1));
    assert_eq!(fast["serial"].as_str(), Some("a1b2c3d4e5f60718"));
    let archive = find(subs, "nqn", "nqn.2026-11.com.example:archive");
    assert_eq!(archive["namespace"].as_array().map(Vec::len), Some(1), "the disabled namespace is left out");
    let ids: Vec<(&str, &str)> = subs
        .iter()
        .flat_map(|s| s["namespace"].as_array().into_iter().flatten())
        .filter_map(|n| Some((n.get("uuid")?.as_str()?, n.get("nguid")?.as_str()?)))
        .collect();
    assert_eq!(
        ids,
        [("9d1e7c2a-4b3f-4e6a-8c5d-1f2e3a4b5c6d", "ef90689c6c46d44c89c14067801309a8")],
        "nvmet's device.uuid and device.nguid carry over"
    );
    let devices = array(&t, "device");
    let nvme = find(devices, "path", "/dev/nvme0n1");
    if !Path::new("/dev/nvme0n1").exists() {
        assert_eq!(nvme["kind"].as_str(), Some("block"), "a missing /dev path is taken for a block device");
    }
    assert_eq!(find(devices, "path", "/var/lib/nvmet/scratch.img")["kind"].as_str(), Some("file"));
    for note in [
        "trtype \"loop\" has no equivalent",
        "1 referral(s) have no equivalent",
        "attr.model = \"Linux\" has no equivalent",
        "namespaces[2]: disabled in nvmet",
        "subsystems[nqn.2026-11.com.example:closed]: no host may connect",
        "links only nqn.2026-11.com.example:fast; ironwire exports every subsystem on every port",
    ] {
        assert!(err.contains(note), "stderr does not say {note:?}:\n{err}");
    }
}

#[test]
fn import_targetcli_maps_backstores_targets_portals_acls_and_chap() {
    let (out, err, _) = import("targetcli", &fixture("targetcli.json"));
    let t: toml::Table = out.parse().unwrap_or_else(|e| panic!("not TOML ({e}):\n{out}\n{err}"));
    let devices = array(&t, "device");
    let disk = find(devices, "name", "disk1");
    assert_eq!((disk["kind"].as_str(), disk["size"].as_integer()), (Some("file"), Some(64 << 20)));
    assert_eq!(find(devices, "name", "rd1")["kind"].as_str(), Some("ram"));
    assert_eq!(find(devices, "name", "null1")["kind"].as_str(), Some("null"));
    assert_eq!(find(devices, "name", "blk1")["block_size"].as_integer(), Some(4096));
    assert_eq!(find(devices, "name", "blk1")["read_only"].as_bool(), Some(true), "LIO readonly");
    assert_eq!(disk.get("read_only"), None, "a writable backstore");
    assert!(devices.iter().all(|d| d["name"].as_str() != Some("tape0")), "pscsi has no equivalent");
    let ports = array(&t, "port");
    assert_eq!(ports.len(), 2, "one port per distinct portal: {ports:?}");
    assert!(ports.iter().all(|p| p["transport"].as_str() == Some("iscsi")));
    let targets = array(&t, "iscsi_target");
    assert_eq!(targets.len(), 2, "the loopback target is left out");
    let acl_target = find(targets, "iqn", "iqn.2003-01.org.linux-iscsi.storage1.x8664:sn.5c1f8a2e9b3d");
    assert_eq!(acl_target["allow_any_initiator"].as_bool(), Some(false));
    let acls = acl_target["acl"].as_array().expect("acls");
    assert_eq!(acls.len(), 2, "the ACL with a 5-byte secret is left out, so it cannot log in: {acls:?}");
    let host1 = find(acls, "initiator", "iqn.1994-05.com.redhat:host1");
    assert_eq!(host1["chap"]["user"].as_str(), Some("host1"));
    assert_eq!(host1["mutual_chap"]["secret"].as_str(), Some("target-secret-22"));
    assert_eq!(acl_target["lun"].as_array().map(Vec::len), Some(2), "the pscsi LUN is left out");
    let demo = find(targets, "iqn", "iqn.2003-01.org.linux-iscsi.storage1.x8664:sn.scratch");
    assert_eq!(demo["allow_any_initiator"].as_bool(), Some(true), "generate_node_acls = 1");
    assert_eq!(t["iscsi"]["discovery_chap"]["user"].as_str(), Some("discoverer"));
    for note in [
        "plugin \"pscsi\" has no equivalent",
        "host2]: write_protect has no equivalent",
        "host3]: CHAP secret is 5 bytes",
        "TPG 2 left out",
        "iser has no equivalent",
        "fabric \"loopback\" has no equivalent",
    ] {
        assert!(err.contains(note), "stderr does not say {note:?}:\n{err}");
    }
}

/// The fixture rewritten for this machine: its paths under `dir` (the
/// /dev ones as regular files, made here), its addresses on free loopback
/// ports.
fn localised_fixture(name: &str, dir: &Path) -> PathBuf {
    let mut text = std::fs::read_to_string(fixture(name)).expect("fixture");
    for dev in ["/dev/nvme0n1", "/dev/sdb"] {
        let local = dir.join(dev.trim_start_matches("/dev/"));
        text = text.replace(&format!("\"{dev}\""), &format!("\"{}\"", local.display()));
    }
    // nvmet opens its files as they are; targetcli creates disk1.img.
    for file in ["nvme0n1", "sdb", "scratch.img", "archive.img"] {
        std::fs::File::create(dir.join(file)).and_then(|f| f.set_len(16 << 20)).expect("backing file");
    }
    for d in ["/var/lib/nvmet", "/var/lib/target"] {
        text = text.replace(d, &dir.display().to_string());
    }
    text = text.replace("192.168.10.5", "127.0.0.1").replace("0.0.0.0", "127.0.0.1");
    for port in ["4420", "8009"] {
        text = text.replace(&format!("\"trsvcid\": \"{port}\""), &format!("\"trsvcid\": \"{}\"", free_port()));
    }
    for port in ["3260", "3261"] {
        text = text.replace(&format!("\"port\": {port}"), &format!("\"port\": {}", free_port()));
    }
    let path = dir.join(name);
    std::fs::write(&path, text).expect("localised fixture");
    path
}

#[test]
fn imported_configurations_pass_check_config_and_serve() {
    for (format, name) in [("nvmetcli", "nvmetcli.json"), ("targetcli", "targetcli.json")] {
        let dir = temp_dir(&format!("import-{format}"));
        let (out, err, ok) = import(format, &localised_fixture(name, &dir));
        assert!(ok, "{format}: import failed:\n{err}\n{out}");
        assert_eq!(
            err.contains("cannot be examined"),
            format == "targetcli",
            "{format}: only disk1.img is missing:\n{err}"
        );
        let cfg = dir.join("ironwire.toml");
        std::fs::write(&cfg, &out).expect("imported config");
        let check = run(&["check-config", cfg.to_str().expect("utf-8 path")]);
        assert!(check.status.success(), "{format}: {}", String::from_utf8_lossy(&check.stderr));
        let lines = serve_until_ready(&["--config", cfg.to_str().expect("utf-8 path")], &dir, &[]);
        let log = lines.last().expect("log");
        let expect =
            if format == "nvmetcli" { "nqn.2026-11.com.example:fast" } else { "sn.scratch luns [0:rd1, 1:null1]" };
        assert!(log.contains(expect), "{format}: the daemon does not export {expect:?}:\n{log}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// nvmetcli's own example files (tests/fixtures/nvmetcli-upstream, with
/// where they come from and why they are not taken from a package at test
/// time): each imports into a configuration that `check-config` accepts,
/// with the subsystem, its namespace, hosts and ports it declares, and a
/// note for each thing ironwire has no equivalent for.
#[test]
fn import_nvmetcli_upstream_examples() {
    struct Expect {
        file: &'static str,
        nqn: &'static str,
        ports: &'static [&'static str],
        extra: &'static [(&'static str, i64)],
        uuid: Option<&'static str>,
        nguid: Option<&'static str>,
        notes: &'static [&'static str],
    }
    let renamed = "nqn.2026-11.io.ironwire.imported:testnqn";
    let examples = [
        Expect {
            file: "loop.json",
            nqn: renamed,
            ports: &[],
            extra: &[],
            uuid: None,
            nguid: Some("ef90689c6c46d44c89c14067801309a8"),
            notes: &[
                "ports[portid 1]: trtype \"loop\" has no equivalent (tcp and rdma only); port left out",
                "allowed host \"hostnqn\" is not an NQN",
                "subsystems[testnqn]: no host may connect (allow_any_host 0, no usable allowed_hosts); left out",
            ],
        },
        Expect {
            file: "rdma.json",
            nqn: renamed,
            ports: &["rdma 127.0.0.1:PORT"],
            extra: &[],
            uuid: None,
            nguid: Some("ef90689c6c46d44c89c14067801309a8"),
            notes: &[
                "trtype rdma is served as NVMe/RDMA over iWARP in software",
                "subsystems[testnqn]: \"testnqn\" is not an NQN",
                "hosts: hostnqn is allowed into no subsystem",
            ],
        },
        Expect {
            file: "fc.json",
            nqn: renamed,
            ports: &[],
            extra: &[],
            uuid: None,
            nguid: Some("ef90689c6c46d44c89c14067801309a8"),
            notes: &["ports[portid 3]: trtype \"fc\" has no equivalent (tcp and rdma only); port left out"],
        },
        Expect {
            file: "tcp.json",
            nqn: "nqn.2026-11.io.ironwire.imported:nvmet-always",
            ports: &["tcp 127.0.0.1:PORT"],
            extra: &[("min_cntlid", 1), ("max_cntlid", 65519)],
            uuid: Some("d592cdf3-5d1c-44e0-8412-3fcf7d99df27"),
            // nvmet writes an unset NGUID as zeros.
            nguid: None,
            notes: &[
                "ports[portid 1]: param.inline_data_size = \"16384\" has no per-port equivalent",
                "subsystems[nvmet-always]: attr.model = \"Linux\" has no equivalent; left out",
            ],
        },
    ];
    let dir = temp_dir("import-upstream");
    std::fs::File::create(dir.join("nvme0n1")).and_then(|f| f.set_len(16 << 20)).expect("backing file");
    for e in examples {
        let port = free_port();
        let text = std::fs::read_to_string(fixture("nvmetcli-upstream").join(e.file))
            .expect("example")
            .replace("\"/dev/nvme0n1\"", &format!("\"{}\"", dir.join("nvme0n1").display()))
            .replace("192.168.6.68", "127.0.0.1")
            .replace("192.168.122.33", "127.0.0.1")
            .replace("\"trsvcid\": \"4420\"", &format!("\"trsvcid\": \"{port}\""));
        let file = dir.join(e.file);
        std::fs::write(&file, text).expect("localised example");
        let (out, err, ok) = import("nvmetcli", &file);
        for note in e.notes {
            assert!(err.contains(note), "{}: stderr does not say {note:?}:\n{err}", e.file);
        }
        if e.ports.is_empty() {
            // Loop and Fibre Channel only: nothing ironwire can serve, and
            // the import says why instead of printing a configuration.
            assert!(!ok, "{}: a configuration with no port passed:\n{out}", e.file);
            assert!(err.contains("does not pass check-config here: port: at least one port is needed"), "{err}");
            continue;
        }
        assert!(ok, "{}: import failed:\n{err}", e.file);
        let t: toml::Table = out.parse().unwrap_or_else(|x| panic!("{}: not TOML ({x}):\n{out}", e.file));
        let ports: Vec<String> = t
            .get("port")
            .and_then(toml::Value::as_array)
            .into_iter()
            .flatten()
            .map(|p| format!("{} {}", p["transport"].as_str().unwrap_or(""), p["address"].as_str().unwrap_or("")))
            .collect();
        let want: Vec<String> = e.ports.iter().map(|p| p.replace("PORT", &port.to_string())).collect();
        assert_eq!(ports, want, "{}: ports", e.file);
        let subs = t.get("subsystem").and_then(toml::Value::as_array);
        let subs = subs.unwrap_or_else(|| panic!("{}: no subsystem:\n{out}", e.file));
        assert_eq!(subs.len(), 1, "{}", e.file);
        let sub = &subs[0];
        assert_eq!(sub["nqn"].as_str(), Some(e.nqn), "{}", e.file);
        assert_eq!(sub["allow_any_host"].as_bool(), Some(true), "{}: allow_any_host \"1\"", e.file);
        for (k, v) in e.extra {
            assert_eq!(sub.get(*k).and_then(toml::Value::as_integer), Some(*v), "{}: {k}", e.file);
        }
        let ns = sub["namespace"].as_array().expect("namespaces");
        assert_eq!(ns.len(), 1, "{}", e.file);
        assert_eq!(ns[0]["nsid"].as_integer(), Some(1), "{}", e.file);
        assert_eq!(ns[0].get("uuid").and_then(toml::Value::as_str), e.uuid, "{}: uuid", e.file);
        assert_eq!(ns[0].get("nguid").and_then(toml::Value::as_str), e.nguid, "{}: nguid", e.file);
        let dev = ns[0]["device"].as_str().expect("device");
        let d = find(array(&t, "device"), "name", dev);
        assert_eq!(d["path"].as_str(), Some(dir.join("nvme0n1").to_str().expect("utf-8")), "{}", e.file);
        assert_eq!(d["kind"].as_str(), Some("file"), "{}", e.file);
        let cfg = dir.join(format!("{}.toml", e.file));
        std::fs::write(&cfg, &out).expect("imported config");
        let check = run(&["check-config", cfg.to_str().expect("utf-8 path")]);
        assert!(check.status.success(), "{}: check-config: {}\n{out}", e.file, String::from_utf8_lossy(&check.stderr));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The subcommands `--help` lists (without `help`).
fn subcommands() -> Vec<String> {
    let help = String::from_utf8(run(&["--help"]).stdout).expect("utf-8 help");
    let list: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect();
    for expected in ["serve", "ctl", "bench", "check-config", "import", "man", "completions"] {
        assert!(list.iter().any(|c| c == expected), "--help does not list {expected}: {list:?}");
    }
    list
}

#[test]
fn version_names_the_git_revision() {
    let out = String::from_utf8(run(&["--version"]).stdout).expect("utf-8");
    let git = Command::new("git").args(["rev-parse", "--short", "HEAD"]).current_dir(repo()).output();
    let rev = match git {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        _ => "unknown".to_string(),
    };
    assert_eq!(out.trim(), format!("ironwire {} (git {rev})", env!("CARGO_PKG_VERSION")));
}

#[test]
fn man_pages_and_completions_cover_every_subcommand() {
    let subs = subcommands();
    let page = String::from_utf8(run(&["man"]).stdout).expect("utf-8 man page");
    assert!(page.starts_with(".ie") || page.contains(".TH ironwire 1"), "not roff:\n{page}");
    let dir = temp_dir("man");
    let out = run(&["man", "--out-dir", dir.join("man1").to_str().expect("utf-8 path")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for sub in &subs {
        assert!(page.contains(&format!("ironwire\\-{}", sub.replace('-', "\\-"))), "the man page omits {sub}");
        let sub_page = dir.join(format!("man1/ironwire-{sub}.1"));
        assert!(sub_page.is_file(), "no {}", sub_page.display());
    }
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = run(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", String::from_utf8_lossy(&out.stderr));
        let script = String::from_utf8(out.stdout).expect("utf-8 completions");
        for sub in &subs {
            assert!(script.contains(sub.as_str()), "{shell} completions omit {sub}");
        }
    }
    let out = run(&["completions", "tcsh"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("tcsh"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_unit_file_passes_systemd_analyze_verify() {
    let unit = std::fs::read_to_string(repo().join("packaging/ironwire.service")).expect("unit file");
    for key in [
        "Type=notify",
        "ExecReload=/usr/local/bin/ironwire ctl reload",
        "LimitMEMLOCK=infinity",
        "ProtectSystem=strict",
    ] {
        assert!(unit.lines().any(|l| l == key), "the unit has no {key}");
    }
    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        eprintln!("SKIPPED: systemd-analyze is not installed (scripts/test installs the systemd package)");
        return;
    }
    // verify checks that ExecStart's binary exists and that the
    // Documentation= man page resolves: point both at this build.
    let dir = temp_dir("unit");
    let out = run(&["man", "--out-dir", dir.join("man/man1").to_str().expect("utf-8 path")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let local = unit.replace("/usr/local/bin/ironwire", &exe().display().to_string());
    assert_ne!(local, unit, "ExecStart does not run /usr/local/bin/ironwire");
    let path = dir.join("ironwire.service");
    std::fs::write(&path, local).expect("unit copy");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .env("MANPATH", dir.join("man"))
        .output()
        .expect("systemd-analyze");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "systemd-analyze verify failed:\n{err}");
    let ours: Vec<&str> = err.lines().filter(|l| l.contains("ironwire")).collect();
    assert!(ours.is_empty(), "systemd-analyze verify warns about the unit:\n{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serve_without_config_says_which_it_used() {
    if Path::new("/etc/ironwire/ironwire.toml").exists() {
        eprintln!("SKIPPED: /etc/ironwire/ironwire.toml exists here; the embedded default is not used");
        return;
    }
    // The embedded default listens on 127.0.0.1:4420 and :3260; a network
    // namespace of its own keeps it off this machine's ports.
    let probe = Command::new("unshare").args(["--net", "true"]).output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("SKIPPED: unshare --net cannot run here (needs root and util-linux)");
        return;
    }
    let dir = temp_dir("no-config");
    let wrapper = ["unshare", "--net", "sh", "-c", "ip link set lo up && exec \"$0\" \"$@\""];
    let lines = serve_until_ready(&[], &dir, &wrapper);
    let log = lines.last().expect("log");
    assert!(
        log.contains("no --config and no /etc/ironwire/ironwire.toml: using the embedded default"),
        "serve does not say which configuration it used:\n{log}"
    );
    assert!(lines.iter().any(|l| l.contains("nqn.2026-11.io.ironwire:default")), "{lines:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_packaged_configuration_is_valid() {
    // Checked like the examples (its directory is the unit's state
    // directory, absent outside an installed system).
    let text = std::fs::read_to_string(repo().join("packaging/ironwire.toml")).expect("packaging/ironwire.toml");
    let dir = temp_dir("packaged");
    let cfg = dir.join("ironwire.toml");
    std::fs::write(&cfg, localised(&text, &dir)).expect("localised config");
    let out = run(&["check-config", cfg.to_str().expect("utf-8 path")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines = serve_until_ready(&["--config", cfg.to_str().expect("utf-8 path")], &dir, &[]);
    assert!(
        lines.iter().any(|l| l.trim().starts_with("iscsiadm -m node -T iqn.2026-11.io.ironwire:disk0")),
        "{lines:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_verify_tells_unwritten_blocks_from_corrupt_ones_and_says_ok() {
    let dir = temp_dir("verify");
    let file = dir.join("dev.img");
    std::fs::File::create(&file).and_then(|f| f.set_len(1 << 20)).expect("fresh device file");
    let device = format!("file:{}", file.display());
    let bench = |rw: &str| {
        run(&["bench", "local", "--device", &device, "--rw", rw, "--bs", "4k", "--qd", "4", "--time", "1", "--verify"])
    };
    let text = |o: &Output| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    // A fresh device: nothing to verify, and nothing corrupt.
    let fresh = bench("randread");
    let t = text(&fresh);
    assert!(!fresh.status.success(), "a read-only verify of a never-written device verified nothing:\n{t}");
    assert!(t.contains("never written (zeros), not corrupt") && !t.contains("corrupt blocks"), "{t}");
    // Written sequentially, then read back: OK, every block checked.
    let written = bench("write");
    assert!(written.status.success(), "{}", text(&written));
    let read = bench("randread");
    let out = String::from_utf8_lossy(&read.stdout);
    assert!(read.status.success(), "{}", text(&read));
    let ok = out.lines().find(|l| l.starts_with("verify OK: ")).unwrap_or_else(|| panic!("no verify OK line:\n{out}"));
    assert!(ok.ends_with("none corrupt, 0 never written"), "{ok}");
    // One block overwritten with something that is not zeros: corrupt.
    let mut data = std::fs::read(&file).expect("device");
    data[40 * 512..41 * 512].fill(0xff);
    std::fs::write(&file, &data).expect("corrupt one block");
    let bad = bench("read");
    let t = text(&bad);
    assert!(!bad.status.success() && t.contains("corrupt blocks") && t.contains("LBA 40"), "{t}");
    let _ = std::fs::remove_dir_all(&dir);
}
