//! When a region's backing is released (observed through a foreign owner's holder count),
//! and two rules of the raw layer's contracts, each held by a test:
//! * `from_foreign_forbids_rust_references_outside_the_buffer` (host): the contract of
//!   `HostBuffer::from_foreign` forbids a caller to keep a `&mut [u8]` (or any reference) over
//!   the bytes elsewhere, which the NIC may write;
//! * `the_unsafe_fn_list_describes_registered_new` (host): docs/safety.md describes
//!   `Registered::new` as what it is, the entry of a queue pair among those fatal events flush
//!   (`sys::event`), whose contract is that the QP is live and the entry drops before the QP
//!   is destroyed.
//!
//! The others pin the delicate invariants checked and found to hold: the backing of a region
//! (observed through a foreign owner's holder count, which says exactly when the memory is
//! released) is released only after the NIC can no longer reach it, whatever order the
//! user's handles drop in (PD and context first, a dropped `Pending`, a dropped shared
//! receive queue, a region shared by two protection domains), and refused registrations
//! release it at once without leaving an MR behind. The counts are device-wide: every VM test
//! takes the process's lock (`process::alone()`), since the harness runs two at a time.

use integration_tests::counts::rdma_resources;
use integration_tests::process::alone;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{connect_pair, host_region, loopback_pair, pd};
use rdma_dmabuf::{
    Access, Context, ErrorKind, HostBuffer, Local, MemoryRegion, ProtectionDomain,
    QueuePairBuilder, SharedHostBuffer, SharedReceiveQueue,
};
use std::ptr::NonNull;
use std::sync::Arc;

/// `len` heap bytes as foreign memory whose owner is a plain boxed slice nobody else can
/// reach; the `Arc` whose strong count drops to 1 exactly when the buffer released its owner
/// (and with it the memory).
fn foreign(len: usize) -> (HostBuffer, Arc<()>) {
    struct Owned {
        _bytes: Box<[u8]>,
        _alive: Arc<()>,
    }
    let alive = Arc::new(());
    let mut bytes = vec![0u8; len].into_boxed_slice();
    let ptr = NonNull::new(bytes.as_mut_ptr()).unwrap();
    let owned = Owned {
        _bytes: bytes,
        _alive: alive.clone(),
    };
    // SAFETY: the boxed slice stays at its address until the owner drops with the buffer
    // (moving the owner moves only the box's pointer); nothing but the buffer reaches it.
    let buf = unsafe { HostBuffer::from_foreign(ptr, len, Box::new(owned)) }.unwrap();
    (buf, alive)
}

fn held(alive: &Arc<()>) -> bool {
    Arc::strong_count(alive) > 1
}

// ---------------------------------------------------------------------------------------
// Findings
// ---------------------------------------------------------------------------------------

/// rdma-dmabuf/src/sys/host.rs, `HostBuffer::from_foreign`'s `# Safety`: the memory stays
/// allocated until `owner` drops, nothing else touches the bytes while a slice made through
/// the buffer lives, and no Rust reference to the bytes is held *elsewhere* (an owner such as
/// `Arc<Mutex<Box<[u8]>>>` whose other clones lock and slice the box) for the buffer's whole
/// life: a region over the buffer lets the NIC write them, so such a `&mut [u8]` would see
/// its bytes change while it lives. This test holds the wording to that (a caller breaking it
/// is unsound by the contract, so no test can show more from safe code).
#[test]
fn from_foreign_forbids_rust_references_outside_the_buffer() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let src = std::fs::read_to_string(root.join("rdma-dmabuf/src/sys/host.rs")).unwrap();
    let at = src
        .find("pub unsafe fn from_foreign(")
        .expect("from_foreign");
    let safety = &src[src[..at].rfind("/// # Safety").expect("a Safety section")..at];
    assert!(
        safety.contains("no Rust reference") && safety.contains("outside this buffer"),
        "from_foreign's contract must forbid Rust references to the bytes outside the buffer:\n{safety}"
    );
    assert!(
        !safety.contains("may change at any time is fine"),
        "the old wording admitted references held elsewhere:\n{safety}"
    );
}

