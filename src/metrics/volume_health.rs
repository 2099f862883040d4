//! `localvol_volume_health`: each checked volume's last condition, one-hot over
//! healthy and abnormal, labelled with the claim it was made for so that an alert
//! names what to look at.
//!
//! Set by each NodeGetVolumeStats (kubelet asks every minute for each published
//! volume), so it costs nothing kubelet did not already ask for. A volume's claim never
//! changes, but its series must go when the volume does: the labels each volume was
//! given are kept here for that.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus::{IntGaugeVec, Registry};

use crate::model::{ClaimRef, VolumeId};

/// The two statuses, in the order the series are written.
pub const STATUSES: [&str; 2] = ["healthy", "abnormal"];

/// A volume's label values before `status`, and whether it is abnormal.
type Known = HashMap<String, ([String; 4], bool)>;

#[derive(Clone)]
pub(super) struct VolumeHealthGauges {
    gauges: IntGaugeVec,
    /// Volume id → the label values before `status` its series carry, and whether it
    /// is abnormal.
    labels: Arc<Mutex<Known>>,
}

impl VolumeHealthGauges {
    pub(super) fn new(registry: &Registry) -> Self {
        Self {
            gauges: super::int_gauges(
                registry,
                "volume_health",
                "1 for the condition NodeGetVolumeStats last found a volume in (healthy, or \
                 abnormal: its storage, mapping or filesystem failed; the claim's events say \
                 why), 0 for the other; namespace and persistentvolumeclaim are the claim it \
                 was made for, empty when unknown",
                &[
                    "device_class",
                    "volume_id",
                    "namespace",
                    "persistentvolumeclaim",
                    "status",
                ],
            ),
            labels: Arc::default(),
        }
    }

    pub(super) fn set(&self, id: &VolumeId, claim: &ClaimRef, abnormal: bool) {
        let key = id.to_string();
        let labels = [
            id.class.to_string(),
            key.clone(),
            claim.pvc_namespace.clone().unwrap_or_default(),
            claim.pvc_name.clone().unwrap_or_default(),
        ];
        let mut known = self.labels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((old, _)) = known.get(&key).filter(|(old, _)| *old != labels) {
            self.remove(old);
        }
        for status in STATUSES {
            let [class, volume, namespace, claim] = &labels;
            self.gauges
                .with_label_values(&[class, volume, namespace, claim, status])
                .set(i64::from((status == "abnormal") == abnormal));
        }
        known.insert(key, (labels, abnormal));
    }

    /// The volumes last found abnormal, as `(volume id, claim namespace, claim name)`,
    /// ordered by id.
    pub(super) fn abnormal(&self) -> Vec<(String, String, String)> {
        let known = self.labels.lock().unwrap_or_else(PoisonError::into_inner);
        let mut abnormal: Vec<_> = known
            .values()
            .filter(|(_, abnormal)| *abnormal)
            .map(|([_, id, namespace, claim], _)| (id.clone(), namespace.clone(), claim.clone()))
            .collect();
        abnormal.sort();
        abnormal
    }

    /// The volume is gone: so are its series.
    pub(super) fn forget(&self, id: &VolumeId) {
        let mut known = self.labels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((labels, _)) = known.remove(&id.to_string()) {
            self.remove(&labels);
        }
    }

    fn remove(&self, [class, volume, namespace, claim]: &[String; 4]) {
        for status in STATUSES {
            let _ = self
                .gauges
                .remove_label_values(&[class, volume, namespace, claim, status]);
        }
    }
}
