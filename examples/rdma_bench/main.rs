//! RDMA write bandwidth, message rate and latency between two processes, in the manner of
//! perftest's `ib_write_bw` and `ib_write_lat`, and the time a registration takes, through
//! rdma-dmabuf's ownership-based posts, over regions of any kind: host memory or a dma-buf
//! (udmabuf, the system dma-heap, a GPU buffer).
//!
//! ```text
//! rdma_bench server [--bind ADDR] [--port 18700] [--mode bw|lat] [--region host] [--size 65536] [--iters 1000] [--device rxe0]
//! rdma_bench client SERVER_ADDR [same options]
//! rdma_bench reg [--region host] [--size 65536] [--iters 1000] [--hold-map yes|no] [--device rxe0]
//! rdma_bench cost [--series owned|scoped|awaited|batch|batch-basic] [--size 65536] [--iters 1000] [--device rxe0]
//! rdma_bench cache [--region udmabuf] [--iters 1000] [--device rxe0]
//! ```
//!
//! `regcache.rs` (`cache`): a fresh dma-buf registration against a cached one, per size.
//!
//! Each mode is a file: `bw.rs` (the client keeps `--window` writes in flight, each from its
//! own registered buffer, since a posted buffer belongs to the NIC until it completes), `lat.rs`
//! (a write-with-immediate ping-pong; the one-way latency is half the round trip) and `reg.rs`
//! (registration and deregistration of one region, no peer); `cost.rs` (one write at a time
//! between two queue pairs of this process, shaped for an instruction counter); `gather.rs` (`--mode gather`: as
//! bw, but each write gathers 16 blocks of `--size` bytes, the shards of one region, so that
//! it can be set beside 16 separate writes); `batch.rs` (`--mode batch`: as bw, 16 writes a
//! post, only the last signalled); `lat_poll.rs` (`--mode lat-poll`: the ping-pong learning
//! of each write by a sequence byte in the watched region, no receive). `--region` picks what backs every
//! region on this side (`host`, `udmabuf`, `heap`, `gpu`); `--inline yes` sends the latency
//! pings inline (copied at post time), `auto` up to 220 bytes, perftest's default for
//! `ib_write_lat` (on rxe perftest reports `Max inline data : 0[B]` and sends nothing inline,
//! so `cargo xtask bench` compares with `--inline no`). `--async yes` awaits every request on
//! a current-thread tokio runtime, woken through the queue pair's completion channel
//! (`waits.rs`), instead of busy-polling it. The hot paths allocate nothing: every
//! buffer and sample slot exists before the clock starts. The last line is machine-readable:
//! `RESULT key=value ...`.

mod batch;
mod bw;
mod cost;
mod gather;
mod lat;
mod lat_poll;
mod reg;
mod regcache;
mod waits;

use examples::kinds::{Allocator, RegionKind};
use examples::{fail, Args, SideChannel};
use rdma_dmabuf::Backing;
use rdma_dmabuf::{
    Access, Context, MemoryRegion, PreparedQp, ProtectionDomain, QueuePairBuilder, SpinPolicy,
};
use std::time::Duration;

const USAGE: &str = "\
usage: rdma_bench server [--bind ADDR] [--port 18700] [--mode bw|lat|gather|batch|lat-poll] [--region KIND]
                         [--size 65536] [--iters 1000] [--window 128] [--inline yes|no|auto]
                         [--async yes|no] [--busy-poll MICROS] [--spin shared|dedicated]
                         [--device rxe0]
       rdma_bench client SERVER_ADDR [the same options]
       rdma_bench reg [--region KIND] [--size 65536] [--iters 1000] [--hold-map yes|no] [--device rxe0]
       rdma_bench cost [--series owned|scoped|awaited|batch|batch-basic] [--size 65536] [--iters 1000] [--device rxe0]
       rdma_bench cache [--region KIND, not host] [--iters 1000] [--device rxe0]
KIND: host (default), udmabuf, heap (the system dma-heap) or gpu (vgem in the testbed)";

/// perftest's `ib_write_lat` asks for messages up to this size to be sent inline by default.
const PERFTEST_INLINE: usize = 220;

