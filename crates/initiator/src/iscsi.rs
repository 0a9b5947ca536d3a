//! An async iSCSI initiator session on the reactor, for tests, tools and the
//! benchmark: a thin shell around the sans-IO `iscsi::host::HostConnection`.
//!
//! One [`Session`] is one TCP connection (MaxConnections=1,
//! ErrorRecoveryLevel 0). [`Session::connect`] logs in, with one-way or
//! mutual CHAP when asked; [`Session::submit`] only queues a SCSI command and
//! [`Session::next_completion`] sends what is queued and reads until a
//! command completes, so many commands may be in flight (the CmdSN window
//! is `HostConnection`'s business). Every wait on the network is bounded by
//! the session's timeout, so a silent target becomes [`Error::Timeout`],
//! never a hang. This module never parses or builds iSCSI PDUs itself
//! except through `iscsi::pdu`; SCSI failures are not errors of
//! [`Session::scsi`] but a status and sense in its [`ScsiResult`].

use ::iscsi::chap::{ChapAlgorithm, Secret};
use ::iscsi::host::{Completion, HostChap, HostConfig, HostConnection, HostEvent, HostState, MutualChap};
use ::iscsi::pdu::{Bhs, Opcode};
use ::iscsi::target::login_status as ls;
use ::iscsi::text::Params;
use ::iscsi::{PduError, RejectReason};
use rand::Rng;
use reactor::net::TcpStream;
use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub use ::iscsi::target::Residual;

/// A login status (RFC 7143 section 11.13.5): Status-Class in the high
/// byte, Status-Detail in the low byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoginStatus(pub u16);

impl LoginStatus {
    /// Status-Class (1 redirection, 2 initiator error, 3 target error).
    pub fn class(self) -> u8 {
        self.0.to_be_bytes()[0]
    }

    /// Status-Detail.
    pub fn detail(self) -> u8 {
        self.0.to_be_bytes()[1]
    }

    /// The RFC's name for the status.
    pub fn name(self) -> &'static str {
        match self.0 {
            ls::SUCCESS => "success",
            0x0101 => "target moved temporarily",
            0x0102 => "target moved permanently",
            ls::INITIATOR_ERROR => "initiator error",
            ls::AUTHENTICATION_FAILURE => "authentication failure",
            ls::AUTHORIZATION_FAILURE => "authorization failure",
            ls::NOT_FOUND => "not found",
            ls::TARGET_REMOVED => "target removed",
            ls::UNSUPPORTED_VERSION => "unsupported version",
            ls::TOO_MANY_CONNECTIONS => "too many connections",
            ls::MISSING_PARAMETER => "missing parameter",
            ls::CANT_INCLUDE_IN_SESSION => "can't include in session",
            ls::SESSION_TYPE_NOT_SUPPORTED => "session type not supported",
            ls::SESSION_DOES_NOT_EXIST => "session does not exist",
            ls::INVALID_DURING_LOGIN => "invalid during login",
            ls::TARGET_ERROR => "target error",
            ls::SERVICE_UNAVAILABLE => "service unavailable",
            0x0302 => "out of resources",
            _ => "unknown status",
        }
    }
}

impl std::fmt::Display for LoginStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "class {:#04x} detail {:#04x} ({})", self.class(), self.detail(), self.name())
    }
}

/// Sense key, additional sense code and qualifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SenseCode {
    /// Sense key.
    pub key: u8,
    /// Additional sense code (ASC).
    pub asc: u8,
    /// Additional sense code qualifier (ASCQ).
    pub ascq: u8,
}

impl SenseCode {
    /// Key, ASC and ASCQ of fixed (0x70/0x71) or descriptor (0x72/0x73)
    /// format sense data (SPC-4 section 4.5); `None` for anything else.
    pub fn parse(sense: &[u8]) -> Option<SenseCode> {
        match sense.first().map(|b| b & 0x7f)? {
            0x70 | 0x71 => Some(SenseCode {
                key: sense.get(2)? & 0x0f,
                asc: sense.get(12).copied().unwrap_or(0),
                ascq: sense.get(13).copied().unwrap_or(0),
            }),
            0x72 | 0x73 => Some(SenseCode { key: sense.get(1)? & 0x0f, asc: *sense.get(2)?, ascq: *sense.get(3)? }),
            _ => None,
        }
    }
}

impl std::fmt::Display for SenseCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:02x}/{:02x}/{:02x}", self.key, self.asc, self.ascq)
    }
}

