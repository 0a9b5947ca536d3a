//! One NVMe-oF connection, which is one NVMe queue: a thin async shell
//! around `nvmf_tcp::host::HostConnection` (NVMe/TCP) or
//! `nvmf_rdma::host::HostConnection` (NVMe/RDMA over iWARP, the RNIC's
//! work done in software over the same TCP socket).
//!
//! The queue is driven by whoever awaits it: [`Queue::submit`] only encodes
//! a command; [`Queue::next_completion`] sends what is queued and reads until
//! a completion is there. Many commands may be outstanding at once, up to
//! the depth the queue was connected with.

use crate::{Error, Result};
use nvme_spec::Sqe;
use nvmf_rdma::host::{HostConfig as RdmaConfig, HostConnection as RdmaConnection, MAX_KEYED_LEN};
use nvmf_tcp::host::{Completion, HostConfig, HostConnection};
use reactor::buf::{IoBufMut, SliceMut};
use reactor::net::TcpStream;
use rustc_hash::FxHashSet;
use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;

/// The NVMe-oF transport a queue connects over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// NVMe/TCP.
    #[default]
    Tcp,
    /// NVMe/RDMA over iWARP; `crc` asks for MPA CRC32C on every FPDU (used
    /// anyway when the controller asks).
    Rdma {
        /// Ask for CRC32C.
        crc: bool,
    },
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Tcp => f.write_str("tcp"),
            Transport::Rdma { crc: true } => f.write_str("rdma"),
            Transport::Rdma { crc: false } => f.write_str("rdma (crc off)"),
        }
    }
}

/// How to set up one connection.
#[derive(Clone, Copy, Debug)]
pub struct QueueOptions {
    /// The transport.
    pub transport: Transport,
    /// NVMe/RDMA: the queue ID and submission queue entries, which the
    /// connection request carries (NVMe/TCP tells them in Connect only).
    pub qid: u16,
    /// NVMe/RDMA: see `qid`.
    pub entries: u16,
    /// Ask for header digests (CRC32C over every PDU header).
    pub header_digest: bool,
    /// Ask for data digests (CRC32C over every PDU's data).
    pub data_digest: bool,
    /// Largest write sent in the command capsule; larger writes wait for the
    /// controller's R2T. 8 KiB on admin queues (TP 8000 section 3.3.2.2);
    /// on I/O queues IOCCSZ * 16 - 64.
    pub max_in_capsule: u32,
    /// Bound on every wait on the network.
    pub timeout: Duration,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            transport: Transport::Tcp,
            qid: 0,
            entries: 32,
            header_digest: false,
            data_digest: false,
            max_in_capsule: 8192,
            timeout: Duration::from_secs(10),
        }
    }
}

/// The protocol state of a queue.
enum Link {
    Tcp(HostConnection),
    /// With the buffer bytes are read into.
    Rdma(Box<RdmaConnection>, Vec<u8>),
}

/// A receive from the controller in flight. It outlives the call that
/// started it: [`Queue::flush`] receives while it sends (so that a
/// controller that stops reading until its replies are read cannot wedge
/// both ends), and what it left armed is the next receive's.
type PendingRead = Pin<Box<dyn Future<Output = (std::io::Result<usize>, SliceMut<Vec<u8>>)>>>;

/// One NVMe-oF connection.
pub struct Queue {
    stream: Rc<TcpStream>,
    /// The receive in flight, if any.
    reading: Option<PendingRead>,
    conn: Link,
    tx: Vec<u8>,
    /// Completions received and not yet returned: one at most per command
    /// in flight, as both connections end at a completion for a CID not in
    /// flight.
    ready: VecDeque<Completion>,
    in_flight: FxHashSet<u16>,
    next_cid: u16,
    depth: usize,
    timeout: Duration,
    failed: bool,
    peer: SocketAddr,
}

const RX_BUF: usize = 256 * 1024;

