//! Node operations on the volume itself: stage, unstage, expand, stats (publish and
//! unpublish, which bind it for pods: `publish.rs`). What a stage does is decided in
//! `stage_plan.rs`; here it is done.

use std::path::PathBuf;

use tracing::{info, warn};

use super::encryption::{DataPath, Unlocked};
use super::ownership::{Holding, Identity, describe, holding, refuse_mounts_below, refuse_other};
use super::placed::Role;
use super::stage_plan::{self, AfterMark, FilesystemStage, FormatOptionsFrom, MountPlan, StagedAs, Unlock};
use super::targets::create_dir;
use super::{VolumeError, Volumes, check_no_symlinks, guard_matches};
use crate::backend::{Backend, FormatMark, VolumeHealth, VolumeRecord};
use crate::fs::{self, FormatOptions, FsType, Signature};
use crate::host::Host;
use crate::locks::VolumeGuard;
use crate::model::{AccessMode, ClaimRef, VolumeMode};
use crate::mount::{self, MountOptions, MountTable};
use crate::request::{NodeExpandRequest, StageRequest, StatsRequest, UnstageRequest};

/// Whether a volume is healthy, for NodeGetVolumeStats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeCondition {
    pub abnormal: bool,
    pub message: String,
}

/// What NodeGetVolumeStats answers, with the claim the volume was made for: the edge
/// tells it of a change of the condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeStats {
    pub usage: Usage,
    pub condition: VolumeCondition,
    pub claim: ClaimRef,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Usage {
    Filesystem(crate::host::FsUsage),
    Block { size_bytes: u64 },
}

/// Whether a stage mounted (raw block: attached) the volume, or found it staged already.
#[derive(Debug, PartialEq, Eq)]
enum Staged {
    Now,
    Already,
}

impl Volumes {
    /// Stages the volume; a path this daemon published it at, or one inside a volume it
    /// staged or published, is refused first.
    pub async fn stage(&self, guard: &VolumeGuard, req: &StageRequest) -> Result<(), VolumeError> {
        guard_matches(guard, &req.id);
        let staging = req.staging_path.as_path();
        self.placed
            .refuse_role(&req.id, staging, "staging_target_path", Role::Publication)?;
        self.placed.refuse_inside("staging_target_path", staging)?;
        if self.stage_at(req).await? == Staged::Now {
            self.placed.place(&req.id, staging, Role::Stage).await;
        }
        Ok(())
    }

    /// Stages the volume at the staging path: gathers what is known of it, asks the plan
    /// (`stage_plan.rs`) what to do, and does it.
    async fn stage_at(&self, req: &StageRequest) -> Result<Staged, VolumeError> {
        let staging = req.staging_path.as_path();
        let backend = self.backend_of(&req.id)?;
        // Independent reads, at once; their errors are taken in the order the checks
        // mean. The kernel is asked about the staging path itself; the whole table is
        // read only where that cannot prove the path free (below).
        let (record, links, clear, held_by) = tokio::join!(
            self.record(&req.id),
            check_no_symlinks(staging),
            self.clear_at_and_below(staging),
            backend.holding_device(&req.id.token)
        );
        let (_, record) = record?;
        let plan = stage_plan::before_attach(
            &record,
            &req.capability,
            req.passphrase.as_ref(),
            self.default_fs(&req.id.class),
        )?;
        links?;
        let held_by = held_by?;
        let identity = match &held_by {
            Some(device) => {
                self.identity_of_held(backend, &req.id.token, device.clone())
                    .await?
            }
            None => None,
        };
        // Before attaching anything: the staging path holds this volume or nothing, and
        // hides no mount below it. The short way: the kernel shows nothing at or below
        // it, as on every first stage. Anything else (a retry onto the staged volume,
        // another mount, a kernel without statmount) is proven from the whole table.
        if !clear
            && self
                .staged_by_table(backend, req, &record, identity.as_ref())
                .await?
        {
            return Ok(Staged::Already);
        }
        let held = held_by.is_some();
        match plan.access {
            StagedAs::Block => self.stage_block(backend, req, &record, plan.unlock, held).await?,
            StagedAs::Filesystem(filesystem) => {
                self.stage_filesystem(backend, req, &record, plan.unlock, filesystem, held)
                    .await?
            }
        }
        Ok(Staged::Now)
    }

