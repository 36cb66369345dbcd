//! Batched writes (`QueuePair::post_write_batch`): `k` writes, only the last signalled, all
//! `k` regions back with that one completion, also when a write of the batch fails; and a
//! peer's write learnt without a completion, through volatile reads of the region. Runs in
//! the testbed VM.
//!
//! Each batch test runs on both paths a batch can take: the extended send verbs
//! (`ibv_wr_*`, the default, which the testbed's rxe has: the tests assert it was granted)
//! and `ibv_post_send` (`QueuePairBuilder::extended_verbs(false)`, the path of providers
//! without them).

use integration_tests::testbed::Testbed;
use integration_tests::verbs::{connect_pair, host_region, pattern, pd};
use rdma_dmabuf::{
    Access, Error, Local, ProtectionDomain, QueuePair, QueuePairBuilder, RemoteRegion, WorkKind,
};
use std::sync::Arc;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);
const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

/// The queue pair that posts the batches, on the path `extended` names, checked granted.
fn sender(pd: &Arc<ProtectionDomain>, depth: u32, extended: bool) -> (QueuePair, QueuePair) {
    let (a, b) = connect_pair(
        QueuePairBuilder::new(pd)
            .send_depth(depth)
            .extended_verbs(extended),
        QueuePairBuilder::new(pd),
    );
    assert_eq!(
        a.extended_verbs(),
        extended,
        "the testbed's rxe has the extended send verbs, and `false` keeps them off"
    );
    (a, b)
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_batch_lands_every_write_and_hands_every_region_back_with_one_completion() {
    lands_every_write(true);
    lands_every_write(false);
}

fn lands_every_write(extended: bool) {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, _b) = sender(&pd, 8, extended);
    let target = host_region(&pd, &[], 4 * 512, RW);
    let remote = target.remote().unwrap();
    for round in 0..50u8 {
        let data: [Vec<u8>; 4] = std::array::from_fn(|j| pattern(512, round ^ j as u8));
        let parts: [_; 4] = std::array::from_fn(|j| {
            Local::new(host_region(&pd, &data[j], 512, Access::empty()), 0..512)
        });
        let remotes = std::array::from_fn(|j| remote.slice(512 * j as u64, 512).unwrap());
        let pending = a.post_write_batch(parts, remotes).unwrap();
        assert_eq!(a.outstanding(), 1, "one slot for the batch");
        let done = pending.spin_timeout(T).unwrap().unwrap();
        assert_eq!(done.wc.kind, WorkKind::Write);
        for (j, part) in done.parts.iter().enumerate() {
            assert_eq!(part.range(), 0..512);
            let bytes = &part.region().bytes().unwrap()[..512];
            assert_eq!(bytes, &data[j][..], "region {j} back intact");
        }
        // SAFETY: every write into `target` has completed and nothing else writes it.
        let landed = unsafe { target.bytes_unchecked() };
        assert_eq!(
            &landed[..2048],
            data.concat(),
            "round {round}: every write landed in order"
        );
        assert_eq!(a.outstanding(), 0);
        assert_eq!(
            a.poll().unwrap(),
            0,
            "the unsignalled writes left no completion"
        );
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_batch_holds_k_send_queue_entries_and_is_refused_past_the_depth_with_its_regions_back() {
    holds_k_entries(true);
    holds_k_entries(false);
}

fn holds_k_entries(extended: bool) {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, _b) = sender(&pd, 4, extended);
    let target = host_region(&pd, &[], 64, RW);
    let r = target.remote().unwrap();
    let src = |n| host_region(&pd, &pattern(64, n), 64, Access::empty());
    let five = a
        .post_write_batch(std::array::from_fn::<_, 5, _>(|j| src(j as u8)), [r; 5])
        .unwrap_err();
    assert!(
        matches!(five.error, Error::QueueFull { depth: 4, .. }),
        "{}",
        five.error
    );
    assert_eq!(five.parts.expect("nothing posted: all back").len(), 5);
    let three = a
        .post_write_batch([src(1), src(2), src(3)], [r; 3])
        .unwrap();
    let one = a.post_write(src(4), r, None).unwrap();
    // 3 + 1 of the 4 entries are held until the batch's completion is taken.
    let full = a.post_write(src(5), r, None).unwrap_err();
    assert!(
        matches!(full.error, Error::QueueFull { .. }),
        "{}",
        full.error
    );
    let two = a.post_write_batch([src(6), src(7)], [r; 2]).unwrap_err();
    assert!(matches!(two.error, Error::QueueFull { .. }));
    assert_eq!(three.spin_timeout(T).unwrap().unwrap().parts.len(), 3);
    one.spin_timeout(T).unwrap().unwrap();
    let zero = a
        .post_write_batch::<rdma_dmabuf::MemoryRegion<rdma_dmabuf::HostBuffer>, 0>([], [])
        .unwrap_err();
    assert!(
        matches!(zero.error, Error::InvalidArgument { .. }),
        "{}",
        zero.error
    );
    a.post_write_batch([src(8), src(9), src(10), src(11)], [r; 4])
        .unwrap()
        .spin_timeout(T)
        .unwrap()
        .unwrap();
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_failed_write_in_a_batch_ends_it_with_that_error_only_once_every_write_is_flushed() {
    failed_write_ends_it(true);
    failed_write_ends_it(false);
}

fn failed_write_ends_it(extended: bool) {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, _b) = sender(&pd, 64, extended);
    let target = host_region(&pd, &[], 64, RW);
    let r = target.remote().unwrap();
    let bad = RemoteRegion {
        rkey: r.rkey ^ 0x5a5a_0000,
        ..r
    };
    let parts: [_; 40] =
        std::array::from_fn(|j| host_region(&pd, &pattern(64, j as u8), 64, Access::empty()));
    let mut remotes = [r; 40];
    remotes[2] = bad;
    let failed = a
        .post_write_batch(parts, remotes)
        .unwrap()
        .spin_timeout(T)
        .unwrap()
        .unwrap_err();
    // The third write's own status, not the flush the last write got.
    let Error::Completion { status, kind, .. } = &failed.error else {
        panic!("a completion error, not {}", failed.error);
    };
    assert_eq!(*kind, WorkKind::Write);
    assert_eq!(
        *status,
        rdma_sys::ibv_wc_status::IBV_WC_REM_ACCESS_ERR,
        "{}",
        failed.error
    );
    assert_eq!(failed.parts.len(), 40, "every region back");
    // The batch ended with the last write's completion, which came after every other write's
    // (its error and the flushes): nothing of the batch is left on the completion queue. (A
    // poll takes 16 completions: had the third write's error ended the batch, the flushes of
    // 20 later writes would still be there.)
    assert_eq!(
        a.poll().unwrap(),
        0,
        "a completion of the batch came after its end"
    );
    assert_eq!(a.outstanding(), 0);
    assert!(a.is_in_error());
    // In the error state, a batch is refused for the state before the queue's room is
    // looked at: 65 writes on a queue of 64 entries say "error state", not "queue full"
    // (whose advice, wait and post again, would never come true here).
    let parts: [_; 65] =
        std::array::from_fn(|j| host_region(&pd, &pattern(64, j as u8), 64, Access::empty()));
    let Err(refused) = a.post_write_batch(parts, [r; 65]) else {
        panic!("a batch on a queue pair in the error state was posted");
    };
    assert!(
        !matches!(refused.error, Error::QueueFull { .. })
            && refused.error.to_string().contains("error state"),
        "{}",
        refused.error
    );
    assert_eq!(
        refused.parts.map(|p| p.len()),
        Some(65),
        "every region back"
    );
    assert_eq!(a.outstanding(), 0, "no slot kept");
    drop(failed);
    drop(a);
}

/// A part refused by the checks in the middle of a batch (a region of another protection
/// domain) discards the chain already begun: on the extended path the provider's section is
/// aborted (`ibv_wr_abort`), so none of the writes before it lands, every region comes back,
/// and the queue pair goes on. Single writes posted through `ibv_post_send` between the
/// batches (which `ibv_wr_post(3)` allows outside a section) land in order with them.
#[test]
#[ignore = "needs the testbed VM"]
fn a_part_refused_mid_batch_discards_the_chain_and_single_writes_interleave_with_batches() {
    refused_mid_batch(true);
    refused_mid_batch(false);
}

fn refused_mid_batch(extended: bool) {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let other = ProtectionDomain::new(pd.context()).unwrap();
    let (a, _b) = sender(&pd, 16, extended);
    let target = host_region(&pd, &[], 8 * 64, RW);
    let r = target.remote().unwrap();
    let at = |j: u64| r.slice(64 * j, 64).unwrap();
    // 64 bytes of a region (host regions are whole pages), as the remote slices are.
    let src = |n: u8| {
        Local::new(
            host_region(&pd, &pattern(64, n), 64, Access::empty()),
            0..64,
        )
    };
    let mut parts: [_; 4] = std::array::from_fn(|j| src(j as u8 + 1));
    parts[2] = Local::new(
        host_region(&other, &pattern(64, 3), 64, Access::empty()),
        0..64,
    );
    let refused = a
        .post_write_batch(parts, [at(0), at(1), at(2), at(3)])
        .unwrap_err();
    assert!(
        refused.error.to_string().contains("protection domain"),
        "{}",
        refused.error
    );
    assert_eq!(refused.parts.map(|p| p.len()), Some(4), "every region back");
    assert_eq!(a.outstanding(), 0, "no slot kept");
    assert!(!a.is_in_error(), "nothing was posted, nothing failed");
    // A signalled write after it completes only after everything posted before it on the
    // send queue (RC executes in order): had any write of the refused batch been posted, it
    // would have landed by then.
    a.post_write(src(17), at(7), None)
        .unwrap()
        .spin_timeout(T)
        .unwrap()
        .unwrap();
    // SAFETY: every write into `target` has completed and nothing else writes it.
    let landed = unsafe { target.bytes_unchecked() };
    assert_eq!(
        &landed[..4 * 64],
        &[0u8; 4 * 64][..],
        "nothing of the refused batch landed"
    );
    // Single, batch, single, batch: each lands where it was sent.
    a.post_write(src(10), at(0), None)
        .unwrap()
        .spin_timeout(T)
        .unwrap()
        .unwrap();
    let first = a
        .post_write_batch([src(11), src(12)], [at(1), at(2)])
        .unwrap();
    let single = a.post_write(src(13), at(3), None).unwrap();
    let second = a
        .post_write_batch([src(14), src(15), src(16)], [at(4), at(5), at(6)])
        .unwrap();
    first.spin_timeout(T).unwrap().unwrap();
    single.spin_timeout(T).unwrap().unwrap();
    second.spin_timeout(T).unwrap().unwrap();
    // SAFETY: as above.
    let landed = unsafe { target.bytes_unchecked() };
    for (j, n) in (10..=17u8).enumerate() {
        assert_eq!(
            &landed[64 * j..64 * (j + 1)],
            &pattern(64, n)[..],
            "slot {j}: the write of pattern {n}"
        );
    }
    assert_eq!(a.poll().unwrap(), 0);
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_peers_write_is_seen_through_volatile_reads_of_a_remotely_writable_region() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, _b) = connect_pair(QueuePairBuilder::new(&pd), QueuePairBuilder::new(&pd));
    let target = host_region(&pd, &[], 4096, RW);
    let r = target.remote().unwrap();
    assert!(target.bytes().is_err(), "still no slice of it");
    let mut src = host_region(&pd, &[], 4096, Access::empty());
    for seq in 1..=100u8 {
        src.bytes_mut().unwrap()[4095] = seq;
        let w = a.post_write(
            Local::new(src, 4000..4096),
            r.slice(4000, 96).unwrap(),
            None,
        );
        let w = w.unwrap();
        // Watched before the write's completion is taken: the sequence byte tells.
        let mut last = [0u8];
        while last[0] != seq {
            target.read_volatile(4095, &mut last).unwrap();
        }
        src = w.spin_timeout(T).unwrap().unwrap().region;
    }
    let mut out = [0u8; 2];
    let e = target.read_volatile(4095, &mut out).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert!(target.read_volatile(u64::MAX, &mut out).is_err());
    target.read_volatile(4094, &mut out).unwrap();
    assert_eq!(out, [0, 100]);
}
