//! Every branch of stage's plan, as tables: the facts a stage has gathered at each step,
//! and what the plan says to do with them.

use std::path::Path;

use super::*;
use crate::model::{AccessMode, ClaimRef, ClassName, Token, VolumeId, VolumeMode};

const DEVICE: &str = "/dev/loop-plan7";
const MIB: u64 = 1 << 20;
const ENCRYPTED: Encryption = Encryption {
    allow_discards: false,
};

fn record(mode: VolumeMode, fs_type: Option<FsType>, encryption: Option<Encryption>) -> VolumeRecord {
    VolumeRecord {
        id: VolumeId::new(ClassName::parse("default").unwrap(), Token::for_name("pvc-plan")),
        name: "pvc-plan".to_string(),
        size_bytes: 1 << 30,
        mode,
        fs_type,
        claim: ClaimRef::default(),
        filesystem_grow_pending: false,
        encryption,
    }
}

fn filesystem_record(fs_type: FsType, size_bytes: u64, grow_pending: bool) -> VolumeRecord {
    VolumeRecord {
        size_bytes,
        filesystem_grow_pending: grow_pending,
        ..record(VolumeMode::Filesystem, Some(fs_type), None)
    }
}

fn block() -> AccessType {
    AccessType::Block
}

fn mount(fs_type: Option<FsType>) -> AccessType {
    AccessType::Mount {
        fs_type,
        mount_flags: vec!["noatime".to_string()],
    }
}

/// A refusal of the plan, with what tells one case of it from another; its id is
/// checked to be the volume's.
fn refusal(e: &VolumeError, volume: &VolumeId) -> String {
    match e {
        VolumeError::AccessMismatch {
            id,
            created,
            requested,
        } if id == volume => format!("AccessMismatch {created} -> {requested}"),
        VolumeError::MissingPassphrase { id } if id == volume => "MissingPassphrase".to_string(),
        VolumeError::TooSmallForFilesystem {
            id,
            size_bytes,
            fs_type,
            min_bytes,
        } if id == volume => format!("TooSmallForFilesystem {size_bytes} {fs_type} {min_bytes}"),
        VolumeError::WrongFilesystem {
            device,
            found,
            requested,
        } => format!("WrongFilesystem {} {found:?} {requested}", device.display()),
        other => panic!("not a refusal the plan makes: {other:?}"),
    }
}

/// What [`before_attach`] says, in a form a table can hold: the encryption a
/// passphrase unlocks, and how the volume is staged (a filesystem's type and data path).
#[derive(Debug, PartialEq, Eq)]
enum Planned {
    Block {
        unlock: Option<Encryption>,
    },
    Filesystem {
        unlock: Option<Encryption>,
        fs_type: FsType,
        data_path: DataPath,
    },
}

/// Case, record, the access type staged, whether the request has a passphrase, and
/// what is planned or the refusal.
type BeforeAttachCase = (
    &'static str,
    VolumeRecord,
    AccessType,
    bool,
    Result<Planned, &'static str>,
);

