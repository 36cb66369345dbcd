//! The known problems: what you see, the cause, the fix. The doctor's fixes come from here,
//! and so does the "Common errors and their fixes" table of `docs/hardware.md`
//! ([`markdown_table`]; a host test checks that the document carries exactly this table, and
//! `gpu-rdma-doctor --common-errors` prints it). Each problem is a constant that the checks
//! name, so a fix cannot refer to a problem the table lacks.

/// One known problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Problem {
    /// A stable name, used in the doctor's JSON (`problem`).
    pub id: &'static str,
    /// The message or symptom.
    pub you_see: &'static str,
    /// Why.
    pub cause: &'static str,
    /// What to do.
    pub fix: &'static str,
}

const fn p(
    id: &'static str,
    you_see: &'static str,
    cause: &'static str,
    fix: &'static str,
) -> Problem {
    Problem {
        id,
        you_see,
        cause,
        fix,
    }
}

/// provider-no-dmabuf.
pub const PROVIDER_NO_DMABUF: Problem = p(
    "provider-no-dmabuf",
    "`Unsupported ... ibv_reg_dmabuf_mr ... EOPNOTSUPP`",
    "the provider (rxe, siw, an old rdma-core) or the kernel has no dma-buf MRs; or, where \
     the device does register dma-bufs (the fd -1 probe answers `EBADF`), its driver cannot \
     take this buffer: the patched rxe of `kernel-patches/` refuses a dma-buf whose kernel \
     mapping is I/O memory (VRAM behind a PCIe BAR) and one whose exporter has no vmap",
    "use a NIC whose driver has them (mlx5, efa, irdma, bnxt_re, mana, ionic), rdma-core v34 or later, and kernel 5.12 \
     or later. For rxe, see `kernel-patches/`; with the patched rxe, use buffers in system \
     memory (udmabuf, the system heap, vgem, a GPU buffer placed in system memory)",
);

/// enotsupp-524.
pub const ENOTSUPP_524: Problem = p(
    "enotsupp-524",
    "`ibv_reg_dmabuf_mr` fails with `Unknown error 524` (`ENOTSUPP`)",
    "the kernel driver has no dma-buf MRs for this device and let the kernel-internal \
     `ENOTSUPP` reach user space (seen on GB200 kernels)",
    "use a kernel and NIC driver with dma-buf MRs (mlx5 with on-demand paging); until \
     then, register host memory or use `nvidia_peermem`",
);

/// kernel-too-old.
pub const KERNEL_TOO_OLD: Problem = p(
    "kernel-too-old",
    "`EPROTONOSUPPORT` on registration",
    "the kernel predates 5.12",
    "upgrade the kernel",
);

/// uverbs-missing.
pub const UVERBS_MISSING: Problem = p(
    "uverbs-missing",
    "`ibv_get_device_list` fails, or `/dev/infiniband` is empty",
    "`ib_uverbs` (verbs from user space) or `rdma_ucm` (rdma_cm) is not loaded",
    "`modprobe ib_uverbs rdma_ucm`",
);

/// rdma-modules-absent.
pub const RDMA_MODULES_ABSENT: Problem = p(
    "rdma-modules-absent",
    "`ibv_get_device_list` fails, and `modprobe ib_uverbs` says the module is not found",
    "this kernel has no RDMA modules: `ib_uverbs` is neither built in nor in \
     `/lib/modules/$(uname -r)` (cloud and minimal kernels often leave them out)",
    "install the kernel's RDMA modules (Ubuntu: `linux-modules-extra-$(uname -r)`; Debian's \
     `linux-image-*` carry them) or boot a kernel built with `CONFIG_INFINIBAND_USER_ACCESS`",
);

/// no-rdma-device.
pub const NO_RDMA_DEVICE: Problem = p(
    "no-rdma-device",
    "`no such RDMA device`, or `ibv_devices` lists nothing",
    "no RDMA NIC driver is loaded, or rdma-core lacks its provider",
    "load the NIC's driver (`mlx5_ib`, ...) and install its provider (`ibverbs-providers`); \
     for soft-RoCE: `modprobe rdma_rxe` and `rdma link add rxe0 type rxe netdev <netdev>`",
);

/// port-down.
pub const PORT_DOWN: Problem = p(
    "port-down",
    "completions fail or connections time out; the port is not `ACTIVE`",
    "no link on the port, or its netdev is down",
    "check the cable and `ip link set <netdev> up`; `ibv_devinfo` shows the port state",
);

/// dri-eacces.
pub const DRI_EACCES: Problem = p(
    "dri-eacces",
    "`EACCES` opening `/dev/dri/...`",
    "not in the `render` or `video` group",
    "`sudo usermod -aG render,video $USER`, then log in again",
);

