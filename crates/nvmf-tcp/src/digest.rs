//! CRC32C header and data digests (TP 8000 section 7.4.6), computed by the
//! `checksum` crate (runtime-dispatched SIMD).

/// Digest length in bytes.
pub const LEN: usize = 4;

/// The CRC32C of `bytes`, as carried on the wire (little-endian).
pub fn crc32c(bytes: &[u8]) -> [u8; 4] {
    checksum::crc32c(bytes).to_le_bytes()
}

/// A running CRC32C's value as carried on the wire (a digest fed as its
/// bytes were copied).
pub fn of(crc: &checksum::Crc32c) -> [u8; 4] {
    crc.value().to_le_bytes()
}

/// The CRC32C of `len` zero bytes, as carried on the wire.
pub fn crc32c_of_zeros(len: usize) -> [u8; 4] {
    checksum::crc32c_of_zeros(len).to_le_bytes()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_digest_of_zeros_is_the_digest_of_that_many_zero_bytes() {
        for len in [0, 1, 4096, 65536, 65537, 300_000] {
            assert_eq!(super::crc32c_of_zeros(len), super::crc32c(&vec![0u8; len]), "{len} zeros");
        }
    }

    #[test]
    fn matches_the_rfc3720_test_vector() {
        // RFC 3720 B.4: 32 bytes of zeros give 0x8a9136aa.
        assert_eq!(super::crc32c(&[0u8; 32]), 0x8a91_36aau32.to_le_bytes());
    }
}
