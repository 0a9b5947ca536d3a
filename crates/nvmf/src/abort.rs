//! Abort (NVMe Base 2.0 section 5.1): the admin queue's request to stop a
//! command of one of its controller's I/O queues, which may live on
//! another reactor.
//!
//! Each controller has one mailbox. The admin queue posts a request for
//! I/O queue SQID and rings that queue's doorbell; the queue, on its own
//! reactor, looks the command up by CID in its own state, completes it
//! with Command Abort Requested when it has not reached the device yet,
//! posts the answer and rings the admin queue's doorbell, which completes
//! the Abort (Dword 0 bit 0 clear: aborted; set: not aborted). The mailbox
//! is locked only by Aborts and by queues connecting and closing, never by
//! the I/O path, and holds at most [`ABORT_LIMIT`] requests: more Aborts
//! outstanding are refused with Abort Command Limit Exceeded. A doorbell
//! is whatever the driver registers (an eventfd write): this crate does no
//! I/O.

use crate::controller::Controller;
use crate::queue::{Outcome, Queue, QueueKind};
use block::BlockDevice;
use nvme_spec::{Cqe, Status};
use std::sync::{Arc, Mutex};

/// Aborts a controller keeps outstanding at once: Identify Controller ACL
/// is this minus one.
pub(crate) const ABORT_LIMIT: usize = 4;

/// Wakes the reactor that owns a queue, from any thread.
pub type Doorbell = Arc<dyn Fn() + Send + Sync>;

/// An Abort on its way to the I/O queue that holds the command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AbortRequest {
    /// The command to abort.
    pub cid: u16,
    sqid: u16,
    /// The Abort command itself, on the admin queue.
    admin_cid: u16,
    /// The controller's resets when it was posted: one since ended it.
    resets: u64,
}

/// One controller's Aborts in flight between its queues.
#[derive(Default)]
pub(crate) struct Mailbox {
    /// Requests waiting for their I/O queue.
    requests: Vec<AbortRequest>,
    /// Answers waiting for the admin queue: (Abort's CID, aborted).
    answers: Vec<(u16, bool)>,
    /// Aborts taken and not yet completed.
    outstanding: usize,
    /// The doorbell of each connected I/O queue that registered one.
    io_doorbells: Vec<(u16, Doorbell)>,
    admin_doorbell: Option<Doorbell>,
}

impl std::fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox")
            .field("requests", &self.requests)
            .field("answers", &self.answers)
            .field("outstanding", &self.outstanding)
            .finish_non_exhaustive()
    }
}

fn lock(m: &Mutex<Mailbox>) -> std::sync::MutexGuard<'_, Mailbox> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<D: BlockDevice> Controller<D> {
    /// Takes an Abort of command `cid` on I/O queue `sqid`: `None` once it
    /// is posted to that queue (the Abort completes when it answers),
    /// else the Abort's own completion.
    fn post_abort(&self, admin_cid: u16, sqid: u16, cid: u16) -> Option<Cqe> {
        let doorbell = {
            let mut m = lock(&self.aborts);
            if m.outstanding >= ABORT_LIMIT {
                return Some(Cqe::new(admin_cid, Status::ABORT_COMMAND_LIMIT, 0));
            }
            // No such queue (or one whose driver cannot be woken): the
            // command is not there to abort.
            let Some((_, doorbell)) = m.io_doorbells.iter().find(|(q, _)| *q == sqid) else {
                return Some(not_aborted(admin_cid));
            };
            let doorbell = doorbell.clone();
            m.outstanding = m.outstanding.saturating_add(1);
            m.requests.push(AbortRequest { cid, sqid, admin_cid, resets: self.resets() });
            doorbell
        };
        doorbell();
        None
    }

    /// Rings the doorbell of each of the controller's I/O queues, which
    /// also makes each look at its namespaces again
    /// ([`Queue::refresh_namespaces`]).
    pub(crate) fn ring_io_queues(&self) {
        let bells: Vec<Doorbell> = lock(&self.aborts).io_doorbells.iter().map(|(_, d)| d.clone()).collect();
        for ring in bells {
            ring();
        }
    }

    /// A Controller Level Reset ended every Abort outstanding (NVMe Base
    /// 2.0 3.7.2) and deleted the I/O queues: their requests and answers
    /// go, with the doorbells of the deleted queues. The host may use the
    /// Aborts' CIDs again at once.
    pub(crate) fn reset_aborts(&self) {
        let mut m = lock(&self.aborts);
        m.requests.clear();
        m.answers.clear();
        m.outstanding = 0;
        m.io_doorbells.clear();
    }

    /// Posts the answer to `req` for the admin queue and wakes it, unless
    /// a reset ended the Abort meanwhile.
    fn answer_abort(&self, req: AbortRequest, aborted: bool) {
        let doorbell = {
            let mut m = lock(&self.aborts);
            if req.resets != self.resets() {
                return;
            }
            m.answers.push((req.admin_cid, aborted));
            m.admin_doorbell.clone()
        };
        if let Some(ring) = doorbell {
            ring();
        }
    }
}

/// The completion of an Abort whose command was not aborted.
fn not_aborted(admin_cid: u16) -> Cqe {
    Cqe::new(admin_cid, Status::SUCCESS, 1)
}

