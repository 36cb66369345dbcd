//! Awaited requests on tokio (rdma-dmabuf's `tokio` feature): thousands of concurrent writes
//! and reads across several queue pairs on one runtime, every byte read back and compared;
//! futures dropped mid-flight (a `select!` that lost, a timeout that fired) whose regions
//! stay with the queue pair until the NIC is done, then are released exactly once, with the
//! memory around them untouched; the whole of it again under valgrind. Runs in the testbed
//! VM. The tests count MRs, so they run one at a time (a lock).

use integration_tests::counts::rdma_resources;
use integration_tests::runtime::run_local;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{connect_pair, host_region, pattern, pd};
use rdma_dmabuf::{Access, Local, QueuePair, QueuePairBuilder};
use std::rc::Rc;
use std::sync::Mutex;
use std::time::Duration;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

/// A pair of queue pairs whose requesting side has a completion channel (what wakes the
/// runtime) and room for `depth` requests.
fn async_pair(
    pd: &std::sync::Arc<rdma_dmabuf::ProtectionDomain>,
    depth: u32,
) -> (QueuePair, QueuePair) {
    connect_pair(
        QueuePairBuilder::new(pd)
            .completion_channel(true)
            .send_depth(depth)
            .recv_depth(depth),
        QueuePairBuilder::new(pd)
            .completion_channel(true)
            .send_depth(depth)
            .recv_depth(depth),
    )
}

const QPS: usize = 4;
const LANES: usize = 8;
const ROUNDS: usize = 64;
const LEN: usize = 4096;

/// Every lane of every queue pair writes its pattern into its slice of the peer's region,
/// reads it back into another region, and compares; all lanes run at once on one thread.
#[test]
#[ignore = "needs the testbed VM"]
fn thousands_of_awaited_writes_and_reads_on_four_queue_pairs_arrive_byte_for_byte() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let pd = pd(&tb);
    let ops = run_local(async {
        let mut tasks = Vec::new();
        let mut keep = Vec::new();
        for q in 0..QPS {
            let (a, b) = async_pair(&pd, LANES as u32 * 2);
            let target = host_region(&pd, &[], LEN * LANES, RW);
            let remote = target.remote().unwrap();
            let a = Rc::new(a);
            for lane in 0..LANES {
                let a = a.clone();
                let pd = pd.clone();
                let slice = remote.slice((lane * LEN) as u64, LEN as u64).unwrap();
                tasks.push(tokio::task::spawn_local(async move {
                    let mut src = host_region(&pd, &[], LEN, Access::empty());
                    let mut dst = host_region(&pd, &[], LEN, Access::LOCAL_WRITE);
                    for round in 0..ROUNDS {
                        let seed = (q * 31 + lane * 7 + round) as u8;
                        let want = pattern(LEN, seed);
                        src.bytes_mut().unwrap().copy_from_slice(&want);
                        let w = a.post_write(src, slice, None).unwrap().await;
                        src = w.expect("write completes").region;
                        let r = a.post_read(dst, slice).unwrap().await;
                        dst = r.expect("read completes").region;
                        assert!(
                            dst.bytes().unwrap() == &want[..],
                            "qp {q} lane {lane} round {round}: the bytes read back differ"
                        );
                    }
                    2 * ROUNDS
                }));
            }
            keep.push((a, b, target));
        }
        let mut ops = 0;
        for t in tasks {
            ops += t.await.expect("a lane panicked");
        }
        drop(keep);
        ops
    });
    assert_eq!(ops, QPS * LANES * ROUNDS * 2);
    eprintln!("{ops} awaited writes and reads verified");
}

