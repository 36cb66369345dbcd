//! The write-cost loop with rust-ibverbs (crate `ibverbs` 0.9), the way its own example uses
//! it. The crate has no RDMA WRITE in 0.9 (its only posts are `post_send`, an `IBV_WR_SEND`,
//! and `post_receive`), so the counted operation is its 8-byte signalled SEND: the post is
//! `QueuePair::post_send` over a `MemoryRegion` (one `ibv_send_wr` built on the stack and the
//! provider's `post_send` called through the context's ops), the completion one
//! `CompletionQueue::poll` of a one-entry slice (the provider's `poll_cq` through the ops) and
//! the completion's `is_valid()`. The second queue pair posts the receive each send needs, out
//! of the count. See the package's documentation.

use ibverbs::{ibv_qp_type, ibv_wc, CompletionQueue, MemoryRegion, QueuePair};
use verbs_crates::{args, die, result, SETTLE};

/// Posts one signalled 8-byte (the region's length) send of `mr`.
#[inline(never)]
fn measured_post(qp: &mut QueuePair<'_>, mr: &mut MemoryRegion<u64>) -> bool {
    // SAFETY: the region outlives the send: the loop takes its completion before it writes or
    // frees the region.
    unsafe { qp.post_send(mr, .., 1) }.is_ok()
}

/// Takes one completion: `None` when the queue was empty, else whether it succeeded.
#[inline(never)]
fn measured_complete(cq: &CompletionQueue<'_>, wc: &mut [ibv_wc; 1]) -> Option<bool> {
    let done = cq.poll(wc).ok()?;
    let wc = done.first()?;
    Some(wc.is_valid())
}

fn main() {
    let args = args("ibverbs_cost");
    let list = ibverbs::devices().unwrap_or_else(|e| die(e));
    let device = list
        .iter()
        .find(|d| {
            d.name()
                .is_some_and(|n| n.to_bytes() == args.device.as_bytes())
        })
        .unwrap_or_else(|| die(format!("no device {}", args.device)));
    let ctx = device.open().unwrap_or_else(|e| die(e));
    let pd = ctx.alloc_pd().unwrap_or_else(|e| die(e));
    let cq = ctx.create_cq(8, 0).unwrap_or_else(|e| die(e));
    let other = ctx.create_cq(8, 0).unwrap_or_else(|e| die(e));
    let prepare = |cq| {
        pd.create_qp(cq, cq, ibv_qp_type::IBV_QPT_RC)
            .set_gid_index(args.gid_index)
            .set_max_send_wr(16)
            .set_max_recv_wr(4)
            .set_path_mtu(3) // IBV_MTU_1024, as the C loop's
            .set_timeout(16)
            .set_min_rnr_timer(12)
            .build()
            .unwrap_or_else(|e| die(e))
    };
    let (a, b) = (prepare(&cq), prepare(&other));
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let mut a = a.handshake(eb).unwrap_or_else(|e| die(e));
    let mut b = b.handshake(ea).unwrap_or_else(|e| die(e));
    let words = args.size.div_ceil(8);
    let mut src = pd.allocate::<u64>(words).unwrap_or_else(|e| die(e));
    let mut dst = pd.allocate::<u64>(words).unwrap_or_else(|e| die(e));
    let mut wc = [ibv_wc::default(); 1];
    let mut misses = 0;
    for i in 1..=args.iters {
        src[0] = i;
        // SAFETY: the region outlives the receive: the loop takes its completion below.
        unsafe { b.post_receive(&mut dst, .., 2) }.unwrap_or_else(|e| die(e));
        if !measured_post(&mut a, &mut src) {
            die("post failed");
        }
        // The receive's completion (on the other queue pair's queue, out of the count).
        let start = std::time::Instant::now();
        let mut rwc = [ibv_wc::default(); 1];
        while other.poll(&mut rwc).unwrap_or_else(|e| die(e)).is_empty() {
            if start.elapsed() > std::time::Duration::from_secs(10) {
                die(format!("send {i} was not received within 10 s"));
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        if !rwc[0].is_valid() || dst[0] != i {
            die(format!("send {i}: bad receive"));
        }
        std::thread::sleep(SETTLE);
        loop {
            match measured_complete(&cq, &mut wc) {
                Some(true) => break,
                Some(false) => die("the send failed"),
                None => {
                    misses += 1;
                    std::thread::sleep(SETTLE);
                }
            }
        }
    }
    result(&args, "ibverbs-send", misses);
}