/// FINDING (docs/safety.md, the list of `unsafe fn`s): `Registered::new` is described as
/// "the reactor's registration of a borrowed fd". It is not a reactor registration at all:
/// `sys::event::Registered::new` enters a queue pair (a raw `ibv_qp *`) in the process-wide
/// list that fatal asynchronous events flush, and its contract is that the QP is live and the
/// entry is dropped before the QP is destroyed (`flush_live` calls `ibv_modify_qp` on it).
/// A reader checking call sites against the list is sent to the wrong contract.
#[test]
fn the_unsafe_fn_list_describes_registered_new() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/safety.md")).unwrap();
    let line = doc
        .lines()
        .find(|l| l.contains("`Registered::new`"))
        .expect("Registered::new is listed");
    assert!(
        !line.contains("reactor") && (line.contains("fatal") || line.contains("queue pair")),
        "docs/safety.md describes Registered::new wrongly: {line}"
    );
    let src = std::fs::read_to_string(root.join("rdma-dmabuf/src/sys/event.rs")).unwrap();
    assert!(
        src.contains("pub(crate) unsafe fn new(") && src.contains("before the QP is destroyed"),
        "sys::event::Registered::new's contract (the QP is live; the entry drops before it)"
    );
}

// ---------------------------------------------------------------------------------------
// Invariants checked and found to hold (pinned)
// ---------------------------------------------------------------------------------------

/// A region refused before registration (bad access bits) hands its backing straight back
/// to be dropped: the foreign owner goes at once, and no MR is left.
#[test]
#[ignore = "needs the testbed VM"]
fn a_refused_registration_releases_its_foreign_owner_and_leaves_no_mr() {
    let _alone = alone();
    let tb = Testbed::get();
    let pd = pd(&tb);
    let mrs = rdma_resources("mr");
    for access in [
        Access::REMOTE_WRITE,
        Access::REMOTE_ATOMIC,
        Access::from_bits_retain(1 << 5), // IBV_ACCESS_ZERO_BASED
        Access::from_bits_retain(1 << 6), // IBV_ACCESS_ON_DEMAND
    ] {
        let (buf, alive) = foreign(100);
        let e = MemoryRegion::register(&pd, buf, access).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{access:?}: {e}");
        assert!(!held(&alive), "{access:?}: the owner went with the refusal");
        let shared = SharedHostBuffer::new(foreign(100).0);
        let e = MemoryRegion::register_shared_host(&pd, &shared, access).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{access:?}: {e}");
        assert_eq!(
            shared.holders(),
            1,
            "no handle kept by a refused registration"
        );
    }
    assert_eq!(rdma_resources("mr"), mrs, "no MR left by refusals");
}

/// Parents dropped first: the user's `Context` and `ProtectionDomain` handles go before a
/// queue pair that still holds an abandoned receive into foreign memory. The memory stays
/// (the slot holds the region) until the queue pair is destroyed, and is released only then;
/// every MR, QP and CQ is gone afterwards.
#[test]
#[ignore = "needs the testbed VM"]
fn an_abandoned_receive_keeps_its_foreign_memory_until_its_queue_pair_is_destroyed() {
    let _alone = alone();
    let tb = Testbed::get();
    let (mrs, qps, cqs) = (
        rdma_resources("mr"),
        rdma_resources("qp"),
        rdma_resources("cq"),
    );
    let ctx = Context::open(&tb.device).unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let (a, b) = loopback_pair(&pd);
    let (buf, alive) = foreign(3 * 1000 + 7);
    let region = MemoryRegion::register(&pd, buf, Access::LOCAL_WRITE).unwrap();
    drop(b.post_recv(region).expect("post the receive"));
    drop(pd);
    drop(ctx);
    assert!(
        held(&alive),
        "posted, handle dropped: the slot keeps the memory"
    );
    // The peer's queue pair goes first: the receive is still posted, never filled.
    drop(a);
    assert!(held(&alive), "still posted on b");
    assert_eq!(b.outstanding(), 1);
    drop(b);
    assert!(!held(&alive), "released once b is destroyed");
    assert_eq!(rdma_resources("mr"), mrs, "MRs back to the baseline");
    assert_eq!(rdma_resources("qp"), qps, "QPs back to the baseline");
    assert_eq!(rdma_resources("cq"), cqs, "CQs back to the baseline");
}

