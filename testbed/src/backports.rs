//! The testbed's QEMU comes from Debian's bookworm-backports (QEMU 10): bookworm's own QEMU
//! 7.2 now and then corrupts the emulated CPU's state under the two-node testbed's network
//! load (docs/testbed.md, "Emulator faults").
//!
//! Setup adds the backports archive as an apt source (unless one is configured already) and
//! an apt preferences file that pins only QEMU's packages and the firmware it needs to it, so
//! that nothing else of the host is upgraded: backports' other packages keep priority 100
//! (never installed or upgraded unless asked for by name).

use crate::programs;

/// The archive suite the testbed's QEMU comes from.
pub const SUITE: &str = "bookworm-backports";

/// The oldest `qemu-system-x86` the testbed accepts (`dpkg --compare-versions` syntax).
pub const MIN_QEMU: &str = "1:10.0";

/// The Debian package of the testbed's QEMU.
pub const QEMU_PACKAGE: &str = "qemu-system-x86";

/// The packages pinned to [`SUITE`]: QEMU's own (`qemu-system-x86` needs the same version
/// of `qemu-system-common` and `qemu-system-data`, and any other installed `qemu-*` package
/// must move with them) and the BIOS it boots with (QEMU 10 needs seabios >= 1.16.3).
pub const PINNED: &str = "qemu-* seabios";

/// The apt source file setup writes when no source names [`SUITE`].
pub const SOURCE_FILE: &str = "/etc/apt/sources.list.d/gpu-rdma-testbed-backports.sources";

/// The apt preferences file setup writes.
pub const PIN_FILE: &str = "/etc/apt/preferences.d/gpu-rdma-testbed-qemu";

/// The source file's text (deb822, the format of bookworm's own `debian.sources`), for the
/// archive at `uri`.
pub fn source_text(uri: &str) -> String {
    format!(
        "Types: deb\nURIs: {uri}\nSuites: {SUITE}\nComponents: main\n\
         Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
}

/// The archive the host's own `bookworm` packages come from (the first apt source that names
/// that suite), so that backports come from the same mirror.
pub fn bookworm_uri() -> Option<String> {
    let files = ["/etc/apt/sources.list.d", "/etc/apt"]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "list" || x == "sources"));
    files
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .find_map(|text| uri_of_suite(&text, "bookworm"))
}

/// The archive URI of `suite` in an apt source file's `text` (deb822 stanzas or one-line
/// `deb` entries).
fn uri_of_suite(text: &str, suite: &str) -> Option<String> {
    for stanza in text.split("\n\n") {
        let field = |name: &str| {
            stanza.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == name).then(|| v.trim().to_string())
            })
        };
        if let (Some(uris), Some(suites)) = (field("URIs"), field("Suites")) {
            if suites.split_whitespace().any(|s| s == suite) {
                return uris.split_whitespace().next().map(str::to_string);
            }
        }
    }
    text.lines().map(str::trim).find_map(|l| {
        let mut words = l.split_whitespace().filter(|w| !w.starts_with('['));
        if words.next()? != "deb" {
            return None;
        }
        let (uri, s) = (words.next()?, words.next()?);
        (s == suite).then(|| uri.to_string())
    })
}

/// The preferences file's text: [`PINNED`] from [`SUITE`] above bookworm's 500, every other
/// package of [`SUITE`] at 100 (installed only when asked for by name, never as an upgrade).
pub fn pin_text() -> String {
    format!(
        "Explanation: the testbed's QEMU and its firmware from {SUITE} (QEMU 7.2 has a TCG fault)\n\
         Package: {PINNED}\nPin: release n={SUITE}\nPin-Priority: 990\n\n\
         Explanation: nothing else from {SUITE}\n\
         Package: *\nPin: release n={SUITE}\nPin-Priority: 100\n"
    )
}

/// Whether an apt source already names [`SUITE`] (then setup adds none).
pub fn source_configured() -> bool {
    let dirs = ["/etc/apt/sources.list.d", "/etc/apt"];
    dirs.iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "list" || x == "sources"))
        .filter(|p| p.as_os_str() != SOURCE_FILE)
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .any(|text| {
            text.lines()
                .map(str::trim)
                .filter(|l| !l.starts_with('#'))
                .any(|l| l.split_whitespace().any(|w| w == SUITE))
        })
}

