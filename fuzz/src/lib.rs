//! Helpers shared by the fuzz targets and the corpus generator: splitting an
//! input into receive chunks, checking that a byte stream is a sequence of
//! well-formed PDUs, a tiny controller behind `TargetConnection`, and the
//! small `nvmf::Target` (with the NVMe/TCP binding's transport descriptor
//! and SGL check) the queue target runs against, and a reader that takes
//! an input apart field by field.
//!
//! Nothing here links libFuzzer, so `cargo run --example gen_corpus` works on
//! a stable toolchain.

use blockdev::Device;
use nvme_spec::fabrics::ConnectData;
use nvme_spec::{Cqe, Sgl, Sqe, Status};
use nvmf_tcp::pdu::{self, Framing};
use nvmf_tcp::target::{Event, TargetConfig, TargetConnection};
use std::net::SocketAddr;
use std::sync::Arc;
use zerocopy::IntoBytes;

/// Takes an input apart front to back; `None` once it runs out.
pub struct Reader<'a>(pub &'a [u8]);

impl<'a> Reader<'a> {
    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }

    /// The next byte.
    pub fn u8(&mut self) -> Option<u8> {
        self.take(1).and_then(|b| b.first().copied())
    }
}

/// Splits `data` into chunks whose lengths come from a small PRNG seeded by
/// `seed`, so one input also chooses where the receive path sees PDU
/// boundaries fall. `max` bounds a chunk (at least 1).
pub fn chunks(data: &[u8], seed: u8, max: usize) -> Vec<&[u8]> {
    let max = max.max(1);
    let mut out = Vec::new();
    let mut rest = data;
    // xorshift32; seed 0 means "one chunk" so the fuzzer can turn it off.
    if seed == 0 {
        if !rest.is_empty() {
            out.push(rest);
        }
        return out;
    }
    let mut s = u32::from(seed) | 0x9e37_7900;
    while !rest.is_empty() {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        let n = (s as usize % max).saturating_add(1).min(rest.len());
        let (a, b) = rest.split_at(n);
        out.push(a);
        rest = b;
    }
    out
}

/// Checks that `bytes` is a whole number of well-formed PDUs under
/// `framing` (digests that match, data where PDO says, nothing left over).
/// Returns the PDU types seen.
pub fn check_stream(bytes: &[u8], framing: Framing) -> Result<Vec<u8>, String> {
    let mut rest = bytes;
    let mut types = Vec::new();
    while !rest.is_empty() {
        match pdu::deframe(rest, framing, |_| Some(u32::MAX)) {
            None => return Err(format!("truncated PDU at the end: {:02x?}", rest)),
            Some(Err(e)) => return Err(format!("malformed PDU {:02x?}: {e}", rest)),
            Some(Ok(f)) => {
                if !f.data_digest_ok {
                    return Err(format!("bad data digest on {:02x?}", f.header));
                }
                if f.pdu_type == pdu::PduType::C2H_TERM_REQ || f.pdu_type == pdu::PduType::H2C_TERM_REQ {
                    let plen = f.ch.plen.get();
                    if f.data.len() > pdu::TERM_REQ_MAX_DATA {
                        return Err(format!("terminate request echoes {} bytes", f.data.len()));
                    }
                    if plen > 152 {
                        return Err(format!("terminate request plen {plen} > 152"));
                    }
                }
                types.push(f.pdu_type.0);
                rest = rest.get(f.len..).unwrap_or_default();
            }
        }
    }
    Ok(types)
}

/// A deterministic read pattern.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(7).wrapping_add(3)) as u8).collect()
}

/// Drains the target's events and acts like a tiny controller: reads get a
/// pattern, writes without in-capsule data are solicited with an R2T, and
/// everything else succeeds. Bad SGLs complete with the status `check_sgl`
/// returns. `max_read` caps read data so a hostile SGL length cannot make
/// the harness allocate a megabyte per command.
pub fn serve(t: &mut TargetConnection<Vec<u8>>, max_read: u32, input: Option<&[u8]>) -> usize {
    let mut n = 0;
    while let Some(ev) = t.poll_event() {
        n += 1;
        match ev {
            Event::Command { sqe, data } => command(t, max_read, sqe, data.as_ref().map(Vec::len)),
            Event::CommandInInput { sqe, data } => {
                let input = input.expect("data is lent only by handle_input_lent");
                let bytes = input.get(data).expect("lent data lies inside the input");
                command(t, max_read, sqe, Some(bytes.len()));
            }
            Event::Data { cid, data } => {
                let _ = data.len();
                t.send_response(Cqe::new(cid, Status::SUCCESS, 0));
            }
            Event::DataDigestError { cid, .. } => t.send_response(Cqe::new(cid, Status::TRANSIENT_TRANSPORT_ERROR, 0)),
            Event::HostTerminated { .. } | Event::Withdrawn { .. } => {}
        }
    }
    n
}

