//! A minimal Kubernetes API server for the benchmark: it lists `pods` pods bound to one
//! node, answers every other list with an empty one, and holds every watch open without
//! events. Enough for the daemon's caches to fill as they would on a busy node (110
//! pods, kubelet's default maximum), so its resident memory can be measured with them.
//! It speaks plain HTTP/1.1 on 127.0.0.1; the daemon reaches it through a kubeconfig.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct PodApi {
    pub kubeconfig: PathBuf,
    /// Watches of pods opened so far: the first one means the pod list is in the cache.
    pub pod_watches: Arc<AtomicUsize>,
}

/// A pod of the size a typical workload has once its status is dropped: labels, an
/// owner, two containers with environment and resources, a projected token volume and
/// a generic ephemeral volume.
fn pod(node: &str, i: usize) -> serde_json::Value {
    let env: Vec<_> = (0..8)
        .map(|e| json!({"name": format!("SETTING_{e}"), "value": format!("value-{i}-{e}")}))
        .collect();
    let container = |name: &str| {
        json!({
            "name": name,
            "image": format!("registry.example.com/team/{name}:1.{i}.0"),
            "args": ["--listen=:8080", "--log-level=info"],
            "env": env,
            "ports": [{"containerPort": 8080, "protocol": "TCP"}],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                          "limits": {"memory": "256Mi"}},
            "volumeMounts": [{"name": "data", "mountPath": "/data"},
                             {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}],
            "terminationMessagePath": "/dev/termination-log",
            "imagePullPolicy": "IfNotPresent"
        })
    };
    json!({
        "metadata": {
            "name": format!("app-{i}"),
            "namespace": format!("team-{}", i % 7),
            "uid": format!("00000000-0000-4000-8000-{i:012}"),
            "resourceVersion": format!("{}", 1000 + i),
            "labels": {"app": format!("app-{i}"), "tier": "backend", "pod-template-hash": "5d8f7c9b4"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-01T00:00:00Z"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": format!("app-{i}-5d8f7c9b4"), "uid": format!("10000000-0000-4000-8000-{i:012}"),
                                 "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {
            "nodeName": node,
            "serviceAccountName": "default",
            "containers": [container("server"), container("sidecar")],
            "volumes": [
                {"name": "data", "ephemeral": {"volumeClaimTemplate": {"spec": {
                    "accessModes": ["ReadWriteOnce"], "storageClassName": "localvol",
                    "resources": {"requests": {"storage": "1Gi"}}}}}},
                {"name": "kube-api-access", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}
            ]
        },
        "status": {"phase": "Running", "podIP": format!("10.0.{}.{}", i / 250, i % 250 + 1)}
    })
}

impl PodApi {
    pub async fn start(dir: &Path, node: &str, pods: usize) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let items: Vec<_> = (0..pods).map(|i| pod(node, i)).collect();
        let pod_list = serde_json::to_vec(&json!({
            "apiVersion": "v1", "kind": "PodList",
            "metadata": {"resourceVersion": "5000"}, "items": items
        }))
        .unwrap();
        let pod_list = Arc::new(pod_list);
        let pod_watches = Arc::new(AtomicUsize::new(0));
        let watches = Arc::clone(&pod_watches);
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                tokio::spawn(serve(stream, Arc::clone(&pod_list), Arc::clone(&watches)));
            }
        });
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: bench\n  cluster:\n    server: http://{addr}\n\
                 contexts:\n- name: bench\n  context:\n    cluster: bench\n    user: bench\n\
                 current-context: bench\nusers:\n- name: bench\n  user:\n    token: bench\n"
            ),
        )
        .unwrap();
        Self {
            kubeconfig,
            pod_watches,
        }
    }
}

/// Answers the requests of one connection (the client keeps it alive) until a watch,
/// which is then held open with no events until the client goes away.
async fn serve(mut stream: TcpStream, pod_list: Arc<Vec<u8>>, pod_watches: Arc<AtomicUsize>) {
    let mut buffer = Vec::new();
    loop {
        let Some(end) = read_head(&mut stream, &mut buffer).await else {
            return;
        };
        let head = String::from_utf8_lossy(&buffer[..end]).to_string();
        buffer.drain(..end);
        let target = head.split_whitespace().nth(1).unwrap_or("/").to_string();
        let path = target.split('?').next().unwrap_or("/");
        let is_pods = path == "/api/v1/pods";
        if target.contains("watch=true") || target.contains("watch=1") {
            if is_pods {
                pod_watches.fetch_add(1, Ordering::SeqCst);
            }
            let _ = stream
                .write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
                )
                .await;
            // Held open: reading returns only when the client closes the watch.
            let mut sink = [0u8; 64];
            while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
            return;
        }
        let body = if is_pods {
            pod_list.as_ref().clone()
        } else {
            serde_json::to_vec(&json!({
                "apiVersion": "v1", "kind": "List",
                "metadata": {"resourceVersion": "5000"}, "items": []
            }))
            .unwrap()
        };
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        if stream.write_all(response.as_bytes()).await.is_err() || stream.write_all(&body).await.is_err() {
            return;
        }
    }
}

/// Reads until a complete request head is buffered; returns its length.
async fn read_head(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(i) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(i + 4);
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
}
