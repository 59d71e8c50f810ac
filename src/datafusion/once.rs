//! `OncePerExecution`: work that every output partition of one execution shares, started by
//! the first partition that asks and awaited by all of them (a join's collected build side,
//! the aggregate's partials).
//!
//! Why not count partitions: a node cannot know how many of its partitions a parent will
//! execute. A parent that stops early, or runs only some partitions, would leave a half-taken
//! result behind, and the next execution would pick it up: work done under another
//! `TaskContext` (its memory pool, its settings) and possibly over other data. So the shared
//! work is tied to the `TaskContext` that started it:
//!
//! - a partition executed with the same context shares it;
//! - a partition executed with another context starts afresh (and drops the old one);
//! - once as many partitions as the node has took it, it is released, so its memory goes back
//!   to the pool as soon as the streams that hold it finish. A later partition of the same
//!   context then starts it again: correct, only slower, and no DataFusion parent does that.
//!
//! The shared work runs in a task of its own, spawned at its first poll, not inside the poll
//! of the partition that started it. Where it finishes decides where the waiting partitions
//! wake. Finished inside one partition's poll, it woke the others into that worker's LIFO slot,
//! which no idle worker can steal from, and they waited there until the first partition used
//! up its cooperative budget. Over two workers, one partition of a CPU-bound probe started late
//! and the query ran about a quarter slower. Finished in its own task, it wakes them all from
//! that task, so a second waiter goes to the stealable queue and each worker takes one.
//! Dropping every waiter drops the task's handle, which aborts it.
//!
//! Invariant: the context is held as a `Weak`, so its allocation outlives the cache entry and
//! its address cannot be reused by a later context while the entry exists.
//!
//! DataFusion's `reset_state` (recursive queries) rebuilds a node through `replace_children`,
//! which gives it a fresh, empty `OncePerExecution`.

use std::sync::{Arc, Mutex, Weak};

use ::datafusion::common::runtime::SpawnedTask;
use ::datafusion::error::{DataFusionError, Result};
use ::datafusion::execution::TaskContext;
use futures::future::{BoxFuture, FutureExt, Shared};

/// The result every partition of one execution awaits.
pub type SharedResult<T> = std::result::Result<Arc<T>, Arc<DataFusionError>>;

/// The shared future of one execution.
pub type SharedWork<T> = Shared<BoxFuture<'static, SharedResult<T>>>;

/// The work of the current execution: its context, its future, and how many partitions took it.
struct Entry<T> {
    context: Weak<TaskContext>,
    work: SharedWork<T>,
    taken: usize,
}

/// Shared work per execution (see the module docs).
pub struct OncePerExecution<T> {
    current: Mutex<Option<Entry<T>>>,
}

impl<T> Default for OncePerExecution<T> {
    fn default() -> Self {
        Self {
            current: Mutex::new(None),
        }
    }
}

impl<T: Send + Sync + 'static> OncePerExecution<T> {
    /// The shared work of `context`'s execution for one of `partitions` output partitions:
    /// the one already started under `context`, or the future `start` returns.
    pub fn get_or_start(
        &self,
        context: &Arc<TaskContext>,
        partitions: usize,
        start: impl FnOnce() -> Result<BoxFuture<'static, Result<Arc<T>>>>,
    ) -> Result<SharedWork<T>> {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = current
            .as_mut()
            .filter(|e| std::ptr::eq(e.context.as_ptr(), Arc::as_ptr(context)))
        {
            let work = entry.work.clone();
            entry.taken += 1;
            if entry.taken >= partitions {
                *current = None;
            }
            return Ok(work);
        }
        let work = own_task(start()?).map(|r| r.map_err(Arc::new)).boxed().shared();
        *current = (partitions > 1).then(|| Entry {
            context: Arc::downgrade(context),
            work: work.clone(),
            taken: 1,
        });
        Ok(work)
    }
}