/// What can go wrong in an iSCSI session.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The target answered the login with a non-success status.
    #[error("login refused: {0}")]
    LoginRefused(LoginStatus),
    /// Mutual CHAP: the target's answer did not prove it knows its secret,
    /// or it broke the login rules; this initiator ended the login.
    #[error("the target failed mutual authentication")]
    TargetNotAuthenticated,
    /// The target sent bytes that break iSCSI framing.
    #[error("iSCSI protocol error from the target: {0}")]
    Pdu(#[from] PduError),
    /// A socket error.
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
    /// The target closed the connection.
    #[error("connection closed by the target")]
    Closed,
    /// Nothing arrived in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// The bound that passed.
        after: Duration,
    },
    /// The target rejected a PDU of a command with a Reject PDU.
    #[error("the target rejected the PDU of task {itt:#x} (reason {reason:#04x})", reason = .reason.0)]
    Rejected {
        /// Reject reason.
        reason: RejectReason,
        /// The rejected task's ITT.
        itt: u32,
    },
    /// The command did not complete at the target (iSCSI Response not 0).
    #[error("task {itt:#x} failed at the target (iSCSI response {response:#04x})")]
    ServiceResponse {
        /// The task's ITT.
        itt: u32,
        /// The Response byte.
        response: u8,
    },
    /// A SCSI command ended with a status other than GOOD.
    #[error("SCSI status {status:#04x}{}", sense.map(|s| format!(", sense {s}")).unwrap_or_default())]
    Scsi {
        /// SCSI status.
        status: u8,
        /// Decoded sense, if any came.
        sense: Option<SenseCode>,
    },
    /// The target answered with something this initiator cannot use.
    #[error("unexpected answer: {0}")]
    Protocol(String),
    /// The request cannot be sent as asked.
    #[error("invalid request: {0}")]
    Invalid(String),
}

impl Error {
    /// The login status, if the login was refused.
    pub fn login_status(&self) -> Option<LoginStatus> {
        match self {
            Error::LoginRefused(s) => Some(*s),
            _ => None,
        }
    }

    /// The sense of a failed SCSI command, if that is what this is.
    pub fn sense(&self) -> Option<SenseCode> {
        match self {
            Error::Scsi { sense, .. } => *sense,
            _ => None,
        }
    }
}

/// Result of this module's operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How to log in.
#[derive(Clone, Debug)]
pub struct LoginOptions {
    /// InitiatorName.
    pub initiator_name: String,
    /// TargetName; `None` opens a discovery session.
    pub target_name: Option<String>,
    /// CHAP user name and secret this initiator answers with; `None`
    /// offers AuthMethod=None only.
    pub chap: Option<(String, String)>,
    /// Mutual CHAP: the user name the target must answer with (empty: any)
    /// and the target's secret. Needs `chap`.
    pub mutual: Option<(String, String)>,
    /// Ask for CRC32C header digests.
    pub header_digest: bool,
    /// Ask for CRC32C data digests.
    pub data_digest: bool,
    /// Bound on every network wait (and on the whole login).
    pub timeout: Duration,
    /// The other operational keys offered (ImmediateData, InitialR2T, burst
    /// and segment lengths...); the digest fields above override its own.
    pub params: Params,
    /// CHAP algorithms offered, in order of preference.
    pub chap_algorithms: Vec<ChapAlgorithm>,
    /// ISID; [`LoginOptions::new`] draws a random-format one, so several
    /// sessions of one initiator name never reinstate each other.
    pub isid: [u8; 6],
    /// The local address to connect from (`None`: the kernel's choice).
    pub source: Option<std::net::IpAddr>,
}

impl LoginOptions {
    /// Plain login of `initiator_name` to `target_name` (`None`: discovery),
    /// no digests, 10 s timeout, the operational keys of
    /// `HostConfig::new` (ImmediateData=Yes, InitialR2T=No, 256 KiB
    /// segments and first burst, 1 MiB bursts).
    pub fn new(initiator_name: &str, target_name: Option<&str>) -> Self {
        let defaults = HostConfig::new(initiator_name, target_name);
        let mut isid = [0u8; 6];
        rand::thread_rng().fill(&mut isid[1..]);
        // ISID type 10b: random (RFC 7143 section 10.12.5).
        isid[0] = 0x80 | (isid[0] & 0x3f);
        LoginOptions {
            initiator_name: initiator_name.to_string(),
            target_name: target_name.map(str::to_string),
            chap: None,
            mutual: None,
            header_digest: false,
            data_digest: false,
            timeout: Duration::from_secs(10),
            params: defaults.params,
            chap_algorithms: ChapAlgorithm::ALL.to_vec(),
            isid,
            source: None,
        }
    }

