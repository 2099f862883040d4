//! CSI Node: stage, publish and the rest, on this node's own volumes.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::Driver;
use crate::error::Error;
use crate::model::full_message;
use crate::proto::csi::v1::{self as csi, node_server::Node, node_service_capability};
use crate::request::{
    NodeExpandRequest, PublishRequest, StageRequest, StatsRequest, UnpublishRequest, UnstageRequest,
};
use crate::volume::{Usage, VolumeCondition};
use crate::volume_states::{ObjectName, ResizeState, ResizeStep};

#[derive(Debug)]
pub struct NodeService(pub Arc<Driver>);

fn usage(unit: csi::volume_usage::Unit, total: u64, available: u64, used: u64) -> csi::VolumeUsage {
    csi::VolumeUsage {
        available: available as i64,
        total: total as i64,
        used: used as i64,
        unit: unit as i32,
    }
}

/// The claim and pod a publish is for, as kubelet's volume context names them.
fn publication_of(req: &PublishRequest) -> (Option<ObjectName>, Option<ObjectName>) {
    let claim = &req.context.claim;
    let claim = match (&claim.pvc_namespace, &claim.pvc_name) {
        (Some(namespace), Some(name)) => Some(ObjectName {
            namespace: namespace.clone(),
            name: name.clone(),
        }),
        _ => None,
    };
    let pod = req.context.pod.as_ref().map(|p| ObjectName {
        namespace: p.namespace.clone(),
        name: p.name.clone(),
    });
    (claim, pod)
}

