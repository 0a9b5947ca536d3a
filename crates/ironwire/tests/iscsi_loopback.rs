//! The real daemon's iSCSI port on 127.0.0.1 driven by `initiator::iscsi`:
//! SendTargets filtering, login with and without (mutual) CHAP and the
//! statuses of refused logins, data through immediate, unsolicited and
//! solicited (R2T) paths with and without digests, SCSI sanity and sense,
//! several sessions at once, and malformed PDUs on one connection while
//! another keeps reading and writing. Each test starts its own daemon on its
//! own port and kills it when done; every wait is bounded.

mod common;

use common::{block_on, bounded, Daemon};
use initiator::iscsi::{cdb, Error, LoginOptions, Residual, Session};
use iscsi::chap::ChapAlgorithm;
use iscsi::host::HostEvent;
use iscsi::pdu::{self, flags, Bhs, Opcode, RESERVED_TAG};
use iscsi::text::Params;
use iscsi::RejectReason;
use std::cell::Cell;
use std::future::Future;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

const PLAIN: &str = "iqn.2026-11.io.ironwire.test:plain";
const CHAP: &str = "iqn.2026-11.io.ironwire.test:chap";
const MUTUAL: &str = "iqn.2026-11.io.ironwire.test:mutual";
const ACL: &str = "iqn.2026-11.io.ironwire.test:acl";

const HOST: &str = "iqn.2026-11.io.ironwire.test:host";
const ALLOWED: &str = "iqn.2026-11.io.ironwire.test:allowed-host";

const CHAP_USER: &str = "alice";
const CHAP_SECRET: &str = "alice-secret-1234";
const MUTUAL_USER: &str = "bob";
const MUTUAL_SECRET: &str = "bob-secret-5678";
const TARGET_USER: &str = "mutual-target";
const TARGET_SECRET: &str = "target-secret-9012";

/// RAM LUN of the plain target: 16 MiB of 512-byte blocks.
const PLAIN_BLOCKS: u64 = 32768;

/// Four targets on one iSCSI port: plain RAM (512 B blocks, any initiator),
/// a file LUN with 4096 B blocks behind CHAP, a RAM LUN behind mutual CHAP,
/// and a RAM LUN open to one initiator name only.
fn targets(dir: &std::path::Path) -> String {
    format!(
        r#"
[[device]]
name = "plain"
kind = "ram"
size = "16MiB"
block_size = 512

[[device]]
name = "chapfile"
kind = "file"
path = "{file}"
size = "16MiB"
block_size = 4096

[[device]]
name = "mutual"
kind = "ram"
size = "4MiB"

[[device]]
name = "acl"
kind = "ram"
size = "4MiB"

[[iscsi_target]]
iqn = "{PLAIN}"
alias = "plain ram"
allow_any_initiator = true
[[iscsi_target.lun]]
lun = 0
device = "plain"

[[iscsi_target]]
iqn = "{CHAP}"
allow_any_initiator = true
chap = {{ user = "{CHAP_USER}", secret = "{CHAP_SECRET}" }}
[[iscsi_target.lun]]
lun = 0
device = "chapfile"

[[iscsi_target]]
iqn = "{MUTUAL}"
allow_any_initiator = true
chap = {{ user = "{MUTUAL_USER}", secret = "{MUTUAL_SECRET}" }}
mutual_chap = {{ user = "{TARGET_USER}", secret = "{TARGET_SECRET}" }}
[[iscsi_target.lun]]
lun = 0
device = "mutual"

[[iscsi_target]]
iqn = "{ACL}"
allow_any_initiator = false
initiators = ["{ALLOWED}"]
[[iscsi_target.lun]]
lun = 0
device = "acl"
"#,
        file = dir.join("chap.img").display()
    )
}

impl Daemon {
    /// Starts the daemon with the four targets on a free iSCSI port.
    fn start(tag: &str) -> Daemon {
        Daemon::start_with(&format!("iscsi-{tag}"), |dir, port| {
            format!(
                "{}\n[[port]]\ntransport = \"iscsi\"\naddress = \"127.0.0.1:{port}\"\n\n[reactor]\ncores = [0]\n",
                targets(dir)
            )
        })
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 9) as u8).collect()
}

