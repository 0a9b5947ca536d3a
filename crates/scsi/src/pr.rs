//! Reservations: SPC-2 RESERVE(6)/RELEASE(6) and SPC-4 persistent
//! reservations (5.9, 6.15, 6.16), and the conflict check every command
//! passes (SPC-4 table 62).
//!
//! Registrations and the reservation live in memory only: PTPL is not
//! supported (APTPL is rejected and REPORT CAPABILITIES says so), nor are
//! ALL_TG_PT, SPEC_I_PT or REGISTER AND MOVE. PREEMPT AND ABORT preempts
//! like PREEMPT; aborting the preempted nexuses' tasks is the executor's,
//! which learns which they were from [`LogicalUnit::take_preempted`].

use crate::cdb::{self, op, Bytes};
use crate::sense::{status, Sense};
use crate::unit::{Access, LogicalUnit, LuState, Nexus};
use crate::DataOut;
use crate::Outcome;
use block::BlockDevice;

/// An I_T nexus as reservations know it: its initiator and target port
/// names ([`Nexus`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NexusId {
    /// [`Nexus::initiator`].
    pub initiator: String,
    /// [`Nexus::target_port`].
    pub target_port: String,
}

/// Persistent reservation types (SPC-4 table 174).
pub mod pr_type {
    pub const WRITE_EXCLUSIVE: u8 = 1;
    pub const EXCLUSIVE_ACCESS: u8 = 3;
    pub const WRITE_EXCLUSIVE_REGISTRANTS_ONLY: u8 = 5;
    pub const EXCLUSIVE_ACCESS_REGISTRANTS_ONLY: u8 = 6;
    pub const WRITE_EXCLUSIVE_ALL_REGISTRANTS: u8 = 7;
    pub const EXCLUSIVE_ACCESS_ALL_REGISTRANTS: u8 = 8;
}
use pr_type::*;

fn valid_type(t: u8) -> bool {
    matches!(t, 1 | 3 | 5 | 6 | 7 | 8)
}

fn all_registrants(t: u8) -> bool {
    matches!(t, WRITE_EXCLUSIVE_ALL_REGISTRANTS | EXCLUSIVE_ACCESS_ALL_REGISTRANTS)
}

/// Registrants one logical unit keeps. Registrations outlive their I_T
/// nexus (SPC-4), so without a limit every new nexus that registers would
/// grow the list for good; past it a REGISTER that would add one fails
/// with INSUFFICIENT REGISTRATION RESOURCES, as SPC-4 has a device server
/// answer when it has no room for another registration.
pub(crate) const MAX_REGISTRATIONS: usize = 1024;

#[derive(Clone, Debug)]
struct Registration {
    nexus: NexusId,
    key: u64,
    relative_port: u16,
}

#[derive(Clone, Debug)]
struct Reservation {
    /// The I_T nexus that reserved (for all-registrants types every
    /// registrant is a holder).
    holder: NexusId,
    rtype: u8,
}

/// Persistent reservation state of one logical unit.
#[derive(Debug, Default)]
pub(crate) struct PrState {
    generation: u32,
    regs: Vec<Registration>,
    res: Option<Reservation>,
    /// The nexuses each successful PREEMPT AND ABORT preempted, by the
    /// nexus that sent it, until its executor takes them
    /// ([`LogicalUnit::take_preempted`], right after the command).
    aborts: Vec<(NexusId, Vec<NexusId>)>,
}

impl PrState {
    pub fn is_empty(&self) -> bool {
        self.regs.is_empty() && self.res.is_none()
    }

    fn key_of(&self, id: &NexusId) -> Option<u64> {
        self.regs.iter().find(|r| &r.nexus == id).map(|r| r.key)
    }

    fn is_holder(&self, id: &NexusId) -> bool {
        match &self.res {
            Some(r) if all_registrants(r.rtype) => self.key_of(id).is_some(),
            Some(r) => &r.holder == id,
            None => false,
        }
    }

