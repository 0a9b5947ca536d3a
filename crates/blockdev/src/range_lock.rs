//! The per-device LBA range lock that makes compare-and-write atomic
//! against every other write to the same blocks of the device: from any
//! reactor, any protocol, any target or LUN that shares the device in this
//! process. SPDK's bdev LBA range lock is the model: a locker quiesces the
//! writes of every thread before it reads.
//!
//! It must never cost a plain write a lock, an atomic read-modify-write, a
//! fence or an allocation while no range is locked (the data-path rules of
//! docs/architecture.md), and never block a reactor: whoever waits, waits
//! asynchronously and is woken by the release it waits for.
//!
//! How: the gate's [`drain::Drain`] is open while no lock is pending
//! or held, and a write takes the fast path: it enters the drain (a plain
//! load and store of its thread's own in-flight count, and a load of the
//! drain's state). The first pending lock closes the drain, which pays
//! the membarrier that makes every fast-path write either see the close
//! or be seen in the drain's count, and waits for that count to drain.
//!
//! While a lock is pending or held, writes take the slow path under the
//! table's mutex: a write overlapping no lock starts at once (and is
//! recorded, so that a later locker waits for it); one overlapping a lock
//! waits for its release. A lock waits until no fast-path write is in
//! flight, no recorded write overlaps it and no earlier lock or waiting
//! write overlaps it; a waiting write, for the earlier locks only (first
//! come, first served: a stream of locks over its blocks does not starve
//! it). Reads take no lock.

use std::marker::PhantomData;
use std::sync::{Mutex, MutexGuard};

/// A range of blocks, `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Range {
    start: u64,
    end: u64,
}

impl Range {
    pub(crate) fn new(lba: u64, blocks: u64) -> Range {
        Range { start: lba, end: lba.saturating_add(blocks) }
    }

    /// Whether the two share a block (an empty range shares none).
    fn overlaps(self, other: Range) -> bool {
        self.start < self.end && other.start < other.end && self.start < other.end && other.start < self.end
    }
}

#[derive(Debug)]
struct Lock {
    id: u64,
    range: Range,
    granted: bool,
}

/// The slow path's bookkeeping: locks in arrival order, writes that
/// started on the slow path, writes that wait for a lock (their id says
/// which locks came first), and who waits.
#[derive(Debug, Default)]
struct Table {
    locks: Vec<Lock>,
    writes: Vec<(u64, Range)>,
    waiting: Vec<(u64, Range)>,
    waiters: Vec<reactor::Ringer>,
    next_id: u64,
}

impl Table {
    fn id(&mut self) -> u64 {
        self.next_id = self.next_id.wrapping_add(1);
        self.next_id
    }

    /// A write may start unless it overlaps a lock, pending or held; one
    /// waiting as `waiting` only one that came before it.
    fn write_may_start(&self, range: Range, waiting: Option<u64>) -> bool {
        !self.locks.iter().any(|l| waiting.is_none_or(|w| l.id < w) && l.range.overlaps(range))
    }

    /// Takes waiting write `id` out of [`waiting`](Self::waiting); true
    /// when it was there.
    fn stop_waiting(&mut self, id: u64) -> bool {
        let before = self.waiting.len();
        self.waiting.retain(|w| w.0 != id);
        self.waiting.len() != before
    }

    fn add_write(&mut self, range: Range) -> u64 {
        let id = self.id();
        self.writes.push((id, range));
        id
    }

    fn end_write(&mut self, id: u64) {
        self.writes.retain(|w| w.0 != id);
    }

    fn add_lock(&mut self, range: Range) -> u64 {
        let id = self.id();
        self.locks.push(Lock { id, range, granted: false });
        id
    }

    /// Grants lock `id` if no recorded write, no earlier lock and no write
    /// waiting since before it overlaps it (the caller has checked the
    /// fast-path writes).
    fn try_grant(&mut self, id: u64) -> bool {
        let Some(pos) = self.locks.iter().position(|l| l.id == id) else { return false };
        let Some(range) = self.locks.get(pos).map(|l| l.range) else { return false };
        if self.locks.iter().take(pos).any(|l| l.range.overlaps(range))
            || self.writes.iter().any(|w| w.1.overlaps(range))
            || self.waiting.iter().any(|w| w.0 < id && w.1.overlaps(range))
        {
            return false;
        }
        if let Some(lock) = self.locks.get_mut(pos) {
            lock.granted = true;
        }
        true
    }

