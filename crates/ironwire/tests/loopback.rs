//! The real daemon on 127.0.0.1 driven by the `initiator` crate: discovery,
//! controller bring-up, I/O through in-capsule data and R2T, digests, the
//! error statuses a host sees, keep-alive expiry, and many controllers at
//! once. Each test starts its own daemon on its own port and kills it when
//! done; every wait is bounded.

use initiator::bench::{self, BenchOptions, Pattern};
use initiator::{cmd, discover, Controller, Error, Options, Queue, QueueOptions, Status, Transport};
mod common;

use common::{block_on, bounded, Daemon};
use std::path::PathBuf;
use std::time::Duration;

const NQN: &str = "nqn.2026-11.io.ironwire:loopback";
const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:loopback-host-a";
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:loopback-host-b";

impl Daemon {
    /// Starts the daemon with the config `body` (devices and subsystems; the
    /// NVMe/TCP port and the reactor are added here).
    fn start(tag: &str, body: &str) -> Daemon {
        Daemon::start_with(&format!("loopback-{tag}"), |_, port| {
            format!("{body}\n[[port]]\naddress = \"127.0.0.1:{port}\"\n\n[reactor]\ncores = [0]\n")
        })
    }
}

fn ram_subsystem(nqn: &str, dev: &str, size: &str, hosts: Option<&[&str]>) -> String {
    let access = match hosts {
        None => "allow_any_host = true\n".to_string(),
        Some(h) => format!("hosts = [{}]\n", h.iter().map(|h| format!("\"{h}\"")).collect::<Vec<_>>().join(", ")),
    };
    format!(
        "[[device]]\nname = \"{dev}\"\nkind = \"ram\"\nsize = \"{size}\"\n\n[[subsystem]]\nnqn = \"{nqn}\"\n{access}[[subsystem.namespace]]\ndevice = \"{dev}\"\n\n"
    )
}

/// A file device's image in the temp directory, removed when dropped.
struct TempImage(PathBuf);

impl TempImage {
    fn new(tag: &str) -> TempImage {
        let path = std::env::temp_dir().join(format!("ironwire-loopback-{tag}-{}.img", std::process::id()));
        let _ = std::fs::remove_file(&path);
        TempImage(path)
    }

    /// A 32 MiB file device on this image with `block_size`-byte blocks,
    /// namespace 1 of `NQN`, any host.
    fn subsystem(&self, block_size: u32) -> String {
        format!(
            "[[device]]\nname = \"f\"\nkind = \"file\"\npath = \"{}\"\nsize = \"32MiB\"\nblock_size = {block_size}\n\n[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n[[subsystem.namespace]]\ndevice = \"f\"\n\n",
            self.0.display()
        )
    }
}

impl Drop for TempImage {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn opts(io_queues: u16) -> Options {
    Options { io_queues, queue_size: 64, ..Options::default() }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8).collect()
}

/// The status code type and code, without DNR/More/CRD.
fn code(e: &Error) -> u16 {
    match e.status() {
        Some(s) => s.0 & 0x7ff,
        None => panic!("expected an NVMe status, got {e}"),
    }
}

const SIZES: [usize; 6] = [512, 4096, 8192, 8192 + 512, 64 << 10, 1 << 20];

/// Writes each size on each queue at distinct LBAs, then reads every one
/// back on another queue.
async fn write_read_verify(ctrl: &mut Controller, bs: usize) {
    let queues = ctrl.io_queue_count();
    let mut lba = 0u64;
    let mut written = Vec::new();
    for q in 0..queues {
        for (i, &size) in SIZES.iter().enumerate() {
            if size % bs != 0 {
                continue;
            }
            let data = pattern(size, (q * 16 + i) as u8);
            ctrl.write(q, 1, lba, data.clone())
                .await
                .unwrap_or_else(|e| panic!("write {size} bytes on queue {q}: {e}"));
            written.push((q, lba, data));
            lba += (size / bs) as u64 + 1;
        }
    }
    for (q, lba, data) in written {
        let other = (q + 1) % queues;
        let got = ctrl
            .read(other, 1, lba, (data.len() / bs) as u32)
            .await
            .unwrap_or_else(|e| panic!("read {} bytes on queue {other}: {e}", data.len()));
        assert!(
            got == data,
            "{} bytes written on queue {q} at lba {lba} read back different on queue {other}",
            data.len()
        );
    }
}

