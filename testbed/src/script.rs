//! The shell scripts the testbed writes or runs, kept as real files under `testbed/src/scripts/`
//! and built in with `include_str!`. A script that needs values from Rust names them with
//! placeholders, `@NAME@` (capitals, digits and `_` between two `@`), which [`fill`] replaces;
//! nothing else in a script is special, so each reads as the shell it is. (xtask keeps its own
//! scripts the same way and fills them with [`fill`].)

use crate::fail;
use crate::sh::Result;
use std::collections::BTreeSet;

/// The initramfs's `/init` (busybox applets only): loads the modules, mounts the host's root
/// and the run folder, runs the run's `inner.sh` chrooted into the host's root, saves the
/// kernel log and taint, powers off. No placeholders: it reads the kernel command line.
pub const INIT: &str = include_str!("scripts/init.sh");

/// Each node's `inner.sh`: network, rxe device (and the patched stack), then the command.
/// Placeholders: `RUN`, `PEER_RUN`, `NODES`, `NODE`, `LOCAL_ADDR`, `PEER_ADDR`, `MODE`,
/// `RXE_MODULE`, `EXPORTER_MODULE`, `RDMA_LIB`, `ENV`, `CWD` (see [`crate::vm`]).
pub const INNER: &str = include_str!("scripts/inner.sh");

/// Extracts rxe's sources from the `linux-source` deb (host). Placeholders: `DEB`, `INTO`,
/// `SERIES`.
pub const RXE_SOURCES: &str = include_str!("scripts/rxe-sources.sh");

/// `dmabuf-testbed info`'s command in the VM (no placeholders).
pub const INFO: &str = include_str!("scripts/info.sh");

/// A placeholder found in a template: its name and the byte range of `@NAME@`.
fn placeholders(template: &str) -> impl Iterator<Item = (&str, std::ops::Range<usize>)> {
    let bytes = template.as_bytes();
    let mut at = 0;
    std::iter::from_fn(move || {
        while let Some(off) = template[at..].find('@') {
            let start = at + off;
            let name_len = bytes[start + 1..]
                .iter()
                .take_while(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || **b == b'_')
                .count();
            let end = start + 1 + name_len;
            if name_len > 0 && bytes.get(end) == Some(&b'@') {
                at = end + 1;
                return Some((&template[start + 1..end], start..end + 1));
            }
            at = start + 1;
        }
        None
    })
}

/// `template` with every `@NAME@` replaced by the value given for `NAME`, as it is (quote
/// words for the shell with [`crate::sh::quote`] first). Values are not searched for
/// placeholders.
///
/// # Errors
/// When the template has a placeholder that `values` does not fill, or `values` names one the
/// template does not have (a typo on either side), or names one twice.
pub fn fill(template: &str, values: &[(&str, &str)]) -> Result<String> {
    let mut given = BTreeSet::new();
    for (name, _) in values {
        if !given.insert(*name) {
            fail!("placeholder @{name}@ is given twice");
        }
    }
    let mut out = String::with_capacity(template.len());
    let mut used = BTreeSet::new();
    let mut last = 0;
    for (name, range) in placeholders(template) {
        let Some((_, value)) = values.iter().find(|(n, _)| *n == name) else {
            fail!("placeholder @{name}@ is not filled");
        };
        used.insert(name);
        out.push_str(&template[last..range.start]);
        out.push_str(value);
        last = range.end;
    }
    out.push_str(&template[last..]);
    if let Some(unknown) = given.difference(&used).next() {
        fail!("placeholder @{unknown}@ is given but the script has none of that name");
    }
    Ok(out)
}

/// Checks that the folder `dir` holds exactly the scripts `listed` (file name, built-in text),
/// each file's text the same as the built-in one: a crate's test that its `scripts/` folder and
/// its constants agree.
///
/// # Errors
/// Names the first difference.
pub fn check_folder(dir: &std::path::Path, listed: &[(&str, &str)]) -> Result {
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    on_disk.sort();
    let mut names: Vec<&str> = listed.iter().map(|(n, _)| *n).collect();
    names.sort();
    if on_disk != names {
        fail!(
            "{} holds {on_disk:?}, the constants name {names:?}",
            dir.display()
        );
    }
    for (name, text) in listed {
        if std::fs::read_to_string(dir.join(name))? != *text {
            fail!("{name} differs from its built-in text");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_every_placeholder_once_per_occurrence() {
        let t = "A=@A@ B=@B_2@\necho @A@ $@ x@y user@host @@@ begin\n";
        let s = fill(t, &[("A", "'1'"), ("B_2", "@A@")]).unwrap();
        assert_eq!(s, "A='1' B=@A@\necho '1' $@ x@y user@host @@@ begin\n");
        assert_eq!(fill("no placeholders", &[]).unwrap(), "no placeholders");
    }

    #[test]
    fn an_unfilled_placeholder_is_an_error() {
        let err = fill("a=@A@ b=@B@", &[("A", "1")]).unwrap_err();
        assert!(err.to_string().contains("@B@ is not filled"), "{err}");
    }

    #[test]
    fn an_unknown_placeholder_is_an_error() {
        let err = fill("a=@A@", &[("A", "1"), ("NODE", "a")]).unwrap_err();
        assert!(err.to_string().contains("@NODE@ is given"), "{err}");
        let err = fill("a=@A@", &[("A", "1"), ("A", "2")]).unwrap_err();
        assert!(err.to_string().contains("twice"), "{err}");
    }

    /// Every file of `testbed/src/scripts/`, by file name.
    const ALL: &[(&str, &str)] = &[
        ("init.sh", INIT),
        ("inner.sh", INNER),
        ("rxe-sources.sh", RXE_SOURCES),
        ("info.sh", INFO),
    ];

    /// A file added to the folder needs a constant here (and a place in `crate::scripts()`).
    #[test]
    fn every_script_file_is_listed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/scripts");
        check_folder(&dir, ALL).unwrap();
    }
}
