//! The machine as a whole: kernel version and modules, rdma-core and which libibverbs this
//! process loaded, NVIDIA's kernel modules, the pinned-memory limit, udmabuf and dma-heaps.

use crate::{problems, Check, Status};
use std::path::Path;

/// `(major, minor)` of a kernel release such as `6.12.38+deb12-amd64`.
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release
        .split(|c: char| !c.is_ascii_digit())
        .map(str::parse::<u32>);
    Some((it.next()?.ok()?, it.next()?.ok()?))
}

/// The kernel release, and `ib_uverbs` and `rdma_ucm`.
pub fn kernel_checks() -> Vec<Check> {
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut out = vec![match kernel_version(&release) {
        Some(v) if v >= (5, 12) => Check::ok(
            "kernel",
            "kernel version",
            format!("{release}: has the uverbs dma-buf method UVERBS_METHOD_REG_DMABUF_MR (5.12+)"),
        ),
        _ => Check::problem(
            "kernel",
            "kernel version",
            Status::Fail,
            format!("{release}: older than 5.12, no uverbs dma-buf method (UVERBS_METHOD_REG_DMABUF_MR)"),
            &problems::KERNEL_TOO_OLD,
        ),
    }];
    for (module, status) in [("ib_uverbs", Status::Fail), ("rdma_ucm", Status::Warn)] {
        let seen = module_evidence(module)
            .iter()
            .map(|p| format!("/{p}"))
            .collect::<Vec<_>>()
            .join(", no ");
        out.push(if module_present(Path::new("/"), module) {
            Check::ok("kernel", module, "loaded")
        } else {
            Check::problem(
                "kernel",
                module,
                status,
                format!("not loaded (no /sys/module/{module}, no {seen})"),
                &problems::UVERBS_MISSING,
            )
        });
    }
    out
}

/// Whether `module` (`ib_uverbs` or `rdma_ucm`) is in the kernel under `root` (`/`, or a
/// captured tree in tests). A module built into the kernel has no `/sys/module` entry unless
/// it has parameters: ib_uverbs is known by the class it registers, there even without an
/// RDMA device (when no uverbs0 exists); rdma_ucm by its device node.
pub fn module_present(root: &Path, module: &str) -> bool {
    root.join("sys/module").join(module).exists()
        || module_evidence(module)
            .iter()
            .any(|p| root.join(p).exists())
}

/// What shows that `module` is in the kernel besides its `/sys/module` entry, relative to `/`.
fn module_evidence(module: &str) -> &'static [&'static str] {
    match module {
        "ib_uverbs" => &[
            "sys/class/infiniband_verbs/abi_version",
            "dev/infiniband/uverbs0",
        ],
        "rdma_ucm" => &["dev/infiniband/rdma_cm"],
        _ => &[],
    }
}

/// The libraries of this process whose file name contains `needle`, from `/proc/self/maps`.
pub fn loaded_libraries(maps: &str, needle: &str) -> Vec<String> {
    let mut v: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| {
            Path::new(p)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains(needle))
        })
        .map(str::to_string)
        .collect();
    v.sort();
    v.dedup();
    v
}

/// How a libibverbs other than the system's got in: listed in `/etc/ld.so.preload` (as the
/// testbed's patched stack is, `preload` the file's text), in `LD_PRELOAD`, else found through
/// `LD_LIBRARY_PATH` (its value shown).
fn how_loaded(preload: &str, ld_preload: &str, library_path: &str) -> String {
    if preload.contains("libibverbs") {
        "a build loaded first through /etc/ld.so.preload (LD_LIBRARY_PATH cannot replace it)".into()
    } else if ld_preload.contains("libibverbs") {
        format!("a build loaded first through LD_PRELOAD ({ld_preload})")
    } else {
        format!("a build found through LD_LIBRARY_PATH ({library_path})")
    }
}

/// rdma-core's version from libibverbs' file name: `libibverbs.so.1.<abi>.<rdma-core>.0`.
pub fn rdma_core_version(path: &str) -> Option<u32> {
    let name = Path::new(path).file_name()?.to_str()?;
    let rest = name.strip_prefix("libibverbs.so.1.")?;
    rest.split('.').nth(1)?.parse().ok()
}

