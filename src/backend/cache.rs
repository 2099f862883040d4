//! A cache of one storage report (lvm's `lvs`, ndctl's region listing), so that
//! RPCs read the state of the storage without a scan each.
//!
//! - **Single flight:** one refresh at a time; callers that arrive meanwhile wait for
//!   it and share its result instead of starting scans of their own.
//! - **Fresh after our own changes:** a mutation either invalidates the report (the
//!   next read rescans) or, bracketed by [`ReportCache::begin_change`] and
//!   [`ReportCache::finish_change`], applies its known effect to it, so the next RPC
//!   needs no scan. A patch lands only on the report that was current when the change
//!   began and while no other change overlapped it; otherwise the report is dropped.
//!   A report that was being read while a mutation ran is never kept: it carries the
//!   generation it started in.
//! - **Short TTL** for changes made by others (an administrator's `lvextend`); callers
//!   that only look up what they themselves changed may accept an older report
//!   ([`ReportCache::get_within`] with [`KNOWN_TTL`]).
//! - **A failing or hung tool does not pile up:** the command runner kills it at its
//!   timeout, and for [`RETRY_AFTER`] the failure is returned at once to every caller,
//!   so a hung `lvs` costs one timeout, not one per waiting RPC.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Mutex;
// tokio's clock (the real one outside tests) so that a test can run an idle hour of
// probes and refreshes in paused time.
use tokio::time::Instant;

/// How long a report is trusted when nothing of ours changed the storage. It sets how
/// often an idle node runs the tool: kubelet's readiness probe (every second), the
/// gauges' refresh (every 30 s) and external-provisioner's GetCapacity poll (every
/// minute) all read through this cache, so an idle LVM node runs one `lvs` and one
/// `vgs` a minute whatever its number of volumes (TopoLVM's issue 1221 measured about
/// 40 LVM commands a minute at 100 volumes). With 10 s it ran twelve. The price: a
/// change made by someone else (an administrator's `vgextend`) is seen up to a minute
/// late, as the provisioner's own capacity poll would see it.
pub const DEFAULT_TTL: Duration = Duration::from_secs(60);
/// How old a report may be before a request is refused for lack of space: a refusal is
/// rare and a wrong one costly, so it is decided on a report read at most 10 s before
/// (what others freed, a `vgextend`, is seen at once).
pub const REFUSAL_TTL: Duration = Duration::from_secs(10);
/// How old a report may be for looking up a class's own volumes. Only localvol changes
/// them, and each of its changes is applied to the cached report; this bounds how long
/// an administrator's out-of-band change to one (an `lvchange -an`) can go unseen.
pub const KNOWN_TTL: Duration = Duration::from_secs(120);
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
    /// Which read produced it: a patch must land on the report it was planned against.
    read_serial: u64,
    read_at: Instant,
}

/// A change in progress: what [`ReportCache::finish_change`] needs to patch the report.
#[derive(Debug)]
#[must_use = "finish the change, or the report stays invalid until the next read"]
pub struct ChangeTicket {
    /// The report current when the change began, if there was one.
    base_serial: Option<u64>,
    /// The generation the change began; any other change or read moves it on.
    generation: u64,
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
    reads: AtomicU64,
    slot: Mutex<Slot<T>>,
}

impl<T> ReportCache<T> {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            generation: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            slot: Mutex::new(Slot {
                value: None,
                failure: None,
            }),
        }
    }

    /// How long a report is trusted when nothing of ours changed the storage.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Forgets the report: the next [`ReportCache::get_within`] reads the storage again.
    pub fn invalidate(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// The current report if it was read within `max_age` (the TTL, or longer for
    /// callers that look up only what they changed themselves), else one read by
    /// `read`. While a recent refresh failed, `recent_failure` builds the error from
    /// that failure's message.
    pub async fn get_within<E, Fut>(
        &self,
        max_age: Duration,
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
            && entry.read_at.elapsed() < max_age
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
                    read_serial: self.reads.fetch_add(1, Ordering::SeqCst),
                    read_at: Instant::now(),
                });
                slot.failure = None;
                Ok(value)
            }
            Err(e) => {
                slot.value = None;
                slot.failure = Some(Failure {
                    message: crate::model::full_message(&e),
                    generation,
                    at: Instant::now(),
                });
                Err(e)
            }
        }
    }
}

