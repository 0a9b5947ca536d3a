//! What a hostile initiator can make one target connection hold: tasks
//! (immediate commands included) and write buffers. The target is fed raw
//! PDUs after a normal login; write buffers are counted as they are
//! allocated and dropped. No sockets.

use iscsi::host::{HostConfig, HostConnection};
use iscsi::pdu::{self, flags, Bhs, Framing, Opcode};
use iscsi::target::{
    scsi_status, tmf_response, Event, Policy, Seed, State, TargetConfig, TargetConnection, TargetInfo, TaskRef,
    TmfFunction,
};
use iscsi::{DataBuffer, RejectReason};
use std::cell::Cell;
use std::sync::Arc;

const TARGET: &str = "iqn.2026-01.test:disk1";
const INITIATOR: &str = "iqn.2026-01.test:host1";

struct Open;

impl Policy for Open {
    fn target(&self, name: &str) -> Option<TargetInfo> {
        (name == TARGET).then(|| TargetInfo { name: TARGET.into(), alias: None, tpgt: 1, portals: Vec::new() })
    }
    fn initiator_allowed(&self, _target: &str, _initiator: &str) -> bool {
        true
    }
    fn discovery_targets(&self, _initiator: &str) -> Vec<TargetInfo> {
        Vec::new()
    }
    fn auth_required(&self, _target: Option<&str>, _initiator: &str) -> bool {
        false
    }
    fn chap_secret(&self, _: Option<&str>, _: &str, _: &str) -> Option<iscsi::chap::Secret> {
        None
    }
    fn target_credentials(&self, _: Option<&str>, _: &str) -> Option<(String, iscsi::chap::Secret)> {
        None
    }
}

thread_local! {
    /// Bytes of write buffers alive on this thread.
    static LIVE: Cell<usize> = const { Cell::new(0) };
}

/// A write buffer that counts the bytes alive.
#[derive(Debug)]
struct Counted(Vec<u8>);

impl DataBuffer for Counted {
    fn alloc(len: usize) -> Self {
        LIVE.with(|l| l.set(l.get() + len));
        Counted(vec![0; len])
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        LIVE.with(|l| l.set(l.get() - self.0.len()));
    }
}

