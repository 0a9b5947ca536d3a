//! What the daemon counts while it serves: I/O figures per namespace, LUN
//! and port, kept per reactor, and the table of connected hosts.
//!
//! The data path pays a few plain loads and stores per I/O and nothing
//! else: each reactor owns its counters (only its thread writes them, so
//! an add is a load and a store, never a read-modify-write or a lock),
//! latency goes into a fixed array of log-scaled buckets, and the clock is
//! the reactor's per-turn time (`reactor::now_us`), not a clock read.
//! A connection looks its namespace's counters up in its own small cache;
//! only the first I/O of a connection to a namespace takes the reactor's
//! table lock (allocating the counters once per reactor and namespace).
//! Readers (`ctl stats`, a Prometheus scrape) lock each reactor's table
//! and add the reactors up: all the cost is theirs.
//!
//! The host table also holds a duplicate of each connection's socket, so
//! that `ctl disconnect` can shut connections down from the control
//! thread ([`disconnect`]): the duplicate lives as long as the entry, so
//! the descriptor it shuts down is never one reused by another socket.
//!
//! It must never allocate, lock or read the clock per I/O.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

/// A counter written by one thread and read by any.
#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`. Only the owning reactor thread calls it: a load and a
    /// store, with no read-modify-write.
    #[inline]
    fn add(&self, n: u64) {
        self.0.store(self.0.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    #[inline]
    fn set(&self, n: u64) {
        self.0.store(n, Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Latency buckets: bucket `i < BUCKETS - 1` counts latencies of at most
/// 2^i µs (and more than 2^(i-1) µs); the last counts the rest. 2^22 µs is
/// about 4.2 s.
pub const BUCKETS: usize = 24;

/// The upper bound of bucket `i` in µs; `None` for the last (+Inf).
pub fn bucket_bound_us(i: usize) -> Option<u64> {
    (i + 1 < BUCKETS).then(|| 1u64 << i)
}

/// The bucket of a latency of `us` microseconds.
#[inline]
fn bucket_of(us: u64) -> usize {
    let i = if us <= 1 { 0 } else { (64 - (us - 1).leading_zeros()) as usize };
    i.min(BUCKETS - 1)
}

/// A latency histogram over [`BUCKETS`] fixed buckets.
#[derive(Default)]
struct Histogram {
    buckets: [Counter; BUCKETS],
    sum_us: Counter,
}

impl Histogram {
    #[inline]
    fn record(&self, us: u64) {
        if let Some(b) = self.buckets.get(bucket_of(us)) {
            b.add(1);
        }
        self.sum_us.add(us);
    }
}

/// What an I/O was, for the counters.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Op {
    /// A read (NVMe Read, SCSI READ).
    Read,
    /// A write (NVMe Write, SCSI WRITE).
    Write,
    /// Anything else that reached the device: flush, write zeroes,
    /// deallocate/unmap, compare, verify, write same, compare and write.
    Other,
}

/// A failed command's status, kept as the last error of its counters.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Failure {
    /// An NVMe completion status.
    Nvme(nvme_spec::Status),
    /// A SCSI CHECK CONDITION with this sense.
    Scsi { key: u8, asc: u8, ascq: u8 },
    /// Another SCSI status (RESERVATION CONFLICT, BUSY, ...).
    ScsiStatus(u8),
}

impl Failure {
    /// The SCSI failure of `sense`.
    pub fn sense(sense: &scsi::Sense) -> Failure {
        Failure::Scsi { key: sense.key, asc: sense.asc, ascq: sense.ascq }
    }

    /// Packed into a counter: bit 63 marks "set", bits 33..32 the kind.
    fn pack(self) -> u64 {
        let (kind, v) = match self {
            Failure::Nvme(s) => (0u64, u64::from(s.0)),
            Failure::Scsi { key, asc, ascq } => (1, u64::from(key) << 16 | u64::from(asc) << 8 | u64::from(ascq)),
            Failure::ScsiStatus(st) => (2, u64::from(st)),
        };
        1 << 63 | kind << 32 | v
    }

    fn unpack(v: u64) -> Option<Failure> {
        if v >> 63 == 0 {
            return None;
        }
        let low = (v & 0xffff_ffff) as u32;
        Some(match (v >> 32) & 3 {
            0 => Failure::Nvme(nvme_spec::Status(low as u16)),
            1 => Failure::Scsi { key: (low >> 16) as u8, asc: (low >> 8) as u8, ascq: low as u8 },
            _ => Failure::ScsiStatus(low as u8),
        })
    }
}

/// The name and codes, as logs show them.
impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Failure::Nvme(s) => write!(f, "{s}"),
            Failure::Scsi { key, asc, ascq } => write!(f, "{}", scsi::Sense::new(key, asc, ascq)),
            Failure::ScsiStatus(st) => match scsi::status::name(st) {
                Some(n) => write!(f, "{n} (status {st:#04x})"),
                None => write!(f, "status {st:#04x}"),
            },
        }
    }
}

