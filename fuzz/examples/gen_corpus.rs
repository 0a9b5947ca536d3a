//! Writes seed inputs for every fuzz target, built with the crates' own
//! encoders so they are valid PDUs / commands.
//!
//! `cargo run --example gen_corpus` writes the full set into
//! `fuzz/corpus/<target>/` (gitignored); `-- --seeds` writes the few tiny
//! ones kept in git into `fuzz/seeds/<target>/`.

use ironwire_fuzz::iscsi_peer::{self, Driver, CHAP_SECRET, CHAP_USER, INITIATOR, TARGET, TARGET_SECRET};
use ironwire_fuzz::{chunks, connect_data, connect_sqe, fabrics_sqe, pattern, SUB};
use iscsi::chap::{ChapAlgorithm, Secret};
use iscsi::host::{HostChap, HostConfig, HostConnection, MutualChap};
use iscsi::pdu::{self as ipdu, Bhs, Opcode as IOpcode, Stage};
use iwarp::mpa::{self, Frame, Kind};
use iwarp::wire::{self, Ctrl, Opcode, ReadRequest, TaggedHeader, UntaggedHeader};
use nvme_spec::queue::DataDirection;
use nvme_spec::{Cqe, Sgl, Sqe, Status};
use nvmf_rdma::host::{HostConfig as RdmaHostConfig, HostConnection as RdmaHost};
use nvmf_rdma::target::{Event as RdmaEvent, TargetConfig as RdmaTargetConfig, TargetQueue};
use nvmf_tcp::pdu::{
    self, common_header, flags, CapsuleCmd, CapsuleResp, DataHeader, Framing, IcReq, IcResp, PduType, R2t, TermReq,
};
use std::path::Path;
use zerocopy::IntoBytes;

const PLAIN: Framing = Framing { hdgst: false, ddgst: false, data_align: 4 };
const DIGESTS: Framing = Framing { hdgst: true, ddgst: true, data_align: 4 };

fn ic_req(dgst: u8) -> Vec<u8> {
    let r =
        IcReq { ch: common_header(PduType::IC_REQ, 0), pfv: 0.into(), hpda: 0, dgst, maxr2t: 0.into(), rsvd: [0; 112] };
    let mut out = Vec::new();
    pdu::encode(&mut out, r.as_bytes(), &[], PLAIN);
    out
}

fn ic_resp(dgst: u8) -> Vec<u8> {
    let r = IcResp {
        ch: common_header(PduType::IC_RESP, 0),
        pfv: 0.into(),
        cpda: 0,
        dgst,
        maxh2cdata: 4096.into(),
        rsvd: [0; 112],
    };
    let mut out = Vec::new();
    pdu::encode(&mut out, r.as_bytes(), &[], PLAIN);
    out
}

/// An SQE with a zero-length transport data block descriptor, as hosts
/// send for commands without data (the NVMe/TCP binding refuses an all-zero
/// descriptor).
fn sqe(opcode: u8, cid: u16, nsid: u32) -> Sqe {
    let mut s = Sqe { opcode, flags: Sqe::PSDT_SGL, dptr: Sgl::transport(0), ..Default::default() };
    s.cid = cid.into();
    s.nsid = nsid.into();
    s
}

fn capsule(mut s: Sqe, data: &[u8], transport_len: u32, f: Framing) -> Vec<u8> {
    s.dptr = if data.is_empty() { Sgl::transport(transport_len) } else { Sgl::in_capsule(data.len() as u32) };
    let c = CapsuleCmd { ch: common_header(PduType::CAPSULE_CMD, 0), sqe: s };
    let mut out = Vec::new();
    pdu::encode(&mut out, c.as_bytes(), data, f);
    out
}

fn data_pdu(t: PduType, cid: u16, ttag: u16, off: u32, data: &[u8], fl: u8, f: Framing) -> Vec<u8> {
    let h = DataHeader {
        ch: common_header(t, fl),
        cccid: cid.into(),
        ttag: ttag.into(),
        datao: off.into(),
        datal: (data.len() as u32).into(),
        rsvd: [0; 4],
    };
    let mut out = Vec::new();
    pdu::encode(&mut out, h.as_bytes(), data, f);
    out
}

fn r2t(cid: u16, ttag: u16, off: u32, len: u32, f: Framing) -> Vec<u8> {
    let h = R2t {
        ch: common_header(PduType::R2T, 0),
        cccid: cid.into(),
        ttag: ttag.into(),
        r2to: off.into(),
        r2tl: len.into(),
        rsvd: [0; 4],
    };
    let mut out = Vec::new();
    pdu::encode(&mut out, h.as_bytes(), &[], f);
    out
}

