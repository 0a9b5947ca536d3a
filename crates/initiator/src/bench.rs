//! A closed-loop load generator in the manner of fio: `jobs` I/O queues,
//! each kept at `qd` outstanding commands for a ramp time plus a run time,
//! reporting IOPS, bandwidth and a latency histogram.
//!
//! Everything runs on the calling monoio runtime (one thread); pin the
//! caller with `taskset` to keep the load on its own core. Latency is
//! measured from submission to completion as this host sees it: it
//! includes the host's own batching (a command is sent at the next flush).

use crate::controller::{Controller, NamespaceInfo, Options};
use crate::queue::Queue;
use crate::{cmd, Error, Result};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::cell::Cell;
use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::rc::Rc;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// The access pattern (fio's `rw`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Sequential mixed reads and writes.
    ReadWrite,
    /// Random mixed reads and writes.
    RandRw,
}

impl Pattern {
    fn random(self) -> bool {
        matches!(self, Pattern::RandRead | Pattern::RandWrite | Pattern::RandRw)
    }
}

impl FromStr for Pattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "read" => Pattern::Read,
            "write" => Pattern::Write,
            "randread" => Pattern::RandRead,
            "randwrite" => Pattern::RandWrite,
            "rw" | "readwrite" => Pattern::ReadWrite,
            "randrw" => Pattern::RandRw,
            _ => return Err(format!("{s:?} is not one of read, write, randread, randwrite, rw, randrw")),
        })
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Pattern::Read => "read",
            Pattern::Write => "write",
            Pattern::RandRead => "randread",
            Pattern::RandWrite => "randwrite",
            Pattern::ReadWrite => "rw",
            Pattern::RandRw => "randrw",
        })
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Controller address.
    pub addr: SocketAddr,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Host NQN.
    pub hostnqn: String,
    /// Namespace.
    pub nsid: u32,
    /// Access pattern.
    pub pattern: Pattern,
    /// Percentage of reads in mixed patterns (fio's `rwmixread`).
    pub read_percent: u8,
    /// Bytes per I/O; a multiple of the namespace block size.
    pub block_size: u32,
    /// Outstanding commands per job.
    pub qd: u32,
    /// Jobs, one I/O queue each.
    pub jobs: u16,
    /// Measured time.
    pub runtime: Duration,
    /// Time run before measuring.
    pub ramp: Duration,
    /// First byte of the range I/O goes to.
    pub offset: u64,
    /// Bytes of the range; `None` = to the end of the namespace.
    pub size: Option<u64>,
    /// Header digests.
    pub header_digest: bool,
    /// Data digests.
    pub data_digest: bool,
    /// Write a self-describing pattern and check it on read; each job then
    /// owns its own slice of the range.
    pub verify: bool,
    /// Random seed.
    pub seed: u64,
    /// Keep-alive timeout asked for (a keep-alive is sent every half).
    pub kato_ms: u32,
    /// Bound on every network wait.
    pub timeout: Duration,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            addr: SocketAddr::from(([127, 0, 0, 1], 4420)),
            subnqn: "nqn.2026-11.io.ironwire:default".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:ironwire-bench".into(),
            nsid: 1,
            pattern: Pattern::RandRead,
            read_percent: 50,
            block_size: 4096,
            qd: 32,
            jobs: 1,
            runtime: Duration::from_secs(10),
            ramp: Duration::ZERO,
            offset: 0,
            size: None,
            header_digest: false,
            data_digest: false,
            verify: false,
            seed: 0x1e0_f00d,
            kato_ms: 10_000,
            timeout: Duration::from_secs(10),
        }
    }
}

