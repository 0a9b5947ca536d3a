//! Multishot receive into a provided-buffer ring.
//!
//! Each reactor registers one ring of receive buffers with the kernel
//! (`IORING_REGISTER_PBUF_RING`). A connection arms one multishot receive
//! (`IORING_RECV_MULTISHOT`); every completion names the buffer the kernel
//! filled. The connection parses the bytes and drops the [`RecvBuf`],
//! which puts the buffer back at once. So an idle connection holds no
//! receive buffer at all, and a busy one costs one submission per burst of
//! completions instead of one per read.
//!
//! The ring offers the kernel only a window of the buffers at a time
//! ([`INITIAL_WINDOW`], doubled whenever a receive found the ring empty,
//! halved again after [`DECAY_EVERY`] receives that never held more than a
//! quarter of it at once),
//! and refills it with the buffers given back most recently first: those
//! are still in the CPU's caches, so the kernel's copy into them and ours
//! out of them stay there too, where cycling through all the buffers in
//! turn would stream megabytes through memory.
//!
//! Where the kernel lacks multishot receive (before 6.0) or the ring could
//! not be registered, [`Receiver`] reads with one-shot receives into a
//! buffer of its own.

use crate::buf::IoBufMut;
use crate::net::Socket;
use crate::net::TcpStream;
use crate::op::Op;
use crate::rt::{try_with_core, with_core, Core};
use io_uring::{cqueue, opcode, types};
use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::task::Poll;

/// The buffer group id of every reactor's receive ring.
const GROUP: u16 = 0;

/// Receive buffers per reactor and their size, unless configured.
pub const DEFAULT_BUFFERS: u16 = 512;
/// See [`DEFAULT_BUFFERS`].
pub const DEFAULT_BUFFER_SIZE: usize = 32 * 1024;

/// Buffers the ring offers the kernel at first ([`BufRing::window`]).
pub const INITIAL_WINDOW: u16 = 64;
/// Filled buffers after which the window is halved if no more than a
/// quarter of it was in use at once meanwhile.
pub const DECAY_EVERY: u32 = 4096;

/// Size of the one-shot fallback's own receive buffer.
const FALLBACK_BUF: usize = 64 * 1024;

pub(crate) struct BufRing {
    /// `entries` ring entries (16 bytes each) then `entries` buffers.
    map: *mut u8,
    map_len: usize,
    entries: u16,
    buf_size: usize,
    /// Our copy of the tail the kernel reads.
    tail: u16,
    /// Buffers given back and not yet offered again, the most recently
    /// given last (taken first).
    free: Vec<u16>,
    /// Buffers offered in the ring and not yet filled.
    offered: u16,
    /// How many buffers the ring offers at once: [`INITIAL_WINDOW`], doubled
    /// (up to `entries`) each time a receive found none, halved (down to
    /// [`INITIAL_WINDOW`]) after [`DECAY_EVERY`] fills that never had more
    /// than a quarter of it in use.
    window: u16,
    /// Most buffers filled and not yet given back at once, and fills,
    /// since the window was last looked at.
    peak_in_use: u16,
    fills: u32,
    /// Receivers that found every buffer lent out, woken when one comes
    /// back ([`Receiver::recv`]).
    waiting: Vec<std::task::Waker>,
}

