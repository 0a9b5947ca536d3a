//! iSCSI PDU layouts (RFC 7143 section 11) and the deframer.
//!
//! Every PDU is a 48-byte Basic Header Segment (big-endian), optional
//! Additional Header Segments (TotalAHSLength 4-byte words), an optional
//! header digest, the data segment padded to 4 bytes and an optional data
//! digest. The BHS is one byte array with accessors: its fields move with the
//! opcode, so each accessor names the field as the spec does for the PDUs
//! that carry it. [`deframe`] returns `None` while bytes are missing, `Err`
//! when the framing itself is broken (naming the field), or the framed PDU.
//! This module never allocates per PDU beyond the copied BHS.

use crate::digest;
use crate::error::{Disposition, PduError, RejectReason};
use checksum::{Appender, Crc32c};

/// Length of the Basic Header Segment.
pub const BHS_LEN: usize = 48;

/// The "reserved" tag value 0xffffffff (RFC 7143 section 11.1): no ITT/TTT.
pub const RESERVED_TAG: u32 = 0xffff_ffff;

/// An iSCSI opcode (RFC 7143 section 11.1.1), open so unknown values survive
/// decoding and can be answered with a Reject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Opcode(pub u8);

impl Opcode {
    /// NOP-Out.
    pub const NOP_OUT: Opcode = Opcode(0x00);
    /// SCSI Command.
    pub const SCSI_CMD: Opcode = Opcode(0x01);
    /// SCSI Task Management Function Request.
    pub const TASK_MGMT_REQ: Opcode = Opcode(0x02);
    /// Login Request.
    pub const LOGIN_REQ: Opcode = Opcode(0x03);
    /// Text Request.
    pub const TEXT_REQ: Opcode = Opcode(0x04);
    /// SCSI Data-Out.
    pub const DATA_OUT: Opcode = Opcode(0x05);
    /// Logout Request.
    pub const LOGOUT_REQ: Opcode = Opcode(0x06);
    /// SNACK Request.
    pub const SNACK_REQ: Opcode = Opcode(0x10);
    /// NOP-In.
    pub const NOP_IN: Opcode = Opcode(0x20);
    /// SCSI Response.
    pub const SCSI_RESP: Opcode = Opcode(0x21);
    /// SCSI Task Management Function Response.
    pub const TASK_MGMT_RESP: Opcode = Opcode(0x22);
    /// Login Response.
    pub const LOGIN_RESP: Opcode = Opcode(0x23);
    /// Text Response.
    pub const TEXT_RESP: Opcode = Opcode(0x24);
    /// SCSI Data-In.
    pub const DATA_IN: Opcode = Opcode(0x25);
    /// Logout Response.
    pub const LOGOUT_RESP: Opcode = Opcode(0x26);
    /// Ready To Transfer.
    pub const R2T: Opcode = Opcode(0x31);
    /// Asynchronous Message.
    pub const ASYNC_MSG: Opcode = Opcode(0x32);
    /// Reject.
    pub const REJECT: Opcode = Opcode(0x3f);
}

/// BHS byte offsets, named as RFC 7143 section 11 names the fields; used to
/// name the failing field in errors.
pub mod offset {
    /// Byte 0: I bit and opcode.
    pub const OPCODE: usize = 0;
    /// Byte 1: F bit and opcode-specific flags.
    pub const FLAGS: usize = 1;
    /// Byte 4: TotalAHSLength.
    pub const TOTAL_AHS_LENGTH: usize = 4;
    /// Bytes 5..8: DataSegmentLength.
    pub const DATA_SEGMENT_LENGTH: usize = 5;
    /// Bytes 8..16: LUN (ISID and TSIH in login PDUs).
    pub const LUN: usize = 8;
    /// Bytes 16..20: Initiator Task Tag.
    pub const ITT: usize = 16;
    /// Bytes 20..24: Target Transfer Tag, Expected Data Transfer Length,
    /// Referenced Task Tag, or CID (login/logout).
    pub const WORD20: usize = 20;
    /// Bytes 24..28: CmdSN (initiator PDUs) or StatSN (target PDUs).
    pub const WORD24: usize = 24;
    /// Bytes 28..32: ExpStatSN (initiator PDUs) or ExpCmdSN (target PDUs).
    pub const WORD28: usize = 28;
    /// Bytes 32..36: MaxCmdSN (target PDUs), RefCmdSN (TMF), CDB start.
    pub const WORD32: usize = 32;
    /// Bytes 36..40: DataSN, R2TSN, ExpDataSN.
    pub const WORD36: usize = 36;
    /// Bytes 40..44: Buffer Offset.
    pub const WORD40: usize = 40;
    /// Bytes 44..48: Residual Count, Desired Data Transfer Length.
    pub const WORD44: usize = 44;
}

