//! An NVMe-oF controller as the host sees it: the admin queue, the I/O
//! queues, and the bring-up sequence a host runs (NVMe-oF 1.1 section 3.5,
//! NVMe Base 2.0 section 3.5.1): Connect, read CAP/VS, enable through CC,
//! wait for CSTS.RDY, Identify, ask for I/O queues, connect them.

use crate::cmd;
use crate::queue::{Queue, QueueOptions, Transport};
use crate::{Error, Result};
use nvme_spec::fabrics::{ConnectCmd, ConnectData};
use nvme_spec::identify::{ctrl as ic, ns as ins, LEN as IDENTIFY_LEN};
use nvme_spec::opcode::Cns;
use nvme_spec::regs::{self, csts};
use nvmf_tcp::host::Completion;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use zerocopy::IntoBytes;

/// How to create a controller.
#[derive(Clone, Debug)]
pub struct Options {
    /// The transport every queue connects over.
    pub transport: Transport,
    /// I/O queues to connect.
    pub io_queues: u16,
    /// Entries per I/O queue; at most `queue_size - 1` commands are
    /// outstanding on each.
    pub queue_size: u16,
    /// Entries of the admin queue.
    pub admin_queue_size: u16,
    /// Keep-alive timeout in milliseconds; 0 asks for no keep-alive timer.
    /// With a timer, the caller must call [`Controller::keep_alive`] often
    /// enough.
    pub kato_ms: u32,
    /// Header digests on every queue.
    pub header_digest: bool,
    /// Data digests on every queue.
    pub data_digest: bool,
    /// Host identifier; `None` derives one from the host NQN so every
    /// controller of the same host carries the same ID.
    pub hostid: Option<[u8; 16]>,
    /// Ask every queue's Connect to disable SQ flow control (nvme-cli's
    /// `--disable-sqflow`): completions then carry no SQ head, and an
    /// NVMe/TCP controller may end a read with its last C2HData PDU (SUCCESS
    /// flag) instead of a response capsule.
    pub disable_sq_flow: bool,
    /// Bound on every network wait.
    pub timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            transport: Transport::Tcp,
            io_queues: 1,
            queue_size: 128,
            admin_queue_size: 32,
            kato_ms: 0,
            header_digest: false,
            data_digest: false,
            hostid: None,
            disable_sq_flow: false,
            timeout: Duration::from_secs(10),
        }
    }
}

/// The fields of Identify Controller this host uses, plus the raw page.
#[derive(Clone, Debug)]
pub struct IdentifyController {
    /// Serial number, trimmed.
    pub serial: String,
    /// Model number, trimmed.
    pub model: String,
    /// Firmware revision, trimmed.
    pub firmware: String,
    /// Controller ID.
    pub cntlid: u16,
    /// Largest transfer in bytes (MDTS with 4 KiB pages); `None` = no limit.
    pub max_transfer: Option<u32>,
    /// Number of namespaces (NN).
    pub nn: u32,
    /// Optional NVM command support (ONCS).
    pub oncs: u16,
    /// Controller type (1 I/O, 2 discovery).
    pub cntrltype: u8,
    /// Keep-alive granularity in 100 ms units (KAS).
    pub kas: u16,
    /// Subsystem NQN.
    pub subnqn: String,
    /// I/O command capsule size in 16-byte units (IOCCSZ).
    pub ioccsz: u32,
    /// I/O response capsule size in 16-byte units (IORCSZ).
    pub iorcsz: u32,
    /// The 4096-byte page.
    pub raw: Vec<u8>,
}

fn le_u16(b: &[u8], off: usize) -> u16 {
    let mut a = [0; 2];
    if let Some(s) = b.get(off..off + 2) {
        a.copy_from_slice(s);
    }
    u16::from_le_bytes(a)
}

fn le_u32(b: &[u8], off: usize) -> u32 {
    let mut a = [0; 4];
    if let Some(s) = b.get(off..off + 4) {
        a.copy_from_slice(s);
    }
    u32::from_le_bytes(a)
}

