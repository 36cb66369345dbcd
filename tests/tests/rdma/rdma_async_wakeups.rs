//! No lost wakeup, whatever another task does with its own request on the same queue pair.
//! Task B awaits a receive; then the main task polls another receive of the same queue pair
//! once (so the reactor last saw it) and afterwards keeps it idle, finishes it with the
//! blocking `spin`, or forgets it. The message for B then arrives: B must wake by itself.
//! The reactor holds the queue's fan-out waker, never the waker of whichever task parked
//! last, which would strand B with its completion unpolled in the CQ in each case. Also: a handle polled after it resolved panics instead of
//! spinning; and a receive awaited on a second runtime wakes there. Runs in the testbed VM.

use integration_tests::testbed::Testbed;
use integration_tests::verbs::{connect_pair, host_region, pd};
use rdma_dmabuf::{Access, Local, QueuePairBuilder};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// What the main task does with its own request after polling it once.
#[derive(Clone, Copy, Debug)]
enum Other {
    /// Keeps it, never polls it again (a `timeout(.., &mut pending)` that fired).
    KeptIdle,
    /// Finishes it with the blocking `spin` instead of awaiting it again.
    FinishedByWait,
    /// `mem::forget`s it (safe: it may leak, it must not stall anyone else).
    Forgotten,
}

fn task_b_wakes_whatever_the_other_request_becomes(other: Other) {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = connect_pair(
        QueuePairBuilder::new(&pd).completion_channel(true),
        QueuePairBuilder::new(&pd).completion_channel(true),
    );
    let b = Rc::new(b);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let waited = tokio::task::LocalSet::new().block_on(&rt, async {
        // Posted first, so the first message fills it.
        let mut mine = b
            .post_recv(host_region(&pd, &[], 64, Access::LOCAL_WRITE))
            .unwrap();
        let (bb, pdb) = (b.clone(), pd.clone());
        let task_b = tokio::task::spawn_local(async move {
            let r = bb.post_recv(host_region(&pdb, &[], 64, Access::LOCAL_WRITE));
            r.unwrap().await.map(|d| d.wc.byte_len)
        });
        for _ in 0..10 {
            tokio::task::yield_now().await; // B posts and parks
        }
        // Polled once, through `&mut`: the reactor's last sight of b is this task.
        let polled = tokio::time::timeout(Duration::from_millis(50), &mut mine).await;
        assert!(polled.is_err(), "nothing was sent yet");
        let send = |src| a.post_send(Local::new(src, 0..64), None).unwrap();
        let src = host_region(&pd, &[7; 64], 64, Access::empty());
        let src = send(src).await.expect("first send").region; // fills `mine`
        let mut keep = None;
        match other {
            Other::KeptIdle => keep = Some(mine),
            Other::FinishedByWait => {
                let done = mine.spin().expect("the first message");
                assert_eq!(done.wc.byte_len, 64);
            }
            Other::Forgotten => std::mem::forget(mine),
        }
        let src = send(src).await.expect("second send").region; // fills B's
        let start = Instant::now();
        let got = tokio::time::timeout(Duration::from_secs(10), task_b).await;
        let got = got.unwrap_or_else(|_| panic!("{other:?}: B was never woken"));
        assert_eq!(got.expect("task B").expect("B's receive"), 64);
        drop((keep, src));
        start.elapsed()
    });
    eprintln!("{other:?}: B woke {waited:?} after the second send completed");
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_task_wakes_when_another_tasks_polled_request_is_kept_idle() {
    task_b_wakes_whatever_the_other_request_becomes(Other::KeptIdle);
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_task_wakes_when_another_tasks_polled_request_is_finished_by_wait() {
    task_b_wakes_whatever_the_other_request_becomes(Other::FinishedByWait);
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_task_wakes_when_another_tasks_polled_request_is_forgotten() {
    task_b_wakes_whatever_the_other_request_becomes(Other::Forgotten);
}

/// A handle whose outcome an await already returned, then waited on: a panic that says so,
/// not a wait for a completion that was already taken.
#[test]
#[ignore = "needs the testbed VM"]
#[should_panic(expected = "polled after it returned its outcome")]
fn a_handle_waited_on_after_its_await_resolved_panics() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = connect_pair(
        QueuePairBuilder::new(&pd).completion_channel(true),
        QueuePairBuilder::new(&pd),
    );
    let target = host_region(&pd, &[], 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let src = host_region(&pd, &[1; 64], 64, Access::empty());
    let mut w = a.post_write(src, target.remote().unwrap(), None).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(&mut w).expect("the write");
    drop(b);
    let _ = w.spin();
}

/// A future that counts its polls.
struct Counted<'c, F> {
    inner: F,
    polls: &'c std::cell::Cell<u32>,
}

impl<F: std::future::Future + Unpin> std::future::Future for Counted<'_, F> {
    type Output = F::Output;
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        self.polls.set(self.polls.get() + 1);
        std::pin::Pin::new(&mut self.inner).poll(cx)
    }
}

/// A receive polled on runtime A, then awaited on runtime B while A is kept idle (or after
/// A is dropped): B's reactor must wake it when the message lands, promptly and without
/// polling it in a loop meanwhile: the registration follows the runtime, so the wake never
/// goes to A's idle reactor (B would wake only by its own timeout) and, with A gone, no await
/// on the queue pair spins.
fn a_receive_moved_to_a_second_runtime_wakes_there(drop_first: bool) {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = connect_pair(
        QueuePairBuilder::new(&pd),
        QueuePairBuilder::new(&pd).completion_channel(true),
    );
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let mut recv = b
        .post_recv(host_region(&pd, &[], 64, Access::LOCAL_WRITE))
        .unwrap();
    let early =
        first.block_on(async { tokio::time::timeout(Duration::from_millis(50), &mut recv).await });
    assert!(early.is_err(), "nothing was sent yet");
    let first = if drop_first {
        drop(first);
        None
    } else {
        Some(first)
    };
    let polls = std::cell::Cell::new(0);
    let src = host_region(&pd, &[5; 64], 64, Access::empty());
    let sent_at = std::thread::scope(|s| {
        // The sending queue pair moves to its own thread (a queue pair is Send, not Sync).
        let sender = s.spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let at = Instant::now();
            a.post_send(src.into_part(0..64), None)
                .unwrap()
                .spin()
                .expect("send");
            (at, a)
        });
        let second = runtime();
        let counted = Counted {
            inner: &mut recv,
            polls: &polls,
        };
        let got =
            second.block_on(async { tokio::time::timeout(Duration::from_secs(10), counted).await });
        let woke = Instant::now();
        let done = got.expect("the receive was never woken").expect("receive");
        assert_eq!(done.wc.byte_len, 64);
        let (sent, _a) = sender.join().unwrap();
        woke.saturating_duration_since(sent)
    });
    drop(first);
    eprintln!(
        "first runtime {}: woken {sent_at:?} after the send, {} polls",
        if drop_first { "dropped" } else { "idle" },
        polls.get()
    );
    assert!(
        sent_at < Duration::from_secs(3),
        "woken by the timeout, not by the reactor"
    );
    assert!(polls.get() < 50, "{} polls: a busy loop", polls.get());
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_receive_moved_to_a_second_runtime_wakes_there_while_the_first_is_idle() {
    a_receive_moved_to_a_second_runtime_wakes_there(false);
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_receive_moved_to_a_second_runtime_wakes_there_after_the_first_is_dropped() {
    a_receive_moved_to_a_second_runtime_wakes_there(true);
}
