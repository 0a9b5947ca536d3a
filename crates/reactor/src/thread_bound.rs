//! What stays on a reactor's thread, and buffers read into past their
//! length: tests of soundness rules the types alone cannot show (the
//! types that must not leave their thread are checked by the
//! `compile_fail` examples on `fs::read_at` and `RecvBuf`).

use crate::*;
use std::os::fd::{AsFd, FromRawFd};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::Duration;

/// A blocking pipe (reads wait for data in the kernel).
fn blocking_pipe() -> (std::fs::File, std::fs::File) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: two fresh descriptors, each owned once.
    unsafe { (std::fs::File::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1])) }
}

/// A read of 4 bytes into `Vec::with_capacity(64).slice_mut(16..)`: the
/// Vec comes back 20 bytes long, and its first 16, which nobody wrote,
/// are zeros (before, they were whatever the heap held: uninitialized
/// bytes handed out by safe code).
#[test]
fn a_read_into_a_slice_past_the_length_zeroes_the_gap() {
    use std::io::Write;
    let (r, mut w) = blocking_pipe();
    w.write_all(b"data").expect("write");
    let mut rt = Runtime::new(Config::default()).expect("runtime");
    let v = rt.block_on(async {
        let buf: Vec<u8> = Vec::with_capacity(64);
        let (n, s) = fs::read_at(r.as_fd(), buf::IoBufMut::slice_mut(buf, 16..), 0).await;
        assert_eq!(n.expect("read"), 4);
        s.into_inner()
    });
    assert_eq!(v.len(), 20);
    assert!(v[..16].iter().all(|&b| b == 0) && &v[16..] == b"data", "{v:?}");
}

/// Task wakers are `Send` (every `Waker` is) but belong to their
/// reactor's thread. Woken on another reactor's thread, one must not
/// schedule the task that reactor has at the same index (before, it did,
/// and the wake-up of its own task was lost without a word); it is
/// refused with an error line.
#[test]
fn a_task_waker_woken_on_another_reactor_schedules_nothing_there() {
    let shared: Arc<Mutex<Option<Waker>>> = Arc::new(Mutex::new(None));
    let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (s2, f2) = (shared.clone(), flag.clone());
    let b = std::thread::spawn(move || {
        let mut rt = Runtime::new(Config::default()).expect("runtime b");
        rt.block_on(async move {
            let polls = std::rc::Rc::new(std::cell::Cell::new(0u32));
            let p = polls.clone();
            // Task 0, generation 1 of reactor B: never woken by anything.
            let _t = spawn(std::future::poll_fn(move |_| {
                p.set(p.get() + 1);
                Poll::<()>::Pending
            }));
            yield_now().await;
            assert_eq!(polls.get(), 1);
            let w = loop {
                if let Some(w) = s2.lock().expect("lock").take() {
                    break w;
                }
                sleep(Duration::from_millis(1)).await;
            };
            f2.store(true, std::sync::atomic::Ordering::SeqCst);
            w.wake(); // reactor A's task 0's waker, on B's thread
            yield_now().await;
            yield_now().await;
            polls.get()
        })
    });
    let mut rt = Runtime::new(Config::default()).expect("runtime a");
    let woken = rt.block_on(async move {
        let t = spawn(std::future::poll_fn(move |cx| {
            if flag.load(std::sync::atomic::Ordering::SeqCst) {
                return Poll::Ready(());
            }
            *shared.lock().expect("lock") = Some(cx.waker().clone());
            Poll::Pending
        }));
        timeout(Duration::from_millis(500), t).await.is_ok()
    });
    let b_polls = b.join().expect("thread b");
    assert_eq!(b_polls, 1, "reactor B's unrelated task was polled by A's waker");
    assert!(!woken, "no cross-thread wake-up path: A's task stays unwoken (use a Doorbell)");
}
