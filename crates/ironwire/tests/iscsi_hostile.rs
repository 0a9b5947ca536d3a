//! A hostile iSCSI initiator against the real daemon: it never finishes
//! its login, opens sessions past the target's limit, floods immediate
//! commands, and announces huge writes without sending their data. Each
//! gets the protocol's answer and a log line naming the limit, memory stays
//! bounded, and a well-behaved session keeps working.

mod common;

use common::{block_on, bounded, Daemon};
use initiator::iscsi::{cdb, LoginOptions, Session};
use iscsi::host::HostEvent;
use iscsi::pdu::{flags, Bhs, Opcode};
use iscsi::RejectReason;
use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

const TARGET: &str = "iqn.2026-11.io.ironwire.test:hostile";
const HOST: &str = "iqn.2026-11.io.ironwire.test:host";

/// A daemon with one null LUN (1 GiB, 512-byte blocks) and LUN 1 on a RAM
/// device that holds every read for a while, plus `extra` TOML.
fn start(tag: &str, extra: &str) -> Daemon {
    Daemon::start_with(&format!("iscsi-hostile-{tag}"), |_, port| {
        format!(
            r#"
[[device]]
name = "null"
kind = "null"
size = "1GiB"

[[device]]
name = "slow"
kind = "ram"
size = "1MiB"
read_latency_us = 500000

[[iscsi_target]]
iqn = "{TARGET}"
allow_any_initiator = true
[[iscsi_target.lun]]
lun = 0
device = "null"
[[iscsi_target.lun]]
lun = 1
device = "slow"

[[port]]
transport = "iscsi"
address = "127.0.0.1:{port}"

[reactor]
cores = [0]

{extra}
"#
        )
    })
}

async fn session(d: &Daemon) -> Session {
    let mut s = Session::connect(d.addr, LoginOptions::new(HOST, Some(TARGET))).await.expect("login");
    s.clear_unit_attentions(0).await.expect("LUN 0 ready");
    s
}

/// Reads until the daemon closes `sock`; panics if it stays open 10 s.
fn wait_closed_by_daemon(sock: &mut TcpStream) {
    sock.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut buf = [0u8; 512];
    loop {
        match sock.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("the daemon did not close a connection that never logged in: {e}"),
        }
    }
}

#[test]
fn connections_that_never_finish_their_login_are_closed_after_handshake_ms() {
    let mut d = start("handshake", "[timeouts]\nhandshake_ms = 300\n");
    let mut silent = TcpStream::connect(d.addr).expect("connect");
    let mut half = TcpStream::connect(d.addr).expect("connect");
    // Half a Login Request's header.
    std::io::Write::write_all(&mut half, &[0x43, 0x87, 0, 0, 0, 0, 0, 0x30, 0x40, 0, 0, 0]).expect("send");
    wait_closed_by_daemon(&mut silent);
    wait_closed_by_daemon(&mut half);
    let log = d.log();
    assert_eq!(log.matches("([timeouts] handshake_ms); closing").count(), 2, "{log}");
    // A login that does finish is not cut off, and keeps working past the deadline.
    block_on(bounded(30, async {
        let mut s = session(&d).await;
        reactor::sleep(Duration::from_millis(600)).await;
        s.read16(0, 0, 1, 512).await.expect("read after the login deadline passed");
    }));
    d.assert_alive();
}

/// Logs in with `opts`, which must be refused Out of resources (0x0302).
async fn refused_out_of_resources(d: &Daemon, opts: LoginOptions, what: &str) {
    match Session::connect(d.addr, opts).await {
        Err(e) => {
            let st = e.login_status().unwrap_or_else(|| panic!("not a login refusal: {e}"));
            assert_eq!((st.class(), st.detail()), (3, 2), "Out of resources");
        }
        Ok(_) => panic!("{what} was let in"),
    }
}

/// `[limits] sessions_per_host`: one peer address holds at most that many
/// sessions of a target, below `sessions_per_target`; another address
/// (127.0.0.2, also this machine) still gets in.
#[test]
fn login_past_sessions_per_host_is_refused_and_other_hosts_get_in() {
    let mut d = start("sessions-host", "[limits]\nsessions_per_host = 2\nsessions_per_target = 10\n");
    block_on(bounded(30, async {
        let _a = session(&d).await;
        let _b = session(&d).await;
        let mut opts = LoginOptions::new(HOST, Some(TARGET));
        opts.isid = [0x80, 0, 0, 0, 0, 9];
        refused_out_of_resources(&d, opts.clone(), "a third session from 127.0.0.1").await;
        assert!(d.log().contains("2 sessions from 127.0.0.1 ([limits] sessions_per_host)"), "{}", d.log());
        opts.source = Some("127.0.0.2".parse().expect("address"));
        let mut c = Session::connect(d.addr, opts).await.expect("a session from 127.0.0.2");
        c.read16(0, 0, 1, 512).await.expect("it reads");
    }));
    d.assert_alive();
}

