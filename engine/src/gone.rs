//! A remote segment that is gone: when a peer's NIC refused a batch's key
//! ([`Error::RemoteAccess`]), the worker asks for the peer's descriptor again before the
//! batch ends. Where the peer is the same incarnation and no longer has the segment (it
//! unregistered it), the entries to that segment fail with [`Error::UnknownSegment`], the
//! error a batch checked after the unregistration gets, whatever the metadata service (an
//! embedded one answers from its cached descriptor until it is refused; etcd's follows the
//! peer and refuses the batch at its check). Otherwise the refusal stands.

use crate::error::Error;
use crate::health::Lane;
use crate::plan::Plan;
use crate::progress::Progress;
use crate::shared::Shared;

/// Corrects the entries of `plan` that failed with a refused key at a peer whose segment
/// turns out to be gone (see the module's documentation). One look-up per such peer.
pub(crate) fn correct(shared: &Shared, plan: &Plan, lanes: &[Lane], progress: &Progress) {
    for (p, lane) in lanes.iter().enumerate() {
        if !matches!(lane.down, Some(Error::RemoteAccess { .. })) {
            continue;
        }
        let found = shared.metadata.lookup(&lane.agent);
        shared.metrics.looked_up(found.is_err());
        let Ok(record) = found else { continue };
        if record.descriptor.incarnation != plan.peers[p].incarnation {
            continue; // restarted: its own error says so at the next batch
        }
        // Each entry's remote segment to this peer (an entry has one), in one pass.
        let mut segment = vec![None; plan.chunks_per_entry.len()];
        for c in plan.chunks.iter().filter(|c| usize::from(c.peer) == p) {
            segment[c.entry as usize] = Some(&plan.remote_names[usize::from(c.remote_segment)]);
        }
        let segment_of = |entry: u32| segment.get(entry as usize).copied().flatten();
        progress.correct(|entry, e| {
            let Error::RemoteAccess { agent, .. } = e else {
                return None;
            };
            let name = segment_of(entry).filter(|_| *agent == lane.agent)?;
            let gone = record.descriptor.segment(name).is_none();
            gone.then(|| Error::UnknownSegment {
                agent: agent.clone(),
                segment: name.clone(),
            })
        });
        tracing::debug!(peer = %lane.agent, "looked up again after a refused key");
    }
}
