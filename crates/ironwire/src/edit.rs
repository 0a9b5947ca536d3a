//! The ctl edit grammar: `add|set|remove NOUN key=value...` turned into a
//! new whole configuration (docs/ctl.md).
//!
//! An edit works on the configuration as a TOML tree, so every key the
//! file accepts is accepted here under the same name, and the result goes
//! back through the same parser: an unknown key or a bad value is refused
//! the way `check-config` refuses it. This module only edits; it opens
//! nothing and validates nothing beyond the shape of the request.

use crate::config::Config;
use anyhow::{anyhow, bail, Result};
use toml::{Table, Value};

/// Keys whose values are numbers.
const NUMBER_KEYS: &[&str] = &[
    "block_size",
    "read_latency_us",
    "write_latency_us",
    "nsid",
    "lun",
    "connect_timeout",
    "min_cntlid",
    "max_cntlid",
];
/// Keys whose values are `true` or `false`.
const BOOL_KEYS: &[&str] =
    &["allow_any_host", "allow_any_initiator", "discovery_only", "crc", "huge_pages", "read_only"];

/// The nouns and the keys that name one of them.
pub const NOUNS: &str = "device name= | subsystem nqn= | namespace nqn= nsid= | host nqn= host= | \
                         port address= [transport=] | target iqn= | lun iqn= lun= | initiator iqn= initiator= | \
                         acl iqn= initiator= | discovery_chap";

/// `key=value` words as (key, typed value); an empty value is `None`
/// (`set` removes the key).
fn pairs(words: &[&str]) -> Result<Vec<(String, Option<Value>)>> {
    let mut out = Vec::new();
    for w in words {
        let (k, v) = w.split_once('=').ok_or_else(|| anyhow!("{w:?} is not key=value"))?;
        if k.is_empty() {
            bail!("{w:?} has no key");
        }
        let value = if v.is_empty() {
            None
        } else if NUMBER_KEYS.contains(&k) {
            Some(Value::Integer(v.parse().map_err(|_| anyhow!("{k}: {v:?} is not a number"))?))
        } else if BOOL_KEYS.contains(&k) {
            Some(Value::Boolean(v.parse().map_err(|_| anyhow!("{k}: {v:?} is not true or false"))?))
        } else if k == "size" && v.bytes().all(|b| b.is_ascii_digit()) {
            Some(Value::Integer(v.parse().map_err(|_| anyhow!("size: {v:?} is too large"))?))
        } else {
            Some(Value::String(v.to_string()))
        };
        if out.iter().any(|(o, _): &(String, _)| o == k) {
            bail!("{k} given twice");
        }
        out.push((k.to_string(), value));
    }
    Ok(out)
}

/// Takes the value of `key` out of `kv`; `None` when absent or empty.
fn take(kv: &mut Vec<(String, Option<Value>)>, key: &str) -> Option<Value> {
    let at = kv.iter().position(|(k, _)| k == key)?;
    kv.remove(at).1
}

/// Sets a possibly dotted key (`chap.user`) in `t`; `None` removes it.
fn put(t: &mut Table, key: &str, v: Option<Value>) -> Result<()> {
    match key.split_once('.') {
        Some((head, rest)) => {
            let inner = t.entry(head).or_insert_with(|| Value::Table(Table::new()));
            let inner = inner.as_table_mut().ok_or_else(|| anyhow!("{head} is not a table"))?;
            put(inner, rest, v)?;
            if inner.is_empty() {
                t.remove(head);
            }
        }
        None => {
            match v {
                Some(v) => t.insert(key.to_string(), v),
                None => t.remove(key),
            };
        }
    }
    Ok(())
}

