//! Each RDMA device: its driver, ports (state, link layer, MTU, RoCEv2 IPv4 GID), and whether
//! its provider registers dma-bufs (the fd -1 probe of [`rdma_dmabuf::supports_dmabuf`]).

use crate::{problems, Check, Status};
use rdma_dmabuf::{devices, PortState};
use rdma_dmabuf::{Context, ProtectionDomain};
use std::path::Path;
use std::sync::Arc;

const SECTION: &str = "rdma";

/// An RDMA device the probe can register on.
#[derive(Debug)]
pub struct Nic {
    /// `rxe0`, `mlx5_0`.
    pub name: String,
    /// A protection domain on it.
    pub pd: Arc<ProtectionDomain>,
    /// Whether the fd -1 probe said it registers dma-bufs.
    pub dmabuf: bool,
}

/// What [`inspect`] found.
#[derive(Debug, Default)]
pub struct Nics {
    /// The findings.
    pub checks: Vec<Check>,
    /// The devices that could be opened.
    pub nics: Vec<Nic>,
}

/// What the fd -1 probe's errno means: (registers dma-bufs, explanation, problem).
pub fn explain_probe(errno: i32) -> (bool, String, Option<&'static problems::Problem>) {
    let e = std::io::Error::from_raw_os_error(errno);
    match errno {
        0 => (true, "the probe registered (unexpected, but it works)".into(), None),
        libc::EBADF => (
            true,
            "registers dma-bufs (the fd -1 probe answered EBADF: the kernel looked at the fd)"
                .into(),
            None,
        ),
        libc::EOPNOTSUPP => (
            false,
            format!("no dma-buf MRs: the fd -1 probe answered EOPNOTSUPP ({e}): the provider or its kernel driver does not implement them"),
            Some(&problems::PROVIDER_NO_DMABUF),
        ),
        rdma_dmabuf::ENOTSUPP => (
            false,
            "no dma-buf MRs: the fd -1 probe answered ENOTSUPP (524), the kernel-internal \
             code some drivers (GB200 kernels) let through"
                .into(),
            Some(&problems::ENOTSUPP_524),
        ),
        libc::EPROTONOSUPPORT => (
            false,
            format!("no dma-buf MRs: the fd -1 probe answered EPROTONOSUPPORT ({e}): the kernel has no uverbs dma-buf method"),
            Some(&problems::KERNEL_TOO_OLD),
        ),
        _ => (
            false,
            format!("the fd -1 probe answered {e} (errno {errno}), which is not understood"),
            Some(&problems::PROVIDER_NO_DMABUF),
        ),
    }
}

/// The kernel driver behind `name`: the PCI function's driver, or rxe/siw for soft devices.
fn driver(sysfs: &Path, name: &str) -> String {
    let dir = sysfs.join("class/infiniband").join(name);
    if let Some(d) = std::fs::read_link(dir.join("device/driver"))
        .ok()
        .and_then(|d| Some(d.file_name()?.to_str()?.to_string()))
    {
        return d;
    }
    let parent = std::fs::read_to_string(dir.join("parent"))
        .map(|p| format!(" over {}", p.trim()))
        .unwrap_or_default();
    if name.starts_with("rxe") {
        format!("rdma_rxe (soft-RoCE{parent})")
    } else if name.starts_with("siw") {
        format!("siw (soft-iWARP{parent})")
    } else {
        format!("unknown{parent}")
    }
}

/// Whether the running kernel (its files under `root`) has `ib_uverbs`: loaded, built in, or
/// a module in `/lib/modules/<release>`.
pub fn uverbs_module_exists(root: &Path) -> bool {
    match nix::sys::utsname::uname() {
        Ok(u) => uverbs_module_in(root, &u.release().to_string_lossy()),
        Err(_) => true,
    }
}

/// [`uverbs_module_exists`] for the kernel `release`.
fn uverbs_module_in(root: &Path, release: &str) -> bool {
    if crate::system::module_present(root, "ib_uverbs") {
        return true;
    }
    let dir = root.join("lib/modules").join(release);
    ["modules.builtin", "modules.dep"]
        .iter()
        .any(|f| std::fs::read_to_string(dir.join(f)).is_ok_and(|t| t.contains("/ib_uverbs.ko")))
}

