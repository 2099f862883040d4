use std::io;
use std::path::PathBuf;
use std::time::Duration;

use super::*;
use crate::backend::BackendError;
use crate::error::Error;
use crate::fs::FsError;
use crate::host::{CommandError, SyscallError};
use crate::k8s::OwnerError;
use crate::k8s::api::{call, call_within};
use crate::locks::LockError;
use crate::model::ValidationError;
use crate::model::{ClassName, Token, VolumeId};
use crate::volume::VolumeError;

fn class() -> ClassName {
    ClassName::parse("default").unwrap()
}

fn id() -> VolumeId {
    VolumeId::new(class(), Token::for_name("pvc-1"))
}

fn failed(program: &'static str, stderr: &str) -> CommandError {
    CommandError::Failed {
        program,
        args: String::new(),
        exit_code: Some(5),
        stdout: String::new(),
        stderr: stderr.to_string(),
    }
}

fn fixture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    // First line: the exit code capture.sh recorded.
    text.split_once('\n').unwrap().1.to_string()
}

fn backend_command(c: CommandError) -> Error {
    VolumeError::Backend(BackendError::Command(c)).into()
}

fn grow(c: CommandError) -> Error {
    VolumeError::Fs(FsError::Grow {
        fs_type: "ext4".to_string(),
        device: "/dev/loop0".into(),
        source: c,
    })
    .into()
}

fn errno(call: &'static str, errno: i32) -> Error {
    VolumeError::Syscall(SyscallError {
        call,
        path: "/dev/loop0".into(),
        source: io::Error::from_raw_os_error(errno),
    })
    .into()
}

fn api_status(code: u16) -> kube::Error {
    kube::Error::Api(Box::new(kube::core::Status::failure("x", "y").with_code(code)))
}

