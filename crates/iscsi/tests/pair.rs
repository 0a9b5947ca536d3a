//! Pair tests: the initiator and target state machines wired together in
//! memory, and the target fed hostile bytes. No sockets.

use iscsi::chap::{ChapAlgorithm, Secret};
use iscsi::host::{Completion, HostChap, HostConfig, HostConnection, HostEvent, MutualChap};
use iscsi::pdu::{self, flags, Bhs, Framing, Opcode, RESERVED_TAG};
use iscsi::target::{
    login_status, scsi_status, tmf_response, Event, Policy, Residual, Seed, State, TargetConfig, TargetConnection,
    TargetInfo, TaskRef, TmfFunction,
};
use iscsi::text::{Params, SessionType};
use iscsi::RejectReason;
use std::sync::Arc;

type Target = TargetConnection<Vec<u8>>;

const TARGET: &str = "iqn.2026-01.test:disk1";
const INITIATOR: &str = "iqn.2026-01.test:host1";

#[derive(Clone, Default)]
struct TestPolicy {
    auth_required: bool,
    secret: Option<(String, String)>,
    target_creds: Option<(String, String)>,
    extra_targets: usize,
    admits_sessions: bool,
    /// The portals are wildcard listen addresses.
    wildcard_portals: bool,
}

impl Policy for TestPolicy {
    fn target(&self, name: &str) -> Option<TargetInfo> {
        self.discovery_targets(INITIATOR).into_iter().find(|t| t.name == name)
    }
    fn initiator_allowed(&self, _target: &str, initiator: &str) -> bool {
        initiator == INITIATOR
    }
    fn discovery_targets(&self, _initiator: &str) -> Vec<TargetInfo> {
        let mut v = vec![TargetInfo {
            name: TARGET.into(),
            alias: Some("disk one".into()),
            tpgt: 1,
            portals: if self.wildcard_portals {
                vec!["0.0.0.0:3260,1".into(), "[::]:3261,1".into()]
            } else {
                vec!["127.0.0.1:3260,1".into(), "[::1]:3260,1".into()]
            },
        }];
        for i in 0..self.extra_targets {
            v.push(TargetInfo {
                name: format!("iqn.2026-01.test:extra-target-with-a-long-name-{i:04}"),
                alias: None,
                tpgt: 1,
                portals: vec!["127.0.0.1:3260,1".into()],
            });
        }
        v
    }
    fn auth_required(&self, _target: Option<&str>, _initiator: &str) -> bool {
        self.auth_required
    }
    fn chap_secret(&self, _target: Option<&str>, _initiator: &str, user: &str) -> Option<Secret> {
        self.secret.as_ref().filter(|(u, _)| u == user).map(|(_, s)| Secret::from(s.as_str()))
    }
    fn target_credentials(&self, _target: Option<&str>, _initiator: &str) -> Option<(String, Secret)> {
        self.target_creds.as_ref().map(|(u, s)| (u.clone(), Secret::from(s.as_str())))
    }
    fn admits_sessions(&self) -> bool {
        self.admits_sessions
    }
}

fn seed() -> Seed {
    let mut chap_challenge = [0u8; 32];
    for (i, b) in chap_challenge.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(37).wrapping_add(11);
    }
    Seed { tsih: 0x1234, stat_sn: 1000, chap_id: 7, chap_challenge }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 3) as u8).collect()
}

/// What the SCSI layer behind the target does.
#[derive(Default)]
struct Backend {
    written: Vec<(u32, Vec<u8>)>,
    /// Read length to return instead of the expected length.
    read_len: Option<usize>,
    /// Leave commands unanswered (to test windows and aborts).
    hold: bool,
    held: Vec<TaskRef>,
    tmfs: Vec<(TmfFunction, u32)>,
    events: Vec<String>,
}

fn serve(t: &mut Target, b: &mut Backend) {
    while let Some(ev) = t.poll_event() {
        match ev {
            Event::Command(c) => {
                if b.hold {
                    b.held.push(c.task);
                } else if c.write {
                    b.written.push((c.task.itt, c.data.expect("write data")));
                    t.send_response(c.task, scsi_status::GOOD, None, None);
                } else if c.read {
                    let n = b.read_len.unwrap_or(c.expected_len as usize);
                    t.send_data_in(c.task, &pattern(n), Some(scsi_status::GOOD));
                } else {
                    t.send_response(c.task, scsi_status::GOOD, None, None);
                }
            }
            Event::TaskMgmt { itt, function, referenced_itt, .. } => {
                b.tmfs.push((function, referenced_itt));
                t.send_tmf_response(itt, tmf_response::COMPLETE);
            }
            other => b.events.push(format!("{other:?}")),
        }
    }
}

/// Moves bytes both ways until neither side has anything to send.
fn step(h: &mut HostConnection, t: &mut Target, b: &mut Backend) {
    step_by(h, t, b, 37);
}

/// As [`step`], the host's bytes fed to the target `cut` at a time.
fn step_by(h: &mut HostConnection, t: &mut Target, b: &mut Backend, cut: usize) {
    for _ in 0..1000 {
        let mut bytes = Vec::new();
        h.take_transmit(&mut bytes);
        let mut moved = !bytes.is_empty();
        for chunk in bytes.chunks(cut) {
            let _ = t.handle_input(chunk);
        }
        serve(t, b);
        let mut back = Vec::new();
        t.take_transmit(&mut back);
        moved |= !back.is_empty();
        let _ = h.handle_input(&back);
        if !moved {
            return;
        }
    }
    panic!("connection did not go idle");
}

fn target_cfg(digests: bool) -> TargetConfig {
    let mut c = TargetConfig::default();
    c.params.header_digest = digests;
    c.params.data_digest = digests;
    c
}

fn login_with(hc: HostConfig, tc: TargetConfig, policy: TestPolicy) -> (HostConnection, Target, Backend) {
    let mut h = HostConnection::new(hc);
    let mut t = Target::new(tc, Arc::new(policy), seed());
    let mut b = Backend::default();
    step(&mut h, &mut t, &mut b);
    (h, t, b)
}

fn logged_in(hc: HostConfig, tc: TargetConfig) -> (HostConnection, Target, Backend) {
    let (mut h, t, mut b) = login_with(hc, tc, TestPolicy::default());
    assert!(h.is_full_feature(), "host not logged in: {:?}", h.poll_event());
    assert!(matches!(h.poll_event(), Some(HostEvent::LoggedIn { tsih: 0x1234 })));
    assert_eq!(t.state(), State::FullFeature);
    assert!(b.events.iter().any(|e| e.starts_with("LoggedIn")), "{:?}", b.events);
    b.events.clear();
    (h, t, b)
}

fn completions(h: &mut HostConnection) -> Vec<Completion> {
    let mut v = Vec::new();
    while let Some(e) = h.poll_event() {
        if let HostEvent::Completion(c) = e {
            v.push(c);
        }
    }
    v
}

fn host_events(h: &mut HostConnection) -> Vec<HostEvent> {
    std::iter::from_fn(|| h.poll_event()).collect()
}

fn read10(blocks: u16) -> Vec<u8> {
    let [hi, lo] = blocks.to_be_bytes();
    vec![0x28, 0, 0, 0, 0, 0, 0, hi, lo, 0]
}

fn write10(blocks: u16) -> Vec<u8> {
    let [hi, lo] = blocks.to_be_bytes();
    vec![0x2a, 0, 0, 0, 0, 0, 0, hi, lo, 0]
}

/// A hand-made WRITE(10) command PDU for `edtl` bytes (`blocks` 512-byte
/// blocks in the CDB) with ITT `itt` and the host's next CmdSN; `more`
/// clears the F bit (unsolicited Data-Out follows).
fn write_pdu(h: &HostConnection, itt: u32, edtl: u32, blocks: u16, more: bool) -> Bhs {
    let (cmd_sn, exp_stat_sn, _, _) = h.sequence();
    let mut c = Bhs::new(Opcode::SCSI_CMD);
    c.set_flags(if more { flags::WRITE } else { flags::FINAL | flags::WRITE })
        .set_itt(itt)
        .set_expected_data_transfer_length(edtl)
        .set_cmd_sn(cmd_sn)
        .set_exp_stat_sn(exp_stat_sn)
        .set_cdb(&write10(blocks));
    c
}

/// Every PDU in `bytes`.
fn pdus(bytes: &[u8], framing: Framing) -> Vec<(Bhs, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(Ok(f)) = pdu::deframe(bytes.get(at..).unwrap_or_default(), framing) {
        out.push((f.bhs, f.data.to_vec()));
        at += f.len;
    }
    out
}

fn target_output(t: &mut Target) -> Vec<(Bhs, Vec<u8>)> {
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    let framing = Framing {
        header_digest: t.params().header_digest,
        data_digest: t.params().data_digest,
        max_data_segment: 1 << 24,
    };
    pdus(&out, framing)
}

// ---- login ----

#[test]
fn logs_in_without_auth_and_negotiates_every_key() {
    let mut hc = HostConfig::new(INITIATOR, Some(TARGET));
    hc.params.header_digest = true;
    hc.params.data_digest = true;
    hc.params.max_burst_length = 65536;
    hc.params.first_burst_length = 16384;
    hc.params.max_recv_data_segment_length = 32768;
    hc.params.default_time2wait = 5;
    let (h, t, _) = logged_in(hc, target_cfg(true));
    let (hp, tp) = (*h.params(), *t.params());
    assert!(hp.header_digest && hp.data_digest && tp.header_digest && tp.data_digest);
    assert_eq!((hp.max_burst_length, tp.max_burst_length), (65536, 65536));
    assert_eq!((hp.first_burst_length, tp.first_burst_length), (16384, 16384));
    assert_eq!(tp.peer_max_recv_data_segment_length, 32768);
    assert_eq!(hp.peer_max_recv_data_segment_length, 262_144);
    assert!(!tp.initial_r2t && tp.immediate_data);
    assert_eq!(tp.max_outstanding_r2t, 8);
    assert_eq!(tp.default_time2wait, 5);
    assert_eq!(tp.error_recovery_level, 0);
    assert_eq!(t.session_type(), SessionType::Normal);
}

fn chap_host(user: &str, secret: &str, algs: Vec<ChapAlgorithm>, mutual: Option<MutualChap>) -> HostConfig {
    let mut hc = HostConfig::new(INITIATOR, Some(TARGET));
    hc.chap = Some(HostChap { user: user.into(), secret: Secret::from(secret), algorithms: algs, mutual });
    hc
}

fn chap_policy() -> TestPolicy {
    TestPolicy { auth_required: true, secret: Some(("alice".into(), "initiator-secret".into())), ..Default::default() }
}

#[test]
fn logs_in_with_chap_for_every_algorithm() {
    for alg in ChapAlgorithm::ALL {
        let hc = chap_host("alice", "initiator-secret", vec![alg], None);
        let (mut h, t, _) = login_with(hc, target_cfg(false), chap_policy());
        assert!(h.is_full_feature(), "{alg:?}: {:?}", host_events(&mut h));
        assert_eq!(t.state(), State::FullFeature);
    }
}

#[test]
fn chap_picks_the_first_algorithm_of_the_initiators_list_that_target_supports() {
    let hc = chap_host("alice", "initiator-secret", vec![ChapAlgorithm::SHA3_256, ChapAlgorithm::MD5], None);
    let tc = TargetConfig { chap_algorithms: vec![ChapAlgorithm::MD5, ChapAlgorithm::SHA256], ..target_cfg(false) };
    let (h, _, _) = login_with(hc, tc, chap_policy());
    assert!(h.is_full_feature());
    let hc = chap_host("alice", "initiator-secret", vec![ChapAlgorithm::SHA3_256], None);
    let tc = TargetConfig { chap_algorithms: vec![ChapAlgorithm::MD5], ..target_cfg(false) };
    let (mut h, _, _) = login_with(hc, tc, chap_policy());
    assert!(host_events(&mut h).contains(&HostEvent::LoginFailed { status: login_status::AUTHENTICATION_FAILURE }));
}

fn mutual(secret: &str, challenge: Vec<u8>) -> MutualChap {
    MutualChap { target_user: "the-target".into(), target_secret: Secret::from(secret), id: 42, challenge }
}

