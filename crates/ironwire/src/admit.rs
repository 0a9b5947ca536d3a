//! Admission of accepted connections: the per-port and per-host limits of
//! `[limits]`, the process's open-file limit, and the back-off of a
//! listener whose accept fails for want of descriptors or memory.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Live connections, counted per listening address and per peer address,
/// shared by every reactor.
pub struct Admission {
    per_port: u32,
    per_host: u32,
    hosts: Mutex<HashMap<IpAddr, u32>>,
}

/// One listening address's count.
#[derive(Default)]
pub struct PortCount {
    live: AtomicU32,
    /// Refusals not yet logged, and when the last log line was written.
    unlogged: AtomicU64,
    last_log_ms: AtomicU64,
}

/// A connection's place in the counts; given back when it drops.
pub struct Slot {
    admission: Arc<Admission>,
    port: Arc<PortCount>,
    host: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.port.live.fetch_sub(1, Ordering::AcqRel);
        let mut hosts = self.admission.hosts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = hosts.get_mut(&self.host) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                hosts.remove(&self.host);
            }
        }
    }
}

/// Refusals are logged at most this often per port (with a count of the
/// ones in between), so a peer reconnecting in a loop cannot flood the log.
const REFUSAL_LOG_INTERVAL_MS: u64 = 5_000;

impl Admission {
    /// Counts with the given limits.
    pub fn new(per_port: u32, per_host: u32) -> Arc<Admission> {
        Arc::new(Admission { per_port, per_host, hosts: Mutex::new(HashMap::new()) })
    }

    /// Connections open now, over every port.
    pub fn open(&self) -> usize {
        self.hosts.lock().unwrap_or_else(|e| e.into_inner()).values().map(|&n| n as usize).sum()
    }

    /// A slot for a connection from `host` on `port`, or the name of the
    /// limit it would pass (logged here, rate-limited).
    pub fn admit(self: &Arc<Self>, port: &Arc<PortCount>, host: IpAddr, what: &str) -> Option<Slot> {
        let refused = |limit: &str, n: u32| {
            let pending = port.unlogged.fetch_add(1, Ordering::Relaxed) + 1;
            let now = reactor::now_ms();
            let last = port.last_log_ms.load(Ordering::Relaxed);
            if last == 0 || now.saturating_sub(last) >= REFUSAL_LOG_INTERVAL_MS {
                port.last_log_ms.store(now.max(1), Ordering::Relaxed);
                port.unlogged.store(0, Ordering::Relaxed);
                log::warn!(
                    "{what}: refused a connection from {host}: {n} live ([limits] {limit}); {pending} refused since \
                     the last such line"
                );
            }
            None
        };
        if port.live.fetch_add(1, Ordering::AcqRel) >= self.per_port {
            port.live.fetch_sub(1, Ordering::AcqRel);
            return refused("connections_per_port", self.per_port);
        }
        {
            let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
            let n = hosts.entry(host).or_insert(0);
            if *n >= self.per_host {
                drop(hosts);
                port.live.fetch_sub(1, Ordering::AcqRel);
                return refused("connections_per_host", self.per_host);
            }
            *n += 1;
        }
        Some(Slot { admission: self.clone(), port: port.clone(), host })
    }
}

/// Raises the soft open-file limit to the hard limit; returns the limit in
/// force.
pub fn raise_open_files() -> std::io::Result<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a pointer to a local rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(lim.rlim_cur)
}

/// How a listener waits after a failed accept: out of descriptors or
/// memory it backs off (10 ms doubling to 1 s) and logs once per episode;
/// other errors (a peer that reset before we accepted) retry at once.
#[derive(Default)]
pub struct Backoff {
    delay: Option<Duration>,
    failures: u64,
}

impl Backoff {
    /// An accept succeeded: the episode, if any, is over.
    pub fn accepted(&mut self, what: &str) {
        if self.delay.take().is_some() {
            log::warn!("{what}: accepting again after {} failed attempts", self.failures);
            self.failures = 0;
        }
    }

    /// An accept failed with `e`: how long to wait before the next one.
    pub fn failed(&mut self, what: &str, e: &std::io::Error) -> Option<Duration> {
        let scarce = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM));
        if !scarce {
            log::debug!("{what}: accept failed: {e}");
            return None;
        }
        self.failures += 1;
        let next = match self.delay {
            None => {
                log::warn!(
                    "{what}: accept failed: {e}; backing off until descriptors or memory free up (open-file limit: \
                     ulimit -n, [limits] connections_per_port)"
                );
                Duration::from_millis(10)
            }
            Some(d) => (d * 2).min(Duration::from_secs(1)),
        };
        self.delay = Some(next);
        Some(next)
    }
}