/// Answers one command with `data_len` bytes of in-capsule data, if any.
fn command(t: &mut TargetConnection<Vec<u8>>, max_read: u32, sqe: Sqe, data_len: Option<usize>) {
    let cid = sqe.cid.get();
    let len = match t.check_sgl(&sqe, data_len) {
        Ok(len) => len,
        Err(s) => {
            t.send_response(Cqe::new(cid, s, 0));
            return;
        }
    };
    match (sqe.opcode & 3, data_len) {
        (2, _) => t.send_data(cid, &pattern(len.min(max_read) as usize), Cqe::new(cid, Status::SUCCESS, 0)),
        // Writes with an odd CID go to a device that discards their data.
        (1, None) if len > 0 && cid & 1 == 1 => t.request_data_discarded(cid, len),
        (1, None) if len > 0 => t.request_data(cid, len),
        _ => t.send_response(Cqe::new(cid, Status::SUCCESS, 0)),
    }
}

/// The NVM subsystem the queue target connects to.
pub const SUB: &str = "nqn.2026-11.io.ironwire:fuzz";
/// The host NQN the queue target connects as.
pub const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:fuzz-host";

/// The local/peer address of every fuzz queue.
pub fn addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 4420))
}

/// In-capsule data bytes the fuzz target's NVMe/TCP ports advertise
/// (Identify IOCCSZ) and its binding accepts.
pub const IN_CAPSULE: u32 = 8192;

/// The transport descriptor of the fuzz target's ports and queues: NVMe/TCP
/// with [`IN_CAPSULE`] bytes of in-capsule data.
pub fn transport() -> nvmf::Transport {
    nvmf_tcp::transport(IN_CAPSULE)
}

/// A target-side NVMe/TCP connection used only for
/// [`TargetConnection::check_sgl`], the binding's parse of a command's data
/// pointer into the transfer length `nvmf::Queue::execute` takes. Its
/// transfer limit (1 MiB) is above the target's (64 KiB), as a daemon may
/// configure them, so the core's own limit checks are reachable.
pub fn binding() -> TargetConnection<Vec<u8>> {
    TargetConnection::new(TargetConfig {
        max_in_capsule: IN_CAPSULE,
        max_transfer: 1024 * 1024,
        ..TargetConfig::default()
    })
}

/// A target with one subsystem: NSID 1 a 64 KiB RAM device of 512-byte
/// blocks, NSID 2 a null device of 4 KiB blocks; two NVMe/TCP ports (one
/// discovery-only) so the discovery log has entries.
pub fn target() -> Arc<nvmf::Target<Device>> {
    let t = nvmf::Target::new(nvmf::Settings {
        max_transfer: 64 * 1024,
        max_io_queues: 4,
        queue_entries: 32,
        ..nvmf::Settings::default()
    });
    if let Ok(s) = t.add_subsystem(nvmf::Subsystem::new(SUB, "FUZZ1", true, Vec::new())) {
        if let Ok(dev) = Device::ram("fuzz-ram", 64 * 1024, 512) {
            let _ = s.add_namespace(nvmf::Namespace::new(SUB, 1, Arc::new(dev)));
        }
        if let Ok(dev) = Device::null("fuzz-null", 1 << 20, 4096) {
            let _ = s.add_namespace(nvmf::Namespace::new(SUB, 2, Arc::new(dev)));
        }
    }
    t.add_port(addr(), transport(), false);
    t.add_port(SocketAddr::from(([127, 0, 0, 1], 8009)), transport(), true);
    Arc::new(t)
}

/// A Fabrics command SQE, with a zero-length transport data block
/// descriptor as hosts send for commands without data.
pub fn fabrics_sqe(fctype: u8, cid: u16) -> Sqe {
    let mut s = Sqe { opcode: 0x7f, flags: Sqe::PSDT_SGL, dptr: Sgl::transport(0), ..Default::default() };
    s.cid = cid.into();
    s.nsid = u32::from(fctype).into();
    s
}

/// A Connect SQE for queue `qid` (SQSIZE 31, KATO 5 s, 1024 bytes of
/// in-capsule Connect data).
pub fn connect_sqe(qid: u16, cid: u16) -> Sqe {
    let mut s = fabrics_sqe(0x01, cid);
    s.cdw10 = (u32::from(qid) << 16).into();
    s.cdw11 = 31.into();
    s.cdw12 = 5000.into();
    s.dptr = Sgl::in_capsule(1024);
    s
}

/// Connect data for `SUB` as `HOST`.
pub fn connect_data(cntlid: u16, subnqn: &str) -> Vec<u8> {
    ConnectData::new([0x5a; 16], cntlid, subnqn, HOST).as_bytes().to_vec()
}

/// Property Set CC = `value`.
pub fn cc_set_sqe(value: u32, cid: u16) -> Sqe {
    let mut s = fabrics_sqe(0x00, cid);
    s.cdw11 = 0x14.into();
    s.cdw12 = value.into();
    s
}

/// CC with EN, IOSQES 6 and IOCQES 4, as Linux writes it.
pub const CC_ENABLE: u32 = 0x0046_0001;

pub mod iscsi_peer;
