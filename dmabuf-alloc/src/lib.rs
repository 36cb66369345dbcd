//! `libdmabuf_alloc.so`: dma-buf file descriptors from software exporters (vgem, udmabuf, the
//! dma-heaps) for programs not written in Rust, over [`drm_export`].
//!
//! The C interface is `include/dmabuf_alloc.h`; every function there is one `extern "C"` function
//! here. Each allocator returns a new dma-buf fd that the caller owns (`close(2)`), or `-1` with
//! `errno` set and a message for [`dmabuf_alloc_error`]. The buffer's CPU side is reached with
//! [`dmabuf_alloc_write`] / [`dmabuf_alloc_read`] (a mapping bracketed by `DMA_BUF_IOCTL_SYNC`)
//! or with the caller's own `mmap` bracketed by [`dmabuf_alloc_sync`].
//!
//! A C program (`examples/fill_and_check.c`):
//!
//! ```c
#![doc = include_str!("../examples/fill_and_check.c")]
//! ```
//!
//! and a Python one, through `ctypes` (`examples/fill_and_check.py`):
//!
//! ```python
#![doc = include_str!("../examples/fill_and_check.py")]
//! ```

use drm_export::{DmaBuf, DmaHeap, DrmDevice, DumbBuffer, NodeKind, Udmabuf};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, IntoRawFd, RawFd};
use std::sync::Arc;

mod cuda;
mod sync;

pub use cuda::dmabuf_alloc_cuda_range;

/// A failure: the errno to set and the message for [`dmabuf_alloc_error`].
struct Failure {
    errno: i32,
    message: String,
}

impl From<drm_export::Error> for Failure {
    fn from(e: drm_export::Error) -> Failure {
        use drm_export::Error as E;
        let errno = e.errno().unwrap_or(match &e {
            E::Unsupported { .. } => libc::EOPNOTSUPP,
            E::AlreadyOwned { .. } => libc::EBUSY,
            E::Timeout { .. } => libc::ETIMEDOUT,
            _ => libc::EINVAL,
        });
        Failure {
            errno,
            message: e.to_string(),
        }
    }
}

fn invalid(message: impl Into<String>) -> Failure {
    Failure {
        errno: libc::EINVAL,
        message: message.into(),
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Runs `f`, turning its failure (or a panic, which must not cross into C) into `-1`, `errno`
/// and this thread's message.
fn call(f: impl FnOnce() -> Result<c_int, Failure>) -> c_int {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(Failure {
            errno: libc::EIO,
            message: format!("internal error (a bug in libdmabuf_alloc): {what}"),
        })
    });
    let (ret, message) = match outcome {
        Ok(v) => (v, String::new()),
        Err(e) => {
            nix::errno::Errno::set_raw(e.errno);
            (-1, e.message)
        }
    };
    LAST_ERROR.with(|m| {
        *m.borrow_mut() = CString::new(message.replace('\0', " ")).unwrap_or_default();
    });
    ret
}

/// `size` rounded up to the page size; 0 and overflows refused.
fn rounded(size: u64) -> Result<u64, Failure> {
    let page = drm_export::page_size();
    if size == 0 {
        return Err(invalid("size 0: a dma-buf has at least one page"));
    }
    size.checked_next_multiple_of(page)
        .ok_or_else(|| invalid(format!("size {size} overflows when rounded to a page")))
}

/// Hands `buf`'s fd to the caller, storing its size in `out_size` if not null.
///
/// # Safety
/// `out_size` is null or valid for a write of a `u64`.
unsafe fn hand_out(buf: DmaBuf, out_size: *mut u64) -> c_int {
    if !out_size.is_null() {
        // SAFETY: the caller's contract: non-null means valid for a write.
        unsafe { out_size.write(buf.size()) };
    }
    buf.into_fd().into_raw_fd()
}

fn vgem(size: u64) -> Result<DmaBuf, Failure> {
    let size = rounded(size)?;
    let device = Arc::new(DrmDevice::open_driver("vgem", NodeKind::Card)?);
    let dumb = DumbBuffer::new(&device, size)?;
    // The dma-buf holds its own reference to the GEM object: the handle (closed when `dumb`
    // drops) and the device file are not needed after the export.
    Ok(dumb.export()?)
}