    /// The reservation key reported by READ RESERVATION: the holder's key,
    /// zero for all-registrants types (SPC-4 6.15.3).
    fn holder_key(&self) -> u64 {
        match &self.res {
            Some(r) if !all_registrants(r.rtype) => self.key_of(&r.holder).unwrap_or(0),
            _ => 0,
        }
    }
}

/// Whether a command with `access` from `id` conflicts with a reservation.
pub(crate) fn conflicts(st: &LuState, id: &NexusId, opcode: u8, access: Access) -> bool {
    if let Some(holder) = &st.spc2_holder {
        // SPC-2 reservation: only the holder may proceed, except for the
        // commands SPC-4 5.9.3 / SPC-2 5.5.1 allow everyone; PERSISTENT
        // RESERVE IN and OUT conflict whoever sends them (SPC-2 5.5.1), so
        // that the holder cannot register and then be refused its own
        // RELEASE(6).
        return access == Access::Persistent
            || (holder != id
                && !matches!(
                    opcode,
                    op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE | op::RELEASE_6 | op::MAINTENANCE_IN
                ));
    }
    let Some(res) = &st.pr.res else {
        return false;
    };
    if matches!(access, Access::Always | Access::Persistent | Access::Spc2) || st.pr.is_holder(id) {
        return false;
    }
    let registered = st.pr.key_of(id).is_some();
    let write = access == Access::Write;
    match res.rtype {
        WRITE_EXCLUSIVE => write,
        EXCLUSIVE_ACCESS => true,
        WRITE_EXCLUSIVE_REGISTRANTS_ONLY | WRITE_EXCLUSIVE_ALL_REGISTRANTS => write && !registered,
        EXCLUSIVE_ACCESS_REGISTRANTS_ONLY | EXCLUSIVE_ACCESS_ALL_REGISTRANTS => !registered,
        _ => false,
    }
}

fn conflict<B>() -> Outcome<B> {
    Outcome::Status(status::RESERVATION_CONFLICT)
}

fn good<B>() -> Outcome<B> {
    Outcome::Good { data_in: Vec::new() }
}

/// RESERVE(6) / RELEASE(6) (SPC-2 7.21, 7.16).
pub(crate) fn spc2<B, D: BlockDevice>(lu: &LogicalUnit<D>, nexus: &Nexus, c: Bytes<'_>) -> Outcome<B> {
    // Third-party and extent reservations are obsolete and unsupported:
    // 3RDPTY (bit 4), THIRD-PARTY DEVICE ID (bits 3-1), EXTENT (bit 0).
    let third_party_extent = c.u8(1) & 0x1F;
    if third_party_extent != 0 {
        let bit = match third_party_extent {
            b if b & 0x10 != 0 => 4,
            b if b & 0x0E != 0 => 3,
            _ => 0,
        };
        return Outcome::Check(Sense::invalid_cdb_field(1, Some(bit)));
    }
    let id = nexus.id();
    let mut st = lu.lock();
    // SPC-4 5.9.3: with any registration, RESERVE(6)/RELEASE(6) conflict,
    // except (CRH, which REPORT CAPABILITIES claims) from the persistent
    // reservation's holder, or from a registrant under a registrants-only
    // or all-registrants reservation: those complete with GOOD and change
    // nothing.
    if !st.pr.is_empty() {
        let registrant_type = st.pr.res.as_ref().is_some_and(|r| {
            matches!(
                r.rtype,
                WRITE_EXCLUSIVE_REGISTRANTS_ONLY
                    | EXCLUSIVE_ACCESS_REGISTRANTS_ONLY
                    | WRITE_EXCLUSIVE_ALL_REGISTRANTS
                    | EXCLUSIVE_ACCESS_ALL_REGISTRANTS
            )
        });
        let exempt = st.pr.is_holder(&id) || (registrant_type && st.pr.key_of(&id).is_some());
        return if exempt { good() } else { conflict() };
    }
    let out = if c.u8(0) == op::RESERVE_6 {
        match &st.spc2_holder {
            Some(h) if h != &id => conflict(),
            _ => {
                st.spc2_holder = Some(id);
                good()
            }
        }
    } else {
        // RELEASE from a non-holder is a no-op with GOOD status.
        if st.spc2_holder.as_ref() == Some(&id) {
            st.spc2_holder = None;
        }
        good()
    };
    lu.sync(&st);
    out
}

