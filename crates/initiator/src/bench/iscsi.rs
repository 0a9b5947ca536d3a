//! The iSCSI engine: the same workload over iSCSI sessions. Each job is one
//! session (its own TCP connection and ISID) to one LUN, kept at `qd`
//! commands in flight with READ (16) / WRITE (16); the block size and the
//! range's end come from READ CAPACITY (16).

use super::{merge, plan, BenchOptions, InFlight, Report, Tally, Workload};
use crate::iscsi::{self, cdb, LoginOptions, Session};
use crate::{Error, Result};
use rustc_hash::FxHashMap;
use std::time::Instant;

/// Where an iSCSI load goes (the portal is `BenchOptions::addr`; digests
/// and the network timeout are `BenchOptions`' too).
#[derive(Clone, Debug)]
pub struct IscsiTarget {
    /// TargetName.
    pub iqn: String,
    /// Logical unit.
    pub lun: u64,
    /// InitiatorName.
    pub initiator_name: String,
    /// One-way CHAP user name and secret.
    pub chap: Option<(String, String)>,
}

impl Default for IscsiTarget {
    fn default() -> Self {
        IscsiTarget {
            iqn: "iqn.2026-11.io.ironwire:default".into(),
            lun: 0,
            initiator_name: "iqn.2026-11.io.ironwire:bench".into(),
            chap: None,
        }
    }
}

/// An iSCSI session error as this crate's error.
fn err(e: iscsi::Error) -> Error {
    match e {
        iscsi::Error::Io(e) => Error::Io(e),
        iscsi::Error::Closed => Error::Closed,
        iscsi::Error::Timeout { what, after } => Error::Timeout { what, after },
        iscsi::Error::Invalid(s) => Error::Invalid(s),
        other => Error::Protocol(format!("iSCSI: {other}")),
    }
}

/// Logs in one session per job (ISIDs distinct per job) and runs the load
/// on LUN `target.lun`.
pub async fn run_iscsi(target: &IscsiTarget, opts: &BenchOptions) -> Result<Report> {
    if opts.jobs == 0 || opts.qd == 0 || opts.block_size == 0 {
        return Err(Error::Invalid("jobs, qd and block size must be > 0".into()));
    }
    let mut login = LoginOptions::new(&target.initiator_name, Some(&target.iqn));
    login.chap.clone_from(&target.chap);
    login.header_digest = opts.header_digest;
    login.data_digest = opts.data_digest;
    login.timeout = opts.timeout;
    let mut sessions = Vec::with_capacity(usize::from(opts.jobs));
    for j in 0..opts.jobs {
        // A random prefix per call, the job's global index in the last two
        // bytes: no two sessions of a run share an ISID.
        let g = opts.job_base.wrapping_add(j).to_be_bytes();
        let mut o = login.clone();
        o.isid[4..6].copy_from_slice(&g);
        let mut s = Session::connect(opts.addr, o).await.map_err(err)?;
        s.clear_unit_attentions(target.lun).await.map_err(err)?;
        sessions.push(s);
    }
    let cap = match sessions.first_mut() {
        Some(s) => s.read_capacity16(target.lun).await.map_err(err)?,
        None => return Err(Error::Invalid("no jobs".into())),
    };
    let size = cap.blocks.saturating_mul(u64::from(cap.block_len));
    let work = plan(opts, sessions.len(), cap.block_len, size)?;
    let start = work.first().map_or_else(Instant::now, |w| w.tally.finished);
    let mut handles = Vec::new();
    for (w, s) in work.into_iter().zip(sessions) {
        let job = SessionJob { s, lun: target.lun, qd: opts.qd as usize, w };
        handles.push(reactor::spawn(job.run()));
    }
    let mut results = Vec::new();
    let mut first_err = None;
    for h in handles {
        match h.await {
            Ok(t) => results.push(t),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(merge(opts, &results, start)),
    }
}

/// A job on one iSCSI session: commands are pipelined on the session.
struct SessionJob {
    s: Session,
    lun: u64,
    qd: usize,
    w: Workload,
}

impl SessionJob {
    async fn run(mut self) -> Result<Tally> {
        let io_bytes = self.w.io_bytes();
        let blocks = self.w.blocks_per_io;
        let mut in_flight: FxHashMap<u32, InFlight> =
            FxHashMap::with_capacity_and_hasher(self.qd * 2, Default::default());
        let depth = self.w.depth(self.qd);
        let mut now = Instant::now();
        loop {
            while self.s.outstanding() < depth {
                let Some(io) = self.w.next(now) else { break };
                let itt = if io.write {
                    let mut data = vec![0u8; io_bytes as usize];
                    self.w.fill(&io, &mut data);
                    self.s.submit(self.lun, &cdb::write16(io.lba, blocks), data, 0)
                } else {
                    self.s.submit(self.lun, &cdb::read16(io.lba, blocks), Vec::new(), io_bytes)
                }
                .map_err(err)?;
                in_flight.insert(itt, InFlight { submitted: now, io });
            }
            if self.s.outstanding() == 0 {
                if self.w.drained(now) {
                    continue;
                }
                break;
            }
            let (itt, r) = self.s.next_completion().await.map_err(err)?;
            now = Instant::now();
            let Some(f) = in_flight.remove(&itt) else {
                return Err(Error::Protocol(format!("completion for unknown ITT {itt:#x}")));
            };
            let r = r.check().map_err(err)?;
            if !f.io.write && r.data.len() != io_bytes as usize {
                return Err(Error::Protocol(format!(
                    "READ (16) returned {} bytes (expected {io_bytes})",
                    r.data.len()
                )));
            }
            self.w.complete(&f.io, f.submitted, now, &r.data);
        }
        if let Err(e) = self.s.logout().await {
            log::debug!("bench: iSCSI logout: {e}");
        }
        Ok(self.w.tally)
    }
}
