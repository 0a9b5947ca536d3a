//! The reactor's loop: one io_uring per thread for sockets, files and
//! block devices together, a single-threaded task executor, and timers.
//!
//! One turn of the loop runs every task that was woken, fires the timers
//! that are due, hands the kernel every queued submission in one
//! `io_uring_enter`, and turns the completions into wake-ups. While
//! completions keep coming the loop spins (up to `poll`), checking the
//! completion queue and the ring's "task work pending" flag without a
//! system call; after `poll` without any, it sleeps in `io_uring_enter`
//! until a completion or the next timer. CPU use follows load.
//!
//! Rings are created with `SINGLE_ISSUER` and `DEFER_TASKRUN` where the
//! kernel has them (6.1+), and fall back to `COOP_TASKRUN` or a plain ring
//! (see [`Features`]).
//!
//! Everything here is owned by the thread that runs it: tasks, wakers and
//! operations never cross threads, so nothing is locked and no atomic is
//! shared with another core.

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::any::{Any, TypeId};
use std::cell::{Cell, RefCell};
use std::collections::{BinaryHeap, VecDeque};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rustc_hash::FxHashMap;
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};
use std::time::{Duration, Instant};

/// `user_data` of entries whose completions nobody waits for (cancels).
const IGNORED: u64 = u64::MAX;
/// `IORING_ENTER_GETEVENTS`.
const ENTER_GETEVENTS: u32 = 1;
/// Tasks run per turn before the loop looks at the ring again, so that a
/// task that keeps waking itself cannot starve I/O.
const TASKS_PER_TURN: usize = 4096;

/// How a reactor's ring is set up.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Submission queue entries (the completion queue gets four times as
    /// many).
    pub entries: u32,
    /// How long the loop keeps polling the ring after the last completion
    /// before it sleeps in the kernel. Zero never spins.
    pub poll: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config { entries: 4096, poll: DEFAULT_POLL }
    }
}

/// The default spin before sleeping; see docs/architecture.md for the
/// measurement that chose it.
pub const DEFAULT_POLL: Duration = Duration::from_micros(50);

/// What the running kernel's io_uring offered this ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// `IORING_SETUP_SINGLE_ISSUER` (6.0).
    pub single_issuer: bool,
    /// `IORING_SETUP_DEFER_TASKRUN` (6.1): completions are posted only when
    /// this thread asks, never by interrupting it.
    pub defer_taskrun: bool,
    /// `IORING_SETUP_COOP_TASKRUN` (5.19), the fallback without deferral.
    pub coop_taskrun: bool,
    /// Multishot receive into a provided-buffer ring (6.0).
    pub recv_multishot: bool,
    /// Zero-copy send (6.0).
    pub send_zc: bool,
    /// Sockets named by their slot in the ring's table of registered files
    /// (6.13): no file reference taken and dropped, an atomic on the
    /// shared `struct file`, per operation. Earlier kernels release a
    /// dropped slot's file only after every request issued before the drop
    /// is done (a long-lived receive on another connection would keep a
    /// closed socket open), so they use plain descriptors.
    pub fixed_files: bool,
}

/// Slots in each ring's table of registered files (at most; less when
/// `RLIMIT_NOFILE` is lower). A socket past them uses its descriptor.
const FILE_SLOTS: u32 = 4096;

/// The ring's table of registered files: which slots are free.
#[derive(Default)]
struct FileSlots {
    /// Slots never used yet start here.
    next: u32,
    cap: u32,
    free: Vec<u32>,
    /// Slots dropped while the ring was borrowed: emptied at the next turn.
    dropped: Vec<u32>,
}

/// One operation's place in the ring.
pub(crate) enum OpState {
    /// Submitted; wakes this waker when done.
    Waiting(Option<Waker>),
    /// A zero-copy send has its result but the kernel still holds the
    /// buffer until the notification.
    ZcSent(i32, Option<Waker>),
    /// Completed: result and CQE flags.
    Done(i32, u32),
    /// The future was dropped while in flight: the slot keeps the buffers
    /// until the kernel is done with them.
    Abandoned,
    /// A multishot operation: completions queue up until taken.
    Multi { results: VecDeque<(i32, u32)>, waker: Option<Waker>, ended: bool },
    /// Free.
    Vacant,
}

/// Ended multishot operations' completion queues kept for reuse, at most.
const MULTI_SPARE_MAX: usize = 64;
/// Completions a new multishot operation's queue holds before it grows.
const MULTI_RESULTS: usize = 16;

struct OpSlot {
    state: OpState,
    /// What an abandoned operation's kernel side may still touch.
    keep: Option<Box<dyn Kept>>,
}

/// What an operation whose future was dropped owned, kept until the
/// kernel is done with it; told the result nobody else will see.
pub(crate) trait Kept {
    /// The operation ended with `res` after its future was gone (or just
    /// before, unseen): undo what that result did (close a descriptor it
    /// made, ring again a doorbell it took), then let go.
    fn lost(self: Box<Self>, res: i32);
}

/// Owned data with nothing to undo.
pub(crate) struct Plain<T>(pub T);

impl<T> Kept for Plain<T> {
    fn lost(self: Box<Self>, _res: i32) {}
}

/// Owned data and what to do with a result nobody saw.
pub(crate) struct OnLost<T>(pub T, pub fn(&T, i32));

impl<T> Kept for OnLost<T> {
    fn lost(self: Box<Self>, res: i32) {
        (self.1)(&self.0, res)
    }
}

struct TaskSlot {
    gen: u32,
    fut: Option<Pin<Box<dyn TaskFuture>>>,
    queued: bool,
    live: bool,
}

/// Emptied task storage kept per future type, at most this many of each.
const SPARE_TASKS_MAX: usize = 1024;

