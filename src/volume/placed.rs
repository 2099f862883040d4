//! The paths this daemon staged and published each volume at, by its own mounts: what
//! the mount table cannot say.
//!
//! A staging mount and a bind of it at a target are the same mount of the same
//! filesystem root; mountinfo shows them alike in every field but the mount id (device,
//! root `/`, source, options, peer group), so an ownership proof alone lets
//! NodeUnpublishVolume take the staging path for a target, and NodeUnstageVolume a target
//! for the staging path. This record tells them apart without any assumption about where
//! kubelet keeps either path.
//!
//! A path is recorded only when this daemon mounted (or, raw block, attached) the volume
//! there itself, never when a call found it done already (a request could name a
//! publication as its staging path and be answered "already staged"), and forgotten when
//! the unstage or unpublish of that path succeeds, or the volume is deleted.
//!
//! With a directory ([`PlacedPaths::load`]) the record outlives the daemon: one small
//! file per volume, rewritten under the volume's lock at each change, so that a daemon
//! restarted with volumes staged and published still tells a stage from a publication.
//! Mounts do not outlive a reboot, so neither must these files: they are written
//! without fsync (the page cache outlives a killed daemon), and a file that does not read
//! back whole (torn by a power cut) is dropped with a warning. A record left by a reboot
//! names paths where kubelet stages and publishes the same volumes again, in the same
//! roles, and is forgotten by their unstage and unpublish.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use tracing::{error, warn};

use super::{VolumeError, io_error};
use crate::model::{ValidationError, VolumeId};

/// What a path is to a volume, as this daemon made it: where NodeStageVolume mounted
/// (raw block: attached) it, or where NodePublishVolume bound it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Stage,
    Publication,
}

impl Role {
    /// The word of a record file's line.
    fn word(self) -> &'static str {
        match self {
            Role::Stage => "stage",
            Role::Publication => "publication",
        }
    }

    fn from_word(word: &[u8]) -> Option<Self> {
        match word {
            b"stage" => Some(Role::Stage),
            b"publication" => Some(Role::Publication),
            _ => None,
        }
    }
}

type Placements = BTreeMap<PathBuf, (VolumeId, Role)>;

/// Keyed by path: two volumes cannot be mounted at one path at once.
#[derive(Debug, Default)]
pub(super) struct PlacedPaths {
    paths: Mutex<Placements>,
    /// Where each volume's record is kept across restarts; `None`: in memory only.
    dir: Option<PathBuf>,
}

