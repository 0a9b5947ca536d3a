//! A closed-loop load generator in the manner of fio: `jobs` workers, each
//! kept at `qd` outstanding I/Os for a ramp time plus a run time, reporting
//! IOPS, bandwidth and latency histograms per direction.
//!
//! One workload ([`Workload`]: what to access, the verify bookkeeping, the
//! tally) is driven by four engines: NVMe/TCP I/O queues ([`run`],
//! [`run_on_queues`]), iSCSI sessions ([`run_iscsi`]), a local
//! `blockdev::Device` without the network ([`run_local`], the "local" half
//! of "remote minus local"), and a bare TCP request/response loop
//! ([`ceiling`]). Each call runs on the calling reactor runtime (one
//! thread); callers that want several cores start one call per thread and
//! add the reports with [`Report::merge`], giving each call its share of
//! the jobs through `job_base` / `job_total`. Latency is measured
//! from submission to completion as this host sees it, so it includes the
//! host's own batching (a command is sent at the next flush).

pub mod ceiling;
mod iscsi;
mod local;

pub use iscsi::{run_iscsi, IscsiTarget};
pub use local::run_local;

use crate::controller::{Controller, NamespaceInfo, Options};
use crate::queue::{Queue, Transport};
use crate::{cmd, Error, Result};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rustc_hash::FxHashMap;
use std::cell::Cell;
use std::fmt;
use std::net::SocketAddr;
use std::rc::Rc;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
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

    /// Whether the pattern never writes.
    pub fn read_only(self) -> bool {
        matches!(self, Pattern::Read | Pattern::RandRead)
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

/// Live counters a run bumps on every completion (ramp included), for a
/// progress line read from another thread, and the jobs whose I/O is over
/// (before any logout or disconnect), where the CPU window ends.
#[derive(Debug, Default)]
pub struct Progress {
    ios: AtomicU64,
    bytes: AtomicU64,
    started: AtomicU64,
    finished: AtomicU64,
}

impl Progress {
    /// Completed I/Os so far.
    pub fn ios(&self) -> u64 {
        self.ios.load(Ordering::Relaxed)
    }

    /// Bytes moved so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Whether the load has started (connections made, ramp begun).
    pub fn started(&self) -> bool {
        self.started.load(Ordering::Relaxed) > 0
    }

    /// Jobs whose last I/O has completed.
    pub fn finished(&self) -> u64 {
        self.finished.load(Ordering::Relaxed)
    }

    fn record(&self, bytes: u64) {
        self.ios.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Controller address.
    pub addr: SocketAddr,
    /// NVMe-oF transport.
    pub transport: Transport,
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
    /// Write a self-describing pattern (LBA, generation, CRC32C) and check
    /// every read; each job then owns its own slice of the range, and after
    /// the load reads back every block it wrote. With a read-only pattern
    /// every block read must hold a valid pattern (the range was written by
    /// an earlier verify run).
    pub verify: bool,
    /// Random seed.
    pub seed: u64,
    /// Keep-alive timeout asked for (a keep-alive is sent every half).
    pub kato_ms: u32,
    /// NVMe-oF: Connect every queue with SQ flow control disabled (see
    /// [`Options::disable_sq_flow`]).
    pub disable_sq_flow: bool,
    /// Bound on every network wait.
    pub timeout: Duration,
    /// Index of this call's first job among `job_total` (several calls,
    /// one per thread, share one range and verify slices).
    pub job_base: u16,
    /// Jobs over all calls; 0 = `jobs` (this call is alone).
    pub job_total: u16,
    /// Counters for a live progress line.
    pub progress: Option<Arc<Progress>>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            addr: SocketAddr::from(([127, 0, 0, 1], 4420)),
            transport: Transport::Tcp,
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
            disable_sq_flow: false,
            timeout: Duration::from_secs(10),
            job_base: 0,
            job_total: 0,
            progress: None,
        }
    }
}

/// Latency summary.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
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

impl Latency {
    /// The summary of a histogram of nanoseconds (all zero when empty).
    pub fn from_histogram(h: &Histogram<u64>) -> Latency {
        if h.is_empty() {
            return Latency::default();
        }
        let ns = Duration::from_nanos;
        Latency {
            min: ns(h.min()),
            avg: ns(h.mean().round() as u64),
            p50: ns(h.value_at_quantile(0.5)),
            p90: ns(h.value_at_quantile(0.9)),
            p99: ns(h.value_at_quantile(0.99)),
            p999: ns(h.value_at_quantile(0.999)),
            max: ns(h.max()),
        }
    }
}

/// The first block verify found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError {
    /// Its LBA.
    pub lba: u64,
    /// What was wrong with it.
    pub reason: String,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LBA {}: {}", self.lba, self.reason)
    }
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
    /// Of which read.
    pub read_bytes: u64,
    /// Of which written.
    pub write_bytes: u64,
    /// Length of the measured window.
    pub elapsed: Duration,
    /// Completion latency of all I/Os.
    pub latency: Latency,
    /// Blocks whose contents did not match in verify mode (whole run,
    /// ramp included).
    pub verify_errors: u64,
    /// The first of them.
    pub first_verify_error: Option<VerifyError>,
    /// Blocks read back and checked in verify mode (whole run, the
    /// read-back after the load included).
    pub verify_checked: u64,
    /// Of those, blocks never written (all zeros, as a fresh device reads)
    /// where no pattern was expected yet: not corrupt, and not checked.
    pub verify_unwritten: u64,
    /// Latency histogram in nanoseconds, all I/Os.
    pub histogram: Histogram<u64>,
    /// Latency histogram in nanoseconds, reads.
    pub read_histogram: Histogram<u64>,
    /// Latency histogram in nanoseconds, writes.
    pub write_histogram: Histogram<u64>,
}

