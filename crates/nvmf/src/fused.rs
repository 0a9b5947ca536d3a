//! Fused Compare and Write (NVMe Base 2.0 section 3.4.2; NVM Command Set
//! 1.0 section 3.2.3): a Compare with FUSE = 01b followed, next in the
//! same submission queue, by a Write with FUSE = 10b of the same blocks.
//! The queue holds the first half (and each half's data as it arrives)
//! until both are here, then hands the pair to the reactor as one
//! [`BlockOp::CompareAndWrite`], which runs it under the device's range
//! lock. A first half whose partner does not follow, or a second half
//! with no first, completes with Command Aborted due to Missing Fused
//! Command; when one half fails, the other completes with Command Aborted
//! due to Failed Fused Command.
//!
//! Only fused commands and the command right after a first half come
//! here: plain commands pay one branch.
//!
//! NVMe Base 2.0 section 3.4.2 also says: a second half whose blocks
//! differ from its first's aborts both with Invalid Field in Command; when
//! the first half fails, the second is aborted with Failed Fused Command;
//! a fused combination the controller does not support (anything but
//! Compare then Write, any fused admin command) is Invalid Field.

use crate::io::{BlockOp, BlockRequest};
use crate::queue::{Outcome, Queue};
use block::BlockDevice;
use nvme_spec::opcode::{Admin, Io};
use nvme_spec::{Cqe, Sqe, Status};

/// CDW0 FUSE (bits 9:8, the low two bits of `Sqe::flags`).
const FUSE_MASK: u8 = 0b11;
/// First command of a fused operation.
const FUSE_FIRST: u8 = 0b01;
/// Second command of a fused operation.
const FUSE_SECOND: u8 = 0b10;

/// The FUSE field of `sqe`.
pub(crate) fn fuse(sqe: &Sqe) -> u8 {
    sqe.flags & FUSE_MASK
}

/// A fused Compare held until its Write and both halves' data are here.
#[derive(Debug)]
pub(crate) struct First<D> {
    cid: u16,
    sqe: Sqe,
    /// The namespace's device and NSID, once the Compare was checked, and
    /// the pair's count on the namespace.
    target: Option<(u32, crate::io::DeviceRef<D>, crate::io::InFlight<D>)>,
    expected: Option<Vec<u8>>,
    second: Second,
}

#[derive(Debug)]
enum Second {
    /// The next command may be the Write.
    Awaited,
    /// The next command was not it: the Compare completes with Missing
    /// Fused Command once its data is in (it may still be arriving).
    Missing,
    /// The next command was a fused Write of other blocks: the Compare
    /// completes with Invalid Field in Command once its data is in.
    Mismatched,
    /// The Write came (`data` once it is in).
    Arrived { cid: u16, data: Option<Vec<u8>>, fua: bool },
    /// The Write failed its checks: the Compare completes with Failed
    /// Fused Command once its data is in.
    Failed,
}

/// Whether `sqe` is the second half of a fused operation this controller
/// supports: a Write (NVM Command Set 1.0 section 3.2.3).
fn fused_write(sqe: &Sqe) -> bool {
    fuse(sqe) == FUSE_SECOND && Io(sqe.opcode) == Io::WRITE
}

/// Whether `second` is the Write that completes fused `first`: same
/// namespace and blocks (NVM Command Set 1.0 section 3.2.3).
fn partners(first: &Sqe, second: &Sqe) -> bool {
    fused_write(second)
        && first.nsid == second.nsid
        && first.slba() == second.slba()
        && first.blocks() == second.blocks()
}

impl<D: BlockDevice> Queue<D> {
    /// Whether `sqe` takes the fused path: it is a fused half, or a first
    /// half waits for the command that follows it.
    pub(crate) fn fused_path(&self, sqe: &Sqe) -> bool {
        (fuse(sqe) != 0 && sqe.opcode != Admin::FABRICS.0)
            || self.fused_first_failed
            || self.fused.as_ref().is_some_and(|f| matches!(f.second, Second::Awaited))
    }

