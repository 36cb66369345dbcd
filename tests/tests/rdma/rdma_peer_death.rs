//! Liveness when the peer dies: a peer killed mid-transfer, across two nodes, fails every
//! pending request (owned and awaited) within the retry budget, never a hang. Split from
//! `rdma_liveness.rs`; runs in the two-node testbed.

use integration_tests::testbed::Testbed;
use integration_tests::verbs::{host_region, pd};
use rdma_dmabuf::{Access, Error, QueuePairBuilder};
use std::time::{Duration, Instant};

/// Slack on top of a computed budget, for a loaded emulated machine.
const SLACK: Duration = Duration::from_secs(5);

// Peer death across two nodes.

/// The out-of-band ports of the peer-death test: the endpoint exchange, and node b's report.
const DEATH_PORT: u16 = 18640;
const REPORT_PORT: u16 = 18641;
/// Set in the child process that node a starts to own its queue pair.
const CHILD_ENV: &str = "RDMA_LIVENESS_PEER_DEATH_CHILD";
/// Writes the child takes before its parent kills it.
const TRANSFERS_BEFORE_DEATH: usize = 5;
const WRITE_LEN: usize = 64 << 10;

/// Node a's child process in [`two_node::two_node_peer_killed_mid_transfer_fails_every_pending_request_within_the_retry_budget`]:
/// owns the queue pair, counts node b's writes, says when it has seen enough, and goes on
/// receiving until it is killed. Without its environment variable (a plain run) it does
/// nothing.
#[test]
#[ignore = "needs the testbed VM"]
fn peer_death_child_process() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    use std::io::Write;
    let tb = Testbed::get();
    let pd = pd(&tb);
    let qp = QueuePairBuilder::new(&pd).build().unwrap();
    let target = host_region(&pd, &[], WRITE_LEN, RW);
    let mine = [
        qp.endpoint().to_bytes().as_slice(),
        &target.remote().unwrap().to_bytes(),
    ]
    .concat();
    // The port of the test that started this child (the blocking or the awaited one).
    let port = std::env::var("RDMA_LIVENESS_DEATH_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(DEATH_PORT);
    let theirs = integration_tests::oob::serve(&tb.local_addr, port, &mine);
    let qp = qp
        .connect(&rdma_dmabuf::Endpoint::from_bytes(&theirs).unwrap())
        .unwrap();
    let mut recvs: std::collections::VecDeque<_> = (0..16)
        .map(|_| {
            qp.post_recv(host_region(&pd, &[], 4096, Access::LOCAL_WRITE))
                .unwrap()
        })
        .collect();
    let mut seen = 0;
    loop {
        let r = recvs.pop_front().unwrap();
        let got = r
            .spin_timeout(Duration::from_secs(120))
            .expect("node b writes")
            .expect("ok");
        seen += 1;
        if seen == TRANSFERS_BEFORE_DEATH {
            println!("TRANSFERS {seen}");
            std::io::stdout().flush().unwrap();
        }
        recvs.push_back(qp.post_recv(got.region).unwrap());
    }
}

const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

/// Node a: starts the child that owns the queue pair, SIGKILLs it once node b's writes flow,
/// then waits for node b's report.
fn peer_death_node_a(tb: &Testbed, death_port: u16, report_port: u16) {
    use std::io::BufRead;
    // This test binary again, built by this workspace.
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact"])
        .arg(integration_tests::process::test_name(
            module_path!(),
            "peer_death_child_process",
        ))
        .args(["--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env("RDMA_LIVENESS_DEATH_PORT", death_port.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the child");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(|l| l.ok())
        {
            // The harness prints "test <name> ... " without a newline before the test's
            // own output, so the word may follow it on the same line.
            if line.contains("TRANSFERS") {
                let _ = tx.send(());
            }
        }
    });
    let heard = rx.recv_timeout(Duration::from_secs(120));
    child.kill().expect("SIGKILL the child");
    let status = child.wait().expect("reap the child");
    heard.expect("the child saw node b's writes");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    eprintln!("node a: child killed after {TRANSFERS_BEFORE_DEATH} writes");
    let report = integration_tests::oob::serve(&tb.local_addr, report_port, b"killed");
    let report = String::from_utf8_lossy(&report);
    eprintln!("node b reports: {report}");
    assert!(report.starts_with("ok"), "node b: {report}");
}

