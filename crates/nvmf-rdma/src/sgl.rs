//! The data pointer of a command over RDMA: a keyed SGL data block (the
//! host's registered buffer, moved by RDMA Read or Write) or in-capsule
//! data (an offset data block at offset 0).

use nvme_spec::{Sgl, Sqe, Status};
use zerocopy::IntoBytes;

/// Keyed SGL Data Block descriptor type.
pub const TYPE_KEYED_DATA_BLOCK: u8 = 0x4;
/// Keyed subtype: plain address.
pub const SUBTYPE_ADDRESS: u8 = 0x0;
/// Keyed subtype: invalidate the key when the command completes.
pub const SUBTYPE_INVALIDATE: u8 = 0xf;

/// A keyed SGL data block: the host's buffer for this command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keyed {
    /// The buffer's address (the tagged offset of its first byte).
    pub addr: u64,
    /// Length in bytes (24 bits on the wire).
    pub len: u32,
    /// The key (the host's STag).
    pub key: u32,
    /// The host asked for the key to be invalidated with the completion.
    pub invalidate: bool,
}

/// Where a command's data is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataPtr {
    /// In the host's registered buffer.
    Keyed(Keyed),
    /// In the capsule, `len` bytes.
    InCapsule {
        /// Bytes.
        len: u32,
    },
}

/// Reads the data pointer of `sqe`; `in_capsule` is how many data bytes the
/// capsule carried. Failures are the status to complete the command with.
pub fn parse(sqe: &Sqe, in_capsule: usize, max_transfer: u32) -> Result<DataPtr, Status> {
    // Read where it lies: a copy of the descriptor is split into stores
    // that the reads below cannot be forwarded from.
    let sgl: &Sgl = &sqe.dptr;
    let b = sgl.as_bytes();
    let le32 = |at: usize| {
        b.get(at..at.saturating_add(4)).and_then(|s| <[u8; 4]>::try_from(s).ok()).map_or(0, u32::from_le_bytes)
    };
    match (sgl.desc_type(), sgl.subtype()) {
        (TYPE_KEYED_DATA_BLOCK, st @ (SUBTYPE_ADDRESS | SUBTYPE_INVALIDATE)) => {
            if in_capsule != 0 {
                return Err(Status::SGL_DESCRIPTOR_TYPE_INVALID.dnr());
            }
            let len = le32(8) & 0x00ff_ffff;
            if len > max_transfer {
                return Err(Status::SGL_DATA_LENGTH_INVALID.dnr());
            }
            Ok(DataPtr::Keyed(Keyed { addr: sgl.addr.get(), len, key: le32(11), invalidate: st == SUBTYPE_INVALIDATE }))
        }
        (Sgl::TYPE_DATA_BLOCK, Sgl::SUBTYPE_OFFSET) => {
            let len = sgl.length.get();
            if len != 0 && !sqe.takes_host_data() {
                // In-capsule data is write data: a command that returns
                // data needs a keyed buffer to put it in.
                Err(Status::INVALID_FIELD.dnr())
            } else if sgl.addr.get() != 0 {
                Err(Status::SGL_OFFSET_INVALID.dnr())
            } else if usize::try_from(len).ok() != Some(in_capsule) {
                Err(Status::SGL_DATA_LENGTH_INVALID.dnr())
            } else {
                Ok(DataPtr::InCapsule { len })
            }
        }
        (TYPE_KEYED_DATA_BLOCK, _) => Err(Status::INVALID_FIELD.dnr()),
        _ => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID.dnr()),
    }
}

