//! `gpu-rdma-doctor`: why GPU-memory RDMA does or does not work on this machine, and how to
//! fix it. Exits 0 only when a dma-buf registration worked on at least one buffer x NIC pair,
//! 1 when none did, 2 on a usage error. `gpu-rdma-doctor agent ...`: what a transfer-engine
//! agent with those settings needs; exits 0 when no check failed, 1 when one did, 2 on a
//! usage error.

use gpu_rdma_doctor::agent::{self, args};
use gpu_rdma_doctor::{problems, run, Options};
use std::process::ExitCode;

const USAGE: &str = "usage: gpu-rdma-doctor [--json] [--no-probe] [--size BYTES] [--common-errors]
       gpu-rdma-doctor agent [--devices DEV,...] [--bind IP:PORT] [--etcd URL,...] ...

  --json           print the report as one JSON document
  --no-probe       skip the end-to-end probe (allocation, export, registration)
  --size BYTES     bytes per probe buffer (a multiple of the page size; default 65536)
  --common-errors  print the table of known problems (Markdown) and exit

  agent            check what a transfer-engine agent needs (`agent --help` for its flags)

Exit status: 0 when a dma-buf registration worked on at least one buffer x NIC pair, else 1.";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("agent") {
        args.next();
        return agent_main(args);
    }
    let mut options = Options::default();
    let mut json = false;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--json" => json = true,
            "--no-probe" => options.no_probe = true,
            "--size" => match args.next().and_then(|s| s.parse().ok()) {
                Some(n) => options.probe_size = n,
                None => return usage("--size takes a number of bytes"),
            },
            "--common-errors" => {
                print!("{}", problems::markdown_table());
                return ExitCode::SUCCESS;
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => return usage(&format!("unknown argument {other:?}")),
        }
    }
    let report = run(&options);
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.render());
    }
    if report.dmabuf_works() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `gpu-rdma-doctor agent ...`.
fn agent_main(args: impl Iterator<Item = String>) -> ExitCode {
    let (options, json) = match args::parse(args) {
        Ok(args::Command::Check { options, json }) => (options, json),
        Ok(args::Command::Help) => {
            println!("{}", args::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("gpu-rdma-doctor agent: {e}\n{}", args::USAGE);
            return ExitCode::from(2);
        }
    };
    let report = agent::run(&options);
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.render());
    }
    if report.ready() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn usage(why: &str) -> ExitCode {
    eprintln!("gpu-rdma-doctor: {why}\n{USAGE}");
    ExitCode::from(2)
}
