//! Liveness: no default setting waits forever, no wait overflows on extreme timeouts, and bad
//! sizes and indices are refused with the real figures instead of panicking or being
//! truncated. Runs in the testbed VM (except the host-only checks at the top).
//!
//! Every wait in these tests has its own bound, so code that hangs fails the test instead of
//! stalling the run.

use integration_tests::process::within;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{connect_pair, host_region, hub_and_peers, loopback_pair, pd};
use rdma_dmabuf::{
    Access, CmConnector, CmListener, Error, HostBuffer, MemoryRegion, MultiChannelBuilder,
    ProtectionDomain, QueuePair, QueuePairBuilder, WorkKind,
};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `IBV_WC_RETRY_EXC_ERR` and `IBV_WC_RNR_RETRY_EXC_ERR`.
const RETRY_EXC: u32 = 12;
const RNR_RETRY_EXC: u32 = 13;

/// Slack on top of a computed budget, for a loaded emulated machine.
const SLACK: Duration = Duration::from_secs(5);

// Host-only checks (no device needed).

#[test]
fn host_buffer_lengths_past_the_address_space_are_refused_with_the_figure() {
    for len in [usize::MAX, usize::MAX - 4094, 1usize << 63] {
        let err = HostBuffer::new(len).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains(&len.to_string()), "names the length: {text}");
        assert!(!text.contains(" 0 bytes"), "{text}");
    }
}

// Retry budgets.

/// A queue pair connected to a queue pair number nobody owns any more.
fn connected_to_nobody(pd: &Arc<ProtectionDomain>, b: QueuePairBuilder) -> QueuePair {
    let gone = QueuePairBuilder::new(pd).build().unwrap();
    let ghost = gone.endpoint();
    drop(gone);
    b.build().unwrap().connect(&ghost).unwrap()
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_send_nobody_acknowledges_fails_within_the_retry_budget() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let builder = QueuePairBuilder::new(&pd);
    let budget = builder.retry_budget();
    assert!(
        budget <= Duration::from_secs(10),
        "the default budget is finite and short: {budget:?}"
    );
    let qp = connected_to_nobody(&pd, builder);
    let err = send_fails_within(&qp, &pd, budget, "the send retries forever");
    match err {
        Error::Completion {
            status,
            kind: WorkKind::Send,
            ..
        } => assert_eq!(status, RETRY_EXC, "{err}"),
        ref other => panic!("expected a completion error, got {other}"),
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_send_the_peer_never_posts_a_receive_for_fails_within_the_rnr_budget() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let budget = QueuePairBuilder::new(&pd)
        .rnr_budget()
        .expect("finite by default");
    let (a, _b) = loopback_pair(&pd);
    let err = send_fails_within(&a, &pd, budget, "RNR retries forever");
    match err {
        Error::Completion { status, .. } => assert_eq!(status, RNR_RETRY_EXC, "{err}"),
        ref other => panic!("expected a completion error, got {other}"),
    }
}

/// Sends on `qp` and waits for the completion, which must be an error within `budget` (plus
/// [`SLACK`]); `forever` says what a missing completion would mean. Returns the error.
fn send_fails_within(
    qp: &QueuePair,
    pd: &Arc<ProtectionDomain>,
    budget: Duration,
    forever: &str,
) -> Error {
    let src = host_region(pd, b"anyone?", 4096, Access::empty());
    let t = Instant::now();
    let outcome = qp
        .post_send(src, None)
        .unwrap()
        .spin_timeout(budget + SLACK)
        .unwrap_or_else(|_| panic!("no completion within {:?}: {forever}", budget + SLACK));
    let took = t.elapsed();
    let err = outcome.expect_err("the send cannot succeed").error;
    assert!(
        took <= budget + SLACK,
        "{took:?} past the budget {budget:?}"
    );
    eprintln!("failed after {took:?} (budget {budget:?}): {err}");
    err
}

#[test]
#[ignore = "needs the testbed VM"]
fn retry_settings_are_validated_at_build() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let refused = |b: QueuePairBuilder, what: &str| {
        let err = b.build().unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
        assert!(err.to_string().contains(what), "{err}");
    };
    refused(QueuePairBuilder::new(&pd).retry_count(8), "retry_count 8");
    refused(QueuePairBuilder::new(&pd).rnr_retry(7), "rnr_retry_forever");
    refused(QueuePairBuilder::new(&pd).rnr_retry(200), "rnr_retry 200");
    refused(QueuePairBuilder::new(&pd).ack_timeout(0), "forever");
    refused(QueuePairBuilder::new(&pd).min_rnr_timer(32), "32");
    // Forever, asked for explicitly, is allowed, and has no RNR budget.
    let b = QueuePairBuilder::new(&pd).rnr_retry_forever();
    assert_eq!(b.rnr_budget(), None);
    b.build().unwrap();
    QueuePairBuilder::new(&pd)
        .retry_count(7)
        .rnr_retry(0)
        .ack_timeout(31)
        .min_rnr_timer(0)
        .build()
        .unwrap();
}

