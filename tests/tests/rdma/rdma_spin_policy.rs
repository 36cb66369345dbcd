//! `SpinPolicy`: what a queue pair's busy waits do between polls. The default is `Shared`
//! (a spin-loop hint, a yield every 64th poll); `Dedicated` polls with nothing between (the
//! steps themselves are unit-tested in `rdma-dmabuf/src/spin.rs`). These check, against the
//! real rxe device in the testbed VM, that every busy wait still ends under `Dedicated`: the
//! owned handle's `spin` and `spin_timeout`, a receive's, a scope's, an awaited request's
//! busy-poll budget, a shared receive queue's; that the data is the data sent; and that a
//! deadline is still kept when nothing ever comes. And that the policy is what the waits do:
//! the kernel's count of `sched_yield` calls (`/proc/schedstat`, with schedstats on) grows
//! during a long `Shared` wait and not during a `Dedicated` one. Every test takes a lock: the
//! yield count is system-wide, and the harness runs tests two at a time.

use integration_tests::process::{alone, within};
use integration_tests::runtime::run_local;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{deep_pair, host_region, hub_and_peers, pattern, pd};
use rdma_dmabuf::{
    scope, scope_with_deadline, Access, Local, MultiChannelBuilder, QueuePair, SharedReceiveQueue,
    SpinPolicy,
};
use std::time::{Duration, Instant};

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
const LEN: usize = 4096;
const T: Duration = Duration::from_secs(20);

