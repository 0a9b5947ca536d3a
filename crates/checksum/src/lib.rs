//! CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
//! NVMe/TCP header and data digests (TP 8000 section 7.4.6), iSCSI digests
//! (RFC 7143 section 13.1) and the bench's block verification.
//!
//! `crc-fast` (the AWS SDK's CRC crate) picks the fastest path the CPU has
//! at run time: VPCLMULQDQ folding on AVX-512/AVX2 CPUs, PCLMULQDQ with the
//! crc32 instruction elsewhere on x86-64, the CRC and PMULL instructions
//! on aarch64. On this project's machine (AMD EPYC, AVX-512) it runs at
//! about 67 GB/s per core on 4 KiB buffers against 30 GB/s for the
//! `crc32c` crate it replaced (`cargo bench -p checksum`). Pieces of up
//! to 256 bytes (headers, command capsules) skip its dispatch: the CRC instruction takes
//! them 8 bytes at a time. Zeros (a null device's data, sent from a
//! shared page) are never read: they shift the CRC register by a power of
//! x, eight table lookups per bit set in their length. Bytes copied into a
//! buffer that a digest covers are fed as they are copied ([`Appender`]:
//! one pass over them where the CPU has VPCLMULQDQ, in 512-bit vectors
//! with AVX-512 and 256-bit ones with AVX2 alone). The
//! unsafe code is in these instruction paths, each behind a run-time
//! check of the CPU. This crate owns no I/O and no state beyond a running
//! value.

use crc_fast::{CrcAlgorithm, Digest};

mod append;
pub use append::Appender;

/// CRC32C's name in `crc-fast` (iSCSI's CRC is CRC32C).
const ALGORITHM: CrcAlgorithm = CrcAlgorithm::Crc32Iscsi;

/// The CRC32C of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    if let Some(register) = small::update(INIT, bytes) {
        return !register;
    }
    // A 32-bit CRC always fits in u32.
    crc_fast::checksum(ALGORITHM, bytes) as u32
}

/// Short pieces (a PDU header, an FPDU's header, a completion, a command
/// capsule's FPDU of 84 bytes) fed with the CRC instruction directly, 8
/// bytes at a time: `crc-fast`'s dispatch and state cost more than such
/// bytes do (6.5 ns for 8 bytes through it). Past 256 bytes its folding
/// wins (`cargo bench -p checksum -- crc32c/`).
mod small {
    /// The longest piece fed here.
    const MAX: usize = 256;

    /// The register after `bytes`, or `None` when they are longer than
    /// [`MAX`] or the CPU has no CRC instruction.
    #[inline]
    pub fn update(register: u32, bytes: &[u8]) -> Option<u32> {
        #[cfg(target_arch = "x86_64")]
        if bytes.len() <= MAX && std::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the CPU has SSE4.2 (checked just above).
            return Some(unsafe { x86(register, bytes) });
        }
        let _ = (register, bytes);
        None
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "sse4.2")]
    fn x86(register: u32, bytes: &[u8]) -> u32 {
        use std::arch::x86_64::{_mm_crc32_u16, _mm_crc32_u32, _mm_crc32_u64, _mm_crc32_u8};
        let mut words = bytes.chunks_exact(8);
        let mut r = u64::from(register);
        for w in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            r = _mm_crc32_u64(r, u64::from_le_bytes(b));
        }
        // A 32-bit register always fits in u32.
        let mut r = r as u32;
        // The last 0..=7 bytes in at most three steps (each waits for the
        // one before): an FPDU header is 16 to 28 bytes.
        let mut rest = words.remainder();
        if let Some((w, tail)) = rest.split_first_chunk::<4>() {
            r = _mm_crc32_u32(r, u32::from_le_bytes(*w));
            rest = tail;
        }
        if let Some((w, tail)) = rest.split_first_chunk::<2>() {
            r = _mm_crc32_u16(r, u16::from_le_bytes(*w));
            rest = tail;
        }
        if let Some(&b) = rest.first() {
            r = _mm_crc32_u8(r, b);
        }
        r
    }
}

/// CRC32C's polynomial, reflected: bit 31 stands for x^0, bit 0 for x^31.
const POLY: u32 = 0x82F6_3B78;

/// `a · b mod P`, both reflected polynomials (bit 31 is x^0): 32 rounds of
/// shift and xor. Used at compile time, to build the tables below.
const fn mul_mod(a: u32, mut b: u32) -> u32 {
    let mut product = 0u32;
    let mut i = 0;
    while i < 32 {
        // Bit 31 - i of `a` is the coefficient of x^i; `b` is b · x^i here.
        product ^= b & 0u32.wrapping_sub((a >> (31 - i)) & 1);
        b = (b >> 1) ^ (POLY & 0u32.wrapping_sub(b & 1));
        i += 1;
    }
    product
}

