//! A whole target-side NVMe/TCP connection fed hostile host bytes.
//!
//! Input: byte 0 configures the target (bits 0-1 CPDA, bit 2 a small
//! MAXH2CDATA/in-capsule limit, bit 3 SQ flow control disabled, bit 4 call
//! `set_queue` as if Connect succeeded), byte 1 seeds where the rest is cut
//! into receive chunks (its low bit feeds them with `handle_input_lent`,
//! as the daemon does, and bit 1 holds read responses behind their batch's
//! data, as a busy reactor does). After each chunk the events are served like a tiny
//! controller would (R2T for writes, C2HData for reads, responses), lent
//! data found inside that chunk; then `keep_input`.
//!
//! Never panics; a fatal error leaves the connection terminated; once
//! terminated, input is ignored (no events, no bytes); everything the
//! target sends is a sequence of well-formed PDUs.
#![no_main]

use ironwire_fuzz::{check_stream, chunks, serve};
use libfuzzer_sys::fuzz_target;
use nvmf_tcp::pdu::{Framing, PduType};
use nvmf_tcp::target::{State, TargetConfig, TargetConnection};

fuzz_target!(|input: &[u8]| {
    let [cfg, seed, stream @ ..] = input else {
        return;
    };
    let small = cfg & 4 != 0;
    let mut t = TargetConnection::<Vec<u8>>::new(TargetConfig {
        max_h2c_data: if small { 4096 } else { 64 * 1024 },
        max_in_capsule: if small { 512 } else { 8192 },
        max_transfer: if small { 16 * 1024 } else { 256 * 1024 },
        cpda: cfg & 3,
        ..TargetConfig::default()
    });
    if cfg & 16 != 0 {
        t.set_queue(u16::from(cfg >> 5), 31, cfg & 8 != 0);
    }
    t.set_hold(seed & 2 != 0);
    let mut tx = Vec::new();
    // The ICResp goes out before digests are on; everything after it uses
    // the negotiated framing, so check the two parts separately.
    let mut pre_ready = Vec::new();
    for chunk in chunks(stream, *seed, 97) {
        let before = t.state();
        let lend = seed & 1 != 0;
        let r = if lend { t.handle_input_lent(chunk) } else { t.handle_input(chunk) };
        match (before, &r) {
            (State::Terminated, r) => {
                assert!(r.is_ok(), "terminated connection returned {r:?}");
                assert!(t.poll_event().is_none(), "event after termination");
                assert!(!t.has_transmit(), "bytes queued after termination");
            }
            (_, Err(e)) => {
                assert_eq!(t.state(), State::Terminated, "fatal {e} left it running");
                assert!(!e.reason.is_empty());
                assert!(e.header.len() <= 128);
            }
            _ => {}
        }
        let served = serve(&mut t, 64 * 1024, lend.then_some(chunk));
        t.keep_input(chunk);
        if before == State::Terminated {
            assert_eq!(served, 0);
        }
        if before == State::AwaitIcReq {
            t.take_transmit(&mut pre_ready);
        } else {
            t.take_transmit(&mut tx);
        }
    }
    // pre_ready holds the ICResp (plain framing) and possibly, when the
    // ICReq and later PDUs came in the same chunk, PDUs in the negotiated
    // framing; a C2HTermReq never carries digests.
    let plain = Framing { hdgst: false, ddgst: false, data_align: 4 };
    let (hd, dd) = t.digests();
    let negotiated = Framing { hdgst: hd, ddgst: dd, data_align: 4 };
    if pre_ready.first() == Some(&PduType::IC_RESP.0) {
        let ic_len = 128;
        assert!(pre_ready.len() >= ic_len);
        check_stream(&pre_ready[..ic_len], plain).expect("ICResp well-formed");
        pre_ready.drain(..ic_len);
    }
    pre_ready.extend_from_slice(&tx);
    if let Err(e) = check_stream(&pre_ready, negotiated) {
        panic!("target sent malformed bytes: {e}");
    }
});
