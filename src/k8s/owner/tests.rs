use super::*;
use crate::k8s::fixtures::{NODE, NS, Uses, controller, pod, pod_owner, pvc};

const A: &str = "uid-a";
const B: &str = "uid-b";

fn claim(
    name: &str,
    owner: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
) -> ClaimView {
    ClaimView::from_pvc(&pvc(name, "pvc-uid", owner, None))
}

fn view(name: &str, uid: &str, node: &str, uses: &[Uses<'_>]) -> PodView {
    PodView::from_pod(&pod(name, uid, node, uses))
}

fn requester(name: &str, uid: &str) -> PodInfo {
    PodInfo {
        name: name.to_string(),
        namespace: NS.to_string(),
        uid: uid.to_string(),
    }
}

fn found(d: &Decision) -> &str {
    match d {
        Decision::Refused(r) => &r.found,
        Decision::Allowed => "<allowed>",
    }
}

#[test]
fn ephemeral_claims_are_named_pod_dash_volume() {
    let p = pod(
        "web-0",
        A,
        NODE,
        &[
            Uses::Ephemeral("data"),
            Uses::Claim("shared"),
            Uses::Ephemeral("scratch"),
        ],
    );
    assert_eq!(ephemeral_claim_names(&p), ["web-0-data", "web-0-scratch"]);
    let v = PodView::from_pod(&p);
    assert_eq!(v.claims, ["shared"]);
    assert_eq!(v.node.as_deref(), Some(NODE));
}

#[test]
fn the_first_controller_reference_is_the_owner() {
    let mut c = pvc("web-0-data", "pvc-uid", Some(pod_owner("web-0", A)), None);
    let mut not_controller = controller("StatefulSet", "apps/v1", "web", "ss");
    not_controller.controller = Some(false);
    c.metadata.owner_references = Some(vec![not_controller, pod_owner("web-0", A), pod_owner("other", B)]);
    let v = ClaimView::from_pvc(&c);
    assert_eq!(v.pod_controller().map(|c| c.uid.as_str()), Some(A));

    // A controller that is not a core/v1 Pod makes a normal claim.
    let v = claim("x", Some(controller("Pod", "example.com/v1", "web-0", A)));
    assert!(v.pod_controller().is_none());
    let v = claim("x", Some(controller("StatefulSet", "apps/v1", "web", A)));
    assert!(v.pod_controller().is_none());
}

#[test]
fn stage_rules() {
    let owned = claim("web-0-data", Some(pod_owner("web-0", A)));
    let eph = [Uses::Ephemeral("data")];
    let cases: Vec<(&str, ClaimView, Option<PodView>, Option<&str>)> = vec![
        (
            "owned by the pod",
            owned.clone(),
            Some(view("web-0", A, NODE, &eph)),
            None,
        ),
        (
            "owner pod missing",
            owned.clone(),
            None,
            Some("no Pod apps/web-0"),
        ),
        (
            "pod recreated under the same name",
            owned.clone(),
            Some(view("web-0", B, NODE, &eph)),
            Some("Pod apps/web-0 (uid uid-b)"),
        ),
        (
            "pod on another node",
            owned.clone(),
            Some(view("web-0", A, "node-b", &eph)),
            Some("on node node-b"),
        ),
        (
            "pod without the ephemeral volume",
            owned.clone(),
            Some(view("web-0", A, NODE, &[Uses::Claim("web-0-data")])),
            Some("without an ephemeral volume"),
        ),
        ("no owner: a normal claim", claim("web-0-data", None), None, None),
        (
            "owned by a non-pod: a normal claim",
            claim("data-web-0", Some(controller("StatefulSet", "apps/v1", "web", B))),
            None,
            None,
        ),
    ];
    for (name, claim, owner, refused) in cases {
        let d = decide_stage(&claim, NODE, owner.as_ref());
        match refused {
            None => assert_eq!(d, Decision::Allowed, "{name}"),
            Some(part) => {
                assert!(found(&d).contains(part), "{name}: {d:?}");
                let Decision::Refused(r) = &d else { unreachable!() };
                assert_eq!(r.pvc.name, "web-0-data", "{name}");
                assert!(
                    r.expected.contains("Pod apps/web-0 (uid uid-a) on node node-a"),
                    "{name}: {r}"
                );
            }
        }
    }
}

/// Name, claim, requesting pod, the pod as read, and what `found` contains if refused.
type PublishCase<'a> = (&'a str, ClaimView, PodInfo, Option<PodView>, Option<&'a str>);

#[test]
fn publish_rules() {
    let eph = [Uses::Ephemeral("data")];
    let by_claim = [Uses::Claim("web-0-data")];
    let owned_by = |uid: &str| claim("web-0-data", Some(pod_owner("web-0", uid)));
    let cases: Vec<PublishCase<'_>> = vec![
        (
            "ephemeral, owned by this pod",
            owned_by(A),
            requester("web-0", A),
            None,
            None,
        ),
        (
            "owned by another pod",
            owned_by(B),
            requester("web-0", A),
            None,
            Some("Pod apps/web-0 (uid uid-b)"),
        ),
        (
            "owned by a pod, used by another pod through a claim volume",
            owned_by(A),
            requester("reader", B),
            None,
            Some("Pod apps/web-0 (uid uid-a)"),
        ),
        (
            "same-named claim with no owner through the ephemeral volume",
            claim("web-0-data", None),
            requester("web-0", A),
            Some(view("web-0", A, NODE, &eph)),
            Some("no controlling owner"),
        ),
        (
            "claim owned by a StatefulSet through the ephemeral volume",
            claim("web-0-data", Some(controller("StatefulSet", "apps/v1", "web", B))),
            requester("web-0", A),
            Some(view("web-0", A, NODE, &eph)),
            Some("StatefulSet apps/web (uid uid-b)"),
        ),
        (
            "normal claim through a persistentVolumeClaim volume",
            claim("web-0-data", None),
            requester("web-0", A),
            Some(view("web-0", A, NODE, &by_claim)),
            None,
        ),
        (
            "requesting pod gone",
            claim("web-0-data", None),
            requester("web-0", A),
            None,
            Some("no Pod apps/web-0 with uid uid-a"),
        ),
    ];
    for (name, claim, req, pod, refused) in cases {
        if pod.is_some() {
            assert!(publish_needs_pod(&claim), "{name}");
        }
        let d = decide_publish(&claim, &req, pod.as_ref());
        match refused {
            None => assert_eq!(d, Decision::Allowed, "{name}"),
            Some(part) => {
                assert!(found(&d).contains(part), "{name}: {d:?}");
                let Decision::Refused(r) = &d else { unreachable!() };
                assert_eq!(
                    r.expected,
                    format!("Pod apps/{} (uid {})", req.name, req.uid),
                    "{name}"
                );
            }
        }
    }
}

#[test]
fn a_pod_owned_claim_in_another_namespace_is_refused() {
    let mut c = pvc("web-0-data", "pvc-uid", Some(pod_owner("web-0", A)), None);
    c.metadata.namespace = Some("elsewhere".to_string());
    let d = decide_publish(&ClaimView::from_pvc(&c), &requester("web-0", A), None);
    assert!(matches!(d, Decision::Refused(_)), "{d:?}");
}

#[test]
fn refusal_message_names_pvc_expected_and_found() {
    let d = decide_stage(
        &claim("web-0-data", Some(pod_owner("web-0", A))),
        NODE,
        Some(&view("web-0", B, NODE, &[])),
    );
    let Decision::Refused(r) = d else {
        panic!("allowed")
    };
    assert_eq!(
        r.to_string(),
        "PersistentVolumeClaim apps/web-0-data (uid pvc-uid): expected owner Pod apps/web-0 (uid uid-a) \
         on node node-a, with an ephemeral volume for this claim, found Pod apps/web-0 (uid uid-b)"
    );
}
