//! Thread-per-core reactors on io_uring, built directly on the `io-uring`
//! crate.
//!
//! Each reactor is one OS thread pinned to one core, with one ring for its
//! sockets, files and block devices ([`Runtime`]), its own listener socket
//! (SO_REUSEPORT, so the kernel spreads connections over the reactors
//! without a shared accept queue), its own receive buffer ring
//! ([`register_receive_buffers`]) and its own registered I/O buffers
//! ([`fs::register_fixed_buffer`]). A connection lives on the reactor that
//! accepted it until it closes. Nothing here knows a storage protocol.

pub mod buf;
mod bufring;
mod doorbell;
pub mod fs;
pub mod gather;
pub mod net;
mod op;
mod rt;
#[cfg(test)]
mod safety_tests;
#[cfg(test)]
mod thread_bound;

pub use bufring::{register_receive_buffers, Receiver, RecvBuf, DEFAULT_BUFFERS, DEFAULT_BUFFER_SIZE};
pub use doorbell::{doorbell, Doorbell, Ringer};
pub use rt::{
    idle_poll_counter, on_reactor_thread, race, receive_dry_counter, sleep, spawn, spawn_detached, timeout, yield_now,
    Config, Elapsed, Features, JoinHandle, Runtime, Sleep, DEFAULT_POLL,
};

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::task::{Poll, Waker};
use std::time::Instant;

/// A marker that keeps a type on the thread that made it (neither `Send`
/// nor `Sync`): ring operations, receive buffers and timers name slots of
/// that thread's reactor, and acting on them from another thread would
/// free memory the kernel still writes or touch another reactor's state.
#[derive(Default)]
pub(crate) struct ThreadBound(std::marker::PhantomData<*const ()>);

/// One reactor's identity, handed to the code it runs.
#[derive(Clone, Copy, Debug)]
pub struct ReactorId {
    /// Index of the reactor (0-based).
    pub index: usize,
    /// The CPU it is pinned to, if pinning succeeded.
    pub cpu: Option<usize>,
}

fn start_instant() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

fn us_since_start(t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(start_instant()).as_micros()).unwrap_or(u64::MAX)
}

thread_local! {
    /// The time of the current loop turn (µs since start), on a reactor
    /// thread.
    static LOOP_US: Cell<Option<u64>> = const { Cell::new(None) };
    /// Whether the loop waited for work (spun or slept) since its last
    /// turn that ran something ([`loop_waited`]).
    static WAITED: Cell<bool> = const { Cell::new(true) };
}

/// Records whether the loop waited for work since its last turn that ran
/// something.
pub(crate) fn set_waited(w: bool) {
    WAITED.with(|c| c.set(w));
}

/// Whether the loop waited (spun or slept) before it found the work this
/// turn runs. `false` means the reactor is behind: the work came in while
/// it ran the turn before, with no pause between. Off a reactor thread,
/// `true`.
pub fn loop_waited() -> bool {
    WAITED.with(Cell::get)
}

/// Records the time read at the start of a loop turn.
pub(crate) fn set_loop_time(now: Instant) {
    LOOP_US.with(|c| c.set(Some(us_since_start(now))));
}

/// Forgets the turn's time when the thread's runtime ends: the clock is
/// read again from then on, and [`loop_waited`] is `true` again.
pub(crate) fn clear_loop_time() {
    LOOP_US.with(|c| c.set(None));
    set_waited(true);
}

/// Milliseconds on a monotonic clock that started with the process: the
/// `now` the sans-IO protocol code is given. On a reactor thread it is the
/// time of the current loop turn (the clock is read once per turn, not per
/// command).
pub fn now_ms() -> u64 {
    now_us() / 1000
}

/// As [`now_ms`], in microseconds: on a reactor thread the time of the
/// current loop turn, so timing an I/O with it costs no clock read (and
/// is as fine as the loop's turns).
pub fn now_us() -> u64 {
    LOOP_US.with(Cell::get).unwrap_or_else(|| us_since_start(Instant::now()))
}

/// The CPUs this process may run on.
pub fn available_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most
    // size_of::<cpu_set_t>() bytes into it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; the pointer and size describe `set`.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return (0..std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)).collect();
    }
    // SAFETY: CPU_ISSET reads the initialized set.
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

