//! lvm-thin snapshots, restores and clones: all thin snapshots in the class's pool.
//!
//! - **A snapshot** is a thin snapshot of the volume's thin LV, named `s+<LV name of
//!   its token>` (a volume's LV name never contains `+` but in the hashed `lv+` form, so
//!   the two never collide), read-only and flagged activation-skip: it is never
//!   activated, a restore takes a thin snapshot of it without reading it. Its tags
//!   record it ([`snapshot_tags`]): `snapshot-class` (not `class`, so no volume lookup
//!   ever takes it for a volume), the CreateSnapshot name, the source volume's token,
//!   the creation time, the source's size, mode and filesystem, and the source's format
//!   mark. One lvcreate commits the LV and all its tags in one metadata update: a
//!   snapshot LV exists complete or not at all, and a killed call leaves nothing half
//!   made.
//! - **A restore or a clone** is a thin snapshot of the snapshot or volume, writable
//!   and not activation-skip, tagged as a new volume plus [`tags::PENDING`]; it is
//!   `lvextend`ed when the requested size is larger, and becomes a volume when
//!   `lvchange --deltag` drops the pending tag. A create that finds the LV still
//!   pending (the daemon was killed) removes it and starts again, as for a thick block
//!   volume. A filesystem copy made larger than its source also gets
//!   [`tags::GROW_FILESYSTEM`] in that lvcreate: the filesystem inside still has the
//!   source's size, and the first stage grows it, then drops the tag.
//!
//! **Consistency.** No FIFREEZE here: to take a thin snapshot, lvcreate suspends the
//! origin's device-mapper device with its filesystem locked (`lockfs`), which makes the
//! kernel freeze the mounted filesystem (flushing what was written) and thaw it on
//! resume, inside the one lvcreate (milliseconds). Known gap: lvcreate killed inside
//! that window (a container kill takes the whole process group) leaves the origin
//! suspended until `dmsetup resume`; start-up does not look for that yet.
//!
//! **Independence.** Thin snapshots share blocks but not existence: a volume with
//! snapshots can be deleted (its snapshots stay restorable), a snapshot a volume was
//! restored from can be deleted (the volume keeps its data).
//!
//! **Capacity.** A snapshot promises no writes: it is left out of the virtual sizes the
//! overprovision limit counts. What it holds is blocks of its source's, shared until
//! the source overwrites them; the pool's data usage (store usage, metrics) counts
//! each block once, as the pool holds it, the kept old ones included.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::{info, warn};

use super::report::Lv;
use super::vg::stderr;
use super::{Layout, Lookup, LvmBackend, LvmError, lvm_command, tags};
use crate::backend::{BackendError, CopySource, CreateSpec, SnapshotRecord, SnapshotSpec, VolumeRecord};
use crate::model::{ClassName, SnapshotId, Token, VolumeId, VolumeMode};

const SNAPSHOT_CLASS: &str = "snapshot-class";
const SOURCE: &str = "source";
const CREATED: &str = "created";
const SOURCE_SIZE: &str = "source-size";

/// A snapshot LV of any class (one that promises no writes).
pub fn is_snapshot(lv: &Lv) -> bool {
    tags::value(lv, SNAPSHOT_CLASS).is_some()
}

/// The LV name of a snapshot.
pub fn snapshot_lv_name(token: &Token, vg: &str) -> String {
    format!("s+{}", tags::lv_name(token, vg))
}

/// The format mark a copy of `lv` inherits: the one `lv` carries, if any, with the
/// filesystem UUID beside it (the copy's filesystem is `lv`'s, so it proves itself the
/// same way).
fn format_mark(lv: &Lv) -> Vec<String> {
    let mark = [tags::FORMATTED, tags::FORMATTING]
        .into_iter()
        .find(|t| lv.has_tag(t));
    let uuid = mark.and(tags::whole(lv, tags::FS_UUID));
    mark.map(str::to_string).into_iter().chain(uuid).collect()
}

/// The tags of a new snapshot of `source` (an LV of `record`).
pub fn snapshot_tags(
    class: &ClassName,
    spec: &SnapshotSpec,
    source: &Lv,
    record: &VolumeRecord,
    created: SystemTime,
) -> Vec<String> {
    let nanos = created.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    let mut all = vec![
        tags::tag(SNAPSHOT_CLASS, class.as_str()),
        tags::tag(tags::NAME, &spec.name),
        tags::tag(SOURCE, spec.source.as_str()),
        tags::tag(CREATED, &nanos.to_string()),
        tags::tag(SOURCE_SIZE, &source.size.to_string()),
        tags::tag(tags::MODE, tags::mode_str(record.mode)),
    ];
    if let Some(fs) = record.fs_type {
        all.push(tags::tag(tags::FS, fs.as_str()));
    }
    all.extend(format_mark(source));
    all
}

