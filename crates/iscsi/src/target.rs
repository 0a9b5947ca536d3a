//! The target side of one iSCSI connection (RFC 7143), without I/O or clock.
//!
//! States are named for what they wait for: [`State::AwaitLogin`] through
//! the security and operational stages, [`State::FullFeature`] for commands,
//! and [`State::Closed`] once the connection must end (failed login, logout,
//! a fatal protocol error, a dead initiator); after that input is ignored
//! and the driver closes the socket once the transmit buffer is flushed.
//!
//! The connection owns everything iSCSI: login and CHAP, key negotiation,
//! the CmdSN window, write-data collection (immediate, unsolicited, R2T),
//! Data-In splitting, residuals, NOP pings, Text/SendTargets, Logout and
//! Rejects. It hands up SCSI commands with all their write data, task
//! management requests, and session events; it knows nothing of SCSI
//! semantics beyond status and sense framing. One connection per session
//! (MaxConnections=1) and ErrorRecoveryLevel 0.

use crate::chap::{self, ChapAlgorithm, Secret};
use crate::error::{Disposition, PduError, RejectReason};
use crate::pdu::{
    self, ahs_entries, ahs_type, async_event, flags, sn_le, sn_lt, Bhs, Framing, Opcode, Stage, BHS_LEN, RESERVED_TAG,
};
use crate::text::{self, Params, SessionType};
use crate::DataBuffer;
use checksum::Appender;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

/// Login status codes, class in the high byte (RFC 7143 section 11.13.5).
pub mod login_status {
    /// Success.
    pub const SUCCESS: u16 = 0x0000;
    /// Initiator error (miscellaneous), also protocol errors during login.
    pub const INITIATOR_ERROR: u16 = 0x0200;
    /// Authentication failure.
    pub const AUTHENTICATION_FAILURE: u16 = 0x0201;
    /// Authorization failure: the initiator may not access this target.
    pub const AUTHORIZATION_FAILURE: u16 = 0x0202;
    /// Target not found.
    pub const NOT_FOUND: u16 = 0x0203;
    /// Target removed.
    pub const TARGET_REMOVED: u16 = 0x0204;
    /// Unsupported version.
    pub const UNSUPPORTED_VERSION: u16 = 0x0205;
    /// Too many connections.
    pub const TOO_MANY_CONNECTIONS: u16 = 0x0206;
    /// Missing parameter.
    pub const MISSING_PARAMETER: u16 = 0x0207;
    /// Can't include in session.
    pub const CANT_INCLUDE_IN_SESSION: u16 = 0x0208;
    /// Session type not supported.
    pub const SESSION_TYPE_NOT_SUPPORTED: u16 = 0x0209;
    /// Session does not exist.
    pub const SESSION_DOES_NOT_EXIST: u16 = 0x020a;
    /// Invalid request during login.
    pub const INVALID_DURING_LOGIN: u16 = 0x020b;
    /// Target error (miscellaneous).
    pub const TARGET_ERROR: u16 = 0x0300;
    /// Service unavailable.
    pub const SERVICE_UNAVAILABLE: u16 = 0x0301;
    /// Out of resources.
    pub const OUT_OF_RESOURCES: u16 = 0x0302;
}

/// Task management function codes (RFC 7143 section 11.5.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TmfFunction(pub u8);

impl TmfFunction {
    /// ABORT TASK.
    pub const ABORT_TASK: TmfFunction = TmfFunction(1);
    /// ABORT TASK SET.
    pub const ABORT_TASK_SET: TmfFunction = TmfFunction(2);
    /// CLEAR ACA.
    pub const CLEAR_ACA: TmfFunction = TmfFunction(3);
    /// CLEAR TASK SET.
    pub const CLEAR_TASK_SET: TmfFunction = TmfFunction(4);
    /// LOGICAL UNIT RESET.
    pub const LOGICAL_UNIT_RESET: TmfFunction = TmfFunction(5);
    /// TARGET WARM RESET.
    pub const TARGET_WARM_RESET: TmfFunction = TmfFunction(6);
    /// TARGET COLD RESET.
    pub const TARGET_COLD_RESET: TmfFunction = TmfFunction(7);
    /// TASK REASSIGN (needs ErrorRecoveryLevel 2).
    pub const TASK_REASSIGN: TmfFunction = TmfFunction(8);
    /// QUERY TASK.
    pub const QUERY_TASK: TmfFunction = TmfFunction(9);
    /// QUERY TASK SET.
    pub const QUERY_TASK_SET: TmfFunction = TmfFunction(10);
    /// I_T NEXUS RESET.
    pub const I_T_NEXUS_RESET: TmfFunction = TmfFunction(11);
    /// QUERY ASYNCHRONOUS EVENT.
    pub const QUERY_ASYNC_EVENT: TmfFunction = TmfFunction(12);
}

/// Task management response codes (RFC 7143 section 11.6.1).
pub mod tmf_response {
    /// Function complete.
    pub const COMPLETE: u8 = 0;
    /// Task does not exist.
    pub const TASK_DOES_NOT_EXIST: u8 = 1;
    /// LUN does not exist.
    pub const LUN_DOES_NOT_EXIST: u8 = 2;
    /// Task still allegiant.
    pub const TASK_STILL_ALLEGIANT: u8 = 3;
    /// Task allegiance reassignment not supported.
    pub const REASSIGNMENT_NOT_SUPPORTED: u8 = 4;
    /// Task management function not supported.
    pub const NOT_SUPPORTED: u8 = 5;
    /// Function authorization failed.
    pub const AUTHORIZATION_FAILED: u8 = 6;
    /// Function rejected.
    pub const REJECTED: u8 = 255;
}

/// SCSI status codes the connection itself needs (SAM-5).
pub mod scsi_status {
    /// GOOD.
    pub const GOOD: u8 = 0x00;
    /// CHECK CONDITION.
    pub const CHECK_CONDITION: u8 = 0x02;
    /// CONDITION MET.
    pub const CONDITION_MET: u8 = 0x04;
    /// INTERMEDIATE.
    pub const INTERMEDIATE: u8 = 0x10;
    /// INTERMEDIATE-CONDITION MET.
    pub const INTERMEDIATE_CONDITION_MET: u8 = 0x14;
    /// TASK SET FULL: the session holds as many tasks as it may.
    pub const TASK_SET_FULL: u8 = 0x28;

    /// Whether a status may ride in the final Data-In (S bit): GOOD,
    /// CONDITION MET or INTERMEDIATE-CONDITION MET, as RFC 7143 section
    /// 11.7.4 lists them (INTERMEDIATE is not among them).
    pub fn may_collapse(s: u8) -> bool {
        matches!(s, GOOD | CONDITION_MET | INTERMEDIATE_CONDITION_MET)
    }
}

/// A target the policy knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetInfo {
    /// iSCSI name (iqn./eui./naa.).
    pub name: String,
    /// TargetAlias, if any.
    pub alias: Option<String>,
    /// Target portal group tag of the portal this connection came in on.
    pub tpgt: u16,
    /// TargetAddress values for SendTargets: `ip:port,tpgt`; a wildcard
    /// address stands for the one the initiator reached
    /// ([`TargetConnection::with_local`]).
    pub portals: Vec<String>,
}

/// What the caller decides: which targets exist, who may log in, and the
/// CHAP secrets. Called during login and SendTargets only.
pub trait Policy {
    /// The target named `name`, if configured.
    fn target(&self, name: &str) -> Option<TargetInfo>;
    /// Whether `initiator` is in the target's ACL.
    fn initiator_allowed(&self, target: &str, initiator: &str) -> bool;
    /// The targets `initiator` may see in a discovery session.
    fn discovery_targets(&self, initiator: &str) -> Vec<TargetInfo>;
    /// Whether this login must authenticate (`target` is `None` for discovery).
    fn auth_required(&self, target: Option<&str>, initiator: &str) -> bool;
    /// The secret the initiator proves for CHAP name `user`.
    fn chap_secret(&self, target: Option<&str>, initiator: &str, user: &str) -> Option<Secret>;
    /// The target's own CHAP name and secret for mutual CHAP.
    fn target_credentials(&self, target: Option<&str>, initiator: &str) -> Option<(String, Secret)>;
    /// Takes a place for one more session to `target` from `peer` (the
    /// connection's address, [`TargetConnection::with_peer`]) as its
    /// login completes, or says (for the log) which limit it would pass;
    /// the login is then refused "out of resources" (RFC 7143 section
    /// 11.13.5). The caller gives the place back when the connection of
    /// [`TargetConnection::session_target`] ends.
    fn reserve_session(&self, _target: &str, _peer: Option<std::net::IpAddr>) -> Result<(), String> {
        Ok(())
    }
    /// Whether the caller admits each new normal session itself. When it
    /// does, the final Login Response of a normal session waits, after
    /// [`Event::SessionPending`], until [`TargetConnection::admit_session`]:
    /// the caller first ends an older session of the same initiator, ISID
    /// and target (session reinstatement, RFC 7143 section 6.3.5).
    fn admits_sessions(&self) -> bool {
        false
    }
}

/// Limits and preferences of the target.
#[derive(Clone, Debug)]
pub struct TargetConfig {
    /// What the target accepts in negotiation; `max_recv_data_segment_length`
    /// is what it declares and enforces on receive.
    pub params: Params,
    /// Commands the initiator may have outstanding (CmdSN window size,
    /// never more than `max_tasks`).
    pub queue_depth: u32,
    /// Tasks open at once: SCSI commands and task management requests not
    /// yet answered, immediate or not. The CmdSN window keeps a conforming
    /// initiator's numbered commands within it; past it, an immediate
    /// command is rejected ("immediate command reject", RFC 7143 sections
    /// 3.2.2.1 and 11.17.1) and a numbered SCSI command gets TASK SET FULL.
    pub max_tasks: u32,
    /// Largest Expected Data Transfer Length buffered for a write.
    pub max_write_len: u32,
    /// Bytes of write buffers the connection holds for data it has yet to
    /// solicit or receive: every write buffer held for data still to come
    /// counts (a write whose data all came with its command is passed on
    /// at once and holds nothing). A write that brings no data unasked
    /// waits for room before it gets its buffer and R2Ts; one that brings
    /// some and expects more (immediate data short of the whole, or
    /// unsolicited Data-Out to follow) takes its whole buffer at once, or,
    /// with no room, ends in TASK SET FULL with that data dropped (an
    /// immediate one is rejected: "immediate command reject"). One write
    /// is always let through, so a write up to `max_write_len` never waits
    /// for ever.
    pub write_budget: u64,
    /// CHAP algorithms accepted.
    pub chap_algorithms: Vec<ChapAlgorithm>,
    /// Send a NOP-In ping after this much idle time (ms), `None` never.
    pub nop_interval_ms: Option<u64>,
    /// Declare the initiator dead when a ping is unanswered this long (ms).
    pub nop_timeout_ms: u64,
    /// Largest accumulated login/text data (continued PDUs) accepted.
    pub max_text_len: usize,
}

impl Default for TargetConfig {
    fn default() -> Self {
        TargetConfig {
            params: Params {
                header_digest: true,
                data_digest: true,
                initial_r2t: false,
                immediate_data: true,
                max_recv_data_segment_length: 262_144,
                max_burst_length: 1 << 20,
                first_burst_length: 262_144,
                max_outstanding_r2t: 16,
                max_connections: 1,
                ..Params::default()
            },
            queue_depth: 128,
            max_tasks: 1024,
            max_write_len: 16 << 20,
            write_budget: 32 << 20,
            chap_algorithms: ChapAlgorithm::ALL.to_vec(),
            nop_interval_ms: Some(5000),
            nop_timeout_ms: 15000,
            max_text_len: 65536,
        }
    }
}

/// Values the caller draws from its random source for one connection, so
/// that this crate needs none.
#[derive(Clone, Copy, Debug)]
pub struct Seed {
    /// TSIH for a new session (non-zero).
    pub tsih: u16,
    /// Initial StatSN.
    pub stat_sn: u32,
    /// CHAP identifier (CHAP_I).
    pub chap_id: u8,
    /// CHAP challenge bytes; the algorithm's digest length is used.
    pub chap_challenge: [u8; 32],
}

/// What the connection waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Login requests.
    AwaitLogin,
    /// Commands and data.
    FullFeature,
    /// Nothing: the connection is over.
    Closed,
}

/// A command's CDB, held inline (no allocation) unless an Extended CDB
/// AHS makes it longer than the BHS's 16 bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cdb {
    short: [u8; 16],
    /// The whole CDB when it is longer than 16 bytes; empty otherwise.
    long: Vec<u8>,
}

impl Cdb {
    /// The CDB bytes.
    pub fn as_slice(&self) -> &[u8] {
        if self.long.is_empty() {
            &self.short
        } else {
            &self.long
        }
    }
}

impl std::ops::Deref for Cdb {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl PartialEq<Vec<u8>> for Cdb {
    fn eq(&self, other: &Vec<u8>) -> bool {
        self.as_slice() == other.as_slice()
    }
}

/// A SCSI command with all its write data.
#[derive(Debug)]
pub struct Command<B> {
    /// The task: answer it with this, never with the bare ITT.
    pub task: TaskRef,
    /// LUN field as sent (8 bytes, SAM encoding).
    pub lun: u64,
    /// The CDB: 16 bytes, or longer with an Extended CDB AHS.
    pub cdb: Cdb,
    /// Expected Data Transfer Length.
    pub expected_len: u32,
    /// Bidirectional Read Expected Data Transfer Length (AHS), if any.
    pub bidi_read_len: Option<u32>,
    /// R bit.
    pub read: bool,
    /// W bit.
    pub write: bool,
    /// Task attribute (ATTR).
    pub attr: u8,
    /// Immediate (I bit).
    pub immediate: bool,
    /// Write data, `expected_len` bytes, when `write` (an empty buffer for
    /// W=1 with Expected Data Transfer Length 0, which RFC 7143 section
    /// 11.3.1 allows: no data-out phase, no R2T); `None` otherwise.
    pub data: Option<B>,
    /// The upper layer's epoch when the command arrived
    /// ([`TargetConnection::set_epoch`]): a task management function of
    /// another session that began later knows the command was in its scope.
    pub epoch: u64,
}

/// Something the upper layer must act on.
#[derive(Debug)]
pub enum Event<B> {
    /// Login completed; the session is in full feature phase.
    LoggedIn {
        /// InitiatorName.
        initiator: String,
        /// TargetName (normal sessions).
        target: Option<String>,
        /// Normal or discovery.
        session_type: SessionType,
        /// ISID.
        isid: [u8; 6],
        /// TSIH given to the session.
        tsih: u16,
        /// Negotiated parameters.
        params: Params,
    },
    /// A normal session's login is complete but its final Login Response
    /// waits for [`TargetConnection::admit_session`] (only when
    /// [`Policy::admits_sessions`]). The initiator sends nothing meanwhile.
    SessionPending {
        /// InitiatorName.
        initiator: String,
        /// TargetName.
        target: String,
        /// ISID.
        isid: [u8; 6],
    },
    /// Login failed with `status`; the connection closes.
    LoginFailed {
        /// Status-Class and Status-Detail.
        status: u16,
        /// Why, for the log.
        reason: String,
    },
    /// A SCSI command, with its write data when it has some.
    Command(Command<B>),
    /// A task management request; answer with
    /// [`TargetConnection::send_tmf_response`].
    TaskMgmt {
        /// ITT of the request.
        itt: u32,
        /// Function.
        function: TmfFunction,
        /// LUN.
        lun: u64,
        /// Referenced Task Tag (ABORT TASK, QUERY TASK).
        referenced_itt: u32,
        /// RefCmdSN.
        ref_cmd_sn: u32,
        /// The tasks in its scope that were delivered as
        /// [`Event::Command`] and have not been answered: the request may
        /// be answered "function complete" only once none of them can
        /// touch the device any more. Their late answers are ignored.
        tasks: Vec<TaskRef>,
    },
    /// The initiator logged out (reason code); the connection closes after
    /// the flush.
    LoggedOut {
        /// Logout reason code.
        reason: u8,
    },
    /// A NOP-In ping went unanswered: the initiator is gone.
    Dead,
}

/// Names one SCSI task for its whole life: the initiator's tag plus a
/// serial number the connection never reuses. An initiator may reuse an
/// ITT as soon as a task is answered or aborted (RFC 7143 section 11.5.1);
/// a completion that arrives for an aborted task must not answer the new
/// one that took its ITT, so completions name the task, not the ITT.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TaskRef {
    /// Initiator Task Tag.
    pub itt: u32,
    /// Unique among this connection's tasks.
    pub serial: u64,
}

