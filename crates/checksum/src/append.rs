//! Bytes appended to a buffer with their CRC32C computed in the same pass:
//! where the CPU has VPCLMULQDQ, each vector the copy loads (64 bytes with
//! AVX-512, 32 with AVX2 alone) is both stored and folded into the CRC, so
//! the CRC never reads the copy back (a read of just-copied bytes waits for
//! the copy's stores, and a device's data is copied cold). Elsewhere, and
//! for short pieces, the bytes are copied and then fed to
//! [`Crc32c::update`].

use crate::Crc32c;

/// A buffer being appended to, with the CRC32C of what is appended kept
/// where one is wanted (a digest that covers the bytes). What it appends
/// and what its CRC is fed are always the same bytes, even when the source
/// is memory another thread may be writing: the CRC is computed from the
/// copy's own loads.
pub struct Appender<'a> {
    out: &'a mut Vec<u8>,
    crc: Option<&'a mut Crc32c>,
}

impl<'a> Appender<'a> {
    /// Appends to `out`, feeding `crc` (when there is one) everything
    /// appended.
    pub fn new(out: &'a mut Vec<u8>, crc: Option<&'a mut Crc32c>) -> Self {
        Appender { out, crc }
    }

    /// The length of the whole buffer (what it held before, and what was
    /// appended since).
    pub fn len(&self) -> usize {
        self.out.len()
    }

    /// Whether the whole buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.out.is_empty()
    }

    /// Appends `bytes`.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        // SAFETY: a slice is readable for its length.
        unsafe { self.extend_from_ptr(bytes.as_ptr(), bytes.len()) }
    }

    /// Appends the `len` bytes at `src`: memory that other threads may be
    /// writing meanwhile (a RAM device's blocks), which is why it is read
    /// through a pointer and never as a slice. Such writes make the bytes
    /// appended unspecified, never unequal to the bytes the CRC was fed.
    ///
    /// # Safety
    ///
    /// `src` must be valid for reads of `len` bytes for the duration of the
    /// call, and must not point into the buffer appended to.
    pub unsafe fn extend_from_ptr(&mut self, src: *const u8, len: usize) {
        self.out.reserve(len);
        let at = self.out.len();
        // SAFETY: `reserve` left room for `len` bytes after `at`; the
        // caller vouches for `src`, which lies outside this allocation.
        let dst = unsafe { self.out.as_mut_ptr().add(at) };
        match self.crc.as_deref_mut() {
            // SAFETY: as above.
            Some(crc) => unsafe { crc.copy_from_ptr(dst, src, len) },
            // SAFETY: as above.
            None => unsafe { std::ptr::copy_nonoverlapping(src, dst, len) },
        }
        // SAFETY: the `len` bytes after `at` were just written.
        unsafe { self.out.set_len(at.saturating_add(len)) };
    }

    /// Appends `len` zero bytes (their CRC computed without reading any).
    pub fn extend_zeros(&mut self, len: usize) {
        self.out.resize(self.out.len().saturating_add(len), 0);
        if let Some(crc) = self.crc.as_deref_mut() {
            crc.update_zeros(len);
        }
    }
}

/// Pieces shorter than this are copied and then fed to `crc-fast`: the
/// fused loops start with four vectors (64 bytes each with AVX-512, 32
/// with AVX2).
const FUSED_MIN: usize = 256;

impl Crc32c {
    /// Copies `src` into `dst` and feeds the bytes copied, in one pass
    /// where the CPU allows (received data placed where it belongs while
    /// its CRC is checked). Only the first `min(dst.len(), src.len())`
    /// bytes are copied and fed.
    pub fn copy_into(&mut self, dst: &mut [u8], src: &[u8]) {
        let len = dst.len().min(src.len());
        // SAFETY: both slices hold `len` bytes, and a shared and a mutable
        // slice never overlap.
        unsafe { self.copy_from_ptr(dst.as_mut_ptr(), src.as_ptr(), len) }
    }