impl PlacedPaths {
    /// The record kept in `dir` (made on the first write), as an earlier daemon left it.
    pub(super) fn load(dir: PathBuf) -> Result<Self, VolumeError> {
        let mut paths = Placements::new();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Self {
                    paths: Mutex::new(paths),
                    dir: Some(dir),
                });
            }
            Err(e) => return Err(io_error("read", &dir)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(io_error("read", &dir))?;
            let name = entry.file_name();
            let path = entry.path();
            // A write cut short (the daemon killed between writing and renaming) leaves
            // its temporary file: never a record, and nobody else's to keep.
            if name.as_bytes().starts_with(b".") {
                match std::fs::remove_file(&path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(io_error("remove", &path)(e));
                    }
                    _ => continue,
                }
            }
            let contents = std::fs::read(&path).map_err(io_error("read", &path))?;
            match parse_record(&name, &contents) {
                Some((id, placed)) => {
                    for (at, role) in placed {
                        paths.insert(at, (id.clone(), role));
                    }
                }
                None => warn!(
                    file = %path.display(),
                    "dropping a record of staged and published paths that does not read back; \
                     its volume's paths are proven from the mount table alone until staged or published again"
                ),
            }
        }
        Ok(Self {
            paths: Mutex::new(paths),
            dir: Some(dir),
        })
    }

    fn paths(&self) -> std::sync::MutexGuard<'_, Placements> {
        self.paths.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that this daemon made `path` the volume's stage or a publication of it.
    /// The caller holds the volume's lock.
    pub(super) async fn place(&self, id: &VolumeId, path: &Path, role: Role) {
        self.paths().insert(path.to_path_buf(), (id.clone(), role));
        self.save(id).await;
    }

    /// Forgets `path` as the volume's `role` once the unstage or unpublish of it
    /// succeeded. The caller holds the volume's lock.
    pub(super) async fn unplace(&self, id: &VolumeId, path: &Path, role: Role) {
        let removed = {
            let mut paths = self.paths();
            let ours = paths.get(path).is_some_and(|(i, r)| i == id && *r == role);
            ours && paths.remove(path).is_some()
        };
        if removed {
            self.save(id).await;
        }
    }

    /// Forgets every path of a deleted volume. The caller holds the volume's lock.
    pub(super) async fn forget(&self, id: &VolumeId) {
        let had_any = {
            let mut paths = self.paths();
            let before = paths.len();
            paths.retain(|_, (i, _)| i != id);
            paths.len() != before
        };
        if had_any {
            self.save(id).await;
        }
    }

    /// Writes the volume's record as it is in memory now; none left: its file is
    /// removed. A failure leaves the record in memory only, and says so: after a restart
    /// the volume's paths would be proven from the mount table alone.
    async fn save(&self, id: &VolumeId) {
        let Some(dir) = &self.dir else { return };
        let contents = record_of(&self.paths(), id);
        let file = dir.join(id.to_string());
        let dir = dir.clone();
        let written = crate::host::blocking::run(move || write_record(&dir, &file, contents)).await;
        let failure = match written {
            Ok(Ok(())) => return,
            Ok(Err(e)) => crate::model::full_message(&e),
            Err(e) => e.to_string(),
        };
        error!(
            volume_id = %id,
            reason = %failure,
            "could not keep the record of where this volume is staged and published; \
             it is held in memory, and after a restart its paths are proven from the mount table alone"
        );
    }

    /// Whether this daemon made `path` the volume's `role` (and has not undone it).
    pub(super) fn is(&self, id: &VolumeId, path: &Path, role: Role) -> bool {
        self.paths().get(path).is_some_and(|(i, r)| i == id && *r == role)
    }

    /// Refuses a call that names, as its `field`, a path this daemon made the volume's
    /// `other` role: NodeUnpublishVolume at the staging path, NodeUnstageVolume or
    /// NodeStageVolume at a target. INVALID_ARGUMENT, naming the volume and the path; the
    /// caller checks this before it touches the host.
    pub(super) fn refuse_role(
        &self,
        id: &VolumeId,
        path: &Path,
        field: &'static str,
        other: Role,
    ) -> Result<(), VolumeError> {
        let role = self
            .paths()
            .get(path)
            .filter(|(i, _)| i == id)
            .map(|(_, role)| *role);
        if role != Some(other) {
            return Ok(());
        }
        let path = path.display();
        let reason = match other {
            Role::Stage => format!(
                "{path} is where volume {id} is staged, not a target it is published at; \
                 NodeUnstageVolume undoes a stage"
            ),
            Role::Publication => format!(
                "{path} is a target volume {id} is published at, not where it is staged; \
                 NodeUnpublishVolume undoes a publish"
            ),
        };
        Err(VolumeError::Invalid(ValidationError::Invalid { field, reason }))
    }

    /// Refuses, as its `field`, a path strictly below one this daemon staged or published
    /// any volume at: inside a volume's filesystem (or a raw block volume's staging
    /// directory), where kubelet makes no staging or target path and where a stage or
    /// publish would make a directory and mount over tenant data, and an unpublish would
    /// remove an empty directory or file of the tenant's. INVALID_ARGUMENT, before
    /// anything is touched.
    pub(super) fn refuse_inside(&self, field: &'static str, path: &Path) -> Result<(), VolumeError> {
        let paths = self.paths();
        let Some((placed_at, (id, role))) = path.ancestors().skip(1).find_map(|a| paths.get_key_value(a))
        else {
            return Ok(());
        };
        let role = match role {
            Role::Stage => "staged",
            Role::Publication => "published",
        };
        Err(VolumeError::Invalid(ValidationError::Invalid {
            field,
            reason: format!(
                "{} is inside {}, where volume {id} is {role}",
                path.display(),
                placed_at.display()
            ),
        }))
    }
}