#[test]
fn logs_in_with_mutual_chap() {
    let policy = TestPolicy { target_creds: Some(("the-target".into(), "target-secret".into())), ..chap_policy() };
    let hc =
        chap_host("alice", "initiator-secret", vec![ChapAlgorithm::SHA256], Some(mutual("target-secret", vec![9; 32])));
    let (mut h, t, _) = login_with(hc, target_cfg(false), policy.clone());
    assert!(h.is_full_feature(), "{:?}", host_events(&mut h));
    assert_eq!(t.state(), State::FullFeature);
    // The initiator notices a target that does not know the right secret.
    let hc = chap_host("alice", "initiator-secret", vec![ChapAlgorithm::SHA256], Some(mutual("other", vec![9; 32])));
    let (mut h, _, _) = login_with(hc, target_cfg(false), policy.clone());
    assert!(host_events(&mut h).contains(&HostEvent::TargetNotAuthenticated));
    // A reflected challenge is refused by the target.
    let reflected = seed().chap_challenge.get(..32).expect("challenge").to_vec();
    let hc =
        chap_host("alice", "initiator-secret", vec![ChapAlgorithm::SHA256], Some(mutual("target-secret", reflected)));
    let (mut h, t, _) = login_with(hc, target_cfg(false), policy);
    assert!(host_events(&mut h).contains(&HostEvent::LoginFailed { status: login_status::AUTHENTICATION_FAILURE }));
    assert_eq!(t.state(), State::Closed);
}

#[test]
fn chap_algorithm_and_identifier_may_be_hex_numbers() {
    // RFC 7143 12.1.3: "A, A1, A2, and I are numbers"; section 6.1: a
    // numerical-value is a decimal-constant or a hex-constant.
    use iscsi::chap::{decode_binary, encode_hex};
    let policy = TestPolicy { target_creds: Some(("the-target".into(), "target-secret".into())), ..chap_policy() };
    let mut t = Target::new(target_cfg(false), Arc::new(policy), seed());
    let names = format!("InitiatorName={INITIATOR}\0SessionType=Normal\0TargetName={TARGET}\0AuthMethod=CHAP\0");
    let (r, _) = raw_login(&mut t, (0, 1), false, names.as_bytes());
    assert_eq!(r.login_status(), login_status::SUCCESS);
    let (r, data) = raw_login(&mut t, (0, 1), false, b"CHAP_A=0x5\0");
    assert_eq!(r.login_status(), login_status::SUCCESS);
    let pairs = iscsi::text::parse(&data).expect("text");
    let get = |k: &str| pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
    assert_eq!(get("CHAP_A").as_deref(), Some("5"));
    let id: u8 = get("CHAP_I").expect("CHAP_I").parse().expect("decimal");
    let challenge = decode_binary(&get("CHAP_C").expect("CHAP_C")).expect("binary");
    let answer = ChapAlgorithm::MD5.response(id, b"initiator-secret", &challenge).expect("md5");
    let ours = [0x5au8; 16];
    let text = format!("CHAP_N=alice\0CHAP_R={}\0CHAP_I=0x2a\0CHAP_C={}\0", encode_hex(&answer), encode_hex(&ours));
    let (r, data) = raw_login(&mut t, (0, 1), true, text.as_bytes());
    assert_eq!(r.login_status(), login_status::SUCCESS);
    assert!(r.flags() & flags::TRANSIT != 0);
    let pairs = iscsi::text::parse(&data).expect("text");
    let want = ChapAlgorithm::MD5.response(0x2a, b"target-secret", &ours).expect("md5");
    assert!(pairs.contains(&("CHAP_R".to_string(), encode_hex(&want))), "{pairs:?}");
}

#[test]
fn refuses_login_with_the_rfc_status() {
    let cases: Vec<(HostConfig, TestPolicy, u16)> = vec![
        (chap_host("alice", "wrong", vec![ChapAlgorithm::MD5], None), chap_policy(), 0x0201),
        (chap_host("mallory", "initiator-secret", vec![ChapAlgorithm::MD5], None), chap_policy(), 0x0201),
        (HostConfig::new(INITIATOR, Some(TARGET)), chap_policy(), 0x0201),
        (HostConfig::new(INITIATOR, Some("iqn.2026-01.test:nope")), TestPolicy::default(), 0x0203),
        (HostConfig::new("iqn.2026-01.test:intruder", Some(TARGET)), TestPolicy::default(), 0x0202),
    ];
    for (hc, policy, want) in cases {
        let (mut h, t, b) = login_with(hc, target_cfg(false), policy);
        assert!(host_events(&mut h).contains(&HostEvent::LoginFailed { status: want }), "want {want:#06x}");
        assert_eq!(t.state(), State::Closed);
        assert!(b.events.iter().any(|e| e.starts_with("LoginFailed")));
        assert!(!t.has_transmit());
    }
}

fn raw_login(t: &mut Target, csg_nsg: (u8, u8), transit: bool, text: &[u8]) -> (Bhs, Vec<u8>) {
    let mut b = Bhs::new(Opcode::LOGIN_REQ);
    b.set_immediate(true)
        .set_login_flags(transit, false, pdu::Stage(csg_nsg.0), pdu::Stage(csg_nsg.1))
        .set_isid([0x80, 0, 0, 0, 0, 1])
        .set_itt(1)
        .set_cmd_sn(1);
    let mut bytes = Vec::new();
    pdu::encode(&mut bytes, &b, &[], text, Framing::default());
    let _ = t.handle_input(&bytes);
    let out = target_output(t);
    out.into_iter().next().expect("a login response")
}

#[test]
fn login_protocol_errors_get_initiator_error_statuses() {
    let policy = Arc::new(TestPolicy::default());
    let mut t = Target::new(target_cfg(false), policy.clone(), seed());
    let (r, _) = raw_login(&mut t, (0, 1), true, b"SessionType=Normal\0TargetName=iqn.2026-01.test:disk1\0");
    assert_eq!(r.login_status(), login_status::MISSING_PARAMETER);
    let mut t = Target::new(target_cfg(false), policy.clone(), seed());
    let (r, _) = raw_login(&mut t, (0, 1), true, b"InitiatorName=iqn.2026-01.test:host1\0SessionType=Normal\0");
    assert_eq!(r.login_status(), login_status::MISSING_PARAMETER);
    let mut t = Target::new(target_cfg(false), policy.clone(), seed());
    let (r, _) = raw_login(&mut t, (0, 1), true, b"InitiatorName=iqn.2026-01.test:host1\0InitiatorName=x\0");
    assert_eq!(r.login_status(), login_status::INITIATOR_ERROR);
    let mut t = Target::new(target_cfg(false), policy.clone(), seed());
    let (r, _) = raw_login(&mut t, (0, 1), true, b"InitiatorName=iqn.2026-01.test:host1\0SessionType=Bogus\0");
    assert_eq!(r.login_status(), login_status::SESSION_TYPE_NOT_SUPPORTED);
    // NSG must move forward.
    let mut t = Target::new(target_cfg(false), policy.clone(), seed());
    let (r, _) = raw_login(&mut t, (1, 0), true, b"InitiatorName=iqn.2026-01.test:host1\0SessionType=Discovery\0");
    assert_eq!(r.login_status(), login_status::INITIATOR_ERROR);
    // Version-min above what we speak.
    let mut t = Target::new(target_cfg(false), policy, seed());
    let mut b = Bhs::new(Opcode::LOGIN_REQ);
    b.set_immediate(true).set_byte3(1);
    let mut bytes = Vec::new();
    pdu::encode(&mut bytes, &b, &[], b"InitiatorName=x\0", Framing::default());
    let _ = t.handle_input(&bytes);
    let out = target_output(&mut t);
    assert_eq!(out.first().map(|p| p.0.login_status()), Some(login_status::UNSUPPORTED_VERSION));
}

#[test]
fn first_login_response_declares_tpgt_and_operational_stage_answers_unknown_keys() {
    let mut t = Target::new(target_cfg(false), Arc::new(TestPolicy::default()), seed());
    let (r, data) = raw_login(
        &mut t,
        (1, 3),
        true,
        b"InitiatorName=iqn.2026-01.test:host1\0SessionType=Normal\0TargetName=iqn.2026-01.test:disk1\0\
          X-com.example.Foo=1\0Bogus=2\0MaxBurstLength=1\0ImmediateData=No\0",
    );
    assert_eq!(r.login_status(), 0);
    assert_eq!(r.tsih(), 0x1234);
    assert!(r.flags() & flags::TRANSIT != 0);
    let pairs = iscsi::text::parse(&data).expect("text");
    let get = |k: &str| pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
    assert_eq!(get("TargetPortalGroupTag"), Some("1"));
    assert_eq!(get("TargetAlias"), Some("disk one"));
    assert_eq!(get("X-com.example.Foo"), Some("NotUnderstood"));
    assert_eq!(get("Bogus"), Some("NotUnderstood"));
    assert_eq!(get("MaxBurstLength"), Some("Reject"));
    assert_eq!(get("ImmediateData"), Some("No"));
    assert_eq!(get("MaxRecvDataSegmentLength"), Some("262144"));
    assert_eq!(t.state(), State::FullFeature);
}

#[test]
fn login_request_with_continue_bit_gets_an_empty_answer_then_the_whole_text_is_used() {
    let mut t = Target::new(target_cfg(false), Arc::new(TestPolicy::default()), seed());
    let mut b = Bhs::new(Opcode::LOGIN_REQ);
    b.set_immediate(true)
        .set_login_flags(false, true, pdu::Stage(1), pdu::Stage(0))
        .set_isid([0x80, 0, 0, 0, 0, 1])
        .set_itt(1)
        .set_cmd_sn(1);
    let mut bytes = Vec::new();
    pdu::encode(&mut bytes, &b, &[], b"InitiatorName=iqn.2026-01.te", Framing::default());
    let _ = t.handle_input(&bytes);
    let out = target_output(&mut t);
    assert_eq!(out.len(), 1);
    assert!(out.first().is_some_and(|(r, d)| r.login_status() == 0 && d.is_empty()));
    let (r, _) = raw_login(&mut t, (1, 3), true, b"st:host1\0SessionType=Discovery\0");
    assert_eq!(r.login_status(), 0);
    assert_eq!(t.session_type(), SessionType::Discovery);
}

#[test]
fn login_that_keeps_sending_new_keys_is_refused_once_they_pass_the_text_limit() {
    // Each request is within the per-request limit, but a login that never
    // transits and sends new key names each time must not be remembered
    // without bound before authentication.
    let tc = TargetConfig { max_text_len: 4096, ..target_cfg(false) };
    let mut t = Target::new(tc, Arc::new(TestPolicy::default()), seed());
    let (r, _) =
        raw_login(&mut t, (0, 1), false, b"InitiatorName=iqn.2026-01.test:host1\0TargetName=iqn.2026-01.test:disk1\0");
    assert_eq!(r.login_status(), login_status::SUCCESS);
    let mut refused = None;
    for round in 0..100 {
        let mut text = Vec::new();
        for key in 0..20 {
            text.extend_from_slice(format!("X-com.example.Round{round:04}-Key{key:04}=1\0").as_bytes());
        }
        assert!(text.len() < 4096);
        let (r, _) = raw_login(&mut t, (0, 1), false, &text);
        if r.login_status() != login_status::SUCCESS {
            refused = Some((round, r.login_status()));
            break;
        }
    }
    let (round, status) = refused.expect("the login is refused");
    assert_eq!(status, login_status::INITIATOR_ERROR);
    assert!(round < 20, "refused only after round {round}");
    assert_eq!(t.state(), State::Closed);
}

#[test]
fn pdu_the_login_cannot_take_gets_a_login_reject_before_the_close() {
    // Not a Login Request: "invalid during login".
    let mut t = Target::new(target_cfg(false), Arc::new(TestPolicy::default()), seed());
    let mut nop = Bhs::new(Opcode::NOP_OUT);
    nop.set_immediate(true).set_flags(flags::FINAL).set_itt(5).set_ttt(RESERVED_TAG);
    let mut bytes = Vec::new();
    pdu::encode(&mut bytes, &nop, &[], &[], Framing::default());
    assert!(t.handle_input(&bytes).is_err());
    let out = target_output(&mut t);
    assert!(
        matches!(out.as_slice(), [(r, _)] if r.opcode() == Opcode::LOGIN_RESP
            && r.itt() == 5
            && r.login_status() == login_status::INVALID_DURING_LOGIN),
        "{out:?}"
    );
    assert_eq!(t.state(), State::Closed);
    // A Login Request past the 8192 bytes allowed during login, after a
    // first request: initiator error, for the login's ISID.
    let mut t = Target::new(target_cfg(false), Arc::new(TestPolicy::default()), seed());
    let (r, _) = raw_login(&mut t, (0, 1), false, b"InitiatorName=iqn.2026-01.test:host1\0SessionType=Discovery\0");
    assert_eq!(r.login_status(), login_status::SUCCESS);
    let mut big = Bhs::new(Opcode::LOGIN_REQ);
    big.set_immediate(true)
        .set_login_flags(false, false, pdu::Stage(0), pdu::Stage(0))
        .set_isid([0x80, 0, 0, 0, 0, 1])
        .set_itt(2)
        .set_cmd_sn(1);
    let mut bytes = Vec::new();
    pdu::encode(&mut bytes, &big, &[], &[b'a'; 9000], Framing { max_data_segment: 1 << 24, ..Framing::default() });
    assert!(t.handle_input(&bytes).is_err());
    let out = target_output(&mut t);
    assert!(
        matches!(out.as_slice(), [(r, _)] if r.opcode() == Opcode::LOGIN_RESP
            && r.itt() == 2
            && r.isid() == [0x80, 0, 0, 0, 0, 1]
            && r.login_status() == login_status::INITIATOR_ERROR),
        "{out:?}"
    );
    assert_eq!(t.state(), State::Closed);
}

