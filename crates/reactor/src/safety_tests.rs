//! The loop's liveness and clock, and what happens to operations,
//! sockets, receive buffers and timers dropped after their result came or
//! kept past their runtime (helpers that make a runtime per `block_on` do
//! that).

use crate::*;
use std::cell::Cell;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};

fn run<F: Future>(f: F) -> F::Output {
    Runtime::new(Config::default()).expect("runtime").block_on(f)
}

/// Polls `f` once, so that its operation is queued.
async fn poll_once<F: Future + Unpin>(f: &mut F) {
    std::future::poll_fn(|cx| {
        assert!(std::pin::Pin::new(&mut *f).poll(cx).is_pending());
        Poll::Ready(())
    })
    .await
}

/// A `block_on` future that yields until a task's timer or I/O is done
/// (as `yield_now` loops do in tests and tools) must not starve the loop
/// of its timers and ring: before, each wake-up of the main future went
/// straight back to polling it, so nothing else but tasks ever ran.
#[test]
fn a_main_future_that_keeps_yielding_still_lets_timers_and_io_progress() {
    run(async {
        let slept = Rc::new(Cell::new(false));
        let s = slept.clone();
        spawn(async move {
            sleep(Duration::from_millis(5)).await;
            s.set(true);
        });
        let deadline = Instant::now() + Duration::from_secs(2);
        while !slept.get() {
            assert!(Instant::now() < deadline, "the task's timer never fired while the main future yielded");
            yield_now().await;
        }
        // The same for the ring: a receive a task waits on.
        let l = listen("127.0.0.1:0".parse().expect("addr")).expect("listen");
        let mut peer = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        std::io::Write::write_all(&mut peer, b"ping").expect("write");
        let got = Rc::new(Cell::new(0usize));
        let g = got.clone();
        spawn(async move {
            let (s, _) = l.accept().await.expect("accept");
            let (n, _) = s.read(vec![0u8; 16]).await;
            g.set(n.expect("read"));
        });
        let deadline = Instant::now() + Duration::from_secs(2);
        while got.get() == 0 {
            assert!(Instant::now() < deadline, "the task's I/O never completed while the main future yielded");
            yield_now().await;
        }
        assert_eq!(got.get(), 4);
    });
}

/// A doorbell wait dropped after its read took the ring (a `timeout` or
/// `race` that ended the same turn) must not lose that ring: the next
/// wait returns at once, as the doorbell promises ("at once if it was
/// rung since the last wait"). Before, the completed read's result went
/// with the dropped future and the next wait slept until another ring.
#[test]
fn a_doorbell_ring_taken_by_a_dropped_wait_wakes_the_next_wait() {
    run(async {
        let (bell, ringer) = doorbell().expect("doorbell");
        let mut first = Box::pin(bell.wait());
        poll_once(&mut first).await;
        ringer.ring();
        // Turns in which the read completes (its waker is this future's,
        // which is not polled again before it is dropped).
        sleep(Duration::from_millis(20)).await;
        drop(first);
        let again = timeout(Duration::from_secs(2), bell.wait()).await;
        assert!(again.is_ok(), "the ring the dropped wait took was lost");
        again.expect("woken").expect("read");
        // And a ring after that still wakes the next wait.
        ringer.ring();
        timeout(Duration::from_secs(2), bell.wait()).await.expect("rung again").expect("read");
    });
}

/// An accept dropped after the kernel accepted (its result not yet taken)
/// must close the connection it made: before, the descriptor was leaked,
/// and the peer's connection stayed open, unserved, for the process's
/// life.
#[test]
fn an_accept_dropped_after_it_accepted_closes_the_connection() {
    run(async {
        let l = listen("127.0.0.1:0".parse().expect("addr")).expect("listen");
        let mut accept = Box::pin(l.accept());
        poll_once(&mut accept).await;
        let mut peer = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        // Turns in which the accept completes; its future is not polled.
        sleep(Duration::from_millis(20)).await;
        drop(accept);
        peer.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
        let mut b = [0u8; 1];
        let r = std::io::Read::read(&mut peer, &mut b);
        assert!(matches!(r, Ok(0)), "the accepted connection was leaked open: {r:?}");
    });
}

/// A socket made under one runtime and used under the next on the same
/// thread (helpers that make a runtime per `block_on`) must not name its
/// old ring's file slot in the new ring, where that number is another
/// socket's: before, its send went out on the other connection.
#[test]
fn a_socket_kept_across_runtimes_never_sends_on_another_connection() {
    let fixed = Runtime::new(Config::default()).expect("runtime").features().fixed_files;
    if !fixed {
        eprintln!("skipped: no registered file table");
        return;
    }
    let l1 = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let mut peer1 = std::net::TcpStream::connect(l1.local_addr().expect("addr")).expect("connect");
    // Made under the first runtime: slot 0 of its ring.
    let first = run(async {
        let s = net::TcpStream::from_std(l1.accept().expect("accept").0);
        assert!(s.is_registered());
        s
    });
    assert!(!first.is_registered(), "no ring holds it now");
    let l2 = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let mut peer2 = std::net::TcpStream::connect(l2.local_addr().expect("addr")).expect("connect");
    peer2.set_read_timeout(Some(Duration::from_millis(300))).expect("timeout");
    peer1.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
    run(async {
        // Slot 0 of the second runtime's ring.
        let second = net::TcpStream::from_std(l2.accept().expect("accept").0);
        let _ = first.write_all(b"for peer 1".to_vec()).await;
        drop(first);
        let mut b = [0u8; 16];
        let leaked = std::io::Read::read(&mut peer2, &mut b).ok().filter(|&n| n > 0).map(|n| b[..n].to_vec());
        assert_eq!(leaked, None, "the first connection's bytes went to the second's peer");
        let n = std::io::Read::read(&mut peer1, &mut b).expect("peer 1 reads");
        assert_eq!(&b[..n], b"for peer 1");
        // The second connection still works (its slot was not emptied).
        second.write_all(b"for peer 2".to_vec()).await.0.expect("send");
        peer2.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
        let n = std::io::Read::read(&mut peer2, &mut b).expect("peer 2 reads");
        assert_eq!(&b[..n], b"for peer 2");
    });
}

