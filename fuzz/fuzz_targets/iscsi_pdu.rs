//! The iSCSI PDU decoders (`iscsi::pdu`: `deframe`, `Bhs` fields, AHS
//! entries) and the login/text key=value decoders (`iscsi::text::parse`,
//! `parse_unique`, `negotiate`; `iscsi::chap::decode_binary` on the values).
//!
//! Input: byte 0 selects: bit 0 header digest, bit 1 data digest, bits 2-3
//! MaxRecvDataSegmentLength (512, 8192, 65536, 2^24-1), bit 4 a discovery
//! session for `negotiate`, bit 7 text mode. In PDU mode the rest is
//! received bytes, deframed PDU after PDU, and the data segment of each
//! framed PDU also goes through the text decoders; in text mode the rest
//! is one text data segment.
//!
//! Never panics. A framed PDU lies within the buffer, every shorter prefix
//! of it is "incomplete", it re-encodes to the same header, AHS and data
//! (byte for byte when its padding was zero and its digests matched), its
//! AHS entries tile the AHS, and writing back any BHS field read leaves
//! the BHS unchanged. Parsed text re-encodes to text that parses the same;
//! `parse_unique` accepts exactly what `parse` accepts without a repeated
//! key; every answer `negotiate` gives is a valid `key=value`, numeric
//! answers within what the target offered; a CHAP binary value decodes
//! back from its hex encoding.
#![no_main]

use iscsi::pdu::{self, Bhs, Framing, Stage};
use iscsi::target::TargetConfig;
use iscsi::text::{self, Answer, KeyKind, Params, SessionType};
use libfuzzer_sys::fuzz_target;

/// Writing back every field read leaves the BHS as it was.
fn bhs_fields_round_trip(b: &Bhs) {
    let mut c = *b;
    c.set_flags(b.flags()).set_byte2(b.byte2()).set_byte3(b.byte3());
    c.set_data_segment_length(b.data_segment_length());
    c.set_lun(b.lun());
    c.set_itt(b.itt()).set_ttt(b.ttt()).set_cmd_sn(b.cmd_sn()).set_exp_stat_sn(b.exp_stat_sn());
    c.set_max_cmd_sn(b.max_cmd_sn()).set_data_sn(b.data_sn()).set_buffer_offset(b.buffer_offset());
    c.set_residual_count(b.residual_count());
    let cdb = b.cdb().to_vec();
    c.set_cdb(&cdb);
    c.set_cid(b.cid()).set_isid(b.isid()).set_tsih(b.tsih());
    c.set_time2(b.time2wait(), b.time2retain());
    assert_eq!(&c, b, "a BHS field does not round-trip");
    // The immediate bit's setter keeps the opcode and clears the reserved
    // bit 7 of byte 0.
    let mut i = *b;
    i.set_immediate(b.immediate());
    assert_eq!((i.opcode(), i.immediate(), i.0.get(1..)), (b.opcode(), b.immediate(), b.0.get(1..)));
    // The login flags as the accessors see them.
    let mut l = *b;
    let f = b.flags();
    l.set_login_flags(f & 0x80 != 0, f & 0x40 != 0, b.csg(), b.nsg());
    assert_eq!((l.csg(), l.nsg()), (b.csg(), b.nsg()));
    assert!(b.csg().0 <= 3 && b.nsg().0 <= 3 && Stage::FULL_FEATURE.0 == 3);
    let _ = (b.opcode(), b.final_bit(), b.total_ahs_len_bytes(), b.login_status());
    let _ = (b.expected_data_transfer_length(), b.referenced_task_tag(), b.stat_sn(), b.exp_cmd_sn());
    let _ = (b.ref_cmd_sn(), b.bidi_read_residual_count());
}

