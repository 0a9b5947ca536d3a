//! One NVMe/TCP connection, which is one NVMe queue: a thin async shell
//! around `nvmf_tcp::host::HostConnection`.
//!
//! The queue is driven by whoever awaits it: [`Queue::submit`] only encodes
//! a command; [`Queue::next_completion`] sends what is queued and reads until
//! a completion is there. Many commands may be outstanding at once, up to
//! the depth the queue was connected with.

use crate::{Error, Result};
use nvme_spec::Sqe;
use nvmf_tcp::host::{Completion, HostConfig, HostConnection};
use reactor::buf::IoBufMut;
use reactor::net::TcpStream;
use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

/// How to set up one connection.
#[derive(Clone, Copy, Debug)]
pub struct QueueOptions {
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
            header_digest: false,
            data_digest: false,
            max_in_capsule: 8192,
            timeout: Duration::from_secs(10),
        }
    }
}

/// One NVMe/TCP connection.
pub struct Queue {
    stream: TcpStream,
    conn: HostConnection,
    tx: Vec<u8>,
    ready: VecDeque<Completion>,
    in_flight: HashSet<u16>,
    next_cid: u16,
    depth: usize,
    timeout: Duration,
    failed: bool,
    peer: SocketAddr,
}

const RX_BUF: usize = 256 * 1024;

impl Queue {
    /// Opens a TCP connection to `addr` and exchanges ICReq/ICResp.
    pub async fn connect(addr: SocketAddr, opts: QueueOptions) -> Result<Queue> {
        let stream = reactor::timeout(opts.timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| Error::Timeout { what: "TCP connect", after: opts.timeout })??;
        stream.set_nodelay(true)?;
        let conn = HostConnection::new(HostConfig {
            header_digest: opts.header_digest,
            data_digest: opts.data_digest,
            max_in_capsule: opts.max_in_capsule,
        });
        let mut q = Queue {
            stream,
            conn,
            tx: Vec::with_capacity(64 * 1024),
            ready: VecDeque::new(),
            in_flight: HashSet::new(),
            next_cid: 0,
            // Until Connect sets the real depth, the Connect itself.
            depth: 1,
            timeout: opts.timeout,
            failed: false,
            peer: addr,
        };
        q.flush().await?;
        while !q.conn.is_ready() {
            q.receive("ICResp").await?;
        }
        Ok(q)
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
        self.conn.buffer(capacity)
    }

    /// Hands a completion's data back for reuse by later commands.
    pub fn recycle(&mut self, data: Vec<u8>) {
        self.conn.recycle(data);
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
        let cid = self.alloc_cid();
        sqe.cid = cid.into();
        self.conn.submit(sqe, write, read_len);
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

    /// Sends every byte waiting to be sent.
    pub async fn flush(&mut self) -> Result<()> {
        if !self.conn.has_transmit() {
            return Ok(());
        }
        let mut tx = std::mem::take(&mut self.tx);
        tx.clear();
        self.conn.take_transmit(&mut tx);
        let res = reactor::timeout(self.timeout, self.stream.write_all(tx)).await;
        match res {
            Ok((Ok(_), mut tx)) => {
                tx.clear();
                self.tx = tx;
                Ok(())
            }
            Ok((Err(e), _)) => self.fail(Error::Io(e)),
            Err(_) => self.fail(Error::Timeout { what: "sending to the controller", after: self.timeout }),
        }
    }

    fn fail<T>(&mut self, e: Error) -> Result<T> {
        self.failed = true;
        Err(e)
    }

    /// Reads once from the socket and feeds the bytes to the connection.
    async fn receive(&mut self, what: &'static str) -> Result<()> {
        if self.failed {
            return Err(Error::Invalid("queue failed earlier".into()));
        }
        // Read straight into the connection's receive buffer, after what
        // it already holds.
        let rx = self.conn.receive_buffer(RX_BUF);
        let at = rx.len();
        let room = rx.capacity();
        let res = reactor::timeout(self.timeout, self.stream.read(rx.slice_mut(at..room))).await;
        let rx = match res {
            Ok((Ok(0), _)) => return self.fail(Error::Closed),
            Ok((Ok(_), rx)) => rx.into_inner(),
            Ok((Err(e), _)) => return self.fail(Error::Io(e)),
            Err(_) => return self.fail(Error::Timeout { what, after: self.timeout }),
        };
        if let Err(e) = self.conn.received(rx) {
            return self.fail(Error::Fatal(e));
        }
        // Completions that arrived; R2Ts may have queued H2CData to send.
        while let Some(c) = self.conn.poll_completion() {
            self.ready.push_back(c);
        }
        self.flush().await
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
            self.receive("a completion").await?;
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