    fn host_config(&self) -> Result<HostConfig> {
        let mut cfg = HostConfig::new(&self.initiator_name, self.target_name.as_deref());
        cfg.isid = self.isid;
        cfg.params = self.params;
        cfg.params.header_digest = self.header_digest;
        cfg.params.data_digest = self.data_digest;
        cfg.chap = match (&self.chap, &self.mutual) {
            (None, Some(_)) => return Err(Error::Invalid("mutual CHAP needs CHAP credentials too".into())),
            (None, None) => None,
            (Some((user, secret)), mutual) => {
                let mut rng = rand::thread_rng();
                let mutual = mutual.as_ref().map(|(target_user, target_secret)| {
                    let mut challenge = vec![0u8; 32];
                    rng.fill(&mut challenge[..]);
                    MutualChap {
                        target_user: target_user.clone(),
                        target_secret: Secret::from(target_secret.as_str()),
                        id: rng.gen(),
                        challenge,
                    }
                });
                Some(HostChap {
                    user: user.clone(),
                    secret: Secret::from(secret.as_str()),
                    algorithms: self.chap_algorithms.clone(),
                    mutual,
                })
            }
        };
        Ok(cfg)
    }
}

/// The outcome of one SCSI command that completed at the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScsiResult {
    /// SCSI status (0 GOOD, 2 CHECK CONDITION, ...).
    pub status: u8,
    /// Sense data, empty when none came.
    pub sense: Vec<u8>,
    /// Data read (Data-In), as far as it came.
    pub data: Vec<u8>,
    /// Residual the target reported.
    pub residual: Option<Residual>,
}

impl ScsiResult {
    /// Whether the status is GOOD.
    pub fn is_good(&self) -> bool {
        self.status == scsi::status::GOOD
    }

    /// The decoded sense, if any came.
    pub fn sense_code(&self) -> Option<SenseCode> {
        SenseCode::parse(&self.sense)
    }

    /// Turns a status other than GOOD into [`Error::Scsi`].
    pub fn check(self) -> Result<ScsiResult> {
        if self.is_good() {
            Ok(self)
        } else {
            Err(Error::Scsi { status: self.status, sense: self.sense_code() })
        }
    }
}

/// A target listed by SendTargets: its name and its `TargetAddress`
/// values (`ip:port,tpgt`).
pub type SendTargetsEntry = (String, Vec<String>);

/// The fields of standard INQUIRY data this initiator uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inquiry {
    /// Peripheral device type (0: direct access block device).
    pub device_type: u8,
    /// T10 vendor identification, trimmed.
    pub vendor: String,
    /// Product identification, trimmed.
    pub product: String,
    /// Product revision level, trimmed.
    pub revision: String,
    /// The whole INQUIRY data.
    pub raw: Vec<u8>,
}

/// READ CAPACITY (16) parameter data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Number of logical blocks (RETURNED LOGICAL BLOCK ADDRESS + 1).
    pub blocks: u64,
    /// Logical block length in bytes.
    pub block_len: u32,
}

/// CDBs of the commands the helpers send (SBC-3, SPC-4).
pub mod cdb {
    use scsi::op;

    /// READ (16) of `blocks` blocks at `lba`.
    pub fn read16(lba: u64, blocks: u32) -> [u8; 16] {
        rw16(op::READ_16, lba, blocks)
    }

    /// WRITE (16) of `blocks` blocks at `lba`.
    pub fn write16(lba: u64, blocks: u32) -> [u8; 16] {
        rw16(op::WRITE_16, lba, blocks)
    }

    fn rw16(opcode: u8, lba: u64, blocks: u32) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[0] = opcode;
        c[2..10].copy_from_slice(&lba.to_be_bytes());
        c[10..14].copy_from_slice(&blocks.to_be_bytes());
        c
    }

    /// Standard INQUIRY with `alloc_len` bytes.
    pub fn inquiry(alloc_len: u16) -> [u8; 6] {
        let [hi, lo] = alloc_len.to_be_bytes();
        [op::INQUIRY, 0, 0, hi, lo, 0]
    }

    /// READ CAPACITY (16): SERVICE ACTION IN (16), service action 0x10.
    pub fn read_capacity16(alloc_len: u32) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[0] = op::SERVICE_ACTION_IN_16;
        c[1] = 0x10;
        c[10..14].copy_from_slice(&alloc_len.to_be_bytes());
        c
    }

    /// REPORT LUNS, select report 0 (all logical units).
    pub fn report_luns(alloc_len: u32) -> [u8; 12] {
        let mut c = [0u8; 12];
        c[0] = op::REPORT_LUNS;
        c[6..10].copy_from_slice(&alloc_len.to_be_bytes());
        c
    }

    /// TEST UNIT READY.
    pub fn test_unit_ready() -> [u8; 6] {
        [op::TEST_UNIT_READY, 0, 0, 0, 0, 0]
    }
}

