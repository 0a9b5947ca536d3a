//! The controller (target) side of one NVMe/TCP connection.
//!
//! States are named for what they wait for: [`State::AwaitIcReq`] until the
//! host's ICReq, then [`State::Ready`]; a fatal error queues a C2HTermReq
//! and moves to [`State::Terminated`], after which input is ignored and the
//! driver closes the socket once the transmit buffer is flushed.
//!
//! The connection knows nothing of NVMe-oF semantics: it hands command
//! capsules up as [`Event::Command`], solicits write data when asked
//! ([`TargetConnection::request_data`]), and frames read data and
//! completions.

use crate::error::{Fatal, Fes};
use crate::pdu::{
    self, dgst, flags, offset, CapsuleCmd, CapsuleResp, CommonHeader, DataHeader, Framing, IcReq, IcResp, PduType, R2t,
    TermReq,
};
use block::DataBuffer;
use checksum::Appender;
use nvme_spec::{Cqe, Sgl, Sqe};
use std::collections::VecDeque;
use zerocopy::{FromBytes, IntoBytes};

/// Limits the target advertises and enforces.
#[derive(Clone, Copy, Debug)]
pub struct TargetConfig {
    /// MAXH2CDATA: most data bytes in one H2CData PDU (at least 4096).
    pub max_h2c_data: u32,
    /// Most in-capsule data bytes accepted on an I/O queue: what IOCCSZ
    /// advertises (less the 64-byte SQE). The admin queue, and a queue
    /// whose Connect has not completed yet, take [`ADMIN_IN_CAPSULE`]
    /// whatever this says.
    pub max_in_capsule: u32,
    /// Most bytes one command may transfer (MDTS in bytes).
    pub max_transfer: u32,
    /// CPDA we ask of the host: data offsets aligned to (CPDA+1)*4 bytes.
    pub cpda: u8,
    /// Set SUCCESS on a successful read's last C2HData even when the host
    /// did not disable SQ flow control (SPDK's default; the host then gets
    /// no SQHD for that command). Off: only with SQ flow control disabled.
    pub c2h_success_always: bool,
    /// Most bytes of solicited write data buffered at once on this
    /// connection: further R2Ts wait until earlier transfers complete. A
    /// single transfer larger than this still proceeds when it is alone.
    pub r2t_buffer: u32,
}

/// In-capsule data bytes of an admin queue command capsule: the NVMe/TCP
/// admin queue's capsule size is fixed at 8 KiB of data (no Identify field
/// advertises it). A Connect of an I/O queue (1 KiB of data) arrives
/// before the queue is known, under this limit too.
pub const ADMIN_IN_CAPSULE: u32 = 8192;

impl Default for TargetConfig {
    fn default() -> Self {
        TargetConfig {
            max_h2c_data: 128 * 1024,
            max_in_capsule: 8192,
            max_transfer: 1024 * 1024,
            cpda: 0,
            c2h_success_always: false,
            r2t_buffer: 8 << 20,
        }
    }
}

/// What the connection waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// The host's ICReq.
    AwaitIcReq,
    /// Capsules and data.
    Ready,
    /// A terminate request was sent or received; the connection is over.
    Terminated,
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
    /// bytes last given to [`TargetConnection::handle_input_lent`].
    CommandInInput {
        /// The submission queue entry.
        sqe: Sqe,
        /// Where its data lies in that input.
        data: std::ops::Range<usize>,
    },
    /// All data solicited for `cid` has arrived.
    Data {
        /// Command identifier.
        cid: u16,
        /// The command's data.
        data: B,
    },
    /// Data for `cid` failed its data digest; complete the command with
    /// Transient Transport Error (TP 8000 section 7.4.6.1).
    DataDigestError {
        /// Command identifier.
        cid: u16,
        /// `None` when the data was solicited (H2CData after an R2T): the
        /// command is waiting for it. Otherwise it was the capsule's own,
        /// whose command this is: it never ran, and a command of the same
        /// CID that waits for data is another's, left alone; but it took
        /// its place in the queue (after a fused Compare, say).
        capsule: Option<Sqe>,
    },
    /// A command taken back by
    /// [`withdraw_command`](TargetConnection::withdraw_command), answered
    /// already: it never runs, but it came in this place in the queue (a
    /// fused Compare before it waits for it).
    Withdrawn {
        /// Its submission queue entry.
        sqe: Sqe,
    },
    /// The host sent H2CTermReq; close after flushing.
    HostTerminated {
        /// The host's fatal error status.
        fes: u16,
        /// What was wrong with the request, when its HLEN or PLEN was out
        /// of bounds (it ended the connection all the same), for the log.
        malformed: Option<String>,
    },
}

struct Transfer<B> {
    cid: u16,
    /// Where the data goes; `None` once the command was aborted: what the
    /// host still sends for it is checked and dropped.
    buf: Option<B>,
    len: u32,
    received: u32,
    digest_failed: bool,
    /// The device never reads this data: it is received and checked, not
    /// copied into `buf` ([`TargetConnection::request_data_discarded`]).
    discard: bool,
}

/// An H2CData PDU cut by the end of an input, its payload placed in the
/// transfer's buffer as it arrives.
struct Stream {
    /// Its header, checked.
    header: DataHeader,
    /// Where the next payload byte goes.
    at: usize,
    /// Payload bytes still to come.
    left: usize,
    /// The running data digest, when data digests are on.
    crc: Option<checksum::Crc32c>,
    /// The data digest the host sent, as far as it came.
    digest: [u8; 4],
    digest_got: usize,
}

/// What a PDU begun in the receive buffer needs next.
enum Need {
    Whole,
    More(usize),
    Stream,
}

/// Read data after which held response capsules are queued at once
/// ([`TargetConnection::end_read`]).
const HOLD_LIMIT: usize = 64 * 1024;

