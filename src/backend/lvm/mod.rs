//! LVM backends: kind `lvm` (a thick LV per volume), kind `lvm-thin` (a thin LV per
//! volume, in one thin pool) and kind `pmem` in `lvm` mode (thick LVs in a VG built on
//! fsdax namespaces, formatted and mounted for DAX).
//!
//! **State** is read from one `lvs` JSON report per refresh (its rows carry the VG's
//! fields; `vgs` only for a VG without LVs), cached per VG and shared by every class on it ([`VolumeGroup`]). Our own lvcreate, lvremove
//! and lvchange apply their known effect to the cached report instead of forcing a
//! rescan, so a volume's lifecycle reads no report; anything else invalidates it.
//! The LV tags are the record of each volume (see [`tags`]).
//!
//! **Crash ordering.** A thick raw block LV is created with the tag `state=zeroing`
//! and becomes a volume only when that tag is removed, after the whole LV has been
//! zeroed. A create that finds such a pending LV (the daemon or lvcreate died) removes
//! it and starts again; a delete removes it too. A filesystem LV (thick or thin) is
//! created with the format mark `format=formatting`: a volume at once, formatted over
//! at its first stage whatever its device holds, and with the UUID its mkfs is given
//! (`fs-uuid`): the finished filesystem's superblock is then the only mark left, so no
//! lvchange follows mkfs. Thin LVs read zeros until written.
//!
//! **Raw block volumes never show old bytes.** Thick: the LV is zeroed before it
//! becomes a volume, and an extension is made only of extents zeroed beforehand (a
//! temporary LV takes them, is zeroed and removed, and lvextend is limited to exactly
//! those extents). Thin: the pool must zero new blocks (`lvchange -Zy`), else block
//! volumes are refused.

pub mod fuzz;
pub mod health;
mod provision;
pub mod report;
mod snapshots;
pub mod tags;
#[cfg(test)]
mod tests;
mod vg;

use std::path::PathBuf;
use std::sync::Arc;

use tracing::{info, warn};

pub use self::health::PoolHealth;
use self::report::Lv;
use self::tags::Ownership;
pub use self::vg::{CONTAINER_CONFIG, LvmError, VgState, VolumeGroup, lvm_command};
use super::{
    BackendError, ClassCapacity, FormatMark, StorageHealth, StoreUsage, ThinPoolFill, VolumeHealth,
    VolumeRecord,
};
use crate::config::PoolThresholds;
use crate::fs::FormatOptions;
use crate::host::{CommandError, CommandSpec, Host};
use crate::model::{ClassName, Token};

/// How a class lays its volumes out in the VG.
#[derive(Debug, Clone, PartialEq)]
pub enum Layout {
    Thick {
        /// Bytes of the VG never handed out (TopoLVM's `spare-gb`).
        spare_bytes: u64,
        stripes: Option<u32>,
        stripe_size: Option<String>,
    },
    Thin {
        pool: String,
        /// Thin volumes may promise up to pool size × this ratio.
        overprovision_ratio: f64,
        /// The pool's fill thresholds (see [`health`]).
        thresholds: PoolThresholds,
    },
}

/// A class's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct LvmSettings {
    /// The configured kind, for logs and metrics: `lvm`, `lvm-thin` or `pmem`.
    pub kind: &'static str,
    pub layout: Layout,
    pub lvcreate_options: Vec<String>,
    /// The VG is on PMEM: format and mount for DAX.
    pub dax: bool,
}

#[derive(Debug)]
pub struct LvmBackend {
    class: ClassName,
    settings: LvmSettings,
    vg: Arc<VolumeGroup>,
    host: Host,
    alignment: u64,
}

/// What a class finds under a volume's LV name.
enum Lookup<'a> {
    Absent,
    Foreign,
    Pending,
    Ready(&'a Lv, VolumeRecord),
}

fn align_down(bytes: u64, alignment: u64) -> u64 {
    bytes / alignment * alignment
}

