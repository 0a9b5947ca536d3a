//! The listening addresses every reactor accepts on, changeable at run
//! time.
//!
//! The control plane publishes the wanted set of addresses (each with the
//! protocols it speaks) under a generation number and rings every
//! reactor's doorbell (an eventfd read posted on its ring); a small task on
//! every reactor wakes, sees the new generation, starts the listeners it lacks
//! (SO_REUSEPORT, one socket per reactor), stops those no longer wanted and
//! acknowledges, naming any address it could not bind. Stopping a listener
//! shuts its socket down, which ends its pending accept; connections it
//! accepted earlier are separate tasks and keep running. Reactors never
//! block on the control plane: they only read the wanted set.

use crate::admit::{Admission, Backoff, PortCount};
use crate::config::{Config, PortConfig};
use crate::iscsi_tcp::IscsiModel;
use crate::nvme::{Bindings, Target};
use std::cell::Cell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::io::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

/// The protocol a listening address speaks.
#[derive(Clone, Copy)]
pub enum Protocol {
    /// NVMe/TCP, NVMe/RDMA over iWARP, or both.
    Nvme(Bindings),
    /// iSCSI.
    Iscsi,
}

/// One wanted listening address.
#[derive(Clone)]
struct Wanted {
    addr: SocketAddr,
    proto: Protocol,
    /// The port entries that make up `proto`; a change restarts the
    /// address's listeners.
    signature: String,
    /// Changes when `signature` does, so reactors restart the listener.
    version: u64,
    count: Arc<PortCount>,
}

/// What connections need from the daemon, handed to each accept loop.
#[derive(Clone)]
pub struct Context {
    /// The NVMe-oF target.
    pub target: Arc<Target>,
    /// The iSCSI targets.
    pub iscsi: Arc<IscsiModel>,
    /// iSCSI connection limits.
    pub icfg: iscsi::target::TargetConfig,
    /// `[limits]` connection admission.
    pub admission: Arc<Admission>,
    /// `[timeouts] handshake_ms`.
    pub handshake: Duration,
    /// `[timeouts] tcp_user_timeout_ms`.
    pub user_timeout_ms: u32,
}

#[derive(Default)]
struct State {
    generation: u64,
    next_version: u64,
    wanted: Vec<Wanted>,
    /// Every address's count while something holds it (the wanted set,
    /// a listener, a connection's slot): an address wanted again (a port
    /// added back, or a change rolled back) takes up its count and the
    /// connections it accepted before.
    counts: Vec<(SocketAddr, Weak<PortCount>)>,
    /// Per reactor: the last generation applied and the addresses it could
    /// not bind then.
    acks: HashMap<usize, (u64, Vec<String>)>,
    /// Each reactor's doorbell, rung when the wanted set changes.
    ringers: Vec<reactor::Ringer>,
}

/// The wanted listening addresses, shared by the control plane and every
/// reactor.
pub struct Listeners {
    state: Mutex<State>,
    acked: Condvar,
    ctx: Context,
    nvme: NvmeSettings,
}

/// The transport settings each NVMe binding is built from (fixed while the
/// daemon runs).
#[derive(Clone, Copy)]
struct NvmeSettings {
    tcp: nvmf_tcp::target::TargetConfig,
    rdma: nvmf_rdma::target::TargetConfig,
    tcp_transport: nvmf::Transport,
    rdma_transport: nvmf::Transport,
}

