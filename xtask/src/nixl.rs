//! `cargo xtask nixl-tests`: NIXL's own Python tests and examples that need no GPU, pinned by
//! tag and SHA-256, run unchanged in the testbed over patched rxe against our `nixl` package
//! (gpu_rdma's, `python -m gpu_rdma.nixl path`) or NIXL's own (the pinned wheel, UCX
//! backend): `test/python/test_nixl_api.py` and `examples/python/partial_md_example.py` on
//! one node, `basic_two_peers.py` and `expanded_two_peers.py` with the target on node a and
//! the initiator on node b. The files are fetched at run time (or read from a NIXL checkout)
//! into `target/nixl-tests`, never committed: they are NIXL's code.

use crate::pinned::{passed, Pinned};
use dmabuf_testbed::sh::{self, Result};
use dmabuf_testbed::ui::info;
use dmabuf_testbed::{fail, programs, wheels};
use gpu_rdma_bench::workspace::Paths;
use gpu_rdma_bench::workspace::{boot, python};
use std::path::{Path, PathBuf};

/// NIXL's files at the pinned wheel's version (nixl-cu12 1.4.0), each with its SHA-256.
const NIXL_FILES: Pinned = Pinned {
    repo: "ai-dynamo/nixl",
    tag: "v1.4.0",
    files: &[
        (
            "test/python/conftest.py",
            "43ee6b3194deba7c7cb19ed2509198be2325621e2ba92da4b0edfa2cefc21311",
        ),
        (
            "test/python/test_nixl_api.py",
            "351a3740a6e8735842a0d5c1c87f4dee7dfcdd4ee658b2bd91d6bff72e1d1e73",
        ),
        (
            "examples/python/basic_two_peers.py",
            "df9e3b63b7b6438209ed72bd2d77bb0626644043079b84601cc5b7173236d26a",
        ),
        (
            "examples/python/expanded_two_peers.py",
            "693b7fbd279c5ecf9ece3fee7edd81099a07aaf92e2e0c7f120a1b50c13ff86d",
        ),
        (
            "examples/python/partial_md_example.py",
            "9ab8d1fd40b8ee92cb1dc293e96a2f08350b52a4459eb816dd86304bfa3ff954",
        ),
    ],
};

const USAGE: &str = "cargo xtask nixl-tests [--source DIR] [--engine ours|nixl|both]";

/// NIXL's examples call `torch.set_default_device("cpu")`, which torch 2 added; Debian 12's
/// torch is 1.13. Put first on `PYTHONPATH`, this adds it for the CPU (already torch 1's
/// default device) and refuses any other device, so that the examples run as written.
const TORCH_CPU_DEFAULT: &str = r#"import torch

if not hasattr(torch, "set_default_device"):

    def set_default_device(device):
        if str(device) != "cpu":
            raise RuntimeError(f"torch {torch.__version__} has no set_default_device({device!r})")

    torch.set_default_device = set_default_device
"#;

/// One node: NIXL's API tests, then its partial-metadata example (which deletes
/// `NIXL_ETCD_ENDPOINTS` from its environment, so the variable must exist).
const ONE_NODE: &str = r#"set -u
export PYTHONPATH="$NIXL_PATH" PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
cd "$NIXL_TESTS/test/python"
timeout 900 /usr/bin/python3 -m pytest -v -p no:cacheprovider test_nixl_api.py || exit 1
cd "$NIXL_TESTS/examples/python"
NIXL_ETCD_ENDPOINTS= timeout 300 /usr/bin/python3 partial_md_example.py > /tmp/partial.log 2>&1
rc=$?
cat /tmp/partial.log
[ "$rc" = 0 ] && grep -q "Test Complete" /tmp/partial.log && grep -q "Correct exception" /tmp/partial.log
"#;

/// Two nodes: each two-peer example, the target on node a, the initiator on node b once the
/// target listens.
const TWO_NODES: &str = r#"set -u
export PYTHONPATH="$NIXL_PATH" PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
cd "$NIXL_TESTS/examples/python"
for ex in basic_two_peers expanded_two_peers; do
  if [ "$NODE" = a ]; then
    timeout 600 /usr/bin/python3 "$ex.py" --mode target --ip "$LOCAL_ADDR" --port 5555 > /tmp/$ex.log 2>&1
  else
    /usr/bin/python3 -c "