/// One reactor's figures for one namespace, LUN or port.
#[derive(Default)]
pub struct IoCounters {
    reads: Counter,
    writes: Counter,
    read_bytes: Counter,
    write_bytes: Counter,
    other: Counter,
    errors: Counter,
    last_error: Counter,
    read_latency: Histogram,
    write_latency: Histogram,
    other_latency: Histogram,
    /// Its namespace or LUN left the configuration ([`forget`]):
    /// connections that cached these counters look their scope up again.
    retired: std::sync::atomic::AtomicBool,
}

impl IoCounters {
    /// Counts one I/O of `bytes` that took `latency_us`, failed with
    /// `failure` if any.
    #[inline]
    pub fn record(&self, op: Op, bytes: u64, latency_us: u64, failure: Option<Failure>) {
        match op {
            Op::Read => {
                self.reads.add(1);
                self.read_bytes.add(bytes);
                self.read_latency.record(latency_us);
            }
            Op::Write => {
                self.writes.add(1);
                self.write_bytes.add(bytes);
                self.write_latency.record(latency_us);
            }
            Op::Other => {
                self.other.add(1);
                self.other_latency.record(latency_us);
            }
        }
        if let Some(f) = failure {
            self.error(f);
        }
    }

    /// Counts a failed command (only errors are counted).
    #[inline]
    pub fn error(&self, failure: Failure) {
        self.errors.add(1);
        self.last_error.set(failure.pack());
    }
}

/// A port's figures on one reactor: its I/O and its connections.
#[derive(Default)]
struct PortCounters {
    io: IoCounters,
    open: Counter,
    accepted: Counter,
    /// Its address left the configuration ([`forget`]) while connections
    /// it accepted were still open: the last of them to close on this
    /// reactor takes it out of the table.
    retired: std::sync::atomic::AtomicBool,
}

/// What a set of counters belongs to.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Scope {
    /// NVMe namespace `nsid` of subsystem `subsystem`.
    Namespace { subsystem: String, nsid: u32 },
    /// iSCSI LUN `lun` of target `target`.
    Lun { target: String, lun: u64 },
}

/// One reactor's counters. Its thread writes them; readers lock the
/// tables.
pub struct ReactorStats {
    index: usize,
    connections: Counter,
    /// The reactor's idle spin in ns (`reactor::idle_poll_counter`).
    idle_poll: Option<Arc<std::sync::atomic::AtomicU64>>,
    /// Receives that found every receive buffer lent out
    /// (`reactor::receive_dry_counter`).
    receive_dry: Option<Arc<std::sync::atomic::AtomicU64>>,
    scopes: Mutex<Vec<(Scope, Arc<IoCounters>)>>,
    ports: Mutex<Vec<(SocketAddr, Arc<PortCounters>)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

static REACTORS: Mutex<Vec<Arc<ReactorStats>>> = Mutex::new(Vec::new());

thread_local! {
    static THIS_REACTOR: RefCell<Option<Arc<ReactorStats>>> = const { RefCell::new(None) };
}

/// Makes the calling thread reactor `index` for the counters.
pub fn register_reactor(index: usize) -> Arc<ReactorStats> {
    let r = Arc::new(ReactorStats {
        index,
        connections: Counter::default(),
        idle_poll: reactor::idle_poll_counter(),
        receive_dry: reactor::receive_dry_counter(),
        scopes: Mutex::new(Vec::new()),
        ports: Mutex::new(Vec::new()),
    });
    lock(&REACTORS).push(r.clone());
    THIS_REACTOR.with(|t| *t.borrow_mut() = Some(r.clone()));
    r
}

fn this_reactor() -> Arc<ReactorStats> {
    match THIS_REACTOR.with(|t| t.borrow().clone()) {
        Some(r) => r,
        // A thread that was never registered (not a reactor of the daemon)
        // counts as a reactor of its own, numbered after the others.
        None => {
            let n = lock(&REACTORS).len();
            register_reactor(n)
        }
    }
}

impl ReactorStats {
    fn scope(&self, scope: Scope) -> Arc<IoCounters> {
        let mut t = lock(&self.scopes);
        if let Some((_, c)) = t.iter().find(|(s, _)| *s == scope) {
            return c.clone();
        }
        let c = Arc::new(IoCounters::default());
        t.push((scope, c.clone()));
        c
    }

