//! The controller side of one NVMe/RDMA queue over iWARP.
//!
//! It answers the MPA request from the host's CM private data (queue size,
//! [`crate::cm`]), posts one receive per submission queue entry, hands
//! command capsules up as [`Event::Command`], fetches write data with RDMA
//! Reads when asked ([`TargetQueue::request_data`]), and sends read data as
//! RDMA Writes followed by the completion Send. A posted receive is given
//! back when its command completes, so a host can never have more commands
//! in flight than its queue holds: one more Send is an iWARP Terminate.

use crate::cm::{self, CmReject, CmReply};
use crate::sgl::{self, DataPtr, Keyed};
use block::DataBuffer;
use checksum::Appender;
use iwarp::error::{ErrorCode, Fatal};
use iwarp::{Connection, State};
use nvme_spec::fabrics::{connect_invalid_param_result, ConnectCmd};
use nvme_spec::opcode::{Admin, FabricsType};
use nvme_spec::{Cqe, Sqe, Status};
use rustc_hash::FxHashMap;
use std::collections::hash_map::Entry;
use std::collections::VecDeque;
use zerocopy::{FromBytes, IntoBytes};

/// Bytes of an NVMe command.
const SQE_LEN: usize = 64;

/// Limits the controller advertises and enforces.
#[derive(Clone, Copy, Debug)]
pub struct TargetConfig {
    /// Use CRC32C on FPDUs even when the host does not ask (it is used
    /// whenever the host asks).
    pub crc: bool,
    /// Most RDMA Reads in flight (the MPA ORD offered, capped by the host's
    /// IRD).
    pub ord: u16,
    /// Most in-capsule data bytes on an I/O queue (IOCCSZ).
    pub max_in_capsule: u32,
    /// Most bytes one command may transfer (MDTS in bytes).
    pub max_transfer: u32,
    /// Most entries an I/O queue may have.
    pub max_queue_entries: u16,
    /// Most payload bytes per FPDU sent.
    pub max_segment: usize,
    /// Most bytes of write data being fetched at once (the buffers of the
    /// RDMA Reads in flight; one read may always go): NVMe/TCP's
    /// `r2t_buffer`. Reads beyond it, or beyond the ORD, wait as a CID and
    /// a length, with no buffer yet.
    pub read_buffer: u32,
}

impl Default for TargetConfig {
    fn default() -> Self {
        TargetConfig {
            crc: true,
            ord: 32,
            max_in_capsule: 8192,
            max_transfer: 1024 * 1024,
            max_queue_entries: 1024,
            max_segment: 61440,
            read_buffer: 8 << 20,
        }
    }
}

/// Something the NVMe-oF layer must act on.
#[derive(Debug)]
pub enum Event<B> {
    /// A command capsule; `data` is its in-capsule data when it has some.
    Command {
        /// The submission queue entry.
        sqe: Sqe,
        /// In-capsule data.
        data: Option<B>,
    },
    /// A command capsule whose in-capsule data is `data`, a range of the
    /// bytes last given to [`TargetQueue::handle_input_lent`].
    CommandInInput {
        /// The submission queue entry.
        sqe: Sqe,
        /// Where its data lies in that input.
        data: std::ops::Range<usize>,
    },
    /// The write data fetched for `cid` arrived.
    Data {
        /// Command identifier.
        cid: u16,
        /// The command's data.
        data: B,
    },
    /// A command taken back by
    /// [`withdraw_command`](TargetQueue::withdraw_command), answered
    /// already: it never runs, but it came in this place in the queue (a
    /// fused Compare before it waits for it).
    Withdrawn {
        /// Its submission queue entry.
        sqe: Sqe,
    },
    /// The connection request was refused (the reject is queued): log
    /// `reason` and close once sent.
    Refused {
        /// What was wrong with it.
        reason: String,
    },
    /// The host sent an iWARP Terminate; close.
    HostTerminated(ErrorCode),
    /// A command came with the CID of one still in flight (the host broke
    /// the rule that CIDs are unique among its outstanding commands): it
    /// was answered with Command ID Conflict and never ran; the first
    /// keeps its keyed buffer. For the log.
    CidConflict {
        /// The CID reused.
        cid: u16,
    },
    /// A Connect named another queue or size than the CM request it came
    /// on: it was answered with Connect Invalid Parameters and never ran.
    /// For the log.
    ConnectMismatch {
        /// What differed.
        reason: String,
    },
    /// The connection request was accepted: what was agreed, for the log.
    Accepted {
        /// The queue ID asked for.
        qid: u16,
        /// Submission queue entries (receives posted).
        entries: u16,
        /// FPDUs carry CRC32C.
        crc: bool,
        /// RDMA Reads in flight at most.
        ord: u16,
    },
}

