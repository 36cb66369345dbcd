//! The topology checks on recorded sysfs trees (`tests/fixtures/`, hand-made after the
//! kernel's documented layout), and the "Common errors" table of docs/hardware.md against the
//! doctor's own table.

use gpu_rdma_doctor::pci::Acs;
use gpu_rdma_doctor::topology::{self, checks, gpus, nics, pair};
use gpu_rdma_doctor::{problems, Check, Status};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn find<'a>(checks: &'a [Check], name: &str) -> &'a Check {
    checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check {name:?} in {checks:#?}"))
}

#[test]
fn a_gpu_and_a_nic_under_one_switch_are_peer_to_peer_capable() {
    let root = fixture("one-switch");
    let g = gpus(&root);
    let names: Vec<&str> = g.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["card0", "card1"], "connectors are not cards");
    assert_eq!(g[0].address(), None, "vgem is a platform device");
    assert_eq!(g[1].address(), Some("0000:03:00.0"));
    assert_eq!(g[1].driver.as_deref(), Some("amdgpu"));
    let n = nics(&root);
    assert_eq!(n[0].chain.last().map(String::as_str), Some("0000:04:00.0"));
    let v = pair(&root, &g[1], &n[0]);
    assert_eq!(v.common_bridge.as_deref(), Some("0000:01:00.0"));
    let acs_ok = Acs::Control {
        request_redirect: false,
        completion_redirect: false,
        egress_control: false,
    };
    assert_eq!(
        v.bridges,
        [
            ("0000:02:00.0".to_string(), acs_ok),
            ("0000:02:01.0".into(), acs_ok)
        ]
    );
    assert_eq!(v.check.status, Status::Ok, "{:?}", v.check);
    let all = checks(&root, "BOOT_IMAGE=/vmlinuz root=/dev/sda1 iommu=pt");
    assert_eq!(find(&all, "card1 <-> mlx5_0").status, Status::Ok);
    let bars = find(&all, "card1 BARs");
    assert_eq!(bars.status, Status::Ok);
    assert!(bars.found.contains("BAR0 32 GiB"), "{}", bars.found);
    let iommu = find(&all, "IOMMU");
    assert_eq!(iommu.status, Status::Ok, "{iommu:?}");
    assert!(iommu.found.contains("dmar0") && iommu.found.contains("iommu=pt"));
    assert!(find(&all, "devices off PCI").found.contains("card0"));
    let choice = find(&all, "card1 NIC");
    assert!(
        choice
            .found
            .starts_with("the transfer engine would use mlx5_0 for card1")
            && choice.found.contains(
                "mlx5_0: behind the same PCIe switch as 0000:03:00.0 (bridge 0000:01:00.0)"
            ),
        "{choice:?}"
    );
    assert!(all.iter().all(|c| c.status == Status::Ok), "{all:#?}");
}

#[test]
fn acs_redirect_on_a_bridge_in_between_is_a_warning_naming_the_bridge() {
    let root = fixture("one-switch-acs-redirect");
    let all = checks(&root, "");
    let c = find(&all, "card1 <-> mlx5_0");
    assert_eq!(c.status, Status::Warn);
    assert_eq!(c.problem, Some(problems::ACS_REDIRECT.id));
    assert!(
        c.found.contains("request redirect, completion redirect"),
        "{c:?}"
    );
    assert!(
        c.fix
            .as_deref()
            .unwrap_or("")
            .contains("bridge 0000:02:01.0"),
        "{c:?}"
    );
}

#[test]
fn different_root_ports_and_host_bridges_meet_only_at_the_cpu() {
    let root = fixture("two-root-ports");
    let all = checks(&root, "BOOT_IMAGE=/vmlinuz amd_iommu=on");
    let same_rc = find(&all, "card0 <-> mlx5_0");
    assert_eq!(same_rc.status, Status::Warn);
    assert_eq!(same_rc.problem, Some(problems::P2P_ROOT_COMPLEX.id));
    assert!(
        same_rc
            .found
            .contains("only at the root complex pci0000:00"),
        "{same_rc:?}"
    );
    assert!(same_rc.found.contains("ACS unknown"), "{same_rc:?}");
    let other = find(&all, "card0 <-> mlx5_1");
    assert_eq!(other.status, Status::Warn);
    assert!(
        other.found.contains("different PCI host bridges"),
        "{other:?}"
    );
    // mlx5_0 shares the GPU's root complex, mlx5_1 is under another host bridge.
    let choice = find(&all, "card0 NIC");
    assert!(
        choice
            .found
            .starts_with("the transfer engine would use mlx5_0 for card0")
            && choice
                .found
                .contains("under the same host bridge as 0000:01:00.0")
            && choice.found.contains("then mlx5_1 tier 1 (other)"),
        "{choice:?}"
    );
    let bars = find(&all, "card0 BARs");
    assert_eq!(bars.problem, Some(problems::SMALL_BAR.id));
    assert!(bars.found.contains("the largest is 256 MiB"), "{bars:?}");
    let iommu = find(&all, "IOMMU");
    assert_eq!(iommu.problem, Some(problems::IOMMU_TRANSLATED.id));
    assert!(iommu.found.contains("card0: DMA-FQ") && iommu.found.contains("amd_iommu=on"));
    assert_eq!(
        topology::endpoint(&root, "infiniband", "mlx5_1").chain[0],
        "pci0000:80"
    );
}

#[test]
fn an_agents_nics_are_ranked_among_its_own_devices_after_the_override_given() {
    let root = fixture("two-root-ports");
    let g = gpus(&root);
    let all = nics(&root);
    // The override of `gpu-rdma-doctor agent --nics` moves tier 0 and says so.
    let over = "0000:01:00.0=mlx5_1".parse().unwrap();
    let c = topology::ranked_choices(&root, &g, &all, Some(&over), "--nics");
    assert!(
        c[0].found
            .starts_with("the transfer engine would use mlx5_1 for card0 (nvidia, 0000:01:00.0) memory (set by --nics)")
            && c[0].found.contains("then mlx5_0 tier 1"),
        "{c:#?}"
    );
    // An agent given mlx5_1 alone: tiers are dense, so mlx5_1 is its tier 0.
    let only = [topology::endpoint(&root, "infiniband", "mlx5_1")];
    let c = topology::ranked_choices(&root, &g, &only, None, "GPU_RDMA_NICS");
    assert!(
        c[0].found
            .starts_with("the transfer engine would use mlx5_1 for card0")
            && !c[0].found.contains("mlx5_0"),
        "{c:#?}"
    );
}

#[test]
fn hardware_md_carries_the_doctors_table_of_common_errors() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/hardware.md"))
            .expect("docs/hardware.md");
    let begin = "<!-- common-errors: generated from gpu_rdma_doctor::problems; regenerate with `gpu-rdma-doctor --common-errors` -->\n";
    let end = "<!-- end of common-errors -->";
    let start = doc
        .find(begin)
        .expect("the begin marker in docs/hardware.md")
        + begin.len();
    let stop = doc[start..].find(end).expect("the end marker") + start;
    assert_eq!(
        &doc[start..stop],
        problems::markdown_table(),
        "docs/hardware.md's Common errors table differs from the doctor's: paste the output \
         of `cargo run -p gpu-rdma-doctor -- --common-errors` between the markers"
    );
    assert!(
        doc.starts_with("# Running on real GPUs and NICs\n\nRun the doctor first"),
        "docs/hardware.md starts with \"run the doctor first\""
    );
}
