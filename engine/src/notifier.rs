//! [`Notifier`]: notifications sent on their own, without a transfer
//! ([`Agent::notify`](crate::Agent::notify)), over one control connection per peer kept for
//! the next.

use crate::channel::Channel;
use crate::error::{Error, Result};
use crate::metadata::{lock, Dialer};
use crate::wire::{Reply, Request};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;

/// The connections notifications went over, by peer name and address.
#[derive(Default)]
pub(crate) struct Notifier {
    links: Mutex<HashMap<String, (SocketAddr, Channel)>>,
}

impl Notifier {
    /// Delivers `message` to agent `agent` at `control`: returns once the peer queued it.
    /// A kept connection that fails is dropped and the message sent once more over a new one
    /// (the peer may have closed an idle connection); a refusal is not retried.
    pub fn send(
        &self,
        dialer: &Dialer,
        agent: &str,
        control: SocketAddr,
        message: &[u8],
    ) -> Result<()> {
        let kept = lock(&self.links)
            .remove(agent)
            .filter(|(addr, _)| *addr == control)
            .map(|(_, ch)| ch);
        let req = Request::Notify {
            message: message.to_vec(),
        };
        let mut ch = match kept {
            Some(mut ch) => match dialer.call(&mut ch, control, &req) {
                Err(Error::Io { .. }) => dialer.dial(control, Some(agent))?,
                answered => return self.keep(agent, control, ch, answered),
            },
            None => dialer.dial(control, Some(agent))?,
        };
        let answered = dialer.call(&mut ch, control, &req);
        self.keep(agent, control, ch, answered)
    }

    /// Keeps the connection for the next notification when the peer answered (its queue
    /// full is an answer too: the connection stays good), and reads its answer.
    fn keep(
        &self,
        agent: &str,
        control: SocketAddr,
        ch: Channel,
        answered: Result<Reply>,
    ) -> Result<()> {
        if matches!(answered, Ok(_) | Err(Error::LimitReached { .. })) {
            lock(&self.links)
                .entry(agent.into())
                .or_insert((control, ch));
        }
        answered?.noted()
    }

    /// Forgets the connection to `agent` (it went down or restarted).
    pub fn forget(&self, agent: &str) {
        lock(&self.links).remove(agent);
    }
}
