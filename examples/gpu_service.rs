//! A tokio service moving GPU buffers between machines: one task per peer, many transfers in
//! flight at once, no thread per queue and no copy through host memory.
//!
//! The server accepts `--peers` rdma_cm connections (awaited, `accept_async`). For each it
//! allocates a GPU buffer (i915, xe, amdgpu, else vgem), registers its dma-buf for remote
//! writes, announces it in the accept's private data, and hands the queue pair to a task of
//! its own. The client connects `--peers` times at once (`connect_async`), one task per
//! connection: each fills a GPU buffer of its own with its pattern, splits the registration
//! into shards and RDMA-writes them with up to `--window` writes in flight, each awaited; the
//! last carries an immediate. The server's task then checks every byte through the dma-buf
//! mapping and answers with a verdict.
//!
//! The shape a service author copies: a current-thread runtime with a `LocalSet`, one
//! `spawn_local` task owning each queue pair (a `QueuePair` is `Send` but not `Sync`, and a
//! pending request borrows it, so its futures are not `Send`); queue pairs built with a
//! completion channel, which is what wakes the runtime; every wait bounded by `--timeout`. A
//! request whose future is dropped (a timeout) keeps its buffer with the queue pair until the
//! NIC is done with it.
//!
//! ```text
//! gpu_service server [--bind ADDR] [options]
//! gpu_service client SERVER_ADDR [options]
//! ```
//!
//! Exit status 0 when every peer's buffer was verified, 1 otherwise. The last line of each
//! side is machine-readable (`RESULT ...`).

use examples::gpu::{self, Where};
use examples::report::{bytes, line, rate};
use examples::{fail, host_region, net, pattern, Args};
use rdma_dmabuf::{
    Access, CmConnector, CmListener, DmaBuf, Error, MemoryRegion, ProtectionDomain,
    QueuePairBuilder, RemoteRegion, Shard,
};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

const USAGE: &str = "\
usage: gpu_service server [--bind ADDR] [options]
       gpu_service client SERVER_ADDR [options]

options (both sides):
  --peers N        connections served or made at once (default 4)
  --port N         rdma_cm port (default 18530)
  --size BYTES     GPU buffer per peer, e.g. 64K, 4M (default 4M)
  --drm PATH       DRM node to allocate on (default: the first GPU, else vgem)
  --timeout SECS   bound on every wait (default 60)
