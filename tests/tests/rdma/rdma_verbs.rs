//! rdma-dmabuf against the real kernel: two RC queue pairs on the testbed's rxe device (over
//! its loopback, and across the two-node wire), moving host regions with ownership-based
//! posts. Runs in the testbed VM.

use integration_tests::oob;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{connect_pair, host_region, loopback_pair, pattern, pd};
use rdma_dmabuf::{
    supports_dmabuf, Access, Context, Endpoint, Error, Local, MemoryRegion, QueuePairBuilder,
    RemoteRegion, WorkKind,
};
use std::time::Duration;

const SIZES: [usize; 6] = [1, 4095, 4096, 65536, 1 << 20, 8 << 20];
const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

#[test]
#[ignore = "needs the testbed VM"]
fn device_port_and_gid_are_found() {
    let tb = Testbed::get();
    let devs = rdma_dmabuf::devices().unwrap();
    assert!(devs.iter().any(|d| d.name == tb.device), "{devs:?}");
    let ctx = Context::open(&tb.device).unwrap();
    let port = ctx.query_port(1).unwrap();
    assert_eq!(port.state, rdma_dmabuf::PortState::Active);
    let (index, gid) = ctx.roce_v2_ipv4_gid(1).unwrap();
    assert_eq!(
        index, tb.gid_index,
        "the crate picks the GID the harness picked"
    );
    assert_eq!(gid.ipv4().unwrap().to_string(), tb.local_addr);
}

#[test]
#[ignore = "needs the testbed VM"]
fn send_and_receive_are_byte_exact_from_1_byte_to_8_mib() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = loopback_pair(&pd);
    for (i, &size) in SIZES.iter().enumerate() {
        let data = pattern(size, i as u8);
        let src = host_region(&pd, &data, size, Access::empty());
        let dst = host_region(&pd, &[], size, Access::LOCAL_WRITE);
        let recv = b.post_recv(dst).expect("post recv");
        let send = a
            .post_send(Local::new(src, 0..size as u64), None)
            .expect("post send");
        let sent = send.spin().expect("send completes");
        assert_eq!(sent.wc.kind, WorkKind::Send);
        let got = recv.spin().expect("recv completes");
        assert_eq!(got.wc.byte_len as usize, size);
        assert_eq!(
            &got.region.bytes().unwrap()[..size],
            &data[..],
            "size {size}"
        );
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn rdma_write_then_read_back_are_byte_exact() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, _b) = loopback_pair(&pd);
    for (i, &size) in SIZES.iter().enumerate() {
        let target = host_region(&pd, &[], size, RW);
        let remote = target.remote().expect("remote access granted");
        let data = pattern(size, 40 + i as u8);
        let src = host_region(&pd, &data, size, Access::empty());
        a.post_write(Local::new(src, 0..size as u64), remote, None)
            .unwrap()
            .spin()
            .expect("write");
        // Read it back into a third region.
        let back = host_region(&pd, &[], size, Access::LOCAL_WRITE);
        let read = a
            .post_read(Local::new(back, 0..size as u64), remote)
            .unwrap()
            .spin()
            .expect("read");
        assert_eq!(read.wc.kind, WorkKind::Read);
        assert_eq!(
            &read.region.bytes().unwrap()[..size],
            &data[..],
            "read back, size {size}"
        );
        // The target, deregistered, holds the written bytes.
        let host = target.into_inner().expect("deregister");
        assert_eq!(&host.as_slice()[..size], &data[..], "written, size {size}");
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn write_with_immediate_consumes_a_receive_and_delivers_the_immediate() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = loopback_pair(&pd);
    let target = host_region(&pd, &[], 4096, RW);
    let remote = target.remote().unwrap();
    let note = host_region(&pd, &[], 4096, Access::LOCAL_WRITE);
    let recv = b.post_recv(note).unwrap();
    let data = pattern(3000, 9);
    let src = host_region(&pd, &data, 4096, Access::empty());
    let sent = a
        .post_write(Local::new(src, 0..3000), remote, Some(0xfeed_beef))
        .unwrap()
        .spin()
        .unwrap();
    // The writer's own completion carries no immediate, and its length is the one posted
    // (the verbs define neither there: the poll reads them only of a received message).
    assert_eq!((sent.wc.imm, sent.wc.byte_len), (None, 3000));
    let got = recv.spin().expect("the receive completes");
    assert_eq!(got.wc.imm, Some(0xfeed_beef));
    assert_eq!(got.wc.byte_len, 3000);
    assert_eq!(&target.into_inner().unwrap().as_slice()[..3000], &data[..]);
}

