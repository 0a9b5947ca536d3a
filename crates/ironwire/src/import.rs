//! `ironwire import`: turns the saved configuration of the Linux kernel
//! targets into an ironwire configuration. Reads nvmetcli's JSON (`nvmetcli
//! save`) and targetcli-fb's `saveconfig.json` (rtslib-fb, documented in
//! saveconfig.json(5)); returns the TOML text and one note per thing that
//! has no equivalent. It never drops an access restriction silently: what
//! it cannot carry over safely is left out (fail closed) and named.

use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use toml::{Table, Value};

/// The result of an import: the configuration and what did not carry over.
pub struct Imported {
    /// The ironwire configuration, TOML.
    pub toml: String,
    /// One line per setting that did not carry over as it was, or a path
    /// this machine does not have, naming it.
    pub notes: Vec<String>,
}

/// Which tool wrote the file.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Format {
    /// `nvmetcli save` (the Linux NVMe target, nvmet).
    Nvmetcli,
    /// targetcli-fb / rtslib-fb `saveconfig.json` (the Linux SCSI target, LIO).
    Targetcli,
}

/// Reads `path` as `format`.
pub fn import(format: Format, path: &Path) -> Result<Imported> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    convert(format, path, &text)
}

/// Converts `text`, read from `path`, as `format`.
fn convert(format: Format, path: &Path, text: &str) -> Result<Imported> {
    let mut out = Builder::default();
    match format {
        Format::Nvmetcli => {
            let f: nvmet::File = serde_json::from_str(text)
                .with_context(|| format!("{} is not an nvmetcli configuration", path.display()))?;
            out.nvmet(&f)?;
        }
        Format::Targetcli => {
            let f: lio::File = serde_json::from_str(text)
                .with_context(|| format!("{} is not a targetcli saveconfig.json", path.display()))?;
            out.lio(&f)?;
        }
    }
    let mut doc = Table::new();
    for (key, list) in [("device", out.devices), ("subsystem", out.subsystems), ("port", out.ports)] {
        if !list.is_empty() {
            doc.insert(key.into(), Value::Array(list));
        }
    }
    if !out.targets.is_empty() {
        doc.insert("iscsi_target".into(), Value::Array(out.targets));
    }
    if let Some(chap) = out.discovery_chap {
        let mut iscsi = Table::new();
        iscsi.insert("discovery_chap".into(), chap);
        doc.insert("iscsi".into(), Value::Table(iscsi));
    }
    let body = toml::to_string(&doc).context("writing TOML")?;
    let tool = match format {
        Format::Nvmetcli => "nvmetcli",
        Format::Targetcli => "targetcli",
    };
    Ok(Imported {
        toml: format!("# Imported from {} ({tool}) by ironwire import.\n\n{body}", path.display()),
        notes: out.notes,
    })
}

/// Put before a subsystem name nvmet accepted but that is no NQN.
const IMPORTED_NQN_PREFIX: &str = "nqn.2026-11.io.ironwire.imported:";

/// nvmetcli's JSON: what `nvmetcli save` writes (nvmet configfs, one object
/// per directory).
mod nvmet {
    use serde::Deserialize;
    use std::collections::BTreeMap;

    #[derive(Deserialize)]
    pub struct File {
        #[serde(default)]
        pub hosts: Vec<Host>,
        #[serde(default)]
        pub ports: Vec<Port>,
        #[serde(default)]
        pub subsystems: Vec<Subsystem>,
    }

    #[derive(Deserialize)]
    pub struct Host {
        pub nqn: String,
    }

    #[derive(Deserialize)]
    pub struct Port {
        pub portid: serde_json::Value,
        #[serde(default)]
        pub addr: BTreeMap<String, String>,
        #[serde(default)]
        pub param: BTreeMap<String, String>,
        #[serde(default)]
        pub referrals: Vec<serde_json::Value>,
        /// Empty where the kernel has no ANA.
        #[serde(default)]
        pub ana_groups: Vec<AnaGroup>,
        #[serde(default)]
        pub subsystems: Vec<String>,
    }

    #[derive(Deserialize)]
    pub struct AnaGroup {
        pub grpid: u32,
        #[serde(default)]
        pub ana: BTreeMap<String, String>,
    }

    #[derive(Deserialize)]
    pub struct Subsystem {
        pub nqn: String,
        #[serde(default)]
        pub attr: BTreeMap<String, String>,
        #[serde(default)]
        pub allowed_hosts: Vec<String>,
        #[serde(default)]
        pub namespaces: Vec<Namespace>,
    }

    #[derive(Deserialize)]
    pub struct Namespace {
        pub nsid: u32,
        #[serde(default = "one")]
        pub enable: u8,
        #[serde(default)]
        pub device: BTreeMap<String, serde_json::Value>,
        pub ana_grpid: Option<u32>,
    }

    fn one() -> u8 {
        1
    }
}

/// rtslib-fb's saveconfig.json (saveconfig.json(5)).
mod lio {
    use serde::Deserialize;
    use std::collections::BTreeMap;

    #[derive(Deserialize)]
    pub struct File {
        #[serde(default)]
        pub storage_objects: Vec<StorageObject>,
        #[serde(default)]
        pub fabric_modules: Vec<FabricModule>,
        #[serde(default)]
        pub targets: Vec<Target>,
    }

