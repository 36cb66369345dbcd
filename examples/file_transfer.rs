//! The classic RDMA file transfer, into a GPU buffer, in chunks.
//!
//! 1. The sender connects (rdma_cm) with the file's length and SHA-256 in the request.
//! 2. The receiver answers with `(addr, len, rkey)` of a dma-buf region on its GPU.
//! 3. For each chunk, the sender RDMA-writes it into the region and sends `CHUNK`; the
//!    receiver deregisters the region (the sender's rkey dies, so nothing can change the bytes
//!    now), hashes the chunk through the dma-buf mapping, appends it to `--out`, registers
//!    again and sends `READY` with the new rkey.
//! 4. The sender sends `DONE`; the receiver compares the hashes and answers good or bad.
//! 5. After a good transfer, the sender sends an id and receives a key back (derived from the
//!    id and the file's hash).
//!
//! ```text
//! file_transfer receive [--bind ADDR] [--out PATH] [options]
//! file_transfer send SERVER_ADDR FILE [--id TEXT] [options]
//! ```
//!
//! Exit status 0 when the receiver found the hash good, 1 otherwise.

use examples::gpu::{self, Where};
use examples::report::{bytes, line, rate};
use examples::{fail, host_region, net, Args};
use rdma_dmabuf::{
    Access, CmListener, DmaBuf, HostBuffer, Local, MemoryRegion, Pending, ProtectionDomain,
    QueuePair, QueuePairBuilder, RemoteRegion,
};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

const USAGE: &str = "\
usage: file_transfer receive [--bind ADDR] [--out PATH] [options]
       file_transfer send SERVER_ADDR FILE [--id TEXT] [options]

options:
  --port N          rdma_cm port (default 18516)
  --timeout SECS    give up after this long without progress (default 60)