impl BufRing {
    /// `count` buffers of `size` bytes behind their ring's entries, in
    /// memory of their own, none offered yet.
    fn map(count: u16, size: usize) -> io::Result<BufRing> {
        let ring_bytes = usize::from(count) * std::mem::size_of::<types::BufRingEntry>();
        let map_len = ring_bytes + usize::from(count) * size;
        // SAFETY: an anonymous private mapping; the result is checked.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(BufRing {
            map: map.cast(),
            map_len,
            entries: count,
            buf_size: size,
            tail: 0,
            free: (0..count).rev().collect(),
            offered: 0,
            window: INITIAL_WINDOW.min(count),
            peak_in_use: 0,
            fills: 0,
            waiting: Vec::new(),
        })
    }

    pub(crate) fn group(&self) -> u16 {
        GROUP
    }

    fn ring_base(&self) -> *mut types::BufRingEntry {
        self.map.cast()
    }

    fn buf_ptr(&self, bid: u16) -> *mut u8 {
        let ring_bytes = usize::from(self.entries) * std::mem::size_of::<types::BufRingEntry>();
        self.map.wrapping_add(ring_bytes + usize::from(bid) * self.buf_size)
    }

    /// Takes buffer `bid` back: it is offered to the kernel again before
    /// any buffer given back earlier. Returns the receivers that waited for
    /// one, to be woken once the ring is no longer borrowed.
    fn give(&mut self, bid: u16) -> Option<Vec<std::task::Waker>> {
        self.free.push(bid);
        self.top_up();
        (!self.waiting.is_empty()).then(|| std::mem::take(&mut self.waiting))
    }

    /// A completion named a buffer: the kernel took it out of the ring.
    pub(crate) fn taken(&mut self) {
        self.offered = self.offered.saturating_sub(1);
        let free = u16::try_from(self.free.len()).unwrap_or(u16::MAX);
        let in_use = self.entries.saturating_sub(self.offered).saturating_sub(free);
        self.peak_in_use = self.peak_in_use.max(in_use);
        self.fills = self.fills.saturating_add(1);
        if self.fills >= DECAY_EVERY {
            if self.window > INITIAL_WINDOW && self.peak_in_use.saturating_mul(4) <= self.window {
                self.window = (self.window / 2).max(INITIAL_WINDOW.min(self.entries));
            }
            self.peak_in_use = 0;
            self.fills = 0;
        }
        self.top_up();
    }

    /// A receive found the ring empty: offer more buffers at once.
    /// Whether none could be offered (every buffer is lent out).
    fn starved(&mut self) -> bool {
        self.window = self.window.saturating_mul(2).min(self.entries);
        self.top_up();
        self.offered == 0
    }

    /// Offers free buffers, hottest first, until the window is full.
    fn top_up(&mut self) {
        let mut any = false;
        while self.offered < self.window {
            let Some(bid) = self.free.pop() else { break };
            self.offer(bid);
            self.offered += 1;
            any = true;
        }
        if any {
            // SAFETY: the tail field overlays the first entry's reserved
            // word; the kernel reads it with acquire ordering.
            let tail = unsafe { &*(types::BufRingEntry::tail(self.ring_base()) as *const AtomicU16) };
            tail.store(self.tail, Ordering::Release);
        }
    }

    /// Writes buffer `bid` into the ring's next entry (published with the
    /// tail by [`top_up`](Self::top_up)).
    fn offer(&mut self, bid: u16) {
        let mask = self.entries - 1;
        // SAFETY: the index is masked inside the ring's `entries` entries,
        // which live at the start of the mapping.
        let entry = unsafe { &mut *self.ring_base().add(usize::from(self.tail & mask)) };
        entry.set_addr(self.buf_ptr(bid) as u64);
        entry.set_len(self.buf_size as u32);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }
}

impl BufRing {
    /// Buffers the kernel filled and a [`RecvBuf`] still holds.
    fn lent(&self) -> u16 {
        let free = u16::try_from(self.free.len()).unwrap_or(u16::MAX);
        self.entries.saturating_sub(self.offered).saturating_sub(free)
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // A `RecvBuf` may outlive its runtime on this thread (dropped
        // after it): its bytes must stay readable, so a ring with buffers
        // still lent is left mapped (leaked) rather than unmapped under
        // them. Only a runtime torn down mid-receive pays this.
        if self.lent() > 0 {
            log::debug!("reactor: {} receive buffers still held at shutdown; their ring stays mapped", self.lent());
            return;
        }
        // SAFETY: the mapping was created by mmap with this length, the
        // ring was unregistered (or never registered) before the drop, and
        // no `RecvBuf` points into it (none lent).
        unsafe { libc::munmap(self.map.cast(), self.map_len) };
    }
}

