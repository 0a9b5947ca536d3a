//! The running configuration and how a change reaches the live objects.
//!
//! The running [`Config`] is the single source of truth: every change (a
//! ctl edit, `ctl reload`, SIGHUP) produces a whole new configuration, which
//! passes the same `Config::validate` as `check-config`; then [`apply`]
//! changes only what differs between the two (devices, subsystems,
//! namespaces, allowed hosts, iSCSI targets, LUNs, ACLs, CHAP, ports) and
//! the new configuration is swapped in. Nothing is changed when a check
//! fails. A change that would pull an object from under a connected host
//! is refused, except a namespace, whose removal the hosts hear of through
//! the namespace-changed AEN, and a device's growth, which they hear of the
//! same way. The only connections a change drops are those of hosts it no
//! longer lets in ([`enforce_access`]).

use crate::config::{Config, DeviceConfig};
use crate::iscsi_tcp::{IscsiModel, IscsiTarget};
use crate::listen::Listeners;
use crate::nvme::Target;
use anyhow::{anyhow, bail, Context, Result};
use blockdev::BlockDevice;
use blockdev::{Device, Symlinks};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// How long a port change may take to reach every reactor.
const PORT_CHANGE_LIMIT: Duration = Duration::from_secs(5);

/// The live objects a configuration describes. A clone shares the
/// objects; only its map of devices is its own.
#[derive(Clone)]
pub struct Live {
    /// The NVMe-oF target.
    pub target: Arc<Target>,
    /// The iSCSI targets.
    pub iscsi: Arc<IscsiModel>,
    /// Devices by name.
    pub devices: HashMap<String, Arc<Device>>,
    /// The listening addresses on every reactor.
    pub listeners: Arc<Listeners>,
    /// How many reactors run.
    pub reactors: usize,
}

/// Writes the NSID and LUN every namespace and LUN gets by position, so
/// that configurations compare by what they export and saved files say it.
pub fn normalize(config: &mut Config) {
    for s in &mut config.subsystem {
        for (j, ns) in s.namespace.iter_mut().enumerate() {
            ns.nsid.get_or_insert(u32::try_from(j).unwrap_or(u32::MAX).saturating_add(1));
        }
    }
    for t in &mut config.iscsi_target {
        for (j, l) in t.lun.iter_mut().enumerate() {
            l.lun.get_or_insert(j as u64);
        }
    }
}

/// Refuses a change to the sections that are fixed while the daemon runs,
/// naming the first key that differs.
fn check_fixed(old: &Config, new: &Config) -> Result<()> {
    let fixed = |c: &Config| -> Result<toml::Table> {
        let mut t = toml::Table::new();
        t.insert("reactor".into(), toml::Value::try_from(&c.reactor)?);
        t.insert("nvme_tcp".into(), toml::Value::try_from(&c.nvme_tcp)?);
        t.insert("limits".into(), toml::Value::try_from(&c.limits)?);
        t.insert("timeouts".into(), toml::Value::try_from(&c.timeouts)?);
        t.insert("control".into(), toml::Value::try_from(&c.control)?);
        t.insert("metrics".into(), toml::Value::try_from(&c.metrics)?);
        Ok(t)
    };
    let (a, b) = (fixed(old)?, fixed(new)?);
    for (section, va) in &a {
        let (Some(ta), Some(tb)) = (va.as_table(), b.get(section).and_then(toml::Value::as_table)) else { continue };
        for key in ta.keys().chain(tb.keys()) {
            if ta.get(key) != tb.get(key) {
                bail!("{section}.{key}: cannot change while ironwire runs; restart it to apply");
            }
        }
    }
    Ok(())
}

