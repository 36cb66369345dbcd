//! What an agent's threads share: its identity, devices, segments, settings, the peers'
//! descriptors it has fetched, and the notifications it has received.

use crate::batch::Notification;
use crate::descriptor::AgentDescriptor;
use crate::devices::Device;
use crate::metadata::{lock, MetadataService, PeerRecord};
use crate::segment::Segments;
use crate::settings::Settings;
use rdma_dmabuf::QueuePairBuilder;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};

pub(crate) struct Shared {
    pub name: String,
    pub incarnation: u64,
    pub devices: Vec<Device>,
    /// Each device's weight in striping (its link rate), by device index.
    pub weights: Vec<u32>,
    pub segments: Segments,
    pub settings: Settings,
    pub metadata: Arc<dyn MetadataService>,
    /// Peers' descriptors, fetched on first use; dropped when a peer goes down or restarts.
    pub peers: Mutex<HashMap<String, PeerRecord>>,
    pub notifications: Mutex<VecDeque<Notification>>,
    pub notified: Condvar,
}

impl Shared {
    /// This agent's descriptor as it is now.
    pub fn descriptor(&self) -> AgentDescriptor {
        AgentDescriptor {
            agent: self.name.clone(),
            incarnation: self.incarnation,
            segments: self.segments.descriptors(),
        }
    }

    /// A queue pair builder on device `device` with the agent's settings.
    pub fn qp_builder(&self, device: usize) -> QueuePairBuilder {
        let s = &self.settings;
        let builder = QueuePairBuilder::new(&self.devices[device].pd).send_depth(s.in_flight);
        match s.transport_retry {
            Some(r) => builder
                .ack_timeout(r.ack_timeout)
                .retry_count(r.retry_count),
            None => builder,
        }
    }

    /// Forgets `agent`'s descriptor: the next transfer to it fetches it again.
    pub fn forget_peer(&self, agent: &str) {
        lock(&self.peers).remove(agent);
    }

    /// Queues a notification and wakes a waiter.
    pub fn deliver(&self, n: Notification) {
        lock(&self.notifications).push_back(n);
        self.notified.notify_all();
    }
}