/// Flag bits of byte 1.
pub mod flags {
    /// Final (F) bit, all PDUs that have one.
    pub const FINAL: u8 = 0x80;
    /// SCSI Command: R (read) bit.
    pub const READ: u8 = 0x40;
    /// SCSI Command: W (write) bit.
    pub const WRITE: u8 = 0x20;
    /// SCSI Command: ATTR field mask.
    pub const ATTR_MASK: u8 = 0x07;
    /// Login: Transit (T) bit.
    pub const TRANSIT: u8 = 0x80;
    /// Login and Text: Continue (C) bit.
    pub const CONTINUE: u8 = 0x40;
    /// Data-In: Acknowledge (A) bit.
    pub const ACK: u8 = 0x40;
    /// SCSI Response: bidirectional read residual overflow (o).
    pub const BIDI_OVERFLOW: u8 = 0x10;
    /// SCSI Response: bidirectional read residual underflow (u).
    pub const BIDI_UNDERFLOW: u8 = 0x08;
    /// SCSI Response and Data-In: residual overflow (O).
    pub const OVERFLOW: u8 = 0x04;
    /// SCSI Response and Data-In: residual underflow (U).
    pub const UNDERFLOW: u8 = 0x02;
    /// Data-In: status (S) bit, phase collapse.
    pub const STATUS: u8 = 0x01;
}

/// Byte 0 bit 6: immediate delivery (I).
pub const IMMEDIATE: u8 = 0x40;

/// AHS types (RFC 7143 section 11.2.2.1).
pub mod ahs_type {
    /// Extended CDB.
    pub const EXTENDED_CDB: u8 = 1;
    /// Bidirectional Read Expected Data Transfer Length.
    pub const BIDI_READ_LENGTH: u8 = 2;
}

/// Asynchronous Message events (AsyncEvent, RFC 7143 section 11.9.1).
pub mod async_event {
    /// The target asks the initiator to log out within Parameter3 seconds.
    pub const REQUEST_LOGOUT: u8 = 1;
    /// The target will drop connection Parameter1 (Time2Wait, Time2Retain
    /// in Parameter2, Parameter3).
    pub const DROPPING_CONNECTION: u8 = 2;
    /// The target will drop every connection of the session.
    pub const DROPPING_ALL_CONNECTIONS: u8 = 3;
}

/// Login stages (CSG/NSG, RFC 7143 section 11.12.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stage(pub u8);

impl Stage {
    /// SecurityNegotiation.
    pub const SECURITY: Stage = Stage(0);
    /// LoginOperationalNegotiation.
    pub const OPERATIONAL: Stage = Stage(1);
    /// FullFeaturePhase.
    pub const FULL_FEATURE: Stage = Stage(3);
}

/// The 48-byte Basic Header Segment (RFC 7143 section 11.2.1).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Bhs(pub [u8; BHS_LEN]);

