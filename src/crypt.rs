//! dm-crypt under a volume: LUKS2 headers made, opened, grown and closed by cryptsetup.
//!
//! An encrypted volume's device (an LV, a loop device) holds a LUKS2 header and
//! ciphertext only. Its filesystem, or its raw block data, is on a mapping,
//! `/dev/mapper/<name>`, which exists while the volume is staged. A mapping is found
//! again after a restart from the kernel (its node, and the devices sysfs says it is
//! built on), never from memory.
//!
//! The passphrase reaches cryptsetup on stdin (`--key-file=-`, which takes every byte,
//! a trailing newline included), never in argv or in a file; localvol's copies are
//! zeroed when dropped and shown by nothing. Mappings are opened with
//! `--disable-keyring`: the volume key then stays in the kernel's dm table rather than
//! the kernel keyring, so `cryptsetup resize` grows an open mapping without the
//! passphrase (NodeExpandVolume carries no secret), and nothing depends on a keyring
//! that a container's seccomp profile may hide.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::host::{CommandError, CommandSpec, Host, SyscallError};

/// Where device-mapper's nodes are.
const MAPPER_DIR: &str = "/dev/mapper";
/// Device-mapper names hold at most 127 bytes.
const MAX_NAME: usize = 127;
const PREFIX: &str = "localvol-crypt-";
/// What deriving a keyslot's key from the passphrase costs (argon2id), fixed in the
/// header at luksFormat: the brute-force resistance of a stolen header, paid again at
/// every open. A device class's `luks` settings (docs/backends.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pbkdf {
    /// Memory per derivation. cryptsetup's own default takes up to 1 GiB, bounded only
    /// by the host's memory: in a pod with a memory limit, a luksFormat or an open
    /// would be OOM-killed.
    pub memory_kib: u32,
    /// The time one derivation takes on this node, as luksFormat measures it.
    pub iter_time_ms: u32,
}

impl Default for Pbkdf {
    fn default() -> Self {
        Self {
            memory_kib: 131072,
            iter_time_ms: 2000,
        }
    }
}

impl Pbkdf {
    /// argon2id's bounds as cryptsetup takes them.
    pub const MIN_MEMORY_KIB: u32 = 32;
    pub const MAX_MEMORY_KIB: u32 = 4 << 20;
}
/// The LUKS2 header's share of an encrypted volume's device: two 16 KiB metadata
/// copies and the keyslot area, up to the data offset. cryptsetup's default is 16 MiB;
/// 2 MiB still holds eight argon2id keyslots (a rotation needs two at once).
pub const HEADER_BYTES: u64 = 2 << 20;
const METADATA_SIZE: &str = "16k";
const KEYSLOTS_SIZE: &str = "2016k";
/// [`HEADER_BYTES`] in 512-byte sectors, where luksFormat's `--offset` counts.
const DATA_OFFSET_SECTORS: &str = "4096";
/// luksFormat benchmarks its key derivation, and an open repeats it (two seconds by
/// default, each): slow on a busy node, never hung.
const CRYPTSETUP_TIMEOUT: Duration = Duration::from_secs(120);

/// A LUKS passphrase: bytes, never empty, zeroed when dropped, shown as `Passphrase(..)`.
#[derive(Clone, PartialEq, Eq)]
pub struct Passphrase(Zeroizing<Vec<u8>>);

impl Passphrase {
    /// `None` for an empty passphrase, which opens nothing.
    pub fn new(bytes: &[u8]) -> Option<Self> {
        (!bytes.is_empty()).then(|| Self(Zeroizing::new(bytes.to_vec())))
    }

    fn input(&self) -> Zeroizing<Vec<u8>> {
        self.0.clone()
    }
}

impl fmt::Debug for Passphrase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Passphrase(..)")
    }
}

/// The dm-crypt mapping of one volume, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    name: String,
}

