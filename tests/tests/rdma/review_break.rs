//! Review attacks on the post entries and the fast paths (temporary; removed after review).

use integration_tests::counts::rdma_resources;
use integration_tests::evil_waker::{evil, Site};
use integration_tests::injection::{pair, parked, recv_region, send, LEN, T};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{connect_pair, deep_pair, host_region, pattern, pd};
use rdma_dmabuf::reactor::WaitStep;
use rdma_dmabuf::{scope, Access, AtomicOp, ErrorKind, Local, QueuePairBuilder, WorkKind};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

fn noop_cx() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

fn msg(e: Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// Owned future: Ready through the fast path, polled again (documented panic), dropped; one
/// forgotten after Ready. No MR leaked, nothing outstanding.
#[test]
#[ignore = "needs the testbed VM"]
fn rb_owned_ready_then_polled_again_dropped_and_forgotten() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    let mrs0 = rdma_resources("mr");
    let mut p = b.post_recv(recv_region(&pd)).unwrap();
    send(&pd, &a, 7);
    let done = match p.poll_with(&mut noop_cx(), parked) {
        Poll::Ready(r) => r.expect("receive"),
        Poll::Pending => panic!("fast path missed a completion that is there"),
    };
    assert_eq!(&done.region.bytes().unwrap()[..LEN], &pattern(LEN, 7)[..]);
    let again = catch_unwind(AssertUnwindSafe(|| {
        let _ = p.poll_with(&mut noop_cx(), parked);
    }));
    let m = msg(again.expect_err("second poll panics"));
    println!("second poll after Ready: {m}");
    assert!(m.contains("polled after"), "{m}");
    drop(p);
    let mut q = b.post_recv(recv_region(&pd)).unwrap();
    send(&pd, &a, 8);
    let done2 = match q.poll_with(&mut noop_cx(), parked) {
        Poll::Ready(r) => r.expect("receive"),
        Poll::Pending => panic!("fast path missed"),
    };
    std::mem::forget(q);
    assert_eq!(&done2.region.bytes().unwrap()[..LEN], &pattern(LEN, 8)[..]);
    drop((done, done2));
    assert_eq!(b.outstanding(), 0);
    assert_eq!(rdma_resources("mr"), mrs0, "MRs back to baseline");
}

/// Owned future: a waker that panics in `drop` registered by a parked poll; the fast path of
/// the next poll lets go of it (panic). The region is released (NIC done), the slot free, a
/// further poll is the documented panic, and the MR count is back.
#[test]
#[ignore = "needs the testbed VM"]
fn rb_owned_fast_path_drops_a_waker_that_panics_in_drop() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    let (e, w) = evil(Site::Drop);
    let _d = e.disarm_on_drop();
    let mrs0 = rdma_resources("mr");
    let mut p = b.post_recv(recv_region(&pd)).unwrap();
    assert!(p
        .poll_with(&mut Context::from_waker(&w), parked)
        .is_pending());
    e.arm();
    send(&pd, &a, 3);
    let r = catch_unwind(AssertUnwindSafe(|| p.poll_with(&mut noop_cx(), parked)));
    let hit = r.is_err();
    println!(
        "fast path with a drop-panicking waker in the slot: panicked={hit}, evil panics={}",
        e.panicked()
    );
    e.disarm();
    assert_eq!(b.outstanding(), 0, "slot freed");
    let again = catch_unwind(AssertUnwindSafe(|| {
        let _ = p.poll_with(&mut noop_cx(), parked);
    }));
    println!("poll after that: panicked={}", again.is_err());
    drop(p);
    drop(w);
    assert_eq!(rdma_resources("mr"), mrs0, "MRs back to baseline");
    // The queue pair still works.
    let p = b.post_recv(recv_region(&pd)).unwrap();
    send(&pd, &a, 4);
    let d = p.spin_timeout(T).unwrap().unwrap();
    assert_eq!(&d.region.bytes().unwrap()[..LEN], &pattern(LEN, 4)[..]);
}

