//! The configured device classes of this node, including those whose storage (volume
//! group, thin pool, PMEM region) is not there.
//!
//! Fleets are not uniform, and one configuration serves them all: a node that lacks a
//! class's storage still serves its other classes and stays Ready. The missing class
//! offers no capacity, refuses new volumes with the reason, and is opened as soon as its
//! storage appears ([`Volumes::open_missing`], run on the stats interval), without a
//! restart. An opened class stays opened: storage that disappears later fails the
//! class's health check, as before.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use tracing::{info, warn};

use super::{VolumeError, Volumes};
use crate::backend::{Backend, BackendError, Opener};
use crate::config::DeviceClass;
use crate::host::Host;
use crate::model::ClassName;
use crate::model::full_message;

/// One configured class: its backend once its storage has been found.
#[derive(Debug)]
pub(super) struct ClassSlot {
    backend: OnceLock<Backend>,
    /// For a class whose storage was missing: the class as configured (to open it
    /// later) and why it is not served, as of the last look.
    missing: Option<(DeviceClass, Mutex<String>)>,
}

impl ClassSlot {
    pub(super) fn open(backend: Backend) -> Self {
        Self {
            backend: OnceLock::from(backend),
            missing: None,
        }
    }

    pub(super) fn missing(class: DeviceClass, reason: String) -> Self {
        Self {
            backend: OnceLock::new(),
            missing: Some((class, Mutex::new(reason))),
        }
    }

    pub(super) fn backend(&self) -> Option<&Backend> {
        self.backend.get()
    }

    /// Why the class is not served, while it is not.
    pub(super) fn missing_reason(&self) -> Option<String> {
        match (&self.missing, self.backend.get()) {
            (Some((_, reason)), None) => Some(reason.lock().unwrap_or_else(|p| p.into_inner()).clone()),
            _ => None,
        }
    }
}

/// A class whose storage is not on this node, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingClass {
    pub class: ClassName,
    pub reason: String,
}

/// Why the device classes could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("preparing device class {class}")]
    Class {
        class: ClassName,
        #[source]
        source: BackendError,
    },
    #[error("no default device class")]
    NoDefault,
}

impl Volumes {
    /// One backend per device class. Opening a class checks that its storage is there
    /// (the volume group, the region) and makes the loop directory if missing; it changes
    /// no volume, so `localvol status` uses it too beside a running daemon.
    pub async fn open(
        classes: &[DeviceClass],
        data_dir: &Path,
        node_id: &str,
        host: Host,
    ) -> Result<Self, OpenError> {
        let mut opener = Opener::new(host.clone(), data_dir.to_path_buf());
        let mut backends = Vec::new();
        let mut missing = Vec::new();
        let mut default_fs = BTreeMap::new();
        let mut mount_options = BTreeMap::new();
        let mut pbkdf = BTreeMap::new();
        for class in classes {
            if let Some(fs) = class.fs_type {
                default_fs.insert(class.name.clone(), fs);
            }
            mount_options.insert(class.name.clone(), class.mount_options.clone());
            pbkdf.insert(class.name.clone(), class.luks);
            match opener.open(class).await {
                Ok(backend) => backends.push(backend),
                // One configuration serves nodes with different storage: serve the rest.
                Err(e) if e.is_storage_missing() => {
                    warn!(
                        device_class = %class.name,
                        reason = %full_message(&e),
                        "device class not served on this node: its storage is missing (looked for again on every stats refresh)"
                    );
                    missing.push((class.clone(), e));
                }
                Err(source) => {
                    return Err(OpenError::Class {
                        class: class.name.clone(),
                        source,
                    });
                }
            }
        }
        let default_class = classes
            .iter()
            .find(|c| c.default)
            .ok_or(OpenError::NoDefault)?
            .name
            .clone();
        let mut volumes = Volumes::new(backends, default_class, default_fs, host, node_id.to_string());
        volumes.set_class_mount_options(mount_options);
        volumes.set_class_pbkdf(pbkdf);
        volumes.add_missing_classes(missing, opener);
        Ok(volumes)
    }

    /// Adds classes whose storage was missing at start-up, and how to open them when it
    /// appears.
    fn add_missing_classes(&mut self, missing: Vec<(DeviceClass, BackendError)>, opener: Opener) {
        for (class, error) in missing {
            let name = class.name.clone();
            self.backends
                .insert(name, ClassSlot::missing(class, full_message(&error)));
        }
        self.opener = tokio::sync::Mutex::new(Some(opener));
    }

    /// The configured classes that are not served, with the reason.
    pub fn missing_classes(&self) -> Vec<MissingClass> {
        self.backends
            .iter()
            .filter_map(|(class, slot)| {
                slot.missing_reason().map(|reason| MissingClass {
                    class: class.clone(),
                    reason,
                })
            })
            .collect()
    }

    /// Looks again for the storage of every missing class; returns the classes opened now.
    pub async fn open_missing(&self) -> Vec<ClassName> {
        let mut opener = self.opener.lock().await;
        let Some(opener) = opener.as_mut() else {
            return Vec::new();
        };
        let mut opened = Vec::new();
        for (name, slot) in &self.backends {
            let Some((class, reason)) = slot.missing.as_ref().filter(|_| slot.backend().is_none()) else {
                continue;
            };
            match opener.open(class).await {
                Ok(backend) => {
                    info!(device_class = %name, "the device class's storage appeared: serving it");
                    let _ = slot.backend.set(backend);
                    opened.push(name.clone());
                }
                Err(e) => {
                    let now = full_message(&e);
                    let mut last = reason.lock().unwrap_or_else(|p| p.into_inner());
                    if *last != now {
                        warn!(device_class = %name, reason = %now, "device class still not served");
                        *last = now;
                    }
                }
            }
        }
        opened
    }

    /// The backend of a class that can take new volumes.
    pub(super) fn served_backend(&self, class: &ClassName) -> Result<&Backend, VolumeError> {
        let slot = self
            .backends
            .get(class)
            .ok_or_else(|| VolumeError::UnknownClass(class.clone()))?;
        slot.backend().ok_or_else(|| VolumeError::StorageMissing {
            class: class.clone(),
            reason: slot.missing_reason().unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests;
