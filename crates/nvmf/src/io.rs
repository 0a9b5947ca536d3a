//! NVM command set I/O commands: parse and check, then hand the reactor a
//! [`BlockRequest`]. Range checks use the device's one checked range test;
//! device errors map to NVMe status in [`io_error_status`] only.

use crate::controller::Controller;
use crate::limits;
use crate::model::Held;
use crate::queue::{Outcome, Queue};
use block::BlockDevice;
use nvme_spec::opcode::Io;
use nvme_spec::{Sqe, Status};
use std::rc::Rc;
use std::sync::Arc;

/// A queue's own handle on a namespace's device. The device is shared by
/// every reactor as an `Arc`, whose count is an atomic on a cache line
/// they all touch; a request carries a clone of the queue's `Rc` of it
/// instead, counted on this thread alone (see the queue's namespace
/// cache, refreshed when the subsystem's namespaces change).
pub type DeviceRef<D> = Rc<Arc<D>>;

/// A queue's own handle on a namespace, for the same reason: its cache
/// holds one, and each block request made of it a clone.
pub(crate) type NamespaceRef<D> = Rc<Held<D>>;

/// A namespace in a queue's cache, with the queue's handle on its device.
pub(crate) type CachedNamespace<D> = (NamespaceRef<D>, DeviceRef<D>);

/// A block request's hold on its namespace, through the queue's: a
/// removal waits until the queue's cache and every such request let go
/// ([`crate::Namespace::holders`]). Keep it until the request's I/O is over.
pub struct InFlight<D>(NamespaceRef<D>);

impl<D> InFlight<D> {
    /// The namespace held.
    pub(crate) fn namespace(&self) -> &crate::Namespace<D> {
        &self.0
    }
}

impl<D> std::fmt::Debug for InFlight<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight").field("nsid", &self.0.nsid).finish()
    }
}

/// A storage operation for the reactor to run.
#[derive(Debug)]
pub struct BlockRequest<B, D> {
    /// Command identifier to complete.
    pub cid: u16,
    /// The namespace the command addressed (for per-namespace figures).
    pub nsid: u32,
    /// The device.
    pub device: DeviceRef<D>,
    /// What to do.
    pub op: BlockOp<B>,
    /// The request's count on its namespace: drop it once the I/O is over.
    pub busy: InFlight<D>,
}

/// The storage operations NVMe commands turn into.
#[derive(Debug)]
pub enum BlockOp<B> {
    /// Read `len_bytes` at `lba` and send them to the host.
    Read {
        /// Starting LBA.
        lba: u64,
        /// Bytes to read.
        len_bytes: u32,
    },
    /// Write `data` at `lba`; `fua` makes it durable before completion.
    Write {
        /// Starting LBA.
        lba: u64,
        /// The data.
        data: B,
        /// Force Unit Access.
        fua: bool,
    },
    /// Make all completed writes durable.
    Flush,
    /// Zero `blocks` at `lba`, deallocating them when allowed.
    WriteZeroes {
        /// Starting LBA.
        lba: u64,
        /// Block count.
        blocks: u64,
        /// Deallocate (DEAC).
        deallocate: bool,
        /// Durable before completion (FUA, or the host turned the volatile
        /// write cache off): the executor flushes the device after it.
        fua: bool,
    },
    /// Deallocate each `(lba, blocks)` range.
    Deallocate {
        /// Ranges.
        ranges: Vec<(u64, u64)>,
        /// Durable before completion (the host turned the volatile write
        /// cache off): the executor flushes the device after it.
        fua: bool,
    },
    /// Read at `lba` and compare with `data`: Compare Failure on mismatch.
    Compare {
        /// Starting LBA.
        lba: u64,
        /// Expected data.
        data: B,
    },
    /// A fused Compare and Write, atomic against every other write to the
    /// blocks: compare them with `expected` and, if equal, write `data`.
    /// The request's `cid` is the Write's; on a mismatch the Compare
    /// completes with Compare Failure and the Write with Command Aborted
    /// due to Failed Fused Command.
    CompareAndWrite {
        /// Command identifier of the Compare (the first half).
        compare_cid: u16,
        /// Starting LBA.
        lba: u64,
        /// The Compare's data.
        expected: Vec<u8>,
        /// The Write's data (the same length).
        data: Vec<u8>,
        /// Force Unit Access on the write.
        fua: bool,
    },
}

