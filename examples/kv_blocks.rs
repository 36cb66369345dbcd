//! A KV-cache style transfer: one GPU buffer of fixed-size blocks, registered once, whose
//! blocks go to several readers, each reader getting every n-th block (scattered in the
//! source) packed contiguously on its side.
//!
//! It shows the verbs a tensor or KV-cache mover needs:
//! * the GPU buffer is split into one owned [`Shard`](rdma_dmabuf::Shard) per block, so many
//!   requests are in flight from one registration, from one thread per reader;
//! * each RDMA write gathers up to 4 scattered blocks (`post_write_parts`), and the last one
//!   carries an immediate that tells the reader its blocks are complete;
//! * the readers' connections all receive through one
//!   [`SharedReceiveQueue`](rdma_dmabuf::SharedReceiveQueue), whose completions say which
//!   connection finished;
//! * the shards are joined back into the region, which still holds the blocks unchanged.
//!
//! The readers are queue pairs of this same process on the same device, so the example runs
//! wherever one RDMA device is (a NIC, or soft-RoCE over its loopback).
//!
//! ```text
//! kv_blocks [--readers 3] [--blocks 48] [--block 16K] [--rdma DEV] [--drm PATH]
//! ```
//!
//! Exit status 0 when every reader holds exactly its blocks.

