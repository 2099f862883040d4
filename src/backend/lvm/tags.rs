//! What an LV records about its volume, in LV tags, and the name an LV gets.
//!
//! Every LV localvol makes carries `localvol.csi.dev/<key>=<value>` tags with all a
//! [`VolumeRecord`] needs (device class, CreateVolume name, mode, filesystem, claim),
//! so a node lists its volumes and finds orphans from `lvs` alone. LVM accepts only
//! `[A-Za-z0-9_+.\-/=!:&#]` in tags (see `tests/fixtures/README.md`); values are
//! escaped into that set, `#` followed by two hex digits, so any name round-trips.

use sha2::{Digest, Sha256};

use super::report::Lv;
use crate::backend::{CreateSpec, FormatMark, VolumeRecord};
use crate::fs::FsType;
use crate::fs::superblock::FsUuid;
use crate::model::ClaimRef;
use crate::model::{ClassName, Encryption, Token, VolumeId, VolumeMode};

pub const PREFIX: &str = "localvol.csi.dev/";
const CLASS: &str = "class";
pub(super) const NAME: &str = "name";
pub(super) const MODE: &str = "mode";
pub(super) const FS: &str = "fs";
const PVC: &str = "pvc";
const NAMESPACE: &str = "namespace";
const PV: &str = "pv";
/// `luks2` or `luks2+discards` on an encrypted volume (see [`Encryption::as_str`]).
const ENCRYPTION: &str = "encryption";
/// Present while a new LV is being zeroed: it is not a volume yet.
pub const PENDING: &str = "localvol.csi.dev/state=zeroing";
/// On the temporary LV that zeroes the extents of a block volume's extension.
const ZEROING_FOR: &str = "zeroing-for";
/// On a filesystem volume from its lvcreate (or added just before mkfs on an LV that
/// had none) until mkfs has finished: an LV whose format is unfinished was killed
/// mid-mkfs and may carry a half-written signature, so the next stage formats it again
/// instead of trusting or refusing what blkid finds. With [`FS_UUID`] beside it, the
/// filesystem's superblock says when mkfs finished and the tag stays; without, one
/// `lvchange` (one metadata commit) replaces it with [`FORMATTED`]. The key is not
/// `state`, because a formatting LV is still a volume (it is listed, staged, deleted).
pub const FORMATTING: &str = "localvol.csi.dev/format=formatting";
/// The mkfs begun under [`FORMATTING`] finished. LVs formatted before the mark existed
/// have neither tag; blkid alone decides for them.
pub const FORMATTED: &str = "localvol.csi.dev/format=formatted";
/// Beside [`FORMATTING`] from the lvcreate of an unencrypted filesystem volume: the UUID
/// its mkfs is given. The finished filesystem then proves itself (its superblock holds
/// the UUID), so no lvchange follows mkfs and [`FORMATTING`] stays; a copy inherits both
/// with the filesystem they describe.
pub(super) const FS_UUID: &str = "fs-uuid";

/// On a restore or clone made larger than its source, from the lvcreate that makes it
/// (so no kill can leave a grown copy without it) until stage has grown the filesystem
/// it holds to the LV's size.
pub const GROW_FILESYSTEM: &str = "localvol.csi.dev/grow=filesystem";

fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"_+.-/=!:&".contains(&b)
}

/// Escapes `value` into LVM's tag alphabet: `#xx` for every other byte (and `#`).
pub fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if is_plain(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("#{b:02x}"));
        }
    }
    out
}

/// Reverses [`encode`]; `None` for text `encode` cannot have produced.
pub fn decode(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'#' => {
                let hex = value.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b if is_plain(b) => {
                out.push(b);
                i += 1;
            }
            _ => return None,
        }
    }
    String::from_utf8(out).ok()
}

pub(super) fn tag(key: &str, value: &str) -> String {
    format!("{PREFIX}{key}={}", encode(value))
}

pub(super) fn mode_str(mode: VolumeMode) -> &'static str {
    match mode {
        VolumeMode::Filesystem => "filesystem",
        VolumeMode::Block => "block",
    }
}

