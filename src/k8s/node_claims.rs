//! The claims of this node's volumes, from one watch selected by the label this node
//! puts on them (see `claim_label`): the API server sends the node its own claims only.
//! The owner check reads a claim here before it asks the API, and the reclaim scheduler
//! takes its schedules from here. One watch serves both.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::Notify;

use super::reflect::{Synced, WATCH_RETRY};
use super::{claim_label, reflect};

/// This node's labelled claims, kept current by a background watch.
#[derive(Debug, Clone)]
pub struct NodeClaims {
    store: Store<PersistentVolumeClaim>,
    synced: Synced,
    changed: Arc<Notify>,
}

impl NodeClaims {
    /// Starts the watch of the claims labelled with `node`.
    pub fn start(client: Client, node: &str) -> Self {
        let changed = Arc::new(Notify::new());
        let notify = Arc::clone(&changed);
        let (store, synced) = reflect::spawn(
            Api::all(client),
            watcher::Config::default().labels(&claim_label::selector(node)),
            "this node's claims",
            WATCH_RETRY,
            |_| {},
            |_| {},
            move |event| {
                if matches!(
                    event,
                    watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone
                ) {
                    notify.notify_one();
                }
            },
        );
        Self {
            store,
            synced,
            changed,
        }
    }

    /// The claim as the watch last saw it, only while the watch is in sync: after a
    /// failure it may have missed changes until it has listed again.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        if !self.synced.get() {
            return None;
        }
        self.store.get(&ObjectRef::new(name).within(namespace))
    }

    /// The claim as the watch last saw it, in sync or not (for what only needs the
    /// latest known state, such as the subject of an event).
    pub fn last_seen(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.store.get(&ObjectRef::new(name).within(namespace))
    }

    /// Resolves after the next change the watch saw: an added, changed or deleted claim,
    /// or a complete list. A change while no one waits is kept for the next waiter.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

#[cfg(test)]
impl NodeClaims {
    /// Claims a test puts in by hand, through the returned writer; in sync from the
    /// start.
    pub(super) fn by_hand() -> (
        Self,
        kube::runtime::reflector::store::Writer<PersistentVolumeClaim>,
    ) {
        let (store, writer) = kube::runtime::reflector::store();
        let synced = Synced::default();
        synced.listed();
        let claims = Self {
            store,
            synced,
            changed: Arc::default(),
        };
        (claims, writer)
    }

    /// As when the watch fails: out of sync until it has listed again.
    pub(super) fn lose_sync(&self) {
        self.synced.lost();
    }
}
