//! The checks of a batch, one refusal each, and the chunking.

use super::*;
use crate::batch::Batch;
use crate::descriptor::DeviceRegion;

fn seg(name: &str, len: u64, read: bool, write: bool) -> SegmentDescriptor {
    SegmentDescriptor {
        name: name.into(),
        len,
        base: None,
        remote_read: read,
        remote_write: write,
        regions: vec![DeviceRegion {
            device: 0,
            device_name: "rxe0".into(),
            gid: [0; 16],
            addr: 0x10_0000,
            rkey: 9,
            tier: 0,
        }],
    }
}

fn run(batch: Batch, chunk: u64) -> Result<Plan> {
    let local = [seg("src", 1 << 20, true, true)];
    let peer = AgentDescriptor {
        agent: "b".into(),
        incarnation: 5,
        segments: vec![
            seg("dst", 1 << 20, true, true),
            seg("ro", 4096, true, false),
        ],
    };
    plan(
        &batch.entries,
        "a",
        |n| local.iter().find(|s| s.name == n),
        |a| (a == "b").then_some(&peer),
        chunk,
        &[1],
    )
}

#[test]
fn each_bad_entry_is_refused_with_its_own_error() {
    let ok = Batch::new().write("src", 0, "b", "dst", 0, 4096);
    type Case = (Batch, fn(&Error) -> bool);
    let table: Vec<Case> = vec![
        (Batch::new(), |e| matches!(e, Error::EmptyBatch)),
        (ok.clone().write("src", 0, "b", "dst", 0, 0), |e| {
            matches!(e, Error::ZeroLength { entry: 1 })
        }),
        (
            ok.clone().write("nope", 0, "b", "dst", 0, 1),
            |e| matches!(e, Error::UnknownSegment { agent, .. } if agent == "a"),
        ),
        (
            ok.clone().write("src", 0, "c", "dst", 0, 1),
            |e| matches!(e, Error::UnknownAgent(a) if a == "c"),
        ),
        (
            ok.clone().write("src", 0, "b", "nope", 0, 1),
            |e| matches!(e, Error::UnknownSegment { agent, .. } if agent == "b"),
        ),
        (
            ok.clone().write("src", (1 << 20) - 1, "b", "dst", 0, 2),
            |e| {
                matches!(
                    e,
                    Error::OutOfRange {
                        side: Side::Local,
                        entry: 1,
                        ..
                    }
                )
            },
        ),
        (ok.clone().read("src", 8192, "b", "dst", 1 << 20, 1), |e| {
            matches!(
                e,
                Error::OutOfRange {
                    side: Side::Remote,
                    ..
                }
            )
        }),
        (ok.clone().write("src", u64::MAX, "b", "dst", 0, 2), |e| {
            matches!(
                e,
                Error::OutOfRange {
                    side: Side::Local,
                    ..
                }
            )
        }),
        (ok.clone().write("src", 0, "b", "ro", 0, 1), |e| {
            matches!(
                e,
                Error::Access {
                    needs: "remote write",
                    ..
                }
            )
        }),
        (ok.clone().read("src", 100, "b", "dst", 0, 10), |e| {
            matches!(e, Error::Overlap { .. })
        }),
        (
            Batch::new()
                .read("src", 0, "b", "dst", 0, 4096)
                .read("src", 4095, "b", "dst", 0, 1),
            |e| {
                matches!(
                    e,
                    Error::Overlap {
                        entry: 1,
                        other: 0,
                        ..
                    }
                )
            },
        ),
    ];
    for (i, (batch, expected)) in table.into_iter().enumerate() {
        let got = run(batch, 1 << 20).expect_err("refused");
        assert!(expected(&got), "case {i}: {got:?}");
    }
    assert!(run(ok, 1 << 20).is_ok());
}

#[test]
fn a_read_beside_a_write_and_touching_ranges_pass() {
    let b = Batch::new()
        .read("src", 0, "b", "dst", 0, 4096)
        .write("src", 4096, "b", "dst", 0, 4096)
        .read("src", 8192, "b", "ro", 0, 4096);
    let p = run(b, 1 << 20).unwrap();
    assert_eq!(p.rounds, 1);
}

#[test]
fn entries_are_cut_into_chunks_with_their_remote_addresses() {
    let p = run(
        Batch::new().write("src", 100, "b", "dst", 1000, 10_000),
        4096,
    )
    .unwrap();
    let lens: Vec<u64> = p.chunks.iter().map(|c| c.len).collect();
    assert_eq!(lens, [4096, 4096, 1808]);
    assert_eq!(p.chunks[1].offset, 100 + 4096);
    assert_eq!(p.chunks[1].remote_addr, 0x10_0000 + 1000 + 4096);
    assert_eq!(p.chunks_per_entry, [3]);
    assert_eq!(
        p.peers,
        [PeerTarget {
            agent: "b".into(),
            incarnation: 5
        }]
    );
}

