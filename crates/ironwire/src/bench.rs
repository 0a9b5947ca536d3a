//! `ironwire bench`: the load generator's command line. `run` drives a
//! remote NVMe/TCP or iSCSI target, `local` the same workload in-process against a
//! device, `ceiling` a bare TCP request/response loop; all three print the
//! same result (human table or fio-like JSON, see docs/bench.md).
//!
//! Threads: without `--cpus` every job runs on one thread (one reactor
//! runtime). With `--cpus LIST` the load runs on min(cpus, jobs) threads,
//! thread i pinned to the i-th CPU, jobs dealt out among them; for `run`
//! each thread connects its own controller with its jobs as I/O queues
//! (iSCSI: logs in one session per job).
//! The main thread only samples CPU time and prints the progress line.
//! This module measures and formats; the workload is `initiator::bench`'s.

mod report;
mod svg;

use crate::cpu::{proc_cpu, proc_cpu_times, self_cpu};
use anyhow::{bail, Context, Result};
use blockdev::{BlockDevice, Device};
use clap::{ArgGroup, Args, Subcommand, ValueEnum};
use hdrhistogram::Histogram;
use initiator::bench::{self, ceiling, BenchOptions, IscsiTarget, Pattern, Progress, Report};
use initiator::Transport;
use serde_json::{json, Value};
use std::io::{IsTerminal, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Load a remote NVMe-oF (--nvme, --nqn; NVMe/TCP, or NVMe/RDMA over
    /// iWARP with --transport rdma) or iSCSI (--iscsi, --iqn) target.
    Run(Box<RunArgs>),
    /// The same workload in-process against a device (no network).
    Local(LocalArgs),
    /// A bare TCP request/response loop over loopback with the same message
    /// sizes: what the network path allows.
    Ceiling(CeilingArgs),
    /// The reference papers' matrix against a target: bandwidth and
    /// %CPU/Gbps against I/O size, 4K IOPS, 4K QD1 latency local against
    /// remote, optional jitter test; Markdown + SVG plots.
    Report(Box<report::ReportArgs>),
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Bytes of the range I/O goes to (default: to the end of the namespace
    /// or LUN).
    #[arg(long, value_parser = parse_bytes)]
    size: Option<u64>,
    #[command(flatten)]
    range: RangeArgs,
    #[command(flatten)]
    load: LoadArgs,
}

/// The remote target: NVMe/TCP, NVMe/RDMA over iWARP, or iSCSI.
#[derive(Args, Clone)]
#[command(group(ArgGroup::new("target").required(true).args(["nvme", "iscsi"])))]
pub struct TargetArgs {
    /// NVMe-oF: controller address, IP:PORT (port 4420 if left out).
    #[arg(long, requires = "nqn")]
    nvme: Option<String>,
    /// NVMe-oF: subsystem NQN.
    #[arg(long, requires = "nvme")]
    nqn: Option<String>,
    /// NVMe-oF: transport, `tcp` or `rdma` (NVMe/RDMA over iWARP, done in
    /// software over TCP).
    #[arg(long, value_enum, default_value_t = TransportArg::Tcp, requires = "nvme")]
    transport: TransportArg,
    /// NVMe/RDMA: do not ask for MPA CRC32C on FPDUs (the target may still
    /// ask for it).
    #[arg(long)]
    no_crc: bool,
    /// NVMe-oF: host NQN.
    #[arg(long, default_value = DEFAULT_HOSTNQN)]
    hostnqn: String,
    /// NVMe-oF: ask each queue's Connect to disable SQ flow control (as
    /// nvme-cli's `--disable-sqflow` and libnvme's connect-all when the
    /// discovery log allows it); an NVMe/TCP controller may then end a read
    /// with its data (C2HData SUCCESS) and send no response capsule.
    #[arg(long, requires = "nvme")]
    disable_sqflow: bool,
    /// NVMe-oF: namespace ID.
    #[arg(long, default_value_t = 1)]
    nsid: u32,
    /// iSCSI: target portal, IP:PORT (port 3260 if left out); each job is
    /// one session.
    #[arg(long, requires = "iqn")]
    iscsi: Option<String>,
    /// iSCSI: target name.
    #[arg(long, requires = "iscsi")]
    iqn: Option<String>,
    /// iSCSI: logical unit.
    #[arg(long, default_value_t = 0, requires = "iscsi")]
    lun: u64,
    /// iSCSI: initiator name.
    #[arg(long, default_value = DEFAULT_INITIATOR, requires = "iscsi")]
    initiator: String,
    /// iSCSI: CHAP user name.
    #[arg(long, requires_all = ["iscsi", "chap_secret"])]
    chap_user: Option<String>,
    /// iSCSI: CHAP secret.
    #[arg(long, requires_all = ["iscsi", "chap_user"])]
    chap_secret: Option<String>,
    /// Header digests (CRC32C).
    #[arg(long)]
    hdgst: bool,
    /// Data digests (CRC32C).
    #[arg(long)]
    ddgst: bool,
}

/// `--transport`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum TransportArg {
    /// NVMe/TCP.
    Tcp,
    /// NVMe/RDMA over iWARP.
    Rdma,
}

const DEFAULT_HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:ironwire-bench";
const DEFAULT_INITIATOR: &str = "iqn.2026-11.io.ironwire:bench";

impl TargetArgs {
    /// The header, the options with the target filled in, and the engine
    /// that loads it.
    fn engine(&self, common: BenchOptions) -> Result<(Header, BenchOptions, Engine)> {
        let common = BenchOptions { header_digest: self.hdgst, data_digest: self.ddgst, ..common };
        if let (Some(portal), Some(iqn)) = (&self.iscsi, &self.iqn) {
            let addr = resolve(portal, 3260)?;
            let target = IscsiTarget {
                iqn: iqn.clone(),
                lun: self.lun,
                initiator_name: self.initiator.clone(),
                chap: self.chap_user.clone().zip(self.chap_secret.clone()),
            };
            let header = Header { mode: "run", target: format!("iscsi {addr} {iqn} lun {}", self.lun) };
            let engine: Engine = Arc::new(move |o| Ok(block_on(bench::run_iscsi(&target, &o))??));
            return Ok((header, BenchOptions { addr, ..common }, engine));
        }
        let (Some(nvme), Some(nqn)) = (&self.nvme, &self.nqn) else {
            bail!("give --nvme ADDR --nqn NQN or --iscsi PORTAL --iqn IQN");
        };
        let addr = resolve(nvme, 4420)?;
        let transport = self.transport()?;
        let base = BenchOptions {
            addr,
            transport,
            subnqn: nqn.clone(),
            hostnqn: self.hostnqn.clone(),
            nsid: self.nsid,
            disable_sq_flow: self.disable_sqflow,
            ..common
        };
        let engine: Engine = Arc::new(|o| Ok(block_on(bench::run(&o))??));
        let name = match transport {
            Transport::Tcp => "nvme",
            Transport::Rdma { crc: true } => "nvme-rdma",
            Transport::Rdma { crc: false } => "nvme-rdma (crc off)",
        };
        let header = Header { mode: "run", target: format!("{name} {addr} {nqn} nsid {}", self.nsid) };
        Ok((header, base, engine))
    }

    fn transport(&self) -> Result<Transport> {
        match self.transport {
            TransportArg::Tcp if self.no_crc => bail!("--no-crc is for --transport rdma"),
            TransportArg::Tcp => Ok(Transport::Tcp),
            TransportArg::Rdma if self.hdgst || self.ddgst => {
                bail!("--hdgst/--ddgst are NVMe/TCP digests; NVMe/RDMA over iWARP has MPA CRC (on unless --no-crc)")
            }
            TransportArg::Rdma => Ok(Transport::Rdma { crc: !self.no_crc }),
        }
    }

    /// The flags that name this target on a command line (a CHAP secret
    /// shows as `***`).
    fn flags(&self) -> String {
        let mut f = Vec::new();
        if let (Some(a), Some(n)) = (&self.nvme, &self.nqn) {
            f.push(format!("--nvme {a} --nqn {n}"));
            if self.transport == TransportArg::Rdma {
                f.push("--transport rdma".into());
            }
            if self.no_crc {
                f.push("--no-crc".into());
            }
            if self.hostnqn != DEFAULT_HOSTNQN {
                f.push(format!("--hostnqn {}", self.hostnqn));
            }
            if self.nsid != 1 {
                f.push(format!("--nsid {}", self.nsid));
            }
            if self.disable_sqflow {
                f.push("--disable-sqflow".into());
            }
        }
        if let (Some(p), Some(i)) = (&self.iscsi, &self.iqn) {
            f.push(format!("--iscsi {p} --iqn {i}"));
            if self.lun != 0 {
                f.push(format!("--lun {}", self.lun));
            }
            if self.initiator != DEFAULT_INITIATOR {
                f.push(format!("--initiator {}", self.initiator));
            }
            if let Some(u) = &self.chap_user {
                f.push(format!("--chap-user {u} --chap-secret '***'"));
            }
        }
        if self.hdgst {
            f.push("--hdgst".into());
        }
        if self.ddgst {
            f.push("--ddgst".into());
        }
        f.join(" ")
    }
}

#[derive(Args)]
pub struct LocalArgs {
    /// null | ram | file:PATH | block:PATH
    #[arg(long)]
    device: String,
    /// Device size (null and ram; file devices are created or extended to
    /// it; default for files: their length).
    #[arg(long, value_parser = parse_bytes)]
    size: Option<u64>,
    /// Logical block size of the device.
    #[arg(long, default_value_t = 512)]
    block_size: u32,
    /// I/O buffer memory each load thread registers with io_uring, as the
    /// daemon's reactors do (0: none).
    #[arg(long, default_value = "16MiB", value_parser = parse_bytes)]
    registered_buffers: u64,
    #[command(flatten)]
    range: RangeArgs,
    #[command(flatten)]
    load: LoadArgs,
}

#[derive(Args)]
pub struct CeilingArgs {
    /// Pin the echo peer's thread to this CPU.
    #[arg(long)]
    peer_cpu: Option<usize>,
    #[command(flatten)]
    load: LoadArgs,
}

#[derive(Args)]
struct RangeArgs {
    /// First byte of the range I/O goes to.
    #[arg(long, default_value = "0", value_parser = parse_bytes)]
    offset: u64,
    /// Write self-describing blocks and check every read, and after the
    /// load read back every block written; exits non-zero on the first
    /// corrupt block's report. With read/randread every block read must
    /// hold a pattern an earlier verify run wrote.
    #[arg(long)]
    verify: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Human,
    Json,
}

#[derive(Args)]
struct LoadArgs {
    /// read | write | randread | randwrite | rw | randrw
    #[arg(long, default_value = "randread")]
    rw: Pattern,
    /// Percentage of reads in rw / randrw.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    mix: u8,
    /// Bytes per I/O (4k, 128k, 1m).
    #[arg(long, default_value = "4k", value_parser = parse_bytes)]
    bs: u64,
    /// Outstanding I/Os per job.
    #[arg(long, default_value_t = 32)]
    qd: u32,
    /// Jobs: I/O queues or iSCSI sessions (run), workers (local) or
    /// connections (ceiling).
    #[arg(long, default_value_t = 1)]
    jobs: u16,
    /// Measured seconds.
    #[arg(long, default_value_t = 10.0)]
    time: f64,
    /// Seconds run before measuring.
    #[arg(long, default_value_t = 0.0)]
    ramp: f64,
    /// CPUs to run the load on, e.g. "2" or "2,3" or "2-3": one thread per
    /// CPU (at most one per job), pinned.
    #[arg(long, value_parser = parse_cpus, default_value = "")]
    cpus: CpuList,
    /// PID of the target, to report its CPU use over the run.
    #[arg(long, conflicts_with = "target_ctl")]
    target_pid: Option<u32>,
    /// Control socket of an ironwire target: its CPU use over the run from
    /// the daemon's own `stats`.
    #[arg(long)]
    target_ctl: Option<PathBuf>,
    /// Random seed.
    #[arg(long, default_value_t = 0x1e0_f00d)]
    seed: u64,
    /// human | json
    #[arg(long, value_enum, default_value = "human")]
    output: Output,
}

#[derive(Clone, Debug, Default)]
struct CpuList(Vec<usize>);

/// Parses "4096", "4k", "4KiB", "1GiB", "2m" (binary multiples).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.strip_suffix("ib").or_else(|| t.strip_suffix('b')).unwrap_or(&t);
    let (num, shift) = match t.char_indices().last() {
        Some((i, 'k')) => (&t[..i], 10),
        Some((i, 'm')) => (&t[..i], 20),
        Some((i, 'g')) => (&t[..i], 30),
        Some((i, 't')) => (&t[..i], 40),
        _ => (t, 0),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .ok_or_else(|| format!("{s:?} is not a size"))
}

fn parse_cpus(s: &str) -> Result<CpuList, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("{part:?} is not a CPU or a range of CPUs");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<usize>().map_err(|_| bad())?, b.parse::<usize>().map_err(|_| bad())?);
                if a > b {
                    return Err(bad());
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| bad())?),
        }
    }
    Ok(CpuList(out))
}

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) -> Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes inside the set, and
    // sched_setaffinity reads size_of::<cpu_set_t>() bytes of it.
    let ok = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    };
    if !ok {
        bail!("cannot pin to CPU {cpu}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// CPU time as a percentage of one CPU over `wall`.
pub fn cpu_percent(cpu: Duration, wall: Duration) -> f64 {
    bench::per_second(cpu.as_secs_f64() * 100.0, wall)
}

/// %CPU spent per Gbit/s moved (0 when nothing moved).
pub fn cpu_per_gbps(cpu_percent: f64, gbps: f64) -> f64 {
    if gbps > 0.0 {
        cpu_percent / gbps
    } else {
        0.0
    }
}

#[derive(Clone, Copy)]
struct CpuSample {
    at: Instant,
    usr: Duration,
    sys: Duration,
    /// User and system CPU of an in-process thread that is not load (the
    /// ceiling peer).
    exclude: (Duration, Duration),
    target: Option<Duration>,
}

/// Where the target's CPU time comes from.
#[derive(Clone, Debug, Default)]
pub enum TargetCpu {
    /// Not measured.
    #[default]
    None,
    /// A `/proc/.../stat` file (`--target-pid`, or the ceiling peer's
    /// thread).
    Proc(String),
    /// An ironwire daemon's control socket (`--target-ctl`): its `stats`.
    Ctl(PathBuf),
}

impl TargetCpu {
    /// From `--target-pid` (preferred) or `--target-ctl`.
    fn new(pid: Option<u32>, ctl: Option<&PathBuf>) -> TargetCpu {
        match (pid, ctl) {
            (Some(pid), _) => TargetCpu::Proc(format!("/proc/{pid}/stat")),
            (None, Some(sock)) => TargetCpu::Ctl(sock.clone()),
            (None, None) => TargetCpu::None,
        }
    }

    fn read(&self) -> Option<Duration> {
        match self {
            TargetCpu::None => None,
            TargetCpu::Proc(path) => proc_cpu(path),
            TargetCpu::Ctl(sock) => match crate::control::request(sock, "stats") {
                Ok(reply) => crate::cpu::parse_stats_cpu(&reply),
                Err(e) => {
                    log::warn!("target CPU from {}: {e:#}", sock.display());
                    None
                }
            },
        }
    }
}

struct Sampler {
    target: TargetCpu,
    exclude: Option<String>,
}

impl Sampler {
    fn sample(&self) -> CpuSample {
        let (usr, sys) = self_cpu();
        CpuSample {
            at: Instant::now(),
            usr,
            sys,
            exclude: self.exclude.as_deref().and_then(proc_cpu_times).unwrap_or_default(),
            target: self.target.read(),
        }
    }
}

/// CPU use over the measured window.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuUse {
    wall: Duration,
    usr_percent: f64,
    sys_percent: f64,
    load_percent: f64,
    target_percent: Option<f64>,
}

fn cpu_use(a: &CpuSample, b: &CpuSample) -> CpuUse {
    let wall = b.at.saturating_duration_since(a.at);
    // The excluded thread's user and system time come out of the process's.
    let ex_usr = b.exclude.0.saturating_sub(a.exclude.0);
    let ex_sys = b.exclude.1.saturating_sub(a.exclude.1);
    let usr = cpu_percent(b.usr.saturating_sub(a.usr).saturating_sub(ex_usr), wall);
    let sys = cpu_percent(b.sys.saturating_sub(a.sys).saturating_sub(ex_sys), wall);
    let excluded = cpu_percent(ex_usr + ex_sys, wall);
    let target = match (a.target, b.target) {
        (Some(x), Some(y)) => Some(cpu_percent(y.saturating_sub(x), wall)),
        _ => None,
    };
    CpuUse {
        wall,
        usr_percent: usr,
        sys_percent: sys,
        load_percent: usr + sys,
        target_percent: target.or_else(|| (excluded > 0.0).then_some(excluded)),
    }
}

/// What a thread runs: its share of the options, on its own runtime.
type Engine = Arc<dyn Fn(BenchOptions) -> Result<Report> + Send + Sync>;

fn block_on<F: std::future::Future>(f: F) -> Result<F::Output> {
    let mut rt = reactor::Runtime::new(reactor::Config::default()).context("cannot start an io_uring runtime")?;
    Ok(rt.block_on(f))
}

struct Header {
    mode: &'static str,
    target: String,
}

pub fn main(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Run(a) => {
            let common =
                BenchOptions { size: a.size, offset: a.range.offset, verify: a.range.verify, ..options(&a.load)? };
            let (header, base, engine) = a.target.engine(common)?;
            execute(&header, &a.load, base, engine, None)
        }
        BenchCommand::Local(a) => {
            let dev = Arc::new(open_device(&a.device, a.size, a.block_size)?);
            let base = BenchOptions { offset: a.range.offset, verify: a.range.verify, ..options(&a.load)? };
            let header =
                Header { mode: "local", target: format!("{} ({} bytes)", a.device, dev.geometry().size_bytes()) };
            execute(&header, &a.load, base, local_engine(dev, a.registered_buffers), None)
        }
        BenchCommand::Ceiling(a) => {
            let peer = EchoPeer::spawn(a.peer_cpu)?;
            let base = BenchOptions { addr: peer.addr, ..options(&a.load)? };
            let header = Header { mode: "ceiling", target: format!("TCP echo peer {}", peer.addr) };
            execute(&header, &a.load, base, ceiling_engine(), Some(peer.stat.clone()))
        }
        BenchCommand::Report(a) => report::main(*a),
    }
}

