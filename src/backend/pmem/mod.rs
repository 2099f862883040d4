//! PMEM in direct mode: one fsdax namespace per volume, carved from one region with
//! ndctl. (PMEM in lvm mode is an LVM backend on a VG of fsdax namespaces.)
//!
//! **Sizes are never shrunk.** A namespace's size must be a multiple of the region
//! alignment (16 MiB), and an fsdax namespace loses a reserve (info block and struct
//! pages) to its metadata. A volume gets the smallest namespace whose *usable* size is
//! at least the request; when that exceeds the request's limit the request is refused
//! (OUT_OF_RANGE). A namespace cannot grow in place, so expansion is refused too.
//!
//! **Records.** A namespace has only a name, so the rest of a volume's record (the
//! CreateVolume name, mode, filesystem, claim) is a JSON file per volume under the
//! data directory. The record is written first, marked pending, then the namespace is
//! made and cleared, then the record is marked done: a volume exists when both do and
//! the record is done. A retry that finds a pending record destroys the namespace it
//! names and starts again; a namespace with our name but no record of ours is never
//! touched. A create killed before ndctl wrote the namespace's size leaves an idle
//! namespace that holds no storage but keeps its new uuid, which the kernel can refuse
//! to replace; every create resets such a namespace first
//! ([`ndctl::Namespace::is_setup_interrupted`]).
//!
//! **No old bytes.** A new namespace shows whatever an earlier one left in the same
//! place (captured in the fixtures). Raw block volumes are zeroed whole before they
//! become volumes. A filesystem volume's record says unformatted until mkfs has run,
//! so its first stage formats over whatever the namespace holds without asking blkid:
//! nothing old is mounted, and the new filesystem's files read only what was written
//! to them.
//!
//! **State** is one `ndctl list` of the region, cached. Our own creates and destroys
//! apply the namespace they made or removed to it; the free sizes they changed are
//! left to ndctl (capacity lists again; a create lets ndctl refuse).
//!
//! **A disabled region** lists no namespaces, so it cannot say whether a volume's
//! namespace still exists. Nothing is concluded from that: the class offers no space and
//! refuses creates (RESOURCE_EXHAUSTED), calls that would change or reach a volume
//! answer UNAVAILABLE, its records are kept and still listed, its storage is critical
//! and its volumes abnormal ([`health`]), until the region is enabled again.

pub mod fuzz;
mod health;
pub mod ndctl;
mod provision;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;
use tracing::{info, warn};

use self::ndctl::{Namespace, Region};
use super::cache::{DEFAULT_TTL, KNOWN_TTL, REFUSAL_TTL, ReportCache};
use super::files;
use super::{BackendError, ClassCapacity, StorageHealth, VolumeHealth, VolumeRecord};
use crate::fs::FsType;
use crate::host::{CommandError, CommandSpec, Host};
use crate::model::{CapacityRange, ClaimRef, DEFAULT_VOLUME_BYTES, ValidationError};
use crate::model::{ClassName, Token, VolumeId, VolumeMode};

const LIST_TIMEOUT: Duration = Duration::from_secs(60);
const CHANGE_TIMEOUT: Duration = Duration::from_secs(120);
/// ndctl keeps namespace names in a 64-byte label field.
const MAX_NAMESPACE_NAME: usize = 63;

#[derive(Debug, thiserror::Error)]
pub enum PmemError {
    #[error("PMEM region {region} does not exist on this node")]
    RegionNotFound { region: String },
    /// A create in a disabled region: there is no space to give.
    #[error("{}", health::disabled(region))]
    RegionDisabled { region: String },
    /// A call that needs a volume's namespace while its region is disabled.
    #[error("{}; nothing was changed", health::disabled(region))]
    RegionUnreachable { region: String },
    #[error(
        "volume {token} is an fsdax namespace of {size} bytes, and a namespace cannot grow in place \
         ({requested} bytes requested); use a pmem class in lvm mode for volumes that grow"
    )]
    FixedSize { token: Token, size: u64, requested: u64 },
    #[error(
        "region {region} already has a namespace named {name} that is not a volume of device class {class}"
    )]
    NameTaken {
        region: String,
        name: String,
        class: ClassName,
    },
    #[error("region {region} has {count} namespaces named {name}")]
    Duplicate {
        region: String,
        name: String,
        count: usize,
    },
    #[error("namespace {name} offers {got} bytes, less than the {wanted} required")]
    TooSmall { name: String, wanted: u64, got: u64 },
    #[error("cannot parse ndctl's output for region {region}: {reason}")]
    Report { region: String, reason: String },
    #[error("listing region {region} failed moments ago; not retried yet: {reason}")]
    ReportUnavailable { region: String, reason: String },
    #[error("{op} {target}: {source}")]
    Command {
        op: &'static str,
        target: String,
        #[source]
        source: CommandError,
    },
}

