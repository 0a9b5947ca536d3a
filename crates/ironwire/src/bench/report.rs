//! `ironwire bench report`: the reference papers' matrix against one
//! target, written as a Markdown report laid out like the papers' tables,
//! SVG plots and the raw figures as JSON.
//!
//! Sections, each figure beside the bare TCP loop's (the ceiling) with the
//! same message sizes, queue depth and connections:
//! 1. random read and random write bandwidth, IOPS and %CPU/Gbps against
//!    I/O size (4K..256K by default);
//! 2. 4K random read and write IOPS at a high queue depth;
//! 3. 4K QD 1 read and write latency: local (the same workload in-process
//!    on a device), remote, and the delta;
//! 4. optionally, 4K QD 1 read latency while N background TCP connections
//!    stream over loopback (the jitter test).
//!
//! With `--with-rdma`, an NVMe/TCP report measures every remote figure of
//! sections 1 to 3 over NVMe/RDMA (iWARP) too, each run right after its
//! NVMe/TCP twin, and adds tables of the two transports side by side.

use super::svg::{self, Series};
use super::{
    block_on, ceiling_engine, local_engine, open_device, parse_bytes, parse_cpus, CpuList, EchoPeer, Engine, Measure,
    Measured, TargetArgs, TargetCpu, TransportArg,
};
use anyhow::{bail, Context, Result};
use clap::Args;
use initiator::bench::{BenchOptions, Pattern};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Args)]
pub struct ReportArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// I/O sizes of the bandwidth matrix.
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes, default_value = "4k,8k,16k,32k,64k,128k,256k")]
    sizes: Vec<u64>,
    /// Outstanding I/Os per job in the bandwidth matrix (the papers use 16).
    #[arg(long, default_value_t = 16)]
    qd: u32,
    /// Jobs (I/O queues or iSCSI sessions) of the bandwidth and IOPS runs.
    #[arg(long, default_value_t = 4)]
    jobs: u16,
    /// Outstanding I/Os per job of the 4K IOPS runs.
    #[arg(long, default_value_t = 32)]
    iops_qd: u32,
    /// Measured seconds of each run.
    #[arg(long, default_value_t = 5.0)]
    time: f64,
    /// Seconds of each run before measuring.
    #[arg(long, default_value_t = 1.0)]
    ramp: f64,
    /// CPUs of the load (as `bench run --cpus`).
    #[arg(long, value_parser = parse_cpus, default_value = "")]
    cpus: CpuList,
    /// Pin the ceiling's echo peer to this CPU (give the target's).
    #[arg(long)]
    peer_cpu: Option<usize>,
    /// Runs of each ceiling figure; the best counts (the ceiling is what
    /// the path allows, and loopback TCP varies from run to run).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    ceiling_runs: u32,
    /// PID of the target, for its CPU use.
    #[arg(long, conflicts_with = "target_ctl")]
    target_pid: Option<u32>,
    /// Control socket of an ironwire target, for its CPU use.
    #[arg(long)]
    target_ctl: Option<PathBuf>,
    /// Device of the local latency baseline: null | ram | file:PATH |
    /// block:PATH, or "none".
    #[arg(long, default_value = "ram")]
    local: String,
    /// Logical block size of the local device.
    #[arg(long, default_value_t = 512)]
    local_block_size: u32,
    /// Bytes of the range I/O goes to on the target (default: all of it),
    /// and the size of a null or RAM local device (default 1 GiB).
    #[arg(long, value_parser = parse_bytes)]
    size: Option<u64>,
    /// Background TCP connections streaming during the jitter test (0: no
    /// jitter test).
    #[arg(long, default_value_t = 0)]
    jitter: u32,
    /// Directory for report.md, report.json and the plots.
    #[arg(long, default_value = "bench-report")]
    out: PathBuf,
    /// Title of the report (default: the target).
    #[arg(long)]
    title: Option<String>,
    /// Random seed.
    #[arg(long, default_value_t = 0x1e0_f00d)]
    seed: u64,
    /// NVMe/TCP target: measure every remote figure over NVMe/RDMA (iWARP)
    /// too, beside NVMe/TCP (ironwire serves both on one port).
    #[arg(long, requires = "nvme")]
    with_rdma: bool,
    /// With --with-rdma: the NVMe/RDMA address, when not --nvme's.
    #[arg(long, requires = "with_rdma")]
    rdma_addr: Option<String>,
    /// With --with-rdma: do not ask for MPA CRC32C.
    #[arg(long, requires = "with_rdma")]
    rdma_no_crc: bool,
}

impl ReportArgs {
    /// The NVMe/RDMA twin of an NVMe/TCP target, for `--with-rdma`.
    fn rdma_target(&self) -> Result<Option<TargetArgs>> {
        if !self.with_rdma {
            return Ok(None);
        }
        if self.target.transport != TransportArg::Tcp {
            bail!("--with-rdma puts NVMe/RDMA beside an NVMe/TCP target: leave out --transport rdma");
        }
        let mut t = self.target.clone();
        t.transport = TransportArg::Rdma;
        t.no_crc = self.rdma_no_crc;
        t.hdgst = false;
        t.ddgst = false;
        if let Some(addr) = &self.rdma_addr {
            t.nvme = Some(addr.clone());
        }
        Ok(Some(t))
    }
}

/// What a cell loads.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Remote,
    /// The target over NVMe/RDMA (iWARP), beside NVMe/TCP (`--with-rdma`).
    Rdma,
    Local,
    Ceiling,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Remote => "remote",
            Kind::Rdma => "remote-rdma",
            Kind::Local => "local",
            Kind::Ceiling => "ceiling",
        }
    }
}