server:
  --bind ADDR      address to listen on (default: the RDMA device's IPv4 address)
client:
  --chunk BYTES    bytes per RDMA write (default 256K)
  --window N       writes in flight per peer (default 8)";

const OPTIONS: [&str; 8] = [
    "peers", "port", "size", "drm", "timeout", "bind", "chunk", "window",
];

/// The verdict message: `OK` or `BAD`, then the checked byte count.
const VERDICT_LEN: usize = 16;

fn main() {
    let args = Args::parse(USAGE, &OPTIONS);
    let role = args.words.first().cloned().unwrap_or_default();
    let cfg = Config {
        peers: args.get("peers", 4usize).max(1),
        port: args.get("port", 18530),
        size: args.size("size", 4 << 20),
        drm: args.text("drm"),
        timeout: Duration::from_secs(args.get("timeout", 60)),
    };
    if cfg.size == 0 {
        fail("--size must be at least one byte");
    }
    // One thread, one LocalSet: every queue pair lives in a local task.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(&format!("tokio runtime: {e}")));
    let local = tokio::task::LocalSet::new();
    let ok = match role.as_str() {
        "server" => local.block_on(&rt, server(&args, cfg)),
        "client" => local.block_on(&rt, client(&args, cfg)),
        _ => fail(&format!("the first word is server or client\n\n{USAGE}")),
    };
    if !ok {
        std::process::exit(1);
    }
}

#[derive(Clone)]
struct Config {
    peers: usize,
    port: u16,
    size: u64,
    drm: Option<String>,
    timeout: Duration,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

async fn server(args: &Args, cfg: Config) -> bool {
    println!("gpu_service server");
    let addr = net::listen_addr(args.text("bind"), None).unwrap_or_else(|e| fail(&e));
    let at = SocketAddr::new(addr, cfg.port);
    let listener = CmListener::bind(at).unwrap_or_else(|e| fail(&e.to_string()));
    let ctx = listener.context().unwrap_or_else(|e| fail(&e.to_string()));
    line(
        "RDMA device",
        format!("{}, listening on {at} for {} peers", ctx.name(), cfg.peers),
    );
    let pd = ProtectionDomain::new(&ctx).unwrap_or_else(|e| fail(&e.to_string()));
    let mut tasks = Vec::new();
    for peer in 0..cfg.peers {
        // The buffer first: the accept announces it.
        let (alloc, mut dmabuf) = gpu::allocate_or_exit(
            cfg.drm.as_deref(),
            cfg.size,
            Where::Auto,
            &format!("buffer {peer}"),
        );
        dmabuf
            .map()
            .and_then(|mut m| m.write().map(|mut w| w.fill(0)))
            .unwrap_or_else(|e| fail(&e.to_string()));
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let target = MemoryRegion::register_dmabuf(&pd, dmabuf, 0, cfg.size, None, rw)
            .unwrap_or_else(|e| fail(&e.to_string()));
        let announce = target.remote().expect("remotely writable").to_bytes();
        let builder = QueuePairBuilder::new(&pd).completion_channel(true);
        let (qp, hello) = listener
            .accept_async(builder, &announce, cfg.timeout)
            .await
            .unwrap_or_else(|e| fail(&e.to_string()));
        let seed = u64::from_le_bytes(
            hello
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .unwrap_or_else(|| fail("a connect request without a pattern seed")),
        );
        let (pd, cfg) = (pd.clone(), cfg.clone());
        // The task owns the queue pair, its buffer and its GPU allocation.
        tasks.push(tokio::task::spawn_local(async move {
            let r = serve_peer(&qp, &pd, target, seed, &cfg).await;
            let _ = tokio::time::timeout(cfg.timeout, async {
                // The client disconnects once it has the verdict.
                while qp.take_cm_events().ok().flatten().is_none() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await;
            drop(qp);
            drop(alloc);
            r
        }));
    }
    let mut verified = 0;
    for (peer, t) in tasks.into_iter().enumerate() {
        match t.await {
            Ok(Ok(n)) => {
                line(
                    &format!("peer {peer}"),
                    format!("all {n} bytes verified: PASSED"),
                );
                verified += 1;
            }
            Ok(Err(e)) => line(&format!("peer {peer}"), format!("FAILED: {e}")),
            Err(e) => line(&format!("peer {peer}"), format!("task failed: {e}")),
        }
    }
    let ok = verified == cfg.peers;
    println!(
        "RESULT server peers={} verified={} bytes={}",
        cfg.peers,
        if ok { "yes" } else { "no" },
        cfg.size * verified as u64
    );
    ok
}

/// One peer's transfer, server side: waits for the write with immediate, revokes the peer's
/// access, checks every byte through the mapping and sends the verdict.
async fn serve_peer(
    qp: &rdma_dmabuf::QueuePair,
    pd: &Arc<ProtectionDomain>,
    target: MemoryRegion<DmaBuf>,
    seed: u64,
    cfg: &Config,
) -> Result<u64, String> {
    let note = qp
        .post_recv(host_region(pd, VERDICT_LEN, Access::LOCAL_WRITE))
        .map_err(err)?;
    let got = tokio::time::timeout(cfg.timeout, note)
        .await
        .map_err(|_| "no write with immediate in time".to_string())?
        .map_err(err)?;
    if got.wc.imm.is_none() {
        return Err("the last write carried no immediate".into());
    }
    // Deregistering revokes the rkey: the peer can no longer change what is checked.
    let mut dmabuf = target.into_inner().map_err(err)?;
    let len = cfg.size as usize;
    let mismatch = dmabuf
        .map()
        .and_then(|m| {
            m.read()
                .map(|r| pattern::first_mismatch(&r.to_vec()[..len], seed))
        })
        .map_err(err)?;
    let mut verdict = [0u8; VERDICT_LEN];
    verdict[..3].copy_from_slice(if mismatch.is_none() { b"OK\0" } else { b"BAD" });
    verdict[8..].copy_from_slice(&(mismatch.unwrap_or(len) as u64).to_le_bytes());
    let mut msg = host_region(pd, VERDICT_LEN, Access::empty());
    msg.bytes_mut().map_err(err)?[..VERDICT_LEN].copy_from_slice(&verdict);
    let sent = qp.post_send(msg, None).map_err(err)?;
    tokio::time::timeout(cfg.timeout, sent)
        .await
        .map_err(|_| "the verdict was not acknowledged in time".to_string())?
        .map_err(err)?;
    match mismatch {
        None => Ok(cfg.size),
        Some(at) => Err(format!("byte {at} differs from the peer's pattern")),
    }
}

async fn client(args: &Args, cfg: Config) -> bool {
    println!("gpu_service client");
    let server = args
        .words
        .get(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| fail(&format!("client needs the server's IP address\n\n{USAGE}")));
    let at = SocketAddr::new(server, cfg.port);
    let chunk = args.size("chunk", 256 << 10).clamp(1, cfg.size);
    let window = args.get("window", 8usize).max(1);
    let start = Instant::now();
    let tasks: Vec<_> = (0..cfg.peers)
        .map(|peer| {
            let cfg = cfg.clone();
            tokio::task::spawn_local(async move { send_peer(at, peer, chunk, window, &cfg).await })
        })
        .collect();
    let mut verified = 0;
    let mut writes = 0;
    for (peer, t) in tasks.into_iter().enumerate() {
        match t.await {
            Ok(Ok(n)) => {
                line(
                    &format!("peer {peer}"),
                    format!(
                        "{} in {n} RDMA writes, server says verified: PASSED",
                        bytes(cfg.size)
                    ),
                );
                verified += 1;
                writes += n;
            }
            Ok(Err(e)) => line(&format!("peer {peer}"), format!("FAILED: {e}")),
            Err(e) => line(&format!("peer {peer}"), format!("task failed: {e}")),
        }
    }
    let total = cfg.size * verified as u64;
    let secs = start.elapsed().as_secs_f64();
    line(
        "moved",
        format!(
            "{} to {verified} peers at once, {}, up to {window} writes in flight each",
            bytes(total),
            rate(total, secs)
        ),
    );
    let ok = verified == cfg.peers;
    println!(
        "RESULT client peers={} verified={} bytes={total} writes={writes}",
        cfg.peers,
        if ok { "yes" } else { "no" }
    );
    ok
}

/// One peer's transfer, client side: connects, fills a GPU buffer with the peer's pattern,
/// writes it in shards with up to `window` writes in flight, and awaits the verdict. Returns
/// how many writes it took.
async fn send_peer(
    at: SocketAddr,
    peer: usize,
    chunk: u64,
    window: usize,
    cfg: &Config,
) -> Result<usize, String> {
    let seed = 0x5eed_0000 + peer as u64;
    // The server may not be listening yet: a refusal is retried until the timeout.
    let deadline = Instant::now() + cfg.timeout;
    let (qp, announce, pd, alloc, buf) = loop {
        let c = CmConnector::resolve_async(at, cfg.timeout)
            .await
            .map_err(err)?;
        let pd = ProtectionDomain::new(&c.context().map_err(err)?).map_err(err)?;
        let (alloc, mut buf) = gpu::allocate(cfg.drm.as_deref(), cfg.size, Where::Auto)?;
        let mut data = vec![0u8; cfg.size as usize];
        pattern::fill(&mut data, seed, 0);
        buf.map()
            .and_then(|mut m| m.write()?.write_at(0, &data))
            .map_err(err)?;
        let builder = QueuePairBuilder::new(&pd)
            .completion_channel(true)
            .send_depth(window as u32 + 1);
        match c
            .connect_async(builder, &seed.to_le_bytes(), cfg.timeout)
            .await
        {
            Ok((qp, announce)) => break (qp, announce, pd, alloc, buf),
            Err(e) if e.errno() == Some(libc::ECONNREFUSED) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => return Err(e.to_string()),
        }
    };
    let remote = RemoteRegion::from_bytes(&announce).map_err(err)?;
    let src =
        MemoryRegion::register_dmabuf(&pd, buf, 0, cfg.size, None, Access::empty()).map_err(err)?;
    let shards: Vec<Shard<DmaBuf>> = src.split_into_chunks(chunk).map_err(|e| e.to_string())?;
    let verdict = qp
        .post_recv(host_region(&pd, VERDICT_LEN, Access::LOCAL_WRITE))
        .map_err(err)?;
    let count = shards.len();
    let mut inflight = VecDeque::with_capacity(window);
    let mut offset = 0;
    for (i, shard) in shards.into_iter().enumerate() {
        if inflight.len() == window {
            let p: rdma_dmabuf::PartsPending<'_, Shard<DmaBuf>, 1> =
                inflight.pop_front().expect("a full window");
            finish(p, cfg.timeout).await?;
        }
        let len = shard.len();
        let to = remote.slice(offset, len).map_err(err)?;
        offset += len;
        // The last write tells the server that every byte has landed (RC writes complete in
        // order at the responder).
        let imm = (i + 1 == count).then_some(count as u32);
        inflight.push_back(qp.post_write_parts([shard], to, imm).map_err(err)?);
    }
    while let Some(p) = inflight.pop_front() {
        finish(p, cfg.timeout).await?;
    }
    let got = tokio::time::timeout(cfg.timeout, verdict)
        .await
        .map_err(|_| "no verdict in time".to_string())?
        .map_err(err)?;
    let ok = got.region.bytes().map_err(err)?.starts_with(b"OK");
    drop(inflight);
    drop(qp);
    drop(alloc);
    if ok {
        Ok(count)
    } else {
        Err("the server found a byte that differs".into())
    }
}

/// Awaits one write, at most `timeout`. On timeout the future is dropped: the shard stays
/// with the queue pair until the NIC is done with it.
async fn finish(
    p: rdma_dmabuf::PartsPending<'_, Shard<DmaBuf>, 1>,
    timeout: Duration,
) -> Result<(), String> {
    match tokio::time::timeout(timeout, p).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(Error::from(e).to_string()),
        Err(_) => Err(format!("a write still in flight after {timeout:?}")),
    }
}
