//! The transfer engine's tests: agents, batches, metadata services (P2P, etcd, HTTP), rails,
//! tiers, security and metrics, on one node and two.
//!
//! One module per test file; `cargo xtask test` runs each module's VM tests in a process of
//! their own (xtask/src/testrun.rs), so a test file's tests are never beside another file's.

mod engine_concurrency;
mod engine_cuda;
mod engine_devices;
mod engine_etcd;
mod engine_http_metadata;
mod engine_idle_peers;
mod engine_loopback;
mod engine_metadata_failures;
mod engine_metrics;
mod engine_peer_killed;
mod engine_rails;
mod engine_security;
mod engine_tiers;
mod engine_topology;
mod engine_two_node;
mod engine_two_node_agents;
mod engine_two_node_etcd;
