//! A device removed (`rdma link delete`) under objects made from librdmacm's context of it.
//!
//! librdmacm closes its context of a removed device once a check of its device list (run by an
//! `rdma_bind_addr` / `rdma_resolve_addr` that lands on a device it has not seen) finds the
//! device gone and nothing references it; a cm id is such a reference. A protection domain,
//! a region or a queue pair made from [`CmListener::context`] / `CmConnector::context` must
//! keep the context open (the `Context` holds librdmacm's device list, a reference) until
//! they are dropped, and the deletion, which waits for every user of the device, completes
//! only then. Without that, the drops use the freed context (valgrind: invalid reads in
//! `ibv_dereg_mr`, `ibv_dealloc_pd`).
//!
//! Each test deletes the testbed's device and adds a spare one on the other end of the veth
//! pair, then puts the device back as the testbed made it (and removes the spare and its
//! address). Runs in the testbed VM, one test at a time (a lock).
//!
//! Each body runs in a child process of its own (plain, and under valgrind): librdmacm keeps
//! every device it has opened open until a check of its device list notices the device gone,
//! and the kernel's deletion of a device waits for every process that has it open. A body run
//! in this process would leave the restored device open here, and the next body's deletion
//! of it, in a child, would wait for this process. The bodies are `#[test]`s (so a child can
//! run one by name) that do nothing unless started as such a child.

use integration_tests::device_admin::put_back;
use integration_tests::process::{spawn, test_name, text};
use integration_tests::runtime::run_local;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::host_region;
use rdma_dmabuf::{Access, CmConnector, CmListener, ProtectionDomain, QueuePairBuilder};
use std::net::SocketAddr;
use std::process::{Child, Command};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static MACHINE: Mutex<()> = Mutex::new(());
const T: Duration = Duration::from_secs(30);
/// The spare device, on the other end of the testbed's veth pair, with an address of its own.
const SPARE: &str = "rxe_removal";
const SPARE_NETDEV: &str = "veth1";
const SPARE_ADDR: &str = "10.77.0.1";
/// How long the deletion is watched for completing too early (while our objects live).
const EARLY: Duration = Duration::from_secs(3);
/// Set in the environment of the child process that runs a body.
const CHILD: &str = "RDMA_DEVICE_REMOVAL_CHILD";

/// Whether this process is a child started to run a body.
fn in_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// Runs the body `name` of this binary in a child process, under valgrind's memcheck with
/// `valgrind`, and asserts that it passed (and that valgrind found no error).
fn run_in_child(name: &str, valgrind: bool) {
    let me = std::env::current_exe().expect("this test binary");
    let mut cmd = if valgrind {
        let mut c = Command::new("valgrind");
        c.args(["--error-exitcode=99", "--leak-check=no"]).arg(&me);
        c
    } else {
        // This test binary, built by this workspace.
        Command::new(&me)
    };
    let out = cmd
        .env(CHILD, "1")
        .args([
            "--ignored",
            "--test-threads=1",
            "--nocapture",
            "--color",
            "never",
        ])
        .args(["--exact", &test_name(module_path!(), name)])
        .output()
        .expect("the child starts (valgrind: cargo xtask setup installs it)");
    let t = text(&out);
    eprintln!("{t}");
    assert!(out.status.success(), "{name} failed in its child process");
    assert!(t.contains("1 passed"), "{name} did not run");
    if valgrind {
        assert!(
            t.contains("ERROR SUMMARY: 0 errors"),
            "valgrind found errors"
        );
    }
}

fn sh(cmd: &mut Command) {
    let out = integration_tests::process::run(cmd, T);
    assert!(out.status.success(), "{cmd:?}: {}", text(&out));
}

/// Whether the verbs device list still has `dev`.
fn listed(dev: &str) -> bool {
    rdma_dmabuf::devices().is_ok_and(|d| d.iter().any(|d| d.name == dev))
}