/// `X8[k]` is x^(8·2^k) mod P: the shift of a CRC register by 2^k zero
/// bytes, for every length a `usize` can say on a 64-bit target.
const X8: [u32; 64] = {
    let mut t = [0u32; 64];
    // x^8: bit 31 - 8.
    t[0] = 1 << (31 - 8);
    let mut k = 1;
    while k < 64 {
        t[k] = mul_mod(t[k - 1], t[k - 1]);
        k += 1;
    }
    t
};

/// `BY_BIT[k][j]` is `X8[k] · (bit j) mod P`: multiplying a register by
/// `X8[k]` is the xor of the entries of the bits it has set (the product
/// is linear in the register). 8 KiB, computed at compile time.
const BY_BIT: [[u32; 32]; 64] = {
    let mut t = [[0u32; 32]; 64];
    let mut k = 0;
    while k < 64 {
        let mut j = 0;
        while j < 32 {
            t[k][j] = mul_mod(X8[k], 1 << j);
            j += 1;
        }
        k += 1;
    }
    t
};

/// `BY_NIBBLE[k][n][v]` is `X8[k] · (v << 4n) mod P`: the same products
/// by register nibble, so that one multiplication is 8 independent table
/// loads and their xor instead of 32 and-xors in a row. 32 KiB, computed at
/// compile time from [`BY_BIT`]; a shift by one length touches 512 bytes.
static BY_NIBBLE: [[[u32; 16]; 8]; 64] = {
    let mut t = [[[0u32; 16]; 8]; 64];
    let mut k = 0;
    while k < 64 {
        let mut n = 0;
        while n < 8 {
            let mut v = 0;
            while v < 16 {
                let mut b = 0;
                while b < 4 {
                    if v & (1 << b) != 0 {
                        t[k][n][v] ^= BY_BIT[k][4 * n + b];
                    }
                    b += 1;
                }
                v += 1;
            }
            n += 1;
        }
        k += 1;
    }
    t
};

/// A CRC register after `len` more zero bytes: the register times
/// x^(8·len) mod P, one multiplication per bit set in `len`, so a page of
/// zeros costs one multiplication where feeding it costs 4 KiB of work.
fn shift_by_zeros(mut register: u32, len: usize) -> u32 {
    // Straight to each bit set: a page's length has one.
    let mut left = len as u64;
    while left != 0 {
        let Some(by_nibble) = BY_NIBBLE.get(left.trailing_zeros() as usize) else { break };
        let mut product = 0;
        for (n, row) in by_nibble.iter().enumerate() {
            // A nibble is at most 15: always inside the row.
            product ^= row.get(((register >> (4 * n)) & 0xf) as usize).copied().unwrap_or(0);
        }
        register = product;
        left &= left - 1;
    }
    register
}

/// The CRC32C of `len` zero bytes (a digest of data that is sent from a
/// shared page of zeros, never written).
pub fn crc32c_of_zeros(len: usize) -> u32 {
    let mut crc = Crc32c::new();
    crc.update_zeros(len);
    crc.value()
}

/// A CRC32C over pieces fed in order: the same value as [`crc32c`] of
/// their concatenation. It holds the CRC register alone (4 bytes, where a
/// `crc_fast::Digest` carries its algorithm's parameters, a few hundred
/// bytes to build and move).
#[derive(Clone, Copy)]
pub struct Crc32c {
    register: u32,
}

/// The register before any byte (CRC32C's init).
const INIT: u32 = !0;

/// The register after `bytes` through `crc-fast`: longer pieces, and every
/// piece on a CPU without the CRC instruction.
fn wide_update(register: u32, bytes: &[u8]) -> u32 {
    if bytes.is_empty() {
        return register;
    }
    let mut d = Digest::new_with_init_state(ALGORITHM, u64::from(register));
    d.update(bytes);
    // A 32-bit CRC's register always fits in u32.
    d.get_state() as u32
}

impl Crc32c {
    /// An empty running CRC.
    pub fn new() -> Self {
        Crc32c { register: INIT }
    }

    /// Feeds `bytes`: up to 256 of them with the CRC instruction directly
    /// (an FPDU's header, or its pad, usually empty), longer pieces
    /// through `crc-fast`.
    pub fn update(&mut self, bytes: &[u8]) {
        self.register = match small::update(self.register, bytes) {
            Some(register) => register,
            None => wide_update(self.register, bytes),
        };
    }

    /// Feeds `len` zero bytes (data sent from a shared page of zeros)
    /// without reading any: zeros only shift the register (see
    /// [`shift_by_zeros`]), at a cost that grows with the bits set in
    /// `len`, not with `len`.
    pub fn update_zeros(&mut self, len: usize) {
        self.register = shift_by_zeros(self.register, len);
    }

