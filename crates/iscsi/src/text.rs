//! Text keys (RFC 7143 sections 6 and 13): `key=value\0` parsing with size
//! limits, and the negotiation rule of every operational key.
//!
//! The responder side ([`negotiate`]) decides each offered key by its type:
//! list (first acceptable value of the originator's list), numerical minimum
//! or maximum, boolean OR/AND, or declarative (no answer). Unknown keys get
//! `NotUnderstood`, out-of-range values `Reject`, session keys in a
//! discovery session `Irrelevant`. This module never sees a socket or a PDU.

/// Longest key name (RFC 7143 section 6.1: 63 bytes).
pub const MAX_KEY_LEN: usize = 63;
/// Longest value we accept (RFC 7143 allows 255 for most keys and 8192 for
/// text and binary values such as CHAP challenges).
pub const MAX_VALUE_LEN: usize = 8192;

/// A text-format violation: answered at login with status 0x0200 or in a
/// Text Response with a Reject.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// A `key=value` pair lacks the `=`.
    #[error("text pair {0:?} has no '='")]
    MissingEquals(String),
    /// A key name is empty, too long or uses characters outside the RFC's set.
    #[error("key {0:?} is not a valid key name")]
    BadKey(String),
    /// A value is longer than the limit.
    #[error("value of {key} is {len} bytes (limit {MAX_VALUE_LEN})")]
    ValueTooLong {
        /// The key.
        key: String,
        /// The value length.
        len: usize,
    },
    /// The text is not UTF-8.
    #[error("text is not UTF-8")]
    NotUtf8,
    /// The same key appears twice in one negotiation.
    #[error("key {0} sent more than once")]
    Duplicate(String),
    /// The accumulated text exceeds the limit.
    #[error("text of {0} bytes exceeds the limit")]
    TooLong(usize),
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= MAX_KEY_LEN
        && k.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'+' | b'@' | b'_' | b'#'))
}

/// Parses `key=value\0...`. A missing final NUL is tolerated; empty pairs
/// (padding) are skipped.
pub fn parse(data: &[u8]) -> Result<Vec<(String, String)>, TextError> {
    let mut out = Vec::new();
    for raw in data.split(|&b| b == 0) {
        if raw.is_empty() {
            continue;
        }
        let s = std::str::from_utf8(raw).map_err(|_| TextError::NotUtf8)?;
        let Some((k, v)) = s.split_once('=') else {
            return Err(TextError::MissingEquals(s.chars().take(64).collect()));
        };
        if !valid_key(k) {
            return Err(TextError::BadKey(k.chars().take(64).collect()));
        }
        if v.len() > MAX_VALUE_LEN {
            return Err(TextError::ValueTooLong { key: k.to_string(), len: v.len() });
        }
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

/// Parses like [`parse`] and fails on a key given twice.
pub fn parse_unique(data: &[u8]) -> Result<Vec<(String, String)>, TextError> {
    let pairs = parse(data)?;
    let mut seen = std::collections::HashSet::new();
    for (k, _) in &pairs {
        if !seen.insert(k.as_str()) {
            return Err(TextError::Duplicate(k.clone()));
        }
    }
    Ok(pairs)
}

/// Appends `key=value\0`.
pub fn push(out: &mut Vec<u8>, key: &str, value: &str) {
    out.extend_from_slice(key.as_bytes());
    out.push(b'=');
    out.extend_from_slice(value.as_bytes());
    out.push(0);
}

/// Sets the value of `key` in `out` (pairs as [`push`] writes them) to
/// `value`, where it is there.
pub fn replace(out: &mut Vec<u8>, key: &str, value: &str) {
    let mut rebuilt = Vec::with_capacity(out.len());
    for pair in out.split(|&b| b == 0).filter(|p| !p.is_empty()) {
        match pair.strip_prefix(key.as_bytes()).and_then(|rest| rest.strip_prefix(b"=")) {
            Some(_) => push(&mut rebuilt, key, value),
            None => {
                rebuilt.extend_from_slice(pair);
                rebuilt.push(0);
            }
        }
    }
    *out = rebuilt;
}

/// Encodes pairs as `key=value\0...`.
pub fn encode<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        push(&mut out, k.as_ref(), v.as_ref());
    }
    out
}

/// Session type (RFC 7143 section 13.21).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SessionType {
    /// A normal session with a target and its LUNs.
    #[default]
    Normal,
    /// A discovery session: SendTargets only.
    Discovery,
}

