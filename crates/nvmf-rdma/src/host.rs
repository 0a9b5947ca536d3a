//! The host side of one NVMe/RDMA queue over iWARP: what the Linux
//! nvme-rdma host does on top of its RNIC, for `crates/initiator` and the
//! benchmark.
//!
//! The MPA request carries the CM private data (queue ID and sizes,
//! [`crate::cm`]); one receive per queue entry is posted for completions.
//! Each command goes out as one Send. Write data rides in the capsule when
//! it fits (I/O queues only, up to the controller's IOCCSZ), otherwise it
//! is registered for remote reads and the controller fetches it with RDMA
//! Reads, which the connection answers. Read data buffers are registered
//! for remote writes: the controller's RDMA Writes land in them directly.
//! Keyed descriptors ask for invalidation, as the Linux host's do, and a
//! completion's Send with Invalidate must name the command's own key.

use crate::cm::{CmReject, CmReply, CmRequest};
use crate::sgl;
use iwarp::error::{ErrorCode, Fatal};
use iwarp::{Access, Connection, Event, Received};
use nvme_spec::{Cqe, Sgl, Sqe, Status};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use zerocopy::{FromBytes, IntoBytes};

/// Bytes of an NVMe completion.
const CQE_LEN: usize = 16;

/// Most bytes one keyed SGL descriptor describes (its length is 24 bits).
pub const MAX_KEYED_LEN: u32 = 0x00ff_ffff;

/// Most spare buffers a connection keeps.
const MAX_SPARE: usize = 256;

/// What the host asks for.
#[derive(Clone, Copy, Debug)]
pub struct HostConfig {
    /// Ask for CRC32C on FPDUs (used anyway when the controller asks).
    pub crc: bool,
    /// The queue this connection becomes (0: admin).
    pub qid: u16,
    /// Submission queue entries (HSQSIZE + 1); as many receives are posted
    /// for completions.
    pub entries: u16,
    /// Largest write sent in the capsule (the controller's IOCCSZ minus the
    /// SQE); ignored on the admin queue, which carries no in-capsule data.
    pub max_in_capsule: u32,
    /// RDMA Reads of the controller served at once (the IRD offered).
    pub ird: u16,
    /// Most payload bytes per FPDU sent: at most what the connection's TCP
    /// MSS carries ([`iwarp::wire::segment_cap`]).
    pub max_segment: usize,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig { crc: true, qid: 0, entries: 32, max_in_capsule: 0, ird: 128, max_segment: 61440 }
    }
}

/// Why the connection ended.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The controller refused the connection request (CM reject status,
    /// NVMe-oF RDMA binding).
    #[error("the controller rejected the connection (CM status {sts:#x})")]
    Rejected {
        /// The reject's status.
        sts: u16,
    },
    /// The controller sent an iWARP Terminate.
    #[error("the controller terminated the connection: {0}")]
    Terminated(ErrorCode),
    /// The controller broke iWARP or NVMe/RDMA; a Terminate is queued.
    #[error("{0}")]
    Fatal(#[from] Fatal),
}

/// A command in flight.
struct Pending {
    /// The key of its registered data buffer.
    stag: Option<u32>,
    /// Whether that buffer receives read data.
    reading: bool,
}

/// Host side of one NVMe/RDMA queue.
pub struct HostConnection {
    cfg: HostConfig,
    conn: Connection<Vec<u8>>,
    ready: bool,
    closed: bool,
    crqsize: u16,
    pending: FxHashMap<u16, Pending>,
    completions: VecDeque<(Cqe, Vec<u8>)>,
    spare: Vec<Vec<u8>>,
}

impl HostConnection {
    /// A connection that has queued its MPA request.
    pub fn new(cfg: HostConfig) -> Self {
        let entries = cfg.entries.max(2);
        let req = CmRequest {
            recfmt: 0.into(),
            qid: cfg.qid.into(),
            hrqsize: entries.into(),
            hsqsize: entries.saturating_sub(1).into(),
            rsvd: [0; 24],
        };
        let icfg = iwarp::Config {
            crc: cfg.crc,
            ird: cfg.ird,
            // The host never reads from the controller.
            ord: 0,
            require_reads: false,
            recv_head: CQE_LEN,
            recv_max: CQE_LEN,
            max_segment: cfg.max_segment,
        };
        let mut conn = Connection::initiator(icfg, req.as_bytes());
        conn.post_receives(u32::from(entries));
        HostConnection {
            cfg: HostConfig { entries, ..cfg },
            conn,
            ready: false,
            closed: false,
            crqsize: 0,
            pending: FxHashMap::default(),
            completions: VecDeque::new(),
            spare: Vec::new(),
        }
    }

