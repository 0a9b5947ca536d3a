//! Run-time changes through `ironwire ctl` (docs/ctl.md): every object of
//! both protocols added and changed on a live daemon survives `ctl save`
//! and a restart, `--persist` survives SIGKILL, a bad change is refused with
//! the validation error and changes nothing, `ctl reload` / SIGHUP
//! change namespaces and ports under a connected host without dropping it,
//! and devices in use grow (`set device size=`, or a file that grows)
//! with both protocols' hosts told.

mod common;

use common::{block_on, bounded, Daemon};
use initiator::{Controller, Options};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const NQN: &str = "nqn.2026-11.io.ironwire:rt";
const NQN2: &str = "nqn.2026-11.io.ironwire:rt2";
const IQN: &str = "iqn.2026-11.io.ironwire:rt";
const IQN2: &str = "iqn.2026-11.io.ironwire:rt2";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:rt-host";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port()
}

/// One RAM device exported over NVMe/TCP and iSCSI; ctl may open files
/// in the test's dir.
fn config(dir: &Path, port: u16, iscsi_port: u16) -> String {
    format!(
        "[[device]]\nname = \"r0\"\nkind = \"ram\"\nsize = \"1MiB\"\n\n\
         [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n[[subsystem.namespace]]\ndevice = \"r0\"\n\n\
         [[port]]\naddress = \"127.0.0.1:{port}\"\n\n\
         [[port]]\ntransport = \"iscsi\"\naddress = \"127.0.0.1:{iscsi_port}\"\n\n\
         [[iscsi_target]]\niqn = \"{IQN}\"\nallow_any_initiator = true\n[[iscsi_target.lun]]\ndevice = \"r0\"\n\n\
         [reactor]\ncores = [0]\n\n[control]\nallow_paths = [\"{}/\"]\n",
        dir.display()
    )
}

fn start(tag: &str, args: &[&str]) -> Daemon {
    let iscsi_port = free_port();
    Daemon::start_args(&format!("rt-{tag}"), args, move |dir, port| config(dir, port, iscsi_port))
}

/// `ironwire ctl` run as a real client: its output, or its error message.
fn ctl(d: &Daemon, words: &str) -> Result<String, String> {
    d.ctl(words)
}

fn ok(d: &Daemon, words: &str) -> String {
    ctl(d, words).unwrap_or_else(|e| panic!("ctl {words}: {e}\nlog:\n{}", d.log()))
}

fn refused(d: &Daemon, words: &str) -> String {
    match ctl(d, words) {
        Ok(out) => panic!("ctl {words} was accepted: {out}"),
        Err(e) => e,
    }
}

fn show(d: &Daemon) -> serde_json::Value {
    serde_json::from_str(&ok(d, "show --json")).expect("show --json is JSON")
}