/// Receives whose futures are dropped (the timeout fires first): their regions stay with
/// the queue pair (their MRs stay registered) until the peer's sends complete them; they are
/// then released, once each. The queue pair goes on serving awaited requests meanwhile.
#[test]
#[ignore = "needs the testbed VM"]
fn dropped_receive_futures_keep_their_regions_until_the_completion_then_release_them() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = async_pair(&pd, 16);
    let mrs = rdma_resources("mr");
    run_local(async {
        for _ in 0..4 {
            let r = b
                .post_recv(host_region(&pd, &[], LEN, Access::LOCAL_WRITE))
                .unwrap();
            // Nothing is sent yet: the timeout fires and drops the future.
            assert!(tokio::time::timeout(Duration::from_millis(20), r)
                .await
                .is_err());
        }
        assert_eq!(b.outstanding(), 4, "the dropped receives are still posted");
        assert_eq!(
            rdma_resources("mr"),
            mrs + 4,
            "and their regions registered"
        );
        // A select! that loses drops its receive too.
        let r = b
            .post_recv(host_region(&pd, &[], LEN, Access::LOCAL_WRITE))
            .unwrap();
        tokio::select! {
            biased;
            _ = std::future::ready(()) => {}
            _ = r => panic!("nothing was sent"),
        }
        assert_eq!(b.outstanding(), 5);
        // The sends complete the abandoned receives (awaited on a's side).
        let mut src = host_region(&pd, &[9; 64], LEN, Access::empty());
        for _ in 0..5 {
            let s = a.post_send(Local::new(src, 0..64), None).unwrap().await;
            src = s.expect("send completes").region;
        }
        // b's completions are polled by the next awaited request on b.
        let last = b
            .post_recv(host_region(&pd, &[], LEN, Access::LOCAL_WRITE))
            .unwrap();
        let s = a.post_send(Local::new(src, 0..64), None).unwrap().await;
        s.expect("send completes");
        let got = last.await.expect("the awaited receive completes");
        assert_eq!(got.wc.byte_len, 64);
    });
    assert_eq!(b.outstanding(), 0, "every dropped receive completed");
    assert_eq!(rdma_resources("mr"), mrs, "their regions were released");
}

/// Reads whose futures are dropped at once, into shards of one region, and the queue pair
/// dropped before any of them was polled: the shards stay lent (in the slots) until the
/// destruction, the guard shards between them are untouched after it, and the region is
/// released with its last shard.
#[test]
#[ignore = "needs the testbed VM"]
fn reads_dropped_mid_flight_are_released_with_the_queue_pair_and_touch_nothing_else() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let pd = pd(&tb);
    let source = host_region(&pd, &pattern(LEN, 77), LEN, RW);
    let remote = source.remote().unwrap().slice(0, 1024).unwrap();
    let mrs = rdma_resources("mr");
    // Eight 1 KiB shards of a region filled with 0xee: the even ones are read into, the odd
    // ones are guards, kept here.
    let mut shards = host_region(&pd, &[0xee; 8192], 8192, Access::LOCAL_WRITE)
        .split_into_chunks(1024)
        .unwrap();
    let guards: Vec<_> = shards
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(i, _)| i)
        .collect();
    let mut kept = Vec::new();
    {
        let (a, _b) = async_pair(&pd, 16);
        run_local(async {
            for (i, shard) in shards.drain(..).enumerate() {
                if i % 2 == 1 {
                    kept.push(shard);
                    continue;
                }
                let r = a.post_read_parts([shard], remote).unwrap();
                tokio::select! {
                    biased;
                    _ = std::future::ready(()) => {}
                    _ = r => unreachable!("a biased select takes the ready branch"),
                }
            }
        });
        assert_eq!(a.outstanding(), 4, "the dropped reads are still lent");
        assert_eq!(
            rdma_resources("mr"),
            mrs + 1,
            "the shards' region is registered"
        );
        // The queue pair drops here: flushed, drained, destroyed, then the lent shards freed.
    }
    assert_eq!(kept.len(), guards.len());
    for g in &kept {
        assert!(
            g.bytes().unwrap().iter().all(|&b| b == 0xee),
            "a guard shard was touched"
        );
    }
    drop(kept);
    assert_eq!(
        rdma_resources("mr"),
        mrs,
        "the region is released with its last shard"
    );
    drop(source);
}

/// The drop and completion paths of the tests above again, under valgrind's memcheck.
#[test]
#[ignore = "needs the testbed VM"]
fn dropped_futures_are_valgrind_clean() {
    use integration_tests::process::test_name;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    integration_tests::process::valgrind_self(
        &[
            "--exact",
            &test_name(
                module_path!(),
                "dropped_receive_futures_keep_their_regions_until_the_completion_then_release_them",
            ),
            &test_name(
                module_path!(),
                "reads_dropped_mid_flight_are_released_with_the_queue_pair_and_touch_nothing_else",
            ),
        ],
        2,
    );
}
