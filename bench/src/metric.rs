//! What a bench series measures: the metrics, their keys, units and titles.

/// What a series measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Metric {
    /// RDMA write bandwidth (and message rate), one way.
    Bandwidth,
    /// RDMA write latency, one way (half a ping-pong's round trip).
    Latency,
    /// Memory-region registration (and deregistration) time.
    Registration,
    /// User-space instructions per RDMA write, counted by valgrind's callgrind: deterministic,
    /// so one round measures it (a repeat in the same run gives the same count).
    Instructions,
    /// Allocations per chunk of the transfer engine (the whole process, every thread): a
    /// count that timing does not move, so one round measures it.
    Allocations,
}

impl Metric {
    /// Every metric, in report order.
    pub const ALL: [Metric; 5] = [
        Metric::Bandwidth,
        Metric::Latency,
        Metric::Registration,
        Metric::Instructions,
        Metric::Allocations,
    ];

    /// Whether a count (deterministic: measured in the first round only) rather than a time.
    pub fn counted(self) -> bool {
        matches!(self, Metric::Instructions | Metric::Allocations)
    }

    /// Short name, used in step ids, files and JSON.
    pub fn key(self) -> &'static str {
        match self {
            Metric::Bandwidth => "bw",
            Metric::Latency => "lat",
            Metric::Registration => "reg",
            Metric::Instructions => "ins",
            Metric::Allocations => "alloc",
        }
    }

    /// The sample value the table, the plots and the goals use.
    pub fn value(self) -> &'static str {
        match self {
            Metric::Bandwidth => "bw_MBps",
            Metric::Latency => "lat_usec",
            Metric::Registration => "reg_usec",
            Metric::Instructions => "ins_per_write",
            Metric::Allocations => "allocs_per_chunk",
        }
    }

    /// The value's unit.
    pub fn unit(self) -> &'static str {
        match self {
            Metric::Bandwidth => "MiB/s",
            Metric::Latency | Metric::Registration => "usec",
            Metric::Instructions => "instructions per write",
            Metric::Allocations => "allocations per chunk",
        }
    }

    /// What the value is, for titles.
    pub fn title(self) -> &'static str {
        match self {
            Metric::Bandwidth => "RDMA write bandwidth",
            Metric::Latency => "RDMA write latency (one way, mean)",
            Metric::Registration => "memory-region registration time (median)",
            Metric::Instructions => "user-space instructions per RDMA write (callgrind)",
            Metric::Allocations => "transfer engine: allocations per chunk (every thread)",
        }
    }
}
