//! Sense data (SPC-4 4.5): the one value every failed command carries, with
//! the fixed (0x70) and descriptor (0x72) encodings, and the one mapping
//! from a block-device error to sense ([`io_error_sense`]).

use crate::cdb::{put, set};
use std::io;

/// SCSI status codes (SAM-5 5.3).
pub mod status {
    /// GOOD.
    pub const GOOD: u8 = 0x00;
    /// CHECK CONDITION: sense data describes the failure.
    pub const CHECK_CONDITION: u8 = 0x02;
    /// CONDITION MET.
    pub const CONDITION_MET: u8 = 0x04;
    /// BUSY.
    pub const BUSY: u8 = 0x08;
    /// RESERVATION CONFLICT.
    pub const RESERVATION_CONFLICT: u8 = 0x18;
    /// TASK SET FULL.
    pub const TASK_SET_FULL: u8 = 0x28;
    /// TASK ABORTED.
    pub const TASK_ABORTED: u8 = 0x40;

    /// The status's name (SAM-5 table 39), for logs and `ctl` output.
    pub fn name(status: u8) -> Option<&'static str> {
        Some(match status {
            GOOD => "GOOD",
            CHECK_CONDITION => "CHECK CONDITION",
            CONDITION_MET => "CONDITION MET",
            BUSY => "BUSY",
            RESERVATION_CONFLICT => "RESERVATION CONFLICT",
            TASK_SET_FULL => "TASK SET FULL",
            TASK_ABORTED => "TASK ABORTED",
            _ => return None,
        })
    }
}

/// Sense keys (SPC-4 4.5.6, table 27).
pub mod key {
    /// NO SENSE.
    pub const NO_SENSE: u8 = 0x0;
    /// NOT READY.
    pub const NOT_READY: u8 = 0x2;
    /// MEDIUM ERROR.
    pub const MEDIUM_ERROR: u8 = 0x3;
    /// HARDWARE ERROR.
    pub const HARDWARE_ERROR: u8 = 0x4;
    /// ILLEGAL REQUEST.
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    /// UNIT ATTENTION.
    pub const UNIT_ATTENTION: u8 = 0x6;
    /// DATA PROTECT.
    pub const DATA_PROTECT: u8 = 0x7;
    /// ABORTED COMMAND.
    pub const ABORTED_COMMAND: u8 = 0xB;
    /// MISCOMPARE.
    pub const MISCOMPARE: u8 = 0xE;

    /// The sense key's name (SPC-4 table 27).
    pub fn name(key: u8) -> &'static str {
        match key & 0x0F {
            NO_SENSE => "NO SENSE",
            0x1 => "RECOVERED ERROR",
            NOT_READY => "NOT READY",
            MEDIUM_ERROR => "MEDIUM ERROR",
            HARDWARE_ERROR => "HARDWARE ERROR",
            ILLEGAL_REQUEST => "ILLEGAL REQUEST",
            UNIT_ATTENTION => "UNIT ATTENTION",
            DATA_PROTECT => "DATA PROTECT",
            0x8 => "BLANK CHECK",
            0x9 => "VENDOR SPECIFIC",
            0xA => "COPY ABORTED",
            ABORTED_COMMAND => "ABORTED COMMAND",
            0xD => "VOLUME OVERFLOW",
            MISCOMPARE => "MISCOMPARE",
            _ => "COMPLETED",
        }
    }
}

/// Where in the CDB or parameter list an invalid field sits (the
/// sense-key specific field pointer, SPC-4 4.5.2.4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldPointer {
    /// True when the field is in the CDB, false for the parameter list.
    pub in_cdb: bool,
    /// Byte offset of the field.
    pub byte: u16,
    /// Bit of the field's most significant bit, when it is not a whole byte.
    pub bit: Option<u8>,
}