// Extreme values.

#[test]
#[ignore = "needs the testbed VM"]
fn duration_max_means_forever_in_every_wait() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = connect_pair(
        QueuePairBuilder::new(&pd),
        QueuePairBuilder::new(&pd).completion_channel(true),
    );
    for _ in 0..2 {
        let r = b
            .post_recv(host_region(&pd, &[], 4096, Access::LOCAL_WRITE))
            .unwrap();
        let s = a
            .post_send(host_region(&pd, b"x", 4096, Access::empty()), None)
            .unwrap();
        s.spin_timeout(Duration::MAX)
            .expect("completes")
            .expect("ok");
        r.wait(Duration::MAX).expect("completes").expect("ok");
    }
    // Nothing sent: a short timeout still ends the wait, with the handle back.
    let r = b
        .post_recv(host_region(&pd, &[], 4096, Access::LOCAL_WRITE))
        .unwrap();
    let r = r.wait(Duration::from_millis(50)).expect_err("nothing sent");
    drop(r);
}

#[test]
#[ignore = "needs the testbed VM"]
fn duration_max_in_fenced_posts() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let buf = integration_tests::exporters::Exporter::Udmabuf.allocate(1 << 16);
    let region = MemoryRegion::register_dmabuf(&pd, buf, 0, 1 << 16, None, Access::LOCAL_WRITE)
        .expect("dma-buf region (patched rxe)");
    rdma_dmabuf::wait_for_fences(&region, rdma_dmabuf::FencedOp::Recv, Duration::MAX)
        .expect("no fences: returns at once");
    let (a, b) = loopback_pair(&pd);
    let r = b
        .post_fenced(rdma_dmabuf::FencedOp::Recv, region, Duration::MAX)
        .expect("posted");
    a.post_send(host_region(&pd, b"fenced", 4096, Access::empty()), None)
        .unwrap()
        .spin_timeout(Duration::from_secs(30))
        .expect("completes")
        .expect("ok");
    r.spin_timeout(Duration::from_secs(30))
        .expect("completes")
        .expect("ok");
}

#[test]
#[ignore = "needs the testbed VM"]
fn duration_max_in_rdma_cm_resolve_accept_and_disconnect() {
    let tb = Testbed::get();
    let addr: SocketAddr = format!("{}:20191", tb.local_addr).parse().unwrap();
    let listener = CmListener::bind(addr).expect("bind");
    let server = std::thread::spawn(move || {
        let pd = ProtectionDomain::new(&listener.context().unwrap()).unwrap();
        let (qp, _) = listener
            .accept(QueuePairBuilder::new(&pd), b"", Duration::MAX)
            .expect("accept");
        qp.wait_disconnected(Duration::MAX)
            .expect("the client disconnects");
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let qp = loop {
        let c = CmConnector::resolve(addr, Duration::MAX).expect("resolve");
        let pd = ProtectionDomain::new(&c.context().unwrap()).unwrap();
        match c.connect(QueuePairBuilder::new(&pd), b"", Duration::MAX) {
            Ok((qp, _)) => break qp,
            Err(e) if e.errno() == Some(libc::ECONNREFUSED) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(e) => panic!("connect: {e}"),
        }
    };
    drop(qp);
    server.join().expect("server side");
}

#[test]
#[ignore = "needs the testbed VM"]
fn queue_depths_past_the_device_are_refused_with_the_figures() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let max_qp_wr = pd.context().query_device().unwrap().max_qp_wr;
    for (send, recv) in [(u32::MAX, 1), (1, u32::MAX), (max_qp_wr + 1, 1)] {
        let err = QueuePairBuilder::new(&pd)
            .send_depth(send)
            .recv_depth(recv)
            .build()
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
        let text = err.to_string();
        for figure in [send.to_string(), recv.to_string(), max_qp_wr.to_string()] {
            assert!(text.contains(&figure), "names {figure}: {text}");
        }
    }
    let err = MultiChannelBuilder::new(&pd, 1)
        .send_depth(u32::MAX)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("max_qp_wr"), "{err}");
    // The largest allowed depth still builds.
    QueuePairBuilder::new(&pd)
        .send_depth(max_qp_wr.min(4096))
        .recv_depth(1)
        .build()
        .unwrap();
}

