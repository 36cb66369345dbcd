//! The other awaitable handles (rdma-dmabuf's `tokio` feature): receives on a shared receive
//! queue awaited by several tasks (each completion naming its queue pair, a dropped future's
//! receive still posted and later filled), inline writes, and scoped requests to several
//! peers awaited together inside their scope (a runtime driven in the scope's closure), one of
//! them dropped early and drained by the scope; a scoped request awaited where nothing can park
//! its task. Runs in the testbed VM.

use integration_tests::counts::rdma_resources;
use integration_tests::injection::{recv_region, send, LEN};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{connect_pair, host_region, hub_and_peers, pattern, pd};
use rdma_dmabuf::reactor::WaitStep;
use rdma_dmabuf::{
    scope_with_deadline, Access, MultiChannelBuilder, QueuePairBuilder, SharedReceiveQueue,
};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

/// The test that counts MRs (device-wide) runs alone: it takes this for writing, every other
/// test of the file for reading (libtest runs a file's tests on several threads).
static COUNTING: std::sync::RwLock<()> = std::sync::RwLock::new(());

const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Tasks awaiting receives on one shared queue, parked before any message comes, each wake
/// with its own message, whose completion names the queue pair it came through. A receive
/// whose future timed out stays posted (and registered) and takes the first message.
#[test]
#[ignore = "needs the testbed VM"]
fn awaited_shared_queue_receives_wake_their_tasks_and_a_dropped_one_stays_posted() {
    let _counting = COUNTING.write().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let pd = pd(&tb);
    let srq = Rc::new(SharedReceiveQueue::new(&pd, 16).unwrap());
    let pairs: Vec<_> = (0..3)
        .map(|_| {
            connect_pair(
                QueuePairBuilder::new(&pd).completion_channel(true),
                QueuePairBuilder::new(&pd).srq(&srq),
            )
        })
        .collect();
    let qpn_of: HashMap<u32, u32> = pairs
        .iter()
        .enumerate()
        .map(|(i, (_, b))| (b.endpoint().qpn, i as u32))
        .collect();
    let mrs = rdma_resources("mr");
    let rt = runtime();
    let got = tokio::task::LocalSet::new().block_on(&rt, async {
        // Posted first, so the first message fills it; its future is dropped by the timeout.
        let early = srq
            .post_recv(host_region(&pd, &[], 256, Access::LOCAL_WRITE))
            .unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(20), early)
            .await
            .is_err());
        assert_eq!(srq.outstanding(), 1, "the dropped receive is still posted");
        assert_eq!(rdma_resources("mr"), mrs + 1, "and its region registered");
        let tasks: Vec<_> = (0..6)
            .map(|_| {
                let srq = srq.clone();
                let r = host_region(&pd, &[], 256, Access::LOCAL_WRITE);
                tokio::task::spawn_local(async move {
                    let done = srq.post_recv(r).unwrap().await.expect("receive");
                    let n = done.wc.byte_len as usize;
                    let text = String::from_utf8(done.region.bytes().unwrap()[..n].to_vec());
                    (done.wc.qp_num, done.wc.imm, text.unwrap())
                })
            })
            .collect();
        // Every receiving task parks on the shared queue's completion channel first.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(srq.outstanding(), 7);
        for k in 0..7u32 {
            let i = (k % 3) as usize;
            let msg = format!("message {k} from {i}");
            let r = host_region(&pd, msg.as_bytes(), 256, Access::empty());
            let len = msg.len() as u64;
            let sent = pairs[i].0.post_send(r.into_part(0..len), Some(i as u32));
            sent.unwrap().await.expect("send");
        }
        let all = async {
            let mut got = Vec::new();
            for t in tasks {
                got.push(t.await.expect("a receiving task panicked"));
            }
            got
        };
        // Bounded: a lost wakeup fails here instead of hanging.
        tokio::time::timeout(Duration::from_secs(60), all)
            .await
            .expect("every receiving task was woken")
    });
    let mut texts = Vec::new();
    for (qpn, imm, text) in got {
        let i = qpn_of[&qpn];
        assert_eq!(
            imm,
            Some(i),
            "the completion names the queue pair of the sender"
        );
        assert!(text.ends_with(&format!("from {i}")), "{text} via qp {i}");
        texts.push(text);
    }
    texts.sort();
    let want: Vec<_> = (1..7u32)
        .map(|k| format!("message {k} from {}", k % 3))
        .collect();
    assert_eq!(texts, want, "messages 1 to 6 woke the six tasks");
    assert_eq!(
        srq.outstanding(),
        0,
        "the first message filled the dropped receive"
    );
    assert_eq!(rdma_resources("mr"), mrs, "and its region was released");
}

