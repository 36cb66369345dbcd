//! The options `dmabuf-testbed run` and `cargo xtask vm` share, and the exit status of a run.

use crate::fail;
use crate::sh::Result;
use crate::vm::{Mode, NodeResult, Opts};
use std::time::Duration;

/// The run options, one per line, for help texts.
pub const RUN_OPTIONS: &str =
    "      --nodes 1|2           two VMs joined by a virtual wire (CMD runs on both, NODE=a|b;
                            node b finds node a at $NODE_A_ADDR, also its $PEER_ADDR)
      --nics N              N NICs per node (1 to 4): rxe0..rxe<N-1>, each on its own link
                            and subnet ($RDMA_DEVICES, $LOCAL_ADDRS, $PEER_ADDRS list them)
      --topology            (with --nodes 2) a PCIe tree on two NUMA nodes: a GPU
                            (virtio-gpu-pci) behind a PCIe switch, NIC i at tier i from it
                            (same switch, same host bridge, same NUMA node, other node);
                            $TESTBED_GPU_CARD, $TESTBED_NIC_PCI, $TESTBED_NIC_TIERS, ...
      --mode patched|stock  rxe and rdma-core with kernel-patches/ (default: dma-buf regions
                            work) or Debian's own
      --timeout SECS        stop and fail after SECS (default 1800)
      --memory MIB          guest memory per VM in MiB (default 2048; 512 or more, and all
                            the VMs together within the host's memory less 1 GiB)
      --package PKG         a Debian package the guest needs (repeatable); see the README
      --verbose             the accelerator's whole story in the header (why not KVM, in
                            QEMU's words), not its one-line summary
";

/// Parses `[options] [--] CMD ARGS...` into the options and the command (`Opts::default()`
/// for whatever is not given).
///
/// # Errors
/// An unknown option, a bad value, or no command.
pub fn parse_run_args(args: &[String]) -> Result<(Opts, Vec<String>)> {
    let mut opts = Opts::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--" => {
                let argv: Vec<String> = it.cloned().collect();
                if argv.is_empty() {
                    break;
                }
                check_memory(&opts)?;
                return Ok((opts, argv));
            }
            "--memory" => {
                opts.mem_mib = it
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| n >= 512)
                    .ok_or("--memory takes MiB, 512 or more")?
            }
            "--nodes" => {
                opts.nodes = it
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| (1..=2).contains(n))
                    .ok_or("--nodes takes 1 or 2")?
            }
            "--nics" => {
                opts.nics = it
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| (1..=crate::vm::MAX_NICS).contains(n))
                    .ok_or("--nics takes 1 to 4")?
            }
            "--topology" => opts.topology = true,
            "--mode" => {
                opts.mode = match it.next().map(String::as_str) {
                    Some("patched") => Mode::Patched,
                    Some("stock") => Mode::Stock,
                    _ => fail!("--mode takes patched or stock"),
                }
            }
            "--timeout" => {
                let secs: u64 = it
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or("--timeout takes seconds")?;
                opts.timeout = Duration::from_secs(secs);
            }
            "--verbose" | "-v" => opts.verbose = true,
            "--package" => {
                let p = it.next().ok_or("--package takes a Debian package name")?;
                opts.packages.push(p.clone());
            }
            other if other.starts_with("--") => fail!("unknown option `{other}`"),
            _ => {
                // No `--`: the rest is the command.
                let mut argv = vec![a.clone()];
                argv.extend(it.cloned());
                check_memory(&opts)?;
                return Ok((opts, argv));
            }
        }
    }
    fail!("no command given: run [options] -- <command> [args...]")
}

/// Refuses guests that together ask for more than the host's memory less 1 GiB (QEMU would
/// start them and the host's OOM killer end one mid-run).
fn check_memory(opts: &Opts) -> Result<()> {
    let Some(total) = host_memory_mib() else {
        return Ok(());
    };
    let want = u64::from(opts.mem_mib) * u64::from(opts.nodes);
    if want + 1024 > total {
        fail!(
            "--memory {}: {} VM(s) would take {want} MiB of this host's {total} MiB (leave 1 GiB)",
            opts.mem_mib,
            opts.nodes
        );
    }
    Ok(())
}

/// The host's memory in MiB (`MemTotal` of /proc/meminfo), if it tells.
fn host_memory_mib() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// Whether the arguments ask for help: the first is `--help` or `-h`.
pub fn wants_help(args: &[String]) -> bool {
    matches!(args.first().map(String::as_str), Some("--help" | "-h"))
}

/// A run's exit status: the first node's non-zero status, else 1 when a node's kernel had a
/// problem or recorded no status, else 0.
pub fn exit_status(results: &[NodeResult]) -> u8 {
    for r in results {
        match r.status {
            Some(0) if r.problems.is_empty() => continue,
            Some(s) if s != 0 => return u8::try_from(s).unwrap_or(1),
            _ => return 1,
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn options_then_the_command() {
        let (o, argv) = parse_run_args(&args(
            "--nodes 2 --mode stock --timeout 60 --package gcc --verbose -- ls -l",
        ))
        .unwrap();
        assert!(!o.topology, "no PCIe topology unless asked for");
        assert_eq!((o.nodes, o.mode, o.timeout.as_secs()), (2, Mode::Stock, 60));
        assert!(o.verbose);
        assert_eq!(o.packages, ["gcc"]);
        assert_eq!(argv, ["ls", "-l"]);
        let (o, _) = parse_run_args(&args("--nodes 2 --nics 4 --topology -- true")).unwrap();
        assert!(o.topology && o.nics == 4);
        assert_eq!(o.mem_mib, 2048, "the default guest memory");
        let (o, _) = parse_run_args(&args("--memory 4096 -- true")).unwrap();
        assert_eq!(o.mem_mib, 4096);
        assert!(
            parse_run_args(&args("--memory 100 -- true")).is_err(),
            "too little"
        );
        assert!(parse_run_args(&args("--memory lots -- true")).is_err());
        let huge = parse_run_args(&args("--nodes 2 --memory 4000000 -- true"));
        assert!(
            huge.is_err_and(|e| e.to_string().contains("host")),
            "more than the host has"
        );
        let (o, _) = parse_run_args(&args("-- true")).unwrap();
        assert!(
            !o.verbose,
            "the header's accelerator line is short by default"
        );
        let (_, argv) = parse_run_args(&args("true --nodes 2")).unwrap();
        assert_eq!(
            argv,
            ["true", "--nodes", "2"],
            "options after the command are its own"
        );
    }

    #[test]
    fn bad_options_are_refused() {
        for bad in [
            "--nodes 3 -- x",
            "--mode fast -- x",
            "--timeout -- x",
            "--frob -- x",
            "--",
            "",
        ] {
            assert!(parse_run_args(&args(bad)).is_err(), "{bad:?} accepted");
        }
    }
}
