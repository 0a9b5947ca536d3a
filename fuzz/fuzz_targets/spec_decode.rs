//! Fabrics/NVMe field decoders from `nvme_spec`: Connect data (NQN
//! parsing), and the Connect, Property and Get Log Page views of an SQE.
//!
//! Input: the first 64 bytes are an SQE, the next 1024 Connect data (both
//! zero-padded). Never panics; a parsed NQN is shorter than its field and
//! holds no NUL, and only the host NQN may be empty (hosts such as
//! spdk_nvme_perf send none); Connect data whose NQNs parse round-trips
//! through `ConnectData::new`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvme_spec::fabrics::{ConnectCmd, ConnectData, PropertyCmd};
use nvme_spec::log::GetLogPage;
use nvme_spec::Sqe;
use zerocopy::{FromBytes, IntoBytes};

fuzz_target!(|input: &[u8]| {
    let mut sqe_bytes = [0u8; 64];
    let n = input.len().min(64);
    sqe_bytes[..n].copy_from_slice(&input[..n]);
    let sqe = Sqe::read_from_bytes(&sqe_bytes).expect("64 bytes");
    assert_eq!(sqe.as_bytes(), &sqe_bytes[..]);

    let glp = GetLogPage::from_sqe(&sqe);
    assert!(glp.len_bytes >= 4 && glp.len_bytes & 3 == 0);
    assert!(glp.len_bytes <= (1u64 << 32) * 4);
    assert!(glp.lsp <= 0xf);
    let c = ConnectCmd::from_sqe(&sqe);
    assert_eq!(u32::from(c.qid) << 16 | u32::from(c.recfmt), sqe.cdw10.get());
    let _ = PropertyCmd::from_sqe(&sqe);
    let _ = (sqe.slba(), sqe.blocks(), sqe.fua(), sqe.data_direction(), sqe.fctype());

    let mut cd_bytes = [0u8; 1024];
    let rest = input.get(64..).unwrap_or_default();
    let m = rest.len().min(1024);
    cd_bytes[..m].copy_from_slice(&rest[..m]);
    let cd = ConnectData::read_from_bytes(&cd_bytes).expect("1024 bytes");
    let (sub, host) = (cd.subnqn(), cd.hostnqn());
    assert!(sub.is_none_or(|s| !s.is_empty()), "empty subsystem NQN parsed");
    for nqn in [sub, host].into_iter().flatten() {
        assert!(nqn.len() < 256 && !nqn.contains('\0'));
    }
    if let (Some(sub), Some(host)) = (sub, host) {
        let again = ConnectData::new(cd.hostid, cd.cntlid.get(), sub, host);
        assert_eq!(again.subnqn(), Some(sub));
        assert_eq!(again.hostnqn(), Some(host));
        assert_eq!(again.cntlid.get(), cd.cntlid.get());
        assert_eq!(again.hostid, cd.hostid);
    }
});
