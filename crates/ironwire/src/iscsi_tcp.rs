//! The iSCSI connection driver: a thin async shell around the sans-IO
//! `iscsi::target::TargetConnection` (PDUs, login, sequencing) and
//! `scsi::LogicalUnit` (commands), shaped like the NVMe/TCP driver.
//!
//! One session per connection (MaxConnections=1, ErrorRecoveryLevel 0). A
//! reader task feeds bytes in and dispatches events; SCSI commands that
//! touch storage run as local tasks; a writer task sends what is queued in
//! one `write_all` per wake-up; a ticker drives NOP-In pings. A login with
//! the initiator name and ISID of a live session reinstates it
//! (`iscsi_session`): the old connection ends, its tasks finish or are
//! cancelled, and only then is the new login answered.

use crate::conn::{Outbox, Shell};
use crate::iscsi_session::{Registration, Registry};
use crate::nvme::Buf;
use crate::stats::{self, Failure, Op};
use blockdev::IoBuf;
use blockdev::{BlockDevice, Device};
use iscsi::chap::Secret;
use iscsi::target::{
    tmf_response, Event, Policy, Residual, Seed, TargetConfig, TargetConnection, TargetInfo, TaskRef, TmfFunction,
};
use iscsi::text::SessionType;
use reactor::net::TcpStream;
use reactor::{now_ms, Notify, NotifyAll};
use scsi::{status, BlockOp, Nexus, Outcome, Sense};

type LogicalUnit = scsi::LogicalUnit<Device>;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

impl scsi::DataOut for Buf {
    fn truncate(&mut self, len: usize) {
        self.0.truncate(len);
    }
}

/// A logical unit as the driver holds it.
pub struct Unit {
    /// The SCSI logical unit.
    pub lu: Arc<LogicalUnit>,
    /// Commands of this unit between dispatch and answer, on every
    /// reactor; closed while a [`Fence`] waits for them, and for good once
    /// ctl removed the unit.
    busy: drain::Drain,
    /// Commands stamped ([`iscsi::target::Command::epoch`]) before this
    /// epoch of the target's [`LunTable`] were in the scope of a task
    /// management function of another session (or of a PREEMPT AND ABORT
    /// past [`PREEMPTED_MAX`]): they end in TASK ABORTED when they come to
    /// run.
    fenced_before: AtomicU64,
    /// The I_T nexuses PREEMPT AND ABORT preempted, each with the epoch
    /// of the latest that did: their commands stamped earlier end in TASK
    /// ABORTED when they come to run; other nexuses' do not. At most
    /// [`PREEMPTED_MAX`]; taken only by commands stamped before
    /// `preempted_before`.
    preempted: std::sync::Mutex<Vec<(scsi::NexusId, u64)>>,
    /// The latest epoch in `preempted`: one load per command.
    preempted_before: AtomicU64,
    /// Who holds `busy` closed; taken only to close or open it.
    gate: std::sync::Mutex<Gate>,
    /// The epoch of the target's [`LunTable`] at which a run-time change
    /// put the unit under its LUN (0 for the units a target starts with):
    /// a command stamped earlier was sent to the unit before it, and is
    /// answered with REPORTED LUNS DATA HAS CHANGED instead of running
    /// here (a write whose data was still coming when its LUN's device
    /// was replaced must not land on the new device).
    since: AtomicU64,
}

/// Why a unit's drain is closed.
#[derive(Default)]
struct Gate {
    /// [`Fence`]s alive.
    fences: u32,
    /// ctl removed the unit.
    retired: bool,
}

/// Nexuses a unit keeps PREEMPT AND ABORT fences for, since the daemon
/// started (an entry cannot be dropped while a command it dooms may still
/// come to run, which nothing tracks); a preemption that would keep more
/// fences the whole unit, as a LUN reset does (other sessions' commands
/// that arrived before it end in TASK ABORTED too, which initiators
/// retry).
const PREEMPTED_MAX: usize = 256;

/// A session's handle on a unit ([`Session::units`]). The `Rc` is the
/// point: cloned per command, it is counted on this thread, where the
/// unit's `Arc` is counted by every reactor.
#[allow(clippy::redundant_allocation)]
type UnitHandle = Rc<Arc<Unit>>;

/// A command running on a unit; the unit counts it until this drops (on
/// the reactor that dispatched it).
struct Busy(UnitHandle, drain::Ticket);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.leave(&self.1);
    }
}

/// What a command arriving at a unit may do ([`Unit::enter`]).
enum Entry {
    /// Run; the unit counts it.
    Run(Busy),
    /// It was in the scope of another session's task management function
    /// or PREEMPT AND ABORT: TASK ABORTED.
    Aborted,
    /// A fence waits for the unit's commands in flight: BUSY, the
    /// initiator retries.
    Wait,
    /// ctl removed the unit.
    Gone,
}

/// A unit's commands held back while those already running finish: what
/// LUN RESET, CLEAR TASK SET, the target resets and PREEMPT AND ABORT
/// need before they may be answered. Commands that arrived before it
/// (stamped with an earlier epoch) are aborted whenever they come to run,
/// later ones get BUSY until the fence drops.
struct Fence(Arc<Unit>);

impl Fence {
    /// Waits (polling, on the reactor) until none of the unit's commands
    /// runs, or until `deadline`; whether they all ended.
    async fn drained(&self, deadline: std::time::Instant) -> bool {
        loop {
            if self.0.busy.in_flight() == 0 {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            reactor::sleep(Duration::from_millis(1)).await;
        }
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        let mut g = self.0.gate();
        g.fences -= 1;
        if g.fences == 0 && !g.retired {
            self.0.busy.open();
        }
    }
}

impl Unit {
    fn new(lu: Arc<LogicalUnit>) -> Unit {
        Unit {
            lu,
            busy: drain::Drain::new(),
            fenced_before: AtomicU64::new(0),
            preempted: Default::default(),
            preempted_before: AtomicU64::new(0),
            gate: Default::default(),
            since: AtomicU64::new(0),
        }
    }

    fn gate(&self) -> std::sync::MutexGuard<'_, Gate> {
        self.gate.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a command of `nexus` stamped `epoch` to the unit `handle`
    /// names.
    fn enter(handle: &UnitHandle, epoch: u64, nexus: &scsi::Nexus) -> Entry {
        let entry = match handle.busy.enter() {
            Ok(ticket) => Entry::Run(Busy(handle.clone(), ticket)),
            Err(_) if handle.gate().retired => return Entry::Gone,
            Err(_) => Entry::Wait,
        };
        // After `enter`: a fence that closed the drain before this command
        // was counted made its epoch visible first (the drain's barrier);
        // one that closes later waits for this command.
        if epoch < handle.fenced_before.load(Ordering::Acquire) || handle.preempted_since(nexus, epoch) {
            Entry::Aborted
        } else {
            entry
        }
    }

    /// Whether a PREEMPT AND ABORT preempted `nexus` after its command
    /// stamped `stamp` arrived.
    fn preempted_since(&self, nexus: &scsi::Nexus, stamp: u64) -> bool {
        stamp < self.preempted_before.load(Ordering::Acquire)
            && self
                .preempted
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(|(id, epoch)| stamp < *epoch && nexus.is(id))
    }

    /// Fences the unit for a PREEMPT AND ABORT at `epoch` that preempted
    /// `nexuses`: their commands stamped earlier are aborted (other
    /// nexuses' are not), new commands wait, until the fence drops.
    /// `None`, having fenced nothing, when the unit already keeps
    /// [`PREEMPTED_MAX`] nexuses: the caller fences the whole unit.
    fn fence_nexuses(self: &Arc<Unit>, epoch: u64, nexuses: &[scsi::NexusId]) -> Option<Fence> {
        {
            let mut list = self.preempted.lock().unwrap_or_else(|e| e.into_inner());
            let new = nexuses.iter().filter(|n| !list.iter().any(|(id, _)| id == *n)).count();
            if list.len().saturating_add(new) > PREEMPTED_MAX {
                return None;
            }
            for n in nexuses {
                match list.iter_mut().find(|(id, _)| id == n) {
                    Some(e) => e.1 = e.1.max(epoch),
                    None => list.push((n.clone(), epoch)),
                }
            }
        }
        // Before the drain closes, as `fence` does: a command counted
        // after the close sees the epoch.
        self.preempted_before.fetch_max(epoch, Ordering::AcqRel);
        let mut g = self.gate();
        g.fences += 1;
        self.busy.close();
        Some(Fence(self.clone()))
    }

    /// Fences the unit: commands stamped before `epoch` are aborted, new
    /// ones wait, until the fence drops. Also returns the epoch fenced
    /// before: commands stamped earlier were doomed already.
    fn fence(self: &Arc<Unit>, epoch: u64) -> (Fence, u64) {
        let before = self.fenced_before.fetch_max(epoch, Ordering::AcqRel);
        let mut g = self.gate();
        g.fences += 1;
        self.busy.close();
        (Fence(self.clone()), before)
    }

    /// Commands of the unit being executed now.
    pub fn busy(&self) -> u64 {
        self.busy.in_flight()
    }

