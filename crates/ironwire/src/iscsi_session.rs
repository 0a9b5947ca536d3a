//! The live sessions of one iSCSI target by initiator name and ISID, for
//! session reinstatement (RFC 7143 sections 5.3.5 and 6.3.5): a login with
//! the name and ISID of a live session and TSIH 0 ends that session first.
//!
//! The old session may live on another reactor thread: its socket is shut
//! down through a duplicate of its descriptor, which ends its connection
//! there; the new login waits, on a doorbell, until the old connection is
//! gone entirely (its I/O tasks finished, its nexus and session place given
//! back, its counters closed). Consulted at login and when a connection
//! ends, never on the I/O path.

use reactor::Ringer;
use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Initiator name (lower case: iSCSI names compare without case) and ISID.
type Key = (String, [u8; 6]);

/// The sessions of one target.
#[derive(Default)]
pub struct Registry {
    live: Mutex<HashMap<Key, Arc<Entry>>>,
}

struct Entry {
    /// A duplicate of the session's socket: shutting it down from any
    /// thread ends the session's connection.
    socket: Option<TcpStream>,
    /// The session's peer, for the log.
    peer: SocketAddr,
    /// A newer login took this session's place.
    reinstated: AtomicBool,
    /// Set once the session's connection is gone.
    gone: Arc<Gone>,
    /// Older sessions this one replaced that may not be gone yet.
    older: Vec<Arc<Gone>>,
}

/// Whether a session's connection is gone, and who waits for it.
#[derive(Default)]
pub struct Gone {
    state: Mutex<(bool, Vec<Ringer>)>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Gone {
    /// Whether the session's connection is gone.
    fn is_gone(&self) -> bool {
        lock(&self.state).0
    }

    fn set(&self) {
        let mut st = lock(&self.state);
        st.0 = true;
        for r in st.1.drain(..) {
            r.ring();
        }
    }

    /// Waits, without blocking the reactor, until the session is gone.
    pub async fn wait(&self) {
        loop {
            let bell = {
                let mut st = lock(&self.state);
                if st.0 {
                    return;
                }
                match reactor::doorbell() {
                    Ok((bell, ringer)) => {
                        st.1.push(ringer);
                        Some(bell)
                    }
                    Err(_) => None,
                }
            };
            match bell {
                Some(bell) => {
                    let _ = bell.wait().await;
                }
                // No descriptor for an eventfd left: look again shortly.
                None => reactor::sleep(Duration::from_millis(10)).await,
            }
        }
    }
}

/// A connection's place in its target's [`Registry`]: it leaves the
/// registry, and its waiters are woken, when the registration drops.
pub struct Registration {
    registry: Arc<Registry>,
    key: Key,
    entry: Arc<Entry>,
}

impl Registry {
    /// Registers the session of `initiator` with `isid` on the connection
    /// from `peer` (`socket` a duplicate of its socket). A live session
    /// with the same name and ISID is reinstated: marked, and its socket
    /// shut down. Wait for [`Registration::older`] before answering the
    /// login.
    pub fn register(
        self: &Arc<Self>,
        initiator: &str,
        isid: [u8; 6],
        socket: Option<TcpStream>,
        peer: SocketAddr,
    ) -> Registration {
        let key = (initiator.to_ascii_lowercase(), isid);
        let mut live = lock(&self.live);
        let mut older = Vec::new();
        if let Some(old) = live.get(&key) {
            log::info!(
                "{peer}: {initiator} reinstates its session with ISID 0x{}: closing the connection from {} first",
                hex(&isid),
                old.peer
            );
            old.reinstated.store(true, Ordering::Release);
            if let Some(s) = &old.socket {
                let _ = s.shutdown(Shutdown::Both);
            }
            // Sessions already gone need no waiting: dropping them keeps
            // a chain of reinstatements from growing this list for ever.
            older.extend(old.older.iter().filter(|g| !g.is_gone()).cloned());
            older.push(old.gone.clone());
        }
        let entry = Arc::new(Entry { socket, peer, reinstated: AtomicBool::new(false), gone: Arc::default(), older });
        live.insert(key.clone(), entry.clone());
        Registration { registry: self.clone(), key, entry }
    }

    /// How many sessions are registered.
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.live).len()
    }
}

impl Registration {
    /// The sessions this one replaced: the login is answered once each is
    /// gone.
    pub fn older(&self) -> Vec<Arc<Gone>> {
        self.entry.older.clone()
    }

    /// Whether a newer login reinstated (ended) this session.
    pub fn reinstated(&self) -> bool {
        self.entry.reinstated.load(Ordering::Acquire)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut live = lock(&self.registry.live);
        if live.get(&self.key).is_some_and(|e| Arc::ptr_eq(e, &self.entry)) {
            live.remove(&self.key);
        }
        drop(live);
        self.entry.gone.set();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn same_name_and_isid_replaces_the_session_and_waits_for_it() {
        let r = Arc::new(Registry::default());
        let a = r.register("iqn.2026-11.test:h", [0x80, 0, 0, 0, 0, 1], None, peer(1));
        assert!(a.older().is_empty());
        // Another ISID is another session.
        let b = r.register("iqn.2026-11.test:h", [0x80, 0, 0, 0, 0, 2], None, peer(2));
        assert!(b.older().is_empty() && !a.reinstated());
        assert_eq!(r.len(), 2);
        // Names compare without case.
        let a2 = r.register("IQN.2026-11.test:H", [0x80, 0, 0, 0, 0, 1], None, peer(3));
        assert!(a.reinstated());
        let older = a2.older();
        assert_eq!(older.len(), 1);
        assert!(!lock(&older[0].state).0);
        assert_eq!(r.len(), 2);
        // A third login inherits what the second still waits for.
        let a3 = r.register("iqn.2026-11.test:h", [0x80, 0, 0, 0, 0, 1], None, peer(4));
        assert_eq!(a3.older().len(), 2);
        // The replaced registrations leave without removing the newest.
        drop(a);
        drop(a2);
        assert!(a3.older().iter().all(|g| lock(&g.state).0));
        assert_eq!(r.len(), 2);
        drop(a3);
        drop(b);
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn repeated_reinstatement_waits_only_for_sessions_not_yet_gone() {
        let r = Arc::new(Registry::default());
        let isid = [0x80, 0, 0, 0, 0, 1];
        let mut last = r.register("iqn.2026-11.test:h", isid, None, peer(1));
        for port in 2..200 {
            let next = r.register("iqn.2026-11.test:h", isid, None, peer(port));
            // Only the session just replaced is still there to wait for.
            assert_eq!(next.older().len(), 1, "reinstatement {port}");
            drop(last);
            last = next;
        }
        assert_eq!(r.len(), 1);
    }
}
