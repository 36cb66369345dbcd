//! CUDA ranges as segments of the transfer engine (`Agent::register_cuda`), with the stand-in
//! libcuda (memfd + udmabuf "device memory": this project's code, not NVIDIA's driver): two
//! agents over rxe loopback, the CUDA agent on the testbed's device twice (two protection
//! domains, two registration caches). A range at an odd offset is written to a peer and read
//! back into from it, every byte (and the bytes around the range) checked through the
//! stand-in's host view; registered again after `unregister`, it is served by the caches
//! (hits, no new miss) when the agent keeps CUDA registrations, and otherwise no peer
//! reaches it after `unregister` (a stale descriptor's write is refused by the NIC, the
//! memory the program reused untouched); unregistering is refused while a transfer uses it; ranges across
//! `cuMemMap` seams, freed or host memory are refused typed. Runs in the testbed VM.

use gpu_rdma_engine::{Agent, Batch, Error, Memory, Settings};
use integration_tests::cuda_standin::{standin, vouched_device, Kind};
use integration_tests::engine::{bytes, host};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::pattern;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);
const SIZE: usize = 8 << 20;

fn agent(tb: &Testbed, name: &str, devices: usize) -> Agent {
    agent_keeping(tb, name, devices, false)
}

fn agent_keeping(tb: &Testbed, name: &str, devices: usize, keep: bool) -> Agent {
    let settings = Settings {
        devices: Some(vec![tb.device.clone(); devices]),
        bind: "127.0.0.1:0".parse().unwrap(),
        chunk_size: 16 << 10,
        keep_cuda_registrations: keep,
        ..Settings::default()
    };
    Agent::new(name, settings).expect("agent")
}