/// Where a device is used in `config`: "namespace N of NQN" or "LUN N of
/// IQN".
fn users(config: &Config, device: &str) -> Vec<String> {
    let mut out = Vec::new();
    for s in &config.subsystem {
        for ns in s.namespace.iter().filter(|n| n.device == device) {
            out.push(format!("namespace {} of {}", ns.nsid.unwrap_or(0), s.nqn));
        }
    }
    for t in &config.iscsi_target {
        for l in t.lun.iter().filter(|l| l.device == device) {
            out.push(format!("LUN {} of {}", l.lun.unwrap_or(0), t.iqn));
        }
    }
    out
}

/// Changes the live objects from what `old` describes to what `new` does
/// (both normalized and valid). On error nothing has changed: the steps
/// that can fail come first (checks, opening devices, extending files to
/// grow, the reactors binding new ports, which go back to the ports in
/// force when one cannot or when a later step fails), then the steps that
/// cannot. The devices it opens resolve their paths as `symlinks` says:
/// [`Symlinks::Refuse`] for paths ctl checked against `[control]
/// allow_paths`, so that what is opened is what was checked.
/// Devices opened ahead of the change that uses them, by name, each with
/// the configuration it was opened from ([`preopen`]).
pub type Preopened = HashMap<String, (DeviceConfig, Arc<Device>)>;

/// Opens the rbd devices that `new` adds or changes against `old`: they
/// are slow to open (connect, open, size: up to `connect_timeout` each),
/// so ctl opens them before it takes the lock for the change, and
/// [`apply`] uses them.
pub fn preopen(old: &Config, new: &Config, symlinks: Symlinks) -> Result<Preopened> {
    let mut out = Preopened::new();
    for d in new.device.iter().filter(|d| d.kind == "rbd") {
        if old.device.iter().any(|o| o == d) {
            continue;
        }
        let dev = crate::serve::open_device(d, symlinks)?;
        out.insert(d.name.clone(), (d.clone(), Arc::new(dev)));
    }
    Ok(out)
}