impl Queue {
    /// Opens a TCP connection to `addr` and exchanges ICReq/ICResp
    /// (NVMe/TCP) or the MPA request and reply with the CM private data
    /// (NVMe/RDMA).
    pub async fn connect(addr: SocketAddr, opts: QueueOptions) -> Result<Queue> {
        let stream = reactor::timeout(opts.timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| Error::Timeout { what: "TCP connect", after: opts.timeout })??;
        stream.set_nodelay(true)?;
        let (conn, what) = match opts.transport {
            Transport::Tcp => (
                Link::Tcp(HostConnection::new(HostConfig {
                    header_digest: opts.header_digest,
                    data_digest: opts.data_digest,
                    max_in_capsule: opts.max_in_capsule,
                })),
                "ICResp",
            ),
            Transport::Rdma { crc } => (
                Link::Rdma(
                    Box::new(RdmaConnection::new(RdmaConfig {
                        crc,
                        qid: opts.qid,
                        entries: opts.entries,
                        max_in_capsule: opts.max_in_capsule,
                        max_segment: stream
                            .mss()
                            .ok()
                            .and_then(|mss| iwarp::wire::segment_cap(mss as usize))
                            .map_or(RdmaConfig::default().max_segment, |cap| {
                                RdmaConfig::default().max_segment.min(cap)
                            }),
                        ..RdmaConfig::default()
                    })),
                    Vec::new(),
                ),
                "the MPA reply",
            ),
        };
        let mut q = Queue {
            stream: Rc::new(stream),
            reading: None,
            conn,
            tx: Vec::with_capacity(64 * 1024),
            ready: VecDeque::new(),
            in_flight: FxHashSet::default(),
            next_cid: 0,
            // Until Connect sets the real depth, the Connect itself.
            depth: 1,
            timeout: opts.timeout,
            failed: false,
            peer: addr,
        };
        q.flush().await?;
        while !q.is_ready() {
            q.receive(what).await?;
        }
        Ok(q)
    }

    fn is_ready(&self) -> bool {
        match &self.conn {
            Link::Tcp(c) => c.is_ready(),
            Link::Rdma(c, _) => c.is_ready(),
        }
    }

    /// The transport this queue speaks.
    pub fn transport(&self) -> Transport {
        match &self.conn {
            Link::Tcp(_) => Transport::Tcp,
            Link::Rdma(c, _) => Transport::Rdma { crc: c.crc() },
        }
    }

    /// The controller's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Most commands this queue lets be outstanding.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Sets the most commands outstanding at once: the queue size minus one
    /// (a full submission queue keeps one slot empty).
    pub fn set_depth(&mut self, depth: usize) {
        self.depth = depth.clamp(1, 65535);
    }

    /// The bound on every network wait.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Changes the bound on every network wait.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Commands submitted whose completion has not been returned.
    pub fn outstanding(&self) -> usize {
        self.in_flight.len()
    }

    /// Whether a transport error or timeout made the queue unusable.
    pub fn is_failed(&self) -> bool {
        self.failed
    }

    /// An empty data buffer with room for `capacity` bytes, reused from
    /// earlier commands when possible: fill it and pass it to
    /// [`submit`](Self::submit).
    pub fn buffer(&mut self, capacity: usize) -> Vec<u8> {
        match &mut self.conn {
            Link::Tcp(c) => c.buffer(capacity),
            Link::Rdma(c, _) => c.buffer(capacity),
        }
    }

    /// Hands a completion's data back for reuse by later commands.
    pub fn recycle(&mut self, data: Vec<u8>) {
        match &mut self.conn {
            Link::Tcp(c) => c.recycle(data),
            Link::Rdma(c, _) => c.recycle(data),
        }
    }

    /// Queues a command and returns its command identifier. Nothing is sent
    /// until the next [`flush`](Self::flush) or
    /// [`next_completion`](Self::next_completion). `write` is the command's
    /// data to the controller, `read_len` the bytes expected back.
    pub fn submit(&mut self, mut sqe: Sqe, write: Vec<u8>, read_len: u32) -> Result<u16> {
        if self.failed {
            return Err(Error::Invalid("queue failed earlier".into()));
        }
        if self.in_flight.len() >= self.depth {
            return Err(Error::Invalid(format!(
                "queue full: {} commands outstanding (depth {})",
                self.in_flight.len(),
                self.depth
            )));
        }
        if !write.is_empty() && read_len != 0 {
            return Err(Error::Invalid("bidirectional data transfers are not supported".into()));
        }
        let len = u32::try_from(write.len()).unwrap_or(u32::MAX).max(read_len);
        if matches!(self.conn, Link::Rdma(..)) && len > MAX_KEYED_LEN {
            return Err(Error::Invalid(format!("{len} bytes in one NVMe/RDMA command (at most {MAX_KEYED_LEN})")));
        }
        let cid = self.alloc_cid();
        sqe.cid = cid.into();
        match &mut self.conn {
            Link::Tcp(c) => c.submit(sqe, write, read_len),
            Link::Rdma(c, _) => c.submit(sqe, write, read_len),
        }
        Ok(cid)
    }

