//! Filesystems on volume devices: what is on a device, making one, growing one.
//!
//! A device is formatted only when blkid finds no signature at all on it: a filesystem
//! of another type, a partition table or a RAID/crypto header all stop the format, so a
//! retry after a crash, or a wrong request, never destroys data.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use crate::host::{CommandError, CommandSpec, Host, SyscallError};

pub mod fuzz;
pub mod health;
pub mod superblock;

/// The filesystems localvol makes and grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FsType {
    Ext4,
    Xfs,
}

impl FsType {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "ext4" => Some(FsType::Ext4),
            "xfs" => Some(FsType::Xfs),
            _ => None,
        }
    }

    /// The smallest device mkfs makes this filesystem on: mkfs.xfs refuses a data
    /// section under 300 MiB (xfsprogs 5.19 on), mke2fs fewer than 64 blocks of 4 KiB
    /// (DAX's block size; with the 1 KiB blocks of small devices it goes to 128 KiB).
    pub const fn min_bytes(self) -> u64 {
        match self {
            FsType::Ext4 => 256 << 10,
            FsType::Xfs => 300 << 20,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FsType::Ext4 => "ext4",
            FsType::Xfs => "xfs",
        }
    }
}

impl fmt::Display for FsType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What blkid found on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signature {
    Empty,
    Filesystem(String),
    /// A LUKS header: an encrypted volume's, opened with its passphrase, and on a
    /// volume without encryption never formatted over.
    Luks,
    /// A partition table, RAID member...: never formatted over.
    Other(String),
}

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("cannot probe {device}: {source}", device = device.display())]
    Probe {
        device: std::path::PathBuf,
        #[source]
        source: CommandError,
    },
    #[error("cannot create {fs_type} on {device}: {source}", device = device.display())]
    Format {
        fs_type: FsType,
        device: std::path::PathBuf,
        #[source]
        source: CommandError,
    },
    #[error("cannot grow {fs_type} on {device}: {source}", device = device.display())]
    Grow {
        fs_type: String,
        device: std::path::PathBuf,
        #[source]
        source: CommandError,
    },
    /// e2fsck found errors it could not repair on its own (or could not run): the
    /// filesystem is not grown until someone looks at it.
    #[error("cannot check the filesystem on {device} before growing it: {source}", device = device.display())]
    Check {
        device: std::path::PathBuf,
        #[source]
        source: CommandError,
    },
    #[error("cannot grow a {fs_type} filesystem: only ext4 and xfs are supported")]
    UnsupportedGrow { fs_type: String },
    #[error("cannot read the superblock on {device}: {source}", device = device.display())]
    ReadSuperblock {
        device: std::path::PathBuf,
        #[source]
        source: SyscallError,
    },
}

impl FsError {
    /// Whether the same request again cannot succeed (see [`crate::model::Terminal`]).
    pub fn is_terminal(&self) -> bool {
        match self {
            FsError::UnsupportedGrow { .. } => true,
            FsError::Probe { source, .. }
            | FsError::Format { source, .. }
            | FsError::Grow { source, .. }
            | FsError::Check { source, .. } => source.is_terminal(),
            FsError::ReadSuperblock { source, .. } => source.is_terminal(),
        }
    }
}

/// Parses `blkid -p -o export` output (KEY=value lines).
pub fn parse_blkid_export(output: &str) -> Signature {
    let value = |key: &str| {
        output
            .lines()
            .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
            .map(str::to_string)
    };
    match (value("TYPE"), value("USAGE"), value("PTTYPE")) {
        (_, _, Some(pt)) => Signature::Other(format!("partition table {pt}")),
        (Some(t), Some(usage), _) if usage == "crypto" && t == "crypto_LUKS" => Signature::Luks,
        (Some(t), Some(usage), _) if usage != "filesystem" => Signature::Other(format!("{usage} {t}")),
        (Some(t), _, _) => Signature::Filesystem(t),
        (None, _, _) => Signature::Empty,
    }
}

