//! Finding a GPU and allocating an exportable buffer on it: i915, xe and amdgpu first (GEM on
//! the render node), then any other DRM driver with dumb buffers (vgem in the testbed).

use drm_export::{drm_nodes, NodeKind};
use drm_export::{DmaBuf, DrmDevice, GpuBuffer, Placement};
use std::fmt::Write as _;
use std::sync::Arc;

/// Drivers with a GEM allocator, in the order they are preferred.
const GPU_DRIVERS: [&str; 3] = ["i915", "xe", "amdgpu"];

/// Where the buffer should live: `auto` tries the GPU's own memory first, then system memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Where {
    /// Device memory if the driver has it, else system memory.
    Auto,
    /// Exactly this placement.
    Exactly(Placement),
}

impl std::str::FromStr for Where {
    type Err = String;
    fn from_str(s: &str) -> Result<Where, String> {
        match s {
            "auto" => Ok(Where::Auto),
            "system" => Ok(Where::Exactly(Placement::System)),
            "device" => Ok(Where::Exactly(Placement::Device)),
            _ => Err(format!("placement {s:?}: auto, system or device")),
        }
    }
}

/// A GPU buffer and its dma-buf export.
#[derive(Debug)]
pub struct GpuAlloc {
    /// The DRM node it was allocated on.
    pub device: Arc<DrmDevice>,
    /// The buffer (its GEM handle lives as long as this does).
    pub buffer: GpuBuffer,
    /// The placement asked of a GEM driver; `None` for dumb buffers, which have none.
    pub placement: Option<Placement>,
    /// The exported dma-buf's size in bytes.
    pub size: u64,
    /// The exported dma-buf's exporter (e.g. `vgem`, `i915`).
    pub exporter: String,
    /// Devices tried before this one, and why they were passed over.
    pub passed_over: Vec<String>,
}

impl GpuAlloc {
    /// One line: size, kind, node, driver, exporter.
    pub fn describe(&self) -> String {
        let kind = match (&self.buffer, self.placement) {
            (GpuBuffer::Dumb(_), _) => "dumb buffer".to_string(),
            (GpuBuffer::Gem(_), Some(Placement::Device)) => "GEM buffer in device memory".into(),
            (GpuBuffer::Gem(_), _) => "GEM buffer in system memory".into(),
        };
        format!(
            "{} {kind} on {} ({}), exported as dma-buf (exporter {:?})",
            crate::report::bytes(self.size),
            self.device.path().display(),
            self.device.driver().name,
            self.exporter
        )
    }
}

/// Allocates `size` bytes on `path` if given, else on the first device that works in the order
/// i915, xe, amdgpu, any other DRM driver (vgem last), and exports it: the allocation and its
/// dma-buf (the one handle to it that can be mapped).
///
/// # Errors
/// Every device tried and why it failed, with a hint when there is none at all.
pub fn allocate(path: Option<&str>, size: u64, place: Where) -> Result<(GpuAlloc, DmaBuf), String> {
    let candidates = match path {
        Some(p) => vec![DrmDevice::open(p).map_err(|e| e.to_string())?],
        None => candidates()?,
    };
    let mut passed_over = Vec::new();
    for dev in candidates {
        let dev = Arc::new(dev);
        match allocate_on(&dev, size, place) {
            Ok((buffer, placement, dmabuf)) => {
                let alloc = GpuAlloc {
                    device: dev,
                    buffer,
                    placement,
                    size: dmabuf.size(),
                    exporter: dmabuf.exporter().to_string(),
                    passed_over,
                };
                return Ok((alloc, dmabuf));
            }
            Err(e) => passed_over.push(format!(
                "{} ({}): {e}",
                dev.path().display(),
                dev.driver().name
            )),
        }
    }
    let mut msg = String::from("no DRM device could allocate and export the buffer");
    if passed_over.is_empty() {
        msg.push_str(
            ": /dev/dri has no usable node (load your GPU's driver, or `modprobe vgem` for a \
             software one, and check that you may open /dev/dri/*: groups video and render)",
        );
    }
    for p in &passed_over {
        let _ = write!(msg, "\n  {p}");
    }
    Err(msg)
}

/// DRM nodes to try, best first: the render node of each GEM driver, then every card node of
/// other drivers.
fn candidates() -> Result<Vec<DrmDevice>, String> {
    let open_all = |kind| -> Result<Vec<DrmDevice>, String> {
        Ok(drm_nodes(kind)
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter_map(|p| DrmDevice::open(p).ok())
            .collect())
    };
    let rank = |d: &DrmDevice| {
        GPU_DRIVERS
            .iter()
            .position(|g| *g == d.driver().name)
            .unwrap_or(GPU_DRIVERS.len() + usize::from(d.driver().name == "vgem"))
    };
    let mut out: Vec<DrmDevice> = open_all(NodeKind::Render)?
        .into_iter()
        .filter(|d| GPU_DRIVERS.contains(&d.driver().name.as_str()))
        .collect();
    out.extend(
        open_all(NodeKind::Card)?
            .into_iter()
            .filter(|d| !GPU_DRIVERS.contains(&d.driver().name.as_str())),
    );
    out.sort_by_key(|d| rank(d));
    Ok(out)
}

/// [`allocate`] for a program: prints the devices passed over and a `label` line describing
/// the buffer, exits with the error if there is none, and returns the buffer with its dma-buf
/// (for registration, which takes the dma-buf over).
pub fn allocate_or_exit(
    path: Option<&str>,
    size: u64,
    place: Where,
    label: &str,
) -> (GpuAlloc, DmaBuf) {
    let (alloc, dmabuf) = allocate(path, size, place).unwrap_or_else(|e| crate::fail(&e));
    for p in &alloc.passed_over {
        crate::report::line("passed over", p);
    }
    crate::report::line(label, alloc.describe());
    (alloc, dmabuf)
}

type Allocated = (GpuBuffer, Option<Placement>, DmaBuf);

fn allocate_on(dev: &Arc<DrmDevice>, size: u64, place: Where) -> Result<Allocated, String> {
    let gem = GPU_DRIVERS.contains(&dev.driver().name.as_str());
    let tries: &[Placement] = match place {
        Where::Exactly(Placement::System) => &[Placement::System],
        Where::Exactly(Placement::Device) => &[Placement::Device],
        Where::Auto => &[Placement::Device, Placement::System],
    };
    let mut last = String::new();
    for &p in tries {
        match GpuBuffer::allocate(dev, size, p) {
            Ok(b) => {
                let dmabuf = b.export().map_err(|e| e.to_string())?;
                return Ok((b, gem.then_some(p), dmabuf));
            }
            Err(e) => last = e.to_string(),
        }
        if !gem {
            break; // dumb buffers have no placement to retry with
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_parse() {
        assert_eq!("auto".parse::<Where>(), Ok(Where::Auto));
        assert_eq!(
            "device".parse::<Where>(),
            Ok(Where::Exactly(Placement::Device))
        );
        assert!("vram".parse::<Where>().is_err());
    }
}
