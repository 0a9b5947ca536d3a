//! Pair tests: the host and target state machines wired together in memory,
//! and the target fed hostile bytes. No sockets.

use nvme_spec::{Cqe, Sqe, Status};
use nvmf_tcp::host::{HostConfig, HostConnection};
use nvmf_tcp::pdu::{self, common_header, flags, CapsuleCmd, DataHeader, Framing, PduType, TermReq};
use nvmf_tcp::target::{Event, State, TargetConfig, TargetConnection};
use nvmf_tcp::Fes;
use zerocopy::{FromBytes, IntoBytes};

mod common;
use common::{icreq_bytes, PLAIN};

type Target = TargetConnection<Vec<u8>>;

/// A trivial controller behind the target: reads return a pattern, writes
/// are kept, everything else succeeds.
#[derive(Default)]
struct Backend {
    written: Vec<(u16, Vec<u8>)>,
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 3) as u8).collect()
}

fn serve(t: &mut Target, b: &mut Backend) {
    while let Some(ev) = t.poll_event() {
        match ev {
            Event::Command { sqe, data } => {
                let cid = sqe.cid.get();
                // PSDT 01b: the Linux target refuses anything else.
                assert_eq!(sqe.flags & Sqe::PSDT_MASK, Sqe::PSDT_SGL, "PSDT of cid {cid}");
                let len = t.check_sgl(&sqe, data.as_ref().map(Vec::len)).expect("valid SGL");
                match (sqe.opcode, data) {
                    (0x02, _) => t.send_data(cid, &pattern(len as usize), Cqe::new(cid, Status::SUCCESS, 0)),
                    (0x01, Some(d)) => {
                        b.written.push((cid, d));
                        t.send_response(Cqe::new(cid, Status::SUCCESS, 0));
                    }
                    (0x01, None) => t.request_data(cid, len),
                    _ => t.send_response(Cqe::new(cid, Status::SUCCESS, 0)),
                }
            }
            Event::Data { cid, data } => {
                b.written.push((cid, data));
                t.send_response(Cqe::new(cid, Status::SUCCESS, 0));
            }
            Event::DataDigestError { cid, .. } => t.send_response(Cqe::new(cid, Status::TRANSIENT_TRANSPORT_ERROR, 0)),
            Event::HostTerminated { .. } | Event::Withdrawn { .. } => {}
            Event::CommandInInput { .. } => panic!("no input was lent"),
        }
    }
}

