//! A controller: the state a host creates with an admin-queue Connect and
//! shares among its admin and I/O queues, which may live on different
//! reactors. Touched only by control-path commands (properties, features,
//! connects, events), never per I/O.

use crate::model::Subsystem;
use block::BlockDevice;
use nvme_spec::regs::{csts, Cc};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// The keep-alive timeout of a discovery controller connected with KATO 0
/// (nvmet's `NVMET_DISC_KATO_MS`).
pub(crate) const DISCOVERY_KATO_MS: u32 = 120_000;

/// The granularity of the Keep Alive Timeout, ms: Identify Controller KAS
/// says it in 100 ms units.
pub(crate) const KATO_GRANULARITY_MS: u32 = 100;

/// The Keep Alive Timeout a host's `kato_ms` (Connect, Set Features) sets:
/// rounded up to [`KATO_GRANULARITY_MS`] (NVMe Base 2.0 5.27.1.12),
/// saturating at `u32::MAX`.
pub(crate) fn kato_rounded(kato_ms: u32) -> u32 {
    kato_ms.div_ceil(KATO_GRANULARITY_MS).saturating_mul(KATO_GRANULARITY_MS)
}

/// Mutable controller state.
#[derive(Debug, Default)]
pub(crate) struct CtrlState {
    pub cc: u32,
    pub csts: u32,
    pub kato_ms: u32,
    pub io_queues_granted: u16,
    pub io_queues_connected: Vec<u16>,
    pub aec: u32,
    pub arbitration: u32,
    pub power_state: u32,
    /// Temperature Threshold of the composite temperature, kelvin: the
    /// over threshold (THSEL 00b)...
    pub temp_over: u16,
    /// ...and the under threshold (THSEL 01b), none (0 K) at first.
    pub temp_under: u16,
    pub error_recovery: u32,
    pub write_atomicity: u32,
    pub vwc_enabled: bool,
    pub pending_aens: VecDeque<u32>,
    /// Namespaces changed since the host last read the Changed Namespace
    /// List, ascending, at most one past what the page holds.
    pub changed_ns: Vec<u32>,
    pub ns_aen_outstanding: bool,
    pub ana_aen_outstanding: bool,
    pub discovery_aen_outstanding: bool,
    /// Shutdowns begun ([`Controller::set_cc`]): only the flush of the
    /// latest may complete one.
    pub shutdowns: u64,
}

impl CtrlState {
    /// The host read the log page of event `dw0` without RAE: the event
    /// is cleared (NVMe Base 2.0 5.2), reported or still waiting for an
    /// Asynchronous Event Request, and the next change is a new one.
    pub(crate) fn clear_event(&mut self, dw0: u32) {
        self.pending_aens.retain(|&e| e != dw0);
        match dw0 {
            nvme_spec::log::AEN_NS_CHANGED => self.ns_aen_outstanding = false,
            nvme_spec::log::AEN_ANA_CHANGE => self.ana_aen_outstanding = false,
            nvme_spec::log::AEN_DISCOVERY_CHANGE => self.discovery_aen_outstanding = false,
            _ => {}
        }
    }
}

/// One NVMe-oF controller.
#[derive(Debug)]
pub struct Controller<D> {
    /// Controller ID.
    pub cntlid: u16,
    /// Host NQN that created it.
    pub hostnqn: String,
    /// Host identifier from the Connect data.
    pub hostid: [u8; 16],
    /// The IP address the admin queue's connection came from.
    pub(crate) peer_ip: std::net::IpAddr,
    pub(crate) subsystem: Weak<Subsystem<D>>,
    pub(crate) state: Mutex<CtrlState>,
    /// Aborts between the admin queue and the I/O queues.
    pub(crate) aborts: Mutex<crate::abort::Mailbox>,
    last_keep_alive_ms: AtomicU64,
    dead: AtomicBool,
    /// CSTS.RDY, readable without the lock: every I/O command checks it.
    ready: AtomicBool,
    /// Controller Level Resets so far: an I/O queue connected before the
    /// latest was deleted by it ([`Controller::set_cc`]).
    resets: AtomicU64,
    /// Identify Controller VWC bit 0, fixed at Connect: whether any
    /// namespace then had a volatile write cache (file, block). Hosts of a
    /// controller without one never flush.
    pub(crate) vwc_present: bool,
    /// Every write is written through (FUA): no volatile write cache was
    /// advertised, or the host disabled it (Set Features 06h). A load per
    /// write, no lock.
    write_through: AtomicBool,
    /// The KATO Connect gave and the I/O queues granted at first: the
    /// default values Get Features reports (SEL 001b, and 010b: nothing
    /// is saveable).
    connect_kato_ms: u32,
    io_queues: u16,
}

