//! Sans-IO iSCSI (RFC 7143).
//!
//! This crate turns bytes into iSCSI PDUs and back and keeps the state of
//! one connection: login with security (CHAP) and operational negotiation,
//! full feature phase with the CmdSN window, write data collection
//! (immediate, unsolicited, R2T), Data-In with phase collapse and
//! residuals, NOP pings, task management, Text/SendTargets, Logout and
//! Rejects. [`target::TargetConnection`] is the target; [`host::HostConnection`]
//! is a small initiator for tests and tools. Neither touches a socket or a
//! clock: the driver feeds received bytes to `handle_input`, sends whatever
//! `take_transmit` returns, and passes the time to `on_tick`. Bytes from the
//! peer never cause a panic.
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::indexing_slicing, clippy::arithmetic_side_effects)]

pub mod chap;
pub mod digest;
pub mod error;
pub mod host;
pub mod pdu;
pub mod target;
pub mod text;

/// The buffer type write data lands in; shared with NVMe/TCP so one pooled
/// buffer type serves both transports.
pub use block::DataBuffer;

pub use error::{Disposition, PduError, RejectReason};
