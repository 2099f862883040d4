//! Creating, deleting and growing a class's LVs, in an order a crash cannot turn into
//! a volume that shows old bytes (see the module documentation of `lvm`).

use std::path::{Path, PathBuf};

use tokio::sync::MutexGuard;
use tracing::{info, warn};

use super::vg::{REPORT_TIMEOUT, VgState, stderr};
use super::{Layout, Lookup, LvmBackend, LvmError, lvm_command, report, tags};
use crate::backend::{BackendError, CreateSpec, VolumeRecord};
use crate::fs::superblock::FsUuid;
use crate::host::CommandSpec;
use crate::model::{Token, VolumeMode};

fn zero_timeout(bytes: u64) -> std::time::Duration {
    // Without a WRITE ZEROES offload the kernel writes zero pages: allow 32 MiB/s.
    std::time::Duration::from_secs(120 + bytes / (32 << 20))
}

impl LvmBackend {
    fn lvcreate_command(&self, lv: &str, spec: &CreateSpec, tags: &[String]) -> CommandSpec {
        let size = format!("{}b", spec.size_bytes);
        let mut cmd = lvm_command("lvcreate").args(["-y", "-n", lv]);
        cmd = match &self.settings.layout {
            // -Wy -Zy: wipe known signatures and zero the first 4 KiB, so blkid never
            // finds a deleted volume's filesystem here.
            Layout::Thick { .. } => self.stripe_args(cmd.args(["-L", &size, "-Wy", "-Zy"])),
            Layout::Thin { pool, .. } => cmd.args(["-V", &size, "--thinpool", pool]),
        };
        cmd = cmd.args(&self.settings.lvcreate_options);
        for tag in tags {
            cmd = cmd.arg("--addtag").arg(tag);
        }
        cmd.arg(self.vg_name())
    }

    /// The tags lvcreate gives a new LV. A thick block volume is [`tags::PENDING`] until
    /// zeroed. A filesystem volume is born [`tags::FORMATTING`]: whatever its device
    /// holds (an interrupted lvcreate may not have wiped its start) is formatted over at
    /// the first stage, never mounted, and no lvchange is needed before mkfs. So is an
    /// encrypted block volume, whose LUKS header is its format. An unencrypted
    /// filesystem volume also gets the UUID its mkfs will be given
    /// ([`tags::FS_UUID`]), so no lvchange is needed after mkfs either. (An encrypted
    /// one keeps the lvchange: its mark covers the LUKS header too, which a superblock
    /// read through the mapping cannot vouch for without the passphrase.)
    fn creation_tags(&self, spec: &CreateSpec) -> Result<Vec<String>, LvmError> {
        let mut tags = tags::volume_tags(&self.class, spec);
        if spec.mode == VolumeMode::Block && self.is_thick() {
            tags.push(tags::PENDING.to_string());
        }
        if spec.mode == VolumeMode::Filesystem || spec.encryption.is_some() {
            tags.push(tags::FORMATTING.to_string());
        }
        if spec.mode == VolumeMode::Filesystem && spec.encryption.is_none() {
            let uuid = FsUuid::random().map_err(|e| LvmError::Random(e.to_string()))?;
            tags.push(tags::fs_uuid_tag(uuid));
        }
        Ok(tags)
    }

    /// The LV lvcreate makes for `spec`, as `lvs` would report it: the size is already a
    /// multiple of the class's alignment, so lvcreate does not round it.
    fn created_lv(&self, lv: &str, spec: &CreateSpec, tags: Vec<String>) -> report::Lv {
        let pool = match &self.settings.layout {
            Layout::Thin { pool, .. } => Some(pool.clone()),
            Layout::Thick { .. } => None,
        };
        report::Lv {
            name: lv.to_string(),
            vg: self.vg.name.clone(),
            size: spec.size_bytes,
            attr: if pool.is_some() {
                "Vwi-a-tz--"
            } else {
                "-wi-a-----"
            }
            .to_string(),
            tags,
            data_percent: pool.as_ref().map(|_| 0.0),
            pool,
            path: Some(PathBuf::from(format!("/dev/{}/{lv}", self.vg.name))),
        }
    }

