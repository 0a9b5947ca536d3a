//! NVMe/TCP PDU layouts (TP 8000 section 7.4) and the deframer.
//!
//! Every PDU starts with the 8-byte common header; each type has a fixed
//! header length (HLEN), an optional header digest, padding up to PDO, data,
//! and an optional data digest. [`deframe`] validates one PDU's framing and
//! returns `None` while bytes are missing, `Err` when the peer broke the
//! framing rules (naming the field's offset), or the framed PDU.

use crate::digest;
use crate::error::{Fatal, Fes};
use checksum::{Appender, Crc32c};
use nvme_spec::{Cqe, Sqe};
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// A PDU type (TP 8000 figure 22), open so unknown values survive decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PduType(pub u8);

impl PduType {
    /// Initialize Connection Request.
    pub const IC_REQ: PduType = PduType(0x00);
    /// Initialize Connection Response.
    pub const IC_RESP: PduType = PduType(0x01);
    /// Host to Controller Terminate Connection Request.
    pub const H2C_TERM_REQ: PduType = PduType(0x02);
    /// Controller to Host Terminate Connection Request.
    pub const C2H_TERM_REQ: PduType = PduType(0x03);
    /// Command Capsule.
    pub const CAPSULE_CMD: PduType = PduType(0x04);
    /// Response Capsule.
    pub const CAPSULE_RESP: PduType = PduType(0x05);
    /// Host to Controller Data.
    pub const H2C_DATA: PduType = PduType(0x06);
    /// Controller to Host Data.
    pub const C2H_DATA: PduType = PduType(0x07);
    /// Ready to Transfer.
    pub const R2T: PduType = PduType(0x09);

    /// The fixed header length of this type, or `None` for an unknown type.
    pub fn hlen(self) -> Option<u8> {
        Some(match self {
            Self::IC_REQ | Self::IC_RESP => 128,
            Self::H2C_TERM_REQ | Self::C2H_TERM_REQ => 24,
            Self::CAPSULE_CMD => 72,
            Self::CAPSULE_RESP => 24,
            Self::H2C_DATA | Self::C2H_DATA | Self::R2T => 24,
            _ => return None,
        })
    }

    /// The longest PLEN a PDU of this type may have whatever was
    /// negotiated: ICReq and ICResp are their header alone, a terminate
    /// request its header and at most 128 bytes of the header it refuses
    /// (NVMe-oF 1.1 section 7.4.7). `None` when the limit is the
    /// connection's.
    pub fn max_plen(self) -> Option<u32> {
        Some(match self {
            Self::IC_REQ | Self::IC_RESP => 128,
            Self::H2C_TERM_REQ | Self::C2H_TERM_REQ => TERM_REQ_MAX_PLEN,
            _ => return None,
        })
    }

    /// Whether PDUs of this type carry digests when they are enabled
    /// (everything but the initialization and terminate PDUs).
    pub fn carries_digests(self) -> bool {
        !matches!(self, Self::IC_REQ | Self::IC_RESP | Self::H2C_TERM_REQ | Self::C2H_TERM_REQ)
    }
}

/// Common header flags (TP 8000 figure 21 and the per-type flag fields).
pub mod flags {
    /// Header digest present.
    pub const HDGSTF: u8 = 1 << 0;
    /// Data digest present.
    pub const DDGSTF: u8 = 1 << 1;
    /// Last PDU of a data transfer (H2CData, C2HData).
    pub const LAST_PDU: u8 = 1 << 2;
    /// C2HData: the command completed successfully, no CapsuleResp follows.
    pub const SUCCESS: u8 = 1 << 3;
}

/// ICReq/ICResp DGST field bits.
pub mod dgst {
    /// Header digest enable.
    pub const HEADER: u8 = 1 << 0;
    /// Data digest enable.
    pub const DATA: u8 = 1 << 1;
}