/// Owned futures: another task's waker panics in `wake` while this handle's fast path polls;
/// this handle's completion is kept in its slot, both handles then get their own outcome.
#[test]
#[ignore = "needs the testbed VM"]
fn rb_owned_fast_path_while_another_waker_panics_in_wake() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    let (e, w) = evil(Site::Wake);
    let _d = e.disarm_on_drop();
    let mrs0 = rdma_resources("mr");
    let mut pa = b.post_recv(recv_region(&pd)).unwrap();
    let mut pb = b.post_recv(recv_region(&pd)).unwrap();
    assert!(pa
        .poll_with(&mut Context::from_waker(&w), parked)
        .is_pending());
    e.arm();
    send(&pd, &a, 1);
    send(&pd, &a, 2);
    let r = catch_unwind(AssertUnwindSafe(|| pb.poll_with(&mut noop_cx(), parked)));
    println!(
        "pb's fast path while pa's waker panics in wake: panicked={}",
        r.is_err()
    );
    let early = match r {
        Ok(Poll::Ready(x)) => Some(x),
        Ok(Poll::Pending) => panic!("pb pending with its completion in the CQ"),
        Err(_) => None,
    };
    e.disarm();
    let db = match early {
        Some(x) => x.unwrap(),
        None => match pb.poll_with(&mut noop_cx(), parked) {
            Poll::Ready(x) => x.unwrap(),
            Poll::Pending => panic!("pb lost its completion after the panic"),
        },
    };
    let da = match pa.poll_with(&mut noop_cx(), parked) {
        Poll::Ready(x) => x.unwrap(),
        Poll::Pending => panic!("pa lost its completion"),
    };
    assert_eq!(&da.region.bytes().unwrap()[..LEN], &pattern(LEN, 1)[..]);
    assert_eq!(&db.region.bytes().unwrap()[..LEN], &pattern(LEN, 2)[..]);
    drop((da, db, pa, pb, w));
    assert_eq!(b.outstanding(), 0);
    assert_eq!(rdma_resources("mr"), mrs0);
}

/// Owned: a waker that panics in `clone` (the slow path registers it) then the fast path.
#[test]
#[ignore = "needs the testbed VM"]
fn rb_owned_clone_panicking_waker_then_fast_path() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    let (e, w) = evil(Site::Clone);
    let _d = e.disarm_on_drop();
    let mrs0 = rdma_resources("mr");
    let mut p = b.post_recv(recv_region(&pd)).unwrap();
    e.arm();
    let r = catch_unwind(AssertUnwindSafe(|| {
        p.poll_with(&mut Context::from_waker(&w), parked)
    }));
    println!("slow path, clone panics: panicked={}", r.is_err());
    send(&pd, &a, 9);
    let d = match p.poll_with(&mut Context::from_waker(&w), parked) {
        Poll::Ready(x) => x.unwrap(),
        Poll::Pending => panic!("fast path missed"),
    };
    e.disarm();
    assert_eq!(&d.region.bytes().unwrap()[..LEN], &pattern(LEN, 9)[..]);
    drop((d, p));
    assert_eq!(b.outstanding(), 0);
    assert_eq!(rdma_resources("mr"), mrs0);
}

