//! The bench's shell scripts, kept as real files under `bench/src/scripts/` and built in with
//! `include_str!`; each takes its inputs as arguments (no placeholders). The testbed's own
//! scripts live in the testbed crate, xtask's in `xtask/src/scripts/`.

/// `cargo xtask bench`'s command in the VM: runs a plan file, a step per line.
pub const BENCH: &str = include_str!("scripts/bench.sh");

/// `cargo xtask bench --peers`' command on both nodes.
pub const PEERS: &str = include_str!("scripts/peers.sh");

/// `cargo xtask bench --sched-trace`'s command in the one-node VM.
pub const SCHED: &str = include_str!("scripts/sched.sh");

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file of `bench/src/scripts/`, by file name.
    const ALL: &[(&str, &str)] = &[
        ("bench.sh", BENCH),
        ("peers.sh", PEERS),
        ("sched.sh", SCHED),
    ];

    /// A file added to the folder needs a constant here.
    #[test]
    fn every_script_file_is_listed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/scripts");
        dmabuf_testbed::script::check_folder(&dir, ALL).unwrap();
    }

    #[test]
    fn every_script_runs_only_programs_of_the_table() {
        for (name, script) in ALL {
            if let Err(e) = dmabuf_testbed::programs::check(script, false) {
                panic!("{name}: {e}");
            }
        }
    }
}