/// A task's future in storage that outlives it: when the future ends it
/// is dropped where it lies and the storage waits for the next task of the
/// same type, so a task spawned per command allocates nothing once the
/// reactor has seen as many at once.
trait TaskFuture {
    /// Polls the future; an emptied storage is ready.
    fn poll_task(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()>;
    /// Drops the future where it lies, keeping the storage.
    fn clear(self: Pin<&mut Self>);
    /// The storage's type, which says what it can take.
    fn kind(&self) -> TypeId;
    /// The storage, to put the next future of its type in.
    fn as_any(&mut self) -> &mut dyn Any;
}

/// The storage of one task's future.
struct Stored<F>(Option<F>);

/// Emptied task storages of one future type.
type Spares = (TypeId, Vec<Pin<Box<dyn TaskFuture>>>);

impl<F: Future<Output = ()> + 'static> TaskFuture for Stored<F> {
    fn poll_task(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // SAFETY: the future is pinned with its storage (structural
        // pinning of the only field) and is never moved out of it.
        match unsafe { self.map_unchecked_mut(|s| &mut s.0) }.as_pin_mut() {
            Some(f) => f.poll(cx),
            None => Poll::Ready(()),
        }
    }

    fn clear(self: Pin<&mut Self>) {
        // SAFETY: as above; `set` drops the future where it lies.
        unsafe { self.map_unchecked_mut(|s| &mut s.0) }.set(None);
    }

    fn kind(&self) -> TypeId {
        TypeId::of::<Self>()
    }

    fn as_any(&mut self) -> &mut dyn Any {
        self
    }
}

struct TimerSlot {
    gen: u32,
    waker: Option<Waker>,
    fired: bool,
}

struct Timers {
    heap: BinaryHeap<std::cmp::Reverse<(Instant, u32, u32)>>,
    slots: Vec<TimerSlot>,
    free: Vec<u32>,
    /// Heap entries of timers removed before they fired (a timeout whose
    /// future finished first); compacted away when they dominate, so a
    /// timeout per receive cannot grow the heap without bound.
    stale: usize,
}

impl Timers {
    /// Room for this many timers before the first growth.
    fn with_capacity(n: usize) -> Timers {
        Timers {
            heap: BinaryHeap::with_capacity(n),
            slots: Vec::with_capacity(n),
            free: Vec::with_capacity(n),
            stale: 0,
        }
    }
}

pub(crate) struct Core {
    /// This runtime's number among those the process made (wrapping):
    /// its task wakers carry it.
    id: u16,
    /// This runtime's number, never reused: what a socket's file slot, an
    /// operation's slot or a lent receive buffer belongs to, so that one
    /// kept past its runtime is never taken for the next runtime's.
    serial: u64,
    ring: RefCell<IoUring>,
    features: Features,
    poll: Duration,
    ops: RefCell<Vec<OpSlot>>,
    op_free: RefCell<Vec<u32>>,
    /// Completion queues of ended multishot operations, for the next ones
    /// (arming a multishot receive again allocates nothing).
    multi_spare: RefCell<Vec<VecDeque<(i32, u32)>>>,
    in_flight: Cell<usize>,
    tasks: RefCell<Vec<TaskSlot>>,
    task_free: RefCell<Vec<u32>>,
    ready: RefCell<VecDeque<u32>>,
    timers: RefCell<Timers>,
    /// Emptied task storage by type ([`TaskFuture`]); a handful of types.
    spare_tasks: RefCell<Vec<Spares>>,
    /// Wakers one reap collected, woken with no borrow held (reused).
    woken: RefCell<Vec<Waker>>,
    /// The registered buffer arena (`base`, `len`), if any.
    fixed: Cell<Option<(usize, usize)>>,
    /// The registered file table's slots ([`Features::fixed_files`]).
    files: RefCell<FileSlots>,
    pub(crate) bufring: RefCell<Option<crate::bufring::BufRing>>,
    /// Nanoseconds spent spinning ([`Config::poll`]) without finding work;
    /// only this thread writes it, others read it ([`idle_poll_counter`]).
    idle_poll: Arc<AtomicU64>,
    /// Receives that found every receive buffer lent out and waited for
    /// one to come back ([`receive_dry_counter`]).
    pub(crate) receive_dry: Arc<AtomicU64>,
    /// This ring's slot (or `None`: none to be had) for each
    /// [`crate::fs::SharedFile`] it did I/O on, by the file's key.
    shared: RefCell<FxHashMap<u64, Option<u32>>>,
    /// Where other threads ask this reactor to empty those slots; made
    /// (with the task that serves it) on the first registration.
    remote: RefCell<Option<Arc<Remote>>>,
}

/// Slots of [`crate::fs::SharedFile`]s that were dropped, maybe on another
/// thread, for their reactor to empty, and the doorbell that wakes it.
pub(crate) struct Remote {
    ringer: crate::Ringer,
    release: Mutex<Vec<(u64, u32)>>,
}

impl Remote {
    /// Asks the reactor to empty `slot`, the slot of shared file `key`.
    pub(crate) fn release(&self, key: u64, slot: u32) {
        self.release.lock().unwrap_or_else(PoisonError::into_inner).push((key, slot));
        self.ringer.ring();
    }
}

