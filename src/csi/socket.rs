//! Unix sockets that nobody but root can reach, from the moment they exist.
//!
//! The socket is bound inside a fresh 0700 directory, chmod-ed to 0600, and only then
//! renamed to its public path: there is no window in which another user could connect.
//! A stale socket (nobody listening) is replaced; a live one means another localvol is
//! serving, which is an error.

use std::future::Future;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::{Stream, StreamExt};

use super::authority::NormalizedStream;

#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("another process is already serving on {0}")]
    Live(PathBuf),
    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    #[error("endpoint {0:?} must be unix:///absolute/path or an absolute path")]
    BadEndpoint(String),
    #[error("{op} {path}: {source}", path = path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> SocketError {
    let path = path.to_path_buf();
    move |source| SocketError::Io { op, path, source }
}

/// `unix:///run/x.sock`, `unix:/run/x.sock` or `/run/x.sock` → `/run/x.sock`.
pub fn endpoint_path(endpoint: &str) -> Result<PathBuf, SocketError> {
    let raw = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    if raw.starts_with('/') && raw.len() > 1 && !raw.contains('\0') {
        Ok(PathBuf::from(raw))
    } else {
        Err(SocketError::BadEndpoint(endpoint.to_string()))
    }
}

fn clear_stale(path: &Path) -> Result<(), SocketError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err("stat", path)(e)),
    };
    if !meta.file_type().is_socket() {
        return Err(SocketError::NotASocket(path.to_path_buf()));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(SocketError::Live(path.to_path_buf())),
        Err(_) => std::fs::remove_file(path).map_err(io_err("remove stale socket", path)),
    }
}

/// Binds a listener at `path` with mode 0600.
pub fn bind_private(path: &Path) -> Result<UnixListener, SocketError> {
    let parent = path
        .parent()
        .ok_or_else(|| SocketError::BadEndpoint(path.display().to_string()))?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(parent)
        .map_err(io_err("mkdir", parent))?;
    clear_stale(path)?;
    let file_name = path
        .file_name()
        .ok_or_else(|| SocketError::BadEndpoint(path.display().to_string()))?;
    let private_dir = parent.join(format!(
        ".{}.bind-{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&private_dir);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private_dir)
        .map_err(io_err("mkdir", &private_dir))?;
    let result = (|| {
        let temporary = private_dir.join("sock");
        let listener = UnixListener::bind(&temporary).map_err(io_err("bind", &temporary))?;
        std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o600))
            .map_err(io_err("chmod", &temporary))?;
        std::fs::rename(&temporary, path).map_err(io_err("rename", path))?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir(&private_dir);
    result
}

/// The connections a gRPC server on `listener` serves: each read through
/// [`NormalizedStream`], so that h2 takes whatever `:authority` the client sends.
/// Every unix socket localvol serves is served from this.
fn incoming(listener: UnixListener) -> impl Stream<Item = io::Result<NormalizedStream<UnixStream>>> {
    UnixListenerStream::new(listener).map(|accepted| accepted.map(NormalizedStream::new))
}

/// `router` served on a private socket at `path`: bound now ([`bind_private`]), serving
/// once awaited, until `shutdown` resolves.
pub fn serve<F: Future<Output = ()>>(
    path: &Path,
    router: tonic::transport::server::Router,
    shutdown: F,
) -> Result<impl Future<Output = Result<(), tonic::transport::Error>> + use<F>, SocketError> {
    let listener = bind_private(path)?;
    Ok(router.serve_with_incoming_shutdown(incoming(listener), shutdown))
}

/// A gRPC channel to the server listening on the unix socket at `path`: the client side
/// of [`bind_private`], for `localvol status` and tests. The URI is a placeholder that
/// tonic needs; every connection goes to `path`.
pub async fn connect(path: &Path) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        assert_eq!(
            endpoint_path("unix:///run/a.sock").unwrap(),
            Path::new("/run/a.sock")
        );
        assert_eq!(
            endpoint_path("unix:/run/a.sock").unwrap(),
            Path::new("/run/a.sock")
        );
        assert_eq!(endpoint_path("/run/a.sock").unwrap(), Path::new("/run/a.sock"));
        for bad in ["tcp://1.2.3.4:5", "unix://relative", "", "unix://"] {
            assert!(endpoint_path(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn socket_is_private_and_stale_ones_are_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        let first = bind_private(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A live socket is not taken over.
        assert!(matches!(bind_private(&path), Err(SocketError::Live(_))));
        drop(first);
        // Nobody listens now: the stale socket is replaced. Other tests of this process
        // spawn commands, and a child between fork and exec briefly holds a copy of
        // every descriptor, the dropped listener's too: allow it a moment to let go.
        let mut second = bind_private(&path);
        for _ in 0..100 {
            if !matches!(second, Err(SocketError::Live(_))) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            second = bind_private(&path);
        }
        let _second = second.unwrap();
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary left"
        );
    }

    #[test]
    fn a_regular_file_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        std::fs::write(&path, b"data").unwrap();
        assert!(matches!(bind_private(&path), Err(SocketError::NotASocket(_))));
        assert_eq!(std::fs::read(&path).unwrap(), b"data");
    }
}
