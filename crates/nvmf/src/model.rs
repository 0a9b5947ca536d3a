//! The object model, mirroring the kernel's nvmet configfs nouns: ports,
//! subsystems (with allowed hosts) and namespaces.
//!
//! Everything here is control-path state shared by all reactors behind
//! locks; the I/O path holds `Arc`s to what it needs and takes no lock.

use crate::controller::Controller;
use block::BlockDevice;
use nvme_spec::log::AnaState;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// The lowest valid controller ID.
pub const CNTLID_MIN: u16 = 1;
/// The highest valid controller ID (0xfff0..=0xffff are reserved).
pub const CNTLID_MAX: u16 = 0xffef;

/// Target-wide limits.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Most bytes one command may transfer (MDTS is derived from it): at
    /// least 8 KiB, as MDTS (2^n pages of 4 KiB) cannot say 4 KiB, its 0
    /// meaning no limit.
    pub max_transfer: u32,
    /// Most I/O queues per controller.
    pub max_io_queues: u16,
    /// Entries per queue (CAP.MQES + 1).
    pub queue_entries: u16,
    /// Most live controllers per subsystem; a Connect past it is answered
    /// Controller Busy.
    pub max_controllers: u32,
    /// Most live controllers per subsystem created from one peer IP
    /// address, so that one host cannot take all of `max_controllers`.
    pub max_controllers_per_host: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_transfer: 1024 * 1024,
            max_io_queues: 128,
            queue_entries: 1024,
            max_controllers: 1024,
            max_controllers_per_host: 128,
        }
    }
}

/// [`Namespace::id`]s handed out so far.
static NEXT_NAMESPACE_ID: AtomicU64 = AtomicU64::new(1);

/// A namespace: a device exported under an NSID.
#[derive(Debug)]
pub struct Namespace<D> {
    /// Namespace ID (1-based); also its ANA group ID (one group per
    /// namespace, so each namespace's state is set on its own).
    pub nsid: u32,
    /// The backing device.
    pub device: Arc<D>,
    /// NGUID.
    pub nguid: [u8; 16],
    /// IEEE EUI-64.
    pub eui64: [u8; 8],
    /// UUID (RFC 4122 version 4 layout).
    pub uuid: [u8; 16],
    /// This gateway's ANA state for the namespace's group; every I/O
    /// command loads it.
    ana_state: AtomicU8,
    /// Queues holding the namespace in their cache, each until its cache
    /// and the last request it made of it let go ([`Held`]): what a
    /// removal waits out. Written once per queue and cache refill, never
    /// per I/O.
    holders: AtomicU64,
    /// Unique in the process: a namespace added under the NSID of a
    /// removed one is told apart from it (a command waiting for its data
    /// must not run on the namespace that took its NSID meanwhile).
    pub(crate) id: u64,
}

/// A queue's hold on a namespace, counted in [`Namespace::holders`] until
/// it drops. Taken under the subsystem's namespace lock
/// ([`Subsystem::namespaces_held`]), so a removal, which takes that lock,
/// counts every queue that will ever use what it removed.
#[derive(Debug)]
pub(crate) struct Held<D>(Arc<Namespace<D>>);

