//! Byte offsets of the Identify data structures (NVMe Base 2.0 section
//! 5.17.2, NVM Command Set 1.0 section 4.1.5, NVMe-oF 1.1 section 4.1).
//! Each structure is 4096 bytes; fields not listed stay zero.

/// Length of every Identify data structure.
pub const LEN: usize = 4096;

/// Identify Controller (CNS 01h) field offsets.
pub mod ctrl {
    /// PCI vendor ID (u16).
    pub const VID: usize = 0;
    /// PCI subsystem vendor ID (u16).
    pub const SSVID: usize = 2;
    /// Serial number (20 ASCII).
    pub const SN: usize = 4;
    /// Model number (40 ASCII).
    pub const MN: usize = 24;
    /// Firmware revision (8 ASCII).
    pub const FR: usize = 64;
    /// Recommended arbitration burst (u8).
    pub const RAB: usize = 72;
    /// IEEE OUI (3 bytes).
    pub const IEEE: usize = 73;
    /// Multi-path I/O and namespace sharing capabilities (u8).
    pub const CMIC: usize = 76;
    /// Maximum data transfer size, 2^n pages (u8).
    pub const MDTS: usize = 77;
    /// Controller ID (u16).
    pub const CNTLID: usize = 78;
    /// Version (u32).
    pub const VER: usize = 80;
    /// RTD3 entry latency, µs (u32): how long a normal shutdown may take.
    pub const RTD3E: usize = 88;
    /// Optional asynchronous events supported (u32).
    pub const OAES: usize = 92;
    /// Controller attributes (u32).
    pub const CTRATT: usize = 96;
    /// Controller type (u8): 1 I/O, 2 discovery, 3 administrative.
    pub const CNTRLTYPE: usize = 111;
    /// FRU globally unique identifier (16 bytes).
    pub const FGUID: usize = 112;
    /// Optional admin command support (u16).
    pub const OACS: usize = 256;
    /// Abort command limit, 0-based (u8).
    pub const ACL: usize = 258;
    /// Asynchronous event request limit, 0-based (u8).
    pub const AERL: usize = 259;
    /// Firmware updates (u8).
    pub const FRMW: usize = 260;
    /// Log page attributes (u8).
    pub const LPA: usize = 261;
    /// Error log page entries, 0-based (u8).
    pub const ELPE: usize = 262;
    /// Number of power states support, 0-based (u8).
    pub const NPSS: usize = 263;
    /// Warning composite temperature threshold (u16).
    pub const WCTEMP: usize = 266;
    /// Critical composite temperature threshold (u16).
    pub const CCTEMP: usize = 268;
    /// Keep alive support, granularity in 100 ms (u16).
    pub const KAS: usize = 320;
    /// ANA transition time in seconds (u8).
    pub const ANATT: usize = 342;
    /// Asymmetric namespace access capabilities (u8).
    pub const ANACAP: usize = 343;
    /// ANA group identifier maximum (u32).
    pub const ANAGRPMAX: usize = 344;
    /// Number of ANA group identifiers (u32).
    pub const NANAGRPID: usize = 348;
    /// Submission queue entry size (u8).
    pub const SQES: usize = 512;
    /// Completion queue entry size (u8).
    pub const CQES: usize = 513;
    /// Maximum outstanding commands (u16).
    pub const MAXCMD: usize = 514;
    /// Number of namespaces (u32).
    pub const NN: usize = 516;
    /// Optional NVM command support (u16).
    pub const ONCS: usize = 520;
    /// Fused operation support (u16).
    pub const FUSES: usize = 522;
    /// Format NVM attributes (u8).
    pub const FNA: usize = 524;
    /// Volatile write cache (u8).
    pub const VWC: usize = 525;
    /// Atomic write unit normal (u16).
    pub const AWUN: usize = 526;
    /// Atomic write unit power fail (u16).
    pub const AWUPF: usize = 528;
    /// SGL support (u32).
    pub const SGLS: usize = 536;
    /// Maximum number of allowed namespaces (u32).
    pub const MNAN: usize = 540;
    /// NVM subsystem NQN (256 bytes).
    pub const SUBNQN: usize = 768;
    /// I/O queue command capsule supported size, 16-byte units (u32).
    pub const IOCCSZ: usize = 1792;
    /// I/O queue response capsule supported size, 16-byte units (u32).
    pub const IORCSZ: usize = 1796;
    /// In-capsule data offset, 16-byte units (u16).
    pub const ICDOFF: usize = 1800;
    /// Fabrics controller attributes (u8).
    pub const FCATT: usize = 1802;
    /// Maximum SGL data block descriptors (u8).
    pub const MSDBD: usize = 1803;
    /// Optional fabric commands supported (u16).
    pub const OFCS: usize = 1804;
    /// Power state 0 descriptor (32 bytes): max power in 0.01 W (u16).
    pub const PSD0_MP: usize = 2048;

