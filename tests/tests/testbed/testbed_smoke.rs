//! Proof that the testbed is real: an ACTIVE rxe device moving RC traffic (over loopback in
//! one VM, across the wire between two), rdma_cm working, and the dma-buf exporters present.

use drm_export::{DumbBuffer, Udmabuf};
use integration_tests::process::{self, run, run_client};
use integration_tests::testbed::Testbed;
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

#[test]
#[ignore = "needs the testbed VM"]
fn rxe_port_is_active() {
    let tb = Testbed::get();
    let state =
        std::fs::read_to_string(format!("/sys/class/infiniband/{}/ports/1/state", tb.device))
            .expect("the rxe device exists");
    assert!(state.contains("ACTIVE"), "port state: {state}");
    let out = run(Command::new("ibv_devinfo").args(["-d", &tb.device]), LIMIT);
    let text = process::text(&out);
    assert!(
        out.status.success() && text.contains("PORT_ACTIVE"),
        "{text}"
    );
}

fn rc_pingpong(tb: &Testbed, port: u16, server: Option<&str>) -> Command {
    let mut c = Command::new("ibv_rc_pingpong");
    c.args(["-d", &tb.device, "-g", &tb.gid_index.to_string()])
        .args(["-p", &port.to_string(), "-n", "200", "-s", "4096"]);
    if let Some(s) = server {
        c.arg(s);
    }
    c
}

/// The pingpong prints "N bytes in T seconds" once all iterations completed: 200 round trips
/// of 4096 bytes each way.
fn assert_pingpong_done(out: &std::process::Output) {
    let text = process::text(out);
    assert!(out.status.success(), "ibv_rc_pingpong failed:\n{text}");
    assert!(
        text.contains(&format!("{} bytes in", 2 * 200 * 4096)),
        "{text}"
    );
}

#[test]
#[ignore = "needs the testbed VM"]
fn rc_pingpong_over_loopback() {
    let tb = Testbed::get();
    let server = process::spawn(&mut rc_pingpong(&tb, 18515, None));
    let client = run_client(|| rc_pingpong(&tb, 18515, Some("127.0.0.1")), LIMIT);
    assert_pingpong_done(&client);
    assert_pingpong_done(&process::wait(server, LIMIT, "ibv_rc_pingpong server"));
}

fn rping(tb: &Testbed, port: u16, server: bool) -> Command {
    let mut c = Command::new("rping");
    let addr = if server {
        &tb.local_addr
    } else {
        &tb.peer_addr
    };
    c.arg(if server { "-s" } else { "-c" }).args([
        "-a",
        addr,
        "-p",
        &port.to_string(),
        "-C",
        "20",
        "-v",
    ]);
    c
}

fn assert_rping_done(out: &std::process::Output) {
    let text = process::text(out);
    assert!(out.status.success(), "rping failed:\n{text}");
    assert_eq!(text.matches("ping data: rdma-ping-").count(), 20, "{text}");
}

#[test]
#[ignore = "needs the testbed VM"]
fn rdma_cm_rping_over_loopback() {
    let tb = Testbed::get();
    let server = process::spawn(&mut rping(&tb, 7471, true));
    let client = run_client(|| rping(&tb, 7471, false), LIMIT);
    assert_rping_done(&client);
    // The server prints nothing with -v for received pings; it must just exit cleanly.
    let s = process::wait(server, LIMIT, "rping server");
    assert!(s.status.success(), "{}", process::text(&s));
}

#[test]
#[ignore = "needs the testbed VM"]
fn vgem_dumb_buffer_exports_a_dma_buf() {
    Testbed::get();
    let card = integration_tests::exporters::vgem_card();
    assert_eq!(card.driver().name, "vgem");
    let buf = DumbBuffer::new(&card, 1 << 20).expect("dumb buffer on vgem");
    assert!(buf.size() >= 1 << 20);
    let dmabuf = buf.export().expect("PRIME export");
    // GEM PRIME exports are named after the DRM core, not the driver.
    assert_eq!(dmabuf.exporter(), "drm");
    assert_eq!(dmabuf.size(), buf.size());
}

#[test]
#[ignore = "needs the testbed VM"]
fn udmabuf_is_created() {
    Testbed::get();
    let u = Udmabuf::new(1 << 20).expect("udmabuf");
    assert_eq!(u.dmabuf().exporter(), "udmabuf");
    assert_eq!(u.dmabuf().size(), 1 << 20);
}

#[test]
#[ignore = "needs the testbed VM"]
fn system_dma_heap_is_present() {
    Testbed::get();
    assert!(std::path::Path::new("/dev/dma_heap/system").exists());
}

/// Tests of the two-node testbed: `cargo xtask test` runs this module on both nodes.
mod two_node {
    use super::*;

    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_rc_pingpong_across_the_wire() {
        let tb = Testbed::get();
        assert_eq!(tb.nodes, 2, "runs in the two-node testbed");
        let out = if tb.is_server() {
            run(&mut rc_pingpong(&tb, 18516, None), LIMIT)
        } else {
            run_client(|| rc_pingpong(&tb, 18516, Some(&tb.peer_addr)), LIMIT)
        };
        assert_pingpong_done(&out);
        assert!(
            process::text(&out).contains(&format!("::ffff:{}", tb.peer_addr)),
            "the remote GID is the peer's: {}",
            process::text(&out)
        );
    }

    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_rdma_cm_rping_across_the_wire() {
        let tb = Testbed::get();
        assert_eq!(tb.nodes, 2, "runs in the two-node testbed");
        if tb.is_server() {
            let s = run(&mut rping(&tb, 7472, true), LIMIT);
            assert!(s.status.success(), "{}", process::text(&s));
        } else {
            assert_rping_done(&run_client(|| rping(&tb, 7472, false), LIMIT));
        }
    }
}
