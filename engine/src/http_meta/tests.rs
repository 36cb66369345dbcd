//! The HTTP backend against our server, on the host (no RDMA: made-up descriptors).

use super::*;
use crate::auth::ClusterKey;
use crate::descriptor::{DeviceRegion, SegmentDescriptor};

const T: Duration = Duration::from_secs(5);

fn made_up(agent: &str) -> AgentDescriptor {
    AgentDescriptor {
        agent: agent.into(),
        incarnation: 7,
        segments: vec![SegmentDescriptor {
            name: "kv".into(),
            len: 4096,
            base: Some(0x7000_0000),
            remote_read: true,
            remote_write: true,
            regions: vec![DeviceRegion {
                device: 0,
                device_name: "rxe0".into(),
                gid: [1; 16],
                addr: 0x7000_0000,
                rkey: 5,
                tier: 0,
            }],
        }],
    }
}

fn keyed(byte: u8) -> Auth {
    Auth::ClusterKey(ClusterKey::from_bytes(&[byte; 32]).unwrap())
}

fn local() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn raw() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(T))
        .build()
        .into()
}

#[test]
fn records_round_trip_through_our_server_and_go_with_withdraw() {
    let server = MetadataServer::start(local()).unwrap();
    let m = HttpMetadata::new(&server.url(), &keyed(1), T).unwrap();
    let control: SocketAddr = "10.0.0.2:18700".parse().unwrap();
    let d = made_up("127.0.0.1:12345");
    m.publish(&d, control).unwrap();
    assert_eq!(server.len(), 1);
    let r = m.lookup("127.0.0.1:12345").unwrap();
    assert_eq!((r.descriptor, r.control), (d.clone(), control));
    // Published again (a new segment): replaced, not added.
    m.publish(&d, control).unwrap();
    assert_eq!(server.len(), 1);
    m.withdraw("127.0.0.1:12345").unwrap();
    m.withdraw("127.0.0.1:12345").unwrap();
    assert!(server.is_empty());
    assert_eq!(
        m.lookup("127.0.0.1:12345"),
        Err(Error::UnknownAgent("127.0.0.1:12345".into()))
    );
}

#[test]
fn values_not_signed_with_the_cluster_key_are_refused() {
    let server = MetadataServer::start(local()).unwrap();
    let ours = HttpMetadata::new(&server.url(), &keyed(1), T).unwrap();
    let theirs = HttpMetadata::new(&server.url(), &keyed(2), T).unwrap();
    let control: SocketAddr = "10.0.0.3:1".parse().unwrap();
    theirs.publish(&made_up("intruder"), control).unwrap();
    assert!(matches!(
        ours.lookup("intruder"),
        Err(Error::Authentication { .. })
    ));
    // A plain value written straight to the server (anyone who reaches it can).
    let key = format!("{HTTP_PREFIX}forged");
    let put = raw()
        .put(&server.url())
        .query("key", &key)
        .send(&encode(control, &made_up("forged"))[..])
        .unwrap();
    assert_eq!(put.status().as_u16(), 200);
    assert!(matches!(
        ours.lookup("forged"),
        Err(Error::Authentication { .. })
    ));
    // Moved under another agent's key: the signature covers the key.
    let value = ours
        .signing
        .seal(
            &format!("{HTTP_PREFIX}a"),
            "a",
            encode(control, &made_up("a")),
        )
        .unwrap();
    let moved = format!("{HTTP_PREFIX}b");
    raw()
        .put(&server.url())
        .query("key", &moved)
        .send(&value[..])
        .unwrap();
    assert!(matches!(
        ours.lookup("b"),
        Err(Error::Authentication { .. })
    ));
}

#[test]
fn the_server_answers_as_mooncakes_does() {
    let server = MetadataServer::start(local()).unwrap();
    let url = server.url();
    let http = raw();
    let status = |r: std::result::Result<ureq::http::Response<ureq::Body>, ureq::Error>| {
        r.unwrap().status().as_u16()
    };
    assert_eq!(status(http.get(&url).call()), 400, "no key");
    assert_eq!(
        status(http.get(&url).query("key", " ").call()),
        400,
        "blank key"
    );
    assert_eq!(status(http.get(&url).query("key", "k").call()), 404);
    assert_eq!(status(http.delete(&url).query("key", "k").call()), 404);
    assert_eq!(
        status(http.put(&url).query("key", " k ").send(&b"v"[..])),
        200
    );
    let mut got = http.get(&url).query("key", "k").call().unwrap();
    assert_eq!(
        got.body_mut().read_to_vec().unwrap(),
        b"v",
        "the key is trimmed"
    );
    assert_eq!(
        status(http.post(&url).query("key", "k").send(&b"v"[..])),
        405
    );
    let rpc = "mooncake/rpc_meta/node";
    assert_eq!(
        status(http.put(&url).query("key", rpc).send(&b"1"[..])),
        200
    );
    assert_eq!(
        status(http.put(&url).query("key", rpc).send(&b"2"[..])),
        400
    );
    assert_eq!(status(http.delete(&url).query("key", "k").call()), 200);
    let elsewhere = format!("http://{}/other?key=k", server.addr());
    assert_eq!(status(http.get(&elsewhere).call()), 404);
    let big = vec![0u8; server::MAX_VALUE + 1];
    // Refused from its length alone: the client may see the 413 or the connection closed
    // under its upload, never a stored value.
    let r = http.put(&url).query("key", "big").send(&big[..]);
    assert!(r.map_or(true, |r| r.status().as_u16() == 413));
    assert_eq!(status(http.get(&url).query("key", "big").call()), 404);
}

#[test]
fn an_unreachable_server_fails_typed_within_the_timeout() {
    // A port nothing listens on: bound, then closed.
    let addr = std::net::TcpListener::bind(local())
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("http://{addr}/metadata");
    let m = HttpMetadata::new(&url, &keyed(1), T).unwrap();
    let start = std::time::Instant::now();
    let e = m.lookup("x").unwrap_err();
    assert!(matches!(e, Error::Metadata { .. }), "{e:?}");
    assert!(start.elapsed() < T * 2);
    let e = m
        .publish(&made_up("x"), "10.0.0.1:1".parse().unwrap())
        .unwrap_err();
    assert!(matches!(e, Error::Metadata { .. }), "{e:?}");
    assert!(
        matches!(m.lookup("x "), Err(Error::Settings(_))),
        "trimmed by servers"
    );
    assert!(matches!(
        HttpMetadata::new("https://x/metadata", &keyed(1), T),
        Err(Error::Settings(_))
    ));
    let m = HttpMetadata::new(&url, &keyed(1), T).unwrap();
    let unspecified = m.publish(&made_up("x"), "0.0.0.0:1".parse().unwrap());
    assert!(matches!(unspecified, Err(Error::Settings(_))));
}

#[test]
fn a_slow_upload_does_not_stall_the_server() {
    use std::io::Write;
    let server = MetadataServer::start(local()).unwrap();
    // A PUT that promises a megabyte and sends two bytes, then waits.
    let mut slow = std::net::TcpStream::connect(server.addr()).unwrap();
    write!(
        slow,
        "PUT /metadata?key=slow HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nab"
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let m = HttpMetadata::new(&server.url(), &keyed(1), T).unwrap();
    let start = std::time::Instant::now();
    m.publish(&made_up("fast"), "10.0.0.1:1".parse().unwrap())
        .unwrap();
    assert_eq!(m.lookup("fast").unwrap().descriptor, made_up("fast"));
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    drop(slow);
}
