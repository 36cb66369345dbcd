//! Regions and request handles as they move: a region is one boxed registration (its keys
//! read once at registration, `into_inner` taking the box apart), so these check that its
//! keys are the kernel's and survive moves through posts and threads, that registering,
//! posting, `into_inner` and dropping leak no MR, fd or dma-buf, that a stale rkey is refused,
//! and that a handle (`Pending`, `PartsPending`, a future) dropped in any state releases its
//! region exactly once and never while the NIC may use it, whatever safe code does; memcheck
//! over all of it. Runs in the testbed VM; every test takes a lock, so that those that count MRs or descriptors run alone
//! (the test harness may run several at once).

use integration_tests::counts::{dmabuf_objects, open_fds, rdma_resources};
use integration_tests::evil_waker::{evil, Site};
use integration_tests::injection::{pair, panicked, parked, recv_region, send, LEN, T};
use integration_tests::process::{alone, test_name, valgrind_self};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{deep_pair, host_region, pattern, pd};
use rdma_dmabuf::{scope, Access, HostBuffer, Local, MemoryRegion, RegistrationCache};
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

// ---------------------------------------------------------------------------------------
// ---------------------------------------------------------------------------------------
// 1. MemoryRegion as one Box<Registration>
// ---------------------------------------------------------------------------------------

/// The cached keys are the MR's keys as the kernel lists them (`rdma resource show mr`), and
/// they work: a write with `remote()` lands and a send with `lkey()` goes out.
#[test]
#[ignore = "needs the testbed VM"]
fn cached_keys_are_the_kernels_keys_and_work() {
    let _l = alone();
    let tb = Testbed::get();
    let pd = pd(&tb);
    let len = 12_345usize; // an unusual length, to find the MR in the listing
    let mr = host_region(&pd, &[], len, RW);
    let out = std::process::Command::new("rdma")
        .args(["resource", "show", "mr"])
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&out.stdout).to_string();
    println!("{listing}");
    let line = listing
        .lines()
        .find(|l| l.contains(&format!("mrlen {}", mr.len())))
        .unwrap_or_else(|| panic!("MR of {len} bytes not listed:\n{listing}"));
    if line.contains("rkey") {
        assert!(
            line.contains(&format!("rkey 0x{:x}", mr.rkey())),
            "rkey {:#x} vs {line}",
            mr.rkey()
        );
        assert!(
            line.contains(&format!("lkey 0x{:x}", mr.lkey())),
            "lkey {:#x} vs {line}",
            mr.lkey()
        );
    }
    // Use them.
    let (a, b) = deep_pair(&pd);
    let want = pattern(len, 3);
    let src = host_region(&pd, &want, len, Access::empty());
    let remote = mr.remote().unwrap();
    a.post_write(Local::new(src, 0..len as u64), remote, None)
        .unwrap()
        .spin()
        .unwrap();
    let got = mr.into_inner().unwrap();
    assert_eq!(&got.as_slice()[..len], &want[..]);
    drop(b);
}

/// A region that moved through many owned posts (each a move of the box into the ticket and
/// back) keeps its keys, address and bytes; a re-registration of the same buffer gets fresh
/// keys and the old rkey no longer reaches the buffer.
#[test]
#[ignore = "needs the testbed VM"]
fn keys_survive_moves_and_a_stale_rkey_is_refused_after_into_inner() {
    let _l = alone();
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = deep_pair(&pd);
    let mut src = host_region(&pd, &pattern(4096, 9), 4096, Access::empty());
    let keys = (src.lkey(), src.rkey(), src.addr(), src.len());
    let mut dst = host_region(&pd, &[], 4096, RW);
    let remote = dst.remote().unwrap();
    for i in 0..200u64 {
        let done = a
            .post_write(Local::new(src, (i % 7)..4096), remote, None)
            .unwrap()
            .spin()
            .unwrap();
        src = done.region;
        assert_eq!((src.lkey(), src.rkey(), src.addr(), src.len()), keys);
    }
    // Re-register the target: the old rkey must not reach the new registration's bytes
    // unless the provider happens to give the same key (then nothing is stale).
    let buf = dst.into_inner().unwrap();
    let zeroed = {
        let mut buf = buf;
        buf.as_mut_slice().fill(0);
        buf
    };
    dst = MemoryRegion::register(&pd, zeroed, RW).unwrap();
    let fresh = dst.remote().unwrap();
    println!("old rkey {:#x}, new rkey {:#x}", remote.rkey, fresh.rkey);
    assert_eq!(dst.rkey(), fresh.rkey);
    let r = a
        .post_write(Local::new(src, 0..4096), remote, None)
        .unwrap()
        .spin();
    if remote.rkey != fresh.rkey {
        assert!(r.is_err(), "a write with a deregistered rkey succeeded");
        // An RC write error moves the queue pair to the error state.
        let buf = dst.into_inner().unwrap();
        assert!(
            buf.as_slice().iter().all(|&x| x == 0),
            "the stale rkey wrote"
        );
    }
    drop(b);
}