    /// Raw block: attaches the volume and, encrypted, opens its mapping.
    async fn stage_block(
        &self,
        backend: &Backend,
        req: &StageRequest,
        record: &VolumeRecord,
        unlock: Option<Unlock<'_>>,
        held: bool,
    ) -> Result<(), VolumeError> {
        let device = attach(backend, req, held).await?;
        if let Some(Unlock {
            encryption,
            passphrase,
        }) = unlock
        {
            let (_, unlocked) = self
                .unlock(backend, record, encryption, &device, passphrase)
                .await?;
            // A raw block volume's format is its LUKS header alone: a header made just
            // now is marked finished, or the next stage would make it again.
            if unlocked == Unlocked::New {
                backend.mark_formatted(&req.id.token).await?;
            }
        }
        Ok(())
    }

    /// A filesystem: attaches the volume (encrypted, opens its mapping), formats or
    /// grows what the plan says, and mounts it at the staging path.
    async fn stage_filesystem(
        &self,
        backend: &Backend,
        req: &StageRequest,
        record: &VolumeRecord,
        unlock: Option<Unlock<'_>>,
        filesystem: FilesystemStage<'_>,
        held: bool,
    ) -> Result<(), VolumeError> {
        let staging = req.staging_path.as_path();
        let FilesystemStage {
            fs_type,
            mount_flags,
            data_path,
        } = filesystem;
        let options = self.stage_options(backend, req, fs_type, mount_flags, data_path)?;
        let device = attach(backend, req, held).await?;
        // An encrypted volume's filesystem is on its mapping, made now if need be; the
        // format mark then tells of the filesystem as it does on any volume (a new
        // header leaves it unfinished).
        let device = match unlock {
            Some(Unlock {
                encryption,
                passphrase,
            }) => {
                self.unlock(backend, record, encryption, &device, passphrase)
                    .await?
                    .0
            }
            None => device,
        };
        let mount = || {
            self.host
                .syscalls
                .mount(options.filesystem_call(&device, staging, fs_type.as_str()))
        };
        // A pending format's filesystem proves itself: its superblock, which mkfs writes
        // last, holds the UUID chosen for it. The same UUID goes to any mkfs below.
        let (mark, chosen_uuid) = match backend.format_mark(&req.id.token).await? {
            FormatMark::Pending(uuid) if fs::finished_with(&self.host, &device, uuid).await? => {
                (FormatMark::Finished, Some(uuid))
            }
            FormatMark::Pending(uuid) => (FormatMark::Unfinished, Some(uuid)),
            mark => (mark, None),
        };
        let found = match stage_plan::after_mark(record, fs_type, mark) {
            AfterMark::MountMade => {
                create_dir(staging).await?;
                match mount().await {
                    Ok(()) => return Ok(()),
                    Err(e) => {
                        warn!(volume.id = %req.id, device = %device.display(), error = %e,
                            "the filesystem made at create did not mount; probing the device");
                    }
                }
                fs::probe(&self.host, &device).await?
            }
            AfterMark::NeverFormatted => Signature::Empty,
            AfterMark::Probe => fs::probe(&self.host, &device).await?,
        };
        let grow_after_mount = match stage_plan::for_signature(record, fs_type, data_path, &device, found)? {
            MountPlan::Format {
                options,
                clear_grow_pending,
            } => {
                info!(volume.id = %req.id, device = %device.display(), %fs_type, "formatting");
                // Marked begun before mkfs and finished only after it: a kill in between
                // leaves the mark unfinished for the retry (`stage_plan::after_mark`).
                backend.begin_format(&req.id.token).await?;
                let options = FormatOptions {
                    uuid: chosen_uuid,
                    ..match options {
                        FormatOptionsFrom::Defaults => FormatOptions::default(),
                        FormatOptionsFrom::Backend => backend.format_options(&req.id.token).await?,
                    }
                };
                fs::format(&self.host, fs_type, &device, options).await?;
                backend.mark_formatted(&req.id.token).await?;
                if clear_grow_pending {
                    backend.filesystem_grown(&req.id.token).await?;
                }
                false
            }
            MountPlan::AsFound => false,
            MountPlan::GrowBeforeMount => {
                self.grow_ext4_unmounted(backend, &record.id, &device).await?;
                false
            }
            MountPlan::GrowAfterMount => true,
        };
        create_dir(staging).await?;
        mount().await?;
        if grow_after_mount {
            let table = MountTable::read(&self.host).await?;
            let mount = table.at(staging).ok_or_else(|| VolumeError::NotStaged {
                id: req.id.clone(),
                path: staging.to_path_buf(),
            })?;
            self.grow_mounted(backend, &req.id, &device, mount).await?;
        }
        Ok(())
    }