impl LvmBackend {
    /// Checks the VG (and thin pool) exist and learns the extent size.
    pub async fn open(
        class: ClassName,
        settings: LvmSettings,
        vg: Arc<VolumeGroup>,
        host: Host,
    ) -> Result<Self, BackendError> {
        let state = vg.state().await?;
        let stripes =
            match &settings.layout {
                Layout::Thick { stripes, .. } => u64::from(stripes.unwrap_or(1).max(1)),
                Layout::Thin { pool, .. } => {
                    let found = state.lv(pool).filter(|l| l.is_thin_pool()).ok_or_else(|| {
                        LvmError::PoolNotFound {
                            vg: vg.name.clone(),
                            pool: pool.clone(),
                        }
                    })?;
                    if !found.zeroes_new_blocks() {
                        warn!(
                            class = %class, pool = %pool,
                            "thin pool does not zero new blocks: raw block volumes will be refused"
                        );
                    }
                    1
                }
            };
        let alignment = state.vg.extent_size.max(512) * stripes;
        info!(class = %class, vg = %vg.name, kind = settings.kind, alignment, "LVM device class ready");
        Ok(Self {
            class,
            settings,
            vg,
            host,
            alignment,
        })
    }

    pub fn class(&self) -> &ClassName {
        &self.class
    }

    pub fn kind(&self) -> &'static str {
        self.settings.kind
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    pub fn dax(&self) -> bool {
        self.settings.dax
    }

    fn vg_name(&self) -> &str {
        &self.vg.name
    }

    fn target(&self, lv: &str) -> String {
        format!("{}/{lv}", self.vg.name)
    }

