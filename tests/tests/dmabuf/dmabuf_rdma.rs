//! The whole path with the patched stack: GPU-style buffers from each exporter (vgem, udmabuf,
//! the system heap) registered as dma-buf memory regions on rxe, moved with RDMA WRITE, READ and
//! SEND, and checked byte for byte through the exporter's CPU mapping; udmabufs over hugetlb
//! pages at offsets inside a huge page, checked through the memfd as well. Runs in the testbed VM
//! (patched mode, the default).

use drm_export::MemfdPages;
use drm_export::Udmabuf;
use integration_tests::exporters::{Exporter, ALL};
use integration_tests::oob;
use integration_tests::roundtrip::{dmabuf_round_trip, IOVA, PAGE};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{host_region, loopback_pair, pattern, pd};
use rdma_dmabuf::{
    supports_dmabuf, Access, Endpoint, Local, MemoryRegion, QueuePairBuilder, RemoteRegion,
};
use std::os::fd::OwnedFd;
use std::time::Duration;

const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

#[test]
#[ignore = "needs the testbed VM"]
fn patched_rxe_supports_dmabuf_regions() {
    let tb = Testbed::get();
    assert_eq!(std::env::var("TESTBED_MODE").as_deref(), Ok("patched"));
    assert!(
        supports_dmabuf(&pd(&tb)).unwrap(),
        "the probe answers EBADF on the patched stack"
    );
}