/// The tags of a new volume's LV.
pub fn volume_tags(class: &ClassName, spec: &CreateSpec) -> Vec<String> {
    let mut tags = vec![
        tag(CLASS, class.as_str()),
        tag(NAME, &spec.name),
        tag(MODE, mode_str(spec.mode)),
    ];
    if let Some(fs) = spec.fs_type {
        tags.push(tag(FS, fs.as_str()));
    }
    if let Some(encryption) = spec.encryption {
        tags.push(tag(ENCRYPTION, encryption.as_str()));
    }
    for (key, value) in [
        (PVC, &spec.claim.pvc_name),
        (NAMESPACE, &spec.claim.pvc_namespace),
        (PV, &spec.claim.pv_name),
    ] {
        if let Some(value) = value {
            tags.push(tag(key, value));
        }
    }
    tags
}

/// The tag of the temporary LV that pre-zeroes extents for `lv`.
pub fn zeroing_tag(lv: &str) -> String {
    tag(ZEROING_FOR, lv)
}

/// True when a format of this LV was begun and not recorded as finished.
pub fn format_unfinished(lv: &Lv) -> bool {
    lv.has_tag(FORMATTING)
}

/// The tag naming the UUID a new filesystem volume's mkfs is given ([`FS_UUID`]).
pub(super) fn fs_uuid_tag(uuid: FsUuid) -> String {
    tag(FS_UUID, &uuid.to_string())
}

/// What the LV's tags say of its filesystem. [`FORMATTED`] says only that a format
/// finished once, not what the device holds now, so it is [`FormatMark::Unknown`]; so
/// is a [`FS_UUID`] tag that is not a UUID (edited by hand: blkid decides, nothing is
/// formatted on the tags' word).
pub fn format_mark(lv: &Lv) -> FormatMark {
    if !format_unfinished(lv) {
        return FormatMark::Unknown;
    }
    match value(lv, FS_UUID) {
        None => FormatMark::Unfinished,
        Some(text) => FsUuid::parse(text).map_or(FormatMark::Unknown, FormatMark::Pending),
    }
}

/// What an LV is to a device class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// Not a volume of this class (another class's, or not localvol's at all).
    Foreign,
    /// This class's volume; `pending` while its creation has not finished.
    Ours { record: VolumeRecord, pending: bool },
    /// Tagged for this class but unreadable: why.
    Corrupt(String),
}

pub(super) fn value<'a>(lv: &'a Lv, key: &str) -> Option<&'a str> {
    lv.tags.iter().find_map(|t| {
        t.strip_prefix(PREFIX)
            .and_then(|rest| rest.strip_prefix(key))
            .and_then(|rest| rest.strip_prefix('='))
    })
}

/// The whole `key` tag of `lv`, as it is (for a copy to carry unchanged).
pub(super) fn whole(lv: &Lv, key: &str) -> Option<String> {
    value(lv, key).map(|v| format!("{PREFIX}{key}={v}"))
}

pub(super) fn parse_mode(value: Option<&str>) -> Result<VolumeMode, String> {
    match value {
        Some("filesystem") => Ok(VolumeMode::Filesystem),
        Some("block") => Ok(VolumeMode::Block),
        other => Err(format!("mode tag {other:?} is neither filesystem nor block")),
    }
}

pub(super) fn parse_fs(value: Option<String>) -> Result<Option<FsType>, String> {
    value
        .map(|fs| FsType::parse(&fs).ok_or(format!("unknown filesystem tag {fs:?}")))
        .transpose()
}