fn list<'a>(t: &'a mut Table, key: &str) -> Result<&'a mut Vec<Value>> {
    t.entry(key)
        .or_insert_with(|| Value::Array(Vec::new()))
        .as_array_mut()
        .ok_or_else(|| anyhow!("{key} is not a list"))
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Adds, changes or removes the table of `list_key` in `t` whose `ids`
/// have the given values.
fn edit_list(
    t: &mut Table,
    list_key: &str,
    noun: &str,
    ids: &[(&str, Value)],
    verb: &str,
    mut kv: Vec<(String, Option<Value>)>,
) -> Result<()> {
    let name = ids.iter().map(|(k, v)| format!("{k}={}", show(v))).collect::<Vec<_>>().join(" ");
    let items = list(t, list_key)?;
    let found = items.iter().position(|item| ids.iter().all(|(k, v)| item.get(*k) == Some(v)));
    match (verb, found) {
        ("add", Some(_)) => bail!("{noun} {name} already exists"),
        ("add", None) => {
            let mut item = Table::new();
            for (k, v) in ids {
                item.insert((*k).to_string(), v.clone());
            }
            for (k, v) in kv.drain(..) {
                put(&mut item, &k, v)?;
            }
            items.push(Value::Table(item));
        }
        (_, None) => bail!("no {noun} {name}"),
        ("remove", Some(at)) => {
            if let Some((k, _)) = kv.first() {
                bail!(
                    "remove {noun} takes only {}; {k} is not one of them",
                    ids.iter().map(|i| i.0).collect::<Vec<_>>().join(", ")
                );
            }
            items.remove(at);
        }
        (_, Some(at)) => {
            let item = items
                .get_mut(at)
                .and_then(Value::as_table_mut)
                .ok_or_else(|| anyhow!("{noun} {name} is not a table"))?;
            if kv.is_empty() {
                bail!("set {noun} {name}: nothing to change (give key=value)");
            }
            for (k, v) in kv.drain(..) {
                put(item, &k, v)?;
            }
        }
    }
    Ok(())
}

/// Adds or removes `value` in the list of strings `list_key` of `t`.
fn edit_strings(t: &mut Table, list_key: &str, noun: &str, verb: &str, value: Value) -> Result<()> {
    let items = list(t, list_key)?;
    let at = items.iter().position(|v| *v == value);
    match (verb, at) {
        ("add", None) => items.push(value),
        ("add", Some(_)) => bail!("{noun} {} is already there", show(&value)),
        // Every entry of it: a file may list it twice, and one left would
        // still let it in.
        ("remove", Some(_)) => items.retain(|v| *v != value),
        ("remove", None) => bail!("no {noun} {}", show(&value)),
        _ => bail!("{noun}: use add or remove"),
    }
    Ok(())
}

/// The parent table (a subsystem or an iSCSI target) whose `id_key` is
/// `id`.
fn parent<'a>(root: &'a mut Table, list_key: &str, id_key: &str, id: &Value, what: &str) -> Result<&'a mut Table> {
    list(root, list_key)?
        .iter_mut()
        .find(|item| item.get(id_key) == Some(id))
        .and_then(Value::as_table_mut)
        .ok_or_else(|| anyhow!("no {what} {}", show(id)))
}

fn need(kv: &mut Vec<(String, Option<Value>)>, key: &str, noun: &str) -> Result<Value> {
    take(kv, key).ok_or_else(|| anyhow!("{noun}: {key}= is required"))
}

