//! Out-of-band exchange over TCP, as a real application would do it: each side sends its
//! bytes and receives the peer's (the examples' side channel, with test deadlines).

use examples::SideChannel;
use std::time::Duration;

/// How long a test waits for its peer.
const LIMIT: Duration = Duration::from_secs(60);

/// Serves on `addr:port`: accepts one connection, sends `mine`, receives the peer's bytes.
///
/// # Panics
/// On any I/O error or after 60 s: the test fails.
pub fn serve(addr: &str, port: u16, mine: &[u8]) -> Vec<u8> {
    let side =
        SideChannel::serve(addr, port).unwrap_or_else(|e| panic!("serve {addr}:{port}: {e}"));
    swap(side, mine)
}

/// Connects to `addr:port` (retrying while the server starts), sends `mine`, receives the
/// server's bytes.
///
/// # Panics
/// If no connection succeeds within 60 s, or on any I/O error.
pub fn connect(addr: &str, port: u16, mine: &[u8]) -> Vec<u8> {
    let side = SideChannel::connect(addr, port, LIMIT)
        .unwrap_or_else(|e| panic!("connect {addr}:{port}: {e}"));
    swap(side, mine)
}

fn swap(side: SideChannel, mine: &[u8]) -> Vec<u8> {
    let mut side = side.with_timeout(LIMIT).expect("read timeout");
    side.swap(mine).expect("exchange with the peer")
}