#[test]
fn discovery_lists_only_the_subsystems_the_host_may_reach() {
    let open = "nqn.2026-11.io.ironwire:disc-open";
    let closed = "nqn.2026-11.io.ironwire:disc-only-b";
    let d = Daemon::start(
        "discovery",
        &format!("{}{}", ram_subsystem(open, "a", "1MiB", None), ram_subsystem(closed, "b", "1MiB", Some(&[HOST_B]))),
    );
    block_on(bounded(30, async {
        let nvm = |entries: Vec<initiator::DiscoveryEntry>| {
            let mut v: Vec<_> = entries.into_iter().filter(|e| e.subtype == 2).collect::<Vec<_>>();
            v.sort_by(|a, b| a.subnqn.cmp(&b.subnqn));
            v
        };
        let a = nvm(discover(d.addr, HOST_A).await.expect("discover as host A"));
        let names: Vec<_> = a.iter().map(|e| e.subnqn.as_str()).collect();
        assert_eq!(names, [open], "host A must see only the open subsystem");
        let e = &a[0];
        assert_eq!(e.trtype, 3, "TCP");
        assert_eq!(e.adrfam, 1, "IPv4");
        assert_eq!(e.traddr, "127.0.0.1");
        assert_eq!(e.trsvcid, d.addr.port().to_string());

        let b = nvm(discover(d.addr, HOST_B).await.expect("discover as host B"));
        let names: Vec<_> = b.iter().map(|e| e.subnqn.as_str()).collect();
        assert_eq!(names, [closed, open], "host B may reach both (sorted)");
    }));
}

#[test]
fn connect_and_identify_report_the_target() {
    let d = Daemon::start("identify", &ram_subsystem(NQN, "r", "16MiB", None));
    block_on(bounded(30, async {
        let mut c = Controller::connect(d.addr, NQN, HOST_A, opts(1)).await.expect("connect");
        let id = c.identify_controller().await.expect("identify");
        assert_eq!(id.model, "ironwire");
        assert_eq!(id.subnqn, NQN);
        assert_eq!(id.cntlid, c.cntlid());
        assert_eq!(id.cntrltype, 1, "I/O controller");
        assert_eq!(id.max_transfer, Some(1 << 20), "MDTS of the default 1 MiB");
        assert_eq!(id.io_in_capsule(), 8192, "IOCCSZ of the default 8 KiB");
        assert!(c.version() >= 0x0001_0400, "VS {:#x}", c.version());
        assert_eq!(c.active_namespaces().await.expect("ns list"), [1]);
        let ns = c.identify_namespace(1).await.expect("identify ns");
        assert_eq!(ns.block_size, 512);
        assert_eq!(ns.size_bytes(), 16 << 20);
        let smart = c.get_log_page(0x02, 512, 0).await.expect("SMART log page");
        assert_eq!(smart.len(), 512);
        c.disconnect().await.expect("disconnect");
    }));
}

#[test]
fn four_io_queues_carry_in_capsule_and_r2t_writes() {
    let d = Daemon::start("fourq", &ram_subsystem(NQN, "r", "64MiB", None));
    block_on(bounded(60, async {
        let mut c = Controller::connect(d.addr, NQN, HOST_A, opts(4)).await.expect("connect");
        assert_eq!(c.io_queue_count(), 4);
        write_read_verify(&mut c, 512).await;
        c.disconnect().await.expect("disconnect");
    }));
}