/// Whether the installed [`QEMU_PACKAGE`] is older than [`MIN_QEMU`] (false when it is not
/// installed at all: then it is simply missing).
pub fn qemu_too_old() -> bool {
    let Some(version) = installed_qemu() else {
        return false;
    };
    !programs::cmd("dpkg")
        .args(["--compare-versions", &version, "ge", MIN_QEMU])
        .status()
        .is_ok_and(|s| s.success())
}

/// The installed [`QEMU_PACKAGE`]'s version.
pub fn installed_qemu() -> Option<String> {
    let out = programs::cmd("dpkg-query")
        .args(["-W", "-f=${db:Status-Abbrev} ${Version}", QEMU_PACKAGE])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text.strip_prefix("ii ")?.trim();
    (out.status.success() && !version.is_empty()).then(|| version.to_string())
}

/// Shell lines (run as root, before `apt-get update`) that write the pin and, unless a
/// source names [`SUITE`] already, the source.
pub fn configure_script() -> String {
    let write = |path: &str, text: &str| {
        format!(
            "printf '%s' {} > {}",
            crate::sh::quote(text),
            crate::sh::quote(path)
        )
    };
    let mut lines = Vec::new();
    if !source_configured() {
        match bookworm_uri() {
            Some(uri) => lines.push(write(SOURCE_FILE, &source_text(&uri))),
            None => lines.push(
                "echo 'no apt source names bookworm: add bookworm-backports as a source' >&2 \
                 && false"
                    .to_string(),
            ),
        }
    }
    lines.push(write(PIN_FILE, &pin_text()));
    lines.join(" && ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pin_lifts_only_qemu_and_its_bios() {
        let pin = pin_text();
        let stanzas: Vec<&str> = pin.split("\n\n").collect();
        assert_eq!(stanzas.len(), 2, "{pin}");
        assert!(stanzas[0].contains("Package: qemu-* seabios\n"));
        assert!(stanzas[0].contains("Pin: release n=bookworm-backports\nPin-Priority: 990"));
        assert!(stanzas[1].contains("Package: *\n"));
        assert!(stanzas[1].ends_with("Pin-Priority: 100\n"));
        let text = source_text("http://mirror.invalid/debian");
        assert!(text.contains("Suites: bookworm-backports\n"));
        assert!(text.contains("URIs: http://mirror.invalid/debian\n"));
    }

    #[test]
    fn the_mirror_is_the_one_bookworm_comes_from() {
        let deb822 = "Types: deb\nURIs: http://mirror.invalid/debian\nSuites: bookworm \
                      bookworm-updates\nComponents: main\n\nTypes: deb\n\
                      URIs: http://other.invalid/debian-security\nSuites: bookworm-security\n";
        assert_eq!(
            uri_of_suite(deb822, "bookworm").as_deref(),
            Some("http://mirror.invalid/debian")
        );
        let list = "# comment\ndeb [arch=amd64] http://one.invalid/debian bookworm main\n";
        assert_eq!(
            uri_of_suite(list, "bookworm").as_deref(),
            Some("http://one.invalid/debian")
        );
        assert_eq!(uri_of_suite(list, "trixie"), None);
    }

    #[test]
    fn the_configure_lines_write_exactly_the_files() {
        let s = configure_script();
        assert!(s.contains(PIN_FILE), "{s}");
        crate::programs::check(&s, false).unwrap();
        // Run them with the files redirected into a scratch folder.
        let dir = std::env::temp_dir().join(format!("backports-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (pin, src) = (dir.join("pin"), dir.join("src"));
        let script = s
            .replace(
                &crate::sh::quote(PIN_FILE),
                &crate::sh::quote(&pin.to_string_lossy()),
            )
            .replace(
                &crate::sh::quote(SOURCE_FILE),
                &crate::sh::quote(&src.to_string_lossy()),
            );
        let ok = crate::programs::shell(&script).unwrap().status().unwrap();
        assert!(ok.success(), "{script}");
        assert_eq!(std::fs::read_to_string(&pin).unwrap(), pin_text());
        if s.contains(SOURCE_FILE) {
            let uri = bookworm_uri().expect("this host's bookworm source");
            assert_eq!(std::fs::read_to_string(&src).unwrap(), source_text(&uri));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