impl core::fmt::Debug for Bhs {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Bhs(op {:#04x} flags {:#04x} itt {:#x}: {:02x?})", self.opcode().0, self.flags(), self.itt(), self.0)
    }
}

impl Default for Bhs {
    fn default() -> Self {
        Bhs([0; BHS_LEN])
    }
}

macro_rules! word {
    ($(#[$doc:meta])* $get:ident, $set:ident, $off:expr) => {
        $(#[$doc])*
        pub fn $get(&self) -> u32 {
            self.u32_at($off)
        }
        $(#[$doc])*
        pub fn $set(&mut self, v: u32) -> &mut Self {
            self.set_u32($off, v);
            self
        }
    };
}

impl Bhs {
    /// A zeroed BHS with `op` in byte 0.
    pub fn new(op: Opcode) -> Self {
        let mut b = Bhs::default();
        b.set_byte(0, op.0 & 0x3f);
        b
    }

    /// The BHS at the front of `bytes`, if there are 48 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        let head = bytes.get(..BHS_LEN)?;
        let mut b = Bhs::default();
        b.0.copy_from_slice(head);
        Some(b)
    }

    fn u32_at(&self, off: usize) -> u32 {
        let mut w = [0u8; 4];
        if let Some(s) = self.0.get(off..off.saturating_add(4)) {
            w.copy_from_slice(s);
        }
        u32::from_be_bytes(w)
    }

    fn set_u32(&mut self, off: usize, v: u32) {
        if let Some(s) = self.0.get_mut(off..off.saturating_add(4)) {
            s.copy_from_slice(&v.to_be_bytes());
        }
    }

    fn u16_at(&self, off: usize) -> u16 {
        let mut w = [0u8; 2];
        if let Some(s) = self.0.get(off..off.saturating_add(2)) {
            w.copy_from_slice(s);
        }
        u16::from_be_bytes(w)
    }

    fn set_u16(&mut self, off: usize, v: u16) {
        if let Some(s) = self.0.get_mut(off..off.saturating_add(2)) {
            s.copy_from_slice(&v.to_be_bytes());
        }
    }

    fn byte(&self, off: usize) -> u8 {
        self.0.get(off).copied().unwrap_or(0)
    }

    fn set_byte(&mut self, off: usize, v: u8) {
        if let Some(b) = self.0.get_mut(off) {
            *b = v;
        }
    }

    /// Opcode (byte 0, low 6 bits).
    pub fn opcode(&self) -> Opcode {
        Opcode(self.byte(0) & 0x3f)
    }

    /// Immediate delivery bit (byte 0 bit 6).
    pub fn immediate(&self) -> bool {
        self.byte(0) & IMMEDIATE != 0
    }

    /// Sets or clears the immediate bit.
    pub fn set_immediate(&mut self, on: bool) -> &mut Self {
        let b = self.byte(0) & 0x3f;
        self.set_byte(0, if on { b | IMMEDIATE } else { b });
        self
    }

    /// Byte 1: F bit and opcode-specific flags.
    pub fn flags(&self) -> u8 {
        self.byte(1)
    }

    /// Sets byte 1.
    pub fn set_flags(&mut self, f: u8) -> &mut Self {
        self.set_byte(1, f);
        self
    }

    /// The F (final) bit.
    pub fn final_bit(&self) -> bool {
        self.flags() & flags::FINAL != 0
    }

    /// Byte 2 (SCSI Response: Response; Reject: Reason; TMF/Logout response:
    /// Response; Login: Version-max).
    pub fn byte2(&self) -> u8 {
        self.byte(2)
    }

    /// Sets byte 2.
    pub fn set_byte2(&mut self, v: u8) -> &mut Self {
        self.set_byte(2, v);
        self
    }

    /// Byte 3 (SCSI Response/Data-In: Status; Login: Version-min/active).
    pub fn byte3(&self) -> u8 {
        self.byte(3)
    }

    /// Sets byte 3.
    pub fn set_byte3(&mut self, v: u8) -> &mut Self {
        self.set_byte(3, v);
        self
    }

    /// TotalAHSLength in bytes (the field counts 4-byte words).
    pub fn total_ahs_len_bytes(&self) -> usize {
        usize::from(self.byte(offset::TOTAL_AHS_LENGTH)).saturating_mul(4)
    }

    /// DataSegmentLength: the 24-bit payload length, padding excluded.
    pub fn data_segment_length(&self) -> u32 {
        self.u32_at(offset::TOTAL_AHS_LENGTH) & 0x00ff_ffff
    }

    /// Sets DataSegmentLength (truncated to 24 bits).
    pub fn set_data_segment_length(&mut self, len: u32) -> &mut Self {
        let ahs = u32::from(self.byte(offset::TOTAL_AHS_LENGTH)) << 24;
        self.set_u32(offset::TOTAL_AHS_LENGTH, ahs | (len & 0x00ff_ffff));
        self
    }

    /// Logical Unit Number field (8 bytes, SAM encoding kept as is).
    pub fn lun(&self) -> u64 {
        let mut w = [0u8; 8];
        if let Some(s) = self.0.get(8..16) {
            w.copy_from_slice(s);
        }
        u64::from_be_bytes(w)
    }

    /// Sets the LUN field.
    pub fn set_lun(&mut self, lun: u64) -> &mut Self {
        if let Some(s) = self.0.get_mut(8..16) {
            s.copy_from_slice(&lun.to_be_bytes());
        }
        self
    }

    word!(
        /// Initiator Task Tag.
        itt, set_itt, offset::ITT
    );
    word!(
        /// Target Transfer Tag (NOP, Text, Data-In/Out, R2T).
        ttt, set_ttt, offset::WORD20
    );
    word!(
        /// SCSI Command: Expected Data Transfer Length.
        expected_data_transfer_length, set_expected_data_transfer_length, offset::WORD20
    );
    word!(
        /// TMF Request: Referenced Task Tag.
        referenced_task_tag, set_referenced_task_tag, offset::WORD20
    );
    word!(
        /// Initiator PDUs: CmdSN.
        cmd_sn, set_cmd_sn, offset::WORD24
    );
    word!(
        /// Target PDUs: StatSN.
        stat_sn, set_stat_sn, offset::WORD24
    );
    word!(
        /// Initiator PDUs: ExpStatSN.
        exp_stat_sn, set_exp_stat_sn, offset::WORD28
    );
    word!(
        /// Target PDUs: ExpCmdSN.
        exp_cmd_sn, set_exp_cmd_sn, offset::WORD28
    );
    word!(
        /// Target PDUs: MaxCmdSN.
        max_cmd_sn, set_max_cmd_sn, offset::WORD32
    );
    word!(
        /// TMF Request: RefCmdSN.
        ref_cmd_sn, set_ref_cmd_sn, offset::WORD32
    );
    word!(
        /// Data-In/Data-Out: DataSN; R2T: R2TSN; SCSI Response: ExpDataSN.
        data_sn, set_data_sn, offset::WORD36
    );
    word!(
        /// Data-In/Data-Out/R2T: Buffer Offset.
        buffer_offset, set_buffer_offset, offset::WORD40
    );
    word!(
        /// Data-In/SCSI Response: Residual Count; R2T: Desired Data Transfer Length.
        residual_count, set_residual_count, offset::WORD44
    );
    word!(
        /// SCSI Response: Bidirectional Read Residual Count.
        bidi_read_residual_count, set_bidi_read_residual_count, offset::WORD40
    );

    /// SCSI Command: the 16 CDB bytes at 32..48.
    pub fn cdb(&self) -> &[u8] {
        self.0.get(32..48).unwrap_or_default()
    }

    /// Sets the CDB bytes (up to 16; the rest are zeroed).
    pub fn set_cdb(&mut self, cdb: &[u8]) -> &mut Self {
        if let Some(s) = self.0.get_mut(32..48) {
            s.fill(0);
            let n = cdb.len().min(16);
            if let (Some(d), Some(c)) = (s.get_mut(..n), cdb.get(..n)) {
                d.copy_from_slice(c);
            }
        }
        self
    }

    /// Login/Logout: Connection ID (bytes 20..22).
    pub fn cid(&self) -> u16 {
        self.u16_at(20)
    }

    /// Sets the CID.
    pub fn set_cid(&mut self, cid: u16) -> &mut Self {
        self.set_u16(20, cid);
        self
    }

    /// Login: ISID (bytes 8..14).
    pub fn isid(&self) -> [u8; 6] {
        let mut w = [0u8; 6];
        if let Some(s) = self.0.get(8..14) {
            w.copy_from_slice(s);
        }
        w
    }

    /// Sets the ISID.
    pub fn set_isid(&mut self, isid: [u8; 6]) -> &mut Self {
        if let Some(s) = self.0.get_mut(8..14) {
            s.copy_from_slice(&isid);
        }
        self
    }

    /// Login: TSIH (bytes 14..16).
    pub fn tsih(&self) -> u16 {
        self.u16_at(14)
    }

    /// Sets the TSIH.
    pub fn set_tsih(&mut self, tsih: u16) -> &mut Self {
        self.set_u16(14, tsih);
        self
    }

    /// Login: current stage (CSG, byte 1 bits 3..2).
    pub fn csg(&self) -> Stage {
        Stage((self.flags() >> 2) & 3)
    }

    /// Login: next stage (NSG, byte 1 bits 1..0).
    pub fn nsg(&self) -> Stage {
        Stage(self.flags() & 3)
    }

    /// Login: sets T, C, CSG and NSG.
    pub fn set_login_flags(&mut self, transit: bool, cont: bool, csg: Stage, nsg: Stage) -> &mut Self {
        let mut f = ((csg.0 & 3) << 2) | (nsg.0 & 3);
        if transit {
            f |= flags::TRANSIT;
        }
        if cont {
            f |= flags::CONTINUE;
        }
        self.set_flags(f)
    }

    /// Login Response: Status-Class and Status-Detail as one code (0x0201).
    pub fn login_status(&self) -> u16 {
        self.u16_at(36)
    }

    /// Sets the Login Response status.
    pub fn set_login_status(&mut self, status: u16) -> &mut Self {
        self.set_u16(36, status);
        self
    }

    /// Logout Response: Time2Wait (bytes 40..42).
    pub fn time2wait(&self) -> u16 {
        self.u16_at(40)
    }

    /// Logout Response: Time2Retain (bytes 42..44).
    pub fn time2retain(&self) -> u16 {
        self.u16_at(42)
    }

    /// Sets Time2Wait and Time2Retain.
    pub fn set_time2(&mut self, wait: u16, retain: u16) -> &mut Self {
        self.set_u16(40, wait);
        self.set_u16(42, retain);
        self
    }

    /// Asynchronous Message: AsyncEvent (byte 36).
    pub fn async_event(&self) -> u8 {
        self.byte(36)
    }

    /// Asynchronous Message: Parameter1..3 (bytes 38..44).
    pub fn async_parameters(&self) -> [u16; 3] {
        [self.u16_at(38), self.u16_at(40), self.u16_at(42)]
    }

    /// Sets an Asynchronous Message's AsyncEvent and Parameter1..3
    /// (AsyncVCode zero).
    pub fn set_async_event(&mut self, event: u8, parameters: [u16; 3]) -> &mut Self {
        self.set_byte(36, event);
        self.set_byte(37, 0);
        self.set_u16(38, parameters[0]);
        self.set_u16(40, parameters[1]);
        self.set_u16(42, parameters[2]);
        self
    }

    fn set_total_ahs_words(&mut self, words: u8) {
        self.set_byte(offset::TOTAL_AHS_LENGTH, words);
    }
}

/// Framing parameters of one direction of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Framing {
    /// CRC32C header digest negotiated.
    pub header_digest: bool,
    /// CRC32C data digest negotiated.
    pub data_digest: bool,
    /// Most data bytes one PDU may carry in this direction (the receiver's
    /// MaxRecvDataSegmentLength).
    pub max_data_segment: u32,
}

impl Default for Framing {
    /// No digests, 8192 bytes: what applies during login (RFC 7143 section 13.12).
    fn default() -> Self {
        Framing { header_digest: false, data_digest: false, max_data_segment: 8192 }
    }
}

/// A framed PDU borrowed from the receive buffer.
#[derive(Debug)]
pub struct Frame<'a> {
    /// The Basic Header Segment.
    pub bhs: Bhs,
    /// The AHS bytes (TotalAHSLength*4).
    pub ahs: &'a [u8],
    /// The data segment without padding.
    pub data: &'a [u8],
    /// False when data digests are on and the digest did not match.
    pub data_digest_ok: bool,
    /// Bytes this PDU occupied in the buffer.
    pub len: usize,
}

/// Padding that brings `len` to a multiple of 4.
pub fn pad_len(len: usize) -> usize {
    len.wrapping_neg() & 3
}

/// The length of the PDU at the front of `buf` (its header digest, AHS,
/// data, padding and data digest included) once its BHS is whole; `None`
/// before that, and an error when its DataSegmentLength exceeds what the
/// connection accepts (so that nobody waits for it).
pub fn frame_len(buf: &[u8], framing: Framing) -> Option<Result<usize, PduError>> {
    Bhs::from_slice(buf).map(|bhs| check_len(&bhs, framing))
}

/// [`frame_len`] of a PDU whose BHS is `bhs`.
fn check_len(bhs: &Bhs, framing: Framing) -> Result<usize, PduError> {
    let dsl = bhs.data_segment_length();
    if dsl > framing.max_data_segment {
        return Err(PduError::new(
            Disposition::RejectAndClose(RejectReason::PROTOCOL_ERROR),
            "DataSegmentLength",
            format!("DataSegmentLength {dsl} exceeds MaxRecvDataSegmentLength {}", framing.max_data_segment),
            Some(*bhs),
        ));
    }
    Ok(Layout::of(bhs, framing).total)
}

/// Where the parts of a PDU lie, from its BHS.
struct Layout {
    header_end: usize,
    data_start: usize,
    data_end: usize,
    padded_end: usize,
    total: usize,
}

impl Layout {
    fn of(bhs: &Bhs, framing: Framing) -> Layout {
        let dsl = bhs.data_segment_length() as usize; // 24 bits always fit
        let hd = if framing.header_digest { digest::LEN } else { 0 };
        let header_end = BHS_LEN.saturating_add(bhs.total_ahs_len_bytes());
        let data_start = header_end.saturating_add(hd);
        let data_end = data_start.saturating_add(dsl);
        let padded_end = data_end.saturating_add(pad_len(dsl));
        let dd = if framing.data_digest && dsl > 0 { digest::LEN } else { 0 };
        Layout { header_end, data_start, data_end, padded_end, total: padded_end.saturating_add(dd) }
    }
}

/// Frames one PDU from the front of `buf`.
pub fn deframe(buf: &[u8], framing: Framing) -> Option<Result<Frame<'_>, PduError>> {
    let bhs = Bhs::from_slice(buf)?;
    if let Err(e) = check_len(&bhs, framing) {
        return Some(Err(e));
    }
    let Layout { header_end, data_start, data_end, padded_end, total } = Layout::of(&bhs, framing);
    let pdu = buf.get(..total)?;
    let header = pdu.get(..header_end).unwrap_or_default();
    if data_start != header_end {
        let got = pdu.get(header_end..data_start).unwrap_or_default();
        let want = digest::crc32c(header);
        if got != want {
            // The length fields cannot be trusted: at ErrorRecoveryLevel 0
            // the connection is dropped (RFC 7143 section 7.8).
            return Some(Err(PduError::new(
                Disposition::Close,
                "HeaderDigest",
                format!("header digest {got:02x?} (expected {want:02x?})"),
                Some(bhs),
            )));
        }
    }
    let ahs = pdu.get(BHS_LEN..header_end).unwrap_or_default();
    if let Err(e) = check_ahs(ahs) {
        return Some(Err(
            PduError::new(Disposition::Reject(RejectReason::PROTOCOL_ERROR), "AHSLength", e, Some(bhs)).with_len(total)
        ));
    }
    let data = pdu.get(data_start..data_end).unwrap_or_default();
    let data_digest_ok = if total != padded_end {
        let padded = pdu.get(data_start..padded_end).unwrap_or_default();
        pdu.get(padded_end..total).unwrap_or_default() == digest::crc32c(padded)
    } else {
        true
    };
    Some(Ok(Frame { bhs, ahs, data, data_digest_ok, len: total }))
}