    /// Stops new commands on the unit for good (ctl removed it);
    /// [`Unit::busy`] then counts, exactly, those still running.
    pub fn retire(&self) {
        let mut g = self.gate();
        g.retired = true;
        self.busy.close();
    }
}

/// A CHAP user name and secret.
pub type Credentials = (String, Vec<u8>);

/// An initiator allowed in, with credentials that override the target's.
struct Acl {
    initiator: String,
    chap: Option<Credentials>,
    mutual: Option<Credentials>,
}

/// The LUN inventory of a target as its logged-in sessions see it, shared
/// by every version of the target: a run-time LUN change is published here
/// and each session picks it up before its next command.
struct LunTable {
    /// Bumped (under the lock) at each change; read without it on every
    /// command.
    generation: AtomicU64,
    /// The clock of task management across the target's sessions: stamped
    /// on each command as it arrives, advanced by each [`Fence`] (the
    /// fenced unit aborts commands stamped earlier).
    epoch: AtomicU64,
    units: RwLock<Arc<BTreeMap<u64, Arc<Unit>>>>,
}

impl LunTable {
    /// The current generation and units.
    fn snapshot(&self) -> (u64, Arc<BTreeMap<u64, Arc<Unit>>>) {
        let units = self.units.read().unwrap_or_else(|e| e.into_inner());
        (self.generation.load(Ordering::Acquire), units.clone())
    }
}

/// Whether `a` and `b` hold the same units under the same LUNs.
fn same_units(a: &BTreeMap<u64, Arc<Unit>>, b: &BTreeMap<u64, Arc<Unit>>) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|((la, ua), (lb, ub))| la == lb && Arc::ptr_eq(ua, ub))
}

/// An iSCSI target: a name, who may log in, and its logical units.
pub struct IscsiTarget {
    /// Target name.
    pub iqn: String,
    /// TargetAlias.
    pub alias: Option<String>,
    allow_any: bool,
    initiators: Vec<String>,
    chap: Option<Credentials>,
    mutual: Option<Credentials>,
    acl: Vec<Acl>,
    /// Logical units by LUN.
    pub units: BTreeMap<u64, Arc<Unit>>,
    /// Live sessions (normal logins that completed), on every reactor;
    /// shared with the target's next version when ctl changes it.
    sessions: Arc<std::sync::Mutex<SessionCount>>,
    /// What the sessions see; shared with the next version like `sessions`.
    table: Arc<LunTable>,
    /// The sessions by initiator name and ISID, for reinstatement; shared
    /// with the target's next version too.
    registry: Arc<Registry>,
}

impl IscsiTarget {
    /// A target from its configuration and the opened devices.
    pub fn new(
        cfg: &crate::config::IscsiTargetConfig,
        devices: &std::collections::HashMap<String, Arc<blockdev::Device>>,
    ) -> anyhow::Result<IscsiTarget> {
        IscsiTarget::next(cfg, devices, None)
    }

    /// The next version of `prev` (a run-time change): the session count
    /// and the units whose LUN and device stay are carried over, so their
    /// reservations and unit attentions survive.
    pub fn next(
        cfg: &crate::config::IscsiTargetConfig,
        devices: &std::collections::HashMap<String, Arc<blockdev::Device>>,
        prev: Option<&IscsiTarget>,
    ) -> anyhow::Result<IscsiTarget> {
        let mut units = BTreeMap::new();
        for (j, l) in cfg.lun.iter().enumerate() {
            let lun = l.lun.unwrap_or(j as u64);
            let dev = devices.get(&l.device).ok_or_else(|| anyhow::anyhow!("no device {:?}", l.device))?;
            let kept = prev.and_then(|p| p.units.get(&lun)).filter(|u| Arc::ptr_eq(&u.lu.device, dev));
            let unit = match kept {
                Some(u) => u.clone(),
                None => Arc::new(Unit::new(Arc::new(LogicalUnit::new(&cfg.iqn, lun, dev.clone())))),
            };
            units.insert(lun, unit);
        }
        let cred =
            |c: &Option<crate::config::ChapConfig>| c.as_ref().map(|c| (c.user.clone(), c.secret.as_bytes().to_vec()));
        Ok(IscsiTarget {
            iqn: cfg.iqn.clone(),
            alias: cfg.alias.clone(),
            allow_any: cfg.allow_any_initiator,
            initiators: cfg.initiators.clone(),
            chap: cred(&cfg.chap),
            mutual: cred(&cfg.mutual_chap),
            acl: cfg
                .acl
                .iter()
                .map(|a| Acl { initiator: a.initiator.clone(), chap: cred(&a.chap), mutual: cred(&a.mutual_chap) })
                .collect(),
            sessions: prev.map_or_else(Arc::default, |p| p.sessions.clone()),
            table: prev.map_or_else(
                || {
                    Arc::new(LunTable {
                        generation: AtomicU64::new(0),
                        epoch: AtomicU64::new(0),
                        units: RwLock::new(Arc::new(units.clone())),
                    })
                },
                |p| p.table.clone(),
            ),
            units,
            registry: prev.map_or_else(Arc::default, |p| p.registry.clone()),
        })
    }

    /// Makes this version's LUNs the ones logged-in sessions see. Each
    /// session then gets REPORTED LUNS DATA HAS CHANGED once (SPC-4
    /// 6.33, SAM-5 5.14); returns the units it no longer has, for the
    /// caller to [`Unit::retire`].
    pub fn publish(&self) -> Vec<Arc<Unit>> {
        let mut current = self.table.units.write().unwrap_or_else(|e| e.into_inner());
        if same_units(&current, &self.units) {
            return Vec::new();
        }
        let gone = current
            .iter()
            .filter(|(n, u)| !self.units.get(n).is_some_and(|k| Arc::ptr_eq(k, u)))
            .map(|(_, u)| u.clone());
        let gone = gone.collect();
        // Commands arriving from now on are stamped with this epoch or a
        // later one: those stamped earlier were sent to the units before.
        let epoch = self.table.epoch.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        for (n, u) in &self.units {
            if !current.get(n).is_some_and(|c| Arc::ptr_eq(c, u)) {
                u.since.store(epoch, Ordering::Release);
            }
        }
        *current = Arc::new(self.units.clone());
        self.table.generation.fetch_add(1, Ordering::AcqRel);
        gone
    }

    /// Live sessions of this target.
    pub fn session_count(&self) -> u32 {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner()).total
    }

    /// Closes the target to logins, for a change that removes it: under
    /// the lock a login takes its session place under, so that no session
    /// comes while the change runs. Refused, with their count, when it
    /// has sessions (logins that took their place included).
    pub fn close(&self) -> Result<(), u32> {
        let mut n = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if n.total > 0 {
            return Err(n.total);
        }
        n.closed = true;
        Ok(())
    }

    /// Takes logins again after [`IscsiTarget::close`] (the change failed).
    pub fn reopen(&self) {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner()).closed = false;
    }

    fn allows(&self, initiator: &str) -> bool {
        self.allow_any
            || self.initiators.iter().any(|i| i.eq_ignore_ascii_case(initiator))
            || self.acl_for(initiator).is_some()
    }

    fn acl_for(&self, initiator: &str) -> Option<&Acl> {
        self.acl.iter().find(|a| a.initiator.eq_ignore_ascii_case(initiator))
    }

    /// The CHAP credentials `initiator` must present: its ACL entry's, else
    /// the target's.
    fn chap_for(&self, initiator: &str) -> Option<&Credentials> {
        self.acl_for(initiator).and_then(|a| a.chap.as_ref()).or(self.chap.as_ref())
    }

    /// The target's own credentials for mutual CHAP with `initiator`.
    fn mutual_for(&self, initiator: &str) -> Option<&Credentials> {
        match self.acl_for(initiator) {
            Some(a) if a.chap.is_some() => a.mutual.as_ref(),
            _ => self.mutual.as_ref(),
        }
    }
}

/// Everything iSCSI connections share: the targets, the portals they are
/// reached on and the discovery credentials. It is the login policy.
pub struct IscsiModel {
    /// Targets; the control plane replaces the list on a change, sessions
    /// keep the version they logged in to.
    targets: RwLock<Vec<Arc<IscsiTarget>>>,
    /// SendTargets portals, `ip:port,tpgt`.
    portals: RwLock<Vec<String>>,
    /// CHAP credentials for discovery sessions.
    discovery_chap: RwLock<Option<Credentials>>,
    next_tsih: AtomicU16,
    /// `[limits] sessions_per_target`.
    sessions_per_target: u32,
    /// `[limits] sessions_per_host`.
    sessions_per_host: u32,
    /// `[timeouts] handshake_ms`: from accept to the end of the login.
    handshake: Duration,
}

/// A target's live sessions, in all and by initiator address.
#[derive(Default)]
struct SessionCount {
    total: u32,
    by_host: std::collections::HashMap<std::net::IpAddr, u32>,
    /// A change removing the target runs ([`IscsiTarget::close`]): no
    /// session takes a place.
    closed: bool,
}