/// Reads an LV's tags as a volume of `class`.
pub fn ownership(class: &ClassName, vg: &str, lv: &Lv) -> Ownership {
    if value(lv, CLASS).and_then(decode).as_deref() != Some(class.as_str()) {
        return Ownership::Foreign;
    }
    let decoded = |key: &str| -> Result<Option<String>, String> {
        match value(lv, key) {
            None => Ok(None),
            Some(v) => decode(v)
                .map(Some)
                .ok_or_else(|| format!("tag {PREFIX}{key} has an invalid value {v:?}")),
        }
    };
    let record = (|| {
        let name = decoded(NAME)?.ok_or("no name tag")?;
        let token = Token::for_name(&name);
        if lv_name(&token, vg) != lv.name {
            return Err(format!("its name tag {name:?} belongs to another LV name"));
        }
        let mode = parse_mode(decoded(MODE)?.as_deref())?;
        let fs_type = parse_fs(decoded(FS)?)?;
        let encryption = decoded(ENCRYPTION)?
            .map(|e| Encryption::parse(&e).ok_or(format!("unknown encryption tag {e:?}")))
            .transpose()?;
        Ok(VolumeRecord {
            id: VolumeId::new(class.clone(), token),
            name,
            size_bytes: lv.size,
            mode,
            fs_type,
            filesystem_grow_pending: lv.has_tag(GROW_FILESYSTEM),
            encryption,
            claim: ClaimRef {
                pvc_name: decoded(PVC)?,
                pvc_namespace: decoded(NAMESPACE)?,
                pv_name: decoded(PV)?,
            },
        })
    })();
    match record {
        Ok(record) => Ownership::Ours {
            record,
            pending: lv.has_tag(PENDING),
        },
        Err(reason) => Ownership::Corrupt(format!("LV {vg}/{}: {reason}", lv.name)),
    }
}

/// Longest `/dev/mapper` name the kernel takes is 127 bytes; keep room for suffixes.
const MAX_DM_NAME: usize = 110;

/// The length of the device-mapper name of `vg/lv` (`-` is doubled inside names).
fn dm_name_len(vg: &str, lv: &str) -> usize {
    let escaped = |s: &str| s.len() + s.matches('-').count();
    escaped(vg) + 1 + escaped(lv)
}

/// The LV name of a volume: its token, unless LVM reserves that name (`_tdata`-like
/// parts, `snapshot`/`pvmove` prefixes) or its device-mapper name would be too long;
/// then `lv+` and a digest of the token (a token never contains `+` except in its own
/// hashed form `h+…`, so the forms cannot collide).
pub fn lv_name(token: &Token, vg: &str) -> String {
    let t = token.as_str();
    let reserved = t.contains('_') || t.starts_with("snapshot") || t.starts_with("pvmove");
    if !reserved && dm_name_len(vg, t) + ZERO_SUFFIX.len() <= MAX_DM_NAME {
        t.to_string()
    } else {
        let digest = Sha256::digest(t.as_bytes());
        format!("lv+{}", hex::encode(&digest[..16]))
    }
}

const ZERO_SUFFIX: &str = "+zero";

