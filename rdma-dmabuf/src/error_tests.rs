use super::*;

fn completion(status: u32) -> Error {
    Error::Completion {
        wr_id: 1 << 32,
        kind: crate::wr::WorkKind::Read,
        qp_num: 0x11,
        status,
        status_text: "remote access error".into(),
        vendor_err: 0,
    }
}

#[test]
fn completion_errors_name_the_request_and_hint_per_status() {
    use ffi::ibv_wc_status as S;
    let s = completion(S::IBV_WC_REM_ACCESS_ERR).to_string();
    assert!(
        s.starts_with("RDMA read on qp 0x11 failed: remote access error"),
        "{s}"
    );
    assert!(
        !s.contains("4294967296"),
        "the raw wr_id means nothing to a user: {s}"
    );
    for needle in ["REMOTE_READ", "rkey", "address + length"] {
        assert!(s.contains(needle), "{needle} missing: {s}");
    }
    let hints = [
        (
            S::IBV_WC_RETRY_EXC_ERR,
            "never acknowledged",
            ErrorKind::PeerGone,
        ),
        (
            S::IBV_WC_RNR_RETRY_EXC_ERR,
            "no receive posted",
            ErrorKind::ReceiverNotReady,
        ),
        (S::IBV_WC_WR_FLUSH_ERR, "error state", ErrorKind::Flushed),
        (
            S::IBV_WC_REM_ACCESS_ERR,
            "REMOTE_WRITE",
            ErrorKind::RemoteAccess,
        ),
        (
            S::IBV_WC_LOC_LEN_ERR,
            "longer than the receive",
            ErrorKind::InvalidRequest,
        ),
    ];
    for status in [
        S::IBV_WC_LOC_PROT_ERR,
        S::IBV_WC_LOC_ACCESS_ERR,
        S::IBV_WC_REM_INV_REQ_ERR,
        S::IBV_WC_REM_OP_ERR,
    ] {
        assert_eq!(completion(status).kind(), ErrorKind::InvalidRequest);
    }
    assert_eq!(completion(S::IBV_WC_GENERAL_ERR).kind(), ErrorKind::Other);
    for (status, hint, kind) in hints {
        let e = completion(status);
        assert!(e.to_string().contains(hint), "{e}");
        assert_eq!(e.kind(), kind, "{e}");
    }
    assert!(!completion(S::IBV_WC_GENERAL_ERR)
        .to_string()
        .contains("hint"));
}

#[test]
fn kinds_name_what_a_caller_handles() {
    let cm = |errno| Error::from_errno(Op::Cm, "connect to 10.0.0.1:7471", errno);
    assert_eq!(cm(libc::ECONNREFUSED).kind(), ErrorKind::Refused);
    assert_eq!(cm(libc::EHOSTUNREACH).kind(), ErrorKind::Unreachable);
    assert_eq!(cm(libc::ETIMEDOUT).kind(), ErrorKind::TimedOut);
    assert_eq!(cm(libc::ENODEV).kind(), ErrorKind::NoDevice);
    assert!(cm(libc::EHOSTUNREACH).to_string().contains("alive"));
    assert_eq!(
        Error::invalid(Op::PostSend, "x").kind(),
        ErrorKind::InvalidInput
    );
}

#[test]
fn drm_export_errors_convert_with_question_mark() {
    fn alloc() -> Result<drm_export::DmaBuf> {
        Err(drm_export::Error::Os {
            op: drm_export::Op::CreateUdmabuf,
            target: "/dev/udmabuf".into(),
            source: io::Error::from_raw_os_error(libc::EINVAL),
            hint: None,
        })?
    }
    let e = alloc().unwrap_err();
    assert!(matches!(e, Error::Export(_)), "{e}");
    assert_eq!(e.errno(), Some(libc::EINVAL));
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
}

#[test]
fn verbs_errors_name_the_op_target_errno_and_hint() {
    let e = Error::from_errno(
        Op::RegDmabufMr,
        "pd on rxe0 (fd 7, offset 1, iova 0)",
        libc::EINVAL,
    );
    let s = e.to_string();
    assert!(
        s.starts_with("ibv_reg_dmabuf_mr on pd on rxe0 (fd 7, offset 1, iova 0): Invalid argument"),
        "{s}"
    );
    assert!(s.contains("same offset within a page"), "{s}");
    assert_eq!(e.errno(), Some(libc::EINVAL));
}

#[test]
fn unsupported_names_the_errno() {
    let e = Error::Unsupported {
        op: Op::RegDmabufMr,
        device: "rxe0".into(),
        errno: libc::EOPNOTSUPP,
        why: DMABUF_HINT,
    };
    let s = e.to_string();
    assert!(
        s.contains("rxe0") && s.contains("Operation not supported") && s.contains("kernel-patches"),
        "{s}"
    );
    assert!(e.is_unsupported());
}

#[test]
fn the_dmabuf_hint_names_both_causes_of_eopnotsupp() {
    // No dma-buf MRs at all (stock providers, stock rxe)...
    assert!(DMABUF_HINT.contains("has no dma-buf MRs"), "{DMABUF_HINT}");
    // ...or a driver that has them and refuses this buffer (the patched rxe).
    for what in ["I/O memory", "no vmap", "supports_dmabuf()"] {
        assert!(DMABUF_HINT.contains(what), "{what}: {DMABUF_HINT}");
    }
}

#[test]
fn zero_errno_becomes_eio() {
    assert_eq!(
        Error::from_errno(Op::PostSend, "qp", 0).errno(),
        Some(libc::EIO)
    );
}