impl AsRef<[u8]> for Counted {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl AsMut<[u8]> for Counted {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

fn live() -> usize {
    LIVE.with(Cell::get)
}

type Target = TargetConnection<Counted>;

/// A target logged in to by a host that asked for R2Ts only
/// (InitialR2T=Yes, ImmediateData=No); the next CmdSN and ExpStatSN.
fn logged_in(tc: TargetConfig) -> (Target, u32, u32) {
    logged_in_with(tc, true)
}

/// As [`logged_in`], with InitialR2T and ImmediateData the opposite of
/// each other as `r2t_only` says.
fn logged_in_with(tc: TargetConfig, r2t_only: bool) -> (Target, u32, u32) {
    logged_in_host(tc, |hc| {
        hc.params.initial_r2t = r2t_only;
        hc.params.immediate_data = !r2t_only;
    })
}

/// As [`logged_in`], with the host's parameters as `host` sets them.
fn logged_in_host(tc: TargetConfig, host: impl FnOnce(&mut HostConfig)) -> (Target, u32, u32) {
    let mut hc = HostConfig::new(INITIATOR, Some(TARGET));
    hc.params.header_digest = false;
    hc.params.data_digest = false;
    host(&mut hc);
    let mut h = HostConnection::new(hc);
    let seed = Seed { tsih: 1, stat_sn: 10, chap_id: 1, chap_challenge: [7; 32] };
    let mut t = Target::new(tc, Arc::new(Open), seed);
    for _ in 0..10 {
        let mut bytes = Vec::new();
        h.take_transmit(&mut bytes);
        t.handle_input(&bytes).expect("login");
        let mut back = Vec::new();
        t.take_transmit(&mut back);
        h.handle_input(&back).expect("login response");
    }
    assert_eq!(t.state(), State::FullFeature);
    while t.poll_event().is_some() {}
    let (cmd_sn, exp_stat_sn, _, _) = h.sequence();
    (t, cmd_sn, exp_stat_sn)
}

fn config() -> TargetConfig {
    let mut c = TargetConfig::default();
    c.params.header_digest = false;
    c.params.data_digest = false;
    c
}

fn feed(t: &mut Target, bhs: &Bhs, data: &[u8]) {
    let mut bytes = Vec::new();
    pdu::encode(&mut bytes, bhs, &[], data, Framing::default());
    t.handle_input(&bytes).expect("not fatal");
}

fn output(t: &mut Target) -> Vec<(Bhs, Vec<u8>)> {
    let mut bytes = Vec::new();
    t.take_transmit(&mut bytes);
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(Ok(f)) = pdu::deframe(bytes.get(at..).unwrap_or_default(), Framing::default()) {
        out.push((f.bhs, f.data.to_vec()));
        at += f.len;
    }
    out
}

fn read_cmd(itt: u32, cmd_sn: u32, immediate: bool) -> Bhs {
    let mut c = Bhs::new(Opcode::SCSI_CMD);
    c.set_flags(flags::FINAL | flags::READ)
        .set_itt(itt)
        .set_expected_data_transfer_length(512)
        .set_cmd_sn(cmd_sn)
        .set_cdb(&[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
    c.set_immediate(immediate);
    c
}

fn write_cmd(itt: u32, cmd_sn: u32, len: u32) -> Bhs {
    let blocks = u16::try_from(len / 512).expect("blocks").to_be_bytes();
    let mut c = Bhs::new(Opcode::SCSI_CMD);
    c.set_flags(flags::FINAL | flags::WRITE)
        .set_itt(itt)
        .set_expected_data_transfer_length(len)
        .set_cmd_sn(cmd_sn)
        .set_cdb(&[0x2a, 0, 0, 0, 0, 0, 0, blocks[0], blocks[1], 0]);
    c
}

fn commands(t: &mut Target) -> Vec<TaskRef> {
    std::iter::from_fn(|| t.poll_event())
        .filter_map(|e| match e {
            Event::Command(c) => Some(c.task),
            _ => None,
        })
        .collect()
}

#[test]
fn cmd_sn_window_never_opens_past_the_task_limit() {
    let (t, _, _) = logged_in(TargetConfig { queue_depth: 128, max_tasks: 3, ..config() });
    let (exp, max) = t.cmd_window();
    assert_eq!(max.wrapping_sub(exp).wrapping_add(1), 3, "window of {exp}..={max}");
}

#[test]
fn immediate_commands_past_the_task_limit_are_rejected_and_hold_nothing() {
    let (mut t, cmd_sn, _) = logged_in(TargetConfig { max_tasks: 4, ..config() });
    // Immediate commands carry the next CmdSN and do not advance it; the
    // window does not bound them, the task limit does.
    for itt in 0..100 {
        feed(&mut t, &read_cmd(itt, cmd_sn, true), &[]);
    }
    assert_eq!(commands(&mut t).len(), 4, "tasks delivered");
    assert_eq!(t.open_tasks(), 4);
    let rejects: Vec<_> = output(&mut t).into_iter().filter(|(b, _)| b.opcode() == Opcode::REJECT).collect();
    assert_eq!(rejects.len(), 96);
    for (b, echoed) in &rejects {
        assert_eq!(RejectReason(b.byte2()), RejectReason::IMMEDIATE_COMMAND_REJECT);
        assert!(Bhs::from_slice(echoed).is_some_and(|e| e.immediate()), "the Reject echoes the command");
    }
    assert_eq!(t.state(), State::FullFeature);
}

#[test]
fn numbered_command_past_the_task_limit_gets_task_set_full() {
    let (mut t, cmd_sn, _) = logged_in(TargetConfig { max_tasks: 2, ..config() });
    feed(&mut t, &read_cmd(1, cmd_sn, true), &[]);
    feed(&mut t, &read_cmd(2, cmd_sn, true), &[]);
    // Inside the window, but the immediate commands took every task.
    feed(&mut t, &read_cmd(3, cmd_sn, false), &[]);
    let held = commands(&mut t);
    assert_eq!(held.len(), 2);
    let out = output(&mut t);
    let resp = out.iter().find(|(b, _)| b.opcode() == Opcode::SCSI_RESP).expect("a SCSI Response");
    assert_eq!((resp.0.itt(), resp.0.byte3()), (3, scsi_status::TASK_SET_FULL));
    // It used its CmdSN: the window moved past it and stays open.
    let (exp, max) = t.cmd_window();
    assert_eq!(exp, cmd_sn.wrapping_add(1));
    assert_eq!(max.wrapping_sub(exp).wrapping_add(1), 2);
    // Once a task is answered, the next command is taken.
    assert!(t.send_data_in(held[0], &[0; 512], Some(scsi_status::GOOD)));
    feed(&mut t, &read_cmd(4, exp, false), &[]);
    assert_eq!(commands(&mut t).len(), 1);
}

#[test]
fn write_buffers_wait_for_the_budget_until_data_can_arrive() {
    const LEN: u32 = 1 << 20;
    let (mut t, mut cmd_sn, _) = logged_in(TargetConfig { write_budget: u64::from(LEN), ..config() });
    let before = live();
    // Writes that announce 1 MiB each and never send a byte.
    for itt in 0..32 {
        feed(&mut t, &write_cmd(itt, cmd_sn, LEN), &[]);
        cmd_sn = cmd_sn.wrapping_add(1);
    }
    assert_eq!(t.open_tasks(), 32);
    assert_eq!(live() - before, LEN as usize, "only the first write got a buffer");
    let r2ts: Vec<Bhs> = output(&mut t).into_iter().map(|p| p.0).filter(|b| b.opcode() == Opcode::R2T).collect();
    assert!(!r2ts.is_empty() && r2ts.iter().all(|b| b.itt() == 0), "R2Ts only for the first write");
    // The first write's data arrives: it is delivered and the second one
    // gets its buffer and R2Ts.
    for r in &r2ts {
        let (start, end) = (r.buffer_offset(), r.buffer_offset() + r.residual_count());
        for (sn, at) in (start..end).step_by(65536).enumerate() {
            let n = (end - at).min(65536);
            let mut d = Bhs::new(Opcode::DATA_OUT);
            d.set_flags(if at + n == end { flags::FINAL } else { 0 })
                .set_itt(0)
                .set_ttt(r.ttt())
                .set_data_sn(sn as u32)
                .set_buffer_offset(at);
            feed(&mut t, &d, &vec![0x5a; n as usize]);
        }
    }
    let delivered: Vec<_> = std::iter::from_fn(|| t.poll_event())
        .filter_map(|e| match e {
            Event::Command(c) => Some(c),
            _ => None,
        })
        .collect();
    assert_eq!(delivered.len(), 1);
    assert!(delivered[0].data.as_ref().is_some_and(|d| d.0.iter().all(|&b| b == 0x5a)));
    drop(delivered);
    let next: Vec<Bhs> = output(&mut t).into_iter().map(|p| p.0).filter(|b| b.opcode() == Opcode::R2T).collect();
    assert!(!next.is_empty() && next.iter().all(|b| b.itt() == 1), "R2Ts for the second write: {next:?}");
    assert_eq!(live() - before, LEN as usize);
}

fn tmf(itt: u32, cmd_sn: u32, function: TmfFunction, referenced: u32) -> Bhs {
    let mut b = Bhs::new(Opcode::TASK_MGMT_REQ);
    b.set_immediate(true)
        .set_flags(flags::FINAL | function.0)
        .set_itt(itt)
        .set_referenced_task_tag(referenced)
        .set_ref_cmd_sn(cmd_sn)
        .set_cmd_sn(cmd_sn);
    b
}

#[test]
fn request_reusing_the_itt_of_a_pending_task_management_request_is_rejected_and_changes_nothing() {
    let (mut t, cmd_sn, _) = logged_in(config());
    // A write still waiting for its data, and an abort of it.
    feed(&mut t, &write_cmd(5, cmd_sn, 4096), &[]);
    let mut abort = tmf(7, cmd_sn.wrapping_add(1), TmfFunction::ABORT_TASK, 5);
    abort.set_ref_cmd_sn(cmd_sn);
    let cmd_sn = cmd_sn.wrapping_add(1);
    feed(&mut t, &abort, &[]);
    let events: Vec<_> = std::iter::from_fn(|| t.poll_event()).collect();
    assert!(matches!(events.as_slice(), [Event::TaskMgmt { itt: 7, .. }]), "{events:?}");
    output(&mut t);
    // The same ITT again: as a SCSI command and as another request.
    feed(&mut t, &read_cmd(7, cmd_sn, true), &[]);
    feed(&mut t, &tmf(7, cmd_sn, TmfFunction::TASK_REASSIGN, 5), &[]);
    feed(&mut t, &tmf(7, cmd_sn, TmfFunction::ABORT_TASK_SET, 0), &[]);
    assert!(t.poll_event().is_none(), "nothing reaches the upper layer");
    let out = output(&mut t);
    assert_eq!(out.len(), 3, "{out:?}");
    for (b, _) in &out {
        assert_eq!(b.opcode(), Opcode::REJECT);
        assert_eq!(RejectReason(b.byte2()), RejectReason::TASK_IN_PROGRESS);
    }
    // The first request is still the one answered, and it ends the write.
    assert!(t.send_tmf_response(7, tmf_response::COMPLETE));
    let out = output(&mut t);
    assert!(
        matches!(out.as_slice(), [(b, _)] if b.opcode() == Opcode::TASK_MGMT_RESP && b.itt() == 7 && b.byte2() == 0)
    );
    assert_eq!(t.open_tasks(), 0);
    let mut logout = Bhs::new(Opcode::LOGOUT_REQ);
    logout.set_immediate(true).set_flags(flags::FINAL).set_itt(9).set_cmd_sn(cmd_sn);
    feed(&mut t, &logout, &[]);
    assert!(output(&mut t).iter().any(|(b, _)| b.opcode() == Opcode::LOGOUT_RESP && b.itt() == 9));
}

#[test]
fn immediate_writes_announcing_unsolicited_data_hold_no_more_than_the_budget() {
    const BUDGET: u64 = 4 << 20;
    const LEN: u32 = 256 << 10;
    let (mut t, cmd_sn, _) = logged_in_with(TargetConfig { write_budget: BUDGET, ..config() }, false);
    assert!(!t.params().initial_r2t && t.params().immediate_data);
    assert_eq!(t.params().first_burst_length, LEN);
    let before = live();
    // Immediate writes that promise a first burst (F=0) and never send it;
    // the CmdSN window does not bound them.
    for itt in 0..200 {
        let mut c = write_cmd(itt, cmd_sn, LEN);
        c.set_flags(flags::WRITE).set_immediate(true);
        feed(&mut t, &c, &[]);
    }
    let held = live() - before;
    assert!(held as u64 <= BUDGET, "{held} bytes held");
    assert_eq!(t.open_tasks() as u64, BUDGET / u64::from(LEN));
    let rejects: Vec<_> = output(&mut t).into_iter().filter(|(b, _)| b.opcode() == Opcode::REJECT).collect();
    assert_eq!(rejects.len(), 200 - t.open_tasks());
    assert!(rejects.iter().all(|(b, _)| RejectReason(b.byte2()) == RejectReason::IMMEDIATE_COMMAND_REJECT));
    assert_eq!(t.state(), State::FullFeature);
}

#[test]
fn task_management_with_the_reserved_itt_is_rejected() {
    let (mut t, cmd_sn, _) = logged_in(config());
    feed(&mut t, &tmf(0xffff_ffff, cmd_sn, TmfFunction::ABORT_TASK_SET, 0), &[]);
    assert!(t.poll_event().is_none(), "nothing reaches the upper layer");
    let out = output(&mut t);
    assert!(
        matches!(out.as_slice(), [(b, _)] if b.opcode() == Opcode::REJECT
            && RejectReason(b.byte2()) == RejectReason::INVALID_PDU_FIELD),
        "{out:?}"
    );
    // The session goes on: a request with a proper ITT is taken.
    feed(&mut t, &tmf(8, cmd_sn, TmfFunction::ABORT_TASK_SET, 0), &[]);
    assert!(matches!(t.poll_event(), Some(Event::TaskMgmt { itt: 8, .. })));
}

/// A write whose whole data came in its command PDU (immediate data, F
/// set) needs no buffer kept for data yet to come: it is handed on in the
/// same call, and is never refused for the write budget, even while
/// another write holds all of it.
#[test]
fn a_write_with_all_its_data_immediate_is_not_refused_for_budget() {
    const BIG: u32 = 1 << 20;
    let (mut t, cmd_sn, _) = logged_in_with(TargetConfig { write_budget: u64::from(BIG), ..config() }, false);
    assert!(t.params().immediate_data);
    // A: 1 MiB, no immediate data, waits for its R2Ts' data (holds the budget).
    feed(&mut t, &write_cmd(1, cmd_sn, BIG), &[]);
    output(&mut t);
    // B: 4 KiB, all of it immediate, F set: nothing more to come.
    feed(&mut t, &write_cmd(2, cmd_sn.wrapping_add(1), 4096), &[0x11; 4096]);
    let out = output(&mut t);
    let tsf = out
        .iter()
        .any(|(b, _)| b.opcode() == Opcode::SCSI_RESP && b.itt() == 2 && b.byte3() == scsi_status::TASK_SET_FULL);
    assert!(!tsf, "a write with all its data already received was refused TASK SET FULL");
    assert_eq!(commands(&mut t).len(), 1, "B delivered");
}

/// A NOP-Out's ping data comes back in the NOP-In, which the initiator
/// takes only up to the MaxRecvDataSegmentLength it declared (RFC 7143
/// 11.18.5: "the length of the reflected data is limited to
/// MaxRecvDataSegmentLength"): ping data longer than that (within what
/// the target declared) is never echoed whole.
#[test]
fn nop_in_echo_never_passes_the_initiators_max_recv_data_segment_length() {
    let (mut t, cmd_sn, _) = logged_in_host(config(), |hc| hc.params.max_recv_data_segment_length = 8192);
    assert_eq!(t.params().peer_max_recv_data_segment_length, 8192);
    assert!(t.params().max_recv_data_segment_length > 16384);
    let mut nop = Bhs::new(Opcode::NOP_OUT);
    nop.set_immediate(true).set_flags(flags::FINAL).set_itt(3).set_ttt(0xffff_ffff).set_cmd_sn(cmd_sn);
    feed(&mut t, &nop, &[0x42; 16384]);
    let mut bytes = Vec::new();
    t.take_transmit(&mut bytes);
    let b = Bhs::from_slice(&bytes).expect("an answer");
    assert!(
        b.data_segment_length() <= 8192,
        "{:?} of {} bytes to an initiator that takes 8192",
        b.opcode(),
        b.data_segment_length()
    );
    assert_eq!(t.state(), State::FullFeature);
}

/// A write still collecting its data stays out of reach of the upper layer
/// while any task management request whose scope holds it is pending:
/// another request over the same task that is answered otherwise than
/// "function complete" (here I_T NEXUS RESET, which the daemon does not
/// support) does not let it run under the first one, whose "function
/// complete" would then end a write that reached the device.
#[test]
fn a_refused_task_management_request_does_not_release_a_write_another_one_is_aborting() {
    let (mut t, cmd_sn, _) = logged_in(config());
    feed(&mut t, &write_cmd(5, cmd_sn, 4096), &[]);
    let r2t = output(&mut t).into_iter().map(|p| p.0).find(|b| b.opcode() == Opcode::R2T).expect("an R2T");
    // ABORT TASK SET over the write, left pending (the daemon waits for
    // the LUN's running commands before it answers).
    feed(&mut t, &tmf(7, cmd_sn.wrapping_add(1), TmfFunction::ABORT_TASK_SET, 0), &[]);
    assert!(matches!(t.poll_event(), Some(Event::TaskMgmt { itt: 7, .. })));
    // I_T NEXUS RESET over every task, refused.
    feed(&mut t, &tmf(8, cmd_sn.wrapping_add(1), TmfFunction::I_T_NEXUS_RESET, 0), &[]);
    assert!(matches!(t.poll_event(), Some(Event::TaskMgmt { itt: 8, .. })));
    assert!(t.send_tmf_response(8, tmf_response::NOT_SUPPORTED));
    output(&mut t);
    // The write's data comes (the initiator sends what it was asked for).
    let mut d = Bhs::new(Opcode::DATA_OUT);
    d.set_flags(flags::FINAL).set_itt(5).set_ttt(r2t.ttt()).set_data_sn(0).set_buffer_offset(0);
    feed(&mut t, &d, &[0x5a; 4096]);
    assert!(commands(&mut t).is_empty(), "a write in a pending ABORT TASK SET's scope was handed on");
    assert!(t.send_tmf_response(7, tmf_response::COMPLETE));
    assert_eq!(t.open_tasks(), 0);
}

/// RFC 7143 11.4.2: while data from the initiator is still expected (the
/// command announced unsolicited Data-Out with F=0), the target waits for
/// the Data-Out with the F bit before it sends the SCSI Response, even
/// when the command is refused outright (here past the task limit).
#[test]
fn task_set_full_for_a_write_announcing_unsolicited_data_waits_for_its_last_data_out() {
    let (mut t, cmd_sn, _) = logged_in_with(TargetConfig { max_tasks: 1, ..config() }, false);
    assert!(!t.params().initial_r2t);
    feed(&mut t, &read_cmd(1, cmd_sn, true), &[]);
    assert_eq!(commands(&mut t).len(), 1);
    // Numbered, inside the window, past the task limit; 512 bytes of
    // immediate data and 512 more to come unsolicited.
    let mut c = write_cmd(2, cmd_sn, 1024);
    c.set_flags(flags::WRITE);
    feed(&mut t, &c, &[0x11; 512]);
    assert!(
        output(&mut t).iter().all(|(b, _)| b.opcode() != Opcode::SCSI_RESP),
        "a SCSI Response before the initiator's unsolicited data was all sent"
    );
    let mut d = Bhs::new(Opcode::DATA_OUT);
    d.set_flags(flags::FINAL).set_itt(2).set_ttt(0xffff_ffff).set_data_sn(0).set_buffer_offset(512);
    feed(&mut t, &d, &[0x22; 512]);
    let out = output(&mut t);
    let resp = out.iter().find(|(b, _)| b.opcode() == Opcode::SCSI_RESP).expect("a SCSI Response");
    assert_eq!((resp.0.itt(), resp.0.byte3()), (2, scsi_status::TASK_SET_FULL));
    assert!(out.iter().all(|(b, _)| b.opcode() != Opcode::REJECT), "the Data-Out was expected: {out:?}");
    assert!(commands(&mut t).is_empty(), "a refused write never reaches the upper layer");
    assert_eq!(t.open_tasks(), 1);
    // It used its CmdSN and gave its place in the window back.
    let (exp, max) = t.cmd_window();
    assert_eq!(exp, cmd_sn.wrapping_add(1));
    assert_eq!(max.wrapping_sub(exp).wrapping_add(1), 1);
}

/// As above, but the last unsolicited Data-Out lacks the F bit: the
/// initiator sends nothing more all the same, so the refused write gets
/// its status then (with a Reject for the PDU) instead of never.
#[test]
fn task_set_full_write_whose_last_data_out_lacks_the_f_bit_still_gets_its_status() {
    let (mut t, cmd_sn, _) = logged_in_with(TargetConfig { max_tasks: 1, ..config() }, false);
    feed(&mut t, &read_cmd(1, cmd_sn, true), &[]);
    assert_eq!(commands(&mut t).len(), 1);
    let mut c = write_cmd(2, cmd_sn, 1024);
    c.set_flags(flags::WRITE);
    feed(&mut t, &c, &[0x11; 512]);
    assert!(output(&mut t).is_empty());
    let mut d = Bhs::new(Opcode::DATA_OUT);
    d.set_flags(0).set_itt(2).set_ttt(0xffff_ffff).set_data_sn(0).set_buffer_offset(512);
    feed(&mut t, &d, &[0x22; 512]);
    let out = output(&mut t);
    let resp = out.iter().find(|(b, _)| b.opcode() == Opcode::SCSI_RESP).expect("a SCSI Response");
    assert_eq!((resp.0.itt(), resp.0.byte3()), (2, scsi_status::TASK_SET_FULL));
    let reject = out.iter().find(|(b, _)| b.opcode() == Opcode::REJECT).expect("a Reject");
    assert_eq!(reject.0.byte2(), RejectReason::PROTOCOL_ERROR.0);
    assert!(commands(&mut t).is_empty(), "a refused write never reaches the upper layer");
    assert_eq!(t.open_tasks(), 1);
}

/// A write whose F bit says unsolicited Data-Out follows while its
/// immediate data already fills the first burst (or the whole transfer)
/// is rejected (Protocol Error): no Data-Out may come, and it would wait
/// for ever. Other commands go on.
#[test]
fn f_bit_clear_with_the_first_burst_already_immediate_is_rejected() {
    let mut tc = config();
    tc.params.first_burst_length = 1024;
    let (mut t, cmd_sn, _) = logged_in_with(tc, false);
    assert!(!t.params().initial_r2t && t.params().first_burst_length == 1024);
    for (itt, len, immediate) in [(1u32, 2048u32, 1024usize), (2, 512, 512)] {
        let mut c = write_cmd(itt, cmd_sn.wrapping_add(itt - 1), len);
        c.set_flags(flags::WRITE);
        feed(&mut t, &c, &vec![0x33; immediate]);
        let out = output(&mut t);
        let (b, _) = out.first().expect("an answer");
        assert_eq!(
            (b.opcode(), RejectReason(b.byte2())),
            (Opcode::REJECT, RejectReason::PROTOCOL_ERROR),
            "ITT {itt}: {out:?}"
        );
        assert!(commands(&mut t).is_empty(), "ITT {itt} reached the upper layer");
    }
    feed(&mut t, &read_cmd(3, cmd_sn.wrapping_add(2), false), &[]);
    assert_eq!(commands(&mut t).len(), 1, "the session goes on");
}