// ---- full feature phase ----

#[test]
fn reads_with_phase_collapse_with_and_without_digests() {
    for digests in [false, true] {
        let mut hc = HostConfig::new(INITIATOR, Some(TARGET));
        hc.params.header_digest = digests;
        hc.params.data_digest = digests;
        hc.params.max_recv_data_segment_length = 8192;
        hc.params.max_burst_length = 16384;
        let (mut h, mut t, mut b) = logged_in(hc, target_cfg(digests));
        let itt = h.submit(0, &read10(64), 32768, Vec::new());
        // Look at the wire: 4 Data-In PDUs of 8 KiB, F at each 16 KiB burst,
        // S only on the last with status GOOD and no SCSI Response.
        let mut bytes = Vec::new();
        h.take_transmit(&mut bytes);
        t.handle_input(&bytes).expect("valid");
        serve(&mut t, &mut b);
        let mut out = Vec::new();
        t.take_transmit(&mut out);
        let framing = Framing { header_digest: digests, data_digest: digests, max_data_segment: 1 << 20 };
        let p = pdus(&out, framing);
        assert_eq!(p.len(), 4);
        let fl: Vec<u8> = p.iter().map(|(b, _)| b.flags()).collect();
        assert_eq!(fl, vec![0, flags::FINAL, 0, flags::FINAL | flags::STATUS]);
        let sns: Vec<u32> = p.iter().map(|(b, _)| b.data_sn()).collect();
        assert_eq!(sns, vec![0, 1, 2, 3]);
        let offs: Vec<u32> = p.iter().map(|(b, _)| b.buffer_offset()).collect();
        assert_eq!(offs, vec![0, 8192, 16384, 24576]);
        assert!(p.iter().all(|(b, _)| b.opcode() == Opcode::DATA_IN && b.itt() == itt));
        h.handle_input(&out).expect("valid");
        let c = completions(&mut h);
        assert_eq!(c.len(), 1);
        let c = c.first().expect("one");
        assert!(c.collapsed);
        assert_eq!((c.status, c.residual), (scsi_status::GOOD, None));
        assert_eq!(c.data, pattern(32768));
        assert_eq!(t.open_tasks(), 0);
    }
}

#[test]
fn reports_residual_underflow_and_overflow() {
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), target_cfg(false));
    b.read_len = Some(1000);
    h.submit(0, &read10(8), 4096, Vec::new());
    step(&mut h, &mut t, &mut b);
    let c = completions(&mut h);
    let c = c.first().expect("done");
    assert_eq!(c.residual, Some(Residual::Underflow(3096)));
    assert_eq!(c.data, pattern(1000));
    b.read_len = Some(5000);
    h.submit(0, &[0x12, 0, 0, 0x13, 0x88, 0], 4096, Vec::new());
    step(&mut h, &mut t, &mut b);
    let c = completions(&mut h);
    let c = c.first().expect("done");
    assert_eq!(c.residual, Some(Residual::Overflow(904)));
    assert_eq!(c.data, pattern(4096));
}

#[test]
fn sends_check_condition_with_sense_after_data() {
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), target_cfg(false));
    b.hold = true;
    let itt = h.submit(0, &read10(1), 512, Vec::new());
    step(&mut h, &mut t, &mut b);
    let task = b.held[0];
    assert_eq!(task.itt, itt);
    let sense = [0x70, 0, 0x05, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0];
    assert!(t.send_response(task, scsi_status::CHECK_CONDITION, Some(&sense), None));
    assert!(!t.send_response(task, scsi_status::GOOD, None, None), "answered twice");
    step(&mut h, &mut t, &mut b);
    let c = completions(&mut h);
    let c = c.first().expect("done");
    assert_eq!((c.status, c.sense.as_slice(), c.collapsed), (scsi_status::CHECK_CONDITION, &sense[..], false));
    assert_eq!(c.residual, Some(Residual::Underflow(512)));
}

#[test]
fn writes_with_immediate_unsolicited_and_solicited_data() {
    let mut hc = HostConfig::new(INITIATOR, Some(TARGET));
    hc.params.first_burst_length = 16384;
    hc.params.max_burst_length = 20000;
    hc.params.max_outstanding_r2t = 2;
    let mut tc = target_cfg(false);
    tc.params.max_recv_data_segment_length = 4096;
    let (mut h, mut t, mut b) = logged_in(hc, tc);
    assert_eq!(h.params().peer_max_recv_data_segment_length, 4096);
    let data = pattern(100_000);
    let itt = h.submit(0, &write10(196), 0, data.clone());
    step(&mut h, &mut t, &mut b);
    assert_eq!(b.written, vec![(itt, data)]);
    let c = completions(&mut h);
    assert_eq!(c.first().map(|c| c.status), Some(scsi_status::GOOD));
    // Small writes that fit the immediate data.
    let itt = h.submit(0, &write10(1), 0, pattern(512));
    step(&mut h, &mut t, &mut b);
    assert!(b.written.iter().any(|(i, d)| *i == itt && *d == pattern(512)));
}

#[test]
fn pdus_cut_anywhere_are_parsed_as_whole_ones() {
    for digests in [false, true] {
        for cut in [1, 5, 47, 48, 49, 53, 100, 4095, 4096 + 52, 1 << 20] {
            let mut hc = HostConfig::new(INITIATOR, Some(TARGET));
            hc.params.header_digest = digests;
            hc.params.data_digest = digests;
            hc.params.first_burst_length = 16384;
            hc.params.max_burst_length = 20000;
            let mut tc = target_cfg(digests);
            tc.params.max_recv_data_segment_length = 4096;
            let (mut h, mut t, mut b) = logged_in(hc, tc);
            // Writes with immediate, unsolicited and solicited data and
            // reads, all queued before any byte moves.
            let mut want = Vec::new();
            for (i, len) in [512usize, 100_000, 4096, 8192 + 512].into_iter().enumerate() {
                let data: Vec<u8> = pattern(len).iter().map(|x| x ^ i as u8).collect();
                let itt = h.submit(0, &write10((len / 512) as u16), 0, data.clone());
                want.push((itt, data));
                h.submit(0, &read10(8), 4096, Vec::new());
            }
            step_by(&mut h, &mut t, &mut b, cut);
            b.written.sort_by_key(|(itt, _)| *itt);
            want.sort_by_key(|(itt, _)| *itt);
            assert!(b.written == want, "cut {cut}, digests {digests}: written data differs");
            let c = completions(&mut h);
            assert_eq!(c.len(), 8, "cut {cut}, digests {digests}");
            assert!(c.iter().all(|c| c.status == scsi_status::GOOD), "cut {cut}, digests {digests}");
            assert!(c.iter().filter(|c| !c.data.is_empty()).all(|c| c.data == pattern(4096)));
            assert_eq!(t.open_tasks(), 0);
        }
    }
}

#[test]
fn writes_with_r2t_only_when_initial_r2t_and_no_immediate_data() {
    let mut hc = HostConfig::new(INITIATOR, Some(TARGET));
    hc.params.initial_r2t = true;
    hc.params.immediate_data = false;
    hc.params.max_burst_length = 8192;
    hc.params.max_outstanding_r2t = 1;
    let mut tc = target_cfg(false);
    tc.params.immediate_data = false;
    let (mut h, mut t, mut b) = logged_in(hc, tc);
    assert!(t.params().initial_r2t && !t.params().immediate_data);
    let data = pattern(40000);
    let itt = h.submit(3, &write10(79), 0, data.clone());
    // The command goes alone, with F set and no data.
    let mut bytes = Vec::new();
    h.take_transmit(&mut bytes);
    let p = pdus(&bytes, h.tx_framing());
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p.first().is_some_and(|(b, d)| b.final_bit() && d.is_empty()));
    t.handle_input(&bytes).expect("valid");
    let out = target_output(&mut t);
    // One R2T outstanding (MaxOutstandingR2T=1), for the first burst.
    assert_eq!(out.len(), 1, "{out:?} {:?}", t.params());
    let (r2t, _) = out.first().expect("r2t");
    assert_eq!(r2t.opcode(), Opcode::R2T);
    assert_eq!((r2t.buffer_offset(), r2t.residual_count(), r2t.data_sn(), r2t.lun()), (0, 8192, 0, 3));
    // Replay the R2T to the host and pump the rest.
    let mut r2t_bytes = Vec::new();
    pdu::encode(&mut r2t_bytes, r2t, &[], &[], Framing::default());
    h.handle_input(&r2t_bytes).expect("valid");
    step(&mut h, &mut t, &mut b);
    assert_eq!(b.written, vec![(itt, data)]);
}

#[test]
fn cmd_sn_window_limits_outstanding_commands() {
    let tc = TargetConfig { queue_depth: 2, ..target_cfg(false) };
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), tc);
    let (exp, max) = t.cmd_window();
    assert_eq!(max, exp.wrapping_add(1));
    b.hold = true;
    for _ in 0..5 {
        h.submit(0, &read10(1), 512, Vec::new());
    }
    step(&mut h, &mut t, &mut b);
    assert_eq!(b.held.len(), 2);
    assert_eq!(h.queued(), 3);
    b.hold = false;
    let held = std::mem::take(&mut b.held);
    for itt in held {
        t.send_data_in(itt, &pattern(512), Some(scsi_status::GOOD));
    }
    step(&mut h, &mut t, &mut b);
    assert_eq!(completions(&mut h).len(), 5);
    assert_eq!(h.queued(), 0);
}

#[test]
fn drops_commands_outside_the_window_silently() {
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), target_cfg(false));
    let (cmd_sn, exp_stat_sn, _, max) = h.sequence();
    for sn in [max.wrapping_add(1), cmd_sn.wrapping_sub(1), cmd_sn.wrapping_add(1)] {
        let mut c = Bhs::new(Opcode::SCSI_CMD);
        c.set_flags(flags::FINAL | flags::READ)
            .set_itt(0x77)
            .set_expected_data_transfer_length(512)
            .set_cmd_sn(sn)
            .set_exp_stat_sn(exp_stat_sn)
            .set_cdb(&read10(1));
        h.send_raw(&c, &[], &[]);
    }
    step(&mut h, &mut t, &mut b);
    assert!(host_events(&mut h).is_empty());
    assert_eq!(t.open_tasks(), 0);
    // The window did not move: a command at ExpCmdSN still works.
    h.submit(0, &read10(1), 512, Vec::new());
    step(&mut h, &mut t, &mut b);
    assert_eq!(completions(&mut h).len(), 1);
}

#[test]
fn extended_cdb_reaches_the_upper_layer() {
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), target_cfg(false));
    b.hold = true;
    let cdb32: Vec<u8> = (0..32).collect();
    h.submit(0, &cdb32, 0, Vec::new());
    let mut bytes = Vec::new();
    h.take_transmit(&mut bytes);
    t.handle_input(&bytes).expect("valid");
    match t.poll_event() {
        Some(Event::Command(c)) => assert_eq!(c.cdb, cdb32),
        other => panic!("{other:?}"),
    }
}

#[test]
fn answers_nop_out_and_detects_a_dead_initiator() {
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), target_cfg(false));
    let itt = h.nop(b"ping!");
    step(&mut h, &mut t, &mut b);
    assert_eq!(host_events(&mut h), vec![HostEvent::NopIn { itt, data: b"ping!".to_vec() }]);
    // Pings every 5 s of silence; a live initiator answers.
    t.on_tick(0);
    assert_eq!(t.poll_timeout(), Some(5000));
    t.on_tick(5000);
    assert!(t.has_transmit());
    assert_eq!(t.poll_timeout(), Some(20000));
    step(&mut h, &mut t, &mut b);
    t.on_tick(19_999);
    t.on_tick(20_000);
    assert!(b.events.is_empty());
    assert_eq!(t.state(), State::FullFeature);
    // A dead one does not.
    let mut hc = HostConfig::new(INITIATOR, Some(TARGET));
    hc.answer_pings = false;
    let (mut h, mut t, mut b) = logged_in(hc, target_cfg(false));
    t.on_tick(0);
    t.on_tick(5000);
    step(&mut h, &mut t, &mut b);
    t.on_tick(19_999);
    assert_eq!(t.state(), State::FullFeature);
    t.on_tick(20_000);
    assert!(matches!(t.poll_event(), Some(Event::Dead)));
    assert_eq!(t.state(), State::Closed);
}