/// Moves bytes both ways until neither side has anything to send.
fn step(h: &mut HostConnection, t: &mut Target, b: &mut Backend) {
    for _ in 0..100 {
        let mut bytes = Vec::new();
        h.take_transmit(&mut bytes);
        let mut moved = !bytes.is_empty();
        // Feed in small pieces to exercise partial PDUs.
        for chunk in bytes.chunks(37) {
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

fn pair(hdgst: bool, ddgst: bool) -> (HostConnection, Target, Backend) {
    let mut h = HostConnection::new(HostConfig { header_digest: hdgst, data_digest: ddgst, max_in_capsule: 8192 });
    let mut t = Target::new(TargetConfig { max_h2c_data: 16384, ..Default::default() });
    let mut b = Backend::default();
    step(&mut h, &mut t, &mut b);
    assert!(h.is_ready());
    assert_eq!(t.state(), State::Ready);
    assert_eq!(t.digests(), (hdgst, ddgst));
    (h, t, b)
}

fn rw_sqe(opcode: u8, cid: u16) -> Sqe {
    let mut s = Sqe { opcode, ..Default::default() };
    s.cid = cid.into();
    s.nsid = 1.into();
    s
}

#[test]
fn reads_and_writes_round_trip_with_and_without_digests() {
    for (hd, dd) in [(false, false), (true, false), (false, true), (true, true)] {
        let (mut h, mut t, mut b) = pair(hd, dd);
        h.submit(rw_sqe(0x02, 1), Vec::new(), 65536);
        h.submit(rw_sqe(0x01, 2), pattern(4096), 0); // in-capsule
        h.submit(rw_sqe(0x01, 3), pattern(100_000), 0); // R2T, several H2CData PDUs
        step(&mut h, &mut t, &mut b);
        let mut done = Vec::new();
        while let Some(c) = h.poll_completion() {
            assert!(c.cqe.status().is_success(), "{:?}", c.cqe);
            done.push((c.cqe.cid.get(), c.data));
        }
        done.sort_by_key(|d| d.0);
        assert_eq!(done.len(), 3, "digests {hd}/{dd}");
        assert_eq!(done.first().map(|d| d.1.clone()), Some(pattern(65536)));
        assert_eq!(b.written.len(), 2);
        assert!(b.written.iter().any(|(cid, d)| *cid == 3 && *d == pattern(100_000)));
        assert!(b.written.iter().any(|(cid, d)| *cid == 2 && *d == pattern(4096)));
    }
}

/// The host reads 4 KiB (cid 9); the target serves it. What the target sent.
fn read_4k(h: &mut HostConnection, t: &mut Target, b: &mut Backend) -> Vec<u8> {
    h.submit(rw_sqe(0x02, 9), Vec::new(), 4096);
    let mut bytes = Vec::new();
    h.take_transmit(&mut bytes);
    t.handle_input(&bytes).expect("valid");
    serve(t, b);
    let mut back = Vec::new();
    t.take_transmit(&mut back);
    back
}

#[test]
fn completes_read_with_success_flag_when_sq_flow_disabled() {
    let (mut h, mut t, mut b) = pair(false, false);
    t.set_queue(1, 127, true);
    let back = read_4k(&mut h, &mut t, &mut b);
    // One C2HData PDU with LAST|SUCCESS and no response capsule.
    let ch = pdu::CommonHeader::read_from_bytes(back.get(..8).expect("header")).expect("ch");
    assert_eq!(ch.pdu_type, PduType::C2H_DATA.0);
    assert_eq!(ch.flags & (flags::LAST_PDU | flags::SUCCESS), flags::LAST_PDU | flags::SUCCESS);
    assert_eq!(back.len(), ch.plen.get() as usize);
    h.handle_input(&back).expect("valid");
    assert!(h.poll_completion().expect("done").cqe.status().is_success());
}

#[test]
fn sends_a_response_capsule_after_data_when_sq_flow_control_is_on() {
    let (mut h, mut t, mut b) = pair(false, false);
    t.set_queue(1, 127, false);
    let back = read_4k(&mut h, &mut t, &mut b);
    let ch = pdu::CommonHeader::read_from_bytes(back.get(..8).expect("header")).expect("ch");
    assert_eq!(ch.flags & flags::SUCCESS, 0);
    let resp_at = ch.plen.get() as usize;
    assert_eq!(back.get(resp_at), Some(&PduType::CAPSULE_RESP.0));
    let sqhd = u16::from_le_bytes([back[resp_at + 8 + 8], back[resp_at + 8 + 9]]);
    assert_eq!(sqhd, 1, "SQHD advanced past the one capsule");
}

/// Feeds raw bytes to a ready target and returns the C2HTermReq it sent.
fn term_after(t: &mut Target, bytes: &[u8]) -> TermReq {
    let err = t.handle_input(bytes).expect_err("fatal");
    assert_eq!(t.state(), State::Terminated);
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    let term = TermReq::read_from_bytes(out.get(..24).expect("term header")).expect("term");
    assert_eq!(term.ch.pdu_type, PduType::C2H_TERM_REQ.0);
    assert_eq!(term.fes.get(), err.fes.0);
    assert_eq!(term.fei.get(), err.fei);
    assert!(term.ch.plen.get() as usize <= 152, "C2HTermReq plen at most 152");
    assert!(!err.reason.is_empty());
    term
}

/// As [`term_after`], with the error's log line.
fn term_and_log(t: &mut Target, bytes: &[u8]) -> (TermReq, String) {
    let log = t.handle_input(bytes).expect_err("fatal").to_string();
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    let term = TermReq::read_from_bytes(out.get(..24).expect("term header")).expect("term");
    assert_eq!(term.ch.pdu_type, PduType::C2H_TERM_REQ.0);
    (term, log)
}

fn capsule(framing: Framing, data: &[u8], sgl_len: u32) -> Vec<u8> {
    let mut sqe = rw_sqe(0x01, 4);
    sqe.dptr = nvme_spec::Sgl::in_capsule(sgl_len);
    let cmd = CapsuleCmd { ch: common_header(PduType::CAPSULE_CMD, 0), sqe };
    let mut out = Vec::new();
    pdu::encode(&mut out, cmd.as_bytes(), data, framing);
    out
}

#[test]
fn in_capsule_data_is_for_commands_that_take_host_data() {
    let (_h, t, _b) = pair(false, false);
    let mut sqe = rw_sqe(0x01, 4);
    sqe.dptr = nvme_spec::Sgl::in_capsule(512);
    assert_eq!(t.check_sgl(&sqe, Some(512)), Ok(512), "a Write");
    sqe.opcode = 0x02;
    assert_eq!(t.check_sgl(&sqe, Some(512)), Err(Status::INVALID_FIELD.dnr()), "a Read with data in its capsule");
    // Fabrics: FCTYPE bit 0 says the direction (Connect 01h takes data).
    sqe.opcode = 0x7f;
    sqe.nsid = 0x01.into();
    assert_eq!(t.check_sgl(&sqe, Some(512)), Ok(512), "Connect");
    sqe.nsid = 0x04.into();
    assert_eq!(t.check_sgl(&sqe, Some(512)), Err(Status::INVALID_FIELD.dnr()), "Property Get");
}

#[test]
fn rejects_unknown_pdu_type_with_invalid_header_field() {
    let (_h, mut t, _b) = pair(false, false);
    let mut bytes = capsule(PLAIN, &[], 0);
    bytes[0] = 0x0b;
    let term = term_after(&mut t, &bytes);
    assert_eq!((term.fes.get(), term.fei.get()), (Fes::INVALID_HEADER_FIELD.0, 0));
}

/// After its C2HTermReq the target sends nothing more: answers of commands
/// that were still running when the connection failed are dropped.
#[test]
fn nothing_follows_the_c2h_term_req() {
    let (_h, mut t, _b) = pair(false, false);
    let mut bytes = capsule(PLAIN, &[], 0);
    bytes[0] = 0x0b;
    let term = term_after(&mut t, &bytes);
    assert_eq!(term.fes.get(), Fes::INVALID_HEADER_FIELD.0);
    t.send_response(Cqe::new(1, Status::SUCCESS, 0));
    t.send_data(2, &[7; 512], Cqe::new(2, Status::SUCCESS, 0));
    assert!(t.send_zeros(3, 4096, Cqe::new(3, Status::SUCCESS, 0)), "taken (and dropped)");
    assert!(t.send_data_with(4, 512, Cqe::new(4, Status::SUCCESS, 0), |_| true), "taken (and dropped)");
    t.request_data(5, 4096);
    assert_eq!(t.transmit_len(), 0, "a PDU was queued after the C2HTermReq");
}

#[test]
fn rejects_inconsistent_hlen_pdo_and_plen() {
    for (field, value, fei) in [(2usize, 24u8, 2u32), (3, 8, 3), (4, 60, 4)] {
        let (_h, mut t, _b) = pair(false, false);
        let mut bytes = capsule(PLAIN, &[1, 2, 3, 4], 4);
        bytes[field] = value;
        let term = term_after(&mut t, &bytes);
        assert_eq!((term.fes.get(), term.fei.get()), (Fes::INVALID_HEADER_FIELD.0, fei), "field {field}");
    }
}

#[test]
fn rejects_plen_beyond_the_in_capsule_limit() {
    let (_h, mut t, _b) = pair(false, false);
    let big = vec![0u8; 8192 + 16];
    let term = term_after(&mut t, &capsule(PLAIN, &big, big.len() as u32));
    // FEI is reserved for this FES: 0.
    assert_eq!((term.fes.get(), term.fei.get()), (Fes::DATA_LIMIT_EXCEEDED.0, 0));
}

/// A target of `cfg` that took a plain ICReq.
fn ready(cfg: TargetConfig) -> Target {
    let mut t = Target::new(cfg);
    t.handle_input(&icreq(|_| {})).expect("icreq");
    t.take_transmit(&mut Vec::new());
    assert_eq!(t.state(), State::Ready);
    t
}

/// A plain ICReq as `edit` leaves its bytes (PLEN is set before `edit`
/// runs).
fn icreq(edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut bytes = icreq_bytes(|_| {});
    edit(&mut bytes);
    bytes
}

/// The admin queue (and a queue not yet connected, whose Connect may carry
/// 1 KiB) takes 8 KiB of in-capsule data (TP 8000: the admin queue's fixed
/// capsule size); an I/O queue takes what IOCCSZ advertises, and no more.
#[test]
fn the_admin_queue_takes_8_kib_in_capsule_and_io_queues_their_configured_size() {
    let cfg = TargetConfig { max_in_capsule: 4096, ..Default::default() };
    let mut t = ready(cfg);
    t.set_queue(0, 31, false);
    t.handle_input(&capsule(PLAIN, &[5; 8192], 8192)).expect("8 KiB on the admin queue");
    assert!(matches!(t.poll_event(), Some(Event::Command { data: Some(d), .. }) if d.len() == 8192));

    let mut t = ready(cfg);
    t.set_queue(1, 127, false);
    t.handle_input(&capsule(PLAIN, &[5; 4096], 4096)).expect("IOCCSZ's worth on an I/O queue");
    assert!(matches!(t.poll_event(), Some(Event::Command { data: Some(d), .. }) if d.len() == 4096));
    let term = term_after(&mut t, &capsule(PLAIN, &[5; 4112], 4112));
    assert_eq!((term.fes.get(), term.fei.get()), (Fes::DATA_LIMIT_EXCEEDED.0, 0));

    // I/O queues sized beyond 8 KiB do not make the admin queue take more.
    let cfg = TargetConfig { max_in_capsule: 16384, ..Default::default() };
    let mut t = ready(cfg);
    let err = t.handle_input(&capsule(PLAIN, &[5; 8192 + 16], 8192 + 16)).expect_err("beyond 8 KiB before Connect");
    assert_eq!(err.fes, Fes::DATA_LIMIT_EXCEEDED);
    assert!(err.reason.contains("plen"), "the log names the field: {}", err.reason);
    let mut t = ready(cfg);
    t.set_queue(2, 127, false);
    t.handle_input(&capsule(PLAIN, &[5; 16384], 16384)).expect("16 KiB on an I/O queue");
}

#[test]
fn an_icreq_whose_plen_is_not_128_is_an_invalid_plen() {
    for plen in [127u32, 132, 4096, u32::MAX] {
        let mut t = Target::new(TargetConfig::default());
        let bytes = icreq(|b| {
            b[4..8].copy_from_slice(&plen.to_le_bytes());
            b.resize(b.len() + 4, 0);
        });
        let term = term_after(&mut t, &bytes);
        assert_eq!((term.fes.get(), term.fei.get()), (Fes::INVALID_HEADER_FIELD.0, 4), "plen {plen}");
    }
}

/// HPDA above 31 and DGST bits other than HDGST_ENABLE/DDGST_ENABLE are
/// reserved values: invalid header fields, not unsupported parameters.
#[test]
fn an_icreq_with_reserved_hpda_or_dgst_values_is_an_invalid_header_field() {
    for (at, value) in [(10usize, 32u8), (10, 0xff), (11, 0x04), (11, 0x83)] {
        let mut t = Target::new(TargetConfig::default());
        let term = term_after(&mut t, &icreq(|b| b[at] = value));
        assert_eq!(
            (term.fes.get(), term.fei.get()),
            (Fes::INVALID_HEADER_FIELD.0, at as u32),
            "byte {at} = {value:#x}"
        );
    }
}

#[test]
fn rejects_header_digest_mismatch() {
    let (_h, mut t, _b) = pair(true, false);
    let mut bytes = capsule(Framing { hdgst: true, ..PLAIN }, &[], 0);
    bytes[72] ^= 0x55; // first byte of the header digest
    let term = term_after(&mut t, &bytes);
    // FEI of a Header Digest Error is the HDGST received, not an offset.
    let received = u32::from_le_bytes(bytes[72..76].try_into().expect("4 bytes"));
    assert_eq!((term.fes.get(), term.fei.get()), (Fes::HEADER_DIGEST_ERROR.0, received));
}

#[test]
fn completes_a_command_with_bad_data_digest_as_transient_transport_error() {
    let (mut h, mut t, mut b) = pair(false, true);
    let mut bytes = capsule(Framing { ddgst: true, ..PLAIN }, &[9; 512], 512);
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    t.handle_input(&bytes).expect("a data digest error is not fatal");
    assert!(matches!(t.poll_event(), Some(Event::DataDigestError { cid: 4, capsule: Some(_) })));
    // The connection keeps working.
    h.submit(rw_sqe(0x02, 5), Vec::new(), 512);
    step(&mut h, &mut t, &mut b);
    assert!(h.poll_completion().expect("read done").cqe.status().is_success());
}

fn h2c(cid: u16, ttag: u16, datao: u32, data: &[u8], last: bool) -> Vec<u8> {
    h2c_framed(cid, ttag, datao, data, last, PLAIN)
}

fn h2c_framed(cid: u16, ttag: u16, datao: u32, data: &[u8], last: bool, framing: Framing) -> Vec<u8> {
    let hdr = DataHeader {
        ch: common_header(PduType::H2C_DATA, if last { flags::LAST_PDU } else { 0 }),
        cccid: cid.into(),
        ttag: ttag.into(),
        datao: datao.into(),
        datal: (data.len() as u32).into(),
        rsvd: [0; 4],
    };
    let mut out = Vec::new();
    pdu::encode(&mut out, hdr.as_bytes(), data, framing);
    out
}

#[test]
fn an_r2t_waits_for_a_free_ttag_once_all_65536_are_taken() {
    let mut h = HostConnection::new(HostConfig { header_digest: false, data_digest: false, max_in_capsule: 8192 });
    let mut t = Target::new(TargetConfig { r2t_buffer: u32::MAX, ..Default::default() });
    step(&mut h, &mut t, &mut Backend::default());
    // A queue of more than 32K entries with its aborted transfers still
    // being drained can have every TTAG taken.
    for i in 0..=65536u32 {
        t.request_data((i & 0xffff) as u16, 4);
    }
    let mut sent = Vec::new();
    t.take_transmit(&mut sent);
    let r2ts: Vec<DataHeader> = sent.chunks(24).map(|c| DataHeader::read_from_bytes(c).expect("an R2T")).collect();
    assert_eq!(r2ts.len(), 65536, "the last R2T waits");
    let mut ttags: Vec<u16> = r2ts.iter().map(|r| r.ttag.get()).collect();
    ttags.sort_unstable();
    ttags.dedup();
    assert_eq!(ttags.len(), 65536, "no TTAG is handed out twice");
    // TTAG 9's data arrives: the waiting R2T goes out under it.
    t.handle_input(&h2c(9, 9, 0, &[1; 4], true)).expect("data");
    let mut more = Vec::new();
    t.take_transmit(&mut more);
    let r2t = DataHeader::read_from_bytes(&more[..24]).expect("the waiting R2T");
    assert_eq!((r2t.cccid.get(), r2t.ttag.get(), more.len()), (0, 9, 24));
}

#[test]
fn rejects_h2c_data_beyond_r2t_length() {
    let (_h, mut t, _b) = pair(false, false);
    t.request_data(7, 4096);
    let mut sink = Vec::new();
    t.take_transmit(&mut sink);
    let err = term_and_log(&mut t, &h2c(7, 0, 0, &[0; 8192], true));
    // FEI is reserved for Data Transfer Out of Range (0); the log names DATAL.
    assert_eq!((err.0.fes.get(), err.0.fei.get()), (Fes::DATA_OUT_OF_RANGE.0, 0));
    assert!(err.1.contains("datal"), "{}", err.1);
}

#[test]
fn rejects_h2c_data_at_an_unexpected_offset() {
    let (_h, mut t, _b) = pair(false, false);
    t.request_data(7, 8192);
    t.take_transmit(&mut Vec::new());
    let err = term_and_log(&mut t, &h2c(7, 0, 4096, &[0; 4096], true));
    assert_eq!((err.0.fes.get(), err.0.fei.get()), (Fes::DATA_OUT_OF_RANGE.0, 0));
    assert!(err.1.contains("datao"), "{}", err.1);
}

#[test]
fn rejects_h2c_data_with_unknown_ttag() {
    let (_h, mut t, _b) = pair(false, false);
    let term = term_after(&mut t, &h2c(7, 3, 0, &[0; 512], true));
    assert_eq!((term.fes.get(), term.fei.get()), (Fes::INVALID_HEADER_FIELD.0, 10));
}

#[test]
fn rejects_h2c_data_beyond_maxh2cdata() {
    let (_h, mut t, _b) = pair(false, false);
    t.request_data(7, 65536);
    t.take_transmit(&mut Vec::new());
    let term = term_after(&mut t, &h2c(7, 0, 0, &[0; 32768], true));
    assert_eq!((term.fes.get(), term.fei.get()), (Fes::DATA_LIMIT_EXCEEDED.0, 0));
}

#[test]
fn rejects_a_capsule_before_icreq_as_sequence_error() {
    let mut t = Target::new(TargetConfig::default());
    let term = term_after(&mut t, &capsule(PLAIN, &[], 0));
    assert_eq!(term.fes.get(), Fes::PDU_SEQUENCE_ERROR.0);
}

#[test]
fn rejects_icreq_with_unsupported_pfv() {
    let mut t = Target::new(TargetConfig::default());
    let bytes = icreq_bytes(|r| r.pfv = 1.into());
    let term = term_after(&mut t, &bytes);
    assert_eq!((term.fes.get(), term.fei.get()), (Fes::UNSUPPORTED_PARAMETER.0, 8));
}

#[test]
fn a_second_icreq_is_a_pdu_sequence_error() {
    // A valid PDU of a type the host sends, out of order (as SPDK's target
    // answers it; a controller-to-host type stays an invalid PDU type).
    let (_h, mut t, _b) = pair(false, false);
    let err = term_and_log(&mut t, &icreq(|_| {}));
    assert_eq!((err.0.fes.get(), err.0.fei.get()), (Fes::PDU_SEQUENCE_ERROR.0, 0));
    assert!(err.1.contains("ICReq"), "{}", err.1);
}

#[test]
fn host_terminate_request_ends_the_connection_quietly() {
    let (_h, mut t, _b) = pair(false, false);
    let term = TermReq { ch: common_header(PduType::H2C_TERM_REQ, 0), fes: 2.into(), fei: 0.into(), rsvd: [0; 10] };
    let mut bytes = Vec::new();
    pdu::encode(&mut bytes, term.as_bytes(), &[], PLAIN);
    t.handle_input(&bytes).expect("not an error");
    assert!(matches!(t.poll_event(), Some(Event::HostTerminated { fes: 2, malformed: None })));
    assert_eq!(t.state(), State::Terminated);
    assert!(!t.has_transmit(), "no C2HTermReq answers an H2CTermReq");
}

#[test]
fn honours_host_pda_for_c2h_data() {
    let h_bytes = icreq_bytes(|r| r.hpda = 7);
    let mut t = Target::new(TargetConfig::default());
    t.handle_input(&h_bytes).expect("icreq");
    let mut sink = Vec::new();
    t.take_transmit(&mut sink);
    t.send_data(1, &[5; 100], Cqe::new(1, Status::SUCCESS, 0));
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    assert_eq!(out.get(3), Some(&32), "PDO aligned to (HPDA+1)*4 = 32");
}

#[test]
fn random_bytes_never_panic() {
    // A cheap deterministic fuzz pass; cargo-fuzz targets go further.
    let mut seed: u64 = 0x1234_5678;
    for _ in 0..2000 {
        let (_h, mut t, _b) = pair(seed.is_multiple_of(2), seed.is_multiple_of(3));
        let len = (seed % 300) as usize;
        let mut bytes = Vec::with_capacity(len);
        for _ in 0..len {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            bytes.push((seed >> 33) as u8);
        }
        if let Some(b) = bytes.get_mut(0) {
            *b %= 10;
        }
        let _ = t.handle_input(&bytes);
        while t.poll_event().is_some() {}
    }
}

#[test]
fn c2h_term_req_stays_within_152_bytes_whatever_the_host_pda() {
    // Found by the target_connection fuzzer: with HPDA 31 the echoed header
    // was padded to the host's data alignment, giving PLEN 200.
    let mut t = Target::new(TargetConfig::default());
    let bytes = icreq_bytes(|r| {
        r.hpda = 31;
        r.dgst = 1
    });
    t.handle_input(&bytes).expect("icreq");
    t.take_transmit(&mut Vec::new());
    let mut bad = capsule(Framing { hdgst: true, ..PLAIN }, &[], 0);
    bad[72] ^= 1;
    let term = term_after(&mut t, &bad);
    assert_eq!(term.fes.get(), Fes::HEADER_DIGEST_ERROR.0);
    assert_eq!(term.ch.plen.get(), 24 + 72, "header plus the echoed 72-byte capsule header, unpadded");
}

#[test]
fn data_appended_by_a_fill_is_the_same_pdu_as_copied_data() {
    for (hd, dd) in [(false, false), (true, true)] {
        let (_, mut t, _) = pair(hd, dd);
        let data = pattern(4096);
        let mut copied = Vec::new();
        t.send_data(7, &data, Cqe::new(7, Status::SUCCESS, 0));
        t.take_transmit(&mut copied);
        let mut filled = Vec::new();
        assert!(t.send_data_with(7, 4096, Cqe::new(7, Status::SUCCESS, 0), |out| {
            out.extend_from_slice(&data);
            true
        }));
        t.take_transmit(&mut filled);
        assert_eq!(filled, copied, "digests {hd}/{dd}");
        // A fill that fails queues nothing, nor does one that appends too
        // few or too many bytes, nor a length beyond one PDU.
        assert!(!t.send_data_with(8, 4096, Cqe::new(8, Status::SUCCESS, 0), |_| false));
        for short_or_long in [4095, 4097] {
            assert!(!t.send_data_with(8, 4096, Cqe::new(8, Status::SUCCESS, 0), |out| {
                out.extend_zeros(short_or_long);
                true
            }));
        }
        assert!(!t.send_data_with(9, 64 << 20, Cqe::new(9, Status::SUCCESS, 0), |_| true));
        assert!(!t.has_transmit());
    }
}

#[test]
fn c2h_success_always_drops_the_response_capsule_with_sq_flow_control_on() {
    let mut h = HostConnection::new(HostConfig { header_digest: false, data_digest: false, max_in_capsule: 8192 });
    let mut t = Target::new(TargetConfig { c2h_success_always: true, ..Default::default() });
    let mut b = Backend::default();
    step(&mut h, &mut t, &mut b);
    t.set_queue(1, 127, false);
    let back = read_4k(&mut h, &mut t, &mut b);
    let ch = pdu::CommonHeader::read_from_bytes(back.get(..8).expect("header")).expect("ch");
    assert_eq!(ch.flags & (flags::LAST_PDU | flags::SUCCESS), flags::LAST_PDU | flags::SUCCESS);
    assert_eq!(back.len(), ch.plen.get() as usize, "no response capsule after the data");
    h.handle_input(&back).expect("valid");
    assert!(h.poll_completion().expect("done").cqe.status().is_success());
    // A failed read still gets its status in a response capsule.
    t.send_data(10, &[0; 512], Cqe::new(10, Status::UNRECOVERED_READ, 0));
    let mut back = Vec::new();
    t.take_transmit(&mut back);
    let ch = pdu::CommonHeader::read_from_bytes(back.get(..8).expect("header")).expect("ch");
    assert_eq!(ch.flags & flags::SUCCESS, 0);
    assert_eq!(back.get(ch.plen.get() as usize), Some(&PduType::CAPSULE_RESP.0));
}

/// R2T PDUs in `wire`: (cccid, ttag, r2tl).
fn r2ts(wire: &[u8]) -> Vec<(u16, u16, u32)> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(ch) = wire.get(at..at + 8).and_then(|b| pdu::CommonHeader::read_from_bytes(b).ok()) {
        if ch.pdu_type == PduType::R2T.0 {
            let cid = u16::from_le_bytes([wire[at + 8], wire[at + 9]]);
            let ttag = u16::from_le_bytes([wire[at + 10], wire[at + 11]]);
            let len = u32::from_le_bytes(wire[at + 16..at + 20].try_into().expect("4"));
            out.push((cid, ttag, len));
        }
        at += ch.plen.get() as usize;
    }
    out
}

#[test]
fn a_command_beyond_the_queue_size_is_a_fatal_sequence_error() {
    let (_h, mut t, _b) = pair(false, false);
    t.set_queue(1, 3, false); // four entries
    let mut four = Vec::new();
    for cid in 0..4u16 {
        let mut sqe = rw_sqe(0x02, cid);
        sqe.dptr = nvme_spec::Sgl::transport(512);
        let cmd = CapsuleCmd { ch: common_header(PduType::CAPSULE_CMD, 0), sqe };
        pdu::encode(&mut four, cmd.as_bytes(), &[], PLAIN);
    }
    t.handle_input(&four).expect("four commands fit");
    // Completing one frees its slot: a fifth fits now.
    t.send_response(Cqe::new(0, Status::SUCCESS, 0));
    t.handle_input(four.get(..72).expect("one capsule")).expect("a fifth after one completed");
    t.take_transmit(&mut Vec::new());
    let term = term_after(&mut t, four.get(..72).expect("one capsule"));
    assert_eq!(term.fes.get(), Fes::PDU_SEQUENCE_ERROR.0);
}

#[test]
fn r2ts_wait_for_buffer_room_and_follow_in_order() {
    let mut h = HostConnection::new(HostConfig { header_digest: false, data_digest: false, max_in_capsule: 8192 });
    let mut t = Target::new(TargetConfig { r2t_buffer: 16384, ..Default::default() });
    step(&mut h, &mut t, &mut Backend::default());
    for cid in 1..=3 {
        t.request_data(cid, 8192);
    }
    let mut wire = Vec::new();
    t.take_transmit(&mut wire);
    assert_eq!(r2ts(&wire), vec![(1, 0, 8192), (2, 1, 8192)], "the third waits");
    // The first transfer completes: its room goes to the third.
    t.handle_input(&h2c(1, 0, 0, &[1; 8192], true)).expect("data");
    assert!(matches!(t.poll_event(), Some(Event::Data { cid: 1, .. })));
    let mut wire = Vec::new();
    t.take_transmit(&mut wire);
    assert_eq!(r2ts(&wire), vec![(3, 0, 8192)]);
    // A transfer larger than the budget still goes when it is alone.
    let (_h, mut t, _b) = pair(false, false);
    t.request_data(9, 16 << 20);
    let mut wire = Vec::new();
    t.take_transmit(&mut wire);
    assert_eq!(r2ts(&wire), vec![(9, 0, 16 << 20)]);
}

#[test]
fn an_aborted_transfer_drops_its_late_data_and_frees_its_room() {
    let mut h = HostConnection::new(HostConfig { header_digest: false, data_digest: false, max_in_capsule: 8192 });
    let mut t = Target::new(TargetConfig { r2t_buffer: 8192, ..Default::default() });
    step(&mut h, &mut t, &mut Backend::default());
    t.set_queue(1, 3, false);
    t.request_data(1, 8192);
    t.request_data(2, 8192);
    t.request_data(3, 8192);
    let mut wire = Vec::new();
    t.take_transmit(&mut wire);
    assert_eq!(r2ts(&wire), vec![(1, 0, 8192)], "the others wait for room");
    // A waiting R2T is simply never sent.
    assert!(t.cancel_data(3));
    // Cancelling the one in flight gives its room to the next.
    assert!(t.cancel_data(1));
    let mut wire = Vec::new();
    t.take_transmit(&mut wire);
    assert_eq!(r2ts(&wire), vec![(2, 1, 8192)], "cid 2 gets the room, on a fresh TTAG");
    assert!(!t.cancel_data(1), "already cancelled");
    assert!(!t.cancel_data(9), "no such transfer");
    // The host's late data for the aborted transfer is checked and dropped.
    t.handle_input(&h2c(1, 0, 0, &[7; 4096], false)).expect("late data is no error");
    t.handle_input(&h2c(1, 0, 4096, &[7; 4096], true)).expect("late data is no error");
    assert!(t.poll_event().is_none(), "nothing of the aborted transfer is delivered");
    // Its TTAG is free again once the host sent the last of it.
    t.handle_input(&h2c(2, 1, 0, &[2; 8192], true)).expect("data");
    assert!(matches!(t.poll_event(), Some(Event::Data { cid: 2, .. })));
    t.request_data(4, 8192);
    let mut wire = Vec::new();
    t.take_transmit(&mut wire);
    assert_eq!(r2ts(&wire), vec![(4, 1, 8192)]);
    // Data beyond the aborted transfer is still a protocol error.
    assert!(t.cancel_data(4));
    let term = term_after(&mut t, &h2c(4, 1, 0, &[0; 16384], true));
    assert_eq!(term.fes.get(), Fes::DATA_OUT_OF_RANGE.0);
}

#[test]
fn no_more_aborted_transfers_are_dropped_at_once_than_the_queue_has_entries() {
    let (_h, mut t, _b) = pair(false, false);
    t.set_queue(1, 1, false); // two entries
    for cid in 0..3 {
        t.request_data(cid, 512);
    }
    assert!(t.cancel_data(0));
    assert!(t.cancel_data(1));
    assert!(!t.cancel_data(2), "a third transfer whose data would be dropped: not cancelled");
}

#[test]
fn a_withdrawn_command_is_never_delivered_and_its_answer_frees_its_slot() {
    let (_h, mut t, _b) = pair(false, false);
    t.set_queue(1, 2, false); // three entries
    let mut three = Vec::new();
    for cid in 0..3u16 {
        let mut sqe = rw_sqe(0x02, cid);
        sqe.dptr = nvme_spec::Sgl::transport(512);
        let cmd = CapsuleCmd { ch: common_header(PduType::CAPSULE_CMD, 0), sqe };
        pdu::encode(&mut three, cmd.as_bytes(), &[], PLAIN);
    }
    t.handle_input(&three).expect("three commands fit");
    assert!(matches!(t.poll_event(), Some(Event::Command { sqe, .. }) if sqe.cid.get() == 0));
    assert!(!t.withdraw_command(0), "cid 0 was delivered already");
    assert!(t.withdraw_command(2));
    assert!(!t.withdraw_command(2), "withdrawn once");
    assert!(!t.withdraw_command(7), "no such command");
    assert!(matches!(t.poll_event(), Some(Event::Command { sqe, .. }) if sqe.cid.get() == 1));
    // It keeps its place in line, as a command never to run.
    assert!(matches!(t.poll_event(), Some(Event::Withdrawn { sqe }) if sqe.cid.get() == 2));
    assert!(t.poll_event().is_none(), "the withdrawn command is not delivered");
    // Answering it (Abort Requested) frees its slot: one more command fits.
    t.send_response(Cqe::new(2, Status::ABORT_REQUESTED, 0));
    t.handle_input(three.get(..72).expect("one capsule")).expect("a fourth after the withdrawn one was answered");
}

/// Eight in-capsule writes of different lengths, their data a pattern
/// keyed by CID: the wire bytes and what each command must carry.
fn eight_writes(framing: Framing) -> (Vec<u8>, Vec<(u16, Vec<u8>)>) {
    let mut wire = Vec::new();
    let mut want = Vec::new();
    for cid in 0..8u16 {
        let data: Vec<u8> =
            (0..512 * (usize::from(cid) + 1)).map(|i| (i as u8) ^ (cid as u8).wrapping_mul(29)).collect();
        let mut sqe = rw_sqe(0x01, cid);
        sqe.dptr = nvme_spec::Sgl::in_capsule(data.len() as u32);
        let cmd = CapsuleCmd { ch: common_header(PduType::CAPSULE_CMD, 0), sqe };
        pdu::encode(&mut wire, cmd.as_bytes(), &data, framing);
        want.push((cid, data));
    }
    (wire, want)
}

#[test]
fn lent_in_capsule_data_is_the_same_data_wherever_the_input_is_cut() {
    for (hd, dd) in [(false, false), (true, true)] {
        let framing = Framing { hdgst: hd, ddgst: dd, data_align: 4 };
        let (wire, want) = eight_writes(framing);
        let mut lent_seen = 0;
        let mut owned_seen = 0;
        for cut in [1, 7, 8, 72, 73, 600, 4096, 5000, wire.len()] {
            let (_h, mut t, _b) = pair(hd, dd);
            t.set_queue(1, 127, false);
            let mut got = Vec::new();
            for (n, chunk) in wire.chunks(cut).enumerate() {
                t.handle_input_lent(chunk).expect("valid");
                // Every other input leaves its events for later: keep_input
                // must copy their data out before the input goes.
                if n % 2 == 0 {
                    while let Some(ev) = t.poll_event() {
                        match ev {
                            Event::CommandInInput { sqe, data } => {
                                lent_seen += 1;
                                got.push((sqe.cid.get(), chunk[data].to_vec()));
                            }
                            Event::Command { sqe, data } => {
                                owned_seen += 1;
                                got.push((sqe.cid.get(), data.expect("in-capsule data")));
                            }
                            _ => panic!("unexpected event"),
                        }
                    }
                }
                t.keep_input(chunk);
            }
            while let Some(ev) = t.poll_event() {
                match ev {
                    Event::Command { sqe, data } => got.push((sqe.cid.get(), data.expect("in-capsule data"))),
                    _ => panic!("only owned data may be left once the input is gone"),
                }
            }
            assert!(got == want, "cut every {cut} bytes, digests {hd}/{dd}: wrong commands or data");
        }
        assert!(lent_seen > 0 && owned_seen > 0, "both paths taken: {lent_seen} lent, {owned_seen} owned");
    }
}

#[test]
fn a_bad_pdu_after_one_completed_across_inputs_is_caught_at_its_type() {
    let (wire, _) = eight_writes(PLAIN);
    let (_h, mut t, _b) = pair(false, false);
    t.set_queue(1, 127, false);
    // Byte by byte, then the rest at once: the first capsule is completed
    // from the kept bytes, and a bad header in the next is caught there.
    for b in wire.chunks(1).take(100) {
        t.handle_input(b).expect("valid");
    }
    let mut bad = wire[100..].to_vec();
    let second = 8 + 64 + 512; // the second capsule starts here in `wire`
    bad[second - 100] = 0x7f; // its PDU type
    let err = t.handle_input(&bad).expect_err("bad type");
    assert_eq!(err.fei, pdu::offset::PDU_TYPE);
    assert!(matches!(t.poll_event(), Some(Event::Command { .. })), "the first capsule got through");
}

/// 40,000 bytes solicited from cid 5, sent as three H2CData PDUs (16 KiB,
/// 16 KiB, the rest) with PDO padding, fed `cut` bytes at a time; `spoil`
/// flips a payload byte of the second PDU after its digest was computed.
fn h2c_cut(cut: usize, dd: bool, spoil: bool) -> (Target, Vec<u8>) {
    h2c_cut_to(cut, dd, spoil, false)
}

/// As [`h2c_cut`], solicited as data the device discards when `discard`.
fn h2c_cut_to(cut: usize, dd: bool, spoil: bool, discard: bool) -> (Target, Vec<u8>) {
    let (_h, mut t, _b) = pair(false, dd);
    t.set_queue(1, 127, false);
    if discard {
        t.request_data_discarded(5, 40_000);
    } else {
        t.request_data(5, 40_000);
    }
    t.take_transmit(&mut Vec::new());
    let data: Vec<u8> = (0..40_000u32).map(|i| (i * 13 + i / 251) as u8).collect();
    let framing = Framing { hdgst: false, ddgst: dd, data_align: 32 };
    let mut wire = Vec::new();
    for (n, piece) in data.chunks(16384).enumerate() {
        let mut pdu = h2c_framed(5, 0, (n * 16384) as u32, piece, n == 2, framing);
        if spoil && n == 1 {
            pdu[40] ^= 1;
        }
        wire.extend_from_slice(&pdu);
    }
    for chunk in wire.chunks(cut) {
        t.handle_input(chunk).expect("valid");
    }
    (t, data)
}

#[test]
fn h2c_data_cut_anywhere_lands_whole_and_its_digest_is_still_checked() {
    for dd in [false, true] {
        for cut in [1, 7, 24, 31, 32, 33, 100, 4096, 16384 + 33, 1 << 20] {
            let (mut t, want) = h2c_cut(cut, dd, false);
            match t.poll_event() {
                Some(Event::Data { cid: 5, data }) => assert!(data == want, "cut {cut}, digest {dd}: data differs"),
                other => panic!("cut {cut}, digest {dd}: {other:?}"),
            }
            let (mut t, _) = h2c_cut(cut, dd, true);
            match t.poll_event() {
                Some(Event::DataDigestError { cid: 5, capsule: None }) if dd => {}
                Some(Event::Data { cid: 5, data }) if !dd => assert_eq!(data[16392], want[16392] ^ 1),
                other => panic!("cut {cut}, digest {dd}, spoiled: {other:?}"),
            }
        }
    }
}

#[test]
fn discarded_data_is_received_and_checked_but_never_copied() {
    for dd in [false, true] {
        for cut in [1, 33, 16384 + 33, 1 << 20] {
            let (mut t, _) = h2c_cut_to(cut, dd, false, true);
            match t.poll_event() {
                // A fresh buffer of the transfer's length, untouched: the
                // payload (not all zeros) was never copied into it.
                Some(Event::Data { cid: 5, data }) => {
                    assert_eq!(data.len(), 40_000);
                    assert!(data.iter().all(|&b| b == 0), "cut {cut}, digest {dd}: payload was copied");
                }
                other => panic!("cut {cut}, digest {dd}: {other:?}"),
            }
            assert!(t.poll_event().is_none());
            let (mut t, _) = h2c_cut_to(cut, dd, true, true);
            match t.poll_event() {
                Some(Event::DataDigestError { cid: 5, capsule: None }) if dd => {}
                Some(Event::Data { cid: 5, .. }) if !dd => {}
                other => panic!("cut {cut}, digest {dd}, spoiled: {other:?}"),
            }
        }
    }
}

#[test]
fn a_bad_h2c_header_is_refused_before_its_payload_arrives() {
    let (_h, mut t, _b) = pair(false, false);
    t.request_data(7, 8192);
    t.take_transmit(&mut Vec::new());
    let pdu = h2c(7, 0, 4096, &[0; 4096], true); // datao should be 0
    t.handle_input(&pdu[..20]).expect("the header is not whole yet");
    let err = t.handle_input(&pdu[20..40]).expect_err("the header is whole");
    assert_eq!((err.fes, err.fei), (Fes::DATA_OUT_OF_RANGE, 0));
    assert!(err.reason.contains("datao"), "{}", err.reason);
}

#[test]
fn zeros_sent_from_elsewhere_are_the_same_stream_as_zeros_copied() {
    for (hd, dd) in [(false, false), (true, true)] {
        for success_always in [false, true] {
            let cfg = TargetConfig { c2h_success_always: success_always, ..Default::default() };
            let mut copied = Target::new(cfg);
            let mut spliced = Target::new(cfg);
            for t in [&mut copied, &mut spliced] {
                let mut h =
                    HostConnection::new(HostConfig { header_digest: hd, data_digest: dd, max_in_capsule: 8192 });
                let mut b = Backend::default();
                step(&mut h, t, &mut b);
                t.set_queue(1, 127, false);
                t.take_transmit(&mut Vec::new());
            }
            for (cid, len) in [(1u16, 4096usize), (2, 512), (3, 131_072)] {
                copied.send_data(cid, &vec![0; len], Cqe::new(cid, Status::SUCCESS, 0));
                assert!(spliced.send_zeros(cid, len, Cqe::new(cid, Status::SUCCESS, 0)));
                spliced.send_response(Cqe::new(cid + 100, Status::SUCCESS, 0));
                copied.send_response(Cqe::new(cid + 100, Status::SUCCESS, 0));
            }
            assert_eq!(copied.transmit_len(), spliced.transmit_len());
            let mut want = vec![0xee; 3]; // bytes already in the caller's buffer
            copied.take_transmit(&mut want);
            let mut written = vec![0xee; 3];
            spliced.take_transmit(&mut written);
            assert!(written == want, "digests {hd}/{dd}: written zeros differ");
        }
    }
}

#[test]
fn zeros_taken_in_parts_go_where_the_data_belongs() {
    let (_h, mut t, _b) = pair(true, true);
    t.set_queue(1, 127, false);
    let mut copied = Vec::new();
    {
        let (_h2, mut c, _b2) = pair(true, true);
        c.set_queue(1, 127, false);
        for (cid, len) in [(1u16, 4096usize), (2, 100_000)] {
            c.send_data(cid, &vec![0; len], Cqe::new(cid, Status::SUCCESS, 0));
        }
        c.take_transmit(&mut copied);
    }
    for (cid, len) in [(1u16, 4096usize), (2, 100_000)] {
        assert!(t.send_zeros(cid, len, Cqe::new(cid, Status::SUCCESS, 0)));
    }
    let mut head = vec![7u8; 5];
    let mut parts = Vec::new();
    t.take_transmit_parts(&mut head, |at, len| parts.push((at, len)));
    assert_eq!(parts.len(), 2);
    let mut stream = Vec::new();
    let mut from = 0;
    for (at, len) in parts {
        stream.extend_from_slice(&head[from..at]);
        stream.resize(stream.len() + len, 0);
        from = at;
    }
    stream.extend_from_slice(&head[from..]);
    assert_eq!(&stream[..5], &[7; 5]);
    assert!(stream[5..] == copied[..], "spliced zeros must rebuild the copied stream");
    assert_eq!(t.transmit_len(), 0);
}

/// NVMe/TCP ports advertise that SQ flow control may be disabled (TREQ
/// bit 2, as nvmet): libnvme's connect-all then asks for it, and reads
/// are answered C2HData with SUCCESS and no response capsule
/// (`completes_read_with_success_flag_when_sq_flow_disabled`).
#[test]
fn tcp_ports_advertise_that_sq_flow_control_may_be_disabled() {
    use nvme_spec::log::discovery;
    let treq = nvmf_tcp::transport(8192).treq;
    assert_eq!(treq, discovery::TREQ_NOT_REQUIRED | discovery::TREQ_DISABLE_SQFLOW);
}

/// The PDU types in `wire`, in order.
fn pdu_types(wire: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(ch) = wire.get(at..at + 8).and_then(|b| pdu::CommonHeader::read_from_bytes(b).ok()) {
        out.push(ch.pdu_type);
        at += ch.plen.get() as usize;
    }
    assert_eq!(at, wire.len(), "whole PDUs");
    out
}

const C2H: u8 = PduType::C2H_DATA.0;
const RESP: u8 = PduType::CAPSULE_RESP.0;

/// With responses held, a batch of reads goes out as all of its data, then
/// all of its response capsules; the host completes every read, with its
/// data. Without, each read's response follows its data.
#[test]
fn held_responses_follow_the_data_of_the_whole_batch() {
    for hold in [true, false] {
        let (mut h, mut t, mut b) = pair(false, false);
        t.set_queue(1, 127, false);
        for cid in 1..=4 {
            h.submit(rw_sqe(0x02, cid), Vec::new(), 4096);
        }
        let mut bytes = Vec::new();
        h.take_transmit(&mut bytes);
        t.set_hold(hold);
        t.handle_input(&bytes).expect("valid");
        serve(&mut t, &mut b);
        let mut back = Vec::new();
        t.take_transmit(&mut back);
        let want = if hold {
            vec![C2H, C2H, C2H, C2H, RESP, RESP, RESP, RESP]
        } else {
            vec![C2H, RESP, C2H, RESP, C2H, RESP, C2H, RESP]
        };
        assert_eq!(pdu_types(&back), want, "hold {hold}");
        h.handle_input(&back).expect("valid");
        let mut done = 0;
        while let Some(c) = h.poll_completion() {
            assert!(c.cqe.status().is_success(), "{:?}", c.cqe);
            assert_eq!(c.data, pattern(4096));
            done += 1;
        }
        assert_eq!(done, 4, "hold {hold}");
        assert!(!t.has_transmit());
    }
}

/// Held responses go out once 64 KiB of data waits ahead of them: a batch
/// of 4 KiB reads in runs of 16, and a read larger than that answered
/// right after its data. Zeros (a null device's reads) count as data too.
#[test]
fn held_responses_go_out_after_64_kib_of_data() {
    let (_h, mut t, _b) = pair(false, false);
    t.set_queue(1, 127, false);
    t.set_hold(true);
    for cid in 1..=20 {
        assert!(t.send_zeros(cid, 4096, Cqe::new(cid, Status::SUCCESS, 0)));
    }
    t.send_data(21, &pattern(131_072), Cqe::new(21, Status::SUCCESS, 0));
    t.send_data(22, &pattern(4096), Cqe::new(22, Status::SUCCESS, 0));
    let mut back = Vec::new();
    t.take_transmit(&mut back);
    let mut want = [vec![C2H; 16], vec![RESP; 16], vec![C2H; 4]].concat();
    // The 128 KiB read: several C2HData PDUs (max_transfer), then the 4
    // held responses and its own.
    let big = pdu_types(&back).iter().skip(want.len()).take_while(|&&p| p == C2H).count();
    assert!(big >= 1);
    want.extend([vec![C2H; big], vec![RESP; 5], vec![C2H, RESP]].concat());
    assert_eq!(pdu_types(&back), want);
}

/// A C2HTermReq comes after the responses held so far: as without holding,
/// a read answered before the fatal error is answered in full.
#[test]
fn held_responses_go_out_before_the_c2h_term_req() {
    let (_h, mut t, _b) = pair(false, false);
    t.set_queue(1, 127, false);
    t.set_hold(true);
    t.send_data(1, &pattern(4096), Cqe::new(1, Status::SUCCESS, 0));
    assert!(t.has_transmit());
    let mut bytes = capsule(PLAIN, &[], 0);
    bytes[0] = 0x0b;
    let _ = t.handle_input(&bytes).expect_err("fatal");
    let mut back = Vec::new();
    t.take_transmit(&mut back);
    assert_eq!(pdu_types(&back), vec![C2H, RESP, PduType::C2H_TERM_REQ.0]);
}
