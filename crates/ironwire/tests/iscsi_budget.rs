//! `[limits] iscsi_write_budget` against the real daemon: a raw initiator
//! announces writes (InitialR2T=Yes, no immediate data) and withholds
//! their data. The target solicits data (R2T) only for the writes whose
//! buffers fit the budget, and the next once a buffer is given back.

mod common;

use common::{toml, Daemon};
use iscsi::host::{HostConfig, HostConnection};
use iscsi::pdu::{self, flags, Bhs, Framing, Opcode, RESERVED_TAG};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

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

/// An R2T as received: ITT, TTT, Buffer Offset, Desired Data Transfer
/// Length.
type R2t = (u32, u32, u32, u32);

/// A blocking initiator on the sans-IO host: it logs in, then sends raw
/// PDUs and reads the target's PDUs itself.
struct Raw {
    sock: TcpStream,
    host: HostConnection,
    rx: Vec<u8>,
}

impl Raw {
    fn login(d: &Daemon) -> Raw {
        let sock = TcpStream::connect(d.addr).expect("connect");
        sock.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let mut cfg = HostConfig::new(HOST, Some(TARGET));
        cfg.params.initial_r2t = true;
        cfg.params.immediate_data = false;
        let mut raw = Raw { sock, host: HostConnection::new(cfg), rx: Vec::new() };
        while !raw.host.is_full_feature() {
            raw.flush();
            let mut buf = [0u8; 4096];
            let n = raw.sock.read(&mut buf).expect("login response");
            assert!(n > 0, "the target closed the login");
            raw.host.handle_input(&buf[..n]).expect("valid login response");
        }
        raw
    }

    fn flush(&mut self) {
        let mut out = Vec::new();
        self.host.take_transmit(&mut out);
        self.sock.write_all(&out).expect("send");
    }

    fn send(&mut self, bhs: &Bhs, data: &[u8]) {
        self.host.send_raw(bhs, &[], data);
        self.flush();
    }

    /// The next PDU from the target.
    fn next(&mut self) -> (Bhs, Vec<u8>) {
        let framing = Framing { header_digest: false, data_digest: false, max_data_segment: 1 << 24 };
        loop {
            if let Some(f) = pdu::deframe(&self.rx, framing) {
                let f = f.expect("a valid PDU");
                let pdu = (f.bhs, f.data.to_vec());
                let len = f.len;
                self.rx.drain(..len);
                return pdu;
            }
            let mut buf = [0u8; 65536];
            let n = self.sock.read(&mut buf).expect("a PDU within 10 s");
            assert!(n > 0, "the target closed the connection");
            self.rx.extend_from_slice(&buf[..n]);
        }
    }

    /// The R2Ts that arrive before the answer to a
    /// NOP-Out sent now, which the target sends after everything queued.
    fn r2ts_until_ping(&mut self, cmd_sn: u32, exp_stat_sn: u32) -> Vec<R2t> {
        let mut nop = Bhs::new(Opcode::NOP_OUT);
        nop.set_immediate(true);
        nop.set_flags(flags::FINAL)
            .set_itt(0x7000)
            .set_ttt(RESERVED_TAG)
            .set_cmd_sn(cmd_sn)
            .set_exp_stat_sn(exp_stat_sn);
        self.send(&nop, &[]);
        let mut r2ts = Vec::new();
        loop {
            let (b, _) = self.next();
            match b.opcode() {
                Opcode::R2T => r2ts.push((b.itt(), b.ttt(), b.buffer_offset(), b.residual_count())),
                Opcode::NOP_IN if b.itt() == 0x7000 => return r2ts,
                _ => {}
            }
        }
    }
}

fn write16(lba: u64, blocks: u32) -> [u8; 16] {
    initiator::iscsi::cdb::write16(lba, blocks)
}

/// Announces `WRITES` writes of `LEN` bytes without their data; returns
/// the R2Ts that came for them, and the next CmdSN and ExpStatSN.
fn announce(raw: &mut Raw) -> (Vec<R2t>, u32, u32) {
    let (cmd_sn, exp_stat_sn, _, _) = raw.host.sequence();
    for i in 0..WRITES {
        let mut c = Bhs::new(Opcode::SCSI_CMD);
        c.set_flags(flags::FINAL | flags::WRITE)
            .set_itt(0x100 + i)
            .set_expected_data_transfer_length(LEN)
            .set_cmd_sn(cmd_sn.wrapping_add(i))
            .set_exp_stat_sn(exp_stat_sn)
            .set_cdb(&write16(u64::from(i) * u64::from(LEN / 512), LEN / 512));
        raw.send(&c, &[]);
    }
    let next_sn = cmd_sn.wrapping_add(WRITES);
    (raw.r2ts_until_ping(next_sn, exp_stat_sn), next_sn, exp_stat_sn)
}

#[test]
fn default_budget_solicits_every_small_write_at_once() {
    let d = start("default", "");
    let mut raw = Raw::login(&d);
    let (r2ts, _, _) = announce(&mut raw);
    let mut itts: Vec<u32> = r2ts.iter().map(|r| r.0).collect();
    itts.dedup();
    assert_eq!(itts, (0..WRITES).map(|i| 0x100 + i).collect::<Vec<_>>(), "{r2ts:?}");
}

#[test]
fn smaller_write_budget_solicits_one_write_at_a_time() {
    let d = start("small", "[limits]\niscsi_write_budget = \"64KiB\"\n");
    let mut raw = Raw::login(&d);
    let (r2ts, cmd_sn, exp_stat_sn) = announce(&mut raw);
    // 64 KiB holds one write's buffer: only the first is solicited.
    assert!(!r2ts.is_empty() && r2ts.iter().all(|r| r.0 == 0x100), "{r2ts:?}");
    // Its data arrives; the buffer goes to the device and the budget
    // solicits the next write.
    for &(itt, ttt, offset, len) in &r2ts {
        let mut out = Bhs::new(Opcode::DATA_OUT);
        out.set_flags(flags::FINAL).set_itt(itt).set_ttt(ttt).set_buffer_offset(offset).set_exp_stat_sn(exp_stat_sn);
        raw.send(&out, &vec![0x5a; len as usize]);
    }
    let next: Vec<u32> = raw.r2ts_until_ping(cmd_sn, exp_stat_sn).iter().map(|r| r.0).collect();
    assert!(!next.is_empty() && next.iter().all(|&itt| itt == 0x101), "{next:?}");
}
