use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimCondition, PersistentVolumeClaimStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::{Value, json};

use super::*;
use crate::k8s::claim_resize::STORAGE;

/// The patch for `transition`: what it wants, as `claim_resize` writes it.
fn plan(pvc: &Claim, transition: &Transition, names: FailureNames, now: &Time) -> Option<Value> {
    claim_resize::plan(pvc, &wanted(transition, names), now)
}

/// The patch planned for `transition` with the names of Kubernetes 1.31 and later.
fn planned(pvc: &Claim, transition: &Transition) -> Option<Value> {
    plan(pvc, transition, FailureNames::Infeasible, &now())
}

fn now() -> Time {
    Time("2025-01-02T03:04:05Z".parse().unwrap())
}

fn earlier() -> Time {
    Time("2024-12-31T00:00:00Z".parse().unwrap())
}

fn condition(kind: &str, message: Option<&str>) -> PersistentVolumeClaimCondition {
    PersistentVolumeClaimCondition {
        type_: kind.to_string(),
        status: "True".to_string(),
        message: message.map(str::to_string),
        last_transition_time: Some(earlier()),
        ..PersistentVolumeClaimCondition::default()
    }
}

fn claim(value: Option<&str>, capacity: &str, conditions: Vec<PersistentVolumeClaimCondition>) -> Claim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            namespace: Some("apps".into()),
            resource_version: Some("41".into()),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(PersistentVolumeClaimStatus {
            capacity: Some(BTreeMap::from([(STORAGE.to_string(), Quantity(capacity.into()))])),
            allocated_resource_statuses: value
                .map(|v| BTreeMap::from([(STORAGE.to_string(), v.to_string())])),
            conditions: Some(conditions),
            ..PersistentVolumeClaimStatus::default()
        }),
    }
    .into()
}

#[test]
fn node_in_progress_then_finished() {
    let pvc = claim(None, "1Gi", vec![condition("Bound-ish", None)]);
    assert_eq!(
        planned(&pvc, &Transition::NodeInProgress),
        Some(json!({
            "metadata": {"resourceVersion": "41"},
            "status": {"allocatedResourceStatuses": {"storage": "NodeResizeInProgress"}}
        }))
    );
    let pvc = claim(
        Some(NODE_RESIZE_IN_PROGRESS),
        "1Gi",
        vec![
            condition(FILE_SYSTEM_RESIZE_PENDING, Some("x")),
            condition("Other", None),
        ],
    );
    assert_eq!(
        planned(
            &pvc,
            &Transition::Finished {
                capacity: "2Gi".into()
            }
        ),
        Some(json!({
            "metadata": {"resourceVersion": "41"},
            "status": {
                "allocatedResourceStatuses": {"storage": null},
                "capacity": {"storage": "2Gi"},
                "conditions": [{"$patch": "delete", "type": "FileSystemResizePending"}]
            }
        }))
    );
}

#[test]
fn a_claim_that_already_shows_the_step_gets_no_patch() {
    let pvc = claim(Some(NODE_RESIZE_IN_PROGRESS), "1Gi", vec![]);
    assert_eq!(planned(&pvc, &Transition::NodeInProgress), None);
    let pvc = claim(None, "2Gi", vec![condition("Other", None)]);
    let done = Transition::Finished {
        capacity: "2Gi".into(),
    };
    assert_eq!(planned(&pvc, &done), None);
    let failed = Transition::NodeFailed {
        message: "full".into(),
    };
    let pvc = claim(
        Some(NODE_RESIZE_INFEASIBLE),
        "1Gi",
        vec![condition(NODE_RESIZE_ERROR, Some("full"))],
    );
    assert_eq!(planned(&pvc, &failed), None);
}

#[test]
fn failures_use_the_names_the_server_knows() {
    let pvc = claim(Some(NODE_RESIZE_IN_PROGRESS), "1Gi", vec![]);
    let failed = Transition::NodeFailed {
        message: "no space".into(),
    };
    for (names, value) in [
        (FailureNames::Failed, "NodeResizeFailed"),
        (FailureNames::Infeasible, "NodeResizeInfeasible"),
    ] {
        assert_eq!(
            plan(&pvc, &failed, names, &now()),
            Some(json!({
                "metadata": {"resourceVersion": "41"},
                "status": {
                    "allocatedResourceStatuses": {"storage": value},
                    "conditions": [{
                        "type": "NodeResizeError",
                        "status": "True",
                        "lastTransitionTime": "2025-01-02T03:04:05Z",
                        "message": "no space"
                    }]
                }
            }))
        );
    }
    // A condition that stays True keeps its transition time; its message follows.
    let pvc = claim(
        Some(NODE_RESIZE_INFEASIBLE),
        "1Gi",
        vec![condition(NODE_RESIZE_ERROR, Some("old"))],
    );
    assert_eq!(
        planned(&pvc, &failed).unwrap()["status"]["conditions"][0]["lastTransitionTime"],
        "2024-12-31T00:00:00Z"
    );
}

#[test]
fn controller_steps() {
    let pvc = claim(None, "1Gi", vec![condition(NODE_RESIZE_ERROR, Some("old"))]);
    assert_eq!(
        planned(&pvc, &Transition::ControllerInProgress { target: "2Gi".into() }),
        Some(json!({
            "metadata": {"resourceVersion": "41"},
            "status": {
                "allocatedResourceStatuses": {"storage": "ControllerResizeInProgress"},
                "allocatedResources": {"storage": "2Gi"},
                "conditions": [
                    {"type": "Resizing", "status": "True", "lastTransitionTime": "2025-01-02T03:04:05Z"},
                    {"$patch": "delete", "type": "NodeResizeError"}
                ]
            }
        }))
    );
    let pvc = claim(
        Some(CONTROLLER_RESIZE_IN_PROGRESS),
        "1Gi",
        vec![condition(RESIZING, None)],
    );
    assert_eq!(
        planned(&pvc, &Transition::NodePending),
        Some(json!({
            "metadata": {"resourceVersion": "41"},
            "status": {
                "allocatedResourceStatuses": {"storage": "NodeResizePending"},
                "conditions": [
                    {
                        "type": "FileSystemResizePending",
                        "status": "True",
                        "lastTransitionTime": "2025-01-02T03:04:05Z",
                        "message": FS_RESIZE_PENDING_MESSAGE
                    },
                    {"$patch": "delete", "type": "Resizing"}
                ]
            }
        }))
    );
    assert_eq!(
        plan(
            &pvc,
            &Transition::ControllerFailed {
                message: "VG full".into()
            },
            FailureNames::Failed,
            &now()
        )
        .unwrap()["status"]["allocatedResourceStatuses"]["storage"],
        "ControllerResizeFailed"
    );
}

#[test]
fn versions_choose_the_failure_names() {
    let cases = [
        ("1", "30", Some(FailureNames::Failed)),
        ("1", "29+", Some(FailureNames::Failed)),
        ("1", "31", Some(FailureNames::Infeasible)),
        ("1", "32", Some(FailureNames::Infeasible)),
        ("1", "34+", Some(FailureNames::Infeasible)),
        ("2", "0", Some(FailureNames::Infeasible)),
        ("", "", None),
    ];
    for (major, minor, expected) in cases {
        assert_eq!(
            FailureNames::for_version(major, minor),
            expected,
            "{major}.{minor}"
        );
    }
}
