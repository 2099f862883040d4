//! The loop backend's devices: finding the loop devices on a volume's image, attaching,
//! detaching (and waiting until the kernel really let go) and resizing them.

use std::path::PathBuf;
use std::time::Duration;

use super::{DETACH_WAIT, LOSETUP_TIMEOUT, LoopBackend, image_inode};
use crate::backend::BackendError;
use crate::host::{CommandSpec, LoopDevice};
use crate::model::Token;

impl LoopBackend {
    /// Loop devices whose backing file is this volume's image: by path, or by inode
    /// where the kernel no longer prints our path (a device attached by a daemon whose
    /// container, and so the mount the image was opened through, is gone). With
    /// `deleted`, also those still holding an image that was deleted under them (the
    /// kernel reports `<path> (deleted)`): nothing else would ever detach those. With
    /// `first`, only one: the first found by path if any, without the image's inode
    /// (one call fewer on every lookup of a device this daemon attached).
    async fn devices_on(
        &self,
        token: &Token,
        deleted: bool,
        first: bool,
    ) -> Result<Vec<PathBuf>, BackendError> {
        let image = self.image_path(token);
        let mut deleted_name = image.clone().into_os_string();
        deleted_name.push(" (deleted)");
        let devices = self.host.syscalls.loop_devices().await?;
        let by_path = |d: &LoopDevice| {
            d.backing_file == image || (deleted && d.backing_file.as_os_str() == deleted_name)
        };
        if first && let Some(found) = devices.iter().find(|d| by_path(d)) {
            return Ok(vec![found.device.clone()]);
        }
        let inode = image_inode(&image).await;
        Ok(devices
            .into_iter()
            .filter(|d| by_path(d) || (inode.is_some() && d.backing_inode == inode))
            .map(|d| d.device)
            .take(if first { 1 } else { usize::MAX })
            .collect())
    }

    async fn devices_of(&self, token: &Token) -> Result<Vec<PathBuf>, BackendError> {
        self.devices_on(token, false, false).await
    }

    async fn devices_holding(&self, token: &Token) -> Result<Vec<PathBuf>, BackendError> {
        self.devices_on(token, true, false).await
    }

    pub async fn device(&self, token: &Token) -> Result<Option<PathBuf>, BackendError> {
        Ok(self.devices_on(token, false, true).await?.into_iter().next())
    }

    /// The device holding the volume's data, even one whose image was deleted under it.
    pub async fn holding_device(&self, token: &Token) -> Result<Option<PathBuf>, BackendError> {
        Ok(self.devices_on(token, true, true).await?.into_iter().next())
    }

    pub async fn attach(&self, token: &Token) -> Result<PathBuf, BackendError> {
        if let Some(device) = self.device(token).await? {
            return Ok(device);
        }
        if self.read_record(token).await?.is_none() {
            return Err(BackendError::NotFound {
                class: self.class.clone(),
                token: token.clone(),
            });
        }
        // Ioctls, not `losetup --find --show`: the kernel calls it makes, without a
        // process to spawn (milliseconds of every stage).
        Ok(self.host.syscalls.loop_attach(&self.image_path(token)).await?)
    }

    pub async fn detach(&self, token: &Token) -> Result<(), BackendError> {
        for device in self.devices_holding(token).await? {
            match self.host.syscalls.loop_detach(&device).await {
                Ok(()) => {}
                // Detached meanwhile (autoclear, or another node agent): the goal is met.
                Err(e) if e.is_not_attached() || e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.wait_detached(token).await
    }

    /// The kernel only marks a loop device for autoclear, and reports success, when
    /// something else still has it open at LOOP_CLR_FD (a probe, a concurrent tool); the
    /// detach happens when that opener closes. Unstage is done only when the device has
    /// really let go of the file, so a DeleteVolume right after it never sees it in use.
    async fn wait_detached(&self, token: &Token) -> Result<(), BackendError> {
        // Short, slowly growing pauses: the opener holding the device is usually a
        // tool probing loop devices (udev's blkid, an administrator's `losetup`) that lets go
        // within milliseconds, and a doubling pause would oversleep that by as much.
        let mut pause = Duration::from_millis(1);
        let deadline = tokio::time::Instant::now() + DETACH_WAIT;
        loop {
            let remaining = self.devices_holding(token).await?;
            let Some(device) = remaining.first() else {
                return Ok(());
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(BackendError::InUse {
                    token: token.clone(),
                    by: format!(
                        "{} is still attached {DETACH_WAIT:?} after detaching: another process holds it open",
                        device.display()
                    ),
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 5 / 4).min(Duration::from_millis(20));
        }
    }

    pub async fn refresh_device(&self, token: &Token) -> Result<(), BackendError> {
        for device in self.devices_of(token).await? {
            self.host
                .commands
                .run(
                    CommandSpec::new("losetup")
                        .arg("--set-capacity")
                        .arg(&device)
                        .timeout(LOSETUP_TIMEOUT),
                )
                .await?;
        }
        Ok(())
    }
}
