//! The control plane: a Unix-socket API that edits the running target
//! (every object the configuration file declares, docs/ctl.md), reloads
//! the configuration file, and shows and saves the running configuration.
//!
//! One request per line, one reply: lines of output ending with `ok`, or a
//! single `error: ...` line. It runs on its own thread with blocking I/O and
//! takes the object model's locks; reactors never wait on it.
//!
//! Access to the socket must not be root-equivalent: the socket lives in a
//! directory only its owner can write, is mode 0600 (0660 with `[control]
//! group`), each client's credentials are checked (SO_PEERCRED, and
//! SO_PEERGROUPS for its supplementary groups as of connect), clients
//! and line lengths are bounded, a device added or changed by ctl opens
//! only paths that `[control] allow_paths` allows, and `save FILE` is
//! written by the client, as the client's user. The socket file is removed
//! on exit.

use crate::config::Config;
use crate::nvme::Target;
use crate::runtime::Live;
use anyhow::{anyhow, bail, Context, Result};
use blockdev::BlockDevice;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Control clients served at once; more are refused with an error line.
const MAX_CLIENTS: usize = 16;
/// The longest command line (a path may take 4096 bytes); a longer one is
/// answered with an error and the client is closed.
const MAX_LINE: usize = 8192;
/// How long a reply may wait for a client that does not read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Shared state the control plane edits.
pub struct Control {
    /// The target.
    pub target: Arc<Target>,
    /// `[control] allow_paths`: what a device added by ctl may open.
    pub allow_paths: Vec<String>,
    /// The running configuration and the live objects it describes. A
    /// change holds this lock only to read the configuration and to put
    /// its result in place: reading commands (`show`, `save`) are answered
    /// while a change waits for what it removed.
    pub state: Mutex<State>,
    /// Serializes changes and reloads: each holds it from the moment it
    /// applies to the end of its waits for the commands still running on
    /// what it removed, so a later change (re-adding a device, a namespace
    /// on it) starts only once nothing of the removed objects reaches a
    /// device any more.
    pub changes: Mutex<()>,
    /// `serve --config`: what `reload` re-reads.
    pub config_path: Option<PathBuf>,
    /// `serve --persist`: rewrite `config_path` after every change.
    pub persist: bool,
    /// `serve --cores`, which overrides `[reactor] cores` on reload too.
    pub cores: Vec<usize>,
}

/// The running configuration (normalized: every NSID and LUN written out)
/// and the live objects.
pub struct State {
    /// The running configuration.
    pub config: Config,
    /// What it describes.
    pub live: Live,
}

/// Changes are refused once the daemon stops: the reactors no longer
/// take port changes, and the stop's last flush must see every device.
fn refuse_while_stopping() -> Result<()> {
    if crate::lifecycle::draining() {
        bail!("the daemon is stopping; no change is made now");
    }
    Ok(())
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The socket path when neither `[control] socket` nor a flag names one:
/// `/run/ironwire/ctl.sock` as root, `$XDG_RUNTIME_DIR/ironwire/ctl.sock`
/// otherwise.
pub fn default_socket() -> Result<PathBuf> {
    if euid() == 0 {
        return Ok(PathBuf::from("/run/ironwire/ctl.sock"));
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => Ok(PathBuf::from(d).join("ironwire/ctl.sock")),
        _ => bail!(
            "XDG_RUNTIME_DIR is not set and ironwire does not run as root, so there is no default control socket; \
             name one with [control] socket or `serve --ctl-socket PATH` (and `ctl --socket PATH`)"
        ),
    }
}

/// The bound control socket. Its file is removed when this drops (a start
/// that fails later) and when a stop ends (`lifecycle`).
pub struct Socket {
    path: PathBuf,
}

impl Socket {
    /// The socket file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Creates the socket's directory if it is missing (0700, or 0750 owned by
/// `gid`) and refuses one that another user owns or others may write: there
/// anyone could replace the socket with their own.
fn prepare_dir(dir: &Path, socket: &std::ffi::OsStr, gid: Option<u32>) -> Result<()> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating control socket directory {}", dir.display()))?;
        if let Some(g) = gid {
            std::os::unix::fs::chown(dir, None, Some(g))
                .with_context(|| format!("giving {} to group {g}", dir.display()))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750))?;
        }
    }
    let m = std::fs::metadata(dir).with_context(|| format!("control socket directory {}", dir.display()))?;
    if !m.is_dir() {
        bail!("control socket directory {} is not a directory", dir.display());
    }
    let hint = "use a directory only ironwire's user can write ([control] socket or serve --ctl-socket)";
    if m.uid() != euid() {
        bail!(
            "control socket directory {} belongs to uid {}, not to this process's uid {}; {hint}",
            dir.display(),
            m.uid(),
            euid()
        );
    }
    if m.mode() & 0o022 != 0 {
        bail!(
            "control socket directory {} is writable by its group or by others (mode {:o}); {hint}",
            dir.display(),
            m.mode() & 0o7777
        );
    }
    // A directory made for the socket before (systemd's RuntimeDirectory=,
    // 0700) must let the group through to it too. Only one that holds
    // nothing else: a directory with other files (a home directory) is
    // not opened to the group.
    let only_the_socket =
        || std::fs::read_dir(dir).is_ok_and(|mut entries| entries.all(|e| e.is_ok_and(|e| e.file_name() == socket)));
    if let Some(g) = gid.filter(|&g| m.gid() != g || m.mode() & 0o050 != 0o050) {
        if !only_the_socket() {
            log::warn!(
                "control socket directory {} holds other files: not given to group {g}; members may not reach the socket",
                dir.display()
            );
            return Ok(());
        }
        std::os::unix::fs::chown(dir, None, Some(g))
            .with_context(|| format!("giving {} to group {g}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode((m.mode() & 0o7777) | 0o050))?;
        log::info!("control socket directory {}: given to group {g}, mode 0750", dir.display());
    }
    Ok(())
}

/// Serves the control socket at `path` on a new thread; `group` lets that
/// group's members in too.
pub fn spawn(ctl: Arc<Control>, path: &Path, group: Option<&str>) -> Result<Socket> {
    let gid = group.map(crate::config::group_id).transpose().context("[control] group")?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    prepare_dir(dir, path.file_name().unwrap_or_default(), gid)?;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            // A live daemon answers; a stale socket file is replaced.
            if UnixStream::connect(path).is_ok() {
                bail!("control socket {} is in use by another ironwire", path.display());
            }
            std::fs::remove_file(path).with_context(|| format!("removing stale {}", path.display()))?;
        }
        Ok(_) => bail!("{} exists and is not a socket; not replacing it with the control socket", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("control socket {}", path.display())),
    }
    let listener = UnixListener::bind(path).with_context(|| format!("binding control socket {}", path.display()))?;
    let socket = Socket { path: path.to_path_buf() };
    // Until this chmod the socket has the umask's mode, but the directory
    // already keeps others out and every client's credentials are checked.
    let mode = if gid.is_some() { 0o660 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", path.display()))?;
    if let Some(g) = gid {
        std::os::unix::fs::chown(path, None, Some(g))
            .with_context(|| format!("giving {} to group {g}", path.display()))?;
    }
    std::thread::Builder::new().name("control".into()).spawn(move || accept_loop(&ctl, &listener, gid))?;
    Ok(socket)
}

