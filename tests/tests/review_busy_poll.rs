//! Independent review: a busy-poll budget longer than the time to the completion blocks the
//! runtime thread for the whole budget, so a task on the same current-thread runtime that
//! would complete the awaited request never runs, and `tokio::time::timeout` around the
//! await cannot fire. `set_busy_poll` takes any `Duration` (up to `u64::MAX` ns: about 584
//! years). Runs in the testbed VM.

use integration_tests::testbed::Testbed;
use integration_tests::verbs::{connect_pair, host_region, pd};
use rdma_dmabuf::{Access, Local, QueuePairBuilder};
use std::rc::Rc;
use std::time::{Duration, Instant};

const BUDGET: Duration = Duration::from_secs(20);

#[test]
#[ignore = "needs the testbed VM"]
fn review_a_long_busy_poll_budget_starves_the_task_that_would_complete_the_request() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = connect_pair(
        QueuePairBuilder::new(&pd).completion_channel(true),
        QueuePairBuilder::new(&pd).completion_channel(true),
    );
    b.set_busy_poll(BUDGET);
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