/// A volume's record file: a line `stage PATH` or `publication PATH` per path. Staging
/// and target paths are confined (request::confine): absolute, without control
/// characters, so a line holds one whole path.
fn record_of(paths: &Placements, id: &VolumeId) -> Vec<u8> {
    let mut contents = Vec::new();
    for (path, (_, role)) in paths.iter().filter(|(_, (i, _))| i == id) {
        contents.extend_from_slice(role.word().as_bytes());
        contents.push(b' ');
        contents.extend_from_slice(path.as_os_str().as_bytes());
        contents.push(b'\n');
    }
    contents
}

/// The volume named by the file and its paths; `None` when the file is not a record
/// as [`record_of`] writes it, whole.
fn parse_record(name: &OsStr, contents: &[u8]) -> Option<(VolumeId, Vec<(PathBuf, Role)>)> {
    let id = VolumeId::parse(name.to_str()?).ok()?;
    let lines = contents.strip_suffix(b"\n")?;
    let mut placed = Vec::new();
    for line in lines.split(|b| *b == b'\n') {
        let space = line.iter().position(|b| *b == b' ')?;
        let role = Role::from_word(&line[..space])?;
        let path = Path::new(OsStr::from_bytes(&line[space + 1..]));
        if !path.is_absolute() || line[space + 1..].iter().any(u8::is_ascii_control) {
            return None;
        }
        placed.push((path.to_path_buf(), role));
    }
    Some((id, placed))
}