/// Target side of one NVMe/TCP connection.
pub struct TargetConnection<B> {
    cfg: TargetConfig,
    state: State,
    rx_framing: Framing,
    tx_framing: Framing,
    /// The start of a PDU the last input cut: never more than one PDU.
    rx: Vec<u8>,
    /// Queued [`Event::CommandInInput`]s.
    lent: usize,
    /// The H2CData PDU being placed as it arrives.
    stream: Option<Stream>,
    events: VecDeque<Event<B>>,
    tx: Vec<u8>,
    /// Zero bytes the transmit stream carries that `tx` does not hold:
    /// (position in `tx` they go before, length).
    tx_zeros: Vec<(usize, usize)>,
    /// Response capsules of reads whose data went into `tx`, held until
    /// the next send takes them after that data: a batch of reads goes out
    /// as its data, then its responses, so that a host completes the
    /// batch's commands together.
    tx_held: Vec<u8>,
    /// Read data queued ahead of the first response in `tx_held`.
    held_after: usize,
    /// Whether responses to reads are held ([`set_hold`](Self::set_hold)).
    hold: bool,
    transfers: Vec<Option<Transfer<B>>>,
    free_ttags: Vec<u16>,
    sqhd: u16,
    sq_entries: u16,
    sqid: u16,
    sq_flow_disabled: bool,
    /// Commands received and not yet completed: never more than the queue
    /// holds.
    outstanding: u16,
    /// Bytes of solicited write data buffered in `transfers`.
    r2t_bytes: u64,
    /// R2Ts that wait for buffer room: (cid, length, discard).
    r2t_waiting: VecDeque<(u16, u32, bool)>,
    /// Transfers of aborted commands whose data is still to be dropped.
    discarding: u16,
}