/// Read data of at least this many bytes is sent from the I/O's own buffer
/// ([`TargetQueue::send_data_from`]); smaller reads are copied into the
/// transmit bytes. Measured on loopback (docs/bench/2026-11-26-iwarp.md):
/// sending from the buffer gained nothing measurable at 16, 128 and 256 KiB
/// (one sitting even showed 15 % more CPU per Gbit/s at 16 KiB) and took
/// 20–23 % off the CPU per Gbit/s of 1 MiB reads in two sittings.
pub const SEND_FROM_BUFFER_MIN: usize = 512 << 10;

/// The controller side of one NVMe/RDMA queue.
pub struct TargetQueue<B> {
    cfg: TargetConfig,
    conn: Connection<B>,
    events: VecDeque<Event<B>>,
    /// Each command in flight (received, not yet answered) by CID, with
    /// its keyed SGL when it has one.
    in_flight: FxHashMap<u16, Option<Keyed>>,
    /// The queue ID from the CM request.
    cm_qid: u16,
    sqhd: u16,
    /// Submission queue entries: the CM request's, which Connect's SQSIZE
    /// must match ([`Self::connect_mismatch`]).
    sq_entries: u16,
    sqid: u16,
    sq_flow_disabled: bool,
    /// Write data to fetch once the ORD and `read_buffer` allow: CID and
    /// length.
    reads_waiting: VecDeque<(u16, u32)>,
    /// Bytes of the buffers of the RDMA Reads in flight.
    read_bytes: u64,
}

impl<B: DataBuffer> TargetQueue<B> {
    /// A queue waiting for the host's MPA request.
    pub fn new(cfg: TargetConfig) -> Self {
        let icfg = iwarp::Config {
            crc: cfg.crc,
            ird: 0,
            ord: cfg.ord.max(1),
            require_reads: true,
            max_segment: cfg.max_segment,
            recv_head: SQE_LEN,
            recv_max: SQE_LEN.saturating_add(cfg.max_in_capsule as usize),
        };
        TargetQueue {
            cfg,
            conn: Connection::responder(icfg),
            events: VecDeque::new(),
            in_flight: FxHashMap::default(),
            cm_qid: 0,
            sqhd: 0,
            sq_entries: cm::ADMIN_QUEUE_ENTRIES,
            sqid: 0,
            sq_flow_disabled: false,
            reads_waiting: VecDeque::new(),
            read_bytes: 0,
        }
    }

    /// Whether the connection is over (a Terminate or reject was sent or
    /// received): the driver closes once the transmit buffer is flushed.
    pub fn is_closed(&self) -> bool {
        self.conn.state() == State::Closed
    }

    /// Whether FPDUs carry CRC32C.
    pub fn crc(&self) -> bool {
        self.conn.crc()
    }

    /// The queue ID the host asked for in its CM request.
    pub fn cm_qid(&self) -> u16 {
        self.cm_qid
    }

    /// Records the queue once Connect succeeded (as NVMe/TCP's).
    pub fn set_queue(&mut self, sqid: u16, sqsize: u16, sq_flow_disabled: bool) {
        self.sqid = sqid;
        self.sq_entries = sqsize.saturating_add(1);
        self.sq_flow_disabled = sq_flow_disabled;
    }

    /// Feeds received bytes. An `Err` is fatal: a Terminate is queued and
    /// later input is ignored.
    pub fn handle_input(&mut self, bytes: &[u8]) -> Result<(), Fatal> {
        let r = self.conn.handle_input(bytes);
        let r2 = self.drain_connection();
        r.and(r2)
    }

    /// As [`handle_input`](Self::handle_input), except that in-capsule data
    /// lying whole in `bytes` is not copied: its command comes out as
    /// [`Event::CommandInInput`]. Before `bytes` goes, the caller polls
    /// those events or calls [`keep_input`](Self::keep_input).
    pub fn handle_input_lent(&mut self, bytes: &[u8]) -> Result<(), Fatal> {
        let r = self.conn.handle_input_lent(bytes);
        let r2 = self.drain_connection();
        r.and(r2)
    }