/// The ceiling's echo peer, on its own (optionally pinned) thread.
pub struct EchoPeer {
    addr: SocketAddr,
    /// The peer thread's `/proc/self/task/TID/stat`.
    stat: String,
}

impl EchoPeer {
    fn spawn(cpu: Option<usize>) -> Result<EchoPeer> {
        let tid = Arc::new(AtomicI32::new(0));
        let t = tid.clone();
        let peer = ceiling::Peer::spawn(move || {
            // SAFETY: gettid has no preconditions.
            t.store(unsafe { libc::gettid() }, Ordering::Relaxed);
            if let Some(cpu) = cpu {
                if let Err(e) = pin_to(cpu) {
                    log::warn!("ceiling peer: {e:#}");
                }
            }
        })
        .context("starting the echo peer")?;
        let start = Instant::now();
        while tid.load(Ordering::Relaxed) == 0 && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(EchoPeer { addr: peer.addr, stat: format!("/proc/self/task/{}/stat", tid.load(Ordering::Relaxed)) })
    }
}

/// Runs the workload in-process on `dev`, each load thread with
/// `registered` bytes of registered I/O buffers (as a reactor of the daemon).
fn local_engine(dev: Arc<Device>, registered: u64) -> Engine {
    Arc::new(move |o| {
        let dev = dev.clone();
        Ok(block_on(async move {
            if registered > 0 {
                let bytes = usize::try_from(registered).unwrap_or(usize::MAX);
                if let Err(e) = blockdev::register_buffers(bytes) {
                    log::warn!("bench local: no registered buffers ({e})");
                }
            }
            bench::run_local(dev, &o).await
        })??)
    })
}

