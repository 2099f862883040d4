//! The typed vocabulary below the gRPC edge: volume ids, device class names, access
//! types. Values of these types are valid by construction; nothing below `request`
//! handles raw strings from a request. Also here: the driver's name and the helper that
//! renders an error with its causes, which every layer logs with, and [`Terminal`], the
//! terminal-or-transient question every module's error answers.

mod capacity;
mod claim;
mod encryption;
pub mod quantity;
mod terminal;

use std::error::Error as StdError;
use std::fmt;

use sha2::{Digest, Sha256};

use crate::fs::FsType;

pub use capacity::{CapacityRange, DEFAULT_VOLUME_BYTES, MAX_VOLUME_BYTES, ValidationError};
pub use claim::{ClaimRef, PARAM_PV_NAME, PARAM_PVC_NAME, PARAM_PVC_NAMESPACE};
pub use encryption::Encryption;
pub use terminal::Terminal;

/// The CSI driver name: in GetPluginInfo, kubelet registration, event sources and labels.
pub const DRIVER_NAME: &str = "localvol.csi.dev";

/// The name of a device class: a DNS label of at most 32 bytes, so it fits in volume
/// ids, LV tags and metric labels unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClassName(String);

impl ClassName {
    pub fn parse(name: &str) -> Result<Self, String> {
        let ok = !name.is_empty()
            && name.len() <= 32
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !name.starts_with('-')
            && !name.ends_with('-');
        if ok {
            Ok(Self(name.to_string()))
        } else {
            Err(format!(
                "device class name {name:?} must be 1-32 characters of a-z, 0-9 and '-', not starting or ending with '-'"
            ))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClassName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The per-volume part of a volume id, derived from the CreateVolume name alone so that
/// a retried create (even after a crash) finds the same volume. It is also the name of
/// the volume's backing object (file, LV, namespace), so it is restricted to characters
/// every backend accepts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(String);

/// The longest CreateVolume name used as a token as it is (LV names allow 127 bytes;
/// leave room for LVM's own suffixes such as `_tmeta`).
const MAX_DIRECT_TOKEN: usize = 96;

impl Token {
    /// `name` itself when it is a safe token; otherwise `h+` and a digest of it. The two
    /// forms cannot collide: a safe token never contains `+`.
    pub fn for_name(name: &str) -> Self {
        if Self::is_direct(name) {
            Self(name.to_string())
        } else {
            let digest = Sha256::digest(name.as_bytes());
            Self(format!("h+{}", hex::encode(&digest[..16])))
        }
    }

    fn is_direct(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= MAX_DIRECT_TOKEN
            && s.as_bytes()[0].is_ascii_alphanumeric()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    }

    fn is_hashed(s: &str) -> bool {
        s.strip_prefix("h+").is_some_and(|h| {
            h.len() == 32
                && h.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        })
    }

    pub fn parse(s: &str) -> Option<Self> {
        (Self::is_direct(s) || Self::is_hashed(s)).then(|| Self(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A volume id: `<device class>.<token>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VolumeId {
    pub class: ClassName,
    pub token: Token,
}

/// Why a string is not a volume id of ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("volume id is empty")]
    Empty,
    #[error("volume id {id:?} is malformed: {reason}")]
    Malformed { id: String, reason: &'static str },
    /// Well-formed text, but not an id localvol could have made: no such volume here.
    #[error("no volume with id {0:?} exists on this node")]
    NotOurs(String),
}

/// Ids longer than the CSI spec allows (128 bytes) are refused outright.
const MAX_ID_LEN: usize = 128;

impl VolumeId {
    pub fn new(class: ClassName, token: Token) -> Self {
        Self { class, token }
    }

    pub fn parse(id: &str) -> Result<Self, IdError> {
        if id.is_empty() {
            return Err(IdError::Empty);
        }
        let malformed = |reason| IdError::Malformed {
            id: id.chars().take(64).collect(),
            reason,
        };
        if id.len() > MAX_ID_LEN {
            return Err(malformed("longer than 128 bytes"));
        }
        if id.chars().any(|c| c.is_control() || c == '/' || c == '\\') {
            return Err(malformed("contains a control character or a path separator"));
        }
        let not_ours = || IdError::NotOurs(id.to_string());
        let (class, token) = id.split_once('.').ok_or_else(not_ours)?;
        let class = ClassName::parse(class).map_err(|_| not_ours())?;
        let token = Token::parse(token).ok_or_else(not_ours)?;
        Ok(Self { class, token })
    }
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.class, self.token)
    }
}

/// A snapshot id: `snapshot.<device class>.<token>`. Two dots, where a volume id has
/// one: neither kind of id ever parses as the other (a token holds no dot), so a
/// snapshot id given to a volume call names no volume, and the reverse.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SnapshotId {
    pub class: ClassName,
    /// Derived from the CreateSnapshot name, as a volume's is from its CreateVolume name.
    pub token: Token,
}

const SNAPSHOT_PREFIX: &str = "snapshot.";

impl SnapshotId {
    pub fn new(class: ClassName, token: Token) -> Self {
        Self { class, token }
    }

    /// The same rules as [`VolumeId::parse`]: empty and malformed ids are refused,
    /// well-formed text that localvol could not have made is [`IdError::NotOurs`].
    pub fn parse(id: &str) -> Result<Self, IdError> {
        let rest = match VolumeId::parse(id) {
            // A volume id is not a snapshot id.
            Ok(_) => return Err(IdError::NotOurs(id.to_string())),
            Err(IdError::NotOurs(_)) => id.strip_prefix(SNAPSHOT_PREFIX),
            Err(e) => return Err(e),
        };
        let not_ours = || IdError::NotOurs(id.to_string());
        let rest = rest.ok_or_else(not_ours)?;
        match VolumeId::parse(rest) {
            Ok(inner) => Ok(Self {
                class: inner.class,
                token: inner.token,
            }),
            Err(_) => Err(not_ours()),
        }
    }

    /// The key its per-snapshot lock is taken under: always a digest (the text holds a
    /// `/`), so it never equals a volume's token and the two kinds never wait on each other.
    pub fn lock_token(token: &Token) -> Token {
        Token::for_name(&format!("snapshot/{token}"))
    }
}

impl fmt::Display for SnapshotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SNAPSHOT_PREFIX}{}.{}", self.class, self.token)
    }
}

/// How a volume is accessed: through a filesystem or as a raw block device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessType {
    Mount {
        /// `None`: the device class's default.
        fs_type: Option<FsType>,
        mount_flags: Vec<String>,
    },
    Block,
}

impl AccessType {
    pub fn is_block(&self) -> bool {
        matches!(self, AccessType::Block)
    }
}

/// The CSI access modes localvol supports: every one confined to a single node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessMode {
    SingleNodeWriter,
    SingleNodeReaderOnly,
    SingleNodeSingleWriter,
    SingleNodeMultiWriter,
}

impl AccessMode {
    pub fn is_read_only(self) -> bool {
        matches!(self, AccessMode::SingleNodeReaderOnly)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    pub access: AccessType,
    pub mode: AccessMode,
}

/// Whether a volume was created for block or filesystem use, recorded with the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VolumeMode {
    Filesystem,
    Block,
}

/// The error and every cause below it, `: `-joined.
pub fn full_message(e: &dyn StdError) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_names_are_their_own_token() {
        assert_eq!(Token::for_name("pvc-0b1c-22").as_str(), "pvc-0b1c-22");
        let sanity = "sanity-node-full-E1A5D6C3-2A8F1B7C";
        assert_eq!(Token::for_name(sanity).as_str(), sanity);
    }

    #[test]
    fn unsafe_names_are_hashed_deterministically() {
        for name in [
            "a/b",
            "../etc",
            "has space",
            "-leading",
            "x".repeat(128).as_str(),
            "ünï",
        ] {
            let t = Token::for_name(name);
            assert!(t.as_str().starts_with("h+"), "{name}");
            assert_eq!(t, Token::for_name(name));
            assert_eq!(Token::parse(t.as_str()), Some(t.clone()));
        }
        assert_ne!(Token::for_name("a/b"), Token::for_name("a/c"));
    }

    #[test]
    fn ids_round_trip() {
        let id = VolumeId::new(ClassName::parse("fast-ssd").unwrap(), Token::for_name("pvc-1"));
        assert_eq!(id.to_string(), "fast-ssd.pvc-1");
        assert_eq!(VolumeId::parse("fast-ssd.pvc-1"), Ok(id));
    }

    #[test]
    fn foreign_and_malformed_ids_are_told_apart() {
        assert_eq!(VolumeId::parse(""), Err(IdError::Empty));
        for foreign in [
            "fake-vol-id",
            "fake-vol-id-123abc",
            "Upper.pvc",
            "a.b.c",
            "a.h+zz",
            "a.",
        ] {
            assert!(
                matches!(VolumeId::parse(foreign), Err(IdError::NotOurs(_))),
                "{foreign}"
            );
        }
        for bad in ["a/b", "default.../../etc", "a\0b", "a\nb"] {
            assert!(
                matches!(VolumeId::parse(bad), Err(IdError::Malformed { .. })),
                "{bad:?}"
            );
        }
        assert!(matches!(
            VolumeId::parse(&"x".repeat(300)),
            Err(IdError::Malformed { .. })
        ));
    }

    #[test]
    fn snapshot_ids_round_trip_and_never_parse_as_volume_ids() {
        let id = SnapshotId::new(ClassName::parse("thin").unwrap(), Token::for_name("snapshot-1"));
        assert_eq!(id.to_string(), "snapshot.thin.snapshot-1");
        assert_eq!(SnapshotId::parse("snapshot.thin.snapshot-1"), Ok(id));
        assert!(matches!(
            VolumeId::parse("snapshot.thin.snapshot-1"),
            Err(IdError::NotOurs(_))
        ));
        // A volume of a class named "snapshot" stays a volume.
        assert!(VolumeId::parse("snapshot.pvc-1").is_ok());
        assert!(matches!(
            SnapshotId::parse("snapshot.pvc-1"),
            Err(IdError::NotOurs(_))
        ));
        for foreign in ["thin.pvc-1", "snap.thin.x", "snapshot.Thin.x", "snapshot.thin."] {
            assert!(
                matches!(SnapshotId::parse(foreign), Err(IdError::NotOurs(_))),
                "{foreign}"
            );
        }
        assert_eq!(SnapshotId::parse(""), Err(IdError::Empty));
        assert!(matches!(
            SnapshotId::parse("snapshot.a/b"),
            Err(IdError::Malformed { .. })
        ));
        assert_ne!(
            SnapshotId::lock_token(&Token::for_name("x")),
            Token::for_name("x")
        );
    }

    #[test]
    fn class_names_are_dns_labels() {
        assert!(ClassName::parse("default").is_ok());
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(33)] {
            assert!(ClassName::parse(bad).is_err(), "{bad}");
        }
    }
}