#[test]
fn task_management_aborts_a_task() {
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), target_cfg(false));
    b.hold = true;
    let victim = h.submit(0, &read10(1), 512, Vec::new());
    step(&mut h, &mut t, &mut b);
    assert_eq!(t.open_tasks(), 1);
    let tmf = h.task_mgmt(TmfFunction::ABORT_TASK.0, 0, victim);
    step(&mut h, &mut t, &mut b);
    assert_eq!(b.tmfs, vec![(TmfFunction::ABORT_TASK, victim)]);
    assert_eq!(host_events(&mut h), vec![HostEvent::TaskMgmt { itt: tmf, response: tmf_response::COMPLETE }]);
    assert_eq!(t.open_tasks(), 0);
    assert!(!t.send_data_in(b.held[0], &pattern(512), Some(scsi_status::GOOD)));
    // TASK REASSIGN is answered by the connection itself at ERL 0.
    let tmf = h.task_mgmt(TmfFunction::TASK_REASSIGN.0, 0, victim);
    step(&mut h, &mut t, &mut b);
    assert_eq!(
        host_events(&mut h),
        vec![HostEvent::TaskMgmt { itt: tmf, response: tmf_response::REASSIGNMENT_NOT_SUPPORTED }]
    );
    // LUN RESET clears every task of the LUN.
    h.submit(0, &read10(1), 512, Vec::new());
    h.submit(0, &read10(1), 512, Vec::new());
    step(&mut h, &mut t, &mut b);
    assert_eq!(t.open_tasks(), 2);
    h.task_mgmt(TmfFunction::LOGICAL_UNIT_RESET.0, 0, RESERVED_TAG);
    step(&mut h, &mut t, &mut b);
    assert_eq!(t.open_tasks(), 0);
}

#[test]
fn late_answer_of_an_aborted_task_never_answers_the_task_reusing_its_itt() {
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), target_cfg(false));
    b.hold = true;
    let victim = h.submit(0, &read10(1), 512, Vec::new());
    step(&mut h, &mut t, &mut b);
    let old = b.held[0];
    h.task_mgmt(TmfFunction::ABORT_TASK.0, 0, victim);
    step(&mut h, &mut t, &mut b);
    h.forget(victim);
    host_events(&mut h);
    // The initiator reuses the tag at once, as Linux does.
    h.set_next_itt(victim);
    assert_eq!(h.submit(0, &read10(1), 512, Vec::new()), victim);
    step(&mut h, &mut t, &mut b);
    let new = b.held[1];
    assert_eq!((new.itt, t.open_tasks()), (victim, 1));
    assert_ne!(new, old);
    // The aborted command's I/O finishes late: its data goes nowhere.
    assert!(!t.send_data_in(old, &[0xee; 512], Some(scsi_status::GOOD)));
    assert!(!t.send_response(old, scsi_status::GOOD, None, None));
    step(&mut h, &mut t, &mut b);
    assert!(completions(&mut h).is_empty());
    assert_eq!(t.open_tasks(), 1);
    assert!(t.send_data_in(new, &pattern(512), Some(scsi_status::GOOD)));
    step(&mut h, &mut t, &mut b);
    let c = completions(&mut h);
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].itt, &c[0].data), (victim, &pattern(512)));
}

#[test]
fn abort_of_a_task_answered_meanwhile_says_task_does_not_exist() {
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), target_cfg(false));
    b.hold = true;
    let victim = h.submit(0, &read10(1), 512, Vec::new());
    step(&mut h, &mut t, &mut b);
    let task = b.held[0];
    // The abort arrives; before the upper layer answers it, the command
    // finishes and is answered GOOD.
    let tmf = h.task_mgmt(TmfFunction::ABORT_TASK.0, 0, victim);
    let mut bytes = Vec::new();
    h.take_transmit(&mut bytes);
    t.handle_input(&bytes).expect("TMF");
    let Some(Event::TaskMgmt { itt, tasks, .. }) = t.poll_event() else { panic!("a TaskMgmt event") };
    assert_eq!(tasks, vec![task]);
    assert!(t.send_data_in(task, &pattern(512), Some(scsi_status::GOOD)));
    assert!(t.send_tmf_response(itt, tmf_response::COMPLETE));
    step(&mut h, &mut t, &mut b);
    let ev = host_events(&mut h);
    assert!(ev.iter().any(|e| matches!(e, HostEvent::Completion(c) if c.itt == victim)), "{ev:?}");
    assert!(ev.contains(&HostEvent::TaskMgmt { itt: tmf, response: tmf_response::TASK_DOES_NOT_EXIST }), "{ev:?}");
}

#[test]
fn task_management_scope_is_fixed_when_the_request_arrives() {
    let (mut h, mut t, _) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), target_cfg(false));
    let mut held = Vec::new();
    let mut pump = |h: &mut HostConnection, t: &mut Target, tmfs: &mut Vec<(u32, Vec<TaskRef>)>| {
        let mut bytes = Vec::new();
        h.take_transmit(&mut bytes);
        t.handle_input(&bytes).expect("valid PDUs");
        while let Some(ev) = t.poll_event() {
            match ev {
                Event::Command(c) => held.push(c.task),
                Event::TaskMgmt { itt, tasks, .. } => tmfs.push((itt, tasks)),
                other => panic!("unexpected {other:?}"),
            }
        }
        let mut back = Vec::new();
        t.take_transmit(&mut back);
        h.handle_input(&back).expect("valid PDUs");
    };
    let mut tmfs = Vec::new();
    h.submit(0, &read10(1), 512, Vec::new());
    h.submit(0, &read10(1), 512, Vec::new());
    pump(&mut h, &mut t, &mut tmfs);
    h.task_mgmt(TmfFunction::ABORT_TASK_SET.0, 0, RESERVED_TAG);
    pump(&mut h, &mut t, &mut tmfs);
    // The upper layer must wait for the two delivered commands.
    assert_eq!(tmfs.len(), 1);
    assert_eq!(tmfs[0].1.len(), 2);
    // A command that arrives while the abort waits is not in its scope.
    h.submit(0, &read10(1), 512, Vec::new());
    pump(&mut h, &mut t, &mut tmfs);
    assert_eq!(t.open_tasks(), 3);
    assert!(t.send_tmf_response(tmfs[0].0, tmf_response::COMPLETE));
    assert_eq!(t.open_tasks(), 1);
    let late = held[2];
    assert!(t.send_data_in(late, &pattern(512), Some(scsi_status::GOOD)));
    for aborted in &held[..2] {
        assert!(!t.send_response(*aborted, scsi_status::GOOD, None, None));
    }
}

/// Logged in with InitialR2T=Yes and ImmediateData=No on both sides: a
/// write's data waits for the target's R2T.
fn logged_in_r2t_only() -> (HostConnection, Target, Backend) {
    let mut tc = target_cfg(false);
    tc.params.initial_r2t = true;
    tc.params.immediate_data = false;
    let mut hc = HostConfig::new(INITIATOR, Some(TARGET));
    hc.params.initial_r2t = true;
    hc.params.immediate_data = false;
    logged_in(hc, tc)
}

#[test]
fn aborted_write_still_collecting_data_is_never_delivered() {
    let (mut h, mut t, mut b) = logged_in_r2t_only();
    // Take the command and its R2T, but hold the data back.
    let victim = h.submit(0, &write10(1), 0, pattern(512));
    let mut bytes = Vec::new();
    h.take_transmit(&mut bytes);
    t.handle_input(&bytes).expect("command");
    assert!(t.poll_event().is_none(), "a write waits for its data");
    let tmf = h.task_mgmt(TmfFunction::ABORT_TASK.0, 0, victim);
    step(&mut h, &mut t, &mut b);
    assert!(b.written.is_empty(), "an aborted write never reaches the device");
    assert!(host_events(&mut h).contains(&HostEvent::TaskMgmt { itt: tmf, response: tmf_response::COMPLETE }));
    assert_eq!(t.open_tasks(), 0);
}

#[test]
fn abort_task_of_a_completed_command_answers_task_does_not_exist() {
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), target_cfg(false));
    let done = h.submit(0, &write10(1), 0, pattern(512));
    step(&mut h, &mut t, &mut b);
    assert_eq!(completions(&mut h).len(), 1);
    assert_eq!(t.open_tasks(), 0);
    // The host still knows the task's CmdSN, which is now behind ExpCmdSN.
    let tmf = h.task_mgmt(TmfFunction::ABORT_TASK.0, 0, done);
    step(&mut h, &mut t, &mut b);
    assert!(b.tmfs.is_empty(), "answered by the connection, not the upper layer");
    assert_eq!(
        host_events(&mut h),
        vec![HostEvent::TaskMgmt { itt: tmf, response: tmf_response::TASK_DOES_NOT_EXIST }]
    );
}

#[test]
fn discovery_session_answers_send_targets_and_rejects_scsi_commands() {
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, None), target_cfg(false));
    assert_eq!(t.session_type(), SessionType::Discovery);
    let itt = h.send_targets("All");
    step(&mut h, &mut t, &mut b);
    let ev = host_events(&mut h);
    let want = vec![
        ("TargetName".to_string(), TARGET.to_string()),
        ("TargetAddress".to_string(), "127.0.0.1:3260,1".to_string()),
        ("TargetAddress".to_string(), "[::1]:3260,1".to_string()),
    ];
    assert_eq!(ev, vec![HostEvent::Text { itt, pairs: want }]);
    h.submit(0, &read10(1), 512, Vec::new());
    step(&mut h, &mut t, &mut b);
    assert!(matches!(
        host_events(&mut h).first(),
        Some(HostEvent::Reject { reason: RejectReason::PROTOCOL_ERROR, bhs: Some(_) })
    ));
}

/// iSCSI names compare without case (RFC 3722's stringprep folds case;
/// the login finds its target so): SendTargets=<name> in another case
/// names the same target.
#[test]
fn send_targets_of_one_name_ignores_case_as_the_login_does() {
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, None), target_cfg(false));
    let itt = h.send_targets(&TARGET.to_ascii_uppercase());
    step(&mut h, &mut t, &mut b);
    let ev = host_events(&mut h);
    let Some(HostEvent::Text { itt: got, pairs }) = ev.first() else { panic!("{ev:?}") };
    assert_eq!(*got, itt);
    assert_eq!(pairs.first(), Some(&("TargetName".to_string(), TARGET.to_string())), "{pairs:?}");
}

#[test]
fn send_targets_gives_a_wildcard_portal_as_the_address_the_initiator_reached() {
    // RFC 7143 appendix C: TargetAddress is where the initiator can reach
    // the target; 0.0.0.0 or [::] is no such address. The Linux target
    // (and our NVMe discovery log) give the connection's local address.
    let policy = TestPolicy { wildcard_portals: true, ..Default::default() };
    let cases = [
        ("192.0.2.7", ["192.0.2.7:3260,1", "192.0.2.7:3261,1"]),
        // An IPv4 initiator on a dual-stack listener.
        ("::ffff:192.0.2.7", ["192.0.2.7:3260,1", "192.0.2.7:3261,1"]),
        ("2001:db8::7", ["[2001:db8::7]:3260,1", "[2001:db8::7]:3261,1"]),
    ];
    for (local, want) in cases {
        let mut h = HostConnection::new(HostConfig::new(INITIATOR, None));
        let local = local.parse().expect("address");
        let mut t = Target::new(target_cfg(false), Arc::new(policy.clone()), seed()).with_local(local);
        let mut b = Backend::default();
        step(&mut h, &mut t, &mut b);
        assert!(h.is_full_feature());
        host_events(&mut h);
        let itt = h.send_targets("All");
        step(&mut h, &mut t, &mut b);
        let mut pairs = vec![("TargetName".to_string(), TARGET.to_string())];
        pairs.extend(want.map(|a| ("TargetAddress".to_string(), a.to_string())));
        assert_eq!(host_events(&mut h), vec![HostEvent::Text { itt, pairs }], "reached on {local}");
    }
}

#[test]
fn long_send_targets_answer_spans_several_text_responses() {
    let mut hc = HostConfig::new(INITIATOR, None);
    hc.params.max_recv_data_segment_length = 512;
    let policy = TestPolicy { extra_targets: 40, ..Default::default() };
    let (mut h, mut t, mut b) = login_with(hc, target_cfg(false), policy);
    assert!(h.is_full_feature());
    h.send_targets("All");
    step(&mut h, &mut t, &mut b);
    let ev = host_events(&mut h);
    let Some(HostEvent::Text { pairs, .. }) = ev.last() else { panic!("{ev:?}") };
    assert_eq!(pairs.iter().filter(|(k, _)| k == "TargetName").count(), 41);
    assert!(pairs.iter().all(|(k, v)| k != "TargetName" || v.starts_with("iqn.")), "split inside a pair");
}

