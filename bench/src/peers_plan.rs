//! The plan of `cargo xtask bench --peers` (`peers.rs`): its options, its cells (metadata
//! mode, operation, block, batch, threads), the rounds' steps and the plan file `peers.sh`
//! reads.

use crate::plan;
use dmabuf_testbed::fail;
use dmabuf_testbed::sh::Result;
use std::fmt::Write as _;

/// Block sizes without `--sizes`: 4 KiB to 4 MiB.
pub const BLOCKS: [u64; 6] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];
/// Batch sizes without `--batches`.
pub const BATCHES: [u64; 2] = [1, 128];
/// Submitting threads without `--threads`.
pub const THREADS: [u64; 2] = [1, 4];
/// Operations without `--ops`.
pub const OPERATIONS: [&str; 2] = ["write", "read"];
/// Every operation: the Python client (`--client python`) also submits batches and waits
/// for them (`write-async`, `read-async`).
pub const ALL_OPERATIONS: [&str; 4] = ["write", "read", "write-async", "read-async"];
/// Block sizes of the Python client without `--sizes`: 4 KiB, 64 KiB, 1 MiB.
pub const PY_BLOCKS: [u64; 3] = [4 << 10, 64 << 10, 1 << 20];
/// The metadata modes: the P2P handshake (the initiator is given the target's address) and
/// an etcd on node a that both engines publish in and look up.
pub const METADATA: [&str; 2] = ["p2p", "etcd"];
/// The most a cell's buffer (threads × batch × block, on each node) may take of a guest's
/// 2 GiB; larger cells are left out and listed.
pub const MAX_BUFFER: u64 = 512 << 20;
/// The most bytes one batch may move: under the emulator both engines move under 10 MiB/s,
/// so a batch of 128 × 4 MiB (512 MiB) takes a minute or more, and a run (an untimed batch,
/// then at least one timed) several; larger cells are left out and listed.
pub const MAX_BATCH: u64 = 128 << 20;

/// One cell of the comparison.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cell {
    /// `p2p` or `etcd`, one of [`METADATA`].
    pub meta: &'static str,
    /// `write` or `read`.
    pub op: &'static str,
    /// Bytes per block.
    pub block: u64,
    /// Blocks per batch.
    pub batch: u64,
    /// Threads submitting batches.
    pub threads: u64,
}

impl Cell {
    /// The bytes each node's buffer needs.
    pub fn buffer(&self) -> u64 {
        (self.threads * self.batch * self.block).max(1 << 20)
    }

    /// `p2p-write-64K-b128-t4`.
    pub fn name(&self) -> String {
        let b = match self.block {
            b if b % (1 << 20) == 0 => format!("{}M", b >> 20),
            b if b % (1 << 10) == 0 => format!("{}K", b >> 10),
            b => b.to_string(),
        };
        format!(
            "{}-{}-{b}-b{}-t{}",
            self.meta, self.op, self.batch, self.threads
        )
    }

    /// Why the cell is left out, if it is.
    pub fn too_large(&self) -> Option<String> {
        if self.buffer() > MAX_BUFFER {
            return Some(format!(
                "its buffer ({} MiB on each node) exceeds {} MiB of a guest's 2 GiB",
                self.buffer() >> 20,
                MAX_BUFFER >> 20
            ));
        }
        let bytes = self.batch * self.block;
        (bytes > MAX_BATCH).then(|| {
            format!(
                "a batch of {} MiB exceeds {} MiB: over a minute a batch under the emulator",
                bytes >> 20,
                MAX_BATCH >> 20
            )
        })
    }
}

/// The two engines, in the order of odd rounds.
pub const ENGINES: [&str; 2] = ["mooncake", "ours"];

/// Which programs drive the engines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Client {
    /// Mooncake's `transfer_engine_bench` and our twin, `engine_peer_bench`.
    Programs,
    /// One Python script over `TransferEngine`'s API (python/examples/mooncake_bench.py),
    /// with Mooncake's `mooncake.engine` or ours.
    Python,
}

impl Client {
    /// The word of engine `e` in the plan `peers.sh` reads.
    pub fn engine_word(self, e: usize) -> String {
        match self {
            Client::Programs => ENGINES[e].to_string(),
            Client::Python => format!("py-{}", ENGINES[e]),
        }
    }
}

/// What `--peers` was asked.
#[derive(Debug, PartialEq)]
pub struct Request {
    /// Block sizes.
    pub sizes: Vec<u64>,
    /// Batch sizes.
    pub batches: Vec<u64>,
    /// Thread counts.
    pub threads: Vec<u64>,
    /// Operations, of [`OPERATIONS`].
    pub ops: Vec<&'static str>,
    /// Metadata modes, of [`METADATA`].
    pub metadata: Vec<&'static str>,
    /// Rounds.
    pub rounds: u32,
    /// Seconds per run.
    pub duration: u32,
    /// Which programs drive the engines (`--client programs|python`).
    pub client: Client,
}

