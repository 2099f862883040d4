//! Creating and deleting namespaces, in the order the module documentation of `pmem`
//! describes: a record first, the namespace, clearing, then the record marked done.

use tracing::warn;

use super::ndctl::{Namespace, Region};
use super::{CHANGE_TIMEOUT, PmemBackend, PmemError, RecordFile, namespace_name, ndctl, zero_timeout};
use crate::backend::files;
use crate::backend::{BackendError, CreateSpec, VolumeRecord};
use crate::host::CommandSpec;
use crate::model::{Token, VolumeMode};

impl PmemBackend {
    async fn destroy(&self, token: &Token, ns: &Namespace) -> Result<(), BackendError> {
        let cmd = CommandSpec::new("ndctl")
            .args(["destroy-namespace", "-f", &ns.dev])
            .timeout(CHANGE_TIMEOUT);
        let ticket = self.cache.begin_change().await;
        let result = self.host.commands.run(cmd).await;
        let destroyed = |region: &mut Region| region.destroyed(&ns.dev);
        self.cache
            .finish_change(ticket, result.is_ok().then_some(destroyed))
            .await;
        match result {
            Ok(_) => Ok(()),
            // ndctl says the same of a namespace in a region disabled since the cached
            // listing: only a fresh one (the failed change made it stale) says it is gone.
            Err(e) if ndctl::stderr::is_missing(e.stderr()) => match self.state().await?.is_disabled() {
                true => Err(PmemError::RegionUnreachable {
                    region: self.region.clone(),
                }
                .into()),
                false => Ok(()),
            },
            Err(e) if ndctl::stderr::is_busy(e.stderr()) => Err(BackendError::InUse {
                token: token.clone(),
                by: format!(
                    "{} is busy (mounted or open)",
                    ns.blockdev.as_deref().unwrap_or(&ns.dev)
                ),
            }),
            Err(e) => Err(self.command_error("ndctl destroy-namespace", ns.dev.clone(), e)),
        }
    }

    pub async fn create(&self, spec: &CreateSpec) -> Result<VolumeRecord, BackendError> {
        let _allocation = self.allocation.lock().await;
        if let Err(BackendError::Pmem(PmemError::RegionUnreachable { region })) = self.known_state().await {
            return Err(PmemError::RegionDisabled { region }.into());
        }
        if let Some((record, _)) = self.volume(&spec.token).await? {
            return Ok(record);
        }
        let name = namespace_name(&spec.token);
        let earlier = self.read_record(&spec.token).await?;
        let region = self.known_state().await?;
        if let Some(ns) = self.namespace(&region, &name)? {
            if earlier.as_ref().is_none_or(|f| f.namespace != name) {
                return Err(PmemError::NameTaken {
                    region: self.region.clone(),
                    name,
                    class: self.class.clone(),
                }
                .into());
            }
            warn!(class = %self.class, namespace = %name, "destroying a namespace whose creation did not finish");
            self.destroy(&spec.token, ns).await?;
            return self.create_fresh(spec, name).await;
        }
        self.create_fresh(spec, name).await
    }

