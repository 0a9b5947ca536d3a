//! Fatal errors: the peer broke a rule and the connection ends with a
//! Terminate message (RFC 5040 section 7) naming the layer and error.

use std::fmt;

/// The layer, error type and error code of a Terminate message (RFC 5040
/// section 7.2), open so that a peer's unknown values survive decoding.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrorCode {
    /// The layer that found the error: 0 RDMAP, 1 DDP, 2 LLP (MPA).
    pub layer: u8,
    /// The error type within the layer.
    pub etype: u8,
    /// The error code within the type.
    pub ecode: u8,
}

const RDMAP: u8 = 0;
const DDP: u8 = 1;
const LLP: u8 = 2;

impl ErrorCode {
    const fn new(layer: u8, etype: u8, ecode: u8) -> Self {
        ErrorCode { layer, etype, ecode }
    }

    /// Layer 0: RDMAP.
    pub const LAYER_RDMAP: u8 = RDMAP;
    /// Layer 1: DDP.
    pub const LAYER_DDP: u8 = DDP;
    /// Layer 2: the LLP, MPA.
    pub const LAYER_MPA: u8 = LLP;

    /// RDMAP remote protection: invalid STag.
    pub const RDMAP_INVALID_STAG: Self = Self::new(RDMAP, 1, 0x00);
    /// RDMAP remote protection: base or bounds violation.
    pub const RDMAP_BASE_BOUNDS: Self = Self::new(RDMAP, 1, 0x01);
    /// RDMAP remote protection: access rights violation.
    pub const RDMAP_ACCESS_RIGHTS: Self = Self::new(RDMAP, 1, 0x02);
    /// RDMAP remote operation: invalid RDMAP version.
    pub const RDMAP_VERSION: Self = Self::new(RDMAP, 2, 0x05);
    /// RDMAP remote operation: unexpected opcode.
    pub const RDMAP_OPCODE: Self = Self::new(RDMAP, 2, 0x06);
    /// RDMAP remote operation: catastrophic error, localized to the stream
    /// (an RDMA Read Request beyond the IRD, a Read Response nobody asked for).
    pub const RDMAP_CATASTROPHIC_STREAM: Self = Self::new(RDMAP, 2, 0x07);
    /// RDMAP remote operation: cannot invalidate the STag of a Send with
    /// Invalidate.
    pub const RDMAP_CANNOT_INVALIDATE: Self = Self::new(RDMAP, 2, 0x09);
    /// RDMAP catastrophic: unspecified local error.
    pub const RDMAP_LOCAL_CATASTROPHIC: Self = Self::new(RDMAP, 0, 0xff);
    /// DDP catastrophic: local catastrophic error.
    pub const DDP_CATASTROPHIC: Self = Self::new(DDP, 0, 0x00);
    /// DDP tagged buffer: invalid STag.
    pub const DDP_TAGGED_INVALID_STAG: Self = Self::new(DDP, 1, 0x00);
    /// DDP tagged buffer: base or bounds violation.
    pub const DDP_TAGGED_BASE_BOUNDS: Self = Self::new(DDP, 1, 0x01);
    /// DDP tagged buffer: STag not associated with the stream.
    pub const DDP_TAGGED_NOT_ASSOCIATED: Self = Self::new(DDP, 1, 0x02);
    /// DDP tagged buffer: invalid DDP version.
    pub const DDP_TAGGED_VERSION: Self = Self::new(DDP, 1, 0x04);
    /// DDP untagged buffer: invalid queue number.
    pub const DDP_UNTAGGED_INVALID_QN: Self = Self::new(DDP, 2, 0x01);
    /// DDP untagged buffer: invalid MSN, no buffer available.
    pub const DDP_UNTAGGED_NO_BUFFER: Self = Self::new(DDP, 2, 0x02);
    /// DDP untagged buffer: invalid MSN, out of range.
    pub const DDP_UNTAGGED_MSN_RANGE: Self = Self::new(DDP, 2, 0x03);
    /// DDP untagged buffer: invalid message offset.
    pub const DDP_UNTAGGED_INVALID_MO: Self = Self::new(DDP, 2, 0x04);
    /// DDP untagged buffer: message too long for the available buffer.
    pub const DDP_UNTAGGED_TOO_LONG: Self = Self::new(DDP, 2, 0x05);
    /// DDP untagged buffer: invalid DDP version.
    pub const DDP_UNTAGGED_VERSION: Self = Self::new(DDP, 2, 0x06);
    /// MPA: CRC error.
    pub const MPA_CRC: Self = Self::new(LLP, 0, 0x02);
    /// MPA: marker or FPDU framing error (a malformed ULPDU length).
    pub const MPA_FPDU: Self = Self::new(LLP, 0, 0x03);
    /// MPA: invalid request or reply frame.
    pub const MPA_INVALID_FRAME: Self = Self::new(LLP, 0, 0x04);
    /// MPA (RFC 6581): insufficient IRD for the ORD asked.
    pub const MPA_INSUFFICIENT_IRD: Self = Self::new(LLP, 0, 0x06);

