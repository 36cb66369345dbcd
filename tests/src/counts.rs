//! Process-, device- and kernel-wide counts for leak tests. They see everything, so a test
//! that uses them must run alone in its process (or under a lock shared by its neighbours):
//! `cargo xtask test` runs each test file's VM tests in a process of their own.

/// Open descriptors of this process.
///
/// # Panics
/// If `/proc/self/fd` cannot be read.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// Live dma-buf objects in the kernel: the `Total N objects` line of debugfs's bufinfo.
///
/// # Panics
/// Without debugfs (the testbed mounts it).
pub fn dmabuf_objects() -> usize {
    let info = std::fs::read_to_string("/sys/kernel/debug/dma_buf/bufinfo").expect("debugfs");
    info.lines()
        .find_map(|l| {
            l.strip_prefix("Total ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .expect("bufinfo total")
}

/// RDMA objects of `kind` (`mr`, `qp`, `cq`, ...) as `rdma resource show` lists them.
///
/// # Panics
/// If the `rdma` tool fails.
pub fn rdma_resources(kind: &str) -> usize {
    let out = std::process::Command::new("rdma")
        .args(["resource", "show", kind])
        .output()
        .expect("rdma tool");
    assert!(out.status.success(), "rdma resource show {kind}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}
