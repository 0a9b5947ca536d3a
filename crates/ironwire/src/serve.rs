//! `ironwire serve`: builds the object model from the configuration, opens
//! the devices, and starts one reactor per configured core, each listening
//! on every port.

use crate::config::{Config, DeviceConfig};
use crate::iscsi_tcp::{IscsiModel, IscsiTarget};
use crate::nvme::{Namespace, Subsystem, Target};
use anyhow::{Context, Result};
use blockdev::{BlockDevice, Device, Latency};
use nvmf::Settings;
use nvmf_tcp::target::TargetConfig;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Opens one device.
pub fn open_device(d: &DeviceConfig) -> Result<Device> {
    let bs = d.block_size.unwrap_or(512);
    let size = d.size.map(|s| s.0);
    let path = || d.path.as_deref().with_context(|| format!("device {:?}: path is required for {}", d.name, d.kind));
    let dev = match d.kind.as_str() {
        "null" => Device::null(&d.name, size.unwrap_or(0), bs),
        "ram" => Device::ram(&d.name, size.unwrap_or(0), bs),
        "file" => Device::file(&d.name, path()?, size, bs),
        "block" => Device::block(&d.name, path()?, d.block_size),
        k => anyhow::bail!("device {:?}: kind {k:?} is not one of null, ram, file, block", d.name),
    };
    let latency = Latency {
        read: Duration::from_micros(d.read_latency_us.unwrap_or(0)),
        write: Duration::from_micros(d.write_latency_us.unwrap_or(0)),
    };
    Ok(dev.with_context(|| format!("device {:?}", d.name))?.with_latency(latency))
}

/// Opens every device named in `config`.
pub fn open_devices(config: &Config) -> Result<HashMap<String, Arc<Device>>> {
    let mut devices = HashMap::new();
    for d in &config.device {
        devices.insert(d.name.clone(), Arc::new(open_device(d)?));
    }
    Ok(devices)
}

/// Builds the target from `config`.
pub fn build_target(config: &Config, devices: &HashMap<String, Arc<Device>>) -> Result<Arc<Target>> {
    let t = &config.nvme_tcp;
    let target = Target::new(Settings {
        max_transfer: t.max_transfer,
        max_io_queues: t.max_io_queues,
        queue_entries: t.queue_entries,
        max_controllers: config.limits.controllers_per_subsystem,
    });
    for s in &config.subsystem {
        let serial = s.serial.clone().unwrap_or_else(|| serial_for(&s.nqn));
        let subsys = target
            .add_subsystem(Subsystem::new(&s.nqn, &serial, s.allow_any_host, s.hosts.clone()))
            .map_err(anyhow::Error::msg)?;
        for (j, ns) in s.namespace.iter().enumerate() {
            let nsid = ns.nsid.unwrap_or(u32::try_from(j).unwrap_or(u32::MAX).saturating_add(1));
            let dev = devices.get(&ns.device).with_context(|| format!("no device {:?}", ns.device))?;
            subsys.add_namespace(Namespace::new(&s.nqn, nsid, dev.clone())).map_err(anyhow::Error::msg)?;
        }
    }
    Ok(Arc::new(target))
}

