//! A wake-up that other threads can ring: an eventfd whose read this
//! reactor keeps posted on its ring. Ringing writes the eventfd; the
//! pending read completes and [`Doorbell::wait`] returns. Rings before the
//! read completes add up into one wake-up. An idle reactor sleeps in the
//! kernel until then: nothing polls.

use crate::op::Op;
use io_uring::{opcode, types};
use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// The reactor's side: waits for rings. Not `Send`; make it on the
/// reactor thread that waits.
pub struct Doorbell {
    fd: Arc<OwnedFd>,
    /// The 8-byte counter buffer, reused by every read.
    counter: RefCell<Option<Vec<u8>>>,
}

/// Another thread's side: rings the doorbell. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Ringer(Arc<OwnedFd>);

/// A doorbell and the ringer that rings it.
pub fn doorbell() -> io::Result<(Doorbell, Ringer)> {
    // SAFETY: eventfd has no memory preconditions.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor this function owns.
    let fd = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
    Ok((Doorbell { fd: fd.clone(), counter: RefCell::new(Some(vec![0; 8])) }, Ringer(fd)))
}

impl Doorbell {
    /// Waits until the doorbell was rung (at once if it was rung since the
    /// last wait). Not for two waiters at a time.
    pub async fn wait(&self) -> io::Result<()> {
        let mut counter = self.counter.borrow_mut().take().unwrap_or_default();
        counter.clear();
        counter.reserve(8);
        let entry = opcode::Read::new(types::Fd(self.fd.as_raw_fd()), counter.as_mut_ptr(), 8).build();
        // The read owns the descriptor's `Arc` (it stays open until the
        // kernel is done, whenever the Doorbell drops). A wait dropped
        // after its read took the count (a `timeout` or `race` that ended
        // the same turn) rings again, so the next wait sees the ring.
        let done = Op::submit(entry, (counter, self.fd.clone())).on_lost(ring_again).await;
        *self.counter.borrow_mut() = Some(done.data.0);
        crate::op::result(done.res).map(drop)
    }
}

/// The result of a doorbell read nobody took: the count it read, put back.
fn ring_again(data: &(Vec<u8>, Arc<OwnedFd>), res: i32) {
    if res > 0 {
        Ringer(data.1.clone()).ring();
    }
}

impl Ringer {
    /// Rings the doorbell from any thread.
    pub fn ring(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our eventfd; it can
        // only fail if the counter would overflow, which leaves the
        // doorbell rung anyway.
        unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }
}
