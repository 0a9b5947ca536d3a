//! One iWARP connection, either end: the MPA handshake, then full
//! operation (FPDU framing, DDP placement, RDMAP messages).
//!
//! States are named for what they wait for: the responder for the MPA
//! request ([`State::AwaitRequest`]) and then for its upper layer to accept
//! or reject it ([`State::AwaitAccept`]); the initiator for the reply
//! ([`State::AwaitReply`]); both then run [`State::Rdma`] until a Terminate
//! is sent or received ([`State::Closed`]), after which input is ignored and
//! the driver closes the socket once the transmit buffer is flushed.
//!
//! Receiving is a stream parser: a segment's header is checked (sequence
//! numbers, STag, offset and length against the buffer it targets) before
//! any of its payload is placed, and the payload then goes straight from the
//! input into that buffer: an RDMA Read Response into the sink buffer of the
//! read it answers, an RDMA Write into a registered region, a Send into the
//! next posted receive. The CRC of the FPDU is checked when its last byte
//! has arrived; a message completes only once all its FPDUs passed.

use crate::error::{ErrorCode, Fatal};
use crate::mpa::{self, Frame, Kind};
use crate::wire::{
    self, hdrct, Ctrl, Opcode, ReadRequest, TaggedHeader, TerminateHeader, UntaggedHeader, CRC_LEN, LEN_FIELD,
    QN_READ_REQUEST, QN_SEND, QN_TERMINATE, READ_REQUEST_LEN, TAGGED_LEN, UNTAGGED_LEN,
};
use block::DataBuffer;
use checksum::{Appender, Crc32c};
use std::collections::VecDeque;
use std::ops::Range;
use zerocopy::{FromBytes, IntoBytes};

/// The most bytes of a received Send that land in its head (the part an
/// upper layer parses, such as a 64-byte NVMe command).
pub const HEAD_MAX: usize = 64;
/// Bytes of a Terminate's echoed headers kept for the log.
const TERMINATE_ECHO_MAX: usize = 128;
/// Bytes a responder holds that arrived before its upper layer accepted.
const EARLY_INPUT_MAX: usize = 256 * 1024;
/// Sink STags of our own RDMA Reads live apart from registered regions.
const READ_STAG_BASE: u32 = 0x8000_0000;

/// What this end asks for and enforces.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Ask for CRC32C on FPDUs. The peer's request for CRC is honoured
    /// either way (RFC 5044: CRC is used when either end asks).
    pub crc: bool,
    /// IRD: inbound RDMA Reads this end serves (0: none).
    pub ird: u16,
    /// ORD: outbound RDMA Reads this end keeps in flight at most.
    pub ord: u16,
    /// Refuse a peer that serves no RDMA Reads (this end needs them).
    pub require_reads: bool,
    /// Most payload bytes per FPDU sent (kept a multiple of 8, at most what
    /// the 16-bit ULPDU length allows).
    pub max_segment: usize,
    /// Bytes of a received Send that form its head ([`Received::head`]),
    /// at most [`HEAD_MAX`].
    pub recv_head: usize,
    /// The most bytes one received Send may carry (the posted receive
    /// buffer's size).
    pub recv_max: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            crc: true,
            ird: 0,
            ord: 32,
            require_reads: false,
            max_segment: 61440,
            recv_head: HEAD_MAX,
            recv_max: 64 + 8192,
        }
    }
}

/// Which end of the MPA handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Sends the MPA request (the host).
    Initiator,
    /// Answers it (the target).
    Responder,
}

/// What the connection waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Responder: the MPA request.
    AwaitRequest,
    /// Responder: the upper layer's [`Connection::accept`] or
    /// [`Connection::reject`].
    AwaitAccept,
    /// Initiator: the MPA reply.
    AwaitReply,
    /// Full operation.
    Rdma,
    /// A Terminate or reject was sent or received: over.
    Closed,
}

/// A complete Send message.
#[derive(Debug)]
pub struct Received<B> {
    /// The first [`Config::recv_head`] bytes (fewer if the message is
    /// shorter).
    pub head: [u8; HEAD_MAX],
    /// How many bytes of `head` the message filled.
    pub head_len: usize,
    /// The rest of the message, if any (and not `lent`).
    pub body: Option<B>,
    /// The rest of the message when it lay whole in the input given to
    /// [`Connection::handle_input_lent`]: where it lies there (offsets of
    /// 32 bits keep the whole message within 128 bytes, moved without a
    /// call to `memcpy`). It must be
    /// used or copied before that input goes.
    pub lent: Option<std::ops::Range<u32>>,
    /// The STag a Send with Invalidate invalidated.
    pub invalidated: Option<u32>,
    /// The Send asked for a solicited event.
    pub solicited: bool,
}

impl<B> Received<B> {
    /// A message of nothing, to be filled in where it lies.
    const EMPTY: Self =
        Received { head: [0; HEAD_MAX], head_len: 0, body: None, lent: None, invalidated: None, solicited: false };

    /// The head bytes.
    pub fn head(&self) -> &[u8] {
        self.head.get(..self.head_len).unwrap_or_default()
    }
}

/// Something the upper layer must act on.
#[derive(Debug)]
pub enum Event<B> {
    /// Responder: the initiator's MPA request; answer with
    /// [`Connection::accept`] or [`Connection::reject`].
    ConnectRequest {
        /// The upper layer's private data.
        private_data: Vec<u8>,
        /// The initiator's IRD.
        ird: u16,
        /// The initiator's ORD.
        ord: u16,
    },
    /// Initiator: the responder accepted; full operation begins.
    Established {
        /// The upper layer's private data from the reply.
        private_data: Vec<u8>,
    },
    /// Initiator: the responder rejected the connection.
    Rejected {
        /// The upper layer's private data from the reply.
        private_data: Vec<u8>,
    },
    /// A Send arrived.
    Send(Received<B>),
    /// An RDMA Read this end issued completed: `buf` holds the data.
    ReadDone {
        /// The identifier given to [`Connection::read`].
        id: u64,
        /// The sink buffer, filled.
        buf: B,
    },
    /// The peer sent a Terminate: the connection is over.
    Terminated(ErrorCode),
}

/// Remote access a registered region allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The peer may RDMA Write into it.
    RemoteWrite,
    /// The peer may RDMA Read from it.
    RemoteRead,
}

struct Region<B> {
    stag: u32,
    base: u64,
    access: Access,
    valid: bool,
    buf: B,
    /// Which of its bytes RDMA Writes placed.
    written: Coverage,
}

/// The bytes of a region RDMA Writes placed: the run from its start, and
/// up to [`COVERAGE_RUNS`] runs past a gap (a peer writing out of order;
/// runs past those are not tracked, so the region reads as not covered).
/// Nothing is allocated while the writes come in order.
#[derive(Default)]
struct Coverage {
    front: usize,
    runs: Vec<(usize, usize)>,
}

/// Runs past a gap a region tracks ([`Coverage`]).
const COVERAGE_RUNS: usize = 16;

impl Coverage {
    /// Bytes `start..end` were placed.
    fn add(&mut self, start: usize, end: usize) {
        if start > self.front {
            // A segment's pieces continue a run (placed as they arrive).
            let room = self.runs.len() < COVERAGE_RUNS;
            match self.runs.iter_mut().find(|(s, e)| start <= *e && end >= *s) {
                Some(run) => *run = (run.0.min(start), run.1.max(end)),
                None if room => self.runs.push((start, end)),
                None => {}
            }
            return;
        }
        self.front = self.front.max(end);
        while let Some(i) = self.runs.iter().position(|&(s, _)| s <= self.front) {
            let (_, e) = self.runs.swap_remove(i);
            self.front = self.front.max(e);
        }
    }
}

/// One of our RDMA Reads, in flight or waiting for ORD room.
struct Read<B> {
    id: u64,
    sink_stag: u32,
    src_stag: u32,
    src_to: u64,
    received: usize,
    /// The sink's length.
    size: usize,
    /// The sink; `None` while lent for direct placement
    /// ([`Connection::take_direct`]).
    buf: Option<B>,
}

/// Where the payload of the segment being received goes.
#[derive(Clone, Copy, Debug)]
enum Dest {
    /// Zero-length payload.
    Nothing,
    /// A registered region (an RDMA Write), at this byte offset.
    Region { index: usize, offset: usize },
    /// The oldest read in flight (an RDMA Read Response), at this offset.
    Sink { offset: usize },
    /// The Send being reassembled.
    Send,
    /// A Terminate's echoed headers.
    Terminate,
}

#[derive(Clone, Copy, Debug)]
enum Rx {
    /// The fixed header: `need` bytes once the opcode is known (4 before).
    Header { need: usize },
    /// Payload bytes still to come.
    Payload { left: usize },
    /// Pad and CRC bytes: `need` in all.
    Trailer { need: usize },
}