    /// Copies the in-capsule data of the commands from `input` not yet
    /// polled out of it, which is about to go.
    pub fn keep_input(&mut self, input: &[u8]) {
        for e in self.events.iter_mut() {
            if let Event::CommandInInput { sqe, data } = e {
                let bytes = input.get(data.clone()).unwrap_or_default();
                let mut buf = B::alloc(bytes.len());
                buf.as_mut().copy_from_slice(bytes);
                *e = Event::Command { sqe: *sqe, data: Some(buf) };
            }
        }
    }

    /// Bytes of write data (an RDMA Read Response's payload) the stream
    /// carries next; the caller may receive them straight into the
    /// command's buffer with [`take_direct`](Self::take_direct) and
    /// [`placed`](Self::placed) (`iwarp::Connection::direct_len`).
    pub fn direct_len(&self) -> usize {
        self.conn.direct_len()
    }

    /// Lends the buffer the next [`direct_len`](Self::direct_len) bytes
    /// belong in: the buffer, the offset and the length. No input may be
    /// fed until [`placed`](Self::placed) gives it back.
    pub fn take_direct(&mut self) -> Option<(B, usize, usize)> {
        self.conn.take_direct()
    }

    /// Gives the lent buffer back with `n` bytes received into it.
    pub fn placed(&mut self, buf: B, n: usize) -> Result<(), Fatal> {
        let r = self.conn.placed(buf, n);
        let r2 = self.drain_connection();
        r.and(r2)
    }

    /// Acts on what the connection decoded, in order. After a fatal error
    /// the rest is dropped: nothing the peer sent after it runs, even if
    /// the caller feeds more input.
    fn drain_connection(&mut self) -> Result<(), Fatal> {
        while let Some(ev) = self.conn.poll_event() {
            if let Err(f) = self.on_event(ev) {
                while self.conn.poll_event().is_some() {}
                return Err(f);
            }
        }
        Ok(())
    }

    fn on_event(&mut self, ev: iwarp::Event<B>) -> Result<(), Fatal> {
        match ev {
            iwarp::Event::ConnectRequest { private_data, .. } => self.on_connect_request(&private_data)?,
            iwarp::Event::Send(m) => self.on_send(m)?,
            iwarp::Event::ReadDone { id, buf } => {
                self.read_bytes = self.read_bytes.saturating_sub(buf.as_ref().len() as u64);
                self.issue_reads();
                self.events.push_back(Event::Data { cid: id as u16, data: buf });
            }
            iwarp::Event::Terminated(code) => self.events.push_back(Event::HostTerminated(code)),
            iwarp::Event::Established { .. } | iwarp::Event::Rejected { .. } => {}
        }
        Ok(())
    }

    fn on_connect_request(&mut self, pd: &[u8]) -> Result<(), Fatal> {
        match cm::parse_request(pd, self.cfg.max_queue_entries) {
            Ok(req) => {
                let entries = req.hsqsize.get().saturating_add(1);
                self.cm_qid = req.qid.get();
                self.sq_entries = entries;
                let reply = CmReply { recfmt: 0.into(), crqsize: entries.into(), rsvd: [0; 28] };
                // Posted first: `accept` goes on to what the host sent
                // behind its request.
                self.conn.post_receives(u32::from(entries));
                self.conn.accept(reply.as_bytes())?;
                // Room for every queue entry: the map never grows
                // (allocates) in the middle of the I/O.
                self.in_flight.reserve(usize::from(entries));
                self.reads_waiting.reserve(usize::from(entries));
                self.events.push_back(Event::Accepted {
                    qid: self.cm_qid,
                    entries,
                    crc: self.conn.crc(),
                    ord: self.conn.ord(),
                });
                // Commands may have come with the request.
                self.drain_connection()
            }
            Err((sts, reason)) => {
                let rej = CmReject { recfmt: 0.into(), sts: sts.0.into() };
                self.conn.reject(rej.as_bytes());
                self.events.push_back(Event::Refused { reason });
                Ok(())
            }
        }
    }

