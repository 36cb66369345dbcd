//! Completion queues and their completion channels (the verbs objects are in `sys::cq`):
//! sleeping in the kernel until a completion arrives.

use crate::deadline::wait_readable;
use crate::error::{Error, Op, Result};
pub(crate) use crate::sys::cq::CompletionQueue;
use std::time::Duration;

impl CompletionQueue {
    /// Sleeps until the CQ has something or `timeout` passes: arms the notification, calls
    /// `poll_again` (a completion may have come before arming; if it took any, returns at
    /// once), then waits on the channel's fd and takes the event. Without a channel it
    /// yields once.
    pub(crate) fn sleep(
        &self,
        timeout: Duration,
        poll_again: impl FnOnce() -> Result<usize>,
    ) -> Result<()> {
        let Some(fd) = self.channel_fd() else {
            std::thread::yield_now();
            return Ok(());
        };
        self.arm()?;
        if poll_again()? > 0 {
            return Ok(());
        }
        let readable = wait_readable(fd, timeout).map_err(|e| {
            Error::from_errno(Op::PollCq, "poll on the completion channel", e as i32)
        })?;
        if readable {
            self.take_events()?;
        }
        Ok(())
    }
}
