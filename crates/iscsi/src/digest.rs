//! CRC32C header and data digests (RFC 7143 section 13.1, RFC 3720 appendix B.4).
//!
//! The `checksum` crate computes it (runtime-dispatched SIMD). iSCSI carries the CRC least significant byte
//! first, as the test vectors of RFC 3720 B.4 show.

/// Digest length in bytes.
pub const LEN: usize = 4;

/// The CRC32C of `bytes` as carried on the wire.
pub fn crc32c(bytes: &[u8]) -> [u8; 4] {
    checksum::crc32c(bytes).to_le_bytes()
}

/// A running CRC32C's value as carried on the wire (a digest fed as its
/// bytes were copied).
pub fn of(crc: &checksum::Crc32c) -> [u8; 4] {
    crc.value().to_le_bytes()
}

/// The CRC32C of `len` zero bytes as carried on the wire.
pub fn crc32c_of_zeros(len: usize) -> [u8; 4] {
    checksum::crc32c_of_zeros(len).to_le_bytes()
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_the_rfc3720_test_vectors() {
        // RFC 3720 B.4: 32 bytes of zeros give aa 36 91 8a on the wire,
        // 32 bytes of 0xff give 43 ab a8 62, 0..=31 give 4e 79 dd 46.
        assert_eq!(super::crc32c(&[0u8; 32]), [0xaa, 0x36, 0x91, 0x8a]);
        assert_eq!(super::crc32c(&[0xffu8; 32]), [0x43, 0xab, 0xa8, 0x62]);
        let inc: Vec<u8> = (0u8..32).collect();
        assert_eq!(super::crc32c(&inc), [0x4e, 0x79, 0xdd, 0x46]);
    }
}