    fn on_send(&mut self, m: iwarp::Received<B>) -> Result<(), Fatal> {
        // The head array is exactly an SQE: its fields are read where they
        // lie, and it is copied whole into the event.
        let (true, Ok((sqe, _))) = (m.head_len == SQE_LEN, Sqe::ref_from_prefix(&m.head)) else {
            return Err(self.conn.abort(Fatal::new(
                ErrorCode::RDMAP_LOCAL_CATASTROPHIC,
                format!("command capsule of {} bytes (at least {SQE_LEN})", m.head_len),
            )));
        };
        let in_capsule = match (&m.body, &m.lent) {
            (Some(b), _) => b.as_ref().len(),
            (None, Some(r)) => r.end.saturating_sub(r.start) as usize,
            (None, None) => 0,
        };
        let cid = sqe.cid.get();
        match self.in_flight.entry(cid) {
            Entry::Vacant(v) => {
                let key = match sgl::parse(sqe, in_capsule, self.cfg.max_transfer) {
                    Ok(DataPtr::Keyed(k)) => Some(k),
                    _ => None,
                };
                v.insert(key);
            }
            Entry::Occupied(_) => {
                // Whatever this command is (its SGL refused or not), the
                // entry is the first command's: its key must not be
                // overwritten, nor taken or invalidated by this answer.
                self.complete(Cqe::new(cid, Status::CID_CONFLICT.dnr(), 0), None);
                self.events.push_back(Event::CidConflict { cid });
                return Ok(());
            }
        }
        if let Some((reason, ipo)) = self.connect_mismatch(sqe) {
            let result = connect_invalid_param_result(false, ipo);
            self.send_response(Cqe::new(cid, Status::CONNECT_INVALID_PARAMETERS.dnr(), result));
            self.events.push_back(Event::ConnectMismatch { reason });
            return Ok(());
        }
        let sqe = *sqe;
        match m.lent {
            Some(r) => self.events.push_back(Event::CommandInInput { sqe, data: r.start as usize..r.end as usize }),
            None => self.events.push_back(Event::Command { sqe, data: m.body }),
        }
        Ok(())
    }

    /// Why a Fabrics Connect does not fit this queue, and the offset of
    /// the field (IPO): the CM request's QID and HSQSIZE must be the
    /// Connect's QID and SQSIZE (NVMe/RDMA transport 1.0, CM private data).
    /// The receives were posted for the CM request's queue; a larger SQSIZE
    /// would let the host send into none.
    fn connect_mismatch(&self, sqe: &Sqe) -> Option<(String, u16)> {
        if sqe.opcode != Admin::FABRICS.0 || FabricsType(sqe.fctype()) != FabricsType::CONNECT {
            return None;
        }
        let cmd = ConnectCmd::from_sqe(sqe);
        let cm_sqsize = self.sq_entries.saturating_sub(1);
        if cmd.qid != self.cm_qid {
            Some((
                format!("Connect QID {} on a queue the CM request made for QID {}", cmd.qid, self.cm_qid),
                ConnectCmd::QID_OFFSET,
            ))
        } else if cmd.sqsize != cm_sqsize {
            Some((
                format!("Connect SQSIZE {} (the CM request's HSQSIZE is {cm_sqsize})", cmd.sqsize),
                ConnectCmd::SQSIZE_OFFSET,
            ))
        } else {
            None
        }
    }

    /// The SGL check for a command's data: the transfer length in bytes,
    /// or the status to complete with.
    pub fn check_sgl(&self, sqe: &Sqe, in_capsule_len: Option<usize>) -> Result<u32, Status> {
        match sgl::parse(sqe, in_capsule_len.unwrap_or(0), self.cfg.max_transfer)? {
            DataPtr::Keyed(k) => Ok(k.len),
            DataPtr::InCapsule { len } => Ok(len),
        }
    }

    /// Fetches `len` bytes of write data for `cid` from the host's keyed
    /// buffer with an RDMA Read; [`Event::Data`] brings them. Reads beyond
    /// the negotiated ORD or [`TargetConfig::read_buffer`] wait in order,
    /// their buffer not yet taken.
    pub fn request_data(&mut self, cid: u16, len: u32) {
        if let Some(k) = self.key(cid) {
            self.reads_waiting.push_back((cid, len.min(k.len)));
            self.issue_reads();
        }
    }

