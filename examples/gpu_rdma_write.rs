//! GPU buffer to GPU buffer over RDMA, with no copy through host memory.
//!
//! Each side allocates a buffer on the GPU it finds (i915, xe, amdgpu; else any DRM driver with
//! dumb buffers, such as vgem), exports it as a dma-buf and registers that with
//! `ibv_reg_dmabuf_mr` on the RDMA device rdma_cm picks for the address (a ConnectX NIC, or
//! soft-RoCE). The client fills its buffer with a pattern and RDMA-writes it into the server's
//! buffer `--iters` times; the last write carries an immediate that tells the server the data
//! is complete. The server then revokes the peer's access (deregistration), reads its buffer
//! through the dma-buf mapping, checks every byte and sends the verdict back.
//!
//! ```text
//! gpu_rdma_write server [--bind ADDR] [options]
//! gpu_rdma_write client SERVER_ADDR [options]
//! ```
//!
//! Exit status 0 when the server verified every byte, 1 otherwise. The last line of each side
//! is machine-readable (`RESULT ...`).

use examples::gpu::{self, Where};
use examples::report::{access, bytes, line, rate, retries};
use examples::{fail, host_region, net, pattern, Args};
use rdma_dmabuf::{
    scope, Access, CmListener, MemoryRegion, ProtectionDomain, QueuePairBuilder, RemoteRegion,
};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

const USAGE: &str = "\
usage: gpu_rdma_write server [--bind ADDR] [options]
       gpu_rdma_write client SERVER_ADDR [options]

options (both sides):
  --port N         rdma_cm port (default 18515)
  --size BYTES     GPU buffer size, e.g. 4096, 64K, 16M (default 16M)
  --drm PATH       DRM node to allocate on (default: the first of i915, xe, amdgpu, then
                   any other driver with dumb buffers, e.g. vgem)
  --placement P    auto (device memory if the GPU has it), system or device (default auto)
  --timeout SECS   give up after this long without progress (default 60)
server:
  --bind ADDR      address to listen on (default: the IPv4 address of the RDMA device's
                   RoCEv2 GID; with --rdma, of that device)
  --rdma DEV       RDMA device to listen on when --bind is not given
client:
  --iters N        times the whole buffer is written (default 8)
  --chunk BYTES    bytes per RDMA write (default 8M, at most the buffer)
  --window N       writes in flight (default 16)
  --rdma DEV       fail unless the route to the server uses this RDMA device
  --seed N         the pattern's seed (default: from the clock)";

const OPTIONS: [&str; 11] = [
    "port",
    "size",
    "drm",
    "placement",
    "timeout",
    "bind",
    "rdma",
    "iters",
    "chunk",
    "window",
    "seed",
];

/// What the client tells the server in its connect request.
struct Plan {
    seed: u64,
    size: u64,
    iters: u32,
}

impl Plan {
    const LEN: usize = 3 + 8 + 8 + 4;

    fn to_bytes(&self) -> Vec<u8> {
        let mut b = b"GW\x01".to_vec();
        b.extend_from_slice(&self.seed.to_le_bytes());
        b.extend_from_slice(&self.size.to_le_bytes());
        b.extend_from_slice(&self.iters.to_le_bytes());
        b
    }

    fn from_bytes(b: &[u8]) -> Option<Plan> {
        if b.len() != Self::LEN || &b[..3] != b"GW\x01" {
            return None;
        }
        Some(Plan {
            seed: u64::from_le_bytes(b[3..11].try_into().ok()?),
            size: u64::from_le_bytes(b[11..19].try_into().ok()?),
            iters: u32::from_le_bytes(b[19..23].try_into().ok()?),
        })
    }
}

/// The server's verdict, sent back to the client.
const VERDICT_LEN: usize = 16;

fn main() {
    let args = Args::parse(USAGE, &OPTIONS);
    let role = args.words.first().map(String::as_str).unwrap_or("");
    let size = args.size("size", 16 << 20);
    let place: Where = args.get("placement", Where::Auto);
    let timeout = Duration::from_secs(args.get("timeout", 60));
    let port: u16 = args.get("port", 18515);
    if size == 0 {
        fail("--size must be at least one byte");
    }
    match role {
        "server" => server(&args, size, place, port, timeout),
        "client" => client(&args, size, place, port, timeout),
        _ => fail(&format!("the first word is server or client\n\n{USAGE}")),
    }
}

fn describe_mr<B: rdma_dmabuf::Backing>(mr: &MemoryRegion<B>, device: &str) -> String {
    format!(
        "dma-buf MR on {device}: {} at iova {:#x}, lkey {:#x}, rkey {:#x}, {}",
        bytes(mr.len()),
        mr.addr(),
        mr.lkey(),
        mr.rkey(),
        access(mr.access())
    )
}