fn serial_for(nqn: &str) -> String {
    let h = nqn.bytes().fold(0xcbf2_9ce4_8422_2325u64, |a, b| (a ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("IW{:016X}", h)
}

/// The protocol a listening address speaks.
#[derive(Clone, Copy)]
enum Protocol {
    /// NVMe/TCP, NVMe/RDMA over iWARP, or both.
    Nvme(crate::nvme::Bindings),
    Iscsi,
}

/// Builds the iSCSI targets of `config`.
fn build_iscsi(
    config: &Config,
    devices: &HashMap<String, Arc<Device>>,
    portals: Vec<String>,
) -> Result<Arc<IscsiModel>> {
    let mut targets = Vec::new();
    for t in &config.iscsi_target {
        targets.push(Arc::new(IscsiTarget::new(t, devices).with_context(|| format!("iSCSI target {}", t.iqn))?));
    }
    let disc = config.iscsi.discovery_chap.as_ref().map(|c| (c.user.clone(), c.secret.as_bytes().to_vec()));
    let handshake = std::time::Duration::from_millis(u64::from(config.timeouts.handshake_ms));
    Ok(Arc::new(IscsiModel::new(targets, portals, disc).with_limits(config.limits.sessions_per_target, handshake)))
}

/// Runs the target until SIGINT or SIGTERM (which remove the control
/// socket and exit) or until the process is killed.
pub fn run(config: Config, ctl_socket: &std::path::Path) -> Result<()> {
    // Before any thread starts, so that every thread inherits the mask.
    let signals = crate::control::ExitSignals::block()?;
    match crate::admit::raise_open_files() {
        Ok(n) => log::debug!("open-file limit {n}"),
        Err(e) => log::warn!("cannot raise the open-file limit: {e}"),
    }
    let devices = open_devices(&config)?;
    let target = build_target(&config, &devices)?;
    let tcp_transport = nvmf_tcp::transport(config.nvme_tcp.in_capsule_data);
    let rdma_transport = nvmf_rdma::transport(config.nvme_tcp.in_capsule_data);
    let tcfg = TargetConfig {
        max_h2c_data: config.nvme_tcp.max_h2c_data,
        max_in_capsule: config.nvme_tcp.in_capsule_data.max(8192),
        max_transfer: config.nvme_tcp.max_transfer,
        cpda: 0,
        c2h_success_always: config.nvme_tcp.c2h_success == crate::config::C2hSuccess::Always,
        r2t_buffer: u32::try_from(config.nvme_tcp.r2t_buffer.0).unwrap_or(u32::MAX),
    };
    let rdma_cfg = |crc: Option<bool>| nvmf_rdma::target::TargetConfig {
        crc: crc.unwrap_or(true),
        max_in_capsule: config.nvme_tcp.in_capsule_data,
        max_transfer: config.nvme_tcp.max_transfer,
        max_queue_entries: config.nvme_tcp.queue_entries,
        ..nvmf_rdma::target::TargetConfig::default()
    };
    let mut ports: Vec<(SocketAddr, Protocol)> = Vec::new();
    // Bind once here so an address in use is reported before any reactor
    // starts; the reactors bind their own SO_REUSEPORT sockets.
    for p in &config.port {
        let a: SocketAddr = p.address.parse().with_context(|| format!("port address {:?}", p.address))?;
        let at = match ports.iter().position(|(b, _)| *b == a) {
            Some(at) => at,
            None => {
                socket_probe(a).with_context(|| format!("cannot listen on {a}"))?;
                let none = crate::nvme::Bindings { tcp: None, rdma: None };
                let proto = if p.transport == "iscsi" { Protocol::Iscsi } else { Protocol::Nvme(none) };
                ports.push((a, proto));
                ports.len() - 1
            }
        };
        match (&mut ports[at].1, p.transport.as_str()) {
            (Protocol::Nvme(b), "tcp") => {
                target.add_port(a, tcp_transport, p.discovery_only);
                b.tcp = Some((tcfg, tcp_transport));
            }
            (Protocol::Nvme(b), "rdma") => {
                target.add_port(a, rdma_transport, p.discovery_only);
                b.rdma = Some((rdma_cfg(p.crc), rdma_transport));
            }
            (Protocol::Iscsi, "iscsi") => {}
            (_, t) => anyhow::bail!("port {a}: {t} cannot share this address (check-config names the pair)"),
        }
    }
    let portals = ports.iter().filter(|p| matches!(p.1, Protocol::Iscsi)).map(|(a, _)| format!("{a},1")).collect();
    let iscsi = build_iscsi(&config, &devices, portals)?;
    let control = Arc::new(crate::control::Control {
        target: target.clone(),
        devices: std::sync::Mutex::new(devices),
        allow_paths: config.control.allow_paths.clone(),
    });
    let ctl_socket = crate::control::spawn(control, ctl_socket, config.control.group.as_deref())?;
    signals.remove_on_exit(ctl_socket.path().to_path_buf())?;
    let cpus = if config.reactor.cores.is_empty() { reactor::available_cpus() } else { config.reactor.cores.clone() };
    let icfg = iscsi::target::TargetConfig {
        max_tasks: config.limits.tasks_per_session,
        ..iscsi::target::TargetConfig::default()
    };
    let registered = usize::try_from(config.reactor.registered_buffers.0).unwrap_or(usize::MAX);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let rcfg = reactor::Config {
        poll: std::time::Duration::from_micros(u64::from(config.reactor.poll_us)),
        ..reactor::Config::default()
    };
    let limits = &config.limits;
    let admission = crate::admit::Admission::new(limits.connections_per_port, limits.connections_per_host);
    let counts: Vec<Arc<crate::admit::PortCount>> = ports.iter().map(|_| Arc::default()).collect();
    let handshake = Duration::from_millis(u64::from(config.timeouts.handshake_ms));
    let user_timeout_ms = config.timeouts.tcp_user_timeout_ms;
    crate::conn::set_send_high_water(usize::try_from(limits.send_high_water.0).unwrap_or(usize::MAX));
    let (rx_count, rx_size) = (config.reactor.receive_buffers, config.reactor.receive_buffer_size.0 as usize);
    let handles = reactor::start(&cpus, rcfg, {
        let target = target.clone();
        let iscsi = iscsi.clone();
        let ports = ports.clone();
        let counts = counts.clone();
        let admission = admission.clone();
        move |id| {
            let target = target.clone();
            let iscsi = iscsi.clone();
            let ports = ports.clone();
            let counts = counts.clone();
            let admission = admission.clone();
            let ready_tx = ready_tx.clone();
            let icfg = icfg.clone();
            async move {
                crate::alloc::count_this_thread(format!("reactor-{}", id.index));
                if registered > 0 {
                    // Without the memlock allowance (non-root, low
                    // RLIMIT_MEMLOCK) the reactor runs on ordinary buffers.
                    if let Err(e) = blockdev::register_buffers(registered) {
                        log::warn!(
                            "reactor {}: cannot register {registered} bytes of I/O buffers ({e}); using unregistered \
                             buffers (see [reactor] registered_buffers)",
                            id.index
                        );
                    }
                }
                if rx_count > 0 {
                    if let Err(e) = reactor::register_receive_buffers(rx_count, rx_size) {
                        log::warn!(
                            "reactor {}: no shared receive buffers ({e}); each connection receives into its own",
                            id.index
                        );
                    }
                }
                let mut listeners = Vec::new();
                for ((a, proto), count) in ports.iter().zip(&counts) {
                    match reactor::listen(*a) {
                        Ok(l) => listeners.push((l, *proto, count.clone())),
                        Err(e) => {
                            let _ = ready_tx.send(Err(format!("reactor {}: listen {a}: {e}", id.index)));
                            return;
                        }
                    }
                }
                let _ = ready_tx.send(Ok(()));
                log::debug!("reactor {} on cpu {:?} serving {} ports", id.index, id.cpu, listeners.len());
                let mut tasks = Vec::new();
                for (l, proto, count) in listeners {
                    let target = target.clone();
                    let iscsi = iscsi.clone();
                    let icfg = icfg.clone();
                    let admission = admission.clone();
                    tasks.push(reactor::spawn(async move {
                        let what = match l.local_addr() {
                            Ok(a) => format!("port {a}"),
                            Err(_) => "a port".to_string(),
                        };
                        let mut backoff = crate::admit::Backoff::default();
                        loop {
                            match l.accept().await {
                                Ok((stream, peer)) => {
                                    backoff.accepted(&what);
                                    // Over a limit the stream drops here: the
                                    // peer sees the connection closed.
                                    let Some(slot) = admission.admit(&count, peer.ip(), &what) else { continue };
                                    if user_timeout_ms > 0 {
                                        if let Err(e) = stream.set_user_timeout(user_timeout_ms) {
                                            log::debug!("{peer}: TCP_USER_TIMEOUT: {e}");
                                        }
                                    }
                                    match proto {
                                        Protocol::Nvme(bindings) => reactor::spawn(holding(
                                            slot,
                                            crate::nvme::serve(stream, target.clone(), bindings, handshake),
                                        )),
                                        Protocol::Iscsi => reactor::spawn(holding(
                                            slot,
                                            crate::iscsi_tcp::serve(stream, iscsi.clone(), icfg.clone()),
                                        )),
                                    };
                                }
                                Err(e) => {
                                    if let Some(wait) = backoff.failed(&what, &e) {
                                        reactor::sleep(wait).await;
                                    }
                                }
                            }
                        }
                    }));
                }
                for t in tasks {
                    t.await;
                }
            }
        }
    })?;
    for _ in 0..handles.len() {
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => anyhow::bail!(e),
            Err(_) => anyhow::bail!("a reactor stopped during startup"),
        }
    }
    eprintln!("ironwire {}: {} reactor(s) on cpus {:?}", crate::VERSION, handles.len(), cpus);
    for p in target.ports().iter().filter(|p| p.discovery_only) {
        eprintln!("  nvme/{} {} discovery only", p.transport.name, p.addr);
    }
    for s in target.subsystems() {
        for p in target.ports().iter().filter(|p| !p.discovery_only) {
            let ns: Vec<String> = s.namespaces().iter().map(|n| format!("{}:{}", n.nsid, n.device.name())).collect();
            eprintln!("  nvme/{} {} {} namespaces [{}]", p.transport.name, p.addr, s.nqn, ns.join(", "));
        }
    }
    let iscsi_ports: Vec<SocketAddr> = ports.iter().filter(|p| matches!(p.1, Protocol::Iscsi)).map(|p| p.0).collect();
    for t in &iscsi.targets {
        for a in &iscsi_ports {
            let luns: Vec<String> = t.units.iter().map(|(n, u)| format!("{n}:{}", u.lu.device.name())).collect();
            eprintln!("  iscsi {a} {} luns [{}]", t.iqn, luns.join(", "));
        }
    }
    let mut ready = Vec::new();
    for name in ["tcp", "rdma"] {
        let port = target.ports().into_iter().find(|p| !p.discovery_only && p.transport.name == name);
        if let (Some(p), Some(s)) = (port, target.subsystems().first()) {
            ready.push(format!("nvme connect -t {name} -a {} -s {} -n {}", p.addr.ip(), p.addr.port(), s.nqn));
        }
    }
    if let (Some(a), Some(t)) = (iscsi_ports.first(), iscsi.targets.first()) {
        ready.push(format!("iscsiadm -m discovery -t st -p {a}"));
        ready.push(format!("iscsiadm -m node -T {} -p {a} --login", t.iqn));
    }
    // One command per line, so that each can be copied whole.
    println!("ready: connect with any of:");
    for r in &ready {
        println!("  {r}");
    }
    for h in handles {
        let _ = h.join();
    }
    drop(ctl_socket);
    Ok(())
}

/// Runs a connection's future, keeping its place in the connection counts
/// until it ends.
async fn holding(slot: crate::admit::Slot, conn: impl std::future::Future<Output = ()>) {
    conn.await;
    drop(slot);
}

fn socket_probe(addr: SocketAddr) -> std::io::Result<()> {
    // A std listener with SO_REUSEPORT would succeed even against another
    // process's listener; a plain bind detects a port in use.
    std::net::TcpListener::bind(addr).map(drop)
}
