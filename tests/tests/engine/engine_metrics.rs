//! Operating the engine on one node (two agents over rxe loopback): its metrics counted
//! against batches whose bytes and chunks are known, the Prometheus endpoint, a dead peer
//! in the counters, a trace of one batch's life, waiting for a peer, and a remote segment
//! that is gone. Needs the testbed VM.

use gpu_rdma_engine::{Agent, Batch, EntryStatus, Error, ErrorKind, Metrics, Settings};
use integration_tests::engine::host;
use integration_tests::testbed::Testbed;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

const CHUNK: u64 = 64 << 10;
const WAIT: Duration = Duration::from_secs(120);

fn settings(tb: &Testbed) -> Settings {
    Settings {
        devices: Some(vec![tb.device.clone()]),
        bind: "127.0.0.1:0".parse().unwrap(),
        chunk_size: CHUNK,
        ..Settings::default()
    }
}

/// Agents `a` (with `sa`) and `b`, each knowing the other; `a` has a 4 MiB segment
/// "src", `b` one "dst".
fn pair(tb: &Testbed, names: (&str, &str), sa: Settings) -> (Agent, Agent) {
    let a = Agent::new(names.0, sa).expect("agent a");
    let b = Agent::new(names.1, settings(tb)).expect("agent b");
    a.add_peer(names.1, b.address());
    b.add_peer(names.0, a.address());
    a.register("src", host(&[7; 4096], 4 << 20)).unwrap();
    b.register("dst", host(&[], 4 << 20)).unwrap();
    (a, b)
}

/// The rail of `m` to `peer`, the only one with one device each side.
fn rail<'m>(m: &'m Metrics, peer: &str) -> &'m gpu_rdma_engine::RailMetrics {
    let to: Vec<_> = m.rails.iter().filter(|r| r.peer == peer).collect();
    assert_eq!(to.len(), 1, "one rail to {peer}: {m:#?}");
    to[0]
}

/// `GET path` at `addr`: the status line and the body.
fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("an answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    (head.lines().next().unwrap_or("").to_string(), body.into())
}