impl Report {
    /// An empty report for these options (what [`Report::merge`] adds to).
    pub fn empty(opts: &BenchOptions) -> Report {
        Report {
            pattern: opts.pattern,
            block_size: opts.block_size,
            qd: opts.qd,
            jobs: 0,
            ios: 0,
            reads: 0,
            writes: 0,
            bytes: 0,
            read_bytes: 0,
            write_bytes: 0,
            elapsed: Duration::ZERO,
            latency: Latency::default(),
            verify_errors: 0,
            first_verify_error: None,
            verify_checked: 0,
            verify_unwritten: 0,
            histogram: new_histogram(),
            read_histogram: new_histogram(),
            write_histogram: new_histogram(),
        }
    }

    /// Adds a report of the same workload run at the same time (another
    /// thread's jobs): counts and histograms add, the window is the longer.
    pub fn merge(&mut self, other: &Report) {
        self.jobs = self.jobs.saturating_add(other.jobs);
        self.ios += other.ios;
        self.reads += other.reads;
        self.writes += other.writes;
        self.bytes += other.bytes;
        self.read_bytes += other.read_bytes;
        self.write_bytes += other.write_bytes;
        self.elapsed = self.elapsed.max(other.elapsed);
        self.verify_errors += other.verify_errors;
        self.verify_checked += other.verify_checked;
        self.verify_unwritten += other.verify_unwritten;
        if self.first_verify_error.is_none() {
            self.first_verify_error.clone_from(&other.first_verify_error);
        }
        let _ = self.histogram.add(&other.histogram);
        let _ = self.read_histogram.add(&other.read_histogram);
        let _ = self.write_histogram.add(&other.write_histogram);
        self.latency = Latency::from_histogram(&self.histogram);
    }

    /// I/Os per second.
    pub fn iops(&self) -> f64 {
        per_second(self.ios as f64, self.elapsed)
    }

    /// Bandwidth in MiB/s (2^20 bytes).
    pub fn mib_per_s(&self) -> f64 {
        per_second(self.bytes as f64 / 1_048_576.0, self.elapsed)
    }

    /// Bandwidth in Gbit/s (10^9 bits, fio's kb_base 1000).
    pub fn gbit_per_s(&self) -> f64 {
        gbit_per_s(self.bytes, self.elapsed)
    }
}

/// `x` per second of `elapsed` (0 for an empty window).
pub fn per_second(x: f64, elapsed: Duration) -> f64 {
    let s = elapsed.as_secs_f64();
    if s > 0.0 {
        x / s
    } else {
        0.0
    }
}

/// Bytes over a window in Gbit/s, 10^9 bits (fio's kb_base 1000, as the
/// papers count network bandwidth).
pub fn gbit_per_s(bytes: u64, elapsed: Duration) -> f64 {
    per_second(bytes as f64 * 8.0 / 1e9, elapsed)
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
        if self.verify_checked > 0 {
            write!(
                f,
                "\n  verify: {} blocks read, {} corrupt, {} never written (zeros, not checked)",
                self.verify_checked, self.verify_errors, self.verify_unwritten
            )?;
        }
        if self.verify_errors > 0 {
            write!(f, "\n  verify errors: {}", self.verify_errors)?;
            if let Some(e) = &self.first_verify_error {
                write!(f, " (first: {e})")?;
            }
        }
        Ok(())
    }
}

/// A histogram of nanoseconds: 1 ns .. 100 s with 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
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
            transport: opts.transport,
            io_queues: opts.jobs,
            queue_size: u16::try_from(opts.qd.saturating_add(1)).unwrap_or(u16::MAX),
            kato_ms: opts.kato_ms,
            header_digest: opts.header_digest,
            data_digest: opts.data_digest,
            disable_sq_flow: opts.disable_sq_flow,
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
    let (handles, start) = spawn_queue_jobs(queues, &ns, opts, done.clone())?;
    // Keep the controller alive while the jobs run.
    let ka_every = Duration::from_millis(u64::from(opts.kato_ms / 2).max(100));
    let mut last_ka = Instant::now();
    while done.get() < handles.len() {
        reactor::sleep(Duration::from_millis(50)).await;
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
    let (handles, start) = spawn_queue_jobs(queues, ns, opts, done)?;
    let mut results = Vec::new();
    for h in handles {
        results.push(h.await?);
    }
    Ok(merge(opts, &results, start))
}

type JobHandle = reactor::JoinHandle<Result<Tally>>;

/// Most blocks one NVMe Read or Write moves (NLB is a 16-bit 0-based count).
const MAX_NLB: u32 = 1 << 16;

/// Most I/O slots verify mode tracks (4 bytes each).
const MAX_VERIFY_SLOTS: u64 = 1 << 26;

