//! A broken or hostile controller answers an awaited command with endless
//! completions for commands that are not in flight. Each would be kept for
//! a later `next_completion` that never asks for it, so the queue's list
//! of completions grew for as long as the controller kept sending; such a
//! completion now ends the connection, as it does over NVMe/RDMA and in the
//! Linux host.

use initiator::{cmd, Error, Queue, QueueOptions, Transport};
use nvme_spec::{Cqe, Status};
use nvmf_tcp::target::{Event, TargetConfig, TargetConnection};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

/// Completions for commands not in flight sent before the real one.
const BOGUS: u16 = 10_000;

/// Serves one connection: answers its first command with `BOGUS`
/// completions for other CIDs, then with its own, and waits for the host
/// to close.
fn controller(listener: TcpListener) {
    let (mut sock, _) = listener.accept().expect("accept");
    let mut t = TargetConnection::<Vec<u8>>::new(TargetConfig::default());
    t.set_queue(1, 63, false);
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = Vec::new();
    let mut answered = false;
    loop {
        let n = sock.read(&mut buf).unwrap_or(0);
        if n == 0 {
            return;
        }
        t.handle_input(&buf[..n]).expect("host input");
        while let Some(ev) = t.poll_event() {
            let Event::Command { sqe, .. } = ev else { panic!("unexpected {ev:?}") };
            let cid = sqe.cid.get();
            for other in (0..BOGUS).map(|i| cid.wrapping_add(1000).wrapping_add(i)) {
                t.send_response(Cqe::new(other, Status::SUCCESS, 0));
            }
            t.send_response(Cqe::new(cid, Status::SUCCESS, 0));
            answered = true;
        }
        out.clear();
        t.take_transmit(&mut out);
        if sock.write_all(&out).is_err() && answered {
            return;
        }
    }
}

#[test]
fn a_completion_for_a_command_not_in_flight_fails_the_queue() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let target = std::thread::spawn(move || controller(listener));
    let mut rt = reactor::Runtime::new(reactor::Config::default()).expect("io_uring runtime");
    let r = rt.block_on(async move {
        let opts =
            QueueOptions { transport: Transport::Tcp, timeout: Duration::from_secs(10), ..QueueOptions::default() };
        let mut q = Queue::connect(addr, opts).await.expect("connect");
        let r = q.execute_raw(cmd::flush(1), Vec::new(), 0).await.map(|c| c.cqe);
        (r, q.is_failed())
    });
    match r {
        (Err(Error::Fatal(e)), true) => assert!(e.reason.contains("not in flight"), "{e}"),
        other => panic!("expected a failed queue, got {other:?}"),
    }
    target.join().expect("the controller thread");
}
