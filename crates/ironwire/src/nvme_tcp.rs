//! The NVMe/TCP connection driver: a thin async shell around the sans-IO
//! `nvmf_tcp::TargetConnection` (framing) and `nvmf::Queue` (commands).
//!
//! Per connection, on the reactor that accepted it: a reader task feeds
//! received bytes to the connection and dispatches the commands that come
//! out; block I/O runs as local tasks; a writer task sends everything
//! queued for the connection in one `write_all` per wake-up, so responses
//! finished in the same loop turn share one send. A ticker checks the
//! keep-alive timer and delivers asynchronous events.

use crate::conn::{Outbox, Shell};
use blockdev::{BlockDevice, Device, IoBuf};
use nvme_spec::{Cqe, Status};
use nvmf::{BlockOp, Outcome};
use nvmf_tcp::target::{Event, TargetConfig, TargetConnection};
use nvmf_tcp::DataBuffer;
use reactor::net::TcpStream;
use reactor::now_ms;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

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

struct Conn {
    tcp: RefCell<TargetConnection<Buf>>,
    queue: RefCell<Queue>,
    shell: Shell,
}

impl Outbox for Conn {
    fn shell(&self) -> &Shell {
        &self.shell
    }

    fn take_transmit(&self, out: &mut Vec<u8>) {
        self.tcp.borrow_mut().take_transmit(out);
    }

    fn queued(&self) -> usize {
        self.tcp.borrow().transmit_len()
    }
}

impl Conn {
    fn respond(&self, cqe: Cqe) {
        self.tcp.borrow_mut().send_response(cqe);
        self.shell.tx_ready.notify();
    }
}

/// Serves one accepted connection until it closes.
pub async fn serve(stream: TcpStream, target: Arc<Target>, cfg: TargetConfig, transport: nvmf::Transport) {
    let _ = stream.set_nodelay(true);
    let (Ok(local), Ok(peer)) = (stream.local_addr(), stream.peer_addr()) else {
        return;
    };
    let conn = Rc::new(Conn {
        tcp: RefCell::new(TargetConnection::new(cfg)),
        queue: RefCell::new(Queue::new(target, transport, local, peer)),
        shell: Shell::new(peer),
    });
    log::debug!("{peer}: connected");
    let (rd, wr) = stream.into_split();
    let writer = reactor::spawn(crate::conn::write_loop(wr, conn.clone()));
    let ticker = reactor::spawn(tick_loop(conn.clone()));
    let mut rx = rd.receiver();
    while !conn.shell.is_closing() {
        let r = match rx.recv().await {
            Ok(bytes) if !bytes.is_empty() => conn.tcp.borrow_mut().handle_input(&bytes),
            _ => break,
        };
        // One clock read per batch of received bytes, not per command.
        // Commands wait, parsed, while the host does not read our replies.
        while !dispatch_events(&conn, now_ms()) {
            crate::conn::wait_for_room(&*conn, &mut rx).await;
        }
        if let Err(e) = r {
            log::warn!("{peer}: fatal NVMe/TCP error, sending C2HTermReq: {e}");
            conn.shell.close();
        }
    }
    conn.shell.close();
    conn.queue.borrow_mut().close();
    let _ = writer.await;
    drop(ticker);
    log::debug!("{peer}: closed");
}

/// Dispatches the commands and data the connection parsed. `false` when it
/// stopped early because the replies passed the send high-water mark.
fn dispatch_events(conn: &Rc<Conn>, now_ms: u64) -> bool {
    loop {
        if crate::conn::over_high_water(&**conn) && !conn.shell.is_closing() {
            conn.shell.tx_ready.notify();
            return false;
        }
        let ev = conn.tcp.borrow_mut().poll_event();
        let Some(ev) = ev else { break };
        match ev {
            Event::Command { sqe, data } => {
                let len = data.as_ref().map(|d| d.0.len());
                let checked = conn.tcp.borrow().check_sgl(&sqe, len);
                match checked {
                    Ok(data_len) => {
                        let outcome = conn.queue.borrow_mut().execute(now_ms, &sqe, data_len, data);
                        answer(conn, sqe.cid.get(), outcome);
                    }
                    Err(status) => {
                        log::debug!("{}: cid {} SGL rejected: {status}", conn.shell.peer, sqe.cid.get());
                        conn.respond(Cqe::new(sqe.cid.get(), status, 0));
                    }
                }
            }
            Event::Data { cid, data } => {
                let outcome = conn.queue.borrow_mut().data_arrived(now_ms, cid, data);
                answer(conn, cid, outcome);
            }
            Event::DataDigestError { cid } => {
                log::warn!(
                    "{}: data digest mismatch on cid {cid}; completing with Transient Transport Error",
                    conn.shell.peer
                );
                conn.queue.borrow_mut().data_failed(cid);
                conn.respond(Cqe::new(cid, Status::TRANSIENT_TRANSPORT_ERROR, 0));
            }
            Event::HostTerminated { fes } => {
                log::warn!("{}: host sent H2CTermReq (fes {fes:#x}); closing", conn.shell.peer);
                conn.shell.close();
            }
        }
    }
    conn.shell.tx_ready.notify();
    true
}