/// `show --json` once no controller, no session and no queue holding a
/// namespace is left (a host that just disconnected takes a moment to be
/// noticed); bounded.
fn show_idle(d: &Daemon) -> serde_json::Value {
    for _ in 0..100 {
        let v = show(d);
        let busy = |list: &str, key: &str| {
            v["live"][list].as_array().expect("list").iter().any(|x| x[key].as_u64().unwrap_or(0) > 0)
        };
        let held = v["live"]["subsystems"].as_array().expect("list").iter().any(|s| {
            s["namespaces"].as_array().expect("namespaces").iter().any(|n| n["held"].as_u64().unwrap_or(0) > 0)
        });
        if !busy("subsystems", "controllers") && !busy("iscsi_targets", "sessions") && !held {
            return v;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("hosts stayed connected");
}

/// Writes 4 KiB to namespace `nsid` (of `block_size`-byte blocks) of `nqn`
/// at `addr` and reads it back.
fn nvme_round_trip(addr: SocketAddr, nqn: &str, nsid: u32, block_size: u32) {
    block_on(bounded(20, async {
        let opts = Options { io_queues: 1, queue_size: 16, ..Options::default() };
        let mut c = Controller::connect(addr, nqn, HOST, opts).await.expect("connect");
        let data: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        c.write(0, nsid, 0, data.clone()).await.expect("write");
        assert_eq!(c.read(0, nsid, 0, 4096 / block_size).await.expect("read"), data);
    }));
}

#[test]
fn objects_added_at_run_time_over_both_protocols_survive_save_and_restart() {
    let mut d = start("save", &[]);
    let dir = d.dir.display().to_string();
    let extra = free_port();
    for cmd in [
        "add device name=r1 kind=ram size=2MiB block_size=4096".to_string(),
        format!("add device name=f1 kind=file path={dir}/f1.img size=1MiB"),
        format!("add subsystem nqn={NQN2} allow_any_host=true serial=RT2"),
        format!("add host nqn={NQN2} host={HOST}"),
        format!("set subsystem nqn={NQN2} allow_any_host=false"),
        format!("add namespace nqn={NQN2} device=r1"),
        format!("add namespace nqn={NQN2} nsid=5 device=f1"),
        format!("add port address=127.0.0.1:{extra}"),
        format!("add target iqn={IQN2} allow_any_initiator=true"),
        format!("add lun iqn={IQN2} device=r1"),
        format!("add lun iqn={IQN2} lun=3 device=f1"),
        format!("add initiator iqn={IQN2} initiator=iqn.2026-11.io.test:a"),
        format!("add acl iqn={IQN2} initiator=iqn.2026-11.io.test:b chap.user=b chap.secret=0123456789abcdef"),
        format!("set target iqn={IQN2} allow_any_initiator=false alias=second"),
        "set discovery_chap user=disc secret=discovery-secret".to_string(),
    ] {
        ok(&d, &cmd);
    }
    // The new objects are live: a host reaches the new namespace on the
    // new port.
    nvme_round_trip(SocketAddr::from(([127, 0, 0, 1], extra)), NQN2, 5, 512);
    let before = show_idle(&d);
    let t = &before["live"]["iscsi_targets"][1];
    assert_eq!(t["iqn"], IQN2);
    assert_eq!(
        t["luns"],
        serde_json::json!([{"lun": 0, "device": "r1", "busy": 0}, {"lun": 3, "device": "f1", "busy": 0}])
    );
    let s = &before["live"]["subsystems"][1];
    assert_eq!(
        s["namespaces"],
        serde_json::json!([
            {"nsid": 1, "device": "r1", "ana_group": 1, "ana_state": "optimized", "held": 0},
            {"nsid": 5, "device": "f1", "ana_group": 5, "ana_state": "optimized", "held": 0}
        ])
    );
    assert_eq!(before["live"]["nvme_ports"].as_array().map(Vec::len), Some(2));

    let saved = d.dir.join("saved.toml");
    ok(&d, &format!("save {}", saved.display()));
    let text = std::fs::read_to_string(&saved).expect("saved file");
    let check = Command::new(env!("CARGO_BIN_EXE_ironwire")).arg("check-config").arg(&saved).output().expect("run");
    assert!(check.status.success(), "check-config: {}", String::from_utf8_lossy(&check.stderr));
    d.kill();
    let again = Daemon::start_with("rt-save-restarted", |_, _| text.clone());
    let after = show_idle(&again);
    assert_eq!(before, after, "the restarted daemon exports something else");
    nvme_round_trip(SocketAddr::from(([127, 0, 0, 1], extra)), NQN2, 1, 4096);
}

#[test]
fn persist_keeps_changes_across_sigkill() {
    let mut d = start("persist", &["--persist"]);
    ok(&d, "add device name=r1 kind=ram size=1MiB");
    ok(&d, &format!("add namespace nqn={NQN} device=r1"));
    ok(&d, &format!("add target iqn={IQN2} allow_any_initiator=true"));
    ok(&d, &format!("add lun iqn={IQN2} device=r1"));
    ok(&d, &format!("remove lun iqn={IQN} lun=0"));
    let before = show_idle(&d);
    d.kill();
    let text = std::fs::read_to_string(d.dir.join("ironwire.toml")).expect("persisted config");
    assert!(!d.dir.read_dir().expect("dir").any(|e| e.expect("entry").file_name().to_string_lossy().contains(".tmp-")));
    let again = Daemon::start_with("rt-persist-restarted", |_, _| text.clone());
    assert_eq!(before["config"], show_idle(&again)["config"]);
    assert_eq!(before["live"]["subsystems"], show_idle(&again)["live"]["subsystems"]);
}

#[test]
fn an_invalid_change_is_refused_with_the_validation_error_and_changes_nothing() {
    let mut d = start("invalid", &[]);
    let before = show(&d);
    let cases = [
        (
            format!("add namespace nqn={NQN} device=missing"),
            format!("subsystem[0] ({NQN}).namespace[1].device: no device named \"missing\""),
        ),
        ("add device name=x kind=ram".to_string(), "device[1] (x).size: required for a ram device".to_string()),
        (
            format!("set subsystem nqn={NQN} allow_any_host=false"),
            "hosts: empty while allow_any_host is false".to_string(),
        ),
        ("remove device name=r0".to_string(), "no device named \"r0\"".to_string()),
        (format!("add namespace nqn={NQN} nsid=1 device=r0"), "namespace nsid=1 already exists".to_string()),
        (format!("add lun iqn={IQN} lun=1 device=r0 colour=red"), "unknown field `colour`".to_string()),
        (
            "add port address=127.0.0.1:1 transport=sctp".to_string(),
            "port[2].transport: \"sctp\" is not supported".to_string(),
        ),
        (
            "add device name=etc kind=file path=/etc/ironwire-test.img size=1MiB".to_string(),
            "outside [control] allow_paths".to_string(),
        ),
    ];
    for (cmd, want) in cases {
        let e = refused(&d, &cmd);
        assert!(e.contains(&want), "ctl {cmd}: {e:?} does not say {want:?}");
    }
    // A file that fails validation, or changes what is fixed at run time,
    // is refused by reload too.
    let file = d.dir.join("ironwire.toml");
    let good = std::fs::read_to_string(&file).expect("config");
    std::fs::write(&file, good.replace("size = \"1MiB\"", "size = \"1MiB\"\nblock_size = 1000")).expect("write");
    assert!(refused(&d, "reload").contains("device[0] (r0).block_size"));
    std::fs::write(&file, good.replace("cores = [0]", "cores = [0]\npoll_us = 7")).expect("write");
    assert!(refused(&d, "reload").contains("reactor.poll_us: cannot change while ironwire runs"));
    assert_eq!(before, show(&d), "a refused change changed something");
    d.assert_alive();
}

#[test]
fn reload_and_sighup_change_namespaces_and_ports_without_dropping_a_connected_host() {
    let mut d = start("reload", &[]);
    let file = d.dir.join("ironwire.toml");
    let original = std::fs::read_to_string(&file).expect("config");
    let extra = free_port();
    // Appended array tables: the namespace joins the last subsystem so far
    // (NQN), then a second subsystem and a second port follow.
    let with_ns2 = format!(
        "{original}\n[[subsystem.namespace]]\nnsid = 2\ndevice = \"r3\"\n\n\
         [[device]]\nname = \"r3\"\nkind = \"null\"\nsize = \"1MiB\"\n\n\
         [[device]]\nname = \"r2\"\nkind = \"ram\"\nsize = \"2MiB\"\n\n\
         [[subsystem]]\nnqn = \"{NQN2}\"\nallow_any_host = true\n[[subsystem.namespace]]\ndevice = \"r2\"\n\n\
         [[port]]\naddress = \"127.0.0.1:{extra}\"\n"
    );
    let pid = d.pid();
    let addr = d.addr;
    block_on(bounded(30, async {
        let opts = Options { io_queues: 1, queue_size: 16, ..Options::default() };
        let mut c = Controller::connect(addr, NQN, HOST, opts).await.expect("connect");
        let data = vec![0x5a; 512];
        c.write(0, 1, 7, data.clone()).await.expect("write before");
        assert!(c.read(0, 2, 0, 1).await.is_err(), "namespace 2 before it exists");

        std::fs::write(&file, &with_ns2).expect("write config");
        // SAFETY: kill has no memory preconditions; pid is our child.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGHUP) }, 0);
        let mut seen = false;
        for _ in 0..100 {
            let v = show(&d);
            if v["live"]["subsystems"][0]["namespaces"].as_array().map(Vec::len) == Some(2) {
                seen = true;
                break;
            }
            reactor::sleep(Duration::from_millis(50)).await;
        }
        assert!(seen, "SIGHUP did not add namespace 2; log:\n{}", d.log());
        c.read(0, 2, 0, 1).await.expect("namespace 2 after SIGHUP");
        TcpStream::connect(("127.0.0.1", extra)).expect("the port added by SIGHUP listens");
        let v = show(&d);
        assert_eq!(v["live"]["subsystems"][1]["nqn"], NQN2);

        std::fs::write(&file, &original).expect("write config");
        ok(&d, "reload");
        assert!(c.read(0, 2, 0, 1).await.is_err(), "namespace 2 after it was removed");
        assert_eq!(c.read(0, 1, 7, 1).await.expect("the same connection after both reloads"), data);
        assert!(TcpStream::connect(("127.0.0.1", extra)).is_err(), "the removed port still accepts");
        let v = show(&d);
        assert_eq!(v["live"]["subsystems"][0]["controllers"], 1, "the host's controller was dropped");
        assert_eq!(v["live"]["subsystems"].as_array().map(Vec::len), Some(1));
    }));
    d.assert_alive();
}

#[test]
fn a_change_whose_port_is_taken_changes_nothing_and_keeps_every_port() {
    let mut d = start("taken", &[]);
    let file = d.dir.join("ironwire.toml");
    let original = std::fs::read_to_string(&file).expect("config");
    // Another program holds this address: the daemon's reactors cannot
    // bind it.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken_port = taken.local_addr().expect("addr").port();
    let iscsi_line = original.lines().find(|l| l.contains("address") && !l.contains(&d.addr.to_string()));
    let iscsi_addr = iscsi_line.and_then(|l| l.split('"').nth(1)).expect("the iSCSI port's address").to_string();
    // The NVMe port moves to the taken address, and a subsystem comes with
    // it: neither may happen.
    let moved = original.replace(&d.addr.to_string(), &format!("127.0.0.1:{taken_port}"))
        + &format!("\n[[subsystem]]\nnqn = \"{NQN2}\"\nallow_any_host = true\n");
    let before = show(&d);
    std::fs::write(&file, &moved).expect("write config");
    let e = refused(&d, "reload");
    assert!(e.contains(&format!("cannot listen on 127.0.0.1:{taken_port}")), "{e}");
    assert_eq!(before, show(&d), "a change that could not listen changed something");
    // The port it would have removed listens again, and serves.
    nvme_round_trip(d.addr, NQN, 1, 512);
    TcpStream::connect(&iscsi_addr).expect("the iSCSI port still listens");

    // Once the address is free, the same change applies.
    drop(taken);
    ok(&d, "reload");
    let moved_to = SocketAddr::from(([127, 0, 0, 1], taken_port));
    nvme_round_trip(moved_to, NQN, 1, 512);
    assert!(TcpStream::connect(d.addr).is_err(), "the port moved away still accepts");
    assert_eq!(show(&d)["live"]["subsystems"][1]["nqn"], NQN2);
    d.assert_alive();
}

#[test]
fn a_port_moved_between_one_address_and_the_wildcard_of_its_port_moves() {
    let mut d = start("widen", &[]);
    let file = d.dir.join("ironwire.toml");
    let original = std::fs::read_to_string(&file).expect("config");
    // The daemon's own listener on 127.0.0.1:P is what a plain bind of
    // 0.0.0.0:P (or back) collides with; nothing else holds the port.
    let any = format!("0.0.0.0:{}", d.addr.port());
    std::fs::write(&file, original.replace(&d.addr.to_string(), &any)).expect("write config");
    ok(&d, "reload");
    assert_eq!(show(&d)["config"]["port"][0]["address"], any.as_str());
    nvme_round_trip(d.addr, NQN, 1, 512);
    std::fs::write(&file, &original).expect("write config");
    ok(&d, "reload");
    assert_eq!(show(&d)["config"]["port"][0]["address"], d.addr.to_string().as_str());
    nvme_round_trip(d.addr, NQN, 1, 512);
    d.assert_alive();
}

/// Whether the daemon closes a new connection to `addr` at once (refused
/// by a `[limits]` count) rather than waiting for its first PDU.
fn closed_at_once(addr: SocketAddr) -> bool {
    use std::io::Read;
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
    match s.read(&mut [0u8; 1]) {
        Ok(n) => n == 0,
        Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    }
}

#[test]
fn a_port_added_back_counts_the_connections_it_accepted_before() {
    let iscsi_port = free_port();
    let limits = "\n[limits]\nconnections_per_port = 2\n\n[timeouts]\nhandshake_ms = 60000\n";
    let mut d = Daemon::start_args("rt-count", &[], move |dir, port| config(dir, port, iscsi_port) + limits);
    let port = format!("127.0.0.1:{}", d.addr.port());
    // Two connections that send nothing hold the port's two places.
    let held = [TcpStream::connect(d.addr).expect("first"), TcpStream::connect(d.addr).expect("second")];
    assert!(closed_at_once(d.addr), "a third connection was admitted past the limit of 2");
    // The port goes and comes back while they live: they still count.
    ok(&d, &format!("remove port address={port}"));
    ok(&d, &format!("add port address={port}"));
    assert!(closed_at_once(d.addr), "the port added back admitted a connection past the limit of 2");
    // Once they close, their places are free again.
    drop(held);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while closed_at_once(d.addr) {
        assert!(std::time::Instant::now() < deadline, "the places of closed connections were never given back");
        std::thread::sleep(Duration::from_millis(100));
    }
    d.assert_alive();
}

#[test]
fn objects_in_use_are_not_pulled_from_under_a_connected_host() {
    let mut d = start("in-use", &[]);
    let addr = d.addr;
    block_on(bounded(30, async {
        let opts = Options { io_queues: 1, queue_size: 16, ..Options::default() };
        let mut c = Controller::connect(addr, NQN, HOST, opts).await.expect("connect");
        let e = refused(&d, &format!("remove subsystem nqn={NQN}"));
        assert!(e.contains("1 controller(s) connected"), "{e}");
        let e = refused(&d, "set device name=r0 size=2MiB");
        assert!(e.contains(&format!("namespace 1 of {NQN}")) && e.contains(&format!("LUN 0 of {IQN}")), "{e}");
        // A port whose listener stops keeps the connections it accepted.
        let port = format!("127.0.0.1:{}", addr.port());
        ok(&d, &format!("remove port address={port}"));
        assert!(TcpStream::connect(addr).is_err(), "the removed port still accepts");
        c.write(0, 1, 0, vec![1; 512]).await.expect("I/O after the port was removed");
        ok(&d, &format!("add port address={port}"));
        TcpStream::connect(addr).expect("the port added back listens");
    }));
    d.assert_alive();
}

/// A file device with a size (namespace 1, LUN 0) and one without (its
/// file's length; namespace 2), 512-byte blocks.
fn growing(dir: &Path, port: u16, iscsi_port: u16) -> String {
    std::fs::write(dir.join("g.img"), vec![0u8; 1 << 20]).expect("g.img");
    format!(
        "[[device]]\nname = \"f\"\nkind = \"file\"\npath = \"{dir}/f.img\"\nsize = \"1MiB\"\n\n\
         [[device]]\nname = \"g\"\nkind = \"file\"\npath = \"{dir}/g.img\"\n\n\
         [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nnsid = 1\ndevice = \"f\"\n[[subsystem.namespace]]\nnsid = 2\ndevice = \"g\"\n\n\
         [[port]]\naddress = \"127.0.0.1:{port}\"\n\n\
         [[port]]\ntransport = \"iscsi\"\naddress = \"127.0.0.1:{iscsi_port}\"\n\n\
         [[iscsi_target]]\niqn = \"{IQN}\"\nallow_any_initiator = true\n[[iscsi_target.lun]]\ndevice = \"f\"\n\n\
         [reactor]\ncores = [0]\n\n[control]\nallow_paths = [\"{dir}/\"]\n",
        dir = dir.display()
    )
}

/// Two file devices with a size, namespaces 1 and 2; `f_size` and
/// `h_size` as the config says them.
fn two_files(dir: &Path, port: u16, f_size: &str, h_size: &str) -> String {
    format!(
        "[[device]]\nname = \"f\"\nkind = \"file\"\npath = \"{dir}/f.img\"\nsize = \"{f_size}\"\n\n\
         [[device]]\nname = \"h\"\nkind = \"file\"\npath = \"{dir}/h.img\"\nsize = \"{h_size}\"\n\n\
         [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nnsid = 1\ndevice = \"f\"\n[[subsystem.namespace]]\nnsid = 2\ndevice = \"h\"\n\n\
         [[port]]\naddress = \"127.0.0.1:{port}\"\n\n[reactor]\ncores = [0]\n",
        dir = dir.display()
    )
}

#[test]
fn a_reload_that_cannot_grow_every_device_grows_none() {
    let mut d = Daemon::start_with("rt-grow2", |dir, port| two_files(dir, port, "1MiB", "1MiB"));
    let file = d.dir.join("ironwire.toml");
    const MIB: u64 = 1 << 20;
    block_on(bounded(30, async {
        let mut c = Controller::connect(d.addr, NQN, HOST, Options::default()).await.expect("connect");
        // f can grow; h's new size (about 1 EiB, below what TOML and off_t
        // hold) is past what ext4, the test directory's file system, lets
        // a file be (16 TiB): extending its file fails after f's was.
        std::fs::write(&file, two_files(&d.dir, d.addr.port(), "2MiB", "1000000TiB")).expect("write config");
        let e = refused(&d, "reload");
        assert!(e.contains("device h: growing to"), "{e}");
        assert_eq!(c.identify_namespace(1).await.expect("identify").size_bytes(), MIB, "f took its new size");
        assert!(c.read(0, 1, MIB / 512, 1).await.is_err(), "f reads past its configured end");
        assert_eq!(show(&d)["config"]["device"][0]["size"], MIB, "the configuration in force changed");

        // The same change without h's: f grows.
        std::fs::write(&file, two_files(&d.dir, d.addr.port(), "2MiB", "1MiB")).expect("write config");
        ok(&d, "reload");
        assert_eq!(c.identify_namespace(1).await.expect("identify").size_bytes(), 2 * MIB);
        c.read(0, 1, 2 * MIB / 512 - 1, 1).await.expect("read at f's new end");
    }));
    d.assert_alive();
}

#[test]
fn devices_in_use_grow_and_the_hosts_of_both_protocols_are_told() {
    use initiator::iscsi::{cdb, LoginOptions, Session};
    use nvme_spec::opcode::{Admin, FeatureId};
    let iscsi_port = free_port();
    let mut d = Daemon::start_args("rt-grow", &[], move |dir, port| growing(dir, port, iscsi_port));
    let portal = SocketAddr::from(([127, 0, 0, 1], iscsi_port));
    const MIB: u64 = 1 << 20;
    block_on(bounded(60, async {
        let login = LoginOptions::new("iqn.2026-11.io.ironwire:rt-initiator", Some(IQN));
        let mut s = Session::connect(portal, login).await.expect("login");
        s.clear_unit_attentions(0).await.expect("clear unit attentions");
        let mut c = Controller::connect(d.addr, NQN, HOST, Options::default()).await.expect("connect");
        let aen = initiator::cmd::set_features(FeatureId::ASYNC_EVENT_CONFIG, 1 << 8);
        c.admin_command(aen, Vec::new(), 0).await.expect("enable namespace-attribute events");
        let aer = nvme_spec::Sqe { opcode: Admin::ASYNC_EVENT_REQUEST.0, ..Default::default() };
        c.admin().submit(aer, Vec::new(), 0).expect("submit AER");
        c.admin().flush().await.expect("send AER");

        let e = refused(&d, "set device name=f size=512KiB");
        assert!(e.contains("cannot shrink"), "{e}");
        let e = refused(&d, "set device name=f block_size=4096");
        assert!(e.contains("only a null or file device's size may grow"), "{e}");
        ok(&d, "set device name=f size=2MiB");
        assert_eq!(std::fs::metadata(d.dir.join("f.img")).expect("stat").len(), 2 * MIB, "the file was extended");

        // NVMe: the event, Identify the new size, I/O past the old end.
        let ev = c.admin().next_completion().await.expect("the namespace-attribute-changed event");
        assert_eq!(ev.cqe.dw0.get(), nvme_spec::log::AEN_NS_CHANGED);
        assert_eq!(c.identify_namespace(1).await.expect("identify").size_bytes(), 2 * MIB);
        c.write(0, 1, 2 * MIB / 512 - 1, vec![0x5a; 512]).await.expect("write at the new end");

        // iSCSI: CAPACITY DATA HAS CHANGED, then READ CAPACITY the new size.
        let r = s.scsi(0, &cdb::test_unit_ready(), Vec::new(), 0).await.expect("tur");
        let sense = r.sense_code().expect("a unit attention");
        assert_eq!((sense.key, sense.asc, sense.ascq), (0x06, 0x2a, 0x09), "CAPACITY DATA HAS CHANGED");
        let cap = s.read_capacity16(0).await.expect("read capacity");
        assert_eq!(cap.blocks * u64::from(cap.block_len), 2 * MIB);
        assert!(s.read16(0, 2 * MIB / 512 - 1, 1, 512).await.expect("read") == vec![0x5a; 512]);

        // Reading the changed namespace list re-arms the event.
        let list = c.get_log_page(0x04, 4096, 0).await.expect("changed namespace list");
        assert_eq!(&list[..8], &[1, 0, 0, 0, 0, 0, 0, 0], "namespace 1 alone");

        // A device sized by its file follows it (checked once a second).
        c.admin().submit(aer, Vec::new(), 0).expect("submit AER");
        c.admin().flush().await.expect("send AER");
        let g = std::fs::OpenOptions::new().write(true).open(d.dir.join("g.img")).expect("open g.img");
        g.set_len(3 * MIB).expect("grow g.img");
        let ev = c.admin().next_completion().await.expect("the event for namespace 2");
        assert_eq!(ev.cqe.dw0.get(), nvme_spec::log::AEN_NS_CHANGED);
        assert_eq!(c.identify_namespace(2).await.expect("identify").size_bytes(), 3 * MIB);
        c.write(0, 2, 3 * MIB / 512 - 1, vec![1; 512]).await.expect("write at g's new end");
        s.logout().await.expect("logout");
    }));
    d.assert_alive();
}

/// Removing a namespace with a write in flight: `ctl` returns once the
/// write is answered and on the file, and the queues (the one that wrote,
/// idle since) let go of the device, whose file then closes when the
/// device is removed too. Meanwhile `show` is answered at once (the
/// removal in force), and changes sent then (the device's removal among
/// them) wait for the removal's end and are checked against its result.
#[test]
fn removing_a_namespace_waits_for_its_writes_and_idle_queues_let_go_of_it() {
    const SLOW_WRITE_MS: u64 = 2000;
    let d = Daemon::start_args("rt-ns-drain", &[], |dir, port| {
        format!(
            "[[device]]\nname = \"r0\"\nkind = \"ram\"\nsize = \"1MiB\"\n\n\
             [[device]]\nname = \"slow\"\nkind = \"file\"\npath = \"{}\"\nsize = \"1MiB\"\n\
             write_latency_us = {}\n\n\
             [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n\
             [[subsystem.namespace]]\ndevice = \"r0\"\n[[subsystem.namespace]]\ndevice = \"slow\"\n\n\
             [[port]]\naddress = \"127.0.0.1:{port}\"\n\n[reactor]\ncores = [0]\n",
            dir.join("slow.img").display(),
            SLOW_WRITE_MS * 1000
        )
    });
    let file = d.dir.join("slow.img");
    let open_fds = |pid: u32| common::open_fds(pid, &file);
    let pid = d.pid();
    let addr = d.addr;
    let sock = d.dir.join("ctl.sock");
    block_on(bounded(30, async {
        let opts = Options { io_queues: 1, queue_size: 16, ..Options::default() };
        let mut c = Controller::connect(addr, NQN, HOST, opts).await.expect("connect");
        let data = vec![0xc3; 512];
        let q = c.io_queue(0).expect("queue");
        q.submit(initiator::cmd::write(2, 5, 1), data.clone(), 0).expect("submit the write");
        let busy_sock = sock.clone();
        let remover = std::thread::spawn(move || {
            // Waits until the target runs the write: the I/O queue holds
            // namespace 2 from its first command of it on (`held` in
            // show --json).
            for tries in 0.. {
                let v: serde_json::Value =
                    serde_json::from_str(&common::ctl(&busy_sock, &["show", "--json"]).expect("show")).expect("JSON");
                match v["live"]["subsystems"][0]["namespaces"][1]["held"].as_u64() {
                    Some(1) => break,
                    _ if tries == 3000 => panic!("the write never showed as running on namespace 2"),
                    _ => std::thread::sleep(Duration::from_millis(10)),
                }
            }
            // While the removal waits for the write: `show` answers before
            // the write lands, with the namespace already gone. Changes
            // sent then (removing the namespace's device, adding three
            // others) are checked against what the removal leaves and
            // return only after it did, with the write on the file.
            let watch_sock = busy_sock.clone();
            let observer = std::thread::spawn(move || {
                let on_file = || std::fs::read(watch_sock.with_file_name("slow.img")).expect("read the file");
                for tries in 0.. {
                    let shown = common::ctl(&watch_sock, &["show", "--json"]).expect("show during the removal");
                    let v: serde_json::Value = serde_json::from_str(&shown).expect("JSON");
                    match v["live"]["subsystems"][0]["namespaces"].as_array().map(Vec::len) {
                        Some(1) => break,
                        _ if tries == 3000 => panic!("the removal never came into force: {shown}"),
                        _ => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
                let at_show = on_file()[5 * 512..6 * 512].to_vec();
                let mut words = vec![vec!["remove".to_string(), "device".into(), "name=slow".into()]];
                words.extend((0..3).map(|i| {
                    vec!["add".into(), "device".into(), format!("name=x{i}"), "kind=null".into(), "size=1MiB".into()]
                }));
                let changes: Vec<_> = words
                    .into_iter()
                    .map(|w| {
                        let sock = watch_sock.clone();
                        std::thread::spawn(move || {
                            let w: Vec<&str> = w.iter().map(String::as_str).collect();
                            let r = common::ctl(&sock, &w);
                            let on_file = std::fs::read(sock.with_file_name("slow.img")).expect("read the file");
                            (w.join(" "), r, on_file[5 * 512..6 * 512].to_vec())
                        })
                    })
                    .collect();
                (at_show, changes.into_iter().map(|t| t.join().expect("change thread")).collect::<Vec<_>>())
            });
            let r = common::ctl(&busy_sock, &["remove", "namespace", &format!("nqn={NQN}"), "nsid=2"]);
            let on_file = std::fs::read(busy_sock.with_file_name("slow.img")).expect("read the file");
            let (at_show, changes) = observer.join().expect("observer thread");
            assert!(at_show != vec![0xc3; 512], "show waited for the removal, which waited for the write");
            for (what, r, at_return) in changes {
                r.unwrap_or_else(|e| panic!("`{what}` sent during the removal's wait: {e}"));
                assert_eq!(at_return, vec![0xc3; 512], "`{what}` returned before the removal's wait ended");
            }
            (r, on_file[5 * 512..6 * 512].to_vec())
        });
        let done = q.next_completion().await.expect("the write in flight is answered");
        assert!(done.cqe.status().is_success(), "the write in flight at the removal: {:?}", done.cqe.status());
        let (removed, on_file) = remover.join().expect("ctl thread");
        removed.expect("ctl remove namespace with a write in flight");
        assert_eq!(on_file, data, "ctl returned before the write in flight reached the file");
        // The device went too (removed during the wait); nothing holds its
        // file open: the I/O queue, idle since its write, let go of
        // namespace 2 when the removal rang it.
        // The ring is answered on the reactor; give it a moment (bounded).
        let mut open = open_fds(pid);
        for _ in 0..500 {
            if open == 0 {
                break;
            }
            reactor::sleep(Duration::from_millis(10)).await;
            open = open_fds(pid);
        }
        assert_eq!(open, 0, "the removed device's file is still open");
        assert!(c.read(0, 2, 5, 1).await.is_err(), "namespace 2 after its removal");
        assert_eq!(c.read(0, 1, 0, 1).await.expect("namespace 1 carries on").len(), 512);
    }));
}

/// Removing a subsystem once its controller is gone (the host closed the
/// admin queue) while an I/O queue still runs a write of it: `ctl`
/// returns only once that write is on the file, though the I/O queue
/// itself stays connected.
#[test]
fn removing_a_subsystem_waits_for_the_writes_of_a_gone_controllers_queues() {
    const SLOW_WRITE_MS: u64 = 1500;
    let d = Daemon::start_args("rt-sub-drain", &[], |dir, port| {
        format!(
            "[[device]]\nname = \"slow\"\nkind = \"file\"\npath = \"{}\"\nsize = \"1MiB\"\n\
             write_latency_us = {}\n\n\
             [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n\
             [[subsystem.namespace]]\ndevice = \"slow\"\n\n\
             [[port]]\naddress = \"127.0.0.1:{port}\"\n\n[reactor]\ncores = [0]\n",
            dir.join("slow.img").display(),
            SLOW_WRITE_MS * 1000
        )
    });
    let file = d.dir.join("slow.img");
    let addr = d.addr;
    let sock = d.dir.join("ctl.sock");
    let show = |sock: &Path| -> serde_json::Value {
        serde_json::from_str(&common::ctl(sock, &["show", "--json"]).expect("show")).expect("JSON")
    };
    block_on(bounded(30, async {
        let opts = Options { io_queues: 1, queue_size: 16, ..Options::default() };
        let mut c = Controller::connect(addr, NQN, HOST, opts).await.expect("connect");
        let mut io = c.take_io_queues();
        let data = vec![0xc3; 512];
        io[0].submit(initiator::cmd::write(1, 5, 1), data.clone(), 0).expect("submit the write");
        io[0].flush().await.expect("send");
        // The write runs once the I/O queue holds the namespace (its
        // first command of it).
        let mut running = false;
        for _ in 0..300 {
            if show(&sock)["live"]["subsystems"][0]["namespaces"][0]["held"].as_u64() == Some(1) {
                running = true;
                break;
            }
            reactor::sleep(Duration::from_millis(10)).await;
        }
        assert!(running, "the write never reached the target");
        // The admin connection closes: the controller is gone, its I/O
        // queue stays with the write running.
        drop(c);
        let mut gone = false;
        for _ in 0..300 {
            if show(&sock)["live"]["subsystems"][0]["controllers"].as_u64() == Some(0) {
                gone = true;
                break;
            }
            reactor::sleep(Duration::from_millis(10)).await;
        }
        assert!(gone, "the controller outlived its admin queue");
        common::ctl(&sock, &["remove", "subsystem", &format!("nqn={NQN}")]).expect("ctl remove subsystem");
        let on_file = std::fs::read(&file).expect("read")[5 * 512..6 * 512].to_vec();
        assert_eq!(on_file, data, "ctl returned before the write in flight reached the file");
        drop(io);
    }));
}

/// A target (IQN2) and a namespace on a device whose writes take 2 s;
/// `removed` leaves both out (the target a reload removes while it waits
/// for the namespace's write), `taken` adds a port on an address in use.
fn removing_target(dir: &Path, port: u16, removed: bool, taken: Option<u16>) -> String {
    let slow = if removed { "" } else { "[[subsystem.namespace]]\nnsid = 2\ndevice = \"slow\"\n" };
    let target2 = if removed {
        String::new()
    } else {
        format!(
            "[[iscsi_target]]\niqn = \"{IQN2}\"\nallow_any_initiator = true\n[[iscsi_target.lun]]\ndevice = \"r0\"\n"
        )
    };
    let taken = taken.map(|p| format!("[[port]]\naddress = \"127.0.0.1:{p}\"\n")).unwrap_or_default();
    format!(
        "[[device]]\nname = \"r0\"\nkind = \"ram\"\nsize = \"1MiB\"\n\n\
         [[device]]\nname = \"slow\"\nkind = \"file\"\npath = \"{}\"\nsize = \"1MiB\"\nwrite_latency_us = 2000000\n\n\
         [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nnsid = 1\ndevice = \"r0\"\n{slow}\n\
         [[port]]\naddress = \"127.0.0.1:{port}\"\n\n\
         [[port]]\ntransport = \"iscsi\"\naddress = \"127.0.0.1:{}\"\n\n{taken}\n\
         [[iscsi_target]]\niqn = \"{IQN}\"\nallow_any_initiator = true\n[[iscsi_target.lun]]\ndevice = \"r0\"\n\n\
         {target2}\n[reactor]\ncores = [0]\n",
        dir.join("slow.img").display(),
        port + 1
    )
}

/// A reload that removes an iSCSI target may wait long (here for a write
/// of a namespace it removes too): the target takes no login meanwhile,
/// as a session logged in then would be left on a target that is gone
/// (docs/ctl.md: removing a target with sessions is refused). A reload
/// that fails leaves the target taking logins.
#[test]
fn a_target_a_reload_removes_takes_no_login_while_the_reload_waits() {
    use initiator::iscsi::{LoginOptions, Session};
    let d = Daemon::start_args("rt-target-closing", &[], |dir, port| removing_target(dir, port, false, None));
    let file = d.dir.join("ironwire.toml");
    let portal = SocketAddr::from(([127, 0, 0, 1], d.addr.port() + 1));
    let sock = d.dir.join("ctl.sock");
    let login = || Session::connect(portal, LoginOptions::new("iqn.2026-11.io.ironwire:rt-initiator", Some(IQN2)));
    block_on(bounded(40, async {
        // Refused (a port on an address in use): the target still takes
        // logins, and the session may log out.
        let holder = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let in_use = holder.local_addr().expect("address").port();
        std::fs::write(&file, removing_target(&d.dir, d.addr.port(), true, Some(in_use))).expect("write config");
        assert!(refused(&d, "reload").contains("cannot listen on"));
        let s = login().await.expect("login after a reload that failed");
        drop(s);
        drop(holder);
        show_idle(&d);

        let opts = Options { io_queues: 1, queue_size: 16, ..Options::default() };
        let mut c = Controller::connect(d.addr, NQN, HOST, opts).await.expect("connect");
        let q = c.io_queue(0).expect("queue");
        q.submit(initiator::cmd::write(2, 5, 1), vec![0xc3; 512], 0).expect("submit the write");
        q.flush().await.expect("send");
        let mut running = false;
        for _ in 0..300 {
            if show(&d)["live"]["subsystems"][0]["namespaces"][1]["held"].as_u64() == Some(1) {
                running = true;
                break;
            }
            reactor::sleep(Duration::from_millis(10)).await;
        }
        assert!(running, "the write never reached the target");
        std::fs::write(&file, removing_target(&d.dir, d.addr.port(), true, None)).expect("write config");
        let reload = std::thread::spawn(move || common::ctl(&sock, &["reload"]));
        // The reload is in force for the namespace and waits for its write.
        let mut waiting = false;
        for _ in 0..300 {
            if show(&d)["live"]["subsystems"][0]["namespaces"].as_array().map(Vec::len) == Some(1) {
                waiting = true;
                break;
            }
            reactor::sleep(Duration::from_millis(10)).await;
        }
        assert!(waiting, "the reload never removed the namespace");
        let during = login().await;
        let done = q.next_completion().await.expect("the write is answered");
        assert!(done.cqe.status().is_success(), "the write: {:?}", done.cqe.status());
        reload.join().expect("reload thread").expect("the reload");
        assert!(during.is_err(), "a login to the target the reload was removing was let in");
        let v = show(&d);
        assert_eq!(v["live"]["iscsi_targets"].as_array().map(Vec::len), Some(1), "{v}");
        assert!(login().await.is_err(), "a login to the removed target");
    }));
}
