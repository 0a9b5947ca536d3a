//! SCSI command execution through `scsi::LogicalUnit::execute` on a small
//! memory-like device (`block::Described`), with REPORT LUNS and LUN-less
//! commands routed as the iSCSI session does (`report_luns`,
//! `execute_without_lu`), and `data_out_len` asked of every CDB.
//!
//! Input: byte 0 sets the device: bit 0 4096-byte blocks (else 512), bit 1
//! a null-like device with a volatile write cache. The rest is records:
//!
//! ```text
//! h: u8          bit 0 nexus (one of two), bit 1 data-out follows,
//!                bit 2 the daemon's way: `execute` with the data-out at
//!                once (else `None` first and the data after NeedData),
//!                bit 3 hand the data as it came (else cut or padded to
//!                what NeedData asked), bit 4 no logical unit at this LUN
//!                (`execute_without_lu`), bit 5 before the command, the
//!                nexus is lost and recreated, bit 6 LUN reset by the
//!                nexus, bit 7 target reset
//! n: u8          CDB length, modulo 33
//! cdb: [u8; n]
//! [len: u16 le, bytes]   when bit 1 (len modulo 4097, cut to the input)
//! ```
//!
//! Never panics. NeedData stays within what the unit's limits allow;
//! `data_out_len` agrees with NeedData; every block request is inside the
//! device, non-empty, within the unit's limits (transfer, WRITE SAME,
//! UNMAP, COMPARE AND WRITE), and a request carrying data carries whole
//! blocks of the size the command describes. Sense data encodes.
#![no_main]

use block::{BlockDevice, Described};
use ironwire_fuzz::Reader;
use libfuzzer_sys::fuzz_target;
use scsi::{BlockOp, LogicalUnit, Nexus, Outcome};
use std::sync::Arc;

const TARGET: &str = "iqn.2026-11.io.ironwire:fuzz";
const LUNS: [u64; 2] = [0, 3];
/// Data-out beyond this is not handed over (the harness would spend its
/// time allocating); NeedData is still checked.
const MAX_DATA: u32 = 1 << 20;

fn nexus(n: u8) -> Nexus {
    Nexus {
        initiator: format!("iqn.2026-11.io.ironwire:host{n},i,0x80000000000{n}"),
        target_port: format!("{TARGET},t,0x0001"),
        relative_port: 1,
        tpgt: 1,
    }
}

/// Checks one outcome of `cdb`; returns the data-out length asked for.
fn check(lu: &LogicalUnit<Described>, cdb: &[u8], o: &Outcome<Vec<u8>>) -> Option<u32> {
    let geo = lu.device.geometry();
    let bs = u64::from(geo.block_size);
    let lim = lu.limits;
    let in_range = |lba: u64, blocks: u64| geo.check_range(lba, blocks).is_ok();
    match o {
        Outcome::Good { data_in } => {
            let _ = data_in.len();
        }
        Outcome::Check(s) => {
            assert!(s.to_fixed_bytes().len() >= 18);
            assert!(!s.to_descriptor_bytes().is_empty());
        }
        Outcome::Status(s) => assert!(*s != 0 && *s != 2, "status {s:#x} without sense"),
        Outcome::NeedData { len } => {
            let most = u64::from(lim.max_transfer_blocks).max(u64::from(lim.max_compare_and_write_blocks) * 2) * bs;
            assert!(u64::from(*len) <= most.max(1 << 20), "NeedData {len}");
            assert_eq!(*len, lu.data_out_len(cdb), "data_out_len disagrees with NeedData for {cdb:02x?}");
            return Some(*len);
        }
        Outcome::Io(op) => match op {
            BlockOp::Read { lba, blocks } => {
                assert!(*blocks > 0 && *blocks <= lim.max_transfer_blocks, "READ of {blocks} blocks");
                assert!(in_range(*lba, u64::from(*blocks)), "READ {lba}+{blocks} out of range");
            }
            BlockOp::Write { lba, data, .. } => {
                let n = data.len() as u64;
                assert!(n > 0 && n.is_multiple_of(bs), "WRITE of {n} bytes");
                assert!(n / bs <= u64::from(lim.max_transfer_blocks));
                assert!(in_range(*lba, n / bs), "WRITE {lba}+{} out of range", n / bs);
            }
            BlockOp::Flush => {}
            BlockOp::WriteZeroes { lba, blocks, .. } => {
                assert!(*blocks > 0 && *blocks <= lim.max_write_same_blocks.max(u64::from(lim.max_unmap_lba_count)));
                assert!(in_range(*lba, *blocks), "WRITE ZEROES {lba}+{blocks} out of range");
            }
            BlockOp::WriteSame { lba, blocks, block, .. } => {
                assert_eq!(block.len() as u64, bs, "WRITE SAME block");
                assert!(*blocks > 0 && *blocks <= lim.max_write_same_blocks);
                assert!(in_range(*lba, *blocks), "WRITE SAME {lba}+{blocks} out of range");
            }
            BlockOp::Unmap { ranges, .. } => {
                assert!(ranges.len() as u64 <= u64::from(lim.max_unmap_descriptors));
                let total: u64 = ranges.iter().map(|r| r.1).sum();
                assert!(total <= u64::from(lim.max_unmap_lba_count), "UNMAP of {total} blocks");
                for (lba, n) in ranges {
                    assert!(*n > 0 && in_range(*lba, *n), "UNMAP {lba}+{n}");
                }
            }
            BlockOp::CompareAndWrite { lba, blocks, data, .. } => {
                assert!(*blocks > 0 && *blocks <= u32::from(lim.max_compare_and_write_blocks));
                assert_eq!(data.len() as u64, 2 * u64::from(*blocks) * bs, "COMPARE AND WRITE data");
                assert!(in_range(*lba, u64::from(*blocks)));
            }
            BlockOp::GetLbaStatus { lba, blocks, alloc_len } => {
                assert!(*blocks > 0 && in_range(*lba, *blocks), "GET LBA STATUS {lba}+{blocks} out of range");
                let extent = block::Extent { blocks: *blocks, deallocated: lba & 1 != 0 };
                let d = scsi::lba_status_data(*lba, extent, *alloc_len);
                assert!(d.len() as u64 <= u64::from(*alloc_len), "GET LBA STATUS data past the allocation length");
            }
            BlockOp::Verify { lba, blocks, data } => {
                assert!(*blocks > 0 && *blocks <= lim.max_transfer_blocks);
                assert!(in_range(*lba, u64::from(*blocks)), "VERIFY {lba}+{blocks} out of range");
                if let Some(d) = data {
                    assert_eq!(d.len() as u64, u64::from(*blocks) * bs, "VERIFY data");
                }
            }
        },
    }
    None
}

