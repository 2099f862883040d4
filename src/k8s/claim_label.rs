//! The label that makes a node's claims watchable by that node alone.
//!
//! Why a label: the node resizer and the reclaim scheduler must see changes to the
//! claims of this node's volumes, and nothing else. A PVC carries no field a field
//! selector could match to a node (the scheduler's `volume.kubernetes.io/selected-node`
//! is an annotation, and the PV's node affinity is on another object, which the API
//! server cannot filter by node either), so a plain watch of claims is a cluster-wide
//! stream sent to every node. Instead each daemon labels the claims it holds a volume
//! for, `localvol.csi.dev/node=<node>`, with one merge PATCH per claim, and watches
//! claims with that label selector: the API server sends each node only its own
//! claims' events, and the node opens one claim watch however many claims it holds.
//!
//! The claims come from the node's own volume records (each volume records the claim it
//! was created for, `--extra-create-metadata`), never from the API. A claim is labelled
//! at most once per process, even by concurrent calls and by the several users of one
//! `ClaimLabels` (its clones share what is labelled: the daemon makes one, for the node
//! resizer, the reclaim scheduler and the owner check); one that is gone (404) is not
//! tried again, other failures are retried at the next call.
//!
//! The owner check labels the claim it must read anyway ([`ClaimLabels::label`]): the
//! PATCH answers the claim as the API server has it, so the first stage of a volume
//! costs one request, which both reads and labels its claim.
//!
//! The periodic labelling ([`ClaimLabels::ensure`]) leaves a claim alone for
//! [`LABEL_GRACE`] after it first sees it, for two reasons measured on a real node
//! (bench/cluster): a claim changed while external-provisioner is still provisioning
//! it is provisioned again (an extra CreateVolume and PV create each), and a restarted
//! daemon would PATCH every claim of the node before its claim watch has listed them
//! and shown them labelled already ([`ClaimLabels::mark_labelled`]). A volume's first
//! stage labels its claim anyway, well within the grace.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use tracing::{debug, warn};

/// How long [`ClaimLabels::ensure`] waits after first seeing a claim (see above).
pub const LABEL_GRACE: Duration = Duration::from_secs(10);

/// The label key; its value is [`node_value`] of the node holding the claim's volume.
pub const NODE_LABEL: &str = "localvol.csi.dev/node";

/// A label value for `node`. Node names are DNS subdomains of up to 253 characters,
/// label values at most 63: a longer name keeps its first 46 characters and gets a
/// hash of the whole name (FNV-1a, stable across releases and machines).
pub fn node_value(node: &str) -> String {
    if node.len() <= 63 {
        return node.to_string();
    }
    let hash = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let head: String = node.chars().take(46).collect();
    format!("{}-{hash:016x}", head.trim_end_matches(['.', '-']))
}

/// The label selector of `node`'s claims.
pub fn selector(node: &str) -> String {
    format!("{NODE_LABEL}={}", node_value(node))
}

/// Puts [`NODE_LABEL`] on the claims of this node's volumes.
#[derive(Clone)]
pub struct ClaimLabels {
    client: Client,
    value: String,
    labelled: Arc<Mutex<HashSet<(String, String)>>>,
    /// When `ensure` first saw each claim not labelled yet.
    first_seen: Arc<Mutex<HashMap<(String, String), Instant>>>,
    grace: Duration,
}

impl std::fmt::Debug for ClaimLabels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimLabels")
            .field("value", &self.value)
            .finish_non_exhaustive()
    }
}

impl ClaimLabels {
    pub fn new(client: Client, node: &str) -> Self {
        Self {
            client,
            value: node_value(node),
            labelled: Arc::default(),
            first_seen: Arc::default(),
            grace: LABEL_GRACE,
        }
    }

