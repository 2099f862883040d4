//! Test fixtures: Kubernetes objects built with k8s-openapi types, their paths, the
//! owner check's expected events for the mock API server (`super::mock_api`), and
//! owner checks over a given pod cache.

use std::time::Duration;

use http::{Method, StatusCode};
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, Container, EphemeralVolumeSource, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimTemplate,
    PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, Pod, PodSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Client;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use serde_json::{Value, json};

use super::Checker;
use super::mock_api::{Exchange, Reply};
use super::reflect::Synced;

pub const NODE: &str = "node-a";
pub const NS: &str = "apps";

/// How a pod names a claim in one of its volumes.
pub enum Uses<'a> {
    /// A generic ephemeral volume with this volume name: the claim is `<pod>-<name>`.
    Ephemeral(&'a str),
    /// A `persistentVolumeClaim` volume naming this claim.
    Claim(&'a str),
}

pub fn pod(name: &str, uid: &str, node: &str, uses: &[Uses<'_>]) -> Pod {
    let volumes = uses
        .iter()
        .map(|u| match u {
            Uses::Ephemeral(volume) => Volume {
                name: volume.to_string(),
                ephemeral: Some(EphemeralVolumeSource {
                    volume_claim_template: Some(PersistentVolumeClaimTemplate {
                        metadata: None,
                        spec: PersistentVolumeClaimSpec {
                            storage_class_name: Some("localvol".to_string()),
                            ..PersistentVolumeClaimSpec::default()
                        },
                    }),
                }),
                ..Volume::default()
            },
            Uses::Claim(claim) => Volume {
                name: "data".to_string(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.to_string(),
                    read_only: None,
                }),
                ..Volume::default()
            },
        })
        .collect();
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(NS.to_string()),
            uid: Some(uid.to_string()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.to_string()),
            containers: vec![Container {
                name: "app".to_string(),
                image: Some("busybox".to_string()),
                ..Container::default()
            }],
            volumes: Some(volumes),
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// A controller owner reference as the ephemeral volume controller sets it.
pub fn controller(kind: &str, api_version: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        name: name.to_string(),
        uid: uid.to_string(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

pub fn pod_owner(name: &str, uid: &str) -> OwnerReference {
    controller("Pod", "v1", name, uid)
}

pub fn pvc(
    name: &str,
    uid: &str,
    owner: Option<OwnerReference>,
    volume_name: Option<&str>,
) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(NS.to_string()),
            uid: Some(uid.to_string()),
            owner_references: owner.map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            volume_name: volume_name.map(str::to_string),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

pub fn pv(name: &str, driver: &str, handle: &str, claim: Option<(&str, &str)>) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: driver.to_string(),
                volume_handle: handle.to_string(),
                ..CSIPersistentVolumeSource::default()
            }),
            claim_ref: claim.map(|(name, uid)| ObjectReference {
                kind: Some("PersistentVolumeClaim".to_string()),
                namespace: Some(NS.to_string()),
                name: Some(name.to_string()),
                uid: Some(uid.to_string()),
                ..ObjectReference::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}

pub fn pvc_uri(name: &str) -> String {
    format!("/api/v1/namespaces/{NS}/persistentvolumeclaims/{name}")
}

pub fn pod_uri(name: &str) -> String {
    format!("/api/v1/namespaces/{NS}/pods/{name}")
}

pub fn pv_uri(name: &str) -> String {
    format!("/api/v1/persistentvolumes/{name}")
}

/// An events.k8s.io event created about `kind` `name`, with `note_has` in its note.
pub fn event(kind: &'static str, name: &'static str, note_has: Vec<&'static str>) -> Exchange {
    event_for("ClaimOwnerMismatch", kind, name, note_has)
}

/// A Warning event with `reason` about the object `kind`/`name` in NS.
pub fn event_for(
    reason: &'static str,
    kind: &'static str,
    name: &'static str,
    note_has: Vec<&str>,
) -> Exchange {
    event_of("Warning", reason, kind, name, note_has)
}

/// As [`event_for`], of event type `type_` (`Warning` or `Normal`).
pub fn event_of(
    type_: &'static str,
    reason: &'static str,
    kind: &'static str,
    name: &'static str,
    note_has: Vec<&str>,
) -> Exchange {
    let note_has: Vec<String> = note_has.into_iter().map(str::to_string).collect();
    Exchange::new(
        Method::POST,
        format!("/apis/events.k8s.io/v1/namespaces/{NS}/events?"),
        Reply::Json(StatusCode::CREATED, json!({})),
    )
    .check(move |body: &Value| {
        assert_eq!(body["regarding"]["kind"], kind, "{body}");
        assert_eq!(body["regarding"]["name"], name, "{body}");
        assert_eq!(body["type"], type_, "{body}");
        assert_eq!(body["reason"], reason, "{body}");
        assert_eq!(body["reportingController"], "localvol.csi.dev", "{body}");
        let note = body["note"].as_str().unwrap_or_default();
        for part in &note_has {
            assert!(note.contains(part), "note {note:?} lacks {part:?}");
        }
    })
}

/// A pod cache holding `pods`, synced (or not).
pub fn pod_cache(pods: Vec<Pod>, synced: bool) -> (Store<Pod>, Synced) {
    let (reader, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    for pod in pods {
        writer.apply_watcher_event(&watcher::Event::InitApply(pod));
    }
    let flag = Synced::default();
    if synced {
        writer.apply_watcher_event(&watcher::Event::InitDone);
        flag.listed();
    }
    (reader, flag)
}

/// A check on node [`NODE`] over `client`, its pod cache holding `pods`.
pub fn checker(client: Client, pods: Vec<Pod>, synced: bool) -> Checker {
    let (store, flag) = pod_cache(pods, synced);
    Checker::with_timings(
        client,
        store,
        flag,
        NODE.to_string(),
        Duration::from_secs(60),
        Duration::from_secs(2),
    )
}
