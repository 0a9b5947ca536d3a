//! Issue 13's "done when", end to end: the daemon run as the shipped unit
//! `packaging/ironwire.service` runs it. The test reads the unit's
//! `ExecStart=` and `ExecReload=` lines (so a change to the unit is tested)
//! and runs them itself, with `NOTIFY_SOCKET` on a real datagram socket
//! (Type=notify: it waits for READY=1), `--persist` added and the unit's
//! /etc/ironwire/ironwire.toml and /usr/local/bin/ironwire replaced by this
//! test's configuration and binary (`IRONWIRE_BIN` when set, the one cargo
//! built otherwise). `systemctl` cannot run the unit here: PID 1 on this
//! machine and CI's is not systemd ("System has not been booted with
//! systemd as init system"), and `systemd-run` finds no bus; the unit
//! file itself is checked by `systemd-analyze verify` in tests/cli.rs.
//!
//! Then: a device, an NVMe namespace and an iSCSI LUN added at run time
//! with `ctl`; I/O through both with our initiator; the hosts in `ctl
//! hosts --json`, the I/O in `ctl stats --json` and in a Prometheus scrape;
//! a reload through ExecReload (`ctl reload`) that keeps the connections; SIGTERM
//! with NVMe writes in flight (every acknowledged write on the file); a
//! start again from the same (persisted) file giving the same `ctl show
//! --json` and the data.

mod common;

use common::{block_on, bounded};
use initiator::iscsi::{LoginOptions, Session};
use initiator::{cmd, Controller, Options};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const NQN: &str = "nqn.2026-11.io.ironwire:service";
const IQN: &str = "iqn.2026-11.io.ironwire:service";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:service-host";
const INITIATOR: &str = "iqn.2026-11.io.test:service";
const BS: usize = 4096;
const UNIT_CONFIG: &str = "/etc/ironwire/ironwire.toml";
const UNIT_BINARY: &str = "/usr/local/bin/ironwire";

/// The words of the unit's `KEY=` line.
fn unit_line(key: &str) -> Vec<String> {
    let unit = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/ironwire.service"))
        .expect("packaging/ironwire.service");
    let line = unit.lines().find_map(|l| l.strip_prefix(&format!("{key}="))).unwrap_or_else(|| panic!("no {key}="));
    line.split_whitespace().map(str::to_string).collect()
}

fn binary() -> PathBuf {
    std::env::var_os("IRONWIRE_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_ironwire")), PathBuf::from)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port()
}

/// A file device whose writes take 1 s, as namespace 1 and LUN 0; the
/// control socket, `allow_paths` and metrics in the test's dir and ports.
fn config(dir: &Path, ports: [u16; 3]) -> String {
    format!(
        "[[device]]\nname = \"slow\"\nkind = \"file\"\npath = \"{d}/slow.img\"\nsize = \"1MiB\"\nblock_size = {BS}\n\
         write_latency_us = 1000000\n\n\
         [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n[[subsystem.namespace]]\nnsid = 1\ndevice = \"slow\"\n\n\
         [[iscsi_target]]\niqn = \"{IQN}\"\nallow_any_initiator = true\n[[iscsi_target.lun]]\nlun = 0\ndevice = \"slow\"\n\n\
         [[port]]\naddress = \"127.0.0.1:{}\"\n\n[[port]]\ntransport = \"iscsi\"\naddress = \"127.0.0.1:{}\"\n\n\
         [metrics]\nlisten = \"127.0.0.1:{}\"\n\n[control]\nsocket = \"{d}/ctl.sock\"\nallow_paths = [\"{d}/\"]\n\n\
         [reactor]\ncores = [0]\n",
        ports[0],
        ports[1],
        ports[2],
        d = dir.display()
    )
}

/// The unit's service, started by its ExecStart line.
struct Service {
    child: Child,
    dir: PathBuf,
    notify: std::os::unix::net::UnixDatagram,
}