fn pin_to(cpu: usize) -> bool {
    // SAFETY: as in available_cpus; CPU_SET writes inside the set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// Starts one reactor thread per entry of `cpus` (or one unpinned reactor
/// when `cpus` is empty), each running `main(id)` to completion on its own
/// ring. Returns the join handles.
pub fn start<F, Fut>(cpus: &[usize], config: Config, main: F) -> std::io::Result<Vec<std::thread::JoinHandle<()>>>
where
    F: Fn(ReactorId) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let plan: Vec<Option<usize>> = if cpus.is_empty() { vec![None] } else { cpus.iter().copied().map(Some).collect() };
    let mut handles = Vec::new();
    for (index, cpu) in plan.into_iter().enumerate() {
        let main = main.clone();
        let h = std::thread::Builder::new().name(format!("reactor-{index}")).spawn(move || {
            let pinned = cpu.filter(|&c| {
                let ok = pin_to(c);
                if !ok {
                    log::warn!("reactor {index}: could not pin to cpu {c}");
                }
                ok
            });
            match Runtime::new(config) {
                Ok(mut rt) => {
                    log::debug!("reactor {index}: ring features {:?}", rt.features());
                    rt.block_on(main(ReactorId { index, cpu: pinned }))
                }
                Err(e) => log::error!("reactor {index}: io_uring failed to start: {e}"),
            }
        })?;
        handles.push(h);
    }
    Ok(handles)
}

/// A TCP listener bound with SO_REUSEPORT (so every reactor can bind the
/// same address) and SO_REUSEADDR, for the calling reactor.
pub fn listen(addr: SocketAddr) -> std::io::Result<net::TcpListener> {
    net::TcpListener::bind_reuse_port(addr, 1024)
}

