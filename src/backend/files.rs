//! Small record files next to a backend's data: written atomically and durably.

use std::path::{Path, PathBuf};

use super::BackendError;
use crate::model::Token;

/// Writes a file atomically: temporary file (mode 0600), fsync, rename, fsync of the
/// directory. After a crash the file holds either the old or the new contents.
pub async fn write_atomically(dir: &Path, path: &Path, contents: Vec<u8>) -> Result<(), BackendError> {
    let path = path.to_path_buf();
    let dir = dir.to_path_buf();
    let spawn_dir = dir.clone();
    let started = std::time::Instant::now();
    let written = tokio::task::spawn_blocking(move || {
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
    .await
    .map_err(|e| BackendError::io("spawn", spawn_dir.clone())(std::io::Error::other(e)))?;
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
    let bytes = match tokio::fs::read(&path).await {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(BackendError::io("read", path)(e)),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| BackendError::CorruptRecord {
            token: token.to_string(),
            path,
            reason: e.to_string(),
        })
}

/// Removes a file and makes the removal durable; a missing file is already removed.
pub async fn remove_durably(dir: &Path, path: &Path) -> Result<(), BackendError> {
    match tokio::fs::remove_file(path).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(BackendError::io("unlink", path)(e)),
    }
    let owned: PathBuf = dir.to_path_buf();
    tokio::task::spawn_blocking(move || sync_dir(&owned))
        .await
        .map_err(|e| BackendError::io("spawn", dir)(std::io::Error::other(e)))?
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
    let mut entries = tokio::fs::read_dir(dir)
        .await
        .map_err(BackendError::io("readdir", dir))?;
    let mut tokens = Vec::new();
    while let Some(entry) = entries
        .next_entry()
        .await
        .map_err(BackendError::io("readdir", dir))?
    {
        let name = entry.file_name();
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
