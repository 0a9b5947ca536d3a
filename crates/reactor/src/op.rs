//! One ring operation as a future: it owns what the kernel touches (buffers,
//! the descriptor's owner, socket addresses) until the completion, and if
//! it is dropped first, hands them to the ring's slot and asks the kernel
//! to cancel. An operation on a borrowed descriptor owns nothing of it:
//! the kernel takes its own reference on the file when the entry is
//! submitted, so dropped before that, the operation submits first, while
//! the borrow still keeps the number open.

use crate::rt::{with_core, Kept, OnLost, OpState, Plain};
use io_uring::squeue;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

pub(crate) struct Op<T: 'static> {
    idx: u32,
    /// The runtime whose slot `idx` is ([`crate::rt::Core::serial`]): a
    /// future kept past it must not act on the next runtime's slot of
    /// that number.
    ring: u64,
    data: Option<T>,
    done: bool,
    /// The entry names a descriptor the caller only borrowed.
    borrowed_fd: bool,
    /// What to do with a result that comes (or came) after the future was
    /// dropped: undo it (close the descriptor an accept made).
    on_lost: Option<fn(&T, i32)>,
    /// Neither `Send` nor `Sync`: `idx` is a slot of the submitting
    /// thread's ring, and only that thread may cancel it or free `data`
    /// (dropped elsewhere, the kernel would write into freed memory).
    _ring: crate::ThreadBound,
}

/// A finished operation: the kernel's result, the CQE flags, and what the
/// operation owned.
pub(crate) struct Completed<T> {
    pub res: i32,
    pub data: T,
}

impl<T: 'static> Op<T> {
    /// Queues `entry`, whose pointers point into `data` (heap memory that
    /// does not move with it).
    pub(crate) fn submit(entry: squeue::Entry, data: T) -> Op<T> {
        let (idx, ring) = with_core(|c| (c.push(entry, OpState::Waiting(None)), c.serial()));
        Op {
            idx,
            ring,
            data: Some(data),
            done: false,
            borrowed_fd: false,
            on_lost: None,
            _ring: crate::ThreadBound::default(),
        }
    }

    /// As [`Op::submit`], for an entry naming a descriptor that the
    /// caller's borrow keeps open only as long as this `Op` lives: dropped
    /// unfinished, it hands the kernel every queued entry before it lets
    /// go, so the number is never looked up after it may have been closed
    /// and reused.
    pub(crate) fn submit_borrowed(entry: squeue::Entry, data: T) -> Op<T> {
        let mut op = Op::submit(entry, data);
        op.borrowed_fd = true;
        op
    }

    /// Calls `f` with the data and the result when the operation
    /// completes but its future was dropped first: a result that made
    /// something (an accepted descriptor) or took something (a doorbell's
    /// ring) is undone rather than lost.
    pub(crate) fn on_lost(mut self, f: fn(&T, i32)) -> Op<T> {
        self.on_lost = Some(f);
        self
    }
}

// Nothing in an Op is pinned in place: the kernel sees only heap memory
// the data owns.
impl<T> Unpin for Op<T> {}

impl<T: 'static> Future for Op<T> {
    type Output = Completed<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Completed<T>> {
        let (idx, ring) = (self.idx, self.ring);
        let polled = with_core(|c| {
            assert!(c.serial() == ring, "ironwire reactor: an operation polled under a runtime other than its own");
            c.poll_op(idx, cx)
        });
        match polled {
            Poll::Ready((res, _flags)) => {
                self.done = true;
                let data = self.data.take().expect("operation polled after completion");
                Poll::Ready(Completed { res, data })
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: 'static> Drop for Op<T> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let keep = self.data.take().map(|d| match self.on_lost {
            Some(f) => Box::new(OnLost(d, f)) as Box<dyn Kept>,
            None => Box::new(Plain(d)) as Box<dyn Kept>,
        });
        let (idx, ring) = (self.idx, self.ring);
        let borrowed_fd = self.borrowed_fd;
        let mut keep = keep;
        crate::rt::try_with_core(|c| {
            if c.serial() == ring {
                if borrowed_fd {
                    c.submit_queued();
                }
                c.abandon(idx, keep.take());
            }
        });
        // Its runtime is gone (the future outlived it): that runtime
        // waited for its operations at the end, but gave up on those the
        // kernel kept; whether this was one is not known here, so what it
        // owned is leaked rather than freed under the kernel.
        std::mem::forget(keep);
    }
}

/// The result of a completion as `io::Result<usize>`.
pub(crate) fn result(res: i32) -> std::io::Result<usize> {
    if res < 0 {
        Err(std::io::Error::from_raw_os_error(-res))
    } else {
        Ok(res as usize)
    }
}
