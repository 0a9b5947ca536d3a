//! The NVMe-oF connection driver: a thin async shell around a sans-IO
//! transport binding (`nvmf_tcp::TargetConnection` for NVMe/TCP,
//! `nvmf_rdma::TargetQueue` for NVMe/RDMA over iWARP) and `nvmf::Queue`
//! (commands).
//!
//! Per connection, on the reactor that accepted it: a reader task feeds
//! received bytes to the binding and dispatches the commands that come
//! out; block I/O runs as local tasks; a writer task sends everything
//! queued for the connection in one `write_all` per wake-up, so responses
//! finished in the same loop turn share one send. A ticker checks the
//! keep-alive timer and delivers asynchronous events. A port that serves
//! both bindings on one address tells them apart by the first byte the host
//! sends: an NVMe/TCP ICReq starts with PDU type 0, an MPA request with the
//! `M` of its key.

use crate::conn::{Outbox, Shell};
use crate::stats::{self, Failure, Op};
use blockdev::{BlockDevice, Device, IoBuf};
use checksum::Appender;
use nvme_spec::{Cqe, Sqe, Status};
use nvmf::{BlockOp, Outcome};
use nvmf_tcp::DataBuffer;
use reactor::gather::{Gather, Splice};
use reactor::net::TcpStream;
use reactor::now_ms;
use std::cell::RefCell;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

mod abort;

/// The NVMe-oF target, over the daemon's devices.
pub type Target = nvmf::Target<Device>;
/// A subsystem of [`Target`].
pub type Subsystem = nvmf::Subsystem<Device>;
/// A namespace of a [`Subsystem`].
pub type Namespace = nvmf::Namespace<Device>;
type Queue = nvmf::Queue<Device>;
type BlockRequest = nvmf::BlockRequest<Buf, Device>;

/// Write data lands straight in a pooled, aligned buffer the backend can
/// write from with O_DIRECT.
pub struct Buf(pub IoBuf);

impl AsRef<[u8]> for Buf {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl AsMut<[u8]> for Buf {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl DataBuffer for Buf {
    fn alloc(len: usize) -> Self {
        Buf(IoBuf::with_len(len))
    }
}

// SAFETY: an IoBuf's bytes sit in the buffer pool or the registered arena
// at an address that does not change when the value moves, all of them
// initialized.
unsafe impl reactor::buf::IoBuf for Buf {
    fn read_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }

    fn bytes_init(&self) -> usize {
        self.0.len()
    }
}

// SAFETY: as above; every byte is initialized already.
unsafe impl reactor::buf::IoBufMut for Buf {
    fn write_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }

    fn bytes_total(&mut self) -> usize {
        self.0.len()
    }

    unsafe fn set_init(&mut self, _n: usize) {}
}

/// Fewer bytes of write data than this still to come in one segment go
/// through the receive buffers (a copy); more are received straight into
/// the command's buffer ([`receive_direct`]), which costs stopping and
/// re-arming the multishot receive.
const DIRECT_MIN: usize = 16 << 10;

/// What a binding reports to the driver.
pub enum BindingEvent {
    /// A command capsule, with its in-capsule data.
    Command { sqe: Sqe, data: Option<Buf> },
    /// A command capsule whose in-capsule data is still in the input last
    /// given to [`Binding::handle_input_lent`], at `data`.
    CommandInInput { sqe: Sqe, data: std::ops::Range<usize> },
    /// The write data solicited for `cid`.
    Data { cid: u16, data: Buf },
    /// The data for `cid` failed its digest: data it waited for (no
    /// `capsule`), or its capsule's own (it never ran).
    DataDigestError { cid: u16, capsule: Option<Sqe> },
    /// A command taken back by [`Binding::withdraw_command`] (answered
    /// already), in its place in the queue.
    Withdrawn { sqe: Sqe },
    /// The connection is over (the reason is logged).
    Close { reason: String },
    /// Something to log at debug level.
    Note(String),
    /// Something the host did wrong that the binding answered itself, to
    /// log as a warning.
    Warn(String),
}

