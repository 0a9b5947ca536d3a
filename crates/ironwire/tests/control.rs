//! The control socket is not a back door: it lives in a directory only its
//! owner may write, is mode 0600 (0660 with `[control] group`), lets in only
//! root, the daemon's user and the group (SO_PEERCRED), bounds its clients
//! and their lines, opens only the paths `[control] allow_paths` allows, and
//! is removed on SIGTERM. Clients of another user run the real `ironwire
//! ctl` as `nobody` (uid 65534), so these tests run as root.

mod common;

use common::Daemon;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const NOBODY: u32 = 65534;

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ironwire"))
}

fn assert_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "the control socket tests switch to uid {NOBODY}: run them as root");
}

/// A configuration with one RAM device and `control` as its `[control]`
/// section.
fn config(port: u16, control: &str) -> String {
    format!(
        "[[device]]\nname = \"r\"\nkind = \"ram\"\nsize = \"1MiB\"\n\n\
         [[subsystem]]\nnqn = \"nqn.2026-11.io.ironwire:ctl\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\ndevice = \"r\"\n\n\
         [[port]]\naddress = \"127.0.0.1:{port}\"\n\n[reactor]\ncores = [0]\n\n[control]\n{control}\n"
    )
}

/// One command over the socket as this (root) process: the reply's lines,
/// `Err` with the error line.
fn ctl(socket: &Path, command: &str) -> Result<String, String> {
    let mut s = UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    // A refused client may find the socket closed before it sends: the
    // refusal is still there to read.
    let sent = s.write_all(format!("{command}\n").as_bytes()).map_err(|e| format!("send: {e}"));
    let mut out = String::new();
    for line in BufReader::new(s).lines() {
        let line = line.map_err(|e| format!("read: {e}"))?;
        if !line.starts_with("error: ") {
            sent.clone()?;
        }
        if line == "ok" {
            return Ok(out);
        }
        if let Some(e) = line.strip_prefix("error: ") {
            return Err(e.to_string());
        }
        out.push_str(&line);
        out.push('\n');
    }
    Err("closed without a reply".into())
}

/// `ironwire ctl --socket SOCKET show` run as `uid`/`gid` (no
/// supplementary groups).
fn ctl_as(uid: u32, gid: u32, socket: &Path) -> Output {
    Command::new(exe())
        .args(["ctl", "--socket"])
        .arg(socket)
        .arg("show")
        .uid(uid)
        .gid(gid)
        .stdin(Stdio::null())
        .output()
        .expect("run ironwire ctl")
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("stat").mode() & 0o7777
}

/// `ironwire serve` that must fail: its stderr (bounded wait).
fn serve_fails(dir: &Path, ctl_socket: &Path) -> String {
    std::fs::write(dir.join("fail.toml"), config(0, "")).expect("config");
    let mut child = Command::new(exe())
        .args(["serve", "--config"])
        .arg(dir.join("fail.toml"))
        .arg("--ctl-socket")
        .arg(ctl_socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ironwire");
    for _ in 0..200 {
        if let Some(status) = child.try_wait().expect("wait") {
            let mut err = String::new();
            child.stderr.take().expect("stderr").read_to_string(&mut err).expect("stderr");
            assert!(!status.success(), "serve started with control socket {}", ctl_socket.display());
            return err;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("serve kept running with control socket {}", ctl_socket.display());
}

#[test]
fn socket_is_mode_0600_and_another_user_cannot_connect() {
    assert_root();
    let d = Daemon::start_with("ctl-mode", |dir, port| {
        // Others may reach the socket's directory: only the socket's own
        // mode keeps them out.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).expect("chmod");
        config(port, "")
    });
    let sock = d.dir.join("ctl.sock");
    assert_eq!(mode(&sock), 0o600);
    assert!(ctl(&sock, "show").is_ok_and(|s| s.contains("device r ram")));
    let out = ctl_as(NOBODY, NOBODY, &sock);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Permission denied"), "{err}");
}

#[test]
fn a_peer_with_another_uid_is_refused_by_its_credentials() {
    assert_root();
    let mut d = Daemon::start_with("ctl-peer", |dir, port| {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).expect("chmod");
        config(port, "")
    });
    let sock = d.dir.join("ctl.sock");
    // An administrator's mistake opens the socket to everyone; the
    // credentials check still keeps other users out.
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).expect("chmod socket");
    let out = ctl_as(NOBODY, NOBODY, &sock);
    assert!(!out.status.success(), "nobody ran ctl show: {}", String::from_utf8_lossy(&out.stdout));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("uid 65534") && err.contains("may not use the control socket"), "{err}");
    assert!(d.log().contains("control: refused a client: uid 65534"), "{}", d.log());
    assert!(ctl(&sock, "show").is_ok(), "root is still let in");
    d.assert_alive();
}

