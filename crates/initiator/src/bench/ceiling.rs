//! The network ceiling: a bare TCP request/response loop with the storage
//! protocol taken out, so every figure can be shown as a fraction of what
//! the path itself allows. A read is a 64-byte command answered with
//! `block_size` bytes; a write is a 64-byte command plus `block_size` bytes
//! answered with 16. Each job is one connection kept at `qd` requests in
//! flight, sent in batches as completions free slots (as the NVMe/TCP host
//! batches). The [`Peer`] answers from its own thread and runtime.
//!
//! The command: byte 0 is the opcode (1 read, 2 write), bytes 4..8 the
//! payload length (little-endian); the rest is zero. Nothing here is
//! checked beyond lengths: the peer trusts its one client.

use super::{merge, plan, BenchOptions, Report, Tally, Workload};
use crate::{Error, Result};
use reactor::buf::IoBuf as _;
use reactor::net::{TcpListener, TcpStream};
use reactor::Notify;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Instant;

/// Bytes of a command.
pub const COMMAND_BYTES: usize = 64;
/// Bytes of a write's answer.
pub const WRITE_ANSWER_BYTES: usize = 16;
const OP_READ: u8 = 1;
const OP_WRITE: u8 = 2;
/// Bytes read from or written to a socket at a time.
const CHUNK: usize = 256 << 10;

/// The echo peer: a thread with its own runtime that answers every
/// connection on its address until the process ends.
#[derive(Debug)]
pub struct Peer {
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Peer {
    /// Starts the peer on 127.0.0.1 (an ephemeral port); `setup` runs first
    /// on the peer's thread (to pin it, for example).
    pub fn spawn(setup: impl FnOnce() + Send + 'static) -> std::io::Result<Peer> {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = std_listener.local_addr()?;
        std_listener.set_nonblocking(true)?;
        std::thread::Builder::new().name("ceiling-peer".into()).spawn(move || {
            setup();
            let rt = reactor::Runtime::new(reactor::Config::default());
            let mut rt = match rt {
                Ok(rt) => rt,
                Err(e) => return log::error!("ceiling peer: io_uring runtime failed: {e}"),
            };
            rt.block_on(async move {
                let listener = TcpListener::from_std(std_listener);
                while let Ok((s, _)) = listener.accept().await {
                    reactor::spawn(async move {
                        if let Err(e) = answer(s).await {
                            log::debug!("ceiling peer connection: {e}");
                        }
                    });
                }
            });
        })?;
        Ok(Peer { addr })
    }
}

/// What the peer's reader tells its writer.
#[derive(Default)]
struct Owed {
    bytes: Cell<usize>,
    eof: Cell<bool>,
    ready: Notify,
}

async fn answer(s: TcpStream) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let (rd, wr) = s.into_split();
    let owed = Rc::new(Owed::default());
    let o = owed.clone();
    let writer = reactor::spawn(async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = o.bytes.get().min(CHUNK);
            if n == 0 {
                if o.eof.get() {
                    return wr.shutdown_write();
                }
                o.ready.wait().await;
                continue;
            }
            let (res, b) = wr.write_all(buf.slice(..n)).await;
            buf = b.into_inner();
            res?;
            o.bytes.set(o.bytes.get() - n);
        }
    });
    let mut buf = vec![0u8; CHUNK];
    let mut header = [0u8; COMMAND_BYTES];
    let (mut have, mut payload_left, mut in_write) = (0usize, 0usize, false);
    loop {
        let (res, b) = rd.read(buf).await;
        buf = b;
        let n = res?;
        if n == 0 {
            break;
        }
        let mut data = buf.get(..n).unwrap_or_default();
        while !data.is_empty() {
            if payload_left > 0 {
                let take = payload_left.min(data.len());
                payload_left -= take;
                data = data.get(take..).unwrap_or_default();
                if payload_left == 0 && in_write {
                    in_write = false;
                    owed.bytes.set(owed.bytes.get() + WRITE_ANSWER_BYTES);
                }
                continue;
            }
            let take = (COMMAND_BYTES - have).min(data.len());
            if let (Some(dst), Some(src)) = (header.get_mut(have..have + take), data.get(..take)) {
                dst.copy_from_slice(src);
            }
            have += take;
            data = data.get(take..).unwrap_or_default();
            if have == COMMAND_BYTES {
                have = 0;
                let len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
                if header[0] == OP_WRITE {
                    in_write = true;
                    payload_left = len;
                    if len == 0 {
                        in_write = false;
                        owed.bytes.set(owed.bytes.get() + WRITE_ANSWER_BYTES);
                    }
                } else {
                    owed.bytes.set(owed.bytes.get() + len);
                }
            }
        }
        owed.ready.notify();
    }
    owed.eof.set(true);
    owed.ready.notify();
    writer.await
}