/// no-drm-device.
pub const NO_DRM_DEVICE: Problem = p(
    "no-drm-device",
    "`no DRM device could allocate and export the buffer`",
    "no GPU driver loaded, or every device refused (the lines below the message say why)",
    "load the driver; pass `--drm` to pick one; `modprobe vgem` gives a software stand-in",
);

/// no-prime-export.
pub const NO_PRIME_EXPORT: Problem = p(
    "no-prime-export",
    "the DRM device cannot export dma-bufs (`DRM_PRIME_CAP_EXPORT` is 0)",
    "the driver does not implement PRIME export",
    "use a driver that exports dma-bufs (i915, xe, amdgpu, nouveau, vgem)",
);

/// i915-no-lmem.
pub const I915_NO_LMEM: Problem = p(
    "i915-no-lmem",
    "`EINVAL` from `i915` with `--placement device`",
    "an integrated GPU has no local memory",
    "`--placement system` or `auto`",
);

/// no-udmabuf.
pub const NO_UDMABUF: Problem = p(
    "no-udmabuf",
    "`/dev/udmabuf` missing or not writable",
    "the `udmabuf` module is not loaded, or the node's permissions keep you out",
    "`modprobe udmabuf`; give your user access to `/dev/udmabuf` (a udev rule)",
);

/// no-dma-heap.
pub const NO_DMA_HEAP: Problem = p(
    "no-dma-heap",
    "`/dev/dma_heap/system` missing or not readable",
    "the kernel lacks `CONFIG_DMABUF_HEAPS_SYSTEM`, or the node's permissions keep you out",
    "use a kernel with dma-buf heaps; give your user access to `/dev/dma_heap/system`",
);

/// no-roce-gid.
pub const NO_ROCE_GID: Problem = p(
    "no-roce-gid",
    "`no RDMA device with a RoCEv2 IPv4 address`",
    "the NIC's netdev has no IPv4 address, or the port is InfiniBand",
    "`ip addr add ... dev <netdev>`, or `--bind <IPoIB address>`",
);

/// bind-addr.
pub const BIND_ADDR: Problem = p(
    "bind-addr",
    "`rdma_bind_addr ... EADDRNOTAVAIL`",
    "`--bind` names an address no local RDMA netdev has",
    "use an address of the NIC's netdev (`rdma link show` lists the netdevs)",
);

/// cm-route.
pub const CM_ROUTE: Problem = p(
    "cm-route",
    "`the route to X goes through mlx5_0, not --rdma mlx5_1`",
    "rdma_cm routes by IP address",
    "connect to the server's address on the subnet of the NIC you want",
);

/// connect-timeout.
pub const CONNECT_TIMEOUT: Problem = p(
    "connect-timeout",
    "`connect ... ETIMEDOUT` or `ECONNREFUSED` after the retries",
    "the server is not listening, a firewall drops UDP 4791 (RoCEv2), or no route",
    "start the server first; open UDP 4791; check `ping` over the RDMA netdev",
);

/// rem-access.
pub const REM_ACCESS: Problem = p(
    "rem-access",
    "completion `REM_ACCESS_ERR`",
    "the remote region lacks `REMOTE_WRITE`/`REMOTE_READ`, or the range or rkey is wrong",
    "register with the access you need and send the `RemoteRegion` as `remote()` gives it",
);

/// retry-exceeded.
pub const RETRY_EXCEEDED: Problem = p(
    "retry-exceeded",
    "completion `RETRY_EXC_ERR`",
    "packets lost on the path: wrong GID index, MTU mismatch, or a lossy RoCE network \
     without PFC/ECN",
    "check `show_gids`, the MTUs, and the switch's lossless configuration",
);

/// memlock.
pub const MEMLOCK: Problem = p(
    "memlock",
    "`ENOMEM` registering host memory",
    "`RLIMIT_MEMLOCK`",
    "`ulimit -l unlimited` (or a limits.d entry)",
);

/// small-bar.
pub const SMALL_BAR: Problem = p(
    "small-bar",
    "registration of a large VRAM buffer fails",
    "a small PCIe BAR (256 MiB: resizable BAR off)",
    "turn on resizable BAR",
);

/// p2p-root-complex.
pub const P2P_ROOT_COMPLEX: Problem = p(
    "p2p-root-complex",
    "peer-to-peer is slow, or the exporter migrates VRAM to system memory",
    "the GPU and the NIC meet only at the CPU's root complex (or on different sockets), \
     not under one PCIe switch",
    "put GPU and NIC under one PCIe switch (the same riser or slot group); across root \
     complexes P2P depends on the CPU (`pci_p2pdma` allows it on known-good ones)",
);