/// `config` with the edit `verb noun words` made (not yet validated).
pub fn edit(config: &Config, verb: &str, noun: &str, words: &[&str]) -> Result<Config> {
    if !matches!(verb, "add" | "set" | "remove") {
        bail!("unknown verb {verb:?} (add, set, remove)");
    }
    let mut kv = pairs(words)?;
    let mut root = match Value::try_from(config)? {
        Value::Table(t) => t,
        _ => bail!("the configuration is not a table"),
    };
    match noun {
        "device" => {
            let name = need(&mut kv, "name", noun)?;
            edit_list(&mut root, "device", noun, &[("name", name)], verb, kv)?;
        }
        "subsystem" => {
            let nqn = need(&mut kv, "nqn", noun)?;
            edit_list(&mut root, "subsystem", noun, &[("nqn", nqn)], verb, kv)?;
        }
        "namespace" => {
            let nqn = need(&mut kv, "nqn", noun)?;
            let s = parent(&mut root, "subsystem", "nqn", &nqn, "subsystem")?;
            let nsid = match take(&mut kv, "nsid") {
                Some(n) => n,
                None if verb == "add" => {
                    let used: Vec<i64> = list(s, "namespace")?
                        .iter()
                        .filter_map(|n| n.get("nsid").and_then(Value::as_integer))
                        .collect();
                    Value::Integer((1..).find(|n| !used.contains(n)).unwrap_or(1))
                }
                None => bail!("namespace: nsid= is required"),
            };
            edit_list(s, "namespace", noun, &[("nsid", nsid)], verb, kv)?;
        }
        "host" => {
            let nqn = need(&mut kv, "nqn", noun)?;
            let host = need(&mut kv, "host", noun)?;
            only_ids(&kv, noun)?;
            edit_strings(parent(&mut root, "subsystem", "nqn", &nqn, "subsystem")?, "hosts", noun, verb, host)?;
        }
        "port" => {
            let address = need(&mut kv, "address", noun)?;
            let transport = take(&mut kv, "transport").unwrap_or_else(|| Value::String("tcp".into()));
            edit_list(&mut root, "port", noun, &[("address", address), ("transport", transport)], verb, kv)?;
        }
        "target" => {
            let iqn = need(&mut kv, "iqn", noun)?;
            edit_list(&mut root, "iscsi_target", noun, &[("iqn", iqn)], verb, kv)?;
        }
        "lun" => {
            let iqn = need(&mut kv, "iqn", noun)?;
            let t = parent(&mut root, "iscsi_target", "iqn", &iqn, "iSCSI target")?;
            let lun = match take(&mut kv, "lun") {
                Some(n) => n,
                None if verb == "add" => {
                    let used: Vec<i64> =
                        list(t, "lun")?.iter().filter_map(|n| n.get("lun").and_then(Value::as_integer)).collect();
                    Value::Integer((0..).find(|n| !used.contains(n)).unwrap_or(0))
                }
                None => bail!("lun: lun= is required"),
            };
            edit_list(t, "lun", noun, &[("lun", lun)], verb, kv)?;
        }
        "initiator" => {
            let iqn = need(&mut kv, "iqn", noun)?;
            let initiator = need(&mut kv, "initiator", noun)?;
            only_ids(&kv, noun)?;
            let t = parent(&mut root, "iscsi_target", "iqn", &iqn, "iSCSI target")?;
            edit_strings(t, "initiators", noun, verb, initiator)?;
        }
        "acl" => {
            let iqn = need(&mut kv, "iqn", noun)?;
            let initiator = need(&mut kv, "initiator", noun)?;
            let t = parent(&mut root, "iscsi_target", "iqn", &iqn, "iSCSI target")?;
            edit_list(t, "acl", noun, &[("initiator", initiator)], verb, kv)?;
        }
        "discovery_chap" => {
            let iscsi = root.entry("iscsi").or_insert_with(|| Value::Table(Table::new()));
            let iscsi = iscsi.as_table_mut().ok_or_else(|| anyhow!("iscsi is not a table"))?;
            match verb {
                "remove" => {
                    only_ids(&kv, noun)?;
                    iscsi.remove("discovery_chap").ok_or_else(|| anyhow!("no discovery_chap is set"))?;
                }
                _ => {
                    let user = need(&mut kv, "user", noun)?;
                    let secret = need(&mut kv, "secret", noun)?;
                    only_ids(&kv, noun)?;
                    let mut chap = Table::new();
                    chap.insert("user".into(), user);
                    chap.insert("secret".into(), secret);
                    iscsi.insert("discovery_chap".into(), Value::Table(chap));
                }
            }
        }
        other => bail!("unknown object {other:?}; one of: {NOUNS}"),
    }
    Value::Table(root).try_into().map_err(|e: toml::de::Error| anyhow!("{noun}: {}", e.message()))
}