fn opts(target: &str) -> LoginOptions {
    LoginOptions::new(HOST, Some(target))
}

fn chap_opts() -> LoginOptions {
    LoginOptions { chap: Some((CHAP_USER.into(), CHAP_SECRET.into())), ..opts(CHAP) }
}

fn mutual_opts(target_secret: &str) -> LoginOptions {
    LoginOptions {
        chap: Some((MUTUAL_USER.into(), MUTUAL_SECRET.into())),
        mutual: Some((TARGET_USER.into(), target_secret.into())),
        ..opts(MUTUAL)
    }
}

async fn login(addr: SocketAddr, o: LoginOptions) -> Session {
    let name = o.target_name.clone();
    Session::connect(addr, o).await.unwrap_or_else(|e| panic!("login to {name:?}: {e}"))
}

/// The status a refused login must have ended with.
async fn refused(addr: SocketAddr, o: LoginOptions) -> u16 {
    match Session::connect(addr, o).await {
        Ok(_) => panic!("login was accepted"),
        Err(e) => e.login_status().unwrap_or_else(|| panic!("expected a login status, got {e}")).0,
    }
}

const SIZES: [usize; 4] = [512, 4096, 64 << 10, 1 << 20];

/// Writes each size at its own LBA, then reads every one back.
async fn write_read_verify(s: &mut Session, block_len: u32, first_lba: u64, seed: u8) {
    let bl = block_len as usize;
    let mut lba = first_lba;
    let mut written = Vec::new();
    for (i, &size) in SIZES.iter().enumerate() {
        if size % bl != 0 {
            continue;
        }
        let data = pattern(size, seed.wrapping_add(i as u8));
        s.write16(0, lba, block_len, data.clone()).await.unwrap_or_else(|e| panic!("write {size} bytes: {e}"));
        written.push((lba, data));
        lba += (size / bl) as u64 + 1;
    }
    for (lba, data) in written {
        let got = s
            .read16(0, lba, (data.len() / bl) as u32, block_len)
            .await
            .unwrap_or_else(|e| panic!("read {} bytes: {e}", data.len()));
        assert!(got == data, "{} bytes at lba {lba} read back different", data.len());
    }
}

// ---- discovery ----

#[test]
fn send_targets_lists_only_the_targets_the_initiator_may_log_in_to() {
    let d = Daemon::start("sendtargets");
    let portal = format!("{},1", d.addr);
    block_on(bounded(30, async {
        let names = |list: &[(String, Vec<String>)]| {
            let mut v: Vec<String> = list.iter().map(|t| t.0.clone()).collect();
            v.sort();
            v
        };
        let mut s = login(d.addr, LoginOptions::new(HOST, None)).await;
        let list = s.send_targets().await.expect("SendTargets");
        assert_eq!(names(&list), [CHAP, MUTUAL, PLAIN], "no ACL target for {HOST}");
        for (name, portals) in &list {
            assert_eq!(*portals, [portal.as_str()], "portals of {name}");
        }
        // A discovery session carries no SCSI commands.
        match s.scsi(0, &cdb::test_unit_ready(), Vec::new(), 0).await {
            Err(Error::Rejected { .. }) => {}
            other => panic!("SCSI command in a discovery session: {other:?}"),
        }
        s.logout().await.expect("logout");

        let mut s = login(d.addr, LoginOptions::new(ALLOWED, None)).await;
        let list = s.send_targets().await.expect("SendTargets");
        assert_eq!(names(&list), [ACL, CHAP, MUTUAL, PLAIN]);
        s.logout().await.expect("logout");

        // In a normal session SendTargets=All names the session's target only.
        let mut s = login(d.addr, opts(PLAIN)).await;
        let list = s.send_targets().await.expect("SendTargets");
        assert_eq!(names(&list), [PLAIN]);
        s.logout().await.expect("logout");
    }));
}

// ---- data paths ----