/// The value of the sample `line` (its name and labels, exactly) in the text format.
fn sample(text: &str, line: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(line)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
#[ignore = "needs the testbed VM"]
fn metrics_count_known_batches_per_rail_and_the_endpoint_serves_them() {
    let tb = Testbed::get();
    let sa = Settings {
        metrics_address: Some("127.0.0.1:0".parse().unwrap()),
        ..settings(&tb)
    };
    let (a, b) = pair(&tb, ("ma", "mb"), sa);
    let addr = a.metrics_address().expect("an endpoint");
    // 8 writes of 3 chunks and a bit (4 chunks each), 2 reads of 1 chunk.
    let len = 3 * CHUNK + 100;
    let writes = (0..8).fold(Batch::new(), |b, k| {
        b.write("src", k * len, "mb", "dst", k * len, len)
    });
    a.transfer(&writes).unwrap().wait(WAIT).expect("written");
    let reads = Batch::new()
        .read("src", 0, "mb", "dst", 0, CHUNK)
        .read("src", CHUNK, "mb", "dst", CHUNK, CHUNK);
    a.transfer(&reads).unwrap().wait(WAIT).expect("read");
    let m = a.metrics();
    let r = rail(&m, "mb");
    assert_eq!(r.local_device, tb.device);
    assert_eq!(
        (r.write_bytes, r.write_requests),
        (8 * len, 8 * 4),
        "{m:#?}"
    );
    assert_eq!((r.read_bytes, r.read_requests), (2 * CHUNK, 2), "{m:#?}");
    assert_eq!(r.errors, 0);
    assert_eq!((m.batches, m.entries_done, m.entries_failed), (2, 10, 0));
    assert_eq!(m.chunk_latency.count, 34, "one latency per chunk: {m:#?}");
    assert_eq!(m.batch_latency.count, 2);
    assert!(m.batch_latency.sum >= m.chunk_latency.sum / 34);
    assert_eq!(m.in_flight, 0);
    let workers_used = m.queue_pairs / u64::from(Settings::default().queue_pairs);
    assert!(
        (1..=2).contains(&workers_used) && m.queue_pairs % 2 == 0,
        "queue pairs {} for 1 rail x 2 per rail x workers used: {m:#?}",
        m.queue_pairs
    );
    assert_eq!(b.metrics().control.queue_pairs, m.queue_pairs);
    assert!(m.metadata.lookups >= 1 && m.metadata.lookup_failures == 0);
    assert!(m.metadata.publishes >= 1 && m.metadata.publish_failures == 0);
    assert!(m.completion_errors.is_empty() && m.failovers == 0);
    assert_eq!(m.segments, 1);
    assert_eq!(m.caches.len(), 1);

    let (status, text) = get(addr, "/metrics");
    assert!(status.contains(" 200 "), "{status}");
    let labels = format!(
        "{{agent=\"ma\",peer=\"mb\",local_device=\"{}\",remote_device=\"0\"",
        tb.device
    );
    let at = |name: &str, extra: &str| {
        sample(&text, &format!("{name}{labels}{extra}}}"))
            .unwrap_or_else(|| panic!("no {name}{labels}{extra} in:\n{text}"))
    };
    assert_eq!(
        at("gpu_rdma_rail_bytes_total", ",op=\"write\""),
        (8 * len) as f64
    );
    assert_eq!(at("gpu_rdma_rail_requests_total", ",op=\"read\""), 2.0);
    assert_eq!(at("gpu_rdma_rail_errors_total", ""), 0.0);
    let count = sample(&text, "gpu_rdma_chunk_latency_seconds_count{agent=\"ma\"}");
    assert_eq!(count, Some(34.0), "{text}");
    let inf = "gpu_rdma_chunk_latency_seconds_bucket{le=\"+Inf\",agent=\"ma\"}";
    assert_eq!(sample(&text, inf), Some(34.0), "{text}");
    let entries = "gpu_rdma_entries_total{agent=\"ma\",outcome=\"done\"}";
    assert_eq!(sample(&text, entries), Some(10.0), "{text}");
    assert!(text.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");
    assert!(get(addr, "/other").0.contains(" 404 "));
    // Clients that connect and send nothing (more than the endpoint keeps) hold no thread
    // and keep no scrape waiting, and the agent's drop does not wait for them either.
    let idle: Vec<TcpStream> = (0..40)
        .map(|_| TcpStream::connect(addr).expect("a connection"))
        .collect();
    let t0 = Instant::now();
    assert!(get(addr, "/metrics").0.contains(" 200 "));
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    let half = "GET /metrics HTTP/1.1\r\n";
    for mut c in &idle[..5] {
        c.write_all(half.as_bytes()).unwrap();
    }
    // The endpoint is the agent's: it goes with it.
    let t0 = Instant::now();
    drop((a, b));
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(
        TcpStream::connect(addr).is_err(),
        "the endpoint outlived its agent"
    );
    drop(idle);
}

#[test]
#[ignore = "needs the testbed VM"]
fn metrics_off_count_batches_but_no_chunk() {
    let tb = Testbed::get();
    let sa = Settings {
        metrics: false,
        ..settings(&tb)
    };
    let (a, _b) = pair(&tb, ("oa", "ob"), sa);
    let batch = Batch::new().write("src", 0, "ob", "dst", 0, 4 * CHUNK);
    a.transfer(&batch).unwrap().wait(WAIT).expect("written");
    let m = a.metrics();
    assert!(m.rails.is_empty(), "{m:#?}");
    assert_eq!((m.chunk_latency.count, m.in_flight), (0, 0));
    assert_eq!(
        (m.batches, m.entries_done, m.batch_latency.count),
        (1, 1, 1)
    );
}

#[test]
#[ignore = "needs the testbed VM"]
fn metrics_count_a_dead_peer_and_its_failed_entries() {
    let tb = Testbed::get();
    let (a, b) = pair(&tb, ("da", "db"), settings(&tb));
    let batch = (0..3).fold(Batch::new(), |bt, k| {
        bt.write("src", k * CHUNK, "db", "dst", k * CHUNK, CHUNK)
    });
    a.transfer(&batch).unwrap().wait(WAIT).expect("written");
    drop(b);
    let t = a
        .transfer(&batch)
        .expect("accepted: its descriptor is cached");
    let e = t.wait(WAIT).expect_err("the peer is gone");
    assert_eq!(e.kind(), ErrorKind::PeerDown, "{e}");
    let m = a.metrics();
    assert_eq!(m.peers_marked_down, 1, "{m:#?}");
    assert_eq!((m.batches, m.entries_done, m.entries_failed), (2, 3, 3));
    assert_eq!(rail(&m, "db").write_requests, 3);
    // Its queue pairs went with the connection.
    assert_eq!(m.queue_pairs % 2, 0);
    assert!(m.queue_pairs <= 2, "{m:#?}");
    // The next look-up asks the dead peer: it fails, counted.
    let before = m.metadata.lookup_failures;
    assert!(a.transfer(&batch).is_err());
    assert_eq!(a.metrics().metadata.lookup_failures, before + 1);
}

/// Everything the engine traces in this test process, as the fmt subscriber writes it.
static TRACE: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        TRACE.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_trace_of_one_batch_shows_its_life_from_check_to_done() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        use tracing_subscriber::util::SubscriberInitExt;
        tracing_subscriber::fmt()
            .with_max_level(tracing_subscriber::filter::LevelFilter::DEBUG)
            .with_ansi(false)
            .with_writer(|| Capture)
            .finish()
            .try_init()
            .expect("the only subscriber of this process");
    });
    let tb = Testbed::get();
    let (a, _b) = pair(&tb, ("ta", "tb"), settings(&tb));
    let batch = Batch::new()
        .write("src", 0, "tb", "dst", 0, 2 * CHUNK)
        .notify(b"traced".to_vec());
    a.transfer(&batch).unwrap().wait(WAIT).expect("written");
    let text = String::from_utf8_lossy(&TRACE.lock().unwrap()).into_owned();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("agent=ta")).collect();
    let find = |what: &str| {
        lines
            .iter()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what:?} in the trace of ta:\n{}", lines.join("\n")))
    };
    let registered = find("segment registered");
    let looked_up = find("peer looked up");
    let planned = find("batch checked and planned");
    let posted = find("posted");
    let done = find("batch done");
    assert!(registered < planned && looked_up < planned && planned < posted && posted < done);
    assert!(lines[planned].contains("entries=1") && lines[planned].contains("chunks=2"));
    // The worker's events are inside the batch's span, which names the batch.
    for at in [posted, done] {
        assert!(lines[at].contains("batch{agent=ta id=0}"), "{}", lines[at]);
    }
    assert!(lines[posted].contains("peer=tb") && lines[posted].contains("chunks=2"));
    assert!(lines[done].contains("entries_done=1") && lines[done].contains("entries_failed=0"));
}