/// Operational parameters of a session and connection (RFC 7143 section 13).
/// `Default` gives the RFC defaults; a target's configuration uses the same
/// type for what it is willing to accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// HeaderDigest=CRC32C.
    pub header_digest: bool,
    /// DataDigest=CRC32C.
    pub data_digest: bool,
    /// MaxConnections.
    pub max_connections: u16,
    /// InitialR2T.
    pub initial_r2t: bool,
    /// ImmediateData.
    pub immediate_data: bool,
    /// MaxRecvDataSegmentLength this side declared: the most data it accepts
    /// in one PDU.
    pub max_recv_data_segment_length: u32,
    /// The peer's declared MaxRecvDataSegmentLength: the most data this side
    /// may send in one PDU.
    pub peer_max_recv_data_segment_length: u32,
    /// MaxBurstLength.
    pub max_burst_length: u32,
    /// FirstBurstLength.
    pub first_burst_length: u32,
    /// DefaultTime2Wait, seconds.
    pub default_time2wait: u16,
    /// DefaultTime2Retain, seconds.
    pub default_time2retain: u16,
    /// MaxOutstandingR2T.
    pub max_outstanding_r2t: u16,
    /// DataPDUInOrder.
    pub data_pdu_in_order: bool,
    /// DataSequenceInOrder.
    pub data_sequence_in_order: bool,
    /// ErrorRecoveryLevel.
    pub error_recovery_level: u8,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            header_digest: false,
            data_digest: false,
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            max_recv_data_segment_length: 8192,
            peer_max_recv_data_segment_length: 8192,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
        }
    }
}

/// How a key is negotiated (RFC 7143 section 6.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// A list: the responder picks the first value it supports.
    List,
    /// Numerical, result is the minimum; valid range inclusive.
    Min(u32, u32),
    /// Numerical, result is the maximum; valid range inclusive.
    Max(u32, u32),
    /// Boolean, result is the OR.
    Or,
    /// Boolean, result is the AND.
    And,
    /// Declarative: no answer.
    Declarative,
}

/// The kind of a known key, `None` for an unknown one.
pub fn key_kind(key: &str) -> Option<KeyKind> {
    Some(match key {
        "HeaderDigest" | "DataDigest" | "AuthMethod" => KeyKind::List,
        "MaxConnections" => KeyKind::Min(1, 65535),
        "MaxBurstLength" | "FirstBurstLength" => KeyKind::Min(512, 0x00ff_ffff),
        "DefaultTime2Retain" => KeyKind::Min(0, 3600),
        "DefaultTime2Wait" => KeyKind::Max(0, 3600),
        "MaxOutstandingR2T" => KeyKind::Min(1, 65535),
        "ErrorRecoveryLevel" => KeyKind::Min(0, 2),
        "InitialR2T" | "DataPDUInOrder" | "DataSequenceInOrder" => KeyKind::Or,
        "ImmediateData" => KeyKind::And,
        "MaxRecvDataSegmentLength"
        | "TargetAlias"
        | "InitiatorAlias"
        | "TargetName"
        | "InitiatorName"
        | "SessionType"
        | "TargetPortalGroupTag"
        | "TargetAddress" => KeyKind::Declarative,
        // Not supported (RFC 7143 section 13.23-13.25 and RFC 7144/5048
        // extensions we decline): answered like any known key we refuse.
        "IFMarker" | "OFMarker" | "OFMarkInt" | "IFMarkInt" => KeyKind::Declarative,
        _ => return None,
    })
}

/// Keys that are Irrelevant in a discovery session (RFC 7143 section 13:
/// "Irrelevant when: SessionType=Discovery").
fn irrelevant_in_discovery(key: &str) -> bool {
    matches!(
        key,
        "MaxConnections"
            | "InitialR2T"
            | "ImmediateData"
            | "MaxBurstLength"
            | "FirstBurstLength"
            | "MaxOutstandingR2T"
            | "DataPDUInOrder"
            | "DataSequenceInOrder"
    )
}

/// The responder's answer to one offered key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Send `key=value`.
    Value(String),
    /// Declarative key: nothing to send.
    None,
    /// `key=NotUnderstood`.
    NotUnderstood,
    /// `key=Irrelevant`.
    Irrelevant,
    /// `key=Reject`.
    Reject,
}