#[test]
fn login_past_sessions_per_target_is_refused_out_of_resources() {
    let mut d = start("sessions", "[limits]\nsessions_per_target = 2\n");
    block_on(bounded(30, async {
        let mut a = session(&d).await;
        let mut b = session(&d).await;
        let mut opts = LoginOptions::new(HOST, Some(TARGET));
        opts.isid = [0x80, 0, 0, 0, 0, 9];
        refused_out_of_resources(&d, opts.clone(), "a third session").await;
        assert!(d.log().contains("already has 2 sessions ([limits] sessions_per_target)"), "{}", d.log());
        // The sessions that are in keep working.
        a.read16(0, 0, 1, 512).await.expect("first session reads");
        b.read16(0, 0, 1, 512).await.expect("second session reads");
        // A session that ends gives its place back.
        b.logout().await.expect("logout");
        let mut c = None;
        for _ in 0..50 {
            match Session::connect(d.addr, opts.clone()).await {
                Ok(s) => {
                    c = Some(s);
                    break;
                }
                Err(e) if e.login_status().is_some() => reactor::sleep(Duration::from_millis(20)).await,
                Err(e) => panic!("{e}"),
            }
        }
        let mut c = c.expect("a session once another logged out");
        c.clear_unit_attentions(0).await.expect("ready");
        c.read16(0, 0, 1, 512).await.expect("the new session reads");
    }));
    d.assert_alive();
}

