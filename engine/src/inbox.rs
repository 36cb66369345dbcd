//! [`Inbox`]: the notifications an agent received and the program has not taken yet,
//! bounded per sender and in all.

use crate::batch::Notification;
use crate::error::Limit;
use crate::metadata::lock;
use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Queue {
    q: VecDeque<Notification>,
    /// How many of `q` each sender has.
    by_sender: HashMap<String, u32>,
}

impl Queue {
    fn pop(&mut self) -> Option<Notification> {
        let n = self.q.pop_front()?;
        if let Some(c) = self.by_sender.get_mut(&n.from) {
            *c -= 1;
            if *c == 0 {
                self.by_sender.remove(&n.from);
            }
        }
        Some(n)
    }
}

/// The queue of received notifications, oldest first.
pub(crate) struct Inbox {
    queue: Mutex<Queue>,
    arrived: Condvar,
    per_sender: u32,
    total: u32,
}

impl Inbox {
    /// An empty inbox that holds at most `per_sender` notifications of one sender and
    /// `total` in all.
    pub fn new(per_sender: u32, total: u32) -> Inbox {
        Inbox {
            queue: Mutex::default(),
            arrived: Condvar::new(),
            per_sender,
            total,
        }
    }

    /// Queues `n` and wakes a waiter, or says which bound refuses it.
    pub fn deliver(&self, n: Notification) -> Result<(), Limit> {
        let mut q = lock(&self.queue);
        if q.q.len() >= self.total as usize {
            return Err(Limit::Notifications);
        }
        let count = q.by_sender.get(&n.from).copied().unwrap_or(0);
        if count >= self.per_sender {
            return Err(Limit::NotificationsPerSender);
        }
        q.by_sender.insert(n.from.clone(), count + 1);
        q.q.push_back(n);
        drop(q);
        self.arrived.notify_all();
        Ok(())
    }

    /// Takes every queued notification, oldest first.
    pub fn take_all(&self) -> Vec<Notification> {
        let mut q = lock(&self.queue);
        q.by_sender.clear();
        q.q.drain(..).collect()
    }

    /// Takes the oldest notification, waiting at most `timeout` for one.
    pub fn wait(&self, timeout: Duration) -> Option<Notification> {
        let deadline = Instant::now().checked_add(timeout);
        let mut q = lock(&self.queue);
        loop {
            if let Some(n) = q.pop() {
                return Some(n);
            }
            let left = deadline.map_or(Duration::from_secs(3600), |d| {
                d.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                return None;
            }
            q = self
                .arrived
                .wait_timeout(q, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(from: &str) -> Notification {
        Notification {
            from: from.into(),
            message: vec![1],
        }
    }

    #[test]
    fn each_sender_and_the_whole_are_bounded_and_taking_makes_room() {
        let inbox = Inbox::new(2, 3);
        inbox.deliver(note("a")).unwrap();
        inbox.deliver(note("a")).unwrap();
        assert_eq!(inbox.deliver(note("a")), Err(Limit::NotificationsPerSender));
        inbox.deliver(note("b")).unwrap();
        assert_eq!(inbox.deliver(note("c")), Err(Limit::Notifications));
        assert_eq!(inbox.wait(Duration::ZERO).unwrap().from, "a");
        inbox.deliver(note("a")).unwrap();
        assert_eq!(inbox.take_all().len(), 3);
        inbox.deliver(note("a")).unwrap();
        inbox.deliver(note("a")).unwrap();
        assert!(inbox.wait(Duration::from_millis(1)).is_some());
    }
}
