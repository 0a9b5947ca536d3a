//! Sans-IO SCSI target logic for block devices: SPC-4 primary commands and
//! SBC-3 block commands.
//!
//! It owns CDB decoding, standard INQUIRY and the VPD pages, mode pages,
//! READ CAPACITY, SPC-2 and persistent reservations, unit attentions, and
//! sense data. It never does I/O and never reads a clock: a command that
//! touches storage comes back from [`LogicalUnit::execute`] as a
//! [`BlockOp`] for the daemon to run on the unit's device, and a device
//! error becomes sense data through [`io_error_sense`] (the one mapping).
//! The unit sees its device only through [`block::BlockDevice`]. Command failures are [`Sense`] values, never Rust
//! errors, and no CDB or parameter list from the wire can make it panic.
//!
//! The flow for one command is parse → execute → complete:
//! 1. the transport hands `execute` the nexus, the CDB and (once it has it)
//!    the data-out buffer; [`LogicalUnit::data_out_len`] tells it how many
//!    bytes of data-out the CDB describes, so that it can report the
//!    residual against its own expected length;
//! 2. `execute` answers [`Outcome::Good`] with data-in (already truncated to
//!    the CDB's allocation length), [`Outcome::Check`], [`Outcome::Status`]
//!    (RESERVATION CONFLICT), [`Outcome::NeedData`] (transfer that many
//!    bytes of data-out, then call `execute` again with them) or
//!    [`Outcome::Io`];
//! 3. the executor runs the [`BlockOp`] and answers GOOD, or CHECK
//!    CONDITION with [`io_error_sense`] of the device error.
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

mod cdb;
mod inquiry;
mod lun;
mod mode;
mod opcodes;
mod pr;
mod sbc;
mod sense;
mod unit;

#[cfg(test)]
mod tests;

pub use cdb::op;
pub use lun::{decode_lun, encode_lun, execute_without_lu, report_luns, report_luns_data, Lun, WLUN_REPORT_LUNS};
pub use pr::NexusId;
pub use sbc::lba_status_data;
pub use sense::{io_error_sense, key, miscompare, status, FieldPointer, Sense};
pub use unit::{Limits, LogicalUnit, Nexus};

/// A data-out buffer: the bytes the initiator sent, which a command may
/// use only the first part of (a WRITE whose transport carried more or
/// fewer bytes than its CDB describes writes the whole blocks both cover).
pub trait DataOut: AsRef<[u8]> {
    /// Shortens the buffer to `len` bytes; a longer `len` does nothing.
    fn truncate(&mut self, len: usize);
}

impl DataOut for Vec<u8> {
    fn truncate(&mut self, len: usize) {
        Vec::truncate(self, len);
    }
}

/// What `execute` decided.
#[derive(Debug)]
pub enum Outcome<B> {
    /// GOOD status; `data_in` (possibly empty) is already truncated to the
    /// CDB's allocation length. The transport truncates further to the
    /// expected data transfer length and reports the residual.
    Good {
        /// Data-in bytes.
        data_in: Vec<u8>,
    },
    /// CHECK CONDITION with this sense data.
    Check(Sense),
    /// Another status without sense data (RESERVATION CONFLICT, BUSY).
    Status(u8),
    /// The command needs `len` bytes of data-out: call `execute` again with
    /// the same CDB and the data. Block data (WRITE, COMPARE AND WRITE, WRITE
    /// SAME, VERIFY with BYTCHK) must be exactly `len` bytes; parameter
    /// lists may be shorter (they are parsed with bounds checks).
    NeedData {
        /// Data-out length in bytes.
        len: u32,
    },
    /// Run this storage operation on the logical unit's device; a device
    /// error maps to sense with [`io_error_sense`].
    Io(BlockOp<B>),
}

