//! The daemon's stop: SIGTERM drains the connections (commands already
//! taken finish and are answered, iSCSI initiators are asked to log out),
//! flushes the devices and exits 0, even while a reload waits; a second
//! signal exits at once; a restart right after binds the same ports; a
//! service manager hears READY=1 and STOPPING=1; `--persist` saves over
//! the temporary file a killed daemon with the same PID left.

mod common;

use common::{block_on, bounded, Daemon};
use initiator::iscsi::{cdb, LoginOptions, Session};
use initiator::{cmd, Controller, Options};
use iscsi::host::HostEvent;
use std::path::{Path, PathBuf};
use std::time::Duration;

const NQN: &str = "nqn.2026-11.io.ironwire:lifecycle";
const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:lifecycle-host";
const IQN: &str = "iqn.2026-11.io.ironwire.test:lifecycle";
const HOST_IQN: &str = "iqn.2026-11.io.ironwire.test:lifecycle-host";
const BS: usize = 4096;
const WRITES: u64 = 8;

/// A file device with `write_latency_ms` added to every write, exported
/// over NVMe/TCP or iSCSI, with `[shutdown] drain_s = drain_s`.
fn config(dir: &Path, port: u16, iscsi: bool, write_latency_ms: u64, drain_s: u32) -> String {
    let export = if iscsi {
        format!(
            "[[iscsi_target]]\niqn = \"{IQN}\"\nallow_any_initiator = true\n[[iscsi_target.lun]]\nlun = 0\n\
             device = \"dev\"\n\n[[port]]\ntransport = \"iscsi\"\naddress = \"127.0.0.1:{port}\"\n"
        )
    } else {
        format!(
            "[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n[[subsystem.namespace]]\ndevice = \"dev\"\n\n\
             [[port]]\naddress = \"127.0.0.1:{port}\"\n"
        )
    };
    format!(
        "[[device]]\nname = \"dev\"\nkind = \"file\"\npath = \"{}\"\nsize = \"1MiB\"\nblock_size = {BS}\n\
         write_latency_us = {}\n\n{export}\n[shutdown]\ndrain_s = {drain_s}\n\n[reactor]\ncores = [0]\n",
        dir.join("dev.img").display(),
        write_latency_ms * 1000
    )
}

fn block(i: u64) -> Vec<u8> {
    (0..BS).map(|b| (b as u64 ^ i.wrapping_mul(131)) as u8 | 1).collect()
}

async fn nvme_host(d: &Daemon) -> Controller {
    let opts = Options { io_queues: 1, queue_size: 32, ..Options::default() };
    Controller::connect(d.addr, NQN, HOST_NQN, opts).await.expect("NVMe/TCP connect")
}

#[test]
fn a_stop_answers_the_nvme_writes_in_flight_then_flushes_and_exits_0() {
    let mut d = Daemon::start_with("lifecycle-nvme", |dir, port| config(dir, port, false, 400, 10));
    let image = d.dir.join("dev.img");
    block_on(bounded(30, async {
        let mut c = nvme_host(&d).await;
        let q = c.io_queue(0).expect("queue");
        for i in 0..WRITES {
            q.submit(cmd::write(1, i, 1), block(i), 0).expect("submit");
        }
        q.flush().await.expect("send the writes");
        // The writes are in the daemon, each 400 ms from done.
        reactor::sleep(Duration::from_millis(100)).await;
        d.signal(libc::SIGTERM);
        for _ in 0..WRITES {
            let done = match q.next_completion().await {
                Ok(d) => d,
                Err(e) => panic!("{e}: {}", d.log()),
            };
            assert!(done.cqe.status().is_success(), "write failed: {:?}", done.cqe);
        }
        // Then the daemon closes the connection.
        let after = q.execute_raw(cmd::read(1, 0, 1), Vec::new(), BS as u32).await;
        assert!(after.is_err(), "a command after the stop was answered: {after:?}");
    }));
    let status = d.wait_exit(20).expect("the daemon exits after the drain");
    assert_eq!(status.code(), Some(0), "log:\n{}", d.log());
    let log = d.log();
    assert!(log.contains("SIGTERM: stopping"), "{log}");
    assert!(log.contains("stopped: flushed 1 devices"), "{log}");
    let on_disk = std::fs::read(&image).expect("device file");
    for i in 0..WRITES {
        let at = (i as usize) * BS;
        assert!(on_disk[at..at + BS] == block(i)[..], "block {i} is not what was acknowledged");
    }
}

