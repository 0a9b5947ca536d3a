//! `nvmf_tcp::pdu::deframe` on arbitrary bytes.
//!
//! Input: byte 0 picks the framing (bit 0 header digest, bit 1 data digest,
//! bits 2..7 the PDA), byte 1 the per-type data limit, the rest is the
//! receive buffer. Never panics; a framed PDU must lie inside the buffer,
//! have HLEN header bytes and its data between header and PLEN (at PDO,
//! or right after the header for a terminate PDU); every
//! proper prefix of it must be "need more bytes"; and re-encoding its header
//! and data must frame again to the same header and data.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvmf_tcp::pdu::{self, Framing};

const LIMITS: [u32; 4] = [0, 64, 8192, u32::MAX];

fuzz_target!(|input: &[u8]| {
    let [sel, lim, buf @ ..] = input else {
        return;
    };
    let framing = Framing { hdgst: sel & 1 != 0, ddgst: sel & 2 != 0, data_align: pdu::pda_bytes(sel >> 2) };
    let limit = LIMITS[usize::from(lim & 3)];
    let Some(Ok(f)) = pdu::deframe(buf, framing, |_| Some(limit)) else {
        return;
    };

    // Where the frame's pieces sit in the buffer.
    assert!(f.len <= buf.len(), "frame len {} > buffer {}", f.len, buf.len());
    assert_eq!(f.len, f.ch.plen.get() as usize, "len is PLEN");
    let hlen = f.pdu_type.hlen().expect("framed type has an HLEN");
    assert_eq!(f.header.len(), usize::from(hlen));
    assert_eq!(f.ch.hlen, hlen);
    assert_eq!(f.header.as_ptr(), buf.as_ptr(), "header starts the PDU");
    let data_off = (f.data.as_ptr() as usize).wrapping_sub(buf.as_ptr() as usize);
    if !f.data.is_empty() {
        assert!(data_off >= usize::from(hlen), "data overlaps the header");
        assert!(data_off + f.data.len() <= f.len, "data beyond PLEN");
        if f.pdu_type.carries_digests() {
            assert_eq!(data_off, usize::from(f.ch.pdo), "data starts at PDO");
            assert_eq!(data_off % framing.data_align as usize, 0, "PDO aligned");
        } else {
            // A terminate PDU's data follows its header, whatever PDO says.
            assert_eq!(data_off, usize::from(hlen), "terminate data starts at HLEN");
        }
    }
    assert!(f.data.len() as u64 <= u64::from(limit), "data over the limit");

    // Every proper prefix is incomplete, never an error.
    for cut in [0, 7, 8, f.len / 2, f.len.saturating_sub(1)] {
        if cut < f.len {
            let prefix = &buf[..cut];
            assert!(
                pdu::deframe(prefix, framing, |_| Some(limit)).is_none(),
                "prefix of {cut} of a {}-byte PDU was decided",
                f.len
            );
        }
    }

    // Re-encode and frame again: same header (but PDO/PLEN) and data.
    let mut out = Vec::new();
    pdu::encode(&mut out, f.header, f.data, framing);
    let g = pdu::deframe(&out, framing, |_| Some(limit))
        .expect("re-encoded PDU is complete")
        .unwrap_or_else(|e| panic!("re-encoded PDU rejected: {e}"));
    assert_eq!(g.len, out.len());
    assert_eq!(g.data, f.data);
    assert!(g.data_digest_ok);
    assert_eq!(g.header[..3], f.header[..3]);
    assert_eq!(g.header[8..], f.header[8..]);
});
