//! The write-cost loop with `sideway` 0.4, for two of its queue pairs: the extended one that
//! its own `rc_pingpong` example uses ([`Extended`], program `sideway_cost`:
//! `QueuePairBuilder::build_ex`, `ibv_create_qp_ex`, and `CompletionQueueBuilder::build_ex`)
//! and the basic one ([`Basic`], program `sideway_basic_cost`: `build`, `ibv_create_qp` and
//! `ibv_create_cq`). The post is the same calls on both, `start_post_send`,
//! `construct_wr(.., Signaled)`, `setup_write`, `setup_sge` and `post`: on the extended queue
//! pair `ibv_wr_start`, `ibv_wr_rdma_write`, `ibv_wr_set_sge` and `ibv_wr_complete`; on the
//! basic one, work requests and scatter entries pushed into `Vec`s and one `ibv_post_send`.
//! The completion is `start_poll` (`ibv_start_poll`; on the basic queue, an `ibv_poll_cq` into
//! a `Vec` of the queue's poll batch, 32 by default), the first `next()` of the poller and its
//! `status()`, and the poller's drop. See the package's documentation.

use sideway::ibverbs::address::AddressHandleAttribute;
use sideway::ibverbs::completion::{
    BasicCompletionQueue, CompletionQueueBuilder, ExtendedCompletionQueue, GenericCompletionQueue,
    WorkCompletionStatus,
};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::Mtu;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, ExtendedQueuePair, PostSendGuard, QueuePair, QueuePairAttribute,
    QueuePairBuilder, QueuePairState, SendOperationFlags, SetScatterGatherEntry, WorkRequestFlags,
};
use sideway::ibverbs::AccessFlags;
use std::sync::Arc;
use std::time::{Duration, Instant};
use verbs_crates::{args, die, result, SETTLE};

/// A kind of sideway queue pair and completion queue the loop runs on.
pub trait Flavor {
    /// The queue pair.
    type Qp: QueuePair;
    /// The completion queue.
    type Cq;
    /// The series' name in the `RESULT` line.
    const SERIES: &'static str;
    /// The program's name, for its usage line.
    const PROGRAM: &'static str;
    /// A completion queue from `builder`.
    fn cq(builder: &CompletionQueueBuilder) -> Arc<Self::Cq>;
    /// The same queue as the queue pair builder takes it.
    fn generic(cq: &Arc<Self::Cq>) -> GenericCompletionQueue;
    /// A queue pair from `builder`.
    fn qp(builder: &QueuePairBuilder) -> Self::Qp;
    /// Takes one completion: `None` when the queue was empty, else whether it succeeded.
    fn complete(cq: &Self::Cq) -> Option<bool>;
}

/// The extended queue pair and completion queue (`build_ex`).
pub struct Extended;

impl Flavor for Extended {
    type Qp = ExtendedQueuePair;
    type Cq = ExtendedCompletionQueue;
    const SERIES: &'static str = "sideway";
    const PROGRAM: &'static str = "sideway_cost";

    fn cq(builder: &CompletionQueueBuilder) -> Arc<Self::Cq> {
        builder.build_ex().unwrap_or_else(|e| die(e))
    }

    fn generic(cq: &Arc<Self::Cq>) -> GenericCompletionQueue {
        cq.clone().into()
    }

    fn qp(builder: &QueuePairBuilder) -> Self::Qp {
        builder.build_ex().unwrap_or_else(|e| die(e))
    }

    #[inline(always)]
    fn complete(cq: &Self::Cq) -> Option<bool> {
        let mut poller = cq.start_poll().ok()?;
        let wc = poller.next()?;
        Some(wc.status() == WorkCompletionStatus::Success as u32)
    }
}

/// The basic queue pair and completion queue (`build`).
pub struct Basic;

impl Flavor for Basic {
    type Qp = BasicQueuePair;
    type Cq = BasicCompletionQueue;
    const SERIES: &'static str = "sideway-basic";
    const PROGRAM: &'static str = "sideway_basic_cost";

    fn cq(builder: &CompletionQueueBuilder) -> Arc<Self::Cq> {
        builder.build().unwrap_or_else(|e| die(e))
    }

    fn generic(cq: &Arc<Self::Cq>) -> GenericCompletionQueue {
        cq.clone().into()
    }

    fn qp(builder: &QueuePairBuilder) -> Self::Qp {
        builder.build().unwrap_or_else(|e| die(e))
    }

    #[inline(always)]
    fn complete(cq: &Self::Cq) -> Option<bool> {
        let mut poller = cq.start_poll().ok()?;
        let wc = poller.next()?;
        Some(wc.status() == WorkCompletionStatus::Success as u32)
    }
}

/// The local buffer and the remote one of each write.
struct Write {
    lkey: u32,
    addr: u64,
    len: u32,
    rkey: u32,
    remote_addr: u64,
}