#[test]
fn four_io_queues_with_header_and_data_digests() {
    let d = Daemon::start("digests", &ram_subsystem(NQN, "r", "64MiB", None));
    block_on(bounded(60, async {
        let mut c =
            Controller::connect(d.addr, NQN, HOST_A, Options { header_digest: true, data_digest: true, ..opts(4) })
                .await
                .expect("connect with digests");
        write_read_verify(&mut c, 512).await;
        c.disconnect().await.expect("disconnect");
    }));
}

#[test]
fn file_namespace_with_4096_byte_blocks() {
    let img = TempImage::new("file");
    let d = Daemon::start("file4k", &img.subsystem(4096));
    block_on(bounded(60, async {
        let mut c = Controller::connect(d.addr, NQN, HOST_A, opts(2)).await.expect("connect");
        let ns = c.identify_namespace(1).await.expect("identify ns");
        assert_eq!(ns.block_size, 4096);
        assert_eq!(ns.blocks, (32 << 20) / 4096);
        write_read_verify(&mut c, 4096).await;
        c.flush(0, 1).await.expect("flush");
        c.disconnect().await.expect("disconnect");
    }));
}

#[test]
fn out_of_range_lba_and_missing_namespace_fail_with_their_status() {
    let d = Daemon::start("errors", &ram_subsystem(NQN, "r", "1MiB", None));
    block_on(bounded(30, async {
        let mut c = Controller::connect(d.addr, NQN, HOST_A, opts(1)).await.expect("connect");
        let blocks = c.identify_namespace(1).await.expect("ns").blocks;
        let e = c.read(0, 1, blocks, 1).await.expect_err("read past the end");
        assert_eq!(code(&e), Status::LBA_OUT_OF_RANGE.0, "{e}");
        let e = c.read(0, 1, blocks - 1, 2).await.expect_err("read across the end");
        assert_eq!(code(&e), Status::LBA_OUT_OF_RANGE.0, "{e}");
        let e = c.write(0, 1, blocks, vec![1; 512]).await.expect_err("write past the end");
        assert_eq!(code(&e), Status::LBA_OUT_OF_RANGE.0, "{e}");
        let e = c.read(0, 7, 0, 1).await.expect_err("read of nsid 7");
        assert_eq!(code(&e), Status::INVALID_NAMESPACE.0, "{e}");
        let e = c.write(0, 7, 0, vec![1; 512]).await.expect_err("write to nsid 7");
        assert_eq!(code(&e), Status::INVALID_NAMESPACE.0, "{e}");
        // The queue still works after the failures.
        c.write(0, 1, 0, vec![9; 512]).await.expect("write");
        assert_eq!(c.read(0, 1, 0, 1).await.expect("read"), vec![9; 512]);
    }));
}

#[test]
fn host_not_in_the_allowed_list_is_refused() {
    let d = Daemon::start("refused", &ram_subsystem(NQN, "r", "1MiB", Some(&[HOST_B])));
    block_on(bounded(30, async {
        let e = Controller::connect(d.addr, NQN, HOST_A, opts(1)).await.err().expect("host A must be refused");
        assert_eq!(e.status(), Some(Status::CONNECT_INVALID_HOST.dnr()), "{e}");
        let c = Controller::connect(d.addr, NQN, HOST_B, opts(1)).await.expect("host B is allowed");
        c.disconnect().await.expect("disconnect");
    }));
}

