//! MODE SENSE and MODE SELECT (SPC-4 6.11-6.14) with the caching (0x08),
//! control (0x0A) and informational exceptions (0x1C) pages. Only WCE is
//! changeable; saved values are not supported.

use crate::cdb::{self, op, put, set, Bytes};
use crate::sense::Sense;
use crate::unit::{LogicalUnit, Nexus};
use crate::DataOut;
use crate::{BlockOp, Outcome};
use block::BlockDevice;

/// Page control values.
const PC_CURRENT: u8 = 0;
const PC_CHANGEABLE: u8 = 1;
const PC_DEFAULT: u8 = 2;
const PC_SAVED: u8 = 3;

const CACHING: u8 = 0x08;
const CONTROL: u8 = 0x0A;
const INFORMATIONAL_EXCEPTIONS: u8 = 0x1C;
const ALL_PAGES: u8 = 0x3F;

/// Pages in the order "all pages" returns them.
const PAGES: [u8; 3] = [CACHING, CONTROL, INFORMATIONAL_EXCEPTIONS];

/// One mode page as reported for page control `pc` with write cache `wce`
/// and software write protect `swp`.
fn page(code: u8, pc: u8, wce: bool, swp: bool) -> Option<Vec<u8>> {
    let changeable = pc == PC_CHANGEABLE;
    Some(match code {
        CACHING => {
            let mut p = vec![0u8; 20];
            put(&mut p, 0, &[CACHING, 0x12]);
            // WCE (bit 2) is the one changeable field; RCD stays 0.
            if changeable || wce {
                set(&mut p, 2, 0x04);
            }
            p
        }
        CONTROL => {
            let mut p = vec![0u8; 12];
            set(&mut p, 0, CONTROL);
            set(&mut p, 1, 0x0A);
            if !changeable {
                // TST 000b (shared task set), QAM 1 (unrestricted
                // reordering), QERR 00b, D_SENSE 0; TAS 1 (a task aborted
                // by another nexus's task management ends in TASK
                // ABORTED); BUSY TIMEOUT PERIOD unlimited.
                set(&mut p, 3, 0x10);
                set(&mut p, 5, 0x40);
                put(&mut p, 8, &[0xFF, 0xFF]);
            }
            // SWP (byte 4 bit 3) is the one changeable field.
            if changeable || swp {
                set(&mut p, 4, 0x08);
            }
            p
        }
        INFORMATIONAL_EXCEPTIONS => {
            let mut p = vec![0u8; 12];
            set(&mut p, 0, INFORMATIONAL_EXCEPTIONS);
            set(&mut p, 1, 0x0A);
            if !changeable {
                // DEXCPT: no informational exception reporting.
                set(&mut p, 2, 0x08);
            }
            p
        }
        _ => return None,
    })
}

fn lock_wce_swp<D: BlockDevice>(lu: &LogicalUnit<D>) -> (bool, bool) {
    let st = lu.lock();
    (st.wce, st.swp)
}

pub(crate) fn mode_sense<B, D: BlockDevice>(lu: &LogicalUnit<D>, c: Bytes<'_>) -> Outcome<B> {
    let ten = c.u8(0) == op::MODE_SENSE_10;
    let dbd = c.bit(1, 3);
    let llbaa = ten && c.bit(1, 4);
    let pc = c.u8(2) >> 6;
    let code = c.u8(2) & 0x3F;
    let subpage = c.u8(3);
    let alloc_len = if ten { u32::from(c.be16(7)) } else { u32::from(c.u8(4)) };
    if pc == PC_SAVED {
        return Outcome::Check(Sense::SAVING_PARAMETERS_NOT_SUPPORTED);
    }
    // Subpage 0xFF asks for every subpage; this target has none beyond 0.
    if subpage != 0 && subpage != 0xFF {
        return Outcome::Check(Sense::invalid_cdb_field(3, None));
    }
    let (wce, swp) = match pc {
        PC_DEFAULT => (lu.device.volatile_write_cache(), false),
        _ => lock_wce_swp(lu),
    };
    let mut pages = Vec::new();
    if code == ALL_PAGES {
        for p in PAGES {
            pages.extend(page(p, pc, wce, swp).unwrap_or_default());
        }
    } else {
        match page(code, pc, wce, swp) {
            Some(p) => pages = p,
            None => return Outcome::Check(Sense::invalid_cdb_field(2, Some(5))),
        }
    }
    let geo = lu.device.geometry();
    let mut bd = Vec::new();
    if !dbd {
        let (blocks, bs) = if pc == PC_CHANGEABLE { (0, 0) } else { (geo.blocks, geo.block_size) };
        if llbaa {
            bd.extend_from_slice(&blocks.to_be_bytes());
            bd.extend_from_slice(&[0; 4]);
            bd.extend_from_slice(&bs.to_be_bytes());
        } else {
            let short = u32::try_from(blocks).unwrap_or(u32::MAX);
            bd.extend_from_slice(&short.to_be_bytes());
            bd.extend_from_slice(&bs.to_be_bytes());
            set(&mut bd, 4, 0);
        }
    }
    // Device-specific parameter: WP (set while software write protect is
    // on, and always for a read-only device), DPOFUA 1.
    let dsp = if (swp && pc == PC_CURRENT) || lu.device.read_only() { 0x90 } else { 0x10 };
    let mut d = if ten {
        let mut h = vec![0u8; 8];
        put(&mut h, 2, &[0, dsp, u8::from(llbaa)]);
        put(&mut h, 6, &(bd.len() as u16).to_be_bytes());
        h
    } else {
        vec![0, 0, dsp, bd.len() as u8]
    };
    d.extend_from_slice(&bd);
    d.extend_from_slice(&pages);
    if ten {
        let len = d.len().saturating_sub(2).min(usize::from(u16::MAX)) as u16;
        put(&mut d, 0, &len.to_be_bytes());
    } else {
        let len = d.len().saturating_sub(1).min(255) as u8;
        set(&mut d, 0, len);
    }
    Outcome::Good { data_in: cdb::truncate(d, alloc_len) }
}