    fn port(&self, addr: SocketAddr) -> Arc<PortCounters> {
        let mut t = lock(&self.ports);
        if let Some((_, c)) = t.iter().find(|(a, _)| *a == addr) {
            return c.clone();
        }
        let c = Arc::new(PortCounters::default());
        t.push((addr, c.clone()));
        c
    }
}

/// Drops the series of what left the configuration: every reactor's
/// counters of a namespace or LUN `keep_scope` refuses (a connection that
/// cached them counts into fresh ones if the same NSID or LUN comes back),
/// and of a port `keep_port` refuses once no connection of that reactor
/// is open on it. Without this, `ctl stats` and the metrics endpoint kept
/// a series for every object ever removed.
pub fn forget(keep_scope: impl Fn(&Scope) -> bool, keep_port: impl Fn(&SocketAddr) -> bool) {
    let reactors: Vec<Arc<ReactorStats>> = lock(&REACTORS).clone();
    for r in &reactors {
        lock(&r.scopes).retain(|(s, c)| {
            let keep = keep_scope(s);
            if !keep {
                c.retired.store(true, Ordering::Relaxed);
            }
            keep
        });
        lock(&r.ports).retain(|(a, c)| {
            let keep = keep_port(a);
            c.retired.store(!keep, Ordering::Relaxed);
            keep || c.open.get() != 0
        });
    }
}

/// One connection's view of the counters: its reactor, its port, the
/// namespaces or LUNs it used, and its line in the host table. Dropping it
/// ends the connection's count and removes its line.
pub struct Connection {
    reactor: Arc<ReactorStats>,
    port: Arc<PortCounters>,
    /// The scopes this connection used, by nsid or LUN: usually one.
    cache: RefCell<Vec<(u64, Arc<IoCounters>)>>,
    id: u64,
    peer: SocketAddr,
}

impl Connection {
    /// Counts a new connection accepted on `port` from `peer`, on this
    /// reactor, and lists it in the host table with a duplicate of its
    /// socket `fd` (for [`disconnect`]).
    pub fn open(protocol: &'static str, port: SocketAddr, peer: SocketAddr, fd: RawFd) -> Connection {
        let reactor = this_reactor();
        let p = reactor.port(port);
        reactor.connections.add(1);
        p.open.add(1);
        p.accepted.add(1);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let socket = dup_socket(fd);
        if socket.is_none() {
            log::warn!(
                "{peer}: cannot duplicate the socket (out of descriptors?): ctl disconnect and access changes \
                 cannot close this connection"
            );
        }
        lock(&HOSTS).insert(
            id,
            HostEntry {
                protocol,
                port,
                peer,
                reactor: reactor.index,
                since: SystemTime::now(),
                since_mono: Instant::now(),
                login: None,
                socket,
            },
        );
        Connection { reactor, port: p, cache: RefCell::new(Vec::new()), id, peer }
    }

    /// The peer's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The port's counters: every completion this connection sends that is
    /// an error lands here, besides its namespace's.
    pub fn port(&self) -> &IoCounters {
        &self.port.io
    }

    /// Runs `f` on the counters of the namespace or LUN `id` (nsid or LUN
    /// number) and on the port's; `scope` names it on the connection's
    /// first I/O to it.
    #[inline]
    pub fn with(&self, id: u64, scope: impl FnOnce() -> Option<Scope>, f: impl Fn(&IoCounters)) {
        f(&self.port.io);
        let cache = self.cache.borrow();
        if let Some((_, c)) = cache.iter().find(|(i, _)| *i == id) {
            if !c.retired.load(Ordering::Relaxed) {
                f(c);
                return;
            }
            drop(cache);
            self.cache.borrow_mut().retain(|(i, _)| *i != id);
        } else {
            drop(cache);
        }
        if let Some(s) = scope() {
            let c = self.reactor.scope(s);
            f(&c);
            self.cache.borrow_mut().push((id, c));
        }
    }

