//! The logical unit: identity, limits, shared state (write cache setting,
//! reservations, unit attentions per I_T nexus) and command dispatch.
//!
//! Every command passes one gate before it runs: pending unit attention
//! (SAM-5 5.14), then reservation conflict (SPC-4 5.9.1, table 62, and
//! SPC-2 reservations). Media access commands skip the state lock while no
//! unit attention is pending and no reservation or registration exists, so
//! the I/O path only reads two atomics.

use crate::cdb::{self, op, Bytes};
use crate::pr::{self, NexusId};
use crate::sense::{status, Sense};
use crate::DataOut;
use crate::{inquiry, lun, mode, opcodes, sbc, Outcome};
use block::BlockDevice;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// One I_T nexus: an initiator port talking to a target port (SAM-5 4.6).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Nexus {
    /// Initiator port name: iSCSI name + ",i,0x" + ISID in hex.
    pub initiator: String,
    /// Target port name: iSCSI target name + ",t,0x" + TPGT in hex.
    pub target_port: String,
    /// Relative target port identifier (non-zero).
    pub relative_port: u16,
    /// Target portal group tag (reported as the target port group).
    pub tpgt: u16,
}

impl Nexus {
    /// The target device name: `target_port` without its ",t,0x…" suffix.
    pub fn target_name(&self) -> &str {
        match self.target_port.find(",t,0x") {
            Some(i) => self.target_port.get(..i).unwrap_or(&self.target_port),
            None => &self.target_port,
        }
    }

    /// The nexus as reservations know it.
    pub fn id(&self) -> NexusId {
        NexusId { initiator: self.initiator.clone(), target_port: self.target_port.clone() }
    }

    /// Whether `id` names this nexus.
    pub fn is(&self, id: &NexusId) -> bool {
        self.initiator == id.initiator && self.target_port == id.target_port
    }
}

/// Limits advertised in the Block Limits VPD page and enforced on commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// MAXIMUM TRANSFER LENGTH in blocks for READ/WRITE/VERIFY.
    pub max_transfer_blocks: u32,
    /// MAXIMUM UNMAP LBA COUNT (blocks per UNMAP command).
    pub max_unmap_lba_count: u32,
    /// MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT.
    pub max_unmap_descriptors: u32,
    /// MAXIMUM WRITE SAME LENGTH in blocks.
    pub max_write_same_blocks: u64,
    /// MAXIMUM COMPARE AND WRITE LENGTH in blocks (1..=255).
    pub max_compare_and_write_blocks: u8,
    /// Logical blocks per physical block, as a power of two exponent
    /// (READ CAPACITY(16) LBPPBE; the optimal transfer granularity).
    pub physical_block_exponent: u8,
}

impl Limits {
    /// Defaults for a device with `block_size`-byte blocks: 8 MiB transfers
    /// (LIO's file backend allows as much, and libiscsi's tests send 2048-
    /// and 257-block WRITEs whatever the Block Limits page says), UNMAP of up to 1 GiB (at most 2^20 blocks, the most libiscsi's
    /// BlockLimits test calls sane), WRITE SAME of up to 65535 blocks (LIO's
    /// limit; initiators and libiscsi's WriteSame16.Unmap test read and
    /// write a whole WRITE SAME range in one command when it allows 65536),
    /// and physical blocks the size of logical blocks: the backends report
    /// no larger physical block, and a RAM or null device has none.
    pub fn for_block_size(block_size: u32) -> Limits {
        let bs = block_size.max(1);
        let max_transfer_blocks = ((8 << 20) / bs).max(1);
        Limits {
            max_transfer_blocks,
            max_unmap_lba_count: ((1u64 << 30) / u64::from(bs)).clamp(1, 1 << 20) as u32,
            max_unmap_descriptors: 256,
            max_write_same_blocks: 0xFFFF,
            max_compare_and_write_blocks: (max_transfer_blocks / 2).clamp(1, 255) as u8,
            physical_block_exponent: 0,
        }
    }
}

/// Mutable per-LU state behind the lock.
#[derive(Default)]
pub(crate) struct LuState {
    /// WCE of the caching mode page.
    pub wce: bool,
    /// SWP of the control mode page: the medium is write protected.
    pub swp: bool,
    /// Known I_T nexuses with their pending unit attentions, oldest first.
    pub nexuses: HashMap<NexusId, VecDeque<Sense>>,
    /// Nexuses lost (session ended) with the unit attentions they were
    /// not yet told, oldest first, kept for the session that reinstates
    /// them ([`LOST_KEPT`] at most). Apart from `nexuses`: no command
    /// comes from them, so they keep no command off the fast path.
    pub lost: VecDeque<(NexusId, VecDeque<Sense>)>,
    /// SPC-2 RESERVE(6) holder.
    pub spc2_holder: Option<NexusId>,
    /// Persistent reservations.
    pub pr: pr::PrState,
}

