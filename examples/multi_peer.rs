//! One hub, several peers, one GPU buffer: multicast, scatter and gather over a
//! `MultiChannel` (a reliable-connected queue pair per peer, all in one protection domain, so
//! the GPU buffer is registered once for every peer).
//!
//! The peers are queue pairs of this same process on the same device, so the example runs
//! wherever one RDMA device is (a NIC, or soft-RoCE over its loopback).
//!
//! ```text
//! multi_peer [--peers 3] [--part 256K] [--rdma DEV] [--drm PATH]
//! ```
//!
//! Exit status 0 when every byte of every step arrived as sent.

use examples::gpu::{self, Where};
use examples::report::{bytes, line};
use examples::{fail, host_region, net, pattern, Args};
use rdma_dmabuf::{
    Access, Context, HostBuffer, MemoryRegion, MultiChannelBuilder, ProtectionDomain, QueuePair,
    QueuePairBuilder,
};
use std::sync::Arc;

const USAGE: &str = "\
usage: multi_peer [--peers 3] [--part 256K] [--rdma DEV] [--drm PATH]

  --peers N      how many peers (default 3)
  --part BYTES   bytes per peer (default 256K); the GPU buffer holds one part per peer
  --rdma DEV     the RDMA device (default: the first hardware device, else rxe/siw)
  --drm PATH     the DRM node for the GPU buffer (default: the first GPU, else vgem)";

const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

fn main() {
    let args = Args::parse(USAGE, &["peers", "part", "rdma", "drm"]);
    let n: usize = args.get("peers", 3);
    let part = args.size("part", 256 << 10);
    if n == 0 || part == 0 {
        fail("--peers and --part must be at least 1");
    }
    println!("multi_peer");
    let picked = net::pick(args.text("rdma").as_deref()).unwrap_or_else(|e| fail(&e));
    let ctx = Context::open(&picked.device).unwrap_or_else(|e| fail(&e.to_string()));
    let pd = ProtectionDomain::new(&ctx).unwrap_or_else(|e| fail(&e.to_string()));
    line(
        "RDMA device",
        format!("{}, hub and {n} peers", picked.device),
    );

    let total = part * n as u64;
    let (_alloc, mut dmabuf) = gpu::allocate_or_exit(
        args.text("drm").as_deref(),
        total,
        Where::Auto,
        "GPU buffer",
    );
    let whole = {
        let mut w = vec![0u8; total as usize];
        pattern::fill(&mut w, 0x6d, 0);
        w
    };
    dmabuf
        .map()
        .and_then(|mut m| m.write()?.write_at(0, &whole))
        .unwrap_or_else(|e| fail(&e.to_string()));
    let gpu_region = MemoryRegion::register_dmabuf(&pd, dmabuf, 0, total, None, Access::empty())
        .unwrap_or_else(|e| fail(&e.to_string()));
    line(
        "registered",
        format!("once, {} dma-buf MR used by all {n} peers", bytes(total)),
    );

    let (hub, peers) = hub_and_peers(&pd, n, picked.gid_index);
    let slice = |i: usize| &whole[i * part as usize..(i + 1) * part as usize];
    let mut ok = true;
    let mut check = |what: &str, good: bool| {
        line(
            what,
            if good {
                "every byte arrived"
            } else {
                "MISMATCH"
            },
        );
        ok &= good;
    };

    // Multicast: the first part to every peer.
    let inboxes = post_recvs(&pd, &peers, part);
    hub.send_to_all(gpu_region.part(0..part))
        .unwrap_or_else(|e| fail(&e.to_string()));
    let got = wait_all(inboxes, part);
    check("multicast", got.iter().all(|g| g == slice(0)));

    // Scatter: part i to peer i.
    let inboxes = post_recvs(&pd, &peers, part);
    let parts: Vec<_> = (0..n)
        .map(|i| (i, gpu_region.part(i as u64 * part..(i as u64 + 1) * part)))
        .collect();
    hub.scatter_send(&parts)
        .unwrap_or_else(|e| fail(&e.to_string()));
    let got = wait_all(inboxes, part);
    check("scatter", (0..n).all(|i| got[i] == slice(i)));

    // Scatter write: part i straight into peer i's region, no receive involved.
    let targets: Vec<_> = (0..n)
        .map(|_| host_region(&pd, part as usize, RW))
        .collect();
    let writes: Vec<_> = (0..n)
        .map(|i| {
            let remote = targets[i].remote().expect("remotely writable");
            (
                i,
                gpu_region.part(i as u64 * part..(i as u64 + 1) * part),
                remote,
            )
        })
        .collect();
    hub.scatter_write(&writes)
        .unwrap_or_else(|e| fail(&e.to_string()));

    // Gather read: every peer's region back into the hub's own regions.
    let mut back: Vec<_> = (0..n)
        .map(|_| host_region(&pd, part as usize, Access::LOCAL_WRITE))
        .collect();
    let mut reads: Vec<_> = back
        .iter_mut()
        .enumerate()
        .map(|(i, r)| {
            (
                i,
                r.part_mut(0..part),
                targets[i].remote().expect("readable"),
            )
        })
        .collect();
    hub.gather_read(&mut reads)
        .unwrap_or_else(|e| fail(&e.to_string()));
    drop(reads);
    check(
        "write + read",
        (0..n).all(|i| {
            back[i]
                .bytes()
                .is_ok_and(|b| &b[..part as usize] == slice(i))
        }),
    );

    // Gather receive: each peer sends part i (taken from the pattern) to the hub.
    let sends: Vec<_> = (0..n)
        .map(|i| {
            let mut r = host_region(&pd, part as usize, Access::empty());
            r.bytes_mut().expect("local")[..part as usize].copy_from_slice(slice(i));
            peers[i]
                .post_send(r, None)
                .unwrap_or_else(|e| fail(&e.to_string()))
        })
        .collect();
    let mut inbox: Vec<_> = (0..n)
        .map(|_| host_region(&pd, part as usize, Access::LOCAL_WRITE))
        .collect();
    let mut recvs: Vec<_> = inbox
        .iter_mut()
        .enumerate()
        .map(|(i, r)| (i, r.part_mut(0..part)))
        .collect();
    hub.gather_recv(&mut recvs)
        .unwrap_or_else(|e| fail(&e.to_string()));
    drop(recvs);
    for s in sends {
        s.spin().unwrap_or_else(|e| fail(&e.to_string()));
    }
    check(
        "gather",
        (0..n).all(|i| {
            inbox[i]
                .bytes()
                .is_ok_and(|b| &b[..part as usize] == slice(i))
        }),
    );
    println!(
        "RESULT multi_peer peers={n} part={part} ok={}",
        if ok { "yes" } else { "no" }
    );
    if !ok {
        std::process::exit(1);
    }
}