#[test]
#[ignore = "needs the testbed VM"]
fn dmabuf_regions_write_read_send_and_receive_for_every_exporter() {
    let tb = Testbed::get();
    for (i, exporter) in ALL.into_iter().enumerate() {
        for (j, size) in [PAGE, 1 << 20, 16 << 20].into_iter().enumerate() {
            let buf = exporter.allocate(size + 2 * PAGE);
            let what = format!("{exporter:?} {size} bytes");
            dmabuf_round_trip(&tb, buf, size, (i * 3 + j) as u8, &what);
        }
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn dmabuf_registration_refuses_bad_input_with_typed_errors() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let make = || Exporter::Udmabuf.allocate(4 * PAGE);
    let invalid = |r: rdma_dmabuf::Result<MemoryRegion<rdma_dmabuf::DmaBuf>>, needle: &str| match r
    {
        Err(e @ rdma_dmabuf::Error::InvalidArgument { .. }) => {
            assert!(e.to_string().contains(needle), "{e}")
        }
        other => panic!("expected an invalid argument ({needle}), got {other:?}"),
    };
    invalid(
        MemoryRegion::register_dmabuf(&pd, make(), PAGE, PAGE, Some(IOVA + 8), RW),
        "offset within a page",
    );
    invalid(
        MemoryRegion::register_dmabuf(&pd, make(), PAGE, 4 * PAGE, None, RW),
        "exceeds",
    );
    invalid(
        MemoryRegion::register_dmabuf(&pd, make(), 0, 0, None, RW),
        "length 0",
    );
    invalid(
        MemoryRegion::register_dmabuf(&pd, make(), 0, PAGE, None, Access::REMOTE_WRITE),
        "LOCAL_WRITE",
    );
    // The kernel's own answers, reached without the crate's checks.
    raw::check_kernel_refusals(&tb);
}

/// udmabufs over 2 MiB hugetlb pages, starting inside a huge page: one that stays within the
/// first huge page, and one that starts three pages before its end and spans four.
///
/// rxe moves data through the exporter's kernel mapping (`dma_buf_vmap`), and udmabuf's vmap
/// on 6.10 to 6.16 shows the first 4 KiB page of each huge page for every page of it
/// (upstream "udmabuf: fix vmap missed offset page"; 6.12.y has only the revert that precedes
/// it). Measured here before the refusal: the written bytes landed in the first page of each
/// huge page while the transfer reported success. So on such a kernel registration is refused
/// with a typed error that names the bug, and a udmabuf over an ordinary memfd of the same
/// shape still registers. On a kernel with the fix, each is registered at a sub-page offset
/// and written with RDMA WRITE; the memfd is then read with `pread` (not through the
/// dma-buf) to see where the bytes went, which must be where the udmabuf's offset puts them,
/// and RDMA READ brings them back; a fresh buffer of the same shape then goes through the
/// common round trip (WRITE, READ, SEND in and out). The huge pages come from the testbed's
/// boot-time reservation (`hugepages=` on the guest's command line); without enough free ones
/// the test fails.
#[test]
#[ignore = "needs the testbed VM"]
fn hugetlb_udmabufs_at_offsets_land_at_their_offsets_or_are_refused() {
    let tb = Testbed::get();
    let huge = MemfdPages::Hugetlb2M.page_size();
    // (memfd size, the udmabuf's offset in it, bytes registered one page into the udmabuf)
    let cases = [
        (2 * huge, 5 * PAGE, 64 << 10),
        (4 * huge, huge - 3 * PAGE, 2 * huge + 4 * PAGE),
    ];
    let most = cases.iter().map(|c| c.0 / huge).max().unwrap();
    let free = free_huge_pages_2m();
    assert!(
        free >= most,
        "{free} free 2 MiB huge pages, {most} needed: the testbed reserves them with \
         hugepages= on the kernel command line"
    );
    let pd = pd(&tb);
    if drm_export::running_kernel_misplaces_huge_pages() {
        for (memfd_size, offset, len) in cases {
            let what = format!("hugetlb udmabuf at {offset:#x} of {memfd_size:#x}");
            let size = len + 2 * PAGE;
            let (_memfd, buf) =
                Udmabuf::with_pages(MemfdPages::Hugetlb2M, memfd_size, offset, size)
                    .unwrap_or_else(|e| panic!("{what}: {e}"))
                    .into_parts();
            assert_eq!(buf.udmabuf_small_pages(), Some(false), "{what}");
            let err = MemoryRegion::register_dmabuf(&pd, buf, PAGE, len, None, RW).unwrap_err();
            assert!(err.is_unsupported(), "{what}: {err}");
            let msg = err.to_string();
            assert!(msg.contains("fix vmap missed offset page"), "{what}: {msg}");
            assert!(msg.contains("MemfdPages::Shmem"), "{what}: {msg}");
            // The same shape over an ordinary memfd is fine.
            let (_memfd, buf) = Udmabuf::with_pages(MemfdPages::Shmem, memfd_size, offset, size)
                .unwrap_or_else(|e| panic!("{what}, shmem: {e}"))
                .into_parts();
            assert_eq!(buf.udmabuf_small_pages(), Some(true), "{what}, shmem");
            let region = MemoryRegion::register_dmabuf(&pd, buf, PAGE, len, None, RW);
            region.unwrap_or_else(|e| panic!("{what}, shmem: {e}"));
            // A udmabuf taken from a bare fd is judged by its pages too.
            let (_memfd, buf) =
                Udmabuf::with_pages(MemfdPages::Hugetlb2M, memfd_size, offset, size)
                    .unwrap_or_else(|e| panic!("{what}: {e}"))
                    .into_parts();
            let foreign = drm_export::DmaBuf::try_from(buf.into_fd()).unwrap();
            let err = MemoryRegion::register_dmabuf(&pd, foreign, PAGE, len, None, RW).unwrap_err();
            assert!(err.is_unsupported(), "{what}, from an fd: {err}");
        }
        eprintln!(
            "hugetlb udmabufs refused on this kernel: {}",
            drm_export::HUGE_PAGE_VMAP_BUG
        );
        return;
    }
    let (peer, _owner) = loopback_pair(&pd);
    for (i, (memfd_size, offset, len)) in cases.into_iter().enumerate() {
        let what = format!("hugetlb udmabuf at {offset:#x} of {memfd_size:#x}, {len:#x} bytes");
        let size = len + 2 * PAGE;
        let u = Udmabuf::with_pages(MemfdPages::Hugetlb2M, memfd_size, offset, size)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(u.offset(), offset);
        assert_eq!(u.dmabuf().size(), size);
        let (memfd, buf) = u.into_parts();

        // Registered at a sub-page offset (the iova keeps it), written, read through the memfd.
        let skew = 300;
        let start = PAGE + skew;
        let region = MemoryRegion::register_dmabuf(&pd, buf, start, len, Some(IOVA + skew), RW)
            .unwrap_or_else(|e| panic!("{what}: register: {e}"));
        let remote = region.remote().unwrap();
        let n = len as usize;
        let p1 = pattern(n, 40 + i as u8);
        peer.post_write(
            Local::new(host_region(&pd, &p1, n, Access::empty()), 0..len),
            remote,
            None,
        )
        .unwrap()
        .spin()
        .unwrap_or_else(|e| panic!("{what}: write: {}", e.error));
        let seen = pread_all(&memfd, memfd_size);
        let back = peer
            .post_read(
                Local::new(host_region(&pd, &[], n, Access::LOCAL_WRITE), 0..len),
                remote,
            )
            .unwrap()
            .spin()
            .unwrap_or_else(|e| panic!("{what}: read: {}", e.error));
        let back = back.region.bytes().unwrap()[..n].to_vec();
        drop(region.into_inner().unwrap());
        drop(memfd);

        let right = |memfd_page: u64| memfd_page;
        let correct = Layout {
            memfd_size,
            offset,
            start,
            map: &right,
        };
        if seen == correct.after_writing(&p1) {
            assert!(back == p1, "{what}: read back");
            // The common round trip, on a fresh buffer of the same shape.
            let (_memfd, buf) =
                Udmabuf::with_pages(MemfdPages::Hugetlb2M, memfd_size, offset, size)
                    .unwrap_or_else(|e| panic!("{what}: {e}"))
                    .into_parts();
            dmabuf_round_trip(&tb, buf, len, 50 + i as u8, &what);
        } else {
            panic!(
                "{what}: the written bytes are not where the udmabuf's offset puts them \
                 ({:#x}); {}",
                offset + start,
                where_pages_landed(&seen, &p1, (offset + start) as usize)
            );
        }
    }
}

/// Where a udmabuf's bytes are in its memfd: dma-buf offset `d` is at
/// `map(offset + page of d) + d % PAGE`, where `map` takes the memfd offset of a CPU page to
/// the memfd offset of the page the exporter's kernel mapping really shows there.
struct Layout<'a> {
    memfd_size: u64,
    offset: u64,
    start: u64,
    map: &'a dyn Fn(u64) -> u64,
}