impl Answer {
    /// The text value to send, if any.
    pub fn text(&self) -> Option<&str> {
        match self {
            Answer::Value(v) => Some(v),
            Answer::None => None,
            Answer::NotUnderstood => Some("NotUnderstood"),
            Answer::Irrelevant => Some("Irrelevant"),
            Answer::Reject => Some("Reject"),
        }
    }
}

/// A numerical value: decimal, or hex with 0x (RFC 7143 section 6.1);
/// `None` when it is neither or does not fit 32 bits.
pub fn parse_num(v: &str) -> Option<u32> {
    if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        // `from_str_radix` takes a leading sign, which no hex-constant has.
        if h.is_empty() || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u32::from_str_radix(h, 16).ok()
    } else if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        v.parse().ok()
    } else {
        None
    }
}

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

fn yes_no(b: bool) -> String {
    if b { "Yes" } else { "No" }.to_string()
}

/// The responder (target) side of one operational key.
///
/// `ours` holds what this side accepts (its preferences and limits),
/// `result` the negotiated parameters updated in place. Security keys
/// (AuthMethod, CHAP_*) and the name keys are handled by the login code, not
/// here.
pub fn negotiate(key: &str, value: &str, ours: &Params, result: &mut Params, session: SessionType) -> Answer {
    let Some(kind) = key_kind(key) else {
        return Answer::NotUnderstood;
    };
    if session == SessionType::Discovery && irrelevant_in_discovery(key) {
        return Answer::Irrelevant;
    }
    match kind {
        KeyKind::List => {
            let allow = match key {
                "HeaderDigest" => ours.header_digest,
                "DataDigest" => ours.data_digest,
                _ => return Answer::NotUnderstood,
            };
            for v in value.split(',') {
                let pick = match v {
                    "None" => Some(false),
                    "CRC32C" if allow => Some(true),
                    _ => None,
                };
                if let Some(on) = pick {
                    if key == "HeaderDigest" {
                        result.header_digest = on;
                    } else {
                        result.data_digest = on;
                    }
                    return Answer::Value(v.to_string());
                }
            }
            Answer::Reject
        }
        KeyKind::Min(lo, hi) | KeyKind::Max(lo, hi) => {
            let Some(n) = parse_num(value).filter(|n| (lo..=hi).contains(n)) else {
                return Answer::Reject;
            };
            let is_min = matches!(kind, KeyKind::Min(..));
            let pick = |mine: u32| if is_min { n.min(mine) } else { n.max(mine) };
            let v = match key {
                "MaxConnections" => {
                    result.max_connections = u16::try_from(pick(u32::from(ours.max_connections))).unwrap_or(1);
                    u32::from(result.max_connections)
                }
                "MaxBurstLength" => {
                    result.max_burst_length = pick(ours.max_burst_length);
                    result.max_burst_length
                }
                "FirstBurstLength" => {
                    // RFC 7143 13.14: FirstBurstLength MUST NOT exceed
                    // MaxBurstLength, and an answer cannot be taken back
                    // (section 6.2), so never agree to more than the
                    // largest MaxBurstLength this side would accept.
                    result.first_burst_length = pick(ours.first_burst_length.min(ours.max_burst_length));
                    result.first_burst_length
                }
                "DefaultTime2Retain" => {
                    result.default_time2retain = u16::try_from(pick(u32::from(ours.default_time2retain))).unwrap_or(0);
                    u32::from(result.default_time2retain)
                }
                "DefaultTime2Wait" => {
                    result.default_time2wait = u16::try_from(pick(u32::from(ours.default_time2wait))).unwrap_or(0);
                    u32::from(result.default_time2wait)
                }
                "MaxOutstandingR2T" => {
                    result.max_outstanding_r2t = u16::try_from(pick(u32::from(ours.max_outstanding_r2t))).unwrap_or(1);
                    u32::from(result.max_outstanding_r2t)
                }
                "ErrorRecoveryLevel" => {
                    result.error_recovery_level = u8::try_from(pick(u32::from(ours.error_recovery_level))).unwrap_or(0);
                    u32::from(result.error_recovery_level)
                }
                _ => return Answer::NotUnderstood,
            };
            Answer::Value(v.to_string())
        }
        KeyKind::Or | KeyKind::And => {
            let Some(b) = parse_bool(value) else {
                return Answer::Reject;
            };
            let or = kind == KeyKind::Or;
            let combine = |mine: bool| if or { b || mine } else { b && mine };
            let r = match key {
                "InitialR2T" => {
                    result.initial_r2t = combine(ours.initial_r2t);
                    result.initial_r2t
                }
                "DataPDUInOrder" => {
                    result.data_pdu_in_order = combine(ours.data_pdu_in_order);
                    result.data_pdu_in_order
                }
                "DataSequenceInOrder" => {
                    result.data_sequence_in_order = combine(ours.data_sequence_in_order);
                    result.data_sequence_in_order
                }
                "ImmediateData" => {
                    result.immediate_data = combine(ours.immediate_data);
                    result.immediate_data
                }
                _ => return Answer::NotUnderstood,
            };
            Answer::Value(yes_no(r))
        }
        KeyKind::Declarative => match key {
            "MaxRecvDataSegmentLength" => match parse_num(value).filter(|n| (512..=0x00ff_ffff).contains(n)) {
                Some(n) => {
                    result.peer_max_recv_data_segment_length = n;
                    Answer::None
                }
                None => Answer::Reject,
            },
            // Markers (RFC 7143 section 13.25 left them to RFC 7144 as
            // obsolete): a Yes offer is refused.
            "IFMarker" | "OFMarker" => Answer::Value("No".into()),
            "OFMarkInt" | "IFMarkInt" => Answer::Reject,
            _ => Answer::None,
        },
    }
}

