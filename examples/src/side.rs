//! The TCP side channel examples use to swap endpoints and regions when they do not use
//! rdma_cm.

use rdma_dmabuf::{Endpoint, RemoteRegion};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

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