/// into_inner and drop, for every backing, through owned posts, abandoned handles and the
/// cache: no MR, descriptor or dma-buf stays behind, and every buffer comes back once.
#[test]
#[ignore = "needs the testbed VM"]
fn regions_through_posts_into_inner_and_drop_leak_nothing() {
    let _l = alone();
    let tb = Testbed::get();
    let pd = pd(&tb);
    drop(deep_pair(&pd));
    let (fds, mrs, bufs) = (open_fds(), rdma_resources("mr"), dmabuf_objects());
    {
        let (a, b) = deep_pair(&pd);
        let mut abandoned = Vec::new();
        for exporter in integration_tests::exporters::ALL {
            let mut buf = exporter.allocate(1 << 16);
            for round in 0..30 {
                let mr = MemoryRegion::register_dmabuf(&pd, buf, 0, 1 << 16, None, RW).unwrap();
                // Through a post and back, then out.
                let recv = b.post_recv(Local::new(mr, 0..4096)).unwrap();
                let src = host_region(&pd, &pattern(100, round), 100, Access::empty());
                a.post_send(src, None).unwrap().spin().unwrap();
                let done = recv.spin().unwrap();
                buf = done.region.into_inner().unwrap();
            }
            let got = integration_tests::exporters::Exporter::read(&mut buf);
            assert_eq!(&got[..100], &pattern(100, 29)[..], "{exporter:?}");
            abandoned.push(buf);
        }
        // Host regions, dropped plainly, into_inner'd, and dropped inside a failed post.
        for _ in 0..100 {
            drop(host_region(&pd, &[], 4096, RW));
            let h = host_region(&pd, &[], 4096, RW).into_inner().unwrap();
            drop(h);
            // A post refused (range past the end): the region comes back in the error.
            let e = a
                .post_send(
                    Local::new(host_region(&pd, &[], 4096, Access::empty()), 0..4097),
                    None,
                )
                .expect_err("range past the end");
            drop(e);
        }
        // A cache: checkouts through posts, invalidated, cleared.
        let cache = RegistrationCache::new(&pd, Default::default());
        let dmabuf = integration_tests::exporters::Exporter::Udmabuf.allocate(1 << 16);
        let id = dmabuf.buffer_id();
        let c = cache
            .checkout_dmabuf(dmabuf, 0, 1 << 16, None, Access::LOCAL_WRITE)
            .unwrap();
        let keys = (c.lkey(), c.rkey());
        let mut c = Some(c);
        for _ in 0..20 {
            let recv = b
                .post_recv_parts([c.take().unwrap()])
                .map_err(|e| e.error)
                .unwrap();
            a.post_send(host_region(&pd, b"x", 1, Access::empty()), None)
                .unwrap()
                .spin()
                .unwrap();
            let done = recv.spin().map_err(|e| e.error).unwrap();
            let [back] = done.parts;
            assert_eq!(
                (back.lkey(), back.rkey()),
                keys,
                "a checkout's keys changed"
            );
            c = Some(back);
        }
        drop(c);
        cache.invalidate(rdma_dmabuf::BufferKey::DmaBuf {
            dev: id.dev,
            ino: id.ino,
        });
        cache.clear();
        drop(cache);
        // Regions dropped while their receives are abandoned in the queue: freed when the
        // queue pair goes.
        for buf in abandoned {
            let mr = MemoryRegion::register_dmabuf(&pd, buf, 0, 1 << 16, None, RW).unwrap();
            drop(b.post_recv(mr).unwrap());
        }
        drop((a, b));
    }
    assert_eq!(rdma_resources("mr"), mrs, "memory regions");
    assert_eq!(open_fds(), fds, "descriptors");
    assert_eq!(dmabuf_objects(), bufs, "dma-bufs");
}