/// What a snapshot LV is to a class.
#[derive(Debug, Clone, PartialEq)]
pub enum SnapshotOwnership {
    Foreign,
    Ours(SnapshotRecord),
    Corrupt(String),
}

/// Reads an LV's tags as a snapshot of `class`.
pub fn snapshot_ownership(class: &ClassName, vg: &str, lv: &Lv) -> SnapshotOwnership {
    let decoded = |key: &str| -> Result<Option<String>, String> {
        tags::value(lv, key)
            .map(|v| {
                tags::decode(v).ok_or_else(|| format!("tag {}{key} has an invalid value {v:?}", tags::PREFIX))
            })
            .transpose()
    };
    if decoded(SNAPSHOT_CLASS).ok().flatten().as_deref() != Some(class.as_str()) {
        return SnapshotOwnership::Foreign;
    }
    let record = (|| {
        let required = |key: &str| decoded(key)?.ok_or(format!("no {key} tag"));
        let number = |key: &str| -> Result<u64, String> {
            let text = required(key)?;
            text.parse()
                .map_err(|_| format!("{key} tag {text:?} is not a number"))
        };
        let name = required(tags::NAME)?;
        let token = Token::for_name(&name);
        if snapshot_lv_name(&token, vg) != lv.name {
            return Err(format!("its name tag {name:?} belongs to another LV name"));
        }
        let source = required(SOURCE)?;
        let source = Token::parse(&source).ok_or(format!("source tag {source:?} is not a volume token"))?;
        Ok(SnapshotRecord {
            id: SnapshotId::new(class.clone(), token),
            name,
            source: VolumeId::new(class.clone(), source),
            size_bytes: number(SOURCE_SIZE)?,
            created: UNIX_EPOCH + Duration::from_nanos(number(CREATED)?),
            mode: tags::parse_mode(decoded(tags::MODE)?.as_deref())?,
            fs_type: tags::parse_fs(decoded(tags::FS)?)?,
        })
    })();
    match record {
        Ok(record) => SnapshotOwnership::Ours(record),
        Err(reason) => SnapshotOwnership::Corrupt(format!("LV {vg}/{}: {reason}", lv.name)),
    }
}

impl LvmBackend {
    /// Whether the class makes snapshots: thin classes only (a thick LV could only be
    /// copied in full).
    pub fn snapshots(&self) -> bool {
        matches!(self.settings.layout, Layout::Thin { .. })
    }

