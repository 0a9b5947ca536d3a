//! `[limits] read_budget` against the real daemon: a peer sends many large
//! reads of a slow device at once and never reads the data. Each read's
//! buffer waits for room in the connection's budget (buffers held plus
//! replies queued), so the daemon holds about the budget, not the
//! queue's depth times the transfer size (before, 100 NVMe reads of 1 MiB
//! or 200 iSCSI reads of 8 MiB took that much memory at once).

mod common;

use common::{block_on, bounded, toml, Daemon};
use initiator::iscsi::{cdb, LoginOptions, Session};
use initiator::{cmd, Controller, Options};
use iscsi::pdu::{flags, Bhs, Opcode};
use std::time::Duration;

const NQN: &str = "nqn.2026-11.io.ironwire:read-budget";
const IQN: &str = "iqn.2026-11.io.ironwire.test:read-budget";
const HOST_IQN: &str = "iqn.2026-11.io.ironwire.test:read-budget-host";

/// Each read is held by the device this long.
const HOLD_US: u64 = 2_000_000;
/// How much more memory the daemon may take for all of it: the budget
/// (8 MiB) and the replies it lets through, with room for the allocator.
const GROWTH_KIB: u64 = 64 << 10;

fn device() -> String {
    format!("[[device]]\nname = \"slow\"\nkind = \"ram\"\nsize = \"16MiB\"\nread_latency_us = {HOLD_US}\n\n")
}

/// Checks the daemon's growth while the reads are held (for NVMe/TCP the
/// device's latency is waited out before a read takes its buffer, so this
/// one holds for any build), again once they are done and their replies
/// wait unread, and once more after the peer closed the connection with
/// reads still waiting (they are dropped, not let through at once).
async fn check_growth(d: &Daemon, before: u64, what: &str, close: impl FnOnce()) {
    reactor::sleep(Duration::from_micros(HOLD_US / 2)).await;
    let held = d.rss_kib();
    reactor::sleep(Duration::from_micros(HOLD_US * 2)).await;
    let done = d.rss_kib();
    close();
    // Inside the device's hold of any read let through by the close.
    reactor::sleep(Duration::from_micros(HOLD_US / 4)).await;
    let closed = d.rss_kib();
    eprintln!(
        "{what}: RSS {before} KiB before, {held} KiB while held, {done} KiB with the replies unread, \
         {closed} KiB after the peer closed"
    );
    for (when, kib) in
        [("while the reads were held", held), ("with the replies unread", done), ("after the peer closed", closed)]
    {
        assert!(
            kib.saturating_sub(before) < GROWTH_KIB,
            "{what}: the daemon grew by {} MiB {when}",
            kib.saturating_sub(before) / 1024
        );
    }
}

#[test]
fn nvme_reads_of_a_peer_that_does_not_read_are_held_to_the_budget() {
    let mut d = Daemon::start_with("read-budget-nvme", |_, port| {
        format!(
            "{}[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n[[subsystem.namespace]]\ndevice = \"slow\"\n\n\
             [[port]]\naddress = \"127.0.0.1:{port}\"\n\n[reactor]\ncores = [0]\n",
            device()
        )
    });
    block_on(bounded(60, async {
        let opts = Options { io_queues: 1, queue_size: 128, ..Options::default() };
        let mut c = Controller::connect(d.addr, NQN, "nqn.2014-08.org.nvmexpress:uuid:read-budget", opts)
            .await
            .expect("connect");
        let before = d.rss_kib();
        let q = c.io_queue(0).expect("queue");
        // 100 reads of 1 MiB (MDTS), never collected.
        for i in 0..100u64 {
            q.submit(cmd::read(1, (i % 8) * 2048, 2048), Vec::new(), 1 << 20).expect("submit");
        }
        q.flush().await.expect("send");
        check_growth(&d, before, "NVMe/TCP", move || drop(c)).await;
    }));
    d.assert_alive();
}