#[test]
fn before_attach_refuses_or_says_how_the_volume_is_staged() {
    use Planned::{Block, Filesystem};
    use VolumeMode as Made;
    let passphrase = Passphrase::new(b"open sesame").unwrap();
    let (ext4, xfs) = (Some(FsType::Ext4), Some(FsType::Xfs));
    #[rustfmt::skip]
    let cases: Vec<BeforeAttachCase> = vec![
        ("raw block", record(Made::Block, None, None), block(), false,
            Ok(Block { unlock: None })),
        ("raw block, encrypted", record(Made::Block, None, Some(ENCRYPTED)), block(), true,
            Ok(Block { unlock: Some(ENCRYPTED) })),
        ("raw block, encrypted, no passphrase", record(Made::Block, None, Some(ENCRYPTED)), block(), false,
            Err("MissingPassphrase")),
        ("raw block, a passphrase for a plain volume is ignored", record(Made::Block, None, None), block(), true,
            Ok(Block { unlock: None })),
        ("filesystem, the record's type", record(Made::Filesystem, xfs, None), mount(None), false,
            Ok(Filesystem { unlock: None, fs_type: FsType::Xfs, data_path: DataPath::Device })),
        ("filesystem, the request's type over the record's", record(Made::Filesystem, xfs, None), mount(ext4), false,
            Ok(Filesystem { unlock: None, fs_type: FsType::Ext4, data_path: DataPath::Device })),
        ("filesystem, the class's default when neither names one", record(Made::Filesystem, None, None), mount(None), false,
            Ok(Filesystem { unlock: None, fs_type: FsType::Xfs, data_path: DataPath::Device })),
        ("filesystem, encrypted: on the mapping", record(Made::Filesystem, ext4, Some(ENCRYPTED)), mount(None), true,
            Ok(Filesystem { unlock: Some(ENCRYPTED), fs_type: FsType::Ext4, data_path: DataPath::Mapping })),
        ("filesystem, encrypted, no passphrase", record(Made::Filesystem, ext4, Some(ENCRYPTED)), mount(None), false,
            Err("MissingPassphrase")),
        ("a block volume staged as a filesystem", record(Made::Block, None, None), mount(ext4), false,
            Err("AccessMismatch block -> filesystem")),
        ("a filesystem volume staged as raw block", record(Made::Filesystem, ext4, None), block(), false,
            Err("AccessMismatch filesystem -> block")),
        // The access type is checked before the passphrase.
        ("an encrypted block volume staged as a filesystem, no passphrase",
            record(Made::Block, None, Some(ENCRYPTED)), mount(ext4), false,
            Err("AccessMismatch block -> filesystem")),
    ];
    for (name, record, access, with_passphrase, expected) in cases {
        let capability = Capability {
            access,
            mode: AccessMode::SingleNodeWriter,
        };
        let given = with_passphrase.then_some(&passphrase);
        let planned = before_attach(&record, &capability, given, FsType::Xfs);
        match (planned, expected) {
            (Ok(staging), Ok(expected)) => {
                if let Some(unlock) = staging.unlock {
                    assert!(
                        std::ptr::eq(unlock.passphrase, &passphrase),
                        "{name}: the request's passphrase"
                    );
                }
                let unlock = staging.unlock.map(|u| u.encryption);
                let planned = match staging.access {
                    StagedAs::Block => Block { unlock },
                    StagedAs::Filesystem(filesystem) => {
                        assert_eq!(filesystem.mount_flags, ["noatime"], "{name}: the request's flags");
                        Filesystem {
                            unlock,
                            fs_type: filesystem.fs_type,
                            data_path: filesystem.data_path,
                        }
                    }
                };
                assert_eq!(planned, expected, "{name}");
            }
            (Err(e), Err(expected)) => assert_eq!(refusal(&e, &record.id), expected, "{name}"),
            (planned, expected) => panic!("{name}: planned {planned:?}, expected {expected:?}"),
        }
    }
}

#[test]
fn after_mark_mounts_a_finished_filesystem_formats_an_unfinished_one_and_probes_the_rest() {
    use FormatMark::{Finished, Unfinished, Unknown};
    use FsType::{Ext4, Xfs};
    #[rustfmt::skip]
    let cases = [
        // (case, mark, the record's type, the type staged, a grow pending, planned)
        ("finished, the record's type, nothing to grow", Finished, Some(Ext4), Ext4, false, AfterMark::MountMade),
        ("finished xfs, the record's type", Finished, Some(Xfs), Xfs, false, AfterMark::MountMade),
        ("finished, a grow pending", Finished, Some(Ext4), Ext4, true, AfterMark::Probe),
        ("finished, staged as another type", Finished, Some(Xfs), Ext4, false, AfterMark::Probe),
        ("finished, the record names no type", Finished, None, Ext4, false, AfterMark::Probe),
        ("unfinished", Unfinished, Some(Ext4), Ext4, false, AfterMark::NeverFormatted),
        ("unfinished, a grow pending", Unfinished, Some(Ext4), Ext4, true, AfterMark::NeverFormatted),
        ("unfinished, the record names no type", Unfinished, None, Xfs, false, AfterMark::NeverFormatted),
        ("no mark that tells", Unknown, Some(Ext4), Ext4, false, AfterMark::Probe),
        ("no mark that tells, the record names no type", Unknown, None, Ext4, false, AfterMark::Probe),
    ];
    for (name, mark, recorded, fs_type, grow_pending, expected) in cases {
        let record = VolumeRecord {
            fs_type: recorded,
            filesystem_grow_pending: grow_pending,
            ..record(VolumeMode::Filesystem, None, None)
        };
        assert_eq!(after_mark(&record, fs_type, mark), expected, "{name}");
    }
}

