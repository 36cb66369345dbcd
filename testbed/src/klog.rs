//! Kernel-log and taint checks: any warning, BUG, oops or unexpected taint fails a VM run.

/// Lines containing any of these mark a kernel problem. (Not the bare word "bug": a harmless
/// ACPI boot line contains it.)
pub const MARKERS: &[&str] = &[
    "WARNING:",
    "BUG:",
    "Oops",
    "Call Trace",
    "general protection",
    "Kernel panic",
    "UBSAN:",
    "KASAN:",
];

/// Taint flags that are expected: `O` (out-of-tree module, bit 12) and `E` (unsigned module,
/// bit 13), which our own patched modules set.
pub const ALLOWED_TAINT: u64 = (1 << 12) | (1 << 13);

/// The kernel's taint letters, by bit (Documentation/admin-guide/tainted-kernels.rst).
const TAINT_LETTERS: &[u8; 19] = b"PFSRMBUDAWCIOELKXTN";

/// RFLAGS bits that are reserved on x86-64 and read as zero on every CPU: 3, 5, 15 and 22-63.
const RFLAGS_RESERVED: u64 = !((1 << 22) - 1) | (1 << 3) | (1 << 5) | (1 << 15);

/// Finds a register dump whose `EFLAGS` no x86 CPU can hold: a reserved bit set, or bit 1
/// (always one) clear. Such a dump shows that the emulator's CPU state went wrong, not the
/// guest kernel: QEMU 7.2's TCG does this now and then under network load (docs/testbed.md,
/// "Emulator faults"). Returns a line that says so.
pub fn emulator_fault(dmesg: &str) -> Option<String> {
    dmesg.lines().find_map(|l| {
        let hex = l.split("EFLAGS: ").nth(1)?.split_whitespace().next()?;
        let v = u64::from_str_radix(hex, 16).ok()?;
        (v & RFLAGS_RESERVED != 0 || v & 2 == 0).then(|| {
            format!(
                "emulator fault: a register dump shows EFLAGS {v:#010x}, which no x86 CPU can \
                 hold (reserved bits set); QEMU's CPU emulation went wrong, not the guest \
                 kernel (docs/testbed.md, \"Emulator faults\")"
            )
        })
    })
}

/// Returns one human-readable line per problem found in `dmesg` and `taint`.
pub fn problems(dmesg: &str, taint: Option<u64>) -> Vec<String> {
    let mut out: Vec<String> = dmesg
        .lines()
        .filter(|l| MARKERS.iter().any(|m| l.contains(m)))
        .map(|l| format!("kernel log: {}", l.trim()))
        .collect();
    match taint {
        None => {
            out.push("the kernel's taint value was not recorded (the VM did not finish)".into())
        }
        Some(t) if t & !ALLOWED_TAINT != 0 => out.push(format!(
            "kernel tainted: {t} ({})",
            taint_letters(t & !ALLOWED_TAINT)
        )),
        Some(_) => {}
    }
    out
}

fn taint_letters(t: u64) -> String {
    (0..64)
        .filter(|b| t & (1 << b) != 0)
        .map(|b| TAINT_LETTERS.get(b).map_or('?', |&c| c as char))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A WARN splat as the kernel prints it (shape of a real report from the guest kernel).
    const WARN_LOG: &str = "\
[    2.100000] rdma_rxe: loaded
[    5.312345] ------------[ cut here ]------------
[    5.312400] WARNING: CPU: 0 PID: 123 at drivers/dma-buf/dma-buf.c:1123 dma_buf_map_attachment+0x1a/0x150
[    5.312500] Modules linked in: rdma_rxe(O) ib_uverbs ib_core vgem
[    5.312600] Call Trace:
[    5.312700]  <TASK>
[    5.312800] ---[ end trace 0000000000000000 ]---
";

    const CLEAN_LOG: &str = "\
[    0.000000] Linux version 6.1.0-28-amd64
[    0.100000] ACPI: Using ACPI (MADT) for SMP configuration information; BIOS bug workaround
[    2.100000] rdma_rxe: loaded
";

    #[test]
    fn a_warn_splat_is_found() {
        let p = problems(WARN_LOG, Some(512));
        assert!(p.iter().any(|l| l.contains("WARNING: CPU: 0")));
        assert!(p.iter().any(|l| l.contains("Call Trace")));
        assert!(p.iter().any(|l| l.contains("kernel tainted: 512 (W)")));
    }

    #[test]
    fn a_clean_log_with_the_word_bug_passes() {
        assert!(problems(CLEAN_LOG, Some(0)).is_empty());
    }

    #[test]
    fn out_of_tree_taint_is_allowed() {
        assert!(problems(CLEAN_LOG, Some(4096 | 8192)).is_empty());
    }

    #[test]
    fn other_taint_fails() {
        let p = problems(CLEAN_LOG, Some(4096 | 1));
        assert_eq!(p, ["kernel tainted: 4097 (P)"]);
    }

    #[test]
    fn impossible_eflags_mark_an_emulator_fault() {
        // Lines from real testbed crashes under QEMU 7.2 (a double fault and a NULL
        // dereference), then ordinary ones from oopses on real hardware.
        let fault = "[   24.771641] RSP: 0018:ff5b9164800f3bd0 EFLAGS: 86e2ae02\n";
        assert!(emulator_fault(fault).is_some_and(|l| l.contains("0x86e2ae02")));
        assert!(emulator_fault("[ 13.198] RSP: 0018:ff66cec300003ea0 EFLAGS: fabc5483").is_some());
        for ok in [
            "RSP: 0018:ffffb2c0c0003e48 EFLAGS: 00010246",
            "EFLAGS: 00000212",
        ] {
            assert_eq!(emulator_fault(ok), None, "{ok}");
        }
        assert_eq!(emulator_fault(WARN_LOG), None);
        assert_eq!(emulator_fault(CLEAN_LOG), None);
    }

    #[test]
    fn missing_taint_fails() {
        assert_eq!(problems(CLEAN_LOG, None).len(), 1);
    }
}
