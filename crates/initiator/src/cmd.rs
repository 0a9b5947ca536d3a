//! Submission queue entries for the commands this host sends (NVMe Base
//! 2.0, NVM Command Set 1.0, NVMe-oF 1.1). Pure builders: the command
//! identifier and the SGL are filled in when the command is submitted.

use nvme_spec::opcode::{Admin, Cns, FabricsType, FeatureId, Io};
use nvme_spec::Sqe;

fn fabrics(fctype: FabricsType) -> Sqe {
    Sqe {
        opcode: Admin::FABRICS.0,
        // FCTYPE lives in byte 4, the low byte of the NSID field.
        nsid: u32::from(fctype.0).into(),
        ..Default::default()
    }
}

/// Fabrics Connect (NVMe-oF 1.1 section 3.3): `sqsize` is 0-based, `kato_ms`
/// only matters on the admin queue, `cattr` is the Connect Attributes byte
/// (bit 2: disable SQ flow control). The 1024-byte Connect data is the
/// command's write data.
pub fn connect(qid: u16, sqsize: u16, kato_ms: u32, cattr: u8) -> Sqe {
    let mut s = fabrics(FabricsType::CONNECT);
    s.cdw10 = (u32::from(qid) << 16).into();
    s.cdw11 = (u32::from(cattr) << 16 | u32::from(sqsize)).into();
    s.cdw12 = kato_ms.into();
    s
}

/// Fabrics Property Get of a 4- or 8-byte property.
pub fn property_get(offset: u32, eight_bytes: bool) -> Sqe {
    let mut s = fabrics(FabricsType::PROPERTY_GET);
    s.cdw10 = u32::from(eight_bytes).into();
    s.cdw11 = offset.into();
    s
}

/// Fabrics Property Set of a 4-byte property.
pub fn property_set(offset: u32, value: u32) -> Sqe {
    let mut s = fabrics(FabricsType::PROPERTY_SET);
    s.cdw10 = 0.into();
    s.cdw11 = offset.into();
    s.cdw12 = value.into();
    s
}

/// Fabrics Disconnect of the queue it is sent on.
pub fn disconnect() -> Sqe {
    fabrics(FabricsType::DISCONNECT)
}

/// Identify with `cns` for `nsid`; 4096 bytes come back.
pub fn identify(cns: Cns, nsid: u32) -> Sqe {
    Sqe { opcode: Admin::IDENTIFY.0, nsid: nsid.into(), cdw10: u32::from(cns.0).into(), ..Default::default() }
}

/// Get Log Page of `len_bytes` (a non-zero multiple of 4) at byte `offset`.
pub fn get_log_page(lid: u8, len_bytes: u32, offset: u64) -> Sqe {
    let numd = (len_bytes / 4).saturating_sub(1);
    Sqe {
        opcode: Admin::GET_LOG_PAGE.0,
        nsid: 0xffff_ffff.into(),
        cdw10: (u32::from(lid) | ((numd & 0xffff) << 16)).into(),
        cdw11: (numd >> 16).into(),
        cdw12: (offset as u32).into(),
        cdw13: ((offset >> 32) as u32).into(),
        ..Default::default()
    }
}

/// Set Features.
pub fn set_features(fid: FeatureId, cdw11: u32) -> Sqe {
    Sqe { opcode: Admin::SET_FEATURES.0, cdw10: u32::from(fid.0).into(), cdw11: cdw11.into(), ..Default::default() }
}

/// Get Features (current value).
pub fn get_features(fid: FeatureId) -> Sqe {
    Sqe { opcode: Admin::GET_FEATURES.0, cdw10: u32::from(fid.0).into(), ..Default::default() }
}

/// Set Features Number of Queues asking for `count` I/O submission and
/// completion queues (the fields are 0-based).
pub fn number_of_queues(count: u16) -> Sqe {
    let n = u32::from(count.saturating_sub(1));
    set_features(FeatureId::NUMBER_OF_QUEUES, n | (n << 16))
}

/// Abort (NVMe Base 2.0 section 5.1): the command `cid` of submission
/// queue `sqid`.
pub fn abort(sqid: u16, cid: u16) -> Sqe {
    Sqe { opcode: Admin::ABORT.0, cdw10: ((u32::from(cid) << 16) | u32::from(sqid)).into(), ..Default::default() }
}

/// Keep Alive.
pub fn keep_alive() -> Sqe {
    Sqe { opcode: Admin::KEEP_ALIVE.0, ..Default::default() }
}

fn rw(op: Io, nsid: u32, lba: u64, blocks: u32) -> Sqe {
    Sqe {
        opcode: op.0,
        nsid: nsid.into(),
        cdw10: (lba as u32).into(),
        cdw11: ((lba >> 32) as u32).into(),
        // NLB is 0-based.
        cdw12: (blocks.saturating_sub(1) & 0xffff).into(),
        ..Default::default()
    }
}

/// Read `blocks` (1..=65536) from `lba`.
pub fn read(nsid: u32, lba: u64, blocks: u32) -> Sqe {
    rw(Io::READ, nsid, lba, blocks)
}

