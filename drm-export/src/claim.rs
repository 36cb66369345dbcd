//! One live [`DmaBuf`](crate::DmaBuf) per buffer in this process.
//!
//! Two `DmaBuf`s over one buffer (a dup of one's fd turned into a second, or a GEM object
//! exported twice: PRIME hands back the same dma-buf) would let safe code map the buffer
//! through one while the other is registered and lent to the NIC. So each `DmaBuf` holds a
//! claim on its buffer's identity, the inode of the dma-buf file (with its device), and a
//! second claim on a buffer that is already claimed is refused. Not a hot path: a claim is
//! made when a `DmaBuf` is made and released when it is dropped or turned back into its fd.

use std::collections::BTreeSet;
use std::sync::Mutex;

/// Which buffer a [`DmaBuf`](crate::DmaBuf) is: its dma-buf file's device and inode, the same for every fd
/// of one buffer and never another live buffer's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BufferId {
    /// `st_dev` of the dma-buf file.
    pub dev: u64,
    /// `st_ino` of the dma-buf file.
    pub ino: u64,
}

static CLAIMED: Mutex<BTreeSet<BufferId>> = Mutex::new(BTreeSet::new());

/// A live `DmaBuf`'s claim on its buffer; released when dropped.
#[derive(Debug)]
pub(crate) struct Claim(BufferId);

impl Claim {
    /// Claims `id`, or `None` if a live `DmaBuf` of this process already has.
    pub(crate) fn take(id: BufferId) -> Option<Claim> {
        let mut claimed = CLAIMED.lock().unwrap_or_else(|p| p.into_inner());
        // `then`, not `then_some`: a `Claim` made for a refused id would be dropped here,
        // under the lock, and release the live owner's claim.
        claimed.insert(id).then(|| Claim(id))
    }

    /// The buffer's identity.
    pub(crate) fn id(&self) -> BufferId {
        self.0
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut claimed = CLAIMED.lock().unwrap_or_else(|p| p.into_inner());
        claimed.remove(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_buffer_is_refused_until_its_claim_is_released() {
        let id = BufferId {
            dev: u64::MAX,
            ino: 42,
        };
        let first = Claim::take(id).expect("first claim");
        assert!(Claim::take(id).is_none(), "second claim refused");
        assert!(
            Claim::take(BufferId { ino: 43, ..id }).is_some(),
            "another buffer is fine"
        );
        drop(first);
        assert!(Claim::take(id).is_some(), "claimable again");
    }
}
