//! Fabrics command fields and the Connect data (NVMe-oF 1.1 section 3.3).
//!
//! Fabrics commands reuse the 64-byte SQE with their own layout; these
//! accessors read it from an [`Sqe`] so there is one SQE type.

use crate::Sqe;
use zerocopy::little_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Connect command fields read from an SQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectCmd {
    /// Record format (must be 0).
    pub recfmt: u16,
    /// Queue identifier (0 = admin queue).
    pub qid: u16,
    /// Submission queue size, 0-based.
    pub sqsize: u16,
    /// Connect attributes (bit 2: disable SQ flow control).
    pub cattr: u8,
    /// Keep alive timeout in milliseconds (admin queue only).
    pub kato_ms: u32,
}

impl ConnectCmd {
    /// Byte offset of SQSIZE within the SQE, for error reporting (IPO).
    pub const SQSIZE_OFFSET: u16 = 44;
    /// Byte offset of QID within the SQE.
    pub const QID_OFFSET: u16 = 42;
    /// Byte offset of RECFMT within the SQE.
    pub const RECFMT_OFFSET: u16 = 40;
    /// CATTR bit: the host asks to disable SQ flow control.
    pub const CATTR_DISABLE_SQ_FLOW: u8 = 1 << 2;

    /// Reads the Connect fields from `sqe` (CDW10..CDW12).
    pub fn from_sqe(sqe: &Sqe) -> Self {
        let cdw10 = sqe.cdw10.get();
        let cdw11 = sqe.cdw11.get();
        ConnectCmd {
            recfmt: (cdw10 & 0xffff) as u16,
            qid: (cdw10 >> 16) as u16,
            sqsize: (cdw11 & 0xffff) as u16,
            cattr: ((cdw11 >> 16) & 0xff) as u8,
            kato_ms: sqe.cdw12.get(),
        }
    }
}

/// The 1024-byte Connect data (NVMe-oF 1.1 figure 20).
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct ConnectData {
    /// Host identifier.
    pub hostid: [u8; 16],
    /// Controller ID: 0xffff asks for a dynamic controller (admin queue);
    /// for I/O queues, the controller the queue joins.
    pub cntlid: U16,
    /// Reserved.
    pub rsvd: [u8; 238],
    /// Subsystem NQN, NUL-padded.
    pub subnqn: [u8; 256],
    /// Host NQN, NUL-padded.
    pub hostnqn: [u8; 256],
    /// Reserved.
    pub rsvd2: [u8; 256],
}

const _: () = assert!(core::mem::size_of::<ConnectData>() == 1024);
const _: () = assert!(core::mem::offset_of!(ConnectData, subnqn) == 256);
const _: () = assert!(core::mem::offset_of!(ConnectData, hostnqn) == 512);

impl ConnectData {
    /// Byte offset of CNTLID within the Connect data (for IPO).
    pub const CNTLID_OFFSET: u16 = 16;
    /// Byte offset of SUBNQN within the Connect data.
    pub const SUBNQN_OFFSET: u16 = 256;
    /// Byte offset of HOSTNQN within the Connect data.
    pub const HOSTNQN_OFFSET: u16 = 512;

    /// Builds Connect data for a host.
    pub fn new(hostid: [u8; 16], cntlid: u16, subnqn: &str, hostnqn: &str) -> Self {
        let mut d = ConnectData {
            hostid,
            cntlid: cntlid.into(),
            rsvd: [0; 238],
            subnqn: [0; 256],
            hostnqn: [0; 256],
            rsvd2: [0; 256],
        };
        copy_nqn(&mut d.subnqn, subnqn);
        copy_nqn(&mut d.hostnqn, hostnqn);
        d
    }

    /// The subsystem NQN, or `None` if it is not NUL-terminated UTF-8.
    pub fn subnqn(&self) -> Option<&str> {
        nqn_str(&self.subnqn)
    }

    /// The host NQN, or `None` if it is not NUL-terminated UTF-8. It may
    /// be empty: spdk_nvme_perf sends none by default, and SPDK and the
    /// kernel target let such a host into subsystems open to any host.
    pub fn hostnqn(&self) -> Option<&str> {
        let end = self.hostnqn.iter().position(|&b| b == 0)?;
        core::str::from_utf8(self.hostnqn.get(..end)?).ok()
    }
}

