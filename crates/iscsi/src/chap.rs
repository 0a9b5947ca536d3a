//! CHAP for iSCSI (RFC 7143 section 12.1.3, RFC 1994).
//!
//! The response is `H(identifier || secret || challenge)`. Algorithms are
//! numbered by the IANA "PPP Authentication Algorithms" registry that
//! RFC 7143 points CHAP_A at: 5 MD5 (RFC 1994), 6 SHA-1, 7 SHA-256,
//! 8 SHA3-256 (the numbers the Linux target's `iscsi_target_auth.h` and
//! open-iscsi's `chap_algs` use). Binary values are hex (`0x`) or base64
//! (`0b`) per RFC 7143 section 6.1. No randomness here: challenges come
//! from the caller.

use base64::Engine;
use sha2::Digest;

/// A CHAP algorithm number (CHAP_A), open so unknown offers survive parsing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChapAlgorithm(pub u8);

impl ChapAlgorithm {
    /// MD5 (RFC 1994).
    pub const MD5: ChapAlgorithm = ChapAlgorithm(5);
    /// SHA-1.
    pub const SHA1: ChapAlgorithm = ChapAlgorithm(6);
    /// SHA-256.
    pub const SHA256: ChapAlgorithm = ChapAlgorithm(7);
    /// SHA3-256.
    pub const SHA3_256: ChapAlgorithm = ChapAlgorithm(8);

    /// Every algorithm this crate implements, strongest first.
    pub const ALL: [ChapAlgorithm; 4] = [Self::SHA3_256, Self::SHA256, Self::SHA1, Self::MD5];

    /// Digest length in bytes, `None` when not implemented.
    pub fn digest_len(self) -> Option<usize> {
        Some(match self {
            Self::MD5 => 16,
            Self::SHA1 => 20,
            Self::SHA256 | Self::SHA3_256 => 32,
            _ => return None,
        })
    }

    /// `H(id || secret || challenge)`, `None` when not implemented.
    pub fn response(self, id: u8, secret: &[u8], challenge: &[u8]) -> Option<Vec<u8>> {
        fn run<D: Digest>(id: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
            let mut h = D::new();
            h.update([id]);
            h.update(secret);
            h.update(challenge);
            h.finalize().to_vec()
        }
        Some(match self {
            Self::MD5 => run::<md5::Md5>(id, secret, challenge),
            Self::SHA1 => run::<sha1::Sha1>(id, secret, challenge),
            Self::SHA256 => run::<sha2::Sha256>(id, secret, challenge),
            Self::SHA3_256 => run::<sha3::Sha3_256>(id, secret, challenge),
            _ => return None,
        })
    }
}

/// Picks the algorithm for a `CHAP_A=a1,a2,...` offer: the first value of
/// the initiator's list (its order of preference) that `supported` holds,
/// as RFC 7143 section 6.2 rules for list keys. The values are numbers,
/// decimal or hex (RFC 7143 sections 6.1 and 12.1.3).
pub fn choose(offer: &str, supported: &[ChapAlgorithm]) -> Option<ChapAlgorithm> {
    offer
        .split(',')
        .filter_map(|v| crate::text::parse_num(v.trim()).and_then(|n| u8::try_from(n).ok()))
        .map(ChapAlgorithm)
        .find(|a| supported.contains(a))
}

/// A CHAP secret. Its `Debug` never shows the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub Vec<u8>);

impl core::fmt::Debug for Secret {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Secret(<{} bytes>)", self.0.len())
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Secret(s.as_bytes().to_vec())
    }
}

/// Encodes binary as `0x` + lowercase hex.
pub fn encode_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len().saturating_mul(2).saturating_add(2));
    s.push_str("0x");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Decodes a binary value: `0x`/`0X` hex (odd length allowed, a leading
/// nibble of zero implied) or `0b`/`0B` base64.
pub fn decode_binary(s: &str) -> Option<Vec<u8>> {
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        if h.is_empty() || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let padded = if h.len() % 2 == 1 { format!("0{h}") } else { h.to_string() };
        let digits = padded.as_bytes();
        let mut out = Vec::with_capacity(digits.len() / 2);
        for pair in digits.chunks(2) {
            let txt = std::str::from_utf8(pair).ok()?;
            out.push(u8::from_str_radix(txt, 16).ok()?);
        }
        Some(out)
    } else if let Some(b) = s.strip_prefix("0b").or_else(|| s.strip_prefix("0B")) {
        base64::engine::general_purpose::STANDARD.decode(b).ok().filter(|v| !v.is_empty())
    } else {
        None
    }
}