/// The Send being received.
struct Inbound<B> {
    active: bool,
    received: usize,
    head: [u8; HEAD_MAX],
    head_len: usize,
    body: Option<(B, usize)>,
    /// The body lies in the lent input: its start there, bytes so far.
    lent: Option<(usize, usize)>,
    staged: Vec<u8>,
    invalidate: Option<u32>,
    solicited: bool,
}

/// [`Splice::buf`] of a payload of zero bytes ([`Connection::write_zeros`]),
/// which the caller sends from zeros of its own: no buffer holds it.
pub const ZEROS: usize = usize::MAX;

/// Payload that goes out from a buffer of its own rather than through the
/// transmit bytes ([`Connection::write_from`]): `len` bytes of buffer `buf`
/// from `start`, sent at position `at` of the transmit bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Splice {
    /// Where in the transmit bytes the payload goes (before the byte there).
    pub at: usize,
    /// Which buffer, or [`ZEROS`].
    pub buf: usize,
    /// First byte of the buffer sent (for [`ZEROS`], the payload's offset
    /// in its message, which says nothing about where zeros come from).
    pub start: usize,
    /// Bytes sent.
    pub len: usize,
}

/// One iWARP connection.
pub struct Connection<B> {
    cfg: Config,
    role: Role,
    state: State,
    request: Option<Frame>,
    /// MPA frame bytes, then bytes that arrived before the upper layer
    /// accepted.
    mpa_rx: Vec<u8>,
    crc: bool,
    ord: u16,
    ird: u16,
    events: VecDeque<Event<B>>,
    tx: Vec<u8>,
    /// Payload sent from buffers of its own, by position in `tx`.
    tx_splices: Vec<Splice>,
    tx_bufs: Vec<B>,
    /// Bytes of `tx_splices`.
    tx_spliced: usize,
    // receive
    rx: Rx,
    hdr: [u8; READ_REQUEST_LEN],
    hdr_len: usize,
    trailer: [u8; 7],
    trailer_len: usize,
    rx_crc: Crc32c,
    ctrl: Ctrl,
    dest: Dest,
    payload_len: usize,
    rx_msn: [u32; 2],
    recv_credits: u32,
    inbound: Inbound<B>,
    /// The oldest read's sink is lent out for direct placement.
    lent: bool,
    /// The input being fed is lent ([`Connection::handle_input_lent`]):
    /// a Send whose body lies whole in it is not copied.
    lending: bool,
    /// Where the payload of the segment being begun starts in the input
    /// being fed, and how many bytes of that input follow it.
    input_at: usize,
    input_left: usize,
    /// The RDMA Write being received: its STag and the next tagged offset.
    write_next: Option<(u32, u64)>,
    term_echo: Vec<u8>,
    // our reads
    reads: VecDeque<Read<B>>,
    reads_waiting: VecDeque<Read<B>>,
    next_read_stag: u32,
    /// The peer's RDMA Reads answered in the transmit bytes and not yet
    /// taken for sending: at most the IRD.
    reads_served: usize,
    // transmit
    tx_msn: [u32; 2],
    // registered memory
    regions: Vec<Option<Region<B>>>,
    free_regions: Vec<usize>,
    next_key: u8,
}

impl<B: DataBuffer> Connection<B> {
    fn new(cfg: Config, role: Role, state: State) -> Self {
        let mut cfg = cfg;
        cfg.max_segment = cfg.max_segment.clamp(8, wire::MAX_ULPDU - UNTAGGED_LEN) & !7;
        cfg.recv_head = cfg.recv_head.min(HEAD_MAX);
        cfg.ird = cfg.ird.min(mpa::MAX_IRD_ORD);
        cfg.ord = cfg.ord.min(mpa::MAX_IRD_ORD);
        Connection {
            cfg,
            role,
            state,
            request: None,
            mpa_rx: Vec::new(),
            crc: false,
            ord: 0,
            ird: 0,
            events: VecDeque::new(),
            tx: Vec::new(),
            tx_splices: Vec::new(),
            tx_bufs: Vec::new(),
            tx_spliced: 0,
            rx: Rx::Header { need: 4 },
            hdr: [0; READ_REQUEST_LEN],
            hdr_len: 0,
            trailer: [0; 7],
            trailer_len: 0,
            rx_crc: Crc32c::new(),
            ctrl: Ctrl(0),
            dest: Dest::Nothing,
            payload_len: 0,
            rx_msn: [1, 1],
            recv_credits: 0,
            inbound: Inbound {
                active: false,
                received: 0,
                head: [0; HEAD_MAX],
                head_len: 0,
                body: None,
                lent: None,
                staged: Vec::new(),
                invalidate: None,
                solicited: false,
            },
            lent: false,
            lending: false,
            input_at: 0,
            input_left: 0,
            write_next: None,
            term_echo: Vec::new(),
            reads: VecDeque::new(),
            reads_waiting: VecDeque::new(),
            next_read_stag: READ_STAG_BASE,
            reads_served: 0,
            tx_msn: [0, 0],
            regions: Vec::new(),
            free_regions: Vec::new(),
            next_key: 0,
        }
    }

    /// The passive end: waits for the MPA request.
    pub fn responder(cfg: Config) -> Self {
        Self::new(cfg, Role::Responder, State::AwaitRequest)
    }

    /// The active end: queues the MPA request (enhanced, revision 2, with
    /// this end's IRD and ORD and the upper layer's `private_data`).
    pub fn initiator(cfg: Config, private_data: &[u8]) -> Self {
        let mut c = Self::new(cfg, Role::Initiator, State::AwaitReply);
        let flags = mpa::flags::ENHANCED | if c.cfg.crc { mpa::flags::CRC } else { 0 };
        let frame = Frame {
            kind: Kind::Request,
            flags,
            revision: 2,
            ird_ord: Some((c.cfg.ird, c.cfg.ord)),
            private_data: private_data.to_vec(),
        };
        frame.encode(&mut c.tx);
        c
    }

    /// Which end this is.
    pub fn role(&self) -> Role {
        self.role
    }

    /// What the connection waits for.
    pub fn state(&self) -> State {
        self.state
    }

    /// Whether FPDUs carry CRC32C (known once established).
    pub fn crc(&self) -> bool {
        self.crc
    }

    /// The negotiated ORD: RDMA Reads this end keeps in flight at most.
    pub fn ord(&self) -> u16 {
        self.ord
    }

    /// The negotiated IRD: RDMA Reads from the peer this end serves.
    pub fn ird(&self) -> u16 {
        self.ird
    }

    /// The next thing the upper layer must act on.
    pub fn poll_event(&mut self) -> Option<Event<B>> {
        self.events.pop_front()
    }

    /// The next event, left where it is (read a Send's head in place, then
    /// [`poll_event`](Self::poll_event) takes it): an event moved out
    /// whole is stored again, and a header read right after waits for
    /// those stores.
    pub fn peek_event(&self) -> Option<&Event<B>> {
        self.events.front()
    }

    /// Moves the bytes to send to the end of `out`, copying in the
    /// payload of [`write_from`](Self::write_from) (see
    /// [`take_transmit_parts`](Self::take_transmit_parts) to send it from
    /// its own buffer).
    pub fn take_transmit(&mut self, out: &mut Vec<u8>) {
        self.reads_served = 0;
        if self.tx_splices.is_empty() && out.is_empty() {
            std::mem::swap(out, &mut self.tx);
            return;
        }
        let mut from = 0;
        for s in self.tx_splices.drain(..) {
            out.extend_from_slice(self.tx.get(from..s.at).unwrap_or_default());
            if s.buf == ZEROS {
                out.resize(out.len().saturating_add(s.len), 0);
            } else {
                let payload =
                    self.tx_bufs.get(s.buf).and_then(|b| b.as_ref().get(s.start..s.start.saturating_add(s.len)));
                out.extend_from_slice(payload.unwrap_or_default());
            }
            from = s.at;
        }
        out.extend_from_slice(self.tx.get(from..).unwrap_or_default());
        self.tx.clear();
        self.tx_bufs.clear();
        self.tx_spliced = 0;
    }

    /// Moves what there is to send to the end of `head` and `bufs`: the
    /// bytes, and the buffers whose payload is sent from where it lies,
    /// each piece given to `splice` with its position in `head` and its
    /// buffer's index in `bufs`; nothing is copied.
    pub fn take_transmit_parts(&mut self, head: &mut Vec<u8>, bufs: &mut Vec<B>, mut splice: impl FnMut(Splice)) {
        self.reads_served = 0;
        let (at, buf) = (head.len(), bufs.len());
        for s in self.tx_splices.drain(..) {
            let index = if s.buf == ZEROS { ZEROS } else { s.buf.saturating_add(buf) };
            splice(Splice { at: s.at.saturating_add(at), buf: index, ..s });
        }
        bufs.append(&mut self.tx_bufs);
        self.tx_spliced = 0;
        if head.is_empty() {
            std::mem::swap(head, &mut self.tx);
        } else {
            head.append(&mut self.tx);
        }
    }

