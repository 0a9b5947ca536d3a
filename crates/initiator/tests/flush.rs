//! A queue receives while it sends. The controller here (the sans-IO
//! NVMe/TCP target over a blocking socket) does what ironwire's target does
//! past its send high-water mark: it stops reading until its replies are
//! read. The host has 24 MiB of in-capsule writes to send and 24 MiB of read
//! data coming, more than the loopback socket buffers hold either way: a
//! host that sent everything before reading again would wait on a
//! controller waiting on it.

use initiator::{cmd, Queue, QueueOptions, Transport};
use nvme_spec::{Cqe, Status};
use nvmf_tcp::target::{Event, TargetConfig, TargetConnection};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

const MIB: usize = 1 << 20;
const EACH: usize = 24;

/// Serves one connection: answers the first `EACH` reads all at once, with
/// one blocking write of everything, before it reads anything more; then
/// answers the writes as they come.
fn controller(listener: TcpListener) {
    let (mut sock, _) = listener.accept().expect("accept");
    let cfg = TargetConfig { max_in_capsule: MIB as u32, ..TargetConfig::default() };
    let mut t = TargetConnection::<Vec<u8>>::new(cfg);
    t.set_queue(1, 63, false);
    let (mut reads, mut writes, mut burst_sent) = (0usize, 0usize, false);
    let mut buf = vec![0u8; 256 * 1024];
    let mut out = Vec::new();
    while writes < EACH {
        let n = sock.read(&mut buf).expect("read");
        assert!(n > 0, "the host closed early");
        t.handle_input(&buf[..n]).expect("host input");
        while let Some(ev) = t.poll_event() {
            let Event::Command { sqe, data } = ev else { panic!("unexpected {ev:?}") };
            let cid = sqe.cid.get();
            if sqe.opcode == 0x02 {
                reads += 1;
                t.send_data(cid, &vec![0x5a; MIB], Cqe::new(cid, Status::SUCCESS, 0));
            } else {
                assert_eq!(data.map(|d| d.len()), Some(MIB), "a write's data in its capsule");
                writes += 1;
                t.send_response(Cqe::new(cid, Status::SUCCESS, 0));
            }
        }
        // The first reads' data goes out in one blocking write, all of it,
        // before anything more is read (once the host's writes have begun
        // to arrive, so that both directions are full).
        if !burst_sent && reads > 0 && reads < EACH {
            continue;
        }
        burst_sent |= reads == EACH;
        out.clear();
        t.take_transmit(&mut out);
        sock.write_all(&out).expect("write");
    }
}

#[test]
fn a_queue_receives_while_it_sends() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let target = std::thread::spawn(move || controller(listener));
    let rt = reactor::Runtime::new(reactor::Config::default()).expect("io_uring runtime");
    let done = rt_block_on(rt, async move {
        let opts = QueueOptions {
            transport: Transport::Tcp,
            qid: 1,
            entries: 64,
            max_in_capsule: MIB as u32,
            timeout: Duration::from_secs(10),
            ..QueueOptions::default()
        };
        let mut q = Queue::connect(addr, opts).await.expect("connect");
        q.set_depth(2 * EACH);
        for i in 0..EACH {
            q.submit(cmd::read(1, (i * 256) as u64, 256), Vec::new(), MIB as u32).expect("submit read");
        }
        for i in 0..EACH {
            q.submit(cmd::write(1, (i * 256) as u64, 256), vec![0xa5; MIB], 0).expect("submit write");
        }
        let mut read_bytes = 0usize;
        for _ in 0..2 * EACH {
            let c = q.next_completion().await.expect("a completion, not a wedged queue");
            assert!(c.cqe.status().is_success(), "{}", c.cqe.status());
            assert!(c.data.iter().all(|&b| b == 0x5a));
            read_bytes += c.data.len();
        }
        read_bytes
    });
    assert_eq!(done, EACH * MIB);
    target.join().expect("the controller thread");
}

fn rt_block_on<F: std::future::Future>(mut rt: reactor::Runtime, f: F) -> F::Output {
    rt.block_on(async move { reactor::timeout(Duration::from_secs(60), f).await.expect("test body timed out") })
}