/// A shared receive queue dropped before its queue pair, with a receive into foreign memory
/// still posted and a parent-first drop of PD and context: the memory outlives the handle,
/// the PD and the context, and goes only with the last queue pair (after `ibv_destroy_srq`).
#[test]
#[ignore = "needs the testbed VM"]
fn an_orphaned_shared_receive_keeps_its_foreign_memory_until_the_last_queue_pair() {
    let _alone = alone();
    let tb = Testbed::get();
    let mrs = rdma_resources("mr");
    let ctx = Context::open(&tb.device).unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let srq = SharedReceiveQueue::new(&pd, 2).unwrap();
    let (a, b) = connect_pair(
        QueuePairBuilder::new(&pd),
        QueuePairBuilder::new(&pd).srq(&srq),
    );
    let (buf, alive) = foreign(4096 + 1);
    let region = MemoryRegion::register(&pd, buf, Access::LOCAL_WRITE).unwrap();
    drop(srq.post_recv(region).expect("post the shared receive"));
    drop(srq);
    drop(pd);
    drop(ctx);
    assert!(held(&alive), "orphaned receive: memory kept");
    drop(a);
    assert!(held(&alive), "b still joins the shared queue");
    drop(b);
    assert!(
        !held(&alive),
        "released with the shared queue's last queue pair"
    );
    assert_eq!(rdma_resources("mr"), mrs);
}

/// One foreign buffer registered in two protection domains (two contexts): its owner stays
/// until the last region is deregistered and the last handle dropped, in either order; a
/// region's `into_inner` hands back a handle, never the buffer, while another region holds
/// it.
#[test]
#[ignore = "needs the testbed VM"]
fn a_shared_foreign_buffer_outlives_every_region_over_it() {
    let _alone = alone();
    let tb = Testbed::get();
    let mrs = rdma_resources("mr");
    for first_region_goes_first in [true, false] {
        let pd1 = pd(&tb);
        let pd2 = pd(&tb);
        let (buf, alive) = foreign(5000);
        let shared = SharedHostBuffer::new(buf);
        let r1 = MemoryRegion::register_shared_host(&pd1, &shared, Access::LOCAL_WRITE).unwrap();
        let r2 = MemoryRegion::register_shared_host(&pd2, &shared, Access::REMOTE_READ).unwrap();
        assert_eq!(r1.addr(), r2.addr(), "registered in place in both");
        let shared = shared.try_into_inner().expect_err("two regions hold it");
        drop(pd1);
        drop(pd2);
        let (first, second) = if first_region_goes_first {
            (r1, r2)
        } else {
            (r2, r1)
        };
        let handle = first.into_inner().expect("deregistered");
        let handle = handle
            .try_into_inner()
            .expect_err("the other region still holds the buffer");
        drop(handle);
        drop(shared);
        assert!(held(&alive), "one region left: the memory stays");
        drop(second);
        assert!(!held(&alive), "the last region took the owner with it");
    }
    assert_eq!(rdma_resources("mr"), mrs);
}