/// The failed check of a device list libibverbs could not give (`found`: why), in
/// `section`: the uverbs module is missing where the kernel has it (`modprobe ib_uverbs` is
/// only a fix there), else the RDMA modules are absent.
pub(crate) fn no_device_list(section: &'static str, found: String) -> Check {
    let problem = if uverbs_module_exists(Path::new("/")) {
        &problems::UVERBS_MISSING
    } else {
        &problems::RDMA_MODULES_ABSENT
    };
    Check::problem(section, "RDMA devices", Status::Fail, found, problem)
}

/// The failed check of device `name` that libibverbs lists but cannot open (`found`:
/// why), in `section`.
pub(crate) fn cannot_open(section: &'static str, name: &str, found: String) -> Check {
    Check::problem(
        section,
        name,
        Status::Fail,
        found,
        &problems::UVERBS_MISSING,
    )
}

/// Lists, opens and probes every RDMA device.
pub fn inspect(sysfs: &Path) -> Nics {
    let mut out = Nics::default();
    let list = match devices() {
        Ok(l) => l,
        Err(e) => {
            out.checks.push(no_device_list(SECTION, e.to_string()));
            return out;
        }
    };
    if list.is_empty() {
        let in_sysfs = crate::topology::nics(sysfs);
        let found = if in_sysfs.is_empty() {
            "there is no RDMA device (libibverbs lists none, /sys/class/infiniband is empty)"
                .to_string()
        } else {
            format!(
                "libibverbs lists no RDMA device, although the kernel has {}: rdma-core lacks \
                 their provider",
                in_sysfs
                    .iter()
                    .map(|e| e.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        out.checks.push(Check::problem(
            SECTION,
            "RDMA devices",
            Status::Fail,
            found,
            &problems::NO_RDMA_DEVICE,
        ));
        return out;
    }
    for d in list {
        inspect_one(sysfs, &d.name, &mut out);
    }
    out
}

fn inspect_one(sysfs: &Path, name: &str, out: &mut Nics) {
    let drv = driver(sysfs, name);
    let ctx = match Context::open(name) {
        Ok(c) => c,
        Err(e) => {
            let found = format!("driver {drv}; cannot open: {e}");
            out.checks.push(cannot_open(SECTION, name, found));
            return;
        }
    };
    out.checks
        .push(Check::ok(SECTION, name, format!("driver {drv}")));
    let ports = ctx.query_device().map(|a| a.phys_port_cnt).unwrap_or(1);
    for port in 1..=ports {
        out.checks.push(port_check(sysfs, &ctx, port));
    }
    let pd = match ProtectionDomain::new(&ctx) {
        Ok(pd) => pd,
        Err(e) => {
            out.checks.push(Check::problem(
                SECTION,
                format!("{name} dma-buf MRs"),
                Status::Fail,
                format!("cannot allocate a protection domain: {e}"),
                &problems::UVERBS_MISSING,
            ));
            return;
        }
    };
    let errno = rdma_dmabuf::dmabuf_probe_errno(&pd);
    let (dmabuf, why, problem) = explain_probe(errno);
    let check_name = format!("{name} dma-buf MRs");
    out.checks.push(match problem {
        None => Check::ok(SECTION, check_name, why),
        Some(p) => {
            let c = Check::problem(SECTION, check_name, Status::Fail, why, p);
            if name.starts_with("rxe") && errno == libc::EOPNOTSUPP {
                c.with_detail(
                    "stock rdma_rxe has no dma-buf MRs: build and load the patched rdma_rxe and \
                     rdma-core of kernel-patches/ (kernel-patches/README.md)",
                )
            } else {
                c
            }
        }
    });
    if dmabuf {
        if let Some(c) = huge_page_check(&ctx) {
            out.checks.push(c);
        }
    }
    out.nics.push(Nic {
        name: name.to_string(),
        pd,
        dmabuf,
    });
}

/// On a device that moves data with the CPU (rxe, siw), whether udmabufs over huge pages
/// work with the running kernel's udmabuf (`None`: not such a device).
fn huge_page_check(ctx: &Arc<Context>) -> Option<Check> {
    if !ctx.query_device().ok()?.moves_data_with_the_cpu() {
        return None;
    }
    let name = format!("{} udmabufs over huge pages", ctx.name());
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into());
    Some(if drm_export::running_kernel_misplaces_huge_pages() {
        let found = format!(
            "udmabufs with large pages (hugetlb, shmem transparent huge pages) are refused on \
             kernel {release}: this device moves data through udmabuf's vmap, which misplaces \
             them there"
        );
        Check::problem(
            SECTION,
            name,
            Status::Warn,
            found,
            &problems::UDMABUF_HUGE_VMAP,
        )
    } else {
        Check::ok(
            SECTION,
            name,
            format!("kernel {release} has the udmabuf vmap fix"),
        )
    })
}

pub(crate) fn port_check(sysfs: &Path, ctx: &Arc<Context>, port: u8) -> Check {
    let name = format!("{} port {port}", ctx.name());
    let attr = match ctx.query_port(port) {
        Ok(a) => a,
        Err(e) => {
            return Check::problem(
                SECTION,
                name,
                Status::Warn,
                e.to_string(),
                &problems::PORT_DOWN,
            )
        }
    };
    let link = std::fs::read_to_string(
        sysfs
            .join("class/infiniband")
            .join(ctx.name())
            .join(format!("ports/{port}/link_layer")),
    )
    .map(|s| s.trim().to_string())
    .unwrap_or_else(|_| "unknown".into());
    let mut found = format!(
        "{}, link layer {link}, MTU {}",
        match attr.state {
            PortState::Active => "ACTIVE".to_string(),
            PortState::Down => "DOWN".to_string(),
            PortState::Other(s) => format!("state {s}"),
        },
        attr.active_mtu.bytes()
    );
    let gid = (link == "Ethernet").then(|| ctx.roce_v2_ipv4_gid(port));
    match &gid {
        Some(Ok((index, gid))) => {
            found.push_str(&format!(", RoCEv2 IPv4 GID {gid} at index {index}"))
        }
        Some(Err(_)) => found.push_str(", no RoCEv2 GID with an IPv4 address"),
        None => {}
    }
    if attr.state != PortState::Active {
        Check::problem(SECTION, name, Status::Warn, found, &problems::PORT_DOWN)
    } else if matches!(gid, Some(Err(_))) {
        Check::problem(SECTION, name, Status::Warn, found, &problems::NO_ROCE_GID)
    } else {
        Check::ok(SECTION, name, found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ib_uverbs_is_found_loaded_built_in_or_as_a_module_and_missing_otherwise() {
        let root = std::env::temp_dir().join(format!("doctor-uverbs-{}", std::process::id()));
        let dir = root.join("lib/modules/6.8.0-cloud");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("modules.dep"),
            "kernel/fs/ext4/ext4.ko: kernel/fs/jbd2.ko\n",
        )
        .unwrap();
        assert!(
            !uverbs_module_in(&root, "6.8.0-cloud"),
            "a kernel without RDMA modules"
        );
        std::fs::write(
            dir.join("modules.dep"),
            "kernel/drivers/infiniband/core/ib_uverbs.ko.xz: kernel/drivers/infiniband/core/ib_core.ko.xz\n",
        )
        .unwrap();
        assert!(uverbs_module_in(&root, "6.8.0-cloud"), "a module");
        std::fs::remove_file(dir.join("modules.dep")).unwrap();
        std::fs::write(
            dir.join("modules.builtin"),
            "kernel/drivers/infiniband/core/ib_uverbs.ko\n",
        )
        .unwrap();
        assert!(uverbs_module_in(&root, "6.8.0-cloud"), "built in");
        // Built in, with no /lib/modules at all (a GPU guest's kernel): its class shows it.
        std::fs::remove_dir_all(root.join("lib")).unwrap();
        assert!(!uverbs_module_in(&root, "6.18.44-fc"), "nothing");
        let class = root.join("sys/class/infiniband_verbs");
        std::fs::create_dir_all(&class).unwrap();
        std::fs::write(class.join("abi_version"), "6\n").unwrap();
        assert!(
            uverbs_module_in(&root, "6.18.44-fc"),
            "built in, by its class"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
