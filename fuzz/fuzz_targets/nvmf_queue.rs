//! NVMe-oF command execution through `nvmf::Queue::execute` against a small
//! target (one subsystem, a RAM namespace and a null namespace, NVMe/TCP
//! ports), with each command's data pointer parsed the way the NVMe/TCP
//! binding parses it.
//!
//! Input: byte 0 sets the start: bit 0 connects queue 0 as an admin queue
//! and enables the controller (CC.EN) and bit 1 then connects queue 1 as I/O
//! queue 1 of that controller; queue 2 starts unconnected. The rest is
//! records:
//!
//! ```text
//! h: u8       bits 0-1 queue (3 = close queue 2 and start a new one),
//!             bit 2 a data blob follows, bit 3 supply valid Connect data
//!             (bit 5: for the discovery subsystem; bit 6: cntlid of the
//!             admin queue's controller instead of 0xffff), bit 4 hand the
//!             data over with the command (in-capsule) instead of to
//!             `data_arrived` after NeedData, bit 7 advance the clock by
//!             `dt` seconds
//! [dt: u8]    when bit 7
//! sqe: [u8; 64]
//! [len: u16 le, bytes]  when bit 2 (len taken modulo 8193)
//! ```
//!
//! Like the TCP binding, `TargetConnection::check_sgl` turns the SQE's SGL
//! (and the in-capsule data, if any) into the `data_len` that `execute`
//! takes; a command whose SGL it rejects is completed by the binding and
//! never reaches the queue (in-capsule data needs a data block descriptor
//! at offset 0 of exactly its length, otherwise a transport data block
//! descriptor of at most 1 MiB, or a zero-length data block one). On
//! NeedData the blob, or 0xa5 bytes, cut or padded to the length asked for
//! (what an R2T solicits), goes to `data_arrived`.
//!
//! Never panics. NeedData asks for the SGL's length, and a command given its
//! data never asks for data again; block requests stay inside the device
//! and the transfer limit, and a write or compare carries exactly its
//! blocks; completions carry the command's CID. `poll_event` and `expired`
//! run after every record; no controller outlives its admin queue.
#![no_main]

use blockdev::{BlockDevice, Device};
use ironwire_fuzz::{addr, binding, cc_set_sqe, connect_data, connect_sqe, target, transport, Reader, CC_ENABLE, SUB};
use libfuzzer_sys::fuzz_target;
use nvme_spec::{Sqe, DISCOVERY_NQN};
use nvmf::{BlockOp, Outcome, Queue, QueueKind, Target};
use nvmf_tcp::target::TargetConnection;
use std::sync::Arc;
use zerocopy::FromBytes;

fn cntlid_of(q: &Queue<Device>) -> Option<u16> {
    q.controller().map(|c| c.cntlid)
}

/// Checks an outcome against the command that produced it, whose SGL
/// described `data_len` bytes.
fn check(target: &Target<Device>, sqe: &Sqe, o: &Outcome<Vec<u8>, Device>, data_len: u32, had_data: bool) {
    let cid = sqe.cid.get();
    let max = target.settings.max_transfer;
    match o {
        Outcome::Complete { cqe, data } => {
            assert_eq!(cqe.cid.get(), cid);
            assert!(data.len() <= max as usize, "{} bytes > MDTS", data.len());
        }
        Outcome::Connected { cqe, sqsize, .. } => {
            assert_eq!(cqe.cid.get(), cid);
            assert!(cqe.status().is_success());
            assert!(*sqsize >= 1 && *sqsize < target.settings.queue_entries);
        }
        Outcome::CompleteAndClose { cqe } => assert_eq!(cqe.cid.get(), cid),
        Outcome::Shutdown { cqe, .. } => {
            assert_eq!(cqe.cid.get(), cid);
            assert_eq!(sqe.opcode, 0x7f, "a shutdown from other than a Fabrics command");
        }
        Outcome::FlushThenComplete { cqe, devices } => {
            assert_eq!(cqe.cid.get(), cid);
            assert_eq!(sqe.opcode, 0x09, "a write cache turned off by other than Set Features");
            assert!(devices.iter().all(|d| d.volatile_write_cache()), "flushing a device without a cache");
        }
        Outcome::NeedData { len, discard } => {
            assert!(!had_data, "asked for data it was given");
            let plain_write = sqe.opcode == 0x01 && sqe.flags & 3 == 0;
            let null = sqe.nsid.get() == 2;
            assert!(!*discard || (plain_write && null), "discard for opcode {:#x} nsid {}", sqe.opcode, sqe.nsid.get());
            assert_eq!(*len, data_len, "NeedData for other than the SGL's length");
            assert!(*len <= max.max(1024), "NeedData {len} > MDTS");
        }
        Outcome::Deferred => {}
        Outcome::Io(req) => {
            let geo = req.device.geometry();
            let bs = u64::from(geo.block_size);
            if let BlockOp::CompareAndWrite { compare_cid, lba, expected, data, .. } = &req.op {
                // A fused pair leaves when the data of its last half is in,
                // and that half may be either of the two.
                assert!(req.cid == cid || *compare_cid == cid, "a fused pair issued by neither of its halves");
                assert_eq!(expected.len(), data.len(), "the halves carry different lengths");
                assert!(!data.is_empty() && (data.len() as u64).is_multiple_of(bs), "fused data is not whole blocks");
                assert!(data.len() <= max as usize, "fused half > MDTS");
                assert!(req.device.check_range(*lba, data.len() as u64 / bs).is_ok());
                return;
            }
            assert_eq!(req.cid, cid);
            match &req.op {
                BlockOp::Read { lba, len_bytes } => {
                    assert!(*len_bytes <= max);
                    assert_eq!(u64::from(*len_bytes) % bs, 0);
                    assert!(req.device.check_range(*lba, u64::from(*len_bytes) / bs).is_ok());
                }
                BlockOp::Write { lba, data, .. } | BlockOp::Compare { lba, data } => {
                    assert!(had_data);
                    assert!(req.device.check_range(*lba, u64::from(sqe.blocks())).is_ok());
                    assert_eq!(data.len() as u64, u64::from(sqe.blocks()) * bs, "data is not the blocks");
                }
                BlockOp::WriteZeroes { lba, blocks, .. } => {
                    assert!(req.device.check_range(*lba, *blocks).is_ok());
                }
                BlockOp::Deallocate { ranges, .. } => {
                    for (lba, n) in ranges {
                        assert!(*n > 0);
                        assert!(req.device.check_range(*lba, *n).is_ok());
                    }
                }
                BlockOp::Flush => {}
                BlockOp::CompareAndWrite { .. } => unreachable!("handled above"),
            }
        }
    }
}

