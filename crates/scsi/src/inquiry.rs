//! INQUIRY: standard data (SPC-4 6.6.2) and the vital product data pages
//! (SPC-4 7.8, SBC-3 6.5). Builders return whole pages; the caller's
//! allocation length truncates them.

use crate::cdb::{self, put, set, Bytes};
use crate::sense::Sense;
use crate::unit::{LogicalUnit, Nexus};
use crate::Outcome;
use block::BlockDevice;

/// T10 VENDOR IDENTIFICATION.
pub const VENDOR: &str = "IRONWIRE";

/// Longest serial number reported (it must fit a designator's 8-bit length
/// next to the vendor ID).
const MAX_SERIAL: usize = 240;

/// VPD pages in ascending order (SPC-4 7.8.13).
const VPD_PAGES: [u8; 7] = [0x00, 0x80, 0x83, 0x86, 0xB0, 0xB1, 0xB2];

/// Version descriptors (SPC-4 table 141): SAM-5, SPC-4, SBC-3, iSCSI.
const VERSION_DESCRIPTORS: [u16; 4] = [0x00A0, 0x0460, 0x04C0, 0x0960];

/// `s` as a space-padded ASCII field of `len` bytes (non-printable
/// characters become '_').
fn ascii_field(s: &str, len: usize) -> Vec<u8> {
    let mut f: Vec<u8> = s.bytes().map(|b| if (0x20..0x7F).contains(&b) { b } else { b'_' }).take(len).collect();
    f.resize(len, b' ');
    f
}

pub(crate) fn inquiry<B, D: BlockDevice>(lu: &LogicalUnit<D>, nexus: &Nexus, c: Bytes<'_>) -> Outcome<B> {
    let evpd = c.bit(1, 0);
    let page = c.u8(2);
    let alloc_len = u32::from(c.be16(3));
    // CMDDT (obsolete) and reserved bits.
    if c.u8(1) & 0xFE != 0 {
        return Outcome::Check(Sense::invalid_cdb_bits(1, c.u8(1) & 0xFE));
    }
    let data = if !evpd {
        if page != 0 {
            return Outcome::Check(Sense::invalid_cdb_field(2, None));
        }
        standard(lu)
    } else {
        match vpd(lu, nexus, page) {
            Some(d) => d,
            None => return Outcome::Check(Sense::invalid_cdb_field(2, None)),
        }
    };
    Outcome::Good { data_in: cdb::truncate(data, alloc_len) }
}

/// Standard INQUIRY data: 96 bytes, direct-access block device, SPC-4.
pub(crate) fn standard<D: BlockDevice>(lu: &LogicalUnit<D>) -> Vec<u8> {
    let mut d = vec![0u8; 96];
    // Peripheral qualifier 0, device type 0; RMB 0; VERSION 6 (SPC-4);
    // HISUP and response data format 2; additional length.
    put(&mut d, 0, &[0x00, 0x00, 0x06, 0x12, 91]);
    // Byte 7: CMDQUE.
    set(&mut d, 7, 0x02);
    put(&mut d, 8, &ascii_field(VENDOR, 8));
    put(&mut d, 16, &ascii_field(&lu.product, 16));
    put(&mut d, 32, &ascii_field(&revision(), 4));
    for (i, v) in VERSION_DESCRIPTORS.iter().enumerate() {
        put(&mut d, 58usize.saturating_add(i.saturating_mul(2)), &v.to_be_bytes());
    }
    d
}

/// PRODUCT REVISION LEVEL: the crate's "major.minor".
fn revision() -> String {
    let v = env!("CARGO_PKG_VERSION");
    let mut parts = v.split('.');
    match (parts.next(), parts.next()) {
        (Some(major), Some(minor)) => format!("{major}.{minor}"),
        _ => v.to_owned(),
    }
}

/// A VPD page header + payload.
fn page(code: u8, payload: &[u8]) -> Vec<u8> {
    let mut d = Vec::with_capacity(payload.len().saturating_add(4));
    d.extend_from_slice(&[0x00, code]);
    d.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    d.extend_from_slice(payload);
    d
}

pub(crate) fn vpd<D: BlockDevice>(lu: &LogicalUnit<D>, nexus: &Nexus, code: u8) -> Option<Vec<u8>> {
    Some(match code {
        0x00 => page(0x00, &VPD_PAGES),
        0x80 => page(0x80, &ascii_field(&lu.serial, lu.serial.len().min(MAX_SERIAL))),
        0x83 => page(0x83, &device_identification(lu, nexus)),
        0x86 => page(0x86, &extended_inquiry(lu)),
        0xB0 => page(0xB0, &block_limits(lu)),
        0xB1 => {
            // MEDIUM ROTATION RATE 1: non-rotating medium.
            let mut p = vec![0u8; 0x3C];
            put(&mut p, 0, &[0x00, 0x01]);
            page(0xB1, &p)
        }
        0xB2 => page(0xB2, &provisioning(lu)),
        _ => return None,
    })
}

