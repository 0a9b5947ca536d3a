//! The binding against a real Ceph cluster (the one `scripts/test` starts
//! with ceph-peer and names in `IRONWIRE_CEPH_CONF`), and against one that
//! cannot be reached. Every wait is bounded by the connect timeout.

use rbd::{CompareError, Error, Image, Options};
use reactor::{Config, Runtime};
use std::future::Future;
use std::path::PathBuf;
use std::task::Poll;
use std::time::{Duration, Instant};

fn options(conf: PathBuf, image: &str) -> Options {
    Options {
        ceph_conf: conf,
        client: "admin".into(),
        keyring: None,
        pool: "rbd".into(),
        image: image.into(),
        timeout: Duration::from_secs(10),
        read_only: false,
    }
}

fn run<F: std::future::Future>(f: F) -> F::Output {
    Runtime::new(Config::default()).expect("runtime").block_on(f)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed) ^ (i >> 12) as u8).collect()
}

#[test]
fn opens_the_image_with_its_size_and_reads_back_what_it_wrote() {
    let Some(conf) = rbd::test_cluster() else { return };
    let img = Image::open(&options(conf, "test")).expect("open rbd/test");
    assert_eq!(img.size(), 1 << 30, "ceph-peer's image is 1 GiB");
    run(async {
        // Offsets spread over several 4 MiB objects, one crossing a boundary.
        let writes = [(0u64, 4096usize, 1u8), (4 << 20, 65536, 2), ((8 << 20) - 4096, 16384, 3)];
        for &(off, len, seed) in &writes {
            let (r, _) = img.write(off, pattern(len, seed)).await;
            r.unwrap_or_else(|e| panic!("write {len} at {off}: {e}"));
        }
        img.flush().await.expect("flush");
        for &(off, len, seed) in &writes {
            let (r, got) = img.read(off, Vec::with_capacity(len)).await;
            r.unwrap_or_else(|e| panic!("read {len} at {off}: {e}"));
            assert!(got == pattern(len, seed), "data at {off} differs from what was written");
        }
    });
}

/// An image opened read-only reads what a writable open wrote, and librbd
/// itself refuses its writes (EROFS), before the protocols' own refusal.
#[test]
fn an_image_opened_read_only_reads_and_refuses_writes_itself() {
    let Some(conf) = rbd::test_cluster() else { return };
    let rw = Image::open(&options(conf.clone(), "test")).expect("open rbd/test");
    let ro = Image::open(&Options { read_only: true, ..options(conf, "test") }).expect("open rbd/test read-only");
    assert_eq!(ro.size(), rw.size());
    run(async {
        let off = 12 << 20;
        let (r, _) = rw.write(off, pattern(8192, 9)).await;
        r.expect("write through the writable open");
        let (r, got) = ro.read(off, Vec::with_capacity(8192)).await;
        r.expect("read through the read-only open");
        assert!(got == pattern(8192, 9), "the read-only open reads what was written");
        let (r, _) = ro.write(off, pattern(4096, 10)).await;
        let e = r.expect_err("a write through a read-only open");
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
        let (r, got) = rw.read(off, Vec::with_capacity(8192)).await;
        r.expect("read back");
        assert!(got == pattern(8192, 9), "the refused write changed nothing");
    });
}

#[test]
fn every_client_sees_the_same_cluster_fsid_and_image_id() {
    let Some(conf) = rbd::test_cluster() else { return };
    let a = Image::open(&options(conf.clone(), "test")).expect("open rbd/test");
    let b = Image::open(&options(conf, "test")).expect("open rbd/test again");
    assert_eq!(a.fsid().len(), 36, "an fsid is a UUID in text: {:?}", a.fsid());
    assert!(!a.id().is_empty(), "a format 2 image has an id");
    assert_eq!((a.fsid(), a.id()), (b.fsid(), b.id()), "a second cluster connection names the image alike");
}

#[test]
fn many_concurrent_ios_complete_on_the_submitting_reactor() {
    let Some(conf) = rbd::test_cluster() else { return };
    let img = std::rc::Rc::new(Image::open(&options(conf, "test")).expect("open"));
    run(async {
        // More I/Os than completion slots: the rest wait for a free one.
        let n = rbd::SLOTS + 200;
        let base = 64u64 << 20;
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let img = img.clone();
                reactor::spawn(async move {
                    let off = base + i as u64 * 4096;
                    let (r, _) = img.write(off, pattern(4096, i as u8)).await;
                    r.expect("write");
                    let (r, got) = img.read(off, Vec::with_capacity(4096)).await;
                    r.expect("read");
                    got == pattern(4096, i as u8)
                })
            })
            .collect();
        let mut ok = 0;
        for t in tasks {
            ok += usize::from(t.await);
        }
        assert_eq!(ok, n, "every concurrent write read back");
    });
}