/// Case, the type staged, the volume's size, whether a grow is pending, the data path,
/// what was found, and what is planned or the refusal.
type SignatureCase = (
    &'static str,
    FsType,
    u64,
    bool,
    DataPath,
    Signature,
    Result<MountPlan, String>,
);

#[test]
fn for_signature_formats_an_empty_device_mounts_its_own_filesystem_and_refuses_anything_else() {
    use DataPath::{Device, Mapping};
    use FsType::{Ext4, Xfs};
    use MountPlan::{AsFound, Format, GrowAfterMount, GrowBeforeMount};
    let fs = |name: &str| Signature::Filesystem(name.to_string());
    let format = |options, clear_grow_pending| {
        Ok(Format {
            options,
            clear_grow_pending,
        })
    };
    let device = Path::new(DEVICE);
    #[rustfmt::skip]
    let cases: Vec<SignatureCase> = vec![
        ("empty device: the backend's options", Ext4, 64 * MIB, false, Device, Signature::Empty,
            format(FormatOptionsFrom::Backend, false)),
        ("empty mapping: mkfs's defaults", Ext4, 64 * MIB, false, Mapping, Signature::Empty,
            format(FormatOptionsFrom::Defaults, false)),
        ("empty xfs device", Xfs, 512 * MIB, false, Device, Signature::Empty,
            format(FormatOptionsFrom::Backend, false)),
        ("empty, a grow pending: cleared by the format", Ext4, 64 * MIB, true, Device, Signature::Empty,
            format(FormatOptionsFrom::Backend, true)),
        ("empty mapping, a grow pending", Xfs, 512 * MIB, true, Mapping, Signature::Empty,
            format(FormatOptionsFrom::Defaults, true)),
        ("empty, exactly the smallest ext4", Ext4, Ext4.min_bytes(), false, Device, Signature::Empty,
            format(FormatOptionsFrom::Backend, false)),
        ("empty, too small for ext4", Ext4, 128 << 10, false, Device, Signature::Empty,
            Err(format!("TooSmallForFilesystem {} ext4 {}", 128 << 10, Ext4.min_bytes()))),
        ("empty, too small for xfs", Xfs, 64 * MIB, true, Mapping, Signature::Empty,
            Err(format!("TooSmallForFilesystem {} xfs {}", 64 * MIB, Xfs.min_bytes()))),
        ("its own ext4", Ext4, 64 * MIB, false, Device, fs("ext4"), Ok(AsFound)),
        ("its own xfs", Xfs, 512 * MIB, false, Mapping, fs("xfs"), Ok(AsFound)),
        // Only an empty device is measured: a filesystem found is mounted as it is.
        ("its own ext4, smaller than mkfs makes", Ext4, 128 << 10, false, Device, fs("ext4"), Ok(AsFound)),
        ("a copy's ext4: grown unmounted", Ext4, 64 * MIB, true, Device, fs("ext4"), Ok(GrowBeforeMount)),
        ("a copy's xfs: grown mounted", Xfs, 512 * MIB, true, Device, fs("xfs"), Ok(GrowAfterMount)),
        ("a copy's ext4 on a mapping", Ext4, 64 * MIB, true, Mapping, fs("ext4"), Ok(GrowBeforeMount)),
        ("a LUKS header on a plain volume", Ext4, 64 * MIB, false, Device, Signature::Luks,
            Err(format!("WrongFilesystem {DEVICE} \"a LUKS header (the volume is not encrypted by localvol)\" ext4"))),
        ("another filesystem", Ext4, 64 * MIB, false, Device, fs("xfs"),
            Err(format!("WrongFilesystem {DEVICE} \"xfs\" ext4"))),
        ("another filesystem, a grow pending", Xfs, 512 * MIB, true, Device, fs("ext4"),
            Err(format!("WrongFilesystem {DEVICE} \"ext4\" xfs"))),
        ("a partition table", Xfs, 512 * MIB, false, Device, Signature::Other("dos".to_string()),
            Err(format!("WrongFilesystem {DEVICE} \"dos\" xfs"))),
    ];
    for (name, fs_type, size_bytes, grow_pending, data_path, found, expected) in cases {
        let record = filesystem_record(fs_type, size_bytes, grow_pending);
        let planned =
            for_signature(&record, fs_type, data_path, device, found).map_err(|e| refusal(&e, &record.id));
        assert_eq!(planned, expected, "{name}");
    }
}