    /// Bytes waiting to be sent.
    pub fn transmit_len(&self) -> usize {
        self.tx.len().saturating_add(self.tx_spliced)
    }

    /// Posts `n` more receives: the peer may send that many more Send
    /// messages. A Send with no receive posted ends the connection.
    pub fn post_receives(&mut self, n: u32) {
        self.recv_credits = self.recv_credits.saturating_add(n);
    }

    /// Receives posted and not yet used.
    pub fn posted_receives(&self) -> u32 {
        self.recv_credits
    }

    /// Feeds bytes from the socket. An `Err` is fatal: the Terminate (or
    /// MPA reject) is queued for sending and the connection is closed (a
    /// responder that has not replied queues nothing: its peer reads no
    /// FPDU yet).
    pub fn handle_input(&mut self, input: &[u8]) -> Result<(), Fatal> {
        if self.lent && !input.is_empty() {
            // Bytes of the stream must arrive in order: the ones for the
            // lent buffer first, through `placed`.
            let f = Fatal::new(ErrorCode::DDP_CATASTROPHIC, "input while a read's sink is lent for direct placement");
            return Err(self.fail(f));
        }
        let r = match self.state {
            State::Closed => Ok(()),
            State::AwaitAccept if self.mpa_rx.len().saturating_add(input.len()) > EARLY_INPUT_MAX => Err(Fatal::new(
                ErrorCode::MPA_FPDU,
                format!("more than {EARLY_INPUT_MAX} bytes sent before the MPA reply"),
            )),
            State::AwaitAccept => {
                self.mpa_rx.extend_from_slice(input);
                Ok(())
            }
            State::AwaitRequest | State::AwaitReply => self.handle_mpa(input),
            State::Rdma => self.handle_fpdus(input),
        };
        r.map_err(|e| self.fail(e))
    }

    /// As [`handle_input`](Self::handle_input), except that a Send whose
    /// body lies whole in `input` is not copied: its
    /// [`Received::lent`] says where the body lies in `input`.
    pub fn handle_input_lent(&mut self, input: &[u8]) -> Result<(), Fatal> {
        // Only FPDUs from the first byte: before full operation the input
        // is parsed (or buffered) elsewhere and offsets would not hold; and
        // offsets that fit [`Received::lent`]'s 32 bits.
        self.lending = self.state == State::Rdma && u32::try_from(input.len()).is_ok();
        let r = self.handle_input(input);
        self.lending = false;
        // A body still lent once the input is done (the connection failed
        // mid-message) is copied out: a range never outlives its input.
        let inb = &mut self.inbound;
        if let Some((start, filled)) = inb.lent.take() {
            let mut buf = B::alloc(self.payload_len.saturating_sub(self.cfg.recv_head).max(filled));
            if let (Some(dst), Some(src)) =
                (buf.as_mut().get_mut(..filled), input.get(start..start.saturating_add(filled)))
            {
                dst.copy_from_slice(src);
            }
            inb.body = Some((buf, filled));
        }
        r
    }

    /// Bytes of an RDMA Read Response's payload the stream carries next,
    /// all bound for the oldest read's sink (0 when the next bytes are
    /// anything else: a header, a trailer, another message's payload). The
    /// caller may receive them straight into the sink: [`take_direct`],
    /// then [`placed`]. This is direct data placement in software: the
    /// payload goes from the socket into the I/O's buffer, not through a
    /// receive buffer.
    ///
    /// [`take_direct`]: Self::take_direct
    /// [`placed`]: Self::placed
    pub fn direct_len(&self) -> usize {
        match (self.state, self.rx, self.dest) {
            (State::Rdma, Rx::Payload { left }, Dest::Sink { .. }) if !self.lent => left,
            _ => 0,
        }
    }

    /// Lends the oldest read's sink for direct placement: the buffer, the
    /// offset the next payload byte belongs at, and how many bytes (as
    /// [`direct_len`](Self::direct_len)). Until [`placed`](Self::placed)
    /// gives it back, no other input may be fed.
    pub fn take_direct(&mut self) -> Option<(B, usize, usize)> {
        let left = self.direct_len();
        let Dest::Sink { offset } = self.dest else { return None };
        if left == 0 {
            return None;
        }
        let buf = self.reads.front_mut()?.buf.take()?;
        self.lent = true;
        Some((buf, offset, left))
    }

    /// Gives the sink lent by [`take_direct`](Self::take_direct) back with
    /// `n` more payload bytes received into it at the offset it named (at
    /// most the length it named); they count toward the FPDU's CRC as if
    /// they had come through [`handle_input`](Self::handle_input).
    pub fn placed(&mut self, buf: B, n: usize) -> Result<(), Fatal> {
        let (Rx::Payload { left }, Dest::Sink { offset }, true) = (self.rx, self.dest, self.lent) else {
            let f = Fatal::new(ErrorCode::DDP_CATASTROPHIC, "placed() without a lent read sink");
            return Err(self.fail(f));
        };
        self.lent = false;
        let Some(read) = self.reads.front_mut() else {
            return Err(self.fail(self.internal()));
        };
        read.buf = Some(buf);
        let n = n.min(left);
        if self.crc {
            if let Some(placed) = read.buf.as_ref().and_then(|b| b.as_ref().get(offset..offset.saturating_add(n))) {
                self.rx_crc.update(placed);
            }
        }
        self.dest = Dest::Sink { offset: offset.saturating_add(n) };
        let left = left.saturating_sub(n);
        self.rx = if left == 0 { self.trailer_state() } else { Rx::Payload { left } };
        Ok(())
    }

    /// Responder: accepts the connection asked for in
    /// [`Event::ConnectRequest`], replying with `private_data`, and
    /// processes what the initiator sent since.
    pub fn accept(&mut self, private_data: &[u8]) -> Result<(), Fatal> {
        let Some(req) = self.request.take().filter(|_| self.state == State::AwaitAccept) else {
            return Ok(());
        };
        self.crc = self.cfg.crc || req.has(mpa::flags::CRC);
        let peer_ird = req.ird();
        // Without the enhanced setup nothing was negotiated: issue reads
        // one at a time.
        self.ord = peer_ird.map_or(1, |ird| self.cfg.ord.min(ird));
        // The initiator adopts our IRD as its ORD (RFC 6581's relaxed
        // negotiation, as siw does), so its wish for more reads is not an
        // error here.
        self.ird = self.cfg.ird;
        let mut flags = if self.crc { mpa::flags::CRC } else { 0 };
        let ird_ord = if req.has(mpa::flags::ENHANCED) {
            flags |= mpa::flags::ENHANCED;
            Some((self.ird, self.ord))
        } else {
            None
        };
        let reply =
            Frame { kind: Kind::Reply, flags, revision: req.revision, ird_ord, private_data: private_data.to_vec() };
        reply.encode(&mut self.tx);
        self.state = State::Rdma;
        let early = std::mem::take(&mut self.mpa_rx);
        self.handle_fpdus(&early).map_err(|e| self.fail(e))
    }

    /// Responder: rejects the connection with an MPA reply with R set,
    /// carrying `private_data`. The driver closes once it is sent.
    pub fn reject(&mut self, private_data: &[u8]) {
        let Some(req) = self.request.take() else { return };
        self.send_reject(&req, private_data);
    }

    fn send_reject(&mut self, req: &Frame, private_data: &[u8]) {
        let enhanced = req.has(mpa::flags::ENHANCED);
        let flags = mpa::flags::REJECT | if enhanced { mpa::flags::ENHANCED } else { 0 };
        let ird_ord = enhanced.then_some((0, 0));
        let reply =
            Frame { kind: Kind::Reply, flags, revision: req.revision, ird_ord, private_data: private_data.to_vec() };
        reply.encode(&mut self.tx);
        self.state = State::Closed;
    }

    fn handle_mpa(&mut self, input: &[u8]) -> Result<(), Fatal> {
        self.mpa_rx.extend_from_slice(input);
        let kind = if self.role == Role::Responder { Kind::Request } else { Kind::Reply };
        let Some((frame, used)) = Frame::decode(&self.mpa_rx, kind)? else { return Ok(()) };
        let rest = self.mpa_rx.split_off(used);
        self.mpa_rx.clear();
        match self.role {
            Role::Responder => self.got_request(frame, rest),
            Role::Initiator => self.got_reply(frame, &rest),
        }
    }