#[test]
fn write_zeroes_and_deallocate_read_back_zeroes() {
    let d = Daemon::start("zeroes", &ram_subsystem(NQN, "r", "4MiB", None));
    block_on(bounded(30, async {
        let mut c = Controller::connect(d.addr, NQN, HOST_A, opts(1)).await.expect("connect");
        c.write(0, 1, 0, pattern(64 << 10, 3)).await.expect("write");
        c.write_zeroes(0, 1, 8, 16).await.expect("write zeroes");
        let got = c.read(0, 1, 0, 128).await.expect("read");
        assert!(got[..8 * 512] == pattern(64 << 10, 3)[..8 * 512], "before the range");
        assert!(got[8 * 512..24 * 512].iter().all(|&b| b == 0), "zeroed range");
        assert!(got[24 * 512..] == pattern(64 << 10, 3)[24 * 512..], "after the range");

        c.write(0, 1, 1000, pattern(32 << 10, 4)).await.expect("write");
        c.deallocate(0, 1, &[(1000, 8), (1032, 16)]).await.expect("deallocate");
        let got = c.read(0, 1, 1000, 64).await.expect("read");
        let want = pattern(32 << 10, 4);
        assert!(got[..8 * 512].iter().all(|&b| b == 0), "first range");
        assert!(got[8 * 512..32 * 512] == want[8 * 512..32 * 512], "between ranges");
        assert!(got[32 * 512..48 * 512].iter().all(|&b| b == 0), "second range");
        assert!(got[48 * 512..] == want[48 * 512..], "after the ranges");
    }));
}

#[test]
fn compare_matches_and_mismatches_and_flush_succeeds() {
    let d = Daemon::start("compare", &ram_subsystem(NQN, "r", "4MiB", None));
    block_on(bounded(30, async {
        let mut c = Controller::connect(d.addr, NQN, HOST_A, opts(1)).await.expect("connect");
        let data = pattern(16 << 10, 5);
        c.write(0, 1, 40, data.clone()).await.expect("write");
        c.compare(0, 1, 40, data.clone()).await.expect("same data compares equal");
        let mut other = data.clone();
        other[5000] ^= 1;
        let e = c.compare(0, 1, 40, other).await.expect_err("different data must not compare equal");
        assert_eq!(code(&e), Status::COMPARE_FAILURE.0, "{e}");
        // A compare larger than the in-capsule limit goes through R2T.
        let big = pattern(128 << 10, 6);
        c.write(0, 1, 2000, big.clone()).await.expect("write");
        c.compare(0, 1, 2000, big).await.expect("R2T compare");
        c.flush(0, 1).await.expect("flush");
    }));
}

#[test]
fn keep_alive_expiry_closes_the_admin_queue() {
    let d = Daemon::start("kato", &ram_subsystem(NQN, "r", "1MiB", None));
    block_on(bounded(60, async {
        let kato = Options { kato_ms: 1000, ..opts(1) };
        // Keep-alives every 300 ms keep the controller through 2.5 s.
        let mut kept = Controller::connect(d.addr, NQN, HOST_A, kato.clone()).await.expect("connect");
        for _ in 0..8 {
            reactor::sleep(Duration::from_millis(300)).await;
            kept.keep_alive().await.expect("keep alive within KATO");
        }
        kept.write(0, 1, 0, vec![1; 512]).await.expect("I/O still works");

        let mut silent = Controller::connect(d.addr, NQN, HOST_A, kato.clone()).await.expect("connect");
        reactor::sleep(Duration::from_secs(3)).await;
        let e = silent.keep_alive().await.expect_err("admin queue must be gone after KATO");
        assert!(matches!(e, Error::Closed | Error::Io(_) | Error::Status(_)), "unexpected error {e}");
        let e = silent.read(0, 1, 0, 1).await.expect_err("I/O queue of an expired controller must not serve I/O");
        eprintln!("I/O after expiry: {e}");

        let mut again = Controller::connect(d.addr, NQN, HOST_A, kato).await.expect("a new controller after expiry");
        again.read(0, 1, 0, 1).await.expect("read");
        again.disconnect().await.expect("disconnect");
    }));
    assert!(d.log().contains("keep-alive"), "expiry is logged");
}