#[test]
#[ignore = "needs the testbed VM"]
fn device_memory_on_rxe_is_a_typed_unsupported() {
    let tb = Testbed::get();
    let ctx = Context::open(&tb.device).unwrap();
    let err = rdma_dmabuf::DeviceMemory::allocate(&ctx, 4096, 0).unwrap_err();
    assert!(err.is_unsupported(), "{err}");
    assert!(
        err.to_string().contains("mlx5"),
        "says where it exists: {err}"
    );
}

#[test]
#[ignore = "needs the testbed VM"]
fn bad_input_gives_typed_errors() {
    let tb = Testbed::get();
    // Unknown device.
    let err = Context::open("no_such_dev").unwrap_err();
    assert_eq!(err.errno(), Some(libc::ENODEV), "{err}");
    assert!(
        err.to_string().contains(&tb.device),
        "lists the devices: {err}"
    );

    let pd = pd(&tb);
    // Wrong GID index: past the table.
    let err = QueuePairBuilder::new(&pd)
        .gid_index(100_000)
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::GidIndex { .. }), "{err}");

    // Remote write without local write is refused at registration.
    let buf = rdma_dmabuf::HostBuffer::new(4096).unwrap();
    let err = MemoryRegion::register(&pd, buf, Access::REMOTE_WRITE).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    // Bits that are not this crate's flags (here IBV_ACCESS_ZERO_BASED and MW_BIND) are
    // refused by us, not passed to the kernel.
    for bits in [1 << 5, 1 << 4] {
        let buf = rdma_dmabuf::HostBuffer::new(4096).unwrap();
        let odd = Access::LOCAL_WRITE | Access::from_bits_retain(bits);
        let err = MemoryRegion::register(&pd, buf, odd).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
        assert!(err.to_string().contains("not flags"), "{err}");
    }

    let (a, b) = loopback_pair(&pd);
    // Receive into a region without LOCAL_WRITE; length 0; part past the end.
    let ro = host_region(&pd, &[], 4096, Access::empty());
    let e = b.post_recv(ro).unwrap_err();
    assert!(
        matches!(e.error, Error::InvalidArgument { .. }),
        "{}",
        e.error
    );
    let e = a.post_send(Local::new(e.region, 0..0), None).unwrap_err();
    assert!(e.error.to_string().contains("length 0"), "{}", e.error);
    let e = a
        .post_send(Local::new(e.region, 4000..4200), None)
        .unwrap_err();
    assert!(e.error.to_string().contains("outside"), "{}", e.error);

    // Remote key of another region: the NIC refuses and the completion is a typed error.
    let target = host_region(&pd, &[], 4096, RW);
    let other = host_region(&pd, &[], 4096, RW);
    let wrong = RemoteRegion {
        rkey: other.remote().unwrap().rkey ^ 0x5a5a_0000,
        ..target.remote().unwrap()
    };
    let src = host_region(&pd, &[1; 16], 4096, Access::empty());
    let err = a
        .post_write(Local::new(src, 0..16), wrong, None)
        .unwrap()
        .spin()
        .unwrap_err();
    match &err.error {
        Error::Completion {
            kind: WorkKind::Write,
            status_text,
            ..
        } => {
            assert!(
                status_text.to_lowercase().contains("remote"),
                "{status_text}"
            )
        }
        other => panic!("expected a completion error, got {other}"),
    }
    // The failed write moved the queue pair to the error state: it takes no more requests
    // (rxe would queue a receive and never complete it).
    assert!(a.is_in_error());
    let e = a
        .post_recv(host_region(&pd, &[], 4096, Access::LOCAL_WRITE))
        .unwrap_err();
    assert!(
        matches!(e.error, Error::InvalidArgument { .. }),
        "{}",
        e.error
    );
    assert!(e.error.to_string().contains("error state"), "{}", e.error);
    assert_eq!(a.outstanding(), 0);

    // Malformed endpoint bytes from a peer.
    let bytes = a.endpoint().to_bytes();
    assert!(Endpoint::from_bytes(&bytes[..bytes.len() - 3]).is_err());
}