/// A scoped write that fails (remote access error) spun by the fast path, with a scoped
/// receive and an owned receive on the same queue pair: the scope ends promptly, the receive
/// flushed; the owned one comes back flushed through the awaited fast path. Then a scope
/// whose only request fails (the drain's early return).
#[test]
#[ignore = "needs the testbed VM"]
fn rb_scoped_spin_error_then_scope_ends() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, _b) = deep_pair(&pd);
    let mrs0 = rdma_resources("mr");
    let ro = host_region(&pd, &[], 4096, Access::REMOTE_READ);
    let bad = ro.remote().unwrap();
    let src = host_region(&pd, &pattern(64, 5), 64, Access::empty());
    let mut inbox = host_region(&pd, &[], 64, Access::LOCAL_WRITE);
    let mut ow = a.post_recv(recv_region(&pd)).unwrap();
    let t = Instant::now();
    let err = scope(|s| {
        let _r = s.recv(&a, &mut inbox).unwrap();
        let w = s
            .write(&a, src.part(0..64), bad.slice(0, 64).unwrap(), None)
            .unwrap();
        w.spin().expect_err("write to a read-only region fails")
    });
    println!(
        "scoped write error: {err} ({:?}) after {:?}",
        err.kind(),
        t.elapsed()
    );
    assert_eq!(err.kind(), ErrorKind::RemoteAccess);
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(a.is_in_error());
    let od = match ow.poll_with(&mut noop_cx(), parked) {
        Poll::Ready(x) => x.expect_err("flushed"),
        Poll::Pending => panic!("the owned receive of a flushed qp is pending"),
    };
    println!("owned receive: {}", od.error);
    assert_eq!(od.error.kind(), ErrorKind::Flushed);
    assert!(inbox.bytes().unwrap().iter().all(|&x| x == 0));
    assert_eq!(a.outstanding(), 0);
    drop((od, ow));
    // Only one failing request: every entry done, the drain returns at once.
    let (c, _d) = deep_pair(&pd);
    let t = Instant::now();
    let e2 = scope(|s| {
        s.write(&c, src.part(0..64), bad.slice(0, 64).unwrap(), None)
            .unwrap()
            .spin()
            .expect_err("fails")
    });
    println!("lone failing scoped write: {e2} after {:?}", t.elapsed());
    assert_eq!(c.outstanding(), 0);
    drop((ro, src, inbox));
    assert_eq!(rdma_resources("mr"), mrs0);
}

/// spin_timeout (times out) then spin; poll_with Ready then the slot reused by a new scoped
/// request, then the old handle polled and spun again: an error, never the new request's
/// completion.
#[test]
#[ignore = "needs the testbed VM"]
fn rb_scoped_timeout_then_spin_and_consumed_handle_after_slot_reuse() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = deep_pair(&pd);
    let mut in1 = host_region(&pd, &[], 64, Access::LOCAL_WRITE);
    let mut in2 = host_region(&pd, &[], 64, Access::LOCAL_WRITE);
    let mut in3 = host_region(&pd, &[], 64, Access::LOCAL_WRITE);
    let send_imm = |seed: u8, imm: u32| {
        let r = host_region(&pd, &pattern(64, seed), 64, Access::empty());
        a.post_send(r, Some(imm)).unwrap().spin().unwrap();
    };
    scope(|s| {
        let h = s.recv(&b, &mut in1).unwrap();
        let h = h
            .spin_timeout(Duration::from_millis(10))
            .expect_err("nothing sent yet");
        send_imm(1, 5);
        let wc = h.spin().unwrap();
        assert_eq!(wc.imm, Some(5));
        let mut h2 = s.recv(&b, &mut in2).unwrap();
        assert!(h2.poll_with(&mut noop_cx(), parked).is_pending());
        send_imm(2, 6);
        let wc2 = match h2.poll_with(&mut noop_cx(), polling_step) {
            Poll::Ready(x) => x.unwrap(),
            Poll::Pending => h2_spin_fail(),
        };
        assert_eq!(wc2.imm, Some(6));
        let h3 = s.recv(&b, &mut in3).unwrap();
        send_imm(3, 7);
        let again = h2.poll_with(&mut noop_cx(), polling_step);
        println!("h2 polled again after Ready: {again:?}");
        match again {
            Poll::Ready(Err(e)) => assert!(
                matches!(e, rdma_dmabuf::Error::InvalidArgument { .. }),
                "{e}"
            ),
            other => panic!("consumed handle returned {other:?}"),
        }
        let again = h2.spin();
        println!("h2 spun after Ready: {again:?}");
        assert!(again.is_err());
        let wc3 = h3.spin().unwrap();
        assert_eq!(wc3.imm, Some(7), "h3 got its own completion");
    });
    assert_eq!(&in1.bytes().unwrap()[..64], &pattern(64, 1)[..]);
    assert_eq!(&in2.bytes().unwrap()[..64], &pattern(64, 2)[..]);
    assert_eq!(&in3.bytes().unwrap()[..64], &pattern(64, 3)[..]);
    assert_eq!(b.outstanding(), 0);
}