    /// Removes an LV of `token`'s volume (its own, or its temporary zeroing LV).
    pub(super) async fn remove_lv(&self, lv: &str, token: &Token) -> Result<(), BackendError> {
        let cmd = lvm_command("lvremove").arg("-y").arg(self.target(lv));
        match self.vg.change_known(cmd, |state| state.removed(lv)).await {
            Ok(()) => Ok(()),
            Err(e) if stderr::is_lv_not_found(e.stderr()) => Ok(()),
            Err(e) if stderr::is_in_use(e.stderr()) => Err(BackendError::InUse {
                token: token.clone(),
                by: e.stderr().trim().to_string(),
            }),
            Err(e) => Err(self.failed("lvremove", lv, e)),
        }
    }

    /// A thin block volume needs a pool that zeroes new blocks, or it could show a
    /// deleted volume's bytes.
    pub(super) fn check_block_zeroing(&self, state: &VgState, mode: VolumeMode) -> Result<(), BackendError> {
        if let Layout::Thin { pool, .. } = &self.settings.layout
            && mode == VolumeMode::Block
            && !state.lv(pool).is_some_and(|p| p.zeroes_new_blocks())
        {
            return Err(LvmError::PoolNotZeroing {
                vg: self.vg.name.clone(),
                pool: pool.clone(),
            }
            .into());
        }
        Ok(())
    }

    async fn zero_device(&self, device: &Path, bytes: u64) -> Result<(), BackendError> {
        let cmd = CommandSpec::new("blkdiscard")
            .args(["-f", "-z"])
            .arg(device)
            .timeout(zero_timeout(bytes));
        self.host.commands.run(cmd).await?;
        Ok(())
    }

    pub async fn create(&self, spec: &CreateSpec) -> Result<VolumeRecord, BackendError> {
        let allocation = self.vg.allocation.lock().await;
        let lv = tags::lv_name(&spec.token, self.vg_name());
        let state = self.vg.known_state().await?;
        match self.lookup(&state, &spec.token)? {
            Lookup::Ready(_, record) => return Ok(record),
            Lookup::Foreign => {
                return Err(LvmError::NameTaken {
                    vg: self.vg.name.clone(),
                    lv,
                    class: self.class.clone(),
                }
                .into());
            }
            Lookup::Pending => {
                warn!(class = %self.class, lv = %lv, "removing an LV whose creation did not finish");
                self.remove_lv(&lv, &spec.token).await?;
                // Read again: the removal freed space.
                let state = self.vg.known_state().await?;
                return self.create_checked(spec, &lv, &state, allocation).await;
            }
            Lookup::Absent => {}
        }
        self.create_checked(spec, &lv, &state, allocation).await
    }

    /// Checks space and creates the LV under the VG's allocation lock, which it releases
    /// once the LV holds its extents: zeroing a large volume never holds up other
    /// creates.
    async fn create_checked(
        &self,
        spec: &CreateSpec,
        lv: &str,
        state: &VgState,
        allocation: MutexGuard<'_, ()>,
    ) -> Result<VolumeRecord, BackendError> {
        let mut available = self.capacity_of(state)?.available;
        if spec.size_bytes > available {
            // The report may predate what others freed (a vgextend): refuse only on a
            // recent one.
            available = self.capacity_of(&*self.vg.refusal_state().await?)?.available;
        }
        self.check_usable(state).await?;
        if spec.size_bytes > available {
            return Err(self.no_space(spec.size_bytes, available));
        }
        self.check_block_zeroing(state, spec.mode)?;
        let tags = self.creation_tags(spec)?;
        let lvcreate = self.lvcreate_command(lv, spec, &tags);
        let lvcreate = if self.settings.lvcreate_options.is_empty() {
            let created = self.created_lv(lv, spec, tags);
            let extents_bytes = if self.is_thick() { spec.size_bytes } else { 0 };
            self.vg
                .change_known(lvcreate, |state| state.created(created, extents_bytes))
                .await
        } else {
            // Configured options (`--type raid1`, mirrors) can take more extents than
            // the size: what they made is read back, not computed.
            self.vg.change(lvcreate).await
        };
        if let Err(e) = lvcreate {
            return Err(if stderr::is_no_space(e.stderr()) {
                self.no_space(spec.size_bytes, available)
            } else if let (Layout::Thin { pool, .. }, true) =
                (&self.settings.layout, stderr::is_pool_full(e.stderr()))
            {
                // The pool filled up after the report this create read.
                LvmError::PoolUnusable {
                    vg: self.vg.name.clone(),
                    pool: pool.clone(),
                    reason: e.stderr().trim().to_string(),
                }
                .into()
            } else if stderr::is_name_taken(e.stderr()) {
                LvmError::NameTaken {
                    vg: self.vg.name.clone(),
                    lv: lv.to_string(),
                    class: self.class.clone(),
                }
                .into()
            } else if stderr::is_pool_not_found(e.stderr()) {
                let Layout::Thin { pool, .. } = &self.settings.layout else {
                    return Err(self.failed("lvcreate", lv, e));
                };
                LvmError::PoolNotFound {
                    vg: self.vg.name.clone(),
                    pool: pool.clone(),
                }
                .into()
            } else {
                self.failed("lvcreate", lv, e)
            });
        }
        drop(allocation);
        let finished = if self.is_thick() && spec.mode == VolumeMode::Block {
            self.finish_thick(spec, lv).await
        } else {
            Ok(())
        };
        self.settle_new_lv(&spec.token, lv, finished).await
    }