/// The operational keys of one data path, and what it exercises.
fn profiles() -> Vec<(&'static str, Params)> {
    let base = LoginOptions::new(HOST, None).params;
    vec![
        ("immediate data (first burst 256 KiB), R2T for the rest", base),
        (
            "unsolicited Data-Out (ImmediateData=No, first burst 16 KiB), then R2T",
            Params { immediate_data: false, initial_r2t: false, first_burst_length: 16384, ..base },
        ),
        (
            "immediate data (first burst 16 KiB) with InitialR2T=Yes, then R2T",
            Params { immediate_data: true, initial_r2t: true, first_burst_length: 16384, ..base },
        ),
        ("R2T only (ImmediateData=No, InitialR2T=Yes)", Params { immediate_data: false, initial_r2t: true, ..base }),
        (
            "small PDUs and bursts: 4 KiB Data-In segments, 32 KiB bursts",
            Params {
                max_recv_data_segment_length: 4096,
                max_burst_length: 32768,
                first_burst_length: 8192,
                max_outstanding_r2t: 1,
                ..base
            },
        ),
    ]
}

#[test]
fn plain_login_round_trips_512_4k_64k_and_1m_through_every_write_path() {
    let d = Daemon::start("plain-paths");
    block_on(bounded(60, async {
        let mut lba = 0u64;
        let mut written = Vec::new();
        for (i, (what, params)) in profiles().into_iter().enumerate() {
            let mut s = login(d.addr, LoginOptions { params, ..opts(PLAIN) }).await;
            let p = *s.params();
            assert_eq!((p.immediate_data, p.initial_r2t), (params.immediate_data, params.initial_r2t), "{what}");
            assert_eq!(p.first_burst_length, params.first_burst_length, "{what}");
            assert_eq!(p.max_burst_length, params.max_burst_length, "{what}");
            assert_eq!(p.max_recv_data_segment_length, params.max_recv_data_segment_length, "{what}");
            for &size in &SIZES {
                let data = pattern(size, (i * 8) as u8 ^ size as u8);
                s.write16(0, lba, 512, data.clone()).await.unwrap_or_else(|e| panic!("{what}: write {size}: {e}"));
                let got = s.read16(0, lba, (size / 512) as u32, 512).await.unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(got == data, "{what}: {size} bytes read back different on the same session");
                written.push((what, lba, data));
                lba += (size / 512) as u64 + 8;
            }
            s.logout().await.unwrap_or_else(|e| panic!("{what}: logout: {e}"));
        }
        // Everything is still there for a later session.
        let mut s = login(d.addr, opts(PLAIN)).await;
        for (what, lba, data) in written {
            let got = s.read16(0, lba, (data.len() / 512) as u32, 512).await.expect("read back");
            assert!(got == data, "{what}: {} bytes at lba {lba} differ in a new session", data.len());
        }
        s.logout().await.expect("logout");
    }));
}

#[test]
fn header_and_data_digests_round_trip_every_size() {
    let d = Daemon::start("digests");
    block_on(bounded(60, async {
        for (what, params) in profiles() {
            let mut s =
                login(d.addr, LoginOptions { header_digest: true, data_digest: true, params, ..opts(PLAIN) }).await;
            let p = *s.params();
            assert!(p.header_digest && p.data_digest, "{what}: digests negotiated");
            write_read_verify(&mut s, 512, 0, 0x5a).await;
            s.logout().await.expect("logout");
        }
    }));
}

// ---- authentication and authorization ----

#[test]
fn chap_login_works_and_a_wrong_secret_is_refused_with_0201() {
    let d = Daemon::start("chap");
    block_on(bounded(60, async {
        let mut s = login(d.addr, chap_opts()).await;
        write_read_verify(&mut s, 4096, 0, 1).await;
        s.logout().await.expect("logout");
        let wrong = LoginOptions { chap: Some((CHAP_USER.into(), "not-the-secret-at-all".into())), ..opts(CHAP) };
        assert_eq!(refused(d.addr, wrong).await, 0x0201, "wrong secret");
        let unknown_user = LoginOptions { chap: Some(("mallory".into(), CHAP_SECRET.into())), ..opts(CHAP) };
        assert_eq!(refused(d.addr, unknown_user).await, 0x0201, "unknown user");
        assert_eq!(refused(d.addr, opts(CHAP)).await, 0x0201, "no CHAP offered");
        // Every CHAP algorithm the target knows works.
        for alg in ChapAlgorithm::ALL {
            let s = login(d.addr, LoginOptions { chap_algorithms: vec![alg], ..chap_opts() }).await;
            s.logout().await.unwrap_or_else(|e| panic!("{alg:?}: {e}"));
        }
    }));
    assert!(d.log().contains("0x0201"), "refusals are logged");
}

