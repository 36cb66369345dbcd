// A mapping's read guard copies out; it never hands out a slice of shared memory.
use drm_export::DmaBuf;
fn f(mut buf: DmaBuf) {
    let map = buf.map().unwrap();
    let guard = map.read().unwrap();
    let _first: &[u8] = &guard[..];
}
fn main() {}