    /// Issues the waiting reads the ORD and the buffer budget have room
    /// for, each with its buffer taken now.
    fn issue_reads(&mut self) {
        while let Some(&(cid, len)) = self.reads_waiting.front() {
            let ord_room = self.conn.reads_in_flight() < usize::from(self.conn.ord().max(1));
            let budget = block::fits_budget(self.read_bytes, len, self.cfg.read_buffer);
            if !(ord_room && budget && self.conn.reads_waiting() == 0) {
                break;
            }
            self.reads_waiting.pop_front();
            if let Some(k) = self.key(cid) {
                self.read_bytes = self.read_bytes.saturating_add(u64::from(len));
                self.conn.read(u64::from(cid), B::alloc(len as usize), k.key, k.addr);
            }
        }
    }

    /// Bytes of buffers held for RDMA Reads in flight (at most
    /// [`TargetConfig::read_buffer`], or one read's).
    pub fn read_bytes(&self) -> u64 {
        self.read_bytes
    }

    /// Takes back the command `cid` while it is received but not yet
    /// polled (the driver stopped taking events because the host does not
    /// take its replies): it is aborted before it started. The caller
    /// answers it (with [`send_response`](Self::send_response), which
    /// releases its key and reposts its receive). It stays in line as
    /// [`Event::Withdrawn`]. `false` when no such command waits.
    pub fn withdraw_command(&mut self, cid: u16) -> bool {
        let Some(e) = self.events.iter_mut().find(
            |e| matches!(e, Event::Command { sqe, .. } | Event::CommandInInput { sqe, .. } if sqe.cid.get() == cid),
        ) else {
            return false;
        };
        let (Event::Command { sqe, .. } | Event::CommandInInput { sqe, .. }) = *e else { return false };
        *e = Event::Withdrawn { sqe };
        true
    }

    /// Gives up the write data of `cid` (its command is being aborted)
    /// while its RDMA Read still waits to be issued: it never will be.
    /// `false` for a read already requested: it cannot be recalled, and
    /// the command must not complete while the host's RNIC may still
    /// read its buffer (a completion lets the host invalidate the key
    /// and reuse the memory), so it runs to its end, not aborted.
    pub fn cancel_data(&mut self, cid: u16) -> bool {
        match self.reads_waiting.iter().position(|&(c, _)| c == cid) {
            Some(i) => {
                self.reads_waiting.remove(i);
                true
            }
            None => false,
        }
    }

    /// Sends read data for `cid` into the host's keyed buffer, then the
    /// completion.
    pub fn send_data(&mut self, cid: u16, data: &[u8], cqe: Cqe) {
        match self.key(cid) {
            Some(k) => {
                let n = data.len().min(k.len as usize);
                self.conn.write(k.key, k.addr, data.get(..n).unwrap_or_default());
            }
            None if !data.is_empty() => return self.no_buffer(cid),
            None => {}
        }
        self.send_response(cqe);
    }

    /// Completes `cid`, whose data has no keyed buffer of the host to go
    /// to, with an error: never a success whose data was not sent.
    fn no_buffer(&mut self, cid: u16) {
        self.send_response(Cqe::new(cid, Status::DATA_TRANSFER_ERROR.dnr(), 0));
    }

    /// As [`send_data`](Self::send_data), sending the data from `data`
    /// itself (the device's I/O buffer): nothing is copied; see
    /// [`take_transmit_parts`](Self::take_transmit_parts).
    /// Below [`SEND_FROM_BUFFER_MIN`] bytes the data is copied as by
    /// `send_data`.
    pub fn send_data_from(&mut self, cid: u16, data: B, cqe: Cqe) {
        match self.key(cid) {
            Some(k) => {
                let n = data.as_ref().len().min(k.len as usize);
                if n < SEND_FROM_BUFFER_MIN {
                    self.conn.write(k.key, k.addr, data.as_ref().get(..n).unwrap_or_default());
                } else {
                    self.conn.write_from(k.key, k.addr, data, n);
                }
            }
            None if !data.as_ref().is_empty() => return self.no_buffer(cid),
            None => {}
        }
        self.send_response(cqe);
    }