impl Service {
    fn start(dir: &Path) -> Service {
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let notify = std::os::unix::net::UnixDatagram::bind(&path).expect("bind the notify socket");
        notify.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
        let words = unit_line("ExecStart");
        assert_eq!(words[0], UNIT_BINARY, "ExecStart runs the installed binary");
        let args: Vec<String> = words[1..]
            .iter()
            .map(|w| if w == UNIT_CONFIG { dir.join("ironwire.toml").display().to_string() } else { w.clone() })
            .collect();
        assert!(args.contains(&dir.join("ironwire.toml").display().to_string()), "ExecStart names {UNIT_CONFIG}");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("daemon.log")).expect("log");
        let child = Command::new(binary())
            .args(&args)
            .arg("--persist")
            .env("NOTIFY_SOCKET", &path)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn the service");
        let s = Service { child, dir: dir.to_path_buf(), notify };
        assert_eq!(s.next_notification(), "READY=1", "log:\n{}", s.log());
        s
    }

    fn next_notification(&self) -> String {
        let mut buf = [0u8; 512];
        let n = self.notify.recv(&mut buf).unwrap_or_else(|e| panic!("no notification ({e}); log:\n{}", self.log()));
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    fn ctl(&self, words: &str) -> String {
        let args: Vec<&str> = words.split_whitespace().collect();
        common::ctl(&self.dir.join("ctl.sock"), &args).unwrap_or_else(|e| panic!("ctl {words}: {e}\n{}", self.log()))
    }

    fn json(&self, words: &str) -> serde_json::Value {
        serde_json::from_str(&self.ctl(words)).expect("JSON")
    }

    /// Runs the unit's ExecReload line (`ironwire ctl reload`, which waits
    /// for the reload and fails when it is refused), with the test's
    /// binary and control socket.
    fn reload(&self) {
        let words = unit_line("ExecReload");
        assert_eq!(words[0], UNIT_BINARY, "ExecReload runs the installed binary");
        assert_eq!(&words[1..], ["ctl", "reload"], "ExecReload waits for the reload's outcome");
        let status = Command::new(binary())
            .args(["ctl", "--socket"])
            .arg(self.dir.join("ctl.sock"))
            .arg("reload")
            .status()
            .expect("run ExecReload");
        assert!(status.success(), "ExecReload {words:?}");
    }

    fn wait_exit(&mut self) -> Option<i32> {
        for _ in 0..600 {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the service did not exit; log:\n{}", self.log());
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn scrape(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").expect("request");
    let mut reply = String::new();
    s.read_to_string(&mut reply).expect("reply");
    assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
    reply
}

fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn block(i: u64) -> Vec<u8> {
    (0..BS).map(|b| (b as u64 ^ i.wrapping_mul(97)) as u8 | 1).collect()
}

#[test]
fn the_shipped_unit_runs_changes_reloads_stops_and_restarts_with_the_same_exports() {
    let dir = std::env::temp_dir().join(format!("ironwire-service-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("chmod");
    let ports = [free_port(), free_port(), free_port()];
    std::fs::write(dir.join("ironwire.toml"), config(&dir, ports)).expect("config");
    let [nvme, iscsi, metrics] = ports.map(|p| SocketAddr::from(([127, 0, 0, 1], p)));
    let mut svc = Service::start(&dir);

    // Run-time changes over both protocols.
    svc.ctl(&format!("add device name=fast kind=file path={}/fast.img size=1MiB block_size={BS}", dir.display()));
    svc.ctl(&format!("add namespace nqn={NQN} nsid=2 device=fast"));
    svc.ctl(&format!("add lun iqn={IQN} lun=1 device=fast"));
    let on_disk = std::fs::read_to_string(dir.join("ironwire.toml")).expect("persisted config");
    assert!(on_disk.contains("fast.img"), "--persist wrote the change:\n{on_disk}");
    let before = svc.json("show --json");

    let acknowledged = block_on(bounded(60, async {
        let opts = Options { io_queues: 1, queue_size: 32, ..Options::default() };
        let mut c = Controller::connect(nvme, NQN, HOST, opts).await.expect("NVMe/TCP connect");
        let mut s = Session::connect(iscsi, LoginOptions::new(INITIATOR, Some(IQN))).await.expect("iSCSI login");
        s.clear_unit_attentions(1).await.expect("TEST UNIT READY");
        c.write(0, 2, 0, block(100)).await.expect("NVMe write to the new namespace");
        s.write16(1, 1, BS as u32, block(101)).await.expect("iSCSI write to the new LUN");
        assert_eq!(s.read16(1, 0, 1, BS as u32).await.expect("iSCSI read"), block(100), "one device, two protocols");
        assert_eq!(c.read(0, 2, 1, 1).await.expect("NVMe read"), block(101));

        let hosts = svc.json("hosts --json");
        assert_eq!(hosts["nvme"][0]["hostnqn"], HOST, "{hosts:#}");
        assert_eq!(hosts["iscsi"][0]["initiator"], INITIATOR, "{hosts:#}");
        let stats = svc.json("stats --json");
        let ns2 = stats["namespaces"].as_array().expect("namespaces").iter().find(|n| n["nsid"] == 2).cloned();
        let ns2 = ns2.expect("namespace 2 in stats");
        assert_eq!((ns2["writes"].as_u64(), ns2["reads"].as_u64()), (Some(1), Some(1)), "{ns2:#}");
        let text = scrape(metrics);
        assert_eq!(sample(&text, &format!("ironwire_namespace_writes_total{{subsystem=\"{NQN}\",nsid=\"2\"}}")), 1.0);
        assert_eq!(sample(&text, "ironwire_hosts_connected{protocol=\"iscsi\"}"), 1.0, "{text}");
        // NVMe counts connections: the admin queue and the I/O queue.
        assert_eq!(sample(&text, "ironwire_hosts_connected{protocol=\"nvme-tcp\"}"), 2.0, "{text}");

        // ExecReload: the persisted file is re-read; nothing changes and
        // the hosts keep their connections.
        svc.reload();
        for _ in 0..100 {
            if svc.log().contains("control: reloaded") {
                break;
            }
            reactor::sleep(Duration::from_millis(50)).await;
        }
        assert!(svc.log().contains("control: reloaded"), "{}", svc.log());
        assert_eq!(c.read(0, 2, 0, 1).await.expect("NVMe read after the reload"), block(100));
        assert_eq!(s.read16(1, 1, 1, BS as u32).await.expect("iSCSI read after the reload"), block(101));
        s.logout().await.expect("logout");

        // SIGTERM with writes in flight on the slow namespace.
        let q = c.io_queue(0).expect("queue");
        for i in 0..8 {
            q.submit(cmd::write(1, i, 1), block(i), 0).expect("submit");
        }
        q.flush().await.expect("send the writes");
        // The writes reach the daemon (as in tests/lifecycle.rs), each 1 s
        // from done when the stop begins.
        reactor::sleep(Duration::from_millis(200)).await;
        // SAFETY: kill(2) on our own child's pid has no memory effects.
        assert_eq!(unsafe { libc::kill(svc.child.id() as i32, libc::SIGTERM) }, 0);
        let mut acknowledged = 0;
        for _ in 0..8 {
            match q.next_completion().await {
                Ok(done) if done.cqe.status().is_success() => acknowledged += 1,
                _ => break,
            }
        }
        acknowledged
    }));
    assert_eq!(svc.next_notification(), "STOPPING=1");
    assert_eq!(svc.wait_exit(), Some(0), "log:\n{}", svc.log());
    assert_eq!(acknowledged, 8, "the writes taken before the stop are answered; log:\n{}", svc.log());
    let before_restart = std::fs::read(dir.join("slow.img")).expect("slow.img");
    for i in 0..8u64 {
        assert!(before_restart[i as usize * BS..(i as usize + 1) * BS] == block(i)[..], "block {i} is not on the file");
    }
    drop(svc);

    // Start again from the same file: the same exports and the data.
    let svc = Service::start(&dir);
    assert_eq!(svc.json("show --json"), before, "the restarted service exports something else");
    block_on(bounded(30, async {
        let opts = Options { io_queues: 1, queue_size: 8, ..Options::default() };
        let mut c = Controller::connect(nvme, NQN, HOST, opts).await.expect("connect after the restart");
        assert_eq!(c.read(0, 2, 0, 1).await.expect("read"), block(100));
        assert_eq!(c.read(0, 2, 1, 1).await.expect("read"), block(101));
        assert_eq!(c.read(0, 1, 7, 1).await.expect("read"), block(7));
    }));
    drop(svc);
    let _ = std::fs::remove_dir_all(&dir);
}