    /// OAES bit: namespace attribute notices.
    pub const OAES_NS_ATTR: u32 = 1 << 8;
    /// OAES bit: asymmetric namespace access change notices.
    pub const OAES_ANA_CHANGE: u32 = 1 << 11;
    /// OAES bit: discovery log page change notices (discovery
    /// controllers, NVMe-oF 1.1 figure 31).
    pub const OAES_DISCOVERY_CHANGE: u32 = 1 << 31;
    /// CMIC: the subsystem may have more than one port.
    pub const CMIC_MULTI_PORT: u8 = 1 << 0;
    /// CMIC: the subsystem may have more than one controller.
    pub const CMIC_MULTI_CTRL: u8 = 1 << 1;
    /// CMIC: asymmetric namespace access reporting.
    pub const CMIC_ANA: u8 = 1 << 3;
    /// ANACAP: the optimized, non-optimized, inaccessible, persistent loss
    /// and change states may be reported (bits 0..=4).
    pub const ANACAP_ALL_STATES: u8 = 0x1f;
    /// ANACAP: a namespace's ANAGRPID does not change while it is attached.
    pub const ANACAP_GRPID_STATIC: u8 = 1 << 6;
    /// LPA bits: SMART per namespace, commands supported and effects log,
    /// extended data for Get Log Page.
    pub const LPA_SMART_PER_NS: u8 = 1 << 0;
    /// LPA: commands supported and effects log page.
    pub const LPA_CMD_EFFECTS: u8 = 1 << 1;
    /// LPA: extended data (NUMDU, LPOL/LPOU) for Get Log Page.
    pub const LPA_EXTENDED: u8 = 1 << 2;
    /// FUSES: fused Compare and Write supported.
    pub const FUSES_COMPARE_AND_WRITE: u16 = 1 << 0;
    /// ONCS: Compare.
    pub const ONCS_COMPARE: u16 = 1 << 0;
    /// ONCS: Dataset Management.
    pub const ONCS_DSM: u16 = 1 << 2;
    /// ONCS: Write Zeroes.
    pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;
    /// ONCS: the Save field of Set Features and the Select field of Get
    /// Features are supported (SSFS).
    pub const ONCS_SAVE_SELECT: u16 = 1 << 4;
    /// SGLS: SGLs supported (any alignment).
    pub const SGLS_SUPPORTED: u32 = 1 << 0;
    /// SGLS: keyed SGL data block descriptors (NVMe/RDMA).
    pub const SGLS_KEYED: u32 = 1 << 2;
    /// SGLS: offset SGL descriptors for in-capsule data.
    pub const SGLS_OFFSET: u32 = 1 << 20;
    /// CNTRLTYPE: I/O controller.
    pub const TYPE_IO: u8 = 1;
    /// CNTRLTYPE: discovery controller.
    pub const TYPE_DISCOVERY: u8 = 2;
}