pub fn apply(live: &mut Live, old: &Config, new: &Config, symlinks: Symlinks, preopened: &Preopened) -> Result<()> {
    check_fixed(old, new)?;
    // Checks first: a refusal leaves everything as it was.
    let old_dev: HashMap<&str, &DeviceConfig> = old.device.iter().map(|d| (d.name.as_str(), d)).collect();
    let mut to_open = Vec::new();
    let mut to_grow = Vec::new();
    for d in &new.device {
        match old_dev.get(d.name.as_str()) {
            Some(o) if *o == d => {}
            Some(o) => {
                let used = users(old, &d.name);
                if used.is_empty() {
                    to_open.push(d);
                    continue;
                }
                // A new size alone grows a null or file device in place.
                match (o.size, d.size) {
                    (Some(from), Some(to)) if matches!(d.kind.as_str(), "null" | "file") && o.same_but_size(d) => {
                        if to.0 < from.0 {
                            bail!(
                                "device {}: cannot shrink from {} to {} bytes while {} uses it",
                                d.name,
                                from.0,
                                to.0,
                                used.join(", ")
                            );
                        }
                        to_grow.push((d.name.as_str(), to.0));
                    }
                    _ => bail!(
                        "device {}: cannot change while {} uses it (only a null or file device's size may grow); remove those first",
                        d.name,
                        used.join(", ")
                    ),
                }
            }
            None => to_open.push(d),
        }
    }
    for s in &old.subsystem {
        let Some(live_s) = live.target.subsystem(&s.nqn) else { continue };
        match new.subsystem.iter().find(|n| n.nqn == s.nqn) {
            None if live_s.controller_count() > 0 => bail!(
                "subsystem {}: {} controller(s) connected; disconnect them before removing it",
                s.nqn,
                live_s.controller_count()
            ),
            Some(n) if recreated(s, n) && live_s.controller_count() > 0 => bail!(
                "subsystem {}: serial, min_cntlid and max_cntlid cannot change while controllers are connected",
                s.nqn
            ),
            _ => {}
        }
    }
    // LUN changes are published to the sessions (apply_iscsi); a target
    // removed takes no login from here on, as the change may wait long
    // (for the writes of what it removes) before it is gone, and a session
    // that logged in meanwhile would be on a target that no longer exists.
    let mut closed = Closed(Vec::new());
    for t in live.iscsi.targets().into_iter().filter(|l| !new.iscsi_target.iter().any(|n| n.iqn == l.iqn)) {
        if let Err(sessions) = t.close() {
            bail!("iSCSI target {}: {sessions} session(s) logged in; log them out before removing it", t.iqn);
        }
        closed.0.push(t);
    }
    let mut opened = HashMap::new();
    for d in to_open {
        let dev = match preopened.get(&d.name) {
            Some((c, dev)) if c == d => dev.clone(),
            _ => Arc::new(crate::serve::open_device(d, symlinks)?),
        };
        opened.insert(d.name.clone(), dev);
    }
    let mut devices = live.devices.clone();
    devices.retain(|name, _| new.device.iter().any(|d| &d.name == name));
    devices.extend(opened);
    // What adding a namespace would refuse, checked before anything is
    // changed: identifiers derived from the opened devices (an rbd image
    // exported twice) or configured.
    check_identifiers(new, &devices)?;
    // Growing is all-or-nothing: every file is extended before any device
    // takes its new size (an extended file alone changes nothing), so a
    // failure here, or at the ports below, leaves every capacity as the
    // configuration that stays in force says.
    let mut growths = Vec::with_capacity(to_grow.len());
    for (name, bytes) in to_grow {
        let Some(dev) = live.devices.get(name) else { continue };
        let growth = dev.prepare_grow(bytes).with_context(|| format!("device {name}: growing to {bytes} bytes"))?;
        growths.push((dev, growth));
    }

    // The addresses new ports need must be free: a plain bind, because the
    // reactors' SO_REUSEPORT listeners would share an address with another
    // process's listener rather than fail. One that overlaps an address
    // listened on now (the same one, or the wildcard of its port and one
    // address of it) would collide with this daemon's own listener: the
    // reactors' binds below still fail on another program's.
    let old_addrs: Vec<SocketAddr> = old.port.iter().filter_map(|p| p.address.parse().ok()).collect();
    for p in &new.port {
        let a: SocketAddr = p.address.parse().with_context(|| format!("port address {:?}", p.address))?;
        if old_addrs.iter().any(|&o| crate::config::listeners_overlap(o, a)) {
            continue;
        }
        std::net::TcpListener::bind(a).map(drop).with_context(|| format!("cannot listen on {a}"))?;
    }
    // Then every reactor binds them (an address can still be taken after
    // the check); if one cannot, the ports go back to what they were.
    if let Err(failed) = publish(live, &new.port) {
        return Err(match ports_back(live, &old.port) {
            Some(Ok(())) => anyhow!("cannot listen on the new ports ({failed}); nothing changed"),
            Some(Err(back)) => back_failed(anyhow!("cannot listen on the new ports ({failed})"), back),
            None => anyhow!("cannot listen on the new ports ({failed})"),
        });
    }

    // The objects' own checks ran above; should one still refuse (a host
    // connected meanwhile), the ports go back too.
    if let Err(e) = apply_nvme(live, &devices, old, new).and_then(|()| apply_iscsi(live, &devices, new)) {
        return Err(match ports_back(live, &old.port) {
            Some(Ok(())) | None => e,
            Some(Err(back)) => back_failed(e, back),
        });
    }

    // From here on every step succeeds.
    closed.0.clear();
    for (dev, growth) in growths {
        if growth.commit() {
            capacity_changed(live, dev);
        }
    }
    live.devices = devices;
    for p in old.port.iter().filter(|p| !new.port.contains(p)) {
        if let (Some(t), Ok(a)) = (live.listeners.nvme_transport(&p.transport), p.address.parse()) {
            live.target.remove_port(a, &t);
        }
    }
    add_ports(live, &old.port, &new.port)
}