// Scopes and multi-peer operations.

/// A hub channel to `n` peers (queue pairs of this process), with `timeout` for its
/// blocking operations.
fn hub_with_timeout(
    pd: &Arc<ProtectionDomain>,
    n: usize,
    timeout: Duration,
) -> (rdma_dmabuf::MultiChannel, Vec<QueuePair>) {
    hub_and_peers(pd, MultiChannelBuilder::new(pd, n).timeout(timeout), n)
}

#[test]
#[ignore = "needs the testbed VM"]
fn gather_recv_with_a_bad_peer_index_after_a_good_one_posts_nothing_and_returns() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (hub, peers) = hub_with_timeout(&pd, 2, Duration::from_secs(60));
    let (hub, err) = within(Duration::from_secs(30), "gather_recv", move || {
        let mut a = host_region(&pd, &[], 4096, Access::LOCAL_WRITE);
        let mut b = host_region(&pd, &[], 4096, Access::LOCAL_WRITE);
        let mut parts = [(0, a.part_mut(0..4096)), (5, b.part_mut(0..4096))];
        let err = hub.gather_recv(&mut parts).unwrap_err();
        (hub, err)
    });
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("peer 5 of 2"), "{err}");
    assert_eq!(
        hub.peer(0).unwrap().outstanding(),
        0,
        "nothing was left posted"
    );
    drop(peers);
}

/// A gather of two receives, from peer 0 and from peer `second` (of `peers`), of which only
/// peer 0 answers: the gather fails with `ETIMEDOUT` after the channel's timeout and the
/// receive nobody answered is flushed (no hang, no abort).
fn gather_recv_with_one_answer_times_out_and_flushes(peers: usize, second: usize) {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let timeout = Duration::from_secs(1);
    let (hub, peers) = hub_with_timeout(&pd, peers, timeout);
    let t = Instant::now();
    let (hub, peers, err) = within(Duration::from_secs(60), "gather_recv", move || {
        let sent = peers[0]
            .post_send(host_region(&pd, b"part 0", 4096, Access::empty()), None)
            .unwrap();
        let mut a = host_region(&pd, &[], 4096, Access::LOCAL_WRITE);
        let mut b = host_region(&pd, &[], 4096, Access::LOCAL_WRITE);
        let mut parts = [(0, a.part_mut(0..4096)), (second, b.part_mut(0..4096))];
        let err = hub.gather_recv(&mut parts).unwrap_err();
        sent.spin_timeout(Duration::from_secs(30))
            .expect("the send completed")
            .expect("ok");
        (hub, peers, err)
    });
    let took = t.elapsed();
    assert_eq!(err.errno(), Some(libc::ETIMEDOUT), "{err}");
    assert!(took < timeout * 2 + SLACK, "{took:?}");
    assert_eq!(hub.peer(second).unwrap().outstanding(), 0, "flushed");
    drop(peers);
}

#[test]
#[ignore = "needs the testbed VM"]
fn gather_recv_whose_peer_never_sends_times_out_and_flushes() {
    gather_recv_with_one_answer_times_out_and_flushes(2, 1);
}