#[test]
fn normal_session_send_targets_lists_only_its_target() {
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), target_cfg(false));
    let itt = h.send_targets("");
    step(&mut h, &mut t, &mut b);
    let ev = host_events(&mut h);
    let Some(HostEvent::Text { itt: got, pairs }) = ev.first() else { panic!("{ev:?}") };
    assert_eq!(*got, itt);
    assert_eq!(pairs.first(), Some(&("TargetName".to_string(), TARGET.to_string())));
}

#[test]
fn logs_out() {
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), target_cfg(false));
    h.logout(0);
    step(&mut h, &mut t, &mut b);
    assert_eq!(host_events(&mut h), vec![HostEvent::LoggedOut { response: 0, time2wait: 2, time2retain: 20 }]);
    assert!(b.events.iter().any(|e| e.starts_with("LoggedOut")));
    assert_eq!(t.state(), State::Closed);
}

// ---- hostile input ----

fn reject_of(t: &mut Target) -> (RejectReason, Option<Bhs>) {
    let out = target_output(t);
    let (b, data) = out.into_iter().find(|(b, _)| b.opcode() == Opcode::REJECT).expect("a Reject");
    assert_eq!(b.itt(), RESERVED_TAG);
    (RejectReason(b.byte2()), Bhs::from_slice(&data))
}

fn session(digests: bool) -> (HostConnection, Target, Backend) {
    let mut hc = HostConfig::new(INITIATOR, Some(TARGET));
    hc.params.header_digest = digests;
    hc.params.data_digest = digests;
    let mut tc = target_cfg(digests);
    tc.params.max_recv_data_segment_length = 8192;
    logged_in(hc, tc)
}

fn send(h: &mut HostConnection, t: &mut Target, bhs: &Bhs, data: &[u8]) -> Result<(), iscsi::PduError> {
    h.send_raw(bhs, &[], data);
    let mut bytes = Vec::new();
    h.take_transmit(&mut bytes);
    t.handle_input(&bytes)
}

#[test]
fn rejects_unknown_opcode_with_command_not_supported() {
    let (mut h, mut t, _) = session(false);
    let mut b = Bhs::new(Opcode(0x1c));
    b.set_itt(5);
    assert!(send(&mut h, &mut t, &b, &[]).is_ok());
    let (reason, echoed) = reject_of(&mut t);
    assert_eq!(reason, RejectReason::COMMAND_NOT_SUPPORTED);
    assert_eq!(echoed, Some(b));
    assert_eq!(t.state(), State::FullFeature);
    // SNACK at ERL 0 is a protocol error.
    let b = Bhs::new(Opcode::SNACK_REQ);
    assert!(send(&mut h, &mut t, &b, &[]).is_ok());
    assert_eq!(reject_of(&mut t).0, RejectReason::PROTOCOL_ERROR);
}

/// Logged in with InitialR2T=Yes and ImmediateData=No, a 4 KiB write
/// (ITT 9) sent: the target's first answer, its R2T.
fn write_awaiting_r2t() -> (HostConnection, Target, Bhs) {
    let mut hc = HostConfig::new(INITIATOR, Some(TARGET));
    hc.params.initial_r2t = true;
    hc.params.immediate_data = false;
    let (mut h, mut t, _) = logged_in(hc, target_cfg(false));
    let c = write_pdu(&h, 9, 4096, 8, false);
    send(&mut h, &mut t, &c, &[]).expect("valid");
    let r2t = target_output(&mut t).first().map(|p| p.0).expect("r2t");
    assert_eq!(r2t.opcode(), Opcode::R2T);
    (h, t, r2t)
}

/// RFC 7143 11.14: on a Logout that closes the connection or the session
/// the target terminates the pending commands. A write still waiting for
/// data its initiator will no longer send (no new requests after a
/// Logout) is ended without a response, its R2T void, and the Logout is
/// answered: waiting for its data kept the connection open until the
/// initiator gave up.
#[test]
fn logout_ends_a_write_still_waiting_for_its_data() {
    let (mut h, mut t, _) = write_awaiting_r2t();
    let logout = h.logout(0);
    let mut bytes = Vec::new();
    h.take_transmit(&mut bytes);
    t.handle_input(&bytes).expect("Logout");
    let out = target_output(&mut t);
    let ops: Vec<(Opcode, u32)> = out.iter().map(|(b, _)| (b.opcode(), b.itt())).collect();
    assert_eq!(ops, vec![(Opcode::LOGOUT_RESP, logout)], "the write's data was waited for");
    assert_eq!(out[0].0.byte2(), 0);
    assert_eq!(t.open_tasks(), 0);
    assert_eq!(t.state(), State::Closed);
    assert!(!std::iter::from_fn(|| t.poll_event()).any(|e| matches!(e, Event::Command { .. })), "the write ran");
}

#[test]
fn rejects_data_out_for_unknown_ttt_and_beyond_the_burst() {
    let (mut h, mut t, r2t) = write_awaiting_r2t();
    let mut d = Bhs::new(Opcode::DATA_OUT);
    d.set_flags(flags::FINAL).set_itt(9).set_ttt(r2t.ttt().wrapping_add(100));
    assert!(send(&mut h, &mut t, &d, &[0; 512]).is_ok());
    let (reason, echoed) = reject_of(&mut t);
    assert_eq!(reason, RejectReason::INVALID_PDU_FIELD);
    assert_eq!(echoed.map(|e| e.ttt()), Some(r2t.ttt().wrapping_add(100)));
    // Offset inside the burst but data running past its end.
    d.set_ttt(r2t.ttt()).set_buffer_offset(3840);
    assert!(send(&mut h, &mut t, &d, &[0; 512]).is_ok());
    assert_eq!(reject_of(&mut t).0, RejectReason::INVALID_PDU_FIELD);
    // Unknown ITT.
    d.set_itt(1234);
    assert!(send(&mut h, &mut t, &d, &[0; 4]).is_ok());
    assert_eq!(reject_of(&mut t).0, RejectReason::INVALID_PDU_FIELD);
    // The correct Data-Out still completes the command.
    d.set_itt(9).set_buffer_offset(0);
    assert!(send(&mut h, &mut t, &d, &pattern(4096)).is_ok());
    match t.poll_event() {
        Some(Event::Command(cmd)) => assert_eq!(cmd.data, Some(pattern(4096))),
        other => panic!("{other:?}"),
    }
}

#[test]
fn rejects_unsolicited_data_when_initial_r2t_is_yes() {
    let mut hc = HostConfig::new(INITIATOR, Some(TARGET));
    hc.params.initial_r2t = true;
    let (mut h, mut t, _) = logged_in(hc, target_cfg(false));
    let (cmd_sn, exp_stat_sn, _, _) = h.sequence();
    let mut c = Bhs::new(Opcode::SCSI_CMD);
    c.set_flags(flags::WRITE) // F clear: announces unsolicited Data-Out
        .set_itt(9)
        .set_expected_data_transfer_length(4096)
        .set_cmd_sn(cmd_sn)
        .set_exp_stat_sn(exp_stat_sn);
    assert!(send(&mut h, &mut t, &c, &[]).is_ok());
    assert_eq!(reject_of(&mut t).0, RejectReason::PROTOCOL_ERROR);
    assert_eq!(t.cmd_window().0, cmd_sn.wrapping_add(1), "rejected command consumed its CmdSN");
}

#[test]
fn data_segment_beyond_max_recv_data_segment_length_rejects_and_closes() {
    let (mut h, mut t, _) = session(false);
    let mut b = Bhs::new(Opcode::NOP_OUT);
    b.set_immediate(true).set_flags(flags::FINAL).set_itt(3).set_ttt(RESERVED_TAG);
    let e = send(&mut h, &mut t, &b, &[0; 8196]).expect_err("too long");
    assert_eq!(e.field, "DataSegmentLength");
    assert_eq!(reject_of(&mut t).0, RejectReason::PROTOCOL_ERROR);
    assert_eq!(t.state(), State::Closed);
}

#[test]
fn digest_errors_reject_data_and_close_on_headers() {
    let (mut h, mut t, _) = session(true);
    let mut b = Bhs::new(Opcode::NOP_OUT);
    b.set_immediate(true).set_flags(flags::FINAL).set_itt(3).set_ttt(RESERVED_TAG);
    h.send_raw(&b, &[], b"abcd");
    let mut bytes = Vec::new();
    h.take_transmit(&mut bytes);
    let n = bytes.len();
    if let Some(x) = bytes.get_mut(n - 1) {
        *x ^= 0xff;
    }
    assert!(t.handle_input(&bytes).is_ok());
    let (reason, echoed) = reject_of(&mut t);
    assert_eq!(reason, RejectReason::DATA_DIGEST_ERROR);
    assert_eq!(echoed.map(|e| e.itt()), Some(3));
    // A header digest error leaves nothing to trust: close.
    h.send_raw(&b, &[], b"abcd");
    let mut bytes = Vec::new();
    h.take_transmit(&mut bytes);
    if let Some(x) = bytes.get_mut(49) {
        *x ^= 0xff;
    }
    let e = t.handle_input(&bytes).expect_err("header digest");
    assert_eq!(e.field, "HeaderDigest");
    assert_eq!(t.state(), State::Closed);
}

#[test]
fn write_with_corrupted_data_ends_in_check_condition() {
    let mut hc = HostConfig::new(INITIATOR, Some(TARGET));
    hc.params.data_digest = true;
    let mut tc = target_cfg(true);
    tc.params.header_digest = false;
    let (mut h, mut t, mut b) = logged_in(hc, tc);
    h.submit(0, &write10(1), 0, pattern(512));
    let mut bytes = Vec::new();
    h.take_transmit(&mut bytes);
    let n = bytes.len();
    if let Some(x) = bytes.get_mut(n - 5) {
        *x ^= 1;
    }
    t.handle_input(&bytes).expect("recoverable");
    serve(&mut t, &mut b);
    assert!(b.written.is_empty());
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    h.handle_input(&out).expect("valid");
    let ev = host_events(&mut h);
    assert!(ev.iter().any(|e| matches!(e, HostEvent::Reject { reason: RejectReason::DATA_DIGEST_ERROR, .. })));
    let c = ev.iter().find_map(|e| if let HostEvent::Completion(c) = e { Some(c.clone()) } else { None });
    let c = c.expect("completion");
    assert_eq!(c.status, scsi_status::CHECK_CONDITION);
    assert_eq!(c.sense.get(12..14), Some(&[0x47u8, 0x05][..]));
}

#[test]
fn ahs_length_beyond_the_pdu_is_rejected() {
    let (h, mut t, _) = session(false);
    let (cmd_sn, _, _, _) = h.sequence();
    let mut c = Bhs::new(Opcode::SCSI_CMD);
    c.set_flags(flags::FINAL).set_itt(4).set_cmd_sn(cmd_sn);
    let mut bytes = Vec::new();
    pdu::encode(&mut bytes, &c, &[0, 40, 1, 0], &[], Framing::default());
    assert!(t.handle_input(&bytes).is_ok());
    let (reason, _) = reject_of(&mut t);
    assert_eq!(reason, RejectReason::PROTOCOL_ERROR);
    assert_eq!(t.state(), State::FullFeature);
}

#[test]
fn non_login_pdu_during_login_closes() {
    let mut t = Target::new(target_cfg(false), Arc::new(TestPolicy::default()), seed());
    let mut bytes = Vec::new();
    pdu::encode(&mut bytes, &Bhs::new(Opcode::SCSI_CMD), &[], &[], Framing::default());
    assert!(t.handle_input(&bytes).is_err());
    assert_eq!(t.state(), State::Closed);
}

#[test]
fn random_bytes_never_panic() {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..400 {
        let (mut h, mut t, mut b) = if round % 2 == 0 {
            session(round % 4 == 0)
        } else {
            let h = HostConnection::new(HostConfig::new(INITIATOR, Some(TARGET)));
            let t = Target::new(target_cfg(false), Arc::new(chap_policy()), seed());
            (h, t, Backend::default())
        };
        let len = (rnd() % 600) as usize;
        let mut bytes: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
        // Make many of them look like PDUs with plausible lengths.
        if let (Some(b4), true) = (bytes.get_mut(4), len > 48) {
            *b4 &= 3;
        }
        if let Some(b5) = bytes.get_mut(5) {
            *b5 = 0;
        }
        for chunk in bytes.chunks(1 + (rnd() % 64) as usize) {
            let _ = t.handle_input(chunk);
        }
        serve(&mut t, &mut b);
        t.on_tick(rnd() % 100_000);
        let mut out = Vec::new();
        t.take_transmit(&mut out);
        let _ = h.handle_input(&out);
        let _ = h.handle_input(&bytes);
        step(&mut h, &mut t, &mut b);
    }
}

