//! Device and connection events on tokio: the device's asynchronous events as a typed stream
//! (the port going down and up), rdma_cm connections made with `connect_async` /
//! `accept_async`, and `rdma link delete` of the device under live connections: every
//! awaited request ends in an error, nothing panics, and once the program drops what it
//! holds, the deletion (which waits for every user of the device) completes. Each test puts
//! the device back as the testbed made it. Runs in the testbed VM, one test at a time (a
//! lock), since they take the device away.

use integration_tests::device_admin::netdev;
use integration_tests::device_admin::{put_back, wait_ready};
use integration_tests::process::{spawn, text, wait};
use integration_tests::runtime::run_local;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::host_region;
use rdma_dmabuf::reactor::{AsyncEventKind, AsyncEvents, ConnectionEnd, EventElement};
use rdma_dmabuf::{
    Access, CmConnector, CmListener, Context, Error, ProtectionDomain, QueuePair, QueuePairBuilder,
};
use std::net::SocketAddr;
use std::process::Command;
use std::rc::Rc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

static MACHINE: Mutex<()> = Mutex::new(());
const T: Duration = Duration::from_secs(30);
/// The spare device the deletion test adds beside the testbed's, on the other end of its
/// veth pair.
const SPARE: &str = "rxe_spare";
const SPARE_NETDEV: &str = "veth1";
/// `IBV_WC_WR_FLUSH_ERR`.
const FLUSH_ERR: u32 = 5;

fn sh(cmd: &mut Command) {
    let out = integration_tests::process::run(cmd, T);
    assert!(out.status.success(), "{cmd:?}: {}", text(&out));
}

#[test]
#[ignore = "needs the testbed VM"]
fn the_port_going_down_and_up_arrives_as_typed_events() {
    let _m = MACHINE.lock().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let ctx = Context::open(&tb.device).unwrap();
    let seen = run_local(async {
        let mut events = AsyncEvents::new(&ctx).unwrap().into_stream().unwrap();
        let mut seen = Vec::new();
        for (state, want) in [
            ("down", AsyncEventKind::PortError),
            ("up", AsyncEventKind::PortActive),
        ] {
            sh(Command::new("ip").args(["link", "set", &netdev(), state]));
            let ev = tokio::time::timeout(T, async {
                loop {
                    let ev = events.next().await.expect("read an event");
                    if ev.kind == want {
                        return ev;
                    }
                }
            })
            .await
            .unwrap_or_else(|_| panic!("no {want:?} within {T:?} of the link going {state}"));
            assert_eq!(ev.element, EventElement::Port(1), "{ev}");
            assert!(!ev.kind.is_fatal());
            seen.push(ev);
        }
        seen
    });
    wait_ready(&tb.device, tb.gid_index);
    eprintln!("events: {seen:?}");
}

/// One connection's two queue pairs (with their protection domains and the listener).
struct Connection {
    server: QueuePair,
    client: QueuePair,
    pds: Vec<std::sync::Arc<ProtectionDomain>>,
    _listener: CmListener,
}

fn builder(pd: &std::sync::Arc<ProtectionDomain>) -> QueuePairBuilder {
    QueuePairBuilder::new(pd).completion_channel(true)
}

