//! Fence-aware posts on dma-buf regions: before the NIC touches a GPU buffer, wait for the
//! buffer's implicit fences, so the NIC never reads what the GPU has not finished writing and
//! never overwrites what the GPU is still reading.
//!
//! The fences come from the dma-buf itself (`DMA_BUF_IOCTL_EXPORT_SYNC_FILE`): for a request in
//! which the NIC reads the buffer (send, RDMA write source) the writers' fences; for one in
//! which it writes (receive, RDMA read target) every fence, readers' and writers'. The wait
//! happens before the post, with a timeout; on timeout nothing is posted and the region comes
//! back with [`Error::FenceTimeout`].

use crate::deadline::{deadline_after, time_left};
use crate::error::{Error, Result};
use crate::mr::MemoryRegion;
use crate::part::Local;
use crate::qp::{Pending, QueuePair, WorkError};
use crate::remote::RemoteRegion;
use crate::wr::WorkKind;
use drm_export::{DmaBuf, FenceAccess, SyncFile};
use std::time::Duration;

/// What a fenced post does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FencedOp {
    /// Send the region's bytes (the NIC reads them).
    Send {
        /// Immediate data.
        imm: Option<u32>,
    },
    /// Receive into the region (the NIC writes it).
    Recv,
    /// RDMA-write the region's bytes to `remote` (the NIC reads them).
    Write {
        /// The peer's region.
        remote: RemoteRegion,
        /// Immediate data.
        imm: Option<u32>,
    },
    /// RDMA-read `remote` into the region (the NIC writes it).
    Read {
        /// The peer's region.
        remote: RemoteRegion,
    },
}

impl FencedOp {
    pub(crate) fn kind(self) -> WorkKind {
        match self {
            FencedOp::Send { .. } => WorkKind::Send,
            FencedOp::Recv => WorkKind::Recv,
            FencedOp::Write { .. } => WorkKind::Write,
            FencedOp::Read { .. } => WorkKind::Read,
        }
    }

    /// The fences to wait for: the NIC reading needs the writers done; the NIC writing needs
    /// everyone done.
    fn waits_for(self) -> FenceAccess {
        match self {
            FencedOp::Send { .. } | FencedOp::Write { .. } => FenceAccess::Read,
            FencedOp::Recv | FencedOp::Read { .. } => FenceAccess::Write,
        }
    }
}

/// Waits (at most `timeout`; `Duration::MAX` for as long as it takes) for the fences a request
/// of `op` on `region` must respect.
///
/// # Errors
/// [`Error::FenceTimeout`] if they have not signalled in time; [`Error::Fence`] if the
/// sync_file cannot be exported or waited on (kernels before 6.0 lack the export).
pub fn wait_for_fences(
    region: &MemoryRegion<DmaBuf>,
    op: FencedOp,
    timeout: Duration,
) -> Result<()> {
    let sync = export_fences(region, op)?;
    // `Duration::MAX` (or any timeout past what `Instant` holds) waits for as long as it
    // takes; the sync_file is waited on in slices of at most a day, so no slice's deadline
    // can overflow whatever the exporter's crate does with it.
    let deadline = deadline_after(timeout);
    loop {
        let left = time_left(deadline);
        match sync.wait(left.min(SLICE)) {
            Ok(()) => return Ok(()),
            Err(drm_export::Error::Timeout { .. }) if left > SLICE => continue,
            Err(drm_export::Error::Timeout { .. }) => {
                return Err(Error::FenceTimeout {
                    kind: op.kind(),
                    timeout,
                })
            }
            Err(e) => return Err(Error::Fence(Box::new(e))),
        }
    }
}

/// The sync_file of the fences a request of `op` on `region` must wait for
/// (`DMA_BUF_IOCTL_EXPORT_SYNC_FILE`): readable (`POLLIN`) once they have signalled, so a
/// reactor can wait for it ([`SyncFile`] is `AsFd` and owns its fd; see [`crate::reactor`]).
///
/// # Errors
/// [`Error::Fence`] if the buffer's fences cannot be exported (kernels before 6.0).
pub fn export_fences(region: &MemoryRegion<DmaBuf>, op: FencedOp) -> Result<SyncFile> {
    region
        .backing_unchecked()
        .export_sync_file(op.waits_for())
        .map_err(|e| Error::Fence(Box::new(e)))
}

/// The longest single wait on a sync_file (see [`wait_for_fences`]).
const SLICE: Duration = Duration::from_secs(24 * 60 * 60);

impl QueuePair {
    /// Posts `op` on a dma-buf region once the buffer's implicit fences allow it (see the
    /// module docs), waiting at most `timeout` for them (`Duration::MAX`: for as long as it
    /// takes).
    ///
    /// # Errors
    /// A [`WorkError`] with the region back: [`Error::FenceTimeout`] (nothing was posted), a
    /// fence error, or the post's own errors.
    // The error hands the region back by value, as every post does; boxing it would allocate.
    #[allow(clippy::result_large_err)]
    pub fn post_fenced(
        &self,
        op: FencedOp,
        local: impl Into<Local<DmaBuf>>,
        timeout: Duration,
    ) -> std::result::Result<Pending<'_, DmaBuf>, WorkError<DmaBuf>> {
        let local = local.into();
        if let Err(error) = wait_for_fences(local.region(), op, timeout) {
            return Err(WorkError {
                error,
                region: local.into_region(),
            });
        }
        op.post(self, local)
    }
}

impl FencedOp {
    /// Posts the operation on `qp` now: the caller has waited for the fences.
    // The error hands the region back by value, as every post does; boxing it would allocate.
    #[allow(clippy::result_large_err)]
    pub(crate) fn post(
        self,
        qp: &QueuePair,
        local: Local<DmaBuf>,
    ) -> std::result::Result<Pending<'_, DmaBuf>, WorkError<DmaBuf>> {
        match self {
            FencedOp::Send { imm } => qp.post_send(local, imm),
            FencedOp::Recv => qp.post_recv(local),
            FencedOp::Write { remote, imm } => qp.post_write(local, remote, imm),
            FencedOp::Read { remote } => qp.post_read(local, remote),
        }
    }
}