/// Frees a client's place when its thread ends.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn accept_loop(ctl: &Arc<Control>, listener: &UnixListener, gid: Option<u32>) {
    let active = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and the like: back off instead of spinning.
                log::warn!("control: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
        if let Err(why) = admit(&stream, gid) {
            log::warn!("control: refused a client: {why}");
            refuse(stream, &why);
            continue;
        }
        // Only this thread adds clients, so the check and the add agree.
        if active.load(Ordering::Relaxed) >= MAX_CLIENTS {
            log::warn!("control: refused a client: already {MAX_CLIENTS} control clients");
            refuse(stream, &format!("too many control clients (at most {MAX_CLIENTS} at once)"));
            continue;
        }
        active.fetch_add(1, Ordering::Relaxed);
        let slot = Slot(active.clone());
        let ctl = ctl.clone();
        let spawned = std::thread::Builder::new().name("control-client".into()).spawn(move || {
            let _slot = slot;
            serve_client(&ctl, stream);
        });
        if let Err(e) = spawned {
            log::warn!("control: no thread for a client: {e}");
        }
    }
}

fn refuse(mut stream: UnixStream, why: &str) {
    let _ = stream.write_all(format!("error: {why}\n").as_bytes());
}

/// The kernel's record of who connected (SO_PEERCRED, taken at connect).
fn peer_credentials(stream: &UnixStream) -> std::io::Result<libc::ucred> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the fd is open for the call; cred and len are valid for
    // writes and len holds cred's size.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(cred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred)
}

/// `SO_PEERGROUPS` (`<asm-generic/socket.h>`, Linux 4.13), not exported by
/// `libc` for every target.
const SO_PEERGROUPS: libc::c_int = 59;

/// Most supplementary groups a process can have (`NGROUPS_MAX`).
const NGROUPS_MAX: usize = 65536;

/// The peer's supplementary groups as the kernel recorded them when it
/// connected (SO_PEERGROUPS), not as they are when it is checked: a process
/// that has exited or changed its groups since is judged by what it was.
fn peer_groups(stream: &UnixStream) -> std::io::Result<Vec<libc::gid_t>> {
    const GID: usize = std::mem::size_of::<libc::gid_t>();
    let mut groups: Vec<libc::gid_t> = vec![0; 32];
    loop {
        let mut len = libc::socklen_t::try_from(groups.len() * GID).unwrap_or(libc::socklen_t::MAX);
        // SAFETY: the fd is open for the call; `groups` is valid for writes
        // of `len` bytes and `len` says so.
        let r = unsafe {
            libc::getsockopt(stream.as_raw_fd(), libc::SOL_SOCKET, SO_PEERGROUPS, groups.as_mut_ptr().cast(), &mut len)
        };
        let wanted = len as usize / GID;
        if r == 0 {
            groups.truncate(wanted);
            return Ok(groups);
        }
        let err = std::io::Error::last_os_error();
        // ERANGE: the buffer was too small and `len` now says how large.
        if err.raw_os_error() == Some(libc::ERANGE) && wanted > groups.len() && wanted <= NGROUPS_MAX {
            groups.resize(wanted, 0);
            continue;
        }
        return Err(err);
    }
}

/// Lets in root, this process's user and, with `[control] group`, the
/// group's members; the error names who was refused.
fn admit(stream: &UnixStream, gid: Option<u32>) -> Result<(), String> {
    let cred = peer_credentials(stream).map_err(|e| format!("no peer credentials (SO_PEERCRED): {e}"))?;
    let me = euid();
    if cred.uid == 0 || cred.uid == me {
        return Ok(());
    }
    if let Some(g) = gid {
        let groups = peer_groups(stream).map_err(|e| format!("no peer groups (SO_PEERGROUPS): {e}"))?;
        if cred.gid == g || groups.contains(&g) {
            return Ok(());
        }
    }
    let group = gid.map(|g| format!(" and members of group {g} ([control] group)")).unwrap_or_default();
    Err(format!("uid {} (pid {}) may not use the control socket: only uid 0, uid {me}{group} may", cred.uid, cred.pid))
}