impl SessionCount {
    fn release(&mut self, peer: std::net::IpAddr) {
        self.total = self.total.saturating_sub(1);
        if let std::collections::hash_map::Entry::Occupied(mut e) = self.by_host.entry(peer) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

/// The target portal group every portal belongs to.
const TPGT: u16 = 1;

impl IscsiModel {
    /// A model for `targets` reached on `portals`.
    pub fn new(targets: Vec<Arc<IscsiTarget>>, portals: Vec<String>, discovery_chap: Option<Credentials>) -> Self {
        IscsiModel {
            targets: RwLock::new(targets),
            portals: RwLock::new(portals),
            discovery_chap: RwLock::new(discovery_chap),
            next_tsih: AtomicU16::new(1),
            sessions_per_target: u32::MAX,
            sessions_per_host: u32::MAX,
            handshake: Duration::from_secs(15),
        }
    }

    /// Sets how many sessions each target holds, in all and from one
    /// peer address, and how long a login may take.
    pub fn with_limits(mut self, (per_target, per_host): (u32, u32), handshake: Duration) -> Self {
        self.sessions_per_target = per_target;
        self.sessions_per_host = per_host;
        self.handshake = handshake;
        self
    }

    /// Gives back a session place taken by `reserve_session`.
    fn release_session(&self, target: &str, peer: std::net::IpAddr) {
        if let Some(t) = self.find(target) {
            t.sessions.lock().unwrap_or_else(|e| e.into_inner()).release(peer);
        }
    }

    fn find(&self, name: &str) -> Option<Arc<IscsiTarget>> {
        self.targets().into_iter().find(|t| t.iqn.eq_ignore_ascii_case(name))
    }

    /// The targets, in configuration order.
    pub fn targets(&self) -> Vec<Arc<IscsiTarget>> {
        self.targets.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the targets, portals and discovery credentials (a run-time
    /// change); logged-in sessions keep the targets they hold.
    pub fn replace(&self, targets: Vec<Arc<IscsiTarget>>, portals: Vec<String>, discovery_chap: Option<Credentials>) {
        *self.targets.write().unwrap_or_else(|e| e.into_inner()) = targets;
        *self.portals.write().unwrap_or_else(|e| e.into_inner()) = portals;
        *self.discovery_chap.write().unwrap_or_else(|e| e.into_inner()) = discovery_chap;
    }

    fn info(&self, t: &IscsiTarget) -> TargetInfo {
        let portals = self.portals.read().unwrap_or_else(|e| e.into_inner()).clone();
        TargetInfo { name: t.iqn.clone(), alias: t.alias.clone(), tpgt: TPGT, portals }
    }

    fn tsih(&self) -> u16 {
        loop {
            let t = self.next_tsih.fetch_add(1, Ordering::Relaxed);
            if t != 0 {
                return t;
            }
        }
    }
}

impl Policy for IscsiModel {
    fn target(&self, name: &str) -> Option<TargetInfo> {
        self.find(name).map(|t| self.info(&t))
    }

    fn initiator_allowed(&self, target: &str, initiator: &str) -> bool {
        self.find(target).is_some_and(|t| t.allows(initiator))
    }

    fn discovery_targets(&self, initiator: &str) -> Vec<TargetInfo> {
        self.targets().iter().filter(|t| t.allows(initiator)).map(|t| self.info(t)).collect()
    }

    fn auth_required(&self, target: Option<&str>, initiator: &str) -> bool {
        match target {
            Some(name) => self.find(name).is_some_and(|t| t.chap_for(initiator).is_some()),
            None => self.discovery_chap.read().unwrap_or_else(|e| e.into_inner()).is_some(),
        }
    }

    fn chap_secret(&self, target: Option<&str>, initiator: &str, user: &str) -> Option<Secret> {
        let cred = match target {
            Some(name) => self.find(name).and_then(|t| t.chap_for(initiator).cloned()),
            None => self.discovery_chap.read().unwrap_or_else(|e| e.into_inner()).clone(),
        };
        cred.filter(|(u, _)| u == user).map(|(_, s)| Secret(s))
    }

    fn target_credentials(&self, target: Option<&str>, initiator: &str) -> Option<(String, Secret)> {
        let t = self.find(target?)?;
        t.mutual_for(initiator).cloned().map(|(u, s)| (u, Secret(s)))
    }

    fn reserve_session(&self, target: &str, peer: Option<std::net::IpAddr>) -> Result<(), String> {
        let Some(t) = self.find(target) else { return Err(format!("target {target} not found")) };
        let Some(peer) = peer else { return Err("no peer address".into()) };
        let mut n = t.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if n.closed {
            return Err(format!("target {} is being removed", t.iqn));
        }
        let (all, from) = (self.sessions_per_target, self.sessions_per_host);
        if n.total >= all {
            return Err(format!("target {} already has {all} sessions ([limits] sessions_per_target)", t.iqn));
        }
        if n.by_host.get(&peer).is_some_and(|&k| k >= from) {
            return Err(format!(
                "target {} already has {from} sessions from {peer} ([limits] sessions_per_host)",
                t.iqn
            ));
        }
        n.total += 1;
        *n.by_host.entry(peer).or_default() += 1;
        Ok(())
    }

    fn admits_sessions(&self) -> bool {
        true
    }
}

/// A session's own handle on each of `units` ([`Session::units`]).
fn handles_of(units: &BTreeMap<u64, Arc<Unit>>) -> BTreeMap<u64, UnitHandle> {
    units.iter().map(|(n, u)| (*n, Rc::new(u.clone()))).collect()
}

struct Session {
    /// The target's name.
    iqn: String,
    /// The target's LUNs, shared by all its versions. Not the version
    /// logged in to: that holds the units of its day, and with them the
    /// devices of LUNs removed since.
    table: Arc<LunTable>,
    nexus: Nexus,
    /// The target's LUNs as this session last saw them (their generation
    /// in the target's [`LunTable`] below), each behind this session's own
    /// handle: a command clones that, a count on this thread, where a clone
    /// of the unit's `Arc` would be an atomic on a count every reactor
    /// touches.
    units: BTreeMap<u64, UnitHandle>,
    generation: u64,
    luns: Vec<u64>,
    /// REPORTED LUNS DATA HAS CHANGED is pending for this I_T nexus.
    luns_changed: bool,
}

impl Session {
    fn new(target: &IscsiTarget, nexus: Nexus) -> Session {
        let (generation, units) = target.table.snapshot();
        for u in units.values() {
            u.lu.nexus_created(&nexus);
        }
        let luns = units.keys().copied().collect();
        Session {
            iqn: target.iqn.clone(),
            table: target.table.clone(),
            nexus,
            units: handles_of(&units),
            generation,
            luns,
            luns_changed: false,
        }
    }

    /// Catches up with a LUN change made since: new units learn the nexus,
    /// removed ones forget it (and this session lets go of them), and the
    /// unit attention is queued. Before each command, and on the
    /// connection's tick so that an idle session does not keep a removed
    /// LUN's device open. One atomic load when nothing changed.
    fn refresh(&mut self) {
        if self.table.generation.load(Ordering::Acquire) == self.generation {
            return;
        }
        let (generation, units) = self.table.snapshot();
        for (n, u) in units.iter() {
            if !self.units.get(n).is_some_and(|o| Arc::ptr_eq(&**o, u)) {
                u.lu.nexus_created(&self.nexus);
            }
        }
        for (n, u) in self.units.iter() {
            if !units.get(n).is_some_and(|o| Arc::ptr_eq(o, &**u)) {
                u.lu.nexus_lost(&self.nexus);
            }
        }
        self.luns = units.keys().copied().collect();
        self.units = handles_of(&units);
        self.generation = generation;
        self.luns_changed = true;
    }

    /// The unit attention `opcode` gets for the LUN change, once per nexus.
    /// INQUIRY, REPORT LUNS and REQUEST SENSE never report it (SAM-5 5.14);
    /// a REPORT LUNS that succeeds clears it (SPC-4 6.33).
    fn luns_changed_attention(&mut self, opcode: Option<u8>) -> Option<Sense> {
        if !self.luns_changed || !reports_attentions(opcode) {
            return None;
        }
        self.luns_changed = false;
        Some(Sense::UA_REPORTED_LUNS_CHANGED)
    }
}

/// Whether a command of `opcode` may be answered with a unit attention:
/// INQUIRY, REPORT LUNS and REQUEST SENSE never are (SAM-5 5.14).
fn reports_attentions(opcode: Option<u8>) -> bool {
    !matches!(opcode, Some(scsi::op::INQUIRY | scsi::op::REPORT_LUNS | scsi::op::REQUEST_SENSE))
}

struct Conn {
    iscsi: RefCell<TargetConnection<Buf>>,
    session: RefCell<Option<Session>>,
    shell: Shell,
    /// Commands running as I/O tasks, by serial, with whether a task
    /// management function aborted them (their answers are then dropped).
    /// Bounded by the CmdSN window; a scan is cheaper than hashing at
    /// these sizes.
    running: RefCell<Vec<(u64, bool)>>,
    /// Notified each time an I/O task finishes, for the task management
    /// requests waiting on them and the connection's end: every waiter
    /// wakes (two aborts can wait at once, or an abort and the end).
    io_done: NotifyAll,
    /// Tasks waiting where an abort can end the wait (a COMPARE AND WRITE
    /// waiting for its range), by serial, each woken when aborted.
    watched: RefCell<Vec<(u64, Rc<Notify>)>>,
    /// This connection's fences, per unit it fenced ([`OwnFence`]); one
    /// entry per unit ever fenced here.
    own_fences: RefCell<Vec<OwnFence>>,
    stats: stats::Connection,
    /// The socket, for a duplicate in the session registry.
    fd: RawFd,
    /// The session's place in its target's registry. Last, so that it is
    /// given up (and a reinstating login answered) only once everything
    /// above, the counters included, is gone.
    registration: RefCell<Option<Registration>>,
}

impl Outbox for Conn {
    /// Data goes out through the PDU bytes, but for a null LU's zeros,
    /// spliced from a shared page ([`reactor::gather::ZEROS`]).
    type Spliced = Vec<u8>;

    fn shell(&self) -> &Shell {
        &self.shell
    }

    fn take_transmit(&self, out: &mut reactor::gather::Gather<Vec<u8>>) {
        let (head, splices) = (&mut out.head, &mut out.splices);
        self.iscsi.borrow_mut().take_transmit_parts(head, |at, len| {
            splices.push(reactor::gather::Splice { at, buf: reactor::gather::ZEROS, start: 0, len })
        });
    }

    fn queued(&self) -> usize {
        self.iscsi.borrow().transmit_len()
    }
}

impl Conn {
    /// Counts an I/O of LUN `lun` begun at `t0` (µs, the loop clock) that
    /// failed with `sense` if any.
    fn record(&self, lun: u64, (op, bytes): (Op, u64), t0: u64, sense: Option<&Sense>) {
        let failure = sense.map(Failure::sense);
        let latency = reactor::now_us().saturating_sub(t0);
        let scope = || {
            let target = self.session.borrow().as_ref()?.iqn.clone();
            Some(stats::Scope::Lun { target, lun })
        };
        self.stats.with(lun, scope, |c| c.record(op, bytes, latency, failure));
    }

    /// A command failed before reaching a device: counted on the port.
    /// A write's `residual` (its data against the CDB's) is reported with
    /// the sense data.
    fn failed(&self, task: TaskRef, sense: &Sense, residual: Option<Residual>) {
        self.stats.port().error(Failure::sense(sense));
        self.check_with(task, sense, residual);
    }

    /// Status `st` without sense data; all but GOOD count as errors on the
    /// port.
    fn status(&self, task: TaskRef, st: u8) {
        if st != status::GOOD {
            self.stats.port().error(Failure::ScsiStatus(st));
        }
        self.iscsi.borrow_mut().send_response(task, st, None, None);
        self.shell.tx_ready.notify();
    }

    fn check(&self, task: TaskRef, sense: &Sense) {
        self.check_with(task, sense, None);
    }

    fn check_with(&self, task: TaskRef, sense: &Sense, residual: Option<Residual>) {
        log::debug!("{}: ITT {:#x}: CHECK CONDITION, {sense}", self.shell.peer, task.itt);
        self.iscsi.borrow_mut().send_response(task, status::CHECK_CONDITION, Some(&sense.to_fixed_bytes()), residual);
        self.shell.tx_ready.notify();
    }

    /// GOOD status: read data (residual counted by the connection), or a
    /// response with the write residual `residual`. Data of a command sent
    /// without the R bit goes through the connection too, which sends none
    /// of it and reports it all as overflow (RFC 7143 11.4.5.1).
    fn good(&self, task: TaskRef, read: bool, data: &[u8], residual: Option<Residual>) {
        let mut c = self.iscsi.borrow_mut();
        if read || (!data.is_empty() && residual.is_none()) {
            c.send_data_in(task, data, Some(status::GOOD));
        } else {
            c.send_response(task, status::GOOD, None, residual);
        }
        drop(c);
        self.shell.tx_ready.notify();
    }

    /// Whether a task management function aborted the running `task`.
    fn is_aborted(&self, task: TaskRef) -> bool {
        self.running.borrow().iter().any(|&(s, aborted)| s == task.serial && aborted)
    }

    /// Marks the running tasks among `tasks` aborted (waking those that
    /// wait in [`on_abort`](Self::on_abort)); true when any is still
    /// running.
    fn abort(&self, tasks: &[TaskRef]) -> bool {
        self.abort_where(|serial| tasks.iter().any(|t| t.serial == serial))
    }

    /// Marks every running task aborted, waking those that wait in
    /// [`on_abort`](Self::on_abort).
    fn abort_all(&self) {
        self.abort_where(|_| true);
    }

    /// Marks the running tasks whose serial `hit` picks aborted and wakes
    /// those of them that wait in [`on_abort`](Self::on_abort); true when
    /// any is still running.
    fn abort_where(&self, hit: impl Fn(u64) -> bool) -> bool {
        let mut any = false;
        for (s, aborted) in self.running.borrow_mut().iter_mut() {
            if hit(*s) {
                *aborted = true;
                any = true;
            }
        }
        for (s, wake) in self.watched.borrow().iter() {
            if hit(*s) {
                wake.notify();
            }
        }
        any
    }

    /// Ends once a task management function aborted `task`; race it first
    /// against a wait that an abort should end ([`reactor::race`]).
    fn on_abort(&self, task: TaskRef) -> impl std::future::Future<Output = ()> + '_ {
        let wake = Rc::new(Notify::default());
        self.watched.borrow_mut().push((task.serial, wake.clone()));
        let watch = Watch { conn: self, wake };
        async move {
            while !watch.conn.is_aborted(task) {
                watch.wake.wait().await;
            }
        }
    }

    /// Whether any of `tasks` is still running.
    fn any_running(&self, tasks: &[TaskRef]) -> bool {
        self.running.borrow().iter().any(|(s, _)| tasks.iter().any(|t| t.serial == *s))
    }

    /// Forgets the finished `task`; true when it had been aborted.
    fn finished(&self, task: TaskRef) -> bool {
        let mut running = self.running.borrow_mut();
        let aborted = match running.iter().position(|&(s, _)| s == task.serial) {
            Some(i) => running.swap_remove(i).1,
            None => false,
        };
        drop(running);
        self.io_done.notify();
        aborted
    }
}

/// What a connection knows of its own fences on one unit: its own
/// commands in those functions' scope end through [`Conn::abort`], not
/// through the unit's epoch ([`until_fenced_by_another`]), which keeps only the
/// latest fence's.
struct OwnFence {
    /// The unit, by address.
    unit: usize,
    /// The epoch of this connection's latest fence of it.
    epoch: u64,
    /// The latest epoch of another session's fence that one of this
    /// connection's fences replaced in the unit's epoch.
    others: u64,
}

impl OwnFence {
    /// This connection fenced the unit again, at `epoch`; the unit's epoch
    /// was `before` (this connection's previous fence, or another's).
    fn again(&mut self, epoch: u64, before: u64) {
        if before != self.epoch {
            self.others = self.others.max(before);
        }
        self.epoch = epoch;
    }
}

/// Whether another session fenced a unit after a command stamped `stamp`
/// arrived, from the unit's epoch `before` (the latest fence's) and this
/// connection's own fences of it.
fn fenced_by_other(own: Option<&OwnFence>, before: u64, stamp: u64) -> bool {
    match own {
        Some(own) => (before > stamp && before != own.epoch) || own.others > stamp,
        None => before > stamp,
    }
}

impl Conn {
    /// Notes this connection's fence `epoch` of `unit`, whose epoch was
    /// `before`.
    fn note_own_fence(&self, unit: &Arc<Unit>, epoch: u64, before: u64) {
        let at = Arc::as_ptr(unit) as usize;
        let mut own = self.own_fences.borrow_mut();
        match own.iter_mut().find(|f| f.unit == at) {
            Some(f) => f.again(epoch, before),
            None => own.push(OwnFence { unit: at, epoch, others: before }),
        }
    }

    /// Whether another session fenced `unit` after a command stamped
    /// `stamp` arrived ([`fenced_by_other`]).
    fn fenced_by_another(&self, unit: &Arc<Unit>, stamp: u64) -> bool {
        let at = Arc::as_ptr(unit) as usize;
        let before = unit.fenced_before.load(Ordering::Acquire);
        fenced_by_other(self.own_fences.borrow().iter().find(|f| f.unit == at), before, stamp)
            || self.session.borrow().as_ref().is_some_and(|s| unit.preempted_since(&s.nexus, stamp))
    }
}

/// A task's entry among [`Conn::watched`]; removed when dropped.
struct Watch<'a> {
    conn: &'a Conn,
    wake: Rc<Notify>,
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        self.conn.watched.borrow_mut().retain(|(_, w)| !Rc::ptr_eq(w, &self.wake));
    }
}

/// The connection's random first StatSN, CHAP identifier and challenge;
/// `None` when the system gives no randomness (a predictable challenge
/// would let a recorded CHAP response be replayed).
fn seed(model: &IscsiModel) -> Option<Seed> {
    let mut bytes = [0u8; 40];
    getrandom::getrandom(&mut bytes).ok()?;
    let mut challenge = [0u8; 32];
    challenge.copy_from_slice(&bytes[8..40]);
    Some(Seed {
        tsih: model.tsih(),
        stat_sn: u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
        chap_id: bytes[4],
        chap_challenge: challenge,
    })
}

/// Serves one accepted iSCSI connection until it closes; `port` is the
/// listening address it came in on, for the counters.
pub async fn serve(stream: TcpStream, model: Arc<IscsiModel>, cfg: TargetConfig, port: std::net::SocketAddr) {
    let _ = stream.set_nodelay(true);
    let Ok(peer) = stream.peer_addr() else { return };
    let Some(seed) = seed(&model) else {
        log::error!("{peer}: the system gives no random bytes for a CHAP challenge; closing the connection");
        return;
    };
    let mut iscsi = TargetConnection::new(cfg, model.clone(), seed).with_peer(peer.ip());
    if let Ok(local) = stream.local_addr() {
        iscsi = iscsi.with_local(local.ip());
    }
    let conn = Rc::new(Conn {
        iscsi: RefCell::new(iscsi),
        session: RefCell::new(None),
        shell: Shell::new(peer),
        running: RefCell::new(Vec::new()),
        io_done: NotifyAll::default(),
        watched: RefCell::new(Vec::new()),
        own_fences: RefCell::new(Vec::new()),
        stats: stats::Connection::open("iscsi", port, peer, stream.as_raw_fd()),
        fd: stream.as_raw_fd(),
        registration: RefCell::new(None),
    });
    let (rd, wr) = stream.into_split();
    let writer = reactor::spawn(crate::conn::write_loop(wr, conn.clone()));
    let ticker = reactor::spawn(tick_loop(conn.clone(), model.clone(), rd.clone()));
    let mut rx = rd.receiver();
    while !conn.shell.is_closing() {
        let r = match rx.recv().await {
            Ok(bytes) if !bytes.is_empty() => {
                let epoch = conn.session.borrow().as_ref().map_or(0, |s| s.table.epoch.load(Ordering::Acquire));
                let mut c = conn.iscsi.borrow_mut();
                c.set_epoch(epoch);
                c.handle_input(&bytes)
            }
            _ => break,
        };
        // Commands wait, parsed, while the initiator does not read our
        // replies.
        while !dispatch_events(&conn, &model) {
            crate::conn::wait_for_room(&*conn, &mut rx).await;
        }
        if let Err(e) = r {
            log::warn!("{peer}: fatal iSCSI protocol error, closing: {e}");
            conn.shell.close();
        }
        if conn.iscsi.borrow().state() == iscsi::target::State::Closed {
            conn.shell.close();
        }
    }
    if conn.registration.borrow().as_ref().is_some_and(Registration::reinstated) {
        // RFC 7143 6.3.5: the old session's tasks end without an answer;
        // what already reached the device finishes before the session is
        // gone, so nothing of it lands after the new login is answered.
        // One still waiting (a COMPARE AND WRITE for its range, a read for
        // its budget) ends at once, as if aborted, and never starts.
        conn.abort_all();
    }
    // The commands already taken finish and their answers go out first.
    while !conn.running.borrow().is_empty() {
        conn.io_done.wait().await;
    }
    conn.shell.close();
    if let Some(s) = conn.session.borrow_mut().take() {
        for u in s.units.values() {
            u.lu.nexus_lost(&s.nexus);
        }
        log::info!("{peer}: session {} to {} ended", s.nexus.initiator, s.iqn);
    }
    let held = conn.iscsi.borrow().session_target().map(str::to_owned);
    if let Some(t) = held {
        model.release_session(&t, peer.ip());
    }
    let _ = writer.await;
    drop(ticker);
}

/// Dispatches what the connection parsed. `false` when it stopped early
/// because the replies passed the send high-water mark.
fn dispatch_events(conn: &Rc<Conn>, model: &Arc<IscsiModel>) -> bool {
    loop {
        if crate::conn::over_high_water(&**conn) && !conn.shell.is_closing() {
            conn.shell.tx_ready.notify();
            return false;
        }
        let ev = conn.iscsi.borrow_mut().poll_event();
        let Some(ev) = ev else { break };
        match ev {
            Event::LoggedIn { initiator, target, session_type, isid, tsih, params } => {
                let isid_hex: String = isid.iter().map(|b| format!("{b:02x}")).collect();
                let (exp, max) = conn.iscsi.borrow().cmd_window();
                let chap = match target.as_deref() {
                    t if !model.auth_required(t, &initiator) => "none",
                    t if model.target_credentials(t, &initiator).is_some() => "mutual CHAP",
                    _ => "CHAP",
                };
                conn.stats.logged_in(stats::Login::Iscsi {
                    initiator: initiator.clone(),
                    target: target.clone(),
                    tsih,
                    isid: isid_hex.clone(),
                    depth: max.wrapping_sub(exp).wrapping_add(1),
                    digests: (params.header_digest, params.data_digest),
                    chap,
                });
                // Access may have been revoked since the login's first PDU
                // was checked; `runtime::enforce_access` sees the session
                // only from here on, so look again (one side catches it).
                if let Some(t) = target.as_deref().filter(|t| !model.initiator_allowed(t, &initiator)) {
                    log::info!("{}: {initiator} may no longer log in to {t}; closing", conn.shell.peer);
                    conn.shell.close();
                    continue;
                }
                match (session_type, target.and_then(|t| model.find(&t))) {
                    (SessionType::Normal, Some(t)) => {
                        let nexus = Nexus {
                            initiator: format!("{initiator},i,0x{isid_hex}"),
                            target_port: format!("{},t,0x{TPGT:04x}", t.iqn),
                            relative_port: 1,
                            tpgt: TPGT,
                        };
                        log::info!("{}: {initiator} logged in to {} (tsih {tsih})", conn.shell.peer, t.iqn);
                        *conn.session.borrow_mut() = Some(Session::new(&t, nexus));
                    }
                    _ => log::info!("{}: {initiator} opened a discovery session", conn.shell.peer),
                }
            }
            Event::SessionPending { initiator, target, isid } => {
                session_pending(conn, model, &initiator, &target, isid)
            }
            Event::LoginFailed { status, reason } => {
                let name = initiator::iscsi::LoginStatus(status).name();
                log::warn!("{}: login refused ({name}, status {status:#06x}): {reason}", conn.shell.peer);
            }
            Event::Command(cmd) => command(conn, cmd),
            Event::TaskMgmt { itt, function, lun, tasks, .. } => {
                let (response, fences) = task_mgmt(conn, function, lun);
                let cold = function == TmfFunction::TARGET_COLD_RESET;
                if response == tmf_response::COMPLETE && (conn.abort(&tasks) || !fences.is_empty() || cold) {
                    // RFC 7143 4.2.3: "function complete" only once every
                    // affected task is over. I/O already submitted cannot
                    // be recalled, so wait for it; its answer is dropped.
                    // Other sessions' commands on a fenced unit are waited
                    // for too (SAM-5 7.7: the task set is shared).
                    let deadline = std::time::Instant::now() + FENCE_LIMIT;
                    reactor::spawn(answer_tmf_when_done(conn.clone(), itt, tasks, fences, deadline, cold));
                } else {
                    conn.iscsi.borrow_mut().send_tmf_response(itt, response);
                }
            }
            Event::LoggedOut { reason } => {
                log::info!("{}: logout (reason {reason})", conn.shell.peer);
            }
            Event::Dead => {
                log::warn!("{}: initiator stopped answering NOP-In; closing", conn.shell.peer);
                conn.shell.close();
            }
        }
    }
    conn.shell.tx_ready.notify();
    true
}

/// Registers a session whose login waits for admission; when it
/// reinstates older sessions, admits it once they are gone.
fn session_pending(conn: &Rc<Conn>, model: &Arc<IscsiModel>, initiator: &str, target: &str, isid: [u8; 6]) {
    let Some(t) = model.find(target) else {
        // Removed meanwhile: admission refuses the login.
        conn.iscsi.borrow_mut().admit_session();
        return;
    };
    let socket = crate::stats::dup_socket(conn.fd);
    let registration = t.registry.register(initiator, isid, socket, conn.shell.peer);
    let older = registration.older();
    *conn.registration.borrow_mut() = Some(registration);
    if older.is_empty() {
        conn.iscsi.borrow_mut().admit_session();
    } else {
        reactor::spawn(admit_after(conn.clone(), model.clone(), older));
    }
}

/// Admits the pending session once every session it reinstates is gone.
async fn admit_after(conn: Rc<Conn>, model: Arc<IscsiModel>, older: Vec<Arc<crate::iscsi_session::Gone>>) {
    for g in &older {
        g.wait().await;
    }
    if conn.shell.is_closing() {
        return;
    }
    log::debug!("{}: the reinstated session is gone; answering the login", conn.shell.peer);
    conn.iscsi.borrow_mut().admit_session();
    dispatch_events(&conn, &model);
}

/// How long a function that fences units may wait, from its arrival, for
/// the commands running on them: under open-iscsi's 30 s task management
/// timeout.
const FENCE_LIMIT: Duration = Duration::from_secs(25);

/// Answers task management request `itt` "function complete" once none
/// of `tasks` is running any more and no command runs on the `fences`'
/// units. When fences do not drain by `deadline` the connection closes
/// instead: the function took effect (unit attentions, reservations) but
/// a command in its scope still runs, which no response can say, and the
/// tasks it ended have no answer either (the initiator recovers the
/// session, as it would after a refused reset). After a TARGET COLD RESET
/// (`cold`) every connection of the target's sessions closes, this one
/// once the response is sent (RFC 7143 11.5.1).
async fn answer_tmf_when_done(
    conn: Rc<Conn>,
    itt: u32,
    tasks: Vec<TaskRef>,
    fences: Vec<Fence>,
    deadline: std::time::Instant,
    cold: bool,
) {
    let own = async {
        while conn.any_running(&tasks) {
            conn.io_done.wait().await;
        }
    };
    let ended = if fences.is_empty() {
        own.await;
        true
    } else {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        reactor::timeout(left, own).await.is_ok() && drained(&conn, &fences, deadline).await
    };
    drop(fences);
    if !ended {
        log::warn!(
            "{}: task management request {itt:#x}: commands in its scope still run after {} s; closing the connection",
            conn.shell.peer,
            FENCE_LIMIT.as_secs()
        );
        conn.shell.close();
        return;
    }
    conn.iscsi.borrow_mut().send_tmf_response(itt, tmf_response::COMPLETE);
    conn.shell.tx_ready.notify();
    if cold {
        drop_target_connections(&conn);
    }
}

/// TARGET COLD RESET is over: closes the connections of every session of
/// this connection's target, this one after what it queued is sent.
fn drop_target_connections(conn: &Conn) {
    let iqn = conn.session.borrow().as_ref().map(|s| s.iqn.clone());
    let Some(iqn) = iqn else { return };
    let me = conn.shell.peer;
    let others = crate::stats::disconnect(|h| {
        h.peer != me
            && matches!(&h.login, Some(stats::Login::Iscsi { target: Some(t), .. }) if t.eq_ignore_ascii_case(&iqn))
    });
    log::info!("{me}: target cold reset of {iqn}: closing its {} session(s)", others.len() + 1);
    conn.shell.close();
}

/// Waits for the commands running on the `fences`' units to end, until
/// `deadline`; false (logged) when some still run.
async fn drained(conn: &Conn, fences: &[Fence], deadline: std::time::Instant) -> bool {
    for f in fences {
        if !f.drained(deadline).await {
            log::warn!("{}: {} commands still run on LUN {}", conn.shell.peer, f.0.busy(), f.0.lu.lun);
            return false;
        }
    }
    true
}

/// Fences `units` for a function of this session: the other sessions'
/// commands that arrived before it are aborted. This session's commands
/// left on those units arrived after it (the function ended those in its
/// scope) and are restamped, unless an earlier fence doomed them already.
fn fence(conn: &Conn, s: &Session, units: &[&UnitHandle]) -> Vec<Fence> {
    let epoch = s.table.epoch.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
    let (fences, before): (Vec<Fence>, Vec<(u64, u64, &UnitHandle)>) = units
        .iter()
        .map(|u| {
            let (f, before) = Unit::fence(u, epoch);
            conn.note_own_fence(u, epoch, before);
            (f, (u.lu.lun, before, *u))
        })
        .unzip();
    // Nor one that another session's PREEMPT AND ABORT doomed (a fence of
    // this session's nexus): restamped, it would escape it.
    conn.iscsi.borrow_mut().restamp(epoch, |lun, stamp| match scsi::decode_lun(lun.to_be_bytes()) {
        Some(scsi::Lun::Unit(n)) => {
            before.iter().any(|&(l, b, u)| l == n && stamp >= b && !u.preempted_since(&s.nexus, stamp))
        }
        _ => false,
    });
    fences
}

/// Runs task management `function` on `lun`: the response, and the fences
/// the answer waits for.
fn task_mgmt(conn: &Conn, function: TmfFunction, lun: u64) -> (u8, Vec<Fence>) {
    let mut session = conn.session.borrow_mut();
    let Some(s) = session.as_mut() else { return (tmf_response::NOT_SUPPORTED, Vec::new()) };
    s.refresh();
    let unit = match scsi::decode_lun(lun.to_be_bytes()) {
        Some(scsi::Lun::Unit(n)) => s.units.get(&n).cloned(),
        _ => None,
    };
    // The affected tasks of this session still running are waited for by
    // the caller; those of other sessions through the fences (the task set
    // is shared, TST 000b). A function naming a LUN without a unit names
    // no task set: "LUN does not exist" (RFC 7143 11.6.1), as LIO answers.
    match function {
        TmfFunction::ABORT_TASK => (tmf_response::COMPLETE, Vec::new()),
        TmfFunction::ABORT_TASK_SET => match unit {
            Some(_) => (tmf_response::COMPLETE, Vec::new()),
            None => (tmf_response::LUN_DOES_NOT_EXIST, Vec::new()),
        },
        TmfFunction::CLEAR_TASK_SET => match unit {
            Some(u) => {
                u.lu.clear_task_set(&s.nexus, &[]);
                (tmf_response::COMPLETE, fence(conn, s, &[&u]))
            }
            None => (tmf_response::LUN_DOES_NOT_EXIST, Vec::new()),
        },
        TmfFunction::LOGICAL_UNIT_RESET => match unit {
            Some(u) => {
                log::info!("{}: LUN reset of {} LUN {}", conn.shell.peer, s.iqn, u.lu.lun);
                u.lu.lun_reset(&s.nexus);
                (tmf_response::COMPLETE, fence(conn, s, &[&u]))
            }
            None => (tmf_response::LUN_DOES_NOT_EXIST, Vec::new()),
        },
        TmfFunction::TARGET_WARM_RESET | TmfFunction::TARGET_COLD_RESET => {
            log::info!("{}: target reset of {}", conn.shell.peer, s.iqn);
            for u in s.units.values() {
                u.lu.target_reset();
            }
            let units: Vec<&UnitHandle> = s.units.values().collect();
            (tmf_response::COMPLETE, fence(conn, s, &units))
        }
        _ => (tmf_response::NOT_SUPPORTED, Vec::new()),
    }
}

fn command(conn: &Rc<Conn>, cmd: iscsi::target::Command<Buf>) {
    let mut session = conn.session.borrow_mut();
    let Some(s) = session.as_mut() else {
        drop(session);
        conn.failed(cmd.task, &Sense::LUN_NOT_SUPPORTED, None);
        return;
    };
    let itt = cmd.task;
    let read = cmd.read;
    let cmd_epoch = cmd.epoch;
    let cdb = cmd.cdb.as_slice();
    s.refresh();
    // A unit ctl is removing takes no new command: it is gone for this
    // session as soon as the session sees the change.
    let entry = match scsi::decode_lun(cmd.lun.to_be_bytes()) {
        Some(scsi::Lun::Unit(n)) => s.units.get(&n).map(|u| Unit::enter(u, cmd_epoch, &s.nexus)),
        _ => None,
    };
    let mut busy = match entry {
        Some(Entry::Run(b)) => Some(b),
        Some(Entry::Aborted) => {
            drop(session);
            log::debug!("{}: ITT {:#x} was aborted by another session", conn.shell.peer, itt.itt);
            conn.status(itt, status::TASK_ABORTED);
            return;
        }
        Some(Entry::Wait) => {
            drop(session);
            conn.status(itt, status::BUSY);
            return;
        }
        Some(Entry::Gone) | None => None,
    };
    // Sent before its unit took the LUN (the device behind it was
    // replaced while the command's data came): it was meant for the unit
    // before, and gets the unit attention of the change itself.
    let sent_before = busy.as_ref().is_some_and(|b| cmd_epoch < b.0.since.load(Ordering::Acquire))
        && reports_attentions(cdb.first().copied());
    let attention = s.luns_changed_attention(cdb.first().copied());
    if let Some(ua) = attention.or_else(|| sent_before.then_some(Sense::UA_REPORTED_LUNS_CHANGED)) {
        drop((busy, session));
        log::debug!("{}: unit attention REPORTED LUNS DATA HAS CHANGED", conn.shell.peer);
        conn.check(itt, &ua);
        return;
    }
    let unit = busy.as_ref().map(|b| b.0.clone());
    // The connection collected all of the write data before dispatching,
    // so the command gets its data-out (possibly none) on the first call.
    // What the CDB asks for and what the initiator sent may differ: the
    // difference is the residual (RFC 7143 11.4.5.2).
    let residual = match &unit {
        Some(u) if !read => {
            let wanted = u.lu.data_out_len(cdb);
            let sent = cmd.expected_len;
            match sent.cmp(&wanted) {
                std::cmp::Ordering::Less => Some(Residual::Overflow(wanted - sent)),
                std::cmp::Ordering::Greater => Some(Residual::Underflow(sent - wanted)),
                std::cmp::Ordering::Equal => None,
            }
        }
        _ => None,
    };
    let data = cmd.data.unwrap_or_else(|| Buf(IoBuf::with_len(0)));
    let outcome = match (&unit, cdb.first()) {
        (Some(u), Some(&scsi::op::REPORT_LUNS)) => u.lu.report_luns(&s.nexus, cdb, &s.luns),
        (Some(u), _) => u.lu.execute(&s.nexus, cdb, Some(data)),
        (None, _) => scsi::execute_without_lu(cdb, &s.luns),
    };
    if cdb.first() == Some(&scsi::op::REPORT_LUNS) && matches!(outcome, Outcome::Good { .. }) {
        s.luns_changed = false;
    }
    if matches!(outcome, Outcome::Good { .. }) && is_preempt_and_abort(cdb) {
        let preempted = unit.as_ref().map(|u| u.lu.take_preempted(&s.nexus)).unwrap_or_default();
        if let Some(b) = busy.take_if(|_| !preempted.is_empty()) {
            // SPC-4 5.12.11.2.6: the preempted nexuses' tasks are aborted
            // before GOOD, and only theirs; running ones cannot be
            // recalled, so wait.
            let epoch = s.table.epoch.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
            let fences = match Unit::fence_nexuses(&b.0, epoch, &preempted) {
                Some(f) => vec![f],
                None => fence(conn, s, &[&b.0]),
            };
            drop((b, session));
            conn.running.borrow_mut().push((itt.serial, false));
            let deadline = std::time::Instant::now() + FENCE_LIMIT;
            reactor::spawn_detached(answer_preempt_when_fenced(conn.clone(), itt, residual, fences, deadline));
            return;
        }
    }
    drop(session);
    match outcome {
        Outcome::Good { data_in } => conn.good(itt, read, &data_in, residual),
        Outcome::Check(sense) => conn.failed(itt, &sense, residual),
        Outcome::Status(st) => conn.status(itt, st),
        // The iSCSI layer collects all write data before the command is
        // dispatched; a command asking for more had no data-out phase.
        Outcome::NeedData { .. } => conn.failed(itt, &Sense::INVALID_FIELD_IN_CDB, residual),
        Outcome::Io(op) => {
            if let Some(busy) = busy {
                let t0 = reactor::now_us();
                let device = &busy.0.lu.device;
                let lun = busy.0.lu.lun;
                if !read_from_memory(conn, itt, device, &op, (lun, t0))
                    && !write_to_memory(conn, itt, device, &op, residual, (lun, t0))
                {
                    conn.running.borrow_mut().push((itt.serial, false));
                    reactor::spawn_detached(run_io(conn.clone(), itt, busy, op, (residual, cmd_epoch), t0));
                }
            }
        }
    }
}

/// PERSISTENT RESERVE OUT with service action PREEMPT AND ABORT.
fn is_preempt_and_abort(cdb: &[u8]) -> bool {
    const PREEMPT_AND_ABORT: u8 = 0x05;
    cdb.first() == Some(&scsi::op::PERSISTENT_RESERVE_OUT) && cdb.get(1).map(|b| b & 0x1F) == Some(PREEMPT_AND_ABORT)
}

/// Answers the PREEMPT AND ABORT `itt` once no command runs on its unit;
/// ABORTED COMMAND (LOGICAL UNIT COMMUNICATION TIME-OUT) when they did not
/// end by `deadline`, so that a cluster does not take the preempted node
/// for fenced while one of its writes may still land (the preemption
/// itself stands: the registrations are gone).
async fn answer_preempt_when_fenced(
    conn: Rc<Conn>,
    itt: TaskRef,
    residual: Option<Residual>,
    fences: Vec<Fence>,
    deadline: std::time::Instant,
) {
    let done = drained(&conn, &fences, deadline).await;
    drop(fences);
    if conn.finished(itt) {
        return;
    }
    if done {
        conn.good(itt, false, &[], residual);
    } else {
        conn.check_with(itt, &Sense::LU_COMMUNICATION_TIMEOUT, residual);
    }
}

/// Answers a read of a null or RAM LU at once: the blocks are copied
/// straight into a Data-In that carries GOOD status, with no task and no
/// buffer in between (a null LU's zeros are not even copied: they are sent
/// from a shared page). `false` when the request is anything else, needs
/// several Data-In PDUs, or the read failed (`run_io` then answers it).
fn read_from_memory(conn: &Rc<Conn>, itt: TaskRef, device: &Device, op: &BlockOp<Buf>, (lun, t0): (u64, u64)) -> bool {
    let BlockOp::Read { lba, blocks } = *op else { return false };
    if !device.reads_from_memory() {
        return false;
    }
    let len = (blocks as usize).saturating_mul(device.geometry().block_size as usize);
    let sent = match device.zeros_now(lba, len) {
        Some(Ok(())) => conn.iscsi.borrow_mut().send_data_in_zeros(itt, len),
        Some(Err(_)) => false,
        None => conn
            .iscsi
            .borrow_mut()
            .send_data_in_with(itt, len, |out| matches!(device.read_now(lba, len, out), Some(Ok(())))),
    };
    if sent {
        conn.record(lun, (Op::Read, len as u64), t0, None);
        conn.shell.tx_ready.notify();
    }
    sent
}

/// Completes a write to a null or RAM LU at once, where the command
/// arrived: no task, no wait. `false` when the request is anything else.
fn write_to_memory(
    conn: &Conn,
    task: TaskRef,
    device: &Device,
    op: &BlockOp<Buf>,
    residual: Option<Residual>,
    (lun, t0): (u64, u64),
) -> bool {
    let BlockOp::Write { lba, ref data, .. } = *op else { return false };
    let Some(result) = device.write_now(lba, &data.0) else { return false };
    let bytes = (Op::Write, data.0.len() as u64);
    match result {
        Ok(()) => {
            conn.record(lun, bytes, t0, None);
            conn.good(task, false, &[], residual)
        }
        Err(e) => {
            log::warn!("{}: write on {} failed: {e}", conn.shell.peer, device.name());
            let sense = scsi::io_error_sense(&e, true);
            conn.record(lun, bytes, t0, Some(&sense));
            conn.check_with(task, &sense, residual);
        }
    }
    true
}

/// What `op` counts as, and the bytes it moves.
fn op_kind(op: &BlockOp<Buf>, block_size: usize) -> (Op, u64) {
    match op {
        BlockOp::Read { blocks, .. } => (Op::Read, (*blocks as u64).saturating_mul(block_size as u64)),
        BlockOp::Write { data, .. } => (Op::Write, data.0.len() as u64),
        _ => (Op::Other, 0),
    }
}

/// Runs `op` on `busy`'s unit; the unit counts it busy until it is answered.
/// `epoch` is the command's stamp ([`Unit::enter`]).
async fn run_io(
    conn: Rc<Conn>,
    itt: TaskRef,
    busy: Busy,
    op: BlockOp<Buf>,
    (residual, epoch): (Option<Residual>, u64),
    t0: u64,
) {
    let unit = &busy.0;
    let device = &unit.lu.device;
    let write = op.is_write();
    let bs = device.geometry().block_size as usize;
    let kind = op_kind(&op, bs);
    let sense = |e: blockdev::Error| {
        log::warn!("{}: {} on {} failed: {e}", conn.shell.peer, if write { "write" } else { "read" }, device.name());
        scsi::io_error_sense(&e, write)
    };
    // A command that has not reached the device, aborted by this session
    // or fenced by another's task management, never does: ended here
    // (TASK ABORTED when fenced: TAS is 1; no answer when aborted).
    let unstarted = |fenced: bool| {
        if !conn.finished(itt) && fenced && !conn.shell.is_closing() {
            log::debug!("{}: ITT {:#x} was fenced before its I/O started", conn.shell.peer, itt.itt);
            conn.status(itt, status::TASK_ABORTED);
        }
    };
    // Both can happen between its dispatch and this first run: a task
    // management request in the same input as the command.
    if conn.is_aborted(itt) || conn.fenced_by_another(unit, epoch) {
        return unstarted(!conn.is_aborted(itt));
    }
    // A read's buffer counts against the connection's read budget until
    // its Data-In is queued; on a closing connection the read is dropped.
    let _held = match op {
        BlockOp::Read { blocks, .. } | BlockOp::Verify { blocks, .. } => {
            let len = blocks as usize * bs;
            let held = match crate::conn::try_hold_read(&*conn, len) {
                Some(held) => Ok(held),
                None => {
                    // The stops first: room that comes in the same turn as
                    // an abort does not let the aborted read through.
                    let stop = reactor::race(conn.on_abort(itt), until_fenced_by_another(&conn, unit, epoch));
                    match reactor::race(stop, crate::conn::hold_read(&*conn, len)).await {
                        Err(Some(held)) => Ok(held),
                        Err(None) => Err(false),
                        Ok(by_abort) => Err(by_abort.is_err()),
                    }
                }
            };
            match held {
                Ok(held) => Some(held),
                Err(fenced) => return unstarted(fenced),
            }
        }
        _ => None,
    };
    let result: Result<Option<IoBuf>, Sense> = match op {
        BlockOp::Read { lba, blocks } => {
            let (r, buf) = device.read(lba, IoBuf::with_len(blocks as usize * bs)).await;
            r.map(|()| Some(buf)).map_err(sense)
        }
        BlockOp::Write { lba, data, fua } => device.write(lba, data.0, fua).await.0.map(|()| None).map_err(sense),
        BlockOp::WriteSame { lba, blocks, block, fua } => {
            write_same(&conn, itt, device, lba, blocks, &block.0, fua).await.map(|()| None).map_err(sense)
        }
        BlockOp::CompareAndWrite { lba, blocks, data, fua } => {
            compare_and_write(&conn, itt, device, lba, blocks as usize * bs, data.0, fua).await.map(|()| None)
        }
        BlockOp::Flush => device.flush().await.map(|()| None).map_err(sense),
        BlockOp::WriteZeroes { lba, blocks, unmap, fua } => {
            let mut r = device.write_zeroes(lba, blocks, unmap).await;
            // Zeroing is a ring `FALLOCATE`: no RWF_DSYNC to ask for, so
            // with the write cache off it is followed by the flush.
            if r.is_ok() && fua {
                r = device.flush().await;
            }
            r.map(|()| None).map_err(sense)
        }
        BlockOp::Unmap { ranges, fua } => {
            let mut r = Ok(());
            for (lba, blocks) in ranges {
                r = device.deallocate(lba, blocks).await;
                if r.is_err() {
                    break;
                }
            }
            if r.is_ok() && fua {
                r = device.flush().await;
            }
            r.map(|()| None).map_err(sense)
        }
        BlockOp::GetLbaStatus { lba, blocks, alloc_len } => device
            .extent(lba, blocks)
            .map(|extent| Some(IoBuf::from_slice(&scsi::lba_status_data(lba, extent, alloc_len))))
            .map_err(sense),
        BlockOp::Verify { lba, blocks, data } => {
            let (r, buf) = device.read(lba, IoBuf::with_len(blocks as usize * bs)).await;
            match (r, data) {
                (Err(e), _) => Err(sense(e)),
                (Ok(()), Some(expected)) => scsi::miscompare(&expected.0, &buf).map_or(Ok(None), Err),
                (Ok(()), None) => Ok(None),
            }
        }
    };
    conn.record(unit.lu.lun, kind, t0, result.as_ref().err());
    if conn.finished(itt) {
        log::debug!("{}: ITT {:#x} was aborted; its result is dropped", conn.shell.peer, itt.itt);
        return;
    }
    match result {
        Ok(Some(buf)) => conn.good(itt, true, &buf, None),
        Ok(None) => conn.good(itt, false, &[], residual),
        // A failed command's residual is reported too (RFC 7143
        // 11.4.5.1), as for one refused before reaching the device.
        Err(sense) => conn.check_with(itt, &sense, residual),
    }
}

/// Ends once another session's task management (or PREEMPT AND ABORT)
/// fenced `unit` past `epoch`, the stamp of a command of `conn` that has
/// not reached the device: that command must not run (TASK ABORTED, TAS
/// is 1), and the fence must not wait for it. A fence of this connection
/// itself (the unit's latest) does not count: its own commands in scope
/// end through [`Conn::abort`]. Polls, only while such a command waits for
/// read budget, backing off from 5 to 200 ms: a peer that never reads can
/// keep its reads waiting, and hundreds of them polling fast would keep
/// the reactor busy; a fence then waits at most that much longer.
async fn until_fenced_by_another(conn: &Conn, unit: &Arc<Unit>, epoch: u64) {
    let mut pause = Duration::from_millis(5);
    loop {
        if conn.fenced_by_another(unit, epoch) {
            return;
        }
        reactor::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// WRITE SAME of a non-zero block, replicated in bounded chunks; stops
/// between chunks when the task is aborted.
async fn write_same(
    conn: &Conn,
    task: TaskRef,
    device: &blockdev::Device,
    lba: u64,
    blocks: u64,
    block: &[u8],
    fua: bool,
) -> Result<(), blockdev::Error> {
    const CHUNK_BLOCKS: u64 = 256;
    let bs = block.len().max(1);
    let mut done = 0u64;
    while done < blocks && !conn.is_aborted(task) {
        let n = CHUNK_BLOCKS.min(blocks - done);
        let mut buf = IoBuf::with_len(n as usize * bs);
        for c in buf.chunks_mut(bs) {
            c.copy_from_slice(block);
        }
        device.write(lba + done, buf, fua).await.0?;
        done += n;
    }
    Ok(())
}

/// COMPARE AND WRITE: read, compare with the first half of `data`, write
/// the second half, all under the device's range lock, so that no other
/// write to those blocks (any protocol, any reactor, any LU on the device)
/// lands in between. An abort while it waits for the lock ends the wait
/// (and the task) at once.
async fn compare_and_write(
    conn: &Conn,
    task: TaskRef,
    device: &blockdev::Device,
    lba: u64,
    len: usize,
    data: IoBuf,
    fua: bool,
) -> Result<(), Sense> {
    let (expected, new) = data.split_at(len);
    if device.atomic_compare_and_write(lba, len) {
        // One backend operation (rbd: on the OSD, so atomic across
        // gateways); a completed write is durable, FUA needs nothing.
        return match device.compare_and_write(lba, IoBuf::from_slice(expected), IoBuf::from_slice(new)).await {
            Ok(None) => Ok(()),
            Ok(Some(offset)) => Err(Sense::miscompare_at(offset)),
            Err(e) => Err(scsi::io_error_sense(&e, true)),
        };
    }
    let blocks = (len / device.geometry().block_size as usize) as u64;
    let lock = match reactor::race(conn.on_abort(task), device.lock_range(lba, blocks)).await {
        // Aborted while waiting: nothing read or written; the answer is dropped.
        Ok(()) => return Ok(()),
        Err(lock) => lock.map_err(|e| scsi::io_error_sense(&e, true))?,
    };
    let (r, current) = device.read(lba, IoBuf::with_len(len)).await;
    r.map_err(|e| scsi::io_error_sense(&e, false))?;
    if let Some(sense) = scsi::miscompare(expected, &current) {
        return Err(sense);
    }
    let r = device.write_locked(&lock, lba, IoBuf::from_slice(new), fua).await.0;
    drop(lock);
    r.map_err(|e| scsi::io_error_sense(&e, true))
}

/// Every 100 ms: the login deadline, NOP-In pings, and a stop of the
/// daemon: a logged-in initiator is asked to log out within what is left
/// of the drain; at its end (at once for discovery sessions and logins)
/// the connection stops reading commands and closes once the ones it took
/// are answered.
async fn tick_loop(conn: Rc<Conn>, model: Arc<IscsiModel>, rd: TcpStream) {
    let login_deadline = now_ms().saturating_add(u64::try_from(model.handshake.as_millis()).unwrap_or(u64::MAX));
    let (mut asked_logout, mut stopped_reading) = (false, false);
    loop {
        reactor::sleep(Duration::from_millis(100)).await;
        if conn.shell.is_closing() {
            break;
        }
        if crate::lifecycle::draining() && !stopped_reading {
            let now = now_ms();
            if !asked_logout {
                asked_logout = true;
                let left = crate::lifecycle::drain_left_s(now);
                if conn.iscsi.borrow_mut().request_logout(left) {
                    log::info!("{}: stopping: asked the initiator to log out within {left} s", conn.shell.peer);
                    conn.shell.tx_ready.notify();
                } else {
                    stopped_reading = true;
                }
            }
            if crate::lifecycle::drain_over(now) {
                stopped_reading = true;
            }
            if stopped_reading {
                log::debug!("{}: stopping: no more commands from this connection", conn.shell.peer);
                if let Err(e) = rd.shutdown_read() {
                    log::debug!("{}: shutdown(SHUT_RD): {e}", conn.shell.peer);
                    conn.shell.close();
                }
            }
        }
        if conn.iscsi.borrow().state() == iscsi::target::State::AwaitLogin && now_ms() >= login_deadline {
            log::warn!(
                "{}: login not finished within {} ms ([timeouts] handshake_ms); closing",
                conn.shell.peer,
                model.handshake.as_millis()
            );
            conn.shell.close();
            break;
        }
        if let Some(s) = conn.session.borrow_mut().as_mut() {
            s.refresh();
        }
        conn.iscsi.borrow_mut().on_tick(now_ms());
        dispatch_events(&conn, &model);
        if conn.iscsi.borrow().state() == iscsi::target::State::Closed {
            conn.shell.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn a_connections_own_fences_neither_end_its_reads_nor_hide_anothers() {
        let stamp = 5;
        // Nobody fenced after the read arrived; then another session did.
        assert!(!fenced_by_other(None, 3, stamp));
        assert!(fenced_by_other(None, 8, stamp));
        // Only this connection fenced since (twice): its read stays.
        let mut own = OwnFence { unit: 1, epoch: 8, others: 3 };
        assert!(!fenced_by_other(Some(&own), 8, stamp));
        own.again(10, 8);
        assert!(!fenced_by_other(Some(&own), 10, stamp));
        // Another session fenced (12), then this connection (14): the
        // unit's epoch shows only the latter, the note keeps the former.
        own.again(14, 12);
        assert!(fenced_by_other(Some(&own), 14, stamp));
        // Another session's fence after this connection's own.
        let own = OwnFence { unit: 1, epoch: 8, others: 0 };
        assert!(fenced_by_other(Some(&own), 9, stamp));
    }

    fn model(toml: &str) -> IscsiModel {
        let cfg = Config::parse(toml).expect("config");
        let devices = crate::serve::open_devices(&cfg).expect("devices");
        let targets =
            cfg.iscsi_target.iter().map(|t| Arc::new(IscsiTarget::new(t, &devices).expect("target"))).collect();
        IscsiModel::new(targets, vec!["127.0.0.1:3260,1".into()], None)
    }

    const CFG: &str = r#"
[[device]]
name = "r"
kind = "null"
size = "1MiB"
[[iscsi_target]]
iqn = "iqn.2026-11.test:t"
chap = { user = "everyone", secret = "target-wide-secret" }
[[iscsi_target.acl]]
initiator = "iqn.2026-11.test:special"
chap = { user = "special", secret = "special-secret-1" }
mutual_chap = { user = "tgt", secret = "special-target-secret" }
[[iscsi_target.acl]]
initiator = "iqn.2026-11.test:plain"
[[iscsi_target.lun]]
device = "r"
[[port]]
transport = "iscsi"
address = "127.0.0.1:3260"
"#;

    #[test]
    fn acl_entries_allow_their_initiators_and_override_credentials() {
        let m = model(CFG);
        let t = Some("iqn.2026-11.test:t");
        assert!(m.initiator_allowed("iqn.2026-11.test:t", "iqn.2026-11.test:special"));
        assert!(m.initiator_allowed("iqn.2026-11.test:t", "iqn.2026-11.test:plain"));
        assert!(!m.initiator_allowed("iqn.2026-11.test:t", "iqn.2026-11.test:stranger"));
        // The ACL entry's credentials replace the target's for that initiator.
        assert!(m.chap_secret(t, "iqn.2026-11.test:special", "special").is_some());
        assert!(m.chap_secret(t, "iqn.2026-11.test:special", "everyone").is_none());
        assert_eq!(m.target_credentials(t, "iqn.2026-11.test:special").map(|c| c.0), Some("tgt".to_string()));
        // An entry without credentials falls back to the target's.
        assert!(m.auth_required(t, "iqn.2026-11.test:plain"));
        assert!(m.chap_secret(t, "iqn.2026-11.test:plain", "everyone").is_some());
        assert!(m.target_credentials(t, "iqn.2026-11.test:plain").is_none());
        assert_eq!(m.discovery_targets("iqn.2026-11.test:stranger"), Vec::new());
        assert_eq!(m.discovery_targets("iqn.2026-11.test:plain").len(), 1);
    }
}