    fn alloc_cid(&mut self) -> u16 {
        loop {
            let cid = self.next_cid;
            self.next_cid = self.next_cid.wrapping_add(1);
            // CID 0xffff is avoided: some targets treat it as "no command".
            if cid != 0xffff && !self.in_flight.contains(&cid) {
                self.in_flight.insert(cid);
                return cid;
            }
        }
    }

    /// Sends every byte waiting to be sent, receiving meanwhile: the
    /// controller may stop reading until its replies are read (ironwire
    /// does past its send high-water mark), and a send that waited for it
    /// without reading would wait forever. Completions that arrive meanwhile
    /// are kept for [`next_completion`](Self::next_completion); data the
    /// connection queues in answer (H2CData, RDMA Read Responses) goes out
    /// next.
    pub async fn flush(&mut self) -> Result<()> {
        loop {
            let Some(tx) = self.take_tx() else { return Ok(()) };
            let stream = self.stream.clone();
            let mut write = std::pin::pin!(async move { stream.write_all(tx).await });
            let mut deadline = std::pin::pin!(reactor::sleep(self.timeout));
            loop {
                let mut read = match self.reading.take() {
                    Some(r) => r,
                    None => self.start_read(),
                };
                enum Step {
                    Wrote(std::io::Result<()>, Vec<u8>),
                    Read(std::io::Result<usize>, SliceMut<Vec<u8>>),
                    TimedOut,
                }
                let step = std::future::poll_fn(|cx| {
                    if let Poll::Ready((r, tx)) = write.as_mut().poll(cx) {
                        return Poll::Ready(Step::Wrote(r, tx));
                    }
                    if let Poll::Ready((r, rx)) = read.as_mut().poll(cx) {
                        return Poll::Ready(Step::Read(r, rx));
                    }
                    if deadline.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Step::TimedOut);
                    }
                    Poll::Pending
                })
                .await;
                match step {
                    Step::Wrote(Ok(()), mut tx) => {
                        // The receive stays armed for the next one.
                        self.reading = Some(read);
                        tx.clear();
                        self.tx = tx;
                        break;
                    }
                    Step::Wrote(Err(e), _) => return self.fail(Error::Io(e)),
                    Step::Read(r, rx) => self.take_read(r, rx)?,
                    Step::TimedOut => {
                        return self.fail(Error::Timeout { what: "sending to the controller", after: self.timeout })
                    }
                }
            }
        }
    }

    /// What the connection queued to send, in the queue's send buffer;
    /// `None` (the buffer kept) when there is nothing.
    fn take_tx(&mut self) -> Option<Vec<u8>> {
        let mut tx = std::mem::take(&mut self.tx);
        tx.clear();
        match &mut self.conn {
            Link::Tcp(c) => c.take_transmit(&mut tx),
            Link::Rdma(c, _) => c.take_transmit(&mut tx),
        }
        if tx.is_empty() {
            self.tx = tx;
            return None;
        }
        Some(tx)
    }

    /// Starts a receive into the connection's buffer (NVMe/TCP: after what
    /// it already holds) or ours (NVMe/RDMA: the connection places payloads
    /// where they belong).
    fn start_read(&mut self) -> PendingRead {
        let (rx, at) = match &mut self.conn {
            Link::Tcp(c) => {
                let rx = c.receive_buffer(RX_BUF);
                let at = rx.len();
                (rx, at)
            }
            Link::Rdma(_, buf) => {
                let mut rx = std::mem::take(buf);
                rx.clear();
                rx.reserve(RX_BUF);
                (rx, 0)
            }
        };
        let room = rx.capacity();
        let stream = self.stream.clone();
        Box::pin(async move { stream.read(rx.slice_mut(at..room)).await })
    }

    /// Feeds what a receive brought to the connection and keeps the
    /// completions that came with it. An error fails the queue (a Terminate
    /// the connection queued on its way out is left to send).
    fn take_read(&mut self, res: std::io::Result<usize>, rx: SliceMut<Vec<u8>>) -> Result<()> {
        let rx = match res {
            Ok(0) => return self.fail(Error::Closed),
            Ok(_) => rx.into_inner(),
            Err(e) => return self.fail(Error::Io(e)),
        };
        // Completions that arrived; R2Ts or RDMA Read Requests may have
        // queued data to send.
        let r = match &mut self.conn {
            Link::Tcp(c) => c.received(rx).map_err(Error::Fatal).map(|()| {
                while let Some(done) = c.poll_completion() {
                    self.ready.push_back(done);
                }
            }),
            Link::Rdma(c, buf) => {
                let r = c.handle_input(&rx).map_err(Error::Rdma);
                *buf = rx;
                while let Some((cqe, data)) = c.poll_completion() {
                    self.ready.push_back(Completion { cqe, data });
                }
                r
            }
        };
        match r {
            Ok(()) => Ok(()),
            Err(e) => self.fail(e),
        }
    }

    fn fail<T>(&mut self, e: Error) -> Result<T> {
        self.failed = true;
        Err(e)
    }

    /// Receives once (the receive [`flush`](Self::flush) left armed, or a
    /// new one) and feeds the bytes to the connection, then sends what it
    /// queued in answer.
    async fn receive(&mut self, what: &'static str) -> Result<()> {
        if self.failed {
            return Err(Error::Invalid("queue failed earlier".into()));
        }
        let read = match self.reading.take() {
            Some(r) => r,
            None => self.start_read(),
        };
        let (res, rx) = match reactor::timeout(self.timeout, read).await {
            Ok(got) => got,
            Err(_) => return self.fail(Error::Timeout { what, after: self.timeout }),
        };
        if let Err(e) = self.take_read(res, rx) {
            // Send what the connection queued on its way out (a Terminate).
            let _ = self.send_remaining().await;
            return Err(e);
        }
        self.flush().await
    }

    /// Sends what the connection queued, without receiving (for a queue
    /// that failed: its Terminate).
    async fn send_remaining(&mut self) -> Result<()> {
        let Some(tx) = self.take_tx() else { return Ok(()) };
        match reactor::timeout(self.timeout, self.stream.write_all(tx)).await {
            Ok((Ok(()), _)) => Ok(()),
            Ok((Err(e), _)) => Err(Error::Io(e)),
            Err(_) => Err(Error::Timeout { what: "sending to the controller", after: self.timeout }),
        }
    }

    /// The next completion of any outstanding command (in arrival order).
    pub async fn next_completion(&mut self) -> Result<Completion> {
        loop {
            if let Some(c) = self.ready.pop_front() {
                self.in_flight.remove(&c.cqe.cid.get());
                return Ok(c);
            }
            if self.in_flight.is_empty() {
                return Err(Error::Invalid("no command outstanding".into()));
            }
            self.flush().await?;
            // Sending may have brought completions in.
            if self.ready.is_empty() {
                self.receive("a completion").await?;
            }
        }
    }

    /// Submits one command and waits for its completion, keeping any other
    /// completion that arrives meanwhile for [`next_completion`]. The
    /// completion is returned whatever its status.
    ///
    /// [`next_completion`]: Self::next_completion
    pub async fn execute_raw(&mut self, sqe: Sqe, write: Vec<u8>, read_len: u32) -> Result<Completion> {
        let cid = self.submit(sqe, write, read_len)?;
        loop {
            if let Some(pos) = self.ready.iter().position(|c| c.cqe.cid.get() == cid) {
                if let Some(c) = self.ready.remove(pos) {
                    self.in_flight.remove(&cid);
                    return Ok(c);
                }
            }
            self.flush().await?;
            self.receive("a completion").await?;
        }
    }

    /// Like [`execute_raw`](Self::execute_raw), but a non-success status is
    /// returned as [`Error::Status`].
    pub async fn execute(&mut self, sqe: Sqe, write: Vec<u8>, read_len: u32) -> Result<Completion> {
        let c = self.execute_raw(sqe, write, read_len).await?;
        check(c)
    }
}

/// Turns a completion with a non-success status into [`Error::Status`].
pub fn check(c: Completion) -> Result<Completion> {
    let s = c.cqe.status();
    if s.is_success() {
        Ok(c)
    } else {
        Err(Error::Status(s))
    }
}