#[test]
fn initiator_negotiation_result_matches_the_targets() {
    // The same Params type describes both ends; what they agree on is the same.
    let mut hc = HostConfig::new(INITIATOR, Some(TARGET));
    hc.params = Params { max_outstanding_r2t: 3, default_time2retain: 0, ..hc.params };
    let (h, t, _) = logged_in(hc, target_cfg(false));
    let (hp, tp) = (h.params(), t.params());
    assert_eq!(hp.max_outstanding_r2t, tp.max_outstanding_r2t);
    assert_eq!(hp.default_time2retain, 0);
    assert_eq!(hp.first_burst_length, tp.first_burst_length);
    assert_eq!(hp.initial_r2t, tp.initial_r2t);
}

#[test]
fn logout_waits_for_commands_in_flight_and_refuses_new_ones() {
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), target_cfg(false));
    b.hold = true;
    let itt = h.submit(0, &read10(1), 512, Vec::new());
    step(&mut h, &mut t, &mut b);
    let task = b.held[0];
    h.logout(0);
    step(&mut h, &mut t, &mut b);
    assert!(host_events(&mut h).is_empty());
    h.submit(0, &read10(1), 512, Vec::new());
    step(&mut h, &mut t, &mut b);
    assert!(matches!(
        host_events(&mut h).first(),
        Some(HostEvent::Reject { reason: RejectReason::WAITING_FOR_LOGOUT, .. })
    ));
    assert!(t.send_data_in(task, &pattern(512), Some(scsi_status::GOOD)));
    step(&mut h, &mut t, &mut b);
    let ev = host_events(&mut h);
    assert!(matches!(ev.first(), Some(HostEvent::Completion(c)) if c.itt == itt));
    assert!(matches!(ev.last(), Some(HostEvent::LoggedOut { response: 0, .. })));
    assert_eq!(t.state(), State::Closed);
}

#[test]
fn asks_a_logged_in_initiator_to_log_out_with_an_async_message_that_consumes_a_stat_sn() {
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), target_cfg(false));
    h.nop(b"before");
    step(&mut h, &mut t, &mut b);
    assert!(matches!(host_events(&mut h).as_slice(), [HostEvent::NopIn { .. }]));
    assert!(t.request_logout(7));
    let out = target_output(&mut t);
    let [(async_msg, data)] = out.as_slice() else { panic!("one PDU expected: {out:?}") };
    assert_eq!(async_msg.opcode(), Opcode::ASYNC_MSG);
    assert_eq!(async_msg.itt(), RESERVED_TAG);
    assert!(async_msg.final_bit());
    assert!(data.is_empty());
    assert_eq!(async_msg.async_event(), pdu::async_event::REQUEST_LOGOUT);
    assert_eq!(async_msg.async_parameters(), [0, 0, 7]);
    // The next status carries the following StatSN.
    let mut bytes = Vec::new();
    h.nop(b"after");
    h.take_transmit(&mut bytes);
    t.handle_input(&bytes).expect("nop-out");
    let out = target_output(&mut t);
    let [(nop_in, _)] = out.as_slice() else { panic!("one PDU expected: {out:?}") };
    assert_eq!(nop_in.stat_sn(), async_msg.stat_sn().wrapping_add(1));

    // The host sees the request.
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), target_cfg(true));
    assert!(t.request_logout(30));
    step(&mut h, &mut t, &mut b);
    assert_eq!(
        host_events(&mut h),
        vec![HostEvent::AsyncMessage { event: pdu::async_event::REQUEST_LOGOUT, parameters: [0, 0, 30] }]
    );
    assert_eq!(t.state(), State::FullFeature);
}

#[test]
fn a_discovery_session_or_a_login_in_progress_gets_no_logout_request() {
    let (h, mut t, _) = login_with(HostConfig::new(INITIATOR, None), target_cfg(false), TestPolicy::default());
    assert!(h.is_full_feature());
    assert_eq!(t.session_type(), SessionType::Discovery);
    assert!(!t.request_logout(5));
    assert!(!t.has_transmit());
    let mut t = Target::new(target_cfg(false), Arc::new(TestPolicy::default()), seed());
    assert!(!t.request_logout(5));
    assert!(!t.has_transmit());
}

#[test]
fn final_login_response_waits_until_the_caller_admits_the_session() {
    let policy = TestPolicy { admits_sessions: true, ..TestPolicy::default() };
    let mut hc = HostConfig::new(INITIATOR, Some(TARGET));
    hc.isid = [0x80, 1, 2, 3, 4, 5];
    let (mut h, mut t, mut b) = login_with(hc, target_cfg(false), policy);
    // Everything is negotiated, but the host has no final answer yet.
    assert!(!h.is_full_feature());
    assert!(t.is_session_pending());
    assert_eq!(t.state(), State::AwaitLogin);
    let pending = format!(
        "{:?}",
        Event::<Vec<u8>>::SessionPending {
            initiator: INITIATOR.into(),
            target: TARGET.into(),
            isid: [0x80, 1, 2, 3, 4, 5],
        }
    );
    assert_eq!(b.events, vec![pending]);
    b.events.clear();
    t.admit_session();
    step(&mut h, &mut t, &mut b);
    assert!(h.is_full_feature());
    assert!(matches!(h.poll_event(), Some(HostEvent::LoggedIn { tsih: 0x1234 })));
    assert_eq!(t.state(), State::FullFeature);
    assert!(b.events.iter().any(|e| e.starts_with("LoggedIn")), "{:?}", b.events);
    // The session works.
    h.submit(0, &read10(1), 512, Vec::new());
    step(&mut h, &mut t, &mut b);
    assert_eq!(completions(&mut h).len(), 1);
}

#[test]
fn another_login_request_while_the_session_is_pending_closes_the_connection() {
    let policy = TestPolicy { admits_sessions: true, ..TestPolicy::default() };
    let (_, mut t, _) = login_with(HostConfig::new(INITIATOR, Some(TARGET)), target_cfg(false), policy);
    assert!(t.is_session_pending());
    let mut b = Bhs::new(Opcode::LOGIN_REQ);
    b.set_immediate(true).set_login_flags(true, false, pdu::Stage(1), pdu::Stage(3)).set_itt(2);
    let mut bytes = Vec::new();
    pdu::encode(&mut bytes, &b, &[], &[], Framing::default());
    let e = t.handle_input(&bytes).expect_err("a second login request is a protocol error");
    assert!(e.to_string().contains("waits for its answer"), "{e}");
}

#[test]
fn write_bit_with_zero_expected_length_is_a_write_of_no_bytes() {
    let (mut h, mut t, _) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), target_cfg(false));
    let c = write_pdu(&h, 5, 0, 0, false);
    send(&mut h, &mut t, &c, &[]).expect("valid");
    // Dispatched at once with an empty data-out buffer; nothing solicited.
    match t.poll_event() {
        Some(Event::Command(cmd)) => {
            assert!(cmd.write);
            assert_eq!(cmd.expected_len, 0);
            assert_eq!(cmd.data, Some(Vec::new()));
        }
        other => panic!("{other:?}"),
    }
    assert!(target_output(&mut t).iter().all(|(b, _)| b.opcode() != Opcode::R2T));
}

#[test]
fn zeros_answer_a_read_as_one_collapsed_data_in_with_or_without_digests() {
    for digests in [false, true] {
        let mut hc = HostConfig::new(INITIATOR, Some(TARGET));
        hc.params.header_digest = digests;
        hc.params.data_digest = digests;
        let (mut h, mut t, mut b) = logged_in(hc, target_cfg(digests));
        b.hold = true;
        h.submit(0, &read10(8), 4096, Vec::new());
        h.submit(0, &read10(3), 1536, Vec::new());
        step(&mut h, &mut t, &mut b);
        let held = std::mem::take(&mut b.held);
        assert_eq!(held.len(), 2);
        assert!(t.send_data_in_zeros(held[0], 4096));
        assert!(!t.send_data_in_zeros(held[1], 4096), "more than the read expects");
        assert!(t.send_data_in_zeros(held[1], 1536));
        assert!(!t.send_data_in_zeros(held[0], 4096), "the task is answered");
        // The sender splices the zeros in where the parts say.
        let mut head = Vec::new();
        let mut parts = Vec::new();
        t.take_transmit_parts(&mut head, |at, len| parts.push((at, len)));
        assert_eq!(parts.iter().map(|p| p.1).collect::<Vec<_>>(), vec![4096, 1536]);
        for (at, len) in parts.into_iter().rev() {
            head.splice(at..at, std::iter::repeat_n(0, len));
        }
        h.handle_input(&head).expect("valid");
        let mut c = completions(&mut h);
        c.sort_by_key(|c| c.data.len());
        assert_eq!(c.len(), 2);
        for (c, len) in c.iter().zip([1536, 4096]) {
            assert!(c.collapsed);
            assert_eq!((c.status, c.residual), (scsi_status::GOOD, None));
            assert!(c.data.len() == len && c.data.iter().all(|&x| x == 0), "digests {digests}");
        }
        assert_eq!(t.open_tasks(), 0);
    }
}

#[test]
fn commands_carry_the_epoch_they_arrived_in_and_restamp_raises_the_waiting_ones() {
    let (mut h, mut t, _) = logged_in_r2t_only();
    t.set_epoch(5);
    // A write collecting its data, a read whose event is not polled, both
    // on LUN 0, and a read of LUN 3.
    let write = h.submit(0, &write10(1), 0, pattern(512));
    let read = h.submit(0, &read10(1), 512, Vec::new());
    let other = h.submit(3, &read10(1), 512, Vec::new());
    let mut bytes = Vec::new();
    h.take_transmit(&mut bytes);
    t.set_epoch(6);
    t.handle_input(&bytes).expect("commands");
    t.set_epoch(7);
    // Only what `applies` picks (LUN 0) is raised; a stamp never goes down.
    t.restamp(9, |lun, stamp| lun == 0 && stamp >= 6);
    t.restamp(8, |_, _| true);
    let Some(Event::Command(c)) = t.poll_event() else { panic!("the read") };
    assert_eq!((c.task.itt, c.epoch), (read, 9));
    let Some(Event::Command(c)) = t.poll_event() else { panic!("the read of LUN 3") };
    assert_eq!((c.task.itt, c.epoch), (other, 8));
    let mut r2t = Vec::new();
    t.take_transmit(&mut r2t);
    h.handle_input(&r2t).expect("R2T");
    let mut data = Vec::new();
    h.take_transmit(&mut data);
    t.handle_input(&data).expect("data");
    let Some(Event::Command(c)) = t.poll_event() else { panic!("the write") };
    assert_eq!((c.task.itt, c.epoch), (write, 9));
    // New commands get the epoch set last, whatever was restamped.
    let later = h.submit(0, &read10(1), 512, Vec::new());
    let mut bytes = Vec::new();
    h.take_transmit(&mut bytes);
    t.handle_input(&bytes).expect("command");
    let Some(Event::Command(c)) = t.poll_event() else { panic!("the later read") };
    assert_eq!((c.task.itt, c.epoch), (later, 7));
}

// ---- full feature phase: RFC 7143 details ----