/// Registers this reactor's receive buffer ring: `count` buffers (a power
/// of two, at most 32768) of `size` bytes. Once per reactor; without it (or
/// when the kernel lacks it) receives are one-shot.
pub fn register_receive_buffers(count: u16, size: usize) -> io::Result<()> {
    if !count.is_power_of_two() || count > 32768 || size == 0 || size > 1 << 20 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "receive buffers: a power of two up to 32768, of 1 B..1 MiB",
        ));
    }
    with_core(|core| {
        if !core.features().recv_multishot {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "the kernel has no multishot receive"));
        }
        if core.bufring.borrow().is_some() {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, "receive buffers already registered"));
        }
        let mut ring = BufRing::map(count, size)?;
        let map = ring.map;
        // SAFETY: the ring memory stays mapped until `BufRing` drops, which
        // happens after it is unregistered (Core::cancel_all).
        unsafe { core.ring().submitter().register_buf_ring_with_flags(map as u64, count, GROUP, 0)? };
        ring.top_up();
        *core.bufring.borrow_mut() = Some(ring);
        Ok(())
    })
}

/// The provided buffer a completion names, if any.
pub(crate) fn buffer_of(flags: u32) -> Option<u16> {
    cqueue::buffer_select(flags)
}

/// This reactor's ring: buffers on offer, buffers free (given back, not
/// offered), all buffers, and the window.
#[cfg(test)]
pub(crate) fn ring_counts() -> Option<(u16, usize, u16, u16)> {
    try_with_core(|c| c.bufring.borrow().as_ref().map(|r| (r.offered, r.free.len(), r.entries, r.window))).flatten()
}

/// A completion named a buffer: the ring has one fewer on offer.
pub(crate) fn taken_in(core: &Core) {
    if let Some(r) = core.bufring.borrow_mut().as_mut() {
        r.taken();
    }
}

pub(crate) fn recycle_in(core: &Core, bid: u16) {
    let waiting = core.bufring.borrow_mut().as_mut().and_then(|r| r.give(bid));
    for w in waiting.into_iter().flatten() {
        w.wake();
    }
}

/// Ready once the ring offers a buffer again (at once if it has none).
async fn buffer_offered() {
    std::future::poll_fn(|cx| {
        try_with_core(|c| match c.bufring.borrow_mut().as_mut() {
            Some(r) if r.offered == 0 => {
                if !r.waiting.iter().any(|w| w.will_wake(cx.waker())) {
                    r.waiting.push(cx.waker().clone());
                }
                Poll::Pending
            }
            _ => Poll::Ready(()),
        })
        .unwrap_or(Poll::Ready(()))
    })
    .await
}

/// Received bytes, valid until dropped. Dropping gives the buffer back
/// to this thread's ring, so it never leaves the thread:
///
/// ```
/// fn here<T>() {}
/// here::<reactor::RecvBuf<'static>>();
/// ```
///
/// ```compile_fail
/// fn elsewhere<T: Send>() {}
/// elsewhere::<reactor::RecvBuf<'static>>();
/// ```
pub struct RecvBuf<'a> {
    bytes: &'a [u8],
    /// The buffer, and the runtime whose ring it is
    /// ([`crate::rt::Core::serial`]): dropped under a later runtime of
    /// the thread, it belongs to no ring there.
    bid: Option<(u16, u64)>,
    /// Given back to this thread's ring when dropped: never moved to
    /// another thread.
    _ring: crate::ThreadBound,
}

impl std::ops::Deref for RecvBuf<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.bytes
    }
}

impl Drop for RecvBuf<'_> {
    fn drop(&mut self) {
        if let Some((bid, ring)) = self.bid {
            try_with_core(|c| {
                if c.serial() == ring {
                    recycle_in(c, bid);
                }
            });
        }
    }
}

/// The receiving side of a connection: multishot into the reactor's
/// buffer ring, or one-shot into its own buffer.
pub struct Receiver {
    fd: Rc<Socket>,
    /// The armed multishot receive: its slot, valid only under the
    /// runtime whose serial is `multi_ring` (a receiver kept past its
    /// runtime must not take the next runtime's slot of that number).
    multi: Option<u32>,
    multi_ring: u64,
    own: Vec<u8>,
    /// What [`park`](Self::park) took out of the shared buffers, returned
    /// by the next [`recv`](Self::recv) before anything else, then the end
    /// of stream or error the stopped receive met after it, if any.
    parked: Vec<u8>,
    parked_end: Option<io::Result<()>>,
}

