//! A read-only device (`read_only = true`) exported over NVMe/TCP and
//! iSCSI from one daemon: hosts are told (Identify Namespace NSATTR bit 0,
//! MODE SENSE WP), read what the file holds, and every write is refused
//! (NVMe Namespace Is Write Protected with DNR; SCSI DATA PROTECT / WRITE
//! PROTECTED) with the file unchanged, while a writable device of the same
//! daemon takes writes. Our initiator's hosts, real sockets on loopback.

mod common;

use common::{block_on, bounded, toml, Daemon};
use initiator::iscsi::{cdb, LoginOptions, Session};
use initiator::{Controller, Options, Status};

const NQN: &str = "nqn.2026-11.io.ironwire.test:ro";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:ro-host";
const IQN: &str = "iqn.2026-11.io.ironwire.test:ro";
const INITIATOR: &str = "iqn.2026-11.io.ironwire.test:ro-host";
const BS: usize = 512;
const SIZE: usize = 1 << 20;

fn golden() -> Vec<u8> {
    (0..SIZE).map(|i| (i % 253) as u8 ^ (i >> 9) as u8).collect()
}

#[test]
fn a_read_only_device_is_read_and_never_written_over_nvme_and_iscsi() {
    let iscsi_port = std::net::TcpListener::bind("127.0.0.1:0").expect("probe").local_addr().expect("addr").port();
    let d = Daemon::start_with("read-only", |dir, port| {
        let path = dir.join("golden.img");
        std::fs::write(&path, golden()).expect("write the golden image");
        format!(
            "[[device]]\nname = \"golden\"\nkind = \"file\"\npath = \"{}\"\nread_only = true\n\n{}\
             [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n\
             [[subsystem.namespace]]\nnsid = 1\ndevice = \"golden\"\n\
             [[subsystem.namespace]]\nnsid = 2\ndevice = \"scratch\"\n\n{}\
             [[port]]\naddress = \"127.0.0.1:{port}\"\n\n{}[reactor]\ncores = [0]\n",
            path.display(),
            toml::ram("scratch", 0, 0),
            toml::iscsi_target(IQN, &["golden", "scratch"]),
            toml::iscsi_port(iscsi_port),
        )
    });
    let file = d.dir.join("golden.img");
    let shown = d.ctl("show").expect("show");
    assert!(shown.contains("device golden file") && shown.contains("read-only"), "{shown}");
    let addr = d.addr;
    let iscsi = std::net::SocketAddr::from(([127, 0, 0, 1], iscsi_port));
    block_on(bounded(60, async {
        let opts = Options { io_queues: 1, queue_size: 16, ..Options::default() };
        let mut c = Controller::connect(addr, NQN, HOST, opts).await.expect("connect");
        let ns = c.identify_namespace(1).await.expect("identify namespace 1");
        assert_eq!(ns.size_bytes(), SIZE as u64, "the file's length is the size");
        assert_eq!(ns.raw[99] & 1, 1, "NSATTR: write protected");
        assert_eq!(c.identify_namespace(2).await.expect("identify namespace 2").raw[99] & 1, 0, "writable");
        assert!(c.read(0, 1, 8, 16).await.expect("read") == golden()[8 * BS..24 * BS], "reads the file");
        let protected = |e: initiator::Error| {
            let s = e.status().unwrap_or_else(|| panic!("an NVMe status, got {e}"));
            assert_eq!(s.0 & 0x7ff, Status::NS_WRITE_PROTECTED.0, "{e}");
            assert_ne!(s.0 & Status::DNR_BIT, 0, "DNR: {e}");
        };
        protected(c.write(0, 1, 0, vec![0xee; 4096]).await.expect_err("write"));
        protected(c.write_zeroes(0, 1, 0, 8).await.expect_err("write zeroes"));
        protected(c.deallocate(0, 1, &[(0, 64)]).await.expect_err("deallocate"));
        c.flush(0, 1).await.expect("flush of a read-only namespace");
        c.write(0, 2, 0, vec![0x5a; 4096]).await.expect("the writable namespace takes writes");

        let mut s = Session::connect(iscsi, LoginOptions::new(INITIATOR, Some(IQN))).await.expect("login");
        s.clear_unit_attentions(0).await.expect("TEST UNIT READY");
        let sense6 = [0x1A, 0x08, 0x3F, 0, 255, 0];
        let r = s.scsi(0, &sense6, Vec::new(), 255).await.expect("MODE SENSE (6)");
        assert!(r.is_good() && r.data[2] & 0x80 != 0, "WP on LUN 0: {:?}", r.data.get(..4));
        let r = s.scsi(1, &sense6, Vec::new(), 255).await.expect("MODE SENSE (6) LUN 1");
        assert!(r.is_good() && r.data[2] & 0x80 == 0, "no WP on LUN 1");
        assert!(s.read16(0, 100, 4, BS as u32).await.expect("READ (16)") == golden()[100 * BS..104 * BS]);
        let r = s.scsi(0, &cdb::write16(0, 1), vec![0xee; BS], 0).await.expect("WRITE (16) answered");
        let sense = r.sense_code().expect("sense for the write");
        assert_eq!((sense.key, sense.asc, sense.ascq), (0x07, 0x27, 0x00), "DATA PROTECT / WRITE PROTECTED");
        s.write16(1, 0, BS as u32, vec![0x6b; BS]).await.expect("the writable LUN takes writes");
        s.logout().await.expect("logout");
    }));
    assert!(std::fs::read(&file).expect("read the file") == golden(), "the read-only file is unchanged");
}
