//! Small record files next to a backend's data: written atomically and durably.

use std::path::{Path, PathBuf};

use super::BackendError;
use crate::model::Token;

/// Runs `f` where blocking is allowed ([`crate::host::blocking::run`]): where the
/// backends' file work leaves the async workers; `path` names the failure if the task
/// itself is lost.
pub async fn blocking<T: Send + 'static>(
    path: &Path,
    f: impl FnOnce() -> Result<T, BackendError> + Send + 'static,
) -> Result<T, BackendError> {
    crate::host::blocking::run(f)
        .await
        .map_err(|e| BackendError::io("spawn", path)(std::io::Error::other(e)))?
}

/// [`sync_dir`] where blocking is allowed.
pub async fn sync_dir_async(dir: &Path) -> Result<(), BackendError> {
    let owned = dir.to_path_buf();
    blocking(dir, move || sync_dir(&owned)).await
}

/// Writes a file atomically: temporary file (mode 0600), fsync, rename, fsync of the
/// directory. After a crash the file holds either the old or the new contents.
pub async fn write_atomically(dir: &Path, path: &Path, contents: Vec<u8>) -> Result<(), BackendError> {
    let path = path.to_path_buf();
    let dir = dir.to_path_buf();
    let spawn_dir = dir.clone();
    let started = std::time::Instant::now();
    let written = blocking(&spawn_dir, move || {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let tmp = path.with_extension("json.tmp");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(BackendError::io("create", &tmp))?;
        file.write_all(&contents)
            .map_err(BackendError::io("write", &tmp))?;
        file.sync_all().map_err(BackendError::io("fsync", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(BackendError::io("rename", &path))?;
        sync_dir(&dir)
    })
    .await;
    // Two fsyncs: on a node whose disk is busy, the likeliest slow step of a node call.
    tracing::debug!(dir = %spawn_dir.display(), elapsed_us = started.elapsed().as_micros() as u64,
        ok = written.is_ok(), "record written");
    written
}

/// Reads a JSON record; `None` when there is none. A record that does not parse is
/// [`BackendError::CorruptRecord`], never taken for absent.
pub async fn read_json<T: serde::de::DeserializeOwned>(
    path: PathBuf,
    token: &Token,
) -> Result<Option<T>, BackendError> {
    let owned = path.clone();
    let read = blocking(&path, move || Ok(std::fs::read(owned))).await?;
    match read {
        Ok(bytes) => parse_json(&bytes, path, token).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(BackendError::io("read", path)(e)),
    }
}

fn parse_json<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    path: PathBuf,
    token: &Token,
) -> Result<T, BackendError> {
    serde_json::from_slice(bytes).map_err(|e| BackendError::CorruptRecord {
        token: token.to_string(),
        path,
        reason: e.to_string(),
    })
}

/// Every `<token>.json` record in `dir` with its token, as [`read_json`] reads each,
/// in one trip to the blocking pool. A class's capacity and its listing read all of
/// them; a trip per record is a thread hand-off per volume (tens of microseconds
/// idle, far more on a busy node), taken one after another. A record removed between
/// the directory read and its own is skipped, as a concurrent delete means.
pub async fn read_all_json<T>(dir: &Path) -> Result<Vec<(Token, T)>, BackendError>
where
    T: serde::de::DeserializeOwned + Send + 'static,
{
    let owned = dir.to_path_buf();
    blocking(dir, move || {
        let mut records = Vec::new();
        for token in record_tokens_blocking(&owned)? {
            let path = owned.join(format!("{token}.json"));
            match std::fs::read(&path) {
                Ok(bytes) => {
                    let record = parse_json(&bytes, path, &token)?;
                    records.push((token, record));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(BackendError::io("read", path)(e)),
            }
        }
        Ok(records)
    })
    .await
}

/// The space each file in `dir` takes on disk (its allocated blocks; 0 for a file
/// that is gone), in one trip to the blocking pool (see [`read_all_json`]).
pub async fn allocated_bytes_of(dir: &Path, paths: Vec<PathBuf>) -> Result<Vec<u64>, BackendError> {
    use std::os::unix::fs::MetadataExt;
    blocking(dir, move || {
        Ok(paths
            .iter()
            .map(|p| std::fs::metadata(p).map_or(0, |m| m.blocks() * 512))
            .collect())
    })
    .await
}

/// Removes a file and makes the removal durable; a missing file is already removed.
pub async fn remove_durably(dir: &Path, path: &Path) -> Result<(), BackendError> {
    match tokio::fs::remove_file(path).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(BackendError::io("unlink", path)(e)),
    }
    sync_dir_async(dir).await
}

/// Creates a directory (and its parents) with owner-only access.
pub async fn create_private_dir(dir: &Path) -> Result<(), BackendError> {
    use std::os::unix::fs::PermissionsExt;
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(BackendError::io("mkdir", dir))?;
    tokio::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .await
        .map_err(BackendError::io("chmod", dir))
}

pub fn sync_dir(dir: &Path) -> Result<(), BackendError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(BackendError::io("fsync", dir))
}

/// The tokens of the `<token>.json` records in `dir` (other files are not records).
pub async fn record_tokens(dir: &Path) -> Result<Vec<Token>, BackendError> {
    let owned = dir.to_path_buf();
    blocking(dir, move || record_tokens_blocking(&owned)).await
}

fn record_tokens_blocking(dir: &Path) -> Result<Vec<Token>, BackendError> {
    let mut tokens = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(BackendError::io("readdir", dir))? {
        let name = entry.map_err(BackendError::io("readdir", dir))?.file_name();
        if let Some(token) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".json"))
            .and_then(Token::parse)
        {
            tokens.push(token);
        }
    }
    Ok(tokens)
}
