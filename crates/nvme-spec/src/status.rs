//! Completion status values (NVMe Base 2.0 section 4.6.1.2).
//!
//! A [`Status`] holds the 15-bit status field as the kernel writes it:
//! SC in bits 7:0, SCT in bits 10:8, CRD 12:11, More bit 13, DNR bit 14.
//! The CQE stores it shifted left by one, above the phase tag.

/// An NVMe completion status (status code type and status code, plus DNR).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Status(pub u16);

impl Status {
    /// Successful completion.
    pub const SUCCESS: Status = Status(0x000);
    /// Invalid command opcode.
    pub const INVALID_OPCODE: Status = Status(0x001);
    /// Invalid field in command.
    pub const INVALID_FIELD: Status = Status(0x002);
    /// Command ID conflict.
    pub const CID_CONFLICT: Status = Status(0x003);
    /// Data transfer error.
    pub const DATA_TRANSFER_ERROR: Status = Status(0x004);
    /// Internal error.
    pub const INTERNAL: Status = Status(0x006);
    /// Command abort requested.
    pub const ABORT_REQUESTED: Status = Status(0x007);
    /// Command aborted due to SQ deletion.
    pub const ABORTED_SQ_DELETION: Status = Status(0x008);
    /// Invalid namespace or format.
    pub const INVALID_NAMESPACE: Status = Status(0x00b);
    /// Command sequence error.
    pub const COMMAND_SEQUENCE_ERROR: Status = Status(0x00c);
    /// Data SGL length invalid.
    pub const SGL_DATA_LENGTH_INVALID: Status = Status(0x00f);
    /// SGL descriptor type invalid.
    pub const SGL_DESCRIPTOR_TYPE_INVALID: Status = Status(0x011);
    /// SGL offset invalid.
    pub const SGL_OFFSET_INVALID: Status = Status(0x016);
    /// Host identifier inconsistent format.
    pub const HOST_ID_INCONSISTENT: Status = Status(0x018);
    /// Keep alive timer expired.
    pub const KEEP_ALIVE_EXPIRED: Status = Status(0x019);
    /// Keep alive timeout invalid.
    pub const KEEP_ALIVE_INVALID: Status = Status(0x01a);
    /// Transient transport error (a data digest mismatch, NVMe/TCP 7.4.6.1).
    pub const TRANSIENT_TRANSPORT_ERROR: Status = Status(0x022);
    /// Namespace is write protected (generic, 20h): the namespace refuses
    /// every command that would write it (NSATTR bit 0).
    pub const NS_WRITE_PROTECTED: Status = Status(0x020);
    /// LBA out of range.
    pub const LBA_OUT_OF_RANGE: Status = Status(0x080);
    /// Capacity exceeded.
    pub const CAPACITY_EXCEEDED: Status = Status(0x081);
    /// Namespace not ready.
    pub const NAMESPACE_NOT_READY: Status = Status(0x082);