#[test]
fn write_zeroes_and_discard_and_compare_and_write() {
    let Some(conf) = rbd::test_cluster() else { return };
    let img = Image::open(&options(conf, "test")).expect("open");
    run(async {
        let off = 128u64 << 20;
        let old = pattern(8192, 7);
        img.write(off, old.clone()).await.0.expect("write");
        img.write_zeroes(off + 4096, 4096).await.expect("write zeroes");
        let (r, got) = img.read(off, Vec::with_capacity(8192)).await;
        r.expect("read");
        assert!(got[..4096] == old[..4096] && got[4096..].iter().all(|&b| b == 0), "only the zeroed half reads zero");

        // A whole object discarded reads back as zeros.
        let obj = 132u64 << 20;
        img.write(obj, pattern(4096, 9)).await.0.expect("write");
        img.discard(obj, 4 << 20).await.expect("discard");
        let (r, got) = img.read(obj, Vec::with_capacity(4096)).await;
        r.expect("read");
        assert!(got.iter().all(|&b| b == 0), "a discarded object reads zeros");

        // Compare-and-write (librbd 16 takes at most one 512-byte sector):
        // a match writes, a mismatch names the first differing byte and
        // writes nothing.
        let cur = got[..512].to_vec();
        let new = pattern(512, 11);
        let (r, _) = img.compare_and_write(obj, cur.clone(), new.clone()).await;
        r.expect("matching compare-and-write");
        let mut wrong = new.clone();
        wrong[100] ^= 0xff;
        let (r, _) = img.compare_and_write(obj, wrong, pattern(512, 12)).await;
        match r {
            Err(CompareError::Miscompare { offset }) => assert_eq!(offset, 100),
            other => panic!("expected a miscompare at byte 100, got {other:?}"),
        }
        let (r, got) = img.read(obj, Vec::with_capacity(4096)).await;
        r.expect("read");
        assert!(got[..512] == new[..], "a miscompare writes nothing");
        assert!(got[512..].iter().all(|&b| b == 0), "nothing past the sector changed");
    });
}

#[test]
fn a_miscompare_names_the_differing_byte_of_a_range_that_does_not_start_an_object() {
    let Some(conf) = rbd::test_cluster() else { return };
    let img = Image::open(&options(conf, "test")).expect("open");
    run(async {
        // The fourth sector of object 34 (4 MiB objects), as a 512-byte
        // LBA device's COMPARE AND WRITE of LBA 278534 sends it.
        let sector = (136u64 << 20) + 3 * 512;
        let cur = pattern(512, 21);
        img.write(sector, cur.clone()).await.0.expect("write");
        let mut wrong = cur.clone();
        wrong[100] ^= 0xff;
        let (r, _) = img.compare_and_write(sector, wrong, pattern(512, 22)).await;
        match r {
            Err(CompareError::Miscompare { offset }) => assert_eq!(offset, 100, "the first differing byte"),
            other => panic!("expected a miscompare at byte 100, got {other:?}"),
        }
        let (r, got) = img.read(sector, Vec::with_capacity(512)).await;
        r.expect("read");
        assert!(got == cur, "a miscompare writes nothing");
    });
}

#[test]
fn a_second_reactor_on_the_same_thread_gets_its_completions() {
    let Some(conf) = rbd::test_cluster() else { return };
    let img = Image::open(&options(conf, "test")).expect("open");
    let off = 140u64 << 20;
    run(async { img.write(off, pattern(4096, 31)).await.0.expect("write on the first reactor") });
    // Runtime::new allows a thread one reactor at a time, so another may
    // follow the first on the same thread (a tool, a test).
    // Without a bound the write below would hang for ever; the bound is
    // far past the 10 s operation timeout, after which librbd fails it.
    let mut rt = Runtime::new(Config::default()).expect("a second runtime");
    let done = rt.block_on(async {
        let mut write = std::pin::pin!(img.write(off, pattern(4096, 32)));
        let mut limit = std::pin::pin!(reactor::sleep(Duration::from_secs(60)));
        std::future::poll_fn(|cx| match write.as_mut().poll(cx) {
            Poll::Ready((r, _)) => Poll::Ready(Some(r)),
            Poll::Pending => limit.as_mut().poll(cx).map(|()| None),
        })
        .await
    });
    let r = done.expect("the write on the second reactor completes");
    r.expect("write on the second reactor");
    let got = rt.block_on(async { img.read(off, Vec::with_capacity(4096)).await });
    got.0.expect("read");
    assert!(got.1 == pattern(4096, 32), "the second write landed");
}

