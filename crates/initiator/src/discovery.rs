//! Discovery (NVMe-oF 1.1 section 5): a controller on the well-known
//! discovery NQN and its log page of the subsystems this host may reach.

use crate::cmd;
use crate::controller::{ascii, enable, fabrics_connect, get_log_page, hostid_for, le_u64, Host};
use crate::queue::{Queue, QueueOptions};
use crate::{Error, Result};
use nvme_spec::log::discovery as d;
use nvme_spec::opcode::LogId;
use std::net::SocketAddr;

/// One discovery log page entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// Transport type (3 = TCP).
    pub trtype: u8,
    /// Address family (1 = IPv4, 2 = IPv6).
    pub adrfam: u8,
    /// Subsystem type: 1 referral, 2 NVM subsystem, 3 this discovery
    /// subsystem.
    pub subtype: u8,
    /// Port ID.
    pub portid: u16,
    /// Controller ID (0xffff: dynamic).
    pub cntlid: u16,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Transport address.
    pub traddr: String,
    /// Transport service ID (the TCP port).
    pub trsvcid: String,
}

/// Parses a whole discovery log page: header then `numrec` entries (fewer
/// if the page is short).
pub fn parse_discovery_log(page: &[u8]) -> Result<(u64, Vec<DiscoveryEntry>)> {
    if page.len() < d::HEADER_LEN {
        return Err(Error::Protocol(format!("discovery log of {} bytes (header is {})", page.len(), d::HEADER_LEN)));
    }
    let genctr = le_u64(page, d::GENCTR);
    let numrec = le_u64(page, d::NUMREC);
    let entries = page
        .get(d::HEADER_LEN..)
        .unwrap_or_default()
        .chunks_exact(d::ENTRY_LEN)
        .take(usize::try_from(numrec).unwrap_or(usize::MAX))
        .map(|e| DiscoveryEntry {
            trtype: e.get(d::TRTYPE).copied().unwrap_or(0),
            adrfam: e.get(d::ADRFAM).copied().unwrap_or(0),
            subtype: e.get(d::SUBTYPE).copied().unwrap_or(0),
            portid: u16::from_le_bytes([
                e.get(d::PORTID).copied().unwrap_or(0),
                e.get(d::PORTID + 1).copied().unwrap_or(0),
            ]),
            cntlid: u16::from_le_bytes([
                e.get(d::CNTLID).copied().unwrap_or(0),
                e.get(d::CNTLID + 1).copied().unwrap_or(0),
            ]),
            subnqn: ascii(e, d::SUBNQN, 256),
            traddr: ascii(e, d::TRADDR, 256),
            trsvcid: ascii(e, d::TRSVCID, 32),
        })
        .collect();
    Ok((genctr, entries))
}

/// Lists the subsystems `hostnqn` may reach through the discovery
/// controller at `addr`.
pub async fn discover(addr: SocketAddr, hostnqn: &str) -> Result<Vec<DiscoveryEntry>> {
    discover_with(addr, hostnqn, QueueOptions::default()).await
}

/// [`discover`] with explicit queue options (digests, timeout).
pub async fn discover_with(addr: SocketAddr, hostnqn: &str, opts: QueueOptions) -> Result<Vec<DiscoveryEntry>> {
    let mut admin = Queue::connect(addr, opts).await?;
    let host = Host { hostid: hostid_for(hostnqn), subnqn: nvme_spec::DISCOVERY_NQN, hostnqn };
    fabrics_connect(&mut admin, &host, 0, 32, 0, 0xffff, 0).await?;
    enable(&mut admin).await?;
    let lid = LogId::DISCOVERY.0;
    // The header says how many records there are; read the whole page and
    // retry if the generation counter moved in between (section 5.3).
    let mut entries = None;
    for _ in 0..8 {
        let header = get_log_page(&mut admin, lid, d::HEADER_LEN as u32, 0).await?;
        let (genctr, _) = parse_discovery_log(&header)?;
        let numrec = le_u64(&header, d::NUMREC);
        let len = u64::try_from(d::HEADER_LEN).unwrap_or(1024) + numrec.saturating_mul(d::ENTRY_LEN as u64);
        let len = u32::try_from(len).map_err(|_| Error::Protocol(format!("discovery log with {numrec} records")))?;
        let page = get_log_page(&mut admin, lid, len, 0).await?;
        let (genctr2, list) = parse_discovery_log(&page)?;
        if genctr2 == genctr {
            entries = Some(list);
            break;
        }
    }
    let _ = admin.execute_raw(cmd::disconnect(), Vec::new(), 0).await;
    entries.ok_or_else(|| Error::Protocol("discovery generation counter kept changing".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme_spec::writer::Page;

    #[test]
    fn parses_entries_up_to_numrec() {
        let mut p = Page::new(d::HEADER_LEN + 3 * d::ENTRY_LEN);
        p.u64(d::GENCTR, 5).u64(d::NUMREC, 2);
        for (i, nqn) in ["nqn.2026-11.a:one", "nqn.2026-11.a:two"].iter().enumerate() {
            let base = d::HEADER_LEN + i * d::ENTRY_LEN;
            p.u8(base + d::TRTYPE, d::TRTYPE_TCP)
                .u8(base + d::SUBTYPE, d::SUBTYPE_NVME)
                .u16(base + d::PORTID, 1)
                .ascii_space(base + d::TRSVCID, 32, "4420")
                .ascii_nul(base + d::SUBNQN, 256, nqn)
                .ascii_space(base + d::TRADDR, 256, "127.0.0.1");
        }
        let (genctr, e) = parse_discovery_log(p.as_slice()).expect("parses");
        assert_eq!(genctr, 5);
        assert_eq!(e.len(), 2);
        assert_eq!(e[1].subnqn, "nqn.2026-11.a:two");
        assert_eq!(e[0].traddr, "127.0.0.1");
        assert_eq!(e[0].trsvcid, "4420");
        assert_eq!(e[0].subtype, d::SUBTYPE_NVME);
    }

    #[test]
    fn short_page_is_an_error() {
        assert!(parse_discovery_log(&[0; 16]).is_err());
    }
}