    /// Copies `len` bytes from `src` to `dst` and feeds them, in one pass
    /// where the CPU allows.
    ///
    /// # Safety
    ///
    /// `src` valid for reads and `dst` for writes of `len` bytes, not
    /// overlapping.
    unsafe fn copy_from_ptr(&mut self, dst: *mut u8, src: *const u8, len: usize) {
        #[cfg(target_arch = "x86_64")]
        if len >= FUSED_MIN {
            if fused::available() {
                // SAFETY: the caller vouches for the pointers; the CPU has
                // the features (checked just above).
                self.register = unsafe { fused::copy_crc(self.register, dst, src, len) };
                return;
            }
            if fused256::available() {
                // SAFETY: as above.
                self.register = unsafe { fused256::copy_crc(self.register, dst, src, len) };
                return;
            }
        }
        // SAFETY: the caller vouches for the pointers; the copy's bytes are
        // then read back as the slice they now are (this call's own).
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, len);
            self.update(std::slice::from_raw_parts(dst, len));
        }
    }
}

/// Fold multipliers, from the reflected powers of x the crate's tables use.
mod constants {
    use crate::mul_mod;

    /// x^n mod P, reflected (bit 31 is x^0): square and multiply.
    const fn xpow(mut n: u64) -> u32 {
        let mut result = 1u32 << 31;
        let mut base = 1u32 << 30;
        while n > 0 {
            if n & 1 != 0 {
                result = mul_mod(result, base);
            }
            base = mul_mod(base, base);
            n >>= 1;
        }
        result
    }

    /// The multipliers that carry a 128-bit lane of reflected message
    /// `bits` further on: the lane's first 8 bytes times x^(bits+64), its
    /// last 8 bytes times x^bits. A carry-less product of reflected
    /// operands comes out one place short, so each power is one lower, and
    /// the 32-bit remainder sits in the upper half of its 64-bit operand.
    /// Returned as (for the first 8 bytes, for the last 8).
    pub const fn fold(bits: u64) -> (u64, u64) {
        ((xpow(bits + 63) as u64) << 32, (xpow(bits - 1) as u64) << 32)
    }

    /// Four vectors ahead (256 bytes), the main loop's stride.
    pub const BY_256: (u64, u64) = fold(256 * 8);
    /// One vector ahead (64 bytes).
    pub const BY_64: (u64, u64) = fold(64 * 8);
    /// Four 256-bit vectors ahead (128 bytes), the AVX2 loop's stride.
    pub const BY_128: (u64, u64) = fold(128 * 8);
    /// One 256-bit vector ahead (32 bytes).
    pub const BY_32: (u64, u64) = fold(32 * 8);
}

#[cfg(target_arch = "x86_64")]
mod fused {
    use super::constants::{BY_256, BY_64};
    use std::arch::x86_64::*;

    /// Whether this CPU runs [`copy_crc`] (checked once by std, then a load).
    pub fn available() -> bool {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("vpclmulqdq")
            && std::is_x86_feature_detected!("sse4.2")
    }

