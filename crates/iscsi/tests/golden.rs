//! Golden vectors captured from real peers (see testdata/README.md): the
//! bytes libiscsi 1.x (iscsi-inq, iscsi-ls) sent to tgt, and tgt's answers.
//! Our decoder must read both sides, and our target must carry libiscsi's
//! recorded requests through login, commands and logout.

use iscsi::chap::Secret;
use iscsi::pdu::{self, flags, Bhs, Framing, Opcode, Stage};
use iscsi::target::{scsi_status, Event, Policy, Seed, State, TargetConfig, TargetConnection, TargetInfo};
use iscsi::text::{self, SessionType};
use std::sync::Arc;

const INQ_I2T: &[u8] = include_bytes!("../testdata/libiscsi-inq-initiator.bin");
const INQ_T2I: &[u8] = include_bytes!("../testdata/tgt-inq-target.bin");
const LS_I2T: &[u8] = include_bytes!("../testdata/libiscsi-ls-initiator.bin");
const LS_T2I: &[u8] = include_bytes!("../testdata/tgt-ls-target.bin");

const PLAIN: Framing = Framing { header_digest: false, data_digest: false, max_data_segment: 1 << 20 };

fn pdus(bytes: &[u8]) -> Vec<(Bhs, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let f = pdu::deframe(bytes.get(at..).unwrap_or_default(), PLAIN).expect("whole PDU").expect("valid PDU");
        out.push((f.bhs, f.data.to_vec()));
        at += f.len;
    }
    out
}

struct Tgt;

impl Policy for Tgt {
    fn target(&self, name: &str) -> Option<TargetInfo> {
        self.discovery_targets("").into_iter().find(|t| t.name == name)
    }
    fn initiator_allowed(&self, _target: &str, initiator: &str) -> bool {
        initiator == "iqn.2026-01.test:libiscsi"
    }
    fn discovery_targets(&self, _initiator: &str) -> Vec<TargetInfo> {
        vec![TargetInfo {
            name: "iqn.2026-11.example:tgt1".into(),
            alias: None,
            tpgt: 1,
            portals: vec!["127.0.0.1:3262,1".into()],
        }]
    }
    fn auth_required(&self, _target: Option<&str>, _initiator: &str) -> bool {
        false
    }
    fn chap_secret(&self, _target: Option<&str>, _initiator: &str, _user: &str) -> Option<Secret> {
        None
    }
    fn target_credentials(&self, _target: Option<&str>, _initiator: &str) -> Option<(String, Secret)> {
        None
    }
}

#[test]
fn decodes_libiscsi_login_request_byte_exact() {
    let p = pdus(INQ_I2T);
    let (b, data) = p.first().expect("login");
    assert_eq!(b.0.get(..4), Some(&[0x43u8, 0x87, 0, 0][..]));
    assert_eq!(b.opcode(), Opcode::LOGIN_REQ);
    assert!(b.immediate());
    assert_eq!((b.csg(), b.nsg(), b.flags() & flags::TRANSIT != 0), (Stage::OPERATIONAL, Stage::FULL_FEATURE, true));
    assert_eq!(b.itt(), 0x51ef_3f36);
    assert_eq!(b.tsih(), 0);
    assert_eq!(b.data_segment_length() as usize, data.len());
    let keys = text::parse(data).expect("text");
    assert!(keys.contains(&("InitiatorName".into(), "iqn.2026-01.test:libiscsi".into())));
    assert!(keys.contains(&("HeaderDigest".into(), "None,CRC32C".into())));
    let ops: Vec<(u8, u8)> = p.iter().map(|(b, _)| (b.0[0], b.flags())).collect();
    // Login, TEST UNIT READY x2, INQUIRY x2, immediate Logout.
    assert_eq!(ops, vec![(0x43, 0x87), (0x01, 0x81), (0x01, 0x81), (0x01, 0xc1), (0x01, 0xc1), (0x46, 0x80)]);
    assert_eq!(p.get(3).map(|(b, _)| b.cdb()[0]), Some(0x12));
}

