//! An async NVMe-oF host on the reactor, for tests, tools and the benchmark:
//! NVMe/TCP, and NVMe/RDMA over iWARP done in software ([`Transport`]).
//!
//! The protocol work is `nvmf_tcp::host::HostConnection`'s (or
//! `nvmf_rdma::host::HostConnection`'s); this crate only
//! moves its bytes over a reactor TCP stream ([`Queue`]), runs the NVMe-oF
//! controller bring-up and the common admin and I/O commands on top
//! ([`Controller`]), reads discovery log pages ([`discover`]) and drives a
//! closed-loop load ([`bench`]; also in-process against a `blockdev::Device`
//! and over bare TCP, the baselines beside each figure). Every wait on the network is bounded by a
//! timeout, so a silent or stuck target becomes [`Error::Timeout`], never a
//! hang. It runs inside a `reactor::Runtime`.
//!
//! [`iscsi`] is the same for iSCSI: a [`iscsi::Session`] around
//! `iscsi::host::HostConnection` (login with CHAP, SendTargets, SCSI
//! commands with pipelining, Logout).
#![forbid(unsafe_code)]

pub mod bench;
pub mod cmd;
mod controller;
mod discovery;
pub mod iscsi;
mod queue;

pub use controller::hostid_for;
pub use controller::{Controller, IdentifyController, NamespaceInfo, Options};
pub use discovery::{discover, discover_with, parse_discovery_log, DiscoveryEntry};
pub use nvme_spec::Status;
pub use nvmf_tcp::host::Completion;
pub use queue::{check, Queue, QueueOptions, Transport};

use std::time::Duration;

/// What can go wrong talking to a controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command completed with a non-success status.
    #[error("command failed with status {0} ({code:#06x})", code = .0 .0)]
    Status(Status),
    /// The controller ended the connection with a C2HTermReq, or sent bytes
    /// that break NVMe/TCP.
    #[error("NVMe/TCP transport error: {0}")]
    Fatal(#[from] nvmf_tcp::Fatal),
    /// The controller refused or ended an NVMe/RDMA connection, or broke
    /// iWARP or the NVMe/RDMA binding.
    #[error("NVMe/RDMA over iWARP: {0}")]
    Rdma(#[from] nvmf_rdma::host::HostError),
    /// A socket error.
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
    /// The controller closed the connection.
    #[error("connection closed by the controller")]
    Closed,
    /// Nothing arrived in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// The bound that passed.
        after: Duration,
    },
    /// The controller answered with something this host cannot use.
    #[error("unexpected response: {0}")]
    Protocol(String),
    /// The request cannot be sent as asked.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A local device failed an I/O (the in-process baseline,
    /// [`bench::run_local`]).
    #[error("device error: {0}")]
    Device(#[from] blockdev::Error),
}

impl Error {
    /// The NVMe status of a failed command, if that is what this is.
    pub fn status(&self) -> Option<Status> {
        match self {
            Error::Status(s) => Some(*s),
            _ => None,
        }
    }
}

/// Result of this crate's operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