/// Awaited inline writes (nothing lent: each resolves to its completion) arrive in order.
#[test]
#[ignore = "needs the testbed VM"]
fn awaited_inline_writes_arrive() {
    let _counting = COUNTING.read().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, _b) = connect_pair(
        QueuePairBuilder::new(&pd)
            .completion_channel(true)
            .max_inline_data(64),
        QueuePairBuilder::new(&pd),
    );
    let target = host_region(&pd, &[], 64 * 100, RW);
    let remote = target.remote().unwrap();
    let want = pattern(64 * 100, 3);
    runtime().block_on(async {
        for (k, chunk) in want.chunks(64).enumerate() {
            let slice = remote.slice(k as u64 * 64, 64).unwrap();
            let wc = a.post_write_inline(chunk, slice, None).unwrap().await;
            wc.expect("inline write");
        }
    });
    let got = target.into_inner().unwrap();
    let bad: Vec<_> = (0..want.len() / 64)
        .filter(|k| got.as_slice()[k * 64..(k + 1) * 64] != want[k * 64..(k + 1) * 64])
        .collect();
    assert!(
        bad.is_empty(),
        "the inline writes' bytes differ in chunks {bad:?}: {:?}",
        &got.as_slice()[bad.first().copied().unwrap_or(0) * 64..][..64]
    );
}

/// In one scope, one region is written to three peers and the three scoped requests are
/// awaited together on a runtime driven inside the scope's closure; a scoped receive awaited
/// with a timeout that fires is dropped, and the scope still waits for it: the peer's later
/// send completes it before the scope returns, and the bytes are there.
#[test]
#[ignore = "needs the testbed VM"]
fn scoped_requests_to_three_peers_are_awaited_together_inside_their_scope() {
    let _counting = COUNTING.read().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let pd = pd(&tb);
    let hub = MultiChannelBuilder::new(&pd, 3).queue_pairs(|q| q.completion_channel(true));
    let (hub, peers) = hub_and_peers(&pd, hub, 3);
    let targets: Vec<_> = (0..3).map(|_| host_region(&pd, &[], 4096, RW)).collect();
    let want = pattern(4096, 41);
    let src = host_region(&pd, &want, 4096, Access::empty());
    let mut inbox = host_region(&pd, &[], 4096, Access::LOCAL_WRITE);
    let rt = runtime();
    scope_with_deadline(Duration::from_secs(30), |s| {
        let writes: Vec<_> = targets
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let qp = hub.peer(i).unwrap();
                s.write(qp, &src, t.remote().unwrap(), None).unwrap()
            })
            .collect();
        let recv = s.recv(hub.peer(0).unwrap(), &mut inbox).unwrap();
        rt.block_on(async {
            let [w0, w1, w2]: [_; 3] = writes.try_into().expect("three writes");
            let (r0, r1, r2) = tokio::join!(w0, w1, w2);
            for r in [r0, r1, r2] {
                r.expect("scoped write");
            }
            let timed_out = tokio::time::timeout(Duration::from_millis(20), recv).await;
            assert!(timed_out.is_err(), "nothing was sent to the hub yet");
        });
        // The receive's future is gone; the scope still has the request.
        let msg = pattern(100, 7);
        let r = host_region(&pd, &msg, 100, Access::empty());
        peers[0].post_send(r, None).unwrap().spin().unwrap();
    });
    for (i, t) in targets.into_iter().enumerate() {
        let got = t.into_inner().unwrap();
        assert!(got.as_slice() == &want[..], "peer {i}'s bytes differ");
    }
    assert!(
        inbox.bytes().unwrap()[..100] == pattern(100, 7)[..],
        "the scope drained the receive whose future was dropped"
    );
}