/// A bidirectional command (R and W, Bidirectional Read Expected Data
/// Transfer Length AHS) with `write_len` bytes of immediate data and
/// `read_len` expected back; the command as the upper layer gets it.
fn bidi_command(h: &mut HostConnection, t: &mut Target, itt: u32, write_len: u32, read_len: u32) -> TaskRef {
    let (_, exp_stat_sn, _, _) = h.sequence();
    let cmd_sn = t.cmd_window().0;
    let mut c = Bhs::new(Opcode::SCSI_CMD);
    c.set_flags(flags::FINAL | flags::READ | flags::WRITE)
        .set_itt(itt)
        .set_expected_data_transfer_length(write_len)
        .set_cmd_sn(cmd_sn)
        .set_exp_stat_sn(exp_stat_sn)
        .set_cdb(&[0x53, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
    // AHSLength 5, AHSType 2, reserved, then the length.
    let mut ahs = vec![0, 5, 2, 0];
    ahs.extend_from_slice(&read_len.to_be_bytes());
    h.send_raw(&c, &ahs, &pattern(write_len as usize));
    let mut bytes = Vec::new();
    h.take_transmit(&mut bytes);
    t.handle_input(&bytes).expect("valid");
    match t.poll_event() {
        Some(Event::Command(c)) => {
            assert!(c.read && c.write);
            assert_eq!(c.bidi_read_len, Some(read_len));
            c.task
        }
        other => panic!("{other:?}"),
    }
}

/// RFC 7143 11.4.5.1 and 11.7.5: for a bidirectional command the Residual
/// Count (O/U) is the write's; the read's residual goes in the
/// Bidirectional Read Residual Count (o/u), which only a SCSI Response
/// has, so the status does not ride in the last Data-In.
#[test]
fn bidirectional_read_residual_is_reported_apart_from_the_write_residual() {
    let (mut h, mut t, _) = session(false);
    let task = bidi_command(&mut h, &mut t, 0x31, 512, 1024);
    assert!(t.send_data_in(task, &pattern(512), Some(scsi_status::GOOD)));
    let out = target_output(&mut t);
    let ops: Vec<_> = out.iter().map(|(b, _)| b.opcode()).collect();
    assert_eq!(ops, vec![Opcode::DATA_IN, Opcode::SCSI_RESP], "{out:?}");
    let data_in = out[0].0;
    assert_eq!(data_in.flags() & flags::STATUS, 0, "status in the Data-In of a bidirectional command");
    let resp = out[1].0;
    assert_eq!(resp.flags() & (flags::OVERFLOW | flags::UNDERFLOW), 0, "the write had no residual");
    assert_eq!(resp.flags() & flags::BIDI_UNDERFLOW, flags::BIDI_UNDERFLOW);
    assert_eq!(resp.bidi_read_residual_count(), 512);
    // An error without data: the whole read is the read residual, the
    // write residual is the caller's.
    let task = bidi_command(&mut h, &mut t, 0x32, 512, 1024);
    let sense = [0x70, 0, 0x05, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x20, 0, 0, 0, 0, 0];
    assert!(t.send_response(task, scsi_status::CHECK_CONDITION, Some(&sense), Some(Residual::Underflow(512))));
    let out = target_output(&mut t);
    let resp = out[0].0;
    assert_eq!(resp.flags() & (flags::OVERFLOW | flags::UNDERFLOW), flags::UNDERFLOW);
    assert_eq!(resp.residual_count(), 512);
    assert_eq!(resp.flags() & (flags::BIDI_OVERFLOW | flags::BIDI_UNDERFLOW), flags::BIDI_UNDERFLOW);
    assert_eq!(resp.bidi_read_residual_count(), 1024);
}

/// RFC 7143 11.7.4: status rides in a Data-In only if it is GOOD,
/// CONDITION MET or INTERMEDIATE-CONDITION MET.
#[test]
fn intermediate_status_is_sent_in_a_scsi_response() {
    let (mut h, mut t, mut b) = session(false);
    b.hold = true;
    h.submit(0, &read10(1), 512, Vec::new());
    step(&mut h, &mut t, &mut b);
    assert!(t.send_data_in(b.held[0], &pattern(512), Some(scsi_status::INTERMEDIATE)));
    let out = target_output(&mut t);
    let ops: Vec<_> = out.iter().map(|(b, _)| (b.opcode(), b.flags() & flags::STATUS)).collect();
    assert_eq!(ops, vec![(Opcode::DATA_IN, 0), (Opcode::SCSI_RESP, 0)]);
    assert_eq!(out[1].0.byte3(), scsi_status::INTERMEDIATE);
}

/// RFC 7143 11.14.1 and section 11: Logout reason codes 3..127 are
/// reserved, and a reserved code value is a protocol error (Reject), not a
/// Logout Response "cleanup failed".
#[test]
fn logout_with_a_reserved_reason_code_is_rejected() {
    let (mut h, mut t, _) = session(false);
    let (cmd_sn, exp_stat_sn, _, _) = h.sequence();
    let mut l = Bhs::new(Opcode::LOGOUT_REQ);
    l.set_immediate(true).set_flags(flags::FINAL | 3).set_itt(0x40).set_cmd_sn(cmd_sn).set_exp_stat_sn(exp_stat_sn);
    assert!(send(&mut h, &mut t, &l, &[]).is_ok());
    let out = target_output(&mut t);
    assert!(out.iter().all(|(b, _)| b.opcode() != Opcode::LOGOUT_RESP), "{out:?}");
    let (r, echoed) = out.iter().find(|(b, _)| b.opcode() == Opcode::REJECT).expect("a Reject");
    assert_eq!(RejectReason(r.byte2()), RejectReason::PROTOCOL_ERROR);
    assert_eq!(Bhs::from_slice(echoed).map(|e| e.itt()), Some(0x40));
    assert_eq!(t.state(), State::FullFeature);
    assert_eq!(t.cmd_window().0, cmd_sn);
}

/// RFC 7143 11.18: the initiator answers a NOP-In ping with a NOP-Out
/// carrying its TTT; nothing requires that NOP-Out's ITT to be reserved
/// (a valid one asks for a NOP-In of its own). Either way the ping is
/// answered.
#[test]
fn nop_out_with_a_valid_itt_answers_the_targets_ping() {
    let (mut h, mut t, _) = session(false);
    t.on_tick(0);
    t.on_tick(5000);
    let ping = target_output(&mut t).into_iter().map(|p| p.0).find(|b| b.opcode() == Opcode::NOP_IN).expect("ping");
    assert_ne!(ping.ttt(), RESERVED_TAG);
    let (cmd_sn, exp_stat_sn, _, _) = h.sequence();
    let mut n = Bhs::new(Opcode::NOP_OUT);
    n.set_immediate(true)
        .set_flags(flags::FINAL)
        .set_itt(0x66)
        .set_ttt(ping.ttt())
        .set_lun(ping.lun())
        .set_cmd_sn(cmd_sn)
        .set_exp_stat_sn(exp_stat_sn);
    assert!(send(&mut h, &mut t, &n, b"echo").is_ok());
    let out = target_output(&mut t);
    let reply = out.iter().find(|(b, _)| b.opcode() == Opcode::NOP_IN).expect("a NOP-In for the ITT");
    assert_eq!((reply.0.itt(), reply.0.ttt(), reply.1.as_slice()), (0x66, RESERVED_TAG, &b"echo"[..]));
    t.on_tick(19_999);
    t.on_tick(20_000);
    assert_eq!(t.state(), State::FullFeature, "the answered ping was taken for a dead initiator");
    assert!(t.poll_event().is_none());
}

/// RFC 7143 11.8: a Data-Out with the F bit before the end of what its
/// R2T asked for may be rejected with reason "Protocol Error". The burst
/// will never be whole, so the write ends (CHECK CONDITION, ABORTED
/// COMMAND, DATA PHASE ERROR) instead of waiting for ever, and its later
/// Data-Out is dropped without another Reject.
#[test]
fn data_out_ending_an_r2t_burst_early_is_a_protocol_error_and_ends_the_write() {
    let (mut h, mut t, r2t) = write_awaiting_r2t();
    let mut d = Bhs::new(Opcode::DATA_OUT);
    d.set_flags(flags::FINAL).set_itt(9).set_ttt(r2t.ttt());
    assert!(send(&mut h, &mut t, &d, &[0; 512]).is_ok());
    let out = target_output(&mut t);
    let reject = out.iter().find(|(b, _)| b.opcode() == Opcode::REJECT).expect("a Reject");
    assert_eq!(RejectReason(reject.0.byte2()), RejectReason::PROTOCOL_ERROR);
    let (resp, sense) = out.iter().find(|(b, _)| b.opcode() == Opcode::SCSI_RESP).expect("the write ended");
    assert_eq!((resp.itt(), resp.byte3()), (9, scsi_status::CHECK_CONDITION));
    // Sense length, then fixed format: key at byte 2, ASC/ASCQ at 12/13.
    assert_eq!((sense[4] & 0x0f, sense[14], sense[15]), (0x0b, 0x4b, 0x00), "{sense:02x?}");
    assert_eq!(t.open_tasks(), 0);
    d.set_flags(0).set_buffer_offset(512);
    assert!(send(&mut h, &mut t, &d, &[0; 512]).is_ok());
    assert!(target_output(&mut t).is_empty(), "the ended write's Data-Out was answered");
}

// ---- task management, logout and unsolicited data against RFC 7143 ----

/// An immediate ABORT TASK as a hand-made PDU: ITT `itt`, referencing
/// `referenced` with `ref_cmd_sn`; its own CmdSN is `cmd_sn`.
fn abort_task(itt: u32, referenced: u32, ref_cmd_sn: u32, cmd_sn: u32) -> Bhs {
    let mut b = Bhs::new(Opcode::TASK_MGMT_REQ);
    b.set_immediate(true)
        .set_flags(flags::FINAL | TmfFunction::ABORT_TASK.0)
        .set_itt(itt)
        .set_ttt(RESERVED_TAG)
        .set_referenced_task_tag(referenced)
        .set_ref_cmd_sn(ref_cmd_sn)
        .set_cmd_sn(cmd_sn);
    b
}

fn read_pdu(itt: u32, cmd_sn: u32) -> Bhs {
    let mut c = Bhs::new(Opcode::SCSI_CMD);
    c.set_flags(flags::FINAL | flags::READ)
        .set_itt(itt)
        .set_expected_data_transfer_length(512)
        .set_cmd_sn(cmd_sn)
        .set_cdb(&read10(1));
    c
}

fn tmf_answer(out: &[(Bhs, Vec<u8>)], itt: u32) -> Option<u8> {
    out.iter().find(|(b, _)| b.opcode() == Opcode::TASK_MGMT_RESP && b.itt() == itt).map(|(b, _)| b.byte2())
}

/// RFC 7143 11.5.4: RefCmdSN is the CmdSN of the task to abort. An ABORT
/// TASK whose tag names a live task of another CmdSN does not name that
/// task: it is refused ("Function rejected", as the Linux target answers)
/// and the task carries on.
#[test]
fn abort_task_whose_ref_cmd_sn_is_not_the_tasks_is_rejected_and_the_task_carries_on() {
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), target_cfg(false));
    b.hold = true;
    let (victim_sn, _, _, _) = h.sequence();
    let victim = h.submit(0, &read10(1), 512, Vec::new());
    step(&mut h, &mut t, &mut b);
    assert_eq!(b.held.len(), 1);
    let (cmd_sn, _, _, _) = h.sequence();
    assert!(send(&mut h, &mut t, &abort_task(0x50, victim, victim_sn.wrapping_add(7), cmd_sn), &[]).is_ok());
    assert!(t.poll_event().is_none(), "the request reached the upper layer");
    assert_eq!(tmf_answer(&target_output(&mut t), 0x50), Some(tmf_response::REJECTED));
    assert_eq!(t.open_tasks(), 1);
    assert!(t.send_data_in(b.held[0], &pattern(512), Some(scsi_status::GOOD)), "the task was aborted");
    // With the right RefCmdSN the same request aborts it.
    b.held.clear();
    let victim = h.submit(0, &read10(1), 512, Vec::new());
    step(&mut h, &mut t, &mut b);
    host_events(&mut h);
    let tmf = h.task_mgmt(TmfFunction::ABORT_TASK.0, 0, victim);
    step(&mut h, &mut t, &mut b);
    assert!(host_events(&mut h).contains(&HostEvent::TaskMgmt { itt: tmf, response: tmf_response::COMPLETE }));
    assert_eq!(t.open_tasks(), 0);
}

/// SAM-5 7.2 / RFC 7143 11.5.3: ABORT TASK is addressed to a logical unit
/// and names a task of it (I_T_L_Q). A tag held by a task of another LUN
/// is not that task: "Task does not exist" (as the Linux target answers,
/// which looks the tag up on the request's LUN only), and the task carries
/// on.
#[test]
fn abort_task_naming_another_luns_task_leaves_it_alone() {
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), target_cfg(false));
    b.hold = true;
    let victim = h.submit(0, &read10(1), 512, Vec::new());
    step(&mut h, &mut t, &mut b);
    assert_eq!(b.held.len(), 1);
    host_events(&mut h);
    let lun1 = 0x0001_0000_0000_0000;
    let tmf = h.task_mgmt(TmfFunction::ABORT_TASK.0, lun1, victim);
    step(&mut h, &mut t, &mut b);
    assert!(t.poll_event().is_none(), "the request reached the upper layer");
    assert!(
        host_events(&mut h).contains(&HostEvent::TaskMgmt { itt: tmf, response: tmf_response::TASK_DOES_NOT_EXIST })
    );
    assert_eq!(t.open_tasks(), 1);
    assert!(t.send_data_in(b.held[0], &pattern(512), Some(scsi_status::GOOD)), "the task was aborted");
}

