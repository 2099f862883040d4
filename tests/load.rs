//! Load: hundreds of concurrent CSI calls through one daemon, on distinct volumes and
//! piled onto the same volumes. Every call must be answered within its deadline (no
//! deadlock, no starvation), a call may be ABORTED only when another call held the same
//! volume, and nothing else may fail. The controller part runs unprivileged; the node
//! part (stage, publish, stats, expand on real loop devices) needs root.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use localvol::proto::csi::v1 as csi;
use localvol_testkit::csi_client::{
    controller_expand_request, delete_request, node_expand_request, publish_request, stage_request,
    stats_request, unpublish_request, unstage_request,
};
use localvol_testkit::{
    Cleanup, InProcessDaemon, assert_released, kubelet_paths, mount_capability, privileged,
};
use tonic::Code;
use tonic::transport::Channel;

/// Every single call must be answered within this (a deadlock shows as a timeout).
const DEADLINE: Duration = Duration::from_secs(60);
const MIB: i64 = 1 << 20;

/// Whether a call's volume was shared with concurrent calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// The only call on its volume at the time: ABORTED would be a bug.
    Distinct,
    /// One of several concurrent calls on the same volume: ABORTED is allowed.
    Shared,
    /// Takes no volume lock (capacity, listing, stats, capabilities).
    Unlocked,
}

#[derive(Default)]
struct Tally {
    calls: usize,
    by: BTreeMap<(Kind, String), usize>,
    failures: Vec<String>,
    slowest: Duration,
}

impl Tally {
    fn code_name(code: Code) -> String {
        format!("{code:?}")
    }

    fn check(&self, phase: &str) {
        assert!(
            self.failures.is_empty(),
            "{phase}: {} calls broke the rules:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
        eprintln!(
            "load {phase}: {} concurrent calls, slowest {:?}, outcomes {:?}",
            self.calls, self.slowest, self.by
        );
    }

    fn count(&self, kind: Kind, code: &str) -> usize {
        self.by.get(&(kind, code.to_string())).copied().unwrap_or(0)
    }
}

type Call = tokio::task::JoinHandle<(Kind, String, Duration, Result<Code, String>)>;

/// Runs one call under the deadline; the answer's code, or why there was none.
fn spawn<T: Send + 'static>(
    kind: Kind,
    what: String,
    call: impl Future<Output = Result<T, tonic::Status>> + Send + 'static,
) -> Call {
    tokio::spawn(async move {
        let started = Instant::now();
        let result = match tokio::time::timeout(DEADLINE, call).await {
            Ok(Ok(_)) => Ok(Code::Ok),
            Ok(Err(status)) if matches!(status.code(), Code::Aborted | Code::Ok) => Ok(status.code()),
            Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
            Err(_) => Err(format!("no answer within {DEADLINE:?}")),
        };
        (kind, what, started.elapsed(), result)
    })
}

async fn gather(calls: Vec<Call>) -> Tally {
    let mut tally = Tally::default();
    for call in calls {
        let (kind, what, took, result) = call.await.unwrap();
        tally.calls += 1;
        tally.slowest = tally.slowest.max(took);
        match result {
            Ok(code) => {
                *tally.by.entry((kind, Tally::code_name(code))).or_default() += 1;
                if code == Code::Aborted && kind != Kind::Shared {
                    tally
                        .failures
                        .push(format!("{what}: ABORTED though no other call held its volume"));
                }
            }
            Err(why) => {
                *tally.by.entry((kind, "failed".to_string())).or_default() += 1;
                tally.failures.push(format!("{what}: {why}"));
            }
        }
    }
    tally
}

/// A few connections, so calls are spread the way several sidecars would spread them.
async fn channels(d: &InProcessDaemon, n: usize) -> Vec<Channel> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(d.channel().await);
    }
    out
}

fn controller(ch: &[Channel], i: usize) -> csi::controller_client::ControllerClient<Channel> {
    csi::controller_client::ControllerClient::new(ch[i % ch.len()].clone())
}

fn node(ch: &[Channel], i: usize) -> csi::node_client::NodeClient<Channel> {
    csi::node_client::NodeClient::new(ch[i % ch.len()].clone())
}

fn create(name: &str, bytes: i64) -> csi::CreateVolumeRequest {
    localvol_testkit::create_request(name, bytes, ("load", name))
}