fn server(args: &Args, size: u64, place: Where, port: u16, timeout: Duration) {
    println!("gpu_rdma_write server");
    let addr = net::listen_addr(args.text("bind"), args.text("rdma")).unwrap_or_else(|e| fail(&e));
    let (alloc, mut dmabuf) =
        gpu::allocate_or_exit(args.text("drm").as_deref(), size, place, "GPU buffer");
    dmabuf
        .map()
        .and_then(|mut m| m.write().map(|mut w| w.fill(0)))
        .unwrap_or_else(|e| fail(&e.to_string()));
    line(
        "cleared",
        "the buffer through its mapping, so stale bytes cannot pass",
    );

    let at = SocketAddr::new(addr, port);
    let listener = CmListener::bind(at).unwrap_or_else(|e| fail(&e.to_string()));
    let ctx = listener.context().unwrap_or_else(|e| fail(&e.to_string()));
    line(
        "RDMA device",
        format!("{}, listening on {at} (rdma_cm)", ctx.name()),
    );
    let pd = ProtectionDomain::new(&ctx).unwrap_or_else(|e| fail(&e.to_string()));
    let target = MemoryRegion::register_dmabuf(
        &pd,
        dmabuf,
        0,
        size,
        None,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    )
    .unwrap_or_else(|e| fail(&e.to_string()));
    line("registered", describe_mr(&target, ctx.name()));
    let announce = target.remote().expect("remotely writable").to_bytes();
    line("retries", retries(&QueuePairBuilder::new(&pd)));
    let (qp, hello) = listener
        .accept(QueuePairBuilder::new(&pd), &announce, timeout)
        .unwrap_or_else(|e| fail(&e.to_string()));
    let plan = Plan::from_bytes(&hello)
        .unwrap_or_else(|| fail("the client's connect request is not a gpu_rdma_write plan"));
    line(
        "connected",
        format!(
            "the client will write {} {} times (pattern seed {:#x})",
            bytes(plan.size),
            plan.iters,
            plan.seed
        ),
    );
    let note = host_region(&pd, VERDICT_LEN, Access::LOCAL_WRITE);
    let start = Instant::now();
    let got = qp
        .post_recv(note)
        .unwrap_or_else(|e| fail(&e.to_string()))
        .spin_timeout(timeout)
        .unwrap_or_else(|_| fail("no write with immediate arrived in time"))
        .unwrap_or_else(|e| fail(&e.to_string()));
    if got.wc.imm != Some(plan.iters) {
        fail(&format!(
            "the last write's immediate is {:?}, expected {}",
            got.wc.imm, plan.iters
        ));
    }
    line(
        "received",
        format!(
            "the last write's immediate ({}) after {:.2} s: every write has landed",
            plan.iters,
            start.elapsed().as_secs_f64()
        ),
    );

    // Deregistering revokes the rkey: from here the peer cannot change what we check.
    let mut dmabuf = target.into_inner().unwrap_or_else(|e| fail(&e.to_string()));
    let checked = plan.size.min(size) as usize;
    // A copy out of the mapping (volatile reads): the dma-buf is shared memory, never a slice.
    let mismatch = dmabuf
        .map()
        .and_then(|m| {
            m.read()
                .map(|r| pattern::first_mismatch(&r.to_vec()[..checked], plan.seed))
        })
        .unwrap_or_else(|e| fail(&e.to_string()));
    let mut verdict = [0u8; VERDICT_LEN];
    match mismatch {
        None => {
            verdict[..2].copy_from_slice(b"OK");
            line(
                "verified",
                format!(
                    "all {checked} bytes match the client's pattern, read back through the \
                     dma-buf mapping: PASSED"
                ),
            );
        }
        Some(at) => {
            verdict[..3].copy_from_slice(b"BAD");
            line(
                "verified",
                format!("byte {at} differs from the pattern: FAILED"),
            );
        }
    }
    verdict[8..].copy_from_slice(&(mismatch.unwrap_or(checked) as u64).to_le_bytes());
    let mut msg = host_region(&pd, VERDICT_LEN, Access::empty());
    msg.bytes_mut().expect("local")[..VERDICT_LEN].copy_from_slice(&verdict);
    qp.post_send(msg, None)
        .unwrap_or_else(|e| fail(&e.to_string()))
        .spin()
        .unwrap_or_else(|e| fail(&e.to_string()));
    let _ = qp.wait_disconnected(timeout);
    drop(alloc);
    println!(
        "RESULT server verified={} bytes={checked}",
        if mismatch.is_none() { "yes" } else { "no" }
    );
    if mismatch.is_some() {
        std::process::exit(1);
    }
}