    /// A command on the fused path arrives (in submission order).
    pub(crate) fn execute_fused<B: AsRef<[u8]>>(
        &mut self,
        now_ms: u64,
        sqe: &Sqe,
        data_len: u32,
        data: Option<B>,
    ) -> Outcome<B, D> {
        let cid = sqe.cid.get();
        // The command right after a first half that failed: if it is that
        // half's partner, it is aborted with it.
        if std::mem::take(&mut self.fused_first_failed) && fuse(sqe) == FUSE_SECOND {
            log::debug!("{}: cid {cid}: fused second command after a failed first", self.peer);
            return Outcome::status(cid, Status::ABORTED_FAILED_FUSED);
        }
        // A first half waiting for its partner loses it unless this is it;
        // a fused Write of other blocks makes the pair invalid.
        if let Some(first) = self.fused.as_mut() {
            if matches!(first.second, Second::Awaited) && !partners(&first.sqe, sqe) {
                let mismatched = fused_write(sqe);
                log::debug!(
                    "{}: fused Compare cid {} {}",
                    self.peer,
                    first.cid,
                    if mismatched { "and its Write address different blocks" } else { "not followed by its Write" }
                );
                first.second = if mismatched { Second::Mismatched } else { Second::Missing };
                let _: Outcome<B, D> = self.settle_fused();
                if mismatched {
                    return Outcome::status(cid, Status::INVALID_FIELD.dnr());
                }
            }
        }
        match fuse(sqe) {
            0 => self.execute_plain(now_ms, sqe, data_len, data),
            FUSE_FIRST if Io(sqe.opcode) != Io::COMPARE || !self.is_io_queue() => {
                log::debug!("{}: cid {cid}: opcode {:#04x} as a fused first command", self.peer, sqe.opcode);
                // (No fused operation is an admin one: a second half there
                // is refused as such.)
                self.fused_first_failed = self.is_io_queue();
                Outcome::status(cid, Status::INVALID_FIELD.dnr())
            }
            FUSE_FIRST if self.fused.is_some() => {
                // The previous pair still waits for its data: one at a time.
                log::debug!("{}: cid {cid}: fused Compare while another pair waits for data", self.peer);
                self.fused_first_failed = true;
                Outcome::status(cid, Status::COMMAND_SEQUENCE_ERROR.dnr())
            }
            FUSE_FIRST => {
                self.fused = Some(First { cid, sqe: *sqe, target: None, expected: None, second: Second::Awaited });
                let out = self.execute_plain(now_ms, sqe, data_len, data);
                self.fused_half(cid, out)
            }
            FUSE_SECOND if self.fused.as_ref().is_some_and(|f| matches!(f.second, Second::Awaited)) => {
                if let Some(first) = self.fused.as_mut() {
                    first.second = Second::Arrived { cid, data: None, fua: false };
                }
                let out = self.execute_plain(now_ms, sqe, data_len, data);
                self.fused_half(cid, out)
            }
            FUSE_SECOND if !fused_write(sqe) || !self.is_io_queue() => {
                log::debug!("{}: cid {cid}: opcode {:#04x} as a fused second command", self.peer, sqe.opcode);
                Outcome::status(cid, Status::INVALID_FIELD.dnr())
            }
            FUSE_SECOND => {
                log::debug!("{}: cid {cid}: fused Write with no Compare before it", self.peer);
                Outcome::status(cid, Status::ABORTED_MISSING_FUSED)
            }
            _ => {
                log::debug!("{}: cid {cid}: reserved FUSE value 11b", self.peer);
                Outcome::status(cid, Status::INVALID_FIELD.dnr())
            }
        }
    }

    /// Whether `cid` is a half of the held fused pair.
    pub(crate) fn is_fused_half(&self, cid: u16) -> bool {
        self.fused
            .as_ref()
            .is_some_and(|f| f.cid == cid || matches!(f.second, Second::Arrived { cid: second, .. } if second == cid))
    }

    /// What the execution of a fused half gave: a checked half is held
    /// (its data copied) until the pair is complete; a half that failed
    /// its checks completes with its status, and its partner with Failed
    /// Fused Command.
    pub(crate) fn fused_half<B: AsRef<[u8]>>(&mut self, cid: u16, out: Outcome<B, D>) -> Outcome<B, D> {
        let Some(first) = self.fused.as_mut() else { return out };
        let is_first = first.cid == cid;
        match out {
            Outcome::NeedData { len, .. } => return Outcome::NeedData { len, discard: false },
            Outcome::Io(BlockRequest { nsid, device, op: BlockOp::Compare { data, .. }, busy, .. }) if is_first => {
                first.target = Some((nsid, device, busy));
                first.expected = Some(data.as_ref().to_vec());
            }
            Outcome::Io(BlockRequest { op: BlockOp::Write { data, fua, .. }, .. }) if !is_first => {
                first.second = Second::Arrived { cid, data: Some(data.as_ref().to_vec()), fua };
            }
            other => {
                // The half failed its checks: its partner is aborted.
                self.fused_half_failed(cid);
                return other;
            }
        }
        self.settle_fused()
    }

    /// Half `cid` of the held pair failed (its checks, or its data never
    /// came): the other half completes with Failed Fused Command. A Write
    /// whose data is still on its way is aborted when it arrives
    /// ([`Queue::data_arrived`] finds no pair for it).
    pub(crate) fn fused_half_failed(&mut self, cid: u16) {
        let Some(first) = self.fused.as_mut() else { return };
        if first.cid == cid {
            // Its Write has not come yet: the next command, if it is that
            // Write, is aborted as it arrives.
            self.fused_first_failed = matches!(first.second, Second::Awaited);
            if let Some(First { second: Second::Arrived { cid: partner, data: Some(_), .. }, .. }) = self.fused.take() {
                self.fused_done.push(Cqe::new(partner, Status::ABORTED_FAILED_FUSED, 0));
            }
        } else if matches!(first.second, Second::Arrived { cid: second, .. } if second == cid) {
            first.second = Second::Failed;
            let _: Outcome<Vec<u8>, D> = self.settle_fused();
        }
    }

