//! The daemon under test, shared by the integration test files: each test
//! starts its own `ironwire serve` on a free port with its own control
//! socket and temp dir, waits (bounded) for its ready line, and kills it
//! when the guard drops.
#![allow(dead_code)] // each test file uses its own subset

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A running daemon; killed on drop.
pub struct Daemon {
    child: Child,
    /// How it was started, for [`Daemon::restart`].
    launch: Launch,
    /// The port it listens on (127.0.0.1).
    pub addr: SocketAddr,
    /// Its temp dir: config, log, control socket, file devices.
    pub dir: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Daemon {
    /// Starts the daemon with the whole configuration `config(dir, port)`
    /// and waits for its ready line. A port taken between probing and
    /// binding is retried on another.
    pub fn start_with(tag: &str, config: impl Fn(&Path, u16) -> String) -> Daemon {
        Daemon::start_inner(tag, &[], &[], true, &[], config)
    }

    /// As [`Daemon::start_with`], with `env` added to the daemon's
    /// environment.
    pub fn start_env(tag: &str, env: &[(&str, &str)], config: impl Fn(&Path, u16) -> String) -> Daemon {
        Daemon::start_inner(tag, &[], &[], true, env, config)
    }

    /// As [`Daemon::start_with`], with `args` added to `serve` (e.g.
    /// `--persist`).
    pub fn start_args(tag: &str, args: &[&str], config: impl Fn(&Path, u16) -> String) -> Daemon {
        Daemon::start_inner(tag, &[], args, true, &[], config)
    }

    /// As [`Daemon::start_with`], run under `wrapper` (a command and its
    /// arguments that execs the rest, e.g. `prlimit --nofile=64:64 --`).
    pub fn start_under(tag: &str, wrapper: &[&str], config: impl Fn(&Path, u16) -> String) -> Daemon {
        Daemon::start_inner(tag, wrapper, &[], true, &[], config)
    }

    /// Like [`Daemon::start_with`] without `--ctl-socket`: the socket is
    /// where the configuration (`[control] socket`) puts it.
    pub fn start_with_config_socket(tag: &str, config: impl Fn(&Path, u16) -> String) -> Daemon {
        Daemon::start_inner(tag, &[], &[], false, &[], config)
    }

    fn start_inner(
        tag: &str,
        wrapper: &[&str],
        args: &[&str],
        ctl_socket_flag: bool,
        env: &[(&str, &str)],
        config: impl Fn(&Path, u16) -> String,
    ) -> Daemon {
        let dir = std::env::temp_dir().join(format!("ironwire-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        // The daemon refuses a control socket directory others may write.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("chmod temp dir");
        for _ in 0..3 {
            // Configurations may use port + 1 too (an iSCSI portal beside
            // NVMe): both must be free.
            let port = free_port_pair();
            let cfg = dir.join("ironwire.toml");
            std::fs::write(&cfg, config(&dir, port)).expect("write config");
            let launch = Launch {
                wrapper: wrapper.iter().map(|w| w.to_string()).collect(),
                config: cfg,
                args: args.iter().map(|a| a.to_string()).collect(),
                ctl_socket: ctl_socket_flag.then(|| dir.join("ctl.sock")),
                env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                log: dir.join("daemon.log"),
            };
            match launch.spawn() {
                Ok(child) => {
                    return Daemon { child, launch, addr: SocketAddr::from(([127, 0, 0, 1], port)), dir };
                }
                Err(mut child) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let log = std::fs::read_to_string(dir.join("daemon.log")).unwrap_or_default();
                    eprintln!("daemon did not become ready on port {port}; log:\n{log}");
                }
            }
        }
        panic!("ironwire did not start; see {}", dir.display());
    }

    /// What the daemon logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// The daemon's process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The daemon's resident memory (VmRSS), KiB.
    pub fn rss_kib(&self) -> u64 {
        self.status_kib("VmRSS:")
    }

    /// The daemon's writable private address space (VmData) in KiB:
    /// the heap as far as it is usable, touched or not.
    pub fn data_kib(&self) -> u64 {
        self.status_kib("VmData:")
    }

    fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("status");
        let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("{field}"));
        line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{field} value"))
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits (at most `secs` seconds) for the process to exit on its own.
    pub fn wait_exit(&mut self, secs: u64) -> Option<std::process::ExitStatus> {
        for _ in 0..secs * 20 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Kills the process with SIGKILL and waits for it; its dir stays.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// [`ctl`] on this daemon's socket, `words` split at whitespace.
    pub fn ctl(&self, words: &str) -> Result<String, String> {
        ctl(&self.dir.join("ctl.sock"), &words.split_whitespace().collect::<Vec<_>>())
    }

    /// Sends the daemon signal `sig`.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid has no memory effects.
        let rc = unsafe { libc::kill(self.pid() as i32, sig) };
        assert_eq!(rc, 0, "kill({}, {sig})", self.pid());
    }

    /// Starts the daemon again, as before (same configuration, ports,
    /// control socket and log, which it appends to), once the process
    /// exited; panics if it does not become ready.
    pub fn restart(&mut self) {
        assert!(self.wait_exit(30).is_some(), "the daemon has not exited; log:\n{}", self.log());
        match self.launch.spawn() {
            Ok(child) => self.child = child,
            Err(_) => panic!("the daemon did not start again; log:\n{}", self.log()),
        }
    }

    /// Asserts the process is still running.
    pub fn assert_alive(&mut self) {
        assert!(self.alive(), "daemon exited; log:\n{}", self.log());
    }
}

/// A port P with P + 1 free as well (at the time of asking).
fn free_port_pair() -> u16 {
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
        let port = l.local_addr().expect("local addr").port();
        if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
}

/// How a daemon is started.
struct Launch {
    wrapper: Vec<String>,
    config: PathBuf,
    args: Vec<String>,
    ctl_socket: Option<PathBuf>,
    env: Vec<(String, String)>,
    log: PathBuf,
}

impl Launch {
    /// Spawns the daemon and waits (bounded) for its ready line: the child
    /// when it is ready, `Err(child)` otherwise.
    fn spawn(&self) -> Result<Child, Child> {
        let exe = Path::new(env!("CARGO_BIN_EXE_ironwire"));
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("log file");
        let mut command = match self.wrapper.split_first() {
            Some((w, args)) => {
                let mut c = Command::new(w);
                c.args(args).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        command.args(["serve", "--config"]).arg(&self.config).args(&self.args);
        if let Some(s) = &self.ctl_socket {
            command.arg("--ctl-socket").arg(s);
        }
        let mut child = command
            .env("RUST_LOG", std::env::var("IRONWIRE_TEST_LOG").unwrap_or("info".into()))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn ironwire");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Reads to the end, so the daemon never writes into a closed
            // pipe.
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        loop {
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(l) if l.starts_with("ready:") => return Ok(child),
                Ok(_) => continue,
                Err(_) => return Err(child),
            }
        }
    }
}

/// `ironwire ctl --socket SOCKET ARGS...`, the real client, bounded to 60 s:
/// its stdout, or its stderr when it failed.
pub fn ctl(socket: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("timeout")
        .arg("60")
        .arg(env!("CARGO_BIN_EXE_ironwire"))
        .arg("ctl")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run ironwire ctl");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// How many descriptors process `pid` holds on `path`.
pub fn open_fds(pid: u32, path: &Path) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd dir")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|p| p == path)
        .count()
}

/// Runs `f` on a reactor (io_uring) runtime.
pub fn block_on<F: Future>(f: F) -> F::Output {
    reactor::Runtime::new(reactor::Config::default()).expect("io_uring runtime").block_on(f)
}

/// Bounds a whole test body: a stuck test fails instead of hanging.
pub async fn bounded<F: Future>(secs: u64, f: F) -> F::Output {
    reactor::timeout(Duration::from_secs(secs), f).await.expect("test body timed out")
}

/// Configuration snippets the daemon tests put together.
pub mod iscsi_raw;

pub mod toml {
    /// A 4 MiB RAM device named `name` that holds each read and each write
    /// for the given microseconds (0: not held).
    pub fn ram(name: &str, read_latency_us: u128, write_latency_us: u128) -> String {
        let mut s = format!("[[device]]\nname = \"{name}\"\nkind = \"ram\"\nsize = \"4MiB\"\n");
        if read_latency_us > 0 {
            s.push_str(&format!("read_latency_us = {read_latency_us}\n"));
        }
        if write_latency_us > 0 {
            s.push_str(&format!("write_latency_us = {write_latency_us}\n"));
        }
        s.push('\n');
        s
    }

