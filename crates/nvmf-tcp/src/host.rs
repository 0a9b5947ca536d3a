//! The host (initiator) side of one NVMe/TCP connection.
//!
//! Used by `crates/initiator` and the benchmark. The driver submits
//! commands with [`HostConnection::submit`]; write data goes in-capsule when
//! it fits, otherwise it is held until the controller's R2T asks for it.
//! Completions come back from [`HostConnection::poll_completion`] with any
//! read data.

use crate::error::{Fatal, Fes};
use crate::pdu::{
    self, dgst, flags, offset, CapsuleCmd, CapsuleResp, DataHeader, Framing, IcReq, IcResp, PduType, R2t, TermReq,
};
use nvme_spec::{Cqe, Sgl, Sqe, Status};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use zerocopy::{FromBytes, IntoBytes};

/// What the host asks for in its ICReq.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostConfig {
    /// Request header digests.
    pub header_digest: bool,
    /// Request data digests.
    pub data_digest: bool,
    /// Largest in-capsule write data to send on this queue (the controller's
    /// IOCCSZ minus the SQE; 8 KiB on admin queues).
    pub max_in_capsule: u32,
}

/// A completed command.
#[derive(Debug)]
pub struct Completion {
    /// The completion entry.
    pub cqe: Cqe,
    /// Read data received for the command.
    pub data: Vec<u8>,
}

struct Pending {
    write_data: Vec<u8>,
    /// Where the write data the controller's R2Ts asked for so far ends:
    /// an R2T asks for none of it again.
    requested: usize,
    read_data: Vec<u8>,
    read_len: usize,
    /// A C2HData PDU of this command failed its data digest.
    digest_failed: bool,
}

/// Largest C2HData PDU the host accepts; a command's own length bounds it
/// further.
const MAX_C2H_DATA: u32 = 64 << 20;

/// Host side of one NVMe/TCP connection.
pub struct HostConnection {
    cfg: HostConfig,
    ready: bool,
    terminated: bool,
    rx_framing: Framing,
    tx_framing: Framing,
    max_h2c_data: u32,
    rx: Vec<u8>,
    rx_start: usize,
    tx: Vec<u8>,
    pending: FxHashMap<u16, Pending>,
    completions: VecDeque<Completion>,
    /// Data buffers handed back by [`recycle`](Self::recycle) and by
    /// finished writes, reused for the next reads and writes.
    spare: Vec<Vec<u8>>,
}

/// Most spare buffers a connection keeps.
const MAX_SPARE: usize = 256;

impl HostConnection {
    /// A connection that has queued its ICReq.
    pub fn new(cfg: HostConfig) -> Self {
        let mut c = HostConnection {
            cfg,
            ready: false,
            terminated: false,
            rx_framing: Framing { hdgst: false, ddgst: false, data_align: 4 },
            tx_framing: Framing { hdgst: false, ddgst: false, data_align: 4 },
            max_h2c_data: 4096,
            rx: Vec::new(),
            rx_start: 0,
            tx: Vec::new(),
            pending: FxHashMap::default(),
            completions: VecDeque::new(),
            spare: Vec::new(),
        };
        let mut d = 0;
        if cfg.header_digest {
            d |= dgst::HEADER;
        }
        if cfg.data_digest {
            d |= dgst::DATA;
        }
        let req = IcReq {
            ch: pdu::common_header(PduType::IC_REQ, 0),
            pfv: 0.into(),
            hpda: 0,
            dgst: d,
            maxr2t: 0.into(),
            rsvd: [0; 112],
        };
        pdu::encode(&mut c.tx, req.as_bytes(), &[], c.tx_framing);
        c
    }

    /// Whether ICResp arrived.
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// Whether the controller terminated the connection.
    pub fn is_terminated(&self) -> bool {
        self.terminated
    }

