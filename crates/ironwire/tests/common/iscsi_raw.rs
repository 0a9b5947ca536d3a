//! A blocking iSCSI initiator on the sans-IO host that logs in, then sends
//! raw PDUs and reads the target's PDUs itself: for tests that withhold a
//! write's data or send what a well-behaved initiator would not.

use super::Daemon;
use iscsi::host::{HostConfig, HostConnection};
use iscsi::pdu::{self, flags, Bhs, Framing, Opcode, RESERVED_TAG};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// An R2T as received: ITT, TTT, Buffer Offset, Desired Data Transfer
/// Length.
pub type R2t = (u32, u32, u32, u32);

/// The raw initiator.
pub struct Raw {
    sock: TcpStream,
    /// Its sans-IO host (sequence numbers, raw sends).
    pub host: HostConnection,
    rx: Vec<u8>,
}

impl Raw {
    /// Logs `initiator` in to `target` on `d`, with InitialR2T=Yes and no
    /// immediate data: every write's data waits for an R2T.
    pub fn login(d: &Daemon, initiator: &str, target: &str) -> Raw {
        let sock = TcpStream::connect(d.addr).expect("connect");
        sock.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let mut cfg = HostConfig::new(initiator, Some(target));
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

    /// Sends one PDU.
    pub fn send(&mut self, bhs: &Bhs, data: &[u8]) {
        self.host.send_raw(bhs, &[], data);
        self.flush();
    }

    /// Announces a write of `len` bytes to `lun` (below 256) with `cdb`,
    /// without its data, as task `itt` with command number `cmd_sn`.
    pub fn announce_write(&mut self, itt: u32, lun: u64, cdb: &[u8], len: u32, cmd_sn: u32, exp_stat_sn: u32) {
        let mut c = Bhs::new(Opcode::SCSI_CMD);
        c.set_flags(flags::FINAL | flags::WRITE)
            .set_itt(itt)
            .set_lun(lun << 48)
            .set_expected_data_transfer_length(len)
            .set_cmd_sn(cmd_sn)
            .set_exp_stat_sn(exp_stat_sn)
            .set_cdb(cdb);
        self.send(&c, &[]);
    }

    /// Answers an R2T with its data, in one Data-Out PDU.
    pub fn data_out(&mut self, (itt, ttt, offset, _): R2t, data: &[u8], exp_stat_sn: u32) {
        let mut out = Bhs::new(Opcode::DATA_OUT);
        out.set_flags(flags::FINAL).set_itt(itt).set_ttt(ttt).set_buffer_offset(offset).set_exp_stat_sn(exp_stat_sn);
        self.send(&out, data);
    }

    /// The next PDU from the target.
    pub fn next(&mut self) -> (Bhs, Vec<u8>) {
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

    /// The R2Ts that arrive before the answer to a NOP-Out sent now, which
    /// the target sends after everything queued.
    pub fn r2ts_until_ping(&mut self, cmd_sn: u32, exp_stat_sn: u32) -> Vec<R2t> {
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

    /// The SCSI Response of task `itt`: its status and sense bytes (SPC
    /// fixed format, the data segment's length prefix taken off).
    pub fn response(&mut self, itt: u32) -> (u8, Vec<u8>) {
        loop {
            let (b, data) = self.next();
            if b.opcode() == Opcode::SCSI_RESP && b.itt() == itt {
                return (b.byte3(), data.get(2..).unwrap_or_default().to_vec());
            }
        }
    }
}