pub(crate) fn le_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0; 8];
    if let Some(s) = b.get(off..off + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

/// An ASCII field, cut at the first NUL and trimmed of padding spaces.
pub(crate) fn ascii(b: &[u8], off: usize, len: usize) -> String {
    let f = b.get(off..off + len).unwrap_or_default();
    let end = f.iter().position(|&c| c == 0).unwrap_or(f.len());
    String::from_utf8_lossy(f.get(..end).unwrap_or_default()).trim().to_string()
}

impl IdentifyController {
    /// Parses an Identify Controller page.
    pub fn parse(raw: Vec<u8>) -> Self {
        let b = &raw;
        let mdts = b.get(ic::MDTS).copied().unwrap_or(0);
        IdentifyController {
            serial: ascii(b, ic::SN, 20),
            model: ascii(b, ic::MN, 40),
            firmware: ascii(b, ic::FR, 8),
            cntlid: le_u16(b, ic::CNTLID),
            max_transfer: (mdts != 0).then(|| 4096u32.checked_shl(u32::from(mdts)).unwrap_or(u32::MAX)),
            nn: le_u32(b, ic::NN),
            oncs: le_u16(b, ic::ONCS),
            cntrltype: b.get(ic::CNTRLTYPE).copied().unwrap_or(0),
            kas: le_u16(b, ic::KAS),
            subnqn: ascii(b, ic::SUBNQN, 256),
            ioccsz: le_u32(b, ic::IOCCSZ),
            iorcsz: le_u32(b, ic::IORCSZ),
            raw,
        }
    }

    /// In-capsule data accepted on I/O queues, in bytes.
    pub fn io_in_capsule(&self) -> u32 {
        self.ioccsz.saturating_mul(16).saturating_sub(64)
    }
}

/// The fields of Identify Namespace this host uses, plus the raw page.
#[derive(Clone, Debug)]
pub struct NamespaceInfo {
    /// Namespace ID.
    pub nsid: u32,
    /// Size in blocks (NSZE).
    pub blocks: u64,
    /// Capacity in blocks (NCAP).
    pub capacity: u64,
    /// Logical block size in bytes, from the formatted LBA format.
    pub block_size: u32,
    /// The 4096-byte page.
    pub raw: Vec<u8>,
}

impl NamespaceInfo {
    /// Parses an Identify Namespace page; `None` when it is all zeroes (an
    /// inactive NSID).
    pub fn parse(nsid: u32, raw: Vec<u8>) -> Option<Self> {
        let blocks = le_u64(&raw, ins::NSZE);
        if blocks == 0 {
            return None;
        }
        let flbas = raw.get(ins::FLBAS).copied().unwrap_or(0) & 0xf;
        let lbaf = le_u32(&raw, ins::LBAF0 + usize::from(flbas) * 4);
        let lbads = (lbaf >> 16) & 0xff;
        Some(NamespaceInfo {
            nsid,
            blocks,
            capacity: le_u64(&raw, ins::NCAP),
            block_size: 1u32.checked_shl(lbads).unwrap_or(0),
            raw,
        })
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.blocks.saturating_mul(u64::from(self.block_size))
    }
}

/// A 16-byte host identifier derived from the host NQN (FNV-1a, twice).
pub fn hostid_for(hostnqn: &str) -> [u8; 16] {
    let h = |seed: u64| hostnqn.bytes().fold(seed, |a, b| (a ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&h(0xcbf2_9ce4_8422_2325).to_le_bytes());
    id[8..].copy_from_slice(&h(0x8422_2325_cbf2_9ce4).to_le_bytes());
    id
}

/// Who connects to what.
pub(crate) struct Host<'a> {
    pub hostid: [u8; 16],
    pub subnqn: &'a str,
    pub hostnqn: &'a str,
}

/// Connects `queue` to `subnqn` as queue `qid` of controller `cntlid`
/// (0xffff for a new controller on the admin queue) with Connect
/// Attributes `cattr`; returns the CNTLID.
pub(crate) async fn fabrics_connect(
    queue: &mut Queue,
    host: &Host<'_>,
    qid: u16,
    queue_size: u16,
    kato_ms: u32,
    cntlid: u16,
    cattr: u8,
) -> Result<u16> {
    let data = ConnectData::new(host.hostid, cntlid, host.subnqn, host.hostnqn);
    let sqsize = queue_size.saturating_sub(1).max(1);
    let c = queue.execute(cmd::connect(qid, sqsize, kato_ms, cattr), data.as_bytes().to_vec(), 0).await?;
    queue.set_depth(usize::from(sqsize));
    Ok(c.cqe.dw0.get() as u16)
}

/// Enables the controller behind an admin queue: CAP, VS, CC.EN, CSTS.RDY.
/// Returns CAP and VS.
pub(crate) async fn enable(admin: &mut Queue) -> Result<(u64, u32)> {
    let cap = admin.execute(cmd::property_get(regs::CAP, true), Vec::new(), 0).await?.cqe.result_u64();
    let vs = admin.execute(cmd::property_get(regs::VS, false), Vec::new(), 0).await?.cqe.dw0.get();
    // IOSQES 6 (64-byte SQEs), IOCQES 4 (16-byte CQEs), NVM command set,
    // 4 KiB pages, enable.
    let cc = (6 << 16) | (4 << 20) | 1;
    admin.execute(cmd::property_set(regs::CC, cc), Vec::new(), 0).await?;
    // CAP.TO is the worst case in 500 ms units; bound it by our own timeout.
    let to = Duration::from_millis(((cap >> 24) & 0xff).max(1) * 500).min(admin.timeout());
    let start = Instant::now();
    loop {
        let v = admin.execute(cmd::property_get(regs::CSTS, false), Vec::new(), 0).await?.cqe.dw0.get();
        if v & csts::CFS != 0 {
            return Err(Error::Protocol("CSTS.CFS set while enabling".into()));
        }
        if v & csts::RDY != 0 {
            return Ok((cap, vs));
        }
        if start.elapsed() > to {
            return Err(Error::Timeout { what: "CSTS.RDY", after: to });
        }
        reactor::sleep(Duration::from_millis(10)).await;
    }
}

/// An NVMe-oF controller: one admin queue and its I/O queues.
pub struct Controller {
    admin: Queue,
    io: Vec<Queue>,
    cntlid: u16,
    cap: u64,
    vs: u32,
    ident: IdentifyController,
    namespaces: HashMap<u32, NamespaceInfo>,
    subnqn: String,
    hostnqn: String,
}

impl Controller {
    /// Creates a controller on `subnqn` at `addr` and connects
    /// `opts.io_queues` I/O queues to it.
    pub async fn connect(addr: SocketAddr, subnqn: &str, hostnqn: &str, opts: Options) -> Result<Controller> {
        let qopts = QueueOptions {
            transport: opts.transport,
            qid: 0,
            entries: opts.admin_queue_size,
            header_digest: opts.header_digest,
            data_digest: opts.data_digest,
            max_in_capsule: 8192,
            timeout: opts.timeout,
        };
        let host = Host { hostid: opts.hostid.unwrap_or_else(|| hostid_for(hostnqn)), subnqn, hostnqn };
        let cattr = if opts.disable_sq_flow { ConnectCmd::CATTR_DISABLE_SQ_FLOW } else { 0 };
        let mut admin = Queue::connect(addr, qopts).await?;
        let cntlid = fabrics_connect(&mut admin, &host, 0, opts.admin_queue_size, opts.kato_ms, 0xffff, cattr).await?;
        let (cap, vs) = enable(&mut admin).await?;
        let raw = admin.execute(cmd::identify(Cns::CONTROLLER, 0), Vec::new(), IDENTIFY_LEN as u32).await?.data;
        let ident = IdentifyController::parse(raw);
        if ident.cntlid != cntlid {
            return Err(Error::Protocol(format!(
                "Identify Controller CNTLID {} (Connect returned {cntlid})",
                ident.cntlid
            )));
        }
        let mut ctrl = Controller {
            admin,
            io: Vec::new(),
            cntlid,
            cap,
            vs,
            ident,
            namespaces: HashMap::new(),
            subnqn: subnqn.to_string(),
            hostnqn: hostnqn.to_string(),
        };
        if opts.io_queues == 0 {
            return Ok(ctrl);
        }
        let granted = ctrl.admin.execute(cmd::number_of_queues(opts.io_queues), Vec::new(), 0).await?.cqe.dw0.get();
        // Both counts come back 0-based; use the smaller.
        let n = ((granted & 0xffff).min(granted >> 16) + 1).min(u32::from(opts.io_queues));
        let io_opts = QueueOptions { max_in_capsule: ctrl.ident.io_in_capsule(), entries: opts.queue_size, ..qopts };
        for qid in 1..=n as u16 {
            let mut q = Queue::connect(addr, QueueOptions { qid, ..io_opts }).await?;
            fabrics_connect(&mut q, &host, qid, opts.queue_size, 0, cntlid, cattr).await?;
            ctrl.io.push(q);
        }
        Ok(ctrl)
    }

    /// The controller ID.
    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }

    /// CAP as read at bring-up.
    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// VS as read at bring-up.
    pub fn version(&self) -> u32 {
        self.vs
    }

    /// The subsystem NQN.
    pub fn subnqn(&self) -> &str {
        &self.subnqn
    }

    /// The host NQN.
    pub fn hostnqn(&self) -> &str {
        &self.hostnqn
    }

    /// Identify Controller as read at bring-up.
    pub fn identity(&self) -> &IdentifyController {
        &self.ident
    }

    /// The admin queue.
    pub fn admin(&mut self) -> &mut Queue {
        &mut self.admin
    }

    /// Number of I/O queues connected.
    pub fn io_queue_count(&self) -> usize {
        self.io.len()
    }

    /// I/O queue `q` (0-based index; its QID is `q + 1`).
    pub fn io_queue(&mut self, q: usize) -> Result<&mut Queue> {
        let n = self.io.len();
        self.io.get_mut(q).ok_or_else(|| Error::Invalid(format!("I/O queue {q} (have {n})")))
    }

    /// Takes the I/O queues out, e.g. to drive each from its own task; the
    /// controller keeps its admin queue.
    pub fn take_io_queues(&mut self) -> Vec<Queue> {
        std::mem::take(&mut self.io)
    }

    /// Runs an admin command and returns its completion (non-success
    /// status is an error).
    pub async fn admin_command(&mut self, sqe: nvme_spec::Sqe, write: Vec<u8>, read_len: u32) -> Result<Completion> {
        self.admin.execute(sqe, write, read_len).await
    }

    /// Identify Controller, read again.
    pub async fn identify_controller(&mut self) -> Result<IdentifyController> {
        let raw = self.admin.execute(cmd::identify(Cns::CONTROLLER, 0), Vec::new(), IDENTIFY_LEN as u32).await?.data;
        Ok(IdentifyController::parse(raw))
    }

    /// Identify Namespace; `Error::Status(INVALID_NAMESPACE)` for an NSID
    /// outside the controller's range, `Error::Protocol` for an inactive one.
    pub async fn identify_namespace(&mut self, nsid: u32) -> Result<NamespaceInfo> {
        let raw = self.admin.execute(cmd::identify(Cns::NAMESPACE, nsid), Vec::new(), IDENTIFY_LEN as u32).await?.data;
        let info = NamespaceInfo::parse(nsid, raw)
            .ok_or_else(|| Error::Protocol(format!("namespace {nsid} is not active")))?;
        self.namespaces.insert(nsid, info.clone());
        Ok(info)
    }

    /// The active namespace IDs, ascending.
    pub async fn active_namespaces(&mut self) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        let mut after = 0;
        loop {
            let raw = self
                .admin
                .execute(cmd::identify(Cns::ACTIVE_NAMESPACES, after), Vec::new(), IDENTIFY_LEN as u32)
                .await?
                .data;
            let ids: Vec<u32> = raw.chunks_exact(4).map(|c| le_u32(c, 0)).take_while(|&n| n != 0).collect();
            let full = ids.len() == IDENTIFY_LEN / 4;
            match ids.last() {
                Some(&last) if full => after = last,
                _ => {
                    out.extend(ids);
                    return Ok(out);
                }
            }
            out.extend(ids);
        }
    }

    /// Get Log Page `lid`: `len` bytes (a multiple of 4) from byte `offset`.
    pub async fn get_log_page(&mut self, lid: u8, len: u32, offset: u64) -> Result<Vec<u8>> {
        get_log_page(&mut self.admin, lid, len, offset).await
    }

    /// Keep Alive.
    pub async fn keep_alive(&mut self) -> Result<()> {
        self.admin.execute(cmd::keep_alive(), Vec::new(), 0).await.map(drop)
    }

    async fn ns(&mut self, nsid: u32) -> Result<NamespaceInfo> {
        if let Some(i) = self.namespaces.get(&nsid) {
            return Ok(i.clone());
        }
        self.identify_namespace(nsid).await
    }

    fn check_len(&self, bytes: usize) -> Result<u32> {
        let len = u32::try_from(bytes).map_err(|_| Error::Invalid(format!("{bytes} bytes")))?;
        if let Some(max) = self.ident.max_transfer {
            if len > max {
                return Err(Error::Invalid(format!("{len} bytes exceed the controller's MDTS of {max} bytes")));
            }
        }
        Ok(len)
    }

    /// The block size of `nsid`, from Identify Namespace (cached), or 512
    /// when the namespace cannot be identified (so commands to a missing
    /// namespace still reach the controller and fail there).
    async fn block_size(&mut self, nsid: u32) -> u32 {
        match self.ns(nsid).await {
            Ok(i) => i.block_size,
            Err(_) => 512,
        }
    }

    /// Reads `blocks` from `lba` of `nsid` on I/O queue `q`.
    pub async fn read(&mut self, q: usize, nsid: u32, lba: u64, blocks: u32) -> Result<Vec<u8>> {
        let bs = self.block_size(nsid).await;
        let len = self.check_len(blocks as usize * bs as usize)?;
        let c = self.io_queue(q)?.execute(cmd::read(nsid, lba, blocks), Vec::new(), len).await?;
        if c.data.len() != len as usize {
            return Err(Error::Protocol(format!("read returned {} bytes (expected {len})", c.data.len())));
        }
        Ok(c.data)
    }

    async fn blocks_of(&mut self, nsid: u32, data: &[u8]) -> Result<u32> {
        let bs = self.block_size(nsid).await;
        self.check_len(data.len())?;
        if data.is_empty() || !data.len().is_multiple_of(bs as usize) {
            return Err(Error::Invalid(format!("{} bytes is not a whole number of {bs}-byte blocks", data.len())));
        }
        Ok((data.len() / bs as usize) as u32)
    }

    /// Writes `data` (whole blocks) at `lba` of `nsid` on I/O queue `q`.
    pub async fn write(&mut self, q: usize, nsid: u32, lba: u64, data: Vec<u8>) -> Result<()> {
        let blocks = self.blocks_of(nsid, &data).await?;
        self.io_queue(q)?.execute(cmd::write(nsid, lba, blocks), data, 0).await.map(drop)
    }

    /// Compares `data` with the blocks at `lba`; a mismatch is
    /// `Error::Status(COMPARE_FAILURE)`.
    pub async fn compare(&mut self, q: usize, nsid: u32, lba: u64, data: Vec<u8>) -> Result<()> {
        let blocks = self.blocks_of(nsid, &data).await?;
        self.io_queue(q)?.execute(cmd::compare(nsid, lba, blocks), data, 0).await.map(drop)
    }

    /// Flush.
    pub async fn flush(&mut self, q: usize, nsid: u32) -> Result<()> {
        self.io_queue(q)?.execute(cmd::flush(nsid), Vec::new(), 0).await.map(drop)
    }

    /// Write Zeroes over `blocks` at `lba`.
    pub async fn write_zeroes(&mut self, q: usize, nsid: u32, lba: u64, blocks: u32) -> Result<()> {
        self.io_queue(q)?.execute(cmd::write_zeroes(nsid, lba, blocks, false), Vec::new(), 0).await.map(drop)
    }

    /// Dataset Management Deallocate of `(lba, blocks)` ranges (1..=256).
    pub async fn deallocate(&mut self, q: usize, nsid: u32, ranges: &[(u64, u32)]) -> Result<()> {
        if ranges.is_empty() || ranges.len() > 256 {
            return Err(Error::Invalid(format!("{} ranges (1..=256 allowed)", ranges.len())));
        }
        self.io_queue(q)?.execute(cmd::deallocate(nsid, ranges.len()), cmd::dsm_ranges(ranges), 0).await.map(drop)
    }

    /// Ends the controller: Disconnect on each I/O queue, a normal shutdown
    /// through CC.SHN, then the admin connection is closed.
    pub async fn disconnect(mut self) -> Result<()> {
        for mut q in std::mem::take(&mut self.io) {
            if q.is_failed() {
                continue;
            }
            // The target completes Disconnect and closes; either is fine.
            let _ = q.execute_raw(cmd::disconnect(), Vec::new(), 0).await;
        }
        let cc = (6 << 16) | (4 << 20) | 1 | (1 << 14);
        self.admin.execute(cmd::property_set(regs::CC, cc), Vec::new(), 0).await?;
        let start = Instant::now();
        loop {
            let v = self.admin.execute(cmd::property_get(regs::CSTS, false), Vec::new(), 0).await?.cqe.dw0.get();
            if v & csts::SHST_COMPLETE != 0 {
                break;
            }
            if start.elapsed() > self.admin.timeout() {
                return Err(Error::Timeout { what: "CSTS.SHST complete", after: self.admin.timeout() });
            }
            reactor::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }
}