/// A hand-written reactor step that found the fd ready: takes the events, polls, looks again.
fn polling_step(q: &rdma_dmabuf::QueuePair, _: &mut Context<'_>) -> WaitStep {
    let _ = q.take_completion_events();
    let _ = q.poll();
    WaitStep::Again
}

/// A reactor that cannot wait (none running, or no channel): the documented busy loop.
fn spin_step(_: &rdma_dmabuf::QueuePair, _: &mut Context<'_>) -> WaitStep {
    WaitStep::Spin
}

fn h2_spin_fail() -> ! {
    panic!("scoped poll_with pending with the completion in the CQ")
}

/// A scoped handle polled with a waker that panics in `drop`, then spun: the fast path lets go
/// of the waker (panic inside the scope, caught there). The scope ends, nothing in flight.
/// A second scoped handle whose waker panics in `wake` while another handle spins: that spin
/// panics, and both requests still end (the drain takes the one whose handle unwound).
#[test]
#[ignore = "needs the testbed VM"]
fn rb_scoped_spin_with_panicking_wakers() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    let (e, w) = evil(Site::Drop);
    let _d = e.disarm_on_drop();
    let mut in1 = recv_region(&pd);
    let mut in2 = recv_region(&pd);
    let t = Instant::now();
    scope(|s| {
        let mut h = s.recv(&b, &mut in1).unwrap();
        assert!(h
            .poll_with(&mut Context::from_waker(&w), parked)
            .is_pending());
        e.arm();
        send(&pd, &a, 11);
        let t0 = Instant::now();
        let r = catch_unwind(AssertUnwindSafe(|| h.spin()));
        println!(
            "scoped spin, drop-panicking waker: {:?} in {:?}",
            r.as_ref().map(|x| x.as_ref().map(|wc| wc.byte_len)),
            t0.elapsed()
        );
        e.disarm();
        let h2 = s.recv(&b, &mut in2).unwrap();
        send(&pd, &a, 12);
        assert_eq!(h2.spin().unwrap().byte_len, LEN as u32);
    });
    println!("scope 1 took {:?}", t.elapsed());
    assert_eq!(&in1.bytes().unwrap()[..LEN], &pattern(LEN, 11)[..]);
    assert_eq!(&in2.bytes().unwrap()[..LEN], &pattern(LEN, 12)[..]);
    assert_eq!(b.outstanding(), 0);
    drop(w);

    let (e, w) = evil(Site::Wake);
    let _d2 = e.disarm_on_drop();
    let t = Instant::now();
    let got = scope(|s| {
        let mut h1 = s.recv(&b, &mut in1).unwrap();
        assert!(h1
            .poll_with(&mut Context::from_waker(&w), parked)
            .is_pending());
        e.arm();
        let h2 = s.recv(&b, &mut in2).unwrap();
        send(&pd, &a, 21);
        send(&pd, &a, 22);
        let r = catch_unwind(AssertUnwindSafe(|| h2.spin()));
        let p2 = r.is_err();
        e.disarm();
        let w1 = h1.spin().unwrap();
        (p2, w1.byte_len)
    });
    println!(
        "scope 2: h2's spin panicked={} h1 len={} took {:?}",
        got.0,
        got.1,
        t.elapsed()
    );
    assert_eq!(&in1.bytes().unwrap()[..LEN], &pattern(LEN, 21)[..]);
    assert_eq!(&in2.bytes().unwrap()[..LEN], &pattern(LEN, 22)[..]);
    assert_eq!(b.outstanding(), 0);
}