    /// Records what the connection turned out to be, once its login or
    /// Fabrics Connect succeeded.
    pub fn logged_in(&self, login: Login) {
        if let Some(e) = lock(&HOSTS).get_mut(&self.id) {
            e.login = Some(login);
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reactor.connections.set(self.reactor.connections.get().wrapping_sub(1));
        self.port.open.set(self.port.open.get().wrapping_sub(1));
        // Under the table's lock, which `forget` holds while it retires:
        // one of the two sees the other's change. Only this thread opens
        // connections on these counters, so none comes in between.
        let mut ports = lock(&self.reactor.ports);
        if self.port.retired.load(Ordering::Relaxed) && self.port.open.get() == 0 {
            ports.retain(|(_, c)| !Arc::ptr_eq(c, &self.port));
        }
        drop(ports);
        lock(&HOSTS).remove(&self.id);
    }
}

/// Who a connection turned out to be.
#[derive(Clone, Debug)]
pub enum Login {
    /// An NVMe-oF queue of a controller.
    Nvme {
        /// Host NQN.
        hostnqn: String,
        /// Subsystem NQN.
        subsystem: String,
        /// Controller ID.
        cntlid: u16,
        /// Queue ID (0: admin).
        qid: u16,
        /// Queue entries (SQSIZE + 1).
        depth: u32,
        /// Header and data digests (NVMe/TCP), or MPA CRC (iWARP) as both.
        digests: (bool, bool),
    },
    /// An iSCSI session.
    Iscsi {
        /// InitiatorName.
        initiator: String,
        /// TargetName, or none for a discovery session.
        target: Option<String>,
        /// TSIH.
        tsih: u16,
        /// ISID, hex.
        isid: String,
        /// Commands the initiator may have outstanding (the CmdSN window).
        depth: u32,
        /// HeaderDigest and DataDigest.
        digests: (bool, bool),
        /// "none", "CHAP" or "mutual CHAP".
        chap: &'static str,
    },
}

struct HostEntry {
    protocol: &'static str,
    port: SocketAddr,
    peer: SocketAddr,
    reactor: usize,
    since: SystemTime,
    since_mono: Instant,
    login: Option<Login>,
    /// A duplicate of the connection's socket (none if `dup` failed: such
    /// a connection cannot be shut down from outside).
    socket: Option<TcpStream>,
}

impl HostEntry {
    fn host(&self) -> Host {
        Host {
            protocol: self.protocol,
            port: self.port,
            peer: self.peer,
            reactor: self.reactor,
            since: self.since,
            connected: self.since_mono.elapsed(),
            login: self.login.clone(),
        }
    }
}

/// A duplicate of the connection socket `fd`, which the caller keeps open.
pub fn dup_socket(fd: RawFd) -> Option<TcpStream> {
    // SAFETY: `fd` is the caller's live connection socket; it is only
    // borrowed for the duplication.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    fd.try_clone_to_owned().ok().map(TcpStream::from)
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static HOSTS: Mutex<BTreeMap<u64, HostEntry>> = Mutex::new(BTreeMap::new());

/// The sum over reactors of one namespace's, LUN's or port's counters.
#[derive(Clone, Default, Debug, PartialEq, Eq)]
pub struct Totals {
    /// Reads, writes and other commands completed.
    pub reads: u64,
    /// Writes completed.
    pub writes: u64,
    /// Other commands completed.
    pub other: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Commands that failed.
    pub errors: u64,
    /// The last failure on any reactor (reactor order when several).
    pub last_error: Option<Failure>,
    /// Read, write and other latency.
    pub latency: [Latency; 3],
}

/// A latency histogram's sum over reactors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Latency {
    /// Per bucket (see [`bucket_bound_us`]), not cumulative.
    pub buckets: [u64; BUCKETS],
    /// Sum of all latencies, µs.
    pub sum_us: u64,
}

impl Default for Latency {
    fn default() -> Self {
        Latency { buckets: [0; BUCKETS], sum_us: 0 }
    }
}

impl Latency {
    fn add(&mut self, h: &Histogram) {
        for (t, b) in self.buckets.iter_mut().zip(&h.buckets) {
            *t = t.wrapping_add(b.get());
        }
        self.sum_us = self.sum_us.wrapping_add(h.sum_us.get());
    }