/// Field offsets used in terminate requests.
pub mod offset {
    /// Common header: PDU type.
    pub const PDU_TYPE: u32 = 0;
    /// Common header: flags.
    pub const FLAGS: u32 = 1;
    /// Common header: HLEN.
    pub const HLEN: u32 = 2;
    /// Common header: PDO.
    pub const PDO: u32 = 3;
    /// Common header: PLEN.
    pub const PLEN: u32 = 4;
    /// ICReq: PFV.
    pub const PFV: u32 = 8;
    /// ICReq: HPDA.
    pub const HPDA: u32 = 10;
    /// ICReq: DGST.
    pub const DGST: u32 = 11;
    /// H2CData: CCCID.
    pub const CCCID: u32 = 8;
    /// H2CData: TTAG.
    pub const TTAG: u32 = 10;
    /// H2CData: DATAO.
    pub const DATAO: u32 = 12;
    /// H2CData: DATAL.
    pub const DATAL: u32 = 16;
    /// CapsuleResp: the CQE's CID.
    pub const RESP_CID: u32 = 20;
}

/// The 8-byte common header (TP 8000 figure 21).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, PartialEq, Eq)]
#[repr(C)]
pub struct CommonHeader {
    /// PDU type.
    pub pdu_type: u8,
    /// Type-specific flags.
    pub flags: u8,
    /// PDU header length.
    pub hlen: u8,
    /// PDU data offset.
    pub pdo: u8,
    /// PDU length: header, digests, padding and data.
    pub plen: U32,
}

const _: () = assert!(core::mem::size_of::<CommonHeader>() == 8);

/// ICReq (TP 8000 figure 26).
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct IcReq {
    /// Common header.
    pub ch: CommonHeader,
    /// PDU format version (0).
    pub pfv: U16,
    /// Host PDU data alignment, (HPDA+1)*4 bytes.
    pub hpda: u8,
    /// Digests the host asks for.
    pub dgst: u8,
    /// Maximum outstanding R2Ts per command, 0-based.
    pub maxr2t: U32,
    /// Reserved.
    pub rsvd: [u8; 112],
}

const _: () = assert!(core::mem::size_of::<IcReq>() == 128);

/// ICResp (TP 8000 figure 27).
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct IcResp {
    /// Common header.
    pub ch: CommonHeader,
    /// PDU format version (0).
    pub pfv: U16,
    /// Controller PDU data alignment, (CPDA+1)*4 bytes.
    pub cpda: u8,
    /// Digests enabled.
    pub dgst: u8,
    /// Maximum data bytes in one H2CData PDU.
    pub maxh2cdata: U32,
    /// Reserved.
    pub rsvd: [u8; 112],
}

const _: () = assert!(core::mem::size_of::<IcResp>() == 128);

/// Command capsule header: common header plus the SQE.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct CapsuleCmd {
    /// Common header.
    pub ch: CommonHeader,
    /// Submission queue entry.
    pub sqe: Sqe,
}

const _: () = assert!(core::mem::size_of::<CapsuleCmd>() == 72);

/// Response capsule: common header plus the CQE.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct CapsuleResp {
    /// Common header.
    pub ch: CommonHeader,
    /// Completion queue entry.
    pub cqe: Cqe,
}

const _: () = assert!(core::mem::size_of::<CapsuleResp>() == 24);

/// H2CData and C2HData header (TP 8000 figures 29, 31).
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct DataHeader {
    /// Common header.
    pub ch: CommonHeader,
    /// Command capsule CID.
    pub cccid: U16,
    /// Transfer tag from the R2T (H2CData only).
    pub ttag: U16,
    /// Data offset within the command's data.
    pub datao: U32,
    /// Data length in this PDU.
    pub datal: U32,
    /// Reserved.
    pub rsvd: [u8; 4],
}

const _: () = assert!(core::mem::size_of::<DataHeader>() == 24);
const _: () = assert!(core::mem::offset_of!(DataHeader, ttag) == 10);