#[test]
fn decodes_tgt_responses_with_phase_collapse() {
    let p = pdus(INQ_T2I);
    let (login, data) = p.first().expect("login response");
    assert_eq!(login.opcode(), Opcode::LOGIN_RESP);
    assert_eq!(login.login_status(), 0);
    assert_ne!(login.tsih(), 0);
    assert!(text::parse(data).expect("text").contains(&("TargetPortalGroupTag".into(), "1".into())));
    // The first TEST UNIT READY gets CHECK CONDITION with sense (UNIT ATTENTION).
    let (resp, sense) = p.get(1).expect("scsi response");
    assert_eq!((resp.opcode(), resp.byte3()), (Opcode::SCSI_RESP, scsi_status::CHECK_CONDITION));
    assert_eq!(sense.get(..2), Some(&[0u8, 18][..]));
    assert_eq!(sense.get(4), Some(&0x06), "sense key UNIT ATTENTION");
    let (din, inq) = p.get(3).expect("data-in");
    assert_eq!(din.opcode(), Opcode::DATA_IN);
    assert_eq!(din.flags(), flags::FINAL | flags::STATUS);
    assert_eq!(din.byte3(), scsi_status::GOOD);
    assert_eq!(din.data_sn(), 0);
    assert_eq!(inq.get(8..11), Some(&b"IET"[..]));
    assert_eq!(p.last().map(|(b, _)| b.opcode()), Some(Opcode::LOGOUT_RESP));
}

#[test]
fn our_target_serves_libiscsis_recorded_session() {
    let seed = Seed { tsih: 7, stat_sn: 1, chap_id: 0, chap_challenge: [0; 32] };
    let mut t = TargetConnection::<Vec<u8>>::new(TargetConfig::default(), Arc::new(Tgt), seed);
    t.handle_input(INQ_I2T).expect("valid stream");
    let mut cdbs = Vec::new();
    let mut logged_out = false;
    while let Some(ev) = t.poll_event() {
        match ev {
            Event::LoggedIn { initiator, session_type, .. } => {
                assert_eq!((initiator.as_str(), session_type), ("iqn.2026-01.test:libiscsi", SessionType::Normal));
            }
            Event::Command(c) => {
                cdbs.push(c.cdb.first().copied().unwrap_or(0));
                if c.read {
                    t.send_data_in(c.task, &[0; 36], Some(scsi_status::GOOD));
                } else {
                    t.send_response(c.task, scsi_status::GOOD, None, None);
                }
            }
            Event::LoggedOut { reason } => {
                assert_eq!(reason, 0);
                logged_out = true;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(cdbs, vec![0x00, 0x00, 0x12, 0x12]);
    assert!(logged_out);
    assert_eq!(t.state(), State::Closed);
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    let ops: Vec<Opcode> = pdus(&out).iter().map(|(b, _)| b.opcode()).collect();
    assert_eq!(ops.first(), Some(&Opcode::LOGIN_RESP));
    assert_eq!(ops.last(), Some(&Opcode::LOGOUT_RESP));
}

#[test]
fn our_target_answers_libiscsis_recorded_discovery() {
    let seed = Seed { tsih: 7, stat_sn: 1, chap_id: 0, chap_challenge: [0; 32] };
    let mut t = TargetConnection::<Vec<u8>>::new(TargetConfig::default(), Arc::new(Tgt), seed);
    t.handle_input(LS_I2T).expect("valid stream");
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    let ours = pdus(&out);
    let theirs = pdus(LS_T2I);
    let text_of = |p: &[(Bhs, Vec<u8>)]| {
        p.iter().find(|(b, _)| b.opcode() == Opcode::TEXT_RESP).map(|(_, d)| text::parse(d).expect("text"))
    };
    // Same SendTargets answer as tgt gives.
    assert_eq!(text_of(&ours), text_of(&theirs));
    assert_eq!(ours.last().map(|(b, _)| b.opcode()), Some(Opcode::LOGOUT_RESP));
}
