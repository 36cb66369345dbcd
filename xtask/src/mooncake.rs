//! `cargo xtask mooncake-tests`: Mooncake's own transfer-engine tests
//! (`mooncake-wheel/tests/transfer_engine_target.py` and `transfer_engine_initiator_test.py`,
//! pinned by tag and SHA-256) run unchanged in the two-node testbed over patched rxe
//! (`PROTOCOL=rdma`), the target on node a and the initiator on node b, against our
//! `mooncake.engine` (gpu_rdma's compatibility package) or Mooncake's own (the pinned wheel),
//! with peers found by address (`P2PHANDSHAKE`), through our HTTP metadata server or through
//! Mooncake's. The tests are fetched at run time (or read from a Mooncake checkout) into
//! `target/mooncake-tests`, never committed: they are Mooncake's code.

use crate::pinned::{passed, Pinned};
use dmabuf_testbed::sh::Result;
use dmabuf_testbed::ui::info;
use dmabuf_testbed::{fail, programs, wheels};
use gpu_rdma_bench::workspace::Paths;
use gpu_rdma_bench::workspace::{boot, python};
use std::path::{Path, PathBuf};

/// Mooncake's two test files at the tag whose tests are run: the files are the same from it
/// through Mooncake's main branch of August 2026 (the pinned wheel is 0.3.13.post1).
const MOONCAKE_FILES: Pinned = Pinned {
    repo: "kvcache-ai/Mooncake",
    tag: "v0.3.12.post1",
    files: &[
        (
            "mooncake-wheel/tests/transfer_engine_target.py",
            "e610527887bd47dcd93b094ea3769920fc342f06bc6cd08ea55921c68eb6ef48",
        ),
        (
            "mooncake-wheel/tests/transfer_engine_initiator_test.py",
            "ed9ed0a67b8aa9282c0c876938ae9c399b8bcd0c3a2c356c6023815d51163118",
        ),
    ],
};

/// Guest memory per node without `--memory`: Mooncake's own engine registers a 2 GiB buffer
/// pool, which the default 2 GiB guests cannot pin.
const MEMORY_MIB: &str = "8192";

const USAGE: &str = "cargo xtask mooncake-tests [--source DIR] [--engine ours|mooncake|both] \
                     [--metadata p2p|ours|mooncake|all] [--memory MIB]";

/// Runs on both nodes: node a the target (and a metadata server), node b the initiator's
/// unittest run, which reports its status back to node a.
const RUN: &str = r#"set -u
T="$MC_TESTS"
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PROTOCOL=rdma
if [ "$NODE" = a ]; then A="$LOCAL_ADDR"; else A="$PEER_ADDR"; fi
if [ -n "$MC_SERVER_PATH" ]; then
  export MC_METADATA_SERVER="http://$A:18900/metadata"
else
  export MC_METADATA_SERVER=P2PHANDSHAKE
fi
export TARGET_SERVER_NAME="$A:12345"
cd /tmp
if [ "$NODE" = a ]; then
  if [ -n "$MC_SERVER_PATH" ]; then
    PYTHONPATH="$MC_SERVER_PATH" /usr/bin/python3 -m mooncake.http_metadata_server --host "$A" --port 18900 --log-level WARNING &
    srv=$!
    /usr/bin/python3 -c "
import socket, sys, time
for _ in range(600):
    try:
        socket.create_connection(('$A', 18900), 1).close(); break
    except OSError: time.sleep(0.2)
else: sys.exit('the metadata server never listened')" || exit 1
  fi
  PYTHONPATH="$MC_ENGINE_PATH" timeout 1500 /usr/bin/python3 "$T/transfer_engine_target.py" > /tmp/target.log 2>&1 &
  tgt=$!
  n=0
  until grep -q "ready at" /tmp/target.log; do
    n=$((n + 1))
    if [ "$n" -gt 600 ] || ! kill -0 "$tgt" 2>/dev/null; then
      cat /tmp/target.log
      echo "the target never got ready"
      exit 1
    fi
    sleep 0.5
  done
  cat /tmp/target.log
  /usr/bin/python3 -c "
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('$A', 12399)); s.listen(2); s.settimeout(1500)
s.accept()[0].close()
c = s.accept()[0]; print('initiator:', c.recv(64).decode())"
  kill "$tgt"
  if [ -n "$MC_SERVER_PATH" ]; then kill "$srv"; fi