/// The task that empties the slots other threads released ([`Remote`]).
async fn release_shared_slots(doorbell: crate::Doorbell, remote: Arc<Remote>) {
    loop {
        if let Err(e) = doorbell.wait().await {
            log::error!(
                "reactor: the doorbell for releasing shared file slots failed ({e}); \
                 dropped devices' files stay open until this reactor ends"
            );
            return;
        }
        let released = std::mem::take(&mut *remote.release.lock().unwrap_or_else(PoisonError::into_inner));
        // Nothing can be queued under these slots: an operation borrows
        // its file, and these files are gone.
        with_core(|c| {
            for (key, slot) in released {
                c.shared.borrow_mut().remove(&key);
                c.unregister_file(slot);
            }
        });
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Rc<Core>>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's reactor core.
///
/// # Panics
///
/// When the thread runs no reactor: every I/O future must be polled inside
/// [`Runtime::block_on`].
pub(crate) fn with_core<R>(f: impl FnOnce(&Rc<Core>) -> R) -> R {
    CURRENT.with(|c| {
        let c = c.borrow();
        let core = c.as_ref().expect("ironwire reactor: I/O outside a running reactor (use reactor::Runtime)");
        f(core)
    })
}

/// The counter of nanoseconds this thread's reactor spent spinning
/// ([`Config::poll`]) without finding work: part of its CPU time, which less
/// this is its busy time. `None` on a thread that runs no reactor. Other
/// threads may read it at any time.
pub fn idle_poll_counter() -> Option<Arc<AtomicU64>> {
    try_with_core(|c| c.idle_poll.clone())
}

/// The counter of receives on this thread's reactor that found every
/// buffer of its receive ring lent out (to connections that have not
/// parsed what they got) and waited for one to come back: a reactor whose
/// count keeps rising has too few `receive_buffers`. `None` on a thread
/// that runs no reactor. Other threads may read it at any time.
pub fn receive_dry_counter() -> Option<Arc<AtomicU64>> {
    try_with_core(|c| c.receive_dry.clone())
}

/// Whether this thread has a reactor (a [`Runtime`] made here and not yet
/// dropped): where nothing may block.
pub fn on_reactor_thread() -> bool {
    try_with_core(|_| ()).is_some()
}

/// Runs `f` with this thread's reactor core, if there is one.
pub(crate) fn try_with_core<R>(f: impl FnOnce(&Rc<Core>) -> R) -> Option<R> {
    CURRENT.try_with(|c| c.borrow().as_ref().map(f)).ok().flatten()
}

/// A reactor: a ring and the tasks that use it, on the current thread.
pub struct Runtime {
    core: Rc<Core>,
}

fn build_ring(entries: u32) -> io::Result<(IoUring, Features)> {
    let cq = entries.saturating_mul(4);
    let mut f = Features::default();
    // Best first: single issuer + deferred task work (6.1), then
    // cooperative task work (5.19), then a plain ring.
    let attempts: [(bool, bool, bool); 3] = [(true, true, false), (false, false, true), (false, false, false)];
    let mut last = None;
    for (single, defer, coop) in attempts {
        let mut b = IoUring::builder();
        b.setup_cqsize(cq).setup_clamp();
        if single {
            b.setup_single_issuer();
        }
        if defer {
            b.setup_defer_taskrun().setup_taskrun_flag();
        }
        if coop {
            b.setup_coop_taskrun().setup_taskrun_flag();
        }
        match b.build(entries) {
            Ok(ring) => {
                f.single_issuer = single;
                f.defer_taskrun = defer;
                f.coop_taskrun = coop;
                return Ok((ring, f));
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("io_uring setup failed")))
}

/// Whether the running kernel's release is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    // SAFETY: all-zero is a valid utsname, which uname fills.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a live utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return false;
    }
    // SAFETY: uname wrote a NUL-terminated release string.
    let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }.to_string_lossy();
    let mut parts = release.split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>().unwrap_or(0));
    let (a, b) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

/// The soft `RLIMIT_NOFILE`, which also bounds a registered file table.
fn nofile_limit() -> u32 {
    // SAFETY: all-zero is a valid rlimit, which getrlimit fills.
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: `r` is a live rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 0;
    }
    u32::try_from(r.rlim_cur).unwrap_or(u32::MAX)
}

impl Runtime {
    /// Creates this thread's reactor. One per thread at a time.
    pub fn new(config: Config) -> io::Result<Runtime> {
        if CURRENT.with(|c| c.borrow().is_some()) {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, "this thread already runs a reactor"));
        }
        let (ring, mut features) = build_ring(config.entries.max(8))?;
        if !ring.params().is_feature_nodrop() {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "the kernel's io_uring may drop completions"));
        }
        let mut probe = io_uring::Probe::new();
        if ring.submitter().register_probe(&mut probe).is_ok() {
            // Multishot receive and zero-copy send came with 6.0, the same
            // release as SEND_ZC; the probe shows the opcode.
            features.send_zc = probe.is_supported(opcode::SendZc::CODE);
            features.recv_multishot = features.send_zc;
        }
        let mut files = FileSlots::default();
        if kernel_at_least(6, 13) {
            let cap = FILE_SLOTS.min(nofile_limit());
            if cap > 0 && ring.submitter().register_files_sparse(cap).is_ok() {
                features.fixed_files = true;
                files.cap = cap;
            }
        }
        static NEXT_ID: AtomicU16 = AtomicU16::new(0);
        static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);
        let core = Rc::new(Core {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            serial: NEXT_SERIAL.fetch_add(1, Ordering::Relaxed),
            ring: RefCell::new(ring),
            features,
            poll: config.poll,
            ops: RefCell::new(Vec::with_capacity(1024)),
            op_free: RefCell::new(Vec::with_capacity(1024)),
            multi_spare: RefCell::new(Vec::with_capacity(MULTI_SPARE_MAX)),
            in_flight: Cell::new(0),
            tasks: RefCell::new(Vec::with_capacity(1024)),
            task_free: RefCell::new(Vec::with_capacity(1024)),
            ready: RefCell::new(VecDeque::with_capacity(1024)),
            timers: RefCell::new(Timers::with_capacity(1024)),
            spare_tasks: RefCell::new(Vec::new()),
            woken: RefCell::new(Vec::with_capacity(1024)),
            fixed: Cell::new(None),
            files: RefCell::new(files),
            bufring: RefCell::new(None),
            idle_poll: Arc::new(AtomicU64::new(0)),
            receive_dry: Arc::new(AtomicU64::new(0)),
            shared: RefCell::new(FxHashMap::default()),
            remote: RefCell::new(None),
        });
        CURRENT.with(|c| *c.borrow_mut() = Some(core.clone()));
        Ok(Runtime { core })
    }

    /// What the ring got from the kernel.
    pub fn features(&self) -> Features {
        self.core.features
    }

    /// Runs `fut` to completion, running every task it spawns meanwhile.
    /// Tasks still running when it ends stay, for a later `block_on`, until
    /// the runtime is dropped.
    pub fn block_on<F: Future>(&mut self, fut: F) -> F::Output {
        let mut fut = std::pin::pin!(fut);
        let main_woken = Arc::new(AtomicBool::new(true));
        let waker = main_waker(main_woken.clone());
        let mut cx = Context::from_waker(&waker);
        let core = self.core.clone();
        let mut last_activity = Instant::now();
        // The first poll sees this call's time, not the last turn of an
        // earlier `block_on`.
        crate::set_loop_time(last_activity);
        // When the turns that found nothing began, while spinning.
        let mut spin_from: Option<Instant> = None;
        loop {
            // A load and a store (one writer clears it): a wake between them
            // is seen by the poll that follows.
            let polled = main_woken.load(Ordering::Acquire);
            if polled {
                main_woken.store(false, Ordering::Relaxed);
                if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                    return v;
                }
            }
            let ran = core.run_ready();
            if polled || ran > 0 {
                // The work found from here on was queued while this ran.
                crate::set_waited(false);
            }
            // A woken main future runs again at the next turn, not before
            // this one's timers and ring: one that keeps waking itself
            // (a `yield_now` loop waiting for a task) must not starve them.
            let main_again = main_woken.load(Ordering::Acquire);
            let now = Instant::now();
            crate::set_loop_time(now);
            core.empty_dropped_files();
            let fired = core.fire_timers(now);
            let busy = main_again || ran > 0 || fired || !core.ready.borrow().is_empty();
            let reaped = if busy || core.sq_pending() || core.kernel_has_work() {
                core.enter(0, None);
                core.reap()
            } else {
                core.reap()
            };
            if reaped > 0 || busy {
                core.idle_since(spin_from.take(), now);
                last_activity = now;
                continue;
            }
            if now.duration_since(last_activity) < core.poll {
                spin_from.get_or_insert(now);
                crate::set_waited(true);
                std::hint::spin_loop();
                continue;
            }
            core.idle_since(spin_from.take(), now);
            // Idle: sleep until a completion or the next timer.
            let wait = core.next_timer().map(|t| t.saturating_duration_since(now));
            if wait != Some(Duration::ZERO) {
                crate::set_waited(true);
                core.enter(1, wait);
            }
            core.reap();
            last_activity = Instant::now();
            // The tasks this wake-up runs see the time after the sleep,
            // not the time before it.
            crate::set_loop_time(last_activity);
        }
    }
}

