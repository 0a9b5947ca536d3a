//! Admin commands of I/O and discovery controllers.

use crate::controller::Controller;
use crate::queue::{Outcome, Queue};
use crate::{identify, logpage};
use block::BlockDevice;
use nvme_spec::log::GetLogPage;
use nvme_spec::opcode::{Admin, Cns, FeatureId, LogId};
use nvme_spec::{Cqe, Sqe, Status};
use std::sync::Arc;

/// Outstanding Asynchronous Event Requests allowed (AERL + 1).
pub(crate) const AER_LIMIT: usize = 4;

impl<D: BlockDevice> Queue<D> {
    pub(crate) fn admin<B: AsRef<[u8]>>(
        &mut self,
        ctrl: &Arc<Controller<D>>,
        sqe: &Sqe,
        data_len: u32,
        data: Option<B>,
    ) -> Outcome<B, D> {
        let cid = sqe.cid.get();
        let Some(subsys) = ctrl.subsystem() else {
            return Outcome::status(cid, Status::INTERNAL);
        };
        let discovery = subsys.discovery;
        match Admin(sqe.opcode) {
            Admin::IDENTIFY => {
                let cns = Cns((sqe.cdw10.get() & 0xff) as u8);
                let csi = (sqe.cdw11.get() >> 24) as u8;
                let page = if data_len as usize != nvme_spec::identify::LEN {
                    // Identify returns 4 KiB; SGLS bit 16 is clear, so an
                    // SGL of any other length is refused (NVMe base 2.0
                    // 4.1.2), as nvmet does.
                    Err(Status::SGL_DATA_LENGTH_INVALID.dnr())
                } else if discovery && cns != Cns::CONTROLLER {
                    Err(Status::INVALID_FIELD.dnr())
                } else {
                    identify::build(&self.target, &self.transport, &subsys, ctrl, cns, sqe.nsid.get(), csi)
                };
                match page {
                    Ok(p) => self.host_data(cid, data_len, p),
                    Err(s) => {
                        log::debug!("{}: Identify CNS {:#04x} nsid {}: {s}", self.peer, cns.0, sqe.nsid.get());
                        Outcome::status(cid, s)
                    }
                }
            }
            Admin::GET_LOG_PAGE => {
                let glp = GetLogPage::from_sqe(sqe);
                let page = if u64::from(data_len) != glp.len_bytes {
                    // NUMD says how much to return; the SGL must describe
                    // exactly that (as for Identify).
                    Err(Status::SGL_DATA_LENGTH_INVALID.dnr())
                } else if discovery && glp.lid != LogId::DISCOVERY.0 {
                    Err(Status::INVALID_LOG_PAGE.dnr())
                } else if glp.lid == LogId::SMART.0 && !matches!(sqe.nsid.get(), 0 | u32::MAX) {
                    // LPA bit 0 is clear: the SMART / Health log is the
                    // controller's only (NVMe base 2.0 5.16.1.3).
                    Err(Status::INVALID_FIELD.dnr())
                } else {
                    logpage::build(&self.target, &subsys, ctrl, glp, self.local)
                };
                match page {
                    Ok(p) => self.host_data(cid, data_len, p),
                    Err(s) => {
                        log::debug!("{}: Get Log Page {:#04x}: {s}", self.peer, glp.lid);
                        Outcome::status(cid, s)
                    }
                }
            }
            Admin::SET_FEATURES => self.set_features(ctrl, sqe, discovery),
            Admin::GET_FEATURES => self.get_features(ctrl, sqe, data_len, discovery),
            Admin::ASYNC_EVENT_REQUEST => {
                if self.aers.len() >= AER_LIMIT {
                    return Outcome::status(cid, Status::ASYNC_EVENT_LIMIT.dnr());
                }
                self.aers.push(cid);
                Outcome::Deferred
            }
            Admin::KEEP_ALIVE => Outcome::status(cid, Status::SUCCESS),
            Admin::ABORT if !discovery => self.abort_command(ctrl, cid, sqe.cdw10.get()),
            _ => {
                drop(data);
                log::debug!("{}: admin opcode {:#04x} unsupported", self.peer, sqe.opcode);
                Outcome::status(cid, Status::INVALID_OPCODE.dnr())
            }
        }
    }