/// Splits the range among the jobs and builds one [`Workload`] per job.
fn plan(opts: &BenchOptions, jobs: usize, lbs: u32, ns_bytes: u64) -> Result<Vec<Workload>> {
    let lbs64 = u64::from(lbs);
    if lbs == 0 || opts.block_size == 0 || u64::from(opts.block_size) % lbs64 != 0 {
        return Err(Error::Invalid(format!(
            "block size {} is not a multiple of the namespace's {lbs}-byte blocks",
            opts.block_size
        )));
    }
    if !opts.offset.is_multiple_of(lbs64) {
        return Err(Error::Invalid(format!("offset {} is not a multiple of {lbs}-byte blocks", opts.offset)));
    }
    let first = opts.offset / lbs64;
    let end_byte = opts.size.map_or(ns_bytes, |s| opts.offset.saturating_add(s)).min(ns_bytes);
    let blocks_per_io = u64::from(opts.block_size) / lbs64;
    let total_ios = end_byte.saturating_sub(opts.offset) / u64::from(opts.block_size);
    let total_jobs =
        u64::from(if opts.job_total == 0 { u16::try_from(jobs).unwrap_or(u16::MAX) } else { opts.job_total });
    if total_ios == 0 || (opts.verify && total_ios < total_jobs) {
        return Err(Error::Invalid(format!(
            "range {}..{end_byte} holds no whole {}-byte I/O per job",
            opts.offset, opts.block_size
        )));
    }
    if opts.verify && total_ios > MAX_VERIFY_SLOTS {
        return Err(Error::Invalid(format!(
            "verify tracks at most {MAX_VERIFY_SLOTS} I/Os of the range ({total_ios} asked): give a smaller size"
        )));
    }
    let start = Instant::now();
    let measure_from = start + opts.ramp;
    let end = measure_from + opts.runtime;
    let first_gen = first_generation();
    let mut out = Vec::with_capacity(jobs);
    for j in 0..jobs as u64 {
        let g = u64::from(opts.job_base) + j;
        // Verify mode gives each job its own slice so no two jobs write the
        // same block; otherwise every job covers the whole range and
        // sequential jobs start spread out.
        let (slots, base, seq_start) = if opts.verify {
            let per = total_ios / total_jobs;
            (per, first + g * per * blocks_per_io, 0)
        } else {
            (total_ios, first, g.saturating_mul(total_ios / total_jobs) % total_ios)
        };
        out.push(Workload {
            pattern: opts.pattern,
            read_percent: opts.read_percent,
            lbs,
            blocks_per_io: blocks_per_io as u32,
            base,
            slots,
            next_seq: seq_start,
            verify: opts.verify.then(|| Verify { slots: vec![0; slots as usize], next_gen: first_gen }),
            rng: SmallRng::seed_from_u64(opts.seed.wrapping_add(g.wrapping_mul(0x9e37_79b9))),
            measure_from,
            end,
            read_back: None,
            progress: opts.progress.clone(),
            tally: Tally::new(start),
        });
    }
    if let Some(p) = &opts.progress {
        p.started.fetch_add(1, Ordering::Relaxed);
    }
    Ok(out)
}

fn spawn_queue_jobs(
    queues: Vec<Queue>,
    ns: &NamespaceInfo,
    opts: &BenchOptions,
    done: Rc<Cell<usize>>,
) -> Result<(Vec<JobHandle>, Instant)> {
    let work = plan(opts, queues.len(), ns.block_size, ns.size_bytes())?;
    if work.first().is_some_and(|w| w.blocks_per_io > MAX_NLB) {
        return Err(Error::Invalid(format!(
            "block size {} is more than one NVMe command's {MAX_NLB} blocks of {} bytes",
            opts.block_size, ns.block_size
        )));
    }
    let start = work.first().map_or_else(Instant::now, |w| w.tally.finished);
    let mut handles = Vec::new();
    for (w, q) in work.into_iter().zip(queues) {
        let done = done.clone();
        let job = QueueJob { q, nsid: opts.nsid, qd: opts.qd as usize, w };
        handles.push(reactor::spawn(async move {
            let r = job.run().await;
            done.set(done.get() + 1);
            r
        }));
    }
    Ok((handles, start))
}

fn merge(opts: &BenchOptions, results: &[Tally], start: Instant) -> Report {
    let mut r = Report::empty(opts);
    r.jobs = u16::try_from(results.len()).unwrap_or(u16::MAX);
    let measure_from = start + opts.ramp;
    let mut last = measure_from;
    for j in results {
        let _ = r.read_histogram.add(&j.read_hist);
        let _ = r.write_histogram.add(&j.write_hist);
        r.reads += j.reads;
        r.writes += j.writes;
        r.read_bytes += j.read_bytes;
        r.write_bytes += j.write_bytes;
        r.verify_errors += j.verify_errors;
        r.verify_checked += j.verify_checked;
        r.verify_unwritten += j.verify_unwritten;
        if r.first_verify_error.is_none() {
            r.first_verify_error.clone_from(&j.first_verify_error);
        }
        last = last.max(j.finished);
    }
    let _ = r.histogram.add(&r.read_histogram);
    let _ = r.histogram.add(&r.write_histogram);
    r.ios = r.reads + r.writes;
    r.bytes = r.read_bytes + r.write_bytes;
    r.elapsed = last.saturating_duration_since(measure_from);
    r.latency = Latency::from_histogram(&r.histogram);
    r
}

/// One job's counts.
struct Tally {
    read_hist: Histogram<u64>,
    write_hist: Histogram<u64>,
    reads: u64,
    writes: u64,
    read_bytes: u64,
    write_bytes: u64,
    verify_errors: u64,
    first_verify_error: Option<VerifyError>,
    verify_checked: u64,
    verify_unwritten: u64,
    finished: Instant,
}