/// Get Log Page on an admin queue.
pub(crate) async fn get_log_page(admin: &mut Queue, lid: u8, len: u32, offset: u64) -> Result<Vec<u8>> {
    if len == 0 || !len.is_multiple_of(4) || !offset.is_multiple_of(4) {
        return Err(Error::Invalid(format!(
            "log page length {len} and offset {offset} must be non-zero multiples of 4"
        )));
    }
    let c = admin.execute(cmd::get_log_page(lid, len, offset), Vec::new(), len).await?;
    Ok(c.data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme_spec::writer::Page;

    #[test]
    fn identify_controller_reads_fields_at_spec_offsets() {
        let mut p = Page::new(IDENTIFY_LEN);
        p.ascii_space(ic::MN, 40, "ironwire")
            .u8(ic::MDTS, 8)
            .u16(ic::CNTLID, 7)
            .u32(ic::IOCCSZ, (8192 + 64) / 16)
            .ascii_nul(ic::SUBNQN, 256, "nqn.2026-11.x:y");
        let i = IdentifyController::parse(p.into_vec());
        assert_eq!(i.model, "ironwire");
        assert_eq!(i.max_transfer, Some(1 << 20));
        assert_eq!(i.cntlid, 7);
        assert_eq!(i.io_in_capsule(), 8192);
        assert_eq!(i.subnqn, "nqn.2026-11.x:y");
    }

    #[test]
    fn identify_namespace_takes_block_size_from_the_formatted_lbaf() {
        let mut p = Page::new(IDENTIFY_LEN);
        p.u64(ins::NSZE, 1000).u8(ins::FLBAS, 1).u32(ins::LBAF0, 9 << 16).u32(ins::LBAF0 + 4, 12 << 16);
        let n = NamespaceInfo::parse(1, p.into_vec()).expect("active");
        assert_eq!(n.block_size, 4096);
        assert_eq!(n.size_bytes(), 4096 * 1000);
        assert!(NamespaceInfo::parse(2, vec![0; IDENTIFY_LEN]).is_none());
    }

    #[test]
    fn hostid_is_stable_per_host_nqn() {
        assert_eq!(hostid_for("nqn.a"), hostid_for("nqn.a"));
        assert_ne!(hostid_for("nqn.a"), hostid_for("nqn.b"));
    }
}