    /// The snapshot `token`'s LV and record, if this class has it.
    fn find_snapshot<'a>(
        &self,
        state: &'a super::VgState,
        token: &Token,
    ) -> Result<Option<(&'a Lv, SnapshotRecord)>, BackendError> {
        let Some(lv) = state.lv(&snapshot_lv_name(token, self.vg_name())) else {
            return Ok(None);
        };
        match snapshot_ownership(&self.class, self.vg_name(), lv) {
            SnapshotOwnership::Foreign => Ok(None),
            SnapshotOwnership::Ours(record) => Ok(Some((lv, record))),
            SnapshotOwnership::Corrupt(reason) => Err(BackendError::CorruptRecord {
                token: token.to_string(),
                path: self.device_path(lv),
                reason,
            }),
        }
    }

    pub async fn get_snapshot(&self, token: &Token) -> Result<Option<SnapshotRecord>, BackendError> {
        let state = self.vg.known_state().await?;
        Ok(self.find_snapshot(&state, token)?.map(|(_, record)| record))
    }

    /// Every snapshot of the class, from one report.
    pub async fn list_snapshots(&self) -> Result<Vec<SnapshotRecord>, BackendError> {
        let state = self.vg.state().await?;
        let mut all = Vec::new();
        for lv in &state.lvs {
            match snapshot_ownership(&self.class, self.vg_name(), lv) {
                SnapshotOwnership::Ours(record) => all.push(record),
                SnapshotOwnership::Corrupt(reason) => warn!(class = %self.class, %reason, "skipping an LV"),
                SnapshotOwnership::Foreign => {}
            }
        }
        all.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(all)
    }

    /// A thin snapshot of the volume; an existing snapshot of that token is returned as
    /// is. `spec.freeze` is not used: lvcreate's own suspend freezes the filesystem.
    pub async fn create_snapshot(&self, spec: &SnapshotSpec) -> Result<SnapshotRecord, BackendError> {
        let _allocation = self.vg.allocation.lock().await;
        let state = self.vg.known_state().await?;
        if let Some((_, record)) = self.find_snapshot(&state, &spec.token)? {
            return Ok(record);
        }
        let lv = snapshot_lv_name(&spec.token, self.vg_name());
        if state.lv(&lv).is_some() {
            return Err(self.name_taken(&lv));
        }
        let Lookup::Ready(source, record) = self.lookup(&state, &spec.source)? else {
            return Err(BackendError::NotFound {
                class: self.class.clone(),
                token: spec.source.clone(),
            });
        };
        // A snapshot shares the pool's data: one past its critical fill takes none, as
        // it takes no new volume (the source's next writes would fail both). Judged on
        // the report capacity reads, as a create is: the pool's fill changes behind
        // localvol's back.
        self.check_usable(&*self.vg.state().await?).await?;
        let created = SystemTime::now();
        let tags = snapshot_tags(&self.class, spec, source, &record, created);
        let mut cmd = lvm_command("lvcreate").args(["-y", "-s", "-ky", "-pr", "-n", &lv]);
        for tag in &tags {
            cmd = cmd.arg("--addtag").arg(tag);
        }
        let cmd = cmd.arg(self.target(&source.name));
        let made = Lv {
            name: lv.clone(),
            vg: self.vg.name.clone(),
            size: source.size,
            attr: "Vri---tz-k".to_string(),
            tags,
            pool: source.pool.clone(),
            data_percent: None,
            path: None,
        };
        self.vg
            .change_known(cmd, |state| state.created(made, 0))
            .await
            .map_err(|e| self.create_failed(&lv, source.size, e))?;
        info!(class = %self.class, snapshot = %lv, source = %source.name, "took a thin snapshot");
        let state = self.vg.known_state().await?;
        self.find_snapshot(&state, &spec.token)?
            .map(|(_, record)| record)
            .ok_or_else(|| BackendError::SnapshotNotFound {
                class: self.class.clone(),
                token: spec.token.clone(),
            })
    }

    /// Removes the snapshot's LV; one that does not exist is already deleted.
    pub async fn delete_snapshot(&self, token: &Token) -> Result<(), BackendError> {
        let state = self.vg.known_state().await?;
        let lv = snapshot_lv_name(token, self.vg_name());
        match self.find_snapshot(&state, token) {
            Ok(Some(_)) | Err(BackendError::CorruptRecord { .. }) => self.remove_lv(&lv, token).await,
            Ok(None) if state.lv(&lv).is_some() => {
                info!(lv = %lv, "the LV of this name is not this class's snapshot: nothing to delete");
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// A new volume as a thin snapshot of a snapshot or a volume, made writable, grown
    /// to the spec's size and then marked a finished volume.
    pub async fn create_from(
        &self,
        spec: &CreateSpec,
        source: &CopySource,
    ) -> Result<VolumeRecord, BackendError> {
        let allocation = self.vg.allocation.lock().await;
        let lv = tags::lv_name(&spec.token, self.vg_name());
        let mut state = self.vg.known_state().await?;
        match self.lookup(&state, &spec.token)? {
            Lookup::Ready(_, record) => return Ok(record),
            Lookup::Foreign => return Err(self.name_taken(&lv)),
            Lookup::Pending => {
                warn!(class = %self.class, lv = %lv, "removing a copy whose creation did not finish");
                self.remove_lv(&lv, &spec.token).await?;
                state = self.vg.known_state().await?;
            }
            Lookup::Absent => {}
        }
        let (origin, source_mode) = match source {
            CopySource::Snapshot(token) => match self.find_snapshot(&state, token)? {
                Some((lv, record)) => (lv.clone(), record.mode),
                None => {
                    return Err(BackendError::SnapshotNotFound {
                        class: self.class.clone(),
                        token: token.clone(),
                    });
                }
            },
            CopySource::Volume { token, .. } => match self.lookup(&state, token)? {
                Lookup::Ready(lv, record) => (lv.clone(), record.mode),
                _ => {
                    return Err(BackendError::NotFound {
                        class: self.class.clone(),
                        token: token.clone(),
                    });
                }
            },
        };
        self.check_room(&state, spec.size_bytes)?;
        self.check_block_zeroing(&state, spec.mode)?;
        let mut cmd = lvm_command("lvcreate").args(["-y", "-s", "-kn", "-prw", "-n", &lv]);
        for tag in copy_tags(&self.class, spec, &origin, source_mode) {
            cmd = cmd.arg("--addtag").arg(tag);
        }
        let cmd = cmd.arg(self.target(&origin.name));
        self.vg
            .change(cmd)
            .await
            .map_err(|e| self.create_failed(&lv, spec.size_bytes, e))?;
        drop(allocation);
        let finished = self.finish_copy(spec, &lv, origin.size).await;
        self.settle_new_lv(&spec.token, &lv, finished).await
    }

    /// Grows a new copy to the spec's size and drops its pending tag.
    async fn finish_copy(&self, spec: &CreateSpec, lv: &str, origin_size: u64) -> Result<(), BackendError> {
        if spec.size_bytes > origin_size {
            let cmd = lvm_command("lvextend")
                .arg("-L")
                .arg(format!("{}b", spec.size_bytes))
                .arg(self.target(lv));
            self.vg
                .change(cmd)
                .await
                .map_err(|e| self.failed("lvextend", lv, e))?;
        }
        let cmd = lvm_command("lvchange")
            .args(["--deltag", tags::PENDING])
            .arg(self.target(lv));
        self.vg
            .change_known(cmd, |state| state.retagged(lv, &[tags::PENDING], &[]))
            .await
            .map_err(|e| self.failed("lvchange --deltag", lv, e))
    }

    /// The volume's [`VolumeRecord::filesystem_grow_pending`](crate::backend::VolumeRecord)
    /// (the LV's [`tags::GROW_FILESYSTEM`]).
    #[cfg(test)]
    pub async fn filesystem_grow_pending(&self, token: &Token) -> Result<bool, BackendError> {
        Ok(self.get(token).await?.is_some_and(|r| r.filesystem_grow_pending))
    }

    /// Drops [`tags::GROW_FILESYSTEM`]; nothing to do without it.
    pub async fn filesystem_grown(&self, token: &Token) -> Result<(), BackendError> {
        let lv = self.ready_lv(token).await?;
        if !lv.has_tag(tags::GROW_FILESYSTEM) {
            return Ok(());
        }
        self.retag(&lv.name, &[tags::GROW_FILESYSTEM], &[]).await
    }

    /// Refuses a thin LV of `size` virtual bytes beyond the overprovision limit.
    fn check_room(&self, state: &super::VgState, size: u64) -> Result<(), BackendError> {
        let available = self.capacity_of(state)?.available;
        if size > available {
            return Err(self.no_space(size, available));
        }
        Ok(())
    }

    fn name_taken(&self, lv: &str) -> BackendError {
        LvmError::NameTaken {
            vg: self.vg.name.clone(),
            lv: lv.to_string(),
            class: self.class.clone(),
        }
        .into()
    }

    fn create_failed(&self, lv: &str, size: u64, e: crate::host::CommandError) -> BackendError {
        if stderr::is_no_space(e.stderr()) {
            self.no_space(size, 0)
        } else if stderr::is_name_taken(e.stderr()) {
            self.name_taken(lv)
        } else {
            self.failed("lvcreate", lv, e)
        }
    }
}

/// The tags of a restore or clone: a new volume's, pending until grown, with the
/// origin's format mark when both are of one mode (so the first stage keeps the
/// filesystem, or formats over an unfinished one, as it would the origin), and
/// [`tags::GROW_FILESYSTEM`] on a filesystem copy larger than its origin.
pub(super) fn copy_tags(
    class: &ClassName,
    spec: &CreateSpec,
    origin: &Lv,
    origin_mode: VolumeMode,
) -> Vec<String> {
    let mut all = tags::volume_tags(class, spec);
    all.push(tags::PENDING.to_string());
    // An encrypted block volume's LUKS header carries the mark as a filesystem does.
    if spec.mode == origin_mode {
        all.extend(format_mark(origin));
    }
    if spec.mode == VolumeMode::Filesystem && spec.size_bytes > origin.size {
        all.push(tags::GROW_FILESYSTEM.to_string());
    }
    all
}