impl<B: DataBuffer> TargetConnection<B> {
    /// A connection waiting for the host's ICReq.
    pub fn new(cfg: TargetConfig) -> Self {
        let align = pdu::pda_bytes(cfg.cpda);
        TargetConnection {
            cfg,
            state: State::AwaitIcReq,
            rx_framing: Framing { hdgst: false, ddgst: false, data_align: align },
            tx_framing: Framing { hdgst: false, ddgst: false, data_align: 4 },
            rx: Vec::new(),
            lent: 0,
            stream: None,
            events: VecDeque::new(),
            tx: Vec::new(),
            tx_zeros: Vec::new(),
            tx_held: Vec::new(),
            held_after: 0,
            hold: false,
            transfers: Vec::new(),
            free_ttags: Vec::new(),
            sqhd: 0,
            sq_entries: 32,
            sqid: 0,
            sq_flow_disabled: false,
            outstanding: 0,
            r2t_bytes: 0,
            r2t_waiting: VecDeque::new(),
            discarding: 0,
        }
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// Whether header and data digests were negotiated.
    pub fn digests(&self) -> (bool, bool) {
        (self.rx_framing.hdgst, self.rx_framing.ddgst)
    }

    /// Records the queue this connection carries once Connect succeeded:
    /// its ID, its size (SQSIZE is 0-based) and whether the host disabled SQ
    /// flow control.
    pub fn set_queue(&mut self, sqid: u16, sqsize: u16, sq_flow_disabled: bool) {
        self.sqid = sqid;
        self.sq_entries = sqsize.saturating_add(1);
        self.sq_flow_disabled = sq_flow_disabled;
    }

    /// Feeds received bytes. Whole PDUs are parsed where they lie; only a
    /// PDU cut by the end of `bytes` is kept (alone) until later input
    /// completes it. On a fatal error the connection queues a
    /// C2HTermReq, moves to [`State::Terminated`] and returns the error for
    /// the log; later input is ignored.
    pub fn handle_input(&mut self, bytes: &[u8]) -> Result<(), Fatal> {
        self.input(bytes, false)
    }

    /// As [`handle_input`](Self::handle_input), except that a command whose
    /// in-capsule data lies whole in `bytes` comes out as
    /// [`Event::CommandInInput`], its data left where it is. The caller
    /// takes those events while `bytes` is still there, then calls
    /// [`keep_input`](Self::keep_input) with the same bytes, which copies
    /// the data of any it left, before it feeds more input.
    pub fn handle_input_lent(&mut self, bytes: &[u8]) -> Result<(), Fatal> {
        self.input(bytes, true)
    }

    /// Copies the in-capsule data of every [`Event::CommandInInput`] still
    /// queued out of `input` (the bytes last given to
    /// [`handle_input_lent`](Self::handle_input_lent)) into a buffer of its
    /// own: they become [`Event::Command`].
    pub fn keep_input(&mut self, input: &[u8]) {
        if self.lent == 0 {
            return;
        }
        for e in &mut self.events {
            if let Event::CommandInInput { sqe, data } = e {
                let bytes = input.get(data.clone()).unwrap_or_default();
                let mut buf = B::alloc(bytes.len());
                buf.as_mut().copy_from_slice(bytes);
                *e = Event::Command { sqe: *sqe, data: Some(buf) };
            }
        }
        self.lent = 0;
    }

    fn input(&mut self, bytes: &[u8], lend: bool) -> Result<(), Fatal> {
        if self.state == State::Terminated {
            return Ok(());
        }
        if self.lent != 0 {
            // Lent data that was not kept is gone: those commands fail
            // (the host may retry them), they never run on other bytes.
            debug_assert!(false, "handle_input after handle_input_lent without keep_input");
            for e in &mut self.events {
                if let Event::CommandInInput { sqe, .. } = e {
                    *e = Event::DataDigestError { cid: sqe.cid.get(), capsule: Some(*sqe) };
                }
            }
            self.lent = 0;
        }
        let result = self.consume(bytes, lend);
        if let Err(e) = &result {
            self.terminate(e);
        }
        result
    }

    fn consume(&mut self, input: &[u8], lend: bool) -> Result<(), Fatal> {
        let mut bytes = input;
        loop {
            if self.stream.is_some() {
                bytes = self.stream_in(bytes)?;
                if self.stream.is_some() {
                    return Ok(());
                }
            }
            if self.rx.is_empty() {
                break;
            }
            // The PDU an earlier input began: take just what it lacks.
            match self.need_of(&self.rx)? {
                Need::Whole => {
                    let rx = std::mem::take(&mut self.rx);
                    let r = self.process(&rx, None);
                    self.rx = rx;
                    self.rx.clear();
                    r?;
                }
                Need::Stream => self.start_stream()?,
                Need::More(missing) => {
                    if bytes.is_empty() {
                        return Ok(());
                    }
                    let Some((head, rest)) = bytes.split_at_checked(missing.min(bytes.len())) else { break };
                    self.rx.extend_from_slice(head);
                    bytes = rest;
                }
            }
        }
        // Lent data is found by its place in `input`.
        let skipped = input.len().saturating_sub(bytes.len());
        let used = self.process(bytes, lend.then_some(skipped))?;
        let tail = bytes.get(used..).unwrap_or_default();
        if self.state != State::Terminated && !tail.is_empty() {
            if matches!(self.need_of(tail)?, Need::Stream) {
                self.start_stream_from(tail)?;
            } else {
                self.rx.extend_from_slice(tail);
            }
        }
        Ok(())
    }

    /// What the PDU begun in `buf` needs next: nothing, more bytes (its
    /// common header first), or, for H2CData whose header is complete, to
    /// have its payload placed as it arrives.
    fn need_of(&self, buf: &[u8]) -> Result<Need, Fatal> {
        let have = buf.len();
        if have < 8 {
            return Ok(Need::More(8usize.saturating_sub(have)));
        }
        if malformed_term_req(buf).is_some() {
            // Handled at its common header: nothing more is waited for.
            return Ok(Need::Whole);
        }
        match pdu::deframe_head(buf, self.rx_framing, self.max_data()) {
            // (An 8-byte common header always reads; never zero bytes.)
            None => Ok(Need::More(8usize.saturating_sub(have).max(1))),
            Some(Err(e)) => Err(self.sequence_error(e)),
            Some(Ok(Err(n))) => Ok(Need::More(n)),
            Some(Ok(Ok(head))) if head.len <= have => Ok(Need::Whole),
            Some(Ok(Ok(head))) if head.pdu_type == PduType::H2C_DATA && head.data_len > 0 => Ok(Need::Stream),
            Some(Ok(Ok(head))) => Ok(Need::More(head.len.saturating_sub(have))),
        }
    }

    /// The most data bytes a PDU of each type may carry now: a command
    /// capsule's in-capsule data is bounded by its queue's capsule size.
    fn max_data(&self) -> impl Fn(PduType) -> Option<u32> {
        let (cfg, state) = (self.cfg, self.state);
        let in_capsule = if self.sqid == 0 { ADMIN_IN_CAPSULE } else { cfg.max_in_capsule };
        move |t: PduType| -> Option<u32> {
            match (state, t) {
                (State::AwaitIcReq, PduType::IC_REQ) => Some(0),
                (State::Ready, PduType::CAPSULE_CMD) => Some(in_capsule),
                (State::Ready, PduType::H2C_DATA) => Some(cfg.max_h2c_data),
                (_, PduType::H2C_TERM_REQ) => Some(pdu::TERM_REQ_MAX_DATA as u32),
                _ => None,
            }
        }
    }

    /// A PDU type the host sends, out of its place, is a PDU sequence
    /// error: anything but an ICReq first, an ICReq after the first. Other
    /// types stay invalid PDU types.
    fn sequence_error(&self, mut e: Fatal) -> Fatal {
        if e.fes != Fes::INVALID_HEADER_FIELD || e.fei != offset::PDU_TYPE {
            return e;
        }
        if self.state == State::AwaitIcReq {
            e.fes = Fes::PDU_SEQUENCE_ERROR;
            e.reason = format!("{} before ICReq", e.reason);
        } else if e.header.first() == Some(&PduType::IC_REQ.0) {
            e.fes = Fes::PDU_SEQUENCE_ERROR;
            e.reason = "ICReq (PDU type 0x00) after the connection was initialized".into();
        }
        e
    }

    /// Handles the whole PDUs at the front of `buf`; returns the bytes they
    /// took. With `lend`, in-capsule data stays in the input, of which
    /// `buf` starts `lend` bytes in ([`Event::CommandInInput`]).
    fn process(&mut self, buf: &[u8], lend: Option<usize>) -> Result<usize, Fatal> {
        let mut used = 0usize;
        while self.state != State::Terminated {
            let rest = buf.get(used..).unwrap_or_default();
            if let Some((fes, why)) = malformed_term_req(rest) {
                self.host_terminated(fes, Some(why));
                break;
            }
            let frame = match pdu::deframe(rest, self.rx_framing, self.max_data()) {
                None => break,
                Some(Err(e)) => return Err(self.sequence_error(e)),
                Some(Ok(f)) => f,
            };
            let data_at = (frame.data.as_ptr() as usize).saturating_sub(buf.as_ptr() as usize);
            let lent_at = lend.map(|skipped| skipped.saturating_add(data_at));
            used = used.saturating_add(frame.len);
            let header = frame.header;
            match frame.pdu_type {
                PduType::IC_REQ => self.on_ic_req(header)?,
                PduType::CAPSULE_CMD => self.on_capsule(header, frame.data, lent_at, frame.data_digest_ok)?,
                PduType::H2C_DATA => self.on_h2c_data(header, frame.data, frame.data_digest_ok)?,
                PduType::H2C_TERM_REQ => {
                    self.host_terminated(TermReq::read_from_bytes(header).map(|t| t.fes.get()).unwrap_or(0), None);
                }
                _ => {}
            }
        }
        Ok(used)
    }

    /// The host terminated the connection: it ends here, and no C2HTermReq
    /// answers (NVMe-oF 1.1 section 7.4.7).
    fn host_terminated(&mut self, fes: u16, malformed: Option<String>) {
        self.events.push_back(Event::HostTerminated { fes, malformed });
        self.state = State::Terminated;
    }

    fn on_ic_req(&mut self, header: &[u8]) -> Result<(), Fatal> {
        let Ok(req) = IcReq::read_from_bytes(header) else {
            return Err(Fatal::new(Fes::INVALID_HEADER_FIELD, offset::HLEN, "ICReq header truncated"));
        };
        let fatal = |fes: Fes, fei: u32, reason: String| Fatal { fes, fei, reason, header: header.to_vec() };
        // A format version we do not speak is an unsupported parameter; a
        // value the spec reserves is an invalid field.
        if req.pfv.get() != 0 {
            let reason = format!("ICReq pfv {} unsupported (expected 0)", req.pfv.get());
            return Err(fatal(Fes::UNSUPPORTED_PARAMETER, offset::PFV, reason));
        }
        if req.hpda > 31 {
            let reason = format!("ICReq hpda {} out of range (0..=31)", req.hpda);
            return Err(fatal(Fes::INVALID_HEADER_FIELD, offset::HPDA, reason));
        }
        if req.dgst & !(dgst::HEADER | dgst::DATA) != 0 {
            let reason = format!("ICReq dgst {:#04x} has reserved bits", req.dgst);
            return Err(fatal(Fes::INVALID_HEADER_FIELD, offset::DGST, reason));
        }
        let resp = IcResp {
            ch: pdu::common_header(PduType::IC_RESP, 0),
            pfv: 0.into(),
            cpda: self.cfg.cpda,
            dgst: req.dgst,
            maxh2cdata: self.cfg.max_h2c_data.into(),
            rsvd: [0; 112],
        };
        pdu::encode(&mut self.tx, resp.as_bytes(), &[], self.tx_framing);
        let hdgst = req.dgst & dgst::HEADER != 0;
        let ddgst = req.dgst & dgst::DATA != 0;
        self.rx_framing.hdgst = hdgst;
        self.rx_framing.ddgst = ddgst;
        self.tx_framing = Framing { hdgst, ddgst, data_align: pdu::pda_bytes(req.hpda) };
        self.state = State::Ready;
        Ok(())
    }

    /// A command capsule; `lent_at` is where its data starts in the input
    /// when it is lent ([`Event::CommandInInput`]).
    fn on_capsule(&mut self, header: &[u8], data: &[u8], lent_at: Option<usize>, data_ok: bool) -> Result<(), Fatal> {
        let Ok(cmd) = CapsuleCmd::read_from_bytes(header) else {
            return Err(Fatal::new(Fes::INVALID_HEADER_FIELD, offset::HLEN, "capsule header truncated"));
        };
        if self.outstanding >= self.sq_entries {
            return Err(Fatal {
                fes: Fes::PDU_SEQUENCE_ERROR,
                fei: 0,
                reason: format!(
                    "command capsule (cid {}) beyond the queue: {} commands outstanding, SQ size {}",
                    cmd.sqe.cid.get(),
                    self.outstanding,
                    self.sq_entries
                ),
                header: header.to_vec(),
            });
        }
        self.outstanding = self.outstanding.saturating_add(1);
        self.sqhd = self.sqhd.wrapping_add(1).checked_rem(self.sq_entries).unwrap_or(0);
        let cid = cmd.sqe.cid.get();
        if data.is_empty() {
            self.events.push_back(Event::Command { sqe: cmd.sqe, data: None });
            return Ok(());
        }
        if !data_ok {
            self.events.push_back(Event::DataDigestError { cid, capsule: Some(cmd.sqe) });
            return Ok(());
        }
        if let Some(at) = lent_at {
            self.lent = self.lent.saturating_add(1);
            self.events.push_back(Event::CommandInInput { sqe: cmd.sqe, data: at..at.saturating_add(data.len()) });
            return Ok(());
        }
        let mut buf = B::alloc(data.len());
        buf.as_mut().copy_from_slice(data);
        self.events.push_back(Event::Command { sqe: cmd.sqe, data: Some(buf) });
        Ok(())
    }

    fn on_h2c_data(&mut self, header: &[u8], data: &[u8], data_ok: bool) -> Result<(), Fatal> {
        let (h, datao) = self.h2c_check(header, data.len())?;
        self.h2c_place(h.ttag.get(), datao as usize, data);
        self.h2c_done(&h, data_ok)
    }

    /// Checks an H2CData header carrying `data_len` bytes against its R2T;
    /// returns the header and where its data goes.
    fn h2c_check(&self, header: &[u8], data_len: usize) -> Result<(DataHeader, u32), Fatal> {
        let Ok(h) = DataHeader::read_from_bytes(header) else {
            return Err(Fatal::new(Fes::INVALID_HEADER_FIELD, offset::HLEN, "H2CData header truncated"));
        };
        let fatal = |fes: Fes, fei: u32, reason: String| Fatal { fes, fei, reason, header: header.to_vec() };
        let ttag = h.ttag.get();
        let Some(t) = self.transfers.get(usize::from(ttag)).and_then(Option::as_ref) else {
            return Err(fatal(
                Fes::INVALID_HEADER_FIELD,
                offset::TTAG,
                format!("H2CData ttag {ttag} matches no outstanding R2T"),
            ));
        };
        if h.cccid.get() != t.cid {
            return Err(fatal(
                Fes::INVALID_HEADER_FIELD,
                offset::CCCID,
                format!("H2CData cccid {} (R2T ttag {ttag} belongs to cid {})", h.cccid.get(), t.cid),
            ));
        }
        let (datao, datal) = (h.datao.get(), h.datal.get());
        // FEI is reserved for Data Transfer Out of Range: the reason names
        // the field.
        if datao != t.received {
            return Err(fatal(
                Fes::DATA_OUT_OF_RANGE,
                0,
                format!("H2CData datao {datao} (expected {} for cid {})", t.received, t.cid),
            ));
        }
        let end = datao.checked_add(datal);
        if end.is_none_or(|end| end > t.len) {
            return Err(fatal(
                Fes::DATA_OUT_OF_RANGE,
                0,
                format!("H2CData datao {datao} datal {datal} outside the R2T of {} bytes", t.len),
            ));
        }
        if usize::try_from(datal).ok() != Some(data_len) {
            return Err(fatal(
                Fes::INVALID_HEADER_FIELD,
                offset::DATAL,
                format!("H2CData datal {datal} but the PDU carries {data_len} bytes"),
            ));
        }
        Ok((h, datao))
    }

    /// Copies H2CData payload into its transfer's buffer at `at` (nowhere
    /// when the command was aborted or its device discards the data).
    fn h2c_place(&mut self, ttag: u16, at: usize, src: &[u8]) {
        let t = self.transfers.get_mut(usize::from(ttag)).and_then(Option::as_mut).filter(|t| !t.discard);
        if let Some(dst) =
            t.and_then(|t| t.buf.as_mut()).and_then(|b| b.as_mut().get_mut(at..at.saturating_add(src.len())))
        {
            dst.copy_from_slice(src);
        }
    }

    /// An H2CData PDU checked by [`h2c_check`](Self::h2c_check) has had all
    /// its data placed: counts it, and hands the transfer over when it is
    /// complete.
    fn h2c_done(&mut self, h: &DataHeader, data_ok: bool) -> Result<(), Fatal> {
        let fatal = |fes: Fes, fei: u32, reason: String| Fatal { fes, fei, reason, header: h.as_bytes().to_vec() };
        let ttag = h.ttag.get();
        let Some(t) = self.transfers.get_mut(usize::from(ttag)).and_then(Option::as_mut) else {
            return Ok(());
        };
        t.received = h.datao.get().saturating_add(h.datal.get()).min(t.len);
        t.digest_failed |= !data_ok;
        let last = h.ch.flags & flags::LAST_PDU != 0;
        if t.received == t.len {
            if !last {
                return Err(fatal(
                    Fes::INVALID_HEADER_FIELD,
                    offset::FLAGS,
                    format!("H2CData completing cid {} lacks LAST_PDU", t.cid),
                ));
            }
            if let Some(done) = self.transfers.get_mut(usize::from(ttag)).and_then(Option::take) {
                self.free_ttags.push(ttag);
                let Some(buf) = done.buf else {
                    // An aborted command's data, all dropped: the TTAG may
                    // now serve another transfer (one may wait for it).
                    self.discarding = self.discarding.saturating_sub(1);
                    self.start_waiting_r2ts();
                    return Ok(());
                };
                self.r2t_bytes = self.r2t_bytes.saturating_sub(u64::from(done.len));
                self.start_waiting_r2ts();
                self.events.push_back(if done.digest_failed {
                    Event::DataDigestError { cid: done.cid, capsule: None }
                } else {
                    Event::Data { cid: done.cid, data: buf }
                });
            }
        } else if last {
            return Err(fatal(
                Fes::INVALID_HEADER_FIELD,
                offset::FLAGS,
                format!("H2CData LAST_PDU at {} of {} bytes", t.received, t.len),
            ));
        }
        Ok(())
    }

    /// Starts placing the H2CData PDU whose header `rx` holds as its
    /// payload arrives (`start_stream_from` of `rx`), and empties `rx`.
    fn start_stream(&mut self) -> Result<(), Fatal> {
        let rx = std::mem::take(&mut self.rx);
        let r = self.start_stream_from(&rx);
        self.rx = rx;
        self.rx.clear();
        r
    }

    /// Starts placing the H2CData PDU at the front of `rx` (its header
    /// whole, its end not there yet) as its payload arrives: the header is
    /// checked now, the payload goes straight to the transfer's buffer
    /// ([`stream_in`](Self::stream_in)).
    fn start_stream_from(&mut self, rx: &[u8]) -> Result<(), Fatal> {
        let head = match pdu::deframe_head(rx, self.rx_framing, self.max_data()) {
            Some(Ok(Ok(head))) => head,
            Some(Err(e)) => return Err(e),
            _ => return Err(Fatal::new(Fes::PDU_SEQUENCE_ERROR, 0, "H2CData header incomplete")),
        };
        let (h, datao) = self.h2c_check(head.header, head.data_len)?;
        self.stream = Some(Stream {
            header: h,
            at: datao as usize,
            left: head.data_len,
            crc: head.data_digest.then(checksum::Crc32c::new),
            digest: [0; 4],
            digest_got: 0,
        });
        // What came after the header: part of the payload (never the whole
        // PDU, which would have been handled whole).
        self.stream_in(rx.get(head.data_start..).unwrap_or_default())?;
        Ok(())
    }

    /// Feeds the H2CData PDU being placed: payload to its buffer, then its
    /// data digest. Returns the bytes after that PDU's end.
    fn stream_in<'a>(&mut self, bytes: &'a [u8]) -> Result<&'a [u8], Fatal> {
        let Some(s) = self.stream.as_mut() else { return Ok(bytes) };
        let (payload, mut rest) = bytes.split_at_checked(s.left.min(bytes.len())).unwrap_or_default();
        if let Some(crc) = &mut s.crc {
            crc.update(payload);
        }
        let (ttag, at) = (s.header.ttag.get(), s.at);
        s.at = s.at.saturating_add(payload.len());
        s.left = s.left.saturating_sub(payload.len());
        if s.left == 0 && s.crc.is_some() {
            let n = s.digest.len().saturating_sub(s.digest_got).min(rest.len());
            let (got, after) = rest.split_at_checked(n).unwrap_or_default();
            if let Some(dst) = s.digest.get_mut(s.digest_got..s.digest_got.saturating_add(n)) {
                dst.copy_from_slice(got);
            }
            s.digest_got = s.digest_got.saturating_add(n);
            rest = after;
        }
        let done = s.left == 0 && (s.crc.is_none() || s.digest_got == s.digest.len());
        self.h2c_place(ttag, at, payload);
        if done {
            if let Some(s) = self.stream.take() {
                let ok = s.crc.is_none_or(|c| c.value().to_le_bytes() == s.digest);
                self.h2c_done(&s.header, ok)?;
            }
        }
        Ok(rest)
    }

    /// Solicits `len` bytes of write data for command `cid` with an R2T.
    /// The data arrives as [`Event::Data`]. One R2T covers the whole
    /// transfer, which honours any MAXR2T the host set (at least one).
    /// While [`TargetConfig::r2t_buffer`] bytes are already solicited the
    /// R2T waits (in order) for earlier transfers to complete, so a host
    /// cannot make the connection buffer more than that.
    pub fn request_data(&mut self, cid: u16, len: u32) {
        self.solicit(cid, len, false);
    }

    /// As [`request_data`](Self::request_data) for data the device never
    /// reads (a write to a null device): the payload is received and
    /// checked (lengths, data digest) like any other but not copied, and
    /// the buffer [`Event::Data`] hands over holds whatever it held.
    pub fn request_data_discarded(&mut self, cid: u16, len: u32) {
        self.solicit(cid, len, true);
    }

    fn solicit(&mut self, cid: u16, len: u32, discard: bool) {
        if !self.may_send_r2t(len) {
            self.r2t_waiting.push_back((cid, len, discard));
            return;
        }
        self.send_r2t(cid, len, discard);
    }

    /// Whether an R2T for `len` bytes may go now: within the buffer budget
    /// (one transfer always may), and with a TTAG to name it by. Every
    /// 16-bit TTAG can be taken at once only by a queue of more than 32K
    /// entries whose aborted transfers are still being drained.
    fn may_send_r2t(&self, len: u32) -> bool {
        block::fits_budget(self.r2t_bytes, len, self.cfg.r2t_buffer)
            && (!self.free_ttags.is_empty() || self.transfers.len() <= usize::from(u16::MAX))
    }

    /// Takes back the command `cid` while it is parsed but not yet polled
    /// (the driver stopped taking events because the host does not read
    /// its replies): it is aborted before it started. The caller answers
    /// it (with [`send_response`](Self::send_response), which keeps the
    /// queue's accounting). It stays in line as [`Event::Withdrawn`].
    /// `false` when no such command waits.
    pub fn withdraw_command(&mut self, cid: u16) -> bool {
        let Some(e) = self.events.iter_mut().find(
            |e| matches!(e, Event::Command { sqe, .. } | Event::CommandInInput { sqe, .. } if sqe.cid.get() == cid),
        ) else {
            return false;
        };
        if let Event::CommandInInput { .. } = e {
            self.lent = self.lent.saturating_sub(1);
        }
        let (Event::Command { sqe, .. } | Event::CommandInInput { sqe, .. }) = *e else { return false };
        *e = Event::Withdrawn { sqe };
        true
    }

    /// Gives up the data transfer of `cid` (its command is being aborted):
    /// an R2T still waiting for buffer room is never sent; one sent has its
    /// buffer and budget released, and the H2CData the host still sends
    /// for its TTAG is checked as usual and dropped, never delivered (the
    /// TTAG is reused once the host sent the last of it). `false` when no
    /// transfer of `cid` is outstanding (its data arrived already, or it
    /// never needed any) or when as many aborted transfers as the queue
    /// has entries are already being dropped.
    pub fn cancel_data(&mut self, cid: u16) -> bool {
        if let Some(i) = self.r2t_waiting.iter().position(|&(c, ..)| c == cid) {
            self.r2t_waiting.remove(i);
            return true;
        }
        if self.discarding >= self.sq_entries {
            return false;
        }
        let Some(t) = self.transfers.iter_mut().flatten().find(|t| t.cid == cid && t.buf.is_some()) else {
            return false;
        };
        t.buf = None;
        let len = t.len;
        self.discarding = self.discarding.saturating_add(1);
        self.r2t_bytes = self.r2t_bytes.saturating_sub(u64::from(len));
        self.start_waiting_r2ts();
        true
    }

    /// Sends the waiting R2Ts that fit in the buffer budget now.
    fn start_waiting_r2ts(&mut self) {
        while let Some(&(cid, len, discard)) = self.r2t_waiting.front() {
            if !self.may_send_r2t(len) {
                break;
            }
            self.r2t_waiting.pop_front();
            self.send_r2t(cid, len, discard);
        }
    }

    fn send_r2t(&mut self, cid: u16, len: u32, discard: bool) {
        if self.state == State::Terminated {
            return;
        }
        self.r2t_bytes = self.r2t_bytes.saturating_add(u64::from(len));
        let ttag = match self.free_ttags.pop() {
            Some(t) => t,
            None => {
                // `may_send_r2t` left a TTAG for it.
                let t = u16::try_from(self.transfers.len()).unwrap_or(u16::MAX);
                self.transfers.push(None);
                t
            }
        };
        if let Some(slot) = self.transfers.get_mut(usize::from(ttag)) {
            *slot = Some(Transfer {
                cid,
                buf: Some(B::alloc(len as usize)),
                len,
                received: 0,
                digest_failed: false,
                discard,
            });
        }
        let r2t = R2t {
            ch: pdu::common_header(PduType::R2T, 0),
            cccid: cid.into(),
            ttag: ttag.into(),
            r2to: 0.into(),
            r2tl: len.into(),
            rsvd: [0; 4],
        };
        pdu::encode(&mut self.tx, r2t.as_bytes(), &[], self.tx_framing);
    }

    /// Whether a read completing with `cqe` ends with SUCCESS on its last
    /// C2HData instead of a response capsule: with SQ flow control disabled
    /// (TP 8000 section 7.4.5.2), or always when configured so; only for a
    /// successful completion with nothing in DW0/DW1 for the host.
    fn success_flag(&self, cqe: &Cqe) -> bool {
        (self.sq_flow_disabled || self.cfg.c2h_success_always)
            && cqe.status().is_success()
            && cqe.dw0.get() == 0
            && cqe.dw1.get() == 0
    }

    /// Sends read data for `cid` followed by its completion, or with the
    /// SUCCESS flag in place of it ([`success_flag`](Self::success_flag)).
    pub fn send_data(&mut self, cid: u16, data: &[u8], cqe: Cqe) {
        if self.state == State::Terminated {
            return;
        }
        let success_flag = self.success_flag(&cqe);
        let max = self.cfg.max_transfer.max(4096) as usize;
        let mut offset = 0usize;
        let total = data.len();
        for chunk in data.chunks(max) {
            let last = offset.saturating_add(chunk.len()) == total;
            let mut f = 0;
            if last {
                f |= flags::LAST_PDU;
                if success_flag {
                    f |= flags::SUCCESS;
                }
            }
            let h = c2h_header(cid, offset, chunk.len(), f);
            pdu::encode(&mut self.tx, h.as_bytes(), chunk, self.tx_framing);
            offset = offset.saturating_add(chunk.len());
        }
        self.end_read(success_flag, cqe, total);
    }

    /// As [`send_data`](Self::send_data) with `len` bytes that `fill`
    /// appends straight to the send buffer (one C2HData PDU). Returns
    /// `false`, having queued nothing, when `fill` does (or appends another
    /// number of bytes) or when `len` needs more than one PDU; the caller
    /// then answers another way.
    pub fn send_data_with(
        &mut self,
        cid: u16,
        len: usize,
        cqe: Cqe,
        fill: impl FnOnce(&mut Appender<'_>) -> bool,
    ) -> bool {
        if self.state == State::Terminated {
            return true;
        }
        if len == 0 || len > self.cfg.max_transfer.max(4096) as usize {
            return false;
        }
        let success_flag = self.success_flag(&cqe);
        let f = flags::LAST_PDU | if success_flag { flags::SUCCESS } else { 0 };
        let h = c2h_header(cid, 0, len, f);
        if !pdu::encode_with(&mut self.tx, h.as_bytes(), len, self.tx_framing, fill) {
            return false;
        }
        self.end_read(success_flag, cqe, len);
        true
    }

    /// As [`send_data`](Self::send_data) with `len` zero bytes (a read of
    /// a device that holds nothing), which the send buffer does not hold:
    /// [`take_transmit_parts`](Self::take_transmit_parts) says where they
    /// go, and the sender sends them from a page of zeros. `false`, having
    /// queued nothing, when `len` needs more than one PDU.
    pub fn send_zeros(&mut self, cid: u16, len: usize, cqe: Cqe) -> bool {
        if self.state == State::Terminated {
            return true;
        }
        if len == 0 || len > self.cfg.max_transfer.max(4096) as usize {
            return false;
        }
        let success_flag = self.success_flag(&cqe);
        let f = flags::LAST_PDU | if success_flag { flags::SUCCESS } else { 0 };
        let h = c2h_header(cid, 0, len, f);
        let at = pdu::encode_zeros(&mut self.tx, h.as_bytes(), len, self.tx_framing);
        if self.tx_zeros.capacity() == 0 {
            // Room for a whole queue's reads at once, taken once.
            self.tx_zeros.reserve(usize::from(self.sq_entries).max(32));
        }
        self.tx_zeros.push((at, len));
        self.end_read(success_flag, cqe, len);
        true
    }

    /// Sends a response capsule. SQHD and SQID are filled in here.
    pub fn send_response(&mut self, cqe: Cqe) {
        if self.state == State::Terminated {
            return;
        }
        let resp = self.response(cqe);
        pdu::encode(&mut self.tx, resp.as_bytes(), &[], self.tx_framing);
    }

    /// The response capsule ending a command, which it counts as ended.
    fn response(&mut self, mut cqe: Cqe) -> CapsuleResp {
        self.outstanding = self.outstanding.saturating_sub(1);
        cqe.sqhd = if self.sq_flow_disabled { 0xffff } else { self.sqhd }.into();
        cqe.sqid = self.sqid.into();
        CapsuleResp { ch: pdu::common_header(PduType::CAPSULE_RESP, 0), cqe }
    }

    /// Ends a read whose `len` bytes of data were just queued: by the
    /// SUCCESS flag its last C2HData carries, or with a response capsule.
    /// While [`set_hold`](Self::set_hold) is on, that capsule waits to
    /// follow the data of the other reads queued before the next send, or
    /// until [`HOLD_LIMIT`] bytes of data wait ahead of it.
    fn end_read(&mut self, success_flag: bool, cqe: Cqe, len: usize) {
        if success_flag {
            self.outstanding = self.outstanding.saturating_sub(1);
            return;
        }
        if !self.hold {
            return self.send_response(cqe);
        }
        let resp = self.response(cqe);
        pdu::encode(&mut self.tx_held, resp.as_bytes(), &[], self.tx_framing);
        self.held_after = self.held_after.saturating_add(len);
        if self.held_after >= HOLD_LIMIT {
            self.release_held();
        }
    }

    /// Whether the responses of reads completed from now on are held back
    /// behind the data of the reads that follow them.
    pub fn set_hold(&mut self, hold: bool) {
        self.hold = hold;
    }

    /// Queues the held response capsules after everything queued so far.
    fn release_held(&mut self) {
        self.tx.append(&mut self.tx_held);
        self.held_after = 0;
    }

    /// Queues a C2HTermReq for `e` and stops the connection: nothing is
    /// queued after it (TP 8000 7.4.4: the controller sends no further
    /// PDU), so answers of commands still running are dropped.
    pub fn terminate(&mut self, e: &Fatal) {
        if self.state == State::Terminated {
            return;
        }
        let t = TermReq {
            ch: pdu::common_header(PduType::C2H_TERM_REQ, 0),
            fes: e.fes.0.into(),
            fei: e.fei.into(),
            rsvd: [0; 10],
        };
        self.release_held();
        // No PDA padding: the echoed header must keep PLEN within 152 bytes
        // (TP 8000 section 7.4.4), and terminate requests carry no digests.
        pdu::encode(&mut self.tx, t.as_bytes(), &e.header, Framing { data_align: 4, ..self.tx_framing });
        self.state = State::Terminated;
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event<B>> {
        let e = self.events.pop_front();
        if let Some(Event::CommandInInput { .. }) = e {
            self.lent = self.lent.saturating_sub(1);
        }
        e
    }

    /// Whether bytes wait to be sent.
    pub fn has_transmit(&self) -> bool {
        !self.tx.is_empty() || !self.tx_held.is_empty()
    }

    /// How many bytes wait to be sent.
    pub fn transmit_len(&self) -> usize {
        block::transmit_len(&self.tx, &self.tx_zeros).saturating_add(self.tx_held.len())
    }

    /// Moves every byte waiting to be sent to the end of `out` (zeros
    /// queued by [`send_zeros`](Self::send_zeros) written out).
    pub fn take_transmit(&mut self, out: &mut Vec<u8>) {
        self.release_held();
        block::take_transmit(&mut self.tx, &mut self.tx_zeros, out);
    }

    /// As [`take_transmit`](Self::take_transmit), except that zeros queued
    /// by [`send_zeros`](Self::send_zeros) are not written: `zeros(at, len)`
    /// says that `len` zero bytes go before byte `at` of `out`.
    pub fn take_transmit_parts(&mut self, out: &mut Vec<u8>, zeros: impl FnMut(usize, usize)) {
        self.release_held();
        block::take_transmit_parts(&mut self.tx, &mut self.tx_zeros, out, zeros);
    }

    /// The SGL check for a command's data: in-capsule data must be described
    /// by an offset data block descriptor of the same length at offset 0,
    /// other data by a transport data block descriptor. Returns the transfer
    /// length in bytes or the status to complete with.
    pub fn check_sgl(&self, sqe: &Sqe, in_capsule_len: Option<usize>) -> Result<u32, nvme_spec::Status> {
        use nvme_spec::Status;
        let sgl: Sgl = sqe.dptr;
        let len = sgl.length.get();
        match (in_capsule_len, sgl.desc_type(), sgl.subtype()) {
            (Some(n), Sgl::TYPE_DATA_BLOCK, Sgl::SUBTYPE_OFFSET) => {
                if n != 0 && !sqe.takes_host_data() {
                    // In-capsule data is write data only (as the Linux
                    // target rules).
                    Err(Status::INVALID_FIELD.dnr())
                } else if sgl.addr.get() != 0 {
                    Err(Status::SGL_OFFSET_INVALID.dnr())
                } else if usize::try_from(len).ok() != Some(n) {
                    Err(Status::SGL_DATA_LENGTH_INVALID.dnr())
                } else {
                    Ok(len)
                }
            }
            (None, Sgl::TYPE_TRANSPORT_DATA_BLOCK, Sgl::SUBTYPE_TRANSPORT) => {
                if len > self.cfg.max_transfer {
                    Err(Status::SGL_DATA_LENGTH_INVALID.dnr())
                } else {
                    Ok(len)
                }
            }
            (None, Sgl::TYPE_DATA_BLOCK, Sgl::SUBTYPE_OFFSET) if len == 0 => Ok(0),
            (Some(_), _, _) => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID.dnr()),
            _ => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID.dnr()),
        }
    }
}

