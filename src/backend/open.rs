//! Opens the backend of each configured device class. Classes on the same volume
//! group share one report cache and one allocation lock.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::lvm::{Layout, LvmSettings, VolumeGroup};
use super::{Backend, BackendError, LoopBackend, LvmBackend, PmemBackend};
use crate::config::{DeviceClass, KindConfig, PmemMode};
use crate::host::Host;

/// TopoLVM's default for `spare-gb`: space of a VG never handed out.
pub const DEFAULT_SPARE_GB: u64 = 10;

#[derive(Debug)]
pub struct Opener {
    host: Host,
    data_dir: PathBuf,
    vgs: BTreeMap<String, Arc<VolumeGroup>>,
}

impl Opener {
    pub fn new(host: Host, data_dir: PathBuf) -> Self {
        Self {
            host,
            data_dir,
            vgs: BTreeMap::new(),
        }
    }

    fn vg(&mut self, name: &str) -> Arc<VolumeGroup> {
        let host = &self.host;
        Arc::clone(
            self.vgs
                .entry(name.to_string())
                .or_insert_with(|| VolumeGroup::new(name.to_string(), host.clone())),
        )
    }

    /// Checks that the class's storage exists and prepares what it needs.
    pub async fn open(&mut self, class: &DeviceClass) -> Result<Backend, BackendError> {
        let name = class.name.clone();
        let lvm = |kind, layout, lvcreate_options: &Vec<String>, dax| LvmSettings {
            kind,
            layout,
            lvcreate_options: lvcreate_options.clone(),
            dax,
        };
        let (vg, settings) = match &class.kind {
            KindConfig::Loop {
                directory,
                capacity_gb,
            } => {
                let directory = directory.clone().expect("validated config fills the directory");
                let limit = capacity_gb.expect("validated config fills the capacity") << 30;
                let backend = LoopBackend::new(name, directory, limit, self.host.clone());
                backend.prepare().await?;
                return Ok(Backend::Loop(backend));
            }
            KindConfig::Pmem {
                mode: PmemMode::Direct,
                region,
                ..
            } => {
                let region = region.clone().expect("validated config has a region");
                let dir = self.data_dir.join("pmem").join(name.as_str());
                let backend = PmemBackend::open(name, region, dir, self.host.clone()).await?;
                return Ok(Backend::Pmem(backend));
            }
            KindConfig::Lvm {
                volume_group,
                spare_gb,
                stripe,
                stripe_size,
                lvcreate_options,
            } => (
                volume_group.clone(),
                lvm(
                    "lvm",
                    Layout::Thick {
                        spare_bytes: spare_gb.unwrap_or(DEFAULT_SPARE_GB) << 30,
                        stripes: *stripe,
                        stripe_size: stripe_size.clone(),
                    },
                    lvcreate_options,
                    false,
                ),
            ),
            KindConfig::LvmThin {
                volume_group,
                thin_pool,
                lvcreate_options,
            } => (
                volume_group.clone(),
                lvm(
                    "lvm-thin",
                    Layout::Thin {
                        pool: thin_pool.name.clone(),
                        overprovision_ratio: thin_pool.overprovision_ratio,
                        thresholds: thin_pool.thresholds(),
                    },
                    lvcreate_options,
                    false,
                ),
            ),
            KindConfig::Pmem {
                mode: PmemMode::Lvm,
                volume_group,
                ..
            } => (
                volume_group.clone().expect("validated config has a volume group"),
                lvm(
                    "pmem",
                    Layout::Thick {
                        spare_bytes: 0,
                        stripes: None,
                        stripe_size: None,
                    },
                    &Vec::new(),
                    true,
                ),
            ),
        };
        let vg = self.vg(&vg);
        Ok(Backend::Lvm(
            LvmBackend::open(name, settings, vg, self.host.clone()).await?,
        ))
    }
}