import socket, sys, time
for _ in range(1200):
    try:
        socket.create_connection(('$PEER_ADDR', 5555), 1).close(); break
    except OSError: time.sleep(0.25)
else: sys.exit('the target never listened')" || exit 1
    timeout 600 /usr/bin/python3 "$ex.py" --mode initiator --ip "$PEER_ADDR" --port 5555 > /tmp/$ex.log 2>&1
  fi
  rc=$?
  echo "=== $ex ($NODE): exit $rc"
  cat /tmp/$ex.log
  [ "$rc" = 0 ] && grep -q "Test Complete" /tmp/$ex.log || exit 1
  if [ "$NODE" = a ]; then
    # The next example's target listens on the same port: let the initiator finish first.
    sleep 3
  fi
done
"#;

struct Plan {
    source: Option<PathBuf>,
    engines: Vec<&'static str>,
}

fn parse(args: &[String]) -> Result<Plan> {
    let mut plan = Plan {
        source: None,
        engines: vec!["ours"],
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match (a.as_str(), it.next().map(String::as_str)) {
            ("--source", Some(d)) => plan.source = Some(PathBuf::from(d)),
            ("--engine", Some("ours")) => plan.engines = vec!["ours"],
            ("--engine", Some("nixl")) => plan.engines = vec!["nixl"],
            ("--engine", Some("both")) => plan.engines = vec!["ours", "nixl"],
            _ => fail!("usage: {USAGE}"),
        }
    }
    Ok(plan)
}

/// The PYTHONPATH under which `nixl` is `engine`'s: ours (the compatibility package before
/// the staged gpu_rdma) or NIXL's wheels; torch's CPU default-device shim first.
fn python_path(paths: &Paths, python: &Path, shim: &Path, engine: &str) -> Result<String> {
    let engine_path = match engine {
        "ours" => format!(
            "{}:{}",
            python.join("gpu_rdma/_nixl_compat").display(),
            python.display()
        ),
        _ => format!(
            "{}:{}",
            wheels::NIXL.fetch(paths)?.display(),
            wheels::NIXL_CU12.fetch(paths)?.display()
        ),
    };
    Ok(format!("{}:{engine_path}", shim.display()))
}

/// The command.
pub fn main(paths: &Paths, args: &[String]) -> Result<std::process::ExitCode> {
    let plan = parse(args)?;
    dmabuf_testbed::setup::packages()?;
    let python = python::stage(paths)?;
    let dir = paths.target.join("nixl-tests");
    NIXL_FILES.fetch(&dir, plan.source.as_deref())?;
    let shim = dir.join("torch-cpu-default");
    std::fs::create_dir_all(&shim).map_err(|e| format!("create {}: {e}", shim.display()))?;
    sh::write(&shim.join("sitecustomize.py"), TORCH_CPU_DEFAULT)?;
    let (one, two) = (dir.join("one-node.sh"), dir.join("two-nodes.sh"));
    programs::write_script(&one, ONE_NODE)?;
    programs::write_script(&two, TWO_NODES)?;
    let mut failed = Vec::new();
    for engine in &plan.engines {
        let env = [
            ("NIXL_TESTS".to_string(), dir.display().to_string()),
            (
                "NIXL_PATH".to_string(),
                python_path(paths, &python, &shim, engine)?,
            ),
        ];
        info(format!(
            "NIXL's test_nixl_api.py and partial_md_example.py: engine {engine}"
        ));
        if !passed(&boot(paths, &one, 1, None, &env)?) {
            failed.push(format!("{engine}: one node"));
        }
        info(format!(
            "NIXL's two-peer examples on two nodes: engine {engine}"
        ));
        if !passed(&boot(paths, &two, 2, None, &env)?) {
            failed.push(format!("{engine}: two nodes"));
        }
    }
    if !failed.is_empty() {
        fail!("NIXL's tests failed: {}", failed.join(", "));
    }
    info("NIXL's tests and examples passed in every run");
    Ok(std::process::ExitCode::SUCCESS)
}