impl LuState {
    /// Queues `ua` for every known nexus except `except` (lost ones that
    /// still wait to be told something included).
    pub fn unit_attention_all(&mut self, ua: Sense, except: Option<&NexusId>) {
        for (id, q) in self.nexuses.iter_mut().chain(self.lost.iter_mut().map(|(id, q)| (&*id, q))) {
            if Some(id) != except {
                push_ua(q, ua);
            }
        }
    }

    /// Queues `ua` for one nexus.
    pub fn unit_attention(&mut self, id: &NexusId, ua: Sense) {
        push_ua(self.nexuses.entry(id.clone()).or_default(), ua);
    }

    /// Queues `ua` for a registrant, which may have no session now (its
    /// initiator down, as the node a cluster fences often is): one that is
    /// lost keeps it among the lost nexuses, for the session that
    /// reinstates it, so that no live nexus's command leaves the fast path
    /// for it.
    pub fn unit_attention_registrant(&mut self, id: &NexusId, ua: Sense) {
        if let Some(q) = self.nexuses.get_mut(id) {
            push_ua(q, ua);
        } else if let Some((_, q)) = self.lost.iter_mut().find(|(l, _)| l == id) {
            push_ua(q, ua);
        } else {
            let mut q = VecDeque::new();
            push_ua(&mut q, ua);
            self.keep_lost(id.clone(), q);
        }
    }

    /// Keeps a lost nexus's pending unit attentions, the oldest lost
    /// nexuses' going past [`LOST_KEPT`].
    fn keep_lost(&mut self, id: NexusId, q: VecDeque<Sense>) {
        self.lost.retain(|(l, _)| *l != id);
        self.lost.push_back((id, q));
        if self.lost.len() > LOST_KEPT {
            self.lost.pop_front();
        }
    }

    fn quiet(&self) -> bool {
        self.spc2_holder.is_none() && self.pr.is_empty() && self.nexuses.values().all(VecDeque::is_empty)
    }
}

fn push_ua(q: &mut VecDeque<Sense>, ua: Sense) {
    // SAM-5 5.14: a queue of distinct conditions; keep it bounded.
    if !q.contains(&ua) && q.len() < 16 {
        q.push_back(ua);
    }
}

/// What a command may do under a reservation held by someone else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Never conflicts (INQUIRY, REPORT LUNS, READ CAPACITY …).
    Always,
    /// Reads the medium or device state.
    Read,
    /// Changes the medium or device state.
    Write,
    /// PERSISTENT RESERVE IN/OUT: own rules, conflicts with SPC-2 only.
    Persistent,
    /// RESERVE/RELEASE(6): own rules.
    Spc2,
}

/// A logical unit: a block device exported under a LUN.
pub struct LogicalUnit<D> {
    /// The LUN.
    pub lun: u64,
    /// The device.
    pub device: Arc<D>,
    /// Unit serial number (VPD 0x80), printable ASCII.
    pub serial: String,
    /// NAA-6 (IEEE registered extended) designator (VPD 0x83).
    pub naa: [u8; 16],
    /// PRODUCT IDENTIFICATION (up to 16 ASCII characters).
    pub product: String,
    /// Limits advertised and enforced.
    pub limits: Limits,
    state: Mutex<LuState>,
    /// True while no unit attention, reservation or registration exists.
    quiet: AtomicBool,
    /// Mirror of `LuState::wce` for the I/O path.
    wce: AtomicBool,
    /// Mirror of `LuState::swp` for the I/O path.
    swp: AtomicBool,
}

impl<D: BlockDevice> std::fmt::Debug for LogicalUnit<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogicalUnit")
            .field("lun", &self.lun)
            .field("device", &self.device.name())
            .field("serial", &self.serial)
            .finish_non_exhaustive()
    }
}

/// 64-bit FNV-1a, for stable identifiers (not security).
fn fnv1a(seed: u64, parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01B3);
        }
        // Separator so ("ab","c") and ("a","bc") differ.
        h ^= 0xFF;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

/// IEEE company ID placed in NAA designators. ironwire owns no OUI; zero
/// keeps the designator well-formed and unique through the vendor fields.
const NAA_COMPANY_ID: u32 = 0x00_0000;

/// Lost I_T nexuses that keep unit attentions they were not yet told
/// ([`LogicalUnit::nexus_lost`]).
const LOST_KEPT: usize = 256;