/// Which libibverbs this process loaded, rdma-core's version, and the providers loaded so far
/// (call it after the RDMA devices were listed, which loads them).
pub fn rdma_core_checks() -> Vec<Check> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let verbs = loaded_libraries(&maps, "libibverbs.so");
    let mut out = Vec::new();
    let Some(lib) = verbs.first() else {
        out.push(Check::problem(
            "rdma-core",
            "libibverbs",
            Status::Fail,
            "not in /proc/self/maps",
            &problems::PROVIDER_NO_DMABUF,
        ));
        return out;
    };
    let system = ["/usr/lib", "/lib", "/usr/lib64", "/lib64"]
        .iter()
        .any(|d| lib.starts_with(d));
    let from = if system {
        "the system's".to_string()
    } else {
        let preload = std::fs::read_to_string("/etc/ld.so.preload").unwrap_or_default();
        let env = |k: &str| std::env::var(k).unwrap_or_default();
        format!(
            "not the system's: {}",
            how_loaded(&preload, &env("LD_PRELOAD"), &env("LD_LIBRARY_PATH"))
        )
    };
    out.push(Check::ok(
        "rdma-core",
        "libibverbs",
        format!("{lib} ({from})"),
    ));
    out.push(match rdma_core_version(lib) {
        Some(v) if v >= 34 => Check::ok(
            "rdma-core",
            "rdma-core version",
            format!("v{v} (ibv_reg_dmabuf_mr needs v34+)"),
        ),
        Some(v) => Check::problem(
            "rdma-core",
            "rdma-core version",
            Status::Fail,
            format!("v{v}: older than v34, no ibv_reg_dmabuf_mr"),
            &problems::PROVIDER_NO_DMABUF,
        ),
        None => Check::ok(
            "rdma-core",
            "rdma-core version",
            "unknown (libibverbs' file name carries none); it has ibv_reg_dmabuf_mr, or this \
             program would not have loaded",
        ),
    });
    let providers = loaded_libraries(&maps, "-rdmav");
    out.push(Check::ok(
        "rdma-core",
        "providers loaded",
        if providers.is_empty() {
            "none".to_string()
        } else {
            providers.join(", ")
        },
    ));
    out
}

/// NVIDIA: open or proprietary kernel module, `nvidia_peermem`, and (feature `cuda`) CUDA's
/// `DMA_BUF_SUPPORTED` per device.
pub fn nvidia_checks() -> Vec<Check> {
    if !Path::new("/sys/module/nvidia").exists() {
        return vec![Check::ok(
            "nvidia",
            "nvidia",
            "no NVIDIA kernel module loaded",
        )];
    }
    let version = std::fs::read_to_string("/proc/driver/nvidia/version").unwrap_or_default();
    let first = version.lines().next().unwrap_or("").trim().to_string();
    let mut out = vec![if version.contains("Open Kernel Module") {
        Check::ok("nvidia", "nvidia kernel module", format!("open: {first}"))
    } else {
        Check::problem(
            "nvidia",
            "nvidia kernel module",
            Status::Warn,
            format!("proprietary: {first}"),
            &problems::NVIDIA_PROPRIETARY,
        )
    }];
    out.push(if Path::new("/sys/module/nvidia_peermem").exists() {
        Check::ok(
            "nvidia",
            "nvidia_peermem",
            "loaded (dma-buf does not need it)",
        )
    } else {
        Check::ok(
            "nvidia",
            "nvidia_peermem",
            format!(
                "not loaded: dma-buf does not need it; {}",
                problems::NVIDIA_PEERMEM.fix
            ),
        )
    });
    out.extend(cuda_checks());
    out
}