impl<B, D> BlockRequest<B, D> {
    /// The same request with its data buffer turned into another type.
    pub fn map_data<C>(self, f: impl FnOnce(B) -> C) -> BlockRequest<C, D> {
        let BlockRequest { cid, nsid, device, op, busy } = self;
        let op = match op {
            BlockOp::Read { lba, len_bytes } => BlockOp::Read { lba, len_bytes },
            BlockOp::Write { lba, data, fua } => BlockOp::Write { lba, data: f(data), fua },
            BlockOp::Flush => BlockOp::Flush,
            BlockOp::WriteZeroes { lba, blocks, deallocate, fua } => {
                BlockOp::WriteZeroes { lba, blocks, deallocate, fua }
            }
            BlockOp::Deallocate { ranges, fua } => BlockOp::Deallocate { ranges, fua },
            BlockOp::Compare { lba, data } => BlockOp::Compare { lba, data: f(data) },
            BlockOp::CompareAndWrite { compare_cid, lba, expected, data, fua } => {
                BlockOp::CompareAndWrite { compare_cid, lba, expected, data, fua }
            }
        };
        BlockRequest { cid, nsid, device, op, busy }
    }
}

/// The NVMe status for a failed device operation (`write` tells a failed
/// write from a failed read).
pub fn io_error_status(err: &block::Error, write: bool) -> Status {
    match err {
        block::Error::OutOfRange { .. } => Status::LBA_OUT_OF_RANGE.dnr(),
        block::Error::Misaligned { .. } => Status::INVALID_FIELD.dnr(),
        block::Error::Unsupported(_) => Status::INVALID_FIELD.dnr(),
        // A backend that did not answer in time (an rbd image whose OSD is
        // down): nothing is wrong with the data, so Namespace Not Ready
        // without DNR tells the host to retry (NVMe base 2.0 4.2.3.1).
        block::Error::Io(e) if e.kind() == std::io::ErrorKind::TimedOut => Status::NAMESPACE_NOT_READY,
        // The backing is out of space (a sparse file on a full file
        // system): Capacity Exceeded (81h, the NVM Command Set's generic
        // status), which hosts report as ENOSPC (Linux: BLK_STS_NOSPC);
        // with DNR, as nvmet answers ENOSPC, they do not retry into the
        // same full backing. Write Fault would be retried, then reported
        // as a medium error. SCSI says SPACE ALLOCATION FAILED. A full
        // quota is the same ([`block::Error::out_of_space`]).
        e if write && e.out_of_space() => Status::CAPACITY_EXCEEDED.dnr(),
        _ if write => Status::WRITE_FAULT,
        _ => Status::UNRECOVERED_READ,
    }
}

impl<D: BlockDevice> Queue<D> {
    /// The namespace `nsid` in the queue's cache (refreshed when the
    /// subsystem's namespaces changed) with the queue's handle on its
    /// device, lent: cloning the namespace's `Arc` would be an atomic add
    /// and subtract per command.
    fn namespace(&mut self, ctrl: &Controller<D>, nsid: u32) -> Option<&CachedNamespace<D>> {
        // The subsystem is looked up once per queue, not upgraded from the
        // controller's weak reference on every command.
        if self.ns_subsys.is_none() {
            self.ns_subsys = ctrl.subsystem();
        }
        self.refresh_namespaces();
        self.ns_cache.get(nsid as usize)?.as_ref()
    }

    /// Catches the queue's namespace cache up with its subsystem, when
    /// the namespaces changed: one atomic load when they did not. The
    /// driver calls it when rung after a namespace was removed, so that a
    /// queue with no command to send lets go of the removed namespace and
    /// its device. (A queue whose controller is gone closes at its next
    /// tick, [`Queue::expired`].)
    #[inline]
    pub fn refresh_namespaces(&mut self) {
        let Some(subsys) = self.ns_subsys.as_ref() else { return };
        let gen = subsys.ns_generation();
        if gen != self.ns_cache_gen {
            self.fill_ns_cache(gen);
        }
    }