/// `work` run in a task of its own, spawned when the returned future is first polled (so inside
/// the runtime that polls it), and aborted when that future is dropped.
async fn own_task<T: Send + 'static>(work: BoxFuture<'static, Result<T>>) -> Result<T> {
    SpawnedTask::spawn(work)
        .join_unwind()
        .await
        .map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))?
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Starts number `starts` (counting from 1) and returns it as the result.
    fn counted(starts: &Arc<AtomicUsize>) -> impl FnOnce() -> Result<BoxFuture<'static, Result<Arc<usize>>>> {
        let starts = Arc::clone(starts);
        move || {
            let n = starts.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(async move { Ok(Arc::new(n)) }.boxed())
        }
    }

    async fn take(
        once: &OncePerExecution<usize>,
        ctx: &Arc<TaskContext>,
        parts: usize,
        starts: &Arc<AtomicUsize>,
    ) -> usize {
        *once.get_or_start(ctx, parts, counted(starts)).unwrap().await.unwrap()
    }

    #[tokio::test]
    async fn partitions_of_one_execution_share_one_start() {
        let (once, starts) = (OncePerExecution::default(), Arc::new(AtomicUsize::new(0)));
        let ctx = Arc::new(TaskContext::default());
        let got = [
            take(&once, &ctx, 3, &starts).await,
            take(&once, &ctx, 3, &starts).await,
            take(&once, &ctx, 3, &starts).await,
        ];
        assert_eq!(got, [1, 1, 1]);
        // All three took it, so it was released: the next execution starts afresh.
        let again = Arc::new(TaskContext::default());
        assert_eq!(take(&once, &again, 3, &starts).await, 2);
    }

    #[tokio::test]
    async fn a_parent_that_executes_fewer_partitions_leaves_nothing_stale() {
        let (once, starts) = (OncePerExecution::default(), Arc::new(AtomicUsize::new(0)));
        // The first execution runs partition 0 of 2 only (a parent that stopped early).
        let first = Arc::new(TaskContext::default());
        assert_eq!(take(&once, &first, 2, &starts).await, 1);
        // The next execution, under its own context, runs both: neither may see the first's work.
        let second = Arc::new(TaskContext::default());
        assert_eq!(take(&once, &second, 2, &starts).await, 2);
        assert_eq!(take(&once, &second, 2, &starts).await, 2);
        // And the one after it gets its own again, even with the first context dropped meanwhile.
        drop(first);
        let third = Arc::new(TaskContext::default());
        assert_eq!(take(&once, &third, 2, &starts).await, 3);
        assert_eq!(take(&once, &third, 2, &starts).await, 3);
    }

    #[tokio::test]
    async fn a_failed_start_is_shared_by_the_execution() {
        let once = OncePerExecution::<usize>::default();
        let ctx = Arc::new(TaskContext::default());
        let failing = || Ok(async { Err(DataFusionError::Execution("build failed".into())) }.boxed());
        let a = once.get_or_start(&ctx, 2, failing).unwrap();
        let b = once
            .get_or_start(&ctx, 2, || unreachable!("the second partition shares the first's work"))
            .unwrap();
        for work in [a, b] {
            let err = work.await.unwrap_err();
            assert_eq!(err.to_string(), "Execution error: build failed");
        }
    }

    /// Two partitions wait for shared work that ends with CPU work of its own; then each spins,
    /// without yielding, until it sees the other start. Had the work finished inside one
    /// partition's poll, the other would sit in that worker's LIFO slot until the first yields,
    /// which it never does here: both must run at once, on the runtime's two workers.
    #[test]
    fn waiting_partitions_run_at_once_when_the_work_finishes() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        let once = OncePerExecution::<usize>::default();
        let ctx = Arc::new(TaskContext::default());
        let (go, ready) = tokio::sync::oneshot::channel::<()>();
        let mut ready = Some(ready);
        let started = Arc::new(AtomicUsize::new(0));
        let partitions: Vec<_> = (0..2)
            .map(|_| {
                let work = once
                    .get_or_start(&ctx, 2, || {
                        let ready = ready.take().unwrap();
                        Ok(async move {
                            ready.await.ok();
                            let until = std::time::Instant::now() + std::time::Duration::from_millis(20);
                            while std::time::Instant::now() < until {
                                std::hint::spin_loop();
                            }
                            Ok(Arc::new(7))
                        }
                        .boxed())
                    })
                    .unwrap();
                let started = Arc::clone(&started);
                runtime.spawn(async move {
                    let value = *work.await.unwrap();
                    started.fetch_add(1, Ordering::SeqCst);
                    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(5);
                    while started.load(Ordering::SeqCst) < 2 && std::time::Instant::now() < give_up {
                        std::hint::spin_loop();
                    }
                    (value, started.load(Ordering::SeqCst))
                })
            })
            .collect();
        // Both partitions are waiting before the work may go on.
        std::thread::sleep(std::time::Duration::from_millis(100));
        go.send(()).unwrap();
        for partition in partitions {
            let (value, seen) = runtime.block_on(partition).unwrap();
            assert_eq!((value, seen), (7, 2), "a partition ran alone while the other waited");
        }
    }
}