    fn remove_lock(&mut self, id: u64) {
        self.locks.retain(|l| l.id != id);
    }

    fn wake_all(&mut self) {
        for w in self.waiters.drain(..) {
            w.ring();
        }
    }
}

/// How a write got in, for its release.
#[derive(Debug)]
enum Entry {
    /// Counted in the drain (the fast path).
    Fast(drain::Ticket),
    /// Recorded in the table under this id.
    Table(u64),
}

/// The write side of a device's range lock; see the module comment.
#[derive(Debug)]
pub(crate) struct WriteGate {
    /// Closed while any lock is pending or held.
    drain: drain::Drain,
    table: Mutex<Table>,
}

/// A write in progress: released when dropped, on the thread that made it
/// (hence not `Send`: a slot has one writer).
#[must_use]
pub(crate) struct WriteToken<'a> {
    gate: &'a WriteGate,
    entry: Entry,
    _thread_bound: PhantomData<*const ()>,
}

impl Drop for WriteToken<'_> {
    fn drop(&mut self) {
        self.gate.end_write(&self.entry);
    }
}

/// A write's place among the waiting ones while it waits: dropped with
/// its wait (cancelled, or the doorbell failed), it leaves the table and
/// wakes the locks that waited for it.
struct Waiting<'a> {
    gate: &'a WriteGate,
    id: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut t = self.gate.table();
        if t.stop_waiting(self.id) {
            t.wake_all();
        }
    }
}

/// A held lock on a range of a device's blocks: no other write to those
/// blocks runs until it is dropped. Its holder writes the range with
/// [`Device::write_locked`](crate::Device::write_locked).
#[must_use = "the range is unlocked when this is dropped"]
pub struct RangeLock<'a> {
    gate: &'a WriteGate,
    id: u64,
    range: Range,
}

impl std::fmt::Debug for RangeLock<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RangeLock").field("range", &self.range).finish()
    }
}

impl RangeLock<'_> {
    /// Whether `lba`..`lba + blocks` lies inside the locked range.
    pub(crate) fn covers(&self, lba: u64, blocks: u64) -> bool {
        let r = Range::new(lba, blocks);
        self.range.start <= r.start && r.end <= self.range.end
    }

    pub(crate) fn gate(&self) -> &WriteGate {
        self.gate
    }
}

impl Drop for RangeLock<'_> {
    fn drop(&mut self) {
        self.gate.unlock(self.id);
    }
}

impl WriteGate {
    pub(crate) fn new() -> WriteGate {
        WriteGate { drain: drain::Drain::new(), table: Mutex::new(Table::default()) }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The fast path: `None` when a lock is pending or held.
    fn try_fast(&self) -> Option<WriteToken<'_>> {
        match self.drain.enter() {
            Ok(ticket) => Some(WriteToken { gate: self, entry: Entry::Fast(ticket), _thread_bound: PhantomData }),
            Err(drain::Refused::Closed) => None,
            Err(drain::Refused::Raced) => {
                // A locker came in while this write counted itself: it may
                // be waiting for the count this write took back.
                self.table().wake_all();
                None
            }
        }
    }

    fn end_write(&self, entry: &Entry) {
        match entry {
            Entry::Fast(ticket) => {
                if self.drain.exit(ticket) {
                    // A locker may be waiting for this write to drain.
                    self.table().wake_all();
                }
            }
            Entry::Table(id) => {
                let mut t = self.table();
                t.end_write(*id);
                t.wake_all();
            }
        }
    }

    /// Fast-path writes in flight (the locker reads them after closing the
    /// drain).
    fn fast_in_flight(&self) -> bool {
        self.drain.in_flight() != 0
    }

