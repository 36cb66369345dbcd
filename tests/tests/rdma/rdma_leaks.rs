//! rdma-dmabuf leak checks, alone in their process (the VM runs each test file's tests in a
//! process of their own): MR, QP and descriptor counts are device- and process-wide, so no
//! other test may run beside them. Runs in the testbed VM.

use integration_tests::counts::{dmabuf_objects, open_fds, rdma_resources as resource_count};
use integration_tests::process::{test_name, valgrind_self};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{host_region, loopback_pair, pd};
use rdma_dmabuf::{Access, HostBuffer, MemoryRegion};
use std::time::Duration;

/// The counts are device- and process-wide: one test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
#[ignore = "needs the testbed VM"]
fn dropped_pending_keeps_its_region_until_the_queue_pair_is_destroyed() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let pd = pd(&tb);
    let before = resource_count("mr");
    {
        let (_a, b) = loopback_pair(&pd);
        // Nobody sends: the receive stays in flight. Drop its handle.
        let recv = b
            .post_recv(host_region(&pd, &[], 1 << 20, Access::LOCAL_WRITE))
            .unwrap();
        let recv = recv
            .spin_timeout(Duration::from_millis(100))
            .expect_err("still in flight");
        drop(recv);
        assert_eq!(b.outstanding(), 1, "the region stays with the queue");
        assert_eq!(resource_count("mr"), before + 1, "and stays registered");
        // Dropping the queue pairs flushes the receive, destroys them, then frees it.
    }
    assert_eq!(
        resource_count("mr"),
        before,
        "the region was deregistered exactly once"
    );
}

#[test]
#[ignore = "needs the testbed VM"]
fn ten_thousand_registrations_and_a_thousand_connections_leak_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let pd = pd(&tb);
    // Warm up, then take the baselines.
    drop(loopback_pair(&pd));
    let (fds, mrs, qps, cqs) = (
        open_fds(),
        resource_count("mr"),
        resource_count("qp"),
        resource_count("cq"),
    );
    let mut buf = HostBuffer::new(1 << 16).unwrap();
    for _ in 0..10_000 {
        let mr =
            MemoryRegion::register(&pd, buf, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
        buf = mr.into_inner().unwrap();
    }
    for _ in 0..1_000 {
        let (a, b) = loopback_pair(&pd);
        drop((a, b));
    }
    assert_eq!(open_fds(), fds, "descriptors");
    assert_eq!(resource_count("mr"), mrs, "memory regions");
    assert_eq!(resource_count("qp"), qps, "queue pairs");
    assert_eq!(resource_count("cq"), cqs, "completion queues");
}

#[test]
#[ignore = "needs the testbed VM"]
fn dropped_pending_under_valgrind_has_no_memory_error() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    Testbed::get();
    // This binary again, running only the drop-before-completion test, under memcheck.
    valgrind_self(
        &[
            "--exact",
            &test_name(
                module_path!(),
                "dropped_pending_keeps_its_region_until_the_queue_pair_is_destroyed",
            ),
        ],
        1,
    );
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_thousand_dmabuf_registrations_leak_nothing_and_release_the_buffer() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (fds, mrs, bufs) = (open_fds(), resource_count("mr"), dmabuf_objects());
    for exporter in integration_tests::exporters::ALL {
        let mut buf = exporter.allocate(1 << 20);
        for _ in 0..1_000 / integration_tests::exporters::ALL.len() + 1 {
            let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
            let mr = MemoryRegion::register_dmabuf(&pd, buf, 0, 1 << 20, None, access).unwrap();
            buf = mr.into_inner().unwrap();
        }
        assert_eq!(resource_count("mr"), mrs, "{exporter:?}: memory regions");
        drop(buf);
        assert_eq!(
            dmabuf_objects(),
            bufs,
            "{exporter:?}: the exporter's buffer is freed after the last reference"
        );
    }
    assert_eq!(open_fds(), fds, "descriptors");
}
