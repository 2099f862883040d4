//! One volume group as localvol sees it: lvm's error text, the cached `lvs`
//! report shared by every class on the VG, and the lock over allocations in it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use super::report::{self, Lv, ThinPool, Vg};
use crate::backend::BackendError;
use crate::backend::cache::{DEFAULT_TTL, KNOWN_TTL, REFUSAL_TTL, ReportCache};
use crate::host::{CommandError, CommandSpec, Host};
use crate::model::ClassName;

pub(super) const REPORT_TIMEOUT: Duration = Duration::from_secs(60);
const CHANGE_TIMEOUT: Duration = Duration::from_secs(120);

/// What every LVM command gets through `--config`, on top of the host's own
/// configuration (the pod mounts the host's /etc/lvm, so its filters, devices file,
/// backup and archive settings stay in force; see docs/operations.md).
///
/// The pod has no udev: none runs in the container, and the host's udevd cannot
/// answer libdm's completion semaphores, which live in the container's IPC namespace.
/// - `udev_sync=0`: do not wait for udev to confirm each device-mapper change
///   (lvcreate/lvchange would otherwise block until udev's timeout).
/// - `udev_rules=0`: libdm creates /dev/mapper/* and /dev/VG/LV itself and flags its
///   uevents so that the host's rules leave them alone.
/// - `monitoring=0`: register no LV with dmeventd, which LVM would otherwise start as
///   a stray daemon in the pod (thin-pool auto-extend is therefore off; the thin
///   class's overprovision ratio bounds pool use).
/// - `ignore_suspended_devices=1`: skip a suspended device-mapper device when scanning.
///   lvm reads every block device whenever its hints are stale (any device came or
///   went since its last full scan); a read of a suspended one waits until it is
///   resumed, so one suspended mapping (an encrypted volume's, by hand) held every
///   `lvs` to its timeout, for every class on the node. The price: a PV that is itself
///   a device-mapper device shows as missing while it is suspended.
///
/// A command-line `--config` beats lvm.conf for these four keys only, so a host whose
/// lvm.conf says otherwise (udev on, as every distribution ships it) cannot make a
/// command in the pod hang. The environment equivalent (DM_DISABLE_UDEV=1) does not
/// cover monitoring, and the image's own lvm.conf is hidden by the host's.
pub const CONTAINER_CONFIG: &str =
    "activation{udev_sync=0 udev_rules=0 monitoring=0} devices{ignore_suspended_devices=1}";

/// The start of every LVM command localvol runs: `program --config CONTAINER_CONFIG`.
pub fn lvm_command(program: &'static str) -> CommandSpec {
    CommandSpec::new(program).args(["--config", CONTAINER_CONFIG])
}

#[derive(Debug, thiserror::Error)]
pub enum LvmError {
    #[error("{}", vg_not_found(vg, *active_lvs))]
    VgNotFound {
        vg: String,
        /// Its LVs the kernel still holds: the VG was here, and its disks are what lvm
        /// cannot find.
        active_lvs: usize,
    },
    #[error("thin pool {vg}/{pool} does not exist")]
    PoolNotFound { vg: String, pool: String },
    #[error(
        "volume group {vg} takes no new volume: {missing} of its physical volumes {verb} missing \
         (a disk failed or was removed; pvs shows which)",
        verb = if *missing == 1 { "is" } else { "are" }
    )]
    VgPartial { vg: String, missing: u64 },
    #[error("thin pool {vg}/{pool} takes no new volume: {reason}")]
    PoolUnusable {
        vg: String,
        pool: String,
        reason: String,
    },
    #[error(
        "thin pool {vg}/{pool} does not zero new blocks, so a raw block volume could show data of a \
         deleted volume; enable zeroing (lvchange -Zy {vg}/{pool}) or use filesystem volumes"
    )]
    PoolNotZeroing { vg: String, pool: String },
    #[error("logical volume {vg}/{lv} exists and is not a volume of device class {class}")]
    NameTaken {
        vg: String,
        lv: String,
        class: ClassName,
    },
    #[error("reading volume group {vg} failed moments ago; not retried yet: {reason}")]
    ReportUnavailable { vg: String, reason: String },
    #[error("cannot parse the {what} report of volume group {vg}: {reason}")]
    Report {
        vg: String,
        what: &'static str,
        reason: String,
    },
    #[error("cannot pre-zero the extension of {vg}/{lv}: {reason}")]
    Extension { vg: String, lv: String, reason: String },
    /// The kernel gave no random bytes for a new filesystem's UUID.
    #[error("cannot choose a filesystem UUID: {0}")]
    Random(String),
    #[error("{op} {target}: another lvm command holds the lock: {source}")]
    Locked {
        op: &'static str,
        target: String,
        #[source]
        source: CommandError,
    },
    #[error("{op} {target}: {source}")]
    Command {
        op: &'static str,
        target: String,
        #[source]
        source: CommandError,
    },
}