#[test]
fn sixteen_null_subsystems_serve_io_at_once() {
    let mut body = String::new();
    for i in 0..16 {
        body.push_str(&format!(
            "[[device]]\nname = \"null{i}\"\nkind = \"null\"\nsize = \"1GiB\"\n\n[[subsystem]]\nnqn = \"nqn.2026-11.io.ironwire:null{i}\"\nallow_any_host = true\n[[subsystem.namespace]]\ndevice = \"null{i}\"\n\n"
        ));
    }
    let d = Daemon::start("null16", &body);
    let addr = d.addr;
    block_on(bounded(60, async move {
        let mut ctrls = Vec::new();
        for i in 0..16 {
            let nqn = format!("nqn.2026-11.io.ironwire:null{i}");
            ctrls.push(
                Controller::connect(addr, &nqn, HOST_A, opts(2)).await.unwrap_or_else(|e| panic!("connect {nqn}: {e}")),
            );
        }
        let mut tasks = Vec::new();
        for (i, mut c) in ctrls.into_iter().enumerate() {
            tasks.push(reactor::spawn(async move {
                for round in 0..20u64 {
                    let q = (round % 2) as usize;
                    c.write(q, 1, round * 8, vec![0xee; 4096])
                        .await
                        .unwrap_or_else(|e| panic!("controller {i} write: {e}"));
                    let got = c.read(q, 1, round * 8, 8).await.unwrap_or_else(|e| panic!("controller {i} read: {e}"));
                    assert!(got.iter().all(|&b| b == 0), "null reads zeroes");
                }
                c.disconnect().await.expect("disconnect");
            }));
        }
        for t in tasks {
            t.await;
        }
    }));
}

#[test]
fn pipelined_commands_complete_out_of_a_full_queue() {
    let d = Daemon::start("pipeline", &ram_subsystem(NQN, "r", "16MiB", None));
    block_on(bounded(30, async {
        let mut c = Controller::connect(d.addr, NQN, HOST_A, opts(1)).await.expect("connect");
        let q = c.io_queue(0).expect("queue");
        let depth = q.depth();
        assert_eq!(depth, 63);
        // Fill the queue with writes of mixed sizes (in-capsule and R2T).
        let mut cids = std::collections::HashSet::new();
        for i in 0..depth as u64 {
            let blocks = if i % 3 == 0 { 32 } else { 8 };
            let data = pattern(blocks as usize * 512, i as u8);
            cids.insert(q.submit(cmd::write(1, i * 32, blocks), data, 0).expect("submit write"));
        }
        assert!(q.submit(cmd::flush(1), Vec::new(), 0).is_err(), "queue is full");
        while !cids.is_empty() {
            let done = q.next_completion().await.expect("completion");
            assert!(done.cqe.status().is_success(), "{}", done.cqe.status());
            assert!(cids.remove(&done.cqe.cid.get()), "unknown cid");
        }
        for i in 0..depth as u64 {
            let blocks = if i % 3 == 0 { 32 } else { 8 };
            q.submit(cmd::read(1, i * 32, blocks), Vec::new(), blocks * 512).expect("submit read");
        }
        let mut seen = 0;
        while q.outstanding() > 0 {
            let done = q.next_completion().await.expect("completion");
            assert!(done.cqe.status().is_success());
            seen += 1;
        }
        assert_eq!(seen, depth);
        for i in [0u64, 1, 2, 61, 62] {
            let blocks = if i % 3 == 0 { 32 } else { 8 };
            let got = c.read(0, 1, i * 32, blocks).await.expect("read");
            assert!(got == pattern(blocks as usize * 512, i as u8), "lba {}", i * 32);
        }
    }));
}

#[test]
fn bare_queue_refuses_io_before_connect() {
    let d = Daemon::start("bare", &ram_subsystem(NQN, "r", "1MiB", None));
    block_on(bounded(30, async {
        let mut q = Queue::connect(d.addr, QueueOptions::default()).await.expect("ICReq/ICResp");
        let e = q.execute(cmd::read(1, 0, 1), Vec::new(), 512).await.expect_err("I/O before Connect");
        assert_eq!(code(&e), Status::COMMAND_SEQUENCE_ERROR.0, "{e}");
    }));
}

