// There is no second mappable handle to a DmaBuf.
use drm_export::DmaBuf;
fn f(buf: &DmaBuf) {
    let _alias = buf.try_clone();
}
fn main() {}
