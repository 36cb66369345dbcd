//! Helpers shared by the examples, so that no example copies another's code: argument
//! parsing and the out-of-band exchange of endpoints and regions over TCP.

use rdma_dmabuf::{Endpoint, RemoteRegion};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// `--name value` options and positional words.
#[derive(Debug, Default)]
pub struct Args {
    /// Positional words, in order.
    pub words: Vec<String>,
    opts: Vec<(String, String)>,
}

impl Args {
    /// Parses the process's arguments.
    pub fn from_env() -> Args {
        let mut a = Args::default();
        let mut it = std::env::args().skip(1);
        while let Some(w) = it.next() {
            match w.strip_prefix("--") {
                Some(name) => a
                    .opts
                    .push((name.to_string(), it.next().unwrap_or_default())),
                None => a.words.push(w),
            }
        }
        a
    }

    /// The value of `--name`, parsed, or `default`.
    ///
    /// # Panics
    /// Exits with a message if the value does not parse.
    pub fn get<T: std::str::FromStr>(&self, name: &str, default: T) -> T {
        match self.opts.iter().rev().find(|(n, _)| n == name) {
            Some((_, v)) => v
                .parse()
                .unwrap_or_else(|_| fail(&format!("--{name}: cannot parse {v:?}"))),
            None => default,
        }
    }

    /// The value of `--name` as text, if given.
    pub fn text(&self, name: &str) -> Option<String> {
        self.opts
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }
}

/// Prints `msg` and exits with status 1.
pub fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1)
}

/// A TCP side channel to the peer, for endpoints, regions and barriers.
#[derive(Debug)]
pub struct SideChannel(TcpStream);

impl SideChannel {
    /// Accepts one peer on `addr:port`.
    ///
    /// # Errors
    /// I/O errors.
    pub fn serve(addr: &str, port: u16) -> std::io::Result<SideChannel> {
        let l = TcpListener::bind((addr, port))?;
        let (s, _) = l.accept()?;
        Ok(SideChannel(s))
    }

    /// Connects to `addr:port`, retrying for up to `wait` while the server starts.
    ///
    /// # Errors
    /// The last connection error.
    pub fn connect(addr: &str, port: u16, wait: Duration) -> std::io::Result<SideChannel> {
        let deadline = Instant::now() + wait;
        loop {
            match TcpStream::connect((addr, port)) {
                Ok(s) => return Ok(SideChannel(s)),
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Bounds every receive to `limit` (default: wait as long as it takes).
    ///
    /// # Errors
    /// I/O errors.
    pub fn with_timeout(self, limit: Duration) -> std::io::Result<SideChannel> {
        self.0.set_read_timeout(Some(limit))?;
        Ok(self)
    }

    /// Sends `mine`, receives the peer's message.
    ///
    /// # Errors
    /// I/O errors.
    pub fn swap(&mut self, mine: &[u8]) -> std::io::Result<Vec<u8>> {
        self.0.write_all(&(mine.len() as u32).to_le_bytes())?;
        self.0.write_all(mine)?;
        let mut len = [0u8; 4];
        self.0.read_exact(&mut len)?;
        let mut theirs = vec![0u8; u32::from_le_bytes(len) as usize];
        self.0.read_exact(&mut theirs)?;
        Ok(theirs)
    }

    /// Exchanges endpoints and (optionally) a region each.
    ///
    /// # Errors
    /// I/O errors, or the peer's bytes do not parse.
    pub fn exchange(
        &mut self,
        ep: Endpoint,
        region: Option<RemoteRegion>,
    ) -> Result<(Endpoint, Option<RemoteRegion>), Box<dyn std::error::Error>> {
        let mut mine = ep.to_bytes().to_vec();
        if let Some(r) = region {
            mine.extend_from_slice(&r.to_bytes());
        }
        let theirs = self.swap(&mine)?;
        let (e, r) = theirs.split_at(Endpoint::WIRE_LEN.min(theirs.len()));
        let ep = Endpoint::from_bytes(e)?;
        let region = if r.is_empty() {
            None
        } else {
            Some(RemoteRegion::from_bytes(r)?)
        };
        Ok((ep, region))
    }
}