    fn got_request(&mut self, req: Frame, rest: Vec<u8>) -> Result<(), Fatal> {
        let refuse = if req.has(mpa::flags::MARKERS) {
            Some(Fatal::new(ErrorCode::MPA_INVALID_FRAME, "the initiator requires markers (M set); none are supported"))
        } else if self.cfg.require_reads && req.ird() == Some(0) {
            Some(Fatal::new(
                ErrorCode::MPA_INSUFFICIENT_IRD,
                "the initiator's IRD is 0: it would refuse the RDMA Reads this end needs",
            ))
        } else {
            None
        };
        if let Some(f) = refuse {
            self.send_reject(&req, &[]);
            return Err(f);
        }
        self.events.push_back(Event::ConnectRequest {
            private_data: req.private_data.clone(),
            ird: req.ird().unwrap_or(0),
            ord: req.ord().unwrap_or(0),
        });
        self.request = Some(req);
        self.mpa_rx = rest;
        self.state = State::AwaitAccept;
        Ok(())
    }

    fn got_reply(&mut self, rep: Frame, rest: &[u8]) -> Result<(), Fatal> {
        if rep.has(mpa::flags::REJECT) {
            self.events.push_back(Event::Rejected { private_data: rep.private_data });
            self.state = State::Closed;
            return Ok(());
        }
        // The responder runs with CRC from its reply on: a Terminate
        // refusing the reply is an FPDU of that stream.
        self.crc = self.cfg.crc || rep.has(mpa::flags::CRC);
        let bad = |code, reason: &str| Err(Fatal::new(code, reason));
        if rep.has(mpa::flags::MARKERS) {
            return bad(ErrorCode::MPA_INVALID_FRAME, "the responder requires markers (M set); none are supported");
        }
        let (Some(peer_ird), Some(peer_ord)) = (rep.ird(), rep.ord()) else {
            return bad(ErrorCode::MPA_INVALID_FRAME, "the reply is not enhanced (RFC 6581) though the request was");
        };
        self.ord = self.cfg.ord.min(peer_ird);
        if self.ord == 0 && self.cfg.require_reads {
            return bad(ErrorCode::MPA_INSUFFICIENT_IRD, "the responder's IRD is 0 and this end needs RDMA Reads");
        }
        if peer_ord > self.cfg.ird {
            return Err(Fatal::new(
                ErrorCode::MPA_INSUFFICIENT_IRD,
                format!("the responder's ORD {peer_ord} exceeds this end's IRD {}", self.cfg.ird),
            ));
        }
        self.ird = peer_ord;
        self.events.push_back(Event::Established { private_data: rep.private_data });
        self.state = State::Rdma;
        self.handle_fpdus(rest)
    }

    /// Ends the connection for a reason of the upper layer's (a malformed
    /// message of its protocol): queues a Terminate with `f`'s code and
    /// closes. Returns `f` for the log.
    pub fn abort(&mut self, f: Fatal) -> Fatal {
        self.fail(f)
    }

    /// Queues the answer to a fatal error and closes.
    fn fail(&mut self, f: Fatal) -> Fatal {
        // A Terminate is an FPDU: only a peer in full operation reads one.
        // A responder's peer (the initiator) is there once the reply is
        // sent (state Rdma); an initiator's peer (the responder) once it
        // has sent the reply the initiator waits for (AwaitReply: RFC
        // 6581's errors about a reply are Terminates). A responder that has
        // not replied closes without a word: an invalid request closes the
        // connection at once (RFC 5044 section 8, error 4), and its peer
        // still waits for a reply.
        if matches!(self.state, State::Rdma | State::AwaitReply) {
            self.put_terminate(&f);
        }
        self.state = State::Closed;
        f
    }

    fn put_terminate(&mut self, f: &Fatal) {
        let mut bits = 0;
        if !f.header.is_empty() {
            bits |= hdrct::M | hdrct::D;
        }
        // Only a Read Request has an RDMAP header past its DDP header.
        if f.header.len() == READ_REQUEST_LEN {
            bits |= hdrct::R;
        }
        let t = TerminateHeader {
            ddp: untagged(Opcode::TERMINATE, true, 0, QN_TERMINATE, 1, 0),
            layer_etype: (f.code.layer << 4) | (f.code.etype & 0x0f),
            ecode: f.code.ecode,
            hdrct: bits.into(),
        };
        let echo = f.header.get(..f.header.len().min(READ_REQUEST_LEN)).unwrap_or_default();
        // CRC as negotiated: `crc` is set once the reply is (an initiator
        // refusing a reply answers a peer that checks it).
        let crc = self.crc;
        wire::put_fpdu(&mut self.tx, t.as_bytes(), echo.len(), crc, |d| d.copy_from_slice(echo));
    }

    // ------------------------------------------------------------ receive

    fn handle_fpdus(&mut self, mut input: &[u8]) -> Result<(), Fatal> {
        let total = input.len();
        while !input.is_empty() && self.state == State::Rdma {
            match self.rx {
                Rx::Header { need } => {
                    if need == 4 && self.hdr_len == 0 {
                        if let Some(used) = self.take_whole_fpdu(input, total)? {
                            input = input.get(used..).unwrap_or_default();
                            continue;
                        }
                    }
                    let take = need.saturating_sub(self.hdr_len).min(input.len());
                    let (now, rest) = input.split_at(take);
                    if let Some(dst) = self.hdr.get_mut(self.hdr_len..self.hdr_len.saturating_add(take)) {
                        dst.copy_from_slice(now);
                    }
                    self.hdr_len = self.hdr_len.saturating_add(take);
                    input = rest;
                    if self.hdr_len < need {
                        continue;
                    }
                    if need == 4 {
                        let ctrl = Ctrl(u16::from_be_bytes([self.hdr[2], self.hdr[3]]));
                        let Some(len) = ctrl.opcode().header_len() else {
                            // Its header's length is unknown: nothing of
                            // it is echoed (M and D clear).
                            return Err(unknown_opcode(ctrl));
                        };
                        self.rx = Rx::Header { need: len };
                        if len > 4 {
                            continue;
                        }
                    }
                    self.input_at = total.saturating_sub(input.len());
                    self.input_left = input.len();
                    self.begin_segment()?;
                }
                Rx::Payload { left } => {
                    let take = left.min(input.len());
                    let (now, rest) = input.split_at(take);
                    self.place(now);
                    input = rest;
                    let left = left.saturating_sub(take);
                    self.rx = if left == 0 { self.trailer_state() } else { Rx::Payload { left } };
                }
                Rx::Trailer { need } => {
                    let take = need.saturating_sub(self.trailer_len).min(input.len());
                    let (now, rest) = input.split_at(take);
                    if let Some(dst) = self.trailer.get_mut(self.trailer_len..self.trailer_len.saturating_add(take)) {
                        dst.copy_from_slice(now);
                    }
                    self.trailer_len = self.trailer_len.saturating_add(take);
                    input = rest;
                    if self.trailer_len == need {
                        self.end_segment()?;
                        self.hdr_len = 0;
                        self.trailer_len = 0;
                        self.rx = Rx::Header { need: 4 };
                    }
                }
            }
        }
        Ok(())
    }

    /// The FPDU at the start of `input`, when all of it is there (the usual
    /// case): checked and delivered in one pass, its payload's CRC computed
    /// as it is placed. Returns the bytes it took, or `None`,
    /// having done nothing, when the FPDU has not all arrived (or its
    /// opcode is unknown: the byte-wise path names that).
    fn take_whole_fpdu(&mut self, input: &[u8], total: usize) -> Result<Option<usize>, Fatal> {
        let (Some(&l0), Some(&l1), Some(&c0), Some(&c1)) = (input.first(), input.get(1), input.get(2), input.get(3))
        else {
            return Ok(None);
        };
        let Some(hdr_len) = Ctrl(u16::from_be_bytes([c0, c1])).opcode().header_len() else { return Ok(None) };
        let covered = LEN_FIELD.saturating_add(usize::from(u16::from_be_bytes([l0, l1])));
        let covered = covered.saturating_add(wire::pad_len(covered));
        let fpdu = covered.saturating_add(CRC_LEN);
        let (Some(hdr), Some(body)) = (input.get(..hdr_len), input.get(hdr_len..fpdu)) else { return Ok(None) };
        // A copy of fixed size where the input allows (the bytes past the
        // header are never read): the header's fields are loaded back at
        // once, and a load spanning two stores of a variable-length copy
        // waits for both to retire.
        match input.first_chunk::<READ_REQUEST_LEN>() {
            Some(whole) => self.hdr = *whole,
            None => {
                let Some(dst) = self.hdr.get_mut(..hdr_len) else { return Err(self.internal()) };
                dst.copy_from_slice(hdr);
            }
        }
        self.hdr_len = hdr_len;
        self.input_at = total.saturating_sub(input.len()).saturating_add(hdr_len);
        self.input_left = input.len().saturating_sub(hdr_len);
        // A ULPDU shorter than its header is refused here.
        self.begin_segment()?;
        let (payload, trailer) = body.split_at(self.payload_len.min(body.len()));
        if !payload.is_empty() {
            self.place(payload);
        }
        let Some(dst) = self.trailer.get_mut(..trailer.len()) else { return Err(self.internal()) };
        dst.copy_from_slice(trailer);
        self.trailer_len = trailer.len();
        self.end_segment()?;
        self.hdr_len = 0;
        self.trailer_len = 0;
        self.rx = Rx::Header { need: 4 };
        Ok(Some(fpdu))
    }

