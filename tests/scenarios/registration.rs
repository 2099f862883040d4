//! Scenario 1: the DaemonSet is Ready and the node's kubelet has registered localvol
//! (its CSINode lists the driver with the topology key), by the registration the run
//! deployed: the daemon's own (builtin, the shipped overlays) or the
//! node-driver-registrar sidecar's. On the loop class the other registration's overlay
//! replaces the deployment, registers again, and the run's own overlay comes back.
//! Elsewhere (the guest's LVM and PMEM classes) no overlay pair exists: the run's
//! registration alone, said in a note.
//!
//! Cost: a few seconds on a deployed node; the loop class's two rollouts about 30 s on
//! the host's cluster.

use std::path::{Path, PathBuf};
use std::time::Duration;

use localvol::model::DRIVER_NAME;

use crate::run::{Result, Run, test_overlay};

/// How kubelet learns of the driver: the socket the daemon itself serves in kubelet's
/// plugin registry, or the node-driver-registrar sidecar's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Registration {
    Builtin,
    Sidecar,
}

impl Registration {
    /// REGISTRATION, as tests/cluster/run.sh and tests/vm/cluster-guest.sh set it.
    fn from_env() -> Result<Self> {
        match std::env::var("REGISTRATION").as_deref() {
            Ok("builtin") | Err(_) => Ok(Self::Builtin),
            Ok("sidecar") => Ok(Self::Sidecar),
            Ok(other) => Err(format!("REGISTRATION {other}: builtin or sidecar").into()),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Builtin => "builtin",
            Self::Sidecar => "sidecar",
        }
    }

    /// The other registration and its overlay (tests/cluster/overlays), where the class
    /// has such a pair: the loop class only.
    fn other(self, class_kind: &str) -> Option<(Self, PathBuf)> {
        if class_kind != "loop" {
            return None;
        }
        Some(match self {
            Self::Builtin => (Self::Sidecar, test_overlay("registrar")),
            Self::Sidecar => (Self::Builtin, test_overlay("builtin")),
        })
    }
}

pub async fn registered(run: Run) -> Result {
    let own = Registration::from_env()?;
    registered_by(&run, own).await?;
    let Some((other, other_overlay)) = own.other(&run.class_kind) else {
        run.note(&format!(
            "NOTE s1: {} registration only: no overlay with the other registration for class {}",
            own.name(),
            run.device_class
        ));
        return Ok(());
    };
    let own_overlay = run.own_overlay()?.to_path_buf();
    // registered_by waits out the rollout: the DaemonSet Ready at its new generation.
    run.apply_overlay(&other_overlay).await?;
    registered_by(&run, other).await?;
    run.apply_overlay(&own_overlay).await?;
    registered_by(&run, own).await
}

/// The DaemonSet Ready, kubelet's CSINode listing the driver, the daemon pod as the
/// registration makes it, and kubelet's log free of stream errors with the driver.
async fn registered_by(run: &Run, registration: Registration) -> Result {
    let what = registration.name();
    run.wait_for(
        &format!("DaemonSet Ready ({what})"),
        Duration::from_secs(120),
        || async { Ok(run.daemon_ready().await?.then_some(())) },
    )
    .await?;
    run.wait_for(
        &format!(
            "CSINode {} lists {DRIVER_NAME} with topology.localvol.csi.dev/node ({what})",
            run.node
        ),
        Duration::from_secs(60),
        || async { Ok(run.registered().await?.then_some(())) },
    )
    .await?;

    let pod = run
        .daemon_pods()
        .await?
        .into_iter()
        .next()
        .ok_or("no daemon pod")?;
    let containers: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter().map(|c| c.name.clone()))
        .collect();
    run.note(&format!("daemon pod containers: {}", containers.join(" ")));
    let has_registrar = containers.iter().any(|c| c == "node-driver-registrar");
    match registration {
        Registration::Builtin => {
            if has_registrar {
                return Err("the builtin overlay runs the registrar sidecar".into());
            }
            let socket = format!("/var/lib/kubelet/plugins_registry/{DRIVER_NAME}-reg.sock");
            let is_socket = std::fs::metadata(&socket)
                .map(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
                .unwrap_or(false);
            if !is_socket {
                return Err(format!("no registration socket of localvol on the node ({socket})").into());
            }
        }
        Registration::Sidecar => {
            if !has_registrar {
                return Err("the sidecar overlay lacks node-driver-registrar".into());
            }
        }
    }
    let log = kubelet_log()?;
    if let Some(line) = stream_errors(&log) {
        return Err(format!("kubelet.log has stream errors talking to {DRIVER_NAME}: {line}").into());
    }
    Ok(())
}

/// kubelet's log on this node (the kit's KUBE_KIT_STATE/logs).
fn kubelet_log() -> Result<String> {
    let state = std::env::var("KUBE_KIT_STATE")
        .map_err(|_| "KUBE_KIT_STATE must name the node's kube-kit state (the shell entry exports it)")?;
    let path = Path::new(&state).join("logs/kubelet.log");
    std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()).into())
}

/// A line among the last 200 of kubelet's log that names the driver and reports an
/// HTTP/2 stream error (a registration or CSI call reset mid-stream).
fn stream_errors(log: &str) -> Option<&str> {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(200)..]
        .iter()
        .copied()
        .filter(|l| l.to_ascii_lowercase().contains(DRIVER_NAME))
        .find(|l| l.contains("RST_STREAM") || l.contains("PROTOCOL_ERROR"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_errors_only_in_the_last_lines_naming_the_driver() {
        let old = format!("E0101 csi_plugin: {DRIVER_NAME}: RST_STREAM\n");
        let filler = "I0101 something else\n".repeat(200);
        assert_eq!(
            stream_errors(&format!("{old}{filler}")),
            None,
            "older than 200 lines"
        );
        let other = "E0101 other.csi.dev: PROTOCOL_ERROR\n";
        assert_eq!(
            stream_errors(&format!("{filler}{other}")),
            None,
            "another driver's"
        );
        let recent = format!("{filler}E0101 registering {DRIVER_NAME}: stream error PROTOCOL_ERROR\n");
        assert!(stream_errors(&recent).is_some_and(|l| l.contains("PROTOCOL_ERROR")));
    }

    #[test]
    fn the_other_registration_only_on_loop() {
        assert_eq!(Registration::Builtin.other("lvm-thin"), None);
        let (other, overlay) = Registration::Builtin.other("loop").unwrap();
        assert_eq!(other, Registration::Sidecar);
        assert!(
            overlay.ends_with("tests/cluster/overlays/registrar"),
            "{overlay:?}"
        );
        assert!(overlay.join("kustomization.yaml").exists(), "{overlay:?}");
        let (back, overlay) = Registration::Sidecar.other("loop").unwrap();
        assert_eq!(back, Registration::Builtin);
        assert!(overlay.join("kustomization.yaml").exists(), "{overlay:?}");
    }
}