fn answer(conn: &Rc<Conn>, cid: u16, outcome: Outcome<Buf, Device>) {
    match outcome {
        Outcome::Complete { cqe, data } => {
            if data.is_empty() {
                conn.tcp.borrow_mut().send_response(cqe);
            } else {
                conn.tcp.borrow_mut().send_data(cid, &data, cqe);
            }
        }
        Outcome::NeedData { len } => conn.tcp.borrow_mut().request_data(cid, len),
        Outcome::Io(req) => {
            if !read_from_memory(conn, &req) && !write_to_memory(conn, &req) {
                reactor::spawn(run_io(conn.clone(), req));
            }
        }
        Outcome::Deferred => {}
        Outcome::Connected { cqe, qid, sqsize, sq_flow_disabled } => {
            let mut tcp = conn.tcp.borrow_mut();
            tcp.set_queue(qid, sqsize, sq_flow_disabled);
            tcp.send_response(cqe);
        }
        Outcome::CompleteAndClose { cqe } => {
            conn.tcp.borrow_mut().send_response(cqe);
            conn.shell.close();
        }
    }
}

/// Answers a read of a null or RAM device at once: the data is copied from
/// the device straight into the send buffer, with no task and no buffer in
/// between. `false` when the request is anything else or the read failed
/// (`run_io` then answers it, with the error status).
fn read_from_memory(conn: &Rc<Conn>, req: &BlockRequest) -> bool {
    let BlockOp::Read { lba, len_bytes } = req.op else { return false };
    if !req.device.reads_from_memory() {
        return false;
    }
    let cid = req.cid;
    let sent =
        conn.tcp.borrow_mut().send_data_with(cid, len_bytes as usize, Cqe::new(cid, Status::SUCCESS, 0), |dst| {
            matches!(req.device.read_now(lba, dst), Some(Ok(())))
        });
    if sent {
        conn.shell.tx_ready.notify();
    }
    sent
}

/// Completes a write to a null or RAM device at once, where the command
/// arrived: no task, no wait. `false` when the request is anything else.
fn write_to_memory(conn: &Conn, req: &BlockRequest) -> bool {
    let BlockOp::Write { lba, ref data, .. } = req.op else { return false };
    let Some(result) = req.device.write_now(lba, &data.0) else { return false };
    let status = match result {
        Ok(()) => Status::SUCCESS,
        Err(e) => {
            log::warn!("{}: write on {} failed: {e}", conn.shell.peer, req.device.name());
            nvmf::io_error_status(&e, true)
        }
    };
    conn.respond(Cqe::new(req.cid, status, 0));
    true
}

async fn run_io(conn: Rc<Conn>, req: BlockRequest) {
    let BlockRequest { cid, device, op } = req;
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
            let (r, buf) = device.read(lba, IoBuf::with_len(len_bytes as usize)).await;
            let status = ok(r, false);
            if status.is_success() {
                conn.tcp.borrow_mut().send_data(cid, &buf, Cqe::new(cid, status, 0));
                conn.shell.tx_ready.notify();
                return;
            }
            status
        }
        BlockOp::Write { lba, data, fua } => ok(device.write(lba, data.0, fua).await.0, true),
        BlockOp::Flush => ok(device.flush().await, true),
        BlockOp::WriteZeroes { lba, blocks, deallocate } => {
            ok(device.write_zeroes(lba, blocks, deallocate).await, true)
        }
        BlockOp::Deallocate { ranges } => {
            let mut status = Status::SUCCESS;
            for (lba, blocks) in ranges {
                status = ok(device.deallocate(lba, blocks).await, true);
                if !status.is_success() {
                    break;
                }
            }
            status
        }
        BlockOp::Compare { lba, data } => {
            let (r, buf) = device.read(lba, IoBuf::with_len(data.0.len())).await;
            match ok(r, false) {
                s if !s.is_success() => s,
                _ if buf[..] == data.0[..] => Status::SUCCESS,
                _ => Status::COMPARE_FAILURE,
            }
        }
    };
    conn.respond(Cqe::new(cid, status, 0));
}

async fn tick_loop(conn: Rc<Conn>) {
    loop {
        reactor::sleep(Duration::from_millis(100)).await;
        if conn.shell.is_closing() {
            break;
        }
        let mut q = conn.queue.borrow_mut();
        if q.expired(now_ms()) {
            drop(q);
            conn.shell.close();
            break;
        }
        while let Some(cqe) = q.poll_event() {
            conn.respond(cqe);
        }
    }
}
