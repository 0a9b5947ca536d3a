//! Buffers the kernel may read or write while an operation is in flight.
//!
//! An operation takes its buffer by value and gives it back with the result
//! (the "rent" style io_uring needs): the bytes must stay put while the
//! kernel owns them, even if the future that started the operation is
//! dropped. The traits say where the bytes are; a heap allocation keeps its
//! address when the owning value moves.

use std::ops::{Bound, RangeBounds};

/// A buffer the kernel reads from (a send or a write).
///
/// # Safety
///
/// `read_ptr` must point at `bytes_init` initialized bytes that stay valid
/// and at the same address while the value is alive, even when the value
/// itself is moved.
pub unsafe trait IoBuf: 'static {
    /// The first byte.
    fn read_ptr(&self) -> *const u8;
    /// How many bytes from `read_ptr` hold data.
    fn bytes_init(&self) -> usize;

    /// A view of `range` of the initialized bytes.
    fn slice(self, range: impl RangeBounds<usize>) -> Slice<Self>
    where
        Self: Sized,
    {
        let (begin, end) = bounds(range, self.bytes_init());
        Slice { buf: self, begin, end }
    }
}

/// A buffer the kernel writes into (a receive or a read).
///
/// # Safety
///
/// `write_ptr` must point at `bytes_total` writable bytes with the same
/// stability as [`IoBuf`]; `set_init(n)` is called after the kernel wrote
/// the first `n` of them.
pub unsafe trait IoBufMut: IoBuf {
    /// The first byte the kernel may write.
    fn write_ptr(&mut self) -> *mut u8;
    /// How many bytes from `write_ptr` the kernel may write.
    fn bytes_total(&mut self) -> usize;
    /// Records that the first `n` bytes from `write_ptr` are initialized.
    ///
    /// # Safety
    ///
    /// The first `n` bytes must have been written.
    unsafe fn set_init(&mut self, n: usize);

    /// A writable view of `range` of the buffer's total bytes.
    fn slice_mut(mut self, range: impl RangeBounds<usize>) -> SliceMut<Self>
    where
        Self: Sized,
    {
        let total = self.bytes_total();
        let (begin, end) = bounds(range, total);
        SliceMut { buf: self, begin, end }
    }
}

fn bounds(range: impl RangeBounds<usize>, len: usize) -> (usize, usize) {
    let begin = match range.start_bound() {
        Bound::Included(&b) => b,
        Bound::Excluded(&b) => b.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    let end = end.min(len);
    (begin.min(end), end)
}

// SAFETY: a Vec's heap buffer does not move when the Vec moves; its
// initialized bytes are `len`.
unsafe impl IoBuf for Vec<u8> {
    fn read_ptr(&self) -> *const u8 {
        self.as_ptr()
    }

    fn bytes_init(&self) -> usize {
        self.len()
    }
}

// SAFETY: the kernel writes into the whole capacity from the start;
// `set_init` makes the length what it wrote.
unsafe impl IoBufMut for Vec<u8> {
    fn write_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }

    fn bytes_total(&mut self) -> usize {
        self.capacity()
    }

    unsafe fn set_init(&mut self, n: usize) {
        // SAFETY: the caller promises the first `n` bytes were written, and
        // `n <= capacity` because the kernel wrote at most `bytes_total`.
        unsafe { self.set_len(n) };
    }
}

// SAFETY: as for Vec; a boxed slice is all initialized.
unsafe impl IoBuf for Box<[u8]> {
    fn read_ptr(&self) -> *const u8 {
        self.as_ptr()
    }

    fn bytes_init(&self) -> usize {
        self.len()
    }
}

// SAFETY: every byte is initialized already; nothing to record.
unsafe impl IoBufMut for Box<[u8]> {
    fn write_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }

    fn bytes_total(&mut self) -> usize {
        self.len()
    }

    unsafe fn set_init(&mut self, _n: usize) {}
}

// SAFETY: static memory never moves and is initialized.
unsafe impl IoBuf for &'static [u8] {
    fn read_ptr(&self) -> *const u8 {
        self.as_ptr()
    }

    fn bytes_init(&self) -> usize {
        self.len()
    }
}

/// `begin..end` of a buffer's initialized bytes, for a send or write.
pub struct Slice<B> {
    buf: B,
    begin: usize,
    end: usize,
}

impl<B> Slice<B> {
    /// The whole buffer back.
    pub fn into_inner(self) -> B {
        self.buf
    }
}

// SAFETY: a sub-range of the inner buffer's initialized bytes, clamped at
// construction to `bytes_init`.
unsafe impl<B: IoBuf> IoBuf for Slice<B> {
    fn read_ptr(&self) -> *const u8 {
        self.buf.read_ptr().wrapping_add(self.begin)
    }

    fn bytes_init(&self) -> usize {
        self.end - self.begin
    }
}

/// `begin..end` of a buffer's total bytes, for a receive or read.
pub struct SliceMut<B> {
    buf: B,
    begin: usize,
    end: usize,
}

impl<B> SliceMut<B> {
    /// The whole buffer back.
    pub fn into_inner(self) -> B {
        self.buf
    }
}

// SAFETY: the initialized part of the view is what the inner buffer has
// initialized past `begin`.
unsafe impl<B: IoBufMut> IoBuf for SliceMut<B> {
    fn read_ptr(&self) -> *const u8 {
        self.buf.read_ptr().wrapping_add(self.begin)
    }

    fn bytes_init(&self) -> usize {
        self.buf.bytes_init().saturating_sub(self.begin).min(self.end - self.begin)
    }
}

// SAFETY: a sub-range of the inner buffer's writable bytes, clamped at
// construction to `bytes_total`; `set_init` is forwarded with the offset.
unsafe impl<B: IoBufMut> IoBufMut for SliceMut<B> {
    fn write_ptr(&mut self) -> *mut u8 {
        self.buf.write_ptr().wrapping_add(self.begin)
    }

    fn bytes_total(&mut self) -> usize {
        self.end - self.begin
    }

    unsafe fn set_init(&mut self, n: usize) {
        // A view that starts past the inner buffer's initialized bytes
        // (a Vec sliced beyond its length): the gap is zeroed first, so
        // that recording `begin + n` never claims bytes nobody wrote.
        let init = self.buf.bytes_init();
        if init < self.begin {
            // SAFETY: `init..begin` lies within the inner buffer's
            // writable bytes (`begin <= end <= bytes_total`).
            unsafe { self.buf.write_ptr().add(init).write_bytes(0, self.begin - init) };
        }
        // SAFETY: bytes `begin..begin + n` were written (the caller's
        // promise) and those before `begin` are initialized (above).
        unsafe { self.buf.set_init(self.begin + n) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_clamp_to_the_buffer() {
        let v = vec![1u8, 2, 3, 4];
        let s = v.slice(1..10);
        assert_eq!(s.bytes_init(), 3);
        assert_eq!(s.into_inner().len(), 4);
        let mut v = Vec::with_capacity(16);
        v.extend_from_slice(&[9, 9]);
        let mut m = v.slice_mut(2..);
        assert_eq!(m.bytes_total(), 14);
        // SAFETY: writes one byte inside the view, then records it.
        unsafe {
            m.write_ptr().write(7);
            m.set_init(1);
        }
        assert_eq!(m.into_inner(), vec![9, 9, 7]);
    }
}
