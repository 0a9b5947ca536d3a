//! Counting work in flight on every thread (every reactor) so that a rare
//! closer can stop new work and wait for the old to finish, without costing the work a
//! lock, an atomic read-modify-write or a fence (the data-path rules of
//! docs/architecture.md).
//!
//! How: [`Drain`] holds one in-flight count per thread, each on its own
//! cache line and written only by its thread (a plain load and store), and
//! a state word the workers only load. [`Drain::enter`] counts the caller
//! in its thread's slot, then checks the state again. [`Drain::close`]
//! sets the state, then issues `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`,
//! which puts a full barrier on every running thread of the process; after
//! it, either a worker's second check sees the drain closed (and the
//! worker backs out) or the closer sees the worker's count in
//! [`Drain::in_flight`]. That is Dekker's handshake with the worker's half
//! of the barrier paid by the rare closer. Where membarrier is unavailable
//! the workers pay a `SeqCst` fence instead.
//!
//! A count belongs to the thread that took it: a [`Ticket`] is not `Send`,
//! and goes back through [`Drain::exit`] on the thread that entered.
//! Users: the write gate of a block device's LBA range lock (a
//! compare-and-write quiesces the writes of every reactor) and an iSCSI
//! logical unit (its removal and the task management functions that
//! fence it wait for the commands running on it). No I/O and no runtime.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{compiler_fence, fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// [`Drain::state`]: closed; new work is refused.
const CLOSED: u32 = 1;
/// [`Drain::state`]: no membarrier here; workers fence.
const FENCE: u32 = 2;

/// Threads with their own slot per drain; later threads share one counter
/// updated with atomic read-modify-writes.
const SLOTS: usize = 64;

static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's slot index, assigned at its first entry.
    static THREAD: Cell<usize> = const { Cell::new(usize::MAX) };
}

#[inline]
fn thread_index() -> usize {
    THREAD.with(|t| match t.get() {
        usize::MAX => {
            let i = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
            t.set(i);
            i
        }
        i => i,
    })
}

/// `MEMBARRIER_CMD_PRIVATE_EXPEDITED` and its registration (linux/membarrier.h).
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

fn membarrier(cmd: libc::c_long) -> bool {
    // SAFETY: membarrier takes no pointers; flags and cpu_id are 0.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_long, 0 as libc::c_long) == 0 }
}

/// Whether this process may use `MEMBARRIER_CMD_PRIVATE_EXPEDITED`
/// (registered once, at the first drain).
fn membarrier_registered() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        let ok = membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED);
        if !ok {
            log::info!(
                "membarrier(PRIVATE_EXPEDITED) unavailable ({}): work counted for a drain pays a fence",
                std::io::Error::last_os_error()
            );
        }
        ok
    })
}

/// One thread's in-flight count, alone on its cache line.
#[repr(align(64))]
#[derive(Default)]
struct Slot(AtomicU64);

/// Per-thread in-flight counts and a closed flag; see the module comment.
pub struct Drain {
    /// [`CLOSED`] and [`FENCE`]. Workers only load it.
    state: AtomicU32,
    /// In-flight work per thread; slot `i` is written only by thread `i`.
    slots: Box<[Slot]>,
    /// In-flight work of threads beyond [`SLOTS`].
    shared: AtomicU64,
}

impl std::fmt::Debug for Drain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drain").field("closed", &self.is_closed()).field("in_flight", &self.in_flight()).finish()
    }
}

/// Why [`Drain::enter`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The drain was closed already.
    Closed,
    /// The drain closed while the caller was counting itself in; the count
    /// went up and down again, so a closer waiting for it may need a wake-up.
    Raced,
}

/// One unit of work counted in a [`Drain`]: give it back with
/// [`Drain::exit`], on the thread that entered (hence not `Send`).
#[must_use = "a ticket not given back keeps its drain from draining"]
#[derive(Debug)]
pub struct Ticket {
    /// The slot counted in; `None` for the shared counter.
    slot: Option<usize>,
    _thread_bound: PhantomData<*const ()>,
}

impl Default for Drain {
    fn default() -> Drain {
        Drain::new()
    }
}

impl Drain {
    /// An open drain with nothing in flight.
    pub fn new() -> Drain {
        Drain {
            state: AtomicU32::new(if membarrier_registered() { 0 } else { FENCE }),
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
            shared: AtomicU64::new(0),
        }
    }

    /// Orders this thread's slot update before its next load of `state`
    /// (the worker's half of the handshake).
    #[inline]
    fn worker_barrier(state: u32) {
        if state & FENCE != 0 {
            fence(Ordering::SeqCst);
        } else {
            compiler_fence(Ordering::SeqCst);
        }
    }

