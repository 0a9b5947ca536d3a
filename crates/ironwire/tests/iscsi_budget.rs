//! `[limits] iscsi_write_budget` against the real daemon: a raw initiator
//! announces writes (InitialR2T=Yes, no immediate data) and withholds
//! their data. The target solicits data (R2T) only for the writes whose
//! buffers fit the budget, and the next once a buffer is given back.

mod common;

use common::iscsi_raw::{R2t, Raw};
use common::{toml, Daemon};

const TARGET: &str = "iqn.2026-11.io.ironwire.test:budget";
const HOST: &str = "iqn.2026-11.io.ironwire.test:host";
/// Each write's Expected Data Transfer Length.
const LEN: u32 = 64 << 10;
const WRITES: u32 = 4;

fn start(tag: &str, limits: &str) -> Daemon {
    Daemon::start_with(&format!("iscsi-budget-{tag}"), |_, port| {
        format!(
            "[[device]]\nname = \"null\"\nkind = \"null\"\nsize = \"64MiB\"\n\n{}{}[reactor]\ncores = [0]\n\n{limits}\n",
            toml::iscsi_target(TARGET, &["null"]),
            toml::iscsi_port(port)
        )
    })
}

fn write16(lba: u64, blocks: u32) -> [u8; 16] {
    initiator::iscsi::cdb::write16(lba, blocks)
}

/// Announces `WRITES` writes of `LEN` bytes without their data; returns
/// the R2Ts that came for them, and the next CmdSN and ExpStatSN.
fn announce(raw: &mut Raw) -> (Vec<R2t>, u32, u32) {
    let (cmd_sn, exp_stat_sn, _, _) = raw.host.sequence();
    for i in 0..WRITES {
        let cdb = write16(u64::from(i) * u64::from(LEN / 512), LEN / 512);
        raw.announce_write(0x100 + i, 0, &cdb, LEN, cmd_sn.wrapping_add(i), exp_stat_sn);
    }
    let next_sn = cmd_sn.wrapping_add(WRITES);
    (raw.r2ts_until_ping(next_sn, exp_stat_sn), next_sn, exp_stat_sn)
}

#[test]
fn default_budget_solicits_every_small_write_at_once() {
    let d = start("default", "");
    let mut raw = Raw::login(&d, HOST, TARGET);
    let (r2ts, _, _) = announce(&mut raw);
    let mut itts: Vec<u32> = r2ts.iter().map(|r| r.0).collect();
    itts.dedup();
    assert_eq!(itts, (0..WRITES).map(|i| 0x100 + i).collect::<Vec<_>>(), "{r2ts:?}");
}

#[test]
fn smaller_write_budget_solicits_one_write_at_a_time() {
    let d = start("small", "[limits]\niscsi_write_budget = \"64KiB\"\n");
    let mut raw = Raw::login(&d, HOST, TARGET);
    let (r2ts, cmd_sn, exp_stat_sn) = announce(&mut raw);
    // 64 KiB holds one write's buffer: only the first is solicited.
    assert!(!r2ts.is_empty() && r2ts.iter().all(|r| r.0 == 0x100), "{r2ts:?}");
    // Its data arrives; the buffer goes to the device and the budget
    // solicits the next write.
    for &r2t in &r2ts {
        raw.data_out(r2t, &vec![0x5a; r2t.3 as usize], exp_stat_sn);
    }
    let next: Vec<u32> = raw.r2ts_until_ping(cmd_sn, exp_stat_sn).iter().map(|r| r.0).collect();
    assert!(!next.is_empty() && next.iter().all(|&itt| itt == 0x101), "{next:?}");
}
