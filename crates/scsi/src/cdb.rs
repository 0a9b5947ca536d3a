//! Checked access to CDB and parameter-list bytes from the wire, and the
//! operation codes this target knows. Every read is bounds-checked: a
//! missing byte reads as zero (callers check the CDB length first), so no
//! input can panic.

/// Operation codes (SPC-4 annex D, SBC-3 5).
pub mod op {
    pub const TEST_UNIT_READY: u8 = 0x00;
    pub const REQUEST_SENSE: u8 = 0x03;
    pub const READ_6: u8 = 0x08;
    pub const WRITE_6: u8 = 0x0A;
    pub const INQUIRY: u8 = 0x12;
    pub const MODE_SELECT_6: u8 = 0x15;
    pub const RESERVE_6: u8 = 0x16;
    pub const RELEASE_6: u8 = 0x17;
    pub const MODE_SENSE_6: u8 = 0x1A;
    pub const START_STOP_UNIT: u8 = 0x1B;
    pub const PREVENT_ALLOW_MEDIUM_REMOVAL: u8 = 0x1E;
    pub const READ_CAPACITY_10: u8 = 0x25;
    pub const READ_10: u8 = 0x28;
    pub const WRITE_10: u8 = 0x2A;
    pub const WRITE_AND_VERIFY_10: u8 = 0x2E;
    pub const VERIFY_10: u8 = 0x2F;
    pub const PRE_FETCH_10: u8 = 0x34;
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    pub const WRITE_SAME_10: u8 = 0x41;
    pub const UNMAP: u8 = 0x42;
    pub const MODE_SELECT_10: u8 = 0x55;
    pub const RESERVE_10: u8 = 0x56;
    pub const RELEASE_10: u8 = 0x57;
    pub const MODE_SENSE_10: u8 = 0x5A;
    pub const PERSISTENT_RESERVE_IN: u8 = 0x5E;
    pub const PERSISTENT_RESERVE_OUT: u8 = 0x5F;
    pub const READ_16: u8 = 0x88;
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    pub const WRITE_16: u8 = 0x8A;
    pub const WRITE_AND_VERIFY_16: u8 = 0x8E;
    pub const VERIFY_16: u8 = 0x8F;
    pub const PRE_FETCH_16: u8 = 0x90;
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    pub const WRITE_SAME_16: u8 = 0x93;
    pub const SERVICE_ACTION_IN_16: u8 = 0x9E;
    pub const REPORT_LUNS: u8 = 0xA0;
    pub const MAINTENANCE_IN: u8 = 0xA3;
    pub const READ_12: u8 = 0xA8;
    pub const WRITE_12: u8 = 0xAA;
    pub const WRITE_AND_VERIFY_12: u8 = 0xAE;
    pub const VERIFY_12: u8 = 0xAF;

    /// SERVICE ACTION IN(16) service actions.
    pub const SAI_READ_CAPACITY_16: u16 = 0x10;
    pub const SAI_GET_LBA_STATUS: u16 = 0x12;
    /// MAINTENANCE IN service actions.
    pub const MI_REPORT_SUPPORTED_OPCODES: u16 = 0x0C;
}

/// The CDB length implied by the operation code's group (SPC-4 4.2.5.1),
/// or `None` for groups this target does not accept (variable length,
/// reserved, vendor specific).
pub fn cdb_len(opcode: u8) -> Option<usize> {
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

/// Big-endian reads over untrusted bytes; absent bytes read as zero.
#[derive(Clone, Copy)]
pub struct Bytes<'a>(pub &'a [u8]);

impl Bytes<'_> {
    pub fn u8(&self, i: usize) -> u8 {
        self.0.get(i).copied().unwrap_or(0)
    }
    fn be<const N: usize>(&self, i: usize) -> u64 {
        (0..N).fold(0u64, |acc, k| (acc << 8) | u64::from(self.u8(i.saturating_add(k))))
    }
    pub fn be16(&self, i: usize) -> u16 {
        self.be::<2>(i) as u16
    }
    pub fn be24(&self, i: usize) -> u32 {
        self.be::<3>(i) as u32
    }
    pub fn be32(&self, i: usize) -> u32 {
        self.be::<4>(i) as u32
    }
    pub fn be64(&self, i: usize) -> u64 {
        self.be::<8>(i)
    }
    /// Bit `bit` of byte `i`.
    pub fn bit(&self, i: usize, bit: u8) -> bool {
        self.u8(i) & (1u8 << (bit & 7)) != 0
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// Copies `src` into `buf` at `offset`, growing nothing: bytes that would
/// fall outside `buf` are dropped (builders size their buffers first).
pub fn put(buf: &mut [u8], offset: usize, src: &[u8]) {
    let end = offset.saturating_add(src.len()).min(buf.len());
    if let (Some(dst), Some(src)) = (buf.get_mut(offset..end), src.get(..end.saturating_sub(offset))) {
        dst.copy_from_slice(src);
    }
}

/// Sets byte `i` of `buf` (ignored when out of bounds).
pub fn set(buf: &mut [u8], i: usize, v: u8) {
    if let Some(b) = buf.get_mut(i) {
        *b = v;
    }
}

/// `data` truncated to the allocation length.
pub fn truncate(mut data: Vec<u8>, alloc_len: u32) -> Vec<u8> {
    data.truncate(usize::try_from(alloc_len).unwrap_or(usize::MAX));
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_past_the_end_are_zero() {
        let b = Bytes(&[0x12, 0x34]);
        assert_eq!(b.be16(0), 0x1234);
        assert_eq!(b.be32(0), 0x1234_0000);
        assert_eq!(b.be64(usize::MAX), 0);
        assert_eq!(b.u8(2), 0);
    }

    #[test]
    fn cdb_length_follows_group_code() {
        assert_eq!(cdb_len(op::READ_6), Some(6));
        assert_eq!(cdb_len(op::READ_10), Some(10));
        assert_eq!(cdb_len(op::MODE_SENSE_10), Some(10));
        assert_eq!(cdb_len(op::READ_12), Some(12));
        assert_eq!(cdb_len(op::READ_16), Some(16));
        assert_eq!(cdb_len(0x7F), None);
        assert_eq!(cdb_len(0xC0), None);
    }

    #[test]
    fn put_never_writes_out_of_bounds() {
        let mut b = [0u8; 4];
        put(&mut b, 2, &[1, 2, 3]);
        assert_eq!(b, [0, 0, 1, 2]);
        put(&mut b, 9, &[1]);
        assert_eq!(b, [0, 0, 1, 2]);
    }
}