#[test]
fn overlapping_writes_go_to_later_rounds() {
    let b = Batch::new()
        .write("src", 0, "b", "dst", 0, 100)
        .write("src", 50, "b", "dst", 4096, 100)
        .write("src", 100, "b", "dst", 8192, 100)
        .write("src", 0, "b", "dst", 0, 10);
    let p = run(b, 1 << 20).unwrap();
    let rounds: Vec<u16> = p.chunks.iter().map(|c| c.round).collect();
    assert_eq!(p.rounds, 2, "{rounds:?}");
    // In each round, the local ranges are disjoint.
    for r in 0..p.rounds {
        let mut ranges: Vec<(u64, u64)> = p
            .chunks
            .iter()
            .filter(|c| c.round == r)
            .map(|c| (c.offset, c.offset + c.len))
            .collect();
        ranges.sort();
        assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "{rounds:?}");
    }
}

fn place(device: u16, tier: u8) -> Place {
    Place {
        device,
        tier,
        addr: 0x1000 * (u64::from(device) + 1),
        rkey: u32::from(device) + 10,
    }
}

fn picks(
    l: &[Place],
    r: &[Place],
    up: impl Fn(u16, u16) -> bool,
    w: &[u32],
    n: usize,
) -> Vec<(u16, u16)> {
    let s = stripe(l, r, up, w).unwrap();
    (0..n)
        .map(|k| s.pick(l, r, k))
        .map(|(a, b)| (a.device, b.device))
        .collect()
}

#[test]
fn chunks_stripe_over_the_nearest_rails_of_the_same_index() {
    let l = [place(0, 0), place(1, 0), place(2, 1), place(3, 2)];
    let r = [place(0, 0), place(1, 0), place(2, 0), place(3, 0)];
    let all = |_, _| true;
    assert_eq!(
        picks(&l, &r, all, &[1; 4], 4),
        [(0, 0), (1, 1), (0, 0), (1, 1)]
    );
    // The remote side's tiers count too: its memory is nearest device 1.
    let r = [place(0, 1), place(1, 0), place(2, 1), place(3, 1)];
    assert!(picks(&l, &r, all, &[1; 4], 4).iter().all(|p| p.0 == 1));
    // With the nearest rails down, the next tier; with none left, none.
    assert_eq!(picks(&l, &r, |l, _| l >= 2, &[1; 4], 1), [(2, 2)]);
    assert!(stripe(&l, &r, |_, _| false, &[1; 4]).is_none());
    // No device index in common: every pair is a rail.
    let r = [place(7, 0)];
    assert_eq!(picks(&l[..2], &r, all, &[1; 4], 2), [(0, 7), (1, 7)]);
}

#[test]
fn rails_are_taken_in_proportion_to_their_link_rates() {
    let four: Vec<Place> = (0..4).map(|d| place(d, 0)).collect();
    let rates = [25_000, 25_000, 10_000, 10_000];
    let got = picks(&four, &four, |_, _| true, &rates, 14);
    let order: Vec<u16> = got.iter().map(|p| p.0).collect();
    assert_eq!(
        order,
        [0, 1, 2, 3, 0, 1, 0, 1, 2, 0, 1, 3, 0, 1],
        "spread out"
    );
    let count = |d| order.iter().filter(|&&x| x == d).count();
    assert_eq!([count(0), count(1), count(2), count(3)], [5, 5, 2, 2]);
    // Rates far apart still give the slow rail a turn, in a bounded cycle.
    let s = stripe(&four[..2], &four[..2], |_, _| true, &[400_000, 1_000]).unwrap();
    assert!(s.cycle.len() <= MAX_CYCLE as usize && s.cycle.contains(&1));
}

#[test]
fn a_rerouted_chunk_keeps_its_offsets_on_the_other_device() {
    let four = |name: &str| SegmentDescriptor {
        regions: (0..4)
            .map(|d| DeviceRegion {
                device: d,
                device_name: format!("rxe{d}"),
                gid: [0; 16],
                addr: 0x100_0000 * (u64::from(d) + 1),
                rkey: u32::from(d) + 1,
                tier: 0,
            })
            .collect(),
        ..seg(name, 1 << 20, true, true)
    };
    let local = [four("src")];
    let peer = AgentDescriptor {
        agent: "b".into(),
        incarnation: 5,
        segments: vec![four("dst")],
    };
    let p = plan(
        &Batch::new().write("src", 0, "b", "dst", 4096, 8192).entries,
        "a",
        |n| local.iter().find(|s| s.name == n),
        |a| (a == "b").then_some(&peer),
        4096,
        &[1; 4],
    )
    .unwrap();
    let devices: Vec<u16> = p.chunks.iter().map(|c| c.local_device).collect();
    assert_eq!(devices, [0, 1], "striped");
    let ch = p.chunks[1];
    assert_eq!(ch.remote_addr, 0x200_0000 + 4096 + 4096);
    let lp = &p.local_places[0];
    let rp = &p.remote_places[0];
    let only3 = stripe(lp, rp, |l, _| l == 3, &p.weights).unwrap();
    let moved = reroute(&p, &ch, &only3, 0).unwrap();
    assert_eq!((moved.local_device, moved.remote_device), (3, 3));
    assert_eq!(moved.remote_addr, 0x400_0000 + 4096 + 4096);
    assert_eq!(moved.rkey, 4);
    assert_eq!(
        (moved.offset, moved.len, moved.entry),
        (ch.offset, ch.len, ch.entry)
    );
    assert!(stripe(lp, rp, |_, _| false, &p.weights).is_none());
}