/// Replaces `file` with `contents` (a temporary file renamed over it), or removes it
/// when `contents` is empty. No fsync: see the module's comment.
fn write_record(dir: &Path, file: &Path, contents: Vec<u8>) -> Result<(), VolumeError> {
    let name = file.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp"));
    if contents.is_empty() {
        // The temporary file too: one left by a write cut short is this volume's.
        for path in [file, tmp.as_path()] {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io_error("remove", path)(e));
                }
                _ => {}
            }
        }
        return Ok(());
    }
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io_error("create", dir))?;
    }
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_error("create", &tmp))?;
        std::io::Write::write_all(&mut f, &contents).map_err(io_error("write", &tmp))?;
    }
    std::fs::rename(&tmp, file).map_err(io_error("rename", file))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> VolumeId {
        VolumeId::parse(&format!("default.{name}")).unwrap()
    }

    fn refused(placed: &PlacedPaths, v: &VolumeId, path: &str, other: Role) -> bool {
        placed
            .refuse_role(v, Path::new(path), "target_path", other)
            .is_err()
    }

    #[tokio::test]
    async fn the_record_outlives_the_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let records = dir.path().join("placed");
        let (a, b) = (id("a"), id("b"));
        let first = PlacedPaths::load(records.clone()).unwrap();
        first.place(&a, Path::new("/k/stage/a"), Role::Stage).await;
        first
            .place(&a, Path::new("/k/pods/1/mount"), Role::Publication)
            .await;
        first.place(&b, Path::new("/k/stage/b"), Role::Stage).await;
        first.unplace(&b, Path::new("/k/stage/b"), Role::Stage).await;

        // A restarted daemon.
        let second = PlacedPaths::load(records.clone()).unwrap();
        assert!(
            refused(&second, &a, "/k/stage/a", Role::Stage),
            "unpublish at A's stage"
        );
        assert!(
            refused(&second, &a, "/k/pods/1/mount", Role::Publication),
            "unstage at A's target"
        );
        assert!(
            !refused(&second, &b, "/k/stage/b", Role::Stage),
            "B's stage was forgotten"
        );
        assert!(
            second
                .refuse_inside("target_path", Path::new("/k/stage/a/x"))
                .is_err()
        );
        assert_eq!(
            std::fs::read(records.join("default.a")).unwrap(),
            b"publication /k/pods/1/mount\nstage /k/stage/a\n"
        );
        assert!(
            !records.join("default.b").exists(),
            "no file for a volume with no paths"
        );
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&records).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o700);

        // Deleted: nothing of it is left, in memory or on disk.
        second.forget(&a).await;
        assert!(!refused(&second, &a, "/k/stage/a", Role::Stage));
        assert_eq!(std::fs::read_dir(&records).unwrap().count(), 0);
        let third = PlacedPaths::load(records).unwrap();
        assert!(!refused(&third, &a, "/k/stage/a", Role::Stage));
    }

    #[tokio::test]
    async fn a_missing_directory_is_an_empty_record_made_on_the_first_write() {
        let dir = tempfile::tempdir().unwrap();
        let records = dir.path().join("placed");
        let placed = PlacedPaths::load(records.clone()).unwrap();
        assert!(!records.exists(), "loading makes nothing");
        placed.place(&id("a"), Path::new("/k/stage/a"), Role::Stage).await;
        assert!(records.join("default.a").is_file());
    }

    #[test]
    fn files_that_do_not_read_back_whole_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let records = dir.path();
        let good = b"stage /k/stage/c\n";
        std::fs::write(records.join("default.c"), good).unwrap();
        for (name, contents) in [
            ("default.torn", &b"stage /k/stage/t"[..]),      // no final newline
            ("default.empty", b""),                          // cut at zero length
            ("default.word", b"mounted /k/x\n"),             // not a role
            ("default.relative", b"stage k/x\n"),            // not absolute
            ("default.control", b"stage /k/\tx\n"),          // a control character
            ("not-a-volume-id..", b"stage /k/stage/n\n"),    // not a volume id
            (".default.c.tmp", b"publication /k/stage/c\n"), // a write cut short
        ] {
            std::fs::write(records.join(name), contents).unwrap();
        }
        let placed = PlacedPaths::load(records.to_path_buf()).unwrap();
        let paths = placed.paths();
        assert_eq!(paths.len(), 1, "{paths:?}");
        assert_eq!(paths.get(Path::new("/k/stage/c")), Some(&(id("c"), Role::Stage)));
        assert!(
            !records.join(".default.c.tmp").exists(),
            "a write cut short leaves nothing once the record is loaded"
        );
    }

    /// A daemon killed between writing a record's temporary file and renaming it: the
    /// volume's deletion leaves nothing of it, even without a restart in between.
    #[tokio::test]
    async fn a_write_cut_short_leaves_nothing_once_the_volume_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let records = dir.path().join("placed");
        let placed = PlacedPaths::load(records.clone()).unwrap();
        placed.place(&id("a"), Path::new("/k/stage/a"), Role::Stage).await;
        std::fs::write(records.join(".default.a.tmp"), b"stage /k/stage/a\n").unwrap();
        placed.forget(&id("a")).await;
        assert_eq!(std::fs::read_dir(&records).unwrap().count(), 0);
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let mut paths = Placements::new();
        paths.insert("/k/a b/stage".into(), (id("a"), Role::Stage));
        paths.insert("/k/pods/1/mount".into(), (id("a"), Role::Publication));
        paths.insert("/k/other".into(), (id("b"), Role::Stage));
        let contents = record_of(&paths, &id("a"));
        let (read_id, placed) = parse_record(OsStr::new("default.a"), &contents).unwrap();
        assert_eq!(read_id, id("a"));
        assert_eq!(
            placed,
            vec![
                (PathBuf::from("/k/a b/stage"), Role::Stage),
                (PathBuf::from("/k/pods/1/mount"), Role::Publication),
            ]
        );
    }
}