impl Core {
    /// Puts `fd` in a free slot of the ring's registered file table: the
    /// slot, or `None` (no table, or it is full) to use the descriptor.
    pub(crate) fn register_file(&self, fd: std::os::fd::RawFd) -> Option<u32> {
        if !self.features.fixed_files {
            return None;
        }
        let slot = {
            let mut f = self.files.borrow_mut();
            match f.free.pop() {
                Some(s) => s,
                None if f.next < f.cap => {
                    f.next += 1;
                    f.next - 1
                }
                None => return None,
            }
        };
        let ring = self.ring.try_borrow().ok();
        match ring.map(|r| r.submitter().register_files_update(slot, &[fd])) {
            Some(Ok(_)) => Some(slot),
            _ => {
                self.files.borrow_mut().free.push(slot);
                None
            }
        }
    }

    /// This ring's slot for shared file `key` (descriptor `fd`), put in the
    /// table on the first call for it (and noted in `homes` with where to
    /// release it); `None` when there is no table, it is full, or the
    /// reactor cannot be woken from other threads.
    pub(crate) fn shared_slot(
        &self,
        key: u64,
        fd: std::os::fd::RawFd,
        homes: &Mutex<Vec<(Arc<Remote>, u32)>>,
    ) -> Option<u32> {
        if !self.features.fixed_files {
            return None;
        }
        if let Some(slot) = self.shared.borrow().get(&key) {
            return *slot;
        }
        let slot = self.register_file(fd).and_then(|slot| match self.remote() {
            Some(remote) => {
                homes.lock().unwrap_or_else(PoisonError::into_inner).push((remote, slot));
                Some(slot)
            }
            None => {
                self.unregister_file(slot);
                None
            }
        });
        self.shared.borrow_mut().insert(key, slot);
        slot
    }

    /// This reactor's [`Remote`], made with its task on first use.
    fn remote(&self) -> Option<Arc<Remote>> {
        if let Some(r) = &*self.remote.borrow() {
            return Some(r.clone());
        }
        let (doorbell, ringer) = match crate::doorbell() {
            Ok(pair) => pair,
            Err(e) => {
                log::warn!("reactor: no doorbell for releasing shared file slots ({e}); device files go by descriptor");
                return None;
            }
        };
        let remote = Arc::new(Remote { ringer, release: Mutex::new(Vec::new()) });
        *self.remote.borrow_mut() = Some(remote.clone());
        self.spawn_stored(release_shared_slots(doorbell, remote.clone()));
        Some(remote)
    }

    /// Empties `slot`: the ring lets go of its file, which closes once its
    /// descriptor is closed too and its requests are done.
    pub(crate) fn unregister_file(&self, slot: u32) {
        match self.ring.try_borrow() {
            Ok(ring) => {
                if ring.submitter().register_files_update(slot, &[-1]).is_ok() {
                    self.files.borrow_mut().free.push(slot);
                }
            }
            Err(_) => self.files.borrow_mut().dropped.push(slot),
        }
    }

    /// Empties the slots dropped while the ring was borrowed.
    fn empty_dropped_files(&self) {
        if self.files.borrow().dropped.is_empty() {
            return;
        }
        let dropped = std::mem::take(&mut self.files.borrow_mut().dropped);
        for slot in dropped {
            self.unregister_file(slot);
        }
    }

    /// Registered file slots in use and the table's size.
    #[cfg(test)]
    pub(crate) fn file_counts(&self) -> (u32, u32) {
        let f = self.files.borrow();
        (f.next - f.free.len() as u32, f.cap)
    }

    /// Counts the spin from `from` (if it spun) to `now` as idle.
    fn idle_since(&self, from: Option<Instant>, now: Instant) {
        if let Some(from) = from {
            let ns = u64::try_from(now.saturating_duration_since(from).as_nanos()).unwrap_or(u64::MAX);
            // One writer: a load and a store, no locked read-modify-write.
            self.idle_poll.store(self.idle_poll.load(Ordering::Relaxed).saturating_add(ns), Ordering::Relaxed);
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Tasks first (they may start cancels), then wait for the kernel to
        // let go of every buffer still in flight.
        let tasks = std::mem::take(&mut *self.core.tasks.borrow_mut());
        drop(tasks);
        self.core.cancel_all();
        CURRENT.with(|c| c.borrow_mut().take());
        crate::clear_loop_time();
    }
}

fn main_waker(flag: Arc<AtomicBool>) -> Waker {
    // The block_on future's waker: a flag the loop checks each turn. Any
    // thread may set it soundly (an atomic store), but a loop asleep in
    // the kernel sees it only at its next turn (a completion or a timer):
    // a wake from another thread that must not wait goes through a
    // `Doorbell`. The loop on its own thread is the only one to clear it.
    struct Flag(Arc<AtomicBool>);
    impl std::task::Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::Release);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.store(true, Ordering::Release);
        }
    }
    Waker::from(Arc::new(Flag(flag)))
}