else
  export INITIATOR_SERVER_NAME="$LOCAL_ADDR:12347"
  tell() {
    /usr/bin/python3 -c "
import socket, sys, time
for _ in range(1200):
    try:
        socket.create_connection(('$A', 12399), 5).send(sys.argv[1].encode()); break
    except OSError: time.sleep(0.5)
else: sys.exit('node a never listened')" "$1"
  }
  tell ready
  cd "$T"
  PYTHONPATH="$MC_ENGINE_PATH" timeout 1500 /usr/bin/python3 -m unittest -v transfer_engine_initiator_test
  rc=$?
  tell "rc=$rc"
  exit "$rc"
fi
"#;

/// Which engines and metadata services a run covers.
struct Plan {
    source: Option<PathBuf>,
    memory: String,
    /// Whether `--metadata` was given (else Mooncake's engine skips P2P: see `main`).
    chosen: bool,
    engines: Vec<&'static str>,
    metadata: Vec<&'static str>,
}

fn parse(args: &[String]) -> Result<Plan> {
    let mut plan = Plan {
        source: None,
        memory: MEMORY_MIB.into(),
        chosen: false,
        engines: vec!["ours"],
        metadata: vec!["p2p", "ours", "mooncake"],
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().map(String::as_str);
        match (a.as_str(), v) {
            ("--source", Some(d)) => plan.source = Some(PathBuf::from(d)),
            ("--memory", Some(m)) => plan.memory = m.into(),
            ("--engine", Some("ours")) => plan.engines = vec!["ours"],
            ("--engine", Some("mooncake")) => plan.engines = vec!["mooncake"],
            ("--engine", Some("both")) => plan.engines = vec!["ours", "mooncake"],
            ("--metadata", Some("all")) => {
                plan.metadata = vec!["p2p", "ours", "mooncake"];
                plan.chosen = true;
            }
            ("--metadata", Some(m @ ("p2p" | "ours" | "mooncake"))) => {
                plan.metadata = vec![["p2p", "ours", "mooncake"]
                    .into_iter()
                    .find(|x| *x == m)
                    .expect("matched above")];
                plan.chosen = true;
            }
            _ => fail!("usage: {USAGE}"),
        }
    }
    Ok(plan)
}

/// The PYTHONPATH under which `mooncake` is `engine`'s: ours (the compatibility package
/// before the staged gpu_rdma) or the wheel's.
fn python_path(python: &Path, wheel: &Path, engine: &str) -> String {
    match engine {
        "ours" => format!(
            "{}:{}",
            python.join("gpu_rdma/_compat").display(),
            python.display()
        ),
        _ => wheel.display().to_string(),
    }
}

/// The command.
pub fn main(paths: &Paths, args: &[String]) -> Result<std::process::ExitCode> {
    let plan = parse(args)?;
    dmabuf_testbed::setup::packages()?;
    let wheel = wheels::MOONCAKE.fetch(paths)?;
    let python = python::stage(paths)?;
    let dir = paths.target.join("mooncake-tests");
    MOONCAKE_FILES.fetch(&dir, plan.source.as_deref())?;
    let tests = dir.join("mooncake-wheel/tests");
    let script = dir.join("run.sh");
    programs::write_script(&script, RUN)?;
    let mut failed = Vec::new();
    for engine in &plan.engines {
        for metadata in &plan.metadata {
            if *engine == "mooncake" && *metadata == "p2p" && !plan.chosen {
                info(
                    "Mooncake's tests: engine mooncake, metadata p2p left out: under \
                     P2PHANDSHAKE Mooncake's engine listens on a port of its own choosing, not \
                     TARGET_SERVER_NAME's, so its tests fail against it (--metadata p2p runs \
                     it anyway)",
                );
                continue;
            }
            info(format!(
                "Mooncake's tests: engine {engine}, metadata {metadata}"
            ));
            let server = match *metadata {
                "p2p" => String::new(),
                "ours" => python_path(&python, &wheel, "ours"),
                _ => wheel.display().to_string(),
            };
            let env = [
                ("MC_TESTS".to_string(), tests.display().to_string()),
                (
                    "MC_ENGINE_PATH".to_string(),
                    python_path(&python, &wheel, engine),
                ),
                ("MC_SERVER_PATH".to_string(), server),
            ];
            if !passed(&boot(paths, &script, 2, Some(&plan.memory), &env)?) {
                failed.push(format!("{engine}/{metadata}"));
            }
        }
    }
    if !failed.is_empty() {
        fail!("Mooncake's tests failed: {}", failed.join(", "));
    }
    info("Mooncake's tests passed in every run");
    Ok(std::process::ExitCode::SUCCESS)
}
