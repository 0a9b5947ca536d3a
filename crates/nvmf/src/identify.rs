//! Identify data structures (NVMe Base 2.0 section 5.17.2).

use crate::controller::Controller;
use crate::model::{Namespace, Subsystem, Target, Transport};
use block::BlockDevice;
use nvme_spec::identify::{ctrl as c, nid, ns as n, ns_indep as ni, CSI_NVM, LEN};
use nvme_spec::log::AnaState;
use nvme_spec::opcode::Cns;
use nvme_spec::writer::Page;
use nvme_spec::{regs, Status};

/// Largest NSID a controller reports (NN, MNAN), and largest ANA group ID.
pub(crate) const MAX_NSID: u32 = 1024;

/// ANATT: how long a host waits in the change state before it gives up on
/// a path. A state is set, not transitioned, here; ten seconds as nvmet.
const ANATT_S: u8 = 10;

/// WCTEMP, kelvin (70 °C): also the over Temperature Threshold a
/// controller starts with. CCTEMP is 85 °C.
pub(crate) const WCTEMP: u16 = 0x0157;
const CCTEMP: u16 = 0x0175;

/// RTD3E: the time a normal shutdown (CC.SHN) may take, µs; it flushes
/// the namespaces' devices first.
const SHUTDOWN_US: u32 = 30_000_000;

/// SMART / Health critical warnings a host may enable in Asynchronous
/// Event Configuration bits 7:0: spare, temperature, reliability, read
/// only, volatile memory backup (bits 4:0, as nvmet). None is ever raised;
/// there is no Persistent Memory Region (bit 5).
const AEC_CRITICAL_WARNINGS: u32 = 0x1f;

/// The Asynchronous Event Configuration bits a host may set (NVMe Base 2.0
/// 5.27.1): the notices Identify Controller OAES lists, and on an I/O
/// controller the critical warnings. Set Features refuses any other.
pub(crate) fn async_events(discovery: bool) -> u32 {
    if discovery {
        oaes(true)
    } else {
        oaes(false) | AEC_CRITICAL_WARNINGS
    }
}

/// Identify Controller OAES: the notices the controller sends.
fn oaes(discovery: bool) -> u32 {
    if discovery {
        c::OAES_DISCOVERY_CHANGE
    } else {
        c::OAES_NS_ATTR | c::OAES_ANA_CHANGE
    }
}

