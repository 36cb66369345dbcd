//! Tests of `cargo xtask bench --peers` (`peers.rs`).

use super::*;

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

#[test]
fn options_parse_and_mistakes_are_named() {
    let r = parse_args(&words("--sizes 64K,1M --rounds 2 --duration 3")).unwrap();
    assert_eq!(
        (r.sizes, r.rounds, r.duration),
        (vec![64 << 10, 1 << 20], 2, 3)
    );
    assert_eq!(parse_args(&[]).unwrap().sizes, BLOCKS);
    for bad in ["--rounds 0", "--duration", "--sizes 9M", "--nodes 1"] {
        let e = parse_args(&words(bad)).unwrap_err().to_string();
        assert!(e.contains(bad.split(' ').next().unwrap()), "{bad}: {e}");
    }
}

#[test]
fn cells_too_large_for_a_guest_are_left_out_and_rounds_alternate() {
    let (cells, skipped) = cells(&BLOCKS);
    assert_eq!(cells.len() + skipped.len(), 2 * 6 * 2 * 2);
    // 4 threads x 128 x 2 MiB and more: 4 MiB blocks with 4 threads, both operations.
    assert_eq!(skipped.len(), 2);
    assert!(skipped.iter().all(|c| c.block == 4 << 20 && c.threads == 4));
    let s = steps(&cells[..1], 2);
    let ids: Vec<&str> = s.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "write-4K-b1-t1-mooncake-r1",
            "write-4K-b1-t1-ours-r1",
            "write-4K-b1-t1-ours-r2",
            "write-4K-b1-t1-mooncake-r2"
        ]
    );
    let plan = plan_text(&cells[..1], &s, 5);
    assert!(plan.contains("\nwrite-4K-b1-t1-ours-r2 2 95 ours write 4096 1 1 5 1048576\n"));
}

#[test]
fn consoles_give_samples_ratios_and_failures() {
    let cell = Cell {
        op: "write",
        block: 64 << 10,
        batch: 128,
        threads: 1,
    };
    let s = steps(&[cell], 2);
    let console = "\
### step write-64K-b128-t1-mooncake-r1 begin
I1129 10:00:00.0 1 transfer_engine_bench.cpp:300] Test completed: duration 5.00, batch count 10, throughput 12.00 MiB/s
### step write-64K-b128-t1-mooncake-r1 end rc=0 secs=7
### step write-64K-b128-t1-ours-r1 begin
Test completed: duration 5.00, batch count 12, throughput 15.00 MiB/s
### step write-64K-b128-t1-ours-r1 end rc=0 secs=6
### step write-64K-b128-t1-ours-r2 begin
Test completed: duration 5.00, batch count 9, throughput 11.00 MiB/s
### step write-64K-b128-t1-ours-r2 end rc=0 secs=6
### step write-64K-b128-t1-mooncake-r2 begin
### step write-64K-b128-t1-mooncake-r2 end rc=124 secs=95
";
    let (samples, failures) = collect(&[cell], &s, console);
    assert_eq!(samples.len(), 3);
    assert_eq!(samples[0].lat_usec, 500_000.0);
    assert_eq!(failures.len(), 1);
    assert!(failures[0].why.contains("timed out"), "{:?}", failures[0]);
    let req = Request {
        sizes: vec![64 << 10],
        rounds: 2,
        duration: 5,
    };
    let t = report(&[cell], &s, &samples, &req);
    // Ours: median 13 of 15 and 11; Mooncake 12 alone: 1.08, rounds' ratios 1.25 only.
    assert!(t.contains(" 1.08 "), "{t}");
    let (mut more, _) = collect(&[cell], &s, &console.replace("rc=124", "rc=0"));
    more.push(Sample {
        step: 3,
        mibps: 12.0,
        lat_usec: 1.0,
    });
    assert!(report(&[cell], &s, &more, &req).contains("1.08~"));
    let doc = document(
        &[cell],
        &[],
        &s,
        &samples,
        &failures,
        &req,
        Default::default(),
    );
    assert_eq!(doc["cells"][0]["ours"]["mibps"], json!([15.0, 11.0]));
    assert_eq!(doc["cells"][0]["ratio_mibps"]["within_noise"], json!(false));
}
