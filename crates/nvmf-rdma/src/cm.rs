//! The NVMe/RDMA CM private data (NVMe over Fabrics RDMA binding): what the
//! host puts in its connection request, and what the controller answers in
//! its accept or reject. All fields little-endian.

use zerocopy::little_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// The host's connection request private data.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct CmRequest {
    /// RECFMT: record format, 0.
    pub recfmt: U16,
    /// QID: 0 for the admin queue.
    pub qid: U16,
    /// HRQSIZE: the host's receive queue size (completions it can take).
    pub hrqsize: U16,
    /// HSQSIZE: the host's submission queue size, 0-based (as Connect's
    /// SQSIZE).
    pub hsqsize: U16,
    /// Reserved.
    pub rsvd: [u8; 24],
}
const _: () = assert!(core::mem::size_of::<CmRequest>() == 32);

/// The controller's accept private data.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct CmReply {
    /// RECFMT: 0.
    pub recfmt: U16,
    /// CRQSIZE: the controller's receive queue size (commands it can take).
    pub crqsize: U16,
    /// Reserved.
    pub rsvd: [u8; 28],
}
const _: () = assert!(core::mem::size_of::<CmReply>() == 32);

/// The controller's reject private data.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct CmReject {
    /// RECFMT: 0.
    pub recfmt: U16,
    /// STS: why ([`RejectStatus`]).
    pub sts: U16,
}
const _: () = assert!(core::mem::size_of::<CmReject>() == 4);

/// A reject's status, open for values from the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RejectStatus(pub u16);

impl RejectStatus {
    /// Invalid private data length.
    pub const INVALID_LENGTH: Self = Self(0x01);
    /// Invalid record format.
    pub const INVALID_RECFMT: Self = Self(0x02);
    /// Invalid queue ID.
    pub const INVALID_QID: Self = Self(0x03);
    /// Invalid host submission queue size.
    pub const INVALID_HSQSIZE: Self = Self(0x04);
    /// Invalid host receive queue size.
    pub const INVALID_HRQSIZE: Self = Self(0x05);
    /// No resources.
    pub const NO_RESOURCES: Self = Self(0x06);
}

/// The admin queue's most entries (NVMe over Fabrics: 32).
pub const ADMIN_QUEUE_ENTRIES: u16 = 32;

/// Parses and checks a connection request's private data: the request, or
/// why it is refused. `max_entries` bounds an I/O queue's size.
pub fn parse_request(private_data: &[u8], max_entries: u16) -> Result<CmRequest, (RejectStatus, String)> {
    let Ok((req, _)) = CmRequest::read_from_prefix(private_data) else {
        return Err((
            RejectStatus::INVALID_LENGTH,
            format!("CM private data of {} bytes (expected 32)", private_data.len()),
        ));
    };
    if req.recfmt.get() != 0 {
        return Err((RejectStatus::INVALID_RECFMT, format!("RECFMT {} (expected 0)", req.recfmt.get())));
    }
    let entries = u32::from(req.hsqsize.get()).saturating_add(1);
    let max = if req.qid.get() == 0 { ADMIN_QUEUE_ENTRIES } else { max_entries };
    if entries > u32::from(max) || req.hsqsize.get() == 0 {
        return Err((
            RejectStatus::INVALID_HSQSIZE,
            format!("HSQSIZE {} for queue {} (at most {} entries)", req.hsqsize.get(), req.qid.get(), max),
        ));
    }
    // Every command in flight is answered by one Send into a receive the
    // host posted: fewer receives than submission queue entries let the
    // host's RNIC end the connection on a completion (NVMe/RDMA transport
    // 1.0: the host receive queue holds a completion per SQ entry).
    if u32::from(req.hrqsize.get()) < entries {
        return Err((
            RejectStatus::INVALID_HRQSIZE,
            format!("HRQSIZE {} for {entries} submission queue entries (at least {entries})", req.hrqsize.get()),
        ));
    }
    Ok(req)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn linux_admin_request() -> [u8; 32] {
        // recfmt 0, qid 0, hrqsize 32, hsqsize 31 (nvme/host/rdma.c)
        let mut b = [0u8; 32];
        b[4] = 32;
        b[6] = 31;
        b
    }

    #[test]
    fn accepts_the_linux_hosts_admin_request() {
        let r = parse_request(&linux_admin_request(), 128).unwrap();
        assert_eq!((r.qid.get(), r.hrqsize.get(), r.hsqsize.get()), (0, 32, 31));
    }

    #[test]
    fn refuses_short_data_bad_recfmt_and_oversized_queues() {
        assert_eq!(parse_request(&[0; 8], 128).unwrap_err().0, RejectStatus::INVALID_LENGTH);
        let mut b = linux_admin_request();
        b[0] = 1;
        assert_eq!(parse_request(&b, 128).unwrap_err().0, RejectStatus::INVALID_RECFMT);
        let mut b = linux_admin_request();
        b[6] = 32; // 33 admin entries
        assert_eq!(parse_request(&b, 128).unwrap_err().0, RejectStatus::INVALID_HSQSIZE);
        let mut b = linux_admin_request();
        b[2] = 1; // I/O queue 1 of 200 entries, limit 128
        b[6] = 199;
        assert_eq!(parse_request(&b, 128).unwrap_err().0, RejectStatus::INVALID_HSQSIZE);
        b[6] = 127;
        b[4] = 128; // HRQSIZE: a receive per entry, as the Linux host posts
        assert!(parse_request(&b, 128).is_ok());
    }

    #[test]
    fn refuses_a_receive_queue_smaller_than_the_submission_queue() {
        // 32 commands may be in flight, but the host posted receives for
        // only 16 completions: the 17th completion's Send would find no
        // receive and end the connection.
        let mut b = linux_admin_request();
        b[4] = 16;
        assert_eq!(parse_request(&b, 128).unwrap_err().0, RejectStatus::INVALID_HRQSIZE);
        b[4] = 31;
        assert_eq!(parse_request(&b, 128).unwrap_err().0, RejectStatus::INVALID_HRQSIZE);
        // More receives than commands is harmless.
        b[4] = 64;
        assert!(parse_request(&b, 128).is_ok());
    }
}