    /// Whether the controller accepted the connection.
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// Whether the connection is over (rejected, terminated, or broken).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Whether FPDUs carry CRC32C (known once accepted).
    pub fn crc(&self) -> bool {
        self.conn.crc()
    }

    /// The completion queue size the controller accepted (CRQSIZE).
    pub fn crqsize(&self) -> u16 {
        self.crqsize
    }

    /// Commands submitted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.pending.len()
    }

    /// Submits a command: `write` is its data to the controller, `read_len`
    /// the bytes it expects back (at most [`MAX_KEYED_LEN`] either way).
    /// The SGL is filled in here.
    pub fn submit(&mut self, mut sqe: Sqe, write: Vec<u8>, read_len: u32) {
        let cid = sqe.cid.get();
        // Each command's buffer sits at its own place in the host's "address
        // space"; the key is what the controller must get right.
        let base = (u64::from(cid) + 1) << 32;
        let len = u32::try_from(write.len()).unwrap_or(u32::MAX);
        let in_capsule = self.cfg.qid != 0 && !write.is_empty() && len <= self.cfg.max_in_capsule;
        let pending = if in_capsule {
            sqe.set_sgl(Sgl::in_capsule(len));
            self.conn.send(sqe.as_bytes(), &write, None);
            self.recycle(write);
            Pending { stag: None, reading: false }
        } else if !write.is_empty() {
            let stag = self.conn.register(write, base, Access::RemoteRead);
            sqe.set_sgl(sgl::keyed(base, len, stag, true));
            self.conn.send(sqe.as_bytes(), &[], None);
            Pending { stag: Some(stag), reading: false }
        } else if read_len > 0 {
            let buf = self.read_buffer(read_len as usize);
            let stag = self.conn.register(buf, base, Access::RemoteWrite);
            sqe.set_sgl(sgl::keyed(base, read_len, stag, true));
            self.conn.send(sqe.as_bytes(), &[], None);
            Pending { stag: Some(stag), reading: true }
        } else {
            sqe.set_sgl(sgl::keyed(0, 0, 0, false));
            self.conn.send(sqe.as_bytes(), &[], None);
            Pending { stag: None, reading: false }
        };
        self.pending.insert(cid, pending);
    }

    /// A buffer of `len` bytes for read data: a spare one of that length
    /// as it is (its old bytes are overwritten), else zeroed.
    fn read_buffer(&mut self, len: usize) -> Vec<u8> {
        let mut b = self.spare.pop().unwrap_or_default();
        if b.len() != len {
            b.clear();
            b.resize(len, 0);
        }
        b
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

    /// Feeds received bytes. An error ends the connection; later input is
    /// ignored.
    pub fn handle_input(&mut self, bytes: &[u8]) -> Result<(), HostError> {
        if self.closed {
            return Ok(());
        }
        let r = self.conn.handle_input(bytes).map_err(HostError::from).and_then(|()| self.drain());
        if r.is_err() {
            self.closed = true;
        }
        r
    }

    fn drain(&mut self) -> Result<(), HostError> {
        loop {
            // A completion is read in place; only its 16 bytes move.
            let completion = match self.conn.peek_event() {
                None => return Ok(()),
                Some(Event::Send(m)) => Some(Completion::of(m)),
                Some(_) => None,
            };
            let Some(ev) = self.conn.poll_event() else { return Ok(()) };
            if let Some(c) = completion {
                self.on_completion(c)?;
                continue;
            }
            match ev {
                Event::Established { private_data } => {
                    let Ok((rep, _)) = CmReply::read_from_prefix(&private_data) else {
                        return Err(
                            self.abort(format!("CM accept private data of {} bytes (expected 32)", private_data.len()))
                        );
                    };
                    if rep.recfmt.get() != 0 {
                        return Err(self.abort(format!("CM accept RECFMT {} (expected 0)", rep.recfmt.get())));
                    }
                    self.crqsize = rep.crqsize.get();
                    self.ready = true;
                }
                Event::Rejected { private_data } => {
                    let sts = CmReject::read_from_prefix(&private_data).map_or(0, |(r, _)| r.sts.get());
                    return Err(HostError::Rejected { sts });
                }
                Event::Terminated(code) => return Err(HostError::Terminated(code)),
                // The host issues no RDMA Reads, and it is the initiator
                // (Sends were taken above).
                Event::Send(_) | Event::ReadDone { .. } | Event::ConnectRequest { .. } => {}
            }
        }
    }

    /// Ends the connection with a Terminate for a fault of the controller's
    /// above DDP.
    fn abort(&mut self, reason: String) -> HostError {
        HostError::Fatal(self.conn.abort(Fatal::new(ErrorCode::RDMAP_LOCAL_CATASTROPHIC, reason)))
    }

    fn on_completion(&mut self, m: Completion) -> Result<(), HostError> {
        let Some(cqe) = m.cqe else {
            return Err(self.abort(format!("completion of {} bytes (expected {CQE_LEN})", m.len)));
        };
        let cid = cqe.cid.get();
        let Some(p) = self.pending.remove(&cid) else {
            return Err(self.abort(format!("completion for CID {cid}, which is not in flight")));
        };
        if let Some(inv) = m.invalidated {
            if p.stag != Some(inv) {
                return Err(self.abort(format!(
                    "completion of CID {cid} invalidates STag {inv:#x} (the command's is {})",
                    p.stag.map_or("none".into(), |s| format!("{s:#x}"))
                )));
            }
        }
        // A read buffer is reused without being cleared: a read the
        // controller completed without writing all of it would hand back
        // an earlier command's bytes as this one's.
        let covered = p.stag.and_then(|s| self.conn.covered(s)).unwrap_or(0);
        let buf = p.stag.and_then(|s| self.conn.deregister(s));
        let mut cqe = cqe;
        if p.reading && buf.as_ref().is_some_and(|b| covered < b.len()) && cqe.status().is_success() {
            cqe.set_status(Status::DATA_TRANSFER_ERROR);
        }
        let data = match buf {
            Some(b) if p.reading => b,
            Some(b) => {
                self.recycle(b);
                Vec::new()
            }
            None => Vec::new(),
        };
        self.conn.post_receives(1);
        self.completions.push_back((cqe, data));
        Ok(())
    }

    /// The next completion with its read data, if any.
    pub fn poll_completion(&mut self) -> Option<(Cqe, Vec<u8>)> {
        self.completions.pop_front()
    }

    /// Whether bytes wait to be sent.
    pub fn has_transmit(&self) -> bool {
        self.conn.transmit_len() > 0
    }

    /// Moves every byte waiting to be sent to the end of `out`.
    pub fn take_transmit(&mut self, out: &mut Vec<u8>) {
        self.conn.take_transmit(out);
    }
}