    /// Completes with controller-to-host data, truncated to what the SGL
    /// describes.
    fn host_data<B>(&self, cid: u16, data_len: u32, mut page: Vec<u8>) -> Outcome<B, D> {
        let len = data_len as usize;
        if len > self.target.settings.max_transfer as usize {
            return Outcome::status(cid, Status::SGL_DATA_LENGTH_INVALID.dnr());
        }
        page.resize(len, 0);
        Outcome::data(cid, page)
    }

    fn set_features<B>(&mut self, ctrl: &Controller<D>, sqe: &Sqe, discovery: bool) -> Outcome<B, D> {
        let cid = sqe.cid.get();
        let cdw10 = sqe.cdw10.get();
        let cdw11 = sqe.cdw11.get();
        if cdw10 & (1 << 31) != 0 {
            return Outcome::status(cid, Status::FEATURE_NOT_SAVEABLE.dnr());
        }
        let fid = FeatureId((cdw10 & 0xff) as u8);
        let mut s = ctrl.lock();
        let mut dw0 = 0;
        match fid {
            FeatureId::KEEP_ALIVE_TIMER => s.kato_ms = crate::controller::kato_rounded(cdw11),
            FeatureId::ASYNC_EVENT_CONFIG => {
                let supported = identify::async_events(discovery);
                if cdw11 & !supported != 0 {
                    log::debug!(
                        "{}: Set Features AEC {cdw11:#010x} enables events never sent (supported {supported:#010x})",
                        self.peer
                    );
                    return Outcome::status(cid, Status::INVALID_FIELD.dnr());
                }
                s.aec = cdw11;
            }
            _ if discovery => return Outcome::status(cid, Status::INVALID_FIELD.dnr()),
            FeatureId::NUMBER_OF_QUEUES => {
                if (cdw11 & 0xffff) == 0xffff || (cdw11 >> 16) == 0xffff {
                    return Outcome::status(cid, Status::INVALID_FIELD.dnr());
                }
                if !s.io_queues_connected.is_empty() {
                    return Outcome::status(cid, Status::COMMAND_SEQUENCE_ERROR.dnr());
                }
                // A fabrics I/O queue is a submission and a completion
                // queue together (Connect creates both): as many of each
                // are allocated, the fewer asked for, and Dword 0 says so
                // (NSQA, NCQA, 0-based), as Get Features does after it.
                let max = self.target.settings.max_io_queues;
                let nsq = ((cdw11 & 0xffff) as u16).saturating_add(1);
                let ncq = ((cdw11 >> 16) as u16).saturating_add(1);
                s.io_queues_granted = nsq.min(ncq).min(max);
                let n = u32::from(s.io_queues_granted.saturating_sub(1));
                dw0 = n | (n << 16);
            }
            // Only a controller with a volatile write cache has this feature.
            FeatureId::VOLATILE_WRITE_CACHE if !ctrl.vwc_present => {
                log::debug!("{}: Set Features VWC on a controller without a volatile write cache", self.peer);
                return Outcome::status(cid, Status::INVALID_FIELD.dnr());
            }
            FeatureId::VOLATILE_WRITE_CACHE => {
                let off = s.vwc_enabled && cdw11 & 1 == 0;
                ctrl.set_vwc_enabled(&mut s, cdw11 & 1 != 0);
                if off {
                    let devices = ctrl
                        .subsystem()
                        .map(|sub| {
                            let cached = sub.namespaces().into_iter().filter(|ns| ns.device.volatile_write_cache());
                            cached.map(|ns| ns.device.clone()).collect()
                        })
                        .unwrap_or_default();
                    return Outcome::FlushThenComplete { cqe: Cqe::new(cid, Status::SUCCESS, 0), devices };
                }
            }
            FeatureId::ARBITRATION => s.arbitration = cdw11,
            FeatureId::POWER_MANAGEMENT => {
                if cdw11 & 0x1f != 0 {
                    return Outcome::status(cid, Status::INVALID_FIELD.dnr());
                }
                s.power_state = cdw11;
            }
            FeatureId::TEMPERATURE_THRESHOLD => match temperature_threshold(cdw11, true) {
                Some(true) => s.temp_under = cdw11 as u16,
                Some(false) => s.temp_over = cdw11 as u16,
                None => return Outcome::status(cid, Status::INVALID_FIELD.dnr()),
            },
            FeatureId::ERROR_RECOVERY => s.error_recovery = cdw11,
            FeatureId::WRITE_ATOMICITY => s.write_atomicity = cdw11,
            FeatureId::HOST_IDENTIFIER => return Outcome::status(cid, Status::COMMAND_SEQUENCE_ERROR.dnr()),
            // Interrupt Coalescing (08h) and Interrupt Vector Configuration
            // (09h) are PCIe features, prohibited on a fabrics controller
            // (NVMe base 2.0 5.27.1): unknown here like any other.
            _ => return Outcome::status(cid, Status::INVALID_FIELD.dnr()),
        }
        Outcome::Complete { cqe: Cqe::new(cid, Status::SUCCESS, dw0), data: Vec::new() }
    }

