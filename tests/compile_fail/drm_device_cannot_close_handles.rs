// A DrmDevice counts the owners of each GEM handle; it offers no way around that count, so
// the drm crate's `close_buffer` is not callable on it.
use drm::control::Device as _;
use drm_export::{DrmDevice, GemBuffer};
fn f(dev: &DrmDevice, buf: &GemBuffer) {
    let _ = dev.close_buffer(buf.handle());
}
fn main() {}
