//! The owned posts of one part: sends, receives, RDMA writes and reads, each moving its
//! part into the request (`post_owned`) and handing it back with the completion.

use super::entry::Shape;
use super::pending::{Pending, WorkError};
use super::QueuePair;
use crate::mr::Backing;
use crate::part::Local;
use crate::remote::RemoteRegion;
use crate::wr::WorkKind;

impl QueuePair {
    /// `IBV_WR_SEND` of the local bytes. The peer must have a receive posted (or post one
    /// within the RNR retry window).
    ///
    /// # Errors
    /// A [`WorkError`] with the region back: empty or out-of-range part, queue full, or the
    /// provider's refusal.
    pub fn post_send<B: Backing>(
        &self,
        local: impl Into<Local<B>>,
        imm: Option<u32>,
    ) -> std::result::Result<Pending<'_, B>, WorkError<B>> {
        self.post(WorkKind::Send, local.into(), None, imm)
    }

    /// A receive into the local bytes (which need [`Access::LOCAL_WRITE`](crate::Access::LOCAL_WRITE)).
    ///
    /// # Errors
    /// As [`QueuePair::post_send`], and an invalid argument without `LOCAL_WRITE`.
    pub fn post_recv<B: Backing>(
        &self,
        local: impl Into<Local<B>>,
    ) -> std::result::Result<Pending<'_, B>, WorkError<B>> {
        self.post(WorkKind::Recv, local.into(), None, None)
    }

    /// `IBV_WR_RDMA_WRITE` (with `imm`: `IBV_WR_RDMA_WRITE_WITH_IMM`, which consumes one of
    /// the peer's receives) of the local bytes to the start of `remote`.
    ///
    /// # Errors
    /// As [`QueuePair::post_send`], and an invalid argument if `remote` is shorter.
    pub fn post_write<B: Backing>(
        &self,
        local: impl Into<Local<B>>,
        remote: RemoteRegion,
        imm: Option<u32>,
    ) -> std::result::Result<Pending<'_, B>, WorkError<B>> {
        self.post(WorkKind::Write, local.into(), Some(remote), imm)
    }

    /// `IBV_WR_RDMA_READ` of the start of `remote` into the local bytes (which need
    /// [`Access::LOCAL_WRITE`](crate::Access::LOCAL_WRITE)).
    ///
    /// # Errors
    /// As [`QueuePair::post_write`].
    pub fn post_read<B: Backing>(
        &self,
        local: impl Into<Local<B>>,
        remote: RemoteRegion,
    ) -> std::result::Result<Pending<'_, B>, WorkError<B>> {
        self.post(WorkKind::Read, local.into(), Some(remote), None)
    }

    #[inline(always)]
    fn post<B: Backing>(
        &self,
        kind: WorkKind,
        local: Local<B>,
        remote: Option<RemoteRegion>,
        imm: Option<u32>,
    ) -> std::result::Result<Pending<'_, B>, WorkError<B>> {
        match self.post_owned(Shape::new(kind, remote, imm), local) {
            Ok(ticket) => Ok(Pending { ticket }),
            Err((error, local)) => Err(WorkError {
                error,
                region: local.into_region(),
            }),
        }
    }
}