fn ceiling_engine() -> Engine {
    Arc::new(|o| Ok(block_on(ceiling::run(&o))??))
}

fn resolve(s: &str, default_port: u16) -> Result<SocketAddr> {
    let with_port = if s.contains(':') && !s.ends_with(']') { s.to_string() } else { format!("{s}:{default_port}") };
    with_port
        .to_socket_addrs()
        .with_context(|| format!("resolving {s}"))?
        .next()
        .with_context(|| format!("{s} has no address"))
}

fn open_device(spec: &str, size: Option<u64>, block_size: u32) -> Result<Device> {
    let dev = match spec.split_once(':') {
        None if spec == "null" => Device::null("bench", size.unwrap_or(1 << 30), block_size),
        None if spec == "ram" => Device::ram("bench", size.unwrap_or(1 << 30), block_size),
        Some(("file", p)) => Device::file("bench", &PathBuf::from(p), size, block_size),
        Some(("block", p)) => Device::block("bench", &PathBuf::from(p), Some(block_size)),
        _ => bail!("--device {spec:?} is not one of null, ram, file:PATH, block:PATH"),
    };
    dev.with_context(|| format!("opening device {spec}"))
}

fn options(l: &LoadArgs) -> Result<BenchOptions> {
    if !(l.time > 0.0 && l.time.is_finite() && l.ramp >= 0.0 && l.ramp.is_finite()) {
        bail!("--time must be > 0 and --ramp >= 0 seconds");
    }
    Ok(BenchOptions {
        pattern: l.rw,
        read_percent: l.mix,
        block_size: u32::try_from(l.bs).context("--bs is too large")?,
        qd: l.qd,
        jobs: l.jobs,
        runtime: Duration::from_secs_f64(l.time),
        ramp: Duration::from_secs_f64(l.ramp),
        seed: l.seed,
        ..BenchOptions::default()
    })
}

