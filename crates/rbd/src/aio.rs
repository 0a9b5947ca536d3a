//! The handoff from librbd's completion threads to the reactor that
//! submitted the I/O.
//!
//! Each reactor thread has a fixed table of completion slots, made once.
//! A slot is the `cb_arg` of one librbd completion. librbd's callback
//! (on a librbd thread) stores the result in the slot, queues the slot's
//! index in a bounded queue (it cannot overflow: a slot is queued at most
//! once per submission, and the queue holds as many as there are slots) and
//! writes the reactor's eventfd only if no wake-up is pending, so a burst
//! of completions costs one wake-up. The reactor has a read of that
//! eventfd posted on its ring; when it completes it drains the queue and
//! wakes the waiting futures. Nothing is allocated per I/O on this side
//! (an I/O whose future is dropped while librbd still owns it parks its
//! buffers in a box until the completion comes).
//!
//! This module must never let librbd write into memory that was freed: a
//! slot table outlives every I/O in it, and an abandoned I/O's buffers stay
//! parked until librbd is done with them.

use crate::ffi::{self, Completion};
use std::any::Any;
use std::cell::{Cell, RefCell, UnsafeCell};
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::future::poll_fn;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Poll, Waker};

/// Completion slots per reactor thread: the most rbd I/Os one reactor has
/// in flight; more wait for a free slot.
pub const SLOTS: usize = 1024;

/// One in-flight I/O's place, shared with librbd's callback thread.
pub(crate) struct Slot {
    result: AtomicI64,
    /// Where `rbd_aio_compare_and_write` writes the first mismatching byte.
    mismatch: AtomicU64,
    /// The I/O's one buffer descriptor; librbd may read it until the
    /// completion (readv keeps it to copy the data out).
    iov: UnsafeCell<libc::iovec>,
    index: u32,
    shared: *const Shared,
}

struct Shared {
    slots: Box<[Slot]>,
    /// Indices of completed slots, in completion order. Capacity `SLOTS`,
    /// never exceeded, so pushing never allocates.
    done: Mutex<VecDeque<u32>>,
    /// Set by the first completion after the reactor drained: later ones
    /// in the same batch need not write the eventfd.
    wake_pending: AtomicBool,
    eventfd: OwnedFd,
}

// SAFETY: a slot's `iov` is written only by the reactor that owns the slot
// while the slot is free, and read by librbd between submission and
// completion; `shared` points at the Shared that holds the slot, which is
// never freed while an I/O is in flight (see `Local::drop`).
unsafe impl Send for Slot {}
// SAFETY: as above.
unsafe impl Sync for Slot {}

