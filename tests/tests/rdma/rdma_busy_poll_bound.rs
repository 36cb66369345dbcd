//! A busy-poll budget is spent inside one poll of a future, blocking the runtime's thread: a
//! long one would keep a task on the same current-thread runtime that completes the awaited
//! request from running, and a `tokio::time::timeout` around the await from firing (a 20 s
//! budget held the first await for 20 s). So `set_busy_poll` cuts budgets to
//! `MAX_BUSY_POLL`. Runs in the testbed VM.

use integration_tests::testbed::Testbed;
use integration_tests::verbs::{connect_pair, host_region, pd};
use rdma_dmabuf::{Access, Local, QueuePairBuilder, MAX_BUSY_POLL};
use std::rc::Rc;
use std::time::{Duration, Instant};

const BUDGET: Duration = Duration::from_secs(20);

#[test]
#[ignore = "needs the testbed VM"]
fn a_long_busy_poll_budget_is_cut_so_the_other_tasks_run() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = connect_pair(
        QueuePairBuilder::new(&pd).completion_channel(true),
        QueuePairBuilder::new(&pd).completion_channel(true),
    );
    b.set_busy_poll(BUDGET);
    assert_eq!(
        b.busy_poll(),
        MAX_BUSY_POLL,
        "a long budget is cut to the maximum"
    );
    let a = Rc::new(a);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let (timed_out_at, got) = tokio::task::LocalSet::new().block_on(&rt, async {
        let (aa, pda) = (a.clone(), pd.clone());
        // The sender: runs as soon as the receiving task yields.
        let sender = tokio::task::spawn_local(async move {
            let src = host_region(&pda, &[9; 64], 64, Access::empty());
            aa.post_send(Local::new(src, 0..64), None)
                .unwrap()
                .await
                .map(|d| d.wc.byte_len)
        });
        let recv = b
            .post_recv(host_region(&pd, &[], 64, Access::LOCAL_WRITE))
            .unwrap();
        let mut recv = std::pin::pin!(recv);
        // A 1 s timeout around the first await: either the message arrives (the sender ran)
        // or the timeout fires after about a second.
        let first = tokio::time::timeout(Duration::from_secs(1), &mut recv).await;
        let at = started.elapsed();
        let got = match first {
            Ok(r) => r.map(|d| d.wc.byte_len).ok(),
            Err(_) => recv.await.map(|d| d.wc.byte_len).ok(),
        };
        let _ = sender.await;
        (at, got)
    });
    assert_eq!(got, Some(64));
    assert!(
        timed_out_at < Duration::from_secs(5),
        "the first await returned only after {timed_out_at:?}: the busy poll ran the whole \
         {BUDGET:?} budget inside one poll, starving the sender task and the 1 s timeout"
    );
}
