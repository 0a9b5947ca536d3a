//! One queue of one connection: the unit a transport drives.
//!
//! A queue starts unconnected; Fabrics Connect makes it the admin queue of
//! a new controller or an I/O queue of an existing one. [`Queue::execute`]
//! parses and checks a command and says what to do next ([`Outcome`]).

use crate::controller::Controller;
use crate::io::{BlockOp, BlockRequest};
use crate::model::{Subsystem, Target, Transport};
use block::BlockDevice;
use nvme_spec::fabrics::{connect_invalid_param_result, ConnectCmd, ConnectData, PropertyCmd};
use nvme_spec::opcode::{Admin, FabricsType};
use nvme_spec::{regs, Cqe, Sqe, Status};
use rustc_hash::FxHashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use zerocopy::FromBytes;

/// The fewest entries an admin queue may have whatever the I/O queues'
/// limit (`Settings::queue_entries`): the 32 Linux's host asks for.
const ADMIN_QUEUE_ENTRIES_MIN: u16 = 32;

/// What a queue is after Connect.
#[derive(Debug)]
pub enum QueueKind<D> {
    /// No Connect yet: only Connect is accepted.
    Unconnected,
    /// The admin queue of a controller.
    Admin(Arc<Controller<D>>),
    /// I/O queue `qid` of a controller.
    Io(Arc<Controller<D>>, u16),
}

/// What the transport does with a command next.
#[derive(Debug)]
pub enum Outcome<B, D> {
    /// Send the completion, preceded by `data` for the host when non-empty.
    Complete {
        /// The completion.
        cqe: Cqe,
        /// Controller-to-host data.
        data: Vec<u8>,
    },
    /// Fetch `len` bytes of host data, then hand them to
    /// [`Queue::data_arrived`] (the queue keeps the command until then).
    NeedData {
        /// Bytes to solicit.
        len: u32,
        /// The device never looks at these bytes (a plain Write to a null
        /// device): the transport must still receive and check them
        /// (digests, lengths), but need not place them anywhere, and the
        /// buffer it hands to [`Queue::data_arrived`] may hold anything.
        discard: bool,
    },
    /// Run the block request, then complete it.
    Io(BlockRequest<B, D>),
    /// Nothing now (an Asynchronous Event Request held until an event).
    Deferred,
    /// Connect succeeded: record the queue, then send the completion.
    Connected {
        /// The completion (DW0 holds the controller ID).
        cqe: Cqe,
        /// Queue ID.
        qid: u16,
        /// SQ size, 0-based.
        sqsize: u16,
        /// The host disabled SQ flow control.
        sq_flow_disabled: bool,
    },
    /// Send the completion, then close the connection (Disconnect).
    CompleteAndClose {
        /// The completion.
        cqe: Cqe,
    },
    /// The host began a normal shutdown (CC.SHN): send the completion,
    /// flush each of `devices`, then call the controller's
    /// [`shutdown_complete`](crate::Controller::shutdown_complete) (the
    /// host polls CSTS.SHST meanwhile).
    Shutdown {
        /// The completion of the Property Set.
        cqe: Cqe,
        /// The devices of the subsystem's namespaces.
        devices: Vec<Arc<D>>,
        /// The shutdown's number, for `shutdown_complete`.
        shutdown: u64,
    },
    /// The host turned the volatile write cache off (Set Features): flush
    /// each of `devices`, then send the completion (Internal Error if a
    /// flush failed). From then on the host sends no Flush, so what it
    /// wrote while the cache was on is made durable before it is told.
    FlushThenComplete {
        /// The completion of the Set Features.
        cqe: Cqe,
        /// The subsystem's namespaces' devices with a volatile write cache.
        devices: Vec<Arc<D>>,
    },
}

impl<B, D> Outcome<B, D> {
    /// The same outcome with the data buffer of its block request, if
    /// any, turned into another type (data the host sent in the receive
    /// buffer, copied out only when the request cannot run at once).
    pub fn map_data<C>(self, f: impl FnOnce(B) -> C) -> Outcome<C, D> {
        match self {
            Outcome::Complete { cqe, data } => Outcome::Complete { cqe, data },
            Outcome::NeedData { len, discard } => Outcome::NeedData { len, discard },
            Outcome::Io(req) => Outcome::Io(req.map_data(f)),
            Outcome::Deferred => Outcome::Deferred,
            Outcome::Connected { cqe, qid, sqsize, sq_flow_disabled } => {
                Outcome::Connected { cqe, qid, sqsize, sq_flow_disabled }
            }
            Outcome::CompleteAndClose { cqe } => Outcome::CompleteAndClose { cqe },
            Outcome::Shutdown { cqe, devices, shutdown } => Outcome::Shutdown { cqe, devices, shutdown },
            Outcome::FlushThenComplete { cqe, devices } => Outcome::FlushThenComplete { cqe, devices },
        }
    }