    /// `k` in every 128-bit lane: the first 8 bytes' multiplier low.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn lanes(k: (u64, u64)) -> __m512i {
        let (lo, hi) = (k.0 as i64, k.1 as i64);
        _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo)
    }

    /// Carries each lane of `x` ahead by `k`'s distance and adds `y`.
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn fold(x: __m512i, k: __m512i, y: __m512i) -> __m512i {
        let first = _mm512_clmulepi64_epi128(x, k, 0x00);
        let last = _mm512_clmulepi64_epi128(x, k, 0x11);
        _mm512_ternarylogic_epi64(first, last, y, 0x96)
    }

    /// Copies `len` (at least 256) bytes from `src` to `dst` and returns
    /// the CRC register `register` becomes over them. Four accumulators
    /// run 256 bytes apart (independent carry-less products, so the loop is
    /// not bound by their latency); they are then folded into one, which
    /// takes the remaining whole vectors; the CRC instruction reduces it
    /// and takes the last bytes. Every byte stored is a byte loaded into a
    /// register that the CRC is computed from.
    ///
    /// # Safety
    ///
    /// `src` valid for reads and `dst` for writes of `len` bytes, not
    /// overlapping; `len` at least 256; the CPU has the features enabled.
    #[target_feature(enable = "avx512f,vpclmulqdq,sse4.2")]
    pub unsafe fn copy_crc(register: u32, dst: *mut u8, src: *const u8, len: usize) -> u32 {
        debug_assert!(len >= 256);
        // SAFETY (all loads and stores below): offsets stay within `len`,
        // for which the caller vouches on both pointers.
        let load = |at: usize| unsafe { _mm512_loadu_si512(src.add(at).cast()) };
        let store = |at: usize, v: __m512i| unsafe { _mm512_storeu_si512(dst.add(at).cast(), v) };
        let (k256, k64) = (lanes(BY_256), lanes(BY_64));
        let mut x = [load(0), load(64), load(128), load(192)];
        for (i, v) in x.iter().enumerate() {
            store(i * 64, *v);
        }
        // The register enters as the first four bytes, added; the rest of
        // the vector it is widened to must be zero, which a cast leaves
        // indeterminate (std's docs; once all ones).
        x[0] = _mm512_xor_si512(x[0], _mm512_zextsi128_si512(_mm_cvtsi32_si128(register as i32)));
        let mut at = 256;
        while len - at >= 256 {
            for (i, acc) in x.iter_mut().enumerate() {
                let y = load(at + i * 64);
                store(at + i * 64, y);
                *acc = fold(*acc, k256, y);
            }
            at += 256;
        }
        let mut one = fold(fold(fold(x[0], k64, x[1]), k64, x[2]), k64, x[3]);
        while len - at >= 64 {
            let y = load(at);
            store(at, y);
            one = fold(one, k64, y);
            at += 64;
        }
        let mut words = [0u64; 8];
        // SAFETY: `words` is 64 writable bytes.
        unsafe { _mm512_storeu_si512(words.as_mut_ptr().cast(), one) };
        // SAFETY: the caller vouches for the pointers up to `len`.
        unsafe { super::finish(&words, dst, src, at, len) }
    }
}

/// The end both fused loops share: the folded vector's 64-bit words
/// (its remainder, zero register) through the CRC instruction, then the
/// bytes after the last whole vector, copied one at a time.
///
/// # Safety
///
/// `src` valid for reads and `dst` for writes of `len` bytes; the CPU has
/// SSE4.2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn finish(words: &[u64], dst: *mut u8, src: *const u8, mut at: usize, len: usize) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut r = words.iter().fold(0u64, |r, &w| _mm_crc32_u64(r, w)) as u32;
    while at < len {
        // SAFETY: `at < len`, for which the caller vouches.
        let b = unsafe { src.add(at).read() };
        // SAFETY: as above.
        unsafe { dst.add(at).write(b) };
        r = _mm_crc32_u8(r, b);
        at += 1;
    }
    r
}

/// The same pass in 256-bit vectors, for CPUs with VPCLMULQDQ and AVX2
/// but no AVX-512 (AMD Zen 3, Intel client cores since Alder Lake).
#[cfg(target_arch = "x86_64")]
mod fused256 {
    use super::constants::{BY_128, BY_32};
    use std::arch::x86_64::*;

    /// Whether this CPU runs [`copy_crc`].
    pub fn available() -> bool {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("vpclmulqdq")
            && std::is_x86_feature_detected!("sse4.2")
    }