/// Node b, the survivor: streams writes with immediate into the peer's region (and keeps
/// receives posted that the peer never answers) until the peer dies; then every pending
/// request must end in an error within the retry budget of the last acknowledged one.
fn peer_death_node_b(tb: &Testbed) {
    let pd = pd(tb);
    let builder = QueuePairBuilder::new(&pd);
    let budget = builder.retry_budget();
    let qp = builder.build().unwrap();
    let theirs =
        integration_tests::oob::connect(&tb.peer_addr, DEATH_PORT, &qp.endpoint().to_bytes());
    let (ep, rr) = theirs.split_at(rdma_dmabuf::Endpoint::WIRE_LEN);
    let qp = qp
        .connect(&rdma_dmabuf::Endpoint::from_bytes(ep).unwrap())
        .unwrap();
    let remote = rdma_dmabuf::RemoteRegion::from_bytes(rr).unwrap();
    let recvs: Vec<_> = (0..4)
        .map(|_| {
            qp.post_recv(host_region(&pd, &[], 4096, Access::LOCAL_WRITE))
                .unwrap()
        })
        .collect();
    let mut window: std::collections::VecDeque<_> = (0..8)
        .map(|i| {
            let src = host_region(&pd, &[i; 64], WRITE_LEN, Access::empty());
            qp.post_write(src, remote, Some(i.into())).unwrap()
        })
        .collect();
    let started = Instant::now();
    let mut last_ok = Instant::now();
    let mut acked = 0usize;
    let first = loop {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the peer was never killed"
        );
        let p = window.pop_front().unwrap();
        match p.spin_timeout(budget + SLACK) {
            Err(_) => panic!(
                "a write still pending {:?} after it was posted: no error within the retry budget {budget:?}",
                budget + SLACK
            ),
            Ok(Ok(done)) => {
                acked += 1;
                last_ok = Instant::now();
                // The poll that found this write may also have recorded a later one's error
                // (the peer just died): the queue pair then takes no more requests, and that
                // error is still in the window, so it comes next.
                if !qp.is_in_error() {
                    window.push_back(qp.post_write(done.region, remote, Some(0)).unwrap());
                }
            }
            Ok(Err(e)) => break e.error,
        }
    };
    let mut statuses = vec![status_of(&first)];
    let mut report = String::new();
    for p in window {
        match p.spin_timeout(budget + SLACK) {
            Ok(Err(e)) => statuses.push(status_of(&e.error)),
            Ok(Ok(_)) => report += "a write succeeded after the first failure; ",
            Err(_) => report += "a write never ended; ",
        }
    }
    for r in recvs {
        match r.spin_timeout(budget + SLACK) {
            Ok(Err(e)) => statuses.push(status_of(&e.error)),
            Ok(Ok(_)) => report += "a receive succeeded; ",
            Err(_) => report += "a receive never ended; ",
        }
    }
    let took = last_ok.elapsed();
    if took > budget + SLACK {
        report += &format!("errors took {took:?}, past the budget {budget:?}; ");
    }
    // How the death shows first depends on when the kill lands: the dead process's region
    // deregistered before its queue pair (a remote access error, NAKed at once), or its queue
    // pair gone (no answer at all: retries exceeded). Either is an error completion.
    if !matches!(first, Error::Completion { .. }) {
        report += &format!("first error {first}; ");
    }
    if qp.outstanding() != 0 {
        report += &format!("{} requests still outstanding; ", qp.outstanding());
    }
    let report = if report.is_empty() {
        format!(
            "ok: {acked} writes acknowledged, then {} requests ended in errors {statuses:?} within {took:?} of the last acknowledgement (budget {budget:?})",
            statuses.len()
        )
    } else {
        format!("fail: {report}")
    };
    eprintln!("node b: {report}");
    integration_tests::oob::connect(&tb.peer_addr, REPORT_PORT, report.as_bytes());
    assert!(report.starts_with("ok"), "{report}");
}

/// The `ibv_wc_status` of a completion error (or `u32::MAX` for another error).
fn status_of(e: &Error) -> u32 {
    match e {
        Error::Completion { status, .. } => *status,
        _ => u32::MAX,
    }
}

/// The out-of-band ports of the awaited peer-death test.
const ASYNC_DEATH_PORT: u16 = 18642;
const ASYNC_REPORT_PORT: u16 = 18643;

/// How one awaited request of node b ended.
enum End {
    Failed(u32, Instant),
    Succeeded,
    NeverEnded,
}