/// Latency summary.
#[derive(Clone, Copy, Debug, Default)]
pub struct Latency {
    /// Fastest.
    pub min: Duration,
    /// Mean.
    pub avg: Duration,
    /// Median.
    pub p50: Duration,
    /// 90th percentile.
    pub p90: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// 99.9th percentile.
    pub p999: Duration,
    /// Slowest.
    pub max: Duration,
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct Report {
    /// The options the run used.
    pub pattern: Pattern,
    /// Bytes per I/O.
    pub block_size: u32,
    /// Outstanding commands per job.
    pub qd: u32,
    /// Jobs.
    pub jobs: u16,
    /// Completed I/Os in the measured window.
    pub ios: u64,
    /// Of which reads.
    pub reads: u64,
    /// Of which writes.
    pub writes: u64,
    /// Bytes moved in the measured window.
    pub bytes: u64,
    /// Length of the measured window.
    pub elapsed: Duration,
    /// Completion latency.
    pub latency: Latency,
    /// Blocks whose contents did not match in verify mode.
    pub verify_errors: u64,
    /// Latency histogram in nanoseconds.
    pub histogram: Histogram<u64>,
}

impl Report {
    /// I/Os per second.
    pub fn iops(&self) -> f64 {
        self.ios as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Bandwidth in MiB/s (2^20 bytes).
    pub fn mib_per_s(&self) -> f64 {
        self.bytes as f64 / 1_048_576.0 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Bandwidth in Gbit/s (10^9 bits, fio's kb_base 1000).
    pub fn gbit_per_s(&self) -> f64 {
        self.bytes as f64 * 8.0 / 1e9 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} bs={} qd={} jobs={}: {} ios ({} reads, {} writes) in {:.2} s",
            self.pattern,
            self.block_size,
            self.qd,
            self.jobs,
            self.ios,
            self.reads,
            self.writes,
            self.elapsed.as_secs_f64()
        )?;
        writeln!(f, "  IOPS={:.0} BW={:.1} MiB/s ({:.3} Gbit/s)", self.iops(), self.mib_per_s(), self.gbit_per_s())?;
        let l = &self.latency;
        write!(
            f,
            "  lat (usec): min={:.1} avg={:.1} p50={:.1} p90={:.1} p99={:.1} p99.9={:.1} max={:.1}",
            us(l.min),
            us(l.avg),
            us(l.p50),
            us(l.p90),
            us(l.p99),
            us(l.p999),
            us(l.max)
        )?;
        if self.verify_errors > 0 {
            write!(f, "\n  verify errors: {}", self.verify_errors)?;
        }
        Ok(())
    }
}

fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 100 s with 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000_000, 3)
        .unwrap_or_else(|_| Histogram::new(3).unwrap_or_else(|_| unreachable!("3 significant digits are valid")))
}

/// Connects a controller with one I/O queue per job and runs the load.
pub async fn run(opts: &BenchOptions) -> Result<Report> {
    if opts.jobs == 0 || opts.qd == 0 || opts.block_size == 0 {
        return Err(Error::Invalid("jobs, qd and block size must be > 0".into()));
    }
    let mut ctrl = Controller::connect(
        opts.addr,
        &opts.subnqn,
        &opts.hostnqn,
        Options {
            io_queues: opts.jobs,
            queue_size: u16::try_from(opts.qd.saturating_add(1)).unwrap_or(u16::MAX),
            kato_ms: opts.kato_ms,
            header_digest: opts.header_digest,
            data_digest: opts.data_digest,
            timeout: opts.timeout,
            ..Options::default()
        },
    )
    .await?;
    if ctrl.io_queue_count() < usize::from(opts.jobs) {
        return Err(Error::Protocol(format!(
            "controller granted {} I/O queues ({} jobs asked)",
            ctrl.io_queue_count(),
            opts.jobs
        )));
    }
    let ns = ctrl.identify_namespace(opts.nsid).await?;
    if let Some(max) = ctrl.identity().max_transfer {
        if opts.block_size > max {
            return Err(Error::Invalid(format!("block size {} exceeds MDTS {max}", opts.block_size)));
        }
    }
    let queues = ctrl.take_io_queues();
    let done = Rc::new(Cell::new(0usize));
    let (handles, start) = spawn_jobs(queues, &ns, opts, done.clone())?;
    // Keep the controller alive while the jobs run.
    let ka_every = Duration::from_millis(u64::from(opts.kato_ms / 2).max(100));
    let mut last_ka = Instant::now();
    while done.get() < handles.len() {
        monoio::time::sleep(Duration::from_millis(50)).await;
        if opts.kato_ms > 0 && last_ka.elapsed() >= ka_every {
            ctrl.keep_alive().await?;
            last_ka = Instant::now();
        }
    }
    let mut results = Vec::new();
    for h in handles {
        results.push(h.await?);
    }
    let _ = ctrl.disconnect().await;
    Ok(merge(opts, &results, start))
}