/// RFC 7143 11.5.1 b): an ABORT TASK for a command not yet received whose
/// RefCmdSN is in the window and before the request's CmdSN: the target
/// counts that CmdSN as received and answers "function complete". The
/// command, if it comes after all, never runs, and the window moves past
/// it.
#[test]
fn abort_task_of_a_command_not_yet_received_counts_its_cmd_sn_as_received() {
    let (mut h, mut t, _) = session(false);
    let (sn, _, _, _) = h.sequence();
    let (exp, max) = t.cmd_window();
    assert_eq!(exp, sn);
    let depth = max.wrapping_sub(exp);
    // The initiator numbered sn and sn+1; the abort of sn+1 overtakes both.
    assert!(send(&mut h, &mut t, &abort_task(0x50, 0x71, sn.wrapping_add(1), sn.wrapping_add(2)), &[]).is_ok());
    assert_eq!(tmf_answer(&target_output(&mut t), 0x50), Some(tmf_response::COMPLETE));
    assert!(t.poll_event().is_none());
    assert!(send(&mut h, &mut t, &read_pdu(0x70, sn), &[]).is_ok());
    assert!(matches!(t.poll_event(), Some(Event::Command(c)) if c.task.itt == 0x70));
    assert_eq!(t.cmd_window().0, sn.wrapping_add(2), "ExpCmdSN stepped over the aborted command's CmdSN");
    // The aborted command arrives late: dropped, never run.
    assert!(send(&mut h, &mut t, &read_pdu(0x71, sn.wrapping_add(1)), &[]).is_ok());
    assert!(t.poll_event().is_none(), "the aborted command ran");
    assert!(send(&mut h, &mut t, &read_pdu(0x72, sn.wrapping_add(2)), &[]).is_ok());
    assert!(matches!(t.poll_event(), Some(Event::Command(c)) if c.task.itt == 0x72));
    // At ExpCmdSN itself, the window moves at once.
    let (sn, _, _, _) = (sn.wrapping_add(3), 0, 0, 0);
    assert!(send(&mut h, &mut t, &abort_task(0x51, 0x73, sn, sn.wrapping_add(1)), &[]).is_ok());
    assert_eq!(tmf_answer(&target_output(&mut t), 0x51), Some(tmf_response::COMPLETE));
    assert!(send(&mut h, &mut t, &read_pdu(0x73, sn), &[]).is_ok());
    assert!(t.poll_event().is_none(), "the aborted command ran");
    // Two commands still open (0x70, 0x72); the window is as deep as before.
    let (exp, max) = t.cmd_window();
    assert_eq!(exp, sn.wrapping_add(1));
    assert_eq!(max.wrapping_sub(exp), depth.wrapping_sub(2));
}

/// RFC 7143 11.14: after a Logout Request the initiator sends no new
/// request. A second Logout while the first waits for the commands in
/// flight is refused; the first is still answered, with its own ITT, once
/// they are done.
#[test]
fn second_logout_while_the_first_waits_is_rejected_and_the_first_is_answered() {
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), target_cfg(false));
    b.hold = true;
    h.submit(0, &read10(1), 512, Vec::new());
    step(&mut h, &mut t, &mut b);
    let first = h.logout(0);
    step(&mut h, &mut t, &mut b);
    assert!(host_events(&mut h).is_empty());
    let second = h.logout(0);
    assert_ne!(first, second);
    step(&mut h, &mut t, &mut b);
    assert!(matches!(
        host_events(&mut h).as_slice(),
        [HostEvent::Reject { reason: RejectReason::WAITING_FOR_LOGOUT, bhs: Some(r) }] if r.itt() == second
    ));
    assert_eq!(t.state(), State::FullFeature);
    assert!(t.send_data_in(b.held[0], &pattern(512), Some(scsi_status::GOOD)));
    let out = target_output(&mut t);
    let logouts: Vec<u32> =
        out.iter().filter(|(b, _)| b.opcode() == Opcode::LOGOUT_RESP).map(|(b, _)| b.itt()).collect();
    assert_eq!(logouts, vec![first]);
    assert_eq!(t.state(), State::Closed);
}

/// A Logout that arrives while a task management request waits for the
/// upper layer is answered after it, so the initiator sees the request's
/// answer before the connection closes.
#[test]
fn logout_waits_for_a_pending_task_management_request() {
    let (mut h, mut t, _) = session(false);
    h.task_mgmt(TmfFunction::LOGICAL_UNIT_RESET.0, 0, RESERVED_TAG);
    let mut bytes = Vec::new();
    h.take_transmit(&mut bytes);
    t.handle_input(&bytes).expect("TMF");
    let Some(Event::TaskMgmt { itt, .. }) = t.poll_event() else { panic!("a TaskMgmt event") };
    let logout = h.logout(0);
    let mut bytes = Vec::new();
    h.take_transmit(&mut bytes);
    t.handle_input(&bytes).expect("Logout");
    assert!(target_output(&mut t).is_empty(), "answered before the task management request");
    assert_eq!(t.state(), State::FullFeature);
    assert!(t.send_tmf_response(itt, tmf_response::COMPLETE));
    let out = target_output(&mut t);
    let ops: Vec<(Opcode, u32)> = out.iter().map(|(b, _)| (b.opcode(), b.itt())).collect();
    assert_eq!(ops, vec![(Opcode::TASK_MGMT_RESP, itt), (Opcode::LOGOUT_RESP, logout)]);
    assert_eq!(t.state(), State::Closed);
}

/// RFC 7143 13.10 and 11.8: unsolicited data goes as for an implied R2T
/// asking for min(FirstBurstLength, Expected Data Transfer Length), all of
/// it. An unsolicited burst ended (F bit) short of that is not made up
/// with R2Ts: the write never runs and ends in CHECK CONDITION, ABORTED
/// COMMAND, WRITE ERROR - NOT ENOUGH UNSOLICITED DATA (0C/0D), as the
/// Linux target answers it; Data-Out that still comes for it is dropped.
#[test]
fn unsolicited_burst_ended_short_of_the_first_burst_ends_the_write_in_check_condition() {
    let (mut h, mut t, _) = session(false);
    assert!(!t.params().initial_r2t && t.params().first_burst_length >= 8192);
    let c = write_pdu(&h, 9, 8192, 16, true);
    assert!(send(&mut h, &mut t, &c, &[0x11; 512]).is_ok());
    let mut d = Bhs::new(Opcode::DATA_OUT);
    d.set_flags(flags::FINAL).set_itt(9).set_ttt(RESERVED_TAG).set_data_sn(0).set_buffer_offset(512);
    assert!(send(&mut h, &mut t, &d, &[0x22; 512]).is_ok());
    assert!(t.poll_event().is_none(), "the write reached the upper layer");
    let out = target_output(&mut t);
    assert!(out.iter().all(|(b, _)| b.opcode() != Opcode::R2T), "R2Ts for the rest of a short first burst");
    let (resp, data) = out.iter().find(|(b, _)| b.opcode() == Opcode::SCSI_RESP).expect("a SCSI Response");
    assert_eq!((resp.itt(), resp.byte3()), (9, scsi_status::CHECK_CONDITION));
    // SenseLength, then fixed-format sense: key, ASC, ASCQ.
    assert_eq!((data[2 + 2] & 0x0f, data[2 + 12], data[2 + 13]), (0x0b, 0x0c, 0x0d));
    assert_eq!(t.open_tasks(), 0);
    d.set_flags(flags::FINAL).set_data_sn(1).set_buffer_offset(1024);
    assert!(send(&mut h, &mut t, &d, &[0x33; 512]).is_ok());
    assert!(target_output(&mut t).is_empty(), "Data-Out of the ended write answered");
}

/// RFC 7143 11.7.1: the last PDU of the unsolicited data has the F bit. A
/// Data-Out that fills the first burst without it is a protocol error, as
/// at the end of an R2T's burst: the initiator sends nothing more for that
/// burst, so the write can never be whole. It ends in CHECK CONDITION,
/// ABORTED COMMAND, DATA PHASE ERROR instead of waiting for ever.
#[test]
fn data_out_filling_the_first_burst_without_the_f_bit_ends_the_write() {
    let (mut h, mut t, _) = session(false);
    let c = write_pdu(&h, 9, 8192, 16, true);
    assert!(send(&mut h, &mut t, &c, &[0x11; 512]).is_ok());
    let mut d = Bhs::new(Opcode::DATA_OUT);
    d.set_flags(0).set_itt(9).set_ttt(RESERVED_TAG).set_data_sn(0).set_buffer_offset(512);
    assert!(send(&mut h, &mut t, &d, &[0x22; 7680]).is_ok());
    assert!(t.poll_event().is_none(), "the write reached the upper layer");
    let out = target_output(&mut t);
    let (resp, sense) = out.iter().find(|(b, _)| b.opcode() == Opcode::SCSI_RESP).expect("the write ended");
    assert_eq!((resp.itt(), resp.byte3()), (9, scsi_status::CHECK_CONDITION));
    assert_eq!((sense[4] & 0x0f, sense[14], sense[15]), (0x0b, 0x4b, 0x00), "{sense:02x?}");
    assert_eq!(t.open_tasks(), 0);
    let reject = out.iter().find(|(b, _)| b.opcode() == Opcode::REJECT).expect("a Reject");
    assert_eq!(RejectReason(reject.0.byte2()), RejectReason::PROTOCOL_ERROR);
    d.set_flags(flags::FINAL).set_data_sn(1).set_buffer_offset(8192);
    assert!(send(&mut h, &mut t, &d, &[]).is_ok());
    assert!(target_output(&mut t).is_empty(), "Data-Out of the ended write answered");
}

/// Immediate data short of the first burst with the F bit (no unsolicited
/// Data-Out) is allowed: R2Ts ask for the rest.
#[test]
fn immediate_data_short_of_the_first_burst_with_the_f_bit_gets_r2ts_for_the_rest() {
    let (mut h, mut t, _) = session(false);
    let c = write_pdu(&h, 9, 8192, 16, false);
    assert!(send(&mut h, &mut t, &c, &[0x11; 512]).is_ok());
    let out = target_output(&mut t);
    let r2t = out.iter().find(|(b, _)| b.opcode() == Opcode::R2T).expect("an R2T").0;
    assert_eq!((r2t.buffer_offset(), r2t.residual_count()), (512, 8192 - 512));
}

/// RFC 7143 7.2: a command rejected whole is discarded, and so is the
/// unsolicited Data-Out already on its way for it: dropped, not answered
/// with a Reject each.
#[test]
fn unsolicited_data_out_of_a_rejected_write_is_dropped_without_rejects() {
    let mut hc = HostConfig::new(INITIATOR, Some(TARGET));
    hc.params.header_digest = false;
    hc.params.data_digest = false;
    let tc = TargetConfig { max_write_len: 4096, ..target_cfg(false) };
    let (mut h, mut t, _) = logged_in(hc, tc);
    let c = write_pdu(&h, 9, 8192, 16, true);
    assert!(send(&mut h, &mut t, &c, &[]).is_ok());
    assert_eq!(reject_of(&mut t).0, RejectReason::OUT_OF_RESOURCES);
    let mut d = Bhs::new(Opcode::DATA_OUT);
    d.set_itt(9).set_ttt(RESERVED_TAG);
    for sn in 0..8u32 {
        d.set_flags(if sn == 7 { flags::FINAL } else { 0 }).set_data_sn(sn).set_buffer_offset(sn * 1024);
        assert!(send(&mut h, &mut t, &d, &[0x44; 1024]).is_ok());
    }
    let out = target_output(&mut t);
    assert!(out.is_empty(), "{} PDUs answered the rejected write's data: {out:?}", out.len());
    assert_eq!(t.state(), State::FullFeature);
}

/// The PDU that answers a numbered command (Data-In with status, or SCSI
/// Response) carries the MaxCmdSN that the command's end opened, as the
/// Linux target's does: with a window of one command, the initiator
/// otherwise waits for some unrelated PDU before it may send the next.
#[test]
fn the_answer_to_a_command_carries_the_window_its_end_opened() {
    let tc = TargetConfig { queue_depth: 1, ..target_cfg(false) };
    let (mut h, mut t, mut b) = logged_in(HostConfig::new(INITIATOR, Some(TARGET)), tc);
    for _ in 0..3 {
        h.submit(0, &read10(1), 512, Vec::new());
    }
    h.submit(0, &write10(1), 0, pattern(512));
    step(&mut h, &mut t, &mut b);
    assert_eq!(completions(&mut h).len(), 4);
    // Every way of answering a command.
    b.hold = true;
    for answer in 0..5 {
        h.submit(0, &read10(1), 512, Vec::new());
        step(&mut h, &mut t, &mut b);
        let task = b.held.pop().expect("command delivered");
        assert!(match answer {
            0 => t.send_data_in(task, &pattern(512), Some(scsi_status::GOOD)),
            1 => t.send_data_in(task, &pattern(512), Some(scsi_status::CHECK_CONDITION)),
            2 => t.send_data_in_zeros(task, 512),
            3 => t.send_data_in_with(task, 512, |out| {
                out.extend_from_slice(&pattern(512));
                true
            }),
            _ => t.send_response(task, scsi_status::CHECK_CONDITION, Some(&[0x70, 0, 5]), None),
        });
        let mut bytes = Vec::new();
        t.take_transmit(&mut bytes);
        let (last, _) = pdus(&bytes, Framing::default()).pop().expect("an answer");
        assert_eq!(last.max_cmd_sn(), last.exp_cmd_sn(), "answer {answer}: the window of one is open again");
        h.handle_input(&bytes).expect("valid");
        assert_eq!(completions(&mut h).len(), 1);
    }
}
