//! The control plane: a Unix-socket API that edits the running target
//! (devices, namespaces, allowed hosts) and shows its state.
//!
//! One request per line, one reply: lines of output ending with `ok`, or a
//! single `error: ...` line. It runs on its own thread with blocking I/O and
//! takes the object model's locks; reactors never wait on it.

use crate::config::{parse_size, DeviceConfig, Size};
use crate::nvme::{Namespace, Target};
use anyhow::{anyhow, bail, Context, Result};
use blockdev::BlockDevice;
use blockdev::Device;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Shared state the control plane edits.
pub struct Control {
    /// The target.
    pub target: Arc<Target>,
    /// Devices by name.
    pub devices: Mutex<HashMap<String, Arc<Device>>>,
}

/// The socket path when none is configured.
pub fn default_socket() -> PathBuf {
    PathBuf::from("/tmp/ironwire.sock")
}

/// Serves the control socket at `path` on a new thread.
pub fn spawn(ctl: Arc<Control>, path: &Path) -> Result<()> {
    if path.exists() {
        // A live daemon answers; a stale socket file is replaced.
        if UnixStream::connect(path).is_ok() {
            bail!("control socket {} is in use by another ironwire", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("removing stale {}", path.display()))?;
    }
    let listener = UnixListener::bind(path).with_context(|| format!("binding control socket {}", path.display()))?;
    std::thread::Builder::new().name("control".into()).spawn(move || {
        for stream in listener.incoming().flatten() {
            let ctl = ctl.clone();
            std::thread::spawn(move || serve_client(&ctl, stream));
        }
    })?;
    Ok(())
}

fn serve_client(ctl: &Control, stream: UnixStream) {
    let Ok(mut out) = stream.try_clone() else { return };
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { return };
        let reply = match ctl.handle(line.trim()) {
            Ok(text) => format!("{text}ok\n"),
            Err(e) => format!("error: {e:#}\n"),
        };
        if out.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

impl Control {
    /// Runs one command line and returns its output.
    pub fn handle(&self, line: &str) -> Result<String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["show"] => Ok(self.show()),
            ["stats"] => Ok(stats()),
            ["device-add", name, kind, rest @ ..] => self.device_add(name, kind, rest).map(|_| String::new()),
            ["ns-add", nqn, nsid, device] => {
                let nsid: u32 = nsid.parse().map_err(|_| anyhow!("nsid {nsid:?} is not a number"))?;
                let dev = self.devices.lock().unwrap_or_else(|e| e.into_inner()).get(*device).cloned();
                let dev = dev.ok_or_else(|| anyhow!("no device named {device:?}"))?;
                let s = self.target.subsystem(nqn).filter(|s| !s.discovery).ok_or_else(|| anyhow!("no subsystem {nqn}"))?;
                s.add_namespace(Namespace::new(nqn, nsid, dev)).map_err(anyhow::Error::msg)?;
                log::info!("control: added namespace {nsid} ({device}) to {nqn}");
                Ok(String::new())
            }
            ["ns-remove", nqn, nsid] => {
                let nsid: u32 = nsid.parse().map_err(|_| anyhow!("nsid {nsid:?} is not a number"))?;
                let s = self.target.subsystem(nqn).filter(|s| !s.discovery).ok_or_else(|| anyhow!("no subsystem {nqn}"))?;
                s.remove_namespace(nsid).ok_or_else(|| anyhow!("{nqn} has no namespace {nsid}"))?;
                log::info!("control: removed namespace {nsid} from {nqn}");
                Ok(String::new())
            }
            [] => bail!("empty command"),
            _ => bail!("unknown command {line:?} (show | stats | device-add NAME KIND [size=S] [block_size=N] [path=P] | ns-add NQN NSID DEVICE | ns-remove NQN NSID)"),
        }
    }

    fn show(&self) -> String {
        let mut out = String::new();
        let devices = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<&String> = devices.keys().collect();
        names.sort();
        for n in names {
            if let Some(d) = devices.get(n) {
                let g = d.geometry();
                out.push_str(&format!("device {n} {} blocks={} block_size={}\n", d.kind(), g.blocks, g.block_size));
            }
        }
        for p in self.target.ports() {
            out.push_str(&format!("port {} tcp {}\n", p.id, p.addr));
        }
        for s in self.target.subsystems() {
            out.push_str(&format!("subsystem {} controllers={}\n", s.nqn, s.controller_count()));
            for ns in s.namespaces() {
                out.push_str(&format!("  namespace {} device={}\n", ns.nsid, ns.device.name()));
            }
        }
        out
    }

    fn device_add(&self, name: &str, kind: &str, rest: &[&str]) -> Result<()> {
        let mut cfg = DeviceConfig { name: name.to_string(), kind: kind.to_string(), ..DeviceConfig::default() };
        for kv in rest {
            let (k, v) = kv.split_once('=').ok_or_else(|| anyhow!("{kv:?} is not key=value"))?;
            match k {
                "size" => cfg.size = Some(Size(parse_size(v).map_err(anyhow::Error::msg)?)),
                "block_size" => {
                    cfg.block_size = Some(v.parse().map_err(|_| anyhow!("block_size {v:?} is not a number"))?)
                }
                "path" => cfg.path = Some(PathBuf::from(v)),
                _ => bail!("unknown device attribute {k:?} (size, block_size, path)"),
            }
        }
        let mut devices = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        if devices.contains_key(name) {
            bail!("device {name:?} already exists");
        }
        let dev = crate::serve::open_device(&cfg)?;
        devices.insert(name.to_string(), Arc::new(dev));
        log::info!("control: added device {name} ({kind})");
        Ok(())
    }
}

/// The daemon's CPU use since it started: the process (user and system
/// microseconds, what `ironwire bench --target-ctl` reads) and each reactor
/// thread, with the number of heap allocations it made.
fn stats() -> String {
    let mut out = crate::cpu::stats_line();
    let allocs = crate::alloc::counts();
    for (name, cpu) in crate::cpu::threads_cpu("reactor-") {
        out.push_str(&format!("thread {name} cpu_us={}", cpu.as_micros()));
        if let Some((_, n)) = allocs.iter().find(|(n, _)| *n == name) {
            out.push_str(&format!(" allocs={n}"));
        }
        out.push('\n');
    }
    out
}

/// Sends one command to the daemon at `socket` and returns its output
/// (without the final `ok`); a daemon error becomes the error.
pub fn request(socket: &Path, command: &str) -> Result<String> {
    let mut s = UnixStream::connect(socket)
        .with_context(|| format!("connecting to {} (is ironwire serve running?)", socket.display()))?;
    s.write_all(format!("{command}\n").as_bytes())?;
    let mut reader = BufReader::new(s);
    let mut out = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            bail!("daemon closed the connection");
        }
        if line == "ok\n" {
            return Ok(out);
        }
        if let Some(e) = line.strip_prefix("error: ") {
            bail!("{}", e.trim_end());
        }
        out.push_str(&line);
    }
}

/// `ironwire ctl`: sends one command to a running daemon and prints the
/// reply; fails when the daemon reports an error.
pub fn client(socket: &Path, command: &[String]) -> Result<()> {
    print!("{}", request(socket, &command.join(" "))?);
    Ok(())
}