/// Two receives from the same peer, one answered: the queue pair's first request finished,
/// its second did not (a scope once flushed only queue pairs whose first request was
/// unfinished, and then aborted the process).
#[test]
#[ignore = "needs the testbed VM"]
fn gather_recv_twice_from_one_peer_with_one_message_times_out_and_flushes() {
    gather_recv_with_one_answer_times_out_and_flushes(1, 0);
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_scope_flushes_an_unanswered_receive_at_its_drain_deadline() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = loopback_pair(&pd);
    let t = Instant::now();
    let (b, dst) = within(Duration::from_secs(60), "scope drain", move || {
        let mut dst = host_region(&pd, &[], 4096, Access::LOCAL_WRITE);
        rdma_dmabuf::scope_with_deadline(Duration::from_millis(500), |s| {
            let p = s.recv(&b, dst.part_mut(0..4096)).unwrap();
            // A bounded wait hands the handle back; the scope keeps the request.
            let _still_pending = p
                .spin_timeout(Duration::from_millis(100))
                .expect_err("nobody sends");
        });
        (b, dst)
    });
    let took = t.elapsed();
    assert!(took < Duration::from_millis(500) + SLACK, "{took:?}");
    assert_eq!(b.outstanding(), 0, "flushed before the scope returned");
    assert!(dst.bytes().is_ok(), "the region is the CPU's again");
    drop(a);
}

/// A send that completes, then a receive nobody answers, on the same queue pair: the scope
/// must flush that queue pair although its first request there had finished (it once
/// flushed only queue pairs whose first request was unfinished, and then aborted).
#[test]
#[ignore = "needs the testbed VM"]
fn a_scope_flushes_a_queue_pair_whose_first_request_finished() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = loopback_pair(&pd);
    let inbox = a
        .post_recv(host_region(&pd, &[], 4096, Access::LOCAL_WRITE))
        .unwrap();
    let t = Instant::now();
    let (b, results) = within(Duration::from_secs(60), "scope drain", move || {
        let ping = host_region(&pd, b"ping", 4096, Access::empty());
        let mut reply = host_region(&pd, &[], 4096, Access::LOCAL_WRITE);
        let results = rdma_dmabuf::scope_with_deadline(Duration::from_millis(500), |s| {
            let sent = s.send(&b, ping.part(0..4), None).unwrap().spin();
            let answer = s.recv(&b, reply.part_mut(0..4096)).unwrap();
            (
                sent,
                answer.spin_timeout(Duration::from_millis(100)).is_err(),
            )
        });
        (b, results)
    });
    let took = t.elapsed();
    assert!(results.0.is_ok(), "the ping was sent: {:?}", results.0);
    assert!(results.1, "nobody answered");
    assert!(took < Duration::from_millis(500) + SLACK, "{took:?}");
    assert_eq!(b.outstanding(), 0, "flushed before the scope returned");
    inbox
        .spin_timeout(Duration::from_secs(10))
        .unwrap()
        .unwrap();
}

/// At the drain deadline only queue pairs with requests still in flight are flushed: a write
/// that completed long before, whose handle nobody spun, does not end its connection because
/// of an unanswered receive on another queue pair: the scope never flushes a queue pair only
/// because it has not yet seen its request finish.
#[test]
#[ignore = "needs the testbed VM"]
fn a_scope_spares_a_queue_pair_whose_requests_all_completed() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (_a1, b1) = loopback_pair(&pd);
    let (a2, _b2) = loopback_pair(&pd);
    let (b1, a2) = within(Duration::from_secs(60), "scope drain", move || {
        let src = host_region(&pd, b"data", 64, Access::empty());
        let sink = host_region(&pd, &[], 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let mut inbox = host_region(&pd, &[], 64, Access::LOCAL_WRITE);
        rdma_dmabuf::scope_with_deadline(Duration::from_millis(300), |s| {
            let _never = s.recv(&b1, inbox.part_mut(0..64)).unwrap();
            let _written = s
                .write(&a2, src.part(0..64), sink.remote().unwrap(), None)
                .unwrap();
            // Time for the write to complete on the NIC; its handle is never spun.
            std::thread::sleep(Duration::from_millis(100));
        });
        (b1, a2)
    });
    assert!(
        b1.is_in_error(),
        "the unanswered receive's queue pair was flushed"
    );
    assert!(
        !a2.is_in_error(),
        "a queue pair with nothing in flight was moved to the error state"
    );
    assert_eq!(b1.outstanding() + a2.outstanding(), 0);
}

