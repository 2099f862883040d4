//! Finding the volume's claim: from the volume context, through the PV, not at all;
//! against the scripted mock API server of the parent module.

use super::*;

/// The read of PV `name`, a localvol volume bound to `claim` (name, uid) if any.
fn get_pv(name: &str, claim: Option<(&str, &str)>) -> Exchange {
    get(pv_uri(name), ok(&pv(name, "localvol.csi.dev", VOLUME, claim)))
}

#[tokio::test]
async fn a_volume_without_a_claim_is_not_checked() {
    let (client, server) = MockApi::scripted(vec![]);
    let checker = checker(client, vec![]);
    let ctx = VolumeContext {
        claim: ClaimRef::default(),
        pod: Some(PodInfo {
            name: "web-0".to_string(),
            namespace: NS.to_string(),
            uid: A.to_string(),
        }),
    };
    checker.stage(VOLUME, &ctx).await.unwrap();
    checker.publish(VOLUME, &ctx).await.unwrap();
    finish(checker, server).await;
}

#[tokio::test]
async fn the_claim_is_found_through_the_pv_when_the_context_lacks_it() {
    let claim = pvc("web-0-data", "pvc-1", Some(pod_owner("web-0", A)), Some("pv-1"));
    let (client, server) = MockApi::scripted(vec![
        get_pv("pv-1", Some(("web-0-data", "pvc-1"))),
        get(pvc_uri("web-0-data"), ok(&claim)),
    ]);
    let checker = checker(client, vec![ephemeral_pod(A, NODE)]);
    let ctx = VolumeContext {
        claim: ClaimRef {
            pv_name: Some("pv-1".to_string()),
            ..ClaimRef::default()
        },
        pod: None,
    };
    checker.stage(VOLUME, &ctx).await.unwrap();
    finish(checker, server).await;
}

#[tokio::test]
async fn a_pv_of_another_volume_or_unbound_finds_no_claim() {
    let (client, server) = MockApi::scripted(vec![
        get(
            pv_uri("pv-1"),
            ok(&pv(
                "pv-1",
                "other.csi.dev",
                VOLUME,
                Some(("web-0-data", "pvc-1")),
            )),
        ),
        get_pv("pv-2", None),
        get(pv_uri("pv-3"), not_found()),
    ]);
    let checker = checker(client, vec![]);
    for (pv, reason) in [
        ("pv-1", "is not this volume"),
        ("pv-2", "is not bound"),
        ("pv-3", "does not exist"),
    ] {
        let ctx = VolumeContext {
            claim: ClaimRef {
                pv_name: Some(pv.to_string()),
                ..ClaimRef::default()
            },
            pod: None,
        };
        let (code_, message) = code(checker.stage(VOLUME, &ctx).await);
        assert_eq!(code_, Code::FailedPrecondition, "{message}");
        assert!(message.contains(reason), "{pv}: {message}");
    }
    finish(checker, server).await;
}

#[tokio::test]
async fn a_context_naming_a_claim_bound_elsewhere_defers_to_the_pv() {
    // The volume context names web-0-data, but that claim is now bound to another PV;
    // the PV's claimRef names the claim actually behind this volume.
    let stale = pvc("web-0-data", "pvc-new", None, Some("pv-other"));
    let actual = pvc("web-1-data", "pvc-1", Some(pod_owner("web-1", A)), Some("pv-1"));
    let (client, server) = MockApi::scripted(vec![
        get(pvc_uri("web-0-data"), ok(&stale)),
        get_pv("pv-1", Some(("web-1-data", "pvc-1"))),
        get(pvc_uri("web-1-data"), ok(&actual)),
    ]);
    let checker = checker(client, vec![pod("web-1", A, NODE, &[Uses::Ephemeral("data")])]);
    let mut ctx = context("web-0-data", None);
    ctx.claim.pv_name = Some("pv-1".to_string());
    checker.stage(VOLUME, &ctx).await.unwrap();
    finish(checker, server).await;
}

