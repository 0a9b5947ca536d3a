//! Sans-IO NVMe-oF over RDMA (the NVMe over Fabrics RDMA transport binding),
//! on the iWARP protocols of the `iwarp` crate.
//!
//! Each NVMe queue is one iWARP connection. The MPA request carries the
//! host's CM private data (queue ID and sizes, [`cm`]); command capsules
//! arrive as Sends; data moves by RDMA Write (controller to host) and RDMA
//! Read (host to controller) against the host's keyed SGL buffers
//! ([`sgl`]); each completion returns as one Send, with Invalidate of the
//! host's key when the command asked for it. [`target::TargetQueue`] is the
//! controller side of one queue, [`host::HostConnection`] the host side
//! (for the initiator and the benchmark); NVMe-oF semantics stay in `nvmf`.
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::indexing_slicing, clippy::arithmetic_side_effects)]

pub mod cm;
pub mod host;
pub mod sgl;
pub mod target;

pub use block::DataBuffer;

use nvme_spec::identify::ctrl;
use nvme_spec::log::discovery;

/// Discovery log TSAS bytes for RDMA (NVMe over Fabrics, discovery log
/// entry): QP service type reliable connected, provider type iWARP, CM
/// service rdma_cm.
pub const TSAS: [u8; 16] = {
    let mut t = [0u8; 16];
    t[0] = discovery::RDMA_QPTYPE_CONNECTED;
    t[1] = discovery::RDMA_PRTYPE_IWARP;
    t[2] = discovery::RDMA_CMS_RDMA_CM;
    t
};

/// What hosts are told about NVMe/RDMA ports: TRTYPE rdma, no secure
/// channel, SQ flow control may be disabled (TREQ bit 2, as nvmet: the
/// completions of such a queue carry SQ head 0xffff), the RDMA TSAS, keyed
/// SGL data blocks (required by the Linux host) and in-capsule data at
/// offset 0 (ICDOFF 0), up to `in_capsule` bytes on I/O queues.
pub fn transport(in_capsule: u32) -> nvmf::Transport {
    nvmf::Transport {
        name: "rdma",
        trtype: discovery::TRTYPE_RDMA,
        treq: discovery::TREQ_NOT_REQUIRED | discovery::TREQ_DISABLE_SQFLOW,
        tsas: TSAS,
        sgls: ctrl::SGLS_SUPPORTED | ctrl::SGLS_KEYED | ctrl::SGLS_OFFSET,
        in_capsule,
        icdoff: 0,
    }
}

#[cfg(test)]
mod tests {
    use nvme_spec::log::discovery;

    #[test]
    fn rdma_ports_advertise_that_sq_flow_control_may_be_disabled() {
        let treq = super::transport(4096).treq;
        assert_eq!(treq, discovery::TREQ_NOT_REQUIRED | discovery::TREQ_DISABLE_SQFLOW);
    }
}