/// The same, ended by a panic: the panic reaches the caller (no abort).
#[test]
#[ignore = "needs the testbed VM"]
fn a_panicking_scope_flushes_a_queue_pair_whose_first_request_finished() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = loopback_pair(&pd);
    let inbox = a
        .post_recv(host_region(&pd, &[], 4096, Access::LOCAL_WRITE))
        .unwrap();
    let (b, caught) = within(Duration::from_secs(60), "scope unwind", move || {
        let ping = host_region(&pd, b"ping", 4096, Access::empty());
        let mut reply = host_region(&pd, &[], 4096, Access::LOCAL_WRITE);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rdma_dmabuf::scope(|s| {
                s.send(&b, ping.part(0..4), None).unwrap().spin().unwrap();
                let _answer = s.recv(&b, reply.part_mut(0..4096)).unwrap();
                panic!("the caller gives up");
            })
        }));
        (b, caught.is_err())
    });
    assert!(caught, "the panic reached the caller");
    assert_eq!(b.outstanding(), 0);
    inbox
        .spin_timeout(Duration::from_secs(10))
        .unwrap()
        .unwrap();
}

// GID indices.

/// Adds `n` IPv4 addresses to the testbed's RDMA netdev (each brings a GID per RoCE version
/// the device has) and removes them on drop.
struct ExtraAddresses {
    netdev: String,
    addrs: Vec<String>,
}

impl ExtraAddresses {
    fn add(n: usize) -> ExtraAddresses {
        let netdev = std::env::var("NETDEV").expect("the testbed sets NETDEV");
        let addrs: Vec<String> = (0..n)
            .map(|i| format!("10.77.{}.{}/32", i / 250, i % 250 + 1))
            .collect();
        let extra = ExtraAddresses { netdev, addrs };
        extra.batch("add");
        extra
    }

    fn batch(&self, verb: &str) {
        use std::io::Write;
        let mut child = std::process::Command::new("ip")
            .args(["-batch", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("ip");
        let mut stdin = child.stdin.take().unwrap();
        for a in &self.addrs {
            writeln!(stdin, "addr {verb} {a} dev {}", self.netdev).unwrap();
        }
        drop(stdin);
        assert!(child.wait().unwrap().success(), "ip addr {verb}");
    }
}

impl Drop for ExtraAddresses {
    fn drop(&mut self) {
        self.batch("del");
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn gid_indices_are_checked_against_the_table_at_build() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let ctx = pd.context().clone();
    let table = ctx.query_port(1).unwrap().gid_table_len;
    let refused = |index: u32, why: &str| {
        let err = QueuePairBuilder::new(&pd)
            .gid_index(index)
            .build()
            .unwrap_err();
        match &err {
            Error::GidIndex {
                index: i,
                table_len,
                ..
            } => {
                assert_eq!((*i, *table_len), (index, table), "{err}");
            }
            other => panic!("GID {index}: expected Error::GidIndex, got {other}"),
        }
        let text = err.to_string();
        assert!(text.contains(&format!("GID index {index}")), "{text}");
        assert!(text.contains(&format!("{table} entries")), "{text}");
        assert!(text.contains(why), "{text}");
        assert_eq!(err.errno(), Some(libc::EINVAL));
    };
    // Past the table.
    refused(table, "outside the table");
    refused(u32::MAX, "outside the table");
    // An empty entry inside the table.
    let is_empty = |i: u32| {
        ctx.gid(1, i)
            .map_or(true, |g| g == rdma_dmabuf::Gid::default())
    };
    let empty = (0..256u32)
        .rev()
        .find(|&i| is_empty(i))
        .expect("an empty entry below 256");
    refused(empty, "empty");
    // Enough addresses that GID 257 really exists (rxe has one RoCE v2 entry per IPv4
    // address; devices with RoCE v1 have two).
    let _extra = ExtraAddresses::add(300);
    let deadline = Instant::now() + Duration::from_secs(30);
    while is_empty(257) {
        assert!(Instant::now() < deadline, "GID 257 never appeared");
        std::thread::sleep(Duration::from_millis(100));
    }
    // A real GID past what the address vector can carry: refused at build, not truncated.
    refused(257, "8 bits");
    refused(256, "8 bits");
    // The testbed's own index still builds, and so does one of those added, below 256.
    QueuePairBuilder::new(&pd)
        .gid_index(tb.gid_index)
        .build()
        .unwrap();
    let added = (0..256u32)
        .rev()
        .find(|&i| ctx.gid_type(1, i).as_deref() == Some("RoCE v2"))
        .expect("a RoCE v2 GID below 256");
    QueuePairBuilder::new(&pd).gid_index(added).build().unwrap();
}