#[test]
#[ignore = "needs the testbed VM"]
fn wait_for_peer_waits_for_an_agent_that_starts_later_and_is_bounded() {
    let tb = Testbed::get();
    let a = Agent::new("wa", settings(&tb)).unwrap();
    // A port for the late agent, free when it starts (nothing else binds in this test).
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    a.add_peer("late", port);
    let late = std::thread::spawn({
        let s = Settings {
            bind: port,
            ..settings(&tb)
        };
        move || {
            std::thread::sleep(Duration::from_millis(500));
            let l = Agent::new("late", s).expect("the late agent");
            l.register("seg", host(&[], 4096)).unwrap();
            std::thread::sleep(Duration::from_secs(3));
        }
    });
    let start = Instant::now();
    let d = a
        .wait_for_peer("late", Duration::from_secs(30))
        .expect("it came");
    let waited = start.elapsed();
    assert_eq!(d.agent, "late");
    assert!(waited >= Duration::from_millis(450), "{waited:?}");
    assert!(waited < Duration::from_secs(10), "{waited:?}");
    late.join().unwrap();

    let start = Instant::now();
    let e = a
        .wait_for_peer("nobody", Duration::from_millis(300))
        .expect_err("nobody comes");
    let waited = start.elapsed();
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    assert!(
        matches!(&e, Error::PeerNotUp { agent, .. } if agent == "nobody"),
        "{e}"
    );
    assert!(
        e.to_string().contains("unknown agent"),
        "the last cause: {e}"
    );
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(2));

    // A peer address that takes the connection and never answers: each look-up would hang
    // for the io_timeout (10 s), the wait still ends at its own bound.
    let hole = TcpListener::bind("127.0.0.1:0").unwrap();
    a.add_peer("hole", hole.local_addr().unwrap());
    let start = Instant::now();
    let e = a
        .wait_for_peer("hole", Duration::from_millis(300))
        .expect_err("no answer");
    let waited = start.elapsed();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    assert!(
        waited < Duration::from_secs(2),
        "{waited:?} for a 300 ms wait: {e}"
    );
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_remote_segment_unregistered_since_its_descriptor_was_cached_fails_as_unknown() {
    let tb = Testbed::get();
    let (a, b) = pair(&tb, ("ga", "gb"), settings(&tb));
    let batch = Batch::new().write("src", 0, "gb", "dst", 0, 2 * CHUNK);
    a.transfer(&batch).unwrap().wait(WAIT).expect("written");
    // a's cached descriptor still names "dst"; b no longer has it.
    b.unregister("dst").unwrap();
    let t = a
        .transfer(&batch)
        .expect("checked against the cached descriptor");
    let e = t.wait(WAIT).expect_err("the segment is gone");
    let Error::EntryFailed { error, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(
        **error,
        Error::UnknownSegment {
            agent: "gb".into(),
            segment: "dst".into()
        },
        "the same error as a batch checked after the unregistration"
    );
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(matches!(&t.status()[0], EntryStatus::Failed(_)));
    // Checked after it, the refusal comes before anything is posted, the same.
    let again = a.transfer(&batch).expect_err("refused at the check");
    assert_eq!(again, *error.clone());
}