    /// The CRC32C of everything fed so far.
    pub fn value(&self) -> u32 {
        !self.register
    }
}

impl Default for Crc32c {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit-at-a-time CRC32C straight from the definition: the reference
    /// the fast paths are checked against.
    pub(crate) fn reference(bytes: &[u8]) -> u32 {
        !reference_register(!0, bytes)
    }

    /// The register after `bytes` from `crc`, a bit at a time.
    pub(crate) fn reference_register(mut crc: u32, bytes: &[u8]) -> u32 {
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
            }
        }
        crc
    }

    /// Pages of memory between two pages that fault on any access: a read
    /// or write one byte past a piece placed against either of them
    /// crashes the test, so a passing run proves there was none (no
    /// sanitizer needed).
    pub(crate) struct Guarded {
        base: *mut u8,
        page: usize,
        pages: usize,
    }

    impl Guarded {
        pub(crate) fn new(pages: usize) -> Self {
            // SAFETY: sysconf has no preconditions.
            let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap();
            let total = (pages + 2) * page;
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
            // SAFETY: a new anonymous mapping, no address asked for.
            let base =
                unsafe { libc::mmap(std::ptr::null_mut(), total, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
            assert_ne!(base, libc::MAP_FAILED);
            let base = base.cast::<u8>();
            // SAFETY: the first and last pages are inside the mapping just made.
            unsafe {
                assert_eq!(libc::mprotect(base.cast(), page, libc::PROT_NONE), 0);
                assert_eq!(libc::mprotect(base.add((pages + 1) * page).cast(), page, libc::PROT_NONE), 0);
            }
            Guarded { base, page, pages }
        }

        /// The usable bytes between the guards.
        pub(crate) fn len(&self) -> usize {
            self.pages * self.page
        }

        /// `len` bytes right after the leading guard (`at_end` false) or
        /// right before the trailing one.
        pub(crate) fn piece(&mut self, len: usize, at_end: bool) -> &mut [u8] {
            assert!(len <= self.len());
            let start = if at_end { self.page + self.len() - len } else { self.page };
            // SAFETY: inside the usable pages, which only this value hands out.
            unsafe { std::slice::from_raw_parts_mut(self.base.add(start), len) }
        }
    }

    impl Drop for Guarded {
        fn drop(&mut self) {
            // SAFETY: the mapping `new` made, no longer borrowed.
            unsafe { libc::munmap(self.base.cast(), (self.pages + 2) * self.page) };
        }
    }

    /// xorshift64*: reproducible bytes without a dependency.
    pub(crate) fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
            })
            .collect()
    }

    #[test]
    fn matches_rfc3720_test_vectors() {
        // RFC 3720 B.4 (kept in RFC 7143): 32 bytes of 0x00, of 0xff, and
        // incrementing and decrementing bytes.
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        let inc: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&inc), 0x46dd_794e);
        let dec: Vec<u8> = (0..32).rev().collect();
        assert_eq!(crc32c(&dec), 0x113f_db5c);
        assert_eq!(crc32c(b"123456789"), 0xe306_9283, "the CRC catalogue's check value");
    }

    #[test]
    fn matches_the_reference_at_every_length_to_4096_and_every_alignment() {
        let buf = random_bytes(4096 + 64, 0x1234_5678);
        for len in 0..=4096 {
            // Every alignment within a cache line, cycling with the length.
            let start = len % 64;
            let piece = &buf[start..start + len];
            assert_eq!(crc32c(piece), reference(piece), "length {len} at offset {start}");
        }
        for start in 0..64 {
            let piece = &buf[start..start + 4096 - 64];
            assert_eq!(crc32c(piece), reference(piece), "offset {start}");
        }
    }

    #[test]
    fn zeros_fed_without_reading_equal_zeros_fed_as_bytes() {
        let zeros = vec![0u8; 70_000];
        let lead = random_bytes(100, 7);
        let mut lengths: Vec<usize> = (0..=300).collect();
        lengths.extend([511, 512, 1000, 4095, 4096, 4097, 8192, 12345, 61_440, 65_535, 65_536, 70_000]);
        for len in lengths {
            for lead_len in [0, 1, 13, 100] {
                let mut fast = Crc32c::new();
                fast.update(&lead[..lead_len]);
                fast.update_zeros(len);
                // Bytes after the zeros continue from the shifted register.
                fast.update(b"tail");
                let mut slow = Crc32c::new();
                slow.update(&lead[..lead_len]);
                slow.update(&zeros[..len]);
                slow.update(b"tail");
                assert_eq!(fast.value(), slow.value(), "{len} zeros after {lead_len} bytes");
            }
            assert_eq!(crc32c_of_zeros(len), reference(&zeros[..len]), "{len} zeros alone");
        }
    }

    #[test]
    fn zeros_shift_any_register_as_zero_bytes_do_at_every_length_to_8192() {
        // Registers that stepped one zero byte at a time, from the init
        // and from another value.
        let (mut from_init, mut from_other) = (INIT, 0x89ab_cdef_u32);
        for len in 0..=8192 {
            assert_eq!(crc32c_of_zeros(len), !from_init, "{len} zeros");
            let mut c = Crc32c { register: 0x89ab_cdef };
            c.update_zeros(len);
            assert_eq!(c.register, from_other, "{len} zeros after another register");
            from_init = reference_register(from_init, &[0]);
            from_other = reference_register(from_other, &[0]);
        }
        // Lengths no buffer has: two shifts make one by their sum.
        for (a, b) in
            [(1usize << 40, 12_345), (usize::MAX / 3, usize::MAX / 3), (usize::MAX, 0), (1 << 63, (1 << 63) - 1)]
        {
            let mut parts = Crc32c { register: 0xdead_beef };
            parts.update_zeros(a);
            parts.update_zeros(b);
            let mut whole = Crc32c { register: 0xdead_beef };
            whole.update_zeros(a + b);
            assert_eq!(parts.register, whole.register, "{a} + {b} zeros");
        }
    }

    #[test]
    fn crc_fast_takes_any_register_at_every_length_the_crc_instruction_takes_here() {
        // CPUs without SSE4.2 (and other architectures) feed even a header
        // through `crc-fast`, from whatever register the pieces before left.
        let buf = random_bytes(600, 3);
        for len in 0..=600 {
            for register in [INIT, 0, 0x1234_5678] {
                let piece = &buf[..len];
                let want = reference_register(register, piece);
                assert_eq!(wide_update(register, piece), want, "crc-fast, {len} bytes from {register:#x}");
                if let Some(r) = small::update(register, piece) {
                    assert_eq!(r, want, "crc instruction, {len} bytes from {register:#x}");
                }
            }
        }
    }

    #[test]
    fn pieces_of_random_sizes_and_zeros_between_equal_the_crc_of_the_whole() {
        let buf = random_bytes(200_000, 77);
        let mut x = 0x1234_5678_9abc_def1_u64;
        let mut next = |max: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % max as u64) as usize
        };
        for max in [8usize, 64, 300, 5_000, 70_000] {
            let (mut c, mut whole, mut at) = (Crc32c::new(), Vec::new(), 0);
            while at < buf.len() {
                let n = next(max).min(buf.len() - at);
                c.update(&buf[at..at + n]);
                whole.extend_from_slice(&buf[at..at + n]);
                at += n;
                if next(4) == 0 {
                    let zeros = next(300);
                    c.update_zeros(zeros);
                    whole.resize(whole.len() + zeros, 0);
                }
            }
            assert_eq!(c.value(), reference(&whole), "pieces up to {max} bytes");
        }
    }

    #[test]
    fn the_shift_tables_multiply_as_polynomials_do() {
        // x^8 · x^8 = x^16, and x^0 (bit 31) is the identity.
        assert_eq!(mul_mod(X8[0], X8[0]), X8[1]);
        assert_eq!(mul_mod(1 << 31, 0x1234_5678), 0x1234_5678);
        assert_eq!(shift_by_zeros(0xdead_beef, 0), 0xdead_beef);
        // The table's product is mul_mod's.
        for r in [1u32, 0x8000_0000, 0xdead_beef, 0x1234_5678] {
            assert_eq!(shift_by_zeros(r, 4096), mul_mod(X8[12], r));
        }
    }

    #[test]
    fn rows_past_the_byte_fed_lengths_match_crc_fast_on_16_mib_of_zeros() {
        // Rows 17..=24 (and every lower one) against crc-fast's own CRC of
        // the bytes; the higher rows are squares of these.
        let zeros = vec![0u8; (1 << 24) + 3];
        for len in [1 << 17, (1 << 20) + 1, (1 << 24) + 3] {
            assert_eq!(crc32c_of_zeros(len), crc32c(&zeros[..len]), "{len} zeros");
        }
    }

    #[test]
    fn running_crc_over_pieces_equals_the_crc_of_the_whole() {
        let buf = random_bytes(9000, 42);
        for cut in [0, 1, 7, 24, 4096, 8999, 9000] {
            let mut c = Crc32c::new();
            c.update(&buf[..cut]);
            c.update(&buf[cut..]);
            assert_eq!(c.value(), crc32c(&buf), "cut at {cut}");
        }
        assert_eq!(Crc32c::default().value(), 0);
    }
}