/// What a completion's Send carried.
struct Completion {
    /// The CQE, when the message's head is exactly one.
    cqe: Option<Cqe>,
    /// Bytes of the head.
    len: usize,
    /// The STag it invalidated.
    invalidated: Option<u32>,
}

impl Completion {
    fn of(m: &Received<Vec<u8>>) -> Self {
        let cqe = (m.head_len == CQE_LEN).then(|| Cqe::read_from_prefix(&m.head).ok().map(|(c, _)| c)).flatten();
        Completion { cqe, len: m.head_len, invalidated: m.invalidated }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;
    use crate::target::{Event as TEvent, TargetConfig, TargetQueue};

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect()
    }

    /// Moves bytes both ways until neither end has anything to send.
    fn pump(h: &mut HostConnection, t: &mut TargetQueue<Vec<u8>>) {
        loop {
            let mut wire = Vec::new();
            h.take_transmit(&mut wire);
            if !wire.is_empty() {
                t.handle_input(&wire).unwrap();
            }
            let mut back = Vec::new();
            t.take_transmit(&mut back);
            if !back.is_empty() {
                h.handle_input(&back).unwrap();
            }
            if wire.is_empty() && back.is_empty() {
                return;
            }
        }
    }

    fn pair(crc: bool, qid: u16) -> (HostConnection, TargetQueue<Vec<u8>>) {
        let mut h = HostConnection::new(HostConfig {
            crc,
            qid,
            entries: 16,
            max_in_capsule: 4096,
            ird: 16,
            max_segment: 61440,
        });
        let mut t = TargetQueue::new(TargetConfig { crc: false, ..TargetConfig::default() });
        pump(&mut h, &mut t);
        assert!(h.is_ready());
        assert_eq!(h.crqsize(), 16);
        assert_eq!(h.crc(), crc);
        match t.poll_event() {
            Some(TEvent::Accepted { qid: q, entries: 16, crc: c, .. }) => assert_eq!((q, c), (qid, crc)),
            other => panic!("{other:?}"),
        }
        (h, t)
    }

    fn cmd(opcode: u8, cid: u16) -> Sqe {
        let mut sqe = Sqe { opcode, ..Default::default() };
        sqe.cid = cid.into();
        sqe
    }

