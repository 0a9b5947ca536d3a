//! A whole iSCSI target connection (`iscsi::target::TargetConnection`) fed
//! a hostile initiator's bytes in chunks: login (security and operational
//! stages, CHAP), then commands, data, task management, text, NOP, logout.
//!
//! Input: byte 0 configures the target (`ironwire_fuzz::iscsi_peer::connection`:
//! bit 0 digests allowed, bit 1 CHAP required, bit 2 small limits, bit 3
//! InitialR2T=Yes ImmediateData=No) and the driver (bit 4 answer commands
//! one chunk late, so task management races with them; bit 5 advance the
//! clock 700 ms per chunk, so NOP-In pings go out and an initiator that
//! does not answer them is declared dead; bit 6 the driver admits each
//! normal session itself, as the daemon does); byte 1 seeds where the rest
//! is cut into receive chunks.
//!
//! Never panics. A fatal error closes the connection; once closed, input is
//! ignored (no events, no bytes). Everything the target sends frames as
//! PDUs with the digests in effect and within the initiator's
//! MaxRecvDataSegmentLength; Data-In stays within a read's expected
//! length; write commands carry exactly their expected data; a task is
//! answered once, and never after task management ended it.
#![no_main]

use ironwire_fuzz::chunks;
use ironwire_fuzz::iscsi_peer::{connection, Driver};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let [cfg, seed, stream @ ..] = input else {
        return;
    };
    let mut t = connection(*cfg);
    let mut d = Driver::new(cfg & 0x10 != 0);
    let clock = cfg & 0x20 != 0;
    let mut now = 0u64;
    for chunk in chunks(stream, *seed, 211) {
        d.feed(&mut t, chunk);
        if clock {
            now += 700;
            d.tick(&mut t, now);
        }
    }
    let _ = (t.open_tasks(), t.cmd_window(), t.session_type(), d.events);
});
