//! A whole controller-side NVMe/RDMA queue (`nvmf_rdma::TargetQueue`: the
//! MPA request and its CM private data, command capsules as Sends, keyed
//! SGLs, write data fetched with RDMA Reads) fed a hostile host's bytes.
//!
//! Input: byte 0 configures the queue (bit 0 CRC on, bit 1 small limits: a
//! 4 KiB read budget, 512 bytes in-capsule, 16 KiB per command, 64-byte
//! FPDUs; bit 2 call `set_queue` once accepted, bit 3 with SQ flow control
//! disabled; bit 4 answer each command a chunk late; bit 5 receive write
//! data straight into its buffer (`take_direct` / `placed`) wherever a
//! chunk starts inside an RDMA Read Response's payload, as the daemon
//! does; bit 6 feed chunks with `handle_input_lent`), byte 1 seeds where
//! the rest is cut into receive chunks. Behind the queue sits a tiny
//! controller: a command whose SGL `check_sgl` refuses is answered with
//! that status; write-like commands with keyed data have it fetched
//! (`request_data`), and with late answers some of those fetches are given
//! up on the next chunk if still waiting (`cancel_data`); read-like commands are answered with data in each of
//! the four ways the daemon has (copied, from the buffer, zeros, filled in
//! place); the rest with success.
//!
//! Never panics; a fatal error leaves the queue closed; once closed, input
//! is ignored (no events, no bytes); lent in-capsule data lies inside the
//! chunk it was lent from; write data arrives once per fetch, as long as
//! asked for; the bytes held for RDMA Reads stay within the budget (or one
//! read's length).
#![no_main]

use ironwire_fuzz::chunks;
use libfuzzer_sys::fuzz_target;
use nvme_spec::queue::DataDirection;
use nvme_spec::{Cqe, Sqe, Status};
use nvmf_rdma::target::{Event, TargetConfig, TargetQueue};

/// What the tiny controller still owes a command it answers late.
enum Owed {
    /// A completion with this status.
    Answer(Status),
    /// Read data of this length, then success.
    Read(u32),
    /// Nothing yet: its write data is being fetched; give it up if that
    /// read is still waiting to be issued.
    Cancel,
}