impl Layout<'_> {
    fn memfd_offset(&self, d: u64) -> usize {
        ((self.map)(self.offset + d / PAGE * PAGE) + d % PAGE) as usize
    }

    /// The memfd's bytes after `data` was written, in order, at dma-buf offset `start` of a
    /// zero-filled memfd.
    fn after_writing(&self, data: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; self.memfd_size as usize];
        for (i, &b) in data.iter().enumerate() {
            out[self.memfd_offset(self.start + i as u64)] = b;
        }
        out
    }
}

/// Where in `memfd` (its bytes, `seen`) the 4 KiB pages of `data` (meant for offset `at`)
/// landed, as a short report for a failure message.
fn where_pages_landed(seen: &[u8], data: &[u8], at: usize) -> String {
    let page = PAGE as usize;
    let mut out = Vec::new();
    for (i, chunk) in data.chunks(page).enumerate().take(4) {
        let found = seen
            .windows(chunk.len())
            .position(|w| w == chunk)
            .map_or("nowhere".to_string(), |o| format!("{o:#x}"));
        out.push(format!(
            "page {i} (meant for {:#x}) found at {found}",
            at + i * page
        ));
    }
    let nonzero: Vec<usize> = (0..seen.len()).filter(|&i| seen[i] != 0).collect();
    format!(
        "{}; {} non-zero bytes in the memfd, first at {:#x?}, last at {:#x?}",
        out.join(", "),
        nonzero.len(),
        nonzero.first(),
        nonzero.last()
    )
}

/// `HugePages_Free` of `/proc/meminfo`, checking that the default huge page size is 2 MiB.
fn free_huge_pages_2m() -> u64 {
    let info = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in /proc/meminfo: a kernel without hugetlbfs"))
            .trim()
            .to_string()
    };
    assert_eq!(field("Hugepagesize:"), "2048 kB", "default huge page size");
    field("HugePages_Free:").parse().expect("HugePages_Free")
}

/// The first `len` bytes of `fd`, with `pread` (hugetlbfs has read, not write).
fn pread_all(fd: &OwnedFd, len: u64) -> Vec<u8> {
    let mut out = vec![0u8; len as usize];
    let mut done = 0;
    while done < out.len() {
        let n = nix::sys::uio::pread(fd, &mut out[done..], done as i64).expect("pread memfd");
        assert!(n > 0, "memfd shorter than {len} bytes");
        done += n;
    }
    out
}

/// Calls `ibv_reg_dmabuf_mr` directly, to see the patched driver's errnos for values the
/// crate would refuse first.
mod raw {
    use integration_tests::exporters::Exporter;
    use integration_tests::raw_verbs::RawPd;
    use integration_tests::testbed::Testbed;
    use rdma_sys as ffi;
    use std::os::fd::AsRawFd;