/// The temporary LV that pre-zeroes the extension of `lv`.
pub fn zeroing_lv_name(lv: &str) -> String {
    format!("{lv}{ZERO_SUFFIX}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lv(name: &str, tags: &[String]) -> Lv {
        Lv {
            name: name.to_string(),
            vg: "vg1".to_string(),
            size: 8 << 20,
            attr: "-wi-a-----".to_string(),
            tags: tags.to_vec(),
            pool: None,
            data_percent: None,
            path: None,
        }
    }

    fn class() -> ClassName {
        ClassName::parse("fast").unwrap()
    }

    fn spec(name: &str) -> CreateSpec {
        CreateSpec {
            token: Token::for_name(name),
            name: name.to_string(),
            size_bytes: 8 << 20,
            mode: VolumeMode::Block,
            fs_type: Some(FsType::Xfs),
            claim: ClaimRef {
                pvc_name: Some("data-0".into()),
                pvc_namespace: Some("team-a".into()),
                pv_name: None,
            },
            encryption: None,
        }
    }

    #[test]
    fn encoding_keeps_kubernetes_names_readable_and_round_trips_anything() {
        assert_eq!(encode("pvc-0b1c.x_y"), "pvc-0b1c.x_y");
        assert_eq!(encode("a b,c@d#"), "a#20b#2cc#40d#23");
        for s in ["", "a b", "ünï/@x#y", "#20", "@lead", "x".repeat(300).as_str()] {
            let e = encode(s);
            assert!(e.bytes().all(|b| is_plain(b) || b == b'#'), "{e}");
            assert!(!e.starts_with('@'));
            assert_eq!(decode(&e).as_deref(), Some(s), "{s:?}");
        }
        for bad in ["#2", "#zz", "a b", "#ff"] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_volume_round_trips_through_its_tags() {
        let name = "csi sanity/volume 1";
        let spec = spec(name);
        let tags = volume_tags(&class(), &spec);
        assert!(tags.contains(&"localvol.csi.dev/class=fast".to_string()));
        assert!(tags.contains(&"localvol.csi.dev/namespace=team-a".to_string()));
        let lv = lv(&lv_name(&spec.token, "vg1"), &tags);
        match ownership(&class(), "vg1", &lv) {
            Ownership::Ours { record, pending } => {
                assert!(!pending);
                assert_eq!(record.id.token, spec.token);
                assert_eq!(record.name, name);
                assert_eq!(record.mode, VolumeMode::Block);
                assert_eq!(record.fs_type, Some(FsType::Xfs));
                assert_eq!(record.claim, spec.claim);
                assert_eq!(record.size_bytes, 8 << 20);
            }
            other => panic!("{other:?}"),
        }
        let mut pending = lv.clone();
        pending.tags.push(PENDING.to_string());
        assert!(matches!(
            ownership(&class(), "vg1", &pending),
            Ownership::Ours { pending: true, .. }
        ));
    }

    #[test]
    fn the_format_mark_is_its_own_key_and_leaves_the_record_alone() {
        let spec = spec("pvc-1");
        let mut tags = volume_tags(&class(), &spec);
        assert!(
            !tags.iter().any(|t| t.contains("/format=")),
            "a new LV has no mark"
        );
        tags.push(FORMATTING.to_string());
        let formatting = lv("pvc-1", &tags);
        assert!(format_unfinished(&formatting));
        // Still a volume, not a pending create: it is staged again (and formatted again).
        assert!(matches!(
            ownership(&class(), "vg1", &formatting),
            Ownership::Ours { pending: false, .. }
        ));
        for tag in [FORMATTING, FORMATTED] {
            assert_eq!(
                decode(tag.strip_prefix(PREFIX).unwrap()).as_deref(),
                Some(&tag[PREFIX.len()..])
            );
        }
        tags.retain(|t| t != FORMATTING);
        tags.push(FORMATTED.to_string());
        assert!(!format_unfinished(&lv("pvc-1", &tags)));
    }

    #[test]
    fn other_classes_and_untagged_lvs_are_foreign() {
        let tags = volume_tags(&class(), &spec("pvc-1"));
        let other = ClassName::parse("slow").unwrap();
        assert_eq!(ownership(&other, "vg1", &lv("pvc-1", &tags)), Ownership::Foreign);
        assert_eq!(ownership(&class(), "vg1", &lv("root", &[])), Ownership::Foreign);
    }

    #[test]
    fn inconsistent_tags_are_corrupt_not_guessed() {
        let tags = volume_tags(&class(), &spec("pvc-1"));
        // Renamed by hand: the name tag no longer matches the LV name.
        assert!(matches!(
            ownership(&class(), "vg1", &lv("pvc-2", &tags)),
            Ownership::Corrupt(_)
        ));
        let no_mode: Vec<_> = tags.iter().filter(|t| !t.contains("/mode=")).cloned().collect();
        assert!(matches!(
            ownership(&class(), "vg1", &lv("pvc-1", &no_mode)),
            Ownership::Corrupt(_)
        ));
    }

    #[test]
    fn lv_names_avoid_what_lvm_reserves() {
        let name = |t: &str| lv_name(&Token::parse(t).unwrap(), "vg1");
        assert_eq!(name("pvc-0b1c"), "pvc-0b1c");
        let hashed = Token::for_name("a/b");
        assert_eq!(lv_name(&hashed, "vg1"), hashed.as_str());
        for reserved in ["pvc_tdata", "snapshot1", "pvmove0", "a_b"] {
            let lv = name(reserved);
            assert!(lv.starts_with("lv+") && lv.len() == 35, "{reserved} -> {lv}");
        }
        assert_ne!(name("a_b"), name("a_c"));
        let long = "a-".repeat(47) + "z";
        assert!(name(&long).starts_with("lv+"), "dm name would be too long");
        assert_eq!(zeroing_lv_name("pvc-1"), "pvc-1+zero");
    }
}
