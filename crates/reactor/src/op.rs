//! One ring operation as a future: it owns what the kernel touches (buffers,
//! the descriptor's owner, socket addresses) until the completion, and if
//! it is dropped first, hands them to the ring's slot and asks the kernel
//! to cancel. An operation on a borrowed descriptor owns nothing of it:
//! the kernel takes its own reference on the file when the entry is
//! submitted, so dropped before that, the operation submits first, while
//! the borrow still keeps the number open.

use crate::rt::{with_core, OpState};
use io_uring::squeue;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

pub(crate) struct Op<T: 'static> {
    idx: u32,
    data: Option<T>,
    done: bool,
    /// The entry names a descriptor the caller only borrowed.
    borrowed_fd: bool,
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
        let idx = with_core(|c| c.push(entry, OpState::Waiting(None)));
        Op { idx, data: Some(data), done: false, borrowed_fd: false, _ring: crate::ThreadBound::default() }
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
}

// Nothing in an Op is pinned in place: the kernel sees only heap memory
// the data owns.
impl<T> Unpin for Op<T> {}

impl<T: 'static> Future for Op<T> {
    type Output = Completed<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Completed<T>> {
        let idx = self.idx;
        match with_core(|c| c.poll_op(idx, cx)) {
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
        let keep = self.data.take().map(|d| Box::new(d) as Box<dyn std::any::Any>);
        let idx = self.idx;
        let borrowed_fd = self.borrowed_fd;
        crate::rt::try_with_core(|c| {
            if borrowed_fd {
                c.submit_queued();
            }
            c.abandon(idx, keep)
        });
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
