//! Each DRM device: driver, card and render nodes, whether this user may open them (and which
//! group would let it), and PRIME export.

use crate::{problems, Check, Status};
use drm_export::DrmDevice;
use drm_export::{drm_nodes, NodeKind};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const SECTION: &str = "drm";

/// A GPU (or vgem) that the probe can allocate on: the node to use and its driver.
#[derive(Debug)]
pub struct Gpu {
    /// The open node (the render node for GEM drivers, the card node for dumb buffers).
    pub device: Arc<DrmDevice>,
    /// The driver's name.
    pub driver: String,
}

/// What [`inspect`] found.
#[derive(Debug, Default)]
pub struct Gpus {
    /// The findings.
    pub checks: Vec<Check>,
    /// The devices the probe can allocate on.
    pub gpus: Vec<Gpu>,
}

/// Drivers whose GEM allocator this crate uses on the render node.
pub const GEM_DRIVERS: [&str; 3] = ["i915", "amdgpu", "xe"];

/// `crw-rw---- root:video` for a device node.
pub fn describe_node(path: impl AsRef<Path>) -> String {
    let Ok(m) = std::fs::metadata(path.as_ref()) else {
        return "cannot stat".into();
    };
    format!(
        "{} {}:{}",
        mode_text(m.permissions().mode()),
        user_name(m.uid()),
        group_name(m.gid())
    )
}

fn mode_text(mode: u32) -> String {
    let mut s = String::from("c");
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(uid.into())
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| uid.to_string())
}

fn group_name(gid: u32) -> String {
    nix::unistd::Group::from_gid(gid.into())
        .ok()
        .flatten()
        .map(|g| g.name)
        .unwrap_or_else(|| gid.to_string())
}

/// Why this process may not open `path` read-write, naming the group that would let it in.
fn permission_problem(path: &Path) -> Option<(String, String)> {
    use nix::unistd::{access, getegid, geteuid, getgroups, AccessFlags};
    if access(path, AccessFlags::R_OK | AccessFlags::W_OK).is_ok() {
        return None;
    }
    let m = std::fs::metadata(path).ok()?;
    let group = group_name(m.gid());
    let mine = getgroups().unwrap_or_default();
    let member = getegid().as_raw() == m.gid() || mine.iter().any(|g| g.as_raw() == m.gid());
    let uid = geteuid();
    let found = format!(
        "{}; you (uid {uid}) may not open it read-write{}",
        describe_node(path),
        if member {
            String::new()
        } else {
            format!(" (not in group {group})")
        }
    );
    let group_rw = m.permissions().mode() & 0o060 == 0o060;
    let detail = if group_rw && !member {
        format!("join group `{group}`: `sudo usermod -aG {group} $USER`, then log in again")
    } else {
        format!(
            "the node is {}; a udev rule should give group `render` (render nodes) or `video` \
             (card nodes) read-write access",
            describe_node(path)
        )
    };
    Some((found, detail))
}

/// The `device` folder of a node in sysfs, to tell which nodes belong to one device.
fn sysfs_device(sysfs: &Path, node: &Path) -> Option<PathBuf> {
    let name = node.file_name()?;
    sysfs
        .join("class/drm")
        .join(name)
        .join("device")
        .canonicalize()
        .ok()
}

/// Checks every DRM node and picks, per device, the node the probe allocates on.
pub fn inspect(sysfs: &Path) -> Gpus {
    let mut out = Gpus::default();
    let mut all = Vec::new();
    for kind in [NodeKind::Card, NodeKind::Render] {
        match drm_nodes(kind) {
            Ok(n) => all.extend(n.into_iter().map(|p| (kind, p))),
            Err(e) => out.checks.push(Check::problem(
                SECTION,
                "/dev/dri",
                Status::Fail,
                e.to_string(),
                &problems::NO_DRM_DEVICE,
            )),
        }
    }
    if all.is_empty() {
        out.checks.push(Check::problem(
            SECTION,
            "DRM devices",
            Status::Warn,
            "/dev/dri has no card or render node (no GPU driver loaded)",
            &problems::NO_DRM_DEVICE,
        ));
        return out;
    }
    // Devices already given a probe node, by their sysfs folder.
    let mut chosen: Vec<Option<PathBuf>> = Vec::new();
    let mut opened = Vec::new();
    for (kind, path) in &all {
        if let Some((found, fix)) = permission_problem(path) {
            let mut c = Check::problem(
                SECTION,
                path.display().to_string(),
                Status::Fail,
                found,
                &problems::DRI_EACCES,
            );
            // The table's fix names both groups; this one names the node's own.
            c.fix = Some(fix);
            out.checks.push(c);
            continue;
        }
        let dev = match DrmDevice::open(path) {
            Ok(d) => d,
            Err(e) => {
                out.checks.push(Check::problem(
                    SECTION,
                    path.display().to_string(),
                    Status::Fail,
                    e.to_string(),
                    &problems::NO_DRM_DEVICE,
                ));
                continue;
            }
        };
        let driver = dev.driver().name.clone();
        let export = dev.capabilities().map(|c| c.prime_export);
        let node = match kind {
            NodeKind::Card => "card node",
            NodeKind::Render => "render node",
        };
        let desc = format!("{driver}, {node}, {}", describe_node(path));
        let can_export = matches!(export, Ok(true));
        out.checks.push(match export {
            Ok(true) => Check::ok(
                SECTION,
                path.display().to_string(),
                format!("{desc}, PRIME export"),
            ),
            Ok(false) => Check::problem(
                SECTION,
                path.display().to_string(),
                Status::Warn,
                format!("{desc}: no PRIME export"),
                &problems::NO_PRIME_EXPORT,
            ),
            Err(e) => Check::problem(
                SECTION,
                path.display().to_string(),
                Status::Warn,
                format!("{desc}: {e}"),
                &problems::NO_PRIME_EXPORT,
            ),
        });
        if can_export {
            opened.push((*kind, sysfs_device(sysfs, path), driver, dev));
        }
    }
    // Per device: the render node for GEM drivers, the card node for the rest (dumb buffers).
    opened.sort_by_key(|(kind, _, driver, _)| {
        let gem = GEM_DRIVERS.contains(&driver.as_str());
        (
            gem != (*kind == NodeKind::Render),
            *kind == NodeKind::Render,
        )
    });
    for (kind, dir, driver, dev) in opened {
        let gem = GEM_DRIVERS.contains(&driver.as_str());
        if !gem && kind == NodeKind::Render {
            continue;
        }
        if dir.is_some() && chosen.contains(&dir) {
            continue;
        }
        chosen.push(dir);
        out.gpus.push(Gpu {
            device: Arc::new(dev),
            driver,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_read_like_ls() {
        assert_eq!(mode_text(0o20660), "crw-rw----");
        assert_eq!(mode_text(0o600), "crw-------");
    }
}