const RX_BUF: usize = 256 * 1024;

/// One iSCSI session over one TCP connection.
pub struct Session {
    stream: TcpStream,
    conn: HostConnection,
    rx: Vec<u8>,
    tx: Vec<u8>,
    /// Finished commands not yet handed out, in arrival order.
    ready: VecDeque<(u32, Result<ScsiResult>)>,
    /// Other events not yet handed out.
    events: VecDeque<HostEvent>,
    in_flight: HashSet<u32>,
    timeout: Duration,
    failed: bool,
    peer: SocketAddr,
    tsih: u16,
    discovery: bool,
}

impl Session {
    /// Opens a TCP connection to `addr` and logs in. A refused login is
    /// [`Error::LoginRefused`] with the target's status.
    pub async fn connect(addr: SocketAddr, opts: LoginOptions) -> Result<Session> {
        let cfg = opts.host_config()?;
        let stream = reactor::timeout(opts.timeout, TcpStream::connect_from(addr, opts.source))
            .await
            .map_err(|_| Error::Timeout { what: "TCP connect", after: opts.timeout })??;
        stream.set_nodelay(true)?;
        let mut s = Session {
            stream,
            conn: HostConnection::new(cfg),
            rx: Vec::with_capacity(RX_BUF),
            tx: Vec::with_capacity(64 * 1024),
            ready: VecDeque::new(),
            events: VecDeque::new(),
            in_flight: HashSet::new(),
            timeout: opts.timeout,
            failed: false,
            peer: addr,
            tsih: 0,
            discovery: opts.target_name.is_none(),
        };
        let deadline = Instant::now() + opts.timeout;
        s.flush().await?;
        loop {
            while let Some(ev) = s.events.pop_front() {
                match ev {
                    HostEvent::LoggedIn { tsih } => {
                        s.tsih = tsih;
                        return Ok(s);
                    }
                    HostEvent::LoginFailed { status } => return Err(Error::LoginRefused(LoginStatus(status))),
                    HostEvent::TargetNotAuthenticated => return Err(Error::TargetNotAuthenticated),
                    other => log::debug!("iscsi initiator: {other:?} during login"),
                }
            }
            if s.conn.state() == HostState::Closed {
                return Err(Error::Protocol("login ended without a final Login Response".into()));
            }
            s.receive("a Login Response", deadline).await?;
        }
    }

    /// The target's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The TSIH the target assigned.
    pub fn tsih(&self) -> u16 {
        self.tsih
    }

    /// The negotiated operational parameters.
    pub fn params(&self) -> &Params {
        self.conn.params()
    }

    /// The bound on every network wait.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Changes the bound on every network wait.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Commands submitted whose completion has not been returned.
    pub fn outstanding(&self) -> usize {
        self.in_flight.len()
    }

    /// Whether a transport error or timeout made the session unusable.
    pub fn is_failed(&self) -> bool {
        self.failed
    }

    /// The protocol state machine, to read sequence numbers or framing.
    pub fn connection(&self) -> &HostConnection {
        &self.conn
    }

    /// The protocol state machine, to queue hand-made PDUs (tests playing a
    /// hostile initiator). What it queues goes out on the next
    /// [`flush`](Self::flush).
    pub fn connection_mut(&mut self) -> &mut HostConnection {
        &mut self.conn
    }

    /// Sends a hand-made PDU with the connection's current framing (digests,
    /// lengths filled in by `iscsi::pdu::encode`).
    pub async fn send_raw(&mut self, bhs: &Bhs, ahs: &[u8], data: &[u8]) -> Result<()> {
        self.conn.send_raw(bhs, ahs, data);
        self.flush().await
    }