#[test]
fn iscsi_reads_of_a_peer_that_does_not_read_are_held_to_the_budget() {
    let mut d = Daemon::start_with("read-budget-iscsi", |_, port| {
        format!("{}{}{}[reactor]\ncores = [0]\n", device(), toml::iscsi_target(IQN, &["slow"]), toml::iscsi_port(port))
    });
    block_on(bounded(60, async {
        let mut s = Session::connect(d.addr, LoginOptions::new(HOST_IQN, Some(IQN))).await.expect("login");
        s.clear_unit_attentions(0).await.expect("ready");
        let before = d.rss_kib();
        // 200 immediate READ(16)s of 8 MiB: the CmdSN window does not bound
        // immediate commands, only the session's task limit does.
        let len = 8u32 << 20;
        for i in 0..200u32 {
            let mut b = Bhs::new(Opcode::SCSI_CMD);
            b.set_immediate(true)
                .set_flags(flags::FINAL | flags::READ | 1)
                .set_lun(0)
                .set_itt(0x10_0000 + i)
                .set_expected_data_transfer_length(len)
                .set_cdb(&cdb::read16(0, len / 512));
            s.connection_mut().send_raw(&b, &[], &[]);
        }
        s.flush().await.expect("send");
        check_growth(&d, before, "iSCSI", move || drop(s)).await;
    }));
    d.assert_alive();
}

/// How long the small-budget daemon's slow LU holds each read.
const SLOW_HOLD_MS: u64 = 1_500;

/// A daemon whose iSCSI target has LUN 0 on a RAM device that holds each
/// read [`SLOW_HOLD_MS`] (and LUN 1 on a plain one when `two_luns`), and a
/// read budget of 64 KiB: one 64 KiB read fills it.
fn small_budget_iscsi(tag: &str, two_luns: bool) -> Daemon {
    Daemon::start_with(tag, |_, port| {
        let other = if two_luns { "[[device]]\nname = \"other\"\nkind = \"ram\"\nsize = \"4MiB\"\n\n" } else { "" };
        let luns: &[&str] = if two_luns { &["slow", "other"] } else { &["slow"] };
        format!(
            "[[device]]\nname = \"slow\"\nkind = \"ram\"\nsize = \"16MiB\"\nread_latency_us = {}\n\n{other}{}{}\
             [limits]\nread_budget = \"64KiB\"\n\n[reactor]\ncores = [0]\n",
            SLOW_HOLD_MS * 1000,
            toml::iscsi_target(IQN, luns),
            toml::iscsi_port(port)
        )
    })
}

/// An iSCSI read aborted while it waits for read budget ends there: the
/// abort is answered without waiting for room, and the read never reaches
/// the device (before, it waited for room, then read and threw the data
/// away, and the abort's answer waited for all of it).
#[test]
fn an_iscsi_read_aborted_while_it_waits_for_budget_never_reads() {
    let d = small_budget_iscsi("read-budget-abort", false);
    block_on(bounded(30, async {
        let mut s = Session::connect(d.addr, LoginOptions::new(HOST_IQN, Some(IQN))).await.expect("login");
        s.clear_unit_attentions(0).await.expect("ready");
        // The first read takes the whole budget while the device holds it;
        // the second waits for room.
        let blocks = (64u32 << 10) / 512;
        let first = s.submit(0, &cdb::read16(0, blocks), Vec::new(), 64 << 10).expect("submit");
        let second = s.submit(0, &cdb::read16(blocks.into(), blocks), Vec::new(), 64 << 10).expect("submit");
        s.flush().await.expect("send");
        reactor::sleep(Duration::from_millis(100)).await;
        assert_eq!(s.task_mgmt(1, 0, second).await.expect("abort answered"), 0, "function complete");
        // The LU's line in `ctl stats` (none before its first I/O ends).
        let reads = || {
            let text = d.ctl("stats").expect("stats");
            let line = text.lines().find(|l| l.starts_with("lun ")).unwrap_or_default();
            line.split_whitespace().find_map(|w| w.strip_prefix("reads=")).map_or(0, |n| n.parse().expect("a count"))
        };
        assert_eq!(reads(), 0, "the abort waited for a read");
        let (itt, r) = s.next_completion().await.expect("the first read completes");
        assert_eq!(itt, first);
        r.check().expect("GOOD");
        // Past the time the aborted read would have taken, had it run.
        reactor::sleep(Duration::from_millis(SLOW_HOLD_MS + 500)).await;
        assert_eq!(reads(), 1, "the aborted read reached the device");
    }));
}

