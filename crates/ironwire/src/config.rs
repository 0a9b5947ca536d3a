//! The declarative configuration: devices, NVMe subsystems with namespaces
//! and allowed hosts, ports, reactor cores. Parsed from TOML and validated
//! with errors that name the field and the reason.

use anyhow::{anyhow, bail, Context, Result};
use nvme_spec::log::AnaState;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;

/// The default subsystem NQN of the embedded configuration.
pub const DEFAULT_NQN: &str = "nqn.2026-11.io.ironwire:default";
/// The default iSCSI target name of the embedded configuration.
pub const DEFAULT_IQN: &str = "iqn.2026-11.io.ironwire:default";

/// The whole configuration file.
#[derive(Debug, Deserialize, Serialize, Default, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Block devices.
    #[serde(default)]
    pub device: Vec<DeviceConfig>,
    /// NVMe subsystems.
    #[serde(default)]
    pub subsystem: Vec<SubsystemConfig>,
    /// Listening ports.
    #[serde(default)]
    pub port: Vec<PortConfig>,
    /// Reactor threads.
    #[serde(default)]
    pub reactor: ReactorConfig,
    /// NVMe/TCP transport limits.
    #[serde(default)]
    pub nvme_tcp: NvmeTcpConfig,
    /// iSCSI targets.
    #[serde(default)]
    pub iscsi_target: Vec<IscsiTargetConfig>,
    /// iSCSI settings shared by all targets.
    #[serde(default)]
    pub iscsi: IscsiConfig,
    /// What peers may hold: connections, controllers, sessions, memory.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// How long peers may stall.
    #[serde(default)]
    pub timeouts: TimeoutsConfig,
    /// The control socket and what `ironwire ctl` may open.
    #[serde(default)]
    pub control: ControlConfig,
    /// The Prometheus endpoint (off unless `listen` is set).
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// How a stop (SIGINT, SIGTERM) drains.
    #[serde(default)]
    pub shutdown: ShutdownConfig,
}

/// How a stop drains: see `docs/operations.md`.
#[derive(Debug, Deserialize, Serialize, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ShutdownConfig {
    /// Seconds the connections have to finish after SIGINT/SIGTERM: iSCSI
    /// initiators are asked to log out within it; at its end connections
    /// that are still open stop reading commands and close once the ones
    /// they took are answered.
    #[serde(default = "default_drain_s")]
    pub drain_s: u32,
}

fn default_drain_s() -> u32 {
    10
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig { drain_s: default_drain_s() }
    }
}

/// What peers may hold. A connection over a limit is refused with a log
/// line naming the limit; every other connection keeps working.
#[derive(Debug, Deserialize, Serialize, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Live connections per listening address (all protocols on it).
    #[serde(default = "default_connections_per_port")]
    pub connections_per_port: u32,
    /// Live connections from one peer IP address, over all ports.
    #[serde(default = "default_connections_per_host")]
    pub connections_per_host: u32,
    /// Live NVMe controllers per subsystem (each takes a CNTLID).
    #[serde(default = "default_controllers_per_subsystem")]
    pub controllers_per_subsystem: u32,
    /// Live NVMe controllers of one subsystem created from one peer IP
    /// address (a share of `controllers_per_subsystem`).
    #[serde(default = "default_controllers_per_host")]
    pub controllers_per_host: u32,
    /// Live iSCSI sessions per target.
    #[serde(default = "default_sessions_per_target")]
    pub sessions_per_target: u32,
    /// Live iSCSI sessions of one target from one peer IP address (a share
    /// of `sessions_per_target`).
    #[serde(default = "default_sessions_per_host")]
    pub sessions_per_host: u32,
    /// iSCSI tasks (commands not yet answered) per session.
    #[serde(default = "default_tasks_per_session")]
    pub tasks_per_session: u32,
    /// Replies a connection may have queued before it stops reading its
    /// peer's commands (the send high-water mark).
    #[serde(default = "default_send_high_water")]
    pub send_high_water: Size,
    /// Bytes of write buffers an iSCSI connection holds for data it has
    /// yet to solicit or receive (one write always goes through).
    #[serde(default = "default_iscsi_write_budget")]
    pub iscsi_write_budget: Size,
    /// Read data one connection holds at once: file and block device reads
    /// running plus replies queued or being sent. Reads wait in arrival
    /// order; one goes through whatever its size once no other read is
    /// held and at most half of this is in replies.
    #[serde(default = "default_read_budget")]
    pub read_budget: Size,
}

fn default_connections_per_port() -> u32 {
    8192
}
fn default_connections_per_host() -> u32 {
    2048
}
fn default_controllers_per_subsystem() -> u32 {
    1024
}
fn default_sessions_per_target() -> u32 {
    2048
}
fn default_controllers_per_host() -> u32 {
    128
}
fn default_sessions_per_host() -> u32 {
    128
}
fn default_tasks_per_session() -> u32 {
    1024
}
fn default_send_high_water() -> Size {
    Size(4 << 20)
}
fn default_iscsi_write_budget() -> Size {
    Size(32 << 20)
}
fn default_read_budget() -> Size {
    Size(8 << 20)
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            connections_per_port: default_connections_per_port(),
            connections_per_host: default_connections_per_host(),
            controllers_per_subsystem: default_controllers_per_subsystem(),
            sessions_per_target: default_sessions_per_target(),
            controllers_per_host: default_controllers_per_host(),
            sessions_per_host: default_sessions_per_host(),
            tasks_per_session: default_tasks_per_session(),
            send_high_water: default_send_high_water(),
            iscsi_write_budget: default_iscsi_write_budget(),
            read_budget: default_read_budget(),
        }
    }
}

/// How long peers may stall before they are disconnected.
#[derive(Debug, Deserialize, Serialize, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TimeoutsConfig {
    /// From accept to a usable connection: the NVMe/TCP ICReq and Fabrics
    /// Connect, the MPA exchange and Connect, the iSCSI login to Full
    /// Feature Phase. Milliseconds.
    #[serde(default = "default_handshake_ms")]
    pub handshake_ms: u32,
    /// TCP_USER_TIMEOUT on every connection: how long sent data may stay
    /// unacknowledged before the kernel gives up on the peer. Milliseconds;
    /// 0 leaves the kernel default.
    #[serde(default = "default_tcp_user_timeout_ms")]
    pub tcp_user_timeout_ms: u32,
}

fn default_handshake_ms() -> u32 {
    15_000
}
fn default_tcp_user_timeout_ms() -> u32 {
    30_000
}

impl Default for TimeoutsConfig {
    fn default() -> Self {
        TimeoutsConfig { handshake_ms: default_handshake_ms(), tcp_user_timeout_ms: default_tcp_user_timeout_ms() }
    }
}

/// The control socket (`ironwire ctl`) and what it may open.
#[derive(Debug, Deserialize, Serialize, Clone, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ControlConfig {
    /// The socket's path (default: `/run/ironwire/ctl.sock` as root,
    /// `$XDG_RUNTIME_DIR/ironwire/ctl.sock` otherwise). `serve
    /// --ctl-socket` overrides it.
    #[serde(default)]
    pub socket: Option<PathBuf>,
    /// A group whose members may use the socket too (mode 0660 instead of
    /// 0600).
    #[serde(default)]
    pub group: Option<String>,
    /// Directories (a trailing `/`) or glob patterns (`/dev/nvme*n1`) of the
    /// paths a `device-add` of a file or block device may open; empty: none.
    #[serde(default)]
    pub allow_paths: Vec<String>,
}

/// The Prometheus text endpoint (`metrics.rs`).
#[derive(Debug, Deserialize, Serialize, Clone, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// `IP:PORT` to serve `GET /metrics` on; none: no endpoint.
    #[serde(default)]
    pub listen: Option<String>,
}

impl MetricsConfig {
    /// The address to listen on, if any; errors name the field.
    pub fn addr(&self) -> Result<Option<std::net::SocketAddr>> {
        self.listen
            .as_deref()
            .map(|a| a.parse().map_err(|_| anyhow::anyhow!("metrics.listen: {a:?} is not an IP:PORT address")))
            .transpose()
    }
}

/// CHAP credentials: a user name and its secret.
#[derive(Debug, Deserialize, Serialize, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ChapConfig {
    /// CHAP name.
    pub user: String,
    /// CHAP secret (12 to 255 bytes; open-iscsi refuses shorter ones).
    pub secret: String,
}

/// An iSCSI target: an IQN with LUNs pointing at devices.
#[derive(Debug, Deserialize, Serialize, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct IscsiTargetConfig {
    /// Target name (iqn. or eui. form).
    pub iqn: String,
    /// TargetAlias sent at login.
    pub alias: Option<String>,
    /// Any initiator may log in.
    #[serde(default)]
    pub allow_any_initiator: bool,
    /// Initiator names allowed when `allow_any_initiator` is false.
    #[serde(default)]
    pub initiators: Vec<String>,
    /// When set, initiators must authenticate with these CHAP credentials.
    pub chap: Option<ChapConfig>,
    /// The target's own credentials for mutual CHAP (requires `chap`).
    pub mutual_chap: Option<ChapConfig>,
    /// Per-initiator entries: each allows its initiator and may carry its
    /// own CHAP credentials, which take precedence over the target's.
    #[serde(default)]
    pub acl: Vec<AclConfig>,
    /// Logical units.
    #[serde(default)]
    pub lun: Vec<LunConfig>,
}