fn udmabuf(size: u64) -> Result<DmaBuf, Failure> {
    let (_memfd, buf) = Udmabuf::new(rounded(size)?)?.into_parts();
    // udmabuf holds the memfd's pages; the memfd itself may close.
    Ok(buf)
}

fn heap(name: &str, size: u64) -> Result<DmaBuf, Failure> {
    Ok(DmaHeap::open(name)?.allocate(rounded(size)?)?)
}

/// A C string argument, or `default` for null.
///
/// # Safety
/// `s` is null or a valid NUL-terminated string.
unsafe fn text<'a>(s: *const c_char, default: &'a str, what: &str) -> Result<&'a str, Failure> {
    if s.is_null() {
        return Ok(default);
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| invalid(format!("{what} is not UTF-8")))
}

/// A vgem dumb buffer of at least `size` bytes, exported as a dma-buf.
///
/// # Safety
/// `out_size` is null or valid for a write of a `u64`.
#[no_mangle]
pub unsafe extern "C" fn dmabuf_alloc_vgem(size: u64, out_size: *mut u64) -> c_int {
    // SAFETY: `out_size` as the caller guarantees.
    call(|| Ok(unsafe { hand_out(vgem(size)?, out_size) }))
}

/// A udmabuf over a sealed memfd of at least `size` bytes.
///
/// # Safety
/// `out_size` is null or valid for a write of a `u64`.
#[no_mangle]
pub unsafe extern "C" fn dmabuf_alloc_udmabuf(size: u64, out_size: *mut u64) -> c_int {
    // SAFETY: `out_size` as the caller guarantees.
    call(|| Ok(unsafe { hand_out(udmabuf(size)?, out_size) }))
}

/// A buffer of at least `size` bytes from the dma-heap `heap` (null: `system`).
///
/// # Safety
/// `heap_name` is null or a valid C string; `out_size` is null or valid for a write of a `u64`.
#[no_mangle]
pub unsafe extern "C" fn dmabuf_alloc_heap(
    heap_name: *const c_char,
    size: u64,
    out_size: *mut u64,
) -> c_int {
    call(|| {
        // SAFETY: `heap_name` as the caller guarantees.
        let name = unsafe { text(heap_name, "system", "the heap name") }?;
        let buf = heap(name, size)?;
        // SAFETY: `out_size` as the caller guarantees.
        Ok(unsafe { hand_out(buf, out_size) })
    })
}

/// One of the allocators by name: `vgem`, `udmabuf`, `system` or `heap:<name>`.
///
/// # Safety
/// `source` is a valid C string; `out_size` is null or valid for a write of a `u64`.
#[no_mangle]
pub unsafe extern "C" fn dmabuf_alloc_from(
    source: *const c_char,
    size: u64,
    out_size: *mut u64,
) -> c_int {
    call(|| {
        if source.is_null() {
            return Err(invalid("source is NULL"));
        }
        // SAFETY: non-null, and valid as the caller guarantees.
        let name = unsafe { text(source, "", "the source") }?;
        let buf = match name {
            "vgem" => vgem(size)?,
            "udmabuf" => udmabuf(size)?,
            "system" => heap("system", size)?,
            other => match other.strip_prefix("heap:") {
                Some(h) => heap(h, size)?,
                None => {
                    return Err(invalid(format!(
                        "unknown source {other:?} (vgem, udmabuf, system, heap:<name>)"
                    )))
                }
            },
        };
        // SAFETY: `out_size` as the caller guarantees.
        Ok(unsafe { hand_out(buf, out_size) })
    })
}