    pub(crate) fn status(cid: u16, status: Status) -> Self {
        Outcome::Complete { cqe: Cqe::new(cid, status, 0), data: Vec::new() }
    }

    pub(crate) fn data(cid: u16, data: Vec<u8>) -> Self {
        Outcome::Complete { cqe: Cqe::new(cid, Status::SUCCESS, 0), data }
    }
}

/// A command waiting for its host data.
#[derive(Debug)]
pub(crate) struct Pending {
    sqe: Sqe,
    data_len: u32,
    /// Solicited as data the device never reads (the transport may not
    /// have kept it).
    discard: bool,
    /// The id of the namespace the command was checked against, when it
    /// addressed one: its data must not reach another that took the NSID
    /// meanwhile.
    ns: Option<u64>,
}

/// A queue of a connection.
pub struct Queue<D> {
    pub(crate) target: Arc<Target<D>>,
    pub(crate) transport: Transport,
    pub(crate) kind: QueueKind<D>,
    pub(crate) local: SocketAddr,
    pub(crate) peer: SocketAddr,
    pub(crate) aers: Vec<u16>,
    pub(crate) ns_cache: Vec<Option<crate::io::CachedNamespace<D>>>,
    pub(crate) ns_cache_gen: u64,
    pub(crate) ns_subsys: Option<Arc<Subsystem<D>>>,
    pub(crate) pending: FxHashMap<u16, Pending>,
    /// A fused Compare and Write being assembled (`fused.rs`).
    pub(crate) fused: Option<crate::fused::First<D>>,
    /// The first half of a fused operation failed before its second came:
    /// the next command, if it is that second, is aborted (`fused.rs`).
    pub(crate) fused_first_failed: bool,
    /// Completions of fused halves aborted because of their partner.
    pub(crate) fused_done: Vec<Cqe>,
    /// An I/O queue: its controller's resets when it connected
    /// ([`Queue::deleted`]).
    connected_at_reset: u64,
    /// A command with a PSDT other than 01b was logged.
    psdt_logged: bool,
}

impl<D: BlockDevice> Queue<D> {
    /// An unconnected queue on a connection from `peer` to `local`, carried
    /// by `transport`.
    pub fn new(target: Arc<Target<D>>, transport: Transport, local: SocketAddr, peer: SocketAddr) -> Self {
        Queue {
            target,
            transport,
            kind: QueueKind::Unconnected,
            local,
            peer,
            aers: Vec::new(),
            ns_cache: Vec::new(),
            ns_cache_gen: u64::MAX,
            ns_subsys: None,
            pending: FxHashMap::default(),
            fused: None,
            fused_first_failed: false,
            fused_done: Vec::new(),
            connected_at_reset: 0,
            psdt_logged: false,
        }
    }

    /// Whether `ctrl`, this I/O queue's controller, was reset since the
    /// queue connected: the reset deleted it (NVMe Base 2.0 3.7.2), and
    /// its queue ID may be a new queue's.
    pub(crate) fn deleted(&self, ctrl: &Controller<D>) -> bool {
        ctrl.resets() != self.connected_at_reset
    }

    /// What this queue is.
    pub fn kind(&self) -> &QueueKind<D> {
        &self.kind
    }

    /// The controller, once connected.
    pub fn controller(&self) -> Option<&Arc<Controller<D>>> {
        match &self.kind {
            QueueKind::Admin(c) | QueueKind::Io(c, _) => Some(c),
            QueueKind::Unconnected => None,
        }
    }