#[test]
fn mutual_chap_works_and_a_wrong_target_secret_makes_the_initiator_refuse() {
    let d = Daemon::start("mutual");
    block_on(bounded(60, async {
        let mut s = login(d.addr, mutual_opts(TARGET_SECRET)).await;
        write_read_verify(&mut s, 512, 0, 2).await;
        s.logout().await.expect("logout");
        match Session::connect(d.addr, mutual_opts("not-the-target-secret")).await {
            Err(Error::TargetNotAuthenticated) => {}
            other => panic!("wrong target secret: {:?}", other.map(|_| "logged in")),
        }
        let wrong_name =
            LoginOptions { mutual: Some(("someone-else".into(), TARGET_SECRET.into())), ..mutual_opts(TARGET_SECRET) };
        match Session::connect(d.addr, wrong_name).await {
            Err(Error::TargetNotAuthenticated) => {}
            other => panic!("wrong target name: {:?}", other.map(|_| "logged in")),
        }
        // The refusals left the target serving.
        let s = login(d.addr, mutual_opts(TARGET_SECRET)).await;
        s.logout().await.expect("logout");
    }));
}

#[test]
fn acl_refuses_other_initiators_with_0202_and_admits_the_listed_one() {
    let d = Daemon::start("acl");
    block_on(bounded(30, async {
        assert_eq!(refused(d.addr, opts(ACL)).await, 0x0202);
        let mut s = login(d.addr, LoginOptions::new(ALLOWED, Some(ACL))).await;
        write_read_verify(&mut s, 512, 0, 3).await;
        s.logout().await.expect("logout");
    }));
}

#[test]
fn unknown_target_is_refused_with_0203() {
    let d = Daemon::start("unknown");
    block_on(bounded(30, async {
        assert_eq!(refused(d.addr, opts("iqn.2026-11.io.ironwire.test:nobody")).await, 0x0203);
    }));
}

// ---- SCSI ----

#[test]
fn inquiry_read_capacity_and_report_luns_describe_the_luns() {
    let d = Daemon::start("scsi");
    block_on(bounded(30, async {
        for (o, blocks, block_len) in [(opts(PLAIN), PLAIN_BLOCKS, 512), (chap_opts(), 4096, 4096)] {
            let mut s = login(d.addr, o).await;
            s.test_unit_ready(0).await.expect("TEST UNIT READY");
            let inq = s.inquiry(0).await.expect("INQUIRY");
            assert_eq!(inq.vendor, "IRONWIRE");
            assert_eq!(inq.device_type, 0, "direct access block device");
            assert!(!inq.product.is_empty());
            let cap = s.read_capacity16(0).await.expect("READ CAPACITY (16)");
            assert_eq!((cap.blocks, cap.block_len), (blocks, block_len));
            assert_eq!(s.report_luns().await.expect("REPORT LUNS"), [0]);
            s.logout().await.expect("logout");
        }
    }));
}

#[test]
fn read_beyond_the_last_block_gets_check_condition_lba_out_of_range() {
    let d = Daemon::start("range");
    block_on(bounded(30, async {
        let mut s = login(d.addr, opts(PLAIN)).await;
        for (lba, blocks) in [(PLAIN_BLOCKS, 1), (PLAIN_BLOCKS - 1, 2), (u64::MAX, 1)] {
            let r = s.scsi(0, &cdb::read16(lba, blocks), Vec::new(), blocks * 512).await.expect("a response");
            assert_eq!(r.status, 0x02, "CHECK CONDITION for lba {lba} + {blocks}");
            let sense = r.sense_code().expect("sense data");
            assert_eq!((sense.key, sense.asc, sense.ascq), (0x05, 0x21, 0x00), "lba {lba} + {blocks}");
        }
        // The helper turns it into an error carrying the sense.
        let e = s.read16(0, PLAIN_BLOCKS, 1, 512).await.expect_err("out of range");
        assert_eq!(e.sense().map(|c| (c.key, c.asc, c.ascq)), Some((0x05, 0x21, 0x00)), "{e}");
        // The last block itself is fine, and so is the session.
        s.write16(0, PLAIN_BLOCKS - 1, 512, pattern(512, 9)).await.expect("write last block");
        assert_eq!(s.read16(0, PLAIN_BLOCKS - 1, 1, 512).await.expect("read last block"), pattern(512, 9));
        s.logout().await.expect("logout");
    }));
}

