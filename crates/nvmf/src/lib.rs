//! The transport-neutral NVMe over Fabrics target.
//!
//! It owns the object model (subsystems with namespaces pointing at block
//! devices, allowed hosts, the discovery subsystem), the controllers hosts
//! create with Fabrics Connect, and the parse/execute split of every admin,
//! fabrics and NVM I/O command. It never does I/O and never reads a clock:
//! commands that touch storage come back as a [`BlockRequest`] for the
//! reactor to run, and time arrives as an argument in milliseconds. It sees
//! devices through [`block::BlockDevice`] and transports through
//! [`Transport`] (what hosts are told) and the transfer length each
//! transport parses from its own SGL descriptors.
//! Command failures travel as NVMe [`Status`] values in completions.
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

mod abort;
mod admin;
mod controller;
mod fused;
mod identify;
mod io;
pub mod limits;
mod logpage;
mod model;
mod queue;

pub use abort::{AbortRequest, Doorbell};
pub use controller::Controller;
pub use io::{io_error_status, BlockOp, BlockRequest, DeviceRef, InFlight};
pub use model::{
    derived_identifiers, Namespace, NamespaceIds, Port, Settings, Subsystem, Target, Transport, CNTLID_MAX, CNTLID_MIN,
};
pub use nvme_spec::Status;
pub use queue::{Outcome, Queue, QueueKind};