/// Which table a cell belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Section {
    Bandwidth,
    Iops,
    Latency,
    /// The jitter test; `true` while the background streams.
    Jitter(bool),
}

impl Section {
    fn name(self) -> &'static str {
        match self {
            Section::Bandwidth => "bandwidth",
            Section::Iops => "iops",
            Section::Latency => "latency",
            Section::Jitter(false) => "jitter-quiet",
            Section::Jitter(true) => "jitter-loaded",
        }
    }
}

/// One measurement of the matrix, reduced to what the tables show.
#[derive(Clone, Debug)]
struct Cell {
    section: Section,
    kind: Kind,
    pattern: Pattern,
    bs: u64,
    qd: u32,
    jobs: u16,
    ios: u64,
    bytes: u64,
    iops: f64,
    gbps: f64,
    mib_s: f64,
    /// Latency in microseconds.
    avg: f64,
    stddev: f64,
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
    load_cpu: f64,
    target_cpu: Option<f64>,
    /// The load's threads were 90 % or more busy: the figure is a floor for
    /// the target, not its limit.
    load_bound: bool,
    command: String,
}

impl Cell {
    fn from(section: Section, kind: Kind, o: &BenchOptions, m: &Measured, command: String) -> Cell {
        let r = &m.report;
        let h = &r.histogram;
        let us = |ns: u64| ns as f64 / 1000.0;
        let (avg, stddev, p50, p99, p999, max) = if h.is_empty() {
            (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        } else {
            (
                h.mean() / 1000.0,
                h.stdev() / 1000.0,
                us(h.value_at_percentile(50.0)),
                us(h.value_at_percentile(99.0)),
                us(h.value_at_percentile(99.9)),
                us(h.max()),
            )
        };
        Cell {
            section,
            kind,
            pattern: o.pattern,
            bs: u64::from(o.block_size),
            qd: o.qd,
            jobs: o.jobs,
            ios: r.ios,
            bytes: r.bytes,
            iops: r.iops(),
            gbps: r.gbit_per_s(),
            mib_s: r.mib_per_s(),
            avg,
            stddev,
            p50,
            p99,
            p999,
            max,
            load_cpu: m.cpu.load_percent,
            target_cpu: m.cpu.target_percent,
            // Of the threads the load ran on (one per job at most, one
            // without --cpus), not of the CPUs it was allowed.
            load_bound: m.cpu.load_percent >= 90.0 * m.threads.max(1) as f64,
            command,
        }
    }

    fn target_cpu_per_gbps(&self) -> Option<f64> {
        self.target_cpu.map(|t| super::cpu_per_gbps(t, self.gbps))
    }

    /// Target CPU time per I/O in microseconds.
    fn target_us_per_io(&self) -> Option<f64> {
        self.target_cpu.filter(|_| self.iops > 0.0).map(|t| t / 100.0 / self.iops * 1e6)
    }

    fn json(&self) -> Value {
        json!({
            "section": self.section.name(),
            "kind": self.kind.name(),
            "rw": self.pattern.to_string(),
            "bs": self.bs,
            "iodepth": self.qd,
            "numjobs": self.jobs,
            "ios": self.ios,
            "bytes": self.bytes,
            "iops": self.iops,
            "gbit_per_s": self.gbps,
            "mib_per_s": self.mib_s,
            "lat_us": { "mean": self.avg, "stddev": self.stddev, "p50": self.p50, "p99": self.p99,
                        "p99.9": self.p999, "max": self.max },
            "load_cpu_percent": self.load_cpu,
            "load_cpu_percent_per_gbps": super::cpu_per_gbps(self.load_cpu, self.gbps),
            "target_cpu_percent": self.target_cpu,
            "target_cpu_percent_per_gbps": self.target_cpu_per_gbps(),
            "target_cpu_us_per_io": self.target_us_per_io(),
            "load_bound": self.load_bound,
            "command": self.command,
        })
    }
}

/// The engines and command-line pieces every cell is built from.
struct Plan<'a> {
    a: &'a ReportArgs,
    remote: (BenchOptions, Engine),
    /// The NVMe/RDMA twin's flags, options and engine (`--with-rdma`).
    rdma: Option<(TargetArgs, BenchOptions, Engine)>,
    local: Option<(BenchOptions, Engine)>,
    ceiling: (BenchOptions, Engine),
    peer_stat: String,
    target_cpu: TargetCpu,
    cells: Vec<Cell>,
    started: Instant,
    total: usize,
}