impl<D: BlockDevice> Queue<D> {
    /// Abort (admin opcode 08h): CDW10 bits 15:00 SQID, bits 31:16 CID.
    pub(crate) fn abort_command<B>(&mut self, ctrl: &Controller<D>, admin_cid: u16, cdw10: u32) -> Outcome<B, D> {
        let sqid = (cdw10 & 0xffff) as u16;
        let cid = (cdw10 >> 16) as u16;
        // Admin commands run to completion at once: nothing to abort there.
        if sqid == 0 {
            return Outcome::Complete { cqe: not_aborted(admin_cid), data: Vec::new() };
        }
        match ctrl.post_abort(admin_cid, sqid, cid) {
            Some(cqe) => {
                log::debug!("{}: Abort of sqid {sqid} cid {cid}: {}", self.peer, cqe.status());
                Outcome::Complete { cqe, data: Vec::new() }
            }
            None => Outcome::Deferred,
        }
    }

    /// Registers the doorbell that wakes this queue's driver when an Abort
    /// concerns it: on an I/O queue, when the admin queue posts a request;
    /// on an admin queue, when an I/O queue answers one. Call it once the
    /// queue is connected; [`close`](Self::close) unregisters it.
    pub fn set_abort_doorbell(&mut self, doorbell: Doorbell) {
        match &self.kind {
            QueueKind::Admin(c) => lock(&c.aborts).admin_doorbell = Some(doorbell),
            QueueKind::Io(c, qid) => {
                let mut m = lock(&c.aborts);
                m.io_doorbells.retain(|(q, _)| q != qid);
                m.io_doorbells.push((*qid, doorbell));
            }
            QueueKind::Unconnected => {}
        }
    }

    /// The next Abort posted for this I/O queue; hand it to
    /// [`abort`](Self::abort).
    pub fn poll_abort(&mut self) -> Option<AbortRequest> {
        let QueueKind::Io(c, qid) = &self.kind else { return None };
        if self.deleted(c) {
            // Requests for its queue ID are a new queue's.
            return None;
        }
        let mut m = lock(&c.aborts);
        let i = m.requests.iter().position(|r| r.sqid == *qid)?;
        Some(m.requests.swap_remove(i))
    }

    /// Carries out `req` on this I/O queue. `cancel(cid, awaiting_data)`
    /// says whether the command can still be stopped before it reaches
    /// the device (and stops it): with `awaiting_data` the queue holds it
    /// until its host data arrives, and the transport says whether that
    /// transfer can be given up; otherwise the driver says whether it
    /// holds the command back (a device's injected delay). Returns the
    /// aborted command's completion (Command Abort Requested) to send; the
    /// answer goes back to the admin queue either way.
    pub fn abort(&mut self, req: AbortRequest, cancel: impl FnOnce(u16, bool) -> bool) -> Option<Cqe> {
        let awaiting = self.pending.contains_key(&req.cid);
        let aborted = cancel(req.cid, awaiting);
        if aborted && awaiting {
            self.pending.remove(&req.cid);
            // A fused half: its partner completes with Failed Fused
            // Command (now, or when its data arrives), and the pair's
            // place is free for the next one.
            if self.is_fused_half(req.cid) {
                self.fused_half_failed(req.cid);
            }
        }
        log::debug!(
            "{}: Abort of cid {}: {}",
            self.peer,
            req.cid,
            if aborted { "aborted before it reached the device" } else { "not aborted" }
        );
        if let QueueKind::Io(c, _) = &self.kind {
            c.answer_abort(req, aborted);
        }
        aborted.then(|| Cqe::new(req.cid, Status::ABORT_REQUESTED, 0))
    }

    /// The completion of an Abort whose I/O queue answered, on the admin
    /// queue.
    pub fn poll_abort_answer(&mut self) -> Option<Cqe> {
        let QueueKind::Admin(c) = &self.kind else { return None };
        let mut m = lock(&c.aborts);
        let (admin_cid, aborted) = m.answers.pop()?;
        m.outstanding = m.outstanding.saturating_sub(1);
        Some(if aborted { Cqe::new(admin_cid, Status::SUCCESS, 0) } else { not_aborted(admin_cid) })
    }

    /// The queue is closing: it takes its doorbell away, and an I/O queue
    /// answers the requests still posted for it (not aborted).
    pub(crate) fn close_aborts(&mut self) {
        let (c, qid) = match &self.kind {
            // A reset took its doorbell and requests away; those of its
            // queue ID now are a new queue's.
            QueueKind::Io(c, _) if self.deleted(c) => return,
            QueueKind::Io(c, qid) => (c, qid),
            QueueKind::Admin(c) => {
                lock(&c.aborts).admin_doorbell = None;
                return;
            }
            QueueKind::Unconnected => return,
        };
        let left: Vec<AbortRequest> = {
            let mut m = lock(&c.aborts);
            m.io_doorbells.retain(|(q, _)| q != qid);
            let (left, keep) = m.requests.drain(..).partition(|r| r.sqid == *qid);
            m.requests = keep;
            left
        };
        for req in left {
            c.answer_abort(req, false);
        }
    }
}
