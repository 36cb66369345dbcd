//! Allocate a GPU buffer, export it as a dma-buf, and touch it from the CPU.
//! Runs as is in the testbed (vgem) and on a machine with i915 or amdgpu.
use drm_export::{drm_nodes, NodeKind};
use drm_export::{DrmDevice, GpuBuffer, Placement, Udmabuf};
use std::sync::Arc;

fn main() -> drm_export::Result<()> {
    // The first GPU the process may open: a render node of i915/amdgpu, else a card node
    // whose driver has dumb buffers (vgem in the testbed).
    let gpu = drm_nodes(NodeKind::Render)?
        .into_iter()
        .chain(drm_nodes(NodeKind::Card)?)
        .filter_map(|path| DrmDevice::open(path).ok())
        .map(Arc::new)
        .find_map(|dev| {
            Some((
                GpuBuffer::allocate(&dev, 1 << 20, Placement::System).ok()?,
                dev,
            ))
        });
    if let Some((buffer, dev)) = gpu {
        let mut dmabuf = buffer.export()?; // PRIME: GEM handle -> dma-buf fd
        let mut map = dmabuf.map()?;
        map.write()?.fill(0x5a); // DMA_BUF_SYNC_START .. END around the CPU's writes
        assert!(map.read()?.to_vec().iter().all(|&b| b == 0x5a)); // a copy, never a slice
        drop(map);
        println!(
            "{} bytes on {} ({}), exported by {:?}",
            dmabuf.size(),
            dev.path().display(),
            dev.driver().name,
            dmabuf.exporter()
        );
    }

    // Host memory as a dma-buf, for NICs and tests without a GPU.
    let mut host = Udmabuf::new(1 << 20)?;
    let mut map = host.dmabuf_mut().map()?;
    map.write()?.write_at(0, b"hello")?;
    let mut back = [0u8; 5];
    map.read()?.read_at(0, &mut back)?;
    assert_eq!(&back, b"hello");
    drop(map);
    println!("udmabuf: {} bytes", host.dmabuf().size());
    Ok(())
}
