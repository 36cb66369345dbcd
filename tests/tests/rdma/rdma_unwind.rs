//! Panic injection: code we do not control (a task's waker panicking in `wake`, `clone` or
//! `drop`) and a closed stderr never unwind past memory the NIC owns (docs/safety.md,
//! "Unwinding"). For every handle type, no region is freed or un-borrowed while posted and
//! no completion is lost. Each of the four holes an independent audit found has its own test,
//! which fails on the code before the fix. Runs in the testbed VM.

use integration_tests::evil_waker::{evil, Site};
use integration_tests::injection::*;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{host_region, loopback_pair, pattern, pd};
use rdma_dmabuf::{scope_with_deadline, Access};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

/// Hole 1. A waker that panics in `wake`, on an owned send of `a`, is woken by the poll a
/// scope's drain makes for its write on `a`; the drain must still wait for (and here, flush)
/// the scope's receive on `b` before the scope ends, and raise the panic only then. Before
/// the fix the panic left the drain at once: `scope` returned with the receive posted into
/// the borrowed region.
#[test]
#[ignore = "needs the testbed VM"]
fn a_panicking_waker_does_not_cut_a_scopes_drain_short() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = loopback_pair(&pd);
    let r1 = b.post_recv(recv_region(&pd)).unwrap();
    let src = host_region(&pd, &pattern(LEN, 1), LEN, Access::empty());
    let s1 = a.post_send(src, None).unwrap();
    let (e, waker) = evil(Site::Wake);
    let _disarm = e.disarm_on_drop();
    s1.register_waker(&waker);
    e.arm();
    std::thread::sleep(Duration::from_millis(200)); // s1's completion waits in a's CQ
    let target = host_region(&pd, &[], LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let remote = target.remote().unwrap();
    let data = host_region(&pd, &pattern(LEN, 2), LEN, Access::empty());
    let mut borrowed = recv_region(&pd);
    let out = catch_unwind(AssertUnwindSafe(|| {
        scope_with_deadline(Duration::from_secs(2), |s| {
            s.write(&a, &data, remote, None).unwrap();
            s.recv(&b, &mut borrowed).unwrap();
        })
    }));
    assert!(out.is_err(), "the waker's panic is raised");
    assert_eq!(e.panicked(), 1);
    b.poll().unwrap();
    assert_eq!(
        b.outstanding(),
        0,
        "the scope ended with its receive still posted into the borrowed region"
    );
    assert!(
        b.is_in_error(),
        "the receive that no message filled was flushed"
    );
    assert_eq!(&borrowed.bytes().unwrap()[..LEN], &[0; LEN][..]);
    e.disarm();
    s1.spin()
        .expect("the send's completion was recorded before the panic");
    r1.spin().expect("the first message");
}

/// Hole 2. With stderr a closed pipe, `eprintln!` panics; the drain's "still in flight"
/// notice must not unwind out of it. A child process (this test again, with stderr a broken
/// pipe and libtest's capture off, so that printing really reaches fd 2) lets a scope's
/// receive outlive the drain deadline.
#[test]
#[ignore = "needs the testbed VM"]
fn a_closed_stderr_does_not_cut_a_scopes_drain_short() {
    const CHILD: &str = "RDMA_UNWIND_STDERR_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let out = catch_unwind(stderr_closed_child);
        match out {
            Ok(()) => println!("CHILD PASSED"),
            Err(p) => println!(
                "CHILD FAILED: {}",
                p.downcast_ref::<String>()
                    .map(String::as_str)
                    .or(p.downcast_ref::<&str>().copied())
                    .unwrap_or("?")
            ),
        }
        return;
    }
    let me = std::env::current_exe().unwrap();
    // This test binary (built by this workspace), run again as the child.
    let mut cmd = std::process::Command::new(me);
    cmd.args(["--ignored", "--exact", "--nocapture", "--test-threads=1"])
        .arg(integration_tests::process::test_name(
            module_path!(),
            "a_closed_stderr_does_not_cut_a_scopes_drain_short",
        ))
        .env(CHILD, "1");
    let out = integration_tests::process::run(&mut cmd, Duration::from_secs(120));
    let text = integration_tests::process::text(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("CHILD PASSED"), "{text}");
}

