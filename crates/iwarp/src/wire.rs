//! FPDU, DDP and RDMAP wire layouts (RFC 5044 section 5, RFC 5041 section
//! 4, RFC 5040 section 4), all big-endian.
//!
//! Each header struct starts with the MPA ULPDU length, so that one struct
//! is what an FPDU begins with. Every header length is a multiple of four,
//! so an FPDU's padding depends on its payload length alone.

use checksum::{Appender, Crc32c};
use zerocopy::big_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// An RDMAP opcode (RFC 5040 section 4.3), open so unknown values survive
/// decoding and are answered with a Terminate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Opcode(pub u8);

impl Opcode {
    /// RDMA Write (tagged).
    pub const RDMA_WRITE: Opcode = Opcode(0);
    /// RDMA Read Request (untagged, queue 1).
    pub const READ_REQUEST: Opcode = Opcode(1);
    /// RDMA Read Response (tagged).
    pub const READ_RESPONSE: Opcode = Opcode(2);
    /// Send (untagged, queue 0).
    pub const SEND: Opcode = Opcode(3);
    /// Send with Invalidate.
    pub const SEND_INVALIDATE: Opcode = Opcode(4);
    /// Send with Solicited Event.
    pub const SEND_SE: Opcode = Opcode(5);
    /// Send with Solicited Event and Invalidate.
    pub const SEND_SE_INVALIDATE: Opcode = Opcode(6);
    /// Terminate (untagged, queue 2).
    pub const TERMINATE: Opcode = Opcode(7);

    /// Whether messages with this opcode are tagged (placed by STag).
    pub fn is_tagged(self) -> bool {
        matches!(self, Self::RDMA_WRITE | Self::READ_RESPONSE)
    }

    /// Whether this is one of the four Send opcodes.
    pub fn is_send(self) -> bool {
        matches!(self.0, 3..=6)
    }

    /// Whether this Send invalidates an STag at the receiver.
    pub fn invalidates(self) -> bool {
        matches!(self, Self::SEND_INVALIDATE | Self::SEND_SE_INVALIDATE)
    }

    /// Whether this Send asks for a solicited event.
    pub fn solicited(self) -> bool {
        matches!(self, Self::SEND_SE | Self::SEND_SE_INVALIDATE)
    }

    /// Bytes of the fixed header of an FPDU with this opcode, counting the
    /// ULPDU length field; `None` for an unknown opcode.
    pub fn header_len(self) -> Option<usize> {
        Some(match self.0 {
            0 | 2 => TAGGED_LEN,
            1 => READ_REQUEST_LEN,
            3..=6 => UNTAGGED_LEN,
            7 => TERMINATE_LEN,
            _ => return None,
        })
    }

    /// The DDP queue number untagged messages of this opcode use.
    pub fn queue(self) -> u32 {
        match self {
            Self::READ_REQUEST => QN_READ_REQUEST,
            Self::TERMINATE => QN_TERMINATE,
            _ => QN_SEND,
        }
    }
}

/// DDP queue 0: Sends.
pub const QN_SEND: u32 = 0;
/// DDP queue 1: RDMA Read Requests.
pub const QN_READ_REQUEST: u32 = 1;
/// DDP queue 2: Terminate.
pub const QN_TERMINATE: u32 = 2;
/// Bytes of the CRC field that ends every FPDU (zero when CRC is off).
pub const CRC_LEN: usize = 4;
/// Bytes of the ULPDU length field.
pub const LEN_FIELD: usize = 2;

/// The DDP and RDMAP control bits (RFC 5041 section 4.2, RFC 5040 section
/// 4.2): tagged, last, DDP version, RDMAP version, opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ctrl(pub u16);

impl Ctrl {
    const TAGGED: u16 = 0x8000;
    const LAST: u16 = 0x4000;
    /// The only DDP and RDMAP version (1 each).
    const VERSIONS: u16 = 0x0100 | 0x0040;

    /// The control word of a segment of `opcode`, the last of its message
    /// or not.
    pub fn new(opcode: Opcode, last: bool) -> Self {
        let mut v = Self::VERSIONS | u16::from(opcode.0 & 0x0f);
        if opcode.is_tagged() {
            v |= Self::TAGGED;
        }
        if last {
            v |= Self::LAST;
        }
        Ctrl(v)
    }

