//! Opcodes as open newtypes: an unknown value from the wire survives decoding
//! and is answered with Invalid Opcode instead of failing to parse.

/// An admin command opcode (NVMe Base 2.0 figure 84).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Admin(pub u8);

impl Admin {
    /// Get Log Page.
    pub const GET_LOG_PAGE: Admin = Admin(0x02);
    /// Identify.
    pub const IDENTIFY: Admin = Admin(0x06);
    /// Abort.
    pub const ABORT: Admin = Admin(0x08);
    /// Set Features.
    pub const SET_FEATURES: Admin = Admin(0x09);
    /// Get Features.
    pub const GET_FEATURES: Admin = Admin(0x0a);
    /// Asynchronous Event Request.
    pub const ASYNC_EVENT_REQUEST: Admin = Admin(0x0c);
    /// Keep Alive.
    pub const KEEP_ALIVE: Admin = Admin(0x18);
    /// Fabrics command (NVMe-oF 1.1 section 3.3); FCTYPE says which.
    pub const FABRICS: Admin = Admin(0x7f);
}

/// An NVM command set I/O opcode (NVM Command Set 1.0 figure 18).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Io(pub u8);

impl Io {
    /// Flush.
    pub const FLUSH: Io = Io(0x00);
    /// Write.
    pub const WRITE: Io = Io(0x01);
    /// Read.
    pub const READ: Io = Io(0x02);
    /// Compare.
    pub const COMPARE: Io = Io(0x05);
    /// Write Zeroes.
    pub const WRITE_ZEROES: Io = Io(0x08);
    /// Dataset Management.
    pub const DATASET_MANAGEMENT: Io = Io(0x09);
}

/// A Fabrics command type (NVMe-oF 1.1 figure 13).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FabricsType(pub u8);

impl FabricsType {
    /// Property Set.
    pub const PROPERTY_SET: FabricsType = FabricsType(0x00);
    /// Connect.
    pub const CONNECT: FabricsType = FabricsType(0x01);
    /// Property Get.
    pub const PROPERTY_GET: FabricsType = FabricsType(0x04);
    /// Authentication Send.
    pub const AUTH_SEND: FabricsType = FabricsType(0x05);
    /// Authentication Receive.
    pub const AUTH_RECEIVE: FabricsType = FabricsType(0x06);
    /// Disconnect.
    pub const DISCONNECT: FabricsType = FabricsType(0x08);
}

/// A feature identifier (NVMe Base 2.0 figure 271).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FeatureId(pub u8);

impl FeatureId {
    /// Arbitration.
    pub const ARBITRATION: FeatureId = FeatureId(0x01);
    /// Power Management.
    pub const POWER_MANAGEMENT: FeatureId = FeatureId(0x02);
    /// Temperature Threshold.
    pub const TEMPERATURE_THRESHOLD: FeatureId = FeatureId(0x04);
    /// Error Recovery.
    pub const ERROR_RECOVERY: FeatureId = FeatureId(0x05);
    /// Volatile Write Cache.
    pub const VOLATILE_WRITE_CACHE: FeatureId = FeatureId(0x06);
    /// Number of Queues.
    pub const NUMBER_OF_QUEUES: FeatureId = FeatureId(0x07);
    /// Interrupt Coalescing.
    pub const INTERRUPT_COALESCING: FeatureId = FeatureId(0x08);
    /// Write Atomicity Normal.
    pub const WRITE_ATOMICITY: FeatureId = FeatureId(0x0a);
    /// Asynchronous Event Configuration.
    pub const ASYNC_EVENT_CONFIG: FeatureId = FeatureId(0x0b);
    /// Keep Alive Timer.
    pub const KEEP_ALIVE_TIMER: FeatureId = FeatureId(0x0f);
    /// Host Identifier.
    pub const HOST_IDENTIFIER: FeatureId = FeatureId(0x81);
}

/// A log page identifier (NVMe Base 2.0 figure 202).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LogId(pub u8);

impl LogId {
    /// Error Information.
    pub const ERROR: LogId = LogId(0x01);
    /// SMART / Health Information.
    pub const SMART: LogId = LogId(0x02);
    /// Firmware Slot Information.
    pub const FIRMWARE_SLOT: LogId = LogId(0x03);
    /// Changed Namespace List.
    pub const CHANGED_NAMESPACES: LogId = LogId(0x04);
    /// Commands Supported and Effects.
    pub const COMMANDS_EFFECTS: LogId = LogId(0x05);
    /// Asymmetric namespace access.
    pub const ANA: LogId = LogId(0x0c);
    /// Discovery (NVMe-oF 1.1 section 5.3).
    pub const DISCOVERY: LogId = LogId(0x70);
}

/// Identify CNS values (NVMe Base 2.0 figure 273).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cns(pub u8);

impl Cns {
    /// Identify Namespace (NVM command set).
    pub const NAMESPACE: Cns = Cns(0x00);
    /// Identify Controller.
    pub const CONTROLLER: Cns = Cns(0x01);
    /// Active Namespace ID list.
    pub const ACTIVE_NAMESPACES: Cns = Cns(0x02);
    /// Namespace Identification Descriptor list.
    pub const NS_DESCRIPTORS: Cns = Cns(0x03);
    /// I/O command set specific Identify Namespace.
    pub const CS_NAMESPACE: Cns = Cns(0x05);
    /// I/O command set specific Identify Controller.
    pub const CS_CONTROLLER: Cns = Cns(0x06);
    /// I/O command set specific active namespace list.
    pub const CS_ACTIVE_NAMESPACES: Cns = Cns(0x07);
    /// I/O command set independent Identify Namespace.
    pub const CS_INDEPENDENT_NAMESPACE: Cns = Cns(0x08);
    /// I/O Command Set data structure.
    pub const COMMAND_SETS: Cns = Cns(0x1c);
}