    /// Counts one unit of work on this thread, unless the drain is closed.
    #[inline]
    pub fn enter(&self) -> Result<Ticket, Refused> {
        let state = self.state.load(Ordering::Relaxed);
        if state & CLOSED != 0 {
            return Err(Refused::Closed);
        }
        let thread = thread_index();
        let ticket = match self.slots.get(thread) {
            Some(slot) => {
                // Only this thread stores to its slot: no read-modify-write.
                slot.0.store(slot.0.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
                Ticket { slot: Some(thread), _thread_bound: PhantomData }
            }
            None => {
                self.shared.fetch_add(1, Ordering::SeqCst);
                Ticket { slot: None, _thread_bound: PhantomData }
            }
        };
        Self::worker_barrier(state);
        if self.state.load(Ordering::Relaxed) & CLOSED != 0 {
            // A closer came in between: back out.
            self.exit(&ticket);
            return Err(Refused::Raced);
        }
        Ok(ticket)
    }

    /// Ends the work `ticket` counted, for a closer that polls
    /// [`Drain::in_flight`]: one store, no look at the state.
    #[inline]
    pub fn leave(&self, ticket: &Ticket) {
        match ticket.slot.and_then(|i| self.slots.get(i)) {
            Some(slot) => slot.0.store(slot.0.load(Ordering::Relaxed).wrapping_sub(1), Ordering::Release),
            None => {
                self.shared.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Ends the work `ticket` counted; whether the drain is closed now (a
    /// closer may be waiting for this count to drain, to be woken).
    pub fn exit(&self, ticket: &Ticket) -> bool {
        match ticket.slot {
            Some(i) => {
                if let Some(slot) = self.slots.get(i) {
                    slot.0.store(slot.0.load(Ordering::Relaxed).wrapping_sub(1), Ordering::Release);
                }
                let state = self.state.load(Ordering::Relaxed);
                Self::worker_barrier(state);
                self.state.load(Ordering::Relaxed) & CLOSED != 0
            }
            None => {
                self.shared.fetch_sub(1, Ordering::SeqCst);
                self.state.load(Ordering::SeqCst) & CLOSED != 0
            }
        }
    }

    /// Refuses new work from now on. Once this returns, [`Drain::in_flight`]
    /// counts every unit of work that entered and has not exited. Callers
    /// serialize `close` and [`Drain::open`] among themselves.
    pub fn close(&self) {
        let state = self.state.fetch_or(CLOSED, Ordering::SeqCst);
        if state & FENCE == 0 && !membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) {
            log::error!("membarrier(PRIVATE_EXPEDITED) failed: {}", std::io::Error::last_os_error());
        }
        fence(Ordering::SeqCst);
    }

    /// Admits new work again.
    pub fn open(&self) {
        self.state.fetch_and(!CLOSED, Ordering::SeqCst);
    }

    /// Whether the drain is closed.
    pub fn is_closed(&self) -> bool {
        self.state.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Units of work in flight on every thread (exact once closed; a
    /// snapshot while open).
    pub fn in_flight(&self) -> u64 {
        self.slots.iter().fold(self.shared.load(Ordering::SeqCst), |n, s| n.wrapping_add(s.0.load(Ordering::Acquire)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{mpsc, Arc};

    #[test]
    fn counts_until_closed_and_refuses_after() {
        let d = Drain::new();
        let a = d.enter().expect("open");
        let b = d.enter().expect("open");
        assert_eq!(d.in_flight(), 2);
        assert!(!d.exit(&a), "open: nobody waits");
        d.close();
        assert!(d.is_closed());
        assert_eq!(d.enter().map(|_| ()), Err(Refused::Closed));
        assert_eq!(d.in_flight(), 1, "a refused entry leaves no count");
        assert!(d.exit(&b), "closed: the closer may wait");
        assert_eq!(d.in_flight(), 0);
        d.open();
        let c = d.enter().expect("open again");
        assert!(!d.exit(&c));
        // `leave` gives a count back without looking at the state.
        let e = d.enter().expect("open");
        assert_eq!(d.in_flight(), 1);
        d.leave(&e);
        assert_eq!(d.in_flight(), 0);
    }

    #[test]
    fn closer_sees_work_entered_on_other_threads() {
        let d = Arc::new(Drain::new());
        let (entered_tx, entered_rx) = mpsc::channel();
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let (d, entered_tx) = (d.clone(), entered_tx.clone());
                let (finish_tx, finish_rx) = mpsc::channel::<()>();
                let worker = std::thread::spawn(move || {
                    let t = d.enter().expect("open");
                    entered_tx.send(()).expect("send");
                    finish_rx.recv().expect("told to finish");
                    d.exit(&t)
                });
                (worker, finish_tx)
            })
            .collect();
        for _ in 0..4 {
            entered_rx.recv().expect("entered");
        }
        d.close();
        assert_eq!(d.in_flight(), 4, "every worker's count is seen after close");
        for (worker, finish_tx) in workers {
            finish_tx.send(()).expect("finish");
            assert!(worker.join().expect("worker"), "each exit sees the drain closed");
        }
        assert_eq!(d.in_flight(), 0);
    }

    /// Workers enter and exit in a loop while a closer closes and reopens:
    /// whenever the closer reads zero in flight after `close`, no worker may
    /// be inside.
    #[test]
    fn no_worker_is_inside_when_the_closer_sees_zero() {
        let d = Arc::new(Drain::new());
        let inside = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (d, inside, stop) = (d.clone(), inside.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok(t) = d.enter() {
                            inside.fetch_add(1, Ordering::SeqCst);
                            std::hint::spin_loop();
                            inside.fetch_sub(1, Ordering::SeqCst);
                            d.exit(&t);
                        }
                    }
                })
            })
            .collect();
        for _ in 0..2000 {
            d.close();
            while d.in_flight() != 0 {
                std::hint::spin_loop();
            }
            assert_eq!(inside.load(Ordering::SeqCst), 0, "a worker ran inside a drained drain");
            d.open();
        }
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().expect("worker");
        }
    }
}