fn copy_nqn(dst: &mut [u8; 256], nqn: &str) {
    for (d, s) in dst.iter_mut().take(255).zip(nqn.bytes()) {
        *d = s;
    }
}

/// An NQN field: UTF-8 up to the first NUL, which must exist (max 223 bytes
/// by NVMe Base 2.0 section 4.5, but hosts pad to 256).
fn nqn_str(field: &[u8; 256]) -> Option<&str> {
    let end = field.iter().position(|&b| b == 0)?;
    let s = core::str::from_utf8(field.get(..end)?).ok()?;
    (!s.is_empty()).then_some(s)
}

/// Property Get/Set fields read from an SQE (NVMe-oF 1.1 figures 23, 25).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PropertyCmd {
    /// Size (ATTRIB bits 2:0): 4 bytes (000b) or 8 (001b); `None` for a
    /// reserved value (010b to 111b).
    pub len_bytes: Option<u8>,
    /// Property offset.
    pub offset: u32,
    /// Value to set (Property Set only).
    pub value: u64,
}

impl PropertyCmd {
    /// Reads the property fields from `sqe`.
    pub fn from_sqe(sqe: &Sqe) -> Self {
        PropertyCmd {
            len_bytes: match sqe.cdw10.get() & 0x7 {
                0 => Some(4),
                1 => Some(8),
                _ => None,
            },
            offset: sqe.cdw11.get(),
            value: (u64::from(sqe.cdw13.get()) << 32) | u64::from(sqe.cdw12.get()),
        }
    }
}

/// The IPO/IATTR result of a Connect rejected for invalid parameters:
/// IPO, the field's byte `offset`, in bits 15:00, and IATTR in bit 16,
/// `in_data` selecting the Connect data (1) or the SQE (0). The Linux host
/// decodes it so to name the field, as nvmet and SPDK encode it.
pub fn connect_invalid_param_result(in_data: bool, offset: u16) -> u32 {
    u32::from(offset) | (u32::from(in_data) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_data_round_trips_nqns() {
        let d = ConnectData::new([7; 16], 0xffff, "nqn.a:sub", "nqn.b:host");
        let bytes = d.as_bytes();
        assert_eq!(bytes.get(16..18), Some(&[0xff, 0xff][..]));
        assert_eq!(bytes.get(256..265), Some(&b"nqn.a:sub"[..]));
        let back = ConnectData::read_from_bytes(bytes).expect("1024 bytes");
        assert_eq!(back.subnqn(), Some("nqn.a:sub"));
        assert_eq!(back.hostnqn(), Some("nqn.b:host"));
        let empty = ConnectData::new([0; 16], 0xffff, "", "");
        assert_eq!(empty.hostnqn(), Some(""), "an empty host NQN is a value");
        assert_eq!(empty.subnqn(), None, "an empty subsystem NQN is not");
    }

    #[test]
    fn unterminated_nqn_is_rejected() {
        let mut d = ConnectData::new([0; 16], 1, "x", "y");
        d.subnqn = [b'a'; 256];
        assert_eq!(d.subnqn(), None);
    }

    #[test]
    fn connect_fields_come_from_cdw10_to_cdw12() {
        let mut sqe = Sqe { opcode: 0x7f, ..Default::default() };
        sqe.cdw10 = (3u32 << 16).into();
        sqe.cdw11 = (127u32 | (4 << 16)).into();
        sqe.cdw12 = 5000.into();
        let c = ConnectCmd::from_sqe(&sqe);
        assert_eq!(c, ConnectCmd { recfmt: 0, qid: 3, sqsize: 127, cattr: 4, kato_ms: 5000 });
    }

    #[test]
    fn property_size_is_4_or_8_bytes_and_the_rest_reserved() {
        let mut sqe = Sqe { opcode: 0x7f, ..Default::default() };
        let sizes: Vec<Option<u8>> = (0..8u32)
            .map(|attrib| {
                sqe.cdw10 = (attrib | 0xf8).into();
                PropertyCmd::from_sqe(&sqe).len_bytes
            })
            .collect();
        assert_eq!(sizes, [Some(4), Some(8), None, None, None, None, None, None]);
    }
}