/// A stop while a SIGHUP reload waits for a removed namespace's write in
/// flight starts at once: reloads run on a thread of their own, not on the
/// one that waits for signals.
#[test]
fn a_stop_is_not_held_back_by_a_reload_waiting_for_a_removal() {
    let mut d = Daemon::start_with("lifecycle-reload", |dir, port| config(dir, port, false, 2000, 10));
    let path = d.dir.join("ironwire.toml");
    let image = d.dir.join("dev.img");
    block_on(bounded(30, async {
        let mut c = nvme_host(&d).await;
        let q = c.io_queue(0).expect("queue");
        q.submit(cmd::write(1, 0, 1), block(0), 0).expect("submit");
        q.flush().await.expect("send the write");
        // Running: the I/O queue holds the namespace (`held`).
        for tries in 0.. {
            let shown = d.ctl("show --json").expect("show");
            let v: serde_json::Value = serde_json::from_str(&shown).expect("JSON");
            match v["live"]["subsystems"][0]["namespaces"][0]["held"].as_u64() {
                Some(1) => break,
                _ if tries == 500 => panic!("the write never showed as running: {shown}"),
                _ => reactor::sleep(Duration::from_millis(10)).await,
            }
        }
        // The same configuration without the namespace: the reload waits
        // for the write, 2 s from done.
        let text = std::fs::read_to_string(&path).expect("read the configuration");
        let without = text.replace("[[subsystem.namespace]]\ndevice = \"dev\"\n", "");
        assert_ne!(without, text, "the namespace is in the configuration");
        std::fs::write(&path, without).expect("write the configuration");
        d.signal(libc::SIGHUP);
        reactor::sleep(Duration::from_millis(400)).await;
        d.signal(libc::SIGTERM);
        reactor::sleep(Duration::from_millis(400)).await;
        let log = d.log();
        assert!(!log.contains("control: reloaded"), "the reload did not wait for the write: {log}");
        assert!(log.contains("SIGTERM: stopping"), "the stop waited for the reload: {log}");
        let done = match q.next_completion().await {
            Ok(d) => d,
            Err(e) => panic!("{e}: {}", d.log()),
        };
        assert!(done.cqe.status().is_success(), "write failed: {:?}", done.cqe);
    }));
    let status = d.wait_exit(20).expect("the daemon exits after the drain");
    assert_eq!(status.code(), Some(0), "log:\n{}", d.log());
    let log = d.log();
    assert!(log.contains("control: reloaded"), "{log}");
    let on_disk = std::fs::read(&image).expect("device file");
    assert!(on_disk[..BS] == block(0)[..], "the write acknowledged is not on the file");
}

#[test]
fn a_stop_asks_iscsi_initiators_to_log_out_and_answers_their_commands() {
    let mut d = Daemon::start_with("lifecycle-iscsi", |dir, port| config(dir, port, true, 400, 10));
    block_on(bounded(30, async {
        let mut s = Session::connect(d.addr, LoginOptions::new(HOST_IQN, Some(IQN))).await.expect("iSCSI login");
        for i in 0..4u64 {
            s.submit(0, &cdb::write16(i, 1), block(i), 0).expect("submit");
        }
        s.flush().await.expect("send the writes");
        reactor::sleep(Duration::from_millis(100)).await;
        d.signal(libc::SIGTERM);
        for _ in 0..4 {
            let (_, r) = s.next_completion().await.expect("every write taken before the stop is answered");
            r.check().expect("write status");
        }
        match s.next_event().await.expect("an Asynchronous Message") {
            HostEvent::AsyncMessage { event, parameters } => {
                assert_eq!(event, iscsi::pdu::async_event::REQUEST_LOGOUT);
                assert!((1..=10).contains(&parameters[2]), "log out within {} s", parameters[2]);
            }
            other => panic!("expected a logout request, got {other:?}"),
        }
        s.logout().await.expect("logout");
    }));
    // The only session logged out: nothing is left to wait for.
    let status = d.wait_exit(8).expect("the daemon exits once the session logged out");
    assert_eq!(status.code(), Some(0), "log:\n{}", d.log());
    assert!(d.log().contains("asked the initiator to log out"), "{}", d.log());
}

#[test]
fn an_iscsi_initiator_that_does_not_log_out_is_closed_at_the_end_of_the_drain() {
    let mut d = Daemon::start_with("lifecycle-iscsi-stay", |dir, port| config(dir, port, true, 0, 1));
    block_on(bounded(30, async {
        let mut s = Session::connect(d.addr, LoginOptions::new(HOST_IQN, Some(IQN))).await.expect("iSCSI login");
        d.signal(libc::SIGTERM);
        let events = s.wait_closed().await.expect("the daemon closes the connection");
        assert!(
            events.iter().any(|e| matches!(e, HostEvent::AsyncMessage { .. })),
            "no logout request before the close: {events:?}"
        );
    }));
    let status = d.wait_exit(10).expect("the daemon exits after the drain");
    assert_eq!(status.code(), Some(0), "log:\n{}", d.log());
}

