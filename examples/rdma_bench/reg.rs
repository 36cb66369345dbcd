//! Registration time: `ibv_reg_mr` or `ibv_reg_dmabuf_mr`, then `ibv_dereg_mr`, of one region
//! at a time, each over a fresh buffer whose pages the CPU has already written.
//!
//! `--hold-map yes` keeps a CPU mapping of each dma-buf open across its registration and
//! deregistration (made before the clock starts, closed after it stops). For a GEM-shmem
//! exporter such as vgem the mapping holds the object's pages, so the registration's pin
//! finds them held, as it would while a program keeps the buffer mapped or while another
//! importer holds it; without it, the pin gets the pages back from shmem and, on x86, turns
//! them write-combined in the kernel's linear map, and the deregistration turns them back.

use crate::Run;
use examples::fail;
use examples::kinds::{Allocator, RegionKind};
use rdma_dmabuf::{Access, MemoryRegion, ProtectionDomain};
use std::os::fd::{AsFd, AsRawFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Instant;

/// A read-only shared mapping of a dma-buf, unmapped on drop. It holds its own reference to
/// the buffer (the mapping's file), so it may outlive the `DmaBuf` it was made from.
struct HeldMap {
    addr: NonNull<libc::c_void>,
    len: usize,
}

impl HeldMap {
    fn new(fd: impl AsFd, len: usize) -> HeldMap {
        // SAFETY: a new mapping chosen by the kernel (no address given), of a live fd; nothing
        // is read through it.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_fd().as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            fail(&format!(
                "--hold-map: mmap of the dma-buf: {}",
                std::io::Error::last_os_error()
            ));
        }
        let addr = NonNull::new(addr).unwrap_or_else(|| fail("--hold-map: mmap gave address 0"));
        HeldMap { addr, len }
    }
}

impl Drop for HeldMap {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, of `len` bytes, unmapped once; no reference into it
        // exists (nothing ever reads through it).
        unsafe { libc::munmap(self.addr.as_ptr(), self.len) };
    }
}

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
            let held = run.hold_map.then(|| HeldMap::new(&buf, run.size));
            let t0 = Instant::now();
            let mr = MemoryRegion::register_dmabuf(pd, buf, 0, run.size as u64, None, access)
                .unwrap_or_else(|e| fail(&e.to_string()));
            let t1 = Instant::now();
            let buf = mr.into_inner().unwrap_or_else(|e| fail(&e.to_string()));
            let t2 = Instant::now();
            drop(buf);
            drop(held);
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
