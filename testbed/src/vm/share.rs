//! Host paths handed to the guest, each in the form its reader takes without loss:
//!
//! * QEMU option values (`-virtfs local,path=...`, `-netdev dgram,local.path=...`):
//!   [`qemu_value`], every comma doubled, so that no part of a path can end the value and
//!   start another option.
//! * `/init` (`scripts/init.sh`): never the kernel command line, which the guest splits on
//!   whitespace. The host writes the paths into the node's run folder ([`lines`], one
//!   `key=path` a line, bytes as they are), which QEMU shares under the fixed tag `out`;
//!   `/init` reads them with `IFS= read -r` and quotes every use.
//! * `inner.sh`: quoted words ([`crate::sh::quote`]); the folders named there must be UTF-8
//!   ([`utf8`]), since the script is text.
//!
//! What none of these can carry is refused with an [`Unsharable`] error that names the path
//! and the character or byte.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// Why the testbed cannot hand a host path to the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// The path has a newline: `/init` reads the paths one a line.
    Newline,
    /// The path's bytes are not UTF-8 text (the first byte that is not): it is named in a
    /// script the host writes as text. Only the cache's folders are named so; the working
    /// folder may hold any bytes but a newline.
    NotUtf8(u8),
    /// The folder would be shared writable, and it is the root or a system folder (`/`,
    /// `/usr`, `/etc`, `/proc`, ...): the guest could change the host's system.
    SystemFolder,
}

/// A host path the testbed cannot hand to the guest, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsharable {
    /// The path.
    pub path: PathBuf,
    /// What in it cannot be carried.
    pub reason: Reason,
}

impl std::fmt::Display for Unsharable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the testbed cannot share the folder {:?}: ", self.path)?;
        match self.reason {
            Reason::Newline => write!(f, "it contains a newline (U+000A)"),
            Reason::SystemFolder => write!(
                f,
                "the root and the system's folders are never shared writable (run from a \
                 project's folder)"
            ),
            Reason::NotUtf8(byte) => write!(
                f,
                "it contains the byte 0x{byte:02X}, which is not UTF-8 (the testbed's cache \
                 folder must be UTF-8 text)"
            ),
        }
    }
}

impl std::error::Error for Unsharable {}

/// `value` as one QEMU option value: every `,` doubled (QEMU's escape), every other byte
/// as it is.
pub fn qemu_value(value: &OsStr) -> OsString {
    let mut out = Vec::with_capacity(value.len());
    for &b in value.as_bytes() {
        out.push(b);
        if b == b',' {
            out.push(b',');
        }
    }
    OsString::from_vec(out)
}

/// `path`, if it has no newline.
///
/// # Errors
/// [`Reason::Newline`].
pub fn one_line(path: &Path) -> Result<&Path, Unsharable> {
    if path.as_os_str().as_bytes().contains(&b'\n') {
        return Err(Unsharable {
            path: path.to_path_buf(),
            reason: Reason::Newline,
        });
    }
    Ok(path)
}

/// `path` as text, if it is UTF-8.
///
/// # Errors
/// [`Reason::NotUtf8`], with the first byte that is not.
pub fn utf8(path: &Path) -> Result<&str, Unsharable> {
    let bytes = path.as_os_str().as_bytes();
    std::str::from_utf8(bytes).map_err(|e| Unsharable {
        path: path.to_path_buf(),
        reason: Reason::NotUtf8(bytes[e.valid_up_to()]),
    })
}

/// Folders never shared writable: the root, and the system's folders themselves.
const SYSTEM_FOLDERS: [&str; 13] = [
    "/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/run", "/sbin", "/sys",
    "/usr", "/var",
];
/// Trees none of whose folders is shared writable: the kernel's and the devices'.
const SYSTEM_TREES: [&str; 3] = ["/dev", "/proc", "/sys"];

/// `path`, if it may be shared writable: not the root, a system folder, or a folder under
/// `/dev`, `/proc` or `/sys`.
///
/// # Errors
/// [`Reason::SystemFolder`].
pub fn writable(path: &Path) -> Result<&Path, Unsharable> {
    let system = SYSTEM_FOLDERS.iter().any(|f| path == Path::new(f))
        || SYSTEM_TREES.iter().any(|t| path.starts_with(t));
    if system {
        return Err(Unsharable {
            path: path.to_path_buf(),
            reason: Reason::SystemFolder,
        });
    }
    Ok(path)
}

/// The file `/init` reads: one `key=path` a line, each path's bytes as they are.
///
/// # Errors
/// A path has a newline ([`one_line`]).
pub fn lines(entries: &[(&str, &Path)]) -> Result<Vec<u8>, Unsharable> {
    let mut out = Vec::new();
    for (key, path) in entries {
        out.extend_from_slice(key.as_bytes());
        out.push(b'=');
        out.extend_from_slice(one_line(path)?.as_os_str().as_bytes());
        out.push(b'\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(b: &[u8]) -> PathBuf {
        PathBuf::from(OsStr::from_bytes(b))
    }

    #[test]
    fn commas_are_doubled_and_nothing_else_changes() {
        let odd = bytes(b"/t/work,path=/t/sib ling '\"$x\\*=,,\xff");
        assert_eq!(
            qemu_value(odd.as_os_str()).as_bytes(),
            b"/t/work,,path=/t/sib ling '\"$x\\*=,,,,\xff"
        );
        assert_eq!(qemu_value(OsStr::new("/plain")), "/plain");
    }

    #[test]
    fn the_root_and_system_folders_are_never_writable_shares() {
        for p in [
            "/",
            "/usr",
            "/etc",
            "/proc/self",
            "/sys/kernel",
            "/dev/shm",
            "/var",
        ] {
            let e = writable(Path::new(p)).unwrap_err();
            assert_eq!(e.reason, Reason::SystemFolder, "{p}");
            assert!(e.to_string().contains("never shared writable"), "{e}");
        }
        for p in [
            "/srv/project",
            "/tmp/x",
            "/root/project",
            "/home/u/src",
            "/var/tmp/x",
        ] {
            assert!(writable(Path::new(p)).is_ok(), "{p}");
        }
    }

    #[test]
    fn a_newline_is_refused_by_name() {
        let p = Path::new("/t/a\nb");
        let e = one_line(p).unwrap_err();
        assert_eq!(e.reason, Reason::Newline);
        assert_eq!(
            e.to_string(),
            r#"the testbed cannot share the folder "/t/a\nb": it contains a newline (U+000A)"#
        );
        let e = lines(&[("run", Path::new("/r")), ("cwd", p)]).unwrap_err();
        assert_eq!(e.path, p);
        assert!(one_line(Path::new("/t/a\tb\rc")).is_ok());
    }

    #[test]
    fn bytes_that_are_not_utf8_are_named() {
        let p = bytes(b"/t/caf\xe9/x");
        let e = utf8(&p).unwrap_err();
        assert_eq!(e.reason, Reason::NotUtf8(0xe9));
        assert!(e.to_string().contains("the byte 0xE9"), "{e}");
        assert!(e.to_string().contains(r#""/t/caf\xE9/x""#), "{e}");
        assert_eq!(utf8(Path::new("/t/café")).unwrap(), "/t/café");
    }

    #[test]
    fn the_paths_file_keeps_every_byte_but_newlines() {
        let cwd = bytes(b"/t/a b,c=d'e\"f$g\\h*\xff");
        let out = lines(&[("run", Path::new("/r/a")), ("cwd", &cwd)]).unwrap();
        assert_eq!(out, b"run=/r/a\ncwd=/t/a b,c=d'e\"f$g\\h*\xff\n");
    }
}
