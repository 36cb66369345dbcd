//! The retry settings of the environment (`RDMA_DMABUF_ACK_TIMEOUT`, `RDMA_DMABUF_RETRY_COUNT`)
//! against a real queue pair: a value that is not UTF-8, not a number or outside its bounded
//! range is refused with `Error::Setting` when the queue pair is built, naming the variable
//! and the accepted range; a good value changes the retry budget. One test in its own process
//! (the VM runs each test file's tests in a process of their own), since it changes the
//! process's environment. Runs in the testbed VM.

use integration_tests::testbed::Testbed;
use integration_tests::verbs::pd;
use rdma_dmabuf::{Error, QueuePairBuilder, ACK_TIMEOUT_ENV, RETRY_COUNT_ENV};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

#[test]
#[ignore = "needs the testbed VM"]
fn unusable_retry_settings_are_refused_at_build_and_bounded_ones_apply() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let cases: [(&str, &[u8], &str); 6] = [
        (ACK_TIMEOUT_ENV, b"\xff\xfe", "not UTF-8"),
        (RETRY_COUNT_ENV, b"6\xff", "not UTF-8"),
        (ACK_TIMEOUT_ENV, b"slow", "not a number"),
        (ACK_TIMEOUT_ENV, b"31", "out of range"),
        (ACK_TIMEOUT_ENV, b"0", "out of range"),
        (RETRY_COUNT_ENV, b"7", "out of range"),
    ];
    for (name, value, why) in cases {
        std::env::remove_var(ACK_TIMEOUT_ENV);
        std::env::remove_var(RETRY_COUNT_ENV);
        std::env::set_var(name, OsStr::from_bytes(value));
        let err = QueuePairBuilder::new(&pd).build().unwrap_err();
        let Error::Setting {
            variable,
            why: got,
            accepted,
            ..
        } = &err
        else {
            panic!("{name}={value:?} built or failed otherwise: {err}");
        };
        assert_eq!((*variable, *got), (name, why), "{err}");
        assert!(accepted.contains(" to "), "no range named: {err}");
    }
    std::env::remove_var(ACK_TIMEOUT_ENV);
    std::env::remove_var(RETRY_COUNT_ENV);
    let default_budget = QueuePairBuilder::new(&pd).retry_budget();
    std::env::set_var(ACK_TIMEOUT_ENV, "22");
    std::env::set_var(RETRY_COUNT_ENV, "6");
    let builder = QueuePairBuilder::new(&pd);
    assert!(builder.retry_budget() > default_budget);
    assert!(
        builder.retry_budget() <= Duration::from_secs(482),
        "unbounded"
    );
    builder.build().expect("the largest accepted values build");
    // 7 ("forever" on soft-RoCE) only through an explicit call.
    let qp = QueuePairBuilder::new(&pd).retry_count(7).build();
    assert!(
        qp.is_ok(),
        "an explicit retry_count(7) is the caller's choice"
    );
    std::env::remove_var(ACK_TIMEOUT_ENV);
    std::env::remove_var(RETRY_COUNT_ENV);
}