/// (hits, misses) summed over the agent's devices.
fn hits_misses(a: &Agent) -> (u64, u64) {
    a.cache_stats()
        .iter()
        .fold((0, 0), |(h, m), s| (h + s.hits, m + s.misses))
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_cuda_segment_is_moved_byte_for_byte_and_registered_again_from_the_caches() {
    let tb = Testbed::get();
    let (a, b) = (agent_keeping(&tb, "a", 2, true), agent(&tb, "b", 1));
    a.add_peer("b", b.address());
    let s = standin();
    let dev = vouched_device();
    let base = s.alloc(SIZE, 1, Kind::Device);
    let (at, len) = (100usize, SIZE - 333);
    let ptr = base + at as u64;
    let before = pattern(SIZE, 1);
    s.write(base, &before);

    let desc = a.register_cuda("gpu", &dev, ptr, len as u64).unwrap();
    assert_eq!(desc.len, len as u64);
    assert_eq!(desc.regions.len(), 2, "one region per device");
    assert!(desc.regions.iter().all(|r| r.addr == ptr), "iova = ptr");
    assert_eq!(hits_misses(&a), (0, 2), "one registration per device");
    let rkeys: Vec<u32> = desc.regions.iter().map(|r| r.rkey).collect();

    // a's CUDA range to b, while unregistering it is refused.
    b.register("dst", host(&[], SIZE)).unwrap();
    let t = a
        .transfer(&Batch::new().write("gpu", 0, "b", "dst", 0, len as u64))
        .unwrap();
    match a.unregister("gpu") {
        Err(Error::SegmentBusy { users: 1, .. }) => {}
        other => panic!("unregister while busy: {other:?} ({:?})", t.status()),
    }
    t.wait(WAIT).expect("written");
    let dst = bytes(b.unregister("dst").unwrap());
    assert!(dst[..len] == before[at..at + len], "written bytes");

    // b's bytes read into the CUDA range, in scattered blocks (odd tail included).
    let from_b = pattern(SIZE, 2);
    b.register("src", host(&from_b, SIZE)).unwrap();
    let block = 64 << 10;
    let mut read = Batch::new();
    for k in 0..len.div_ceil(block) {
        let off = k * block;
        let n = block.min(len - off);
        // Block k of the range from b's block (k * 7) % 100.
        let src = ((k * 7) % 100) * block;
        read = read.read("gpu", off as u64, "b", "src", src as u64, n as u64);
    }
    a.transfer(&read).unwrap().wait(WAIT).expect("read");
    let seen = s.read(base, SIZE);
    for k in 0..len.div_ceil(block) {
        let off = k * block;
        let n = block.min(len - off);
        let src = ((k * 7) % 100) * block;
        assert!(
            seen[at + off..at + off + n] == from_b[src..src + n],
            "block {k} read into the CUDA range"
        );
    }
    assert!(
        seen[..at] == before[..at] && seen[at + len..] == before[at + len..],
        "nothing outside the range moved"
    );

    // Unregistered: the description back, the registrations to the caches.
    match a.unregister("gpu").unwrap() {
        Memory::Cuda { ptr: p, len: l, .. } => assert_eq!((p, l), (ptr, len as u64)),
        other => panic!("{other:?}"),
    }
    let st = a.cache_stats();
    assert!(
        st.iter().all(|s| s.entries == 1 && s.checked_out == 0),
        "{st:?}"
    );
    // Registered again: a hit on every device, no export, the same registrations.
    let again = a.register_cuda("gpu", &dev, ptr, len as u64).unwrap();
    assert_eq!(hits_misses(&a), (2, 2), "hits, misses unchanged");
    let again_rkeys: Vec<u32> = again.regions.iter().map(|r| r.rkey).collect();
    assert_eq!(again_rkeys, rkeys);
    // And it still moves the right bytes.
    s.write(base, &before);
    b.register("dst", host(&[], SIZE)).unwrap();
    a.transfer(&Batch::new().write("gpu", 0, "b", "dst", 0, len as u64))
        .unwrap()
        .wait(WAIT)
        .expect("written again");
    let dst = bytes(b.unregister("dst").unwrap());
    assert!(dst[..len] == before[at..at + len], "written again");
    // The same range under a second name while the first holds the cached ones: registered
    // afresh (a registration is never handed out twice).
    a.register_cuda("gpu2", &dev, ptr, len as u64).unwrap();
    assert_eq!(hits_misses(&a), (2, 4));
    a.unregister("gpu2").unwrap();
    a.unregister("gpu").unwrap();
    a.clear_registration_caches();
    assert!(a.cache_stats().iter().all(|s| s.entries == 0));
    drop(a);
    s.free(base);
}

#[test]
#[ignore = "needs the testbed VM"]
fn cuda_segments_across_seams_freed_or_of_host_memory_are_refused_typed() {
    let tb = Testbed::get();
    let a = agent(&tb, "a", 2);
    let s = standin();
    let dev = vouched_device();
    // Four cuMemMapped parts of 2 MiB under one virtual range.
    let mapped = s.alloc(SIZE, 4, Kind::Device);
    let quarter = (SIZE / 4) as u64;
    let freed = s.alloc(SIZE, 1, Kind::Device);
    s.free(freed);
    let pinned = s.alloc(1 << 20, 1, Kind::Host);
    for (ptr, len, what) in [
        (mapped + quarter - 64, 128, "across a seam"),
        (mapped, SIZE as u64, "all four parts"),
        (freed + 4096, 4096, "freed"),
        (pinned, 4096, "page-locked host memory"),
        (mapped, 0, "empty"),
    ] {
        match a.register_cuda("bad", &dev, ptr, len) {
            Err(Error::CudaRange { ptr: p, len: l, .. }) => {
                assert_eq!((p, l), (ptr, len), "{what}")
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    assert!(a.descriptor().segments.is_empty(), "nothing registered");
    assert_eq!(hits_misses(&a), (0, 0));
    // Inside one part: a segment.
    a.register_cuda("part", &dev, mapped + quarter, quarter)
        .unwrap();
    a.unregister("part").unwrap();
    drop(a);
    s.free(mapped);
    s.free(pinned);
}

#[test]
#[ignore = "needs the testbed VM"]
fn an_unregistered_cuda_segment_is_out_of_every_peers_reach() {
    let tb = Testbed::get();
    let (a, b) = (agent(&tb, "a", 1), agent(&tb, "b", 1));
    b.add_peer("a", a.address());
    let s = standin();
    let dev = vouched_device();
    const N: usize = 64 << 10;
    let base = s.alloc(N, 1, Kind::Device);
    s.write(base, &vec![0; N]);
    a.register_cuda("gpu", &dev, base, N as u64).unwrap();
    b.register("src", host(&pattern(N, 3), N)).unwrap();
    let write = Batch::new().write("src", 0, "a", "gpu", 0, N as u64);
    b.transfer(&write).unwrap().wait(WAIT).expect("written");
    assert_eq!(s.read(base, N), pattern(N, 3));
    // Unregistered, and the program puts the memory to another use; b still holds a's
    // old descriptor.
    assert!(matches!(a.unregister("gpu").unwrap(), Memory::Cuda { .. }));
    let st = a.cache_stats();
    assert!(st.iter().all(|s| s.entries == 0), "deregistered: {st:?}");
    s.write(base, &vec![0xaa; N]);
    let late = b.transfer(&write).map(|t| t.wait(WAIT));
    match late {
        // Refused by a's NIC; a's descriptor, asked again, has no "gpu" any more.
        Ok(Err(Error::EntryFailed { error, .. })) => assert_eq!(
            *error,
            Error::UnknownSegment {
                agent: "a".into(),
                segment: "gpu".into()
            }
        ),
        other => panic!("a write to an unregistered CUDA segment gave {other:?}"),
    }
    assert!(
        s.read(base, N) == vec![0xaa; N],
        "a peer wrote after unregister"
    );
    // Registered again: exported and registered afresh (nothing was kept).
    a.register_cuda("gpu", &dev, base, N as u64).unwrap();
    assert_eq!(hits_misses(&a), (0, 2));
    a.unregister("gpu").unwrap();
    drop(a);
    s.free(base);
}