fn client(args: &Args, size: u64, place: Where, port: u16, timeout: Duration) {
    println!("gpu_rdma_write client");
    let server = args
        .words
        .get(1)
        .unwrap_or_else(|| fail("the client needs the server's address"));
    let server: SocketAddr = SocketAddr::new(
        server
            .parse()
            .unwrap_or_else(|_| fail(&format!("{server:?} is not an IP address"))),
        port,
    );
    let iters: u32 = args.get("iters", 8);
    let chunk = args.size("chunk", 8 << 20).clamp(1, size);
    let window: u32 = args.get("window", 16).max(1);
    let seed = args.get(
        "seed",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x6770, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()) << 32,
    );
    if iters == 0 {
        fail("--iters must be at least 1");
    }

    let (alloc, mut dmabuf) =
        gpu::allocate_or_exit(args.text("drm").as_deref(), size, place, "GPU buffer");
    let mut data = vec![0u8; size as usize];
    pattern::fill(&mut data, seed, 0);
    dmabuf
        .map()
        .and_then(|mut m| m.write()?.write_at(0, &data))
        .unwrap_or_else(|e| fail(&e.to_string()));
    line(
        "filled",
        format!(
            "{} with the pattern (seed {seed:#x}) through the mapping",
            bytes(size)
        ),
    );

    let pd: Arc<ProtectionDomain> =
        net::pd_towards(server, timeout).unwrap_or_else(|e| fail(&e.to_string()));
    let device = pd.context().name().to_string();
    if let Some(want) = args.text("rdma") {
        if want != device {
            fail(&format!(
                "the route to {server} goes through {device}, not --rdma {want}: use an \
                 address reached through {want}"
            ));
        }
    }
    line(
        "RDMA device",
        format!("{device} (rdma_cm's route to {server})"),
    );
    let src = MemoryRegion::register_dmabuf(&pd, dmabuf, 0, size, None, Access::empty())
        .unwrap_or_else(|e| fail(&e.to_string()));
    line("registered", describe_mr(&src, &device));
    let plan = Plan { seed, size, iters };
    line("retries", retries(&QueuePairBuilder::new(&pd)));
    let (qp, reply) = net::connect(
        server,
        || QueuePairBuilder::new(&pd).send_depth(window),
        &plan.to_bytes(),
        timeout,
    )
    .unwrap_or_else(|e| fail(&e.to_string()));
    let remote = RemoteRegion::from_bytes(&reply).unwrap_or_else(|e| fail(&e.to_string()));
    if remote.len < size {
        fail(&format!(
            "the server's buffer has {} bytes, fewer than --size {size}: give both sides the \
             same --size",
            remote.len
        ));
    }
    line(
        "connected",
        format!(
            "server buffer: {} at iova {:#x}, rkey {:#x}",
            bytes(remote.len),
            remote.addr,
            remote.rkey
        ),
    );
    let verdict = qp
        .post_recv(host_region(&pd, VERDICT_LEN, Access::LOCAL_WRITE))
        .unwrap_or_else(|e| fail(&e.to_string()));

    let per_pass = size.div_ceil(chunk);
    let writes = per_pass * u64::from(iters);
    let start = Instant::now();
    let moved: rdma_dmabuf::Result<u64> = scope(|s| {
        let mut inflight = VecDeque::with_capacity(window as usize);
        let mut moved = 0;
        for w in 0..writes {
            if inflight.len() == window as usize {
                let p: rdma_dmabuf::ScopedPending<'_, '_> =
                    inflight.pop_front().expect("a full window");
                moved += u64::from(p.spin()?.byte_len);
            }
            let off = (w % per_pass) * chunk;
            let len = chunk.min(size - off);
            let imm = (w + 1 == writes).then_some(iters);
            inflight.push_back(s.write(
                &qp,
                src.part(off..off + len),
                remote.slice(off, len)?,
                imm,
            )?);
        }
        for p in inflight {
            moved += u64::from(p.spin()?.byte_len);
        }
        Ok(moved)
    });
    let secs = start.elapsed().as_secs_f64();
    let moved = moved.unwrap_or_else(|e| fail(&e.to_string()));
    line(
        "wrote",
        format!(
            "{} in {writes} RDMA writes ({iters} x {}, {} per write, up to {window} in flight)",
            bytes(moved),
            bytes(size),
            bytes(chunk)
        ),
    );
    line(
        "throughput",
        format!("{} over {secs:.3} s", rate(moved, secs)),
    );
    let got = verdict
        .spin_timeout(timeout)
        .unwrap_or_else(|_| fail("the server sent no verdict in time"))
        .unwrap_or_else(|e| fail(&e.to_string()));
    let v = got.region.bytes().expect("local");
    let n = u64::from_le_bytes(v[8..16].try_into().expect("8 bytes"));
    let ok = &v[..2] == b"OK";
    if ok {
        line("server says", format!("all {n} bytes verified: PASSED"));
    } else {
        line("server says", format!("byte {n} differs: FAILED"));
    }
    drop(qp);
    drop(src);
    drop(alloc);
    println!(
        "RESULT client verified={} bytes={moved} secs={secs:.3} MiBps={:.1}",
        if ok { "yes" } else { "no" },
        moved as f64 / secs.max(1e-9) / f64::from(1 << 20)
    );
    if !ok {
        std::process::exit(1);
    }
}
