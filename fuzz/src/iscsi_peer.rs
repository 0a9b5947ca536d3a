//! The iSCSI target harness shared by the `iscsi_target` fuzz target and
//! the corpus generator: a policy with one target (CHAP optional), the
//! target configurations an input byte selects, and a driver that answers
//! what the connection hands up (as `crates/ironwire/src/iscsi_tcp.rs`
//! does, without SCSI) while checking what the connection sends.

use iscsi::chap::Secret;
use iscsi::pdu::{self, flags, Framing, Opcode, Stage};
use iscsi::target::{
    scsi_status, tmf_response, Event, Policy, Seed, State, TargetConfig, TargetConnection, TargetInfo, TaskRef,
};
use std::collections::HashMap;
use std::sync::Arc;

/// The one target the policy knows.
pub const TARGET: &str = "iqn.2026-11.io.ironwire:fuzz";
/// The one initiator its ACL admits.
pub const INITIATOR: &str = "iqn.2026-11.io.ironwire:fuzz-host";
/// The CHAP user and secret the initiator proves (when bit 1 of the
/// configuration byte asks for authentication).
pub const CHAP_USER: &str = "fuzzuser";
/// See [`CHAP_USER`].
pub const CHAP_SECRET: &str = "initiator-secret";
/// The target's own CHAP name and secret (mutual CHAP).
pub const TARGET_SECRET: &str = "target-secret-0";

/// What the harness's target accepts.
pub struct FuzzPolicy {
    auth: bool,
    admit: bool,
}

impl Policy for FuzzPolicy {
    fn target(&self, name: &str) -> Option<TargetInfo> {
        self.discovery_targets(INITIATOR).into_iter().find(|t| t.name == name)
    }
    fn initiator_allowed(&self, _target: &str, initiator: &str) -> bool {
        initiator == INITIATOR
    }
    fn discovery_targets(&self, _initiator: &str) -> Vec<TargetInfo> {
        vec![TargetInfo {
            name: TARGET.into(),
            alias: Some("fuzz".into()),
            tpgt: 1,
            portals: vec!["127.0.0.1:3260,1".into()],
        }]
    }
    fn auth_required(&self, _target: Option<&str>, _initiator: &str) -> bool {
        self.auth
    }
    fn chap_secret(&self, _target: Option<&str>, _initiator: &str, user: &str) -> Option<Secret> {
        (user == CHAP_USER).then(|| Secret::from(CHAP_SECRET))
    }
    fn target_credentials(&self, _target: Option<&str>, _initiator: &str) -> Option<(String, Secret)> {
        Some(("fuzz-target".into(), Secret::from(TARGET_SECRET)))
    }
    fn admits_sessions(&self) -> bool {
        self.admit
    }
}

/// A target connection for configuration byte `cfg`: bit 0 digests
/// allowed, bit 1 CHAP required, bit 2 small limits (MaxRecvDataSegment
/// 512, burst 4 KiB, CmdSN window 4, writes of at most 64 KiB, login text
/// of at most 4 KiB) so they are reachable, bit 3 InitialR2T=Yes and
/// ImmediateData=No, bit 6 the harness admits each normal session itself
/// (as the daemon does, for session reinstatement).
pub fn connection(cfg: u8) -> TargetConnection<Vec<u8>> {
    let mut c = TargetConfig { nop_interval_ms: Some(2000), nop_timeout_ms: 5000, ..TargetConfig::default() };
    c.params.header_digest = cfg & 1 != 0;
    c.params.data_digest = cfg & 1 != 0;
    if cfg & 4 != 0 {
        c.params.max_recv_data_segment_length = 512;
        c.params.max_burst_length = 4096;
        c.params.first_burst_length = 1024;
        c.params.max_outstanding_r2t = 2;
        c.queue_depth = 4;
        c.max_write_len = 64 * 1024;
        c.max_text_len = 4096;
    }
    if cfg & 8 != 0 {
        c.params.initial_r2t = true;
        c.params.immediate_data = false;
    }
    let seed = Seed { tsih: 0x0101, stat_sn: 0x1000, chap_id: 9, chap_challenge: [0x3c; 32] };
    TargetConnection::new(c, Arc::new(FuzzPolicy { auth: cfg & 2 != 0, admit: cfg & 0x40 != 0 }), seed)
}