use examples::gpu::{self, Where};
use examples::report::{bytes, line};
use examples::{fail, host_region, net, pattern, Args};
use rdma_dmabuf::{
    Access, Context, MemoryRegion, ProtectionDomain, QueuePair, QueuePairBuilder, RemoteRegion,
    Shard, SharedReceiveQueue,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

const USAGE: &str = "\
usage: kv_blocks [--readers 3] [--blocks 48] [--block 16K] [--rdma DEV] [--drm PATH]

  --readers N    how many readers (default 3); block i goes to reader i % N
  --blocks N     blocks in the GPU buffer (default 48)
  --block BYTES  bytes per block (default 16K)
  --rdma DEV     the RDMA device (default: the first hardware device, else rxe/siw)
  --drm PATH     the DRM node for the GPU buffer (default: the first GPU, else vgem)";

/// Blocks gathered into one RDMA write.
const GATHER: usize = 4;
/// How long any one wait may take.
const LIMIT: Duration = Duration::from_secs(60);

fn main() {
    let args = Args::parse(USAGE, &["readers", "blocks", "block", "rdma", "drm"]);
    let readers: usize = args.get("readers", 3);
    let blocks: usize = args.get("blocks", 48);
    let block = args.size("block", 16 << 10);
    if readers == 0 || blocks < readers || block == 0 {
        fail("--readers must be at least 1, --blocks at least --readers, --block at least 1");
    }
    let or_fail = |e: rdma_dmabuf::Error| -> ! { fail(&e.to_string()) };
    println!("kv_blocks");
    let picked = net::pick(args.text("rdma").as_deref()).unwrap_or_else(|e| fail(&e));
    let ctx = Context::open(&picked.device).unwrap_or_else(|e| or_fail(e));
    let pd = ProtectionDomain::new(&ctx).unwrap_or_else(|e| or_fail(e));
    line("RDMA device", &picked.device);

    // The cache: one GPU buffer, filled through its mapping, registered once.
    let total = block * blocks as u64;
    let (_alloc, mut dmabuf) = gpu::allocate_or_exit(
        args.text("drm").as_deref(),
        total,
        Where::Auto,
        "GPU buffer",
    );
    let mut cache = vec![0u8; total as usize];
    pattern::fill(&mut cache, 0x6b76, 0);
    dmabuf
        .map()
        .and_then(|mut m| m.write()?.write_at(0, &cache))
        .unwrap_or_else(|e| fail(&e.to_string()));
    let region = MemoryRegion::register_dmabuf(&pd, dmabuf, 0, total, None, Access::empty())
        .unwrap_or_else(|e| or_fail(e));
    line("cache", format!("{blocks} blocks of {}", bytes(block)));

    // The readers: one connection each, all receiving through one shared receive queue.
    let srq = SharedReceiveQueue::new(&pd, readers as u32).unwrap_or_else(|e| or_fail(e));
    let (writers, readers_qps) = connect(&pd, &srq, readers, picked.gid_index);
    let mine = |r: usize| (r..blocks).step_by(readers).count() as u64 * block;
    let targets: Vec<_> = (0..readers)
        .map(|r| {
            let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
            host_region(&pd, mine(r) as usize, rw)
        })
        .collect();
    let notes: Vec<_> = (0..readers)
        .map(|_| {
            srq.post_recv(host_region(&pd, 64, Access::LOCAL_WRITE))
                .unwrap_or_else(|e| fail(&e.to_string()))
        })
        .collect();

    // One shard per block; reader r's shards go to its writer thread.
    let mut per_reader: Vec<Vec<Shard<_>>> = (0..readers).map(|_| Vec::new()).collect();
    let shards = region
        .split_into_chunks(block)
        .unwrap_or_else(|e| fail(&e.to_string()));
    for (i, s) in shards.into_iter().enumerate() {
        per_reader[i % readers].push(s);
    }
    let start = Instant::now();
    let back: Vec<Shard<_>> = std::thread::scope(|scope| {
        let threads: Vec<_> = writers
            .into_iter()
            .zip(per_reader)
            .zip(&targets)
            .enumerate()
            .map(|(r, ((qp, shards), target))| {
                let remote = target.remote().expect("remotely writable");
                scope.spawn(move || send_blocks(&qp, shards, remote, r as u32, block))
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().expect("writer thread"))
            .collect()
    });
    let elapsed = start.elapsed().as_secs_f64();

    // Each note says which connection's blocks are complete.
    let mut ok = true;
    let mut targets: Vec<_> = targets.into_iter().map(Some).collect();
    for note in notes {
        let done = note
            .spin_timeout(LIMIT)
            .unwrap_or_else(|_| fail("no completion note within 60 s"))
            .unwrap_or_else(|e| fail(&e.to_string()));
        let r = readers_qps
            .iter()
            .position(|q| q.endpoint().qpn == done.wc.qp_num)
            .unwrap_or_else(|| fail("a note from an unknown connection"));
        // The immediate names the reader too.
        ok &= done.wc.imm == Some(r as u32);
        // Deregistered first: from here no peer can write it while it is read.
        let got = targets[r]
            .take()
            .unwrap_or_else(|| fail("two notes from one connection"))
            .into_inner()
            .unwrap_or_else(|e| or_fail(e));
        let got = got.as_slice();
        let want: Vec<u8> = (r..blocks)
            .step_by(readers)
            .flat_map(|b| cache[b * block as usize..(b + 1) * block as usize].to_vec())
            .collect();
        let good = got[..want.len()] == want[..];
        line(
            &format!("reader {r}"),
            format!(
                "{} blocks via connection {:#x}: {}",
                want.len() as u64 / block,
                done.wc.qp_num,
                if good {
                    "every byte arrived"
                } else {
                    "MISMATCH"
                }
            ),
        );
        ok &= good;
    }
    line(
        "moved",
        format!(
            "{} in {:.3} s, {} blocks per write",
            bytes(total),
            elapsed,
            GATHER
        ),
    );

    // Every shard is home: the region comes back whole, its blocks unchanged.
    let region = Shard::join(back).unwrap_or_else(|e| fail(&e.to_string()));
    let mut buf = region.into_inner().unwrap_or_else(|e| or_fail(e));
    let mut now = vec![0u8; total as usize];
    buf.map()
        .and_then(|m| m.read()?.read_at(0, &mut now))
        .unwrap_or_else(|e| fail(&e.to_string()));
    let intact = now == cache;
    line(
        "joined",
        if intact {
            "the cache is unchanged"
        } else {
            "CHANGED"
        },
    );
    ok &= intact;
    println!(
        "RESULT kv_blocks readers={readers} blocks={blocks} block={block} ok={}",
        if ok { "yes" } else { "no" }
    );
    if !ok {
        std::process::exit(1);
    }
}

/// Writes reader `r`'s blocks packed into `remote`, GATHER at a time, all in flight at once;
/// the last write carries the immediate `r`. Returns the shards.
fn send_blocks<B: rdma_dmabuf::Backing>(
    qp: &QueuePair,
    shards: Vec<Shard<B>>,
    remote: RemoteRegion,
    r: u32,
    block: u64,
) -> Vec<Shard<B>> {
    let n = shards.len();
    let mut shards = shards.into_iter();
    let mut pending = Vec::new();
    let mut singles = Vec::new();
    let mut at = 0;
    let last_imm = |end: usize| (end == n).then_some(r);
    while n - at >= GATHER {
        let four: [Shard<B>; GATHER] = std::array::from_fn(|_| shards.next().expect("counted"));
        let to = remote
            .slice(at as u64 * block, GATHER as u64 * block)
            .expect("inside the reader's region");
        at += GATHER;
        match qp.post_write_parts(four, to, last_imm(at)) {
            Ok(p) => pending.push(p),
            Err(e) => fail(&e.error.to_string()),
        }
    }
    for s in shards {
        let to = remote
            .slice(at as u64 * block, block)
            .expect("inside the reader's region");
        at += 1;
        match qp.post_write_parts([s], to, last_imm(at)) {
            Ok(p) => singles.push(p),
            Err(e) => fail(&e.error.to_string()),
        }
    }
    let mut back = Vec::with_capacity(n);
    for p in pending {
        back.extend(finished(p.spin_timeout(LIMIT).ok()));
    }
    for p in singles {
        back.extend(finished(p.spin_timeout(LIMIT).ok()));
    }
    back
}

/// The parts of a finished write, or the end of the program.
fn finished<P, const N: usize>(outcome: Option<rdma_dmabuf::PartsOutcome<P, N>>) -> [P; N] {
    match outcome {
        Some(Ok(done)) => done.parts,
        Some(Err(e)) => fail(&e.error.to_string()),
        None => fail("a write never completed"),
    }
}

/// `n` writer queue pairs (gathering up to GATHER parts), each connected to a reader queue
/// pair that receives through `srq`.
fn connect(
    pd: &Arc<ProtectionDomain>,
    srq: &SharedReceiveQueue,
    n: usize,
    gid: u32,
) -> (Vec<QueuePair>, Vec<QueuePair>) {
    let or_fail = |e: rdma_dmabuf::Error| -> ! { fail(&e.to_string()) };
    let build = |b: QueuePairBuilder| b.gid_index(gid).build().unwrap_or_else(|e| or_fail(e));
    (0..n)
        .map(|_| {
            let w = build(QueuePairBuilder::new(pd).max_sge(GATHER as u32));
            let r = build(QueuePairBuilder::new(pd).srq(srq));
            let (we, re) = (w.endpoint(), r.endpoint());
            (
                w.connect(&re).unwrap_or_else(|e| or_fail(e)),
                r.connect(&we).unwrap_or_else(|e| or_fail(e)),
            )
        })
        .unzip()
}