    /// The end of every create: when `finished` failed, the new LV is removed (if even
    /// that fails, it stays pending: not a volume, and removed by the next create or
    /// delete of this name) and the error returned; otherwise the new volume's record.
    pub(super) async fn settle_new_lv(
        &self,
        token: &Token,
        lv: &str,
        finished: Result<(), BackendError>,
    ) -> Result<VolumeRecord, BackendError> {
        if let Err(e) = finished {
            if let Err(cleanup) = self.remove_lv(lv, token).await {
                warn!(lv = %lv, error = %cleanup, "cannot remove a half-made LV");
            }
            return Err(e);
        }
        self.get(token).await?.ok_or_else(|| BackendError::NotFound {
            class: self.class.clone(),
            token: token.clone(),
        })
    }

    /// Zeroes a new thick block volume, then marks the LV as a finished volume.
    async fn finish_thick(&self, spec: &CreateSpec, lv: &str) -> Result<(), BackendError> {
        let device = PathBuf::from(format!("/dev/{}/{lv}", self.vg.name));
        self.zero_device(&device, spec.size_bytes).await?;
        let cmd = lvm_command("lvchange")
            .args(["--deltag", tags::PENDING])
            .arg(self.target(lv));
        self.vg
            .change_known(cmd, |state| state.retagged(lv, &[tags::PENDING], &[]))
            .await
            .map_err(|e| self.failed("lvchange --deltag", lv, e))
    }

    pub async fn delete(&self, token: &Token) -> Result<(), BackendError> {
        let state = self.vg.known_state().await?;
        let lv = tags::lv_name(token, self.vg_name());
        let zeroing = tags::zeroing_lv_name(&lv);
        match self.lookup(&state, token) {
            Ok(Lookup::Absent) => {}
            Ok(Lookup::Foreign) => {
                info!(lv = %lv, "the LV of this name is not this class's volume: nothing to delete");
            }
            // A corrupt record is still this class's LV: deleting it is what was asked.
            Ok(Lookup::Pending | Lookup::Ready(..)) | Err(BackendError::CorruptRecord { .. }) => {
                self.remove_lv(&lv, token).await?;
            }
            Err(e) => return Err(e),
        }
        if state.lv(&zeroing).is_some() {
            self.remove_lv(&zeroing, token).await?;
        }
        Ok(())
    }