/// How a mode is run: the same on both sides.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    /// Bytes per message (and per region).
    pub size: usize,
    /// Messages (bw), round trips (lat) or registrations (reg).
    pub iters: usize,
    /// Writes kept in flight (bw).
    pub window: usize,
    /// Whether latency pings are sent inline.
    pub inline: bool,
    /// What backs the regions.
    pub kind: RegionKind,
    /// Whether requests are awaited on a tokio runtime rather than busy-polled.
    pub awaited: bool,
    /// `--busy-poll MICROS`: an awaited request's busy-poll budget (`QueuePair::set_busy_poll`;
    /// the library's default without it).
    pub busy_poll: Option<u64>,
    /// `--spin shared|dedicated`: what the queue pair's busy waits do between polls
    /// (`QueuePair::set_spin_policy`; shared, the library's default, without it).
    pub spin: SpinPolicy,
    /// `--hold-map yes` (reg): a CPU mapping of each dma-buf stays open while it is registered
    /// and deregistered, so the exporter's pages are held by someone else (`reg.rs`).
    pub hold_map: bool,
}

fn main() {
    let args = Args::parse(
        USAGE,
        &[
            "bind",
            "port",
            "mode",
            "size",
            "iters",
            "window",
            "inline",
            "device",
            "region",
            "async",
            "series",
            "busy-poll",
            "spin",
            "hold-map",
        ],
    );
    let role = args
        .words
        .first()
        .map(String::as_str)
        .unwrap_or_else(|| fail("usage: rdma_bench server|client ADDR|reg [--mode bw|lat]"));
    let device = args
        .text("device")
        .or_else(|| std::env::var("RDMA_DEVICE").ok())
        .unwrap_or_else(|| "rxe0".into());
    let size =
        usize::try_from(args.size("size", 65536)).unwrap_or_else(|_| fail("--size: too large"));
    let kind: RegionKind = args.get("region", RegionKind::Host);
    let inline = match args.text("inline").as_deref() {
        None | Some("no") => false,
        Some("yes") => true,
        Some("auto") => size <= PERFTEST_INLINE,
        Some(other) => fail(&format!("--inline is yes, no or auto, not {other:?}")),
    };
    let awaited = match args.text("async").as_deref() {
        None | Some("no") => false,
        Some("yes") => true,
        Some(other) => fail(&format!("--async is yes or no, not {other:?}")),
    };
    let run = Run {
        size,
        iters: args.get("iters", 1000),
        window: args.get("window", 128),
        inline,
        kind,
        awaited,
        busy_poll: args.text("busy-poll").map(|_| args.get("busy-poll", 0)),
        spin: match args.text("spin").as_deref() {
            None | Some("shared") => SpinPolicy::Shared,
            Some("dedicated") => SpinPolicy::Dedicated,
            Some(other) => fail(&format!("--spin is shared or dedicated, not {other:?}")),
        },
        hold_map: match args.text("hold-map").as_deref() {
            None | Some("no") => false,
            Some("yes") => true,
            Some(other) => fail(&format!("--hold-map is yes or no, not {other:?}")),
        },
    };
    if run.size == 0 || run.iters == 0 || run.window == 0 {
        fail("--size, --iters and --window must be at least 1");
    }
    let mode = args.text("mode").unwrap_or_else(|| "bw".into());
    if !matches!(
        mode.as_str(),
        "bw" | "lat" | "gather" | "batch" | "lat-poll"
    ) {
        fail("--mode is bw, lat, gather, batch or lat-poll");
    }
    // A gather write takes gather::PARTS blocks of --size bytes from one region.
    let gather = mode == "gather";
    let region_len = if gather {
        run.size * gather::PARTS
    } else {
        run.size
    };
    let client = match role {
        "server" => false,
        "client" => true,
        "reg" | "cost" | "cache" => false,
        _ => fail("the role is server, client, reg, cost or cache"),
    };

    let alloc = Allocator::new(kind).unwrap_or_else(|e| fail(&e));
    let ctx = Context::open(&device).unwrap_or_else(|e| fail(&e.to_string()));
    let pd = ProtectionDomain::new(&ctx).unwrap_or_else(|e| fail(&e.to_string()));
    if role == "reg" {
        return reg::run(&pd, &alloc, &run);
    }
    if role == "cache" {
        return regcache::run(&pd, &alloc, &run);
    }
    if role == "cost" {
        return cost::run(&pd, &run, args.get("series", cost::Series::Owned));
    }
    let qp = QueuePairBuilder::new(&pd)
        .send_depth(run.window as u32)
        .recv_depth(run.window as u32)
        .max_inline_data(if inline { run.size as u32 } else { 0 })
        .max_sge(if gather { gather::PARTS as u32 } else { 1 })
        .completion_channel(run.awaited)
        .build()
        .unwrap_or_else(|e| fail(&e.to_string()));
    let port: u16 = args.get("port", 18700);
    let side = if client {
        let server = args
            .words
            .get(1)
            .unwrap_or_else(|| fail("client needs the server's address"));
        SideChannel::connect(server, port, Duration::from_secs(30))
    } else {
        SideChannel::serve(&args.text("bind").unwrap_or_else(|| "0.0.0.0".into()), port)
    }
    .unwrap_or_else(|e| fail(&format!("side channel: {e}")));

    if kind == RegionKind::Host {
        connected(qp, side, &mode, client, &run, |a| {
            alloc
                .host_region(&pd, region_len, a)
                .unwrap_or_else(|e| fail(&e))
        });
    } else {
        connected(qp, side, &mode, client, &run, |a| {
            alloc
                .dmabuf_region(&pd, region_len, a)
                .unwrap_or_else(|e| fail(&e))
        });
    }
}

