//! NVMe and NVMe over Fabrics wire structures (NVMe Base 2.0, NVMe-oF 1.1).
//!
//! This crate owns the byte layouts only: submission and completion queue
//! entries, opcodes, status codes, controller registers, the Fabrics command
//! and data layouts, and the offsets of the Identify and log page structures.
//! It never does I/O and never interprets a command; that is `nvmf`'s job.
//! Everything the wire carries is little-endian.
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

pub mod fabrics;
pub mod identify;
pub mod log;
pub mod opcode;
pub mod queue;
pub mod regs;
pub mod status;
pub mod writer;

pub use queue::{Cqe, Sgl, Sqe};
pub use status::Status;

/// The well-known NQN of a discovery controller (NVMe-oF 1.1 section 7.1).
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