/// An initiator allowed into a target, with its own credentials.
#[derive(Debug, Deserialize, Serialize, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AclConfig {
    /// Initiator name.
    pub initiator: String,
    /// CHAP credentials this initiator must present.
    pub chap: Option<ChapConfig>,
    /// The target's credentials for mutual CHAP with this initiator.
    pub mutual_chap: Option<ChapConfig>,
}

/// A logical unit of an iSCSI target.
#[derive(Debug, Deserialize, Serialize, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LunConfig {
    /// LUN (default: position).
    pub lun: Option<u64>,
    /// Device name.
    pub device: String,
}

/// iSCSI settings shared by all targets.
#[derive(Debug, Deserialize, Serialize, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct IscsiConfig {
    /// CHAP credentials required for discovery sessions.
    pub discovery_chap: Option<ChapConfig>,
}

/// A block device.
#[derive(Debug, Deserialize, Serialize, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DeviceConfig {
    /// Unique name namespaces refer to.
    pub name: String,
    /// `null`, `ram`, `file`, `block` or `rbd`.
    pub kind: String,
    /// Size ("1GiB", "512MiB", or bytes); required for null and ram,
    /// optional for file (creates or extends), ignored for block.
    pub size: Option<Size>,
    /// Logical block size: 512 or 4096 (any power of two 512..=65536).
    pub block_size: Option<u32>,
    /// Path of a file or block device.
    pub path: Option<PathBuf>,
    /// ram: transparent huge pages (default true); false keeps 4 KiB
    /// pages, committed and given back by deallocate one at a time.
    pub huge_pages: Option<bool>,
    /// Exported read-only (default false): hosts are told (NVMe NSATTR,
    /// SCSI MODE SENSE WP) and every write is refused; file and block
    /// devices are opened read-only.
    pub read_only: Option<bool>,
    /// Latency added to every read, in microseconds (testing; default 0).
    pub read_latency_us: Option<u64>,
    /// Latency added to every write, in microseconds (testing; default 0).
    pub write_latency_us: Option<u64>,
    /// rbd: the pool holding the image.
    pub pool: Option<String>,
    /// rbd: the image.
    pub image: Option<String>,
    /// rbd: the Ceph configuration file (default `/etc/ceph/ceph.conf`).
    pub ceph_conf: Option<PathBuf>,
    /// rbd: the cephx user without `client.` (default `admin`).
    pub client: Option<String>,
    /// rbd: a keyring instead of the one `ceph_conf` names.
    pub keyring: Option<PathBuf>,
    /// rbd: seconds that connecting, and each monitor and OSD operation,
    /// may take before failing (default 30).
    pub connect_timeout: Option<u64>,
}

impl DeviceConfig {
    /// Whether `other` is this device with another `size` and nothing
    /// else changed.
    pub fn same_but_size(&self, other: &DeviceConfig) -> bool {
        self.size != other.size && DeviceConfig { size: other.size, ..self.clone() } == *other
    }
}

/// The longest latency a device may inject: one minute.
pub const MAX_INJECTED_LATENCY_US: u64 = 60_000_000;

/// A size written as bytes or with a unit.
#[derive(Debug, Deserialize, Serialize, Clone, Copy, PartialEq, Eq)]
#[serde(try_from = "SizeRepr")]
pub struct Size(pub u64);

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeRepr {
    Bytes(u64),
    Text(String),
}

impl TryFrom<SizeRepr> for Size {
    type Error = String;
    fn try_from(r: SizeRepr) -> Result<Self, String> {
        match r {
            SizeRepr::Bytes(b) => Ok(Size(b)),
            SizeRepr::Text(t) => parse_size(&t).map(Size),
        }
    }
}

/// Parses "4096", "64KiB", "512MiB", "1GiB", "2TiB" (also K/M/G/T, KB=1000).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("size {s:?} does not start with a number"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        "KB" => 1000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        u => return Err(format!("size {s:?} has unknown unit {u:?} (use KiB, MiB, GiB, TiB)")),
    };
    // TOML integers are i64: a larger size could not be saved.
    n.checked_mul(mult)
        .filter(|&b| i64::try_from(b).is_ok())
        .ok_or_else(|| format!("size {s:?} is more than {} bytes", i64::MAX))
}

/// A namespace's NSID with the NGUID, UUID and EUI-64 it will have, as far
/// as the configuration tells (an rbd image's derived ones are not known
/// before it is opened).
type Identity = (u32, Option<[u8; 16]>, Option<[u8; 16]>, Option<[u8; 8]>);

/// A byte count that must fit 32 bits, written as bytes or with a unit.
fn size_u32<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let Size(b) = Size::deserialize(d)?;
    u32::try_from(b).map_err(|_| serde::de::Error::custom(format!("{b} bytes is more than 4 GiB - 1")))
}

/// An NVMe subsystem.
#[derive(Debug, Deserialize, Serialize, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SubsystemConfig {
    /// Subsystem NQN.
    pub nqn: String,
    /// Serial number (default derived from the NQN).
    pub serial: Option<String>,
    /// Any host may connect.
    #[serde(default)]
    pub allow_any_host: bool,
    /// Host NQNs allowed when `allow_any_host` is false.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Lowest controller ID handed out (default 1). Gateways that export
    /// one subsystem NQN need disjoint `min_cntlid..=max_cntlid` ranges.
    pub min_cntlid: Option<u16>,
    /// Highest controller ID handed out (default 0xffef).
    pub max_cntlid: Option<u16>,
    /// Namespaces.
    #[serde(default)]
    pub namespace: Vec<NamespaceConfig>,
}

impl SubsystemConfig {
    /// `min_cntlid` and `max_cntlid` with their defaults.
    pub fn cntlid_range(&self) -> (u16, u16) {
        (self.min_cntlid.unwrap_or(nvmf::CNTLID_MIN), self.max_cntlid.unwrap_or(nvmf::CNTLID_MAX))
    }
}

/// A namespace of a subsystem.
#[derive(Debug, Deserialize, Serialize, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct NamespaceConfig {
    /// Namespace ID (default: position + 1).
    pub nsid: Option<u32>,
    /// Device name.
    pub device: String,
    /// UUID hosts see, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (default
    /// derived: from the image for rbd devices, else from the NQN, NSID
    /// and device name).
    pub uuid: Option<String>,
    /// NGUID hosts see, 32 hex digits (default derived like the UUID).
    pub nguid: Option<String>,
    /// This gateway's ANA state for the namespace: `optimized` (default),
    /// `non-optimized`, `inaccessible`, `persistent-loss` or `change`.
    pub ana_state: Option<String>,
}

/// The ANA state names, as nvmet's configfs spells them.
const ANA_STATES: [(&str, AnaState); 5] = [
    ("optimized", AnaState::OPTIMIZED),
    ("non-optimized", AnaState::NON_OPTIMIZED),
    ("inaccessible", AnaState::INACCESSIBLE),
    ("persistent-loss", AnaState::PERSISTENT_LOSS),
    ("change", AnaState::CHANGE),
];

/// The configuration name of an ANA state (`ctl show`), or its number
/// for a state no configuration names.
pub fn ana_state_name(state: AnaState) -> String {
    ANA_STATES.iter().find(|(_, s)| *s == state).map_or_else(|| format!("0x{:x}", state.0), |(n, _)| (*n).to_string())
}

impl NamespaceConfig {
    /// The configured UUID, if valid.
    pub fn uuid_bytes(&self) -> Option<Result<[u8; 16], String>> {
        self.uuid.as_deref().map(|u| hex_id(u, &[8, 4, 4, 4, 12]).ok_or_else(|| format!("{u:?} is not a UUID")))
    }

    /// The configured NGUID, if valid.
    pub fn nguid_bytes(&self) -> Option<Result<[u8; 16], String>> {
        self.nguid.as_deref().map(|n| hex_id(n, &[32]).ok_or_else(|| format!("{n:?} is not 32 hex digits")))
    }

    /// The ANA state, optimized when none is set.
    pub fn ana(&self) -> Result<AnaState, String> {
        let Some(name) = self.ana_state.as_deref() else {
            return Ok(AnaState::OPTIMIZED);
        };
        ANA_STATES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s).ok_or_else(|| {
            let names: Vec<&str> = ANA_STATES.iter().map(|(n, _)| *n).collect();
            format!("{name:?} is not one of {}", names.join(", "))
        })
    }
}