/// A designation descriptor (SPC-4 7.8.6.1).
fn designator(out: &mut Vec<u8>, proto_code_set: u8, piv_assoc_type: u8, value: &[u8]) {
    out.extend_from_slice(&[proto_code_set, piv_assoc_type, 0, value.len().min(255) as u8]);
    out.extend_from_slice(value.get(..value.len().min(255)).unwrap_or_default());
}

/// A null-terminated UTF-8 SCSI name string padded to a multiple of 4.
fn scsi_name(name: &str) -> Vec<u8> {
    let mut v: Vec<u8> = name.bytes().take(251).collect();
    v.push(0);
    while !v.len().is_multiple_of(4) {
        v.push(0);
    }
    v
}

/// Device Identification (0x83): the LU's NAA and T10 vendor ID
/// designators, the target port's relative port and port group, and the
/// iSCSI target port and target device names.
pub(crate) fn device_identification<D: BlockDevice>(lu: &LogicalUnit<D>, nexus: &Nexus) -> Vec<u8> {
    let mut p = Vec::new();
    // Association 0 (logical unit): NAA (binary), T10 vendor ID (ASCII).
    designator(&mut p, 0x01, 0x03, &lu.naa);
    let mut t10 = ascii_field(VENDOR, 8);
    t10.extend_from_slice(&ascii_field(&lu.serial, lu.serial.len().min(MAX_SERIAL)));
    designator(&mut p, 0x02, 0x01, &t10);
    // Association 1 (target port), protocol identifier 5 (iSCSI), PIV.
    designator(&mut p, 0x51, 0x94, &[0, 0, (nexus.relative_port >> 8) as u8, nexus.relative_port as u8]);
    designator(&mut p, 0x51, 0x95, &[0, 0, (nexus.tpgt >> 8) as u8, nexus.tpgt as u8]);
    designator(&mut p, 0x53, 0x98, &scsi_name(&nexus.target_port));
    // Association 2 (target device): the iSCSI target name.
    designator(&mut p, 0x53, 0xA8, &scsi_name(nexus.target_name()));
    p
}

/// Extended INQUIRY Data (0x86).
fn extended_inquiry<D: BlockDevice>(lu: &LogicalUnit<D>) -> Vec<u8> {
    let mut p = vec![0u8; 0x3C];
    // SIMPSUP only: every command runs as SIMPLE, in no order but its
    // own (HEAD OF QUEUE and ORDERED, not enforced, are not claimed).
    set(&mut p, 1, 0x01);
    // V_SUP: a volatile cache exists.
    set(&mut p, 2, u8::from(lu.device.volatile_write_cache()));
    // LUICLR: unit attentions are cleared per I_T nexus.
    set(&mut p, 3, 0x01);
    p
}

/// Block Limits (0xB0, SBC-3 6.5.3).
fn block_limits<D: BlockDevice>(lu: &LogicalUnit<D>) -> Vec<u8> {
    let l = &lu.limits;
    let mut p = vec![0u8; 0x3C];
    // WSNZ: a WRITE SAME with zero blocks is rejected.
    set(&mut p, 0, 0x01);
    set(&mut p, 1, l.max_compare_and_write_blocks);
    let granularity = 1u16.checked_shl(u32::from(l.physical_block_exponent)).unwrap_or(1);
    put(&mut p, 2, &granularity.to_be_bytes());
    put(&mut p, 4, &l.max_transfer_blocks.to_be_bytes());
    put(&mut p, 8, &l.max_transfer_blocks.to_be_bytes());
    put(&mut p, 16, &l.max_unmap_lba_count.to_be_bytes());
    put(&mut p, 20, &l.max_unmap_descriptors.to_be_bytes());
    put(&mut p, 24, &u32::from(granularity).to_be_bytes());
    // UGAVALID with alignment 0.
    put(&mut p, 28, &0x8000_0000u32.to_be_bytes());
    put(&mut p, 32, &l.max_write_same_blocks.to_be_bytes());
    p
}

/// Logical Block Provisioning (0xB2, SBC-3 6.5.4).
fn provisioning<D: BlockDevice>(lu: &LogicalUnit<D>) -> Vec<u8> {
    // LBPU, LBPWS, LBPWS10; LBPRZ when deallocated blocks read as zeros.
    let lbprz = if lu.device.deallocate_reads_zeroes() { 0x04 } else { 0 };
    // Provisioning type 2: thin provisioned.
    vec![0x00, 0xE0 | lbprz, 0x02, 0x00]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_fields_are_padded_and_sanitized() {
        assert_eq!(ascii_field("ab\u{7f}", 5), b"ab_  ");
        assert_eq!(ascii_field("abcdefgh", 4), b"abcd");
    }

    #[test]
    fn scsi_names_are_null_terminated_multiples_of_four() {
        assert_eq!(scsi_name("abc"), b"abc\0");
        assert_eq!(scsi_name("abcd"), b"abcd\0\0\0\0");
    }
}