    /// T: the segment is tagged.
    pub fn tagged(self) -> bool {
        self.0 & Self::TAGGED != 0
    }

    /// L: the last segment of its message.
    pub fn last(self) -> bool {
        self.0 & Self::LAST != 0
    }

    /// DV: the DDP version.
    pub fn ddp_version(self) -> u8 {
        ((self.0 >> 8) & 0x3) as u8
    }

    /// RV: the RDMAP version.
    pub fn rdmap_version(self) -> u8 {
        ((self.0 >> 6) & 0x3) as u8
    }

    /// The RDMAP opcode.
    pub fn opcode(self) -> Opcode {
        Opcode((self.0 & 0x0f) as u8)
    }
}

/// A tagged segment's header: RDMA Write, RDMA Read Response.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct TaggedHeader {
    /// MPA ULPDU length: header (without this field) plus payload.
    pub ulpdu_len: U16,
    /// [`Ctrl`].
    pub ctrl: U16,
    /// The data sink STag.
    pub stag: U32,
    /// The tagged offset of this segment's first byte.
    pub to: U64,
}
const _: () = assert!(core::mem::size_of::<TaggedHeader>() == TAGGED_LEN);
/// Bytes of [`TaggedHeader`].
pub const TAGGED_LEN: usize = 16;

/// An untagged segment's header: the Sends, and the start of the Read
/// Request and Terminate headers.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct UntaggedHeader {
    /// MPA ULPDU length.
    pub ulpdu_len: U16,
    /// [`Ctrl`].
    pub ctrl: U16,
    /// The STag a Send with Invalidate invalidates; zero otherwise.
    pub inv_stag: U32,
    /// QN: the DDP queue number.
    pub qn: U32,
    /// MSN: the message sequence number in that queue, from 1.
    pub msn: U32,
    /// MO: the offset of this segment's payload in its message.
    pub mo: U32,
}
const _: () = assert!(core::mem::size_of::<UntaggedHeader>() == UNTAGGED_LEN);
/// Bytes of [`UntaggedHeader`].
pub const UNTAGGED_LEN: usize = 20;

/// An RDMA Read Request (RFC 5040 section 4.4): the whole message, no
/// payload.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct ReadRequest {
    /// The untagged header (queue 1).
    pub ddp: UntaggedHeader,
    /// The requester's buffer the response is placed in.
    pub sink_stag: U32,
    /// The tagged offset in the sink.
    pub sink_to: U64,
    /// How many bytes to read.
    pub size: U32,
    /// The responder's buffer the data comes from.
    pub src_stag: U32,
    /// The tagged offset in the source.
    pub src_to: U64,
}
const _: () = assert!(core::mem::size_of::<ReadRequest>() == READ_REQUEST_LEN);
/// Bytes of [`ReadRequest`].
pub const READ_REQUEST_LEN: usize = 48;

/// A Terminate message's fixed part (RFC 5040 section 4.8); the offending
/// DDP segment length and headers may follow.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct TerminateHeader {
    /// The untagged header (queue 2, MSN 1, MO 0).
    pub ddp: UntaggedHeader,
    /// Layer (4 bits) and error type (4 bits).
    pub layer_etype: u8,
    /// The error code.
    pub ecode: u8,
    /// Hdrct (M, D, R in the top three bits) and reserved bits.
    pub hdrct: U16,
}
const _: () = assert!(core::mem::size_of::<TerminateHeader>() == TERMINATE_LEN);
/// Bytes of [`TerminateHeader`].
pub const TERMINATE_LEN: usize = 24;

/// Terminate Hdrct bits.
pub mod hdrct {
    /// M: the DDP segment length field is valid.
    pub const M: u16 = 0x8000;
    /// D: the terminated DDP header is included.
    pub const D: u16 = 0x4000;
    /// R: the terminated RDMAP header is included.
    pub const R: u16 = 0x2000;
}

/// Zero bytes that pad a payload of `payload_len` to a multiple of four.
pub fn pad_len(payload_len: usize) -> usize {
    payload_len.wrapping_neg() & 3
}