fn resp(cid: u16, f: Framing) -> Vec<u8> {
    let r = CapsuleResp { ch: common_header(PduType::CAPSULE_RESP, 0), cqe: Cqe::new(cid, Status::SUCCESS, 0) };
    let mut out = Vec::new();
    pdu::encode(&mut out, r.as_bytes(), &[], f);
    out
}

fn term(t: PduType, echo: &[u8]) -> Vec<u8> {
    let r = TermReq { ch: common_header(t, 0), fes: 1.into(), fei: 2.into(), rsvd: [0; 10] };
    let mut out = Vec::new();
    pdu::encode(&mut out, r.as_bytes(), echo, PLAIN);
    out
}

fn cat(prefix: &[u8], parts: &[Vec<u8>]) -> Vec<u8> {
    let mut v = prefix.to_vec();
    for p in parts {
        v.extend_from_slice(p);
    }
    v
}

type Seeds = Vec<(&'static str, Vec<u8>)>;

fn pdu_deframe(all: bool) -> Seeds {
    let aligned = Framing { data_align: 32, ..DIGESTS };
    let mut v: Seeds = vec![
        ("icreq", cat(&[0, 0], &[ic_req(3)])),
        ("capsule-incapsule-digests", cat(&[3, 2], &[capsule(sqe(1, 4, 1), &pattern(16), 0, DIGESTS)])),
        // sel 0x1f: digests, PDA 7 = 32-byte alignment.
        (
            "h2cdata-aligned",
            cat(&[0x1f, 3], &[data_pdu(PduType::H2C_DATA, 5, 0, 0, b"hello", flags::LAST_PDU, aligned)]),
        ),
        ("h2ctermreq", cat(&[0, 1], &[term(PduType::H2C_TERM_REQ, &[0x04, 0, 72, 0])])),
    ];
    if all {
        v.push(("r2t", cat(&[0, 0], &[r2t(1, 0, 0, 4096, PLAIN)])));
        v.push(("capsule-resp-hd", cat(&[1, 0], &[resp(1, Framing { hdgst: true, ..PLAIN })])));
        v.push((
            "c2hdata",
            cat(
                &[2, 3],
                &[data_pdu(
                    PduType::C2H_DATA,
                    1,
                    0,
                    0,
                    &pattern(64),
                    flags::LAST_PDU | flags::SUCCESS,
                    Framing { ddgst: true, ..PLAIN },
                )],
            ),
        ));
        v.push(("icresp", cat(&[0, 0], &[ic_resp(0)])));
    }
    v
}

fn target_connection(all: bool) -> Seeds {
    let mut v: Seeds = vec![
        ("read", cat(&[0, 0], &[ic_req(0), capsule(sqe(2, 1, 1), &[], 4096, PLAIN)])),
        ("write-incapsule-chunked", cat(&[0, 7], &[ic_req(0), capsule(sqe(1, 2, 1), &pattern(512), 0, PLAIN)])),
        (
            "write-r2t-digests",
            cat(
                &[0x10, 3],
                &[
                    ic_req(3),
                    capsule(sqe(1, 3, 1), &[], 100, DIGESTS),
                    data_pdu(PduType::H2C_DATA, 3, 0, 0, &pattern(60), 0, DIGESTS),
                    data_pdu(PduType::H2C_DATA, 3, 0, 60, &pattern(40), flags::LAST_PDU, DIGESTS),
                ],
            ),
        ),
        ("term", cat(&[0, 0], &[ic_req(0), term(PduType::H2C_TERM_REQ, &[])])),
    ];
    if all {
        v.push(("flow-disabled-read", cat(&[0x18 | 0x20, 0], &[ic_req(0), capsule(sqe(2, 9, 1), &[], 8192, PLAIN)])));
        v.push((
            "bad-ttag",
            cat(&[0, 0], &[ic_req(0), data_pdu(PduType::H2C_DATA, 3, 7, 0, b"x", flags::LAST_PDU, PLAIN)]),
        ));
        v.push((
            "cpda",
            cat(&[3, 0], &[ic_req(0), capsule(sqe(1, 2, 1), &pattern(16), 0, Framing { data_align: 16, ..PLAIN })]),
        ));
    }
    v
}

fn host_connection(all: bool) -> Seeds {
    let mut v: Seeds = vec![
        (
            "happy",
            cat(
                &[0, 0],
                &[
                    ic_resp(0),
                    data_pdu(PduType::C2H_DATA, 1, 0, 0, &pattern(64), flags::LAST_PDU | flags::SUCCESS, PLAIN),
                    resp(2, PLAIN),
                    r2t(3, 0, 0, 16384, PLAIN),
                    resp(3, PLAIN),
                ],
            ),
        ),
        (
            "digests-late",
            cat(
                &[7, 5],
                &[
                    ic_resp(3),
                    data_pdu(PduType::C2H_DATA, 1, 0, 0, &pattern(100), 0, DIGESTS),
                    data_pdu(PduType::C2H_DATA, 1, 0, 100, &pattern(100), flags::LAST_PDU, DIGESTS),
                    resp(1, DIGESTS),
                ],
            ),
        ),
        ("c2hterm", cat(&[0, 0], &[ic_resp(0), term(PduType::C2H_TERM_REQ, &[1, 2, 3, 4])])),
    ];
    if all {
        v.push(("r2t-partial", cat(&[0, 0], &[ic_resp(0), r2t(3, 9, 4096, 8192, PLAIN)])));
    }
    v
}

/// One nvmf_queue record (with bit 7 of `h`, the clock advances 10 s).
fn rec(h: u8, s: &Sqe, blob: Option<&[u8]>) -> Vec<u8> {
    let mut v = vec![h];
    if h & 0x80 != 0 {
        v.push(10);
    }
    v.extend_from_slice(s.as_bytes());
    if let Some(b) = blob {
        v.extend_from_slice(&(b.len() as u16).to_le_bytes());
        v.extend_from_slice(b);
    }
    v
}

fn nvmf_queue(all: bool) -> Seeds {
    let mut identify = sqe(0x06, 10, 0);
    identify.cdw10 = 1.into();
    identify.dptr = Sgl::transport(4096);
    let mut glp = sqe(0x02, 11, 0xffff_ffff);
    glp.cdw10 = (0x02 | (127 << 16)).into();
    glp.dptr = Sgl::transport(512);
    let mut read = sqe(0x02, 12, 1);
    read.cdw12 = 7.into();
    read.dptr = Sgl::transport(4096);
    let mut write = sqe(0x01, 13, 1);
    write.cdw10 = 8.into();
    write.dptr = Sgl::in_capsule(512);
    let mut dsm = sqe(0x09, 14, 1);
    dsm.cdw11 = 4.into();
    dsm.dptr = Sgl::in_capsule(16);
    let mut range = vec![0u8; 16];
    range[4..8].copy_from_slice(&4u32.to_le_bytes());
    range[8..16].copy_from_slice(&16u64.to_le_bytes());
    let mut nq = sqe(0x09, 15, 0);
    nq.cdw10 = 7.into();
    nq.cdw11 = 0x0003_0003.into();
    let mut prop_get = fabrics_sqe(0x04, 16);
    prop_get.cdw10 = 1.into();
    let mut disc_log = sqe(0x02, 17, 0);
    disc_log.cdw10 = (0x70 | (255 << 16)).into();
    disc_log.dptr = Sgl::transport(1024);
    let aer = sqe(0x0c, 18, 0);

    let mut v: Seeds = vec![
        ("admin-identify-log", cat(&[1], &[rec(0, &identify, None), rec(0, &glp, None), rec(0, &prop_get, None)])),
        (
            "io-read-write-dsm",
            cat(&[3], &[rec(1, &read, None), rec(0x15, &write, Some(&pattern(512))), rec(0x15, &dsm, Some(&range))]),
        ),
        // Queue 2 connects as a second admin queue (valid Connect data in
        // the capsule), enables, sets the number of queues.
        (
            "connect-in-input",
            cat(
                &[0],
                &[
                    rec(0x1a, &connect_sqe(0, 1), None),
                    rec(2, &ironwire_fuzz::cc_set_sqe(ironwire_fuzz::CC_ENABLE, 2), None),
                    rec(2, &nq, None),
                ],
            ),
        ),
        ("unconnected", cat(&[0], &[rec(0, &read, None)])),
    ];
    if all {
        v.push((
            "discovery",
            cat(
                &[0],
                &[
                    rec(0x3a, &connect_sqe(0, 1), None),
                    rec(2, &ironwire_fuzz::cc_set_sqe(ironwire_fuzz::CC_ENABLE, 2), None),
                    rec(2, &disc_log, None),
                ],
            ),
        ));
        v.push((
            "aer-keepalive",
            cat(&[1], &[rec(0, &aer, None), rec(0x80, &sqe(0x18, 19, 0), None), rec(0x80, &sqe(0x18, 20, 0), None)]),
        ));
        v.push(("io-connect-late", cat(&[1], &[rec(0x59, &connect_sqe(2, 3), None), rec(2, &read, None)])));
        // Connect data solicited (transport SGL, NeedData, data_arrived).
        let mut solicited = connect_sqe(0, 1);
        solicited.dptr = Sgl::transport(1024);
        v.push(("connect-solicited", cat(&[0], &[rec(0x0a, &solicited, None)])));
        // A write whose data comes after NeedData: 100 bytes of the input,
        // padded to the 1024 the SGL describes.
        let mut write_r2t = sqe(0x01, 21, 1);
        write_r2t.cdw10 = 16.into();
        write_r2t.cdw12 = 1.into();
        write_r2t.dptr = Sgl::transport(1024);
        v.push(("io-write-solicited", cat(&[3], &[rec(0x05, &write_r2t, Some(&pattern(100)))])));
    }
    v
}

/// An MPA request or reply (enhanced, revision 2) with IRD/ORD words and
/// 32 zero bytes of private data.
fn mpa_frame(kind: Kind, crc: bool, ird: u16, ord: u16) -> Vec<u8> {
    let flags = mpa::flags::ENHANCED | if crc { mpa::flags::CRC } else { 0 };
    let f = Frame { kind, flags, revision: 2, ird_ord: Some((ird, ord)), private_data: vec![0; 32] };
    let mut out = Vec::new();
    f.encode(&mut out);
    out
}

/// A whole Send (one FPDU) of `payload` with message sequence number `msn`.
fn iw_send(msn: u32, payload: &[u8], crc: bool) -> Vec<u8> {
    let h = UntaggedHeader {
        ulpdu_len: 0.into(),
        ctrl: Ctrl::new(Opcode::SEND, true).0.into(),
        inv_stag: 0.into(),
        qn: wire::QN_SEND.into(),
        msn: msn.into(),
        mo: 0.into(),
    };
    let mut out = Vec::new();
    wire::put_fpdu(&mut out, h.as_bytes(), payload.len(), crc, |d| d.copy_from_slice(payload));
    out
}

/// A whole tagged message (RDMA Write or Read Response) to `stag` at `to`.
fn iw_tagged(op: Opcode, stag: u32, to: u64, payload: &[u8], crc: bool) -> Vec<u8> {
    let h = TaggedHeader { ulpdu_len: 0.into(), ctrl: Ctrl::new(op, true).0.into(), stag: stag.into(), to: to.into() };
    let mut out = Vec::new();
    wire::put_fpdu(&mut out, h.as_bytes(), payload.len(), crc, |d| d.copy_from_slice(payload));
    out
}

/// An RDMA Read Request of `size` bytes of `src_stag` at `src_to`.
fn iw_read_request(msn: u32, sink_stag: u32, size: u32, src_stag: u32, src_to: u64, crc: bool) -> Vec<u8> {
    let rr = ReadRequest {
        ddp: UntaggedHeader {
            ulpdu_len: 0.into(),
            ctrl: Ctrl::new(Opcode::READ_REQUEST, true).0.into(),
            inv_stag: 0.into(),
            qn: wire::QN_READ_REQUEST.into(),
            msn: msn.into(),
            mo: 0.into(),
        },
        sink_stag: sink_stag.into(),
        sink_to: 0.into(),
        size: size.into(),
        src_stag: src_stag.into(),
        src_to: src_to.into(),
    };
    let mut out = Vec::new();
    wire::put_fpdu(&mut out, rr.as_bytes(), 0, crc, |_| {});
    out
}

/// The first chunking seed (as `iwarp_connection` cuts its input) that puts
/// a chunk boundary in `lo..=hi` of `stream`, so what follows arrives after
/// the harness acted on the events before it (accepted, registered, read).
fn seed_cutting(stream: &[u8], lo: usize, hi: usize) -> u8 {
    (1..=255u8)
        .find(|&seed| {
            let mut at = 0;
            chunks(stream, seed, 97).iter().any(|c| {
                at += c.len();
                (lo..=hi).contains(&at)
            })
        })
        .unwrap_or(0)
}

fn iwarp_connection(all: bool) -> Seeds {
    // Responder, no CRC: the request (peer IRD 128, ORD 0) and one Send of
    // 64 bytes in one chunk.
    let plain = cat(&[0, 0], &[mpa_frame(Kind::Request, false, 0x80, 0), iw_send(1, &[0; 64], false)]);
    // Responder, CRC: a Send (the harness reads 512 bytes of the peer's
    // STag 0 for it, into its first sink STag 0x8000_0001), then the Read
    // Response and a second Send, cut so the response comes after the read.
    let req = mpa_frame(Kind::Request, true, 0x80, 0);
    let send = iw_send(1, &pattern(64), true);
    let at = req.len() + send.len();
    let stream = cat(
        &[],
        &[req, send, iw_tagged(Opcode::READ_RESPONSE, 0x8000_0001, 0, &pattern(512), true), iw_send(2, b"bye!", true)],
    );
    let read_crc = cat(&[2, seed_cutting(&stream, at, at + wire::TAGGED_LEN - 1)], &[stream]);
    let mut v: Seeds = vec![("responder-send", plain), ("responder-send-read-crc", read_crc)];
    if all {
        // Initiator: the reply (IRD 4, ORD 4), then an RDMA Write into the
        // write region (STag 0x001 at 0x1000), an RDMA Read of the
        // read-only one (STag 0x102 at 0x8000) and a Send, cut after the
        // reply so the regions and receives exist.
        let rep = mpa_frame(Kind::Reply, false, 4, 4);
        let at = rep.len();
        let stream = cat(
            &[],
            &[
                rep,
                iw_tagged(Opcode::RDMA_WRITE, 0x001, 0x1000, &pattern(64), false),
                iw_read_request(1, 0x7700, 64, 0x102, 0x8000, false),
                iw_send(1, &[0; 16], false),
            ],
        );
        v.push(("initiator-write-read", cat(&[1, seed_cutting(&stream, at, at + wire::TAGGED_LEN - 1)], &[stream])));
        // Initiator: a Write into the read-only region must be refused.
        let rep = mpa_frame(Kind::Reply, true, 4, 4);
        let at = rep.len();
        let stream = cat(&[], &[rep, iw_tagged(Opcode::RDMA_WRITE, 0x102, 0x8000, &pattern(8), true)]);
        v.push((
            "initiator-write-read-only",
            cat(&[3, seed_cutting(&stream, at, at + wire::TAGGED_LEN - 1)], &[stream]),
        ));
        // Responder, small segments: the request without the enhanced bit.
        let f = Frame { kind: Kind::Request, flags: 0, revision: 1, ird_ord: None, private_data: b"x".to_vec() };
        let mut req = Vec::new();
        f.encode(&mut req);
        v.push(("responder-rev1-small", cat(&[4, 0], &[req, iw_send(1, &pattern(100), false)])));
    }
    v
}

/// Records what an NVMe/RDMA host sends (`qid` 1, 8 entries, CRC as
/// `crc`) while it runs `cmds` (SQE, write data, read length) one after
/// another against a queue answering as the `rdma_target` harness does
/// (not late): the host's bytes, and where each of its transmissions
/// after the first starts (where a chunk must begin so that the queue has
/// acted on what came before, e.g. issued the RDMA Read a Read Response
/// answers).
fn rdma_session(crc: bool, in_capsule: u32, cmds: &[(Sqe, Vec<u8>, u32)]) -> (Vec<u8>, Vec<usize>) {
    let hc = RdmaHostConfig { crc, qid: 1, entries: 8, max_in_capsule: in_capsule, ..RdmaHostConfig::default() };
    let mut h = RdmaHost::new(hc);
    let mut t = TargetQueue::<Vec<u8>>::new(RdmaTargetConfig {
        crc,
        ord: 4,
        max_in_capsule: 8192,
        max_transfer: 256 * 1024,
        max_queue_entries: 64,
        max_segment: 61440,
        read_buffer: 64 * 1024,
    });
    let (mut sent, mut starts) = (Vec::new(), Vec::new());
    let mut pump = |h: &mut RdmaHost, t: &mut TargetQueue<Vec<u8>>| {
        for _ in 0..16 {
            let mut bytes = Vec::new();
            h.take_transmit(&mut bytes);
            if bytes.is_empty() {
                return;
            }
            starts.push(sent.len());
            sent.extend_from_slice(&bytes);
            t.handle_input(&bytes).expect("the seed host is well-behaved");
            while let Some(ev) = t.poll_event() {
                match ev {
                    RdmaEvent::Command { sqe, data } => {
                        let cid = sqe.cid.get();
                        let ok = Cqe::new(cid, Status::SUCCESS, 0);
                        let len = t.check_sgl(&sqe, data.as_ref().map(Vec::len)).expect("a valid SGL");
                        match sqe.data_direction() {
                            DataDirection::HostToController if data.is_none() && len > 0 => t.request_data(cid, len),
                            DataDirection::ControllerToHost if len > 0 => t.send_data(cid, &pattern(len as usize), ok),
                            _ => t.send_response(ok),
                        }
                    }
                    RdmaEvent::Data { cid, .. } => t.send_response(Cqe::new(cid, Status::SUCCESS, 0)),
                    _ => {}
                }
            }
            let mut back = Vec::new();
            t.take_transmit(&mut back);
            h.handle_input(&back).expect("the seed queue is well-behaved");
        }
    };
    pump(&mut h, &mut t);
    assert!(h.is_ready(), "the seed queue refused the connection");
    for (sqe, write, read_len) in cmds {
        h.submit(*sqe, write.clone(), *read_len);
        pump(&mut h, &mut t);
        let (cqe, _) = h.poll_completion().expect("a completion for every seed command");
        assert_eq!(cqe.status(), Status::SUCCESS);
    }
    starts.remove(0);
    (sent, starts)
}

/// The first chunking seed (as the fuzz targets cut their input) that puts
/// a chunk boundary in each of `ranges` of `stream`.
fn seed_cutting_all(stream: &[u8], ranges: &[(usize, usize)]) -> u8 {
    (1..=255u8)
        .find(|&seed| {
            let mut ends = Vec::new();
            let mut at = 0;
            for c in chunks(stream, seed, 97) {
                at += c.len();
                ends.push(at);
            }
            ranges.iter().all(|&(lo, hi)| ends.iter().any(|e| (lo..=hi).contains(e)))
        })
        .expect("a seed cutting every range")
}

fn rdma_target(all: bool) -> Seeds {
    let mut write = sqe(0x01, 1, 1);
    write.cdw12 = 7.into();
    let mut read = sqe(0x02, 2, 1);
    read.cdw12 = 7.into();
    let flush = sqe(0x00, 3, 1);
    // No CRC: a write in the capsule, a read, a flush, in one chunk.
    let (inline, _) =
        rdma_session(false, 4096, &[(write, pattern(512), 0), (read, Vec::new(), 4096), (flush, Vec::new(), 0)]);
    let mut v: Seeds = vec![("inline-read-flush", cat(&[0x04, 0], &[inline]))];
    // CRC: a keyed write whose data the queue reads from the host, cut
    // so that the Read Response comes after the read was issued.
    let (keyed, starts) = rdma_session(true, 0, &[(write, pattern(4096), 0)]);
    let resp = starts.last().copied().unwrap_or_default();
    let seed = seed_cutting_all(&keyed, &[(resp, resp + wire::TAGGED_LEN - 1)]);
    v.push(("keyed-write-crc", cat(&[0x05, seed], &[keyed])));
    if all {
        // The same, 16 KiB received straight into the command's buffer: a
        // chunk starts inside the Read Response's payload.
        let (keyed, starts) = rdma_session(true, 0, &[(write, pattern(16384), 0)]);
        let resp = starts.last().copied().unwrap_or_default();
        let body = resp + wire::TAGGED_LEN;
        let seed = seed_cutting_all(&keyed, &[(resp, body - 1), (body, body + 8192)]);
        v.push(("keyed-write-direct", cat(&[0x25, seed], &[keyed])));
        // Late answers, a lent input and a keyed read.
        let (late, _) = rdma_session(false, 0, &[(read, Vec::new(), 8192), (flush, Vec::new(), 0)]);
        v.push(("late-lent-read", cat(&[0x50, 0], &[late])));
    }
    v
}

fn spec_decode(_all: bool) -> Seeds {
    let mut s = connect_sqe(0, 1).as_bytes().to_vec();
    s.extend_from_slice(&connect_data(0xffff, SUB));
    let mut glp = sqe(0x02, 1, 0);
    glp.cdw10 = (0x70 | (255 << 16)).into();
    glp.cdw11 = 0xffff.into();
    vec![("connect", s), ("glp", glp.as_bytes().to_vec())]
}

/// A Login Request PDU carrying `pairs` (iscsi_pdu seeds).
fn login_pdu(pairs: &[(&str, &str)], framing: ipdu::Framing) -> Vec<u8> {
    let mut b = Bhs::new(IOpcode::LOGIN_REQ);
    b.set_login_flags(true, false, Stage::SECURITY, Stage::OPERATIONAL)
        .set_isid([0x80, 1, 2, 3, 4, 5])
        .set_itt(1)
        .set_cmd_sn(1);
    let mut out = Vec::new();
    ipdu::encode(&mut out, &b, &[], &iscsi::text::encode(pairs), framing);
    out
}

fn iscsi_pdu(all: bool) -> Seeds {
    let plain = ipdu::Framing::default();
    let digests = ipdu::Framing { header_digest: true, data_digest: true, max_data_segment: 8192 };
    // A SCSI Command (READ(10) of 8 blocks) with an Extended CDB AHS.
    let mut cmd = Bhs::new(IOpcode::SCSI_CMD);
    cmd.set_flags(ipdu::flags::FINAL | ipdu::flags::READ)
        .set_itt(2)
        .set_expected_data_transfer_length(4096)
        .set_cdb(&[0x28, 0, 0, 0, 0, 0, 0, 0, 8, 0]);
    let mut with_ahs = Vec::new();
    ipdu::encode(&mut with_ahs, &cmd, &ipdu::ahs_entry(1, &[0; 7]), &[], digests);
    let login =
        [("InitiatorName", INITIATOR), ("SessionType", "Normal"), ("TargetName", TARGET), ("AuthMethod", "CHAP,None")];
    let mut v: Seeds = vec![
        ("login", cat(&[0x04], &[login_pdu(&login, plain)])),
        ("command-ahs-digests", cat(&[0x07], &[with_ahs])),
        (
            "text-operational",
            cat(
                &[0x80],
                &[iscsi::text::encode(&[
                    ("HeaderDigest", "CRC32C,None"),
                    ("MaxBurstLength", "0x40000"),
                    ("InitialR2T", "No"),
                    ("MaxRecvDataSegmentLength", "65536"),
                    ("CHAP_C", "0xab12"),
                ])],
            ),
        ),
    ];
    if all {
        v.push((
            "text-discovery",
            cat(&[0x90], &[iscsi::text::encode(&[("SendTargets", "All"), ("MaxConnections", "4")])]),
        ));
    }
    v
}

/// Records what an initiator sends while `script` drives it against the
/// fuzz harness's target of configuration `cfg` (iscsi_target seeds): the
/// seed is `[cfg, 0]` (one chunk) and those bytes.
fn iscsi_session(cfg: u8, hc: HostConfig, script: &[&dyn Fn(&mut HostConnection)]) -> Vec<u8> {
    let mut h = HostConnection::new(hc);
    let mut t = iscsi_peer::connection(cfg);
    let mut d = Driver::new(false);
    let mut sent = vec![cfg, 0];
    let mut pump = |h: &mut HostConnection| {
        for _ in 0..64 {
            let mut bytes = Vec::new();
            h.take_transmit(&mut bytes);
            if bytes.is_empty() {
                return;
            }
            sent.extend_from_slice(&bytes);
            let back = d.feed(&mut t, &bytes);
            let _ = h.handle_input(&back);
        }
    };
    pump(&mut h);
    assert!(h.is_full_feature(), "seed login failed: {:?}", h.poll_event());
    for step in script {
        step(&mut h);
        pump(&mut h);
    }
    // The fuzz target feeds the seed in one chunk: the target must see the
    // same session that way.
    let mut replay = Driver::new(false);
    replay.feed(&mut iscsi_peer::connection(cfg), sent.get(2..).unwrap_or_default());
    assert_eq!(replay.events, d.events, "seed for {cfg:#x} replays differently in one chunk");
    sent
}

fn read10(blocks: u8) -> [u8; 10] {
    [0x28, 0, 0, 0, 0, 0, 0, 0, blocks, 0]
}

fn write10(blocks: u8) -> [u8; 10] {
    [0x2a, 0, 0, 0, 0, 0, 4, 0, blocks, 0]
}

fn iscsi_target(all: bool) -> Seeds {
    let normal = || HostConfig::new(INITIATOR, Some(TARGET));
    let read = |h: &mut HostConnection| {
        h.submit(0, &read10(8), 4096, Vec::new());
    };
    let write = |h: &mut HostConnection| {
        h.submit(0, &write10(16), 0, pattern(8192));
    };
    let nop = |h: &mut HostConnection| {
        h.nop(b"ping");
    };
    let logout = |h: &mut HostConnection| {
        h.logout(0);
    };
    let abort = |h: &mut HostConnection| {
        let itt = h.submit(0, &read10(1), 512, Vec::new());
        h.task_mgmt(1, 0, itt);
    };
    let mut chap = normal();
    chap.chap = Some(HostChap {
        user: CHAP_USER.into(),
        secret: Secret::from(CHAP_SECRET),
        algorithms: vec![ChapAlgorithm::SHA256, ChapAlgorithm::MD5],
        mutual: Some(MutualChap {
            target_user: String::new(),
            target_secret: Secret::from(TARGET_SECRET),
            id: 3,
            challenge: vec![0x42; 16],
        }),
    });
    let mut v: Seeds = vec![
        ("read-write-nop-logout", iscsi_session(0, normal(), &[&read, &write, &nop, &logout])),
        // Digests, small limits, R2T for every write; the write's ITT
        // answered late so the abort races it.
        ("digests-small-r2t-abort", iscsi_session(0x1d, normal(), &[&write, &abort, &read])),
        ("chap-mutual", iscsi_session(0x02, chap, &[&read])),
        (
            "discovery",
            iscsi_session(
                0x20,
                HostConfig::new(INITIATOR, None),
                &[&|h: &mut HostConnection| {
                    h.send_targets("All");
                }],
            ),
        ),
    ];
    if all {
        v.push(("write-only", iscsi_session(0x08, normal(), &[&write, &write])));
    }
    v
}

/// One scsi_cdb record.
fn cdb_rec(h: u8, cdb: &[u8], data: Option<&[u8]>) -> Vec<u8> {
    let mut v = vec![h | if data.is_some() { 2 } else { 0 }, cdb.len() as u8];
    v.extend_from_slice(cdb);
    if let Some(d) = data {
        v.extend_from_slice(&(d.len() as u16).to_le_bytes());
        v.extend_from_slice(d);
    }
    v
}

fn scsi_cdb(all: bool) -> Seeds {
    let inquiry_vpd = [0x12, 1, 0xb0, 0, 0xff, 0];
    let read_cap16 = [0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];
    let write10 = [0x2a, 0, 0, 0, 0, 8, 0, 0, 2, 0];
    let read16 = [0x88, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 2, 0, 0];
    let caw = [0x89, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 1, 0, 0];
    let mut unmap_list = vec![0, 22, 0, 16, 0, 0, 0, 0];
    unmap_list.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 8, 0, 0, 0, 0]);
    let unmap = [0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0];
    let ws16_unmap = [0x93, 0x08, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0, 0, 16, 0, 0];
    let report_luns = [0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    let pr_out_register = [0x5f, 0, 0, 0, 0, 0, 0, 0, 24, 0];
    let mut register = vec![0u8; 24];
    register[8..16].copy_from_slice(&0x1234u64.to_be_bytes());
    let mode_sense = [0x5a, 0, 0x3f, 0, 0, 0, 0, 0x10, 0, 0];
    let mut v: Seeds = vec![
        (
            "inquiry-capacity-rw",
            cat(
                &[0],
                &[
                    cdb_rec(0, &inquiry_vpd, None),
                    cdb_rec(0, &read_cap16, None),
                    cdb_rec(0, &write10, Some(&pattern(1024))),
                    cdb_rec(1, &read16, None),
                ],
            ),
        ),
        (
            "caw-unmap-ws-4k",
            cat(
                &[1],
                &[
                    cdb_rec(4, &caw, Some(&pattern(8192))),
                    cdb_rec(4, &unmap, Some(&unmap_list)),
                    cdb_rec(0, &ws16_unmap, Some(&[0; 4096])),
                ],
            ),
        ),
        (
            "luns-pr-mode",
            cat(
                &[2],
                &[
                    cdb_rec(0, &report_luns, None),
                    cdb_rec(0x10, &[0x12, 0, 0, 0, 36, 0], None),
                    cdb_rec(0, &pr_out_register, Some(&register)),
                    cdb_rec(0x21, &mode_sense, None),
                ],
            ),
        ),
    ];
    if all {
        v.push((
            "reset-reread",
            cat(&[0], &[cdb_rec(0xc0, &[0, 0, 0, 0, 0, 0], None), cdb_rec(1, &[3, 0, 0, 0, 252, 0], None)]),
        ));
    }
    v
}