#[test]
#[ignore = "needs the testbed VM"]
fn hand_built_wrapping_remote_regions_are_refused_before_the_nic() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = connect_pair(
        QueuePairBuilder::new(&pd).max_inline_data(64),
        QueuePairBuilder::new(&pd).max_inline_data(64),
    );
    let target = host_region(&pd, &[], 4096, RW);
    let good = target.remote().unwrap();
    // Its fields are public: a range that wraps past the end of the address space, with the
    // target's real rkey so that only our check stands between it and the NIC.
    let wrapping = RemoteRegion {
        addr: u64::MAX - 7,
        len: 4096,
        rkey: good.rkey,
    };
    let wraps =
        |e: &Error| matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("wraps");
    let src = host_region(&pd, &[3; 16], 4096, RW);
    let e = a
        .post_write(Local::new(src, 0..16), wrapping, None)
        .unwrap_err();
    assert!(wraps(&e.error), "{}", e.error);
    let e = a
        .post_read(Local::new(e.region, 0..16), wrapping)
        .unwrap_err();
    assert!(wraps(&e.error), "{}", e.error);
    let e = a
        .post_atomic(
            Local::new(e.region, 0..8),
            RemoteRegion {
                addr: u64::MAX - 7,
                ..wrapping
            },
            rdma_dmabuf::AtomicOp::FetchAdd { add: 1 },
        )
        .unwrap_err();
    assert!(wraps(&e.error), "{}", e.error);
    let err = a.post_write_inline(&[1; 8], wrapping, None).unwrap_err();
    assert!(wraps(&err), "{err}");
    // Nothing reached the NIC: no request outstanding, the queue pair still healthy, and a
    // write to the real region works afterwards.
    assert_eq!(a.outstanding(), 0);
    assert!(!a.is_in_error() && !b.is_in_error());
    let done = a
        .post_write(Local::new(e.region, 0..16), good, None)
        .unwrap()
        .spin()
        .expect("the queue pair took no harm");
    drop(done);
}

#[test]
#[ignore = "needs the testbed VM"]
fn posting_past_the_queue_depth_is_back_pressure() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let q = QueuePairBuilder::new(&pd).recv_depth(4).build().unwrap();
    let peer = QueuePairBuilder::new(&pd).build().unwrap();
    let (eq, ep) = (q.endpoint(), peer.endpoint());
    let q = q.connect(&ep).unwrap();
    let _peer = peer.connect(&eq).unwrap();
    let mut pending = Vec::new();
    for _ in 0..4 {
        pending.push(
            q.post_recv(host_region(&pd, &[], 4096, Access::LOCAL_WRITE))
                .unwrap(),
        );
    }
    let e = q
        .post_recv(host_region(&pd, &[], 4096, Access::LOCAL_WRITE))
        .unwrap_err();
    assert!(
        matches!(e.error, Error::QueueFull { depth: 4, .. }),
        "{}",
        e.error
    );
    assert_eq!(q.outstanding(), 4);
}