impl<D: BlockDevice> LogicalUnit<D> {
    /// A logical unit for `device` at `lun` of `target_name`, with serial
    /// number and NAA designator derived stably from target name, LUN and
    /// device name, WCE on when the device has a volatile write cache. A
    /// device with a [`BlockDevice::shared_identity`] (an rbd image)
    /// derives them from it alone, so every gateway exporting that storage
    /// reports the same VPD 0x80 and 0x83 identification, whatever the
    /// target name and LUN, and dm-multipath groups the paths.
    pub fn new(target_name: &str, lun: u64, device: Arc<D>) -> Self {
        let lun_bytes = lun.to_be_bytes();
        let local: [&[u8]; 3] = [target_name.as_bytes(), &lun_bytes, device.name().as_bytes()];
        let shared: [&[u8]; 2] = [b"shared", device.shared_identity().unwrap_or_default().as_bytes()];
        let parts: &[&[u8]] = if device.shared_identity().is_some() { &shared } else { &local };
        let (h1, h2) = (fnv1a(0, parts), fnv1a(0x5a5a_5a5a_5a5a_5a5a, parts));
        // NAA 6h: 4-bit NAA, 24-bit company ID, 36-bit vendor specific
        // identifier, 64-bit vendor specific identifier extension.
        let hi = (6u64 << 60) | (u64::from(NAA_COMPANY_ID) << 36) | (h1 >> 28);
        let mut naa = [0u8; 16];
        cdb::put(&mut naa, 0, &hi.to_be_bytes());
        cdb::put(&mut naa, 8, &h2.to_be_bytes());
        let serial = format!("{h1:016x}");
        let wce = device.volatile_write_cache();
        let limits = Limits::for_block_size(device.geometry().block_size);
        let product = format!("ironwire {}", device.backend());
        LogicalUnit {
            lun,
            device,
            serial,
            naa,
            product,
            limits,
            state: Mutex::new(LuState { wce, ..LuState::default() }),
            quiet: AtomicBool::new(true),
            wce: AtomicBool::new(wce),
            swp: AtomicBool::new(false),
        }
    }

    /// Locks the state (a poisoned lock still holds consistent data: every
    /// update is a few assignments that cannot panic halfway).
    pub(crate) fn lock(&self) -> MutexGuard<'_, LuState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Re-derives the lock-free mirrors after a state change.
    /// Whether commands take the fast path (no reservation, no unit
    /// attention pending for a live nexus).
    #[cfg(test)]
    pub(crate) fn is_quiet(&self) -> bool {
        self.quiet.load(Ordering::Acquire)
    }

    pub(crate) fn sync(&self, st: &LuState) {
        self.quiet.store(st.quiet(), Ordering::Release);
        self.wce.store(st.wce, Ordering::Release);
        self.swp.store(st.swp, Ordering::Release);
    }

    /// Whether the write cache is enabled (WCE).
    pub fn write_cache_enabled(&self) -> bool {
        self.wce.load(Ordering::Acquire)
    }

    /// Bytes of data-out `cdb` describes (0 when it transfers none): the
    /// transport compares it with its expected data transfer length and
    /// reports the difference as residual overflow or underflow.
    pub fn data_out_len(&self, cdb: &[u8]) -> u32 {
        sbc::data_out_len(self, Bytes(cdb))
    }

    /// Executes one command from `nexus`. `data_out` is `None` on the first
    /// call; after [`Outcome::NeedData`] call again with the data.
    pub fn execute<B: DataOut>(&self, nexus: &Nexus, cdb: &[u8], data_out: Option<B>) -> Outcome<B> {
        let c = Bytes(cdb);
        let opcode = c.u8(0);
        let Some(len) = cdb::cdb_len(opcode) else {
            return Outcome::Check(Sense::INVALID_OPCODE);
        };
        if cdb.len() < len {
            log::debug!("{}: CDB {opcode:#04x} has {} bytes (expected {len})", self.device.name(), cdb.len());
            return Outcome::Check(Sense::INVALID_FIELD_IN_CDB);
        }
        let Some(access) = opcodes::access(opcode, c) else {
            return self.gate_then(nexus, opcode, Access::Always, || Outcome::Check(Sense::INVALID_OPCODE));
        };
        // NACA, the obsolete FLAG and LINK bits of the CONTROL byte: three
        // one-bit fields, so the pointer names the one that is set.
        let control = len.saturating_sub(1);
        let naca_flag_link = c.u8(control) & 0x07;
        if naca_flag_link != 0 {
            return Outcome::Check(Sense::invalid_cdb_bits(control as u16, naca_flag_link));
        }
        self.gate_then(nexus, opcode, access, || self.dispatch(nexus, c, data_out))
    }

