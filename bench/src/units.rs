//! Figures, sizes and node counts as every report writes them (tables, titles, plots, goals):
//! a leaf, so that the modules that describe what is measured and those that report it can
//! both use it.

/// A figure in about four significant digits.
pub fn num(x: f64) -> String {
    match x.abs() {
        a if a >= 1000.0 => format!("{x:.0}"),
        a if a >= 100.0 => format!("{x:.1}"),
        a if a >= 1.0 => format!("{x:.2}"),
        _ => format!("{x:.4}"),
    }
}

/// `2 B`, `64 KiB`, `8 MiB`.
pub fn size(n: u64) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

/// `one node (rxe loopback)` or `two nodes (emulated wire)`.
pub fn nodes_name(nodes: u8) -> &'static str {
    if nodes > 1 {
        "two nodes (emulated wire)"
    } else {
        "one node (rxe loopback)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_sizes_read_well() {
        assert_eq!(num(1234.5), "1234");
        assert_eq!(num(0.012345), "0.0123");
        assert_eq!(size(8), "8 B");
        assert_eq!(size(64 << 10), "64 KiB");
        assert_eq!(size(8 << 20), "8 MiB");
        assert_eq!(size(1500), "1500 B");
    }
}
