//! The buffer type data lands in.
//!
//! The connection allocates write data through this trait so the driver can
//! hand it a buffer the backend writes from directly (an aligned, pooled
//! buffer) instead of copying from a `Vec`.

/// An owned byte buffer of a fixed length.
pub trait DataBuffer: AsRef<[u8]> + AsMut<[u8]> {
    /// A buffer of `len` initialized bytes.
    fn alloc(len: usize) -> Self;
}

impl DataBuffer for Vec<u8> {
    fn alloc(len: usize) -> Self {
        vec![0; len]
    }
}