    /// Fills the namespace cache from the subsystem, at generation `gen`.
    #[cold]
    fn fill_ns_cache(&mut self, gen: u64) {
        let Some(subsys) = self.ns_subsys.clone() else { return };
        self.ns_cache.clear();
        for ns in subsys.namespaces_held() {
            let idx = ns.nsid as usize;
            if idx >= self.ns_cache.len() {
                self.ns_cache.resize(idx.saturating_add(1), None);
            }
            if let Some(slot) = self.ns_cache.get_mut(idx) {
                let device = Rc::new(ns.device.clone());
                *slot = Some((Rc::new(ns), device));
            }
        }
        self.ns_cache_gen = gen;
        self.end_fused_of_removed();
    }

    pub(crate) fn io<B: AsRef<[u8]>>(
        &mut self,
        ctrl: &Controller<D>,
        sqe: &Sqe,
        sgl_len: u32,
        data: Option<B>,
    ) -> Outcome<B, D> {
        let cid = sqe.cid.get();
        if !ctrl.enabled() {
            return Outcome::status(cid, Status::COMMAND_SEQUENCE_ERROR.dnr());
        }
        let nsid = sqe.nsid.get();
        // The queue's handle on the device is cloned for the request: a
        // count on this thread, no atomic.
        let (ns, device, ana) = match self.namespace(ctrl, nsid) {
            Some((ns, device)) => (ns.clone(), device.clone(), ns.ana_state().io_status()),
            None => {
                log::debug!("{}: I/O opcode {:#04x} to inactive nsid {nsid}", self.peer, sqe.opcode);
                return Outcome::status(cid, Status::INVALID_NAMESPACE.dnr());
            }
        };
        if let Some(status) = ana {
            return self.reject(cid, sqe, status);
        }
        if device.read_only() && writes(sqe) {
            return self.reject(cid, sqe, Status::NS_WRITE_PROTECTED.dnr());
        }
        let geo = device.geometry();
        let max_transfer = self.target.settings.max_transfer;
        // Read, Write and Compare move (NLB+1) blocks; the SGL must say so.
        let transfer = |blocks: u32| -> Result<u32, Status> {
            let len = u64::from(blocks) * u64::from(geo.block_size);
            if device.check_range(sqe.slba(), u64::from(blocks)).is_err() {
                return Err(Status::LBA_OUT_OF_RANGE.dnr());
            }
            if len > u64::from(max_transfer) {
                return Err(Status::INVALID_FIELD.dnr());
            }
            if u64::from(sgl_len) != len {
                return Err(Status::SGL_DATA_LENGTH_INVALID.dnr());
            }
            Ok(sgl_len)
        };
        let op = match Io(sqe.opcode) {
            Io::READ => match transfer(sqe.blocks()) {
                Ok(len_bytes) => BlockOp::Read { lba: sqe.slba(), len_bytes },
                Err(s) => return self.reject(cid, sqe, s),
            },
            Io::WRITE | Io::COMPARE => match (transfer(sqe.blocks()), data) {
                (Err(s), _) => return self.reject(cid, sqe, s),
                (Ok(len), None) => {
                    return Outcome::NeedData {
                        len,
                        discard: Io(sqe.opcode) == Io::WRITE
                            && crate::fused::fuse(sqe) == 0
                            && device.discards_writes(),
                    }
                }
                (Ok(_), Some(data)) if Io(sqe.opcode) == Io::WRITE => {
                    let fua = sqe.fua() || (ctrl.write_through() && device.volatile_write_cache());
                    BlockOp::Write { lba: sqe.slba(), data, fua }
                }
                (Ok(_), Some(data)) => BlockOp::Compare { lba: sqe.slba(), data },
            },
            Io::FLUSH => BlockOp::Flush,
            Io::WRITE_ZEROES => {
                let blocks = u64::from(sqe.blocks());
                if let Err(why) = limits::check_write_zeroes(blocks, geo.block_size) {
                    log::warn!("{}: cid {cid} nsid {nsid}: {why}", self.peer);
                    return self.reject(cid, sqe, limits::EXCEEDED);
                }
                if device.check_range(sqe.slba(), blocks).is_err() {
                    return self.reject(cid, sqe, Status::LBA_OUT_OF_RANGE.dnr());
                }
                let deallocate = sqe.cdw12.get() & (1 << 25) != 0;
                let fua = sqe.fua() || (ctrl.write_through() && device.volatile_write_cache());
                BlockOp::WriteZeroes { lba: sqe.slba(), blocks, deallocate, fua }
            }
            Io::DATASET_MANAGEMENT => {
                // NR is 0-based. The data must hold every range; it may
                // be longer (as nvmet, which refuses only a shorter one:
                // a range missing from it was never described).
                let ranges = (sqe.cdw10.get() & 0xff) + 1;
                if !(ranges * 16..=4096).contains(&sgl_len) || !sgl_len.is_multiple_of(16) {
                    log::debug!("{}: DSM nr {ranges} with {sgl_len} data bytes", self.peer);
                    return self.reject(cid, sqe, Status::SGL_DATA_LENGTH_INVALID.dnr());
                }
                let Some(data) = data else {
                    return Outcome::NeedData { len: sgl_len, discard: false };
                };
                let ranges = ranges as usize;
                // Only the Attribute Deallocate hint does anything here.
                if sqe.cdw11.get() & (1 << 2) == 0 {
                    return Outcome::status(cid, Status::SUCCESS);
                }
                // The size limits first, over every range, so a command
                // past them is told so whatever its LBAs.
                let mut list = Vec::with_capacity(ranges.min(limits::DMRL));
                let mut total = 0u64;
                for (index, r) in data.as_ref().chunks_exact(16).take(ranges).enumerate() {
                    let mut nlb = [0u8; 4];
                    let mut slba = [0u8; 8];
                    nlb.copy_from_slice(r.get(4..8).unwrap_or(&[0; 4]));
                    slba.copy_from_slice(r.get(8..16).unwrap_or(&[0; 8]));
                    let (slba, nlb) = (u64::from_le_bytes(slba), u64::from(u32::from_le_bytes(nlb)));
                    total = match limits::check_dsm_range(index, nlb, total) {
                        Ok(total) => total,
                        Err(why) => {
                            log::warn!("{}: cid {cid} nsid {nsid}: {why}", self.peer);
                            return self.reject(cid, sqe, limits::EXCEEDED);
                        }
                    };
                    if nlb != 0 {
                        list.push((slba, nlb));
                    }
                }
                if list.iter().any(|&(slba, nlb)| device.check_range(slba, nlb).is_err()) {
                    return self.reject(cid, sqe, Status::LBA_OUT_OF_RANGE.dnr());
                }
                BlockOp::Deallocate { ranges: list, fua: ctrl.write_through() && device.volatile_write_cache() }
            }
            _ => return self.reject(cid, sqe, Status::INVALID_OPCODE.dnr()),
        };
        // The namespace is held until the request is over.
        Outcome::Io(BlockRequest { cid, nsid, device, op, busy: InFlight(ns) })
    }

    fn reject<B>(&self, cid: u16, sqe: &Sqe, status: Status) -> Outcome<B, D> {
        log::debug!(
            "{}: I/O opcode {:#04x} cid {cid} nsid {} slba {} nlb {}: {status}",
            self.peer,
            sqe.opcode,
            sqe.nsid.get(),
            sqe.slba(),
            sqe.cdw12.get() & 0xffff
        );
        Outcome::status(cid, status)
    }
}

/// Whether `sqe` would write its namespace: Write, Write Zeroes, and
/// Dataset Management with the Attribute Deallocate hint.
fn writes(sqe: &Sqe) -> bool {
    match Io(sqe.opcode) {
        Io::WRITE | Io::WRITE_ZEROES => true,
        Io::DATASET_MANAGEMENT => sqe.cdw11.get() & (1 << 2) != 0,
        _ => false,
    }
}