    /// Parses and checks one command. `data_len` is the transfer length its
    /// data pointer describes, as the transport parsed it (each transport
    /// has its own SGL descriptors); `data` is its host-to-controller data
    /// when it came in the capsule.
    ///
    /// A command that needs data it did not bring comes back as
    /// [`Outcome::NeedData`]; the queue keeps it until the transport hands
    /// the data to [`data_arrived`](Self::data_arrived) or gives up on it
    /// with [`data_failed`](Self::data_failed).
    pub fn execute<B: AsRef<[u8]>>(&mut self, now_ms: u64, sqe: &Sqe, data_len: u32, data: Option<B>) -> Outcome<B, D> {
        let cid = sqe.cid.get();
        if self.pending.contains_key(&cid) {
            log::warn!("{}: cid {cid} reused while that command still waits for its data", self.peer);
            return Outcome::status(cid, Status::CID_CONFLICT.dnr());
        }
        if self.fused_path(sqe) {
            return self.execute_fused(now_ms, sqe, data_len, data);
        }
        self.execute_plain(now_ms, sqe, data_len, data)
    }

    /// [`execute`](Self::execute) of a command that is not part of a
    /// fused operation (or one half of it, checked as a plain command).
    pub(crate) fn execute_plain<B: AsRef<[u8]>>(
        &mut self,
        now_ms: u64,
        sqe: &Sqe,
        data_len: u32,
        data: Option<B>,
    ) -> Outcome<B, D> {
        let cid = sqe.cid.get();
        let out = self.dispatch(now_ms, sqe, data_len, data);
        if let Outcome::NeedData { discard, .. } = out {
            let ns = match self.kind {
                QueueKind::Io(..) if sqe.opcode != Admin::FABRICS.0 => self.cached_namespace_id(sqe.nsid.get()),
                _ => None,
            };
            self.pending.insert(cid, Pending { sqe: *sqe, data_len, discard, ns });
        }
        out
    }

    /// The host data of a command that asked for it arrived: executes it.
    /// A `cid` with no such command is a transport bug or a confused host;
    /// it completes with Command Sequence Error.
    pub fn data_arrived<B: AsRef<[u8]>>(&mut self, now_ms: u64, cid: u16, data: B) -> Outcome<B, D> {
        match self.pending.remove(&cid) {
            Some(p) if crate::fused::fuse(&p.sqe) != 0 && p.sqe.opcode != Admin::FABRICS.0 => {
                if !self.is_fused_half(cid) {
                    // Its partner failed while this data was on its way.
                    return Outcome::status(cid, Status::ABORTED_FAILED_FUSED);
                }
                // Failed (its namespace replaced), the half takes its
                // partner with it.
                let out = self.dispatch(now_ms, &p.sqe, p.data_len, Some(data));
                let out = self.same_namespace(cid, &p, out);
                self.fused_half(cid, out)
            }
            Some(p) => {
                let out = self.dispatch(now_ms, &p.sqe, p.data_len, Some(data));
                match out {
                    // The namespace now stands on a device that reads what
                    // is written (replaced while the data was on its way):
                    // the bytes the transport did not keep must not land.
                    Outcome::Io(BlockRequest { ref device, op: BlockOp::Write { .. }, .. })
                        if p.discard && !device.discards_writes() =>
                    {
                        log::warn!("{}: cid {cid}: its namespace changed device while its data came", self.peer);
                        Outcome::status(cid, Status::NAMESPACE_NOT_READY)
                    }
                    out => self.same_namespace(cid, &p, out),
                }
            }
            None => {
                log::warn!("{}: data for cid {cid}, which is not waiting for any", self.peer);
                Outcome::status(cid, Status::COMMAND_SEQUENCE_ERROR.dnr())
            }
        }
    }

    /// `out`, the command `p` waited for its data as, unless it would run
    /// on another namespace than the one it was checked against: the one
    /// it addressed was removed while its data came, and another took its
    /// NSID. Then Invalid Namespace: it must not run there.
    fn same_namespace<B>(&self, cid: u16, p: &Pending, out: Outcome<B, D>) -> Outcome<B, D> {
        match out {
            Outcome::Io(ref req) if p.ns != Some(req.busy.namespace().id) => {
                log::warn!("{}: cid {cid}: its namespace was replaced while its data came", self.peer);
                Outcome::status(cid, Status::INVALID_NAMESPACE.dnr())
            }
            out => out,
        }
    }

    /// The transport could not deliver the data of `cid` (a data digest
    /// error): the command is forgotten; the transport completes it.
    pub fn data_failed(&mut self, cid: u16) {
        self.pending.remove(&cid);
        self.fused_half_failed(cid);
    }

