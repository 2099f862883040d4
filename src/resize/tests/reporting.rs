//! The node-side resize reports (`--report-resize-status`) against the scripted mock API
//! server of the parent module.

use super::*;

#[tokio::test]
async fn success_reports_in_progress_then_the_new_capacity() {
    let fs_pending = json!([{"type": "FileSystemResizePending", "status": "True"}]);
    let (client, server) = MockApi::scripted(vec![
        step(
            Method::GET,
            PVC_PATH,
            200,
            pvc("41", "2Gi", "1Gi", Some("NodeResizePending"), fs_pending.clone()),
        ),
        step(
            Method::PATCH,
            STATUS_PATH,
            200,
            pvc("42", "2Gi", "1Gi", Some("NodeResizeInProgress"), fs_pending),
        )
        .body(in_progress_patch("41")),
        event("Normal", "NodeExpansionStarted"),
        patch_claim("43", "2Gi", "2Gi", None).body(json!({
            "metadata": {"resourceVersion": "42"},
            "status": {
                "allocatedResourceStatuses": {"storage": null},
                "capacity": {"storage": "2Gi"},
                "conditions": [{"$patch": "delete", "type": "FileSystemResizePending"}],
            },
        })),
        event("Normal", "NodeExpansionSucceeded"),
    ]);
    report_one((client, server), FailureValue::Auto, GI2, Ok::<_, Error>(GI2)).await;
}

#[tokio::test]
async fn terminal_failure_sets_the_failure_value_and_condition() {
    for (minor, value) in [
        ("30", "NodeResizeFailed"),
        ("31", "NodeResizeInfeasible"),
        ("32", "NodeResizeInfeasible"),
    ] {
        let (client, server) = MockApi::scripted(vec![
            get_claim("41", "4Gi", "1Gi", Some("NodeResizePending")),
            patch_claim("42", "4Gi", "1Gi", Some("NodeResizeInProgress")).body(in_progress_patch("41")),
            event("Normal", "NodeExpansionStarted"),
            version(minor),
            patch_claim("43", "4Gi", "1Gi", Some(value)).check(move |body| {
                let mut body = body.clone();
                normalise_times(&mut body);
                let message = body["status"]["conditions"][0]["message"]
                    .as_str()
                    .unwrap()
                    .to_string();
                assert!(
                    message.contains("has 1073741824 bytes free, 4294967296 requested"),
                    "{message}"
                );
                assert_eq!(
                    body,
                    json!({
                        "metadata": {"resourceVersion": "42"},
                        "status": {
                            "allocatedResourceStatuses": {"storage": value},
                            "conditions": [{
                                "type": "NodeResizeError", "status": "True",
                                "lastTransitionTime": TIME, "message": message,
                            }],
                        },
                    })
                );
            }),
            event("Warning", "NodeExpansionFailed"),
        ]);
        report_one((client, server), FailureValue::Auto, 4 << 30, Err(no_space())).await;
    }
}

#[tokio::test]
async fn a_forced_failure_value_does_not_ask_the_server() {
    for (forced, value) in [
        (FailureValue::NodeResizeFailed, "NodeResizeFailed"),
        (FailureValue::NodeResizeInfeasible, "NodeResizeInfeasible"),
    ] {
        let (client, server) = MockApi::scripted(vec![
            get_claim("41", "4Gi", "1Gi", Some("NodeResizeInProgress")),
            // Already in progress: nothing to write at the start.
            event("Normal", "NodeExpansionStarted"),
            patch_claim("42", "4Gi", "1Gi", Some(value))
                .check(move |body| assert_eq!(body["status"]["allocatedResourceStatuses"]["storage"], value)),
            event("Warning", "NodeExpansionFailed"),
        ]);
        report_one((client, server), forced, 4 << 30, Err(no_space())).await;
    }
}