    /// The unit-attention and reservation gate, then `run`.
    fn gate_then<B>(&self, nexus: &Nexus, opcode: u8, access: Access, run: impl FnOnce() -> Outcome<B>) -> Outcome<B> {
        let media = matches!(access, Access::Read | Access::Write);
        if !(media && self.quiet.load(Ordering::Acquire)) {
            let mut st = self.lock();
            let id = nexus.id();
            let q = st.nexuses.entry(id.clone()).or_default();
            // SAM-5 5.14: INQUIRY, REPORT LUNS and REQUEST SENSE do not
            // report (or, except REQUEST SENSE, clear) a unit attention.
            if !matches!(opcode, op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE) {
                if let Some(ua) = q.pop_front() {
                    self.sync(&st);
                    log::debug!(
                        "{}: unit attention {:02x}/{:02x} to {}",
                        self.device.name(),
                        ua.asc,
                        ua.ascq,
                        id.initiator
                    );
                    return Outcome::Check(ua);
                }
            }
            if pr::conflicts(&st, &id, opcode, access) {
                log::debug!("{}: reservation conflict for {opcode:#04x} from {}", self.device.name(), id.initiator);
                return Outcome::Status(status::RESERVATION_CONFLICT);
            }
        }
        if opcodes::writes_medium(opcode) {
            if self.device.read_only() {
                log::debug!("{}: write {opcode:#04x} refused: the device is read-only", self.device.name());
                return Outcome::Check(Sense::WRITE_PROTECTED);
            }
            if self.swp.load(Ordering::Acquire) {
                log::debug!("{}: write {opcode:#04x} refused: software write protect", self.device.name());
                return Outcome::Check(Sense::WRITE_PROTECTED);
            }
        }
        run()
    }

    fn dispatch<B: DataOut>(&self, nexus: &Nexus, c: Bytes<'_>, data_out: Option<B>) -> Outcome<B> {
        match c.u8(0) {
            op::TEST_UNIT_READY => Outcome::Good { data_in: Vec::new() },
            op::REQUEST_SENSE => self.request_sense(nexus, c),
            op::INQUIRY => inquiry::inquiry(self, nexus, c),
            op::REPORT_LUNS => self.report_luns(nexus, c.0, &[self.lun]),
            op::MODE_SENSE_6 | op::MODE_SENSE_10 => mode::mode_sense(self, c),
            op::MODE_SELECT_6 | op::MODE_SELECT_10 => mode::mode_select(self, nexus, c, data_out),
            op::RESERVE_6 | op::RELEASE_6 => pr::spc2(self, nexus, c),
            op::PERSISTENT_RESERVE_IN => pr::persistent_reserve_in(self, c),
            op::PERSISTENT_RESERVE_OUT => pr::persistent_reserve_out(self, nexus, c, data_out),
            op::MAINTENANCE_IN => opcodes::report_supported_opcodes(c),
            _ => sbc::execute(self, c, data_out),
        }
    }

    fn request_sense<B>(&self, nexus: &Nexus, c: Bytes<'_>) -> Outcome<B> {
        let desc = c.u8(1) & 0x01 != 0;
        let sense = {
            let mut st = self.lock();
            let ua = st.nexuses.get_mut(&nexus.id()).and_then(VecDeque::pop_front);
            self.sync(&st);
            ua.unwrap_or(Sense::NO_SENSE)
        };
        let data = if desc { sense.to_descriptor_bytes() } else { sense.to_fixed_bytes() };
        Outcome::Good { data_in: cdb::truncate(data, u32::from(c.u8(4))) }
    }

    /// Answers REPORT LUNS from `nexus` with the session's `luns` and clears
    /// its REPORTED LUNS DATA HAS CHANGED unit attention (SPC-4 6.33).
    /// Sessions route REPORT LUNS here (or, with no LU at LUN 0, to
    /// [`lun::report_luns`]); `execute` alone only knows its own LUN.
    pub fn report_luns<B>(&self, nexus: &Nexus, cdb: &[u8], luns: &[u64]) -> Outcome<B> {
        let out = lun::report_luns(cdb, luns);
        if matches!(out, Outcome::Good { .. }) {
            let mut st = self.lock();
            if let Some(q) = st.nexuses.get_mut(&nexus.id()) {
                q.retain(|s| *s != Sense::UA_REPORTED_LUNS_CHANGED);
            }
            self.sync(&st);
        }
        out
    }

