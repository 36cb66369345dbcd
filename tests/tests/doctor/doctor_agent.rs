//! `gpu-rdma-doctor agent` in the testbed VM (one node), run as a user would run it: with a
//! real etcd (Debian's etcd-server, started by the test) and a free port every check passes;
//! a port another program holds fails with `EADDRINUSE` and the hint; a stopped etcd fails
//! naming its endpoint, within a bound. On the host: the doctor's defaults are the engine's.

use gpu_rdma_doctor::AgentOptions;
use gpu_rdma_engine::{EtcdSettings, Settings};
use integration_tests::etcd::Etcd;
use integration_tests::process::{doctor, doctor_check as check, doctor_json as json, run, text};
use integration_tests::testbed::Testbed;
use serde_json::Value;
use std::net::TcpListener;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(120);

fn field<'a>(c: &'a Value, f: &str) -> &'a str {
    c[f].as_str().unwrap_or("")
}

/// A port of this node's address that nobody listens on now.
fn free_port(ip: &str) -> u16 {
    TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

#[test]
fn the_doctors_agent_defaults_are_the_engines() {
    let d = AgentOptions::default();
    assert_eq!(d.bind, Settings::default().bind);
    assert_eq!(d.etcd_prefix, EtcdSettings::default().prefix);
    assert_eq!(d.devices, Settings::default().devices);
    assert!(d.nics.is_none() && Settings::default().nics.is_none());
}

#[test]
#[ignore = "needs the testbed VM"]
fn doctor_agent_says_ok_with_a_running_etcd_and_a_free_port() {
    let tb = Testbed::get();
    let etcd = Etcd::start("doctor-agent-ok");
    let bind = format!("{}:{}", tb.local_addr, free_port(&tb.local_addr));
    let args = [
        "agent",
        "--devices",
        &tb.device,
        "--bind",
        &bind,
        "--etcd",
        &etcd.endpoint(),
        "--etcd-prefix",
        "/doctor-test",
        // The first request runs code not yet paged in from the read-only share the guest
        // runs the binary from: seconds under emulation.
        "--etcd-timeout",
        "30",
    ];
    let out = run(doctor().args(args).arg("--json"), T);
    let report = json(&out);
    assert!(out.status.success(), "{:?}:\n{report:#}", out.status);
    assert_eq!(report["verdict"]["status"], "ok", "{report:#}");
    for name in [
        format!("control port {bind}"),
        "control address".into(),
        format!("etcd {}", etcd.endpoint()),
        "etcd writable under /doctor-test".into(),
        format!("{} port 1", tb.device),
    ] {
        let c = check(&report, &name);
        assert_eq!(c["status"], "ok", "{c:#}");
    }
    let reached = check(&report, "control address");
    assert!(
        field(reached, "found").contains(&format!("peers would connect to {bind}")),
        "{reached:#}"
    );
    let written = check(&report, "etcd writable under /doctor-test");
    assert!(
        field(written, "found").contains("read it back and deleted it"),
        "{written:#}"
    );
    let nics: Vec<&Value> = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["section"] == "nics")
        .collect();
    assert!(
        nics.iter()
            .any(|c| c["status"] == "ok" && field(c, "found").contains(&tb.device)),
        "{report:#}"
    );
    // Bound to 0.0.0.0 (no etcd), peers are given the address of rxe0's RoCE v2 GID: this
    // node's address on the rxe netdev.
    let out = run(doctor().args(["agent", "--bind", "0.0.0.0:0", "--json"]), T);
    let report = json(&out);
    assert!(out.status.success(), "{report:#}");
    let reached = check(&report, "control address");
    assert!(
        field(reached, "found").contains(&format!("peers would connect to {}:", tb.local_addr))
            && field(reached, "found").contains("RoCE v2 GID"),
        "{reached:#}"
    );
    // The text form: a line per check and the verdict.
    let out = run(doctor().args(args), T);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("\netcd\n  [ok]   etcd http://"), "{t}");
    assert!(t.contains("\nverdict [ok] "), "{t}");
    eprintln!("{t}");
}

#[test]
#[ignore = "needs the testbed VM"]
fn doctor_agent_fails_on_a_taken_port_with_eaddrinuse_and_the_hint() {
    let tb = Testbed::get();
    let held = TcpListener::bind((tb.local_addr.as_str(), 0)).expect("bind a port");
    let bind = held.local_addr().expect("its address").to_string();
    let out = run(doctor().args(["agent", "--bind", &bind, "--json"]), T);
    let report = json(&out);
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let port = check(&report, &format!("control port {bind}"));
    assert_eq!(port["status"], "fail", "{port:#}");
    assert!(
        field(port, "found").contains(&format!("cannot bind {bind}: EADDRINUSE")),
        "{port:#}"
    );
    assert!(
        field(port, "fix").contains(&format!("another agent or program listens on {bind}"))
            && field(port, "fix").contains("pick another port"),
        "{port:#}"
    );
    assert_eq!(report["verdict"]["status"], "fail", "{report:#}");
    let out = run(doctor().args(["agent", "--bind", &bind]), T);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains(&format!(
            "[fail] control port {bind}: cannot bind {bind}: EADDRINUSE"
        )),
        "{t}"
    );
    assert!(
        t.contains("fix: another agent or program listens on"),
        "{t}"
    );
    drop(held);
    eprintln!("{t}");
}

#[test]
#[ignore = "needs the testbed VM"]
fn doctor_agent_fails_on_a_stopped_etcd_naming_the_endpoint_in_bounded_time() {
    let tb = Testbed::get();
    let mut etcd = Etcd::start("doctor-agent-stopped");
    etcd.stop();
    let endpoint = etcd.endpoint();
    let bind = format!("{}:0", tb.local_addr);
    let t0 = Instant::now();
    let out = run(
        doctor().args(["agent", "--bind", &bind, "--etcd", &endpoint, "--json"]),
        T,
    );
    let took = t0.elapsed();
    let report = json(&out);
    assert!(took < Duration::from_secs(15), "took {took:?}");
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let c = check(&report, &format!("etcd {endpoint}"));
    assert_eq!(c["status"], "fail", "{c:#}");
    let address = endpoint.trim_start_matches("http://");
    assert!(
        field(c, "found").contains(&format!("nothing answers at {address}: ECONNREFUSED")),
        "{c:#}"
    );
    assert!(
        field(c, "fix").contains("is etcd running")
            && field(c, "fix").contains(&format!("--listen-client-urls {endpoint}")),
        "{c:#}"
    );
    let verdict = field(&report["verdict"], "line");
    assert!(verdict.contains(&format!("etcd {endpoint}")), "{verdict}");
    let out = run(
        doctor().args(["agent", "--bind", &bind, "--etcd", &endpoint]),
        T,
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains(&format!("[fail] etcd {endpoint}: nothing answers")),
        "{t}"
    );
    eprintln!("{t}");
}