/// Runs the workload against a ceiling peer at `opts.addr` (`opts.jobs`
/// connections; NQNs, nsid, digests, offset, size and verify unused).
pub async fn run(opts: &BenchOptions) -> Result<Report> {
    if opts.jobs == 0 || opts.qd == 0 || opts.block_size == 0 {
        return Err(Error::Invalid("jobs, qd and block size must be > 0".into()));
    }
    let opts = BenchOptions { verify: false, offset: 0, size: None, ..opts.clone() };
    let mut streams = Vec::new();
    for _ in 0..opts.jobs {
        let s = TcpStream::connect(opts.addr).await?;
        s.set_nodelay(true)?;
        streams.push(s);
    }
    // The "namespace" is only there to pick reads and writes from.
    let work = plan(&opts, streams.len(), opts.block_size, u64::from(opts.block_size) << 10)?;
    let start = work.first().map_or_else(Instant::now, |w| w.tally.finished);
    let mut handles = Vec::new();
    for (w, s) in work.into_iter().zip(streams) {
        handles.push(reactor::spawn(connection(s, w, opts.qd as usize)));
    }
    let mut results = Vec::new();
    for h in handles {
        results.push(h.await?);
    }
    Ok(merge(&opts, &results, start))
}

struct Client {
    w: Workload,
    in_flight: VecDeque<(bool, Instant)>,
    credits: usize,
}

async fn connection(s: TcpStream, w: Workload, qd: usize) -> Result<Tally> {
    let bs = w.io_bytes() as usize;
    let (rd, wr) = s.into_split();
    let c = Rc::new(RefCell::new(Client { w, in_flight: VecDeque::with_capacity(qd), credits: qd }));
    let ready = Rc::new(Notify::default());
    let (cw, ready_w) = (c.clone(), ready.clone());
    let writer = reactor::spawn(async move {
        let mut batch: Vec<u8> = Vec::new();
        loop {
            let n = cw.borrow().credits;
            if n == 0 {
                ready_w.wait().await;
                continue;
            }
            batch.clear();
            {
                let mut c = cw.borrow_mut();
                let now = Instant::now();
                if now >= c.w.end {
                    break;
                }
                for _ in 0..n {
                    let io = c.w.pick();
                    let mut cmd = [0u8; COMMAND_BYTES];
                    cmd[0] = if io.write { OP_WRITE } else { OP_READ };
                    cmd[4..8].copy_from_slice(&(bs as u32).to_le_bytes());
                    batch.extend_from_slice(&cmd);
                    if io.write {
                        batch.resize(batch.len() + bs, 0xa5);
                    }
                    c.in_flight.push_back((io.write, now));
                }
                c.credits = 0;
            }
            let (res, b) = wr.write_all(batch).await;
            batch = b;
            res?;
        }
        wr.shutdown_write()
    });
    let mut buf = vec![0u8; CHUNK];
    let mut have = 0usize;
    loop {
        let (res, b) = rd.read(buf).await;
        buf = b;
        let n = res?;
        if n == 0 {
            break;
        }
        have += n;
        let now = Instant::now();
        let mut c = c.borrow_mut();
        let mut freed = 0;
        while let Some(&(write, submitted)) = c.in_flight.front() {
            let need = if write { WRITE_ANSWER_BYTES } else { bs };
            if have < need {
                break;
            }
            have -= need;
            c.in_flight.pop_front();
            let io = super::Io { write, slot: 0, lba: 0, gen: 0 };
            c.w.complete(&io, submitted, now, &[]);
            freed += 1;
        }
        c.w.tally.finished = now;
        if freed > 0 {
            c.credits += freed;
            ready.notify();
        }
    }
    writer.await?;
    let mut c = c.borrow_mut();
    if !c.in_flight.is_empty() {
        return Err(Error::Closed);
    }
    let finished = c.w.tally.finished;
    c.w.finish(finished);
    Ok(std::mem::replace(&mut c.w.tally, Tally::new(finished)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Pattern;
    use std::time::Duration;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        reactor::Runtime::new(reactor::Config::default()).expect("runtime").block_on(f)
    }

    #[test]
    fn ceiling_loop_completes_reads_and_writes_with_consistent_counts() {
        let peer = Peer::spawn(|| {}).expect("peer");
        for (pattern, bs) in [(Pattern::RandRead, 4096u32), (Pattern::RandWrite, 65536), (Pattern::RandRw, 16384)] {
            let opts = BenchOptions {
                addr: peer.addr,
                pattern,
                block_size: bs,
                qd: 8,
                jobs: 2,
                runtime: Duration::from_millis(200),
                ramp: Duration::from_millis(50),
                ..BenchOptions::default()
            };
            let r = block_on(run(&opts)).expect("ceiling run");
            assert!(r.ios > 0, "{r}");
            assert_eq!(r.reads + r.writes, r.ios);
            assert_eq!(r.bytes, r.ios * u64::from(bs));
            assert_eq!(r.histogram.len(), r.ios);
            assert_eq!(pattern == Pattern::RandRead, r.writes == 0, "{r}");
        }
    }
}