pub(crate) fn build<D: BlockDevice>(
    target: &Target<D>,
    transport: &Transport,
    subsys: &Subsystem<D>,
    ctrl: &Controller<D>,
    cns: Cns,
    nsid: u32,
    csi: u8,
) -> Result<Vec<u8>, Status> {
    let invalid_ns = || Status::INVALID_NAMESPACE.dnr();
    let ns_of = |nsid: u32| -> Result<Option<std::sync::Arc<Namespace<D>>>, Status> {
        if nsid == 0 || nsid > MAX_NSID {
            return Err(invalid_ns());
        }
        Ok(subsys.namespace(nsid))
    };
    match cns {
        Cns::CONTROLLER => Ok(controller(target, transport, subsys, ctrl)),
        Cns::NAMESPACE => Ok(ns_of(nsid)?.map(|ns| namespace(&ns)).unwrap_or_else(|| vec![0; LEN])),
        Cns::ACTIVE_NAMESPACES | Cns::CS_ACTIVE_NAMESPACES => {
            if cns == Cns::CS_ACTIVE_NAMESPACES && csi != CSI_NVM {
                return Ok(vec![0; LEN]);
            }
            if nsid >= 0xffff_fffe {
                return Err(invalid_ns());
            }
            let mut p = Page::new(LEN);
            for (i, ns) in subsys.namespaces().iter().filter(|ns| ns.nsid > nsid).take(LEN / 4).enumerate() {
                p.u32(i * 4, ns.nsid);
            }
            Ok(p.into_vec())
        }
        Cns::NS_DESCRIPTORS => {
            let ns = ns_of(nsid)?.ok_or_else(invalid_ns)?;
            let mut p = Page::new(LEN);
            let mut off = 0;
            for (t, v) in [
                (nid::EUI64, &ns.eui64[..]),
                (nid::NGUID, &ns.nguid[..]),
                (nid::UUID, &ns.uuid[..]),
                (nid::CSI, &[CSI_NVM][..]),
            ] {
                p.u8(off, t).u8(off + 1, v.len() as u8).bytes(off + 4, v);
                off += 4 + v.len();
            }
            Ok(p.into_vec())
        }
        Cns::CS_NAMESPACE => {
            if csi != CSI_NVM {
                return Err(Status::INVALID_FIELD.dnr());
            }
            // NVM command set specific fields (protection info, storage tag
            // formats) are all zero: no end-to-end protection. An inactive
            // NSID reads as zeros too (NVMe base 2.0 5.17, as CNS 00h).
            ns_of(nsid)?;
            Ok(vec![0; LEN])
        }
        Cns::CS_CONTROLLER => {
            if csi != CSI_NVM {
                return Err(Status::INVALID_FIELD.dnr());
            }
            // WZSL, DMRL, DMRSL, DMSL as enforced; VSL and WUSL zero
            // (no Verify, no Write Uncorrectable).
            Ok(crate::limits::identify_page())
        }
        Cns::CS_INDEPENDENT_NAMESPACE => {
            let mut p = Page::new(LEN);
            if let Some(ns) = ns_of(nsid)? {
                // What Identify Namespace says of it too (NMIC, ANAGRPID,
                // NSATTR), and that it is ready.
                p.u8(ni::NMIC, n::NMIC_SHARED).u32(ni::ANAGRPID, ns.nsid).u8(ni::NSTAT, ni::NSTAT_READY);
                if ns.device.read_only() {
                    p.u8(ni::NSATTR, n::NSATTR_WRITE_PROTECTED);
                }
            }
            Ok(p.into_vec())
        }
        Cns::COMMAND_SETS => {
            // One command set combination: NVM only.
            let mut p = Page::new(LEN);
            p.u64(0, 1);
            Ok(p.into_vec())
        }
        _ => Err(Status::INVALID_FIELD.dnr()),
    }
}