#[tokio::test]
async fn publish_without_pod_info_is_refused_for_a_claim() {
    let claim = pvc("web-0-data", "pvc-1", None, None);
    let (client, server) = MockApi::scripted(vec![get(pvc_uri("web-0-data"), ok(&claim))]);
    let checker = checker(client, vec![]);
    let (code_, message) = code(checker.publish(VOLUME, &context("web-0-data", None)).await);
    assert_eq!(code_, Code::FailedPrecondition, "{message}");
    assert!(message.contains("podInfoOnMount"), "{message}");
    finish(checker, server).await;
}

#[tokio::test]
async fn a_missing_claim_is_refused() {
    let (client, server) = MockApi::scripted(vec![get(pvc_uri("web-0-data"), not_found())]);
    let checker = checker(client, vec![]);
    let (code_, message) = code(checker.stage(VOLUME, &context("web-0-data", None)).await);
    assert_eq!(code_, Code::FailedPrecondition, "{message}");
    assert!(message.contains("apps/web-0-data does not exist"), "{message}");
    finish(checker, server).await;
}

#[tokio::test]
async fn a_claim_replaced_within_the_ttl_is_read_again_before_it_is_not_found() {
    // web-0-data was deleted and made again (uid pvc-2) for a new volume pv-2 while the
    // old claim (uid pvc-1) is still cached: the cached one does not match pv-2's
    // claimRef, which is only said after reading everything again.
    let old = pvc("web-0-data", "pvc-1", None, Some("pv-1"));
    let new = pvc("web-0-data", "pvc-2", None, Some("pv-2"));
    let pv_2 = pv("pv-2", "localvol.csi.dev", VOLUME, Some(("web-0-data", "pvc-2")));
    let (client, server) = MockApi::scripted(vec![
        get_pv("pv-1", Some(("web-0-data", "pvc-1"))),
        get(pvc_uri("web-0-data"), ok(&old)),
        get(pv_uri("pv-2"), ok(&pv_2)),
        get(pv_uri("pv-2"), ok(&pv_2)),
        get(pvc_uri("web-0-data"), ok(&new)),
    ]);
    let checker = checker(client, vec![]);
    for pv in ["pv-1", "pv-2"] {
        let ctx = VolumeContext {
            claim: ClaimRef {
                pv_name: Some(pv.to_string()),
                ..ClaimRef::default()
            },
            pod: None,
        };
        checker.stage(VOLUME, &ctx).await.unwrap();
    }
    finish(checker, server).await;
}

#[tokio::test]
async fn a_context_naming_a_claim_made_again_and_unbound_defers_to_the_pv() {
    // Found against a real API server (tests/e2e_k8s.rs, case 4): pod web-0 (uid A) was
    // deleted and made again (uid B); the garbage collector deleted its claim, and the
    // ephemeral volume controller made a new web-0-data (pvc-2) for the new pod, not
    // bound yet. Staging pv-1, made for the old claim (pvc-1), finds the new claim by
    // the context's name: it is not bound to pv-1, so pv-1's claimRef decides, and the
    // claim it names is gone (another uid under that name). Before, the unbound claim
    // was taken for this volume's and the stage allowed for the new pod.
    let new = pvc("web-0-data", "pvc-2", Some(pod_owner("web-0", B)), None);
    let (client, server) = MockApi::scripted(vec![
        get(pvc_uri("web-0-data"), ok(&new)),
        get_pv("pv-1", Some(("web-0-data", "pvc-1"))),
        // The refusal rests on the cached claim: everything is read again first.
        get(pvc_uri("web-0-data"), ok(&new)),
        get_pv("pv-1", Some(("web-0-data", "pvc-1"))),
        get(pvc_uri("web-0-data"), ok(&new)),
    ]);
    let checker = checker(client, vec![ephemeral_pod(B, NODE)]);
    let mut ctx = context("web-0-data", None);
    ctx.claim.pv_name = Some("pv-1".to_string());
    let (code_, message) = code(checker.stage(VOLUME, &ctx).await);
    assert_eq!(code_, Code::FailedPrecondition, "{message}");
    assert!(
        message.contains("bound to apps/web-0-data with another uid than pvc-2"),
        "{message}"
    );
    finish(checker, server).await;
}