    /// The command `sqe` took its place in the queue but never reached it:
    /// the transport lost its capsule's data (a digest error) or withdrew
    /// it for an Abort, and completes it itself. A fused pair it belonged
    /// to, or that waited for it, ends with it ([`Queue::poll_completion`]).
    pub fn command_lost(&mut self, sqe: &Sqe) {
        self.fused_command_lost(sqe);
    }

    /// The id of namespace `nsid` in this queue's cache.
    fn cached_namespace_id(&self, nsid: u32) -> Option<u64> {
        self.ns_cache.get(nsid as usize)?.as_ref().map(|(ns, _)| ns.id)
    }

    /// Commands waiting for their host data.
    pub fn awaiting_data(&self) -> usize {
        self.pending.len()
    }

    fn dispatch<B: AsRef<[u8]>>(&mut self, now_ms: u64, sqe: &Sqe, data_len: u32, data: Option<B>) -> Outcome<B, D> {
        let cid = sqe.cid.get();
        if sqe.flags & Sqe::PSDT_MASK != Sqe::PSDT_SGL {
            // Over fabrics every command, Fabrics ones included, says its
            // data pointer is an SGL: PSDT 01b (NVMe Base 2.0 4.2). nvmet
            // refuses anything else before it looks at the command. Logged
            // once per queue: a host that gets it wrong gets it wrong in
            // every command.
            if !self.psdt_logged {
                self.psdt_logged = true;
                log::warn!(
                    "{}: opcode {:#04x} cid {cid} with PSDT {:02b} (expected 01b); answered Invalid Field, \
                     as every such command on this queue will be",
                    self.peer,
                    sqe.opcode,
                    sqe.flags >> 6
                );
            }
            return Outcome::status(cid, Status::INVALID_FIELD.dnr());
        }
        if sqe.opcode == Admin::FABRICS.0 {
            return self.fabrics(now_ms, sqe, data_len, data);
        }
        // Admin and I/O commands never change what the queue is (only
        // Connect does), so the controller is borrowed by moving the kind
        // out for the call: no Arc clone, a shared atomic, per command.
        let kind = std::mem::replace(&mut self.kind, QueueKind::Unconnected);
        let out = match &kind {
            QueueKind::Unconnected => {
                log::warn!("{}: opcode {:#04x} (cid {cid}) before Connect", self.peer, sqe.opcode);
                Outcome::status(cid, Status::COMMAND_SEQUENCE_ERROR.dnr())
            }
            QueueKind::Admin(ctrl) => {
                ctrl.keep_alive(now_ms);
                if ctrl.is_dead() {
                    Outcome::status(cid, Status::KEEP_ALIVE_EXPIRED.dnr())
                } else if !ctrl.enabled() {
                    log::warn!("{}: admin opcode {:#04x} while CC.EN is 0", self.peer, sqe.opcode);
                    Outcome::status(cid, Status::COMMAND_SEQUENCE_ERROR.dnr())
                } else {
                    self.admin(ctrl, sqe, data_len, data)
                }
            }
            // Without DNR: the controller is gone (its admin queue closed,
            // a restart, keep-alive expiry) or was reset, which deleted the
            // queue, not the command's fault, and a host retries it once it
            // has reconnected.
            QueueKind::Io(ctrl, _) if ctrl.is_dead() || self.deleted(ctrl) => {
                Outcome::status(cid, Status::ABORTED_SQ_DELETION)
            }
            QueueKind::Io(ctrl, _) => self.io(ctrl, sqe, data_len, data),
        };
        self.kind = kind;
        out
    }