    /// Records a new I_T nexus (login), so broadcast unit attentions reach
    /// it before its first command. No POWER ON unit attention is queued:
    /// like LIO, a fresh session starts clean (libiscsi's two-initiator
    /// tests expect the second session's first command to run).
    pub fn nexus_created(&self, nexus: &Nexus) {
        let id = nexus.id();
        let mut st = self.lock();
        let kept = st.lost.iter().position(|(l, _)| *l == id).and_then(|at| st.lost.remove(at));
        let q = st.nexuses.entry(id).or_default();
        if let Some((_, pending)) = kept {
            for ua in pending {
                push_ua(q, ua);
            }
        }
        self.sync(&st);
    }

    /// I_T nexus loss (session closed or dropped): releases an SPC-2
    /// reservation it held. Persistent reservations and registrations
    /// survive (SPC-4 5.9.1), and so do unit attentions it has not yet
    /// been told (SAM-5 5.14: until reported): the same initiator port
    /// logging in again (iSCSI session reinstatement, same name and ISID)
    /// is the same nexus and meets them at its first command. At most
    /// [`LOST_KEPT`] lost nexuses keep theirs; past that the oldest go.
    pub fn nexus_lost(&self, nexus: &Nexus) {
        let id = nexus.id();
        let mut st = self.lock();
        if st.spc2_holder.as_ref() == Some(&id) {
            st.spc2_holder = None;
        }
        if let Some(q) = st.nexuses.remove(&id).filter(|q| !q.is_empty()) {
            st.keep_lost(id, q);
        }
        self.sync(&st);
    }

    /// LOGICAL UNIT RESET task management function (SAM-5 7.7, 6.3.3):
    /// releases the SPC-2 reservation and queues BUS DEVICE RESET FUNCTION
    /// OCCURRED for every nexus, the issuer's included (it may have other
    /// sessions, other paths, that must learn of the reset; libiscsi's
    /// MultipathIO.Reset checks every path). The executor aborts the LU's
    /// tasks.
    pub fn lun_reset(&self, issuer: &Nexus) {
        let mut st = self.lock();
        st.spc2_holder = None;
        st.unit_attention(&issuer.id(), Sense::UA_LUN_RESET);
        st.unit_attention_all(Sense::UA_LUN_RESET, None);
        self.sync(&st);
    }

    /// Target warm/cold reset: like a LUN reset, with POWER ON, RESET for
    /// every nexus, the issuer included.
    pub fn target_reset(&self) {
        let mut st = self.lock();
        st.spc2_holder = None;
        st.unit_attention_all(Sense::UA_POWER_ON_RESET, None);
        self.sync(&st);
    }

    /// CLEAR TASK SET task management function: the executor aborts the
    /// tasks; with the shared task set (TST 000b) the other nexuses that
    /// lost tasks, `affected`, get COMMANDS CLEARED BY ANOTHER INITIATOR.
    pub fn clear_task_set(&self, issuer: &Nexus, affected: &[Nexus]) {
        let mut st = self.lock();
        let issuer = issuer.id();
        for n in affected {
            let id = n.id();
            if id != issuer {
                st.unit_attention(&id, Sense::UA_COMMANDS_CLEARED);
            }
        }
        self.sync(&st);
    }

    /// The I_T nexuses whose registrations the PREEMPT AND ABORT that
    /// `by` just completed (GOOD) removed: the executor aborts their tasks
    /// (SPC-4 5.12.11.2.6), and no other nexus's. Empty for any other
    /// command, and once taken.
    pub fn take_preempted(&self, by: &Nexus) -> Vec<NexusId> {
        pr::take_preempted(&mut self.lock(), &by.id())
    }

    /// The target's LUN inventory changed: queues REPORTED LUNS DATA HAS
    /// CHANGED for every nexus.
    pub fn report_luns_changed(&self) {
        self.unit_attention_all(Sense::UA_REPORTED_LUNS_CHANGED);
    }

    /// The device was resized: queues CAPACITY DATA HAS CHANGED.
    pub fn capacity_changed(&self) {
        self.unit_attention_all(Sense::UA_CAPACITY_CHANGED);
    }

    /// Queues a unit attention for every known nexus.
    pub fn unit_attention_all(&self, ua: Sense) {
        let mut st = self.lock();
        st.unit_attention_all(ua, None);
        self.sync(&st);
    }

    /// Queues a unit attention for one nexus.
    pub fn unit_attention(&self, nexus: &Nexus, ua: Sense) {
        let mut st = self.lock();
        st.unit_attention(&nexus.id(), ua);
        self.sync(&st);
    }
}
