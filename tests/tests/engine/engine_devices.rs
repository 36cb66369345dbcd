//! The transfer engine with dma-buf and host segments on several devices: the testbed's
//! one rxe device opened twice per agent (two contexts, two protection domains). Needs the
//! testbed VM.

use gpu_rdma_engine::{Agent, Batch, EntryStatus, Memory, Settings};
use integration_tests::engine::{bytes, host};
use integration_tests::exporters::Exporter;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::pattern;
use std::time::Duration;

const BLOCK: u64 = 64 << 10;
const BLOCKS: u64 = 64;
const WAIT: Duration = Duration::from_secs(120);

fn agent(tb: &Testbed, name: &str) -> Agent {
    let settings = Settings {
        devices: Some(vec![tb.device.clone(), tb.device.clone()]),
        bind: "127.0.0.1:0".parse().unwrap(),
        chunk_size: BLOCK,
        ..Settings::default()
    };
    Agent::new(name, settings).expect("agent on the device opened twice")
}

#[test]
#[ignore = "needs the testbed VM"]
fn dmabuf_and_host_segments_on_two_devices_scattered_blocks_written_and_read_back_through_both() {
    let tb = Testbed::get();
    let (a, b) = (agent(&tb, "a"), agent(&tb, "b"));
    a.add_peer("b", b.address());
    b.add_peer("a", a.address());
    assert_eq!(a.devices().len(), 2);

    let len = BLOCKS * BLOCK;
    let src = pattern(len as usize, 3);
    let mut d = Exporter::Udmabuf.allocate(len);
    Exporter::fill(&mut d, 0, &src);
    let desc = a.register("src", d).unwrap();
    a.register("back", Exporter::Udmabuf.allocate(len)).unwrap();
    let dst = b.register("dst", Exporter::Udmabuf.allocate(len)).unwrap();
    for desc in [&desc, &dst] {
        let r = &desc.regions;
        assert_eq!(r.len(), 2, "{}: a region per device", desc.name);
        assert_eq!((r[0].device, r[1].device), (0, 1));
        assert_ne!(r[0].rkey, r[1].rkey, "{}: one region per device", desc.name);
    }
    // Host memory is on every device too, at one address.
    let h = a.register("host", host(&src, len as usize)).unwrap();
    let hdst = b.register("hdst", host(&[], len as usize)).unwrap();
    a.register("hback", host(&[], len as usize)).unwrap();
    for desc in [&h, &hdst] {
        let r = &desc.regions;
        assert_eq!(r.len(), 2, "{}: a region per device", desc.name);
        assert_eq!((r[0].device, r[1].device), (0, 1));
        assert_eq!(r[0].addr, r[1].addr, "{}: the buffer's address", desc.name);
        assert_ne!(r[0].rkey, r[1].rkey, "{}: one region per device", desc.name);
    }

    // One-block entries (one chunk each), so consecutive chunks alternate devices.
    let slot = |j: u64| ((j * 37) % BLOCKS) * BLOCK;
    let from = |j: u64| ((j * 11) % BLOCKS) * BLOCK;
    let mut write = Batch::new();
    for j in 0..BLOCKS {
        write = write.write("src", from(j), "b", "dst", slot(j), BLOCK);
    }
    let t = a.transfer(&write).expect("accepted");
    t.wait(WAIT).expect("written");
    assert!(t.status().iter().all(|s| *s == EntryStatus::Done));
    let mut read = Batch::new();
    for j in 0..BLOCKS {
        read = read.read("back", j * BLOCK, "b", "dst", slot(j), BLOCK);
    }
    let t = a.transfer(&read).expect("accepted");
    t.wait(WAIT).expect("read back");
    assert!(t.status().iter().all(|s| *s == EntryStatus::Done));
    // Host to host, scattered over both devices, and back; then a host block to the
    // dma-buf segment.
    let mut write = Batch::new();
    let mut read = Batch::new();
    for j in 0..BLOCKS {
        write = write.write("host", from(j), "b", "hdst", slot(j), BLOCK);
        read = read.read("hback", j * BLOCK, "b", "hdst", slot(j), BLOCK);
    }
    a.transfer(&write)
        .unwrap()
        .wait(WAIT)
        .expect("host written");
    a.transfer(&read)
        .unwrap()
        .wait(WAIT)
        .expect("host read back");
    let t = a
        .transfer(&Batch::new().write("host", 0, "b", "dst", 0, BLOCK))
        .expect("accepted");
    t.wait(WAIT).expect("host block written");

    let back = a.unregister("back").unwrap();
    assert!(matches!(back, Memory::DmaBuf(_)), "the dma-buf handed back");
    let back = bytes(back);
    let dst = b.unregister("dst").unwrap();
    assert!(matches!(dst, Memory::DmaBuf(_)), "the dma-buf handed back");
    let dst = bytes(dst);
    for j in 0..BLOCKS {
        let want = &src[from(j) as usize..(from(j) + BLOCK) as usize];
        let at = (j * BLOCK) as usize..((j + 1) * BLOCK) as usize;
        assert!(back[at] == *want, "block {j} read back differs");
        let at = slot(j) as usize..(slot(j) + BLOCK) as usize;
        let want = if slot(j) == 0 {
            &src[..BLOCK as usize]
        } else {
            want
        };
        assert!(dst[at] == *want, "block {j} differs at b");
    }
    let hback = a.unregister("hback").unwrap();
    assert!(
        matches!(hback, Memory::Host(_)),
        "the host buffer handed back"
    );
    let hback = bytes(hback);
    for j in 0..BLOCKS {
        let want = &src[from(j) as usize..(from(j) + BLOCK) as usize];
        let at = (j * BLOCK) as usize..((j + 1) * BLOCK) as usize;
        assert!(hback[at] == *want, "host block {j} read back differs");
    }
    assert_eq!(bytes(a.unregister("src").unwrap()), src);
    assert_eq!(bytes(a.unregister("host").unwrap()), src);
}