fuzz_target!(|input: &[u8]| {
    let [cfg, seed, stream @ ..] = input else {
        return;
    };
    let small = cfg & 2 != 0;
    let tc = TargetConfig {
        crc: cfg & 1 != 0,
        ord: 4,
        max_in_capsule: if small { 512 } else { 8192 },
        max_transfer: if small { 16 * 1024 } else { 256 * 1024 },
        max_queue_entries: 64,
        max_segment: if small { 64 } else { 61440 },
        read_buffer: if small { 4096 } else { 64 * 1024 },
    };
    let mut t = TargetQueue::<Vec<u8>>::new(tc);
    let (late, direct, lend) = (cfg & 16 != 0, cfg & 32 != 0, cfg & 64 != 0);
    // Fetches in flight by CID, and commands whose answer waits a chunk.
    let mut fetching: Vec<(u16, u32)> = Vec::new();
    let mut owed: Vec<(u16, Owed)> = Vec::new();
    let mut tx = Vec::new();
    for chunk in chunks(stream, *seed, 97) {
        let before = t.is_closed();
        // Answers owed from the last chunk go out before this one is read.
        for (cid, o) in std::mem::take(&mut owed) {
            match o {
                Owed::Answer(s) => t.send_response(Cqe::new(cid, s, 0)),
                Owed::Read(len) => read_reply(&mut t, cid, len),
                Owed::Cancel => {
                    if t.cancel_data(cid) {
                        fetching.retain(|&(c, _)| c != cid);
                        t.send_response(Cqe::new(cid, Status::ABORT_REQUESTED, 0));
                    }
                }
            }
        }
        let mut rest = chunk;
        let mut r = Ok(());
        while direct && r.is_ok() && !rest.is_empty() && t.direct_len() > 0 {
            let Some((mut buf, off, len)) = t.take_direct() else { break };
            assert!(off.checked_add(len).is_some_and(|end| end <= buf.len()), "sink {off}+{len} beyond {}", buf.len());
            let n = len.min(rest.len());
            buf[off..off + n].copy_from_slice(&rest[..n]);
            rest = &rest[n..];
            r = t.placed(buf, n);
        }
        if r.is_ok() && !rest.is_empty() {
            r = if lend { t.handle_input_lent(rest) } else { t.handle_input(rest) };
        }
        if before {
            assert!(r.is_ok(), "closed queue returned {r:?}");
            assert!(t.poll_event().is_none(), "event after close");
            assert_eq!(t.transmit_len(), 0, "bytes queued after close");
        }
        if let Err(e) = &r {
            assert!(t.is_closed(), "fatal {e} left it open");
            assert!(!e.reason.is_empty());
        }
        while let Some(ev) = t.poll_event() {
            match ev {
                Event::Accepted { qid, entries, .. } => {
                    assert!(entries >= 2 && entries <= if qid == 0 { 32 } else { 64 }, "{entries} entries");
                    if cfg & 4 != 0 {
                        t.set_queue(qid, entries - 1, cfg & 8 != 0);
                    }
                }
                Event::Command { sqe, data } => {
                    command(&mut t, &sqe, data.as_ref().map(Vec::len), late, &mut owed, &mut fetching)
                }
                Event::CommandInInput { sqe, data } => {
                    assert!(lend, "lent data from a copied input");
                    assert!(rest.get(data.clone()).is_some(), "lent {data:?} outside a {}-byte input", rest.len());
                    command(&mut t, &sqe, Some(data.len()), late, &mut owed, &mut fetching);
                }
                Event::Data { cid, data } => {
                    let at = fetching.iter().position(|&(c, _)| c == cid).expect("data nobody fetched");
                    let (_, len) = fetching.swap_remove(at);
                    assert_eq!(data.len(), len as usize, "write data for a fetch of {len}");
                    t.send_response(Cqe::new(cid, Status::SUCCESS, 0));
                }
                Event::Refused { reason } | Event::ConnectMismatch { reason } => assert!(!reason.is_empty()),
                Event::HostTerminated(_) | Event::CidConflict { .. } => {}
                Event::Withdrawn { sqe } => panic!("cid {} withdrawn, though nothing asked", sqe.cid.get()),
            }
        }
        t.keep_input(rest);
        let budget = u64::from(tc.read_buffer.max(tc.max_transfer));
        assert!(t.read_bytes() <= budget, "{} bytes held for reads", t.read_bytes());
        t.take_transmit(&mut tx);
        tx.clear();
    }
});

/// Answers a command the way the daemon would, at once or (`late`) on the
/// next chunk.
fn command(
    t: &mut TargetQueue<Vec<u8>>,
    sqe: &Sqe,
    in_capsule: Option<usize>,
    late: bool,
    owed: &mut Vec<(u16, Owed)>,
    fetching: &mut Vec<(u16, u32)>,
) {
    let cid = sqe.cid.get();
    let o = match t.check_sgl(sqe, in_capsule) {
        Err(s) => Owed::Answer(s),
        Ok(len) if len > 0 && in_capsule.is_none() && sqe.data_direction() == DataDirection::HostToController => {
            t.request_data(cid, len);
            fetching.push((cid, len));
            if !(late && cid & 8 != 0) {
                return;
            }
            Owed::Cancel
        }
        Ok(len) if len > 0 && sqe.data_direction() == DataDirection::ControllerToHost => Owed::Read(len),
        Ok(_) => Owed::Answer(Status::SUCCESS),
    };
    match o {
        _ if late => owed.push((cid, o)),
        Owed::Answer(s) => t.send_response(Cqe::new(cid, s, 0)),
        Owed::Read(len) => read_reply(t, cid, len),
        Owed::Cancel => {}
    }
}

/// Read data for `cid`, sent one of the four ways by its CID.
fn read_reply(t: &mut TargetQueue<Vec<u8>>, cid: u16, len: u32) {
    let ok = Cqe::new(cid, Status::SUCCESS, 0);
    let len = len as usize;
    match cid % 4 {
        0 => t.send_data(cid, &vec![0xa5; len], ok),
        1 => t.send_data_from(cid, vec![0x5a; len], ok),
        2 if t.send_zeros(cid, len, ok) => {}
        3 if t.send_data_with(cid, len, ok, |out| {
            out.extend_from_slice(&vec![0x3c; len]);
            true
        }) => {}
        _ => t.send_data(cid, &vec![0x66; len], ok),
    }
}
