//! Log pages (NVMe Base 2.0 section 5.16.1, NVMe-oF 1.1 section 5.3), with
//! offset paging: a host may read any window of a page.

use crate::controller::Controller;
use crate::model::{Port, Subsystem, Target};
use block::BlockDevice;
use nvme_spec::log::{self, discovery as d, GetLogPage};
use nvme_spec::opcode::{Admin, Io, LogId};
use nvme_spec::writer::Page;
use nvme_spec::Status;
use std::net::SocketAddr;

pub(crate) fn build<D: BlockDevice>(
    target: &Target<D>,
    subsys: &Subsystem<D>,
    ctrl: &Controller<D>,
    glp: GetLogPage,
    local: SocketAddr,
) -> Result<Vec<u8>, Status> {
    // A Get Log Page that fails changes nothing: the window is checked on
    // a page built without clearing its event, and only then is a log
    // that clears (without RAE) built again, clearing it.
    let page = content(target, subsys, ctrl, GetLogPage { rae: true, ..glp }, local)?;
    let Ok(start) = usize::try_from(glp.offset) else {
        return Err(Status::INVALID_FIELD.dnr());
    };
    if start > page.len() || !glp.offset.is_multiple_of(4) {
        return Err(Status::INVALID_FIELD.dnr());
    }
    let clears = matches!(LogId(glp.lid), LogId::CHANGED_NAMESPACES | LogId::ANA | LogId::DISCOVERY);
    let page = if !glp.rae && clears { content(target, subsys, ctrl, glp, local)? } else { page };
    // The caller pads or cuts the window to the length the SGL describes.
    Ok(page.get(start..).unwrap_or_default().to_vec())
}

/// The whole log page `glp` names; read without RAE, its event is cleared.
fn content<D: BlockDevice>(
    target: &Target<D>,
    subsys: &Subsystem<D>,
    ctrl: &Controller<D>,
    glp: GetLogPage,
    local: SocketAddr,
) -> Result<Vec<u8>, Status> {
    Ok(match LogId(glp.lid) {
        LogId::ERROR => vec![0; log::ERROR_ENTRY_LEN],
        LogId::SMART => smart(),
        LogId::FIRMWARE_SLOT => {
            let mut p = Page::new(log::FIRMWARE_SLOT_LEN);
            p.u8(0, 0x01).ascii_space(8, 8, env!("CARGO_PKG_VERSION"));
            p.into_vec()
        }
        LogId::CHANGED_NAMESPACES => {
            let mut s = ctrl.lock();
            let mut p = Page::new(log::CHANGED_NS_LEN);
            if s.changed_ns.len() > log::CHANGED_NS_LEN / 4 {
                p.u32(0, 0xffff_ffff);
            } else {
                for (i, nsid) in s.changed_ns.iter().enumerate() {
                    p.u32(i * 4, *nsid);
                }
            }
            if !glp.rae {
                s.changed_ns.clear();
                s.clear_event(log::AEN_NS_CHANGED);
            }
            p.into_vec()
        }
        LogId::COMMANDS_EFFECTS => effects(),
        // The event is cleared before the page is built: a change after
        // the build raises a new one.
        LogId::ANA => {
            if !glp.rae {
                ctrl.lock().clear_event(log::AEN_ANA_CHANGE);
            }
            ana(subsys, glp.lsp & log::ana::LSP_RGO != 0)
        }
        LogId::DISCOVERY if subsys.discovery => {
            if !glp.rae {
                ctrl.lock().clear_event(log::AEN_DISCOVERY_CHANGE);
            }
            discovery(target, &ctrl.hostnqn, local)
        }
        _ => return Err(Status::INVALID_LOG_PAGE.dnr()),
    })
}

fn smart() -> Vec<u8> {
    let mut p = Page::new(log::SMART_LEN);
    p.u8(0, 0); // critical warning: none
    p.u16(1, 293); // composite temperature, kelvin
    p.u8(3, 100); // available spare
    p.u8(4, 10); // available spare threshold
    p.u8(5, 0); // percentage used
    p.into_vec()
}

