//! The table of supported commands: what each may do under a reservation
//! (SPC-4 5.9.1 table 62, SBC-3 table 13) and its CDB usage data for
//! REPORT SUPPORTED OPERATION CODES (SPC-4 6.35).

use crate::cdb::{self, op, Bytes};
use crate::sense::Sense;
use crate::unit::Access;
use crate::Outcome;

/// One supported command (service action when `sa` is set).
struct Command {
    opcode: u8,
    sa: Option<u16>,
    /// CDB usage data: which bits the device server evaluates, with the
    /// service action (when `sa` is set) in byte 1 where the CDB carries
    /// it (SPC-4 6.35.3).
    usage: &'static [u8],
}

const fn cmd(opcode: u8, sa: Option<u16>, usage: &'static [u8]) -> Command {
    Command { opcode, sa, usage }
}

const LBA4: u8 = 0xFF;

/// Every supported command. The control byte is reported as unused: NACA
/// and LINK are rejected.
static COMMANDS: &[Command] = &[
    cmd(op::TEST_UNIT_READY, None, &[0x00, 0, 0, 0, 0, 0]),
    cmd(op::REQUEST_SENSE, None, &[0x03, 0x01, 0, 0, 0xFF, 0]),
    cmd(op::READ_6, None, &[0x08, 0x1F, 0xFF, 0xFF, 0xFF, 0]),
    cmd(op::WRITE_6, None, &[0x0A, 0x1F, 0xFF, 0xFF, 0xFF, 0]),
    cmd(op::INQUIRY, None, &[0x12, 0x01, 0xFF, 0xFF, 0xFF, 0]),
    cmd(op::MODE_SELECT_6, None, &[0x15, 0x11, 0, 0, 0xFF, 0]),
    cmd(op::RESERVE_6, None, &[0x16, 0, 0, 0, 0, 0]),
    cmd(op::RELEASE_6, None, &[0x17, 0, 0, 0, 0, 0]),
    cmd(op::MODE_SENSE_6, None, &[0x1A, 0x08, 0xFF, 0xFF, 0xFF, 0]),
    cmd(op::START_STOP_UNIT, None, &[0x1B, 0x01, 0, 0x0F, 0xF7, 0]),
    cmd(op::PREVENT_ALLOW_MEDIUM_REMOVAL, None, &[0x1E, 0, 0, 0, 0x03, 0]),
    cmd(op::READ_CAPACITY_10, None, &[0x25, 0, LBA4, LBA4, LBA4, LBA4, 0, 0, 0x01, 0]),
    cmd(op::READ_10, None, &[0x28, 0x18, LBA4, LBA4, LBA4, LBA4, 0, 0xFF, 0xFF, 0]),
    cmd(op::WRITE_10, None, &[0x2A, 0x18, LBA4, LBA4, LBA4, LBA4, 0, 0xFF, 0xFF, 0]),
    cmd(op::WRITE_AND_VERIFY_10, None, &[0x2E, 0x12, LBA4, LBA4, LBA4, LBA4, 0, 0xFF, 0xFF, 0]),
    cmd(op::VERIFY_10, None, &[0x2F, 0x16, LBA4, LBA4, LBA4, LBA4, 0, 0xFF, 0xFF, 0]),
    cmd(op::PRE_FETCH_10, None, &[0x34, 0x02, LBA4, LBA4, LBA4, LBA4, 0, 0xFF, 0xFF, 0]),
    cmd(op::SYNCHRONIZE_CACHE_10, None, &[0x35, 0x02, LBA4, LBA4, LBA4, LBA4, 0, 0xFF, 0xFF, 0]),
    cmd(op::WRITE_SAME_10, None, &[0x41, 0x08, LBA4, LBA4, LBA4, LBA4, 0, 0xFF, 0xFF, 0]),
    cmd(op::UNMAP, None, &[0x42, 0x01, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0]),
    cmd(op::MODE_SELECT_10, None, &[0x55, 0x11, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0]),
    cmd(op::MODE_SENSE_10, None, &[0x5A, 0x18, 0xFF, 0xFF, 0, 0, 0, 0xFF, 0xFF, 0]),
    cmd(op::PERSISTENT_RESERVE_IN, Some(0x00), &[0x5E, 0x00, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0]),
    cmd(op::PERSISTENT_RESERVE_IN, Some(0x01), &[0x5E, 0x01, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0]),
    cmd(op::PERSISTENT_RESERVE_IN, Some(0x02), &[0x5E, 0x02, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0]),
    cmd(op::PERSISTENT_RESERVE_IN, Some(0x03), &[0x5E, 0x03, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0]),
    cmd(op::PERSISTENT_RESERVE_OUT, Some(0x00), &[0x5F, 0x00, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0]),
    cmd(op::PERSISTENT_RESERVE_OUT, Some(0x01), &[0x5F, 0x01, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0]),
    cmd(op::PERSISTENT_RESERVE_OUT, Some(0x02), &[0x5F, 0x02, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0]),
    cmd(op::PERSISTENT_RESERVE_OUT, Some(0x03), &[0x5F, 0x03, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0]),
    cmd(op::PERSISTENT_RESERVE_OUT, Some(0x04), &[0x5F, 0x04, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0]),
    cmd(op::PERSISTENT_RESERVE_OUT, Some(0x05), &[0x5F, 0x05, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0]),
    cmd(op::PERSISTENT_RESERVE_OUT, Some(0x06), &[0x5F, 0x06, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0]),
    cmd(op::READ_16, None, &[0x88, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0]),
    cmd(
        op::COMPARE_AND_WRITE,
        None,
        &[0x89, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0xFF, 0, 0],
    ),
    cmd(
        op::WRITE_16,
        None,
        &[0x8A, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0],
    ),
    cmd(
        op::WRITE_AND_VERIFY_16,
        None,
        &[0x8E, 0x12, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0],
    ),
    cmd(
        op::VERIFY_16,
        None,
        &[0x8F, 0x16, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0],
    ),
    cmd(
        op::PRE_FETCH_16,
        None,
        &[0x90, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0],
    ),
    cmd(
        op::SYNCHRONIZE_CACHE_16,
        None,
        &[0x91, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0],
    ),
    cmd(
        op::WRITE_SAME_16,
        None,
        &[0x93, 0x09, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0],
    ),
    cmd(
        op::SERVICE_ACTION_IN_16,
        Some(op::SAI_READ_CAPACITY_16),
        &[0x9E, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0],
    ),
    cmd(
        op::SERVICE_ACTION_IN_16,
        Some(op::SAI_GET_LBA_STATUS),
        &[0x9E, 0x12, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0],
    ),
    cmd(op::REPORT_LUNS, None, &[0xA0, 0, 0xFF, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0]),
    cmd(
        op::MAINTENANCE_IN,
        Some(op::MI_REPORT_SUPPORTED_OPCODES),
        &[0xA3, 0x0C, 0x87, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0],
    ),
    cmd(op::READ_12, None, &[0xA8, 0x18, LBA4, LBA4, LBA4, LBA4, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0]),
    cmd(op::WRITE_12, None, &[0xAA, 0x18, LBA4, LBA4, LBA4, LBA4, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0]),
    cmd(op::WRITE_AND_VERIFY_12, None, &[0xAE, 0x12, LBA4, LBA4, LBA4, LBA4, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0]),
    cmd(op::VERIFY_12, None, &[0xAF, 0x16, LBA4, LBA4, LBA4, LBA4, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0]),
];

