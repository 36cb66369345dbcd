//! The node's `inner.sh` (`scripts/inner.sh`): the run's values filled into the template.

use super::{node_addr, rail_addr, share, topology, Opts, RC_ACK_TIMEOUT, RC_RETRY_COUNT};
use crate::patched::Patched;
use crate::sh::{self, Result};
use crate::{fail, script};
use std::path::Path;

/// The node's `inner.sh`: `scripts/inner.sh` filled in for the run folder `dir` (the node's)
/// and the stack (`None`: stock); `kernel_root`: the guest kernel's unpacked package, whose
/// modules `--topology` loads from (`modprobe -d`). `/init` passes it the command's working
/// folder, its first argument, which may hold any byte but a newline.
///
/// # Errors
/// A folder it names is not UTF-8 ([`share::utf8`]), an environment name is not a shell
/// name, or the template and the values disagree.
pub fn inner_script(
    dir: &Path,
    node: char,
    opts: &Opts,
    patched: Option<&Patched>,
    kernel_root: &Path,
) -> Result<String> {
    let quote = |p: &Path| share::utf8(p).map(sh::quote);
    let local = node_addr(node, opts.nodes);
    let other = if node == 'a' { 'b' } else { 'a' };
    let (peer, peer_run) = if opts.nodes > 1 {
        (
            node_addr(other, opts.nodes),
            quote(&dir.with_file_name(other.to_string()))?,
        )
    } else {
        (local, sh::quote(""))
    };
    let (mode, module, exporter, lib) = match patched {
        Some(p) => (
            "patched",
            quote(&p.module)?,
            quote(&p.exporter)?,
            quote(&p.lib)?,
        ),
        None => ("stock", sh::quote(""), sh::quote(""), sh::quote("")),
    };
    let other_or_self = if opts.nodes > 1 { other } else { node };
    let rails = |n: char| {
        (0..opts.nics)
            .map(|r| rail_addr(n, opts.nodes, r))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut env = Vec::new();
    for (k, v) in &opts.env {
        let shell_name = k.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !shell_name {
            fail!("environment name {k:?}: letters, digits and _ only, not starting with a digit");
        }
        env.push(format!("export {k}={}", sh::quote(v)));
    }
    let topo = |f: fn(&topology::Slot) -> String| {
        if opts.topology {
            sh::quote(&topology::per_nic(opts.nics, f))
        } else {
            sh::quote("")
        }
    };
    let layout: Vec<String> = if opts.topology {
        topology::describe(opts.nics)
            .iter()
            .map(|l| format!("say {}", sh::quote(&format!("topology: {l}"))))
            .collect()
    } else {
        Vec::new()
    };
    script::fill(
        script::INNER,
        &[
            ("RUN", &quote(dir)?),
            ("PEER_RUN", &peer_run),
            ("NODES", &opts.nodes.to_string()),
            ("NICS", &opts.nics.to_string()),
            ("LOCAL_ADDRS", &sh::quote(&rails(node))),
            ("PEER_ADDRS", &sh::quote(&rails(other_or_self))),
            ("NODE", &node.to_string()),
            ("LOCAL_ADDR", local),
            ("PEER_ADDR", peer),
            ("MODE", mode),
            ("RXE_MODULE", &module),
            ("EXPORTER_MODULE", &exporter),
            ("RDMA_LIB", &lib),
            ("ACK_TIMEOUT", &RC_ACK_TIMEOUT.to_string()),
            ("RETRY_COUNT", &RC_RETRY_COUNT.to_string()),
            ("ENV", &env.join("\n")),
            ("TOPOLOGY", if opts.topology { "1" } else { "0" }),
            ("KERNEL_ROOT", &quote(kernel_root)?),
            ("NIC_TIERS", &topo(|s| s.tier.name().to_string())),
            (
                "NIC_NUMA",
                &topo(|s| topology::BRIDGES[s.bridge].numa.to_string()),
            ),
            ("NIC_SPEEDS", &topo(|s| s.speed_mbps.to_string())),
            (
                "GPU_NUMA",
                &topology::BRIDGES[topology::GPU_BRIDGE].numa.to_string(),
            ),
            ("LAYOUT", &layout.join("\n")),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::super::{check_request, MAX_NICS};
    use super::*;

    /// `--topology` needs two nodes, and gives the guest the placement of each NIC.
    #[test]
    fn the_topology_is_two_nodes_only_and_names_each_nic_placement() {
        let argv = ["true".to_string()];
        let one = Opts {
            topology: true,
            ..Opts::default()
        };
        assert!(check_request(&argv, &one).is_err());
        let opts = Opts {
            nodes: 2,
            nics: MAX_NICS,
            topology: true,
            ..Opts::default()
        };
        check_request(&argv, &opts).unwrap();
        let s = inner_script(Path::new("/r"), 'b', &opts, None, Path::new("/k")).unwrap();
        assert!(s.contains("export TESTBED_TOPOLOGY=1"), "{s}");
        assert!(
            s.contains("TESTBED_NIC_TIERS='switch host-bridge numa other'"),
            "{s}"
        );
        assert!(s.contains("TESTBED_NIC_NUMA='0 0 0 1'"), "{s}");
        assert!(
            s.contains("TESTBED_NIC_SPEEDS='25000 25000 10000 10000'"),
            "{s}"
        );
        assert!(s.contains("KERNEL_ROOT='/k'"), "{s}");
        let plain = inner_script(
            Path::new("/r"),
            'b',
            &Opts::default(),
            None,
            Path::new("/k"),
        );
        assert!(plain.unwrap().contains("export TESTBED_TOPOLOGY=0"));
    }

    #[test]
    fn environment_names_must_be_shell_names() {
        for bad in ["", "1A", "A B", "A;rm", "A=B"] {
            let opts = Opts {
                env: vec![(bad.into(), "v".into())],
                ..Opts::default()
            };
            let e = inner_script(Path::new("/r"), 'a', &opts, None, Path::new("/k"));
            assert!(e.is_err(), "{bad:?} accepted");
        }
        let opts = Opts {
            env: vec![("_OK_1".into(), "a b".into())],
            ..Opts::default()
        };
        let s = inner_script(Path::new("/r"), 'a', &opts, None, Path::new("/k")).unwrap();
        assert!(s.contains("export _OK_1='a b'"), "{s}");
    }

    #[test]
    fn run_folders_are_quoted_or_refused_by_name() {
        use std::os::unix::ffi::OsStrExt;
        let odd = Path::new("/c a,b=c'd\"$e\\*/runs/1/a");
        let s = inner_script(odd, 'a', &Opts::default(), None, Path::new("/k")).unwrap();
        assert!(s.contains(r#"RUN='/c a,b=c'\''d"$e\*/runs/1/a'"#), "{s}");
        let latin1 = Path::new(std::ffi::OsStr::from_bytes(b"/caf\xe9/runs/1/a"));
        let e = inner_script(latin1, 'a', &Opts::default(), None, Path::new("/k")).unwrap_err();
        let e = e.downcast::<share::Unsharable>().expect("an Unsharable");
        assert_eq!(e.reason, share::Reason::NotUtf8(0xe9));
    }
}
