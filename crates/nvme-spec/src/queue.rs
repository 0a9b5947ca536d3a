//! Submission and completion queue entries (NVMe Base 2.0 section 4.2, 4.6)
//! and the SGL descriptor carried in an SQE's data pointer (section 4.3.2).

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// A 64-byte submission queue entry.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, PartialEq, Eq)]
#[repr(C)]
pub struct Sqe {
    /// Command opcode (CDW0 bits 7:0).
    pub opcode: u8,
    /// Fused operation (bits 1:0) and PSDT (bits 7:6) (CDW0 bits 15:8).
    /// Over fabrics the data pointer is an SGL, so a host sets PSDT to 01b
    /// ([`Sqe::set_sgl`]) on every command, Fabrics commands included: the
    /// Linux target refuses any other value with Invalid Field.
    pub flags: u8,
    /// Command identifier (CDW0 bits 31:16).
    pub cid: U16,
    /// Namespace identifier; for Fabrics commands byte 4 holds FCTYPE.
    pub nsid: U32,
    /// Command dword 2.
    pub cdw2: U32,
    /// Command dword 3.
    pub cdw3: U32,
    /// Metadata pointer.
    pub mptr: U64,
    /// Data pointer: an SGL descriptor on fabrics.
    pub dptr: Sgl,
    /// Command dword 10.
    pub cdw10: U32,
    /// Command dword 11.
    pub cdw11: U32,
    /// Command dword 12.
    pub cdw12: U32,
    /// Command dword 13.
    pub cdw13: U32,
    /// Command dword 14.
    pub cdw14: U32,
    /// Command dword 15.
    pub cdw15: U32,
}

const _: () = assert!(core::mem::size_of::<Sqe>() == 64);
const _: () = assert!(core::mem::offset_of!(Sqe, dptr) == 24);
const _: () = assert!(core::mem::offset_of!(Sqe, cdw10) == 40);

impl Sqe {
    /// Size of an SQE in bytes.
    pub const LEN: usize = 64;

    /// PSDT bits of [`flags`](Self::flags).
    pub const PSDT_MASK: u8 = 0xc0;
    /// PSDT 01b: the data pointer is an SGL (what every fabrics command
    /// carries).
    pub const PSDT_SGL: u8 = 0x40;

    /// Puts `sgl` in the data pointer and says so in PSDT, keeping the
    /// fused bits.
    pub fn set_sgl(&mut self, sgl: Sgl) {
        self.dptr = sgl;
        self.flags = (self.flags & !Self::PSDT_MASK) | Self::PSDT_SGL;
    }

    /// The Fabrics command type (FCTYPE, byte 4) of a Fabrics command.
    pub fn fctype(&self) -> u8 {
        self.nsid.get().to_le_bytes()[0]
    }

    /// Data transfer direction from opcode bits 1:0 (NVMe Base 2.0 figure 89).
    pub fn data_direction(&self) -> DataDirection {
        let bits = if self.opcode == crate::opcode::Admin::FABRICS.0 { self.fctype() & 0x3 } else { self.opcode & 0x3 };
        match bits {
            1 => DataDirection::HostToController,
            2 => DataDirection::ControllerToHost,
            3 => DataDirection::Bidirectional,
            _ => DataDirection::None,
        }
    }

    /// Whether the command may carry data from the host (opcode or FCTYPE
    /// bit 0: host to controller, or bidirectional): the only commands
    /// in-capsule data is for.
    pub fn takes_host_data(&self) -> bool {
        matches!(self.data_direction(), DataDirection::HostToController | DataDirection::Bidirectional)
    }

    /// Starting LBA of an NVM I/O command (CDW11:CDW10).
    pub fn slba(&self) -> u64 {
        (u64::from(self.cdw11.get()) << 32) | u64::from(self.cdw10.get())
    }

    /// Number of logical blocks of an NVM I/O command: CDW12 bits 15:0 are
    /// 0-based (`nlb`), this returns the count.
    pub fn blocks(&self) -> u32 {
        (self.cdw12.get() & 0xffff) + 1
    }

    /// Force Unit Access (CDW12 bit 30) of Read/Write.
    pub fn fua(&self) -> bool {
        self.cdw12.get() & (1 << 30) != 0
    }
}

/// Direction of a command's data transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataDirection {
    /// No data.
    None,
    /// Write-like: data flows from host to controller.
    HostToController,
    /// Read-like: data flows from controller to host.
    ControllerToHost,
    /// Both ways (not supported by ironwire).
    Bidirectional,
}

/// A 16-byte SGL descriptor (NVMe Base 2.0 section 4.3.2).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, PartialEq, Eq)]
#[repr(C)]
pub struct Sgl {
    /// Address, or the offset into the capsule for in-capsule data.
    pub addr: U64,
    /// Length in bytes.
    pub length: U32,
    /// Reserved.
    pub rsvd: [u8; 3],
    /// Descriptor type (bits 7:4) and subtype (bits 3:0).
    pub type_subtype: u8,
}

