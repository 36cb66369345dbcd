//! Generates the raw uapi structs from the system's kernel and libdrm headers with bindgen,
//! so that their layout is the headers' own (bindgen also emits layout tests for each).

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=src/sys/uapi.h");
    let bindings = bindgen::Builder::default()
        .header("src/sys/uapi.h")
        .clang_arg("-I/usr/include/libdrm")
        .allowlist_type("udmabuf_create(_list|_item)?")
        .allowlist_type("dma_heap_allocation_data")
        .allowlist_type("dma_buf_(sync|export_sync_file|import_sync_file)")
        .allowlist_type("drm_i915_gem_create(_ext)?")
        .allowlist_type("drm_i915_gem_create_ext_memory_regions")
        .allowlist_type("drm_i915_gem_memory_class_instance")
        .allowlist_type("i915_user_extension")
        .allowlist_type("drm_amdgpu_gem_create(_in|_out)?")
        .allowlist_var("(UDMABUF|DMA_BUF_SYNC|DMA_HEAP|I915_GEM_CREATE_EXT|AMDGPU_GEM_DOMAIN|DRM_COMMAND_BASE|DRM_I915_GEM_CREATE|DRM_AMDGPU_GEM_CREATE)_.*|DRM_COMMAND_BASE|DRM_I915_GEM_CREATE(_EXT)?|DRM_AMDGPU_GEM_CREATE")
        .allowlist_type("drm_i915_gem_memory_class")
        .derive_default(true)
        .layout_tests(true)
        .generate_comments(false)
        .wrap_unsafe_ops(true)
        .generate()
        .expect("bindgen over the kernel uapi headers (needs libclang-dev, linux-libc-dev, libdrm-dev: run `cargo xtask setup`)");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("uapi.rs");
    bindings.write_to_file(out).expect("write bindings");
}