/// Retries a call until it succeeds (the volume is free again), as a CO would.
async fn settle<T, F, Fut>(what: &str, mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, tonic::Status>>,
{
    let started = Instant::now();
    loop {
        match call().await {
            Ok(v) => return v,
            Err(s) if s.code() == Code::Aborted && started.elapsed() < DEADLINE => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(s) => panic!("{what}: {s:?}"),
        }
    }
}

async fn list_ids(ch: &[Channel]) -> Vec<String> {
    controller(ch, 0)
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
        .into_iter()
        .map(|e| e.volume.unwrap().volume_id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_concurrent_controller_calls() {
    const DISTINCT: usize = 200;
    const HOT: usize = 10;
    const PER_HOT: usize = 15;
    const UNLOCKED: usize = 50;
    let d = InProcessDaemon::start(&[]).await;
    let ch = channels(&d, 8).await;

    // Phase 1: creates on distinct names, piles of identical creates on a few names,
    // and capacity/listing calls, all at once.
    let mut calls = Vec::new();
    let mut i = 0;
    for n in 0..DISTINCT {
        let mut c = controller(&ch, i);
        i += 1;
        let req = create(&format!("pvc-d{n}"), MIB);
        calls.push(spawn(Kind::Distinct, format!("create pvc-d{n}"), async move {
            c.create_volume(req).await
        }));
        if n < HOT * PER_HOT {
            let mut c = controller(&ch, i);
            i += 1;
            let name = format!("pvc-hot{}", n % HOT);
            let req = create(&name, 2 * MIB);
            calls.push(spawn(Kind::Shared, format!("create {name}"), async move {
                c.create_volume(req).await
            }));
        }
        if n < UNLOCKED {
            let mut c = controller(&ch, i);
            i += 1;
            calls.push(spawn(Kind::Unlocked, "capacity/list".to_string(), async move {
                if n % 2 == 0 {
                    c.get_capacity(csi::GetCapacityRequest::default())
                        .await
                        .map(|_| ())
                } else {
                    c.list_volumes(csi::ListVolumesRequest::default())
                        .await
                        .map(|_| ())
                }
            }));
        }
    }
    let phase1 = gather(calls).await;
    phase1.check("create");
    assert_eq!(phase1.calls, DISTINCT + HOT * PER_HOT + UNLOCKED);
    assert_eq!(phase1.count(Kind::Distinct, "Ok"), DISTINCT);
    assert!(
        phase1.count(Kind::Shared, "Ok") >= HOT,
        "each hot volume got created at least once"
    );

    // Each hot volume is free again: one more create returns it at once.
    let mut hot_ids = Vec::new();
    for h in 0..HOT {
        let id = controller(&ch, h)
            .create_volume(create(&format!("pvc-hot{h}"), 2 * MIB))
            .await
            .unwrap_or_else(|s| panic!("pvc-hot{h} still locked after the pile-up: {s:?}"))
            .into_inner()
            .volume
            .unwrap()
            .volume_id;
        hot_ids.push(id);
    }
    assert_eq!(list_ids(&ch).await.len(), DISTINCT + HOT);

    // Phase 2: deletes of the distinct volumes while each hot volume gets 20 concurrent
    // expansions to the same size.
    let mut calls = Vec::new();
    let ids = list_ids(&ch).await;
    for (n, id) in ids.iter().filter(|id| !hot_ids.contains(id)).enumerate() {
        let mut c = controller(&ch, n);
        let id = id.clone();
        calls.push(spawn(Kind::Distinct, format!("delete {id}"), async move {
            c.delete_volume(delete_request(&id)).await
        }));
        let hot = &hot_ids[n % HOT];
        let mut c = controller(&ch, n + 1);
        let req = controller_expand_request(hot, 4 * MIB);
        calls.push(spawn(Kind::Shared, format!("expand {hot}"), async move {
            c.controller_expand_volume(req).await
        }));
    }
    let phase2 = gather(calls).await;
    phase2.check("delete+expand");
    assert_eq!(phase2.count(Kind::Distinct, "Ok"), DISTINCT);
    let mut want = hot_ids.clone();
    want.sort();
    assert_eq!(list_ids(&ch).await, want);

    // Phase 3: ten concurrent deletes per hot volume.
    let mut calls = Vec::new();
    for n in 0..HOT * 10 {
        let id = hot_ids[n % HOT].clone();
        let mut c = controller(&ch, n);
        calls.push(spawn(Kind::Shared, format!("delete {id}"), async move {
            c.delete_volume(delete_request(&id)).await
        }));
    }
    let phase3 = gather(calls).await;
    phase3.check("delete pile-up");
    for id in &hot_ids {
        let id = id.clone();
        settle("delete", || {
            let mut c = controller(&ch, 0);
            let id = id.clone();
            async move { c.delete_volume(delete_request(&id)).await }
        })
        .await;
    }
    assert!(list_ids(&ch).await.is_empty());
    let total = phase1.calls + phase2.calls + phase3.calls;
    let aborted: usize = [&phase1, &phase2, &phase3]
        .iter()
        .map(|t| t.count(Kind::Shared, "Aborted"))
        .sum();
    eprintln!(
        "load controller: {total} concurrent calls answered in time, {aborted} ABORTED (all on shared volumes)"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_node_calls_on_shared_and_distinct_volumes() {
    if !privileged() {
        return;
    }
    const VOLUMES: usize = 8;
    const PILE: usize = 6;
    let d = InProcessDaemon::start(&[]).await;
    let ch = channels(&d, 8).await;
    let root = d.path("kubelet");
    let mut cleanup = Cleanup {
        mounts: Vec::new(),
        data: d.data_dir(),
    };
    let mut vols = Vec::new();
    for v in 0..VOLUMES {
        let id = controller(&ch, v)
            .create_volume(create(&format!("pvc-n{v}"), 64 * MIB))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap()
            .volume_id;
        let (staging, target) = kubelet_paths(&root, &format!("pv-n{v}"), &format!("pod-{v}"));
        cleanup.mounts.extend([staging.clone(), target.clone()]);
        vols.push((id, staging, target));
    }
    let mut total = 0;
    let mut aborted = 0;

    // Each phase: PILE identical calls on every volume at once, plus stats calls.
    for phase in ["stage", "publish", "stats+expand", "unpublish", "unstage"] {
        let mut calls = Vec::new();
        for (v, (id, staging, target)) in vols.iter().enumerate() {
            for k in 0..PILE {
                let mut n = node(&ch, v * PILE + k);
                let (id, staging, target) = (id.clone(), staging.clone(), target.clone());
                let what = format!("{phase} {id}");
                let call: Call = match phase {
                    "stage" => spawn(Kind::Shared, what, async move {
                        n.node_stage_volume(stage_request(&id, &staging, &mount_capability()))
                            .await
                    }),
                    "publish" => spawn(Kind::Shared, what, async move {
                        n.node_publish_volume(publish_request(&id, &staging, &target, &mount_capability()))
                            .await
                    }),
                    "stats+expand" if k == 0 => spawn(Kind::Distinct, what, async move {
                        // ext4 online growth may be refused here (no CAP_SYS_RESOURCE);
                        // block-level growth is what this checks under load.
                        n.node_expand_volume(csi::NodeExpandVolumeRequest {
                            capacity_range: None,
                            ..node_expand_request(&id, &target, &staging, 0, &mount_capability())
                        })
                        .await
                    }),
                    "stats+expand" => spawn(Kind::Unlocked, what, async move {
                        let stats = n
                            .node_get_volume_stats(stats_request(&id, &target))
                            .await?
                            .into_inner();
                        assert!(!stats.volume_condition.unwrap().abnormal);
                        Ok(())
                    }),
                    "unpublish" => spawn(Kind::Shared, what, async move {
                        n.node_unpublish_volume(unpublish_request(&id, &target)).await
                    }),
                    _ => spawn(Kind::Shared, what, async move {
                        n.node_unstage_volume(unstage_request(&id, &staging)).await
                    }),
                };
                calls.push(call);
            }
        }
        let tally = gather(calls).await;
        tally.check(phase);
        total += tally.calls;
        aborted += tally.count(Kind::Shared, "Aborted");
        // Whatever got ABORTED is retried once everything settled, as kubelet would.
        for (id, staging, target) in &vols {
            let (id, staging, target) = (id.clone(), staging.clone(), target.clone());
            match phase {
                "stage" => {
                    settle("stage", || {
                        let mut n = node(&ch, 0);
                        let req = stage_request(&id, &staging, &mount_capability());
                        async move { n.node_stage_volume(req).await }
                    })
                    .await;
                }
                "publish" => {
                    settle("publish", || {
                        let mut n = node(&ch, 0);
                        let req = publish_request(&id, &staging, &target, &mount_capability());
                        async move { n.node_publish_volume(req).await }
                    })
                    .await;
                }
                "unpublish" => {
                    settle("unpublish", || {
                        let mut n = node(&ch, 0);
                        let req = unpublish_request(&id, &target);
                        async move { n.node_unpublish_volume(req).await }
                    })
                    .await;
                }
                "unstage" => {
                    settle("unstage", || {
                        let mut n = node(&ch, 0);
                        let req = unstage_request(&id, &staging);
                        async move { n.node_unstage_volume(req).await }
                    })
                    .await;
                }
                _ => {}
            }
        }
    }
    assert_released(d.dir.path(), &d.data_dir(), "after the concurrent calls");
    for (id, _, _) in &vols {
        controller(&ch, 0)
            .delete_volume(delete_request(id))
            .await
            .unwrap();
    }
    eprintln!(
        "load node: {total} concurrent node calls on {VOLUMES} volumes answered in time, \
         {aborted} ABORTED (all on shared volumes)"
    );
    drop(cleanup);
    d.stop().await;
}