    /// Whether the volume is staged at the staging path already, as the whole mount table
    /// shows (growing its filesystem if a resize is pending); `false` when the path holds
    /// nothing. A path holding anything else, or a filesystem's staging path hiding a
    /// mount below it, is refused: mounting over it would hide that.
    async fn staged_by_table(
        &self,
        backend: &Backend,
        req: &StageRequest,
        record: &VolumeRecord,
        identity: Option<&Identity>,
    ) -> Result<bool, VolumeError> {
        let staging = req.staging_path.as_path();
        let is_block = req.capability.access.is_block();
        let table = MountTable::read(&self.host).await?;
        match holding(&table, staging, identity) {
            Holding::Nothing => {
                // Only a filesystem is mounted over the path, hiding what is below it.
                if !is_block {
                    refuse_mounts_below(&table, staging)?;
                }
                Ok(false)
            }
            Holding::This(e) if !is_block && identity.is_some_and(|i| i.is_filesystem(e)) => {
                self.grow_if_pending(backend, record, e).await?;
                info!(volume.id = %req.id, path = %staging.display(), "already staged");
                Ok(true)
            }
            // Anything else, including this volume's device for a raw block volume,
            // which is never mounted at its staging path.
            Holding::This(e) | Holding::Other(e) => Err(VolumeError::Occupied {
                path: staging.to_path_buf(),
                holder: describe(e),
            }),
        }
    }

    /// The mount(2) options of a staging mount: the class's, then the request's, then
    /// what the backend and the filesystem need.
    fn stage_options(
        &self,
        backend: &Backend,
        req: &StageRequest,
        fs_type: FsType,
        mount_flags: &[String],
        data_path: DataPath,
    ) -> Result<MountOptions, VolumeError> {
        let class_options = self
            .mount_options
            .get(&req.id.class)
            .map_or(&[][..], Vec::as_slice);
        let mut options =
            MountOptions::parse(&[class_options, mount_flags].concat()).map_err(VolumeError::Mount)?;
        // dm-crypt cannot carry DAX: an encrypted volume of a PMEM class is served
        // through the page cache (docs/encryption.md).
        if data_path == DataPath::Device {
            for data in backend.mount_data() {
                options = options.with_data(data);
            }
        }
        // A restore or clone of an xfs volume carries its source's filesystem UUID, and
        // xfs refuses to mount a second filesystem with a mounted one's UUID: a copy
        // could not be staged beside its source. Every xfs mount skips that check.
        if fs_type == FsType::Xfs {
            options = options.with_data("nouuid");
        }
        if req.capability.mode == AccessMode::SingleNodeReaderOnly {
            options = options.with_read_only(true);
        }
        Ok(options)
    }

    /// Unmounts the volume from its staging path and detaches it; a target this daemon
    /// published it at is refused before anything is touched.
    pub async fn unstage(&self, guard: &VolumeGuard, req: &UnstageRequest) -> Result<(), VolumeError> {
        guard_matches(guard, &req.id);
        let staging = req.staging_path.as_path();
        self.placed
            .refuse_role(&req.id, staging, "staging_target_path", Role::Publication)?;
        self.unmount_stage(req).await?;
        self.placed.unplace(&req.id, staging, Role::Stage).await;
        Ok(())
    }

