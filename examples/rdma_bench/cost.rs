//! `rdma_bench cost`: the user-space work of one RDMA write, post and completion, in a form
//! that an instruction counter measures exactly (valgrind's callgrind, run with
//! `--collect-atstart=no --toggle-collect='*measured_*'`).
//!
//! Two queue pairs of this process talk over the device's loopback; each iteration writes
//! `--size` bytes. The waiting is kept out of the measured functions, so that the count does
//! not depend on how long the NIC took: the completion channel is armed before the post, the
//! process sleeps on it until the completion is in the queue, and only then is the request
//! completed, with exactly one poll of the completion queue. What is counted per write: the
//! post (`measured_post*`) and that completion (`measured_complete*`). `--series` picks the
//! layer: `owned` (`post_write`, `try_complete`), `scoped` (`Scope::write`, its `spin`),
//! `awaited` (`post_write`, one poll of the `Pending` future, as a runtime would) or `batch`
//! (`post_write_batch` of [`BATCH`] writes, only the last signalled, and the one completion
//! that hands all of them back: an iteration is then a batch, and the count per write is the
//! count per iteration over [`BATCH`]).
//! The C floor, the same loop straight over libibverbs, is `cost_floor.c` beside this file.

use crate::Run;
use examples::fail;
use rdma_dmabuf::Backing;
use rdma_dmabuf::{
    Access, Local, MemoryRegion, PartsPending, Pending, ProtectionDomain, QueuePair,
    QueuePairBuilder, RemoteRegion,
};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

/// The layer whose write is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Series {
    /// Owned posts: `post_write`, then `try_complete`.
    Owned,
    /// Borrowed posts in a scope: `Scope::write`, then `ScopedPending::spin`.
    Scoped,
    /// Owned posts awaited: `post_write`, then one poll of the `Pending` future.
    Awaited,
    /// Batched owned posts: `post_write_batch` of [`BATCH`] writes, then `try_complete`,
    /// through the provider's extended send verbs (the run fails where it has none).
    Batch,
    /// As [`Series::Batch`], on a queue pair without the extended send verbs
    /// (`QueuePairBuilder::extended_verbs(false)`): the chain through `ibv_post_send`, the
    /// path of providers without them.
    BatchBasic,
}

/// Writes per iteration of [`Series::Batch`] (as `rdma_bench --mode batch`).
pub const BATCH: usize = crate::batch::BATCH;

impl std::str::FromStr for Series {
    type Err = String;
    fn from_str(s: &str) -> Result<Series, String> {
        match s {
            "owned" => Ok(Series::Owned),
            "scoped" => Ok(Series::Scoped),
            "awaited" => Ok(Series::Awaited),
            "batch" => Ok(Series::Batch),
            "batch-basic" => Ok(Series::BatchBasic),
            _ => Err(format!(
                "--series is owned, scoped, awaited, batch or batch-basic, not {s:?}"
            )),
        }
    }
}