/// Runs one command as the TCP binding would: SGL check, `execute` with
/// the in-capsule data `first`, and on NeedData `data_arrived` with `later`
/// cut or padded to the length asked for.
fn run(
    t: &Target<Device>,
    tcp: &TargetConnection<Vec<u8>>,
    q: &mut Queue<Device>,
    now: u64,
    sqe: &Sqe,
    first: Option<Vec<u8>>,
    later: Option<Vec<u8>>,
) {
    let had = first.is_some();
    let data_len = match tcp.check_sgl(sqe, first.as_ref().map(Vec::len)) {
        Ok(len) => len,
        // The binding completes the command with this status itself.
        Err(status) => {
            assert!(!status.is_success());
            return;
        }
    };
    let mut o = q.execute(now, sqe, data_len, first);
    check(t, sqe, &o, data_len, had);
    if let Outcome::NeedData { len, .. } = o {
        let mut data = later.unwrap_or_default();
        data.resize(len as usize, 0xa5);
        o = q.data_arrived(now, sqe.cid.get(), data);
        check(t, sqe, &o, data_len, true);
    }
    if let Outcome::CompleteAndClose { .. } = o {
        q.close();
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&start, rest)) = input.split_first() else {
        return;
    };
    let t = target();
    let tcp = binding();
    let mut now: u64 = 1_000;
    let mut qs: [Queue<Device>; 3] = std::array::from_fn(|_| Queue::new(t.clone(), transport(), addr(), addr()));

    if start & 1 != 0 {
        let connect = connect_sqe(0, 0xfff0);
        let len = tcp.check_sgl(&connect, Some(1024)).expect("Connect SGL");
        let o = qs[0].execute(now, &connect, len, Some(connect_data(0xffff, SUB)));
        assert!(matches!(o, Outcome::Connected { qid: 0, .. }), "{o:?}");
        let cc = cc_set_sqe(CC_ENABLE, 0xfff1);
        let len = tcp.check_sgl(&cc, None).expect("Property Set SGL");
        let o = qs[0].execute(now, &cc, len, None::<Vec<u8>>);
        assert!(matches!(&o, Outcome::Complete { cqe, .. } if cqe.status().is_success()));
        if start & 2 != 0 {
            let cntlid = cntlid_of(&qs[0]).expect("admin controller");
            let connect = connect_sqe(1, 0xfff2);
            let len = tcp.check_sgl(&connect, Some(1024)).expect("Connect SGL");
            let o = qs[1].execute(now, &connect, len, Some(connect_data(cntlid, SUB)));
            assert!(matches!(o, Outcome::Connected { qid: 1, .. }), "{o:?}");
        }
    }

    let mut r = Reader(rest);
    while let Some(h) = r.u8() {
        if h & 0x80 != 0 {
            let Some(dt) = r.u8() else { break };
            now = now.saturating_add(u64::from(dt) * 1000);
        }
        let Some(raw) = r.take(64) else { break };
        let sqe = Sqe::read_from_bytes(raw).expect("64 bytes");
        let mut blob: Option<Vec<u8>> = None;
        if h & 4 != 0 {
            let Some(l) = r.take(2) else { break };
            let len = usize::from(u16::from_le_bytes([l[0], l[1]])) % 8193;
            let Some(b) = r.take(len.min(r.0.len())) else { break };
            blob = Some(b.to_vec());
        }
        if h & 8 != 0 {
            let sub = if h & 0x20 != 0 { DISCOVERY_NQN } else { SUB };
            let cntlid = if h & 0x40 != 0 { cntlid_of(&qs[0]).unwrap_or(1) } else { 0xffff };
            blob = Some(connect_data(cntlid, sub));
        }
        let mut qi = usize::from(h & 3);
        if qi == 3 {
            qs[2].close();
            qs[2] = Queue::new(t.clone(), transport(), addr(), addr());
            qi = 2;
        }
        let early = h & 0x10 != 0;
        let first = if early { blob.take() } else { None };
        run(&t, &tcp, &mut qs[qi], now, &sqe, first, blob);
        for q in qs.iter_mut() {
            while let Some(cqe) = q.poll_event() {
                assert!(cqe.status().is_success());
            }
            if q.expired(now) {
                assert!(!matches!(q.kind(), QueueKind::Unconnected));
            }
        }
    }
    for q in qs.iter_mut() {
        q.close();
    }
    drop(qs);
    // Every controller went away with its admin queue.
    for s in t.subsystems() {
        assert_eq!(s.controller_count(), 0, "controller leaked");
    }
    let _ = Arc::strong_count(&t);
});
