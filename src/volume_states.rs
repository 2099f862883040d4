//! What the daemon remembers about each volume for `localvol status`: the claim and
//! the pods it is published for, its last reclaim, its last resize; and whether its
//! last condition was abnormal, so that a change is told once, not at every poll.
//!
//! Memory only: a restart forgets it all (the answer says since when the daemon
//! knows), because none of it decides anything; the backends' records and the mount
//! table stay the truth. An entry appears when a volume is published, reclaimed,
//! resized or has its condition checked, and goes when the volume is deleted.
//!
//! Lock-light: one mutex around a map, held only to update or copy entries, never
//! across an await, so recording never makes a CSI call wait on I/O. Nothing here can
//! fail, so the module has no error type.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use crate::model::VolumeId;

/// A namespaced Kubernetes object (claim or pod).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectName {
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReclaimResult {
    Trimmed {
        reclaimed_bytes: u64,
        trimmed_bytes: u64,
    },
    /// Left alone on purpose (a raw block volume, an encrypted one without discards).
    NotDiscarded,
    Failed {
        error: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastReclaim {
    pub finished: SystemTime,
    pub result: ReclaimResult,
}

/// Which CSI call a resize state comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResizeStep {
    /// ControllerExpandVolume: the backing store grows.
    Controller,
    /// NodeExpandVolume: the device view and the filesystem grow.
    Node,
}

impl ResizeStep {
    pub fn as_str(self) -> &'static str {
        match self {
            ResizeStep::Controller => "controller",
            ResizeStep::Node => "node",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResizeState {
    InProgress {
        target_bytes: u64,
    },
    /// The backing store grew; the filesystem waits for NodeExpandVolume.
    NodeExpansionPending {
        size_bytes: u64,
    },
    Done {
        size_bytes: u64,
    },
    Failed {
        target_bytes: u64,
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastResize {
    pub updated: SystemTime,
    pub step: ResizeStep,
    pub state: ResizeState,
}

/// Everything remembered about one volume.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeState {
    /// The claim the publish request's volume context names.
    pub claim: Option<ObjectName>,
    /// Publish target path → the pod it is for (`None`: kubelet sent no pod
    /// information, podInfoOnMount off).
    pub publications: BTreeMap<PathBuf, Option<ObjectName>>,
    pub last_reclaim: Option<LastReclaim>,
    pub resize: Option<LastResize>,
    /// Whether the last condition NodeGetVolumeStats found was abnormal (`None`: never
    /// checked since the daemon started).
    pub abnormal: Option<bool>,
}

/// A change of a volume's condition, told once (an event on its claim).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConditionChange {
    /// Abnormal now, with why; healthy or never checked before.
    Abnormal(String),
    /// Healthy again after an abnormal condition.
    Healthy,
}

/// The registry, shared by the CSI services and the reclaim runner (clones share it).
#[derive(Debug, Clone)]
pub struct VolumeStates {
    started: SystemTime,
    volumes: Arc<Mutex<BTreeMap<VolumeId, VolumeState>>>,
}

impl Default for VolumeStates {
    fn default() -> Self {
        Self::new()
    }
}

impl VolumeStates {
    pub fn new() -> Self {
        Self {
            started: SystemTime::now(),
            volumes: Arc::default(),
        }
    }

    /// Since when the registry knows anything.
    pub fn started(&self) -> SystemTime {
        self.started
    }

    fn map(&self) -> MutexGuard<'_, BTreeMap<VolumeId, VolumeState>> {
        // Every update is a plain assignment: a panic elsewhere cannot leave an entry
        // half-written, so a poisoned lock still holds usable data.
        self.volumes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, id: &VolumeId, change: impl FnOnce(&mut VolumeState)) {
        change(self.map().entry(id.clone()).or_default());
    }

    /// A successful NodePublishVolume at `target`. A claim already known is kept when
    /// this request names none.
    pub fn published(
        &self,
        id: &VolumeId,
        target: &Path,
        claim: Option<ObjectName>,
        pod: Option<ObjectName>,
    ) {
        self.update(id, |state| {
            if claim.is_some() {
                state.claim = claim;
            }
            state.publications.insert(target.to_path_buf(), pod);
        });
    }

    /// A successful NodeUnpublishVolume of `target`.
    pub fn unpublished(&self, id: &VolumeId, target: &Path) {
        if let Some(state) = self.map().get_mut(id) {
            state.publications.remove(target);
        }
    }

    /// The volume was deleted: a new volume of the same name starts with nothing.
    pub fn forget(&self, id: &VolumeId) {
        self.map().remove(id);
    }

    pub fn reclaimed(&self, id: &VolumeId, result: ReclaimResult) {
        let finished = SystemTime::now();
        self.update(id, |state| {
            state.last_reclaim = Some(LastReclaim { finished, result })
        });
    }

    pub fn resized(&self, id: &VolumeId, step: ResizeStep, resize: ResizeState) {
        let updated = SystemTime::now();
        self.update(id, |state| {
            state.resize = Some(LastResize {
                updated,
                step,
                state: resize,
            });
        });
    }

    /// Records the condition NodeGetVolumeStats found (`abnormal`, `message`) and
    /// returns the change to tell: abnormal after healthy or after nothing (a restart
    /// tells a volume that is still abnormal again), healthy after abnormal. A first
    /// healthy condition is no news, and an abnormal one whose message changes (a
    /// pool's fill growing) is the same news.
    pub fn condition_checked(&self, id: &VolumeId, abnormal: bool, message: &str) -> Option<ConditionChange> {
        let mut map = self.map();
        let state = map.entry(id.clone()).or_default();
        let before = state.abnormal.replace(abnormal);
        match (before, abnormal) {
            (None | Some(false), true) => Some(ConditionChange::Abnormal(message.to_string())),
            (Some(true), false) => Some(ConditionChange::Healthy),
            (None | Some(false), false) | (Some(true), true) => None,
        }
    }

    /// A copy of every entry, ordered by volume id.
    pub fn snapshot(&self) -> Vec<(VolumeId, VolumeState)> {
        self.map().iter().map(|(id, s)| (id.clone(), s.clone())).collect()
    }

    pub fn get(&self, id: &VolumeId) -> Option<VolumeState> {
        self.map().get(id).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ClassName, Token};

    fn id(name: &str) -> VolumeId {
        VolumeId::new(ClassName::parse("fast").unwrap(), Token::for_name(name))
    }

    fn object(namespace: &str, name: &str) -> Option<ObjectName> {
        Some(ObjectName {
            namespace: namespace.into(),
            name: name.into(),
        })
    }

    #[test]
    fn publications_follow_publish_and_unpublish() {
        let states = VolumeStates::new();
        let (a, b) = (Path::new("/k/pods/a/mount"), Path::new("/k/pods/b/mount"));
        states.published(&id("pvc-1"), a, object("apps", "data"), object("apps", "web-0"));
        // A second pod on the same node; its context names no claim: the claim stays.
        states.published(&id("pvc-1"), b, None, None);
        let state = states.get(&id("pvc-1")).unwrap();
        assert_eq!(state.claim, object("apps", "data"));
        assert_eq!(
            state.publications.into_iter().collect::<Vec<_>>(),
            [
                (a.to_path_buf(), object("apps", "web-0")),
                (b.to_path_buf(), None)
            ]
        );
        states.unpublished(&id("pvc-1"), a);
        states.unpublished(&id("pvc-1"), Path::new("/never/published"));
        // Unpublishing a volume never seen creates no entry.
        states.unpublished(&id("pvc-2"), a);
        let all = states.snapshot();
        assert_eq!(all.len(), 1);
        assert_eq!(
            all[0].1.publications.keys().collect::<Vec<_>>(),
            [&b.to_path_buf()]
        );
        assert_eq!(all[0].1.claim, object("apps", "data"), "kept after unpublish");
    }

    #[test]
    fn reclaim_and_resize_keep_the_last_result_until_deletion() {
        let states = VolumeStates::new();
        let vol = id("pvc-1");
        states.reclaimed(&vol, ReclaimResult::Failed { error: "boom".into() });
        states.reclaimed(
            &vol,
            ReclaimResult::Trimmed {
                reclaimed_bytes: 4096,
                trimmed_bytes: 8192,
            },
        );
        states.resized(
            &vol,
            ResizeStep::Node,
            ResizeState::InProgress {
                target_bytes: 2 << 30,
            },
        );
        states.resized(
            &vol,
            ResizeStep::Node,
            ResizeState::Failed {
                target_bytes: 2 << 30,
                reason: "no space".into(),
            },
        );
        let state = states.get(&vol).unwrap();
        let reclaim = state.last_reclaim.unwrap();
        assert_eq!(
            reclaim.result,
            ReclaimResult::Trimmed {
                reclaimed_bytes: 4096,
                trimmed_bytes: 8192
            }
        );
        assert!(states.started() <= reclaim.finished && reclaim.finished <= SystemTime::now());
        let resize = state.resize.unwrap();
        assert_eq!(resize.step, ResizeStep::Node);
        assert_eq!(
            resize.state,
            ResizeState::Failed {
                target_bytes: 2 << 30,
                reason: "no space".into()
            }
        );
        states.forget(&vol);
        assert_eq!(states.get(&vol), None);
        assert!(states.snapshot().is_empty());
    }

    #[test]
    fn a_change_of_condition_is_told_once() {
        let states = VolumeStates::new();
        let vol = id("pvc-1");
        let full = "thin pool vg1/pool is out of data space";
        assert_eq!(states.condition_checked(&vol, false, "healthy"), None, "no news");
        assert_eq!(states.condition_checked(&vol, false, "healthy"), None);
        assert_eq!(
            states.condition_checked(&vol, true, full),
            Some(ConditionChange::Abnormal(full.into()))
        );
        assert_eq!(
            states.condition_checked(&vol, true, "another message"),
            None,
            "the same news"
        );
        assert_eq!(
            states.condition_checked(&vol, false, "healthy"),
            Some(ConditionChange::Healthy)
        );
        assert_eq!(states.condition_checked(&vol, false, "healthy"), None);
        // Abnormal at its first check (after a restart): told.
        let other = id("pvc-2");
        assert_eq!(
            states.condition_checked(&other, true, full),
            Some(ConditionChange::Abnormal(full.into()))
        );
        // Deleted: a new volume of the same name starts with nothing.
        states.forget(&other);
        assert_eq!(states.condition_checked(&other, false, "healthy"), None);
    }

    #[test]
    fn clones_share_one_registry() {
        let states = VolumeStates::new();
        let clone = states.clone();
        clone.resized(
            &id("pvc-1"),
            ResizeStep::Controller,
            ResizeState::Done { size_bytes: 1 },
        );
        assert!(states.get(&id("pvc-1")).is_some());
        assert_eq!(states.started(), clone.started());
    }
}
