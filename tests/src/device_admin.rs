//! Tests that take the RDMA device away and put it back: the testbed's netdev, and waiting
//! until a device is usable again.

use crate::process::{run, text};
use crate::testbed::Testbed;
use rdma_dmabuf::Context;
use std::process::Command;
use std::time::{Duration, Instant};

/// The netdev the testbed's rxe device is bound to.
pub fn netdev() -> String {
    std::env::var("NETDEV").expect("the testbed sets NETDEV")
}

/// Waits (at most 30 s) until `dev` is back: its port ACTIVE with the RoCEv2 GID at `index`.
///
/// # Panics
/// If it is not back by then.
pub fn wait_ready(dev: &str, index: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state = std::fs::read_to_string(format!("/sys/class/infiniband/{dev}/ports/1/state"));
        let ready = state.is_ok_and(|s| s.contains("ACTIVE"))
            && Context::open(dev)
                .and_then(|c| c.roce_v2_ipv4_gid(1))
                .is_ok_and(|(i, _)| i == index);
        if ready {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{dev} did not come back with its RoCEv2 GID at index {index}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Puts the testbed's device back after a test deleted it (`rdma link add ... type rxe
/// netdev ...`) and waits until it is usable again.
///
/// # Panics
/// If the command fails or the device does not come back within 30 s.
pub fn put_back(tb: &Testbed) {
    let add = run(
        Command::new("rdma").args([
            "link",
            "add",
            &tb.device,
            "type",
            "rxe",
            "netdev",
            &netdev(),
        ]),
        Duration::from_secs(30),
    );
    assert!(add.status.success(), "{}", text(&add));
    wait_ready(&tb.device, tb.gid_index);
}