    /// The layer's name.
    pub fn layer_name(self) -> &'static str {
        match self.layer {
            RDMAP => "RDMAP",
            DDP => "DDP",
            LLP => "MPA",
            _ => "unknown layer",
        }
    }

    /// The error's name, from RFC 5040 section 7.2.
    pub fn name(self) -> &'static str {
        match (self.layer, self.etype, self.ecode) {
            (RDMAP, 1, 0x00) | (DDP, 1, 0x00) => "invalid STag",
            (RDMAP, 1, 0x01) | (DDP, 1, 0x01) => "base or bounds violation",
            (RDMAP, 1, 0x02) => "access rights violation",
            (RDMAP, 1, 0x03) | (DDP, 1, 0x02) => "STag not associated with the stream",
            (RDMAP, 1, 0x04) | (DDP, 1, 0x03) => "tagged offset wrap",
            (RDMAP, _, 0x05) => "invalid RDMAP version",
            (RDMAP, _, 0x06) => "unexpected opcode",
            (RDMAP, _, 0x07) => "catastrophic error, localized to the stream",
            (RDMAP, _, 0x08) => "catastrophic error, global",
            (RDMAP, _, 0x09) => "STag cannot be invalidated",
            (RDMAP, _, 0xff) => "unspecified error",
            (DDP, 0, _) => "local catastrophic",
            (DDP, 1, 0x04) | (DDP, 2, 0x06) => "invalid DDP version",
            (DDP, 2, 0x01) => "invalid queue number",
            (DDP, 2, 0x02) => "invalid MSN, no buffer available",
            (DDP, 2, 0x03) => "invalid MSN, out of range",
            (DDP, 2, 0x04) => "invalid message offset",
            (DDP, 2, 0x05) => "message too long for the buffer",
            (LLP, 0, 0x01) => "TCP connection lost",
            (LLP, 0, 0x02) => "CRC error",
            (LLP, 0, 0x03) => "FPDU framing error",
            (LLP, 0, 0x04) => "invalid MPA request or reply",
            (LLP, 0, 0x05) => "local catastrophic",
            (LLP, 0, 0x06) => "insufficient IRD",
            (LLP, 0, 0x07) => "no matching RTR model",
            _ => "unknown error",
        }
    }
}

impl fmt::Debug for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} (layer {}, etype {}, ecode {:#04x})",
            self.layer_name(),
            self.name(),
            self.layer,
            self.etype,
            self.ecode
        )
    }
}

/// A rule the peer broke: the connection sends a Terminate with `code` and
/// ends. `reason` names the field and says what was expected and what came.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {reason}")]
pub struct Fatal {
    /// What the Terminate message reports.
    pub code: ErrorCode,
    /// For the log.
    pub reason: String,
    /// The offending segment's DDP segment length and DDP header, and a
    /// Read Request's RDMAP header after them for an RDMAP error, echoed
    /// in the Terminate (RFC 5040 section 4.8); empty when nothing of it
    /// can be trusted or read.
    pub header: Vec<u8>,
}

impl Fatal {
    /// A fatal error with no header to echo.
    pub fn new(code: ErrorCode, reason: impl Into<String>) -> Self {
        Fatal { code, reason: reason.into(), header: Vec::new() }
    }
}
