//! One region shared for NIC reads by many requests at once ([`MemoryRegion::share`]):
//! overlapping leases in flight together on several queue pairs and threads, the region
//! refused back while any is out, and the registration kept until the last lease goes.
//! Runs in the testbed VM.

use integration_tests::counts::rdma_resources;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{deep_pair, host_region, pattern, pd, read_remote};
use rdma_dmabuf::{Access, HostBuffer, MemoryRegion, RemoteRegion, SharedSource, Source};
use std::time::Duration;

/// The test that counts MRs (device-wide) runs alone: it takes this for writing, every other
/// test of the file for reading.
static COUNTING: std::sync::RwLock<()> = std::sync::RwLock::new(());

const T: Duration = Duration::from_secs(30);
const LEN: u64 = 64 << 10;
const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

/// Lease `k` of 16: 16 KiB of the shared region, each starting 3 KiB after the last (so
/// every lease overlaps its neighbours).
fn range(k: u64) -> std::ops::Range<u64> {
    k * 3072..k * 3072 + (16 << 10)
}

/// Where lease `k` lands in the target.
fn landing(target: &RemoteRegion, k: u64) -> RemoteRegion {
    target.slice(k * (16 << 10), 16 << 10).unwrap()
}

#[test]
#[ignore = "needs the testbed VM"]
fn overlapping_leases_of_one_region_are_read_by_many_requests_at_once() {
    let _counting = COUNTING.read().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, _b) = deep_pair(&pd);
    let (c, _d) = deep_pair(&pd);
    let data = pattern(LEN as usize, 7);
    let shared: SharedSource<HostBuffer> =
        host_region(&pd, &data, LEN as usize, Access::empty()).share();
    let target = host_region(&pd, &[], 16 * (16 << 10), RW);
    let remote = target.remote().unwrap();
    // 16 writes in flight at once, from overlapping leases, over two queue pairs.
    let mut pending = Vec::new();
    for k in 0..16 {
        let qp = if k % 2 == 0 { &a } else { &c };
        let lease = shared.lease(range(k));
        let p = qp
            .post_write_parts([lease], landing(&remote, k), None)
            .unwrap_or_else(|e| panic!("write {k}: {}", e.error));
        pending.push(p);
    }
    assert_eq!(shared.leases(), 16);
    // The CPU may read the region meanwhile (the NIC only reads it too).
    assert_eq!(shared.region().bytes().unwrap(), &data[..]);
    // The region is not given back while a request may still read it.
    let shared = shared
        .try_into_region()
        .expect_err("refused while 16 leases are in flight");
    let mut back: Vec<Source<HostBuffer>> = Vec::new();
    for p in pending {
        let done = p.spin_timeout(T).unwrap().unwrap();
        back.extend(done.parts);
    }
    let got = read_remote(&pd, &a, remote);
    for k in 0..16 {
        let r = range(k);
        let at = (k * (16 << 10)) as usize;
        assert_eq!(
            &got[at..at + (16 << 10)],
            &data[r.start as usize..r.end as usize],
            "lease {k}"
        );
    }
    assert_eq!(
        shared.leases(),
        16,
        "the leases came back with their completions"
    );
    assert!(back.iter().all(|s| s.same_region(&back[0])));
    let shared = shared
        .try_into_region()
        .expect_err("the program still holds them");
    drop(back);
    let region: MemoryRegion<HostBuffer> = shared.try_into_region().expect("no lease left");
    assert_eq!(region.bytes().unwrap(), &data[..], "never written");
}

#[test]
#[ignore = "needs the testbed VM"]
fn leases_cross_threads_and_the_last_one_deregisters_the_region() {
    let _counting = COUNTING.write().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let pd = pd(&tb);
    let data = pattern(LEN as usize, 9);
    let target = host_region(&pd, &[], 16 * (16 << 10), RW);
    let remote = target.remote().unwrap();
    let pairs: Vec<_> = (0..4).map(|_| deep_pair(&pd)).collect();
    let mrs = rdma_resources("mr");
    let shared = host_region(&pd, &data, LEN as usize, Access::empty()).share();
    assert_eq!(rdma_resources("mr"), mrs + 1);
    // Four threads post four writes each from their own leases, and keep their handles:
    // the share itself is dropped while every request is in flight.
    let leases: Vec<Vec<Source<HostBuffer>>> = (0..4)
        .map(|t| (0..4).map(|i| shared.lease(range(t * 4 + i))).collect())
        .collect();
    drop(shared);
    assert_eq!(
        rdma_resources("mr"),
        mrs + 1,
        "the leases keep the registration"
    );
    let returned: Vec<Vec<Source<HostBuffer>>> = std::thread::scope(|s| {
        let handles: Vec<_> = pairs
            .into_iter()
            .zip(leases)
            .enumerate()
            .map(|(t, ((qp, peer), mine))| {
                s.spawn(move || {
                    let _peer = peer;
                    let pending: Vec<_> = mine
                        .into_iter()
                        .enumerate()
                        .map(|(i, lease)| {
                            let k = (t * 4 + i) as u64;
                            qp.post_write_parts([lease], landing(&remote, k), None)
                                .unwrap_or_else(|e| panic!("write {k}: {}", e.error))
                        })
                        .collect();
                    let back: Vec<Source<HostBuffer>> = pending
                        .into_iter()
                        .flat_map(|p| p.spin_timeout(T).unwrap().unwrap().parts)
                        .collect();
                    back
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (reader, _peer) = deep_pair(&pd);
    let got = read_remote(&pd, &reader, remote);
    for k in 0..16u64 {
        let r = range(k);
        let at = (k * (16 << 10)) as usize;
        assert_eq!(
            &got[at..at + (16 << 10)],
            &data[r.start as usize..r.end as usize]
        );
    }
    assert_eq!(rdma_resources("mr"), mrs + 1);
    drop(returned);
    assert_eq!(
        rdma_resources("mr"),
        mrs,
        "the last lease deregistered the region"
    );
}