/// 16 bytes written as hex digits in dash-separated groups of the given
/// lengths.
fn hex_id(text: &str, groups: &[usize]) -> Option<[u8; 16]> {
    let parts: Vec<&str> = text.split('-').collect();
    if parts.len() != groups.len() || parts.iter().zip(groups).any(|(p, &n)| p.len() != n) {
        return None;
    }
    let digits: String = parts.concat();
    if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(digits.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A listening port.
#[derive(Debug, Deserialize, Serialize, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PortConfig {
    /// Transport: `tcp` (NVMe/TCP), `rdma` (NVMe/RDMA over iWARP) or
    /// `iscsi`. A `tcp` and an `rdma` port may share one address.
    #[serde(default = "default_transport")]
    pub transport: String,
    /// Listen address, e.g. "127.0.0.1:4420".
    pub address: String,
    /// A dedicated discovery port (like 8009): only the discovery
    /// controller is served on it.
    #[serde(default)]
    pub discovery_only: bool,
    /// `rdma` ports: use CRC32C on iWARP FPDUs (default true; a host that
    /// asks for CRC gets it either way).
    #[serde(default)]
    pub crc: Option<bool>,
}

fn default_transport() -> String {
    "tcp".to_string()
}

/// Reactor threads.
#[derive(Debug, Deserialize, Serialize, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReactorConfig {
    /// CPUs to run one reactor each on (default: every CPU available).
    #[serde(default)]
    pub cores: Vec<usize>,
    /// I/O buffer memory each reactor registers with io_uring (fixed
    /// buffers for file and block devices); 0 turns registration off.
    #[serde(default = "default_registered_buffers")]
    pub registered_buffers: Size,
    /// Microseconds a reactor keeps polling its ring after the last
    /// completion before it sleeps in the kernel (0: never spin).
    #[serde(default = "default_poll_us")]
    pub poll_us: u32,
    /// Receive buffers each reactor shares among its connections
    /// (multishot receive); a power of two, 0 turns it off.
    #[serde(default = "default_receive_buffers")]
    pub receive_buffers: u16,
    /// Size of each receive buffer.
    #[serde(default = "default_receive_buffer_size")]
    pub receive_buffer_size: Size,
}

impl Default for ReactorConfig {
    fn default() -> Self {
        ReactorConfig {
            cores: Vec::new(),
            registered_buffers: default_registered_buffers(),
            poll_us: default_poll_us(),
            receive_buffers: default_receive_buffers(),
            receive_buffer_size: default_receive_buffer_size(),
        }
    }
}

/// Longest spin a reactor may be configured for: 10 ms.
pub const MAX_POLL_US: u32 = 10_000;

fn default_poll_us() -> u32 {
    u32::try_from(reactor::DEFAULT_POLL.as_micros()).unwrap_or(u32::MAX)
}

fn default_receive_buffers() -> u16 {
    reactor::DEFAULT_BUFFERS
}

fn default_receive_buffer_size() -> Size {
    Size(reactor::DEFAULT_BUFFER_SIZE as u64)
}

/// Registered buffer memory per reactor: 16 MiB, a queue depth of 128 at
/// 128 KiB.
pub const DEFAULT_REGISTERED_BUFFERS: u64 = 16 << 20;

fn default_registered_buffers() -> Size {
    Size(DEFAULT_REGISTERED_BUFFERS)
}

/// NVMe/TCP transport limits.
#[derive(Debug, Deserialize, Serialize, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NvmeTcpConfig {
    /// In-capsule data accepted on I/O queues, bytes (a number or a size
    /// with a unit, like every byte count in the file).
    #[serde(default = "default_in_capsule", deserialize_with = "size_u32")]
    pub in_capsule_data: u32,
    /// Largest transfer per command (MDTS), bytes; a power of two >= 8192.
    #[serde(default = "default_max_transfer", deserialize_with = "size_u32")]
    pub max_transfer: u32,
    /// Most data bytes per H2CData PDU the host may send (MAXH2CDATA).
    #[serde(default = "default_max_h2c", deserialize_with = "size_u32")]
    pub max_h2c_data: u32,
    /// Most I/O queues per controller.
    #[serde(default = "default_max_queues")]
    pub max_io_queues: u16,
    /// Entries per queue (queue depth limit).
    #[serde(default = "default_queue_entries")]
    pub queue_entries: u16,
    /// When the last C2HData of a successful read may carry SUCCESS in
    /// place of a response capsule.
    #[serde(default)]
    pub c2h_success: C2hSuccess,
    /// Most solicited write data a connection buffers at once; further
    /// R2Ts wait for room.
    #[serde(default = "default_r2t_buffer")]
    pub r2t_buffer: Size,
}

fn default_r2t_buffer() -> Size {
    Size(8 << 20)
}

/// When a successful read's last C2HData PDU carries the SUCCESS flag, so
/// that no CapsuleResp follows it.
#[derive(Debug, Deserialize, Serialize, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum C2hSuccess {
    /// Only on queues whose host disabled SQ flow control (the spec's rule,
    /// and nvmet's): otherwise the CapsuleResp carries SQHD.
    #[default]
    SqFlowDisabled,
    /// On every queue, as SPDK's nvmf_tgt does by default: one PDU per read
    /// instead of two. A host that relies on SQHD for its flow control sees
    /// no SQ head updates from reads.
    Always,
}

fn default_in_capsule() -> u32 {
    8192
}
fn default_max_transfer() -> u32 {
    1 << 20
}
fn default_max_h2c() -> u32 {
    128 * 1024
}
fn default_max_queues() -> u16 {
    128
}
fn default_queue_entries() -> u16 {
    1024
}

impl Default for NvmeTcpConfig {
    fn default() -> Self {
        NvmeTcpConfig {
            in_capsule_data: default_in_capsule(),
            max_transfer: default_max_transfer(),
            max_h2c_data: default_max_h2c(),
            max_io_queues: default_max_queues(),
            queue_entries: default_queue_entries(),
            c2h_success: C2hSuccess::default(),
            r2t_buffer: default_r2t_buffer(),
        }
    }
}

impl Config {
    /// The embedded default: a 1 GiB RAM device as namespace 1 of
    /// `nqn.2026-11.io.ironwire:default`, any host, on 127.0.0.1:4420.
    pub fn embedded_default() -> Config {
        Config {
            device: vec![DeviceConfig {
                name: "ram0".into(),
                kind: "ram".into(),
                size: Some(Size(1 << 30)),
                block_size: Some(512),
                ..DeviceConfig::default()
            }],
            subsystem: vec![SubsystemConfig {
                nqn: DEFAULT_NQN.into(),
                serial: None,
                allow_any_host: true,
                hosts: Vec::new(),
                min_cntlid: None,
                max_cntlid: None,
                namespace: vec![NamespaceConfig { nsid: Some(1), device: "ram0".into(), ..Default::default() }],
            }],
            port: vec![
                PortConfig {
                    transport: "tcp".into(),
                    address: "127.0.0.1:4420".into(),
                    discovery_only: false,
                    crc: None,
                },
                PortConfig {
                    transport: "rdma".into(),
                    address: "127.0.0.1:4420".into(),
                    discovery_only: false,
                    crc: None,
                },
                PortConfig {
                    transport: "iscsi".into(),
                    address: "127.0.0.1:3260".into(),
                    discovery_only: false,
                    crc: None,
                },
            ],
            reactor: ReactorConfig::default(),
            nvme_tcp: NvmeTcpConfig::default(),
            iscsi_target: vec![IscsiTargetConfig {
                iqn: DEFAULT_IQN.into(),
                alias: Some("ironwire default".into()),
                allow_any_initiator: true,
                initiators: Vec::new(),
                chap: None,
                mutual_chap: None,
                acl: Vec::new(),
                lun: vec![LunConfig { lun: Some(0), device: "ram0".into() }],
            }],
            iscsi: IscsiConfig::default(),
            limits: LimitsConfig::default(),
            timeouts: TimeoutsConfig::default(),
            control: ControlConfig::default(),
            shutdown: ShutdownConfig::default(),
            metrics: MetricsConfig::default(),
        }
    }

    /// Parses and validates TOML text.
    pub fn parse(text: &str) -> Result<Config> {
        let c: Config = toml::from_str(text).context("config is not valid")?;
        c.validate()?;
        Ok(c)
    }