fuzz_target!(|input: &[u8]| {
    let Some((&dev, rest)) = input.split_first() else {
        return;
    };
    let bs = if dev & 1 != 0 { 4096 } else { 512 };
    let mut d = Described::new("fuzz0", bs, (1 << 20) / u64::from(bs));
    if dev & 2 != 0 {
        d.backend = "null";
        d.volatile_write_cache = true;
        d.deallocate_reads_zeroes = false;
    }
    let lu = LogicalUnit::new(TARGET, 0, Arc::new(d));
    let nexuses = [nexus(0), nexus(1)];
    for n in &nexuses {
        lu.nexus_created(n);
    }
    let mut r = Reader(rest);
    while let Some(h) = r.u8() {
        let Some(n) = r.u8() else { break };
        let Some(cdb) = r.take(usize::from(n) % 33) else { break };
        let mut blob = None;
        if h & 2 != 0 {
            let Some(l) = r.take(2) else { break };
            let len = usize::from(u16::from_le_bytes([l[0], l[1]])) % 4097;
            let Some(b) = r.take(len.min(r.0.len())) else { break };
            blob = Some(b.to_vec());
        }
        let nx = &nexuses[usize::from(h & 1)];
        if h & 0x20 != 0 {
            lu.nexus_lost(nx);
            lu.nexus_created(nx);
        }
        if h & 0x40 != 0 {
            lu.lun_reset(nx);
        }
        if h & 0x80 != 0 {
            lu.target_reset();
        }
        let _ = lu.data_out_len(cdb);
        if h & 0x10 != 0 {
            let o: Outcome<Vec<u8>> = scsi::execute_without_lu(cdb, &LUNS);
            assert!(!matches!(o, Outcome::Io(_) | Outcome::NeedData { .. }), "no LU, yet {o:?}");
            continue;
        }
        if cdb.first() == Some(&scsi::op::REPORT_LUNS) {
            let o: Outcome<Vec<u8>> = lu.report_luns(nx, cdb, &LUNS);
            assert!(matches!(o, Outcome::Good { .. } | Outcome::Check(_)), "REPORT LUNS: {o:?}");
            continue;
        }
        if h & 4 != 0 {
            let o = lu.execute(nx, cdb, Some(blob.unwrap_or_default()));
            check(&lu, cdb, &o);
            continue;
        }
        let o = lu.execute::<Vec<u8>>(nx, cdb, None);
        if let Some(len) = check(&lu, cdb, &o) {
            if len > MAX_DATA {
                continue;
            }
            let mut data = blob.unwrap_or_default();
            if h & 8 == 0 {
                data.resize(len as usize, 0x5a);
            }
            let o = lu.execute(nx, cdb, Some(data));
            if let Some(again) = check(&lu, cdb, &o) {
                panic!("NeedData {again} again after the data for {cdb:02x?}");
            }
        }
    }
});
