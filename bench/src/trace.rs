//! Reading a tracefs trace (the text of `/sys/kernel/tracing/trace`) of a one-node ping-pong
//! taken with the scheduler's and the workqueue's tracepoints (`sched_waking`, `sched_wakeup`,
//! `sched_switch`, `workqueue_queue_work`, `workqueue_execute_start`): how long rxe's kworkers
//! (the workers of the unbound `rxe_wq`, which carry every packet of a soft-RoCE device) waited
//! between being made runnable and running, and what ran on their CPU meanwhile; and how long
//! each of rxe's work items waited between being queued and starting.
//!
//! With `ipi_send_cpu` and `reschedule_entry` traced too, a wait woken from another CPU also
//! tells whether the wake-up asked the kworker's CPU to reschedule (a reschedule IPI sent from
//! `wakeup_preempt`: the scheduler chose to preempt what ran there) and when that CPU took the
//! interrupt.
//!
//! A wait starts when a kworker is woken (`sched_waking`) or switched out while still runnable
//! (preempted: `prev_state=R`), and ends when `sched_switch` switches it in. The trace must be
//! taken with the `global` clock (one clock for every CPU).

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// One line of the trace: `TASK-PID [CPU] FLAGS SECONDS: EVENT: BODY`.
#[derive(Debug, PartialEq)]
pub struct Event<'a> {
    /// The task that was running when it was recorded (0: the idle task).
    pub pid: u32,
    /// The CPU that recorded it.
    pub cpu: u32,
    /// Its time, in nanoseconds of the trace's clock.
    pub ns: u64,
    /// The tracepoint, e.g. `sched_switch`.
    pub name: &'a str,
    /// The tracepoint's own text.
    pub body: &'a str,
}

/// Reads one line of the trace; `None` for comments and lines of other shapes.
pub fn parse_line(line: &str) -> Option<Event<'_>> {
    if line.trim_start().starts_with('#') {
        return None;
    }
    // The task's name may hold anything, so the CPU is the first `[digits]` field.
    let mut from = 0;
    let (pid, cpu, rest) = loop {
        let open = from + line[from..].find('[')?;
        let close = open + line[open..].find(']')?;
        let inner = &line[open + 1..close];
        if !inner.is_empty() && inner.bytes().all(|b| b.is_ascii_digit()) {
            let pid = line[..open].trim().rsplit_once('-')?.1.parse().ok()?;
            break (pid, inner.parse().ok()?, &line[close + 1..]);
        }
        from = close;
    };
    let (_flags, rest) = rest.trim_start().split_once(' ')?;
    let (secs, rest) = rest.trim_start().split_once(' ')?;
    let secs = secs.strip_suffix(':')?;
    let (name, body) = rest.trim_start().split_once(": ")?;
    Some(Event {
        pid,
        cpu,
        ns: seconds_to_ns(secs)?,
        name,
        body: body.trim_end(),
    })
}

/// `26.630313` (microseconds) or `26.630313123` (nanoseconds) as nanoseconds.
fn seconds_to_ns(s: &str) -> Option<u64> {
    let (whole, frac) = s.split_once('.')?;
    if frac.is_empty() || frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let scale = 10u64.pow(9 - frac.len() as u32);
    whole
        .parse::<u64>()
        .ok()?
        .checked_mul(1_000_000_000)?
        .checked_add(frac.parse::<u64>().ok()? * scale)
}

/// The value of `key=` in a tracepoint's text (up to the next space).
pub fn field<'a>(body: &'a str, key: &str) -> Option<&'a str> {
    body.split(' ')
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// A span in which one of rxe's kworkers was runnable and not running.
#[derive(Debug, Clone, PartialEq)]
pub struct Wait {
    /// The kworker.
    pub pid: u32,
    /// The CPU it then ran on.
    pub cpu: u32,
    /// When it became runnable (ns).
    pub from_ns: u64,
    /// How long it waited (ns).
    pub ns: u64,
    /// Woken from sleep (`true`) or preempted while running (`false`).
    pub woken: bool,
    /// The CPU that woke it (that recorded `sched_waking`); `None` when preempted.
    pub waker_cpu: Option<u32>,
    /// What ran on that CPU meanwhile: task names with their time (ns), most first.
    pub ran: Vec<(String, u64)>,
    /// Woken from another CPU with a reschedule IPI to this one (sent within [`IPI_WINDOW_NS`]
    /// of the wake-up): how long after sending it this CPU entered its handler (ns; `None`
    /// when it did not before the wait ended).
    pub ipi_taken_after: Option<Option<u64>>,
}