impl Plan<'_> {
    fn flags(&self, rw: Pattern, bs: u64, qd: u32, jobs: u16) -> String {
        let a = self.a;
        let bs = svg::size_label(bs).to_lowercase();
        let mut f = format!("--rw {rw} --bs {bs} --qd {qd} --jobs {jobs} --time {} --ramp {}", a.time, a.ramp);
        if !a.cpus.0.is_empty() {
            let cpus: Vec<String> = a.cpus.0.iter().map(usize::to_string).collect();
            let _ = write!(f, " --cpus {}", cpus.join(","));
        }
        f
    }

    fn command(&self, kind: Kind, rw: Pattern, bs: u64, qd: u32, jobs: u16) -> String {
        let a = self.a;
        let load = self.flags(rw, bs, qd, jobs);
        match kind {
            Kind::Remote | Kind::Rdma => {
                let target = match (&self.rdma, kind) {
                    (Some((t, _, _)), Kind::Rdma) => t,
                    _ => &a.target,
                };
                let mut c = format!("ironwire bench run {} {load}", target.flags());
                if let Some(size) = a.size {
                    let _ = write!(c, " --size {size}");
                }
                match (&a.target_pid, &a.target_ctl) {
                    (Some(pid), _) => {
                        let _ = write!(c, " --target-pid {pid}");
                    }
                    (None, Some(sock)) => {
                        let _ = write!(c, " --target-ctl {}", sock.display());
                    }
                    _ => {}
                }
                c
            }
            Kind::Local => {
                let size = a.size.map(|s| format!(" --size {s}")).unwrap_or_default();
                format!("ironwire bench local --device {} --block-size {}{size} {load}", a.local, a.local_block_size)
            }
            Kind::Ceiling => {
                let peer = a.peer_cpu.map(|c| format!(" --peer-cpu {c}")).unwrap_or_default();
                format!("ironwire bench ceiling {load}{peer}")
            }
        }
    }

    /// Runs one cell and keeps it.
    fn cell(&mut self, section: Section, kind: Kind, pattern: Pattern, bs: u64, qd: u32, jobs: u16) -> Result<()> {
        let (base, engine, exclude) = match kind {
            Kind::Remote => (self.remote.0.clone(), self.remote.1.clone(), None),
            Kind::Rdma => match &self.rdma {
                Some((_, o, e)) => (o.clone(), e.clone(), None),
                None => return Ok(()),
            },
            Kind::Local => match &self.local {
                Some((o, e)) => (o.clone(), e.clone(), None),
                None => return Ok(()),
            },
            Kind::Ceiling => (self.ceiling.0.clone(), self.ceiling.1.clone(), Some(self.peer_stat.clone())),
        };
        let o = BenchOptions {
            pattern,
            block_size: u32::try_from(bs).context("I/O size too large")?,
            qd,
            jobs,
            runtime: Duration::from_secs_f64(self.a.time),
            ramp: Duration::from_secs_f64(self.a.ramp),
            seed: self.a.seed,
            ..base
        };
        let command = self.command(kind, pattern, bs, qd, jobs);
        let target = if matches!(kind, Kind::Remote | Kind::Rdma) { self.target_cpu.clone() } else { TargetCpu::None };
        let how = Measure { cpus: &self.a.cpus.0, target, progress: false };
        let runs = if kind == Kind::Ceiling { self.a.ceiling_runs } else { 1 };
        let mut best: Option<Measured> = None;
        for _ in 0..runs {
            let m =
                how.run(o.clone(), engine.clone(), exclude.clone()).with_context(|| format!("running: {command}"))?;
            if best.as_ref().is_none_or(|b| m.report.iops() > b.report.iops()) {
                best = Some(m);
            }
        }
        let m = best.context("no run")?;
        let c = Cell::from(section, kind, &o, &m, command);
        eprintln!(
            "[{:>3}/{} {:>4} s] {:<13} {:<11} {:<9} {:>5} qd {:>2} x{}: {:>9.0} IOPS {:>7.3} Gbit/s avg {:>8.1} us{}",
            self.cells.len() + 1,
            self.total,
            self.started.elapsed().as_secs(),
            section.name(),
            kind.name(),
            pattern,
            svg::size_label(bs),
            qd,
            jobs,
            c.iops,
            c.gbps,
            c.avg,
            c.target_cpu.map(|t| format!(", target {t:.1}% CPU")).unwrap_or_default()
        );
        self.cells.push(c);
        Ok(())
    }

    fn find(&self, section: Section, kind: Kind, pattern: Pattern, bs: u64) -> Option<&Cell> {
        self.cells.iter().find(|c| c.section == section && c.kind == kind && c.pattern == pattern && c.bs == bs)
    }
}

const RW: [Pattern; 2] = [Pattern::RandRead, Pattern::RandWrite];

