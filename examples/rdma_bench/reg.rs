//! Registration time: `ibv_reg_mr` or `ibv_reg_dmabuf_mr`, then `ibv_dereg_mr`, of one region
//! at a time, each over a fresh buffer whose pages the CPU has already written.

use crate::Run;
use examples::fail;
use examples::kinds::{Allocator, RegionKind};
use rdma_dmabuf::{Access, MemoryRegion, ProtectionDomain};
use std::sync::Arc;
use std::time::Instant;

/// Registers and deregisters `run.iters` regions of `run.size` bytes, timing each call, and
/// prints the medians.
pub fn run(pd: &Arc<ProtectionDomain>, alloc: &Allocator, run: &Run) {
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let mut reg_ns: Vec<u64> = Vec::with_capacity(run.iters);
    let mut dereg_ns: Vec<u64> = Vec::with_capacity(run.iters);
    for _ in 0..run.iters {
        let (reg, dereg) = if alloc.kind() == RegionKind::Host {
            let buf = alloc.host(run.size).unwrap_or_else(|e| fail(&e));
            let t0 = Instant::now();
            let mr =
                MemoryRegion::register(pd, buf, access).unwrap_or_else(|e| fail(&e.to_string()));
            let t1 = Instant::now();
            let buf = mr.into_inner().unwrap_or_else(|e| fail(&e.to_string()));
            let t2 = Instant::now();
            drop(buf);
            (t1 - t0, t2 - t1)
        } else {
            let buf = alloc.dmabuf(run.size).unwrap_or_else(|e| fail(&e));
            let t0 = Instant::now();
            let mr = MemoryRegion::register_dmabuf(pd, buf, 0, run.size as u64, None, access)
                .unwrap_or_else(|e| fail(&e.to_string()));
            let t1 = Instant::now();
            let buf = mr.into_inner().unwrap_or_else(|e| fail(&e.to_string()));
            let t2 = Instant::now();
            drop(buf);
            (t1 - t0, t2 - t1)
        };
        reg_ns.push(reg.as_nanos() as u64);
        dereg_ns.push(dereg.as_nanos() as u64);
    }
    let median = |v: &mut Vec<u64>| {
        v.sort_unstable();
        v[v.len() / 2] as f64 / 1e3
    };
    let (reg, dereg) = (median(&mut reg_ns), median(&mut dereg_ns));
    println!(
        " #bytes  #iterations  reg[usec]  dereg[usec]\n {:<7} {:<12} {reg:<10.2} {dereg:.2}",
        run.size, run.iters
    );
    println!(
        "RESULT reg_usec={reg:.3} dereg_usec={dereg:.3} region={}",
        run.kind.name()
    );
}