#[test]
#[ignore = "needs the testbed VM"]
fn blocking_wait_sleeps_on_the_completion_channel_until_the_message_comes() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = connect_pair(
        QueuePairBuilder::new(&pd),
        QueuePairBuilder::new(&pd).completion_channel(true),
    );

    // Nothing comes: the wait ends at its timeout with the handle back.
    let recv = b
        .post_recv(host_region(&pd, &[], 4096, Access::LOCAL_WRITE))
        .unwrap();
    let t = std::time::Instant::now();
    let recv = recv
        .wait(Duration::from_millis(300))
        .expect_err("nothing sent yet");
    assert!(t.elapsed() >= Duration::from_millis(300));

    // A sender on another thread, a little later.
    let pd2 = pd.clone();
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let src = host_region(&pd2, b"wake up", 4096, Access::empty());
        a.post_send(Local::new(src, 0..7), None)
            .unwrap()
            .spin()
            .unwrap();
    });
    let got = recv
        .wait(Duration::from_secs(30))
        .expect("woken by the completion")
        .expect("ok");
    assert_eq!(&got.region.bytes().unwrap()[..7], b"wake up");
    sender.join().unwrap();
}

/// Tests of the two-node testbed: `cargo xtask test` runs this module on both nodes.
mod two_node {
    use super::*;

    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_rdma_write_and_send_across_the_wire() {
        let tb = Testbed::get();
        let pd = pd(&tb);
        let qp = QueuePairBuilder::new(&pd).build().unwrap();
        const SIZE: usize = 64 << 20;
        if tb.is_server() {
            let target = host_region(&pd, &[], SIZE, RW);
            let mine = [
                qp.endpoint().to_bytes().as_slice(),
                &target.remote().unwrap().to_bytes(),
            ]
            .concat();
            let theirs = oob::serve(&tb.local_addr, 18600, &mine);
            let qp = qp.connect(&Endpoint::from_bytes(&theirs).unwrap()).unwrap();
            // The peer writes, then sends a note with the immediate: wait for the note.
            let note = qp
                .post_recv(host_region(&pd, &[], 4096, Access::LOCAL_WRITE))
                .unwrap();
            let got = note
                .spin_timeout(Duration::from_secs(120))
                .expect("note arrives")
                .expect("ok");
            assert_eq!(got.wc.imm, Some(SIZE as u32));
            let host = target.into_inner().unwrap();
            assert_eq!(&host.as_slice()[..SIZE], &pattern(SIZE, 77)[..]);
        } else {
            let theirs = oob::connect(&tb.peer_addr, 18600, &qp.endpoint().to_bytes());
            let (ep, rr) = theirs.split_at(Endpoint::WIRE_LEN);
            let qp = qp.connect(&Endpoint::from_bytes(ep).unwrap()).unwrap();
            let remote = RemoteRegion::from_bytes(rr).unwrap();
            let src = host_region(&pd, &pattern(SIZE, 77), SIZE, Access::empty());
            let done = qp
                .post_write(src, remote, None)
                .unwrap()
                .spin()
                .expect("write across");
            let note = host_region(&pd, b"done", 4096, Access::empty());
            drop(done);
            qp.post_send(Local::new(note, 0..4), Some(SIZE as u32))
                .unwrap()
                .spin()
                .expect("note");
        }
    }
}

/// Tests of Debian's stock (unpatched) rxe: `cargo xtask test` runs this module there.
mod stock_only {
    use super::*;

    #[test]
    #[ignore = "needs the testbed VM"]
    fn stock_only_rxe_has_no_dmabuf_regions_and_says_so() {
        let tb = Testbed::get();
        let pd = pd(&tb);
        assert!(
            !supports_dmabuf(&pd).unwrap(),
            "stock rxe does not support dma-buf MRs"
        );
        let u = drm_export::Udmabuf::new(1 << 20).unwrap();
        let (_memfd, dmabuf) = u.into_parts();
        let err = MemoryRegion::register_dmabuf(&pd, dmabuf, 0, 1 << 20, None, RW).unwrap_err();
        assert!(err.is_unsupported(), "{err}");
        assert_eq!(err.errno(), Some(libc::EOPNOTSUPP));
        assert!(err.to_string().contains("kernel-patches"), "{err}");
    }
}