pub fn main(a: ReportArgs) -> Result<()> {
    if !(a.time > 0.0 && a.time.is_finite() && a.ramp >= 0.0 && a.ramp.is_finite()) {
        bail!("--time must be > 0 and --ramp >= 0 seconds");
    }
    if a.sizes.is_empty() {
        bail!("--sizes needs at least one I/O size");
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let common = BenchOptions { size: a.size, ..BenchOptions::default() };
    let (header, remote, remote_engine) = a.target.engine(common.clone())?;
    let rdma = match a.rdma_target()? {
        Some(t) => {
            let (_, o, e) = t.engine(common)?;
            Some((t, o, e))
        }
        None => None,
    };
    let twins = usize::from(rdma.is_some());
    let local = match a.local.as_str() {
        "none" => None,
        spec => {
            let dev = Arc::new(open_device(spec, a.size, a.local_block_size)?);
            Some((BenchOptions::default(), local_engine(dev, crate::config::DEFAULT_REGISTERED_BUFFERS)))
        }
    };
    let peer = EchoPeer::spawn(a.peer_cpu)?;
    let target_cpu = TargetCpu::new(a.target_pid, a.target_ctl.as_ref());
    let total = a.sizes.len() * 2 * (2 + twins)
        + 2 * (2 + twins)
        + 2 * (2 + twins + usize::from(local.is_some()))
        + if a.jitter > 0 { 4 } else { 0 };
    let mut p = Plan {
        a: &a,
        remote: (remote, remote_engine),
        rdma,
        local,
        ceiling: (BenchOptions { addr: peer.addr, ..BenchOptions::default() }, ceiling_engine()),
        peer_stat: peer.stat.clone(),
        target_cpu,
        cells: Vec::new(),
        started: Instant::now(),
        total,
    };
    for rw in RW {
        for &bs in &a.sizes {
            p.cell(Section::Bandwidth, Kind::Remote, rw, bs, a.qd, a.jobs)?;
            p.cell(Section::Bandwidth, Kind::Rdma, rw, bs, a.qd, a.jobs)?;
            p.cell(Section::Bandwidth, Kind::Ceiling, rw, bs, a.qd, a.jobs)?;
        }
    }
    for rw in RW {
        p.cell(Section::Iops, Kind::Remote, rw, 4096, a.iops_qd, a.jobs)?;
        p.cell(Section::Iops, Kind::Rdma, rw, 4096, a.iops_qd, a.jobs)?;
        p.cell(Section::Iops, Kind::Ceiling, rw, 4096, a.iops_qd, a.jobs)?;
    }
    for rw in RW {
        p.cell(Section::Latency, Kind::Local, rw, 4096, 1, 1)?;
        p.cell(Section::Latency, Kind::Remote, rw, 4096, 1, 1)?;
        p.cell(Section::Latency, Kind::Rdma, rw, 4096, 1, 1)?;
        p.cell(Section::Latency, Kind::Ceiling, rw, 4096, 1, 1)?;
    }
    let mut background = None;
    if a.jitter > 0 {
        for kind in [Kind::Remote, Kind::Ceiling] {
            p.cell(Section::Jitter(false), kind, Pattern::RandRead, 4096, 1, 1)?;
        }
        let bg = Background::start(a.jitter, a.cpus.0.first().copied())?;
        for kind in [Kind::Remote, Kind::Ceiling] {
            p.cell(Section::Jitter(true), kind, Pattern::RandRead, 4096, 1, 1)?;
        }
        background = Some(bg.stop()?);
    }
    let title = a.title.clone().unwrap_or_else(|| header.target.clone());
    let doc = Doc { p: &p, title: &title, target: &header.target, machine: machine(), background };
    let files = [
        ("report.md", doc.markdown()),
        ("bandwidth.svg", doc.bandwidth_chart()),
        ("cpu-per-gbps.svg", doc.cpu_chart()),
        ("report.json", serde_json::to_string_pretty(&doc.json()).unwrap_or_default() + "\n"),
    ];
    for (name, text) in files {
        let path = a.out.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    println!("{}", a.out.join("report.md").display());
    Ok(())
}

/// What the background streams moved during the jitter test.
struct Streamed {
    connections: u32,
    gbps: f64,
}

/// N TCP connections streaming to a sink over loopback, on one thread.
struct Background {
    stop: Arc<AtomicBool>,
    bytes: Arc<AtomicU64>,
    connections: u32,
    started: Instant,
    thread: std::thread::JoinHandle<Result<()>>,
}

impl Background {
    fn start(n: u32, cpu: Option<usize>) -> Result<Background> {
        raise_open_files(u64::from(n) * 2 + 256)?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding the background sink")?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let bytes = Arc::new(AtomicU64::new(0));
        let connected = Arc::new(AtomicU32::new(0));
        let (s, b, c) = (stop.clone(), bytes.clone(), connected.clone());
        let thread = std::thread::Builder::new().name("bench-background".into()).spawn(move || {
            if let Some(cpu) = cpu {
                super::pin_to(cpu)?;
            }
            block_on(stream(listener, addr, n, s, b, c))?
        })?;
        let t = Instant::now();
        while connected.load(Ordering::Relaxed) < n {
            if thread.is_finished() || t.elapsed() > Duration::from_secs(30) {
                stop.store(true, Ordering::Relaxed);
                let why = match thread.join() {
                    Ok(Err(e)) => format!("{e:#}"),
                    _ => "timed out".into(),
                };
                bail!("{} of {n} background connections came up: {why}", connected.load(Ordering::Relaxed));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Let the streams reach their pace before measuring.
        std::thread::sleep(Duration::from_millis(500));
        bytes.store(0, Ordering::Relaxed);
        Ok(Background { stop, bytes, connections: n, started: Instant::now(), thread })
    }

    fn stop(self) -> Result<Streamed> {
        let secs = self.started.elapsed().as_secs_f64();
        let bytes = self.bytes.load(Ordering::Relaxed);
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().map_err(|_| anyhow::anyhow!("the background thread panicked"))??;
        Ok(Streamed { connections: self.connections, gbps: bytes as f64 * 8.0 / 1e9 / secs.max(1e-9) })
    }
}

/// Accepts and drains `n` connections while `n` senders write 64 KiB at a
/// time until `stop`.
async fn stream(
    listener: std::net::TcpListener,
    addr: SocketAddr,
    n: u32,
    stop: Arc<AtomicBool>,
    bytes: Arc<AtomicU64>,
    connected: Arc<AtomicU32>,
) -> Result<()> {
    let listener = reactor::net::TcpListener::from_std(listener);
    reactor::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let bytes = bytes.clone();
            reactor::spawn(async move {
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let (res, b) = s.read(buf).await;
                    buf = b;
                    match res {
                        Ok(0) | Err(_) => return,
                        Ok(k) => bytes.fetch_add(k as u64, Ordering::Relaxed),
                    };
                }
            });
        }
    });
    for _ in 0..n {
        let s = reactor::net::TcpStream::connect(addr).await.context("connecting a background stream")?;
        connected.fetch_add(1, Ordering::Relaxed);
        let stop = stop.clone();
        reactor::spawn(async move {
            let mut buf = vec![0x5au8; 64 << 10];
            while !stop.load(Ordering::Relaxed) {
                let (res, b) = s.write_all(buf).await;
                buf = b;
                if res.is_err() {
                    return;
                }
            }
        });
    }
    while !stop.load(Ordering::Relaxed) {
        reactor::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Raises this process's open-file limit to at least `want` (up to the hard
/// limit).
fn raise_open_files(want: u64) -> Result<()> {
    // SAFETY: rlimit is plain data that getrlimit fills in.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a valid resource and pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        bail!("getrlimit: {}", std::io::Error::last_os_error());
    }
    if rl.rlim_cur >= want {
        return Ok(());
    }
    if rl.rlim_max < want {
        bail!("the jitter test needs {want} open files; the hard limit is {}", rl.rlim_max);
    }
    rl.rlim_cur = want;
    // SAFETY: a valid resource and pointer to a filled-in rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) } != 0 {
        bail!("setrlimit: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// The machine the report ran on.
struct Machine {
    cpu: String,
    cpus: usize,
    memory: String,
    kernel: String,
    os: String,
}

fn machine() -> Machine {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let memory = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| format!("{:.1} GiB", kb as f64 / 1_048_576.0))
        .unwrap_or_else(|| "unknown".into());
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_string();
    let os = read("/etc/os-release")
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| "unknown".into());
    Machine { cpu, cpus, memory, kernel, os }
}

/// Today's date (UTC) as YYYY-MM-DD HH:MM.
fn now_utc() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", secs % 86_400 / 3600, secs % 3600 / 60)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The finished matrix and how to write it.
struct Doc<'a, 'b> {
    p: &'a Plan<'b>,
    title: &'a str,
    target: &'a str,
    machine: Machine,
    background: Option<Streamed>,
}

fn f1(x: f64) -> String {
    format!("{x:.1}")
}

fn f2(x: f64) -> String {
    format!("{x:.2}")
}

fn f3(x: f64) -> String {
    format!("{x:.3}")
}

fn opt(x: Option<f64>, f: fn(f64) -> String) -> String {
    x.map(f).unwrap_or_else(|| "–".into())
}

/// `part` as a percentage of `whole`.
fn fraction(part: f64, whole: f64) -> Option<f64> {
    (whole > 0.0).then(|| part / whole * 100.0)
}

fn pct(x: f64) -> String {
    format!("{x:.0} %")
}

/// The load-bound marker of a figure.
fn mark(c: &Cell) -> &'static str {
    if c.load_bound {
        " †"
    } else {
        ""
    }
}