/// An image closed before it is dropped refuses I/O, and has let go of
/// the exclusive lock its write took: another client's write does not wait
/// for the OSD to time the first client out.
#[test]
fn a_closed_image_refuses_io_and_lets_go_of_its_lock() {
    let Some(conf) = rbd::test_cluster() else { return };
    let a = Image::open(&options(conf.clone(), "test")).expect("open rbd/test");
    let off = 144u64 << 20;
    run(async { a.write(off, pattern(4096, 41)).await.0.expect("write") });
    a.close();
    run(async {
        let (r, _) = a.read(off, Vec::with_capacity(4096)).await;
        assert_eq!(r.expect_err("a read after close").raw_os_error(), Some(libc::ESHUTDOWN));
        assert_eq!(a.flush().await.expect_err("a flush after close").raw_os_error(), Some(libc::ESHUTDOWN));
    });
    assert_eq!(a.current_size().expect_err("the size after close").raw_os_error(), Some(libc::ESHUTDOWN));
    let b = Image::open(&options(conf, "test")).expect("open rbd/test again");
    let start = Instant::now();
    run(async { b.write(off, pattern(4096, 42)).await.0.expect("the other client's write") });
    assert!(start.elapsed() < Duration::from_secs(5), "the write waited {:?} for the lock", start.elapsed());
    drop(a);
}

/// A reactor whose only rbd call failed before it was submitted (here:
/// to a closed image) ends without ever having run its completion task; a
/// reactor after it on the same thread still gets its completions.
#[test]
fn a_reactor_after_one_whose_rbd_call_failed_at_once_gets_its_completions() {
    let Some(conf) = rbd::test_cluster() else { return };
    let closed = Image::open(&options(conf.clone(), "test")).expect("open rbd/test");
    closed.close();
    let img = Image::open(&options(conf, "test")).expect("open rbd/test again");
    let off = 148u64 << 20;
    std::thread::spawn(move || {
        let (r, _) = run(async { closed.read(off, Vec::with_capacity(4096)).await });
        assert_eq!(r.expect_err("a read of a closed image").raw_os_error(), Some(libc::ESHUTDOWN));
        // Bounded far past the 10 s operation timeout, as above.
        let done = run(async {
            let mut write = std::pin::pin!(img.write(off, pattern(4096, 51)));
            let mut limit = std::pin::pin!(reactor::sleep(Duration::from_secs(60)));
            std::future::poll_fn(|cx| match write.as_mut().poll(cx) {
                Poll::Ready((r, _)) => Poll::Ready(Some(r)),
                Poll::Pending => limit.as_mut().poll(cx).map(|()| None),
            })
            .await
        });
        done.expect("the write on the next reactor completes").expect("write");
    })
    .join()
    .expect("the reactors' thread");
}

#[test]
fn missing_image_and_pool_are_named() {
    let Some(conf) = rbd::test_cluster() else { return };
    let e = Image::open(&options(conf.clone(), "no-such-image")).expect_err("missing image");
    assert!(matches!(e, Error::Image { .. }) && e.to_string().contains("rbd/no-such-image"), "{e}");
    let mut o = options(conf, "test");
    o.pool = "no-such-pool".into();
    let e = Image::open(&o).expect_err("missing pool");
    assert!(e.to_string().contains("pool \"no-such-pool\""), "{e}");
}

#[test]
fn unreachable_cluster_fails_within_the_timeout_naming_the_monitors() {
    // A monitor address nothing listens on: needs no cluster, only librbd.
    if let Err(e) = Image::open(&Options { ceph_conf: "/nonexistent/ceph.conf".into(), ..options(PathBuf::new(), "x") })
    {
        if let Error::Library(why) = &e {
            assert!(why.contains("apt install"), "{why}");
            eprintln!("skipped: {why}");
            return;
        }
        assert!(e.to_string().contains("/nonexistent/ceph.conf"), "{e}");
    }
    let dir = std::env::temp_dir().join(format!("rbd-unreachable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let conf = dir.join("ceph.conf");
    std::fs::write(&conf, "[global]\nmon host = 127.0.0.1:9\nauth client required = none\n").expect("conf");
    let mut o = options(conf, "test");
    o.timeout = Duration::from_secs(2);
    let start = Instant::now();
    let e = Image::open(&o).expect_err("nothing listens there");
    let took = start.elapsed();
    let _ = std::fs::remove_dir_all(&dir);
    let msg = e.to_string();
    assert!(matches!(e, Error::Connect { .. }) && msg.contains("127.0.0.1:9"), "{msg}");
    assert!(took < Duration::from_secs(30), "connect gave up after {took:?}, not within the timeout");
}