// Task wakers carry (generation << 48 | reactor << 32 | index) and reach
// the task through this thread's core: no allocation, no reference count.
// A task waker belongs to its reactor's thread: woken on another (which
// nothing in this workspace does; cross-thread wake-ups go through a
// `Doorbell`), it is refused with an error line instead of scheduling
// whatever task the other reactor has at that index.
static TASK_VTABLE: RawWakerVTable = RawWakerVTable::new(task_clone, task_wake, task_wake, task_drop);

fn task_clone(p: *const ()) -> RawWaker {
    RawWaker::new(p, &TASK_VTABLE)
}

fn task_wake(p: *const ()) {
    let v = p as usize as u64;
    let (idx, reactor, gen) = ((v & 0xffff_ffff) as u32, (v >> 32) as u16, (v >> 48) as u16);
    match try_with_core(|core| (core.id == reactor).then(|| core.schedule(idx, gen))) {
        Some(Some(())) => {}
        Some(None) => log::error!("reactor: a task waker of reactor {reactor} was used on another reactor's thread"),
        None => log::error!("reactor: a task waker was used on a thread without its reactor"),
    }
}

fn task_drop(_: *const ()) {}

/// A waker for task `idx` of generation `gen` (its low 16 bits: a stale
/// waker that matches a later generation polls that task once more, which
/// futures allow) on the reactor `reactor`.
fn task_waker(reactor: u16, idx: u32, gen: u32) -> Waker {
    let v = (u64::from(gen as u16) << 48 | u64::from(reactor) << 32 | u64::from(idx)) as usize;
    // SAFETY: the vtable's functions touch no memory through the pointer;
    // it is only an encoded number.
    unsafe { Waker::from_raw(RawWaker::new(v as *const (), &TASK_VTABLE)) }
}

impl Core {
    fn schedule(&self, idx: u32, gen: u16) {
        let mut tasks = self.tasks.borrow_mut();
        if let Some(t) = tasks.get_mut(idx as usize) {
            if t.live && t.gen as u16 == gen && !t.queued {
                t.queued = true;
                self.ready.borrow_mut().push_back(idx);
            }
        }
    }