/// A single-threaded wake-up flag: `notify` marks it and wakes the waiter;
/// several notifications before the waiter runs collapse into one, which is
/// what batches sends.
#[derive(Default)]
pub struct Notify {
    notified: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Notify {
    /// Marks the flag and wakes the waiter.
    pub fn notify(&self) {
        self.notified.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Waits until notified (returns at once if already notified), and
    /// clears the flag.
    pub async fn wait(&self) {
        std::future::poll_fn(|cx| {
            if self.notified.replace(false) {
                Poll::Ready(())
            } else {
                *self.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

/// A single-threaded event that wakes every waiter: each [`NotifyAll::wait`]
/// returns at the first [`NotifyAll::notify`] after it began. For several
/// tasks waiting on the same thing (where [`Notify`] keeps one waiter and a
/// second `wait` would leave the first asleep for good).
#[derive(Default)]
pub struct NotifyAll {
    generation: Cell<u64>,
    wakers: RefCell<Vec<Waker>>,
}

impl NotifyAll {
    /// Wakes every waiter.
    pub fn notify(&self) {
        self.generation.set(self.generation.get().wrapping_add(1));
        // Waking only queues the task (nothing runs here), so the list can
        // be drained in place and keep its room.
        for w in self.wakers.borrow_mut().drain(..) {
            w.wake();
        }
    }

    /// Waits for the next notification.
    pub async fn wait(&self) {
        let start = self.generation.get();
        std::future::poll_fn(|cx| {
            if self.generation.get() != start {
                return Poll::Ready(());
            }
            let mut wakers = self.wakers.borrow_mut();
            if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
                wakers.push(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }
}

/// Counts this thread's heap allocations, for the tests that assert a
/// path allocates nothing.
#[cfg(test)]
mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static ALLOCS: Cell<u64> = const { Cell::new(0) };
    }

    /// Allocations this thread made so far.
    pub fn allocs() -> u64 {
        ALLOCS.with(Cell::get)
    }

    struct Counting;

    // SAFETY: every call is passed to the system allocator unchanged.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
            // SAFETY: the caller's contract, passed on.
            unsafe { System.alloc(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: as above.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;
    use std::time::Duration;

    fn run<F: Future>(f: F) -> F::Output {
        Runtime::new(Config::default()).expect("runtime").block_on(f)
    }

    #[test]
    fn spinning_that_finds_nothing_counts_as_idle_and_sleeping_does_not() {
        use std::sync::atomic::Ordering::Relaxed;
        let wait = |poll: Duration| {
            let mut rt = Runtime::new(Config { poll, ..Config::default() }).expect("runtime");
            rt.block_on(async {
                let idle = idle_poll_counter().expect("the reactor's counter");
                sleep(Duration::from_millis(30)).await;
                idle.load(Relaxed)
            })
        };
        // A spin longer than the wait: the wait for the timer is spun.
        let spun = wait(Duration::from_millis(500));
        assert!(spun >= 25_000_000, "{spun} ns of idle spin over a 30 ms wait");
        // No spin: the wait is slept, and nothing counts.
        assert_eq!(wait(Duration::ZERO), 0);
        assert!(idle_poll_counter().is_none(), "a thread that runs no reactor has no counter");
    }

    #[test]
    fn a_turn_says_whether_the_loop_waited_for_its_work() {
        for poll in [Duration::ZERO, Duration::from_millis(200)] {
            let mut rt = Runtime::new(Config { poll, ..Config::default() }).expect("runtime");
            let (after_timer, after_busy_turn) = rt.block_on(async {
                // Nothing to do until the timer: the loop sleeps or spins.
                sleep(Duration::from_millis(5)).await;
                let after_timer = loop_waited();
                // Woken at once: the next turn runs with no pause before it.
                yield_now().await;
                (after_timer, loop_waited())
            });
            assert!(after_timer, "poll {poll:?}: the timer's wake-up came after a wait");
            assert!(!after_busy_turn, "poll {poll:?}: work queued by the turn before was not waited for");
        }
        assert!(loop_waited(), "off a reactor thread");
    }

    #[test]
    fn notify_collapses_wakeups_and_wakes_a_waiter() {
        run(async {
            let n = Rc::new(Notify::default());
            n.notify();
            n.notify();
            n.wait().await; // one pending notification
            let n2 = n.clone();
            let t = spawn(async move {
                n2.wait().await;
                7
            });
            sleep(Duration::from_millis(5)).await;
            n.notify();
            assert_eq!(t.await, 7);
        });
    }

    #[test]
    fn race_ends_with_the_first_and_drops_the_other() {
        struct Flag(Rc<Cell<bool>>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.set(true);
            }
        }
        run(async {
            let dropped = Rc::new(Cell::new(false));
            let flag = Flag(dropped.clone());
            let slow = async move {
                sleep(Duration::from_secs(30)).await;
                drop(flag);
            };
            let r = race(slow, async { 5 }).await;
            assert_eq!(r, Err(5));
            assert!(dropped.get(), "the loser is dropped before race returns");
            let n = Notify::default();
            n.notify();
            assert_eq!(race(n.wait(), async { 1 }).await, Ok(()), "both ready: the first wins");
        });
    }

    #[test]
    fn reactors_run_pinned_and_report_their_index() {
        let cpus = available_cpus();
        assert!(!cpus.is_empty());
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = seen.clone();
        let handles = start(&cpus, Config::default(), move |id| {
            let s = s.clone();
            async move {
                s.lock().expect("lock").push((id.index, id.cpu));
            }
        })
        .expect("start");
        for h in handles {
            h.join().expect("join");
        }
        let mut seen = seen.lock().expect("lock").clone();
        seen.sort();
        assert_eq!(seen.len(), cpus.len());
        for (i, (idx, cpu)) in seen.iter().enumerate() {
            assert_eq!(*idx, i);
            assert_eq!(*cpu, cpus.get(i).copied());
        }
    }

    #[test]
    fn user_timeout_is_set_on_the_socket() {
        run(async {
            let l = listen("127.0.0.1:0".parse().expect("addr")).expect("listen");
            let s = net::TcpStream::connect(l.local_addr().expect("addr")).await.expect("connect");
            s.set_user_timeout(12_345).expect("set");
            let mut v: libc::c_uint = 0;
            let mut len = std::mem::size_of::<libc::c_uint>() as libc::socklen_t;
            // SAFETY: getsockopt into a local of the size we pass.
            let rc = unsafe {
                libc::getsockopt(
                    std::os::fd::AsRawFd::as_raw_fd(&s),
                    libc::IPPROTO_TCP,
                    libc::TCP_USER_TIMEOUT,
                    (&mut v as *mut libc::c_uint).cast(),
                    &mut len,
                )
            };
            assert_eq!(rc, 0);
            assert_eq!(v, 12_345);
        });
    }

    #[test]
    fn shutdown_read_ends_a_pending_receive_and_keeps_the_send_side() {
        run(async {
            let l = listen("127.0.0.1:0".parse().expect("addr")).expect("listen");
            let mut peer = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
            let (s, _) = l.accept().await.expect("accept");
            let reader = s.clone();
            let pending = spawn(async move { reader.read(vec![0u8; 16]).await.0 });
            sleep(Duration::from_millis(20)).await;
            s.shutdown_read().expect("shutdown_read");
            assert_eq!(pending.await.expect("read"), 0, "the receive ends as at end of stream");
            s.write_all(b"still sending".to_vec()).await.0.expect("send after shutdown_read");
            let mut got = [0u8; 13];
            std::io::Read::read_exact(&mut peer, &mut got).expect("peer reads");
            assert_eq!(&got, b"still sending");
        });
    }

    #[test]
    fn shutting_a_listener_down_ends_its_pending_accept() {
        run(async {
            let l = Rc::new(listen("127.0.0.1:0".parse().expect("addr")).expect("listen"));
            let l2 = l.clone();
            let pending = spawn(async move { l2.accept().await.map(drop) });
            sleep(Duration::from_millis(20)).await;
            // What the daemon's stop does from another thread.
            // SAFETY: plain syscall on a live descriptor.
            let rc = unsafe { libc::shutdown(std::os::fd::AsRawFd::as_raw_fd(&*l), libc::SHUT_RDWR) };
            assert_eq!(rc, 0);
            assert!(pending.await.is_err(), "the accept fails once the listener is shut down");
        });
    }

    #[test]
    fn a_doorbell_rung_from_another_thread_wakes_its_reactor_once_per_batch() {
        run(async {
            let (bell, ringer) = doorbell().expect("doorbell");
            let r = ringer.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                r.ring();
                r.ring();
            });
            bell.wait().await.expect("first wake-up");
            // Both rings came before the read completed, or the second
            // came after it: either way at most one more wake-up is due.
            let again = timeout(Duration::from_millis(50), bell.wait()).await;
            if again.is_ok() {
                assert!(timeout(Duration::from_millis(50), bell.wait()).await.is_err(), "a third wake-up");
            }
            ringer.ring();
            timeout(Duration::from_secs(5), bell.wait()).await.expect("rung again").expect("read");
        });
    }

    #[test]
    fn two_listeners_share_one_port() {
        run(async {
            let a = listen("127.0.0.1:0".parse().expect("addr")).expect("first");
            let addr = a.local_addr().expect("addr");
            let b = listen(addr).expect("second bind with SO_REUSEPORT");
            assert_eq!(b.local_addr().expect("addr"), addr);
        });
    }

    #[test]
    fn timers_fire_in_order_and_timeouts_expire() {
        run(async {
            let order = Rc::new(RefCell::new(Vec::new()));
            let mut hs = Vec::new();
            for (i, ms) in [(0u32, 30u64), (1, 10), (2, 20)] {
                let o = order.clone();
                hs.push(spawn(async move {
                    sleep(Duration::from_millis(ms)).await;
                    o.borrow_mut().push(i);
                }));
            }
            for h in hs {
                h.await;
            }
            assert_eq!(*order.borrow(), vec![1, 2, 0]);
            let t0 = Instant::now();
            let r = timeout(Duration::from_millis(20), sleep(Duration::from_secs(5))).await;
            assert_eq!(r, Err(Elapsed));
            assert!(t0.elapsed() < Duration::from_secs(2));
            assert_eq!(timeout(Duration::from_secs(5), async { 3 }).await, Ok(3));
        });
    }

    #[test]
    fn timeouts_that_never_fire_do_not_pile_up() {
        run(async {
            for _ in 0..100_000 {
                // Pending once (so the timer is registered), then done.
                let r = timeout(Duration::from_secs(60), yield_now()).await;
                assert_eq!(r, Ok(()));
            }
            assert!(rt::timer_heap_len() <= 8192, "{} timer entries", rt::timer_heap_len());
        });
    }

    /// An echo over loopback through accept, connect, receive and send,
    /// with both receive paths (multishot into the buffer ring, one-shot).
    fn echo(multishot: bool) {
        run(async move {
            if multishot {
                register_receive_buffers(16, 4096).expect("buffer ring");
            }
            let l = listen("127.0.0.1:0".parse().expect("addr")).expect("listen");
            let addr = l.local_addr().expect("addr");
            let server = spawn(async move {
                let (s, _) = l.accept().await.expect("accept");
                let mut rx = s.receiver();
                let mut total = 0usize;
                loop {
                    let b = rx.recv().await.expect("recv");
                    if b.is_empty() {
                        break;
                    }
                    total += b.len();
                    let out = b.to_vec();
                    drop(b);
                    let (r, _) = s.write_all(out).await;
                    r.expect("send");
                }
                total
            });
            let mut c = net::TcpStream::connect(addr).await.expect("connect");
            // Loopback never sends zero-copy on its own; force it here so
            // that the path is exercised.
            c.set_zero_copy_min(64 * 1024);
            // More than the ring holds, so buffers must come back.
            let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
            let reader = {
                let c = c.clone();
                spawn(async move {
                    let mut got = Vec::new();
                    while got.len() < 200_000 {
                        let (r, b) = c.read(Vec::with_capacity(65536)).await;
                        let n = r.expect("read");
                        assert!(n > 0, "early end");
                        got.extend_from_slice(&b);
                    }
                    got
                })
            };
            let (r, _) = c.write_all(data.clone()).await;
            r.expect("write");
            let got = reader.await;
            assert_eq!(got, data);
            c.shutdown();
            assert_eq!(server.await, 200_000);
        });
    }

    #[test]
    fn echo_over_multishot_receive() {
        echo(true);
    }

    #[test]
    fn echo_over_one_shot_receive() {
        echo(false);
    }

    #[test]
    fn connections_whose_bursts_outgrow_the_ring_lose_nothing_and_every_buffer_comes_back() {
        run(async {
            // 128 buffers of 1 KiB, 64 on offer at first; 8 connections
            // with 64 KiB each (within any socket buffer) waiting before
            // anything is received.
            register_receive_buffers(128, 1024).expect("buffer ring");
            let l = listen("127.0.0.1:0".parse().expect("addr")).expect("listen");
            let addr = l.local_addr().expect("addr");
            let data = |c: u32| -> Vec<u8> { (0..65_536u32).map(|i| (i % 241 + c * 7) as u8).collect() };
            let mut clients = Vec::new();
            let mut servers = Vec::new();
            for c in 0..8u32 {
                let cl = net::TcpStream::connect(addr).await.expect("connect");
                let (s, _) = l.accept().await.expect("accept");
                let (r, _) = cl.write_all(data(c)).await;
                r.expect("write");
                clients.push(cl);
                servers.push(s);
            }
            let readers: Vec<_> = servers
                .into_iter()
                .map(|s| {
                    spawn(async move {
                        let mut rx = s.receiver();
                        let mut got = Vec::new();
                        while got.len() < 65_536 {
                            let b = rx.recv().await.expect("recv");
                            assert!(!b.is_empty(), "early end");
                            got.extend_from_slice(&b);
                        }
                        got
                    })
                })
                .collect();
            for (c, r) in readers.into_iter().enumerate() {
                assert!(r.await == data(c as u32), "connection {c}: data differs");
            }
            let (offered, free, entries, window) = bufring::ring_counts().expect("ring");
            assert_eq!(usize::from(offered) + free, usize::from(entries), "every buffer back");
            assert_eq!(offered, window, "the window is full again");
            assert!(window > bufring::INITIAL_WINDOW, "the starved ring offered more");
            drop(clients);
        });
    }

    #[test]
    fn a_receive_that_finds_every_buffer_lent_out_waits_for_one_without_spinning() {
        run(async {
            // Two buffers, each held by a connection that has not let go of
            // what it received; a third connection's bytes have nowhere to
            // go until one comes back.
            register_receive_buffers(2, 1024).expect("buffer ring");
            let l = listen("127.0.0.1:0".parse().expect("addr")).expect("listen");
            let addr = l.local_addr().expect("addr");
            let mut pairs = Vec::new();
            for c in 0..3u8 {
                let cl = net::TcpStream::connect(addr).await.expect("connect");
                let (s, _) = l.accept().await.expect("accept");
                if c < 2 {
                    let (r, _) = cl.write_all(vec![c; 100]).await;
                    r.expect("write");
                }
                pairs.push((cl, s));
            }
            let mut rx0 = pairs[0].1.receiver();
            let mut rx1 = pairs[1].1.receiver();
            let held0 = rx0.recv().await.expect("recv");
            let held1 = rx1.recv().await.expect("recv");
            assert_eq!((held0[0], held1[0]), (0, 1));
            let dry = receive_dry_counter().expect("the reactor's counter");
            let third = pairs[2].1.clone();
            let waiter = spawn(async move {
                let mut rx = third.receiver();
                let got = rx.recv().await.expect("recv").to_vec();
                got
            });
            let (r, _) = pairs[2].0.write_all(vec![2; 100]).await;
            r.expect("write");
            sleep(Duration::from_millis(50)).await;
            // Re-armed on every turn, the receive met ENOBUFS thousands of
            // times here.
            assert_eq!(dry.load(std::sync::atomic::Ordering::Relaxed), 1, "the receive did not wait");
            drop(held0);
            assert_eq!(waiter.await, vec![2; 100]);
            assert_eq!(dry.load(std::sync::atomic::Ordering::Relaxed), 1);
            drop(held1);
        });
    }

    #[test]
    fn a_parked_receive_gives_every_buffer_back_and_loses_no_byte() {
        run(async {
            register_receive_buffers(64, 1024).expect("buffer ring");
            let l = listen("127.0.0.1:0".parse().expect("addr")).expect("listen");
            let addr = l.local_addr().expect("addr");
            let c = net::TcpStream::connect(addr).await.expect("connect");
            let (s, _) = l.accept().await.expect("accept");
            let data: Vec<u8> = (0..60_000u32).map(|i| (i % 251) as u8).collect();
            let mut rx = s.receiver();
            let (r, _) = c.write_all(data[..100].to_vec()).await;
            r.expect("write");
            let mut got = rx.recv().await.expect("recv").to_vec();
            // The receive stays armed while its task does something else
            // (as a connection waiting for its peer to read its replies)
            // and the peer sends 59 buffers' worth.
            let (r, _) = c.write_all(data[got.len()..].to_vec()).await;
            r.expect("write");
            sleep(Duration::from_millis(50)).await;
            let lent = || {
                let (offered, free, entries, _) = bufring::ring_counts().expect("ring");
                usize::from(entries) - usize::from(offered) - free
            };
            assert!(lent() > 16, "the burst took {} buffers", lent());
            rx.park().await;
            assert_eq!(lent(), 0, "a parked receive still holds buffers");
            while got.len() < data.len() {
                let b = rx.recv().await.expect("recv");
                assert!(!b.is_empty(), "early end");
                got.extend_from_slice(&b);
            }
            assert!(got == data, "bytes lost or out of order");
            drop(c);
            assert!(rx.recv().await.expect("recv").is_empty(), "the end of stream");
        });
    }

    #[test]
    fn received_bytes_held_past_their_runtime_stay_readable() {
        // A RecvBuf borrowing a leaked Receiver may be kept after the
        // runtime that filled it is dropped on the same thread; its ring
        // was unmapped under it (a read here faulted) before the ring
        // stayed mapped while buffers are lent.
        let sent: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        let (held, _peer) = run(async {
            register_receive_buffers(16, 4096).expect("buffer ring");
            let l = listen("127.0.0.1:0".parse().expect("addr")).expect("listen");
            let addr = l.local_addr().expect("addr");
            let c = net::TcpStream::connect(addr).await.expect("connect");
            let (s, _) = l.accept().await.expect("accept");
            let (r, _) = c.write_all(sent.clone()).await;
            r.expect("write");
            let rx: &'static mut bufring::Receiver = Box::leak(Box::new(s.receiver()));
            let got = rx.recv().await.expect("recv");
            (got, c)
        });
        assert!(!held.is_empty());
        assert_eq!(&held[..], &sent[..held.len()], "the bytes received, read after the runtime is gone");
        drop(held);
    }

    #[test]
    fn a_dropped_receive_is_cancelled_and_the_runtime_ends() {
        run(async {
            let l = listen("127.0.0.1:0".parse().expect("addr")).expect("listen");
            let addr = l.local_addr().expect("addr");
            let _c = net::TcpStream::connect(addr).await.expect("connect");
            let (s, _) = l.accept().await.expect("accept");
            // Nothing is ever sent: the read can only end by the timeout,
            // which drops (and cancels) it.
            let r = timeout(Duration::from_millis(20), s.read(vec![0u8; 64])).await;
            assert!(r.is_err());
        });
    }

    #[test]
    fn detached_tasks_reuse_the_storage_of_finished_ones() {
        run(async {
            let done = Rc::new(Cell::new(0usize));
            let start = |n: usize| {
                for _ in 0..n {
                    let d = done.clone();
                    spawn_detached(async move {
                        yield_now().await;
                        d.set(d.get() + 1);
                    });
                }
            };
            let spares = || crate::rt::with_core(|c| c.spare_task_count());
            let before = spares();
            let mut allocs_after_first = 0;
            for round in 1..=4 {
                let allocs = counting::allocs();
                start(8);
                while done.get() < 8 * round {
                    yield_now().await;
                }
                yield_now().await;
                if round > 1 {
                    allocs_after_first += counting::allocs() - allocs;
                }
                // Eight ran at once, so eight storages exist: each round
                // takes them and gives them back.
                assert_eq!(spares() - before, 8, "round {round}");
            }
            assert_eq!(allocs_after_first, 0, "allocations spawning tasks into reused storage");
        });
    }

    #[test]
    fn registered_sockets_close_when_dropped_while_others_keep_receiving() {
        run(async {
            let fixed = crate::rt::with_core(|c| c.features().fixed_files);
            let l = listen("127.0.0.1:0".parse().expect("addr")).expect("listen");
            let addr = l.local_addr().expect("addr");
            // A connection whose multishot receive stays armed throughout:
            // on kernels before 6.13 it would keep every socket registered
            // after it from closing, which is why they use descriptors.
            let old_client = net::TcpStream::connect(addr).await.expect("connect");
            let (old_server, _) = l.accept().await.expect("accept");
            assert_eq!(old_server.is_registered(), fixed);
            let mut old_rx = old_server.receiver();
            let armed = spawn(async move { old_rx.recv().await.expect("recv").to_vec() });
            yield_now().await;
            let in_use = crate::rt::with_core(|c| c.file_counts().0);
            for round in 0..64u32 {
                let client = net::TcpStream::connect(addr).await.expect("connect");
                let (server, _) = l.accept().await.expect("accept");
                assert_eq!((client.is_registered(), server.is_registered()), (fixed, fixed));
                let (r, _) = client.write_all(round.to_le_bytes().to_vec()).await;
                r.expect("write");
                let mut rx = server.receiver();
                assert_eq!(rx.recv().await.expect("recv").to_vec(), round.to_le_bytes());
                let (r, _) = server.write_all(b"bye".to_vec()).await;
                r.expect("reply");
                drop(rx);
                drop(server);
                // The peer sees the end of the stream: the dropped socket
                // really closed, its slot did not keep it open.
                let mut got = Vec::new();
                loop {
                    let (n, buf) = timeout(Duration::from_secs(5), client.read(vec![0u8; 16]))
                        .await
                        .expect("the dropped socket never closed");
                    let n = n.expect("read");
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                assert_eq!(got, b"bye");
            }
            // Every slot came back (the table did not grow by 128).
            yield_now().await;
            assert_eq!(crate::rt::with_core(|c| c.file_counts().0), in_use);
            let (r, _) = old_client.write_all(b"still here".to_vec()).await;
            r.expect("write");
            assert_eq!(armed.await, b"still here");
        });
    }

    fn pipe() -> (std::fs::File, std::fs::File) {
        use std::os::fd::FromRawFd;
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) }, 0);
        // SAFETY: two fresh descriptors, each owned once.
        unsafe { (std::fs::File::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1])) }
    }

    /// A file operation dropped before the turn submitted it is submitted
    /// as it drops, while its borrow still holds the descriptor: closing it
    /// then, and getting its number back for another file, must not
    /// redirect the write. (Pipes, because a pipe write completes as it is
    /// submitted, so the cancel that follows cannot hide where it went.)
    #[test]
    fn file_operation_dropped_unsubmitted_never_reaches_a_reused_descriptor() {
        use std::io::Read;
        use std::os::fd::{AsFd, AsRawFd};
        let (mut first, first_w) = pipe();
        let (mut second, second_w) = pipe();
        run(async {
            let number = first_w.as_raw_fd();
            let mut write = Box::pin(fs::write_at(first_w.as_fd(), b"for the first pipe".to_vec(), 0, false));
            // Polled once: queued on the ring, not yet handed to the kernel.
            std::future::poll_fn(|cx| {
                assert!(write.as_mut().poll(cx).is_pending());
                Poll::Ready(())
            })
            .await;
            drop(write);
            drop(first_w);
            // SAFETY: `dup` of a live descriptor; the copy is owned once.
            let taken =
                unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(libc::dup(second_w.as_raw_fd())) };
            assert_eq!(taken.as_raw_fd(), number, "the test needs the number reused");
            // Turns in which a write still queued would reach `taken`.
            sleep(Duration::from_millis(10)).await;
            drop(taken);
        });
        drop(second_w);
        let mut got = Vec::new();
        let _ = second.read_to_end(&mut got);
        assert!(got.is_empty(), "the dropped write reached the pipe that took its number: {got:?}");
        let mut got = Vec::new();
        let _ = first.read_to_end(&mut got);
        assert_eq!(got, b"for the first pipe");
    }

    /// A shared file takes one slot on the reactor that does I/O on it, and
    /// when it is dropped on another thread that reactor, asleep in the
    /// kernel with nothing to do, is woken to empty the slot: only then
    /// does the file close (the kernel reports its last close to inotify).
    #[test]
    fn shared_file_takes_one_slot_and_closes_when_dropped_on_another_thread() {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let path = std::env::temp_dir().join(format!("reactor-shared-{}", std::process::id()));
        let file = std::fs::File::options().read(true).write(true).create_new(true).open(&path).expect("create");
        let shared = std::sync::Arc::new(fs::SharedFile::new(file));
        // SAFETY: plain syscalls on a fresh descriptor and a NUL-terminated path.
        let inotify = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        assert!(inotify >= 0);
        let cpath = CString::new(path.as_os_str().as_bytes()).expect("path");
        // SAFETY: as above.
        let watch =
            unsafe { libc::inotify_add_watch(inotify, cpath.as_ptr(), libc::IN_CLOSE_WRITE | libc::IN_CLOSE_NOWRITE) };
        assert!(watch >= 0);
        let (done, ring_done) = crate::doorbell().expect("doorbell");
        let (tx, rx) = std::sync::mpsc::channel();
        let on_reactor = shared.clone();
        let reactor = std::thread::spawn(move || {
            let mut rt = Runtime::new(Config::default()).expect("runtime");
            if !rt.features().fixed_files {
                tx.send(None).expect("send");
                return None;
            }
            rt.block_on(async move {
                let before = crate::rt::with_core(|c| c.file_counts().0);
                let (w, _) = fs::write_at(&*on_reactor, b"shared".to_vec(), 0, false).await;
                assert_eq!(w.expect("write"), 6);
                let (n, buf) = fs::read_at(&*on_reactor, Vec::with_capacity(6), 0).await;
                assert_eq!(n.expect("read"), 6);
                assert_eq!(buf, b"shared");
                // One slot for both operations.
                assert_eq!(crate::rt::with_core(|c| c.file_counts().0), before + 1);
                drop(on_reactor);
                tx.send(Some(before)).expect("send");
                // Asleep until the test is over: no timer, no other work.
                done.wait().await.expect("doorbell");
                Some((before, crate::rt::with_core(|c| c.file_counts().0)))
            })
        });
        let ran = rx.recv().expect("reactor");
        drop(shared);
        let mut closed = false;
        if ran.is_some() {
            let mut pfd = libc::pollfd { fd: inotify, events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            closed = unsafe { libc::poll(&mut pfd, 1, 10_000) } == 1;
        }
        ring_done.ring();
        let counts = reactor.join().expect("reactor thread");
        // SAFETY: our descriptor, closed once.
        unsafe { libc::close(inotify) };
        let _ = std::fs::remove_file(&path);
        let Some((before, after)) = counts else {
            eprintln!("skipped: this kernel's io_uring has no registered file table for us");
            return;
        };
        assert!(closed, "the file stayed open: its reactor never emptied the slot");
        assert_eq!(after, before);
    }

    #[test]
    fn notify_all_wakes_every_waiter() {
        run(async {
            let event = std::rc::Rc::new(NotifyAll::default());
            let woken = std::rc::Rc::new(Cell::new(0));
            let waiters: Vec<_> = (0..3)
                .map(|_| {
                    let (event, woken) = (event.clone(), woken.clone());
                    spawn(async move {
                        event.wait().await;
                        woken.set(woken.get() + 1);
                    })
                })
                .collect();
            // Every waiter is asleep on the event before it fires.
            yield_now().await;
            assert_eq!(woken.get(), 0);
            event.notify();
            for w in waiters {
                w.await;
            }
            assert_eq!(woken.get(), 3);
        });
    }

    #[test]
    fn file_reads_and_writes_go_through_the_ring() {
        let path = std::env::temp_dir().join(format!("reactor-fs-{}", std::process::id()));
        use std::os::fd::AsFd;
        let file = std::fs::File::create_new(&path).expect("create");
        let r = run(async {
            let (w, _) = fs::write_at(file.as_fd(), b"hello ring".to_vec(), 4096, true).await;
            assert_eq!(w.expect("write"), 10);
            fs::sync(file.as_fd(), true).await.expect("fdatasync");
            let (n, buf) = fs::read_at(file.as_fd(), Vec::with_capacity(10), 4096).await;
            assert_eq!(n.expect("read"), 10);
            buf
        });
        let _ = std::fs::remove_file(&path);
        assert_eq!(r, b"hello ring");
    }
}