/// The iSCSI targets a change removes, closed to logins
/// ([`IscsiTarget::close`]) until it is done; those still listed take
/// logins again when it drops: the change failed.
struct Closed(Vec<Arc<IscsiTarget>>);

impl Drop for Closed {
    fn drop(&mut self) {
        for t in &self.0 {
            t.reopen();
        }
    }
}

/// Flushes the devices of `before` (the live devices before a change,
/// from configuration `old` to `new`) that `after` no longer has (removed,
/// or opened anew by a change of their configuration) or that lost a
/// namespace or LUN they were exported as. A host told of a volatile
/// write cache makes its plain writes durable with a flush, which it can
/// no longer send once the namespace or LUN is gone, and closing a
/// descriptor flushes nothing; so the change does it, as a stop does for
/// the devices in force. Call it once the change applied (its removals
/// waited for the commands they ran).
pub fn flush_removed(
    before: &HashMap<String, Arc<Device>>,
    after: &HashMap<String, Arc<Device>>,
    old: &Config,
    new: &Config,
) -> Result<()> {
    let kept = exports(new);
    let unexported: Vec<&str> =
        exports(old).into_iter().filter(|e| !kept.contains(e)).map(|(_, _, device)| device).collect();
    let gone: Vec<Arc<Device>> = before
        .values()
        .filter(|d| !after.values().any(|a| Arc::ptr_eq(a, d)) || unexported.contains(&d.name()))
        .cloned()
        .collect();
    if gone.is_empty() {
        return Ok(());
    }
    let flushed = crate::serve::flush_all(&gone, "removing a device")?;
    if flushed > 0 {
        let names: Vec<&str> = gone.iter().map(|d| d.name()).collect();
        log::info!("flushed removed device(s) {}", names.join(", "));
    }
    Ok(())
}

/// Every namespace and LUN of `config` (normalized): its subsystem or
/// target, NSID or LUN, and device.
fn exports(config: &Config) -> Vec<(&str, u64, &str)> {
    let namespaces = config
        .subsystem
        .iter()
        .flat_map(|s| s.namespace.iter().map(|n| (s.nqn.as_str(), n.nsid.map_or(0, u64::from), n.device.as_str())));
    let luns = config
        .iscsi_target
        .iter()
        .flat_map(|t| t.lun.iter().map(|l| (t.iqn.as_str(), l.lun.unwrap_or(0), l.device.as_str())));
    namespaces.chain(luns).collect()
}

/// Drops the counters of namespaces, LUNs and ports `config` (in force
/// now, normalized) no longer has, so that `ctl stats` and the metrics
/// endpoint stop reporting them ([`crate::stats::forget`]).
pub fn forget_removed(config: &Config) {
    use crate::stats::Scope;
    crate::stats::forget(
        |s| match s {
            Scope::Namespace { subsystem, nsid } => config
                .subsystem
                .iter()
                .any(|c| &c.nqn == subsystem && c.namespace.iter().any(|n| n.nsid == Some(*nsid))),
            Scope::Lun { target, lun } => {
                config.iscsi_target.iter().any(|t| &t.iqn == target && t.lun.iter().any(|l| l.lun == Some(*lun)))
            }
        },
        |a| config.port.iter().any(|p| p.address.parse::<SocketAddr>().ok() == Some(*a)),
    );
}

/// Refuses a configuration in which two namespaces of one subsystem would
/// have the same NGUID, UUID or EUI-64 (`Subsystem::add_namespace` refuses
/// the second), naming both.
pub fn check_identifiers(config: &Config, devices: &HashMap<String, Arc<Device>>) -> Result<()> {
    for s in &config.subsystem {
        let mut seen: Vec<(u32, nvmf::NamespaceIds)> = Vec::new();
        for (j, ns) in s.namespace.iter().enumerate() {
            let nsid = ns.nsid.unwrap_or(u32::try_from(j).unwrap_or(u32::MAX).saturating_add(1));
            let Some(dev) = devices.get(&ns.device) else { continue };
            let live = crate::serve::namespace(&s.nqn, nsid, ns, dev)?;
            if let Some(&(other, _)) =
                seen.iter().find(|(_, (g, u, e))| *g == live.nguid || *u == live.uuid || *e == live.eui64)
            {
                bail!(
                    "subsystem {}: namespaces {other} and {nsid} would have the same NGUID, UUID or EUI-64 \
                     (one rbd image exported twice, or a configured identifier used twice); hosts refuse the second",
                    s.nqn
                );
            }
            seen.push((nsid, (live.nguid, live.uuid, live.eui64)));
        }
    }
    Ok(())
}