    /// Checks cross-references and limits; errors name the field.
    pub fn validate(&self) -> Result<()> {
        let r = &self.reactor;
        if r.poll_us > MAX_POLL_US {
            bail!("reactor.poll_us: {} is more than {MAX_POLL_US}", r.poll_us);
        }
        if r.registered_buffers.0 > blockdev::MAX_REGISTERED_BYTES as u64 {
            bail!(
                "reactor.registered_buffers: {} bytes is more than 1 GiB, the most io_uring registers",
                r.registered_buffers.0
            );
        }
        if r.receive_buffers != 0 && (!r.receive_buffers.is_power_of_two() || r.receive_buffers > 32768) {
            bail!("reactor.receive_buffers: {} is not 0 or a power of two up to 32768", r.receive_buffers);
        }
        if !(512..=1 << 20).contains(&r.receive_buffer_size.0) {
            bail!("reactor.receive_buffer_size: {} bytes is not between 512 B and 1 MiB", r.receive_buffer_size.0);
        }
        let mut names = HashSet::new();
        for (i, d) in self.device.iter().enumerate() {
            let f = |field: &str| format!("device[{i}] ({}).{field}", d.name);
            if d.name.is_empty() {
                bail!("device[{i}].name: must not be empty");
            }
            if !names.insert(d.name.as_str()) {
                bail!("{}: duplicate device name", f("name"));
            }
            match d.kind.as_str() {
                "null" | "ram" => {
                    if d.size.is_none() {
                        bail!("{}: required for a {} device", f("size"), d.kind);
                    }
                    if d.path.is_some() {
                        bail!("{}: not used by a {} device", f("path"), d.kind);
                    }
                }
                "file" | "block" => {
                    if d.path.is_none() {
                        bail!("{}: required for a {} device", f("path"), d.kind);
                    }
                }
                "rbd" => {
                    for (key, v) in [("pool", &d.pool), ("image", &d.image)] {
                        if v.as_deref().is_none_or(str::is_empty) {
                            bail!("{}: required for an rbd device", f(key));
                        }
                    }
                    if d.path.is_some() || d.size.is_some() {
                        bail!("{}: not used by an rbd device (its size is the image's)", f("path/size"));
                    }
                    if d.connect_timeout.is_some_and(|s| !(1..=3600).contains(&s)) {
                        bail!("{}: not between 1 and 3600 seconds", f("connect_timeout"));
                    }
                }
                k => bail!("{}: {k:?} is not one of null, ram, file, block, rbd", f("kind")),
            }
            let rbd_only = [
                ("pool", d.pool.is_some()),
                ("image", d.image.is_some()),
                ("ceph_conf", d.ceph_conf.is_some()),
                ("client", d.client.is_some()),
                ("keyring", d.keyring.is_some()),
                ("connect_timeout", d.connect_timeout.is_some()),
            ];
            if let Some((key, _)) = rbd_only.iter().find(|(_, set)| *set && d.kind != "rbd") {
                bail!("{}: only for rbd devices", f(key));
            }
            if d.huge_pages.is_some() && d.kind != "ram" {
                bail!("{}: only for ram devices", f("huge_pages"));
            }
            if d.read_only == Some(true) && d.kind == "file" && d.size.is_some() {
                bail!("{}: a read-only file device takes its file's length; leave size out", f("read_only"));
            }
            for (key, v) in [("read_latency_us", d.read_latency_us), ("write_latency_us", d.write_latency_us)] {
                if v.is_some_and(|us| us > MAX_INJECTED_LATENCY_US) {
                    bail!("{}: more than {MAX_INJECTED_LATENCY_US} µs", f(key));
                }
            }
            if let Some(bs) = d.block_size {
                if !bs.is_power_of_two() || !(512..=65536).contains(&bs) {
                    bail!("{}: {bs} is not a power of two between 512 and 65536", f("block_size"));
                }
            }
            // Without `block_size` the device has 512-byte blocks (a block
            // device's own, whose `size` is ignored).
            if let (Some(bs), Some(Size(sz))) = (d.block_size.or((d.kind != "block").then_some(512)), d.size) {
                if sz == 0 || sz % u64::from(bs) != 0 {
                    bail!("{}: {sz} bytes is not a non-zero multiple of block_size {bs}", f("size"));
                }
            }
        }
        let mut nqns = HashSet::new();
        // Configured namespace identifiers, across subsystems: a host that
        // sees one twice refuses the second namespace.
        let mut ids = HashSet::new();
        for (i, s) in self.subsystem.iter().enumerate() {
            let f = |field: &str| format!("subsystem[{i}] ({}).{field}", s.nqn);
            if !valid_nqn(&s.nqn) {
                bail!(
                    "subsystem[{i}].nqn: {:?} is not an NQN (nqn.yyyy-mm.reverse.domain:name, at most 223 bytes)",
                    s.nqn
                );
            }
            if s.nqn == nvme_spec::DISCOVERY_NQN || !nqns.insert(s.nqn.as_str()) {
                bail!("{}: duplicate or reserved NQN", f("nqn"));
            }
            if let Some(sn) = &s.serial {
                // Identify Controller SN: 20 bytes, ASCII 0x20..=0x7e (as
                // nvmet's configfs takes it); a longer one would be cut.
                if sn.is_empty() || sn.len() > 20 || !sn.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
                    bail!("{}: {sn:?} is not 1 to 20 printable ASCII characters", f("serial"));
                }
            }
            if !s.allow_any_host && s.hosts.is_empty() {
                bail!("{}: empty while allow_any_host is false; no host could connect", f("hosts"));
            }
            let (min, max) = s.cntlid_range();
            for (key, v) in [("min_cntlid", min), ("max_cntlid", max)] {
                if !(nvmf::CNTLID_MIN..=nvmf::CNTLID_MAX).contains(&v) {
                    bail!("{}: {v} outside 1..=65519 (0xffef)", f(key));
                }
            }
            if min > max {
                bail!("{}: {min} is more than max_cntlid {max}", f("min_cntlid"));
            }
            for (j, h) in s.hosts.iter().enumerate() {
                if !valid_nqn(h) {
                    bail!("{}: {h:?} is not an NQN", f(&format!("hosts[{j}]")));
                }
            }
            let mut nsids = HashSet::new();
            // An rbd image's namespace identifiers come from the image
            // alone: two namespaces of it in one subsystem would share them.
            let mut images = HashMap::new();
            let mut identities: Vec<Identity> = Vec::new();
            for (j, ns) in s.namespace.iter().enumerate() {
                let image = self.device.iter().find(|d| d.name == ns.device && d.kind == "rbd");
                if let Some(d) = image {
                    let key = (&d.ceph_conf, &d.pool, &d.image);
                    if let Some(k) = images.insert(key, j) {
                        bail!(
                            "{}: device {:?} is rbd image {}/{}, which namespace[{k}] exports already: \
                             its namespaces would have the same identifiers, which hosts refuse",
                            f(&format!("namespace[{j}].device")),
                            ns.device,
                            d.pool.as_deref().unwrap_or_default(),
                            d.image.as_deref().unwrap_or_default()
                        );
                    }
                }
                let nsid = ns.nsid.unwrap_or(u32::try_from(j).unwrap_or(u32::MAX).saturating_add(1));
                if nsid == 0 || nsid > 1024 {
                    bail!("{}: {nsid} outside 1..=1024", f(&format!("namespace[{j}].nsid")));
                }
                if !nsids.insert(nsid) {
                    bail!("{}: nsid {nsid} used twice", f(&format!("namespace[{j}].nsid")));
                }
                if !names.contains(ns.device.as_str()) {
                    bail!("{}: no device named {:?}", f(&format!("namespace[{j}].device")), ns.device);
                }
                match ns.uuid_bytes() {
                    Some(Err(e)) => bail!("{}: {e}", f(&format!("namespace[{j}].uuid"))),
                    Some(Ok(id)) if !ids.insert(("uuid", id)) => {
                        bail!(
                            "{}: {} is used by another namespace",
                            f(&format!("namespace[{j}].uuid")),
                            ns.uuid.as_deref().unwrap_or_default()
                        )
                    }
                    _ => {}
                }
                match ns.nguid_bytes() {
                    Some(Err(e)) => bail!("{}: {e}", f(&format!("namespace[{j}].nguid"))),
                    Some(Ok(id)) if !ids.insert(("nguid", id)) => {
                        bail!(
                            "{}: {} is used by another namespace",
                            f(&format!("namespace[{j}].nguid")),
                            ns.nguid.as_deref().unwrap_or_default()
                        )
                    }
                    _ => {}
                }
                if let Err(e) = ns.ana() {
                    bail!("{}: {e}", f(&format!("namespace[{j}].ana_state")));
                }
                // The identifiers hosts will see, as `Namespace::new`
                // derives them (an rbd image's come from the image, known
                // once it is opened: `serve` and ctl check those).
                let derived =
                    (image.is_none()).then(|| nvmf::derived_identifiers(&format!("{}/{nsid}/{}", s.nqn, ns.device)));
                let nguid = ns.nguid_bytes().and_then(Result::ok).or(derived.map(|d| d.0));
                let uuid = ns.uuid_bytes().and_then(Result::ok).or(derived.map(|d| d.1));
                let eui64 = derived.map(|d| d.2);
                let clash = |k: &Identity| {
                    (nguid.is_some() && k.1 == nguid)
                        || (uuid.is_some() && k.2 == uuid)
                        || (eui64.is_some() && k.3 == eui64)
                };
                if let Some(k) = identities.iter().find(|k| clash(k)) {
                    bail!(
                        "{}: namespace {nsid} would have the NGUID, UUID or EUI-64 of namespace {}; hosts refuse the second",
                        f(&format!("namespace[{j}]")),
                        k.0
                    );
                }
                identities.push((nsid, nguid, uuid, eui64));
            }
        }
        if self.port.is_empty() {
            bail!("port: at least one port is needed");
        }
        if self.port.iter().all(|p| p.discovery_only) {
            bail!("port: every port is discovery_only; subsystems need at least one other port");
        }
        let mut addresses: Vec<(SocketAddr, usize)> = Vec::new();
        for (i, p) in self.port.iter().enumerate() {
            if !matches!(p.transport.as_str(), "tcp" | "rdma" | "iscsi") {
                bail!("port[{i}].transport: {:?} is not supported (tcp, rdma, iscsi)", p.transport);
            }
            if p.transport == "iscsi" && p.discovery_only {
                bail!("port[{i}].discovery_only: only NVMe ports have dedicated discovery");
            }
            if p.transport != "rdma" && p.crc.is_some() {
                bail!("port[{i}].crc: only rdma ports have an iWARP CRC setting");
            }
            let a = p
                .address
                .parse::<SocketAddr>()
                .map_err(|e| anyhow::anyhow!("port[{i}].address: {:?} is not ip:port ({e})", p.address))?;
            // NVMe/TCP and NVMe/RDMA share an address (the first byte a host
            // sends tells them apart); nothing else does.
            for &(b, j) in &addresses {
                let q = &self.port[j];
                let pair = [q.transport.as_str(), p.transport.as_str()];
                if b == a && !(pair == ["tcp", "rdma"] || pair == ["rdma", "tcp"]) {
                    bail!(
                        "port[{i}] ({} {a}) and port[{j}] ({} {b}) share an address; only a tcp and an rdma port may",
                        p.transport,
                        q.transport
                    );
                }
            }
            addresses.push((a, i));
        }
        let mut iqns = HashSet::new();
        for (i, t) in self.iscsi_target.iter().enumerate() {
            let f = |field: &str| format!("iscsi_target[{i}] ({}).{field}", t.iqn);
            if !valid_iscsi_name(&t.iqn) {
                bail!("iscsi_target[{i}].iqn: {:?} is not an iSCSI name (iqn.yyyy-mm.reverse.domain[:name] or eui.16hex, lower case, at most 223 bytes)", t.iqn);
            }
            if let Some(a) = &t.alias {
                // RFC 7143 6.1: a text value is at most 255 bytes; a NUL
                // would end the key=value pair it is sent in.
                if a.is_empty() || a.len() > 255 || a.contains('\0') {
                    bail!("{}: {} bytes; an alias is 1 to 255 bytes of UTF-8 without NUL", f("alias"), a.len());
                }
            }
            if !iqns.insert(t.iqn.as_str()) {
                bail!("{}: duplicate target name", f("iqn"));
            }
            // A login takes the first entry of its initiator: a second
            // one's credentials would never count.
            let mut acl_initiators = HashSet::new();
            for (j, a) in t.acl.iter().enumerate() {
                let g = |field: &str| f(&format!("acl[{j}].{field}"));
                if !valid_iscsi_name(&a.initiator) {
                    bail!("{}: {:?} is not an iSCSI name", g("initiator"), a.initiator);
                }
                if !acl_initiators.insert(a.initiator.as_str()) {
                    bail!("{}: {:?} has an entry already", g("initiator"), a.initiator);
                }
                check_chap_pair(&a.chap, &a.mutual_chap, g)?;
            }
            if !t.allow_any_initiator && t.initiators.is_empty() && t.acl.is_empty() {
                bail!("{}: empty while allow_any_initiator is false; no initiator could log in", f("initiators"));
            }
            for (j, n) in t.initiators.iter().enumerate() {
                if !valid_iscsi_name(n) {
                    bail!("{}: {n:?} is not an iSCSI name", f(&format!("initiators[{j}]")));
                }
            }
            check_chap_pair(&t.chap, &t.mutual_chap, f)?;
            let mut luns = HashSet::new();
            for (j, l) in t.lun.iter().enumerate() {
                let lun = l.lun.unwrap_or(j as u64);
                if lun >= 16384 {
                    bail!("{}: {lun} outside 0..16384", f(&format!("lun[{j}].lun")));
                }
                if !luns.insert(lun) {
                    bail!("{}: LUN {lun} used twice", f(&format!("lun[{j}].lun")));
                }
                if !names.contains(l.device.as_str()) {
                    bail!("{}: no device named {:?}", f(&format!("lun[{j}].device")), l.device);
                }
            }
        }
        if let Some(c) = &self.iscsi.discovery_chap {
            check_chap(c).map_err(|e| anyhow::anyhow!("iscsi.discovery_chap: {e}"))?;
        }
        if !self.iscsi_target.is_empty() && !self.port.iter().any(|p| p.transport == "iscsi") {
            bail!("port: iSCSI targets are configured but no port has transport = \"iscsi\"");
        }
        let t = &self.nvme_tcp;
        // MDTS is 2^n units of 4 KiB, n = 0 meaning no limit: 4 KiB itself
        // cannot be advertised.
        if !t.max_transfer.is_power_of_two() || t.max_transfer < 8192 {
            bail!("nvme_tcp.max_transfer: {} is not a power of two >= 8192", t.max_transfer);
        }
        if t.in_capsule_data > t.max_transfer || !t.in_capsule_data.is_multiple_of(16) {
            bail!(
                "nvme_tcp.in_capsule_data: {} must be a multiple of 16 no larger than max_transfer",
                t.in_capsule_data
            );
        }
        if !(4096..=1 << 30).contains(&t.r2t_buffer.0) {
            bail!("nvme_tcp.r2t_buffer: {} must be between 4KiB and 1GiB", t.r2t_buffer.0);
        }
        if t.max_h2c_data < 4096 || !t.max_h2c_data.is_multiple_of(4) {
            bail!("nvme_tcp.max_h2c_data: {} must be a multiple of 4 and at least 4096", t.max_h2c_data);
        }
        if t.max_io_queues == 0 || t.queue_entries < 2 {
            bail!("nvme_tcp: max_io_queues must be >= 1 and queue_entries >= 2");
        }
        self.validate_limits()?;
        self.control.validate()?;
        if let Some(m) = self.metrics.addr()? {
            // Both would bind it: `serve` would fail at start, or a reactor
            // at the port change.
            let clash = |a: SocketAddr| listeners_overlap(a, m);
            if let Some(i) = self.port.iter().position(|p| p.address.parse().is_ok_and(clash)) {
                bail!("metrics.listen: {m} is taken by port[{i}] ({})", self.port[i].address);
            }
        }
        check_cores(&self.reactor.cores)
    }

    fn validate_limits(&self) -> Result<()> {
        let l = &self.limits;
        for (key, v) in [
            ("connections_per_port", l.connections_per_port),
            ("connections_per_host", l.connections_per_host),
            ("controllers_per_subsystem", l.controllers_per_subsystem),
            ("sessions_per_target", l.sessions_per_target),
            ("controllers_per_host", l.controllers_per_host),
            ("sessions_per_host", l.sessions_per_host),
            ("tasks_per_session", l.tasks_per_session),
        ] {
            if v == 0 {
                bail!("limits.{key}: 0 would refuse everything; at least 1");
            }
        }
        if l.controllers_per_subsystem > 0xffef {
            bail!(
                "limits.controllers_per_subsystem: {} is more than the 65519 controller IDs",
                l.controllers_per_subsystem
            );
        }
        if !(64 << 10..=1 << 30).contains(&l.send_high_water.0) {
            bail!("limits.send_high_water: {} bytes is not between 64 KiB and 1 GiB", l.send_high_water.0);
        }
        if !(64 << 10..=16 << 30).contains(&l.iscsi_write_budget.0) {
            bail!("limits.iscsi_write_budget: {} bytes is not between 64 KiB and 16 GiB", l.iscsi_write_budget.0);
        }
        if !(64 << 10..=1 << 30).contains(&l.read_budget.0) {
            bail!("limits.read_budget: {} bytes is not between 64 KiB and 1 GiB", l.read_budget.0);
        }
        let t = &self.timeouts;
        if self.shutdown.drain_s > 3600 {
            bail!("shutdown.drain_s: {} is more than 3600 seconds", self.shutdown.drain_s);
        }
        if !(100..=600_000).contains(&t.handshake_ms) {
            bail!("timeouts.handshake_ms: {} is not between 100 and 600000", t.handshake_ms);
        }
        if t.tcp_user_timeout_ms > 3_600_000 {
            bail!("timeouts.tcp_user_timeout_ms: {} is more than an hour (3600000)", t.tcp_user_timeout_ms);
        }
        for (i, d) in self.device.iter().enumerate() {
            let Some(path) = &d.path else { continue };
            let f = format!("device[{i}] ({}).path", d.name);
            match d.kind.as_str() {
                "file" => {
                    let dir = match path.parent() {
                        Some(p) if !p.as_os_str().is_empty() => p,
                        _ => std::path::Path::new("."),
                    };
                    if !dir.is_dir() {
                        bail!("{f}: directory {} does not exist", dir.display());
                    }
                }
                "block" if !path.exists() => bail!("{f}: {} does not exist", path.display()),
                _ => {}
            }
        }
        Ok(())
    }
}

