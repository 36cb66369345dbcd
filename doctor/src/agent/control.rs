//! The agent's control port: free to bind at its bind address, and reached at the address
//! peers would use, while the doctor holds a listener there.

use crate::{Check, Status};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

const SECTION: &str = "control";

/// How long the connection to the control address, and its arrival, may take.
const CONNECT: Duration = Duration::from_secs(2);

/// `EADDRINUSE (Address already in use)`: the errno's name and text, or the error as it is
/// when it carries no errno.
pub(super) fn errno_text(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => format!(
            "{:?} ({})",
            nix::errno::Errno::from_raw(n),
            io::Error::from_raw_os_error(n)
                .to_string()
                .split(" (os error")
                .next()
                .unwrap_or_default()
        ),
        None => e.to_string(),
    }
}

/// The control port's checks: free to bind at `bind`, and reached at the address peers
/// would use (`card_ips`: the agent's devices with an IPv4 GID, in order, for a `bind` of
/// `0.0.0.0`); with `etcd`, an unspecified `bind` fails, as the etcd backend refuses it.
pub(super) fn checks(bind: SocketAddr, card_ips: &[(String, Ipv4Addr)], etcd: bool) -> Vec<Check> {
    let mut out = Vec::new();
    let listener = match TcpListener::bind(bind) {
        Ok(l) => l,
        Err(e) => {
            out.push(bind_failed(bind, &e));
            if let Some(peers) = peer_address(bind, card_ips) {
                out.push(Check {
                    section: SECTION,
                    name: "control address".into(),
                    status: Status::Warn,
                    found: format!(
                        "not tried: the doctor could not listen at {bind} (above); peers would \
                         use {} ({})",
                        peers.0, peers.1
                    ),
                    fix: None,
                    problem: None,
                });
            }
            return out;
        }
    };
    let bound = listener.local_addr().unwrap_or(bind);
    out.push(Check::ok(
        SECTION,
        format!("control port {bind}"),
        if bind.port() == 0 {
            format!(
                "free: port 0, so the kernel picks a free port when the agent starts (the \
                 doctor got {})",
                bound.port()
            )
        } else {
            format!("free: the doctor bound {bound}")
        },
    ));
    out.push(reach(&listener, bound, card_ips));
    if etcd && bind.ip().is_unspecified() {
        let example = peer_address(bound, card_ips)
            .map(|(a, _)| format!(", e.g. --bind {}:{}", a.ip(), bind.port()))
            .unwrap_or_default();
        out.push(Check {
            section: SECTION,
            name: "control address for etcd".into(),
            status: Status::Fail,
            found: format!(
                "bound to {bind}: the etcd backend publishes the listener's own address and \
                 refuses an unspecified one"
            ),
            fix: Some(format!(
                "bind the agent to an address its peers reach (Settings::bind){example}"
            )),
            problem: None,
        });
    }
    out
}

/// The finding for a bind that failed, by its errno.
fn bind_failed(bind: SocketAddr, e: &io::Error) -> Check {
    let port = bind.port();
    let fix = match e.raw_os_error() {
        Some(libc::EADDRINUSE) => format!(
            "another agent or program listens on {bind}: pick another port (--bind, \
             Settings::bind) or stop it (`ss -ltnp 'sport = :{port}'` names it)"
        ),
        Some(libc::EADDRNOTAVAIL) => format!(
            "{} is not an address of this host: bind one of its addresses (`ip -br addr`) or \
             0.0.0.0",
            bind.ip()
        ),
        Some(libc::EACCES) => format!(
            "ports below 1024 need root or CAP_NET_BIND_SERVICE: pick a port of 1024 or more \
             (port {port} asked)"
        ),
        _ => format!("bind the agent to another address (--bind, Settings::bind) than {bind}"),
    };
    Check {
        section: SECTION,
        name: format!("control port {bind}"),
        status: Status::Fail,
        found: format!("cannot bind {bind}: {}", errno_text(e)),
        fix: Some(fix),
        problem: None,
    }
}

/// The address peers would use for a listener at `bound`, and why: the engine's card rule.
fn peer_address(
    bound: SocketAddr,
    card_ips: &[(String, Ipv4Addr)],
) -> Option<(SocketAddr, String)> {
    if !bound.ip().is_unspecified() {
        return Some((bound, "the bound address".into()));
    }
    card_ips.first().map(|(dev, ip)| {
        (
            SocketAddr::new(IpAddr::V4(*ip), bound.port()),
            format!(
                "bound to {}, so the IPv4 address of {dev}'s RoCE v2 GID",
                bound.ip()
            ),
        )
    })
}