/// Closes the connections of hosts the live access lists no longer let
/// in: NVMe controllers of a host its subsystem no longer allows, iSCSI
/// sessions of an initiator its target no longer allows (the same checks,
/// case rules included, as at Connect and login). Run after every change
/// and reload, even one that failed partway, so that taking a host off a
/// list (or turning `allow_any_*` off) revokes its access at once, as
/// SPDK's `nvmf_subsystem_remove_host` does, not at its next login. A
/// host logging in meanwhile checks again once its login is recorded
/// (`nvme.rs`, `iscsi_tcp.rs`), so one side or the other catches it.
/// Returns what it closed, which it logs.
pub fn enforce_access(live: &Live) -> Vec<crate::stats::Host> {
    use crate::stats::Login;
    use iscsi::target::Policy;
    let closed = crate::stats::disconnect(|h| match &h.login {
        Some(Login::Nvme { hostnqn, subsystem, .. }) => {
            live.target.subsystem(subsystem).is_some_and(|s| !s.allows(hostnqn))
        }
        Some(Login::Iscsi { initiator, target: Some(target), .. }) => !live.iscsi.initiator_allowed(target, initiator),
        _ => false,
    });
    for h in &closed {
        match &h.login {
            Some(Login::Nvme { hostnqn, subsystem, qid, .. }) => {
                log::info!("{}: host {hostnqn} may no longer use {subsystem}: queue {qid} closed", h.peer)
            }
            Some(Login::Iscsi { initiator, target, .. }) => log::info!(
                "{}: initiator {initiator} may no longer use {}: session closed",
                h.peer,
                target.as_deref().unwrap_or_default()
            ),
            None => {}
        }
    }
    closed
}

/// Tells the hosts of `dev`, whose capacity changed: each namespace on it
/// raises a namespace-attribute-changed event, each LUN on it a CAPACITY
/// DATA HAS CHANGED unit attention.
pub fn capacity_changed(live: &Live, dev: &Arc<Device>) {
    log::info!("device {}: resized to {} blocks; telling hosts", dev.name(), dev.geometry().blocks);
    for t in live.iscsi.targets() {
        for u in t.units.values().filter(|u| Arc::ptr_eq(&u.lu.device, dev)) {
            u.lu.capacity_changed();
        }
    }
    for s in live.target.subsystems() {
        for ns in s.namespaces().iter().filter(|ns| Arc::ptr_eq(&ns.device, dev)) {
            s.namespace_resized(ns.nsid);
        }
    }
}

