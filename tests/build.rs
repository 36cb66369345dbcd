//! Builds the stand-in libcuda (`standin/libcuda_standin.c`) that the CUDA pointer tests load
//! through `DRM_EXPORT_LIBCUDA`, and tells the tests its path (`CUDA_STANDIN`).

fn main() {
    let src = "standin/libcuda_standin.c";
    println!("cargo:rerun-if-changed={src}");
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let lib = out.join("libcuda_standin.so");
    let compiler = cc::Build::new()
        .pic(true)
        .warnings(true)
        .opt_level(1)
        .get_compiler();
    let status = compiler
        .to_command()
        .args(["-shared", "-Wall", "-Wextra", "-o"])
        .arg(&lib)
        .arg(src)
        .status()
        .expect("cannot run the C compiler for the stand-in libcuda");
    assert!(status.success(), "compiling {src} failed");
    println!("cargo:rustc-env=CUDA_STANDIN={}", lib.display());
}