impl Listeners {
    /// An empty set for `config`'s transport settings.
    pub fn new(config: &Config, ctx: Context) -> Listeners {
        let t = &config.nvme_tcp;
        let tcp = nvmf_tcp::target::TargetConfig {
            max_h2c_data: t.max_h2c_data,
            // I/O queues take what IOCCSZ advertises; the admin queue its
            // fixed 8 KiB (nvmf_tcp::target::ADMIN_IN_CAPSULE).
            max_in_capsule: t.in_capsule_data,
            max_transfer: t.max_transfer,
            cpda: 0,
            c2h_success_always: t.c2h_success == crate::config::C2hSuccess::Always,
            r2t_buffer: u32::try_from(t.r2t_buffer.0).unwrap_or(u32::MAX),
        };
        let rdma = nvmf_rdma::target::TargetConfig {
            max_in_capsule: t.in_capsule_data,
            max_transfer: t.max_transfer,
            max_queue_entries: t.queue_entries,
            read_buffer: u32::try_from(t.r2t_buffer.0).unwrap_or(u32::MAX),
            ..nvmf_rdma::target::TargetConfig::default()
        };
        let nvme = NvmeSettings {
            tcp,
            rdma,
            tcp_transport: nvmf_tcp::transport(t.in_capsule_data),
            rdma_transport: nvmf_rdma::transport(t.in_capsule_data),
        };
        Listeners { state: Mutex::default(), acked: Condvar::new(), ctx, nvme }
    }

    /// The NVMe transport descriptor of a port's `transport` (`tcp` or
    /// `rdma`); `None` for iSCSI.
    pub fn nvme_transport(&self, transport: &str) -> Option<nvmf::Transport> {
        match transport {
            "tcp" => Some(self.nvme.tcp_transport),
            "rdma" => Some(self.nvme.rdma_transport),
            _ => None,
        }
    }

    /// The addresses `ports` listen on, with the protocols each speaks.
    fn plan(&self, ports: &[PortConfig]) -> anyhow::Result<Vec<(SocketAddr, Protocol, String)>> {
        let mut out: Vec<(SocketAddr, Protocol, String)> = Vec::new();
        for p in ports {
            let a: SocketAddr = p.address.parse().map_err(|e| anyhow::anyhow!("port address {:?}: {e}", p.address))?;
            let at = match out.iter().position(|(b, _, _)| *b == a) {
                Some(at) => at,
                None => {
                    let none = Bindings { tcp: None, rdma: None };
                    let proto = if p.transport == "iscsi" { Protocol::Iscsi } else { Protocol::Nvme(none) };
                    out.push((a, proto, String::new()));
                    out.len() - 1
                }
            };
            let Some((_, proto, sig)) = out.get_mut(at) else { continue };
            sig.push_str(&format!("{} crc={:?};", p.transport, p.crc));
            match (proto, p.transport.as_str()) {
                (Protocol::Nvme(b), "tcp") => b.tcp = Some((self.nvme.tcp, self.nvme.tcp_transport)),
                (Protocol::Nvme(b), "rdma") => {
                    let cfg = nvmf_rdma::target::TargetConfig { crc: p.crc.unwrap_or(true), ..self.nvme.rdma };
                    b.rdma = Some((cfg, self.nvme.rdma_transport));
                }
                (Protocol::Iscsi, "iscsi") => {}
                (_, t) => anyhow::bail!("port {a}: {t} cannot share this address (check-config names the pair)"),
            }
        }
        Ok(out)
    }

    /// Publishes `ports` as the wanted set and returns its generation, for
    /// [`Listeners::wait`]. Addresses whose protocols did not change keep
    /// their listeners.
    pub fn set(&self, ports: &[PortConfig]) -> anyhow::Result<u64> {
        let plan = self.plan(ports)?;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut wanted = Vec::new();
        for (addr, proto, signature) in plan {
            let old = st.wanted.iter().find(|w| w.addr == addr).cloned();
            let w = match old {
                Some(w) if w.signature == signature => w,
                _ => {
                    st.next_version += 1;
                    // The address's count if anything still holds it (an
                    // address still wanted always does).
                    let live = st.counts.iter().filter(|(a, _)| *a == addr).find_map(|(_, c)| c.upgrade());
                    let count = live.unwrap_or_else(|| {
                        let c = Arc::new(PortCount::default());
                        st.counts.push((addr, Arc::downgrade(&c)));
                        c
                    });
                    Wanted { addr, proto, signature, version: st.next_version, count }
                }
            };
            wanted.push(w);
        }
        st.wanted = wanted;
        st.counts.retain(|(_, c)| c.strong_count() > 0);
        st.generation += 1;
        for r in &st.ringers {
            r.ring();
        }
        Ok(st.generation)
    }