/// TransportID for an iSCSI initiator port (SPC-4 7.6.4.6): format 01b
/// (name with ISID) when the name carries ",i,0x", else format 00b.
fn transport_id(initiator: &str) -> Vec<u8> {
    let format = if initiator.contains(",i,0x") { 0x40 } else { 0x00 };
    let mut name: Vec<u8> = initiator.bytes().take(0xFFF0).collect();
    name.push(0);
    while !name.len().is_multiple_of(4) || name.len() < 20 {
        name.push(0);
    }
    let mut t = vec![format | 0x05, 0];
    t.extend_from_slice(&u16::try_from(name.len()).unwrap_or(u16::MAX).to_be_bytes());
    t.extend_from_slice(&name);
    t
}

/// PERSISTENT RESERVE IN (SPC-4 6.15).
pub(crate) fn persistent_reserve_in<B, D: BlockDevice>(lu: &LogicalUnit<D>, c: Bytes<'_>) -> Outcome<B> {
    let alloc_len = u32::from(c.be16(7));
    let st = lu.lock();
    let pr = &st.pr;
    let mut d = pr.generation.to_be_bytes().to_vec();
    match c.u8(1) & 0x1F {
        // READ KEYS.
        0x00 => {
            d.extend_from_slice(&u32::try_from(pr.regs.len().saturating_mul(8)).unwrap_or(u32::MAX).to_be_bytes());
            for r in &pr.regs {
                d.extend_from_slice(&r.key.to_be_bytes());
            }
        }
        // READ RESERVATION.
        0x01 => match &pr.res {
            Some(res) => {
                d.extend_from_slice(&16u32.to_be_bytes());
                d.extend_from_slice(&pr.holder_key().to_be_bytes());
                d.extend_from_slice(&[0, 0, 0, 0, 0, res.rtype & 0x0F, 0, 0]);
            }
            None => d.extend_from_slice(&0u32.to_be_bytes()),
        },
        // REPORT CAPABILITIES: CRH; TMV with ALLOW COMMANDS 000b; every
        // type; no SIP_C, ATP_C or PTPL_C.
        0x02 => {
            d = vec![0, 8, 0x10, 0x80, 0xEA, 0x01, 0, 0];
        }
        // READ FULL STATUS.
        0x03 => {
            let mut descs = Vec::new();
            for r in &pr.regs {
                let holder = pr.is_holder(&r.nexus);
                let scope_type = match (&pr.res, holder) {
                    (Some(res), true) => res.rtype & 0x0F,
                    _ => 0,
                };
                let tid = transport_id(&r.nexus.initiator);
                descs.extend_from_slice(&r.key.to_be_bytes());
                descs.extend_from_slice(&[0, 0, 0, 0, u8::from(holder), scope_type, 0, 0, 0, 0]);
                descs.extend_from_slice(&r.relative_port.to_be_bytes());
                descs.extend_from_slice(&u32::try_from(tid.len()).unwrap_or(u32::MAX).to_be_bytes());
                descs.extend_from_slice(&tid);
            }
            d.extend_from_slice(&u32::try_from(descs.len()).unwrap_or(u32::MAX).to_be_bytes());
            d.extend_from_slice(&descs);
        }
        _ => return Outcome::Check(Sense::invalid_cdb_field(1, Some(4))),
    }
    Outcome::Good { data_in: cdb::truncate(d, alloc_len) }
}