fn condition(c: VolumeCondition) -> Option<csi::VolumeCondition> {
    Some(csi::VolumeCondition {
        abnormal: c.abnormal,
        message: c.message,
    })
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let raw = request.into_inner();
        self.0
            .observe_on_one_thread("NodeStageVolume", raw.volume_id.clone(), |driver| async move {
                let req = StageRequest::parse(&raw, &driver.roots)?;
                driver.owner_check.before_stage(&req).await?;
                let guard = driver.lock(&req.id.token, "NodeStageVolume")?;
                if let Err(e) = driver.volumes.stage(&guard, &req).await {
                    if e.is_not_opened() {
                        driver
                            .owner_check
                            .stage_failed(
                                &req,
                                crate::k8s::events::REASON_ENCRYPTED_NOT_OPENED,
                                &full_message(&e),
                            )
                            .await;
                    }
                    return Err(e.into());
                }
                Ok(csi::NodeStageVolumeResponse {})
            })
            .await
    }

    async fn node_unstage_volume(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let raw = request.into_inner();
        self.0
            .observe_on_one_thread("NodeUnstageVolume", raw.volume_id.clone(), |driver| async move {
                let req = UnstageRequest::parse(&raw, &driver.roots)?;
                let guard = driver.lock(&req.id.token, "NodeUnstageVolume")?;
                driver.volumes.unstage(&guard, &req).await?;
                Ok(csi::NodeUnstageVolumeResponse {})
            })
            .await
    }

    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let raw = request.into_inner();
        self.0
            .observe_on_one_thread("NodePublishVolume", raw.volume_id.clone(), |driver| async move {
                let req = PublishRequest::parse(&raw, &driver.roots)?;
                driver.owner_check.before_publish(&req).await?;
                let guard = driver.lock(&req.id.token, "NodePublishVolume")?;
                driver.volumes.publish(&guard, &req).await?;
                let (claim, pod) = publication_of(&req);
                driver
                    .volume_states
                    .published(&req.id, req.target_path.as_path(), claim, pod);
                Ok(csi::NodePublishVolumeResponse {})
            })
            .await
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let raw = request.into_inner();
        self.0
            .observe_on_one_thread(
                "NodeUnpublishVolume",
                raw.volume_id.clone(),
                |driver| async move {
                    let req = UnpublishRequest::parse(&raw, &driver.roots)?;
                    let guard = driver.lock(&req.id.token, "NodeUnpublishVolume")?;
                    driver.volumes.unpublish(&guard, &req).await?;
                    driver
                        .volume_states
                        .unpublished(&req.id, req.target_path.as_path());
                    Ok(csi::NodeUnpublishVolumeResponse {})
                },
            )
            .await
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        use csi::volume_usage::Unit;
        let raw = request.into_inner();
        self.0
            .observe_on_one_thread("NodeGetVolumeStats", raw.volume_id.clone(), |driver| async move {
                // Read-only: no lock, so stats never make a stage or publish wait.
                let req = StatsRequest::parse(&raw, &driver.roots)?;
                let stats = driver.volumes.stats(&req).await?;
                let usage = match stats.usage {
                    Usage::Filesystem(u) => vec![
                        usage(Unit::Bytes, u.total_bytes, u.available_bytes, u.used_bytes),
                        usage(Unit::Inodes, u.total_inodes, u.free_inodes, u.used_inodes),
                    ],
                    Usage::Block { size_bytes } => vec![usage(Unit::Bytes, size_bytes, 0, 0)],
                };
                let VolumeCondition { abnormal, message } = &stats.condition;
                driver.metrics.set_volume_health(&req.id, &stats.claim, *abnormal);
                if let Some(change) = driver
                    .volume_states
                    .condition_checked(&req.id, *abnormal, message)
                {
                    driver
                        .owner_check
                        .condition_changed(&stats.claim, &req.id.to_string(), change);
                }
                Ok(csi::NodeGetVolumeStatsResponse {
                    usage,
                    volume_condition: condition(stats.condition),
                })
            })
            .await
    }

    async fn node_expand_volume(
        &self,
        request: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let raw = request.into_inner();
        self.0
            .observe_on_one_thread("NodeExpandVolume", raw.volume_id.clone(), |driver| async move {
                let req = NodeExpandRequest::parse(&raw, &driver.roots)?;
                let guard = driver.lock(&req.id.token, "NodeExpandVolume")?;
                let resize = &driver.resize;
                let target_bytes = req.capacity.required;
                let states = &driver.volume_states;
                states.resized(
                    &req.id,
                    ResizeStep::Node,
                    ResizeState::InProgress { target_bytes },
                );
                let report = resize.started(&driver.volumes, &req.id, target_bytes).await;
                let result = driver
                    .volumes
                    .expand_on_node(&guard, &req)
                    .await
                    .map_err(Error::from);
                resize.finished(report, &result).await;
                let state = match &result {
                    Ok(size_bytes) => ResizeState::Done {
                        size_bytes: *size_bytes,
                    },
                    Err(e) => ResizeState::Failed {
                        target_bytes,
                        reason: full_message(e),
                    },
                };
                states.resized(&req.id, ResizeStep::Node, state);
                let label = result.as_ref().map_or_else(Error::label, |_| "ok");
                driver.metrics.observe_resize(&req.id.class, label);
                let size = result?;
                Ok(csi::NodeExpandVolumeResponse {
                    capacity_bytes: size as i64,
                })
            })
            .await
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use node_service_capability::rpc::Type;
        let capabilities = [
            Type::StageUnstageVolume,
            Type::ExpandVolume,
            Type::GetVolumeStats,
            Type::VolumeCondition,
            Type::SingleNodeMultiWriter,
        ]
        .into_iter()
        .map(|t| csi::NodeServiceCapability {
            r#type: Some(node_service_capability::Type::Rpc(node_service_capability::Rpc {
                r#type: t as i32,
            })),
        })
        .collect();
        Ok(Response::new(csi::NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: self.0.volumes.node_id().to_string(),
            max_volumes_per_node: self.0.max_volumes_per_node,
            accessible_topology: Some(csi::Topology {
                segments: self.0.volumes.topology().into_iter().collect(),
            }),
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};
    use std::sync::Arc;

    use tonic::{Code, Request};

    use super::*;
    use crate::backend::{Backend, LoopBackend};
    use crate::health::Health;
    use crate::host::Host;
    use crate::host::fake::{FakeCommands, FakeSyscalls};
    use crate::k8s::fixtures::{self as k8s, Uses};
    use crate::k8s::mock_api::{MockApi, get, ok};
    use crate::k8s::{Checker, OwnerCheck};
    use crate::locks::VolumeLocks;
    use crate::metrics::Metrics;
    use crate::model::{ClassName, Token, VolumeId};
    use crate::proto::csi::v1::node_server::Node as _;
    use crate::volume::Volumes;

    struct Node {
        service: NodeService,
        commands: Arc<FakeCommands>,
        syscalls: FakeSyscalls,
        dir: tempfile::TempDir,
    }

    fn node(checker: Checker) -> Node {
        node_on(
            checker,
            Arc::new(FakeCommands::default()),
            FakeSyscalls::default(),
        )
    }

    /// The node on a fake machine of its own (`host::fake::loop_machine`: one that
    /// attaches loop devices and formats them).
    fn node_on(checker: Checker, commands: Arc<FakeCommands>, syscalls: FakeSyscalls) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let host = Host {
            commands: commands.clone(),
            syscalls: Arc::new(syscalls.clone()),
        };
        let class = ClassName::parse("default").unwrap();
        let backend = LoopBackend::new(class.clone(), dir.path().join("loop"), 1 << 30, host.clone());
        let volumes = Arc::new(Volumes::new(
            vec![Backend::Loop(backend)],
            class,
            BTreeMap::new(),
            host,
            k8s::NODE.to_string(),
        ));
        let driver = Driver {
            health: Arc::new(Health::new(Arc::clone(&volumes))),
            volumes,
            locks: VolumeLocks::default(),
            metrics: Metrics::new(),
            owner_check: OwnerCheck::On(Arc::new(checker)),
            resize: Default::default(),
            max_volumes_per_node: 0,
            volume_states: Default::default(),
            roots: crate::request::KubeletRoots::new(vec![dir.path().to_path_buf()]),
        };
        Node {
            service: NodeService(Arc::new(driver)),
            commands,
            syscalls,
            dir,
        }
    }

    fn volume_id() -> String {
        VolumeId::new(ClassName::parse("default").unwrap(), Token::for_name("pvc-1")).to_string()
    }

    /// The node calls on volume_id() as kubelet makes them, at the paths `staging` and
    /// `target` in the node's directory, with `context` as the volume context.
    impl Node {
        fn path(&self, name: &str) -> String {
            self.dir.path().join(name).display().to_string()
        }

        async fn stage(&self, context: HashMap<String, String>) -> Result<(), Status> {
            let request = csi::NodeStageVolumeRequest {
                volume_id: volume_id(),
                staging_target_path: self.path("staging"),
                volume_capability: capability(),
                volume_context: context,
                ..Default::default()
            };
            self.service
                .node_stage_volume(Request::new(request))
                .await
                .map(drop)
        }

        async fn publish(&self, context: HashMap<String, String>) -> Result<(), Status> {
            let request = csi::NodePublishVolumeRequest {
                volume_id: volume_id(),
                staging_target_path: self.path("staging"),
                target_path: self.path("target"),
                volume_capability: capability(),
                volume_context: context,
                ..Default::default()
            };
            self.service
                .node_publish_volume(Request::new(request))
                .await
                .map(drop)
        }

        async fn unpublish(&self) -> Result<(), Status> {
            let request = csi::NodeUnpublishVolumeRequest {
                volume_id: volume_id(),
                target_path: self.path("target"),
            };
            self.service
                .node_unpublish_volume(Request::new(request))
                .await
                .map(drop)
        }

        async fn unstage(&self) -> Result<(), Status> {
            let request = csi::NodeUnstageVolumeRequest {
                volume_id: volume_id(),
                staging_target_path: self.path("staging"),
            };
            self.service
                .node_unstage_volume(Request::new(request))
                .await
                .map(drop)
        }

        async fn stats(&self) -> Result<csi::NodeGetVolumeStatsResponse, Status> {
            let request = csi::NodeGetVolumeStatsRequest {
                volume_id: volume_id(),
                volume_path: self.path("target"),
                staging_target_path: String::new(),
            };
            Ok(self
                .service
                .node_get_volume_stats(Request::new(request))
                .await?
                .into_inner())
        }
    }

    fn capability() -> Option<csi::VolumeCapability> {
        use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
        Some(csi::VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
        })
    }

    fn claim_context() -> HashMap<String, String> {
        [
            ("csi.storage.k8s.io/pvc/name", "web-0-data"),
            ("csi.storage.k8s.io/pvc/namespace", k8s::NS),
            ("csi.storage.k8s.io/pod.name", "web-0"),
            ("csi.storage.k8s.io/pod.namespace", k8s::NS),
            ("csi.storage.k8s.io/pod.uid", "uid-a"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    #[tokio::test]
    async fn a_refused_stage_or_publish_changes_nothing_on_the_host() {
        let claim = k8s::pvc("web-0-data", "pvc-1", None, None);
        let pod = k8s::pod("web-0", "uid-a", k8s::NODE, &[Uses::Ephemeral("data")]);
        let (client, server) = MockApi::scripted(vec![
            get(k8s::pvc_uri("web-0-data"), ok(&claim)),
            get(k8s::pvc_uri("web-0-data"), ok(&claim)),
            get(k8s::pod_uri("web-0"), ok(&pod)),
            k8s::event("Pod", "web-0", vec![]),
            k8s::event("PersistentVolumeClaim", "web-0-data", vec![]),
        ]);
        let node = node(k8s::checker(client, vec![pod.clone()], true));
        let target = node.dir.path().join("target");
        let status = node.publish(claim_context()).await.unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition, "{}", status.message());
        assert!(
            status.message().contains("apps/web-0-data"),
            "{}",
            status.message()
        );
        assert!(node.commands.calls().is_empty(), "{:?}", node.commands.calls());
        assert!(node.syscalls.calls().is_empty(), "{:?}", node.syscalls.calls());
        assert!(!target.exists());
        drop(node);
        server.finish().await;
    }

    #[tokio::test]
    async fn an_encrypted_volume_that_does_not_open_warns_on_its_claim() {
        let claim = k8s::pvc("web-0-data", "pvc-1", None, None);
        let (client, server) = MockApi::scripted(vec![
            get(k8s::pvc_uri("web-0-data"), ok(&claim)),
            k8s::event_for(
                "EncryptedVolumeNotOpened",
                "PersistentVolumeClaim",
                "web-0-data",
                vec!["is encrypted", "passphrase"],
            ),
        ]);
        let node = node(k8s::checker(client, vec![], true));
        let backend = node.service.0.volumes.backends().next().unwrap();
        std::fs::create_dir_all(node.dir.path().join("loop")).unwrap();
        node.syscalls.set_usage(crate::host::FsUsage {
            total_bytes: 1 << 30,
            available_bytes: 1 << 30,
            ..Default::default()
        });
        backend
            .create(&crate::backend::CreateSpec {
                token: Token::for_name("pvc-1"),
                name: "pvc-1".into(),
                size_bytes: 64 << 20,
                mode: crate::model::VolumeMode::Filesystem,
                fs_type: None,
                claim: Default::default(),
                encryption: Some(crate::model::Encryption {
                    allow_discards: false,
                }),
            })
            .await
            .unwrap();
        let status = node.stage(claim_context()).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
        assert!(node.commands.calls().is_empty(), "{:?}", node.commands.calls());
        drop(node);
        server.finish().await;
    }

    #[tokio::test]
    async fn unstage_unpublish_and_stats_never_ask_the_api() {
        // No request is scripted and the cache never synced: any API use would fail.
        let (client, server) = MockApi::scripted(vec![]);
        let node = node(k8s::checker(client, vec![], false));
        node.unpublish().await.unwrap();
        let unstage = node.unstage().await;
        assert!(unstage.is_ok(), "{unstage:?}");
        let stats = node.stats().await.unwrap_err();
        assert_eq!(stats.code(), Code::NotFound, "{}", stats.message());
        // While stage, with a claim, needs the synced cache.
        let stage = node.stage(claim_context()).await.unwrap_err();
        assert_eq!(stage.code(), Code::Unavailable, "{}", stage.message());
        drop(node);
        server.finish().await;
    }

    /// NodeGetVolumeStats finding the volume abnormal, then healthy again: one event on
    /// the claim the volume was made for at each change (none for the first healthy
    /// answer, none for the same state asked again), and the volume's health series.
    #[tokio::test]
    async fn a_change_of_a_volumes_condition_is_an_event_on_its_claim() {
        let (client, server) = MockApi::scripted(vec![]);
        let (commands, syscalls) =
            crate::host::fake::loop_machine(std::path::Path::new("/dev/loop-fake7"), 0);
        let node = node_on(k8s::checker(client, vec![], true), commands, syscalls);
        let driver = &node.service.0;
        let backend = driver.volumes.backends().next().unwrap();
        std::fs::create_dir_all(node.dir.path().join("loop")).unwrap();
        let claim = crate::model::ClaimRef {
            pvc_name: Some("web-0-data".into()),
            pvc_namespace: Some(k8s::NS.into()),
            pv_name: Some("pvc-1".into()),
        };
        backend
            .create(&crate::backend::CreateSpec {
                token: Token::for_name("pvc-1"),
                name: "pvc-1".into(),
                size_bytes: 64 << 20,
                mode: crate::model::VolumeMode::Filesystem,
                fs_type: None,
                claim,
                encryption: None,
            })
            .await
            .unwrap();
        // Staged and published with no claim in the context (no owner check): the
        // claim the events name is the one the volume was made for.
        std::fs::create_dir_all(node.dir.path().join("staging")).unwrap();
        node.stage(HashMap::new()).await.unwrap();
        node.publish(HashMap::new()).await.unwrap();
        let stats = || async { node.stats().await.unwrap().volume_condition.unwrap() };
        let series = |status: &str| {
            let text = driver.metrics.render();
            let series = format!(
                r#"localvol_volume_health{{device_class="default",namespace="{}",persistentvolumeclaim="web-0-data",status="{status}",volume_id="{}"}} "#,
                k8s::NS,
                volume_id()
            );
            text.lines()
                .find_map(|l| l.strip_prefix(series.as_str()).map(str::to_string))
                .unwrap_or_else(|| format!("no {series} in {text}"))
        };
        let disk = |available_bytes| crate::host::FsUsage {
            total_bytes: 100 << 30,
            available_bytes,
            ..crate::host::FsUsage::default()
        };

        for _ in 0..2 {
            assert!(!stats().await.abnormal);
        }
        assert_eq!((series("healthy"), series("abnormal")), ("1".into(), "0".into()));
        server
            .assert_no_request_within(std::time::Duration::from_millis(100))
            .await;

        let abnormal = server.expect(k8s::event_for(
            "VolumeConditionAbnormal",
            "PersistentVolumeClaim",
            "web-0-data",
            vec![&format!("volume {} is abnormal: ", volume_id()), "is full"],
        ));
        node.syscalls.set_usage(disk(0));
        for _ in 0..2 {
            assert!(stats().await.abnormal);
        }
        abnormal.asked().await;
        assert_eq!((series("healthy"), series("abnormal")), ("0".into(), "1".into()));

        let healthy = server.expect(k8s::event_of(
            "Normal",
            "VolumeConditionHealthy",
            "PersistentVolumeClaim",
            "web-0-data",
            vec!["is healthy again"],
        ));
        node.syscalls.set_usage(disk(50 << 30));
        assert!(!stats().await.abnormal);
        healthy.asked().await;
        assert_eq!(series("healthy"), "1");

        // Deleted: its series go.
        node.unpublish().await.unwrap();
        node.unstage().await.unwrap();
        use crate::proto::csi::v1::controller_server::Controller as _;
        super::super::controller::ControllerService(node.service.0.clone())
            .delete_volume(Request::new(csi::DeleteVolumeRequest {
                volume_id: volume_id(),
                ..Default::default()
            }))
            .await
            .unwrap();
        assert!(!driver.metrics.render().contains("localvol_volume_health{"));
        drop(node);
        server.finish().await;
    }
}