#[cfg(feature = "cuda")]
fn cuda_checks() -> Vec<Check> {
    use drm_export::cuda::CudaDevice;
    let mut out = Vec::new();
    for ordinal in 0..16 {
        let name = format!("CUDA device {ordinal}");
        match CudaDevice::open(ordinal) {
            Ok(_) => out.push(Check::ok(
                "nvidia",
                name,
                "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 1",
            )),
            Err(e @ drm_export::Error::Unsupported { .. }) => {
                out.push(Check::problem(
                    "nvidia",
                    name,
                    Status::Warn,
                    e.to_string(),
                    &problems::NVIDIA_PROPRIETARY,
                ));
                if e.to_string().contains("libcuda") {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    out
}

#[cfg(not(feature = "cuda"))]
fn cuda_checks() -> Vec<Check> {
    vec![Check::ok(
        "nvidia",
        "CUDA dma-buf support",
        "not asked: build the doctor with feature `cuda` to query \
         CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED",
    )]
}

/// Whether this process may open `path` with `mode` (`R_OK`, `W_OK`).
fn may(path: &str, mode: nix::unistd::AccessFlags) -> bool {
    nix::unistd::access(path, mode).is_ok()
}

/// RLIMIT_MEMLOCK, `/dev/udmabuf`, `/dev/dma_heap/system`.
pub fn memory_checks() -> Vec<Check> {
    use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
    use nix::unistd::AccessFlags;
    let mut out = Vec::new();
    let text = |v: u64| {
        if v == RLIM_INFINITY {
            "unlimited".to_string()
        } else {
            crate::pci::size_text(v)
        }
    };
    out.push(match getrlimit(Resource::RLIMIT_MEMLOCK) {
        Ok((soft, _)) if soft == RLIM_INFINITY || soft >= 64 << 20 => Check::ok(
            "limits",
            "RLIMIT_MEMLOCK",
            format!(
                "{} (dma-buf regions are not counted; host regions are)",
                text(soft)
            ),
        ),
        Ok((soft, hard)) => Check::problem(
            "limits",
            "RLIMIT_MEMLOCK",
            Status::Warn,
            format!(
                "{} (hard {}): enough for dma-buf regions, which it does not count, but small \
                 for host regions and queues",
                text(soft),
                text(hard)
            ),
            &problems::MEMLOCK,
        ),
        Err(e) => Check::ok("limits", "RLIMIT_MEMLOCK", format!("unknown: {e}")),
    });
    let rw = AccessFlags::R_OK | AccessFlags::W_OK;
    for (node, mode, problem) in [
        ("/dev/udmabuf", rw, &problems::NO_UDMABUF),
        (
            "/dev/dma_heap/system",
            AccessFlags::R_OK,
            &problems::NO_DMA_HEAP,
        ),
    ] {
        out.push(if !Path::new(node).exists() {
            Check::problem("host buffers", node, Status::Warn, "missing", problem)
        } else if !may(node, mode) {
            Check::problem(
                "host buffers",
                node,
                Status::Warn,
                format!(
                    "present, but not open to you ({})",
                    crate::drm::describe_node(node)
                ),
                problem,
            )
        } else {
            Check::ok("host buffers", node, "present and open to you")
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_that_is_not_the_system_s_is_traced_to_how_it_got_in() {
        let preloaded = how_loaded("/etc/dmabuf-testbed/libibverbs.so.1\n", "", "/x");
        assert!(preloaded.contains("/etc/ld.so.preload"), "{preloaded}");
        let env = how_loaded("", "/opt/rdma/libibverbs.so.1", "");
        assert!(
            env.contains("LD_PRELOAD (/opt/rdma/libibverbs.so.1)"),
            "{env}"
        );
        let path = how_loaded("", "", "/opt/rdma/lib");
        assert_eq!(
            path,
            "a build found through LD_LIBRARY_PATH (/opt/rdma/lib)"
        );
    }

    /// ib_uverbs built into the kernel (as on a Firecracker GPU guest, seen on an H200
    /// machine) has no /sys/module entry and, without an RDMA device, no uverbs0: its class
    /// shows it. Without that, the doctor blamed ib_uverbs instead of the missing device.
    #[test]
    fn built_in_modules_are_found_by_their_class_or_node() {
        let root = std::env::temp_dir().join(format!("doctor-modules-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        assert!(!module_present(&root, "ib_uverbs"));
        assert!(!module_present(&root, "rdma_ucm"));
        let class = root.join("sys/class/infiniband_verbs");
        std::fs::create_dir_all(&class).unwrap();
        std::fs::write(class.join("abi_version"), "6\n").unwrap();
        assert!(module_present(&root, "ib_uverbs"));
        std::fs::create_dir_all(root.join("sys/module/rdma_ucm")).unwrap();
        assert!(module_present(&root, "rdma_ucm"));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn versions_are_parsed() {
        assert_eq!(kernel_version("6.12.38+deb12-amd64"), Some((6, 12)));
        assert_eq!(kernel_version("5.4.0-150-generic"), Some((5, 4)));
        assert_eq!(kernel_version("x"), None);
        assert_eq!(
            rdma_core_version("/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.44.0"),
            Some(44)
        );
        assert_eq!(rdma_core_version("/opt/lib/libibverbs.so.1"), None);
        let maps = "7f00-7f01 r-xp 00000000 08:01 1 /opt/rc/lib/libibverbs.so.1.15.57.0\n\
                    7f02-7f03 r-xp 00000000 08:01 2 /opt/rc/lib/libibverbs/librxe-rdmav34.so\n\
                    7f04-7f05 rw-p 00000000 00:00 0\n";
        assert_eq!(
            loaded_libraries(maps, "libibverbs.so"),
            ["/opt/rc/lib/libibverbs.so.1.15.57.0"]
        );
        assert_eq!(
            loaded_libraries(maps, "-rdmav"),
            ["/opt/rc/lib/libibverbs/librxe-rdmav34.so"]
        );
    }
}
