//! Writes seed inputs for every fuzz target, built with the crates' own
//! encoders so they are valid PDUs / commands.
//!
//! `cargo run --example gen_corpus` writes the full set into
//! `fuzz/corpus/<target>/` (gitignored); `-- --seeds` writes the few tiny
//! ones kept in git into `fuzz/seeds/<target>/`.

use ironwire_fuzz::{chunks, connect_data, connect_sqe, fabrics_sqe, pattern, SUB};
use iwarp::mpa::{self, Frame, Kind};
use iwarp::wire::{self, Ctrl, Opcode, ReadRequest, TaggedHeader, UntaggedHeader};
use nvme_spec::{Cqe, Sgl, Sqe, Status};
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
    let mut s = Sqe { opcode, dptr: Sgl::transport(0), ..Default::default() };
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

fn spec_decode(_all: bool) -> Seeds {
    let mut s = connect_sqe(0, 1).as_bytes().to_vec();
    s.extend_from_slice(&connect_data(0xffff, SUB));
    let mut glp = sqe(0x02, 1, 0);
    glp.cdw10 = (0x70 | (255 << 16)).into();
    glp.cdw11 = 0xffff.into();
    vec![("connect", s), ("glp", glp.as_bytes().to_vec())]
}

fn main() -> std::io::Result<()> {
    let seeds = std::env::args().any(|a| a == "--seeds");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(if seeds { "seeds" } else { "corpus" });
    let all = !seeds;
    let sets: [(&str, Seeds); 6] = [
        ("pdu_deframe", pdu_deframe(all)),
        ("target_connection", target_connection(all)),
        ("host_connection", host_connection(all)),
        ("nvmf_queue", nvmf_queue(all)),
        ("iwarp_connection", iwarp_connection(all)),
        ("spec_decode", spec_decode(all)),
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