/// Runs the load on queues already connected to a controller: one job per
/// queue, on namespace `ns`.
pub async fn run_on_queues(queues: Vec<Queue>, ns: &NamespaceInfo, opts: &BenchOptions) -> Result<Report> {
    let done = Rc::new(Cell::new(0usize));
    let (handles, start) = spawn_jobs(queues, ns, opts, done)?;
    let mut results = Vec::new();
    for h in handles {
        results.push(h.await?);
    }
    Ok(merge(opts, &results, start))
}

type JobHandle = monoio::task::JoinHandle<Result<JobResult>>;

fn spawn_jobs(
    queues: Vec<Queue>,
    ns: &NamespaceInfo,
    opts: &BenchOptions,
    done: Rc<Cell<usize>>,
) -> Result<(Vec<JobHandle>, Instant)> {
    let lbs = u64::from(ns.block_size);
    if lbs == 0 || u64::from(opts.block_size) % lbs != 0 {
        return Err(Error::Invalid(format!(
            "block size {} is not a multiple of the namespace's {lbs}-byte blocks",
            opts.block_size
        )));
    }
    let ns_bytes = ns.size_bytes();
    let first = opts.offset / lbs;
    let end_byte = opts.size.map_or(ns_bytes, |s| opts.offset.saturating_add(s)).min(ns_bytes);
    let blocks_per_io = u64::from(opts.block_size) / lbs;
    let total_ios = end_byte.saturating_sub(opts.offset) / u64::from(opts.block_size);
    let jobs = queues.len() as u64;
    if total_ios == 0 || (opts.verify && total_ios < jobs) {
        return Err(Error::Invalid(format!(
            "range {}..{end_byte} holds no whole {}-byte I/O per job",
            opts.offset, opts.block_size
        )));
    }
    let start = Instant::now();
    let measure_from = start + opts.ramp;
    let end = measure_from + opts.runtime;
    let mut handles = Vec::new();
    for (j, q) in queues.into_iter().enumerate() {
        let j = j as u64;
        // Verify mode gives each job its own slice so no two jobs write the
        // same block; otherwise every job covers the whole range and
        // sequential jobs start spread out.
        let (slots, base, seq_start) = if opts.verify {
            let per = total_ios / jobs;
            (per, first + j * per * blocks_per_io, 0)
        } else {
            (total_ios, first, j * (total_ios / jobs))
        };
        let job = Job {
            q,
            nsid: opts.nsid,
            pattern: opts.pattern,
            read_percent: opts.read_percent,
            qd: opts.qd as usize,
            lbs: ns.block_size,
            blocks_per_io: blocks_per_io as u32,
            base,
            slots,
            next_seq: seq_start,
            verify: opts.verify,
            rng: SmallRng::seed_from_u64(opts.seed.wrapping_add(j.wrapping_mul(0x9e37_79b9))),
            measure_from,
            end,
        };
        let done = done.clone();
        handles.push(monoio::spawn(async move {
            let r = job.run().await;
            done.set(done.get() + 1);
            r
        }));
    }
    Ok((handles, start))
}