/// Write `blocks` (1..=65536) at `lba`.
pub fn write(nsid: u32, lba: u64, blocks: u32) -> Sqe {
    rw(Io::WRITE, nsid, lba, blocks)
}

/// Compare `blocks` at `lba` with the command's data.
pub fn compare(nsid: u32, lba: u64, blocks: u32) -> Sqe {
    rw(Io::COMPARE, nsid, lba, blocks)
}

/// Write Zeroes; `deallocate` sets DEAC (CDW12 bit 25).
pub fn write_zeroes(nsid: u32, lba: u64, blocks: u32, deallocate: bool) -> Sqe {
    let mut s = rw(Io::WRITE_ZEROES, nsid, lba, blocks);
    if deallocate {
        s.cdw12 = (s.cdw12.get() | (1 << 25)).into();
    }
    s
}

/// Flush.
pub fn flush(nsid: u32) -> Sqe {
    Sqe { opcode: Io::FLUSH.0, nsid: nsid.into(), ..Default::default() }
}

/// Dataset Management with the Deallocate attribute over `ranges`; the
/// range list built by [`dsm_ranges`] is the command's data.
pub fn deallocate(nsid: u32, ranges: usize) -> Sqe {
    Sqe {
        opcode: Io::DATASET_MANAGEMENT.0,
        nsid: nsid.into(),
        cdw10: (u32::try_from(ranges).unwrap_or(256).saturating_sub(1) & 0xff).into(),
        cdw11: (1u32 << 2).into(),
        ..Default::default()
    }
}

/// The Dataset Management range list (NVM Command Set 1.0 figure 39):
/// 16 bytes each, context attributes, block count (not 0-based), start LBA.
pub fn dsm_ranges(ranges: &[(u64, u32)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ranges.len() * 16);
    for &(lba, blocks) in ranges {
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&blocks.to_le_bytes());
        out.extend_from_slice(&lba.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme_spec::fabrics::{ConnectCmd, PropertyCmd};
    use nvme_spec::log::GetLogPage;
    use zerocopy::IntoBytes;

    #[test]
    fn connect_fields_read_back_as_the_target_decodes_them() {
        let sqe = connect(3, 127, 5000, 0);
        assert_eq!(sqe.fctype(), FabricsType::CONNECT.0);
        assert_eq!(ConnectCmd::from_sqe(&sqe), ConnectCmd { recfmt: 0, qid: 3, sqsize: 127, cattr: 0, kato_ms: 5000 });
        let sqe = connect(1, 31, 0, ConnectCmd::CATTR_DISABLE_SQ_FLOW);
        assert_eq!(ConnectCmd::from_sqe(&sqe), ConnectCmd { recfmt: 0, qid: 1, sqsize: 31, cattr: 4, kato_ms: 0 });
    }

    #[test]
    fn property_commands_carry_size_offset_and_value() {
        let p = PropertyCmd::from_sqe(&property_get(nvme_spec::regs::CAP, true));
        assert_eq!(p.len_bytes, Some(8));
        assert_eq!(p.offset, 0);
        let p = PropertyCmd::from_sqe(&property_set(nvme_spec::regs::CC, 0x0046_0001));
        assert_eq!(p.len_bytes, Some(4));
        assert_eq!((p.offset, p.value), (0x14, 0x0046_0001));
    }

    #[test]
    fn get_log_page_splits_the_dword_count_and_offset() {
        let g = GetLogPage::from_sqe(&get_log_page(0x70, 3 * 1024 * 1024, 0x1_0000_0400));
        assert_eq!(g.lid, 0x70);
        assert_eq!(g.len_bytes, 3 * 1024 * 1024);
        assert_eq!(g.offset, 0x1_0000_0400);
    }

    #[test]
    fn read_write_use_zero_based_block_count() {
        let s = read(1, 0x1_2345_6789, 8);
        assert_eq!(s.slba(), 0x1_2345_6789);
        assert_eq!(s.blocks(), 8);
        assert_eq!(s.opcode, 0x02);
        assert_eq!(write(1, 0, 65536).blocks(), 65536);
        assert_eq!(write_zeroes(1, 0, 1, true).cdw12.get(), 1 << 25);
    }

    #[test]
    fn dsm_range_is_sixteen_bytes_little_endian() {
        let r = dsm_ranges(&[(0x0102, 8)]);
        assert_eq!(r.len(), 16);
        assert_eq!(&r[4..8], &8u32.to_le_bytes());
        assert_eq!(&r[8..16], &0x0102u64.to_le_bytes());
        let s = deallocate(1, 1);
        assert_eq!(s.cdw10.get(), 0);
        assert_eq!(s.cdw11.get(), 4);
        assert_eq!(s.as_bytes().len(), 64);
    }

    #[test]
    fn number_of_queues_is_zero_based() {
        let s = number_of_queues(4);
        assert_eq!(s.cdw10.get(), 7);
        assert_eq!(s.cdw11.get(), 0x0003_0003);
    }
}
