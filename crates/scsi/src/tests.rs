//! Command-level tests through `LogicalUnit::execute` on null and ram
//! devices described by `block::Described`. No I/O runs: storage commands
//! are checked as the `BlockOp` they produce.
#![allow(clippy::indexing_slicing, clippy::unwrap_used)]

use crate::cdb::op;
use crate::pr::prout_parameters;
use crate::{BlockOp, Limits, Nexus, Outcome, Sense};
use block::Described;
use std::sync::Arc;

type LogicalUnit = crate::LogicalUnit<Described>;

const BS: u32 = 512;
const BLOCKS: u64 = 2048;
const TARGET: &str = "iqn.2024-01.dev.ironwire:t0";

fn ram_lu() -> LogicalUnit {
    let dev = Described::new("ram0", BS, BLOCKS);
    LogicalUnit::new(TARGET, 0, Arc::new(dev))
}

fn null_lu(size_bytes: u64) -> LogicalUnit {
    let dev = Described { backend: "null", ..Described::new("null0", BS, size_bytes / u64::from(BS)) };
    LogicalUnit::new(TARGET, 1, Arc::new(dev))
}

fn nexus(n: u8) -> Nexus {
    Nexus {
        initiator: format!("iqn.1994-05.com.example:host{n},i,0x23d00000000{n}"),
        target_port: format!("{TARGET},t,0x0001"),
        relative_port: 1,
        tpgt: 1,
    }
}

fn exec(lu: &LogicalUnit, n: &Nexus, cdb: &[u8]) -> Outcome<Vec<u8>> {
    lu.execute(n, cdb, None)
}

/// Runs a data-out command: expects NeedData of `data.len()`, then
/// executes again with the data.
fn exec_out(lu: &LogicalUnit, n: &Nexus, cdb: &[u8], data: Vec<u8>) -> Outcome<Vec<u8>> {
    match lu.execute::<Vec<u8>>(n, cdb, None) {
        Outcome::NeedData { len } => {
            assert_eq!(len as usize, data.len(), "data-out length for {:#04x}", cdb[0]);
            lu.execute(n, cdb, Some(data))
        }
        other => other,
    }
}

#[track_caller]
fn good(o: Outcome<Vec<u8>>) -> Vec<u8> {
    match o {
        Outcome::Good { data_in } => data_in,
        other => panic!("expected GOOD, got {other:?}"),
    }
}

#[track_caller]
fn check(o: Outcome<Vec<u8>>) -> Sense {
    match o {
        Outcome::Check(s) => s,
        other => panic!("expected CHECK CONDITION, got {other:?}"),
    }
}

#[track_caller]
fn block_op(o: Outcome<Vec<u8>>) -> BlockOp<Vec<u8>> {
    match o {
        Outcome::Io(op) => op,
        other => panic!("expected a block request, got {other:?}"),
    }
}

#[track_caller]
fn conflict(o: Outcome<Vec<u8>>) {
    assert!(matches!(o, Outcome::Status(0x18)), "expected RESERVATION CONFLICT, got {o:?}");
}

fn asc(s: Sense) -> (u8, u8, u8) {
    (s.key, s.asc, s.ascq)
}

const INVALID_CDB: (u8, u8, u8) = (5, 0x24, 0);
const INVALID_PARAM: (u8, u8, u8) = (5, 0x26, 0);
const LBA_OOR: (u8, u8, u8) = (5, 0x21, 0);

fn read10(lba: u32, blocks: u16, flags: u8) -> [u8; 10] {
    let l = lba.to_be_bytes();
    let n = blocks.to_be_bytes();
    [op::READ_10, flags, l[0], l[1], l[2], l[3], 0, n[0], n[1], 0]
}