impl Receiver {
    pub(crate) fn new(stream: &TcpStream) -> Receiver {
        Receiver {
            fd: stream.socket().clone(),
            multi: None,
            multi_ring: 0,
            own: Vec::new(),
            parked: Vec::new(),
            parked_end: None,
        }
    }

    /// The armed multishot receive's slot, if it is this thread's current
    /// runtime's (one armed under a runtime that is gone is forgotten: that
    /// runtime cancelled it when it ended).
    fn armed(&mut self) -> Option<u32> {
        let idx = self.multi?;
        if try_with_core(|c| c.serial()) == Some(self.multi_ring) {
            Some(idx)
        } else {
            self.multi = None;
            None
        }
    }

    fn ring_ready() -> bool {
        try_with_core(|c| c.bufring.borrow().is_some()).unwrap_or(false)
    }

    /// The next bytes from the peer; empty at end of stream.
    pub async fn recv(&mut self) -> io::Result<RecvBuf<'_>> {
        if !self.parked.is_empty() {
            std::mem::swap(&mut self.own, &mut self.parked);
            self.parked.clear();
            return Ok(RecvBuf { bytes: &self.own, bid: None, _ring: crate::ThreadBound::default() });
        }
        if let Some(end) = self.parked_end.take() {
            end?;
            return Ok(RecvBuf { bytes: &[], bid: None, _ring: crate::ThreadBound::default() });
        }
        if !Self::ring_ready() {
            return self.recv_oneshot().await;
        }
        loop {
            let idx = match self.armed() {
                Some(i) => i,
                None => {
                    let (fd, flags) = self.fd.target();
                    let entry = opcode::RecvMulti::new(fd, GROUP).build().flags(flags);
                    let (i, ring) = with_core(|c| (c.push(entry, c.new_multi()), c.serial()));
                    self.multi = Some(i);
                    self.multi_ring = ring;
                    i
                }
            };
            let next = std::future::poll_fn(|cx| with_core(|c| c.poll_multi(idx, cx))).await;
            match next {
                None => {
                    // The multishot ended (the slot is free): arm again.
                    self.multi = None;
                }
                Some((res, flags)) => match multishot_result(res, flags)? {
                    Some(got) => return Ok(got),
                    None if res == -libc::ENOBUFS => {
                        // Every buffer offered is in use on this reactor:
                        // offer more, let the others be parsed and given
                        // back, then arm again. When every buffer is lent
                        // out, arming again would only meet ENOBUFS again
                        // (a spin holding the core until one comes back):
                        // wait for one instead, counted.
                        let dry = try_with_core(|c| {
                            let dry = c.bufring.borrow_mut().as_mut().is_some_and(BufRing::starved);
                            if dry {
                                c.receive_dry.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                            dry
                        });
                        if dry == Some(true) {
                            buffer_offered().await;
                        } else {
                            crate::rt::yield_now().await;
                        }
                    }
                    // EINTR, or ECANCELED (`pause` stopped it): arm again.
                    None => {}
                },
            }
        }
    }