/// R2T header (TP 8000 figure 33).
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct R2t {
    /// Common header.
    pub ch: CommonHeader,
    /// Command capsule CID.
    pub cccid: U16,
    /// Transfer tag the host echoes in H2CData.
    pub ttag: U16,
    /// Offset of the requested data.
    pub r2to: U32,
    /// Length of the requested data.
    pub r2tl: U32,
    /// Reserved.
    pub rsvd: [u8; 4],
}

const _: () = assert!(core::mem::size_of::<R2t>() == 24);

/// H2CTermReq / C2HTermReq header (TP 8000 figures 28, 30).
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct TermReq {
    /// Common header.
    pub ch: CommonHeader,
    /// Fatal error status.
    pub fes: U16,
    /// Field error information.
    pub fei: U32,
    /// Reserved.
    pub rsvd: [u8; 10],
}

const _: () = assert!(core::mem::size_of::<TermReq>() == 24);

/// Largest header echoed in a terminate request (plen 152 at most).
pub const TERM_REQ_MAX_DATA: usize = 128;

/// Longest terminate request: its 24-byte header and the echoed header.
pub const TERM_REQ_MAX_PLEN: u32 = 24 + TERM_REQ_MAX_DATA as u32;

/// The data alignment in bytes a PDA field asks for: (PDA+1)*4, PDA 0..=31.
pub fn pda_bytes(pda: u8) -> u32 {
    (u32::from(pda) & 31).saturating_add(1).saturating_mul(4)
}

/// Framing parameters of one direction of a connection.
#[derive(Clone, Copy, Debug)]
pub struct Framing {
    /// Header digests are enabled.
    pub hdgst: bool,
    /// Data digests are enabled.
    pub ddgst: bool,
    /// Required alignment of PDU data offsets, in bytes (4..=128).
    pub data_align: u32,
}

/// A framed PDU borrowed from the receive buffer.
#[derive(Debug)]
pub struct Frame<'a> {
    /// The common header.
    pub ch: CommonHeader,
    /// The PDU type.
    pub pdu_type: PduType,
    /// The header bytes (HLEN bytes, common header included).
    pub header: &'a [u8],
    /// The data bytes (empty when the PDU carries none).
    pub data: &'a [u8],
    /// False when data digests are on and the data digest did not match.
    pub data_digest_ok: bool,
    /// Bytes this PDU occupied in the buffer.
    pub len: usize,
}

fn invalid(fei: u32, header: &[u8], reason: String) -> Fatal {
    Fatal {
        fes: Fes::INVALID_HEADER_FIELD,
        fei,
        reason,
        header: header.get(..header.len().min(TERM_REQ_MAX_DATA)).unwrap_or_default().to_vec(),
    }
}

/// Frames one PDU from the front of `buf`.
///
/// `max_data` gives the most data bytes a PDU of each type may carry in this
/// direction; an unknown or unexpected type has `None` and is rejected.
pub fn deframe<'a>(
    buf: &'a [u8],
    framing: Framing,
    max_data: impl Fn(PduType) -> Option<u32>,
) -> Option<Result<Frame<'a>, Fatal>> {
    let head = match deframe_head(buf, framing, max_data)? {
        Ok(Ok(head)) => head,
        Ok(Err(_)) => return None,
        Err(e) => return Some(Err(e)),
    };
    let pdu = buf.get(..head.len)?;
    let data_end = head.data_start.saturating_add(head.data_len);
    let data = pdu.get(head.data_start..data_end).unwrap_or_default();
    let data_digest_ok = if head.data_digest {
        pdu.get(data_end..data_end.saturating_add(digest::LEN)).unwrap_or_default() == digest::crc32c(data)
    } else {
        true
    };
    Some(Ok(Frame { ch: head.ch, pdu_type: head.pdu_type, header: head.header, data, data_digest_ok, len: head.len }))
}

