//! `ironwire serve`: builds the object model from the configuration, opens
//! the devices, and starts one reactor per configured core, each listening
//! on every port.

use crate::config::{Config, DeviceConfig, NamespaceConfig, SubsystemConfig};
use crate::iscsi_tcp::{IscsiModel, IscsiTarget};
use crate::nvme::{Namespace, Subsystem, Target};
use anyhow::{Context, Result};
use blockdev::{BlockDevice, Device, Latency, RbdOptions, Symlinks};
use nvmf::Settings;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Opens one device; a file or block path is resolved once, following
/// symlinks or refusing them as `symlinks` says.
pub fn open_device(d: &DeviceConfig, symlinks: Symlinks) -> Result<Device> {
    let bs = d.block_size.unwrap_or(512);
    let size = d.size.map(|s| s.0);
    let path = || d.path.as_deref().with_context(|| format!("device {:?}: path is required for {}", d.name, d.kind));
    let ro = d.read_only.unwrap_or(false);
    // File, block and rbd devices open read-only; null and RAM ones are
    // marked so.
    let marked = |dev: Device| if ro { dev.with_read_only() } else { dev };
    let dev = match d.kind.as_str() {
        "null" => Device::null(&d.name, size.unwrap_or(0), bs).map(marked),
        "ram" => Device::ram_with(&d.name, size.unwrap_or(0), bs, d.huge_pages.unwrap_or(true)).map(marked),
        "file" => Device::file_with(&d.name, path()?, size, bs, symlinks, ro),
        "block" => Device::block_with(&d.name, path()?, d.block_size, symlinks, ro),
        "rbd" => Device::rbd(&d.name, &rbd_options(d), bs),
        k => anyhow::bail!("device {:?}: kind {k:?} is not one of null, ram, file, block, rbd", d.name),
    };
    let latency = Latency {
        read: Duration::from_micros(d.read_latency_us.unwrap_or(0)),
        write: Duration::from_micros(d.write_latency_us.unwrap_or(0)),
    };
    Ok(dev.with_context(|| format!("device {:?}", d.name))?.with_latency(latency))
}

fn rbd_options(d: &DeviceConfig) -> RbdOptions {
    RbdOptions {
        ceph_conf: d.ceph_conf.clone().unwrap_or_else(|| rbd::DEFAULT_CEPH_CONF.into()),
        client: d.client.clone().unwrap_or_else(|| "admin".into()),
        keyring: d.keyring.clone(),
        pool: d.pool.clone().unwrap_or_default(),
        image: d.image.clone().unwrap_or_default(),
        timeout: d.connect_timeout.map_or(rbd::DEFAULT_TIMEOUT, Duration::from_secs),
        read_only: d.read_only.unwrap_or(false),
    }
}

/// Opens every device named in `config` (trusted: symlinks are followed,
/// as `/dev/disk/by-id` paths need).
pub fn open_devices(config: &Config) -> Result<HashMap<String, Arc<Device>>> {
    let mut devices = HashMap::new();
    for d in &config.device {
        devices.insert(d.name.clone(), Arc::new(open_device(d, Symlinks::Follow)?));
    }
    Ok(devices)
}

/// Builds the target from `config`.
pub fn build_target(config: &Config, devices: &HashMap<String, Arc<Device>>) -> Result<Arc<Target>> {
    crate::runtime::check_identifiers(config, devices)?;
    let t = &config.nvme_tcp;
    let target = Target::new(Settings {
        max_transfer: t.max_transfer,
        max_io_queues: t.max_io_queues,
        queue_entries: t.queue_entries,
        max_controllers: config.limits.controllers_per_subsystem,
        max_controllers_per_host: config.limits.controllers_per_host,
    });
    for s in &config.subsystem {
        let subsys = target.add_subsystem(subsystem(s)).map_err(anyhow::Error::msg)?;
        for (j, ns) in s.namespace.iter().enumerate() {
            let nsid = ns.nsid.unwrap_or(u32::try_from(j).unwrap_or(u32::MAX).saturating_add(1));
            let dev = devices.get(&ns.device).with_context(|| format!("no device {:?}", ns.device))?;
            subsys.add_namespace(namespace(&s.nqn, nsid, ns, dev)?).map_err(anyhow::Error::msg)?;
        }
    }
    Ok(Arc::new(target))
}