#[tokio::test]
async fn transient_failure_writes_no_status_then_success_does() {
    let busy: Error = LockError::Busy {
        volume: "v".into(),
        operation: "NodeExpandVolume",
    }
    .into();
    let timed_out: Error = VolumeError::Backend(BackendError::Command(CommandError::TimedOut {
        program: "lvextend",
        args: String::new(),
        timeout: Duration::from_secs(120),
    }))
    .into();
    let (client, server) = MockApi::scripted(vec![
        // First try: times out.
        get_claim("41", "2Gi", "1Gi", Some("NodeResizePending")),
        patch_claim("42", "2Gi", "1Gi", Some("NodeResizeInProgress")).body(in_progress_patch("41")),
        event("Normal", "NodeExpansionStarted"),
        event("Warning", "NodeExpansionRetrying"),
        // Second try: the volume is busy.
        get_claim("42", "2Gi", "1Gi", Some("NodeResizeInProgress")),
        event_again("NodeExpansionStarted"),
        event_again("NodeExpansionRetrying"),
        // Third try: done.
        get_claim("42", "2Gi", "1Gi", Some("NodeResizeInProgress")),
        step(
            Method::PATCH,
            EVENTS_SERIES_PATH,
            200,
            json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "data.1"}, "eventTime": "2025-01-01T00:00:00.000000Z"}),
        ),
        patch_claim("43", "2Gi", "2Gi", None).body(json!({
            "metadata": {"resourceVersion": "42"},
            "status": {"allocatedResourceStatuses": {"storage": null}, "capacity": {"storage": "2Gi"}},
        })),
        event("Normal", "NodeExpansionSucceeded"),
    ]);
    let reporter = reporter(client, FailureValue::Auto);
    let report = reporter.started(&claim(), GI2).await;
    reporter.finished(report, &Err(timed_out)).await;
    let report = reporter.started(&claim(), GI2).await;
    reporter.finished(report, &Err(busy)).await;
    let report = reporter.started(&claim(), GI2).await;
    reporter.finished(report, &Ok::<_, Error>(GI2)).await;
    drop(reporter);
    server.finish().await;
}

#[tokio::test]
async fn a_claim_changed_meanwhile_is_read_again_and_patched_at_its_new_version() {
    let (client, server) = MockApi::scripted(vec![
        get_claim("41", "2Gi", "1Gi", Some("NodeResizePending")),
        step(Method::PATCH, STATUS_PATH, 409, conflict()).body(in_progress_patch("41")),
        get_claim("44", "2Gi", "1Gi", Some("NodeResizePending")),
        patch_claim("45", "2Gi", "1Gi", Some("NodeResizeInProgress")).body(in_progress_patch("44")),
        event("Normal", "NodeExpansionStarted"),
        step(Method::PATCH, STATUS_PATH, 409, conflict())
            .check(|b| assert_eq!(b["metadata"]["resourceVersion"], "45")),
        // Someone else finished meanwhile: nothing left to write.
        get_claim("46", "2Gi", "2Gi", None),
        event("Normal", "NodeExpansionSucceeded"),
    ]);
    report_one((client, server), FailureValue::Auto, GI2, Ok::<_, Error>(GI2)).await;
}

#[tokio::test]
async fn conflicts_are_retried_a_bounded_number_of_times() {
    let mut script = vec![get_claim("41", "2Gi", "1Gi", Some("NodeResizePending"))];
    for rv in ["41", "50", "51"] {
        script.push(step(Method::PATCH, STATUS_PATH, 409, conflict()).body(in_progress_patch(rv)));
        if rv != "51" {
            let next = if rv == "41" { "50" } else { "51" };
            script.push(get_claim(next, "2Gi", "1Gi", Some("NodeResizePending")));
        }
    }
    let (client, server) = MockApi::scripted(script);
    let status = crate::resize::claim_status::ClaimStatus::new(ResizeApi::new(client), FailureValue::Auto);
    let pvc = status.get(NS, PVC).await.unwrap();
    let err = status
        .apply(pvc, &crate::resize::claim_status::Transition::NodeInProgress)
        .await
        .unwrap_err();
    assert!(
        matches!(err, crate::resize::claim_status::StatusError::Conflict { .. }),
        "{err}"
    );
    drop(status);
    server.finish().await;
}

#[tokio::test]
async fn a_repeated_call_at_the_same_size_writes_nothing() {
    let (client, server) = MockApi::scripted(vec![get_claim("41", "2Gi", "2Gi", None)]);
    report_one((client, server), FailureValue::Auto, GI2, Ok::<_, Error>(GI2)).await;
}

#[tokio::test]
async fn a_claim_bound_to_another_volume_is_left_alone() {
    let mut other = pvc("41", "2Gi", "1Gi", Some("NodeResizePending"), json!([]));
    other["spec"]["volumeName"] = json!("pvc-other");
    let (client, server) = MockApi::scripted(vec![step(Method::GET, PVC_PATH, 200, other)]);
    report_one((client, server), FailureValue::Auto, GI2, Err(no_space())).await;
}