fn config(all: bool) -> Seeds {
    let mut v: Seeds = vec![
        ("example", include_str!("../../docs/examples/ironwire.toml").as_bytes().to_vec()),
        (
            "small",
            b"[[device]]\nname = \"r\"\nkind = \"ram\"\nsize = \"1MiB\"\n\n[[subsystem]]\nnqn = \"nqn.2026-11.io.ironwire:a\"\nallow_any_host = true\nnamespace = [{ nsid = 1, device = \"r\" }]\n\n[[port]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:4420\"\n\n[limits]\nconnections_per_port = 8\n\n[timeouts]\nhandshake_ms = 1000\n".to_vec(),
        ),
    ];
    if all {
        v.push(("empty", Vec::new()));
    }
    v
}

fn main() -> std::io::Result<()> {
    let seeds = std::env::args().any(|a| a == "--seeds");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(if seeds { "seeds" } else { "corpus" });
    let all = !seeds;
    let sets: [(&str, Seeds); 11] = [
        ("pdu_deframe", pdu_deframe(all)),
        ("target_connection", target_connection(all)),
        ("host_connection", host_connection(all)),
        ("nvmf_queue", nvmf_queue(all)),
        ("iwarp_connection", iwarp_connection(all)),
        ("rdma_target", rdma_target(all)),
        ("spec_decode", spec_decode(all)),
        ("iscsi_pdu", iscsi_pdu(all)),
        ("iscsi_target", iscsi_target(all)),
        ("scsi_cdb", scsi_cdb(all)),
        ("config", config(all)),
    ];
    for (target, files) in sets {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        for (name, bytes) in files {
            std::fs::write(dir.join(name), bytes)?;
        }
    }
    println!("wrote {}", root.display());
    Ok(())
}