fn rw_name(rw: Pattern) -> &'static str {
    if rw == Pattern::RandRead {
        "READ"
    } else {
        "WRITE"
    }
}

impl Doc<'_, '_> {
    fn markdown(&self) -> String {
        let p = self.p;
        let a = p.a;
        let mut o = String::new();
        let m = &self.machine;
        let cpus = if a.cpus.0.is_empty() {
            "unpinned".to_string()
        } else {
            format!("CPU {}", a.cpus.0.iter().map(usize::to_string).collect::<Vec<_>>().join(","))
        };
        let target_cpu = match &p.target_cpu {
            TargetCpu::Proc(path) => format!("`{path}` (utime + stime)"),
            TargetCpu::Ctl(sock) => format!("the daemon's own `stats` on `{}`", sock.display()),
            TargetCpu::None => "not measured (give --target-pid or --target-ctl)".into(),
        };
        let _ = writeln!(o, "# ironwire bench report: {}\n", self.title);
        let _ = writeln!(
            o,
            "{}, ironwire {}. Target: `{}`. Every run: {} s measured after {} s ramp; \
             bandwidth in Gbit/s with kb_base 1000 (as the papers); %CPU is of one CPU \
             (100 % = one core busy), so %CPU/Gbps is CPU per Gbit/s moved.\n",
            now_utc(),
            env!("CARGO_PKG_VERSION"),
            self.target,
            a.time,
            a.ramp
        );
        let _ = writeln!(o, "## Machine\n\n| | |\n|---|---|");
        let _ = writeln!(o, "| CPU | {} × {} |", m.cpu, m.cpus);
        let _ = writeln!(o, "| Memory | {} |", m.memory);
        let _ = writeln!(o, "| Kernel | {} |", m.kernel);
        let _ = writeln!(o, "| OS | {} |", m.os);
        let _ = writeln!(o, "| Load | {cpus} |");
        let _ = writeln!(
            o,
            "| Ceiling echo peer | {} |",
            a.peer_cpu.map(|c| format!("CPU {c}")).unwrap_or_else(|| "unpinned".into())
        );
        let _ = writeln!(o, "| Target CPU from | {target_cpu} |\n");

        let _ = writeln!(
            o,
            "## Random READ and WRITE: bandwidth and %CPU/Gbps against I/O size\n\n\
             QD {} per job, {} job(s). *Ceiling* is the bare TCP request/response loop over the same \
             path with the same message sizes, queue depth and connections (best of {} runs); *of \
             ceiling* is the target's bandwidth as a fraction of it. † marks a figure where the load \
             generator's threads were 90 % or more busy: there the load, not the target, was the limit.\n",
            a.qd, a.jobs, a.ceiling_runs
        );
        for rw in RW {
            let _ = writeln!(
                o,
                "| Random {} | BW (Gbit/s) | MiB/s | IOPS | ceiling (Gbit/s) | of ceiling | target %CPU | \
                 target %CPU/Gbps | load %CPU/Gbps | avg lat (µs) |\n|---|---|---|---|---|---|---|---|---|---|",
                rw_name(rw)
            );
            for &bs in &a.sizes {
                let (Some(r), c) = (
                    p.find(Section::Bandwidth, Kind::Remote, rw, bs),
                    p.find(Section::Bandwidth, Kind::Ceiling, rw, bs),
                ) else {
                    continue;
                };
                let _ = writeln!(
                    o,
                    "| {} | {}{} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    svg::size_label(bs),
                    f3(r.gbps),
                    mark(r),
                    f1(r.mib_s),
                    format_args!("{:.0}", r.iops),
                    opt(c.map(|c| c.gbps), f3),
                    opt(c.and_then(|c| fraction(r.gbps, c.gbps)), pct),
                    opt(r.target_cpu, f1),
                    opt(r.target_cpu_per_gbps(), f2),
                    f2(super::cpu_per_gbps(r.load_cpu, r.gbps)),
                    f1(r.avg)
                );
            }
            o.push('\n');
        }
        let _ = writeln!(
            o,
            "![Bandwidth against I/O size](bandwidth.svg)\n\n![%CPU/Gbps against I/O size](cpu-per-gbps.svg)\n"
        );

        let _ = writeln!(
            o,
            "## 4K random IOPS\n\nQD {} per job, {} job(s).\n\n\
             | 4K random | IOPS | ceiling IOPS | of ceiling | target %CPU | target CPU per I/O (µs) | \
             avg lat (µs) | p99 lat (µs) |\n|---|---|---|---|---|---|---|---|",
            a.iops_qd, a.jobs
        );
        for rw in RW {
            let Some(r) = p.find(Section::Iops, Kind::Remote, rw, 4096) else { continue };
            let c = p.find(Section::Iops, Kind::Ceiling, rw, 4096);
            let _ = writeln!(
                o,
                "| {} | {:.0}{} | {} | {} | {} | {} | {} | {} |",
                rw_name(rw),
                r.iops,
                mark(r),
                opt(c.map(|c| c.iops), |x| format!("{x:.0}")),
                opt(c.and_then(|c| fraction(r.iops, c.iops)), pct),
                opt(r.target_cpu, f1),
                opt(r.target_us_per_io(), f2),
                f1(r.avg),
                f1(r.p99)
            );
        }
        o.push('\n');

        let _ = writeln!(
            o,
            "## 4K random latency, QD 1: local against remote\n\n\
             Average latency in µs, one job. *Local* is the same workload in-process on `{}` \
             (no network); *remote* goes through the target; *delta* is remote minus local. \
             *Network path* is the ceiling loop at QD 1 with 4K messages: the part of the \
             delta the TCP path itself costs on this machine.\n\n\
             | 4K Random Latency | Read Local | Read Remote | Read Delta | Write Local | Write Remote | \
             Write Delta |\n|---|---|---|---|---|---|---|",
            a.local
        );
        let lat = |kind, rw| p.find(Section::Latency, kind, rw, 4096);
        let mut row = format!("| {} ", self.target);
        for rw in RW {
            let (l, r) = (lat(Kind::Local, rw), lat(Kind::Remote, rw));
            let delta = l.zip(r).map(|(l, r)| r.avg - l.avg);
            let _ =
                write!(row, "| {} | {} | {} ", opt(l.map(|c| c.avg), f2), opt(r.map(|c| c.avg), f2), opt(delta, f2));
        }
        let _ = writeln!(o, "{row}|\n");
        let _ = writeln!(
            o,
            "| QD 1, 4K | local avg | local p99 | remote avg | remote p50 | remote p99 | remote p99.9 | \
             network path avg | network path p99 | target CPU per I/O (µs) |\n|---|---|---|---|---|---|---|---|---|---|"
        );
        for rw in RW {
            let (l, r, c) = (lat(Kind::Local, rw), lat(Kind::Remote, rw), lat(Kind::Ceiling, rw));
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                rw_name(rw),
                opt(l.map(|c| c.avg), f2),
                opt(l.map(|c| c.p99), f2),
                opt(r.map(|c| c.avg), f2),
                opt(r.map(|c| c.p50), f2),
                opt(r.map(|c| c.p99), f2),
                opt(r.map(|c| c.p999), f2),
                opt(c.map(|c| c.avg), f2),
                opt(c.map(|c| c.p99), f2),
                opt(r.and_then(Cell::target_us_per_io), f2)
            );
        }
        o.push('\n');