    /// Command specific: invalid queue identifier.
    pub const INVALID_QUEUE_ID: Status = Status(0x101);
    /// Command specific: invalid queue size.
    pub const INVALID_QUEUE_SIZE: Status = Status(0x102);
    /// Command specific: abort command limit exceeded (more Aborts
    /// outstanding than Identify Controller's ACL + 1).
    pub const ABORT_COMMAND_LIMIT: Status = Status(0x103);
    /// Command specific: asynchronous event request limit exceeded.
    pub const ASYNC_EVENT_LIMIT: Status = Status(0x105);
    /// Command specific: invalid log page.
    pub const INVALID_LOG_PAGE: Status = Status(0x109);
    /// Command specific: feature identifier not saveable.
    pub const FEATURE_NOT_SAVEABLE: Status = Status(0x10d);
    /// Command specific: feature not changeable.
    pub const FEATURE_NOT_CHANGEABLE: Status = Status(0x10e);
    /// Fabrics Connect: incompatible format.
    pub const CONNECT_INCOMPATIBLE_FORMAT: Status = Status(0x180);
    /// Fabrics Connect: controller busy.
    pub const CONNECT_CONTROLLER_BUSY: Status = Status(0x181);
    /// Fabrics Connect: connect invalid parameters.
    pub const CONNECT_INVALID_PARAMETERS: Status = Status(0x182);
    /// Fabrics Connect: invalid host.
    pub const CONNECT_INVALID_HOST: Status = Status(0x184);
    /// Fabrics Disconnect: invalid queue type (sent on the admin queue).
    pub const DISCONNECT_INVALID_QUEUE_TYPE: Status = Status(0x185);
    /// NVM command set specific: attempted write to a read-only range.
    pub const WRITE_TO_READ_ONLY: Status = Status(0x182);
    /// NVM command set specific: the command exceeds a size limit of the
    /// NVM command set's Identify Controller (DMRL, DMRSL, DMSL, WZSL; NVM
    /// Command Set 1.0 figure 32, code 83h).
    pub const COMMAND_SIZE_LIMIT_EXCEEDED: Status = Status(0x183);
    /// Path related: asymmetric access persistent loss.
    pub const ANA_PERSISTENT_LOSS: Status = Status(0x301);
    /// Path related: asymmetric access inaccessible.
    pub const ANA_INACCESSIBLE: Status = Status(0x302);
    /// Path related: asymmetric access transition.
    pub const ANA_TRANSITION: Status = Status(0x303);
    /// Generic: command aborted due to failed fused command (the other
    /// half of a fused operation failed).
    pub const ABORTED_FAILED_FUSED: Status = Status(0x09);
    /// Generic: command aborted due to missing fused command.
    pub const ABORTED_MISSING_FUSED: Status = Status(0x0a);
    /// Media error: write fault.
    pub const WRITE_FAULT: Status = Status(0x280);
    /// Media error: unrecovered read error.
    pub const UNRECOVERED_READ: Status = Status(0x281);
    /// Media error: compare failure.
    pub const COMPARE_FAILURE: Status = Status(0x285);

    /// Do Not Retry bit.
    pub const DNR_BIT: u16 = 0x4000;

    /// This status with Do Not Retry set.
    #[must_use]
    pub const fn dnr(self) -> Status {
        Status(self.0 | Self::DNR_BIT)
    }

    /// True for a successful completion.
    pub fn is_success(self) -> bool {
        self.0 & 0x7ff == 0
    }

    /// Status code type (bits 10:8).
    pub fn sct(self) -> u8 {
        ((self.0 >> 8) & 0x7) as u8
    }

    /// Status code (bits 7:0).
    pub fn sc(self) -> u8 {
        (self.0 & 0xff) as u8
    }
}

impl Status {
    /// The status code's name as NVMe Base 2.0 section 4.6.1.2 gives it,
    /// for logs and `ctl` output; `None` for a code this crate does not
    /// name. Command-specific code 0x82 means "Connect Invalid Parameters"
    /// to a Fabrics Connect and "Attempted Write to Read Only Range" to an
    /// I/O command: both are named.
    pub fn name(self) -> Option<&'static str> {
        Some(match (self.sct(), self.sc()) {
            (0, 0x00) => "Successful Completion",
            (0, 0x01) => "Invalid Command Opcode",
            (0, 0x02) => "Invalid Field in Command",
            (0, 0x03) => "Command ID Conflict",
            (0, 0x04) => "Data Transfer Error",
            (0, 0x06) => "Internal Error",
            (0, 0x07) => "Command Abort Requested",
            (0, 0x08) => "Command Aborted due to SQ Deletion",
            (0, 0x09) => "Command Aborted due to Failed Fused Command",
            (0, 0x0a) => "Command Aborted due to Missing Fused Command",
            (0, 0x0b) => "Invalid Namespace or Format",
            (0, 0x0c) => "Command Sequence Error",
            (0, 0x0f) => "Data SGL Length Invalid",
            (0, 0x11) => "SGL Descriptor Type Invalid",
            (0, 0x16) => "SGL Offset Invalid",
            (0, 0x18) => "Host Identifier Inconsistent Format",
            (0, 0x19) => "Keep Alive Timer Expired",
            (0, 0x1a) => "Keep Alive Timeout Invalid",
            (0, 0x20) => "Namespace is Write Protected",
            (0, 0x22) => "Transient Transport Error",
            (0, 0x80) => "LBA Out of Range",
            (0, 0x81) => "Capacity Exceeded",
            (0, 0x82) => "Namespace Not Ready",
            (1, 0x01) => "Invalid Queue Identifier",
            (1, 0x02) => "Invalid Queue Size",
            (1, 0x03) => "Abort Command Limit Exceeded",
            (1, 0x05) => "Asynchronous Event Request Limit Exceeded",
            (1, 0x09) => "Invalid Log Page",
            (1, 0x0d) => "Feature Identifier Not Saveable",
            (1, 0x0e) => "Feature Not Changeable",
            (1, 0x80) => "Connect Incompatible Format",
            (1, 0x81) => "Connect Controller Busy",
            (1, 0x82) => "Connect Invalid Parameters / Attempted Write to Read Only Range",
            (1, 0x83) => "Connect Restart Discovery / Command Size Limit Exceeded",
            (1, 0x84) => "Connect Invalid Host",
            (1, 0x85) => "Invalid Queue Type",
            (2, 0x80) => "Write Fault",
            (2, 0x81) => "Unrecovered Read Error",
            (2, 0x85) => "Compare Failure",
            _ => return None,
        })
    }
}