/// Regions sent to other threads (Send) and shared by reference across threads (Sync) while
/// others register and deregister: keys read concurrently stay right.
#[test]
#[ignore = "needs the testbed VM"]
fn regions_cross_threads_and_keep_their_keys() {
    let _l = alone();
    let tb = Testbed::get();
    let pd = pd(&tb);
    let shared = Arc::new(host_region(&pd, &[], 4096, Access::LOCAL_WRITE));
    let keys = (shared.lkey(), shared.rkey(), shared.addr());
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let pd = pd.clone();
            let shared = shared.clone();
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                for i in 0..200 {
                    assert_eq!((shared.lkey(), shared.rkey(), shared.addr()), keys);
                    mine.push(host_region(&pd, &[], 4096, RW));
                    if i % 3 == 0 {
                        let r = mine.swap_remove(0);
                        let _ = r.into_inner().unwrap();
                    }
                }
                mine
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.join().unwrap());
    }
    // Moved back to this thread: each still has keys distinct from the others.
    let mut lkeys: Vec<u32> = all.iter().map(|r| r.lkey()).collect();
    lkeys.sort_unstable();
    lkeys.dedup();
    assert_eq!(lkeys.len(), all.len(), "two live regions share an lkey");
    drop(all);
}

// ---------------------------------------------------------------------------------------
// 3. Ticket's Drop
// ---------------------------------------------------------------------------------------