    /// After [`pause`](Self::pause): what the stopped multishot receive had
    /// already taken, in order, then `None` once it has ended. Nothing is
    /// armed until the next [`recv`](Self::recv), so in between the caller
    /// may receive the stream's next bytes elsewhere (into an I/O's own
    /// buffer, with `TcpStream::read`) without reordering them.
    pub async fn recv_stopped(&mut self) -> io::Result<Option<RecvBuf<'_>>> {
        loop {
            let Some(idx) = self.armed() else { return Ok(None) };
            match std::future::poll_fn(|cx| with_core(|c| c.poll_multi(idx, cx))).await {
                None => {
                    self.multi = None;
                    return Ok(None);
                }
                Some((res, flags)) => {
                    if let Some(got) = multishot_result(res, flags)? {
                        return Ok(Some(got));
                    }
                }
            }
        }
    }

    /// Receives into `buf` (as `TcpStream::read`): for the stream's next
    /// bytes when they belong somewhere known, after
    /// [`recv_stopped`](Self::recv_stopped) returned `None`. With a
    /// multishot receive still armed, or bytes [parked](Self::park) and not
    /// yet taken, the bytes could come out of order, so that is refused.
    pub async fn read_into<B: IoBufMut>(&mut self, mut buf: B) -> (io::Result<usize>, B) {
        if self.armed().is_some() || !self.parked.is_empty() {
            return (Err(io::Error::other("read_into while a multishot receive is armed or bytes are parked")), buf);
        }
        let len = buf.bytes_total();
        let (fd, flags) = self.fd.target();
        let entry = opcode::Recv::new(fd, buf.write_ptr(), len as u32).build().flags(flags);
        let done = Op::submit(entry, (buf, self.fd.clone())).await;
        let (mut buf, _) = done.data;
        let n = crate::op::result(done.res);
        if let Ok(n) = n {
            // SAFETY: the kernel wrote `n` bytes.
            unsafe { buf.set_init(n) };
        }
        (n, buf)
    }

    /// Stops the multishot receive from taking more of the reactor's shared
    /// buffers until the next [`recv`](Self::recv), which first hands over
    /// what already arrived and then arms a new one; the buffers already
    /// filled stay held until then ([`park`](Self::park) gives them back).
    /// One-shot receives hold nothing: no-op.
    pub fn pause(&mut self) {
        if let Some(idx) = self.armed() {
            try_with_core(|c| c.cancel(idx));
        }
    }

    /// Stops the multishot receive as [`pause`](Self::pause) does, and
    /// copies what it had already taken out of the reactor's shared
    /// buffers, which go back at once; the next [`recv`](Self::recv)
    /// returns the copy first. For a connection that stops reading for a
    /// while (its peer does not read our replies): it then holds none of
    /// the buffers the reactor's other connections receive into, only its
    /// copy of what its peer had sent before the stop (at most what its
    /// socket's receive buffer held).
    pub async fn park(&mut self) {
        if self.armed().is_none() {
            return;
        }
        self.pause();
        let mut parked = std::mem::take(&mut self.parked);
        let end = loop {
            match self.recv_stopped().await {
                Ok(None) => break None,
                Ok(Some(b)) if b.is_empty() => break Some(Ok(())),
                Ok(Some(b)) => parked.extend_from_slice(&b),
                Err(e) => break Some(Err(e)),
            }
        };
        self.parked = parked;
        if end.is_some() {
            self.parked_end = end;
        }
    }

    async fn recv_oneshot(&mut self) -> io::Result<RecvBuf<'_>> {
        let mut buf = std::mem::take(&mut self.own);
        buf.clear();
        if buf.capacity() < FALLBACK_BUF {
            buf.reserve(FALLBACK_BUF);
        }
        let (n, buf) = self.read_into(buf).await;
        self.own = buf;
        n?;
        Ok(RecvBuf { bytes: &self.own, bid: None, _ring: crate::ThreadBound::default() })
    }
}