    fn fabrics<B: AsRef<[u8]>>(&mut self, now_ms: u64, sqe: &Sqe, data_len: u32, data: Option<B>) -> Outcome<B, D> {
        let cid = sqe.cid.get();
        let fctype = FabricsType(sqe.fctype());
        if fctype == FabricsType::CONNECT {
            return self.connect(now_ms, sqe, data_len, data);
        }
        let Some(ctrl) = self.controller().cloned() else {
            log::warn!("{}: fabrics command {:#04x} before Connect", self.peer, fctype.0);
            return Outcome::status(cid, Status::COMMAND_SEQUENCE_ERROR.dnr());
        };
        ctrl.keep_alive(now_ms);
        match fctype {
            // Property Get and Set act on the controller: admin queue
            // only (on an I/O queue one could reset the whole controller);
            // Disconnect deletes an I/O queue, and on the admin queue is
            // Invalid Queue Type (NVMe-oF 1.1 3.5).
            FabricsType::PROPERTY_GET | FabricsType::PROPERTY_SET if !matches!(self.kind, QueueKind::Admin(_)) => {
                log::warn!("{}: Property Get/Set (fctype {:#04x}) on an I/O queue", self.peer, fctype.0);
                Outcome::status(cid, Status::INVALID_OPCODE.dnr())
            }
            FabricsType::DISCONNECT if matches!(self.kind, QueueKind::Admin(_)) => {
                log::warn!("{}: Disconnect on the admin queue", self.peer);
                Outcome::status(cid, Status::DISCONNECT_INVALID_QUEUE_TYPE.dnr())
            }
            // A property is accessed at its own size, 4 or 8 bytes; a
            // reserved size (ATTRIB bits 2:0 010b..111b) is Invalid Field
            // (as SPDK), never a 4-byte access.
            FabricsType::PROPERTY_GET => {
                let p = PropertyCmd::from_sqe(sqe);
                let value = {
                    let s = ctrl.lock();
                    match (p.offset, p.len_bytes) {
                        (regs::CAP, Some(8)) => {
                            let mqes = self.target.settings.queue_entries.saturating_sub(1);
                            let discovery = ctrl.subsystem().is_some_and(|s| s.discovery);
                            Some(regs::cap(mqes, 30, !discovery))
                        }
                        (regs::VS, Some(4)) => Some(u64::from(regs::VERSION_1_4)),
                        (regs::CC, Some(4)) => Some(u64::from(s.cc)),
                        (regs::CSTS, Some(4)) => Some(u64::from(s.csts)),
                        (regs::NSSR, Some(4)) => Some(0),
                        _ => None,
                    }
                };
                match value {
                    Some(v) => {
                        let mut cqe = Cqe::new(cid, Status::SUCCESS, v as u32);
                        cqe.dw1 = ((v >> 32) as u32).into();
                        Outcome::Complete { cqe, data: Vec::new() }
                    }
                    None => {
                        log::warn!(
                            "{}: Property Get offset {:#x} ATTRIB {:#04x}: no such property of that size",
                            self.peer,
                            p.offset,
                            sqe.cdw10.get() & 0xff
                        );
                        Outcome::status(cid, Status::INVALID_FIELD.dnr())
                    }
                }
            }
            FabricsType::PROPERTY_SET => {
                let p = PropertyCmd::from_sqe(sqe);
                if p.offset == regs::CC && p.len_bytes == Some(4) {
                    let was_ready = ctrl.enabled();
                    let shutdown = ctrl.set_cc(p.value as u32);
                    if was_ready && !ctrl.enabled() && !self.aers.is_empty() {
                        // A Controller Level Reset (NVMe base 2.0 3.7.2)
                        // ends every outstanding admin command: the host
                        // forgets its Asynchronous Event Requests, and they
                        // no longer count against AERL.
                        log::debug!("{}: reset drops {} Asynchronous Event Requests", self.peer, self.aers.len());
                        self.aers.clear();
                    }
                    if let Some(shutdown) = shutdown {
                        // NVMe base 2.0 3.6.1: what was written before a
                        // normal shutdown is on non-volatile media by the
                        // time CSTS.SHST says complete.
                        let devices = ctrl
                            .subsystem()
                            .map(|s| s.namespaces().into_iter().map(|ns| ns.device.clone()).collect())
                            .unwrap_or_default();
                        return Outcome::Shutdown { cqe: Cqe::new(cid, Status::SUCCESS, 0), devices, shutdown };
                    }
                    Outcome::status(cid, Status::SUCCESS)
                } else {
                    log::warn!(
                        "{}: Property Set offset {:#x} ATTRIB {:#04x}: not a writable property of that size",
                        self.peer,
                        p.offset,
                        sqe.cdw10.get() & 0xff
                    );
                    Outcome::status(cid, Status::INVALID_FIELD.dnr())
                }
            }
            FabricsType::DISCONNECT => Outcome::CompleteAndClose { cqe: Cqe::new(cid, Status::SUCCESS, 0) },
            _ => Outcome::status(cid, Status::INVALID_OPCODE.dnr()),
        }
    }