fn merge(opts: &BenchOptions, results: &[JobResult], start: Instant) -> Report {
    let mut h = new_histogram();
    let mut r = Report {
        pattern: opts.pattern,
        block_size: opts.block_size,
        qd: opts.qd,
        jobs: u16::try_from(results.len()).unwrap_or(u16::MAX),
        ios: 0,
        reads: 0,
        writes: 0,
        bytes: 0,
        elapsed: Duration::ZERO,
        latency: Latency::default(),
        verify_errors: 0,
        histogram: new_histogram(),
    };
    let measure_from = start + opts.ramp;
    let mut last = measure_from;
    for j in results {
        let _ = h.add(&j.hist);
        r.reads += j.reads;
        r.writes += j.writes;
        r.bytes += j.bytes;
        r.verify_errors += j.verify_errors;
        last = last.max(j.finished);
    }
    r.ios = r.reads + r.writes;
    r.elapsed = last.saturating_duration_since(measure_from);
    let ns = Duration::from_nanos;
    if !h.is_empty() {
        r.latency = Latency {
            min: ns(h.min()),
            avg: ns(h.mean() as u64),
            p50: ns(h.value_at_quantile(0.5)),
            p90: ns(h.value_at_quantile(0.9)),
            p99: ns(h.value_at_quantile(0.99)),
            p999: ns(h.value_at_quantile(0.999)),
            max: ns(h.max()),
        };
    }
    r.histogram = h;
    r
}

struct JobResult {
    hist: Histogram<u64>,
    reads: u64,
    writes: u64,
    bytes: u64,
    verify_errors: u64,
    finished: Instant,
}

struct Job {
    q: Queue,
    nsid: u32,
    pattern: Pattern,
    read_percent: u8,
    qd: usize,
    lbs: u32,
    blocks_per_io: u32,
    /// First LBA of this job's range.
    base: u64,
    /// I/O-sized slots in the range.
    slots: u64,
    next_seq: u64,
    verify: bool,
    rng: SmallRng,
    measure_from: Instant,
    end: Instant,
}

struct InFlight {
    submitted: Instant,
    write: bool,
    lba: u64,
}

const VERIFY_MAGIC: u64 = 0x4952_4f4e_5749_5245; // "IRONWIRE"

/// The verify pattern of one block: magic, LBA, then bytes derived from
/// the LBA, so any version of a block read back is checkable on its own.
fn fill_block(block: &mut [u8], lba: u64) {
    let mut x = lba.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for (i, chunk) in block.chunks_mut(8).enumerate() {
        let v = match i {
            0 => VERIFY_MAGIC,
            1 => lba,
            _ => {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            }
        };
        let b = v.to_le_bytes();
        let n = chunk.len();
        chunk.copy_from_slice(b.get(..n).unwrap_or_default());
    }
}

impl Job {
    fn pick(&mut self) -> (bool, u64) {
        let write = match self.pattern {
            Pattern::Read | Pattern::RandRead => false,
            Pattern::Write | Pattern::RandWrite => true,
            Pattern::ReadWrite | Pattern::RandRw => self.rng.gen_range(0..100u8) >= self.read_percent,
        };
        let slot = if self.pattern.random() {
            self.rng.gen_range(0..self.slots)
        } else {
            let s = self.next_seq % self.slots;
            self.next_seq = s + 1;
            s
        };
        (write, self.base + slot * u64::from(self.blocks_per_io))
    }

    fn write_data(&self, lba: u64, template: &[u8]) -> Vec<u8> {
        if !self.verify {
            return template.to_vec();
        }
        let mut data = vec![0u8; template.len()];
        for (i, b) in data.chunks_mut(self.lbs as usize).enumerate() {
            fill_block(b, lba + i as u64);
        }
        data
    }