/// acs-redirect.
pub const ACS_REDIRECT: Problem = p(
    "acs-redirect",
    "peer-to-peer traffic goes through the root complex although GPU and NIC share a \
     switch",
    "ACS request or completion redirect is on at a bridge between them",
    "turn ACS redirect off on that bridge (firmware setting; `setpci` on the bridge's ACS \
     control) where isolation between the devices is not needed",
);

/// iommu-translated.
pub const IOMMU_TRANSLATED: Problem = p(
    "iommu-translated",
    "peer-to-peer works but slowly, or faults appear in the kernel log (`DMAR`, `AMD-Vi`)",
    "the IOMMU translates the devices' DMA (a `DMA` or `DMA-FQ` group)",
    "`iommu=pt` on the kernel command line (passthrough), or keep translation and accept \
     its cost",
);

/// nvidia-proprietary.
pub const NVIDIA_PROPRIETARY: Problem = p(
    "nvidia-proprietary",
    "`CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` is 0",
    "the proprietary NVIDIA kernel module exports no dma-bufs",
    "install NVIDIA's open kernel modules (r515 or later) and CUDA 11.7 or later",
);

/// nvidia-peermem.
pub const NVIDIA_PEERMEM: Problem = p(
    "nvidia-peermem",
    "GPUDirect RDMA without dma-buf needs `nvidia_peermem`",
    "`nvidia_peermem` is the older path (pinning GPU pages through the proprietary peer-memory \
     API); dma-buf does not need it",
    "nothing for dma-buf; for libraries that still use peer memory, `modprobe nvidia_peermem`",
);

/// udmabuf-huge-page-vmap.
pub const UDMABUF_HUGE_VMAP: Problem = p(
    "udmabuf-huge-page-vmap",
    "`Unsupported ... udmabuf's kernel mapping (vmap) on Linux 6.10 to 6.16 ...` registering a \
     udmabuf over hugetlb pages on rxe or siw",
    "udmabuf's vmap on these kernels shows the first 4 KiB page of each huge page in place of \
     every page of it, and a soft device (rxe, siw) moves data through that mapping: the \
     transfer would report success with the wrong bytes, so rdma-dmabuf refuses the \
     registration. Hardware NICs (DMA) and user mappings are unaffected",
    "on rxe/siw use udmabufs over ordinary memfds (`MemfdPages::Shmem`) filled while shmem \
     transparent huge pages were off, made by `drm_export::Udmabuf` as root (it reads the \
     page frames), or run a kernel with \"udmabuf: fix vmap missed offset page\" (Linux \
     6.17; 6.16.y stable from August 2025)",
);

/// The table, in the order the document lists it.
pub const PROBLEMS: &[&Problem] = &[
    &PROVIDER_NO_DMABUF,
    &ENOTSUPP_524,
    &KERNEL_TOO_OLD,
    &UVERBS_MISSING,
    &RDMA_MODULES_ABSENT,
    &NO_RDMA_DEVICE,
    &PORT_DOWN,
    &DRI_EACCES,
    &NO_DRM_DEVICE,
    &NO_PRIME_EXPORT,
    &I915_NO_LMEM,
    &NO_UDMABUF,
    &NO_DMA_HEAP,
    &UDMABUF_HUGE_VMAP,
    &NO_ROCE_GID,
    &BIND_ADDR,
    &CM_ROUTE,
    &CONNECT_TIMEOUT,
    &REM_ACCESS,
    &RETRY_EXCEEDED,
    &MEMLOCK,
    &SMALL_BAR,
    &P2P_ROOT_COMPLEX,
    &ACS_REDIRECT,
    &IOMMU_TRANSLATED,
    &NVIDIA_PROPRIETARY,
    &NVIDIA_PEERMEM,
];

/// The table as Markdown (`| you see | cause | fix |`), as `docs/hardware.md` carries it.
pub fn markdown_table() -> String {
    let mut out = String::from("| you see | cause | fix |\n| --- | --- | --- |\n");
    for p in PROBLEMS {
        out.push_str(&format!("| {} | {} | {} |\n", p.you_see, p.cause, p.fix));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_no_cell_breaks_the_table() {
        for (i, a) in PROBLEMS.iter().enumerate() {
            assert!(PROBLEMS[i + 1..].iter().all(|b| b.id != a.id), "{}", a.id);
            for cell in [a.you_see, a.cause, a.fix] {
                assert!(!cell.contains('|') && !cell.contains('\n'), "{cell}");
            }
        }
    }
}