pub async fn probe(host: &Host, device: &Path) -> Result<Signature, FsError> {
    let cmd = CommandSpec::new("blkid")
        .args(["-p", "-o", "export"])
        .arg(device)
        .timeout(Duration::from_secs(30));
    match host.commands.run(cmd).await {
        Ok(out) => Ok(parse_blkid_export(&out.stdout_str())),
        // blkid exits 2 when the device carries no signature it knows.
        Err(e) if e.exit_code() == Some(2) => Ok(Signature::Empty),
        Err(source) => Err(FsError::Probe {
            device: device.to_path_buf(),
            source,
        }),
    }
}

/// Whether `device` holds the finished filesystem of a mkfs given `uuid` (see
/// [`superblock`]): one read of its first 4 KiB, no program run.
pub async fn finished_with(host: &Host, device: &Path, uuid: superblock::FsUuid) -> Result<bool, FsError> {
    let head = host
        .syscalls
        .device_head(device, superblock::HEAD_BYTES)
        .await
        .map_err(|source| FsError::ReadSuperblock {
            device: device.to_path_buf(),
            source,
        })?;
    Ok(superblock::finished_uuid(&head) == Some(uuid))
}

/// Extra knobs for mkfs that depend on the device class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FormatOptions {
    /// For DAX: xfs without reflink (the two are exclusive in the kernel), ext4 with
    /// 4 KiB blocks (the page size).
    pub dax: bool,
    /// The device reads zeros everywhere (a thin LV with nothing mapped in a pool that
    /// zeroes new blocks): ext4 then skips zeroing its inode tables and journal, which
    /// on thin storage would map pool blocks for nothing, in the background, after mkfs.
    pub prezeroed: bool,
    /// The filesystem's UUID, chosen before mkfs so that its superblock proves the
    /// format finished ([`superblock::finished_uuid`]); mkfs picks one otherwise.
    pub uuid: Option<superblock::FsUuid>,
}

pub fn mkfs_command(fs_type: FsType, device: &Path, options: FormatOptions) -> CommandSpec {
    let cmd = match fs_type {
        // Lazy init keeps mkfs fast on large volumes; the kernel finishes in the background.
        FsType::Ext4 => {
            let extended = if options.prezeroed {
                "lazy_itable_init=1,lazy_journal_init=1,assume_storage_prezeroed=1"
            } else {
                "lazy_itable_init=1,lazy_journal_init=1"
            };
            let mut cmd = CommandSpec::new("mkfs.ext4").args(["-F", "-q", "-E", extended]);
            // DAX needs the block size to be the page size; small devices default to 1K.
            if options.dax {
                cmd = cmd.args(["-b", "4096"]);
            }
            match options.uuid {
                Some(uuid) => cmd.arg("-U").arg(uuid.to_string()),
                None => cmd,
            }
        }
        FsType::Xfs => {
            let metadata: Vec<String> = options
                .dax
                .then(|| "reflink=0".to_string())
                .into_iter()
                .chain(options.uuid.map(|uuid| format!("uuid={uuid}")))
                .collect();
            let cmd = CommandSpec::new("mkfs.xfs").args(["-f", "-q"]);
            if metadata.is_empty() {
                cmd
            } else {
                cmd.arg("-m").arg(metadata.join(","))
            }
        }
    };
    cmd.arg(device).timeout(Duration::from_secs(600))
}

pub async fn format(
    host: &Host,
    fs_type: FsType,
    device: &Path,
    options: FormatOptions,
) -> Result<(), FsError> {
    host.commands
        .run(mkfs_command(fs_type, device, options))
        .await
        .map(drop)
        .map_err(|source| FsError::Format {
            fs_type,
            device: device.to_path_buf(),
            source,
        })
}

/// resize2fs grows an ext2/3/4 filesystem to its device: online when mounted, offline
/// (after [`fsck_command`]) when not.
pub fn resize2fs_command(device: &Path) -> CommandSpec {
    CommandSpec::new("resize2fs")
        .arg(device)
        .timeout(Duration::from_secs(600))
}

/// xfs grows only mounted, through its mount point.
pub fn xfs_growfs_command(mount_point: &Path) -> CommandSpec {
    CommandSpec::new("xfs_growfs")
        .arg(mount_point)
        .timeout(Duration::from_secs(600))
}

