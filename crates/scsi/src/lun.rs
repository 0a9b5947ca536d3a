//! LUN addressing (SAM-5 4.7) and the commands a session answers without a
//! logical unit: REPORT LUNS for every LUN, and INQUIRY / REQUEST SENSE /
//! anything else addressed to a LUN that does not exist.

use crate::cdb::{self, op, Bytes};
use crate::sense::Sense;
use crate::Outcome;

/// The REPORT LUNS well-known logical unit (SPC-4 8.2).
pub const WLUN_REPORT_LUNS: u8 = 0x01;

/// A decoded 8-byte LUN field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lun {
    /// An ordinary logical unit number (peripheral or flat addressing).
    Unit(u64),
    /// A well-known logical unit (extended addressing, 0xC1 xx).
    WellKnown(u8),
}

/// Encodes a LUN number as the 8-byte LUN field: peripheral device
/// addressing below 256, flat space addressing below 16384 (what Linux and
/// Windows expect), `None` above.
pub fn encode_lun(lun: u64) -> Option<[u8; 8]> {
    match lun {
        0..=255 => Some([0, lun as u8, 0, 0, 0, 0, 0, 0]),
        256..=0x3FFF => Some([0x40 | (lun >> 8) as u8, lun as u8, 0, 0, 0, 0, 0, 0]),
        _ => None,
    }
}

/// Decodes the 8-byte LUN field of a command (single level only: the
/// second to fourth levels must be zero). `None` for addressing this
/// target never hands out.
pub fn decode_lun(raw: [u8; 8]) -> Option<Lun> {
    let [b0, b1, rest @ ..] = raw;
    if rest.iter().any(|&b| b != 0) {
        return None;
    }
    match b0 >> 6 {
        0b00 if b0 == 0 => Some(Lun::Unit(u64::from(b1))),
        0b01 => Some(Lun::Unit((u64::from(b0 & 0x3F) << 8) | u64::from(b1))),
        0b11 if b0 == 0xC1 => Some(Lun::WellKnown(b1)),
        _ => None,
    }
}

/// The REPORT LUNS parameter data for `luns` (SPC-4 6.33): list length and
/// one 8-byte entry per encodable LUN.
pub fn report_luns_data(luns: &[u64]) -> Vec<u8> {
    let entries: Vec<[u8; 8]> = luns.iter().filter_map(|&l| encode_lun(l)).collect();
    let list_len = u32::try_from(entries.len().saturating_mul(8)).unwrap_or(u32::MAX);
    let mut data = Vec::with_capacity(entries.len().saturating_mul(8).saturating_add(8));
    data.extend_from_slice(&list_len.to_be_bytes());
    data.extend_from_slice(&[0; 4]);
    for e in entries {
        data.extend_from_slice(&e);
    }
    data
}

/// Answers a REPORT LUNS CDB with the session's `luns`, truncated to the
/// allocation length. SELECT REPORT 0x00 and 0x02 list every LUN; 0x01
/// (well-known only) returns an empty list since none are reported.
pub fn report_luns<B>(cdb: &[u8], luns: &[u64]) -> Outcome<B> {
    let c = Bytes(cdb);
    if c.len() < 12 || c.u8(0) != op::REPORT_LUNS {
        return Outcome::Check(Sense::INVALID_FIELD_IN_CDB);
    }
    // NACA, FLAG and LINK of the CONTROL byte: sessions answer REPORT LUNS
    // here rather than through `LogicalUnit::execute`, which refuses them
    // for every other command.
    let control = c.u8(11) & 0x07;
    if control != 0 {
        return Outcome::Check(Sense::invalid_cdb_bits(11, control));
    }
    let alloc_len = c.be32(6);
    // SPC-4 6.33: an allocation length below 16 is an error.
    if alloc_len < 16 {
        return Outcome::Check(Sense::invalid_cdb_field(6, None));
    }
    let data = match c.u8(2) {
        0x00 | 0x02 => report_luns_data(luns),
        0x01 => report_luns_data(&[]),
        _ => return Outcome::Check(Sense::invalid_cdb_field(2, None)),
    };
    Outcome::Good { data_in: cdb::truncate(data, alloc_len) }
}