    async fn unmount_stage(&self, req: &UnstageRequest) -> Result<(), VolumeError> {
        let staging = req.staging_path.as_path();
        let backend = self.backend_of(&req.id)?;
        let (identity, table) = self.look_at(backend, &req.id.token, staging).await?;
        refuse_other(staging, &holding(&table, staging, identity.as_ref()))?;
        if let Some(identity) = &identity
            && let Some(published) = table
                .entries()
                .find(|m| m.mount_point != staging && identity.uses(m))
        {
            return Err(VolumeError::StillPublished {
                id: req.id.clone(),
                path: published.mount_point.clone(),
            });
        }
        let mut first_table = Some(table);
        for _ in 0..16 {
            let table = match first_table.take() {
                Some(table) => table,
                None => MountTable::read(&self.host).await?,
            };
            match holding(&table, staging, identity.as_ref()) {
                Holding::Nothing => break,
                Holding::This(_) => {
                    mount::unmount(&self.host, staging).await?;
                    // It was the only mount there: nothing is left to look at.
                    if table.count_at(staging) == 1 {
                        break;
                    }
                }
                Holding::Other(e) => {
                    return Err(VolumeError::Occupied {
                        path: staging.to_path_buf(),
                        holder: describe(e),
                    });
                }
            }
        }
        if let Some(device) = backend.holding_device(&req.id.token).await? {
            self.lock(&req.id, &device).await?;
        }
        backend.detach(&req.id.token).await?;
        Ok(())
    }

    /// Grows the backing store when it is smaller than asked, makes the device see it,
    /// then grows the filesystem online. Returns the device's size.
    pub async fn expand_on_node(
        &self,
        guard: &VolumeGuard,
        req: &NodeExpandRequest,
    ) -> Result<u64, VolumeError> {
        guard_matches(guard, &req.id);
        let (backend, record) = self.record(&req.id).await?;
        super::controller::refuse_limit_below(&record, &req.capacity)?;
        // Nothing grows until the path is proven to hold this volume.
        let (table, mounted) = self
            .mounted_at(backend, &req.id, req.volume_path.as_ref())
            .await?;
        let identity = self.identity(backend, &req.id.token).await?;
        if req.capacity.required > record.size_bytes {
            let size = backend.size_for(&req.capacity)?;
            backend.expand(&req.id.token, size).await?;
        }
        let device = backend.attach(&req.id.token).await?;
        backend.refresh_device(&req.id.token).await?;
        // Between the device and the filesystem: the mapping grows to the device.
        let data = match record.encryption {
            Some(_) => self.grow_mapping(&req.id, &device).await?,
            None => device.clone(),
        };
        if record.mode == VolumeMode::Filesystem {
            // Grow through the filesystem's own mount: the staging path when kubelet names
            // it and it holds this volume.
            let fs_mount = req
                .staging_path
                .as_ref()
                .and_then(|s| table.at(s.as_path()))
                .filter(|e| identity.as_ref().is_some_and(|i| i.is_filesystem(e)))
                .unwrap_or(&mounted);
            fs::grow(&self.host, &fs_mount.fs_type, &data, &fs_mount.mount_point).await?;
        }
        // The volume's capacity is its device's, an encrypted one's header included.
        Ok(self.host.syscalls.block_device_size(&device).await?)
    }

    pub async fn stats(&self, req: &StatsRequest) -> Result<VolumeStats, VolumeError> {
        let (backend, record) = self.record(&req.id).await?;
        let mount = match self.mount_of(backend, &req.id, req.volume_path.as_ref()).await {
            Ok(mount) => mount,
            Err(unproven) => {
                return match self.lost_device_stats(backend, &record, req).await? {
                    Some(stats) => Ok(stats),
                    None => Err(unproven),
                };
            }
        };
        let path = mount.mount_point.as_path();
        let (usage, condition) = match record.mode {
            VolumeMode::Block => (
                Usage::Block {
                    size_bytes: self.host.syscalls.block_device_size(path).await?,
                },
                condition_of(&self.host, backend, &record, None).await?,
            ),
            VolumeMode::Filesystem => {
                let filesystem = self.host.syscalls.filesystem_state(&mount).await;
                let usage = Usage::Filesystem(self.host.syscalls.statvfs(path).await?);
                let problem = fs::health::problem(&mount, &filesystem);
                (usage, condition_of(&self.host, backend, &record, problem).await?)
            }
        };
        Ok(VolumeStats {
            usage,
            condition,
            claim: record.claim,
        })
    }
}