receive:
  --bind ADDR       address to listen on (default: the RDMA device's RoCEv2 IPv4 address)
  --rdma DEV        the RDMA device to listen on when --bind is not given
  --out PATH        where to write the file (default: only hash it)
  --region BYTES    the GPU region's size, the chunk size (default 1M)
  --drm PATH        DRM node for the region (default: the first GPU, else vgem)
send:
  --id TEXT         the id to trade for a key at the end (default: the file's name)
  --flip-byte N     for testing: send byte N of the file altered (the receiver must say bad)";

/// Messages after the connection, each in one fixed-size SEND.
#[derive(Debug, PartialEq)]
enum Msg {
    /// Sender: a chunk of `len` bytes was written into the region.
    Chunk { len: u64 },
    /// Receiver: the region is free again, under this rkey.
    Ready(RemoteRegion),
    /// Sender: the whole file was written.
    Done,
    /// Receiver: the hash matched (or not).
    Verdict { good: bool },
    /// Sender: the id to trade for a key.
    Id(Vec<u8>),
    /// Receiver: the key for that id.
    Key([u8; 32]),
}

const MSG_LEN: usize = 64;

impl Msg {
    fn encode(&self, out: &mut [u8]) {
        out.fill(0);
        let (tag, body): (u8, Vec<u8>) = match self {
            Msg::Chunk { len } => (1, len.to_le_bytes().to_vec()),
            Msg::Ready(r) => (2, r.to_bytes().to_vec()),
            Msg::Done => (3, Vec::new()),
            Msg::Verdict { good } => (4, vec![u8::from(*good)]),
            Msg::Id(id) => (5, [&[id.len() as u8][..], id].concat()),
            Msg::Key(k) => (6, k.to_vec()),
        };
        out[0] = tag;
        out[1..1 + body.len()].copy_from_slice(&body);
    }

    fn decode(b: &[u8]) -> Option<Msg> {
        let body = b.get(1..MSG_LEN)?;
        Some(match b[0] {
            1 => Msg::Chunk {
                len: u64::from_le_bytes(body[..8].try_into().ok()?),
            },
            2 => Msg::Ready(RemoteRegion::from_bytes(&body[..RemoteRegion::WIRE_LEN]).ok()?),
            3 => Msg::Done,
            4 => Msg::Verdict { good: body[0] == 1 },
            5 => Msg::Id(body.get(1..1 + usize::from(body[0]))?.to_vec()),
            6 => Msg::Key(body[..32].try_into().ok()?),
            _ => return None,
        })
    }
}

/// The longest id that fits a message.
const MAX_ID: usize = MSG_LEN - 2;

/// The connect request: magic, file length, SHA-256.
fn hello(len: u64, hash: &[u8; 32]) -> Vec<u8> {
    [&b"FT\x01"[..], &len.to_le_bytes(), hash].concat()
}

fn parse_hello(b: &[u8]) -> Option<(u64, [u8; 32])> {
    if b.len() != 3 + 8 + 32 || &b[..3] != b"FT\x01" {
        return None;
    }
    Some((
        u64::from_le_bytes(b[3..11].try_into().ok()?),
        b[11..].try_into().ok()?,
    ))
}

/// The key the receiver hands out for `id`: SHA-256 over a label, the id and the file's hash.
fn key_for(id: &[u8], file_hash: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"file_transfer key\0");
    h.update(id);
    h.update(file_hash);
    h.finalize().into()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A queue pair with one message buffer for sending and one receive always posted.
struct Messenger<'q> {
    qp: &'q QueuePair,
    out: Option<MemoryRegion<HostBuffer>>,
    inbox: Option<Pending<'q, HostBuffer>>,
    timeout: Duration,
}

impl<'q> Messenger<'q> {
    fn new(qp: &'q QueuePair, pd: &Arc<ProtectionDomain>, timeout: Duration) -> Messenger<'q> {
        let inbox = qp
            .post_recv(host_region(pd, MSG_LEN, Access::LOCAL_WRITE))
            .unwrap_or_else(|e| fail(&e.to_string()));
        Messenger {
            qp,
            out: Some(host_region(pd, MSG_LEN, Access::empty())),
            inbox: Some(inbox),
            timeout,
        }
    }

    fn send(&mut self, m: &Msg) {
        let mut out = self
            .out
            .take()
            .expect("the message buffer is ours between sends");
        m.encode(&mut out.bytes_mut().expect("local buffer")[..MSG_LEN]);
        let done = self
            .qp
            .post_send(Local::new(out, 0..MSG_LEN as u64), None)
            .unwrap_or_else(|e| fail(&e.to_string()))
            .spin()
            .unwrap_or_else(|e| fail(&e.to_string()));
        self.out = Some(done.region);
    }

    /// The next message; the receive is posted again at once.
    fn recv(&mut self) -> Msg {
        let got = self
            .inbox
            .take()
            .expect("a receive is always posted")
            .spin_timeout(self.timeout)
            .unwrap_or_else(|_| fail("the peer went quiet"))
            .unwrap_or_else(|e| fail(&format!("receive: {e}")));
        let msg = Msg::decode(&got.region.bytes().expect("local buffer")[..MSG_LEN])
            .unwrap_or_else(|| fail("the peer sent a message this program does not know"));
        self.inbox = Some(
            self.qp
                .post_recv(got.region)
                .unwrap_or_else(|e| fail(&e.to_string())),
        );
        msg
    }
}

fn main() {
    let args = Args::parse(
        USAGE,
        &[
            "port",
            "timeout",
            "bind",
            "rdma",
            "out",
            "region",
            "drm",
            "id",
            "flip-byte",
        ],
    );
    let port: u16 = args.get("port", 18516);
    let timeout = Duration::from_secs(args.get("timeout", 60));
    match args.words.first().map(String::as_str) {
        Some("receive") => receive(&args, port, timeout),
        Some("send") => send(&args, port, timeout),
        _ => fail(&format!("the first word is receive or send\n\n{USAGE}")),
    }
}

fn receive(args: &Args, port: u16, timeout: Duration) {
    println!("file_transfer receive");
    let addr = net::listen_addr(args.text("bind"), args.text("rdma")).unwrap_or_else(|e| fail(&e));
    let region_len = args.size("region", 1 << 20);
    if region_len == 0 {
        fail("--region must be at least one byte");
    }
    let (_alloc, dmabuf) = gpu::allocate_or_exit(
        args.text("drm").as_deref(),
        region_len,
        Where::Auto,
        "GPU region",
    );
    let mut out = args.text("out").map(|p| {
        std::fs::File::create(&p).unwrap_or_else(|e| fail(&format!("cannot create {p}: {e}")))
    });

    let at = SocketAddr::new(addr, port);
    let listener = CmListener::bind(at).unwrap_or_else(|e| fail(&e.to_string()));
    let ctx = listener.context().unwrap_or_else(|e| fail(&e.to_string()));
    line("RDMA device", format!("{}, listening on {at}", ctx.name()));
    let pd = ProtectionDomain::new(&ctx).unwrap_or_else(|e| fail(&e.to_string()));
    let register = |dmabuf: DmaBuf| {
        MemoryRegion::register_dmabuf(
            &pd,
            dmabuf,
            0,
            region_len,
            None,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap_or_else(|e| fail(&e.to_string()))
    };
    let mut region = register(dmabuf);
    let announce = region.remote().expect("remotely writable").to_bytes();
    let (qp, request) = listener
        .accept(QueuePairBuilder::new(&pd), &announce, timeout)
        .unwrap_or_else(|e| fail(&e.to_string()));
    let (len, want) = parse_hello(&request)
        .unwrap_or_else(|| fail("the connect request is not a file_transfer hello"));
    line(
        "incoming",
        format!("{} with SHA-256 {}", bytes(len), hex(&want)),
    );
    let mut m = Messenger::new(&qp, &pd, timeout);
    let mut hash = Sha256::new();
    let (mut received, mut chunks, mut rereg) = (0u64, 0u32, Duration::ZERO);
    let mut chunk = Vec::new();
    loop {
        match m.recv() {
            Msg::Chunk { len: n } if n <= region_len && received + n <= len => {
                let t = Instant::now();
                // Deregistering revokes the sender's rkey before the CPU reads the chunk.
                let mut dmabuf = region.into_inner().unwrap_or_else(|e| fail(&e.to_string()));
                // Copied out of the mapping (volatile reads into `chunk`), never a slice of it.
                chunk.resize(n as usize, 0);
                dmabuf
                    .map()
                    .and_then(|map| map.read()?.read_at(0, &mut chunk))
                    .unwrap_or_else(|e| fail(&e.to_string()));
                hash.update(&chunk);
                if let Some(f) = out.as_mut() {
                    f.write_all(&chunk)
                        .unwrap_or_else(|e| fail(&format!("--out: {e}")));
                }
                region = register(dmabuf);
                rereg += t.elapsed();
                received += n;
                chunks += 1;
                m.send(&Msg::Ready(region.remote().expect("remotely writable")));
            }
            Msg::Chunk { len: n } => fail(&format!(
                "a chunk of {n} bytes does not fit (region {region_len}, {received} of {len} \
                 received)"
            )),
            Msg::Done => break,
            other => fail(&format!("unexpected {other:?} during the transfer")),
        }
    }
    let got: [u8; 32] = hash.finalize().into();
    let good = received == len && got == want;
    line(
        "received",
        format!(
            "{} in {chunks} chunks; unmapping, hashing and re-registering took {:.1} ms in all",
            bytes(received),
            rereg.as_secs_f64() * 1e3
        ),
    );
    line(
        "hash",
        format!(
            "{} {}",
            hex(&got),
            if good {
                "matches: good"
            } else {
                "differs: bad"
            }
        ),
    );
    m.send(&Msg::Verdict { good });
    if !good {
        let _ = qp.wait_disconnected(timeout);
        println!("RESULT receive good=no bytes={received} chunks={chunks}");
        std::process::exit(1);
    }
    match m.recv() {
        Msg::Id(id) => {
            let key = key_for(&id, &got);
            line(
                "key",
                format!("{} for id {:?}", hex(&key), String::from_utf8_lossy(&id)),
            );
            m.send(&Msg::Key(key));
        }
        other => fail(&format!("expected an id, got {other:?}")),
    }
    let _ = qp.wait_disconnected(timeout);
    println!("RESULT receive good=yes bytes={received} chunks={chunks}");
}

fn send(args: &Args, port: u16, timeout: Duration) {
    println!("file_transfer send");
    let (server, path) = match &args.words[1..] {
        [s, p] => (s, p),
        _ => fail("send needs SERVER_ADDR and FILE"),
    };
    let server = SocketAddr::new(
        server
            .parse()
            .unwrap_or_else(|_| fail(&format!("{server:?} is not an IP address"))),
        port,
    );
    let id = args.text("id").unwrap_or_else(|| {
        std::path::Path::new(path)
            .file_name()
            .map_or("file".into(), |n| n.to_string_lossy().into_owned())
    });
    if id.len() > MAX_ID {
        fail(&format!("--id is {} bytes; at most {MAX_ID}", id.len()));
    }
    let flip: Option<u64> = args.text("flip-byte").map(|_| args.get("flip-byte", 0));
    let mut file =
        std::fs::File::open(path).unwrap_or_else(|e| fail(&format!("cannot open {path}: {e}")));
    let len = file
        .metadata()
        .unwrap_or_else(|e| fail(&format!("{path}: {e}")))
        .len();
    let mut h = Sha256::new();
    std::io::copy(&mut file, &mut h).unwrap_or_else(|e| fail(&format!("reading {path}: {e}")));
    let hash: [u8; 32] = h.finalize().into();
    line(
        "file",
        format!("{path}: {}, SHA-256 {}", bytes(len), hex(&hash)),
    );

    let pd = net::pd_towards(server, timeout).unwrap_or_else(|e| fail(&e.to_string()));
    line(
        "RDMA device",
        format!("{} (rdma_cm's route to {server})", pd.context().name()),
    );
    let (qp, reply) = net::connect(
        server,
        || QueuePairBuilder::new(&pd),
        &hello(len, &hash),
        timeout,
    )
    .unwrap_or_else(|e| fail(&e.to_string()));
    let mut remote = RemoteRegion::from_bytes(&reply).unwrap_or_else(|e| fail(&e.to_string()));
    line(
        "connected",
        format!(
            "receiver's GPU region: {} at iova {:#x}, rkey {:#x}",
            bytes(remote.len),
            remote.addr,
            remote.rkey
        ),
    );
    let mut m = Messenger::new(&qp, &pd, timeout);
    let chunk = remote.len;
    let mut staging = Some(host_region(&pd, chunk as usize, Access::empty()));
    let mut file =
        std::fs::File::open(path).unwrap_or_else(|e| fail(&format!("cannot open {path}: {e}")));
    let start = Instant::now();
    let (mut sent, mut chunks) = (0u64, 0u32);
    while sent < len {
        let n = chunk.min(len - sent);
        let mut src = staging.take().expect("the staging buffer is back");
        let buf = &mut src.bytes_mut().expect("local buffer")[..n as usize];
        file.read_exact(buf)
            .unwrap_or_else(|e| fail(&format!("reading {path}: {e}")));
        if let Some(at) = flip.filter(|at| (sent..sent + n).contains(at)) {
            buf[(at - sent) as usize] ^= 0xff;
        }
        let target = remote.slice(0, n).unwrap_or_else(|e| fail(&e.to_string()));
        let done = qp
            .post_write(Local::new(src, 0..n), target, None)
            .unwrap_or_else(|e| fail(&e.to_string()))
            .spin()
            .unwrap_or_else(|e| fail(&e.to_string()));
        staging = Some(done.region);
        m.send(&Msg::Chunk { len: n });
        match m.recv() {
            Msg::Ready(r) => remote = r,
            other => fail(&format!("expected READY, got {other:?}")),
        }
        sent += n;
        chunks += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    line(
        "sent",
        format!(
            "{} in {chunks} chunks of up to {}: {}",
            bytes(sent),
            bytes(chunk),
            rate(sent, secs)
        ),
    );
    m.send(&Msg::Done);
    let good = match m.recv() {
        Msg::Verdict { good } => good,
        other => fail(&format!("expected a verdict, got {other:?}")),
    };
    line(
        "verdict",
        if good {
            "good"
        } else {
            "bad: no key is given for it"
        },
    );
    if !good {
        println!("RESULT send good=no bytes={sent} chunks={chunks}");
        std::process::exit(1);
    }
    m.send(&Msg::Id(id.clone().into_bytes()));
    let key = match m.recv() {
        Msg::Key(k) => k,
        other => fail(&format!("expected a key, got {other:?}")),
    };
    line("key", format!("{} for id {id:?}", hex(&key)));
    drop(m);
    drop(qp);
    println!(
        "RESULT send good=yes bytes={sent} chunks={chunks} key={}",
        hex(&key)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let r = RemoteRegion {
            addr: 0,
            len: 4096,
            rkey: 7,
        };
        for m in [
            Msg::Chunk { len: 123 },
            Msg::Ready(r),
            Msg::Done,
            Msg::Verdict { good: true },
            Msg::Id(b"report.pdf".to_vec()),
            Msg::Key([9; 32]),
        ] {
            let mut b = [0u8; MSG_LEN];
            m.encode(&mut b);
            assert_eq!(Msg::decode(&b), Some(m));
        }
        assert_eq!(parse_hello(&hello(5, &[1; 32])), Some((5, [1; 32])));
    }
}
