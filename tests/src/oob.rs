//! Out-of-band exchange over TCP, as a real application would do it: each side sends its
//! bytes and receives the peer's.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Serves on `addr:port`: accepts one connection, sends `mine`, receives as many bytes back.
///
/// # Panics
/// On any I/O error or after 60 s: the test fails.
pub fn serve(addr: &str, port: u16, mine: &[u8]) -> Vec<u8> {
    let l = TcpListener::bind((addr, port)).unwrap_or_else(|e| panic!("bind {addr}:{port}: {e}"));
    let (mut s, _) = l.accept().expect("accept");
    swap(&mut s, mine)
}

/// Connects to `addr:port` (retrying while the server starts), sends `mine`, receives the
/// server's bytes.
///
/// # Panics
/// If no connection succeeds within 60 s.
pub fn connect(addr: &str, port: u16, mine: &[u8]) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut s = loop {
        match TcpStream::connect((addr, port)) {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => panic!("connect {addr}:{port}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    swap(&mut s, mine)
}

fn swap(s: &mut TcpStream, mine: &[u8]) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    s.write_all(&(mine.len() as u32).to_le_bytes())
        .expect("send length");
    s.write_all(mine).expect("send");
    let mut len = [0u8; 4];
    s.read_exact(&mut len).expect("receive length");
    let mut theirs = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut theirs).expect("receive");
    theirs
}

/// A one-byte barrier: both sides return once the other has reached it.
pub fn barrier(s: &mut TcpStream) {
    s.write_all(&[1]).expect("barrier send");
    let mut b = [0u8; 1];
    s.read_exact(&mut b).expect("barrier receive");
}
