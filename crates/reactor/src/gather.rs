//! One send of bytes with other buffers' bytes spliced in (`sendmsg` with
//! an iovec per piece): framing built in one buffer, payload sent from the
//! buffers it already lies in, nothing copied.

use crate::buf::IoBuf;

/// [`Splice::buf`] of a splice of `len` zero bytes, sent from a page of
/// zeros shared by every send (a read of a device that holds nothing).
pub const ZEROS: usize = usize::MAX;

/// The shared zeros [`ZEROS`] splices are sent from (never written).
static ZERO_BYTES: [u8; 65536] = [0; 65536];

/// Where a buffer's bytes go in a [`Gather`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Splice {
    /// Position in [`Gather::head`] the bytes go before.
    pub at: usize,
    /// Index in [`Gather::bufs`], or [`ZEROS`].
    pub buf: usize,
    /// First byte of that buffer sent.
    pub start: usize,
    /// Bytes sent.
    pub len: usize,
}

/// What one gathered send sends: `head`, with each splice's bytes inserted
/// at its position (splices in order of position). Reused from send to
/// send: its vectors keep their room.
pub struct Gather<B> {
    /// The bytes built for the send.
    pub head: Vec<u8>,
    /// The buffers' bytes and where they go, by position.
    pub splices: Vec<Splice>,
    /// The buffers, kept alive until the send is done.
    pub bufs: Vec<B>,
    pub(crate) iov: Vec<libc::iovec>,
    pub(crate) msg: Box<libc::msghdr>,
}

/// The most iovecs one `sendmsg` takes (Linux's UIO_MAXIOV).
const IOV_MAX: usize = 1024;

impl<B: IoBuf> Default for Gather<B> {
    fn default() -> Self {
        Gather::with_capacity(0)
    }
}

impl<B: IoBuf> Gather<B> {
    /// An empty gather whose head has room for `bytes`.
    pub fn with_capacity(bytes: usize) -> Self {
        // SAFETY: msghdr is plain old data; all zeros is "no name, no
        // iovecs, no control data, no flags".
        let msg = Box::new(unsafe { std::mem::zeroed::<libc::msghdr>() });
        Gather { head: Vec::with_capacity(bytes), splices: Vec::new(), bufs: Vec::new(), iov: Vec::new(), msg }
    }

    /// Bytes the send carries.
    pub fn len(&self) -> usize {
        self.head.len().saturating_add(self.splices.iter().map(|s| s.len).sum::<usize>())
    }

    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Makes room for `n` splices (and the iovecs they need) at once, so
    /// that a connection that splices grows these vectors once, not by
    /// doubling while it runs.
    pub fn reserve_splices(&mut self, n: usize) {
        self.splices.reserve(n.saturating_sub(self.splices.len()));
        let iovs = n.saturating_mul(2).saturating_add(1).min(IOV_MAX);
        self.iov.reserve(iovs.saturating_sub(self.iov.len()));
    }

    /// Empties it, giving the buffers up; the vectors keep their room.
    pub fn clear(&mut self) {
        self.head.clear();
        self.splices.clear();
        self.bufs.clear();
        self.iov.clear();
    }

    /// Points the message at the iovecs of everything from byte `sent` on
    /// (at most [`IOV_MAX`] of them).
    pub(crate) fn prepare(&mut self, sent: usize) {
        let mut pos = 0usize;
        let iov = &mut self.iov;
        iov.clear();
        let mut push = |ptr: *const u8, len: usize| {
            let end = pos.saturating_add(len);
            if end > sent && len > 0 && iov.len() < IOV_MAX {
                let skip = sent.saturating_sub(pos);
                iov.push(libc::iovec { iov_base: ptr.wrapping_add(skip) as *mut libc::c_void, iov_len: len - skip });
            }
            pos = end;
        };
        let head = self.head.as_ptr();
        let mut from = 0usize;
        for s in &self.splices {
            let at = s.at.min(self.head.len()).max(from);
            push(head.wrapping_add(from), at - from);
            if s.buf == ZEROS {
                let mut left = s.len;
                while left > 0 {
                    let n = left.min(ZERO_BYTES.len());
                    push(ZERO_BYTES.as_ptr(), n);
                    left -= n;
                }
            } else if let Some(b) = self.bufs.get(s.buf) {
                let start = s.start.min(b.bytes_init());
                let len = s.len.min(b.bytes_init() - start);
                push(b.read_ptr().wrapping_add(start), len);
            }
            from = at;
        }
        push(head.wrapping_add(from), self.head.len() - from);
        self.msg.msg_iov = self.iov.as_mut_ptr();
        self.msg.msg_iovlen = self.iov.len();
    }

    pub(crate) fn msg_ptr(&self) -> *const libc::msghdr {
        &*self.msg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(g: &Gather<Vec<u8>>) -> Vec<u8> {
        let mut out = Vec::new();
        for v in &g.iov {
            // SAFETY: the iovecs point into g's live buffers.
            out.extend_from_slice(unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) });
        }
        out
    }

    #[test]
    fn the_iovecs_interleave_head_and_buffers_from_any_byte_on() {
        let mut g = Gather::<Vec<u8>>::with_capacity(16);
        g.head.extend_from_slice(b"AABBCC");
        g.bufs.push(b"xxpayload1".to_vec());
        g.bufs.push(b"p2".to_vec());
        g.splices.push(Splice { at: 2, buf: 0, start: 2, len: 8 });
        g.splices.push(Splice { at: 4, buf: 1, start: 0, len: 2 });
        g.splices.push(Splice { at: 4, buf: 1, start: 0, len: 0 });
        assert_eq!(g.len(), 16);
        let want = b"AApayload1BBp2CC";
        for sent in 0..=want.len() {
            g.prepare(sent);
            assert_eq!(flat(&g), &want[sent..], "from byte {sent}");
        }
        g.clear();
        assert!(g.is_empty());
    }

    #[test]
    fn zero_splices_send_zeros_in_pieces_of_the_shared_page() {
        let mut g = Gather::<Vec<u8>>::with_capacity(16);
        g.head.extend_from_slice(b"HDR1HDR2");
        g.splices.push(Splice { at: 4, buf: ZEROS, start: 0, len: 70_000 });
        g.splices.push(Splice { at: 8, buf: ZEROS, start: 0, len: 3 });
        assert_eq!(g.len(), 8 + 70_003);
        let mut want = b"HDR1".to_vec();
        want.resize(4 + 70_000, 0);
        want.extend_from_slice(b"HDR2\0\0\0");
        for sent in [0, 3, 4, 5, 65_540, 70_004, 70_008, want.len()] {
            g.prepare(sent);
            assert!(flat(&g) == want[sent..], "from byte {sent}");
        }
    }
}
