//! Liveness and readiness, shared by the HTTP endpoints and the CSI Probe.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::model::full_message;
use crate::volume::Volumes;

#[derive(Debug)]
pub struct Health {
    volumes: Arc<Volumes>,
    /// False until every Kubernetes cache localvol reads from has synced.
    caches_synced: AtomicBool,
    /// Set when kubelet reports that registering this plugin failed.
    registration_error: Mutex<Option<String>>,
}

impl Health {
    pub fn new(volumes: Arc<Volumes>) -> Self {
        Self {
            volumes,
            caches_synced: AtomicBool::new(true),
            registration_error: Mutex::new(None),
        }
    }

    pub fn set_caches_synced(&self, synced: bool) {
        self.caches_synced.store(synced, Ordering::SeqCst);
    }

    pub fn set_registration_error(&self, error: Option<String>) {
        *self.registration_error.lock().unwrap_or_else(|p| p.into_inner()) = error;
    }

    /// Alive unless kubelet refused the plugin: a restart is then the way out.
    pub fn liveness(&self) -> Result<(), String> {
        match &*self.registration_error.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(error) => Err(format!("kubelet plugin registration failed: {error}")),
            None => Ok(()),
        }
    }

    /// The configured device classes not served on this node for lack of storage. They
    /// do not make the daemon unready: it serves the others.
    pub fn missing_classes(&self) -> Vec<crate::volume::MissingClass> {
        self.volumes.missing_classes()
    }

    /// Ready when every served device class is usable and the caches have synced.
    pub async fn readiness(&self) -> Result<(), String> {
        if !self.caches_synced.load(Ordering::SeqCst) {
            return Err("Kubernetes caches are not synced (first list, or a new list after a failed watch, not in yet)".to_string());
        }
        self.volumes.check_health().await.map_err(|e| full_message(&e))
    }
}