fn vg_not_found(vg: &str, active_lvs: usize) -> String {
    match active_lvs {
        0 => format!("volume group {vg} does not exist on this node"),
        n => format!(
            "volume group {vg} is not found by lvm, but {n} of its logical volumes {} still active in \
             the kernel: the disks under it failed or are missing (see pvs and the kernel log)",
            if n == 1 { "is" } else { "are" }
        ),
    }
}

/// Classifiers of lvm's error text (LC_ALL=C; see `tests/fixtures/lvm/*.txt`).
pub mod stderr {
    pub fn is_vg_not_found(s: &str) -> bool {
        s.contains("Volume group \"") && s.contains("\" not found")
    }

    pub fn is_lv_not_found(s: &str) -> bool {
        s.contains("Failed to find logical volume")
    }

    pub fn is_pool_not_found(s: &str) -> bool {
        s.contains("Pool ") && s.contains(" not found in Volume group")
    }

    /// lvcreate of a thin LV in a pool past lvm's own threshold, or out of space.
    pub fn is_pool_full(s: &str) -> bool {
        s.contains("free space in thin pool") && s.contains("reached threshold")
    }

    pub fn is_no_space(s: &str) -> bool {
        s.to_ascii_lowercase().contains("insufficient free space")
    }

    pub fn is_in_use(s: &str) -> bool {
        s.contains(" in use")
    }

    pub fn is_name_taken(s: &str) -> bool {
        s.contains("already exists in volume group")
    }

    pub fn is_lock_failure(s: &str) -> bool {
        s.contains("Can't get lock") || s.contains("Failed to lock")
    }
}

/// What lvm reports about one VG.
#[derive(Debug, Clone)]
pub struct VgState {
    pub vg: Vg,
    pub lvs: Vec<Lv>,
    /// The thin pools among `lvs`, with their fill.
    pub pools: Vec<ThinPool>,
}

impl VgState {
    pub fn lv(&self, name: &str) -> Option<&Lv> {
        self.lvs.iter().find(|l| l.name == name)
    }

    fn lv_mut(&mut self, name: &str) -> Option<&mut Lv> {
        self.lvs.iter_mut().find(|l| l.name == name)
    }

    /// The report after lvcreate made `lv`, taking `extents_bytes` of the VG's free
    /// space (0 for a thin volume). Replaces an LV of that name a rescan already saw.
    pub(super) fn created(&mut self, lv: Lv, extents_bytes: u64) {
        self.lvs.retain(|l| l.name != lv.name);
        self.lvs.push(lv);
        self.vg.free = self.vg.free.saturating_sub(extents_bytes);
    }

    /// The report after lvremove of `name`: a thick LV's extents are free again. A thin
    /// LV gives back an amount of its pool no report says (blocks it shares with its
    /// snapshots stay), so the pool's fill becomes unknown until the next read, rather
    /// than the old fill keeping a pool "critical" that its own deletion emptied.
    pub(super) fn removed(&mut self, name: &str) {
        let Some(i) = self.lvs.iter().position(|l| l.name == name) else {
            return;
        };
        let lv = self.lvs.remove(i);
        match &lv.pool {
            Some(pool) => {
                if let Some(fill) = self.pools.iter_mut().find(|p| p.name == *pool) {
                    fill.data_percent = None;
                    fill.metadata_percent = None;
                }
            }
            None if !lv.is_thin_volume() => self.vg.free += lv.size,
            None => {}
        }
    }

    /// The report after `lvchange --deltag`/`--addtag` on `name`.
    pub(super) fn retagged(&mut self, name: &str, remove: &[&str], add: &[&str]) {
        if let Some(lv) = self.lv_mut(name) {
            lv.tags.retain(|t| !remove.contains(&t.as_str()));
            for tag in add {
                if !lv.tags.iter().any(|t| t == tag) {
                    lv.tags.push(tag.to_string());
                }
            }
        }
    }

    /// The report after `lvchange -ay` on `name`.
    pub(super) fn activated(&mut self, name: &str) {
        if let Some(lv) = self.lv_mut(name) {
            let mut attr: Vec<char> = lv.attr.chars().collect();
            attr.resize(attr.len().max(10), '-');
            attr[4] = 'a';
            lv.attr = attr.into_iter().collect();
        }
    }
}

/// One VG as the classes on it see it: a cached report and the lock that serialises
/// allocations in it (so two creates cannot both take the last free extents).
#[derive(Debug)]
pub struct VolumeGroup {
    pub(super) name: String,
    host: Host,
    cache: ReportCache<VgState>,
    pub(super) allocation: Mutex<()>,
}