/// The live subsystem `s` describes, without namespaces.
pub fn subsystem(s: &SubsystemConfig) -> Subsystem {
    let serial = s.serial.clone().unwrap_or_else(|| serial_for(&s.nqn));
    let (min, max) = s.cntlid_range();
    Subsystem::new(&s.nqn, &serial, s.allow_any_host, s.hosts.clone()).with_cntlid_range(min..=max)
}

/// The live namespace `ns` describes, as `nsid` of `nqn` on `dev`.
pub fn namespace(nqn: &str, nsid: u32, ns: &NamespaceConfig, dev: &Arc<Device>) -> Result<Namespace> {
    let mut live = Namespace::new(nqn, nsid, dev.clone()).with_ana_state(ns.ana().map_err(anyhow::Error::msg)?);
    if let Some(nguid) = ns.nguid_bytes() {
        live = live.with_nguid(nguid.map_err(anyhow::Error::msg)?);
    }
    if let Some(uuid) = ns.uuid_bytes() {
        live = live.with_uuid(uuid.map_err(anyhow::Error::msg)?);
    }
    Ok(live)
}

/// The serial number of a subsystem whose configuration gives none.
pub fn serial_for(nqn: &str) -> String {
    let h = nqn.bytes().fold(0xcbf2_9ce4_8422_2325u64, |a, b| (a ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("IW{:016X}", h)
}

/// Builds the iSCSI targets of `config`.
fn build_iscsi(config: &Config, devices: &HashMap<String, Arc<Device>>) -> Result<Arc<IscsiModel>> {
    let mut targets = Vec::new();
    for t in &config.iscsi_target {
        targets.push(Arc::new(IscsiTarget::new(t, devices).with_context(|| format!("iSCSI target {}", t.iqn))?));
    }
    let disc = config.iscsi.discovery_chap.as_ref().map(|c| (c.user.clone(), c.secret.as_bytes().to_vec()));
    let handshake = std::time::Duration::from_millis(u64::from(config.timeouts.handshake_ms));
    let portals = crate::runtime::portals(config);
    Ok(Arc::new(
        IscsiModel::new(targets, portals, disc)
            .with_limits((config.limits.sessions_per_target, config.limits.sessions_per_host), handshake),
    ))
}

/// Where `serve` came from: the `--config` file (what `ctl reload` and
/// SIGHUP re-read, and `--persist` rewrites) and `--cores`.
pub struct Origin {
    /// `--config`.
    pub path: Option<std::path::PathBuf>,
    /// `--persist`.
    pub persist: bool,
    /// `--cores`.
    pub cores: Vec<usize>,
}

/// Runs the target until SIGINT or SIGTERM, then stops it in order
/// (`lifecycle`): drains the connections, flushes the devices, removes
/// the control socket.
pub fn run(mut config: Config, ctl_socket: &std::path::Path, origin: Origin) -> Result<()> {
    // Before any thread starts, so that every thread inherits the mask.
    let signals = crate::lifecycle::Signals::block()?;
    match crate::admit::raise_open_files() {
        Ok(n) => log::debug!("open-file limit {n}"),
        Err(e) => log::warn!("cannot raise the open-file limit: {e}"),
    }
    crate::runtime::normalize(&mut config);
    let devices = open_devices(&config)?;
    let target = build_target(&config, &devices)?;
    // Bind once here so an address in use is reported before any reactor
    // starts; the reactors bind their own SO_REUSEPORT sockets.
    let mut probed = Vec::new();
    for p in &config.port {
        let a: SocketAddr = p.address.parse().with_context(|| format!("port address {:?}", p.address))?;
        if !probed.contains(&a) {
            socket_probe(a).with_context(|| format!("cannot listen on {a}"))?;
            probed.push(a);
        }
    }
    let iscsi = build_iscsi(&config, &devices)?;
    let icfg = iscsi::target::TargetConfig {
        max_tasks: config.limits.tasks_per_session,
        write_budget: config.limits.iscsi_write_budget.0,
        ..iscsi::target::TargetConfig::default()
    };
    let limits = &config.limits;
    let admission = crate::admit::Admission::new(limits.connections_per_port, limits.connections_per_host);
    let ctx = crate::listen::Context {
        target: target.clone(),
        iscsi: iscsi.clone(),
        icfg,
        admission: admission.clone(),
        handshake: Duration::from_millis(u64::from(config.timeouts.handshake_ms)),
        user_timeout_ms: config.timeouts.tcp_user_timeout_ms,
    };
    let listeners = Arc::new(crate::listen::Listeners::new(&config, ctx));
    let cpus = if config.reactor.cores.is_empty() { reactor::available_cpus() } else { config.reactor.cores.clone() };
    let live = crate::runtime::Live {
        target: target.clone(),
        iscsi: iscsi.clone(),
        devices,
        listeners: listeners.clone(),
        reactors: cpus.len().max(1),
    };
    crate::runtime::add_ports(&live, &[], &config.port)?;
    let generation = listeners.set(&config.port)?;
    let control = Arc::new(crate::control::Control {
        target: target.clone(),
        allow_paths: config.control.allow_paths.clone(),
        state: std::sync::Mutex::new(crate::control::State { config: config.clone(), live }),
        changes: std::sync::Mutex::new(()),
        config_path: origin.path,
        persist: origin.persist,
        cores: origin.cores,
    });
    let ctl_socket = crate::control::spawn(control.clone(), ctl_socket, config.control.group.as_deref())?;
    crate::control::spawn_size_watch(&control)?;
    let (stop_tx, stop_rx) = std::sync::mpsc::channel();
    signals.spawn(stop_tx, ctl_socket.path().to_path_buf(), {
        let control = control.clone();
        move || match control.reload() {
            Ok(()) => log::info!("SIGHUP: configuration reloaded"),
            Err(e) => log::error!("SIGHUP: configuration not reloaded, nothing changed: {e:#}"),
        }
    })?;
    crate::stats::start_clock();
    if let Some(addr) = config.metrics.addr()? {
        crate::metrics::spawn(addr)?;
    }
    let registered = usize::try_from(config.reactor.registered_buffers.0).unwrap_or(usize::MAX);
    let rcfg = reactor::Config {
        poll: std::time::Duration::from_micros(u64::from(config.reactor.poll_us)),
        ..reactor::Config::default()
    };
    crate::conn::set_send_high_water(usize::try_from(limits.send_high_water.0).unwrap_or(usize::MAX));
    crate::conn::set_read_budget(usize::try_from(limits.read_budget.0).unwrap_or(usize::MAX));
    let (rx_count, rx_size) = (config.reactor.receive_buffers, config.reactor.receive_buffer_size.0 as usize);
    let handles = reactor::start(&cpus, rcfg, {
        let listeners = listeners.clone();
        move |id| {
            let listeners = listeners.clone();
            async move {
                crate::alloc::count_this_thread(format!("reactor-{}", id.index));
                crate::stats::register_reactor(id.index);
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
                log::debug!("reactor {} on cpu {:?}", id.index, id.cpu);
                listeners.serve(id.index).await;
            }
        }
    })?;
    listeners.wait(generation, handles.len(), Duration::from_secs(30)).map_err(anyhow::Error::msg)?;
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
    let iscsi_ports: Vec<&str> =
        config.port.iter().filter(|p| p.transport == "iscsi").map(|p| p.address.as_str()).collect();
    // Dropped once printed: a target's version holds its units, and with
    // them the devices of LUNs that may be removed later.
    let iscsi_targets = iscsi.targets();
    for t in &iscsi_targets {
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
    if let (Some(a), Some(t)) = (iscsi_ports.first(), iscsi_targets.first()) {
        ready.push(format!("iscsiadm -m discovery -t st -p {a}"));
        ready.push(format!("iscsiadm -m node -T {} -p {a} --login", t.iqn));
    }
    drop(iscsi_targets);
    // One command per line, so that each can be copied whole. A reader
    // that went away (`serve | head -1`) must not stop the target: write
    // errors are ignored.
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "ready: connect with any of:");
        for r in &ready {
            let _ = writeln!(out, "  {r}");
        }
        let _ = out.flush();
    }
    crate::lifecycle::notify("READY=1");
    let Ok(stop) = stop_rx.recv() else {
        anyhow::bail!("the signal thread ended");
    };
    // As the running configuration says now (a reload may change it).
    let drain_s = control.state.lock().map_or(config.shutdown.drain_s, |s| s.config.shutdown.drain_s);
    let drain = Duration::from_secs(u64::from(drain_s));
    let left = crate::lifecycle::drain(stop, drain, || admission.open());
    if left > 0 {
        log::warn!("{left} connections still open after the drain and its grace period; closing them");
    }
    // No change runs from here on (a change in progress ends first): none
    // opens a device this flush misses, or writes the configuration file
    // after it.
    let _quiet = control.quiesce();
    let devices: Vec<Arc<Device>> = control.devices();
    let flushed = flush_all(&devices, "stopping");
    // rbd images are closed, each on a thread of its own (a cluster that
    // does not answer delays no other): a client that just exits leaves
    // its watch and exclusive lock until the OSDs time it out, and other
    // clients' writes to the image wait for that.
    std::thread::scope(|s| {
        for d in devices.iter().filter(|d| d.kind() == blockdev::Kind::Rbd) {
            if std::thread::Builder::new().name("rbd-close".into()).spawn_scoped(s, || d.close()).is_err() {
                d.close();
            }
        }
    });
    drop(ctl_socket);
    drop(handles);
    let flushed = flushed?;
    log::info!("stopped: flushed {flushed} devices, removed the control socket");
    Ok(())
}

/// Flushes every device with a volatile write cache, on a ring of the
/// calling thread; the number flushed, or the first failure (after trying
/// them all), each failure logged after `why`.
pub fn flush_all(devices: &[Arc<Device>], why: &str) -> Result<usize> {
    let mut rt = reactor::Runtime::new(reactor::Config::default()).context("a ring to flush the devices on")?;
    rt.block_on(async {
        let mut flushed = 0;
        let mut failed = None;
        for d in devices.iter().filter(|d| d.volatile_write_cache()) {
            match d.flush().await {
                Ok(()) => flushed += 1,
                Err(e) => {
                    log::error!("{why}: flushing device {} failed: {e}", d.name());
                    failed.get_or_insert_with(|| anyhow::anyhow!("flushing device {}: {e}", d.name()));
                }
            }
        }
        failed.map_or(Ok(flushed), Err)
    })
}

/// How long `serve` waits for a port still held by a process that just
/// died: the kernel closes a killed process's io_uring, and the listening
/// sockets its pending accepts hold, a little after the process is gone.
const PORT_RELEASE_WAIT: Duration = Duration::from_secs(5);

fn socket_probe(addr: SocketAddr) -> std::io::Result<()> {
    // A std listener with SO_REUSEPORT would succeed even against another
    // process's listener (and share its connections); a plain bind detects
    // a port in use.
    let give_up = std::time::Instant::now() + PORT_RELEASE_WAIT;
    let mut said = false;
    loop {
        match std::net::TcpListener::bind(addr) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && std::time::Instant::now() < give_up => {
                if !said {
                    log::info!(
                        "{addr} is in use; waiting up to {} s for it to be released",
                        PORT_RELEASE_WAIT.as_secs()
                    );
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            r => return r.map(drop),
        }
    }
}