/// A keyed SGL data block descriptor: `len` bytes (at most 2^24 - 1) at
/// `addr` in the host's memory registered under `key`; `invalidate` asks
/// the controller to invalidate the key with its completion.
pub fn keyed(addr: u64, len: u32, key: u32, invalidate: bool) -> Sgl {
    // Bytes 8..11 are the length, 11..15 the key: in the generic layout
    // the key's first byte is the length field's last.
    let [l0, l1, l2, _] = len.min(0x00ff_ffff).to_le_bytes();
    let [k0, k1, k2, k3] = key.to_le_bytes();
    let subtype = if invalidate { SUBTYPE_INVALIDATE } else { SUBTYPE_ADDRESS };
    Sgl {
        addr: addr.into(),
        length: u32::from_le_bytes([l0, l1, l2, k0]).into(),
        rsvd: [k1, k2, k3],
        type_subtype: (TYPE_KEYED_DATA_BLOCK << 4) | subtype,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use zerocopy::FromBytes;

    fn sqe_with(dptr: [u8; 16]) -> Sqe {
        Sqe { opcode: 0x01, dptr: Sgl::read_from_bytes(&dptr).unwrap(), ..Default::default() }
    }

    #[test]
    fn reads_the_linux_hosts_keyed_invalidate_descriptor() {
        // addr, LE24 length 4096, LE32 key 0x12345678, type 0x4f
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&0xffff_8880_1234_5000u64.to_le_bytes());
        d[8..11].copy_from_slice(&[0x00, 0x10, 0x00]);
        d[11..15].copy_from_slice(&0x1234_5678u32.to_le_bytes());
        d[15] = 0x4f;
        let k = parse(&sqe_with(d), 0, 1 << 20).unwrap();
        assert_eq!(
            k,
            DataPtr::Keyed(Keyed { addr: 0xffff_8880_1234_5000, len: 4096, key: 0x1234_5678, invalidate: true })
        );
        d[15] = 0x40;
        assert!(matches!(parse(&sqe_with(d), 0, 1 << 20).unwrap(), DataPtr::Keyed(Keyed { invalidate: false, .. })));
        assert_eq!(parse(&sqe_with(d), 0, 1024).unwrap_err(), Status::SGL_DATA_LENGTH_INVALID.dnr());
    }

    #[test]
    fn in_capsule_data_must_sit_at_offset_0_with_its_length() {
        let mut d = [0u8; 16];
        d[8..12].copy_from_slice(&512u32.to_le_bytes());
        d[15] = 0x01;
        assert_eq!(parse(&sqe_with(d), 512, 1 << 20).unwrap(), DataPtr::InCapsule { len: 512 });
        // Write data only: a Read (opcode 02h) or a Fabrics Property Get
        // with data in its capsule has nowhere to put what it returns.
        let read = Sqe { opcode: 0x02, ..sqe_with(d) };
        assert_eq!(parse(&read, 512, 1 << 20).unwrap_err(), Status::INVALID_FIELD.dnr());
        let write = Sqe { opcode: 0x01, ..sqe_with(d) };
        assert_eq!(parse(&write, 512, 1 << 20).unwrap(), DataPtr::InCapsule { len: 512 });
        let mut connect = Sqe { opcode: 0x7f, ..sqe_with(d) };
        connect.nsid = 0x01.into();
        assert_eq!(parse(&connect, 512, 1 << 20).unwrap(), DataPtr::InCapsule { len: 512 }, "Fabrics Connect");
        let mut prop_get = connect;
        prop_get.nsid = 0x04.into();
        assert_eq!(parse(&prop_get, 512, 1 << 20).unwrap_err(), Status::INVALID_FIELD.dnr(), "Property Get");
        assert_eq!(parse(&sqe_with(d), 256, 1 << 20).unwrap_err(), Status::SGL_DATA_LENGTH_INVALID.dnr());
        d[0] = 16;
        assert_eq!(parse(&sqe_with(d), 512, 1 << 20).unwrap_err(), Status::SGL_OFFSET_INVALID.dnr());
    }

    #[test]
    fn keyed_descriptors_read_back_as_written() {
        let sqe = Sqe { dptr: keyed(0xffff_8880_1234_5000, 4096, 0x1234_5678, true), ..Default::default() };
        let want = Keyed { addr: 0xffff_8880_1234_5000, len: 4096, key: 0x1234_5678, invalidate: true };
        assert_eq!(parse(&sqe, 0, 1 << 20).unwrap(), DataPtr::Keyed(want));
        let sqe = Sqe { dptr: keyed(0, 0, 0, false), ..Default::default() };
        assert_eq!(parse(&sqe, 0, 0).unwrap(), DataPtr::Keyed(Keyed { addr: 0, len: 0, key: 0, invalidate: false }));
    }

    #[test]
    fn other_descriptors_are_refused() {
        let mut d = [0u8; 16];
        d[15] = 0x4a;
        assert_eq!(parse(&sqe_with(d), 0, 1 << 20).unwrap_err(), Status::INVALID_FIELD.dnr());
        d[15] = 0x5a; // NVMe/TCP's transport data block
        assert_eq!(parse(&sqe_with(d), 0, 1 << 20).unwrap_err(), Status::SGL_DESCRIPTOR_TYPE_INVALID.dnr());
    }
}