/// Swaps endpoints and target regions with the peer, connects, and runs `mode`; `region`
/// makes every region of this side.
fn connected<B: Backing>(
    qp: PreparedQp,
    mut side: SideChannel,
    mode: &str,
    client: bool,
    run: &Run,
    region: impl Fn(Access) -> MemoryRegion<B>,
) where
    MemoryRegion<B>: lat_poll::Watch,
{
    let target = region(Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (peer_ep, peer_region) = side
        .exchange(qp.endpoint(), target.remote())
        .unwrap_or_else(|e| fail(&e.to_string()));
    let remote = peer_region.unwrap_or_else(|| fail("the peer announced no region"));
    let qp = qp
        .connect(&peer_ep)
        .unwrap_or_else(|e| fail(&e.to_string()));
    if let Some(us) = run.busy_poll {
        qp.set_busy_poll(Duration::from_micros(us));
    }
    qp.set_spin_policy(run.spin);
    let kind = run.kind.name();
    match (mode, client) {
        ("bw" | "gather" | "batch", true) => {
            let r = match mode {
                "gather" => gather::client(&qp, remote, &region, run),
                "batch" => batch::client(&qp, remote, &region, run),
                _ => bw::client(&qp, remote, &region, run),
            };
            println!(
                " #bytes  #iterations  BW average[MB/sec]  MsgRate[Mpps]\n {:<7} {:<12} {:<19.2} {:.6}",
                run.size, run.iters, r.mbps, r.mpps
            );
            side.swap(b"done").ok();
            println!(
                "RESULT bw_MBps={:.3} mpps={:.6} region={kind} async={}",
                r.mbps,
                r.mpps,
                yes_no(run.awaited)
            );
        }
        ("bw" | "gather" | "batch", false) => {
            // The client writes into `target`; its "done" ends the test.
            side.swap(b"ready").ok();
        }
        _ => {
            let r = if mode == "lat-poll" {
                lat_poll::run(&qp, remote, &target, &region, run, client)
            } else {
                lat::run(&qp, remote, &region, run, client)
            };
            if let Some(r) = r {
                println!(
                    " #bytes  #iterations  t_typical[usec]  t_avg[usec]\n {:<7} {:<12} {:<16.2} {:.2}",
                    run.size, run.iters, r.typical_usec, r.avg_usec
                );
                println!(
                    "RESULT lat_usec={:.3} typ_usec={:.3} inline={} region={kind} async={}",
                    r.avg_usec,
                    r.typical_usec,
                    yes_no(run.inline),
                    yes_no(run.awaited)
                );
            }
            side.swap(b"done").ok();
        }
    }
    drop(target);
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}
