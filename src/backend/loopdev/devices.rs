//! The loop backend's devices: finding the loop devices on a volume's image, attaching,
//! detaching (and waiting until the kernel really let go) and resizing them.

use std::collections::HashMap;
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
    ///
    /// Only devices whose shown path ends in the image's file name are asked for their
    /// inode: the kernel prints a path relative to a vanished mount, but still the
    /// file's own name (images are never renamed). So a lookup reads sysfs and opens at
    /// most the image's own devices, not every loop device of the node: with hundreds of
    /// volumes, stats and stage calls would otherwise open them all each time.
    async fn devices_on(
        &self,
        token: &Token,
        deleted: bool,
        first: bool,
    ) -> Result<Vec<PathBuf>, BackendError> {
        if first && let Some(device) = self.remembered(token, deleted).await? {
            return Ok(vec![device]);
        }
        let image = self.image_path(token);
        let mut deleted_name = image.clone().into_os_string();
        deleted_name.push(" (deleted)");
        let devices = self.host.syscalls.loop_devices().await?;
        if first && !self.warmed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            self.remember_all(&devices).await?;
            if let Some(device) = self.remembered(token, deleted).await? {
                return Ok(vec![device]);
            }
        }
        let by_path = |d: &LoopDevice| {
            d.backing_file == image || (deleted && d.backing_file.as_os_str() == deleted_name)
        };
        let file_name = image.file_name().unwrap_or_default();
        let named_like_image = |d: &LoopDevice| {
            let shown = d.backing_file.as_os_str().as_encoded_bytes();
            let shown = shown.strip_suffix(b" (deleted)").unwrap_or(shown);
            shown.ends_with(file_name.as_encoded_bytes())
        };
        let mut found: Vec<LoopDevice> = Vec::new();
        if first && let Some(d) = devices.iter().find(|d| by_path(d)) {
            found.push(d.clone());
        } else {
            let mut inode = None;
            for device in devices {
                if first && !found.is_empty() {
                    break;
                }
                if by_path(&device) {
                    found.push(device);
                } else if named_like_image(&device) {
                    if inode.is_none() {
                        inode = Some(image_inode(&image).await);
                    }
                    let Some(Some(image_inode)) = inode else { continue };
                    if self.host.syscalls.loop_backing_inode(&device.device).await? == Some(image_inode) {
                        found.push(device);
                    }
                }
            }
        }
        if first && let Some(d) = found.first() {
            self.found_lock()
                .insert(token.clone(), (d.device.clone(), d.backing_file.clone()));
        }
        Ok(found.into_iter().map(|d| d.device).collect())
    }

    /// The first lookup after start-up remembers the device of every image of this
    /// class in the list, each checked by inode once. A restarted daemon finds every
    /// volume's device shown by a path relative to the previous container's vanished
    /// mount, and kubelet then asks for every volume's stats: without this, each of
    /// those lookups would list every device and check its own by inode.
    async fn remember_all(&self, devices: &[LoopDevice]) -> Result<(), BackendError> {
        for device in devices {
            let shown = &device.backing_file;
            if shown.as_os_str().as_encoded_bytes().ends_with(b" (deleted)") {
                continue;
            }
            let Some(token) = shown
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".img"))
                .and_then(Token::parse)
            else {
                continue;
            };
            if self.found_lock().contains_key(&token) {
                continue;
            }
            let image = self.image_path(&token);
            let ours = *shown == image
                || match image_inode(&image).await {
                    Some(inode) => {
                        self.host.syscalls.loop_backing_inode(&device.device).await? == Some(inode)
                    }
                    // No such image here: another class's or another program's file.
                    None => false,
                };
            if ours {
                self.found_lock()
                    .insert(token, (device.device.clone(), shown.clone()));
            }
        }
        Ok(())
    }

    fn found_lock(&self) -> std::sync::MutexGuard<'_, HashMap<Token, (PathBuf, PathBuf)>> {
        self.found.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The device the image was last found on, if sysfs still shows the same backing
    /// file for it: the same string is the same file (a path of ours names the image; a
    /// path the kernel prints relative to a vanished mount was checked by inode, and no
    /// new attach can print it again), and a file deleted since shows ` (deleted)`.
    async fn remembered(&self, token: &Token, deleted: bool) -> Result<Option<PathBuf>, BackendError> {
        let Some((device, shown)) = self.found_lock().get(token).cloned() else {
            return Ok(None);
        };
        let now = self.host.syscalls.loop_backing_file(&device).await?;
        if now.as_ref() != Some(&shown) {
            self.found_lock().remove(token);
            return Ok(None);
        }
        let shown_deleted = shown.as_os_str().as_encoded_bytes().ends_with(b" (deleted)");
        Ok((deleted || !shown_deleted).then_some(device))
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
        self.attach_unheld(token).await
    }

    /// Attaches the image of a volume whose record exists and which is on no device
    /// (see [`Backend::attach_unheld`](crate::backend::Backend::attach_unheld)).
    pub async fn attach_unheld(&self, token: &Token) -> Result<PathBuf, BackendError> {
        // Ioctls, not `losetup --find --show`: the kernel calls it makes, without a
        // process to spawn (milliseconds of every stage).
        let image = self.image_path(token);
        let device = self.host.syscalls.loop_attach(&image).await?;
        // Found by its path from now on (see `remembered`); if sysfs shows another
        // string for it, the next lookup finds it the long way.
        self.found_lock().insert(token.clone(), (device.clone(), image));
        Ok(device)
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