    #[test]
    fn reads_land_in_the_registered_buffer_and_writes_are_fetched_or_sent_in_capsule() {
        for crc in [true, false] {
            let (mut h, mut t) = pair(crc, 1);
            // A read: the target writes into the keyed buffer, then
            // completes with Invalidate.
            h.submit(cmd(0x02, 1), Vec::new(), 8192);
            // A large write: fetched with an RDMA Read of the keyed buffer.
            h.submit(cmd(0x01, 2), pattern(2, 16384), 0);
            // A small write: in the capsule.
            h.submit(cmd(0x01, 3), pattern(3, 512), 0);
            pump(&mut h, &mut t);
            let mut seen = 0;
            while let Some(ev) = t.poll_event() {
                let TEvent::Command { sqe, data } = ev else { panic!("{ev:?}") };
                let cid = sqe.cid.get();
                // PSDT 01b: the Linux target refuses anything else.
                assert_eq!(sqe.flags & Sqe::PSDT_MASK, Sqe::PSDT_SGL, "PSDT of cid {cid}");
                match cid {
                    1 => {
                        assert_eq!(t.check_sgl(&sqe, None), Ok(8192));
                        t.send_data(1, &pattern(1, 8192), Cqe::new(1, Status::SUCCESS, 0));
                    }
                    2 => {
                        assert!(data.is_none());
                        t.request_data(2, 16384);
                    }
                    3 => {
                        assert_eq!(data.unwrap(), pattern(3, 512));
                        t.send_response(Cqe::new(3, Status::SUCCESS, 0));
                    }
                    _ => panic!("cid {cid}"),
                }
                seen += 1;
            }
            assert_eq!(seen, 3);
            pump(&mut h, &mut t);
            match t.poll_event() {
                Some(TEvent::Data { cid: 2, data }) => assert_eq!(data, pattern(2, 16384)),
                other => panic!("{other:?}"),
            }
            t.send_response(Cqe::new(2, Status::SUCCESS, 0));
            pump(&mut h, &mut t);
            let mut done = FxHashMap::default();
            while let Some((cqe, data)) = h.poll_completion() {
                assert!(cqe.status().is_success());
                done.insert(cqe.cid.get(), data);
            }
            assert_eq!(done.len(), 3);
            assert_eq!(done[&1], pattern(1, 8192));
            assert!(done[&2].is_empty() && done[&3].is_empty());
            assert_eq!(h.outstanding(), 0);
        }
    }

    #[test]
    fn a_read_completed_without_all_its_data_written_is_a_data_transfer_error() {
        let (mut h, mut t) = pair(true, 1);
        // A first read fills a buffer that the host keeps for reuse.
        h.submit(cmd(0x02, 1), Vec::new(), 4096);
        pump(&mut h, &mut t);
        while t.poll_event().is_some() {}
        t.send_data(1, &pattern(1, 4096), Cqe::new(1, Status::SUCCESS, 0));
        pump(&mut h, &mut t);
        let (cqe, data) = h.poll_completion().unwrap();
        assert!(cqe.status().is_success());
        h.recycle(data);
        // Then a controller completes a read of the same length having
        // written only half of it, then one having written nothing: the
        // reused buffer still holds the first read's bytes.
        h.submit(cmd(0x02, 2), Vec::new(), 4096);
        h.submit(cmd(0x02, 3), Vec::new(), 4096);
        pump(&mut h, &mut t);
        while t.poll_event().is_some() {}
        t.send_data(2, &pattern(2, 2048), Cqe::new(2, Status::SUCCESS, 0));
        t.send_response(Cqe::new(3, Status::SUCCESS, 0));
        pump(&mut h, &mut t);
        for cid in [2, 3] {
            let (cqe, _) = h.poll_completion().unwrap();
            assert_eq!(cqe.cid.get(), cid);
            assert_eq!(cqe.status(), Status::DATA_TRANSFER_ERROR, "cid {cid}");
        }
        assert_eq!(h.outstanding(), 0);
    }

    #[test]
    fn in_capsule_data_lying_whole_in_a_lent_input_is_lent_then_kept_or_withdrawn() {
        for crc in [true, false] {
            let (mut h, mut t) = pair(crc, 1);
            for cid in 1..=3u16 {
                h.submit(cmd(0x01, cid), pattern(cid as u8, 4096), 0);
            }
            let mut wire = Vec::new();
            h.take_transmit(&mut wire);
            t.handle_input_lent(&wire).unwrap();
            // The first is polled while the input is there: its data is a
            // range of it, not a copy.
            match t.poll_event() {
                Some(TEvent::CommandInInput { sqe, data }) => {
                    assert_eq!(sqe.cid.get(), 1);
                    assert_eq!(wire[data], pattern(1, 4096), "crc {crc}");
                }
                other => panic!("{other:?}"),
            }
            // The second is withdrawn, keeping its place in line (a fused
            // Compare before it would wait for it); the third outlives
            // the input.
            assert!(t.withdraw_command(2));
            t.keep_input(&wire);
            drop(wire);
            match t.poll_event() {
                Some(TEvent::Withdrawn { sqe }) => assert_eq!(sqe.cid.get(), 2),
                other => panic!("{other:?}"),
            }
            match t.poll_event() {
                Some(TEvent::Command { sqe, data: Some(d) }) => {
                    assert_eq!(sqe.cid.get(), 3);
                    assert_eq!(d, pattern(3, 4096), "crc {crc}");
                }
                other => panic!("{other:?}"),
            }
            assert!(t.poll_event().is_none());
        }
    }