/// How long a control client has for each command line, from the end of
/// the previous one to its newline, before its connection is closed:
/// clients take one of a few places ([`MAX_CLIENTS`]), and idle ones, or
/// ones that trickle a line a byte at a time, must not keep everyone else
/// out.
const CLIENT_IDLE: Duration = Duration::from_secs(60);

/// A client's stream whose reads all end by one deadline: a read waits at
/// most until then, and none starts after it.
struct DeadlineReader {
    stream: UnixStream,
    deadline: Instant,
}

impl Read for DeadlineReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

/// Reads the next command line into `line` (cleared first), which must end
/// within `within`; reads at most one byte past [`MAX_LINE`], so a client
/// sending an endless line costs that much, not memory without bound.
/// Ok(0) at the end of the stream.
fn read_command(
    reader: &mut BufReader<DeadlineReader>,
    line: &mut Vec<u8>,
    within: Duration,
) -> std::io::Result<usize> {
    line.clear();
    reader.get_mut().deadline = Instant::now() + within;
    reader.by_ref().take(MAX_LINE as u64 + 1).read_until(b'\n', line)
}

/// `text` with the value of every `secret=` (CHAP secrets, which an error
/// may quote from the command line) replaced, for the log: the client's
/// answer may name them, the log may not.
fn redact_secrets(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("secret=") {
        let (head, tail) = rest.split_at(at + "secret=".len());
        out.push_str(head);
        out.push_str("(redacted)");
        // A quoted value runs to its closing quote (escaped as the
        // Debug form of a quoted line has it), any other to the next
        // space or quote.
        let end = match ["\\\"", "'", "\""].iter().find(|q| tail.starts_with(**q)) {
            Some(q) => tail.get(q.len()..).and_then(|t| t.find(*q)).map_or(tail.len(), |i| i + 2 * q.len()),
            None => tail.find(|c: char| c.is_whitespace() || c == '"' || c == '\'' || c == '\\').unwrap_or(tail.len()),
        };
        rest = tail.get(end..).unwrap_or_default();
    }
    out.push_str(rest);
    out
}

