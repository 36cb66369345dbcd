//! The transfer engine on one node: two agents over rxe loopback. Needs the testbed VM.

use gpu_rdma_engine::{Agent, Batch, EntryStatus, Error, ErrorKind, Settings, Side};
use integration_tests::engine::{bytes, host};
use integration_tests::exporters::{Exporter, ALL};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::pattern;
use std::time::{Duration, Instant};

const BLOCK: u64 = 64 << 10;
const WAIT: Duration = Duration::from_secs(120);

fn agent(tb: &Testbed, name: &str, chunk: u64) -> Agent {
    let settings = Settings {
        devices: Some(vec![tb.device.clone()]),
        bind: "127.0.0.1:0".parse().unwrap(),
        chunk_size: chunk,
        ..Settings::default()
    };
    Agent::new(name, settings).expect("agent")
}

/// Agents `a` and `b`, each knowing the other.
fn pair(tb: &Testbed) -> (Agent, Agent) {
    let (a, b) = (agent(tb, "a", 256 << 10), agent(tb, "b", 256 << 10));
    a.add_peer("b", b.address());
    b.add_peer("a", a.address());
    (a, b)
}

#[test]
#[ignore = "needs the testbed VM"]
fn loopback_scattered_blocks_from_every_exporter_written_and_read_back() {
    let tb = Testbed::get();
    let (a, b) = pair(&tb);
    const SRC: u64 = 4 << 20;
    const BLOCKS: u64 = 128;
    // Four sources on a: vgem, udmabuf, the system heap, host memory.
    let mut names = Vec::new();
    let mut sources = Vec::new();
    for (k, e) in ALL.iter().enumerate() {
        let mut d = e.allocate(SRC);
        let p = pattern(SRC as usize, k as u8 + 1);
        Exporter::fill(&mut d, 0, &p);
        let name = format!("{e:?}");
        a.register(&name, d).unwrap();
        names.push(name);
        sources.push(p);
    }
    let p = pattern(SRC as usize, 9);
    a.register("host", host(&p, SRC as usize)).unwrap();
    names.push("host".into());
    sources.push(p);
    a.register("back", host(&[], (BLOCKS * BLOCK) as usize))
        .unwrap();
    b.register("dst", Exporter::Udmabuf.allocate(BLOCKS * BLOCK))
        .unwrap();

    // Block j: from a scattered offset of source j % 4 to a scattered slot of b's dst.
    let src_of = |j: u64| ((j % 4) as usize, ((j * 7) % (SRC / BLOCK)) * BLOCK);
    let slot = |j: u64| ((j * 37) % BLOCKS) * BLOCK;
    let mut write = Batch::new().notify(b"written".to_vec());
    for j in 0..BLOCKS {
        let (s, off) = src_of(j);
        write = write.write(&names[s], off, "b", "dst", slot(j), BLOCK);
    }
    let t0 = Instant::now();
    let t = a.transfer(&write).expect("accepted");
    t.wait(WAIT).expect("written");
    let wrote = t0.elapsed();
    assert!(t.status().iter().all(|s| *s == EntryStatus::Done));
    let note = b
        .wait_notification(Duration::from_secs(10))
        .expect("notified");
    assert_eq!(
        (note.from.as_str(), &note.message[..]),
        ("a", &b"written"[..])
    );

    let mut read = Batch::new();
    for j in 0..BLOCKS {
        read = read.read("back", j * BLOCK, "b", "dst", slot(j), BLOCK);
    }
    a.transfer(&read)
        .expect("accepted")
        .wait(WAIT)
        .expect("read back");
    eprintln!(
        "{BLOCKS} blocks of 64 KiB written in {wrote:?}, read back in {:?}",
        t0.elapsed() - wrote
    );

    let back = bytes(a.unregister("back").unwrap());
    let dst = bytes(b.unregister("dst").unwrap());
    for j in 0..BLOCKS {
        let (s, off) = src_of(j);
        let want = &sources[s][off as usize..(off + BLOCK) as usize];
        let at = (j * BLOCK) as usize..((j + 1) * BLOCK) as usize;
        assert!(back[at.clone()] == *want, "block {j} read back differs");
        let at = slot(j) as usize..(slot(j) + BLOCK) as usize;
        assert!(dst[at] == *want, "block {j} in b's segment differs");
    }
    for (n, want) in names.iter().zip(&sources) {
        assert!(
            bytes(a.unregister(n).unwrap()) == *want,
            "source {n} changed"
        );
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn loopback_bad_entries_are_refused_typed_and_nothing_is_posted() {
    let tb = Testbed::get();
    let (a, b) = pair(&tb);
    a.register("src", host(&pattern(1 << 20, 3), 1 << 20))
        .unwrap();
    b.register("dst", host(&[], 1 << 20)).unwrap();
    let ok = || Batch::new().write("src", 0, "b", "dst", 0, 4096);
    let cases: Vec<(Batch, &str)> = vec![
        (Batch::new(), "empty"),
        (ok().write("src", 0, "nobody", "dst", 0, 1), "unknown agent"),
        (ok().write("nope", 0, "b", "dst", 0, 1), "unknown local"),
        (ok().write("src", 0, "b", "nope", 0, 1), "unknown remote"),
        (ok().write("src", 1 << 20, "b", "dst", 0, 1), "local range"),
        (
            ok().write("src", 0, "b", "dst", (1 << 20) - 1, 2),
            "remote range",
        ),
        (ok().write("src", 0, "b", "dst", 0, 0), "zero length"),
        (ok().read("src", 100, "b", "dst", 0, 10), "overlap"),
        (ok().notify(vec![0; 5000]), "notification"),
    ];
    for (batch, what) in cases {
        let e = a.transfer(&batch).expect_err(what);
        let right = match what {
            "empty" => matches!(e, Error::EmptyBatch),
            "unknown agent" => matches!(e, Error::UnknownAgent(_)),
            "unknown local" => matches!(e, Error::UnknownSegment { ref agent, .. } if agent == "a"),
            "unknown remote" => {
                matches!(e, Error::UnknownSegment { ref agent, .. } if agent == "b")
            }
            "local range" => matches!(
                e,
                Error::OutOfRange {
                    side: Side::Local,
                    ..
                }
            ),
            "remote range" => matches!(
                e,
                Error::OutOfRange {
                    side: Side::Remote,
                    ..
                }
            ),
            "zero length" => matches!(e, Error::ZeroLength { entry: 1 }),
            "overlap" => matches!(e, Error::Overlap { .. }),
            _ => matches!(e, Error::NotificationTooLong(5000)),
        };
        assert!(right, "{what}: {e:?}");
        let kind = if what.starts_with("unknown") {
            ErrorKind::NotFound
        } else {
            ErrorKind::InvalidInput
        };
        assert_eq!(e.kind(), kind, "{what}: {e:?}");
    }
    // Nothing was posted (b's segment is still zero) and nothing is left marked busy.
    assert!(bytes(b.unregister("dst").unwrap()).iter().all(|&x| x == 0));
    a.unregister("src").expect("not busy");
}

#[test]
#[ignore = "needs the testbed VM"]
fn loopback_unregister_is_refused_while_a_transfer_uses_the_segment() {
    let tb = Testbed::get();
    let (a, b) = (agent(&tb, "a", 16 << 10), agent(&tb, "b", 16 << 10));
    a.add_peer("b", b.address());
    const LEN: usize = 32 << 20;
    a.register("src", host(&pattern(LEN, 5), LEN)).unwrap();
    b.register("dst", host(&[], LEN)).unwrap();
    let t = a
        .transfer(&Batch::new().write("src", 0, "b", "dst", 0, LEN as u64))
        .unwrap();
    match a.unregister("src") {
        Err(Error::SegmentBusy { users: 1, .. }) => {}
        other => panic!("unregister while busy: {other:?} ({:?})", t.status()),
    }
    assert!(matches!(
        b.unregister("nope"),
        Err(Error::UnknownSegment { .. })
    ));
    t.wait(WAIT).expect("written");
    assert_eq!(bytes(a.unregister("src").unwrap()), pattern(LEN, 5));
    assert_eq!(bytes(b.unregister("dst").unwrap()), pattern(LEN, 5));
}

#[test]
#[ignore = "needs the testbed VM"]
fn loopback_dead_peer_fails_its_entries_and_others_keep_working() {
    let tb = Testbed::get();
    let (a, b) = pair(&tb);
    let c = agent(&tb, "c", 256 << 10);
    a.add_peer("c", c.address());
    const LEN: usize = 32 << 20;
    a.register("src", host(&pattern(LEN, 7), LEN)).unwrap();
    b.register("dst", host(&[], LEN)).unwrap();
    c.register("dst", host(&[], LEN)).unwrap();
    let bound = Settings::default().peer_failure_bound();
    let t = a
        .transfer(&Batch::new().write("src", 0, "c", "dst", 0, LEN as u64))
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    drop(c);
    let died = Instant::now();
    match t.wait(WAIT) {
        Err(Error::EntryFailed { error, .. }) => {
            assert!(matches!(*error, Error::PeerDown { .. }), "{error:?}")
        }
        Ok(()) => eprintln!("the write finished before c went away: nothing to fail"),
        other => panic!("{other:?}"),
    }
    let took = died.elapsed();
    assert!(
        took < bound + Duration::from_secs(10),
        "failed after {took:?} (bound {bound:?})"
    );
    // The next transfer to c is refused (it is gone); b is served as before.
    assert!(a
        .transfer(&Batch::new().write("src", 0, "c", "dst", 0, 1))
        .is_err());
    let t = a
        .transfer(&Batch::new().write("src", 0, "b", "dst", 0, LEN as u64))
        .unwrap();
    t.wait(WAIT).expect("b still works");
    assert_eq!(bytes(b.unregister("dst").unwrap()), pattern(LEN, 7));
}

/// Cards (`Agent::card`, `name_card`, `add_peer_card`): a peer named by its card alone; its own card
/// makes an agent its own peer; other versions and cut cards refused, typed; `remove_peer`
/// forgets; and a batch's timing is the engine's clock of it.
#[test]
#[ignore = "needs the testbed VM"]
fn a_card_names_a_peer_an_own_card_loops_back_and_remove_peer_forgets() {
    let tb = Testbed::get();
    let (a, b) = (agent(&tb, "a", 256 << 10), agent(&tb, "b", 256 << 10));
    let p = pattern(BLOCK as usize, 5);
    b.register("src", host(&p, BLOCK as usize)).unwrap();
    a.register("dst", host(&[], 2 * BLOCK as usize)).unwrap();
    let read = Batch::new().read("dst", 0, "b", "src", 0, BLOCK);
    let unknown = a.transfer(&read).expect_err("b is not known yet");
    assert_eq!(unknown.kind(), ErrorKind::NotFound, "{unknown}");

    let card = b.card().expect("a card");
    // The card without segments names b as well, in a few dozen bytes.
    let slim = b.name_card().expect("a name card");
    assert!(
        slim.len() < 128 && slim.len() < card.len(),
        "{}",
        slim.len()
    );
    assert_eq!(a.add_peer_card(&slim).expect("loaded"), "b");
    assert_eq!(a.add_peer_card(&card).expect("loaded"), "b");
    let before = std::time::SystemTime::now();
    let t = a.transfer(&read).expect("accepted");
    t.wait(WAIT).expect("read");
    let timing = t.timing();
    let finished = timing.finished.expect("finished");
    assert!(timing.submitted <= finished, "{timing:?}");
    assert!(
        timing.started + Duration::from_secs(1) >= before,
        "{timing:?}"
    );
    assert!(timing.started <= std::time::SystemTime::now());

    let mut other = card.clone();
    other[4] ^= 0x80; // the card's format version
    assert!(matches!(
        a.add_peer_card(&other),
        Err(Error::IncompatibleVersion { .. })
    ));
    for cut in [0, 4, 6, card.len() / 2, card.len() - 1] {
        assert!(
            matches!(a.add_peer_card(&card[..cut]), Err(Error::Protocol(_))),
            "{cut} bytes"
        );
    }

    // Its own card: a's second half from its first, through the NIC.
    assert_eq!(a.add_peer_card(&a.card().unwrap()).unwrap(), "a");
    let own = Batch::new().write("dst", 0, "a", "dst", BLOCK, BLOCK);
    a.transfer(&own)
        .expect("accepted")
        .wait(WAIT)
        .expect("loopback");

    a.remove_peer("b");
    a.remove_peer("b"); // twice: nothing
    let gone = a.transfer(&read).expect_err("b is forgotten");
    assert_eq!(gone.kind(), ErrorKind::NotFound, "{gone}");
    let dst = bytes(a.unregister("dst").unwrap());
    assert!(dst[..BLOCK as usize] == p[..], "the read landed");
    assert!(dst[BLOCK as usize..] == p[..], "the loopback write landed");
}