/// One completion of a multishot receive: bytes (empty at end of stream),
/// `None` for a result that only ends or restarts the receive (ENOBUFS,
/// EINTR, ECANCELED), or the error.
fn multishot_result<'a>(res: i32, flags: u32) -> io::Result<Option<RecvBuf<'a>>> {
    let bid = buffer_of(flags);
    if res > 0 {
        let Some(bid) = bid else {
            return Err(io::Error::other("multishot receive completed without a buffer"));
        };
        let ptr = with_core(|c| c.bufring.borrow().as_ref().map(|r| (r.buf_ptr(bid), c.serial())));
        let Some((ptr, ring)) = ptr else { return Err(io::Error::other("receive buffer ring vanished")) };
        // SAFETY: the kernel wrote `res` bytes into buffer `bid`, which is
        // ours until given back (when the RecvBuf drops); the mapping
        // outlives the reactor's tasks.
        let bytes = unsafe { std::slice::from_raw_parts(ptr, res as usize) };
        return Ok(Some(RecvBuf { bytes, bid: Some((bid, ring)), _ring: crate::ThreadBound::default() }));
    }
    if let Some(b) = bid {
        try_with_core(|c| recycle_in(c, b));
    }
    match res {
        0 => Ok(Some(RecvBuf { bytes: &[], bid: None, _ring: crate::ThreadBound::default() })),
        r if r == -libc::ENOBUFS || r == -libc::EINTR || r == -libc::ECANCELED => Ok(None),
        r => Err(io::Error::from_raw_os_error(-r)),
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(idx) = self.armed() {
            let fd = self.fd.clone();
            try_with_core(|c| c.abandon(idx, Some(Box::new(crate::rt::Plain(fd)))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buffer ids offered so far, oldest first.
    fn offered(r: &BufRing) -> Vec<u16> {
        let mask = r.entries - 1;
        (0..r.tail)
            .map(|i| {
                // SAFETY: the index is masked inside the ring's entries.
                let e = unsafe { &*r.ring_base().add(usize::from(i & mask)) };
                e.bid()
            })
            .collect()
    }

    #[test]
    fn buffers_given_back_are_offered_again_most_recent_first() {
        let mut r = BufRing::map(256, 512).expect("map");
        r.top_up();
        assert_eq!(offered(&r), (0..INITIAL_WINDOW).collect::<Vec<_>>(), "the window, lowest ids first");
        // The kernel fills three; they come back 2, 0, 1.
        for _ in 0..3 {
            r.taken();
        }
        let tail = usize::from(r.tail);
        assert_eq!(offered(&r)[tail - 3..], [64, 65, 66], "untouched buffers keep the window full");
        for bid in [2, 0, 1] {
            r.give(bid);
        }
        // Nothing more on offer (the window is full), the three wait.
        assert_eq!(usize::from(r.tail), tail);
        r.taken();
        r.taken();
        assert_eq!(offered(&r)[tail..], [1, 0], "the last given back is offered first");
        assert_eq!(r.offered, INITIAL_WINDOW);
    }

    #[test]
    fn a_starved_ring_offers_twice_as_many_up_to_all() {
        let mut r = BufRing::map(256, 512).expect("map");
        r.top_up();
        r.starved();
        assert_eq!((r.window, r.offered), (128, 128));
        r.starved();
        r.starved();
        assert_eq!((r.window, r.offered, usize::from(r.tail)), (256, 256, 256));
        assert!(r.free.is_empty());
        let mut ids = offered(&r);
        ids.sort_unstable();
        assert_eq!(ids, (0..256).collect::<Vec<_>>(), "every buffer offered once");
    }

    #[test]
    fn a_window_a_light_load_no_longer_needs_shrinks_back() {
        let mut r = BufRing::map(256, 512).expect("map");
        r.top_up();
        r.starved();
        r.starved();
        assert_eq!(r.window, 256);
        // One buffer in use at a time: filled, then given back.
        let cycle = |r: &mut BufRing, n: u32| {
            for _ in 0..n {
                r.taken();
                let bid = offered(r)[usize::from(r.tail.wrapping_sub(r.offered).wrapping_sub(1) % r.entries)];
                r.give(bid);
            }
        };
        cycle(&mut r, DECAY_EVERY - 1);
        assert_eq!(r.window, 256, "not before DECAY_EVERY fills");
        cycle(&mut r, 1);
        assert_eq!(r.window, 128);
        cycle(&mut r, 3 * DECAY_EVERY);
        assert_eq!(r.window, INITIAL_WINDOW, "never below the first window");
        assert_eq!(usize::from(r.offered) + r.free.len(), 256, "every buffer offered or free");
        // A load that keeps its buffers keeps the window.
        r.starved();
        assert_eq!(r.window, 128);
        for _ in 0..DECAY_EVERY {
            r.taken();
        }
        assert_eq!(r.window, 128);
    }
}
