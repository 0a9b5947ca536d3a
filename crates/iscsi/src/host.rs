//! The initiator side of one iSCSI connection: enough for pair tests, the
//! loopback test initiator and the benchmark.
//!
//! It logs in (optionally with one-way or mutual CHAP), offers every
//! operational key, then issues SCSI commands with immediate and
//! unsolicited data, answers R2Ts, collects Data-In and responses, answers
//! NOP-In pings, and does Text SendTargets, task management and Logout.
//! No I/O, no clock. ErrorRecoveryLevel 0, one connection per session.

use crate::chap::{self, ChapAlgorithm, Secret};
use crate::error::{PduError, RejectReason};
use crate::pdu::{self, ahs_entry, ahs_type, flags, sn_le, sn_lt, Bhs, Framing, Opcode, Stage, RESERVED_TAG};
use crate::target::Residual;
use crate::text::{self, Params, SessionType};
use std::collections::{HashMap, VecDeque};

/// Mutual CHAP: what the initiator asks of the target.
#[derive(Clone, Debug)]
pub struct MutualChap {
    /// CHAP_N the target must answer with (empty: any).
    pub target_user: String,
    /// The target's secret.
    pub target_secret: Secret,
    /// CHAP_I we send.
    pub id: u8,
    /// CHAP_C we send.
    pub challenge: Vec<u8>,
}

/// CHAP credentials of the initiator.
#[derive(Clone, Debug)]
pub struct HostChap {
    /// CHAP_N.
    pub user: String,
    /// Our secret.
    pub secret: Secret,
    /// CHAP_A offer, in order of preference.
    pub algorithms: Vec<ChapAlgorithm>,
    /// Authenticate the target too.
    pub mutual: Option<MutualChap>,
}

/// Initiator configuration.
#[derive(Clone, Debug)]
pub struct HostConfig {
    /// InitiatorName.
    pub initiator_name: String,
    /// TargetName; `None` opens a discovery session.
    pub target_name: Option<String>,
    /// ISID.
    pub isid: [u8; 6],
    /// Operational keys offered.
    pub params: Params,
    /// CHAP credentials, `None` offers AuthMethod=None only.
    pub chap: Option<HostChap>,
    /// First CmdSN.
    pub cmd_sn: u32,
    /// Answer the target's NOP-In pings (turn off to play dead in tests).
    pub answer_pings: bool,
}

impl HostConfig {
    /// A plain configuration for `initiator` logging in to `target`.
    pub fn new(initiator: &str, target: Option<&str>) -> Self {
        HostConfig {
            initiator_name: initiator.to_string(),
            target_name: target.map(str::to_string),
            isid: [0x80, 0x12, 0x34, 0x56, 0x78, 0x9a],
            params: Params {
                initial_r2t: false,
                immediate_data: true,
                max_recv_data_segment_length: 262_144,
                max_burst_length: 1 << 20,
                first_burst_length: 262_144,
                max_outstanding_r2t: 8,
                ..Params::default()
            },
            chap: None,
            cmd_sn: 1,
            answer_pings: true,
        }
    }
}

/// What the connection waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostState {
    /// Login responses.
    Login,
    /// Full feature phase.
    FullFeature,
    /// Over.
    Closed,
}

/// A finished SCSI command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// ITT.
    pub itt: u32,
    /// SCSI status.
    pub status: u8,
    /// iSCSI Response byte (0: completed at target).
    pub response: u8,
    /// Residual reported by the target.
    pub residual: Option<Residual>,
    /// Sense data (without the SenseLength prefix).
    pub sense: Vec<u8>,
    /// Read data received.
    pub data: Vec<u8>,
    /// The status came in the final Data-In (phase collapse).
    pub collapsed: bool,
}

