//! The registration cache's safe CUDA checkout (`RegistrationCache::checkout_cuda`) and the
//! split of a checkout into shards (`Checkout::split`, `Lent::join`), on rxe with the
//! stand-in libcuda (memfd + udmabuf "device memory": this project's code, not NVIDIA's
//! driver) and udmabufs. Every region used is checked by RDMA. Runs in the testbed VM.

use drm_export::{CudaRefusal, Udmabuf};
use integration_tests::cuda_standin::{standin, vouched_device, Kind};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{loopback_pair, pattern, pd, read_remote};
use rdma_dmabuf::{
    Access, BufferKey, CacheLimits, DmaBuf, Error, RegistrationCache, Shard, SharedDmaBuf,
};
use std::os::fd::AsFd;

const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);
const PAGE: u64 = 4096;

#[test]
#[ignore = "needs the testbed VM"]
fn a_cuda_range_checked_out_again_is_a_hit_and_a_reused_address_a_miss() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (peer, _owner) = loopback_pair(&pd);
    let s = standin();
    let dev = vouched_device();
    let cache = RegistrationCache::new(&pd, CacheLimits::default());
    let size = 16 * PAGE as usize;
    let (at, len) = (100u64, 3 * PAGE + 5);
    let base = s.alloc(size, 1, Kind::Device);
    let ptr = base + at;
    s.write(base, &pattern(size, 1));
    let want = |seed| pattern(size, seed)[at as usize..][..len as usize].to_vec();

    let c = cache.checkout_cuda(&dev, ptr, len, RW).unwrap();
    let key = c.key();
    assert_eq!(
        key.buffer,
        BufferKey::Cuda {
            buffer_id: dev.pointer_info(ptr).unwrap().buffer_id
        }
    );
    assert_eq!((key.offset, key.len, key.iova), (ptr, len, ptr));
    assert_eq!((c.addr(), c.len()), (ptr, len), "iova = ptr");
    assert_eq!(read_remote(&pd, &peer, c.remote().unwrap()), want(1));
    let keys = (c.lkey(), c.rkey());
    drop(c);

    let again = cache.checkout_cuda(&dev, ptr, len, RW).unwrap();
    let st = cache.stats();
    assert_eq!((st.hits, st.misses), (1, 1), "the second checkout hits");
    assert_eq!((again.lkey(), again.rkey()), keys, "the same registration");
    assert_eq!(read_remote(&pd, &peer, again.remote().unwrap()), want(1));
    drop(again);

    // Freed and allocated again at the same address: a new buffer id, registered afresh,
    // with the new allocation's bytes.
    s.free(base);
    let second = s.alloc(size, 1, Kind::Device);
    assert_eq!(second, base, "the stand-in reuses the address");
    s.write(second, &pattern(size, 2));
    let fresh = cache.checkout_cuda(&dev, ptr, len, RW).unwrap();
    assert_eq!(cache.stats().misses, 2, "registered afresh");
    assert_ne!(fresh.key(), key);
    assert_eq!(read_remote(&pd, &peer, fresh.remote().unwrap()), want(2));
    drop(fresh);
    s.free(second);
}