fn check_text(data: &[u8], session: SessionType) {
    let parsed = text::parse(data);
    let unique = text::parse_unique(data);
    let Ok(pairs) = parsed else {
        assert!(unique.is_err(), "parse_unique accepted what parse refused");
        return;
    };
    let mut seen = std::collections::HashSet::new();
    let repeated = !pairs.iter().all(|(k, _)| seen.insert(k.as_str()));
    assert_eq!(unique.is_err(), repeated, "parse_unique disagrees with parse on repeated keys");
    let again = text::parse(&text::encode(&pairs)).expect("re-encoded text parses");
    assert_eq!(again, pairs, "text does not round-trip");

    let ours = TargetConfig::default().params;
    let mut result = Params::default();
    for (k, v) in &pairs {
        let answer = text::negotiate(k, v, &ours, &mut result, session);
        if let Some(t) = answer.text() {
            let mut out = Vec::new();
            text::push(&mut out, k, t);
            assert_eq!(text::parse(&out).expect("an answer parses"), vec![(k.clone(), t.to_string())]);
        }
        if let (Answer::Value(a), Some(KeyKind::Min(lo, hi) | KeyKind::Max(lo, hi))) = (&answer, text::key_kind(k)) {
            let n: u32 = a.parse().expect("a numeric answer is decimal");
            assert!((lo..=hi).contains(&n), "{k}={a} outside {lo}..={hi}");
        }
        if let Some(bytes) = iscsi::chap::decode_binary(v) {
            let hex = iscsi::chap::encode_hex(&bytes);
            assert_eq!(iscsi::chap::decode_binary(&hex), Some(bytes), "binary value {v:?}");
        }
    }
    let r = &result;
    assert!(r.max_burst_length <= ours.max_burst_length.max(Params::default().max_burst_length));
    assert!(r.first_burst_length <= ours.first_burst_length.max(Params::default().first_burst_length));
}

fn check_pdus(mut buf: &[u8], framing: Framing, session: SessionType) {
    while let Some(r) = pdu::deframe(buf, framing) {
        let f = match r {
            Ok(f) => f,
            Err(e) => {
                assert!(!e.field.is_empty() && !e.detail.is_empty());
                return;
            }
        };
        assert!(f.len >= pdu::BHS_LEN && f.len <= buf.len(), "frame of {} in {}", f.len, buf.len());
        assert!(f.data.len() <= framing.max_data_segment as usize);
        let whole = buf.get(..f.len).expect("frame within the buffer");
        for cut in [f.len - 1, f.len / 2, pdu::BHS_LEN] {
            if cut < f.len {
                assert!(pdu::deframe(buf.get(..cut).unwrap_or_default(), framing).is_none(), "prefix {cut} framed");
            }
        }
        bhs_fields_round_trip(&f.bhs);

        let entries = pdu::ahs_entries(f.ahs);
        let tiled: usize = entries.iter().map(|(ty, body)| pdu::ahs_entry(*ty, body).len()).sum();
        assert_eq!(tiled, f.ahs.len(), "AHS entries do not tile the AHS");

        let mut out = Vec::new();
        pdu::encode(&mut out, &f.bhs, f.ahs, f.data, framing);
        let g = pdu::deframe(&out, framing).expect("re-encoded PDU complete").expect("re-encoded PDU frames");
        assert_eq!((g.bhs, g.ahs, g.data, g.len), (f.bhs, f.ahs, f.data, f.len));
        assert!(g.data_digest_ok);
        let hd = if framing.header_digest { 4 } else { 0 };
        let pad_start = pdu::BHS_LEN + f.ahs.len() + hd + f.data.len();
        let pad = whole.get(pad_start..pad_start + pdu::pad_len(f.data.len())).unwrap_or_default();
        if f.data_digest_ok && pad.iter().all(|&b| b == 0) {
            assert_eq!(out, whole, "PDU does not re-encode byte for byte");
        }

        check_text(f.data, session);
        buf = buf.get(f.len..).unwrap_or_default();
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&sel, rest)) = input.split_first() else {
        return;
    };
    let session = if sel & 0x10 != 0 { SessionType::Discovery } else { SessionType::Normal };
    if sel & 0x80 != 0 {
        check_text(rest, session);
        return;
    }
    let framing = Framing {
        header_digest: sel & 1 != 0,
        data_digest: sel & 2 != 0,
        max_data_segment: [512, 8192, 65536, 0x00ff_ffff][usize::from(sel >> 2) & 3],
    };
    check_pdus(rest, framing, session);
});
