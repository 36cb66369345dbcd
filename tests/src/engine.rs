//! Helpers of the transfer engine's tests: an agent's settings on the testbed's device,
//! host memory with given bytes, and a segment's bytes once unregistering has handed its
//! memory back.

use crate::exporters::Exporter;
use crate::testbed::Testbed;
use gpu_rdma_engine::{Memory, Settings};
use rdma_dmabuf::HostBuffer;

/// Settings of an agent on the testbed's device, listening on loopback, with `chunk`-byte
/// chunks.
pub fn loopback_settings(tb: &Testbed, chunk: u64) -> Settings {
    Settings {
        devices: Some(vec![tb.device.clone()]),
        bind: "127.0.0.1:0".parse().expect("an address"),
        chunk_size: chunk,
        ..Settings::default()
    }
}

/// `len` bytes of host memory starting with `data` (the rest zero).
pub fn host(data: &[u8], len: usize) -> HostBuffer {
    let mut h = HostBuffer::new(len).expect("host buffer");
    h.as_mut_slice()[..data.len()].copy_from_slice(data);
    h
}

/// The bytes of memory an unregistered segment handed back (a dma-buf read through its
/// mapping).
pub fn bytes(m: Memory) -> Vec<u8> {
    match m {
        Memory::Host(h) => h.as_slice().to_vec(),
        Memory::DmaBuf(mut d) => Exporter::read(&mut d),
        other => panic!("no bytes to read in {other:?}: read CUDA memory through the driver"),
    }
}