/// Jobs of each thread: `jobs` dealt over `threads`.
fn split_jobs(jobs: u16, threads: usize) -> Vec<u16> {
    let threads = threads.clamp(1, usize::from(jobs).max(1));
    let t = threads as u16;
    (0..t).map(|i| jobs / t + u16::from(i < jobs % t)).collect()
}

fn execute(h: &Header, l: &LoadArgs, base: BenchOptions, engine: Engine, exclude: Option<String>) -> Result<()> {
    let how = Measure {
        cpus: &l.cpus.0,
        target: TargetCpu::new(l.target_pid, l.target_ctl.as_ref()),
        progress: l.output == Output::Human,
    };
    let verify = base.verify;
    let m = how.run(base, engine, exclude)?;
    let r = Results { mode: h.mode, target: &h.target, threads: m.threads, report: &m.report, cpu: m.cpu };
    match l.output {
        Output::Human => println!("{}", r.human()),
        Output::Json => println!("{}", serde_json::to_string_pretty(&r.json()).unwrap_or_default()),
    }
    let report = &m.report;
    if report.verify_errors > 0 {
        let first = report.first_verify_error.as_ref().map(|e| format!(", first at {e}")).unwrap_or_default();
        bail!("verify: {} corrupt blocks{first}", report.verify_errors);
    }
    if verify && report.verify_checked > 0 {
        let (checked, unwritten) = (report.verify_checked, report.verify_unwritten);
        if checked == unwritten {
            bail!(
                "verify: none of the {checked} blocks read holds a pattern: they were never written (zeros), not \
                 corrupt; write the range first with a writing --verify run"
            );
        }
        let line =
            format!("verify OK: {} blocks checked, none corrupt, {unwritten} never written", checked - unwritten);
        match l.output {
            Output::Human => println!("{line}"),
            Output::Json => eprintln!("{line}"),
        }
    }
    Ok(())
}