impl Mapping {
    /// The mapping of the volume whose id is `volume`: `localvol-crypt-<id>`, or, for an
    /// id too long for a device-mapper name, `localvol-crypt-h+` and a digest of it (a
    /// volume id never holds `+` after its class, so the forms cannot collide).
    pub fn for_volume(volume: &str) -> Self {
        let direct = format!("{PREFIX}{volume}");
        let name = if direct.len() <= MAX_NAME && !volume.contains('/') {
            direct
        } else {
            let digest = Sha256::digest(volume.as_bytes());
            format!("{PREFIX}h+{}", hex::encode(&digest[..16]))
        };
        Self { name }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The mapping's node, while it is open.
    pub fn path(&self) -> PathBuf {
        Path::new(MAPPER_DIR).join(&self.name)
    }
}

impl fmt::Display for Mapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CryptError {
    #[error("the passphrase does not open the LUKS2 header on {device}", device = device.display())]
    WrongPassphrase { device: PathBuf },
    #[error(
        "{path} is open on another device than {device}; if nothing uses it, close it (cryptsetup close {mapping})",
        path = mapping.path().display(), device = device.display()
    )]
    MappingElsewhere { mapping: Mapping, device: PathBuf },
    #[error("{path} is not open; stage the volume first", path = mapping.path().display())]
    NotOpen { mapping: Mapping },
    #[error("cryptsetup {op} of {target} failed: {source}")]
    Command {
        op: &'static str,
        target: String,
        #[source]
        source: CommandError,
    },
    #[error(transparent)]
    Syscall(#[from] SyscallError),
}

impl CryptError {
    /// Whether the same request again cannot succeed (see [`crate::model::Terminal`]).
    pub fn is_terminal(&self) -> bool {
        match self {
            CryptError::WrongPassphrase { .. } | CryptError::MappingElsewhere { .. } => true,
            // Kubelet stages the volume again.
            CryptError::NotOpen { .. } => false,
            CryptError::Command { source, .. } => source.is_terminal(),
            CryptError::Syscall(e) => e.is_terminal(),
        }
    }
}

/// cryptsetup with device-mapper's udev handshake off: it makes and removes the
/// mapping's node itself, as localvol's LVM commands do (`lvm::CONTAINER_CONFIG`), and
/// never waits for a udev event that a pod without udev cannot see.
fn cryptsetup() -> CommandSpec {
    CommandSpec::new("cryptsetup")
        .env("DM_DISABLE_UDEV", "1")
        .timeout(CRYPTSETUP_TIMEOUT)
}

/// `cryptsetup luksFormat` of `device`, the passphrase on stdin.
pub fn format_command(device: &Path, pbkdf: Pbkdf) -> CommandSpec {
    cryptsetup()
        .args(["luksFormat", "--type", "luks2", "--batch-mode", "--key-file=-"])
        .args(["--pbkdf", "argon2id", "--pbkdf-memory"])
        .arg(pbkdf.memory_kib.to_string())
        .arg("--iter-time")
        .arg(pbkdf.iter_time_ms.to_string())
        .args([
            "--luks2-metadata-size",
            METADATA_SIZE,
            "--luks2-keyslots-size",
            KEYSLOTS_SIZE,
        ])
        .args(["--offset", DATA_OFFSET_SECTORS])
        .arg(device)
}

/// `cryptsetup open` of `device` as `mapping`, the passphrase on stdin.
pub fn open_command(device: &Path, mapping: &Mapping, allow_discards: bool) -> CommandSpec {
    let cmd = cryptsetup().args(["open", "--type", "luks2", "--key-file=-", "--disable-keyring"]);
    let cmd = if allow_discards {
        cmd.arg("--allow-discards")
    } else {
        cmd
    };
    cmd.arg(device).arg(mapping.name())
}

pub fn close_command(mapping: &Mapping) -> CommandSpec {
    cryptsetup().arg("close").arg(mapping.name())
}

pub fn resize_command(mapping: &Mapping) -> CommandSpec {
    cryptsetup().arg("resize").arg(mapping.name())
}

/// cryptsetup's exit code for a passphrase that opens no keyslot ("no permission").
const EXIT_NO_KEY: i32 = 2;
/// cryptsetup's exit code for "wrong device specified" (no such mapping).
const EXIT_NO_DEVICE: i32 = 4;

