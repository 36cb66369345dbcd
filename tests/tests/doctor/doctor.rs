//! `gpu-rdma-doctor` in the testbed VM, run as a user would run it: on the patched stack it
//! registers vgem, udmabuf and system-heap buffers on rxe0 and says ok; on the stock stack it
//! fails at the provider and points to `kernel-patches/`; for a user who may not open
//! `/dev/dri` it names the group; with no RDMA device it says so.

use integration_tests::device_admin::put_back;
use integration_tests::process::{doctor, doctor_check as check, doctor_json as json, run, text};
use integration_tests::testbed::Testbed;
use serde_json::Value;
use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

const T: Duration = Duration::from_secs(120);

/// The tests that change the machine (node permissions, the rxe device) run one at a time.
static MACHINE: Mutex<()> = Mutex::new(());

fn registered(report: &Value, source: &str, nic: &str) -> bool {
    report["matrix"]
        .as_array()
        .expect("matrix")
        .iter()
        .any(|r| r["source"] == source && r["nic"] == nic && r["registered"] == true)
}

#[test]
#[ignore = "needs the testbed VM"]
fn doctor_says_ok_and_registers_vgem_udmabuf_and_the_heap_on_rxe0() {
    let tb = Testbed::get();
    let _m = MACHINE.lock().unwrap_or_else(|e| e.into_inner());
    let out = run(doctor().arg("--json"), T);
    let report = json(&out);
    assert!(
        out.status.success(),
        "exit status {:?}:\n{report:#}",
        out.status
    );
    assert_eq!(report["verdict"]["status"], "ok", "{report:#}");
    for source in ["vgem", "udmabuf", "dma-heap system"] {
        assert!(
            registered(&report, source, &tb.device),
            "{source} on {}: {report:#}",
            tb.device
        );
    }
    let probe = check(&report, &format!("{} dma-buf MRs", tb.device));
    assert_eq!(probe["status"], "ok", "{probe:#}");
    assert!(
        probe["found"].as_str().unwrap_or("").contains("EBADF"),
        "{probe:#}"
    );
    // rxe moves data with the CPU; on the testbed's 6.12 udmabuf's vmap misplaces huge
    // pages, so registering such udmabufs is refused, and the doctor says why.
    let huge = check(&report, &format!("{} udmabufs over huge pages", tb.device));
    assert_eq!(huge["status"], "warn", "{huge:#}");
    assert_eq!(huge["problem"], "udmabuf-huge-page-vmap", "{huge:#}");
    // The testbed's patched libibverbs, preloaded in every program of the guest.
    let lib = check(&report, "libibverbs");
    assert!(
        lib["found"]
            .as_str()
            .unwrap_or("")
            .contains("through /etc/ld.so.preload"),
        "{lib:#}"
    );
    // The text form carries the same verdict and the matrix.
    let out = run(&mut doctor(), T);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("registration matrix") && t.contains("\nverdict [ok] "),
        "{t}"
    );
    eprintln!("{t}");
}

/// Puts the DRM nodes' owner and mode back as they were when dropped.
struct Restore(Vec<(PathBuf, u32, u32, u32)>);

impl Drop for Restore {
    fn drop(&mut self) {
        for (p, uid, gid, mode) in &self.0 {
            let _ = chown(p, Some(*uid), Some(*gid));
            let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(*mode));
        }
    }
}

/// The gid of group `name` in /etc/group.
fn gid_of(name: &str) -> u32 {
    let groups = std::fs::read_to_string("/etc/group").expect("/etc/group");
    groups
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&name)).then(|| f.get(2)?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no group {name} in /etc/group"))
}

#[test]
#[ignore = "needs the testbed VM"]
fn doctor_names_the_group_a_user_lacks_for_dev_dri() {
    Testbed::get();
    let _m = MACHINE.lock().unwrap_or_else(|e| e.into_inner());
    let video = gid_of("video");
    let mut saved = Vec::new();
    for e in std::fs::read_dir("/dev/dri").expect("/dev/dri").flatten() {
        let p = e.path();
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.file_type().is_dir() || m.file_type().is_symlink() {
            continue;
        }
        saved.push((p, m.uid(), m.gid(), m.mode() & 0o7777));
    }
    assert!(!saved.is_empty(), "/dev/dri has no node");
    let restore = Restore(saved);
    for (p, ..) in &restore.0 {
        chown(p, Some(0), Some(video)).expect("chown");
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o660)).expect("chmod");
    }
    // nobody: std's Command drops the supplementary groups before setuid.
    let out = run(doctor().arg("--no-probe").uid(65534).gid(65534), T);
    drop(restore);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    let card = Path::new("/dev/dri/card0").display().to_string();
    assert!(
        t.contains(&format!("[fail] {card}: crw-rw---- root:video")),
        "{t}"
    );
    assert!(t.contains("(not in group video)"), "{t}");
    assert!(
        t.contains("join group `video`: `sudo usermod -aG video $USER`"),
        "{t}"
    );
    eprintln!("{t}");
}

#[test]
#[ignore = "needs the testbed VM"]
fn doctor_says_there_is_no_rdma_device_without_rxe() {
    let tb = Testbed::get();
    let _m = MACHINE.lock().unwrap_or_else(|e| e.into_inner());
    let del = run(Command::new("rdma").args(["link", "delete", &tb.device]), T);
    assert!(del.status.success(), "{}", text(&del));
    let out = run(doctor().arg("--json"), T);
    // Put the device back as the testbed made it, before asserting anything.
    put_back(&tb);
    let report = json(&out);
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let devices = check(&report, "RDMA devices");
    assert_eq!(devices["status"], "fail", "{devices:#}");
    assert!(
        devices["found"]
            .as_str()
            .unwrap_or("")
            .contains("there is no RDMA device"),
        "{devices:#}"
    );
    assert!(
        devices["fix"]
            .as_str()
            .unwrap_or("")
            .contains("rdma link add"),
        "{devices:#}"
    );
    let verdict = report["verdict"]["line"].as_str().unwrap_or("");
    assert!(verdict.contains("there is no RDMA device"), "{verdict}");
}

/// Tests of Debian's stock (unpatched) rxe: `cargo xtask test` runs this module there.
mod stock_only {
    use super::*;

    #[test]
    #[ignore = "needs the testbed VM"]
    fn stock_only_doctor_fails_at_the_provider_pointing_to_kernel_patches() {
        let tb = Testbed::get();
        let out = run(doctor().arg("--json"), T);
        let report = json(&out);
        assert_eq!(out.status.code(), Some(1), "{report:#}");
        let name = format!("{} dma-buf MRs", tb.device);
        let probe = check(&report, &name);
        assert_eq!(probe["status"], "fail", "{probe:#}");
        assert!(
            probe["found"].as_str().unwrap_or("").contains("EOPNOTSUPP"),
            "{probe:#}"
        );
        assert!(
            probe["fix"]
                .as_str()
                .unwrap_or("")
                .contains("kernel-patches/"),
            "{probe:#}"
        );
        let verdict = report["verdict"]["line"].as_str().unwrap_or("");
        assert_eq!(report["verdict"]["status"], "fail");
        assert!(
            verdict.contains(&name) && verdict.contains("kernel-patches/"),
            "{verdict}"
        );
        assert!(!registered(&report, "vgem", &tb.device), "{report:#}");
        let out = run(&mut doctor(), T);
        eprintln!("{}", text(&out));
    }
}