    fn check(&self, lba: u64, data: &[u8]) -> u64 {
        let mut bad = 0;
        let mut want = vec![0u8; self.lbs as usize];
        for (i, b) in data.chunks(self.lbs as usize).enumerate() {
            let magic = b.get(..8).map(|m| u64::from_le_bytes(m.try_into().unwrap_or([0; 8])));
            if magic != Some(VERIFY_MAGIC) {
                // Never written by a verify run: nothing to check.
                continue;
            }
            fill_block(&mut want, lba + i as u64);
            if b != &want[..] {
                log::error!("verify: block {} does not hold its pattern", lba + i as u64);
                bad += 1;
            }
        }
        bad
    }

    async fn run(mut self) -> Result<JobResult> {
        let io_bytes = self.lbs * self.blocks_per_io;
        let template = vec![0xa5u8; io_bytes as usize];
        let mut hist = new_histogram();
        let mut in_flight: HashMap<u16, InFlight> = HashMap::with_capacity(self.qd * 2);
        let (mut reads, mut writes, mut bytes, mut verify_errors) = (0u64, 0u64, 0u64, 0u64);
        let depth = self.qd.min(self.q.depth());
        let mut now = Instant::now();
        loop {
            while self.q.outstanding() < depth && now < self.end {
                let (write, lba) = self.pick();
                let cid = if write {
                    let data = self.write_data(lba, &template);
                    self.q.submit(cmd::write(self.nsid, lba, self.blocks_per_io), data, 0)?
                } else {
                    self.q.submit(cmd::read(self.nsid, lba, self.blocks_per_io), Vec::new(), io_bytes)?
                };
                in_flight.insert(cid, InFlight { submitted: now, write, lba });
            }
            if self.q.outstanding() == 0 {
                break;
            }
            let c = self.q.next_completion().await?;
            now = Instant::now();
            let Some(f) = in_flight.remove(&c.cqe.cid.get()) else {
                return Err(Error::Protocol(format!("completion for unknown cid {}", c.cqe.cid.get())));
            };
            let status = c.cqe.status();
            if !status.is_success() {
                return Err(Error::Status(status));
            }
            if self.verify && !f.write {
                verify_errors += self.check(f.lba, &c.data);
            }
            if f.submitted >= self.measure_from {
                hist.saturating_record(now.saturating_duration_since(f.submitted).as_nanos() as u64);
                bytes += u64::from(io_bytes);
                if f.write {
                    writes += 1;
                } else {
                    reads += 1;
                }
            }
        }
        Ok(JobResult { hist, reads, writes, bytes, verify_errors, finished: now })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fio_pattern_names() {
        assert_eq!("randread".parse(), Ok(Pattern::RandRead));
        assert_eq!("rw".parse(), Ok(Pattern::ReadWrite));
        assert!("sideways".parse::<Pattern>().is_err());
        assert_eq!(Pattern::RandRw.to_string(), "randrw");
    }

    #[test]
    fn verify_pattern_names_its_block() {
        let mut a = vec![0u8; 512];
        let mut b = vec![0u8; 512];
        fill_block(&mut a, 7);
        fill_block(&mut b, 8);
        assert_ne!(a, b);
        assert_eq!(&a[8..16], &7u64.to_le_bytes());
        let mut again = vec![0u8; 512];
        fill_block(&mut again, 7);
        assert_eq!(a, again);
    }

    #[test]
    fn bandwidth_uses_decimal_gigabits_and_binary_mebibytes() {
        let r = Report {
            pattern: Pattern::Read,
            block_size: 4096,
            qd: 1,
            jobs: 1,
            ios: 1000,
            reads: 1000,
            writes: 0,
            bytes: 125_000_000,
            elapsed: Duration::from_secs(1),
            latency: Latency::default(),
            verify_errors: 0,
            histogram: new_histogram(),
        };
        assert!((r.gbit_per_s() - 1.0).abs() < 1e-9);
        assert!((r.mib_per_s() - 119.209).abs() < 1e-3);
        assert!((r.iops() - 1000.0).abs() < 1e-9);
    }
}
