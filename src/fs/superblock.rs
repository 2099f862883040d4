//! The primary superblock a finished mkfs leaves, read from a device's first 4 KiB:
//! the proof of a finished format that costs one read instead of a metadata commit.
//!
//! Both mkfs programs write the primary superblock last. mke2fs zeroes it first and
//! writes it once, at its end, after an fsync of everything else (e2fsprogs 1.47,
//! traced); mkfs.xfs writes it early with `sb_inprogress` set and clears the flag in
//! its last write (xfsprogs 6.1, traced). blkid reports a filesystem still in progress
//! as xfs all the same, and the kernel refuses to mount it, so the flag is read here.
//! A superblock left by an earlier tenant of the same extents never carries the UUID
//! chosen for this volume, so a match proves this volume's mkfs finished.

use std::fmt;

/// How much of the device the superblocks are read from.
pub const HEAD_BYTES: usize = 4096;

/// A filesystem UUID localvol chose for a volume before its mkfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FsUuid([u8; 16]);

impl FsUuid {
    /// A new random UUID (version 4).
    pub fn random() -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)?;
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        Ok(FsUuid(bytes))
    }

    /// The 8-4-4-4-12 hex form (lowercase), as mkfs takes it and `fmt` writes it.
    pub fn parse(text: &str) -> Option<Self> {
        let hex: String = text.split('-').collect();
        let groups: Vec<usize> = text.split('-').map(str::len).collect();
        if groups != [8, 4, 4, 4, 12] || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(FsUuid(bytes))
    }
}

impl fmt::Display for FsUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

const EXT4_SUPERBLOCK: usize = 1024;
const EXT4_MAGIC: usize = EXT4_SUPERBLOCK + 56;
const EXT4_UUID: usize = EXT4_SUPERBLOCK + 104;
const XFS_UUID: usize = 32;
const XFS_IN_PROGRESS: usize = 126;

/// The UUID of the finished ext4 or xfs whose primary superblock `head` (a device's
/// first bytes) holds; `None` for anything else, an xfs still in progress included.
pub fn finished_uuid(head: &[u8]) -> Option<FsUuid> {
    let uuid_at = |at: usize| -> Option<FsUuid> { Some(FsUuid(head.get(at..at + 16)?.try_into().ok()?)) };
    if head.get(EXT4_MAGIC..EXT4_MAGIC + 2) == Some(&[0x53, 0xef]) {
        return uuid_at(EXT4_UUID);
    }
    if head.get(..4) == Some(b"XFSB") && head.get(XFS_IN_PROGRESS) == Some(&0) {
        return uuid_at(XFS_UUID);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Heads captured from mkfs.ext4 1.47.0 and mkfs.xfs 6.1.0 run with this UUID
    /// (`tests/fixtures/fs/README.md`).
    const CAPTURED: &str = "6f1c2a8e-3b4d-4e5f-9a0b-1c2d3e4f5a6b";

    fn fixture(name: &str) -> Vec<u8> {
        std::fs::read(format!("{}/tests/fixtures/fs/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
    }

    #[test]
    fn a_finished_mkfs_shows_the_uuid_it_was_given() {
        let uuid = FsUuid::parse(CAPTURED).unwrap();
        assert_eq!(finished_uuid(&fixture("ext4-head.bin")), Some(uuid));
        assert_eq!(finished_uuid(&fixture("xfs-head.bin")), Some(uuid));
    }

    #[test]
    fn an_xfs_still_in_progress_or_anything_else_shows_none() {
        // blkid calls this head xfs; the kernel refuses to mount it.
        assert_eq!(finished_uuid(&fixture("xfs-in-progress-head.bin")), None);
        // mke2fs zeroes the primary superblock first and writes it last.
        assert_eq!(finished_uuid(&[0u8; HEAD_BYTES]), None);
        let mut ext4 = fixture("ext4-head.bin");
        ext4[EXT4_MAGIC] = 0;
        assert_eq!(finished_uuid(&ext4), None);
        // A device shorter than a superblock.
        assert_eq!(finished_uuid(&fixture("ext4-head.bin")[..1100]), None);
        assert_eq!(finished_uuid(b"XFSB"), None);
    }

    #[test]
    fn uuids_round_trip_through_text_and_random_ones_are_version_4() {
        let uuid = FsUuid::parse(CAPTURED).unwrap();
        assert_eq!(uuid.to_string(), CAPTURED);
        for bad in [
            "",
            "6f1c2a8e3b4d4e5f9a0b1c2d3e4f5a6b",
            "6f1c2a8e-3b4d-4e5f-9a0b-1c2d3e4f5a6g",
            "6f1c2a8e-3b4d-4e5f-9a0b1-c2d3e4f5a6b",
        ] {
            assert_eq!(FsUuid::parse(bad), None, "{bad}");
        }
        let (a, b) = (FsUuid::random().unwrap(), FsUuid::random().unwrap());
        assert_ne!(a, b);
        let text = a.to_string();
        assert_eq!(&text[14..15], "4");
        assert!("89ab".contains(&text[19..20]), "{text}");
        assert_eq!(FsUuid::parse(&text), Some(a));
    }
}