    fn trailer_state(&self) -> Rx {
        Rx::Trailer { need: wire::pad_len(self.payload_len).saturating_add(CRC_LEN) }
    }

    /// A fatal error about the segment whose header is in `hdr`, echoing
    /// what of that header a Terminate carries (RFC 5040 section 4.8): the
    /// DDP segment length and DDP header (M and D), and for an RDMAP error
    /// on a Read Request its RDMAP header (R). Nothing after an MPA error
    /// (the bytes failed their CRC, or the framing is lost) or a DDP
    /// version not ours (the header's layout is unknown).
    fn segment_error(&self, code: ErrorCode, reason: String) -> Fatal {
        let ctrl = self.ctrl;
        let unknown = code == ErrorCode::DDP_TAGGED_VERSION || code == ErrorCode::DDP_UNTAGGED_VERSION;
        let read_request = !ctrl.tagged() && ctrl.opcode() == Opcode::READ_REQUEST && ctrl.rdmap_version() == 1;
        let len = match code.layer {
            ErrorCode::LAYER_MPA => 0,
            _ if unknown => 0,
            ErrorCode::LAYER_RDMAP if read_request => READ_REQUEST_LEN,
            _ if ctrl.tagged() => TAGGED_LEN,
            _ => UNTAGGED_LEN,
        };
        // The DDP segment length is the MPA ULPDU length as received
        // (header and payload).
        let header = self.hdr.get(..len.min(self.hdr_len)).unwrap_or_default().to_vec();
        Fatal { code, reason, header }
    }

    /// Checks a complete header and picks where the payload goes.
    fn begin_segment(&mut self) -> Result<(), Fatal> {
        let hdr_len = self.hdr_len;
        let ulpdu = usize::from(u16::from_be_bytes([self.hdr[0], self.hdr[1]]));
        let ctrl = Ctrl(u16::from_be_bytes([self.hdr[2], self.hdr[3]]));
        self.ctrl = ctrl;
        let Some(payload_len) = ulpdu.checked_sub(hdr_len.saturating_sub(LEN_FIELD)) else {
            self.payload_len = 0;
            return Err(self.segment_error(
                ErrorCode::MPA_FPDU,
                format!("ULPDU length {ulpdu} is shorter than the {}-byte header", hdr_len.saturating_sub(LEN_FIELD)),
            ));
        };
        self.payload_len = payload_len;
        if self.crc {
            self.rx_crc = Crc32c::new();
            self.rx_crc.update(self.hdr.get(..hdr_len).unwrap_or_default());
        }
        let op = ctrl.opcode();
        if ctrl.ddp_version() != 1 {
            let code = if ctrl.tagged() { ErrorCode::DDP_TAGGED_VERSION } else { ErrorCode::DDP_UNTAGGED_VERSION };
            return Err(self.segment_error(code, format!("DDP version {} (expected 1)", ctrl.ddp_version())));
        }
        if ctrl.rdmap_version() != 1 {
            return Err(self.segment_error(
                ErrorCode::RDMAP_VERSION,
                format!("RDMAP version {} (expected 1)", ctrl.rdmap_version()),
            ));
        }
        if ctrl.tagged() != op.is_tagged() {
            return Err(self.segment_error(
                ErrorCode::RDMAP_OPCODE,
                format!("opcode {} with the tagged bit {}", op.0, if ctrl.tagged() { "set" } else { "clear" }),
            ));
        }
        // The fields are read where they lie: a copy of the header struct
        // is split by the compiler into odd-sized stores that the loads
        // right after cannot be forwarded from.
        // Each sets `dest` itself: a `Dest` returned inside the `Result`
        // would be moved through the stack in pieces.
        if op.is_tagged() {
            let t = TaggedHeader::ref_from_prefix(&self.hdr).map(|(t, _)| t).map_err(|_| self.internal())?;
            let (stag, to) = (t.stag.get(), t.to.get());
            self.begin_tagged(op, stag, to)?;
        } else {
            let u = UntaggedHeader::ref_from_prefix(&self.hdr).map(|(u, _)| u).map_err(|_| self.internal())?;
            let fields = Untagged { inv_stag: u.inv_stag.get(), qn: u.qn.get(), msn: u.msn.get(), mo: u.mo.get() };
            self.begin_untagged(op, fields)?;
        }
        self.rx = if payload_len == 0 { self.trailer_state() } else { Rx::Payload { left: payload_len } };
        Ok(())
    }

    fn internal(&self) -> Fatal {
        Fatal::new(ErrorCode::DDP_CATASTROPHIC, "header buffer shorter than its layout")
    }

    /// Checks a tagged segment's STag and offset and sets `dest`.
    fn begin_tagged(&mut self, op: Opcode, stag: u32, to: u64) -> Result<(), Fatal> {
        let len = self.payload_len;
        if op == Opcode::READ_RESPONSE {
            let Some(read) = self.reads.front() else {
                return Err(self.segment_error(
                    ErrorCode::RDMAP_CATASTROPHIC_STREAM,
                    format!("RDMA Read Response for STag {stag:#x} with no read outstanding"),
                ));
            };
            if stag != read.sink_stag {
                return Err(self.segment_error(
                    ErrorCode::DDP_TAGGED_INVALID_STAG,
                    format!("Read Response STag {stag:#x} (expected {:#x}, the oldest read's sink)", read.sink_stag),
                ));
            }
            let size = read.size;
            let end = read.received.saturating_add(len);
            if to != read.received as u64 || end > size {
                return Err(self.segment_error(
                    ErrorCode::DDP_TAGGED_BASE_BOUNDS,
                    format!(
                        "Read Response tagged offset {to} length {len} (expected offset {} within {size} bytes)",
                        read.received
                    ),
                ));
            }
            if self.ctrl.last() && end != size {
                return Err(self.segment_error(
                    ErrorCode::DDP_TAGGED_BASE_BOUNDS,
                    format!("Read Response ends after {end} of {size} bytes asked"),
                ));
            }
            self.dest = Dest::Sink { offset: read.received };
            return Ok(());
        }
        // RDMA Write into a registered region.
        if let Some((s, next)) = self.write_next {
            if s != stag || next != to {
                return Err(self.segment_error(
                    ErrorCode::DDP_TAGGED_BASE_BOUNDS,
                    format!("RDMA Write segment STag {stag:#x} offset {to} (expected {s:#x} at {next}, contiguous)"),
                ));
            }
        }
        let found = self.region_index(stag);
        let Some((index, region)) = found.and_then(|i| Some((i, self.regions.get(i)?.as_ref()?))) else {
            return Err(self.segment_error(
                ErrorCode::DDP_TAGGED_INVALID_STAG,
                format!("RDMA Write to STag {stag:#x}, which is not registered"),
            ));
        };
        if !region.valid {
            // Invalidated, it is no STag the peer may use (RFC 5040
            // section 2.1), as one never registered.
            return Err(self.segment_error(
                ErrorCode::DDP_TAGGED_INVALID_STAG,
                format!("RDMA Write to STag {stag:#x}, which was invalidated"),
            ));
        }
        if region.access != Access::RemoteWrite {
            return Err(self.segment_error(
                ErrorCode::RDMAP_ACCESS_RIGHTS,
                format!("RDMA Write to STag {stag:#x}, which does not allow remote writes"),
            ));
        }
        let Some(offset) = checked_range(region.base, region.buf.as_ref().len(), to, len) else {
            return Err(self.segment_error(
                ErrorCode::DDP_TAGGED_BASE_BOUNDS,
                format!(
                    "RDMA Write of {len} bytes at offset {to} outside STag {stag:#x} ({} bytes at {})",
                    region.buf.as_ref().len(),
                    region.base
                ),
            ));
        };
        self.write_next = if self.ctrl.last() { None } else { Some((stag, to.saturating_add(len as u64))) };
        self.dest = if len == 0 { Dest::Nothing } else { Dest::Region { index, offset } };
        Ok(())
    }