    /// Commands submitted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.pending.len()
    }

    /// Submits a command. `write` is the command's host-to-controller data;
    /// `read_len` the bytes it expects back. The SGL is filled in here.
    pub fn submit(&mut self, mut sqe: Sqe, write: Vec<u8>, read_len: u32) {
        let cid = sqe.cid.get();
        let in_capsule = !write.is_empty() && write.len() <= self.cfg.max_in_capsule as usize;
        let data_len = if write.is_empty() { read_len } else { u32::try_from(write.len()).unwrap_or(u32::MAX) };
        sqe.set_sgl(if in_capsule { Sgl::in_capsule(data_len) } else { Sgl::transport(data_len) });
        let cmd = CapsuleCmd { ch: pdu::common_header(PduType::CAPSULE_CMD, 0), sqe };
        let (write_data, read_data, read_len) = if in_capsule {
            pdu::encode(&mut self.tx, cmd.as_bytes(), &write, self.tx_framing);
            self.recycle(write);
            (Vec::new(), Vec::new(), 0)
        } else {
            pdu::encode(&mut self.tx, cmd.as_bytes(), &[], self.tx_framing);
            let read_data = if read_len > 0 { self.buffer(read_len as usize) } else { Vec::new() };
            (write, read_data, read_len as usize)
        };
        let p = Pending { write_data, requested: 0, read_data, read_len, digest_failed: false };
        self.pending.insert(cid, p);
    }

    /// An empty buffer with room for `capacity` bytes, reusing a spare one
    /// when there is one (fill it and pass it to [`submit`](Self::submit)).
    pub fn buffer(&mut self, capacity: usize) -> Vec<u8> {
        let mut b = self.spare.pop().unwrap_or_default();
        b.clear();
        b.reserve(capacity);
        b
    }

    /// Hands a buffer back (a completion's data once read) for reuse.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if buf.capacity() > 0 && self.spare.len() < MAX_SPARE {
            self.spare.push(buf);
        }
    }

    /// Feeds received bytes.
    /// Any error ends the connection: later input is ignored.
    pub fn handle_input(&mut self, bytes: &[u8]) -> Result<(), Fatal> {
        if self.terminated {
            return Ok(());
        }
        self.rx.extend_from_slice(bytes);
        let r = self.process_input();
        // Keep the buffer from growing when reads never end on a PDU
        // boundary.
        if self.rx_start > 64 * 1024 {
            self.compact_rx();
        }
        r
    }

    /// The receive buffer, with room for at least `room` more bytes after
    /// its contents: read from the socket straight into its spare capacity
    /// and hand it back with [`received`](Self::received). This saves
    /// copying every byte through a separate read buffer.
    pub fn receive_buffer(&mut self, room: usize) -> Vec<u8> {
        // Moved only when the room runs out; otherwise the buffer grows,
        // so moves get rarer.
        if self.rx.capacity().saturating_sub(self.rx.len()) < room {
            self.compact_rx();
        }
        let mut rx = std::mem::take(&mut self.rx);
        rx.reserve(room);
        rx
    }

    /// Takes back the buffer from [`receive_buffer`](Self::receive_buffer)
    /// with the bytes read appended, and processes them as
    /// [`handle_input`](Self::handle_input) does.
    pub fn received(&mut self, rx: Vec<u8>) -> Result<(), Fatal> {
        self.rx = rx;
        if self.terminated {
            return Ok(());
        }
        self.process_input()
    }

    /// Keeps only the partial PDU at the end of the receive buffer, when
    /// it is no bigger than the bytes consumed before it (so moving it
    /// costs at most one copy of what was received).
    fn compact_rx(&mut self) {
        if self.rx_start > 0 && self.rx_start >= self.rx.len().saturating_sub(self.rx_start) {
            self.rx.drain(..self.rx_start);
            self.rx_start = 0;
        }
    }

    fn process_input(&mut self) -> Result<(), Fatal> {
        let r = self.process_rx();
        if r.is_err() {
            self.terminated = true;
        }
        r
    }

    fn process_rx(&mut self) -> Result<(), Fatal> {
        // The frames borrow the receive buffer while the handlers change
        // the rest of the connection.
        let rx = std::mem::take(&mut self.rx);
        let r = self.process_frames(&rx);
        self.rx = rx;
        if self.rx_start == self.rx.len() {
            self.rx.clear();
            self.rx_start = 0;
        }
        r
    }

    fn process_frames(&mut self, rx: &[u8]) -> Result<(), Fatal> {
        loop {
            let buf = rx.get(self.rx_start..).unwrap_or_default();
            let ready = self.ready;
            let frame = match pdu::deframe(buf, self.rx_framing, |t| match (ready, t) {
                (false, PduType::IC_RESP) => Some(0),
                (true, PduType::CAPSULE_RESP | PduType::R2T) => Some(0),
                (true, PduType::C2H_DATA) => Some(MAX_C2H_DATA),
                (_, PduType::C2H_TERM_REQ) => Some(pdu::TERM_REQ_MAX_DATA as u32),
                _ => None,
            }) {
                None => return Ok(()),
                Some(Err(e)) => {
                    self.terminated = true;
                    return Err(e);
                }
                Some(Ok(f)) => f,
            };
            let header = frame.header;
            self.rx_start = self.rx_start.saturating_add(frame.len);
            match frame.pdu_type {
                PduType::IC_RESP => self.on_ic_resp(header)?,
                PduType::CAPSULE_RESP => {
                    if let Ok(r) = CapsuleResp::read_from_bytes(header) {
                        self.complete(r.cqe, offset::RESP_CID)?;
                    }
                }
                PduType::C2H_DATA => self.on_c2h_data(header, frame.data, frame.data_digest_ok, frame.ch.flags)?,
                PduType::R2T => self.on_r2t(header)?,
                PduType::C2H_TERM_REQ => {
                    self.terminated = true;
                    let t = TermReq::read_from_bytes(header).ok();
                    return Err(Fatal::new(
                        Fes(t.map(|t| t.fes.get()).unwrap_or(0)),
                        t.map(|t| t.fei.get()).unwrap_or(0),
                        "controller sent C2HTermReq",
                    ));
                }
                _ => {}
            }
        }
    }

    fn on_ic_resp(&mut self, header: &[u8]) -> Result<(), Fatal> {
        let resp = IcResp::read_from_bytes(header)
            .map_err(|_| Fatal::new(Fes::INVALID_HEADER_FIELD, offset::HLEN, "ICResp truncated"))?;
        if resp.pfv.get() != 0 {
            return Err(Fatal::new(Fes::UNSUPPORTED_PARAMETER, offset::PFV, format!("ICResp pfv {}", resp.pfv.get())));
        }
        let hdgst = resp.dgst & dgst::HEADER != 0;
        let ddgst = resp.dgst & dgst::DATA != 0;
        self.rx_framing = Framing { hdgst, ddgst, data_align: 4 };
        self.tx_framing = Framing { hdgst, ddgst, data_align: pdu::pda_bytes(resp.cpda) };
        self.max_h2c_data = resp.maxh2cdata.get().max(4096);
        self.ready = true;
        Ok(())
    }

    /// Completes the command `cqe` names. A CID not in flight ends the
    /// connection, as in the Linux host, with FEI `cid_at` (where the PDU
    /// holds the CID): queued, such completions would pile up for as long
    /// as the controller sent them.
    fn complete(&mut self, mut cqe: Cqe, cid_at: u32) -> Result<(), Fatal> {
        let cid = cqe.cid.get();
        let Some(p) = self.pending.remove(&cid) else {
            return Err(Fatal::new(
                Fes::INVALID_HEADER_FIELD,
                cid_at,
                format!("completion for cid {cid}, which is not in flight"),
            ));
        };
        self.recycle(p.write_data);
        if cqe.status().is_success() {
            // Data that failed its digest is not the command's data,
            // whatever status the controller gives; nor is a buffer the
            // controller did not fill (a read may end early, but with an
            // error status).
            if p.digest_failed {
                cqe.set_status(Status::TRANSIENT_TRANSPORT_ERROR);
            } else if p.read_data.len() < p.read_len {
                cqe.set_status(Status::DATA_TRANSFER_ERROR);
            }
        }
        self.completions.push_back(Completion { cqe, data: p.read_data });
        Ok(())
    }

    fn on_c2h_data(&mut self, header: &[u8], data: &[u8], data_ok: bool, ch_flags: u8) -> Result<(), Fatal> {
        let h = DataHeader::read_from_bytes(header)
            .map_err(|_| Fatal::new(Fes::INVALID_HEADER_FIELD, offset::HLEN, "C2HData truncated"))?;
        let cid = h.cccid.get();
        let Some(p) = self.pending.get_mut(&cid) else {
            return Err(Fatal::new(Fes::INVALID_HEADER_FIELD, offset::CCCID, format!("C2HData for unknown cid {cid}")));
        };
        // SUCCESS completes the command: NVMe/TCP allows it on the last
        // PDU of its data only, and the Linux host refuses it elsewhere.
        if ch_flags & flags::SUCCESS != 0 && ch_flags & flags::LAST_PDU == 0 {
            return Err(Fatal::new(
                Fes::INVALID_HEADER_FIELD,
                offset::FLAGS,
                format!("C2HData for cid {cid} has SUCCESS without LAST_PDU"),
            ));
        }
        if h.datao.get() as usize != p.read_data.len() {
            return Err(Fatal::new(
                Fes::DATA_OUT_OF_RANGE,
                offset::DATAO,
                format!("C2HData datao {} (expected {})", h.datao.get(), p.read_data.len()),
            ));
        }
        if p.read_data.len().saturating_add(data.len()) > p.read_len {
            return Err(Fatal::new(
                Fes::DATA_OUT_OF_RANGE,
                offset::DATAL,
                format!("C2HData for cid {cid} goes beyond its {} bytes", p.read_len),
            ));
        }
        p.read_data.extend_from_slice(data);
        // Remembered until the completion, which it fails.
        p.digest_failed |= !data_ok;
        if ch_flags & flags::SUCCESS != 0 {
            self.complete(Cqe::new(cid, Status::SUCCESS, 0), offset::CCCID)?;
        }
        Ok(())
    }

    fn on_r2t(&mut self, header: &[u8]) -> Result<(), Fatal> {
        let r = R2t::read_from_bytes(header)
            .map_err(|_| Fatal::new(Fes::INVALID_HEADER_FIELD, offset::HLEN, "R2T truncated"))?;
        let cid = r.cccid.get();
        let Some(p) = self.pending.get_mut(&cid) else {
            return Err(Fatal::new(Fes::INVALID_HEADER_FIELD, offset::CCCID, format!("R2T for unknown cid {cid}")));
        };
        let start = r.r2to.get() as usize;
        let end = start.saturating_add(r.r2tl.get() as usize);
        // Each R2T's data is queued whole as it arrives: one asking again
        // for bytes already asked for (the Linux host refuses it too) would
        // queue them once more, as often as the controller repeats it.
        if start < p.requested {
            return Err(Fatal::new(
                Fes::DATA_OUT_OF_RANGE,
                offset::DATAO,
                format!("R2T offset {start} for cid {cid} (its R2Ts asked for data up to {} already)", p.requested),
            ));
        }
        let Some(data) = p.write_data.get(start..end) else {
            return Err(Fatal::new(
                Fes::DATA_OUT_OF_RANGE,
                offset::DATAO,
                format!("R2T {start}..{end} beyond {} bytes", p.write_data.len()),
            ));
        };
        p.requested = end;
        let chunk_max = self.max_h2c_data as usize;
        let mut off = start;
        let mut out = Vec::new();
        for chunk in data.chunks(chunk_max) {
            let last = off.saturating_add(chunk.len()) == end;
            let h = DataHeader {
                ch: pdu::common_header(PduType::H2C_DATA, if last { flags::LAST_PDU } else { 0 }),
                cccid: cid.into(),
                ttag: r.ttag,
                datao: u32::try_from(off).unwrap_or(u32::MAX).into(),
                datal: u32::try_from(chunk.len()).unwrap_or(u32::MAX).into(),
                rsvd: [0; 4],
            };
            pdu::encode(&mut out, h.as_bytes(), chunk, self.tx_framing);
            off = off.saturating_add(chunk.len());
        }
        self.tx.append(&mut out);
        Ok(())
    }

    /// The next completion, if any.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    /// Whether bytes wait to be sent.
    pub fn has_transmit(&self) -> bool {
        !self.tx.is_empty()
    }

    /// Moves every byte waiting to be sent to the end of `out`.
    pub fn take_transmit(&mut self, out: &mut Vec<u8>) {
        out.append(&mut self.tx);
    }

    /// Appends raw bytes to the transmit buffer (tests use this to send
    /// malformed PDUs).
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.tx.extend_from_slice(bytes);
    }

    /// The framing the host sends with (for tests building raw PDUs).
    pub fn tx_framing(&self) -> Framing {
        self.tx_framing
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::{Event, TargetConfig, TargetConnection};
    use nvme_spec::Status;

    fn data(cid: u16, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as u16).wrapping_mul(31).wrapping_add(cid) as u8).collect()
    }

    /// A host and a target with data digests on, past ICReq/ICResp.
    fn data_digest_pair() -> (HostConnection, TargetConnection<Vec<u8>>) {
        let mut h = HostConnection::new(HostConfig { header_digest: false, data_digest: true, max_in_capsule: 8192 });
        let mut t = TargetConnection::<Vec<u8>>::new(TargetConfig::default());
        let mut wire = Vec::new();
        h.take_transmit(&mut wire);
        t.handle_input(&wire).expect("ICReq");
        wire.clear();
        t.take_transmit(&mut wire);
        h.handle_input(&wire).expect("ICResp");
        (h, t)
    }

    #[test]
    fn a_read_whose_data_digest_failed_never_completes_with_success() {
        let (mut h, mut t) = data_digest_pair();
        let mut wire = Vec::new();
        // SQ flow control on: the data's C2HData carries no SUCCESS flag,
        // a response capsule with SUCCESS follows it.
        t.set_queue(1, 63, false);
        let mut sqe = Sqe { opcode: 0x02, ..Default::default() };
        sqe.cid = 7.into();
        sqe.nsid = 1.into();
        h.submit(sqe, Vec::new(), 4096);
        wire.clear();
        h.take_transmit(&mut wire);
        t.handle_input(&wire).expect("capsule");
        while t.poll_event().is_some() {}
        let sent = data(7, 4096);
        t.send_data(7, &sent, Cqe::new(7, Status::SUCCESS, 0));
        wire.clear();
        t.take_transmit(&mut wire);
        // One bit of the data flipped on the way: the digest no longer
        // matches.
        let head = sent.get(..64).expect("64 bytes");
        let at = wire.windows(64).position(|w| w == head).expect("data on the wire") + 100;
        *wire.get_mut(at).expect("a data byte") ^= 1;
        h.handle_input(&wire).expect("the framing stays good");
        let c = h.poll_completion().expect("completion");
        assert_eq!(c.cqe.cid.get(), 7);
        assert_eq!(c.cqe.status(), Status::TRANSIENT_TRANSPORT_ERROR, "{} bytes of data", c.data.len());
    }

    /// A read of `len` bytes submitted as `cid`, its capsule taken in by
    /// the target.
    fn submit_read(h: &mut HostConnection, t: &mut TargetConnection<Vec<u8>>, cid: u16, len: u32) {
        let mut sqe = Sqe { opcode: 0x02, ..Default::default() };
        sqe.cid = cid.into();
        sqe.nsid = 1.into();
        h.submit(sqe, Vec::new(), len);
        let mut wire = Vec::new();
        h.take_transmit(&mut wire);
        t.handle_input(&wire).expect("capsule");
        while t.poll_event().is_some() {}
    }

    /// A C2HData PDU as a broken controller may send it (data digests on).
    fn c2h(cid: u16, datao: usize, data: &[u8], ch_flags: u8) -> Vec<u8> {
        let h = DataHeader {
            ch: pdu::common_header(PduType::C2H_DATA, ch_flags),
            cccid: cid.into(),
            ttag: 0.into(),
            datao: (datao as u32).into(),
            datal: (data.len() as u32).into(),
            rsvd: [0; 4],
        };
        let mut out = Vec::new();
        pdu::encode(&mut out, h.as_bytes(), data, Framing { hdgst: false, ddgst: true, data_align: 4 });
        out
    }

    #[test]
    fn c2h_data_with_success_but_not_last_pdu_ends_the_connection() {
        let (mut h, mut t) = data_digest_pair();
        t.set_queue(1, 63, true);
        submit_read(&mut h, &mut t, 4, 4096);
        let e = h.handle_input(&c2h(4, 0, &data(4, 2048), flags::SUCCESS)).expect_err("SUCCESS mid-transfer");
        assert_eq!((e.fes, e.fei), (Fes::INVALID_HEADER_FIELD, offset::FLAGS), "{e}");
        assert!(e.reason.contains("SUCCESS without LAST_PDU"), "{}", e.reason);
        assert!(h.poll_completion().is_none(), "the read completed with half its data");
        assert!(h.is_terminated());
    }

    #[test]
    fn a_read_completed_successfully_before_all_its_data_arrived_fails() {
        let (mut h, mut t) = data_digest_pair();
        t.set_queue(1, 63, false);
        // Ended by C2HData with SUCCESS and LAST_PDU at half the data.
        submit_read(&mut h, &mut t, 5, 4096);
        h.handle_input(&c2h(5, 0, &data(5, 2048), flags::LAST_PDU | flags::SUCCESS)).expect("well framed");
        let c = h.poll_completion().expect("completion");
        assert_eq!(c.cqe.status(), Status::DATA_TRANSFER_ERROR, "{} bytes of data", c.data.len());
        // Ended by a response capsule with success after half the data.
        submit_read(&mut h, &mut t, 6, 4096);
        h.handle_input(&c2h(6, 0, &data(6, 2048), flags::LAST_PDU)).expect("well framed");
        t.send_response(Cqe::new(6, Status::SUCCESS, 0));
        let mut wire = Vec::new();
        t.take_transmit(&mut wire);
        h.handle_input(&wire).expect("the response capsule");
        let c = h.poll_completion().expect("completion");
        assert_eq!(c.cqe.status(), Status::DATA_TRANSFER_ERROR, "{} bytes of data", c.data.len());
        // A read the controller fails part way keeps its own status.
        submit_read(&mut h, &mut t, 7, 4096);
        h.handle_input(&c2h(7, 0, &data(7, 2048), flags::LAST_PDU)).expect("well framed");
        t.send_response(Cqe::new(7, Status::LBA_OUT_OF_RANGE, 0));
        wire.clear();
        t.take_transmit(&mut wire);
        h.handle_input(&wire).expect("the response capsule");
        assert_eq!(h.poll_completion().expect("completion").cqe.status(), Status::LBA_OUT_OF_RANGE);
    }

    #[test]
    fn a_response_capsule_for_a_command_not_in_flight_ends_the_connection() {
        let (mut h, mut t) = data_digest_pair();
        t.set_queue(1, 63, false);
        submit_read(&mut h, &mut t, 8, 4096);
        t.send_response(Cqe::new(9, Status::SUCCESS, 0));
        let mut wire = Vec::new();
        t.take_transmit(&mut wire);
        let e = h.handle_input(&wire).expect_err("a completion for nobody");
        assert_eq!((e.fes, e.fei), (Fes::INVALID_HEADER_FIELD, offset::RESP_CID), "{e}");
        assert!(e.reason.contains("cid 9"), "{}", e.reason);
        assert!(h.poll_completion().is_none(), "a completion for nobody was queued");
        assert!(h.is_terminated());
    }

    #[test]
    fn an_r2t_for_write_data_already_asked_for_is_refused_not_queued_again() {
        let (mut h, mut t) = data_digest_pair();
        let mut wire = Vec::new();
        t.set_queue(1, 63, false);
        const LEN: usize = 64 << 10;
        let mut sqe = Sqe { opcode: 0x01, ..Default::default() };
        sqe.cid = 3.into();
        sqe.nsid = 1.into();
        h.submit(sqe, data(3, LEN), 0);
        h.take_transmit(&mut wire);
        t.handle_input(&wire).expect("capsule");
        while t.poll_event().is_some() {}
        t.request_data(3, LEN as u32);
        wire.clear();
        t.take_transmit(&mut wire);
        let r2t = wire.clone();
        h.handle_input(&r2t).expect("the R2T");
        let mut sent = Vec::new();
        h.take_transmit(&mut sent);
        assert!(sent.len() > LEN, "the write's data answers its R2T");
        // The same R2T again, as a broken or hostile controller may send
        // it any number of times: each copy would queue the whole write
        // once more (24 bytes in, 64 KiB out).
        let e = h.handle_input(&r2t).expect_err("write data asked for twice");
        assert_eq!(e.fes, Fes::DATA_OUT_OF_RANGE);
        assert!(e.reason.contains("R2T offset 0"), "{}", e.reason);
        assert!(!h.has_transmit(), "the write's data was queued again");
    }

    #[test]
    fn a_stream_of_large_reads_keeps_the_receive_buffer_bounded_and_reuses_read_buffers() {
        let (mut h, mut t) = data_digest_pair();
        let mut wire = Vec::new();
        assert!(h.is_ready());
        t.set_queue(1, 63, false);
        const LEN: usize = 64 << 10;
        const READS: u16 = 40;
        for cid in 0..READS {
            let mut sqe = Sqe { opcode: 0x02, ..Default::default() };
            sqe.cid = cid.into();
            sqe.nsid = 1.into();
            h.submit(sqe, Vec::new(), LEN as u32);
        }
        wire.clear();
        h.take_transmit(&mut wire);
        t.handle_input(&wire).expect("capsules");
        while let Some(ev) = t.poll_event() {
            if let Event::Command { sqe, .. } = ev {
                let cid = sqe.cid.get();
                t.send_data(cid, &data(cid, LEN), Cqe::new(cid, Status::SUCCESS, 0));
            }
        }
        wire.clear();
        t.take_transmit(&mut wire);
        assert!(wire.len() > usize::from(READS) * LEN);
        // Pieces that never end on a PDU boundary: the buffer keeps at most
        // a partial PDU plus what was consumed before the last compaction.
        let mut most = 0;
        for piece in wire.chunks(100_003) {
            h.handle_input(piece).expect("C2HData");
            most = most.max(h.rx.len());
        }
        assert!(most < 4 * LEN, "receive buffer grew to {most} bytes");
        let mut done = 0;
        while let Some(c) = h.poll_completion() {
            let cid = c.cqe.cid.get();
            assert!(c.cqe.status().is_success());
            assert!(c.data == data(cid, LEN), "cid {cid}");
            h.recycle(c.data);
            done += 1;
        }
        assert_eq!(done, READS);
        // Recycled buffers come back with their capacity.
        assert!(h.buffer(16).capacity() >= LEN);
        assert_eq!(h.spare.len(), usize::from(READS) - 1);
    }
}