/// Answers a command addressed to a LUN with no logical unit behind it
/// (SPC-4 4.6.4): REPORT LUNS lists `luns`; INQUIRY returns peripheral
/// qualifier 011b / device type 1Fh; REQUEST SENSE returns LOGICAL UNIT
/// NOT SUPPORTED as sense data; anything else fails with that sense.
pub fn execute_without_lu<B>(cdb: &[u8], luns: &[u64]) -> Outcome<B> {
    let c = Bytes(cdb);
    match c.u8(0) {
        op::REPORT_LUNS => report_luns(cdb, luns),
        op::INQUIRY if c.len() >= 6 => {
            if c.u8(1) & 0x01 != 0 || c.u8(2) != 0 {
                return Outcome::Check(Sense::LUN_NOT_SUPPORTED);
            }
            let mut data = vec![0u8; 36];
            cdb::put(&mut data, 0, &[0x7F, 0x00, 0x06, 0x12, 31]);
            Outcome::Good { data_in: cdb::truncate(data, u32::from(c.be16(3))) }
        }
        op::REQUEST_SENSE if c.len() >= 6 => {
            let s = Sense::LUN_NOT_SUPPORTED;
            let data = if c.u8(1) & 0x01 != 0 { s.to_descriptor_bytes() } else { s.to_fixed_bytes() };
            Outcome::Good { data_in: cdb::truncate(data, u32::from(c.u8(4))) }
        }
        _ => Outcome::Check(Sense::LUN_NOT_SUPPORTED),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good(o: Outcome<Vec<u8>>) -> Vec<u8> {
        match o {
            Outcome::Good { data_in } => data_in,
            other => panic!("expected GOOD, got {other:?}"),
        }
    }

    #[test]
    fn encodes_peripheral_and_flat_luns() {
        assert_eq!(encode_lun(0), Some([0; 8]));
        assert_eq!(encode_lun(5), Some([0, 5, 0, 0, 0, 0, 0, 0]));
        assert_eq!(encode_lun(300), Some([0x41, 0x2C, 0, 0, 0, 0, 0, 0]));
        assert_eq!(encode_lun(0x4000), None);
    }

    #[test]
    fn decodes_peripheral_flat_and_well_known_luns() {
        assert_eq!(decode_lun([0, 7, 0, 0, 0, 0, 0, 0]), Some(Lun::Unit(7)));
        assert_eq!(decode_lun([0x41, 0x2C, 0, 0, 0, 0, 0, 0]), Some(Lun::Unit(300)));
        assert_eq!(decode_lun([0xC1, 0x01, 0, 0, 0, 0, 0, 0]), Some(Lun::WellKnown(WLUN_REPORT_LUNS)));
        assert_eq!(decode_lun([0x01, 0x00, 0, 0, 0, 0, 0, 0]), None, "bus id must be zero");
        assert_eq!(decode_lun([0, 1, 0, 1, 0, 0, 0, 0]), None, "second level");
        for l in [0u64, 1, 255, 256, 0x3FFF] {
            assert_eq!(encode_lun(l).and_then(decode_lun), Some(Lun::Unit(l)));
        }
    }

    #[test]
    fn report_luns_lists_every_lun() {
        let cdb = [op::REPORT_LUNS, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
        let data = good(report_luns(&cdb, &[0, 1, 300]));
        assert_eq!(
            data,
            [0, 0, 0, 24, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x41, 0x2C, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn report_luns_truncates_to_allocation_length_but_keeps_full_list_length() {
        let cdb = [op::REPORT_LUNS, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0];
        let data = good(report_luns(&cdb, &[0, 1, 2]));
        assert_eq!(data.len(), 16);
        assert_eq!(data.get(..4), Some(&[0, 0, 0, 24][..]));
    }

    #[test]
    fn report_luns_rejects_small_allocation_and_bad_select_report() {
        let small = [op::REPORT_LUNS, 0, 0, 0, 0, 0, 0, 0, 0, 15, 0, 0];
        assert!(matches!(report_luns::<Vec<u8>>(&small, &[0]), Outcome::Check(s) if s.asc == 0x24));
        let bad = [op::REPORT_LUNS, 0, 0x03, 0, 0, 0, 0, 0, 1, 0, 0, 0];
        assert!(matches!(report_luns::<Vec<u8>>(&bad, &[0]), Outcome::Check(s) if s.asc == 0x24));
        let wk = [op::REPORT_LUNS, 0, 0x01, 0, 0, 0, 0, 0, 1, 0, 0, 0];
        assert_eq!(good(report_luns(&wk, &[0])), [0; 8]);
    }

    #[test]
    fn missing_lu_answers_inquiry_with_qualifier_3() {
        let data = good(execute_without_lu(&[op::INQUIRY, 0, 0, 0, 96, 0], &[0]));
        assert_eq!(data.get(..5), Some(&[0x7F, 0, 0x06, 0x12, 31][..]));
        let tur = execute_without_lu::<Vec<u8>>(&[0; 6], &[0]);
        assert!(matches!(tur, Outcome::Check(s) if s == Sense::LUN_NOT_SUPPORTED));
        let rs = good(execute_without_lu(&[op::REQUEST_SENSE, 0, 0, 0, 18, 0], &[0]));
        assert_eq!((rs.get(2), rs.get(12)), (Some(&0x05), Some(&0x25)));
    }
}
