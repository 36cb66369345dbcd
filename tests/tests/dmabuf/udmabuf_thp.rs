//! udmabufs whose pages are large because shmem transparent huge pages backed them: on
//! kernels whose udmabuf vmap misplaces large pages (6.10 to 6.16), a device that moves data
//! with the CPU (rxe) would move the wrong bytes and reach pages outside the region (with
//! `shmem_enabled` `always` or `within_size`: 4,177,920 of 4,194,304 bytes wrong, and writes landing in another udmabuf of the same memfd; also with
//! a memfd filled while the setting was on and exported after it was turned off, and with
//! `personality(UNAME26)` hiding the kernel's release). Registration looks at the udmabuf's
//! own page frames, pinned since its creation, never at the settings, and at the kernel's
//! release as `/proc` tells it. Its own test process: it changes machine-wide settings, which
//! the tests of other files (the VM runs each file's tests in a process of their own, one
//! after another) never see. Runs in the testbed VM.

use drm_export::{running_kernel_misplaces_huge_pages, sealed_memfd, MemfdPages};
use drm_export::{DmaBuf, Udmabuf};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{host_region, loopback_pair, pattern, pd};
use rdma_dmabuf::{Access, Local, MemoryRegion, ProtectionDomain, QueuePair};
use std::sync::Arc;
use std::time::Duration;

const THP: &str = "/sys/kernel/mm/transparent_hugepage";
const SIZE: u64 = 4 << 20;
const T: Duration = Duration::from_secs(60);

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

/// Fills `buf` with `seed`'s pattern through its mapping, registers it and reads it back over
/// the wire with an RDMA READ: the bytes the NIC moved, or the registration's error.
fn read_over_the_wire(
    pd: &Arc<ProtectionDomain>,
    qp: &QueuePair,
    mut buf: DmaBuf,
    seed: u8,
) -> rdma_dmabuf::Result<()> {
    let len = buf.size() as usize;
    let data = pattern(len, seed);
    buf.map()
        .unwrap()
        .write()
        .unwrap()
        .write_at(0, &data)
        .unwrap();
    let access = Access::LOCAL_WRITE | Access::REMOTE_READ;
    let region = MemoryRegion::register_dmabuf(pd, buf, 0, len as u64, None, access)?;
    let into = host_region(pd, &[], len, Access::LOCAL_WRITE);
    let p = qp.post_read(Local::new(into, 0..len as u64), region.remote().unwrap());
    let done = p
        .unwrap()
        .spin_timeout(T)
        .expect("bounded")
        .expect("the read");
    let back = &done.region.bytes().unwrap()[..len];
    let wrong = back.iter().zip(&data).filter(|(a, b)| a != b).count();
    assert_eq!(
        wrong, 0,
        "{wrong} of {len} bytes wrong after a successful RDMA READ"
    );
    Ok(())
}

fn refused(r: rdma_dmabuf::Result<()>, what: &str) {
    let err = r.expect_err(what);
    assert!(err.is_unsupported(), "{what}: {err}");
    assert!(err.to_string().contains("large pages"), "{what}: {err}");
}

#[test]
#[ignore = "needs the testbed VM"]
fn udmabufs_with_large_pages_are_refused_where_the_kernel_misplaces_them() {
    let tb = Testbed::get();
    assert!(
        running_kernel_misplaces_huge_pages(),
        "the testbed's kernel is one of those the test is for"
    );
    let pd = pd(&tb);
    let (qp, _owner) = loopback_pair(&pd);
    let global = format!("{THP}/shmem_enabled");

    // Small pages: registered, and the bytes are right.
    let (_m, buf) = Udmabuf::new(SIZE).unwrap().into_parts();
    assert_eq!(buf.udmabuf_small_pages(), Some(true));
    read_over_the_wire(&pd, &qp, buf, 1).expect("small pages register");

    // Large pages, whichever setting made them.
    for value in ["always", "within_size"] {
        let what = format!("shmem_enabled = {value}");
        let _set = Setting::set(&global, value);
        let (_m, buf) = Udmabuf::new(SIZE).unwrap().into_parts();
        assert_eq!(buf.udmabuf_small_pages(), Some(false), "{what}");
        refused(read_over_the_wire(&pd, &qp, buf, 2), &what);
    }
    // A per-size setting: whatever pages it gives (6.12 gives memfds without a mapping no
    // 64 KiB folios), the pages decide: refused, or registered with the right bytes.
    {
        let _set = Setting::set(&format!("{THP}/hugepages-64kB/shmem_enabled"), "always");
        let (_m, buf) = Udmabuf::new(SIZE).unwrap().into_parts();
        match buf.udmabuf_small_pages() {
            Some(true) => read_over_the_wire(&pd, &qp, buf, 5).expect("small pages register"),
            _ => refused(read_over_the_wire(&pd, &qp, buf, 5), "64 KiB folios"),
        }
    }

    // A memfd filled while huge pages were on, exported after they were turned off: its
    // pages are what decides, not the setting at export.
    let memfd = {
        let _set = Setting::set(&global, "always");
        let m = sealed_memfd(MemfdPages::Shmem, SIZE).unwrap();
        nix::sys::uio::pwrite(&m, &pattern(SIZE as usize, 3), 0).unwrap();
        m
    };
    let buf = Udmabuf::export(&memfd, 0, SIZE).unwrap();
    refused(
        read_over_the_wire(&pd, &qp, buf, 3),
        "filled under always, exported under never",
    );
    // The same, taken from a bare fd.
    let foreign = DmaBuf::try_from(Udmabuf::export(&memfd, 0, SIZE).unwrap().into_fd()).unwrap();
    refused(read_over_the_wire(&pd, &qp, foreign, 3), "from a bare fd");

    // Made with small pages, registered while huge pages are on: the pages are pinned small.
    let (_m, buf) = Udmabuf::new(SIZE).unwrap().into_parts();
    {
        let _set = Setting::set(&global, "always");
        read_over_the_wire(&pd, &qp, buf, 4).expect("pinned small pages register");
    }

    // `personality(UNAME26)` makes uname say 2.6.x; /proc still tells the release.
    let before = nix::sys::personality::get().unwrap();
    nix::sys::personality::set(before | nix::sys::personality::Persona::UNAME26).unwrap();
    let still = running_kernel_misplaces_huge_pages();
    nix::sys::personality::set(before).unwrap();
    assert!(
        still,
        "a uname that lies does not hide the kernel's release"
    );
}
