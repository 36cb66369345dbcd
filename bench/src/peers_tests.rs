//! Tests of `cargo xtask bench --peers` (`peers.rs`).

use super::*;
use crate::peers_plan::{BLOCKS, MAX_BUFFER};

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

#[test]
fn options_parse_and_mistakes_are_named() {
    let r = parse_args(&words(
        "--sizes 64K,1M --rounds 2 --duration 3 --batches 128,1 --threads 1 --ops read \
         --metadata both",
    ))
    .unwrap();
    assert_eq!(
        (r.sizes, r.rounds, r.duration),
        (vec![64 << 10, 1 << 20], 2, 3)
    );
    assert_eq!(
        (r.batches, r.threads, r.ops),
        (vec![1, 128], vec![1], vec!["read"])
    );
    assert_eq!(r.metadata, ["p2p", "etcd"]);
    let d = parse_args(&[]).unwrap();
    assert_eq!((d.sizes, d.metadata), (BLOCKS.to_vec(), vec!["p2p"]));
    assert_eq!(
        parse_args(&words("--metadata etcd")).unwrap().metadata,
        ["etcd"]
    );
    for bad in [
        "--rounds 0",
        "--duration",
        "--sizes 9M",
        "--nodes 1",
        "--metadata zk",
        "--batches 0",
        "--threads x",
        "--ops copy",
    ] {
        let e = parse_args(&words(bad)).unwrap_err().to_string();
        assert!(e.contains(bad.split(' ').next().unwrap()), "{bad}: {e}");
    }
}

#[test]
fn cells_too_large_for_a_guest_are_left_out_and_rounds_alternate() {
    let (cells, skipped) = cells(&parse_args(&[]).unwrap());
    assert_eq!(cells.len() + skipped.len(), 2 * 6 * 2 * 2);
    // Batches of 128 x 4 MiB (over 128 MiB a batch; with 4 threads, over the buffer too),
    // both operations.
    assert_eq!(skipped.len(), 4);
    assert!(skipped.iter().all(|c| c.block == 4 << 20 && c.batch == 128));
    assert!(skipped.iter().any(|c| c
        .too_large()
        .unwrap()
        .contains(&format!("{} MiB", MAX_BUFFER >> 20))));
    let (both, _) = super::cells(&parse_args(&words("--metadata both --sizes 4K")).unwrap());
    assert_eq!(both.len(), 2 * 2 * 2 * 2);
    assert_eq!((both[0].meta, both[1].meta), ("p2p", "etcd"));
    let s = steps(&cells[..1], 2);
    let ids: Vec<&str> = s.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "p2p-write-4K-b1-t1-mooncake-r1",
            "p2p-write-4K-b1-t1-ours-r1",
            "p2p-write-4K-b1-t1-ours-r2",
            "p2p-write-4K-b1-t1-mooncake-r2"
        ]
    );
    let plan = plan_text(&cells[..1], &s, 5, Client::Programs);
    assert!(plan.contains("\np2p-write-4K-b1-t1-ours-r2 2 95 ours p2p write 4096 1 1 5 1048576\n"));
    // A second per MiB of a batch: 128 x 1 MiB.
    let big = Cell {
        meta: "etcd",
        op: "read",
        block: 1 << 20,
        batch: 128,
        threads: 1,
    };
    assert_eq!(limit(5, &big), 5 + 90 + 128);
}