/// A short 16 KiB random read/write run with verification, 2 jobs at QD 8,
/// as host A on `NQN` at `addr`.
fn randrw_verify(addr: std::net::SocketAddr) -> BenchOptions {
    BenchOptions {
        addr,
        subnqn: NQN.into(),
        hostnqn: HOST_A.into(),
        pattern: Pattern::RandRw,
        block_size: 16 << 10,
        qd: 8,
        jobs: 2,
        runtime: Duration::from_millis(700),
        ramp: Duration::from_millis(100),
        verify: true,
        ..BenchOptions::default()
    }
}

#[test]
fn bench_randrw_verify_runs_clean() {
    let d = Daemon::start("bench", &ram_subsystem(NQN, "r", "16MiB", None));
    let r = block_on(bounded(60, async {
        bench::run(&BenchOptions { header_digest: true, data_digest: true, ..randrw_verify(d.addr) })
            .await
            .expect("bench run")
    }));
    assert!(r.reads > 0 && r.writes > 0, "{r}");
    assert_eq!(r.verify_errors, 0, "{r}");
    assert_eq!(r.bytes, r.ios * (16 << 10));
    assert!(r.latency.min <= r.latency.p50 && r.latency.p50 <= r.latency.max);
}

#[test]
fn transfer_beyond_mdts_is_rejected_and_the_queue_keeps_working() {
    let d = Daemon::start("mdts", &ram_subsystem(NQN, "r", "16MiB", None));
    block_on(bounded(30, async {
        let mut c = Controller::connect(d.addr, NQN, HOST_A, opts(1)).await.expect("connect");
        let over = (1u32 << 20) / 512 + 1;
        let q = c.io_queue(0).expect("queue");
        let r = q.execute(cmd::read(1, 0, over), Vec::new(), over * 512).await.expect_err("read beyond MDTS");
        assert_eq!(code(&r), Status::SGL_DATA_LENGTH_INVALID.0, "{r}");
        let r =
            q.execute(cmd::write(1, 0, over), vec![1; over as usize * 512], 0).await.expect_err("write beyond MDTS");
        assert_eq!(code(&r), Status::SGL_DATA_LENGTH_INVALID.0, "{r}");
        // The host's own check refuses before sending.
        assert!(matches!(c.read(0, 1, 0, over).await, Err(Error::Invalid(_))));
        c.write(0, 1, 0, vec![7; 1 << 20]).await.expect("exactly MDTS");
        assert_eq!(c.read(0, 1, 0, 2048).await.expect("read"), vec![7; 1 << 20]);
        // Number of Queues once I/O queues exist (NVMe Base 2.0 5.27.1.5).
        let e = c
            .admin_command(cmd::number_of_queues(4), Vec::new(), 0)
            .await
            .expect_err("Number of Queues after I/O queues exist");
        assert_eq!(code(&e), Status::COMMAND_SEQUENCE_ERROR.0, "{e}");
    }));
}

/// The daemon with NVMe/TCP and NVMe/RDMA (iWARP) on one port, and a second
/// RDMA port with MPA CRC off; returns it and the CRC-off port's address.
fn start_rdma(tag: &str, body: &str) -> (Daemon, std::net::SocketAddr) {
    let crc_off = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
    let d = Daemon::start_with(&format!("loopback-{tag}"), |_, port| {
        format!(
            "{body}\n[[port]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{port}\"\n\n[[port]]\ntransport = \"rdma\"\naddress = \"127.0.0.1:{port}\"\n\n[[port]]\ntransport = \"rdma\"\naddress = \"{crc_off}\"\ncrc = false\n\n[reactor]\ncores = [0]\n"
        )
    });
    (d, crc_off)
}

fn rdma(crc: bool, io_queues: u16) -> Options {
    Options { transport: Transport::Rdma { crc }, ..opts(io_queues) }
}