/// GET LBA STATUS from `lba`: the first descriptor's block count and
/// provisioning status (0 mapped, 1 deallocated).
async fn lba_status(s: &mut Session, lba: u64) -> (u32, u8) {
    let mut c = [0u8; 16];
    c[0] = 0x9E;
    c[1] = 0x12;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[13] = 24;
    let r = s.scsi(0, &c, Vec::new(), 24).await.expect("a response").check().expect("GET LBA STATUS");
    assert_eq!(r.data.len(), 24, "header and one descriptor");
    assert_eq!(r.data[8..16], lba.to_be_bytes(), "the descriptor starts at the starting LBA");
    (u32::from_be_bytes(r.data[16..20].try_into().expect("4 bytes")), r.data[20] & 0x0F)
}

#[test]
fn get_lba_status_reports_the_holes_of_a_file_lun_that_unmap_made() {
    let d = Daemon::start("lbastatus");
    block_on(bounded(30, async {
        let mut s = login(d.addr, chap_opts()).await;
        // The file was created sparse: nothing written is deallocated
        // (LBPRZ: reads zeros), up to where the first write lands.
        let (lba, blocks) = (64u64, 8u32);
        s.write16(0, lba, 4096, pattern(8 * 4096, 3)).await.expect("write");
        assert_eq!(lba_status(&mut s, 0).await, (64, 1), "the hole before the write");
        assert_eq!(lba_status(&mut s, lba).await, (blocks, 0), "the written blocks are mapped");
        assert_eq!(lba_status(&mut s, lba + 8).await, (4096 - 72, 1), "the hole after them");
        // UNMAP of the middle four punches a hole in the file.
        let mut list = vec![0, 22, 0, 16, 0, 0, 0, 0];
        list.extend_from_slice(&(lba + 2).to_be_bytes());
        list.extend_from_slice(&4u32.to_be_bytes());
        list.extend_from_slice(&[0; 4]);
        let unmap = [0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0];
        s.scsi(0, &unmap, list, 0).await.expect("a response").check().expect("UNMAP");
        assert_eq!(lba_status(&mut s, lba).await, (2, 0));
        assert_eq!(lba_status(&mut s, lba + 2).await, (4, 1), "unmapped");
        assert_eq!(lba_status(&mut s, lba + 6).await, (2, 0));
        assert_eq!(s.read16(0, lba + 2, 4, 4096).await.expect("read"), vec![0; 4 * 4096], "LBPRZ");
        s.logout().await.expect("logout");
    }));
}

#[test]
fn a_write_whose_data_ends_inside_a_block_writes_nothing_and_says_so() {
    let d = Daemon::start("partial");
    block_on(bounded(30, async {
        let mut s = login(d.addr, opts(PLAIN)).await;
        let lba = 100;
        s.write16(0, lba, 512, pattern(1024, 1)).await.expect("first write");
        // The CDB asks for two blocks; the initiator sends a block and a half.
        let r = s.scsi(0, &cdb::write16(lba, 2), vec![0xEE; 768], 0).await.expect("a response");
        assert_eq!(r.status, 0x02, "CHECK CONDITION");
        let sense = r.sense_code().expect("sense data");
        assert_eq!((sense.key, sense.asc, sense.ascq), (0x05, 0x0E, 0x03), "INVALID FIELD IN COMMAND IU");
        assert_eq!(r.residual, Some(Residual::Overflow(256)), "the overflow is still reported");
        assert_eq!(s.read16(0, lba, 2, 512).await.expect("read back"), pattern(1024, 1), "nothing was written");
        // A whole block of the two is written, GOOD with the overflow.
        let r = s.scsi(0, &cdb::write16(lba, 2), vec![0xEE; 512], 0).await.expect("a response");
        assert_eq!((r.status, r.residual), (0x00, Some(Residual::Overflow(512))));
        let mut want = vec![0xEE; 512];
        want.extend_from_slice(&pattern(1024, 1)[512..]);
        assert_eq!(s.read16(0, lba, 2, 512).await.expect("read back"), want);
        s.logout().await.expect("logout");
    }));
}