    /// A write to `range` that may start now without waiting: `None` when
    /// it overlaps a locked range.
    pub(crate) fn try_write(&self, range: Range) -> Option<WriteToken<'_>> {
        if let Some(token) = self.try_fast() {
            return Some(token);
        }
        let mut t = self.table();
        if !t.write_may_start(range, None) {
            return None;
        }
        Some(WriteToken { gate: self, entry: Entry::Table(t.add_write(range)), _thread_bound: PhantomData })
    }

    /// Admits a write to `range`, waiting (asynchronously) while it
    /// overlaps a locked range.
    pub(crate) async fn write(&self, range: Range) -> std::io::Result<WriteToken<'_>> {
        if let Some(token) = self.try_fast() {
            return Ok(token);
        }
        let mut waiting: Option<Waiting<'_>> = None;
        loop {
            let bell = {
                let mut t = self.table();
                if t.write_may_start(range, waiting.as_ref().map(|w| w.id)) {
                    // Recorded as running instead: its `Waiting`, dropped
                    // after this guard, then has nothing left to take out.
                    if let Some(w) = &waiting {
                        t.stop_waiting(w.id);
                    }
                    let entry = Entry::Table(t.add_write(range));
                    return Ok(WriteToken { gate: self, entry, _thread_bound: PhantomData });
                }
                if waiting.is_none() {
                    let id = t.id();
                    t.waiting.push((id, range));
                    waiting = Some(Waiting { gate: self, id });
                }
                let (bell, ringer) = reactor::doorbell()?;
                t.waiters.push(ringer);
                bell
            };
            bell.wait().await?;
        }
    }

    /// Locks `range` against every write, waiting (asynchronously) for the
    /// writes already under way on it and for earlier overlapping locks.
    pub(crate) async fn lock(&self, range: Range) -> std::io::Result<RangeLock<'_>> {
        let lock = {
            let mut t = self.table();
            let id = t.add_lock(range);
            if t.locks.len() == 1 {
                // Under the table's mutex, so no second locker reads the
                // counts before every fast-path writer has seen the close
                // or been counted.
                self.drain.close();
            }
            // Dropped before it is granted (a cancelled wait), it still
            // leaves the table.
            RangeLock { gate: self, id, range }
        };
        loop {
            let bell = {
                let mut t = self.table();
                if !self.fast_in_flight() && t.try_grant(lock.id) {
                    return Ok(lock);
                }
                let (bell, ringer) = reactor::doorbell()?;
                t.waiters.push(ringer);
                bell
            };
            bell.wait().await?;
        }
    }

    fn unlock(&self, id: u64) {
        let mut t = self.table();
        t.remove_lock(id);
        if t.locks.is_empty() {
            self.drain.open();
        }
        t.wake_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_overlap_only_when_they_share_a_block() {
        let r = Range::new(8, 4);
        assert!(r.overlaps(Range::new(11, 1)));
        assert!(r.overlaps(Range::new(0, 9)));
        assert!(r.overlaps(Range::new(0, 100)));
        assert!(!r.overlaps(Range::new(12, 4)), "adjacent after");
        assert!(!r.overlaps(Range::new(4, 4)), "adjacent before");
        assert!(!r.overlaps(Range::new(9, 0)), "an empty range overlaps nothing");
        assert!(Range::new(u64::MAX - 1, 8).overlaps(Range::new(u64::MAX - 1, 1)), "saturates at the end");
    }

    #[test]
    fn table_orders_locks_and_writes_by_overlap() {
        let mut t = Table::default();
        let w = t.add_write(Range::new(0, 8));
        let a = t.add_lock(Range::new(4, 4));
        let b = t.add_lock(Range::new(100, 1));
        assert!(!t.try_grant(a), "a lock waits for an overlapping write under way");
        assert!(t.try_grant(b), "a lock elsewhere does not");
        assert!(!t.write_may_start(Range::new(7, 2), None), "a write waits for a pending lock it overlaps");
        assert!(t.write_may_start(Range::new(8, 92), None), "a write between the locks starts");
        t.end_write(w);
        assert!(t.try_grant(a));
        let c = t.add_lock(Range::new(0, 5));
        assert!(!t.try_grant(c), "an overlapping later lock waits for the earlier one");
        t.remove_lock(a);
        assert!(t.try_grant(c));
        t.remove_lock(b);
        t.remove_lock(c);
        assert!(t.write_may_start(Range::new(0, 1000), None));
        assert!(t.locks.is_empty() && t.writes.is_empty());
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        reactor::Runtime::new(reactor::Config::default()).expect("io_uring runtime").block_on(f)
    }

    async fn bounded<F: std::future::Future>(f: F) -> F::Output {
        reactor::timeout(std::time::Duration::from_secs(10), f).await.expect("bounded")
    }

    #[test]
    fn plain_writes_take_the_fast_path_until_a_lock_is_pending() {
        let gate = WriteGate::new();
        let fast = gate.try_write(Range::new(0, 1)).expect("no lock: starts");
        assert!(matches!(fast.entry, Entry::Fast(_)));
        drop(fast);
        block_on(bounded(async {
            let lock = gate.lock(Range::new(0, 4)).await.expect("lock");
            assert!(gate.try_write(Range::new(2, 1)).is_none(), "overlapping write must wait");
            let other = gate.try_write(Range::new(4, 4)).expect("a write elsewhere starts");
            assert!(matches!(other.entry, Entry::Table(_)), "while locked, writes are recorded");
            drop(other);
            drop(lock);
            assert!(matches!(gate.try_write(Range::new(2, 1)).expect("unlocked").entry, Entry::Fast(_)));
        }));
    }

    #[test]
    fn waiting_write_is_woken_by_the_unlock_on_another_thread() {
        let gate = std::sync::Arc::new(WriteGate::new());
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let holder = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                block_on(bounded(async {
                    let lock = gate.lock(Range::new(10, 2)).await.expect("lock");
                    locked_tx.send(()).expect("send");
                    release_rx.recv().expect("told to release");
                    drop(lock);
                }));
            })
        };
        locked_rx.recv().expect("locked");
        block_on(bounded(async {
            let admitted = std::rc::Rc::new(std::cell::Cell::new(false));
            let waiter = reactor::spawn({
                let (gate, admitted) = (gate.clone(), admitted.clone());
                async move {
                    let _token = gate.write(Range::new(11, 1)).await.expect("admitted");
                    admitted.set(true);
                }
            });
            for _ in 0..10 {
                reactor::yield_now().await;
            }
            assert!(!admitted.get(), "a write overlapping a held lock started");
            release_tx.send(()).expect("release");
            waiter.await;
            assert!(admitted.get());
        }));
        holder.join().expect("holder thread");
        assert!(matches!(gate.try_write(Range::new(11, 1)).expect("unlocked").entry, Entry::Fast(_)));
    }

    /// Compare-and-writes on one block, each locking it as the one before
    /// unlocks (ESX's ATS heartbeats, many hosts on one sector): a plain
    /// write to the block that waits behind the first must start before
    /// the locks that came after it, not wait for the stream to end.
    #[test]
    fn a_waiting_write_goes_before_the_locks_that_came_after_it() {
        block_on(bounded(async {
            let gate = std::rc::Rc::new(WriteGate::new());
            let mut lock = gate.lock(Range::new(7, 1)).await.expect("lock");
            let admitted = std::rc::Rc::new(std::cell::Cell::new(false));
            let writer = reactor::spawn({
                let (gate, admitted) = (gate.clone(), admitted.clone());
                async move {
                    let _token = gate.write(Range::new(7, 1)).await.expect("admitted");
                    admitted.set(true);
                }
            });
            for _ in 0..10 {
                reactor::yield_now().await;
            }
            assert!(!admitted.get(), "a write overlapping a held lock started");
            let mut later_locks = 0;
            while !admitted.get() && later_locks < 100 {
                drop(lock);
                lock = gate.lock(Range::new(7, 1)).await.expect("lock");
                later_locks += 1;
                for _ in 0..10 {
                    reactor::yield_now().await;
                }
            }
            assert!(admitted.get(), "the write still waits after {later_locks} later locks were granted");
            drop(lock);
            writer.await;
        }));
    }

    #[test]
    fn locker_waits_for_fast_path_writes_in_flight_on_other_threads() {
        let gate = std::sync::Arc::new(WriteGate::new());
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (finish_tx, finish_rx) = std::sync::mpsc::channel::<()>();
        let writer = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                // A write to unrelated blocks, begun before any lock.
                let token = gate.try_write(Range::new(500, 1)).expect("fast path");
                assert!(matches!(token.entry, Entry::Fast(_)));
                started_tx.send(()).expect("send");
                finish_rx.recv().expect("told to finish");
                drop(token);
            })
        };
        started_rx.recv().expect("write under way");
        block_on(bounded(async {
            let locking = reactor::spawn({
                let gate = gate.clone();
                async move {
                    let lock = gate.lock(Range::new(0, 1)).await.expect("lock");
                    drop(lock);
                }
            });
            for _ in 0..10 {
                reactor::yield_now().await;
            }
            assert!(!gate.table().locks.first().is_some_and(|l| l.granted), "granted while a write was in flight");
            finish_tx.send(()).expect("finish");
            locking.await;
        }));
        writer.join().expect("writer thread");
        assert!(gate.table().locks.is_empty());
    }
}