/// Sense data: key, additional sense code and qualifier, optional
/// INFORMATION field and optional field pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sense {
    /// Sense key.
    pub key: u8,
    /// Additional sense code.
    pub asc: u8,
    /// Additional sense code qualifier.
    pub ascq: u8,
    /// INFORMATION field (VALID bit set when present); the fixed format
    /// carries its low 32 bits.
    pub info: Option<u64>,
    /// Sense-key specific field pointer (ILLEGAL REQUEST only).
    pub field: Option<FieldPointer>,
}

impl Sense {
    /// Sense data with key and additional sense code only.
    pub const fn new(key: u8, asc: u8, ascq: u8) -> Sense {
        Sense { key, asc, ascq, info: None, field: None }
    }

    /// NO SENSE / NO ADDITIONAL SENSE INFORMATION.
    pub const NO_SENSE: Sense = Sense::new(key::NO_SENSE, 0x00, 0x00);
    /// ILLEGAL REQUEST / INVALID COMMAND OPERATION CODE.
    pub const INVALID_OPCODE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x20, 0x00);
    /// ILLEGAL REQUEST / LOGICAL BLOCK ADDRESS OUT OF RANGE.
    pub const LBA_OUT_OF_RANGE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x21, 0x00);
    /// ILLEGAL REQUEST / INVALID FIELD IN CDB (no field pointer).
    pub const INVALID_FIELD_IN_CDB: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x24, 0x00);
    /// ILLEGAL REQUEST / INVALID FIELD IN COMMAND INFORMATION UNIT: the
    /// transport's expected data length does not fit the command (SPC-4
    /// 4.5.6, FCP-4 9.4.2 b).
    pub const INVALID_FIELD_IN_COMMAND_IU: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x0E, 0x03);
    /// What a parameter list too short to parse gets, when the part being
    /// parsed needs `needed` bytes and the CDB announced `announced`: the
    /// CDB's own length is short (`needed > announced`), PARAMETER LIST
    /// LENGTH ERROR; else the transport's expected length cut the list,
    /// INVALID FIELD IN COMMAND INFORMATION UNIT (FCP-4 9.4.2 b).
    pub fn short_parameter_list(needed: usize, announced: usize) -> Sense {
        if needed > announced {
            Sense::PARAMETER_LIST_LENGTH_ERROR
        } else {
            Sense::INVALID_FIELD_IN_COMMAND_IU
        }
    }
    /// ILLEGAL REQUEST / LOGICAL UNIT NOT SUPPORTED.
    pub const LUN_NOT_SUPPORTED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x25, 0x00);
    /// ILLEGAL REQUEST / INVALID FIELD IN PARAMETER LIST (no field pointer).
    pub const INVALID_FIELD_IN_PARAMETER_LIST: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x00);
    /// ILLEGAL REQUEST / INVALID RELEASE OF PERSISTENT RESERVATION.
    pub const INVALID_RELEASE_OF_PR: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x04);
    /// ILLEGAL REQUEST / PARAMETER LIST LENGTH ERROR.
    pub const PARAMETER_LIST_LENGTH_ERROR: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x1A, 0x00);
    /// ILLEGAL REQUEST / SAVING PARAMETERS NOT SUPPORTED.
    pub const SAVING_PARAMETERS_NOT_SUPPORTED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x39, 0x00);
    /// ILLEGAL REQUEST / INSUFFICIENT REGISTRATION RESOURCES: no room for
    /// another persistent reservation registrant.
    pub const INSUFFICIENT_REGISTRATION_RESOURCES: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x55, 0x04);
    /// MISCOMPARE / MISCOMPARE DURING VERIFY OPERATION.
    pub const MISCOMPARE: Sense = Sense::new(key::MISCOMPARE, 0x1D, 0x00);
    /// DATA PROTECT / WRITE PROTECTED (software write protect is on).
    pub const WRITE_PROTECTED: Sense = Sense::new(key::DATA_PROTECT, 0x27, 0x00);
    /// MEDIUM ERROR / WRITE ERROR.
    pub const WRITE_ERROR: Sense = Sense::new(key::MEDIUM_ERROR, 0x0C, 0x00);
    /// MEDIUM ERROR / UNRECOVERED READ ERROR.
    pub const UNRECOVERED_READ_ERROR: Sense = Sense::new(key::MEDIUM_ERROR, 0x11, 0x00);
    /// ABORTED COMMAND / LOGICAL UNIT COMMUNICATION TIME-OUT: the backend
    /// did not answer in time; initiators retry ABORTED COMMAND.
    pub const LU_COMMUNICATION_TIMEOUT: Sense = Sense::new(key::ABORTED_COMMAND, 0x08, 0x01);
    /// DATA PROTECT / SPACE ALLOCATION FAILED WRITE PROTECT (thin backing full).
    pub const SPACE_ALLOCATION_FAILED: Sense = Sense::new(key::DATA_PROTECT, 0x27, 0x07);
    /// UNIT ATTENTION / POWER ON, RESET, OR BUS DEVICE RESET OCCURRED.
    pub const UA_POWER_ON_RESET: Sense = Sense::new(key::UNIT_ATTENTION, 0x29, 0x00);
    /// UNIT ATTENTION / BUS DEVICE RESET FUNCTION OCCURRED (logical unit reset).
    pub const UA_LUN_RESET: Sense = Sense::new(key::UNIT_ATTENTION, 0x29, 0x03);
    /// UNIT ATTENTION / I_T NEXUS LOSS OCCURRED.
    pub const UA_NEXUS_LOSS: Sense = Sense::new(key::UNIT_ATTENTION, 0x29, 0x07);
    /// UNIT ATTENTION / MODE PARAMETERS CHANGED.
    pub const UA_MODE_PARAMETERS_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2A, 0x01);
    /// UNIT ATTENTION / RESERVATIONS PREEMPTED.
    pub const UA_RESERVATIONS_PREEMPTED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2A, 0x03);
    /// UNIT ATTENTION / RESERVATIONS RELEASED.
    pub const UA_RESERVATIONS_RELEASED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2A, 0x04);
    /// UNIT ATTENTION / REGISTRATIONS PREEMPTED.
    pub const UA_REGISTRATIONS_PREEMPTED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2A, 0x05);
    /// UNIT ATTENTION / CAPACITY DATA HAS CHANGED.
    pub const UA_CAPACITY_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2A, 0x09);
    /// UNIT ATTENTION / COMMANDS CLEARED BY ANOTHER INITIATOR.
    pub const UA_COMMANDS_CLEARED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2F, 0x00);
    /// UNIT ATTENTION / REPORTED LUNS DATA HAS CHANGED.
    pub const UA_REPORTED_LUNS_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x3F, 0x0E);

    /// INVALID FIELD IN CDB pointing at `byte` (and `bit`, the field's most
    /// significant bit, when the field is not a whole byte).
    pub const fn invalid_cdb_field(byte: u16, bit: Option<u8>) -> Sense {
        Sense { field: Some(FieldPointer { in_cdb: true, byte, bit }), ..Sense::INVALID_FIELD_IN_CDB }
    }

    /// INVALID FIELD IN CDB for `bits`, the set bits of CDB byte `byte` that
    /// are one-bit fields or reserved bits the device server refuses: the
    /// bit pointer names the most significant of them, a bit in error, not
    /// a neighbouring field (SPC-4 4.5.2.4.2).
    pub const fn invalid_cdb_bits(byte: u16, bits: u8) -> Sense {
        let bit = match bits.checked_ilog2() {
            Some(b) => Some(b as u8),
            None => None,
        };
        Sense::invalid_cdb_field(byte, bit)
    }

    /// INVALID FIELD IN PARAMETER LIST pointing at `byte`/`bit`.
    pub const fn invalid_param_field(byte: u16, bit: Option<u8>) -> Sense {
        Sense { field: Some(FieldPointer { in_cdb: false, byte, bit }), ..Sense::INVALID_FIELD_IN_PARAMETER_LIST }
    }

    /// MISCOMPARE DURING VERIFY OPERATION with the INFORMATION field set to
    /// the byte offset of the first mismatch (SBC-3 5.2, 5.24).
    pub const fn miscompare_at(offset: u64) -> Sense {
        Sense { info: Some(offset), ..Sense::MISCOMPARE }
    }

    /// The additional sense code's description (SPC-4 annex D) for the
    /// codes this crate sends; `None` for others.
    pub fn asc_name(&self) -> Option<&'static str> {
        Some(match (self.asc, self.ascq) {
            (0x00, 0x00) => "NO ADDITIONAL SENSE INFORMATION",
            (0x0C, 0x00) => "WRITE ERROR",
            (0x11, 0x00) => "UNRECOVERED READ ERROR",
            (0x1A, 0x00) => "PARAMETER LIST LENGTH ERROR",
            (0x1D, 0x00) => "MISCOMPARE DURING VERIFY OPERATION",
            (0x20, 0x00) => "INVALID COMMAND OPERATION CODE",
            (0x21, 0x00) => "LOGICAL BLOCK ADDRESS OUT OF RANGE",
            (0x24, 0x00) => "INVALID FIELD IN CDB",
            (0x25, 0x00) => "LOGICAL UNIT NOT SUPPORTED",
            (0x26, 0x00) => "INVALID FIELD IN PARAMETER LIST",
            (0x26, 0x04) => "INVALID RELEASE OF PERSISTENT RESERVATION",
            (0x27, 0x00) => "WRITE PROTECTED",
            (0x27, 0x07) => "SPACE ALLOCATION FAILED WRITE PROTECT",
            (0x29, 0x00) => "POWER ON, RESET, OR BUS DEVICE RESET OCCURRED",
            (0x29, 0x03) => "BUS DEVICE RESET FUNCTION OCCURRED",
            (0x29, 0x07) => "I_T NEXUS LOSS OCCURRED",
            (0x2A, 0x01) => "MODE PARAMETERS CHANGED",
            (0x2A, 0x03) => "RESERVATIONS PREEMPTED",
            (0x2A, 0x04) => "RESERVATIONS RELEASED",
            (0x2A, 0x05) => "REGISTRATIONS PREEMPTED",
            (0x2A, 0x09) => "CAPACITY DATA HAS CHANGED",
            (0x2F, 0x00) => "COMMANDS CLEARED BY ANOTHER INITIATOR",
            (0x39, 0x00) => "SAVING PARAMETERS NOT SUPPORTED",
            (0x3F, 0x0E) => "REPORTED LUNS DATA HAS CHANGED",
            (0x55, 0x04) => "INSUFFICIENT REGISTRATION RESOURCES",
            _ => return None,
        })
    }

    /// Whether this is a unit attention.
    pub fn is_unit_attention(&self) -> bool {
        self.key == key::UNIT_ATTENTION
    }

    /// The 18-byte fixed-format sense data (response code 0x70, current
    /// error; SPC-4 4.5.3). INFORMATION carries the low 32 bits of `info`.
    pub fn to_fixed_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; 18];
        let info = self.info.map(|i| (i & 0xFFFF_FFFF) as u32);
        put(&mut b, 0, &[if info.is_some() { 0xF0 } else { 0x70 }, 0, self.key & 0x0F]);
        put(&mut b, 3, &info.unwrap_or(0).to_be_bytes());
        set(&mut b, 7, 10);
        put(&mut b, 12, &[self.asc, self.ascq]);
        if let Some(sks) = self.sense_key_specific() {
            put(&mut b, 15, &sks);
        }
        b
    }

    /// Descriptor-format sense data (response code 0x72; SPC-4 4.5.2) with
    /// an information descriptor and a sense-key specific descriptor when
    /// those fields are present.
    pub fn to_descriptor_bytes(&self) -> Vec<u8> {
        let mut b = vec![0x72, self.key & 0x0F, self.asc, self.ascq, 0, 0, 0, 0];
        if let Some(info) = self.info {
            b.extend_from_slice(&[0x00, 0x0A, 0x80, 0x00]);
            b.extend_from_slice(&info.to_be_bytes());
        }
        if let Some(sks) = self.sense_key_specific() {
            // Type 02h, additional length 06h, two reserved bytes, SKSV
            // and the field (bytes 4-6), one reserved byte (SPC-4
            // 4.5.2.4.1).
            b.extend_from_slice(&[0x02, 0x06, 0x00, 0x00]);
            b.extend_from_slice(&sks);
            b.extend_from_slice(&[0x00]);
        }
        let additional = b.len().saturating_sub(8) as u8;
        if let Some(len) = b.get_mut(7) {
            *len = additional;
        }
        b
    }

    /// The three sense-key specific bytes (SKSV set), if any.
    fn sense_key_specific(&self) -> Option<[u8; 3]> {
        let f = self.field?;
        let mut first = 0x80u8;
        if f.in_cdb {
            first |= 0x40;
        }
        if let Some(bit) = f.bit {
            first |= 0x08 | (bit & 0x07);
        }
        let [hi, lo] = f.byte.to_be_bytes();
        Some([first, hi, lo])
    }
}