impl<D> Drop for Held<D> {
    fn drop(&mut self) {
        self.0.holders.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<D> std::ops::Deref for Held<D> {
    type Target = Namespace<D>;

    fn deref(&self) -> &Namespace<D> {
        &self.0
    }
}

impl<D: BlockDevice> Namespace<D> {
    /// A namespace whose identifiers stay the same across restarts. A
    /// device with a [`BlockDevice::shared_identity`] (an rbd image)
    /// derives them from it alone, so every gateway exporting that storage
    /// reports the same NGUID, EUI-64 and UUID and hosts see one namespace
    /// with several paths; others derive them from `subnqn`, `nsid` and the
    /// device name. The ANA state starts optimized.
    pub fn new(subnqn: &str, nsid: u32, device: Arc<D>) -> Self {
        let (nguid, uuid, eui64) = match device.shared_identity() {
            Some(shared) => derived_identifiers(shared),
            None => derived_identifiers(&format!("{subnqn}/{nsid}/{}", device.name())),
        };
        Namespace {
            nsid,
            device,
            nguid,
            eui64,
            uuid,
            ana_state: AtomicU8::new(AnaState::OPTIMIZED.0),
            holders: AtomicU64::new(0),
            id: NEXT_NAMESPACE_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The queues holding the namespace: in their cache, or through a
    /// block request made of it that is still running. Once it was
    /// removed ([`Subsystem::remove_namespace`]) and this reads 0, none
    /// of its requests runs and none will.
    pub fn holders(&self) -> u64 {
        self.holders.load(Ordering::Acquire)
    }

    /// Replaces the derived NGUID (a configured one).
    #[must_use]
    pub fn with_nguid(mut self, nguid: [u8; 16]) -> Self {
        self.nguid = nguid;
        self
    }

    /// Replaces the derived UUID (a configured one).
    #[must_use]
    pub fn with_uuid(mut self, uuid: [u8; 16]) -> Self {
        self.uuid = uuid;
        self
    }

    /// Starts in `state` instead of optimized.
    #[must_use]
    pub fn with_ana_state(self, state: AnaState) -> Self {
        self.ana_state.store(state.0, Ordering::Relaxed);
        self
    }

    /// This gateway's ANA state for the namespace.
    pub fn ana_state(&self) -> AnaState {
        AnaState(self.ana_state.load(Ordering::Acquire))
    }
}

/// A namespace's NGUID, UUID and EUI-64.
pub type NamespaceIds = ([u8; 16], [u8; 16], [u8; 8]);

/// The NGUID, UUID and EUI-64 a namespace derives from `seed`: a
/// device's shared identity, else "SUBNQN/NSID/DEVICE" (what
/// [`Namespace::new`] uses; configuration checks compute the same).
pub fn derived_identifiers(seed: &str) -> NamespaceIds {
    let nguid = hash128(seed.as_bytes());
    let mut uuid = hash128(format!("uuid:{seed}").as_bytes());
    if let Some(b) = uuid.get_mut(6) {
        *b = (*b & 0x0f) | 0x40;
    }
    if let Some(b) = uuid.get_mut(8) {
        *b = (*b & 0x3f) | 0x80;
    }
    let mut eui64 = [0u8; 8];
    for (d, s) in eui64.iter_mut().zip(hash128(format!("eui64:{seed}").as_bytes())) {
        *d = s;
    }
    (nguid, uuid, eui64)
}

/// FNV-1a based 128-bit digest: identifiers only, not security.
fn hash128(bytes: &[u8]) -> [u8; 16] {
    let mut a: u64 = 0xcbf2_9ce4_8422_2325;
    let mut b: u64 = 0x8422_2325_cbf2_9ce4;
    for &x in bytes {
        a = (a ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3);
        b = (b ^ u64::from(x.rotate_left(3))).wrapping_mul(0x0100_0000_01b3);
    }
    let mut out = [0u8; 16];
    for (d, s) in out.iter_mut().zip(a.to_be_bytes().into_iter().chain(b.to_be_bytes())) {
        *d = s;
    }
    out
}

/// An NVM subsystem, or the discovery subsystem.
#[derive(Debug)]
pub struct Subsystem<D> {
    /// Subsystem NQN.
    pub nqn: String,
    /// Serial number reported in Identify Controller.
    pub serial: String,
    /// Model number reported in Identify Controller.
    pub model: String,
    /// True for the discovery subsystem.
    pub discovery: bool,
    access: RwLock<Access>,
    namespaces: RwLock<BTreeMap<u32, Arc<Namespace<D>>>>,
    ns_gen: AtomicU64,
    /// ANA change count (the ANA log page's CHGCNT): bumped by every
    /// state change, and by a namespace added or removed while controllers
    /// are connected; never 0 once one happened.
    ana_changes: AtomicU64,
    pub(crate) controllers: Mutex<HashMap<u16, Arc<Controller<D>>>>,
    /// Controller IDs this subsystem hands out (SPDK's `min_cntlid` and
    /// `max_cntlid`): gateways exporting one subsystem NQN get disjoint
    /// ranges, since a host refuses a second controller with an ID it
    /// already has in that subsystem.
    cntlids: RangeInclusive<u16>,
    next_cntlid: AtomicU16,
}

/// Who may connect to a subsystem.
#[derive(Debug, Default, PartialEq, Eq)]
struct Access {
    allow_any_host: bool,
    hosts: Vec<String>,
}

impl Access {
    fn allows(&self, hostnqn: &str) -> bool {
        self.allow_any_host || self.hosts.iter().any(|h| h == hostnqn)
    }
}

impl<D: BlockDevice> Subsystem<D> {
    /// A subsystem with no namespaces.
    pub fn new(nqn: &str, serial: &str, allow_any_host: bool, hosts: Vec<String>) -> Self {
        Subsystem {
            nqn: nqn.to_string(),
            serial: serial.to_string(),
            model: "ironwire".to_string(),
            discovery: false,
            access: RwLock::new(Access { allow_any_host, hosts }),
            namespaces: RwLock::new(BTreeMap::new()),
            ns_gen: AtomicU64::new(0),
            ana_changes: AtomicU64::new(0),
            controllers: Mutex::new(HashMap::new()),
            cntlids: CNTLID_MIN..=CNTLID_MAX,
            next_cntlid: AtomicU16::new(CNTLID_MIN),
        }
    }

    /// Hands out controller IDs from `range` only, clamped to the valid
    /// 1..=0xffef.
    #[must_use]
    pub fn with_cntlid_range(mut self, range: RangeInclusive<u16>) -> Self {
        let min = (*range.start()).max(CNTLID_MIN);
        let max = (*range.end()).min(CNTLID_MAX).max(min);
        self.cntlids = min..=max;
        self.next_cntlid = AtomicU16::new(min);
        self
    }

    /// The controller IDs this subsystem hands out.
    pub fn cntlid_range(&self) -> RangeInclusive<u16> {
        self.cntlids.clone()
    }

    /// The next controller ID in the range for which `free` holds, going
    /// round the range at most once, so a wrapped counter never lands on a
    /// live controller. `None` when every ID is taken.
    pub(crate) fn alloc_cntlid(&self, free: impl Fn(u16) -> bool) -> Option<u16> {
        let (min, max) = (*self.cntlids.start(), *self.cntlids.end());
        for _ in min..=max {
            let id = self.next_cntlid.fetch_add(1, Ordering::Relaxed);
            if !(min..=max).contains(&id) {
                // Wrapped past the end (or past u16::MAX): restart at min
                // and take it now, so each turn of the loop tries one ID.
                self.next_cntlid.store(min.saturating_add(1), Ordering::Relaxed);
                if free(min) {
                    return Some(min);
                }
                continue;
            }
            if free(id) {
                return Some(id);
            }
        }
        None
    }

    fn new_discovery() -> Self {
        let mut s = Subsystem::new(nvme_spec::DISCOVERY_NQN, "discovery", true, Vec::new());
        s.discovery = true;
        s.model = "ironwire discovery".to_string();
        s
    }

    /// Whether `hostnqn` may connect.
    pub fn allows(&self, hostnqn: &str) -> bool {
        self.access.read().unwrap_or_else(|e| e.into_inner()).allows(hostnqn)
    }

    /// Replaces the access list ([`Target::set_access`]); the one it
    /// replaced, when it changed.
    fn replace_access(&self, allow_any_host: bool, hosts: Vec<String>) -> Option<Access> {
        let mut a = self.access.write().unwrap_or_else(|e| e.into_inner());
        let new = Access { allow_any_host, hosts };
        if *a == new {
            return None;
        }
        Some(std::mem::replace(&mut *a, new))
    }

    /// The namespace with `nsid`.
    pub fn namespace(&self, nsid: u32) -> Option<Arc<Namespace<D>>> {
        self.namespaces.read().unwrap_or_else(|e| e.into_inner()).get(&nsid).cloned()
    }

    /// All namespaces in NSID order.
    pub fn namespaces(&self) -> Vec<Arc<Namespace<D>>> {
        self.namespaces.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    /// The namespaces, each held for a queue's cache ([`Held`]).
    pub(crate) fn namespaces_held(&self) -> Vec<Held<D>> {
        let map = self.namespaces.read().unwrap_or_else(|e| e.into_inner());
        map.values()
            .map(|ns| {
                ns.holders.fetch_add(1, Ordering::AcqRel);
                Held(ns.clone())
            })
            .collect()
    }

    /// Adds a namespace and notifies connected controllers with a
    /// namespace-attribute-changed event. Fails if the NSID is taken or 0.
    pub fn add_namespace(&self, ns: Namespace<D>) -> Result<(), String> {
        let nsid = ns.nsid;
        if nsid == 0 || nsid == u32::MAX {
            return Err(format!("nsid {nsid} is reserved"));
        }
        {
            let mut map = self.namespaces.write().unwrap_or_else(|e| e.into_inner());
            if map.contains_key(&nsid) {
                return Err(format!("nsid {nsid} already exists in {}", self.nqn));
            }
            // Each identifier names one namespace (NVMe base 2.0 4.5.2):
            // hosts refuse a second one with the same (Linux: "duplicate
            // IDs"). Derived ones collide when one rbd image is exported
            // twice.
            if let Some(other) = map.values().find(|o| o.nguid == ns.nguid || o.uuid == ns.uuid || o.eui64 == ns.eui64)
            {
                return Err(format!(
                    "nsid {nsid} of {} would have the NGUID, UUID or EUI-64 of nsid {} (the same storage exported twice, or a configured identifier used twice)",
                    self.nqn, other.nsid
                ));
            }
            map.insert(nsid, Arc::new(ns));
        }
        self.notify_ns_changed(nsid);
        self.notify_ana_log_changed();
        Ok(())
    }

    /// The namespace `nsid`'s device changed size: connected controllers
    /// get the namespace-attribute-changed event (NVMe base 2.0 5.27.1.7)
    /// and re-read Identify Namespace, which reports the device's size now.
    pub fn namespace_resized(&self, nsid: u32) {
        if self.namespace(nsid).is_some() {
            self.notify_ns_changed(nsid);
        }
    }

    /// Removes a namespace and notifies connected controllers. Each queue
    /// lets go of it at its next command, and every I/O queue's driver is
    /// rung so that one with nothing to send does so too. The caller waits
    /// for [`Namespace::holders`] to reach 0 before it tells anyone the
    /// namespace is gone: its requests running (and any a queue made of it
    /// before it saw the change) are over then.
    pub fn remove_namespace(&self, nsid: u32) -> Option<Arc<Namespace<D>>> {
        let removed = self.namespaces.write().unwrap_or_else(|e| e.into_inner()).remove(&nsid);
        if removed.is_some() {
            self.notify_ns_changed(nsid);
            self.notify_ana_log_changed();
            let controllers: Vec<Arc<Controller<D>>> =
                self.controllers.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
            for c in controllers {
                c.ring_io_queues();
            }
        }
        removed
    }

    /// Changes whenever a namespace is added or removed; queues use it to
    /// refresh their lock-free namespace cache.
    pub fn ns_generation(&self) -> u64 {
        self.ns_gen.load(Ordering::Acquire)
    }

    fn notify_ns_changed(&self, nsid: u32) {
        self.ns_gen.fetch_add(1, Ordering::AcqRel);
        for c in self.controllers.lock().unwrap_or_else(|e| e.into_inner()).values() {
            c.namespace_changed(nsid);
        }
    }

    /// A namespace came or went, and with it its ANA group (ID = NSID):
    /// the ANA log page of every connected controller changed. A host that
    /// keeps a copy of the log (Linux) looks a namespace's group up there
    /// when the namespace appears, so a namespace added again under an NSID
    /// it knew, in another state, would keep the old state until told.
    fn notify_ana_log_changed(&self) {
        let controllers = self.controllers.lock().unwrap_or_else(|e| e.into_inner());
        if controllers.is_empty() {
            return;
        }
        self.ana_changes.fetch_add(1, Ordering::AcqRel);
        for c in controllers.values() {
            c.ana_changed();
        }
    }

    /// Sets this gateway's ANA state of namespace `nsid` and, when it
    /// changed, tells connected controllers with an ANA change event.
    /// False when there is no such namespace.
    pub fn set_ana_state(&self, nsid: u32, state: AnaState) -> bool {
        let Some(ns) = self.namespace(nsid) else {
            return false;
        };
        if ns.ana_state.swap(state.0, Ordering::AcqRel) != state.0 {
            self.ana_changes.fetch_add(1, Ordering::AcqRel);
            for c in self.controllers.lock().unwrap_or_else(|e| e.into_inner()).values() {
                c.ana_changed();
            }
        }
        true
    }

    /// The ANA change count.
    pub fn ana_change_count(&self) -> u64 {
        self.ana_changes.load(Ordering::Acquire)
    }

    /// Controllers currently alive in this subsystem.
    pub fn controller_count(&self) -> usize {
        self.controllers.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// What hosts are told about a transport binding: the discovery log
/// entry's transport fields and the Identify Controller fields that depend
/// on how bytes move. Each binding (`nvmf-tcp`, the iWARP binding) makes
/// its own; the core never assumes one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transport {
    /// Short name for log lines and the control plane (`tcp`, `rdma`).
    pub name: &'static str,
    /// Discovery log TRTYPE.
    pub trtype: u8,
    /// Discovery log TREQ.
    pub treq: u8,
    /// The leading bytes of the discovery log TSAS (the rest are zero).
    pub tsas: [u8; 16],
    /// Identify Controller SGLS.
    pub sgls: u32,
    /// Bytes of data an I/O command capsule may carry (Identify IOCCSZ is
    /// `(64 + in_capsule) / 16`).
    pub in_capsule: u32,
    /// Identify Controller ICDOFF, in 16-byte units.
    pub icdoff: u16,
}

/// A transport port the target listens on, as the discovery log shows it.
#[derive(Clone, Debug)]
pub struct Port {
    /// Port ID.
    pub id: u16,
    /// The transport hosts use on it.
    pub transport: Transport,
    /// Listen address.
    pub addr: SocketAddr,
    /// A dedicated discovery port: only the discovery subsystem is served
    /// here; the discovery log points hosts at the other ports.
    pub discovery_only: bool,
}

/// The whole target: subsystems, the discovery subsystem, ports, limits.
#[derive(Debug)]
pub struct Target<D> {
    /// Limits.
    pub settings: Settings,
    subsystems: RwLock<Vec<Arc<Subsystem<D>>>>,
    discovery: Arc<Subsystem<D>>,
    ports: RwLock<Vec<Port>>,
    genctr: AtomicU64,
}

impl<D: BlockDevice> Target<D> {
    /// An empty target.
    pub fn new(settings: Settings) -> Self {
        Target {
            settings,
            subsystems: RwLock::new(Vec::new()),
            discovery: Arc::new(Subsystem::new_discovery()),
            ports: RwLock::new(Vec::new()),
            genctr: AtomicU64::new(1),
        }
    }

    /// Adds a subsystem; fails on a duplicate NQN.
    pub fn add_subsystem(&self, s: Subsystem<D>) -> Result<Arc<Subsystem<D>>, String> {
        let mut list = self.subsystems.write().unwrap_or_else(|e| e.into_inner());
        if s.nqn == nvme_spec::DISCOVERY_NQN || list.iter().any(|x| x.nqn == s.nqn) {
            return Err(format!("subsystem {} already exists", s.nqn));
        }
        let s = Arc::new(s);
        list.push(s.clone());
        drop(list);
        self.discovery_log_changed(|host| s.allows(host));
        Ok(s)
    }

    /// The subsystem (or discovery subsystem) named `nqn`.
    pub fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem<D>>> {
        if nqn == nvme_spec::DISCOVERY_NQN {
            return Some(self.discovery.clone());
        }
        self.subsystems.read().unwrap_or_else(|e| e.into_inner()).iter().find(|s| s.nqn == nqn).cloned()
    }

    /// All NVM subsystems.
    pub fn subsystems(&self) -> Vec<Arc<Subsystem<D>>> {
        self.subsystems.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Removes the subsystems `nqns` all at once, or none of them: the error
    /// names the first one a controller is connected to (or that does not
    /// exist).
    pub fn remove_subsystems(&self, nqns: &[&str]) -> Result<Vec<Arc<Subsystem<D>>>, String> {
        let mut list = self.subsystems.write().unwrap_or_else(|e| e.into_inner());
        for nqn in nqns {
            let s = list.iter().find(|s| s.nqn == *nqn).ok_or_else(|| format!("no subsystem {nqn}"))?;
            let live = s.controller_count();
            if live > 0 {
                return Err(format!("subsystem {nqn} has {live} connected controller(s); disconnect them first"));
            }
        }
        let (gone, kept): (Vec<_>, Vec<_>) = list.drain(..).partition(|s| nqns.contains(&s.nqn.as_str()));
        *list = kept;
        drop(list);
        for s in &gone {
            self.discovery_log_changed(|host| s.allows(host));
        }
        Ok(gone)
    }

    /// Registers a listening port for the discovery log. Port IDs are
    /// never reused while the target runs.
    pub fn add_port(&self, addr: SocketAddr, transport: Transport, discovery_only: bool) -> u16 {
        let mut ports = self.ports.write().unwrap_or_else(|e| e.into_inner());
        let id = ports.iter().map(|p| p.id).max().unwrap_or(0).saturating_add(1);
        ports.push(Port { id, transport, addr, discovery_only });
        drop(ports);
        // Every host's log has the port's discovery entry.
        self.discovery_log_changed(|_| true);
        id
    }

    /// Takes the port at `addr` over `transport` out of the discovery log;
    /// false when there is none.
    pub fn remove_port(&self, addr: SocketAddr, transport: &Transport) -> bool {
        let mut ports = self.ports.write().unwrap_or_else(|e| e.into_inner());
        let before = ports.len();
        ports.retain(|p| !(p.addr == addr && p.transport.trtype == transport.trtype));
        let removed = ports.len() != before;
        drop(ports);
        if removed {
            self.discovery_log_changed(|_| true);
        }
        removed
    }

    /// The port a connection to `local` over `transport` came in on.
    pub fn port_for(&self, local: SocketAddr, transport: &Transport) -> Option<Port> {
        let ports = self.ports.read().unwrap_or_else(|e| e.into_inner());
        ports
            .iter()
            .find(|p| {
                p.transport.trtype == transport.trtype
                    && p.addr.port() == local.port()
                    && (p.addr.ip() == local.ip() || p.addr.ip().is_unspecified())
            })
            .cloned()
    }

    /// Listening ports.
    pub fn ports(&self) -> Vec<Port> {
        self.ports.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the access list of `subsystem`. A change moves the
    /// discovery log's generation counter: which subsystems a host's log
    /// lists depends on it (NVMe-oF 1.1 5.3: GENCTR changes whenever the
    /// log does).
    pub fn set_access(&self, subsystem: &Subsystem<D>, allow_any_host: bool, hosts: Vec<String>) {
        // A host's log changed when whether it may reach the subsystem did:
        // judged by the list replaced, so that a discovery controller that
        // connects meanwhile is judged too.
        if let Some(before) = subsystem.replace_access(allow_any_host, hosts) {
            self.discovery_log_changed(|host| before.allows(host) != subsystem.allows(host));
        }
    }

    fn discovery_controllers(&self) -> Vec<Arc<Controller<D>>> {
        self.discovery.controllers.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    /// The discovery log changed: a new generation counter, and the
    /// discovery controllers that asked for it get the discovery log page
    /// change event, those of hosts whose log changed (`changed_for`)
    /// only, as Linux's nvmet tells only the hosts a subsystem allows.
    fn discovery_log_changed(&self, changed_for: impl Fn(&str) -> bool) {
        self.genctr.fetch_add(1, Ordering::Relaxed);
        for c in self.discovery_controllers() {
            if changed_for(&c.hostnqn) {
                c.discovery_changed();
            }
        }
    }

    /// Discovery log generation counter.
    pub fn genctr(&self) -> u64 {
        self.genctr.load(Ordering::Relaxed)
    }
}