/// The checked header of a PDU whose data may not all be there yet.
#[derive(Debug)]
pub struct Head<'a> {
    /// The common header.
    pub ch: CommonHeader,
    /// The PDU type.
    pub pdu_type: PduType,
    /// The header bytes (HLEN bytes, common header included).
    pub header: &'a [u8],
    /// Where the data starts in the PDU (PDO; the PDU's end without data).
    pub data_start: usize,
    /// Data bytes.
    pub data_len: usize,
    /// A data digest follows the data.
    pub data_digest: bool,
    /// Bytes of the whole PDU (PLEN).
    pub len: usize,
}

/// Checks the PDU at the front of `buf` as far as its data: every header
/// field, and the header digest. `None` until the common header is there;
/// `Ok(Err(n))` while `n` more bytes are needed to reach the data.
pub fn deframe_head(
    buf: &[u8],
    framing: Framing,
    max_data: impl Fn(PduType) -> Option<u32>,
) -> Option<Result<Result<Head<'_>, usize>, Fatal>> {
    let ch_bytes = buf.get(..8)?;
    let ch = CommonHeader::read_from_bytes(ch_bytes).ok()?;
    Some(head_checked(buf, ch, PduType(ch.pdu_type), framing, max_data))
}

fn head_checked(
    buf: &[u8],
    ch: CommonHeader,
    pdu_type: PduType,
    framing: Framing,
    max_data: impl Fn(PduType) -> Option<u32>,
) -> Result<Result<Head<'_>, usize>, Fatal> {
    let ch_bytes = buf.get(..8).unwrap_or_default();
    let (Some(hlen), Some(max_data)) = (pdu_type.hlen(), max_data(pdu_type)) else {
        return Err(invalid(offset::PDU_TYPE, ch_bytes, format!("PDU type {:#04x} not expected here", ch.pdu_type)));
    };
    if ch.hlen != hlen {
        return Err(invalid(
            offset::HLEN,
            ch_bytes,
            format!("hlen {} for PDU type {:#04x} (expected {hlen})", ch.hlen, ch.pdu_type),
        ));
    }
    let digests = pdu_type.carries_digests();
    let hd = if digests && framing.hdgst { digest::LEN as u32 } else { 0 };
    if digests && ((ch.flags & flags::HDGSTF != 0) != framing.hdgst) {
        return Err(invalid(
            offset::FLAGS,
            ch_bytes,
            format!("flags {:#04x}: HDGSTF disagrees with the negotiated header digest ({})", ch.flags, framing.hdgst),
        ));
    }
    let plen = ch.plen.get();
    let header_end = u32::from(hlen).saturating_add(hd);
    if plen < header_end {
        return Err(invalid(offset::PLEN, ch_bytes, format!("plen {plen} shorter than header {header_end}")));
    }
    // A PDU whose length the spec fixes has an invalid PLEN beyond it: no
    // data transfer limit is involved.
    if let Some(max) = pdu_type.max_plen().filter(|&max| plen > max) {
        return Err(invalid(
            offset::PLEN,
            ch_bytes,
            format!("plen {plen} for PDU type {:#04x} (at most {max})", ch.pdu_type),
        ));
    }
    let has_data = plen > header_end;
    let dd = if has_data && digests && framing.ddgst { digest::LEN as u32 } else { 0 };
    if digests && has_data && ((ch.flags & flags::DDGSTF != 0) != framing.ddgst) {
        return Err(invalid(
            offset::FLAGS,
            ch_bytes,
            format!("flags {:#04x}: DDGSTF disagrees with the negotiated data digest ({})", ch.flags, framing.ddgst),
        ));
    }
    // A terminate PDU (no digests) carries the offending header right
    // after its own: hosts leave PDO 0 there (SPDK's does, and SPDK's and
    // Linux's targets read the data at HLEN), so PDO is not checked.
    let data_start = if has_data && digests {
        let pdo = u32::from(ch.pdo);
        if pdo < header_end || pdo.checked_rem(framing.data_align) != Some(0) || pdo.saturating_add(dd) > plen {
            return Err(invalid(
                offset::PDO,
                ch_bytes,
                format!("pdo {pdo} (header ends at {header_end}, alignment {}, plen {plen})", framing.data_align),
            ));
        }
        pdo
    } else {
        header_end
    };
    let data_len = plen.saturating_sub(data_start).saturating_sub(dd);
    if data_len > max_data {
        return Err(Fatal {
            fes: Fes::DATA_LIMIT_EXCEEDED,
            // Reserved for this FES; the reason names PLEN.
            fei: 0,
            reason: format!(
                "plen {plen} carries {data_len} data bytes (limit {max_data} for PDU type {:#04x})",
                ch.pdu_type
            ),
            header: ch_bytes.to_vec(),
        });
    }
    let Ok(plen_usize) = usize::try_from(plen) else {
        return Err(invalid(offset::PLEN, ch_bytes, format!("plen {plen} too large")));
    };
    let head_len = data_start as usize;
    let Some(pdu) = buf.get(..head_len) else {
        return Ok(Err(head_len.saturating_sub(buf.len())));
    };
    let hlen_usize = usize::from(hlen);
    let header = pdu.get(..hlen_usize).unwrap_or_default();
    if hd != 0 {
        let got = pdu.get(hlen_usize..hlen_usize.saturating_add(digest::LEN)).unwrap_or_default();
        let want = digest::crc32c(header);
        if got != want {
            return Err(Fatal {
                fes: Fes::HEADER_DIGEST_ERROR,
                // For this FES, FEI carries the HDGST received.
                fei: got.try_into().map_or(0, u32::from_le_bytes),
                reason: format!("header digest {:02x?} (expected {:02x?}) on PDU type {:#04x}", got, want, ch.pdu_type),
                header: header.to_vec(),
            });
        }
    }
    Ok(Ok(Head {
        ch,
        pdu_type,
        header,
        data_start: head_len,
        data_len: data_len as usize,
        data_digest: dd != 0,
        len: plen_usize,
    }))
}