        if let Some(bg) = &self.background {
            let _ = writeln!(
                o,
                "## Jitter: 4K QD 1 read latency while {} TCP connections stream\n\n\
                 {} background connections write 64 KiB at a time to a sink over loopback ({:.2} Gbit/s \
                 in all) on the load's first CPU while one job reads 4K at QD 1; the same without them. \
                 Latency in µs.\n\n\
                 | | avg | stddev | p50 | p99 | p99.9 | max |\n|---|---|---|---|---|---|---|",
                bg.connections, bg.connections, bg.gbps
            );
            for (kind, name) in [(Kind::Remote, "target"), (Kind::Ceiling, "network path (ceiling)")] {
                for (loaded, when) in [(false, "quiet"), (true, "streaming")] {
                    let Some(c) = p.find(Section::Jitter(loaded), kind, Pattern::RandRead, 4096) else { continue };
                    let _ = writeln!(
                        o,
                        "| {name}, {when} | {} | {} | {} | {} | {} | {} |",
                        f2(c.avg),
                        f2(c.stddev),
                        f2(c.p50),
                        f2(c.p99),
                        f2(c.p999),
                        f2(c.max)
                    );
                }
            }
            o.push('\n');
        }

        if p.rdma.is_some() {
            self.rdma_tables(&mut o);
        }

