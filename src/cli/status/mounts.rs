//! Where a volume is on this node: its device, read-only through the backends, and the
//! mounts of that device, split into staged and published by kubelet's path layout.

use std::path::{Component, Path, PathBuf};

use crate::backend::Backend;
use crate::host::Host;
use crate::model::{VolumeId, VolumeMode};
use crate::mount::MountTable;

/// What this node shows about one volume.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct LocalView {
    pub mode: Option<&'static str>,
    pub encryption: Option<&'static str>,
    pub device: Option<PathBuf>,
    pub staged: Vec<PathBuf>,
    pub published: Vec<PathBuf>,
}

pub(super) async fn local_view(
    volumes: &crate::volume::Volumes,
    host: &Host,
    table: &MountTable,
    id: &str,
) -> Result<LocalView, String> {
    let id = VolumeId::parse(id).map_err(|e| e.to_string())?;
    let backend: &Backend = volumes
        .backends()
        .find(|b| *b.class() == id.class)
        .ok_or_else(|| {
            format!(
                "device class {} is not in this configuration (run status with the daemon's \
                 --config); mounts unknown",
                id.class
            )
        })?;
    let record = backend
        .get(&id.token)
        .await
        .map_err(|e| crate::model::full_message(&e))?
        .ok_or_else(|| "no record on this node (deleted meanwhile?)".to_string())?;
    let mode = match record.mode {
        VolumeMode::Filesystem => "filesystem",
        VolumeMode::Block => "block",
    };
    let Some(device) = backend
        .device(&id.token)
        .await
        .map_err(|e| crate::model::full_message(&e))?
    else {
        // Not attached: neither staged nor published.
        return Ok(LocalView {
            mode: Some(mode),
            encryption: record.encryption.map(|e| e.as_str()),
            ..LocalView::default()
        });
    };
    // An encrypted volume's mounts are of its open mapping, not of the device below.
    let data = match record.encryption {
        Some(_) => crate::crypt::find(host, &crate::crypt::Mapping::for_volume(&id.to_string()), &device)
            .await
            .map_err(|e| crate::model::full_message(&e))?
            .unwrap_or_else(|| device.clone()),
        None => device.clone(),
    };
    let number = host
        .syscalls
        .device_number(&data)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{} is not a device node", data.display()))?;
    let real = tokio::fs::canonicalize(&data)
        .await
        .unwrap_or_else(|_| data.clone());
    let devtmpfs_root = Path::new("/").join(real.strip_prefix("/dev").unwrap_or(&real));
    let (staged, published) = mounts_of(table, number, &devtmpfs_root);
    Ok(LocalView {
        mode: Some(mode),
        encryption: record.encryption.map(|e| e.as_str()),
        device: Some(device),
        staged,
        published,
    })
}

/// The mounts of a device: filesystems on it (and bind mounts of them), and bind mounts
/// of its device node (`devtmpfs` with the node's name as root). Split into (staged,
/// published) by kubelet's path layout.
pub(super) fn mounts_of(
    table: &MountTable,
    device_number: u64,
    devtmpfs_root: &Path,
) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut staged = Vec::new();
    let mut published = Vec::new();
    for entry in table.entries() {
        let is_fs = entry.fs_type != "devtmpfs" && entry.device_number() == device_number;
        let is_node = entry.fs_type == "devtmpfs" && entry.root == devtmpfs_root;
        if !(is_fs || is_node) {
            continue;
        }
        let list = if is_publish_path(&entry.mount_point) {
            &mut published
        } else {
            &mut staged
        };
        if !list.contains(&entry.mount_point) {
            list.push(entry.mount_point.clone());
        }
    }
    (staged, published)
}

/// kubelet's publish targets: `.../pods/<uid>/volumes/...` (filesystem) and
/// `.../pods/<uid>/volumeDevices/...` or `.../volumeDevices/publish/...` (block).
pub(super) fn is_publish_path(path: &Path) -> bool {
    let parts: Vec<&str> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect();
    parts.windows(3).any(|w| {
        w[0] == "pods" && (w[2] == "volumes" || w[2] == "volumeDevices")
            || w[0] == "volumeDevices" && w[1] == "publish"
    })
}
