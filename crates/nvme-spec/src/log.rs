//! Log page layouts (NVMe Base 2.0 section 5.16.1, NVMe-oF 1.1 section 5.3).

/// Get Log Page command fields (NVMe Base 2.0 figure 197).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GetLogPage {
    /// Log page identifier.
    pub lid: u8,
    /// Log specific field.
    pub lsp: u8,
    /// Retain asynchronous event.
    pub rae: bool,
    /// Number of bytes to return.
    pub len_bytes: u64,
    /// Byte offset into the log page.
    pub offset: u64,
}

impl GetLogPage {
    /// Reads the fields from CDW10..CDW13 of `sqe`.
    pub fn from_sqe(sqe: &crate::Sqe) -> Self {
        let cdw10 = sqe.cdw10.get();
        let cdw11 = sqe.cdw11.get();
        let numdl = u64::from(cdw10 >> 16);
        let numdu = u64::from(cdw11 & 0xffff);
        let dwords = ((numdu << 16) | numdl) + 1;
        GetLogPage {
            lid: (cdw10 & 0xff) as u8,
            lsp: ((cdw10 >> 8) & 0xf) as u8,
            rae: cdw10 & (1 << 15) != 0,
            len_bytes: dwords * 4,
            offset: (u64::from(sqe.cdw13.get()) << 32) | u64::from(sqe.cdw12.get()),
        }
    }
}

/// Discovery log page (NVMe-oF 1.1 figure 37): a 1024-byte header followed
/// by 1024-byte entries.
pub mod discovery {
    /// Header length.
    pub const HEADER_LEN: usize = 1024;
    /// Entry length.
    pub const ENTRY_LEN: usize = 1024;
    /// Header: generation counter (u64).
    pub const GENCTR: usize = 0;
    /// Header: number of records (u64).
    pub const NUMREC: usize = 8;
    /// Header: record format (u16).
    pub const RECFMT: usize = 16;

    /// Entry: transport type (u8).
    pub const TRTYPE: usize = 0;
    /// Entry: address family (u8).
    pub const ADRFAM: usize = 1;
    /// Entry: subsystem type (u8).
    pub const SUBTYPE: usize = 2;
    /// Entry: transport requirements (u8).
    pub const TREQ: usize = 3;
    /// Entry: port ID (u16).
    pub const PORTID: usize = 4;
    /// Entry: controller ID (u16).
    pub const CNTLID: usize = 6;
    /// Entry: admin max SQ size (u16).
    pub const ASQSZ: usize = 8;
    /// Entry: entry flags (u16).
    pub const EFLAGS: usize = 10;
    /// Entry: transport service ID (32 ASCII).
    pub const TRSVCID: usize = 32;
    /// Entry: subsystem NQN (256).
    pub const SUBNQN: usize = 256;
    /// Entry: transport address (256 ASCII).
    pub const TRADDR: usize = 512;
    /// Entry: transport specific address subtype (256).
    pub const TSAS: usize = 768;

    /// TRTYPE: RDMA.
    pub const TRTYPE_RDMA: u8 = 1;
    /// TRTYPE: TCP.
    pub const TRTYPE_TCP: u8 = 3;
    /// RDMA TSAS byte 0, RDMA_QPTYPE: reliable connected.
    pub const RDMA_QPTYPE_CONNECTED: u8 = 1;
    /// RDMA TSAS byte 1, RDMA_PRTYPE: iWARP.
    pub const RDMA_PRTYPE_IWARP: u8 = 5;
    /// RDMA TSAS byte 2, RDMA_CMS: the RDMA IP connection manager.
    pub const RDMA_CMS_RDMA_CM: u8 = 1;
    /// ADRFAM: IPv4.
    pub const ADRFAM_IPV4: u8 = 1;
    /// ADRFAM: IPv6.
    pub const ADRFAM_IPV6: u8 = 2;
    /// SUBTYPE: a discovery subsystem referral.
    pub const SUBTYPE_DISCOVERY: u8 = 1;
    /// SUBTYPE: an NVM subsystem.
    pub const SUBTYPE_NVME: u8 = 2;
    /// SUBTYPE: the current discovery subsystem.
    pub const SUBTYPE_CURRENT_DISCOVERY: u8 = 3;
    /// TREQ: secure channel not required.
    pub const TREQ_NOT_REQUIRED: u8 = 0x2;
    /// TREQ bit 2: the controller supports disabling SQ flow control
    /// (Connect CATTR bit 2); libnvme's connect-all then asks for it.
    pub const TREQ_DISABLE_SQFLOW: u8 = 0x4;
    /// EFLAGS: duplicate returned information.
    pub const EFLAGS_DUPLICATE: u16 = 1 << 0;
}