        let _ = writeln!(o, "## Commands\n\nThe report:\n\n```sh\n{}\n```\n", invocation());
        let _ = writeln!(
            o,
            "Each figure is the result of one of these (the jitter rows ran with the background \
             streams of `--jitter`):\n\n```sh"
        );
        let mut seen = Vec::new();
        for c in &p.cells {
            if !seen.contains(&&c.command) {
                seen.push(&c.command);
                let _ = writeln!(o, "{}", c.command);
            }
        }
        o.push_str("```\n");
        o
    }

    /// NVMe/RDMA (iWARP) beside NVMe/TCP: every remote figure of both, and
    /// iWARP's as a ratio to TCP's.
    fn rdma_tables(&self, o: &mut String) {
        let p = self.p;
        let a = p.a;
        let ratio = |x: Option<f64>, y: Option<f64>| x.zip(y).filter(|&(_, y)| y > 0.0).map(|(x, y)| x / y);
        let _ = writeln!(
            o,
            "## NVMe/RDMA (iWARP) beside NVMe/TCP\n\n\
             The same target and workloads over NVMe/RDMA with the RNIC's work (MPA, DDP, RDMAP) done in \
             software on both ends, each run right after its NVMe/TCP twin; *÷ TCP* is the iWARP figure \
             over the TCP one (for CPU, below 1 is lighter). MPA CRC32C {}.\n",
            if a.rdma_no_crc { "not asked for by the load" } else { "on" }
        );
        for rw in RW {
            let _ = writeln!(
                o,
                "| Random {} | TCP Gbit/s | iWARP Gbit/s | ÷ TCP | TCP target %CPU/Gbps | iWARP target %CPU/Gbps | \
                 ÷ TCP | TCP avg lat (µs) | iWARP avg lat (µs) |\n|---|---|---|---|---|---|---|---|---|",
                rw_name(rw)
            );
            for &bs in &a.sizes {
                let (Some(t), Some(r)) =
                    (p.find(Section::Bandwidth, Kind::Remote, rw, bs), p.find(Section::Bandwidth, Kind::Rdma, rw, bs))
                else {
                    continue;
                };
                let _ = writeln!(
                    o,
                    "| {} | {}{} | {}{} | {} | {} | {} | {} | {} | {} |",
                    svg::size_label(bs),
                    f3(t.gbps),
                    mark(t),
                    f3(r.gbps),
                    mark(r),
                    opt(ratio(Some(r.gbps), Some(t.gbps)), f2),
                    opt(t.target_cpu_per_gbps(), f2),
                    opt(r.target_cpu_per_gbps(), f2),
                    opt(ratio(r.target_cpu_per_gbps(), t.target_cpu_per_gbps()), f2),
                    f1(t.avg),
                    f1(r.avg)
                );
            }
            o.push('\n');
        }
        let _ = writeln!(
            o,
            "| 4K random, QD {} x {} | TCP IOPS | iWARP IOPS | ÷ TCP | TCP target CPU per I/O (µs) | \
             iWARP target CPU per I/O (µs) | ÷ TCP |\n|---|---|---|---|---|---|---|",
            a.iops_qd, a.jobs
        );
        for rw in RW {
            let (Some(t), Some(r)) =
                (p.find(Section::Iops, Kind::Remote, rw, 4096), p.find(Section::Iops, Kind::Rdma, rw, 4096))
            else {
                continue;
            };
            let _ = writeln!(
                o,
                "| {} | {:.0}{} | {:.0}{} | {} | {} | {} | {} |",
                rw_name(rw),
                t.iops,
                mark(t),
                r.iops,
                mark(r),
                opt(ratio(Some(r.iops), Some(t.iops)), f2),
                opt(t.target_us_per_io(), f2),
                opt(r.target_us_per_io(), f2),
                opt(ratio(r.target_us_per_io(), t.target_us_per_io()), f2)
            );
        }
        o.push('\n');
        let _ = writeln!(
            o,
            "| 4K QD 1 latency (µs) | local avg | TCP remote avg | iWARP remote avg | ÷ TCP | TCP delta | \
             iWARP delta | TCP p99 | iWARP p99 |\n|---|---|---|---|---|---|---|---|---|"
        );
        for rw in RW {
            let lat = |kind| p.find(Section::Latency, kind, rw, 4096);
            let (l, t, r) = (lat(Kind::Local), lat(Kind::Remote), lat(Kind::Rdma));
            let delta = |c: Option<&Cell>| l.zip(c).map(|(l, c)| c.avg - l.avg);
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                rw_name(rw),
                opt(l.map(|c| c.avg), f2),
                opt(t.map(|c| c.avg), f2),
                opt(r.map(|c| c.avg), f2),
                opt(ratio(r.map(|c| c.avg), t.map(|c| c.avg)), f2),
                opt(delta(t), f2),
                opt(delta(r), f2),
                opt(t.map(|c| c.p99), f2),
                opt(r.map(|c| c.p99), f2)
            );
        }
        o.push('\n');
    }

    fn series(&self, name: &str, kind: Kind, rw: Pattern, y: fn(&Cell) -> Option<f64>, dashed: bool) -> Series {
        let points = self
            .p
            .a
            .sizes
            .iter()
            .filter_map(|&bs| self.p.find(Section::Bandwidth, kind, rw, bs).and_then(|c| y(c).map(|v| (bs, v))))
            .collect();
        Series { name: name.into(), points, dashed }
    }

    fn bandwidth_chart(&self) -> String {
        let mut s = vec![
            self.series("read", Kind::Remote, Pattern::RandRead, |c| Some(c.gbps), false),
            self.series("write", Kind::Remote, Pattern::RandWrite, |c| Some(c.gbps), false),
            self.series("read ceiling", Kind::Ceiling, Pattern::RandRead, |c| Some(c.gbps), true),
            self.series("write ceiling", Kind::Ceiling, Pattern::RandWrite, |c| Some(c.gbps), true),
        ];
        if self.p.rdma.is_some() {
            s.push(self.series("read, iWARP", Kind::Rdma, Pattern::RandRead, |c| Some(c.gbps), false));
            s.push(self.series("write, iWARP", Kind::Rdma, Pattern::RandWrite, |c| Some(c.gbps), false));
        }
        svg::line_chart(&format!("Random I/O bandwidth: {}", self.title), "Gbit/s", &s)
    }

    fn cpu_chart(&self) -> String {
        let target = |c: &Cell| c.target_cpu_per_gbps();
        let load = |c: &Cell| Some(super::cpu_per_gbps(c.load_cpu, c.gbps));
        let mut s = Vec::new();
        if self.p.cells.iter().any(|c| c.kind == Kind::Remote && c.target_cpu.is_some()) {
            s.push(self.series("target, read", Kind::Remote, Pattern::RandRead, target, false));
            s.push(self.series("target, write", Kind::Remote, Pattern::RandWrite, target, false));
            if self.p.rdma.is_some() {
                s.push(self.series("target, read, iWARP", Kind::Rdma, Pattern::RandRead, target, false));
                s.push(self.series("target, write, iWARP", Kind::Rdma, Pattern::RandWrite, target, false));
            }
        }
        s.push(self.series("load, read", Kind::Remote, Pattern::RandRead, load, true));
        s.push(self.series("load, write", Kind::Remote, Pattern::RandWrite, load, true));
        svg::line_chart(&format!("%CPU per Gbit/s: {}", self.title), "%CPU/Gbps", &s)
    }

    fn json(&self) -> Value {
        let m = &self.machine;
        json!({
            "title": self.title,
            "target": self.target,
            "date": now_utc(),
            "ironwire version": env!("CARGO_PKG_VERSION"),
            "command": invocation(),
            "machine": { "cpu": m.cpu, "cpus": m.cpus, "memory": m.memory, "kernel": m.kernel, "os": m.os },
            "background": self.background.as_ref().map(|b| json!({ "connections": b.connections, "gbit_per_s": b.gbps })),
            "cells": self.p.cells.iter().map(Cell::json).collect::<Vec<_>>(),
        })
    }
}