/// Checks that the AHS entries tile TotalAHSLength exactly.
fn check_ahs(mut ahs: &[u8]) -> Result<(), String> {
    let total = ahs.len();
    while !ahs.is_empty() {
        let Some(&[hi, lo, _ty]) = ahs.get(..3) else {
            return Err(format!("AHS of {total} bytes ends inside an AHS header"));
        };
        let len = usize::from(u16::from_be_bytes([hi, lo]));
        // AHSLength counts the AHS-specific bytes after the type byte.
        let entry = 3usize.saturating_add(len);
        let padded = entry.saturating_add(pad_len(entry));
        let Some(rest) = ahs.get(padded..) else {
            return Err(format!("AHSLength {len} runs beyond TotalAHSLength {total}"));
        };
        if len == 0 {
            return Err("AHSLength 0".into());
        }
        ahs = rest;
    }
    Ok(())
}

/// The AHS entries of a framed PDU as (type, specific bytes).
pub fn ahs_entries(mut ahs: &[u8]) -> Vec<(u8, &[u8])> {
    let mut out = Vec::new();
    while let Some(&[hi, lo, ty]) = ahs.get(..3) {
        let len = usize::from(u16::from_be_bytes([hi, lo]));
        let entry = 3usize.saturating_add(len);
        let Some(body) = ahs.get(3..entry) else { break };
        out.push((ty, body));
        ahs = ahs.get(entry.saturating_add(pad_len(entry))..).unwrap_or_default();
    }
    out
}