/// Queues and runtimes dropped in either order while tasks are parked on them (the
/// runtime's reactor holds the queues' registrations and fan-out wakers): first the runtime
/// with its parked tasks, then the shared receive queue, then its queue pairs; then the
/// handles first (the tasks' own references keep the queues until they go) and the runtime
/// last. Every region is released once its queue is gone.
#[test]
#[ignore = "needs the testbed VM"]
fn queues_and_runtimes_drop_in_any_order_with_tasks_parked() {
    let _counting = COUNTING.write().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let pd = pd(&tb);
    let mrs = rdma_resources("mr");
    for runtime_first in [true, false] {
        let srq = Rc::new(SharedReceiveQueue::new(&pd, 4).unwrap());
        let (a, b) = connect_pair(
            QueuePairBuilder::new(&pd).completion_channel(true),
            QueuePairBuilder::new(&pd).srq(&srq),
        );
        let a = Rc::new(a);
        let rt = runtime();
        let local = tokio::task::LocalSet::new();
        for _ in 0..2 {
            let srq = srq.clone();
            let r = host_region(&pd, &[], 256, Access::LOCAL_WRITE);
            local.spawn_local(async move {
                let _ = srq.post_recv(r).unwrap().await;
                unreachable!("nothing is sent");
            });
            let a = a.clone();
            let r = host_region(&pd, &[], 256, Access::LOCAL_WRITE);
            local.spawn_local(async move {
                // Flushed when the queue pair is dropped (if the task still runs then).
                let _ = a.post_recv(r).unwrap().await;
            });
        }
        // Every task posts and parks.
        local.block_on(&rt, async {
            tokio::time::sleep(Duration::from_millis(50)).await;
        });
        assert_eq!(rdma_resources("mr"), mrs + 4);
        if runtime_first {
            drop(local);
            drop(rt);
            drop(srq);
            drop(a);
            drop(b);
        } else {
            drop(a);
            drop(b);
            drop(srq);
            drop(local);
            drop(rt);
        }
        assert_eq!(
            rdma_resources("mr"),
            mrs,
            "runtime first: {runtime_first}: every region released"
        );
    }
}

/// The drop orders above again, under valgrind's memcheck.
#[test]
#[ignore = "needs the testbed VM"]
fn drop_orders_with_parked_tasks_are_valgrind_clean() {
    // The child counts MRs device-wide: nothing else of this file may run meanwhile.
    let _counting = COUNTING.write().unwrap_or_else(|e| e.into_inner());
    integration_tests::process::valgrind_self(
        &[
            "--exact",
            &integration_tests::process::test_name(
                module_path!(),
                "queues_and_runtimes_drop_in_any_order_with_tasks_parked",
            ),
        ],
        1,
    );
}

/// A reactor that cannot park a task: every wait reschedules it (`WaitStep::Spin`).
fn cannot_park(_: &rdma_dmabuf::QueuePair, _: &mut std::task::Context<'_>) -> WaitStep {
    WaitStep::Spin
}

/// A scoped request awaited where nothing can park its task, on queue pairs without a
/// completion channel and with one: each poll looks in the completion queue itself, so the
/// future resolves once its message has landed (busy, never hung). Before, a scoped poll
/// looked only at its slot, which only a poll of the queue fills, and spun forever with the
/// completion in the queue; an awaited tokio receive on a queue pair without a channel hung
/// the same way.
#[test]
#[ignore = "needs the testbed VM"]
fn a_scoped_request_awaited_without_a_way_to_park_still_resolves() {
    let _shared = COUNTING.read().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let pd = pd(&tb);
    let noop = || std::task::Context::from_waker(std::task::Waker::noop());
    for channel in [false, true] {
        let (a, b) = connect_pair(
            QueuePairBuilder::new(&pd).completion_channel(channel),
            QueuePairBuilder::new(&pd).completion_channel(channel),
        );
        let mut inbox = recv_region(&pd);
        let polls = rdma_dmabuf::scope(|s| {
            let mut h = s.recv(&b, &mut inbox).expect("scoped receive");
            assert!(h.poll_with(&mut noop(), cannot_park).is_pending());
            send(&pd, &a, 40);
            (1..=1000).find(|_| match h.poll_with(&mut noop(), cannot_park) {
                std::task::Poll::Ready(r) => {
                    assert_eq!(r.expect("received").byte_len as usize, LEN);
                    true
                }
                std::task::Poll::Pending => false,
            })
        });
        assert!(
            polls.is_some(),
            "channel {channel}: never resolved in 1000 polls"
        );
        assert_eq!(&inbox.bytes().unwrap()[..LEN], &pattern(LEN, 40)[..]);
    }
    // tokio, without a channel: the runtime cannot park it either.
    let (a, b) = connect_pair(QueuePairBuilder::new(&pd), QueuePairBuilder::new(&pd));
    let mut inbox = recv_region(&pd);
    let rt = runtime();
    let r = rdma_dmabuf::scope(|s| {
        let h = s.recv(&b, &mut inbox).expect("scoped receive");
        send(&pd, &a, 41);
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), h).await })
    });
    let wc = r.expect("resolved before the timeout").expect("received");
    assert_eq!(wc.byte_len as usize, LEN);
    assert_eq!(&inbox.bytes().unwrap()[..LEN], &pattern(LEN, 41)[..]);
}