/// The callback librbd runs, on one of its threads, when an I/O completes.
/// It does nothing slow: two stores, a short uncontended lock, and at most
/// one eventfd write per batch.
unsafe extern "C" fn on_complete(c: Completion, arg: *mut c_void) {
    let lib = ffi::loaded();
    // SAFETY: `arg` is the slot given to rbd_aio_create_completion; its
    // table outlives the I/O.
    let slot = unsafe { &*(arg as *const Slot) };
    // SAFETY: `c` is the completion librbd is completing; it is released
    // exactly once, here.
    let ret = unsafe { (lib.rbd_aio_get_return_value)(c) };
    // SAFETY: as above.
    unsafe { (lib.rbd_aio_release)(c) };
    slot.result.store(ret as i64, Ordering::Relaxed);
    // SAFETY: the Shared that holds the slot (above).
    let shared = unsafe { &*slot.shared };
    shared.done.lock().unwrap_or_else(PoisonError::into_inner).push_back(slot.index);
    if !shared.wake_pending.swap(true, Ordering::AcqRel) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our eventfd. It
        // cannot block: the counter is read before it nears its limit.
        unsafe { libc::write(shared.eventfd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }
}

/// The reactor thread's side of its slot table.
struct Local {
    shared: Arc<Shared>,
    state: RefCell<State>,
    /// Whether the task that reads the eventfd still runs: it ends with
    /// its reactor, and a later reactor on the same thread needs its own.
    draining: Cell<bool>,
}

struct State {
    free: Vec<u32>,
    ready: Vec<bool>,
    wakers: Vec<Option<Waker>>,
    /// What an abandoned I/O owned, kept until librbd completes it.
    parked: Vec<Option<Box<dyn Any>>>,
    slot_waiters: Vec<Waker>,
}

impl State {
    fn release(&mut self, idx: u32) {
        self.free.push(idx);
        for w in self.slot_waiters.drain(..) {
            w.wake();
        }
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        let st = self.state.get_mut();
        if st.free.len() < SLOTS {
            // librbd still holds slots of this table: keep it (and what the
            // abandoned I/Os own) for the rest of the process.
            log::warn!("rbd: reactor thread exits with {} I/Os in flight", SLOTS - st.free.len());
            std::mem::forget(self.shared.clone());
            std::mem::forget(std::mem::take(&mut st.parked));
        }
    }
}

thread_local! {
    static LOCAL: RefCell<Option<Rc<Local>>> = const { RefCell::new(None) };
}

fn local() -> io::Result<Rc<Local>> {
    if let Some(l) = LOCAL.with(|l| l.borrow().clone()).filter(|l| l.draining.get()) {
        return Ok(l);
    }
    // SAFETY: eventfd has no memory preconditions.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor this function owns.
    let eventfd = unsafe { OwnedFd::from_raw_fd(fd) };
    let shared = Arc::new_cyclic(|me| Shared {
        slots: (0..SLOTS as u32)
            .map(|index| Slot {
                result: AtomicI64::new(0),
                mismatch: AtomicU64::new(0),
                iov: UnsafeCell::new(libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }),
                index,
                shared: me.as_ptr(),
            })
            .collect(),
        done: Mutex::new(VecDeque::with_capacity(SLOTS)),
        wake_pending: AtomicBool::new(false),
        eventfd,
    });
    let local = Rc::new(Local {
        shared,
        state: RefCell::new(State {
            free: (0..SLOTS as u32).rev().collect(),
            ready: vec![false; SLOTS],
            wakers: (0..SLOTS).map(|_| None).collect(),
            parked: (0..SLOTS).map(|_| None).collect(),
            slot_waiters: Vec::new(),
        }),
        draining: Cell::new(true),
    });
    reactor::spawn(drain(Draining(local.clone())));
    LOCAL.with(|l| *l.borrow_mut() = Some(local.clone()));
    Ok(local)
}

/// Marks its table as no longer drained when the drain task ends or is
/// dropped with its reactor, polled or not (a reactor whose only rbd call
/// failed before it was submitted may end before the task ever ran); the
/// table itself lives on while librbd holds slots of it ([`Local`]'s
/// drop).
struct Draining(Rc<Local>);

impl Drop for Draining {
    fn drop(&mut self) {
        self.0.draining.set(false);
    }
}

/// The reactor task that turns eventfd wake-ups into future wake-ups.
async fn drain(local: Draining) {
    let local = &local.0;
    let mut counter = vec![0u8; 8];
    let mut batch: VecDeque<u32> = VecDeque::with_capacity(SLOTS);
    loop {
        let (res, buf) = reactor::fs::read_at(local.shared.eventfd.as_fd(), counter, 0).await;
        counter = buf;
        if let Err(e) = res {
            log::error!("rbd: reading the completion eventfd failed: {e}; rbd I/O on this reactor stops");
            return;
        }
        // Cleared before draining: a completion queued after the drain
        // below sees no pending wake-up and writes the eventfd again.
        local.shared.wake_pending.store(false, Ordering::SeqCst);
        std::mem::swap(&mut *local.shared.done.lock().unwrap_or_else(PoisonError::into_inner), &mut batch);
        let mut st = local.state.borrow_mut();
        for idx in batch.drain(..) {
            let i = idx as usize;
            if let Some(keep) = st.parked.get_mut(i).and_then(Option::take) {
                drop(keep);
                st.release(idx);
            } else if let Some(r) = st.ready.get_mut(i) {
                *r = true;
                if let Some(w) = st.wakers.get_mut(i).and_then(Option::take) {
                    w.wake();
                }
            }
        }
    }
}