impl Tally {
    fn new(now: Instant) -> Tally {
        Tally {
            read_hist: new_histogram(),
            write_hist: new_histogram(),
            reads: 0,
            writes: 0,
            read_bytes: 0,
            write_bytes: 0,
            verify_errors: 0,
            first_verify_error: None,
            verify_checked: 0,
            verify_unwritten: 0,
            finished: now,
        }
    }
}

/// Verify bookkeeping: per I/O slot, the generation last written in this
/// run (0 = not yet) and whether an I/O to it is in flight (top bit). A
/// slot is never the target of two I/Os at once, so every read has exactly
/// one right answer.
struct Verify {
    slots: Vec<u32>,
    next_gen: u32,
}

const BUSY: u32 = 1 << 31;

/// Where a run's verify generations start: another place for every run, of
/// this process or another, so that a block an earlier run of the same
/// workload (same seed, same range, hence the same picks) wrote never
/// passes for the one this run wrote there and lost.
fn first_generation() -> u32 {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let run = RUNS.fetch_add(1, Ordering::Relaxed) ^ (u64::from(std::process::id()) << 32);
    let x = (nanos ^ run.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    ((x >> 33) as u32 & !BUSY).max(1)
}

/// One I/O picked by a [`Workload`].
#[derive(Clone, Copy, Debug)]
struct Io {
    write: bool,
    slot: u64,
    lba: u64,
    gen: u32,
}

/// What one job accesses, and what it has seen.
struct Workload {
    pattern: Pattern,
    read_percent: u8,
    lbs: u32,
    blocks_per_io: u32,
    /// First LBA of this job's range.
    base: u64,
    /// I/O-sized slots in the range.
    slots: u64,
    next_seq: u64,
    verify: Option<Verify>,
    rng: SmallRng,
    measure_from: Instant,
    end: Instant,
    /// Verify's read-back after the load: the next slot to look at
    /// (`None` while the load runs).
    read_back: Option<u64>,
    progress: Option<Arc<Progress>>,
    tally: Tally,
}

impl Workload {
    /// The job's last I/O completed at `now`: its window ends there.
    fn finish(&mut self, now: Instant) {
        self.tally.finished = now;
        if let Some(p) = &self.progress {
            p.finished.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The next I/O to submit at `now`: the load's until its end, then,
    /// once [`drained`](Self::drained) started the read-back, a read of
    /// each block this job wrote in the run.
    fn next(&mut self, now: Instant) -> Option<Io> {
        match self.read_back {
            None => (now < self.end).then(|| self.pick()),
            Some(_) => self.pick_read_back(),
        }
    }

    /// Nothing is in flight any more at `now`. After the load, that closes
    /// the job's window (the CPU window too) and, in verify mode with a
    /// writing pattern, starts the read-back: a block written and never read
    /// again (all of them, with `write`) would otherwise go unchecked, and a
    /// target that acknowledges writes and keeps nothing would pass. Returns
    /// whether there is more to submit.
    fn drained(&mut self, now: Instant) -> bool {
        if self.read_back.is_some() {
            return false;
        }
        self.finish(now);
        let read_back = self.verify.is_some() && !self.pattern.read_only();
        if read_back {
            self.read_back = Some(0);
        }
        read_back
    }

    /// A read of the next slot written in this run, in LBA order.
    fn pick_read_back(&mut self) -> Option<Io> {
        let v = self.verify.as_mut()?;
        let from = usize::try_from(self.read_back?).unwrap_or(usize::MAX);
        let (slot, s) = v.slots.iter_mut().enumerate().skip(from).find(|(_, s)| **s & !BUSY != 0)?;
        *s |= BUSY;
        let slot = slot as u64;
        self.read_back = Some(slot + 1);
        Some(Io { write: false, slot, lba: self.base + slot * u64::from(self.blocks_per_io), gen: 0 })
    }

    fn io_bytes(&self) -> u32 {
        self.lbs * self.blocks_per_io
    }

    /// The most I/Os this job may have in flight: in verify mode no more
    /// than it has slots, so a free slot always exists.
    fn depth(&self, qd: usize) -> usize {
        if self.verify.is_some() {
            qd.min(usize::try_from(self.slots).unwrap_or(usize::MAX))
        } else {
            qd
        }
    }

    fn pick(&mut self) -> Io {
        let write = match self.pattern {
            Pattern::Read | Pattern::RandRead => false,
            Pattern::Write | Pattern::RandWrite => true,
            Pattern::ReadWrite | Pattern::RandRw => self.rng.gen_range(0..100u8) >= self.read_percent,
        };
        let mut slot =
            if self.pattern.random() { self.rng.gen_range(0..self.slots) } else { self.next_seq % self.slots };
        let mut gen = 0;
        if let Some(v) = &mut self.verify {
            // Skip slots with an I/O in flight (`depth` keeps one free).
            for _ in 0..self.slots {
                if v.slots.get(slot as usize).is_some_and(|s| s & BUSY == 0) {
                    break;
                }
                slot = (slot + 1) % self.slots;
            }
            if let Some(s) = v.slots.get_mut(slot as usize) {
                *s |= BUSY;
            }
            if write {
                gen = v.next_gen;
                v.next_gen = (v.next_gen + 1) & !BUSY;
                if v.next_gen == 0 {
                    v.next_gen = 1;
                }
            }
        }
        if !self.pattern.random() {
            self.next_seq = (slot + 1) % self.slots;
        }
        Io { write, slot, lba: self.base + slot * u64::from(self.blocks_per_io), gen }
    }

    /// The data of a write: the verify pattern, or a fixed filler.
    fn fill(&self, io: &Io, buf: &mut [u8]) {
        if self.verify.is_some() {
            for (i, b) in buf.chunks_mut(self.lbs as usize).enumerate() {
                fill_block(b, io.lba + i as u64, io.gen);
            }
        } else {
            buf.fill(0xa5);
        }
    }

    /// Accounts a completed I/O; `data` is what a read returned. A read of
    /// the read-back is checked, not counted as load.
    fn complete(&mut self, io: &Io, submitted: Instant, now: Instant, data: &[u8]) {
        let bytes = u64::from(self.io_bytes());
        let load = self.read_back.is_none();
        if let Some(p) = self.progress.as_ref().filter(|_| load) {
            p.record(bytes);
        }
        if let Some(v) = &mut self.verify {
            let committed = v.slots.get(io.slot as usize).map_or(0, |s| s & !BUSY);
            if io.write {
                if let Some(s) = v.slots.get_mut(io.slot as usize) {
                    *s = io.gen;
                }
            } else {
                if let Some(s) = v.slots.get_mut(io.slot as usize) {
                    *s &= !BUSY;
                }
                // Never written in this run: a writing run checks only blocks
                // that carry a pattern; a read-only run expects one everywhere.
                let want = match committed {
                    0 if self.pattern.read_only() => Expect::AnyGeneration,
                    0 => Expect::IfPresent,
                    g => Expect::Generation(g),
                };
                for (i, b) in data.chunks(self.lbs as usize).enumerate() {
                    let lba = io.lba + i as u64;
                    self.tally.verify_checked += 1;
                    // A block no run wrote reads as zeros: that is not
                    // corruption. One this run wrote must hold its pattern.
                    if want != Expect::Generation(committed) && b.iter().all(|&x| x == 0) {
                        self.tally.verify_unwritten += 1;
                        continue;
                    }
                    if let Err(reason) = check_block(b, lba, want) {
                        self.tally.verify_errors += 1;
                        if self.tally.first_verify_error.is_none() {
                            log::error!("verify: LBA {lba}: {reason}");
                            self.tally.first_verify_error = Some(VerifyError { lba, reason });
                        }
                    }
                }
            }
        }
        // As fio after its ramp_time: every I/O that completes in the
        // measured window counts, whenever it was submitted. Counting by
        // submission would drop the I/Os in flight as the window opens while
        // their completions' time stays in the window.
        if load && now >= self.measure_from {
            let t = &mut self.tally;
            let lat = now.saturating_duration_since(submitted).as_nanos() as u64;
            if io.write {
                t.write_hist.saturating_record(lat);
                t.writes += 1;
                t.write_bytes += bytes;
            } else {
                t.read_hist.saturating_record(lat);
                t.reads += 1;
                t.read_bytes += bytes;
            }
        }
    }
}

const VERIFY_MAGIC: u64 = 0x4952_4f4e_5749_5245; // "IRONWIRE"
/// Bytes of the header a checksum does not cover: magic, LBA, generation,
/// then the CRC32C itself.
const HDR: usize = 24;

/// The verify pattern of one block: magic, LBA, generation, a CRC32C of
/// everything else, then bytes derived from LBA and generation. Any block
/// read back names itself and can be checked on its own.
fn fill_block(block: &mut [u8], lba: u64, gen: u32) {
    if block.len() < HDR {
        return;
    }
    let (head, body) = block.split_at_mut(HDR);
    let mut x = (lba ^ (u64::from(gen) << 40)).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in body.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        let n = chunk.len();
        chunk.copy_from_slice(b.get(..n).unwrap_or_default());
    }
    let mut h = [0u8; HDR];
    h[..8].copy_from_slice(&VERIFY_MAGIC.to_le_bytes());
    h[8..16].copy_from_slice(&lba.to_le_bytes());
    h[16..20].copy_from_slice(&gen.to_le_bytes());
    let mut c = checksum::Crc32c::new();
    c.update(&h[..20]);
    c.update(body);
    let crc = c.value();
    h[20..24].copy_from_slice(&crc.to_le_bytes());
    head.copy_from_slice(&h);
}

/// What a read block must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// The pattern of this generation.
    Generation(u32),
    /// A valid pattern of its LBA, any generation.
    AnyGeneration,
    /// A valid pattern if it carries the magic at all.
    IfPresent,
}

fn le64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8).and_then(|s| s.try_into().ok()).map_or(0, u64::from_le_bytes)
}