    /// `k` in both 128-bit lanes: the first 8 bytes' multiplier low.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn lanes(k: (u64, u64)) -> __m256i {
        let (lo, hi) = (k.0 as i64, k.1 as i64);
        _mm256_set_epi64x(hi, lo, hi, lo)
    }

    /// Carries each lane of `x` ahead by `k`'s distance and adds `y`.
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq")]
    fn fold(x: __m256i, k: __m256i, y: __m256i) -> __m256i {
        let first = _mm256_clmulepi64_epi128(x, k, 0x00);
        let last = _mm256_clmulepi64_epi128(x, k, 0x11);
        _mm256_xor_si256(_mm256_xor_si256(first, last), y)
    }

    /// As the AVX-512 [`copy_crc`](super::fused::copy_crc), with four
    /// 32-byte accumulators 128 bytes apart.
    ///
    /// # Safety
    ///
    /// `src` valid for reads and `dst` for writes of `len` bytes, not
    /// overlapping; `len` at least 128; the CPU has the features enabled.
    #[target_feature(enable = "avx2,vpclmulqdq,sse4.2")]
    pub unsafe fn copy_crc(register: u32, dst: *mut u8, src: *const u8, len: usize) -> u32 {
        debug_assert!(len >= 128);
        // SAFETY (all loads and stores below): offsets stay within `len`,
        // for which the caller vouches on both pointers.
        let load = |at: usize| unsafe { _mm256_loadu_si256(src.add(at).cast()) };
        let store = |at: usize, v: __m256i| unsafe { _mm256_storeu_si256(dst.add(at).cast(), v) };
        let (k128, k32) = (lanes(BY_128), lanes(BY_32));
        let mut x = [load(0), load(32), load(64), load(96)];
        for (i, v) in x.iter().enumerate() {
            store(i * 32, *v);
        }
        // The register enters as the first four bytes, added (the rest
        // zero, as above).
        x[0] = _mm256_xor_si256(x[0], _mm256_zextsi128_si256(_mm_cvtsi32_si128(register as i32)));
        let mut at = 128;
        while len - at >= 128 {
            for (i, acc) in x.iter_mut().enumerate() {
                let y = load(at + i * 32);
                store(at + i * 32, y);
                *acc = fold(*acc, k128, y);
            }
            at += 128;
        }
        let mut one = fold(fold(fold(x[0], k32, x[1]), k32, x[2]), k32, x[3]);
        while len - at >= 32 {
            let y = load(at);
            store(at, y);
            one = fold(one, k32, y);
            at += 32;
        }
        let mut words = [0u64; 4];
        // SAFETY: `words` is 32 writable bytes.
        unsafe { _mm256_storeu_si256(words.as_mut_ptr().cast(), one) };
        // SAFETY: the caller vouches for the pointers up to `len`.
        unsafe { super::finish(&words, dst, src, at, len) }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;
    use crate::crc32c;

    fn bytes(n: usize) -> Vec<u8> {
        (0..n as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()
    }

    #[test]
    fn appended_bytes_and_their_crc_match_copy_then_crc_at_every_length_alignment_and_start() {
        let data = bytes(4_700);
        let prefix = &data[4_600..4_613];
        for len in 0..=4_400usize {
            for off in [0usize, 1, 7, 64] {
                for plen in [0usize, 5, 13] {
                    let src = &data[off..off + len];
                    let mut crc = Crc32c::new();
                    crc.update(&prefix[..plen]);
                    let mut out = vec![0xee; 3];
                    Appender::new(&mut out, Some(&mut crc)).extend_from_slice(src);
                    assert_eq!(&out[3..], src, "bytes, len {len} off {off}");
                    let mut whole = prefix[..plen].to_vec();
                    whole.extend_from_slice(src);
                    assert_eq!(crc.value(), crc32c(&whole), "crc, len {len} off {off} prefix {plen}");
                }
            }
        }
    }

    /// A fused copy and CRC: (register, dst, src, len) to register.
    #[cfg(target_arch = "x86_64")]
    type Path = unsafe fn(u32, *mut u8, *const u8, usize) -> u32;

    /// Each fused path this CPU has, to call directly (the dispatch above
    /// picks only the widest).
    #[cfg(target_arch = "x86_64")]
    fn fused_paths() -> Vec<(&'static str, Path)> {
        let mut paths: Vec<(&str, Path)> = Vec::new();
        if fused::available() {
            paths.push(("avx512", fused::copy_crc));
        }
        if fused256::available() {
            paths.push(("avx2", fused256::copy_crc));
        }
        paths
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn each_fused_path_matches_copy_then_crc_at_every_length_alignment_and_register() {
        let data = bytes(4_700);
        for (name, path) in fused_paths() {
            for len in 256..=4_400usize {
                for off in [0usize, 1, 7, 64] {
                    for register in [!0u32, 0, 0x1234_5678] {
                        let src = &data[off..off + len];
                        let mut dst = vec![0xeeu8; len + 1];
                        // SAFETY: both buffers hold `len` bytes; the CPU has
                        // the path's features (checked above).
                        let r = unsafe { path(register, dst.as_mut_ptr(), src.as_ptr(), len) };
                        assert_eq!(&dst[..len], src, "{name} bytes, len {len} off {off}");
                        assert_eq!(dst[len], 0xee, "{name} wrote past the end, len {len}");
                        let mut want = Crc32c { register };
                        want.update(src);
                        assert_eq!(r, want.register, "{name} crc, len {len} off {off} register {register:#x}");
                    }
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn each_fused_path_copies_and_crcs_at_every_source_and_destination_offset_pair() {
        // Source and destination misaligned independently, at lengths
        // around each loop's stride and the tails after it.
        let data = bytes(4_300);
        for (name, path) in fused_paths() {
            for len in [256usize, 257, 319, 320, 383, 448, 511, 512, 575, 4_096, 4_159] {
                for from in 0..64 {
                    for to in 0..64 {
                        let src = &data[from..from + len];
                        let mut dst = vec![0xeeu8; len + 128];
                        // SAFETY: `dst` holds `to + len` bytes and `src`
                        // `len`; the CPU has the path's features.
                        let r = unsafe { path(0x1357_9bdf, dst.as_mut_ptr().add(to), src.as_ptr(), len) };
                        let at = format!("{name}, len {len} from {from} to {to}");
                        assert_eq!(&dst[to..to + len], src, "bytes, {at}");
                        assert!(dst[..to].iter().chain(&dst[to + len..]).all(|&b| b == 0xee), "wrote outside, {at}");
                        assert_eq!(r, crate::tests::reference_register(0x1357_9bdf, src), "crc, {at}");
                    }
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn each_fused_path_matches_crc_fast_at_64_kib_and_1_mib_plus_odd() {
        let data = bytes((1 << 20) + 200);
        for (name, path) in fused_paths() {
            for len in [65_536usize, 65_537, 65_599, (1 << 20) + 67, (1 << 20) + 131] {
                for from in [0usize, 3, 61] {
                    let src = &data[from..from + len];
                    let mut dst = vec![0u8; len + 6];
                    // SAFETY: `dst` holds `5 + len` bytes and `src` `len`;
                    // the CPU has the path's features.
                    let r = unsafe { path(!0, dst.as_mut_ptr().add(5), src.as_ptr(), len) };
                    assert_eq!(&dst[5..5 + len], src, "{name} bytes, len {len} from {from}");
                    assert_eq!(!r, crc32c(src), "{name} crc, len {len} from {from}");
                }
            }
        }
    }

    /// Lengths around every threshold: the CRC instruction's 8 bytes and
    /// 256, each vector width and loop stride, a page, 64 KiB.
    fn threshold_lengths() -> Vec<usize> {
        let mut lens: Vec<usize> = (0..=600).collect();
        for b in [1_024usize, 4_096, 8_192, 65_536] {
            lens.extend([b - 1, b, b + 1, b + 7, b + 63, b + 64, b + 65]);
        }
        lens
    }

    #[test]
    fn no_entry_point_touches_a_byte_outside_its_pieces() {
        // Sources and destinations placed against a page that faults on
        // any access, after the piece and before it.
        let (mut from, mut to) = (crate::tests::Guarded::new(17), crate::tests::Guarded::new(17));
        let data = bytes(66_000);
        for len in threshold_lengths() {
            for at_end in [true, false] {
                from.piece(len, at_end).copy_from_slice(&data[..len]);
                let src: &[u8] = from.piece(len, at_end);
                let want = crate::tests::reference(src);
                let at = format!("len {len} against the {} guard", if at_end { "trailing" } else { "leading" });
                assert_eq!(crc32c(src), want, "crc32c, {at}");
                let mut crc = Crc32c::new();
                crc.update(b"hdr");
                crc.update(src);
                let mut whole = b"hdr".to_vec();
                whole.extend_from_slice(src);
                assert_eq!(crc.value(), crate::tests::reference(&whole), "update, {at}");
                let dst = to.piece(len, at_end);
                let mut crc = Crc32c::new();
                crc.copy_into(dst, src);
                assert_eq!(crc.value(), want, "copy_into crc, {at}");
                assert_eq!(dst, src, "copy_into bytes, {at}");
                let mut out = Vec::new();
                let mut crc = Crc32c::new();
                Appender::new(&mut out, Some(&mut crc)).extend_from_slice(src);
                assert_eq!((crc.value(), &out[..]), (want, src), "appender, {at}");
                #[cfg(target_arch = "x86_64")]
                for (name, path) in fused_paths().into_iter().filter(|_| len >= 256) {
                    let dst = to.piece(len, at_end);
                    // SAFETY: both pieces hold `len` bytes, at least 256;
                    // the CPU has the path's features.
                    let r = unsafe { path(!0, dst.as_mut_ptr(), src.as_ptr(), len) };
                    assert_eq!((!r, &*dst), (want, src), "{name}, {at}");
                }
            }
        }
    }

    #[test]
    fn the_fold_multipliers_carry_a_lane_as_far_as_bytes_of_zeros_do() {
        // A 16-byte lane followed by `d` zero bytes has the CRC of the lane
        // carried `d` bytes on; check `fold`'s arithmetic without SIMD.
        fn clmul(a: u64, b: u64) -> u128 {
            (0..64).filter(|i| a >> i & 1 == 1).fold(0u128, |p, i| p ^ (u128::from(b) << i))
        }
        let lane: [u8; 16] = std::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ 0x5a);
        for d in [16usize, 32, 64, 128, 256] {
            let (k_first, k_last) = constants::fold(d as u64 * 8);
            let first = u64::from_le_bytes(lane[..8].try_into().unwrap());
            let last = u64::from_le_bytes(lane[8..].try_into().unwrap());
            let moved = clmul(first, k_first) ^ clmul(last, k_last);
            // The moved lane stands in for the lane and the d zero bytes: the
            // same CRC with zero registers on both sides.
            let mut with_zeros = lane.to_vec();
            with_zeros.resize(16 + d, 0);
            let mut tail = vec![0u8; d - 16];
            tail.extend_from_slice(&moved.to_le_bytes());
            let plain = |b: &[u8]| !crc32c_with_register(0, b);
            assert_eq!(plain(&with_zeros), plain(&tail), "distance {d}");
        }
    }

    /// The CRC register after `bytes` from register `r` (no inversions).
    fn crc32c_with_register(r: u32, bytes: &[u8]) -> u32 {
        let mut c = Crc32c { register: r };
        c.update(bytes);
        !c.register
    }

    #[test]
    fn copy_into_copies_and_feeds_the_shorter_length() {
        let data = bytes(5_000);
        for len in [0usize, 3, 255, 256, 4_096, 4_999] {
            let mut dst = vec![0u8; len + 7];
            let mut crc = Crc32c::new();
            crc.update(b"hdr");
            crc.copy_into(&mut dst[..len], &data[1..]);
            assert_eq!(&dst[..len], &data[1..1 + len]);
            assert!(dst[len..].iter().all(|&b| b == 0));
            let mut whole = b"hdr".to_vec();
            whole.extend_from_slice(&data[1..1 + len]);
            assert_eq!(crc.value(), crc32c(&whole), "len {len}");
        }
    }

    #[test]
    fn without_a_crc_it_only_appends_and_zeros_shift_the_register() {
        let data = bytes(1_000);
        let mut out = Vec::new();
        let mut a = Appender::new(&mut out, None);
        a.extend_from_slice(&data);
        a.extend_zeros(10);
        assert_eq!(a.len(), 1_010);
        assert_eq!(&out[..1_000], &data[..]);
        assert!(out[1_000..].iter().all(|&b| b == 0));
        let mut crc = Crc32c::new();
        let mut out2 = Vec::new();
        let mut a = Appender::new(&mut out2, Some(&mut crc));
        a.extend_from_slice(&data);
        a.extend_zeros(300);
        assert_eq!(crc.value(), crc32c(&out2));
    }
}
