//! Protocol errors: what the peer broke, and what the connection does about
//! it (RFC 7143 sections 7 and 11.17): reject the PDU and go on, reject it
//! and close, or just close (a header digest error leaves no trustworthy
//! length to resynchronize on at ErrorRecoveryLevel 0).

use crate::pdu::Bhs;

/// A Reject reason code (RFC 7143 section 11.17.1), open so unknown values
/// from the wire survive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RejectReason(pub u8);

impl RejectReason {
    /// Data (payload) digest error.
    pub const DATA_DIGEST_ERROR: RejectReason = RejectReason(0x02);
    /// SNACK Reject.
    pub const SNACK_REJECT: RejectReason = RejectReason(0x03);
    /// Protocol error.
    pub const PROTOCOL_ERROR: RejectReason = RejectReason(0x04);
    /// Command not supported.
    pub const COMMAND_NOT_SUPPORTED: RejectReason = RejectReason(0x05);
    /// Immediate command reject: too many immediate commands.
    pub const IMMEDIATE_COMMAND_REJECT: RejectReason = RejectReason(0x06);
    /// Task in progress.
    pub const TASK_IN_PROGRESS: RejectReason = RejectReason(0x07);
    /// Invalid data ack.
    pub const INVALID_DATA_ACK: RejectReason = RejectReason(0x08);
    /// Invalid PDU field.
    pub const INVALID_PDU_FIELD: RejectReason = RejectReason(0x09);
    /// Long op reject: can't generate a Target Transfer Tag, out of resources.
    pub const OUT_OF_RESOURCES: RejectReason = RejectReason(0x0a);
    /// Waiting for Logout.
    pub const WAITING_FOR_LOGOUT: RejectReason = RejectReason(0x0c);
}

/// What the connection does with an offending PDU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Send a Reject echoing the BHS, discard the PDU, carry on.
    Reject(RejectReason),
    /// Send a Reject echoing the BHS, then close the connection.
    RejectAndClose(RejectReason),
    /// Close the connection without a word.
    Close,
}

/// A protocol error found in the peer's bytes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {detail}")]
pub struct PduError {
    /// What happens next.
    pub disposition: Disposition,
    /// The BHS field (spec name) that was wrong.
    pub field: &'static str,
    /// What was expected and what came, for the log.
    pub detail: String,
    /// The offending BHS, echoed in the Reject.
    pub bhs: Option<Bhs>,
    /// Bytes the offending PDU occupies when it can be skipped.
    pub pdu_len: Option<usize>,
}

impl PduError {
    /// An error about `field`.
    pub fn new(disposition: Disposition, field: &'static str, detail: String, bhs: Option<Bhs>) -> Self {
        PduError { disposition, field, detail, bhs, pdu_len: None }
    }

    /// Records how many bytes to skip to discard the PDU.
    pub fn with_len(mut self, len: usize) -> Self {
        self.pdu_len = Some(len);
        self
    }

    /// Whether the connection must close.
    pub fn is_fatal(&self) -> bool {
        !matches!(self.disposition, Disposition::Reject(_))
    }
}