const _: () = assert!(core::mem::size_of::<Sgl>() == 16);

impl Sgl {
    /// SGL Data Block descriptor type.
    pub const TYPE_DATA_BLOCK: u8 = 0x0;
    /// Transport SGL Data Block descriptor type.
    pub const TYPE_TRANSPORT_DATA_BLOCK: u8 = 0x5;
    /// Subtype "offset": the address is an offset into the capsule.
    pub const SUBTYPE_OFFSET: u8 = 0x1;
    /// Subtype "transport specific" (NVMe/TCP: data moves in H2C/C2H PDUs).
    pub const SUBTYPE_TRANSPORT: u8 = 0xa;

    /// Descriptor type.
    pub fn desc_type(&self) -> u8 {
        self.type_subtype >> 4
    }

    /// Descriptor subtype.
    pub fn subtype(&self) -> u8 {
        self.type_subtype & 0xf
    }

    /// An in-capsule data descriptor of `len` bytes at capsule offset 0.
    pub fn in_capsule(len: u32) -> Self {
        Sgl {
            addr: 0.into(),
            length: len.into(),
            rsvd: [0; 3],
            type_subtype: (Self::TYPE_DATA_BLOCK << 4) | Self::SUBTYPE_OFFSET,
        }
    }

    /// A transport data block descriptor (data moves in separate PDUs).
    pub fn transport(len: u32) -> Self {
        Sgl {
            addr: 0.into(),
            length: len.into(),
            rsvd: [0; 3],
            type_subtype: (Self::TYPE_TRANSPORT_DATA_BLOCK << 4) | Self::SUBTYPE_TRANSPORT,
        }
    }
}

/// A 16-byte completion queue entry (NVMe Base 2.0 section 4.6).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, PartialEq, Eq)]
#[repr(C)]
pub struct Cqe {
    /// Command-specific dword 0.
    pub dw0: U32,
    /// Command-specific dword 1.
    pub dw1: U32,
    /// Submission queue head pointer.
    pub sqhd: U16,
    /// Submission queue identifier.
    pub sqid: U16,
    /// Command identifier of the completed command.
    pub cid: U16,
    /// Phase tag (bit 0) and status field (bits 15:1).
    pub status: U16,
}

const _: () = assert!(core::mem::size_of::<Cqe>() == 16);

impl Cqe {
    /// Size of a CQE in bytes.
    pub const LEN: usize = 16;

    /// A completion for `cid` with `status` and result `dw0`.
    pub fn new(cid: u16, status: crate::Status, dw0: u32) -> Self {
        Cqe {
            dw0: dw0.into(),
            dw1: 0.into(),
            sqhd: 0.into(),
            sqid: 0.into(),
            cid: cid.into(),
            status: (status.0 << 1).into(),
        }
    }

    /// The status field without the phase tag.
    pub fn status(&self) -> crate::Status {
        crate::Status(self.status.get() >> 1)
    }

    /// Replaces the status field, keeping the phase tag.
    pub fn set_status(&mut self, status: crate::Status) {
        self.status = ((status.0 << 1) | (self.status.get() & 1)).into();
    }

    /// The 64-bit result (Property Get returns 8-byte values in DW1:DW0).
    pub fn result_u64(&self) -> u64 {
        (u64::from(self.dw1.get()) << 32) | u64::from(self.dw0.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqe_round_trips_through_bytes() {
        let mut sqe = Sqe { opcode: 0x02, ..Default::default() };
        sqe.cid = 0x1234.into();
        sqe.nsid = 1.into();
        sqe.cdw10 = 0x10.into();
        sqe.cdw12 = 7.into();
        sqe.dptr = Sgl::transport(4096);
        let bytes = sqe.as_bytes().to_vec();
        assert_eq!(bytes.first(), Some(&0x02));
        assert_eq!(bytes.get(2..4), Some(&[0x34, 0x12][..]));
        assert_eq!(bytes.get(39), Some(&0x5a));
        let back = Sqe::read_from_bytes(&bytes).expect("64 bytes");
        assert_eq!(back, sqe);
        assert_eq!(back.slba(), 0x10);
        assert_eq!(back.blocks(), 8);
        assert_eq!(back.data_direction(), DataDirection::ControllerToHost);
    }

    #[test]
    fn fabrics_direction_comes_from_fctype() {
        let mut sqe = Sqe { opcode: 0x7f, ..Default::default() };
        sqe.nsid = 0x01.into(); // Connect: host to controller
        assert_eq!(sqe.data_direction(), DataDirection::HostToController);
        sqe.nsid = 0x04.into(); // Property Get: no data
        assert_eq!(sqe.data_direction(), DataDirection::None);
    }

    #[test]
    fn cqe_status_keeps_phase_bit_clear() {
        let cqe = Cqe::new(9, crate::Status::LBA_OUT_OF_RANGE.dnr(), 0);
        assert_eq!(cqe.status.get() & 1, 0);
        assert_eq!(cqe.status(), crate::Status(0x4080));
        assert_eq!(cqe.as_bytes().len(), 16);
    }
}