/// Another session's LUN RESET does not wait for a read of this session
/// that waits for read budget: that read has not reached the device, so it
/// ends in TASK ABORTED and never reads (before, the reset waited for it to
/// get room and read, up to the fence's bound when its initiator does not
/// read).
#[test]
fn another_sessions_lun_reset_ends_a_read_waiting_for_budget() {
    let d = small_budget_iscsi("read-budget-fence", false);
    block_on(bounded(30, async {
        let mut a = Session::connect(d.addr, LoginOptions::new(HOST_IQN, Some(IQN))).await.expect("login A");
        a.clear_unit_attentions(0).await.expect("A ready");
        let other = format!("{HOST_IQN}-b");
        let mut b = Session::connect(d.addr, LoginOptions::new(&other, Some(IQN))).await.expect("login B");
        b.clear_unit_attentions(0).await.expect("B ready");
        let blocks = (64u32 << 10) / 512;
        let first = a.submit(0, &cdb::read16(0, blocks), Vec::new(), 64 << 10).expect("submit");
        let second = a.submit(0, &cdb::read16(blocks.into(), blocks), Vec::new(), 64 << 10).expect("submit");
        a.flush().await.expect("send");
        reactor::sleep(Duration::from_millis(100)).await;
        // B's reset waits for A's first read, which is on the device.
        assert_eq!(b.task_mgmt(5, 0, 0).await.expect("LUN RESET answered"), 0, "function complete");
        let mut got = Vec::new();
        for _ in 0..2 {
            let (itt, r) = a.next_completion().await.expect("A's reads are answered");
            got.push((itt, r.status));
        }
        got.sort_unstable();
        let mut want = vec![(first, 0x00), (second, 0x40)];
        want.sort_unstable();
        assert_eq!(got, want, "the first read GOOD, the one waiting for budget TASK ABORTED");
        reactor::sleep(Duration::from_millis(SLOW_HOLD_MS + 500)).await;
        let text = d.ctl("stats").expect("stats");
        let line = text.lines().find(|l| l.starts_with("lun ")).expect("the LU's line");
        assert!(line.contains(" reads=1 "), "the fenced read reached the device: {line}");
    }));
}

/// PERSISTENT RESERVE OUT `service_action` with 24 bytes of parameters.
fn prout(service_action: u8) -> [u8; 10] {
    [0x5F, service_action, if service_action == 0 { 0 } else { 1 }, 0, 0, 0, 0, 0, 24, 0]
}

/// PR OUT parameters: reservation key, service action reservation key.
fn pr_params(key: u64, sa_key: u64) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    p[..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    p
}

