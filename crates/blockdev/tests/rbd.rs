//! The rbd device against a real Ceph cluster (the one `scripts/test`
//! starts with ceph-peer and names in `IRONWIRE_CEPH_CONF`): a one-sector
//! compare-and-write, which librbd does atomically on the OSD, still waits
//! for the device's LBA range lock over it, so that a longer
//! compare-and-write (read, compare and write in the gateway under that
//! lock) stays atomic against it.

use blockdev::{Device, IoBuf};
use std::time::Duration;

fn run<F: std::future::Future>(f: F) -> F::Output {
    reactor::Runtime::new(reactor::Config::default()).expect("io_uring runtime").block_on(f)
}

#[test]
fn a_one_sector_compare_and_write_waits_for_a_range_lock_over_it() {
    let Some(conf) = rbd::test_cluster() else { return };
    let options = rbd::Options {
        ceph_conf: conf,
        client: "admin".into(),
        keyring: None,
        pool: "rbd".into(),
        image: "test".into(),
        timeout: Duration::from_secs(10),
        read_only: false,
    };
    let dev = Device::rbd("ceph", &options, 512).expect("open rbd/test");
    // Blocks of ceph-peer's image that no other test writes.
    let first = (900u64 << 20) / 512;
    let (old, new) = (vec![0x11u8; 512], vec![0x22u8; 512]);
    run(async {
        let (r, _) = dev.write(first, IoBuf::from_slice(&[0x11; 8 * 512]), false).await;
        r.expect("write the blocks");
        assert!(dev.atomic_compare_and_write(first + 3, 512), "one sector of rbd is librbd's own compare-and-write");
        // A longer compare-and-write holds blocks 0..8 (read and compared,
        // its write not yet sent): the one-sector one inside waits.
        let lock = dev.lock_range(first, 8).await.expect("lock the range");
        let caw = dev.compare_and_write(first + 3, IoBuf::from_slice(&old), IoBuf::from_slice(&new));
        let mut caw = std::pin::pin!(caw);
        let early = reactor::timeout(Duration::from_millis(500), caw.as_mut()).await;
        assert!(early.is_err(), "the one-sector compare-and-write ran under another's range lock: {early:?}");
        drop(lock);
        let r = reactor::timeout(Duration::from_secs(30), caw).await.expect("it runs once the lock is gone");
        assert_eq!(r.expect("compare-and-write"), None, "it compared equal");
        let (r, back) = dev.read(first + 3, IoBuf::with_len(512)).await;
        r.expect("read back");
        assert_eq!(&back[..], &new[..], "it wrote");
    });
}