/// Starts `rdma link delete` of the testbed's device and waits until the device has left the
/// verbs device list (the deletion itself waits for every user of the device).
fn start_deletion(tb: &Testbed) -> Child {
    let deleter = spawn(Command::new("rdma").args(["link", "delete", &tb.device]));
    let deadline = Instant::now() + T;
    while listed(&tb.device) {
        assert!(Instant::now() < deadline, "{} still listed", tb.device);
        std::thread::sleep(Duration::from_millis(100));
    }
    deleter
}

/// Adds the spare device and binds a listener on it: librdmacm has not seen the device, so
/// the bind checks librdmacm's device list, which finds the testbed's device gone.
fn add_spare_and_bind() -> CmListener {
    sh(Command::new("ip").args([
        "addr",
        "replace",
        &format!("{SPARE_ADDR}/24"),
        "dev",
        SPARE_NETDEV,
    ]));
    sh(Command::new("ip").args(["link", "set", SPARE_NETDEV, "up"]));
    sh(Command::new("rdma").args(["link", "add", SPARE, "type", "rxe", "netdev", SPARE_NETDEV]));
    let deadline = Instant::now() + T;
    loop {
        match CmListener::bind(format!("{SPARE_ADDR}:18791").parse().unwrap()) {
            Ok(l) => return l,
            Err(e) => {
                assert!(Instant::now() < deadline, "bind on {SPARE}: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// Waits up to `limit` for the deletion; whether it completed.
fn finishes_within(deleter: &mut Child, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if deleter.try_wait().unwrap().is_some() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Once everything on the testbed's device is dropped: waits for its deletion to complete,
/// adds it back as the testbed made it, then deletes the spare device (librdmacm closes its
/// context of the spare at the next check of its device list, which needs another device
/// listed: the testbed's, back) and removes the spare's address.
///
/// # Panics
/// If the deletion does not complete within [`T`]: then the device cannot be put back, and
/// the tests after this one in the VM boot have no device (said in the message).
fn restore(tb: &Testbed, mut deleter: Child) {
    assert!(
        finishes_within(&mut deleter, T),
        "`rdma link delete {}` still waits {T:?} after everything was dropped; the device \
         cannot be put back (later tests in this VM boot will find no device)",
        tb.device
    );
    let del = deleter.wait_with_output().unwrap();
    assert!(del.status.success(), "{}", text(&del));
    put_back(tb);
    let mut spare = spawn(Command::new("rdma").args(["link", "delete", SPARE]));
    let deadline = Instant::now() + T;
    while spare.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "`rdma link delete {SPARE}` still waits {T:?} after everything was dropped"
        );
        rdma_dmabuf::release_removed_devices();
        std::thread::sleep(Duration::from_millis(100));
    }
    sh(Command::new("ip").args([
        "addr",
        "del",
        &format!("{SPARE_ADDR}/24"),
        "dev",
        SPARE_NETDEV,
    ]));
}

/// A protection domain and a region made from a listener's context, the listener dropped, the
/// device deleted, and a bind on a new device (a check of librdmacm's device list, which
/// finds the device gone). The deletion must wait for the PD and the region (librdmacm must
/// not close the context under them), they must still work, and dropping them lets the
/// deletion complete.
#[test]
#[ignore = "needs the testbed VM"]
fn body_removed_device_under_a_live_pd_and_region() {
    if !in_child() {
        return;
    }
    let tb = Testbed::get();
    let listener =
        CmListener::bind(format!("{}:18790", tb.local_addr).parse().unwrap()).expect("bind");
    let ctx = listener.context().expect("listener context");
    let pd = ProtectionDomain::new(&ctx).expect("pd on librdmacm's context");
    let mut mr = host_region(&pd, &[0x5a; 64], 4096, Access::LOCAL_WRITE);
    drop(ctx);
    drop(listener);
    let mut deleter = start_deletion(&tb);
    let spare = add_spare_and_bind();
    let early = finishes_within(&mut deleter, EARLY);
    eprintln!("deletion completed while the PD and region lived: {early}");
    // The PD and region still work on the context, then go.
    mr.bytes_mut().expect("the region's bytes")[0] = 1;
    let qp = QueuePairBuilder::new(&pd).build();
    let built = qp.as_ref().map(|_| ()).map_err(|e| e.to_string());
    drop(qp);
    drop(mr);
    drop(pd);
    drop(spare);
    // The context of the removed device is closed with its last reference (the PD's
    // `Context`): the deletion completes without anything else asked of librdmacm.
    restore(&tb, deleter);
    assert!(
        !early,
        "librdmacm closed its context of {} (the deletion completed) while a protection \
         domain and a region made from it were alive",
        tb.device
    );
    built.expect("a queue pair in the PD on the removed device's context");
}

/// The body above, in a child process.
#[test]
#[ignore = "needs the testbed VM"]
fn removed_device_context_stays_open_under_a_live_pd_and_region() {
    let _m = MACHINE.lock().unwrap_or_else(|e| e.into_inner());
    run_in_child("body_removed_device_under_a_live_pd_and_region", false);
}

/// The body above under valgrind: no use of the closed context.
#[test]
#[ignore = "needs the testbed VM"]
fn removed_device_context_stays_open_under_a_live_pd_and_region_valgrind() {
    let _m = MACHINE.lock().unwrap_or_else(|e| e.into_inner());
    run_in_child("body_removed_device_under_a_live_pd_and_region", true);
}

/// Two queue pairs connected with `connect_async` / `accept_async`, each holding the only
/// reference to its PD; the device deleted and a bind on a new device (librdmacm marks the
/// removed device dead); then the queue pairs dropped. Inside `QueuePair::drop` the cm id
/// (librdmacm's last id on the device) goes before the PD: the PD's context must stay open
/// for its `ibv_dealloc_pd`, and the deletion completes once both are dropped.
#[test]
#[ignore = "needs the testbed VM"]
fn body_removed_device_under_queue_pairs() {
    if !in_child() {
        return;
    }
    let tb = Testbed::get();
    let addr: SocketAddr = format!("{}:18796", tb.local_addr).parse().unwrap();
    let (server, client, listener) = run_local(async move {
        let listener = CmListener::bind(addr).unwrap();
        let spd = ProtectionDomain::new(&listener.context().unwrap()).unwrap();
        let accept =
            listener.accept_async(QueuePairBuilder::new(&spd).completion_channel(true), b"", T);
        let dial = async {
            let c = CmConnector::resolve_async(addr, T).await.unwrap();
            let cpd = ProtectionDomain::new(&c.context().unwrap()).unwrap();
            c.connect_async(QueuePairBuilder::new(&cpd).completion_channel(true), b"", T)
                .await
                .unwrap()
                .0
        };
        let (server, client) = tokio::join!(accept, dial);
        drop(spd);
        (server.unwrap().0, client, listener)
    });
    let mut deleter = start_deletion(&tb);
    let spare = add_spare_and_bind();
    let early = finishes_within(&mut deleter, EARLY);
    eprintln!("deletion completed while the queue pairs lived: {early}");
    drop(listener);
    drop(client);
    // The last cm id on the device, then the last reference to the PD and its context.
    drop(server);
    drop(spare);
    restore(&tb, deleter);
    assert!(
        !early,
        "librdmacm closed its context of {} (the deletion completed) while queue pairs on it \
         were alive",
        tb.device
    );
}

/// The body above, in a child process.
#[test]
#[ignore = "needs the testbed VM"]
fn removed_device_queue_pairs_drop_their_cm_id_then_their_pd() {
    let _m = MACHINE.lock().unwrap_or_else(|e| e.into_inner());
    run_in_child("body_removed_device_under_queue_pairs", false);
}

/// The body above under valgrind: `ibv_dealloc_pd` after the cm id's destruction reads no
/// freed memory.
#[test]
#[ignore = "needs the testbed VM"]
fn removed_device_queue_pairs_drop_their_cm_id_then_their_pd_valgrind() {
    let _m = MACHINE.lock().unwrap_or_else(|e| e.into_inner());
    run_in_child("body_removed_device_under_queue_pairs", true);
}