impl VolumeGroup {
    pub fn new(name: String, host: Host) -> Arc<Self> {
        Arc::new(Self {
            name,
            host,
            cache: ReportCache::new(DEFAULT_TTL),
            allocation: Mutex::new(()),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The cached report within the TTL, or a fresh one (one `lvs`; `vgs` too for a VG
    /// without LVs).
    pub async fn state(&self) -> Result<Arc<VgState>, BackendError> {
        self.state_within(self.cache.ttl()).await
    }

    /// The cached report up to [`KNOWN_TTL`] old (with our own changes applied), or a
    /// fresh one: for decisions about our own LVs.
    pub async fn known_state(&self) -> Result<Arc<VgState>, BackendError> {
        self.state_within(KNOWN_TTL).await
    }

    /// The cached report up to [`REFUSAL_TTL`] old, or a fresh one: before refusing a
    /// request for lack of space.
    pub async fn refusal_state(&self) -> Result<Arc<VgState>, BackendError> {
        self.state_within(REFUSAL_TTL).await
    }

    async fn state_within(&self, max_age: Duration) -> Result<Arc<VgState>, BackendError> {
        self.cache
            .get_within(
                max_age,
                || self.read(),
                |reason| LvmError::ReportUnavailable {
                    vg: self.name.clone(),
                    reason,
                },
            )
            .await
            .map_err(BackendError::from)
    }

    pub fn invalidate(&self) {
        self.cache.invalidate();
    }

    async fn report(&self, program: &'static str, fields: &str) -> Result<Vec<u8>, LvmError> {
        let cmd = lvm_command(program)
            .args(report::REPORT_FORMAT)
            .args(["-o", fields])
            .arg(&self.name)
            .timeout(REPORT_TIMEOUT);
        match self.host.commands.run(cmd).await {
            Ok(out) => Ok(out.stdout),
            Err(e) => Err(self.error(program, self.name.clone(), e)),
        }
    }

    /// [`read_report`](Self::read_report); a VG lvm does not find is told apart from
    /// one that never was by the kernel's device-mapper devices of its LVs.
    async fn read(&self) -> Result<VgState, LvmError> {
        match self.read_report().await {
            Err(LvmError::VgNotFound { vg, .. }) => {
                let names = self.host.syscalls.device_mapper_names().await.unwrap_or_default();
                Err(LvmError::VgNotFound {
                    active_lvs: report::lvs_of_vg_in(&vg, &names),
                    vg,
                })
            }
            other => other,
        }
    }

    async fn read_report(&self) -> Result<VgState, LvmError> {
        let parse_error = |what, reason| LvmError::Report {
            vg: self.name.clone(),
            what,
            reason,
        };
        let json = self.report("lvs", report::REPORT_FIELDS).await?;
        let (lvs, vg) = report::parse_report(&json, &self.name).map_err(|r| parse_error("lvs", r))?;
        drop(json);
        let vg = match vg {
            Some(vg) => vg,
            // No LV, so no row to carry the VG's fields.
            None => report::parse_vgs(&self.report("vgs", report::VG_FIELDS).await?)
                .map_err(|r| parse_error("vgs", r))?
                .into_iter()
                .find(|v| v.name == self.name)
                .ok_or_else(|| LvmError::VgNotFound {
                    vg: self.name.clone(),
                    active_lvs: 0,
                })?,
        };
        Ok(VgState {
            vg,
            lvs: lvs.lvs,
            pools: lvs.pools,
        })
    }

    /// The error of a failed lvm command, classified by its message.
    pub(super) fn error(&self, op: &'static str, target: String, e: CommandError) -> LvmError {
        let s = e.stderr();
        if stderr::is_vg_not_found(s) {
            LvmError::VgNotFound {
                vg: self.name.clone(),
                active_lvs: 0,
            }
        } else if stderr::is_lock_failure(s) {
            LvmError::Locked {
                op,
                target,
                source: e,
            }
        } else {
            LvmError::Command {
                op,
                target,
                source: e,
            }
        }
    }

    /// Runs a changing lvm command; the cache is invalidated whatever the outcome.
    pub(super) async fn change(&self, cmd: CommandSpec) -> Result<(), CommandError> {
        let result = self.host.commands.run(cmd.timeout(CHANGE_TIMEOUT)).await;
        self.invalidate();
        result.map(drop)
    }

    /// Runs a changing lvm command whose effect on the report is `patch`: on success the
    /// cached report gets the patch instead of a rescan (see [`ReportCache`]).
    pub(super) async fn change_known(
        &self,
        cmd: CommandSpec,
        patch: impl FnOnce(&mut VgState),
    ) -> Result<(), CommandError> {
        let ticket = self.cache.begin_change().await;
        let result = self.host.commands.run(cmd.timeout(CHANGE_TIMEOUT)).await;
        self.cache
            .finish_change(ticket, result.is_ok().then_some(patch))
            .await;
        result.map(drop)
    }
}
