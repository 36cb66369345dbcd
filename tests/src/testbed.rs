//! What the testbed VM tells a test through its environment.

/// The testbed as seen from inside the VM.
#[derive(Clone, Debug)]
pub struct Testbed {
    /// The rxe device, e.g. `rxe0`.
    pub device: String,
    /// The RoCEv2 IPv4-mapped GID's index, picked by scanning the GID table.
    pub gid_index: u32,
    /// This node's address on the rxe netdev.
    pub local_addr: String,
    /// The peer's address (this node's own in one-node mode).
    pub peer_addr: String,
    /// `a` or `b`.
    pub node: char,
    /// 1 or 2.
    pub nodes: u8,
    /// Every rxe device of this node, rail by rail (`rxe0` first; several with `--nics`).
    pub devices: Vec<String>,
    /// The netdev each rail's device runs on, in the same order.
    pub netdevs: Vec<String>,
    /// This node's address on each rail.
    pub local_addrs: Vec<String>,
    /// The peer's address on each rail (this node's own in one-node mode).
    pub peer_addrs: Vec<String>,
}

impl Testbed {
    /// Whether this process runs inside the testbed VM.
    pub fn inside() -> bool {
        std::env::var("TESTBED_VM").as_deref() == Ok("1")
    }

    /// The testbed's description.
    ///
    /// # Panics
    /// Outside the VM (the test was run with `--ignored` on the host), with a message that
    /// says how to run it.
    pub fn get() -> Testbed {
        assert!(
            Self::inside(),
            "this test needs the testbed VM; run it with `cargo xtask test`"
        );
        let var =
            |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("the testbed did not set {k}"));
        Testbed {
            device: var("RDMA_DEVICE"),
            gid_index: var("RDMA_GID_INDEX").parse().expect("RDMA_GID_INDEX"),
            local_addr: var("LOCAL_ADDR"),
            peer_addr: var("PEER_ADDR"),
            node: var("NODE").chars().next().expect("NODE"),
            nodes: var("TESTBED_NODES").parse().expect("TESTBED_NODES"),
            devices: words(&var("RDMA_DEVICES")),
            netdevs: words(&var("NETDEVS")),
            local_addrs: words(&var("LOCAL_ADDRS")),
            peer_addrs: words(&var("PEER_ADDRS")),
        }
    }

    /// Whether this node plays the server in a two-party test.
    pub fn is_server(&self) -> bool {
        self.node == 'a'
    }
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}