fn stderr_closed_child() {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two fds pipe() writes.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fds[0] is the read end this process just made and nothing else uses; closing
    // it leaves the write end with no reader (a broken pipe).
    assert_eq!(unsafe { libc::close(fds[0]) }, 0);
    // SAFETY: fds[1] is a live fd; fd 2 becomes a copy of it (the old stderr is closed).
    assert_eq!(unsafe { libc::dup2(fds[1], 2) }, 2);
    // The set-up is what it claims: printing to stderr panics here.
    assert!(
        panicked(|| eprintln!("probe")),
        "eprintln! panics on a closed stderr"
    );

    let tb = Testbed::get();
    let pd = pd(&tb);
    let (_a, b) = loopback_pair(&pd);
    let mut borrowed = recv_region(&pd);
    scope_with_deadline(Duration::from_millis(500), |s| {
        s.recv(&b, &mut borrowed).unwrap();
    });
    b.poll().unwrap();
    assert_eq!(
        b.outstanding(),
        0,
        "the receive was flushed before the scope ended"
    );
    assert!(b.is_in_error());
    assert_eq!(&borrowed.bytes().unwrap()[..LEN], &[0; LEN][..]);
}

/// A task awaits a receive on the same queue pair as a receive whose slot holds a waker that
/// panics when woken. The reactor's wake of the queue (the fan-out) must not raise that panic
/// inside the runtime's I/O driver, which would stop the runtime for every task (tokio's
/// current-thread runtime would lose its driver). The awaiting task is woken, and the runtime
/// goes on working.
#[test]
#[ignore = "needs the testbed VM"]
fn a_waker_that_panics_in_the_reactors_wake_does_not_stop_the_runtime() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    let evil_recv = b.post_recv(recv_region(&pd)).unwrap();
    let mut mine = b.post_recv(recv_region(&pd)).unwrap();
    let (e, waker) = evil(Site::Wake);
    let _disarm = e.disarm_on_drop();
    evil_recv.register_waker(&waker);
    e.arm();
    let rt = runtime();
    let sender = sends_later(&pd, a, &[1, 2]);
    let got = rt.block_on(async { tokio::time::timeout(T, &mut mine).await });
    let got = got.expect("the awaiting task was woken").unwrap();
    assert_eq!(&got.region.bytes().unwrap()[..LEN], &pattern(LEN, 2)[..]);
    assert_eq!(e.panicked(), 1, "the evil waker was woken, by the reactor");
    let slept = rt.block_on(async {
        let start = std::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(100)).await;
        start.elapsed()
    });
    assert!(
        slept < Duration::from_secs(5),
        "the runtime still runs: {slept:?}"
    );
    e.disarm();
    let first = evil_recv.spin_timeout(T).expect("first message").unwrap();
    assert_eq!(&first.region.bytes().unwrap()[..LEN], &pattern(LEN, 1)[..]);
    drop(sender.join().unwrap());
}

/// A waker whose `clone` panics while it is registered must not leave its request's slot
/// unable to store the next task's waker (futures' `AtomicWaker` stays "registering" if the
/// clone panics inside it, and then drops every later registration: an awaited request in
/// that slot would wake only by its timeout). The next await on the same handle wakes when
/// the message lands.
#[test]
#[ignore = "needs the testbed VM"]
fn a_slot_whose_waker_clone_panicked_still_wakes_the_next_task() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    let mut r = b.post_recv(recv_region(&pd)).unwrap();
    let (e, waker) = evil(Site::Clone);
    let _disarm = e.disarm_on_drop();
    e.arm();
    assert!(
        poll_once(&waker, |cx| r.poll_with(cx, parked)),
        "the clone panicked"
    );
    e.disarm();
    let rt = runtime();
    let sender = sends_later(&pd, a, &[7]);
    let start = std::time::Instant::now();
    let got = rt.block_on(async { tokio::time::timeout(T, &mut r).await });
    let waited = start.elapsed();
    let got = got.expect("woken within the timeout").unwrap();
    assert_eq!(&got.region.bytes().unwrap()[..LEN], &pattern(LEN, 7)[..]);
    assert!(
        waited < Duration::from_secs(4),
        "woken {waited:?} after the await began (message at 0.3 s): only a timer woke it"
    );
    drop(sender.join().unwrap());
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A thread that sends each seed's pattern from `a` 300 ms from now, then hands `a` back.
fn sends_later(
    pd: &std::sync::Arc<rdma_dmabuf::ProtectionDomain>,
    a: rdma_dmabuf::QueuePair,
    seeds: &'static [u8],
) -> std::thread::JoinHandle<rdma_dmabuf::QueuePair> {
    let pd = pd.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        for &seed in seeds {
            send(&pd, &a, seed);
        }
        a
    })
}