    /// How many latencies were recorded.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The upper bound (µs) of the bucket that holds the `q` quantile
    /// (0 < q ≤ 1); `None` when nothing was recorded or it is past the
    /// last finite bucket.
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let rank = ((n as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0u64;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b;
            if seen >= rank {
                return bucket_bound_us(i);
            }
        }
        None
    }
}

impl Totals {
    fn add(&mut self, c: &IoCounters) {
        self.reads += c.reads.get();
        self.writes += c.writes.get();
        self.other += c.other.get();
        self.read_bytes += c.read_bytes.get();
        self.write_bytes += c.write_bytes.get();
        self.errors += c.errors.get();
        if let Some(f) = Failure::unpack(c.last_error.get()) {
            self.last_error = Some(f);
        }
        for (l, h) in self.latency.iter_mut().zip([&c.read_latency, &c.write_latency, &c.other_latency]) {
            l.add(h);
        }
    }
}

/// A port's totals.
#[derive(Clone, Default, Debug)]
pub struct PortTotals {
    /// Its I/O.
    pub io: Totals,
    /// Connections open now.
    pub open: u64,
    /// Connections accepted since start.
    pub accepted: u64,
}

/// One reactor's own figures.
#[derive(Clone, Debug)]
pub struct ReactorTotals {
    /// Reactor index.
    pub index: usize,
    /// Connections it serves now.
    pub connections: u64,
    /// Its thread's CPU time since start.
    pub cpu: Duration,
    /// CPU time over wall time since the previous reading (or start), %.
    pub busy_percent: f64,
    /// Heap allocations its thread made.
    pub allocations: u64,
    /// The part of `cpu` spent spinning (`[reactor] poll_us`) without
    /// finding work; `cpu` less this is its busy time.
    pub idle_poll: Duration,
    /// Receives that found every buffer of its receive ring lent out and
    /// waited for one: rising, the reactor has too few `receive_buffers`.
    pub receive_dry: u64,
}

/// Everything counted, added up over the reactors.
#[derive(Clone, Default, Debug)]
pub struct Snapshot {
    /// Per namespace and LUN.
    pub scopes: BTreeMap<Scope, Totals>,
    /// Per listening address.
    pub ports: BTreeMap<SocketAddr, PortTotals>,
    /// Per reactor.
    pub reactors: Vec<ReactorTotals>,
}

/// When CPU was last read, and each reactor's CPU time then.
type CpuReading = (Instant, Vec<(usize, Duration)>);

/// The previous reading of each reactor's CPU, for busy %.
static LAST_CPU: Mutex<Option<CpuReading>> = Mutex::new(None);

fn started() -> Instant {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// Starts the clock busy % is first measured from.
pub fn start_clock() {
    started();
}

/// Adds up every reactor's counters.
pub fn snapshot() -> Snapshot {
    let reactors: Vec<Arc<ReactorStats>> = lock(&REACTORS).clone();
    let mut snap = Snapshot::default();
    for r in &reactors {
        for (scope, c) in lock(&r.scopes).iter() {
            snap.scopes.entry(scope.clone()).or_default().add(c);
        }
        for (addr, c) in lock(&r.ports).iter() {
            let p = snap.ports.entry(*addr).or_default();
            p.io.add(&c.io);
            p.open = p.open.wrapping_add(c.open.get());
            p.accepted += c.accepted.get();
        }
    }
    let cpu = crate::cpu::threads_cpu("reactor-");
    let allocs = crate::alloc::counts();
    let now = Instant::now();
    let mut last = lock(&LAST_CPU);
    let (since, before) = last.take().unwrap_or_else(|| (started(), Vec::new()));
    let wall = now.saturating_duration_since(since).as_secs_f64();
    let mut readings = Vec::new();
    for r in &reactors {
        let name = format!("reactor-{}", r.index);
        let used = cpu.iter().find(|(n, _)| *n == name).map(|(_, c)| *c).unwrap_or_default();
        let prev = before.iter().find(|(i, _)| *i == r.index).map(|(_, c)| *c).unwrap_or_default();
        let busy = if wall > 0.0 { used.saturating_sub(prev).as_secs_f64() / wall * 100.0 } else { 0.0 };
        readings.push((r.index, used));
        snap.reactors.push(ReactorTotals {
            index: r.index,
            connections: r.connections.get(),
            cpu: used,
            busy_percent: busy.min(100.0),
            allocations: allocs.iter().find(|(n, _)| *n == name).map(|(_, a)| *a).unwrap_or(0),
            idle_poll: Duration::from_nanos(
                r.idle_poll.as_ref().map_or(0, |c| c.load(std::sync::atomic::Ordering::Relaxed)),
            ),
            receive_dry: r.receive_dry.as_ref().map_or(0, |c| c.load(std::sync::atomic::Ordering::Relaxed)),
        });
    }
    *last = Some((now, readings));
    snap
}

/// One connected host as `ctl hosts` shows it.
#[derive(Clone, Debug)]
pub struct Host {
    /// `nvme-tcp`, `nvme-rdma` or `iscsi`.
    pub protocol: &'static str,
    /// The listening address it came in on.
    pub port: SocketAddr,
    /// Its address.
    pub peer: SocketAddr,
    /// The reactor serving it.
    pub reactor: usize,
    /// When it connected.
    pub since: SystemTime,
    /// How long ago.
    pub connected: Duration,
    /// Who it is, once logged in.
    pub login: Option<Login>,
}

/// Every connection, oldest first.
pub fn hosts() -> Vec<Host> {
    lock(&HOSTS).values().map(HostEntry::host).collect()
}

/// Shuts down, both ways, the socket of every connection `select` picks,
/// and returns them. Each ends as if its peer had gone: it stops reading,
/// finishes the commands it took, and leaves the table. Connections whose
/// socket could not be duplicated are left alone (and not returned).
pub fn disconnect(select: impl Fn(&Host) -> bool) -> Vec<Host> {
    let hosts = lock(&HOSTS);
    let mut closed = Vec::new();
    for e in hosts.values() {
        let h = e.host();
        if !select(&h) {
            continue;
        }
        if let Some(s) = &e.socket {
            // A socket already shut down by its own connection answers
            // ENOTCONN: it is going anyway.
            let _ = s.shutdown(Shutdown::Both);
            closed.push(h);
        }
    }
    closed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_latencies_up_to_their_bound() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1), 0);
        assert_eq!(bucket_of(2), 1);
        assert_eq!(bucket_of(3), 2);
        assert_eq!(bucket_of(4), 2);
        assert_eq!(bucket_of(5), 3);
        assert_eq!(bucket_of(1 << 22), BUCKETS - 2);
        assert_eq!(bucket_of((1 << 22) + 1), BUCKETS - 1);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        for us in [1u64, 7, 100, 1000, 65_537] {
            let i = bucket_of(us);
            assert!(us <= bucket_bound_us(i).expect("finite"), "{us} above bucket {i}");
            assert!(i == 0 || us > bucket_bound_us(i - 1).expect("finite"), "{us} fits bucket {}", i - 1);
        }
    }

