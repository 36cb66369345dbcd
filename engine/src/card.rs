//! An agent's card: what a program hands a peer out of band so that the peer can reach it
//! with no metadata service (NIXL's "agent metadata": a blob sent over the program's own
//! channel). It holds the agent's control address and its descriptor, each versioned.
//!
//! A card names; it does not vouch. Loading one ([`Agent::add_peer_card`](crate::Agent::add_peer_card))
//! only names the agent's control address, as [`Agent::add_peer`](crate::Agent::add_peer)
//! does: the descriptor transfers use (its keys and addresses) is always the one the agent
//! gives over an authenticated control connection, so a forged card can point at no memory
//! the named agent did not publish.

use crate::agent::Agent;
use crate::codec::{Reader, Writer};
use crate::descriptor::AgentDescriptor;
use crate::error::{Error, Result};
use crate::metadata::lock;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// The card format this engine writes and the only one it reads.
pub const CARD_VERSION: u16 = 1;

/// The first bytes of a card; [`CARD_VERSION`] follows.
const MAGIC: &[u8; 4] = b"GRC\0";

/// A parsed card.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Card {
    /// Where the agent's control listener is reached.
    pub control: SocketAddr,
    /// The agent's descriptor when the card was made (its name, incarnation and segments).
    pub descriptor: AgentDescriptor,
}

impl Card {
    /// The wire form: magic `GRC\0`, [`CARD_VERSION`] (u16), the control address as text
    /// (a u32 length, then `ip:port`), then the descriptor's own versioned form
    /// ([`AgentDescriptor::to_bytes`]) with a u32 length.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.raw(MAGIC).u16(CARD_VERSION);
        w.str(&self.control.to_string());
        w.bytes(&self.descriptor.to_bytes());
        w.0
    }

    /// Parses what [`Card::to_bytes`] wrote.
    ///
    /// # Errors
    /// [`Error::IncompatibleVersion`] for another card or descriptor format version;
    /// [`Error::Protocol`] for anything else that is not a whole card: a wrong magic, a
    /// truncated card or one with trailing bytes, an address that does not parse or is
    /// unspecified (`0.0.0.0`), a malformed descriptor.
    pub fn from_bytes(b: &[u8]) -> Result<Card> {
        let mut r = Reader::new(b);
        r.header(MAGIC, CARD_VERSION, "an agent card")?;
        let text = r.str()?;
        let control: SocketAddr = text
            .parse()
            .map_err(|_| Error::Protocol(format!("card: control address {text:?}")))?;
        if control.ip().is_unspecified() || control.port() == 0 {
            return Err(Error::Protocol(format!(
                "card: control address {control} cannot be reached"
            )));
        }
        let descriptor = AgentDescriptor::from_bytes(r.bytes()?)?;
        r.end()?;
        Ok(Card {
            control,
            descriptor,
        })
    }
}

impl Agent {
    /// This agent's card ([`Card::to_bytes`]): its control address as peers reach it (the
    /// listener's, or when that is bound to `0.0.0.0`, the same port at the IPv4 address of
    /// its first RoCE v2 device) and its current descriptor. Hand it to a peer out of band;
    /// the peer loads it with [`Agent::add_peer_card`].
    ///
    /// # Errors
    /// [`Error::Settings`] when the listener is bound to `0.0.0.0` and no device has an
    /// IPv4 GID (bind the agent to an address peers reach).
    pub fn card(&self) -> Result<Vec<u8>> {
        self.card_with(true)
    }

    /// As [`Agent::card`], with the descriptor's segments left out (its name and
    /// incarnation kept): a card of a few dozen bytes whatever the agent registered, for
    /// where size is bounded (inside a notification). It names the agent as well; only
    /// its segments' list, which loading never trusts anyway, is missing.
    ///
    /// # Errors
    /// As [`Agent::card`].
    pub fn name_card(&self) -> Result<Vec<u8>> {
        self.card_with(false)
    }

    fn card_with(&self, segments: bool) -> Result<Vec<u8>> {
        let gids: Vec<[u8; 16]> = self.shared.devices.iter().map(|d| d.gid).collect();
        let mut descriptor = self.descriptor();
        if !segments {
            descriptor.segments.clear();
        }
        Ok(Card {
            control: reachable(self.address(), &gids)?,
            descriptor,
        }
        .to_bytes())
    }

    /// Loads a peer's card ([`Agent::card`]): names the peer's control address to the
    /// embedded metadata service, as [`Agent::add_peer`] does, and returns the peer's name.
    /// Loading a card of an agent already named replaces its address; loading this agent's
    /// own card lets batches name this agent as their remote (a loopback transfer). The
    /// descriptor in the card is checked, not trusted: transfers use the one the peer
    /// gives over an authenticated connection.
    ///
    /// # Errors
    /// [`Error::IncompatibleVersion`] for a card or descriptor of another format version;
    /// [`Error::Protocol`] for bytes that are not a whole card.
    pub fn add_peer_card(&self, card: &[u8]) -> Result<String> {
        let c = Card::from_bytes(card)?;
        let name = c.descriptor.agent;
        self.add_peer(&name, c.control);
        Ok(name)
    }

