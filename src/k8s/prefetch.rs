//! Reads a new volume's claim as soon as the pod that will use it is bound to this node,
//! so that the owner check at NodeStageVolume finds it cached instead of waiting on the
//! API server.
//!
//! Why it matters: kubelet checks whether a pod's volumes are mounted every 300 ms from
//! the moment it starts the pod, and its volume manager begins NodeStageVolume 200 to
//! 300 ms after that (two passes of its 100 ms loops). A stage and publish that end
//! after the first check cost the pod a whole period. Measured on a real node
//! (bench/cluster): the claim's one read took about 20 ms of a 57 ms stage, and pods
//! with a new volume took 980 ms from bind to Running, against 710 for a pod with an
//! emptyDir. The node's pod watch shows the pod when kubelet sees it, so the same one
//! read, made then, is done well before kubelet asks.
//!
//! Only the claims this daemon has just created a volume for are read (CreateVolume
//! names them: `--extra-create-metadata`): pods of other drivers cost no request. The
//! read comes after the claim was bound (the scheduler binds a pod only once its claims
//! are), so its label PATCH cannot disturb provisioning (see `claim_label`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tracing::debug;

use super::lookup::{Lookup, Source};
use super::owner::PodView;

/// How long a created volume's claim waits for its pod. A pod that comes later (a claim
/// made ahead of its workload) is checked at stage as before, reading the claim then.
pub const EXPECT_FOR: Duration = Duration::from_secs(600);

/// A claim: namespace and name.
type ClaimKey = (String, String);

/// The claims of volumes created by this daemon whose pod has not arrived yet.
#[derive(Debug, Clone)]
pub struct Prefetch {
    expected: Arc<Mutex<HashMap<ClaimKey, Instant>>>,
    reads: mpsc::UnboundedSender<ClaimKey>,
}

impl Prefetch {
    /// The set, and the claims to read as their pods arrive, for [`run`].
    pub fn new() -> (Self, mpsc::UnboundedReceiver<ClaimKey>) {
        let (reads, queue) = mpsc::unbounded_channel();
        let prefetch = Self {
            expected: Arc::default(),
            reads,
        };
        (prefetch, queue)
    }

    fn expected(&self) -> std::sync::MutexGuard<'_, HashMap<ClaimKey, Instant>> {
        self.expected.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A volume was created for claim `namespace/name`.
    pub fn expect(&self, namespace: &str, name: &str) {
        let mut expected = self.expected();
        expected.retain(|_, since| since.elapsed() < EXPECT_FOR);
        expected.insert((namespace.to_string(), name.to_string()), Instant::now());
    }

    /// The claim was read for a stage or publish: its pod came before the read ahead.
    pub fn settled(&self, namespace: &str, name: &str) {
        self.expected().remove(&(namespace.to_string(), name.to_string()));
    }

    /// A pod on this node was added or changed: queues the reads of the expected claims
    /// it uses, each once.
    pub fn pod_seen(&self, pod: &Pod) {
        let mut expected = self.expected();
        // Most events are status changes of pods whose volumes are long set up.
        if expected.is_empty() {
            return;
        }
        let view = PodView::from_pod(pod);
        for name in view.ephemeral_claims.iter().chain(&view.claims) {
            let key = (view.id.namespace.clone(), name.clone());
            if expected
                .remove(&key)
                .is_some_and(|since| since.elapsed() < EXPECT_FOR)
            {
                // The receiver lives as long as the daemon's runtime.
                let _ = self.reads.send(key);
            }
        }
    }
}

/// Reads each queued claim through `lookup` (which keeps it for the owner check), all at
/// once. A failed read is only logged: the stage reads the claim again.
pub async fn run(lookup: Arc<Lookup>, mut queue: mpsc::UnboundedReceiver<ClaimKey>) {
    while let Some((namespace, name)) = queue.recv().await {
        let lookup = Arc::clone(&lookup);
        tokio::spawn(async move {
            match lookup.pvc(&namespace, &name, Source::Cache).await {
                Ok(found) => debug!(
                    pvc.namespace = namespace,
                    pvc.name = name,
                    found = found.is_some(),
                    "claim read ahead of its stage"
                ),
                Err(e) => {
                    debug!(pvc.namespace = namespace, pvc.name = name, error = %e, "claim not read ahead of its stage")
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::fixtures::{NODE, NS, Uses, pod};

    fn queued(queue: &mut mpsc::UnboundedReceiver<ClaimKey>) -> Vec<String> {
        std::iter::from_fn(|| queue.try_recv().ok())
            .map(|(namespace, name)| format!("{namespace}/{name}"))
            .collect()
    }

    #[test]
    fn the_claims_of_created_volumes_are_read_once_when_a_pod_using_them_arrives() {
        let (prefetch, mut queue) = Prefetch::new();
        // No volume created yet: nothing to read, whatever the pod uses.
        prefetch.pod_seen(&pod("web-0", "uid-a", NODE, &[Uses::Ephemeral("data")]));
        assert!(queued(&mut queue).is_empty());

        prefetch.expect(NS, "web-0-data");
        prefetch.expect(NS, "db");
        prefetch.expect("elsewhere", "logs");
        prefetch.pod_seen(&pod("other", "uid-o", NODE, &[Uses::Claim("not-ours")]));
        assert!(
            queued(&mut queue).is_empty(),
            "a pod of another driver costs nothing"
        );
        let web0 = pod(
            "web-0",
            "uid-a",
            NODE,
            &[Uses::Ephemeral("data"), Uses::Claim("db")],
        );
        prefetch.pod_seen(&web0);
        assert_eq!(
            queued(&mut queue),
            [format!("{NS}/web-0-data"), format!("{NS}/db")]
        );
        prefetch.pod_seen(&web0);
        assert!(queued(&mut queue).is_empty(), "each claim once");
        // The fixture's pods are in NS: a claim of that name elsewhere is another claim.
        prefetch.pod_seen(&pod("logs-reader", "uid-l", NODE, &[Uses::Claim("logs")]));
        assert!(queued(&mut queue).is_empty());
    }

    #[test]
    fn a_claim_read_by_its_stage_first_is_not_read_again() {
        let (prefetch, mut queue) = Prefetch::new();
        prefetch.expect(NS, "web-0-data");
        prefetch.settled(NS, "web-0-data");
        prefetch.pod_seen(&pod("web-0", "uid-a", NODE, &[Uses::Ephemeral("data")]));
        assert!(queued(&mut queue).is_empty());
    }
}
