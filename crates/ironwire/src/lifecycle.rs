//! The daemon's life after start: telling a service manager it is ready,
//! and the orderly stop on SIGINT or SIGTERM.
//!
//! A stop runs in this order. The signal thread hands the first signal to
//! the main thread, which
//! 1. tells the service manager (`STOPPING=1`) and marks the process as
//!    draining, with a deadline `[shutdown] drain_s` away;
//! 2. shuts every listening socket down, from its own thread: each
//!    reactor's pending accept fails, its accept loop sees the drain and
//!    ends, and the socket closes — so a restart right after can bind the
//!    port (a listener left to the ring's teardown after exit outlives the
//!    process for a while);
//! 3. waits for the connections to end. Each connection sees the drain on
//!    its next tick: an NVMe connection stops reading commands (the read
//!    side of its socket is shut down), an iSCSI session is asked to log
//!    out (an Asynchronous Message) and stops reading at the deadline; both
//!    finish the commands they already took, send their answers and close;
//! 4. flushes every device with a volatile write cache, closes the rbd
//!    images (so that their watch and exclusive lock go at once), removes
//!    the control socket and exits 0 (1 if a flush failed).
//!
//! A second signal at any point exits at once. Commands a host sent but
//! that were never read were never acknowledged: the host retries them
//! when it reconnects.

use anyhow::{bail, Result};
use std::os::unix::io::RawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Set once the stop began.
static DRAINING: AtomicBool = AtomicBool::new(false);
/// When the drain ends ([`reactor::now_ms`] clock).
static DRAIN_UNTIL_MS: AtomicU64 = AtomicU64::new(u64::MAX);
/// The listening sockets of every reactor, to shut down from the main
/// thread when the stop begins.
static LISTENERS: Mutex<Vec<RawFd>> = Mutex::new(Vec::new());

/// Whether the daemon is stopping: connections drain, listeners close.
pub fn draining() -> bool {
    DRAINING.load(Ordering::Relaxed)
}

/// How much of the drain is left, in whole seconds (0 when it is over or
/// the daemon is not stopping).
pub fn drain_left_s(now_ms: u64) -> u16 {
    let until = DRAIN_UNTIL_MS.load(Ordering::Relaxed);
    if until == u64::MAX {
        return 0;
    }
    u16::try_from(until.saturating_sub(now_ms) / 1000).unwrap_or(u16::MAX)
}

/// Whether the drain deadline passed: connections still open stop reading.
pub fn drain_over(now_ms: u64) -> bool {
    draining() && now_ms >= DRAIN_UNTIL_MS.load(Ordering::Relaxed)
}

/// A listening socket's place in the registry; it leaves when this drops.
pub struct Listening(RawFd);

impl Drop for Listening {
    fn drop(&mut self) {
        lock_listeners().retain(|&fd| fd != self.0);
    }
}

fn lock_listeners() -> std::sync::MutexGuard<'static, Vec<RawFd>> {
    LISTENERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Registers a reactor's listening socket `fd` so that a stop can shut it
/// down. Drop the guard before the socket closes.
pub fn listening(fd: RawFd) -> Listening {
    register(&mut lock_listeners(), fd, draining());
    Listening(fd)
}

/// Adds `fd` to `listeners`; when the stop already walked them (a port
/// change applied on a reactor as the stop began), shuts it down at once,
/// so that its accept ends and the stop does not wait out its drain and
/// grace for it. [`drain`] sets `DRAINING` before it takes the lock to
/// walk the list, so under the lock one side sees the other.
fn register(listeners: &mut Vec<RawFd>, fd: RawFd, draining: bool) {
    listeners.push(fd);
    if draining {
        // SAFETY: the caller's listener is open (registered before it
        // closes); shutdown has no other effect on memory.
        unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
    }
}

/// Sends `state` (e.g. `READY=1`) to the service manager when
/// `NOTIFY_SOCKET` names one (systemd's `Type=notify`); does nothing
/// otherwise. A name starting with `@` is an abstract socket.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    if let Err(e) = send_notify(&path, state) {
        log::warn!("cannot tell the service manager {state:?} on {}: {e}", path.to_string_lossy());
    }
}

fn send_notify(path: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let sock = UnixDatagram::unbound()?;
    let bytes = path.as_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name)?,
        None => SocketAddr::from_pathname(PathBuf::from(path))?,
    };
    sock.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}

/// SIGINT, SIGTERM and SIGHUP, blocked in every thread so that one thread
/// waits for them: [`Signals::block`] runs before any thread starts.
pub struct Signals(libc::sigset_t);

