//! asyncio awaitables of transfers, without a thread per wait: `Transfer.finished` returns
//! an asyncio future that a task on one shared waiting thread (a tokio runtime with one
//! worker, started on a thread of its own when the process's first `Agent` is made, so that
//! no event loop waits for it: building it took 40 to 80 ms under the testbed's emulator, on
//! the loop's thread, when it was started by the first `finished`) settles through `loop.call_soon_threadsafe` when the engine
//! finishes the batch (`gpu_rdma_engine::Transfer::finished`, woken by the engine's worker,
//! bounded by tokio's timer). Before, each awaited transfer held a thread of the event
//! loop's default executor for its whole wait, and that executor has a handful of threads
//! (`min(32, cpus + 4)`): with more batches awaited at once, the rest queued behind them.

use crate::errors::{Class, Failure, Result};
use gpu_rdma_engine::Transfer as EngineTransfer;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use std::sync::{Arc, Once, OnceLock};
use std::time::Duration;
use tokio::runtime::{Builder, Runtime};

/// The waiting thread's runtime, or why it could not start.
static RUNTIME: OnceLock<std::result::Result<Runtime, String>> = OnceLock::new();

fn runtime() -> Result<&'static Runtime> {
    RUNTIME
        .get_or_init(|| {
            Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("gpu_rdma-await")
                .enable_time()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| {
            Failure::new(
                Class::Base,
                "finished",
                format!("finished: the waiting thread did not start: {e}"),
            )
        })
}

/// Starts the waiting thread's runtime on a thread of its own, once per process, and returns
/// at once; a `finished` called before it is up waits for it (without the GIL's help: the
/// start takes no Python lock). A failure to start is kept and raised by `finished`.
pub(crate) fn start_in_background() {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        let start = || {
            if let Ok(rt) = runtime() {
                // The worker's first task: its first wake-up is paid here, not by a loop.
                drop(rt.spawn(async {}));
            }
        };
        // Without a thread to start it on, the first `finished` starts it itself.
        let _ = std::thread::Builder::new()
            .name("gpu_rdma-await-start".into())
            .spawn(start);
    });
}

/// [`settle`] as a Python callable.
static SETTLE: GILOnceCell<PyObject> = GILOnceCell::new();

/// Settles `fut` (on the event loop's thread): with `error` raised, or with None; nothing
/// when it is already done (cancelled by its awaiter, say).
#[pyfunction]
#[pyo3(signature = (fut, error = None))]
fn settle(fut: &Bound<'_, PyAny>, error: Option<Bound<'_, PyAny>>) -> PyResult<()> {
    if fut.call_method0("done")?.is_truthy()? {
        return Ok(());
    }
    match error {
        Some(e) => fut.call_method1("set_exception", (e,))?,
        None => fut.call_method1("set_result", (fut.py().None(),))?,
    };
    Ok(())
}

/// An asyncio future of the running loop, settled when `transfer` finishes or `timeout`
/// passes (then with `Timeout`), as `Transfer.wait(timeout)` would return or raise.
pub(crate) fn finished<'py>(
    py: Python<'py>,
    transfer: Arc<EngineTransfer>,
    timeout: Duration,
) -> PyResult<Bound<'py, PyAny>> {
    let looped = py.import("asyncio")?.call_method0("get_running_loop")?;
    let fut = looped.call_method0("create_future")?;
    let (on, to) = (looped.unbind(), fut.clone().unbind());
    runtime()?.spawn(async move {
        let r = transfer.finished(timeout).await;
        Python::with_gil(|py| {
            let error = r
                .err()
                .map(|e| PyErr::from(Failure::engine("finished", &e)).into_value(py));
            // Made once per process, not per settled future.
            let callback = SETTLE.get_or_try_init(py, || {
                wrap_pyfunction!(settle, py).map(|f| f.into_any().unbind())
            });
            // A closed loop refuses the call: its coroutine is gone, nothing awaits this.
            if let Ok(callback) = callback {
                let _ = on
                    .bind(py)
                    .call_method1("call_soon_threadsafe", (callback, to, error));
            }
        });
    });
    Ok(fut)
}
