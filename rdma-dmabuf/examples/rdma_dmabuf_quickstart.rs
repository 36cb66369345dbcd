//! Register a dma-buf as a memory region and let a peer RDMA-write into it.
//! Runs as is in the testbed and on any RDMA device with dma-buf support (mlx5, patched rxe).
use drm_export::Udmabuf;
use rdma_dmabuf::{
    Access, Context, HostBuffer, Local, MemoryRegion, ProtectionDomain, QueuePairBuilder,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = std::env::var("RDMA_DEVICE").unwrap_or_else(|_| "rxe0".into());
    let ctx = Context::open(&device)?;
    let pd = ProtectionDomain::new(&ctx)?;

    // Two queue pairs on one device, connected to each other (in a real program the
    // endpoints travel over a socket, or rdma_cm does this: see CmConnector).
    let (a, b) = (
        QueuePairBuilder::new(&pd).build()?,
        QueuePairBuilder::new(&pd).build()?,
    );
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let (a, b) = (a.connect(&eb)?, b.connect(&ea)?);

    // The target: a dma-buf (here udmabuf; a GPU buffer from drm-export works the same).
    let (_memfd, dmabuf) = Udmabuf::new(1 << 20)?.into_parts();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let target = MemoryRegion::register_dmabuf(&pd, dmabuf, 0, 1 << 20, None, access)?;
    let remote = target.remote().expect("remotely writable");

    // The source: host memory. The region moves into the request and comes back with its
    // completion, so the CPU cannot touch it while the NIC reads it.
    let mut buf = HostBuffer::new(4096)?;
    buf.as_mut_slice()[..11].copy_from_slice(b"hello, GPU!");
    let src = MemoryRegion::register(&pd, buf, Access::empty())?;
    let done = a.post_write(Local::new(src, 0..11), remote, None)?.spin()?;
    let _src = done.region; // the CPU's again

    // Deregistering revokes the peer's access; then the CPU reads through the mapping.
    drop(b);
    let mut dmabuf = target.into_inner()?;
    let map = dmabuf.map()?;
    let mut bytes = [0u8; 11];
    map.read()?.read_at(0, &mut bytes)?; // a volatile copy: no slice over shared memory
    assert_eq!(&bytes, b"hello, GPU!");
    println!("{device}: 11 bytes RDMA-written into a dma-buf region and read back");
    Ok(())
}