/// The signal that asked for the stop.
#[derive(Clone, Copy, Debug)]
pub struct Stop(pub &'static str);

impl Signals {
    /// Blocks SIGINT, SIGTERM and SIGHUP in this thread and the threads it
    /// starts.
    pub fn block() -> Result<Signals> {
        // SAFETY: all-zero bytes are a valid sigset_t, and sigemptyset
        // initializes it before use.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: set is a valid sigset_t for these calls; the old mask is
        // not asked for (null).
        let r = unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGHUP);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
        };
        if r != 0 {
            bail!("blocking SIGINT/SIGTERM/SIGHUP: {}", std::io::Error::from_raw_os_error(r));
        }
        Ok(Signals(set))
    }

    /// Starts the thread that waits for the signals: SIGHUP runs `reload`
    /// on a thread of its own, so that a reload waiting its turn or for
    /// what it removed (up to 30 s) never holds back a stop (SIGHUPs that
    /// arrive meanwhile make one more reload); the first SIGINT or SIGTERM
    /// is sent on `stop`; a second removes the control socket `socket` and
    /// exits at once, with status 128 + the signal's number.
    pub fn spawn(
        self,
        stop: std::sync::mpsc::Sender<Stop>,
        socket: PathBuf,
        reload: impl Fn() + Send + 'static,
    ) -> Result<()> {
        let (reload_tx, reload_rx) = std::sync::mpsc::sync_channel::<()>(1);
        std::thread::Builder::new().name("reload".into()).spawn(move || {
            while reload_rx.recv().is_ok() {
                if draining() {
                    log::warn!("SIGHUP while stopping: not reloading");
                } else {
                    reload();
                }
            }
        })?;
        std::thread::Builder::new().name("signals".into()).spawn(move || {
            let mut first = true;
            loop {
                let mut sig = 0;
                // SAFETY: self.0 is an initialized sigset_t whose signals
                // are blocked; sig is valid for a write.
                let r = unsafe { libc::sigwait(&self.0, &mut sig) };
                if r != 0 {
                    log::error!("waiting for signals failed ({r}); removing {} and exiting", socket.display());
                    let _ = std::fs::remove_file(&socket);
                    std::process::exit(1);
                }
                if sig == libc::SIGHUP {
                    // Full: a reload is already due, which reads the file
                    // after this signal.
                    let _ = reload_tx.try_send(());
                    continue;
                }
                let name = if sig == libc::SIGINT { "SIGINT" } else { "SIGTERM" };
                if first && stop.send(Stop(name)).is_ok() {
                    first = false;
                    continue;
                }
                let _ = std::fs::remove_file(&socket);
                log::warn!("{name} again: exiting at once, without waiting for the drain");
                std::process::exit(128 + sig);
            }
        })?;
        Ok(())
    }
}

/// Steps 1–3 of the stop (see the module docs): marks the drain, shuts the
/// listeners down and waits until no connection is open (`open()` counts
/// them) or the drain and a grace period for I/O already submitted have
/// passed. Returns the connections still open then.
pub fn drain(stop: Stop, drain: Duration, open: impl Fn() -> usize) -> usize {
    let now = reactor::now_ms();
    let drain_ms = u64::try_from(drain.as_millis()).unwrap_or(u64::MAX);
    DRAIN_UNTIL_MS.store(now.saturating_add(drain_ms), Ordering::Relaxed);
    DRAINING.store(true, Ordering::Relaxed);
    notify("STOPPING=1");
    log::info!(
        "{}: stopping; no new connections, draining {} open ones (at most {} s, [shutdown] drain_s)",
        stop.0,
        open(),
        drain.as_secs()
    );
    for &fd in lock_listeners().iter() {
        // SAFETY: a registered listener is open until its guard drops,
        // which takes this lock first; shutdown on it has no other effect
        // on memory.
        unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
    }
    // Past the deadline, connections stop reading but still finish the
    // commands they took: allow those this long.
    let grace = Duration::from_secs(5);
    let give_up = std::time::Instant::now() + drain + grace;
    loop {
        let left = open() + lock_listeners().len();
        if left == 0 || std::time::Instant::now() >= give_up {
            return open();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// A nonblocking accept on `l` with nobody connecting: EAGAIN while it
    /// listens, EINVAL once shut down.
    fn accept_errno(l: &std::net::TcpListener) -> i32 {
        l.set_nonblocking(true).expect("nonblocking");
        l.accept().expect_err("nobody connects").raw_os_error().unwrap_or(0)
    }

    #[test]
    fn a_listener_registered_once_the_stop_walked_the_list_is_shut_down_at_once() {
        let (before, after) = (
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind"),
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind"),
        );
        let mut listeners = Vec::new();
        register(&mut listeners, before.as_raw_fd(), false);
        register(&mut listeners, after.as_raw_fd(), true);
        assert_eq!(listeners, [before.as_raw_fd(), after.as_raw_fd()]);
        assert_eq!(accept_errno(&before), libc::EAGAIN, "registered before the stop: listening");
        assert_eq!(accept_errno(&after), libc::EINVAL, "registered after the stop's walk: shut down");
    }
}