fn only_ids(kv: &[(String, Option<Value>)], noun: &str) -> Result<()> {
    match kv.first() {
        Some((k, _)) => bail!("{noun}: unexpected key {k}"),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DEFAULT_IQN, DEFAULT_NQN};

    #[test]
    fn removing_a_host_or_an_initiator_listed_twice_takes_it_off_the_list() {
        let host = "nqn.2014-08.org.nvmexpress:uuid:twice";
        let initiator = "iqn.1994-05.com.redhat:twice";
        let mut c = Config::embedded_default();
        c.subsystem[0].hosts = vec![host.into(), host.into()];
        c.iscsi_target[0].initiators = vec![initiator.into(), initiator.into()];
        let c = edit(&c, "remove", "host", &[&format!("nqn={DEFAULT_NQN}"), &format!("host={host}")]).expect("host");
        assert!(!c.subsystem[0].hosts.iter().any(|h| h == host), "{:?} still lets it in", c.subsystem[0].hosts);
        let words = [format!("iqn={DEFAULT_IQN}"), format!("initiator={initiator}")];
        let c = edit(&c, "remove", "initiator", &[&words[0], &words[1]]).expect("initiator");
        let left = &c.iscsi_target[0].initiators;
        assert!(!left.iter().any(|i| i == initiator), "{left:?} still lets it in");
    }

    #[test]
    fn edits_every_noun_through_the_config_parser() {
        let c = Config::embedded_default();
        let c = edit(&c, "add", "device", &["name=d2", "kind=ram", "size=1MiB"]).expect("add device");
        assert_eq!(c.device[1].size, Some(crate::config::Size(1 << 20)));
        let small = edit(&c, "set", "device", &["name=d2", "huge_pages=false"]).expect("huge_pages");
        assert_eq!(small.device[1].huge_pages, Some(false), "huge_pages is a boolean");
        let c = edit(&c, "add", "namespace", &["nqn=nqn.2026-11.io.ironwire:default", "device=d2"]).expect("ns");
        assert_eq!(c.subsystem[0].namespace[1].nsid, Some(2), "the first free NSID");
        let rbd = ["name=r", "kind=rbd", "pool=p", "image=i", "ceph_conf=/c.conf", "connect_timeout=5"];
        let r = edit(&c, "add", "device", &rbd).expect("add rbd device");
        assert_eq!(r.device[2].connect_timeout, Some(5), "connect_timeout is a number");
        let c = edit(
            &c,
            "set",
            "target",
            &["iqn=iqn.2026-11.io.ironwire:default", "chap.user=u", "chap.secret=0123456789ab"],
        )
        .expect("chap");
        assert_eq!(c.iscsi_target[0].chap.as_ref().map(|c| c.secret.as_str()), Some("0123456789ab"));
        let c = edit(&c, "set", "target", &["iqn=iqn.2026-11.io.ironwire:default", "chap="]).expect("unset chap");
        assert!(c.iscsi_target[0].chap.is_none());
        let e = edit(&c, "add", "device", &["name=d2", "kind=ram"]).expect_err("duplicate");
        assert!(e.to_string().contains("device name=d2 already exists"), "{e}");
        let e = edit(&c, "set", "device", &["name=d2", "colour=red"]).expect_err("unknown key");
        assert!(e.to_string().contains("colour"), "{e}");
        let e = edit(&c, "add", "namespace", &["nqn=nqn.2026-11.io.ironwire:default", "nsid=x"]).expect_err("bad nsid");
        assert!(e.to_string().contains("nsid: \"x\" is not a number"), "{e}");
        let c = edit(&c, "remove", "port", &["address=127.0.0.1:3260", "transport=iscsi"]).expect("remove port");
        assert_eq!(c.port.len(), 2);
    }
}