    /// Checks an untagged segment's queue, MSN and offset and sets `dest`.
    fn begin_untagged(&mut self, op: Opcode, u: Untagged) -> Result<(), Fatal> {
        let (qn, msn, mo) = (u.qn, u.msn, u.mo as usize);
        if qn != op.queue() {
            return Err(self.segment_error(
                ErrorCode::DDP_UNTAGGED_INVALID_QN,
                format!("opcode {} on queue {qn} (expected queue {})", op.0, op.queue()),
            ));
        }
        match op {
            Opcode::TERMINATE => {
                self.term_echo.clear();
                self.dest = if self.payload_len == 0 { Dest::Nothing } else { Dest::Terminate };
                Ok(())
            }
            Opcode::READ_REQUEST => {
                let expected = self.rx_msn[1];
                if msn != expected {
                    return Err(self.segment_error(
                        ErrorCode::DDP_UNTAGGED_MSN_RANGE,
                        format!("Read Request MSN {msn} (expected {expected})"),
                    ));
                }
                if mo != 0 || !self.ctrl.last() || self.payload_len != 0 {
                    return Err(self.segment_error(
                        ErrorCode::DDP_UNTAGGED_INVALID_MO,
                        format!(
                            "Read Request with offset {mo}, {} payload bytes, last {} (expected one 0-offset empty segment)",
                            self.payload_len,
                            self.ctrl.last()
                        ),
                    ));
                }
                if self.ird == 0 {
                    return Err(self.segment_error(
                        ErrorCode::RDMAP_CATASTROPHIC_STREAM,
                        "RDMA Read Request, but this end's IRD is 0".into(),
                    ));
                }
                if self.reads_served >= usize::from(self.ird) {
                    // Each answer waits in the transmit bytes until taken:
                    // a peer past its ORD would have them grow unbounded.
                    return Err(self.segment_error(
                        ErrorCode::RDMAP_CATASTROPHIC_STREAM,
                        format!("RDMA Read Request beyond this end's IRD {} (none of them answered yet)", self.ird),
                    ));
                }
                self.dest = Dest::Nothing;
                Ok(())
            }
            _ => {
                let expected = self.rx_msn[0];
                if msn != expected {
                    return Err(self.segment_error(
                        ErrorCode::DDP_UNTAGGED_MSN_RANGE,
                        format!("Send MSN {msn} (expected {expected})"),
                    ));
                }
                let inb = &self.inbound;
                if mo != inb.received {
                    return Err(self.segment_error(
                        ErrorCode::DDP_UNTAGGED_INVALID_MO,
                        format!("Send message offset {mo} (expected {})", inb.received),
                    ));
                }
                let end = mo.saturating_add(self.payload_len);
                if end > self.cfg.recv_max {
                    return Err(self.segment_error(
                        ErrorCode::DDP_UNTAGGED_TOO_LONG,
                        format!("Send of at least {end} bytes (the posted receive holds {})", self.cfg.recv_max),
                    ));
                }
                if inb.active && (op.invalidates() != inb.invalidate.is_some() || op.solicited() != inb.solicited) {
                    // Every DDP segment of a message carries its RDMAP
                    // header (RFC 5040); an opcode that changes mid-message
                    // names no message this end is receiving (siw ends the
                    // stream on it too).
                    return Err(self.segment_error(
                        ErrorCode::RDMAP_OPCODE,
                        format!(
                            "Send MSN {msn} segment at offset {mo} with opcode {} (its first was another Send)",
                            op.0
                        ),
                    ));
                }
                if inb.active && inb.invalidate.is_some_and(|s| s != u.inv_stag) {
                    return Err(self.segment_error(
                        ErrorCode::RDMAP_OPCODE,
                        format!(
                            "Send with Invalidate MSN {msn} segment at offset {mo} names STag {:#x} (its first named {:#x})",
                            u.inv_stag,
                            inb.invalidate.unwrap_or_default()
                        ),
                    ));
                }
                if !inb.active {
                    if self.recv_credits == 0 {
                        return Err(self.segment_error(
                            ErrorCode::DDP_UNTAGGED_NO_BUFFER,
                            format!("Send MSN {msn} with no receive posted"),
                        ));
                    }
                    self.recv_credits = self.recv_credits.saturating_sub(1);
                    let head = self.cfg.recv_head;
                    let inb = &mut self.inbound;
                    inb.active = true;
                    inb.head_len = 0;
                    inb.staged.clear();
                    inb.invalidate = op.invalidates().then_some(u.inv_stag);
                    inb.solicited = op.solicited();
                    // A message in one segment has a known length: its body
                    // is left where it lies in a lent input that holds all
                    // of it, else goes straight into a buffer of that size.
                    // The whole FPDU must be there, trailer too: the message
                    // ends (and the range is handed on) only at its CRC.
                    let whole = self.ctrl.last() && self.payload_len > head;
                    let fpdu_rest =
                        self.payload_len.saturating_add(wire::pad_len(self.payload_len)).saturating_add(CRC_LEN);
                    let lend = whole && self.lending && self.input_left >= fpdu_rest;
                    inb.lent = lend.then_some((self.input_at.saturating_add(head), 0));
                    inb.body = (whole && !lend).then(|| (B::alloc(self.payload_len.saturating_sub(head)), 0));
                }
                self.dest = if self.payload_len == 0 { Dest::Nothing } else { Dest::Send };
                Ok(())
            }
        }
    }

    /// Places payload bytes where the segment's header said (checked) and
    /// feeds them to the segment's CRC when it has one: bytes copied into a
    /// registered region or a read's sink are fed by the copy's own loads
    /// (one pass, [`Crc32c::copy_into`]).
    fn place(&mut self, bytes: &[u8]) {
        let n = bytes.len();
        let mut crc = self.crc.then_some(&mut self.rx_crc);
        let copy = |crc: &mut Option<&mut Crc32c>, dst: &mut [u8]| match crc.take() {
            Some(c) => c.copy_into(dst, bytes),
            None => dst.copy_from_slice(bytes),
        };
        match &mut self.dest {
            Dest::Nothing => {}
            Dest::Region { index, offset } => {
                if let Some(r) = self.regions.get_mut(*index).and_then(Option::as_mut) {
                    if let Some(dst) = r.buf.as_mut().get_mut(*offset..offset.saturating_add(n)) {
                        copy(&mut crc, dst);
                        r.written.add(*offset, offset.saturating_add(n));
                    }
                }
                *offset = offset.saturating_add(n);
            }
            Dest::Sink { offset } => {
                if let Some(buf) = self.reads.front_mut().and_then(|r| r.buf.as_mut()) {
                    if let Some(dst) = buf.as_mut().get_mut(*offset..offset.saturating_add(n)) {
                        copy(&mut crc, dst);
                    }
                }
                *offset = offset.saturating_add(n);
            }
            Dest::Send => {
                let head_room = self.cfg.recv_head;
                let inb = &mut self.inbound;
                let mut rest = bytes;
                if inb.head_len < head_room {
                    let take = head_room.saturating_sub(inb.head_len).min(rest.len());
                    let (h, r) = rest.split_at(take);
                    if let Some(dst) = inb.head.get_mut(inb.head_len..inb.head_len.saturating_add(take)) {
                        dst.copy_from_slice(h);
                    }
                    inb.head_len = inb.head_len.saturating_add(take);
                    rest = r;
                }
                if let (false, Some((_, filled))) = (rest.is_empty(), &mut inb.lent) {
                    *filled = filled.saturating_add(rest.len());
                } else if !rest.is_empty() {
                    match &mut inb.body {
                        Some((buf, filled)) => {
                            if let Some(dst) = buf.as_mut().get_mut(*filled..filled.saturating_add(rest.len())) {
                                dst.copy_from_slice(rest);
                            }
                            *filled = filled.saturating_add(rest.len());
                        }
                        None => inb.staged.extend_from_slice(rest),
                    }
                }
                inb.received = inb.received.saturating_add(n);
            }
            Dest::Terminate => {
                let room = TERMINATE_ECHO_MAX.saturating_sub(self.term_echo.len());
                self.term_echo.extend_from_slice(bytes.get(..room.min(n)).unwrap_or_default());
            }
        }
        // Bytes no copy fed (kept in the head, lent, staged or dropped).
        if let Some(c) = crc {
            c.update(bytes);
        }
    }

    /// The segment's pad and CRC arrived: check them, then finish the
    /// message if this was its last segment.
    fn end_segment(&mut self) -> Result<(), Fatal> {
        let pad = wire::pad_len(self.payload_len);
        let (pad_bytes, crc_bytes) = self.trailer.split_at(pad.min(self.trailer.len()));
        if self.crc {
            if !pad_bytes.is_empty() {
                self.rx_crc.update(pad_bytes);
            }
            let want = self.rx_crc.value().to_le_bytes();
            let got = crc_bytes.get(..CRC_LEN).unwrap_or_default();
            if got != want {
                return Err(
                    self.segment_error(ErrorCode::MPA_CRC, format!("FPDU CRC {got:02x?} (computed {want:02x?})"))
                );
            }
        }
        let op = self.ctrl.opcode();
        let last = self.ctrl.last();
        match op {
            Opcode::READ_RESPONSE => {
                let done = match self.reads.front_mut() {
                    Some(read) => {
                        read.received = read.received.saturating_add(self.payload_len);
                        last
                    }
                    None => false,
                };
                if done {
                    if let Some(Read { id, buf: Some(buf), .. }) = self.reads.pop_front() {
                        self.events.push_back(Event::ReadDone { id, buf });
                    }
                    self.issue_reads();
                }
            }
            Opcode::RDMA_WRITE => {}
            Opcode::READ_REQUEST => {
                self.rx_msn[1] = self.rx_msn[1].wrapping_add(1);
                let rr = ReadRequest::read_from_prefix(&self.hdr).map(|(r, _)| r).map_err(|_| self.internal())?;
                self.serve_read(&rr)?;
            }
            Opcode::TERMINATE => {
                let t = TerminateHeader::read_from_prefix(&self.hdr).map(|(t, _)| t).map_err(|_| self.internal())?;
                let code = ErrorCode { layer: t.layer_etype >> 4, etype: t.layer_etype & 0x0f, ecode: t.ecode };
                self.events.push_back(Event::Terminated(code));
                self.state = State::Closed;
            }
            _ => {
                if last {
                    self.finish_send()?;
                }
            }
        }
        Ok(())
    }