/// Compares without an early exit on the first differing byte.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_response_is_md5_of_id_secret_challenge() {
        // RFC 1994 section 4.1 construction; the digest of the 0x01 || "secret"
        // || 0x02 0x03 message computed independently (md5sum of the bytes).
        let r = ChapAlgorithm::MD5.response(1, b"secret", &[2, 3]).expect("md5");
        let mut msg = vec![1u8];
        msg.extend_from_slice(b"secret");
        msg.extend_from_slice(&[2, 3]);
        assert_eq!(r, md5::Md5::digest(&msg).to_vec());
        // Known vector: MD5("") = d41d8cd98f00b204e9800998ecf8427e; with id 0
        // and empty secret and challenge the input is the single byte 0x00,
        // MD5(0x00) = 93b885adfe0da089cdf634904fd59f71.
        let z = ChapAlgorithm::MD5.response(0, b"", b"").expect("md5");
        assert_eq!(encode_hex(&z), "0x93b885adfe0da089cdf634904fd59f71");
    }

    #[test]
    fn sha_family_vectors() {
        // SHA-256("abc") with id 'a', secret "b", challenge "c".
        let r = ChapAlgorithm::SHA256.response(b'a', b"b", b"c").expect("sha256");
        assert_eq!(encode_hex(&r), "0xba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        let r = ChapAlgorithm::SHA1.response(b'a', b"b", b"c").expect("sha1");
        assert_eq!(encode_hex(&r), "0xa9993e364706816aba3e25717850c26c9cd0d89d");
        let r = ChapAlgorithm::SHA3_256.response(b'a', b"b", b"c").expect("sha3");
        assert_eq!(encode_hex(&r), "0x3a985da74fe225b2045c172d6bd390bd855f086e3e9d525b46bfe24511431532");
        assert_eq!(ChapAlgorithm(9).response(0, b"", b""), None);
    }

    #[test]
    fn chooses_the_first_supported_in_the_initiators_order() {
        assert_eq!(choose("8,7,6,5", &ChapAlgorithm::ALL), Some(ChapAlgorithm::SHA3_256));
        assert_eq!(choose("7,5", &[ChapAlgorithm::MD5, ChapAlgorithm::SHA256]), Some(ChapAlgorithm::SHA256));
        assert_eq!(choose("5", &[ChapAlgorithm::SHA256]), None);
        assert_eq!(choose("x,5", &ChapAlgorithm::ALL), Some(ChapAlgorithm::MD5));
        assert_eq!(choose("0x7", &ChapAlgorithm::ALL), Some(ChapAlgorithm::SHA256));
        assert_eq!(choose("261,5", &ChapAlgorithm::ALL), Some(ChapAlgorithm::MD5));
    }

    #[test]
    fn decodes_hex_and_base64() {
        assert_eq!(decode_binary("0x0a0B"), Some(vec![0x0a, 0x0b]));
        assert_eq!(decode_binary("0xabc"), Some(vec![0x0a, 0xbc]));
        assert_eq!(decode_binary("0bAQID"), Some(vec![1, 2, 3]));
        assert_eq!(decode_binary("0x"), None);
        assert_eq!(decode_binary("0xzz"), None);
        assert_eq!(decode_binary("1234"), None);
        assert_eq!(decode_binary("0b!!"), None);
        assert!(constant_time_eq(b"ab", b"ab"));
        assert!(!constant_time_eq(b"ab", b"ac"));
        assert!(!constant_time_eq(b"ab", b"abc"));
        assert_eq!(format!("{:?}", Secret::from("pw")), "Secret(<2 bytes>)");
    }
}
