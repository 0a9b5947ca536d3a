//! What hosts other than Linux's send: wire-level cases the kernel host
//! never produces.

use nvmf_tcp::pdu::{common_header, PduType, TermReq};
use nvmf_tcp::target::{Event, State, TargetConfig, TargetConnection};
use zerocopy::IntoBytes;

mod common;
use common::icreq_bytes;

type Target = TargetConnection<Vec<u8>>;

fn ready() -> Target {
    let bytes = icreq_bytes(|_| {});
    let mut t = Target::new(TargetConfig::default());
    t.handle_input(&bytes).expect("icreq");
    let mut sink = Vec::new();
    t.take_transmit(&mut sink);
    assert_eq!(t.state(), State::Ready);
    t
}

/// SPDK's host (lib/nvme/nvme_tcp.c nvme_tcp_qpair_send_h2c_term_req)
/// memsets the PDU, sets HLEN 24 and PLEN 24 + the copied header, and
/// leaves PDO 0: the echoed header follows the 24-byte header directly
/// (SPDK's own target reads it at HLEN, not PDO). The target must take it
/// as the host's termination, not answer it with a C2HTermReq of its own.
#[test]
fn h2c_term_req_with_pdo_zero_ends_the_connection_quietly() {
    let mut t = ready();
    let term = TermReq { ch: common_header(PduType::H2C_TERM_REQ, 0), fes: 1.into(), fei: 3.into(), rsvd: [0; 10] };
    let echoed = [0x07u8, 0, 24, 0, 24, 0, 0, 0]; // a header the host refused
    let mut bytes = term.as_bytes().to_vec();
    bytes.extend_from_slice(&echoed);
    bytes[3] = 0; // PDO, as SPDK leaves it
    let plen = bytes.len() as u32;
    bytes[4..8].copy_from_slice(&plen.to_le_bytes());
    let r = t.handle_input(&bytes);
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    assert!(r.is_ok(), "H2CTermReq refused: {r:?}");
    assert!(out.is_empty(), "a C2HTermReq answered the host's H2CTermReq: {out:02x?}");
    assert!(matches!(t.poll_event(), Some(Event::HostTerminated { fes: 1, malformed: None })));
}

/// An H2CTermReq header with `hlen` and `plen` and FES 1, and nothing after.
fn term_req_header(hlen: u8, plen: u32) -> Vec<u8> {
    let mut term = TermReq { ch: common_header(PduType::H2C_TERM_REQ, 0), fes: 1.into(), fei: 4.into(), rsvd: [0; 10] };
    term.ch.hlen = hlen;
    term.ch.plen = plen.into();
    term.as_bytes().to_vec()
}

/// NVMe/TCP 7.4.7: a terminate request with an invalid length ends the
/// connection at once, with nothing reported; and a controller never
/// answers an H2CTermReq with a C2HTermReq. The target waits for none of
/// the bytes such a PLEN announces.
#[test]
fn a_malformed_h2c_term_req_is_never_answered_and_nothing_waits_for_it() {
    for (hlen, plen) in [(24u8, 153u32), (24, 1 << 30), (24, u32::MAX), (24, 20), (8, 24), (128, 152)] {
        for before_icreq in [false, true] {
            let mut t = if before_icreq { Target::new(TargetConfig::default()) } else { ready() };
            let r = t.handle_input(&term_req_header(hlen, plen));
            let mut out = Vec::new();
            t.take_transmit(&mut out);
            let case = format!("hlen {hlen} plen {plen}, before ICReq {before_icreq}");
            assert!(out.is_empty(), "{case}: a C2HTermReq answered the host's H2CTermReq: {out:02x?}");
            assert!(r.is_ok(), "{case}: the host's termination is no fatal error of ours: {r:?}");
            assert_eq!(t.state(), State::Terminated, "{case}: the connection ends at once");
            let Some(Event::HostTerminated { fes: 1, malformed: Some(why) }) = t.poll_event() else {
                panic!("{case}: no HostTerminated naming what was wrong");
            };
            let field = if hlen == 24 { format!("plen {plen}") } else { format!("hlen {hlen}") };
            assert!(why.contains(&field), "{case}: {why}");
        }
    }
}

/// A valid H2CTermReq cut anywhere ends the connection once it is whole,
/// whatever the state, and is never answered.
#[test]
fn a_valid_h2c_term_req_cut_anywhere_ends_the_connection_quietly() {
    let mut bytes = term_req_header(24, 24 + 72);
    bytes.extend_from_slice(&[0x04; 72]); // the host's echo of our header
    for cut in [1, 7, 8, 23, 24, 95] {
        for before_icreq in [false, true] {
            let mut t = if before_icreq { Target::new(TargetConfig::default()) } else { ready() };
            for piece in bytes.chunks(cut) {
                t.handle_input(piece).expect("not an error");
            }
            let mut out = Vec::new();
            t.take_transmit(&mut out);
            assert!(out.is_empty(), "cut {cut}: answered");
            assert_eq!(t.state(), State::Terminated, "cut {cut}");
            assert!(matches!(t.poll_event(), Some(Event::HostTerminated { fes: 1, malformed: None })), "cut {cut}");
        }
    }
}