impl<T: Clone> ReportCache<T> {
    /// Starts a mutation whose effect on the report will be known when it succeeds.
    /// From here on no report counts as current, including one being read meanwhile.
    pub async fn begin_change(&self) -> ChangeTicket {
        // The slot lock waits out a read in flight, so the base is a finished report.
        let slot = self.slot.lock().await;
        let current = self.generation.load(Ordering::SeqCst);
        let base_serial = slot
            .value
            .as_ref()
            .filter(|e| e.generation == current)
            .map(|e| e.read_serial);
        ChangeTicket {
            base_serial,
            generation: self.generation.fetch_add(1, Ordering::SeqCst) + 1,
        }
    }

    /// Ends a mutation: with `Some(patch)` (it succeeded and its effect is known), the
    /// report it began from gets the patch and is current again, unless another change
    /// or an invalidation came in between; anything else leaves no current report.
    pub async fn finish_change(&self, ticket: ChangeTicket, patch: Option<impl FnOnce(&mut T)>) {
        let mut slot = self.slot.lock().await;
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let (Some(patch), Some(base)) = (patch, ticket.base_serial) else {
            return;
        };
        if generation != ticket.generation + 1 {
            return;
        }
        if let Some(entry) = slot.value.as_mut()
            && entry.read_serial == base
        {
            let mut value = T::clone(&entry.value);
            patch(&mut value);
            entry.value = Arc::new(value);
            entry.generation = generation;
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
            .get_within(
                cache.ttl(),
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

    fn add(n: usize) -> Option<impl FnOnce(&mut usize)> {
        Some(move |v: &mut usize| *v += n)
    }

    #[tokio::test]
    async fn a_known_change_patches_the_report_without_a_read() {
        let cache = ReportCache::new(Duration::from_secs(60));
        let reads = AtomicUsize::new(0);
        assert_eq!(read(&cache, &reads, false).await.unwrap(), 1);
        let ticket = cache.begin_change().await;
        cache.finish_change(ticket, add(10)).await;
        assert_eq!(read(&cache, &reads, false).await.unwrap(), 11);
        assert_eq!(reads.load(Ordering::SeqCst), 1, "no rescan after our own change");
    }

    #[tokio::test]
    async fn a_failed_or_unknown_change_drops_the_report() {
        let cache = ReportCache::new(Duration::from_secs(60));
        let reads = AtomicUsize::new(0);
        read(&cache, &reads, false).await.unwrap();
        let ticket = cache.begin_change().await;
        cache.finish_change(ticket, None::<fn(&mut usize)>).await;
        assert_eq!(read(&cache, &reads, false).await.unwrap(), 2);
    }

    #[tokio::test]
    async fn a_report_read_during_a_change_is_neither_kept_nor_patched() {
        let cache = ReportCache::new(Duration::from_secs(60));
        let reads = AtomicUsize::new(0);
        read(&cache, &reads, false).await.unwrap();
        let ticket = cache.begin_change().await;
        // Read while the change runs: it may or may not see the change.
        assert_eq!(read(&cache, &reads, false).await.unwrap(), 2);
        cache.finish_change(ticket, add(10)).await;
        assert_eq!(
            read(&cache, &reads, false).await.unwrap(),
            3,
            "rescanned: patching read 2 could count the change twice"
        );
    }

    #[tokio::test]
    async fn overlapping_changes_drop_the_report() {
        let cache = ReportCache::new(Duration::from_secs(60));
        let reads = AtomicUsize::new(0);
        read(&cache, &reads, false).await.unwrap();
        let first = cache.begin_change().await;
        let second = cache.begin_change().await;
        cache.finish_change(first, add(10)).await;
        cache.finish_change(second, add(100)).await;
        assert_eq!(read(&cache, &reads, false).await.unwrap(), 2);
        // An invalidation during a change also wins over its patch.
        let ticket = cache.begin_change().await;
        cache.invalidate();
        cache.finish_change(ticket, add(10)).await;
        assert_eq!(read(&cache, &reads, false).await.unwrap(), 3);
    }

    #[tokio::test]
    async fn a_patch_keeps_the_age_of_the_read_it_patched() {
        let cache = ReportCache::new(Duration::from_millis(50));
        let reads = AtomicUsize::new(0);
        read(&cache, &reads, false).await.unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
        let ticket = cache.begin_change().await;
        cache.finish_change(ticket, add(10)).await;
        // Too old for the TTL (others' changes), young enough for a longer limit.
        let within = cache
            .get_within(
                Duration::from_secs(60),
                || async { Err::<usize, _>(Failed("not read".into())) },
                Failed,
            )
            .await
            .unwrap();
        assert_eq!(*within, 11);
        assert_eq!(read(&cache, &reads, false).await.unwrap(), 2);
    }
}