/// The caller's fd `fd` as a [`DmaBuf`] of its own (a duplicate, closed on drop), checked to
/// be a dma-buf.
fn borrowed(fd: RawFd) -> Result<DmaBuf, Failure> {
    if fd < 0 {
        return Err(Failure {
            errno: libc::EBADF,
            message: format!("fd {fd} is not a file descriptor"),
        });
    }
    // SAFETY: the fd is only duplicated here (F_DUPFD_CLOEXEC); if it is not open the kernel
    // says EBADF, and the duplicate is owned by the `OwnedFd`.
    let dup = unsafe { BorrowedFd::borrow_raw(fd) }
        .try_clone_to_owned()
        .map_err(|e| Failure {
            errno: e.raw_os_error().unwrap_or(libc::EBADF),
            message: format!("fd {fd}: {e}"),
        })?;
    Ok(DmaBuf::try_from(dup)?)
}

/// Checks that `[offset, offset + len)` lies in a buffer of `size` bytes; the offset as usize.
fn range(offset: u64, len: usize, size: u64) -> Result<usize, Failure> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(offset as usize),
        _ => Err(invalid(format!(
            "range [{offset}, +{len}) reaches past the dma-buf's {size} bytes"
        ))),
    }
}

/// The size of the dma-buf `fd`.
///
/// # Safety
/// `out_size` is null or valid for a write of a `u64`.
#[no_mangle]
pub unsafe extern "C" fn dmabuf_alloc_size(fd: c_int, out_size: *mut u64) -> c_int {
    call(|| {
        let size = borrowed(fd)?.size();
        if !out_size.is_null() {
            // SAFETY: the caller's contract.
            unsafe { out_size.write(size) };
        }
        Ok(0)
    })
}

/// What the two copies share: checks `fd`, the range and (for a non-empty copy) that the
/// caller's pointer, named `what`, is not null, then runs `copy` with the dma-buf and the
/// offset.
fn copy_with(
    fd: c_int,
    offset: u64,
    len: usize,
    null: bool,
    what: &str,
    copy: impl FnOnce(&mut DmaBuf, usize) -> Result<(), Failure>,
) -> c_int {
    call(|| {
        let mut buf = borrowed(fd)?;
        let at = range(offset, len, buf.size())?;
        if len == 0 {
            return Ok(0);
        }
        if null {
            return Err(invalid(format!("{what} is NULL")));
        }
        copy(&mut buf, at)?;
        Ok(0)
    })
}

/// Copies `len` bytes from `src` to `offset` of the dma-buf `fd`, in a synced CPU access.
///
/// # Safety
/// `src` is valid for reads of `len` bytes (any pointer when `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn dmabuf_alloc_write(
    fd: c_int,
    offset: u64,
    src: *const c_void,
    len: usize,
) -> c_int {
    copy_with(fd, offset, len, src.is_null(), "src", |buf, at| {
        // SAFETY: the caller's contract (non-null, checked); the caller's memory is not the
        // dma-buf's mapping, which is made below.
        let src = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), len) };
        Ok(buf.map()?.write()?.write_at(at, src)?)
    })
}

/// Copies `len` bytes at `offset` of the dma-buf `fd` into `dst`, in a synced CPU access.
///
/// # Safety
/// `dst` is valid for writes of `len` bytes (any pointer when `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn dmabuf_alloc_read(
    fd: c_int,
    offset: u64,
    dst: *mut c_void,
    len: usize,
) -> c_int {
    copy_with(fd, offset, len, dst.is_null(), "dst", |buf, at| {
        // SAFETY: the caller's contract (non-null, checked).
        let dst = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), len) };
        Ok(buf.map()?.read()?.read_at(at, dst)?)
    })
}

/// `DMA_BUF_IOCTL_SYNC` with `flags` on the dma-buf `fd`, for callers that map it themselves.
#[no_mangle]
pub extern "C" fn dmabuf_alloc_sync(fd: c_int, flags: u64) -> c_int {
    call(|| {
        let buf = borrowed(fd)?;
        sync::sync(buf.as_fd(), flags)?;
        Ok(0)
    })
}

/// The CPU page size.
#[no_mangle]
pub extern "C" fn dmabuf_alloc_page_size() -> u64 {
    drm_export::page_size()
}

/// This thread's last failure message (`""` if the last call succeeded).
#[no_mangle]
pub extern "C" fn dmabuf_alloc_error() -> *const c_char {
    LAST_ERROR.with(|m| m.borrow().as_ptr())
}
