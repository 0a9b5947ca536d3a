//! A whole iWARP connection (MPA, DDP, RDMAP) fed hostile peer bytes.
//!
//! Input: byte 0 configures this end (bit 0 initiator instead of responder,
//! bit 1 ask for CRC, bit 2 small segments and receives, bit 3 feed input
//! lent: a Send's body may stay in it), byte 1 seeds where
//! the rest is cut into receive chunks. A responder accepts the request;
//! every Send is answered with an RDMA Read of the peer and a Send; an
//! initiator registers one region for remote writes and one for remote
//! reads, and re-posts a receive per Send.
//!
//! Never panics; a fatal error leaves the connection closed; once closed,
//! input is ignored (no events); registered buffers keep their size and the
//! read-only one is never written; a lent body lies inside the input it was
//! lent from and is as long as the Send said.
#![no_main]

use ironwire_fuzz::chunks;
use iwarp::{Access, Config, Connection, Event, State};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let [cfg, seed, stream @ ..] = input else {
        return;
    };
    let small = cfg & 4 != 0;
    let config = Config {
        crc: cfg & 2 != 0,
        ird: 4,
        ord: 4,
        require_reads: false,
        max_segment: if small { 64 } else { 61440 },
        recv_head: if small { 16 } else { 64 },
        recv_max: if small { 128 } else { 8256 },
    };
    let initiator = cfg & 1 != 0;
    let mut c = if initiator {
        Connection::<Vec<u8>>::initiator(config, b"pd")
    } else {
        Connection::<Vec<u8>>::responder(config)
    };
    let (mut wr, mut rd) = (None, None);
    let mut tx = Vec::new();
    let mut id = 0u64;
    for chunk in chunks(stream, *seed, 97) {
        let before = c.state();
        let lend = cfg & 8 != 0;
        let r = if lend { c.handle_input_lent(chunk) } else { c.handle_input(chunk) };
        if before == State::Closed {
            assert!(r.is_ok());
            assert!(c.poll_event().is_none(), "event after close");
        }
        if let Err(e) = &r {
            assert_eq!(c.state(), State::Closed, "fatal {e} left it open");
            assert!(!e.reason.is_empty());
        }
        while let Some(ev) = c.poll_event() {
            match ev {
                Event::ConnectRequest { .. } => {
                    c.post_receives(8);
                    let _ = c.accept(b"ok");
                }
                Event::Established { .. } => {
                    c.post_receives(8);
                    wr = Some(c.register(vec![0; 4096], 0x1000, Access::RemoteWrite));
                    rd = Some(c.register(vec![0x5a; 4096], 0x8000, Access::RemoteRead));
                }
                Event::Send(m) => {
                    if let Some(at) = &m.lent {
                        assert!(lend && m.body.is_none(), "lent {at:?} from a copied input, or copied too");
                        assert!(
                            chunk.get(at.start as usize..at.end as usize).is_some(),
                            "lent {at:?} outside a {}-byte input",
                            chunk.len()
                        );
                        assert!(!at.is_empty());
                    }
                    c.post_receives(1);
                    if !initiator {
                        id += 1;
                        c.read(id, vec![0; 512], u32::from(m.head[0]), 0);
                        c.send(&[0; 16], &[], None);
                    }
                }
                Event::ReadDone { buf, .. } => assert_eq!(buf.len(), 512),
                Event::Rejected { .. } | Event::Terminated(_) => {}
            }
        }
        c.take_transmit(&mut tx);
    }
    if let Some(stag) = wr {
        if let Some(b) = c.deregister(stag) {
            assert_eq!(b.len(), 4096);
        }
    }
    if let Some(stag) = rd {
        let b = c.deregister(stag).expect("the read-only region is never invalidated by a write");
        assert!(b.iter().all(|&x| x == 0x5a), "a read-only region was written");
    }
});