fn le32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4).and_then(|s| s.try_into().ok()).map_or(0, u32::from_le_bytes)
}

/// Checks one block read back; `Err` says what is wrong.
fn check_block(b: &[u8], lba: u64, want: Expect) -> Result<(), String> {
    if le64(b, 0) != VERIFY_MAGIC {
        return match want {
            Expect::IfPresent => Ok(()),
            _ => Err("no verify pattern (magic missing)".into()),
        };
    }
    let (named, gen, crc) = (le64(b, 8), le32(b, 16), le32(b, 20));
    if named != lba {
        return Err(format!("holds the pattern of LBA {named}"));
    }
    let body = b.get(HDR..).unwrap_or_default();
    let head = b.get(..20).unwrap_or_default();
    let mut c = checksum::Crc32c::new();
    c.update(head);
    c.update(body);
    let actual = c.value();
    if actual != crc {
        return Err(format!("checksum {actual:#010x} does not match the stored {crc:#010x}"));
    }
    match want {
        Expect::Generation(g) if g != gen => Err(format!("generation {gen} (expected {g}, a lost or stale write)")),
        _ => Ok(()),
    }
}

/// A job on one NVMe/TCP I/O queue: submissions are pipelined on the queue.
struct QueueJob {
    q: Queue,
    nsid: u32,
    qd: usize,
    w: Workload,
}