/// Whether the opcode uses service actions (in CDB byte 1, bits 4-0).
fn has_service_actions(opcode: u8) -> bool {
    COMMANDS.iter().any(|c| c.opcode == opcode && c.sa.is_some())
}

/// How a supported opcode is treated under reservations; `None` for an
/// unsupported opcode (INVALID COMMAND OPERATION CODE).
pub(crate) fn access(opcode: u8, c: Bytes<'_>) -> Option<Access> {
    Some(match opcode {
        op::TEST_UNIT_READY
        | op::REQUEST_SENSE
        | op::INQUIRY
        | op::REPORT_LUNS
        | op::READ_CAPACITY_10
        | op::MAINTENANCE_IN => Access::Always,
        op::SERVICE_ACTION_IN_16 => match u16::from(c.u8(1) & 0x1F) {
            op::SAI_GET_LBA_STATUS => Access::Read,
            _ => Access::Always,
        },
        // SBC-3 table 13: START with POWER CONDITION 0h and PREVENT 00b
        // (allow removal) are allowed under every reservation; a STOP,
        // another power condition or a PREVENT conflict as writes do.
        op::START_STOP_UNIT if c.u8(4) & 0xF1 == 0x01 => Access::Always,
        op::PREVENT_ALLOW_MEDIUM_REMOVAL if c.u8(4) & 0x03 == 0 => Access::Always,
        op::READ_6
        | op::READ_10
        | op::READ_12
        | op::READ_16
        | op::VERIFY_10
        | op::VERIFY_12
        | op::VERIFY_16
        | op::PRE_FETCH_10
        | op::PRE_FETCH_16
        | op::MODE_SENSE_6
        | op::MODE_SENSE_10 => Access::Read,
        op::WRITE_6
        | op::WRITE_10
        | op::WRITE_12
        | op::WRITE_16
        | op::WRITE_AND_VERIFY_10
        | op::WRITE_AND_VERIFY_12
        | op::WRITE_AND_VERIFY_16
        | op::WRITE_SAME_10
        | op::WRITE_SAME_16
        | op::UNMAP
        | op::COMPARE_AND_WRITE
        | op::SYNCHRONIZE_CACHE_10
        | op::SYNCHRONIZE_CACHE_16
        | op::MODE_SELECT_6
        | op::MODE_SELECT_10
        | op::START_STOP_UNIT
        | op::PREVENT_ALLOW_MEDIUM_REMOVAL => Access::Write,
        op::PERSISTENT_RESERVE_IN | op::PERSISTENT_RESERVE_OUT => Access::Persistent,
        op::RESERVE_6 | op::RELEASE_6 => Access::Spc2,
        _ => return None,
    })
}

