//! MPA connection setup (RFC 5044 section 7, RFC 6581): the request and
//! reply frames that start every iWARP connection.
//!
//! A frame is a 16-byte key, a flags byte (M markers, C CRC, R reject, and
//! RFC 6581's enhanced bit), the revision, a 16-bit private data length and
//! the private data. In enhanced mode (revision 2) the private data starts
//! with the IRD/ORD words; the upper layer's private data follows them.

use crate::error::{ErrorCode, Fatal};

/// The initiator's key.
pub const KEY_REQUEST: &[u8; 16] = b"MPA ID Req Frame";
/// The responder's key.
pub const KEY_REPLY: &[u8; 16] = b"MPA ID Rep Frame";
/// Bytes before the private data.
pub const HEADER_LEN: usize = 20;
/// The most private data a frame may carry (RFC 5044 section 7.1).
pub const MAX_PRIVATE_DATA: usize = 512;
/// Bytes of the enhanced-mode IRD/ORD words at the start of private data.
pub const IRD_ORD_LEN: usize = 4;
/// The largest IRD or ORD the 14-bit fields hold.
pub const MAX_IRD_ORD: u16 = 0x3fff;

/// Frame flag bits.
pub mod flags {
    /// M: the sender requires markers.
    pub const MARKERS: u8 = 0x80;
    /// C: the sender wants CRC32C on FPDUs.
    pub const CRC: u8 = 0x40;
    /// R: the responder rejects the connection.
    pub const REJECT: u8 = 0x20;
    /// RFC 6581 enhanced connection setup.
    pub const ENHANCED: u8 = 0x10;
}

/// IRD/ORD word flags (RFC 6581 section 9).
pub mod ird_ord {
    /// IRD word: peer-to-peer mode (an RTR message follows the reply).
    pub const PEER_TO_PEER: u16 = 0x8000;
    /// IRD word: a zero-length Send as RTR.
    pub const ZERO_LENGTH_SEND_RTR: u16 = 0x4000;
    /// ORD word: a zero-length RDMA Write as RTR.
    pub const WRITE_RTR: u16 = 0x8000;
    /// ORD word: a zero-length RDMA Read as RTR.
    pub const READ_RTR: u16 = 0x4000;
}

/// Which frame: the initiator's request or the responder's reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// "MPA ID Req Frame".
    Request,
    /// "MPA ID Rep Frame".
    Reply,
}

impl Kind {
    fn key(self) -> &'static [u8; 16] {
        match self {
            Kind::Request => KEY_REQUEST,
            Kind::Reply => KEY_REPLY,
        }
    }
}

/// One MPA request or reply frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Request or reply.
    pub kind: Kind,
    /// The flags byte ([`flags`]).
    pub flags: u8,
    /// The MPA revision: 1, or 2 for the enhanced setup.
    pub revision: u8,
    /// The IRD and ORD words (with their flag bits) of an enhanced frame.
    pub ird_ord: Option<(u16, u16)>,
    /// The upper layer's private data (after the IRD/ORD words).
    pub private_data: Vec<u8>,
}

impl Frame {
    /// Whether a flag is set.
    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// The IRD (inbound RDMA Reads the sender serves at once).
    pub fn ird(&self) -> Option<u16> {
        self.ird_ord.map(|(i, _)| i & MAX_IRD_ORD)
    }

    /// The ORD (outbound RDMA Reads the sender issues at once).
    pub fn ord(&self) -> Option<u16> {
        self.ird_ord.map(|(_, o)| o & MAX_IRD_ORD)
    }

