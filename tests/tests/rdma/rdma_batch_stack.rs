//! `post_write_batch` keeps its `K` work requests, SGEs and parts on the stack, so `K` is
//! bounded at compile time (`MAX_BATCH`): an unbounded one within the send queue's depth (8192
//! of rxe's 16384 `max_qp_wr`) overflows a thread's default 2 MiB stack in a debug build and
//! aborts the process. The largest batch allowed runs here
//! on such a thread, in a child process so that an abort is observed rather than taking the
//! test binary down.

use integration_tests::testbed::Testbed;
use integration_tests::verbs::{connect_pair, host_region, pd};
use rdma_dmabuf::{Access, QueuePairBuilder, Shard, MAX_BATCH};
use std::time::Duration;

const K: usize = MAX_BATCH;
const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

fn batch_of_k() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, _b) = connect_pair(
        QueuePairBuilder::new(&pd).send_depth(K as u32),
        QueuePairBuilder::new(&pd),
    );
    let target = host_region(&pd, &[], 64 * K, RW);
    let r = target.remote().unwrap();
    let src = host_region(&pd, &[5; 64 * K], 64 * K, Access::empty());
    let shards: Vec<Shard<_>> = src.split_into_chunks(64).unwrap();
    let parts: Box<[Shard<_>; K]> = shards.into_boxed_slice().try_into().unwrap();
    let remotes: Box<[_; K]> = (0..K)
        .map(|j| r.slice(64 * j as u64, 64).unwrap())
        .collect::<Vec<_>>()
        .into_boxed_slice()
        .try_into()
        .unwrap();
    // A thread with the default stack (2 MiB), as `std::thread::spawn` and tokio's workers
    // give.
    std::thread::spawn(move || {
        let done = a
            .post_write_batch(*parts, *remotes)
            .map_err(|e| e.error)
            .expect("batch posted")
            .spin_timeout(Duration::from_secs(60))
            .expect("completed");
        assert!(done.is_ok());
    })
    .join()
    .unwrap();
}

#[test]
#[ignore = "needs the testbed VM"]
fn the_largest_batch_fits_a_default_thread_stack() {
    if std::env::var_os("BATCH_STACK_CHILD").is_some() {
        batch_of_k();
        return;
    }
    let me = std::env::current_exe().unwrap();
    // The test binary itself, built by this workspace.
    let out = std::process::Command::new(me)
        .args(["--ignored", "--exact"])
        .arg(integration_tests::process::test_name(
            module_path!(),
            "the_largest_batch_fits_a_default_thread_stack",
        ))
        .arg("--nocapture")
        .env("BATCH_STACK_CHILD", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "a batch of {K} writes (send_depth {K}) killed the process ({}): {}",
        out.status,
        err.lines()
            .filter(|l| l.contains("overflow") || l.contains("panicked"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
}
