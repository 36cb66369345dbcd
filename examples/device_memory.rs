//! A staging buffer in the NIC's own memory (`ibv_alloc_dm`): allocate it, copy a message in,
//! register it, send it from there to a receive on a second queue pair of the same device,
//! and check what arrived. Device memory skips the PCIe round trip to host memory for small,
//! hot data (counters, locks, headers); ConnectX-5 and later have a few hundred KiB of it.
//!
//! ```text
//! device_memory [--rdma DEV] [--size BYTES]
//! ```
//!
//! Exit status 0 when the message arrived intact, 2 when the device has no device memory
//! (soft-RoCE, siw: the program says so and why), 1 on any other error.

use examples::report::{bytes, line};
use examples::{fail, host_region, net, pattern, Args};
use rdma_dmabuf::{
    Access, Context, DeviceMemory, Local, MemoryRegion, ProtectionDomain, QueuePairBuilder,
};

const USAGE: &str = "\
usage: device_memory [--rdma DEV] [--size BYTES]

  --rdma DEV     the RDMA device (default: the first hardware device, else rxe/siw)
  --size BYTES   the staging buffer's size (default 4K)";

/// The exit status that says "this device has no device memory".
const NO_DEVICE_MEMORY: i32 = 2;

fn main() {
    let args = Args::parse(USAGE, &["rdma", "size"]);
    let size = args.size("size", 4096);
    println!("device_memory");
    let picked = net::pick(args.text("rdma").as_deref()).unwrap_or_else(|e| fail(&e));
    let ctx = Context::open(&picked.device).unwrap_or_else(|e| fail(&e.to_string()));
    line("RDMA device", &picked.device);

    let mut dm = match DeviceMemory::allocate(&ctx, size, 3) {
        Ok(dm) => dm,
        Err(e) if e.is_unsupported() => {
            line("device memory", "none on this device");
            println!("{e}");
            println!(
                "Device memory lives on the NIC itself. Soft-RoCE (rxe) and siw are drivers \
                 without a NIC of their own, so there is nothing to allocate: use host or \
                 dma-buf regions there. Run this on a ConnectX-5 or later (mlx5) to see it work."
            );
            println!("RESULT device_memory supported=no");
            std::process::exit(NO_DEVICE_MEMORY);
        }
        Err(e) => fail(&e.to_string()),
    };
    line("allocated", format!("{} of device memory", bytes(size)));
    let mut message = vec![0u8; size as usize];
    pattern::fill(&mut message, 0xd3, 0);
    dm.copy_from_host(0, &message)
        .unwrap_or_else(|e| fail(&e.to_string()));
    line(
        "copied in",
        format!("{} from host memory (ibv_memcpy_to_dm)", bytes(size)),
    );

    let pd = ProtectionDomain::new(&ctx).unwrap_or_else(|e| fail(&e.to_string()));
    let staging = MemoryRegion::register_dm(&pd, dm, Access::LOCAL_WRITE)
        .unwrap_or_else(|e| fail(&e.to_string()));
    line(
        "registered",
        format!("device-memory MR: zero-based, lkey {:#x}", staging.lkey()),
    );
    let qp = || {
        QueuePairBuilder::new(&pd)
            .gid_index(picked.gid_index)
            .build()
            .unwrap_or_else(|e| fail(&e.to_string()))
    };
    let (a, b) = (qp(), qp());
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let a = a.connect(&eb).unwrap_or_else(|e| fail(&e.to_string()));
    let b = b.connect(&ea).unwrap_or_else(|e| fail(&e.to_string()));
    let inbox = b
        .post_recv(host_region(&pd, size as usize, Access::LOCAL_WRITE))
        .unwrap_or_else(|e| fail(&e.to_string()));
    let sent = a
        .post_send(Local::new(staging, 0..size), None)
        .unwrap_or_else(|e| fail(&e.to_string()))
        .spin()
        .unwrap_or_else(|e| fail(&e.to_string()));
    let got = inbox.spin().unwrap_or_else(|e| fail(&e.to_string()));
    let arrived = &got.region.bytes().unwrap_or_else(|e| fail(&e.to_string()))[..size as usize];
    let ok = arrived == message.as_slice();
    line(
        "sent",
        format!(
            "{} from device memory to a receive in host memory: {}",
            bytes(u64::from(got.wc.byte_len)),
            if ok { "intact" } else { "DIFFERENT" }
        ),
    );
    let mut back = vec![0u8; size as usize];
    let mut staging = sent.region;
    staging
        .device_memory()
        .and_then(|dm| dm.copy_to_host(0, &mut back))
        .unwrap_or_else(|e| fail(&e.to_string()));
    line(
        "read back",
        if back == message {
            "the staging buffer still holds the message"
        } else {
            "the staging buffer CHANGED"
        },
    );
    println!(
        "RESULT device_memory supported=yes intact={}",
        if ok { "yes" } else { "no" }
    );
    if !ok || back != message {
        std::process::exit(1);
    }
}