    fn finish_send(&mut self) -> Result<(), Fatal> {
        self.rx_msn[0] = self.rx_msn[0].wrapping_add(1);
        let inb = &mut self.inbound;
        inb.active = false;
        inb.received = 0;
        let body = match inb.body.take() {
            Some((buf, _)) => Some(buf),
            None if !inb.staged.is_empty() => {
                let mut buf = B::alloc(inb.staged.len());
                buf.as_mut().copy_from_slice(&inb.staged);
                inb.staged.clear();
                Some(buf)
            }
            None => None,
        };
        // Lent only from an input of at most u32::MAX bytes.
        let at = |i: usize| u32::try_from(i).unwrap_or(u32::MAX);
        let lent = inb.lent.take().map(|(start, n)| at(start)..at(start.saturating_add(n)));
        let invalidated = inb.invalidate.take();
        let (head_len, solicited) = (inb.head_len, inb.solicited);
        if let Some(stag) = invalidated {
            let region = self.region_index(stag).and_then(|i| self.regions.get_mut(i)?.as_mut());
            match region {
                Some(r) if r.valid => r.valid = false,
                _ => {
                    return Err(self.segment_error(
                        ErrorCode::RDMAP_CANNOT_INVALIDATE,
                        format!("Send with Invalidate of STag {stag:#x}, which is not a valid registered STag"),
                    ))
                }
            }
        }
        // The message is written in its slot, field by field. Built on the
        // stack and moved, it would be read back in wide loads that each
        // span several of the narrow stores that built it, and such a load
        // waits for them to retire.
        self.events.push_back(Event::Send(Received::EMPTY));
        if let Some(Event::Send(m)) = self.events.back_mut() {
            m.head = self.inbound.head;
            m.solicited = solicited;
            m.head_len = head_len;
            m.body = body;
            m.lent = lent;
            m.invalidated = invalidated;
        }
        Ok(())
    }

    /// Answers the peer's RDMA Read Request from a registered region.
    fn serve_read(&mut self, rr: &ReadRequest) -> Result<(), Fatal> {
        let (src, to, size) = (rr.src_stag.get(), rr.src_to.get(), rr.size.get() as usize);
        let found = self.region_index(src).and_then(|i| self.regions.get(i)?.as_ref());
        let Some(region) = found else {
            return Err(self.segment_error(
                ErrorCode::RDMAP_INVALID_STAG,
                format!("RDMA Read Request from STag {src:#x}, which is not registered"),
            ));
        };
        if !region.valid {
            return Err(self.segment_error(
                ErrorCode::RDMAP_INVALID_STAG,
                format!("RDMA Read Request from STag {src:#x}, which was invalidated"),
            ));
        }
        if region.access != Access::RemoteRead {
            return Err(self.segment_error(
                ErrorCode::RDMAP_ACCESS_RIGHTS,
                format!("RDMA Read Request from STag {src:#x}, which does not allow remote reads"),
            ));
        }
        let Some(offset) = checked_range(region.base, region.buf.as_ref().len(), to, size) else {
            return Err(self.segment_error(
                ErrorCode::RDMAP_BASE_BOUNDS,
                format!(
                    "RDMA Read Request of {size} bytes at offset {to} outside STag {src:#x} ({} bytes at {})",
                    region.buf.as_ref().len(),
                    region.base
                ),
            ));
        };
        let data = region.buf.as_ref().get(offset..offset.saturating_add(size)).unwrap_or_default();
        // `checked_range` put all `size` bytes inside the region, so every
        // segment's fill appends its whole range.
        let sent = put_tagged(
            &mut self.tx,
            self.crc,
            self.cfg.max_segment,
            Opcode::READ_RESPONSE,
            rr.sink_stag.get(),
            rr.sink_to.get(),
            size,
            |range, out| {
                out.extend_from_slice(data.get(range).unwrap_or_default());
                true
            },
        );
        debug_assert!(sent, "a Read Response inside its region was not framed");
        self.reads_served = self.reads_served.saturating_add(1);
        Ok(())
    }

    // ------------------------------------------------------------ transmit

    /// Sends one message (`head` then `body`) as a Send, or a Send with
    /// Invalidate of `invalidate`.
    pub fn send(&mut self, head: &[u8], body: &[u8], invalidate: Option<u32>) {
        if self.state != State::Rdma {
            return;
        }
        self.tx_msn[0] = self.tx_msn[0].wrapping_add(1);
        let msn = self.tx_msn[0];
        let op = if invalidate.is_some() { Opcode::SEND_INVALIDATE } else { Opcode::SEND };
        let total = head.len().saturating_add(body.len());
        let mut off = 0usize;
        loop {
            let n = total.saturating_sub(off).min(self.cfg.max_segment);
            let last = off.saturating_add(n) == total;
            let h = untagged(op, last, invalidate.unwrap_or(0), QN_SEND, msn, off as u32);
            wire::put_fpdu(&mut self.tx, h.as_bytes(), n, self.crc, |dst| copy_concat(dst, off, head, body));
            off = off.saturating_add(n);
            if last {
                break;
            }
        }
    }