    fn connect<B: AsRef<[u8]>>(&mut self, now_ms: u64, sqe: &Sqe, len: u32, data: Option<B>) -> Outcome<B, D> {
        let cid = sqe.cid.get();
        let invalid = |in_data: bool, off: u16| Outcome::Complete {
            cqe: Cqe::new(cid, Status::CONNECT_INVALID_PARAMETERS.dnr(), connect_invalid_param_result(in_data, off)),
            data: Vec::new(),
        };
        if !matches!(self.kind, QueueKind::Unconnected) {
            log::warn!("{}: second Connect on a connected queue", self.peer);
            return Outcome::status(cid, Status::COMMAND_SEQUENCE_ERROR.dnr());
        }
        if len as usize != core::mem::size_of::<ConnectData>() {
            log::warn!("{}: Connect refused: data length {len} (expected 1024)", self.peer);
            return Outcome::status(cid, Status::SGL_DATA_LENGTH_INVALID.dnr());
        }
        let Some(data) = data else {
            return Outcome::NeedData { len, discard: false };
        };
        let cmd = ConnectCmd::from_sqe(sqe);
        if cmd.recfmt != 0 {
            log::warn!("{}: Connect refused: RECFMT {} (expected 0)", self.peer, cmd.recfmt);
            return Outcome::Complete {
                cqe: Cqe::new(
                    cid,
                    Status::CONNECT_INCOMPATIBLE_FORMAT.dnr(),
                    connect_invalid_param_result(false, ConnectCmd::RECFMT_OFFSET),
                ),
                data: Vec::new(),
            };
        }
        let Ok(cd) = ConnectData::read_from_bytes(data.as_ref()) else {
            log::warn!("{}: Connect refused: data length {} (expected 1024)", self.peer, data.as_ref().len());
            return Outcome::status(cid, Status::SGL_DATA_LENGTH_INVALID.dnr());
        };
        let Some(subnqn) = cd.subnqn() else {
            log::warn!("{}: Connect refused: SUBNQN is empty or not NUL-terminated UTF-8", self.peer);
            return invalid(true, ConnectData::SUBNQN_OFFSET);
        };
        let Some(hostnqn) = cd.hostnqn() else {
            log::warn!("{}: Connect to {subnqn} refused: HOSTNQN is not NUL-terminated UTF-8", self.peer);
            return invalid(true, ConnectData::HOSTNQN_OFFSET);
        };
        let shown = if hostnqn.is_empty() { "(empty host NQN)" } else { hostnqn };
        let Some(subsys) = self.target.subsystem(subnqn) else {
            log::warn!("{}: Connect to unknown subsystem {subnqn} from {shown}", self.peer);
            return invalid(true, ConnectData::SUBNQN_OFFSET);
        };
        if !subsys.discovery && self.target.port_for(self.local, &self.transport).is_some_and(|p| p.discovery_only) {
            log::warn!("{}: Connect to {subnqn} on a discovery-only port", self.peer);
            return invalid(true, ConnectData::SUBNQN_OFFSET);
        }
        // An empty host NQN is let in only where any host is.
        if !subsys.allows(hostnqn) {
            log::warn!("{}: host {shown} is not allowed to connect to {subnqn}", self.peer);
            return Outcome::Complete {
                cqe: Cqe::new(
                    cid,
                    Status::CONNECT_INVALID_HOST.dnr(),
                    connect_invalid_param_result(true, ConnectData::HOSTNQN_OFFSET),
                ),
                data: Vec::new(),
            };
        }
        // CAP.MQES limits I/O queues only (NVMe base 2.0 3.1.4.1: for
        // fabrics it "applies to only the I/O Submission Queues"); an
        // admin queue may have the 32 entries hosts ask for (Linux's
        // NVME_AQ_DEPTH) whatever the I/O queues' limit is.
        let entries = self.target.settings.queue_entries;
        let max_sqsize = if cmd.qid == 0 { entries.max(ADMIN_QUEUE_ENTRIES_MIN) } else { entries }.saturating_sub(1);
        if cmd.sqsize == 0 || cmd.sqsize > max_sqsize {
            log::warn!("{}: Connect sqsize {} (expected 1..={max_sqsize})", self.peer, cmd.sqsize);
            return invalid(false, ConnectCmd::SQSIZE_OFFSET);
        }
        let sq_flow_disabled = cmd.cattr & ConnectCmd::CATTR_DISABLE_SQ_FLOW != 0;
        if cmd.qid == 0 {
            self.connect_admin(now_ms, cid, &cmd, &cd, &subsys, hostnqn, sq_flow_disabled)
        } else {
            self.connect_io(cid, &cmd, &cd, &subsys, hostnqn, sq_flow_disabled)
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn connect_admin<B>(
        &mut self,
        now_ms: u64,
        cid: u16,
        cmd: &ConnectCmd,
        cd: &ConnectData,
        subsys: &Arc<Subsystem<D>>,
        hostnqn: &str,
        sq_flow_disabled: bool,
    ) -> Outcome<B, D> {
        if cd.cntlid.get() != 0xffff {
            log::warn!(
                "{}: admin Connect asks for static controller {} (only dynamic controllers)",
                self.peer,
                cd.cntlid.get()
            );
            return Outcome::Complete {
                cqe: Cqe::new(
                    cid,
                    Status::CONNECT_INVALID_PARAMETERS.dnr(),
                    connect_invalid_param_result(true, ConnectData::CNTLID_OFFSET),
                ),
                data: Vec::new(),
            };
        }
        let busy = Outcome::Complete { cqe: Cqe::new(cid, Status::CONNECT_CONTROLLER_BUSY, 0), data: Vec::new() };
        let ctrl = {
            // One lock over the count, the ID and the insertion: two
            // reactors connecting at once cannot pass the limit or share an ID.
            let mut live = subsys.controllers.lock().unwrap_or_else(|e| e.into_inner());
            let max = self.target.settings.max_controllers;
            if live.len() >= max as usize {
                log::warn!(
                    "{}: host {hostnqn} refused: {} has {max} controllers ([limits] controllers_per_subsystem)",
                    self.peer,
                    subsys.nqn
                );
                return busy;
            }
            let ip = self.peer.ip();
            let per_host = self.target.settings.max_controllers_per_host;
            if live.values().filter(|c| c.peer_ip == ip).count() >= per_host as usize {
                log::warn!(
                    "{}: host {hostnqn} refused: {ip} has {per_host} controllers of {} ([limits] controllers_per_host)",
                    self.peer,
                    subsys.nqn
                );
                return busy;
            }
            let Some(cntlid) = subsys.alloc_cntlid(|id| !live.contains_key(&id)) else {
                log::warn!("{}: host {hostnqn} refused: no free controller ID in {}", self.peer, subsys.nqn);
                return busy;
            };
            // A discovery controller may be given no KATO (a host that
            // reads the log and disconnects); it still gets one, so that
            // a host gone without closing its connection does not hold
            // it for ever (nvmet's 120 s). An I/O controller given none
            // has none, as on nvmet. A KATO is rounded up to the KAS
            // granularity.
            let kato_ms = if subsys.discovery && cmd.kato_ms == 0 {
                crate::controller::DISCOVERY_KATO_MS
            } else {
                crate::controller::kato_rounded(cmd.kato_ms)
            };
            let io_queues = self.target.settings.max_io_queues;
            let ctrl = Arc::new(Controller::new(
                cntlid,
                subsys,
                hostnqn,
                (cd.hostid, self.peer.ip()),
                (kato_ms, io_queues),
                now_ms,
            ));
            live.insert(cntlid, ctrl.clone());
            ctrl
        };
        let cntlid = ctrl.cntlid;
        log::info!(
            "{}: host {hostnqn} created controller {cntlid} on {} over {} (kato {} ms)",
            self.peer,
            subsys.nqn,
            self.transport.name,
            cmd.kato_ms
        );
        self.kind = QueueKind::Admin(ctrl);
        Outcome::Connected {
            cqe: Cqe::new(cid, Status::SUCCESS, u32::from(cntlid)),
            qid: 0,
            sqsize: cmd.sqsize,
            sq_flow_disabled,
        }
    }

    fn connect_io<B>(
        &mut self,
        cid: u16,
        cmd: &ConnectCmd,
        cd: &ConnectData,
        subsys: &Arc<Subsystem<D>>,
        hostnqn: &str,
        sq_flow_disabled: bool,
    ) -> Outcome<B, D> {
        let invalid = |in_data: bool, off: u16| Outcome::Complete {
            cqe: Cqe::new(cid, Status::CONNECT_INVALID_PARAMETERS.dnr(), connect_invalid_param_result(in_data, off)),
            data: Vec::new(),
        };
        if subsys.discovery {
            log::warn!("{}: I/O queue Connect to the discovery subsystem", self.peer);
            return invalid(false, ConnectCmd::QID_OFFSET);
        }
        let cntlid = cd.cntlid.get();
        let ctrl = subsys.controllers.lock().unwrap_or_else(|e| e.into_inner()).get(&cntlid).cloned();
        let Some(ctrl) = ctrl else {
            log::warn!("{}: I/O queue Connect names unknown controller {cntlid} in {}", self.peer, subsys.nqn);
            return invalid(true, ConnectData::CNTLID_OFFSET);
        };
        if ctrl.hostnqn != hostnqn {
            log::warn!("{}: I/O queue Connect from {hostnqn} to controller {cntlid} of {}", self.peer, ctrl.hostnqn);
            return invalid(true, ConnectData::HOSTNQN_OFFSET);
        }
        {
            let mut s = ctrl.lock();
            // Asked under the lock a reset disables the controller under:
            // asked before it, a reset in between would leave this queue
            // connected to the disabled controller, counted after the reset.
            if !ctrl.enabled() {
                return Outcome::status(cid, Status::COMMAND_SEQUENCE_ERROR.dnr());
            }
            if cmd.qid > s.io_queues_granted || s.io_queues_connected.contains(&cmd.qid) {
                log::warn!(
                    "{}: I/O queue Connect qid {} (granted {}, in use {:?})",
                    self.peer,
                    cmd.qid,
                    s.io_queues_granted,
                    s.io_queues_connected
                );
                return invalid(false, ConnectCmd::QID_OFFSET);
            }
            s.io_queues_connected.push(cmd.qid);
            // Read under the lock a reset clears the list under: a reset
            // after this deletes the queue.
            self.connected_at_reset = ctrl.resets();
        }
        self.kind = QueueKind::Io(ctrl, cmd.qid);
        // Room for a full queue of commands waiting for their data, so that
        // the map never grows (allocates) in the middle of the I/O.
        self.pending.reserve(usize::from(cmd.sqsize).saturating_add(1));
        Outcome::Connected {
            cqe: Cqe::new(cid, Status::SUCCESS, u32::from(cntlid)),
            qid: cmd.qid,
            sqsize: cmd.sqsize,
            sq_flow_disabled,
        }
    }

    /// A completion for a held Asynchronous Event Request when an event is
    /// pending.
    pub fn poll_event(&mut self) -> Option<Cqe> {
        let QueueKind::Admin(ctrl) = &self.kind else {
            return None;
        };
        if self.aers.is_empty() {
            return None;
        }
        let dw0 = ctrl.lock().pending_aens.pop_front()?;
        let cid = self.aers.remove(0);
        Some(Cqe::new(cid, Status::SUCCESS, dw0))
    }

    /// Whether the connection must close because its controller is gone or
    /// its keep-alive timer expired at `now_ms` (the admin queue checks and
    /// tears the controller down).
    pub fn expired(&self, now_ms: u64) -> bool {
        match &self.kind {
            QueueKind::Unconnected => false,
            QueueKind::Io(c, _) => c.is_dead() || self.deleted(c),
            QueueKind::Admin(c) => {
                if c.keep_alive_expired(now_ms) {
                    log::warn!(
                        "{}: controller {} keep-alive timeout ({} ms) expired; tearing it down",
                        self.peer,
                        c.cntlid,
                        c.kato_ms()
                    );
                    c.kill();
                    true
                } else {
                    c.is_dead()
                }
            }
        }
    }

    /// Whether this is an admin queue whose controller still has I/O
    /// queues connected: closing it would take them down with their
    /// commands, so a stop closes it after them.
    pub fn has_io_queues(&self) -> bool {
        match &self.kind {
            QueueKind::Admin(c) => !c.lock().io_queues_connected.is_empty(),
            _ => false,
        }
    }

    /// The connection is gone: an admin queue takes its controller with it,
    /// an I/O queue frees its queue ID.
    pub fn close(&mut self) {
        self.pending.clear();
        self.close_aborts();
        self.fused = None;
        self.fused_first_failed = false;
        self.fused_done.clear();
        match std::mem::replace(&mut self.kind, QueueKind::Unconnected) {
            QueueKind::Admin(c) => {
                log::info!("{}: controller {} admin queue closed", self.peer, c.cntlid);
                c.kill();
            }
            // A reset already freed the ID of a queue it deleted.
            QueueKind::Io(c, _) if self.deleted(&c) => {}
            QueueKind::Io(c, qid) => c.lock().io_queues_connected.retain(|&q| q != qid),
            QueueKind::Unconnected => {}
        }
    }
}