/// This process's command line, quoted where needed (secrets hidden).
fn invocation() -> String {
    command_line(std::env::args())
}

/// A command line as `invocation` shows it: a CHAP secret, given as the
/// argument after `--chap-secret` or as `--chap-secret=S`, shows as `***`.
fn command_line(args: impl IntoIterator<Item = String>) -> String {
    let mut out = Vec::new();
    let mut hide = false;
    for (i, arg) in args.into_iter().enumerate() {
        let shown = if hide {
            "'***'".to_string()
        } else if arg.starts_with("--chap-secret=") {
            "--chap-secret='***'".to_string()
        } else if i == 0 {
            "ironwire".to_string()
        } else if arg.is_empty() || arg.contains(|c: char| c.is_whitespace() || "'\"$`\\".contains(c)) {
            format!("'{}'", arg.replace('\'', r"'\''"))
        } else {
            arg.clone()
        };
        hide = arg == "--chap-secret";
        out.push(shown);
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(20_414), (2025, 11, 22));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn a_figure_is_load_bound_when_the_threads_it_ran_on_were_busy() {
        let o = BenchOptions { qd: 1, jobs: 1, ..BenchOptions::default() };
        let bound = |load_percent, threads| {
            let cpu = super::super::CpuUse { load_percent, ..Default::default() };
            let m = Measured { report: initiator::bench::Report::empty(&o), cpu, threads };
            Cell::from(Section::Latency, Kind::Remote, &o, &m, String::new()).load_bound
        };
        // One job is one load thread, unpinned or with `--cpus 1,2,3,4`:
        // a busy thread is the limit whatever the machine's CPU count.
        assert!(bound(97.0, 1));
        assert!(!bound(60.0, 1));
        assert!(bound(185.0, 2));
        assert!(!bound(120.0, 2));
    }

    #[test]
    fn fractions_and_cpu_per_io() {
        assert_eq!(fraction(1.0, 4.0), Some(25.0));
        assert_eq!(fraction(1.0, 0.0), None);
        let mut c = Cell {
            section: Section::Iops,
            kind: Kind::Remote,
            pattern: Pattern::RandRead,
            bs: 4096,
            qd: 32,
            jobs: 1,
            ios: 100_000,
            bytes: 409_600_000,
            iops: 100_000.0,
            gbps: 3.2768,
            mib_s: 390.6,
            avg: 0.0,
            stddev: 0.0,
            p50: 0.0,
            p99: 0.0,
            p999: 0.0,
            max: 0.0,
            load_cpu: 100.0,
            target_cpu: Some(50.0),
            load_bound: false,
            command: String::new(),
        };
        // Half a CPU for 100k IOPS is 5 µs of CPU per I/O.
        assert!((c.target_us_per_io().unwrap_or_default() - 5.0).abs() < 1e-9);
        assert!((c.target_cpu_per_gbps().unwrap_or_default() - 50.0 / 3.2768).abs() < 1e-9);
        c.target_cpu = None;
        assert_eq!(c.target_us_per_io(), None);
        assert_eq!(c.json()["target_cpu_percent"], Value::Null);
    }

    #[test]
    fn the_command_line_hides_a_chap_secret_in_either_form() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let shown = command_line(args(&[
            "/usr/bin/ironwire",
            "bench",
            "report",
            "--chap-secret",
            "first-s3cret",
            "--chap-secret=second-s3cret",
            "--title",
            "a b",
        ]));
        assert!(!shown.contains("s3cret"), "{shown}");
        assert_eq!(shown, "ironwire bench report --chap-secret '***' --chap-secret='***' --title 'a b'");
    }

    #[test]
    fn the_open_file_limit_can_be_raised_within_the_hard_limit() {
        raise_open_files(64).expect("64 open files");
        assert!(raise_open_files(u64::MAX).is_err());
    }
}