/// Whether `opcode` writes the medium: what software write protect (the
/// SWP bit of the control mode page) refuses (SBC-3 4.11).
pub(crate) fn writes_medium(opcode: u8) -> bool {
    matches!(
        opcode,
        op::WRITE_6
            | op::WRITE_10
            | op::WRITE_12
            | op::WRITE_16
            | op::WRITE_AND_VERIFY_10
            | op::WRITE_AND_VERIFY_12
            | op::WRITE_AND_VERIFY_16
            | op::WRITE_SAME_10
            | op::WRITE_SAME_16
            | op::UNMAP
            | op::COMPARE_AND_WRITE
    )
}

/// Command timeouts descriptor (SPC-4 6.35.4): nominal unspecified,
/// recommended 30 s.
const TIMEOUTS: [u8; 12] = [0x00, 0x0A, 0, 0, 0, 0, 0, 0, 0, 0, 0, 30];

/// MAINTENANCE IN: REPORT SUPPORTED OPERATION CODES (SPC-4 6.35).
pub(crate) fn report_supported_opcodes<B>(c: Bytes<'_>) -> Outcome<B> {
    if u16::from(c.u8(1) & 0x1F) != op::MI_REPORT_SUPPORTED_OPCODES {
        return Outcome::Check(Sense::invalid_cdb_field(1, Some(4)));
    }
    let rctd = c.bit(2, 7);
    let (opcode, sa, alloc_len) = (c.u8(3), c.be16(4), c.be32(6));
    let one = |found: Option<&Command>| {
        let mut d = vec![0u8, 0x01, 0, 0];
        if let Some(cmd) = found {
            d = vec![0, 0x03 | if rctd { 0x80 } else { 0 }];
            d.extend_from_slice(&(cmd.usage.len() as u16).to_be_bytes());
            d.extend_from_slice(cmd.usage);
            if rctd {
                d.extend_from_slice(&TIMEOUTS);
            }
        }
        d
    };
    let data = match c.u8(2) & 0x07 {
        0 => {
            let mut d = vec![0u8; 4];
            for cmd in COMMANDS {
                let flags = u8::from(cmd.sa.is_some()) | if rctd { 0x02 } else { 0 };
                let [sa_hi, sa_lo] = cmd.sa.unwrap_or(0).to_be_bytes();
                let [len_hi, len_lo] = (cmd.usage.len() as u16).to_be_bytes();
                d.extend_from_slice(&[cmd.opcode, 0, sa_hi, sa_lo, 0, flags, len_hi, len_lo]);
                if rctd {
                    d.extend_from_slice(&TIMEOUTS);
                }
            }
            let len = (d.len().saturating_sub(4) as u32).to_be_bytes();
            cdb::put(&mut d, 0, &len);
            d
        }
        1 if has_service_actions(opcode) => return Outcome::Check(Sense::invalid_cdb_field(3, None)),
        1 => one(COMMANDS.iter().find(|c| c.opcode == opcode)),
        2 if !has_service_actions(opcode) => return Outcome::Check(Sense::invalid_cdb_field(3, None)),
        2 => one(COMMANDS.iter().find(|c| c.opcode == opcode && c.sa == Some(sa))),
        3 if has_service_actions(opcode) => one(COMMANDS.iter().find(|c| c.opcode == opcode && c.sa == Some(sa))),
        3 => one(COMMANDS.iter().find(|c| c.opcode == opcode && sa == 0)),
        _ => return Outcome::Check(Sense::invalid_cdb_field(2, Some(2))),
    };
    Outcome::Good { data_in: cdb::truncate(data, alloc_len) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_data_starts_with_opcode_and_matches_cdb_length() {
        for c in COMMANDS {
            assert_eq!(c.usage.first(), Some(&c.opcode), "opcode {:#04x}", c.opcode);
            assert_eq!(Some(c.usage.len()), cdb::cdb_len(c.opcode), "opcode {:#04x}", c.opcode);
            assert!(access(c.opcode, Bytes(&[c.opcode, c.sa.unwrap_or(0) as u8])).is_some());
            if let Some(sa) = c.sa {
                let in_usage = c.usage.get(1).map(|b| u16::from(b & 0x1F));
                assert_eq!(in_usage, Some(sa), "opcode {:#04x} service action {sa:#04x}", c.opcode);
            }
        }
    }
}