#[test]
fn every_case_is_decided_on_purpose() {
    use Failure::{Terminal, Transient};
    let cases: Vec<(&str, Error, Failure)> = vec![
        (
            "no space in the VG or pool",
            VolumeError::Backend(BackendError::NoSpace {
                class: class(),
                requested: 2 << 30,
                available: 1 << 30,
            })
            .into(),
            Terminal,
        ),
        (
            "the class cannot hold the new size (expand)",
            VolumeError::NoRoomToGrow {
                id: crate::model::VolumeId::parse("loop.pvc-1").unwrap(),
                source: BackendError::NoSpace {
                    class: class(),
                    requested: 2 << 30,
                    available: 1 << 30,
                },
            }
            .into(),
            Terminal,
        ),
        (
            "lvextend: thick VG full (captured)",
            backend_command(failed(
                "lvextend",
                &fixture("lvm/lvextend-thick-insufficient-space.txt"),
            )),
            Terminal,
        ),
        (
            "lvextend: thin pool full (captured)",
            backend_command(failed(
                "lvextend",
                &fixture("lvm/lvextend-thinpool-insufficient-space.txt"),
            )),
            Terminal,
        ),
        (
            "ndctl: region full (captured)",
            backend_command(failed("ndctl", &fixture("ndctl/create-namespace-no-space.txt"))),
            Terminal,
        ),
        (
            "ndctl: size not aligned to the region (captured)",
            backend_command(failed("ndctl", &fixture("ndctl/create-namespace-misaligned.txt"))),
            Terminal,
        ),
        (
            "volume busy with another call",
            LockError::Busy {
                volume: "v".into(),
                operation: "NodeExpandVolume",
            }
            .into(),
            Transient,
        ),
        (
            "lvm lock wait timed out",
            backend_command(failed(
                "lvextend",
                "  Giving up waiting for lock.\n  Can't get lock for vg1.\n  Cannot process volume group vg1",
            )),
            Transient,
        ),
        (
            "lvm lock busy while the VG is also full",
            backend_command(failed(
                "lvextend",
                "  Insufficient free space: 10 extents needed, but only 1 available\n  Failed to lock logical volume vg1/lv",
            )),
            Transient,
        ),
        (
            "command killed at its deadline",
            backend_command(CommandError::TimedOut {
                program: "lvextend",
                args: String::new(),
                timeout: Duration::from_secs(120),
            }),
            Transient,
        ),
        (
            "losetup: device busy",
            backend_command(failed("losetup", "losetup: /dev/loop3: Device or resource busy")),
            Transient,
        ),
        (
            "unrecognised tool failure",
            backend_command(failed("lvextend", "  something nobody has seen before")),
            Transient,
        ),
        (
            "tool missing from the image",
            backend_command(CommandError::Spawn {
                program: "lvextend",
                source: io::Error::from(io::ErrorKind::NotFound),
            }),
            Terminal,
        ),
        (
            "filesystem that cannot grow",
            VolumeError::Fs(FsError::UnsupportedGrow {
                fs_type: "vfat".to_string(),
            })
            .into(),
            Terminal,
        ),
        (
            "ext4 online growth without CAP_SYS_RESOURCE",
            grow(failed(
                "resize2fs",
                "resize2fs 1.47.0 (5-Feb-2023)\nresize2fs: Permission denied to resize filesystem",
            )),
            Terminal,
        ),
        (
            "ext4 too large for 32-bit block numbers",
            grow(failed(
                "resize2fs",
                "resize2fs: New size too large to be expressed in 32 bits",
            )),
            Terminal,
        ),
        (
            "xfs_growfs while the mount is busy",
            grow(failed("xfs_growfs", "xfs_growfs: Device or resource busy")),
            Transient,
        ),
        (
            "filesystem grow killed at its deadline",
            grow(CommandError::TimedOut {
                program: "resize2fs",
                args: String::new(),
                timeout: Duration::from_secs(600),
            }),
            Transient,
        ),
        (
            "loop capacity ioctl: busy",
            errno("ioctl", libc::EBUSY),
            Transient,
        ),
        (
            "block size ioctl: not a block device",
            errno("ioctl", libc::ENOTTY),
            Terminal,
        ),
        (
            "growing the backing file: host filesystem full",
            VolumeError::Backend(BackendError::Io {
                op: "truncate",
                path: "/var/lib/localvol/x.img".into(),
                source: io::Error::from_raw_os_error(libc::EFBIG),
            })
            .into(),
            Terminal,
        ),
        (
            "volume gone",
            VolumeError::Backend(BackendError::NotFound {
                class: class(),
                token: Token::for_name("pvc-1"),
            })
            .into(),
            Terminal,
        ),
        ("unknown volume id", VolumeError::NotFound(id()).into(), Terminal),
        (
            "pod cache not synced yet",
            OwnerError::NotSynced.into(),
            Transient,
        ),
        (
            "device class unusable for now (VG missing)",
            VolumeError::Backend(BackendError::Unavailable {
                class: class(),
                reason: "vg1 not found".into(),
            })
            .into(),
            Transient,
        ),
        (
            "not mounted where kubelet said",
            VolumeError::NotStaged {
                id: id(),
                path: "/stage".into(),
            }
            .into(),
            Transient,
        ),
        (
            "size beyond localvol's maximum",
            ValidationError::OutOfRange("2 PiB".into()).into(),
            Terminal,
        ),
    ];
    for (what, error, expected) in &cases {
        assert_eq!(classify(Cause::Operation(error)), *expected, "{what}: {error}");
    }
}

#[tokio::test]
async fn api_errors() {
    use Failure::{Terminal, Transient};
    for (code, expected) in [
        (409, Transient),
        (429, Transient),
        (500, Transient),
        (503, Transient),
        (403, Terminal),
        (404, Terminal),
        (422, Terminal),
    ] {
        let answered = call(|| "get x".to_string(), async { Err::<(), _>(api_status(code)) }).await;
        let e = answered.expect_err("an error answer");
        assert_eq!(classify(Cause::Api(&e)), expected, "HTTP {code}");
    }
    let slow = call_within(
        Duration::from_millis(1),
        || "get x".to_string(),
        std::future::pending::<Result<(), kube::Error>>(),
    )
    .await;
    let e = slow.expect_err("no answer");
    assert_eq!(classify(Cause::Api(&e)), Transient);
}
