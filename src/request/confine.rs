//! Where node calls may act: paths below kubelet's root directories, spelled one way.
//!
//! This is the lexical half of confinement, decided from the request alone. The other
//! half needs the filesystem and the mount table (no symlink along the path, nothing
//! mounted there that is not this volume) and lives with the operations in `volume`.

use std::path::{Path, PathBuf};

use super::{MAX_PATH_LEN, invalid};
use crate::model::ValidationError;

/// The directories node calls may stage and publish below (`--kubelet-root-dir`).
/// A root itself is never a staging or target path: mounting over it would hide
/// everything kubelet keeps there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletRoots(Vec<PathBuf>);

impl KubeletRoots {
    /// `roots` are absolute and normalised (checked by the configuration).
    pub fn new(roots: Vec<PathBuf>) -> Self {
        Self(roots)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Path> {
        self.0.iter().map(PathBuf::as_path)
    }

    /// The root `path` lies strictly below, compared component by component (so
    /// `/var/lib/kubelet2` is not below `/var/lib/kubelet`).
    pub fn root_of(&self, path: &Path) -> Option<&Path> {
        self.iter().find(|root| path.starts_with(root) && path != *root)
    }

    fn describe(&self) -> String {
        self.iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A path from kubelet: absolute and normalised (no `.`/`..`/empty components), so it
/// names exactly one place. Symlinks along it are checked where it is used.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPath(PathBuf);

impl HostPath {
    /// The lexical checks alone; [`HostPath::confined`] adds the roots.
    pub fn parse(field: &'static str, raw: &str) -> Result<Self, ValidationError> {
        if raw.is_empty() {
            return Err(ValidationError::Missing { field });
        }
        if raw.len() > MAX_PATH_LEN || raw.chars().any(char::is_control) {
            return Err(invalid(
                field,
                "longer than 4096 bytes or contains a control character",
            ));
        }
        if !raw.starts_with('/') {
            return Err(invalid(field, format!("{raw:?} is not an absolute path")));
        }
        let trimmed = raw.trim_end_matches('/');
        if trimmed.is_empty() || trimmed.contains("//") {
            return Err(invalid(field, format!("{raw:?} is not a normalised path")));
        }
        // Raw segments, not Path::components(), which silently drops interior `.`.
        if trimmed
            .split('/')
            .any(|segment| segment == "." || segment == "..")
        {
            return Err(invalid(field, format!("{raw:?} contains '.' or '..'")));
        }
        Ok(Self(PathBuf::from(trimmed)))
    }

    /// A staging or target path: lexically valid and strictly below one of `roots`.
    pub fn confined(field: &'static str, raw: &str, roots: &KubeletRoots) -> Result<Self, ValidationError> {
        let path = Self::parse(field, raw)?;
        if roots.root_of(path.as_path()).is_none() {
            return Err(invalid(
                field,
                format!(
                    "{raw:?} is not below kubelet's root directory ({}; --kubelet-root-dir)",
                    roots.describe()
                ),
            ));
        }
        Ok(path)
    }

    pub fn as_path(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for HostPath {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roots() -> KubeletRoots {
        KubeletRoots::new(vec!["/var/lib/kubelet".into(), "/srv/k".into()])
    }

    #[test]
    fn only_paths_strictly_below_a_root_are_confined() {
        let ok = |raw| HostPath::confined("p", raw, &roots()).map(|p| p.as_path().to_path_buf());
        assert_eq!(
            ok("/var/lib/kubelet/pods/u/volumes/x/mount/").unwrap(),
            Path::new("/var/lib/kubelet/pods/u/volumes/x/mount")
        );
        assert!(ok("/srv/k/stage").is_ok());
        for bad in [
            "/etc",
            "/dev",
            "/proc",
            "/",
            "/var/lib/kubelet",
            "/var/lib/kubelet/",
            "/var/lib/kubelet2/pods",
            "/var/lib",
            "/var/lib/kubelet/../../../etc",
            "/var/lib/kubelet/./pods",
            "/var/lib/kubelet//pods",
            "var/lib/kubelet/pods",
            "/var/lib/kubelet/pods\u{1}x",
            "/var/lib/kubelet/a\0b",
        ] {
            assert!(
                matches!(ok(bad), Err(ValidationError::Invalid { .. })),
                "{bad:?} accepted"
            );
        }
        assert!(matches!(ok(""), Err(ValidationError::Missing { .. })));
    }
}
