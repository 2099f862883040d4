//! The paths kubelet names, as node operations make and remove them: the staging and
//! target directories, the file a raw block volume is bound onto.

use std::path::Path;

use tracing::warn;

use super::{VolumeError, io_error};
use crate::model::{ValidationError, VolumeId};

pub(super) async fn create_dir(path: &Path) -> Result<(), VolumeError> {
    use std::os::unix::fs::DirBuilderExt;
    let owned = path.to_path_buf();
    crate::host::blocking::run(move || {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(&owned)
    })
    .await
    .map_err(|e| io_error("mkdir", path)(std::io::Error::other(e)))?
    .map_err(io_error("mkdir", path))
}

pub(super) async fn create_file(path: &Path) -> Result<(), VolumeError> {
    let owned = path.to_path_buf();
    crate::host::blocking::run(move || {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&owned)
            .map(drop)
    })
    .await
    .map_err(|e| io_error("create", path)(std::io::Error::other(e)))?
    .map_err(io_error("create", path))
}

/// Whether nothing can be mounted below `path`: it does not exist, or it is an empty
/// directory or a plain file (a mount point below a path is an entry of a directory
/// below it). `false` whenever that cannot be seen.
pub(super) async fn nothing_below(path: &Path) -> bool {
    let owned = path.to_path_buf();
    crate::host::blocking::run(move || match std::fs::symlink_metadata(&owned) {
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        Ok(meta) if meta.is_file() => true,
        Ok(meta) if meta.is_dir() => {
            std::fs::read_dir(&owned).is_ok_and(|mut entries| entries.next().is_none())
        }
        Ok(_) => false,
    })
    .await
    .unwrap_or(false)
}

/// Removes a target publish made: an empty directory, or the empty file a raw block
/// volume's node was bound onto. Anything else (content, another kind of file, a mount
/// point of another namespace's making) is left where it is: directories are shared
/// across mount namespaces, and a removal cannot be undone. Gone is fine.
///
/// `volume` is the volume unpublished and its device number: a path whose directory is
/// on that device is inside the volume's own filesystem (below its staging path or a
/// target), which publish never makes a target of (it refuses a target below the
/// staging path); it is refused as INVALID_ARGUMENT and left as it is, tenant data.
pub(super) async fn remove_target(path: &Path, volume: Option<(&VolumeId, u64)>) -> Result<(), VolumeError> {
    let owned = path.to_path_buf();
    let volume = volume.map(|(id, dev)| (id.clone(), dev));
    // One blocking step for the checks and the removal.
    crate::host::blocking::run(move || remove_target_blocking(&owned, volume))
        .await
        .map_err(|e| io_error("remove", path)(std::io::Error::other(e)))?
}

fn remove_target_blocking(path: &Path, volume: Option<(VolumeId, u64)>) -> Result<(), VolumeError> {
    use std::os::unix::fs::MetadataExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error("stat", path)(e)),
    };
    let parent = path.parent().unwrap_or(Path::new("/"));
    let parent_dev = std::fs::symlink_metadata(parent)
        .map_err(io_error("stat", parent))?
        .dev();
    if let Some((id, _)) = volume.filter(|(_, dev)| *dev == parent_dev) {
        return Err(VolumeError::Invalid(ValidationError::Invalid {
            field: "target_path",
            reason: format!(
                "{} is inside the filesystem of volume {id}, where no target of it can be",
                path.display()
            ),
        }));
    }
    let leave = |why: &str| {
        warn!(path = %path.display(), "leaving the target in place: {why}");
        Ok(())
    };
    if meta.dev() != parent_dev {
        return leave("it is the root of a mount this namespace does not see");
    }
    let result = if meta.is_dir() {
        // rmdir itself refuses a directory with anything in it.
        std::fs::remove_dir(path)
    } else if meta.is_file() && meta.len() == 0 {
        std::fs::remove_file(path)
    } else {
        return leave("publish makes only empty directories and empty files");
    };
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => leave("it is not empty"),
        Err(e) => Err(io_error("remove", path)(e)),
    }
}