/// Something the user of the initiator must see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostEvent {
    /// Login completed.
    LoggedIn {
        /// TSIH the target assigned.
        tsih: u16,
    },
    /// The target refused the login with this status.
    LoginFailed {
        /// Status-Class and Status-Detail.
        status: u16,
    },
    /// The target failed mutual authentication or broke the login rules.
    TargetNotAuthenticated,
    /// A SCSI command completed.
    Completion(Completion),
    /// The answer to our NOP-Out.
    NopIn {
        /// ITT.
        itt: u32,
        /// Echoed ping data.
        data: Vec<u8>,
    },
    /// A complete Text Response.
    Text {
        /// ITT.
        itt: u32,
        /// Keys in order.
        pairs: Vec<(String, String)>,
    },
    /// A task management response.
    TaskMgmt {
        /// ITT.
        itt: u32,
        /// Response code.
        response: u8,
    },
    /// The Logout Response.
    LoggedOut {
        /// Response code.
        response: u8,
        /// Time2Wait.
        time2wait: u16,
        /// Time2Retain.
        time2retain: u16,
    },
    /// An Asynchronous Message (RFC 7143 section 11.9).
    AsyncMessage {
        /// AsyncEvent (`pdu::async_event`).
        event: u8,
        /// Parameter1..3.
        parameters: [u16; 3],
    },
    /// The target rejected a PDU.
    Reject {
        /// Reason code.
        reason: RejectReason,
        /// The rejected PDU's BHS as echoed.
        bhs: Option<Bhs>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LoginStep {
    Security,
    ChapA,
    ChapR,
    Operational,
}

struct HostTask {
    lun: u64,
    cmd_sn: u32,
    write: Vec<u8>,
    read: Vec<u8>,
    read_len: u32,
}

struct Queued {
    itt: u32,
    lun: u64,
    cdb: Vec<u8>,
    read_len: u32,
    write_len: u32,
}

/// Initiator side of one iSCSI connection.
pub struct HostConnection {
    cfg: HostConfig,
    state: HostState,
    step: LoginStep,
    chap_challenge: Option<(u8, Vec<u8>)>,
    pending_alg: Option<ChapAlgorithm>,
    params: Params,
    rx_framing: Framing,
    tx_framing: Framing,
    rx: Vec<u8>,
    tx: Vec<u8>,
    events: VecDeque<HostEvent>,
    cmd_sn: u32,
    exp_stat_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    next_itt: u32,
    tsih: u16,
    tasks: HashMap<u32, HostTask>,
    queue: VecDeque<Queued>,
    text: HashMap<u32, Vec<u8>>,
    login_itt: u32,
}

impl HostConnection {
    /// A connection that has queued its first Login Request.
    pub fn new(cfg: HostConfig) -> Self {
        let params = cfg.params;
        let mut h = HostConnection {
            cmd_sn: cfg.cmd_sn,
            exp_cmd_sn: cfg.cmd_sn,
            max_cmd_sn: cfg.cmd_sn,
            cfg,
            state: HostState::Login,
            step: LoginStep::Security,
            chap_challenge: None,
            pending_alg: None,
            params,
            rx_framing: Framing { max_data_segment: 8192, ..Framing::default() },
            tx_framing: Framing::default(),
            rx: Vec::new(),
            tx: Vec::new(),
            events: VecDeque::new(),
            exp_stat_sn: 0,
            next_itt: 0x100,
            tsih: 0,
            tasks: HashMap::new(),
            queue: VecDeque::new(),
            text: HashMap::new(),
            login_itt: 0,
        };
        // Login responses may be as large as 8192 bytes by default; our
        // declared MaxRecvDataSegmentLength applies once it is sent.
        let mut t = Vec::new();
        text::push(&mut t, "InitiatorName", &h.cfg.initiator_name.clone());
        match h.cfg.target_name.clone() {
            Some(name) => {
                text::push(&mut t, "SessionType", "Normal");
                text::push(&mut t, "TargetName", &name);
            }
            None => text::push(&mut t, "SessionType", "Discovery"),
        }
        text::push(&mut t, "AuthMethod", if h.cfg.chap.is_some() { "CHAP,None" } else { "None" });
        h.login_itt = h.alloc_itt();
        h.send_login(true, Stage::SECURITY, Stage::OPERATIONAL, &t);
        h
    }

    /// The current state.
    pub fn state(&self) -> HostState {
        self.state
    }

    /// Whether login completed.
    pub fn is_full_feature(&self) -> bool {
        self.state == HostState::FullFeature
    }

    /// Negotiated parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// (CmdSN of the next command, ExpStatSN, ExpCmdSN, MaxCmdSN).
    pub fn sequence(&self) -> (u32, u32, u32, u32) {
        (self.cmd_sn, self.exp_stat_sn, self.exp_cmd_sn, self.max_cmd_sn)
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<HostEvent> {
        self.events.pop_front()
    }

    /// Moves every byte waiting to be sent to the end of `out`.
    pub fn take_transmit(&mut self, out: &mut Vec<u8>) {
        if out.is_empty() {
            std::mem::swap(out, &mut self.tx);
        } else {
            out.append(&mut self.tx);
        }
    }

    /// Sends a hand-made PDU with the current framing (tests use it to
    /// play a hostile initiator).
    pub fn send_raw(&mut self, bhs: &Bhs, ahs: &[u8], data: &[u8]) {
        pdu::encode(&mut self.tx, bhs, ahs, data, self.tx_framing);
    }

    /// Counts `n` numbered commands sent with [`send_raw`](Self::send_raw)
    /// (CmdSN from [`sequence`](Self::sequence) on), so that the next
    /// command takes the CmdSN after them.
    pub fn skip_cmd_sn(&mut self, n: u32) {
        self.cmd_sn = self.cmd_sn.wrapping_add(n);
    }

    /// The framing this side sends with.
    pub fn tx_framing(&self) -> Framing {
        self.tx_framing
    }

    /// Makes `itt` the tag of the next request. Real initiators reuse the
    /// tags of finished or aborted tasks at once (Linux's iscsi_tcp keys
    /// them by slot); tests do the same with this.
    pub fn set_next_itt(&mut self, itt: u32) {
        self.next_itt = itt;
    }

    fn alloc_itt(&mut self) -> u32 {
        let i = self.next_itt;
        self.next_itt = self.next_itt.wrapping_add(1);
        if self.next_itt == RESERVED_TAG {
            self.next_itt = 0;
        }
        i
    }

    fn send_login(&mut self, transit: bool, csg: Stage, nsg: Stage, data: &[u8]) {
        let mut b = Bhs::new(Opcode::LOGIN_REQ);
        b.set_immediate(true)
            .set_login_flags(transit, false, csg, if transit { nsg } else { Stage(0) })
            .set_isid(self.cfg.isid)
            .set_itt(self.login_itt)
            .set_cmd_sn(self.cmd_sn)
            .set_exp_stat_sn(self.exp_stat_sn);
        self.send_raw(&b, &[], data);
    }

    /// Feeds received bytes. A fatal framing error closes the connection.
    pub fn handle_input(&mut self, bytes: &[u8]) -> Result<(), PduError> {
        if self.state == HostState::Closed {
            return Ok(());
        }
        self.rx.extend_from_slice(bytes);
        // The frames borrow the receive buffer while the handlers change
        // the rest of the session.
        let rx = std::mem::take(&mut self.rx);
        let mut used = 0usize;
        let mut result = Ok(());
        while self.state != HostState::Closed {
            let buf = rx.get(used..).unwrap_or_default();
            let f = match pdu::deframe(buf, self.rx_framing) {
                None => break,
                Some(Ok(f)) => f,
                Some(Err(e)) => {
                    self.state = HostState::Closed;
                    result = Err(e);
                    break;
                }
            };
            used = used.saturating_add(f.len);
            self.on_pdu(&f.bhs, f.data);
        }
        self.rx = rx;
        self.rx.drain(..used.min(self.rx.len()));
        result
    }

    fn track(&mut self, b: &Bhs, status: bool) {
        if status {
            let next = b.stat_sn().wrapping_add(1);
            if sn_lt(self.exp_stat_sn, next) || self.exp_stat_sn == 0 {
                self.exp_stat_sn = next;
            }
        }
        let (exp, max) = (b.exp_cmd_sn(), b.max_cmd_sn());
        // Ignore windows that are invalid (MaxCmdSN < ExpCmdSN - 1).
        if sn_le(exp.wrapping_sub(1), max) {
            if sn_lt(self.exp_cmd_sn, exp) {
                self.exp_cmd_sn = exp;
            }
            if sn_lt(self.max_cmd_sn, max) {
                self.max_cmd_sn = max;
            }
        }
    }

    fn on_pdu(&mut self, b: &Bhs, data: &[u8]) {
        let op = b.opcode();
        match op {
            Opcode::LOGIN_RESP => {
                self.track(b, true);
                self.on_login_resp(b, data);
            }
            Opcode::DATA_IN => {
                self.track(b, b.flags() & flags::STATUS != 0);
                self.on_data_in(b, data);
            }
            Opcode::SCSI_RESP => {
                self.track(b, true);
                self.on_scsi_resp(b, data);
            }
            Opcode::R2T => {
                self.track(b, false);
                self.on_r2t(b);
            }
            Opcode::NOP_IN => {
                let ping = b.itt() == RESERVED_TAG;
                self.track(b, !ping);
                if ping {
                    if b.ttt() != RESERVED_TAG && self.cfg.answer_pings {
                        let mut r = Bhs::new(Opcode::NOP_OUT);
                        r.set_immediate(true)
                            .set_flags(flags::FINAL)
                            .set_lun(b.lun())
                            .set_itt(RESERVED_TAG)
                            .set_ttt(b.ttt())
                            .set_cmd_sn(self.cmd_sn)
                            .set_exp_stat_sn(self.exp_stat_sn);
                        self.send_raw(&r, &[], &[]);
                    }
                } else {
                    self.events.push_back(HostEvent::NopIn { itt: b.itt(), data: data.to_vec() });
                }
            }
            Opcode::TEXT_RESP => {
                self.track(b, true);
                let acc = self.text.entry(b.itt()).or_default();
                acc.extend_from_slice(data);
                if b.final_bit() {
                    let all = self.text.remove(&b.itt()).unwrap_or_default();
                    let pairs = text::parse(&all).unwrap_or_default();
                    self.events.push_back(HostEvent::Text { itt: b.itt(), pairs });
                } else if b.ttt() != RESERVED_TAG {
                    let mut r = Bhs::new(Opcode::TEXT_REQ);
                    r.set_flags(flags::FINAL).set_itt(b.itt()).set_ttt(b.ttt());
                    self.issue(&mut r);
                    self.send_raw(&r, &[], &[]);
                }
            }
            Opcode::TASK_MGMT_RESP => {
                self.track(b, true);
                self.events.push_back(HostEvent::TaskMgmt { itt: b.itt(), response: b.byte2() });
            }
            Opcode::LOGOUT_RESP => {
                self.track(b, true);
                self.events.push_back(HostEvent::LoggedOut {
                    response: b.byte2(),
                    time2wait: b.time2wait(),
                    time2retain: b.time2retain(),
                });
                self.state = HostState::Closed;
            }
            Opcode::REJECT => {
                self.track(b, true);
                self.events
                    .push_back(HostEvent::Reject { reason: RejectReason(b.byte2()), bhs: Bhs::from_slice(data) });
            }
            Opcode::ASYNC_MSG => {
                self.track(b, true);
                self.events
                    .push_back(HostEvent::AsyncMessage { event: b.async_event(), parameters: b.async_parameters() });
            }
            _ => log::debug!("iscsi host: ignoring opcode {:#04x}", op.0),
        }
        self.flush_queue();
    }

    fn fail_login(&mut self, ev: HostEvent) {
        self.events.push_back(ev);
        self.state = HostState::Closed;
    }

    fn on_login_resp(&mut self, b: &Bhs, data: &[u8]) {
        if self.state != HostState::Login {
            return;
        }
        if b.login_status() != 0 {
            self.fail_login(HostEvent::LoginFailed { status: b.login_status() });
            return;
        }
        let pairs = text::parse(data).unwrap_or_default();
        let get = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        let transit = b.flags() & flags::TRANSIT != 0;
        let offered = self.cfg.params;
        for (k, v) in &pairs {
            if !text::apply_answer(k, v, &offered, &mut self.params) {
                log::warn!("iscsi host: target answered {k}={v} outside our offer");
            }
        }
        let session = if self.cfg.target_name.is_some() { SessionType::Normal } else { SessionType::Discovery };
        if b.csg() == Stage::SECURITY {
            match self.step {
                LoginStep::Security if get("AuthMethod").as_deref() == Some("CHAP") => {
                    let algs = self.cfg.chap.as_ref().map(|c| c.algorithms.clone()).unwrap_or_default();
                    let list: Vec<String> = algs.iter().map(|a| a.0.to_string()).collect();
                    let mut t = Vec::new();
                    text::push(&mut t, "CHAP_A", &list.join(","));
                    self.step = LoginStep::ChapA;
                    self.send_login(false, Stage::SECURITY, Stage::OPERATIONAL, &t);
                    return;
                }
                LoginStep::ChapA => {
                    let (Some(Some(alg)), Some(id), Some(c)) = (
                        get("CHAP_A").map(|a| a.parse::<u8>().ok().map(ChapAlgorithm)),
                        get("CHAP_I").and_then(|i| i.parse::<u8>().ok()),
                        get("CHAP_C").and_then(|c| chap::decode_binary(&c)),
                    ) else {
                        self.fail_login(HostEvent::TargetNotAuthenticated);
                        return;
                    };
                    let Some(cred) = self.cfg.chap.clone() else {
                        self.fail_login(HostEvent::TargetNotAuthenticated);
                        return;
                    };
                    let Some(r) = alg.response(id, &cred.secret.0, &c) else {
                        self.fail_login(HostEvent::TargetNotAuthenticated);
                        return;
                    };
                    let mut t = Vec::new();
                    text::push(&mut t, "CHAP_N", &cred.user);
                    text::push(&mut t, "CHAP_R", &chap::encode_hex(&r));
                    if let Some(m) = &cred.mutual {
                        text::push(&mut t, "CHAP_I", &m.id.to_string());
                        text::push(&mut t, "CHAP_C", &chap::encode_hex(&m.challenge));
                    }
                    self.chap_challenge = Some((id, c));
                    self.step = LoginStep::ChapR;
                    self.send_login(true, Stage::SECURITY, Stage::OPERATIONAL, &t);
                    self.pending_alg = Some(alg);
                    return;
                }
                LoginStep::ChapR => {
                    if let Some(m) = self.cfg.chap.as_ref().and_then(|c| c.mutual.clone()) {
                        let alg = self.pending_alg.unwrap_or(ChapAlgorithm::MD5);
                        let want = alg.response(m.id, &m.target_secret.0, &m.challenge).unwrap_or_default();
                        let got = get("CHAP_R").and_then(|r| chap::decode_binary(&r)).unwrap_or_default();
                        let name_ok =
                            m.target_user.is_empty() || get("CHAP_N").as_deref() == Some(m.target_user.as_str());
                        if !name_ok || !chap::constant_time_eq(&want, &got) {
                            self.fail_login(HostEvent::TargetNotAuthenticated);
                            return;
                        }
                    }
                }
                _ => {}
            }
            if !transit {
                self.send_login(true, Stage::SECURITY, Stage::OPERATIONAL, &[]);
                return;
            }
        }
        if transit && b.nsg() == Stage::FULL_FEATURE {
            self.tsih = b.tsih();
            self.enter_full_feature();
            return;
        }
        if transit && b.nsg() == Stage::OPERATIONAL || self.step != LoginStep::Operational {
            self.step = LoginStep::Operational;
            let mut t = Vec::new();
            for (k, v) in text::offer(&self.cfg.params, session) {
                text::push(&mut t, &k, &v);
            }
            self.send_login(true, Stage::OPERATIONAL, Stage::FULL_FEATURE, &t);
            return;
        }
        // The target wants another round: ask to go on.
        self.send_login(true, Stage::OPERATIONAL, Stage::FULL_FEATURE, &[]);
    }

    fn enter_full_feature(&mut self) {
        if self.params.first_burst_length > self.params.max_burst_length {
            self.params.first_burst_length = self.params.max_burst_length;
        }
        self.rx_framing = Framing {
            header_digest: self.params.header_digest,
            data_digest: self.params.data_digest,
            max_data_segment: self.params.max_recv_data_segment_length,
        };
        self.tx_framing = Framing {
            header_digest: self.params.header_digest,
            data_digest: self.params.data_digest,
            max_data_segment: self.params.peer_max_recv_data_segment_length,
        };
        self.state = HostState::FullFeature;
        self.events.push_back(HostEvent::LoggedIn { tsih: self.tsih });
    }

    /// Fills CmdSN/ExpStatSN; non-immediate PDUs consume a CmdSN.
    fn issue(&mut self, b: &mut Bhs) {
        b.set_cmd_sn(self.cmd_sn).set_exp_stat_sn(self.exp_stat_sn);
        if !b.immediate() {
            self.cmd_sn = self.cmd_sn.wrapping_add(1);
        }
    }

    /// Queues a SCSI command; it goes out when the CmdSN window allows.
    /// `write` is the data for a write (empty for none), `read_len` the
    /// expected read length. Returns the ITT.
    pub fn submit(&mut self, lun: u64, cdb: &[u8], read_len: u32, write: Vec<u8>) -> u32 {
        let itt = self.alloc_itt();
        let write_len = u32::try_from(write.len()).unwrap_or(u32::MAX);
        self.tasks.insert(itt, HostTask { lun, cmd_sn: 0, write, read: Vec::new(), read_len });
        self.queue.push_back(Queued { itt, lun, cdb: cdb.to_vec(), read_len, write_len });
        self.flush_queue();
        itt
    }

    /// Commands waiting for the CmdSN window to open.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    fn flush_queue(&mut self) {
        while self.state == HostState::FullFeature && sn_le(self.cmd_sn, self.max_cmd_sn) {
            let Some(q) = self.queue.pop_front() else { break };
            self.send_command(q);
        }
    }

    fn send_command(&mut self, q: Queued) {
        let p = self.params;
        let max_pdu = p.peer_max_recv_data_segment_length.max(512);
        let (write_len, read_len) = (q.write_len, q.read_len);
        let unsolicited_max = if p.initial_r2t && !p.immediate_data { 0 } else { p.first_burst_length.min(write_len) };
        let immediate_len = if p.immediate_data { unsolicited_max.min(max_pdu) } else { 0 };
        let data_out_unsol = !p.initial_r2t && unsolicited_max > immediate_len;
        let mut b = Bhs::new(Opcode::SCSI_CMD);
        let mut f = if data_out_unsol { 0 } else { flags::FINAL };
        if read_len > 0 {
            f |= flags::READ;
        }
        if write_len > 0 {
            f |= flags::WRITE;
        }
        b.set_flags(f | 1) // SIMPLE task attribute
            .set_lun(q.lun)
            .set_itt(q.itt)
            .set_expected_data_transfer_length(if write_len > 0 { write_len } else { read_len })
            .set_cdb(&q.cdb);
        let ahs = if q.cdb.len() > 16 {
            let mut spec = vec![0u8];
            spec.extend_from_slice(q.cdb.get(16..).unwrap_or_default());
            ahs_entry(ahs_type::EXTENDED_CDB, &spec)
        } else {
            Vec::new()
        };
        let cmd_sn = self.cmd_sn;
        self.issue(&mut b);
        let Some(task) = self.tasks.get_mut(&q.itt) else { return };
        task.cmd_sn = cmd_sn;
        let imm = task.write.get(..immediate_len as usize).unwrap_or_default().to_vec();
        pdu::encode(&mut self.tx, &b, &ahs, &imm, self.tx_framing);
        if data_out_unsol {
            self.send_data_out(q.itt, RESERVED_TAG, immediate_len, unsolicited_max.saturating_sub(immediate_len));
        }
    }

    fn send_data_out(&mut self, itt: u32, ttt: u32, offset: u32, len: u32) {
        let max_pdu = self.params.peer_max_recv_data_segment_length.max(512);
        let Some(task) = self.tasks.get(&itt) else { return };
        let lun = task.lun;
        let end = offset.saturating_add(len);
        let mut at = offset;
        let mut data_sn = 0u32;
        let mut out = Vec::new();
        while at < end {
            let n = end.saturating_sub(at).min(max_pdu);
            let next = at.saturating_add(n);
            let chunk = task.write.get(at as usize..next as usize).unwrap_or_default();
            let mut b = Bhs::new(Opcode::DATA_OUT);
            b.set_flags(if next == end { flags::FINAL } else { 0 })
                .set_lun(lun)
                .set_itt(itt)
                .set_ttt(ttt)
                .set_exp_stat_sn(self.exp_stat_sn)
                .set_data_sn(data_sn)
                .set_buffer_offset(at);
            pdu::encode(&mut out, &b, &[], chunk, self.tx_framing);
            data_sn = data_sn.wrapping_add(1);
            at = next;
        }
        self.tx.extend_from_slice(&out);
    }

    fn on_r2t(&mut self, b: &Bhs) {
        self.send_data_out(b.itt(), b.ttt(), b.buffer_offset(), b.residual_count());
    }

    fn on_data_in(&mut self, b: &Bhs, data: &[u8]) {
        let Some(task) = self.tasks.get_mut(&b.itt()) else { return };
        let off = b.buffer_offset() as usize;
        let end = off.saturating_add(data.len());
        if end <= task.read_len as usize {
            if task.read.len() < end {
                task.read.resize(end, 0);
            }
            if let Some(dst) = task.read.get_mut(off..end) {
                dst.copy_from_slice(data);
            }
        }
        if b.flags() & flags::STATUS != 0 {
            self.complete(b, Vec::new(), true);
        }
    }

    fn on_scsi_resp(&mut self, b: &Bhs, data: &[u8]) {
        let sense = match data.get(..2) {
            Some(&[hi, lo]) => {
                let n = usize::from(u16::from_be_bytes([hi, lo]));
                data.get(2..2usize.saturating_add(n)).unwrap_or_default().to_vec()
            }
            _ => Vec::new(),
        };
        self.complete(b, sense, false);
    }

    fn complete(&mut self, b: &Bhs, sense: Vec<u8>, collapsed: bool) {
        let Some(task) = self.tasks.remove(&b.itt()) else { return };
        let f = b.flags();
        let residual = if f & flags::UNDERFLOW != 0 {
            Some(Residual::Underflow(b.residual_count()))
        } else if f & flags::OVERFLOW != 0 {
            Some(Residual::Overflow(b.residual_count()))
        } else {
            None
        };
        self.events.push_back(HostEvent::Completion(Completion {
            itt: b.itt(),
            status: b.byte3(),
            response: if collapsed { 0 } else { b.byte2() },
            residual,
            sense,
            data: task.read,
            collapsed,
        }));
    }

    /// Sends a NOP-Out ping carrying `data`; the answer is [`HostEvent::NopIn`].
    pub fn nop(&mut self, data: &[u8]) -> u32 {
        let itt = self.alloc_itt();
        let mut b = Bhs::new(Opcode::NOP_OUT);
        b.set_immediate(true).set_flags(flags::FINAL).set_itt(itt).set_ttt(RESERVED_TAG);
        self.issue(&mut b);
        self.send_raw(&b, &[], data);
        itt
    }

    /// Sends `SendTargets=<value>`; the answer is [`HostEvent::Text`].
    pub fn send_targets(&mut self, value: &str) -> u32 {
        let itt = self.alloc_itt();
        let mut t = Vec::new();
        text::push(&mut t, "SendTargets", value);
        self.text_request(itt, &t);
        itt
    }

    /// Sends a Text Request with `data` (already `key=value\0` encoded).
    pub fn text_request(&mut self, itt: u32, data: &[u8]) {
        let mut b = Bhs::new(Opcode::TEXT_REQ);
        b.set_flags(flags::FINAL).set_itt(itt).set_ttt(RESERVED_TAG);
        self.issue(&mut b);
        self.send_raw(&b, &[], data);
    }

    /// Sends a task management request (immediate).
    pub fn task_mgmt(&mut self, function: u8, lun: u64, referenced_itt: u32) -> u32 {
        let itt = self.alloc_itt();
        let ref_cmd_sn = self.tasks.get(&referenced_itt).map_or(self.cmd_sn, |t| t.cmd_sn);
        let mut b = Bhs::new(Opcode::TASK_MGMT_REQ);
        b.set_immediate(true)
            .set_flags(flags::FINAL | (function & 0x7f))
            .set_lun(lun)
            .set_itt(itt)
            .set_referenced_task_tag(referenced_itt)
            .set_ref_cmd_sn(ref_cmd_sn);
        self.issue(&mut b);
        self.send_raw(&b, &[], &[]);
        itt
    }

    /// Drops a task locally (after an ABORT TASK completed).
    pub fn forget(&mut self, itt: u32) {
        self.tasks.remove(&itt);
    }

    /// Sends a Logout Request with `reason` (0: close the session).
    pub fn logout(&mut self, reason: u8) -> u32 {
        let itt = self.alloc_itt();
        let mut b = Bhs::new(Opcode::LOGOUT_REQ);
        b.set_immediate(true).set_flags(flags::FINAL | (reason & 0x7f)).set_itt(itt).set_cid(0);
        self.issue(&mut b);
        self.send_raw(&b, &[], &[]);
        itt
    }
}
