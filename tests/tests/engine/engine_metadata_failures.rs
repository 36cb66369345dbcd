//! A metadata service that cannot publish, under `register` and `unregister`: a segment
//! whose publication failed is not left registered (no peer reaches it, the name is free
//! again), and a segment unregistered while publication fails is deregistered all the same
//! (a peer's stale descriptor is refused by the NIC, the memory the program reused is
//! untouched). Peer `b` asks `a`'s control listener directly (the embedded backend). Needs
//! the testbed VM (one node).

use gpu_rdma_engine::{
    Agent, AgentDescriptor, Batch, Error, ErrorKind, Memory, MetadataService, PeerRecord, Settings,
};
use integration_tests::cuda_standin::{standin, vouched_device, Kind};
use integration_tests::engine::{host, loopback_settings};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::pattern;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);
const N: usize = 64 << 10;

/// Publishes nothing, and fails to while `down` is set.
struct Flaky {
    down: AtomicBool,
}

impl MetadataService for Flaky {
    fn publish(&self, _: &AgentDescriptor, _: SocketAddr) -> gpu_rdma_engine::Result<()> {
        if self.down.load(Ordering::SeqCst) {
            return Err(Error::Metadata {
                op: "publish",
                detail: "the backend is down".into(),
            });
        }
        Ok(())
    }
    fn withdraw(&self, _: &str) -> gpu_rdma_engine::Result<()> {
        Ok(())
    }
    fn lookup(&self, agent: &str) -> gpu_rdma_engine::Result<PeerRecord> {
        Err(Error::UnknownAgent(agent.into()))
    }
}

fn settings(tb: &Testbed) -> Settings {
    loopback_settings(tb, 16 << 10)
}

/// Agent `a` on the flaky service (down or not), and `b` that knows `a`'s address.
fn pair(tb: &Testbed, down: bool) -> (Agent, Agent, Arc<Flaky>) {
    let flaky = Arc::new(Flaky {
        down: AtomicBool::new(down),
    });
    let a = Agent::with_metadata("a", settings(tb), flaky.clone()).unwrap();
    let b = Agent::new("b", settings(tb)).unwrap();
    b.add_peer("a", a.address());
    b.register("src", host(&pattern(N, 3), N)).unwrap();
    (a, b, flaky)
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_segment_whose_publication_failed_is_not_left_registered() {
    let tb = Testbed::get();
    let (a, b, flaky) = pair(&tb, true);
    let s = standin();
    let dev = vouched_device();
    let base = s.alloc(N, 1, Kind::Device);
    s.write(base, &vec![0xaa; N]);
    let e = a.register_cuda("gpu", &dev, base, N as u64).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e:?}");
    let e = a.register("host", host(&[], N)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e:?}");
    assert!(a.descriptor().segments.is_empty());
    assert!(a.cache_stats().iter().all(|s| s.entries == 0));
    // No peer reaches them.
    let write = Batch::new().write("src", 0, "a", "gpu", 0, N as u64);
    let e = b
        .transfer(&write)
        .expect_err("a segment that is not registered");
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e:?}");
    assert!(s.read(base, N) == vec![0xaa; N]);
    // The service back, the names are free again.
    flaky.down.store(false, Ordering::SeqCst);
    a.register_cuda("gpu", &dev, base, N as u64).unwrap();
    a.register("host", host(&[], N)).unwrap();
    b.transfer(&write).unwrap().wait(WAIT).expect("written");
    assert_eq!(s.read(base, N), pattern(N, 3));
    a.unregister("gpu").unwrap();
    drop(a);
    s.free(base);
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_segment_unregistered_while_publication_fails_is_out_of_reach() {
    let tb = Testbed::get();
    let (a, b, flaky) = pair(&tb, false);
    let s = standin();
    let dev = vouched_device();
    let base = s.alloc(N, 1, Kind::Device);
    s.write(base, &vec![0; N]);
    a.register_cuda("gpu", &dev, base, N as u64).unwrap();
    a.register("host", host(&[], N)).unwrap();
    let to_gpu = Batch::new().write("src", 0, "a", "gpu", 0, N as u64);
    let to_host = Batch::new().write("src", 0, "a", "host", 0, N as u64);
    b.transfer(&to_gpu).unwrap().wait(WAIT).expect("written");
    b.transfer(&to_host).unwrap().wait(WAIT).expect("written");
    // b holds a's descriptor; a's service goes down, and a unregisters both.
    flaky.down.store(true, Ordering::SeqCst);
    assert!(matches!(a.unregister("gpu").unwrap(), Memory::Cuda { .. }));
    let Memory::Host(mut h) = a.unregister("host").unwrap() else {
        panic!("the host buffer back")
    };
    assert!(a.cache_stats().iter().all(|s| s.entries == 0));
    s.write(base, &vec![0xaa; N]);
    h.as_mut_slice().fill(0xbb);
    for batch in [&to_gpu, &to_host] {
        match b.transfer(batch).map(|t| t.wait(WAIT)) {
            // Refused by a's NIC; a's descriptor, asked again, has no such segment: the
            // entry fails as a batch checked against it would.
            Ok(Err(Error::EntryFailed { error, .. })) => {
                assert!(
                    matches!(&*error, Error::UnknownSegment { agent, .. } if agent == "a"),
                    "{error:?}"
                )
            }
            // The descriptor was dropped after the first refusal: not found any more.
            Err(e) => assert_eq!(e.kind(), ErrorKind::NotFound, "{e:?}"),
            other => panic!("a write after unregister gave {other:?}"),
        }
    }
    assert!(
        s.read(base, N) == vec![0xaa; N],
        "a peer wrote after unregister"
    );
    assert!(h.as_slice().iter().all(|&x| x == 0xbb));
    drop(a);
    s.free(base);
}
