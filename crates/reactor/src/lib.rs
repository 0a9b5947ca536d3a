//! Thread-per-core reactors on io_uring (monoio's io_uring driver).
//!
//! Each reactor is one OS thread pinned to one core, with its own ring, its
//! own listener socket (SO_REUSEPORT, so the kernel spreads connections over
//! the reactors without a shared accept queue), and its own buffer pool
//! (`blockdev::IoBuf`). A connection lives on the reactor that accepted it
//! until it closes. Nothing here knows a storage protocol.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

/// One reactor's identity, handed to the code it runs.
#[derive(Clone, Copy, Debug)]
pub struct ReactorId {
    /// Index of the reactor (0-based).
    pub index: usize,
    /// The CPU it is pinned to, if pinning succeeded.
    pub cpu: Option<usize>,
}

/// Milliseconds on a monotonic clock that started with the process: the
/// `now` the sans-IO protocol code is given.
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
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
/// io_uring runtime. Returns the join handles.
pub fn start<F, Fut>(cpus: &[usize], ring_entries: u32, main: F) -> std::io::Result<Vec<std::thread::JoinHandle<()>>>
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
            let rt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
                .with_entries(ring_entries)
                .enable_timer()
                .build();
            match rt {
                Ok(mut rt) => rt.block_on(main(ReactorId { index, cpu: pinned })),
                Err(e) => log::error!("reactor {index}: io_uring runtime failed to start: {e}"),
            }
        })?;
        handles.push(h);
    }
    Ok(handles)
}

/// A TCP listener bound with SO_REUSEPORT (so every reactor can bind the
/// same address) and SO_REUSEADDR, non-blocking, for the calling reactor.
pub fn listen(addr: SocketAddr) -> std::io::Result<monoio::net::TcpListener> {
    let opts = monoio::net::ListenerOpts::new().reuse_port(true).reuse_addr(true).backlog(1024);
    monoio::net::TcpListener::bind_with_config(addr, &opts)
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

/// Sleeps on the reactor's timer.
pub async fn sleep(d: Duration) {
    monoio::time::sleep(d).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn notify_collapses_wakeups_and_wakes_a_waiter() {
        let mut rt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new().enable_timer().build().expect("runtime");
        rt.block_on(async {
            let n = Rc::new(Notify::default());
            n.notify();
            n.notify();
            n.wait().await; // one pending notification
            let n2 = n.clone();
            let t = monoio::spawn(async move {
                n2.wait().await;
                7
            });
            sleep(Duration::from_millis(5)).await;
            n.notify();
            assert_eq!(t.await, 7);
        });
    }

    #[test]
    fn reactors_run_pinned_and_report_their_index() {
        let cpus = available_cpus();
        assert!(!cpus.is_empty());
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = seen.clone();
        let handles = start(&cpus, 64, move |id| {
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
    fn two_listeners_share_one_port() {
        let mut rt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new().build().expect("runtime");
        rt.block_on(async {
            let a = listen("127.0.0.1:0".parse().expect("addr")).expect("first");
            let addr = a.local_addr().expect("addr");
            let b = listen(addr).expect("second bind with SO_REUSEPORT");
            assert_eq!(b.local_addr().expect("addr"), addr);
        });
    }
}
