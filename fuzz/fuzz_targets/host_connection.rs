//! A whole host-side NVMe/TCP connection fed a hostile controller's bytes.
//!
//! Input: byte 0 configures the host (bit 0 header digest, bit 1 data
//! digest, bit 2 submit the commands only once ICResp arrived instead of
//! up front), byte 1 seeds where the rest is cut into receive chunks.
//! Three commands are outstanding: a 4 KiB read (cid 1), an in-capsule
//! 512-byte write (cid 2) and a 16 KiB write that waits for R2T (cid 3).
//!
//! Never panics; once terminated (framing error or C2HTermReq), input is
//! ignored; everything the host sends is well-formed
//! PDUs in the framing in effect when it was sent.
#![no_main]

use ironwire_fuzz::{check_stream, chunks, pattern};
use libfuzzer_sys::fuzz_target;
use nvme_spec::Sqe;
use nvmf_tcp::host::{HostConfig, HostConnection};

fn sqe(opcode: u8, cid: u16) -> Sqe {
    let mut s = Sqe { opcode, ..Default::default() };
    s.cid = cid.into();
    s.nsid = 1.into();
    s
}

fn submit(h: &mut HostConnection) {
    h.submit(sqe(0x02, 1), Vec::new(), 4096);
    h.submit(sqe(0x01, 2), pattern(512), 0);
    h.submit(sqe(0x01, 3), pattern(16 * 1024), 0);
}

fn flush(h: &mut HostConnection) {
    let framing = h.tx_framing();
    let mut out = Vec::new();
    h.take_transmit(&mut out);
    if let Err(e) = check_stream(&out, framing) {
        panic!("host sent malformed bytes: {e}");
    }
}

fuzz_target!(|input: &[u8]| {
    let [cfg, seed, stream @ ..] = input else {
        return;
    };
    let mut h = HostConnection::new(HostConfig {
        header_digest: cfg & 1 != 0,
        data_digest: cfg & 2 != 0,
        max_in_capsule: 8192,
    });
    flush(&mut h); // the ICReq
    let late = cfg & 4 != 0;
    let mut submitted = false;
    if !late {
        submit(&mut h);
        submitted = true;
        flush(&mut h);
    }
    let mut completions = 0usize;
    for chunk in chunks(stream, *seed, 131) {
        let was_terminated = h.is_terminated();
        let r = h.handle_input(chunk);
        if was_terminated {
            assert!(r.is_ok(), "terminated connection returned {r:?}");
            assert!(!h.has_transmit(), "bytes queued after termination");
        }
        let failed = r.is_err();
        while let Some(c) = h.poll_completion() {
            assert!(!was_terminated, "completion after termination");
            let _ = c.data.len();
            completions += 1;
        }
        flush(&mut h);
        // A fatal error from a PDU's contents (unknown CID, bad R2T, ...)
        // returns Err without marking the connection terminated; the driver
        // (initiator::queue) drops the connection then, so stop feeding.
        // Framing errors and C2HTermReq do terminate: keep feeding those to
        // check later input is ignored.
        if failed && !h.is_terminated() {
            break;
        }
        if !submitted && h.is_ready() && !h.is_terminated() {
            submit(&mut h);
            submitted = true;
            flush(&mut h);
        }
    }
    let _ = (completions, h.outstanding());
});
