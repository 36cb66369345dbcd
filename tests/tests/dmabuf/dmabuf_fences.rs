//! Fence-aware posts: a vgem fence stands for GPU work in flight on a buffer; a fenced post on
//! the buffer's dma-buf region waits for it (and times out with a typed error while it is
//! unsignalled), and the bytes move once it signals. Runs in the testbed VM (patched mode).

use drm_export::VgemFence;
use drm_export::{DmaBuf, DrmDevice, DumbBuffer};
use integration_tests::exporters::{vgem_card, Exporter};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{host_region, loopback_pair, pattern, pd};
use rdma_dmabuf::{Access, Error, FencedOp, MemoryRegion, WorkKind};
use rdma_dmabuf::{ProtectionDomain, QueuePair};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SIZE: u64 = 1 << 20;

/// Both tests' start: a loopback QP pair on the testbed's device, and a vgem buffer of `SIZE`
/// bytes exported as a dma-buf (with its card, for attaching fences).
fn loopback_and_vgem_buffer() -> (
    Arc<ProtectionDomain>,
    QueuePair,
    QueuePair,
    Arc<DrmDevice>,
    DumbBuffer,
    DmaBuf,
) {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (peer, owner) = loopback_pair(&pd);
    let card = vgem_card();
    let gem = DumbBuffer::new(&card, SIZE).unwrap();
    let buf = gem.export().unwrap();
    (pd, peer, owner, card, gem, buf)
}

#[test]
#[ignore = "needs the testbed VM"]
fn fenced_send_waits_for_the_gpu_write_fence_and_times_out_while_unsignalled() {
    let (pd, peer, owner, card, gem, mut buf) = loopback_and_vgem_buffer();
    let data = pattern(SIZE as usize, 3);
    Exporter::fill(&mut buf, 0, &data);
    let region = MemoryRegion::register_dmabuf(&pd, buf, 0, SIZE, None, Access::empty()).unwrap();

    // The "GPU" is still writing the buffer.
    let fence = VgemFence::attach(&card, gem.handle(), true).unwrap();
    let send = FencedOp::Send { imm: None };
    let e = owner
        .post_fenced(send, region, Duration::from_millis(200))
        .unwrap_err();
    assert!(
        matches!(
            e.error,
            Error::FenceTimeout {
                kind: WorkKind::Send,
                ..
            }
        ),
        "{}",
        e.error
    );
    assert_eq!(owner.outstanding(), 0, "nothing was posted");
    let region = e.region;

    // The write finishes 300 ms from now; the fenced send starts only then.
    let inbox = peer
        .post_recv(host_region(&pd, &[], SIZE as usize, Access::LOCAL_WRITE))
        .unwrap();
    let waited = std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            fence.signal().unwrap();
        });
        let t = Instant::now();
        let p = owner
            .post_fenced(send, region, Duration::from_secs(30))
            .expect("posted once signalled");
        let waited = t.elapsed();
        p.spin().expect("send completes");
        waited
    });
    assert!(
        waited >= Duration::from_millis(250),
        "the post waited for the fence ({waited:?})"
    );
    let got = inbox.spin().unwrap();
    assert!(
        got.region.bytes().unwrap()[..SIZE as usize] == data[..],
        "the bytes arrived"
    );
}

#[test]
#[ignore = "needs the testbed VM"]
fn fenced_receive_waits_for_gpu_readers_before_the_nic_writes() {
    let (pd, peer, owner, card, gem, buf) = loopback_and_vgem_buffer();
    let region =
        MemoryRegion::register_dmabuf(&pd, buf, 0, SIZE, None, Access::LOCAL_WRITE).unwrap();

    // The "GPU" is still reading the buffer: the NIC must not overwrite it yet.
    let fence = VgemFence::attach(&card, gem.handle(), false).unwrap();
    let e = owner
        .post_fenced(FencedOp::Recv, region, Duration::from_millis(200))
        .unwrap_err();
    assert!(
        matches!(
            e.error,
            Error::FenceTimeout {
                kind: WorkKind::Recv,
                ..
            }
        ),
        "{}",
        e.error
    );
    fence.signal().unwrap();
    let recv = owner
        .post_fenced(FencedOp::Recv, e.region, Duration::from_secs(30))
        .expect("posted");
    let data = pattern(4096, 8);
    let src = host_region(&pd, &data, 4096, Access::empty());
    peer.post_send(src, None).unwrap().spin().unwrap();
    let got = recv.spin().unwrap();
    assert_eq!(got.wc.byte_len, 4096);
    let seen = Exporter::read(&mut got.region.into_inner().unwrap());
    assert!(seen[..4096] == data[..]);
}

/// The awaited form (the `tokio` feature): the fenced send times out while the fence is
/// unsignalled (nothing posted, the region back), and once the "GPU" signals, 300 ms later
/// on the same runtime, the send posts and its awaited completion comes only after that.
#[test]
#[ignore = "needs the testbed VM"]
fn an_awaited_fenced_send_completes_only_after_the_vgem_fence_signals() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (peer, owner) = integration_tests::verbs::connect_pair(
        rdma_dmabuf::QueuePairBuilder::new(&pd).completion_channel(true),
        rdma_dmabuf::QueuePairBuilder::new(&pd).completion_channel(true),
    );
    let card = vgem_card();
    let gem = DumbBuffer::new(&card, SIZE).unwrap();
    let mut buf = gem.export().unwrap();
    let data = pattern(SIZE as usize, 5);
    Exporter::fill(&mut buf, 0, &data);
    let region = MemoryRegion::register_dmabuf(&pd, buf, 0, SIZE, None, Access::empty()).unwrap();
    let fence = VgemFence::attach(&card, gem.handle(), true).unwrap();
    let send = FencedOp::Send { imm: None };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (signalled, completed, got) = tokio::task::LocalSet::new().block_on(&rt, async {
        let e = owner
            .post_fenced_async(send, region, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e.error,
                Error::FenceTimeout {
                    kind: WorkKind::Send,
                    ..
                }
            ),
            "{}",
            e.error
        );
        assert_eq!(owner.outstanding(), 0, "nothing was posted");
        let inbox = peer
            .post_recv(host_region(&pd, &[], SIZE as usize, Access::LOCAL_WRITE))
            .unwrap();
        let gpu = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            fence.signal().unwrap();
            Instant::now()
        };
        let nic = async {
            let p = owner
                .post_fenced_async(send, e.region, Duration::from_secs(30))
                .await
                .expect("posted once signalled");
            p.await.expect("send completes");
            Instant::now()
        };
        let (signalled, completed) = tokio::join!(gpu, nic);
        (signalled, completed, inbox.await.expect("received"))
    });
    assert!(
        completed > signalled,
        "the send completed before the fence signalled"
    );
    assert!(
        got.region.bytes().unwrap()[..SIZE as usize] == data[..],
        "the bytes arrived"
    );
}