struct InFlight {
    submitted: Instant,
    io: Io,
}

impl QueueJob {
    async fn run(mut self) -> Result<Tally> {
        let io_bytes = self.w.io_bytes();
        let mut in_flight: FxHashMap<u16, InFlight> =
            FxHashMap::with_capacity_and_hasher(self.qd * 2, Default::default());
        let depth = self.w.depth(self.qd).min(self.q.depth());
        let mut now = Instant::now();
        loop {
            while self.q.outstanding() < depth {
                let Some(io) = self.w.next(now) else { break };
                let blocks = self.w.blocks_per_io;
                let cid = if io.write {
                    let mut data = self.q.buffer(io_bytes as usize);
                    data.resize(io_bytes as usize, 0);
                    self.w.fill(&io, &mut data);
                    self.q.submit(cmd::write(self.nsid, io.lba, blocks), data, 0)?
                } else {
                    self.q.submit(cmd::read(self.nsid, io.lba, blocks), Vec::new(), io_bytes)?
                };
                in_flight.insert(cid, InFlight { submitted: now, io });
            }
            if self.q.outstanding() == 0 {
                if self.w.drained(now) {
                    continue;
                }
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
            // A read that brought less than its length did not read it
            // (and verify would check only what came).
            if !f.io.write && c.data.len() != io_bytes as usize {
                return Err(Error::Protocol(format!(
                    "Read of {io_bytes} bytes completed with {} bytes of data",
                    c.data.len()
                )));
            }
            self.w.complete(&f.io, f.submitted, now, &c.data);
            self.q.recycle(c.data);
        }
        Ok(self.w.tally)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Workload {
        /// Picks until the workload picks a write.
        fn pick_write(&mut self) -> Io {
            loop {
                let io = self.pick();
                if io.write {
                    return io;
                }
                if let Some(s) = self.verify.as_mut().and_then(|v| v.slots.get_mut(io.slot as usize)) {
                    *s &= !BUSY;
                }
            }
        }
    }

    #[test]
    fn parses_fio_pattern_names() {
        assert_eq!("randread".parse(), Ok(Pattern::RandRead));
        assert_eq!("rw".parse(), Ok(Pattern::ReadWrite));
        assert!("sideways".parse::<Pattern>().is_err());
        assert_eq!(Pattern::RandRw.to_string(), "randrw");
    }

    #[test]
    fn verify_pattern_names_its_block_and_generation() {
        let mut a = vec![0u8; 512];
        let mut b = vec![0u8; 512];
        fill_block(&mut a, 7, 1);
        fill_block(&mut b, 8, 1);
        assert_ne!(a, b);
        assert_eq!(&a[8..16], &7u64.to_le_bytes());
        let mut again = vec![0u8; 512];
        fill_block(&mut again, 7, 1);
        assert_eq!(a, again);
        fill_block(&mut again, 7, 2);
        assert_ne!(a, again);
        assert_eq!(check_block(&a, 7, Expect::Generation(1)), Ok(()));
        assert_eq!(check_block(&a, 7, Expect::AnyGeneration), Ok(()));
    }

    #[test]
    fn verify_check_names_what_is_wrong() {
        let mut a = vec![0u8; 4096];
        fill_block(&mut a, 100, 3);
        assert!(check_block(&a, 101, Expect::AnyGeneration).unwrap_err().contains("LBA 100"));
        assert!(check_block(&a, 100, Expect::Generation(4)).unwrap_err().contains("generation 3"));
        let mut flipped = a.clone();
        flipped[2000] ^= 1;
        assert!(check_block(&flipped, 100, Expect::Generation(3)).unwrap_err().contains("checksum"));
        let zeros = vec![0u8; 4096];
        assert!(check_block(&zeros, 100, Expect::AnyGeneration).unwrap_err().contains("magic"));
        assert_eq!(check_block(&zeros, 100, Expect::IfPresent), Ok(()));
    }

    #[test]
    fn random_picks_are_uniform_aligned_and_reach_the_last_block() {
        // 16 I/Os of 8 blocks from byte 8192: LBAs 16, 24, .., 136.
        let opts = BenchOptions { pattern: Pattern::RandRw, read_percent: 70, offset: 8192, ..Default::default() };
        let mut w = plan(&BenchOptions { size: Some(64 << 10), ..opts }, 1, 512, 1 << 20).expect("plan").remove(0);
        let (mut hits, mut reads) = ([0u32; 16], 0u32);
        for _ in 0..32_000 {
            let io = w.pick();
            assert!(io.lba >= 16 && (io.lba - 16).is_multiple_of(8) && io.lba <= 136, "LBA {}", io.lba);
            hits[((io.lba - 16) / 8) as usize] += 1;
            reads += u32::from(!io.write);
        }
        assert!(hits.iter().all(|&n| (1_700..2_300).contains(&n)), "{hits:?}");
        assert!((21_800..23_000).contains(&reads), "{reads} reads of 32000 at --mix 70");
        let mut seq =
            plan(&BenchOptions { pattern: Pattern::Read, size: Some(16 << 10), ..Default::default() }, 1, 512, 1 << 20)
                .expect("plan")
                .remove(0);
        let lbas: Vec<u64> = (0..6).map(|_| seq.pick().lba).collect();
        assert_eq!(lbas, vec![0, 8, 16, 24, 0, 8], "sequential wraps at the range's end");
    }

    #[test]
    fn verify_picks_never_overlap_and_stay_in_the_job_slice() {
        let opts =
            BenchOptions { pattern: Pattern::RandRw, verify: true, block_size: 1024, qd: 8, ..Default::default() };
        let mut w = plan(&opts, 2, 512, 8 * 1024).expect("plan").pop().expect("job 1");
        assert_eq!((w.base, w.slots), (8, 4));
        assert_eq!(w.depth(8), 4);
        let picked: Vec<Io> = (0..4).map(|_| w.pick()).collect();
        let mut slots: Vec<u64> = picked.iter().map(|i| i.slot).collect();
        slots.sort_unstable();
        assert_eq!(slots, vec![0, 1, 2, 3], "four in flight take the four slots");
        assert!(picked.iter().all(|i| (8..16).contains(&i.lba)));
    }

    #[test]
    fn verify_catches_a_block_changed_after_its_write() {
        let opts =
            BenchOptions { pattern: Pattern::RandRw, verify: true, block_size: 512, qd: 1, ..Default::default() };
        let mut w = plan(&opts, 1, 512, 512).expect("plan").pop().expect("job");
        let t = Instant::now();
        let io = Io { write: true, slot: 0, lba: 0, gen: 5 };
        let mut data = vec![0u8; 512];
        w.fill(&io, &mut data);
        w.complete(&io, t, t, &[]);
        let read = Io { write: false, slot: 0, lba: 0, gen: 0 };
        w.complete(&read, t, t, &data);
        assert_eq!(w.tally.verify_errors, 0);
        data[300] ^= 0xff;
        w.complete(&read, t, t, &data);
        assert_eq!(w.tally.verify_errors, 1);
        assert_eq!(w.tally.first_verify_error.as_ref().map(|e| e.lba), Some(0));
    }

    #[test]
    fn verify_catches_a_lost_write_whose_block_holds_an_earlier_run_of_the_same_workload() {
        // Two runs of one command line (same seed, same range): the second
        // run's write is lost, so the block still holds what the first run
        // wrote there. The read must not take that for the second run's.
        let opts =
            BenchOptions { pattern: Pattern::RandRw, verify: true, block_size: 512, qd: 1, ..Default::default() };
        let t = Instant::now();
        let mut first = plan(&opts, 1, 512, 512).expect("plan").pop().expect("job");
        let io = first.pick_write();
        let mut on_disk = vec![0u8; 512];
        first.fill(&io, &mut on_disk);
        first.complete(&io, t, t, &[]);
        let mut second = plan(&opts, 1, 512, 512).expect("plan").pop().expect("job");
        let lost = second.pick_write();
        second.complete(&lost, t, t, &[]);
        let read = Io { write: false, slot: lost.slot, lba: lost.lba, gen: 0 };
        second.complete(&read, t, t, &on_disk);
        assert_eq!(second.tally.verify_errors, 1, "a block of the previous run passed for this run's write");
    }

    #[test]
    fn percentiles_come_from_the_histogram() {
        let mut h = new_histogram();
        for v in 1..=1000u64 {
            h.record(v * 1000).expect("record");
        }
        let l = Latency::from_histogram(&h);
        assert_eq!(l.min, Duration::from_micros(1));
        assert_eq!(l.max.as_micros(), 1000);
        // Three significant digits: within 0.1 %.
        let near = |d: Duration, us: f64| (d.as_secs_f64() * 1e6 - us).abs() <= us * 0.001 + 0.001;
        assert!(near(l.p50, 500.0), "{:?}", l.p50);
        assert!(near(l.p90, 900.0), "{:?}", l.p90);
        assert!(near(l.p99, 990.0), "{:?}", l.p99);
        assert!(near(l.p999, 999.0), "{:?}", l.p999);
        assert!(near(l.avg, 500.5), "{:?}", l.avg);
        assert_eq!(Latency::from_histogram(&new_histogram()), Latency::default());
    }

    #[test]
    fn ios_in_flight_as_the_ramp_ends_count_when_they_complete_in_the_window() {
        // A closed loop at QD 8 with a fixed 100 ms latency: 80 IOPS. The
        // ramp ends with 8 I/Os in flight; the window is 1 s plus the drain.
        let opts = BenchOptions {
            pattern: Pattern::RandRead,
            block_size: 4096,
            qd: 8,
            ramp: Duration::from_millis(500),
            runtime: Duration::from_secs(1),
            ..Default::default()
        };
        let mut w = plan(&opts, 1, 512, 1 << 30).expect("plan").pop().expect("job");
        let start = w.tally.finished;
        let lat = Duration::from_millis(100);
        let mut in_flight: Vec<(Instant, Io)> = (0..8u32).map(|i| (start + lat / 8 * i, w.pick())).collect();
        while let Some(k) = (0..in_flight.len()).min_by_key(|&k| in_flight[k].0) {
            let (submitted, io) = in_flight.swap_remove(k);
            let done = submitted + lat;
            w.complete(&io, submitted, done, &[]);
            w.tally.finished = done;
            if done < w.end {
                in_flight.push((done, w.pick()));
            }
        }
        let r = merge(&opts, &[w.tally], start);
        assert!((r.iops() - 80.0).abs() < 80.0 * 0.03, "{r}");
        assert_eq!(r.histogram.len(), r.ios);
    }

    /// A controller on a loopback socket that keeps nothing: every write
    /// succeeds, every read brings zeros and SUCCESS (with `short`, half of
    /// the data asked for).
    fn null_controller(short: bool) -> SocketAddr {
        use nvmf_tcp::target::{Event, TargetConfig, TargetConnection};
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        std::thread::spawn(move || {
            let Ok((mut s, _)) = listener.accept() else { return };
            let mut t = TargetConnection::<Vec<u8>>::new(TargetConfig::default());
            let (mut buf, mut out) = (vec![0u8; 64 << 10], Vec::new());
            while let Ok(n @ 1..) = s.read(&mut buf) {
                if t.handle_input(&buf[..n]).is_err() {
                    return;
                }
                while let Some(ev) = t.poll_event() {
                    let Event::Command { sqe, data } = ev else { continue };
                    let ok = nvme_spec::Cqe::new(sqe.cid.get(), nvme_spec::Status::SUCCESS, 0);
                    if data.is_some() {
                        t.send_response(ok);
                    } else {
                        let len = sqe.blocks() as usize * 512 / if short { 2 } else { 1 };
                        t.send_data(sqe.cid.get(), &vec![0; len], ok);
                    }
                }
                out.clear();
                t.take_transmit(&mut out);
                if s.write_all(&out).is_err() {
                    return;
                }
            }
        });
        addr
    }

    #[test]
    fn a_read_completing_with_less_data_than_asked_fails_the_run() {
        let opts = BenchOptions {
            pattern: Pattern::RandRead,
            qd: 4,
            runtime: Duration::from_millis(50),
            ..Default::default()
        };
        let r = run_on_null_controller(null_controller(true), &opts);
        assert!(
            r.is_err(),
            "4 KiB reads that brought 2 KiB each counted: {}",
            r.map(|r| r.to_string()).unwrap_or_default()
        );
    }

    #[test]
    fn an_io_of_more_blocks_than_one_command_moves_is_refused() {
        // 65537 blocks of 512 bytes: NLB would wrap to 0 (one block) while
        // the data length says 32 MiB + 512.
        let opts = BenchOptions { block_size: (MAX_NLB + 1) * 512, qd: 1, ..Default::default() };
        let e = run_on_null_controller(null_controller(false), &opts).expect_err("NLB cannot say 65537");
        assert!(e.to_string().contains("65536 blocks"), "{e}");
    }

    /// Runs `opts` on one queue of a controller from [`null_controller`]
    /// (a namespace of 2^20 512-byte blocks).
    fn run_on_null_controller(addr: SocketAddr, opts: &BenchOptions) -> Result<Report> {
        reactor::Runtime::new(reactor::Config::default()).expect("runtime").block_on(async move {
            let mut q = Queue::connect(addr, crate::queue::QueueOptions::default()).await?;
            q.set_depth(opts.qd as usize);
            let ns = NamespaceInfo { nsid: 1, blocks: 1 << 20, capacity: 1 << 20, block_size: 512, raw: Vec::new() };
            run_on_queues(vec![q], &ns, opts).await
        })
    }

    #[test]
    fn write_verify_fails_against_a_controller_that_keeps_nothing() {
        // Every write acknowledged, nothing kept: a write pass with verify
        // must read its blocks back and fail, not pass for never reading.
        let opts = BenchOptions {
            pattern: Pattern::Write,
            verify: true,
            qd: 4,
            size: Some(64 << 10),
            runtime: Duration::from_millis(50),
            ..Default::default()
        };
        let r = run_on_null_controller(null_controller(false), &opts).expect("run");
        assert!(r.writes > 0, "{r}");
        assert_eq!(r.reads, 0, "the read-back is not load: {r}");
        assert_eq!(r.verify_checked, 16 * 8, "each of the 16 I/Os written read back: {r}");
        assert_eq!(r.verify_errors, r.verify_checked, "{r}");
    }

    fn report(ios: u64, bytes: u64, secs: u64) -> Report {
        let mut r = Report::empty(&BenchOptions { pattern: Pattern::Read, ..Default::default() });
        r.jobs = 1;
        r.ios = ios;
        r.reads = ios;
        r.bytes = bytes;
        r.read_bytes = bytes;
        r.elapsed = Duration::from_secs(secs);
        r
    }

    #[test]
    fn bandwidth_uses_decimal_gigabits_and_binary_mebibytes() {
        let r = report(1000, 125_000_000, 1);
        assert!((r.gbit_per_s() - 1.0).abs() < 1e-9);
        assert!((r.mib_per_s() - 119.209).abs() < 1e-3);
        assert!((r.iops() - 1000.0).abs() < 1e-9);
        assert_eq!(report(0, 0, 0).iops(), 0.0);
    }

    #[test]
    fn merged_reports_add_counts_and_keep_the_longer_window() {
        let mut a = report(1000, 4_096_000, 2);
        a.read_histogram.record(10_000).expect("record");
        let mut b = report(500, 2_048_000, 1);
        b.histogram.record(30_000).expect("record");
        b.first_verify_error = Some(VerifyError { lba: 9, reason: "x".into() });
        a.merge(&b);
        assert_eq!((a.jobs, a.ios, a.reads, a.bytes), (2, 1500, 1500, 6_144_000));
        assert_eq!(a.elapsed, Duration::from_secs(2));
        assert_eq!(a.first_verify_error.as_ref().map(|e| e.lba), Some(9));
        assert!((a.iops() - 750.0).abs() < 1e-9);
    }
}