/// Posts one signalled RDMA write of `w`.
#[inline(never)]
fn measured_post<Q: QueuePair>(qp: &mut Q, w: &Write) -> bool {
    let mut guard = qp.start_post_send();
    let write = guard
        .construct_wr(1, WorkRequestFlags::Signaled)
        .setup_write(w.rkey, w.remote_addr);
    // SAFETY: the buffer is registered and outlives the write (the loop waits for its
    // completion before it changes or frees anything).
    unsafe { write.setup_sge(w.lkey, w.addr, w.len) };
    guard.post().is_ok()
}

/// Takes one completion: `None` when the queue was empty, else whether it succeeded.
#[inline(never)]
fn measured_complete<F: Flavor>(cq: &F::Cq) -> Option<bool> {
    F::complete(cq)
}

/// Waits until the 8 bytes at `at`, in the write's registered target, read `value` (the write
/// landed), within 10 s.
fn wait_for_value(at: *const u64, value: u64) {
    let start = Instant::now();
    // SAFETY: `at` points to the start of the target buffer, which outlives the loop; the
    // device writes it, so it is read with a volatile load.
    while unsafe { at.read_volatile() } != value {
        if start.elapsed() > Duration::from_secs(10) {
            die(format!("write {value} did not land within 10 s"));
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// The loop on queues of flavour `F`: the program's whole run.
pub fn run<F: Flavor>() {
    let args = args(F::PROGRAM);
    let list = DeviceList::new().unwrap_or_else(|e| die(e));
    let device = list
        .iter()
        .find(|d| d.name() == args.device)
        .unwrap_or_else(|| die(format!("no device {}", args.device)));
    let ctx = device.open().unwrap_or_else(|e| die(e));
    let pd = ctx.alloc_pd().unwrap_or_else(|e| die(e));
    let mut cq_builder = ctx.create_cq_builder();
    cq_builder.setup_cqe(8);
    let cq = F::cq(&cq_builder);
    let other = F::cq(&cq_builder);
    let make_qp = |cq: &Arc<F::Cq>| {
        let mut b = pd.create_qp_builder();
        b.setup_max_send_wr(16)
            .setup_max_recv_wr(4)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_send_cq(F::generic(cq))
            .setup_recv_cq(F::generic(cq))
            .setup_send_ops_flags(SendOperationFlags::Write);
        let mut qp = F::qp(&b);
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(1)
            .setup_access_flags(AccessFlags::RemoteWrite);
        qp.modify(&attr).unwrap_or_else(|e| die(e));
        qp
    };
    let (mut a, mut b) = (make_qp(&cq), make_qp(&other));
    let gid = ctx.query_gid(1, args.gid_index).unwrap_or_else(|e| die(e));
    let connect = |qp: &mut F::Qp, dest: u32| {
        let mut ah = AddressHandleAttribute::new();
        ah.setup_port(1)
            .setup_grh_src_gid_index(args.gid_index as u8)
            .setup_grh_dest_gid(&gid)
            .setup_grh_hop_limit(64);
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(Mtu::Mtu1024)
            .setup_dest_qp_num(dest)
            .setup_rq_psn(0)
            .setup_max_dest_read_atomic(1)
            .setup_min_rnr_timer(12)
            .setup_address_vector(&ah);
        qp.modify(&attr).unwrap_or_else(|e| die(e));
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToSend)
            .setup_timeout(16)
            .setup_retry_cnt(6)
            .setup_rnr_retry(6)
            .setup_sq_psn(0)
            .setup_max_read_atomic(1);
        qp.modify(&attr).unwrap_or_else(|e| die(e));
    };
    let (qa, qb) = (a.qp_number(), b.qp_number());
    connect(&mut a, qb);
    connect(&mut b, qa);
    let mut src = vec![0u64; args.size.div_ceil(8)];
    let dst = vec![0u64; args.size.div_ceil(8)];
    // SAFETY: both buffers outlive their registrations (dropped at the end of main, after them).
    let smr = unsafe { pd.reg_mr(src.as_ptr() as usize, args.size, AccessFlags::LocalWrite) }
        .unwrap_or_else(|e| die(e));
    // SAFETY: as above.
    let dmr = unsafe {
        pd.reg_mr(
            dst.as_ptr() as usize,
            args.size,
            AccessFlags::LocalWrite | AccessFlags::RemoteWrite,
        )
    }
    .unwrap_or_else(|e| die(e));
    let w = Write {
        lkey: smr.lkey(),
        addr: src.as_ptr() as u64,
        len: args.size as u32,
        rkey: dmr.rkey(),
        remote_addr: dst.as_ptr() as u64,
    };
    let mut misses = 0;
    for i in 1..=args.iters {
        // SAFETY: no write is in flight (the last one completed); the device reads `src` only
        // during a write.
        unsafe { src.as_mut_ptr().write_volatile(i) };
        if !measured_post(&mut a, &w) {
            die("post failed");
        }
        wait_for_value(dst.as_ptr(), i);
        std::thread::sleep(SETTLE);
        loop {
            match measured_complete::<F>(&cq) {
                Some(true) => break,
                Some(false) => die("the write failed"),
                None => {
                    misses += 1;
                    std::thread::sleep(SETTLE);
                }
            }
        }
    }
    result(&args, F::SERIES, misses);
    drop((a, b, smr, dmr));
}
