// One DmaBuf has at most one mapping at a time.
use drm_export::DmaBuf;
fn f(mut buf: DmaBuf) {
    let a = buf.map().unwrap();
    let b = buf.map().unwrap();
    drop((a, b));
}
fn main() {}