#[test]
fn immediate_command_flood_past_tasks_per_session_is_rejected() {
    const LIMIT: usize = 8;
    let mut d = start("immediate", &format!("[limits]\ntasks_per_session = {LIMIT}\n"));
    block_on(bounded(30, async {
        let mut s = session(&d).await;
        s.clear_unit_attentions(1).await.expect("LUN 1 ready");
        let (cmd_sn, exp_stat_sn, _, _) = s.connection().sequence();
        // Reads of the slow LUN, so that the tasks stay open.
        for itt in 0..64u32 {
            let mut c = Bhs::new(Opcode::SCSI_CMD);
            c.set_flags(flags::FINAL | flags::READ)
                .set_lun(u64::from_be_bytes(scsi::encode_lun(1).expect("lun")))
                .set_itt(0x1000 + itt)
                .set_expected_data_transfer_length(512)
                .set_cmd_sn(cmd_sn)
                .set_exp_stat_sn(exp_stat_sn)
                .set_cdb(&cdb::read16(0, 1));
            c.set_immediate(true);
            s.send_raw(&c, &[], &[]).await.expect("send");
        }
        let mut rejected = 0;
        while rejected < 64 - LIMIT {
            match s.next_event().await.expect("a Reject for each command past the limit") {
                HostEvent::Reject { reason, .. } => {
                    assert_eq!(reason, RejectReason::IMMEDIATE_COMMAND_REJECT);
                    rejected += 1;
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(d.log().contains("tasks open, the session's limit"), "{}", d.log());
        // The session still works once the held reads are done.
        reactor::sleep(Duration::from_millis(700)).await;
        s.read16(0, 0, 1, 512).await.expect("read after the flood");
    }));
    d.assert_alive();
}

#[test]
fn writes_announcing_16_mib_without_data_do_not_make_the_daemon_hold_it() {
    const WRITES: u32 = 24;
    const LEN: u32 = 16 << 20;
    let mut d = start("edtl", "");
    block_on(bounded(60, async {
        let mut opts = LoginOptions::new(HOST, Some(TARGET));
        opts.params.initial_r2t = true;
        opts.params.immediate_data = false;
        let mut s = Session::connect(d.addr, opts).await.expect("login");
        s.clear_unit_attentions(0).await.expect("ready");
        let before = d.rss_kib();
        // WRITEs of 16 MiB each that never send a byte of their data.
        for i in 0..WRITES {
            let (cmd_sn, exp_stat_sn, _, _) = s.connection().sequence();
            let mut c = Bhs::new(Opcode::SCSI_CMD);
            c.set_flags(flags::FINAL | flags::WRITE)
                .set_itt(0x2000 + i)
                .set_expected_data_transfer_length(LEN)
                .set_cmd_sn(cmd_sn.wrapping_add(i))
                .set_exp_stat_sn(exp_stat_sn)
                .set_cdb(&cdb::write16(u64::from(i) * u64::from(LEN / 512), LEN / 512));
            s.send_raw(&c, &[], &[]).await.expect("send");
        }
        // A NOP answered after every write was taken in.
        let mut nop = Bhs::new(Opcode::NOP_OUT);
        let (cmd_sn, exp_stat_sn, _, _) = s.connection().sequence();
        nop.set_flags(flags::FINAL)
            .set_itt(0x3000)
            .set_ttt(iscsi::pdu::RESERVED_TAG)
            .set_cmd_sn(cmd_sn.wrapping_add(WRITES))
            .set_exp_stat_sn(exp_stat_sn);
        nop.set_immediate(true);
        s.send_raw(&nop, &[], &[]).await.expect("send");
        loop {
            match s.next_event().await.expect("the NOP-In") {
                HostEvent::NopIn { itt: 0x3000, .. } => break,
                _ => continue,
            }
        }
        let grown_mib: u64 = d.rss_kib().saturating_sub(before) / 1024;
        eprintln!("daemon RSS grew {grown_mib} MiB");
        // Allocated up front, the writes would hold 384 MiB.
        assert!(grown_mib < 96, "daemon RSS grew {grown_mib} MiB for writes that sent no data");
    }));
    d.assert_alive();
}

/// `[limits] iscsi_write_budget` bounds every write buffer a connection
/// holds, also those of writes that bring their data unasked. 120 writes
/// of 256 KiB, each with 252 KiB of immediate data and F clear (4 KiB of
/// unsolicited Data-Out announced, never sent), against a 64 KiB budget:
/// the first is let through (one write always is), the others end in
/// TASK SET FULL with their data dropped, and so does a write sent
/// meanwhile that brings part of its data unasked; one whose data all
/// came with its command holds nothing and runs. Before, each held its buffer outside the budget
/// (about 30 MiB here, bounded only by the CmdSN window).
#[test]
fn unsolicited_writes_that_never_finish_are_held_to_the_write_budget() {
    const WRITES: u32 = 120;
    const LEN: u32 = 256 << 10;
    const IMMEDIATE: usize = (256 - 4) << 10;
    let mut d = start("unsolicited-budget", "[limits]\niscsi_write_budget = \"64KiB\"\n");
    block_on(bounded(60, async {
        let mut s = session(&d).await;
        assert!(s.params().immediate_data && !s.params().initial_r2t, "{:?}", s.params());
        assert!(s.params().first_burst_length >= LEN, "{:?}", s.params());
        let before = d.rss_kib();
        let data = vec![0x5au8; IMMEDIATE];
        for i in 0..WRITES {
            let (cmd_sn, exp_stat_sn, _, _) = s.connection().sequence();
            let mut c = Bhs::new(Opcode::SCSI_CMD);
            // F clear: unsolicited Data-Out is to follow (it never does).
            c.set_flags(flags::WRITE)
                .set_itt(0x4000 + i)
                .set_expected_data_transfer_length(LEN)
                .set_cmd_sn(cmd_sn.wrapping_add(i))
                .set_exp_stat_sn(exp_stat_sn)
                .set_cdb(&cdb::write16(u64::from(i) * u64::from(LEN / 512), LEN / 512));
            s.send_raw(&c, &[], &data).await.expect("send");
        }
        s.connection_mut().skip_cmd_sn(WRITES);
        // The first write holds the budget (its data never completes): a
        // 1 MiB write bringing its first burst unasked is refused too, and
        // one whose data all came with it (nothing held) is not.
        let r = s.scsi(0, &cdb::write16(0, 2048), vec![0xa5; 1 << 20], 0).await.expect("answered");
        assert_eq!(r.status, 0x28, "TASK SET FULL while the budget is held: {r:?}");
        let r = s.scsi(0, &cdb::write16(0, 1), vec![0xa5; 512], 0).await.expect("answered");
        assert!(r.is_good(), "a write with all its data immediate: {r:?}");
        let grown_mib: u64 = d.rss_kib().saturating_sub(before) / 1024;
        eprintln!("daemon RSS grew {grown_mib} MiB with a 64 KiB write budget");
        // 30 MiB announced; 17 MiB of it was held before.
        assert!(grown_mib < 12, "daemon RSS grew {grown_mib} MiB for writes held against a 64 KiB write budget");
    }));
    d.assert_alive();
}

/// A command that returns data (INQUIRY) sent without the R bit and with
/// Expected Data Transfer Length 0: none of its data can go, and the
/// response says so as a residual overflow of all of it (RFC 7143
/// 11.4.5.1), as it does for a READ sent the same way.
#[test]
fn data_in_an_initiator_did_not_ask_for_is_reported_as_overflow() {
    let d = start("overflow", "");
    let mut raw = common::iscsi_raw::Raw::login(&d, HOST, TARGET);
    let (cmd_sn, exp_stat_sn, _, _) = raw.host.sequence();
    let mut c = Bhs::new(Opcode::SCSI_CMD);
    c.set_flags(flags::FINAL)
        .set_itt(0x10)
        .set_expected_data_transfer_length(0)
        .set_cmd_sn(cmd_sn)
        .set_exp_stat_sn(exp_stat_sn)
        .set_cdb(&[0x12, 0, 0, 0, 36, 0]);
    raw.send(&c, &[]);
    let b = loop {
        let (b, _) = raw.next();
        if b.opcode() == Opcode::SCSI_RESP && b.itt() == 0x10 {
            break b;
        }
        assert_ne!(b.opcode(), Opcode::DATA_IN, "Data-In for a command that expects none");
    };
    assert_eq!(b.byte3(), 0, "GOOD");
    assert_eq!((b.flags() & flags::OVERFLOW, b.residual_count()), (flags::OVERFLOW, 36), "flags {:#04x}", b.flags());
}