/// The key's and the code's names, then the codes: `ILLEGAL REQUEST:
/// LOGICAL BLOCK ADDRESS OUT OF RANGE (key 0x5 asc 0x21 ascq 0x00)`.
impl std::fmt::Display for Sense {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", key::name(self.key))?;
        if let Some(what) = self.asc_name() {
            write!(f, ": {what}")?;
        }
        write!(f, " (key {:#x} asc {:#04x} ascq {:#04x})", self.key, self.asc, self.ascq)
    }
}

/// The one mapping from a block-device error to sense data (`write` tells
/// a failed write from a failed read).
pub fn io_error_sense(err: &block::Error, write: bool) -> Sense {
    match err {
        block::Error::OutOfRange { .. } => Sense::LBA_OUT_OF_RANGE,
        block::Error::Misaligned { .. } | block::Error::Unsupported(_) => Sense::INVALID_FIELD_IN_CDB,
        // Out of space, or over a quota ([`block::Error::out_of_space`]).
        e if write && e.out_of_space() => Sense::SPACE_ALLOCATION_FAILED,
        // Not a medium error: the backend (an rbd image whose OSD is down)
        // did not answer in time. ABORTED COMMAND is retried by initiators
        // (Linux's scsi_check_sense: NEEDS_RETRY), as SPC-4 4.5.6 intends.
        block::Error::Io(e) if e.kind() == io::ErrorKind::TimedOut => Sense::LU_COMMUNICATION_TIMEOUT,
        _ if write => Sense::WRITE_ERROR,
        _ => Sense::UNRECOVERED_READ_ERROR,
    }
}