    #[test]
    fn the_admin_queue_sends_write_data_by_key_never_in_the_capsule() {
        let (mut h, mut t) = pair(true, 0);
        h.submit(cmd(0x7f, 0), pattern(9, 1024), 0);
        pump(&mut h, &mut t);
        let Some(TEvent::Command { sqe, data: None }) = t.poll_event() else { panic!() };
        assert_eq!(t.check_sgl(&sqe, None), Ok(1024));
        assert_eq!(sqe.flags, Sqe::PSDT_SGL, "a Fabrics command carries PSDT 01b too");
        t.request_data(0, 1024);
        pump(&mut h, &mut t);
        assert!(matches!(t.poll_event(), Some(TEvent::Data { cid: 0, data }) if data == pattern(9, 1024)));
    }

    #[test]
    fn a_completion_for_a_command_not_in_flight_ends_the_connection_with_a_terminate() {
        let (mut h, mut t) = pair(false, 1);
        // The target answers a CID the host never sent.
        t.send_response(Cqe::new(77, Status::SUCCESS, 0));
        let mut back = Vec::new();
        t.take_transmit(&mut back);
        let e = h.handle_input(&back).unwrap_err();
        assert!(e.to_string().contains("CID 77"), "{e}");
        assert!(h.is_closed());
        // The Terminate goes to the target.
        let mut wire = Vec::new();
        h.take_transmit(&mut wire);
        t.handle_input(&wire).unwrap();
        assert!(matches!(t.poll_event(), Some(TEvent::HostTerminated(_))));
    }

