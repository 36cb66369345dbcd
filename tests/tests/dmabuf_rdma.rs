//! The whole path with the patched stack: GPU-style buffers from each exporter (vgem, udmabuf,
//! the system heap) registered as dma-buf memory regions on rxe, moved with RDMA WRITE, READ and
//! SEND, and checked byte for byte through the exporter's CPU mapping. Runs in the testbed VM
//! (patched mode, the default).

use integration_tests::exporters::{Exporter, ALL};
use integration_tests::oob;
use integration_tests::roundtrip::{dmabuf_round_trip, IOVA, PAGE};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{host_region, pattern, pd};
use rdma_dmabuf::{
    supports_dmabuf, Access, Endpoint, Local, MemoryRegion, QueuePairBuilder, RemoteRegion,
};
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

/// Calls `ibv_reg_dmabuf_mr` directly, to see the patched driver's errnos for values the
/// crate would refuse first.
mod raw {
    use integration_tests::exporters::Exporter;
    use integration_tests::testbed::Testbed;
    use rdma_sys as ffi;
    use std::os::fd::AsRawFd;

    fn errno_of(
        pd: *mut ffi::ibv_pd,
        offset: u64,
        len: usize,
        iova: u64,
        fd: i32,
        access: i32,
    ) -> i32 {
        // SAFETY: a live PD; the kernel validates every other argument; an MR returned by
        // mistake is deregistered at once.
        let mr = unsafe { ffi::ibv_reg_dmabuf_mr(pd, offset, len, iova, fd, access) };
        if !mr.is_null() {
            // SAFETY: just returned, deregistered once.
            unsafe { ffi::ibv_dereg_mr(mr) };
            return 0;
        }
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    }

    pub fn check_kernel_refusals(tb: &Testbed) {
        let mut n = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed below.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        assert!(!list.is_null() && n > 0);
        // SAFETY: `n` valid entries until freed.
        let devs = unsafe { std::slice::from_raw_parts(list, n as usize) };
        let dev = devs
            .iter()
            .copied()
            .find(|&d| {
                // SAFETY: a live entry of the list.
                let name = unsafe { ffi::ibv_get_device_name(d) };
                // SAFETY: a NUL-terminated string owned by the device.
                unsafe { std::ffi::CStr::from_ptr(name) }.to_str() == Ok(&tb.device)
            })
            .expect("the testbed device");
        // SAFETY: a live entry of the list.
        let ctx = unsafe { ffi::ibv_open_device(dev) };
        // SAFETY: freed once; the context stays valid.
        unsafe { ffi::ibv_free_device_list(list) };
        assert!(!ctx.is_null());
        // SAFETY: open context.
        let pd = unsafe { ffi::ibv_alloc_pd(ctx) };
        assert!(!pd.is_null());

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
                errno_of(pd, 0, 0, 0, -1, 0),
                libc::EBADF,
            ),
            (
                "iova and offset differ within a page",
                errno_of(pd, 4096, 4096, 0x1008, fd, rw),
                libc::EINVAL,
            ),
            (
                "range past the end",
                errno_of(pd, 4096, 4 * 4096, 4096, fd, rw),
                libc::EINVAL,
            ),
            (
                "length 0 on a real dma-buf",
                errno_of(pd, 0, 0, 0, fd, rw),
                libc::EINVAL,
            ),
            (
                "a closed fd",
                errno_of(pd, 0, 4096, 0, 9999, rw),
                libc::EBADF,
            ),
            (
                "a memfd",
                errno_of(pd, 0, 4096, 0, memfd.as_raw_fd(), rw),
                libc::EINVAL,
            ),
            (
                "a regular file",
                errno_of(pd, 0, 4096, 0, file.as_raw_fd(), rw),
                libc::EINVAL,
            ),
            (
                "remote write without local write",
                errno_of(
                    pd,
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
        assert_eq!(errno_of(pd, 4096, 4096, 0x1000, fd, rw), 0);
        // SAFETY: no MR is left on the PD; each freed once.
        unsafe {
            ffi::ibv_dealloc_pd(pd);
        }
        // SAFETY: the PD was freed just above.
        unsafe {
            ffi::ibv_close_device(ctx);
        }
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn two_node_dmabuf_regions_receive_rdma_writes_across_the_wire() {
    let tb = Testbed::get();
    const SIZE: u64 = 1 << 20;
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
                .wait_timeout(Duration::from_secs(120))
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
                .wait()
                .expect("write across");
            let note = host_region(&pd, b"done", 4096, Access::empty());
            qp.post_send(Local::new(note, 0..4), Some(i as u32))
                .unwrap()
                .wait()
                .expect("note");
        }
    }
}