#[test]
fn with_a_group_the_directory_is_0750_the_socket_0660_and_members_get_in() {
    assert_root();
    // The name of gid 65534 (nogroup or nobody, by distribution).
    let groups = std::fs::read_to_string("/etc/group").expect("/etc/group");
    let group = groups
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.get(2) == Some(&"65534")).then(|| f[0].to_string())
        })
        .expect("a group with gid 65534");
    let d = Daemon::start_with_config_socket("ctl-group", |dir, port| {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).expect("chmod");
        config(port, &format!("socket = \"{}/run/ctl.sock\"\ngroup = \"{group}\"", dir.display()))
    });
    let (run, sock) = (d.dir.join("run"), d.dir.join("run/ctl.sock"));
    assert_eq!((mode(&run), std::fs::metadata(&run).expect("stat").gid()), (0o750, NOBODY));
    assert_eq!((mode(&sock), std::fs::metadata(&sock).expect("stat").gid()), (0o660, NOBODY));
    let out = ctl_as(NOBODY, NOBODY, &sock);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("device r ram"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_member_only_by_a_supplementary_group_gets_in_and_a_non_member_does_not() {
    assert_root();
    let group = std::fs::read_to_string("/etc/group")
        .expect("/etc/group")
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.get(2) == Some(&"65534")).then(|| f[0].to_string())
        })
        .expect("a group with gid 65534");
    let mut d = Daemon::start_with_config_socket("ctl-supgroup", |dir, port| {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).expect("chmod");
        config(port, &format!("socket = \"{}/run/ctl.sock\"\ngroup = \"{group}\"", dir.display()))
    });
    let sock = d.dir.join("run/ctl.sock");
    // uid 65534 with primary gid 4242: in group 65534 only through its
    // supplementary groups, which the daemon learns from SO_PEERGROUPS.
    let run = |groups: &str| {
        Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "4242", "--groups", groups, "--"])
            .arg(exe())
            .args(["ctl", "--socket"])
            .arg(&sock)
            .arg("show")
            .stdin(Stdio::null())
            .output()
            .expect("run setpriv (util-linux)")
    };
    let out = run("4243,65534");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("device r ram"), "{}", String::from_utf8_lossy(&out.stderr));
    // The same user without the group: the socket's mode (0660, group
    // 65534) already keeps it out.
    let out = run("4243");
    assert!(!out.status.success(), "a non-member ran ctl show: {}", String::from_utf8_lossy(&out.stdout));
    d.assert_alive();
}

#[test]
fn without_a_group_the_configured_directory_is_created_0700() {
    let d = Daemon::start_with_config_socket("ctl-mkdir", |dir, port| {
        config(port, &format!("socket = \"{}/run/ctl.sock\"", dir.display()))
    });
    assert_eq!(mode(&d.dir.join("run")), 0o700);
    assert_eq!(mode(&d.dir.join("run/ctl.sock")), 0o600);
    assert!(ctl(&d.dir.join("run/ctl.sock"), "show").is_ok());
}