    /// The command `sqe` took its place in the queue but never reached it
    /// ([`Queue::command_lost`]). A Compare waiting for the command after
    /// it ends as if it had run, Failed Fused Command if it was its Write;
    /// a fused Compare lost so makes its Write fail with it.
    pub(crate) fn fused_command_lost(&mut self, sqe: &Sqe) {
        if !self.fused_path(sqe) {
            return;
        }
        self.fused_first_failed = fuse(sqe) == FUSE_FIRST && self.is_io_queue();
        let Some(first) = self.fused.as_mut() else { return };
        if !matches!(first.second, Second::Awaited) {
            return;
        }
        first.second = if partners(&first.sqe, sqe) {
            Second::Failed
        } else if fused_write(sqe) {
            Second::Mismatched
        } else {
            Second::Missing
        };
        let _: Outcome<Vec<u8>, D> = self.settle_fused();
    }

    /// Ends the held pair whose Compare was checked against a namespace
    /// that has since been removed, while its Write has not come: the pair
    /// can no longer run, and it would hold the namespace (which its
    /// removal waits for) until the host's next command. The Compare
    /// completes with Missing Fused Command ([`Queue::poll_completion`]).
    /// Called when the queue's namespace cache was refilled.
    pub(crate) fn end_fused_of_removed(&mut self) {
        let Some(first) = self.fused.as_ref() else { return };
        if !matches!(first.second, Second::Awaited) || self.fused_namespace_current() {
            return;
        }
        log::debug!("{}: fused Compare cid {} on a removed namespace: ended", self.peer, first.cid);
        if let Some(first) = self.fused.as_mut() {
            first.second = Second::Missing;
        }
        let _: Outcome<Vec<u8>, D> = self.settle_fused();
    }

    /// Whether the held pair's Compare, once checked, was checked against
    /// the namespace the queue's cache holds under its NSID now (true
    /// before it was checked).
    fn fused_namespace_current(&self) -> bool {
        let Some((nsid, _, held)) = self.fused.as_ref().and_then(|f| f.target.as_ref()) else { return true };
        let checked = held.namespace();
        let current = self.ns_cache.get(*nsid as usize).and_then(Option::as_ref);
        current.is_some_and(|(ns, _)| {
            let ns: &crate::Namespace<D> = ns;
            std::ptr::eq(ns, checked)
        })
    }

    /// Runs or ends the held pair when it can: both halves' data in →
    /// the block request; a first half whose partner went missing or
    /// failed → its completion, once its own data is in.
    fn settle_fused<B>(&mut self) -> Outcome<B, D> {
        let current = self.fused_namespace_current();
        let Some(first) = self.fused.as_mut() else { return Outcome::Deferred };
        if first.expected.is_none() {
            return Outcome::Deferred;
        }
        let status = match &mut first.second {
            Second::Awaited | Second::Arrived { data: None, .. } => return Outcome::Deferred,
            Second::Missing => Status::ABORTED_MISSING_FUSED,
            Second::Mismatched => Status::INVALID_FIELD.dnr(),
            Second::Failed => Status::ABORTED_FAILED_FUSED,
            Second::Arrived { cid, data: Some(_), fua } => {
                let (write_cid, fua) = (*cid, *fua);
                if !current {
                    // The Compare's namespace was removed (and its NSID
                    // perhaps given to another) since it was checked: the
                    // pair must not run on the old device.
                    let compare = first.cid;
                    log::debug!("{}: fused pair cid {compare}/{write_cid}: its namespace was removed", self.peer);
                    self.fused = None;
                    self.fused_done.push(Cqe::new(compare, Status::INVALID_NAMESPACE.dnr(), 0));
                    return Outcome::status(write_cid, Status::ABORTED_FAILED_FUSED);
                }
                let Some(first) = self.fused.take() else { return Outcome::Deferred };
                let (Some((nsid, device, busy)), Some(expected), Second::Arrived { data: Some(data), .. }) =
                    (first.target, first.expected, first.second)
                else {
                    return Outcome::Deferred;
                };
                return Outcome::Io(BlockRequest {
                    cid: write_cid,
                    nsid,
                    device,
                    op: BlockOp::CompareAndWrite { compare_cid: first.cid, lba: first.sqe.slba(), expected, data, fua },
                    busy,
                });
            }
        };
        let cid = first.cid;
        self.fused = None;
        self.fused_done.push(Cqe::new(cid, status, 0));
        Outcome::Deferred
    }

    /// A completion the queue produced besides the one its last call
    /// returned (a fused half aborted because of its partner): the
    /// transport sends each, after that call's outcome.
    pub fn poll_completion(&mut self) -> Option<Cqe> {
        self.fused_done.pop()
    }

    /// Whether this is an I/O queue (fused commands are NVM commands).
    fn is_io_queue(&self) -> bool {
        matches!(self.kind, crate::queue::QueueKind::Io(..))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuse_is_the_low_two_bits_of_the_flags_byte() {
        let mut s = Sqe { flags: 0x41, ..Default::default() };
        assert_eq!(fuse(&s), FUSE_FIRST);
        s.flags = 0x02;
        assert_eq!(fuse(&s), FUSE_SECOND);
    }
}