    /// Waits (at most `limit`) until `reactors` reactors applied generation
    /// `generation`; the error names every address a reactor could not
    /// bind, or the reactors that did not answer, or says that the daemon
    /// began to stop (reactors apply no change then).
    pub fn wait(&self, generation: u64, reactors: usize, limit: Duration) -> Result<(), String> {
        wait_for_acks(&self.state, &self.acked, generation, reactors, limit, crate::lifecycle::draining)
    }

    /// Runs on reactor `index` for as long as it lives: keeps its
    /// listeners in step with the wanted set.
    pub async fn serve(self: Arc<Self>, index: usize) {
        struct Mine {
            addr: SocketAddr,
            version: u64,
            stop: Rc<Cell<bool>>,
            fd: RawFd,
        }
        let mut mine: Vec<Mine> = Vec::new();
        let mut seen = 0;
        // Rung by `set`; until then the reactor sleeps (nothing polls).
        let bell = match reactor::doorbell() {
            Ok((bell, ringer)) => {
                self.state.lock().unwrap_or_else(|e| e.into_inner()).ringers.push(ringer);
                bell
            }
            Err(e) => {
                log::error!("reactor {index}: no doorbell for port changes ({e}); it serves no ports");
                return;
            }
        };
        loop {
            // The wanted set is copied only when it changed: a reactor
            // allocates nothing while nothing changes.
            let changed = {
                let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                (st.generation != seen).then(|| (st.generation, st.wanted.clone()))
            };
            // A stop closes the listeners for good: no change applies
            // after it (and their descriptors may be closed already).
            if let Some((generation, wanted)) = changed.filter(|_| !crate::lifecycle::draining()) {
                mine.retain(|m| {
                    let keep = wanted.iter().any(|w| w.addr == m.addr && w.version == m.version);
                    if !keep {
                        m.stop.set(true);
                        // SAFETY: the fd belongs to a listener whose task is
                        // still alive (it closes the fd only after seeing
                        // `stop`), so it is open; shutdown ends its accept.
                        unsafe { libc::shutdown(m.fd, libc::SHUT_RDWR) };
                        log::info!("reactor {index}: stopped listening on {}", m.addr);
                    }
                    keep
                });
                let mut errors = Vec::new();
                for w in &wanted {
                    if mine.iter().any(|m| m.addr == w.addr && m.version == w.version) {
                        continue;
                    }
                    match reactor::listen(w.addr) {
                        Ok(l) => {
                            let stop = Rc::new(Cell::new(false));
                            mine.push(Mine { addr: w.addr, version: w.version, stop: stop.clone(), fd: l.as_raw_fd() });
                            reactor::spawn(accept_loop(l, w.addr, w.proto, w.count.clone(), stop, self.ctx.clone()));
                        }
                        Err(e) => errors.push(format!("reactor {index}: listen {}: {e}", w.addr)),
                    }
                }
                seen = generation;
                let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                st.acks.insert(index, (generation, errors));
                self.acked.notify_all();
            }
            if let Err(e) = bell.wait().await {
                log::error!("reactor {index}: port changes cannot reach this reactor any more: {e}");
                std::future::pending::<()>().await;
            }
        }
    }
}

/// How often a wait for reactors looks whether the daemon began to stop.
const STOP_CHECK: Duration = Duration::from_millis(20);