/// PERSISTENT RESERVE OUT (SPC-4 6.16).
pub(crate) fn persistent_reserve_out<B: DataOut, D: BlockDevice>(
    lu: &LogicalUnit<D>,
    nexus: &Nexus,
    c: Bytes<'_>,
    data_out: Option<B>,
) -> Outcome<B> {
    let sa = c.u8(1) & 0x1F;
    let scope = c.u8(2) >> 4;
    let rtype = c.u8(2) & 0x0F;
    let len = c.be32(5);
    if !matches!(sa, 0x00..=0x06) {
        // REGISTER AND MOVE (7), REPLACE LOST RESERVATION (8) and reserved.
        return Outcome::Check(Sense::invalid_cdb_field(1, Some(4)));
    }
    // SPC-4 6.16.3: without SPEC_I_PT the parameter list is 24 bytes.
    if len != 24 {
        return Outcome::Check(Sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    let Some(data) = data_out else {
        return Outcome::NeedData { len };
    };
    let p = Bytes(data.as_ref());
    if p.len() < 24 {
        // The CDB announced 24 bytes (checked above): the transport's
        // expected length cut them.
        return Outcome::Check(Sense::short_parameter_list(24, len as usize));
    }
    let key = p.be64(0);
    let sa_key = p.be64(8);
    let flags = p.u8(20);
    if flags & 0x08 != 0 {
        return Outcome::Check(Sense::invalid_param_field(20, Some(3)));
    }
    // ALL_TG_PT and APTPL (neither supported: PTPL_C and ATP are 0) mean
    // something to REGISTER and REGISTER AND IGNORE EXISTING KEY only;
    // other service actions ignore them (SPC-4 6.16.3).
    let registering = matches!(sa, 0x00 | 0x06);
    if registering && flags & 0x04 != 0 {
        return Outcome::Check(Sense::invalid_param_field(20, Some(2)));
    }
    if registering && flags & 0x01 != 0 {
        return Outcome::Check(Sense::invalid_param_field(20, Some(0)));
    }
    let id = nexus.id();
    let mut st = lu.lock();
    if st.spc2_holder.is_some() {
        return conflict();
    }
    let out = match sa {
        0x00 | 0x06 => register(&mut st, nexus, &id, key, sa_key, sa == 0x06),
        _ => {
            // Every other service action needs a registration whose key
            // matches RESERVATION KEY.
            if st.pr.key_of(&id) != Some(key) {
                return conflict();
            }
            let check_type = matches!(sa, 0x01 | 0x02 | 0x04 | 0x05);
            if check_type && scope != 0 {
                Outcome::Check(Sense::invalid_cdb_field(2, Some(7)))
            } else if check_type && !valid_type(rtype) {
                Outcome::Check(Sense::invalid_cdb_field(2, Some(3)))
            } else {
                match sa {
                    0x01 => reserve(&mut st, &id, rtype),
                    0x02 => release(&mut st, &id, rtype),
                    0x03 => clear(&mut st, &id),
                    _ => preempt(&mut st, &id, rtype, sa_key, sa == 0x05),
                }
            }
        }
    };
    lu.sync(&st);
    out
}

fn register<B>(st: &mut LuState, nexus: &Nexus, id: &NexusId, key: u64, sa_key: u64, ignore: bool) -> Outcome<B> {
    let pr = &mut st.pr;
    match pr.regs.iter().position(|r| &r.nexus == id) {
        None => {
            if !ignore && key != 0 {
                return conflict();
            }
            if sa_key != 0 {
                if pr.regs.len() >= MAX_REGISTRATIONS {
                    return Outcome::Check(Sense::INSUFFICIENT_REGISTRATION_RESOURCES);
                }
                pr.regs.push(Registration { nexus: id.clone(), key: sa_key, relative_port: nexus.relative_port });
                pr.generation = pr.generation.wrapping_add(1);
            }
        }
        Some(i) => {
            if !ignore && pr.regs.get(i).map(|r| r.key) != Some(key) {
                return conflict();
            }
            if sa_key != 0 {
                if let Some(r) = pr.regs.get_mut(i) {
                    r.key = sa_key;
                }
            } else {
                unregister(st, id);
            }
            st.pr.generation = st.pr.generation.wrapping_add(1);
        }
    }
    good()
}

/// Removes `id`'s registration, releasing a reservation it held (SPC-4
/// 5.9.11.3 and 5.9.10.2: the others learn by RESERVATIONS RELEASED for
/// registrants-only types).
fn unregister(st: &mut LuState, id: &NexusId) {
    let pr = &mut st.pr;
    pr.regs.retain(|r| &r.nexus != id);
    let release = match &pr.res {
        Some(r) if all_registrants(r.rtype) => pr.regs.is_empty(),
        Some(r) => &r.holder == id,
        None => false,
    };
    if release {
        let rtype = pr.res.take().map(|r| r.rtype);
        if matches!(rtype, Some(WRITE_EXCLUSIVE_REGISTRANTS_ONLY | EXCLUSIVE_ACCESS_REGISTRANTS_ONLY)) {
            let others: Vec<NexusId> = pr.regs.iter().map(|r| r.nexus.clone()).collect();
            for o in others {
                st.unit_attention_registrant(&o, Sense::UA_RESERVATIONS_RELEASED);
            }
        }
    } else if let Some(r) = &mut pr.res {
        // An all-registrants reservation outlives the registrant that made it.
        if &r.holder == id {
            if let Some(next) = pr.regs.first() {
                r.holder = next.nexus.clone();
            }
        }
    }
}

fn reserve<B>(st: &mut LuState, id: &NexusId, rtype: u8) -> Outcome<B> {
    let pr = &mut st.pr;
    match &pr.res {
        None => {
            pr.res = Some(Reservation { holder: id.clone(), rtype });
            good()
        }
        Some(r) if pr.is_holder(id) && r.rtype == rtype => good(),
        Some(_) => conflict(),
    }
}

fn release<B>(st: &mut LuState, id: &NexusId, rtype: u8) -> Outcome<B> {
    let pr = &mut st.pr;
    let Some(res) = &pr.res else {
        return good();
    };
    if !pr.is_holder(id) {
        return good();
    }
    if res.rtype != rtype {
        return Outcome::Check(Sense::INVALID_RELEASE_OF_PR);
    }
    let released = res.rtype;
    pr.res = None;
    // SPC-4 5.9.10.2: registrants-only and all-registrants releases tell
    // the other registrants.
    if matches!(released, 5..=8) {
        let others: Vec<NexusId> = pr.regs.iter().filter(|r| &r.nexus != id).map(|r| r.nexus.clone()).collect();
        for o in others {
            st.unit_attention_registrant(&o, Sense::UA_RESERVATIONS_RELEASED);
        }
    }
    good()
}

fn clear<B>(st: &mut LuState, id: &NexusId) -> Outcome<B> {
    let others: Vec<NexusId> = st.pr.regs.iter().filter(|r| &r.nexus != id).map(|r| r.nexus.clone()).collect();
    st.pr.regs.clear();
    st.pr.res = None;
    st.pr.generation = st.pr.generation.wrapping_add(1);
    for o in others {
        st.unit_attention_registrant(&o, Sense::UA_RESERVATIONS_PREEMPTED);
    }
    good()
}

/// PREEMPT and PREEMPT AND ABORT (SPC-4 5.9.11.4); for the latter
/// (`abort`) the preempted nexuses are kept for the executor.
fn preempt<B>(st: &mut LuState, id: &NexusId, rtype: u8, sa_key: u64, abort: bool) -> Outcome<B> {
    let pr = &mut st.pr;
    let (removed, new_res): (Vec<NexusId>, Option<Option<Reservation>>) = match &pr.res {
        // An all-registrants reservation with SERVICE ACTION RESERVATION
        // KEY zero: everyone else loses their registration and the
        // preempting nexus gets a reservation of the new type.
        Some(r) if all_registrants(r.rtype) && sa_key == 0 => {
            let removed = pr.regs.iter().filter(|r| &r.nexus != id).map(|r| r.nexus.clone()).collect();
            (removed, Some(Some(Reservation { holder: id.clone(), rtype })))
        }
        Some(r) if !all_registrants(r.rtype) && pr.key_of(&r.holder) == Some(sa_key) => {
            let removed =
                pr.regs.iter().filter(|r| r.key == sa_key && &r.nexus != id).map(|r| r.nexus.clone()).collect();
            (removed, Some(Some(Reservation { holder: id.clone(), rtype })))
        }
        _ => {
            if sa_key == 0 {
                return Outcome::Check(Sense::invalid_param_field(8, None));
            }
            let removed: Vec<NexusId> = pr.regs.iter().filter(|r| r.key == sa_key).map(|r| r.nexus.clone()).collect();
            if removed.is_empty() {
                return conflict();
            }
            // SPC-4 5.9.11.5: naming its own key is no error; the
            // caller's registration goes too (without a unit attention).
            if removed.contains(id) {
                pr.regs.retain(|r| &r.nexus != id);
            }
            (removed.into_iter().filter(|n| n != id).collect(), None)
        }
    };
    pr.regs.retain(|r| !removed.contains(&r.nexus));
    let old_type = pr.res.as_ref().map(|r| r.rtype);
    let mut released = Vec::new();
    if let Some(res) = new_res {
        pr.res = res;
        // The reservation's type changed: the registrants left, but for
        // the caller, learn that the old one is gone (SPC-4 5.9.11.4).
        if old_type.is_some_and(|t| t != rtype) {
            released = pr.regs.iter().filter(|r| &r.nexus != id).map(|r| r.nexus.clone()).collect();
        }
    } else if let Some(r) = &pr.res {
        // A removed nexus may have been an all-registrants holder.
        if removed.contains(&r.holder) || !pr.regs.iter().any(|x| x.nexus == r.holder) {
            let next = pr.regs.first().map(|r| r.nexus.clone());
            match next {
                Some(n) => {
                    if let Some(r) = &mut pr.res {
                        r.holder = n;
                    }
                }
                None => pr.res = None,
            }
        }
    }
    pr.generation = pr.generation.wrapping_add(1);
    if abort {
        // One entry per sending nexus: an earlier one not taken (its
        // executor never asked) is replaced, not accumulated.
        pr.aborts.retain(|(by, _)| by != id);
        pr.aborts.push((id.clone(), removed.clone()));
    }
    for o in removed {
        st.unit_attention_registrant(&o, Sense::UA_REGISTRATIONS_PREEMPTED);
    }
    for o in released {
        st.unit_attention_registrant(&o, Sense::UA_RESERVATIONS_RELEASED);
    }
    good()
}

/// The nexuses the PREEMPT AND ABORT that `by` just completed preempted
/// (taken: a second call returns none).
pub(crate) fn take_preempted(st: &mut LuState, by: &NexusId) -> Vec<NexusId> {
    match st.pr.aborts.iter().position(|(b, _)| b == by) {
        Some(i) => st.pr.aborts.swap_remove(i).1,
        None => Vec::new(),
    }
}

/// Builds the 24-byte PERSISTENT RESERVE OUT parameter list.
#[cfg(test)]
pub(crate) fn prout_parameters(key: u64, sa_key: u64) -> [u8; 24] {
    let mut p = [0u8; 24];
    cdb::put(&mut p, 0, &key.to_be_bytes());
    cdb::put(&mut p, 8, &sa_key.to_be_bytes());
    p
}
