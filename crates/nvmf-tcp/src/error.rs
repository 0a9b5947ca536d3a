//! Fatal transport errors: the peer broke the protocol and the connection
//! ends with a terminate request naming the field.

/// Fatal error status (TP 8000 figure 27) carried in C2HTermReq/H2CTermReq.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fes(pub u16);

impl Fes {
    /// Invalid PDU header field; FEI is the byte offset of the field.
    pub const INVALID_HEADER_FIELD: Fes = Fes(0x01);
    /// PDU sequence error; FEI is reserved (0).
    pub const PDU_SEQUENCE_ERROR: Fes = Fes(0x02);
    /// Header digest error; FEI is the header digest received.
    pub const HEADER_DIGEST_ERROR: Fes = Fes(0x03);
    /// Data transfer out of range; FEI is reserved (0).
    pub const DATA_OUT_OF_RANGE: Fes = Fes(0x04);
    /// Data transfer limit exceeded (R2T limit exceeded); FEI is reserved
    /// (0).
    pub const DATA_LIMIT_EXCEEDED: Fes = Fes(0x05);
    /// Unsupported parameter; FEI is the byte offset of the parameter.
    pub const UNSUPPORTED_PARAMETER: Fes = Fes(0x06);
}

/// A fatal protocol error found in the peer's bytes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason} (fes {:#x}, fei {fei:#x})", fes.0)]
pub struct Fatal {
    /// The fatal error status to send.
    pub fes: Fes,
    /// Field error information (NVMe-oF 1.1 section 7.4.7, the terminate
    /// requests): the byte offset of
    /// the failing field in the PDU header for invalid header field and
    /// unsupported parameter, the header digest received for a header
    /// digest error, reserved (0) for the other statuses.
    pub fei: u32,
    /// What was expected and what came, for the log: it names the field,
    /// also where FEI cannot.
    pub reason: String,
    /// The header of the offending PDU (up to 128 bytes) echoed in the
    /// terminate request.
    pub header: Vec<u8>,
}

impl Fatal {
    /// A fatal error with no header to echo.
    pub fn new(fes: Fes, fei: u32, reason: impl Into<String>) -> Self {
        Fatal { fes, fei, reason: reason.into(), header: Vec::new() }
    }
}