/// Connects to the address peers would use for `listener` (bound at `bound`) and checks that
/// the connection arrives at it.
fn reach(listener: &TcpListener, bound: SocketAddr, card_ips: &[(String, Ipv4Addr)]) -> Check {
    let name = "control address";
    let Some((peers, why)) = peer_address(bound, card_ips) else {
        return Check {
            section: SECTION,
            name: name.into(),
            status: Status::Fail,
            found: format!(
                "bound to {}, and no device of the agent has a RoCE v2 IPv4 GID to give peers \
                 instead",
                bound.ip()
            ),
            fix: Some(
                "bind the agent to an address its peers reach (--bind IP:PORT, Settings::bind)"
                    .into(),
            ),
            problem: None,
        };
    };
    let fail = |found: String| Check {
        section: SECTION,
        name: name.into(),
        status: Status::Fail,
        found,
        fix: Some(format!(
            "peers connect to {peers}: make it an address of this host that they reach (bind \
             the agent to it with --bind, Settings::bind), and let the port through any firewall"
        )),
        problem: None,
    };
    let stream = match TcpStream::connect_timeout(&peers, CONNECT) {
        Ok(s) => s,
        Err(e) => return fail(format!("connecting to {peers} ({why}): {}", errno_text(&e))),
    };
    let arrived = arrival(listener, stream.local_addr().ok());
    match arrived {
        Ok(true) => Check::ok(
            SECTION,
            name,
            format!(
                "peers would connect to {peers} ({why}); a connection to it from this host \
                 arrived at the doctor's listener"
            ),
        ),
        Ok(false) => fail(format!(
            "a connection to {peers} ({why}) was accepted, but not by the doctor's listener at \
             {bound}: another program answers there"
        )),
        Err(e) => fail(format!(
            "a connection to {peers} ({why}) was made, but the doctor's listener at {bound} \
             did not see it: {}",
            errno_text(&e)
        )),
    }
}

/// Whether the connection from `from` arrives at `listener` within [`CONNECT`].
fn arrival(listener: &TcpListener, from: Option<SocketAddr>) -> io::Result<bool> {
    listener.set_nonblocking(true)?;
    let t0 = Instant::now();
    loop {
        match listener.accept() {
            Ok((_, peer)) if Some(peer) == from => return Ok(true),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if t0.elapsed() > CONNECT {
                    return Ok(false);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_text_names_the_errno() {
        let e = io::Error::from_raw_os_error(libc::EADDRINUSE);
        assert_eq!(errno_text(&e), "EADDRINUSE (Address already in use)");
    }

    #[test]
    fn a_taken_port_fails_with_eaddrinuse_and_the_hint() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let bind = l.local_addr().unwrap();
        let c = checks(bind, &[], false);
        assert_eq!(c[0].status, Status::Fail, "{c:#?}");
        assert!(c[0].found.contains("EADDRINUSE"), "{c:#?}");
        assert!(
            c[0].fix
                .as_deref()
                .unwrap_or("")
                .contains("another agent or program listens"),
            "{c:#?}"
        );
        assert_eq!(c[1].status, Status::Warn, "{c:#?}");
    }

    #[test]
    fn a_free_loopback_port_is_bound_and_reached() {
        let c = checks("127.0.0.1:0".parse().unwrap(), &[], false);
        assert!(c.iter().all(|c| c.status == Status::Ok), "{c:#?}");
        assert!(
            c[1].found.contains("arrived at the doctor's listener"),
            "{c:#?}"
        );
    }

    #[test]
    fn any_address_is_reached_at_the_first_device_with_an_ipv4_gid() {
        let ips = [("rxe0".to_string(), Ipv4Addr::LOCALHOST)];
        let c = checks("0.0.0.0:0".parse().unwrap(), &ips, false);
        assert!(c.iter().all(|c| c.status == Status::Ok), "{c:#?}");
        assert!(c[1].found.contains("rxe0's RoCE v2 GID"), "{c:#?}");
        let none = checks("0.0.0.0:0".parse().unwrap(), &[], false);
        assert_eq!(none[1].status, Status::Fail, "{none:#?}");
        let etcd = checks("0.0.0.0:0".parse().unwrap(), &ips, true);
        assert_eq!(etcd[2].name, "control address for etcd");
        assert_eq!(etcd[2].status, Status::Fail, "{etcd:#?}");
    }
}
