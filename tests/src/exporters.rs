//! The testbed's dma-buf exporters, for tests that run over each of them.

use drm_export::{DmaBuf, DmaHeap, DrmDevice, DumbBuffer, NodeKind, Udmabuf};
use std::sync::Arc;

/// A dma-buf exporter of the testbed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exporter {
    /// A vgem dumb buffer exported with PRIME (the stand-in GPU).
    Vgem,
    /// Host memory through `/dev/udmabuf`.
    Udmabuf,
    /// The system dma-heap.
    SystemHeap,
}

/// The vgem card node (dumb buffers need the card node).
///
/// # Panics
/// Without vgem: the testbed loads it.
pub fn vgem_card() -> Arc<DrmDevice> {
    Arc::new(DrmDevice::open_driver("vgem", NodeKind::Card).expect("vgem card node"))
}

/// All of them.
pub const ALL: [Exporter; 3] = [Exporter::Vgem, Exporter::Udmabuf, Exporter::SystemHeap];

impl Exporter {
    /// A zero-filled dma-buf of at least `size` bytes (exactly `size` where the exporter allows).
    ///
    /// # Panics
    /// If the exporter fails: the testbed must have it.
    pub fn allocate(self, size: u64) -> DmaBuf {
        match self {
            Exporter::Vgem => {
                let card = vgem_card();
                // The GEM object lives on through the dma-buf after the handle is closed.
                DumbBuffer::new(&card, size)
                    .expect("dumb buffer")
                    .export()
                    .expect("PRIME export")
            }
            Exporter::Udmabuf => Udmabuf::new(size).expect("udmabuf").into_parts().1,
            Exporter::SystemHeap => DmaHeap::system()
                .expect("system heap")
                .allocate(size)
                .expect("allocate"),
        }
    }

    /// Fills `buf[offset..]` with `data` through its CPU mapping (with sync guards).
    ///
    /// # Panics
    /// If the mapping fails.
    pub fn fill(buf: &mut DmaBuf, offset: usize, data: &[u8]) {
        let mut map = buf.map().expect("map");
        map.write()
            .expect("begin write")
            .write_at(offset, data)
            .expect("in range");
    }

    /// The buffer's bytes through its CPU mapping (with sync guards).
    ///
    /// # Panics
    /// If the mapping fails.
    pub fn read(buf: &mut DmaBuf) -> Vec<u8> {
        buf.map().expect("map").read().expect("begin read").to_vec()
    }
}