fn apply_nvme(live: &Live, devices: &HashMap<String, Arc<Device>>, old: &Config, new: &Config) -> Result<()> {
    let target = &live.target;
    // The subsystems removed or made anew go first, all at once: one that a
    // host connected to since the checks makes the change fail here,
    // before anything else has changed (and every step after this one
    // cannot fail).
    let doomed: Vec<&str> = old
        .subsystem
        .iter()
        .filter(|o| new.subsystem.iter().find(|n| n.nqn == o.nqn).is_none_or(|n| recreated(o, n)))
        .map(|o| o.nqn.as_str())
        .collect();
    for gone in target.remove_subsystems(&doomed).map_err(anyhow::Error::msg)? {
        wait_for_namespaces(&gone);
        if !new.subsystem.iter().any(|n| n.nqn == gone.nqn) {
            log::info!("removed subsystem {}", gone.nqn);
        }
    }
    for s in &new.subsystem {
        let before = old.subsystem.iter().find(|o| o.nqn == s.nqn);
        let live_s = match target.subsystem(&s.nqn) {
            Some(l) => l,
            None => {
                log::info!("added subsystem {}", s.nqn);
                target.add_subsystem(crate::serve::subsystem(s)).map_err(anyhow::Error::msg)?
            }
        };
        target.set_access(&live_s, s.allow_any_host, s.hosts.clone());
        for ns in live_s.namespaces() {
            let wanted = s.namespace.iter().find(|n| n.nsid == Some(ns.nsid));
            let was = before.and_then(|b| b.namespace.iter().find(|n| n.nsid == Some(ns.nsid)));
            // A namespace whose identifiers change is a new namespace.
            let same_ids = wanted.zip(was).is_some_and(|(w, o)| (&w.uuid, &w.nguid) == (&o.uuid, &o.nguid));
            let same =
                same_ids && wanted.and_then(|w| devices.get(&w.device)).is_some_and(|d| Arc::ptr_eq(d, &ns.device));
            if !same {
                // Its commands running are waited for: nothing of it
                // reaches the device once the change returns.
                live_s.remove_namespace(ns.nsid);
                let left = wait_out(|| ns.holders());
                let device = blockdev::BlockDevice::name(&*ns.device);
                if left > 0 {
                    log::warn!(
                        "removed namespace {} from {}, but {left} queue(s) still hold it after {} s; \
                         their commands finish on device {device}",
                        ns.nsid,
                        s.nqn,
                        DRAIN_LIMIT.as_secs(),
                    );
                } else {
                    log::info!("removed namespace {} ({device}) from {}", ns.nsid, s.nqn);
                }
            }
        }
        for ns in &s.namespace {
            let nsid = ns.nsid.unwrap_or(0);
            if live_s.namespace(nsid).is_none() {
                let dev = devices.get(&ns.device).ok_or_else(|| anyhow!("no device {:?}", ns.device))?;
                live_s.add_namespace(crate::serve::namespace(&s.nqn, nsid, ns, dev)?).map_err(anyhow::Error::msg)?;
                log::info!("added namespace {nsid} ({}) to {}", ns.device, s.nqn);
            } else {
                let state = ns.ana().map_err(anyhow::Error::msg)?;
                if live_s.namespace(nsid).is_some_and(|l| l.ana_state() != state) {
                    live_s.set_ana_state(nsid, state);
                    log::info!(
                        "namespace {nsid} of {}: ANA state {}",
                        s.nqn,
                        ns.ana_state.as_deref().unwrap_or("optimized")
                    );
                }
            }
        }
    }
    Ok(())
}

/// Waits for the requests still running on the namespaces of `gone`, a
/// subsystem just removed: no controller is connected, but an I/O queue
/// whose admin queue closed may still be writing. Logged when some are
/// left after [`DRAIN_LIMIT`].
fn wait_for_namespaces(gone: &crate::nvme::Subsystem) {
    for ns in gone.namespaces() {
        let left = wait_out(|| ns.holders());
        if left > 0 {
            log::warn!(
                "removed subsystem {}, but {left} queue(s) still hold namespace {} after {} s; \
                 their commands finish on device {}",
                gone.nqn,
                ns.nsid,
                DRAIN_LIMIT.as_secs(),
                blockdev::BlockDevice::name(&*ns.device)
            );
        }
    }
}

/// Whether the change from `a` to `b` makes a new live subsystem: what a
/// host identifies it by (the serial) or what it was built with (the
/// controller ID range) differs.
fn recreated(a: &crate::config::SubsystemConfig, b: &crate::config::SubsystemConfig) -> bool {
    a.serial != b.serial || a.cntlid_range() != b.cntlid_range()
}