#[test]
fn several_sessions_do_pipelined_io_at_once() {
    const SESSIONS: u64 = 4;
    const DEPTH: u64 = 16;
    let d = Daemon::start("sessions");
    let addr = d.addr;
    block_on(bounded(60, async move {
        let mut sessions = Vec::new();
        for _ in 0..SESSIONS {
            sessions.push(login(addr, opts(PLAIN)).await);
        }
        let mut tasks = Vec::new();
        for (i, mut s) in sessions.into_iter().enumerate() {
            tasks.push(reactor::spawn(async move {
                // Each session owns 1/SESSIONS of the LUN.
                let base = i as u64 * (PLAIN_BLOCKS / SESSIONS);
                for round in 0..3u64 {
                    let mut writes = Vec::new();
                    for k in 0..DEPTH {
                        let blocks = 1 + (k % 4) * 31; // 512 B to 47 KiB
                        let lba = base + k * 128;
                        let data = pattern(blocks as usize * 512, (i as u8) << 4 | round as u8);
                        let itt = s.submit(0, &cdb::write16(lba, blocks as u32), data.clone(), 0).expect("submit");
                        writes.push((itt, lba, data));
                    }
                    for _ in 0..DEPTH {
                        let (_, r) = s.next_completion().await.unwrap_or_else(|e| panic!("session {i}: {e}"));
                        assert!(r.is_good(), "session {i}: write status {:#x}", r.status);
                    }
                    let mut reads = std::collections::HashMap::new();
                    for (_, lba, data) in &writes {
                        let blocks = (data.len() / 512) as u32;
                        let itt = s.submit(0, &cdb::read16(*lba, blocks), Vec::new(), blocks * 512).expect("submit");
                        reads.insert(itt, data.clone());
                    }
                    assert_eq!(s.outstanding(), DEPTH as usize);
                    for _ in 0..DEPTH {
                        let (itt, r) = s.next_completion().await.unwrap_or_else(|e| panic!("session {i}: {e}"));
                        let want = reads.remove(&itt).expect("a read we submitted");
                        assert!(r.is_good() && r.data == want, "session {i} round {round}: read back differs");
                    }
                }
                s.logout().await.unwrap_or_else(|e| panic!("session {i}: logout: {e}"));
            }));
        }
        for t in tasks {
            t.await;
        }
    }));
}

#[test]
fn commands_beyond_the_cmd_sn_window_wait_for_it_and_all_complete() {
    const COMMANDS: u32 = 400;
    let d = Daemon::start("window");
    block_on(bounded(60, async {
        let mut s = login(d.addr, opts(PLAIN)).await;
        s.write16(0, 0, 512, pattern(8 * 512, 0x33)).await.expect("write");
        let (cmd_sn, _, _, max_cmd_sn) = s.connection().sequence();
        let window = max_cmd_sn.wrapping_sub(cmd_sn).wrapping_add(1);
        assert!(window > 1 && window < COMMANDS, "window of {window} commands");
        let mut itts = std::collections::HashSet::new();
        for k in 0..COMMANDS {
            itts.insert(s.submit(0, &cdb::read16(u64::from(k % 8), 1), Vec::new(), 512).expect("submit"));
        }
        assert_eq!(s.connection().queued(), (COMMANDS - window) as usize, "the rest waits for the window");
        for _ in 0..COMMANDS {
            let (itt, r) = s.next_completion().await.expect("completion");
            assert!(itts.remove(&itt), "completion of a command we submitted, once");
            assert!(r.is_good());
        }
        assert_eq!(s.connection().queued(), 0);
        let mut want = pattern(8 * 512, 0x33);
        want.truncate(512);
        assert_eq!(s.read16(0, 0, 1, 512).await.expect("read"), want);
        s.logout().await.expect("logout");
    }));
}

// ---- bad input with a bystander ----

/// Session A writing and reading 64 KiB at a time until told to stop.
struct Bystander {
    stop: Rc<Cell<bool>>,
    rounds: Rc<Cell<u64>>,
    task: reactor::JoinHandle<Session>,
}

