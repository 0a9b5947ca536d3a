//! Sans-IO iWARP: the protocol work of an RDMA NIC (RNIC), done over a
//! byte stream.
//!
//! Three layers, each with its RFC:
//! - **MPA** ([`mpa`], RFC 5044 with the enhanced connection setup of
//!   RFC 6581): the request/reply handshake that starts every connection
//!   (keys, the M/C/R flags, IRD/ORD, the upper layer's private data), then
//!   framing of full operation: each FPDU is a 16-bit ULPDU length, the
//!   DDP/RDMAP header, the payload, padding to 4 bytes and a CRC32C field.
//! - **DDP** (RFC 5041): tagged segments carry an STag and tagged offset and
//!   are placed straight into a registered buffer; untagged segments carry a
//!   queue number, message sequence number and message offset and fill the
//!   next posted receive.
//! - **RDMAP** (RFC 5040): Send (with Invalidate, with Solicited Event), RDMA
//!   Write, RDMA Read Request and Response, Terminate.
//!
//! [`Connection`] keeps one connection's state for either end (the MPA
//! initiator or responder). It never touches a socket or a clock: the driver
//! feeds received bytes to [`Connection::handle_input`], acts on
//! [`Connection::poll_event`], and sends what [`Connection::take_transmit`]
//! returns. Every STag, offset, length and sequence number from the peer is
//! checked before a byte is placed; a violation ends the connection with a
//! Terminate message naming the layer and error ([`Fatal`]). Bytes from the
//! peer never cause a panic.
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::indexing_slicing, clippy::arithmetic_side_effects)]

pub mod conn;
pub mod error;
pub mod mpa;
pub mod wire;

pub use block::DataBuffer;
pub use conn::{Access, Config, Connection, Event, Received, Role, Splice, State, HEAD_MAX, ZEROS};
pub use error::{ErrorCode, Fatal};