    /// An iSCSI target open to any initiator, with LUN `i` on `devices[i]`.
    pub fn iscsi_target(iqn: &str, devices: &[&str]) -> String {
        let mut s = format!("[[iscsi_target]]\niqn = \"{iqn}\"\nallow_any_initiator = true\n");
        for (lun, d) in devices.iter().enumerate() {
            s.push_str(&format!("[[iscsi_target.lun]]\nlun = {lun}\ndevice = \"{d}\"\n"));
        }
        s.push('\n');
        s
    }

    /// An iSCSI portal on 127.0.0.1:`port`.
    pub fn iscsi_port(port: u16) -> String {
        format!("[[port]]\ntransport = \"iscsi\"\naddress = \"127.0.0.1:{port}\"\n\n")
    }
}

/// Runs `ironwire serve` with `args`, which is expected to exit on its own
/// (the bound, 60 s, only keeps a hang from stalling the suite; a daemon
/// still running then is killed): how it exited, if it did, and its
/// stderr.
pub fn serve_until_exit(args: &[&std::ffi::OsStr]) -> (Option<std::process::ExitStatus>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ironwire"))
        .arg("serve")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ironwire");
    let mut status = None;
    for _ in 0..600 {
        if let Some(s) = child.try_wait().expect("wait") {
            status = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err);
    (status, err)
}