fn peer_death_node_b_awaited(tb: &Testbed) {
    use std::rc::Rc;
    let pd = pd(tb);
    let builder = QueuePairBuilder::new(&pd).completion_channel(true);
    let budget = builder.retry_budget();
    let bound = budget + SLACK;
    let qp = builder.build().unwrap();
    let theirs =
        integration_tests::oob::connect(&tb.peer_addr, ASYNC_DEATH_PORT, &qp.endpoint().to_bytes());
    let (ep, rr) = theirs.split_at(rdma_dmabuf::Endpoint::WIRE_LEN);
    let qp = Rc::new(
        qp.connect(&rdma_dmabuf::Endpoint::from_bytes(ep).unwrap())
            .unwrap(),
    );
    let remote = rdma_dmabuf::RemoteRegion::from_bytes(rr).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (acked, last_ok, ends) = tokio::task::LocalSet::new().block_on(&rt, async {
        let last_ok = Rc::new(std::cell::Cell::new(Instant::now()));
        let acked = Rc::new(std::cell::Cell::new(0usize));
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let (qp, pd) = (qp.clone(), pd.clone());
            tasks.push(tokio::task::spawn_local(async move {
                let r = qp
                    .post_recv(host_region(&pd, &[], 4096, Access::LOCAL_WRITE))
                    .unwrap();
                // Receives end when the queue pair fails: the kill comes within 300 s.
                match tokio::time::timeout(Duration::from_secs(300) + bound, r).await {
                    Ok(Err(e)) => End::Failed(status_of(&e.error), Instant::now()),
                    Ok(Ok(_)) => End::Succeeded,
                    Err(_) => End::NeverEnded,
                }
            }));
        }
        for i in 0..8u8 {
            let (qp, pd) = (qp.clone(), pd.clone());
            let (last_ok, acked) = (last_ok.clone(), acked.clone());
            tasks.push(tokio::task::spawn_local(async move {
                let started = Instant::now();
                let mut src = host_region(&pd, &[i; 64], WRITE_LEN, Access::empty());
                while started.elapsed() < Duration::from_secs(300) {
                    let w = qp.post_write(src, remote, Some(i.into()));
                    let w = match w {
                        Ok(w) => w,
                        // The queue pair failed under another writer: posts are refused.
                        Err(e) => return End::Failed(status_of(&e.error), Instant::now()),
                    };
                    match tokio::time::timeout(bound, w).await {
                        Ok(Ok(done)) => {
                            acked.set(acked.get() + 1);
                            last_ok.set(Instant::now());
                            src = done.region;
                        }
                        Ok(Err(e)) => return End::Failed(status_of(&e.error), Instant::now()),
                        Err(_) => return End::NeverEnded,
                    }
                }
                End::NeverEnded
            }));
        }
        let mut ends = Vec::new();
        for t in tasks {
            ends.push(t.await.expect("no panic"));
        }
        (acked.get(), last_ok.get(), ends)
    });
    let mut report = String::new();
    let mut statuses = Vec::new();
    let mut latest = last_ok;
    for e in &ends {
        match e {
            End::Failed(s, at) => {
                statuses.push(*s);
                latest = latest.max(*at);
            }
            End::Succeeded => report += "a receive succeeded; ",
            End::NeverEnded => report += "an awaited request never ended; ",
        }
    }
    let took = latest.duration_since(last_ok);
    if took > bound {
        report += &format!("errors took {took:?}, past the budget {budget:?}; ");
    }
    if acked == 0 {
        report += "no write was ever acknowledged; ";
    }
    if qp.outstanding() != 0 {
        report += &format!("{} requests still outstanding; ", qp.outstanding());
    }
    let report = if report.is_empty() {
        format!(
            "ok: {acked} awaited writes acknowledged, then {} awaited requests ended in errors {statuses:?} within {took:?} of the last acknowledgement (budget {budget:?})",
            statuses.len()
        )
    } else {
        format!("fail: {report}")
    };
    eprintln!("node b: {report}");
    integration_tests::oob::connect(&tb.peer_addr, ASYNC_REPORT_PORT, report.as_bytes());
    assert!(report.starts_with("ok"), "{report}");
}

/// Tests of the two-node testbed: `cargo xtask test` runs this module on both nodes.
mod two_node {
    use super::*;

    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_peer_killed_mid_transfer_fails_every_pending_request_within_the_retry_budget() {
        let tb = Testbed::get();
        if tb.is_server() {
            peer_death_node_a(&tb, DEATH_PORT, REPORT_PORT);
        } else {
            peer_death_node_b(&tb);
        }
    }

    /// As the blocking peer-death test, with node b's requests awaited on tokio: eight writers,
    /// each its own task re-posting its region until a write fails, and four receives awaited
    /// in tasks of their own; once the peer is killed, every one of those futures resolves to an
    /// error within the retry budget (each await bounded, so none can hang unseen).
    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_awaited_requests_end_in_errors_within_the_retry_budget_when_the_peer_is_killed() {
        let tb = Testbed::get();
        if tb.is_server() {
            peer_death_node_a(&tb, ASYNC_DEATH_PORT, ASYNC_REPORT_PORT);
        } else {
            peer_death_node_b_awaited(&tb);
        }
    }
}
