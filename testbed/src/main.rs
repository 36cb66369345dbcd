//! `dmabuf-testbed`: boots the dma-buf RDMA testbed and runs your command in it. Run
//! `dmabuf-testbed help`; the README says what the guest has.

use dmabuf_testbed::sh::Result;
use dmabuf_testbed::ui::info;
use dmabuf_testbed::{cli, fail, script, setup, vm, Cache};
use std::process::ExitCode;

const HELP: &str = "\
dmabuf-testbed <command>

  run [options] -- CMD ARGS...
                        boot the testbed (Debian's 6.12 kernel under QEMU: vgem, udmabuf and
                        the system dma-heap as dma-buf exporters, soft-RoCE rxe0 patched to
                        register dma-bufs) and run CMD in it, in the current folder, which the
                        guest sees writable; the host's other files are seen read-only. Exits
                        with CMD's status; 1 when the guest kernel warned, oopsed or was
                        tainted; 125 when the testbed could not run CMD.
@OPTIONS@  info [run options]
                        boot once and print what the guest has (kernel, rdma-core, which
                        libibverbs a command loads, devices, dma-buf exporters, limits; with
                        --nodes 2 --nics 4 --topology, where the GPU and each NIC sit) and
                        why the VMs run under KVM or TCG
  setup                 install the host packages (as root; else prints the sudo line), fetch
                        the guest kernel, build the initramfs, the patched rxe module, the test
                        exporter and the patched rdma-core, probe KVM: a later run builds
                        nothing

  The cache (guest kernel, patched stack, packages, run folders) is $DMABUF_TESTBED_CACHE,
  else $XDG_CACHE_HOME/dmabuf-testbed, else ~/.cache/dmabuf-testbed.
";

/// The exit status when the testbed itself failed (the command never ran to its end).
const TESTBED_FAILED: u8 = 125;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match dispatch(&args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("dmabuf-testbed: {e}");
            ExitCode::from(TESTBED_FAILED)
        }
    }
}

fn help() -> String {
    HELP.replace("@OPTIONS@", cli::RUN_OPTIONS)
}

fn dispatch(args: &[String]) -> Result<u8> {
    let Some((cmd, rest)) = args.split_first() else {
        eprint!("{}", help());
        return Ok(2);
    };
    match cmd.as_str() {
        "run" | "info" if cli::wants_help(rest) => {
            print!("{}", help());
            Ok(0)
        }
        "run" => {
            let (mut opts, argv) = cli::parse_run_args(rest)?;
            opts.writable_cwd = true;
            // A folder the guest cannot be given is refused before anything is installed.
            vm::shareable_cwd(&opts)?;
            let cache = Cache::from_env()?;
            setup::packages()?;
            let results = vm::run(&cache, &argv, &opts)?;
            Ok(cli::exit_status(&results))
        }
        "info" => {
            // The options of `run`, with the info script as the command.
            let mut with_cmd = rest.to_vec();
            with_cmd.extend(["--", "sh", "-c", script::INFO].map(String::from));
            let (mut opts, argv) = cli::parse_run_args(&with_cmd)?;
            // The accelerator's whole story (QEMU's words when KVM does not boot the guest).
            opts.verbose = true;
            vm::shareable_cwd(&opts)?;
            let cache = Cache::from_env()?;
            setup::packages()?;
            let results = vm::run(&cache, &argv, &opts)?;
            info(format!("cache: {}", cache.dir.display()));
            Ok(cli::exit_status(&results))
        }
        "setup" => {
            if !rest.is_empty() {
                fail!("setup takes no arguments");
            }
            let cache = Cache::from_env()?;
            let ready = setup::testbed(&cache)?;
            info(format!("accelerator: {}", ready.accel.summary()));
            info(ready.summary());
            info(format!("cache: {}", cache.dir.display()));
            Ok(0)
        }
        "help" | "-h" | "--help" => {
            print!("{}", help());
            Ok(0)
        }
        other => fail!("unknown command `{other}`\n{}", help()),
    }
}
