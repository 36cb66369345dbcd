//! What a busy wait does between two polls of a completion queue: [`SpinPolicy`].

/// What the library's busy waits ([`Pending::spin`](crate::Pending::spin) and the other
/// handles' `spin`/`spin_timeout`, a scope's waits, an awaited request's busy-poll budget) do
/// between two polls of a completion queue that found nothing. Set per queue with
/// [`QueuePair::set_spin_policy`](crate::QueuePair::set_spin_policy) and
/// [`SharedReceiveQueue::set_spin_policy`](crate::SharedReceiveQueue::set_spin_policy).
///
/// Neither policy changes what a wait returns or how long it may last; only how the CPU is
/// spent meanwhile. More policies may come (e.g. another yield interval): matches need a
/// wildcard arm.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SpinPolicy {
    /// The default: a spin-loop hint (x86 `PAUSE`) between polls, and a `sched_yield` every
    /// 64th. The hint frees the core's other hardware thread; the yield lets a thread that
    /// shares this CPU run (on soft-RoCE, the kernel worker that carries the packets, which
    /// may otherwise wait for the scheduler's next tick, several milliseconds, when there are
    /// no more CPUs than polling threads). Right wherever the polling thread shares its core.
    /// (An owned handle's `spin_timeout` yields between every two polls, as it always has.)
    #[default]
    Shared,
    /// Nothing between polls, as perftest's loops: the completion is seen a hint's latency
    /// sooner (tens of nanoseconds on hardware; far more under an emulator, where the hint
    /// and the system call are expensive: docs/performance-gaps.md). For a thread that has a
    /// core to itself (pinned, with nothing else meant to run there); on a CPU it shares, it
    /// can hold up whoever must run for the completion to come.
    Dedicated,
}

impl SpinPolicy {
    pub(crate) fn to_bits(self) -> u8 {
        match self {
            SpinPolicy::Shared => 0,
            SpinPolicy::Dedicated => 1,
        }
    }

    pub(crate) fn from_bits(bits: u8) -> SpinPolicy {
        if bits == 1 {
            SpinPolicy::Dedicated
        } else {
            SpinPolicy::Shared
        }
    }
}

/// The polls of one busy wait, and what to do between them.
pub(crate) struct Spinner {
    policy: SpinPolicy,
    polls: u32,
}

/// How many polls a busy wait makes between two checkpoints (a yield, a look at the clock).
pub(crate) const CHECKPOINT: u32 = 64;

impl Spinner {
    /// A wait under `policy`, no poll made yet.
    pub(crate) fn new(policy: SpinPolicy) -> Spinner {
        Spinner { policy, polls: 0 }
    }

    /// After a poll that found nothing: waits as the policy says. Returns `true` every
    /// [`CHECKPOINT`]th poll, where a caller with a deadline looks at the clock.
    #[inline]
    pub(crate) fn after_poll(&mut self) -> bool {
        let (checkpoint, step) = self.next_step();
        match step {
            Step::Nothing => {}
            Step::Hint => std::hint::spin_loop(),
            Step::Yield => std::thread::yield_now(),
        }
        checkpoint
    }

    /// Counts the poll; whether it is a checkpoint, and what to do before the next.
    fn next_step(&mut self) -> (bool, Step) {
        self.polls = self.polls.wrapping_add(1);
        let checkpoint = self.polls.is_multiple_of(CHECKPOINT);
        let step = match (self.policy, checkpoint) {
            (SpinPolicy::Dedicated, _) => Step::Nothing,
            (SpinPolicy::Shared, true) => Step::Yield,
            (SpinPolicy::Shared, false) => Step::Hint,
        };
        (checkpoint, step)
    }
}

/// What a busy wait does between two polls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Nothing,
    Hint,
    Yield,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(policy: SpinPolicy, n: usize) -> Vec<(bool, Step)> {
        let mut s = Spinner::new(policy);
        (0..n).map(|_| s.next_step()).collect()
    }

    #[test]
    fn shared_hints_between_polls_and_yields_at_every_checkpoint() {
        let got = steps(SpinPolicy::Shared, 3 * CHECKPOINT as usize);
        for (i, (checkpoint, step)) in got.into_iter().enumerate() {
            let at = (i + 1) % CHECKPOINT as usize == 0;
            assert_eq!(checkpoint, at, "poll {}", i + 1);
            assert_eq!(step, if at { Step::Yield } else { Step::Hint });
        }
    }

    #[test]
    fn dedicated_never_hints_or_yields_but_keeps_the_checkpoints() {
        let got = steps(SpinPolicy::Dedicated, 3 * CHECKPOINT as usize);
        assert!(got.iter().all(|&(_, step)| step == Step::Nothing));
        let checkpoints = got.iter().filter(|&&(c, _)| c).count();
        assert_eq!(
            checkpoints, 3,
            "a deadline is still looked at every 64 polls"
        );
    }

    #[test]
    fn the_policy_round_trips_through_its_bits() {
        for p in [SpinPolicy::Shared, SpinPolicy::Dedicated] {
            assert_eq!(SpinPolicy::from_bits(p.to_bits()), p);
        }
        assert_eq!(SpinPolicy::default(), SpinPolicy::Shared);
    }
}