/// Runs `run.iters` writes of `run.size` bytes in `series` and prints a `RESULT` line.
pub fn run(pd: &Arc<ProtectionDomain>, run: &Run, series: Series) {
    let build = || {
        QueuePairBuilder::new(pd)
            .completion_channel(true)
            .extended_verbs(series != Series::BatchBasic)
            .build()
            .unwrap_or_else(|e| fail(&e.to_string()))
    };
    let (a, b) = (build(), build());
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let a = a.connect(&eb).unwrap_or_else(|e| fail(&e.to_string()));
    let batch = matches!(series, Series::Batch | Series::BatchBasic);
    if batch && a.extended_verbs() != (series == Series::Batch) {
        fail("the queue pair's send path is not the one the series measures");
    }
    let _b = b.connect(&ea).unwrap_or_else(|e| fail(&e.to_string()));
    let host = |access| {
        let buf = rdma_dmabuf::HostBuffer::new(run.size).unwrap_or_else(|e| fail(&e.to_string()));
        MemoryRegion::register(pd, buf, access).unwrap_or_else(|e| fail(&e.to_string()))
    };
    let target = host(Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let remote = target
        .remote()
        .unwrap_or_else(|| fail("the target has no rkey"));
    if batch {
        let mut parts: [Local<_>; BATCH] =
            std::array::from_fn(|_| Local::new(host(Access::empty()), 0..run.size as u64));
        for _ in 0..run.iters {
            arm(&a);
            let p = measured_post_batch(&a, parts, remote);
            sleep_for_event(&a);
            parts = measured_complete_batch(p);
        }
        println!(
            "RESULT cost_iters={} size={} series={series:?} writes_per_iter={BATCH}",
            run.iters, run.size
        );
        return;
    }
    let mut src = host(Access::empty());
    for _ in 0..run.iters {
        src = match series {
            Series::Owned => owned(&a, src, remote, measured_complete),
            Series::Awaited => owned(&a, src, remote, measured_complete_awaited),
            Series::Scoped => {
                rdma_dmabuf::scope(|s| scoped(s, &a, &src, remote));
                src
            }
            Series::Batch | Series::BatchBasic => unreachable!("batches run above"),
        };
    }
    println!(
        "RESULT cost_iters={} size={} series={series:?}",
        run.iters, run.size
    );
}

/// Arms the completion channel (before the post, so that its completion raises an event);
/// nothing may be outstanding.
fn arm(qp: &QueuePair) {
    match qp.arm_completions() {
        Ok(0) => {}
        Ok(n) => fail(&format!("{n} completions outstanding before a post")),
        Err(e) => fail(&e.to_string()),
    }
}

/// Sleeps until the armed completion channel has an event (the completion is queued), and
/// takes it, so that the measured completion polls the queue exactly once.
fn sleep_for_event(qp: &QueuePair) {
    let fd = qp
        .completion_fd()
        .unwrap_or_else(|| fail("no completion channel"));
    let mut fds = [nix::poll::PollFd::new(
        fd.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    let timeout = nix::poll::PollTimeout::try_from(Duration::from_secs(10)).unwrap();
    match nix::poll::poll(&mut fds, timeout) {
        Ok(1) => {}
        other => fail(&format!("no completion event within 10 s: {other:?}")),
    }
    qp.take_completion_events()
        .unwrap_or_else(|e| fail(&e.to_string()));
}

/// One owned write: posted, waited for out of the count, then completed by `complete`.
fn owned<'q, B: Backing>(
    qp: &'q QueuePair,
    src: MemoryRegion<B>,
    remote: RemoteRegion,
    complete: fn(Pending<'q, B>) -> MemoryRegion<B>,
) -> MemoryRegion<B> {
    arm(qp);
    let p = measured_post(qp, src, remote);
    sleep_for_event(qp);
    complete(p)
}

#[inline(never)]
fn measured_post<'q, B: Backing>(
    qp: &'q QueuePair,
    src: MemoryRegion<B>,
    remote: RemoteRegion,
) -> Pending<'q, B> {
    let len = src.len();
    qp.post_write(Local::new(src, 0..len), remote, None)
        .unwrap_or_else(|e| fail(&e.error.to_string()))
}

#[inline(never)]
fn measured_complete<B: Backing>(p: Pending<'_, B>) -> MemoryRegion<B> {
    match p.try_complete() {
        Ok(Ok(done)) => done.region,
        Ok(Err(e)) => fail(&e.error.to_string()),
        Err(_) => fail("the completion was not in the queue after its event"),
    }
}

#[inline(never)]
fn measured_complete_awaited<B: Backing>(mut p: Pending<'_, B>) -> MemoryRegion<B> {
    use std::future::Future;
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::Pin::new(&mut p).poll(&mut cx) {
        std::task::Poll::Ready(Ok(done)) => done.region,
        std::task::Poll::Ready(Err(e)) => fail(&e.error.to_string()),
        std::task::Poll::Pending => fail("the completion was not in the queue after its event"),
    }
}

#[inline(never)]
fn measured_post_batch<'q, B: Backing>(
    qp: &'q QueuePair,
    parts: [Local<B>; BATCH],
    remote: RemoteRegion,
) -> PartsPending<'q, Local<B>, BATCH> {
    qp.post_write_batch(parts, [remote; BATCH])
        .unwrap_or_else(|e| fail(&e.error.to_string()))
}

#[inline(never)]
fn measured_complete_batch<B: Backing>(p: PartsPending<'_, Local<B>, BATCH>) -> [Local<B>; BATCH] {
    match p.try_complete() {
        Ok(Ok(done)) => done.parts,
        Ok(Err(e)) => fail(&e.error.to_string()),
        Err(_) => fail("the batch's completion was not in the queue after its event"),
    }
}

fn scoped<'s, B: Backing>(
    s: &'s rdma_dmabuf::Scope<'s, '_>,
    qp: &'s QueuePair,
    src: &'s MemoryRegion<B>,
    remote: RemoteRegion,
) {
    arm(qp);
    let p = measured_post_scoped(s, qp, src, remote);
    sleep_for_event(qp);
    measured_complete_scoped(p);
}

#[inline(never)]
fn measured_post_scoped<'s, 'e, B: Backing>(
    s: &'s rdma_dmabuf::Scope<'s, 'e>,
    qp: &'s QueuePair,
    src: &'s MemoryRegion<B>,
    remote: RemoteRegion,
) -> rdma_dmabuf::ScopedPending<'s, 'e> {
    s.write(qp, src, remote, None)
        .unwrap_or_else(|e| fail(&e.to_string()))
}

#[inline(never)]
fn measured_complete_scoped(p: rdma_dmabuf::ScopedPending<'_, '_>) {
    p.spin().unwrap_or_else(|e| fail(&e.to_string()));
}