/// The record file's contents. Field names are a stable on-disk format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct RecordFile {
    name: String,
    /// The usable bytes of the namespace.
    size_bytes: u64,
    mode: VolumeMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fs_type: Option<FsType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pvc_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pvc_namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pv_name: Option<String>,
    /// The namespace's name in the region.
    namespace: String,
    /// True until the namespace exists and has been cleared.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pending: bool,
    /// For filesystem volumes, as in the loop backend's record: false from create
    /// (and again from just before any later mkfs) until mkfs finished, so a stage
    /// killed mid-mkfs is told apart from a real filesystem. Absent in records written
    /// before this field existed until their first format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    formatted: Option<bool>,
}

/// The namespace name of a volume: its token, or `n+` and a digest of it when the
/// token is longer than a namespace label allows.
pub fn namespace_name(token: &Token) -> String {
    let t = token.as_str();
    if t.len() <= MAX_NAMESPACE_NAME {
        t.to_string()
    } else {
        let digest = Sha256::digest(t.as_bytes());
        format!("n+{}", hex::encode(&digest[..16]))
    }
}

#[derive(Debug)]
pub struct PmemBackend {
    class: ClassName,
    region: String,
    dir: PathBuf,
    host: Host,
    align: u64,
    cache: ReportCache<Region>,
    /// Serialises the space check and the allocation of creates in this class.
    allocation: Mutex<()>,
}

fn zero_timeout(bytes: u64) -> Duration {
    Duration::from_secs(120 + bytes / (32 << 20))
}

impl PmemBackend {
    /// Checks the region exists, learns its alignment, prepares the record directory.
    pub async fn open(
        class: ClassName,
        region: String,
        dir: PathBuf,
        host: Host,
    ) -> Result<Self, BackendError> {
        let mut backend = Self {
            class,
            region,
            dir,
            host,
            align: 0,
            cache: ReportCache::new(DEFAULT_TTL),
            allocation: Mutex::new(()),
        };
        files::create_private_dir(&backend.dir).await?;
        let region = backend.state().await?;
        backend.align = region.align.max(ndctl::FSDAX_ALIGN);
        if region.is_disabled() {
            warn!(class = %backend.class, region = %backend.region, "{}", health::disabled(&backend.region));
        }
        if region.available_size == 0
            && region
                .namespaces
                .iter()
                .any(|n| n.mode == "raw" && n.size == region.size)
        {
            warn!(
                class = %backend.class, region = %backend.region,
                "region has no free space: its label area looks uninitialised (one raw namespace \
                 covers it); see `ndctl init-labels`"
            );
        }
        info!(class = %backend.class, region = %backend.region, align = backend.align, "PMEM device class ready");
        Ok(backend)
    }

    pub fn class(&self) -> &ClassName {
        &self.class
    }

    pub fn alignment(&self) -> u64 {
        self.align
    }

    async fn state(&self) -> Result<Arc<Region>, BackendError> {
        self.state_within(self.cache.ttl()).await
    }

    /// The cached report up to [`KNOWN_TTL`] old, with our own creates and destroys
    /// applied: for looking up this class's namespaces. A disabled region lists none,
    /// which says nothing of them: [`PmemError::RegionUnreachable`], on a report
    /// recent enough that an administrator's `ndctl enable-region` is seen.
    async fn known_state(&self) -> Result<Arc<Region>, BackendError> {
        let region = self.state_within(KNOWN_TTL).await?;
        if !region.is_disabled() {
            return Ok(region);
        }
        let recent = self.state_within(REFUSAL_TTL).await?;
        if recent.is_disabled() {
            return Err(PmemError::RegionUnreachable {
                region: self.region.clone(),
            }
            .into());
        }
        Ok(recent)
    }

    async fn state_within(&self, max_age: Duration) -> Result<Arc<Region>, BackendError> {
        self.cache
            .get_within(
                max_age,
                || self.read(),
                |reason| {
                    BackendError::from(PmemError::ReportUnavailable {
                        region: self.region.clone(),
                        reason,
                    })
                },
            )
            .await
    }