/// The storage operations SCSI commands turn into. All ranges were checked
/// against the device before the request was made.
#[derive(Debug)]
pub enum BlockOp<B> {
    /// Read `blocks` blocks at `lba` and send them as data-in.
    Read {
        /// Starting LBA.
        lba: u64,
        /// Block count (non-zero).
        blocks: u32,
    },
    /// Write `data` (a whole number of blocks) at `lba`; with `fua` the data
    /// is durable before GOOD status (FUA bit, WRITE AND VERIFY, or the
    /// write cache disabled with MODE SELECT).
    Write {
        /// Starting LBA.
        lba: u64,
        /// The data-out buffer.
        data: B,
        /// Force unit access.
        fua: bool,
    },
    /// Make every completed write durable (SYNCHRONIZE CACHE).
    Flush,
    /// Make `blocks` blocks at `lba` read as zeros (WRITE SAME of an
    /// all-zero block, or NDOB); with `unmap` the backend may deallocate
    /// them (`Device::write_zeroes(.., deallocate: unmap)`).
    WriteZeroes {
        /// Starting LBA.
        lba: u64,
        /// Block count (non-zero).
        blocks: u64,
        /// The UNMAP bit was set.
        unmap: bool,
        /// Durable before the answer (write cache disabled): the executor
        /// flushes the device after zeroing.
        fua: bool,
    },
    /// WRITE SAME of a non-zero block: write `block` (exactly one logical
    /// block) to each of `blocks` blocks at `lba`. The executor replicates
    /// it in bounded chunks rather than allocating `blocks` × block size.
    WriteSame {
        /// Starting LBA.
        lba: u64,
        /// Block count (non-zero, at most [`Limits::max_write_same_blocks`]).
        blocks: u64,
        /// One logical block of data.
        block: B,
        /// Force unit access (write cache disabled).
        fua: bool,
    },
    /// Deallocate each `(lba, blocks)` range (UNMAP). Blocks read back as
    /// zeros afterwards when `Device::deallocate_reads_zeroes` says so.
    Unmap {
        /// Ranges, each non-empty and in range.
        ranges: Vec<(u64, u64)>,
        /// Durable before the answer (write cache disabled): the executor
        /// flushes the device after deallocating.
        fua: bool,
    },
    /// COMPARE AND WRITE: read `blocks` blocks at `lba`, compare them with
    /// the first half of `data` and, only when equal, write the second half.
    /// On a mismatch the executor completes with [`miscompare`]'s sense
    /// (INFORMATION = offset of the first differing byte) and writes
    /// nothing. The read-compare-write must be atomic against every other
    /// write to the same blocks: the executor serializes it per logical
    /// unit (or per range).
    CompareAndWrite {
        /// Starting LBA.
        lba: u64,
        /// Block count (non-zero); `data` holds 2 × `blocks` blocks.
        blocks: u32,
        /// Verify data followed by write data.
        data: B,
        /// Force unit access for the write half.
        fua: bool,
    },
    /// GET LBA STATUS: ask the device for the provisioning state of the
    /// blocks from `lba` (`Device::extent(lba, blocks)`) and answer GOOD
    /// with [`lba_status_data`] of it, or a device error's sense.
    GetLbaStatus {
        /// Starting LBA (in range).
        lba: u64,
        /// Blocks from `lba` to the end of the device (non-zero).
        blocks: u64,
        /// The CDB's allocation length.
        alloc_len: u32,
    },
    /// VERIFY: with `data` (BYTCHK 1) read `blocks` blocks at `lba` and
    /// compare, failing with [`miscompare`]'s sense; without data the medium
    /// check is the executor's choice (reading, or nothing for memory).
    Verify {
        /// Starting LBA.
        lba: u64,
        /// Block count (non-zero).
        blocks: u32,
        /// Data to compare with, when BYTCHK was set.
        data: Option<B>,
    },
}

impl<B> BlockOp<B> {
    /// Whether the operation modifies the medium (for error mapping).
    pub fn is_write(&self) -> bool {
        !matches!(self, BlockOp::Read { .. } | BlockOp::Verify { .. } | BlockOp::GetLbaStatus { .. })
    }
}