/// An NVMe-oF transport binding: framing and data movement for one queue.
/// Its methods mirror `nvmf_tcp::target::TargetConnection`'s.
pub trait Binding: 'static {
    /// Feeds received bytes; `Err` names the fatal error (the binding has
    /// queued the protocol's terminate message).
    fn handle_input(&mut self, bytes: &[u8]) -> Result<(), String>;
    /// As `handle_input`, but in-capsule data may stay in `bytes`
    /// ([`BindingEvent::CommandInInput`]) until [`keep_input`](Self::keep_input).
    fn handle_input_lent(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.handle_input(bytes)
    }
    /// Copies the data of the lent commands not yet polled out of `input`,
    /// which is about to go.
    fn keep_input(&mut self, _input: &[u8]) {}
    /// The next event.
    fn poll_event(&mut self) -> Option<BindingEvent>;
    /// The transfer length of a command's data, or the status to fail with.
    fn check_sgl(&self, sqe: &Sqe, in_capsule_len: Option<usize>) -> Result<u32, Status>;
    /// Solicits `len` bytes of write data for `cid`.
    fn request_data(&mut self, cid: u16, len: u32);
    /// As `request_data` for data the device never reads (a write to a
    /// null device): where the binding can, the payload is received and
    /// checked but not copied into the buffer it hands over.
    fn request_data_discarded(&mut self, cid: u16, len: u32) {
        self.request_data(cid, len)
    }
    /// Gives up the data transfer of `cid` (an Abort): `false` when it
    /// can no longer be stopped.
    fn cancel_data(&mut self, cid: u16) -> bool;
    /// Takes back the command `cid`, parsed but not yet polled (an Abort
    /// while the host does not read its replies): `false` when none waits.
    fn withdraw_command(&mut self, cid: u16) -> bool;
    /// Sends read data for `cid`, then its completion.
    fn send_data(&mut self, cid: u16, data: &[u8], cqe: Cqe);
    /// As `send_data`, from the I/O's own buffer: where the binding can, the
    /// data is sent from there ([`Binding::take_transmit`] splices it in),
    /// not copied.
    fn send_data_from(&mut self, cid: u16, data: Buf, cqe: Cqe) {
        self.send_data(cid, &data.0, cqe);
    }
    /// As `send_data` with `len` zero bytes (a null device's read), sent
    /// from a shared page of zeros where the binding can; `false` when
    /// nothing was queued.
    fn send_zeros(&mut self, cid: u16, len: usize, cqe: Cqe) -> bool {
        self.send_data_with(cid, len, cqe, |out| {
            out.extend_zeros(len);
            true
        })
    }
    /// As `send_data`, with `fill` appending the `len` bytes of data to the
    /// send buffer itself (any digest over them computed as they are
    /// copied); `false` when nothing was queued.
    fn send_data_with(&mut self, cid: u16, len: usize, cqe: Cqe, fill: impl FnOnce(&mut Appender<'_>) -> bool) -> bool;
    /// Sends a completion.
    fn send_response(&mut self, cqe: Cqe);
    /// Records the queue once Connect succeeded.
    fn set_queue(&mut self, sqid: u16, sqsize: u16, sq_flow_disabled: bool);
    /// Moves what there is to send to the end of `out`.
    fn take_transmit(&mut self, out: &mut Gather<Buf>);
    /// Bytes waiting to be sent.
    fn transmit_len(&self) -> usize;
    /// Header and data digests in use (iWARP: the MPA CRC, as both).
    fn digests(&self) -> (bool, bool);
    /// Bytes of write data the stream carries next that may be received
    /// straight into their command's buffer (iWARP: an RDMA Read
    /// Response's payload); 0 for none.
    fn direct_len(&self) -> usize {
        0
    }
    /// Lends that buffer: it, the offset and the length. No input may be
    /// fed until [`placed`](Self::placed) gives it back.
    fn take_direct(&mut self) -> Option<(Buf, usize, usize)> {
        None
    }
    /// Gives the lent buffer back with `n` bytes received into it.
    fn placed(&mut self, _buf: Buf, _n: usize) -> Result<(), String> {
        Err("no buffer was lent".into())
    }
}

/// The [`Binding`] methods both bindings have under the same name and
/// signature, forwarded to the binding type's own.
macro_rules! forward_binding {
    ($($ty:ident)::+) => {
        fn check_sgl(&self, sqe: &Sqe, in_capsule_len: Option<usize>) -> Result<u32, Status> {
            $($ty)::+::check_sgl(self, sqe, in_capsule_len)
        }
        fn request_data(&mut self, cid: u16, len: u32) {
            $($ty)::+::request_data(self, cid, len)
        }
        fn cancel_data(&mut self, cid: u16) -> bool {
            $($ty)::+::cancel_data(self, cid)
        }
        fn withdraw_command(&mut self, cid: u16) -> bool {
            $($ty)::+::withdraw_command(self, cid)
        }
        fn send_data(&mut self, cid: u16, data: &[u8], cqe: Cqe) {
            $($ty)::+::send_data(self, cid, data, cqe)
        }
        fn send_data_with(&mut self, cid: u16, len: usize, cqe: Cqe, fill: impl FnOnce(&mut Appender<'_>) -> bool) -> bool {
            $($ty)::+::send_data_with(self, cid, len, cqe, fill)
        }
        fn send_response(&mut self, cqe: Cqe) {
            $($ty)::+::send_response(self, cqe)
        }
        fn set_queue(&mut self, sqid: u16, sqsize: u16, sq_flow_disabled: bool) {
            $($ty)::+::set_queue(self, sqid, sqsize, sq_flow_disabled)
        }
        fn transmit_len(&self) -> usize {
            $($ty)::+::transmit_len(self)
        }
    };
}

impl Binding for nvmf_tcp::target::TargetConnection<Buf> {
    fn handle_input(&mut self, bytes: &[u8]) -> Result<(), String> {
        nvmf_tcp::target::TargetConnection::handle_input(self, bytes)
            .map_err(|e| format!("fatal NVMe/TCP error, sending C2HTermReq: {e}"))
    }
    fn handle_input_lent(&mut self, bytes: &[u8]) -> Result<(), String> {
        // A busy reactor sends each batch of reads as its data, then its
        // responses (docs/architecture.md, "One 4 KiB read").
        self.set_hold(!reactor::loop_waited());
        nvmf_tcp::target::TargetConnection::handle_input_lent(self, bytes)
            .map_err(|e| format!("fatal NVMe/TCP error, sending C2HTermReq: {e}"))
    }
    fn keep_input(&mut self, input: &[u8]) {
        nvmf_tcp::target::TargetConnection::keep_input(self, input)
    }
    fn poll_event(&mut self) -> Option<BindingEvent> {
        use nvmf_tcp::target::Event;
        Some(match nvmf_tcp::target::TargetConnection::poll_event(self)? {
            Event::Command { sqe, data } => BindingEvent::Command { sqe, data },
            Event::CommandInInput { sqe, data } => BindingEvent::CommandInInput { sqe, data },
            Event::Data { cid, data } => BindingEvent::Data { cid, data },
            Event::DataDigestError { cid, capsule } => BindingEvent::DataDigestError { cid, capsule },
            Event::Withdrawn { sqe } => BindingEvent::Withdrawn { sqe },
            Event::HostTerminated { fes, malformed: None } => {
                BindingEvent::Close { reason: format!("host sent H2CTermReq (fes {fes:#x}); closing") }
            }
            Event::HostTerminated { fes, malformed: Some(why) } => BindingEvent::Close {
                reason: format!("host sent a malformed H2CTermReq ({why}, fes {fes:#x}); closing"),
            },
        })
    }
    fn digests(&self) -> (bool, bool) {
        nvmf_tcp::target::TargetConnection::digests(self)
    }
    fn take_transmit(&mut self, out: &mut Gather<Buf>) {
        let (head, splices) = (&mut out.head, &mut out.splices);
        nvmf_tcp::target::TargetConnection::take_transmit_parts(self, head, |at, len| {
            splices.push(Splice { at, buf: reactor::gather::ZEROS, start: 0, len })
        })
    }
    fn send_zeros(&mut self, cid: u16, len: usize, cqe: Cqe) -> bool {
        nvmf_tcp::target::TargetConnection::send_zeros(self, cid, len, cqe)
    }
    fn request_data_discarded(&mut self, cid: u16, len: u32) {
        nvmf_tcp::target::TargetConnection::request_data_discarded(self, cid, len)
    }
    forward_binding!(nvmf_tcp::target::TargetConnection);
}

impl Binding for nvmf_rdma::target::TargetQueue<Buf> {
    fn handle_input(&mut self, bytes: &[u8]) -> Result<(), String> {
        nvmf_rdma::target::TargetQueue::handle_input(self, bytes)
            .map_err(|e| format!("fatal iWARP error, sending Terminate: {e}"))
    }
    fn handle_input_lent(&mut self, bytes: &[u8]) -> Result<(), String> {
        nvmf_rdma::target::TargetQueue::handle_input_lent(self, bytes)
            .map_err(|e| format!("fatal iWARP error, sending Terminate: {e}"))
    }
    fn keep_input(&mut self, input: &[u8]) {
        nvmf_rdma::target::TargetQueue::keep_input(self, input)
    }
    fn poll_event(&mut self) -> Option<BindingEvent> {
        use nvmf_rdma::target::Event;
        Some(match nvmf_rdma::target::TargetQueue::poll_event(self)? {
            Event::Command { sqe, data } => BindingEvent::Command { sqe, data },
            Event::CommandInInput { sqe, data } => BindingEvent::CommandInInput { sqe, data },
            Event::Data { cid, data } => BindingEvent::Data { cid, data },
            Event::Withdrawn { sqe } => BindingEvent::Withdrawn { sqe },
            Event::Refused { reason } => {
                BindingEvent::Close { reason: format!("NVMe/RDMA connection request refused: {reason}") }
            }
            Event::HostTerminated(code) => {
                BindingEvent::Close { reason: format!("host sent an iWARP Terminate ({code}); closing") }
            }
            Event::CidConflict { cid } => BindingEvent::Warn(format!(
                "cid {cid} reused while a command of that cid is in flight; answered Command ID Conflict"
            )),
            Event::ConnectMismatch { reason } => {
                BindingEvent::Warn(format!("{reason}; answered Connect Invalid Parameters"))
            }
            Event::Accepted { qid, entries, crc, ord } => BindingEvent::Note(format!(
                "NVMe/RDMA queue {qid} accepted: {entries} entries, CRC {}, ORD {ord}",
                if crc { "on" } else { "off" }
            )),
        })
    }
    fn digests(&self) -> (bool, bool) {
        let crc = nvmf_rdma::target::TargetQueue::crc(self);
        (crc, crc)
    }
    fn send_data_from(&mut self, cid: u16, data: Buf, cqe: Cqe) {
        nvmf_rdma::target::TargetQueue::send_data_from(self, cid, data, cqe)
    }
    fn take_transmit(&mut self, out: &mut Gather<Buf>) {
        let (head, bufs, splices) = (&mut out.head, &mut out.bufs, &mut out.splices);
        nvmf_rdma::target::TargetQueue::take_transmit_parts(self, head, bufs, |s| {
            let buf = if s.buf == iwarp::ZEROS { reactor::gather::ZEROS } else { s.buf };
            splices.push(Splice { at: s.at, buf, start: s.start, len: s.len })
        })
    }
    fn send_zeros(&mut self, cid: u16, len: usize, cqe: Cqe) -> bool {
        nvmf_rdma::target::TargetQueue::send_zeros(self, cid, len, cqe)
    }
    fn direct_len(&self) -> usize {
        nvmf_rdma::target::TargetQueue::direct_len(self)
    }
    fn take_direct(&mut self) -> Option<(Buf, usize, usize)> {
        nvmf_rdma::target::TargetQueue::take_direct(self)
    }
    fn placed(&mut self, buf: Buf, n: usize) -> Result<(), String> {
        nvmf_rdma::target::TargetQueue::placed(self, buf, n)
            .map_err(|e| format!("fatal iWARP error, sending Terminate: {e}"))
    }
    forward_binding!(nvmf_rdma::target::TargetQueue);
}

/// The NVMe bindings one listening address serves.
#[derive(Clone, Copy)]
pub struct Bindings {
    /// NVMe/TCP: its limits and transport descriptor.
    pub tcp: Option<(nvmf_tcp::target::TargetConfig, nvmf::Transport)>,
    /// NVMe/RDMA over iWARP: its limits and transport descriptor.
    pub rdma: Option<(nvmf_rdma::target::TargetConfig, nvmf::Transport)>,
}

struct Conn<T> {
    wire: RefCell<T>,
    queue: RefCell<Queue>,
    shell: Shell,
    stats: stats::Connection,
    aborts: abort::Aborts,
}

impl<T: Binding> Outbox for Conn<T> {
    type Spliced = Buf;

    fn shell(&self) -> &Shell {
        &self.shell
    }

    fn take_transmit(&self, out: &mut Gather<Buf>) {
        self.wire.borrow_mut().take_transmit(out);
    }

    fn queued(&self) -> usize {
        self.wire.borrow().transmit_len()
    }
}

impl<T: Binding> Conn<T> {
    fn respond(&self, cqe: Cqe) {
        self.wire.borrow_mut().send_response(cqe);
        self.shell.tx_ready.notify();
    }

    /// Sends the completions the queue produced besides its last outcome:
    /// fused halves that ended with their partner (nvmf's fused.rs).
    fn respond_extra(&self) {
        loop {
            let cqe = self.queue.borrow_mut().poll_completion();
            let Some(cqe) = cqe else { break };
            self.failed(cqe.status());
            self.respond(cqe);
        }
    }

    /// Counts an I/O of namespace `nsid` begun at `t0` (µs, the loop
    /// clock) that ended with `status`.
    fn record(&self, nsid: u32, (op, bytes): (Op, u64), t0: u64, status: Status) {
        let failure = (!status.is_success()).then_some(Failure::Nvme(status));
        let latency = reactor::now_us().saturating_sub(t0);
        let scope = || {
            let subsystem = self.queue.borrow().controller()?.subsystem()?.nqn.clone();
            Some(stats::Scope::Namespace { subsystem, nsid })
        };
        self.stats.with(u64::from(nsid), scope, |c| c.record(op, bytes, latency, failure));
    }

    /// Counts a command that failed before reaching a device.
    fn failed(&self, status: Status) {
        if !status.is_success() {
            self.stats.port().error(Failure::Nvme(status));
        }
    }
}

/// What `op` counts as, and the bytes it moves.
fn op_kind(op: &BlockOp<Buf>) -> (Op, u64) {
    match op {
        BlockOp::Read { len_bytes, .. } => (Op::Read, u64::from(*len_bytes)),
        BlockOp::Write { data, .. } => (Op::Write, data.0.len() as u64),
        _ => (Op::Other, 0),
    }
}

/// Serves one accepted connection until it closes; one that has not
/// completed Fabrics Connect within `handshake` is closed.
/// `port` is the listening address it came in on, for the counters.
pub async fn serve(
    stream: TcpStream,
    target: Arc<Target>,
    bindings: Bindings,
    handshake: Duration,
    port: std::net::SocketAddr,
) {
    let _ = stream.set_nodelay(true);
    let (Ok(local), Ok(peer)) = (stream.local_addr(), stream.peer_addr()) else {
        return;
    };
    let (rd, wr) = stream.into_split();
    let mut rx = rd.receiver();
    let (first, rdma) = match bindings {
        Bindings { tcp: Some(_), rdma: Some(_) } => match reactor::timeout(handshake, rx.recv()).await {
            Ok(Ok(bytes)) if !bytes.is_empty() => {
                let first = bytes.to_vec();
                let rdma = first.first() == iwarp::mpa::KEY_REQUEST.first();
                (first, rdma)
            }
            Ok(_) => return,
            Err(_) => {
                log::warn!(
                    "{peer}: sent nothing within {} ms ([timeouts] handshake_ms); closing",
                    handshake.as_millis()
                );
                return;
            }
        },
        Bindings { rdma, .. } => (Vec::new(), rdma.is_some()),
    };
    match (bindings.tcp, bindings.rdma) {
        (_, Some((mut cfg, transport))) if rdma => {
            // DDP segments fit the connection's TCP segments (MULPDU).
            if let Some(cap) = rd.mss().ok().and_then(|mss| iwarp::wire::segment_cap(mss as usize)) {
                cfg.max_segment = cfg.max_segment.min(cap);
            }
            let wire = nvmf_rdma::target::TargetQueue::<Buf>::new(cfg);
            let stats = stats::Connection::open("nvme-rdma", port, peer, rd.as_raw_fd());
            // Boxed: each binding's connection state lives in its own
            // allocation, so an idle connection of either pays for its own
            // and not for the larger of the two inside this future.
            Box::pin(run(wire, (rd, rx), wr, first, Queue::new(target, transport, local, peer), stats, handshake)).await
        }
        (Some((cfg, transport)), _) => {
            let wire = nvmf_tcp::target::TargetConnection::<Buf>::new(cfg);
            let stats = stats::Connection::open("nvme-tcp", port, peer, rd.as_raw_fd());
            Box::pin(run(wire, (rd, rx), wr, first, Queue::new(target, transport, local, peer), stats, handshake)).await
        }
        _ => {}
    }
}

async fn run<T: Binding>(
    wire: T,
    (rd, mut rx): (TcpStream, reactor::Receiver),
    wr: TcpStream,
    first: Vec<u8>,
    queue: Queue,
    stats: stats::Connection,
    handshake: Duration,
) {
    let peer = stats.peer();
    let conn = Rc::new(Conn {
        wire: RefCell::new(wire),
        queue: RefCell::new(queue),
        shell: Shell::new(peer),
        stats,
        aborts: abort::Aborts::default(),
    });
    log::debug!("{peer}: connected");
    let writer = reactor::spawn(crate::conn::write_loop(wr, conn.clone()));
    let ticker = reactor::spawn(tick_loop(conn.clone(), rd, now_ms().saturating_add(handshake.as_millis() as u64)));
    let mut pending = (!first.is_empty()).then_some(first);
    while !conn.shell.is_closing() {
        let r = match pending.take() {
            Some(bytes) => take_input(&conn, &bytes),
            None => match rx.recv().await {
                Ok(bytes) if !bytes.is_empty() => take_input(&conn, &bytes),
                _ => break,
            },
        };
        let r = match r {
            Ok(()) => match receive_direct(&conn, &mut rx).await {
                Ok(true) => Ok(()),
                Ok(false) => break,
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        // Commands wait, parsed, while the host does not read our replies.
        while !dispatch_events(&conn, now_ms(), &[]) {
            crate::conn::wait_for_room(&*conn, &mut rx).await;
        }
        if let Err(e) = r {
            log::warn!("{peer}: {e}");
            conn.shell.close();
        }
    }
    // The commands already taken finish and their answers go out first.
    conn.shell.io_finished().await;
    conn.shell.close();
    conn.queue.borrow_mut().close();
    conn.aborts.stop();
    let _ = writer.await;
    drop(ticker);
    log::debug!("{peer}: closed");
}

/// Feeds received bytes to the binding and dispatches what they carried
/// while they are still in the receive buffer, so that in-capsule write
/// data for a null or RAM device goes from there to the device (no copy,
/// or the one into RAM); what waits (the host is not reading our replies)
/// is copied out first. One clock read per batch of received bytes, not
/// per command.
fn take_input<T: Binding>(conn: &Rc<Conn<T>>, input: &[u8]) -> Result<(), String> {
    let r = conn.wire.borrow_mut().handle_input_lent(input);
    dispatch_events(conn, now_ms(), input);
    conn.wire.borrow_mut().keep_input(input);
    r
}

/// Direct data placement in software: while the binding expects at least
/// [`DIRECT_MIN`] bytes of write data next (an RDMA Read Response's
/// payload), they are received from the socket straight into their
/// command's buffer instead of through the reactor's receive buffers and a
/// copy. The multishot receive is stopped first and what it already took
/// is fed in order; the next [`reactor::Receiver::recv`] arms it again.
/// `Ok(false)` when the stream ended.
async fn receive_direct<T: Binding>(conn: &Conn<T>, rx: &mut reactor::Receiver) -> Result<bool, String> {
    while conn.wire.borrow().direct_len() >= DIRECT_MIN {
        rx.pause();
        loop {
            match rx.recv_stopped().await {
                Ok(None) => break,
                Ok(Some(bytes)) if !bytes.is_empty() => conn.wire.borrow_mut().handle_input(&bytes)?,
                Ok(Some(_)) | Err(_) => return Ok(false),
            }
        }
        // What the stopped receive held may have carried the payload on.
        if conn.wire.borrow().direct_len() < DIRECT_MIN {
            break;
        }
        let Some((buf, off, len)) = conn.wire.borrow_mut().take_direct() else { break };
        let (res, buf) = rx.read_into(reactor::buf::IoBufMut::slice_mut(buf, off..off.saturating_add(len))).await;
        let buf = buf.into_inner();
        match res {
            Ok(n) if n > 0 => conn.wire.borrow_mut().placed(buf, n)?,
            _ => {
                let _ = conn.wire.borrow_mut().placed(buf, 0);
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Dispatches the commands and data the connection parsed (lent in-capsule
/// data lies in `input`). `false` when it stopped early because the
/// replies passed the send high-water mark.
fn dispatch_events<T: Binding>(conn: &Rc<Conn<T>>, now_ms: u64, input: &[u8]) -> bool {
    loop {
        if crate::conn::over_high_water(&**conn) && !conn.shell.is_closing() {
            conn.shell.tx_ready.notify();
            return false;
        }
        conn.respond_extra();
        let ev = conn.wire.borrow_mut().poll_event();
        let Some(ev) = ev else { break };
        match ev {
            BindingEvent::Command { sqe, data } => command(conn, now_ms, sqe, data, |d| d),
            BindingEvent::CommandInInput { sqe, data } => {
                let Some(data) = input.get(data) else {
                    // Lent data outlived its input (a driver bug): the
                    // command fails, it never runs on other bytes.
                    debug_assert!(false, "lent in-capsule data outside the input");
                    log::error!("{}: cid {} lost its in-capsule data", conn.shell.peer, sqe.cid.get());
                    conn.failed(Status::TRANSIENT_TRANSPORT_ERROR);
                    conn.respond(Cqe::new(sqe.cid.get(), Status::TRANSIENT_TRANSPORT_ERROR, 0));
                    continue;
                };
                command(conn, now_ms, sqe, Some(data), |d| {
                    let mut buf = Buf::alloc(d.len());
                    buf.0.copy_from_slice(d);
                    buf
                })
            }
            BindingEvent::Data { cid, data } => {
                let outcome = conn.queue.borrow_mut().data_arrived(now_ms, cid, data);
                answer(conn, cid, outcome, |d| d);
            }
            BindingEvent::DataDigestError { cid, capsule } => {
                log::warn!(
                    "{}: data digest mismatch on cid {cid}; completing with Transient Transport Error",
                    conn.shell.peer
                );
                // A lost capsule still came next in the queue: a fused
                // Compare waiting for its Write ends with it (its answer
                // goes out with the next `respond_extra`).
                match capsule {
                    Some(sqe) => conn.queue.borrow_mut().command_lost(&sqe),
                    None => conn.queue.borrow_mut().data_failed(cid),
                }
                conn.failed(Status::TRANSIENT_TRANSPORT_ERROR);
                conn.respond(Cqe::new(cid, Status::TRANSIENT_TRANSPORT_ERROR, 0));
            }
            // It never reached the queue, but it came next in it: a fused
            // Compare waiting for it ends with it.
            BindingEvent::Withdrawn { sqe } => conn.queue.borrow_mut().command_lost(&sqe),
            BindingEvent::Close { reason } => {
                log::warn!("{}: {reason}", conn.shell.peer);
                conn.shell.close();
            }
            BindingEvent::Note(note) => log::debug!("{}: {note}", conn.shell.peer),
            BindingEvent::Warn(what) => log::warn!("{}: {what}", conn.shell.peer),
        }
    }
    conn.shell.tx_ready.notify();
    true
}

/// Checks a command's SGL and executes it (`own` as for [`answer`]).
fn command<T: Binding, B: AsRef<[u8]>>(
    conn: &Rc<Conn<T>>,
    now_ms: u64,
    sqe: Sqe,
    data: Option<B>,
    own: impl FnOnce(B) -> Buf,
) {
    let cid = sqe.cid.get();
    let len = data.as_ref().map(|d| d.as_ref().len());
    let checked = conn.wire.borrow().check_sgl(&sqe, len);
    match checked {
        Ok(data_len) => {
            let outcome = conn.queue.borrow_mut().execute(now_ms, &sqe, data_len, data);
            answer(conn, cid, outcome, own);
        }
        Err(status) => {
            log::debug!("{}: cid {cid} SGL rejected: {status}", conn.shell.peer);
            conn.failed(status);
            conn.respond(Cqe::new(cid, status, 0));
        }
    }
}

/// Acts on what the queue made of a command. A write to a null or RAM
/// device is done from its data where it lies (the receive buffer, for
/// lent in-capsule data); I/O that runs later gets its data in a buffer of
/// its own (`own`) first.
fn answer<T: Binding, B: AsRef<[u8]>>(
    conn: &Rc<Conn<T>>,
    cid: u16,
    outcome: Outcome<B, Device>,
    own: impl FnOnce(B) -> Buf,
) {
    match outcome {
        Outcome::Complete { cqe, data } => {
            conn.failed(cqe.status());
            if data.is_empty() {
                conn.wire.borrow_mut().send_response(cqe);
            } else {
                conn.wire.borrow_mut().send_data(cid, &data, cqe);
            }
        }
        Outcome::NeedData { len, discard: false } => conn.wire.borrow_mut().request_data(cid, len),
        Outcome::NeedData { len, discard: true } => conn.wire.borrow_mut().request_data_discarded(cid, len),
        Outcome::Io(req) => {
            let t0 = reactor::now_us();
            if !read_from_memory(conn, &req, t0) && !write_to_memory(conn, &req, t0) {
                reactor::spawn_detached(run_io(conn.clone(), req.map_data(own), t0));
            }
        }
        Outcome::Deferred => {}
        Outcome::Connected { cqe, qid, sqsize, sq_flow_disabled } => {
            let mut wire = conn.wire.borrow_mut();
            wire.set_queue(qid, sqsize, sq_flow_disabled);
            wire.send_response(cqe);
            let digests = wire.digests();
            drop(wire);
            let nvm = conn.queue.borrow().controller().and_then(|c| c.subsystem()).is_some_and(|s| !s.discovery);
            if nvm {
                abort::start(conn);
            }
            if let Some(c) = conn.queue.borrow().controller() {
                conn.stats.logged_in(stats::Login::Nvme {
                    hostnqn: c.hostnqn.clone(),
                    subsystem: c.subsystem().map(|s| s.nqn.clone()).unwrap_or_default(),
                    cntlid: c.cntlid,
                    qid,
                    depth: u32::from(sqsize) + 1,
                    digests,
                });
                // Access may have been revoked since the Connect was
                // checked; `runtime::enforce_access` sees the queue only
                // from here on, so look again (one side catches it).
                if c.subsystem().is_some_and(|s| !s.allows(&c.hostnqn)) {
                    log::info!("{}: host {} may no longer connect; closing queue {qid}", conn.shell.peer, c.hostnqn);
                    conn.shell.close();
                }
            }
        }
        Outcome::CompleteAndClose { cqe } => {
            conn.failed(cqe.status());
            conn.wire.borrow_mut().send_response(cqe);
            conn.shell.close();
        }
        Outcome::Shutdown { cqe, devices, shutdown } => {
            conn.wire.borrow_mut().send_response(cqe);
            let ctrl = conn.queue.borrow().controller().cloned();
            reactor::spawn(shut_down(conn.shell.peer, ctrl, devices, shutdown));
        }
        Outcome::FlushThenComplete { cqe, devices } => {
            reactor::spawn(flush_then_complete(conn.clone(), cqe, devices));
        }
    }
}

/// Flushes `devices`, then sends `cqe` (the write cache turned off), or
/// Internal Error when a flush failed: the host would otherwise take the
/// writes it made while the cache was on for durable.
async fn flush_then_complete<T: Binding>(conn: Rc<Conn<T>>, cqe: Cqe, devices: Vec<Arc<Device>>) {
    let _running = conn.shell.io_task();
    let cqe = if flush_all(conn.shell.peer, &devices, "as the host turned its write cache off").await {
        cqe
    } else {
        conn.failed(Status::INTERNAL);
        Cqe::new(cqe.cid.get(), Status::INTERNAL, 0)
    };
    conn.respond(cqe);
}

/// A normal shutdown the host asked for (CC.SHN): flushes the namespaces'
/// devices, then lets CSTS.SHST say complete. A failed flush is logged;
/// the device's latch fails every later flush (docs/configuration.md).
async fn shut_down(
    peer: std::net::SocketAddr,
    ctrl: Option<Arc<nvmf::Controller<Device>>>,
    devices: Vec<Arc<Device>>,
    shutdown: u64,
) {
    flush_all(peer, &devices, "for the host's shutdown").await;
    if let Some(c) = ctrl {
        log::debug!("{peer}: controller {} shut down", c.cntlid);
        c.shutdown_complete(shutdown);
    }
}

/// Flushes each of `devices` in turn (`why` says for what in the log line
/// of a failure); false when any flush failed.
async fn flush_all(peer: std::net::SocketAddr, devices: &[Arc<Device>], why: &str) -> bool {
    let mut all = true;
    for d in devices {
        if let Err(e) = d.flush().await {
            log::error!("{peer}: flushing {} {why} failed: {e}", d.name());
            all = false;
        }
    }
    all
}

/// Answers a read of a null or RAM device at once: the data is copied from
/// the device straight into the send buffer, with no task and no buffer in
/// between. `false` when the request is anything else or the read failed
/// (`run_io` then answers it, with the error status).
fn read_from_memory<T: Binding, B>(conn: &Rc<Conn<T>>, req: &nvmf::BlockRequest<B, Device>, t0: u64) -> bool {
    let BlockOp::Read { lba, len_bytes } = req.op else { return false };
    if !req.device.reads_from_memory() {
        return false;
    }
    let cid = req.cid;
    let cqe = Cqe::new(cid, Status::SUCCESS, 0);
    let sent = match req.device.zeros_now(lba, len_bytes as usize) {
        Some(Ok(())) => conn.wire.borrow_mut().send_zeros(cid, len_bytes as usize, cqe),
        Some(Err(_)) => false,
        None => conn.wire.borrow_mut().send_data_with(cid, len_bytes as usize, cqe, |out| {
            matches!(req.device.read_now(lba, len_bytes as usize, out), Some(Ok(())))
        }),
    };
    if sent {
        conn.record(req.nsid, (Op::Read, u64::from(len_bytes)), t0, Status::SUCCESS);
        conn.shell.tx_ready.notify();
    }
    sent
}

/// Completes a write to a null or RAM device at once, where the command
/// arrived: no task, no wait. `false` when the request is anything else.
fn write_to_memory<T: Binding, B: AsRef<[u8]>>(conn: &Conn<T>, req: &nvmf::BlockRequest<B, Device>, t0: u64) -> bool {
    let BlockOp::Write { lba, ref data, .. } = req.op else { return false };
    let data = data.as_ref();
    let Some(result) = req.device.write_now(lba, data) else { return false };
    let status = match result {
        Ok(()) => Status::SUCCESS,
        Err(e) => {
            log::warn!("{}: write on {} failed: {e}", conn.shell.peer, req.device.name());
            nvmf::io_error_status(&e, true)
        }
    };
    conn.record(req.nsid, (Op::Write, data.len() as u64), t0, status);
    conn.respond(Cqe::new(req.cid, status, 0));
    true
}

async fn run_io<T: Binding>(conn: Rc<Conn<T>>, req: BlockRequest, t0: u64) {
    let _running = conn.shell.io_task();
    // `_busy` counts the request on its namespace until it is answered:
    // the namespace's removal waits for it.
    let BlockRequest { cid, nsid, device, op, busy: _busy } = req;
    let kind = op_kind(&op);
    // An injected latency is waited out here, where an Abort can stop the
    // command before the device sees it.
    let delay = match op {
        BlockOp::Read { .. } | BlockOp::Compare { .. } => device.latency().read,
        BlockOp::Write { .. } => device.latency().write,
        _ => Duration::ZERO,
    };
    if !delay.is_zero() && !abort::wait_delay(&conn, cid, delay).await {
        return;
    }
    let ok = |s: Result<(), blockdev::Error>, write: bool| match s {
        Ok(()) => Status::SUCCESS,
        Err(e) => {
            log::warn!(
                "{}: {} on {} failed: {e}",
                conn.shell.peer,
                if write { "write" } else { "read" },
                device.name()
            );
            nvmf::io_error_status(&e, write)
        }
    };
    let status = match op {
        BlockOp::Read { lba, len_bytes } => {
            let Some(_held) = abort::hold_read(&conn, cid, len_bytes as usize).await else { return };
            let (r, buf) = device.read_undelayed(lba, IoBuf::with_len(len_bytes as usize)).await;
            let status = ok(r, false);
            if status.is_success() {
                conn.record(nsid, kind, t0, status);
                conn.wire.borrow_mut().send_data_from(cid, Buf(buf), Cqe::new(cid, status, 0));
                conn.shell.tx_ready.notify();
                return;
            }
            status
        }
        BlockOp::Write { lba, data, fua } => ok(device.write_undelayed(lba, data.0, fua).await.0, true),
        BlockOp::Flush => ok(device.flush().await, true),
        BlockOp::WriteZeroes { lba, blocks, deallocate, fua } => {
            match ok(device.write_zeroes(lba, blocks, deallocate).await, true) {
                // Zeroing is a ring `FALLOCATE`: no RWF_DSYNC to ask for,
                // so a durable one is followed by the device's flush.
                s if s.is_success() && fua => ok(device.flush().await, true),
                s => s,
            }
        }
        BlockOp::Deallocate { ranges, fua } => {
            let mut status = Status::SUCCESS;
            for (lba, blocks) in ranges {
                status = ok(device.deallocate(lba, blocks).await, true);
                if !status.is_success() {
                    break;
                }
            }
            if status.is_success() && fua {
                status = ok(device.flush().await, true);
            }
            status
        }
        BlockOp::Compare { lba, data } => {
            let Some(_held) = abort::hold_read(&conn, cid, data.0.len()).await else { return };
            let (r, buf) = device.read_undelayed(lba, IoBuf::with_len(data.0.len())).await;
            match ok(r, false) {
                s if !s.is_success() => s,
                _ if buf[..] == data.0[..] => Status::SUCCESS,
                _ => Status::COMPARE_FAILURE,
            }
        }
        BlockOp::CompareAndWrite { compare_cid, lba, expected, data, fua } => {
            let aborted = abort::on_abort(&conn, cid);
            let Some((compare, write)) =
                crate::fused::compare_and_write(&device, lba, &expected, &data, fua, aborted).await
            else {
                // An Abort of the Write ended the wait for the range and
                // answered the Write; the Compare fails with it.
                conn.failed(Status::ABORTED_FAILED_FUSED);
                conn.respond(Cqe::new(compare_cid, Status::ABORTED_FAILED_FUSED, 0));
                return;
            };
            conn.failed(compare);
            conn.respond(Cqe::new(compare_cid, compare, 0));
            write
        }
    };
    conn.record(nsid, kind, t0, status);
    conn.respond(Cqe::new(cid, status, 0));
}

/// Every 100 ms: the handshake deadline (`connect_by`, until the queue has
/// a controller), the keep-alive timer, asynchronous events, and a stop of
/// the daemon: the connection stops reading commands (NVMe-oF has no way
/// to tell the host), so it closes once the ones it took are answered.
async fn tick_loop<T: Binding>(conn: Rc<Conn<T>>, rd: TcpStream, connect_by: u64) {
    let mut stopped_reading = false;
    loop {
        reactor::sleep(Duration::from_millis(100)).await;
        if conn.shell.is_closing() {
            break;
        }
        // An admin queue stops after its controller's I/O queues, which
        // its close would take down (until the drain is over).
        let admin_waits = || conn.queue.borrow().has_io_queues() && !crate::lifecycle::drain_over(now_ms());
        if crate::lifecycle::draining() && !stopped_reading && !admin_waits() {
            stopped_reading = true;
            log::debug!("{}: stopping: no more commands from this connection", conn.shell.peer);
            if let Err(e) = rd.shutdown_read() {
                log::debug!("{}: shutdown(SHUT_RD): {e}", conn.shell.peer);
                conn.shell.close();
            }
        }
        let mut q = conn.queue.borrow_mut();
        let now = now_ms();
        if q.controller().is_none() && now > connect_by {
            log::warn!(
                "{}: no Fabrics Connect within the handshake deadline ([timeouts] handshake_ms); closing",
                conn.shell.peer
            );
            drop(q);
            conn.shell.close();
            break;
        }
        if q.expired(now) {
            drop(q);
            conn.shell.close();
            break;
        }
        while let Some(cqe) = q.poll_event() {
            conn.respond(cqe);
        }
    }
}
