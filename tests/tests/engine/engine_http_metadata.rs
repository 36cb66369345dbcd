//! The engine's HTTP metadata backend against Mooncake's own server (the pinned wheel's
//! `mooncake.http_metadata_server`, unchanged) and against ours: records published, found,
//! replaced and withdrawn; forged and foreign values refused; on the host (made-up
//! descriptors: no RDMA needed to publish), and with real agents in the VM.

use gpu_rdma_engine::{
    AgentDescriptor, Auth, ClusterKey, DeviceRegion, Error, HttpMetadata, MetadataServer,
    MetadataService, SegmentDescriptor,
};
use integration_tests::mooncake::MooncakeServer;
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn made_up(agent: &str, segments: usize) -> AgentDescriptor {
    AgentDescriptor {
        agent: agent.into(),
        incarnation: 42,
        segments: (0..segments)
            .map(|i| SegmentDescriptor {
                name: format!("kv{i}"),
                len: 1 << 20,
                base: Some(0x7f00_0000_0000 + ((i as u64) << 20)),
                remote_read: true,
                remote_write: true,
                regions: vec![DeviceRegion {
                    device: 0,
                    device_name: "rxe0".into(),
                    gid: [3; 16],
                    addr: 0x7f00_0000_0000 + ((i as u64) << 20),
                    rkey: i as u32,
                    tier: 0,
                }],
            })
            .collect(),
    }
}

fn keyed(b: u8) -> Auth {
    Auth::ClusterKey(ClusterKey::from_bytes(&[b; 32]).unwrap())
}

/// What every server of the protocol must do for the backend.
fn the_backend_works_against(url: &str) {
    let m = HttpMetadata::new(url, &keyed(1), T).unwrap();
    let control: SocketAddr = "10.1.0.2:18700".parse().unwrap();
    // A name with the characters a Mooncake session id has, and a large descriptor.
    let d = made_up("10.1.0.2:12345", 2000);
    m.publish(&d, control).unwrap();
    let r = m.lookup("10.1.0.2:12345").unwrap();
    assert_eq!((r.descriptor, r.control), (d, control));
    let smaller = made_up("10.1.0.2:12345", 1);
    m.publish(&smaller, control).unwrap();
    assert_eq!(m.lookup("10.1.0.2:12345").unwrap().descriptor, smaller);
    // Another cluster's agent, in the same server: refused, typed.
    let other = HttpMetadata::new(url, &keyed(2), T).unwrap();
    other.publish(&made_up("intruder", 1), control).unwrap();
    assert!(matches!(
        m.lookup("intruder"),
        Err(Error::Authentication { .. })
    ));
    m.withdraw("10.1.0.2:12345").unwrap();
    m.withdraw("10.1.0.2:12345").unwrap();
    assert_eq!(
        m.lookup("10.1.0.2:12345"),
        Err(Error::UnknownAgent("10.1.0.2:12345".into()))
    );
    other.withdraw("intruder").unwrap();
}

#[test]
fn records_live_in_mooncakes_own_http_metadata_server() {
    let server = MooncakeServer::start(free_port());
    the_backend_works_against(&server.url());
}

#[test]
fn records_live_in_our_http_metadata_server() {
    let server = MetadataServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
    the_backend_works_against(&server.url());
    assert!(server.is_empty(), "every record withdrawn");
}

/// Two agents on loopback rxe find each other through Mooncake's server and move bytes
/// named by address; the record goes when an agent drops.
#[test]
#[ignore = "needs the testbed VM"]
fn agents_find_each_other_through_mooncakes_server_and_write_by_address() {
    use gpu_rdma_engine::{Agent, Batch, Memory, Settings};
    use integration_tests::testbed::Testbed;
    use rdma_dmabuf::HostBuffer;
    let tb = Testbed::get();
    let server = MooncakeServer::start(free_port());
    let agent = |name: &str| {
        let m = HttpMetadata::new(&server.url(), &Auth::FromEnvironment, T).unwrap();
        let s = Settings {
            devices: Some(vec![tb.device.clone()]),
            bind: "127.0.0.1:0".parse().unwrap(),
            ..Settings::default()
        };
        Agent::with_metadata(name, s, std::sync::Arc::new(m)).unwrap()
    };
    let (a, b) = (agent("127.0.0.1:1"), agent("127.0.0.1:2"));
    let mut h = HostBuffer::new(1 << 20).unwrap();
    for (i, x) in h.as_mut_slice().iter_mut().enumerate() {
        *x = (i * 7 + i / 4096) as u8;
    }
    let data = h.as_slice().to_vec();
    let src = a.register("src", h).unwrap();
    let mut h = HostBuffer::new(1 << 20).unwrap();
    h.as_mut_slice()[..4096].fill(0xab);
    let dst = b.register("dst", h).unwrap();
    let (s, d) = (src.base.unwrap(), dst.base.unwrap());
    let batch = Batch::new()
        .write_at(s + 4096, "127.0.0.1:2", d + 8192, 65536)
        .read_at(s + 524_288, "127.0.0.1:2", d, 4096);
    a.transfer(&batch)
        .unwrap()
        .wait(Duration::from_secs(60))
        .unwrap();
    // Past the end of b's buffer: refused before anything is posted.
    let past = Batch::new().write_at(s, "127.0.0.1:2", d + (1 << 20) - 8, 16);
    assert!(matches!(
        a.transfer(&past),
        Err(Error::NoSegmentAt { entry: 0, .. })
    ));
    let Memory::Host(back) = b.unregister("dst").unwrap() else {
        panic!("host memory back")
    };
    assert_eq!(
        &back.as_slice()[8192..8192 + 65536],
        &data[4096..4096 + 65536]
    );
    let Memory::Host(mine) = a.unregister("src").unwrap() else {
        panic!("host memory back")
    };
    assert_eq!(&mine.as_slice()[524_288..524_288 + 4096], &[0xab; 4096][..]);
    drop(b);
    let m = HttpMetadata::new(&server.url(), &Auth::FromEnvironment, T).unwrap();
    assert_eq!(
        m.lookup("127.0.0.1:2"),
        Err(Error::UnknownAgent("127.0.0.1:2".into()))
    );
}