/// The bystander uses the upper half of the plain LUN.
const BYSTANDER_LBA: u64 = PLAIN_BLOCKS / 2;

fn bystander(mut s: Session) -> Bystander {
    let stop = Rc::new(Cell::new(false));
    let rounds = Rc::new(Cell::new(0u64));
    let (st, n) = (stop.clone(), rounds.clone());
    let task = reactor::spawn(async move {
        while !st.get() {
            let r = n.get();
            let lba = BYSTANDER_LBA + (r % 8) * 256;
            let data = pattern(64 << 10, r as u8);
            s.write16(0, lba, 512, data.clone()).await.unwrap_or_else(|e| panic!("bystander write {r}: {e}"));
            let got = s.read16(0, lba, 128, 512).await.unwrap_or_else(|e| panic!("bystander read {r}: {e}"));
            assert!(got == data, "bystander round {r} read back different");
            n.set(r + 1);
        }
        s
    });
    Bystander { stop, rounds, task }
}

impl Bystander {
    /// Waits for a few more rounds, stops the bystander, checks it once more
    /// and logs it out.
    async fn finish(self) {
        let seen = self.rounds.get();
        while self.rounds.get() < seen + 2 {
            reactor::sleep(Duration::from_millis(5)).await;
        }
        self.stop.set(true);
        let mut s = self.task.await;
        write_read_verify(&mut s, 512, BYSTANDER_LBA + 4096, 0x77).await;
        s.logout().await.expect("bystander logout");
    }
}

/// Runs `bad` on connection B while session A does I/O, then checks that A
/// still works and the daemon serves new logins. Returns the daemon's log.
fn with_bystander<F, Fut>(tag: &str, b_opts: LoginOptions, bad: F) -> String
where
    F: FnOnce(Session) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut d = Daemon::start(tag);
    let addr = d.addr;
    block_on(bounded(60, async move {
        let a = bystander(login(addr, opts(PLAIN)).await);
        let b = login(addr, b_opts).await;
        bad(b).await;
        a.finish().await;
        let s = login(addr, opts(PLAIN)).await;
        s.logout().await.expect("logout of a fresh session");
    }));
    d.assert_alive();
    d.log()
}

#[test]
fn unknown_opcode_gets_reject_0x05_and_the_connection_stays_usable() {
    let log = with_bystander("bad-opcode", opts(PLAIN), |mut b| async move {
        let mut bhs = Bhs::new(Opcode(0x1c));
        bhs.set_immediate(true).set_flags(flags::FINAL).set_itt(0xdead);
        b.send_raw(&bhs, &[], &[]).await.expect("send");
        match b.next_event().await.expect("an answer") {
            HostEvent::Reject { reason, bhs: Some(echoed) } => {
                assert_eq!(reason, RejectReason::COMMAND_NOT_SUPPORTED);
                assert_eq!((echoed.opcode(), echoed.itt()), (Opcode(0x1c), 0xdead), "the BHS is echoed");
            }
            other => panic!("expected a Reject, got {other:?}"),
        }
        assert_eq!(b.ping(b"still there").await.expect("ping"), b"still there");
        write_read_verify(&mut b, 512, 0, 0x11).await;
        b.logout().await.expect("logout");
    });
    assert!(log.contains("opcode 0x1c not supported"), "the reason is logged:\n{log}");
}

#[test]
fn data_segment_beyond_max_recv_data_segment_length_gets_reject_and_close() {
    let log = with_bystander("bad-length", opts(PLAIN), |mut b| async move {
        let limit = b.params().peer_max_recv_data_segment_length;
        let mut bhs = Bhs::new(Opcode::NOP_OUT);
        bhs.set_immediate(true).set_flags(flags::FINAL).set_itt(0xbeef).set_ttt(RESERVED_TAG);
        // The header alone: the target must refuse on the length field
        // without waiting for the data (nothing is left unread behind it).
        bhs.set_data_segment_length(limit + 4);
        b.send_bytes(&bhs.0).await.expect("send");
        let events = b.wait_closed().await.expect("the target closes");
        match events.as_slice() {
            [HostEvent::Reject { reason, bhs: Some(echoed) }] => {
                assert_eq!(*reason, RejectReason::PROTOCOL_ERROR);
                assert_eq!(echoed.itt(), 0xbeef);
            }
            other => panic!("expected one Reject before the close, got {other:?}"),
        }
    });
    assert!(log.contains("DataSegmentLength"), "the field is logged:\n{log}");
}