fn controller<D: BlockDevice>(
    target: &Target<D>,
    transport: &Transport,
    subsys: &Subsystem<D>,
    ctrl: &Controller<D>,
) -> Vec<u8> {
    let s = &target.settings;
    let mut p = Page::new(LEN);
    let mdts = (s.max_transfer / 4096).max(1).ilog2() as u8;
    p.u16(c::VID, 0x1b36).u16(c::SSVID, 0x1af4);
    p.ascii_space(c::SN, 20, &subsys.serial).ascii_space(c::MN, 40, &subsys.model).ascii_space(
        c::FR,
        8,
        env!("CARGO_PKG_VERSION"),
    );
    p.u8(c::RAB, 6).u16(c::CNTLID, ctrl.cntlid).u32(c::VER, regs::VERSION_1_4);
    p.u8(c::MDTS, mdts);
    p.u8(c::ACL, (crate::abort::ABORT_LIMIT - 1) as u8).u8(c::AERL, (crate::admin::AER_LIMIT - 1) as u8);
    p.u8(c::LPA, if subsys.discovery { c::LPA_EXTENDED } else { c::LPA_CMD_EFFECTS | c::LPA_EXTENDED });
    p.u8(c::ELPE, 0).u8(c::NPSS, 0);
    p.u16(c::KAS, (crate::controller::KATO_GRANULARITY_MS / 100) as u16);
    p.u16(c::MAXCMD, s.queue_entries);
    p.u32(c::SGLS, transport.sgls);
    p.ascii_nul(c::SUBNQN, 256, &subsys.nqn);
    if subsys.discovery {
        p.u8(c::CNTRLTYPE, c::TYPE_DISCOVERY);
        p.u16(c::MAXCMD, 32);
        // A host that keeps the connection (Linux `nvme discover
        // --persistent`) enables the notice and reconnects on it.
        p.u32(c::OAES, oaes(true));
    } else {
        p.u8(c::CNTRLTYPE, c::TYPE_IO);
        // Several gateways may export the subsystem (ports, controllers),
        // and each reports its ANA state per namespace.
        p.u8(c::CMIC, c::CMIC_MULTI_PORT | c::CMIC_MULTI_CTRL | c::CMIC_ANA);
        p.u32(c::OAES, oaes(false));
        // A normal shutdown flushes every namespace's device, which may
        // take a while: hosts (Linux reads RTD3E) wait up to 30 s for it.
        p.u32(c::RTD3E, SHUTDOWN_US);
        // One ANA group per namespace, its ID the NSID.
        p.u8(c::ANATT, ANATT_S).u8(c::ANACAP, c::ANACAP_ALL_STATES | c::ANACAP_GRPID_STATIC);
        p.u32(c::ANAGRPMAX, MAX_NSID).u32(c::NANAGRPID, MAX_NSID);
        p.u32(c::CTRATT, 1); // 128-bit host identifier
        p.u8(c::FRMW, 0x03); // slot 1 read-only, 1 slot
        p.u16(c::WCTEMP, WCTEMP).u16(c::CCTEMP, CCTEMP);
        p.u8(c::SQES, 0x66).u8(c::CQES, 0x44);
        p.u32(c::NN, MAX_NSID).u32(c::MNAN, MAX_NSID);
        // SSFS: Get Features answers every Select value, and Set Features
        // with Save is refused as Feature Identifier Not Saveable (nothing
        // is saveable).
        p.u16(c::ONCS, c::ONCS_COMPARE | c::ONCS_DSM | c::ONCS_WRITE_ZEROES | c::ONCS_SAVE_SELECT);
        p.u16(c::FUSES, c::FUSES_COMPARE_AND_WRITE);
        // Bit 0: a volatile write cache (some namespace's device had one at
        // Connect); bits 2:1 = 10b: flush to NSID FFFFFFFFh unsupported.
        p.u8(c::VWC, 0x04 | u8::from(ctrl.vwc_present));
        p.u32(c::IOCCSZ, (64 + transport.in_capsule) / 16).u32(c::IORCSZ, 1);
        p.u16(c::ICDOFF, transport.icdoff);
        p.u16(c::PSD0_MP, 2500); // 25 W, informational
    }
    p.into_vec()
}

fn namespace<D: BlockDevice>(ns: &Namespace<D>) -> Vec<u8> {
    let geo = ns.device.geometry();
    let mut p = Page::new(LEN);
    p.u64(n::NSZE, geo.blocks).u64(n::NCAP, geo.blocks);
    // NUSE is cleared to 0h while the namespace is ANA Inaccessible or
    // Persistent Loss on this controller (NVMe Base 2.0, Identify
    // Namespace; nvmet likewise).
    if !matches!(ns.ana_state(), AnaState::INACCESSIBLE | AnaState::PERSISTENT_LOSS) {
        p.u64(n::NUSE, geo.blocks);
    }
    p.u8(n::NSFEAT, n::NSFEAT_OPTPERF);
    p.u8(n::NLBAF, 0).u8(n::FLBAS, 0).u8(n::NMIC, n::NMIC_SHARED);
    p.u32(n::ANAGRPID, ns.nsid);
    if ns.device.read_only() {
        p.u8(n::NSATTR, n::NSATTR_WRITE_PROTECTED);
    }
    // Deallocated blocks read as zeros only where the device promises it:
    // on block and rbd devices a deallocate is a discard hint that may be
    // skipped or only partly done (Write Zeroes always zeroes).
    let zeros = if ns.device.deallocate_reads_zeroes() { n::DLFEAT_READ_ZEROES } else { 0 };
    p.u8(n::DLFEAT, zeros | n::DLFEAT_WZ_DEALLOC);
    let bs_blocks = (4096 / geo.block_size).max(1) as u16;
    p.u16(n::NPWG, bs_blocks - 1).u16(n::NPDG, bs_blocks - 1);
    p.bytes(n::NGUID, &ns.nguid).bytes(n::EUI64, &ns.eui64);
    p.u32(n::LBAF0, u32::from(geo.block_size.trailing_zeros() as u8) << 16);
    p.into_vec()
}
