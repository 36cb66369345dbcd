//! Dma-bufs that another process or API exported, wrapped with `DmaBuf::try_from`: a udmabuf
//! passed from one process to another over a unix socket (SCM_RIGHTS), checked (a dma-buf,
//! its size, exporter and identity read back from the kernel), held to the one-owner rule,
//! registered on the receiving side and moved over rxe, with the sender checking the bytes
//! through its own mapping. Runs in the testbed VM.

use drm_export::{DmaBuf, Error};
use integration_tests::exporters::Exporter;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{host_region, loopback_pair, pattern, pd};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use rdma_dmabuf::{Access, Local, MemoryRegion};
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::process::Command;
use std::time::Duration;

const ROLE: &str = "FOREIGN_DMABUF_SENDER";
const SIZE: u64 = 64 << 10;
const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

/// The sending process: makes a udmabuf, fills it, sends its fd with its identity and whether
/// its pages are small, then checks through its own mapping what the receiver wrote.
fn sender(name: &str) {
    let addr = SocketAddr::from_abstract_name(name).unwrap();
    let mut sock = UnixStream::connect_addr(&addr).expect("connect to the receiver");
    let mut buf = Exporter::Udmabuf.allocate(SIZE);
    Exporter::fill(&mut buf, 0, &pattern(SIZE as usize, 1));
    let drm_export::BufferId { dev, ino } = buf.buffer_id();
    let mut head = [0u8; 17];
    head[..8].copy_from_slice(&dev.to_ne_bytes());
    head[8..16].copy_from_slice(&ino.to_ne_bytes());
    head[16] = u8::from(buf.udmabuf_small_pages() == Some(true));
    let fds = [buf.as_fd().as_raw_fd()];
    sendmsg::<()>(
        sock.as_raw_fd(),
        &[IoSlice::new(&head)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .expect("sendmsg SCM_RIGHTS");
    let mut done = [0u8; 1];
    sock.read_exact(&mut done).expect("the receiver's word");
    let seen = Exporter::read(&mut buf);
    assert!(
        seen == pattern(SIZE as usize, 2),
        "the receiver's RDMA write, seen by the sender"
    );
}

/// Receives one fd and the 17 bytes sent with it.
fn receive(sock: &UnixStream) -> (OwnedFd, [u8; 17]) {
    let mut head = [0u8; 17];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(&mut head)];
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .expect("recvmsg");
    assert_eq!(msg.bytes, 17);
    let mut fd = None;
    for c in msg.cmsgs().expect("control messages") {
        if let ControlMessageOwned::ScmRights(fds) = c {
            // SAFETY: SCM_RIGHTS installed these fds in this process just now; each is
            // owned here, once.
            fd = fds.first().map(|&f| unsafe { OwnedFd::from_raw_fd(f) });
        }
    }
    (fd.expect("an fd came with the message"), head)
}

#[test]
#[ignore = "needs the testbed VM"]
fn dmabuf_fd_passed_between_processes_is_registered_on_the_receiving_side() {
    if let Ok(name) = std::env::var(ROLE) {
        return sender(&name);
    }
    let tb = Testbed::get();
    let name = format!("dmabuf-foreign-{}", std::process::id());
    let listener =
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
    // This test binary (built by this workspace) again, as the sending process.
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args(["--exact", "--ignored", "--nocapture"])
        .arg(integration_tests::process::test_name(
            module_path!(),
            "dmabuf_fd_passed_between_processes_is_registered_on_the_receiving_side",
        ))
        .env(ROLE, &name);
    let child = integration_tests::process::spawn(&mut child);
    let (mut sock, _) = listener.accept().expect("the sender connects");
    let (fd, head) = receive(&sock);

    // What the kernel says of it: a dma-buf, its size, exporter and identity.
    let dup = fd.try_clone().unwrap();
    let mut buf = DmaBuf::try_from(fd).expect("a dma-buf");
    assert_eq!(buf.size(), SIZE);
    assert_eq!(buf.exporter(), "udmabuf");
    let id = drm_export::BufferId {
        dev: u64::from_ne_bytes(head[..8].try_into().unwrap()),
        ino: u64::from_ne_bytes(head[8..16].try_into().unwrap()),
    };
    assert_eq!(buf.buffer_id(), id, "the sender's buffer");
    // One owner per buffer in this process: a second fd of it is refused while the first
    // DmaBuf lives (the sender's own DmaBuf is in another process, outside the rule).
    match DmaBuf::try_from(dup) {
        Err(Error::AlreadyOwned { inode, .. }) => assert_eq!(inode, id.ino),
        other => panic!("a second owner: {other:?}"),
    }
    // Not a dma-buf at all: refused.
    let (a, _b) = UnixStream::pair().unwrap();
    assert!(matches!(
        DmaBuf::try_from(OwnedFd::from(a)),
        Err(Error::NotDmaBuf { .. })
    ));
    assert_eq!(buf.udmabuf_small_pages(), None, "unknown here");
    assert_eq!(head[16], 1, "the sender saw small pages");
    // SAFETY: the sender made the udmabuf with drm_export's Udmabuf, which read its page
    // frames after pinning them and found small pages only (head[16], checked above).
    unsafe { buf.assume_udmabuf_small_pages() };

    // Registered here, read and written by a second queue pair of this process.
    let pd = pd(&tb);
    let (peer, _owner) = loopback_pair(&pd);
    let region = MemoryRegion::register_dmabuf(&pd, buf, 0, SIZE, Some(0x5000_0000), RW)
        .expect("register the received dma-buf");
    let remote = region.remote().unwrap();
    let n = SIZE as usize;
    let back = peer
        .post_read(
            Local::new(host_region(&pd, &[], n, Access::LOCAL_WRITE), 0..SIZE),
            remote,
        )
        .unwrap()
        .spin()
        .unwrap();
    assert!(
        back.region.bytes().unwrap()[..n] == pattern(n, 1),
        "the sender's bytes"
    );
    peer.post_write(
        Local::new(
            host_region(&pd, &pattern(n, 2), n, Access::empty()),
            0..SIZE,
        ),
        remote,
        None,
    )
    .unwrap()
    .spin()
    .unwrap();
    drop(region);
    sock.write_all(&[1]).unwrap();
    let out = integration_tests::process::wait(child, Duration::from_secs(60), "sender");
    assert!(
        out.status.success(),
        "the sender: {}",
        integration_tests::process::text(&out)
    );
}