    pub async fn expand(&self, token: &Token, size_bytes: u64) -> Result<u64, BackendError> {
        let mut allocation = self.vg.allocation.lock().await;
        let state = self.vg.state().await?;
        let Lookup::Ready(lv, record) = self.lookup(&state, token)? else {
            return Err(BackendError::NotFound {
                class: self.class.clone(),
                token: token.clone(),
            });
        };
        if size_bytes <= lv.size {
            return Ok(lv.size);
        }
        let growth = size_bytes - lv.size;
        let mut available = self.capacity_of(&state)?.available;
        if growth > available {
            // As for a create: refuse only on a recent report.
            available = self.capacity_of(&*self.vg.refusal_state().await?)?.available;
        }
        if growth > available {
            return Err(self.no_space(growth, available));
        }
        let mut cmd = lvm_command("lvextend")
            .arg("-L")
            .arg(format!("{size_bytes}b"))
            .arg(self.target(&lv.name));
        if self.is_thick() && record.mode == VolumeMode::Block {
            let ranges;
            (ranges, allocation) = self
                .zeroed_extents(&state, token, &lv.name, growth, allocation)
                .await?;
            cmd = cmd.args(ranges);
        }
        let result = self.vg.change(cmd).await;
        drop(allocation);
        if let Err(e) = result {
            return Err(if stderr::is_no_space(e.stderr()) {
                self.no_space(growth, available)
            } else {
                self.failed("lvextend", &lv.name, e)
            });
        }
        Ok(self.get(token).await?.map_or(size_bytes, |r| r.size_bytes))
    }

    /// Takes `growth` bytes of free extents in a temporary LV, zeroes them and frees
    /// them again; returns their `PV:first-last` ranges for lvextend to use exactly,
    /// and the allocation lock, held again from their release on so that no other
    /// allocation of this daemon takes them first. The zeroing runs without the lock:
    /// the temporary LV holds the extents meanwhile.
    async fn zeroed_extents<'a>(
        &'a self,
        state: &VgState,
        token: &Token,
        lv: &str,
        growth: u64,
        allocation: MutexGuard<'a, ()>,
    ) -> Result<(Vec<String>, MutexGuard<'a, ()>), BackendError> {
        let tmp = tags::zeroing_lv_name(lv);
        if state.lv(&tmp).is_some() {
            self.remove_lv(&tmp, token).await?;
        }
        let cmd = lvm_command("lvcreate")
            .args(["-y", "-Wn", "-Zn", "-n", &tmp, "-L", &format!("{growth}b")])
            .arg("--addtag")
            .arg(tags::zeroing_tag(lv));
        let cmd = self.stripe_args(cmd).arg(self.vg_name());
        if let Err(e) = self.vg.change(cmd).await {
            return Err(if stderr::is_no_space(e.stderr()) {
                self.no_space(growth, 0)
            } else {
                self.failed("lvcreate", &tmp, e)
            });
        }
        drop(allocation);
        let result = match self.zero_tmp(&tmp, growth).await {
            Ok(ranges) => {
                let allocation = self.vg.allocation.lock().await;
                self.remove_lv(&tmp, token).await.map(|()| (ranges, allocation))
            }
            Err(e) => Err(e),
        };
        if result.is_err()
            && let Err(cleanup) = self.remove_lv(&tmp, token).await
        {
            warn!(lv = %tmp, error = %cleanup, "cannot remove a temporary LV");
        }
        result
    }

    /// The extent ranges of the temporary LV, after zeroing it.
    async fn zero_tmp(&self, tmp: &str, growth: u64) -> Result<Vec<String>, BackendError> {
        let cmd = lvm_command("lvs")
            .args(report::REPORT_FORMAT)
            .args(["--segments", "-o", report::SEG_FIELDS])
            .arg(self.target(tmp))
            .timeout(REPORT_TIMEOUT);
        let out = self
            .host
            .commands
            .run(cmd)
            .await
            .map_err(|e| self.failed("lvs --segments", tmp, e))?;
        let extension_error = |reason: String| LvmError::Extension {
            vg: self.vg.name.clone(),
            lv: tmp.to_string(),
            reason,
        };
        let ranges: Vec<String> = report::parse_segments(&out.stdout)
            .map_err(extension_error)?
            .into_iter()
            .filter(|s| s.lv == tmp)
            .flat_map(|s| s.pe_ranges)
            .collect();
        if ranges.is_empty() || ranges.iter().any(|r| !r.starts_with('/')) {
            return Err(extension_error(format!("unexpected extent ranges {ranges:?}")).into());
        }
        let device = PathBuf::from(format!("/dev/{}/{tmp}", self.vg.name));
        self.zero_device(&device, growth).await?;
        Ok(ranges)
    }
}