/// The name, then the codes: `LBA Out of Range (sct 0x0 sc 0x80, dnr)`.
impl core::fmt::Display for Status {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let dnr = if self.0 & Self::DNR_BIT != 0 { ", dnr" } else { "" };
        match self.name() {
            Some(name) => write!(f, "{name} (sct {:#x} sc {:#04x}{dnr})", self.sct(), self.sc()),
            None => write!(f, "sct {:#x} sc {:#04x}{dnr}", self.sct(), self.sc()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Status;

    #[test]
    fn displays_the_status_name_before_its_codes() {
        assert_eq!(Status::LBA_OUT_OF_RANGE.dnr().to_string(), "LBA Out of Range (sct 0x0 sc 0x80, dnr)");
        assert_eq!(Status::COMPARE_FAILURE.to_string(), "Compare Failure (sct 0x2 sc 0x85)");
        assert_eq!(Status(0x0ff).to_string(), "sct 0x0 sc 0xff");
    }

    #[test]
    fn every_named_constant_has_a_name() {
        for s in [
            Status::SUCCESS,
            Status::INVALID_OPCODE,
            Status::INVALID_FIELD,
            Status::CID_CONFLICT,
            Status::DATA_TRANSFER_ERROR,
            Status::INTERNAL,
            Status::ABORT_REQUESTED,
            Status::ABORTED_SQ_DELETION,
            Status::INVALID_NAMESPACE,
            Status::COMMAND_SEQUENCE_ERROR,
            Status::SGL_DATA_LENGTH_INVALID,
            Status::SGL_DESCRIPTOR_TYPE_INVALID,
            Status::SGL_OFFSET_INVALID,
            Status::HOST_ID_INCONSISTENT,
            Status::KEEP_ALIVE_EXPIRED,
            Status::KEEP_ALIVE_INVALID,
            Status::TRANSIENT_TRANSPORT_ERROR,
            Status::LBA_OUT_OF_RANGE,
            Status::CAPACITY_EXCEEDED,
            Status::NAMESPACE_NOT_READY,
            Status::INVALID_QUEUE_ID,
            Status::INVALID_QUEUE_SIZE,
            Status::ASYNC_EVENT_LIMIT,
            Status::ABORT_COMMAND_LIMIT,
            Status::INVALID_LOG_PAGE,
            Status::FEATURE_NOT_SAVEABLE,
            Status::FEATURE_NOT_CHANGEABLE,
            Status::CONNECT_INCOMPATIBLE_FORMAT,
            Status::CONNECT_CONTROLLER_BUSY,
            Status::CONNECT_INVALID_PARAMETERS,
            Status::CONNECT_INVALID_HOST,
            Status::DISCONNECT_INVALID_QUEUE_TYPE,
            Status::WRITE_TO_READ_ONLY,
            Status::NS_WRITE_PROTECTED,
            Status::WRITE_FAULT,
            Status::UNRECOVERED_READ,
            Status::COMPARE_FAILURE,
        ] {
            assert!(s.dnr().name().is_some(), "{:#x} has no name", s.0);
        }
    }
}