    fn device_path(&self, lv: &Lv) -> PathBuf {
        lv.path
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("/dev/{}/{}", self.vg.name, lv.name)))
    }

    fn lookup<'a>(&self, state: &'a VgState, token: &Token) -> Result<Lookup<'a>, BackendError> {
        let name = tags::lv_name(token, self.vg_name());
        let Some(lv) = state.lv(&name) else {
            return Ok(Lookup::Absent);
        };
        match tags::ownership(&self.class, self.vg_name(), lv) {
            Ownership::Foreign => Ok(Lookup::Foreign),
            Ownership::Ours { pending: true, .. } => Ok(Lookup::Pending),
            Ownership::Ours { record, .. } => Ok(Lookup::Ready(lv, record)),
            Ownership::Corrupt(reason) => Err(BackendError::CorruptRecord {
                token: token.to_string(),
                path: self.device_path(lv),
                reason,
            }),
        }
    }

    fn failed(&self, op: &'static str, lv: &str, e: CommandError) -> BackendError {
        self.vg.error(op, self.target(lv), e).into()
    }

    fn no_space(&self, requested: u64, available: u64) -> BackendError {
        BackendError::NoSpace {
            class: self.class.clone(),
            requested,
            available,
        }
    }

    pub async fn get(&self, token: &Token) -> Result<Option<VolumeRecord>, BackendError> {
        let state = self.vg.known_state().await?;
        Ok(match self.lookup(&state, token)? {
            Lookup::Ready(_, record) => Some(record),
            Lookup::Absent | Lookup::Foreign | Lookup::Pending => None,
        })
    }

    pub async fn list(&self) -> Result<Vec<VolumeRecord>, BackendError> {
        let state = self.vg.state().await?;
        let mut records = Vec::new();
        for lv in &state.lvs {
            match tags::ownership(&self.class, self.vg_name(), lv) {
                Ownership::Ours {
                    record,
                    pending: false,
                } => records.push(record),
                Ownership::Corrupt(reason) => warn!(class = %self.class, %reason, "skipping an LV"),
                Ownership::Ours { .. } | Ownership::Foreign => {}
            }
        }
        records.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(records)
    }

    fn capacity_of(&self, state: &VgState) -> Result<ClassCapacity, BackendError> {
        let (total, available) =
            match &self.settings.layout {
                Layout::Thick { spare_bytes, .. } => (
                    state.vg.size.saturating_sub(*spare_bytes),
                    state.vg.free.saturating_sub(*spare_bytes),
                ),
                Layout::Thin {
                    pool,
                    overprovision_ratio,
                    ..
                } => {
                    let pool_lv = state.lv(pool).filter(|l| l.is_thin_pool()).ok_or_else(|| {
                        LvmError::PoolNotFound {
                            vg: self.vg.name.clone(),
                            pool: pool.clone(),
                        }
                    })?;
                    let promised: u64 = state
                        .lvs
                        .iter()
                        .filter(|l| l.pool.as_deref() == Some(pool.as_str()) && !snapshots::is_snapshot(l))
                        .map(|l| l.size)
                        .sum();
                    let limit = (pool_lv.size as f64 * overprovision_ratio) as u64;
                    // A pool in a critical state takes no new volume: the scheduler is
                    // told so (CSIStorageCapacity), and no claim is sent here to fail.
                    let available = match self.pool_health(state) {
                        Some(h) if h.critical().is_some() => 0,
                        _ => limit.saturating_sub(promised),
                    };
                    (limit, available)
                }
            };
        // Nor does a VG that lost a disk: its free extents may be on the missing one, and
        // a new LV's data would share the fate of a failing set of disks.
        let available = if state.vg.missing_pvs > 0 { 0 } else { available };
        let available = align_down(available, self.alignment);
        Ok(ClassCapacity {
            available,
            total,
            max_volume: available,
        })
    }

    pub async fn capacity(&self) -> Result<ClassCapacity, BackendError> {
        self.capacity_of(&*self.vg.state().await?)
    }

    /// For lvm-thin, the pool's health in `state`; `None` for a thick class, or when the
    /// pool is not in the report (which the callers refuse on their own).
    fn pool_health(&self, state: &VgState) -> Option<PoolHealth> {
        let Layout::Thin { pool, thresholds, .. } = &self.settings.layout else {
            return None;
        };
        let pool_lv = state.lv(pool).filter(|l| l.is_thin_pool())?;
        let fill = state.pools.iter().find(|p| p.name == *pool);
        Some(health::pool_health(&self.vg.name, pool_lv, fill, *thresholds))
    }

    /// Refuses a new LV in a VG missing a PV, or a pool whose state is critical, on a
    /// recent report: the cached one may predate an administrator's repair.
    async fn check_usable(&self, state: &VgState) -> Result<(), BackendError> {
        let refused =
            |s: &VgState| s.vg.missing_pvs > 0 || self.pool_health(s).is_some_and(|h| h.critical().is_some());
        if !refused(state) {
            return Ok(());
        }
        let recent = self.vg.refusal_state().await?;
        if recent.vg.missing_pvs > 0 {
            return Err(LvmError::VgPartial {
                vg: self.vg.name.clone(),
                missing: recent.vg.missing_pvs,
            }
            .into());
        }
        match (&self.settings.layout, self.pool_health(&recent)) {
            (Layout::Thin { pool, .. }, Some(PoolHealth::Critical(reason))) => Err(LvmError::PoolUnusable {
                vg: self.vg.name.clone(),
                pool: pool.clone(),
                reason,
            }
            .into()),
            _ => Ok(()),
        }
    }

    /// What is wrong under the volume, from the cached report: lvm's verdict on its LV,
    /// its thin pool's critical state, or a warning: the pool's, or its VG's missing PV
    /// (the volume's own extents are on the others, or lvm would say it partial).
    /// The report is the one capacity reads (at most a minute old): what it judges
    /// changes behind localvol's back.
    pub async fn volume_health(&self, token: &Token) -> Result<VolumeHealth, BackendError> {
        let state = self.vg.state().await?;
        let Lookup::Ready(lv, _) = self.lookup(&state, token)? else {
            return Ok(VolumeHealth::Healthy);
        };
        let pool = self.pool_health(&state);
        Ok(match health::volume_problem(&self.vg.name, lv, pool.as_ref()) {
            Some(problem) => VolumeHealth::Abnormal(problem),
            None if state.vg.missing_pvs > 0 => VolumeHealth::Warning(health::vg_missing_pvs(&state.vg)),
            None => match pool {
                Some(PoolHealth::Warning(w)) => VolumeHealth::Warning(w),
                _ => VolumeHealth::Healthy,
            },
        })
    }

    /// The VG and, for lvm-thin, its pool, from the cached report: critical for the
    /// pool's critical state, degraded for a VG missing a PV or a pool past its warning
    /// threshold.
    pub async fn storage_health(&self) -> Result<StorageHealth, BackendError> {
        let state = self.vg.state().await?;
        Ok(match self.pool_health(&state) {
            Some(PoolHealth::Critical(why)) => StorageHealth::Critical(why),
            _ if state.vg.missing_pvs > 0 => StorageHealth::Degraded(health::vg_missing_pvs(&state.vg)),
            Some(PoolHealth::Warning(why)) => StorageHealth::Degraded(why),
            Some(PoolHealth::Healthy) | None => StorageHealth::Healthy,
        })
    }

    /// The VG, or for lvm-thin the pool with its fill; `None` for an inactive pool,
    /// which reports no fill.
    pub async fn store_usage(&self) -> Result<Option<StoreUsage>, BackendError> {
        let state = self.vg.state().await?;
        let Layout::Thin { pool, .. } = &self.settings.layout else {
            return Ok(Some(StoreUsage {
                size_bytes: state.vg.size,
                used_bytes: state.vg.size.saturating_sub(state.vg.free),
                free_bytes: state.vg.free,
                thin_pool: None,
            }));
        };
        let found = state
            .pools
            .iter()
            .find(|p| p.name == *pool)
            .ok_or_else(|| LvmError::PoolNotFound {
                vg: self.vg.name.clone(),
                pool: pool.clone(),
            })?;
        let (Some(data_percent), Some(metadata_percent)) = (found.data_percent, found.metadata_percent)
        else {
            return Ok(None);
        };
        let used_bytes = ((found.size as f64 * data_percent / 100.0) as u64).min(found.size);
        Ok(Some(StoreUsage {
            size_bytes: found.size,
            used_bytes,
            free_bytes: found.size - used_bytes,
            thin_pool: Some(ThinPoolFill {
                data_percent,
                metadata_percent,
            }),
        }))
    }

    fn is_thick(&self) -> bool {
        matches!(self.settings.layout, Layout::Thick { .. })
    }

    fn stripe_args(&self, cmd: CommandSpec) -> CommandSpec {
        match &self.settings.layout {
            Layout::Thick {
                stripes, stripe_size, ..
            } => {
                let mut cmd = cmd;
                if let Some(n) = stripes.filter(|n| *n > 1) {
                    cmd = cmd.arg("-i").arg(n.to_string());
                    if let Some(size) = stripe_size {
                        cmd = cmd.arg("-I").arg(size);
                    }
                }
                cmd
            }
            Layout::Thin { .. } => cmd,
        }
    }

    /// For a thin volume, the bytes it has mapped in its pool now (size × data_percent),
    /// from a fresh report: writes and discards change it without any lvm command of
    /// ours. `None` for thick LVs, whose extents a discard does not give back.
    pub async fn allocated_bytes(&self, token: &Token) -> Result<Option<u64>, BackendError> {
        if !matches!(self.settings.layout, Layout::Thin { .. }) {
            return Ok(None);
        }
        self.vg.invalidate();
        let state = self.vg.state().await?;
        Ok(match self.lookup(&state, token)? {
            Lookup::Ready(lv, _) => lv.data_percent.map(|p| (lv.size as f64 * p / 100.0) as u64),
            _ => None,
        })
    }

    /// DAX for a VG on PMEM; `prezeroed` for a thin LV that has not one block mapped (so
    /// every block reads as zeros) in a pool that zeroes the blocks it maps. Mapped blocks
    /// are counted exactly by the thin target (`lvs` rounds data_percent to 0.01 %, which
    /// hides megabytes of a large LV): a volume written to as a raw device, or by an
    /// interrupted mkfs, has some and gets a full format.
    pub async fn format_options(&self, token: &Token) -> Result<FormatOptions, BackendError> {
        let dax = self.settings.dax;
        let Layout::Thin { pool, .. } = &self.settings.layout else {
            return Ok(FormatOptions {
                dax,
                ..FormatOptions::default()
            });
        };
        let state = self.vg.known_state().await?;
        let lv = match self.lookup(&state, token)? {
            Lookup::Ready(lv, _) if state.lv(pool).is_some_and(|p| p.zeroes_new_blocks()) => lv,
            _ => {
                return Ok(FormatOptions {
                    dax,
                    ..FormatOptions::default()
                });
            }
        };
        let cmd = CommandSpec::new("dmsetup")
            .arg("status")
            .arg(report::dm_name(&self.vg.name, &lv.name));
        let out = self
            .host
            .commands
            .run(cmd)
            .await
            .map_err(|e| self.failed("dmsetup status", &lv.name, e))?;
        let prezeroed = report::parse_thin_mapped_sectors(&out.stdout_str()) == Some(0);
        Ok(FormatOptions {
            dax,
            prezeroed,
            ..FormatOptions::default()
        })
    }

    /// The volume's LV, which must be a finished volume.
    async fn ready_lv(&self, token: &Token) -> Result<Lv, BackendError> {
        let state = self.vg.known_state().await?;
        match self.lookup(&state, token)? {
            Lookup::Ready(lv, _) => Ok(lv.clone()),
            _ => Err(BackendError::NotFound {
                class: self.class.clone(),
                token: token.clone(),
            }),
        }
    }

    /// What the LV's tags say of its filesystem ([`tags::format_mark`]); nothing to say
    /// of a volume that is not there, or not finished.
    pub async fn format_mark(&self, token: &Token) -> Result<FormatMark, BackendError> {
        let state = self.vg.known_state().await?;
        Ok(match self.lookup(&state, token)? {
            Lookup::Ready(lv, _) => tags::format_mark(lv),
            _ => FormatMark::Unknown,
        })
    }

    /// Tags the LV [`tags::FORMATTING`] before mkfs touches it (dropping a
    /// [`tags::FORMATTED`] of a filesystem someone wiped since).
    pub async fn begin_format(&self, token: &Token) -> Result<(), BackendError> {
        let lv = self.ready_lv(token).await?;
        if tags::format_unfinished(&lv) {
            return Ok(());
        }
        let remove: &[&str] = if lv.has_tag(tags::FORMATTED) {
            &[tags::FORMATTED]
        } else {
            &[]
        };
        self.retag(&lv.name, remove, &[tags::FORMATTING]).await
    }

    /// Replaces [`tags::FORMATTING`] with [`tags::FORMATTED`] in one lvchange, so the
    /// LV never has neither (which would hand the decision back to blkid). Nothing to
    /// write for an LV whose filesystem proves itself ([`FormatMark::Pending`]): the
    /// superblock mkfs wrote last is the mark.
    pub async fn mark_formatted(&self, token: &Token) -> Result<(), BackendError> {
        let lv = self.ready_lv(token).await?;
        if matches!(tags::format_mark(&lv), FormatMark::Pending(_)) {
            return Ok(());
        }
        let remove: &[&str] = if tags::format_unfinished(&lv) {
            &[tags::FORMATTING]
        } else {
            &[]
        };
        let add: &[&str] = if lv.has_tag(tags::FORMATTED) {
            &[]
        } else {
            &[tags::FORMATTED]
        };
        if remove.is_empty() && add.is_empty() {
            return Ok(());
        }
        self.retag(&lv.name, remove, add).await
    }

    /// One lvchange that removes and adds tags (the format and grow marks).
    async fn retag(&self, lv: &str, remove: &[&str], add: &[&str]) -> Result<(), BackendError> {
        let mut cmd = lvm_command("lvchange");
        for tag in remove {
            cmd = cmd.args(["--deltag", tag]);
        }
        for tag in add {
            cmd = cmd.args(["--addtag", tag]);
        }
        self.vg
            .change_known(cmd.arg(self.target(lv)), |state| state.retagged(lv, remove, add))
            .await
            .map_err(|e| self.failed("lvchange (mark)", lv, e))
    }

    pub async fn device(&self, token: &Token) -> Result<Option<PathBuf>, BackendError> {
        let state = self.vg.known_state().await?;
        Ok(match self.lookup(&state, token)? {
            Lookup::Ready(lv, _) if lv.is_active() => Some(self.device_path(lv)),
            _ => None,
        })
    }

    pub async fn attach(&self, token: &Token) -> Result<PathBuf, BackendError> {
        let state = self.vg.known_state().await?;
        let Lookup::Ready(lv, _) = self.lookup(&state, token)? else {
            return Err(BackendError::NotFound {
                class: self.class.clone(),
                token: token.clone(),
            });
        };
        if !lv.is_active() {
            let cmd = lvm_command("lvchange").arg("-ay").arg(self.target(&lv.name));
            self.vg
                .change_known(cmd, |state| state.activated(&lv.name))
                .await
                .map_err(|e| self.failed("lvchange -ay", &lv.name, e))?;
        }
        Ok(self.device_path(lv))
    }

    /// LVs stay active after unstage: deactivating buys nothing on a node-local VG and
    /// would race with an LV another stage is about to use.
    pub async fn detach(&self, _token: &Token) -> Result<(), BackendError> {
        Ok(())
    }

    /// lvextend resizes the active device itself.
    pub async fn refresh_device(&self, _token: &Token) -> Result<(), BackendError> {
        Ok(())
    }

    pub async fn check_health(&self) -> Result<(), BackendError> {
        let state = self.vg.state().await?;
        self.capacity_of(&state).map(drop)
    }
}