/// Pending and PartsPending dropped before completion, after completion (unpolled), after
/// their futures resolved, and with an armed waker that panics in `drop`: each region is
/// released exactly once, and none while the NIC may use it.
#[test]
#[ignore = "needs the testbed VM"]
fn tickets_dropped_in_every_state_release_each_region_once() {
    let _l = alone();
    let tb = Testbed::get();
    let pd = pd(&tb);
    let mrs = rdma_resources("mr");
    {
        let (a, b) = pair(&pd);
        // Before completion: the region stays; it lands, and is freed by the next poll.
        let r = b.post_recv(recv_region(&pd)).unwrap();
        drop(r);
        assert_eq!(rdma_resources("mr"), mrs + 1);
        send(&pd, &a, 1);
        b.poll().unwrap();
        assert_eq!(b.outstanding(), 0);
        assert_eq!(rdma_resources("mr"), mrs, "freed once the completion came");
        // After completion, unpolled: dropped at once.
        let r = b.post_recv(recv_region(&pd)).unwrap();
        send(&pd, &a, 2);
        std::thread::sleep(Duration::from_millis(100));
        // The slot learns of the completion by a poll of b's CQ (not this handle's).
        b.poll().unwrap();
        drop(r);
        assert_eq!(b.outstanding(), 0);
        assert_eq!(rdma_resources("mr"), mrs);
        // PartsPending, before completion.
        let p = b
            .post_recv_parts([
                Local::new(recv_region(&pd), 0..32),
                Local::new(recv_region(&pd), 0..32),
            ])
            .map_err(|e| e.error)
            .unwrap();
        drop(p);
        assert_eq!(rdma_resources("mr"), mrs + 2);
        send(&pd, &a, 3);
        b.poll().unwrap();
        assert_eq!(rdma_resources("mr"), mrs);
        // A future resolved, then dropped (lent already taken: the inline test only).
        let mut r = b.post_recv(recv_region(&pd)).unwrap();
        send(&pd, &a, 4);
        let mut cx = Context::from_waker(Waker::noop());
        let deadline = Instant::now() + T;
        loop {
            if let Poll::Ready(o) = r.poll_with(&mut cx, parked) {
                let d = o.unwrap();
                assert_eq!(&d.region.bytes().unwrap()[..LEN], &pattern(LEN, 4)[..]);
                break;
            }
            assert!(Instant::now() < deadline);
        }
        // Polled again after it resolved: a documented panic, nothing released twice.
        assert!(panicked(|| {
            let _ = r.poll_with(&mut cx, parked);
        }));
        drop(r);
        assert_eq!(rdma_resources("mr"), mrs);
        // A waker that panics in `drop`, the handle dropped before completion.
        let (e, w) = evil(Site::Drop);
        let disarm = e.disarm_on_drop();
        let r = b.post_recv(recv_region(&pd)).unwrap();
        r.register_waker(&w);
        drop(w);
        e.arm();
        assert!(panicked(move || drop(r)), "the waker's drop panicked");
        e.disarm();
        assert_eq!(b.outstanding(), 1, "the region is in the slot");
        assert_eq!(rdma_resources("mr"), mrs + 1);
        send(&pd, &a, 5);
        b.poll().unwrap();
        assert_eq!(rdma_resources("mr"), mrs);
        // The same, completed before the drop.
        let r = b.post_recv(recv_region(&pd)).unwrap();
        let (e2, w2) = evil(Site::Drop);
        let _disarm2 = e2.disarm_on_drop();
        r.register_waker(&w2);
        drop(w2);
        send(&pd, &a, 6);
        std::thread::sleep(Duration::from_millis(100));
        b.poll().unwrap();
        e2.arm();
        // The poll that recorded the completion already woke (and so gave up) the waker:
        // the drop finds none to drop, so nothing panics here.
        assert!(!panicked(move || drop(r)));
        e2.disarm();
        assert_eq!(b.outstanding(), 0);
        assert_eq!(rdma_resources("mr"), mrs, "freed before the waker panicked");
        drop(disarm);
        // Abandoned, never completed: freed when the queue pair goes.
        drop(b.post_recv(recv_region(&pd)).unwrap());
        drop(b.post_recv(recv_region(&pd)).unwrap());
        assert_eq!(rdma_resources("mr"), mrs + 2);
        drop((a, b));
    }
    assert_eq!(rdma_resources("mr"), mrs);
}

/// Owned futures awaited in tokio and dropped mid-flight (a timeout), many times, on a
/// queue pair with a completion channel: the slots are reused by later posts, and no later
/// request gets an earlier one's completion or region.
#[test]
#[ignore = "needs the testbed VM"]
fn owned_futures_dropped_mid_flight_never_mix_up_slots() {
    let _l = alone();
    let tb = Testbed::get();
    let pd = pd(&tb);
    let mrs = rdma_resources("mr");
    {
        let (a, b) = pair(&pd);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            for round in 0..20u8 {
                // A receive that times out (future dropped: region left in the slot).
                let r = b.post_recv(recv_region(&pd)).unwrap();
                assert!(tokio::time::timeout(Duration::from_millis(2), r)
                    .await
                    .is_err());
                // Its message comes; then a fresh receive must get the *next* message.
                let src = host_region(&pd, &pattern(LEN, round), LEN, Access::empty());
                a.post_send(src, Some(round as u32 * 2))
                    .unwrap()
                    .await
                    .unwrap();
                let r2 = b.post_recv(recv_region(&pd)).unwrap();
                let src = host_region(&pd, &pattern(LEN, round + 100), LEN, Access::empty());
                let s = a.post_send(src, Some(round as u32 * 2 + 1)).unwrap();
                let (sd, rd) = tokio::join!(s, r2);
                sd.unwrap();
                let rd = rd.unwrap();
                assert_eq!(rd.wc.imm, Some(round as u32 * 2 + 1), "round {round}");
                assert_eq!(
                    &rd.region.bytes().unwrap()[..LEN],
                    &pattern(LEN, round + 100)[..]
                );
            }
        });
        b.poll().unwrap();
        assert_eq!(b.outstanding(), 0);
        drop((a, b));
    }
    assert_eq!(rdma_resources("mr"), mrs);
}

