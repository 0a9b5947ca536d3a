//! Controller properties reached through Property Get/Set on fabrics
//! (NVMe Base 2.0 section 3.1.3).

/// Controller Capabilities (8 bytes).
pub const CAP: u32 = 0x00;
/// Version (4 bytes).
pub const VS: u32 = 0x08;
/// Controller Configuration (4 bytes).
pub const CC: u32 = 0x14;
/// Controller Status (4 bytes).
pub const CSTS: u32 = 0x1c;
/// NVM Subsystem Reset (4 bytes).
pub const NSSR: u32 = 0x20;

/// NVMe version 1.4.0 as reported in VS.
pub const VERSION_1_4: u32 = 0x0001_0400;

/// CAP value for a fabrics controller.
///
/// `mqes` is the 0-based maximum queue entries, `timeout_500ms` the CAP.TO
/// worst-case ready time in 500 ms units. CSS advertises the NVM command set
/// (bit 37) and, for I/O controllers, the I/O command sets bit (43). Page
/// size is 4 KiB only (MPSMIN = MPSMAX = 0).
pub fn cap(mqes: u16, timeout_500ms: u8, io_command_sets: bool) -> u64 {
    let mut cap = u64::from(mqes);
    cap |= 1 << 16; // CQR: contiguous queues required
    cap |= u64::from(timeout_500ms) << 24;
    cap |= 1 << 37; // CSS: NVM command set
    if io_command_sets {
        cap |= 1 << 43; // CSS: one or more I/O command sets
    }
    cap
}

/// Controller Configuration fields (NVMe Base 2.0 figure 78).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cc(pub u32);

impl Cc {
    /// CSS 000b: the NVM command set.
    pub const CSS_NVM: u8 = 0b000;
    /// CSS 110b: all I/O command sets CAP.CSS bit 43 (bit 6 of the field)
    /// says the controller supports.
    pub const CSS_ALL_IO: u8 = 0b110;
    /// IOSQES of an NVMe over Fabrics I/O queue: 64-byte SQEs.
    pub const IOSQES_FABRICS: u8 = 6;
    /// IOCQES of an NVMe over Fabrics I/O queue: 16-byte CQEs.
    pub const IOCQES_FABRICS: u8 = 4;

    /// Enable.
    pub fn en(self) -> bool {
        self.0 & 1 != 0
    }
    /// I/O command set selected (bits 6:4).
    pub fn css(self) -> u8 {
        ((self.0 >> 4) & 0x7) as u8
    }
    /// Memory page size (bits 10:7), 2^(12+MPS).
    pub fn mps(self) -> u8 {
        ((self.0 >> 7) & 0xf) as u8
    }
    /// Arbitration mechanism selected (bits 13:11): 000b round robin.
    pub fn ams(self) -> u8 {
        ((self.0 >> 11) & 0x7) as u8
    }
    /// Shutdown notification (bits 15:14).
    pub fn shn(self) -> u8 {
        ((self.0 >> 14) & 0x3) as u8
    }
    /// I/O submission queue entry size (bits 19:16), log2.
    pub fn iosqes(self) -> u8 {
        ((self.0 >> 16) & 0xf) as u8
    }
    /// I/O completion queue entry size (bits 23:20), log2.
    pub fn iocqes(self) -> u8 {
        ((self.0 >> 20) & 0xf) as u8
    }
}

/// Controller Status bits (NVMe Base 2.0 figure 79).
pub mod csts {
    /// Ready.
    pub const RDY: u32 = 1 << 0;
    /// Controller fatal status.
    pub const CFS: u32 = 1 << 1;
    /// Shutdown processing occurring (SHST = 01b).
    pub const SHST_OCCURRING: u32 = 1 << 2;
    /// Shutdown processing complete (SHST = 10b).
    pub const SHST_COMPLETE: u32 = 2 << 2;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_places_fields_where_the_host_reads_them() {
        let cap = cap(127, 30, true);
        assert_eq!(cap & 0xffff, 127);
        assert_eq!((cap >> 24) & 0xff, 30);
        assert_ne!(cap & (1 << 37), 0);
        assert_eq!((cap >> 48) & 0xf, 0);
    }

    #[test]
    fn cc_decodes_the_linux_host_enable_value() {
        // Linux writes CC = IOCQES 4 | IOSQES 6 | MPS 0 | CSS 0 | EN.
        let cc = Cc(0x0046_0001);
        assert!(cc.en());
        assert_eq!(cc.iosqes(), 6);
        assert_eq!(cc.iocqes(), 4);
        assert_eq!(cc.shn(), 0);
        assert_eq!((cc.css(), cc.mps(), cc.ams()), (Cc::CSS_NVM, 0, 0));
        assert_eq!((cc.iosqes(), cc.iocqes()), (Cc::IOSQES_FABRICS, Cc::IOCQES_FABRICS));
        let cc = Cc(0x0046_4861);
        assert_eq!((cc.css(), cc.ams(), cc.shn()), (Cc::CSS_ALL_IO, 1, 1));
    }
}