/// SMART / Health log page length.
pub const SMART_LEN: usize = 512;
/// Firmware slot log page length.
pub const FIRMWARE_SLOT_LEN: usize = 512;
/// Changed namespace list log page length (1024 u32 entries).
pub const CHANGED_NS_LEN: usize = 4096;
/// Commands supported and effects log page length.
pub const COMMANDS_EFFECTS_LEN: usize = 4096;
/// One error information log entry.
pub const ERROR_ENTRY_LEN: usize = 64;

/// Async event completion DW0 for "namespace attribute changed"
/// (type notice = 2, info 0, log page 04h; NVMe Base 2.0 figure 150).
pub const AEN_NS_CHANGED: u32 = 0x02 | (0x04 << 16);

/// Async event completion DW0 for "asymmetric namespace access change"
/// (type notice = 2, info 03h, log page 0Ch; NVMe Base 2.0 figure 150).
pub const AEN_ANA_CHANGE: u32 = 0x02 | (0x03 << 8) | (0x0c << 16);

/// Async event completion DW0 for "discovery log page change" (type
/// notice = 2, info F0h, log page 70h; NVMe-oF 1.1 figure 31).
pub const AEN_DISCOVERY_CHANGE: u32 = 0x02 | (0xf0 << 8) | (0x70 << 16);

/// Asymmetric Namespace Access log page (NVMe Base 2.0 section 5.16.1.12):
/// a header, then one descriptor per ANA group, each followed by its NSIDs.
pub mod ana {
    /// Header length.
    pub const HEADER_LEN: usize = 16;
    /// Header: change count (u64).
    pub const CHGCNT: usize = 0;
    /// Header: number of ANA group descriptors (u16).
    pub const NGRPS: usize = 8;
    /// Descriptor length before its NSID list.
    pub const DESC_LEN: usize = 32;
    /// Descriptor: ANA group ID (u32).
    pub const ANAGRPID: usize = 0;
    /// Descriptor: number of NSIDs that follow (u32).
    pub const NNSIDS: usize = 4;
    /// Descriptor: change count (u64).
    pub const DESC_CHGCNT: usize = 8;
    /// Descriptor: ANA state, bits 3:0 (u8).
    pub const STATE: usize = 16;
    /// LSP bit 0, Return Groups Only: descriptors without NSID lists.
    pub const LSP_RGO: u8 = 1 << 0;
}

/// An ANA state (NVMe Base 2.0 section 8.1.3), open for values a peer
/// sends that this code does not name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AnaState(pub u8);

impl AnaState {
    /// ANA Optimized.
    pub const OPTIMIZED: AnaState = AnaState(0x1);
    /// ANA Non-Optimized.
    pub const NON_OPTIMIZED: AnaState = AnaState(0x2);
    /// ANA Inaccessible.
    pub const INACCESSIBLE: AnaState = AnaState(0x3);
    /// ANA Persistent Loss.
    pub const PERSISTENT_LOSS: AnaState = AnaState(0x4);
    /// ANA Change (a transition in progress).
    pub const CHANGE: AnaState = AnaState(0xf);

    /// The status an I/O command gets in this state: `None` where I/O is
    /// served (optimized, non-optimized). Path-related, never DNR: the
    /// host retries on another path (NVMe Base 2.0 section 8.1.3).
    pub fn io_status(self) -> Option<crate::Status> {
        match self {
            AnaState::INACCESSIBLE => Some(crate::Status::ANA_INACCESSIBLE),
            AnaState::PERSISTENT_LOSS => Some(crate::Status::ANA_PERSISTENT_LOSS),
            AnaState::CHANGE => Some(crate::Status::ANA_TRANSITION),
            _ => None,
        }
    }
}