/// The FES of the H2CTermReq at the front of `buf` (0 when that field has
/// not arrived) and what is wrong with it, when its HLEN or PLEN is
/// invalid. Such a request ends the connection at once with nothing
/// reported (NVMe-oF 1.1 section 7.4.7), and a controller never answers an
/// H2CTermReq with a C2HTermReq: the bytes its PLEN announces are not
/// waited for.
fn malformed_term_req(buf: &[u8]) -> Option<(u16, String)> {
    let ch = CommonHeader::read_from_bytes(buf.get(..8)?).ok()?;
    let t = PduType::H2C_TERM_REQ;
    if ch.pdu_type != t.0 {
        return None;
    }
    let (hlen, plen) = (ch.hlen, ch.plen.get());
    let max = t.max_plen().unwrap_or(pdu::TERM_REQ_MAX_PLEN);
    let why = if Some(hlen) != t.hlen() {
        format!("hlen {hlen} (expected 24)")
    } else if plen < u32::from(hlen) || plen > max {
        format!("plen {plen} (expected {hlen}..={max})")
    } else {
        return None;
    };
    Some((buf.get(8..10).and_then(|f| f.try_into().ok()).map_or(0, u16::from_le_bytes), why))
}

/// The header of a C2HData PDU carrying `len` bytes at `offset` of `cid`'s
/// data.
fn c2h_header(cid: u16, offset: usize, len: usize, pdu_flags: u8) -> DataHeader {
    DataHeader {
        ch: pdu::common_header(PduType::C2H_DATA, pdu_flags),
        cccid: cid.into(),
        ttag: 0.into(),
        datao: u32::try_from(offset).unwrap_or(u32::MAX).into(),
        datal: u32::try_from(len).unwrap_or(u32::MAX).into(),
        rsvd: [0; 4],
    }
}