#[test]
fn nvme_rdma_queues_carry_in_capsule_and_rdma_read_writes_with_crc_on_and_off() {
    let (d, crc_off) = start_rdma("rdma-io", &ram_subsystem(NQN, "r", "64MiB", None));
    block_on(bounded(60, async {
        // (address, what the host asks, CRC in use): a host that asks gets
        // CRC on any port; a port with crc = true imposes it.
        for (addr, ask, used) in
            [(d.addr, true, true), (d.addr, false, true), (crc_off, false, false), (crc_off, true, true)]
        {
            let mut c = Controller::connect(addr, NQN, HOST_A, rdma(ask, 2))
                .await
                .unwrap_or_else(|e| panic!("connect over RDMA to {addr}, asking CRC {ask}: {e}"));
            assert_eq!(c.admin().transport(), Transport::Rdma { crc: used }, "{addr} asking CRC {ask}");
            assert_eq!(c.io_queue(1).expect("queue 1").transport(), Transport::Rdma { crc: used });
            let id = c.identify_controller().await.expect("identify");
            assert_eq!(id.subnqn, NQN);
            assert_eq!(id.io_in_capsule(), 8192, "IOCCSZ over RDMA");
            // 512 B .. 8 KiB ride in the capsule; 8.5 KiB .. 1 MiB are
            // fetched with RDMA Reads; reads arrive as RDMA Writes.
            write_read_verify(&mut c, 512).await;
            c.disconnect().await.expect("disconnect");
        }
    }));
}

#[test]
fn null_reads_over_rdma_are_zeros_with_crc_on_and_off() {
    // A null device's zeros go out from a shared page (iwarp::ZEROS
    // splices), one FPDU or many, their CRC computed all the same.
    let body = format!(
        "[[device]]\nname = \"n\"\nkind = \"null\"\nsize = \"64MiB\"\n\n[[subsystem]]\nnqn = \"{NQN}\"\n\
         allow_any_host = true\n[[subsystem.namespace]]\ndevice = \"n\"\n\n"
    );
    let (d, crc_off) = start_rdma("rdma-null", &body);
    block_on(bounded(60, async {
        for (addr, crc) in [(d.addr, true), (crc_off, false)] {
            let mut c = Controller::connect(addr, NQN, HOST_A, rdma(crc, 1)).await.expect("connect over RDMA");
            for blocks in [1u32, 8, 256, 2048] {
                // A write of the same length first: its buffer, full of
                // 0xa5, is the one the read reuses, so zeros the target did
                // not send would show.
                c.write(0, 1, 7, vec![0xa5; blocks as usize * 512]).await.expect("write");
                let data = c.read(0, 1, 7, blocks).await.expect("read");
                assert_eq!(data, vec![0; blocks as usize * 512], "{blocks} blocks, CRC {crc}");
            }
            c.disconnect().await.expect("disconnect");
        }
    }));
}

#[test]
fn discovery_over_rdma_lists_rdma_entries() {
    let (d, _) = start_rdma("rdma-disc", &ram_subsystem(NQN, "r", "1MiB", None));
    block_on(bounded(30, async {
        let qopts = QueueOptions { transport: Transport::Rdma { crc: true }, ..QueueOptions::default() };
        let entries = initiator::discover_with(d.addr, HOST_A, qopts).await.expect("discover over RDMA");
        let nvm: Vec<_> = entries.iter().filter(|e| e.subtype == 2).collect();
        assert!(nvm.iter().any(|e| e.trtype == 1 && e.subnqn == NQN), "no RDMA entry for {NQN}: {entries:?}");
        assert!(nvm.iter().any(|e| e.trtype == 3 && e.subnqn == NQN), "no TCP entry for {NQN}: {entries:?}");
    }));
}