    fn get_features<B>(&mut self, ctrl: &Controller<D>, sqe: &Sqe, data_len: u32, discovery: bool) -> Outcome<B, D> {
        let cid = sqe.cid.get();
        let fid = FeatureId((sqe.cdw10.get() & 0xff) as u8);
        let sel = (sqe.cdw10.get() >> 8) & 0x7;
        if sel > 3 {
            // SEL 100b..111b are reserved.
            return Outcome::status(cid, Status::INVALID_FIELD.dnr());
        }
        // Supported capabilities (SEL 011b), of a feature this controller
        // has (checked below): nothing is saveable or per-namespace, and
        // everything but the Host Identifier is changeable (on fabrics it
        // is Connect's, and Set Features of it is refused).
        let capabilities = |changeable: bool| Outcome::Complete {
            cqe: Cqe::new(cid, Status::SUCCESS, if changeable { 0b100 } else { 0 }),
            data: Vec::new(),
        };
        // SEL 001b asks for the default value, 010b for the saved one;
        // nothing is saveable, so that is the default too.
        let current = ctrl.lock();
        let defaults;
        let s = if matches!(sel, 1 | 2) {
            defaults = ctrl.default_state();
            &defaults
        } else {
            &*current
        };
        let dw0 = match fid {
            FeatureId::KEEP_ALIVE_TIMER => s.kato_ms,
            FeatureId::ASYNC_EVENT_CONFIG => s.aec,
            _ if discovery => return Outcome::status(cid, Status::INVALID_FIELD.dnr()),
            FeatureId::NUMBER_OF_QUEUES => {
                let n = u32::from(s.io_queues_granted.saturating_sub(1));
                n | (n << 16)
            }
            FeatureId::VOLATILE_WRITE_CACHE if !ctrl.vwc_present => {
                return Outcome::status(cid, Status::INVALID_FIELD.dnr())
            }
            FeatureId::VOLATILE_WRITE_CACHE => u32::from(s.vwc_enabled),
            FeatureId::ARBITRATION => s.arbitration,
            FeatureId::POWER_MANAGEMENT => s.power_state,
            FeatureId::TEMPERATURE_THRESHOLD => match temperature_threshold(sqe.cdw11.get(), false) {
                Some(true) => u32::from(s.temp_under),
                Some(false) => u32::from(s.temp_over),
                None => return Outcome::status(cid, Status::INVALID_FIELD.dnr()),
            },
            FeatureId::ERROR_RECOVERY => s.error_recovery,
            FeatureId::WRITE_ATOMICITY => s.write_atomicity,
            FeatureId::HOST_IDENTIFIER if sel == 3 => return capabilities(false),
            FeatureId::HOST_IDENTIFIER => {
                if sqe.cdw11.get() & 1 == 0 {
                    return Outcome::status(cid, Status::INVALID_FIELD.dnr());
                }
                drop(current);
                return self.host_data(cid, data_len, ctrl.hostid.to_vec());
            }
            _ => return Outcome::status(cid, Status::INVALID_FIELD.dnr()),
        };
        if sel == 3 {
            return capabilities(true);
        }
        Outcome::Complete { cqe: Cqe::new(cid, Status::SUCCESS, dw0), data: Vec::new() }
    }
}

/// Which Temperature Threshold CDW11 selects (NVMe base 2.0 5.27.1,
/// Temperature Threshold): `Some(true)` the under threshold (THSEL 01b),
/// `Some(false)` the over one (00b), of the composite temperature (TMPSEL
/// 0h, or 1111b "every sensor" in a Set), the only sensor there is. `None`
/// for a sensor not implemented or a reserved THSEL: Invalid Field.
fn temperature_threshold(cdw11: u32, set: bool) -> Option<bool> {
    let tmpsel = (cdw11 >> 16) & 0xf;
    let thsel = (cdw11 >> 20) & 0x3;
    if !(tmpsel == 0 || (set && tmpsel == 0xf)) || thsel > 1 {
        return None;
    }
    Some(thsel == 1)
}