/// Applies the target's answer to a key the initiator offered: the
/// originator side of [`negotiate`]. Returns false when the answer is not a
/// valid result of the offer (a protocol error the initiator may act on).
pub fn apply_answer(key: &str, value: &str, offered: &Params, result: &mut Params) -> bool {
    if matches!(value, "NotUnderstood" | "Irrelevant" | "Reject") {
        return true;
    }
    match key {
        "HeaderDigest" => {
            result.header_digest = value == "CRC32C";
            value == "None" || (value == "CRC32C" && offered.header_digest)
        }
        "DataDigest" => {
            result.data_digest = value == "CRC32C";
            value == "None" || (value == "CRC32C" && offered.data_digest)
        }
        "MaxRecvDataSegmentLength" => match parse_num(value) {
            Some(n) if n >= 512 => {
                result.peer_max_recv_data_segment_length = n;
                true
            }
            _ => false,
        },
        "MaxBurstLength" | "FirstBurstLength" | "MaxConnections" | "DefaultTime2Retain" | "MaxOutstandingR2T"
        | "ErrorRecoveryLevel" | "DefaultTime2Wait" => {
            let Some(n) = parse_num(value) else { return false };
            let (slot, mine): (&mut u32, u32) = match key {
                "MaxBurstLength" => (&mut result.max_burst_length, offered.max_burst_length),
                "FirstBurstLength" => (&mut result.first_burst_length, offered.first_burst_length),
                _ => return set_small(key, n, offered, result),
            };
            *slot = n;
            n <= mine
        }
        "InitialR2T" | "DataPDUInOrder" | "DataSequenceInOrder" | "ImmediateData" => {
            let Some(b) = parse_bool(value) else { return false };
            let (slot, mine, or) = match key {
                "InitialR2T" => (&mut result.initial_r2t, offered.initial_r2t, true),
                "DataPDUInOrder" => (&mut result.data_pdu_in_order, offered.data_pdu_in_order, true),
                "DataSequenceInOrder" => (&mut result.data_sequence_in_order, offered.data_sequence_in_order, true),
                _ => (&mut result.immediate_data, offered.immediate_data, false),
            };
            *slot = b;
            if or {
                b || !mine
            } else {
                !b || mine
            }
        }
        _ => true,
    }
}

fn set_small(key: &str, n: u32, offered: &Params, result: &mut Params) -> bool {
    let n16 = u16::try_from(n).unwrap_or(u16::MAX);
    match key {
        "MaxConnections" => {
            result.max_connections = n16;
            n16 <= offered.max_connections
        }
        "DefaultTime2Retain" => {
            result.default_time2retain = n16;
            n16 <= offered.default_time2retain
        }
        "DefaultTime2Wait" => {
            result.default_time2wait = n16;
            n16 >= offered.default_time2wait
        }
        "MaxOutstandingR2T" => {
            result.max_outstanding_r2t = n16;
            n16 <= offered.max_outstanding_r2t
        }
        "ErrorRecoveryLevel" => {
            result.error_recovery_level = u8::try_from(n).unwrap_or(u8::MAX);
            n <= u32::from(offered.error_recovery_level)
        }
        _ => true,
    }
}

