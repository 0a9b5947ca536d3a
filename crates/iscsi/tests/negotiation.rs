//! Login negotiation and Text semantics against RFC 7143, the sans-IO
//! target driven with raw PDUs. Each test states the RFC's words.

use iscsi::chap::Secret;
use iscsi::pdu::{self, flags, Bhs, Framing, Opcode, RESERVED_TAG};
use iscsi::target::{Policy, Seed, State, TargetConfig, TargetConnection, TargetInfo};
use std::sync::Arc;

type Target = TargetConnection<Vec<u8>>;

const TARGET: &str = "iqn.2026-01.test:disk1";
const INITIATOR: &str = "iqn.2026-01.test:host1";

struct Open;

impl Policy for Open {
    fn target(&self, name: &str) -> Option<TargetInfo> {
        self.discovery_targets(INITIATOR).into_iter().find(|t| t.name == name)
    }
    fn initiator_allowed(&self, _target: &str, _initiator: &str) -> bool {
        true
    }
    fn discovery_targets(&self, _initiator: &str) -> Vec<TargetInfo> {
        vec![TargetInfo { name: TARGET.into(), alias: None, tpgt: 1, portals: vec!["127.0.0.1:3260,1".into()] }]
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

fn target() -> Target {
    let mut cfg = TargetConfig::default();
    cfg.params.header_digest = false;
    cfg.params.data_digest = false;
    Target::new(cfg, Arc::new(Open), Seed { tsih: 0x1234, stat_sn: 1000, chap_id: 7, chap_challenge: [5; 32] })
}

fn output(t: &mut Target) -> Vec<(Bhs, Vec<u8>)> {
    let mut bytes = Vec::new();
    t.take_transmit(&mut bytes);
    let framing = Framing { max_data_segment: 1 << 24, ..Framing::default() };
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(Ok(f)) = pdu::deframe(bytes.get(at..).unwrap_or_default(), framing) {
        out.push((f.bhs, f.data.to_vec()));
        at += f.len;
    }
    out
}

/// One Login Request CSG=1 -> NSG=3 with `text`; the Login Response.
fn login(t: &mut Target, text: &[u8]) -> (Bhs, Vec<(String, String)>) {
    let mut b = Bhs::new(Opcode::LOGIN_REQ);
    b.set_immediate(true)
        .set_login_flags(true, false, pdu::Stage(1), pdu::Stage(3))
        .set_isid([0x80, 0, 0, 0, 0, 1])
        .set_itt(1)
        .set_cmd_sn(1);
    let mut bytes = Vec::new();
    pdu::encode(&mut bytes, &b, &[], text, Framing::default());
    let _ = t.handle_input(&bytes);
    let (r, data) = output(t).into_iter().next().expect("a login response");
    (r, iscsi::text::parse(&data).expect("text"))
}

fn get<'a>(pairs: &'a [(String, String)], k: &str) -> Option<&'a str> {
    pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str())
}

/// RFC 7143 13.14: "FirstBurstLength MUST NOT exceed MaxBurstLength." The
/// target clamps the value it uses (target.rs, after the key loop) but has
/// already answered the unclamped one: the initiator and target then hold
/// different FirstBurstLength values, and unsolicited data the initiator
/// is entitled to by the answer is refused by the target.
#[test]
fn first_burst_length_answered_is_the_one_used() {
    let mut t = target();
    let text = format!(
        "InitiatorName={INITIATOR}\0SessionType=Normal\0TargetName={TARGET}\0\
         MaxBurstLength=16384\0FirstBurstLength=65536\0InitialR2T=No\0ImmediateData=Yes\0"
    );
    let (r, pairs) = login(&mut t, text.as_bytes());
    assert_eq!(r.login_status(), 0);
    assert_eq!(t.state(), State::FullFeature);
    let mbl: u32 = get(&pairs, "MaxBurstLength").expect("MBL answered").parse().expect("number");
    let fbl: u32 = get(&pairs, "FirstBurstLength").expect("FBL answered").parse().expect("number");
    assert_eq!(mbl, t.params().max_burst_length);
    assert!(fbl <= mbl, "answered FirstBurstLength={fbl} > MaxBurstLength={mbl}");
    assert_eq!(fbl, t.params().first_burst_length, "answer and value in use differ");
}

/// RFC 7143 11.11.1: "A Text Response with the F bit set to 0 MUST have a
/// Target Transfer Tag field set to a value other than the reserved value
/// 0xffffffff"; 11.11.4: the initiator copies that TTT into its next
/// request, and a request with TTT 0xffffffff "resets ... (restarts the
/// negotiation)". The answer to a Text Request with C=1 has F=0 and a TTT
/// of the target's, and the rest of the request, echoing it, is answered
/// as one (the answer had the reserved TTT before).
#[test]
fn text_request_with_continue_bit_is_answered_with_a_target_transfer_tag() {
    let mut t = target();
    let text = format!("InitiatorName={INITIATOR}\0SessionType=Discovery\0");
    let (r, _) = login(&mut t, text.as_bytes());
    assert_eq!(r.login_status(), 0);
    assert_eq!(t.state(), State::FullFeature);
    let exp_stat_sn = r.stat_sn().wrapping_add(1);
    let mut b = Bhs::new(Opcode::TEXT_REQ);
    b.set_immediate(true)
        .set_flags(flags::CONTINUE)
        .set_itt(9)
        .set_ttt(RESERVED_TAG)
        .set_cmd_sn(1)
        .set_exp_stat_sn(exp_stat_sn);
    let mut bytes = Vec::new();
    pdu::encode(&mut bytes, &b, &[], b"SendTarg", Framing::default());
    t.handle_input(&bytes).expect("accepted");
    let out = output(&mut t);
    let (resp, data) = out.first().expect("a Text Response");
    assert_eq!(resp.opcode(), Opcode::TEXT_RESP);
    assert!(data.is_empty());
    assert_eq!(resp.flags() & flags::FINAL, 0, "F=1 answering F=0 is a protocol error");
    assert_ne!(resp.ttt(), RESERVED_TAG, "F=0 Text Response with the reserved TTT");
    let mut b = Bhs::new(Opcode::TEXT_REQ);
    b.set_immediate(true)
        .set_flags(flags::FINAL)
        .set_itt(9)
        .set_ttt(resp.ttt())
        .set_cmd_sn(1)
        .set_exp_stat_sn(exp_stat_sn.wrapping_add(1));
    let mut bytes = Vec::new();
    pdu::encode(&mut bytes, &b, &[], b"ets=All\0", Framing::default());
    t.handle_input(&bytes).expect("accepted");
    let out = output(&mut t);
    let (resp, data) = out.first().expect("the answer");
    assert_eq!((resp.opcode(), resp.flags() & flags::FINAL), (Opcode::TEXT_RESP, flags::FINAL));
    assert!(String::from_utf8_lossy(data).contains(&format!("TargetName={TARGET}")), "{data:?}");
}
