//! Watch caches that know whether they are in sync: the node's pods and its labelled
//! claims are each kept by one of these.
//!
//! After any list or watch error the watch is not resumed but started over with a new
//! list (as client-go's reflector does): a resumed watch gives no sign that it works
//! again, while a completed list does, so the cache counts as in sync again only then.
//! Meanwhile its readers fall back to the API or answer UNAVAILABLE rather than decide
//! on objects that may have changed while the API server was away. A watch the server
//! merely closes (its timeout) is not an error: the watcher resumes it.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio_stream::StreamExt;
use tracing::{info, warn};

/// Whether the node's pod cache mirrors the API server now, and how many times it has
/// been listed. It is out of sync until the first list is in, and again from a failed
/// list or watch until the pods have been listed anew.
#[derive(Debug, Clone, Default)]
pub struct Synced(Arc<SyncState>);

#[derive(Debug, Default)]
struct SyncState {
    in_sync: AtomicBool,
    lists: AtomicU64,
}

impl Synced {
    pub fn get(&self) -> bool {
        self.0.in_sync.load(Ordering::SeqCst)
    }

    /// Counts the complete lists so far. Claims and volumes read by name are only reused
    /// within one list generation: one read before an outage may have changed during it.
    pub fn generation(&self) -> u64 {
        self.0.lists.load(Ordering::SeqCst)
    }

    /// A complete list is in. The generation moves first, so that whoever sees the cache
    /// in sync also sees the new generation.
    pub(super) fn listed(&self) {
        self.0.lists.fetch_add(1, Ordering::SeqCst);
        self.0.in_sync.store(true, Ordering::SeqCst);
    }

    /// The watch failed; returns whether the cache was in sync until now.
    pub(super) fn lost(&self) -> bool {
        self.0.in_sync.swap(false, Ordering::SeqCst)
    }
}

/// Delays between attempts to list the node's pods again after a list or watch failed:
/// `first`, doubling up to `max`, back to `first` once a list succeeds.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    pub first: Duration,
    pub max: Duration,
}

pub const WATCH_RETRY: Retry = Retry {
    first: Duration::from_millis(800),
    max: Duration::from_secs(30),
};

/// Starts a reflector of `api` selected by `config` and returns its store and sync
/// state. Each object is passed through `slim` before it is kept; `on_change` runs with
/// true each time a complete list is in and with false when the cache falls out of sync;
/// `on_event` sees every event once the store has applied it. `what` names the objects
/// in the log.
pub fn spawn<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    retry: Retry,
    slim: fn(&mut K),
    on_change: impl Fn(bool) + Send + 'static,
    on_event: impl Fn(&watcher::Event<K>) + Send + 'static,
) -> (Store<K>, Synced)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (reader, mut writer) = reflector::store();
    let synced = Synced::default();
    let (store, flag) = (reader.clone(), synced.clone());
    tokio::spawn(async move {
        let mut delay = retry.first;
        loop {
            let events = watcher(api.clone(), config.clone()).modify(slim);
            let mut events = std::pin::pin!(events);
            let error = loop {
                match events.next().await {
                    Some(Ok(event)) => {
                        writer.apply_watcher_event(&event);
                        if matches!(event, watcher::Event::InitDone) {
                            info!(objects = store.len(), "{what} cache synced");
                            flag.listed();
                            on_change(true);
                            delay = retry.first;
                        }
                        on_event(&event);
                    }
                    Some(Err(e)) => break e.to_string(),
                    None => break "the watch stream ended".to_string(),
                }
            };
            if flag.lost() {
                on_change(false);
                warn!(%error, retry_in = ?delay, "{what} watch failed: the cache is out of sync until listed again");
            } else {
                warn!(%error, retry_in = ?delay, "cannot list or watch {what}");
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(retry.max);
        }
    });
    (reader, synced)
}