/// A request refused by the checks (another PD's region, a receive on a queue pair that
/// receives through a shared queue) hands the region back at once, holds no slot, and the
/// foreign memory is released with the returned region: the error paths of the posts leak
/// neither memory nor MRs.
#[test]
#[ignore = "needs the testbed VM"]
fn refused_posts_hand_foreign_memory_back_and_hold_no_slot() {
    let _alone = alone();
    let tb = Testbed::get();
    let mrs = rdma_resources("mr");
    let pd1 = pd(&tb);
    let pd2 = pd(&tb);
    let srq = SharedReceiveQueue::new(&pd1, 2).unwrap();
    let (a, b) = connect_pair(
        QueuePairBuilder::new(&pd1),
        QueuePairBuilder::new(&pd1).srq(&srq),
    );
    // Another PD's region.
    let (buf, alive) = foreign(64);
    let other = MemoryRegion::register(&pd2, buf, Access::LOCAL_WRITE).unwrap();
    let e = a.post_recv(other).expect_err("another PD's region");
    assert_eq!(e.error.kind(), ErrorKind::InvalidInput, "{}", e.error);
    assert_eq!(a.outstanding(), 0, "no slot held");
    let other = e.region;
    let e = srq.post_recv(other).expect_err("another PD's region");
    assert_eq!(srq.outstanding(), 0, "no slot held");
    drop(e);
    assert!(!held(&alive), "released with the refused region");
    // A receive on a queue pair that receives through a shared queue.
    let (buf, alive) = foreign(64);
    let mine = MemoryRegion::register(&pd1, buf, Access::LOCAL_WRITE).unwrap();
    let e = b
        .post_recv(mine)
        .expect_err("b receives through the shared queue");
    assert_eq!(b.outstanding(), 0, "no slot held");
    drop(e);
    assert!(!held(&alive), "released with the refused region");
    // Past the region, and reversed.
    let (buf, alive) = foreign(64);
    let mine = MemoryRegion::register(&pd1, buf, Access::LOCAL_WRITE).unwrap();
    let e = a
        .post_recv(Local::new(mine, 0..65))
        .expect_err("past the end");
    let (start, end) = std::hint::black_box((10, 5));
    let e = a
        .post_recv(Local::new(e.region, start..end))
        .expect_err("reversed");
    let e = a.post_recv(Local::new(e.region, 0..0)).expect_err("empty");
    assert_eq!(a.outstanding(), 0);
    drop(e);
    assert!(!held(&alive));
    drop((a, b, srq));
    assert_eq!(rdma_resources("mr"), mrs);
}

/// The queue pair's drop is bounded and ends with the memory released after the QP is
/// destroyed, also for a receive whose message never comes and a write to a peer that is
/// gone (its QP destroyed: the write retries, then fails or is flushed).
#[test]
#[ignore = "needs the testbed VM"]
fn in_flight_requests_to_a_destroyed_peer_end_before_their_memory_goes() {
    let _alone = alone();
    let tb = Testbed::get();
    let mrs = rdma_resources("mr");
    let pd = pd(&tb);
    let (a, b) = connect_pair(
        QueuePairBuilder::new(&pd).retry_count(1).ack_timeout(14),
        QueuePairBuilder::new(&pd),
    );
    let target = host_region(&pd, &[], 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let remote = target.remote().unwrap();
    drop(b);
    drop(target);
    let (src_buf, src_alive) = foreign(4096);
    let src = MemoryRegion::register(&pd, src_buf, Access::empty()).unwrap();
    let (dst_buf, dst_alive) = foreign(4096);
    let dst = MemoryRegion::register(&pd, dst_buf, Access::LOCAL_WRITE).unwrap();
    // A receive no message will fill, then a write to the destroyed peer, whose retries
    // (ack timeout 2^14 * 4.096 us, one retry) outlast this look: both handles dropped.
    drop(a.post_recv(dst).expect("post the receive"));
    drop(a.post_write(src, remote, None).expect("post the write"));
    assert!(held(&src_alive) && held(&dst_alive), "both still lent");
    assert_eq!(a.outstanding(), 2);
    drop(a);
    assert!(
        !held(&src_alive) && !held(&dst_alive),
        "released once the queue pair is destroyed"
    );
    assert_eq!(rdma_resources("mr"), mrs);
}
