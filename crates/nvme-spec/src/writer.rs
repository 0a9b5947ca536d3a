//! A page builder for the large little-endian data structures (Identify,
//! log pages): fields are written at their spec offsets by name.
//!
//! Offsets are compile-time constants from this crate, so a write outside the
//! page is a programming error; it is dropped (and caught by tests through
//! `debug_assert`) rather than reachable from the wire.

/// A zero-filled page with little-endian field writers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page(Vec<u8>);

impl Page {
    /// A zeroed page of `len` bytes.
    pub fn new(len: usize) -> Self {
        Page(vec![0; len])
    }

    /// Writes `bytes` at `off`.
    pub fn bytes(&mut self, off: usize, bytes: &[u8]) -> &mut Self {
        let end = off.checked_add(bytes.len());
        match end.and_then(|end| self.0.get_mut(off..end)) {
            Some(dst) => dst.copy_from_slice(bytes),
            None => debug_assert!(false, "field at {off} outside page of {}", self.0.len()),
        }
        self
    }

    /// Writes a u8 at `off`.
    pub fn u8(&mut self, off: usize, v: u8) -> &mut Self {
        self.bytes(off, &[v])
    }

    /// Writes a little-endian u16 at `off`.
    pub fn u16(&mut self, off: usize, v: u16) -> &mut Self {
        self.bytes(off, &v.to_le_bytes())
    }

    /// Writes a little-endian u32 at `off`.
    pub fn u32(&mut self, off: usize, v: u32) -> &mut Self {
        self.bytes(off, &v.to_le_bytes())
    }

    /// Writes a little-endian u64 at `off`.
    pub fn u64(&mut self, off: usize, v: u64) -> &mut Self {
        self.bytes(off, &v.to_le_bytes())
    }

    /// Writes an ASCII string field of `width` bytes, space padded (the
    /// Identify SN/MN/FR convention).
    pub fn ascii_space(&mut self, off: usize, width: usize, s: &str) -> &mut Self {
        let mut field = vec![b' '; width];
        for (d, c) in field.iter_mut().zip(s.bytes()) {
            *d = c;
        }
        self.bytes(off, &field)
    }

    /// Writes a string field of `width` bytes, NUL padded (NQNs, addresses).
    pub fn ascii_nul(&mut self, off: usize, width: usize, s: &str) -> &mut Self {
        let mut field = vec![0u8; width];
        for (d, c) in field.iter_mut().take(width.saturating_sub(1)).zip(s.bytes()) {
            *d = c;
        }
        self.bytes(off, &field)
    }

    /// The page bytes.
    pub fn into_vec(self) -> Vec<u8> {
        self.0
    }

    /// The page bytes, borrowed.
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_little_endian_fields_at_offsets() {
        let mut p = Page::new(16);
        p.u16(0, 0x1234).u32(4, 0xaabb_ccdd).ascii_space(8, 4, "ab").ascii_nul(12, 4, "wxyz");
        assert_eq!(
            p.as_slice(),
            &[0x34, 0x12, 0, 0, 0xdd, 0xcc, 0xbb, 0xaa, b'a', b'b', b' ', b' ', b'w', b'x', b'y', 0]
        );
    }
}