/// A residual to report in a SCSI Response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residual {
    /// Fewer bytes than expected were transferred.
    Underflow(u32),
    /// More bytes than expected were wanted.
    Overflow(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Auth {
    NotStarted,
    AwaitChapA,
    AwaitChapResponse(ChapAlgorithm),
    Done,
}

struct Login {
    started: bool,
    stage: Stage,
    isid: [u8; 6],
    cid: u16,
    initiator: String,
    target: Option<TargetInfo>,
    session_type: SessionType,
    auth: Auth,
    seen: HashSet<String>,
    /// Bytes of the key names in `seen`. A login may go on for many
    /// requests before authentication, so the whole login, not just each
    /// request, is held to `max_text_len` of them.
    seen_len: usize,
    partial: Vec<u8>,
    declared: bool,
    tpgt_sent: bool,
    /// FirstBurstLength was answered with a value: it is fixed for the
    /// rest of the login (RFC 7143 section 6.2).
    first_burst_agreed: bool,
    /// The part of an answer still to send, when it was longer than one
    /// Login Response may carry.
    rest: Option<LoginRest>,
}

/// The rest of a Login Response text sent in parts (RFC 7143 sections 6.1
/// and 11.13.2: every part but the last has C=1 and T=0; the initiator
/// asks for each next part with an empty Login Request).
struct LoginRest {
    text: Vec<u8>,
    /// The answer, once whole, lets the login move on to `nsg`.
    go: bool,
    nsg: Stage,
}

/// Most text one Login Response carries: during login both sides hold to
/// the default MaxRecvDataSegmentLength (RFC 7143 section 13.12).
const LOGIN_MAX_DATA_SEGMENT: usize = 8192;

/// Where to cut `text` (pairs as [`text::push`] writes them) so that the
/// first part holds at most `max` bytes: after the last whole pair that
/// fits, or at `max` when none does (a pair may span PDUs, RFC 7143
/// section 6.1).
fn text_cut(text: &[u8], max: usize) -> usize {
    if text.len() <= max {
        return text.len();
    }
    text.get(..max).and_then(|h| h.iter().rposition(|&c| c == 0)).map_or(max, |p| p.saturating_add(1))
}

struct R2tState {
    ttt: u32,
    offset: u32,
    len: u32,
    next: u32,
    data_sn: u32,
}

struct WriteState<B> {
    /// The whole data buffer (`expected_len` bytes), once allocated: at
    /// once for a write bringing data unasked, else when the budget has
    /// room for it.
    buf: Option<B>,
    /// `buf` counts against the connection's write budget.
    budgeted: bool,
    /// Waits in `write_waiting` for room in the budget.
    waiting: bool,
    received: u32,
    unsolicited: bool,
    unsol_end: u32,
    unsol_next: u32,
    unsol_data_sn: u32,
    next_r2t: u32,
    r2ts: Vec<R2tState>,
    digest_failed: bool,
}

impl<B> WriteState<B> {
    /// A write that has `received` bytes (immediate data) of its
    /// `unsol_end`-byte first burst; `unsolicited`: Data-Out follows for
    /// the rest of that burst.
    fn new(buf: Option<B>, budgeted: bool, received: u32, unsolicited: bool, unsol_end: u32) -> Self {
        WriteState {
            buf,
            budgeted,
            waiting: false,
            received,
            unsolicited,
            unsol_end,
            unsol_next: received,
            unsol_data_sn: 0,
            next_r2t: received,
            r2ts: Vec::new(),
            digest_failed: false,
        }
    }
}

/// How many aborted tasks' ITTs are remembered to drop their Data-Out.
const ABORTED_ITTS_KEPT: usize = 256;

/// A task management request waiting for its answer.
struct PendingTmf {
    function: TmfFunction,
    immediate: bool,
    /// The tasks it ends, fixed when it arrived (RFC 7143 section 4.2.3.2:
    /// commands that arrive later are not affected).
    scope: Vec<TaskRef>,
}

struct Task<B> {
    serial: u64,
    /// Inside the scope of a pending task management request: it asks for
    /// no more data and is never delivered to the upper layer.
    aborting: bool,
    immediate: bool,
    lun: u64,
    expected_len: u32,
    read_expected: u32,
    /// R and W both set: the read's residual goes in the SCSI Response's
    /// Bidirectional Read Residual Count, never in a Data-In.
    bidi: bool,
    /// Refused with this status while the initiator still sends its
    /// unsolicited data: answered once that data is in (RFC 7143 section
    /// 11.4.2), its bytes dropped meanwhile.
    refused: Option<u8>,
    /// The CmdSN its command carried, which an ABORT TASK's RefCmdSN
    /// must name (RFC 7143 section 11.5.4).
    cmd_sn: u32,
    sn: u32,
    sent_in: u32,
    overflow: u32,
    cmd: Option<Command<B>>,
    write: Option<WriteState<B>>,
}

impl<B> Task<B> {
    /// The task of the command `bhs` (its CmdSN, LUN, immediate bit and
    /// expected length), numbered `serial`, with no data moved yet.
    fn new(serial: u64, bhs: &Bhs, read_expected: u32, bidi: bool, refused: Option<u8>) -> Self {
        Task {
            serial,
            aborting: false,
            immediate: bhs.immediate(),
            lun: bhs.lun(),
            expected_len: bhs.expected_data_transfer_length(),
            read_expected,
            bidi,
            refused,
            cmd_sn: bhs.cmd_sn(),
            sn: 0,
            sent_in: 0,
            overflow: 0,
            cmd: None,
            write: None,
        }
    }
}

struct TextPending {
    itt: u32,
    ttt: u32,
    rest: Vec<u8>,
    /// The request had F=0: the last part keeps F=0 too.
    more: bool,
}

struct Ping {
    ttt: u32,
    sent_ms: u64,
}

/// Target side of one iSCSI connection.
pub struct TargetConnection<B> {
    cfg: TargetConfig,
    policy: Arc<dyn Policy + Send + Sync>,
    seed: Seed,
    state: State,
    login: Login,
    params: Params,
    rx_framing: Framing,
    tx_framing: Framing,
    rx: Vec<u8>,
    rx_start: usize,
    tx: Vec<u8>,
    /// Zero bytes the transmit stream carries that `tx` does not hold:
    /// (position in `tx` they go before, length).
    tx_zeros: Vec<(usize, usize)>,
    events: VecDeque<Event<B>>,
    stat_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    /// CmdSNs in the window, past ExpCmdSN, that an ABORT TASK found not
    /// yet received and counts as received (RFC 7143 section 11.5.1):
    /// ExpCmdSN steps over each when it gets there, and the command, if it
    /// comes after all, is a duplicate and dropped. At most a window's worth.
    aborted_sns: Vec<u32>,
    tasks: HashMap<u32, Task<B>>,
    next_serial: u64,
    /// Stamped on arriving commands ([`Command::epoch`]).
    epoch: u64,
    /// Bytes of write buffers counted against `cfg.write_budget`.
    write_held: u64,
    /// Writes waiting for room in the write budget, oldest first.
    write_waiting: VecDeque<TaskRef>,
    /// ITTs of recently aborted tasks: the initiator may still send Data-Out
    /// for them, which is dropped (RFC 7143 section 4.2.3.2). Bounded.
    aborted_itts: VecDeque<u32>,
    ttts: HashMap<u32, u32>,
    next_ttt: u32,
    text_pending: Option<TextPending>,
    text_partial: Vec<u8>,
    /// The ITT and TTT of a Text Request sent in parts (C bit) whose next
    /// part is awaited.
    text_continue: Option<(u32, u32)>,
    tmf_pending: HashMap<u32, PendingTmf>,
    ping: Option<Ping>,
    logout_pending: Option<Bhs>,
    idle_since_ms: Option<u64>,
    rx_activity: bool,
    /// The login took a session place with [`Policy::reserve_session`].
    session_reserved: bool,
    /// The initiator's address, for the policy's per-host limits.
    peer: Option<std::net::IpAddr>,
    /// The address the initiator reached, for SendTargets.
    local: Option<std::net::IpAddr>,
    /// The final Login Response (header and text) of a normal session,
    /// held until [`TargetConnection::admit_session`].
    pending_login: Option<(Bhs, Vec<u8>)>,
}

fn login_fail(status: u16, reason: impl Into<String>) -> (u16, String) {
    (status, reason.into())
}

impl<B: DataBuffer> TargetConnection<B> {
    /// A connection waiting for the first Login Request.
    pub fn new(cfg: TargetConfig, policy: Arc<dyn Policy + Send + Sync>, seed: Seed) -> Self {
        TargetConnection {
            cfg,
            policy,
            seed,
            state: State::AwaitLogin,
            login: Login {
                started: false,
                stage: Stage::SECURITY,
                isid: [0; 6],
                cid: 0,
                initiator: String::new(),
                target: None,
                session_type: SessionType::Normal,
                auth: Auth::NotStarted,
                seen: HashSet::new(),
                seen_len: 0,
                partial: Vec::new(),
                declared: false,
                tpgt_sent: false,
                first_burst_agreed: false,
                rest: None,
            },
            params: Params::default(),
            rx_framing: Framing::default(),
            tx_framing: Framing::default(),
            rx: Vec::new(),
            rx_start: 0,
            tx: Vec::new(),
            tx_zeros: Vec::new(),
            events: VecDeque::new(),
            stat_sn: seed.stat_sn,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
            aborted_sns: Vec::new(),
            tasks: HashMap::new(),
            next_serial: 0,
            epoch: 0,
            write_held: 0,
            write_waiting: VecDeque::new(),
            aborted_itts: VecDeque::new(),
            ttts: HashMap::new(),
            next_ttt: 1,
            text_pending: None,
            text_partial: Vec::new(),
            text_continue: None,
            tmf_pending: HashMap::new(),
            ping: None,
            logout_pending: None,
            idle_since_ms: None,
            rx_activity: false,
            session_reserved: false,
            peer: None,
            local: None,
            pending_login: None,
        }
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// The negotiated parameters (RFC defaults until login completes).
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Tells the policy the initiator's address at login
    /// ([`Policy::reserve_session`]).
    #[must_use]
    pub fn with_peer(mut self, peer: std::net::IpAddr) -> Self {
        self.peer = Some(peer);
        self
    }

    /// Tells SendTargets the address the initiator reached this
    /// connection on: a portal on a wildcard address is announced with it.
    #[must_use]
    pub fn with_local(mut self, local: std::net::IpAddr) -> Self {
        self.local = Some(local);
        self
    }

    /// The target whose session place ([`Policy::reserve_session`]) this
    /// connection holds: given back by the caller when it ends.
    pub fn session_target(&self) -> Option<&str> {
        self.login.target.as_ref().filter(|_| self.session_reserved).map(|t| t.name.as_str())
    }

    /// The session type negotiated at login.
    pub fn session_type(&self) -> SessionType {
        self.login.session_type
    }

    /// Sets the epoch stamped on the commands that arrive from now on
    /// ([`Command::epoch`]); the upper layer's clock of task management
    /// across sessions, opaque here.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// Raises to `epoch` the stamp of each command not yet handed out
    /// (collecting its data, or an event not yet polled) for which
    /// `applies(lun, stamp)` holds: after a task management function of
    /// this session ended the tasks in its scope, the ones left on its
    /// LUNs arrived after it.
    pub fn restamp(&mut self, epoch: u64, applies: impl Fn(u64, u64) -> bool) {
        let queued = self.events.iter_mut().filter_map(|e| match e {
            Event::Command(c) => Some(c),
            _ => None,
        });
        for c in self.tasks.values_mut().filter_map(|t| t.cmd.as_mut()).chain(queued) {
            if applies(c.lun, c.epoch) {
                c.epoch = c.epoch.max(epoch);
            }
        }
    }

    /// (ExpCmdSN, MaxCmdSN) as the next PDU will carry them.
    pub fn cmd_window(&self) -> (u32, u32) {
        (self.exp_cmd_sn, self.max_cmd_sn)
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event<B>> {
        self.events.pop_front()
    }

    /// Whether bytes wait to be sent.
    pub fn has_transmit(&self) -> bool {
        !self.tx.is_empty()
    }

    /// How many bytes wait to be sent.
    pub fn transmit_len(&self) -> usize {
        block::transmit_len(&self.tx, &self.tx_zeros)
    }

    /// Moves every byte waiting to be sent to the end of `out`.
    pub fn take_transmit(&mut self, out: &mut Vec<u8>) {
        block::take_transmit(&mut self.tx, &mut self.tx_zeros, out);
    }

    /// As [`take_transmit`](Self::take_transmit), except that zeros queued
    /// by [`send_data_in_zeros`](Self::send_data_in_zeros) are not written:
    /// `zeros(at, len)` says that `len` zero bytes go before byte `at` of
    /// `out`.
    pub fn take_transmit_parts(&mut self, out: &mut Vec<u8>, zeros: impl FnMut(usize, usize)) {
        block::take_transmit_parts(&mut self.tx, &mut self.tx_zeros, out, zeros);
    }

    /// Feeds received bytes. Recoverable protocol errors are answered with
    /// a Reject and logged; a fatal one closes the connection and is
    /// returned (after the Reject, if any, is queued).
    ///
    /// PDUs are parsed where they lie in `bytes`; only a PDU cut by its
    /// end is kept (never more than one, at most one PDU's length), and the
    /// next input first completes it.
    pub fn handle_input(&mut self, mut bytes: &[u8]) -> Result<(), PduError> {
        if self.state == State::Closed {
            return Ok(());
        }
        self.rx_activity = true;
        while !self.rx.is_empty() {
            let want = match pdu::frame_len(&self.rx, self.rx_framing) {
                None => BHS_LEN,
                Some(Ok(len)) => len,
                // Refused whole: deframe says why.
                Some(Err(_)) => 0,
            };
            if self.rx.len() < want {
                if bytes.is_empty() {
                    return Ok(());
                }
                let (head, tail) = bytes.split_at(want.saturating_sub(self.rx.len()).min(bytes.len()));
                self.rx.extend_from_slice(head);
                bytes = tail;
                continue;
            }
            let rx = std::mem::take(&mut self.rx);
            self.rx_start = 0;
            let r = self.process_pdus(&rx);
            self.rx = rx;
            self.rx.clear();
            r?;
        }
        self.rx_start = 0;
        let r = self.process_pdus(bytes);
        if self.state != State::Closed {
            self.rx.extend_from_slice(bytes.get(self.rx_start..).unwrap_or_default());
        }
        r
    }

    fn process_pdus(&mut self, rx: &[u8]) -> Result<(), PduError> {
        while self.state != State::Closed {
            let buf = rx.get(self.rx_start..).unwrap_or_default();
            let (bhs, ahs, data, digest_ok, len) = match pdu::deframe(buf, self.rx_framing) {
                None => break,
                Some(Ok(f)) => (f.bhs, f.ahs, f.data, f.data_digest_ok, f.len),
                Some(Err(e)) => {
                    self.on_error(&e);
                    if e.is_fatal() {
                        return Err(e);
                    }
                    self.rx_start = self.rx_start.saturating_add(e.pdu_len.unwrap_or(BHS_LEN));
                    continue;
                }
            };
            self.rx_start = self.rx_start.saturating_add(len);
            if let Err(e) = self.dispatch(bhs, ahs, data, digest_ok) {
                self.on_error(&e);
                if e.is_fatal() {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn on_error(&mut self, e: &PduError) {
        log::warn!("iscsi: {e}");
        if self.state == State::AwaitLogin {
            // No Reject during login (RFC 7143 section 6.9): a PDU the
            // login cannot take ends it with a Login reject, "invalid
            // during login" for one that is no Login Request (RFC 7143,
            // Login Phase Start), then the connection closes.
            match e.bhs {
                Some(bhs) => self.refuse_login_pdu(&bhs, e.to_string()),
                None => self.state = State::Closed,
            }
            return;
        }
        match e.disposition {
            Disposition::Reject(r) => {
                if let Some(bhs) = e.bhs {
                    self.consume_cmd_sn(&bhs);
                }
                self.reject(r, e.bhs);
            }
            Disposition::RejectAndClose(r) => {
                self.reject(r, e.bhs);
                self.state = State::Closed;
            }
            Disposition::Close => self.state = State::Closed,
        }
    }

    /// A rejected command still used its CmdSN: advance past it so the
    /// window does not stall (the initiator ends the task on the Reject).
    fn consume_cmd_sn(&mut self, bhs: &Bhs) {
        let op = bhs.opcode();
        let is_cmd = matches!(op, Opcode::SCSI_CMD | Opcode::TASK_MGMT_REQ | Opcode::TEXT_REQ | Opcode::LOGOUT_REQ)
            || (op == Opcode::NOP_OUT && bhs.itt() != RESERVED_TAG);
        if is_cmd && !bhs.immediate() && bhs.cmd_sn() == self.exp_cmd_sn {
            self.max_cmd_sn = self.max_cmd_sn.wrapping_add(1);
            self.advance_exp_cmd_sn();
        }
    }

    fn reject(&mut self, reason: RejectReason, bhs: Option<Bhs>) {
        let mut r = Bhs::new(Opcode::REJECT);
        r.set_flags(flags::FINAL).set_byte2(reason.0).set_itt(RESERVED_TAG);
        self.stamp(&mut r, true);
        let echo = bhs.map(|b| b.0.to_vec()).unwrap_or_default();
        self.send(&r, &[], &echo);
    }

    /// Sets StatSN/ExpCmdSN/MaxCmdSN; `advance` consumes a StatSN.
    fn stamp(&mut self, b: &mut Bhs, advance: bool) {
        b.set_stat_sn(self.stat_sn).set_exp_cmd_sn(self.exp_cmd_sn).set_max_cmd_sn(self.max_cmd_sn);
        if advance {
            self.stat_sn = self.stat_sn.wrapping_add(1);
        }
    }

    fn send(&mut self, bhs: &Bhs, ahs: &[u8], data: &[u8]) {
        pdu::encode(&mut self.tx, bhs, ahs, data, self.tx_framing);
    }

    fn field_err(reason: RejectReason, field: &'static str, detail: String, bhs: &Bhs) -> PduError {
        PduError::new(Disposition::Reject(reason), field, detail, Some(*bhs))
    }

    fn dispatch(&mut self, bhs: Bhs, ahs: &[u8], data: &[u8], digest_ok: bool) -> Result<(), PduError> {
        let op = bhs.opcode();
        if self.state == State::AwaitLogin {
            if op != Opcode::LOGIN_REQ {
                return Err(PduError::new(
                    Disposition::Close,
                    "Opcode",
                    format!("opcode {:#04x} during login (expected Login Request)", op.0),
                    Some(bhs),
                ));
            }
            if !digest_ok {
                return Err(PduError::new(Disposition::Close, "DataDigest", "data digest error".into(), Some(bhs)));
            }
            if self.pending_login.is_some() {
                // RFC 7143 section 6.3: one login request at a time.
                return Err(PduError::new(
                    Disposition::Close,
                    "Opcode",
                    "Login Request while the last one waits for its answer".into(),
                    Some(bhs),
                ));
            }
            self.on_login(&bhs, data);
            return Ok(());
        }
        if !digest_ok && op != Opcode::DATA_OUT && op != Opcode::SCSI_CMD {
            // RFC 7143 section 7.8: reject and discard the PDU.
            return Err(Self::field_err(
                RejectReason::DATA_DIGEST_ERROR,
                "DataDigest",
                format!("data digest error on opcode {:#04x}", op.0),
                &bhs,
            ));
        }
        if self.logout_pending.is_some()
            && matches!(op, Opcode::SCSI_CMD | Opcode::TASK_MGMT_REQ | Opcode::TEXT_REQ | Opcode::LOGOUT_REQ)
        {
            // RFC 7143 11.14: after a Logout Request the initiator sends no
            // new request, a second Logout included; the first is still
            // answered once the tasks in flight are done.
            return Err(Self::field_err(
                RejectReason::WAITING_FOR_LOGOUT,
                "Opcode",
                "request after Logout Request".into(),
                &bhs,
            ));
        }
        match op {
            Opcode::NOP_OUT => self.on_nop_out(&bhs, data),
            Opcode::SCSI_CMD => self.on_scsi_cmd(&bhs, ahs, data, digest_ok),
            Opcode::DATA_OUT => self.on_data_out(&bhs, data, digest_ok),
            Opcode::TASK_MGMT_REQ => self.on_tmf(&bhs),
            Opcode::TEXT_REQ => self.on_text(&bhs, data),
            Opcode::LOGOUT_REQ => self.on_logout(&bhs),
            Opcode::LOGIN_REQ => Err(Self::field_err(
                RejectReason::PROTOCOL_ERROR,
                "Opcode",
                "Login Request in full feature phase".into(),
                &bhs,
            )),
            Opcode::SNACK_REQ => Err(Self::field_err(
                RejectReason::PROTOCOL_ERROR,
                "Opcode",
                "SNACK at ErrorRecoveryLevel 0".into(),
                &bhs,
            )),
            _ => Err(Self::field_err(
                RejectReason::COMMAND_NOT_SUPPORTED,
                "Opcode",
                format!("opcode {:#04x} not supported", op.0),
                &bhs,
            )),
        }
    }

    // ---- CmdSN window (RFC 7143 section 4.2.2.1) ----

    /// Whether a command PDU is delivered: immediate ones always; others
    /// only when CmdSN == ExpCmdSN (a single connection cannot fill a gap);
    /// anything else inside or outside the window is silently dropped.
    fn accept_cmd_sn(&mut self, bhs: &Bhs) -> bool {
        if bhs.immediate() {
            return true;
        }
        let sn = bhs.cmd_sn();
        if sn == self.exp_cmd_sn && sn_le(sn, self.max_cmd_sn) {
            self.advance_exp_cmd_sn();
            return true;
        }
        log::debug!("iscsi: dropping CmdSN {sn} (ExpCmdSN {}, MaxCmdSN {})", self.exp_cmd_sn, self.max_cmd_sn);
        false
    }

    /// ExpCmdSN moves past the command just received, and past each CmdSN
    /// after it that an ABORT TASK counted as received: those commands are
    /// over, so the window opens by one for each.
    fn advance_exp_cmd_sn(&mut self) {
        self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
        while let Some(pos) = self.aborted_sns.iter().position(|&sn| sn == self.exp_cmd_sn) {
            self.aborted_sns.swap_remove(pos);
            self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
            self.max_cmd_sn = self.max_cmd_sn.wrapping_add(1);
        }
    }

    /// A non-immediate command finished: open the window by one.
    fn retire(&mut self, immediate: bool) {
        if !immediate {
            self.max_cmd_sn = self.max_cmd_sn.wrapping_add(1);
        }
    }

    // ---- Login (RFC 7143 sections 6 and 11.12) ----

    fn on_login(&mut self, bhs: &Bhs, data: &[u8]) {
        if let Err((status, reason)) = self.login_step(bhs, data) {
            self.refuse_login(bhs, status, reason);
        }
    }

    /// Answers the login request `req` with a failure status and closes.
    fn refuse_login(&mut self, req: &Bhs, status: u16, reason: String) {
        log::info!("iscsi: login failed {status:#06x}: {reason}");
        let mut r = Bhs::new(Opcode::LOGIN_RESP);
        r.set_login_flags(false, false, req.csg(), Stage(0))
            .set_isid(req.isid())
            .set_itt(req.itt())
            .set_login_status(status);
        self.stamp(&mut r, true);
        self.send(&r, &[], &[]);
        self.events.push_back(Event::LoginFailed { status, reason });
        self.state = State::Closed;
    }

    /// Refuses the login because of PDU `bhs`, which may be no Login
    /// Request: the Login Response names the login's ISID (or the PDU's,
    /// when it is the first Login Request) and echoes the PDU's ITT. A
    /// final response still held for [`Self::admit_session`] is dropped.
    fn refuse_login_pdu(&mut self, bhs: &Bhs, reason: String) {
        let is_login = bhs.opcode() == Opcode::LOGIN_REQ;
        let status = if is_login { login_status::INITIATOR_ERROR } else { login_status::INVALID_DURING_LOGIN };
        let isid = match (self.login.started, is_login) {
            (true, _) => self.login.isid,
            (false, true) => bhs.isid(),
            (false, false) => [0; 6],
        };
        let mut req = Bhs::new(Opcode::LOGIN_REQ);
        req.set_login_flags(false, false, self.login.stage, Stage(0)).set_isid(isid).set_itt(bhs.itt());
        self.pending_login = None;
        self.refuse_login(&req, status, reason);
    }

    /// Sends the final Login Response held since [`Event::SessionPending`]
    /// and enters full feature phase ([`Event::LoggedIn`]); or refuses
    /// the login "out of resources" when [`Policy::reserve_session`] finds
    /// no room. Does nothing when no response is held.
    pub fn admit_session(&mut self) {
        let Some((r, resp)) = self.pending_login.take() else { return };
        if let Err((status, reason)) = self.finish_login(r, &resp) {
            self.refuse_login(&r, status, reason);
        }
    }

    /// Whether the final Login Response waits for
    /// [`TargetConnection::admit_session`].
    pub fn is_session_pending(&self) -> bool {
        self.pending_login.is_some()
    }

    /// Takes the session place, then sends the final Login Response `r`
    /// with text `resp` and enters full feature phase.
    fn finish_login(&mut self, mut r: Bhs, resp: &[u8]) -> Result<(), (u16, String)> {
        if let Some(info) = &self.login.target {
            self.policy
                .reserve_session(&info.name, self.peer)
                .map_err(|why| login_fail(login_status::OUT_OF_RESOURCES, why))?;
            self.session_reserved = true;
        }
        r.set_tsih(self.seed.tsih);
        self.stamp(&mut r, true);
        self.send(&r, &[], resp);
        self.login.stage = Stage::FULL_FEATURE;
        self.enter_full_feature();
        Ok(())
    }

    fn login_step(&mut self, bhs: &Bhs, data: &[u8]) -> Result<(), (u16, String)> {
        use login_status as ls;
        let transit = bhs.flags() & flags::TRANSIT != 0;
        let cont = bhs.flags() & flags::CONTINUE != 0;
        let (csg, nsg) = (bhs.csg(), bhs.nsg());
        if bhs.byte3() > 0 {
            return Err(login_fail(ls::UNSUPPORTED_VERSION, format!("Version-min {} (we speak 0)", bhs.byte3())));
        }
        if !self.login.started {
            if bhs.tsih() != 0 {
                return Err(login_fail(
                    ls::SESSION_DOES_NOT_EXIST,
                    format!("TSIH {:#x}: adding connections to a session is not supported", bhs.tsih()),
                ));
            }
            if csg != Stage::SECURITY && csg != Stage::OPERATIONAL {
                return Err(login_fail(ls::INITIATOR_ERROR, format!("first CSG {}", csg.0)));
            }
            self.login.started = true;
            self.login.stage = csg;
            self.login.isid = bhs.isid();
            self.login.cid = bhs.cid();
            self.exp_cmd_sn = bhs.cmd_sn();
            let window = self.cfg.queue_depth.min(self.cfg.max_tasks).max(1);
            self.max_cmd_sn = bhs.cmd_sn().wrapping_add(window).wrapping_sub(1);
        } else if bhs.isid() != self.login.isid || bhs.tsih() != 0 || bhs.cid() != self.login.cid {
            return Err(login_fail(ls::INITIATOR_ERROR, "ISID, TSIH or CID changed during login"));
        }
        if csg != self.login.stage {
            return Err(login_fail(ls::INITIATOR_ERROR, format!("CSG {} (expected {})", csg.0, self.login.stage.0)));
        }
        if transit && cont {
            return Err(login_fail(ls::INITIATOR_ERROR, "T and C both set"));
        }
        if transit && (nsg <= csg || nsg == Stage(2)) {
            return Err(login_fail(ls::INITIATOR_ERROR, format!("NSG {} after CSG {}", nsg.0, csg.0)));
        }
        if let Some(rest) = self.login.rest.take() {
            // RFC 7143 section 6.3: the initiator answers a Login Response
            // with C=1 with an empty Login Request, which gets the next
            // part. The last part moves on only if this request asks to.
            if cont || !data.is_empty() {
                return Err(login_fail(
                    ls::INITIATOR_ERROR,
                    format!("Login Request with {} bytes of text while the answer continues", data.len()),
                ));
            }
            let go = rest.go && transit && nsg == rest.nsg;
            return self.answer_login(bhs.itt(), csg, go, rest.nsg, rest.text);
        }
        if self.login.partial.len().saturating_add(data.len()) > self.cfg.max_text_len {
            return Err(login_fail(ls::INITIATOR_ERROR, "login text too long"));
        }
        self.login.partial.extend_from_slice(data);
        if cont {
            // RFC 7143 section 6.3: answer a continued request with an
            // empty response and wait for the rest.
            let mut r = Bhs::new(Opcode::LOGIN_RESP);
            r.set_login_flags(false, false, csg, Stage(0)).set_isid(self.login.isid).set_itt(bhs.itt());
            self.stamp(&mut r, true);
            self.send(&r, &[], &[]);
            return Ok(());
        }
        let text = std::mem::take(&mut self.login.partial);
        let pairs = text::parse(&text).map_err(|e| login_fail(ls::INITIATOR_ERROR, e.to_string()))?;
        for (k, _) in &pairs {
            self.login.seen_len = self.login.seen_len.saturating_add(k.len());
            if self.login.seen_len > self.cfg.max_text_len {
                return Err(login_fail(
                    ls::INITIATOR_ERROR,
                    format!("login keys over {} bytes in all requests", self.cfg.max_text_len),
                ));
            }
            if !self.login.seen.insert(k.clone()) {
                return Err(login_fail(ls::INITIATOR_ERROR, format!("key {k} sent twice")));
            }
        }
        let get = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        let mut resp = Vec::new();
        let first = self.login.initiator.is_empty();
        if first {
            let Some(initiator) = get("InitiatorName").filter(|s| !s.is_empty()) else {
                return Err(login_fail(ls::MISSING_PARAMETER, "no InitiatorName in the first Login Request"));
            };
            self.login.initiator = initiator.to_string();
            self.login.session_type = match get("SessionType").unwrap_or("Normal") {
                "Normal" => SessionType::Normal,
                "Discovery" => SessionType::Discovery,
                other => return Err(login_fail(ls::SESSION_TYPE_NOT_SUPPORTED, format!("SessionType={other}"))),
            };
            if self.login.session_type == SessionType::Normal {
                let Some(name) = get("TargetName").filter(|s| !s.is_empty()) else {
                    return Err(login_fail(ls::MISSING_PARAMETER, "no TargetName for a normal session"));
                };
                let Some(info) = self.policy.target(name) else {
                    return Err(login_fail(ls::NOT_FOUND, format!("target {name} not found")));
                };
                if !self.policy.initiator_allowed(&info.name, initiator) {
                    return Err(login_fail(
                        ls::AUTHORIZATION_FAILURE,
                        format!("{initiator} not allowed to {}", info.name),
                    ));
                }
                self.login.target = Some(info);
            }
        } else if get("InitiatorName").is_some() || get("TargetName").is_some() || get("SessionType").is_some() {
            return Err(login_fail(ls::INITIATOR_ERROR, "name keys after the first Login Request"));
        }
        if let (false, Some(info)) = (self.login.tpgt_sent, self.login.target.clone()) {
            // RFC 7143 section 13.9: declared in the first Login Response of
            // a normal session.
            text::push(&mut resp, "TargetPortalGroupTag", &info.tpgt.to_string());
            if let Some(alias) = &info.alias {
                text::push(&mut resp, "TargetAlias", alias);
            }
            self.login.tpgt_sent = true;
        }
        let mut negotiated = self.params;
        let mut auth_keys = Vec::new();
        let mut first_burst_answered = false;
        for (k, v) in &pairs {
            match k.as_str() {
                "AuthMethod" | "CHAP_A" | "CHAP_I" | "CHAP_C" | "CHAP_N" | "CHAP_R" => {
                    if csg != Stage::SECURITY {
                        return Err(login_fail(ls::INITIATOR_ERROR, format!("{k} outside security negotiation")));
                    }
                    auth_keys.push((k.as_str(), v.as_str()));
                }
                "InitiatorName" | "TargetName" | "SessionType" | "InitiatorAlias" => {}
                "TargetAlias" | "TargetPortalGroupTag" | "TargetAddress" => {
                    // Target-only keys (RFC 7143 section 13): Reject.
                    text::push(&mut resp, k, "Reject");
                }
                _ => {
                    let a = text::negotiate(k, v, &self.cfg.params, &mut negotiated, self.login.session_type);
                    first_burst_answered |= k == "FirstBurstLength" && matches!(a, text::Answer::Value(_));
                    if let Some(t) = a.text() {
                        text::push(&mut resp, k, t);
                    }
                }
            }
        }
        if csg == Stage::SECURITY {
            self.auth_step(&auth_keys, transit, &mut resp)?;
        } else if self.login.auth == Auth::NotStarted {
            // Skipped security negotiation.
            let target = self.login.target.as_ref().map(|t| t.name.clone());
            if self.policy.auth_required(target.as_deref(), &self.login.initiator) {
                return Err(login_fail(ls::AUTHENTICATION_FAILURE, "authentication required, security stage skipped"));
            }
            self.login.auth = Auth::Done;
        }
        if csg == Stage::OPERATIONAL && !self.login.declared {
            text::push(
                &mut resp,
                "MaxRecvDataSegmentLength",
                &self.cfg.params.max_recv_data_segment_length.to_string(),
            );
            self.login.declared = true;
        }
        let go = transit && self.login.auth == Auth::Done;
        if negotiated.first_burst_length > negotiated.max_burst_length {
            // RFC 7143 13.14: FirstBurstLength MUST NOT exceed
            // MaxBurstLength. Answered in this response, it is lowered
            // there (still a valid minimum of the offer). Answered in an
            // earlier one it can no longer change (section 6.2): the
            // initiator offered a MaxBurstLength below the
            // FirstBurstLength it asked for, and lowering it unsaid would
            // leave the two sides with different values. Left at its
            // default, a later request may still offer it; if none has by
            // the end of the login, the default stands against a smaller
            // MaxBurstLength. Either is refused only while it matters: with
            // InitialR2T=Yes and ImmediateData=No no data comes unasked and
            // FirstBurstLength is irrelevant (section 13.14).
            let unasked_data = !negotiated.initial_r2t || negotiated.immediate_data;
            let stuck = if first_burst_answered {
                negotiated.first_burst_length = negotiated.max_burst_length;
                text::replace(&mut resp, "FirstBurstLength", &negotiated.first_burst_length.to_string());
                false
            } else {
                unasked_data && (self.login.first_burst_agreed || (go && nsg == Stage::FULL_FEATURE))
            };
            if stuck {
                return Err(login_fail(
                    ls::INITIATOR_ERROR,
                    format!(
                        "MaxBurstLength {} below FirstBurstLength {} already in force",
                        negotiated.max_burst_length, negotiated.first_burst_length
                    ),
                ));
            }
        }
        self.login.first_burst_agreed |= first_burst_answered;
        self.params = negotiated;
        self.answer_login(bhs.itt(), csg, go, nsg, resp)
    }

    /// Sends the answer `resp` to the Login Request `itt`; `go` when it
    /// moves the login on to `nsg`. An answer longer than one Login
    /// Response may carry goes in parts, and only its last part moves on.
    fn answer_login(
        &mut self,
        itt: u32,
        csg: Stage,
        go: bool,
        nsg: Stage,
        mut resp: Vec<u8>,
    ) -> Result<(), (u16, String)> {
        let mut r = Bhs::new(Opcode::LOGIN_RESP);
        r.set_isid(self.login.isid).set_itt(itt);
        let cut = text_cut(&resp, LOGIN_MAX_DATA_SEGMENT);
        if cut < resp.len() {
            let text = resp.split_off(cut);
            self.login.rest = Some(LoginRest { text, go, nsg });
            r.set_login_flags(false, true, csg, Stage(0));
            self.stamp(&mut r, true);
            self.send(&r, &[], &resp);
            return Ok(());
        }
        r.set_login_flags(go, false, csg, if go { nsg } else { Stage(0) });
        if go && nsg == Stage::FULL_FEATURE {
            if let (Some(info), true) = (&self.login.target, self.policy.admits_sessions()) {
                self.events.push_back(Event::SessionPending {
                    initiator: self.login.initiator.clone(),
                    target: info.name.clone(),
                    isid: self.login.isid,
                });
                self.pending_login = Some((r, resp));
                return Ok(());
            }
            return self.finish_login(r, &resp);
        }
        self.stamp(&mut r, true);
        self.send(&r, &[], &resp);
        if go {
            self.login.stage = nsg;
        }
        Ok(())
    }

    fn auth_step(&mut self, keys: &[(&str, &str)], transit: bool, resp: &mut Vec<u8>) -> Result<(), (u16, String)> {
        use login_status as ls;
        let get = |key: &str| keys.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let target = self.login.target.as_ref().map(|t| t.name.clone());
        let target = target.as_deref();
        let initiator = self.login.initiator.clone();
        if self.login.auth == Auth::NotStarted {
            let required = self.policy.auth_required(target, &initiator);
            match get("AuthMethod") {
                Some(list) => {
                    let offered: Vec<&str> = list.split(',').collect();
                    let chosen = if required {
                        offered.iter().find(|m| **m == "CHAP")
                    } else {
                        offered.iter().find(|m| **m == "None" || **m == "CHAP")
                    };
                    match chosen {
                        Some(&"CHAP") => {
                            text::push(resp, "AuthMethod", "CHAP");
                            self.login.auth = Auth::AwaitChapA;
                        }
                        Some(_) => {
                            text::push(resp, "AuthMethod", "None");
                            self.login.auth = Auth::Done;
                        }
                        None => {
                            return Err(login_fail(
                                ls::AUTHENTICATION_FAILURE,
                                format!("AuthMethod={list} unacceptable"),
                            ))
                        }
                    }
                }
                None if transit => {
                    if required {
                        return Err(login_fail(ls::AUTHENTICATION_FAILURE, "authentication required, none offered"));
                    }
                    self.login.auth = Auth::Done;
                }
                None => {}
            }
            if get("CHAP_A").is_none() {
                return Ok(());
            }
        }
        match self.login.auth {
            Auth::NotStarted | Auth::Done => {
                if keys.iter().any(|(k, _)| k.starts_with("CHAP_")) {
                    return Err(login_fail(ls::INITIATOR_ERROR, "CHAP keys without AuthMethod=CHAP"));
                }
                Ok(())
            }
            Auth::AwaitChapA => {
                let Some(offer) = get("CHAP_A") else {
                    return Ok(());
                };
                let Some(alg) = chap::choose(offer, &self.cfg.chap_algorithms) else {
                    return Err(login_fail(ls::AUTHENTICATION_FAILURE, format!("CHAP_A={offer}: none supported")));
                };
                let n = alg.digest_len().unwrap_or(16).min(self.seed.chap_challenge.len());
                let challenge = self.seed.chap_challenge.get(..n).unwrap_or_default();
                text::push(resp, "CHAP_A", &alg.0.to_string());
                text::push(resp, "CHAP_I", &self.seed.chap_id.to_string());
                text::push(resp, "CHAP_C", &chap::encode_hex(challenge));
                self.login.auth = Auth::AwaitChapResponse(alg);
                Ok(())
            }
            Auth::AwaitChapResponse(alg) => {
                let (Some(user), Some(r)) = (get("CHAP_N"), get("CHAP_R")) else {
                    return Err(login_fail(ls::AUTHENTICATION_FAILURE, "CHAP_N/CHAP_R missing"));
                };
                let Some(secret) = self.policy.chap_secret(target, &initiator, user) else {
                    return Err(login_fail(ls::AUTHENTICATION_FAILURE, format!("no CHAP secret for user {user}")));
                };
                let n = alg.digest_len().unwrap_or(16).min(self.seed.chap_challenge.len());
                let challenge = self.seed.chap_challenge.get(..n).unwrap_or_default().to_vec();
                let want = alg.response(self.seed.chap_id, &secret.0, &challenge).unwrap_or_default();
                let got = chap::decode_binary(r).unwrap_or_default();
                if !chap::constant_time_eq(&want, &got) {
                    return Err(login_fail(
                        ls::AUTHENTICATION_FAILURE,
                        format!("CHAP_R of user {user} does not match"),
                    ));
                }
                match (get("CHAP_I"), get("CHAP_C")) {
                    (None, None) => {}
                    (Some(id), Some(c)) => {
                        // A number, decimal or hex (RFC 7143 sections 6.1, 12.1.3).
                        let id = text::parse_num(id)
                            .and_then(|n| u8::try_from(n).ok())
                            .ok_or_else(|| login_fail(ls::AUTHENTICATION_FAILURE, format!("CHAP_I={id} invalid")))?;
                        let their = chap::decode_binary(c)
                            .filter(|c| c.len() <= 1024)
                            .ok_or_else(|| login_fail(ls::AUTHENTICATION_FAILURE, "CHAP_C invalid"))?;
                        if their == challenge {
                            return Err(login_fail(ls::AUTHENTICATION_FAILURE, "mutual CHAP challenge reflected"));
                        }
                        let Some((name, tsecret)) = self.policy.target_credentials(target, &initiator) else {
                            return Err(login_fail(ls::AUTHENTICATION_FAILURE, "mutual CHAP asked, no target secret"));
                        };
                        if tsecret == secret {
                            // RFC 7143 section 12.1.3: the two directions
                            // must not share a secret.
                            return Err(login_fail(ls::AUTHENTICATION_FAILURE, "target and initiator secrets equal"));
                        }
                        let resp_bytes = alg.response(id, &tsecret.0, &their).unwrap_or_default();
                        text::push(resp, "CHAP_N", &name);
                        text::push(resp, "CHAP_R", &chap::encode_hex(&resp_bytes));
                    }
                    _ => return Err(login_fail(ls::AUTHENTICATION_FAILURE, "CHAP_I without CHAP_C or the reverse")),
                }
                self.login.auth = Auth::Done;
                Ok(())
            }
        }
    }

    fn enter_full_feature(&mut self) {
        // Our MaxRecvDataSegmentLength holds only if we declared it;
        // digests start with the first PDU after the final Login Response.
        let rx_mrdsl = if self.login.declared { self.cfg.params.max_recv_data_segment_length } else { 8192 };
        self.params.max_recv_data_segment_length = rx_mrdsl;
        self.rx_framing = Framing {
            header_digest: self.params.header_digest,
            data_digest: self.params.data_digest,
            max_data_segment: rx_mrdsl,
        };
        self.tx_framing = Framing {
            header_digest: self.params.header_digest,
            data_digest: self.params.data_digest,
            max_data_segment: self.params.peer_max_recv_data_segment_length,
        };
        self.state = State::FullFeature;
        self.events.push_back(Event::LoggedIn {
            initiator: self.login.initiator.clone(),
            target: self.login.target.as_ref().map(|t| t.name.clone()),
            session_type: self.login.session_type,
            isid: self.login.isid,
            tsih: self.seed.tsih,
            params: self.params,
        });
    }

    // ---- NOP (RFC 7143 sections 11.18, 11.19) ----

    fn on_nop_out(&mut self, bhs: &Bhs, data: &[u8]) -> Result<(), PduError> {
        // A TTT answers our ping, whatever the ITT: a valid ITT only asks
        // for a NOP-In besides (RFC 7143 section 11.18).
        if bhs.ttt() != RESERVED_TAG {
            if self.ping.as_ref().is_some_and(|p| p.ttt == bhs.ttt()) {
                self.ping = None;
            } else {
                log::debug!("iscsi: NOP-Out for unknown TTT {:#x}", bhs.ttt());
            }
        }
        if bhs.itt() == RESERVED_TAG {
            // An answer to our ping, or a ping that wants no answer.
            return Ok(());
        }
        if !self.accept_cmd_sn(bhs) {
            return Ok(());
        }
        // RFC 7143 11.18.5: the reflected data is limited to the
        // initiator's MaxRecvDataSegmentLength, which may be smaller than
        // ours (what the ping could carry).
        let max = self.params.peer_max_recv_data_segment_length.max(512) as usize;
        if data.len() > max {
            log::debug!("iscsi: NOP-Out ping data of {} bytes echoed as its first {max}", data.len());
        }
        let echo = data.get(..data.len().min(max)).unwrap_or_default();
        let mut r = Bhs::new(Opcode::NOP_IN);
        r.set_flags(flags::FINAL).set_lun(bhs.lun()).set_itt(bhs.itt()).set_ttt(RESERVED_TAG);
        self.retire(bhs.immediate());
        self.stamp(&mut r, true);
        self.send(&r, &[], echo);
        Ok(())
    }

    /// Asks the initiator to log out within `seconds` (an Asynchronous
    /// Message, AsyncEvent 1, RFC 7143 section 11.9.1): the target is
    /// going away and will drop the connection after that. `false` (and
    /// nothing sent) unless this is a logged-in normal session; a
    /// discovery session or a login in progress has nothing to log out.
    pub fn request_logout(&mut self, seconds: u16) -> bool {
        if self.state != State::FullFeature || self.login.session_type != SessionType::Normal {
            return false;
        }
        let mut r = Bhs::new(Opcode::ASYNC_MSG);
        r.set_flags(flags::FINAL).set_itt(RESERVED_TAG).set_async_event(async_event::REQUEST_LOGOUT, [0, 0, seconds]);
        // An Asynchronous Message is status: it consumes a StatSN.
        self.stamp(&mut r, true);
        self.send(&r, &[], &[]);
        true
    }

    /// Advances the clock: sends a NOP-In ping after `nop_interval_ms` of
    /// silence and reports [`Event::Dead`] when one goes unanswered for
    /// `nop_timeout_ms`.
    pub fn on_tick(&mut self, now_ms: u64) {
        if self.state != State::FullFeature {
            return;
        }
        if std::mem::take(&mut self.rx_activity) || self.idle_since_ms.is_none() {
            self.idle_since_ms = Some(now_ms);
        }
        if let Some(p) = &self.ping {
            if now_ms.saturating_sub(p.sent_ms) >= self.cfg.nop_timeout_ms {
                log::warn!("iscsi: initiator {} did not answer NOP-In ping", self.login.initiator);
                self.events.push_back(Event::Dead);
                self.state = State::Closed;
            }
            return;
        }
        let Some(interval) = self.cfg.nop_interval_ms else { return };
        if now_ms.saturating_sub(self.idle_since_ms.unwrap_or(now_ms)) >= interval {
            let ttt = self.alloc_ttt();
            let mut r = Bhs::new(Opcode::NOP_IN);
            r.set_flags(flags::FINAL).set_itt(RESERVED_TAG).set_ttt(ttt);
            // A ping does not advance StatSN (RFC 7143 section 11.19.4).
            self.stamp(&mut r, false);
            self.send(&r, &[], &[]);
            self.ping = Some(Ping { ttt, sent_ms: now_ms });
        }
    }

    /// When [`Self::on_tick`] next has something to do, in ms.
    pub fn poll_timeout(&self) -> Option<u64> {
        if self.state != State::FullFeature {
            return None;
        }
        if let Some(p) = &self.ping {
            return Some(p.sent_ms.saturating_add(self.cfg.nop_timeout_ms));
        }
        let idle = self.idle_since_ms?;
        self.cfg.nop_interval_ms.map(|i| idle.saturating_add(i))
    }

    fn alloc_ttt(&mut self) -> u32 {
        loop {
            let t = self.next_ttt;
            self.next_ttt = self.next_ttt.wrapping_add(1);
            if t != RESERVED_TAG && !self.ttts.contains_key(&t) {
                return t;
            }
        }
    }

    // ---- SCSI Command and write data (RFC 7143 sections 11.3, 11.7, 11.8) ----

    /// Files a new task. The first one sizes the map for the command window
    /// (at most 64, and a few immediate commands) at once, so that it does
    /// not grow by rehashing under load; an idle session holds none of it.
    fn insert_task(&mut self, itt: u32, task: Task<B>) {
        if self.tasks.capacity() == 0 {
            let window = self.cfg.queue_depth.min(self.cfg.max_tasks).clamp(1, 64) as usize;
            self.tasks.reserve(window.saturating_add(16));
        }
        self.tasks.insert(itt, task);
    }

    fn on_scsi_cmd(&mut self, bhs: &Bhs, ahs: &[u8], data: &[u8], digest_ok: bool) -> Result<(), PduError> {
        if self.login.session_type == SessionType::Discovery {
            return Err(Self::field_err(
                RejectReason::PROTOCOL_ERROR,
                "Opcode",
                "SCSI Command in a discovery session".into(),
                bhs,
            ));
        }
        let itt = bhs.itt();
        let f = bhs.flags();
        let (read, write) = (f & flags::READ != 0, f & flags::WRITE != 0);
        let edtl = bhs.expected_data_transfer_length();
        let mut cdb = Cdb { short: [0; 16], long: Vec::new() };
        if let (Some(dst), Some(src)) = (cdb.short.get_mut(..), bhs.cdb().get(..16)) {
            dst.copy_from_slice(src);
        }
        let mut bidi_read_len = None;
        for (ty, body) in ahs_entries(ahs) {
            match ty {
                ahs_type::EXTENDED_CDB => {
                    if cdb.long.is_empty() {
                        cdb.long.extend_from_slice(&cdb.short);
                    }
                    cdb.long.extend_from_slice(body.get(1..).unwrap_or_default());
                }
                ahs_type::BIDI_READ_LENGTH => {
                    let mut w = [0u8; 4];
                    if let Some(s) = body.get(1..5) {
                        w.copy_from_slice(s);
                    }
                    bidi_read_len = Some(u32::from_be_bytes(w));
                }
                _ => {}
            }
        }
        if !self.accept_cmd_sn(bhs) {
            return Ok(());
        }
        let bad =
            |field: &'static str, detail: String| Self::field_err(RejectReason::PROTOCOL_ERROR, field, detail, bhs);
        if self.itt_in_use(itt) || itt == RESERVED_TAG {
            self.retire(bhs.immediate());
            return Err(Self::field_err(
                RejectReason::TASK_IN_PROGRESS,
                "InitiatorTaskTag",
                format!("ITT {itt:#x} already in use"),
                bhs,
            ));
        }
        let problem = if !data.is_empty() && !write {
            Some(bad("DataSegmentLength", format!("{} bytes of immediate data without the W bit", data.len())))
        } else if !data.is_empty() && !self.params.immediate_data {
            Some(bad("DataSegmentLength", "immediate data with ImmediateData=No".into()))
        } else if u32::try_from(data.len()).map_or(true, |n| n > edtl) {
            Some(bad("DataSegmentLength", format!("{} bytes of data, expected length {edtl}", data.len())))
        } else if data.len() > self.params.first_burst_length as usize {
            Some(bad("DataSegmentLength", format!("{} bytes beyond FirstBurstLength", data.len())))
        } else if f & flags::FINAL == 0 && (!write || self.params.initial_r2t) {
            Some(bad("Flags", "F bit clear but no unsolicited data may follow".into()))
        } else if f & flags::FINAL == 0 && data.len() as u64 >= u64::from(self.params.first_burst_length.min(edtl)) {
            // F=0 announces unsolicited Data-Out, but the immediate data
            // already fills the first burst (or the whole transfer): none
            // may follow, and the write would wait for ever.
            Some(bad(
                "Flags",
                format!(
                    "F bit clear but the {} bytes of immediate data end the first burst ({} bytes)",
                    data.len(),
                    self.params.first_burst_length.min(edtl)
                ),
            ))
        } else if write && edtl > self.cfg.max_write_len {
            Some(Self::field_err(
                RejectReason::OUT_OF_RESOURCES,
                "ExpectedDataTransferLength",
                format!("write of {edtl} bytes exceeds {}", self.cfg.max_write_len),
                bhs,
            ))
        } else {
            None
        };
        if let Some(e) = problem {
            self.retire(bhs.immediate());
            if write && f & flags::FINAL == 0 {
                // The rejected command is discarded with the unsolicited
                // Data-Out already on its way (RFC 7143 section 7.2: no
                // further answer for a command rejected whole): that data
                // is dropped, not rejected PDU by PDU.
                self.forget_itt(itt);
            }
            return Err(e);
        }
        if self.open_count() >= self.cfg.max_tasks as usize {
            let why = format!("{} tasks open, the session's limit", self.cfg.max_tasks);
            let follows = (write && f & flags::FINAL == 0).then_some(data.len());
            return self.refuse_task(bhs, follows, &why);
        }
        let unsolicited = f & flags::FINAL == 0;
        let received = u32::try_from(data.len()).unwrap_or(0);
        // All of its data in this PDU: handed to the SCSI layer in this
        // call, so its buffer is never held waiting and takes no budget.
        let complete = received >= edtl && !unsolicited;
        if write && edtl > 0 && !complete && (received > 0 || unsolicited) && !self.budget_allows(edtl) {
            // Data comes unasked (immediate, or unsolicited Data-Out to
            // follow) and the write budget has no room for the buffer it
            // needs: refused as a command past the task limit is, its
            // unsolicited data dropped (an immediate command, which the
            // CmdSN window does not bound either, is rejected). The budget
            // bounds every write buffer a connection holds, whatever a
            // peer announces.
            let why = format!(
                "write of {edtl} bytes bringing data unasked with {} of the write budget's {} bytes held",
                self.write_held, self.cfg.write_budget
            );
            return self.refuse_task(bhs, unsolicited.then_some(data.len()), &why);
        }
        let read_expected = match (read, write) {
            (true, true) => bidi_read_len.unwrap_or(0),
            (true, false) => edtl,
            _ => 0,
        };
        let serial = self.next_serial;
        self.next_serial = serial.wrapping_add(1);
        self.aborted_itts.retain(|&a| a != itt);
        let mut cmd = Command {
            task: TaskRef { itt, serial },
            lun: bhs.lun(),
            cdb,
            expected_len: edtl,
            bidi_read_len,
            read,
            write,
            attr: f & flags::ATTR_MASK,
            immediate: bhs.immediate(),
            data: None,
            epoch: self.epoch,
        };
        let mut task = Task::new(serial, bhs, read_expected, read && write, None);
        if !write || edtl == 0 {
            if write {
                // W=1 with EDTL 0 (RFC 7143 section 11.3.1 allows it): a
                // write of no bytes; nothing is solicited.
                cmd.data = Some(B::alloc(0));
            }
            self.insert_task(itt, task);
            self.events.push_back(Event::Command(cmd));
            return Ok(());
        }
        // A write bringing data unasked has room in the budget (checked
        // above); one that does not waits for room before its R2Ts
        // (`advance_write`).
        let (buf, budgeted) = if complete {
            (Some(B::alloc(edtl as usize)), false)
        } else if self.budget_allows(edtl) {
            self.write_held = self.write_held.saturating_add(u64::from(edtl));
            (Some(B::alloc(edtl as usize)), true)
        } else {
            (None, false)
        };
        let unsol_end = self.params.first_burst_length.min(edtl);
        task.write = Some(WriteState {
            digest_failed: !digest_ok && !data.is_empty(),
            ..WriteState::new(buf, budgeted, received, unsolicited, unsol_end)
        });
        if let Some(w) = task.write.as_mut() {
            if let Some(dst) = w.buf.as_mut().and_then(|b| b.as_mut().get_mut(..data.len())) {
                dst.copy_from_slice(data);
            }
        }
        task.cmd = Some(cmd);
        self.insert_task(itt, task);
        if !digest_ok && !data.is_empty() {
            self.reject(RejectReason::DATA_DIGEST_ERROR, Some(*bhs));
        }
        self.advance_write(itt);
        Ok(())
    }

    /// Sends R2Ts while allowed, or delivers the command once all data is in.
    fn advance_write(&mut self, itt: u32) {
        let mbl = self.params.max_burst_length.max(512);
        let max_out = usize::from(self.params.max_outstanding_r2t.max(1));
        let mut r2ts = Vec::new();
        let Some(task) = self.tasks.get_mut(&itt) else { return };
        if task.aborting {
            return;
        }
        let edtl = task.expected_len;
        let lun = task.lun;
        let me = TaskRef { itt, serial: task.serial };
        let refused = task.refused;
        let Some(w) = task.write.as_mut() else { return };
        if w.unsolicited {
            return;
        }
        if let Some(status) = refused {
            // Its unsolicited data is all in: the status can go now.
            self.send_response(me, status, None, None);
            return;
        }
        if w.buf.is_none() {
            // R2Ts ask for data only into a buffer the budget has room for.
            if !fits_budget(self.write_held, self.cfg.write_budget, edtl) {
                if !w.waiting {
                    w.waiting = true;
                    self.write_waiting.push_back(me);
                }
                return;
            }
            w.buf = Some(B::alloc(edtl as usize));
            w.budgeted = true;
            w.waiting = false;
            self.write_held = self.write_held.saturating_add(u64::from(edtl));
        }
        while w.r2ts.len().saturating_add(r2ts.len()) < max_out && w.next_r2t < edtl {
            let len = edtl.saturating_sub(w.next_r2t).min(mbl);
            r2ts.push((w.next_r2t, len));
            w.next_r2t = w.next_r2t.saturating_add(len);
        }
        let complete = w.r2ts.is_empty() && r2ts.is_empty() && w.received >= edtl;
        for (offset, len) in r2ts {
            let ttt = self.alloc_ttt();
            self.ttts.insert(ttt, itt);
            let Some(task) = self.tasks.get_mut(&itt) else { return };
            let r2t_sn = task.sn;
            task.sn = task.sn.wrapping_add(1);
            if let Some(w) = task.write.as_mut() {
                w.r2ts.push(R2tState { ttt, offset, len, next: offset, data_sn: 0 });
            }
            let mut r = Bhs::new(Opcode::R2T);
            r.set_flags(flags::FINAL)
                .set_lun(lun)
                .set_itt(itt)
                .set_ttt(ttt)
                .set_data_sn(r2t_sn)
                .set_buffer_offset(offset)
                .set_residual_count(len);
            self.stamp(&mut r, false);
            self.send(&r, &[], &[]);
        }
        if complete {
            let Some(task) = self.tasks.get_mut(&itt) else { return };
            let Some(w) = task.write.take() else { return };
            if w.digest_failed {
                // ErrorRecoveryLevel 0 cannot ask for the data again: end
                // the command with ABORTED COMMAND / PROTOCOL SERVICE CRC
                // ERROR (SPC-4 ASC 0x47 ASCQ 0x05).
                task.cmd = None;
                let me = TaskRef { itt, serial: task.serial };
                self.send_response(me, scsi_status::CHECK_CONDITION, Some(&aborted_command_sense(0x47, 0x05)), None);
                return;
            }
            if let Some(mut cmd) = task.cmd.take() {
                cmd.data = w.buf;
                self.events.push_back(Event::Command(cmd));
            }
            if w.budgeted {
                self.release_write_budget(u64::from(edtl));
            }
        }
    }

    /// Whether a write buffer of `len` bytes fits the budget now.
    fn budget_allows(&self, len: u32) -> bool {
        fits_budget(self.write_held, self.cfg.write_budget, len)
    }

    /// A budgeted write buffer of `len` bytes left the connection: the
    /// writes waiting for room get their buffers (and R2Ts) in order.
    fn release_write_budget(&mut self, len: u64) {
        self.write_held = self.write_held.saturating_sub(len);
        while let Some(next) = self.write_waiting.front().copied() {
            let Some(w) = self.task_mut(next).and_then(|t| t.write.as_mut()) else {
                self.write_waiting.pop_front();
                continue;
            };
            if w.buf.is_some() || !w.waiting {
                self.write_waiting.pop_front();
                continue;
            }
            let edtl = self.task_mut(next).map_or(0, |t| t.expected_len);
            if !self.budget_allows(edtl) {
                return;
            }
            self.write_waiting.pop_front();
            if let Some(w) = self.task_mut(next).and_then(|t| t.write.as_mut()) {
                w.waiting = false;
            }
            self.advance_write(next.itt);
        }
    }

    /// Whether `itt` names an open task: a SCSI command or a task
    /// management request not yet answered. A new request may not take it
    /// (RFC 7143 section 11.17.1, "Task in progress").
    fn itt_in_use(&self, itt: u32) -> bool {
        self.tasks.contains_key(&itt) || self.tmf_pending.contains_key(&itt)
    }

    /// Tasks open in the session: SCSI commands and task management
    /// requests not yet answered.
    fn open_count(&self) -> usize {
        self.tasks.len().saturating_add(self.tmf_pending.len())
    }

    /// Answers a SCSI command the session cannot take now (`why`: past
    /// `max_tasks`, or no write budget for the data it brings): an
    /// immediate one is rejected (RFC 7143 section 3.2.2.1 lets a target
    /// refuse immediate commands it cannot take), a numbered one, which
    /// used its place in the window, ends with TASK SET FULL. Data-Out that
    /// follows for it is dropped. `unsolicited` holds the bytes of
    /// immediate data of a command whose unsolicited Data-Out follows: a
    /// numbered one is answered only after the last of it.
    fn refuse_task(&mut self, bhs: &Bhs, unsolicited: Option<usize>, why: &str) -> Result<(), PduError> {
        if bhs.immediate() {
            if unsolicited.is_some() {
                self.forget_itt(bhs.itt());
            }
            return Err(Self::field_err(
                RejectReason::IMMEDIATE_COMMAND_REJECT,
                "Immediate",
                format!("immediate command refused: {why}"),
                bhs,
            ));
        }
        log::warn!("iscsi: ITT {:#x} answered TASK SET FULL: {why}", bhs.itt());
        if let Some(received) = unsolicited {
            self.hold_refused(bhs, u32::try_from(received).unwrap_or(u32::MAX), scsi_status::TASK_SET_FULL);
            return Ok(());
        }
        let mut r = Bhs::new(Opcode::SCSI_RESP);
        r.set_flags(flags::FINAL).set_byte3(scsi_status::TASK_SET_FULL).set_itt(bhs.itt());
        self.retire(false);
        self.stamp(&mut r, true);
        self.send(&r, &[], &[]);
        Ok(())
    }

    /// Files refused command `bhs`, which brought `received` bytes of
    /// immediate data and announced unsolicited Data-Out, as a task that
    /// takes and drops that data and is answered `status` once the
    /// initiator has sent the last of it: a target that has a status for a
    /// command while data from the initiator is still expected waits for
    /// the Data-Out with the F bit (RFC 7143 section 11.4.2). It holds no
    /// buffer, and its place in the CmdSN window until it is answered.
    fn hold_refused(&mut self, bhs: &Bhs, received: u32, status: u8) {
        let itt = bhs.itt();
        let edtl = bhs.expected_data_transfer_length();
        let serial = self.next_serial;
        self.next_serial = serial.wrapping_add(1);
        self.aborted_itts.retain(|&a| a != itt);
        let mut task = Task::new(serial, bhs, 0, false, Some(status));
        let unsol_end = self.params.first_burst_length.min(edtl);
        task.write = Some(WriteState::new(None, false, received, true, unsol_end));
        self.insert_task(itt, task);
    }

    /// Ends the write `itt` whose data can never be whole, unless it is
    /// refused or being aborted (which answer it themselves): CHECK
    /// CONDITION, ABORTED COMMAND with `asc`/`ascq`, and whatever Data-Out
    /// still comes for it is dropped. Whether it ended it.
    fn end_write_early(&mut self, itt: u32, asc: u8, ascq: u8) -> bool {
        let Some(task) = self.tasks.get(&itt) else { return false };
        if task.refused.is_some() || task.aborting {
            return false;
        }
        let me = TaskRef { itt, serial: task.serial };
        self.send_response(me, scsi_status::CHECK_CONDITION, Some(&aborted_command_sense(asc, ascq)), None);
        self.forget_itt(itt);
        true
    }

    /// Remembers that Data-Out for `itt` is to be dropped silently.
    fn forget_itt(&mut self, itt: u32) {
        if self.aborted_itts.len() >= ABORTED_ITTS_KEPT {
            self.aborted_itts.pop_front();
        }
        self.aborted_itts.push_back(itt);
    }

    fn on_data_out(&mut self, bhs: &Bhs, data: &[u8], digest_ok: bool) -> Result<(), PduError> {
        let itt = bhs.itt();
        let ttt = bhs.ttt();
        let invalid =
            |field: &'static str, detail: String| Self::field_err(RejectReason::INVALID_PDU_FIELD, field, detail, bhs);
        let Some(task) = self.tasks.get_mut(&itt) else {
            if self.aborted_itts.contains(&itt) {
                return Ok(());
            }
            return Err(invalid("InitiatorTaskTag", format!("Data-Out for unknown ITT {itt:#x}")));
        };
        let Some(w) = task.write.as_mut() else {
            return Err(invalid("InitiatorTaskTag", format!("Data-Out for ITT {itt:#x} which expects no data")));
        };
        let offset = bhs.buffer_offset();
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let end = offset.saturating_add(len);
        let final_bit = bhs.final_bit();
        let data_sn = bhs.data_sn();
        let seq_done;
        let mut short_burst = false;
        if ttt == RESERVED_TAG {
            if !w.unsolicited {
                return Err(invalid("TargetTransferTag", "unsolicited Data-Out outside the first burst".into()));
            }
            if offset != w.unsol_next {
                return Err(invalid("BufferOffset", format!("offset {offset} (expected {})", w.unsol_next)));
            }
            if end > w.unsol_end {
                return Err(invalid(
                    "DataSegmentLength",
                    format!("data to {end} beyond the first burst {}", w.unsol_end),
                ));
            }
            if data_sn != w.unsol_data_sn {
                return Err(invalid("DataSN", format!("DataSN {data_sn} (expected {})", w.unsol_data_sn)));
            }
            if end == w.unsol_end && !final_bit {
                // RFC 7143 section 11.7.1: the last PDU of the unsolicited
                // data has the F bit. The initiator sends nothing more for
                // this burst all the same, so, as at the end of an R2T's
                // burst, the write can never be whole: it ends in CHECK
                // CONDITION, ABORTED COMMAND, DATA PHASE ERROR (4Bh/00h)
                // rather than wait for ever, and a refused one gets its
                // status now. A write that a pending task management
                // request holds back is left to it; should that request
                // leave it running, R2Ts ask for the rest from here.
                w.unsolicited = false;
                w.next_r2t = offset;
                if !self.end_write_early(itt, 0x4b, 0x00) {
                    self.advance_write(itt);
                }
                return Err(Self::field_err(
                    RejectReason::PROTOCOL_ERROR,
                    "Flags",
                    format!("unsolicited burst complete at {end} without the F bit"),
                    bhs,
                ));
            }
            w.unsol_next = end;
            w.unsol_data_sn = w.unsol_data_sn.wrapping_add(1);
            seq_done = final_bit;
            if final_bit {
                w.unsolicited = false;
                w.next_r2t = end;
                short_burst = end < w.unsol_end;
            }
        } else {
            if self.ttts.get(&ttt) != Some(&itt) {
                return Err(invalid("TargetTransferTag", format!("TTT {ttt:#x} matches no R2T of ITT {itt:#x}")));
            }
            let Some(pos) = w.r2ts.iter().position(|r| r.ttt == ttt) else {
                return Err(invalid("TargetTransferTag", format!("TTT {ttt:#x} not outstanding")));
            };
            let Some(r) = w.r2ts.get_mut(pos) else { return Ok(()) };
            let r_end = r.offset.saturating_add(r.len);
            if offset != r.next {
                return Err(invalid("BufferOffset", format!("offset {offset} (expected {})", r.next)));
            }
            if end > r_end {
                return Err(invalid("DataSegmentLength", format!("data to {end} beyond the R2T burst end {r_end}")));
            }
            if data_sn != r.data_sn {
                return Err(invalid("DataSN", format!("DataSN {data_sn} (expected {})", r.data_sn)));
            }
            if final_bit != (end == r_end) {
                // RFC 7143 section 11.8: a burst ended before what the R2T
                // asked for (or said to go on at its end) is a "Protocol
                // Error". That burst will never be whole, so the command
                // cannot run: it ends in CHECK CONDITION, ABORTED COMMAND,
                // DATA PHASE ERROR (4Bh/00h) rather than wait for data the
                // initiator believes it sent, and whatever else comes for
                // it is dropped.
                self.end_write_early(itt, 0x4b, 0x00);
                return Err(Self::field_err(
                    RejectReason::PROTOCOL_ERROR,
                    "Flags",
                    format!("F bit {final_bit} at {end} of burst ending {r_end}"),
                    bhs,
                ));
            }
            r.next = end;
            r.data_sn = r.data_sn.wrapping_add(1);
            seq_done = final_bit;
            if seq_done {
                w.r2ts.remove(pos);
                self.ttts.remove(&ttt);
            }
        }
        if short_burst {
            // Unsolicited data is sent as for an implied first R2T asking
            // for min(FirstBurstLength, Expected Data Transfer Length)
            // (RFC 7143 section 13.10), all of it (section 11.8): an
            // unsolicited burst ended early leaves a hole that no R2T of
            // ours was meant to fill. The command never runs; it ends in
            // CHECK CONDITION, ABORTED COMMAND, WRITE ERROR - NOT ENOUGH
            // UNSOLICITED DATA (SPC-4 0C/0D), as with the Linux target, and
            // whatever else the initiator sends for it is dropped.
            let unsol_end = self.tasks.get(&itt).and_then(|t| t.write.as_ref()).map_or(0, |w| w.unsol_end);
            if self.end_write_early(itt, 0x0c, 0x0d) {
                log::warn!(
                    "iscsi: ITT {itt:#x}: unsolicited data ended at {end} of the first burst's {unsol_end} bytes"
                );
                return Ok(());
            }
        }
        let Some(task) = self.tasks.get_mut(&itt) else { return Ok(()) };
        let Some(w) = task.write.as_mut() else { return Ok(()) };
        if let Some(dst) = w.buf.as_mut().and_then(|b| b.as_mut().get_mut(offset as usize..end as usize)) {
            dst.copy_from_slice(data);
        }
        w.received = w.received.saturating_add(len);
        if !digest_ok {
            w.digest_failed = true;
            self.reject(RejectReason::DATA_DIGEST_ERROR, Some(*bhs));
        }
        if seq_done {
            self.advance_write(itt);
        }
        Ok(())
    }

    /// Sends read data for `task`, split by the initiator's
    /// MaxRecvDataSegmentLength into sequences of at most MaxBurstLength.
    /// Data beyond the expected length is cut and reported as overflow.
    /// With a non-exception `status`, the last Data-In carries it (S bit,
    /// phase collapse) with the residual, except for a bidirectional
    /// command; otherwise a SCSI Response follows (use
    /// [`Self::send_response`] for sense data).
    /// Returns false when `task` is not open (answered or aborted).
    pub fn send_data_in(&mut self, task: TaskRef, data: &[u8], status: Option<u8>) -> bool {
        let me = task;
        let itt = me.itt;
        let Some(task) = self.task_mut(me) else { return false };
        let room = task.read_expected.saturating_sub(task.sent_in) as usize;
        let send = data.get(..data.len().min(room)).unwrap_or_default();
        let cut = data.len().saturating_sub(send.len());
        task.overflow = task.overflow.saturating_add(u32::try_from(cut).unwrap_or(u32::MAX));
        let lun = task.lun;
        // A Data-In's Residual Count is the write's for a bidirectional
        // command (RFC 7143 section 11.7.5): its read residual needs the
        // SCSI Response.
        let bidi = task.bidi;
        let max_pdu = (self.params.peer_max_recv_data_segment_length.max(512)) as usize;
        let mbl = (self.params.max_burst_length.max(512)) as usize;
        let collapse = status.filter(|s| scsi_status::may_collapse(*s) && !send.is_empty() && !bidi);
        let total = send.len();
        let mut done = 0usize;
        let mut in_burst = 0usize;
        while done < total {
            let n = max_pdu.min(total.saturating_sub(done)).min(mbl.saturating_sub(in_burst));
            let chunk = send.get(done..done.saturating_add(n)).unwrap_or_default();
            let next = done.saturating_add(n);
            in_burst = in_burst.saturating_add(n);
            let last = next == total;
            let burst_end = in_burst >= mbl || last;
            let Some(task) = self.tasks.get_mut(&itt) else { return false };
            let mut b = Bhs::new(Opcode::DATA_IN);
            let mut f = if burst_end { flags::FINAL } else { 0 };
            b.set_itt(itt)
                .set_ttt(RESERVED_TAG)
                .set_data_sn(task.sn)
                .set_buffer_offset(task.sent_in.saturating_add(u32::try_from(done).unwrap_or(u32::MAX)));
            task.sn = task.sn.wrapping_add(1);
            let status_here = if last { collapse } else { None };
            if let Some(s) = status_here {
                f |= flags::STATUS | flags::FINAL;
                let sent = task.sent_in.saturating_add(u32::try_from(total).unwrap_or(u32::MAX));
                let (rf, count) = residual_of(task.read_expected, sent, task.overflow);
                f |= rf;
                b.set_byte3(s).set_residual_count(count);
                // It answers the command: the window it opens goes with it.
                self.end_task(itt);
            } else {
                b.set_lun(lun);
            }
            b.set_flags(f);
            self.stamp(&mut b, status_here.is_some());
            self.send(&b, &[], chunk);
            if burst_end {
                in_burst = 0;
            }
            done = next;
        }
        if let Some(task) = self.tasks.get_mut(&itt) {
            task.sent_in = task.sent_in.saturating_add(u32::try_from(total).unwrap_or(u32::MAX));
        }
        match (status, collapse) {
            (_, Some(_)) => self.answer_logout_when_idle(),
            (Some(s), None) => {
                self.send_response(me, s, None, None);
            }
            (None, None) => {}
        }
        true
    }

    /// Answers read `task` with GOOD status and `len` bytes that `fill`
    /// appends straight to the send buffer: one Data-In carrying the
    /// status (phase collapse). Returns `false`, having sent nothing and
    /// changed nothing, when the data needs more than one PDU, exceeds the
    /// expected length, `task` is not open, or `fill` fails (or appends
    /// another number of bytes); the caller then answers with
    /// [`Self::send_data_in`].
    pub fn send_data_in_with(
        &mut self,
        task: TaskRef,
        len: usize,
        fill: impl FnOnce(&mut Appender<'_>) -> bool,
    ) -> bool {
        if !self.fits_one_data_in(task, len) {
            return false;
        }
        let framing = self.tx_framing;
        let mut tx = std::mem::take(&mut self.tx);
        let sent = pdu::encode_with(&mut tx, len, framing, fill, || self.last_data_in(task.itt, len));
        self.tx = tx;
        if sent {
            self.answer_logout_when_idle();
        }
        sent
    }

    /// Whether `len` bytes answer open read `task` in one Data-In.
    fn fits_one_data_in(&mut self, task: TaskRef, len: usize) -> bool {
        let Some(task) = self.task_mut(task) else { return false };
        let room = task.read_expected.saturating_sub(task.sent_in) as usize;
        let bidi = task.bidi;
        let max_pdu = (self.params.peer_max_recv_data_segment_length.max(512)) as usize;
        let mbl = (self.params.max_burst_length.max(512)) as usize;
        len != 0 && len <= room && len <= max_pdu && len <= mbl && !bidi
    }

    /// The header of the one Data-In carrying `len` bytes and GOOD status
    /// for task `itt`, whose sequence numbers it takes; the task ends.
    fn last_data_in(&mut self, itt: u32, len: usize) -> Bhs {
        let mut b = Bhs::new(Opcode::DATA_IN);
        b.set_itt(itt).set_ttt(RESERVED_TAG);
        if let Some(task) = self.tasks.get_mut(&itt) {
            let sent = task.sent_in.saturating_add(u32::try_from(len).unwrap_or(u32::MAX));
            let (rf, count) = residual_of(task.read_expected, sent, task.overflow);
            b.set_data_sn(task.sn)
                .set_buffer_offset(task.sent_in)
                .set_byte3(scsi_status::GOOD)
                .set_residual_count(count)
                .set_flags(flags::FINAL | flags::STATUS | rf);
            task.sn = task.sn.wrapping_add(1);
            task.sent_in = sent;
        }
        // A read that is not bidirectional ([`Self::fits_one_data_in`])
        // holds no write budget: ending it sends nothing, which matters
        // while `send_data_in_with`'s caller has the send buffer out.
        self.end_task(itt);
        self.stamp(&mut b, true);
        b
    }

    /// As [`send_data_in_with`](Self::send_data_in_with) with `len` zero
    /// bytes (a read of a device that holds nothing), which the send buffer
    /// does not hold: [`take_transmit_parts`](Self::take_transmit_parts)
    /// says where they go, and the sender sends them from a page of zeros.
    pub fn send_data_in_zeros(&mut self, task: TaskRef, len: usize) -> bool {
        if !self.fits_one_data_in(task, len) {
            return false;
        }
        let itt = task.itt;
        let b = self.last_data_in(itt, len);
        let zeros = pdu::encode_zeros(&mut self.tx, len, self.tx_framing, b);
        if self.tx_zeros.capacity() == 0 {
            // Room for a whole session's reads at once, taken once.
            self.tx_zeros.reserve((self.cfg.queue_depth as usize).max(32));
        }
        self.tx_zeros.push(zeros);
        self.answer_logout_when_idle();
        true
    }

    /// Sends the SCSI Response for `task` (RFC 7143 section 11.4): status,
    /// optional sense data (sent with its 2-byte SenseLength prefix), and a
    /// residual. `residual: None` reports what the connection counted (read
    /// data sent against the expected length). For a bidirectional command
    /// `residual` is the write's (O/U, Residual Count) and the connection
    /// reports the read's in the Bidirectional Read Residual Count (o/u,
    /// RFC 7143 section 11.4.5.1). Returns false when `task` is not open
    /// (already answered or aborted, even if a new task now uses its ITT).
    pub fn send_response(
        &mut self,
        task: TaskRef,
        status: u8,
        sense: Option<&[u8]>,
        residual: Option<Residual>,
    ) -> bool {
        let itt = task.itt;
        let Some(task) = self.task_mut(task) else { return false };
        let read = residual_of(task.read_expected, task.sent_in, task.overflow);
        let (mut f, count) = match residual {
            Some(Residual::Underflow(n)) => (flags::UNDERFLOW, n),
            Some(Residual::Overflow(n)) => (flags::OVERFLOW, n),
            None if task.bidi => (0, 0),
            None if task.read_expected > 0 || task.overflow > 0 => read,
            None => (0, 0),
        };
        let (bidi_flags, bidi_count) = match read {
            (rf, n) if task.bidi && rf == flags::OVERFLOW => (flags::BIDI_OVERFLOW, n),
            (rf, n) if task.bidi && rf == flags::UNDERFLOW => (flags::BIDI_UNDERFLOW, n),
            _ => (0, 0),
        };
        f |= flags::FINAL | bidi_flags;
        let mut b = Bhs::new(Opcode::SCSI_RESP);
        b.set_flags(f)
            .set_byte2(0)
            .set_byte3(status)
            .set_itt(itt)
            .set_data_sn(task.sn)
            .set_bidi_read_residual_count(bidi_count)
            .set_residual_count(count);
        let mut data = Vec::new();
        if let Some(s) = sense {
            let n = u16::try_from(s.len()).unwrap_or(u16::MAX);
            data.extend_from_slice(&n.to_be_bytes());
            data.extend_from_slice(s.get(..usize::from(n)).unwrap_or_default());
        }
        self.end_task(itt);
        self.stamp(&mut b, true);
        self.send(&b, &[], &data);
        self.answer_logout_when_idle();
        true
    }

    /// The open task `task`, if it is still the one holding its ITT.
    fn task_mut(&mut self, task: TaskRef) -> Option<&mut Task<B>> {
        self.tasks.get_mut(&task.itt).filter(|t| t.serial == task.serial)
    }

    /// The tasks a task management function ends when it completes
    /// (RFC 7143 section 11.5.1): the referenced task for ABORT TASK, the
    /// LUN's tasks for ABORT/CLEAR TASK SET and LUN RESET, every task for
    /// the target resets and I_T NEXUS RESET. Commands still collecting
    /// their data are included; they never reach the upper layer.
    pub fn tmf_scope(&self, function: TmfFunction, lun: u64, referenced_itt: u32) -> Vec<TaskRef> {
        let of = |(itt, t): (&u32, &Task<B>)| TaskRef { itt: *itt, serial: t.serial };
        match function {
            TmfFunction::ABORT_TASK => self.tasks.get_key_value(&referenced_itt).map(of).into_iter().collect(),
            TmfFunction::ABORT_TASK_SET | TmfFunction::CLEAR_TASK_SET | TmfFunction::LOGICAL_UNIT_RESET => {
                self.tasks.iter().filter(|(_, t)| t.lun == lun).map(of).collect()
            }
            TmfFunction::TARGET_WARM_RESET | TmfFunction::TARGET_COLD_RESET | TmfFunction::I_T_NEXUS_RESET => {
                self.tasks.iter().map(of).collect()
            }
            _ => Vec::new(),
        }
    }

    /// Ends task `itt`, then answers a Logout that waited for the tasks
    /// to end.
    fn finish_task(&mut self, itt: u32) {
        self.end_task(itt);
        self.answer_logout_when_idle();
    }

    /// Ends task `itt`: its TTTs and write budget are freed (a write
    /// waiting for room may get its R2Ts) and a numbered command gives back
    /// its place in the CmdSN window. The PDU answering it, if any, is
    /// stamped after this, so that it carries the MaxCmdSN the command's
    /// end opened (as the Linux target's responses do).
    fn end_task(&mut self, itt: u32) {
        if let Some(t) = self.tasks.remove(&itt) {
            if let Some(w) = t.write {
                for r in w.r2ts {
                    self.ttts.remove(&r.ttt);
                }
                if w.budgeted {
                    self.release_write_budget(u64::from(t.expected_len));
                }
            }
            self.retire(t.immediate);
        }
    }

    /// Sends the Logout Response that waits, once no command and no task
    /// management request is left to answer before it.
    fn answer_logout_when_idle(&mut self) {
        if self.tasks.is_empty() && self.tmf_pending.is_empty() {
            if let Some(req) = self.logout_pending.take() {
                self.send_logout_response(&req, 0);
            }
        }
    }

    /// Open tasks (commands without a response yet).
    pub fn open_tasks(&self) -> usize {
        self.tasks.len()
    }

    // ---- Task management (RFC 7143 sections 11.5, 11.6) ----

    fn on_tmf(&mut self, bhs: &Bhs) -> Result<(), PduError> {
        if !self.accept_cmd_sn(bhs) {
            return Ok(());
        }
        let function = TmfFunction(bhs.flags() & 0x7f);
        let itt = bhs.itt();
        if itt == RESERVED_TAG {
            // 0xffffffff names no task of the initiator's (RFC 7143
            // section 11.1.4): it could never be answered apart from a NOP.
            self.retire(bhs.immediate());
            return Err(Self::field_err(
                RejectReason::INVALID_PDU_FIELD,
                "InitiatorTaskTag",
                "task management ITT 0xffffffff is reserved".into(),
                bhs,
            ));
        }
        if self.itt_in_use(itt) {
            // The task or request holding the ITT carries on untouched.
            self.retire(bhs.immediate());
            return Err(Self::field_err(
                RejectReason::TASK_IN_PROGRESS,
                "InitiatorTaskTag",
                format!("task management ITT {itt:#x} already in use"),
                bhs,
            ));
        }
        if self.open_count() >= self.cfg.max_tasks as usize {
            let limit = self.cfg.max_tasks;
            if bhs.immediate() {
                return Err(Self::field_err(
                    RejectReason::IMMEDIATE_COMMAND_REJECT,
                    "Immediate",
                    format!("immediate task management request with {limit} tasks open, the session's limit"),
                    bhs,
                ));
            }
            log::warn!("iscsi: task management ITT {itt:#x} rejected: {limit} tasks open, the session's limit");
            self.tmf_pending.insert(itt, PendingTmf { function, immediate: false, scope: Vec::new() });
            self.send_tmf_response(itt, tmf_response::REJECTED);
            return Ok(());
        }
        let supported = matches!(function.0, 1..=7 | 9..=12);
        if !supported || self.login.session_type == SessionType::Discovery {
            let code = if function == TmfFunction::TASK_REASSIGN {
                tmf_response::REASSIGNMENT_NOT_SUPPORTED
            } else {
                tmf_response::NOT_SUPPORTED
            };
            self.tmf_pending.insert(itt, PendingTmf { function, immediate: bhs.immediate(), scope: Vec::new() });
            self.send_tmf_response(itt, code);
            return Ok(());
        }
        if function == TmfFunction::ABORT_TASK {
            let ref_sn = bhs.ref_cmd_sn();
            let code = match self.tasks.get(&bhs.referenced_task_tag()) {
                // SAM-5 7.2: the request names a task of its LUN (I_T_L_Q);
                // a task of another LUN holding the tag is not that task and
                // carries on, as in the Linux target.
                Some(t) if t.lun != bhs.lun() => {
                    log::warn!(
                        "iscsi: ABORT TASK of ITT {:#x} on LUN field {:#x}, but the task is on {:#x}: task does not exist",
                        bhs.referenced_task_tag(),
                        bhs.lun(),
                        t.lun
                    );
                    Some(tmf_response::TASK_DOES_NOT_EXIST)
                }
                // RFC 7143 11.5.4: RefCmdSN is the referenced task's CmdSN
                // (for a task of an immediate command, this request's own).
                // A task holding the tag under another CmdSN is not the one
                // the initiator means: it is left alone and the request is
                // refused, as the Linux target does.
                Some(t) if t.cmd_sn != ref_sn && !(t.immediate && ref_sn == bhs.cmd_sn()) => {
                    log::warn!(
                        "iscsi: ABORT TASK of ITT {:#x} with RefCmdSN {ref_sn}, but the task's CmdSN is {}: rejected",
                        bhs.referenced_task_tag(),
                        t.cmd_sn
                    );
                    Some(tmf_response::REJECTED)
                }
                Some(_) => None,
                // RFC 7143 11.5.1: no such task. If RefCmdSN is in the
                // window and before this request, the command has yet to
                // arrive: its CmdSN counts as received (the command will
                // never run) and the function is complete. Otherwise it
                // already completed, or never existed: "Task does not
                // exist".
                None if in_window(ref_sn, self.exp_cmd_sn, self.max_cmd_sn) && sn_lt(ref_sn, bhs.cmd_sn()) => {
                    if ref_sn == self.exp_cmd_sn {
                        self.max_cmd_sn = self.max_cmd_sn.wrapping_add(1);
                        self.advance_exp_cmd_sn();
                    } else if !self.aborted_sns.contains(&ref_sn) {
                        self.aborted_sns.push(ref_sn);
                    }
                    Some(tmf_response::COMPLETE)
                }
                None => Some(tmf_response::TASK_DOES_NOT_EXIST),
            };
            if let Some(code) = code {
                self.tmf_pending.insert(itt, PendingTmf { function, immediate: bhs.immediate(), scope: Vec::new() });
                self.send_tmf_response(itt, code);
                return Ok(());
            }
        }
        let scope = self.tmf_scope(function, bhs.lun(), bhs.referenced_task_tag());
        let mut delivered = Vec::with_capacity(scope.len());
        for t in &scope {
            if let Some(task) = self.task_mut(*t) {
                task.aborting = true;
                if task.cmd.is_none() && task.write.is_none() {
                    delivered.push(*t);
                }
            }
        }
        self.tmf_pending.insert(itt, PendingTmf { function, immediate: bhs.immediate(), scope });
        self.events.push_back(Event::TaskMgmt {
            itt,
            function,
            lun: bhs.lun(),
            referenced_itt: bhs.referenced_task_tag(),
            ref_cmd_sn: bhs.ref_cmd_sn(),
            tasks: delivered,
        });
        Ok(())
    }

    /// Answers a task management request. On "function complete" the
    /// connection forgets the tasks in its scope, fixed when the request
    /// arrived ([`Self::tmf_scope`]): no response will be sent for them and
    /// their R2Ts are void. The upper layer answers only once every task in
    /// [`Event::TaskMgmt`]'s `tasks` has finished or will never touch the
    /// device again (RFC 7143 section 4.2.3); on any other response the
    /// tasks carry on and are answered as usual.
    pub fn send_tmf_response(&mut self, itt: u32, response: u8) -> bool {
        let Some(PendingTmf { function, immediate, scope }) = self.tmf_pending.remove(&itt) else { return false };
        // A Logout Response waiting for this request goes after it.
        let logout = self.logout_pending.take();
        // The referenced task was answered before the abort took effect
        // (it finished first): RFC 7143 11.6.1 "Task does not exist", so
        // the initiator never sees both a status and "function complete".
        let response = if function == TmfFunction::ABORT_TASK
            && response == tmf_response::COMPLETE
            && !scope.is_empty()
            && scope.iter().all(|t| self.tasks.get(&t.itt).is_none_or(|x| x.serial != t.serial))
        {
            tmf_response::TASK_DOES_NOT_EXIST
        } else {
            response
        };
        for t in scope {
            if response == tmf_response::COMPLETE {
                if self.task_mut(t).is_some() {
                    self.finish_task(t.itt);
                    self.forget_itt(t.itt);
                }
            } else if self.tmf_pending.values().any(|p| p.scope.contains(&t)) {
                // Another pending request still has it in its scope: it
                // stays held back until that one is answered.
            } else if let Some(task) = self.task_mut(t) {
                task.aborting = false;
                let itt = t.itt;
                self.advance_write(itt);
            }
        }
        let mut b = Bhs::new(Opcode::TASK_MGMT_RESP);
        b.set_flags(flags::FINAL).set_byte2(response).set_itt(itt);
        self.retire(immediate);
        self.stamp(&mut b, true);
        self.send(&b, &[], &[]);
        self.logout_pending = logout;
        self.answer_logout_when_idle();
        true
    }

    // ---- Text (RFC 7143 sections 11.10, 11.11; SendTargets appendix C) ----

    fn on_text(&mut self, bhs: &Bhs, data: &[u8]) -> Result<(), PduError> {
        if !self.accept_cmd_sn(bhs) {
            return Ok(());
        }
        let itt = bhs.itt();
        let immediate = bhs.immediate();
        if bhs.flags() & (flags::CONTINUE | flags::FINAL) == flags::CONTINUE | flags::FINAL {
            // RFC 7143 11.10: with C=1, F must be 0.
            self.text_partial.clear();
            self.text_continue = None;
            self.retire(immediate);
            return Err(Self::field_err(
                RejectReason::PROTOCOL_ERROR,
                "Flags",
                "Text Request with both C and F set".into(),
                bhs,
            ));
        }
        let continued = self.text_continue.take().is_some_and(|c| c == (itt, bhs.ttt()));
        if bhs.ttt() == RESERVED_TAG {
            // RFC 7143 11.11.4: the reserved TTT starts a new exchange;
            // what an earlier one left unfinished is dropped.
            self.text_partial.clear();
        } else if !continued {
            // The initiator asks for the next part of a long response.
            let Some(p) = self.text_pending.take().filter(|p| p.ttt == bhs.ttt() && p.itt == itt) else {
                self.retire(immediate);
                return Err(Self::field_err(
                    RejectReason::INVALID_PDU_FIELD,
                    "TargetTransferTag",
                    format!("Text Request TTT {:#x} continues nothing", bhs.ttt()),
                    bhs,
                ));
            };
            if !data.is_empty() {
                // RFC 7143 11.11: the initiator answers a Text Response
                // with C=1 with an empty Text Request; the rest of the
                // answer is dropped with the exchange.
                self.retire(immediate);
                return Err(Self::field_err(
                    RejectReason::PROTOCOL_ERROR,
                    "DataSegmentLength",
                    format!("{} bytes of text while the answer continues", data.len()),
                    bhs,
                ));
            }
            self.send_text_part(itt, immediate, p.rest, p.more);
            return Ok(());
        }
        if self.text_partial.len().saturating_add(data.len()) > self.cfg.max_text_len {
            self.text_partial.clear();
            self.retire(immediate);
            return Err(Self::field_err(
                RejectReason::PROTOCOL_ERROR,
                "DataSegmentLength",
                "text too long".into(),
                bhs,
            ));
        }
        self.text_partial.extend_from_slice(data);
        if bhs.flags() & flags::CONTINUE != 0 {
            // An empty answer with F=0 and a TTT of ours, which the next
            // part of the request echoes (RFC 7143 11.11.1: never the
            // reserved TTT with F=0).
            let ttt = self.alloc_ttt();
            self.text_continue = Some((itt, ttt));
            let mut b = Bhs::new(Opcode::TEXT_RESP);
            b.set_itt(itt).set_ttt(ttt);
            self.retire(immediate);
            self.stamp(&mut b, true);
            self.send(&b, &[], &[]);
            return Ok(());
        }
        let text = std::mem::take(&mut self.text_partial);
        let pairs = match text::parse_unique(&text) {
            Ok(p) => p,
            Err(e) => {
                self.retire(immediate);
                return Err(Self::field_err(RejectReason::PROTOCOL_ERROR, "TextData", e.to_string(), bhs));
            }
        };
        let mut resp = Vec::new();
        for (k, v) in &pairs {
            match k.as_str() {
                "SendTargets" => self.send_targets(v, &mut resp),
                "MaxRecvDataSegmentLength" => {
                    let mut p = self.params;
                    if text::negotiate(k, v, &self.cfg.params, &mut p, SessionType::Normal) == text::Answer::None {
                        self.params.peer_max_recv_data_segment_length = p.peer_max_recv_data_segment_length;
                        self.tx_framing.max_data_segment = p.peer_max_recv_data_segment_length;
                    } else {
                        text::push(&mut resp, k, "Reject");
                    }
                }
                // Declarative and allowed in any phase (RFC 7143 13.6):
                // nothing to answer.
                "InitiatorAlias" => {}
                _ if text::key_kind(k).is_some() => text::push(&mut resp, k, "Reject"),
                _ => text::push(&mut resp, k, "NotUnderstood"),
            }
        }
        // RFC 7143 11.11.1: a request with F=0 (the initiator has more to
        // say) is never answered with F=1.
        self.send_text_part(itt, immediate, resp, !bhs.final_bit());
        Ok(())
    }

    fn send_targets(&self, value: &str, resp: &mut Vec<u8>) {
        let all = self.policy.discovery_targets(&self.login.initiator);
        let list: Vec<TargetInfo> = match (self.login.session_type, value) {
            (SessionType::Discovery, "All") => all,
            // iSCSI names compare without case, as the login's lookup does.
            (SessionType::Discovery, name) => all.into_iter().filter(|t| t.name.eq_ignore_ascii_case(name)).collect(),
            (SessionType::Normal, name) => self
                .login
                .target
                .clone()
                .into_iter()
                .filter(|t| name.is_empty() || t.name.eq_ignore_ascii_case(name))
                .collect(),
        };
        if self.login.session_type == SessionType::Normal && value == "All" {
            text::push(resp, "SendTargets", "Reject");
            return;
        }
        for t in list {
            text::push(resp, "TargetName", &t.name);
            for p in &t.portals {
                text::push(resp, "TargetAddress", &self.reachable(p));
            }
        }
    }

    /// The TargetAddress value for `portal` (`ip:port,tpgt`): a wildcard
    /// listen address (0.0.0.0, `[::]`) is no address to connect to, so,
    /// as the Linux target does, it is given as the address this
    /// connection reached ([`Self::with_local`]) with the portal's port,
    /// an IPv4-mapped one as the IPv4 address it is.
    fn reachable(&self, portal: &str) -> String {
        let (addr, tag) = portal.split_at(portal.find(',').unwrap_or(portal.len()));
        match (addr.parse::<std::net::SocketAddr>(), self.local) {
            (Ok(a), Some(local)) if a.ip().is_unspecified() => {
                format!("{}{tag}", std::net::SocketAddr::new(local.to_canonical(), a.port()))
            }
            _ => portal.to_string(),
        }
    }

    /// Sends `text` (or its first part) in a Text Response to `itt`;
    /// `more` when the request had F=0, so the answer keeps F=0 and a TTT
    /// the initiator's next request of the exchange echoes.
    fn send_text_part(&mut self, itt: u32, immediate: bool, text: Vec<u8>, more: bool) {
        let max = self.params.peer_max_recv_data_segment_length.max(512) as usize;
        let mut b = Bhs::new(Opcode::TEXT_RESP);
        b.set_itt(itt);
        if text.len() > max {
            let (head, rest) = text.split_at(text_cut(&text, max));
            let ttt = self.alloc_ttt();
            b.set_flags(flags::CONTINUE).set_ttt(ttt);
            self.text_pending = Some(TextPending { itt, ttt, rest: rest.to_vec(), more });
            self.retire(immediate);
            self.stamp(&mut b, true);
            self.send(&b, &[], head);
        } else if more {
            let ttt = self.alloc_ttt();
            self.text_continue = Some((itt, ttt));
            b.set_ttt(ttt);
            self.retire(immediate);
            self.stamp(&mut b, true);
            self.send(&b, &[], &text);
        } else {
            b.set_flags(flags::FINAL).set_ttt(RESERVED_TAG);
            self.retire(immediate);
            self.stamp(&mut b, true);
            self.send(&b, &[], &text);
        }
    }

    // ---- Logout (RFC 7143 sections 11.14, 11.15) ----

    fn on_logout(&mut self, bhs: &Bhs) -> Result<(), PduError> {
        if !self.accept_cmd_sn(bhs) {
            return Ok(());
        }
        let reason = bhs.flags() & 0x7f;
        let response = match reason {
            0 => 0,
            1 if bhs.cid() == self.login.cid => 0,
            1 => 1, // CID not found
            2 => 2, // connection recovery not supported
            _ => {
                // Reason codes 3..127 are reserved (RFC 7143 section
                // 11.14.1), and a reserved code value is a protocol error
                // (section 11), not a logout that failed.
                self.retire(bhs.immediate());
                return Err(Self::field_err(
                    RejectReason::PROTOCOL_ERROR,
                    "ReasonCode",
                    format!("Logout reason code {reason} is reserved"),
                    bhs,
                ));
            }
        };
        if response == 0 {
            // RFC 7143 11.14: a Logout closing the connection or session
            // terminates its pending commands. Those still waiting for
            // data (never given to the upper layer) end here, unanswered:
            // the initiator sends nothing after a Logout, so their data
            // may never come. Those the upper layer has are answered first.
            let waiting: Vec<u32> = self
                .tasks
                .iter()
                .filter(|(_, t)| !t.aborting && (t.write.is_some() || t.cmd.is_some()))
                .map(|(itt, _)| *itt)
                .collect();
            for itt in waiting {
                log::debug!("iscsi: Logout ends ITT {itt:#x}, still waiting for its data");
                self.end_task(itt);
                self.forget_itt(itt);
            }
        }
        if response == 0 && !(self.tasks.is_empty() && self.tmf_pending.is_empty()) {
            // Answer once the commands and task management requests in
            // flight have been answered, so that their responses precede
            // the Logout Response; refuse new ones.
            self.logout_pending = Some(*bhs);
            return Ok(());
        }
        self.send_logout_response(bhs, response);
        Ok(())
    }

    fn send_logout_response(&mut self, req: &Bhs, response: u8) {
        let mut b = Bhs::new(Opcode::LOGOUT_RESP);
        b.set_flags(flags::FINAL)
            .set_byte2(response)
            .set_itt(req.itt())
            .set_time2(self.params.default_time2wait, self.params.default_time2retain);
        self.retire(req.immediate());
        self.stamp(&mut b, true);
        self.send(&b, &[], &[]);
        if response == 0 {
            self.events.push_back(Event::LoggedOut { reason: req.flags() & 0x7f });
            self.state = State::Closed;
        }
    }
}

/// Residual flags and count for `sent` bytes against `expected`, with
/// `overflow` bytes that did not fit.
fn residual_of(expected: u32, sent: u32, overflow: u32) -> (u8, u32) {
    if overflow > 0 {
        (flags::OVERFLOW, overflow)
    } else if sent < expected {
        (flags::UNDERFLOW, expected.saturating_sub(sent))
    } else {
        (0, 0)
    }
}

/// Fixed-format sense data (SPC-4 4.5.3): ABORTED COMMAND with `asc`/`ascq`.
fn aborted_command_sense(asc: u8, ascq: u8) -> [u8; 18] {
    [0x70, 0, 0x0b, 0, 0, 0, 0, 10, 0, 0, 0, 0, asc, ascq, 0, 0, 0, 0]
}

/// Whether a write buffer of `len` bytes fits a budget of which `held`
/// bytes are taken; the first one always does, so no write waits for ever.
fn fits_budget(held: u64, budget: u64, len: u32) -> bool {
    held == 0 || held.saturating_add(u64::from(len)) <= budget
}

/// Whether `sn` lies in the window [exp, max] (serial arithmetic).
pub fn in_window(sn: u32, exp: u32, max: u32) -> bool {
    sn_le(exp, sn) && sn_le(sn, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residuals() {
        assert_eq!(residual_of(512, 512, 0), (0, 0));
        assert_eq!(residual_of(512, 100, 0), (flags::UNDERFLOW, 412));
        assert_eq!(residual_of(512, 512, 36), (flags::OVERFLOW, 36));
        assert!(in_window(5, 5, 10));
        assert!(!in_window(11, 5, 10));
        assert!(in_window(2, 0xffff_fffe, 3));
        assert!(scsi_status::may_collapse(0));
        assert!(!scsi_status::may_collapse(scsi_status::CHECK_CONDITION));
    }
}