fn rw16(opcode: u8, lba: u64, blocks: u32, flags: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = opcode;
    c[1] = flags;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn inquiry(evpd: bool, page: u8, alloc: u16) -> [u8; 6] {
    let a = alloc.to_be_bytes();
    [op::INQUIRY, u8::from(evpd), page, a[0], a[1], 0]
}

// ---- INQUIRY ----

#[test]
fn standard_inquiry_golden_header() {
    let lu = ram_lu();
    let d = good(exec(&lu, &nexus(1), &inquiry(false, 0, 260)));
    assert_eq!(d.len(), 96);
    // Direct access, SPC-4, HISUP + format 2, additional length, CMDQUE.
    assert_eq!(d[..8], [0x00, 0x00, 0x06, 0x12, 91, 0x00, 0x00, 0x02]);
    assert_eq!(usize::from(d[4]), d.len() - 5);
    assert_eq!(&d[8..16], b"IRONWIRE");
    assert_eq!(&d[16..32], b"ironwire ram    ");
    assert!(d[32..36].iter().all(|b| (0x20..0x7f).contains(b)));
    // SAM-5, SPC-4, SBC-3, iSCSI version descriptors.
    assert_eq!(d[58..66], [0x00, 0xA0, 0x04, 0x60, 0x04, 0xC0, 0x09, 0x60]);
}

#[test]
fn inquiry_truncates_to_allocation_length() {
    let lu = ram_lu();
    assert_eq!(good(exec(&lu, &nexus(1), &inquiry(false, 0, 36))).len(), 36);
    assert_eq!(good(exec(&lu, &nexus(1), &inquiry(true, 0x83, 4))).len(), 4);
}

#[test]
fn inquiry_rejects_page_code_without_evpd_and_unknown_pages() {
    let lu = ram_lu();
    let s = check(exec(&lu, &nexus(1), &inquiry(false, 0x80, 255)));
    assert_eq!(asc(s), INVALID_CDB);
    assert_eq!(s.field.map(|f| (f.in_cdb, f.byte)), Some((true, 2)));
    assert_eq!(asc(check(exec(&lu, &nexus(1), &inquiry(true, 0x87, 255)))), INVALID_CDB);
    assert_eq!(asc(check(exec(&lu, &nexus(1), &[op::INQUIRY, 0x02, 0, 0, 255, 0]))), INVALID_CDB);
}

#[test]
fn vpd_supported_pages_lists_every_page() {
    let lu = ram_lu();
    let d = good(exec(&lu, &nexus(1), &inquiry(true, 0, 255)));
    assert_eq!(d, [0, 0, 0, 7, 0x00, 0x80, 0x83, 0x86, 0xB0, 0xB1, 0xB2]);
    for page in &d[4..] {
        let p = good(exec(&lu, &nexus(1), &inquiry(true, *page, 1024)));
        assert_eq!(p[1], *page);
        assert_eq!(usize::from(u16::from_be_bytes([p[2], p[3]])), p.len() - 4, "page {page:#04x} length");
    }
}

/// Extended INQUIRY claims SIMPLE only: HEAD OF QUEUE and ORDERED are
/// not enforced (an ORDERED read ran ahead of an older write while
/// ORDSUP said it would wait for it).
#[test]
fn extended_inquiry_claims_only_the_simple_task_attribute() {
    let lu = ram_lu();
    let p = good(exec(&lu, &nexus(1), &inquiry(true, 0x86, 255)));
    assert_eq!(p[5] & 0x07, 0x01, "HEADSUP and ORDSUP clear, SIMPSUP set");
}

#[test]
fn vpd_unit_serial_number_matches_serial() {
    let lu = ram_lu();
    let d = good(exec(&lu, &nexus(1), &inquiry(true, 0x80, 255)));
    assert_eq!(d[..4], [0, 0x80, 0, lu.serial.len() as u8]);
    assert_eq!(&d[4..], lu.serial.as_bytes());
}

#[test]
fn vpd_device_identification_golden_designators() {
    let mut lu = ram_lu();
    lu.naa = [0x60, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
    lu.serial = "SN1".into();
    let n = Nexus { initiator: "iqn.i,i,0x1".into(), target_port: "iqn.t,t,0x0002".into(), relative_port: 3, tpgt: 2 };
    let d = good(exec(&lu, &n, &inquiry(true, 0x83, 1024)));
    let mut want = vec![0x00, 0x83, 0x00, 0x00];
    // NAA, binary, logical unit.
    want.extend_from_slice(&[0x01, 0x03, 0x00, 0x10]);
    want.extend_from_slice(&lu.naa);
    // T10 vendor ID, ASCII, logical unit.
    want.extend_from_slice(&[0x02, 0x01, 0x00, 11]);
    want.extend_from_slice(b"IRONWIRESN1");
    // Relative target port 3 and target port group 2, iSCSI, PIV.
    want.extend_from_slice(&[0x51, 0x94, 0x00, 0x04, 0, 0, 0, 3]);
    want.extend_from_slice(&[0x51, 0x95, 0x00, 0x04, 0, 0, 0, 2]);
    // SCSI name strings: target port, then target device.
    want.extend_from_slice(&[0x53, 0x98, 0x00, 16]);
    want.extend_from_slice(b"iqn.t,t,0x0002\0\0");
    want.extend_from_slice(&[0x53, 0xA8, 0x00, 8]);
    want.extend_from_slice(b"iqn.t\0\0\0");
    let len = (want.len() - 4) as u16;
    want[2..4].copy_from_slice(&len.to_be_bytes());
    assert_eq!(d, want);
}

#[test]
fn naa_designator_is_stable_and_distinct_per_lun() {
    let dev = Arc::new(Described::new("d", BS, 2048));
    let a = LogicalUnit::new(TARGET, 0, dev.clone());
    let b = LogicalUnit::new(TARGET, 0, dev.clone());
    let c = LogicalUnit::new(TARGET, 1, dev.clone());
    let d = LogicalUnit::new("iqn.other", 0, dev);
    assert_eq!(a.naa, b.naa);
    assert_eq!(a.serial, b.serial);
    assert_ne!(a.naa, c.naa);
    assert_ne!(a.naa, d.naa);
    assert_eq!(a.naa[0] >> 4, 6, "NAA 6h");
}

#[test]
fn shared_storage_has_the_same_identification_on_every_gateway() {
    // Two gateways export one rbd image under other target names, LUNs and
    // device names: VPD 0x80 and 0x83 must match so multipath groups them.
    let image = |name: &str| {
        let mut d = Described::new(name, BS, 2048);
        d.shared_identity = Some("ceph:fsid-1:image-1".into());
        Arc::new(d)
    };
    let a = LogicalUnit::new(TARGET, 0, image("vol0"));
    let b = LogicalUnit::new("iqn.other", 3, image("gw-b-vol"));
    assert_eq!(a.naa, b.naa);
    assert_eq!(a.serial, b.serial);
    let vpd = |lu: &LogicalUnit, page| good(exec(lu, &nexus(1), &inquiry(true, page, 1024)));
    assert_eq!(vpd(&a, 0x83), vpd(&b, 0x83));
    assert_eq!(vpd(&a, 0x80), vpd(&b, 0x80));
    let mut other = Described::new("vol0", BS, 2048);
    other.shared_identity = Some("ceph:fsid-1:image-2".into());
    let c = LogicalUnit::new(TARGET, 0, Arc::new(other));
    assert_ne!(a.naa, c.naa);
    assert_ne!(a.serial, c.serial);
    // Local storage keeps its per-target, per-LUN identification.
    let local = LogicalUnit::new(TARGET, 0, Arc::new(Described::new("vol0", BS, 2048)));
    assert_ne!(a.naa, local.naa);
}

#[test]
fn vpd_block_limits_report_limits() {
    let lu = ram_lu();
    let d = good(exec(&lu, &nexus(1), &inquiry(true, 0xB0, 255)));
    assert_eq!(d.len(), 64);
    assert_eq!(d[4] & 1, 1, "WSNZ");
    assert_eq!(d[5], lu.limits.max_compare_and_write_blocks);
    assert_eq!(u16::from_be_bytes([d[6], d[7]]), 1, "granularity of one logical block");
    assert_eq!(u32::from_be_bytes(d[8..12].try_into().unwrap()), lu.limits.max_transfer_blocks);
    assert_eq!(u32::from_be_bytes(d[20..24].try_into().unwrap()), lu.limits.max_unmap_lba_count);
    assert_eq!(u32::from_be_bytes(d[24..28].try_into().unwrap()), lu.limits.max_unmap_descriptors);
    assert_eq!(u64::from_be_bytes(d[36..44].try_into().unwrap()), lu.limits.max_write_same_blocks);
}

#[test]
fn vpd_characteristics_and_provisioning_pages() {
    let lu = ram_lu();
    let b1 = good(exec(&lu, &nexus(1), &inquiry(true, 0xB1, 255)));
    assert_eq!(b1[4..6], [0, 1], "non-rotating medium");
    let b2 = good(exec(&lu, &nexus(1), &inquiry(true, 0xB2, 255)));
    // LBPU, LBPWS, LBPWS10 and LBPRZ (ram reads zeros after deallocation).
    assert_eq!(b2, [0, 0xB2, 0, 4, 0, 0xE4, 0x02, 0]);
}

// ---- READ CAPACITY, GET LBA STATUS ----

#[test]
fn read_capacity_10_reports_last_lba_and_block_size() {
    let lu = ram_lu();
    let d = good(exec(&lu, &nexus(1), &[op::READ_CAPACITY_10, 0, 0, 0, 0, 0, 0, 0, 0, 0]));
    assert_eq!(d, [0, 0, 0x07, 0xFF, 0, 0, 0x02, 0]);
    let s = check(exec(&lu, &nexus(1), &[op::READ_CAPACITY_10, 0, 0, 0, 0, 1, 0, 0, 0, 0]));
    assert_eq!(asc(s), INVALID_CDB, "LBA without PMI");
}

#[test]
fn read_capacity_10_saturates_for_large_devices() {
    let lu = null_lu((1u64 << 33) * u64::from(BS));
    let d = good(exec(&lu, &nexus(1), &[op::READ_CAPACITY_10, 0, 0, 0, 0, 0, 0, 0, 0, 0]));
    assert_eq!(d[..4], [0xFF; 4]);
    let d = good(exec(&lu, &nexus(1), &rw16(op::SERVICE_ACTION_IN_16, 0, 32, 0x10)));
    assert_eq!(u64::from_be_bytes(d[..8].try_into().unwrap()), (1 << 33) - 1);
}

#[test]
fn read_capacity_16_golden_layout() {
    let lu = ram_lu();
    let mut cdb = [0u8; 16];
    cdb[0] = op::SERVICE_ACTION_IN_16;
    cdb[1] = 0x10;
    cdb[13] = 32;
    let d = good(exec(&lu, &nexus(1), &cdb));
    let mut want = [0u8; 32];
    want[..8].copy_from_slice(&(BLOCKS - 1).to_be_bytes());
    want[8..12].copy_from_slice(&BS.to_be_bytes());
    want[13] = 0; // one logical block per physical block
    want[14] = 0xC0; // LBPME, LBPRZ
    assert_eq!(d, want);
    cdb[13] = 12;
    assert_eq!(good(exec(&lu, &nexus(1), &cdb)).len(), 12);
}

#[test]
fn get_lba_status_asks_the_device_from_the_starting_lba_to_the_end() {
    let lu = ram_lu();
    match block_op(exec(&lu, &nexus(1), &rw16(op::SERVICE_ACTION_IN_16, 100, 24, 0x12))) {
        BlockOp::GetLbaStatus { lba: 100, blocks, alloc_len: 24 } => assert_eq!(blocks, BLOCKS - 100),
        other => panic!("{other:?}"),
    }
    let s = check(exec(&lu, &nexus(1), &rw16(op::SERVICE_ACTION_IN_16, BLOCKS, 24, 0x12)));
    assert_eq!(asc(s), LBA_OOR);
}

#[test]
fn lba_status_data_describes_the_extent_mapped_or_deallocated() {
    let mapped = crate::lba_status_data(100, block::Extent { blocks: 7, deallocated: false }, 24);
    let mut want = vec![0, 0, 0, 20, 0, 0, 0, 0];
    want.extend_from_slice(&100u64.to_be_bytes());
    want.extend_from_slice(&7u32.to_be_bytes());
    want.extend_from_slice(&[0; 4]);
    assert_eq!(mapped, want);
    let hole = crate::lba_status_data(100, block::Extent { blocks: 1 << 33, deallocated: true }, 24);
    assert_eq!(hole[16..21], [0xFF, 0xFF, 0xFF, 0xFF, 1], "a longer run is reported in part, deallocated");
    assert_eq!(crate::lba_status_data(0, block::Extent { blocks: 1, deallocated: true }, 16).len(), 16);
}

// ---- READ / WRITE ----

#[test]
fn read10_becomes_a_read_request() {
    let lu = ram_lu();
    match block_op(exec(&lu, &nexus(1), &read10(10, 8, 0x18))) {
        BlockOp::Read { lba: 10, blocks: 8 } => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn read6_length_zero_means_256_blocks() {
    let lu = ram_lu();
    match block_op(exec(&lu, &nexus(1), &[op::READ_6, 0, 0, 5, 0, 0])) {
        BlockOp::Read { lba: 5, blocks: 256 } => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn zero_length_transfers_complete_without_io_but_check_the_lba() {
    let lu = ram_lu();
    assert!(good(exec(&lu, &nexus(1), &read10(0, 0, 0))).is_empty());
    assert!(good(exec(&lu, &nexus(1), &rw16(op::WRITE_16, BLOCKS, 0, 0))).is_empty());
    assert_eq!(asc(check(exec(&lu, &nexus(1), &read10(BLOCKS as u32 + 1, 0, 0)))), LBA_OOR);
}

#[test]
fn reads_and_writes_past_the_end_fail_with_lba_out_of_range() {
    let lu = ram_lu();
    assert_eq!(asc(check(exec(&lu, &nexus(1), &read10(BLOCKS as u32 - 1, 2, 0)))), LBA_OOR);
    assert_eq!(asc(check(exec(&lu, &nexus(1), &rw16(op::READ_16, u64::MAX, 1, 0)))), LBA_OOR);
    assert_eq!(asc(check(exec(&lu, &nexus(1), &rw16(op::WRITE_16, 1 << 63, 1, 0)))), LBA_OOR);
    let c12 = [op::READ_12, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 1, 0, 0];
    assert_eq!(asc(check(exec(&lu, &nexus(1), &c12))), LBA_OOR);
}

#[test]
fn protection_fields_and_oversized_transfers_are_invalid() {
    let lu = ram_lu();
    let s = check(exec(&lu, &nexus(1), &read10(0, 1, 0x20)));
    assert_eq!(asc(s), INVALID_CDB);
    assert_eq!(s.field.map(|f| (f.byte, f.bit)), Some((1, Some(7))));
    let mut small = ram_lu();
    small.limits = Limits { max_transfer_blocks: 8, ..small.limits };
    let s = check(exec(&small, &nexus(1), &rw16(op::READ_16, 0, 9, 0)));
    assert_eq!(asc(s), INVALID_CDB);
    assert_eq!(s.field.map(|f| f.byte), Some(10));
    assert!(matches!(exec(&small, &nexus(1), &rw16(op::READ_16, 0, 8, 0)), Outcome::Io(_)));
}

#[test]
fn write10_asks_for_data_then_writes_with_fua() {
    let lu = ram_lu();
    let cdb = [op::WRITE_10, 0x08, 0, 0, 0, 4, 0, 0, 2, 0];
    match block_op(exec_out(&lu, &nexus(1), &cdb, vec![7; 1024])) {
        BlockOp::Write { lba: 4, data, fua: true } => assert_eq!(data.len(), 1024),
        other => panic!("{other:?}"),
    }
}

#[test]
fn write_without_fua_on_ram_is_not_forced_durable_only_when_cache_enabled() {
    let lu = ram_lu();
    // Ram has no volatile cache: WCE defaults off, so writes are write-through.
    assert!(!lu.write_cache_enabled());
    let cdb = rw16(op::WRITE_16, 0, 1, 0);
    assert!(matches!(block_op(exec_out(&lu, &nexus(1), &cdb, vec![1; 512])), BlockOp::Write { fua: true, .. }));
    set_wce(&lu, &nexus(1), true);
    assert!(matches!(block_op(exec_out(&lu, &nexus(1), &cdb, vec![1; 512])), BlockOp::Write { fua: false, .. }));
}

#[test]
fn write_with_less_data_than_the_cdb_writes_the_whole_blocks_sent() {
    let lu = ram_lu();
    let cdb = rw16(op::WRITE_16, 0, 2, 0);
    assert_eq!(lu.data_out_len(&cdb), 1024);
    match block_op(lu.execute(&nexus(1), &cdb, Some(vec![7u8; 512]))) {
        BlockOp::Write { lba: 0, data, .. } => assert_eq!(data, vec![7u8; 512]),
        other => panic!("expected a one-block write, got {other:?}"),
    }
    // Less than one block, or nothing: no block is written, GOOD status
    // (the transport reports the overflow).
    good(lu.execute(&nexus(1), &cdb, Some(vec![7u8; 200])));
    good(lu.execute(&nexus(1), &cdb, Some(Vec::new())));
}

#[test]
fn write_whose_data_ends_inside_a_block_writes_nothing() {
    let lu = ram_lu();
    let cdb = rw16(op::WRITE_16, 0, 2, 0);
    for short in [513usize, 700, 1023] {
        match lu.execute(&nexus(1), &cdb, Some(vec![7u8; short])) {
            Outcome::Check(s) => assert_eq!(s, Sense::INVALID_FIELD_IN_COMMAND_IU, "{short} bytes"),
            other => panic!("{short} bytes: expected CHECK CONDITION, got {other:?}"),
        }
    }
    // More data than the CDB asks for ends past its blocks: the CDB's
    // blocks are written whole.
    assert!(matches!(block_op(lu.execute(&nexus(1), &cdb, Some(vec![7u8; 1500]))), BlockOp::Write { .. }));
}

#[test]
fn write_with_more_data_than_the_cdb_writes_only_the_cdb_blocks() {
    let lu = ram_lu();
    let cdb = read10(0, 1, 0).map(|b| if b == op::READ_10 { op::WRITE_10 } else { b });
    assert_eq!(lu.data_out_len(&cdb), 512);
    match block_op(lu.execute(&nexus(1), &cdb, Some(vec![9u8; 10000]))) {
        BlockOp::Write { lba: 0, data, .. } => assert_eq!(data.len(), 512),
        other => panic!("expected a one-block write, got {other:?}"),
    }
}

#[test]
fn data_out_len_follows_each_cdb_with_data_out() {
    let lu = ram_lu();
    assert_eq!(lu.data_out_len(&rw16(op::READ_16, 0, 8, 0)), 0);
    assert_eq!(lu.data_out_len(&rw16(op::WRITE_AND_VERIFY_16, 0, 3, 0)), 3 * 512);
    assert_eq!(lu.data_out_len(&rw16(op::VERIFY_16, 0, 3, 0)), 0, "BYTCHK 0");
    assert_eq!(lu.data_out_len(&rw16(op::VERIFY_16, 0, 3, 0x02)), 3 * 512, "BYTCHK 1");
    assert_eq!(lu.data_out_len(&rw16(op::WRITE_SAME_16, 0, 100, 0)), 512);
    assert_eq!(lu.data_out_len(&rw16(op::WRITE_SAME_16, 0, 100, 0x01)), 0, "NDOB");
    let mut caw = [0u8; 16];
    caw[0] = op::COMPARE_AND_WRITE;
    caw[13] = 4;
    assert_eq!(lu.data_out_len(&caw), 8 * 512);
    assert_eq!(lu.data_out_len(&[op::UNMAP, 0, 0, 0, 0, 0, 0, 0, 24, 0]), 24);
    assert_eq!(lu.data_out_len(&[op::MODE_SELECT_6, 0x10, 0, 0, 28, 0]), 28);
    assert_eq!(lu.data_out_len(&[op::PERSISTENT_RESERVE_OUT, 0, 0, 0, 0, 0, 0, 0, 24, 0]), 24);
}

#[test]
fn compare_and_write_of_zero_blocks_with_data_out_is_an_invalid_cdb() {
    let lu = ram_lu();
    let mut caw = [0u8; 16];
    caw[0] = op::COMPARE_AND_WRITE;
    // libiscsi's 256-block request: NUMBER OF LOGICAL BLOCKS wraps to 0.
    assert_eq!(asc(check(lu.execute(&nexus(1), &caw, Some(vec![0u8; 256 * 1024])))), INVALID_CDB);
    good(lu.execute(&nexus(1), &caw, Some(Vec::new())));
}

#[test]
fn default_limits_stay_within_what_initiators_consider_sane() {
    for bs in [512, 4096] {
        let l = Limits::for_block_size(bs);
        assert!(l.max_unmap_lba_count <= 1 << 20, "{bs}: {}", l.max_unmap_lba_count);
        assert!(l.max_write_same_blocks < 65536, "{bs}: {}", l.max_write_same_blocks);
        assert_eq!(l.physical_block_exponent, 0);
        assert!(l.max_transfer_blocks >= 2048, "{bs}: libiscsi writes 2048 blocks at once");
        assert!(u64::from(l.max_transfer_blocks) * u64::from(bs) <= 8 << 20);
    }
}

#[test]
fn write_and_verify_writes_durably() {
    let lu = ram_lu();
    let cdb = [op::WRITE_AND_VERIFY_10, 0x02, 0, 0, 0, 1, 0, 0, 1, 0];
    assert!(matches!(block_op(exec_out(&lu, &nexus(1), &cdb, vec![1; 512])), BlockOp::Write { lba: 1, fua: true, .. }));
}

#[test]
fn verify_without_bytchk_needs_no_data() {
    let lu = ram_lu();
    let cdb = [op::VERIFY_10, 0, 0, 0, 0, 9, 0, 0, 3, 0];
    assert!(matches!(block_op(exec(&lu, &nexus(1), &cdb)), BlockOp::Verify { lba: 9, blocks: 3, data: None }));
}

#[test]
fn verify_with_bytchk_compares_data_out() {
    let lu = ram_lu();
    let cdb = rw16(op::VERIFY_16, 2, 2, 0x02);
    match block_op(exec_out(&lu, &nexus(1), &cdb, vec![5; 1024])) {
        BlockOp::Verify { lba: 2, blocks: 2, data: Some(d) } => assert_eq!(d.len(), 1024),
        other => panic!("{other:?}"),
    }
    assert_eq!(asc(check(exec(&lu, &nexus(1), &rw16(op::VERIFY_16, 2, 2, 0x06)))), INVALID_CDB);
    assert_eq!(asc(check(exec(&lu, &nexus(1), &rw16(op::VERIFY_16, BLOCKS, 1, 0x02)))), LBA_OOR);
}

#[test]
fn synchronize_cache_checks_range_and_needs_no_flush_on_ram() {
    let lu = ram_lu();
    let cdb = [op::SYNCHRONIZE_CACHE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    assert!(good(exec(&lu, &nexus(1), &cdb)).is_empty());
    let past = rw16(op::SYNCHRONIZE_CACHE_16, BLOCKS + 1, 0, 0);
    assert_eq!(asc(check(exec(&lu, &nexus(1), &past))), LBA_OOR);
}

#[test]
fn synchronize_cache_flushes_devices_with_volatile_cache() {
    let dev = Described { backend: "file", volatile_write_cache: true, ..Described::new("f", BS, 2048) };
    let lu = LogicalUnit::new(TARGET, 0, Arc::new(dev));
    assert!(lu.write_cache_enabled(), "WCE defaults on with a volatile cache");
    let cdb = [op::SYNCHRONIZE_CACHE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    assert!(matches!(block_op(exec(&lu, &nexus(1), &cdb)), BlockOp::Flush));
}

/// Turning the write cache off (MODE SELECT, WCE 1 -> 0) makes the
/// device durable first: from then on the host sends no SYNCHRONIZE
/// CACHE, so writes it had acknowledged while the cache was on would
/// otherwise stay in it. Turning it on, or a select that changes nothing,
/// needs no flush.
#[test]
fn mode_select_turning_the_write_cache_off_flushes_the_device() {
    let dev = Described { backend: "file", volatile_write_cache: true, ..Described::new("f", BS, 2048) };
    let lu = LogicalUnit::new(TARGET, 0, Arc::new(dev));
    let n = nexus(1);
    good(exec(&lu, &n, &[0; 6]));
    let select = |wce: bool| {
        let mut list = vec![0u8, 0, 0, 0];
        list.extend(caching_page(wce));
        exec_out(&lu, &n, &[op::MODE_SELECT_6, 0x10, 0, 0, list.len() as u8, 0], list)
    };
    assert!(matches!(block_op(select(false)), BlockOp::Flush), "WCE 1 -> 0 flushes");
    assert!(!lu.write_cache_enabled());
    assert!(good(select(false)).is_empty(), "no change, no flush");
    assert!(good(select(true)).is_empty(), "WCE 0 -> 1 needs no flush");
    assert!(lu.write_cache_enabled());
}

// ---- WRITE SAME, UNMAP, COMPARE AND WRITE ----

#[test]
fn write_same_of_zero_block_with_unmap_becomes_write_zeroes_with_deallocation() {
    let lu = ram_lu();
    let cdb = rw16(op::WRITE_SAME_16, 8, 100, 0x08);
    match block_op(exec_out(&lu, &nexus(1), &cdb, vec![0; 512])) {
        BlockOp::WriteZeroes { lba: 8, blocks: 100, unmap: true, .. } => {}
        other => panic!("{other:?}"),
    }
    let cdb10 = [op::WRITE_SAME_10, 0, 0, 0, 0, 8, 0, 0, 100, 0];
    assert!(matches!(
        block_op(exec_out(&lu, &nexus(1), &cdb10, vec![0; 512])),
        BlockOp::WriteZeroes { unmap: false, .. }
    ));
}

/// WRITE SAME of zeros and UNMAP are fallocates, which no RWF_DSYNC
/// covers: with the write cache off they carry `fua`, and the executor
/// flushes the device before answering.
#[test]
fn zeroing_and_unmap_are_durable_with_the_write_cache_off() {
    let dev = Described { backend: "file", volatile_write_cache: true, ..Described::new("f", BS, 2048) };
    let lu = LogicalUnit::new(TARGET, 0, Arc::new(dev));
    let n = nexus(1);
    good(exec(&lu, &n, &[0; 6]));
    let zeroes = |lu: &LogicalUnit| match block_op(exec_out(
        lu,
        &n,
        &rw16(op::WRITE_SAME_16, 8, 100, 0),
        vec![0; BS as usize],
    )) {
        BlockOp::WriteZeroes { fua, .. } => fua,
        other => panic!("{other:?}"),
    };
    let unmap = |lu: &LogicalUnit| {
        let p = unmap_list(&[(0, 8)]);
        match block_op(exec_out(lu, &n, &unmap_cdb(p.len()), p)) {
            BlockOp::Unmap { fua, .. } => fua,
            other => panic!("{other:?}"),
        }
    };
    assert!(!zeroes(&lu) && !unmap(&lu), "the write cache is on");
    set_wce(&lu, &n, false);
    assert!(zeroes(&lu) && unmap(&lu), "the write cache is off");
}

#[test]
fn write_same_of_pattern_becomes_write_same() {
    let lu = ram_lu();
    let cdb = rw16(op::WRITE_SAME_16, 0, 16, 0x08);
    match block_op(exec_out(&lu, &nexus(1), &cdb, vec![0xA5; 512])) {
        BlockOp::WriteSame { lba: 0, blocks: 16, block, .. } => assert_eq!(block, vec![0xA5; 512]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn write_same_ndob_needs_no_data() {
    let lu = ram_lu();
    let cdb = rw16(op::WRITE_SAME_16, 0, 16, 0x09);
    assert!(matches!(block_op(exec(&lu, &nexus(1), &cdb)), BlockOp::WriteZeroes { unmap: true, .. }));
}

#[test]
fn write_same_rejects_zero_blocks_anchor_and_range() {
    let lu = ram_lu();
    assert_eq!(asc(check(exec(&lu, &nexus(1), &rw16(op::WRITE_SAME_16, 0, 0, 0)))), INVALID_CDB);
    assert_eq!(asc(check(exec(&lu, &nexus(1), &rw16(op::WRITE_SAME_16, 0, 1, 0x10)))), INVALID_CDB);
    assert_eq!(asc(check(exec(&lu, &nexus(1), &rw16(op::WRITE_SAME_16, BLOCKS + 1, 1, 0)))), LBA_OOR);
    assert_eq!(asc(check(exec(&lu, &nexus(1), &rw16(op::WRITE_SAME_16, 1 << 63, 1, 0)))), LBA_OOR);
    let mut small = ram_lu();
    small.limits = Limits { max_write_same_blocks: 4, ..small.limits };
    assert_eq!(asc(check(exec(&small, &nexus(1), &rw16(op::WRITE_SAME_16, 0, 5, 0)))), INVALID_CDB);
}

#[test]
fn write_same_of_either_size_refuses_lbdata_and_pbdata() {
    // SBC-3 5.41-5.42: LBDATA writes each block's LBA into its first four
    // bytes, PBDATA its physical sector address into the first eight;
    // neither is supported, so neither may be taken for a plain WRITE SAME
    // that writes other data than the initiator asked for.
    let lu = ram_lu();
    for (flags, bit) in [(0x02u8, 1u8), (0x04, 2), (0x06, 2)] {
        let ten = [op::WRITE_SAME_10, flags, 0, 0, 0, 0, 0, 0, 1, 0];
        let sixteen = rw16(op::WRITE_SAME_16, 0, 1, flags);
        for cdb in [&ten[..], &sixteen[..]] {
            let s = check(exec(&lu, &nexus(1), cdb));
            assert_eq!(asc(s), INVALID_CDB, "{:#04x} flags {flags:#04x}", cdb[0]);
            assert_eq!(s.field.map(|f| (f.in_cdb, f.byte, f.bit)), Some((true, 1, Some(bit))));
        }
    }
}

fn unmap_list(ranges: &[(u64, u32)]) -> Vec<u8> {
    let bd = ranges.len() * 16;
    let mut p = Vec::new();
    p.extend_from_slice(&((bd + 6) as u16).to_be_bytes());
    p.extend_from_slice(&(bd as u16).to_be_bytes());
    p.extend_from_slice(&[0; 4]);
    for (lba, n) in ranges {
        p.extend_from_slice(&lba.to_be_bytes());
        p.extend_from_slice(&n.to_be_bytes());
        p.extend_from_slice(&[0; 4]);
    }
    p
}

fn unmap_cdb(len: usize) -> [u8; 10] {
    let l = (len as u16).to_be_bytes();
    [op::UNMAP, 0, 0, 0, 0, 0, 0, l[0], l[1], 0]
}

#[test]
fn unmap_parses_descriptors_and_skips_empty_ones() {
    let lu = ram_lu();
    let p = unmap_list(&[(0, 8), (100, 0), (2000, 48)]);
    match block_op(exec_out(&lu, &nexus(1), &unmap_cdb(p.len()), p)) {
        BlockOp::Unmap { ranges, .. } => assert_eq!(ranges, [(0, 8), (2000, 48)]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn unmap_with_no_descriptors_or_zero_length_is_good() {
    let lu = ram_lu();
    assert!(good(exec(&lu, &nexus(1), &unmap_cdb(0))).is_empty());
    let p = unmap_list(&[]);
    assert!(good(exec_out(&lu, &nexus(1), &unmap_cdb(p.len()), p)).is_empty());
}

#[test]
fn unmap_rejects_bad_lists() {
    let lu = ram_lu();
    let s = check(exec(&lu, &nexus(1), &unmap_cdb(7)));
    assert_eq!(asc(s), (5, 0x1A, 0), "parameter list length error");
    let p = unmap_list(&[(2040, 9)]);
    assert_eq!(asc(check(exec_out(&lu, &nexus(1), &unmap_cdb(p.len()), p))), LBA_OOR);
    let mut small = ram_lu();
    small.limits = Limits { max_unmap_lba_count: 10, max_unmap_descriptors: 2, ..small.limits };
    let p = unmap_list(&[(0, 6), (10, 6)]);
    assert_eq!(asc(check(exec_out(&small, &nexus(1), &unmap_cdb(p.len()), p))), INVALID_PARAM);
    let p = unmap_list(&[(0, 1), (10, 1), (20, 1)]);
    assert_eq!(asc(check(exec_out(&small, &nexus(1), &unmap_cdb(p.len()), p))), INVALID_PARAM);
    let anchor = [op::UNMAP, 1, 0, 0, 0, 0, 0, 0, 24, 0];
    assert_eq!(asc(check(exec(&lu, &nexus(1), &anchor))), INVALID_CDB);
}

#[test]
fn unmap_whose_data_ends_inside_its_descriptors_does_nothing() {
    let lu = ram_lu();
    let p = unmap_list(&[(0, 8), (16, 8)]);
    let cdb = unmap_cdb(p.len());
    for cut in [0, 4, 7, 30, 39] {
        let s = check(lu.execute(&nexus(1), &cdb, Some(p[..cut].to_vec())));
        assert_eq!(asc(s), (5, 0x0E, 0x03), "{cut} of {} bytes: INVALID FIELD IN COMMAND IU", p.len());
    }
    // Cut after the descriptors the header announces: those are all there.
    let mut longer = p.clone();
    longer.extend_from_slice(&[0; 16]);
    match block_op(lu.execute(&nexus(1), &unmap_cdb(longer.len()), Some(p))) {
        BlockOp::Unmap { ranges, .. } => assert_eq!(ranges, [(0, 8), (16, 8)]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn unmap_ignores_truncated_trailing_descriptor() {
    let lu = ram_lu();
    let mut p = unmap_list(&[(0, 8), (16, 8)]);
    p.truncate(p.len() - 4);
    match block_op(exec_out(&lu, &nexus(1), &unmap_cdb(p.len()), p)) {
        BlockOp::Unmap { ranges, .. } => assert_eq!(ranges, [(0, 8)]),
        other => panic!("{other:?}"),
    }
}

fn caw(lba: u64, blocks: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::COMPARE_AND_WRITE;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[13] = blocks;
    c
}

#[test]
fn compare_and_write_needs_twice_the_blocks() {
    let lu = ram_lu();
    match block_op(exec_out(&lu, &nexus(1), &caw(7, 1), vec![1; 1024])) {
        BlockOp::CompareAndWrite { lba: 7, blocks: 1, data, .. } => assert_eq!(data.len(), 1024),
        other => panic!("{other:?}"),
    }
    assert!(good(exec(&lu, &nexus(1), &caw(7, 0))).is_empty());
    assert_eq!(asc(check(exec(&lu, &nexus(1), &caw(BLOCKS, 1)))), LBA_OOR);
    let mut small = ram_lu();
    small.limits = Limits { max_compare_and_write_blocks: 1, ..small.limits };
    assert_eq!(asc(check(exec(&small, &nexus(1), &caw(0, 2)))), INVALID_CDB);
}

#[test]
fn miscompare_sense_carries_offset_in_information_field() {
    let s = crate::miscompare(&[1, 2, 3, 4], &[1, 2, 9, 4]).unwrap();
    assert_eq!(asc(s), (0x0E, 0x1D, 0));
    let b = s.to_fixed_bytes();
    assert_eq!(b[0], 0xF0);
    assert_eq!(b[3..7], [0, 0, 0, 2]);
}

// ---- MODE SENSE / MODE SELECT ----

fn mode_sense6(page: u8, pc: u8, dbd: bool, alloc: u8) -> [u8; 6] {
    [op::MODE_SENSE_6, if dbd { 0x08 } else { 0 }, (pc << 6) | page, 0, alloc, 0]
}

#[test]
fn mode_sense6_all_pages_has_header_descriptor_and_pages() {
    let lu = ram_lu();
    let d = good(exec(&lu, &nexus(1), &mode_sense6(0x3F, 0, false, 255)));
    assert_eq!(usize::from(d[0]), d.len() - 1);
    assert_eq!(d[1..4], [0, 0x10, 8], "medium type, DPOFUA, block descriptor length");
    // Short block descriptor: blocks and block length.
    assert_eq!(d[4..12], [0, 0, 0x08, 0x00, 0, 0, 0x02, 0x00]);
    // Caching (20 bytes), control (12), informational exceptions (12).
    assert_eq!(d[12..14], [0x08, 0x12]);
    assert_eq!(d[32..34], [0x0A, 0x0A]);
    assert_eq!(d[44..46], [0x1C, 0x0A]);
    assert_eq!(d.len(), 56);
}

#[test]
fn mode_sense_caching_page_reflects_wce_and_changeable_mask() {
    let lu = ram_lu();
    let d = good(exec(&lu, &nexus(1), &mode_sense6(0x08, 0, true, 255)));
    assert_eq!(d[3], 0, "DBD: no block descriptor");
    assert_eq!(d[4..7], [0x08, 0x12, 0x00]);
    let d = good(exec(&lu, &nexus(1), &mode_sense6(0x08, 1, true, 255)));
    assert_eq!(d[6], 0x04, "WCE is changeable");
    set_wce(&lu, &nexus(1), true);
    let d = good(exec(&lu, &nexus(1), &mode_sense6(0x08, 0, true, 255)));
    assert_eq!(d[6], 0x04);
    let d = good(exec(&lu, &nexus(1), &mode_sense6(0x08, 2, true, 255)));
    assert_eq!(d[6], 0x00, "default follows the device's cache");
}

#[test]
fn mode_sense_rejects_saved_values_and_unknown_pages() {
    let lu = ram_lu();
    assert_eq!(asc(check(exec(&lu, &nexus(1), &mode_sense6(0x08, 3, false, 255)))), (5, 0x39, 0));
    assert_eq!(asc(check(exec(&lu, &nexus(1), &mode_sense6(0x19, 0, false, 255)))), INVALID_CDB);
    let sub = [op::MODE_SENSE_6, 0, 0x08, 0x01, 255, 0];
    assert_eq!(asc(check(exec(&lu, &nexus(1), &sub))), INVALID_CDB);
    let all_sub = [op::MODE_SENSE_6, 0, 0x3F, 0xFF, 255, 0];
    assert!(!good(exec(&lu, &nexus(1), &all_sub)).is_empty());
}

#[test]
fn mode_sense10_long_lba_descriptor() {
    let lu = ram_lu();
    let cdb = [op::MODE_SENSE_10, 0x10, 0x0A, 0, 0, 0, 0, 0x01, 0x00, 0];
    let d = good(exec(&lu, &nexus(1), &cdb));
    assert_eq!(usize::from(u16::from_be_bytes([d[0], d[1]])), d.len() - 2);
    assert_eq!(d[2..8], [0, 0x10, 0x01, 0, 0, 16]);
    assert_eq!(d[8..16], BLOCKS.to_be_bytes());
    assert_eq!(d[20..24], BS.to_be_bytes());
    assert_eq!(d[24..26], [0x0A, 0x0A]);
    // QAM 1, TAS 1 (tasks aborted by another nexus end in TASK ABORTED).
    assert_eq!((d[27], d[29]), (0x10, 0x40));
    assert_eq!(d.len(), 36);
}

fn caching_page(wce: bool) -> Vec<u8> {
    let mut p = vec![0u8; 20];
    p[0] = 0x08;
    p[1] = 0x12;
    if wce {
        p[2] = 0x04;
    }
    p
}

fn set_wce(lu: &LogicalUnit, n: &Nexus, wce: bool) {
    let mut list = vec![0u8, 0, 0, 0];
    list.extend(caching_page(wce));
    let cdb = [op::MODE_SELECT_6, 0x10, 0, 0, list.len() as u8, 0];
    match exec_out(lu, n, &cdb, list) {
        // Turning a volatile cache off flushes it first.
        Outcome::Io(BlockOp::Flush) if !wce => {}
        other => assert!(good(other).is_empty()),
    }
    assert_eq!(lu.write_cache_enabled(), wce);
}

#[test]
fn mode_select_changes_wce_and_tells_other_nexuses() {
    let lu = ram_lu();
    let (a, b) = (nexus(1), nexus(2));
    good(exec(&lu, &b, &[0; 6]));
    set_wce(&lu, &a, true);
    assert_eq!(check(exec(&lu, &b, &[0; 6])), Sense::UA_MODE_PARAMETERS_CHANGED);
    assert!(good(exec(&lu, &b, &[0; 6])).is_empty(), "reported once");
    assert!(good(exec(&lu, &a, &[0; 6])).is_empty(), "not to the issuer");
}

#[test]
fn mode_select_rejects_unchangeable_fields_and_sp() {
    let lu = ram_lu();
    let mut list = vec![0u8, 0, 0, 0];
    let mut page = caching_page(true);
    page[2] |= 0x01; // RCD is not changeable
    list.extend(page);
    let cdb = [op::MODE_SELECT_6, 0x10, 0, 0, list.len() as u8, 0];
    let s = check(exec_out(&lu, &nexus(1), &cdb, list));
    assert_eq!(asc(s), INVALID_PARAM);
    assert_eq!(s.field.map(|f| (f.in_cdb, f.byte)), Some((false, 6)));
    assert!(!lu.write_cache_enabled(), "nothing applied");
    let sp = [op::MODE_SELECT_6, 0x11, 0, 0, 24, 0];
    assert_eq!(asc(check(exec(&lu, &nexus(1), &sp))), INVALID_CDB);
    // Control page with a changed QAM.
    let mut list = vec![0u8, 0, 0, 0, 0x0A, 0x0A, 0, 0x00, 0, 0x40, 0, 0, 0xFF, 0xFF, 0, 0];
    let cdb = [op::MODE_SELECT_6, 0x10, 0, 0, list.len() as u8, 0];
    assert_eq!(asc(check(exec_out(&lu, &nexus(1), &cdb, list.clone()))), INVALID_PARAM);
    list[7] = 0x10;
    // TAS is not changeable either.
    list[9] = 0;
    assert_eq!(asc(check(exec_out(&lu, &nexus(1), &cdb, list.clone()))), INVALID_PARAM);
    list[9] = 0x40;
    assert!(good(exec_out(&lu, &nexus(1), &cdb, list)).is_empty(), "unchanged control page is accepted");
}

#[test]
fn a_parameter_list_cut_by_the_transport_is_not_a_parameter_list_length_error() {
    let lu = ram_lu();
    let mut list = vec![0u8, 0, 0, 0];
    list.extend(caching_page(true));
    let cdb = [op::MODE_SELECT_6, 0x10, 0, 0, list.len() as u8, 0];
    // The expected length cut the list (inside the header, inside the
    // page): INVALID FIELD IN COMMAND IU, nothing applied.
    for cut in [2, 6] {
        let s = check(lu.execute(&nexus(1), &cdb, Some(list[..cut].to_vec())));
        assert_eq!(asc(s), (5, 0x0E, 0x03), "MODE SELECT cut at {cut}");
    }
    assert!(!lu.write_cache_enabled(), "nothing applied");
    // The CDB's own length ends inside the page: PARAMETER LIST LENGTH
    // ERROR; cut further inside the page's own 2-byte header, the page's
    // length cannot be read: INVALID FIELD IN COMMAND IU.
    let short = [op::MODE_SELECT_6, 0x10, 0, 0, 6, 0];
    assert_eq!(asc(check(lu.execute(&nexus(1), &short, Some(list[..6].to_vec())))), (5, 0x1A, 0));
    assert_eq!(asc(check(lu.execute(&nexus(1), &short, Some(list[..5].to_vec())))), (5, 0x0E, 0x03));
    // PERSISTENT RESERVE OUT's 24 bytes cut by the expected length.
    let p = prout_parameters(0, 0xA);
    let s = check(lu.execute(&nexus(1), &prout(REGISTER, 0), Some(p[..16].to_vec())));
    assert_eq!(asc(s), (5, 0x0E, 0x03), "PR OUT cut");
    assert_eq!(pr_in(&lu, &nexus(1), 0)[..8], [0, 0, 0, 0, 0, 0, 0, 0], "nothing registered");
}

#[test]
fn mode_select10_accepts_matching_block_descriptor() {
    let lu = ram_lu();
    let mut list = vec![0u8, 0, 0, 0, 0, 0, 0, 8];
    list.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0x02, 0x00]);
    list.extend(caching_page(true));
    let l = (list.len() as u16).to_be_bytes();
    let cdb = [op::MODE_SELECT_10, 0x10, 0, 0, 0, 0, 0, l[0], l[1], 0];
    assert!(good(exec_out(&lu, &nexus(1), &cdb, list.clone())).is_empty());
    assert!(lu.write_cache_enabled());
    list[14] = 0x10; // 4096-byte blocks
    assert_eq!(asc(check(exec_out(&lu, &nexus(1), &cdb, list))), INVALID_PARAM);
}

// ---- REQUEST SENSE, unit attentions, task management ----

#[test]
fn request_sense_without_pending_condition_reports_no_sense() {
    let lu = ram_lu();
    let d = good(exec(&lu, &nexus(1), &[op::REQUEST_SENSE, 0, 0, 0, 252, 0]));
    assert_eq!(d, Sense::NO_SENSE.to_fixed_bytes());
    let d = good(exec(&lu, &nexus(1), &[op::REQUEST_SENSE, 1, 0, 0, 252, 0]));
    assert_eq!(d, [0x72, 0, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn lun_reset_sets_unit_attention_for_every_nexus_the_issuer_included_once() {
    let lu = ram_lu();
    let (a, b) = (nexus(1), nexus(2));
    lu.nexus_created(&a);
    lu.nexus_created(&b);
    lu.lun_reset(&a);
    // INQUIRY neither reports nor clears it.
    good(exec(&lu, &b, &inquiry(false, 0, 96)));
    assert_eq!(check(exec(&lu, &b, &read10(0, 1, 0))), Sense::UA_LUN_RESET);
    assert!(matches!(exec(&lu, &b, &read10(0, 1, 0)), Outcome::Io(_)));
    assert_eq!(check(exec(&lu, &a, &read10(0, 1, 0))), Sense::UA_LUN_RESET);
    assert!(matches!(exec(&lu, &a, &read10(0, 1, 0)), Outcome::Io(_)));
}

#[test]
fn request_sense_returns_and_clears_unit_attention() {
    let lu = ram_lu();
    let a = nexus(1);
    lu.unit_attention(&a, Sense::UA_POWER_ON_RESET);
    let d = good(exec(&lu, &a, &[op::REQUEST_SENSE, 0, 0, 0, 18, 0]));
    assert_eq!(d[2], 0x06);
    assert_eq!(d[12..14], [0x29, 0x00]);
    assert!(good(exec(&lu, &a, &[0; 6])).is_empty());
}

#[test]
fn report_luns_clears_reported_luns_changed() {
    let lu = ram_lu();
    let a = nexus(1);
    lu.nexus_created(&a);
    lu.report_luns_changed();
    lu.capacity_changed();
    let cdb = [op::REPORT_LUNS, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    let d = good(lu.report_luns(&a, &cdb, &[0, 1]));
    assert_eq!(d.len(), 24);
    // Only the capacity change is left.
    assert_eq!(check(exec(&lu, &a, &[0; 6])), Sense::UA_CAPACITY_CHANGED);
    assert!(good(exec(&lu, &a, &[0; 6])).is_empty());
}

/// Sessions answer REPORT LUNS through `report_luns` (and, for a LUN with
/// no unit, `lun::report_luns`), not `execute`: the CONTROL byte is
/// checked there too, so NACA, FLAG and LINK are refused as for every
/// other command, with the pending REPORTED LUNS DATA HAS CHANGED kept.
#[test]
fn report_luns_refuses_naca_flag_and_link_on_every_path() {
    let lu = ram_lu();
    let a = nexus(1);
    lu.nexus_created(&a);
    lu.report_luns_changed();
    for (control, bit) in [(0x04u8, 2u8), (0x02, 1), (0x01, 0)] {
        let cdb = [op::REPORT_LUNS, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, control];
        for (path, out) in [
            ("session", lu.report_luns::<Vec<u8>>(&a, &cdb, &[0, 1])),
            ("no unit", crate::execute_without_lu::<Vec<u8>>(&cdb, &[0, 1])),
            ("execute", exec(&lu, &a, &cdb)),
        ] {
            let s = check(out);
            assert_eq!(asc(s), INVALID_CDB, "{path}, control {control:#04x}");
            let f = s.field.unwrap();
            assert_eq!((f.in_cdb, f.byte, f.bit), (true, 11, Some(bit)), "{path}, control {control:#04x}");
        }
    }
    assert_eq!(check(exec(&lu, &a, &[0; 6])), Sense::UA_REPORTED_LUNS_CHANGED, "not cleared by a refused REPORT LUNS");
}

#[test]
fn execute_answers_report_luns_with_its_own_lun() {
    let lu = ram_lu();
    let cdb = [op::REPORT_LUNS, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    assert_eq!(good(exec(&lu, &nexus(1), &cdb)), [0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn clear_task_set_tells_affected_nexuses() {
    let lu = ram_lu();
    let (a, b) = (nexus(1), nexus(2));
    lu.clear_task_set(&a, &[a.clone(), b.clone()]);
    assert!(good(exec(&lu, &a, &[0; 6])).is_empty());
    assert_eq!(check(exec(&lu, &b, &[0; 6])), Sense::UA_COMMANDS_CLEARED);
}

// ---- CDB validation ----

#[test]
fn unknown_opcode_is_invalid_command_operation_code() {
    let lu = ram_lu();
    assert_eq!(check(exec(&lu, &nexus(1), &[0x04, 0, 0, 0, 0, 0])), Sense::INVALID_OPCODE);
    assert_eq!(check(exec(&lu, &nexus(1), &[0xC0; 16])), Sense::INVALID_OPCODE);
    assert_eq!(check(exec(&lu, &nexus(1), &[0x7F; 32])), Sense::INVALID_OPCODE, "variable length");
    assert_eq!(asc(check(exec(&lu, &nexus(1), &[]))), INVALID_CDB);
}

#[test]
fn short_cdb_and_naca_are_invalid_fields() {
    let lu = ram_lu();
    assert_eq!(asc(check(exec(&lu, &nexus(1), &[op::READ_16, 0, 0, 0]))), INVALID_CDB);
    let s = check(exec(&lu, &nexus(1), &[0, 0, 0, 0, 0, 0x04]));
    assert_eq!(asc(s), INVALID_CDB);
    assert_eq!(s.field.map(|f| f.byte), Some(5));
}

#[test]
fn start_stop_and_prevent_allow_are_accepted() {
    let lu = ram_lu();
    assert!(good(exec(&lu, &nexus(1), &[op::START_STOP_UNIT, 0, 0, 0, 1, 0])).is_empty());
    assert!(good(exec(&lu, &nexus(1), &[op::PREVENT_ALLOW_MEDIUM_REMOVAL, 0, 0, 0, 0, 0])).is_empty());
}

#[test]
fn report_supported_opcodes_lists_all_and_one() {
    let lu = ram_lu();
    let all = [op::MAINTENANCE_IN, 0x0C, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0];
    let d = good(exec(&lu, &nexus(1), &all));
    let len = u32::from_be_bytes(d[..4].try_into().unwrap()) as usize;
    assert_eq!(len, d.len() - 4);
    assert_eq!(len % 8, 0);
    let descs: Vec<&[u8]> = d[4..].chunks(8).collect();
    assert!(descs.iter().any(|e| e[0] == op::READ_10 && e[5] == 0 && e[7] == 10));
    assert!(descs.iter().any(|e| e[0] == op::PERSISTENT_RESERVE_OUT && e[5] == 1 && e[3] == 0x06));
    // One command without service action.
    let one = [op::MAINTENANCE_IN, 0x0C, 0x01, op::READ_10, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0];
    let d = good(exec(&lu, &nexus(1), &one));
    assert_eq!(d[..5], [0, 0x03, 0, 10, op::READ_10]);
    // Option 1 on an opcode with service actions is invalid; option 2 works.
    let bad = [op::MAINTENANCE_IN, 0x0C, 0x01, op::PERSISTENT_RESERVE_IN, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0];
    assert_eq!(asc(check(exec(&lu, &nexus(1), &bad))), INVALID_CDB);
    let sa = [op::MAINTENANCE_IN, 0x0C, 0x02, op::SERVICE_ACTION_IN_16, 0, 0x10, 0, 0, 0xFF, 0xFF, 0, 0];
    let d = good(exec(&lu, &nexus(1), &sa));
    assert_eq!(d[..5], [0, 0x03, 0, 16, op::SERVICE_ACTION_IN_16]);
    // Unsupported opcode: SUPPORT 001b.
    let none = [op::MAINTENANCE_IN, 0x0C, 0x01, 0x04, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0];
    assert_eq!(good(exec(&lu, &nexus(1), &none)), [0, 0x01, 0, 0]);
    // With RCTD every descriptor carries a timeouts descriptor.
    let rctd = [op::MAINTENANCE_IN, 0x0C, 0x80, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0];
    let d = good(exec(&lu, &nexus(1), &rctd));
    assert_eq!((d.len() - 4) % 20, 0);
    assert_eq!(d[4 + 5] & 0x02, 0x02, "CTDP");
}

/// Every command REPORT SUPPORTED OPERATION CODES lists: (opcode, service
/// action when SERVACTV is set, CDB LENGTH).
fn reported_commands(lu: &LogicalUnit) -> Vec<(u8, Option<u16>, usize)> {
    let all = [op::MAINTENANCE_IN, 0x0C, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0];
    let d = good(exec(lu, &nexus(1), &all));
    d[4..]
        .chunks(8)
        .map(|e| {
            let sa = (e[5] & 0x01 != 0).then(|| u16::from_be_bytes([e[2], e[3]]));
            (e[0], sa, usize::from(u16::from_be_bytes([e[6], e[7]])))
        })
        .collect()
}

/// The CDB USAGE DATA of one reported command (one_command format).
fn usage_data(lu: &LogicalUnit, opcode: u8, sa: Option<u16>) -> Vec<u8> {
    let [sa_hi, sa_lo] = sa.unwrap_or(0).to_be_bytes();
    let options = if sa.is_some() { 0x02 } else { 0x01 };
    let one = [op::MAINTENANCE_IN, 0x0C, options, opcode, sa_hi, sa_lo, 0, 0, 0xFF, 0xFF, 0, 0];
    let d = good(exec(lu, &nexus(1), &one));
    assert_eq!(d[1] & 0x07, 0x03, "{opcode:#04x}/{sa:?} supported in the standard's way");
    let len = usize::from(u16::from_be_bytes([d[2], d[3]]));
    assert_eq!(d.len(), 4 + len, "{opcode:#04x}/{sa:?} CDB SIZE");
    d[4..].to_vec()
}

/// A CDB for `opcode`/`sa` that the unit accepts as it stands (GOOD, a
/// request for data-out, or a block request), from which single bits are
/// then flipped.
fn valid_cdb(opcode: u8, sa: Option<u16>, len: usize) -> Vec<u8> {
    let mut c = vec![0u8; len];
    c[0] = opcode;
    if let Some(sa) = sa {
        c[1] = sa as u8;
    }
    match opcode {
        op::INQUIRY => c[4] = 0xFF,
        op::MODE_SENSE_6 => c[2..5].copy_from_slice(&[0x3F, 0, 0xFF]),
        op::MODE_SENSE_10 => c[2..9].copy_from_slice(&[0x3F, 0, 0, 0, 0, 0x01, 0]),
        op::WRITE_SAME_10 => c[8] = 1,
        op::WRITE_SAME_16 => c[13] = 1,
        op::REPORT_LUNS | op::MAINTENANCE_IN => c[8] = 1,
        op::PERSISTENT_RESERVE_IN => c[8] = 0xFF,
        op::PERSISTENT_RESERVE_OUT => c[8] = 24,
        op::SERVICE_ACTION_IN_16 => c[13] = 32,
        _ => {}
    }
    c
}

/// The most significant bit of the CDB field holding `bit` of `byte`, for
/// the multi-bit fields the unit refuses when non-zero; a one-bit field is
/// its own.
fn field_msb(opcode: u8, byte: usize, bit: u8) -> u8 {
    let protect = matches!(
        opcode,
        op::READ_10
            | op::READ_12
            | op::READ_16
            | op::WRITE_10
            | op::WRITE_12
            | op::WRITE_16
            | op::WRITE_AND_VERIFY_10
            | op::WRITE_AND_VERIFY_12
            | op::WRITE_AND_VERIFY_16
            | op::VERIFY_10
            | op::VERIFY_12
            | op::VERIFY_16
            | op::WRITE_SAME_10
            | op::WRITE_SAME_16
            | op::COMPARE_AND_WRITE
    );
    match (byte, bit) {
        // RDPROTECT / WRPROTECT / VRPROTECT.
        (1, 5..=7) if protect => 7,
        // THIRD-PARTY DEVICE ID of RESERVE(6) and RELEASE(6) (SPC-2).
        (1, 1..=3) if matches!(opcode, op::RESERVE_6 | op::RELEASE_6) => 3,
        _ => bit,
    }
}

#[test]
fn report_supported_opcodes_usage_data_carries_the_service_action() {
    // SPC-4 6.35.3: the CDB USAGE DATA holds the operation code in byte 0
    // and the service action where the CDB's SERVICE ACTION field is.
    let lu = ram_lu();
    for (opcode, sa, len) in reported_commands(&lu) {
        let usage = usage_data(&lu, opcode, sa);
        assert_eq!(usage.len(), len, "{opcode:#04x}/{sa:?}: CDB LENGTH and CDB SIZE agree");
        assert_eq!(usage[0], opcode);
        if let Some(sa) = sa {
            assert_eq!(u16::from(usage[1] & 0x1F), sa, "{opcode:#04x}/{sa:#04x}: usage byte 1 {:#04x}", usage[1]);
        }
    }
}

/// SPC-4 6.35.3: a usage bit of zero marks a CDB bit the device server
/// ignores or treats as reserved; one marks a bit it evaluates. For every
/// reported command, each CDB bit marked zero, set alone in an otherwise
/// valid CDB, either changes nothing or is refused as INVALID FIELD IN CDB
/// whose field pointer names that byte and that bit (SPC-4 4.5.2.4.2: the
/// bit in error, or the first bit of the multi-bit field holding it); and
/// a bit marked one that makes the CDB invalid is refused by a pointer to
/// a field the usage data marks evaluated.
#[test]
fn every_cdb_bit_is_treated_as_its_usage_data_says() {
    let lu = ram_lu();
    let n = nexus(1);
    for (opcode, sa, len) in reported_commands(&lu) {
        let usage = usage_data(&lu, opcode, sa);
        let base = valid_cdb(opcode, sa, len);
        let before = exec(&lu, &n, &base);
        assert!(
            matches!(before, Outcome::Good { .. } | Outcome::NeedData { .. } | Outcome::Io(_)),
            "{opcode:#04x}/{sa:?}: the base CDB {base:02x?} is valid, got {before:?}"
        );
        let before = format!("{before:?}");
        for byte in 1..len {
            for bit in 0..8u8 {
                // The service action itself.
                if sa.is_some() && byte == 1 && bit < 5 {
                    continue;
                }
                let mut c = base.clone();
                c[byte] ^= 1 << bit;
                let out = exec(&lu, &n, &c);
                let what = format!("{opcode:#04x}/{sa:?} byte {byte} bit {bit}: {out:?}");
                let pointer = match &out {
                    Outcome::Check(s) if asc(*s) == INVALID_CDB => s.field,
                    _ => None,
                };
                if usage[byte] & (1 << bit) == 0 {
                    match pointer {
                        Some(f) => {
                            assert!(f.in_cdb, "{what}");
                            assert_eq!(usize::from(f.byte), byte, "{what}");
                            assert_eq!(f.bit, Some(field_msb(opcode, byte, bit)), "{what}");
                        }
                        None => assert_eq!(format!("{out:?}"), before, "{what}: ignored"),
                    }
                } else if let Some(f) = pointer {
                    let marked = usage.get(usize::from(f.byte)).copied().unwrap_or(0);
                    let evaluated = match f.bit {
                        Some(b) => marked & (1 << b) != 0,
                        None => marked != 0,
                    };
                    assert!(evaluated, "{what}: the field pointed at is marked unused");
                }
            }
        }
    }
}

#[test]
fn report_supported_opcodes_lists_exactly_the_opcodes_executed() {
    let lu = ram_lu();
    let reported: Vec<u8> = reported_commands(&lu).iter().map(|&(opcode, _, _)| opcode).collect();
    for opcode in 0..=255u8 {
        let mut cdb = [0u8; 16];
        cdb[0] = opcode;
        let executed = !matches!(exec(&lu, &nexus(1), &cdb), Outcome::Check(s) if s == Sense::INVALID_OPCODE);
        assert_eq!(reported.contains(&opcode), executed, "opcode {opcode:#04x}");
    }
    // The one_command format agrees with the list, and a truncated list
    // keeps its full COMMAND DATA LENGTH.
    let all = [op::MAINTENANCE_IN, 0x0C, 0, 0, 0, 0, 0, 0, 0, 12, 0, 0];
    let d = good(exec(&lu, &nexus(1), &all));
    assert_eq!(d.len(), 12);
    assert_eq!(u32::from_be_bytes(d[..4].try_into().unwrap()) as usize, reported.len() * 8);
}

#[test]
fn link_and_flag_bits_are_pointed_at_themselves_not_at_naca() {
    let lu = ram_lu();
    for (control, bit) in [(0x01u8, 0u8), (0x02, 1), (0x04, 2)] {
        let s = check(exec(&lu, &nexus(1), &[op::TEST_UNIT_READY, 0, 0, 0, 0, control]));
        assert_eq!(asc(s), INVALID_CDB);
        let f = s.field.unwrap();
        assert_eq!((f.in_cdb, f.byte, f.bit), (true, 5, Some(bit)), "control byte {control:#04x}");
    }
}

// ---- Reservations ----

fn prout(sa: u8, rtype: u8) -> [u8; 10] {
    [op::PERSISTENT_RESERVE_OUT, sa, rtype, 0, 0, 0, 0, 0, 24, 0]
}

fn pr_out(lu: &LogicalUnit, n: &Nexus, sa: u8, rtype: u8, key: u64, sa_key: u64) -> Outcome<Vec<u8>> {
    exec_out(lu, n, &prout(sa, rtype), prout_parameters(key, sa_key).to_vec())
}

fn pr_in(lu: &LogicalUnit, n: &Nexus, sa: u8) -> Vec<u8> {
    good(exec(lu, n, &[op::PERSISTENT_RESERVE_IN, sa, 0, 0, 0, 0, 0, 0x10, 0, 0]))
}

const REGISTER: u8 = 0;
const RESERVE: u8 = 1;
const RELEASE: u8 = 2;
const CLEAR: u8 = 3;
const PREEMPT: u8 = 4;
const REGISTER_IGNORE: u8 = 6;

#[test]
fn register_and_read_keys() {
    let lu = ram_lu();
    let (a, b) = (nexus(1), nexus(2));
    assert_eq!(pr_in(&lu, &a, 0), [0, 0, 0, 0, 0, 0, 0, 0]);
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xAA));
    good(pr_out(&lu, &b, REGISTER_IGNORE, 0, 0, 0xBB));
    let d = pr_in(&lu, &a, 0);
    assert_eq!(d[..8], [0, 0, 0, 2, 0, 0, 0, 16]);
    assert_eq!(d[8..16], 0xAAu64.to_be_bytes());
    assert_eq!(d[16..24], 0xBBu64.to_be_bytes());
    // Re-registering with a wrong key conflicts; the right key changes it.
    conflict(pr_out(&lu, &a, REGISTER, 0, 0x1, 0xCC));
    good(pr_out(&lu, &a, REGISTER, 0, 0xAA, 0xCC));
    // Unregister.
    good(pr_out(&lu, &a, REGISTER, 0, 0xCC, 0));
    let d = pr_in(&lu, &a, 0);
    assert_eq!(d[..8], [0, 0, 0, 4, 0, 0, 0, 8]);
}

#[test]
fn register_past_the_registrant_limit_reports_insufficient_registration_resources() {
    let lu = ram_lu();
    let many = |n: usize| Nexus { initiator: format!("iqn.1994-05.com.example:many{n}"), ..nexus(1) };
    for n in 0..crate::pr::MAX_REGISTRATIONS {
        good(pr_out(&lu, &many(n), REGISTER, 0, 0, 0x1000 + n as u64));
    }
    let last = many(crate::pr::MAX_REGISTRATIONS);
    for sa in [REGISTER, REGISTER_IGNORE] {
        assert_eq!(asc(check(pr_out(&lu, &last, sa, 0, 0, 0xF))), (5, 0x55, 0x04));
    }
    let d = pr_in(&lu, &last, 0);
    assert_eq!(u32::from_be_bytes([d[4], d[5], d[6], d[7]]) as usize, crate::pr::MAX_REGISTRATIONS * 8);
    // Registrants may still change their key; once one leaves, a new one fits.
    good(pr_out(&lu, &many(0), REGISTER, 0, 0x1000, 0xE));
    good(pr_out(&lu, &many(0), REGISTER, 0, 0xE, 0));
    good(pr_out(&lu, &last, REGISTER, 0, 0, 0xF));
}

#[test]
fn unregistered_nexus_cannot_register_with_nonzero_key() {
    let lu = ram_lu();
    conflict(pr_out(&lu, &nexus(1), REGISTER, 0, 0x5, 0x6));
}

#[test]
fn write_exclusive_blocks_writes_but_not_reads_of_others() {
    let lu = ram_lu();
    let (a, b) = (nexus(1), nexus(2));
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    good(pr_out(&lu, &a, RESERVE, 1, 0xA, 0));
    let d = pr_in(&lu, &b, 1);
    assert_eq!(d[4..8], [0, 0, 0, 16]);
    assert_eq!(d[8..16], 0xAu64.to_be_bytes());
    assert_eq!(d[21], 0x01);
    assert!(matches!(exec(&lu, &b, &read10(0, 1, 0)), Outcome::Io(_)));
    conflict(exec(&lu, &b, &rw16(op::WRITE_16, 0, 1, 0)));
    conflict(exec(&lu, &b, &[op::SYNCHRONIZE_CACHE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0]));
    assert!(matches!(exec(&lu, &a, &rw16(op::WRITE_16, 0, 1, 0)), Outcome::NeedData { .. }));
    // Commands everyone may send.
    good(exec(&lu, &b, &inquiry(false, 0, 96)));
    good(exec(&lu, &b, &[0; 6]));
    good(exec(&lu, &b, &[op::READ_CAPACITY_10, 0, 0, 0, 0, 0, 0, 0, 0, 0]));
}

#[test]
fn exclusive_access_blocks_reads_too() {
    let lu = ram_lu();
    let (a, b) = (nexus(1), nexus(2));
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    good(pr_out(&lu, &a, RESERVE, 3, 0xA, 0));
    conflict(exec(&lu, &b, &read10(0, 1, 0)));
    conflict(exec(&lu, &b, &mode_sense6(0x3F, 0, false, 255)));
    // A registered non-holder still conflicts under EXCLUSIVE ACCESS.
    good(pr_out(&lu, &b, REGISTER, 0, 0, 0xB));
    conflict(exec(&lu, &b, &read10(0, 1, 0)));
}

#[test]
fn registrants_only_types_admit_registered_nexuses() {
    for rtype in [5u8, 6, 7, 8] {
        let lu = ram_lu();
        let (a, b, c) = (nexus(1), nexus(2), nexus(3));
        good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
        good(pr_out(&lu, &b, REGISTER, 0, 0, 0xB));
        good(pr_out(&lu, &a, RESERVE, rtype, 0xA, 0));
        assert!(matches!(exec(&lu, &b, &rw16(op::WRITE_16, 0, 1, 0)), Outcome::NeedData { .. }), "type {rtype}");
        conflict(exec(&lu, &c, &rw16(op::WRITE_16, 0, 1, 0)));
        let read = exec(&lu, &c, &read10(0, 1, 0));
        if rtype % 2 == 0 {
            conflict(read);
        } else {
            assert!(matches!(read, Outcome::Io(_)), "type {rtype}");
        }
    }
}

#[test]
fn all_registrants_reservation_reports_key_zero_and_survives_its_creator() {
    let lu = ram_lu();
    let (a, b, c) = (nexus(1), nexus(2), nexus(3));
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    good(pr_out(&lu, &b, REGISTER, 0, 0, 0xB));
    good(pr_out(&lu, &a, RESERVE, 7, 0xA, 0));
    let d = pr_in(&lu, &c, 1);
    assert_eq!(d[8..16], [0; 8]);
    assert_eq!(d[21], 7);
    good(pr_out(&lu, &a, REGISTER, 0, 0xA, 0));
    let d = pr_in(&lu, &c, 1);
    assert_eq!(d[4..8], [0, 0, 0, 16], "still reserved while B is registered");
    conflict(exec(&lu, &c, &rw16(op::WRITE_16, 0, 1, 0)));
    good(pr_out(&lu, &b, REGISTER, 0, 0xB, 0));
    assert_eq!(pr_in(&lu, &c, 1)[4..8], [0; 4], "released with the last registrant");
}

#[test]
fn reserve_conflicts_for_others_and_is_idempotent_for_holder() {
    let lu = ram_lu();
    let (a, b) = (nexus(1), nexus(2));
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    good(pr_out(&lu, &b, REGISTER, 0, 0, 0xB));
    good(pr_out(&lu, &a, RESERVE, 1, 0xA, 0));
    good(pr_out(&lu, &a, RESERVE, 1, 0xA, 0));
    conflict(pr_out(&lu, &a, RESERVE, 3, 0xA, 0));
    conflict(pr_out(&lu, &b, RESERVE, 1, 0xB, 0));
    conflict(pr_out(&lu, &b, RESERVE, 1, 0xA, 0));
    assert_eq!(asc(check(pr_out(&lu, &a, RESERVE, 2, 0xA, 0))), INVALID_CDB, "type 2 is invalid");
}

#[test]
fn release_by_holder_with_wrong_type_is_invalid_release() {
    let lu = ram_lu();
    let (a, b) = (nexus(1), nexus(2));
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    good(pr_out(&lu, &b, REGISTER, 0, 0, 0xB));
    good(pr_out(&lu, &a, RESERVE, 5, 0xA, 0));
    // A non-holder's release is a no-op.
    good(pr_out(&lu, &b, RELEASE, 5, 0xB, 0));
    assert_eq!(pr_in(&lu, &a, 1)[4..8], [0, 0, 0, 16]);
    assert_eq!(check(pr_out(&lu, &a, RELEASE, 6, 0xA, 0)), Sense::INVALID_RELEASE_OF_PR);
    good(pr_out(&lu, &a, RELEASE, 5, 0xA, 0));
    assert_eq!(pr_in(&lu, &a, 1)[4..8], [0; 4]);
    // Registrants-only release tells the other registrants.
    assert_eq!(check(exec(&lu, &b, &[0; 6])), Sense::UA_RESERVATIONS_RELEASED);
}

#[test]
fn preempt_moves_reservation_and_removes_preempted_registrations() {
    let lu = ram_lu();
    let (a, b) = (nexus(1), nexus(2));
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    good(pr_out(&lu, &b, REGISTER, 0, 0, 0xB));
    good(pr_out(&lu, &a, RESERVE, 3, 0xA, 0));
    conflict(exec(&lu, &b, &read10(0, 1, 0)));
    let gen_before = u32::from_be_bytes(pr_in(&lu, &b, 0)[..4].try_into().unwrap());
    good(pr_out(&lu, &b, PREEMPT, 1, 0xB, 0xA));
    let keys = pr_in(&lu, &b, 0);
    assert_eq!(keys[4..16], [0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0xB]);
    assert_eq!(u32::from_be_bytes(keys[..4].try_into().unwrap()), gen_before + 1);
    let res = pr_in(&lu, &b, 1);
    assert_eq!((res[15], res[21]), (0xB, 1));
    assert_eq!(check(exec(&lu, &a, &[0; 6])), Sense::UA_REGISTRATIONS_PREEMPTED);
    conflict(exec(&lu, &a, &rw16(op::WRITE_16, 0, 1, 0)));
    // A's old key no longer works.
    conflict(pr_out(&lu, &a, RESERVE, 1, 0xA, 0));
}

#[test]
fn preempt_and_abort_names_only_the_preempted_nexuses_to_its_executor() {
    const PREEMPT_AND_ABORT: u8 = 5;
    let lu = ram_lu();
    let (a, b, c) = (nexus(1), nexus(2), nexus(3));
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    good(pr_out(&lu, &b, REGISTER, 0, 0, 0xB));
    good(pr_out(&lu, &c, REGISTER, 0, 0, 0xC));
    // B holds a registrants-only reservation: C may write too.
    good(pr_out(&lu, &b, RESERVE, 5, 0xB, 0));
    // PREEMPT (without abort) keeps nothing for the executor.
    good(pr_out(&lu, &c, PREEMPT, 5, 0xC, 0xA));
    assert!(lu.take_preempted(&c).is_empty(), "PREEMPT aborts nothing");
    assert_eq!(check(exec(&lu, &a, &[0; 6])), Sense::UA_REGISTRATIONS_PREEMPTED);
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    // A preempts B's key: B alone is named, once.
    good(pr_out(&lu, &a, PREEMPT_AND_ABORT, 5, 0xA, 0xB));
    assert!(lu.take_preempted(&b).is_empty(), "only the sender's command is kept");
    assert_eq!(lu.take_preempted(&a), vec![b.id()]);
    assert!(lu.take_preempted(&a).is_empty(), "taken once");
    assert!(b.is(&b.id()) && !c.is(&b.id()));
    // A conflicting PREEMPT AND ABORT (a key nobody holds) names nobody.
    conflict(pr_out(&lu, &a, PREEMPT_AND_ABORT, 5, 0xA, 0x77));
    assert!(lu.take_preempted(&a).is_empty());
}

#[test]
fn preempt_of_unknown_key_conflicts_and_zero_key_without_reservation_is_invalid() {
    let lu = ram_lu();
    let a = nexus(1);
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    conflict(pr_out(&lu, &a, PREEMPT, 1, 0xA, 0x77));
    assert_eq!(asc(check(pr_out(&lu, &a, PREEMPT, 1, 0xA, 0))), INVALID_PARAM);
}

#[test]
fn clear_removes_everything_and_notifies_others() {
    let lu = ram_lu();
    let (a, b) = (nexus(1), nexus(2));
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    good(pr_out(&lu, &b, REGISTER, 0, 0, 0xB));
    good(pr_out(&lu, &a, RESERVE, 1, 0xA, 0));
    conflict(pr_out(&lu, &b, CLEAR, 0, 0xA, 0));
    good(pr_out(&lu, &b, CLEAR, 0, 0xB, 0));
    assert_eq!(check(exec(&lu, &a, &[0; 6])), Sense::UA_RESERVATIONS_PREEMPTED);
    assert_eq!(pr_in(&lu, &a, 0)[4..8], [0; 4]);
    assert_eq!(pr_in(&lu, &a, 1)[4..8], [0; 4]);
    assert!(good(exec(&lu, &b, &[0; 6])).is_empty(), "the issuer gets no unit attention");
}

#[test]
fn report_capabilities_golden() {
    let lu = ram_lu();
    assert_eq!(pr_in(&lu, &nexus(1), 2), [0, 8, 0x10, 0x80, 0xEA, 0x01, 0, 0]);
}

#[test]
fn read_full_status_describes_each_registration() {
    let lu = ram_lu();
    let a = nexus(1);
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    good(pr_out(&lu, &a, RESERVE, 1, 0xA, 0));
    let d = pr_in(&lu, &a, 3);
    let add_len = u32::from_be_bytes(d[4..8].try_into().unwrap()) as usize;
    assert_eq!(add_len, d.len() - 8);
    let desc = &d[8..];
    assert_eq!(desc[..8], 0xAu64.to_be_bytes());
    assert_eq!(desc[12..14], [0x01, 0x01], "R_HOLDER, type WRITE EXCLUSIVE");
    assert_eq!(desc[18..20], [0, 1], "relative target port");
    let tid_len = u32::from_be_bytes(desc[20..24].try_into().unwrap()) as usize;
    let tid = &desc[24..24 + tid_len];
    assert_eq!(tid[0], 0x45, "iSCSI TransportID with ISID");
    let name_len = usize::from(u16::from_be_bytes([tid[2], tid[3]]));
    assert_eq!(name_len % 4, 0);
    assert!(tid[4..].starts_with(a.initiator.as_bytes()));
}

#[test]
fn prout_rejects_bad_parameter_lists() {
    let lu = ram_lu();
    let a = nexus(1);
    let short = [op::PERSISTENT_RESERVE_OUT, 0, 0, 0, 0, 0, 0, 0, 20, 0];
    assert_eq!(asc(check(exec(&lu, &a, &short))), (5, 0x1A, 0));
    let mut aptpl = prout_parameters(0, 0xA);
    aptpl[20] = 0x01;
    assert_eq!(asc(check(exec_out(&lu, &a, &prout(REGISTER, 0), aptpl.to_vec()))), INVALID_PARAM);
    let mut spec = prout_parameters(0, 0xA);
    spec[20] = 0x08;
    assert_eq!(asc(check(exec_out(&lu, &a, &prout(REGISTER, 0), spec.to_vec()))), INVALID_PARAM);
    assert_eq!(asc(check(exec(&lu, &a, &prout(7, 0)))), INVALID_CDB, "REGISTER AND MOVE");
    let scope = [op::PERSISTENT_RESERVE_OUT, RESERVE, 0x11, 0, 0, 0, 0, 0, 24, 0];
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    assert_eq!(asc(check(exec_out(&lu, &a, &scope, prout_parameters(0xA, 0).to_vec()))), INVALID_CDB);
}

#[test]
fn persistent_reservations_survive_lun_reset() {
    let lu = ram_lu();
    let (a, b) = (nexus(1), nexus(2));
    lu.nexus_created(&b);
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    good(pr_out(&lu, &a, RESERVE, 3, 0xA, 0));
    lu.lun_reset(&a);
    assert_eq!(check(exec(&lu, &b, &read10(0, 1, 0))), Sense::UA_LUN_RESET);
    conflict(exec(&lu, &b, &read10(0, 1, 0)));
}

#[test]
fn spc2_reserve_between_two_initiators() {
    let lu = ram_lu();
    let (a, b) = (nexus(1), nexus(2));
    let reserve = [op::RESERVE_6, 0, 0, 0, 0, 0];
    let release = [op::RELEASE_6, 0, 0, 0, 0, 0];
    good(exec(&lu, &a, &reserve));
    good(exec(&lu, &a, &reserve));
    conflict(exec(&lu, &b, &reserve));
    good(exec(&lu, &b, &release));
    good(exec(&lu, &a, &mode_sense6(0x3F, 0, false, 255)));
    conflict(exec(&lu, &b, &mode_sense6(0x3F, 0, false, 255)));
    conflict(exec(&lu, &b, &read10(0, 1, 0)));
    conflict(exec(&lu, &b, &[op::PERSISTENT_RESERVE_IN, 0, 0, 0, 0, 0, 0, 0x10, 0, 0]));
    good(exec(&lu, &b, &inquiry(false, 0, 96)));
    good(exec(&lu, &a, &release));
    good(exec(&lu, &b, &reserve));
    good(exec(&lu, &b, &release));
}

#[test]
fn spc2_reservation_is_released_by_lun_reset_and_nexus_loss() {
    let lu = ram_lu();
    let (a, b) = (nexus(1), nexus(2));
    let reserve = [op::RESERVE_6, 0, 0, 0, 0, 0];
    good(exec(&lu, &a, &reserve));
    lu.lun_reset(&b);
    assert_eq!(check(exec(&lu, &a, &[0; 6])), Sense::UA_LUN_RESET);
    assert_eq!(check(exec(&lu, &b, &[0; 6])), Sense::UA_LUN_RESET);
    good(exec(&lu, &b, &reserve));
    lu.nexus_lost(&b);
    good(exec(&lu, &a, &reserve));
}

#[test]
fn spc2_reserve_conflicts_with_registrations() {
    let lu = ram_lu();
    let (a, b) = (nexus(1), nexus(2));
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    conflict(exec(&lu, &b, &[op::RESERVE_6, 0, 0, 0, 0, 0]));
    conflict(exec(&lu, &a, &[op::RELEASE_6, 0, 0, 0, 0, 0]));
    let lu = ram_lu();
    good(exec(&lu, &a, &[op::RESERVE_6, 0, 0, 0, 0, 0]));
    conflict(pr_out(&lu, &b, REGISTER, 0, 0, 0xB));
}

// ---- Robustness ----

/// Every opcode with pseudo-random CDB bytes and data-out never panics.
#[test]
fn random_cdbs_never_panic() {
    let lu = ram_lu();
    let n = nexus(1);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..20_000u32 {
        let opcode = (round % 256) as u8;
        let len = (next() % 20) as usize;
        let mut cdb: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if let Some(b) = cdb.first_mut() {
            *b = opcode;
        }
        // Keep lengths small so the test stays quick.
        if cdb.len() > 9 && next() % 2 == 0 {
            cdb[7] = 0;
            cdb[8] = (next() % 64) as u8;
        }
        match lu.execute::<Vec<u8>>(&n, &cdb, None) {
            Outcome::NeedData { len } if len <= 1 << 20 => {
                let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                let _ = lu.execute(&n, &cdb, Some(data));
                let short: Vec<u8> = (0..len / 2).map(|_| next() as u8).collect();
                let _ = lu.execute(&n, &cdb, Some(short));
            }
            _ => {}
        }
        if round % 1000 == 0 {
            lu.lun_reset(&nexus(2));
        }
    }
}

fn set_swp(lu: &LogicalUnit, n: &Nexus, swp: bool) {
    // The control page as MODE SENSE reports it, with SWP (byte 4 bit 3).
    let mut list = vec![0u8, 0, 0, 0, 0x0A, 0x0A, 0, 0x10, 0, 0x40, 0, 0, 0xFF, 0xFF, 0, 0];
    if swp {
        list[8] |= 0x08;
    }
    let cdb = [op::MODE_SELECT_6, 0x10, 0, 0, list.len() as u8, 0];
    assert!(good(exec_out(lu, n, &cdb, list)).is_empty());
}

#[test]
fn software_write_protect_refuses_writes_until_cleared() {
    let lu = ram_lu();
    let (a, b) = (nexus(1), nexus(2));
    good(exec(&lu, &b, &[0; 6]));
    let d = good(exec(&lu, &a, &mode_sense6(0x0A, 1, true, 255)));
    assert_eq!(d[8] & 0x08, 0x08, "SWP is changeable");
    set_swp(&lu, &a, true);
    assert_eq!(check(exec(&lu, &b, &[0; 6])), Sense::UA_MODE_PARAMETERS_CHANGED);
    let d = good(exec(&lu, &b, &mode_sense6(0x0A, 0, true, 255)));
    assert_eq!(d[2] & 0x80, 0x80, "WP in the device-specific parameter");
    assert_eq!(d[8] & 0x08, 0x08, "SWP reads back");
    let w = rw16(op::WRITE_16, 0, 1, 0);
    assert_eq!(check(exec_out(&lu, &b, &w, vec![0; BS as usize])), Sense::WRITE_PROTECTED);
    assert!(matches!(block_op(exec(&lu, &b, &rw16(op::READ_16, 0, 1, 0))), BlockOp::Read { .. }));
    set_swp(&lu, &a, false);
    assert_eq!(check(exec(&lu, &b, &[0; 6])), Sense::UA_MODE_PARAMETERS_CHANGED);
    assert!(matches!(block_op(exec_out(&lu, &b, &w, vec![0; BS as usize])), BlockOp::Write { .. }));
}

/// A read-only device: MODE SENSE reports WP whatever page control asks
/// for, every command that writes the medium gets DATA PROTECT / WRITE
/// PROTECTED, and reads and SYNCHRONIZE CACHE run.
#[test]
fn a_read_only_device_refuses_writes_and_reports_write_protect() {
    let dev = Described { read_only: true, ..Described::new("ro", BS, BLOCKS) };
    let lu = LogicalUnit::new(TARGET, 0, Arc::new(dev));
    let n = nexus(1);
    good(exec(&lu, &n, &[0; 6]));
    for pc in [0, 2] {
        let d = good(exec(&lu, &n, &mode_sense6(0x3F, pc, true, 255)));
        assert_eq!(d[2] & 0x80, 0x80, "WP with page control {pc}");
    }
    let block = || vec![0u8; BS as usize];
    assert_eq!(check(exec_out(&lu, &n, &rw16(op::WRITE_16, 0, 1, 0), block())), Sense::WRITE_PROTECTED);
    let mut write10 = read10(0, 1, 0);
    write10[0] = op::WRITE_10;
    assert_eq!(check(exec_out(&lu, &n, &write10, block())), Sense::WRITE_PROTECTED);
    assert_eq!(check(exec_out(&lu, &n, &rw16(op::WRITE_SAME_16, 0, 8, 0), block())), Sense::WRITE_PROTECTED);
    assert_eq!(check(exec(&lu, &n, &rw16(op::WRITE_SAME_16, 0, 16, 0x09))), Sense::WRITE_PROTECTED);
    let p = unmap_list(&[(0, 8)]);
    assert_eq!(check(exec_out(&lu, &n, &unmap_cdb(p.len()), p)), Sense::WRITE_PROTECTED);
    assert!(matches!(block_op(exec(&lu, &n, &rw16(op::READ_16, 0, 1, 0))), BlockOp::Read { .. }));
    let sync = [op::SYNCHRONIZE_CACHE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    assert!(!matches!(exec(&lu, &n, &sync), Outcome::Check(_)), "SYNCHRONIZE CACHE");
    // A writable unit's MODE SENSE has no WP.
    let d = good(exec(&ram_lu(), &n, &mode_sense6(0x3F, 0, true, 255)));
    assert_eq!(d[2] & 0x80, 0, "no WP on a writable device");
}

// ---- Persistent reservations (SPC-4 5.9, 6.16) and sense data ----

/// SBC-3 table 13: START STOP UNIT with START 1 and POWER CONDITION 0h
/// and PREVENT ALLOW MEDIUM REMOVAL with PREVENT 00b are allowed under
/// every persistent reservation, from any I_T nexus; a STOP (or another
/// power condition) and a PREVENT conflict as writes do.
#[test]
fn starting_the_unit_and_allowing_removal_never_conflict() {
    let start = [op::START_STOP_UNIT, 0, 0, 0, 0x01, 0];
    let start_loej = [op::START_STOP_UNIT, 0, 0, 0, 0x03, 0];
    let stop = [op::START_STOP_UNIT, 0, 0, 0, 0x00, 0];
    let idle = [op::START_STOP_UNIT, 0, 0, 0, 0x21, 0];
    let allow = [op::PREVENT_ALLOW_MEDIUM_REMOVAL, 0, 0, 0, 0, 0];
    let prevent = [op::PREVENT_ALLOW_MEDIUM_REMOVAL, 0, 0, 0, 1, 0];
    for rtype in [1u8, 3, 5, 6, 7, 8] {
        let lu = ram_lu();
        let (a, b) = (nexus(1), nexus(2));
        good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
        good(pr_out(&lu, &a, RESERVE, rtype, 0xA, 0));
        for cdb in [&start, &start_loej, &allow] {
            good(exec(&lu, &b, cdb));
        }
        for cdb in [&stop, &idle, &prevent] {
            conflict(exec(&lu, &b, cdb));
        }
    }
}

/// REPORT CAPABILITIES sets CRH, which promises the SPC-4 5.9.3 (SPC-5
/// 5.13.3) exceptions: RESERVE(6)/RELEASE(6) from the persistent
/// reservation holder, or from a registrant while a registrants-only or
/// all-registrants reservation is present, complete with GOOD status and
/// change nothing (LIO: target_check_scsi2_reservation_conflict).
#[test]
fn crh_reserve6_release6_from_pr_holder_or_registrant_complete_good() {
    let reserve6 = [op::RESERVE_6, 0, 0, 0, 0, 0];
    let release6 = [op::RELEASE_6, 0, 0, 0, 0, 0];
    let lu = ram_lu();
    let (a, b) = (nexus(1), nexus(2));
    assert_eq!(pr_in(&lu, &a, 2)[2] & 0x10, 0x10, "CRH is claimed");
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    good(pr_out(&lu, &a, RESERVE, 1, 0xA, 0));
    // a) the persistent reservation holder.
    good(exec(&lu, &a, &reserve6));
    good(exec(&lu, &a, &release6));
    // The persistent reservation is unchanged and no SPC-2 one exists.
    assert_eq!(pr_in(&lu, &a, 1)[21], 1, "still WRITE EXCLUSIVE");
    assert!(matches!(exec(&lu, &b, &read10(0, 1, 0)), Outcome::Io(_)), "another nexus still reads");
    // b) a registrant while a registrants-only reservation is present.
    let lu = ram_lu();
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    good(pr_out(&lu, &b, REGISTER, 0, 0, 0xB));
    good(pr_out(&lu, &a, RESERVE, 5, 0xA, 0));
    good(exec(&lu, &b, &reserve6));
    good(exec(&lu, &b, &release6));
}

/// SPC-4 6.16.3: "The ALL_TG_PT bit is valid only for the REGISTER service
/// action and the REGISTER AND IGNORE EXISTING KEY service action, and
/// shall be ignored for all other service actions"; likewise "The APTPL
/// bit shall be valid only for the REGISTER service action and the
/// REGISTER AND IGNORE EXISTING KEY service action. In all other cases,
/// the APTPL bit shall be ignored." (LIO passes them to REGISTER only.)
#[test]
fn aptpl_and_all_tg_pt_are_ignored_outside_register() {
    let lu = ram_lu();
    let a = nexus(1);
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    let mut p = prout_parameters(0xA, 0);
    p[20] = 0x01; // APTPL
    good(exec_out(&lu, &a, &prout(RESERVE, 1), p.to_vec()));
    let mut p = prout_parameters(0xA, 0);
    p[20] = 0x04; // ALL_TG_PT
    good(exec_out(&lu, &a, &prout(RELEASE, 1), p.to_vec()));
}

/// SPC-4 5.9.11.4 (SPC-5 5.13.11.2.4.3) f): "if the type or scope has
/// changed, then for every I_T nexus whose reservation key was not removed,
/// except for the I_T nexus on which the PERSISTENT RESERVE OUT command was
/// received, the device server shall establish a unit attention condition
/// ... with the additional sense code set to RESERVATIONS RELEASED."
#[test]
fn preempt_that_changes_the_type_tells_remaining_registrants_reservations_released() {
    let lu = ram_lu();
    let (a, b, c) = (nexus(1), nexus(2), nexus(3));
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    good(pr_out(&lu, &b, REGISTER, 0, 0, 0xB));
    good(pr_out(&lu, &c, REGISTER, 0, 0, 0xC));
    good(pr_out(&lu, &a, RESERVE, 1, 0xA, 0));
    // b preempts a's WRITE EXCLUSIVE with an EXCLUSIVE ACCESS reservation.
    good(pr_out(&lu, &b, PREEMPT, 3, 0xB, 0xA));
    assert_eq!(check(exec(&lu, &a, &[0; 6])), Sense::UA_REGISTRATIONS_PREEMPTED);
    assert_eq!(check(exec(&lu, &c, &[0; 6])), Sense::UA_RESERVATIONS_RELEASED, "c kept its key; type changed");
}

/// SPC-4 5.9.11.5 (SPC-5 5.13.11.2.5): "It is not an error for a PERSISTENT
/// RESERVE OUT with a PREEMPT service action ... to set the RESERVATION KEY
/// and the SERVICE ACTION RESERVATION KEY to the same value, however, no
/// unit attention condition is established for the I_T nexus on which the
/// PERSISTENT RESERVE OUT command was received. The registration is
/// removed." (LIO frees the calling nexus's registration too.)
#[test]
fn preempt_naming_the_callers_own_non_holder_key_removes_its_registration() {
    let lu = ram_lu();
    let (a, b) = (nexus(1), nexus(2));
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    good(pr_out(&lu, &b, REGISTER, 0, 0, 0xB));
    good(pr_out(&lu, &b, RESERVE, 1, 0xB, 0));
    good(pr_out(&lu, &a, PREEMPT, 1, 0xA, 0xA));
    let keys = pr_in(&lu, &a, 0);
    assert_eq!(u32::from_be_bytes(keys[4..8].try_into().unwrap()), 8, "only b's key is left: {keys:?}");
    assert_eq!(keys[8..16], 0xBu64.to_be_bytes());
}

/// SPC-4 4.5.2.4.1 (sense key specific sense data descriptor): DESCRIPTOR
/// TYPE 02h, ADDITIONAL LENGTH 06h, bytes 2-3 reserved, SKSV and the sense
/// key specific field in bytes 4-6, byte 7 reserved: 8 bytes (Linux's
/// scsi_set_sense_field_pointer writes ucp[4] = 0x80 | ...).
#[test]
fn descriptor_sense_key_specific_descriptor_is_eight_bytes_with_sksv_at_byte_4() {
    let b = Sense::invalid_cdb_field(1, Some(5)).to_descriptor_bytes();
    assert_eq!(b[..8], [0x72, 0x05, 0x24, 0x00, 0, 0, 0, 8]);
    assert_eq!(b[8..], [0x02, 0x06, 0x00, 0x00, 0xCD, 0x00, 0x01, 0x00]);
}

/// A nexus lost with a unit attention it was not told keeps it for the
/// session that reinstates it, apart from the live ones: the other
/// sessions' commands stay on the fast path meanwhile (a lost nexus's
/// queue among the live ones kept every command on the slow path), and
/// the reinstated nexus meets the attention at its first command.
#[test]
fn a_lost_nexus_keeps_its_unit_attention_off_the_fast_path() {
    let lu = ram_lu();
    let (a, b) = (nexus(1), nexus(2));
    lu.nexus_created(&a);
    lu.nexus_created(&b);
    lu.capacity_changed();
    assert!(!lu.is_quiet());
    assert_eq!(check(exec(&lu, &a, &[0; 6])), Sense::UA_CAPACITY_CHANGED);
    lu.nexus_lost(&b);
    assert!(lu.is_quiet(), "B's pending attention keeps A's commands off the fast path");
    lu.nexus_created(&b);
    assert_eq!(check(exec(&lu, &b, &[0; 6])), Sense::UA_CAPACITY_CHANGED, "B is told at its first command");
    assert!(lu.is_quiet());
}

/// A registrant whose session is gone (the node a cluster fences) still
/// learns what a PERSISTENT RESERVE OUT of another did to it when it logs
/// in again, but the attention waits among the lost nexuses: once the
/// registrations are cleared the live sessions' commands are back on the
/// fast path (queued among the live ones, it kept every command of every
/// session on the slow path until that initiator came back, if ever).
#[test]
fn a_lost_registrant_is_told_of_a_clear_without_keeping_others_off_the_fast_path() {
    let lu = ram_lu();
    let (a, b) = (nexus(1), nexus(2));
    lu.nexus_created(&a);
    lu.nexus_created(&b);
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    good(pr_out(&lu, &b, REGISTER, 0, 0, 0xB));
    lu.nexus_lost(&b);
    good(pr_out(&lu, &a, CLEAR, 0, 0xA, 0));
    assert!(lu.is_quiet(), "the lost registrant's attention keeps A off the fast path");
    lu.nexus_created(&b);
    assert_eq!(check(exec(&lu, &b, &[0; 6])), Sense::UA_RESERVATIONS_PREEMPTED, "B is told at its first command");
    assert!(lu.is_quiet());
}

/// SPC-2 5.5.1: "If a logical unit has been reserved by any RESERVE
/// command and is still reserved by any initiator, all PERSISTENT RESERVE
/// IN and all PERSISTENT RESERVE OUT commands shall conflict regardless of
/// initiator or service action" (LIO: target_scsi3_emulate_pr_in/out). The
/// holder's own REGISTER went through, and with a registration present its
/// RELEASE(6) then conflicted: the reservation could not be released.
#[test]
fn persistent_reserve_in_and_out_conflict_with_an_spc2_reservation_also_for_its_holder() {
    let reserve6 = [op::RESERVE_6, 0, 0, 0, 0, 0];
    let release6 = [op::RELEASE_6, 0, 0, 0, 0, 0];
    let lu = ram_lu();
    let a = nexus(1);
    good(exec(&lu, &a, &reserve6));
    conflict(exec(&lu, &a, &[op::PERSISTENT_RESERVE_IN, 0, 0, 0, 0, 0, 0, 0x10, 0, 0]));
    conflict(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    good(exec(&lu, &a, &release6));
    good(pr_out(&lu, &a, REGISTER, 0, 0, 0xA));
    assert_eq!(pr_in(&lu, &a, 0)[4..8], [0, 0, 0, 8]);
}