impl CtrlState {
    /// A Controller Level Reset (CC.EN from 1 to 0, NVMe Base 2.0 3.7.2):
    /// every feature returns to its default in `defaults` (none is
    /// saveable, 5.27), but Number of Queues, whose allocation does not
    /// change between resets (5.27.1); the I/O queues are deleted. Events
    /// and the Changed Namespace List stay for the host to read.
    fn reset(&mut self, defaults: &CtrlState) {
        self.kato_ms = defaults.kato_ms;
        self.aec = defaults.aec;
        self.arbitration = defaults.arbitration;
        self.power_state = defaults.power_state;
        self.temp_over = defaults.temp_over;
        self.temp_under = defaults.temp_under;
        self.error_recovery = defaults.error_recovery;
        self.write_atomicity = defaults.write_atomicity;
        self.io_queues_connected.clear();
    }

    /// A new controller's state: KATO from Connect, `io_queues` I/O queues
    /// granted until Set Features Number of Queues, the volatile write
    /// cache on, the over temperature threshold at WCTEMP; the rest 0.
    fn initial(kato_ms: u32, io_queues: u16) -> CtrlState {
        CtrlState {
            kato_ms,
            io_queues_granted: io_queues,
            vwc_enabled: true,
            temp_over: crate::identify::WCTEMP,
            ..Default::default()
        }
    }
}

impl<D: BlockDevice> Controller<D> {
    /// The feature values a new controller starts with (Get Features
    /// SEL 001b, default, and 010b, saved).
    pub(crate) fn default_state(&self) -> CtrlState {
        CtrlState::initial(self.connect_kato_ms, self.io_queues)
    }

    pub(crate) fn new(
        cntlid: u16,
        subsystem: &Arc<Subsystem<D>>,
        hostnqn: &str,
        (hostid, peer_ip): ([u8; 16], std::net::IpAddr),
        (kato_ms, io_queues): (u32, u16),
        now_ms: u64,
    ) -> Self {
        let vwc_present = subsystem.namespaces().iter().any(|ns| ns.device.volatile_write_cache());
        Controller {
            cntlid,
            hostnqn: hostnqn.to_string(),
            hostid,
            peer_ip,
            subsystem: Arc::downgrade(subsystem),
            state: Mutex::new(CtrlState::initial(kato_ms, io_queues)),
            connect_kato_ms: kato_ms,
            io_queues,
            aborts: Mutex::default(),
            last_keep_alive_ms: AtomicU64::new(now_ms),
            dead: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            resets: AtomicU64::new(0),
            vwc_present,
            write_through: AtomicBool::new(!vwc_present),
        }
    }

    /// Whether writes must be durable before they complete, FUA or not: the
    /// host was told there is no volatile write cache (a namespace added
    /// after Connect may have one), or it disabled the cache.
    pub fn write_through(&self) -> bool {
        self.write_through.load(Ordering::Acquire)
    }

    /// Set Features Volatile Write Cache (NVMe Base 1.4 §5.21.1.6). The
    /// caller holds the state lock.
    pub(crate) fn set_vwc_enabled(&self, s: &mut CtrlState, enabled: bool) {
        s.vwc_enabled = enabled;
        self.write_through.store(!(self.vwc_present && enabled), Ordering::Release);
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, CtrlState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The subsystem, while it exists.
    pub fn subsystem(&self) -> Option<Arc<Subsystem<D>>> {
        self.subsystem.upgrade()
    }

    /// True once the controller was torn down (keep-alive expiry, shutdown
    /// of the admin queue); its I/O queues must close.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Tears the controller down and removes it from its subsystem.
    pub fn kill(&self) {
        if self.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(s) = self.subsystem() {
            s.controllers.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.cntlid);
        }
    }

    /// Records host activity that restarts the keep-alive timer.
    pub fn keep_alive(&self, now_ms: u64) {
        self.last_keep_alive_ms.store(now_ms, Ordering::Relaxed);
    }

    /// The keep-alive timeout in milliseconds (0 = disabled).
    pub fn kato_ms(&self) -> u32 {
        self.lock().kato_ms
    }

    /// Whether the keep-alive timer expired at `now_ms`: more than KATO
    /// since the host's last keep-alive or command, as nvmet judges it
    /// (a host sends them more often than the KATO it asked for: Linux
    /// every half of it).
    pub fn keep_alive_expired(&self, now_ms: u64) -> bool {
        let kato = u64::from(self.kato_ms());
        kato != 0 && now_ms.saturating_sub(self.last_keep_alive_ms.load(Ordering::Relaxed)) > kato
    }

