//! The resizer's loop: a watch of this node's claims and a periodic look at all of them
//! feed one queue, worked one claim at a time, with retries after a failed step.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tracing::{Instrument, info, info_span, warn};

use super::{Key, LABEL_INTERVAL, NodeResizer, Outcome, RESYNC, RETRY, SLOW_RETRY, key_of, wants_attention};
use crate::resize::classify::{Cause, Failure, classify};

/// Runs the resizer until `shutdown` resolves: a watch of claims and a periodic look at
/// this node's claims feed one queue, worked one claim at a time.
pub async fn run(
    resizer: Arc<NodeResizer>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Key>();
    let watch = {
        let resizer = Arc::clone(&resizer);
        let tx = tx.clone();
        async move {
            let stream = resizer
                .api
                .watch_claims(&resizer.node, resizer.labels.clone())
                .filter(|item| item.as_ref().map_or(true, wants_attention));
            let mut stream = std::pin::pin!(stream);
            while let Some(item) = stream.next().await {
                match item {
                    Ok(pvc) => {
                        let key = key_of(&pvc);
                        match resizer.local_volume(&key).await {
                            Ok(Some(_)) => {
                                let _ = tx.send(key);
                            }
                            Ok(None) => {}
                            Err(e) => warn!(error = %e, "cannot list this node's volumes"),
                        }
                    }
                    Err(e) => warn!(error = %e, "claim watch failed; retrying with backoff"),
                }
            }
        }
    };
    let resync = {
        let resizer = Arc::clone(&resizer);
        let tx = tx.clone();
        async move {
            let mut tick = tokio::time::interval(RESYNC);
            loop {
                tick.tick().await;
                match resizer.local_keys().await {
                    Ok(keys) => keys.into_iter().for_each(|k| drop(tx.send(k))),
                    Err(e) => warn!(error = %e, "cannot list this node's volumes"),
                }
            }
        }
    };
    let label = {
        let resizer = Arc::clone(&resizer);
        async move {
            let mut tick = tokio::time::interval(LABEL_INTERVAL);
            loop {
                tick.tick().await;
                if let Err(e) = resizer.label_local().await {
                    warn!(error = %e, "cannot list this node's volumes");
                }
            }
        }
    };
    let work = {
        let tx = tx.clone();
        async move {
            let mut queued: HashSet<Key> = HashSet::new();
            let mut backlog = Vec::new();
            while let Some(key) = rx.recv().await {
                // Take everything waiting, once each.
                backlog.push(key);
                while let Ok(more) = rx.try_recv() {
                    backlog.push(more);
                }
                for key in backlog.drain(..) {
                    if !queued.insert(key.clone()) {
                        continue;
                    }
                    let span = info_span!("resize", pvc = %format!("{}/{}", key.0, key.1));
                    let outcome = resizer.reconcile(&key).instrument(span.clone()).await;
                    let retry = match outcome {
                        Ok(Outcome::Done) => None,
                        Ok(Outcome::RetryAfter(after)) => Some(after),
                        Err(e) => {
                            let after = match classify(Cause::Operation(&e)) {
                                Failure::Transient => RETRY,
                                Failure::Terminal => SLOW_RETRY,
                            };
                            span.in_scope(|| warn!(error = %e, retry_in = ?after, "resize step failed"));
                            Some(after)
                        }
                    };
                    if let Some(after) = retry {
                        let tx = tx.clone();
                        let key = key.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(after).await;
                            let _ = tx.send(key);
                        });
                    }
                }
                queued.clear();
            }
        }
    };
    info!("node resizer: expanding the claims of this node's volumes");
    tokio::select! {
        _ = watch => warn!("claim watch ended"),
        _ = resync => {}
        _ = label => {}
        _ = work => {}
        _ = shutdown => info!("node resizer stopped"),
    }
}
