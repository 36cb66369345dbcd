//! The registration cache on rxe: hits and misses by buffer identity, range and access; a
//! buffer received again as another fd hits; LRU eviction within entry and byte bounds that
//! never touches a region that is checked out (and posted); invalidation, now and on return;
//! the one-owner rule kept. Every region used is checked by RDMA. Runs in the testbed VM.

use drm_export::Udmabuf;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{host_region, loopback_pair, pattern, pd, read_remote};
use rdma_dmabuf::{
    Access, BufferKey, CacheLimits, Checkout, DmaBuf, Error, ProtectionDomain, QueuePair,
    RegistrationCache,
};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);
const PAGE: u64 = 4096;

/// A udmabuf of `size` bytes filled with `pattern(size, seed)` (through its memfd).
fn udmabuf(size: u64, seed: u8) -> DmaBuf {
    let u = Udmabuf::new(size).expect("udmabuf");
    nix::sys::uio::pwrite(u.memfd(), &pattern(size as usize, seed), 0).unwrap();
    u.into_parts().1
}

/// The bytes of `c`'s region, RDMA-read by `peer`.
fn read(pd: &Arc<ProtectionDomain>, peer: &QueuePair, c: &Checkout) -> Vec<u8> {
    read_remote(pd, peer, c.remote().unwrap())
}

fn dup(d: &DmaBuf) -> OwnedFd {
    d.as_fd().try_clone_to_owned().unwrap()
}

#[test]
#[ignore = "needs the testbed VM"]
fn cache_hits_by_identity_range_and_access_and_evicts_least_recently_used() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (peer, _owner) = loopback_pair(&pd);
    let limits = CacheLimits {
        max_bytes: 1 << 20,
        max_entries: 3,
    };
    let cache = RegistrationCache::new(&pd, limits);
    let a = udmabuf(16 * PAGE, 1);
    let a_fd = dup(&a);
    let first = cache.checkout_dmabuf(a, PAGE, 2 * PAGE, None, RW).unwrap();
    let key = first.key();
    let (lkey, rkey) = (first.lkey(), first.rkey());
    let bytes = pattern(16 * PAGE as usize, 1);
    assert_eq!(
        read(&pd, &peer, &first),
        bytes[PAGE as usize..][..2 * PAGE as usize]
    );
    drop(first);

    // The same buffer as another fd (as if received again): a hit, the same registration.
    let again = cache
        .checkout_fd(a_fd.try_clone().unwrap(), PAGE, 2 * PAGE, None, RW)
        .unwrap();
    assert_eq!((again.lkey(), again.rkey(), again.key()), (lkey, rkey, key));
    // While it is out, the same key registers a second region: one region, one holder.
    let second = cache
        .checkout_fd(a_fd.try_clone().unwrap(), PAGE, 2 * PAGE, None, RW)
        .unwrap();
    assert_ne!(second.lkey(), again.lkey());
    let s = cache.stats();
    assert_eq!((s.hits, s.misses, s.entries, s.checked_out), (1, 2, 2, 2));
    drop((again, second));

    // Another range, another access: misses. Past 3 entries, the least recently returned
    // region goes.
    let other = cache
        .checkout_fd(a_fd.try_clone().unwrap(), 0, PAGE, None, RW)
        .unwrap();
    assert_eq!(read(&pd, &peer, &other), bytes[..PAGE as usize]);
    drop(other);
    let ro = cache
        .checkout_fd(
            a_fd.try_clone().unwrap(),
            PAGE,
            2 * PAGE,
            None,
            Access::REMOTE_READ,
        )
        .unwrap();
    drop(ro);
    let s = cache.stats();
    assert_eq!((s.misses, s.entries, s.evictions), (4, 3, 1), "{s:?}");
    // The evicted one was one of the two first regions: the key still hits once.
    let hit = cache
        .checkout_fd(a_fd.try_clone().unwrap(), PAGE, 2 * PAGE, None, RW)
        .unwrap();
    assert_eq!(cache.stats().hits, 2);
    let miss = cache
        .checkout_fd(a_fd.try_clone().unwrap(), PAGE, 2 * PAGE, None, RW)
        .unwrap();
    assert_eq!(cache.stats().misses, 5);
    drop((hit, miss));

    // The cache holds the buffer: a DmaBuf of it outside the cache is refused.
    assert!(matches!(
        DmaBuf::try_from(a_fd.try_clone().unwrap()),
        Err(drm_export::Error::AlreadyOwned { .. })
    ));

    // The byte bound: a region larger than it is deregistered as soon as it comes back.
    let big = udmabuf(512 * PAGE, 3);
    let c = cache.checkout_dmabuf(big, 0, 512 * PAGE, None, RW).unwrap();
    let before = cache.stats();
    drop(c);
    let after = cache.stats();
    assert!(after.bytes <= limits.max_bytes, "{after:?}");
    assert!(after.evictions > before.evictions);

    // Everything of `a` was older than the big region: gone with it, and the buffer released.
    assert_eq!(after.entries, 0, "{after:?}");
    assert!(
        DmaBuf::try_from(a_fd).is_ok(),
        "released with its last region"
    );
}

