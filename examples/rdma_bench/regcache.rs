//! `rdma_bench cache`: what a registration costs fresh and from rdma-dmabuf's
//! [`RegistrationCache`], per size, in one run. Fresh is what a program without a cache pays
//! for each use of a buffer: `ibv_reg_dmabuf_mr` then `ibv_dereg_mr`. Cached is a checkout
//! that hits and its return (a lock, a hash lookup). One dma-buf per size, made before the
//! clock starts.

use crate::Run;
use examples::fail;
use examples::kinds::Allocator;
use rdma_dmabuf::{Access, BufferKey, CacheKey, CacheLimits, MemoryRegion, ProtectionDomain};
use rdma_dmabuf::{DmaBuf, RegistrationCache};
use std::sync::Arc;
use std::time::Instant;

/// The sizes measured.
const SIZES: [usize; 4] = [4 << 10, 64 << 10, 1 << 20, 16 << 20];

fn median(v: &mut [u64]) -> f64 {
    v.sort_unstable();
    v[v.len() / 2] as f64 / 1e3
}

/// Medians of `run.iters` fresh registrations and of as many cached checkouts, per size.
pub fn run(pd: &Arc<ProtectionDomain>, alloc: &Allocator, run: &Run) {
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let cache = RegistrationCache::new(pd, CacheLimits::default());
    println!(" #bytes    fresh[usec]  cached[usec]  fresh/cached");
    for size in SIZES {
        let len = size as u64;
        let mut fresh_ns = Vec::with_capacity(run.iters);
        let mut buf: DmaBuf = alloc.dmabuf(size).unwrap_or_else(|e| fail(&e));
        for _ in 0..run.iters {
            let t0 = Instant::now();
            let mr = MemoryRegion::register_dmabuf(pd, buf, 0, len, None, access)
                .unwrap_or_else(|e| fail(&e.to_string()));
            buf = mr.into_inner().unwrap_or_else(|e| fail(&e.to_string()));
            fresh_ns.push(t0.elapsed().as_nanos() as u64);
        }
        let drm_export::BufferId { dev, ino } = buf.buffer_id();
        let key = CacheKey {
            buffer: BufferKey::DmaBuf { dev, ino },
            offset: 0,
            len,
            iova: 0,
            access,
        };
        let mut buf = Some(buf);
        let export = |b: &mut Option<DmaBuf>| {
            b.take()
                .map(|d| (d, 0))
                .ok_or_else(|| rdma_dmabuf::Error::InvalidArgument {
                    op: rdma_dmabuf::Op::RegDmabufMr,
                    what: "a second miss".into(),
                })
        };
        drop(
            cache
                .checkout_with(key, || export(&mut buf))
                .unwrap_or_else(|e| fail(&e.to_string())),
        );
        let mut cached_ns = Vec::with_capacity(run.iters);
        for _ in 0..run.iters {
            let t0 = Instant::now();
            let c = cache
                .checkout_with(key, || export(&mut buf))
                .unwrap_or_else(|e| fail(&e.to_string()));
            drop(c);
            cached_ns.push(t0.elapsed().as_nanos() as u64);
        }
        let (fresh, cached) = (median(&mut fresh_ns), median(&mut cached_ns));
        println!(
            " {size:<9} {fresh:<12.2} {cached:<13.3} {:.0}",
            fresh / cached
        );
        println!(
            "RESULT size={size} fresh_usec={fresh:.3} cached_usec={cached:.4} ratio={:.0} region={}",
            fresh / cached,
            run.kind.name()
        );
    }
    let s = cache.stats();
    assert_eq!(s.misses, SIZES.len() as u64, "one registration per size");
}