    /// Spawns `fut` in emptied storage of its type if there is some.
    fn spawn_stored<F: Future<Output = ()> + 'static>(&self, fut: F) {
        let kind = TypeId::of::<Stored<F>>();
        let spare = {
            let mut spares = self.spare_tasks.borrow_mut();
            spares.iter_mut().find(|(k, _)| *k == kind).and_then(|(_, v)| v.pop())
        };
        if let Some(mut b) = spare {
            // SAFETY: nothing is moved out of the pinned storage: it holds
            // no future (it was emptied), and the new one is written into
            // it where it lies.
            if let Some(s) = unsafe { Pin::get_unchecked_mut(b.as_mut()) }.as_any().downcast_mut::<Stored<F>>() {
                s.0 = Some(fut);
                return self.spawn_boxed(b);
            }
        }
        self.spawn_boxed(Box::pin(Stored(Some(fut))));
    }

    /// Keeps a finished task's emptied storage for the next of its type.
    fn keep_spare(&self, b: Pin<Box<dyn TaskFuture>>) {
        let kind = b.kind();
        let mut spares = self.spare_tasks.borrow_mut();
        match spares.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, v)) if v.len() < SPARE_TASKS_MAX => v.push(b),
            Some(_) => {}
            None => spares.push((kind, vec![b])),
        }
    }

    /// Emptied task storage kept, of every type.
    #[cfg(test)]
    pub(crate) fn spare_task_count(&self) -> usize {
        self.spare_tasks.borrow().iter().map(|(_, v)| v.len()).sum()
    }

    fn spawn_boxed(&self, fut: Pin<Box<dyn TaskFuture>>) {
        let mut tasks = self.tasks.borrow_mut();
        let idx = match self.task_free.borrow_mut().pop() {
            Some(i) => i,
            None => {
                tasks.push(TaskSlot { gen: 0, fut: None, queued: false, live: false });
                (tasks.len() - 1) as u32
            }
        };
        let t = &mut tasks[idx as usize];
        t.gen = t.gen.wrapping_add(1);
        t.fut = Some(fut);
        t.live = true;
        t.queued = true;
        self.ready.borrow_mut().push_back(idx);
    }

    /// Polls woken tasks; returns how many ran.
    fn run_ready(&self) -> usize {
        let mut ran = 0;
        while ran < TASKS_PER_TURN {
            let Some(idx) = self.ready.borrow_mut().pop_front() else { break };
            let (fut, gen) = {
                let mut tasks = self.tasks.borrow_mut();
                let Some(t) = tasks.get_mut(idx as usize) else { continue };
                t.queued = false;
                match t.fut.take() {
                    Some(f) => (f, t.gen),
                    None => continue,
                }
            };
            let mut fut = fut;
            let waker = task_waker(self.id, idx, gen);
            let mut cx = Context::from_waker(&waker);
            let done = fut.as_mut().poll_task(&mut cx).is_ready();
            ran += 1;
            if done {
                // Dropped outside the borrow: its drop may spawn or wake.
                fut.as_mut().clear();
                self.keep_spare(fut);
                let mut tasks = self.tasks.borrow_mut();
                if let Some(t) = tasks.get_mut(idx as usize) {
                    t.live = false;
                    t.queued = false;
                }
                drop(tasks);
                self.task_free.borrow_mut().push(idx);
            } else if let Some(t) = self.tasks.borrow_mut().get_mut(idx as usize) {
                t.fut = Some(fut);
            }
        }
        ran
    }

    fn sq_pending(&self) -> bool {
        let mut ring = self.ring.borrow_mut();
        let empty = ring.submission().is_empty();
        !empty
    }

    /// Whether the kernel holds completions it posts only when asked
    /// (deferred task work) or that overflowed the completion queue.
    fn kernel_has_work(&self) -> bool {
        let mut ring = self.ring.borrow_mut();
        let sq = ring.submission();
        let work = sq.taskrun() || sq.cq_overflow();
        drop(sq);
        work
    }

    /// Submits what is queued and, with `want` 1, waits for a completion
    /// (at most `timeout`). Errors that only mean "woken early" are not
    /// errors here.
    fn enter(&self, want: u32, timeout: Option<Duration>) {
        let mut ring = self.ring.borrow_mut();
        let res = match (want, timeout) {
            (0, _) => {
                let n = ring.submission().len() as u32;
                // GETEVENTS so that deferred task work runs and overflowed
                // completions are flushed, even with nothing to submit.
                // SAFETY: no argument pointer; the entries were queued by
                // this thread with their buffers owned by op slots.
                unsafe { ring.submitter().enter::<libc::sigset_t>(n, 0, ENTER_GETEVENTS, None) }
            }
            (w, Some(t)) => {
                let ts = types::Timespec::from(t);
                let args = types::SubmitArgs::new().timespec(&ts);
                ring.submitter().submit_with_args(w as usize, &args)
            }
            (w, None) => ring.submitter().submit_and_wait(w as usize),
        };
        if let Err(e) = res {
            match e.raw_os_error() {
                Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::EAGAIN) => {}
                _ => log::warn!("reactor: io_uring_enter failed: {e}"),
            }
        }
    }

    /// Turns completions into wake-ups; returns how many there were.
    fn reap(&self) -> usize {
        let mut wake = std::mem::take(&mut *self.woken.borrow_mut());
        // Kept data to let go of, with the result nobody saw (none for a
        // zero-copy send's notification: its result came before).
        let mut dead: Vec<(Box<dyn Kept>, Option<i32>)> = Vec::new();
        let mut n = 0;
        {
            let mut ring = self.ring.borrow_mut();
            let mut ops = self.ops.borrow_mut();
            let mut free = self.op_free.borrow_mut();
            for cqe in ring.completion() {
                n += 1;
                if crate::bufring::buffer_of(cqe.flags()).is_some() {
                    // The kernel took the buffer out of the ring.
                    crate::bufring::taken_in(self);
                }
                let ud = cqe.user_data();
                if ud == IGNORED {
                    continue;
                }
                let Some(slot) = ops.get_mut(ud as usize) else { continue };
                let (res, flags) = (cqe.result(), cqe.flags());
                let more = cqueue::more(flags);
                if cqueue::notif(flags) {
                    // A zero-copy send's notification: the buffer is free.
                    match &mut slot.state {
                        OpState::ZcSent(r, w) => {
                            let w = w.take();
                            slot.state = OpState::Done(*r, 0);
                            self.in_flight.set(self.in_flight.get().saturating_sub(1));
                            wake.extend(w);
                        }
                        OpState::Abandoned => {
                            dead.extend(slot.keep.take().map(|k| (k, None)));
                            slot.state = OpState::Vacant;
                            free.push(ud as u32);
                            self.in_flight.set(self.in_flight.get().saturating_sub(1));
                        }
                        _ => {}
                    }
                    continue;
                }
                match &mut slot.state {
                    OpState::Waiting(w) => {
                        let w = w.take();
                        if more {
                            // A zero-copy send's result; its notification
                            // follows.
                            slot.state = OpState::ZcSent(res, w);
                            continue;
                        }
                        slot.state = OpState::Done(res, flags);
                        self.in_flight.set(self.in_flight.get().saturating_sub(1));
                        wake.extend(w);
                    }
                    OpState::Multi { results, waker, ended } => {
                        results.push_back((res, flags));
                        if !more {
                            *ended = true;
                            self.in_flight.set(self.in_flight.get().saturating_sub(1));
                        }
                        wake.extend(waker.take());
                    }
                    OpState::Abandoned => {
                        if let Some(b) = crate::bufring::buffer_of(flags) {
                            crate::bufring::recycle_in(self, b);
                        }
                        if !more {
                            dead.extend(slot.keep.take().map(|k| (k, Some(res))));
                            slot.state = OpState::Vacant;
                            free.push(ud as u32);
                            self.in_flight.set(self.in_flight.get().saturating_sub(1));
                        }
                    }
                    OpState::ZcSent(..) | OpState::Done(..) | OpState::Vacant => {}
                }
            }
        }
        for (kept, res) in dead {
            match res {
                Some(res) => kept.lost(res),
                None => drop(kept),
            }
        }
        for w in wake.drain(..) {
            w.wake();
        }
        *self.woken.borrow_mut() = wake;
        n
    }

    fn fire_timers(&self, now: Instant) -> bool {
        let mut wake = std::mem::take(&mut *self.woken.borrow_mut());
        {
            let mut t = self.timers.borrow_mut();
            while let Some(std::cmp::Reverse((when, idx, gen))) = t.heap.peek().copied() {
                if when > now {
                    break;
                }
                t.heap.pop();
                match t.slots.get_mut(idx as usize) {
                    Some(s) if s.gen == gen && !s.fired => {
                        s.fired = true;
                        wake.extend(s.waker.take());
                    }
                    _ => t.stale = t.stale.saturating_sub(1),
                }
            }
        }
        let any = !wake.is_empty();
        for w in wake.drain(..) {
            w.wake();
        }
        *self.woken.borrow_mut() = wake;
        any
    }

    fn next_timer(&self) -> Option<Instant> {
        self.timers.borrow().heap.peek().map(|r| r.0 .0)
    }

    #[cfg(test)]
    fn timer_heap_len(&self) -> usize {
        self.timers.borrow().heap.len()
    }

    /// Queues `entry` for the kernel as operation `state`; returns its slot.
    pub(crate) fn push(&self, entry: squeue::Entry, state: OpState) -> u32 {
        let idx = {
            let mut ops = self.ops.borrow_mut();
            match self.op_free.borrow_mut().pop() {
                Some(i) => {
                    ops[i as usize] = OpSlot { state, keep: None };
                    i
                }
                None => {
                    ops.push(OpSlot { state, keep: None });
                    (ops.len() - 1) as u32
                }
            }
        };
        self.push_entry(entry.user_data(u64::from(idx)));
        self.in_flight.set(self.in_flight.get() + 1);
        idx
    }

    fn push_entry(&self, entry: squeue::Entry) {
        loop {
            let mut ring = self.ring.borrow_mut();
            // SAFETY: every entry's buffers are owned by its op slot (or the
            // future that owns the slot) until its completion is reaped.
            if unsafe { ring.submission().push(&entry) }.is_ok() {
                return;
            }
            // Full: hand the kernel what is queued and try again.
            drop(ring);
            self.enter(0, None);
            self.reap();
        }
    }

    /// Hands the kernel every entry queued so far, now rather than at the
    /// end of the turn: it looks up each entry's descriptor as it takes
    /// the entry (nothing here links or drains entries, which would defer
    /// that). Completions are reaped in between only when the kernel
    /// refused to take more (a full completion queue).
    pub(crate) fn submit_queued(&self) {
        // Each `enter` takes what the kernel can (an entry that fails is
        // taken too, and completes with its error); a kernel short of
        // memory answers EAGAIN, so the tries are bounded.
        for _ in 0..1000 {
            if self.ring.borrow_mut().submission().is_empty() {
                return;
            }
            self.enter(0, None);
            if !self.ring.borrow_mut().submission().is_empty() {
                self.reap();
            }
        }
        log::error!(
            "reactor: the kernel took no queued submission in 1000 tries; a dropped operation's may follow late"
        );
    }

    pub(crate) fn cancel(&self, idx: u32) {
        let entry = opcode::AsyncCancel::new(u64::from(idx)).build().user_data(IGNORED);
        self.push_entry(entry);
    }

    /// At the end: cancels everything in flight and waits (bounded) for the
    /// kernel to let go of the buffers; any it still holds are leaked, not
    /// freed under it.
    fn cancel_all(&self) {
        let ids: Vec<u32> = {
            let ops = self.ops.borrow();
            ops.iter()
                .enumerate()
                .filter(|(_, s)| !matches!(s.state, OpState::Vacant | OpState::Done(..)))
                .map(|(i, _)| i as u32)
                .collect()
        };
        for i in ids {
            self.cancel(i);
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.in_flight.get() > 0 && Instant::now() < deadline {
            self.enter(1, Some(Duration::from_millis(50)));
            self.reap();
        }
        if self.in_flight.get() > 0 {
            log::warn!(
                "reactor: {} operations still in flight at shutdown; their buffers are leaked",
                self.in_flight.get()
            );
            let ops = std::mem::take(&mut *self.ops.borrow_mut());
            std::mem::forget(ops);
        }
        if let Some(b) = self.bufring.borrow_mut().take() {
            let _ = self.ring.borrow().submitter().unregister_buf_ring(b.group());
            drop(b);
        }
    }

    /// The completion of operation `idx`, or registers `cx` for it.
    pub(crate) fn poll_op(&self, idx: u32, cx: &Context<'_>) -> Poll<(i32, u32)> {
        let mut ops = self.ops.borrow_mut();
        let slot = &mut ops[idx as usize];
        match &mut slot.state {
            OpState::Done(res, flags) => {
                let out = (*res, *flags);
                slot.state = OpState::Vacant;
                drop(ops);
                self.op_free.borrow_mut().push(idx);
                Poll::Ready(out)
            }
            OpState::Waiting(w) | OpState::ZcSent(_, w) => {
                match w {
                    Some(old) if old.will_wake(cx.waker()) => {}
                    _ => *w = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            _ => Poll::Ready((-libc::ECANCELED, 0)),
        }
    }

    /// The next completion of multishot operation `idx`: `Some` result, or
    /// `None` once it ended and everything was taken (the slot is freed).
    /// The state of a new multishot operation, its completion queue taken
    /// from an ended one where there is one.
    pub(crate) fn new_multi(&self) -> OpState {
        let results = self.multi_spare.borrow_mut().pop().unwrap_or_else(|| VecDeque::with_capacity(MULTI_RESULTS));
        OpState::Multi { results, waker: None, ended: false }
    }

    /// Keeps an ended multishot operation's (empty) completion queue for
    /// the next one.
    fn spare_multi(&self, mut results: VecDeque<(i32, u32)>) {
        results.clear();
        let mut spare = self.multi_spare.borrow_mut();
        if spare.len() < MULTI_SPARE_MAX && results.capacity() > 0 {
            spare.push(results);
        }
    }

    pub(crate) fn poll_multi(&self, idx: u32, cx: &Context<'_>) -> Poll<Option<(i32, u32)>> {
        let mut ops = self.ops.borrow_mut();
        let slot = &mut ops[idx as usize];
        let OpState::Multi { results, waker, ended } = &mut slot.state else {
            return Poll::Ready(None);
        };
        if let Some(r) = results.pop_front() {
            return Poll::Ready(Some(r));
        }
        if *ended {
            let old = std::mem::replace(&mut slot.state, OpState::Vacant);
            drop(ops);
            self.op_free.borrow_mut().push(idx);
            if let OpState::Multi { results, .. } = old {
                self.spare_multi(results);
            }
            return Poll::Ready(None);
        }
        *waker = Some(cx.waker().clone());
        Poll::Pending
    }

    /// The future of operation `idx` was dropped: keep `keep` alive until
    /// the kernel is done and ask it to stop early.
    pub(crate) fn abandon(&self, idx: u32, keep: Option<Box<dyn Kept>>) {
        let mut ops = self.ops.borrow_mut();
        let slot = &mut ops[idx as usize];
        let (finished, unseen) = match &slot.state {
            OpState::Vacant => return,
            // Completed, but its future never took the result.
            OpState::Done(res, _) => (true, Some(*res)),
            OpState::Multi { ended: true, .. } => (true, None),
            _ => (false, None),
        };
        let old = std::mem::replace(&mut slot.state, if finished { OpState::Vacant } else { OpState::Abandoned });
        let keep = if finished { keep } else { std::mem::replace(&mut slot.keep, keep) };
        drop(ops);
        match (keep, unseen) {
            (Some(k), Some(res)) => k.lost(res),
            (keep, _) => drop(keep),
        }
        // Buffers a multishot receive filled that nobody took go back.
        if let OpState::Multi { mut results, .. } = old {
            for (_, flags) in results.drain(..) {
                if let Some(b) = crate::bufring::buffer_of(flags) {
                    crate::bufring::recycle_in(self, b);
                }
            }
            self.spare_multi(results);
        }
        if finished {
            self.op_free.borrow_mut().push(idx);
        } else {
            self.cancel(idx);
        }
    }

    pub(crate) fn features(&self) -> Features {
        self.features
    }

    /// This runtime's number, never reused ([`Core::serial`]).
    pub(crate) fn serial(&self) -> u64 {
        self.serial
    }

    pub(crate) fn ring(&self) -> std::cell::Ref<'_, IoUring> {
        self.ring.borrow()
    }

    pub(crate) fn fixed_region(&self) -> Option<(usize, usize)> {
        self.fixed.get()
    }

    pub(crate) fn set_fixed_region(&self, region: (usize, usize)) {
        self.fixed.set(Some(region));
    }

    fn add_timer(&self, when: Instant, waker: Waker) -> (u32, u32) {
        let mut t = self.timers.borrow_mut();
        let idx = match t.free.pop() {
            Some(i) => i,
            None => {
                t.slots.push(TimerSlot { gen: 0, waker: None, fired: false });
                (t.slots.len() - 1) as u32
            }
        };
        let s = &mut t.slots[idx as usize];
        s.gen = s.gen.wrapping_add(1);
        s.waker = Some(waker);
        s.fired = false;
        let gen = s.gen;
        t.heap.push(std::cmp::Reverse((when, idx, gen)));
        (idx, gen)
    }

    fn poll_timer(&self, idx: u32, gen: u32, cx: &Context<'_>) -> Poll<()> {
        let mut t = self.timers.borrow_mut();
        match t.slots.get_mut(idx as usize) {
            Some(s) if s.gen == gen && !s.fired => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
            _ => Poll::Ready(()),
        }
    }

    fn remove_timer(&self, idx: u32, gen: u32) {
        let mut t = self.timers.borrow_mut();
        if let Some(s) = t.slots.get_mut(idx as usize) {
            if s.gen == gen {
                // A bumped generation makes the heap entry stale.
                let unfired = !s.fired;
                s.gen = s.gen.wrapping_add(1);
                s.waker = None;
                s.fired = true;
                t.free.push(idx);
                if unfired {
                    t.stale += 1;
                }
            }
        }
        if t.stale > 4096 && t.stale > t.heap.len() / 2 {
            let Timers { heap, slots, .. } = &mut *t;
            heap.retain(|e| {
                let (_, i, g) = e.0;
                slots.get(i as usize).is_some_and(|s| s.gen == g && !s.fired)
            });
            t.stale = 0;
        }
    }
}

/// A spawned task's result, awaited through its handle. Dropping the
/// handle lets the task run on, detached.
pub struct JoinHandle<T> {
    inner: Rc<RefCell<JoinInner<T>>>,
}

struct JoinInner<T> {
    value: Option<T>,
    waker: Option<Waker>,
}

impl<T> Future for JoinHandle<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let mut inner = self.inner.borrow_mut();
        match inner.value.take() {
            Some(v) => Poll::Ready(v),
            None => {
                inner.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Runs `fut` as a task on this thread's reactor.
///
/// # Panics
///
/// Outside a running reactor.
pub fn spawn<F>(fut: F) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    let inner = Rc::new(RefCell::new(JoinInner { value: None, waker: None }));
    let out = inner.clone();
    let task = async move {
        let v = fut.await;
        let w = {
            let mut i = out.borrow_mut();
            i.value = Some(v);
            i.waker.take()
        };
        if let Some(w) = w {
            w.wake();
        }
    };
    with_core(|core| core.spawn_stored(task));
    JoinHandle { inner }
}

/// Runs `fut` as a task on this thread's reactor, with no handle to wait
/// for it: once as many tasks of its type have run at once before, this
/// allocates nothing (the storage of finished ones is reused), which is
/// how a command's device I/O is run.
///
/// # Panics
///
/// Outside a running reactor.
pub fn spawn_detached<F: Future<Output = ()> + 'static>(fut: F) {
    with_core(|core| core.spawn_stored(fut));
}

/// Completes after `d` (on the reactor's timers, no ring entry).
pub fn sleep(d: Duration) -> Sleep {
    Sleep { when: Instant::now() + d, slot: None, _reactor: crate::ThreadBound::default() }
}

/// The future of [`sleep`].
pub struct Sleep {
    when: Instant,
    /// The timer's slot and generation, and the runtime whose timer it is
    /// ([`Core::serial`]): kept past that runtime, the same numbers name
    /// another sleep's timer in the next runtime of the thread.
    slot: Option<(u32, u32, u64)>,
    /// `slot` is a timer of this thread's reactor.
    _reactor: crate::ThreadBound,
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let (when, slot) = (self.when, self.slot);
        let (r, slot) = with_core(|c| match slot {
            Some((idx, gen, ring)) if ring == c.serial => {
                let r = c.poll_timer(idx, gen, cx);
                if r.is_ready() {
                    c.remove_timer(idx, gen);
                    (r, None)
                } else {
                    (r, slot)
                }
            }
            // None yet, or one of a runtime that is gone (its timers went
            // with it): a timer of this runtime, if still due.
            _ if Instant::now() >= when => (Poll::Ready(()), None),
            _ => {
                let (idx, gen) = c.add_timer(when, cx.waker().clone());
                (Poll::Pending, Some((idx, gen, c.serial)))
            }
        });
        // A timer fires only once `when` has passed: polled again, this is
        // ready without one.
        self.slot = slot;
        r
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some((idx, gen, ring)) = self.slot.take() {
            try_with_core(|c| {
                if c.serial == ring {
                    c.remove_timer(idx, gen);
                }
            });
        }
    }
}

/// `timeout` ran out before the future finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

impl std::fmt::Display for Elapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("timed out")
    }
}

impl std::error::Error for Elapsed {}

/// Runs `fut` for at most `d`.
pub async fn timeout<F: Future>(d: Duration, fut: F) -> Result<F::Output, Elapsed> {
    let mut fut = std::pin::pin!(fut);
    let mut sleep = std::pin::pin!(sleep(d));
    std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = fut.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// Runs `a` and `b` together until one finishes: `Ok` with `a`'s output,
/// or `Err` with `b`'s. `a` is polled first, so it wins when both are
/// ready; the other is dropped before this returns.
pub async fn race<A: Future, B: Future>(a: A, b: B) -> Result<A::Output, B::Output> {
    let mut a = std::pin::pin!(a);
    let mut b = std::pin::pin!(b);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = a.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        b.as_mut().poll(cx).map(Err)
    })
    .await
}

#[cfg(test)]
pub(crate) fn timer_heap_len() -> usize {
    with_core(|c| c.timer_heap_len())
}

/// Lets the other ready tasks run before continuing.
pub async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}