/// Read data the driver offers beyond a read's expected length is capped
/// here, so a hostile Expected Data Transfer Length cannot make the harness
/// allocate gigabytes.
const MAX_READ: u32 = 256 * 1024;

/// Answers what a [`TargetConnection`] hands up and checks what it sends.
///
/// Commands are answered at once, or (`hold`) at the start of the next
/// chunk so task management can race with them. Reads get a pattern
/// 7 bytes longer than expected (the connection cuts it and reports
/// overflow), writes GOOD, other commands GOOD, except TEST UNIT READY
/// which gets CHECK CONDITION with sense. Task management is answered
/// "function complete" after the held tasks in its scope are dropped.
pub struct Driver {
    /// Answer commands one chunk late.
    pub hold: bool,
    held: Vec<TaskRef>,
    /// ITT → read bytes its open task may be sent.
    reads: HashMap<u32, u32>,
    /// Framing of the bytes the target sends.
    tx_framing: Framing,
    /// Bytes the target sent and the checks have not yet framed.
    pending: Vec<u8>,
    /// The target sent its final Login Response.
    logged_in: bool,
    /// Events seen.
    pub events: usize,
}

impl Driver {
    /// A driver; `hold` answers commands one chunk late.
    pub fn new(hold: bool) -> Self {
        Driver {
            hold,
            held: Vec::new(),
            reads: HashMap::new(),
            tx_framing: Framing::default(),
            pending: Vec::new(),
            logged_in: false,
            events: 0,
        }
    }

    /// Feeds `chunk` and answers the events it causes; returns every byte
    /// the target sent meanwhile.
    pub fn feed(&mut self, t: &mut TargetConnection<Vec<u8>>, chunk: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for task in std::mem::take(&mut self.held) {
            self.answer(t, task, &mut out);
        }
        let closed = t.state() == State::Closed;
        let before = t.transmit_len();
        let r = t.handle_input(chunk);
        if closed {
            assert!(r.is_ok(), "a closed connection returned {r:?}");
            assert_eq!(t.transmit_len(), before, "a closed connection queued bytes");
            assert!(t.poll_event().is_none(), "a closed connection raised an event");
        }
        if let Err(e) = &r {
            assert_eq!(t.state(), State::Closed, "fatal error {e:?} left the connection open");
            assert!(!e.field.is_empty());
        }
        self.flush(t, &mut out);
        self.serve(t, &mut out);
        out
    }

    /// Passes `now_ms` to the connection's timers and answers what follows.
    pub fn tick(&mut self, t: &mut TargetConnection<Vec<u8>>, now_ms: u64) -> Vec<u8> {
        let mut out = Vec::new();
        t.on_tick(now_ms);
        self.flush(t, &mut out);
        self.serve(t, &mut out);
        out
    }