fn serve_client(ctl: &Control, stream: UnixStream) {
    let Ok(mut out) = stream.try_clone() else { return };
    let mut reader = BufReader::new(DeadlineReader { stream, deadline: Instant::now() });
    let mut line = Vec::new();
    loop {
        match read_command(&mut reader, &mut line, CLIENT_IDLE) {
            Ok(0) => return,
            Err(e) => {
                if matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock) {
                    log::info!(
                        "control: a client sent no whole command line in {} s; closing it",
                        CLIENT_IDLE.as_secs()
                    );
                }
                return;
            }
            Ok(_) => {}
        }
        if line.len() > MAX_LINE {
            log::warn!("control: a command line longer than {MAX_LINE} bytes; closing that client");
            refuse(out, &format!("command line longer than {MAX_LINE} bytes"));
            return;
        }
        let done = match std::str::from_utf8(&line) {
            Err(_) => Err(anyhow!("the command is not UTF-8")),
            Ok(text) => ctl.handle(text.trim()),
        };
        let reply = match done {
            Ok(text) => format!("{text}ok\n"),
            Err(e) => {
                log::warn!("control: refused a command: {}", redact_secrets(&format!("{e:#}")));
                format!("error: {e:#}\n")
            }
        };
        if out.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// How often the sizes of devices that follow their backing are re-read.
const SIZE_CHECK: Duration = Duration::from_secs(1);

/// Starts the thread that notices devices resized while exported (`rbd
/// resize`, a block device grown with `lvextend` or `losetup -c`, a file
/// device without `size` extended with `truncate -s`) and tells hosts.
/// librbd re-reads an image's header when its watch reports a change, so
/// a check is a lock and a load until then; when it does reach the cluster
/// it waits on this thread, never on a reactor. A file or block device
/// costs an fstat or an ioctl a second. The thread ends with the daemon's
/// control object.
pub fn spawn_size_watch(ctl: &Arc<Control>) -> Result<()> {
    let ctl = Arc::downgrade(ctl);
    std::thread::Builder::new()
        .name("size-watch".into())
        .spawn(move || loop {
            std::thread::sleep(SIZE_CHECK);
            match ctl.upgrade() {
                Some(ctl) => ctl.check_sizes(),
                None => return,
            }
        })
        .context("starting the device size watch")?;
    Ok(())
}

impl Control {
    /// Re-reads the size of every device whose size is its backing's and
    /// tells the hosts of each one that changed: NVMe
    /// namespace-attribute-changed events and SCSI CAPACITY DATA HAS
    /// CHANGED unit attentions.
    fn check_sizes(&self) {
        for dev in self.devices() {
            match dev.refresh_size() {
                Ok(false) => {}
                Ok(true) => crate::runtime::capacity_changed(&self.lock().live, &dev),
                Err(e) => log::debug!("device {}: cannot read its size: {e}", dev.name()),
            }
        }
    }

    /// Every device open now.
    pub fn devices(&self) -> Vec<Arc<blockdev::Device>> {
        self.lock().live.devices.values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the change in progress, if any, to end (its removals
    /// waited for) and keeps others from starting while the guard lives:
    /// the stop takes it before its last flush of every device.
    pub fn quiesce(&self) -> std::sync::MutexGuard<'_, ()> {
        self.changes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A change's or reload's turn ([`Control::quiesce`]); refused once
    /// the daemon stops.
    fn take_turn(&self) -> Result<std::sync::MutexGuard<'_, ()>> {
        let turn = self.quiesce();
        refuse_while_stopping()?;
        Ok(turn)
    }

    /// Runs one command line and returns its output.
    pub fn handle(&self, line: &str) -> Result<String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        if let Some(reply) = crate::visibility::handle(&words, stats) {
            return reply;
        }
        match words.as_slice() {
            ["show"] => Ok(self.show()),
            ["show", "--json"] => Ok(format!("{}\n", serde_json::to_string_pretty(&self.show_json())?)),
            ["save"] => Ok(toml::to_string(&self.lock().config)?),
            ["reload"] => self.reload().map(|()| String::new()),
            [verb @ ("add" | "set" | "remove"), noun, rest @ ..] => {
                let closed = self.change(|c| crate::edit::edit(c, verb, noun, rest))?;
                Ok(if closed == 0 {
                    String::new()
                } else {
                    format!("closed {closed} connection(s) of hosts no longer allowed in\n")
                })
            }
            ["disconnect", rest @ ..] => crate::visibility::disconnect(rest),
            // The first grammar, kept for scripts that use it.
            ["device-add", name, kind, rest @ ..] => {
                let mut args = vec![format!("name={name}"), format!("kind={kind}")];
                args.extend(rest.iter().map(|s| s.to_string()));
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                self.change(|c| crate::edit::edit(c, "add", "device", &args)).map(|_| String::new())
            }
            ["ns-add", nqn, nsid, device] => {
                let args = [format!("nqn={nqn}"), format!("nsid={nsid}"), format!("device={device}")];
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                self.change(|c| crate::edit::edit(c, "add", "namespace", &args)).map(|_| String::new())
            }
            ["ns-remove", nqn, nsid] => {
                let args = [format!("nqn={nqn}"), format!("nsid={nsid}")];
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                self.change(|c| crate::edit::edit(c, "remove", "namespace", &args)).map(|_| String::new())
            }
            [] => bail!("empty command"),
            _ => bail!(
                "unknown command {line:?} (show [--json] | save | reload | stats [--json] | hosts [--json] | sessions [--json] | disconnect key=value... | add|set|remove OBJECT key=value... \
                 where OBJECT is {}; see docs/ctl.md)",
                crate::edit::NOUNS
            ),
        }
    }

    /// Makes the change `f` to the running configuration: validated as
    /// `check-config` validates, device paths checked against `[control]
    /// allow_paths`, applied to the live objects, then (with `--persist`)
    /// written to the configuration file. Nothing changes on an error.
    /// The change is checked and applied in its turn ([`Control::changes`]),
    /// against what the change before it left, but without the state lock,
    /// which it takes only to put the result in place: `show` and `save`
    /// are answered while it waits for the commands still running on what
    /// it removed (up to 30 s), and show the configuration before it until
    /// it returns. rbd devices are opened out of turn, so that other ctl
    /// commands go on while a cluster is slow to answer; a change that came
    /// in meanwhile makes this one start again from it.
    /// Returns how many connections it closed: those of hosts the change
    /// no longer lets in ([`crate::runtime::enforce_access`]).
    fn change(&self, f: impl Fn(&Config) -> Result<Config>) -> Result<usize> {
        // rbd devices opened out of turn, kept across attempts: a change
        // that starts again finds them open and goes on in its turn.
        let mut preopened = crate::runtime::Preopened::new();
        for _ in 0..3 {
            let mut turn = Some(self.take_turn()?);
            let (base, new) = {
                let st = self.lock();
                (st.config.clone(), self.checked(&st.config, &f)?)
            };
            let unopened = |d: &crate::config::DeviceConfig| {
                d.kind == "rbd" && !base.device.contains(d) && preopened.get(&d.name).map(|(c, _)| c) != Some(d)
            };
            if new.device.iter().any(unopened) {
                turn = None;
                // Every device the change opens is one checked above.
                preopened = crate::runtime::preopen(&base, &new, blockdev::Symlinks::Refuse)?;
            }
            let _turn = match turn {
                Some(turn) => turn,
                None => self.take_turn()?,
            };
            let mut live = {
                let st = self.lock();
                if st.config != base {
                    continue;
                }
                st.live.clone()
            };
            let before = live.devices.clone();
            let applied = crate::runtime::apply(&mut live, &base, &new, blockdev::Symlinks::Refuse, &preopened);
            // Access lists may have changed even if a later step failed.
            let closed = crate::runtime::enforce_access(&live).len();
            applied?;
            crate::runtime::forget_removed(&new);
            // In this turn: a change after it may open the same file again.
            let flushed = crate::runtime::flush_removed(&before, &live.devices, &base, &new);
            let mut st = self.lock();
            st.live = live;
            st.config = new;
            log::info!("control: configuration changed");
            let saved = match (self.persist, &self.config_path) {
                (true, Some(path)) => {
                    let text = toml::to_string(&st.config)?;
                    drop(st);
                    write_atomic(path, text.as_bytes())
                        .with_context(|| format!("the change is live, but saving it to {} failed", path.display()))
                }
                _ => Ok(()),
            };
            flushed.context("the change is live, but a device it removed could not be flushed")?;
            saved?;
            return Ok(closed);
        }
        bail!("the configuration changed three times while this change was being prepared; try again")
    }

    /// `f` applied to `config`, normalized, validated, and its new or
    /// changed device paths checked against `[control] allow_paths` (and
    /// kept in their resolved form).
    fn checked(&self, config: &Config, f: impl FnOnce(&Config) -> Result<Config>) -> Result<Config> {
        let mut new = f(config)?;
        crate::runtime::normalize(&mut new);
        new.validate()?;
        for d in &mut new.device {
            let before = config.device.iter().find(|o| o.name == d.name);
            if before == Some(d) {
                continue;
            }
            // A new size alone extends the file (in place while a device
            // uses it, or by opening it again): its path must be allowed as
            // for adding it, but stays as it is, so the change remains a
            // growth.
            if before.is_some_and(|b| b.same_but_size(d)) {
                if let (Some(path), "file" | "block") = (&d.path, d.kind.as_str()) {
                    self.allowed_path(path)?;
                }
                continue;
            }
            match d.kind.as_str() {
                "file" | "block" => {
                    if let Some(path) = &d.path {
                        d.path = Some(self.allowed_path(path)?);
                    }
                }
                // librados reads these: a Ceph file outside /etc/ceph/
                // needs allow_paths like any other.
                "rbd" => {
                    for path in [&mut d.ceph_conf, &mut d.keyring].into_iter().flatten() {
                        if !path.starts_with(CEPH_DIR)
                            || path.components().any(|c| c == std::path::Component::ParentDir)
                        {
                            *path = self.allowed_path(path)?;
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(new)
    }

    /// Re-reads the `--config` file and applies what changed (`ctl reload`
    /// and SIGHUP). A file that does not parse or validate changes nothing.
    pub fn reload(&self) -> Result<()> {
        let path = self
            .config_path
            .as_ref()
            .ok_or_else(|| anyhow!("serve was started without --config; nothing to reload"))?;
        // In its turn, without the state lock, as a change; the file is
        // read in it, after the change before it (which `--persist` may
        // have written there).
        let _turn = self.take_turn()?;
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut new = Config::parse(&text).with_context(|| format!("in {}", path.display()))?;
        if !self.cores.is_empty() {
            new.reactor.cores = self.cores.clone();
        }
        crate::runtime::normalize(&mut new);
        let (old, mut live) = {
            let st = self.lock();
            (st.config.clone(), st.live.clone())
        };
        let before = live.devices.clone();
        let applied = crate::runtime::apply(&mut live, &old, &new, blockdev::Symlinks::Follow, &Default::default());
        crate::runtime::enforce_access(&live);
        applied.with_context(|| format!("reloading {}", path.display()))?;
        crate::runtime::forget_removed(&new);
        // The reload is in force either way; a failure is logged, naming
        // the device (`flush_all`).
        let flushed = crate::runtime::flush_removed(&before, &live.devices, &old, &new);
        let mut st = self.lock();
        st.live = live;
        st.config = new;
        log::info!("control: reloaded {}", path.display());
        if let Err(e) = flushed {
            log::error!("reloaded {}, but a device it removed could not be flushed: {e:#}", path.display());
        }
        Ok(())
    }

    fn show(&self) -> String {
        let mut out = String::new();
        let st = self.lock();
        let devices = &st.live.devices;
        let mut names: Vec<&String> = devices.keys().collect();
        names.sort();
        for n in names {
            if let Some(d) = devices.get(n) {
                let g = d.geometry();
                let ro = if d.read_only() { " read-only" } else { "" };
                out.push_str(&format!("device {n} {} blocks={} block_size={}{ro}\n", d.kind(), g.blocks, g.block_size));
            }
        }
        for p in self.target.ports() {
            out.push_str(&format!("port {} {} {}\n", p.id, p.transport.name, p.addr));
        }
        for p in st.config.port.iter().filter(|p| p.transport == "iscsi") {
            out.push_str(&format!("port iscsi {}\n", p.address));
        }
        for s in self.target.subsystems() {
            out.push_str(&format!("subsystem {} controllers={}\n", s.nqn, s.controller_count()));
            for ns in s.namespaces() {
                // One ANA group per namespace, its ID the NSID (nvmf::identify).
                out.push_str(&format!(
                    "  namespace {} device={} ana_group={} ana_state={}\n",
                    ns.nsid,
                    ns.device.name(),
                    ns.nsid,
                    crate::config::ana_state_name(ns.ana_state())
                ));
            }
        }
        for t in st.live.iscsi.targets() {
            out.push_str(&format!("target {} sessions={}\n", t.iqn, t.session_count()));
            for (n, u) in &t.units {
                out.push_str(&format!("  lun {n} device={}\n", u.lu.device.name()));
            }
        }
        out
    }

    /// The running configuration and the live objects, for `show --json`.
    fn show_json(&self) -> serde_json::Value {
        let st = self.lock();
        let mut names: Vec<&String> = st.live.devices.keys().collect();
        names.sort();
        let devices: Vec<serde_json::Value> = names
            .into_iter()
            .filter_map(|n| st.live.devices.get(n).map(|d| (n, d)))
            .map(|(n, d)| {
                let g = d.geometry();
                serde_json::json!({"name": n, "kind": d.kind().to_string(), "blocks": g.blocks, "block_size": g.block_size,
                    "read_only": d.read_only()})
            })
            .collect();
        let ports: Vec<serde_json::Value> = self
            .target
            .ports()
            .iter()
            .map(|p| {
                serde_json::json!({"transport": p.transport.name, "address": p.addr.to_string(),
                    "discovery_only": p.discovery_only})
            })
            .collect();
        let subsystems: Vec<serde_json::Value> = self
            .target
            .subsystems()
            .iter()
            .map(|s| {
                let ns: Vec<serde_json::Value> = s
                    .namespaces()
                    .iter()
                    .map(|n| {
                        serde_json::json!({"nsid": n.nsid, "device": n.device.name(), "ana_group": n.nsid,
                            "ana_state": crate::config::ana_state_name(n.ana_state()), "held": n.holders()})
                    })
                    .collect();
                serde_json::json!({"nqn": s.nqn, "serial": s.serial, "controllers": s.controller_count(), "namespaces": ns})
            })
            .collect();
        let targets: Vec<serde_json::Value> = st
            .live
            .iscsi
            .targets()
            .iter()
            .map(|t| {
                let luns: Vec<serde_json::Value> = t
                    .units
                    .iter()
                    .map(|(n, u)| serde_json::json!({"lun": n, "device": u.lu.device.name(), "busy": u.busy()}))
                    .collect();
                serde_json::json!({"iqn": t.iqn, "sessions": t.session_count(), "luns": luns})
            })
            .collect();
        serde_json::json!({
            "config": st.config,
            "live": {"devices": devices, "nvme_ports": ports, "subsystems": subsystems, "iscsi_targets": targets,
                     "iscsi_portals": crate::runtime::portals(&st.config)},
        })
    }

    /// The canonical form of `path` (no `..`, no symlinks) when `[control]
    /// allow_paths` allows it; the device is opened by that form, resolved
    /// once with symlinks refused (`blockdev::Symlinks::Refuse`), so a
    /// symlink swapped into the path after this check fails the open.
    fn allowed_path(&self, path: &Path) -> Result<PathBuf> {
        if self.allow_paths.is_empty() {
            bail!(
                "ctl may open no file but Ceph's under /etc/ceph/: {} is not allowed ([control] allow_paths is empty)",
                path.display()
            );
        }
        let canonical = canonical(path)?;
        if !self.allow_paths.iter().any(|a| allows(a, &canonical)) {
            log::warn!("control: refused device path {} ({})", path.display(), canonical.display());
            bail!("{} (resolved to {}) is outside [control] allow_paths", path.display(), canonical.display());
        }
        Ok(canonical)
    }
}

/// Ceph's own configuration directory: an rbd device added through ctl may
/// read its `ceph_conf` and `keyring` there without `[control]
/// allow_paths`.
const CEPH_DIR: &str = "/etc/ceph/";

/// `path` with symlinks and `..` resolved; a file that does not exist yet
/// (a file device creates it) resolves through its directory.
fn canonical(path: &Path) -> Result<PathBuf> {
    match std::fs::canonicalize(path) {
        Ok(p) => Ok(p),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
                bail!("{}: no such file", path.display());
            };
            let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
            let dir = std::fs::canonicalize(dir).with_context(|| format!("{}", dir.display()))?;
            let p = dir.join(name);
            // A dangling symlink would be followed when the file is created.
            if std::fs::symlink_metadata(&p).is_ok() {
                bail!("{} is a symlink to nothing", path.display());
            }
            Ok(p)
        }
        Err(e) => Err(e).with_context(|| format!("{}", path.display())),
    }
}

/// Whether the `[control] allow_paths` entry `entry` allows the canonical
/// path `path`: a directory (trailing `/`) allows anything beneath it,
/// anything else is a pattern matched against the whole path.
fn allows(entry: &str, path: &Path) -> bool {
    if entry.ends_with('/') {
        let dir = std::fs::canonicalize(entry).unwrap_or_else(|_| PathBuf::from(entry));
        path.starts_with(&dir) && path != dir
    } else {
        glob(entry.as_bytes(), path.as_os_str().as_bytes())
    }
}

/// Shell-style matching of `pattern` against `name`: `*` is any run of
/// characters and `?` one character, neither crossing a `/`. (All we need;
/// character classes and `**` would be more to document and to get wrong.)
fn glob(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.split_first(), name.split_first()) {
        (None, _) => name.is_empty(),
        (Some((b'*', rest)), next) => {
            glob(rest, name) || next.is_some_and(|(&c, tail)| c != b'/' && glob(pattern, tail))
        }
        (Some((b'?', rest)), Some((&c, tail))) => c != b'/' && glob(rest, tail),
        (Some((p, rest)), Some((c, tail))) => p == c && glob(rest, tail),
        (Some(_), None) => false,
    }
}

/// The file `path` names once its symlinks are followed, relative ones
/// from the directory of the link: the file need not exist (a link made
/// before the file it names is written through as a shell's `>` would).
fn through_links(path: &Path) -> Result<std::path::PathBuf> {
    let mut p = path.to_path_buf();
    // As the kernel's limit of links followed in one lookup.
    for _ in 0..40 {
        if !std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()) {
            return Ok(p);
        }
        let target = std::fs::read_link(&p).with_context(|| format!("{}: reading the symlink", p.display()))?;
        // An absolute target replaces the directory.
        p = p.parent().map_or_else(|| target.clone(), |d| d.join(&target));
    }
    bail!("{}: too many levels of symlinks", path.display())
}

/// Writes `bytes` to `path` so that a crash leaves either the old file or
/// the new one: a temporary file beside it, fsync, rename, fsync of the
/// directory. A temporary file a crash left behind is replaced by the
/// next write from a process with the same PID.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    // A symlink is written through: the file it names is replaced and the
    // link stays (a configuration kept elsewhere and linked into /etc).
    let resolved = through_links(path)?;
    let path = resolved.as_path();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| anyhow!("{} names no file", path.display()))?;
    let tmp = dir.join(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    let written = (|| -> std::io::Result<()> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
        // The file may hold CHAP secrets: the replacement keeps the mode
        // and owner of the file it replaces, and a new file is private.
        let was = std::fs::metadata(path).ok();
        let mode = was.as_ref().map_or(0o600, |m| m.mode() & 0o7777);
        // A file of this name was left by a process with this PID killed
        // before its rename (a container's daemon is PID 1 at every
        // start); nothing else writes it now.
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        if let Some(m) = &was {
            let new = f.metadata()?;
            if (new.uid(), new.gid()) != (m.uid(), m.gid()) {
                // Only root may give a file away; a daemon that may not
                // keeps the mode (the secrets stay as private) and says so.
                if let Err(e) = std::os::unix::fs::fchown(&f, Some(m.uid()), Some(m.gid())) {
                    log::warn!(
                        "{}: cannot keep its owner {}:{} ({e}); the new file is {}:{}",
                        path.display(),
                        m.uid(),
                        m.gid(),
                        new.uid(),
                        new.gid()
                    );
                }
            }
        }
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("writing {}", path.display()))
}

/// The daemon's CPU use since it started: the process (user and system
/// microseconds, what `ironwire bench --target-ctl` reads) and each reactor
/// thread, with the number of heap allocations it made.
fn stats() -> String {
    let mut out = crate::cpu::stats_line();
    let allocs = crate::alloc::counts();
    for (name, cpu) in crate::cpu::threads_cpu("reactor-") {
        out.push_str(&format!("thread {name} cpu_us={}", cpu.as_micros()));
        if let Some((_, n)) = allocs.iter().find(|(n, _)| *n == name) {
            out.push_str(&format!(" allocs={n}"));
        }
        out.push('\n');
    }
    out
}

/// Sends one command to the daemon at `socket` and returns its output
/// (without the final `ok`); a daemon error becomes the error.
pub fn request(socket: &Path, command: &str) -> Result<String> {
    let mut s = UnixStream::connect(socket)
        .with_context(|| format!("connecting to {} (is ironwire serve running?)", socket.display()))?;
    // A daemon that refuses this client answers and closes at once, maybe
    // before the command is sent: its answer is still there to read.
    let sent = s.write_all(format!("{command}\n").as_bytes());
    let mut reader = BufReader::new(s);
    let mut out = String::new();
    loop {
        let mut line = String::new();
        let n = reader.read_line(&mut line);
        if !line.starts_with("error: ") {
            sent.as_ref().map_err(|e| anyhow!("sending to {}: {e}", socket.display()))?;
        }
        if n? == 0 {
            bail!("daemon closed the connection");
        }
        if line == "ok\n" {
            return Ok(out);
        }
        if let Some(e) = line.strip_prefix("error: ") {
            bail!("{}", e.trim_end());
        }
        out.push_str(&line);
    }
}

/// `ironwire ctl`: sends one command to a running daemon and prints the
/// reply; fails when the daemon reports an error. `save FILE` writes the
/// running configuration to FILE here, as the calling user (the daemon
/// never writes a file a client names).
pub fn client(socket: &Path, command: &[String]) -> Result<()> {
    match command {
        [save, file] if save == "save" => {
            let text = request(socket, "save")?;
            write_atomic(Path::new(file), text.as_bytes())?;
            eprintln!("saved the running configuration to {file}");
        }
        _ => print!("{}", request(socket, &command.join(" "))?),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{glob, read_command, redact_secrets, DeadlineReader};
    use std::io::{BufReader, Write};
    use std::os::unix::net::UnixStream;
    use std::time::{Duration, Instant};

    #[test]
    fn a_client_trickling_a_line_byte_by_byte_is_cut_off_at_the_lines_deadline() {
        let (server, mut client) = UnixStream::pair().expect("pair");
        // One byte every 50 ms for 3 s: no read ever waits 300 ms, but the
        // line is not whole within 300 ms.
        let trickle = std::thread::spawn(move || {
            for _ in 0..60 {
                if client.write_all(b"x").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let mut reader = BufReader::new(DeadlineReader { stream: server, deadline: Instant::now() });
        let mut line = Vec::new();
        let start = Instant::now();
        let r = read_command(&mut reader, &mut line, Duration::from_millis(300));
        let took = start.elapsed();
        assert!(r.is_err(), "a line never finished was read: {r:?}");
        assert!(took < Duration::from_secs(2), "cut off after {took:?}, not at the line's deadline");
        drop(reader);
        trickle.join().expect("trickler");
    }

    #[test]
    fn each_command_line_gets_its_own_deadline() {
        let (server, mut client) = UnixStream::pair().expect("pair");
        let mut reader = BufReader::new(DeadlineReader { stream: server, deadline: Instant::now() });
        let mut line = Vec::new();
        client.write_all(b"show\n").expect("write");
        assert_eq!(read_command(&mut reader, &mut line, Duration::from_millis(200)).expect("first"), 5);
        std::thread::sleep(Duration::from_millis(300));
        client.write_all(b"stats\n").expect("write");
        assert_eq!(read_command(&mut reader, &mut line, Duration::from_millis(200)).expect("second"), 6);
        assert_eq!(line, b"stats\n");
    }

    #[test]
    fn secrets_quoted_in_an_error_do_not_reach_the_log() {
        let e = r#"unknown command "ad acl iqn=x chap.user=u chap.secret=hunter2hunter2 mutual_chap.secret='s p'""#;
        let r = redact_secrets(e);
        assert!(!r.contains("hunter2") && !r.contains("'s"), "{r}");
        assert!(r.contains("chap.user=u chap.secret=(redacted) mutual_chap.secret=(redacted)"), "{r}");
        assert_eq!(redact_secrets("no secrets here"), "no secrets here");
        assert_eq!(redact_secrets("secret="), "secret=(redacted)");
        let debug = format!("{:?}", r#"add acl chap.secret="a b c" x=1"#);
        assert_eq!(redact_secrets(&debug), r#""add acl chap.secret=(redacted) x=1""#);
    }

    #[test]
    fn glob_stars_and_question_marks_stay_within_one_component() {
        let m = |p: &str, n: &str| glob(p.as_bytes(), n.as_bytes());
        assert!(m("/dev/nvme*n1", "/dev/nvme0n1"));
        assert!(m("/dev/nvme*n1", "/dev/nvme12n1"));
        assert!(!m("/dev/nvme*n1", "/dev/nvme0n1p1"));
        assert!(!m("/dev/nvme*n1", "/dev/nvme0/x/n1"), "* crossed a /");
        assert!(m("/dev/sd?", "/dev/sdb"));
        assert!(!m("/dev/sd?", "/dev/sdb1"));
        assert!(!m("/dev/sd?", "/dev/sd"));
        assert!(m("/srv/img", "/srv/img"));
        assert!(!m("/srv/img", "/srv/img2"));
        assert!(m("/srv/*.img", "/srv/a.img") && !m("/srv/*.img", "/srv/a/b.img"));
    }

    /// A fresh directory with `kept/` in it, and the paths of
    /// `kept/ironwire.toml` and of `ironwire.toml` beside `kept/` (the
    /// link to make).
    fn link_dir(tag: &str) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("ironwire-test-wa-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("kept")).expect("mkdir");
        let (file, link) = (dir.join("kept/ironwire.toml"), dir.join("ironwire.toml"));
        (dir, file, link)
    }

    fn is_link(p: &std::path::Path) -> bool {
        std::fs::symlink_metadata(p).expect("link").file_type().is_symlink()
    }

    /// A configuration file linked in from elsewhere stays linked: the
    /// file the link names gets the new bytes.
    #[test]
    fn write_atomic_writes_through_a_symlink() {
        let (dir, file, link) = link_dir("link");
        std::fs::write(&file, "old\n").expect("write");
        std::os::unix::fs::symlink(&file, &link).expect("symlink");
        super::write_atomic(&link, b"new\n").expect("write through the link");
        assert!(is_link(&link), "the link was replaced");
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "new\n");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    /// A link whose file is not there yet (the configuration to be kept
    /// elsewhere, saved for the first time), or a relative one: the file
    /// it names is written, as a shell's `>` writes through it.
    #[test]
    fn write_atomic_writes_through_a_dangling_or_relative_symlink() {
        let (dir, file, link) = link_dir("dangling");
        std::os::unix::fs::symlink("kept/ironwire.toml", &link).expect("symlink");
        super::write_atomic(&link, b"first\n").expect("write through the dangling link");
        assert!(is_link(&link), "the link was replaced");
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "first\n");
        super::write_atomic(&link, b"second\n").expect("write through the relative link");
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "second\n");
        // A link to a link: the last one's file.
        let outer = dir.join("outer.toml");
        std::os::unix::fs::symlink(&link, &outer).expect("symlink");
        super::write_atomic(&outer, b"third\n").expect("write through two links");
        assert!(is_link(&link));
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "third\n");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    /// write_atomic keeps the old file's owner where it may: a daemon that
    /// is not root, writing a file it owns whose group it is not a member
    /// of (installed `-o ironwire -g root`), may not give the replacement
    /// that group, and must still write it (keeping the mode). Run as
    /// root: sets up the case and runs the inner test as uid/gid 65534
    /// with no supplementary groups.
    #[test]
    fn write_atomic_works_for_a_non_root_owner() {
        use std::os::unix::fs::PermissionsExt;
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping: needs root to set up");
            return;
        }
        let dir = std::env::temp_dir().join(format!("ironwire-test-wa-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("mkdir");
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).expect("chown dir");
        let file = dir.join("ironwire.toml");
        std::fs::write(&file, "old\n").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        // Owned by the daemon's uid, group root (not one of its groups).
        std::os::unix::fs::chown(&file, Some(65534), Some(0)).expect("chown file");
        let out = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(std::env::current_exe().expect("exe"))
            .args(["--exact", "control::tests::write_atomic_as_the_owner", "--ignored", "--nocapture"])
            .env("IRONWIRE_TEST_WA_FILE", &file)
            .output()
            .expect("setpriv");
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(out.status.success(), "write_atomic as the file's non-root owner failed:\n{text}");
    }

    /// The other half of the test above, run under `setpriv` by it.
    #[test]
    #[ignore = "run by write_atomic_works_for_a_non_root_owner as another user"]
    fn write_atomic_as_the_owner() {
        let file = std::env::var_os("IRONWIRE_TEST_WA_FILE").expect("IRONWIRE_TEST_WA_FILE");
        super::write_atomic(std::path::Path::new(&file), b"new\n").expect("write_atomic");
    }
}