    #[derive(Deserialize)]
    pub struct StorageObject {
        pub name: String,
        pub plugin: String,
        pub dev: Option<String>,
        pub size: Option<u64>,
        #[serde(default)]
        pub nullio: bool,
        #[serde(default)]
        pub readonly: bool,
        #[serde(default)]
        pub attributes: BTreeMap<String, serde_json::Value>,
    }

    /// Credentials as rtslib dumps them (`chap_userid`) or as the man page
    /// spells them (`userid`).
    #[derive(Deserialize, Default)]
    pub struct Auth {
        #[serde(alias = "chap_userid")]
        pub userid: Option<String>,
        #[serde(alias = "chap_password")]
        pub password: Option<String>,
        #[serde(alias = "chap_mutual_userid")]
        pub mutual_userid: Option<String>,
        #[serde(alias = "chap_mutual_password")]
        pub mutual_password: Option<String>,
    }

    #[derive(Deserialize)]
    pub struct FabricModule {
        pub name: String,
        #[serde(default)]
        pub discovery_enable_auth: bool,
        pub discovery_userid: Option<String>,
        pub discovery_password: Option<String>,
        pub discovery_mutual_userid: Option<String>,
    }

    #[derive(Deserialize)]
    pub struct Target {
        pub wwn: String,
        pub fabric: String,
        #[serde(default)]
        pub tpgs: Vec<Tpg>,
    }

    #[derive(Deserialize)]
    pub struct Tpg {
        pub tag: Option<u32>,
        #[serde(default = "yes")]
        pub enable: bool,
        #[serde(default)]
        pub attributes: BTreeMap<String, serde_json::Value>,
        #[serde(default)]
        pub luns: Vec<Lun>,
        #[serde(default)]
        pub portals: Vec<Portal>,
        #[serde(default)]
        pub node_acls: Vec<NodeAcl>,
        #[serde(flatten)]
        pub auth: Auth,
    }

    fn yes() -> bool {
        true
    }

    #[derive(Deserialize)]
    pub struct Lun {
        pub index: u64,
        pub storage_object: String,
    }

    #[derive(Deserialize)]
    pub struct Portal {
        pub ip_address: String,
        pub port: u16,
        #[serde(default)]
        pub iser: bool,
    }

    #[derive(Deserialize)]
    pub struct NodeAcl {
        pub node_wwn: String,
        #[serde(default)]
        pub mapped_luns: Vec<MappedLun>,
        #[serde(flatten)]
        pub auth: Auth,
    }

    #[derive(Deserialize)]
    pub struct MappedLun {
        pub index: u64,
        pub tpg_lun: u64,
        #[serde(default)]
        pub write_protect: bool,
    }
}

/// The ironwire objects being assembled, and the notes.
#[derive(Default)]
struct Builder {
    devices: Vec<Value>,
    /// Device name by backing path (a path shared by two exports is one
    /// device).
    by_path: HashMap<String, String>,
    subsystems: Vec<Value>,
    ports: Vec<Value>,
    /// `transport address` pairs already declared.
    port_keys: Vec<String>,
    targets: Vec<Value>,
    discovery_chap: Option<Value>,
    notes: Vec<String>,
}