/// I/O Command Set specific Identify Controller for the NVM command set
/// (CNS 06h, CSI 00h; NVM Command Set 1.0 figure 112) field offsets. A
/// zero limit means "no limit beyond the command's own fields".
pub mod ctrl_nvm {
    /// VSL: Verify size limit, 2^n units of CAP.MPSMIN (u8).
    pub const VSL: usize = 0;
    /// WZSL: Write Zeroes size limit, 2^n units of CAP.MPSMIN (u8).
    pub const WZSL: usize = 1;
    /// WUSL: Write Uncorrectable size limit, 2^n units of CAP.MPSMIN (u8).
    pub const WUSL: usize = 2;
    /// DMRL: Dataset Management ranges limit, ranges per command (u8).
    pub const DMRL: usize = 3;
    /// DMRSL: Dataset Management range size limit, logical blocks per
    /// range (u32).
    pub const DMRSL: usize = 4;
    /// DMSL: Dataset Management size limit, logical blocks per command
    /// (u64).
    pub const DMSL: usize = 8;
}

/// Identify Namespace, NVM command set (CNS 00h) field offsets.
pub mod ns {
    /// Namespace size in blocks (u64).
    pub const NSZE: usize = 0;
    /// Namespace capacity in blocks (u64).
    pub const NCAP: usize = 8;
    /// Namespace utilization in blocks (u64).
    pub const NUSE: usize = 16;
    /// Namespace features (u8).
    pub const NSFEAT: usize = 24;
    /// Number of LBA formats, 0-based (u8).
    pub const NLBAF: usize = 25;
    /// Formatted LBA size (u8).
    pub const FLBAS: usize = 26;
    /// Namespace multi-path and sharing capabilities (u8).
    pub const NMIC: usize = 30;
    /// Deallocate logical block features (u8).
    pub const DLFEAT: usize = 33;
    /// Namespace optimal I/O boundary... preferred write granularity (u16).
    pub const NPWG: usize = 64;
    /// Namespace preferred deallocate granularity (u16).
    pub const NPDG: usize = 68;
    /// ANA group identifier (u32).
    pub const ANAGRPID: usize = 92;
    /// Namespace attributes (u8).
    pub const NSATTR: usize = 99;
    /// NSATTR bit 0: the namespace is write protected.
    pub const NSATTR_WRITE_PROTECTED: u8 = 1 << 0;
    /// Namespace globally unique identifier (16 bytes).
    pub const NGUID: usize = 104;
    /// IEEE extended unique identifier (8 bytes).
    pub const EUI64: usize = 120;
    /// LBA format 0 (u32): MS 15:0, LBADS 23:16, RP 25:24.
    pub const LBAF0: usize = 128;

    /// NMIC: the namespace may be attached to two or more controllers.
    pub const NMIC_SHARED: u8 = 1 << 0;
    /// NSFEAT: the NPWG..NOWS fields are valid.
    pub const NSFEAT_OPTPERF: u8 = 1 << 4;
    /// NSFEAT: deallocated or unwritten logical block error support.
    pub const NSFEAT_DAE: u8 = 1 << 2;
    /// DLFEAT bits 2:0: deallocated blocks read as zeroes.
    pub const DLFEAT_READ_ZEROES: u8 = 0x01;
    /// DLFEAT bit 3: Write Zeroes may deallocate (its DEAC bit).
    pub const DLFEAT_WZ_DEALLOC: u8 = 0x08;
}

/// I/O Command Set Independent Identify Namespace (CNS 08h; NVMe Base 2.0
/// section 5.17.2) field offsets.
pub mod ns_indep {
    /// Namespace multi-path and sharing capabilities (u8).
    pub const NMIC: usize = 1;
    /// ANA group identifier (u32).
    pub const ANAGRPID: usize = 4;
    /// Namespace attributes (u8), as Identify Namespace NSATTR.
    pub const NSATTR: usize = 8;
    /// Namespace status (u8).
    pub const NSTAT: usize = 14;
    /// NSTAT bit 0: the namespace is ready.
    pub const NSTAT_READY: u8 = 1 << 0;
}

/// Namespace Identification Descriptor types (NVMe Base 2.0 figure 276).
pub mod nid {
    /// IEEE EUI-64, 8 bytes.
    pub const EUI64: u8 = 1;
    /// NGUID, 16 bytes.
    pub const NGUID: u8 = 2;
    /// UUID, 16 bytes.
    pub const UUID: u8 = 3;
    /// Command set identifier, 1 byte.
    pub const CSI: u8 = 4;
}

/// Command set identifier of the NVM command set.
pub const CSI_NVM: u8 = 0;