    /// Property Set of CC: enable, disable (a Controller Level Reset:
    /// features back to their defaults, I/O queues and Aborts ended) and
    /// shutdown. When a shutdown begins, its number: CSTS.SHST says
    /// "occurring" until [`Controller::shutdown_complete`] of that number,
    /// once the caller has flushed the namespaces' devices
    /// ([`Outcome::Shutdown`](crate::Outcome::Shutdown)).
    pub(crate) fn set_cc(&self, value: u32) -> Option<u64> {
        let mut s = self.lock();
        let new = Cc(value);
        let old = Cc(s.cc);
        s.cc = value;
        if new.en() && !old.en() {
            s.csts = if self.supports(new) { csts::RDY } else { csts::CFS };
        } else if !new.en() && old.en() {
            s.csts = 0;
            let defaults = self.default_state();
            s.reset(&defaults);
            self.set_vwc_enabled(&mut s, defaults.vwc_enabled);
            self.resets.fetch_add(1, Ordering::AcqRel);
            self.reset_aborts();
        }
        let begins = new.shn() != 0 && old.shn() == 0;
        if begins {
            s.csts = (s.csts & !csts::SHST_COMPLETE) | csts::SHST_OCCURRING;
            s.shutdowns = s.shutdowns.wrapping_add(1);
        } else if new.shn() == 0 {
            s.csts &= !(csts::SHST_COMPLETE | csts::SHST_OCCURRING);
        }
        self.ready.store(s.csts & csts::RDY != 0, Ordering::Release);
        begins.then_some(s.shutdowns)
    }

    /// Whether the controller can run as `cc` configures it (NVMe base 2.0
    /// 3.1.3.5): the NVM command set, or all I/O command sets where CAP.CSS
    /// bit 43 says so (I/O controllers); 4 KiB pages (CAP.MPSMIN = MPSMAX
    /// = 0); round robin arbitration (CAP.AMS 0); and on an I/O controller
    /// the queue entry sizes Identify SQES and CQES allow. A discovery
    /// controller has no I/O queues: hosts write their entry sizes as 0 or
    /// as for I/O, both accepted (as nvmet does). Otherwise enabling sets
    /// CSTS.CFS instead of CSTS.RDY, as nvmet does, and the host resets.
    fn supports(&self, cc: Cc) -> bool {
        let discovery = self.subsystem().is_some_and(|s| s.discovery);
        let css = cc.css() == Cc::CSS_NVM || (cc.css() == Cc::CSS_ALL_IO && !discovery);
        let entries = discovery || (cc.iosqes() == Cc::IOSQES_FABRICS && cc.iocqes() == Cc::IOCQES_FABRICS);
        if !(css && entries && cc.mps() == 0 && cc.ams() == 0) {
            log::warn!("controller {}: enabled with CC {:#010x}, which it cannot run: CSTS.CFS", self.cntlid, cc.0);
            return false;
        }
        true
    }

    /// Shutdown number `shutdown` ([`Controller::set_cc`]) is over (what
    /// the host wrote before it is durable): CSTS.SHST says "complete",
    /// unless the host cleared CC.SHN meanwhile or began a later shutdown
    /// (whose flush may cover writes this one's did not).
    pub fn shutdown_complete(&self, shutdown: u64) {
        let mut s = self.lock();
        if Cc(s.cc).shn() != 0 && s.shutdowns == shutdown {
            s.csts = (s.csts & !csts::SHST_OCCURRING) | csts::SHST_COMPLETE;
        }
    }

    /// Controller Level Resets so far: an I/O queue remembers the count
    /// it connected at, and a reset since deleted it.
    pub(crate) fn resets(&self) -> u64 {
        self.resets.load(Ordering::Acquire)
    }

    /// Whether CC.EN and CSTS.RDY are set. A load, no lock: the I/O path
    /// asks on every command.
    pub fn enabled(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Queues a namespace-attribute-changed event if the host enabled it
    /// (Asynchronous Event Configuration bit 8) and none is outstanding.
    pub(crate) fn namespace_changed(&self, nsid: u32) {
        let mut s = self.lock();
        // Kept in increasing order (the log page lists them so) and no
        // longer than one past what the page holds: past that the page
        // reads FFFFFFFFh alone, whichever namespaces changed.
        if s.changed_ns.len() <= nvme_spec::log::CHANGED_NS_LEN / 4 {
            if let Err(at) = s.changed_ns.binary_search(&nsid) {
                s.changed_ns.insert(at, nsid);
            }
        }
        if s.aec & (1 << 8) != 0 && !s.ns_aen_outstanding {
            s.ns_aen_outstanding = true;
            s.pending_aens.push_back(nvme_spec::log::AEN_NS_CHANGED);
        }
    }

    /// Queues an ANA change event if the host enabled it (Asynchronous
    /// Event Configuration bit 11) and none is outstanding; reading the
    /// ANA log page without RAE re-arms it.
    pub(crate) fn ana_changed(&self) {
        let mut s = self.lock();
        if s.aec & (1 << 11) != 0 && !s.ana_aen_outstanding {
            s.ana_aen_outstanding = true;
            s.pending_aens.push_back(nvme_spec::log::AEN_ANA_CHANGE);
        }
    }

    /// Queues a discovery log page change event if the host enabled it
    /// (Asynchronous Event Configuration bit 31) and none is outstanding;
    /// reading the discovery log without RAE re-arms it.
    pub(crate) fn discovery_changed(&self) {
        let mut s = self.lock();
        if s.aec & (1 << 31) != 0 && !s.discovery_aen_outstanding {
            s.discovery_aen_outstanding = true;
            s.pending_aens.push_back(nvme_spec::log::AEN_DISCOVERY_CHANGE);
        }
    }
}
