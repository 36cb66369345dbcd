//! The end-to-end probe: a small buffer from each source and placement, exported as a dma-buf
//! and registered (`ibv_reg_dmabuf_mr`) on each RDMA device. The result is the matrix
//! buffer source x placement x NIC.

use crate::drm::{Gpus, GEM_DRIVERS};
use crate::rdma::Nics;
use crate::{problems, Check, Registration, Status};
use drm_export::{DmaBuf, DmaHeap, GpuBuffer, Placement, Udmabuf};
use rdma_dmabuf::{Access, MemoryRegion};

/// A buffer that can be exported again for each NIC (a registration takes its dma-buf).
type Export<'a> = Box<dyn FnMut() -> Result<DmaBuf, String> + 'a>;

/// One buffer source: its name, node, placement, and a way to export it (or why it could not
/// be allocated).
struct Source<'a> {
    source: String,
    node: String,
    placement: String,
    export: Result<Export<'a>, String>,
}

fn gpu_sources<'a>(gpus: &'a Gpus, size: u64, keep: &'a mut Vec<GpuBuffer>) -> Vec<Source<'a>> {
    let mut out = Vec::new();
    let mut planned = Vec::new();
    for gpu in &gpus.gpus {
        let placements: &[(Option<Placement>, &str)] = if GEM_DRIVERS.contains(&gpu.driver.as_str())
        {
            &[
                (Some(Placement::System), "system"),
                (Some(Placement::Device), "device"),
            ]
        } else {
            &[(None, "dumb")]
        };
        for (placement, label) in placements {
            let alloc = GpuBuffer::allocate(&gpu.device, size, placement.unwrap_or_default());
            planned.push((gpu, *label, alloc.map_err(|e| e.to_string())));
        }
    }
    // The buffers must outlive the closures that export them: park them first.
    let mut slots = Vec::new();
    for (gpu, label, alloc) in planned {
        match alloc {
            Ok(b) => {
                keep.push(b);
                slots.push((gpu, label, Ok(keep.len() - 1)));
            }
            Err(e) => slots.push((gpu, label, Err(e))),
        }
    }
    let keep: &'a Vec<GpuBuffer> = keep;
    for (gpu, label, slot) in slots {
        out.push(Source {
            source: gpu.driver.clone(),
            node: gpu.device.path().display().to_string(),
            placement: label.to_string(),
            export: slot.map(|i| {
                let b = &keep[i];
                Box::new(move || b.export().map_err(|e| e.to_string())) as Export<'a>
            }),
        });
    }
    out
}

fn host_sources(size: u64) -> Vec<Source<'static>> {
    let udmabuf: Result<Export<'static>, String> = Udmabuf::new(size)
        .map(|u| {
            let (memfd, _) = u.into_parts();
            Box::new(move || Udmabuf::export(&memfd, 0, size).map_err(|e| e.to_string()))
                as Export<'static>
        })
        .map_err(|e| e.to_string());
    let heap: Result<Export<'static>, String> = DmaHeap::system()
        .map(|h| Box::new(move || h.allocate(size).map_err(|e| e.to_string())) as Export<'static>)
        .map_err(|e| e.to_string());
    vec![
        Source {
            source: "udmabuf".into(),
            node: "/dev/udmabuf".into(),
            placement: "host".into(),
            export: udmabuf,
        },
        Source {
            source: "dma-heap system".into(),
            node: "/dev/dma_heap/system".into(),
            placement: "host".into(),
            export: heap,
        },
    ]
}

#[cfg(feature = "cuda")]
fn cuda_sources(size: u64) -> Vec<Source<'static>> {
    use drm_export::cuda::{CudaBuffer, CudaDevice};
    if !std::path::Path::new("/sys/module/nvidia").exists() {
        return Vec::new();
    }
    let export = CudaDevice::open(0)
        .and_then(|d| CudaBuffer::new(&d, size as usize))
        .map(|b| Box::new(move || b.export().map_err(|e| e.to_string())) as Export<'static>)
        .map_err(|e| e.to_string());
    vec![Source {
        source: "cuda".into(),
        node: "CUDA device 0".into(),
        placement: "device".into(),
        export,
    }]
}

#[cfg(not(feature = "cuda"))]
fn cuda_sources(_size: u64) -> Vec<Source<'static>> {
    Vec::new()
}

/// Allocates, exports and registers; one [`Registration`] per buffer x NIC.
pub fn matrix(gpus: &Gpus, nics: &Nics, size: u64) -> Vec<Registration> {
    let mut keep = Vec::new();
    let mut sources = gpu_sources(gpus, size, &mut keep);
    sources.extend(host_sources(size));
    sources.extend(cuda_sources(size));
    let mut out = Vec::new();
    for s in &mut sources {
        for nic in &nics.nics {
            let row = |registered, detail| Registration {
                source: s.source.clone(),
                node: s.node.clone(),
                placement: s.placement.clone(),
                nic: nic.name.clone(),
                registered,
                detail,
            };
            let export = match &mut s.export {
                Ok(e) => e,
                Err(e) => {
                    out.push(row(false, format!("allocation failed: {e}")));
                    continue;
                }
            };
            let dmabuf = match export() {
                Ok(d) => d,
                Err(e) => {
                    out.push(row(false, format!("export failed: {e}")));
                    continue;
                }
            };
            let what = format!(
                "{} exported by {:?}",
                crate::pci::size_text(dmabuf.size()),
                dmabuf.exporter()
            );
            let len = dmabuf.size();
            let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
            out.push(
                match MemoryRegion::register_dmabuf(&nic.pd, dmabuf, 0, len, None, access) {
                    Ok(mr) => row(true, format!("{what}, registered (rkey {:#x})", mr.rkey())),
                    Err(e) => row(false, format!("{what}; ibv_reg_dmabuf_mr failed: {e}")),
                },
            );
        }
    }
    out
}

/// The probe's summary as a check.
pub fn summary(matrix: &[Registration], skipped: bool, nics: &Nics) -> Check {
    const SECTION: &str = "probe";
    if skipped {
        return Check::ok(SECTION, "end-to-end probe", "skipped (--no-probe)");
    }
    let ok = matrix.iter().filter(|r| r.registered).count();
    let found = format!("{ok} of {} dma-buf registrations succeeded", matrix.len());
    if ok > 0 {
        return Check::ok(SECTION, "end-to-end probe", found);
    }
    let problem = if nics.nics.is_empty() {
        &problems::NO_RDMA_DEVICE
    } else if nics.nics.iter().all(|n| !n.dmabuf) {
        &problems::PROVIDER_NO_DMABUF
    } else {
        &problems::NO_DRM_DEVICE
    };
    Check::problem(SECTION, "end-to-end probe", Status::Fail, found, problem)
}