    /// Sends `bytes` as they are, after anything already queued (tests that
    /// corrupt a digest or a length).
    pub async fn send_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        self.flush().await?;
        self.write(bytes.to_vec()).await
    }

    fn fail<T>(&mut self, e: Error) -> Result<T> {
        self.failed = true;
        Err(e)
    }

    fn check_usable(&self) -> Result<()> {
        if self.failed {
            return Err(Error::Invalid("session failed earlier".into()));
        }
        Ok(())
    }

    async fn write(&mut self, buf: Vec<u8>) -> Result<()> {
        match reactor::timeout(self.timeout, self.stream.write_all(buf)).await {
            Ok((Ok(_), mut buf)) => {
                buf.clear();
                if buf.capacity() > self.tx.capacity() {
                    self.tx = buf;
                }
                Ok(())
            }
            Ok((Err(e), _)) => self.fail(Error::Io(e)),
            Err(_) => self.fail(Error::Timeout { what: "sending to the target", after: self.timeout }),
        }
    }

    /// Sends every byte waiting to be sent.
    pub async fn flush(&mut self) -> Result<()> {
        self.check_usable()?;
        let mut tx = std::mem::take(&mut self.tx);
        tx.clear();
        self.conn.take_transmit(&mut tx);
        if tx.is_empty() {
            self.tx = tx;
            return Ok(());
        }
        self.write(tx).await
    }

    /// Reads once (until `deadline`), feeds the bytes to the connection,
    /// sorts its events and sends what it queued (R2T data, ping answers).
    async fn receive(&mut self, what: &'static str, deadline: Instant) -> Result<()> {
        self.check_usable()?;
        let mut rx = std::mem::take(&mut self.rx);
        rx.clear();
        rx.reserve(RX_BUF);
        let left = deadline.saturating_duration_since(Instant::now());
        let rx = match reactor::timeout(left, self.stream.read(rx)).await {
            Ok((Ok(0), rx)) => {
                self.rx = rx;
                return self.fail(Error::Closed);
            }
            Ok((Ok(_), rx)) => rx,
            // A cancelled read may have taken bytes with it: the stream
            // cannot be trusted after a timeout.
            Ok((Err(e), _)) => return self.fail(Error::Io(e)),
            Err(_) => return self.fail(Error::Timeout { what, after: self.timeout }),
        };
        let r = self.conn.handle_input(&rx);
        self.rx = rx;
        self.sort_events();
        if let Err(e) = r {
            return self.fail(Error::Pdu(e));
        }
        self.flush().await
    }

    fn sort_events(&mut self) {
        while let Some(ev) = self.conn.poll_event() {
            match ev {
                HostEvent::Completion(c) if self.in_flight.contains(&c.itt) => {
                    self.ready.push_back((c.itt, finish(c)));
                }
                HostEvent::Completion(c) => log::debug!("iscsi initiator: completion of unknown task {:#x}", c.itt),
                HostEvent::Reject { reason, bhs: Some(b) }
                    if b.opcode() == Opcode::SCSI_CMD && self.in_flight.contains(&b.itt()) =>
                {
                    // The command will never complete (RFC 7143 section 11.17.1).
                    self.conn.forget(b.itt());
                    self.ready.push_back((b.itt(), Err(Error::Rejected { reason, itt: b.itt() })));
                }
                other => self.events.push_back(other),
            }
        }
    }

    /// The next event that is not a command completion (a Reject of a
    /// hand-made PDU, a NOP-In answer...), reading until one comes.
    pub async fn next_event(&mut self) -> Result<HostEvent> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(e) = self.events.pop_front() {
                return Ok(e);
            }
            self.flush().await?;
            self.receive("an event", deadline).await?;
        }
    }

    /// Reads until the target closes the connection and returns every
    /// event that came before (and any not yet handed out). A reset counts
    /// as a close; anything still open after the timeout is
    /// [`Error::Timeout`].
    pub async fn wait_closed(&mut self) -> Result<Vec<HostEvent>> {
        let deadline = Instant::now() + self.timeout;
        loop {
            match self.receive("the target to close the connection", deadline).await {
                Ok(()) => {}
                Err(Error::Closed) => break,
                Err(Error::Io(e))
                    if matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe) =>
                {
                    break
                }
                Err(e) => return Err(e),
            }
        }
        Ok(self.events.drain(..).collect())
    }

    async fn wait_event(&mut self, what: &'static str, mut pick: impl FnMut(&HostEvent) -> bool) -> Result<HostEvent> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(pos) = self.events.iter().position(&mut pick) {
                if let Some(e) = self.events.remove(pos) {
                    return Ok(e);
                }
            }
            self.flush().await?;
            self.receive(what, deadline).await?;
        }
    }

    /// Sends a task management request (`function` as in RFC 7143 section
    /// 11.5.1) and waits for its response code. On "function complete"
    /// the tasks it ended are forgotten: `referenced_itt` for ABORT TASK,
    /// every outstanding command otherwise (this session uses one LUN at a
    /// time in tests; no response will come for them).
    pub async fn task_mgmt(&mut self, function: u8, lun: u64, referenced_itt: u32) -> Result<u8> {
        const ABORT_TASK: u8 = 1;
        self.check_usable()?;
        let raw = scsi::encode_lun(lun).ok_or_else(|| Error::Invalid(format!("LUN {lun} beyond 16383")))?;
        let itt = self.conn.task_mgmt(function, u64::from_be_bytes(raw), referenced_itt);
        let e = self
            .wait_event("a task management response", |e| matches!(e, HostEvent::TaskMgmt { itt: i, .. } if *i == itt))
            .await?;
        let HostEvent::TaskMgmt { response, .. } = e else {
            return Err(Error::Invalid(format!("expected a task management response, got {e:?}")));
        };
        if response == 0 {
            let ended: Vec<u32> =
                if function == ABORT_TASK { vec![referenced_itt] } else { self.in_flight.iter().copied().collect() };
            for i in ended {
                self.conn.forget(i);
                self.in_flight.remove(&i);
            }
        }
        Ok(response)
    }

    /// Queues a SCSI command and returns its ITT. Nothing is sent until the
    /// next [`flush`](Self::flush) or wait. `data_out` is the data of a
    /// write (empty for none), `data_in_len` the bytes expected back.
    pub fn submit(&mut self, lun: u64, cdb: &[u8], data_out: Vec<u8>, data_in_len: u32) -> Result<u32> {
        self.check_usable()?;
        if cdb.is_empty() || cdb.len() > 16 + 244 {
            return Err(Error::Invalid(format!("CDB of {} bytes (expected 1 to 260)", cdb.len())));
        }
        if !data_out.is_empty() && data_in_len != 0 {
            return Err(Error::Invalid("bidirectional transfers are not supported".into()));
        }
        if u32::try_from(data_out.len()).is_err() {
            return Err(Error::Invalid(format!("{} bytes of write data", data_out.len())));
        }
        let raw = scsi::encode_lun(lun).ok_or_else(|| Error::Invalid(format!("LUN {lun} beyond 16383")))?;
        let itt = self.conn.submit(u64::from_be_bytes(raw), cdb, data_in_len, data_out);
        self.in_flight.insert(itt);
        Ok(itt)
    }

    /// The next command to finish, with its ITT (in arrival order).
    pub async fn next_completion(&mut self) -> Result<(u32, ScsiResult)> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some((itt, r)) = self.ready.pop_front() {
                self.in_flight.remove(&itt);
                return r.map(|r| (itt, r));
            }
            if self.in_flight.is_empty() {
                return Err(Error::Invalid("no command outstanding".into()));
            }
            self.flush().await?;
            self.receive("a SCSI response", deadline).await?;
        }
    }

    /// Commands answered and not yet taken with
    /// [`next_completion`](Self::next_completion) (kept while waiting for
    /// something else), in arrival order.
    pub fn answered(&self) -> Vec<u32> {
        self.ready.iter().map(|(itt, _)| *itt).collect()
    }

    /// Runs one SCSI command and returns its outcome whatever the status,
    /// keeping any other completion that arrives meanwhile for
    /// [`next_completion`](Self::next_completion).
    pub async fn scsi(&mut self, lun: u64, cdb: &[u8], data_out: Vec<u8>, data_in_len: u32) -> Result<ScsiResult> {
        let itt = self.submit(lun, cdb, data_out, data_in_len)?;
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(pos) = self.ready.iter().position(|(i, _)| *i == itt) {
                if let Some((_, r)) = self.ready.remove(pos) {
                    self.in_flight.remove(&itt);
                    return r;
                }
            }
            self.flush().await?;
            self.receive("a SCSI response", deadline).await?;
        }
    }

    /// READ (16): `blocks` blocks of `block_len` bytes at `lba`.
    pub async fn read16(&mut self, lun: u64, lba: u64, blocks: u32, block_len: u32) -> Result<Vec<u8>> {
        let len = blocks
            .checked_mul(block_len)
            .ok_or_else(|| Error::Invalid(format!("{blocks} blocks of {block_len} bytes")))?;
        let r = self.scsi(lun, &cdb::read16(lba, blocks), Vec::new(), len).await?.check()?;
        if r.data.len() != len as usize {
            return Err(Error::Protocol(format!("READ (16) returned {} bytes (expected {len})", r.data.len())));
        }
        Ok(r.data)
    }

    /// WRITE (16) of `data` (a whole number of `block_len` blocks) at `lba`.
    pub async fn write16(&mut self, lun: u64, lba: u64, block_len: u32, data: Vec<u8>) -> Result<()> {
        let bl = block_len as usize;
        if bl == 0 || data.is_empty() || !data.len().is_multiple_of(bl) {
            return Err(Error::Invalid(format!(
                "{} bytes is not a whole number of {block_len}-byte blocks",
                data.len()
            )));
        }
        let blocks = u32::try_from(data.len() / bl).map_err(|_| Error::Invalid("too many blocks".into()))?;
        self.scsi(lun, &cdb::write16(lba, blocks), data, 0).await?.check()?;
        Ok(())
    }

    /// Standard INQUIRY.
    pub async fn inquiry(&mut self, lun: u64) -> Result<Inquiry> {
        let r = self.scsi(lun, &cdb::inquiry(96), Vec::new(), 96).await?.check()?;
        let d = r.data;
        if d.len() < 36 {
            return Err(Error::Protocol(format!("INQUIRY data of {} bytes (expected at least 36)", d.len())));
        }
        let text = |a: usize, b: usize| String::from_utf8_lossy(&d[a..b]).trim().to_string();
        Ok(Inquiry {
            device_type: d[0] & 0x1f,
            vendor: text(8, 16),
            product: text(16, 32),
            revision: text(32, 36),
            raw: d.clone(),
        })
    }

    /// READ CAPACITY (16).
    pub async fn read_capacity16(&mut self, lun: u64) -> Result<Capacity> {
        let r = self.scsi(lun, &cdb::read_capacity16(32), Vec::new(), 32).await?.check()?;
        let d = &r.data;
        let (Some(lba), Some(bl)) = (d.get(0..8), d.get(8..12)) else {
            return Err(Error::Protocol(format!("READ CAPACITY (16) data of {} bytes (expected 32)", d.len())));
        };
        let last = u64::from_be_bytes(lba.try_into().unwrap_or_default());
        Ok(Capacity {
            blocks: last.saturating_add(1),
            block_len: u32::from_be_bytes(bl.try_into().unwrap_or_default()),
        })
    }

    /// REPORT LUNS (sent to LUN 0): the LUN numbers of the target.
    pub async fn report_luns(&mut self) -> Result<Vec<u64>> {
        const ALLOC: u32 = 8 + 8 * 512;
        let r = self.scsi(0, &cdb::report_luns(ALLOC), Vec::new(), ALLOC).await?.check()?;
        let d = &r.data;
        let list_len = d.get(0..4).map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])) as usize;
        let entries = d.get(8..).unwrap_or_default();
        let entries = entries.get(..list_len.min(entries.len())).unwrap_or_default();
        let mut luns = Vec::new();
        for e in entries.chunks_exact(8) {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(e);
            match scsi::decode_lun(raw) {
                Some(scsi::Lun::Unit(n)) => luns.push(n),
                other => return Err(Error::Protocol(format!("REPORT LUNS entry {raw:02x?} ({other:?})"))),
            }
        }
        Ok(luns)
    }

    /// TEST UNIT READY.
    pub async fn test_unit_ready(&mut self, lun: u64) -> Result<()> {
        self.scsi(lun, &cdb::test_unit_ready(), Vec::new(), 0).await?.check()?;
        Ok(())
    }

    /// Consumes the unit attentions a target reports to a new I_T nexus
    /// (power on, reset, parameters changed: tgt and LIO raise one on the
    /// first command of each session) with TEST UNIT READY, as an
    /// initiator does before I/O, so that I/O commands do not meet them.
    /// Returns how many there were; any other failure is the error.
    pub async fn clear_unit_attentions(&mut self, lun: u64) -> Result<u32> {
        const UNIT_ATTENTION: u8 = 0x6;
        for n in 0..16 {
            let r = self.scsi(lun, &cdb::test_unit_ready(), Vec::new(), 0).await?;
            match r.sense_code() {
                Some(s) if !r.is_good() && s.key == UNIT_ATTENTION => continue,
                _ => {
                    r.check()?;
                    return Ok(n);
                }
            }
        }
        Err(Error::Protocol("unit attentions keep coming (16 TEST UNIT READY)".into()))
    }

    /// NOP-Out ping carrying `data`; returns the echoed data.
    pub async fn ping(&mut self, data: &[u8]) -> Result<Vec<u8>> {
        self.check_usable()?;
        let itt = self.conn.nop(data);
        let ev = self
            .wait_event("a NOP-In", |e| {
                matches!(e, HostEvent::NopIn { itt: i, .. } if *i == itt) || is_reject_of(e, itt)
            })
            .await?;
        match ev {
            HostEvent::NopIn { data, .. } => Ok(data),
            other => Err(rejected(other, itt)),
        }
    }

    /// Text Request SendTargets: the targets and their addresses, in the
    /// order the target listed them. A discovery session asks for `All`
    /// (every target this initiator may log in to); a normal session sends
    /// an empty value, which names the session's own target (`All` is for
    /// discovery sessions only, RFC 7143 appendix C).
    pub async fn send_targets(&mut self) -> Result<Vec<SendTargetsEntry>> {
        self.check_usable()?;
        let itt = self.conn.send_targets(if self.discovery { "All" } else { "" });
        let ev = self
            .wait_event("a Text Response", |e| {
                matches!(e, HostEvent::Text { itt: i, .. } if *i == itt) || is_reject_of(e, itt)
            })
            .await?;
        let HostEvent::Text { pairs, .. } = ev else { return Err(rejected(ev, itt)) };
        let mut out: Vec<SendTargetsEntry> = Vec::new();
        for (k, v) in pairs {
            match (k.as_str(), out.last_mut()) {
                ("TargetName", _) => out.push((v, Vec::new())),
                ("TargetAddress", Some(t)) => t.1.push(v),
                ("TargetAddress", None) => {
                    return Err(Error::Protocol(format!("TargetAddress={v} before any TargetName")))
                }
                ("SendTargets", _) => return Err(Error::Protocol(format!("SendTargets={v}"))),
                _ => {}
            }
        }
        Ok(out)
    }

    /// Logout (reason 0, close the session) and waits for the response.
    /// Commands still outstanding are waited for by the target first.
    pub async fn logout(mut self) -> Result<()> {
        self.check_usable()?;
        let itt = self.conn.logout(0);
        let ev = self
            .wait_event("a Logout Response", |e| matches!(e, HostEvent::LoggedOut { .. }) || is_reject_of(e, itt))
            .await?;
        match ev {
            HostEvent::LoggedOut { response: 0, .. } => Ok(()),
            HostEvent::LoggedOut { response, .. } => Err(Error::Protocol(format!("Logout Response {response}"))),
            other => Err(rejected(other, itt)),
        }
    }
}

