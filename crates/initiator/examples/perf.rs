//! `perf`: a closed-loop NVMe/TCP load in the manner of fio.
//!
//! ```text
//! cargo run --release -p initiator --example perf -- \
//!     --addr 127.0.0.1:4420 --nqn nqn.2026-11.io.ironwire:default \
//!     --rw randread --bs 4096 --qd 32 --jobs 1 --time 10 [--digest]
//! ```

use initiator::bench::{self, BenchOptions};
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "usage: perf [--addr IP:PORT] [--nqn SUBNQN] [--hostnqn NQN] [--nsid N]
            [--rw read|write|randread|randwrite|rw|randrw] [--mix READ_PERCENT]
            [--bs BYTES[k|m]] [--qd N] [--jobs N] [--time SECS] [--ramp SECS]
            [--offset BYTES] [--size BYTES] [--digest | --hdgst | --ddgst] [--verify]";

fn bytes(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = match t.trim_end_matches(['b', 'i']) {
        x if x.ends_with('k') => (&x[..x.len() - 1], 1u64 << 10),
        x if x.ends_with('m') => (&x[..x.len() - 1], 1 << 20),
        x if x.ends_with('g') => (&x[..x.len() - 1], 1 << 30),
        x => (x, 1),
    };
    num.parse::<u64>().ok().and_then(|n| n.checked_mul(mult)).ok_or_else(|| format!("{s:?} is not a size"))
}

fn parse() -> Result<BenchOptions, String> {
    let mut o = BenchOptions::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| format!("{a} needs a value"));
        let num = |v: String| v.parse::<u64>().map_err(|_| format!("{v:?} is not a number"));
        match a.as_str() {
            "--addr" => o.addr = val()?.parse().map_err(|e| format!("--addr: {e}"))?,
            "--nqn" => o.subnqn = val()?,
            "--hostnqn" => o.hostnqn = val()?,
            "--nsid" => o.nsid = num(val()?)? as u32,
            "--rw" => o.pattern = val()?.parse()?,
            "--mix" => o.read_percent = num(val()?)?.min(100) as u8,
            "--bs" => o.block_size = bytes(&val()?)? as u32,
            "--qd" => o.qd = num(val()?)? as u32,
            "--jobs" => o.jobs = num(val()?)? as u16,
            "--time" => o.runtime = Duration::from_secs_f64(val()?.parse().map_err(|_| "--time")?),
            "--ramp" => o.ramp = Duration::from_secs_f64(val()?.parse().map_err(|_| "--ramp")?),
            "--offset" => o.offset = bytes(&val()?)?,
            "--size" => o.size = Some(bytes(&val()?)?),
            "--digest" => {
                o.header_digest = true;
                o.data_digest = true;
            }
            "--hdgst" => o.header_digest = true,
            "--ddgst" => o.data_digest = true,
            "--verify" => o.verify = true,
            "-h" | "--help" => return Err(USAGE.to_string()),
            _ => return Err(format!("unknown argument {a:?}\n{USAGE}")),
        }
    }
    Ok(o)
}

fn main() -> ExitCode {
    let opts = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let mut rt = match reactor::Runtime::new(reactor::Config::default()) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start an io_uring runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(bench::run(&opts)) {
        Ok(r) => {
            println!("{r}");
            if r.verify_errors > 0 {
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("perf: {e}");
            ExitCode::FAILURE
        }
    }
}
