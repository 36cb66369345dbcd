//! The tokio runtime the async tests run on.

/// Runs `f` to completion on a current-thread runtime, inside a `LocalSet` (queue pairs are
/// `!Sync`, so the tasks that await their requests are local tasks).
pub fn run_local<F: std::future::Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    tokio::task::LocalSet::new().block_on(&rt, f)
}
