//! What an agent's threads share: its identity, devices, segments, settings, the peers'
//! descriptors it has fetched, and the notifications it has received.

use crate::descriptor::AgentDescriptor;
use crate::devices::Device;
use crate::inbox::Inbox;
use crate::limits::Counters;
use crate::metadata::{lock, Dialer, MetadataService, PeerRecord};
use crate::metrics::Recorder;
use crate::segment::Segments;
use crate::settings::Settings;
use rdma_dmabuf::QueuePairBuilder;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub(crate) struct Shared {
    pub name: String,
    pub incarnation: u64,
    pub devices: Vec<Device>,
    /// Each device's weight in striping (its link rate), by device index.
    pub weights: Vec<u32>,
    pub segments: Segments,
    /// With [`Settings::auth`] resolved (never `FromEnvironment`).
    pub settings: Settings,
    pub metadata: Arc<dyn MetadataService>,
    /// How the workers open their control connections.
    pub dialer: Dialer,
    /// Peers' descriptors, fetched on first use; dropped when a peer goes down or restarts.
    pub peers: Mutex<HashMap<String, PeerRecord>>,
    /// The notifications received and not yet taken.
    pub inbox: Inbox,
    /// What the control listener accepted and refused.
    pub counters: Counters,
    /// The engine's own counters ([`crate::Agent::metrics`]).
    pub metrics: Arc<Recorder>,
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
}