    async fn create_fresh(&self, spec: &CreateSpec, name: String) -> Result<VolumeRecord, BackendError> {
        let mut region = self.known_state().await?;
        let interrupted: Vec<Namespace> = region
            .namespaces
            .iter()
            .filter(|ns| ns.is_setup_interrupted())
            .cloned()
            .collect();
        for ns in &interrupted {
            warn!(class = %self.class, namespace = %ns.dev, "resetting a namespace whose setup an interrupted create left midway");
            self.destroy(&spec.token, ns).await?;
        }
        if !interrupted.is_empty() {
            region = self.known_state().await?;
        }
        let raw = ndctl::raw_for_usable(spec.size_bytes, self.align);
        // After our own create or destroy the report knows the namespaces but not the
        // free space; then ndctl's own refusal decides, which costs no listing.
        if !region.sizes_unknown && raw > region.max_available_extent {
            return Err(BackendError::NoSpace {
                class: self.class.clone(),
                requested: spec.size_bytes,
                available: self.capacity_of(&region).max_volume,
            });
        }
        let mut file = RecordFile {
            name: spec.name.clone(),
            size_bytes: spec.size_bytes,
            mode: spec.mode,
            fs_type: spec.fs_type,
            pvc_name: spec.claim.pvc_name.clone(),
            pvc_namespace: spec.claim.pvc_namespace.clone(),
            pv_name: spec.claim.pv_name.clone(),
            namespace: name.clone(),
            pending: true,
            formatted: (spec.mode == VolumeMode::Filesystem).then_some(false),
        };
        self.write_record(&spec.token, &file).await?;
        let cmd = CommandSpec::new("ndctl")
            .args(["create-namespace", "-r", &self.region, "-m", "fsdax", "-M", "dev"])
            .args(["-s", &raw.to_string(), "-n", &name])
            .timeout(CHANGE_TIMEOUT);
        let ticket = self.cache.begin_change().await;
        let created = self
            .host
            .commands
            .run(cmd)
            .await
            .map(|out| ndctl::parse_namespace(&out.stdout));
        let patch = match &created {
            Ok(Ok(ns)) => Some(|region: &mut Region| region.created(ns.clone())),
            _ => None,
        };
        self.cache.finish_change(ticket, patch).await;
        let ns = match created {
            Ok(parsed) => parsed.map_err(|reason| PmemError::Report {
                region: self.region.clone(),
                reason,
            }),
            Err(e) => {
                files::remove_durably(&self.dir, &self.record_path(&spec.token)).await?;
                // A region disabled since the cached listing has "no space" too.
                if self.state().await?.is_disabled() {
                    return Err(PmemError::RegionDisabled {
                        region: self.region.clone(),
                    }
                    .into());
                }
                return Err(if ndctl::stderr::is_no_space(e.stderr()) {
                    BackendError::NoSpace {
                        class: self.class.clone(),
                        requested: spec.size_bytes,
                        available: self.capacity().await?.max_volume,
                    }
                } else {
                    self.command_error("ndctl create-namespace", name, e)
                });
            }
        };
        match self.clear(spec, &name, ns).await {
            Ok(ns) => {
                file.size_bytes = ns.size;
                file.pending = false;
                self.write_record(&spec.token, &file).await?;
                Ok(self.to_record(spec.token.clone(), file, Some(&ns)))
            }
            Err(e) => {
                // Leave nothing behind. If this fails too, the pending record remains:
                // not a volume, and cleaned up by the next create or delete of the name.
                if let Err(cleanup) = self.delete(&spec.token).await {
                    warn!(namespace = %name, error = %cleanup, "cannot remove a half-created namespace");
                }
                Err(e)
            }
        }
    }

    /// Checks the new namespace and clears what an earlier tenant left on it: a block
    /// volume is zeroed. A filesystem volume needs nothing here: its record says
    /// unformatted until mkfs has run, so its first stage formats over whatever the
    /// namespace holds without asking blkid, and no old filesystem is ever mounted.
    async fn clear(
        &self,
        spec: &CreateSpec,
        name: &str,
        ns: Result<Namespace, PmemError>,
    ) -> Result<Namespace, BackendError> {
        let ns = ns?;
        if ns.size < spec.size_bytes {
            return Err(PmemError::TooSmall {
                name: name.to_string(),
                wanted: spec.size_bytes,
                got: ns.size,
            }
            .into());
        }
        let device = self.device_of(&ns).ok_or_else(|| PmemError::Report {
            region: self.region.clone(),
            reason: format!("new namespace {} has no block device", ns.dev),
        })?;
        if spec.mode == VolumeMode::Block {
            let cmd = CommandSpec::new("blkdiscard")
                .args(["-f", "-z"])
                .arg(&device)
                .timeout(zero_timeout(ns.size));
            self.host.commands.run(cmd).await?;
        }
        Ok(ns)
    }

    pub async fn delete(&self, token: &Token) -> Result<(), BackendError> {
        // Only a namespace a record of ours names is ours to destroy.
        let Some(file) = self.read_record(token).await? else {
            return Ok(());
        };
        let region = self.known_state().await?;
        if let Some(ns) = self.namespace(&region, &file.namespace)? {
            self.destroy(token, ns).await?;
        }
        files::remove_durably(&self.dir, &self.record_path(token)).await
    }
}