    /// Forgets peer `agent`: its control address (the embedded metadata service's), its
    /// cached descriptor and its notification connection. Batches that name it fail with
    /// [`Error::UnknownAgent`] until it is named again (under the embedded service; another
    /// service still finds it). Transfers in flight to it go on. Forgetting an agent that
    /// is not known does nothing.
    pub fn remove_peer(&self, agent: &str) {
        lock(&self.embedded.peers).remove(agent);
        self.shared.forget_peer(agent);
        self.notifier.forget(agent);
    }
}

/// The IPv4 address a RoCE v2 GID carries (`::ffff:a.b.c.d`), if it is one.
pub(crate) fn gid_ipv4(gid: &[u8; 16]) -> Option<Ipv4Addr> {
    let mapped = gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff;
    let ip = Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]);
    (mapped && !ip.is_unspecified()).then_some(ip)
}

/// The address a card gives for a listener bound at `bound`: `bound` itself when its IP is
/// specified; else the same port at the IPv4 address of the first device whose GID is a
/// RoCE v2 one (the network the agent's RDMA traffic takes, which peers reach).
///
/// # Errors
/// [`Error::Settings`] when the listener is bound to an unspecified address and no device
/// has an IPv4 GID (InfiniBand): bind the agent to an address peers reach.
pub(crate) fn reachable(bound: SocketAddr, gids: &[[u8; 16]]) -> Result<SocketAddr> {
    if !bound.ip().is_unspecified() {
        return Ok(bound);
    }
    gids.iter()
        .find_map(gid_ipv4)
        .map(|ip| SocketAddr::new(IpAddr::V4(ip), bound.port()))
        .ok_or_else(|| {
            Error::Settings(format!(
                "the control listener is bound to {bound} and no device has a RoCE v2 IPv4 \
                 GID to give peers instead: bind the agent to an address peers reach"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptor::FORMAT_VERSION;

    fn card() -> Card {
        Card {
            control: "10.0.0.2:4000".parse().unwrap(),
            descriptor: AgentDescriptor {
                agent: "a".into(),
                incarnation: 7,
                segments: Vec::new(),
            },
        }
    }

    #[test]
    fn a_card_round_trips_and_every_truncation_is_refused_typed() {
        let b = card().to_bytes();
        assert_eq!(Card::from_bytes(&b).unwrap(), card());
        for n in 0..b.len() {
            assert!(
                matches!(Card::from_bytes(&b[..n]), Err(Error::Protocol(_))),
                "{n} bytes"
            );
        }
        let mut long = b.clone();
        long.push(0);
        assert!(matches!(Card::from_bytes(&long), Err(Error::Protocol(_))));
    }

    #[test]
    fn another_version_of_the_card_or_of_its_descriptor_is_refused() {
        let mut b = card().to_bytes();
        b[4] = 9;
        assert!(matches!(
            Card::from_bytes(&b),
            Err(Error::IncompatibleVersion { found: 9, .. })
        ));
        let b = card().to_bytes();
        // The descriptor's version follows its magic, after the card's header, the address
        // and the descriptor's length.
        let at = b.windows(4).position(|w| w == b"GRE\0").unwrap() + 4;
        let mut old = b.clone();
        old[at..at + 2].copy_from_slice(&(FORMAT_VERSION - 1).to_le_bytes());
        assert!(matches!(
            Card::from_bytes(&old),
            Err(Error::IncompatibleVersion { .. })
        ));
    }

    #[test]
    fn an_unreachable_address_is_refused() {
        let mut c = card();
        c.control = "0.0.0.0:4000".parse().unwrap();
        assert!(matches!(
            Card::from_bytes(&c.to_bytes()),
            Err(Error::Protocol(_))
        ));
    }

    #[test]
    fn the_reachable_address_comes_from_a_roce_v2_gid() {
        let mut v2 = [0u8; 16];
        v2[10] = 0xff;
        v2[11] = 0xff;
        v2[12..].copy_from_slice(&[192, 168, 7, 3]);
        let ib = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        let any: SocketAddr = "0.0.0.0:51000".parse().unwrap();
        assert_eq!(
            reachable(any, &[ib, v2]).unwrap(),
            "192.168.7.3:51000".parse().unwrap()
        );
        assert!(matches!(reachable(any, &[ib]), Err(Error::Settings(_))));
        let bound: SocketAddr = "10.1.1.1:9".parse().unwrap();
        assert_eq!(reachable(bound, &[]).unwrap(), bound);
    }
}
