//! A cache of one storage report (lvm's `lvs`+`vgs`, ndctl's region listing), so that
//! RPCs read the state of the storage without a scan each.
//!
//! - **Single flight:** one refresh at a time; callers that arrive meanwhile wait for
//!   it and share its result instead of starting scans of their own.
//! - **Fresh after our own changes:** every mutation calls [`ReportCache::invalidate`],
//!   which makes the next read rescan. A report that was being read while the mutation
//!   ran is never kept: it carries the generation it started in.
//! - **Short TTL** for changes made by others (an administrator's `lvextend`).
//! - **A failing or hung tool does not pile up:** the command runner kills it at its
//!   timeout, and for [`RETRY_AFTER`] the failure is returned at once to every caller,
//!   so a hung `lvs` costs one timeout, not one per waiting RPC.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

/// How long a report is trusted when nothing of ours changed the storage.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// How long a failed refresh is reported to callers before the tool is run again.
pub const RETRY_AFTER: Duration = Duration::from_secs(3);

#[derive(Debug)]
struct Slot<T> {
    value: Option<Entry<T>>,
    failure: Option<Failure>,
}

#[derive(Debug)]
struct Entry<T> {
    value: Arc<T>,
    generation: u64,
    read_at: Instant,
}

#[derive(Debug)]
struct Failure {
    message: String,
    generation: u64,
    at: Instant,
}

#[derive(Debug)]
pub struct ReportCache<T> {
    ttl: Duration,
    generation: AtomicU64,
    slot: Mutex<Slot<T>>,
}

impl<T> ReportCache<T> {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            generation: AtomicU64::new(0),
            slot: Mutex::new(Slot {
                value: None,
                failure: None,
            }),
        }
    }

    /// Forgets the report: the next [`ReportCache::get`] reads the storage again.
    pub fn invalidate(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// The current report: cached if fresh, else read by `read`. While a recent
    /// refresh failed, `recent_failure` builds the error from that failure's message.
    pub async fn get<E, Fut>(
        &self,
        read: impl FnOnce() -> Fut,
        recent_failure: impl FnOnce(String) -> E,
    ) -> Result<Arc<T>, E>
    where
        Fut: Future<Output = Result<T, E>>,
        E: std::error::Error,
    {
        let mut slot = self.slot.lock().await;
        let generation = self.generation.load(Ordering::SeqCst);
        if let Some(entry) = &slot.value
            && entry.generation == generation
            && entry.read_at.elapsed() < self.ttl
        {
            return Ok(Arc::clone(&entry.value));
        }
        if let Some(failure) = &slot.failure
            && failure.generation == generation
            && failure.at.elapsed() < RETRY_AFTER
        {
            return Err(recent_failure(failure.message.clone()));
        }
        match read().await {
            Ok(value) => {
                let value = Arc::new(value);
                slot.value = Some(Entry {
                    value: Arc::clone(&value),
                    generation,
                    read_at: Instant::now(),
                });
                slot.failure = None;
                Ok(value)
            }
            Err(e) => {
                slot.value = None;
                slot.failure = Some(Failure {
                    message: crate::error::full_message(&e),
                    generation,
                    at: Instant::now(),
                });
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Failed(String);

    async fn read(cache: &ReportCache<usize>, reads: &AtomicUsize, fail: bool) -> Result<usize, Failed> {
        cache
            .get(
                || async {
                    let n = reads.fetch_add(1, Ordering::SeqCst) + 1;
                    tokio::task::yield_now().await;
                    if fail {
                        Err(Failed("lvs hung".into()))
                    } else {
                        Ok(n)
                    }
                },
                |m| Failed(format!("recently: {m}")),
            )
            .await
            .map(|v| *v)
    }

    #[tokio::test]
    async fn reads_once_until_invalidated() {
        let cache = ReportCache::new(Duration::from_secs(60));
        let reads = AtomicUsize::new(0);
        assert_eq!(read(&cache, &reads, false).await.unwrap(), 1);
        assert_eq!(read(&cache, &reads, false).await.unwrap(), 1);
        cache.invalidate();
        assert_eq!(read(&cache, &reads, false).await.unwrap(), 2);
        assert_eq!(reads.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn concurrent_callers_share_one_read() {
        let cache = ReportCache::new(Duration::from_secs(60));
        let reads = AtomicUsize::new(0);
        let (a, b, c) = tokio::join!(
            read(&cache, &reads, false),
            read(&cache, &reads, false),
            read(&cache, &reads, false)
        );
        assert_eq!((a.unwrap(), b.unwrap(), c.unwrap()), (1, 1, 1));
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_stale_report_is_read_again() {
        let cache = ReportCache::new(Duration::ZERO);
        let reads = AtomicUsize::new(0);
        read(&cache, &reads, false).await.unwrap();
        assert_eq!(read(&cache, &reads, false).await.unwrap(), 2);
    }

    #[tokio::test]
    async fn a_failure_is_shared_for_a_while_then_retried() {
        let cache = ReportCache::new(Duration::from_secs(60));
        let reads = AtomicUsize::new(0);
        let first = read(&cache, &reads, true).await.unwrap_err();
        assert_eq!(first.0, "lvs hung");
        let second = read(&cache, &reads, false).await.unwrap_err();
        assert_eq!(second.0, "recently: lvs hung");
        assert_eq!(
            reads.load(Ordering::SeqCst),
            1,
            "no second run within RETRY_AFTER"
        );
        // Our own change makes the next call run the tool again.
        cache.invalidate();
        assert_eq!(read(&cache, &reads, false).await.unwrap(), 2);
    }
}