/// The forced check resize2fs requires before it grows an unmounted ext4 (it refuses a
/// filesystem not checked since its last mount); `-p` repairs only what is safe to
/// repair without asking.
pub fn fsck_command(device: &Path) -> CommandSpec {
    CommandSpec::new("e2fsck")
        .args(["-f", "-p"])
        .arg(device)
        .timeout(Duration::from_secs(600))
}

/// Grows the filesystem mounted at `mount_point` from `device` to fill the device.
pub async fn grow(host: &Host, fs_type: &str, device: &Path, mount_point: &Path) -> Result<(), FsError> {
    let cmd = match fs_type {
        "ext4" | "ext3" => resize2fs_command(device),
        "xfs" => xfs_growfs_command(mount_point),
        other => {
            return Err(FsError::UnsupportedGrow {
                fs_type: other.to_string(),
            });
        }
    };
    run_grow(host, fs_type, device, cmd).await
}

/// Grows the unmounted ext4 on `device` to fill it: a forced check, then resize2fs.
/// Offline growth needs no CAP_SYS_RESOURCE, which online ext4 growth does.
pub async fn grow_unmounted_ext4(host: &Host, device: &Path) -> Result<(), FsError> {
    match host.commands.run(fsck_command(device)).await {
        Ok(_) => {}
        // 1: errors were found and corrected; the filesystem is now consistent.
        Err(e) if e.exit_code() == Some(1) => {}
        Err(source) => {
            return Err(FsError::Check {
                device: device.to_path_buf(),
                source,
            });
        }
    }
    run_grow(host, "ext4", device, resize2fs_command(device)).await
}