fn dedicated(qps: &[&QueuePair]) {
    for qp in qps {
        assert_eq!(qp.spin_policy(), SpinPolicy::Shared, "the default");
        qp.set_spin_policy(SpinPolicy::Dedicated);
        assert_eq!(qp.spin_policy(), SpinPolicy::Dedicated);
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn every_wait_of_a_dedicated_queue_pair_ends_with_the_data_sent() {
    let _l = alone();
    within(Duration::from_secs(120), "every dedicated wait", || {
        let tb = Testbed::get();
        let pd = pd(&tb);
        let (a, b) = deep_pair(&pd);
        dedicated(&[&a, &b]);
        let target = host_region(&pd, &[], LEN, RW);
        let remote = target.remote().unwrap();

        // Owned write, spun.
        let want = pattern(LEN, 1);
        let src = host_region(&pd, &want, LEN, Access::empty());
        let done = a
            .post_write(Local::new(src, 0..LEN as u64), remote, None)
            .unwrap()
            .spin()
            .unwrap();
        assert_eq!(done.wc.byte_len as usize, LEN);
        let target = {
            let buf = target.into_inner().unwrap();
            assert_eq!(&buf.as_slice()[..LEN], &want[..], "spin");
            rdma_dmabuf::MemoryRegion::register(&pd, buf, RW).unwrap()
        };
        let remote = target.remote().unwrap();

        // Owned write with an immediate, spun with a timeout, answered by a receive spun.
        let want = pattern(LEN, 2);
        let inbox = host_region(&pd, &[], 64, Access::LOCAL_WRITE);
        let recv = b.post_recv(inbox).unwrap();
        let src = host_region(&pd, &want, LEN, Access::empty());
        let w = a
            .post_write(Local::new(src, 0..LEN as u64), remote, Some(7))
            .unwrap();
        w.spin_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("a dedicated spin_timeout missed its write"))
            .unwrap();
        let got = recv.spin().unwrap();
        assert_eq!(got.wc.imm, Some(7));
        let buf = target.into_inner().unwrap();
        assert_eq!(&buf.as_slice()[..LEN], &want[..], "spin_timeout");

        // A scope's send and receive.
        let mut inbox = host_region(&pd, &[], 256, Access::LOCAL_WRITE);
        let out = host_region(&pd, &pattern(256, 3), 256, Access::empty());
        scope(|s| {
            let r = s.recv(&b, &mut inbox).unwrap();
            let w = s.send(&a, out.part(0..200), None).unwrap();
            w.spin().unwrap();
            assert_eq!(r.spin().unwrap().byte_len, 200);
        });
        assert_eq!(&inbox.bytes().unwrap()[..200], &pattern(256, 3)[..200]);

        // Awaited: the busy-poll budget (no hint between polls) then, if need be, the channel.
        let want = pattern(LEN, 4);
        let target = host_region(&pd, &[], LEN, RW);
        let remote = target.remote().unwrap();
        let src = host_region(&pd, &want, LEN, Access::empty());
        let p = a
            .post_write(Local::new(src, 0..LEN as u64), remote, None)
            .unwrap();
        run_local(p).unwrap();
        assert_eq!(&target.into_inner().unwrap().as_slice()[..LEN], &want[..]);
        assert_eq!(a.outstanding() + b.outstanding(), 0);
    });
}

/// Nothing is done between two polls under `Dedicated`, but every deadline is still kept: a
/// receive nobody answers comes back at its timeout from the handle's `spin_timeout` and
/// `wait`, a scope's drain, a shared receive queue's `spin_timeout` and a multi-peer gather;
/// the receive still works afterwards.
#[test]
#[ignore = "needs the testbed VM"]
fn dedicated_spin_policy_still_honours_every_deadline() {
    let _l = alone();
    within(Duration::from_secs(60), "dedicated-policy waits", || {
        let tb = Testbed::get();
        let pd = pd(&tb);
        let (a, b) = deep_pair(&pd);
        a.set_spin_policy(SpinPolicy::Dedicated);
        b.set_spin_policy(SpinPolicy::Dedicated);
        assert_eq!(b.spin_policy(), SpinPolicy::Dedicated);
        // Pending::spin_timeout on a receive nobody answers.
        let r = b
            .post_recv(host_region(&pd, &[], 4096, Access::LOCAL_WRITE))
            .unwrap();
        let t = Instant::now();
        let r = r
            .spin_timeout(Duration::from_millis(300))
            .expect_err("nothing was sent");
        let took = t.elapsed();
        eprintln!("Pending::spin_timeout(300 ms) under Dedicated took {took:?}");
        assert!(took < Duration::from_secs(3), "{took:?}");
        // Pending::wait too.
        let t = Instant::now();
        let r = r
            .wait(Duration::from_millis(300))
            .expect_err("nothing sent");
        eprintln!(
            "Pending::wait(300 ms) under Dedicated took {:?}",
            t.elapsed()
        );
        assert!(t.elapsed() < Duration::from_secs(3));
        // The receive still works afterwards.
        let src = host_region(&pd, b"late", 4096, Access::empty());
        a.post_send(src.into_part(0..4), None)
            .unwrap()
            .spin()
            .unwrap();
        let got = r.spin_timeout(T).expect("arrives").expect("ok");
        assert_eq!(&got.region.bytes().unwrap()[..4], b"late");

        // A scope whose receive is never answered: flushed at its deadline.
        let mut dst = host_region(&pd, &[], 4096, Access::LOCAL_WRITE);
        let t = Instant::now();
        scope_with_deadline(Duration::from_millis(300), |s| {
            let p = s.recv(&b, &mut dst).unwrap();
            drop(p);
        });
        let took = t.elapsed();
        eprintln!("scope_with_deadline(300 ms) under Dedicated took {took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert!(b.is_in_error(), "the scope flushed its queue pair");
        assert_eq!(b.outstanding(), 0);

        // A shared receive queue's spin_timeout.
        let srq = SharedReceiveQueue::new(&pd, 4).unwrap();
        srq.set_spin_policy(SpinPolicy::Dedicated);
        let p = srq
            .post_recv(host_region(&pd, &[], 4096, Access::LOCAL_WRITE))
            .unwrap();
        let t = Instant::now();
        let p = p
            .spin_timeout(Duration::from_millis(300))
            .expect_err("nothing sent");
        eprintln!(
            "SrqPending::spin_timeout(300 ms) under Dedicated took {:?}",
            t.elapsed()
        );
        assert!(t.elapsed() < Duration::from_secs(3));
        drop(p);

        // A multi-peer gather whose peers never send, under Dedicated.
        let (hub, _peers) = hub_and_peers(
            &pd,
            MultiChannelBuilder::new(&pd, 2).timeout(Duration::from_millis(300)),
            2,
        );
        for i in 0..2 {
            hub.peer(i).unwrap().set_spin_policy(SpinPolicy::Dedicated);
        }
        let mut r0 = host_region(&pd, &[], 4096, Access::LOCAL_WRITE);
        let mut r1 = host_region(&pd, &[], 4096, Access::LOCAL_WRITE);
        let t = Instant::now();
        let e = hub
            .gather_recv(&mut [(0, r0.part_mut(0..64)), (1, r1.part_mut(0..64))])
            .expect_err("nobody sends");
        eprintln!(
            "gather_recv (timeout 300 ms) under Dedicated took {:?}: {e}",
            t.elapsed()
        );
        assert_eq!(e.errno(), Some(libc::ETIMEDOUT), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
        // The borrows ended: the bytes are ours again.
        assert_eq!(r0.bytes().unwrap()[0], 0);
        assert_eq!(r1.bytes().unwrap()[0], 0);
    });
}

/// The `sched_yield` calls made so far on every CPU (the first field of each `cpu` line of
/// `/proc/schedstat`; counted only while `kernel.sched_schedstats` is on).
fn yields() -> u64 {
    std::fs::read_to_string("/proc/schedstat")
        .expect("/proc/schedstat")
        .lines()
        .filter(|l| l.starts_with("cpu"))
        .map(|l| l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap())
        .sum()
}

/// Schedstats on while it lives, back to what they were when dropped.
struct Schedstats(String);

impl Schedstats {
    const KNOB: &str = "/proc/sys/kernel/sched_schedstats";
    fn on() -> Schedstats {
        let was = std::fs::read_to_string(Self::KNOB).expect("sched_schedstats");
        std::fs::write(Self::KNOB, "1").expect("turning schedstats on (the VM runs as root)");
        Schedstats(was)
    }
}

impl Drop for Schedstats {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::KNOB, self.0.trim());
    }
}

/// How many yields one long wait of each kind made under `policy`: a 16 MiB write spun
/// (tens of milliseconds and more under the emulator), the same with `spin_timeout`, and the
/// same in a scope.
fn yields_of_long_waits(policy: SpinPolicy) -> [u64; 3] {
    const BIG: usize = 16 << 20;
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = deep_pair(&pd);
    a.set_spin_policy(policy);
    b.set_spin_policy(policy);
    let target = host_region(&pd, &[], BIG, RW);
    let remote = target.remote().unwrap();
    let mut src = Some(host_region(&pd, &pattern(BIG, 9), BIG, Access::empty()));
    let mut counts = [0u64; 3];
    for (i, count) in counts.iter_mut().enumerate() {
        let region = src.take().unwrap();
        let before = yields();
        let p = a
            .post_write(Local::new(region, 0..BIG as u64), remote, None)
            .unwrap();
        let done = match i {
            0 => p.spin().unwrap(),
            1 => p
                .spin_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("a 16 MiB write took over a minute"))
                .unwrap(),
            _ => {
                let region = p.spin().unwrap().region;
                let before_scope = yields();
                scope(|s| {
                    s.write(&a, region.part(0..BIG as u64), remote, None)
                        .unwrap()
                        .spin()
                        .unwrap();
                });
                *count = yields() - before_scope;
                src = Some(region);
                continue;
            }
        };
        if i < 2 {
            *count = yields() - before;
        }
        src = Some(done.region);
    }
    drop(b);
    counts
}

/// The rule `SpinPolicy::Dedicated` claims, seen from the kernel: a long busy wait under the
/// default yields (every 64th poll; every poll in `spin_timeout`), one under `Dedicated`
/// never does. Fails if any of the three waits ignored its queue pair's policy.
#[test]
#[ignore = "needs the testbed VM"]
fn dedicated_waits_never_yield_and_shared_ones_do() {
    let _l = alone();
    let _stats = Schedstats::on();
    let shared = yields_of_long_waits(SpinPolicy::Shared);
    let dedicated = yields_of_long_waits(SpinPolicy::Dedicated);
    println!(
        "yields during [spin, spin_timeout, scope]: shared {shared:?}, dedicated {dedicated:?}"
    );
    for (i, what) in ["spin", "spin_timeout", "a scope's spin"]
        .iter()
        .enumerate()
    {
        assert!(
            shared[i] >= 4,
            "{what}: the default wait yielded {} times in a long wait",
            shared[i]
        );
        // Anything else in the VM that yields meanwhile counts too: a little slack.
        assert!(
            dedicated[i] <= 2,
            "{what}: a dedicated wait yielded {} times (shared: {})",
            dedicated[i],
            shared[i]
        );
    }
}