/// A list of counts from 1 to `most`, like `1,128`.
fn counts(opt: &str, v: &str, most: u64) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    for w in v.split(',').filter(|w| !w.is_empty()) {
        match w.parse::<u64>() {
            Ok(n) if (1..=most).contains(&n) => out.push(n),
            _ => fail!("{opt} {v:?}: a list of counts from 1 to {most}, like 1,128"),
        }
    }
    if out.is_empty() {
        fail!("{opt}: no count given");
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// A list of words of `of`, like `write,read`.
fn words(opt: &str, v: &str, of: &[&'static str]) -> Result<Vec<&'static str>> {
    let mut out = Vec::new();
    for w in v.split(',').filter(|w| !w.is_empty()) {
        let Some(&known) = of.iter().find(|k| **k == w) else {
            fail!("{opt} {v:?}: a list of {}", of.join(", "))
        };
        if !out.contains(&known) {
            out.push(known);
        }
    }
    if out.is_empty() {
        fail!("{opt}: nothing given");
    }
    Ok(out)
}

/// `--sizes 64K,1M`, `--batches 1,128`, `--threads 1,4`, `--ops write,read`, `--metadata
/// p2p|etcd|both` (default p2p), `--rounds N` (default 3), `--duration S` (default 5).
pub fn parse_args(args: &[String]) -> Result<Request> {
    let mut r = Request {
        sizes: BLOCKS.to_vec(),
        batches: BATCHES.to_vec(),
        threads: THREADS.to_vec(),
        ops: OPERATIONS.to_vec(),
        metadata: vec![METADATA[0]],
        rounds: 3,
        duration: 5,
        client: Client::Programs,
    };
    let (mut sized, mut opped) = (false, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |what: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{a} needs {what}"))
        };
        let count = |v: &str, most: u32| v.parse::<u32>().ok().filter(|n| (1..=most).contains(n));
        match a.as_str() {
            "--sizes" => {
                r.sizes = plan::parse_sizes(&value("a list like 64K,1M")?)?;
                sized = true;
            }
            "--client" => {
                r.client = match value("programs or python")?.as_str() {
                    "programs" => Client::Programs,
                    "python" => Client::Python,
                    v => fail!("--client {v:?}: programs or python"),
                }
            }
            "--batches" => r.batches = counts(a, &value("a list like 1,128")?, 1024)?,
            "--threads" => r.threads = counts(a, &value("a list like 1,4")?, 16)?,
            "--ops" => {
                r.ops = words(a, &value("a list like write,read")?, &ALL_OPERATIONS)?;
                opped = true;
            }
            "--metadata" => {
                let v = value("p2p, etcd or both")?;
                r.metadata = if v == "both" {
                    METADATA.to_vec()
                } else {
                    words(a, &v, &METADATA)?
                };
            }
            "--rounds" => {
                let v = value("a count")?;
                let Some(n) = count(&v, 100) else {
                    fail!("--rounds {v:?}: a count from 1 to 100")
                };
                r.rounds = n;
            }
            "--duration" => {
                let v = value("seconds")?;
                let Some(n) = count(&v, 600) else {
                    fail!("--duration {v:?}: seconds from 1 to 600")
                };
                r.duration = n;
            }
            other => fail!(
                "unknown option of bench --peers {other:?} (--sizes 64K,1M, --batches 1,128, \
                 --threads 1,4, --ops write,read, --metadata p2p|etcd|both, --rounds N, \
                 --duration S, --client programs|python)"
            ),
        }
    }
    if r.client == Client::Python {
        if !sized {
            r.sizes = PY_BLOCKS.to_vec();
        }
        if !opped {
            r.ops = ALL_OPERATIONS.to_vec();
        }
    } else if let Some(op) = r.ops.iter().find(|o| o.ends_with("-async")) {
        fail!(
            "--ops {op}: only the Python client submits batches asynchronously (--client python)"
        );
    }
    Ok(r)
}

/// The cells asked (operation, then block, batch, threads, metadata mode), and those left out
/// (as [`Cell::too_large`] says).
pub fn cells(req: &Request) -> (Vec<Cell>, Vec<Cell>) {
    let mut all = Vec::new();
    for &op in &req.ops {
        for &block in &req.sizes {
            for &batch in &req.batches {
                for &threads in &req.threads {
                    for &meta in &req.metadata {
                        all.push(Cell {
                            meta,
                            op,
                            block,
                            batch,
                            threads,
                        });
                    }
                }
            }
        }
    }
    all.into_iter().partition(|c| c.too_large().is_none())
}

/// One run of one engine in one cell.
#[derive(Debug, PartialEq)]
pub struct Step {
    /// `p2p-write-64K-b128-t4-ours-r2`.
    pub id: String,
    /// Its index in the cells.
    pub cell: usize,
    /// An index into [`ENGINES`].
    pub engine: usize,
    /// From 1.
    pub round: u32,
}

/// Every round's steps: each cell both engines, Mooncake first in odd rounds.
pub fn steps(cells: &[Cell], rounds: u32) -> Vec<Step> {
    let mut out = Vec::new();
    for round in 1..=rounds {
        for (i, c) in cells.iter().enumerate() {
            let order = if round % 2 == 1 { [0, 1] } else { [1, 0] };
            for engine in order {
                out.push(Step {
                    id: format!("{}-{}-r{round}", c.name(), ENGINES[engine]),
                    cell: i,
                    engine,
                    round,
                });
            }
        }
    }
    out
}

/// Seconds that bound a step's target start and its initiator's run each: the duration, 90 s
/// for starting the programs and connecting, and a second per MiB of a batch (the untimed
/// first batch, and the last one that may end after the duration).
pub fn limit(duration: u32, c: &Cell) -> u64 {
    u64::from(duration) + 90 + ((c.batch * c.block) >> 20)
}

/// The plan `peers.sh` runs (its header says the format).
pub fn plan_text(cells: &[Cell], steps: &[Step], duration: u32, client: Client) -> String {
    let mut t =
        String::from("# ID N LIMIT ENGINE META OPERATION BLOCK BATCH THREADS DURATION BUFFER\n");
    for (n, s) in steps.iter().enumerate() {
        let c = &cells[s.cell];
        let _ = writeln!(
            t,
            "{} {n} {} {} {} {} {} {} {} {duration} {}",
            s.id,
            limit(duration, c),
            client.engine_word(s.engine),
            c.meta,
            c.op,
            c.block,
            c.batch,
            c.threads,
            c.buffer()
        );
    }
    t
}