/// Appends a PDU to `out`: `header` (HLEN bytes, common header included, its
/// flags and PLEN/PDO are filled in here), header digest, padding to
/// `data_align`, `data`, data digest.
pub fn encode(out: &mut Vec<u8>, header: &[u8], data: &[u8], framing: Framing) {
    let mut dd = begin(out, header, data.len(), framing).then(Crc32c::new);
    Appender::new(out, dd.as_mut()).extend_from_slice(data);
    if let Some(d) = dd {
        out.extend_from_slice(&digest::of(&d));
    }
}

/// As [`encode`] with `len` data bytes that `fill` appends to `out` (no
/// zeroed slice is written first, and the data digest is computed as the
/// bytes are copied); nothing is appended when `fill` returns `false` or
/// appends another number of bytes.
pub fn encode_with(
    out: &mut Vec<u8>,
    header: &[u8],
    len: usize,
    framing: Framing,
    fill: impl FnOnce(&mut Appender<'_>) -> bool,
) -> bool {
    let start = out.len();
    let mut dd = begin(out, header, len, framing).then(Crc32c::new);
    let data_start = out.len();
    let mut data = Appender::new(out, dd.as_mut());
    if !fill(&mut data) || data.len() != data_start.saturating_add(len) {
        out.truncate(start);
        return false;
    }
    if let Some(d) = dd {
        out.extend_from_slice(&digest::of(&d));
    }
    true
}

/// As [`encode`] for `len` zero bytes of data that are not written: the
/// header (and, when data digests are on, the digest of the zeros) are
/// appended and the position the zeros go before is returned. The caller
/// sends them from elsewhere.
pub fn encode_zeros(out: &mut Vec<u8>, header: &[u8], len: usize, framing: Framing) -> usize {
    let dd = begin(out, header, len, framing);
    let at = out.len();
    if dd {
        out.extend_from_slice(&digest::crc32c_of_zeros(len));
    }
    at
}

/// Appends the header part of a PDU with `data_len` data bytes (header,
/// header digest, padding up to the data) and returns whether a data
/// digest must follow the data.
fn begin(out: &mut Vec<u8>, header: &[u8], data_len: usize, framing: Framing) -> bool {
    let pdu_type = PduType(header.first().copied().unwrap_or_default());
    let digests = pdu_type.carries_digests();
    let hd = digests && framing.hdgst;
    let dd = digests && framing.ddgst && data_len > 0;
    let header_end = header.len().saturating_add(if hd { digest::LEN } else { 0 });
    // Terminate PDUs (no digests) carry their data right after the header,
    // where a receiver reads it (no PDA padding: PLEN stays within 152).
    let pdo = match (data_len, digests) {
        (0, _) => 0,
        (_, false) => header_end,
        (_, true) => header_end.next_multiple_of(framing.data_align as usize),
    };
    let data_start = if data_len == 0 { header_end } else { pdo };
    let plen = data_start.saturating_add(data_len).saturating_add(if dd { digest::LEN } else { 0 });
    let start = out.len();
    out.extend_from_slice(header);
    if let Some(h) = out.get_mut(start..start.saturating_add(8)) {
        let mut ch = CommonHeader::read_from_bytes(h).unwrap_or_default();
        if hd {
            ch.flags |= flags::HDGSTF;
        }
        if dd {
            ch.flags |= flags::DDGSTF;
        }
        ch.pdo = u8::try_from(pdo).unwrap_or(0);
        ch.plen = u32::try_from(plen).unwrap_or(u32::MAX).into();
        h.copy_from_slice(ch.as_bytes());
    }
    if hd {
        let d = digest::crc32c(out.get(start..).unwrap_or_default());
        out.extend_from_slice(&d);
    }
    out.resize(start.saturating_add(data_start), 0);
    dd
}

/// A common header for `pdu_type` with its fixed HLEN; PLEN/PDO are set by
/// [`encode`].
pub fn common_header(pdu_type: PduType, flags: u8) -> CommonHeader {
    CommonHeader { pdu_type: pdu_type.0, flags, hlen: pdu_type.hlen().unwrap_or(8), pdo: 0, plen: 0.into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: Framing = Framing { hdgst: false, ddgst: false, data_align: 4 };
    const DIGESTS: Framing = Framing { hdgst: true, ddgst: true, data_align: 4 };

    fn any(_: PduType) -> Option<u32> {
        Some(1 << 20)
    }

    fn h2c_data(datal: u32) -> DataHeader {
        DataHeader {
            ch: common_header(PduType::H2C_DATA, flags::LAST_PDU),
            cccid: 5.into(),
            ttag: 1.into(),
            datao: 0.into(),
            datal: datal.into(),
            rsvd: [0; 4],
        }
    }

    #[test]
    fn encodes_and_deframes_with_digests_and_padding() {
        let mut out = Vec::new();
        let hdr = h2c_data(5);
        let framing = Framing { data_align: 32, ..DIGESTS };
        encode(&mut out, hdr.as_bytes(), b"hello", framing);
        // header 24 + hdgst 4, padded to 32, 5 data bytes, 4 data digest
        assert_eq!(out.len(), 32 + 5 + 4);
        assert_eq!(out.get(3), Some(&32));
        let f = deframe(&out, framing, any).expect("complete").expect("valid");
        assert_eq!(f.data, b"hello");
        assert!(f.data_digest_ok);
        assert_eq!(f.len, out.len());
        assert_eq!(f.ch.flags & (flags::HDGSTF | flags::DDGSTF), flags::HDGSTF | flags::DDGSTF);
    }

    #[test]
    fn waits_for_the_whole_pdu() {
        let mut out = Vec::new();
        encode(&mut out, h2c_data(4).as_bytes(), b"abcd", PLAIN);
        for cut in 0..out.len() {
            assert!(deframe(out.get(..cut).expect("prefix"), PLAIN, any).is_none(), "cut at {cut}");
        }
    }

    #[test]
    fn rejects_bad_hlen_naming_the_field() {
        let mut out = Vec::new();
        encode(&mut out, h2c_data(4).as_bytes(), b"abcd", PLAIN);
        if let Some(b) = out.get_mut(2) {
            *b = 20;
        }
        let e = deframe(&out, PLAIN, any).expect("decided").expect_err("bad hlen");
        assert_eq!((e.fes, e.fei), (Fes::INVALID_HEADER_FIELD, offset::HLEN));
    }

    #[test]
    fn rejects_unknown_pdu_type() {
        let bytes = [0x42u8, 0, 24, 0, 24, 0, 0, 0];
        let e = deframe(&bytes, PLAIN, any).expect("decided").expect_err("bad type");
        assert_eq!((e.fes, e.fei), (Fes::INVALID_HEADER_FIELD, offset::PDU_TYPE));
    }

    #[test]
    fn rejects_header_digest_mismatch() {
        let mut out = Vec::new();
        encode(&mut out, h2c_data(4).as_bytes(), b"abcd", DIGESTS);
        if let Some(b) = out.get_mut(24) {
            *b ^= 0xff;
        }
        let e = deframe(&out, DIGESTS, any).expect("decided").expect_err("digest");
        assert_eq!(e.fes, Fes::HEADER_DIGEST_ERROR);
    }

    #[test]
    fn reports_data_digest_mismatch_without_failing_the_framing() {
        let mut out = Vec::new();
        encode(&mut out, h2c_data(4).as_bytes(), b"abcd", DIGESTS);
        let n = out.len();
        if let Some(b) = out.get_mut(n - 1) {
            *b ^= 1;
        }
        let f = deframe(&out, DIGESTS, any).expect("decided").expect("framed");
        assert!(!f.data_digest_ok);
    }

    #[test]
    fn rejects_pdo_inside_the_header() {
        let mut out = Vec::new();
        encode(&mut out, h2c_data(4).as_bytes(), b"abcd", PLAIN);
        if let Some(b) = out.get_mut(3) {
            *b = 8;
        }
        let e = deframe(&out, PLAIN, any).expect("decided").expect_err("pdo");
        assert_eq!(e.fei, offset::PDO);
    }

    #[test]
    fn rejects_plen_shorter_than_header_and_data_beyond_limit() {
        let mut out = Vec::new();
        encode(&mut out, h2c_data(4).as_bytes(), b"abcd", PLAIN);
        let mut short = out.clone();
        if let Some(b) = short.get_mut(4) {
            *b = 10;
        }
        let e = deframe(&short, PLAIN, any).expect("decided").expect_err("plen");
        assert_eq!(e.fei, offset::PLEN);
        let e = deframe(&out, PLAIN, |_| Some(2)).expect("decided").expect_err("limit");
        assert_eq!(e.fes, Fes::DATA_LIMIT_EXCEEDED);
    }

    #[test]
    fn a_fixed_length_pdu_beyond_its_length_has_an_invalid_plen() {
        let term = TermReq { ch: common_header(PduType::C2H_TERM_REQ, 0), fes: 1.into(), fei: 0.into(), rsvd: [0; 10] };
        let mut out = Vec::new();
        encode(&mut out, term.as_bytes(), &[0; 129], PLAIN);
        let e = deframe(&out, PLAIN, any).expect("decided").expect_err("plen 153");
        assert_eq!((e.fes, e.fei), (Fes::INVALID_HEADER_FIELD, offset::PLEN));
    }

    #[test]
    fn rejects_digest_flag_that_disagrees_with_negotiation() {
        let mut out = Vec::new();
        encode(&mut out, h2c_data(4).as_bytes(), b"abcd", PLAIN);
        let e = deframe(&out, DIGESTS, any).expect("decided").expect_err("flags");
        assert_eq!(e.fei, offset::FLAGS);
    }
}
