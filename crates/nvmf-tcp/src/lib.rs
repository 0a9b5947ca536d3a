//! Sans-IO NVMe/TCP (NVM Express TCP Transport, TP 8000).
//!
//! This crate turns bytes into NVMe/TCP PDUs and back, and keeps the state
//! of one connection: initialization (ICReq/ICResp), command capsules with
//! in-capsule data, R2T/H2CData for solicited write data, C2HData for read
//! data, CapsuleResp, and the terminate requests. It never touches a socket
//! or a clock: the driver feeds received bytes to `handle_input` and sends
//! whatever `take_transmit` returns. Bytes from the peer never cause a panic.
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::indexing_slicing, clippy::arithmetic_side_effects)]

pub mod digest;
pub mod error;
pub mod host;
pub mod pdu;
pub mod target;

pub use block::DataBuffer;
pub use error::{Fatal, Fes};

use nvme_spec::identify::ctrl;
use nvme_spec::log::discovery;

/// What hosts are told about NVMe/TCP ports (the discovery log entry, and
/// Identify Controller's SGLS/IOCCSZ/ICDOFF): TRTYPE tcp, no secure channel
/// required, SQ flow control may be disabled (as nvmet: a host that does
/// so is answered C2HData with SUCCESS and no CapsuleResp for its reads),
/// TSAS SECTYPE 0 (no TLS); SGLs with offset descriptors for in-capsule
/// data at offset 0, up to `in_capsule` bytes of it on I/O queues.
pub fn transport(in_capsule: u32) -> nvmf::Transport {
    nvmf::Transport {
        name: "tcp",
        trtype: discovery::TRTYPE_TCP,
        treq: discovery::TREQ_NOT_REQUIRED | discovery::TREQ_DISABLE_SQFLOW,
        tsas: [0; 16],
        sgls: ctrl::SGLS_SUPPORTED | ctrl::SGLS_OFFSET,
        in_capsule,
        icdoff: 0,
    }
}