#[test]
fn a_socket_directory_others_may_write_or_own_is_refused_at_start() {
    assert_root();
    let dir = std::env::temp_dir().join(format!("ironwire-test-ctl-dirs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    // /tmp itself: world-writable (sticky or not, anyone may create there).
    let tmp_sock = Path::new("/tmp").join(format!("ironwire-test-ctl-{}.sock", std::process::id()));
    let err = serve_fails(&dir, &tmp_sock);
    assert!(err.contains("control socket directory /tmp is writable by its group or by others"), "{err}");
    assert!(!tmp_sock.exists());
    let open = dir.join("open");
    std::fs::create_dir(&open).expect("dir");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let err = serve_fails(&dir, &open.join("ctl.sock"));
    assert!(err.contains(&format!("{} is writable by its group or by others (mode 777)", open.display())), "{err}");
    let group_writable = dir.join("group");
    std::fs::create_dir(&group_writable).expect("dir");
    std::fs::set_permissions(&group_writable, std::fs::Permissions::from_mode(0o770)).expect("chmod");
    let err = serve_fails(&dir, &group_writable.join("ctl.sock"));
    assert!(err.contains("writable by its group or by others (mode 770)"), "{err}");
    let theirs = dir.join("theirs");
    std::fs::create_dir(&theirs).expect("dir");
    std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).expect("chown");
    let err = serve_fails(&dir, &theirs.join("ctl.sock"));
    assert!(err.contains(&format!("{} belongs to uid 65534", theirs.display())), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_removes_the_socket_and_exits_0() {
    let mut d = Daemon::start_with("ctl-sigterm", |_, port| config(port, ""));
    let sock = d.dir.join("ctl.sock");
    assert!(sock.exists());
    let pid = i32::try_from(d.pid()).expect("pid");
    // SAFETY: kill has no memory preconditions; pid is our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = d.wait_exit(10).expect("the daemon did not exit on SIGTERM");
    assert!(status.success(), "{status}; log:\n{}", d.log());
    assert!(!sock.exists(), "the control socket is still there");
    assert!(d.log().contains("removed the control socket"), "{}", d.log());
}

#[test]
fn device_add_without_allow_paths_adds_only_null_and_ram_devices() {
    // A file device from the configuration itself is not restricted.
    let d = Daemon::start_with("ctl-noallow", |dir, port| {
        config(port, "").replace(
            "[[subsystem]]",
            &format!(
                "[[device]]\nname = \"f\"\nkind = \"file\"\npath = \"{}/f.img\"\nsize = \"1MiB\"\n\n[[subsystem]]",
                dir.display()
            ),
        )
    });
    let sock = d.dir.join("ctl.sock");
    assert!(ctl(&sock, "show").is_ok_and(|s| s.contains("device f file")));
    let target = d.dir.join("new.img");
    let e = ctl(&sock, &format!("device-add g file path={} size=1MiB", target.display())).expect_err("file refused");
    assert!(e.contains("[control] allow_paths"), "{e}");
    assert!(!target.exists(), "the refused file was created");
    let e = ctl(&sock, "device-add h block path=/dev/null").expect_err("block refused");
    assert!(e.contains("[control] allow_paths"), "{e}");
    assert_eq!(ctl(&sock, "device-add r2 ram size=1MiB"), Ok(String::new()));
    assert_eq!(ctl(&sock, "device-add n2 null size=1MiB"), Ok(String::new()));
    // librados would read an rbd device's Ceph files: outside /etc/ceph/
    // they need allow_paths too, checked before any connection is tried.
    let conf = d.dir.join("ceph.conf");
    std::fs::write(&conf, "[global]\nmon_host = 127.0.0.1:1\n").expect("conf");
    let e = ctl(&sock, &format!("device-add v rbd pool=rbd image=i ceph_conf={}", conf.display())).expect_err("conf");
    assert!(e.contains("[control] allow_paths"), "{e}");
    let e =
        ctl(&sock, &format!("device-add v rbd pool=rbd image=i keyring={}/k", d.dir.display())).expect_err("keyring");
    assert!(e.contains("[control] allow_paths"), "{e}");
    let e = ctl(&sock, "device-add v rbd pool=rbd image=i keyring=/etc/ceph/../shadow").expect_err("dot-dot");
    assert!(e.contains("[control] allow_paths"), "{e}");
    assert!(!ctl(&sock, "show").expect("show").contains("device v "));
}

#[test]
fn device_add_opens_only_paths_allow_paths_allows_even_through_dot_dot_and_symlinks() {
    let d = Daemon::start_with("ctl-allow", |dir, port| {
        for sub in ["allowed", "outside"] {
            std::fs::create_dir_all(dir.join(sub)).expect("dir");
        }
        let control = format!("allow_paths = [\"{0}/allowed/\", \"{0}/disk?.img\"]", dir.display());
        config(port, &control)
    });
    let (dir, sock) = (d.dir.clone(), d.dir.join("ctl.sock"));
    let add =
        |name: &str, path: &Path| ctl(&sock, &format!("device-add {name} file path={} size=1MiB", path.display()));
    assert_eq!(add("a", &dir.join("allowed/a.img")), Ok(String::new()));
    assert!(dir.join("allowed/a.img").exists());
    assert_eq!(add("disk", &dir.join("disk1.img")), Ok(String::new()), "the pattern allows disk1.img");
    let refused = |name: &str, path: &Path, created: &Path| {
        let e = add(name, path).expect_err("refused");
        assert!(e.contains("outside [control] allow_paths"), "{name}: {e}");
        assert!(!created.exists(), "{name}: {} was created", created.display());
    };
    refused("b", &dir.join("outside/b.img"), &dir.join("outside/b.img"));
    refused("disk12", &dir.join("disk12.img"), &dir.join("disk12.img"));
    refused("c", &dir.join("allowed/../outside/c.img"), &dir.join("outside/c.img"));
    std::os::unix::fs::symlink(dir.join("outside"), dir.join("allowed/link")).expect("symlink");
    refused("d", &dir.join("allowed/link/d.img"), &dir.join("outside/d.img"));
    std::fs::write(dir.join("outside/secret.img"), vec![0u8; 1 << 20]).expect("file");
    std::os::unix::fs::symlink(dir.join("outside/secret.img"), dir.join("allowed/e.img")).expect("symlink");
    let e = add("e", &dir.join("allowed/e.img")).expect_err("symlink to a file outside");
    assert!(e.contains("outside [control] allow_paths"), "{e}");
    // A dangling symlink would create its target outside.
    std::os::unix::fs::symlink(dir.join("outside/f.img"), dir.join("allowed/f.img")).expect("symlink");
    assert!(add("f", &dir.join("allowed/f.img")).is_err());
    assert!(!dir.join("outside/f.img").exists());
    let shown = ctl(&sock, "show").expect("show");
    assert!(shown.contains("device a file") && shown.contains("device disk file"), "{shown}");
    for n in ["b", "c", "d", "e", "f", "disk12"] {
        assert!(!shown.contains(&format!("device {n} ")), "{shown}");
    }
}

/// Growing a file device (`set device name= size=`) extends its file, so
/// its path must be in `[control] allow_paths` as for adding one
/// (docs/ctl.md): a file the configuration file put elsewhere is not
/// extended through ctl, whether a namespace uses it (grown in place) or
/// not (opened again).
#[test]
fn growing_a_file_device_needs_its_path_in_allow_paths() {
    let d = Daemon::start_with("ctl-grow-allow", |dir, port| {
        for sub in ["allowed", "outside"] {
            std::fs::create_dir_all(dir.join(sub)).expect("dir");
        }
        let devices = format!(
            "[[device]]\nname = \"used\"\nkind = \"file\"\npath = \"{0}/outside/used.img\"\nsize = \"1MiB\"\n\n\
             [[device]]\nname = \"idle\"\nkind = \"file\"\npath = \"{0}/outside/idle.img\"\nsize = \"1MiB\"\n\n",
            dir.display()
        );
        let base = config(port, &format!("allow_paths = [\"{}/allowed/\"]", dir.display()));
        let base = base.replace("device = \"r\"\n", "device = \"r\"\n[[subsystem.namespace]]\ndevice = \"used\"\n");
        format!("{devices}{base}")
    });
    let (dir, sock) = (d.dir.clone(), d.dir.join("ctl.sock"));
    for name in ["used", "idle"] {
        let e = ctl(&sock, &format!("set device name={name} size=2MiB")).expect_err("outside allow_paths");
        assert!(e.contains("outside [control] allow_paths"), "{name}: {e}");
        let len = std::fs::metadata(dir.join(format!("outside/{name}.img"))).map(|m| m.len()).ok();
        assert_eq!(len, Some(1 << 20), "{name}: the file outside allow_paths was extended");
    }
    let shown = ctl(&sock, "show").expect("show");
    assert!(
        shown.contains("device used file blocks=2048") && shown.contains("device idle file blocks=2048"),
        "{shown}"
    );
}

#[test]
fn device_add_refuses_a_symlinked_directory_and_opens_allowed_paths_as_resolved() {
    let mut d = Daemon::start_with("ctl-nosym", |dir, port| {
        for sub in ["real", "outside"] {
            std::fs::create_dir_all(dir.join(sub)).expect("dir");
        }
        // The allowed directory is itself reached through a symlink; `sub`
        // inside it leads outside.
        std::os::unix::fs::symlink(dir.join("real"), dir.join("allowed")).expect("symlink");
        std::os::unix::fs::symlink(dir.join("outside"), dir.join("real/sub")).expect("symlink");
        std::fs::write(dir.join("real/old.img"), vec![0u8; 1 << 20]).expect("file");
        config(port, &format!("allow_paths = [\"{}/allowed/\"]", dir.display()))
    });
    let (dir, sock) = (d.dir.clone(), d.dir.join("ctl.sock"));
    let real = std::fs::canonicalize(dir.join("real")).expect("canonical");
    let add = |args: String| ctl(&sock, &format!("add device kind=file {args}"));
    let e = add(format!("name=s path={}/allowed/sub/f.img size=1MiB", dir.display())).expect_err("symlinked directory");
    assert!(e.contains("outside [control] allow_paths"), "{e}");
    assert!(!dir.join("outside/f.img").exists(), "created outside");
    // Allowed paths open with symlinks refused, by their resolved form:
    // a new file and an existing one.
    assert_eq!(add(format!("name=a path={}/allowed/a.img size=1MiB", dir.display())), Ok(String::new()));
    assert_eq!(std::fs::metadata(real.join("a.img")).map(|m| m.len()).ok(), Some(1 << 20));
    assert_eq!(add(format!("name=b path={}/allowed/old.img", dir.display())), Ok(String::new()));
    let shown = ctl(&sock, "show").expect("show");
    assert!(shown.contains("device a file blocks=2048") && shown.contains("device b file blocks=2048"), "{shown}");
    // The configuration records the real path and nothing else new.
    let saved = ctl(&sock, "save").expect("save");
    for want in [real.join("a.img"), real.join("old.img")] {
        assert!(saved.contains(&format!("path = \"{}\"", want.display())), "{saved}");
    }
    let json = ctl(&sock, "show --json").expect("show --json");
    for text in [&saved, &json] {
        assert!(!text.contains("/proc/") && !text.to_lowercase().contains("symlink"), "{text}");
    }
    d.assert_alive();
}

#[test]
fn an_endless_line_is_cut_off_without_growing_the_daemon() {
    let mut d = Daemon::start_with("ctl-line", |_, port| config(port, ""));
    let sock = d.dir.join("ctl.sock");
    let s = UnixStream::connect(&sock).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut w = s.try_clone().expect("clone");
    const TOTAL: usize = 64 << 20;
    let writer = std::thread::spawn(move || {
        let chunk = vec![b'x'; 64 << 10];
        let mut sent = 0;
        while sent < TOTAL {
            if w.write_all(&chunk).is_err() {
                break;
            }
            sent += chunk.len();
        }
        sent
    });
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply).expect("a reply line");
    assert_eq!(reply, "error: command line longer than 8192 bytes\n");
    let sent = writer.join().expect("writer");
    assert!(sent < TOTAL, "the daemon read all {TOTAL} bytes of one line");
    assert!(d.log().contains("longer than 8192 bytes"), "{}", d.log());
    assert!(ctl(&sock, "show").is_ok());
    d.assert_alive();
}

#[test]
fn at_most_16_clients_at_once_and_a_freed_place_is_reused() {
    let d = Daemon::start_with("ctl-clients", |_, port| config(port, ""));
    let sock = d.dir.join("ctl.sock");
    let mut held = Vec::new();
    for _ in 0..16 {
        let mut s = UnixStream::connect(&sock).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        s.write_all(b"stats\n").expect("send");
        let mut r = BufReader::new(s.try_clone().expect("clone"));
        // Served: the reply ends with ok.
        let mut line = String::new();
        while line != "ok\n" {
            line.clear();
            assert_ne!(r.read_line(&mut line).expect("reply"), 0, "closed before ok");
        }
        held.push(s);
    }
    assert_eq!(ctl(&sock, "show"), Err("too many control clients (at most 16 at once)".into()));
    assert!(d.log().contains("refused a client: already 16 control clients"), "{}", d.log());
    drop(held.pop());
    // The daemon frees the place when it sees the close; retry (bounded).
    let again = (0..100).find_map(|_| {
        let r = ctl(&sock, "show");
        if r.is_err() {
            std::thread::sleep(Duration::from_millis(50));
        }
        r.ok()
    });
    assert!(again.is_some(), "no place freed after a client left");
}

/// Sends `line` (any bytes, its newline included) on `s` and returns the
/// reply through its `ok` or `error:` line.
fn exchange(s: &mut BufReader<UnixStream>, line: &[u8]) -> String {
    s.get_mut().write_all(line).expect("send");
    let mut reply = String::new();
    while !reply.ends_with("ok\n") && !reply.contains("error: ") {
        assert_ne!(s.read_line(&mut reply).expect("reply"), 0, "closed after {reply:?}");
    }
    reply
}

#[test]
fn bad_lines_are_refused_naming_the_word_logged_and_the_client_served_on() {
    let d = Daemon::start_with("ctl-bad", |_, port| config(port, ""));
    let s = UnixStream::connect(d.dir.join("ctl.sock")).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut s = BufReader::new(s);
    assert_eq!(exchange(&mut s, b"\n"), "error: empty command\n");
    assert_eq!(exchange(&mut s, b" \t \n"), "error: empty command\n");
    assert_eq!(exchange(&mut s, b"show \xff\xfe\n"), "error: the command is not UTF-8\n");
    for (line, word) in [
        ("frobnicate", "frobnicate"),
        ("add gizmo name=x", "gizmo"),
        ("set device name=r frobkey=1", "frobkey"),
        ("save /tmp/ironwire-ctl-never-written", "save"),
    ] {
        let reply = exchange(&mut s, format!("{line}\n").as_bytes());
        assert!(reply.starts_with("error: ") && reply.contains(word), "{line}: {reply:?}");
    }
    assert!(!Path::new("/tmp/ironwire-ctl-never-written").exists(), "the daemon wrote a file a client named");
    // Still served, and the configuration unchanged.
    assert!(exchange(&mut s, b"show\n").starts_with("device r ram "));
    let log = d.log();
    for why in ["empty command", "not UTF-8", "frobnicate", "gizmo", "frobkey"] {
        assert!(log.lines().any(|l| l.contains("control: refused") && l.contains(why)), "{why} not logged:\n{log}");
    }
}

#[test]
fn changes_from_two_clients_at_once_are_made_one_after_the_other() {
    let d = Daemon::start_with("ctl-race", |_, port| config(port, ""));
    let sock = d.dir.join("ctl.sock");
    let clients: Vec<_> = (0..2)
        .map(|c| {
            let sock = sock.clone();
            std::thread::spawn(move || {
                for i in 0..5 {
                    ctl(&sock, &format!("add device name=d{c}{i} kind=ram size=1MiB")).expect("add device");
                    // No nsid: each takes the lowest free one in its turn.
                    ctl(&sock, &format!("add namespace nqn=nqn.2026-11.io.ironwire:ctl device=d{c}{i}"))
                        .expect("add namespace");
                }
            })
        })
        .collect();
    for c in clients {
        c.join().expect("client");
    }
    let shown: serde_json::Value = serde_json::from_str(&ctl(&sock, "show --json").expect("show")).expect("json");
    let mut nsids: Vec<u64> = shown["live"]["subsystems"][0]["namespaces"]
        .as_array()
        .expect("namespaces")
        .iter()
        .filter_map(|n| n["nsid"].as_u64())
        .collect();
    nsids.sort_unstable();
    assert_eq!(nsids, (1..=11).collect::<Vec<u64>>(), "{shown}");
}