    #[test]
    fn write_data_fetched_beyond_the_read_budget_waits_without_a_buffer() {
        let mut h = HostConnection::new(HostConfig { qid: 1, entries: 16, ..HostConfig::default() });
        let mut t = TargetQueue::new(TargetConfig { crc: false, read_buffer: 48 << 10, ..TargetConfig::default() });
        pump(&mut h, &mut t);
        assert!(matches!(t.poll_event(), Some(TEvent::Accepted { .. })));
        for cid in 1..=8u16 {
            h.submit(cmd(0x01, cid), pattern(cid as u8, 32 << 10), 0);
        }
        pump(&mut h, &mut t);
        let mut cids = Vec::new();
        while let Some(ev) = t.poll_event() {
            let TEvent::Command { sqe, data: None } = ev else { panic!("{ev:?}") };
            cids.push(sqe.cid.get());
        }
        // The host never answers in this first step: eight reads are
        // wanted, one is in flight (two would pass 48 KiB).
        for &cid in &cids {
            t.request_data(cid, 32 << 10);
        }
        assert_eq!(t.read_bytes(), 32 << 10);
        // A read still waiting is given up; one the host may be serving
        // is not (its command is then not aborted).
        assert!(t.cancel_data(8));
        assert!(!t.cancel_data(1), "the read in flight is not recalled");
        pump(&mut h, &mut t);
        let mut got = Vec::new();
        loop {
            assert!(t.read_bytes() <= 32 << 10, "{} bytes held", t.read_bytes());
            let Some(ev) = t.poll_event() else { break };
            let TEvent::Data { cid, data } = ev else { panic!("{ev:?}") };
            assert_eq!(data, pattern(cid as u8, 32 << 10), "cid {cid}");
            got.push(cid);
            t.send_response(Cqe::new(cid, Status::SUCCESS, 0));
            pump(&mut h, &mut t);
        }
        assert_eq!(got, [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(t.read_bytes(), 0);
    }

    #[test]
    fn a_cid_reused_while_in_flight_is_refused_and_the_first_keeps_its_buffer() {
        let (mut h, mut t) = pair(false, 1);
        h.submit(cmd(0x02, 5), Vec::new(), 4096);
        pump(&mut h, &mut t);
        let Some(TEvent::Command { sqe, .. }) = t.poll_event() else { panic!("the read") };
        assert_eq!(sqe.cid.get(), 5);
        let Ok(sgl::DataPtr::Keyed(first)) = sgl::parse(&sqe, 0, 1 << 20) else { panic!("a keyed read") };
        // The same CID again, with another buffer, while the read runs:
        // sent by hand, as the host side would never do it.
        let mut again = cmd(0x02, 5);
        again.set_sgl(sgl::keyed(0x9000, 4096, 0x77, true));
        h.conn.send(again.as_bytes(), &[], None);
        let mut wire = Vec::new();
        h.conn.take_transmit(&mut wire);
        t.handle_input(&wire).unwrap();
        assert!(matches!(t.poll_event(), Some(TEvent::CidConflict { cid: 5 })));
        assert!(t.poll_event().is_none(), "the second command never runs");
        let mut back = Vec::new();
        t.take_transmit(&mut back);
        assert!(!back.windows(4).any(|w| w == 0x77u32.to_be_bytes()), "no Invalidate of the second key");
        // The host hears of the conflict (for the CID it has in flight).
        h.handle_input(&back).unwrap();
        let (cqe, _) = h.poll_completion().expect("the conflict's completion");
        assert_eq!((cqe.cid.get(), cqe.status()), (5, Status::CID_CONFLICT.dnr()));
        // The first read's data goes to the first buffer: an RDMA Write
        // (MPA length, control, then the STag) to its key, with Invalidate
        // of that key in the completion.
        t.send_data(5, &pattern(5, 4096), Cqe::new(5, Status::SUCCESS, 0));
        let mut out = Vec::new();
        t.take_transmit(&mut out);
        assert_eq!(&out[4..8], &first.key.to_be_bytes(), "STag of the RDMA Write");
    }

    #[test]
    fn an_in_capsule_command_reusing_a_running_cid_leaves_that_commands_key() {
        let mut h =
            HostConnection::new(HostConfig { qid: 1, entries: 16, max_in_capsule: 4096, ..HostConfig::default() });
        let mut t = TargetQueue::new(TargetConfig { crc: false, read_buffer: 16 << 10, ..TargetConfig::default() });
        pump(&mut h, &mut t);
        assert!(matches!(t.poll_event(), Some(TEvent::Accepted { .. })));
        // Two keyed writes: the second's RDMA Read waits for the budget.
        h.submit(cmd(0x01, 1), pattern(1, 16 << 10), 0);
        h.submit(cmd(0x01, 5), pattern(5, 16 << 10), 0);
        pump(&mut h, &mut t);
        for cid in [1u16, 5] {
            let Some(TEvent::Command { sqe, data: None }) = t.poll_event() else { panic!("keyed write") };
            assert_eq!(sqe.cid.get(), cid);
            t.request_data(cid, 16 << 10);
        }
        assert_eq!(t.read_bytes(), 16 << 10, "only cid 1's read is issued");
        // The host (wrongly) reuses cid 5 for a small in-capsule write.
        let mut again = cmd(0x01, 5);
        again.set_sgl(Sgl::in_capsule(512));
        h.conn.send(again.as_bytes(), &[0u8; 512], None);
        let mut wire = Vec::new();
        h.conn.take_transmit(&mut wire);
        t.handle_input(&wire).unwrap();
        // The queue answers it Command ID Conflict itself (cid 5 is in
        // flight): it never reaches the core.
        assert!(matches!(t.poll_event(), Some(TEvent::CidConflict { cid: 5 })));
        assert!(t.poll_event().is_none());
        // One round each way: the host serves cid 1's read (and takes the
        // conflict's answer for its cid 5), and cid 1's data arriving makes
        // room for the first cid 5's read, which goes out with its own key.
        // (Not delivered: this host already let go of its cid 5 buffer.)
        let mut back = Vec::new();
        t.take_transmit(&mut back);
        h.handle_input(&back).unwrap();
        let mut wire = Vec::new();
        h.take_transmit(&mut wire);
        t.handle_input(&wire).unwrap();
        let Some(TEvent::Data { cid: 1, .. }) = t.poll_event() else { panic!("cid 1's data") };
        assert_eq!(
            t.read_bytes(),
            16 << 10,
            "the first cid 5's read was dropped (its key went with the conflict's answer): it would hang"
        );
    }

    #[test]
    fn a_zero_length_keyed_descriptor_asking_for_invalidation_invalidates_nothing() {
        let (mut h, mut t) = pair(false, 1);
        // A Flush whose empty keyed descriptor asks for invalidation of a
        // key it registered nothing under (sent by hand: this host gives
        // such commands key 0 without invalidation, as Linux does).
        let mut flush = cmd(0x00, 6);
        flush.set_sgl(sgl::keyed(0, 0, 0x1234_5600, true));
        h.conn.send(flush.as_bytes(), &[], None);
        h.pending.insert(6, Pending { stag: None, reading: false });
        let mut wire = Vec::new();
        h.conn.take_transmit(&mut wire);
        t.handle_input(&wire).unwrap();
        let Some(TEvent::Command { sqe, data: None }) = t.poll_event() else { panic!("the flush") };
        assert_eq!(t.check_sgl(&sqe, None), Ok(0));
        t.send_response(Cqe::new(6, Status::SUCCESS, 0));
        // A plain Send: an RNIC refuses to invalidate a key of nothing
        // (Terminate, the queue lost); nvmet invalidates no key either.
        let mut back = Vec::new();
        t.take_transmit(&mut back);
        assert_eq!(&back[2..4], &[0x41, 0x43], "Send, not Send with Invalidate");
        h.handle_input(&back).unwrap();
        let (cqe, _) = h.poll_completion().expect("the flush's completion");
        assert_eq!((cqe.cid.get(), cqe.status()), (6, Status::SUCCESS));
    }

    #[test]
    fn data_with_no_keyed_buffer_to_go_to_fails_its_command() {
        let (mut h, mut t) = pair(false, 1);
        // A small write: its data came in the capsule, so the host gave
        // no key. A driver answering it with data must not report success.
        h.submit(cmd(0x01, 3), pattern(3, 512), 0);
        h.submit(cmd(0x01, 4), pattern(4, 512), 0);
        pump(&mut h, &mut t);
        let mut n = 0;
        while let Some(ev) = t.poll_event() {
            assert!(matches!(ev, TEvent::Command { .. }), "{ev:?}");
            n += 1;
        }
        assert_eq!(n, 2);
        t.send_data(3, &pattern(9, 512), Cqe::new(3, Status::SUCCESS, 0));
        t.send_data_from(4, pattern(9, 65536), Cqe::new(4, Status::SUCCESS, 0));
        pump(&mut h, &mut t);
        let mut got = Vec::new();
        while let Some((cqe, _)) = h.poll_completion() {
            got.push((cqe.cid.get(), cqe.status()));
        }
        got.sort_by_key(|g| g.0);
        assert_eq!(got, [(3, Status::DATA_TRANSFER_ERROR.dnr()), (4, Status::DATA_TRANSFER_ERROR.dnr())]);
    }

    #[test]
    fn nothing_received_after_a_fatal_error_runs() {
        let (mut h, mut t) = pair(true, 1);
        // A read, a Send too short for a command capsule, another read:
        // one input.
        h.submit(cmd(0x02, 1), Vec::new(), 4096);
        h.conn.send(&[0u8; 10], &[], None);
        h.submit(cmd(0x02, 2), Vec::new(), 4096);
        let mut wire = Vec::new();
        h.take_transmit(&mut wire);
        let e = t.handle_input(&wire).unwrap_err();
        assert!(e.to_string().contains("command capsule of 10 bytes"), "{e}");
        assert!(t.is_closed());
        // Later input (even none) runs nothing that came after the error.
        t.handle_input(&[]).unwrap_or_default();
        let mut cids = Vec::new();
        while let Some(ev) = t.poll_event() {
            if let TEvent::Command { sqe, .. } = ev {
                cids.push(sqe.cid.get());
            }
        }
        assert_eq!(cids, [1], "only the command before the bad capsule");
    }

    #[test]
    fn a_command_that_came_with_the_connection_request_is_taken() {
        // The first Send of a queue (MSN 1), as a connected host sends it.
        let (mut h0, _) = pair(false, 1);
        h0.submit(cmd(0x02, 4), Vec::new(), 4096);
        let mut send = Vec::new();
        h0.take_transmit(&mut send);
        // A host that sends it right behind its MPA request, in one input:
        // the queue's receives must be posted before it is processed.
        let mut h = HostConnection::new(HostConfig { crc: false, qid: 1, entries: 16, ..HostConfig::default() });
        let mut wire = Vec::new();
        h.take_transmit(&mut wire);
        wire.extend_from_slice(&send);
        let mut t = TargetQueue::<Vec<u8>>::new(TargetConfig { crc: false, ..TargetConfig::default() });
        t.handle_input(&wire).unwrap();
        assert!(matches!(t.poll_event(), Some(TEvent::Accepted { entries: 16, .. })));
        match t.poll_event() {
            Some(TEvent::Command { sqe, data: None }) => assert_eq!(sqe.cid.get(), 4),
            other => panic!("{other:?}"),
        }
        assert!(!t.is_closed());
    }

    /// A Fabrics Connect for queue `qid` of `sqsize + 1` entries.
    fn connect(cid: u16, qid: u16, sqsize: u16) -> Sqe {
        let mut sqe = cmd(0x7f, cid);
        sqe.nsid = 0x01.into();
        sqe.cdw10 = (u32::from(qid) << 16).into();
        sqe.cdw11 = u32::from(sqsize).into();
        sqe
    }

    #[test]
    fn a_connect_whose_queue_differs_from_the_cm_request_is_refused_here() {
        // The CM request (pair: 16 entries) sized the receives posted for
        // this queue; a Connect for another queue or size would have the
        // controller agree to a queue it does not have.
        for (qid, sqsize, ipo) in [(1u16, 31u16, 44u16), (1, 7, 44), (2, 15, 42)] {
            let (mut h, mut t) = pair(false, 1);
            h.submit(connect(9, qid, sqsize), pattern(1, 1024), 0);
            pump(&mut h, &mut t);
            assert!(matches!(t.poll_event(), Some(TEvent::ConnectMismatch { .. })));
            assert!(t.poll_event().is_none(), "Connect qid {qid} sqsize {sqsize} reached the core");
            let (cqe, _) = h.poll_completion().expect("the Connect's answer");
            assert_eq!(cqe.status(), Status::CONNECT_INVALID_PARAMETERS.dnr(), "qid {qid} sqsize {sqsize}");
            assert_eq!(cqe.dw0.get(), u32::from(ipo), "IPO of qid {qid} sqsize {sqsize}");
        }
        // The Connect that matches goes up, in-capsule data and all.
        let (mut h, mut t) = pair(false, 1);
        h.submit(connect(9, 1, 15), pattern(1, 1024), 0);
        pump(&mut h, &mut t);
        assert!(matches!(t.poll_event(), Some(TEvent::Command { data: Some(_), .. })));
    }

    #[test]
    fn a_send_beyond_the_queue_is_a_ddp_no_buffer_terminate_and_nothing_more_runs() {
        let (mut h, mut t) = pair(false, 1);
        // 16 entries: the 17th command in flight has no receive to land in.
        for cid in 1..=17u16 {
            h.submit(cmd(0x02, cid), Vec::new(), 512);
        }
        let mut wire = Vec::new();
        h.take_transmit(&mut wire);
        let e = t.handle_input(&wire).unwrap_err();
        assert_eq!(e.code, iwarp::error::ErrorCode::DDP_UNTAGGED_NO_BUFFER, "{e}");
        assert!(t.is_closed());
        let mut n = 0;
        while let Some(ev) = t.poll_event() {
            assert!(matches!(ev, TEvent::Command { .. }), "{ev:?}");
            n += 1;
        }
        assert_eq!(n, 16, "the commands the queue holds, not the one beyond it");
        let mut back = Vec::new();
        t.take_transmit(&mut back);
        match h.handle_input(&back) {
            Err(HostError::Terminated(code)) => assert_eq!(code, iwarp::error::ErrorCode::DDP_UNTAGGED_NO_BUFFER),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn sqhd_frees_only_the_entries_whose_receives_are_posted_again() {
        // SQ flow control on: a host may submit while its SQ (16 entries,
        // so 15 in use at most) is not full by the SQHD of the last
        // completion. Each entry is a receive of the controller's, posted
        // again when its command completes: an entry the SQHD frees before
        // that would let the host send into no receive.
        let (mut h, mut t) = pair(false, 1);
        t.set_queue(1, 15, false);
        let entries = 16u16;
        let mut tail = 0u16;
        for cid in 1..=15u16 {
            h.submit(cmd(0x02, cid), Vec::new(), 512);
            tail = (tail + 1) % entries;
        }
        pump(&mut h, &mut t);
        while t.poll_event().is_some() {}
        t.send_data(1, &pattern(1, 512), Cqe::new(1, Status::SUCCESS, 0));
        pump(&mut h, &mut t);
        let (cqe, _) = h.poll_completion().unwrap();
        let sqhd = cqe.sqhd.get();
        assert_eq!(sqhd, 1, "one command completed, one entry free");
        // The host fills what the SQHD says is free: every command lands.
        let used = (tail + entries - sqhd) % entries;
        for cid in 0..(entries - 1 - used) {
            h.submit(cmd(0x02, 100 + cid), Vec::new(), 512);
        }
        let mut wire = Vec::new();
        h.take_transmit(&mut wire);
        t.handle_input(&wire).unwrap();
        assert!(!t.is_closed());
        // With SQ flow control off, SQHD is FFFFh.
        let (mut h, mut t) = pair(false, 1);
        t.set_queue(1, 15, true);
        h.submit(cmd(0x02, 1), Vec::new(), 512);
        pump(&mut h, &mut t);
        while t.poll_event().is_some() {}
        t.send_data(1, &pattern(1, 512), Cqe::new(1, Status::SUCCESS, 0));
        pump(&mut h, &mut t);
        assert_eq!(h.poll_completion().unwrap().0.sqhd.get(), 0xffff);
    }

    #[test]
    fn a_rejected_request_reports_the_cm_status() {
        // 2000 entries on an I/O queue where the target allows 1024.
        let mut h = HostConnection::new(HostConfig { qid: 1, entries: 2000, ..HostConfig::default() });
        let mut t = TargetQueue::<Vec<u8>>::new(TargetConfig::default());
        let mut wire = Vec::new();
        h.take_transmit(&mut wire);
        t.handle_input(&wire).unwrap();
        let mut back = Vec::new();
        t.take_transmit(&mut back);
        match h.handle_input(&back) {
            Err(HostError::Rejected { sts }) => assert_eq!(sts, crate::cm::RejectStatus::INVALID_HSQSIZE.0),
            other => panic!("{other:?}"),
        }
        assert!(!h.is_ready());
    }
}