/// Listens on `addr` and connects to it, both awaited on the runtime.
async fn connect(addr: SocketAddr) -> Connection {
    let listener = CmListener::bind(addr).expect("bind and listen");
    let spd = ProtectionDomain::new(&listener.context().unwrap()).unwrap();
    let accept = listener.accept_async(builder(&spd), b"server", T);
    let dial = async {
        let c = CmConnector::resolve_async(addr, T).await.expect("resolve");
        let cpd = ProtectionDomain::new(&c.context().unwrap()).unwrap();
        let (qp, private) = c
            .connect_async(builder(&cpd), b"client", T)
            .await
            .expect("connect");
        (qp, private, cpd)
    };
    let (accepted, (client, private, cpd)) = tokio::join!(accept, dial);
    let (server, hello) = accepted.expect("accept");
    assert_eq!(hello, b"client");
    assert_eq!(private, b"server");
    Connection {
        server,
        client,
        pds: vec![spd, cpd],
        _listener: listener,
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn rdma_link_delete_under_live_connections_ends_every_awaited_request_and_releases_the_device() {
    let _m = MACHINE.lock().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let fds = integration_tests::counts::open_fds();
    let (errors, deleter) = run_local(async {
        let mut conns = Vec::new();
        for port in [18660, 18661] {
            let addr: SocketAddr = format!("{}:{port}", tb.local_addr).parse().unwrap();
            let c = tokio::time::timeout(T, connect(addr)).await;
            conns.push(Rc::new(c.expect("connected in time")));
        }
        eprintln!("connected");
        // A message each way proves the connections work, awaited.
        for c in &conns {
            let pd = &c.pds[0];
            let r = c
                .server
                .post_recv(host_region(pd, &[], 4096, Access::LOCAL_WRITE))
                .unwrap();
            let src = host_region(&c.pds[1], b"ping", 4096, Access::empty());
            let s = c.client.post_send(rdma_dmabuf::Local::new(src, 0..4), None);
            let s = tokio::time::timeout(T, s.unwrap()).await;
            s.expect("send in time").expect("send");
            let r = tokio::time::timeout(T, r).await.expect("receive in time");
            assert_eq!(r.expect("receive").wc.byte_len, 4);
        }
        eprintln!("pinged");
        // Receives on both sides that nothing will answer, awaited in their own tasks.
        let mut waiters = Vec::new();
        for c in &conns {
            for side in 0..2 {
                for _ in 0..4 {
                    let c = c.clone();
                    waiters.push(tokio::task::spawn_local(async move {
                        let qp = if side == 0 { &c.server } else { &c.client };
                        let pd = &c.pds[side];
                        let r = qp
                            .post_recv(host_region(pd, &[], 4096, Access::LOCAL_WRITE))
                            .unwrap();
                        let t = Instant::now();
                        let out = r.await;
                        (out.map(|_| ()).map_err(|e| e.error), t.elapsed())
                    }));
                }
            }
        }
        tokio::task::yield_now().await;
        // A second device, so that librdmacm (v55) can tell the first one is gone: its check
        // of the device list gives up when the list is empty, and then never closes its
        // context of a removed device.
        sh(Command::new("rdma").args([
            "link",
            "add",
            SPARE,
            "type",
            "rxe",
            "netdev",
            SPARE_NETDEV,
        ]));
        // The device goes; `rdma link delete` waits for every user of it to let go.
        let deleter = spawn(Command::new("rdma").args(["link", "delete", &tb.device]));
        eprintln!("deleting");
        let mut errors = Vec::new();
        for w in waiters {
            let (out, took) = tokio::time::timeout(T, w)
                .await
                .expect("an awaited receive still pending 30 s after the device went")
                .expect("no panic");
            errors.push((out.expect_err("nothing was sent"), took));
        }
        eprintln!("every waiter ended");
        for c in &conns {
            for qp in [&c.server, &c.client] {
                assert_eq!(
                    qp.take_cm_events().unwrap(),
                    Some(ConnectionEnd::DeviceRemoval)
                );
                assert!(qp.is_in_error());
            }
        }
        (errors, deleter)
        // Everything this program holds on the device drops here.
    });
    eprintln!("dropped");
    // Let go of the device: librdmacm closes its context of it once asked (nothing of ours
    // uses it any more), the deletion completes, and the device is gone. (The deleting
    // process cannot be killed while the kernel waits, so it is only polled.)
    let mut deleter = deleter;
    let deadline = Instant::now() + T;
    while deleter.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let stack = std::fs::read_to_string(format!("/proc/{}/stack", deleter.id()));
            let verbs = std::fs::read_dir("/sys/class/infiniband_verbs").map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name())
                    .collect::<Vec<_>>()
            });
            let fds: Vec<_> = std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .collect();
            panic!(
                "`rdma link delete` still waits {T:?} after everything was dropped\n\
                 its kernel stack: {stack:?}\nverbs devices: {verbs:?}\nour fds: {fds:?}"
            );
        }
        // Every protection domain, region, queue pair and connection on the device was
        // dropped with the runtime's tasks above, and with them librdmacm's references.
        rdma_dmabuf::release_removed_devices();
        std::thread::sleep(Duration::from_millis(100));
    }
    let del = wait(deleter, T, "rdma link delete");
    let gone = !std::path::Path::new(&format!("/sys/class/infiniband/{}", tb.device)).exists();
    // librdmacm now holds the spare device open until this process exits (its device list
    // check opened it), so its deletion completes then: started here, not waited for.
    drop(spawn(Command::new("rdma").args(["link", "delete", SPARE])));
    put_back(&tb);
    assert!(del.status.success(), "{}", text(&del));
    assert!(
        gone,
        "the device was still there after its deletion returned"
    );
    assert_eq!(errors.len(), 16);
    for (e, took) in &errors {
        match e {
            Error::Completion { status, .. } => assert_eq!(*status, FLUSH_ERR, "{e}"),
            other => panic!("expected a flushed completion, got {other}"),
        }
        assert!(*took < T, "{took:?}");
    }
    let now = integration_tests::counts::open_fds();
    assert!(
        now <= fds + 4,
        "descriptors: {fds} before, {now} after (librdmacm keeps at most its own few)"
    );
    eprintln!(
        "16 awaited receives ended flushed, the slowest after {:?}",
        errors.iter().map(|e| e.1).max().unwrap()
    );
}
