//! udmabufs over shmem that transparent huge pages may back: on kernels whose udmabuf vmap
//! misplaces large pages (6.10 to 6.16), a device that moves data with the CPU (rxe) would
//! move the wrong bytes, and reach pages outside the region (found by the independent
//! review with `shmem_enabled` set to `always` or `within_size`: 4,177,920 of 4,194,304 bytes
//! wrong, and writes landing in another udmabuf of the same memfd). Registration is refused
//! there while shmem may get large pages, and works again when it cannot. Its own test
//! binary: it changes a machine-wide setting, which the tests of other binaries (run one
//! binary at a time) never see. Runs in the testbed VM.

use drm_export::udmabuf::{running_kernel_misplaces_huge_pages, shmem_may_use_large_folios};
use drm_export::Udmabuf;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::pd;
use rdma_dmabuf::{Access, MemoryRegion};

const THP: &str = "/sys/kernel/mm/transparent_hugepage";
const SIZE: u64 = 4 << 20;

/// Sets a sysfs choice for the test and puts the old one back when dropped.
struct Setting {
    path: String,
    old: String,
}

impl Setting {
    fn set(path: &str, value: &str) -> Setting {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let start = text.find('[').expect("a bracketed choice") + 1;
        let old = text[start..start + text[start..].find(']').unwrap()].to_string();
        std::fs::write(path, value).unwrap_or_else(|e| panic!("{path} <- {value}: {e}"));
        Setting {
            path: path.to_string(),
            old,
        }
    }
}

impl Drop for Setting {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.path, &self.old);
    }
}

fn register(
    pd: &std::sync::Arc<rdma_dmabuf::ProtectionDomain>,
    u: Udmabuf,
) -> rdma_dmabuf::Result<()> {
    let (_memfd, buf) = u.into_parts();
    let access = Access::LOCAL_WRITE | Access::REMOTE_READ;
    MemoryRegion::register_dmabuf(pd, buf, 0, SIZE, None, access).map(drop)
}

#[test]
#[ignore = "needs the testbed VM"]
fn udmabufs_over_shmem_huge_pages_are_refused_where_the_kernel_misplaces_them() {
    let tb = Testbed::get();
    assert!(
        running_kernel_misplaces_huge_pages(),
        "the testbed's kernel is one of those the test is for"
    );
    let pd = pd(&tb);
    assert!(
        !shmem_may_use_large_folios(),
        "the testbed starts with shmem huge pages off"
    );
    let before = Udmabuf::new(SIZE).unwrap();
    assert_eq!(before.dmabuf().udmabuf_over_huge_pages(), Some(false));
    register(&pd, Udmabuf::new(SIZE).unwrap()).expect("shmem without huge pages registers");

    for (path, value) in [
        (format!("{THP}/shmem_enabled"), "always"),
        (format!("{THP}/shmem_enabled"), "within_size"),
        (format!("{THP}/hugepages-64kB/shmem_enabled"), "always"),
    ] {
        let what = format!("{path} = {value}");
        let _set = Setting::set(&path, value);
        assert!(shmem_may_use_large_folios(), "{what}");
        let u = Udmabuf::new(SIZE).unwrap();
        assert_eq!(u.dmabuf().udmabuf_over_huge_pages(), Some(true), "{what}");
        let err = register(&pd, u).unwrap_err();
        assert!(err.is_unsupported(), "{what}: {err}");
        assert!(err.to_string().contains("shmem_enabled"), "{what}: {err}");
    }
    // Made while huge pages were off, registered while they may be on: refused too (the
    // memfd's pages may be newer than the udmabuf's check).
    {
        let _set = Setting::set(&format!("{THP}/shmem_enabled"), "always");
        let err = register(&pd, before).unwrap_err();
        assert!(err.is_unsupported(), "{err}");
    }
    assert!(!shmem_may_use_large_folios(), "the settings are back");
    register(&pd, Udmabuf::new(SIZE).unwrap()).expect("registers again");
}