#[test]
fn consoles_give_samples_ratios_and_failures() {
    let cell = Cell {
        meta: "p2p",
        op: "write",
        block: 64 << 10,
        batch: 128,
        threads: 1,
    };
    let s = steps(&[cell], 2);
    let console = "\
### step p2p-write-64K-b128-t1-mooncake-r1 begin
I1129 10:00:00.0 1 transfer_engine_bench.cpp:300] Test completed: duration 5.00, batch count 10, throughput 12.00 MiB/s
### step p2p-write-64K-b128-t1-mooncake-r1 end rc=0 secs=7
### step p2p-write-64K-b128-t1-ours-r1 begin
Test completed: duration 5.00, batch count 12, throughput 15.00 MiB/s
### step p2p-write-64K-b128-t1-ours-r1 end rc=0 secs=6
### step p2p-write-64K-b128-t1-ours-r2 begin
Test completed: duration 5.00, batch count 9, throughput 11.00 MiB/s
### step p2p-write-64K-b128-t1-ours-r2 end rc=0 secs=6
### step p2p-write-64K-b128-t1-mooncake-r2 begin
### step p2p-write-64K-b128-t1-mooncake-r2 end rc=124 secs=95
";
    let (samples, failures) = collect(&[cell], &s, console);
    assert_eq!(samples.len(), 3);
    assert_eq!(samples[0].lat_usec, 500_000.0);
    assert_eq!(failures.len(), 1);
    assert!(failures[0].why.contains("timed out"), "{:?}", failures[0]);
    let req = parse_args(&words("--sizes 64K --rounds 2 --duration 5")).unwrap();
    let t = report(&[cell], &s, &samples, &req);
    // 8 MiB a batch. Ours: median 16.8 of 19.2 and 14.4; Mooncake 16 alone: 1.05, the
    // rounds' ratios 1.2 only.
    assert!(t.contains(" 1.05 "), "{t}");
    let (mut more, _) = collect(&[cell], &s, &console.replace("rc=124", "rc=0"));
    more.push(Sample {
        step: 3,
        mibps: 15.0,
        lat_usec: 1.0,
    });
    // Mooncake's median 15.5; round 2's ratio 14.4 / 15 under 1.
    assert!(report(&[cell], &s, &more, &req).contains("1.08~"));
    // A line per engine, Mooncake's dashed; the ratios' line has both rounds.
    let ch = charts(&[cell], &s, &more);
    let bw_lines: Vec<(&str, bool)> = ch[0]
        .1
        .lines
        .iter()
        .map(|l| (l.label.as_str(), l.dashed))
        .collect();
    assert_eq!(
        bw_lines,
        [
            ("mooncake p2p write b128 t1", true),
            ("ours p2p write b128 t1", false)
        ]
    );
    assert_eq!(ch[1].1.lines[0].points[0].1.n, 2);
    assert_eq!(ch[1].1.reference, Some(1.0));
    let doc = document(
        &[cell],
        &[],
        &s,
        &samples,
        &failures,
        &req,
        Default::default(),
    );
    let ours = &doc["cells"][0]["ours"]["mibps"];
    assert!((ours[0].as_f64().unwrap() - 19.2).abs() < 1e-9, "{ours}");
    assert!((ours[1].as_f64().unwrap() - 14.4).abs() < 1e-9, "{ours}");
    assert_eq!(doc["cells"][0]["metadata"], json!("p2p"));
    // --plot reads the samples back.
    let (c2, s2, x2) = from_json(&doc).unwrap();
    assert_eq!(c2, [cell]);
    assert_eq!(
        report(&c2, &s2, &x2, &req),
        report(&[cell], &s, &samples, &req)
    );
    assert_eq!(doc["cells"][0]["ratio_mibps"]["within_noise"], json!(false));
}

#[test]
fn the_python_client_has_its_own_defaults_and_alone_submits_asynchronously() {
    use crate::peers_plan::PY_BLOCKS;
    let r = parse_args(&words("--client python")).unwrap();
    assert_eq!(r.client, Client::Python);
    assert_eq!(r.sizes, PY_BLOCKS.to_vec());
    assert_eq!(r.ops, ALL_OPERATIONS.to_vec());
    let r = parse_args(&words("--client python --sizes 64K --ops read-async")).unwrap();
    assert_eq!((r.sizes, r.ops), (vec![64 << 10], vec!["read-async"]));
    assert!(
        parse_args(&words("--ops write-async")).is_err(),
        "the programs cannot"
    );
    assert!(parse_args(&words("--client ruby")).is_err());
    let (cells, _) = cells(
        &parse_args(&words(
            "--client python --sizes 4K --batches 1 --threads 1 --ops write",
        ))
        .unwrap(),
    );
    let s = steps(&cells, 1);
    let plan = plan_text(&cells, &s, 5, Client::Python);
    assert!(
        plan.contains(" py-mooncake p2p write ") && plan.contains(" py-ours p2p write "),
        "{plan}"
    );
}