#[test]
#[ignore = "needs the testbed VM"]
fn cache_never_deregisters_a_checked_out_region_and_invalidates_on_return() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (_peer, owner) = loopback_pair(&pd);
    let cache = RegistrationCache::new(
        &pd,
        CacheLimits {
            max_bytes: 1 << 30,
            max_entries: 1,
        },
    );
    let a = udmabuf(4 * PAGE, 5);
    assert_eq!(a.udmabuf_small_pages(), Some(true));
    let a_fd = dup(&a);
    let id = a.buffer_id();
    let buffer = BufferKey::DmaBuf {
        dev: id.dev,
        ino: id.ino,
    };
    let src = cache.checkout_dmabuf(a, 0, 4 * PAGE, None, RW).unwrap();
    // Posted (moved into the request) while the cache is over its bound and invalidated.
    let dst = host_region(&pd, &[], 4 * PAGE as usize, RW);
    let remote = dst.remote().unwrap();
    let pending = owner.post_write_parts([src], remote, None).unwrap();
    let b = udmabuf(4 * PAGE, 6);
    drop(cache.checkout_dmabuf(b, 0, PAGE, None, RW).unwrap());
    assert_eq!(
        cache.stats().entries,
        1,
        "the returned region was evicted, not the posted one"
    );
    assert_eq!(cache.invalidate(buffer), 0, "nothing of it is in the cache");
    let done = pending.spin().unwrap();
    let [src] = done.parts;
    // The write went through the posted region, untouched by the eviction and invalidation.
    let written = dst.into_inner().unwrap();
    assert!(
        written.as_slice() == pattern(4 * PAGE as usize, 5),
        "written bytes"
    );
    drop(src);
    let s = cache.stats();
    assert_eq!(
        (s.entries, s.invalidations),
        (0, 1),
        "deregistered on return: {s:?}"
    );
    // The next checkout registers afresh (the cache had let the buffer go: it comes back
    // as a DmaBuf of this test's, whose pages it knows).
    let mut a = DmaBuf::try_from(a_fd).unwrap();
    // SAFETY: `a` was made by drm_export's Udmabuf above, which found its pages small.
    unsafe { a.assume_udmabuf_small_pages() };
    let again = cache.checkout_dmabuf(a, 0, 4 * PAGE, None, RW).unwrap();
    assert_eq!(cache.stats().misses, 3);
    drop(again);
    assert_eq!(
        cache.invalidate(buffer),
        1,
        "in the cache: deregistered now"
    );

    // A bad fd is a typed error.
    let (sock, _other) = std::os::unix::net::UnixStream::pair().unwrap();
    assert!(matches!(
        cache.checkout_fd(OwnedFd::from(sock), 0, PAGE, None, RW),
        Err(Error::Adopt(_))
    ));
}
