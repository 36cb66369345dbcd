//! Finding the RDMA device and address to use, and rdma_cm connections that survive a server
//! that is still starting.

use rdma_dmabuf::devices;
use rdma_dmabuf::{CmConnector, Context, ProtectionDomain, QueuePair, QueuePairBuilder};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Software providers, used only when no hardware device is present.
const SOFTWARE: [&str; 2] = ["rxe", "siw"];

/// An RDMA device and the IPv4 address of its port's netdev (from its RoCEv2 GID).
#[derive(Debug)]
pub struct Picked {
    /// The device's name (`mlx5_0`, `rxe0`, ...).
    pub device: String,
    /// The address rdma_cm binds to so that it uses this device.
    pub addr: IpAddr,
    /// The RoCEv2 GID's index.
    pub gid_index: u32,
}

/// The device called `name`, or else the first hardware device (mlx5 and the like), or else a
/// software one (rxe, siw); each with the IPv4 address of port 1's RoCEv2 GID.
///
/// # Errors
/// No device, or none with a RoCEv2 IPv4 GID (the message says what to do).
pub fn pick(name: Option<&str>) -> Result<Picked, String> {
    let mut names: Vec<String> = devices()
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|d| d.name)
        .filter(|n| name.is_none_or(|want| want == n))
        .collect();
    names.sort_by_key(|n| SOFTWARE.iter().any(|s| n.starts_with(s)));
    if names.is_empty() {
        return Err(match name {
            Some(n) => format!("no RDMA device called {n} (see `rdma link show`)"),
            None => "no RDMA device (load your NIC's driver, e.g. mlx5_ib, or add a soft-RoCE \
                     device: `rdma link add rxe0 type rxe netdev eth0`)"
                .into(),
        });
    }
    let mut why = Vec::new();
    for n in names {
        let found = Context::open(&n).and_then(|ctx| ctx.roce_v2_ipv4_gid(1));
        match found {
            Ok((gid_index, gid)) => {
                if let Some(ip) = gid.ipv4() {
                    return Ok(Picked {
                        device: n,
                        addr: IpAddr::V4(ip),
                        gid_index,
                    });
                }
            }
            Err(e) => why.push(format!("{n}: {e}")),
        }
    }
    Err(format!(
        "no RDMA device with a RoCEv2 IPv4 address ({}); on InfiniBand pass the IPoIB \
         address with --bind",
        why.join("; ")
    ))
}

/// Where a server listens: `bind` if given (an IP address), else the address of the RDMA device
/// called `rdma` (or of the first one, as [`pick`] chooses).
///
/// # Errors
/// `bind` is not an IP address, or [`pick`]'s errors.
pub fn listen_addr(bind: Option<String>, rdma: Option<String>) -> Result<IpAddr, String> {
    match bind {
        Some(a) => a
            .parse()
            .map_err(|_| format!("--bind {a:?} is not an IP address")),
        None => pick(rdma.as_deref()).map(|p| p.addr),
    }
}

/// A protection domain on the device rdma_cm routes `peer` through (its context names the
/// device).
///
/// # Errors
/// Address or route resolution failed (no route to `peer` over an RDMA device).
pub fn pd_towards(peer: SocketAddr, wait: Duration) -> rdma_dmabuf::Result<Arc<ProtectionDomain>> {
    let c = CmConnector::resolve(peer, wait)?;
    let ctx = c.context()?;
    ProtectionDomain::new(&ctx)
}

/// Connects to `peer` with queue pairs from `builder`, retrying while the server refuses
/// (it may not listen yet) for up to `wait`. Returns the queue pair and the server's reply.
///
/// # Errors
/// The last connection error.
pub fn connect(
    peer: SocketAddr,
    builder: impl Fn() -> QueuePairBuilder,
    private: &[u8],
    wait: Duration,
) -> rdma_dmabuf::Result<(QueuePair, Vec<u8>)> {
    let deadline = Instant::now() + wait;
    loop {
        let c = CmConnector::resolve(peer, wait)?;
        match c.connect(builder(), private, wait) {
            Err(e) if e.errno() == Some(libc::ECONNREFUSED) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200))
            }
            other => return other,
        }
    }
}