impl ControlConfig {
    /// Errors name the `control.` field.
    fn validate(&self) -> Result<()> {
        if let Some(s) = &self.socket {
            if !s.is_absolute() || s.file_name().is_none() {
                bail!("control.socket: {} is not an absolute path to a file", s.display());
            }
            // sun_path holds 108 bytes with the terminating NUL.
            if s.as_os_str().len() > 107 {
                bail!("control.socket: {} is longer than a socket path may be (107 bytes)", s.display());
            }
        }
        if let Some(g) = &self.group {
            group_id(g).map_err(|e| anyhow::anyhow!("control.group: {e:#}"))?;
        }
        for (i, a) in self.allow_paths.iter().enumerate() {
            if !a.starts_with('/') {
                bail!("control.allow_paths[{i}]: {a:?} is not an absolute path or pattern");
            }
            // Entries are compared with canonical paths, which have none.
            if a.split('/').any(|c| c == "." || c == "..") {
                bail!("control.allow_paths[{i}]: {a:?} has a . or .. component; give the canonical path");
            }
        }
        Ok(())
    }
}

/// The ID of the group named `name` (`[control] group`).
pub fn group_id(name: &str) -> Result<u32> {
    let cname = std::ffi::CString::new(name).map_err(|_| anyhow!("group name {name:?} contains a NUL byte"))?;
    let mut buf = vec![0 as libc::c_char; 1024];
    loop {
        // SAFETY: all-zero bytes are a valid `group` (null pointers, 0 gid).
        let mut grp: libc::group = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::group = std::ptr::null_mut();
        // SAFETY: cname is NUL-terminated; grp, buf (with its true length)
        // and found are valid for writes for the duration of the call.
        let r = unsafe { libc::getgrnam_r(cname.as_ptr(), &mut grp, buf.as_mut_ptr(), buf.len(), &mut found) };
        match r {
            0 if found.is_null() => bail!("no group named {name:?}"),
            0 => return Ok(grp.gr_gid),
            libc::ERANGE if buf.len() < 1 << 20 => buf.resize(buf.len() * 2, 0),
            e => bail!("looking up group {name:?}: {}", std::io::Error::from_raw_os_error(e)),
        }
    }
}

