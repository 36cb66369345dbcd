//! RDMA write bandwidth and latency between two processes, in the manner of perftest's
//! `ib_write_bw` and `ib_write_lat`, through rdma-dmabuf's ownership-based posts.
//!
//! ```text
//! rdma_bench server [--bind ADDR] [--port 18700] [--mode bw|lat] [--size 65536] [--iters 1000] [--device rxe0]
//! rdma_bench client SERVER_ADDR [same options]
//! ```
//!
//! bw: the client keeps `--window` (default 128, perftest's tx depth) writes in flight, each
//! from its own registered buffer (a posted buffer belongs to the NIC until it completes), and
//! reports MB/s (2^20 bytes) over all iterations. lat: a write-with-immediate ping-pong; the
//! one-way latency is half the average round trip. `--inline yes` sends the latency pings
//! inline (copied at post time, as perftest does for small messages; sizes up to what the
//! queue pair grants). The last line is machine-readable: `RESULT bw_MBps=...` or
//! `RESULT lat_usec=...`.

use examples::{fail, Args, SideChannel};

const USAGE: &str = "\
usage: rdma_bench server [--bind ADDR] [--port 18700] [--mode bw|lat] [--size 65536]
                         [--iters 1000] [--window 128] [--inline yes|no] [--device rxe0]
       rdma_bench client SERVER_ADDR [the same options]";
use rdma_dmabuf::{
    Access, Context, HostBuffer, Local, MemoryRegion, ProtectionDomain, QueuePairBuilder,
};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

fn main() {
    let args = Args::parse(
        USAGE,
        &[
            "bind", "port", "mode", "size", "iters", "window", "inline", "device",
        ],
    );
    let role = args
        .words
        .first()
        .map(String::as_str)
        .unwrap_or_else(|| fail("usage: rdma_bench server|client ADDR [--mode bw|lat]"));
    let device = args
        .text("device")
        .or_else(|| std::env::var("RDMA_DEVICE").ok())
        .unwrap_or_else(|| "rxe0".into());
    let port: u16 = args.get("port", 18700);
    let mode = args.text("mode").unwrap_or_else(|| "bw".into());
    let size: usize = args.get("size", 65536);
    let iters: usize = args.get("iters", 1000);
    let window: usize = args.get("window", 128);
    let inline = match args.text("inline").as_deref() {
        None | Some("no") => false,
        Some("yes") => true,
        Some(other) => fail(&format!("--inline is yes or no, not {other:?}")),
    };

    let ctx = Context::open(&device).unwrap_or_else(|e| fail(&e.to_string()));
    let pd = ProtectionDomain::new(&ctx).unwrap_or_else(|e| fail(&e.to_string()));
    let qp = QueuePairBuilder::new(&pd)
        .send_depth(window as u32)
        .recv_depth(window as u32)
        .max_inline_data(if inline {
            u32::try_from(size).unwrap_or(u32::MAX)
        } else {
            0
        })
        .build()
        .unwrap_or_else(|e| fail(&e.to_string()));
    let mut side = match role {
        "server" => {
            SideChannel::serve(&args.text("bind").unwrap_or_else(|| "0.0.0.0".into()), port)
        }
        "client" => {
            let server = args
                .words
                .get(1)
                .unwrap_or_else(|| fail("client needs the server's address"));
            SideChannel::connect(server, port, Duration::from_secs(30))
        }
        _ => fail("the role is server or client"),
    }
    .unwrap_or_else(|e| fail(&format!("side channel: {e}")));

    let region = |access| {
        MemoryRegion::register(
            &pd,
            HostBuffer::new(size).unwrap_or_else(|e| fail(&e.to_string())),
            access,
        )
        .unwrap_or_else(|e| fail(&e.to_string()))
    };
    let target = region(Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (peer_ep, peer_region) = side
        .exchange(qp.endpoint(), target.remote())
        .unwrap_or_else(|e| fail(&e.to_string()));
    let remote = peer_region.unwrap_or_else(|| fail("the peer announced no region"));
    let qp = qp
        .connect(&peer_ep)
        .unwrap_or_else(|e| fail(&e.to_string()));
    let len = size as u64;

    match (mode.as_str(), role) {
        ("bw", "client") => {
            let mut free: Vec<_> = (0..window.min(iters))
                .map(|_| region(Access::empty()))
                .collect();
            let mut inflight = VecDeque::with_capacity(window);
            let start = Instant::now();
            for _ in 0..iters {
                if free.is_empty() {
                    let p: rdma_dmabuf::Pending<'_, HostBuffer> =
                        inflight.pop_front().expect("window full");
                    free.push(p.wait().unwrap_or_else(|e| fail(&e.to_string())).region);
                }
                let src = free.pop().expect("a free buffer");
                inflight.push_back(
                    qp.post_write(Local::new(src, 0..len), remote, None)
                        .unwrap_or_else(|e| fail(&e.to_string())),
                );
            }
            for p in inflight {
                p.wait().unwrap_or_else(|e| fail(&e.to_string()));
            }
            let secs = start.elapsed().as_secs_f64();
            let mbps = (iters * size) as f64 / secs / (1 << 20) as f64;
            println!(" #bytes  #iterations  BW average[MB/sec]\n {size:<7} {iters:<12} {mbps:.2}");
            side.swap(b"done").ok();
            println!("RESULT bw_MBps={mbps:.3}");
        }
        ("bw", _) => {
            side.swap(b"ready").ok();
            drop(target);
        }
        ("lat", _) => {
            let mut recvs: VecDeque<_> = (0..2)
                .map(|_| {
                    qp.post_recv(region(Access::LOCAL_WRITE))
                        .unwrap_or_else(|e| fail(&e.to_string()))
                })
                .collect();
            let mut src = Some(region(Access::empty()));
            let client = role == "client";
            let payload = vec![0x5au8; size];
            let ping = |src: &mut Option<MemoryRegion<HostBuffer>>| {
                if inline {
                    qp.post_write_inline(&payload, remote, Some(1))
                        .and_then(|p| p.wait())
                        .unwrap_or_else(|e| fail(&e.to_string()));
                    return;
                }
                let p = qp
                    .post_write(
                        Local::new(src.take().expect("source"), 0..len),
                        remote,
                        Some(1),
                    )
                    .unwrap_or_else(|e| fail(&e.to_string()));
                *src = Some(p.wait().unwrap_or_else(|e| fail(&e.to_string())).region);
            };
            let start = Instant::now();
            for _ in 0..iters {
                if client {
                    ping(&mut src);
                }
                let r = recvs.pop_front().expect("a receive");
                let buf = r.wait().unwrap_or_else(|e| fail(&e.to_string())).region;
                recvs.push_back(qp.post_recv(buf).unwrap_or_else(|e| fail(&e.to_string())));
                if !client {
                    ping(&mut src);
                }
            }
            let usec = start.elapsed().as_secs_f64() * 1e6 / (2 * iters) as f64;
            if client {
                println!(" #bytes  #iterations  t_avg[usec]\n {size:<7} {iters:<12} {usec:.2}");
                println!("RESULT lat_usec={usec:.3}");
            }
            side.swap(b"done").ok();
            drop(recvs);
        }
        _ => fail("--mode is bw or lat"),
    }
}