    /// A report whose free sizes are ndctl's own: for capacity.
    async fn sized_state(&self) -> Result<Arc<Region>, BackendError> {
        let region = self.state().await?;
        if !region.sizes_unknown {
            return Ok(region);
        }
        self.cache.invalidate();
        self.state().await
    }

    async fn read(&self) -> Result<Region, BackendError> {
        let cmd = CommandSpec::new("ndctl")
            .args(["list", "-R", "-N", "-i", "-r", &self.region])
            .timeout(LIST_TIMEOUT);
        let out = self
            .host
            .commands
            .run(cmd)
            .await
            .map_err(|source| self.command_error("ndctl list", self.region.clone(), source))?;
        let regions = ndctl::parse_regions(&out.stdout).map_err(|reason| PmemError::Report {
            region: self.region.clone(),
            reason,
        })?;
        Ok(regions
            .into_iter()
            .find(|r| r.dev == self.region)
            .ok_or_else(|| PmemError::RegionNotFound {
                region: self.region.clone(),
            })?)
    }

    fn command_error(&self, op: &'static str, target: String, source: CommandError) -> BackendError {
        PmemError::Command { op, target, source }.into()
    }

    fn record_path(&self, token: &Token) -> PathBuf {
        self.dir.join(format!("{token}.json"))
    }

    async fn read_record(&self, token: &Token) -> Result<Option<RecordFile>, BackendError> {
        files::read_json(self.record_path(token), token).await
    }

    async fn write_record(&self, token: &Token, record: &RecordFile) -> Result<(), BackendError> {
        let json = serde_json::to_vec_pretty(record).expect("record serialises");
        files::write_atomically(&self.dir, &self.record_path(token), json).await
    }