#[test]
fn a_refused_host_over_rdma_gets_connect_invalid_host() {
    let (d, _) = start_rdma("rdma-refused", &ram_subsystem(NQN, "r", "1MiB", Some(&[HOST_B])));
    block_on(bounded(30, async {
        let e = Controller::connect(d.addr, NQN, HOST_A, rdma(true, 1)).await.err().expect("host A must be refused");
        assert_eq!(e.status(), Some(Status::CONNECT_INVALID_HOST.dnr()), "{e}");
        let c = Controller::connect(d.addr, NQN, HOST_B, rdma(true, 1)).await.expect("host B is allowed");
        c.disconnect().await.expect("disconnect");
    }));
}

#[test]
fn bench_randrw_verify_over_rdma_runs_clean() {
    let (d, crc_off) = start_rdma("rdma-bench", &ram_subsystem(NQN, "r", "16MiB", None));
    for (addr, crc) in [(d.addr, true), (crc_off, false)] {
        let r = block_on(bounded(60, async {
            bench::run(&BenchOptions { transport: Transport::Rdma { crc }, ..randrw_verify(addr) })
                .await
                .expect("bench run over RDMA")
        }));
        assert!(r.reads > 0 && r.writes > 0, "{r}");
        assert_eq!(r.verify_errors, 0, "{r}");
    }
}

/// A host that disables SQ flow control (Connect CATTR bit 2, nvme-cli's
/// `--disable-sqflow`) gets completions without an SQ head (0xffff) on
/// either transport, and over NVMe/TCP its reads end with their data: the
/// last C2HData PDU carries SUCCESS and no response capsule follows (the
/// host then makes the completion itself, SQ head 0). With flow control on,
/// every completion comes in a response capsule with a real SQ head.
#[test]
fn a_host_that_disables_sq_flow_control_gets_reads_ended_by_their_data() {
    let (d, _) = start_rdma("sqflow", &ram_subsystem(NQN, "r", "16MiB", None));
    block_on(bounded(60, async {
        for (transport, disable) in
            [(Transport::Tcp, true), (Transport::Tcp, false), (Transport::Rdma { crc: true }, true)]
        {
            let o = Options { transport, disable_sq_flow: disable, ..opts(1) };
            let mut c = Controller::connect(d.addr, NQN, HOST_A, o).await.expect("connect");
            let q = c.io_queue(0).expect("queue");
            let data = pattern(8 * 512, 7);
            let w = q.execute(cmd::write(1, 64, 8), data.clone(), 0).await.expect("write");
            assert_eq!(w.cqe.sqhd.get() == 0xffff, disable, "{transport:?} disable {disable}: write SQHD");
            let r = q.execute(cmd::read(1, 64, 8), Vec::new(), 8 * 512).await.expect("read");
            assert!(r.data == data, "{transport:?} disable {disable}: read back");
            let by_data = r.cqe.sqhd.get() != 0xffff && disable;
            assert_eq!(
                by_data,
                disable && transport == Transport::Tcp,
                "{transport:?}: read SQHD {}",
                r.cqe.sqhd.get()
            );
            c.disconnect().await.expect("disconnect");
            let r = bench::run(&BenchOptions { transport, disable_sq_flow: disable, ..randrw_verify(d.addr) })
                .await
                .expect("bench run");
            assert!(r.reads > 0 && r.writes > 0, "{r}");
            assert_eq!(r.verify_errors, 0, "{r}");
        }
    }));
}

#[test]
fn file_namespace_reads_over_rdma_are_sent_from_the_io_buffer_with_crc_on_and_off() {
    let img = TempImage::new("rdma-file");
    let (d, crc_off) = start_rdma("rdma-file", &img.subsystem(512));
    block_on(bounded(60, async {
        for (addr, crc) in [(d.addr, true), (crc_off, false)] {
            let mut c = Controller::connect(addr, NQN, HOST_A, rdma(crc, 2)).await.expect("connect over RDMA");
            // Reads from a file device go out as RDMA Writes straight from
            // the read's I/O buffer, in 60 KiB FPDUs up to 1 MiB.
            write_read_verify(&mut c, 512).await;
            c.disconnect().await.expect("disconnect");
        }
    }));
}
