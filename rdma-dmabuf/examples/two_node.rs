//! The two-node recipe: node a serves a dma-buf region, node b writes it over rdma_cm, reads
//! it back, and says it is done; node a then deregisters and checks every byte.
//!
//! ```text
//! node a: cargo run -p rdma-dmabuf --example two_node -- server <a's RDMA address>
//! node b: cargo run -p rdma-dmabuf --example two_node -- client <a's RDMA address>
//! ```
//!
//! The steps a newcomer needs, each once:
//! * the remote region travels in the accept's private data (`RemoteRegion::to_bytes`);
//! * the client may start first: `connect_retrying` tries again while the server refuses or
//!   does not answer (`ErrorKind::Refused` / `Unreachable`), with the same protection domain;
//! * "I am done" is the client's disconnect (dropping its queue pair), which the server sees
//!   with `wait_disconnected` (`wait_disconnected_async` with tokio);
//! * the server deregisters (`into_inner`) before it reads: from then on no peer can change
//!   what it checks.
use drm_export::Udmabuf;
use rdma_dmabuf::{
    Access, CmConnector, CmListener, HostBuffer, Local, MemoryRegion, ProtectionDomain,
    QueuePairBuilder, RemoteRegion,
};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// The rdma_cm port both sides use.
const PORT: u16 = 18620;
/// Bytes moved: 1 MiB.
const LEN: usize = 1 << 20;
/// Each connection step's bound.
const STEP: Duration = Duration::from_secs(10);
/// How long the client retries a server that is not listening yet, and how long the server
/// waits for the client to finish.
const PATIENCE: Duration = Duration::from_secs(60);

/// The byte at `i` of what the client writes.
fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(31) >> 3) as u8
}

fn main() -> Res {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr = |s: Option<&String>| -> Res<SocketAddr> {
        let ip: IpAddr = s.ok_or("missing the server's address")?.parse()?;
        Ok(SocketAddr::new(ip, PORT))
    };
    match args.first().map(String::as_str) {
        Some("server") => server(addr(args.get(1))?),
        Some("client") => client(addr(args.get(1))?),
        _ => Err("usage: two_node server <bind address> | client <server address>".into()),
    }
}

fn server(bind: SocketAddr) -> Res {
    let listener = CmListener::bind(bind)?;
    let pd = ProtectionDomain::new(&listener.context()?)?;
    // A dma-buf (udmabuf here; a GPU buffer from drm-export registers the same way).
    let (_memfd, dmabuf) = Udmabuf::new(LEN as u64)?.into_parts();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let target = MemoryRegion::register_dmabuf(&pd, dmabuf, 0, LEN as u64, None, access)?;
    let announce = target
        .remote()
        .expect("remote access was asked for")
        .to_bytes();
    println!("listening on {bind}");
    let (qp, _) = listener.accept(QueuePairBuilder::new(&pd), &announce, PATIENCE)?;
    println!("accepted; waiting for the client to finish");
    // The client's disconnect is its "I am done": every write it made has landed.
    qp.wait_disconnected(PATIENCE)?;
    drop(qp);
    // Deregister first, then read through the dma-buf's mapping (copies, never a slice).
    let mut dmabuf = target.into_inner()?;
    let bytes = dmabuf.map()?.read()?.to_vec();
    match (0..LEN).find(|&i| bytes[i] != pattern(i)) {
        None => println!("RESULT side=server verified=yes bytes={LEN}"),
        Some(at) => return Err(format!("byte {at} differs from the pattern").into()),
    }
    Ok(())
}

fn client(server: SocketAddr) -> Res {
    let connector = CmConnector::resolve(server, STEP)?;
    let pd = ProtectionDomain::new(&connector.context()?)?;
    let mut buf = HostBuffer::new(LEN)?;
    for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
        *b = pattern(i);
    }
    let src = MemoryRegion::register(&pd, buf, Access::empty())?;
    let back = MemoryRegion::register(&pd, HostBuffer::new(LEN)?, Access::LOCAL_WRITE)?;
    // The server may not be listening yet: retry while it refuses or does not answer.
    let (qp, private) =
        connector.connect_retrying(QueuePairBuilder::new(&pd), &[], STEP, PATIENCE)?;
    let remote = RemoteRegion::from_bytes(&private)?;
    println!("connected to {server}; its region: {} bytes", remote.len);
    let len = LEN as u64;
    let _src = qp
        .post_write(Local::new(src, 0..len), remote, None)?
        .spin()?
        .region;
    let back = qp
        .post_read(Local::new(back, 0..len), remote)?
        .spin()?
        .region;
    let read = back.bytes()?;
    if let Some(at) = (0..LEN).find(|&i| read[i] != pattern(i)) {
        return Err(format!("byte {at} read back differs").into());
    }
    // Done: dropping the queue pair disconnects, which the server waits for.
    drop(qp);
    println!("RESULT side=client verified=yes bytes={LEN}");
    Ok(())
}