/// Owned and scoped receives interleaved on one queue pair (one owned handle dropped early,
/// one awaited), the last scoped one spun first: each gets its own message, the abandoned
/// region is released, and no MR is left.
#[test]
#[ignore = "needs the testbed VM"]
fn rb_mixed_owned_and_scoped_on_one_qp() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = deep_pair(&pd);
    let mrs0 = rdma_resources("mr");
    let mut s1in = host_region(&pd, &[], 64, Access::LOCAL_WRITE);
    let mut s2in = host_region(&pd, &[], 64, Access::LOCAL_WRITE);
    let send_imm = |seed: u8, imm: u32| {
        let r = host_region(&pd, &pattern(64, seed), 64, Access::empty());
        a.post_send(r, Some(imm)).unwrap().spin().unwrap();
    };
    let (o1_done, mid) = scope(|s| {
        let mut o1 = b
            .post_recv(host_region(&pd, &[], 64, Access::LOCAL_WRITE))
            .unwrap();
        let s1 = s.recv(&b, &mut s1in).unwrap();
        let o2 = b
            .post_recv(host_region(&pd, &[], 64, Access::LOCAL_WRITE))
            .unwrap();
        drop(o2);
        let s2 = s.recv(&b, &mut s2in).unwrap();
        for i in 0..4u8 {
            send_imm(40 + i, u32::from(i));
        }
        let mid = rdma_resources("mr");
        assert_eq!(s2.spin().unwrap().imm, Some(3));
        assert_eq!(s1.spin().unwrap().imm, Some(1));
        let d = match o1.poll_with(&mut noop_cx(), parked) {
            Poll::Ready(x) => x.unwrap(),
            Poll::Pending => panic!("o1 pending with its completion recorded"),
        };
        assert_eq!(d.wc.imm, Some(0));
        (d, mid)
    });
    println!(
        "MRs: baseline {mrs0}, mid {mid}, after {}",
        rdma_resources("mr")
    );
    assert_eq!(&o1_done.region.bytes().unwrap()[..64], &pattern(64, 40)[..]);
    assert_eq!(&s1in.bytes().unwrap()[..64], &pattern(64, 41)[..]);
    assert_eq!(&s2in.bytes().unwrap()[..64], &pattern(64, 43)[..]);
    assert_eq!(b.outstanding(), 0);
    drop((o1_done, s1in, s2in));
    assert_eq!(
        rdma_resources("mr"),
        mrs0,
        "the abandoned region was released"
    );
}

/// A batch whose middle write fails, between two scoped writes on the same queue pair; the
/// later scoped write is spun first (its poll records the member error): the batch ends with
/// the member's error, not the flush, every part back; the earlier write succeeded.
#[test]
#[ignore = "needs the testbed VM"]
fn rb_batch_member_error_among_scoped_spins() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    for extended in [true, false] {
        let (a, _b) = connect_pair(
            QueuePairBuilder::new(&pd)
                .send_depth(16)
                .extended_verbs(extended),
            QueuePairBuilder::new(&pd),
        );
        let mrs0 = rdma_resources("mr");
        let good = host_region(&pd, &[], 4096, RW);
        let gr = good.remote().unwrap();
        let ro = host_region(&pd, &[], 4096, Access::REMOTE_READ);
        let bad = ro.remote().unwrap();
        let src = host_region(&pd, &pattern(64, 9), 64, Access::empty());
        let (w1r, w2r, br) = scope(|s| {
            let w1 = s
                .write(&a, src.part(0..64), gr.slice(0, 64).unwrap(), None)
                .unwrap();
            let parts: [_; 3] = std::array::from_fn(|j| {
                Local::new(
                    host_region(&pd, &pattern(64, j as u8), 64, Access::empty()),
                    0..64,
                )
            });
            let remotes = [
                gr.slice(64, 64).unwrap(),
                bad.slice(0, 64).unwrap(),
                gr.slice(128, 64).unwrap(),
            ];
            let batch = a.post_write_batch(parts, remotes).unwrap();
            let w2 = s.write(&a, src.part(0..64), gr.slice(192, 64).unwrap(), None);
            let w2r = w2.map(|w| w.spin());
            let w1r = w1.spin();
            let br = batch.spin_timeout(T).expect("batch ends");
            (w1r, w2r, br)
        });
        println!("extended={extended}: w1={w1r:?}");
        println!(
            "  w2={:?}",
            w2r.as_ref().map(|r| r.as_ref().map_err(|e| e.kind()))
        );
        let be = br.expect_err("batch fails");
        println!("  batch error: {} ({:?})", be.error, be.error.kind());
        assert!(w1r.is_ok());
        assert_eq!(
            be.error.kind(),
            ErrorKind::RemoteAccess,
            "member's error, not the flush"
        );
        assert_eq!(be.parts.len(), 3, "parts back");
        assert_eq!(a.outstanding(), 0);
        drop((be, good, ro, src));
        assert_eq!(rdma_resources("mr"), mrs0);
    }
}