    #[test]
    fn quantiles_are_bucket_bounds() {
        let c = IoCounters::default();
        for us in [3u64, 3, 3, 3, 3, 3, 3, 3, 3, 200] {
            c.record(Op::Read, 4096, us, None);
        }
        let mut t = Totals::default();
        t.add(&c);
        assert_eq!((t.reads, t.read_bytes, t.errors), (10, 40960, 0));
        let l = &t.latency[0];
        assert_eq!((l.count(), l.sum_us), (10, 227));
        assert_eq!(l.quantile_us(0.5), Some(4));
        assert_eq!(l.quantile_us(0.9), Some(4));
        assert_eq!(l.quantile_us(0.99), Some(256));
        assert_eq!(t.latency[1].quantile_us(0.5), None);
    }

    #[test]
    fn the_last_failure_survives_packing() {
        for f in [
            Failure::Nvme(nvme_spec::Status::LBA_OUT_OF_RANGE.dnr()),
            Failure::sense(&scsi::Sense::LBA_OUT_OF_RANGE),
            Failure::ScsiStatus(scsi::status::RESERVATION_CONFLICT),
        ] {
            assert_eq!(Failure::unpack(f.pack()), Some(f));
        }
        assert_eq!(Failure::unpack(0), None);
        assert_eq!(
            Failure::sense(&scsi::Sense::LBA_OUT_OF_RANGE).to_string(),
            "ILLEGAL REQUEST: LOGICAL BLOCK ADDRESS OUT OF RANGE (key 0x5 asc 0x21 ascq 0x00)"
        );
    }
}
