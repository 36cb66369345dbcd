//! `cargo xtask wheel`: the Python package as a wheel, without maturin (which Debian does
//! not package): the extension module `cargo build` made, the package's Python sources and
//! stubs, and the `.dist-info` (METADATA, WHEEL, RECORD with each file's SHA-256), zipped by
//! Python's own `zipfile`. Tagged `cp39-abi3-linux_<machine>`: the module is built for the
//! stable ABI of CPython 3.9 and newer, and links the system's libibverbs and librdmacm (not
//! a manylinux wheel: it is for machines with rdma-core installed, as the package is).
//! `pip install ./python` (maturin, from PyPI) builds the same package.

use dmabuf_testbed::programs;
use dmabuf_testbed::sh::{self, Result};
use dmabuf_testbed::ui::Step;
use gpu_rdma_bench::workspace::{python, Paths};
use std::path::{Path, PathBuf};

/// The distribution's name on PyPI and in the wheel's file name.
const NAME: &str = "gpu_rdma";

/// Zips the staged package folder (`argv[1]`, holding `gpu_rdma/`) into a wheel in
/// `argv[2]`: name `argv[3]`, version `argv[4]`, summary `argv[5]`; prints the wheel's path.
const ZIP: &str = r#"
import base64, hashlib, os, platform, sys, zipfile
staged, out, name, version, summary = sys.argv[1:6]
tag = "cp39-abi3-linux_" + platform.machine()
info = f"{name}-{version}.dist-info"
meta = {
    f"{info}/METADATA": "Metadata-Version: 2.1\nName: gpu-rdma\nVersion: "
    + version + "\nSummary: " + summary
    + "\nRequires-Python: >=3.9\nLicense: MIT OR Apache-2.0\n",
    f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: cargo-xtask-wheel\n"
    + "Root-Is-Purelib: false\nTag: " + tag + "\n",
}
files = []
for root, _, names in os.walk(os.path.join(staged, "gpu_rdma")):
    for n in sorted(names):
        if n.endswith((".py", ".pyi", ".so")) or n == "py.typed":
            path = os.path.join(root, n)
            files.append((os.path.relpath(path, staged), open(path, "rb").read()))
files += [(k, v.encode()) for k, v in meta.items()]
def digest(data):
    h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={h},{len(data)}"
record = "".join(f"{p},{digest(d)}\n" for p, d in files) + f"{info}/RECORD,,\n"
os.makedirs(out, exist_ok=True)
wheel = os.path.join(out, f"{name}-{version}-{tag}.whl")
with zipfile.ZipFile(wheel + ".part", "w", zipfile.ZIP_DEFLATED) as z:
    for p, d in files:
        z.writestr(zipfile.ZipInfo(p, (2020, 1, 1, 0, 0, 0)), d,
                   compress_type=zipfile.ZIP_DEFLATED)
    z.writestr(zipfile.ZipInfo(f"{info}/RECORD", (2020, 1, 1, 0, 0, 0)), record,
               compress_type=zipfile.ZIP_DEFLATED)
os.replace(wheel + ".part", wheel)
print(wheel)
"#;

/// The `version` and `description` of python/Cargo.toml's `[package]`.
fn manifest(root: &Path) -> Result<(String, String)> {
    let file = root.join("python/Cargo.toml");
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    let field = |key: &str| {
        text.lines()
            .find_map(|l| {
                let (k, v) = l.split_once('=')?;
                (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
            })
            .ok_or_else(|| format!("{}: no {key}", file.display()))
    };
    Ok((field("version")?, field("description")?))
}

/// Builds the module (release unless `debug`), stages the package and zips it into
/// `target/<profile>/wheels/`; returns the wheel's path.
pub fn build(paths: &Paths, debug: bool) -> Result<PathBuf> {
    let staged = if debug {
        python::stage(paths)?
    } else {
        python::stage_release(paths)?
    };
    let (version, summary) = manifest(&paths.root)?;
    let out = staged.with_file_name("wheels");
    let step = Step::start("zipping the wheel");
    let mut c = programs::cmd("/usr/bin/python3");
    c.arg("-c")
        .arg(ZIP)
        .arg(&staged)
        .arg(&out)
        .args([NAME, &version, &summary]);
    let printed = sh::output(&mut c)?;
    step.done();
    Ok(PathBuf::from(printed.trim()))
}

/// `cargo xtask wheel [--debug]`.
pub fn main(paths: &Paths, args: &[String]) -> Result<std::process::ExitCode> {
    let debug = match args {
        [] => false,
        [d] if d == "--debug" => true,
        _ => dmabuf_testbed::fail!("usage: cargo xtask wheel [--debug]"),
    };
    let wheel = build(paths, debug)?;
    dmabuf_testbed::ui::info(format!(
        "{}\n    install it: pip install {}",
        wheel.display(),
        wheel.display()
    ));
    Ok(std::process::ExitCode::SUCCESS)
}

/// Python run in the venv: the installed package imports from the venv (not from python/),
/// its module is the wheel's, and its stubs came along.
const IMPORTED: &str = r#"
import os, sys, gpu_rdma
from gpu_rdma import _native
here = os.path.dirname(gpu_rdma.__file__)
assert here.startswith(sys.prefix), (here, sys.prefix)
assert os.path.exists(os.path.join(here, "_native.pyi")), "no stubs"
assert os.path.exists(os.path.join(here, "py.typed")), "no py.typed"
b = gpu_rdma.Batch().write("s", 0, "p", "d", 0, 4096)
assert len(b) == 1 and issubclass(gpu_rdma.Timeout, gpu_rdma.Error)
print("RESULT imported", _native.__file__)
"#;

/// The wheel as a user installs it, counted as one test by `cargo xtask test`: the debug
/// wheel is built, installed with pip into a new venv with no index (nothing downloaded:
/// venv's own pip), and imported there. `Ok(false)` (reported) when a step fails.
pub fn check(paths: &Paths) -> Result<bool> {
    let wheel = build(paths, true)?;
    let venv = paths.target.join("wheel-venv");
    let _ = std::fs::remove_dir_all(&venv);
    let step = Step::start("the wheel installed into a new venv, offline, and imported");
    let mut make = programs::cmd("/usr/bin/python3");
    make.args(["-m", "venv"]).arg(&venv);
    let ok = sh::run(&mut make).and_then(|()| {
        let python = venv.join("bin/python");
        let mut pip = programs::built(&python);
        pip.args(["-m", "pip", "install", "--quiet", "--no-index", "--no-deps"])
            .arg(&wheel);
        sh::run(&mut pip)?;
        let mut import = programs::built(&python);
        import.arg("-c").arg(IMPORTED).current_dir(&paths.target);
        let out = sh::output(&mut import)?;
        if out.contains("RESULT imported") {
            Ok(())
        } else {
            Err(format!("the venv's import printed: {out}").into())
        }
    });
    step.done();
    match ok {
        Ok(()) => Ok(true),
        Err(e) => {
            dmabuf_testbed::ui::info(format!("wheel: {e}"));
            Ok(false)
        }
    }
}
