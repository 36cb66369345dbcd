//! The examples are tests too: each runs as its own process, as a user would run it, and its
//! exit status and report are checked. Usage errors are checked on the host; everything that
//! moves data runs in the testbed VM (one node, the two-node wire, and the stock stack).

use integration_tests::process::{run, spawn, text, wait};
use integration_tests::testbed::Testbed;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

const T: Duration = Duration::from_secs(120);

/// The example binary `name`, built by `cargo test` beside this test binary.
fn example(name: &str) -> Command {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let path: PathBuf = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: build the examples (cargo test builds them)",
        path.display()
    );
    // The example binary, built by this workspace.
    Command::new(path)
}

/// The `RESULT` line's `key=value` pairs.
fn result(out: &Output) -> Vec<(String, String)> {
    let t = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = t
        .lines()
        .find(|l| l.starts_with("RESULT"))
        .unwrap_or_else(|| panic!("no RESULT line in:\n{}", text(out)));
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn field(out: &Output, key: &str) -> String {
    result(out)
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no {key}= in:\n{}", text(out)))
}

/// Runs a server and its client on this node; returns both outputs.
fn pair(server: &mut Command, client: &mut Command) -> (Output, Output) {
    let s = spawn(server);
    std::thread::sleep(Duration::from_millis(300));
    let c = run(client, T);
    let s = wait(s, T, "server");
    (s, c)
}

#[test]
fn examples_answer_bad_usage_with_status_2_and_the_usage() {
    for name in [
        "gpu_rdma_write",
        "file_transfer",
        "device_memory",
        "multi_peer",
        "kv_blocks",
        "rdma_bench",
        "gpu_service",
        "engine_rails_bench",
        "engine_peer_bench",
    ] {
        let out = run(example(name).arg("--no-such-option").arg("1"), T);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", text(&out));
        let t = text(&out);
        assert!(t.contains("unknown option --no-such-option"), "{name}: {t}");
        assert!(t.contains("usage:"), "{name}: {t}");
        let help = run(example(name).arg("--help"), T);
        assert!(help.status.success(), "{name}: {}", text(&help));
        assert!(text(&help).contains("usage:"), "{name}");
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn gpu_rdma_write_moves_a_vgem_buffer_through_dmabuf_regions() {
    let tb = Testbed::get();
    let (s, c) = pair(
        example("gpu_rdma_write").args(["server", "--port", "18611", "--size", "4M"]),
        example("gpu_rdma_write").args([
            "client",
            &tb.local_addr,
            "--port",
            "18611",
            "--size",
            "4M",
            "--iters",
            "3",
            "--chunk",
            "1M",
        ]),
    );
    assert!(s.status.success(), "server:\n{}", text(&s));
    assert!(c.status.success(), "client:\n{}", text(&c));
    assert_eq!(field(&s, "verified"), "yes");
    assert_eq!(field(&s, "bytes"), (4u64 << 20).to_string());
    assert_eq!(field(&c, "verified"), "yes");
    assert_eq!(field(&c, "bytes"), (12u64 << 20).to_string());
    let (st, ct) = (text(&s), text(&c));
    assert!(
        st.contains("(vgem)") && st.contains("dma-buf MR on rxe0"),
        "{st}"
    );
    assert!(ct.contains("12 MiB in 12 RDMA writes"), "{ct}");
    assert!(
        ct.contains("server says  all 4194304 bytes verified: PASSED"),
        "{ct}"
    );
}

/// The engine example as the README runs it: three agents, 1,024 scattered 64 KiB blocks
/// from vgem, udmabuf, the system heap and host memory written and read back.
#[test]
#[ignore = "needs the testbed VM"]
fn engine_transfer_moves_1024_scattered_blocks_between_three_agents_and_verifies() {
    let _tb = Testbed::get();
    let out = run(example("engine_transfer").args(["--agents", "3"]), T);
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("blocks: 1024 x 64 KiB"), "{t}");
    assert!(t.contains("verified: every byte"), "{t}");
}

/// The engine bench, small: one result line per peer count and size, each a positive
/// bandwidth and latency.
#[test]
#[ignore = "needs the testbed VM"]
fn engine_bench_reports_bandwidth_and_latency_per_size() {
    let _tb = Testbed::get();
    let out = run(
        example("engine_bench").args(["--bytes", "1M", "--rounds", "1", "--sizes", "4K,64K"]),
        T,
    );
    assert!(out.status.success(), "{}", text(&out));
    let t = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = t
        .lines()
        .filter(|l| l.starts_with("RESULT engine"))
        .collect();
    assert_eq!(lines.len(), 4, "two peer counts x two sizes:\n{t}");
    for l in lines {
        let num = |key: &str| -> f64 {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {key} in {l}"))
        };
        assert!(num("bw_MBps=") > 0.0 && num("lat_us=") > 0.0, "{l}");
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn file_transfer_sends_a_file_in_chunks_and_trades_an_id_for_a_key() {
    let tb = Testbed::get();
    let dir = std::env::temp_dir().join(format!("file_transfer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (input, output) = (dir.join("in.bin"), dir.join("out.bin"));
    // Not a multiple of the region: the last chunk is short.
    let data: Vec<u8> = (0..2_500_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    std::fs::write(&input, &data).unwrap();
    let (r, s) = pair(
        example("file_transfer")
            .args(["receive", "--port", "18614", "--region", "1M"])
            .arg("--out")
            .arg(&output),
        example("file_transfer")
            .args(["send", &tb.local_addr])
            .arg(&input)
            .args(["--port", "18614", "--id", "order-17"]),
    );
    assert!(r.status.success(), "receiver:\n{}", text(&r));
    assert!(s.status.success(), "sender:\n{}", text(&s));
    assert_eq!(field(&r, "good"), "yes");
    assert_eq!(field(&s, "good"), "yes");
    assert_eq!(field(&s, "chunks"), "3");
    assert_eq!(std::fs::read(&output).unwrap(), data, "the received file");
    let key = field(&s, "key");
    assert_eq!(key.len(), 64);
    assert!(
        text(&r).contains(&format!("{key} for id \"order-17\"")),
        "both sides derive the same key: {}",
        text(&r)
    );

    // One altered byte: the receiver answers bad, and no key is given.
    let (r, s) = pair(
        example("file_transfer").args(["receive", "--port", "18615", "--region", "256K"]),
        example("file_transfer")
            .args(["send", &tb.local_addr])
            .arg(&input)
            .args(["--port", "18615", "--flip-byte", "2000000"]),
    );
    assert_eq!(r.status.code(), Some(1), "receiver:\n{}", text(&r));
    assert_eq!(s.status.code(), Some(1), "sender:\n{}", text(&s));
    assert_eq!(field(&r, "good"), "no");
    assert_eq!(field(&s, "good"), "no");
    assert!(!text(&s).contains("key="), "{}", text(&s));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "needs the testbed VM"]
fn device_memory_explains_that_rxe_has_none() {
    Testbed::get();
    let out = run(&mut example("device_memory"), T);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_eq!(field(&out, "supported"), "no");
    let t = text(&out);
    assert!(t.contains("rxe0") && t.contains("no device memory"), "{t}");
    assert!(t.contains("Soft-RoCE (rxe)"), "{t}");
}

#[test]
#[ignore = "needs the testbed VM"]
fn multi_peer_multicasts_scatters_and_gathers_a_gpu_buffer() {
    Testbed::get();
    let out = run(
        example("multi_peer").args(["--peers", "4", "--part", "64K"]),
        T,
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(field(&out, "ok"), "yes");
    assert_eq!(field(&out, "peers"), "4");
    let t = text(&out);
    for step in ["multicast", "scatter", "write + read", "gather"] {
        assert!(
            t.lines()
                .any(|l| l.trim_start().starts_with(step) && l.ends_with("every byte arrived")),
            "{step}: {t}"
        );
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn kv_blocks_gathers_scattered_blocks_of_one_gpu_buffer_to_several_readers() {
    Testbed::get();
    let out = run(
        example("kv_blocks").args(["--readers", "3", "--blocks", "22", "--block", "8K"]),
        T,
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(field(&out, "ok"), "yes");
    let t = text(&out);
    // 22 blocks over 3 readers: 8, 7 and 7, each announced through the shared queue.
    for (r, n) in [(0, 8), (1, 7), (2, 7)] {
        let want = format!("reader {r}");
        let l = t
            .lines()
            .find(|l| l.trim_start().starts_with(&want))
            .unwrap_or_else(|| panic!("{want}: {t}"));
        assert!(l.contains(&format!("{n} blocks via connection")), "{l}");
        assert!(l.ends_with("every byte arrived"), "{l}");
    }
    assert!(t.contains("the cache is unchanged"), "{t}");
}

#[test]
#[ignore = "needs the testbed VM"]
fn gpu_service_serves_four_peers_at_once_one_task_each() {
    let tb = Testbed::get();
    let opts = ["--port", "18618", "--peers", "4", "--size", "1M"];
    let (s, c) = pair(
        example("gpu_service").arg("server").args(opts),
        example("gpu_service")
            .args(["client", &tb.local_addr, "--chunk", "64K", "--window", "8"])
            .args(opts),
    );
    assert!(s.status.success(), "server:\n{}", text(&s));
    assert!(c.status.success(), "client:\n{}", text(&c));
    assert_eq!(field(&s, "verified"), "yes");
    assert_eq!(field(&s, "peers"), "4");
    assert_eq!(field(&s, "bytes"), (4u64 << 20).to_string());
    assert_eq!(field(&c, "verified"), "yes");
    assert_eq!(field(&c, "writes"), "64");
    let st = text(&s);
    for peer in 0..4 {
        assert!(
            st.contains(&format!("peer {peer}")) && st.contains("verified: PASSED"),
            "{st}"
        );
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn the_crates_quickstarts_run_as_their_docs_show_them() {
    Testbed::get();
    let out = run(&mut example("drm_export_quickstart"), T);
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("1048576 bytes on /dev/dri/card") && t.contains("(vgem)"),
        "{t}"
    );
    assert!(t.contains("udmabuf: 1048576 bytes"), "{t}");

    let out = run(&mut example("rdma_dmabuf_quickstart"), T);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("rxe0: 11 bytes RDMA-written into a dma-buf region and read back"),
        "{}",
        text(&out)
    );
}

#[test]
#[ignore = "needs the testbed VM"]
fn rdma_bench_reports_bandwidth_gather_latency_and_registration_over_every_region_kind() {
    let tb = Testbed::get();
    // Ports of its own (18741 to 18752): other tests of this file run beside it.
    let mut port = 18740;
    for region in ["host", "udmabuf", "heap", "gpu"] {
        let modes = [
            ("bw", "bw_MBps", "no"),
            ("gather", "bw_MBps", "no"),
            ("lat", "lat_usec", "auto"),
        ];
        for (mode, key, inline) in modes {
            port += 1;
            let port = port.to_string();
            let opts = [
                "--mode", mode, "--port", &port, "--size", "4096", "--iters", "20", "--region",
                region, "--inline", inline,
            ];
            let (s, c) = pair(
                example("rdma_bench").arg("server").args(opts),
                example("rdma_bench")
                    .args(["client", &tb.local_addr])
                    .args(opts),
            );
            assert!(s.status.success(), "{mode} {region} server:\n{}", text(&s));
            assert!(c.status.success(), "{mode} {region} client:\n{}", text(&c));
            let v: f64 = field(&c, key).parse().expect("a number");
            assert!(v > 0.0 && v.is_finite(), "{mode} {region}: {key}={v}");
            assert_eq!(field(&c, "region"), region);
        }
        let out = run(
            example("rdma_bench").args(["reg", "--region", region, "--size", "8K", "--iters", "3"]),
            T,
        );
        assert!(out.status.success(), "reg {region}:\n{}", text(&out));
        for key in ["reg_usec", "dereg_usec"] {
            let v: f64 = field(&out, key).parse().expect("a number");
            assert!(v > 0.0 && v.is_finite(), "reg {region}: {key}={v}");
        }
    }
}

/// `cargo xtask bench`'s script over a tiny plan: perftest and rdma_bench steps run in
/// order, and a step whose server never listens fails by name, within its limit, while the
/// steps after it still run.
#[test]
#[ignore = "needs the testbed VM"]
fn the_bench_script_runs_its_plan_and_names_a_failed_step() {
    let _tb = Testbed::get();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/src/scripts/bench.sh");
    let bench = example("rdma_bench").get_program().to_owned();
    let plan = std::env::temp_dir().join("bench-smoke-plan.txt");
    std::fs::write(
        &plan,
        "# kind id limit program size iters args\n\
         pair pt 60 ib_write_bw 8 5\n\
         pair never-ready 3 rdma_bench 8 5 --mode nope\n\
         pair ours 60 rdma_bench 8 5 --mode lat --inline auto --region gpu\n\
         local reg 60 rdma_bench 4096 2 reg --region heap\n",
    )
    .expect("plan");
    let start = std::time::Instant::now();
    let out = run(
        Command::new("sh").arg(script).arg(&plan).arg(&bench),
        Duration::from_secs(240),
    );
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for line in [
        "### step pt end client=0 server=0",
        "### step never-ready end client=ready server=1",
        "### step ours end client=0 server=0",
        "### step reg end client=0 server=-",
        "RESULT lat_usec=",
        "RESULT reg_usec=",
        "BW average",
    ] {
        assert!(t.contains(line), "no {line:?} in:\n{t}");
    }
    assert!(start.elapsed() < Duration::from_secs(200), "{t}");
}

/// Tests of the two-node testbed: `cargo xtask test` runs this module on both nodes.
mod two_node {
    use super::*;

    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_gpu_rdma_write_across_the_wire() {
        let tb = Testbed::get();
        let args = ["--port", "18612", "--size", "64M"];
        let out = if tb.is_server() {
            run(example("gpu_rdma_write").arg("server").args(args), T)
        } else {
            run(
                example("gpu_rdma_write")
                    .args(["client", &tb.peer_addr, "--iters", "1"])
                    .args(args),
                T,
            )
        };
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(field(&out, "verified"), "yes");
        // The server checked every byte of the 64 MiB GPU buffer; the client wrote all of it.
        assert_eq!(field(&out, "bytes"), (64u64 << 20).to_string());
        let t = text(&out);
        if tb.is_server() {
            assert!(
                t.contains(&format!("listening on {}:18612", tb.local_addr)),
                "{t}"
            );
        } else {
            assert!(
                t.contains(&format!("route to {}:18612", tb.peer_addr)),
                "{t}"
            );
        }
    }

    /// rdma-dmabuf's `two_node` example, the recipe of its README: the client starts first and
    /// retries until the server (started 2 s later) listens; the server learns from the
    /// disconnect that the client is done, deregisters and checks every byte.
    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_recipe_example_retries_a_late_server_and_verifies() {
        let tb = Testbed::get();
        let out = if tb.is_server() {
            std::thread::sleep(Duration::from_secs(2));
            run(example("two_node").args(["server", &tb.local_addr]), T)
        } else {
            run(example("two_node").args(["client", &tb.peer_addr]), T)
        };
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(field(&out, "verified"), "yes");
        assert_eq!(field(&out, "bytes"), (1u64 << 20).to_string());
    }

    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_gpu_service_across_the_wire() {
        let tb = Testbed::get();
        let opts = ["--port", "18619", "--peers", "3", "--size", "256K"];
        let out = if tb.is_server() {
            run(example("gpu_service").arg("server").args(opts), T)
        } else {
            run(
                example("gpu_service")
                    .args(["client", &tb.peer_addr])
                    .args(opts),
                T,
            )
        };
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(field(&out, "verified"), "yes");
        assert_eq!(field(&out, "peers"), "3");
    }
}

/// Tests of Debian's stock (unpatched) rxe: `cargo xtask test` runs this module there.
mod stock_only {
    use super::*;

    #[test]
    #[ignore = "needs the testbed VM"]
    fn stock_only_gpu_rdma_write_says_the_stack_lacks_dmabuf_regions() {
        let tb = Testbed::get();
        let out = run(
            example("gpu_rdma_write").args(["server", "--bind", &tb.local_addr, "--port", "18613"]),
            T,
        );
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let t = text(&out);
        assert!(
            t.contains("EOPNOTSUPP") || t.contains("not supported"),
            "{t}"
        );
        assert!(t.contains("kernel-patches"), "the hint names the fix: {t}");
    }
}