/// How soon after a remote wake-up a reschedule IPI to the woken task's CPU counts as the
/// wake-up's own.
pub const IPI_WINDOW_NS: u64 = 500_000;

/// What a trace says about rxe's kworkers and work items.
#[derive(Debug, Default, PartialEq)]
pub struct Summary {
    /// The kworkers that ran rxe's work in the trace.
    pub kworkers: BTreeSet<u32>,
    /// Every wait of those kworkers, in trace order of their ends.
    pub waits: Vec<Wait>,
    /// For each of rxe's work items queued and started in the trace: queue to start (ns).
    pub work_delays: Vec<u64>,
}

impl Summary {
    /// The waits of at least `min_ns`.
    pub fn long_waits(&self, min_ns: u64) -> impl Iterator<Item = &Wait> {
        self.waits.iter().filter(move |w| w.ns >= min_ns)
    }

    /// Of the waits of at least `min_ns`, those woken from another CPU than the one they ran on.
    pub fn remote_wakes(&self, min_ns: u64) -> usize {
        self.long_waits(min_ns)
            .filter(|w| w.waker_cpu.is_some_and(|c| c != w.cpu))
            .count()
    }

    /// Of the waits of at least `min_ns` woken from another CPU, those whose wake-up sent
    /// a reschedule IPI, and the IPI's delivery times (send to handler, ns) sorted.
    pub fn ipis(&self, min_ns: u64) -> (usize, Vec<u64>) {
        let with: Vec<&Option<u64>> = self
            .long_waits(min_ns)
            .filter_map(|w| w.ipi_taken_after.as_ref())
            .collect();
        let mut taken: Vec<u64> = with.iter().filter_map(|t| **t).collect();
        taken.sort_unstable();
        (with.len(), taken)
    }

    /// The work items that waited at least `min_ns` to start.
    pub fn long_work_delays(&self, min_ns: u64) -> usize {
        self.work_delays.iter().filter(|&&d| d >= min_ns).count()
    }

    /// The task that ran longest on the waiting kworkers' CPUs in the waits of at least
    /// `min_ns`, with that time (ns).
    pub fn main_occupant(&self, min_ns: u64) -> Option<(String, u64)> {
        let mut by: BTreeMap<&str, u64> = BTreeMap::new();
        for w in self.long_waits(min_ns) {
            for (comm, ns) in &w.ran {
                *by.entry(comm).or_default() += ns;
            }
        }
        by.into_iter()
            .max_by_key(|&(_, ns)| ns)
            .map(|(c, ns)| (c.to_string(), ns))
    }
}

/// Whether a work item's function is rxe's (`do_work [rdma_rxe]`, or any in that module).
fn is_rxe(function: &str) -> bool {
    function.contains("[rdma_rxe]")
}