#[test]
fn a_second_signal_exits_at_once() {
    // Writes take 5 s and the drain allows 30: only the second signal can
    // end the process early.
    let mut d = Daemon::start_with("lifecycle-twice", |dir, port| config(dir, port, false, 5000, 30));
    block_on(bounded(30, async {
        let mut c = nvme_host(&d).await;
        let q = c.io_queue(0).expect("queue");
        q.submit(cmd::write(1, 0, 1), block(0), 0).expect("submit");
        q.flush().await.expect("send the write");
        reactor::sleep(Duration::from_millis(100)).await;
        d.signal(libc::SIGTERM);
        reactor::sleep(Duration::from_millis(300)).await;
        assert!(d.alive(), "the first signal drains; it does not exit while a write is in flight");
        d.signal(libc::SIGTERM);
        let status = d.wait_exit(3).expect("the second signal exits at once");
        assert_eq!(status.code(), Some(128 + libc::SIGTERM), "log:\n{}", d.log());
        assert!(q.next_completion().await.is_err(), "the write was answered although the process was cut short");
    }));
    assert!(d.log().contains("SIGTERM again: exiting at once"), "{}", d.log());
    assert!(!d.dir.join("ctl.sock").exists(), "the control socket is left behind");
}

#[test]
fn a_restart_right_after_a_stop_binds_the_same_port() {
    let mut d = Daemon::start_with("lifecycle-restart", |dir, port| config(dir, port, false, 0, 10));
    for round in 0..3 {
        block_on(bounded(30, async {
            // Connections that stay open until the daemon closes them.
            let mut hosts = Vec::new();
            for _ in 0..4 {
                hosts.push(nvme_host(&d).await);
            }
            for h in &mut hosts {
                h.write(0, 1, 0, block(round)).await.expect("write");
            }
            d.signal(libc::SIGTERM);
            // Each connection ends once the stop reaches it (within the
            // bound of this block).
            for h in &mut hosts {
                while h.read(0, 1, 0, 1).await.is_ok() {
                    reactor::sleep(Duration::from_millis(20)).await;
                }
            }
        }));
        assert_eq!(d.wait_exit(20).and_then(|s| s.code()), Some(0), "log:\n{}", d.log());
        d.restart();
        block_on(bounded(30, async {
            let mut c = nvme_host(&d).await;
            assert_eq!(c.read(0, 1, 0, 1).await.expect("read after restart"), block(round));
        }));
    }
}

/// `--persist` writes the configuration beside it under a name made of the
/// daemon's PID, then renames it. One killed between the two leaves that
/// file behind; a later daemon with the same PID (in a container the
/// daemon is PID 1 at every start) must still save its changes.
#[test]
fn persist_saves_changes_over_a_temporary_file_a_killed_daemon_left() {
    let mut d = Daemon::start_args("lifecycle-persist", &["--persist"], |dir, port| config(dir, port, false, 0, 10));
    let path = d.dir.join("ironwire.toml");
    let leftover = d.dir.join(format!(".ironwire.toml.tmp-{}", d.pid()));
    std::fs::write(&leftover, "half a configuration from before the crash").expect("leftover");
    if let Err(e) = d.ctl("add device name=extra kind=ram size=1MiB") {
        panic!("the change was not saved: {e}");
    }
    assert!(std::fs::read_to_string(&path).expect("config").contains("extra"), "the file does not have the change");
    assert!(!leftover.exists(), "the leftover is still there");
    d.kill();
    d.restart();
    assert!(d.ctl("show").expect("show").contains("extra"), "the restarted daemon lost the change");
}

/// A datagram socket standing in for systemd's notification socket.
struct NotifySocket {
    sock: std::os::unix::net::UnixDatagram,
    path: PathBuf,
}

impl NotifySocket {
    fn new() -> NotifySocket {
        let path = std::env::temp_dir().join(format!("ironwire-notify-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let sock = std::os::unix::net::UnixDatagram::bind(&path).expect("bind the notify socket");
        sock.set_read_timeout(Some(Duration::from_secs(15))).expect("timeout");
        NotifySocket { sock, path }
    }

    fn next(&self) -> String {
        let mut buf = [0u8; 512];
        let n = self.sock.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[test]
fn a_service_manager_hears_ready_and_stopping() {
    let notify = NotifySocket::new();
    let path = notify.path.to_str().expect("utf-8 path").to_owned();
    let mut d =
        Daemon::start_env("lifecycle-notify", &[("NOTIFY_SOCKET", &path)], |dir, port| config(dir, port, false, 0, 10));
    assert_eq!(notify.next(), "READY=1");
    d.signal(libc::SIGTERM);
    assert_eq!(notify.next(), "STOPPING=1");
    assert_eq!(d.wait_exit(20).and_then(|s| s.code()), Some(0), "log:\n{}", d.log());
}