    /// The namespace named `name`, if any; two of them is an error. An idle seed is
    /// never a match, whatever its name (see [`Namespace::is_idle_seed`]); a namespace
    /// an interrupted create left disabled is, so that the retry destroys it.
    fn namespace<'a>(&self, region: &'a Region, name: &str) -> Result<Option<&'a Namespace>, BackendError> {
        let mut found = region
            .namespaces
            .iter()
            .filter(|n| !n.is_idle_seed() && n.name.as_deref() == Some(name));
        let first = found.next();
        let more = found.count();
        if more > 0 {
            return Err(PmemError::Duplicate {
                region: self.region.clone(),
                name: name.to_string(),
                count: more + 1,
            }
            .into());
        }
        Ok(first)
    }

    /// The volume a done record describes, sized by its namespace when that is enabled
    /// (`None`: not seen, while the region is disabled).
    fn to_record(&self, token: Token, file: RecordFile, namespace: Option<&Namespace>) -> VolumeRecord {
        let size_bytes = match namespace {
            Some(ns) if ns.blockdev.is_some() => ns.size,
            _ => file.size_bytes,
        };
        VolumeRecord {
            id: VolumeId::new(self.class.clone(), token),
            name: file.name,
            size_bytes,
            mode: file.mode,
            fs_type: file.fs_type,
            filesystem_grow_pending: false,
            // Direct mode is DAX, which dm-crypt cannot carry: never encrypted.
            encryption: None,
            claim: ClaimRef {
                pvc_name: file.pvc_name,
                pvc_namespace: file.pvc_namespace,
                pv_name: file.pv_name,
            },
        }
    }

    /// A finished volume: its done record and its namespace.
    async fn volume(&self, token: &Token) -> Result<Option<(VolumeRecord, Namespace)>, BackendError> {
        let Some(file) = self.read_record(token).await?.filter(|f| !f.pending) else {
            return Ok(None);
        };
        let region = self.known_state().await?;
        match self.namespace(&region, &file.namespace)? {
            Some(ns) => Ok(Some((self.to_record(token.clone(), file, Some(ns)), ns.clone()))),
            None => {
                warn!(class = %self.class, volume = %token, namespace = %file.namespace, "the record names a namespace that is gone");
                Ok(None)
            }
        }
    }

    /// The volume, from its done record and its namespace; while the region is disabled,
    /// from its done record alone, so that the class's volumes are still listed and
    /// looked up (a lookup of a name in every class, a volume's stats) and reported.
    pub async fn get(&self, token: &Token) -> Result<Option<VolumeRecord>, BackendError> {
        match self.volume(token).await {
            Err(BackendError::Pmem(PmemError::RegionUnreachable { .. })) => Ok(self
                .read_record(token)
                .await?
                .filter(|f| !f.pending)
                .map(|file| self.to_record(token.clone(), file, None))),
            found => Ok(found?.map(|(record, _)| record)),
        }
    }

    pub async fn list(&self) -> Result<Vec<VolumeRecord>, BackendError> {
        let mut records = Vec::new();
        for token in files::record_tokens(&self.dir).await? {
            if let Some(record) = self.get(&token).await? {
                records.push(record);
            }
        }
        records.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(records)
    }

    /// The usable size to give a request: the smallest namespace that holds
    /// `required` (or the default size, within the limit), refused when it would
    /// exceed the limit. Never less than asked.
    pub fn size_for(&self, capacity: &CapacityRange) -> Result<u64, ValidationError> {
        let raw = if capacity.required == 0 {
            let wanted = capacity
                .limit
                .map_or(DEFAULT_VOLUME_BYTES, |l| l.min(DEFAULT_VOLUME_BYTES));
            ndctl::raw_within(wanted, self.align).unwrap_or_else(|| ndctl::raw_for_usable(1, self.align))
        } else {
            ndctl::raw_for_usable(capacity.required, self.align)
        };
        let usable = ndctl::fsdax_usable(raw);
        match capacity.limit {
            Some(limit) if usable > limit => Err(ValidationError::OutOfRange(format!(
                "an fsdax namespace holding {} bytes needs {raw} bytes of the region ({} alignment) and \
                 offers {usable} bytes, above the limit of {limit}",
                capacity.required, self.align
            ))),
            _ => Ok(usable),
        }
    }

    fn capacity_of(&self, region: &Region) -> ClassCapacity {
        let usable = |raw: u64| ndctl::fsdax_usable(raw / self.align * self.align);
        if region.is_disabled() {
            return ClassCapacity {
                available: 0,
                total: region.size,
                max_volume: 0,
            };
        }
        ClassCapacity {
            available: usable(region.available_size),
            total: region.size,
            max_volume: usable(region.max_available_extent),
        }
    }

    pub async fn capacity(&self) -> Result<ClassCapacity, BackendError> {
        Ok(self.capacity_of(&*self.sized_state().await?))
    }

    /// The region's state, the class's storage health (see [`health`]).
    pub async fn storage_health(&self) -> Result<StorageHealth, BackendError> {
        Ok(health::region_health(&*self.state().await?))
    }

    /// What is wrong under the volume: its region disabled (from the cached listing),
    /// or media errors on device `dev`, its namespace's block device (`None`: the device
    /// is gone, which the caller reports): the bad sectors the kernel lists for it (one
    /// sysfs read; the namespace is looked up only to name it). Reads of them fail with
    /// EIO, and what they held is lost.
    pub async fn volume_health(&self, token: &Token, dev: Option<u64>) -> Result<VolumeHealth, BackendError> {
        if self.state().await?.is_disabled() {
            return Ok(VolumeHealth::Abnormal(health::disabled(&self.region)));
        }
        let Some(dev) = dev else {
            return self.without_device(token).await;
        };
        let bad = self.host.syscalls.bad_sectors(dev).await?;
        if bad == 0 {
            return Ok(VolumeHealth::Healthy);
        }
        let Some((_, ns)) = self.volume(token).await? else {
            return Ok(VolumeHealth::Healthy);
        };
        Ok(VolumeHealth::Abnormal(format!(
            "its namespace {} has {bad} bad sector{} (media errors the kernel lists in \
             /sys/block/{}/badblocks): reads of them fail and what they held is lost; copy \
             off what reads, then clear them (ndctl clear-errors {}) or delete the volume",
            ns.dev,
            if bad == 1 { "" } else { "s" },
            ns.blockdev.as_deref().unwrap_or_default(),
            ns.dev
        )))
    }

    /// Why the volume has no block device, where the listing can tell: its namespace
    /// disabled (`ndctl disable-namespace`, which nothing refuses while only binds of
    /// its node hold it). Asked of a listing at most [`REFUSAL_TTL`] old, and only
    /// while a device is gone, so that an `ndctl enable-namespace` is seen soon.
    async fn without_device(&self, token: &Token) -> Result<VolumeHealth, BackendError> {
        let Some(file) = self.read_record(token).await?.filter(|f| !f.pending) else {
            return Ok(VolumeHealth::Healthy);
        };
        let region = self.state_within(REFUSAL_TTL).await?;
        Ok(match self.namespace(&region, &file.namespace)? {
            Some(ns) if ns.blockdev.is_none() && ns.state.as_deref() == Some("disabled") => {
                VolumeHealth::Abnormal(health::namespace_disabled(&ns.dev))
            }
            _ => VolumeHealth::Healthy,
        })
    }

    fn device_of(&self, ns: &Namespace) -> Option<PathBuf> {
        ns.blockdev.as_ref().map(|b| Path::new("/dev").join(b))
    }

    pub async fn expand(&self, token: &Token, size_bytes: u64) -> Result<u64, BackendError> {
        let (record, _) = self.volume(token).await?.ok_or_else(|| BackendError::NotFound {
            class: self.class.clone(),
            token: token.clone(),
        })?;
        if size_bytes <= record.size_bytes {
            return Ok(record.size_bytes);
        }
        Err(PmemError::FixedSize {
            token: token.clone(),
            size: record.size_bytes,
            requested: size_bytes,
        }
        .into())
    }

    /// The namespace's block device; `None` while the namespace is disabled, or the
    /// whole region is (its devices are gone).
    pub async fn device(&self, token: &Token) -> Result<Option<PathBuf>, BackendError> {
        match self.volume(token).await {
            Err(BackendError::Pmem(PmemError::RegionUnreachable { .. })) => Ok(None),
            found => Ok(found?.and_then(|(_, ns)| self.device_of(&ns))),
        }
    }

    /// The namespace's block device, enabling the namespace if it was disabled.
    pub async fn attach(&self, token: &Token) -> Result<PathBuf, BackendError> {
        let (_, ns) = self.volume(token).await?.ok_or_else(|| BackendError::NotFound {
            class: self.class.clone(),
            token: token.clone(),
        })?;
        if let Some(device) = self.device_of(&ns) {
            return Ok(device);
        }
        let cmd = CommandSpec::new("ndctl")
            .args(["enable-namespace", &ns.dev])
            .timeout(CHANGE_TIMEOUT);
        let result = self.host.commands.run(cmd).await;
        self.cache.invalidate();
        result.map_err(|e| self.command_error("ndctl enable-namespace", ns.dev.clone(), e))?;
        self.device(token).await?.ok_or_else(|| {
            PmemError::Report {
                region: self.region.clone(),
                reason: format!("namespace {} has no block device after enabling it", ns.dev),
            }
            .into()
        })
    }

    /// Namespaces stay enabled: there is nothing to undo per stage.
    pub async fn detach(&self, _token: &Token) -> Result<(), BackendError> {
        Ok(())
    }

    pub async fn refresh_device(&self, _token: &Token) -> Result<(), BackendError> {
        Ok(())
    }

    /// The done record of `token`'s volume (the namespace is not looked at: the format
    /// mark is the record's business alone).
    async fn done_record(&self, token: &Token) -> Result<RecordFile, BackendError> {
        self.read_record(token)
            .await?
            .filter(|f| !f.pending)
            .ok_or_else(|| BackendError::NotFound {
                class: self.class.clone(),
                token: token.clone(),
            })
    }

    /// True when the record says a format began and never finished.
    pub async fn format_unfinished(&self, token: &Token) -> Result<bool, BackendError> {
        Ok(self
            .read_record(token)
            .await?
            .is_some_and(|f| !f.pending && f.formatted == Some(false)))
    }

    /// Marks the record unformatted before mkfs runs (already so for a new volume).
    pub async fn begin_format(&self, token: &Token) -> Result<(), BackendError> {
        self.set_formatted(token, false).await
    }

    /// Records that mkfs completed, before the volume is first mounted.
    pub async fn mark_formatted(&self, token: &Token) -> Result<(), BackendError> {
        self.set_formatted(token, true).await
    }

    async fn set_formatted(&self, token: &Token, formatted: bool) -> Result<(), BackendError> {
        let mut file = self.done_record(token).await?;
        if file.formatted == Some(formatted) {
            return Ok(());
        }
        file.formatted = Some(formatted);
        self.write_record(token, &file).await
    }

    pub async fn check_health(&self) -> Result<(), BackendError> {
        self.state().await.map(drop)
    }
}