/// The ANA log page: one group per namespace (its ID the NSID) with this
/// gateway's state; `groups_only` leaves out the NSID lists (RGO).
fn ana<D: BlockDevice>(subsys: &Subsystem<D>, groups_only: bool) -> Vec<u8> {
    use log::ana as a;
    let namespaces = subsys.namespaces();
    let per_group = if groups_only { a::DESC_LEN } else { a::DESC_LEN + 4 };
    let mut p = Page::new(a::HEADER_LEN + namespaces.len() * per_group);
    let count = subsys.ana_change_count();
    p.u64(a::CHGCNT, count).u16(a::NGRPS, namespaces.len() as u16);
    for (i, ns) in namespaces.iter().enumerate() {
        let base = a::HEADER_LEN + i * per_group;
        p.u32(base + a::ANAGRPID, ns.nsid).u64(base + a::DESC_CHGCNT, count).u8(base + a::STATE, ns.ana_state().0);
        if !groups_only {
            p.u32(base + a::NNSIDS, 1).u32(base + a::DESC_LEN, ns.nsid);
        }
    }
    p.into_vec()
}

fn effects() -> Vec<u8> {
    const CSUPP: u32 = 1 << 0;
    const LBCC: u32 = 1 << 1;
    let mut p = Page::new(log::COMMANDS_EFFECTS_LEN);
    for op in [
        Admin::GET_LOG_PAGE,
        Admin::IDENTIFY,
        Admin::ABORT,
        Admin::SET_FEATURES,
        Admin::GET_FEATURES,
        Admin::ASYNC_EVENT_REQUEST,
        Admin::KEEP_ALIVE,
    ] {
        p.u32(usize::from(op.0) * 4, CSUPP);
    }
    for op in [Io::FLUSH, Io::READ, Io::COMPARE] {
        p.u32(1024 + usize::from(op.0) * 4, CSUPP);
    }
    for op in [Io::WRITE, Io::WRITE_ZEROES, Io::DATASET_MANAGEMENT] {
        p.u32(1024 + usize::from(op.0) * 4, CSUPP | LBCC);
    }
    p.into_vec()
}

/// The discovery log for `hostnqn`: every subsystem the host may reach, on
/// every port that serves subsystems, plus the discovery subsystem itself
/// on every port.
fn discovery<D: BlockDevice>(target: &Target<D>, hostnqn: &str, local: SocketAddr) -> Vec<u8> {
    let ports = target.ports();
    // A wildcard listen address is advertised as the address the host
    // reached us on; an IPv4 host on a dual-stack `[::]` listener sees an
    // IPv4-mapped one, advertised as the IPv4 address it is.
    let refs: Vec<Port> = ports
        .iter()
        .map(|p| Port {
            id: p.id,
            transport: p.transport,
            discovery_only: p.discovery_only,
            addr: if p.addr.ip().is_unspecified() {
                SocketAddr::new(local.ip().to_canonical(), p.addr.port())
            } else {
                p.addr
            },
        })
        .collect();
    let mut entries: Vec<(u8, String, &Port)> = Vec::new();
    for s in target.subsystems() {
        if s.allows(hostnqn) {
            for r in refs.iter().filter(|r| !r.discovery_only) {
                entries.push((d::SUBTYPE_NVME, s.nqn.clone(), r));
            }
        }
    }
    for r in &refs {
        entries.push((d::SUBTYPE_CURRENT_DISCOVERY, nvme_spec::DISCOVERY_NQN.to_string(), r));
    }
    let mut p = Page::new(d::HEADER_LEN + entries.len() * d::ENTRY_LEN);
    p.u64(d::GENCTR, target.genctr()).u64(d::NUMREC, entries.len() as u64).u16(d::RECFMT, 0);
    for (i, (subtype, nqn, port)) in entries.iter().enumerate() {
        let base = d::HEADER_LEN + i * d::ENTRY_LEN;
        p.u8(base + d::TRTYPE, port.transport.trtype)
            .u8(base + d::ADRFAM, if port.addr.is_ipv4() { d::ADRFAM_IPV4 } else { d::ADRFAM_IPV6 })
            .u8(base + d::SUBTYPE, *subtype)
            .u8(base + d::TREQ, port.transport.treq)
            .u16(base + d::PORTID, port.id)
            .u16(base + d::CNTLID, 0xffff)
            .u16(base + d::ASQSZ, 32)
            .u16(base + d::EFLAGS, if *subtype == d::SUBTYPE_CURRENT_DISCOVERY { d::EFLAGS_DUPLICATE } else { 0 })
            .ascii_nul(base + d::TRSVCID, 32, &port.addr.port().to_string())
            .ascii_nul(base + d::SUBNQN, 256, nqn)
            .ascii_nul(base + d::TRADDR, 256, &port.addr.ip().to_string())
            .bytes(base + d::TSAS, &port.transport.tsas);
    }
    p.into_vec()
}