async fn run_grow(host: &Host, fs_type: &str, device: &Path, cmd: CommandSpec) -> Result<(), FsError> {
    host.commands
        .run(cmd)
        .await
        .map(drop)
        .map_err(|source| FsError::Grow {
            fs_type: fs_type.to_string(),
            device: device.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blkid_output_is_classified() {
        assert_eq!(parse_blkid_export(""), Signature::Empty);
        assert_eq!(
            parse_blkid_export("DEVNAME=/dev/loop0\nUUID=1\nTYPE=ext4\nUSAGE=filesystem\n"),
            Signature::Filesystem("ext4".into())
        );
        assert_eq!(
            parse_blkid_export("DEVNAME=/dev/loop0\nPTUUID=x\nPTTYPE=gpt\n"),
            Signature::Other("partition table gpt".into())
        );
        assert_eq!(
            parse_blkid_export("TYPE=crypto_LUKS\nUSAGE=crypto\n"),
            Signature::Luks
        );
        assert_eq!(
            parse_blkid_export("TYPE=LVM2_member\nUSAGE=raid\n"),
            Signature::Other("raid LVM2_member".into())
        );
    }

    #[test]
    fn mkfs_arguments_are_fixed_vectors() {
        let cmd = mkfs_command(
            FsType::Xfs,
            Path::new("/dev/pmem0"),
            FormatOptions {
                dax: true,
                ..Default::default()
            },
        );
        assert_eq!(cmd.program, "mkfs.xfs");
        assert_eq!(cmd.args_display(), "-f -q -m reflink=0 /dev/pmem0");
        let cmd = mkfs_command(FsType::Ext4, Path::new("/dev/loop1"), FormatOptions::default());
        assert_eq!(cmd.args.last().unwrap(), "/dev/loop1");
        assert!(!cmd.args_display().contains("-b"));
        let cmd = mkfs_command(
            FsType::Ext4,
            Path::new("/dev/pmem0"),
            FormatOptions {
                dax: true,
                ..Default::default()
            },
        );
        assert_eq!(
            cmd.args_display(),
            "-F -q -E lazy_itable_init=1,lazy_journal_init=1 -b 4096 /dev/pmem0"
        );
        let prezeroed = FormatOptions {
            prezeroed: true,
            ..Default::default()
        };
        let cmd = mkfs_command(FsType::Ext4, Path::new("/dev/vg/lv"), prezeroed);
        assert_eq!(
            cmd.args_display(),
            "-F -q -E lazy_itable_init=1,lazy_journal_init=1,assume_storage_prezeroed=1 /dev/vg/lv"
        );
        // xfs writes no inode tables up front: nothing to skip.
        let cmd = mkfs_command(FsType::Xfs, Path::new("/dev/vg/lv"), prezeroed);
        assert_eq!(cmd.args_display(), "-f -q /dev/vg/lv");
        // A UUID chosen before mkfs, beside DAX's options.
        let uuid = superblock::FsUuid::parse("6f1c2a8e-3b4d-4e5f-9a0b-1c2d3e4f5a6b");
        let chosen = |dax| FormatOptions {
            dax,
            uuid,
            ..Default::default()
        };
        let cmd = mkfs_command(FsType::Xfs, Path::new("/dev/vg/lv"), chosen(false));
        assert_eq!(
            cmd.args_display(),
            "-f -q -m uuid=6f1c2a8e-3b4d-4e5f-9a0b-1c2d3e4f5a6b /dev/vg/lv"
        );
        let cmd = mkfs_command(FsType::Xfs, Path::new("/dev/vg/lv"), chosen(true));
        assert_eq!(
            cmd.args_display(),
            "-f -q -m reflink=0,uuid=6f1c2a8e-3b4d-4e5f-9a0b-1c2d3e4f5a6b /dev/vg/lv"
        );
        let cmd = mkfs_command(FsType::Ext4, Path::new("/dev/vg/lv"), chosen(true));
        assert_eq!(
            cmd.args_display(),
            "-F -q -E lazy_itable_init=1,lazy_journal_init=1 -b 4096 \
             -U 6f1c2a8e-3b4d-4e5f-9a0b-1c2d3e4f5a6b /dev/vg/lv"
        );
    }

    #[test]
    fn grow_arguments_are_fixed_vectors() {
        let device = Path::new("/dev/loop3");
        let cmd = fsck_command(device);
        assert_eq!(
            (cmd.program, cmd.args_display()),
            ("e2fsck", "-f -p /dev/loop3".into())
        );
        let cmd = resize2fs_command(device);
        assert_eq!(
            (cmd.program, cmd.args_display()),
            ("resize2fs", "/dev/loop3".into())
        );
        let cmd = xfs_growfs_command(Path::new("/stage/pv"));
        assert_eq!(
            (cmd.program, cmd.args_display()),
            ("xfs_growfs", "/stage/pv".into())
        );
    }

    fn fake_host() -> (Host, std::sync::Arc<crate::host::fake::FakeCommands>) {
        let commands = std::sync::Arc::new(crate::host::fake::FakeCommands::default());
        let host = Host {
            commands: commands.clone(),
            syscalls: std::sync::Arc::new(crate::host::fake::FakeSyscalls::default()),
        };
        (host, commands)
    }

    #[tokio::test]
    async fn an_unmounted_ext4_grows_only_after_a_clean_or_repaired_check() {
        let device = Path::new("/dev/loop3");
        for (code, grows) in [(None, true), (Some(1), true), (Some(4), false), (Some(8), false)] {
            let (host, commands) = fake_host();
            match code {
                None => commands.ok("e2fsck", ""),
                Some(code) => commands.fail("e2fsck", code, "errors"),
            }
            commands.ok("resize2fs", "");
            let result = grow_unmounted_ext4(&host, device).await;
            if grows {
                result.unwrap();
                assert_eq!(
                    commands.calls(),
                    ["e2fsck -f -p /dev/loop3", "resize2fs /dev/loop3"]
                );
            } else {
                let e = result.unwrap_err();
                assert!(matches!(e, FsError::Check { .. }), "{e}");
                assert_eq!(
                    commands.calls(),
                    ["e2fsck -f -p /dev/loop3"],
                    "no resize over errors"
                );
            }
        }
        let (host, commands) = fake_host();
        commands.ok("e2fsck", "");
        commands.fail("resize2fs", 1, "No space left on device");
        let e = grow_unmounted_ext4(&host, device).await.unwrap_err();
        assert!(matches!(e, FsError::Grow { .. }), "{e}");
        assert!(e.to_string().contains("No space left on device"), "{e}");
    }

    #[test]
    fn fs_type_names_round_trip() {
        for t in [FsType::Ext4, FsType::Xfs] {
            assert_eq!(FsType::parse(t.as_str()), Some(t));
        }
        assert_eq!(FsType::parse("btrfs"), None);
        assert_eq!(FsType::parse("EXT4"), None);
    }
}