fn is_reject_of(e: &HostEvent, itt: u32) -> bool {
    matches!(e, HostEvent::Reject { bhs: Some(b), .. } if b.itt() == itt)
}

fn rejected(e: HostEvent, itt: u32) -> Error {
    match e {
        HostEvent::Reject { reason, .. } => Error::Rejected { reason, itt },
        other => Error::Protocol(format!("{other:?}")),
    }
}

fn finish(c: Completion) -> Result<ScsiResult> {
    if c.response != 0 {
        return Err(Error::ServiceResponse { itt: c.itt, response: c.response });
    }
    Ok(ScsiResult { status: c.status, sense: c.sense, data: c.data, residual: c.residual })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sense_code_reads_fixed_and_descriptor_formats() {
        let fixed = scsi::Sense::LBA_OUT_OF_RANGE.to_fixed_bytes();
        assert_eq!(SenseCode::parse(&fixed), Some(SenseCode { key: 0x05, asc: 0x21, ascq: 0x00 }));
        let desc = scsi::Sense::UA_LUN_RESET.to_descriptor_bytes();
        assert_eq!(SenseCode::parse(&desc), Some(SenseCode { key: 0x06, asc: 0x29, ascq: 0x03 }));
        assert_eq!(SenseCode::parse(&[]), None);
        assert_eq!(SenseCode::parse(&[0x70]), None, "fixed format cut before the key");
        assert_eq!(SenseCode::parse(&[0x00, 0, 5]), None, "not a sense response code");
    }

    #[test]
    fn login_status_names_class_and_detail() {
        let s = LoginStatus(0x0201);
        assert_eq!((s.class(), s.detail()), (0x02, 0x01));
        assert_eq!(s.to_string(), "class 0x02 detail 0x01 (authentication failure)");
        assert_eq!(Error::LoginRefused(LoginStatus(0x0203)).login_status(), Some(LoginStatus(0x0203)));
    }

    #[test]
    fn cdbs_put_lba_and_length_where_sbc_says() {
        let r = cdb::read16(0x0102_0304_0506_0708, 0x0a0b_0c0d);
        assert_eq!(r[0], 0x88);
        assert_eq!(r[2..10], [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(r[10..14], [0x0a, 0x0b, 0x0c, 0x0d]);
        assert_eq!(cdb::write16(0, 1)[0], 0x8a);
        assert_eq!(cdb::inquiry(0x0160), [0x12, 0, 0, 0x01, 0x60, 0]);
        let c = cdb::read_capacity16(32);
        assert_eq!((c[0], c[1], c[13]), (0x9e, 0x10, 32));
        assert_eq!(cdb::report_luns(0x0102)[6..10], [0, 0, 1, 2]);
    }

    #[test]
    fn login_options_draw_random_format_isids_and_refuse_mutual_without_chap() {
        let a = LoginOptions::new("iqn.2026-11.test:h", Some("iqn.2026-11.test:t"));
        let b = LoginOptions::new("iqn.2026-11.test:h", Some("iqn.2026-11.test:t"));
        assert_eq!(a.isid[0] & 0xc0, 0x80, "ISID type random");
        assert_ne!(a.isid, b.isid);
        let bad = LoginOptions { mutual: Some(("t".into(), "target-secret-1".into())), ..a };
        assert!(matches!(bad.host_config(), Err(Error::Invalid(_))));
    }
}