/// Reads a whole trace.
pub fn analyse(text: &str) -> Summary {
    let events: Vec<Event> = text.lines().filter_map(parse_line).collect();
    let mut s = Summary::default();
    // The kworkers: any task that started one of rxe's work items.
    for e in &events {
        if e.name == "workqueue_execute_start" && is_rxe(e.body) {
            s.kworkers.insert(e.pid);
        }
    }
    // Each CPU's switches, to tell what ran on it in a span.
    let mut timeline: HashMap<u32, Vec<(u64, String)>> = HashMap::new();
    // Runnable since (ns) and the waking CPU (None: preempted), per kworker.
    let mut pending: HashMap<u32, (u64, Option<u32>)> = HashMap::new();
    let mut queued: HashMap<&str, u64> = HashMap::new();
    // Per CPU: reschedule IPIs sent to it from a wake-up, and its reschedule interrupts.
    let mut ipis: HashMap<u32, Vec<u64>> = HashMap::new();
    let mut entries: HashMap<u32, Vec<u64>> = HashMap::new();
    let mut ends: Vec<(u32, u32, u64, u64, Option<u32>)> = Vec::new();
    for e in &events {
        match e.name {
            "sched_waking" | "sched_wakeup" => {
                let pid = field(e.body, "pid").and_then(|p| p.parse().ok());
                if let Some(pid) = pid.filter(|p| s.kworkers.contains(p)) {
                    pending.entry(pid).or_insert((e.ns, Some(e.cpu)));
                }
            }
            "sched_switch" => {
                let next = field(e.body, "next_comm").unwrap_or("?");
                timeline
                    .entry(e.cpu)
                    .or_default()
                    .push((e.ns, next.to_string()));
                let prev: Option<u32> = field(e.body, "prev_pid").and_then(|p| p.parse().ok());
                let state = field(e.body, "prev_state").unwrap_or("");
                if let Some(pid) = prev.filter(|p| s.kworkers.contains(p)) {
                    if state.starts_with('R') {
                        pending.insert(pid, (e.ns, None));
                    }
                }
                let next_pid: Option<u32> = field(e.body, "next_pid").and_then(|p| p.parse().ok());
                if let Some((pid, (from, waker))) =
                    next_pid.and_then(|p| pending.remove(&p).map(|w| (p, w)))
                {
                    ends.push((pid, e.cpu, from, e.ns, waker));
                }
            }
            "ipi_send_cpu"
                if field(e.body, "callsite").is_some_and(|c| c.starts_with("wakeup_preempt")) =>
            {
                if let Some(cpu) = field(e.body, "cpu").and_then(|c| c.parse().ok()) {
                    ipis.entry(cpu).or_default().push(e.ns);
                }
            }
            "reschedule_entry" => entries.entry(e.cpu).or_default().push(e.ns),
            "workqueue_queue_work" if field(e.body, "workqueue") == Some("rxe_wq") => {
                if let Some(work) = field(e.body, "struct") {
                    queued.entry(work).or_insert(e.ns);
                }
            }
            "workqueue_execute_start" if is_rxe(e.body) => {
                let work = e
                    .body
                    .strip_prefix("work struct ")
                    .and_then(|b| b.split(':').next());
                if let Some(from) = work.and_then(|w| queued.remove(w)) {
                    s.work_delays.push(e.ns.saturating_sub(from));
                }
            }
            _ => {}
        }
    }
    for (pid, cpu, from, to, waker_cpu) in ends {
        let ran = occupants(timeline.get(&cpu).map_or(&[][..], |t| t), from, to);
        let remote = waker_cpu.is_some_and(|c| c != cpu);
        let first = |v: Option<&Vec<u64>>, at: u64, until: u64| {
            v.and_then(|v| v.get(v.partition_point(|&t| t < at)).copied())
                .filter(|&t| t <= until)
        };
        let ipi_taken_after = first(ipis.get(&cpu), from, from + IPI_WINDOW_NS)
            .filter(|_| remote)
            .map(|sent| first(entries.get(&cpu), sent, to).map(|t| t - sent));
        s.waits.push(Wait {
            pid,
            cpu,
            from_ns: from,
            ns: to.saturating_sub(from),
            woken: waker_cpu.is_some(),
            waker_cpu,
            ran,
            ipi_taken_after,
        });
    }
    s
}

/// The tasks that ran in `[from, to)` on a CPU whose switches are `timeline` (in time order),
/// with their time there, most first.
fn occupants(timeline: &[(u64, String)], from: u64, to: u64) -> Vec<(String, u64)> {
    let mut by: BTreeMap<&str, u64> = BTreeMap::new();
    for (i, (t, comm)) in timeline.iter().enumerate() {
        let end = timeline.get(i + 1).map_or(u64::MAX, |n| n.0);
        let (a, b) = ((*t).max(from), end.min(to));
        if a < b {
            *by.entry(comm).or_default() += b - a;
        }
    }
    let mut v: Vec<(String, u64)> = by.into_iter().map(|(c, n)| (c.to_string(), n)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

#[cfg(test)]
#[path = "trace_tests.rs"]
mod tests;