fn table(pairs: impl IntoIterator<Item = (&'static str, Value)>) -> Value {
    Value::Table(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

fn s(v: &str) -> Value {
    Value::String(v.to_string())
}

fn size_value(bytes: u64) -> Value {
    Value::Integer(i64::try_from(bytes).unwrap_or(i64::MAX))
}

/// `ip:port` with IPv6 addresses in brackets.
fn socket_address(ip: &str, port: &str) -> String {
    if ip.contains(':') && !ip.starts_with('[') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

impl Builder {
    fn note(&mut self, what: String) {
        self.notes.push(what);
    }

    /// A device name not taken yet, from `want`.
    fn unique_name(&self, want: &str) -> String {
        let taken = |n: &str| self.devices.iter().any(|d| d.get("name").and_then(Value::as_str) == Some(n));
        let base: String =
            want.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '-' }).collect();
        let base = if base.is_empty() { "dev".to_string() } else { base };
        let mut name = base.clone();
        let mut n = 2;
        while taken(&name) {
            name = format!("{base}-{n}");
            n += 1;
        }
        name
    }

    /// A file or block device for `path`, by what the path is on this
    /// machine (`hint` when it does not exist here); one device per path.
    fn path_device(&mut self, what: &str, want_name: &str, path: &str, hint: &str, size: Option<u64>) -> String {
        if let Some(name) = self.by_path.get(path) {
            return name.clone();
        }
        let kind = match std::fs::metadata(path) {
            Ok(m) if std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()) => "block",
            Ok(m) if m.is_file() => "file",
            Ok(_) => {
                self.note(format!("{what}: {path} is neither a file nor a block device; declared as a {hint} device"));
                hint
            }
            Err(e) => {
                self.note(format!("{what}: {path} cannot be examined here ({e}); declared as a {hint} device"));
                hint
            }
        };
        let name = self.unique_name(want_name);
        let mut d = vec![("name", s(&name)), ("kind", s(kind)), ("path", s(path))];
        if let (Some(sz), "file") = (size, kind) {
            d.push(("size", size_value(sz)));
        }
        self.devices.push(table(d));
        self.by_path.insert(path.to_string(), name.clone());
        name
    }

    fn port(&mut self, transport: &str, address: String, discovery_only: bool) {
        let key = format!("{transport} {address}");
        if self.port_keys.contains(&key) {
            return;
        }
        self.port_keys.push(key);
        let mut p = vec![("transport", s(transport)), ("address", s(&address))];
        if discovery_only {
            p.push(("discovery_only", Value::Boolean(true)));
        }
        self.ports.push(table(p));
    }

    fn nvmet(&mut self, f: &nvmet::File) -> Result<()> {
        for h in &f.hosts {
            if !f.subsystems.iter().any(|s| s.allowed_hosts.contains(&h.nqn)) {
                self.note(format!(
                    "hosts: {} is allowed into no subsystem; ironwire declares hosts per subsystem",
                    h.nqn
                ));
            }
        }
        for p in &f.ports {
            let what = format!("ports[portid {}]", p.portid);
            let get = |k: &str| p.addr.get(k).map(String::as_str).unwrap_or("");
            let transport = match get("trtype") {
                "tcp" => "tcp",
                "rdma" => {
                    self.note(format!(
                        "{what}: trtype rdma is served as NVMe/RDMA over iWARP in software; hosts need an iWARP \
                         NIC or siw (InfiniBand and RoCE hosts cannot connect)"
                    ));
                    "rdma"
                }
                t => {
                    self.note(format!("{what}: trtype {t:?} has no equivalent (tcp and rdma only); port left out"));
                    continue;
                }
            };
            let (ip, svc) = (get("traddr"), get("trsvcid"));
            if ip.is_empty() || svc.is_empty() {
                bail!("{what}: addr.traddr and addr.trsvcid are required for a {transport} port");
            }
            if !matches!(get("treq"), "" | "not specified" | "not required") {
                self.note(format!(
                    "{what}: treq {:?} (secure channel) has no equivalent; port imported without it",
                    get("treq")
                ));
            }
            for (k, v) in &p.param {
                let default = matches!((k.as_str(), v.as_str()), ("pi_enable", "0"));
                if !default {
                    self.note(format!("{what}: param.{k} = {v:?} has no per-port equivalent (see [nvme_tcp])"));
                }
            }
            if !p.referrals.is_empty() {
                self.note(format!("{what}: {} referral(s) have no equivalent; left out", p.referrals.len()));
            }
            // A port linked to no subsystem serves only discovery in nvmet.
            let discovery_only = p.subsystems.is_empty();
            let exported = |s: &&nvmet::Subsystem| {
                s.attr.get("allow_any_host").is_some_and(|v| v == "1") || !s.allowed_hosts.is_empty()
            };
            let all = f.subsystems.iter().filter(exported).all(|s| p.subsystems.contains(&s.nqn));
            if !discovery_only && !all {
                self.note(format!(
                    "{what}: links only {}; ironwire exports every subsystem on every port",
                    p.subsystems.join(", ")
                ));
            }
            self.port(transport, socket_address(ip, svc), discovery_only);
        }
        for sub in &f.subsystems {
            let what = format!("subsystems[{}]", sub.nqn);
            if !f.ports.iter().any(|p| p.subsystems.contains(&sub.nqn)) {
                self.note(format!("{what}: linked to no port in nvmet; ironwire exports it on every port"));
            }
            let any = sub.attr.get("allow_any_host").is_some_and(|v| v == "1");
            let mut hosts = Vec::new();
            for h in &sub.allowed_hosts {
                if crate::config::valid_nqn(h) {
                    hosts.push(h.clone());
                } else {
                    self.note(format!(
                        "{what}: allowed host {h:?} is not an NQN (\"nqn.\" followed by a name, NVMe Base 2.0 \
                         section 4.5); ironwire cannot allow it; left out"
                    ));
                }
            }
            if !any && hosts.is_empty() {
                self.note(format!("{what}: no host may connect (allow_any_host 0, no usable allowed_hosts); left out"));
                continue;
            }
            let nqn = if crate::config::valid_nqn(&sub.nqn) {
                sub.nqn.clone()
            } else {
                let renamed = format!("{IMPORTED_NQN_PREFIX}{}", sub.nqn);
                self.note(format!(
                    "{what}: {:?} is not an NQN (\"nqn.\" followed by a name, NVMe Base 2.0 section 4.5); \
                     exported as {renamed:?}, the name hosts must connect to",
                    sub.nqn
                ));
                renamed
            };
            let mut t = vec![("nqn", s(&nqn))];
            for (k, v) in &sub.attr {
                match (k.as_str(), v.as_str()) {
                    ("allow_any_host" | "version", _) | ("pi_enable", "0") => {}
                    ("serial", _) => t.push(("serial", s(v))),
                    ("cntlid_min" | "cntlid_max", _) => match v.parse::<i64>() {
                        Ok(n) => {
                            t.push((if k == "cntlid_min" { "min_cntlid" } else { "max_cntlid" }, Value::Integer(n)))
                        }
                        Err(_) => bail!("{what}: attr.{k} = {v:?} is not a number"),
                    },
                    _ => self.note(format!("{what}: attr.{k} = {v:?} has no equivalent; left out")),
                }
            }
            let mut namespaces = Vec::new();
            for ns in &sub.namespaces {
                let nwhat = format!("{what}.namespaces[{}]", ns.nsid);
                if ns.enable == 0 {
                    self.note(format!("{nwhat}: disabled in nvmet; left out"));
                    continue;
                }
                let Some(path) = ns.device.get("path").and_then(|v| v.as_str()) else {
                    bail!("{nwhat}: device.path is missing");
                };
                let mut ids = Vec::new();
                for (k, v) in ns.device.iter().filter(|(k, _)| *k != "path") {
                    let text = v.as_str().unwrap_or_default();
                    match k.as_str() {
                        "uuid" => ids.push(("uuid", s(text))),
                        // nvmet writes an unset NGUID as zeros; ironwire
                        // then derives one.
                        "nguid" if text.chars().all(|c| c == '0' || c == '-') => {}
                        "nguid" => ids.push(("nguid", s(&text.replace('-', "")))),
                        _ => self.note(format!("{nwhat}: device.{k} has no equivalent; left out")),
                    }
                }
                let base = Path::new(path).file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
                let hint = if path.starts_with("/dev/") { "block" } else { "file" };
                let dev = self.path_device(&nwhat, &base, path, hint, None);
                self.nvmet_file_block_size(&dev, path);
                let mut entry = vec![("nsid", Value::Integer(i64::from(ns.nsid))), ("device", s(&dev))];
                entry.extend(ids);
                let state = self.nvmet_ana_state(&nwhat, f, &sub.nqn, ns.ana_grpid.unwrap_or(1));
                if state != "optimized" {
                    entry.push(("ana_state", s(state)));
                }
                namespaces.push(table(entry));
            }
            t.push(("allow_any_host", Value::Boolean(any)));
            if !any {
                t.push(("hosts", Value::Array(hosts.iter().map(|h| s(h)).collect())));
            }
            t.push(("namespace", Value::Array(namespaces)));
            self.subsystems.push(table(t));
        }
        Ok(())
    }

    /// The device table named `name`, among those made so far.
    fn device_mut(&mut self, name: &str) -> Option<&mut toml::Table> {
        self.devices.iter_mut().find_map(|d| match d {
            Value::Table(t) if t.get("name").and_then(Value::as_str) == Some(name) => Some(t),
            _ => None,
        })
    }

    /// The block size nvmet gives a file-backed namespace: the file
    /// system's, at most 4096 (4096 for a file not on this machine).
    fn nvmet_file_block_size(&mut self, dev: &str, path: &str) {
        let bs = std::fs::metadata(path).map_or(4096, |m| std::os::unix::fs::MetadataExt::blksize(&m).clamp(512, 4096));
        if let Some(d) = self.device_mut(dev) {
            if d.get("kind").and_then(Value::as_str) == Some("file") && !d.contains_key("block_size") {
                d.insert("block_size".into(), Value::Integer(i64::try_from(bs).unwrap_or(4096)));
            }
        }
    }

    /// The ANA state of group `grpid` on the imported ports linking
    /// subsystem `nqn` (every imported port when none links it): nvmet's
    /// state where the ports agree, else the least accessible, named.
    fn nvmet_ana_state(&mut self, what: &str, f: &nvmet::File, nqn: &str, grpid: u32) -> &'static str {
        const ORDER: [&str; 5] = ["optimized", "non-optimized", "change", "inaccessible", "persistent-loss"];
        let served = |p: &&nvmet::Port| {
            matches!(p.addr.get("trtype").map(String::as_str), Some("tcp" | "rdma")) && !p.ana_groups.is_empty()
        };
        let linked: Vec<&nvmet::Port> =
            f.ports.iter().filter(served).filter(|p| p.subsystems.iter().any(|s| s == nqn)).collect();
        let ports = if linked.is_empty() { f.ports.iter().filter(served).collect() } else { linked };
        let mut states = Vec::new();
        for p in ports {
            // nvmet starts group 1 optimized and any other inaccessible.
            let state = match p.ana_groups.iter().find(|g| g.grpid == grpid) {
                Some(g) => g.ana.get("state").map_or("optimized", String::as_str),
                None if grpid == 1 => "optimized",
                None => "inaccessible",
            };
            let rank = ORDER.iter().position(|s| *s == state).unwrap_or_else(|| {
                self.note(format!("{what}: ANA state {state:?} is unknown; imported as inaccessible"));
                3
            });
            states.push(rank);
        }
        let worst = states.iter().copied().max().unwrap_or(0);
        if states.iter().any(|r| *r != worst) {
            self.note(format!(
                "{what}: ANA group {grpid} differs between ports; ironwire has one state per namespace; imported \
                 as {}",
                ORDER[worst]
            ));
        }
        ORDER[worst]
    }

    fn lio(&mut self, f: &lio::File) -> Result<()> {
        // Storage objects by their path in the targetcli tree.
        let mut objects: BTreeMap<String, String> = BTreeMap::new();
        for so in &f.storage_objects {
            let what = format!("storage_objects[{}/{}]", so.plugin, so.name);
            let key = format!("/backstores/{}/{}", so.plugin, so.name);
            let block_size = so.attributes.get("block_size").and_then(|v| v.as_u64());
            let name = match so.plugin.as_str() {
                "fileio" | "block" => {
                    let Some(dev) = &so.dev else { bail!("{what}: dev is missing") };
                    let hint = if so.plugin == "block" { "block" } else { "file" };
                    self.path_device(&what, &so.name, dev, hint, so.size)
                }
                "ramdisk" => {
                    let Some(size) = so.size else { bail!("{what}: size is missing") };
                    let name = self.unique_name(&so.name);
                    let kind = if so.nullio { "null" } else { "ram" };
                    self.devices.push(table([("name", s(&name)), ("kind", s(kind)), ("size", size_value(size))]));
                    name
                }
                p => {
                    self.note(format!("{what}: plugin {p:?} has no equivalent (fileio, block, ramdisk); left out"));
                    continue;
                }
            };
            if let Some(bs) = block_size {
                if let Some(d) = self.device_mut(&name) {
                    d.insert("block_size".into(), Value::Integer(i64::try_from(bs).unwrap_or(0)));
                }
            }
            // Backstores on one path share one device, and its read_only.
            let shared = objects.values().any(|n| n == &name);
            let mut notes = Vec::new();
            if let Some(d) = self.device_mut(&name) {
                let was_read_only = d.get("read_only").and_then(Value::as_bool) == Some(true);
                if so.readonly {
                    d.insert("read_only".into(), Value::Boolean(true));
                    // A read-only file device takes its file's length.
                    if d.get("kind").and_then(Value::as_str) == Some("file") && d.remove("size").is_some() {
                        notes.push(format!("{what}: read-only, so its size is the file's length"));
                    }
                    if shared && !was_read_only {
                        notes.push(format!("{what}: read-only; the backstores sharing its path become read-only too"));
                    }
                } else if shared && was_read_only {
                    notes.push(format!("{what}: shares its path with a read-only backstore; exported read-only"));
                }
            }
            for n in notes {
                self.note(n);
            }
            objects.insert(key, name);
        }
        for m in &f.fabric_modules {
            if m.name != "iscsi" || !m.discovery_enable_auth {
                continue;
            }
            match (&m.discovery_userid, &m.discovery_password) {
                (Some(u), Some(p)) => {
                    if m.discovery_mutual_userid.as_deref().is_some_and(|u| !u.is_empty()) {
                        self.note(
                            "fabric_modules[iscsi]: mutual discovery CHAP has no equivalent; one-way CHAP kept".into(),
                        );
                    }
                    match self.chap("fabric_modules[iscsi] discovery", u, p) {
                        Some(c) => self.discovery_chap = Some(c),
                        None => bail!(
                            "fabric_modules[iscsi]: discovery CHAP cannot carry over; refusing to import discovery \
                             without it"
                        ),
                    }
                }
                _ => bail!("fabric_modules[iscsi]: discovery_enable_auth without discovery_userid/password"),
            }
        }
        // Each imported target's portals in LIO.
        let mut served = Vec::new();
        for t in &f.targets {
            let what = format!("targets[{}]", t.wwn);
            if t.fabric != "iscsi" {
                self.note(format!("{what}: fabric {:?} has no equivalent (iscsi only); left out", t.fabric));
                continue;
            }
            let mut tpgs = t.tpgs.iter().filter(|g| g.enable);
            let Some(tpg) = tpgs.next() else {
                self.note(format!("{what}: no enabled TPG; left out"));
                continue;
            };
            for g in tpgs {
                self.note(format!(
                    "{what}: TPG {} left out; ironwire has one portal group per target (TPG {} imported)",
                    g.tag.unwrap_or(0),
                    tpg.tag.unwrap_or(1)
                ));
            }
            if let Some(target) = self.lio_target(t, tpg, &objects) {
                self.targets.push(target);
                let portals: Vec<String> =
                    tpg.portals.iter().map(|p| socket_address(&p.ip_address, &p.port.to_string())).collect();
                served.push((what, portals));
            }
        }
        // LIO serves a target only on its TPG's portals (none: on no
        // address at all); ironwire serves every target on every port.
        let every: Vec<String> =
            self.port_keys.iter().filter_map(|k| k.strip_prefix("iscsi ")).map(str::to_string).collect();
        for (what, portals) in served {
            let others: Vec<&str> =
                every.iter().map(String::as_str).filter(|a| !portals.iter().any(|p| p == a)).collect();
            if portals.is_empty() {
                self.note(format!(
                    "{what}: has no portal in LIO, so no initiator reaches it there; ironwire exports every target \
                     on every iSCSI port ({})",
                    others.join(", ")
                ));
            } else if !others.is_empty() {
                self.note(format!(
                    "{what}: LIO serves it only on {}; ironwire exports every target on every iSCSI port, so also \
                     on {}",
                    portals.join(", "),
                    others.join(", ")
                ));
            }
        }
        Ok(())
    }

    /// CHAP credentials as ironwire takes them, or `None` (with a note)
    /// when ironwire would refuse them.
    fn chap(&mut self, what: &str, user: &str, secret: &str) -> Option<Value> {
        let c = crate::config::ChapConfig { user: user.into(), secret: secret.into() };
        match crate::config::check_chap(&c) {
            Ok(()) => Some(table([("user", s(user)), ("secret", s(secret))])),
            Err(e) => {
                self.note(format!("{what}: CHAP {e}"));
                None
            }
        }
    }

    /// CHAP and mutual CHAP from rtslib credentials; `Err(())` when they
    /// are set but cannot carry over.
    fn auth(&mut self, what: &str, a: &lio::Auth) -> Result<Vec<(&'static str, Value)>, ()> {
        let mut out = Vec::new();
        let filled = |v: &Option<String>| v.as_deref().filter(|x| !x.is_empty()).map(str::to_string);
        if let (Some(u), Some(p)) = (filled(&a.userid), filled(&a.password)) {
            out.push(("chap", self.chap(what, &u, &p).ok_or(())?));
            if let (Some(mu), Some(mp)) = (filled(&a.mutual_userid), filled(&a.mutual_password)) {
                if mp == p {
                    // No mutual login could succeed (RFC 7143 12.1.3).
                    self.note(format!("{what}: the mutual CHAP secret is the CHAP secret; the two must differ"));
                    return Err(());
                }
                out.push(("mutual_chap", self.chap(&format!("{what} mutual"), &mu, &mp).ok_or(())?));
            }
        }
        Ok(out)
    }

    fn lio_target(&mut self, t: &lio::Target, tpg: &lio::Tpg, objects: &BTreeMap<String, String>) -> Option<Value> {
        let what = format!("targets[{}]", t.wwn);
        let attr = |k: &str| tpg.attributes.get(k).and_then(|v| v.as_u64().or_else(|| v.as_str()?.parse().ok()));
        let mut demo = attr("generate_node_acls") == Some(1);
        let authentication = attr("authentication") == Some(1);
        // LIO's defaults: demo-mode initiators get read-only LUNs, ACL ones
        // read-write.
        if demo && attr("demo_mode_write_protect") != Some(0) {
            self.note(format!(
                "{what}: demo_mode_write_protect (initiators without an ACL see read-only LUNs) has no equivalent; \
                 LUNs are read-write"
            ));
        }
        if !tpg.node_acls.is_empty() && attr("prod_mode_write_protect") == Some(1) {
            self.note(format!("{what}: prod_mode_write_protect has no equivalent; LUNs are read-write"));
        }
        for p in &tpg.portals {
            if p.iser {
                self.note(format!(
                    "{what}: portal {}:{} iser has no equivalent; served as plain iSCSI/TCP",
                    p.ip_address, p.port
                ));
            }
            self.port("iscsi", socket_address(&p.ip_address, &p.port.to_string()), false);
        }
        let mut luns = Vec::new();
        for l in &tpg.luns {
            match objects.get(&l.storage_object) {
                Some(dev) => luns.push(table([
                    ("lun", Value::Integer(i64::try_from(l.index).unwrap_or(i64::MAX))),
                    ("device", s(dev)),
                ])),
                None => self
                    .note(format!("{what}: LUN {} ({}) left out with its storage object", l.index, l.storage_object)),
            }
        }
        let mut acls = Vec::new();
        for a in &tpg.node_acls {
            let awhat = format!("{what}.node_acls[{}]", a.node_wwn);
            let identity = a.mapped_luns.len() == tpg.luns.len() && a.mapped_luns.iter().all(|m| m.index == m.tpg_lun);
            if !identity {
                self.note(format!("{awhat}: mapped_luns differ from the TPG's LUNs; every initiator sees all of them"));
            }
            if a.mapped_luns.iter().any(|m| m.write_protect) {
                self.note(format!("{awhat}: write_protect has no equivalent; LUNs are read-write"));
            }
            let Ok(auth) = self.auth(&awhat, &a.auth) else {
                self.note(format!("{awhat}: left out, so this initiator cannot log in"));
                continue;
            };
            // LIO checks an ACL's initiator against the ACL's credentials
            // only (the TPG's are for demo mode).
            if authentication && auth.is_empty() {
                self.note(format!(
                    "{awhat}: authentication is on but this ACL has no credentials; it cannot log in; left out"
                ));
                continue;
            }
            let mut entry = vec![("initiator", s(&a.node_wwn))];
            entry.extend(auth);
            acls.push(table(entry));
        }
        // Demo-mode initiators log in with the TPG's credentials, ironwire's
        // target ones.
        let mut chap = Vec::new();
        if authentication && demo {
            match self.auth(&what, &tpg.auth) {
                Ok(a) if a.is_empty() => {
                    self.note(format!(
                        "{what}: generate_node_acls with authentication on and no TPG credentials: only ACL \
                         initiators can log in; allow_any_initiator left off"
                    ));
                    demo = false;
                }
                Ok(a) => chap = a,
                Err(()) => {
                    self.note(format!("{what}: left out, since its TPG credentials cannot carry over"));
                    return None;
                }
            }
        }
        let mut target = vec![("iqn", s(&t.wwn)), ("allow_any_initiator", Value::Boolean(demo))];
        target.extend(chap);
        if !demo && acls.is_empty() {
            self.note(format!(
                "{what}: no initiator may log in (no usable node_acls, generate_node_acls off); left out"
            ));
            return None;
        }
        if !acls.is_empty() {
            target.push(("acl", Value::Array(acls)));
        }
        target.push(("lun", Value::Array(luns)));
        Some(table(target))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_addresses_get_brackets() {
        assert_eq!(socket_address("::1", "4420"), "[::1]:4420");
        assert_eq!(socket_address("10.0.0.1", "3260"), "10.0.0.1:3260");
    }

    /// The configuration and the notes `json` converts into.
    fn convert_json(format: Format, json: &str) -> (Table, String) {
        let out = convert(format, Path::new("test.json"), json).expect("converts");
        (out.toml.parse().expect("TOML"), out.notes.join("\n"))
    }

    fn targets(t: &Table) -> Vec<&Value> {
        t.get("iscsi_target").and_then(Value::as_array).into_iter().flatten().collect()
    }

    /// One iSCSI target with one TPG holding `tpg` (JSON members).
    fn lio_target(tpg: &str) -> String {
        format!(
            r#"{{"storage_objects": [{{"name": "r", "plugin": "ramdisk", "size": 1048576}}],
            "targets": [{{"fabric": "iscsi", "wwn": "iqn.2003-01.org.example:t", "tpgs": [{{"tag": 1, "enable": true,
            "luns": [{{"index": 0, "storage_object": "/backstores/ramdisk/r"}}],
            "portals": [{{"ip_address": "0.0.0.0", "port": 3260}}], {tpg}}}]}}]}}"#
        )
    }

    #[test]
    fn lio_demo_mode_needing_chap_without_tpg_credentials_admits_no_one() {
        // LIO authenticates a demo-mode initiator with the TPG's own
        // credentials; with none set, no such initiator can log in.
        let json = lio_target(r#""attributes": {"authentication": 1, "generate_node_acls": 1}, "node_acls": []"#);
        let (t, notes) = convert_json(Format::Targetcli, &json);
        assert!(
            targets(&t).iter().all(|t| t.get("allow_any_initiator").and_then(Value::as_bool) != Some(true)),
            "an open target: {t}"
        );
        assert!(notes.contains("no TPG credentials"), "{notes}");
    }

    #[test]
    fn lio_acl_without_credentials_does_not_inherit_the_tpg_ones() {
        // LIO checks an explicit ACL's initiator against that ACL's
        // credentials only; the TPG's are for demo-mode initiators.
        let json = lio_target(
            r#""attributes": {"authentication": 1, "generate_node_acls": 0},
            "chap_userid": "demo", "chap_password": "demo-secret-123",
            "node_acls": [{"node_wwn": "iqn.1994-05.com.example:bare", "mapped_luns": [{"index": 0, "tpg_lun": 0}]},
                {"node_wwn": "iqn.1994-05.com.example:own", "chap_userid": "own", "chap_password": "own-secret-1234",
                 "mapped_luns": [{"index": 0, "tpg_lun": 0}]}]"#,
        );
        let (t, notes) = convert_json(Format::Targetcli, &json);
        let target = targets(&t).first().copied().expect("the target");
        let acls: Vec<&str> = target["acl"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.get("initiator").and_then(Value::as_str))
            .collect();
        assert_eq!(acls, ["iqn.1994-05.com.example:own"], "{t}");
        assert!(notes.contains("example:bare]: authentication is on but this ACL has no credentials"), "{notes}");
    }

    #[test]
    fn lio_acl_whose_mutual_chap_secret_is_its_chap_secret_is_left_out() {
        // No mutual CHAP login can succeed with one secret both ways: the
        // ACL cannot carry over (and would fail check-config).
        let json = lio_target(
            r#""attributes": {"authentication": 1, "generate_node_acls": 0},
            "node_acls": [{"node_wwn": "iqn.1994-05.com.example:same", "chap_userid": "in",
                 "chap_password": "one-secret-123", "chap_mutual_userid": "out",
                 "chap_mutual_password": "one-secret-123", "mapped_luns": [{"index": 0, "tpg_lun": 0}]}]"#,
        );
        let (t, notes) = convert_json(Format::Targetcli, &json);
        assert!(!t.to_string().contains("example:same"), "{t}");
        assert!(notes.contains("example:same]: the mutual CHAP secret is the CHAP secret"), "{notes}");
    }

    #[test]
    fn lio_readonly_marks_the_device_and_backstores_sharing_its_path_are_named() {
        let json = r#"{"storage_objects": [
            {"name": "ro", "plugin": "fileio", "dev": "/nonexistent/golden.img", "size": 1048576, "readonly": true},
            {"name": "rw", "plugin": "fileio", "dev": "/nonexistent/golden.img", "size": 1048576}],
            "targets": []}"#;
        let (t, notes) = convert_json(Format::Targetcli, json);
        let out = toml::to_string(&t).expect("TOML");
        let devices = t["device"].as_array().expect("devices");
        assert_eq!(devices.len(), 1, "one device per path: {out}");
        assert_eq!(devices[0]["read_only"].as_bool(), Some(true), "{out}");
        assert!(devices[0].get("size").is_none(), "a read-only file device takes its file's length: {out}");
        assert!(notes.contains("shares its path with a read-only backstore"), "{notes}");
    }

    #[test]
    fn lio_write_protect_attributes_are_named() {
        // demo_mode_write_protect is 1 unless set otherwise: demo-mode
        // initiators get read-only LUNs.
        let json = lio_target(r#""attributes": {"generate_node_acls": 1, "demo_mode_write_protect": 1}"#);
        let (_, notes) = convert_json(Format::Targetcli, &json);
        assert!(notes.contains("demo_mode_write_protect"), "{notes}");
        let json = lio_target(
            r#""attributes": {"prod_mode_write_protect": 1},
            "node_acls": [{"node_wwn": "iqn.1994-05.com.example:a", "mapped_luns": [{"index": 0, "tpg_lun": 0}]}]"#,
        );
        let (_, notes) = convert_json(Format::Targetcli, &json);
        assert!(notes.contains("prod_mode_write_protect"), "{notes}");
    }

    #[test]
    fn lio_targets_served_on_portals_they_did_not_have_are_named() {
        // LIO serves a target only on its TPG's portals; ironwire serves
        // every target on every iSCSI port.
        let target = |iqn: &str, portals: &str| {
            format!(
                r#"{{"fabric": "iscsi", "wwn": "{iqn}", "tpgs": [{{"tag": 1, "enable": true,
                "attributes": {{"generate_node_acls": 1, "demo_mode_write_protect": 0}},
                "luns": [{{"index": 0, "storage_object": "/backstores/ramdisk/r"}}], "portals": [{portals}]}}]}}"#
            )
        };
        let json = format!(
            r#"{{"storage_objects": [{{"name": "r", "plugin": "ramdisk", "size": 1048576}}], "targets": [{}, {}, {}]}}"#,
            target("iqn.2003-01.org.example:inside", r#"{"ip_address": "10.0.0.1", "port": 3260}"#),
            target("iqn.2003-01.org.example:public", r#"{"ip_address": "192.0.2.1", "port": 3260}"#),
            target("iqn.2003-01.org.example:unreachable", ""),
        );
        let (t, notes) = convert_json(Format::Targetcli, &json);
        assert_eq!(targets(&t).len(), 3, "{t}");
        assert!(notes.contains("example:inside]: LIO serves it only on 10.0.0.1:3260"), "{notes}");
        assert!(notes.contains("also on 192.0.2.1:3260"), "{notes}");
        assert!(notes.contains("example:public]: LIO serves it only on 192.0.2.1:3260"), "{notes}");
        assert!(notes.contains("example:unreachable]: has no portal in LIO"), "{notes}");
        // One target on every portal: nothing to say.
        let json = lio_target(r#""attributes": {"generate_node_acls": 1, "demo_mode_write_protect": 0}"#);
        let (_, notes) = convert_json(Format::Targetcli, &json);
        assert!(!notes.contains("LIO serves it only"), "{notes}");
    }

    /// One subsystem open to any host with namespaces `namespaces` on one
    /// TCP port with ANA groups `ana_groups` (JSON arrays).
    fn nvmet_file(namespaces: &str, ana_groups: &str) -> String {
        format!(
            r#"{{"hosts": [], "ports": [{{"addr": {{"adrfam": "ipv4", "traddr": "10.0.0.1", "treq": "not specified",
            "trsvcid": "4420", "trtype": "tcp"}}, "ana_groups": {ana_groups}, "param": {{}}, "portid": 1,
            "referrals": [], "subsystems": ["nqn.2026-11.com.example:s"]}}],
            "subsystems": [{{"allowed_hosts": [], "attr": {{"allow_any_host": "1"}},
            "namespaces": {namespaces}, "nqn": "nqn.2026-11.com.example:s"}}]}}"#
        )
    }

    fn namespaces(t: &Table) -> Vec<&Value> {
        t["subsystem"][0]["namespace"].as_array().into_iter().flatten().collect()
    }

    #[test]
    fn nvmet_ana_states_carry_over() {
        let ns = r#"[{"device": {"path": "/dev/nvme0n1"}, "enable": 1, "nsid": 1, "ana_grpid": 1},
            {"device": {"path": "/dev/nvme1n1"}, "enable": 1, "nsid": 2, "ana_grpid": 2},
            {"device": {"path": "/dev/nvme2n1"}, "enable": 1, "nsid": 3, "ana_grpid": 3}]"#;
        let groups = r#"[{"ana": {"state": "inaccessible"}, "grpid": 1},
            {"ana": {"state": "non-optimized"}, "grpid": 2}]"#;
        let (t, _) = convert_json(Format::Nvmetcli, &nvmet_file(ns, groups));
        let states: Vec<Option<&str>> =
            namespaces(&t).iter().map(|n| n.get("ana_state").and_then(Value::as_str)).collect();
        // Group 3 is not on the port: nvmet reports it inaccessible there.
        assert_eq!(states, [Some("inaccessible"), Some("non-optimized"), Some("inaccessible")], "{t}");
        // A port without ANA groups (a kernel without ANA): optimized.
        let (t, _) = convert_json(Format::Nvmetcli, &nvmet_file(ns, "[]"));
        assert!(namespaces(&t).iter().all(|n| n.get("ana_state").is_none()), "{t}");
    }

    #[test]
    fn nvmet_file_namespaces_keep_their_block_size() {
        // nvmet gives a file-backed namespace the file system's block size
        // (capped at 4096), not 512.
        let ns = r#"[{"device": {"path": "/nonexistent/ironwire-import/a.img"}, "enable": 1, "nsid": 1}]"#;
        let (t, _) = convert_json(Format::Nvmetcli, &nvmet_file(ns, "[]"));
        let dev = &t["device"][0];
        assert_eq!(
            (dev["kind"].as_str(), dev.get("block_size").and_then(Value::as_integer)),
            (Some("file"), Some(4096))
        );
    }

    #[test]
    fn device_names_are_unique_and_tame() {
        let mut b = Builder::default();
        b.devices.push(table([("name", s("disk"))]));
        assert_eq!(b.unique_name("disk"), "disk-2");
        assert_eq!(b.unique_name("a b/c"), "a-b-c");
    }
}