    fn serve(&mut self, t: &mut TargetConnection<Vec<u8>>, out: &mut Vec<u8>) {
        while let Some(ev) = t.poll_event() {
            self.events += 1;
            match ev {
                Event::Command(c) => {
                    if c.write {
                        // A W command with Expected Data Transfer Length 0
                        // comes without a buffer.
                        let data = c.data.as_ref().map_or(0, Vec::len);
                        assert_eq!(data, c.expected_len as usize, "write data is not the expected length");
                    } else {
                        assert!(c.data.is_none(), "a command without W carries data");
                    }
                    assert!(!c.cdb.is_empty() && c.cdb.len() <= 16 + 255 * 4);
                    let limit = match (c.read, c.write) {
                        (true, true) => c.bidi_read_len.unwrap_or(0),
                        (true, false) => c.expected_len,
                        _ => 0,
                    };
                    self.reads.insert(c.task.itt, limit);
                    if self.hold {
                        self.held.push(c.task);
                    } else {
                        self.answer(t, c.task, out);
                    }
                    let _ = (c.cdb.first().copied(), c.lun, c.attr, c.immediate);
                }
                Event::TaskMgmt { itt, tasks, .. } => {
                    self.held.retain(|h| !tasks.contains(h));
                    t.send_tmf_response(itt, tmf_response::COMPLETE);
                    self.flush(t, out);
                    for task in tasks {
                        assert!(
                            !t.send_response(task, scsi_status::GOOD, None, None),
                            "an aborted task could still be answered"
                        );
                    }
                }
                Event::LoggedIn { params, .. } => assert_eq!(&params, t.params()),
                Event::LoginFailed { status, reason } => {
                    assert!(status != 0 && !reason.is_empty());
                }
                Event::SessionPending { .. } => t.admit_session(),
                Event::LoggedOut { .. } | Event::Dead => {}
            }
            self.flush(t, out);
        }
    }

    fn answer(&mut self, t: &mut TargetConnection<Vec<u8>>, task: TaskRef, out: &mut Vec<u8>) {
        let limit = self.reads.get(&task.itt).copied().unwrap_or(0);
        let answered = if limit > 0 {
            let data = crate::pattern(limit.min(MAX_READ).saturating_add(7) as usize);
            t.send_data_in(task, &data, Some(scsi_status::GOOD))
        } else if task.serial % 5 == 4 {
            // Now and then CHECK CONDITION with fixed-format sense
            // (ILLEGAL REQUEST, INVALID FIELD IN CDB).
            let sense = [0x70, 0, 0x05, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0];
            t.send_response(task, scsi_status::CHECK_CONDITION, Some(&sense), None)
        } else {
            t.send_response(task, scsi_status::GOOD, None, None)
        };
        if answered {
            assert!(!t.send_response(task, scsi_status::GOOD, None, None), "a task was answered twice");
        }
        self.flush(t, out);
    }

    /// Takes what the target queued and checks it frames as PDUs: plain
    /// and at most 8192 data bytes until the final Login Response, then in
    /// the negotiated digests and within the initiator's
    /// MaxRecvDataSegmentLength; Data-In never beyond a read's expected
    /// length.
    fn flush(&mut self, t: &mut TargetConnection<Vec<u8>>, out: &mut Vec<u8>) {
        let start = out.len();
        t.take_transmit(out);
        self.pending.extend_from_slice(out.get(start..).unwrap_or_default());
        let mut at = 0;
        loop {
            let rest = self.pending.get(at..).unwrap_or_default();
            if rest.is_empty() {
                break;
            }
            let f = match pdu::deframe(rest, self.tx_framing) {
                Some(Ok(f)) => f,
                Some(Err(e)) => panic!("target sent a malformed PDU: {e:?}"),
                None => panic!("target sent a truncated PDU: {} bytes", rest.len()),
            };
            assert!(f.data_digest_ok, "target sent a bad data digest");
            let b = f.bhs;
            let op = b.opcode();
            if op == Opcode::DATA_IN {
                let limit = self.reads.get(&b.itt()).copied().unwrap_or(0);
                let end = u64::from(b.buffer_offset()) + f.data.len() as u64;
                assert!(end <= u64::from(limit), "Data-In to {end} beyond expected length {limit}");
            }
            if op == Opcode::LOGIN_RESP
                && b.flags() & flags::TRANSIT != 0
                && b.nsg() == Stage::FULL_FEATURE
                && b.login_status() == 0
            {
                assert!(!self.logged_in, "a second final Login Response");
                self.logged_in = true;
                let p = t.params();
                self.tx_framing = Framing {
                    header_digest: p.header_digest,
                    data_digest: p.data_digest,
                    max_data_segment: p.peer_max_recv_data_segment_length,
                };
            }
            at += f.len;
        }
        self.pending.clear();
    }
}
