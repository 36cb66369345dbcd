//! `dmabuf_alloc_cuda_range`, the C (and Python) entry to `CudaDevice::export_range`, against
//! the stand-in libcuda in the testbed (it exercises this project's code, not NVIDIA's
//! driver; `dmabuf-alloc/tests/gpu/torch_tensors.py` runs it on a GPU with PyTorch): the fd,
//! the offset and the size it hands out, the bytes read back through the fd at that offset,
//! and errno and message for memory it refuses.

use dmabuf_alloc::{dmabuf_alloc_cuda_range, dmabuf_alloc_error, dmabuf_alloc_read};
use integration_tests::cuda_standin::{device, standin, Kind};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::pattern;
use std::ffi::CStr;
use std::os::fd::{FromRawFd, OwnedFd};

const PAGE: u64 = 4096;

/// The fd, offset and size, or errno and message.
fn export(dev: i32, ptr: u64, len: u64) -> Result<(OwnedFd, u64, u64), (i32, String)> {
    let (mut offset, mut size) = (u64::MAX, 0);
    // SAFETY: both out-pointers are live `u64`s.
    let fd = unsafe { dmabuf_alloc_cuda_range(dev, ptr, len, &mut offset, &mut size) };
    if fd < 0 {
        let errno = nix::errno::Errno::last_raw();
        // SAFETY: the library returns this thread's message, valid until its next call.
        let msg = unsafe { CStr::from_ptr(dmabuf_alloc_error()) };
        return Err((errno, msg.to_string_lossy().into_owned()));
    }
    // SAFETY: a new fd that the caller owns, as the header says.
    Ok((unsafe { OwnedFd::from_raw_fd(fd) }, offset, size))
}

#[test]
#[ignore = "needs the testbed VM"]
fn cuda_ranges_from_c_hand_out_the_covering_pages_and_the_offset() {
    let _tb = Testbed::get();
    let s = standin();
    let _dev = device();
    let size = 1usize << 20;
    let base = s.alloc(size, 1, Kind::Device);
    let data = pattern(size, 7);
    s.write(base, &data);
    for (at, len) in [(13u64, 5000u64), (0, PAGE), (size as u64 - 9, 9)] {
        let (fd, offset, dmabuf_size) =
            export(0, base + at, len).unwrap_or_else(|e| panic!("{at}+{len}: {e:?}"));
        let first = at - at % PAGE;
        assert_eq!(offset, at - first, "{at}+{len}: offset");
        assert_eq!(
            dmabuf_size,
            (at + len).div_ceil(PAGE) * PAGE - first,
            "{at}+{len}: size"
        );
        let mut back = vec![0u8; len as usize];
        // SAFETY: `back` is a live buffer of `len` bytes.
        let r = unsafe {
            dmabuf_alloc_read(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                offset,
                back.as_mut_ptr().cast(),
                back.len(),
            )
        };
        assert_eq!(r, 0, "{at}+{len}: read back");
        assert!(
            back[..] == data[at as usize..][..len as usize],
            "{at}+{len}: the bytes at the offset are the range's"
        );
    }

    let host = s.alloc(size, 1, Kind::Host);
    for (dev, ptr, len, why) in [
        (0, host, PAGE, "page-locked host memory"),
        (0, base, 0, "empty"),
        (
            0,
            base + size as u64 - 4,
            8,
            "past the end of its allocation",
        ),
        (0, 0x1234, 8, "no CUDA allocation"),
    ] {
        let (errno, msg) = export(dev, ptr, len).expect_err(why);
        assert_eq!(errno, libc::EINVAL, "{why}: {msg}");
        assert!(msg.contains(why), "{why}: {msg}");
    }
    let (errno, msg) = export(5, base, 8).expect_err("no such device");
    assert_ne!(errno, 0, "{msg}");
    assert!(msg.contains("cuDeviceGet(5)"), "{msg}");
    s.free(host);
    s.free(base);
}
