//! What hosts other than Linux's send: wire-level cases the kernel host
//! never produces.

use nvmf_tcp::pdu::{self, common_header, Framing, IcReq, PduType, TermReq};
use nvmf_tcp::target::{Event, State, TargetConfig, TargetConnection};
use zerocopy::IntoBytes;

type Target = TargetConnection<Vec<u8>>;
const PLAIN: Framing = Framing { hdgst: false, ddgst: false, data_align: 4 };

fn ready() -> Target {
    let req = IcReq {
        ch: common_header(PduType::IC_REQ, 0),
        pfv: 0.into(),
        hpda: 0,
        dgst: 0,
        maxr2t: 0.into(),
        rsvd: [0; 112],
    };
    let mut bytes = Vec::new();
    pdu::encode(&mut bytes, req.as_bytes(), &[], PLAIN);
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
    assert!(matches!(t.poll_event(), Some(Event::HostTerminated { fes: 1 })));
}