/// [`Listeners::wait`], with the daemon's stop as `stopping`.
fn wait_for_acks(
    state: &Mutex<State>,
    acked: &Condvar,
    generation: u64,
    reactors: usize,
    limit: Duration,
    stopping: impl Fn() -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let done: Vec<&Vec<String>> =
            st.acks.values().filter(|(g, _)| *g >= generation).map(|(_, errors)| errors).collect();
        if done.len() >= reactors {
            let errors: Vec<String> = done.into_iter().flatten().cloned().collect();
            return if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) };
        }
        if stopping() {
            return Err(format!(
                "the daemon is stopping: {} of {reactors} reactors applied the port change, the others apply none now",
                done.len()
            ));
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(format!("only {} of {reactors} reactors applied the port change in time", done.len()));
        }
        st = acked.wait_timeout(st, (deadline - now).min(STOP_CHECK)).unwrap_or_else(|e| e.into_inner()).0;
    }
}

async fn accept_loop(
    l: reactor::net::TcpListener,
    port: SocketAddr,
    proto: Protocol,
    count: Arc<PortCount>,
    stop: Rc<Cell<bool>>,
    ctx: Context,
) {
    let what = match l.local_addr() {
        Ok(a) => format!("port {a}"),
        Err(_) => "a port".to_string(),
    };
    let mut backoff = Backoff::default();
    // Dropped before the listener: a stop shuts down only sockets that are
    // still open.
    let _listening = crate::lifecycle::listening(l.as_raw_fd());
    loop {
        let accepted = l.accept().await;
        // A change of the wanted set or a stop shut the listener down (or
        // won the race with this connection).
        if stop.get() || crate::lifecycle::draining() {
            return;
        }
        match accepted {
            Ok((stream, peer)) => {
                backoff.accepted(&what);
                // Over a limit the stream drops here: the peer sees the
                // connection closed.
                let Some(slot) = ctx.admission.admit(&count, peer.ip(), &what) else { continue };
                if ctx.user_timeout_ms > 0 {
                    if let Err(e) = stream.set_user_timeout(ctx.user_timeout_ms) {
                        log::debug!("{peer}: TCP_USER_TIMEOUT: {e}");
                    }
                }
                match proto {
                    Protocol::Nvme(bindings) => reactor::spawn(holding(
                        slot,
                        crate::nvme::serve(stream, ctx.target.clone(), bindings, ctx.handshake, port),
                    )),
                    Protocol::Iscsi => reactor::spawn(holding(
                        slot,
                        crate::iscsi_tcp::serve(stream, ctx.iscsi.clone(), ctx.icfg.clone(), port),
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
}

/// Runs a connection's future, keeping its place in the connection counts
/// until it ends.
async fn holding(slot: crate::admit::Slot, conn: impl std::future::Future<Output = ()>) {
    conn.await;
    drop(slot);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_for_reactors_ends_when_the_daemon_begins_to_stop() {
        // Reactor 0 applied generation 1; reactor 1 never answers, as a
        // reactor does not once the daemon stops.
        let state = Mutex::new(State::default());
        state.lock().expect("state").acks.insert(0, (1, Vec::new()));
        let checks = Cell::new(0);
        let stopping = || {
            checks.set(checks.get() + 1);
            checks.get() > 3
        };
        let e = wait_for_acks(&state, &Condvar::new(), 1, 2, Duration::from_secs(3600), stopping)
            .expect_err("one reactor never applied it");
        assert!(e.contains("the daemon is stopping: 1 of 2 reactors applied"), "{e}");
    }

    #[test]
    fn a_wait_for_reactors_names_the_addresses_they_could_not_bind() {
        let state = Mutex::new(State::default());
        {
            let mut st = state.lock().expect("state");
            st.acks.insert(0, (2, Vec::new()));
            st.acks.insert(1, (2, vec!["reactor 1: listen 127.0.0.1:1: in use".to_string()]));
            st.acks.insert(2, (1, Vec::new()));
        }
        let wait = |reactors| wait_for_acks(&state, &Condvar::new(), 2, reactors, Duration::ZERO, || false);
        assert_eq!(wait(2), Err("reactor 1: listen 127.0.0.1:1: in use".to_string()));
        assert_eq!(wait(3), Err("only 2 of 3 reactors applied the port change in time".to_string()));
    }
}