/// Refusals through the owned entry: every part back, no MR or slot left.
#[test]
#[ignore = "needs the testbed VM"]
fn rb_owned_refusals_hand_everything_back() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd); // max_sge 2
    let mrs0 = rdma_resources("mr");
    let target = host_region(&pd, &[], 64, RW);
    let remote = target.remote().unwrap();
    let three: [_; 3] = std::array::from_fn(|_| Local::new(host_region(&pd, &[], 64, RW), 0..64));
    let e = a.post_send_parts(three, None).unwrap_err();
    println!("3 parts on max_sge 2: {}", e.error);
    assert_eq!(e.parts.len(), 3);
    let [x, y, z] = e.parts;
    let y = Local::new(y.into_region(), 0..(1 << 30));
    let e = b.post_recv_parts([x, y]).unwrap_err();
    println!("part past its region: {}", e.error);
    let e2 = a
        .post_write(z, remote.slice(0, 32).unwrap(), None)
        .unwrap_err();
    println!("remote too short: {}", e2.error);
    let e3 = a
        .post_atomic(
            Local::new(e2.region, 0..4),
            remote.slice(0, 8).unwrap(),
            AtomicOp::FetchAdd { add: 1 },
        )
        .unwrap_err();
    println!("4-byte atomic: {}", e3.error);
    assert_eq!(a.outstanding() + b.outstanding(), 0);
    drop((e, e3, target));
    assert_eq!(rdma_resources("mr"), mrs0);
    let _ = WorkKind::Send;
}

/// Awaited in tokio: a handle whose completion another handle's spin already recorded
/// resolves at once; one awaited before its completion is woken by the fd (no hang).
#[test]
#[ignore = "needs the testbed VM"]
fn rb_awaited_finds_completion_recorded_by_another() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    let mrs0 = rdma_resources("mr");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let pa = b.post_recv(recv_region(&pd)).unwrap();
    let pb = b.post_recv(recv_region(&pd)).unwrap();
    send(&pd, &a, 31);
    send(&pd, &a, 32);
    let db = pb.spin().unwrap();
    let da = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(10), pa).await })
        .expect("no hang")
        .unwrap();
    assert_eq!(&da.region.bytes().unwrap()[..LEN], &pattern(LEN, 31)[..]);
    assert_eq!(&db.region.bytes().unwrap()[..LEN], &pattern(LEN, 32)[..]);
    let pc = b.post_recv(recv_region(&pd)).unwrap();
    let pd2 = pd.clone();
    let a_ref = &a;
    let dc = rt.block_on(async {
        let later = async {
            tokio::time::sleep(Duration::from_millis(30)).await;
            send(&pd2, a_ref, 33);
        };
        let (r, ()) = tokio::join!(tokio::time::timeout(Duration::from_secs(10), pc), later);
        r
    });
    let dc = dc.expect("woken, no hang").unwrap();
    assert_eq!(&dc.region.bytes().unwrap()[..LEN], &pattern(LEN, 33)[..]);
    drop((da, db, dc));
    assert_eq!(b.outstanding(), 0);
    assert_eq!(rdma_resources("mr"), mrs0);
}

