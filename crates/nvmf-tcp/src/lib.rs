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

pub mod buffer;
pub mod digest;
pub mod error;
pub mod host;
pub mod pdu;
pub mod target;

pub use buffer::DataBuffer;
pub use error::{Fatal, Fes};