/// Compares `expected` (from the initiator) with `actual` (read from the
/// medium): `None` when equal, otherwise MISCOMPARE with the offset of the
/// first differing byte. A length difference counts as a mismatch at the
/// end of the shorter buffer.
pub fn miscompare(expected: &[u8], actual: &[u8]) -> Option<Sense> {
    let first = expected.iter().zip(actual).position(|(a, b)| a != b);
    match first {
        Some(offset) => Some(Sense::miscompare_at(offset as u64)),
        None if expected.len() != actual.len() => Some(Sense::miscompare_at(expected.len().min(actual.len()) as u64)),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_sense_and_status_by_name() {
        assert_eq!(
            Sense::LBA_OUT_OF_RANGE.to_string(),
            "ILLEGAL REQUEST: LOGICAL BLOCK ADDRESS OUT OF RANGE (key 0x5 asc 0x21 ascq 0x00)"
        );
        assert_eq!(Sense::new(key::MEDIUM_ERROR, 0x77, 0x01).to_string(), "MEDIUM ERROR (key 0x3 asc 0x77 ascq 0x01)");
        assert_eq!(status::name(status::CHECK_CONDITION), Some("CHECK CONDITION"));
        assert_eq!(status::name(0x22), None);
    }

    #[test]
    fn fixed_sense_lba_out_of_range_golden() {
        let b = Sense::LBA_OUT_OF_RANGE.to_fixed_bytes();
        assert_eq!(b, [0x70, 0, 0x05, 0, 0, 0, 0, 0x0A, 0, 0, 0, 0, 0x21, 0x00, 0, 0, 0, 0]);
    }

    #[test]
    fn fixed_sense_carries_info_and_valid_bit() {
        let b = Sense::miscompare_at(0x0102_0304).to_fixed_bytes();
        assert_eq!(b, [0xF0, 0, 0x0E, 1, 2, 3, 4, 0x0A, 0, 0, 0, 0, 0x1D, 0x00, 0, 0, 0, 0]);
    }

    #[test]
    fn fixed_sense_carries_field_pointer() {
        let b = Sense::invalid_cdb_field(1, Some(5)).to_fixed_bytes();
        assert_eq!(b, [0x70, 0, 0x05, 0, 0, 0, 0, 0x0A, 0, 0, 0, 0, 0x24, 0x00, 0, 0xCD, 0x00, 0x01]);
        let b = Sense::invalid_param_field(0x102, None).to_fixed_bytes();
        assert_eq!(b.get(15..18), Some(&[0x80, 0x01, 0x02][..]));
    }

    #[test]
    fn refused_bits_are_pointed_at_the_most_significant_one_set() {
        let f = |bits| Sense::invalid_cdb_bits(5, bits).field.and_then(|f| f.bit);
        assert_eq!((f(0x01), f(0x03), f(0x06), f(0x80)), (Some(0), Some(1), Some(2), Some(7)));
        assert_eq!(f(0), None);
    }

    #[test]
    fn descriptor_sense_has_information_descriptor() {
        let b = Sense::miscompare_at(7).to_descriptor_bytes();
        assert_eq!(b, [0x72, 0x0E, 0x1D, 0x00, 0, 0, 0, 12, 0x00, 0x0A, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 7]);
        assert_eq!(Sense::NO_SENSE.to_descriptor_bytes(), [0x72, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn io_errors_map_to_sense_once() {
        let oor = block::Error::OutOfRange { lba: 1, blocks: 1, capacity: 1 };
        assert_eq!(io_error_sense(&oor, false), Sense::LBA_OUT_OF_RANGE);
        let eio = block::Error::Io(io::Error::other("eio"));
        assert_eq!(io_error_sense(&eio, true), Sense::WRITE_ERROR);
        assert_eq!(io_error_sense(&eio, false), Sense::UNRECOVERED_READ_ERROR);
        let full = block::Error::Io(io::Error::from(io::ErrorKind::StorageFull));
        assert_eq!(io_error_sense(&full, true), Sense::SPACE_ALLOCATION_FAILED);
        let quota = block::Error::Io(io::Error::from(io::ErrorKind::QuotaExceeded));
        assert_eq!(io_error_sense(&quota, true), Sense::SPACE_ALLOCATION_FAILED, "EDQUOT");
        let late = block::Error::Io(io::Error::from_raw_os_error(110));
        assert_eq!(io_error_sense(&late, true), Sense::LU_COMMUNICATION_TIMEOUT, "ETIMEDOUT is retryable");
        assert_eq!(io_error_sense(&late, false), Sense::LU_COMMUNICATION_TIMEOUT);
    }

    #[test]
    fn miscompare_reports_first_differing_offset() {
        assert_eq!(miscompare(b"abcd", b"abcd"), None);
        assert_eq!(miscompare(b"abcd", b"abXd"), Some(Sense::miscompare_at(2)));
        assert_eq!(miscompare(b"abc", b"abcd"), Some(Sense::miscompare_at(3)));
    }
}