    /// Appends the frame's bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.kind.key());
        out.push(self.flags);
        out.push(self.revision);
        let words = if self.ird_ord.is_some() { IRD_ORD_LEN } else { 0 };
        let pd_len = words.saturating_add(self.private_data.len()).min(MAX_PRIVATE_DATA);
        out.extend_from_slice(&(pd_len as u16).to_be_bytes());
        if let Some((ird, ord)) = self.ird_ord {
            out.extend_from_slice(&ird.to_be_bytes());
            out.extend_from_slice(&ord.to_be_bytes());
        }
        let ulp = pd_len.saturating_sub(words);
        out.extend_from_slice(self.private_data.get(..ulp).unwrap_or_default());
    }

    /// Decodes a frame of `kind` from the start of `buf`: `Ok(None)` while
    /// bytes are missing, else the frame and the bytes it took.
    pub fn decode(buf: &[u8], kind: Kind) -> Result<Option<(Frame, usize)>, Fatal> {
        let bad = |reason: String| Fatal::new(ErrorCode::MPA_INVALID_FRAME, reason);
        // A wrong key is answered as soon as the bytes that differ arrive.
        let have = buf.len().min(16);
        if buf.get(..have) != kind.key().get(..have) {
            return Err(bad(format!(
                "key {:?} is not {:?}",
                String::from_utf8_lossy(buf.get(..have).unwrap_or_default()),
                String::from_utf8_lossy(kind.key())
            )));
        }
        let Some(hdr) = buf.get(..HEADER_LEN) else { return Ok(None) };
        let [.., flags, revision, l0, l1] = *hdr else { return Ok(None) };
        let pd_len = usize::from(u16::from_be_bytes([l0, l1]));
        if pd_len > MAX_PRIVATE_DATA {
            return Err(bad(format!("private data length {pd_len} exceeds {MAX_PRIVATE_DATA}")));
        }
        if !matches!(revision, 1 | 2) {
            return Err(bad(format!("revision {revision} unsupported (expected 1 or 2)")));
        }
        let enhanced = flags & flags::ENHANCED != 0;
        if enhanced && revision < 2 {
            return Err(bad("enhanced connection setup asked with revision 1".into()));
        }
        if enhanced && pd_len < IRD_ORD_LEN {
            return Err(bad(format!("enhanced frame with {pd_len} bytes of private data (the IRD/ORD words need 4)")));
        }
        let total = HEADER_LEN.saturating_add(pd_len);
        let Some(pd) = buf.get(HEADER_LEN..total) else { return Ok(None) };
        let (ird_ord, ulp) = match (enhanced, pd) {
            (true, [i0, i1, o0, o1, rest @ ..]) => {
                (Some((u16::from_be_bytes([*i0, *i1]), u16::from_be_bytes([*o0, *o1]))), rest)
            }
            _ => (None, pd),
        };
        let frame = Frame { kind, flags, revision, ird_ord, private_data: ulp.to_vec() };
        Ok(Some((frame, total)))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

    /// The request a Linux siw host sends for an NVMe/RDMA admin queue
    /// (docs/dev/iwarp-siw-reference.md section 1.4): enhanced, no CRC, no
    /// markers, IRD 128, ORD 0, then the 32-byte NVMe/RDMA CM request.
    fn siw_request() -> Vec<u8> {
        let mut b = b"MPA ID Req Frame".to_vec();
        b.extend_from_slice(&[0x10, 0x02, 0x00, 0x24, 0x00, 0x80, 0x00, 0x00]);
        let mut cm = [0u8; 32];
        cm[4] = 32; // hrqsize
        cm[6] = 31; // hsqsize
        b.extend_from_slice(&cm);
        b
    }

    #[test]
    fn decodes_the_siw_request() {
        let b = siw_request();
        let (f, used) = Frame::decode(&b, Kind::Request).unwrap().unwrap();
        assert_eq!(used, 56);
        assert_eq!(f.revision, 2);
        assert!(f.has(flags::ENHANCED) && !f.has(flags::CRC) && !f.has(flags::MARKERS));
        assert_eq!((f.ird(), f.ord()), (Some(128), Some(0)));
        assert_eq!(f.private_data.len(), 32);
        assert_eq!(f.private_data[4], 32);
        let mut again = Vec::new();
        f.encode(&mut again);
        assert_eq!(again, b);
    }

    #[test]
    fn waits_for_the_whole_frame() {
        let b = siw_request();
        for n in 0..b.len() {
            assert_eq!(Frame::decode(&b[..n], Kind::Request).unwrap(), None, "at {n} bytes");
        }
    }

    #[test]
    fn rejects_a_wrong_key_as_soon_as_it_differs() {
        let e = Frame::decode(b"MPA ID Rep", Kind::Request).unwrap_err();
        assert_eq!(e.code, ErrorCode::MPA_INVALID_FRAME);
        assert!(e.reason.contains("key"), "{}", e.reason);
        let e = Frame::decode(b"GET / HTTP/1.1\r\n", Kind::Request).unwrap_err();
        assert_eq!(e.code, ErrorCode::MPA_INVALID_FRAME);
    }

    #[test]
    fn rejects_oversized_private_data_bad_revision_and_short_enhanced_data() {
        let mut b = siw_request();
        b[18..20].copy_from_slice(&513u16.to_be_bytes());
        assert!(Frame::decode(&b, Kind::Request).unwrap_err().reason.contains("513"));
        let mut b = siw_request();
        b[17] = 3;
        assert!(Frame::decode(&b, Kind::Request).unwrap_err().reason.contains("revision 3"));
        let mut b = siw_request();
        b[17] = 1;
        assert!(Frame::decode(&b, Kind::Request).unwrap_err().reason.contains("revision 1"));
        let mut b = siw_request();
        b[18..20].copy_from_slice(&2u16.to_be_bytes());
        assert!(Frame::decode(&b, Kind::Request).unwrap_err().reason.contains("IRD/ORD"));
    }

    #[test]
    fn revision_1_frames_carry_no_ird_ord_words() {
        let f = Frame { kind: Kind::Reply, flags: flags::CRC, revision: 1, ird_ord: None, private_data: vec![7; 3] };
        let mut b = Vec::new();
        f.encode(&mut b);
        assert_eq!(&b[..16], KEY_REPLY);
        assert_eq!(&b[16..20], &[0x40, 1, 0, 3]);
        assert_eq!(Frame::decode(&b, Kind::Reply).unwrap().unwrap(), (f, 23));
    }
}