/// A session's own PREEMPT AND ABORT does not end its own read waiting for
/// read budget on that unit (only the preempted nexuses' tasks are
/// aborted), nor does its next fence on another unit (as `fence_scsi`
/// preempts device after device).
#[test]
fn a_preemptors_own_read_waiting_for_budget_survives_its_fences() {
    let d = small_budget_iscsi("read-budget-own-fence", true);
    block_on(bounded(30, async {
        let mut a = Session::connect(d.addr, LoginOptions::new(HOST_IQN, Some(IQN))).await.expect("login A");
        let other = format!("{HOST_IQN}-b");
        let mut b = Session::connect(d.addr, LoginOptions::new(&other, Some(IQN))).await.expect("login B");
        for lun in [0, 1] {
            a.clear_unit_attentions(lun).await.expect("A ready");
            b.clear_unit_attentions(lun).await.expect("B ready");
            assert!(a.scsi(lun, &prout(0), pr_params(0, 0xA), 0).await.expect("register A").is_good());
            assert!(b.scsi(lun, &prout(0), pr_params(0, 0xB), 0).await.expect("register B").is_good());
            assert!(b.scsi(lun, &prout(1), pr_params(0xB, 0), 0).await.expect("reserve B").is_good());
        }
        let blocks = (64u32 << 10) / 512;
        let first = a.submit(0, &cdb::read16(0, blocks), Vec::new(), 64 << 10).expect("submit");
        let second = a.submit(0, &cdb::read16(blocks.into(), blocks), Vec::new(), 64 << 10).expect("submit");
        a.flush().await.expect("send");
        reactor::sleep(Duration::from_millis(100)).await;
        let p0 = a.submit(0, &prout(5), pr_params(0xA, 0xB), 0).expect("submit");
        a.flush().await.expect("send");
        reactor::sleep(Duration::from_millis(50)).await;
        let p1 = a.submit(1, &prout(5), pr_params(0xA, 0xB), 0).expect("submit");
        a.flush().await.expect("send");
        let mut got = Vec::new();
        for _ in 0..4 {
            let (itt, r) = a.next_completion().await.expect("answered");
            got.push((itt, r.status));
        }
        got.sort_unstable();
        let mut want = vec![(first, 0x00), (second, 0x00), (p0, 0x00), (p1, 0x00)];
        want.sort_unstable();
        assert_eq!(got, want, "A's own read was ended (0x40: TASK ABORTED)");
    }));
}

/// Another session's PREEMPT AND ABORT ends the preempted session's read
/// waiting for read budget (TASK ABORTED, never read), and only that one:
/// a registrant it did not preempt keeps its waiting read, which runs.
#[test]
fn preempt_and_abort_ends_only_the_preempted_sessions_read_waiting_for_budget() {
    let d = small_budget_iscsi("read-budget-preempt", false);
    block_on(bounded(30, async {
        let login = |name: String| Session::connect(d.addr, LoginOptions::new(&name, Some(IQN)));
        let mut a = login(format!("{HOST_IQN}-a")).await.expect("login A");
        let mut b = login(format!("{HOST_IQN}-b")).await.expect("login B");
        let mut c = login(format!("{HOST_IQN}-c")).await.expect("login C");
        for (s, key) in [(&mut a, 0xA), (&mut b, 0xB), (&mut c, 0xC)] {
            s.clear_unit_attentions(0).await.expect("ready");
            assert!(s.scsi(0, &prout(0), pr_params(0, key), 0).await.expect("register").is_good());
        }
        // WRITE EXCLUSIVE - REGISTRANTS ONLY, held by B.
        let mut reserve = prout(1);
        reserve[2] = 5;
        assert!(b.scsi(0, &reserve, pr_params(0xB, 0), 0).await.expect("reserve B").is_good());
        // A and B each: a read on the device that fills the budget, and one
        // waiting for room.
        let blocks = (64u32 << 10) / 512;
        let mut reads = Vec::new();
        for s in [&mut a, &mut b] {
            let first = s.submit(0, &cdb::read16(0, blocks), Vec::new(), 64 << 10).expect("submit");
            let second = s.submit(0, &cdb::read16(blocks.into(), blocks), Vec::new(), 64 << 10).expect("submit");
            s.flush().await.expect("send");
            reads.push((first, second));
        }
        reactor::sleep(Duration::from_millis(100)).await;
        let mut preempt = prout(5);
        preempt[2] = 5;
        let r = c.scsi(0, &preempt, pr_params(0xC, 0xB), 0).await.expect("PREEMPT AND ABORT");
        assert!(r.is_good(), "{r:?}");
        for (s, (first, second), want, who) in [
            (&mut a, reads[0], 0x00, "not preempted: its read runs"),
            (&mut b, reads[1], 0x40, "preempted: TASK ABORTED"),
        ] {
            let mut got = Vec::new();
            for _ in 0..2 {
                let (itt, r) = s.next_completion().await.expect("the reads are answered");
                got.push((itt, r.status));
            }
            got.sort_unstable();
            let mut expected = vec![(first, 0x00), (second, want)];
            expected.sort_unstable();
            assert_eq!(got, expected, "{who}");
        }
    }));
}
