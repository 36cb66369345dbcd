//! The library's C and Python examples, run in the testbed VM against the real vgem, udmabuf
//! and system heap, as a user would run them: the C one compiled with `cc` against
//! `include/dmabuf_alloc.h` and linked to `libdmabuf_alloc.so`, the Python one loading the
//! library with `ctypes`. Each must report every source filled and read back, and the errno of
//! each bad argument. On the host: the header and the library export the same functions.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Every source the library offers, as `dmabuf_alloc_from` names them.
const SOURCES: &[&str] = &["vgem", "udmabuf", "system"];

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The folder holding `libdmabuf_alloc.so`, which cargo builds with this test binary.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("target/<profile>/deps").to_path_buf();
    assert!(
        deps.join("libdmabuf_alloc.so").is_file(),
        "{} has no libdmabuf_alloc.so: cargo test builds it",
        deps.display()
    );
    deps
}

/// A writable folder: the testbed run's in the VM (the rest of the guest is read-only).
fn scratch() -> PathBuf {
    let dir = PathBuf::from(std::env::var_os("TESTBED_RUN").expect("TESTBED_RUN: run in the VM"))
        .join("dmabuf-alloc");
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Checks an example's report: exit 0, one `RESULT source=<s> size=<n> ok` per source with a
/// page-multiple size, and the expected `ERROR` lines.
fn check_report(out: &Output, errors: &[(&str, i32)]) {
    let all = text(out);
    assert!(out.status.success(), "{all}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for s in SOURCES {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("RESULT source={s} ")))
            .unwrap_or_else(|| panic!("no result for {s}:\n{all}"));
        let size: u64 = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("size="))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no size in {line:?}"));
        assert!(size >= 1_000_000 && size.is_multiple_of(4096), "{line}");
        assert!(line.ends_with(" ok"), "{line}");
    }
    for (what, errno) in errors {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("ERROR {what} ")))
            .unwrap_or_else(|| panic!("no error line for {what}:\n{all}"));
        assert!(line.contains(&format!("errno={errno} ")), "{line}");
        // The message names what went wrong, not just the errno.
        assert!(
            line.len() > format!("ERROR {what} errno={errno} ").len() + 10,
            "{line}"
        );
    }
}

#[test]
#[ignore = "needs the testbed VM (vgem, udmabuf, the system heap)"]
fn c_example_fills_and_reads_back_every_source() {
    let exe = scratch().join("fill_and_check");
    let cc = Command::new("cc")
        .args(["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror"])
        .arg(crate_dir().join("examples/fill_and_check.c"))
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg("-L")
        .arg(lib_dir())
        .arg("-ldmabuf_alloc")
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("cc");
    assert!(cc.status.success(), "cc failed: {}", text(&cc));
    // The C example, compiled just above: built by this workspace.
    let out = Command::new(&exe)
        .args(SOURCES)
        .env("LD_LIBRARY_PATH", lib_dir())
        .output()
        .expect("run the C example");
    check_report(
        &out,
        &[
            ("size-0", libc::EINVAL),
            ("bad-source", libc::EINVAL),
            ("not-a-dmabuf", libc::EINVAL),
            ("no-heap", libc::ENOENT),
        ],
    );
}

#[test]
#[ignore = "needs the testbed VM (vgem, udmabuf, the system heap)"]
fn python_example_fills_and_reads_back_every_source() {
    let out = Command::new("/usr/bin/python3")
        .arg(crate_dir().join("examples/fill_and_check.py"))
        .args(SOURCES)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3");
    check_report(&out, &[("size-0", libc::EINVAL)]);
}

/// The `extern "C"` functions of `src/`, by name.
fn exported() -> Vec<String> {
    let mut names = Vec::new();
    for f in std::fs::read_dir(crate_dir().join("src")).expect("src/") {
        let src = std::fs::read_to_string(f.expect("src/ entry").path()).expect("source");
        for l in src.lines() {
            if let Some((_, rest)) = l.split_once("extern \"C\" fn ") {
                names.push(rest.split('(').next().unwrap_or("").to_string());
            }
        }
    }
    names.sort();
    names
}

#[test]
fn header_declares_exactly_the_exported_functions() {
    let header =
        std::fs::read_to_string(crate_dir().join("include/dmabuf_alloc.h")).expect("header");
    let mut declared: Vec<String> = header
        .lines()
        .filter(|l| !l.starts_with([' ', '#', '/']) && l.contains('('))
        .filter_map(|l| l.split('(').next()?.rsplit([' ', '*']).next())
        .map(str::to_string)
        .collect();
    declared.sort();
    let exported = exported();
    assert!(exported.len() >= 11, "{exported:?}");
    assert_eq!(declared, exported);
}