/// Appends one FPDU: `header` (whose ULPDU length field is filled in here),
/// `payload_len` bytes written by `fill` (into a zeroed slice), padding and
/// the CRC field (the CRC32C of everything before it when `crc`, else
/// zero). The header length plus the payload length must fit a ULPDU
/// (callers segment at most [`MAX_ULPDU`]).
#[inline]
pub fn put_fpdu(out: &mut Vec<u8>, header: &[u8], payload_len: usize, crc: bool, fill: impl FnOnce(&mut [u8])) {
    let start = out.len();
    let body = put_header(out, header, payload_len);
    out.resize(body.saturating_add(payload_len).saturating_add(pad_len(payload_len)), 0);
    fill(out.get_mut(body..body.saturating_add(payload_len)).unwrap_or_default());
    let value = if crc { checksum::crc32c(out.get(start..).unwrap_or_default()) } else { 0 };
    put_crc(out, value);
}

/// As [`put_fpdu`] with a payload that `fill` appends itself (no zeroed
/// slice is written first: a device's data is copied in once, and the CRC
/// is computed from that copy's own loads, see [`checksum::Appender`]).
/// Nothing is appended, and `false` returned, when `fill` returns `false`
/// or appends another number of bytes than `payload_len`.
#[inline]
pub fn put_fpdu_appended(
    out: &mut Vec<u8>,
    header: &[u8],
    payload_len: usize,
    crc: bool,
    fill: impl FnOnce(&mut Appender<'_>) -> bool,
) -> bool {
    let start = out.len();
    let body = put_header(out, header, payload_len);
    let mut running = crc.then(|| {
        let mut c = Crc32c::new();
        c.update(out.get(start..).unwrap_or_default());
        c
    });
    let mut payload = Appender::new(out, running.as_mut());
    if !fill(&mut payload) || payload.len() != body.saturating_add(payload_len) {
        out.truncate(start);
        return false;
    }
    payload.extend_zeros(pad_len(payload_len));
    put_crc(out, running.map_or(0, |c| c.value()));
    true
}

/// Appends the ULPDU length and `header` after its length field, for a
/// payload of `payload_len`; returns where the payload starts.
#[inline]
fn put_header(out: &mut Vec<u8>, header: &[u8], payload_len: usize) -> usize {
    let ulpdu = header.len().saturating_sub(LEN_FIELD).saturating_add(payload_len);
    debug_assert!(ulpdu <= MAX_ULPDU);
    out.extend_from_slice(&(ulpdu as u16).to_be_bytes());
    out.extend_from_slice(header.get(LEN_FIELD..).unwrap_or_default());
    out.len()
}

/// Appends the CRC field.
#[inline]
fn put_crc(out: &mut Vec<u8>, value: u32) {
    // The CRC field carries the CRC32C least significant byte first, as
    // iSCSI's digests do (RFC 5044 section 6 with RFC 3385's bit order).
    out.extend_from_slice(&value.to_le_bytes());
}

/// The largest ULPDU the 16-bit length field allows.
pub const MAX_ULPDU: usize = 0xffff;

/// Bytes of an FPDU besides its payload when the header is the largest a
/// segmented message carries (untagged), with its CRC field.
const FPDU_OVERHEAD: usize = UNTAGGED_LEN + CRC_LEN;

/// The most payload bytes per FPDU on a TCP connection whose maximum
/// segment size is `mss`: RFC 5044's MULPDU without markers, so that every
/// FPDU (header, payload, padding, CRC) fits one segment, as DDP segments
/// its messages (RFC 5041 section 5). A multiple of 8, at least 8.
pub fn max_segment_for_mss(mss: usize) -> usize {
    (mss.saturating_sub(FPDU_OVERHEAD) & !7).max(8)
}

/// A reported MSS at least this large caps nothing ([`segment_cap`]).
pub const LARGE_MSS: usize = 32 * 1024;

/// The payload cap per FPDU for a connection whose `TCP_MAXSEG` read `mss`
/// when it was set up: [`max_segment_for_mss`], or `None` when `mss` is
/// [`LARGE_MSS`] or more. Linux bounds the MSS it reports to half the
/// largest window seen so far, so a new loopback connection reports 32 KiB
/// where its path carries 64 KiB; no real link's MTU comes near that, and
/// segments that large are cut by segmentation offload anyway.
pub fn segment_cap(mss: usize) -> Option<usize> {
    (mss < LARGE_MSS).then(|| max_segment_for_mss(mss))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

    #[test]
    fn control_words_match_the_ones_siw_sends() {
        assert_eq!(Ctrl::new(Opcode::RDMA_WRITE, true).0, 0xc140);
        assert_eq!(Ctrl::new(Opcode::RDMA_WRITE, false).0, 0x8140);
        assert_eq!(Ctrl::new(Opcode::READ_REQUEST, true).0, 0x4141);
        assert_eq!(Ctrl::new(Opcode::READ_RESPONSE, true).0, 0xc142);
        assert_eq!(Ctrl::new(Opcode::SEND, false).0, 0x0143);
        assert_eq!(Ctrl::new(Opcode::SEND_INVALIDATE, true).0, 0x4144);
        assert_eq!(Ctrl::new(Opcode::TERMINATE, true).0, 0x4147);
        let c = Ctrl(0xc142);
        assert!(c.tagged() && c.last());
        assert_eq!((c.ddp_version(), c.rdmap_version(), c.opcode()), (1, 1, Opcode::READ_RESPONSE));
    }

    #[test]
    fn header_lengths_follow_the_opcode() {
        assert_eq!(Opcode::RDMA_WRITE.header_len(), Some(16));
        assert_eq!(Opcode::SEND_SE_INVALIDATE.header_len(), Some(20));
        assert_eq!(Opcode::READ_REQUEST.header_len(), Some(48));
        assert_eq!(Opcode::TERMINATE.header_len(), Some(24));
        assert_eq!(Opcode(8).header_len(), None);
        assert_eq!(Opcode(15).header_len(), None);
    }

    #[test]
    fn fpdu_is_length_header_payload_pad_and_crc() {
        let mut out = Vec::new();
        let hdr = [0u8, 0, 0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
        put_fpdu(&mut out, &hdr, 5, false, |d| d.copy_from_slice(b"hello"));
        // 20-byte header + 5 + 3 pad + 4 CRC
        assert_eq!(out.len(), 32);
        assert_eq!(&out[..2], &[0, 23]);
        assert_eq!(&out[20..25], b"hello");
        assert_eq!(&out[25..], &[0u8; 7]);
        let mut with_crc = Vec::new();
        put_fpdu(&mut with_crc, &hdr, 5, true, |d| d.copy_from_slice(b"hello"));
        let crc = checksum::crc32c(&with_crc[..28]);
        assert_eq!(&with_crc[28..], &crc.to_le_bytes());
        assert_ne!(crc, 0);
    }

    #[test]
    fn segments_fit_the_tcp_mss() {
        // A 1500-byte MTU with TCP timestamps: 1424 payload bytes, as siw
        // sends on such a link.
        assert_eq!(max_segment_for_mss(1448), 1424);
        assert_eq!(max_segment_for_mss(1460), 1432);
        assert_eq!(max_segment_for_mss(65483), 65456);
        assert_eq!(max_segment_for_mss(0), 8);
        assert_eq!(segment_cap(1448), Some(1424));
        assert_eq!(segment_cap(9000), Some(8976));
        assert_eq!(segment_cap(32768), None, "a new loopback connection");
        for mss in 32..9000 {
            let p = max_segment_for_mss(mss);
            assert_eq!(p % 8, 0);
            assert!(UNTAGGED_LEN + p + pad_len(p) + CRC_LEN <= mss, "mss {mss}");
            assert!(UNTAGGED_LEN + p + 8 + CRC_LEN > mss, "mss {mss}: {p} is not the most");
        }
    }

    #[test]
    fn crc_field_is_the_crc32c_least_significant_byte_first() {
        // The CRC32C check value of "123456789" is 0xe3069283.
        let v = checksum::crc32c(b"123456789");
        assert_eq!(v, 0xe306_9283);
        assert_eq!(v.to_le_bytes(), [0x83, 0x92, 0x06, 0xe3]);
    }
}