/// The three steps in a row, as stage takes them, for the cases where one step's
/// answer is what the next one is asked about.
#[test]
fn the_steps_in_a_row() {
    let capability = Capability {
        access: mount(None),
        mode: AccessMode::SingleNodeWriter,
    };
    let planned = |record: &VolumeRecord, mark, found: fn() -> Signature| {
        let StagedAs::Filesystem(filesystem) = before_attach(record, &capability, None, FsType::Ext4)
            .unwrap()
            .access
        else {
            panic!("a filesystem volume is staged as a filesystem");
        };
        let after_mark = after_mark(record, filesystem.fs_type, mark);
        // What stage gives the last step: the mark's word, or blkid's.
        let found = match after_mark {
            AfterMark::NeverFormatted => Signature::Empty,
            AfterMark::MountMade | AfterMark::Probe => found(),
        };
        let mount_plan = for_signature(
            record,
            filesystem.fs_type,
            filesystem.data_path,
            Path::new(DEVICE),
            found,
        )
        .map_err(|e| refusal(&e, &record.id));
        (after_mark, mount_plan)
    };
    let ext4 = || Signature::Filesystem("ext4".to_string());
    // An unfinished mark: formatted without asking blkid, even over what it would find.
    let new = filesystem_record(FsType::Ext4, 64 * MIB, false);
    assert_eq!(
        planned(&new, FormatMark::Unfinished, ext4),
        (
            AfterMark::NeverFormatted,
            Ok(MountPlan::Format {
                options: FormatOptionsFrom::Backend,
                clear_grow_pending: false
            })
        )
    );
    // An unfinished mark on a volume too small for its filesystem: refused, unformatted.
    let tiny = filesystem_record(FsType::Ext4, 128 << 10, false);
    assert_eq!(
        planned(&tiny, FormatMark::Unfinished, ext4),
        (
            AfterMark::NeverFormatted,
            Err(format!(
                "TooSmallForFilesystem {} ext4 {}",
                128 << 10,
                FsType::Ext4.min_bytes()
            ))
        )
    );
    // A finished mark whose mount the kernel refused: blkid's answer decides.
    let made = filesystem_record(FsType::Ext4, 64 * MIB, false);
    assert_eq!(
        planned(&made, FormatMark::Finished, || Signature::Filesystem(
            "xfs".to_string()
        )),
        (
            AfterMark::MountMade,
            Err(format!("WrongFilesystem {DEVICE} \"xfs\" ext4"))
        )
    );
    // A copy whose xfs is still its source's size: probed, then grown after the mount.
    let copy = filesystem_record(FsType::Xfs, 512 * MIB, true);
    assert_eq!(
        planned(&copy, FormatMark::Finished, || Signature::Filesystem(
            "xfs".to_string()
        )),
        (AfterMark::Probe, Ok(MountPlan::GrowAfterMount))
    );
}
