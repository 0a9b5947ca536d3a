//! Size limits of Dataset Management and Write Zeroes: what Identify
//! Controller for the NVM command set (CNS 06h) advertises and what the I/O
//! path enforces, from the same constants. A command beyond a limit is
//! answered with Command Size Limit Exceeded (NVM Command Set 1.0 figure
//! 32, 83h) and a log line naming the limit; it never reaches a device.
//!
//! The work behind one command is bounded: a Dataset Management carries at
//! most [`DMRL`] ranges (its NR field cannot say more) of at most [`DMSL`]
//! blocks in all, and a Write Zeroes at most [`WZSL_BYTES`]. Both run off
//! the reactor threads on file and block devices (io_uring fallocate and
//! discard), so the limits bound the kernel's work per command, not a
//! reactor's time.
//!
//! Why these values: Linux hosts from 6.9 on read CNS 06h only from
//! controllers of version 2.0 or later (ours report 1.4), and then send
//! discards of up to `UINT_MAX` 512-byte sectors in up to 256 ranges, and
//! Write Zeroes of at most MDTS. The limits accept all of that, so that a
//! host which does not read them never sees the error: DMRSL is the range
//! length field's own maximum, DMSL the most 512-byte sectors Linux puts in
//! one discard, WZSL the largest Write Zeroes a 512-byte-block namespace can
//! express (65536 blocks, 32 MiB; the SCSI side's WRITE SAME allows 65535
//! blocks). UNMAP on the SCSI side stays at 1 GiB per command, the most
//! libiscsi's Block Limits test accepts; SCSI initiators read that page.

use nvme_spec::identify::{ctrl_nvm as cn, LEN};
use nvme_spec::writer::Page;
use nvme_spec::Status;

/// Ranges per Dataset Management command: the 0-based NR field's maximum
/// (and Linux's `NVME_DSM_MAX_RANGES`). The u8 DMRL field cannot say 256:
/// it reports 0, "no limit beyond NR".
pub const DMRL: usize = 256;
/// DMRSL: logical blocks per Dataset Management range.
pub const DMRSL: u64 = u32::MAX as u64;
/// DMSL: logical blocks in all ranges of one Dataset Management command.
pub const DMSL: u64 = u32::MAX as u64;
/// WZSL as the exponent Identify reports: 2^13 units of the 4 KiB minimum
/// memory page size (CAP.MPSMIN 0).
pub const WZSL: u8 = 13;
/// WZSL in bytes: the most one Write Zeroes may cover.
pub const WZSL_BYTES: u64 = 4096 << WZSL;

/// The CNS 06h / CSI 00h page.
pub(crate) fn identify_page() -> Vec<u8> {
    let mut p = Page::new(LEN);
    p.u8(cn::DMRL, 0).u8(cn::WZSL, WZSL).u32(cn::DMRSL, DMRSL as u32).u64(cn::DMSL, DMSL);
    p.into_vec()
}

/// Checks a Write Zeroes of `blocks` blocks of `block_size` bytes.
pub(crate) fn check_write_zeroes(blocks: u64, block_size: u32) -> Result<(), String> {
    let bytes = blocks.saturating_mul(u64::from(block_size));
    if bytes > WZSL_BYTES {
        return Err(format!("Write Zeroes of {blocks} blocks ({bytes} bytes) exceeds WZSL ({WZSL_BYTES} bytes)"));
    }
    Ok(())
}

/// Checks one Dataset Management range of `nlb` blocks, given the blocks of
/// the ranges before it; returns the new running total.
pub(crate) fn check_dsm_range(index: usize, nlb: u64, total: u64) -> Result<u64, String> {
    if nlb > DMRSL {
        return Err(format!("Dataset Management range {index} of {nlb} blocks exceeds DMRSL ({DMRSL})"));
    }
    let total = total.saturating_add(nlb);
    if total > DMSL {
        return Err(format!("Dataset Management ranges 0..={index} cover {total} blocks, more than DMSL ({DMSL})"));
    }
    Ok(total)
}

/// The status for a command beyond a limit.
pub(crate) const EXCEEDED: Status = Status::COMMAND_SIZE_LIMIT_EXCEEDED.dnr();