/// Checks reactor cores: each exists on this machine (is a CPU this
/// process may run on), none twice.
pub fn check_cores(cores: &[usize]) -> Result<()> {
    let available = reactor::available_cpus();
    let mut seen = HashSet::new();
    for (i, c) in cores.iter().enumerate() {
        if !available.contains(c) {
            bail!("reactor.cores[{i}]: CPU {c} is not one this process may run on (available: {available:?})");
        }
        if !seen.insert(c) {
            bail!("reactor.cores[{i}]: CPU {c} listed twice");
        }
    }
    Ok(())
}

/// An iSCSI name (RFC 7143 section 4.2.7.2): iqn. or eui. form, lower case,
/// at most 223 bytes.
pub fn valid_iscsi_name(s: &str) -> bool {
    let ok_chars = s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b".-:".contains(&b));
    let eui = s.strip_prefix("eui.").is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    s.len() <= 223 && (eui || (s.starts_with("iqn.") && s.len() > 4 && ok_chars))
}

/// A target's or an ACL's `chap` and `mutual_chap` (`at` names a field
/// of theirs): each valid, mutual only with one-way, and not one secret
/// both ways (RFC 7143 section 12.1.3; the login refuses it).
fn check_chap_pair(
    chap: &Option<ChapConfig>,
    mutual: &Option<ChapConfig>,
    at: impl Fn(&str) -> String,
) -> anyhow::Result<()> {
    for (field, c) in [("chap", chap), ("mutual_chap", mutual)] {
        if let Some(c) = c {
            check_chap(c).map_err(|e| anyhow::anyhow!("{}: {e}", at(field)))?;
        }
    }
    match (chap, mutual) {
        (None, Some(_)) => bail!("{}: mutual CHAP needs `chap` too", at("mutual_chap")),
        (Some(c), Some(m)) if c.secret == m.secret => {
            bail!("{}: must differ from the initiator's secret (RFC 7143 section 12.1.3)", at("mutual_chap.secret"))
        }
        _ => Ok(()),
    }
}

/// Checks CHAP credentials as the iSCSI target will take them.
pub fn check_chap(c: &ChapConfig) -> Result<(), String> {
    if c.user.is_empty() || c.user.len() > 255 {
        return Err(format!("user {:?} must be 1 to 255 bytes", c.user));
    }
    if c.secret.len() < 12 || c.secret.len() > 255 {
        return Err(format!("secret is {} bytes; use 12 to 255 (open-iscsi refuses shorter ones)", c.secret.len()));
    }
    Ok(())
}

/// An NQN: "nqn." followed by a date-and-domain form, or the UUID form;
/// printable, at most 223 bytes (NVMe Base 2.0 section 4.5).
pub fn valid_nqn(s: &str) -> bool {
    s.len() <= 223 && s.starts_with("nqn.") && s.len() > 4 && s.bytes().all(|b| b.is_ascii_graphic())
}

