//! What the integration tests share.

use nvmf_tcp::pdu::{self, common_header, Framing, IcReq, PduType};
use zerocopy::IntoBytes;

/// No digests, 4-byte data alignment.
pub const PLAIN: Framing = Framing { hdgst: false, ddgst: false, data_align: 4 };

/// An ICReq (PFV 0, HPDA 0, no digests) as `edit` leaves it, encoded.
pub fn icreq_bytes(edit: impl FnOnce(&mut IcReq)) -> Vec<u8> {
    let mut req = IcReq {
        ch: common_header(PduType::IC_REQ, 0),
        pfv: 0.into(),
        hpda: 0,
        dgst: 0,
        maxr2t: 0.into(),
        rsvd: [0; 112],
    };
    edit(&mut req);
    let mut bytes = Vec::new();
    pdu::encode(&mut bytes, req.as_bytes(), &[], PLAIN);
    bytes
}
