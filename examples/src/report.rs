//! Output people read at a glance: aligned `label  text` lines, sizes and rates.

/// Prints `  label        text`, labels aligned.
pub fn line(label: &str, text: impl std::fmt::Display) {
    println!("  {label:<13}{text}");
}

/// `4096 B`, `64 KiB`, `1.5 MiB`, `2 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 || v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// How long a queue pair from `builder` waits for a silent peer before a request fails
/// (`QueuePairBuilder::retry_budget`), and the environment's retry settings if any.
pub fn retries(builder: &rdma_dmabuf::QueuePairBuilder) -> String {
    use rdma_dmabuf::{ACK_TIMEOUT_ENV, RETRY_COUNT_ENV};
    let set: Vec<String> = [ACK_TIMEOUT_ENV, RETRY_COUNT_ENV]
        .iter()
        .filter_map(|k| Some(format!("{k}={}", std::env::var_os(k)?.to_string_lossy())))
        .collect();
    format!(
        "a request the peer never acknowledges fails within {:.1} s ({})",
        builder.retry_budget().as_secs_f64(),
        if set.is_empty() {
            "the library's defaults".to_string()
        } else {
            set.join(", ")
        }
    )
}

/// Access flags as `LOCAL_WRITE|REMOTE_WRITE`, or `local read only`.
pub fn access(a: rdma_dmabuf::Access) -> String {
    if a.is_empty() {
        return "local read only".into();
    }
    a.iter_names().map(|(n, _)| n).collect::<Vec<_>>().join("|")
}

/// `n` bytes in `secs` as MiB/s and Gbit/s.
pub fn rate(n: u64, secs: f64) -> String {
    let secs = secs.max(1e-9);
    format!(
        "{:.1} MiB/s ({:.2} Gbit/s)",
        n as f64 / secs / (1u64 << 20) as f64,
        n as f64 * 8.0 / secs / 1e9
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_rates_read_well() {
        assert_eq!(bytes(4096), "4 KiB");
        assert_eq!(bytes(1000), "1000 B");
        assert_eq!(bytes(3 << 19), "1.5 MiB");
        assert_eq!(bytes(16 << 20), "16 MiB");
        assert_eq!(rate(1 << 20, 1.0), "1.0 MiB/s (0.01 Gbit/s)");
    }
}