    pub fn check_kernel_refusals(tb: &Testbed) {
        let raw = RawPd::open(tb);
        let errno_of = |offset, len, iova, fd, access| raw.reg_errno(offset, len, iova, fd, access);
        let buf = Exporter::Udmabuf.allocate(4 * 4096);
        let fd = std::os::fd::AsFd::as_fd(&buf).as_raw_fd();
        let rw = (ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0) as i32;
        let memfd =
            nix::sys::memfd::memfd_create(c"x", nix::sys::memfd::MFdFlags::empty()).unwrap();
        let file = std::fs::File::open("/proc/self/status").unwrap();
        let cases: [(&str, i32, i32); 8] = [
            (
                "probe: fd -1, length 0",
                errno_of(0, 0, 0, -1, 0),
                libc::EBADF,
            ),
            (
                "iova and offset differ within a page",
                errno_of(4096, 4096, 0x1008, fd, rw),
                libc::EINVAL,
            ),
            (
                "range past the end",
                errno_of(4096, 4 * 4096, 4096, fd, rw),
                libc::EINVAL,
            ),
            (
                "length 0 on a real dma-buf",
                errno_of(0, 0, 0, fd, rw),
                libc::EINVAL,
            ),
            ("a closed fd", errno_of(0, 4096, 0, 9999, rw), libc::EBADF),
            (
                "a memfd",
                errno_of(0, 4096, 0, memfd.as_raw_fd(), rw),
                libc::EINVAL,
            ),
            (
                "a regular file",
                errno_of(0, 4096, 0, file.as_raw_fd(), rw),
                libc::EINVAL,
            ),
            (
                "remote write without local write",
                errno_of(
                    0,
                    4096,
                    0,
                    fd,
                    ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0 as i32,
                ),
                libc::EINVAL,
            ),
        ];
        for (what, got, want) in cases {
            assert_eq!(got, want, "{what}: errno {got}, expected {want}");
        }
        // A valid registration works after all the refusals.
        assert_eq!(errno_of(4096, 4096, 0x1000, fd, rw), 0);
    }
}

/// Tests of the two-node testbed: `cargo xtask test` runs this module on both nodes.
mod two_node {
    use super::*;

    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_dmabuf_regions_receive_rdma_writes_across_the_wire() {
        let tb = Testbed::get();
        // 64 MiB per region, every byte checked (the testbed lifts udmabuf's 64 MiB limit so that
        // the buffer can hold a page more).
        const SIZE: u64 = 64 << 20;
        for (i, exporter) in ALL.into_iter().enumerate() {
            let port = 18700 + i as u16;
            let seed = 50 + i as u8;
            let pd = pd(&tb);
            let qp = QueuePairBuilder::new(&pd).build().unwrap();
            if tb.is_server() {
                // Node a owns the dma-buf region; node b writes into it over the wire.
                let buf = exporter.allocate(SIZE + PAGE);
                let region =
                    MemoryRegion::register_dmabuf(&pd, buf, PAGE, SIZE, Some(IOVA), RW).unwrap();
                let mine = [
                    qp.endpoint().to_bytes().as_slice(),
                    &region.remote().unwrap().to_bytes(),
                ]
                .concat();
                let theirs = oob::serve(&tb.local_addr, port, &mine);
                let qp = qp.connect(&Endpoint::from_bytes(&theirs).unwrap()).unwrap();
                let note = qp
                    .post_recv(host_region(&pd, &[], 4096, Access::LOCAL_WRITE))
                    .unwrap();
                let got = note
                    .spin_timeout(Duration::from_secs(120))
                    .expect("note arrives")
                    .expect("ok");
                assert_eq!(got.wc.imm, Some(i as u32));
                let seen = Exporter::read(&mut region.into_inner().unwrap());
                assert!(
                    seen[PAGE as usize..] == pattern(SIZE as usize, seed)[..],
                    "{exporter:?}: bytes across the wire"
                );
            } else {
                let theirs = oob::connect(&tb.peer_addr, port, &qp.endpoint().to_bytes());
                let (ep, rr) = theirs.split_at(Endpoint::WIRE_LEN);
                let qp = qp.connect(&Endpoint::from_bytes(ep).unwrap()).unwrap();
                let remote = RemoteRegion::from_bytes(rr).unwrap();
                let src = host_region(
                    &pd,
                    &pattern(SIZE as usize, seed),
                    SIZE as usize,
                    Access::empty(),
                );
                qp.post_write(Local::new(src, 0..SIZE), remote, None)
                    .unwrap()
                    .spin()
                    .expect("write across");
                let note = host_region(&pd, b"done", 4096, Access::empty());
                qp.post_send(Local::new(note, 0..4), Some(i as u32))
                    .unwrap()
                    .spin()
                    .expect("note");
            }
        }
    }
}