/// Builds one AHS entry (RFC 7143 section 11.2.2): the AHSLength counts the
/// type-specific bytes, the entry is padded to 4 bytes.
pub fn ahs_entry(ty: u8, specific: &[u8]) -> Vec<u8> {
    let len = u16::try_from(specific.len()).unwrap_or(u16::MAX);
    let mut v = Vec::with_capacity(specific.len().saturating_add(7));
    v.extend_from_slice(&len.to_be_bytes());
    v.push(ty);
    v.extend_from_slice(specific);
    v.resize(v.len().saturating_add(pad_len(v.len())), 0);
    v
}

/// Appends a PDU to `out`: BHS (TotalAHSLength and DataSegmentLength filled
/// in here), AHS, header digest, data, padding, data digest.
pub fn encode(out: &mut Vec<u8>, bhs: &Bhs, ahs: &[u8], data: &[u8], framing: Framing) {
    let mut b = *bhs;
    b.set_total_ahs_words(u8::try_from(ahs.len() / 4).unwrap_or(u8::MAX));
    b.set_data_segment_length(u32::try_from(data.len()).unwrap_or(u32::MAX));
    let start = out.len();
    out.extend_from_slice(&b.0);
    out.extend_from_slice(ahs);
    if framing.header_digest {
        let d = digest::crc32c(out.get(start..).unwrap_or_default());
        out.extend_from_slice(&d);
    }
    if !data.is_empty() {
        let data_start = out.len();
        out.extend_from_slice(data);
        out.resize(out.len().saturating_add(pad_len(data.len())), 0);
        if framing.data_digest {
            let d = digest::crc32c(out.get(data_start..).unwrap_or_default());
            out.extend_from_slice(&d);
        }
    }
}