/// A hub channel to `n` peers, each peer a queue pair of this process.
fn hub_and_peers(
    pd: &Arc<ProtectionDomain>,
    n: usize,
    gid: u32,
) -> (rdma_dmabuf::MultiChannel, Vec<QueuePair>) {
    let or_fail = |e: rdma_dmabuf::Error| -> ! { fail(&e.to_string()) };
    let hub = MultiChannelBuilder::new(pd, n)
        .gid_index(gid)
        .build()
        .unwrap_or_else(|e| or_fail(e));
    let peers: Vec<_> = (0..n)
        .map(|_| {
            QueuePairBuilder::new(pd)
                .gid_index(gid)
                .build()
                .unwrap_or_else(|e| or_fail(e))
        })
        .collect();
    let hub_eps = hub.endpoints();
    let peer_eps: Vec<_> = peers.iter().map(|p| p.endpoint()).collect();
    let hub = hub.connect(&peer_eps).unwrap_or_else(|e| or_fail(e));
    let peers = peers
        .into_iter()
        .zip(&hub_eps)
        .map(|(p, e)| p.connect(e).unwrap_or_else(|e| or_fail(e)))
        .collect();
    (hub, peers)
}

fn post_recvs<'q>(
    pd: &Arc<ProtectionDomain>,
    peers: &'q [QueuePair],
    len: u64,
) -> Vec<rdma_dmabuf::Pending<'q, HostBuffer>> {
    peers
        .iter()
        .map(|p| {
            p.post_recv(host_region(pd, len as usize, Access::LOCAL_WRITE))
                .unwrap_or_else(|e| fail(&e.to_string()))
        })
        .collect()
}

fn wait_all(pending: Vec<rdma_dmabuf::Pending<'_, HostBuffer>>, len: u64) -> Vec<Vec<u8>> {
    pending
        .into_iter()
        .map(|p| {
            let done = p.spin().unwrap_or_else(|e| fail(&e.to_string()));
            done.region.bytes().expect("local")[..len as usize].to_vec()
        })
        .collect()
}