/// A scoped request whose completion is in the CQ, polled through the reactor API with a
/// reactor that cannot wait (`WaitStep::Spin`: "the task reschedules itself and polls
/// again ... never a lost wakeup"), on a queue pair without a completion channel and on one
/// with a channel: does it ever resolve? The owned handle, in the same state, for contrast.
#[test]
#[ignore = "needs the testbed VM"]
fn rb_scoped_future_that_cannot_park_never_polls_the_cq() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    for channel in [false, true] {
        let (a, b) = connect_pair(
            QueuePairBuilder::new(&pd).completion_channel(channel),
            QueuePairBuilder::new(&pd).completion_channel(channel),
        );
        // Owned, for contrast.
        let mut p = b.post_recv(recv_region(&pd)).unwrap();
        assert!(p.poll_with(&mut noop_cx(), spin_step).is_pending());
        send(&pd, &a, 50);
        let owned_polls = (1..=10_000).find(|_| p.poll_with(&mut noop_cx(), spin_step).is_ready());
        println!("channel={channel}: owned handle ready after {owned_polls:?} polls");
        let mut inbox = recv_region(&pd);
        let scoped_polls = scope(|s| {
            let mut h = s.recv(&b, &mut inbox).unwrap();
            assert!(h.poll_with(&mut noop_cx(), spin_step).is_pending());
            send(&pd, &a, 51);
            let n = (1..=100_000).find(|_| h.poll_with(&mut noop_cx(), spin_step).is_ready());
            if n.is_none() {
                // Leave it to the scope (the drain polls).
                drop(h);
            }
            n
        });
        println!("channel={channel}: scoped handle ready after {scoped_polls:?} polls (of 100000)");
        assert_eq!(&inbox.bytes().unwrap()[..LEN], &pattern(LEN, 51)[..]);
        assert!(owned_polls.is_some());
        assert!(
            scoped_polls.is_some(),
            "channel={channel}: the scoped future never resolves"
        );
    }
}

/// The same with tokio: a scoped receive whose message has landed, awaited inside a runtime
/// on a queue pair without a completion channel, bounded by a 3 s timeout.
#[test]
#[ignore = "needs the testbed VM"]
fn rb_scoped_await_without_channel_hangs() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = deep_pair(&pd);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut inbox = recv_region(&pd);
    let owned = b.post_recv(recv_region(&pd)).unwrap();
    send(&pd, &a, 60);
    let o = rt.block_on(async { tokio::time::timeout(Duration::from_secs(3), owned).await });
    println!("owned await without channel: ready={}", o.is_ok());
    let t = Instant::now();
    let r = scope(|s| {
        let h = s.recv(&b, &mut inbox).unwrap();
        send(&pd, &a, 61);
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(3), h).await })
    });
    println!(
        "scoped await without channel: {:?} after {:?}",
        r.as_ref().map(|x| x.as_ref().map(|wc| wc.byte_len)),
        t.elapsed()
    );
    assert_eq!(&inbox.bytes().unwrap()[..LEN], &pattern(LEN, 61)[..]);
    assert!(
        r.is_ok(),
        "the scoped await timed out with its message landed"
    );
}

/// A scoped handle parked with a waker that panics in `drop`, polled again with another waker
/// (the slot replaces it: panic), then spun: the completion comes back once, nothing lost.
#[test]
#[ignore = "needs the testbed VM"]
fn rb_scoped_waker_replaced_panics_then_spin() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    let (e, w) = evil(Site::Drop);
    let _d = e.disarm_on_drop();
    let mut inbox = recv_region(&pd);
    let out = scope(|s| {
        let mut h = s.recv(&b, &mut inbox).unwrap();
        assert!(h.poll_with(&mut Context::from_waker(&w), parked).is_pending());
        e.arm();
        send(&pd, &a, 70);
        let r = catch_unwind(AssertUnwindSafe(|| h.poll_with(&mut noop_cx(), polling_step)));
        let first = match r {
            Ok(Poll::Ready(x)) => format!("ready {:?}", x.map(|wc| wc.byte_len)),
            Ok(Poll::Pending) => "pending".into(),
            Err(_) => "panicked".into(),
        };
        e.disarm();
        let second = h.spin();
        (first, second.map(|wc| wc.byte_len))
    });
    println!("scoped waker replaced: first poll {}, then spin {:?}", out.0, out.1);
    assert_eq!(&inbox.bytes().unwrap()[..LEN], &pattern(LEN, 70)[..]);
    assert_eq!(b.outstanding(), 0);
}