/// How to run one measurement.
pub struct Measure<'a> {
    /// CPUs of the load threads (empty: one unpinned thread).
    pub cpus: &'a [usize],
    /// Where the target's CPU comes from.
    pub target: TargetCpu,
    /// Print the progress line on stderr.
    pub progress: bool,
}

/// One measurement's outcome.
pub struct Measured {
    pub report: Report,
    pub cpu: CpuUse,
    pub threads: usize,
}

impl Measure<'_> {
    /// Runs `engine` over the load threads and measures CPU over the window
    /// after the ramp, up to the end of the I/O (a logout or disconnect
    /// after it is not the workload's). `exclude` is an in-process thread
    /// whose CPU is the target's rather than the load's (the ceiling peer).
    fn run(&self, base: BenchOptions, engine: Engine, exclude: Option<String>) -> Result<Measured> {
        let shares = split_jobs(base.jobs, self.cpus.len());
        let mut threads = Vec::new();
        let mut progress = Vec::new();
        let mut job_base = 0u16;
        for (i, &jobs) in shares.iter().enumerate() {
            let p = Arc::new(Progress::default());
            progress.push(p.clone());
            let o = BenchOptions { jobs, job_base, job_total: base.jobs, progress: Some(p), ..base.clone() };
            job_base += jobs;
            let cpu = self.cpus.get(i).copied();
            let engine = engine.clone();
            threads.push(std::thread::Builder::new().name(format!("bench-{i}")).spawn(move || {
                if let Some(c) = cpu {
                    pin_to(c)?;
                }
                engine(o)
            })?);
        }
        let target = if exclude.is_some() { TargetCpu::None } else { self.target.clone() };
        let sampler = Sampler { target, exclude };
        let tty = std::io::stderr().is_terminal();
        let (mut t0, mut window_start): (Option<Instant>, Option<CpuSample>) = (None, None);
        let mut window_end: Option<CpuSample> = None;
        let io_over = || progress.iter().zip(&shares).all(|(p, &jobs)| p.finished() >= u64::from(jobs));
        let (mut last_ios, mut last_bytes, mut next_tick) = (0u64, 0u64, Instant::now());
        while threads.iter().any(|t| !t.is_finished()) {
            std::thread::sleep(Duration::from_millis(5));
            let now = Instant::now();
            if t0.is_none() && progress.iter().all(|p| p.started()) {
                t0 = Some(now);
                next_tick = now + Duration::from_secs(1);
            }
            let Some(start) = t0 else { continue };
            if window_start.is_none() && now >= start + base.ramp {
                window_start = Some(sampler.sample());
            }
            if window_start.is_some() && window_end.is_none() && io_over() {
                window_end = Some(sampler.sample());
            }
            if self.progress && now >= next_tick {
                let (ios, bytes) = progress.iter().fold((0, 0), |(i, b), p| (i + p.ios(), b + p.bytes()));
                let secs = now.duration_since(start).as_secs();
                let phase = if now < start + base.ramp { "ramp" } else { "run " };
                let line = format!(
                    "[{secs:>4} s] {phase} IOPS {:>10.0}  BW {:>8.3} Gbit/s ({:>9.1} MiB/s)",
                    (ios - last_ios) as f64,
                    (bytes - last_bytes) as f64 * 8.0 / 1e9,
                    (bytes - last_bytes) as f64 / 1_048_576.0
                );
                if tty {
                    eprint!("\r{line}");
                } else {
                    eprintln!("{line}");
                }
                let _ = std::io::stderr().flush();
                (last_ios, last_bytes) = (ios, bytes);
                next_tick += Duration::from_secs(1);
            }
        }
        let end = window_end.unwrap_or_else(|| sampler.sample());
        if self.progress && tty && t0.is_some() {
            eprintln!();
        }
        let mut report: Option<Report> = None;
        for t in threads {
            let r = t.join().map_err(|_| anyhow::anyhow!("a load thread panicked"))??;
            match &mut report {
                None => report = Some(r),
                Some(all) => all.merge(&r),
            }
        }
        let report = report.context("no load thread ran")?;
        let cpu = window_start.map(|a| cpu_use(&a, &end)).unwrap_or_default();
        Ok(Measured { report, cpu, threads: shares.len() })
    }
}

