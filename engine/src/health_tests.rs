use super::*;
use rdma_sys::ibv_wc_status as S;

const PROBE: Duration = Duration::from_millis(100);

fn completion(status: u32) -> rdma_dmabuf::Error {
    rdma_dmabuf::Error::Completion {
        wr_id: 0,
        kind: rdma_dmabuf::WorkKind::Write,
        qp_num: 7,
        status,
        status_text: "status".into(),
        vendor_err: 0,
    }
}

/// A lane to `b` whose rail (0, 1) failed.
fn rail_failed() -> Lane {
    let mut lane = Lane::new("b");
    lane.rail_failed(0, 1, "retry budget spent".into());
    lane
}

#[test]
fn a_refused_key_or_a_wrong_request_takes_the_peer_down_anything_else_the_rail() {
    let mut lane = Lane::new("b");
    assert!(lane
        .failed(0, 0, &completion(S::IBV_WC_RETRY_EXC_ERR))
        .is_none());
    assert!(lane
        .failed(1, 1, &completion(S::IBV_WC_WR_FLUSH_ERR))
        .is_none());
    assert_eq!(lane.rails_down, [(0, 0), (1, 1)]);
    assert!(lane.down.is_none());
    assert!(
        lane.rail_error.as_deref().unwrap().contains("status"),
        "the first rail failure is kept: {:?}",
        lane.rail_error
    );

    let mut lane = Lane::new("b");
    let e = lane.failed(0, 0, &completion(S::IBV_WC_REM_ACCESS_ERR));
    assert!(matches!(e, Some(Error::RemoteAccess { ref agent, .. }) if agent == "b"));
    assert!(lane.rails_down.is_empty(), "not the rail's fault");
    for status in [
        S::IBV_WC_LOC_LEN_ERR,
        S::IBV_WC_LOC_PROT_ERR,
        S::IBV_WC_LOC_ACCESS_ERR,
        S::IBV_WC_REM_INV_REQ_ERR,
        S::IBV_WC_REM_OP_ERR,
    ] {
        let mut lane = Lane::new("b");
        let e = lane.failed(0, 0, &completion(status));
        assert!(matches!(e, Some(Error::PeerDown { .. })), "status {status}");
        assert!(lane.rails_down.is_empty(), "status {status}");
    }
    // The first cause stays the peer's: a later refusal does not replace it.
    let mut lane = Lane::new("b");
    lane.failed(0, 0, &completion(S::IBV_WC_REM_ACCESS_ERR));
    let again = lane.failed(0, 0, &completion(S::IBV_WC_LOC_LEN_ERR));
    assert!(matches!(again, Some(Error::RemoteAccess { .. })));
}

#[test]
fn a_control_channel_that_fails_takes_the_peer_down_a_queue_pair_the_rail() {
    let mut lane = Lane::new("b");
    lane.connect_failed(0, 1, Error::Protocol("no queue pair".into()));
    assert_eq!(lane.rails_down, [(0, 1)]);
    assert!(lane.down.is_none());
    let io = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
    lane.connect_failed(1, 1, Error::io("talk to b", "10.0.0.2:7000", io));
    assert!(matches!(lane.down, Some(Error::PeerDown { .. })));
    let e = lane.every_rail_failed().to_string();
    assert!(
        e.contains("connection reset") || e.contains("talk to b"),
        "{e}"
    );
    let mut lane = rail_failed();
    let e = lane.every_rail_failed().to_string();
    assert!(
        e.contains("every rail to it failed; the first failure: retry budget spent"),
        "{e}"
    );
}

#[test]
fn a_failed_rail_is_left_out_for_the_probe_wait_then_probed() {
    let t0 = Instant::now();
    let mut h = Health::new(PROBE);
    assert!(h.lane("b", t0).rails_down.is_empty());
    let s = h.settle(&[rail_failed()], t0);
    assert_eq!(
        s,
        Settled {
            rails_marked: 1,
            rails_delta: 1,
            peers_marked: 0
        }
    );
    assert_eq!(h.wait("b", 0, 1), Some(PROBE));
    // Within the wait, a batch leaves it out; another peer's lanes are untouched.
    let lane = h.lane("b", t0 + PROBE / 2);
    assert!(lane.rail_is_down(0, 1));
    assert_eq!(
        lane.rail_error.as_deref(),
        Some("failed in an earlier batch")
    );
    assert!(h.lane("c", t0 + PROBE / 2).rails_down.is_empty());
    // A batch within the wait that leaves it out changes nothing.
    let s = h.settle(&[lane], t0 + PROBE / 2);
    assert_eq!((s.rails_marked, s.rails_delta), (0, 0));
    assert_eq!(h.wait("b", 0, 1), Some(PROBE));
    // Past the wait the rail is probed; the probe fails: left out for twice as long.
    assert!(!h.lane("b", t0 + PROBE).rail_is_down(0, 1));
    let s = h.settle(&[rail_failed()], t0 + PROBE);
    assert_eq!((s.rails_marked, s.rails_delta), (1, 0));
    assert_eq!(h.wait("b", 0, 1), Some(PROBE * 2));
    assert!(h.lane("b", t0 + PROBE + PROBE * 3 / 2).rail_is_down(0, 1));
    // The probe after that succeeds: the rail is forgotten.
    let later = t0 + PROBE * 3;
    assert!(!h.lane("b", later).rail_is_down(0, 1));
    let s = h.settle(&[Lane::new("b")], later);
    assert_eq!((s.rails_marked, s.rails_delta), (0, -1));
    assert_eq!(h.rails_left_out(), 0);
}

#[test]
fn the_wait_doubles_up_to_its_bound() {
    let mut h = Health::new(PROBE);
    let mut now = Instant::now();
    for _ in 0..10 {
        h.settle(&[rail_failed()], now);
        now += h.wait("b", 0, 1).unwrap();
    }
    assert_eq!(h.wait("b", 0, 1), Some(PROBE * MAX_BACKOFF));
}

#[test]
fn a_rail_past_its_wait_is_kept_while_its_peer_is_not_in_the_batch() {
    let t0 = Instant::now();
    let mut h = Health::new(PROBE);
    h.settle(&[rail_failed()], t0);
    // A batch to another peer, past the wait: b's rail is not probed, so it is kept.
    let s = h.settle(&[Lane::new("c")], t0 + PROBE * 5);
    assert_eq!(s.rails_delta, 0);
    assert_eq!(h.rails_left_out(), 1);
    // But a batch to b past the wait probes it (not left out).
    assert!(!h.lane("b", t0 + PROBE * 5).rail_is_down(0, 1));
}

#[test]
fn a_peer_marked_down_is_counted_and_said_up_again_once() {
    let t0 = Instant::now();
    let mut h = Health::new(PROBE);
    let mut down = Lane::new("b");
    down.rail_failed(0, 0, "x".into());
    down.every_rail_failed();
    let s = h.settle(&[down, Lane::new("c")], t0);
    assert_eq!(
        s,
        Settled {
            rails_marked: 0,
            rails_delta: 0,
            peers_marked: 1
        },
        "a peer down leaves no rail out: its connection goes"
    );
    assert!(h.peers_down.contains("b"));
    let up = h.lane("b", t0);
    h.prepared(&up);
    assert!(!h.peers_down.contains("b"));
    let mut still = Lane::new("b");
    still.down = Some(Error::ShuttingDown);
    h.settle(&[still], t0);
    let mut again = Lane::new("b");
    again.down = Some(Error::ShuttingDown);
    h.prepared(&again);
    assert!(h.peers_down.contains("b"), "not up while its lane is down");
}