    /// As [`send_data`](Self::send_data) with `len` zero bytes (a null
    /// device's read), written nowhere: their splices name
    /// [`iwarp::ZEROS`] ([`take_transmit_parts`](Self::take_transmit_parts)).
    /// Returns `false`, having queued nothing, when the command has no
    /// keyed buffer of the host that holds `len` bytes (or `len` is 0); the
    /// caller then answers another way.
    pub fn send_zeros(&mut self, cid: u16, len: usize, cqe: Cqe) -> bool {
        let Some(k) = self.key(cid) else { return false };
        if len == 0 || len > k.len as usize || !self.conn.write_zeros(k.key, k.addr, len) {
            return false;
        }
        self.send_response(cqe);
        true
    }

    /// As [`send_data`](Self::send_data) with `len` bytes that `fill`
    /// appends straight to the send buffer (one FPDU). Returns `false`,
    /// having queued nothing, when `fill` does (or appends another number
    /// of bytes) or when `len` needs more than one FPDU; the caller then
    /// answers another way.
    pub fn send_data_with(
        &mut self,
        cid: u16,
        len: usize,
        cqe: Cqe,
        fill: impl FnOnce(&mut Appender<'_>) -> bool,
    ) -> bool {
        let Some(k) = self.key(cid) else { return false };
        if len == 0 || len > self.cfg.max_segment || len > k.len as usize {
            return false;
        }
        let mut fill = Some(fill);
        if !self.conn.write_with(k.key, k.addr, len, |_, out| fill.take().is_some_and(|f| f(out))) {
            return false;
        }
        self.send_response(cqe);
        true
    }

    /// The keyed SGL of the command `cid` in flight, if it has one.
    fn key(&self, cid: u16) -> Option<Keyed> {
        self.in_flight.get(&cid).copied().flatten()
    }

    /// Sends a completion: one Send of the 16-byte CQE, with Invalidate of
    /// the command's key when its SGL asked for it. SQHD and SQID are filled
    /// in here; the command's receive is posted again.
    pub fn send_response(&mut self, cqe: Cqe) {
        let status = cqe.status();
        if (status.sct(), status.sc()) == (Status::CID_CONFLICT.sct(), Status::CID_CONFLICT.sc()) {
            // The answer to a second command with a running command's CID
            // (the core refused it): the key kept for that CID is the
            // running command's, which this answer must neither take nor
            // invalidate.
            self.complete(cqe, None);
            return;
        }
        // An empty descriptor describes no registered buffer: its key may
        // name no STag of the host's, whose RNIC would end the queue with a
        // Terminate on the Invalidate. nvmet invalidates nothing for it.
        let invalidate =
            self.in_flight.remove(&cqe.cid.get()).flatten().filter(|k| k.invalidate && k.len != 0).map(|k| k.key);
        self.complete(cqe, invalidate);
    }

    /// Sends `cqe` (with Invalidate of `invalidate`) and posts the
    /// command's receive again.
    fn complete(&mut self, mut cqe: Cqe, invalidate: Option<u32>) {
        // The entry is freed with its receive, posted again here, not when
        // its command arrived: a host that fills its SQ by the SQHD must
        // find a receive for every command (nvmet moves SQHD at completion
        // too).
        self.sqhd = self.sqhd.wrapping_add(1).checked_rem(self.sq_entries).unwrap_or(0);
        cqe.sqhd = if self.sq_flow_disabled { 0xffff } else { self.sqhd }.into();
        cqe.sqid = self.sqid.into();
        self.conn.post_receives(1);
        self.conn.send(cqe.as_bytes(), &[], invalidate);
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event<B>> {
        self.events.pop_front()
    }

    /// Bytes waiting to be sent.
    pub fn transmit_len(&self) -> usize {
        self.conn.transmit_len()
    }

    /// Moves the bytes to send to the end of `out` (data sent from its own
    /// buffer copied in).
    pub fn take_transmit(&mut self, out: &mut Vec<u8>) {
        self.conn.take_transmit(out);
    }

    /// Moves what there is to send to the end of `head` and `bufs`, data
    /// sent from its own buffer left there and its pieces given to
    /// `splice` (`iwarp::Connection::take_transmit_parts`).
    pub fn take_transmit_parts(&mut self, head: &mut Vec<u8>, bufs: &mut Vec<B>, splice: impl FnMut(iwarp::Splice)) {
        self.conn.take_transmit_parts(head, bufs, splice);
    }
}