/// PartsPending futures are not futures of their own here; poll_with of a batch/parts
/// handle dropped after one Pending poll, then completed by a message.
#[test]
#[ignore = "needs the testbed VM"]
fn parts_pending_polled_once_then_dropped_then_completed() {
    let _l = alone();
    let tb = Testbed::get();
    let pd = pd(&tb);
    let mrs = rdma_resources("mr");
    {
        let (a, b) = pair(&pd);
        for i in 0..10u8 {
            let mut p = b
                .post_recv_parts([
                    Local::new(recv_region(&pd), 0..32),
                    Local::new(recv_region(&pd), 0..32),
                ])
                .map_err(|e| e.error)
                .unwrap();
            let mut cx = Context::from_waker(Waker::noop());
            assert!(p.poll_with(&mut cx, parked).is_pending());
            drop(p);
            send(&pd, &a, i);
        }
        b.poll().unwrap();
        assert_eq!(b.outstanding(), 0);
        assert_eq!(rdma_resources("mr"), mrs, "all freed on completion");
        drop((a, b));
    }
    assert_eq!(rdma_resources("mr"), mrs);
}

/// Everything above that moves regions and drops tickets, again under valgrind's memcheck
/// (use-after-free or double free of the boxed registration, the entries or the slots).
#[test]
#[ignore = "needs the testbed VM"]
fn under_valgrind_boxed_regions_scopes_and_tickets_have_no_memory_error() {
    let _l = alone();
    Testbed::get();
    valgrind_self(&["--exact", &test_name(module_path!(), "valgrind_body")], 1);
}

/// The body run under valgrind (it also runs on its own).
#[test]
#[ignore = "needs the testbed VM"]
fn valgrind_body() {
    let _l = alone();
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = deep_pair(&pd);
    // Regions: moves through posts, into_inner, failed posts.
    let mut src = host_region(&pd, &pattern(256, 1), 256, Access::empty());
    let mut dst = host_region(&pd, &[], 256, RW);
    for _ in 0..5 {
        src = a
            .post_write(Local::new(src, 0..256), dst.remote().unwrap(), None)
            .unwrap()
            .spin()
            .unwrap()
            .region;
    }
    let e = a
        .post_send(Local::new(src, 0..4097), None)
        .expect_err("past the end");
    let buf = e.region.into_inner().unwrap();
    assert_eq!(&buf.as_slice()[..256], &pattern(256, 1)[..]);
    dst = MemoryRegion::register(&pd, dst.into_inner().unwrap(), RW).unwrap();
    drop(dst);
    // Scopes with 12 posts, a dropped handle and a panic.
    let mut inb: Vec<_> = (0..12)
        .map(|_| host_region(&pd, &[], 64, Access::LOCAL_WRITE))
        .collect();
    let msg = host_region(&pd, &pattern(64, 2), 64, Access::empty());
    let hit = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        scope(|s| {
            let hs: Vec<_> = inb.iter_mut().map(|r| s.recv(&b, r).unwrap()).collect();
            for _ in 0..10 {
                s.send(&a, &msg, None).unwrap();
            }
            for h in hs.into_iter().take(10) {
                h.spin().unwrap();
            }
            panic!("unwinding with two receives left");
        })
    }));
    assert!(hit.is_err());
    // Tickets: dropped before and after completion.
    let (c, d) = pair(&pd);
    drop(d.post_recv(recv_region(&pd)).unwrap());
    send(&pd, &c, 1);
    let r = d.post_recv(recv_region(&pd)).unwrap();
    send(&pd, &c, 2);
    std::thread::sleep(Duration::from_millis(50));
    drop(r);
    drop(d.post_recv(recv_region(&pd)).unwrap());
    drop((c, d));
    let _ = HostBuffer::new(1).unwrap();
    let _unused: Option<&dyn Future<Output = ()>> = None;
}