struct Results<'a> {
    mode: &'a str,
    target: &'a str,
    threads: usize,
    report: &'a Report,
    cpu: CpuUse,
}

/// fio's default `percentile_list`.
const PERCENTILES: [f64; 17] =
    [1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99];

/// fio's `lat_ns` / `clat_ns` object of one histogram.
fn lat_json(h: &Histogram<u64>) -> Value {
    if h.is_empty() {
        return json!({ "min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0 });
    }
    let pct: serde_json::Map<String, Value> =
        PERCENTILES.iter().map(|&p| (format!("{p:.6}"), json!(h.value_at_percentile(p)))).collect();
    json!({ "min": h.min(), "max": h.max(), "mean": h.mean(), "stddev": h.stdev(), "N": h.len(), "percentile": pct })
}

/// fio's per-direction object.
fn dir_json(ios: u64, bytes: u64, elapsed: Duration, h: &Histogram<u64>) -> Value {
    let bw = bench::per_second(bytes as f64, elapsed);
    let lat = lat_json(h);
    json!({
        "io_bytes": bytes,
        "io_kbytes": bytes / 1024,
        "bw_bytes": bw.round() as u64,
        "bw": (bw / 1024.0).round() as u64,
        "iops": bench::per_second(ios as f64, elapsed),
        "runtime": elapsed.as_millis() as u64,
        "total_ios": ios,
        "slat_ns": { "min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0 },
        "clat_ns": lat.clone(),
        "lat_ns": lat,
    })
}

impl Results<'_> {
    fn gbps(&self) -> f64 {
        self.report.gbit_per_s()
    }

    fn json(&self) -> Value {
        let r = self.report;
        let c = &self.cpu;
        let first = r.first_verify_error.as_ref().map(|e| json!({ "lba": e.lba, "reason": e.reason }));
        json!({
            "fio version": "ironwire-bench",
            "ironwire version": env!("CARGO_PKG_VERSION"),
            "mode": self.mode,
            "target": self.target,
            "global options": {
                "rw": r.pattern.to_string(),
                "bs": r.block_size,
                "iodepth": r.qd,
                "numjobs": r.jobs,
                "threads": self.threads,
            },
            "jobs": [{
                "jobname": format!("ironwire-bench-{}", self.mode),
                "groupid": 0,
                "error": 0,
                "job_runtime": r.elapsed.as_millis() as u64,
                "elapsed": r.elapsed.as_secs(),
                "read": dir_json(r.reads, r.read_bytes, r.elapsed, &r.read_histogram),
                "write": dir_json(r.writes, r.write_bytes, r.elapsed, &r.write_histogram),
                "usr_cpu": c.usr_percent,
                "sys_cpu": c.sys_percent,
                "verify_errors": r.verify_errors,
                "verify_checked": r.verify_checked,
                "verify_unwritten": r.verify_unwritten,
                "first_verify_error": first,
            }],
            "ironwire": {
                "ios": r.ios,
                "bytes": r.bytes,
                "iops": r.iops(),
                "gbit_per_s": self.gbps(),
                "mib_per_s": r.mib_per_s(),
                "lat_ns": lat_json(&r.histogram),
                "cpu_window_ms": c.wall.as_millis() as u64,
                "load_cpu_percent": c.load_percent,
                "load_cpu_percent_per_gbps": cpu_per_gbps(c.load_percent, self.gbps()),
                "target_cpu_percent": c.target_percent,
                "target_cpu_percent_per_gbps": c.target_percent.map(|t| cpu_per_gbps(t, self.gbps())),
            },
        })
    }

    fn human(&self) -> String {
        let r = self.report;
        let c = &self.cpu;
        let mut s = format!("ironwire bench {}: {} ({} thread(s))\n{r}\n", self.mode, self.target, self.threads);
        if r.reads > 0 && r.writes > 0 {
            for (name, ios, h) in [("read", r.reads, &r.read_histogram), ("write", r.writes, &r.write_histogram)] {
                let l = bench::Latency::from_histogram(h);
                s += &format!(
                    "  {name:<5}: IOPS={:.0} lat avg={:.1} p99={:.1} usec\n",
                    bench::per_second(ios as f64, r.elapsed),
                    l.avg.as_secs_f64() * 1e6,
                    l.p99.as_secs_f64() * 1e6
                );
            }
        }
        s += &format!(
            "  cpu: load {:.1}% (usr {:.1}%, sys {:.1}%), {:.2} %CPU/Gbps",
            c.load_percent,
            c.usr_percent,
            c.sys_percent,
            cpu_per_gbps(c.load_percent, self.gbps())
        );
        if let Some(t) = c.target_percent {
            s += &format!("; target {t:.1}%, {:.2} %CPU/Gbps", cpu_per_gbps(t, self.gbps()));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_bytes("4k"), Ok(4096));
        assert_eq!(parse_bytes("4KiB"), Ok(4096));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("2m"), Ok(2 << 20));
        assert_eq!(parse_bytes("512"), Ok(512));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("99999999999t").is_err());
    }

    #[test]
    fn cpu_lists_take_ranges() {
        assert_eq!(parse_cpus("0,2-4").map(|c| c.0), Ok(vec![0, 2, 3, 4]));
        assert_eq!(parse_cpus("").map(|c| c.0), Ok(vec![]));
        assert!(parse_cpus("3-1").is_err());
    }

    #[test]
    fn jobs_are_dealt_over_at_most_one_thread_each() {
        assert_eq!(split_jobs(5, 2), vec![3, 2]);
        assert_eq!(split_jobs(1, 4), vec![1]);
        assert_eq!(split_jobs(4, 0), vec![4]);
    }

    #[test]
    fn cpu_percent_is_of_one_cpu_and_per_decimal_gigabit() {
        assert!((cpu_percent(Duration::from_millis(500), Duration::from_secs(1)) - 50.0).abs() < 1e-9);
        assert!((cpu_percent(Duration::from_secs(3), Duration::from_secs(2)) - 150.0).abs() < 1e-9);
        assert_eq!(cpu_percent(Duration::from_secs(1), Duration::ZERO), 0.0);
        // 125 MB/s is exactly 1 Gbit/s with kb_base 1000.
        let gbps = bench::gbit_per_s(125_000_000, Duration::from_secs(1));
        assert!((cpu_per_gbps(40.0, gbps) - 40.0).abs() < 1e-9);
        assert_eq!(cpu_per_gbps(40.0, 0.0), 0.0);
        let at = Instant::now();
        let s = |ms, usr, ex, tgt: Option<u64>| CpuSample {
            at: at + Duration::from_millis(ms),
            usr: Duration::from_millis(usr),
            sys: Duration::ZERO,
            exclude: (Duration::from_millis(ex), Duration::ZERO),
            target: tgt.map(Duration::from_millis),
        };
        let u = cpu_use(&s(0, 0, 0, Some(100)), &s(2000, 1500, 500, Some(1100)));
        assert!((u.load_percent - 50.0).abs() < 1e-9, "{u:?}");
        assert_eq!(u.target_percent, Some(50.0));
        let peer_only = cpu_use(&s(0, 0, 0, None), &s(1000, 800, 300, None));
        assert!((peer_only.load_percent - 50.0).abs() < 1e-9);
        assert!((peer_only.target_percent.unwrap_or_default() - 30.0).abs() < 1e-9);
    }

    #[test]
    fn cpu_window_ends_with_the_last_io_not_after_the_teardown() {
        use std::io::{BufRead, BufReader};
        use std::os::unix::net::UnixListener;
        use std::sync::atomic::AtomicU64;
        // A stand-in for a daemon's control socket: `stats` answers the
        // target's CPU time, which the load's teardown below raises.
        let sock = std::env::temp_dir().join(format!("ironwire-bench-cpu-window-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&sock);
        let listener = UnixListener::bind(&sock).expect("bind");
        let (served, cpu_us) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (s, c) = (served.clone(), cpu_us.clone());
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                let mut line = String::new();
                let _ = BufReader::new(&conn).read_line(&mut line);
                let _ = write!(conn, "cpu user_us={} system_us=0\nok\n", c.load(Ordering::SeqCst));
                s.fetch_add(1, Ordering::SeqCst);
            }
        });
        let local = local_engine(Arc::new(Device::ram("bench", 1 << 20, 512).expect("ram")), 0);
        let engine: Engine = Arc::new(move |o| {
            let r = local(o);
            // The teardown (a disconnect, a logout) costs the target CPU
            // once the window's end was sampled (the wait is bounded: a
            // window that ends only when the engine returns never comes).
            let t = Instant::now();
            while served.load(Ordering::SeqCst) < 2 && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(1));
            }
            cpu_us.store(1_000_000_000, Ordering::SeqCst);
            r
        });
        let how = Measure { cpus: &[], target: TargetCpu::Ctl(sock.clone()), progress: false };
        let base = BenchOptions { block_size: 4096, qd: 1, runtime: Duration::from_millis(50), ..Default::default() };
        let m = how.run(base, engine, None).expect("run");
        let _ = std::fs::remove_file(&sock);
        assert!(m.report.ios > 0);
        assert_eq!(m.cpu.target_percent, Some(0.0), "the teardown's CPU counted in the window");
    }

    #[test]
    fn ceiling_usr_and_sys_are_the_loads_without_the_echo_peer() {
        let peer = EchoPeer::spawn(None).expect("peer");
        let base = BenchOptions { addr: peer.addr, qd: 8, runtime: Duration::from_millis(300), ..Default::default() };
        let how = Measure { cpus: &[], target: TargetCpu::None, progress: false };
        let m = how.run(base, ceiling_engine(), Some(peer.stat.clone())).expect("run");
        let c = m.cpu;
        assert!(c.target_percent.is_some_and(|t| t > 0.0), "the peer's CPU is the target's: {c:?}");
        // usr + sys is the load, as `load N% (usr U%, sys S%)` and fio's
        // usr_cpu / sys_cpu say, not the load plus the peer.
        assert!((c.usr_percent + c.sys_percent - c.load_percent).abs() < 1e-9, "{c:?}");
    }

    #[test]
    fn json_uses_fio_field_names() {
        let mut r = Report::empty(&BenchOptions { pattern: Pattern::RandRead, block_size: 4096, ..Default::default() });
        for v in [10_000u64, 20_000, 30_000, 40_000] {
            r.read_histogram.record(v).expect("record");
            r.histogram.record(v).expect("record");
        }
        (r.jobs, r.ios, r.reads, r.bytes, r.read_bytes, r.elapsed) = (1, 4, 4, 16384, 16384, Duration::from_secs(2));
        let res = Results { mode: "run", target: "t", threads: 1, report: &r, cpu: CpuUse::default() };
        let j = res.json();
        let read = &j["jobs"][0]["read"];
        assert_eq!(read["iops"], json!(2.0));
        assert_eq!(read["bw_bytes"], json!(8192));
        assert_eq!(read["total_ios"], json!(4));
        // The histogram keeps three significant digits.
        let mean = read["lat_ns"]["mean"].as_f64().unwrap_or_default();
        assert!((mean - 25_000.0).abs() <= 25.0, "{mean}");
        let p50 = read["clat_ns"]["percentile"]["50.000000"].as_u64().unwrap_or_default();
        assert!((20_000..=20_020).contains(&p50), "{p50}");
        assert!(read["clat_ns"]["percentile"]["99.000000"].as_u64().is_some());
        assert_eq!(j["jobs"][0]["write"]["total_ios"], json!(0));
        assert_eq!(j["ironwire"]["gbit_per_s"], json!(16384.0 * 8.0 / 1e9 / 2.0));
    }
}