/// Appends a PDU without AHS whose `len` data bytes `fill` appends to
/// `out` (no zeroed slice is written first, and the data digest is
/// computed as the bytes are copied). The data goes in first and
/// the header is made by `bhs` only once `fill` succeeded, so a failed
/// fill (one returning `false` or appending another number of bytes)
/// appends nothing and changes no state the header would carry (StatSN,
/// DataSN).
pub fn encode_with(
    out: &mut Vec<u8>,
    len: usize,
    framing: Framing,
    fill: impl FnOnce(&mut Appender<'_>) -> bool,
    bhs: impl FnOnce() -> Bhs,
) -> bool {
    let start = out.len();
    let header_len = BHS_LEN.saturating_add(if framing.header_digest { digest::LEN } else { 0 });
    let data_start = start.saturating_add(header_len);
    out.resize(data_start, 0);
    let mut dd = (framing.data_digest && len > 0).then(Crc32c::new);
    let mut data = Appender::new(out, dd.as_mut());
    if !fill(&mut data) || data.len() != data_start.saturating_add(len) {
        out.truncate(start);
        return false;
    }
    data.extend_zeros(pad_len(len));
    let mut b = bhs();
    b.set_total_ahs_words(0);
    b.set_data_segment_length(u32::try_from(len).unwrap_or(u32::MAX));
    if let Some(h) = out.get_mut(start..start.saturating_add(BHS_LEN)) {
        h.copy_from_slice(&b.0);
    }
    if framing.header_digest {
        let d = digest::crc32c(out.get(start..start.saturating_add(BHS_LEN)).unwrap_or_default());
        if let Some(h) = out.get_mut(start.saturating_add(BHS_LEN)..data_start) {
            h.copy_from_slice(&d);
        }
    }
    if let Some(d) = dd {
        out.extend_from_slice(&digest::of(&d));
    }
    true
}

/// As [`encode_with`] for `len` zero bytes of data that are not written:
/// the header (and, with data digests, the digest of the zeros and their
/// padding) are appended and the position the zeros go before is
/// returned with their count, padding included. The caller sends them
/// from elsewhere.
pub fn encode_zeros(out: &mut Vec<u8>, len: usize, framing: Framing, mut bhs: Bhs) -> (usize, usize) {
    let start = out.len();
    bhs.set_total_ahs_words(0);
    bhs.set_data_segment_length(u32::try_from(len).unwrap_or(u32::MAX));
    out.extend_from_slice(&bhs.0);
    if framing.header_digest {
        let d = digest::crc32c(out.get(start..).unwrap_or_default());
        out.extend_from_slice(&d);
    }
    let at = out.len();
    let zeros = len.saturating_add(pad_len(len));
    if framing.data_digest && len > 0 {
        out.extend_from_slice(&digest::crc32c_of_zeros(zeros));
    }
    (at, zeros)
}

/// Serial number arithmetic (RFC 1982, 32 bits) as iSCSI uses it for CmdSN,
/// StatSN and friends: `a < b`.
pub fn sn_lt(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < (1 << 31)
}

/// `a <= b` in serial number arithmetic.
pub fn sn_le(a: u32, b: u32) -> bool {
    a == b || sn_lt(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: Framing = Framing { header_digest: false, data_digest: false, max_data_segment: 8192 };
    const DIGESTS: Framing = Framing { header_digest: true, data_digest: true, max_data_segment: 8192 };

    #[test]
    fn data_appended_by_a_fill_encodes_the_same_bytes_and_a_failed_fill_appends_nothing() {
        for framing in [PLAIN, DIGESTS] {
            for len in [0usize, 1, 3, 512, 4096] {
                let data: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
                let mut b = Bhs::new(Opcode::DATA_IN);
                b.set_itt(42).set_flags(flags::FINAL | flags::STATUS);
                let mut copied = vec![9u8; 3];
                encode(&mut copied, &b, &[], &data, framing);
                let mut filled = vec![9u8; 3];
                let ok = encode_with(
                    &mut filled,
                    len,
                    framing,
                    |out| {
                        out.extend_from_slice(&data);
                        true
                    },
                    || b,
                );
                assert!(ok);
                assert_eq!(filled, copied, "len {len}, digests {}", framing.data_digest);
                let mut failed = vec![9u8; 3];
                assert!(!encode_with(&mut failed, len, framing, |_| false, || b));
                assert_eq!(failed, [9u8; 3]);
                let short = |out: &mut Appender<'_>| {
                    out.extend_from_slice(data.get(1..).unwrap_or_default());
                    true
                };
                let long = |out: &mut Appender<'_>| {
                    out.extend_from_slice(&data);
                    out.extend_zeros(1);
                    true
                };
                assert!(!encode_with(&mut failed, len, framing, long, || b));
                assert_eq!(failed, [9u8; 3], "a fill appending one byte too many");
                if len > 0 {
                    assert!(!encode_with(&mut failed, len, framing, short, || b));
                    assert_eq!(failed, [9u8; 3], "a fill appending one byte too few");
                }
            }
        }
    }

    #[test]
    fn zeros_left_out_are_the_same_pdu_as_zeros_written() {
        for framing in [PLAIN, DIGESTS] {
            for len in [1usize, 3, 512, 4096, 131_073] {
                let mut b = Bhs::new(Opcode::DATA_IN);
                b.set_itt(42).set_flags(flags::FINAL | flags::STATUS);
                let mut written = vec![9u8; 3];
                encode(&mut written, &b, &[], &vec![0; len], framing);
                let mut parts = vec![9u8; 3];
                let (at, n) = encode_zeros(&mut parts, len, framing, b);
                assert_eq!(n, len + pad_len(len));
                parts.splice(at..at, std::iter::repeat_n(0, n));
                assert_eq!(parts, written, "len {len}, digests {}", framing.data_digest);
            }
        }
    }

    #[test]
    fn bhs_field_offsets_are_byte_exact() {
        let mut b = Bhs::new(Opcode::SCSI_CMD);
        b.set_immediate(true)
            .set_flags(flags::FINAL | flags::READ | 1)
            .set_lun(0x0001_0000_0000_0000)
            .set_itt(0x1122_3344)
            .set_expected_data_transfer_length(0x200)
            .set_cmd_sn(7)
            .set_exp_stat_sn(9)
            .set_cdb(&[0x28, 0, 0, 0, 0, 0x10, 0, 0, 1, 0]);
        b.set_data_segment_length(0x0a0b0c);
        let want: [u8; 48] = [
            0x41, 0xc1, 0, 0, 0, 0x0a, 0x0b, 0x0c, // opcode, flags, AHS, DSL
            0, 1, 0, 0, 0, 0, 0, 0, // LUN
            0x11, 0x22, 0x33, 0x44, // ITT
            0, 0, 2, 0, // EDTL
            0, 0, 0, 7, // CmdSN
            0, 0, 0, 9, // ExpStatSN
            0x28, 0, 0, 0, 0, 0x10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, // CDB
        ];
        assert_eq!(b.0, want);
        assert_eq!(b.opcode(), Opcode::SCSI_CMD);
        assert!(b.immediate());
        assert_eq!(b.data_segment_length(), 0x0a0b0c);
        assert_eq!(b.lun(), 0x0001_0000_0000_0000);
    }

    #[test]
    fn login_fields_are_byte_exact() {
        let mut b = Bhs::new(Opcode::LOGIN_RESP);
        b.set_login_flags(true, false, Stage::OPERATIONAL, Stage::FULL_FEATURE)
            .set_isid([0x80, 1, 2, 3, 4, 5])
            .set_tsih(0x0102)
            .set_login_status(0x0201);
        assert_eq!(b.0.get(..2), Some(&[0x23u8, 0x87][..]));
        assert_eq!(b.0.get(8..16), Some(&[0x80u8, 1, 2, 3, 4, 5, 1, 2][..]));
        assert_eq!(b.0.get(36..38), Some(&[2u8, 1][..]));
        assert_eq!((b.csg(), b.nsg()), (Stage::OPERATIONAL, Stage::FULL_FEATURE));
    }

    #[test]
    fn encodes_and_deframes_with_ahs_digests_and_padding() {
        let mut b = Bhs::new(Opcode::SCSI_CMD);
        b.set_itt(5);
        let ahs = ahs_entry(ahs_type::EXTENDED_CDB, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]);
        assert_eq!(ahs.len(), 20);
        let mut out = Vec::new();
        encode(&mut out, &b, &ahs, b"hello", DIGESTS);
        assert_eq!(out.len(), 48 + 20 + 4 + 8 + 4);
        let f = deframe(&out, DIGESTS).expect("complete").expect("valid");
        assert_eq!(f.data, b"hello");
        assert!(f.data_digest_ok);
        assert_eq!(f.len, out.len());
        assert_eq!(ahs_entries(f.ahs), vec![(1u8, ahs.get(3..20).expect("body"))]);
        for cut in 0..out.len() {
            assert!(deframe(out.get(..cut).expect("prefix"), DIGESTS).is_none(), "cut at {cut}");
        }
    }

    #[test]
    fn rejects_data_segment_beyond_max_recv_data_segment_length() {
        let mut b = Bhs::new(Opcode::NOP_OUT);
        b.set_data_segment_length(8193);
        let e = deframe(&b.0, PLAIN).expect("decided").expect_err("too long");
        assert_eq!(e.field, "DataSegmentLength");
        assert_eq!(e.disposition, Disposition::RejectAndClose(RejectReason::PROTOCOL_ERROR));
    }

    #[test]
    fn header_digest_error_closes_the_connection() {
        let mut out = Vec::new();
        encode(&mut out, &Bhs::new(Opcode::NOP_OUT), &[], b"ping", DIGESTS);
        if let Some(b) = out.get_mut(50) {
            *b ^= 1;
        }
        let e = deframe(&out, DIGESTS).expect("decided").expect_err("digest");
        assert_eq!(e.disposition, Disposition::Close);
    }

    #[test]
    fn data_digest_covers_padding() {
        let mut out = Vec::new();
        encode(&mut out, &Bhs::new(Opcode::NOP_OUT), &[], b"abc", DIGESTS);
        let pad = out.get(52 + 3).copied();
        assert_eq!(pad, Some(0));
        if let Some(b) = out.get_mut(52 + 3) {
            *b = 1;
        }
        let f = deframe(&out, DIGESTS).expect("decided").expect("framed");
        assert!(!f.data_digest_ok);
    }

    #[test]
    fn rejects_ahs_length_beyond_total_ahs_length() {
        let mut b = Bhs::new(Opcode::SCSI_CMD);
        b.set_total_ahs_words(1);
        let mut out = b.0.to_vec();
        out.extend_from_slice(&[0, 9, 1, 0]); // AHSLength 9 in a 4-byte AHS
        let e = deframe(&out, PLAIN).expect("decided").expect_err("ahs");
        assert_eq!(e.field, "AHSLength");
        assert_eq!(e.pdu_len, Some(52));
    }

    #[test]
    fn serial_arithmetic_wraps() {
        assert!(sn_lt(0xffff_fff0, 5));
        assert!(!sn_lt(5, 0xffff_fff0));
        assert!(sn_le(7, 7));
    }
}