    /// With another grace than [`LABEL_GRACE`] (tests: none).
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Notes that a claim carries the label already (a claim watch by the label
    /// showed it): no PATCH for it.
    pub fn mark_labelled(&self, namespace: &str, name: &str) {
        self.labelled().insert((namespace.to_string(), name.to_string()));
    }

    fn labelled(&self) -> std::sync::MutexGuard<'_, HashSet<(String, String)>> {
        self.labelled.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the claim for labelling: true if no one has labelled it or is labelling it,
    /// and the caller now must ([`label`](Self::label), then
    /// [`give_back`](Self::give_back) if that failed).
    pub fn take(&self, namespace: &str, name: &str) -> bool {
        self.labelled().insert((namespace.to_string(), name.to_string()))
    }

    /// Gives back a claim whose labelling failed, so that a later call tries again.
    pub fn give_back(&self, namespace: &str, name: &str) {
        self.labelled().remove(&(namespace.to_string(), name.to_string()));
    }

    /// Labels a claim taken with [`take`](Self::take) (one merge PATCH) and returns it as
    /// the API server then has it; `None` when it does not exist.
    pub async fn label(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PersistentVolumeClaim>, kube::Error> {
        let patch = serde_json::json!({"metadata": {"labels": {NODE_LABEL: self.value}}});
        let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace);
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(claim) => {
                debug!(pvc.namespace = %namespace, pvc.name = %name, "labelled claim with this node");
                Ok(Some(claim))
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                debug!(pvc.namespace = %namespace, pvc.name = %name, "claim is gone; not labelled");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Labels each of `claims` (namespace, name) not labelled by this process yet.
    pub async fn ensure(&self, claims: impl IntoIterator<Item = (String, String)>) {
        // Taken before the PATCH, so that concurrent calls (the reclaim scheduler calls
        // on every refresh) never label one claim twice; given back on failure.
        let now = Instant::now();
        let due: Vec<(String, String)> = {
            let labelled = self.labelled();
            let mut seen = self.first_seen.lock().unwrap_or_else(|p| p.into_inner());
            // Forget claims not asked about for long (deleted before their grace ended).
            seen.retain(|_, at| now.duration_since(*at) < Duration::from_secs(3600));
            claims
                .into_iter()
                .filter(|claim| !labelled.contains(claim))
                .filter(|claim| now.duration_since(*seen.entry(claim.clone()).or_insert(now)) >= self.grace)
                .collect()
        };
        let todo: Vec<(String, String)> = due.into_iter().filter(|(ns, name)| self.take(ns, name)).collect();
        for (namespace, name) in todo {
            if let Err(e) = self.label(&namespace, &name).await {
                warn!(pvc.namespace = %namespace, pvc.name = %name, error = %e, "cannot label claim with this node; retrying later");
                self.give_back(&namespace, &name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http::Method;

    use super::*;
    use crate::k8s::mock_api::{Exchange, MockApi, ok};

    /// The label PATCH of claim `name` in namespace `apps`, answered with the claim.
    fn label_patch(name: &str) -> Exchange {
        let claim = serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name}});
        Exchange::new(
            Method::PATCH,
            format!("/api/v1/namespaces/apps/persistentvolumeclaims/{name}?"),
            ok(&claim),
        )
    }

    /// Concurrent calls (the reclaim scheduler calls on every refresh) label a claim
    /// once: the second call does not PATCH while the first one's PATCH is in flight.
    #[tokio::test]
    async fn concurrent_calls_label_a_claim_once() {
        let (client, api) = MockApi::scripted(vec![]);
        let patch = api.expect(label_patch("data").held());
        let labels = Arc::new(ClaimLabels::new(client, "node-a").with_grace(Duration::ZERO));
        let claim = || vec![("apps".to_string(), "data".to_string())];
        let first = tokio::spawn({
            let labels = Arc::clone(&labels);
            async move { labels.ensure(claim()).await }
        });
        patch.asked().await;
        // While that PATCH is unanswered, a second call finds the claim taken (a second
        // PATCH would be one past the script).
        labels.ensure(claim()).await;
        patch.release();
        first.await.unwrap();
        labels.ensure(claim()).await;
        drop(labels);
        api.finish().await;
    }

    /// A claim first seen is left alone for the grace (its provisioning may not have
    /// finished), then labelled; one a label watch has shown is never patched.
    #[tokio::test]
    async fn claims_are_labelled_after_the_grace_and_never_when_seen_labelled() {
        // Nothing is expected yet: a PATCH within the grace would be past the script.
        let (client, api) = MockApi::scripted(vec![]);
        let grace = Duration::from_millis(300);
        let labels = Arc::new(ClaimLabels::new(client, "node-a").with_grace(grace));
        let claims = || {
            vec![
                ("apps".to_string(), "new".to_string()),
                ("apps".to_string(), "seen".to_string()),
            ]
        };
        labels.mark_labelled("apps", "seen");
        labels.ensure(claims()).await;
        let asked = api.requests();
        assert!(asked.is_empty(), "a PATCH within the grace: {asked:?}");
        tokio::time::sleep(grace).await;
        api.expect(label_patch("new"));
        labels.ensure(claims()).await;
        labels.ensure(claims()).await;
        drop(labels);
        // No PATCH of a labelled claim: it would be past the script.
        api.finish().await;
    }

    #[test]
    fn short_node_names_are_the_value_and_long_ones_are_shortened_stably() {
        assert_eq!(node_value("node-a.example.com"), "node-a.example.com");
        assert_eq!(selector("node-a"), "localvol.csi.dev/node=node-a");
        let long = format!("{}.example.com", "n".repeat(70));
        let value = node_value(&long);
        assert!(value.len() <= 63, "{value}");
        assert_eq!(value, node_value(&long));
        assert_ne!(value, node_value(&format!("{}.example.org", "n".repeat(70))));
        assert!(value.starts_with(&"n".repeat(46)));
    }
}