/// What a finished I/O returned: librbd's return value (negative errno on
/// failure) and, for compare-and-write, the mismatch offset.
pub(crate) struct Done {
    pub ret: i64,
    pub mismatch: u64,
}

/// Runs one librbd asynchronous call: takes a free slot (waiting for one
/// if all are busy), creates the completion, lets `start` submit the I/O
/// with it, and waits for the callback. `keep` is what librbd reads or
/// writes; it is handed back with the result, or parked if this future is
/// dropped first.
///
/// # Safety
///
/// `start` must submit at most one I/O with the given completion, touching
/// only memory owned by `keep` (or the slot's `iov` and `mismatch`), and
/// return librbd's return code.
pub(crate) async unsafe fn run<T: 'static>(
    mut keep: T,
    start: impl FnOnce(&mut T, *mut libc::iovec, *mut u64, Completion) -> c_int,
) -> (Done, T) {
    let failed = |e: i64, keep| (Done { ret: e, mismatch: 0 }, keep);
    let lib = match ffi::lib() {
        Ok(lib) => lib,
        Err(_) => return failed(-i64::from(libc::ENOSYS), keep),
    };
    let local = match local() {
        Ok(l) => l,
        Err(e) => return failed(-i64::from(e.raw_os_error().unwrap_or(libc::EIO)), keep),
    };
    let idx = poll_fn(|cx| {
        let mut st = local.state.borrow_mut();
        match st.free.pop() {
            Some(i) => Poll::Ready(i),
            None => {
                st.slot_waiters.push(cx.waker().clone());
                Poll::Pending
            }
        }
    })
    .await;
    let Some(slot) = local.shared.slots.get(idx as usize) else { unreachable!("slot index out of its table") };
    let mut c: Completion = std::ptr::null_mut();
    // SAFETY: the slot lives as long as the table, which outlives the I/O;
    // `c` receives the new completion.
    let rc = unsafe { (lib.rbd_aio_create_completion)((slot as *const Slot).cast_mut().cast(), on_complete, &mut c) };
    let rc = if rc < 0 { rc } else { start(&mut keep, slot.iov.get(), slot.mismatch.as_ptr(), c) };
    if rc < 0 {
        if !c.is_null() {
            // SAFETY: librbd refused the I/O, so the callback never runs and
            // the completion is released once, here.
            unsafe { (lib.rbd_aio_release)(c) };
        }
        local.state.borrow_mut().release(idx);
        return failed(i64::from(rc), keep);
    }
    let mut flight = InFlight { local: local.clone(), idx, keep: Some(keep) };
    let done = poll_fn(|cx| {
        let mut st = flight.local.state.borrow_mut();
        let i = flight.idx as usize;
        if st.ready.get(i).copied().unwrap_or(false) {
            if let Some(r) = st.ready.get_mut(i) {
                *r = false;
            }
            st.release(flight.idx);
            Poll::Ready(Done {
                ret: slot.result.load(Ordering::Relaxed),
                mismatch: slot.mismatch.load(Ordering::Relaxed),
            })
        } else {
            if let Some(w) = st.wakers.get_mut(i) {
                *w = Some(cx.waker().clone());
            }
            Poll::Pending
        }
    })
    .await;
    let keep = flight.keep.take();
    let Some(keep) = keep else { unreachable!("an in-flight I/O lost what it owns") };
    (done, keep)
}

/// An I/O librbd owns; dropped before its completion, it parks `keep`.
struct InFlight<T: 'static> {
    local: Rc<Local>,
    idx: u32,
    keep: Option<T>,
}

impl<T: 'static> Drop for InFlight<T> {
    fn drop(&mut self) {
        let Some(keep) = self.keep.take() else { return };
        let mut st = self.local.state.borrow_mut();
        let i = self.idx as usize;
        if let Some(w) = st.wakers.get_mut(i) {
            *w = None;
        }
        if st.ready.get(i).copied().unwrap_or(false) {
            // Completed but not yet polled: the slot is free to reuse.
            if let Some(r) = st.ready.get_mut(i) {
                *r = false;
            }
            st.release(self.idx);
        } else if let Some(p) = st.parked.get_mut(i) {
            *p = Some(Box::new(keep));
        }
    }
}