fn apply_iscsi(live: &Live, devices: &HashMap<String, Arc<Device>>, new: &Config) -> Result<()> {
    let current = live.iscsi.targets();
    let mut targets = Vec::new();
    for t in &new.iscsi_target {
        let prev = current.iter().find(|c| c.iqn == t.iqn);
        let next =
            IscsiTarget::next(t, devices, prev.map(|p| &**p)).with_context(|| format!("iSCSI target {}", t.iqn))?;
        targets.push(Arc::new(next));
    }
    let disc = new.iscsi.discovery_chap.as_ref().map(|c| (c.user.clone(), c.secret.as_bytes().to_vec()));
    // Logged-in sessions see the new LUNs from their next command on, with
    // REPORTED LUNS DATA HAS CHANGED; a removed unit takes no new command
    // and the change returns once the commands it was running are answered.
    let gone: Vec<(String, Arc<crate::iscsi_tcp::Unit>)> =
        targets.iter().flat_map(|t| t.publish().into_iter().map(|u| (t.iqn.clone(), u))).collect();
    live.iscsi.replace(targets, portals(new), disc);
    for (iqn, u) in gone {
        u.retire();
        let left = wait_out(|| u.busy());
        if left > 0 {
            log::warn!(
                "iSCSI target {iqn} LUN {}: removed, but {left} command(s) still running after {} s; \
                 they finish on device {}",
                u.lu.lun,
                DRAIN_LIMIT.as_secs(),
                u.lu.device.name()
            );
        } else {
            log::info!("iSCSI target {iqn}: LUN {} removed", u.lu.lun);
        }
    }
    Ok(())
}

/// How long removing an iSCSI LUN or an NVMe namespace waits for the
/// commands running on it.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// Waits (here, off the reactors) until `running` is 0, at most
/// [`DRAIN_LIMIT`]; what is still running then.
fn wait_out(running: impl Fn() -> u64) -> u64 {
    let deadline = std::time::Instant::now() + DRAIN_LIMIT;
    loop {
        let n = running();
        if n == 0 || std::time::Instant::now() >= deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The SendTargets portals of `config`'s iSCSI ports.
pub fn portals(config: &Config) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in config.port.iter().filter(|p| p.transport == "iscsi") {
        let portal = format!("{},1", p.address);
        if !out.contains(&portal) {
            out.push(portal);
        }
    }
    out
}

/// Makes every reactor listen on `ports` and nothing else; the error
/// names every address a reactor could not bind, or the reactors that did
/// not answer in time.
fn publish(live: &Live, ports: &[crate::config::PortConfig]) -> Result<(), String> {
    let generation = live.listeners.set(ports).map_err(|e| e.to_string())?;
    live.listeners.wait(generation, live.reactors, PORT_CHANGE_LIMIT)
}

/// Listens on the ports in force again after a change failed; `None` once
/// the daemon stops, whose listeners all close and take no change.
fn ports_back(live: &Live, old: &[crate::config::PortConfig]) -> Option<Result<(), String>> {
    (!crate::lifecycle::draining()).then(|| publish(live, old))
}

/// `e`, when going back to the ports in force failed too (`back`): logged,
/// since the daemon no longer listens where its configuration says.
fn back_failed(e: anyhow::Error, back: String) -> anyhow::Error {
    log::error!("control: the ports in force could not all be listened on again: {back}");
    e.context(format!("the ports in force could not all be listened on again ({back})"))
}

/// Enters the NVMe ports of `new` that `old` lacks in the discovery log.
pub fn add_ports(live: &Live, old: &[crate::config::PortConfig], new: &[crate::config::PortConfig]) -> Result<()> {
    for p in new.iter().filter(|p| !old.contains(p)) {
        if let Some(t) = live.listeners.nvme_transport(&p.transport) {
            let a: SocketAddr = p.address.parse().with_context(|| format!("port address {:?}", p.address))?;
            live.target.remove_port(a, &t);
            live.target.add_port(a, t, p.discovery_only);
        }
    }
    Ok(())
}
