//! Two iWARP connections wired back to back: every rule of MPA, DDP and
//! RDMAP exercised through the bytes one end sends the other.

use iwarp::error::ErrorCode;
use iwarp::wire::{Ctrl, Opcode};
use iwarp::{Access, Config, Connection, DataBuffer, Event, Received, State};

#[derive(Debug, Clone, PartialEq)]
struct Buf(Vec<u8>);

impl AsRef<[u8]> for Buf {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl AsMut<[u8]> for Buf {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl DataBuffer for Buf {
    fn alloc(len: usize) -> Self {
        Buf(vec![0; len])
    }
}

type Conn = Connection<Buf>;

fn host_cfg(crc: bool) -> Config {
    Config { crc, ird: 128, ord: 0, require_reads: false, max_segment: 1424, recv_head: 16, recv_max: 16 }
}

fn target_cfg(crc: bool) -> Config {
    Config { crc, ird: 0, ord: 4, require_reads: true, max_segment: 61440, recv_head: 64, recv_max: 64 + 8192 }
}

/// Moves everything `from` has queued into `to`, `chunk` bytes at a time.
fn pump(from: &mut Conn, to: &mut Conn, chunk: usize) -> Result<usize, iwarp::Fatal> {
    let mut out = Vec::new();
    from.take_transmit(&mut out);
    for piece in out.chunks(chunk.max(1)) {
        to.handle_input(piece)?;
    }
    Ok(out.len())
}

fn events(c: &mut Conn) -> Vec<Event<Buf>> {
    std::iter::from_fn(|| c.poll_event()).collect()
}

/// An initiator (host) and responder (target), connected.
fn connected(host: Config, target: Config) -> (Conn, Conn) {
    let mut h = Conn::initiator(host, b"host private data");
    let mut t = Conn::responder(target);
    pump(&mut h, &mut t, usize::MAX).unwrap();
    match events(&mut t).as_slice() {
        [Event::ConnectRequest { private_data, ird, ord }] => {
            assert_eq!(private_data, b"host private data");
            assert_eq!((*ird, *ord), (host.ird, host.ord));
        }
        other => panic!("{other:?}"),
    }
    t.accept(b"target says yes").unwrap();
    pump(&mut t, &mut h, usize::MAX).unwrap();
    match events(&mut h).as_slice() {
        [Event::Established { private_data }] => assert_eq!(private_data, b"target says yes"),
        other => panic!("{other:?}"),
    }
    assert_eq!((h.state(), t.state()), (State::Rdma, State::Rdma));
    (h, t)
}

fn sends(evs: Vec<Event<Buf>>) -> Vec<Received<Buf>> {
    evs.into_iter()
        .map(|e| match e {
            Event::Send(r) => r,
            other => panic!("expected a Send, got {other:?}"),
        })
        .collect()
}

/// The bytes a writer would put on the wire for `take_transmit_parts`'s
/// output: `head` from byte `from` on, each splice's payload (from its
/// buffer in `bufs`, or zeros) inserted where it says.
fn wire_of_parts(head: &[u8], from: usize, splices: &[iwarp::Splice], bufs: &[Buf]) -> Vec<u8> {
    let (mut wire, mut from) = (Vec::new(), from);
    for s in splices {
        wire.extend_from_slice(&head[from..s.at]);
        if s.buf == iwarp::ZEROS {
            wire.resize(wire.len() + s.len, 0);
        } else {
            wire.extend_from_slice(&bufs[s.buf].0[s.start..s.start + s.len]);
        }
        from = s.at;
    }
    wire.extend_from_slice(&head[from..]);
    wire
}

/// The Terminate `c` queued: layer/etype byte, ecode, hdrct.
fn terminate_sent(c: &mut Conn) -> (u8, u8, u16) {
    let mut out = Vec::new();
    c.take_transmit(&mut out);
    // The Terminate is the last FPDU queued; find it by its control word.
    let at = out.windows(2).rposition(|w| w == [0x41, 0x47]).expect("a Terminate") - 2;
    let t = &out[at..];
    assert_eq!(&t[8..12], &2u32.to_be_bytes(), "queue 2");
    assert_eq!(&t[12..16], &1u32.to_be_bytes(), "MSN 1");
    (t[20], t[21], u16::from_be_bytes([t[22], t[23]]))
}

#[test]
fn handshake_negotiates_crc_when_either_end_asks() {
    for (hc, tc, want) in [(false, false, false), (true, false, true), (false, true, true), (true, true, true)] {
        let (h, t) = connected(host_cfg(hc), target_cfg(tc));
        assert_eq!((h.crc(), t.crc()), (want, want), "host {hc} target {tc}");
    }
}

#[test]
fn handshake_gives_the_target_an_ord_within_the_hosts_ird() {
    let (h, t) = connected(Config { ird: 2, ..host_cfg(false) }, target_cfg(false));
    assert_eq!(t.ord(), 2);
    assert_eq!(h.ird(), 2);
    assert_eq!(h.ord(), 0);
}

#[test]
fn target_needing_reads_rejects_a_host_that_serves_none() {
    let mut h = Conn::initiator(Config { ird: 0, ..host_cfg(false) }, b"pd");
    let mut t = Conn::responder(target_cfg(false));
    let mut out = Vec::new();
    h.take_transmit(&mut out);
    let e = t.handle_input(&out).unwrap_err();
    assert_eq!(e.code, ErrorCode::MPA_INSUFFICIENT_IRD);
    assert_eq!(t.state(), State::Closed);
    pump(&mut t, &mut h, usize::MAX).unwrap();
    assert!(matches!(events(&mut h).as_slice(), [Event::Rejected { .. }]));
    assert_eq!(h.state(), State::Closed);
}

#[test]
fn rejected_connection_carries_private_data_with_r_set() {
    let mut h = Conn::initiator(host_cfg(false), b"pd");
    let mut t = Conn::responder(target_cfg(false));
    pump(&mut h, &mut t, usize::MAX).unwrap();
    events(&mut t);
    t.reject(&[0, 0, 6, 0]);
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    assert_eq!(&out[..16], b"MPA ID Rep Frame");
    assert_eq!(out[16] & 0x20, 0x20, "R");
    assert_eq!(&out[18..20], &8u16.to_be_bytes(), "IRD/ORD words + 4 bytes");
    h.handle_input(&out).unwrap();
    match events(&mut h).as_slice() {
        [Event::Rejected { private_data }] => assert_eq!(private_data, &[0, 0, 6, 0]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_request_for_markers_is_rejected() {
    let mut t = Conn::responder(target_cfg(false));
    let mut req = b"MPA ID Req Frame".to_vec();
    req.extend_from_slice(&[0x90, 2, 0, 4, 0, 0x80, 0, 0]);
    let e = t.handle_input(&req).unwrap_err();
    assert!(e.reason.contains("markers"), "{e}");
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    assert_eq!(&out[..16], b"MPA ID Rep Frame");
    assert_eq!(out[16] & 0x20, 0x20);
}

#[test]
fn a_malformed_request_is_answered_by_closing_not_by_an_fpdu() {
    // The initiator waits for an MPA reply, not FPDUs: an invalid request
    // closes the connection at once (RFC 5044 section 8, error 4); the
    // error names MPA for the log.
    let mut t = Conn::responder(target_cfg(true));
    let e = t.handle_input(b"\x00\x00\x00\x80 an NVMe/TCP ICReq is not MPA").unwrap_err();
    assert_eq!(e.code, ErrorCode::MPA_INVALID_FRAME);
    assert_eq!(t.state(), State::Closed);
    assert_eq!(t.transmit_len(), 0, "no Terminate before the MPA reply");
    // Nothing more is read.
    t.handle_input(b"MPA ID Req Frame").unwrap();
    assert!(events(&mut t).is_empty());
}

#[test]
fn too_much_input_before_the_reply_closes_without_an_fpdu() {
    let mut h = Conn::initiator(host_cfg(false), b"pd");
    let mut t = Conn::responder(target_cfg(false));
    pump(&mut h, &mut t, usize::MAX).unwrap();
    events(&mut t);
    let e = t.handle_input(&vec![0; 300 * 1024]).unwrap_err();
    assert_eq!(e.code, ErrorCode::MPA_FPDU);
    assert_eq!(t.state(), State::Closed);
    assert_eq!(t.transmit_len(), 0, "the host still waits for the MPA reply");
}

#[test]
fn an_initiators_terminate_after_the_reply_carries_the_negotiated_crc() {
    // The responder entered full operation with CRC on when it replied;
    // the Terminate refusing its ORD is an FPDU of that stream.
    let mut h = Conn::initiator(Config { ird: 4, ..host_cfg(true) }, b"pd");
    let mut ignored = Vec::new();
    h.take_transmit(&mut ignored);
    let reply = iwarp::mpa::Frame {
        kind: iwarp::mpa::Kind::Reply,
        flags: iwarp::mpa::flags::CRC | iwarp::mpa::flags::ENHANCED,
        revision: 2,
        ird_ord: Some((0, 8)),
        private_data: Vec::new(),
    };
    let mut wire = Vec::new();
    reply.encode(&mut wire);
    assert_eq!(h.handle_input(&wire).unwrap_err().code, ErrorCode::MPA_INSUFFICIENT_IRD);
    let mut out = Vec::new();
    h.take_transmit(&mut out);
    assert_eq!(out.len(), 24 + 4, "a Terminate with no header echoed");
    assert_eq!(&out[24..], &checksum::crc32c(&out[..24]).to_le_bytes(), "the CRC field");
}

#[test]
fn a_terminate_refusing_a_reply_carries_the_crc_the_reply_asked_for() {
    // A revision 1 responder asked for CRC in its reply and runs with it:
    // the Terminate refusing that (not enhanced) reply is an FPDU of its
    // stream, CRC included, though this end did not ask for CRC.
    let mut h = Conn::initiator(host_cfg(false), b"pd");
    let mut ignored = Vec::new();
    h.take_transmit(&mut ignored);
    let reply = iwarp::mpa::Frame {
        kind: iwarp::mpa::Kind::Reply,
        flags: iwarp::mpa::flags::CRC,
        revision: 1,
        ird_ord: None,
        private_data: Vec::new(),
    };
    let mut wire = Vec::new();
    reply.encode(&mut wire);
    assert_eq!(h.handle_input(&wire).unwrap_err().code, ErrorCode::MPA_INVALID_FRAME);
    let mut out = Vec::new();
    h.take_transmit(&mut out);
    assert_eq!(out.len(), 24 + 4, "a Terminate with no header echoed");
    assert_eq!(&out[24..], &checksum::crc32c(&out[..24]).to_le_bytes(), "the CRC field");
}

#[test]
fn sends_arrive_whole_across_segments_and_byte_by_byte() {
    for crc in [false, true] {
        for chunk in [1, 7, 1500, usize::MAX] {
            let (mut h, mut t) = connected(host_cfg(crc), target_cfg(crc));
            t.post_receives(2);
            let body: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
            // The host segments at 1424 payload bytes, as siw does at MSS 1448.
            h.send(&[0xaa; 64], &body, None);
            h.send(&[0xbb; 64], &[], None);
            pump(&mut h, &mut t, chunk).unwrap();
            let got = sends(events(&mut t));
            assert_eq!(got.len(), 2);
            assert_eq!(got[0].head(), &[0xaa; 64]);
            assert_eq!(got[0].body.as_ref().unwrap().0, body, "crc {crc} chunk {chunk}");
            assert_eq!(got[1].head(), &[0xbb; 64]);
            assert!(got[1].body.is_none());
            assert_eq!(t.posted_receives(), 0);
        }
    }
}

#[test]
fn a_send_lying_whole_in_a_lent_input_is_left_there() {
    for crc in [false, true] {
        // 4182 and 4183 end inside the first FPDU's CRC (4184 bytes).
        for chunk in [1, 100, 4096, 4182, 4183, 4184, 4096 + 64 + 40, usize::MAX] {
            let (mut h, mut t) = connected(Config { max_segment: 61440, ..host_cfg(crc) }, target_cfg(crc));
            t.post_receives(3);
            let big: Vec<u8> = (0..4096u32).map(|i| (i * 11 + 5) as u8).collect();
            let small: Vec<u8> = (0..100u8).collect();
            h.send(&[0xaa; 64], &big, None);
            h.send(&[0xbb; 64], &small, None);
            h.send(&[0xcc; 64], &[], None);
            let mut wire = Vec::new();
            h.take_transmit(&mut wire);
            let mut got = Vec::new();
            for piece in wire.chunks(chunk) {
                t.handle_input_lent(piece).unwrap();
                for r in sends(events(&mut t)) {
                    let body = match (&r.body, &r.lent) {
                        (Some(b), None) => b.0.clone(),
                        (None, Some(at)) => piece[at.start as usize..at.end as usize].to_vec(),
                        (None, None) => Vec::new(),
                        (Some(_), Some(_)) => panic!("a body both copied and lent"),
                    };
                    got.push((r.head()[0], body, r.lent.is_some()));
                }
            }
            let bodies: Vec<_> = got.iter().map(|(h, b, _)| (*h, b.clone())).collect();
            let want = vec![(0xaa, big.clone()), (0xbb, small.clone()), (0xcc, Vec::new())];
            assert!(bodies == want, "crc {crc} chunk {chunk}: bodies differ");
            let lent: Vec<bool> = got.iter().map(|g| g.2).collect();
            match chunk {
                1 => assert_eq!(lent, [false; 3], "crc {crc}: nothing lies whole in one byte"),
                usize::MAX => assert_eq!(lent, [true, true, false], "crc {crc}: both bodies lie whole"),
                _ => {}
            }
        }
    }
}

#[test]
fn send_with_invalidate_invalidates_the_registered_stag() {
    let (mut h, mut t) = connected(host_cfg(true), target_cfg(true));
    let stag = h.register(Buf(vec![0; 4096]), 0x1000, Access::RemoteWrite);
    h.post_receives(1);
    t.write(stag, 0x1000, &[5; 4096]);
    t.send(&[1; 16], &[], Some(stag));
    pump(&mut t, &mut h, 100).unwrap();
    let got = sends(events(&mut h));
    assert_eq!(got[0].invalidated, Some(stag));
    assert_eq!(got[0].head(), &[1; 16]);
    assert_eq!(h.deregister(stag).unwrap().0, vec![5; 4096]);
}

#[test]
fn rdma_write_lands_at_the_tagged_offset() {
    let (mut h, mut t) = connected(host_cfg(false), Config { max_segment: 1000, ..target_cfg(false) });
    let stag = h.register(Buf(vec![0; 10000]), 0xfff0_0000, Access::RemoteWrite);
    let data: Vec<u8> = (0..6000u32).map(|i| i as u8).collect();
    assert!(t.write_with(stag, 0xfff0_0000 + 3000, data.len(), |range, out| {
        out.extend_from_slice(&data[range]);
        true
    }));
    pump(&mut t, &mut h, 333).unwrap();
    let buf = h.deregister(stag).unwrap().0;
    assert_eq!(&buf[3000..9000], &data[..]);
    assert!(buf[..3000].iter().chain(&buf[9000..]).all(|&b| b == 0));
}

#[test]
fn an_rdma_write_from_its_own_buffer_sends_the_same_bytes_without_copying_them() {
    for crc in [false, true] {
        let data: Vec<u8> = (0..7000u32).map(|i| (i * 7) as u8).collect();
        // The reference: the same writes through the transmit bytes.
        let (_, mut a) = connected(host_cfg(crc), Config { max_segment: 1000, ..target_cfg(crc) });
        a.send(&[1; 16], &[], None);
        a.write(0x42, 100, &data[..6001]);
        a.write(0x43, 0, &[]);
        a.send(&[2; 16], &[], None);
        let mut want = Vec::new();
        a.take_transmit(&mut want);
        let (_, mut b) = connected(host_cfg(crc), Config { max_segment: 1000, ..target_cfg(crc) });
        b.send(&[1; 16], &[], None);
        assert!(b.write_from(0x42, 100, Buf(data.clone()), 6001));
        assert!(b.write_from(0x43, 0, Buf(Vec::new()), 0));
        b.send(&[2; 16], &[], None);
        assert_eq!(b.transmit_len(), want.len());
        // The parts: headers, pads and CRCs in `head`, the payload in place.
        let (mut head, mut splices, mut bufs) = (vec![9u8; 5], Vec::new(), Vec::new());
        b.take_transmit_parts(&mut head, &mut bufs, |s| splices.push(s));
        assert_eq!(b.transmit_len(), 0);
        assert_eq!(splices.len(), 8, "7 FPDUs of the 6001 bytes, 1 empty");
        assert_eq!(splices.iter().map(|s| s.len).sum::<usize>(), 6001);
        assert_eq!(head.len() - 5 + 6001, want.len());
        assert_eq!(wire_of_parts(&head, 5, &splices, &bufs), want, "crc {crc}");
        // take_transmit gives the same bytes, copied.
        let (_, mut c) = connected(host_cfg(crc), Config { max_segment: 1000, ..target_cfg(crc) });
        c.send(&[1; 16], &[], None);
        c.write_from(0x42, 100, Buf(data.clone()), 6001);
        c.write_from(0x43, 0, Buf(Vec::new()), 0);
        c.send(&[2; 16], &[], None);
        let mut copied = Vec::new();
        c.take_transmit(&mut copied);
        assert_eq!(copied, want);
    }
}

#[test]
fn an_rdma_write_from_its_own_buffer_lands_at_the_peer() {
    for crc in [false, true] {
        let (mut h, mut t) = connected(host_cfg(crc), Config { max_segment: 4096, ..target_cfg(crc) });
        let stag = h.register(Buf(vec![0; 20000]), 0x1000, Access::RemoteWrite);
        let data: Vec<u8> = (0..16384u32).map(|i| (i % 249) as u8).collect();
        assert!(t.write_from(stag, 0x1000 + 8, Buf(data.clone()), 12345));
        h.post_receives(1);
        t.send(&[7; 16], &[], None);
        let (mut head, mut splices, mut bufs) = (Vec::new(), Vec::new(), Vec::new());
        t.take_transmit_parts(&mut head, &mut bufs, |s| splices.push(s));
        let wire = wire_of_parts(&head, 0, &splices, &bufs);
        for piece in wire.chunks(777) {
            h.handle_input(piece).unwrap();
        }
        assert_eq!(sends(events(&mut h)).len(), 1);
        let buf = h.deregister(stag).unwrap().0;
        assert_eq!(&buf[8..8 + 12345], &data[..12345]);
        assert!(buf[..8].iter().chain(&buf[8 + 12345..]).all(|&b| b == 0));
    }
}

#[test]
fn an_rdma_write_of_zeros_sends_the_bytes_of_zeros_written_nowhere() {
    for crc in [false, true] {
        // The reference: zeros through the transmit bytes, in FPDUs of 1000
        // bytes (the last one padded), then a Send after them.
        let (_, mut a) = connected(host_cfg(crc), Config { max_segment: 1000, ..target_cfg(crc) });
        a.write(0x42, 100, &[0; 4097]);
        a.send(&[2; 16], &[], None);
        let mut want = Vec::new();
        a.take_transmit(&mut want);
        let (_, mut b) = connected(host_cfg(crc), Config { max_segment: 1000, ..target_cfg(crc) });
        assert!(b.write_zeros(0x42, 100, 4097));
        b.send(&[2; 16], &[], None);
        assert_eq!(b.transmit_len(), want.len());
        let (mut head, mut splices, mut bufs) = (vec![9u8; 3], Vec::new(), Vec::<Buf>::new());
        b.take_transmit_parts(&mut head, &mut bufs, |s| splices.push(s));
        assert!(bufs.is_empty(), "no buffer holds zeros");
        assert_eq!(splices.len(), 5, "FPDUs of 1000, 1000, 1000, 1000 and 97 bytes");
        assert!(splices.iter().all(|s| s.buf == iwarp::ZEROS));
        assert_eq!(wire_of_parts(&head, 3, &splices, &bufs), want, "crc {crc}");
        // take_transmit writes the zeros in.
        let (_, mut c) = connected(host_cfg(crc), Config { max_segment: 1000, ..target_cfg(crc) });
        c.write_zeros(0x42, 100, 4097);
        c.send(&[2; 16], &[], None);
        let mut copied = Vec::new();
        c.take_transmit(&mut copied);
        assert_eq!(copied, want);
    }
}

#[test]
fn zeros_between_spliced_buffers_keep_every_splice_on_its_own_buffer() {
    let (_, mut a) = connected(host_cfg(true), target_cfg(true));
    a.write(0x41, 0, &[1; 3000]);
    a.write(0x42, 0, &[0; 2000]);
    a.write(0x43, 0, &[3; 1000]);
    let mut want = Vec::new();
    a.take_transmit(&mut want);
    let (_, mut b) = connected(host_cfg(true), target_cfg(true));
    assert!(b.write_from(0x41, 0, Buf(vec![1; 3000]), 3000));
    assert!(b.write_zeros(0x42, 0, 2000));
    assert!(b.write_from(0x43, 0, Buf(vec![3; 1000]), 1000));
    // Buffers already in `bufs` (another connection's) shift the indexes,
    // not the zeros'.
    let (mut head, mut splices, mut bufs) = (Vec::new(), Vec::new(), vec![Buf(vec![9; 7])]);
    b.take_transmit_parts(&mut head, &mut bufs, |s| splices.push(s));
    assert_eq!(splices.iter().map(|s| s.buf).collect::<Vec<_>>(), vec![1, iwarp::ZEROS, 2]);
    assert_eq!(wire_of_parts(&head, 0, &splices, &bufs), want);
}

#[test]
fn an_rdma_write_of_zeros_lands_at_the_peer() {
    let (mut h, mut t) = connected(host_cfg(true), Config { max_segment: 4096, ..target_cfg(true) });
    let stag = h.register(Buf(vec![0xee; 20000]), 0x1000, Access::RemoteWrite);
    assert!(t.write_zeros(stag, 0x1000 + 8, 12345));
    let mut wire = Vec::new();
    t.take_transmit(&mut wire);
    for piece in wire.chunks(777) {
        h.handle_input(piece).unwrap();
    }
    let buf = h.deregister(stag).unwrap().0;
    assert!(buf[8..8 + 12345].iter().all(|&b| b == 0), "the zeros landed");
    assert!(buf[..8].iter().chain(&buf[8 + 12345..]).all(|&b| b == 0xee), "nothing else changed");
}

#[test]
fn a_failed_fill_sends_nothing() {
    let (_h, mut t) = connected(host_cfg(false), target_cfg(false));
    let before = t.transmit_len();
    // The first segment is filled, a later one fails: nothing of the
    // message is left queued.
    assert!(!t.write_with(1, 0, 100_000, |range, out| {
        out.extend_from_slice(&vec![1; range.len()]);
        range.start == 0
    }));
    assert_eq!(t.transmit_len(), before);
    // A fill that appends too few bytes fails too.
    assert!(!t.write_with(1, 0, 100, |range, out| {
        out.extend_from_slice(&vec![1; range.len() - 1]);
        true
    }));
    assert_eq!(t.transmit_len(), before);
}

#[test]
fn rdma_reads_fetch_registered_data_in_order_within_the_ord() {
    for crc in [false, true] {
        let (mut h, mut t) = connected(Config { ird: 2, ..host_cfg(crc) }, target_cfg(crc));
        assert_eq!(t.ord(), 2);
        let src: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let stag = h.register(Buf(src.clone()), 0x10000, Access::RemoteRead);
        for i in 0..5u64 {
            t.read(i, Buf(vec![0; 8192]), stag, 0x10000 + i * 8192);
        }
        assert_eq!((t.reads_in_flight(), t.reads_waiting()), (2, 3));
        let mut done = Vec::new();
        for _ in 0..10 {
            pump(&mut t, &mut h, 4096).unwrap();
            pump(&mut h, &mut t, 999).unwrap();
            assert!(t.reads_in_flight() <= 2);
            for e in events(&mut t) {
                match e {
                    Event::ReadDone { id, buf } => done.push((id, buf)),
                    other => panic!("{other:?}"),
                }
            }
        }
        assert_eq!(done.len(), 5);
        for (n, (id, buf)) in done.into_iter().enumerate() {
            assert_eq!(id, n as u64);
            let at = n * 8192;
            assert_eq!(&buf.0[..], &src[at..at + 8192], "read {id}");
        }
    }
}

/// Feeds `wire` to `t` the way a receiver doing direct placement does: up
/// to `chunk` bytes at a time through `handle_input`, except that whenever
/// the stream's next bytes are Read Response payload, up to `direct` of them
/// are copied straight into the lent sink (standing in for a `recv` into
/// it). Returns how many payload bytes went the direct way.
fn feed_direct(t: &mut Conn, wire: &[u8], chunk: usize, direct: usize) -> usize {
    let (mut at, mut placed) = (0, 0);
    while at < wire.len() {
        let want = t.direct_len();
        if want > 0 {
            let (mut buf, off, len) = t.take_direct().expect("a sink to lend");
            assert_eq!(len, want);
            let n = len.min(direct).min(wire.len() - at);
            buf.0[off..off + n].copy_from_slice(&wire[at..at + n]);
            t.placed(buf, n).unwrap();
            at += n;
            placed += n;
        } else {
            let n = chunk.min(wire.len() - at);
            t.handle_input(&wire[at..at + n]).unwrap();
            at += n;
        }
    }
    placed
}

#[test]
fn read_response_payload_placed_directly_into_the_sink_completes_the_read() {
    for crc in [false, true] {
        for (chunk, direct) in [(64, usize::MAX), (7, 1000), (20, 3)] {
            let (mut h, mut t) = connected(Config { max_segment: 16384, ..host_cfg(crc) }, target_cfg(crc));
            let src: Vec<u8> = (0..65536u32).map(|i| (i % 253) as u8).collect();
            let stag = h.register(Buf(src.clone()), 0, Access::RemoteRead);
            t.read(1, Buf(vec![0; 40000]), stag, 100);
            t.read(2, Buf(vec![0; 5000]), stag, 50000);
            pump(&mut t, &mut h, usize::MAX).unwrap();
            let mut wire = Vec::new();
            h.take_transmit(&mut wire);
            let placed = feed_direct(&mut t, &wire, chunk, direct);
            // Headers and trailers come through handle_input; the payload
            // straight into the sink (what a first chunk already held aside).
            assert!(placed > 40000, "crc {crc} chunk {chunk}: only {placed} bytes placed directly");
            match events(&mut t).as_slice() {
                [Event::ReadDone { id: 1, buf: a }, Event::ReadDone { id: 2, buf: b }] => {
                    assert_eq!(&a.0[..], &src[100..40100]);
                    assert_eq!(&b.0[..], &src[50000..55000]);
                }
                other => panic!("{other:?}"),
            }
        }
    }
}

#[test]
fn a_directly_placed_payload_is_still_crc_checked() {
    let (mut h, mut t) = connected(host_cfg(true), target_cfg(true));
    let stag = h.register(Buf(vec![7; 8192]), 0, Access::RemoteRead);
    t.read(1, Buf(vec![0; 4096]), stag, 0);
    pump(&mut t, &mut h, usize::MAX).unwrap();
    let mut wire = Vec::new();
    h.take_transmit(&mut wire);
    // One payload byte flipped after the header.
    wire[30] ^= 0x40;
    let mut at = 0;
    let e = loop {
        if t.direct_len() > 0 {
            let (mut buf, off, len) = t.take_direct().unwrap();
            buf.0[off..off + len].copy_from_slice(&wire[at..at + len]);
            t.placed(buf, len).unwrap();
            at += len;
        } else {
            match t.handle_input(&wire[at..at + 1]) {
                Ok(()) => at += 1,
                Err(e) => break e,
            }
        }
    };
    assert_eq!(e.code, ErrorCode::MPA_CRC);
    assert!(events(&mut t).is_empty(), "no read completes");
}

#[test]
fn input_while_a_sink_is_lent_ends_the_connection() {
    let (mut h, mut t) = connected(host_cfg(false), target_cfg(false));
    let stag = h.register(Buf(vec![7; 8192]), 0, Access::RemoteRead);
    t.read(1, Buf(vec![0; 4096]), stag, 0);
    pump(&mut t, &mut h, usize::MAX).unwrap();
    let mut wire = Vec::new();
    h.take_transmit(&mut wire);
    let mut at = 0;
    while t.direct_len() == 0 {
        t.handle_input(&wire[at..at + 1]).unwrap();
        at += 1;
    }
    let lent = t.take_direct().unwrap();
    assert_eq!(t.direct_len(), 0, "nothing more to lend");
    assert!(t.take_direct().is_none());
    assert_eq!(t.handle_input(&wire[at..at + 1]).unwrap_err().code, ErrorCode::DDP_CATASTROPHIC);
    assert_eq!(t.state(), State::Closed);
    drop(lent);
}

#[test]
fn a_zero_length_read_completes() {
    let (mut h, mut t) = connected(host_cfg(false), target_cfg(false));
    let stag = h.register(Buf(vec![1; 16]), 0, Access::RemoteRead);
    t.read(9, Buf(Vec::new()), stag, 0);
    pump(&mut t, &mut h, usize::MAX).unwrap();
    pump(&mut h, &mut t, usize::MAX).unwrap();
    assert!(matches!(events(&mut t).as_slice(), [Event::ReadDone { id: 9, .. }]));
}

// ------------------------------------------------------------ bad input

/// The target's bytes, with `edit` applied, fed to the host: the error.
fn host_rejects(crc: bool, send: impl FnOnce(&mut Conn, u32), edit: impl FnOnce(&mut Vec<u8>)) -> (iwarp::Fatal, Conn) {
    let (mut h, mut t) = connected(host_cfg(crc), target_cfg(crc));
    let stag = h.register(Buf(vec![0; 4096]), 0, Access::RemoteWrite);
    h.post_receives(1);
    send(&mut t, stag);
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    edit(&mut out);
    let e = h.handle_input(&out).unwrap_err();
    assert_eq!(h.state(), State::Closed);
    (e, h)
}

#[test]
fn a_crc_error_ends_the_connection_with_an_mpa_terminate() {
    let (e, mut h) = host_rejects(true, |t, _| t.send(&[1; 16], &[], None), |b| b[25] ^= 1);
    assert_eq!(e.code, ErrorCode::MPA_CRC);
    assert_eq!(terminate_sent(&mut h).0 >> 4, 2, "LLP layer");
    assert!(events(&mut h).is_empty(), "no Send delivered");
}

#[test]
fn a_flipped_bit_anywhere_in_an_fpdu_is_caught_whole_or_in_pieces() {
    // A Send (header, 37 bytes, 3 of pad) and an RDMA Write (header, 4096
    // bytes): an FPDU that arrives whole is checked in one pass, one that
    // arrives in pieces a piece at a time; both must find every flip.
    let (mut h, _) = connected(host_cfg(true), target_cfg(true));
    h.send(&[1; 16], &[2; 21], None);
    let mut send = Vec::new();
    h.take_transmit(&mut send);
    assert_eq!(send.len(), 20 + 37 + 3 + 4);
    for chunk in [usize::MAX, 1, 7, 30] {
        for at in 0..send.len() {
            let (_, mut t) = connected(host_cfg(true), target_cfg(true));
            t.post_receives(1);
            let mut bad = send.clone();
            bad[at] ^= 0x10;
            let fed = bad.chunks(chunk.min(bad.len())).try_for_each(|p| t.handle_input(p));
            let Err(e) = fed else {
                // A longer length: the FPDU has not all arrived yet.
                assert!(at < 2 && events(&mut t).is_empty(), "flip at {at}, chunks of {chunk} accepted");
                continue;
            };
            // A flip in the length or header may be found as something
            // else first; one in the payload, pad or CRC is a CRC error.
            if at >= 20 {
                assert_eq!(e.code, ErrorCode::MPA_CRC, "flip at {at}, chunks of {chunk}: {e}");
            }
            assert_eq!(t.state(), State::Closed, "flip at {at}, chunks of {chunk}");
            assert!(events(&mut t).is_empty(), "nothing delivered: flip at {at}, chunks of {chunk}");
        }
    }
    let (mut h, mut t) = connected(host_cfg(true), target_cfg(true));
    let stag = h.register(Buf(vec![0; 4096]), 0, Access::RemoteWrite);
    t.write(stag, 0, &[7; 4096]);
    let mut write = Vec::new();
    t.take_transmit(&mut write);
    for at in [16, 17, 2000, 16 + 4095, write.len() - 1] {
        for chunk in [usize::MAX, 1000] {
            let (mut h2, _) = connected(host_cfg(true), target_cfg(true));
            let stag2 = h2.register(Buf(vec![0; 4096]), 0, Access::RemoteWrite);
            assert_eq!(stag2, stag);
            let mut bad = write.clone();
            bad[at] ^= 1;
            let e = bad.chunks(chunk.min(bad.len())).try_for_each(|p| h2.handle_input(p)).unwrap_err();
            assert_eq!(e.code, ErrorCode::MPA_CRC, "flip at {at}, chunks of {chunk}: {e}");
        }
    }
    // And unflipped, whole, it lands.
    h.handle_input(&write).unwrap();
    assert!(h.deregister(stag).unwrap().0.iter().all(|&b| b == 7));
}

#[test]
fn with_crc_off_the_field_is_zero_and_not_checked() {
    let (mut h, mut t) = connected(host_cfg(false), target_cfg(false));
    h.post_receives(1);
    t.send(&[1; 16], &[], None);
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    assert_eq!(&out[out.len() - 4..], &[0; 4]);
    let n = out.len();
    out[n - 1] = 0x55;
    h.handle_input(&out).unwrap();
    assert_eq!(sends(events(&mut h)).len(), 1);
}

#[test]
fn a_write_to_an_unknown_stag_places_nothing() {
    let (e, mut h) = host_rejects(false, |t, stag| t.write(stag ^ 0x01, 0, &[9; 64]), |_| {});
    assert_eq!(e.code, ErrorCode::DDP_TAGGED_INVALID_STAG);
    assert!(e.reason.contains("not registered"), "{e}");
    // The echo: the DDP segment length (the 14-byte tagged header and the
    // 64 bytes), then the header.
    assert_eq!(e.header.len(), 16);
    assert_eq!(&e.header[..2], &78u16.to_be_bytes(), "DDP segment length");
    let (le, ec, hdrct) = terminate_sent(&mut h);
    assert_eq!((le, ec), (0x11, 0x00));
    assert_eq!(hdrct & 0xc000, 0xc000, "M and D: the DDP header is echoed");
}

#[test]
fn a_write_past_the_region_places_nothing() {
    let (mut h, mut t) = connected(host_cfg(false), target_cfg(false));
    let stag = h.register(Buf(vec![0; 4096]), 0x1000, Access::RemoteWrite);
    t.write(stag, 0x1000 + 4000, &[9; 200]);
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    let e = h.handle_input(&out).unwrap_err();
    assert_eq!(e.code, ErrorCode::DDP_TAGGED_BASE_BOUNDS);
    assert!(e.reason.contains("outside"), "{e}");
    assert!(h.deregister(stag).unwrap().0.iter().all(|&b| b == 0));
    // Below the base, too.
    let (mut h, mut t) = connected(host_cfg(false), target_cfg(false));
    let stag = h.register(Buf(vec![0; 4096]), 0x1000, Access::RemoteWrite);
    t.write(stag, 0xfff, &[9; 2]);
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    assert_eq!(h.handle_input(&out).unwrap_err().code, ErrorCode::DDP_TAGGED_BASE_BOUNDS);
}

#[test]
fn a_write_into_a_read_only_or_invalidated_region_is_refused() {
    let (mut h, mut t) = connected(host_cfg(false), target_cfg(false));
    let stag = h.register(Buf(vec![0; 64]), 0, Access::RemoteRead);
    t.write(stag, 0, &[9; 8]);
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    assert_eq!(h.handle_input(&out).unwrap_err().code, ErrorCode::RDMAP_ACCESS_RIGHTS);

    // An invalidated STag is no longer valid (RFC 5040 section 2.1,
    // "Invalidate STag"): an invalid STag, not an access violation.
    let (mut h, mut t) = connected(host_cfg(false), target_cfg(false));
    let stag = h.register(Buf(vec![0; 64]), 0, Access::RemoteWrite);
    h.post_receives(1);
    t.send(&[0; 16], &[], Some(stag));
    t.write(stag, 0, &[9; 8]);
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    let e = h.handle_input(&out).unwrap_err();
    assert_eq!(e.code, ErrorCode::DDP_TAGGED_INVALID_STAG);
    assert!(e.reason.contains("invalidated"), "{e}");
    assert!(h.deregister(stag).unwrap().0.iter().all(|&b| b == 0));
}

#[test]
fn a_read_request_from_an_invalidated_region_is_an_invalid_stag() {
    let (mut h, mut t) = connected(host_cfg(false), target_cfg(false));
    let stag = h.register(Buf(vec![3; 64]), 0, Access::RemoteRead);
    h.post_receives(1);
    t.send(&[0; 16], &[], Some(stag));
    t.read(1, Buf(vec![0; 8]), stag, 0);
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    let e = h.handle_input(&out).unwrap_err();
    assert_eq!(e.code, ErrorCode::RDMAP_INVALID_STAG);
    assert!(e.reason.contains("invalidated"), "{e}");
}

#[test]
fn an_out_of_order_msn_is_a_ddp_error() {
    // Two Sends; the first one's MSN rewritten to 2.
    let (e, _) = host_rejects(
        false,
        |t, _| {
            t.send(&[1; 16], &[], None);
        },
        |b| b[15] = 2,
    );
    assert_eq!(e.code, ErrorCode::DDP_UNTAGGED_MSN_RANGE);
    assert!(e.reason.contains("MSN 2 (expected 1)"), "{e}");
}

#[test]
fn a_wrong_message_offset_is_a_ddp_error() {
    let (e, _) = host_rejects(false, |t, _| t.send(&[1; 16], &[], None), |b| b[19] = 4);
    assert_eq!(e.code, ErrorCode::DDP_UNTAGGED_INVALID_MO);
}

/// Where each FPDU of `wire` (CRC off, no markers) starts.
fn fpdu_starts(wire: &[u8]) -> Vec<usize> {
    let mut at = 0;
    let mut starts = Vec::new();
    while at + 2 <= wire.len() {
        starts.push(at);
        let len = usize::from(u16::from_be_bytes([wire[at], wire[at + 1]]));
        at += 2 + len + (4 - (2 + len) % 4) % 4 + 4;
    }
    starts
}

#[test]
fn a_send_whose_opcode_or_invalidate_stag_changes_between_segments_is_refused() {
    // A 5000-byte Send in four segments; the second one's opcode made Send
    // with Solicited Event, or (a Send with Invalidate) its STag changed.
    for (inv, edit) in [(None, 0usize), (Some(0x1234u32), 1)] {
        let (mut h, mut t) = connected(host_cfg(false), target_cfg(false));
        t.post_receives(1);
        h.send(&[0xaa; 64], &[7; 5000], inv);
        let mut out = Vec::new();
        h.take_transmit(&mut out);
        let starts = fpdu_starts(&out);
        assert_eq!(starts.len(), 4, "{starts:?}");
        let second = starts[1];
        if edit == 0 {
            out[second + 3] = (out[second + 3] & 0xf0) | 0x5;
        } else {
            out[second + 6] ^= 0xff;
        }
        let e = t.handle_input(&out).unwrap_err();
        assert_eq!(e.code, ErrorCode::RDMAP_OPCODE, "{e}");
        assert!(e.reason.contains("MSN 1 segment at offset 1424"), "{e}");
        assert!(sends(events(&mut t)).is_empty(), "nothing delivered");
    }
}

#[test]
fn a_send_larger_than_the_posted_receive_is_refused() {
    let (e, _) = host_rejects(false, |t, _| t.send(&[1; 16], &[2; 8], None), |_| {});
    assert_eq!(e.code, ErrorCode::DDP_UNTAGGED_TOO_LONG);
}

#[test]
fn a_send_with_no_receive_posted_is_refused() {
    let (mut h, mut t) = connected(host_cfg(false), target_cfg(false));
    h.post_receives(1);
    t.send(&[1; 16], &[], None);
    t.send(&[2; 16], &[], None);
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    let e = h.handle_input(&out).unwrap_err();
    assert_eq!(e.code, ErrorCode::DDP_UNTAGGED_NO_BUFFER);
    assert_eq!(sends(events(&mut h)).len(), 1, "the first Send was delivered");
}

#[test]
fn a_read_response_nobody_asked_for_is_refused() {
    let (mut h, mut t) = connected(host_cfg(false), target_cfg(false));
    // The host answers reads; make one up by hand: a Read Response FPDU.
    let mut fpdu = Vec::new();
    let hdr = [0u8, 0, 0xc1, 0x42, 0x80, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
    iwarp::wire::put_fpdu(&mut fpdu, &hdr, 8, false, |d| d.fill(7));
    let e = t.handle_input(&fpdu).unwrap_err();
    assert_eq!(e.code, ErrorCode::RDMAP_CATASTROPHIC_STREAM);
    let _ = h.poll_event();
}

#[test]
fn a_read_response_beyond_the_sink_is_refused_before_placement() {
    let (mut h, mut t) = connected(host_cfg(false), target_cfg(false));
    let stag = h.register(Buf(vec![3; 100]), 0, Access::RemoteRead);
    t.read(1, Buf(vec![0; 10]), stag, 0);
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    // Ask the host for 100 bytes instead of 10: the response overflows the sink.
    let size_at = out.len() - 4 - 16;
    out[size_at..size_at + 4].copy_from_slice(&100u32.to_be_bytes());
    h.handle_input(&out).unwrap();
    let mut resp = Vec::new();
    h.take_transmit(&mut resp);
    let e = t.handle_input(&resp).unwrap_err();
    assert_eq!(e.code, ErrorCode::DDP_TAGGED_BASE_BOUNDS);
}

#[test]
fn a_read_request_to_an_end_with_no_ird_is_refused() {
    // The target serves no reads (IRD 0); the host issues one anyway.
    let (mut h, mut t) = connected(host_cfg(false), target_cfg(false));
    h.read(1, Buf(vec![0; 8]), 0x100, 0);
    let mut out = Vec::new();
    h.take_transmit(&mut out);
    assert_eq!(t.handle_input(&out).unwrap_err().code, ErrorCode::RDMAP_CATASTROPHIC_STREAM);
}

#[test]
fn unknown_opcode_and_versions_are_named() {
    let (e, _) = host_rejects(false, |t, _| t.send(&[1; 16], &[], None), |b| b[3] = 0x48);
    assert_eq!(e.code, ErrorCode::RDMAP_OPCODE);
    assert!(e.reason.contains("opcode 8"), "{e}");
    assert!(e.header.is_empty(), "a header of unknown length is not echoed");
    let (e, _) = host_rejects(false, |t, _| t.send(&[1; 16], &[], None), |b| b[2] = 0x42);
    assert_eq!(e.code, ErrorCode::DDP_UNTAGGED_VERSION);
    let (e, _) = host_rejects(false, |t, _| t.send(&[1; 16], &[], None), |b| b[3] = 0x83);
    assert_eq!(e.code, ErrorCode::RDMAP_VERSION);
    let (e, _) = host_rejects(false, |t, _| t.send(&[1; 16], &[], None), |b| b[2] |= 0x80);
    assert_eq!(e.code, ErrorCode::RDMAP_OPCODE, "tagged bit on a Send");
}

#[test]
fn versions_are_checked_before_the_opcode() {
    // RFC 5041 section 4.2 and RFC 5040 section 4.2: the versions say how
    // the rest of the header reads, so a wrong one is named even when the
    // opcode is unknown too.
    let (e, _) = host_rejects(false, |t, _| t.send(&[1; 16], &[], None), |b| b[3] = 0x88);
    assert_eq!(e.code, ErrorCode::RDMAP_VERSION, "{e}");
    let (e, _) = host_rejects(false, |t, _| t.send(&[1; 16], &[], None), |b| (b[2], b[3]) = (0x42, 0x48));
    assert_eq!(e.code, ErrorCode::DDP_UNTAGGED_VERSION, "{e}");
    let (e, _) = host_rejects(false, |t, _| t.send(&[1; 16], &[], None), |b| (b[2], b[3]) = (0xc2, 0x48));
    assert_eq!(e.code, ErrorCode::DDP_TAGGED_VERSION, "{e}");
    assert!(e.header.is_empty());
}

/// The Terminate `c` queued, whole (CRC field excluded).
fn terminate_bytes(c: &mut Conn) -> Vec<u8> {
    let mut out = Vec::new();
    c.take_transmit(&mut out);
    let at = out.windows(2).rposition(|w| w == [0x41, 0x47]).expect("a Terminate") - 2;
    let len = u16::from_be_bytes([out[at], out[at + 1]]) as usize;
    out[at..at + 2 + len].to_vec()
}

#[test]
fn terminate_sets_r_only_when_it_carries_a_read_requests_rdmap_header() {
    // RFC 5040 section 4.8: M and D for the DDP segment length and DDP
    // header, R for an RDMAP header, which only a Read Request has.
    // An RDMAP error on an RDMA Write: its 14-byte DDP header, no R.
    let (mut h, mut t) = connected(host_cfg(false), target_cfg(false));
    let stag = h.register(Buf(vec![0; 64]), 0, Access::RemoteRead);
    t.write(stag, 0, &[9; 8]);
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    let e = h.handle_input(&out).unwrap_err();
    assert_eq!(e.code, ErrorCode::RDMAP_ACCESS_RIGHTS);
    let term = terminate_bytes(&mut h);
    assert_eq!(u16::from_be_bytes([term[22], term[23]]), 0xc000, "M and D, not R");
    assert_eq!(&term[24..], &out[..16], "the DDP segment length and DDP header");

    // A DDP error on a Read Request: the DDP header alone.
    let (mut h, mut t) = connected(host_cfg(false), target_cfg(false));
    let stag = h.register(Buf(vec![0; 64]), 0, Access::RemoteRead);
    t.read(1, Buf(vec![0; 8]), stag, 0);
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    out[15] = 2; // MSN 2 where 1 is due
    assert_eq!(h.handle_input(&out).unwrap_err().code, ErrorCode::DDP_UNTAGGED_MSN_RANGE);
    let term = terminate_bytes(&mut h);
    assert_eq!(u16::from_be_bytes([term[22], term[23]]), 0xc000, "M and D, not R");
    assert_eq!(&term[24..], &out[..20]);

    // An RDMAP error on a Read Request: its RDMAP header too, with R.
    let (mut h, mut t) = connected(host_cfg(false), target_cfg(false));
    t.read(1, Buf(vec![0; 8]), 0x4200, 0);
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    assert_eq!(h.handle_input(&out).unwrap_err().code, ErrorCode::RDMAP_INVALID_STAG);
    let term = terminate_bytes(&mut h);
    assert_eq!(u16::from_be_bytes([term[22], term[23]]), 0xe000, "M, D and R");
    assert_eq!(&term[24..], &out[..48]);
}

#[test]
fn a_header_that_failed_its_crc_or_cannot_be_read_is_not_echoed() {
    // After a CRC error the bytes of the FPDU are not the peer's, and after
    // a framing error the stream has no known FPDU boundary: the Terminate
    // reports the MPA error with nothing copied (M, D and R clear).
    let (e, mut h) = host_rejects(true, |t, _| t.send(&[1; 16], &[], None), |b| b[25] ^= 1);
    assert_eq!(e.code, ErrorCode::MPA_CRC);
    assert!(e.header.is_empty());
    let term = terminate_bytes(&mut h);
    assert_eq!((term[20], term[21], u16::from_be_bytes([term[22], term[23]])), (0x20, 0x02, 0));
    assert_eq!(term.len(), 24, "nothing echoed");
    let (e, mut h) = host_rejects(false, |t, _| t.send(&[1; 16], &[], None), |b| b[1] = 10);
    assert_eq!(e.code, ErrorCode::MPA_FPDU);
    assert_eq!(terminate_bytes(&mut h).len(), 24);
    // A DDP version not ours: the header's layout is unknown.
    let (e, mut h) = host_rejects(false, |t, _| t.send(&[1; 16], &[], None), |b| b[2] = 0x42);
    assert_eq!(e.code, ErrorCode::DDP_UNTAGGED_VERSION);
    assert_eq!(terminate_bytes(&mut h).len(), 24);
}

#[test]
fn a_ulpdu_shorter_than_its_header_is_a_framing_error() {
    let (e, _) = host_rejects(false, |t, _| t.send(&[1; 16], &[], None), |b| b[1] = 10);
    assert_eq!(e.code, ErrorCode::MPA_FPDU);
}

#[test]
fn the_peers_terminate_is_reported_and_ends_the_connection() {
    let (mut h, mut t) = connected(host_cfg(true), target_cfg(true));
    let stag = h.register(Buf(vec![0; 8]), 0, Access::RemoteWrite);
    t.write(stag, 100, &[1; 8]);
    let mut out = Vec::new();
    t.take_transmit(&mut out);
    assert!(h.handle_input(&out).is_err());
    pump(&mut h, &mut t, 5).unwrap();
    match events(&mut t).as_slice() {
        [Event::Terminated(code)] => assert_eq!(*code, ErrorCode::DDP_TAGGED_BASE_BOUNDS),
        other => panic!("{other:?}"),
    }
    assert_eq!(t.state(), State::Closed);
}

#[test]
fn terminate_control_word_follows_rfc_5040() {
    let (_, mut h) = host_rejects(false, |t, _| t.send(&[1; 16], &[], None), |b| b[15] = 9);
    let (le, ec, hdrct) = terminate_sent(&mut h);
    assert_eq!(le, 0x12, "layer DDP (1), etype untagged buffer (2)");
    assert_eq!(ec, 0x03);
    assert_eq!(hdrct, 0xc000);
    assert_eq!(Ctrl::new(Opcode::TERMINATE, true).0, 0x4147);
}

/// An event is moved from the connection's queue to the caller whole: at
/// 128 bytes or less the compiler moves it with a few vector stores, above
/// that with a call to `memcpy` (20 ns per 4K read in the target's
/// profile when it was 144). Buffers of 32 bytes with a niche, as the
/// daemon's I/O buffers are, and `Vec`s keep it there.
#[test]
fn an_event_with_a_buffer_of_32_bytes_fits_128_bytes() {
    #[allow(dead_code)]
    struct Buf32(std::ptr::NonNull<u8>, usize, usize, bool);
    assert_eq!(std::mem::size_of::<Buf32>(), 32);
    assert!(std::mem::size_of::<Event<Buf32>>() <= 128, "{}", std::mem::size_of::<Event<Buf32>>());
    assert!(std::mem::size_of::<Event<Vec<u8>>>() <= 128);
}

#[test]
fn read_requests_beyond_the_ird_are_refused_not_served() {
    // The host serves at most 2 reads at once (its IRD, the target's ORD).
    // A target that sends a third before the host's answers left gets a
    // Terminate, not a third Read Response: each 48-byte request could
    // otherwise queue a whole region's worth of bytes to send.
    let (mut h, mut t) = connected(Config { ird: 2, ..host_cfg(false) }, target_cfg(false));
    assert_eq!(h.ird(), 2);
    let stag = h.register(Buf(vec![5; 65536]), 0, Access::RemoteRead);
    t.read(1, Buf(vec![0; 65536]), stag, 0);
    let mut one = Vec::new();
    t.take_transmit(&mut one);
    assert_eq!(one.len(), 48 + 4);
    let mut wire = Vec::new();
    for msn in 1..=3u32 {
        let mut rr = one.clone();
        rr[12..16].copy_from_slice(&msn.to_be_bytes());
        wire.extend_from_slice(&rr);
    }
    let e = h.handle_input(&wire).unwrap_err();
    assert_eq!(e.code, ErrorCode::RDMAP_CATASTROPHIC_STREAM);
    assert!(e.reason.contains("IRD"), "{e}");
    assert!(h.transmit_len() < 3 * 65536, "{} bytes queued", h.transmit_len());
}

#[test]
fn read_requests_within_the_ird_are_served_once_the_answers_left() {
    let (mut h, mut t) = connected(Config { ird: 2, ..host_cfg(false) }, target_cfg(false));
    let stag = h.register(Buf(vec![5; 4096]), 0, Access::RemoteRead);
    t.read(1, Buf(vec![0; 4096]), stag, 0);
    let mut one = Vec::new();
    t.take_transmit(&mut one);
    // Two at once, then (their answers taken) two more: never more than
    // the IRD unanswered.
    for msns in [[1u32, 2], [3, 4]] {
        let mut wire = Vec::new();
        for msn in msns {
            let mut rr = one.clone();
            rr[12..16].copy_from_slice(&msn.to_be_bytes());
            wire.extend_from_slice(&rr);
        }
        h.handle_input(&wire).unwrap();
        let mut out = Vec::new();
        h.take_transmit(&mut out);
        assert!(out.len() > 2 * 4096, "both answered: {} bytes", out.len());
        assert_eq!(h.state(), State::Rdma);
    }
}

#[test]
fn a_region_counts_the_bytes_covered_from_its_start_not_the_bytes_placed() {
    let (mut h, mut t) = connected(host_cfg(true), target_cfg(true));
    // The first half written twice: 4096 bytes placed, 2048 covered (the
    // second half still holds what the buffer held before).
    let twice = h.register(Buf(vec![0; 4096]), 0x1000, Access::RemoteWrite);
    t.write(twice, 0x1000, &[5; 2048]);
    t.write(twice, 0x1000, &[6; 2048]);
    // Written out of order, in three pieces, the last closing the gap.
    let shuffled = h.register(Buf(vec![0; 4096]), 0x8000, Access::RemoteWrite);
    t.write(shuffled, 0x8000 + 3072, &[7; 1024]);
    t.write(shuffled, 0x8000 + 1024, &[8; 2048]);
    assert_eq!(h.covered(shuffled), Some(0), "nothing from the start yet");
    pump(&mut t, &mut h, 100).unwrap();
    assert_eq!(h.covered(twice), Some(2048));
    assert_eq!(h.covered(shuffled), Some(0), "a gap at the start");
    t.write(shuffled, 0x8000, &[9; 1024]);
    pump(&mut t, &mut h, 100).unwrap();
    assert_eq!(h.covered(shuffled), Some(4096));
}