impl Volumes {
    /// The stats of a raw block volume whose device was removed under its publication
    /// at the path ([`lost_bind_at`](Self::lost_bind_at)), or `None` for anything else.
    /// The mount there cannot be proven the volume's as any other is, but it is its
    /// own bind, and an answer that changes nothing may say what became of it: kubelet
    /// then shows the volume abnormal with what to do, instead of failing to read its
    /// stats. (A filesystem's mount holds its device open: nothing removes it under one
    /// but `dmsetup remove --force`, which leaves the node, with an error table.)
    async fn lost_device_stats(
        &self,
        backend: &Backend,
        record: &VolumeRecord,
        req: &StatsRequest,
    ) -> Result<Option<VolumeStats>, VolumeError> {
        if record.mode != VolumeMode::Block {
            return Ok(None);
        }
        let Some(bind) = self
            .lost_bind_at(backend, &record.id, req.volume_path.as_ref())
            .await?
        else {
            return Ok(None);
        };
        let condition = match condition_of(&self.host, backend, record, None).await? {
            abnormal @ VolumeCondition { abnormal: true, .. } => abnormal,
            // The volume's storage serves again (staged again since): not through this bind.
            VolumeCondition { abnormal: false, .. } => VolumeCondition {
                abnormal: true,
                message: format!(
                    "the device node bound at {} is gone: unpublish the volume and publish it again",
                    bind.mount_point.display()
                ),
            },
        };
        Ok(Some(VolumeStats {
            // What CreateVolume gave: the device that held the data's size is gone.
            usage: Usage::Block {
                size_bytes: record.size_bytes,
            },
            condition,
            claim: record.claim.clone(),
        }))
    }
}

/// Attaches the volume for a stage. Found on no device just now (`held` false), under
/// the volume's lock: attached without looking again (on a node with hundreds of loop
/// devices, a list of them all).
async fn attach(backend: &Backend, req: &StageRequest, held: bool) -> Result<PathBuf, VolumeError> {
    Ok(if held {
        backend.attach(&req.id.token).await?
    } else {
        backend.attach_unheld(&req.id.token).await?
    })
}

/// Healthy when the backend still provides the device behind the volume, finds nothing
/// wrong under it, an encrypted volume's mapping is open and running, and its
/// filesystem (`filesystem`: what is wrong with it, if anything) is sound. The storage's
/// failure comes first, then the mapping's: each is usually what the next one's is the
/// effect of. A device gone is said in the backend's words where it can tell why (a
/// loop image deleted under its device).
async fn condition_of(
    host: &Host,
    backend: &Backend,
    record: &VolumeRecord,
    filesystem: Option<String>,
) -> Result<VolumeCondition, VolumeError> {
    let id = &record.id;
    let device = backend.device(&id.token).await;
    let dev = match &device {
        Ok(Some(device)) => host.syscalls.device_number(device).await.ok().flatten(),
        _ => None,
    };
    let (device, dev) = match (device, dev) {
        (Ok(Some(device)), Some(dev)) => (device, dev),
        (Ok(_), _) => {
            let message = match backend.volume_health(record, None).await {
                Ok(VolumeHealth::Abnormal(why)) => why,
                _ => "the volume's block device is gone".to_string(),
            };
            return Ok(VolumeCondition {
                abnormal: true,
                message,
            });
        }
        (Err(e), _) => {
            warn!(volume.id = %id, error = %e, "cannot check the volume's device");
            return Ok(VolumeCondition {
                abnormal: true,
                message: format!("cannot check the volume's device: {e}"),
            });
        }
    };
    // Between the storage and the filesystem: an encrypted volume's mapping.
    let above = match record.encryption {
        Some(_) => super::encryption::mapping_problem(host, id, &device).await,
        None => None,
    }
    .or(filesystem);
    Ok(
        match (backend.volume_health(record, Some((&device, dev))).await, above) {
            (Ok(VolumeHealth::Healthy | VolumeHealth::Warning(_)), Some(why)) => VolumeCondition {
                abnormal: true,
                message: format!("{why} (on {})", device.display()),
            },
            (Ok(VolumeHealth::Healthy), None) => VolumeCondition {
                abnormal: false,
                message: format!("healthy on {}", device.display()),
            },
            (Ok(VolumeHealth::Warning(why)), None) => VolumeCondition {
                abnormal: false,
                message: format!("healthy on {}; {why}", device.display()),
            },
            (Ok(VolumeHealth::Abnormal(why)), _) => VolumeCondition {
                abnormal: true,
                message: format!("{why} (on {})", device.display()),
            },
            (Err(e), _) => {
                warn!(volume.id = %id, error = %e, "cannot check the volume's storage");
                VolumeCondition {
                    abnormal: true,
                    message: format!("cannot check the volume's storage: {e}"),
                }
            }
        },
    )
}
