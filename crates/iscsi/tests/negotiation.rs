//! Login negotiation and Text semantics against RFC 7143, the sans-IO
//! target driven with raw PDUs. Each test states the RFC's words.

use iscsi::chap::Secret;
use iscsi::pdu::{self, flags, Bhs, Framing, Opcode, RESERVED_TAG};
use iscsi::target::{login_status, Policy, Seed, State, TargetConfig, TargetConnection, TargetInfo};
use iscsi::RejectReason;
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
    target_with(TargetConfig::default())
}

fn target_with(mut cfg: TargetConfig) -> Target {
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

/// One Login Request in the operational stage (CSG=1, NSG=3 when
/// `transit`); every PDU the target sends back.
fn login_pdu(t: &mut Target, transit: bool, cont: bool, text: &[u8]) -> Vec<(Bhs, Vec<u8>)> {
    let mut b = Bhs::new(Opcode::LOGIN_REQ);
    b.set_immediate(true)
        .set_login_flags(transit, cont, pdu::Stage(1), if transit { pdu::Stage(3) } else { pdu::Stage(0) })
        .set_isid([0x80, 0, 0, 0, 0, 1])
        .set_itt(1)
        .set_cmd_sn(1);
    let mut bytes = Vec::new();
    pdu::encode(&mut bytes, &b, &[], text, Framing::default());
    let _ = t.handle_input(&bytes);
    output(t)
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

/// A Text Request (ITT 9, CmdSN 1, immediate) with `flags_`, `ttt` and
/// `text`; every PDU the target sends back. A Reject is an answer too: the
/// connection must not end.
fn text_req(t: &mut Target, flags_: u8, ttt: u32, exp_stat_sn: u32, text: &[u8]) -> Vec<(Bhs, Vec<u8>)> {
    let mut b = Bhs::new(Opcode::TEXT_REQ);
    b.set_immediate(true).set_flags(flags_).set_itt(9).set_ttt(ttt).set_cmd_sn(1).set_exp_stat_sn(exp_stat_sn);
    let mut bytes = Vec::new();
    pdu::encode(&mut bytes, &b, &[], text, Framing::default());
    t.handle_input(&bytes).expect("an answer, not the end of the connection");
    output(t)
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
    let out = text_req(&mut t, flags::CONTINUE, RESERVED_TAG, exp_stat_sn, b"SendTarg");
    let (resp, data) = out.first().expect("a Text Response");
    assert_eq!(resp.opcode(), Opcode::TEXT_RESP);
    assert!(data.is_empty());
    assert_eq!(resp.flags() & flags::FINAL, 0, "F=1 answering F=0 is a protocol error");
    assert_ne!(resp.ttt(), RESERVED_TAG, "F=0 Text Response with the reserved TTT");
    let out = text_req(&mut t, flags::FINAL, resp.ttt(), exp_stat_sn.wrapping_add(1), b"ets=All\0");
    let (resp, data) = out.first().expect("the answer");
    assert_eq!((resp.opcode(), resp.flags() & flags::FINAL), (Opcode::TEXT_RESP, flags::FINAL));
    assert!(String::from_utf8_lossy(data).contains(&format!("TargetName={TARGET}")), "{data:?}");
}

/// RFC 7143 13.14: "FirstBurstLength MUST NOT exceed MaxBurstLength", and
/// 6.2: a key is negotiated once per login, so a FirstBurstLength answered
/// in one Login Response cannot be changed by a later one. Here the
/// initiator offers FirstBurstLength=262144 in one request and
/// MaxBurstLength=16384 in the next: its own offers break 13.14 and no
/// answer to MaxBurstLength (at most 16384) can mend it. The target used
/// to lower the FirstBurstLength it uses to 16384 without saying so, while
/// the initiator held the 262144 it was answered; it must refuse the
/// login instead (Initiator Error, RFC 7143 11.13.5), as FreeBSD's ctld
/// does.
#[test]
fn max_burst_length_below_an_already_answered_first_burst_length_is_refused() {
    let mut t = target();
    let text = format!(
        "InitiatorName={INITIATOR}\0SessionType=Normal\0TargetName={TARGET}\0\
         FirstBurstLength=262144\0InitialR2T=No\0"
    );
    let out = login_pdu(&mut t, false, false, text.as_bytes());
    let (r, data) = out.first().expect("a Login Response");
    assert_eq!(r.login_status(), 0);
    let pairs = iscsi::text::parse(data).expect("text");
    assert_eq!(get(&pairs, "FirstBurstLength"), Some("262144"));
    let out = login_pdu(&mut t, true, false, b"MaxBurstLength=16384\0");
    let (r, _) = out.first().expect("a Login Response");
    if r.login_status() == 0 {
        // Whatever the target chose, it must use what it answered.
        assert_eq!(t.params().first_burst_length, 262_144, "FirstBurstLength changed after it was answered");
    }
    assert_eq!(r.login_status(), login_status::INITIATOR_ERROR);
    assert_eq!(t.state(), State::Closed);
}

/// RFC 7143 13.14 again, with an initiator whose offers are consistent
/// (FirstBurstLength=262144, then MaxBurstLength=262144) and a target
/// configured for MaxBurstLength 65536 only: the FirstBurstLength answered
/// first must already fit under the MaxBurstLength the target will ever
/// agree to, so that the answer is the value used.
#[test]
fn first_burst_length_answered_before_max_burst_length_fits_the_targets_max_burst_length() {
    let mut cfg = TargetConfig::default();
    cfg.params.max_burst_length = 65536;
    cfg.params.first_burst_length = 262_144;
    let mut t = target_with(cfg);
    let text = format!(
        "InitiatorName={INITIATOR}\0SessionType=Normal\0TargetName={TARGET}\0\
         FirstBurstLength=262144\0InitialR2T=No\0"
    );
    let out = login_pdu(&mut t, false, false, text.as_bytes());
    let (r, data) = out.first().expect("a Login Response");
    assert_eq!(r.login_status(), 0);
    let fbl: u32 = get(&iscsi::text::parse(data).expect("text"), "FirstBurstLength")
        .expect("FBL answered")
        .parse()
        .expect("number");
    let out = login_pdu(&mut t, true, false, b"MaxBurstLength=262144\0");
    let (r, data) = out.first().expect("a Login Response");
    assert_eq!(r.login_status(), 0);
    assert_eq!(t.state(), State::FullFeature);
    assert_eq!(get(&iscsi::text::parse(data).expect("text"), "MaxBurstLength"), Some("65536"));
    assert_eq!(t.params().max_burst_length, 65536);
    assert_eq!(t.params().first_burst_length, fbl, "answered FirstBurstLength={fbl}, in use another");
    assert!(fbl <= 65536);
}

/// A login whose answer is longer than one Login Response may carry.
/// During login the default MaxRecvDataSegmentLength, 8192, applies to
/// both sides (RFC 7143 13.12), and RFC 7143 6.1/6.3 and 11.13.2 give
/// the way to send more: the text goes in parts, each Login Response but
/// the last with C=1 and T=0, and the initiator answers each with an empty
/// Login Request. 800 unknown keys fit one 8192-byte request but their
/// NotUnderstood answers take about 17 KB. The target used to send them in
/// one PDU of that length, which an initiator holding to 8192 refuses as a
/// protocol error. Splitting (rather than refusing the login) is what the
/// RFC provides for, the answer stays bounded by what the login may send
/// (`max_text_len` of key names in all), and it keeps a verbose but legal
/// initiator working; a request that brings data while the answer is still
/// being sent is an Initiator Error (RFC 7143 6.3: it "MUST answer with a
/// ... Login Request with no data segment").
#[test]
fn long_login_answer_is_sent_in_parts_with_the_continue_bit() {
    let mut t = target();
    let mut text = format!("InitiatorName={INITIATOR}\0SessionType=Normal\0TargetName={TARGET}\0").into_bytes();
    for i in 0..800 {
        iscsi::text::push(&mut text, &format!("Xa{i:04}"), "1");
    }
    assert!(text.len() <= 8192);
    let mut out = login_pdu(&mut t, true, false, &text);
    let mut answer = Vec::new();
    let mut parts = 0;
    loop {
        assert_eq!(out.len(), 1, "one Login Response per request");
        let (r, data) = out.pop().expect("a Login Response");
        assert_eq!(r.login_status(), 0);
        assert!(data.len() <= 8192, "Login Response of {} bytes during login", data.len());
        parts += 1;
        answer.extend_from_slice(&data);
        if r.flags() & flags::CONTINUE == 0 {
            assert_ne!(r.flags() & flags::TRANSIT, 0, "the last part carries the transit");
            assert_eq!(r.nsg(), pdu::Stage(3));
            break;
        }
        assert_eq!(r.flags() & flags::TRANSIT, 0, "C=1 with T=1");
        assert_eq!(t.state(), State::AwaitLogin);
        out = login_pdu(&mut t, true, false, &[]);
    }
    assert!(parts >= 3, "{parts} parts");
    assert_eq!(t.state(), State::FullFeature);
    let pairs = iscsi::text::parse(&answer).expect("the parts make one text");
    for i in 0..800 {
        assert_eq!(get(&pairs, &format!("Xa{i:04}")), Some("NotUnderstood"), "Xa{i:04}");
    }

    let mut t = target();
    let out = login_pdu(&mut t, false, false, &text);
    let (r, _) = out.first().expect("a Login Response");
    assert_ne!(r.flags() & flags::CONTINUE, 0);
    let out = login_pdu(&mut t, true, false, b"MaxBurstLength=16384\0");
    let (r, _) = out.first().expect("a Login Response");
    assert_eq!(r.login_status(), login_status::INITIATOR_ERROR);
    assert_eq!(t.state(), State::Closed);
}

/// RFC 7143 13.14 with FirstBurstLength left at its default (65536) and a
/// MaxBurstLength of 16384 offered first. A later request may still offer
/// FirstBurstLength, and its answer is then what both sides use; a login
/// that ends without offering it leaves the default, which the initiator
/// holds, above MaxBurstLength: the target used to lower the value it
/// uses without telling the initiator; it refuses the login instead,
/// unless no data may come unasked (then the key is irrelevant).
#[test]
fn max_burst_length_below_the_default_first_burst_length_needs_first_burst_length_offered() {
    let names = format!("InitiatorName={INITIATOR}\0SessionType=Normal\0TargetName={TARGET}\0");
    let mut t = target();
    let out = login_pdu(&mut t, false, false, format!("{names}MaxBurstLength=16384\0").as_bytes());
    let (r, _) = out.first().expect("a Login Response");
    assert_eq!(r.login_status(), 0);
    let out = login_pdu(&mut t, true, false, b"FirstBurstLength=32768\0");
    let (r, data) = out.first().expect("a Login Response");
    assert_eq!(r.login_status(), 0);
    assert_eq!(t.state(), State::FullFeature);
    assert_eq!(get(&iscsi::text::parse(data).expect("text"), "FirstBurstLength"), Some("16384"));
    assert_eq!((t.params().first_burst_length, t.params().max_burst_length), (16384, 16384));

    let mut t = target();
    let out = login_pdu(&mut t, true, false, format!("{names}MaxBurstLength=16384\0InitialR2T=No\0").as_bytes());
    let (r, _) = out.first().expect("a Login Response");
    if r.login_status() == 0 {
        assert_eq!(t.params().first_burst_length, 65536, "FirstBurstLength changed without an answer");
    }
    assert_eq!(r.login_status(), login_status::INITIATOR_ERROR);
    assert_eq!(t.state(), State::Closed);

    // With InitialR2T=Yes and ImmediateData=No no data comes unasked:
    // FirstBurstLength is irrelevant and the login goes on.
    let mut t = target();
    let text = format!("{names}MaxBurstLength=16384\0InitialR2T=Yes\0ImmediateData=No\0");
    let out = login_pdu(&mut t, true, false, text.as_bytes());
    let (r, _) = out.first().expect("a Login Response");
    assert_eq!(r.login_status(), 0);
    assert_eq!(t.state(), State::FullFeature);
}

/// RFC 7143 11.11.1: "A Text Response with the F bit set to 1 in response
/// to a Text Request with the F bit set to 0 is a protocol error." A Text
/// Request with F=0 and C=0 (the initiator has more to negotiate) is
/// answered with F=0 and a TTT of the target's, and the initiator's next
/// request, echoing it, goes on with the same exchange.
#[test]
fn text_request_without_final_bit_is_answered_without_final_bit() {
    let mut t = target();
    let (r, _) = login(&mut t, format!("InitiatorName={INITIATOR}\0SessionType=Discovery\0").as_bytes());
    assert_eq!(r.login_status(), 0);
    let exp_stat_sn = r.stat_sn().wrapping_add(1);
    let out = text_req(&mut t, 0, RESERVED_TAG, exp_stat_sn, b"SendTargets=All\0");
    let (resp, data) = out.first().expect("a Text Response");
    assert_eq!(resp.opcode(), Opcode::TEXT_RESP);
    assert!(String::from_utf8_lossy(data).contains(&format!("TargetName={TARGET}")), "{data:?}");
    assert_eq!(resp.flags() & flags::FINAL, 0, "F=1 answering F=0 is a protocol error");
    assert_ne!(resp.ttt(), RESERVED_TAG, "F=0 Text Response with the reserved TTT");
    let out = text_req(&mut t, flags::FINAL, resp.ttt(), exp_stat_sn.wrapping_add(1), &[]);
    let (resp, data) = out.first().expect("the last answer");
    assert_eq!((resp.opcode(), resp.flags() & flags::FINAL), (Opcode::TEXT_RESP, flags::FINAL));
    assert_eq!(resp.ttt(), RESERVED_TAG);
    assert!(data.is_empty());
}

/// RFC 7143 11.10: a Text Request with C=1 must have F=0; 11.11: the
/// initiator answers a Text Response with C=1 with an empty Text Request.
/// Either broken is a protocol error: a Reject, the session going on.
#[test]
fn text_requests_with_c_and_f_or_with_text_while_the_answer_continues_are_rejected() {
    let mut t = target();
    let (r, _) = login(&mut t, format!("InitiatorName={INITIATOR}\0SessionType=Discovery\0").as_bytes());
    assert_eq!(r.login_status(), 0);
    let sn = r.stat_sn().wrapping_add(1);
    let out = text_req(&mut t, flags::CONTINUE | flags::FINAL, RESERVED_TAG, sn, b"SendTargets=All\0");
    let (b, _) = out.first().expect("an answer");
    assert_eq!((b.opcode(), RejectReason(b.byte2())), (Opcode::REJECT, RejectReason::PROTOCOL_ERROR));
    assert_eq!(t.state(), State::FullFeature);

    // 400 keys the target does not know: an answer longer than 8 KiB.
    let keys: String = (0..400).map(|i| format!("X-ironwire-test-{i:04}=1\0")).collect();
    let out = text_req(&mut t, flags::FINAL, RESERVED_TAG, sn.wrapping_add(1), keys.as_bytes());
    let (b, _) = out.first().expect("the first part");
    assert_eq!((b.opcode(), b.flags() & (flags::CONTINUE | flags::FINAL)), (Opcode::TEXT_RESP, flags::CONTINUE));
    let out = text_req(&mut t, flags::FINAL, b.ttt(), sn.wrapping_add(2), b"SendTargets=All\0");
    let (b, _) = out.first().expect("an answer");
    assert_eq!((b.opcode(), RejectReason(b.byte2())), (Opcode::REJECT, RejectReason::PROTOCOL_ERROR));
    assert_eq!(t.state(), State::FullFeature);
}

/// RFC 7143 13.6: InitiatorAlias is declarative and may be sent at any
/// time ("Use: ALL"), in full feature phase too: a Text Request declaring
/// it gets no answer for it, not a Reject; a key that may be offered only
/// at login still gets one.
#[test]
fn initiator_alias_in_full_feature_phase_is_a_declaration_not_rejected() {
    let mut t = target();
    let (r, _) = login(&mut t, format!("InitiatorName={INITIATOR}\0SessionType=Discovery\0").as_bytes());
    assert_eq!(r.login_status(), 0);
    let sn = r.stat_sn().wrapping_add(1);
    let out = text_req(&mut t, flags::FINAL, RESERVED_TAG, sn, b"InitiatorAlias=host one\0MaxBurstLength=4096\0");
    let (b, data) = out.first().expect("an answer");
    assert_eq!((b.opcode(), b.flags() & flags::FINAL), (Opcode::TEXT_RESP, flags::FINAL));
    let pairs = iscsi::text::parse(data).expect("text");
    assert_eq!(pairs, [("MaxBurstLength".to_string(), "Reject".to_string())]);
}