#[test]
fn header_digest_error_closes_the_connection_without_a_reject() {
    let o = LoginOptions { header_digest: true, data_digest: true, ..opts(PLAIN) };
    let log = with_bystander("bad-digest", o, |mut b| async move {
        assert!(b.params().header_digest);
        let mut bhs = Bhs::new(Opcode::NOP_OUT);
        bhs.set_immediate(true).set_flags(flags::FINAL).set_itt(0x77).set_ttt(RESERVED_TAG);
        let (cmd_sn, exp_stat_sn, _, _) = b.connection().sequence();
        bhs.set_cmd_sn(cmd_sn).set_exp_stat_sn(exp_stat_sn);
        let mut bytes = Vec::new();
        pdu::encode(&mut bytes, &bhs, &[], b"ping", b.connection().tx_framing());
        bytes[pdu::BHS_LEN] ^= 0x01; // first byte of the header digest
        b.send_bytes(&bytes).await.expect("send");
        let events = b.wait_closed().await.expect("the target closes");
        assert!(events.is_empty(), "nothing may answer a PDU whose header cannot be trusted: {events:?}");
    });
    assert!(log.contains("HeaderDigest"), "the field is logged:\n{log}");
}

#[test]
fn cmd_sn_outside_the_window_is_dropped_without_a_response() {
    let _ = with_bystander("bad-cmdsn", opts(PLAIN), |mut b| async move {
        // A ping shows what one answered PDU does to the sequence numbers.
        let before = b.connection().sequence();
        b.ping(b"one").await.expect("ping");
        let after_ping = b.connection().sequence();
        let (cmd_sn, exp_stat_sn, _, max_cmd_sn) = after_ping;
        assert_eq!(after_ping.2, cmd_sn, "ExpCmdSN is our next CmdSN");

        let mut c = Bhs::new(Opcode::SCSI_CMD);
        c.set_flags(flags::FINAL | flags::READ | 1)
            .set_lun(0)
            .set_itt(0x5151)
            .set_expected_data_transfer_length(512)
            .set_cmd_sn(max_cmd_sn.wrapping_add(1000))
            .set_exp_stat_sn(exp_stat_sn)
            .set_cdb(&cdb::read16(0, 1));
        b.send_raw(&c, &[], &[]).await.expect("send");
        // The target handles PDUs in order: once the ping after it is
        // answered, the dropped command would have been answered too.
        b.ping(b"two").await.expect("ping after the dropped command");
        let after = b.connection().sequence();
        assert_eq!(
            after.1.wrapping_sub(after_ping.1),
            after_ping.1.wrapping_sub(before.1),
            "only the ping's answer used a StatSN"
        );
        assert_eq!(after.2, cmd_sn, "ExpCmdSN did not move past the dropped command");
        // The connection still carries commands with the right CmdSN.
        write_read_verify(&mut b, 512, 0, 0x22).await;
        b.logout().await.expect("logout");
    });
}

#[test]
fn a_lun_reset_leaves_a_unit_attention_that_other_sessions_clear_before_io() {
    let d = Daemon::start("unit-attention");
    block_on(bounded(30, async {
        let mut a = login(d.addr, opts(PLAIN)).await;
        let mut b = login(d.addr, opts(PLAIN)).await;
        assert_eq!(b.clear_unit_attentions(0).await.expect("nothing pending"), 0);
        // LOGICAL UNIT RESET from session A.
        let itt = a.connection_mut().task_mgmt(5, 0, 0xffff_ffff);
        a.flush().await.expect("send the reset");
        loop {
            match a.next_event().await.expect("an answer to the reset") {
                HostEvent::TaskMgmt { itt: i, response } if i == itt => {
                    assert_eq!(response, 0, "function complete");
                    break;
                }
                _ => {}
            }
        }
        // B meets the reset's unit attention once, then I/O runs.
        assert_eq!(b.clear_unit_attentions(0).await.expect("cleared"), 1);
        write_read_verify(&mut b, 512, 0, 9).await;
    }));
}