    /// Sends `len` bytes as an RDMA Write to the peer's `stag` at tagged
    /// offset `to`; `fill(range, out)` appends the bytes of the message
    /// in `range` (one segment's payload) to `out`, which computes their
    /// CRC as it copies them. When `fill` returns false, or appends another
    /// number of bytes, nothing is sent and this returns false.
    pub fn write_with(
        &mut self,
        stag: u32,
        to: u64,
        len: usize,
        fill: impl FnMut(Range<usize>, &mut Appender<'_>) -> bool,
    ) -> bool {
        if self.state != State::Rdma {
            return false;
        }
        put_tagged(&mut self.tx, self.crc, self.cfg.max_segment, Opcode::RDMA_WRITE, stag, to, len, fill)
    }

    /// Sends the first `len` bytes of `buf` as an RDMA Write to the peer's
    /// `stag` at offset `to`, from `buf` itself: the FPDUs' headers, pads
    /// and CRCs go into the transmit bytes, the payload stays in `buf` and
    /// is sent from there ([`take_transmit_parts`](Self::take_transmit_parts)).
    /// The CRC is computed over the payload where it lies. Returns `false`
    /// (and drops `buf`) when the connection is not up.
    pub fn write_from(&mut self, stag: u32, to: u64, buf: B, len: usize) -> bool {
        if self.state != State::Rdma {
            return false;
        }
        let len = len.min(buf.as_ref().len());
        let index = self.tx_bufs.len();
        self.put_spliced_write(stag, to, len, index, |crc, range| {
            crc.update(buf.as_ref().get(range).unwrap_or_default())
        });
        self.tx_bufs.push(buf);
        true
    }

    /// Sends `len` zero bytes as an RDMA Write to the peer's `stag` at
    /// offset `to` (a read of a device that holds nothing): the payload is
    /// written nowhere, its splices name [`ZEROS`] for the caller to send
    /// from zeros of its own, and the CRC covers the zeros all the same.
    /// Returns `false` when the connection is not up.
    pub fn write_zeros(&mut self, stag: u32, to: u64, len: usize) -> bool {
        if self.state != State::Rdma {
            return false;
        }
        self.put_spliced_write(stag, to, len, ZEROS, |crc, range| crc.update_zeros(range.len()));
        true
    }

    /// The RDMA Write FPDUs of `len` bytes whose payload is spliced from
    /// buffer `index` (or [`ZEROS`]); `payload_crc` feeds one segment's
    /// payload, by its range in the message, to the FPDU's CRC.
    fn put_spliced_write(
        &mut self,
        stag: u32,
        to: u64,
        len: usize,
        index: usize,
        mut payload_crc: impl FnMut(&mut Crc32c, Range<usize>),
    ) {
        let mut off = 0usize;
        loop {
            let n = len.saturating_sub(off).min(self.cfg.max_segment);
            let last = off.saturating_add(n) == len;
            let h = TaggedHeader {
                ulpdu_len: 0.into(),
                ctrl: Ctrl::new(Opcode::RDMA_WRITE, last).0.into(),
                stag: stag.into(),
                to: to.wrapping_add(off as u64).into(),
            };
            let start = self.tx.len();
            let ulpdu = h.as_bytes().len().saturating_sub(LEN_FIELD).saturating_add(n);
            self.tx.extend_from_slice(&(ulpdu as u16).to_be_bytes());
            self.tx.extend_from_slice(h.as_bytes().get(LEN_FIELD..).unwrap_or_default());
            let at = self.tx.len();
            self.tx.resize(at.saturating_add(wire::pad_len(n)), 0);
            let value = if self.crc {
                let mut c = Crc32c::new();
                c.update(self.tx.get(start..at).unwrap_or_default());
                payload_crc(&mut c, off..off.saturating_add(n));
                c.update(self.tx.get(at..).unwrap_or_default());
                c.value()
            } else {
                0
            };
            self.tx.extend_from_slice(&value.to_le_bytes());
            self.tx_splices.push(Splice { at, buf: index, start: off, len: n });
            self.tx_spliced = self.tx_spliced.saturating_add(n);
            off = off.saturating_add(n);
            if last {
                break;
            }
        }
    }

    /// Sends `data` as an RDMA Write to the peer's `stag` at offset `to`.
    pub fn write(&mut self, stag: u32, to: u64, data: &[u8]) {
        // A slice fills every range whole: only a connection that is not
        // up sends nothing.
        let sent = self.write_with(stag, to, data.len(), |range, out| {
            out.extend_from_slice(data.get(range).unwrap_or_default());
            true
        });
        debug_assert!(sent || self.state != State::Rdma, "an RDMA Write from a slice was not framed");
    }

    /// Reads `sink.len()` bytes of the peer's `src_stag` at `src_to` into
    /// `sink`; [`Event::ReadDone`] with `id` gives it back, filled. Reads
    /// beyond the negotiated ORD wait, in order, for earlier ones.
    pub fn read(&mut self, id: u64, sink: B, src_stag: u32, src_to: u64) {
        self.next_read_stag = self.next_read_stag.wrapping_add(1) | READ_STAG_BASE;
        let size = sink.as_ref().len();
        let read = Read { id, sink_stag: self.next_read_stag, src_stag, src_to, received: 0, size, buf: Some(sink) };
        self.reads_waiting.push_back(read);
        self.issue_reads();
    }

    /// RDMA Reads issued and not yet answered.
    pub fn reads_in_flight(&self) -> usize {
        self.reads.len()
    }

    /// RDMA Reads waiting for ORD room.
    pub fn reads_waiting(&self) -> usize {
        self.reads_waiting.len()
    }

    fn issue_reads(&mut self) {
        if self.state != State::Rdma {
            return;
        }
        while self.reads.len() < usize::from(self.ord.max(1)) {
            let Some(read) = self.reads_waiting.pop_front() else { break };
            self.tx_msn[1] = self.tx_msn[1].wrapping_add(1);
            let rr = ReadRequest {
                ddp: untagged(Opcode::READ_REQUEST, true, 0, QN_READ_REQUEST, self.tx_msn[1], 0),
                sink_stag: read.sink_stag.into(),
                sink_to: 0.into(),
                size: (read.size as u32).into(),
                src_stag: read.src_stag.into(),
                src_to: read.src_to.into(),
            };
            wire::put_fpdu(&mut self.tx, rr.as_bytes(), 0, self.crc, |_| {});
            self.reads.push_back(read);
        }
    }

    // ------------------------------------------------------------ memory

    /// Registers `buf` for the peer to access at tagged offsets from
    /// `base`; returns its STag (a fresh key each time).
    pub fn register(&mut self, buf: B, base: u64, access: Access) -> u32 {
        let index = self.free_regions.pop().unwrap_or_else(|| {
            self.regions.push(None);
            self.regions.len().saturating_sub(1)
        });
        self.next_key = self.next_key.wrapping_add(1);
        let stag = ((index as u32 & 0x007f_ffff) << 8) | u32::from(self.next_key);
        if let Some(slot) = self.regions.get_mut(index) {
            *slot = Some(Region { stag, base, access, valid: true, buf, written: Coverage::default() });
        }
        stag
    }

    /// How many bytes from the start of `stag`'s region RDMA Writes have
    /// placed since it was registered, without a gap (bytes written twice
    /// count once): a consumer can tell a buffer its peer filled from one
    /// it left partly unwritten, which still holds older bytes.
    pub fn covered(&self, stag: u32) -> Option<usize> {
        let index = self.region_index(stag)?;
        Some(self.regions.get(index)?.as_ref()?.written.front)
    }

    /// Ends a registration and gives the buffer back.
    pub fn deregister(&mut self, stag: u32) -> Option<B> {
        let index = self.region_index(stag)?;
        let region = self.regions.get_mut(index)?.take()?;
        self.free_regions.push(index);
        Some(region.buf)
    }

    fn region_index(&self, stag: u32) -> Option<usize> {
        if stag & READ_STAG_BASE != 0 {
            return None;
        }
        let index = (stag >> 8) as usize;
        let r = self.regions.get(index)?.as_ref()?;
        (r.stag == stag).then_some(index)
    }
}

/// Fills `dst` with the bytes of `a` then `b` from offset `off`.
fn copy_concat(dst: &mut [u8], off: usize, a: &[u8], b: &[u8]) {
    let from_a = a.get(off..).unwrap_or_default();
    let n = from_a.len().min(dst.len());
    let (da, db) = dst.split_at_mut(n);
    da.copy_from_slice(from_a.get(..n).unwrap_or_default());
    let b_off = off.saturating_sub(a.len());
    if let Some(src) = b.get(b_off..b_off.saturating_add(db.len())) {
        db.copy_from_slice(src);
    }
}

/// The byte offset of `[to, to + len)` in a region of `size` bytes at
/// `base`, if it lies inside.
fn checked_range(base: u64, size: usize, to: u64, len: usize) -> Option<usize> {
    let off = usize::try_from(to.checked_sub(base)?).ok()?;
    (off.checked_add(len)? <= size).then_some(off)
}

/// The error for a header whose opcode is unknown, in the order the layers
/// read it: a DDP version not ours (RFC 5041 section 4.2) or an RDMAP
/// version not ours (RFC 5040 section 4.2) says the opcode means nothing.
fn unknown_opcode(ctrl: Ctrl) -> Fatal {
    if ctrl.ddp_version() != 1 {
        let code = if ctrl.tagged() { ErrorCode::DDP_TAGGED_VERSION } else { ErrorCode::DDP_UNTAGGED_VERSION };
        return Fatal::new(code, format!("DDP version {} (expected 1)", ctrl.ddp_version()));
    }
    if ctrl.rdmap_version() != 1 {
        return Fatal::new(ErrorCode::RDMAP_VERSION, format!("RDMAP version {} (expected 1)", ctrl.rdmap_version()));
    }
    Fatal::new(ErrorCode::RDMAP_OPCODE, format!("opcode {} unknown (expected 0..=7)", ctrl.opcode().0))
}

/// The fields of a received untagged header, in host order.
#[derive(Clone, Copy)]
struct Untagged {
    inv_stag: u32,
    qn: u32,
    msn: u32,
    mo: u32,
}

fn untagged(op: Opcode, last: bool, inv_stag: u32, qn: u32, msn: u32, mo: u32) -> UntaggedHeader {
    UntaggedHeader {
        ulpdu_len: 0.into(),
        ctrl: Ctrl::new(op, last).0.into(),
        inv_stag: inv_stag.into(),
        qn: qn.into(),
        msn: msn.into(),
        mo: mo.into(),
    }
}

/// Appends a tagged message (RDMA Write or Read Response) in segments.
#[allow(clippy::too_many_arguments)]
fn put_tagged(
    tx: &mut Vec<u8>,
    crc: bool,
    max_segment: usize,
    op: Opcode,
    stag: u32,
    to: u64,
    len: usize,
    mut fill: impl FnMut(Range<usize>, &mut Appender<'_>) -> bool,
) -> bool {
    let start = tx.len();
    let mut off = 0usize;
    loop {
        let n = len.saturating_sub(off).min(max_segment);
        let last = off.saturating_add(n) == len;
        let h = TaggedHeader {
            ulpdu_len: 0.into(),
            ctrl: Ctrl::new(op, last).0.into(),
            stag: stag.into(),
            to: to.wrapping_add(off as u64).into(),
        };
        let range = off..off.saturating_add(n);
        if !wire::put_fpdu_appended(tx, h.as_bytes(), n, crc, |out| fill(range, out)) {
            tx.truncate(start);
            return false;
        }
        off = off.saturating_add(n);
        if last {
            return true;
        }
    }
}
