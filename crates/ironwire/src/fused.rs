//! Runs an NVMe fused Compare and Write that the `nvmf` core assembled
//! (`BlockOp::CompareAndWrite`), for every NVMe transport: one backend
//! operation where the device has an atomic compare-and-write (rbd, one
//! sector), else read, compare and write under the device's LBA range
//! lock, so that no other write to the blocks lands in between. An Abort
//! of the Write can end the wait for the lock.

use blockdev::{BlockDevice, Device, IoBuf};
use nvmf::{io_error_status, Status};

/// Compares the blocks at `lba` with `expected` and, if equal, writes
/// `data`: the Compare's and the Write's completion status. On a
/// mismatch (or a failed read) the Write is Command Aborted due to Failed
/// Fused Command and the blocks are unchanged. `None` when `aborted`
/// ended first, while the pair waited for its range: nothing was read or
/// written.
pub async fn compare_and_write(
    device: &Device,
    lba: u64,
    expected: &[u8],
    data: &[u8],
    fua: bool,
    aborted: impl std::future::Future<Output = ()>,
) -> Option<(Status, Status)> {
    let failed = |e: &blockdev::Error, write: bool| {
        log::warn!("fused compare and write at lba {lba} of {}: {e}", device.name());
        io_error_status(e, write)
    };
    if device.atomic_compare_and_write(lba, data.len()) {
        // One backend operation (rbd: on the OSD, atomic across gateways);
        // a completed write is durable, FUA needs nothing.
        return Some(match device.compare_and_write(lba, IoBuf::from_slice(expected), IoBuf::from_slice(data)).await {
            Ok(None) => (Status::SUCCESS, Status::SUCCESS),
            Ok(Some(_)) => (Status::COMPARE_FAILURE, Status::ABORTED_FAILED_FUSED),
            Err(e) => (failed(&e, true), Status::ABORTED_FAILED_FUSED),
        });
    }
    let blocks = (data.len() / device.geometry().block_size as usize) as u64;
    let lock = match reactor::race(aborted, device.lock_range(lba, blocks)).await {
        Ok(()) => return None,
        Err(Ok(lock)) => lock,
        Err(Err(e)) => return Some((failed(&e, false), Status::ABORTED_FAILED_FUSED)),
    };
    let (r, current) = device.read(lba, IoBuf::with_len(expected.len())).await;
    if let Err(e) = r {
        return Some((failed(&e, false), Status::ABORTED_FAILED_FUSED));
    }
    if current[..] != expected[..] {
        return Some((Status::COMPARE_FAILURE, Status::ABORTED_FAILED_FUSED));
    }
    Some(match device.write_locked(&lock, lba, IoBuf::from_slice(data), fua).await.0 {
        Ok(()) => (Status::SUCCESS, Status::SUCCESS),
        Err(e) => (Status::SUCCESS, failed(&e, true)),
    })
}