pub(crate) fn mode_select<B: DataOut, D: BlockDevice>(
    lu: &LogicalUnit<D>,
    nexus: &Nexus,
    c: Bytes<'_>,
    data_out: Option<B>,
) -> Outcome<B> {
    let ten = c.u8(0) == op::MODE_SELECT_10;
    if c.bit(1, 0) {
        return Outcome::Check(Sense::invalid_cdb_field(1, Some(0)));
    }
    let len = if ten { u32::from(c.be16(7)) } else { u32::from(c.u8(4)) };
    if len == 0 {
        return Outcome::Good { data_in: Vec::new() };
    }
    let Some(data) = data_out else {
        return Outcome::NeedData { len };
    };
    let all = data.as_ref();
    let d = Bytes(all.get(..all.len().min(len as usize)).unwrap_or_default());
    let (header_len, bd_len) = if ten { (8usize, usize::from(d.be16(6))) } else { (4, usize::from(d.u8(3))) };
    if d.len() < header_len {
        return Outcome::Check(Sense::short_parameter_list(header_len, len as usize));
    }
    let geo = lu.device.geometry();
    let long = ten && d.bit(4, 0);
    let bd_at = header_len;
    match (bd_len, long) {
        (0, _) => {}
        (8, false) | (16, true) => {
            if d.len() < bd_at.saturating_add(bd_len) {
                return Outcome::Check(Sense::short_parameter_list(bd_at.saturating_add(bd_len), len as usize));
            }
            let (blocks, bs) = if long {
                (d.be64(bd_at), d.be32(bd_at.saturating_add(12)))
            } else {
                (u64::from(d.be32(bd_at)), d.be24(bd_at.saturating_add(5)))
            };
            let current_blocks = if long { geo.blocks } else { geo.blocks.min(u64::from(u32::MAX)) };
            if blocks != 0 && blocks != current_blocks {
                return Outcome::Check(Sense::invalid_param_field(bd_at as u16, None));
            }
            if bs != 0 && bs != geo.block_size {
                let at = bd_at.saturating_add(if long { 12 } else { 5 });
                return Outcome::Check(Sense::invalid_param_field(at as u16, None));
            }
        }
        _ => {
            let at = if ten { 6 } else { 3 };
            return Outcome::Check(Sense::invalid_param_field(at, None));
        }
    }
    let mut st = lu.lock();
    let mut wce = st.wce;
    let mut swp = st.swp;
    let mut at = bd_at.saturating_add(bd_len);
    while at < d.len() {
        if d.len() < at.saturating_add(2) {
            return Outcome::Check(Sense::short_parameter_list(at.saturating_add(2), len as usize));
        }
        let code = d.u8(at) & 0x3F;
        if d.bit(at, 6) {
            // SPF: subpage format; this target has no subpages.
            return Outcome::Check(Sense::invalid_param_field(at as u16, Some(6)));
        }
        let page_len = usize::from(d.u8(at.saturating_add(1))).saturating_add(2);
        let (Some(current), Some(mask)) = (page(code, PC_CURRENT, wce, swp), page(code, PC_CHANGEABLE, wce, swp))
        else {
            return Outcome::Check(Sense::invalid_param_field(at as u16, Some(5)));
        };
        if page_len != current.len() {
            return Outcome::Check(Sense::invalid_param_field(at.saturating_add(1) as u16, None));
        }
        let end = at.saturating_add(page_len);
        let Some(new) = d.0.get(at..end) else {
            return Outcome::Check(Sense::short_parameter_list(end, len as usize));
        };
        // Byte 0 holds PS (ignored on MODE SELECT) and the page code.
        for (i, ((n, cur), m)) in new.iter().zip(&current).zip(&mask).enumerate().skip(2) {
            if (n ^ cur) & !m != 0 {
                log::debug!(
                    "{}: MODE SELECT page {code:#04x} byte {i} {n:#04x} (current {cur:#04x})",
                    lu.device.name()
                );
                return Outcome::Check(Sense::invalid_param_field(at.saturating_add(i) as u16, None));
            }
        }
        if code == CACHING {
            wce = new.get(2).is_some_and(|b| b & 0x04 != 0);
        }
        if code == CONTROL {
            swp = new.get(4).is_some_and(|b| b & 0x08 != 0);
        }
        at = end;
    }
    if wce != st.wce || swp != st.swp {
        // Write-through from here on: the host sends no more SYNCHRONIZE
        // CACHE, so what it wrote while the cache was on is made durable
        // before the change is answered.
        let flush = st.wce && !wce && lu.device.volatile_write_cache();
        st.wce = wce;
        st.swp = swp;
        // SPC-4 6.13: other nexuses learn of the change by unit attention.
        st.unit_attention_all(Sense::UA_MODE_PARAMETERS_CHANGED, Some(&nexus.id()));
        lu.sync(&st);
        if flush {
            return Outcome::Io(BlockOp::Flush);
        }
    }
    Outcome::Good { data_in: Vec::new() }
}