#[test]
#[ignore = "needs the testbed VM"]
fn cuda_ranges_across_seams_past_their_allocation_or_freed_are_refused_typed() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let s = standin();
    let dev = vouched_device();
    let cache = RegistrationCache::new(&pd, CacheLimits::default());
    let size = 1u64 << 20;
    // Four cuMemMapped parts of 256 KiB under one virtual range: each is an allocation.
    let (mapped, quarter) = (s.alloc(size as usize, 4, Kind::Device), size / 4);
    // export_range takes a range across the seams; the cache cannot key it on one id.
    assert!(dev.export_range(mapped + quarter - 7, 20).is_ok());
    for (ptr, len, what) in [
        (mapped + quarter - 7, 20, "across one seam"),
        (mapped, size, "all four parts"),
        (mapped + 5, 0, "empty"),
    ] {
        match cache.checkout_cuda(&dev, ptr, len, RW) {
            Err(Error::CudaRangeNotOneAllocation {
                ptr: p,
                len: l,
                alloc_size,
                ..
            }) => {
                assert_eq!((p, l, alloc_size), (ptr, len, quarter), "{what}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    // Inside one part: cached.
    let inside = cache
        .checkout_cuda(&dev, mapped + quarter + 8, quarter - 8, RW)
        .unwrap();
    assert_eq!(inside.addr(), mapped + quarter + 8);
    drop(inside);

    let plain = s.alloc(size as usize, 1, Kind::Device);
    s.free(plain);
    match cache.checkout_cuda(&dev, plain + 64, 64, RW) {
        Err(Error::Export(e)) => assert!(
            matches!(
                *e,
                drm_export::Error::CudaPointer {
                    why: CudaRefusal::NotCudaMemory { .. },
                    ..
                }
            ),
            "{e}"
        ),
        other => panic!("freed memory: {other:?}"),
    }
    let host = s.alloc(PAGE as usize, 1, Kind::Host);
    assert!(matches!(
        cache.checkout_cuda(&dev, host, 64, RW),
        Err(Error::Export(e)) if matches!(*e, drm_export::Error::CudaPointer { why: CudaRefusal::HostMemory, .. })
    ));
    let st = cache.stats();
    assert_eq!(
        (st.misses, st.entries),
        (1, 1),
        "nothing else registered: {st:?}"
    );
    s.free(mapped);
    s.free(host);
}

/// A udmabuf of `size` bytes filled with `pattern(size, seed)`, and a second fd of it.
fn udmabuf(size: u64, seed: u8) -> (DmaBuf, std::os::fd::OwnedFd) {
    let u = Udmabuf::new(size).expect("udmabuf");
    nix::sys::uio::pwrite(u.memfd(), &pattern(size as usize, seed), 0).unwrap();
    let d = u.into_parts().1;
    let fd = d.as_fd().try_clone_to_owned().unwrap();
    (d, fd)
}

fn ranges(n: u64, each: u64) -> Vec<std::ops::Range<u64>> {
    (0..n).map(|i| i * each..(i + 1) * each).collect()
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_split_checkout_comes_back_only_whole_and_only_to_its_own_lent() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (peer, _owner) = loopback_pair(&pd);
    let cache = RegistrationCache::new(&pd, CacheLimits::default());
    let (a, _) = udmabuf(8 * PAGE, 1);
    let (b, _) = udmabuf(8 * PAGE, 2);
    let ca = cache.checkout_dmabuf(a, 0, 8 * PAGE, None, RW).unwrap();
    let cb = cache.checkout_dmabuf(b, 0, 8 * PAGE, None, RW).unwrap();
    let (key_a, keys_a) = (ca.key(), (ca.lkey(), ca.rkey()));

    // Bad ranges: refused, the checkout back.
    let ca = ca
        .split([0..PAGE, PAGE - 1..2 * PAGE])
        .unwrap_err()
        .checkout;
    assert_eq!(ca.key(), key_a);
    let (sa, lent_a) = ca.split(ranges(4, 2 * PAGE)).unwrap();
    let (sb, lent_b) = cb.split(ranges(2, 4 * PAGE)).unwrap();
    // Each shard reaches its own bytes.
    let want = pattern(8 * PAGE as usize, 1);
    for sh in &sa {
        let r = sh.range();
        assert_eq!(
            read_remote(&pd, &peer, sh.remote().unwrap()),
            want[r.start as usize..r.end as usize]
        );
    }

    // A checkout's shards never give the region itself back.
    let e = Shard::join(sa).unwrap_err();
    assert!(e.error.to_string().contains("Lent::join"), "{}", e.error);
    let mut sa = e.shards;
    // Not to another checkout's Lent: b's region under a's key.
    let e = lent_a.join(sb).unwrap_err();
    assert!(
        e.error.to_string().contains("another region"),
        "{}",
        e.error
    );
    let (lent_a, sb) = (e.lent, e.shards);
    // Nor with a shard missing.
    let last: Shard<SharedDmaBuf> = sa.pop().unwrap();
    let e = lent_a.join(sa).unwrap_err();
    assert!(e.error.to_string().contains("elsewhere"), "{}", e.error);
    let (lent_a, mut sa) = (e.lent, e.shards);
    sa.push(last);
    // Whole, to its own Lent: the same checkout, back in the cache when dropped.
    let ca = lent_a.join(sa).unwrap();
    assert_eq!(
        (ca.key(), ca.lkey(), ca.rkey()),
        (key_a, keys_a.0, keys_a.1)
    );
    assert_eq!(read_remote(&pd, &peer, ca.remote().unwrap()), want);
    let cb = lent_b.join(sb).unwrap();
    drop((ca, cb));
    let st = cache.stats();
    assert_eq!((st.entries, st.checked_out), (2, 0), "{st:?}");
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_lent_dropped_unjoined_leaves_the_cache_and_its_shards_deregister_the_region() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (peer, _owner) = loopback_pair(&pd);
    let cache = RegistrationCache::new(&pd, CacheLimits::default());
    let (a, a_fd) = udmabuf(8 * PAGE, 4);
    let c = cache.checkout_dmabuf(a, 0, 8 * PAGE, None, RW).unwrap();
    let (shards, lent) = c.split(ranges(2, 4 * PAGE)).unwrap();
    let st = cache.stats();
    assert_eq!((st.entries, st.checked_out, st.bytes), (1, 1, 8 * PAGE));
    drop(lent);
    let st = cache.stats();
    assert_eq!(
        (st.entries, st.checked_out, st.bytes),
        (0, 0, 0),
        "no longer the cache's: {st:?}"
    );
    // The shards still work, and hold the registration (and its dma-buf) until dropped.
    assert_eq!(
        read_remote(&pd, &peer, shards[1].remote().unwrap()),
        pattern(8 * PAGE as usize, 4)[4 * PAGE as usize..]
    );
    assert!(matches!(
        DmaBuf::try_from(a_fd.try_clone().unwrap()),
        Err(drm_export::Error::AlreadyOwned { .. })
    ));
    drop(shards);
    // Deregistered with the last shard: the dma-buf was closed with it.
    assert!(DmaBuf::try_from(a_fd).is_ok(), "released with its region");
    assert_eq!(cache.stats().entries, 0);
}