/// An operation's future kept past its runtime and dropped under the next
/// one on the same thread must not cancel (or free the slot of) the new
/// runtime's operation that has the same slot number: before, the new
/// runtime's receive ended with ECANCELED, its buffer handed back while
/// the kernel's cancel was still on its way.
#[test]
fn an_operation_dropped_under_a_later_runtime_leaves_its_operations_alone() {
    let l1 = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let _peer1 = std::net::TcpStream::connect(l1.local_addr().expect("addr")).expect("connect");
    // The future is returned beside its (leaked) stream.
    let (stale, _stream) = run(async {
        let s: &'static net::TcpStream = Box::leak(Box::new(net::TcpStream::from_std(l1.accept().expect("accept").0)));
        let mut read = Box::pin(s.read(vec![0u8; 16]));
        poll_once(&mut read).await;
        (read, s)
    });
    let l2 = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let mut peer2 = std::net::TcpStream::connect(l2.local_addr().expect("addr")).expect("connect");
    run(async {
        let second = net::TcpStream::from_std(l2.accept().expect("accept").0);
        let mut read = Box::pin(second.read(vec![0u8; 16]));
        poll_once(&mut read).await;
        drop(stale);
        std::io::Write::write_all(&mut peer2, b"hello").expect("write");
        let (n, buf) = timeout(Duration::from_secs(2), read).await.expect("the read ended");
        assert_eq!(n.expect("the second runtime's read was cancelled by the first's"), 5);
        assert_eq!(buf, b"hello");
    });
}

/// A receive buffer held past its runtime and dropped under the next one
/// on the same thread goes back to no ring: before, it was given to the
/// new runtime's ring, which then offered that buffer number twice (two
/// receives could fill one buffer) or, where the new ring is smaller, a
/// number past its buffers (the kernel writing past its mapping).
#[test]
fn a_receive_buffer_dropped_under_a_later_runtime_is_not_given_to_its_ring() {
    let (held, _peer, _rx) = run(async {
        bufring::register_receive_buffers(16, 4096).expect("buffer ring");
        let l = listen("127.0.0.1:0".parse().expect("addr")).expect("listen");
        let c = net::TcpStream::connect(l.local_addr().expect("addr")).await.expect("connect");
        let (s, _) = l.accept().await.expect("accept");
        c.write_all(b"bytes".to_vec()).await.0.expect("write");
        let rx: &'static mut bufring::Receiver = Box::leak(Box::new(s.receiver()));
        let got = rx.recv().await.expect("recv");
        (got, c, s)
    });
    assert_eq!(&held[..], b"bytes");
    run(async move {
        bufring::register_receive_buffers(16, 4096).expect("buffer ring");
        let (offered, free, entries, _) = bufring::ring_counts().expect("ring");
        assert_eq!(usize::from(offered) + free, usize::from(entries));
        drop(held);
        let (offered, free, entries, _) = bufring::ring_counts().expect("ring");
        assert_eq!(usize::from(offered) + free, usize::from(entries), "a buffer of the old ring joined the new one");
    });
}

/// A sleep kept past its runtime and polled or dropped under the next one
/// on the same thread must leave that runtime's timers alone: before, its
/// (slot, generation) named the new runtime's first timer, so polling it
/// took that timer's waker and dropping it removed the timer, and the
/// task sleeping on it never woke.
#[test]
fn a_sleep_kept_past_its_runtime_leaves_the_next_runtimes_timers_alone() {
    // The sleep is carried out of its runtime, not awaited in it.
    #[allow(clippy::async_yields_async)]
    let stale = run(async {
        let mut s = Box::pin(sleep(Duration::from_secs(60)));
        poll_once(&mut s).await;
        s
    });
    run(async move {
        let mut stale = stale;
        let woke = Rc::new(Cell::new(false));
        let w = woke.clone();
        let _task = spawn(async move {
            sleep(Duration::from_millis(20)).await;
            w.set(true);
        });
        // The task takes this runtime's first timer.
        yield_now().await;
        poll_once(&mut stale).await;
        drop(stale);
        let start = Instant::now();
        while !woke.get() && start.elapsed() < Duration::from_secs(2) {
            yield_now().await;
        }
        assert!(woke.get(), "the task's 20 ms sleep never woke it");
    });
}

/// The loop's clock (`now_us`, `now_ms`) is the time of the current turn
/// only while a runtime turns: before, a `block_on`'s first poll saw the
/// time of the previous `block_on`'s last turn, and once the runtime was
/// dropped the thread's clock stood still for good (a deadline taken from
/// it then lies in the past, a wait for it to pass never ends).
#[test]
fn the_loop_clock_is_read_anew_when_a_block_on_starts_and_after_its_runtime_ends() {
    let mut rt = Runtime::new(Config::default()).expect("runtime");
    rt.block_on(yield_now());
    let t0 = now_us();
    std::thread::sleep(Duration::from_millis(30));
    let first_poll = rt.block_on(async { now_us() });
    assert!(first_poll - t0 >= 25_000, "a block_on's first poll saw the last one's time");
    drop(rt);
    let t1 = now_us();
    std::thread::sleep(Duration::from_millis(30));
    assert!(now_us() - t1 >= 25_000, "the clock stood still after the runtime ended");
}