/// The operational keys an initiator offers for `p` (login operational stage).
pub fn offer(p: &Params, session: SessionType) -> Vec<(String, String)> {
    let digest = |on: bool| if on { "CRC32C,None" } else { "None" }.to_string();
    let mut v = vec![
        ("HeaderDigest".to_string(), digest(p.header_digest)),
        ("DataDigest".to_string(), digest(p.data_digest)),
        ("DefaultTime2Wait".to_string(), p.default_time2wait.to_string()),
        ("DefaultTime2Retain".to_string(), p.default_time2retain.to_string()),
        ("ErrorRecoveryLevel".to_string(), p.error_recovery_level.to_string()),
        ("MaxRecvDataSegmentLength".to_string(), p.max_recv_data_segment_length.to_string()),
    ];
    if session == SessionType::Normal {
        v.extend([
            ("MaxConnections".to_string(), p.max_connections.to_string()),
            ("InitialR2T".to_string(), yes_no(p.initial_r2t)),
            ("ImmediateData".to_string(), yes_no(p.immediate_data)),
            ("MaxBurstLength".to_string(), p.max_burst_length.to_string()),
            ("FirstBurstLength".to_string(), p.first_burst_length.to_string()),
            ("MaxOutstandingR2T".to_string(), p.max_outstanding_r2t.to_string()),
            ("DataPDUInOrder".to_string(), yes_no(p.data_pdu_in_order)),
            ("DataSequenceInOrder".to_string(), yes_no(p.data_sequence_in_order)),
        ]);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ans(key: &str, value: &str, ours: &Params) -> (Answer, Params) {
        let mut r = Params::default();
        let a = negotiate(key, value, ours, &mut r, SessionType::Normal);
        (a, r)
    }

    #[test]
    fn parses_pairs_and_rejects_malformed_text() {
        let p = parse(b"InitiatorName=iqn.x\0SessionType=Normal\0").expect("valid");
        assert_eq!(p.len(), 2);
        assert_eq!(p.first().map(|x| x.1.as_str()), Some("iqn.x"));
        assert!(matches!(parse(b"NoEquals\0"), Err(TextError::MissingEquals(_))));
        assert!(matches!(parse(b"bad key=1\0"), Err(TextError::BadKey(_))));
        assert!(matches!(parse(b"=1\0"), Err(TextError::BadKey(_))));
        assert!(matches!(parse(&[b'K', b'=', 0xff, 0]), Err(TextError::NotUtf8)));
        let long = format!("K={}\0", "v".repeat(MAX_VALUE_LEN + 1));
        assert!(matches!(parse(long.as_bytes()), Err(TextError::ValueTooLong { .. })));
        assert!(matches!(parse_unique(b"A=1\0A=2\0"), Err(TextError::Duplicate(_))));
        assert_eq!(encode(&[("A", "1"), ("B", "x")]), b"A=1\0B=x\0");
    }

    #[test]
    fn digests_pick_the_first_acceptable_value() {
        let yes = Params { header_digest: true, data_digest: true, ..Params::default() };
        let no = Params::default();
        assert_eq!(ans("HeaderDigest", "CRC32C,None", &yes).0, Answer::Value("CRC32C".into()));
        assert!(ans("HeaderDigest", "CRC32C,None", &yes).1.header_digest);
        assert_eq!(ans("HeaderDigest", "None,CRC32C", &yes).0, Answer::Value("None".into()));
        assert_eq!(ans("DataDigest", "CRC32C,None", &no).0, Answer::Value("None".into()));
        assert_eq!(ans("DataDigest", "CRC32C", &no).0, Answer::Reject);
        assert_eq!(ans("DataDigest", "Bogus,CRC32C", &yes).0, Answer::Value("CRC32C".into()));
    }

    #[test]
    fn numeric_keys_take_min_or_max_and_reject_out_of_range() {
        let ours = Params {
            max_burst_length: 1 << 20,
            first_burst_length: 65536,
            max_outstanding_r2t: 4,
            default_time2wait: 2,
            default_time2retain: 20,
            max_connections: 1,
            ..Params::default()
        };
        let cases: &[(&str, &str, Answer)] = &[
            ("MaxConnections", "8", Answer::Value("1".into())),
            ("MaxConnections", "0", Answer::Reject),
            ("MaxBurstLength", "262144", Answer::Value("262144".into())),
            ("MaxBurstLength", "16776192", Answer::Value("1048576".into())),
            ("MaxBurstLength", "511", Answer::Reject),
            ("MaxBurstLength", "16777216", Answer::Reject),
            ("FirstBurstLength", "0x40000", Answer::Value("65536".into())),
            ("FirstBurstLength", "x", Answer::Reject),
            // RFC 7143 section 6.1: a hex-constant is "0x" and hex digits
            // only; no sign.
            ("FirstBurstLength", "0x+10000", Answer::Reject),
            ("MaxBurstLength", "0x-200", Answer::Reject),
            ("DefaultTime2Wait", "0", Answer::Value("2".into())),
            ("DefaultTime2Wait", "10", Answer::Value("10".into())),
            ("DefaultTime2Wait", "3601", Answer::Reject),
            ("DefaultTime2Retain", "0", Answer::Value("0".into())),
            ("DefaultTime2Retain", "60", Answer::Value("20".into())),
            ("MaxOutstandingR2T", "16", Answer::Value("4".into())),
            ("MaxOutstandingR2T", "0", Answer::Reject),
            ("ErrorRecoveryLevel", "2", Answer::Value("0".into())),
            ("ErrorRecoveryLevel", "3", Answer::Reject),
        ];
        for (k, v, want) in cases {
            assert_eq!(&ans(k, v, &ours).0, want, "{k}={v}");
        }
    }

    #[test]
    fn boolean_keys_or_and() {
        let ours = Params { initial_r2t: false, immediate_data: true, ..Params::default() };
        assert_eq!(ans("InitialR2T", "No", &ours).0, Answer::Value("No".into()));
        assert_eq!(ans("InitialR2T", "Yes", &ours).0, Answer::Value("Yes".into()));
        assert_eq!(ans("ImmediateData", "Yes", &ours).0, Answer::Value("Yes".into()));
        assert_eq!(ans("ImmediateData", "No", &ours).0, Answer::Value("No".into()));
        let strict = Params { immediate_data: false, ..Params::default() };
        assert_eq!(ans("ImmediateData", "Yes", &strict).0, Answer::Value("No".into()));
        assert_eq!(ans("DataPDUInOrder", "No", &Params::default()).0, Answer::Value("Yes".into()));
        assert_eq!(ans("DataSequenceInOrder", "No", &Params::default()).0, Answer::Value("Yes".into()));
        assert_eq!(ans("InitialR2T", "maybe", &ours).0, Answer::Reject);
    }

    #[test]
    fn declaratives_unknown_and_discovery_irrelevant() {
        let (a, r) = ans("MaxRecvDataSegmentLength", "262144", &Params::default());
        assert_eq!((a, r.peer_max_recv_data_segment_length), (Answer::None, 262144));
        assert_eq!(ans("MaxRecvDataSegmentLength", "100", &Params::default()).0, Answer::Reject);
        assert_eq!(ans("InitiatorAlias", "host", &Params::default()).0, Answer::None);
        assert_eq!(ans("X-com.example.Foo", "1", &Params::default()).0, Answer::NotUnderstood);
        assert_eq!(ans("Bogus", "1", &Params::default()).0, Answer::NotUnderstood);
        assert_eq!(ans("IFMarker", "Yes", &Params::default()).0, Answer::Value("No".into()));
        let mut r = Params::default();
        let a = negotiate("MaxBurstLength", "4096", &Params::default(), &mut r, SessionType::Discovery);
        assert_eq!(a, Answer::Irrelevant);
        let a = negotiate("HeaderDigest", "None", &Params::default(), &mut r, SessionType::Discovery);
        assert_eq!(a, Answer::Value("None".into()));
    }

    #[test]
    fn initiator_applies_answers_and_spots_invalid_results() {
        let offered = Params { max_burst_length: 65536, ..Params::default() };
        let mut r = offered;
        assert!(apply_answer("MaxBurstLength", "32768", &offered, &mut r));
        assert_eq!(r.max_burst_length, 32768);
        assert!(!apply_answer("MaxBurstLength", "131072", &offered, &mut r));
        assert!(apply_answer("MaxRecvDataSegmentLength", "65536", &offered, &mut r));
        assert_eq!(r.peer_max_recv_data_segment_length, 65536);
        assert!(!apply_answer("HeaderDigest", "CRC32C", &offered, &mut r));
        assert!(apply_answer("InitialR2T", "Yes", &offered, &mut r));
        assert!(apply_answer("DefaultTime2Wait", "5", &offered, &mut r));
        assert_eq!(r.default_time2wait, 5);
    }
}