/// `batch` checked against a peer whose segment `dst` is `len` bytes at `addr` (its
/// descriptor is input: any numbers), from a local segment `src` of `local_len` bytes at 0.
fn against(addr: u64, len: u64, local_len: u64, batch: Batch, chunk: u64) -> Result<Plan> {
    let at = |addr, s: SegmentDescriptor| SegmentDescriptor {
        regions: vec![DeviceRegion {
            addr,
            ..s.regions[0].clone()
        }],
        ..s
    };
    let local = [at(0, seg("src", local_len, true, true))];
    let peer = AgentDescriptor {
        agent: "b".into(),
        incarnation: 5,
        segments: vec![at(addr, seg("dst", len, true, true))],
    };
    plan(
        &batch.entries,
        "a",
        |n| local.iter().find(|s| s.name == n),
        |a| (a == "b").then_some(&peer),
        chunk,
        &[1],
    )
}

#[test]
fn a_peer_segment_ending_past_the_address_space_is_refused_not_wrapped() {
    let past = |e: &Error| matches!(e, Error::Protocol(m) if m.contains("address space"));
    let w = |offset, len| Batch::new().write("src", 0, "b", "dst", offset, len);
    // A region near the top whose end wraps: addr + offset + cut would overflow.
    let got = against(u64::MAX - 4096, 1 << 20, 1 << 20, w(8192, 4096), 4096);
    assert!(got.as_ref().is_err_and(past), "{got:?}");
    // A segment claiming the whole address space: offset + len fits its length, but not
    // added to its address.
    let got = against(0x10_0000, u64::MAX, 1 << 20, w(u64::MAX - 4096, 4096), 4096);
    assert!(got.as_ref().is_err_and(past), "{got:?}");
    // The peer's offset + len overflowing is out of its range.
    let got = against(0x10_0000, 1 << 20, 1 << 20, w(u64::MAX - 1, 4), 4096);
    assert!(
        matches!(got, Err(Error::OutOfRange { side: Side::Remote, offset, len: 4, .. })
            if offset == u64::MAX - 1),
        "{got:?}"
    );
    // Up to the last page of the address space is fine, chunked and addressed exactly.
    let top = u64::MAX - (1 << 20);
    let p = against(top, 1 << 20, 1 << 20, w((1 << 20) - 8192, 8192), 4096).unwrap();
    let addrs: Vec<u64> = p.chunks.iter().map(|c| c.remote_addr).collect();
    assert_eq!(addrs, [u64::MAX - 8192, u64::MAX - 4096]);
}

#[test]
fn chunk_counts_near_u64_max_are_refused_typed() {
    let whole = u64::MAX;
    // A first entry's chunk, then u64::MAX chunks of 1 byte: the count would overflow.
    let b = Batch::new()
        .write("src", 0, "b", "dst", 0, 1)
        .write("src", 0, "b", "dst", 0, whole);
    let got = against(0, whole, whole, b, 1);
    assert!(matches!(got, Err(Error::BatchTooLarge(_))), "{got:?}");
    // Lengths near u64::MAX cut into a few huge chunks: the cuts add up exactly.
    let b = Batch::new().write("src", 1, "b", "dst", 2, whole - 2);
    let p = against(0, whole, whole, b, whole / 2).unwrap();
    let cuts: Vec<(u64, u64, u64)> = p
        .chunks
        .iter()
        .map(|c| (c.offset, c.len, c.remote_addr))
        .collect();
    assert_eq!(
        cuts,
        [
            (1, whole / 2, 2),
            (1 + whole / 2, whole / 2 - 1, 2 + whole / 2)
        ]
    );
}

#[test]
fn a_peer_listing_many_devices_gives_a_bounded_stripe() {
    // No device in common: every (local, remote) pair is a rail.
    let l = [place(0, 0)];
    let r: Vec<Place> = (1..=300).map(|d| place(d, 0)).collect();
    let s = stripe(&l, &r, |_, _| true, &[1]).unwrap();
    assert_eq!(s.rails.len(), MAX_RAILS);
    assert!(s.cycle.iter().all(|&i| usize::from(i) < s.rails.len()));
    let used: std::collections::HashSet<u16> = (0..s.cycle.len())
        .map(|k| s.pick(&l, &r, k).1.device)
        .collect();
    assert_eq!(used.len(), MAX_RAILS, "each rail taken once a cycle");
}
