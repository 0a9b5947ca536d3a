//! The local baseline: the same workload in-process against a
//! `blockdev::Device`, no network, so "remote minus local" latency is one
//! subtraction. Each job runs `qd` tasks on the calling runtime, each a
//! closed loop of one I/O at a time; null and ram devices complete inline,
//! so for them the depth is nominal.

use super::{merge, plan, BenchOptions, Report, Tally, Workload};
use crate::{Error, Result};
use blockdev::BlockDevice;
use blockdev::{Device, IoBuf};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

/// Runs the load on `device` (`opts.addr`, NQNs, nsid and digests are
/// unused).
pub async fn run_local(device: Arc<Device>, opts: &BenchOptions) -> Result<Report> {
    if opts.jobs == 0 || opts.qd == 0 || opts.block_size == 0 {
        return Err(Error::Invalid("jobs, qd and block size must be > 0".into()));
    }
    let g = device.geometry();
    let work = plan(opts, usize::from(opts.jobs), g.block_size, g.size_bytes())?;
    let start = work.first().map_or_else(Instant::now, |w| w.tally.finished);
    let depth = |w: &Rc<RefCell<Workload>>| w.borrow().depth(opts.qd as usize);
    let spawn = |w: &Rc<RefCell<Workload>>| {
        (0..depth(w)).map(|_| reactor::spawn(worker(device.clone(), w.clone()))).collect::<Vec<_>>()
    };
    let jobs: Vec<_> = work.into_iter().map(|w| Rc::new(RefCell::new(w))).collect();
    for t in jobs.iter().flat_map(spawn).collect::<Vec<_>>() {
        t.await?;
    }
    // Every job's load is over (the CPU window closes as the last job
    // finishes): verify's read-backs, if any, each on as many tasks.
    let mut read_backs = Vec::new();
    for w in &jobs {
        let last = w.borrow().tally.finished;
        if w.borrow_mut().drained(last) {
            read_backs.extend(spawn(w));
        }
    }
    for t in read_backs {
        t.await?;
    }
    let results: Vec<Tally> =
        jobs.iter().map(|w| std::mem::replace(&mut w.borrow_mut().tally, Tally::new(start))).collect();
    Ok(merge(opts, &results, start))
}

async fn worker(device: Arc<Device>, w: Rc<RefCell<Workload>>) -> Result<()> {
    let io_bytes = w.borrow().io_bytes() as usize;
    let mut buf = IoBuf::zeroed(io_bytes);
    buf.fill(0xa5);
    loop {
        let (io, submitted) = {
            let mut w = w.borrow_mut();
            let now = Instant::now();
            let Some(io) = w.next(now) else { return Ok(()) };
            if io.write {
                w.fill(&io, &mut buf);
            }
            (io, now)
        };
        let (res, b) = if io.write { device.write(io.lba, buf, false).await } else { device.read(io.lba, buf).await };
        buf = b;
        res?;
        let now = Instant::now();
        let mut w = w.borrow_mut();
        if w.read_back.is_none() {
            w.tally.finished = w.tally.finished.max(now);
        }
        w.complete(&io, submitted, now, if io.write { &[] } else { &buf[..] });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Pattern;
    use std::time::Duration;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        reactor::Runtime::new(reactor::Config::default()).expect("runtime").block_on(f)
    }

    fn opts(pattern: Pattern) -> BenchOptions {
        BenchOptions {
            pattern,
            block_size: 4096,
            qd: 4,
            jobs: 2,
            runtime: Duration::from_millis(200),
            verify: true,
            ..BenchOptions::default()
        }
    }

    #[test]
    fn local_randrw_verify_on_ram_is_clean_and_consistent() {
        let dev = Arc::new(Device::ram("r", 1 << 20, 512).expect("ram"));
        let r = block_on(run_local(dev, &opts(Pattern::RandRw))).expect("run");
        assert!(r.reads > 0 && r.writes > 0, "{r}");
        assert_eq!(r.verify_errors, 0, "{r}");
        assert_eq!(r.reads + r.writes, r.ios);
        assert_eq!(r.ios * 4096, r.bytes);
        assert_eq!(r.histogram.len(), r.ios);
        assert_eq!(r.jobs, 2);
    }

    #[test]
    fn local_write_verify_fails_against_a_device_that_drops_writes() {
        // A null device acknowledges every write and keeps nothing: a
        // writing verify run must read its blocks back and fail, not pass
        // for never having read.
        for pattern in [Pattern::Write, Pattern::RandWrite] {
            let dev = Arc::new(Device::null("n", 1 << 20, 512).expect("null"));
            let r = block_on(run_local(dev, &opts(pattern))).expect("run");
            assert!(r.writes > 0, "{r}");
            assert!(r.verify_errors > 0, "{pattern}: writes to a null device passed verify: {r}");
            assert!(r.first_verify_error.is_some_and(|e| e.reason.contains("magic")));
        }
    }

    #[test]
    fn local_write_verify_reads_back_every_block_it_wrote_and_counts_only_the_window() {
        let dev = Arc::new(Device::ram("r", 1 << 20, 512).expect("ram"));
        // One job: a RAM device completes inline, so on one thread the
        // first job's first task does all the load.
        let o = BenchOptions { jobs: 1, size: Some(64 << 10), ..opts(Pattern::Write) };
        let r = block_on(run_local(dev, &o)).expect("run");
        assert_eq!(r.verify_errors, 0, "{r}");
        // 16 I/Os of 8 blocks over the range, all written: every block read
        // back once, and none of those reads counted as load.
        assert_eq!(r.verify_checked, 16 * 8, "{r}");
        assert_eq!(r.reads, 0, "{r}");
        assert_eq!(r.histogram.len(), r.ios);
    }

    #[test]
    fn local_verify_read_catches_a_block_overwritten_in_the_file() {
        let path = std::env::temp_dir().join(format!("initiator-local-verify-{}", std::process::id()));
        let dev = Arc::new(Device::file("f", &path, Some(256 << 10), 512).expect("file"));
        let mut o = opts(Pattern::Write);
        o.size = Some(64 << 10);
        let w = block_on(run_local(dev.clone(), &o)).expect("write phase");
        assert!(w.writes >= 16, "sequential writes cover the 16-I/O range: {w}");
        o.pattern = Pattern::Read;
        let clean = block_on(run_local(dev.clone(), &o)).expect("clean read phase");
        assert_eq!(clean.verify_errors, 0, "{clean}");
        // Garbage over LBA 37 (byte 18944), behind the device's back.
        {
            use std::io::{Seek, SeekFrom, Write};
            let mut f = std::fs::OpenOptions::new().write(true).open(&path).expect("open");
            f.seek(SeekFrom::Start(37 * 512)).expect("seek");
            f.write_all(&[0x5a; 512]).expect("corrupt");
            f.sync_all().expect("sync");
        }
        let bad = block_on(run_local(dev, &o)).expect("read phase");
        let _ = std::fs::remove_file(&path);
        assert!(bad.verify_errors > 0, "{bad}");
        assert_eq!(bad.first_verify_error.map(|e| e.lba), Some(37));
    }
}
