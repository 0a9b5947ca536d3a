//! Many idle peers at once: 1,000 NVMe/TCP hosts (each an admin queue and
//! one 128-entry I/O queue, as the Linux host connects: two TCP
//! connections) and 1,000 iSCSI sessions held open against one daemon
//! while a fresh host still connects and completes I/O. Prints the
//! daemon's resident memory per held host and session (recorded in
//! docs/bench/); asserts only that everything is served and that the cost
//! of each stays bounded.

mod common;

use common::{block_on, bounded, Daemon};
use initiator::iscsi::{LoginOptions, Session};
use initiator::{Controller, Options};
use std::time::Duration;

const NQN: &str = "nqn.2026-11.io.ironwire:scale";
const IQN: &str = "iqn.2026-11.io.ironwire:scale";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:scale-host";
const INITIATOR: &str = "iqn.2026-11.io.ironwire:scale-initiator";
const HELD: usize = 1000;

/// This test process holds the host ends of 3,000 connections: its soft
/// limit goes up to the hard one.
fn raise_own_open_files() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a pointer to a local rlimit.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    assert!(lim.rlim_max >= 3 * HELD as u64 + 200, "hard open-file limit {} is too low for this test", lim.rlim_max);
}

fn opts() -> Options {
    Options { io_queues: 1, queue_size: 128, kato_ms: 0, ..Options::default() }
}

#[test]
fn a_thousand_controllers_and_a_thousand_sessions_leave_a_fresh_host_served() {
    raise_own_open_files();
    let mut d = Daemon::start_with("scale", |_, port| {
        format!(
            "[[device]]\nname = \"r\"\nkind = \"ram\"\nsize = \"16MiB\"\n\n[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n[[subsystem.namespace]]\ndevice = \"r\"\n\n[[iscsi_target]]\niqn = \"{IQN}\"\nallow_any_initiator = true\n[[iscsi_target.lun]]\ndevice = \"r\"\n\n[[port]]\naddress = \"127.0.0.1:{port}\"\n[[port]]\ntransport = \"iscsi\"\naddress = \"127.0.0.1:{}\"\n\n[reactor]\ncores = [0]\n\n[limits]\nconnections_per_host = 4096\ncontrollers_per_host = 2048\nsessions_per_host = 2048\n",
            port + 1
        )
    });
    let nvme = d.addr;
    let iscsi = std::net::SocketAddr::from(([127, 0, 0, 1], nvme.port() + 1));
    let (before, vsz_before) = (d.rss_kib(), d.data_kib());
    block_on(bounded(240, async {
        let mut controllers = Vec::with_capacity(HELD);
        for i in 0..HELD {
            let c = Controller::connect(nvme, NQN, HOST, opts())
                .await
                .unwrap_or_else(|e| panic!("controller {i} of {HELD}: {e}"));
            controllers.push(c);
        }
        let (after_nvme, vsz_nvme) = (d.rss_kib(), d.data_kib());
        let mut sessions = Vec::with_capacity(HELD);
        for i in 0..HELD {
            let s = Session::connect(iscsi, LoginOptions::new(INITIATOR, Some(IQN)))
                .await
                .unwrap_or_else(|e| panic!("session {i} of {HELD}: {e}"));
            sessions.push(s);
        }
        let (after_iscsi, vsz_iscsi) = (d.rss_kib(), d.data_kib());
        let per_nvme = after_nvme.saturating_sub(before) * 1024 / HELD as u64;
        let per_iscsi = after_iscsi.saturating_sub(after_nvme) * 1024 / HELD as u64;
        let vsz_per_nvme = vsz_nvme.saturating_sub(vsz_before) * 1024 / HELD as u64;
        let vsz_per_iscsi = vsz_iscsi.saturating_sub(vsz_nvme) * 1024 / HELD as u64;
        println!(
            "daemon RSS: {before} KiB idle, {after_nvme} KiB with {HELD} NVMe/TCP hosts, admin and one I/O queue ({per_nvme} B each), \
             {after_iscsi} KiB with {HELD} iSCSI sessions more ({per_iscsi} B each); \
             address space {vsz_per_nvme} B per host, {vsz_per_iscsi} B per session"
        );
        // A fresh host: connect, write, read back, on both protocols.
        let mut fresh = Controller::connect(nvme, NQN, HOST, Options { io_queues: 1, queue_size: 16, ..opts() })
            .await
            .expect("a fresh NVMe/TCP host connects beside 3,000 idle connections");
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 13) as u8).collect();
        fresh.write(0, 1, 64, data.clone()).await.expect("write");
        assert_eq!(fresh.read(0, 1, 64, 8).await.expect("read"), data);
        let mut s = Session::connect(iscsi, LoginOptions::new(INITIATOR, Some(IQN))).await.expect("fresh session");
        assert_eq!(s.read16(0, 64, 8, 512).await.expect("iSCSI read"), data, "the NVMe write through iSCSI");
        // Every held connection is still alive: a sample answers.
        for c in controllers.iter_mut().step_by(97) {
            c.keep_alive().await.expect("a held controller answers Keep Alive");
        }
        for s in sessions.iter_mut().step_by(97) {
            s.read16(0, 64, 8, 512).await.expect("a held session reads");
        }
        // Idle connections cost little: a generous bound (64 KiB each, the
        // goal, for a host's two connections too) that a per-connection
        // buffer of the receive or send size would pass.
        assert!(per_nvme < 64 << 10, "{per_nvme} bytes per idle NVMe/TCP host (admin and one I/O queue)");
        assert!(per_iscsi < 64 << 10, "{per_iscsi} bytes per idle iSCSI session");
        // And in address space: with transparent huge pages always on,
        // khugepaged makes a mostly untouched reservation resident (a
        // 256 KiB send buffer per connection did that).
        assert!(vsz_per_nvme < 256 << 10, "{vsz_per_nvme} bytes of address space per idle NVMe/TCP host");
        assert!(vsz_per_iscsi < 128 << 10, "{vsz_per_iscsi} bytes of address space per idle iSCSI session");
        drop(controllers);
        drop(sessions);
        reactor::sleep(Duration::from_millis(200)).await;
    }));
    d.assert_alive();
}