/// Writes a new LUKS2 header on `device`, over whatever it holds: callers format only
/// a device that holds nothing, or one whose format never finished.
pub async fn format(
    host: &Host,
    device: &Path,
    passphrase: &Passphrase,
    pbkdf: Pbkdf,
) -> Result<(), CryptError> {
    let cmd = format_command(device, pbkdf).secret_input(passphrase.input());
    host.commands
        .run(cmd)
        .await
        .map(drop)
        .map_err(|source| CryptError::Command {
            op: "luksFormat",
            target: device.display().to_string(),
            source,
        })
}

/// Opens `device`'s LUKS2 header as `mapping`; returns the mapping's node.
pub async fn open(
    host: &Host,
    device: &Path,
    mapping: &Mapping,
    passphrase: &Passphrase,
    allow_discards: bool,
) -> Result<PathBuf, CryptError> {
    let cmd = open_command(device, mapping, allow_discards).secret_input(passphrase.input());
    match host.commands.run(cmd).await {
        Ok(_) => Ok(mapping.path()),
        Err(e) if e.exit_code() == Some(EXIT_NO_KEY) => Err(CryptError::WrongPassphrase {
            device: device.to_path_buf(),
        }),
        Err(source) => Err(CryptError::Command {
            op: "open",
            target: device.display().to_string(),
            source,
        }),
    }
}

/// Closes `mapping`; one that is not open is closed already.
pub async fn close(host: &Host, mapping: &Mapping) -> Result<(), CryptError> {
    if not_found_is_none(host.syscalls.device_number(&mapping.path()).await)?.is_none() {
        return Ok(());
    }
    match host.commands.run(close_command(mapping)).await {
        // Closed by someone else between the look and the close.
        Err(e) if e.exit_code() == Some(EXIT_NO_DEVICE) => Ok(()),
        // Busy (still mounted, still open) is worth a retry: not terminal.
        result => result.map(drop).map_err(|source| CryptError::Command {
            op: "close",
            target: mapping.name().to_string(),
            source,
        }),
    }
}

/// Grows the open `mapping` to its device's size.
pub async fn resize(host: &Host, mapping: &Mapping) -> Result<(), CryptError> {
    host.commands
        .run(resize_command(mapping))
        .await
        .map(drop)
        .map_err(|source| CryptError::Command {
            op: "resize",
            target: mapping.name().to_string(),
            source,
        })
}

/// The node of `mapping` when it is open on `device`; `None` when it is not open. A
/// mapping of that name on anything else is [`CryptError::MappingElsewhere`]: it is
/// not this volume's, and nothing is done to it.
pub async fn find(host: &Host, mapping: &Mapping, device: &Path) -> Result<Option<PathBuf>, CryptError> {
    let path = mapping.path();
    let Some(dev) = not_found_is_none(host.syscalls.device_number(&path).await)? else {
        return Ok(None);
    };
    let (slaves, below) = tokio::join!(
        host.syscalls.device_slaves(dev),
        host.syscalls.device_number(device)
    );
    match (slaves?, below?) {
        (slaves, Some(below)) if slaves == [below] => Ok(Some(path)),
        _ => Err(CryptError::MappingElsewhere {
            mapping: mapping.clone(),
            device: device.to_path_buf(),
        }),
    }
}

/// An open mapping's state, for the health of its volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MappingState {
    Open,
    /// Suspended (`dmsetup suspend`, or a tool that never resumed it): its I/O waits.
    Suspended,
    NotOpen,
}

/// The state of `mapping` on `device`: a sysfs read beyond [`find`]'s, which it
/// shares the refusal of a mapping on another device with.
pub async fn state(host: &Host, mapping: &Mapping, device: &Path) -> Result<MappingState, CryptError> {
    if find(host, mapping, device).await?.is_none() {
        return Ok(MappingState::NotOpen);
    }
    let Some(dev) = not_found_is_none(host.syscalls.device_number(&mapping.path()).await)? else {
        return Ok(MappingState::NotOpen);
    };
    Ok(if host.syscalls.device_mapper_suspended(dev).await? {
        MappingState::Suspended
    } else {
        MappingState::Open
    })
}

fn not_found_is_none(found: Result<Option<u64>, SyscallError>) -> Result<Option<u64>, SyscallError> {
    match found {
        Err(e) if e.is_not_found() => Ok(None),
        other => other,
    }
}

#[cfg(test)]
mod tests;