/// Whether listeners on `a` and `b` would take the same connections: the
/// same port, and the same address or an unspecified one covering the
/// other (an unspecified address takes its port on every address of its
/// family, `[::]` on IPv4 ones too, dual-stack).
pub(crate) fn listeners_overlap(a: SocketAddr, b: SocketAddr) -> bool {
    let covers = |x: SocketAddr, y: SocketAddr| x.ip().is_unspecified() && (x.is_ipv6() || y.is_ipv4());
    a.port() == b.port() && (a.ip() == b.ip() || covers(a, b) || covers(b, a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cntlid_range_identifiers_and_ana_state_are_checked() {
        let sub = |extra: &str, ns: &str| {
            format!(
                "[[device]]\nname = \"r\"\nkind = \"ram\"\nsize = \"1MiB\"\n[[subsystem]]\n\
                 nqn = \"nqn.2026-11.io.ironwire:gw\"\nallow_any_host = true\n{extra}\n\
                 [[subsystem.namespace]]\ndevice = \"r\"\n{ns}\n[[port]]\naddress = \"127.0.0.1:4420\"\n"
            )
        };
        let c = Config::parse(&sub("min_cntlid = 100\nmax_cntlid = 199", "")).expect("a range");
        assert_eq!(c.subsystem[0].cntlid_range(), (100, 199));
        assert_eq!(Config::parse(&sub("", "")).expect("defaults").subsystem[0].cntlid_range(), (1, 0xffef));
        let e = err_of(&sub("min_cntlid = 0", ""));
        assert!(e.contains("subsystem[0] (nqn.2026-11.io.ironwire:gw).min_cntlid: 0 outside"), "{e}");
        assert!(err_of(&sub("max_cntlid = 65520", "")).contains(".max_cntlid: 65520 outside"));
        assert!(err_of(&sub("min_cntlid = 9\nmax_cntlid = 8", "")).contains(".min_cntlid: 9 is more than max_cntlid 8"));

        let ids = "uuid = \"0F1E2D3C-4b5a-4978-8695-a4b3c2d1e0f9\"\nnguid = \"00112233445566778899aabbccddeeff\"";
        let c = Config::parse(&sub("", &format!("{ids}\nana_state = \"non-optimized\""))).expect("ids");
        let ns = &c.subsystem[0].namespace[0];
        assert_eq!(
            ns.uuid_bytes(),
            Some(Ok([15, 30, 45, 60, 75, 90, 73, 120, 134, 149, 164, 179, 194, 209, 224, 249]))
        );
        assert_eq!(ns.nguid_bytes().and_then(Result::ok).map(|n| n[15]), Some(0xff));
        assert_eq!(ns.ana(), Ok(AnaState::NON_OPTIMIZED));
        assert!(err_of(&sub("", "uuid = \"0f1e2d3c4b5a49788695a4b3c2d1e0f9\"")).contains("namespace[0].uuid"));
        assert!(err_of(&sub("", "nguid = \"+0112233445566778899aabbccddeeff\"")).contains("namespace[0].nguid"));
        let e = err_of(&sub("", "ana_state = \"standby\""));
        assert!(e.contains("namespace[0].ana_state: \"standby\" is not one of optimized, non-optimized"), "{e}");
    }

    /// RFC 7143 12.1.3: the two directions of mutual CHAP must not share a
    /// secret (the login refuses them); an ACL's own pair is checked as the
    /// target's is, or every mutual login of that initiator would fail.
    #[test]
    fn mutual_chap_secrets_must_differ_for_the_target_and_each_acl() {
        let target = |auth: &str, acl: &str| {
            format!(
                "[[device]]\nname = \"r\"\nkind = \"ram\"\nsize = \"1MiB\"\n[[iscsi_target]]\n\
                 iqn = \"iqn.2026-11.io.ironwire:t\"\n{auth}\n[[iscsi_target.acl]]\n\
                 initiator = \"iqn.2026-11.io.ironwire:host\"\n{acl}\n[[iscsi_target.lun]]\ndevice = \"r\"\n\
                 [[port]]\ntransport = \"iscsi\"\naddress = \"127.0.0.1:3260\"\n"
            )
        };
        let pair = |a: &str, b: &str| {
            format!(
                "chap = {{ user = \"in\", secret = \"{a}\" }}\nmutual_chap = {{ user = \"out\", secret = \"{b}\" }}"
            )
        };
        Config::parse(&target(&pair("secret-one-12", "secret-two-12"), &pair("secret-three", "secret-four!")))
            .expect("differ");
        let e = err_of(&target(&pair("secret-one-12", "secret-one-12"), ""));
        assert!(e.contains(".mutual_chap.secret: must differ"), "{e}");
        let e = err_of(&target("", &pair("secret-three", "secret-three")));
        assert!(e.contains("acl[0].mutual_chap.secret: must differ"), "{e}");
    }

    #[test]
    fn only_tcp_and_rdma_share_an_address() {
        let base = Config::embedded_default();
        assert_eq!(base.port[0].address, base.port[1].address, "the default shares 4420");
        let mut c = Config::embedded_default();
        c.port[1].transport = "tcp".into();
        let e = c.validate().expect_err("two tcp ports on one address").to_string();
        assert!(e.contains("port[1] (tcp 127.0.0.1:4420) and port[0] (tcp 127.0.0.1:4420)"), "{e}");
        let mut c = Config::embedded_default();
        c.port[2].address = "127.0.0.1:4420".into();
        let e = c.validate().expect_err("iscsi on the NVMe address").to_string();
        assert!(e.contains("port[2] (iscsi") && e.contains("port[0] (tcp"), "{e}");
        let mut c = Config::embedded_default();
        c.port[0].crc = Some(false);
        assert!(c.validate().expect_err("crc on tcp").to_string().contains("port[0].crc"));
        let mut c = base;
        c.port[1].crc = Some(false);
        c.port[0].crc = None;
        c.validate().expect("crc on rdma");
    }

    #[test]
    fn limits_timeouts_cores_and_paths_are_range_checked() {
        let base = "[[port]]\naddress = \"127.0.0.1:4420\"\n";
        let c = Config::parse(base).expect("defaults");
        assert_eq!(c.limits, LimitsConfig::default());
        let e = err_of(&format!("{base}[limits]\nconnections_per_host = 0\n"));
        assert!(e.contains("limits.connections_per_host"), "{e}");
        let e = err_of(&format!("{base}[limits]\ncontrollers_per_subsystem = 70000\n"));
        assert!(e.contains("limits.controllers_per_subsystem"), "{e}");
        let e = err_of(&format!("{base}[limits]\nsend_high_water = \"1KiB\"\n"));
        assert!(e.contains("limits.send_high_water"), "{e}");
        let e = err_of(&format!("{base}[limits]\nread_budget = \"2GiB\"\n"));
        assert!(e.contains("limits.read_budget"), "{e}");
        let e = err_of(&format!("{base}[limits]\niscsi_write_budget = \"32KiB\"\n"));
        assert!(e.contains("limits.iscsi_write_budget"), "{e}");
        let e = err_of(&format!("{base}[limits]\niscsi_write_budget = \"17GiB\"\n"));
        assert!(e.contains("limits.iscsi_write_budget"), "{e}");
        let c = Config::parse(&format!("{base}[limits]\niscsi_write_budget = \"1MiB\"\n")).expect("1 MiB");
        assert_eq!(c.limits.iscsi_write_budget, Size(1 << 20));
        let e = err_of(&format!("{base}[shutdown]\ndrain_s = 3601\n"));
        assert!(e.contains("shutdown.drain_s"), "{e}");
        let e = err_of(&format!("{base}[timeouts]\nhandshake_ms = 5\n"));
        assert!(e.contains("timeouts.handshake_ms"), "{e}");
        let e = err_of(&format!("{base}[reactor]\ncores = [100000]\n"));
        assert!(e.contains("reactor.cores[0]: CPU 100000"), "{e}");
        let cpu = reactor::available_cpus()[0];
        let e = err_of(&format!("{base}[reactor]\ncores = [{cpu}, {cpu}]\n"));
        assert!(e.contains("reactor.cores[1]") && e.contains("twice"), "{e}");
        let e = err_of(&format!(
            "{base}[[device]]\nname = \"f\"\nkind = \"file\"\nsize = \"1MiB\"\npath = \"/nonexistent-dir/f.img\"\n"
        ));
        assert!(e.contains("device[0] (f).path: directory /nonexistent-dir does not exist"), "{e}");
        let e =
            err_of(&format!("{base}[[device]]\nname = \"b\"\nkind = \"block\"\npath = \"/dev/nonexistent-disk\"\n"));
        assert!(e.contains("device[0] (b).path") && e.contains("does not exist"), "{e}");
    }

    #[test]
    fn metrics_listen_is_off_by_default_and_must_be_an_address() {
        let base = "[[port]]\naddress = \"127.0.0.1:4420\"\n";
        assert_eq!(Config::parse(base).expect("config").metrics.addr().expect("addr"), None);
        let on = Config::parse(&format!("{base}[metrics]\nlisten = \"127.0.0.1:9466\"\n")).expect("config");
        assert_eq!(on.metrics.addr().expect("addr"), Some("127.0.0.1:9466".parse().expect("addr")));
        let e = err_of(&format!("{base}[metrics]\nlisten = \"127.0.0.1:4420\"\n"));
        assert!(e.contains("metrics.listen: 127.0.0.1:4420 is taken by port[0]"), "{e}");
        let e = err_of(&format!("{base}[metrics]\nlisten = \"0.0.0.0:4420\"\n"));
        assert!(e.contains("is taken by port[0]"), "{e}");
        Config::parse(&format!("{base}[metrics]\nlisten = \"127.0.0.2:4420\"\n")).expect("another address");
        let e = err_of(&format!("{base}[metrics]\nlisten = \"[::]:4420\"\n"));
        assert!(e.contains("is taken by port[0]"), "dual-stack: {e}");
        Config::parse(&format!("{base}[metrics]\nlisten = \"[::1]:4420\"\n")).expect("IPv6 loopback");
        let e = err_of(&format!("{base}[metrics]\nlisten = \"localhost\"\n"));
        assert!(e.contains("metrics.listen: \"localhost\" is not an IP:PORT address"), "{e}");
        let e = err_of(&format!("{base}[metrics]\nport = 9466\n"));
        assert!(e.contains("port"), "{e}");
    }

    #[test]
    fn embedded_default_is_valid() {
        Config::embedded_default().validate().expect("valid");
    }

    #[test]
    fn c2h_success_defaults_to_the_spec_rule_and_takes_always() {
        let base = "[[port]]\naddress = \"127.0.0.1:4420\"\n";
        assert_eq!(Config::parse(base).expect("config").nvme_tcp.c2h_success, C2hSuccess::SqFlowDisabled);
        let always = format!("{base}[nvme_tcp]\nc2h_success = \"always\"\n");
        assert_eq!(Config::parse(&always).expect("config").nvme_tcp.c2h_success, C2hSuccess::Always);
        let bad = format!("{base}[nvme_tcp]\nc2h_success = \"sometimes\"\n");
        assert!(format!("{:#}", Config::parse(&bad).expect_err("unknown value")).contains("sometimes"));
    }

    /// MDTS says a transfer limit as 2^n units of 4 KiB, and n = 0 means no
    /// limit at all: 4 KiB cannot be said, and a host told "no limit" sends
    /// reads the target refuses. The least is 8 KiB (MDTS 1).
    #[test]
    fn max_transfer_is_one_mdts_can_say() {
        let base = "[[port]]\naddress = \"127.0.0.1:4420\"\n";
        let e = err_of(&format!("{base}[nvme_tcp]\nmax_transfer = 4096\nin_capsule_data = 4096\n"));
        assert!(e.contains("max_transfer") && e.contains(">= 8192"), "{e}");
        let c = Config::parse(&format!("{base}[nvme_tcp]\nmax_transfer = 8192\n")).expect("8 KiB");
        assert_eq!(c.nvme_tcp.max_transfer, 8192);
    }

    #[test]
    fn every_byte_size_key_takes_units() {
        let base = "[[port]]\naddress = \"127.0.0.1:4420\"\n";
        let c = Config::parse(&format!(
            "{base}[nvme_tcp]\nmax_transfer = \"1MiB\"\nin_capsule_data = \"16KiB\"\nmax_h2c_data = \"64KiB\"\n\
             r2t_buffer = \"4MiB\"\n[reactor]\nregistered_buffers = \"8MiB\"\nreceive_buffer_size = \"64KiB\"\n\
             [limits]\nsend_high_water = \"2MiB\"\n"
        ))
        .expect("sizes with units");
        assert_eq!(
            (c.nvme_tcp.max_transfer, c.nvme_tcp.in_capsule_data, c.nvme_tcp.max_h2c_data),
            (1 << 20, 16 << 10, 64 << 10)
        );
        assert_eq!(
            Config::parse(&format!("{base}[nvme_tcp]\nmax_transfer = 65536\n")).expect("bytes").nvme_tcp.max_transfer,
            65536
        );
        let e = err_of(&format!("{base}[nvme_tcp]\nmax_transfer = \"8GiB\"\n"));
        assert!(e.contains("max_transfer") && e.contains("more than 4 GiB"), "{e}");
        let e = err_of(&format!("{base}[nvme_tcp]\nmax_h2c_data = \"64 parsecs\"\n"));
        assert!(e.contains("max_h2c_data") && e.contains("unknown unit"), "{e}");
    }

    #[test]
    fn parses_sizes_with_units() {
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12 parsecs").is_err());
    }

    /// io_uring registers at most 1 GiB in one buffer: a larger
    /// `registered_buffers` would leave every reactor without them.
    #[test]
    fn registered_buffers_above_1_gib_are_refused() {
        let base = "[[port]]\naddress = \"127.0.0.1:4420\"\n";
        let c = Config::parse(&format!("{base}[reactor]\nregistered_buffers = \"1GiB\"\n")).expect("1 GiB");
        assert_eq!(c.reactor.registered_buffers, Size(1 << 30));
        let e = err_of(&format!("{base}[reactor]\nregistered_buffers = \"1025MiB\"\n"));
        assert!(e.contains("reactor.registered_buffers") && e.contains("1 GiB"), "{e}");
    }

    /// Identify Controller's SN is 20 bytes of printable ASCII; nvmet's
    /// configfs refuses anything else rather than cut it.
    #[test]
    fn a_serial_is_1_to_20_printable_ascii_characters() {
        let sub = |serial: &str| {
            format!(
                "[[port]]\naddress = \"127.0.0.1:4420\"\n[[subsystem]]\nnqn = \"nqn.2026-11.x:y\"\n\
                 allow_any_host = true\nserial = \"{serial}\"\n"
            )
        };
        Config::parse(&sub("ABCDEFGHIJ 123456789")).expect("20 characters");
        for bad in ["", "ABCDEFGHIJ0123456789X", "s\u{e9}rie", "a\\tb"] {
            let e = err_of(&sub(bad));
            assert!(e.contains("subsystem[0] (nqn.2026-11.x:y).serial") && e.contains("20"), "{bad:?}: {e}");
        }
    }

    /// TargetAlias goes out as a login text value: at most 255 bytes
    /// (RFC 7143 6.1), no NUL.
    #[test]
    fn an_alias_is_1_to_255_bytes_without_nul() {
        let target = |alias: &str| {
            format!(
                "[[port]]\ntransport = \"iscsi\"\naddress = \"127.0.0.1:3260\"\n[[iscsi_target]]\n\
                 iqn = \"iqn.2026-11.x:y\"\nallow_any_initiator = true\nalias = \"{alias}\"\n"
            )
        };
        Config::parse(&target(&"\u{e9}".repeat(127))).expect("254 bytes");
        for bad in [String::new(), "a".repeat(256), "a\\u0000b".into()] {
            let e = err_of(&target(&bad));
            assert!(e.contains("iscsi_target[0] (iqn.2026-11.x:y).alias") && e.contains("255"), "{bad:?}: {e}");
        }
    }

    /// Two ACL entries of one initiator: only the first's credentials
    /// would count, and `ctl remove acl` would take only that one off,
    /// leaving the initiator allowed.
    #[test]
    fn an_initiator_has_one_acl_entry_per_target() {
        let acl = |secret: &str| {
            format!(
                "[[iscsi_target.acl]]\ninitiator = \"iqn.2026-11.io.ironwire:host\"\n\
                 chap = {{ user = \"in\", secret = \"{secret}\" }}\n"
            )
        };
        let text = format!(
            "[[device]]\nname = \"r\"\nkind = \"ram\"\nsize = \"1MiB\"\n[[iscsi_target]]\n\
             iqn = \"iqn.2026-11.io.ironwire:t\"\n{}{}[[port]]\ntransport = \"iscsi\"\naddress = \"127.0.0.1:3260\"\n",
            acl("secret-one-12"),
            acl("secret-two-12")
        );
        let e = err_of(&text);
        assert!(e.contains("acl[1].initiator: \"iqn.2026-11.io.ironwire:host\" has an entry already"), "{e}");
    }

    fn err_of(text: &str) -> String {
        format!("{:#}", Config::parse(text).expect_err("should fail"))
    }

    /// Without `block_size`, a device has 512-byte blocks (`serve`'s
    /// default), so `check-config` must refuse a `size` that `serve` then
    /// cannot open: not a whole number of them, or 0.
    #[test]
    fn a_size_is_checked_against_the_default_block_size_too() {
        let base = "[[port]]\naddress = \"127.0.0.1:4420\"\n";
        for (kind, size) in [("null", "1000"), ("ram", "0"), ("ram", "1536000001")] {
            let e = err_of(&format!("{base}[[device]]\nname = \"a\"\nkind = \"{kind}\"\nsize = {size}\n"));
            assert!(e.contains("device[0] (a).size") && e.contains("block_size 512"), "{kind} {size}: {e}");
            let d = DeviceConfig {
                name: "a".into(),
                kind: kind.into(),
                size: Some(Size(size.parse().expect("bytes"))),
                ..DeviceConfig::default()
            };
            assert!(crate::serve::open_device(&d, blockdev::Symlinks::Refuse).is_err(), "serve opens {kind} {size}");
        }
        let e =
            err_of(&format!("{base}[[device]]\nname = \"a\"\nkind = \"file\"\npath = \"/tmp/a.img\"\nsize = 1000\n"));
        assert!(e.contains("device[0] (a).size"), "{e}");
        // A block device's size is its own: `size` is ignored there.
        let ok = format!("{base}[[device]]\nname = \"a\"\nkind = \"block\"\npath = \"/dev/null\"\nsize = 1000\n");
        assert!(Config::parse(&ok).is_ok());
        Config::parse(&format!("{base}[[device]]\nname = \"a\"\nkind = \"null\"\nsize = 1024\n")).expect("2 blocks");
    }

    #[test]
    fn errors_name_the_field_and_the_reason() {
        let base = "[[port]]\naddress = \"127.0.0.1:4420\"\n";
        let e =
            err_of(&format!("{base}[[device]]\nname = \"a\"\nkind = \"ram\"\nsize = \"1MiB\"\nblock_size = 1000\n"));
        assert!(e.contains("device[0] (a).block_size") && e.contains("power of two"), "{e}");
        let e =
            err_of(&format!("{base}[[device]]\nname = \"a\"\nkind = \"null\"\nsize = \"1MiB\"\nhuge_pages = false\n"));
        assert!(e.contains("device[0] (a).huge_pages") && e.contains("only for ram"), "{e}");
        let ok = Config::parse(&format!(
            "{base}[[device]]\nname = \"a\"\nkind = \"ram\"\nsize = \"1MiB\"\nhuge_pages = false\n"
        ));
        assert_eq!(ok.expect("huge_pages on a ram device").device[0].huge_pages, Some(false));
        let e = err_of(&format!(
            "{base}[[device]]\nname = \"a\"\nkind = \"file\"\npath = \"/tmp/a.img\"\nsize = \"1MiB\"\nread_only = true\n"
        ));
        assert!(e.contains("device[0] (a).read_only") && e.contains("leave size out"), "{e}");
        let e = err_of(&format!("{base}[[device]]\nname = \"a\"\nkind = \"tape\"\n"));
        assert!(e.contains("device[0] (a).kind") && e.contains("tape"), "{e}");
        let e = err_of(&format!("{base}[[subsystem]]\nnqn = \"nqn.2026-11.x:y\"\nallow_any_host = true\n[[subsystem.namespace]]\ndevice = \"missing\"\n"));
        assert!(e.contains("namespace[0].device") && e.contains("missing"), "{e}");
        let e = err_of(&format!("{base}[[subsystem]]\nnqn = \"not-an-nqn\"\n"));
        assert!(e.contains("subsystem[0].nqn"), "{e}");
        let e = err_of("[[port]]\naddress = \"localhost\"\n");
        assert!(e.contains("port[0].address"), "{e}");
        let e = err_of(&format!("{base}[[subsystem]]\nnqn = \"nqn.2026-11.x:y\"\n"));
        assert!(e.contains("hosts") && e.contains("no host could connect"), "{e}");
        let e = err_of(&format!(
            "{base}[[iscsi_target]]\niqn = \"iqn.2026-11.x:y\"\n[[iscsi_target.acl]]\ninitiator = \"iqn.2026-11.a:b\"\nchap = {{ user = \"u\", secret = \"short\" }}\n"
        ));
        assert!(e.contains("iscsi_target[0] (iqn.2026-11.x:y).acl[0].chap") && e.contains("12 to 255"), "{e}");
        let e = err_of(&format!("{base}bogus = 1\n"));
        assert!(e.contains("bogus"), "{e}");
    }

    #[test]
    fn control_section_errors_name_the_field() {
        let check = |text: &str| {
            let mut c = Config::embedded_default();
            c.control = toml::from_str(text).expect("control section");
            c.validate().err().map(|e| e.to_string())
        };
        assert_eq!(check("socket = \"/run/iw/ctl.sock\"\nallow_paths = [\"/srv/\", \"/dev/nvme*n1\"]"), None);
        let e = check("socket = \"ctl.sock\"").expect("relative socket");
        assert!(e.starts_with("control.socket:"), "{e}");
        let e = check(&format!("socket = \"/{}\"", "s".repeat(120))).expect("long socket");
        assert!(e.starts_with("control.socket:") && e.contains("107"), "{e}");
        let e = check("group = \"no-such-group-ironwire\"").expect("unknown group");
        assert!(e.starts_with("control.group:") && e.contains("no-such-group-ironwire"), "{e}");
        let e = check("allow_paths = [\"/srv/\", \"data/\"]").expect("relative entry");
        assert!(e.starts_with("control.allow_paths[1]:"), "{e}");
        let e = check("allow_paths = [\"/srv/../etc/\"]").expect("dot-dot entry");
        assert!(e.starts_with("control.allow_paths[0]:"), "{e}");
    }
}
