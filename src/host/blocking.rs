//! Where blocking work runs: every syscall and file operation of localvol leaves the
//! async workers through [`run`], and a node call can keep all of its own on one thread
//! ([`on_one_thread`]).
//!
//! A trip to tokio's blocking pool wakes a parked thread, then wakes the worker that
//! awaits the answer: two thread hand-offs. On this project's machines each costs 0.1 to
//! 0.4 ms, far more than the statx, sysfs read or bind mount it carries, and a publish
//! made about ten such trips, four of them one after another. A node call run by
//! [`on_one_thread`] makes one hand-off in and one out, and its blocking steps run in
//! place, one after another, on the thread the call already holds. The async workers
//! never block either way; what a node call waits on (a command's output, the API
//! server) it still awaits, from its own thread.

use std::cell::Cell;
use std::future::Future;

thread_local! {
    /// Set while this thread runs a node call for [`on_one_thread`].
    static NODE_CALL_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` where blocking is allowed: in place on a node call's own thread, else on
/// the blocking pool. An error is only a task that could not run to its end (a panic,
/// a runtime shutting down).
pub async fn run<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    if NODE_CALL_THREAD.get() {
        return Ok(f());
    }
    tokio::task::spawn_blocking(f).await
}

/// Runs `call` to its end on one thread of the blocking pool, where [`run`] does its
/// blocking steps in place. The call is no longer cut short at an await when its caller
/// goes away (a client that hung up): it finishes, holding its volume's lock until then,
/// as a retry expects of a call still in progress. A panic in `call` is the caller's.
pub async fn on_one_thread<F>(call: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    if NODE_CALL_THREAD.get() {
        return call.await;
    }
    let runtime = tokio::runtime::Handle::current();
    // The caller's span (the RPC's) goes with the call to its thread.
    let call = tracing::Instrument::instrument(call, tracing::Span::current());
    let joined = tokio::task::spawn_blocking(move || {
        // Pool threads are reused: the mark must not outlive this call, panic or not.
        struct Unmark;
        impl Drop for Unmark {
            fn drop(&mut self) {
                NODE_CALL_THREAD.set(false);
            }
        }
        NODE_CALL_THREAD.set(true);
        let _unmark = Unmark;
        runtime.block_on(call)
    })
    .await;
    match joined {
        Ok(output) => output,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Only a runtime shutting down cancels a blocking task before it starts.
        Err(e) => panic!("node call could not run: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread_id() -> std::thread::ThreadId {
        std::thread::current().id()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_call_does_its_blocking_steps_on_its_own_thread() {
        let (outer, inner, nested) = on_one_thread(async {
            let outer = thread_id();
            let inner = run(thread_id).await.unwrap();
            let nested = on_one_thread(async { run(thread_id).await.unwrap() }).await;
            (outer, inner, nested)
        })
        .await;
        assert_eq!(outer, inner);
        assert_eq!(outer, nested);
        assert_ne!(outer, thread_id(), "not on the caller's worker");
        // Outside a node call, blocking steps leave the worker.
        assert_ne!(run(thread_id).await.unwrap(), thread_id());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_call_can_await_async_work_from_its_thread() {
        let answer = on_one_thread(async {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            let (tx, rx) = tokio::sync::oneshot::channel();
            tokio::spawn(async move { tx.send(42).unwrap() });
            rx.await.unwrap()
        })
        .await;
        assert_eq!(answer, 42);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_mark_is_gone_after_a_panic() {
        let panicked = tokio::spawn(on_one_thread(async { panic!("boom") })).await;
        assert!(panicked.unwrap_err().is_panic());
        // Whatever pool thread runs next, it is not marked.
        for _ in 0..8 {
            let marked = tokio::task::spawn_blocking(|| NODE_CALL_THREAD.get())
                .await
                .unwrap();
            assert!(!marked);
        }
    }
}
