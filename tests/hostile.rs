//! Hostile input at the socket: symlink tricks in staging and target paths, mount
//! option and volume id injection, volume context that tries to steer the daemon, and
//! the permissions of what the daemon creates. Every refusal must change nothing.
//! (`..` in paths, a symlinked staging path and the raw-block previous-tenant check are
//! in tests/privileged.rs.)
//!
//! The tests that stage and publish run sandboxed (see `tests/testkit/src/hostile/sandbox.rs`): each
//! re-executes this binary for itself under `unshare --mount`, with every mount of that
//! namespace read-only (`/`, `/dev`, `/proc`, `/sys` included) except a private tmpfs
//! holding the daemon's socket, data directory and kubelet root. A driver that mounts
//! over `/etc`, unmounts `/proc` or removes a directory it did not make fails the test
//! there instead of harming the machine; loop devices left on the tmpfs are detached
//! by the parent. `node_calls_act_only_on_what_belongs_to_the_volume` (issue 14) checks
//! after every case that the mount table, those loop devices and every file below the
//! kubelet root and the data directory are unchanged.

use localvol_testkit::hostile::{node_cases, sandbox};

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use localvol_testkit::csi_client::{
    controller_expand_request, fs_capability, publish_request, stage_request, unpublish_request,
    unstage_request,
};
use localvol_testkit::{
    Cleanup, InProcessDaemon, create_request, loops_under, mount_capability, mounts_under, privileged,
};
use tonic::Code;

const MIB: i64 = 1 << 20;

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        found.push(entry.path());
        if entry.file_type().unwrap().is_dir() {
            found.extend(files_below(&entry.path()));
        }
    }
    found
}

/// Ids that try to reach outside the class directory or into a command line are
/// INVALID_ARGUMENT (or NOT_FOUND for a well-formed id of no volume), and create nothing.
#[tokio::test]
async fn injected_volume_ids_are_refused() {
    let d = InProcessDaemon::start(&[]).await;
    let mut node = d.node().await;
    let mut controller = d.controller().await;
    let before = files_below(d.dir.path());
    let staging = d.path("stage");
    for id in [
        "default.../../../etc/passwd",
        "default./etc/passwd",
        "default.--help",
        "default.-rf",
        "default.a;touch /tmp/localvol-pwned",
        "default.$(id)",
        "../default.x",
        "default.x\0y",
        "default.x\ny",
        "default. x",
    ] {
        let status = node
            .node_stage_volume(stage_request(id, &staging, &mount_capability()))
            .await
            .unwrap_err();
        assert!(
            matches!(status.code(), Code::InvalidArgument | Code::NotFound),
            "stage {id:?}: {status:?}"
        );
        let status = controller
            .controller_expand_volume(controller_expand_request(id, MIB))
            .await
            .unwrap_err();
        assert!(
            matches!(status.code(), Code::InvalidArgument | Code::NotFound),
            "expand {id:?}: {status:?}"
        );
    }
    assert!(!Path::new("/tmp/localvol-pwned").exists());
    assert_eq!(files_below(d.dir.path()), before, "refused calls create nothing");
    d.stop().await;
}

/// The socket is 0600 in a directory without world access; volume files are 0600 in a 0700 class
/// directory; staging and target directories are not world-accessible.
#[tokio::test]
async fn created_paths_have_tight_permissions() {
    let d = InProcessDaemon::start(&[]).await;
    assert_eq!(mode(&d.socket), 0o600, "CSI socket");
    assert_eq!(
        mode(d.socket.parent().unwrap()) & 0o007,
        0,
        "socket directory: no world access"
    );
    let mut controller = d.controller().await;
    controller
        .create_volume(create_request("pvc-perm", 16 * MIB, ("ns", "perm")))
        .await
        .unwrap();
    let files: Vec<PathBuf> = files_below(&d.data_dir())
        .into_iter()
        .filter(|p| p.is_file())
        .collect();
    assert_eq!(files.len(), 2, "image and record: {files:?}");
    for file in &files {
        assert_eq!(mode(file), 0o600, "{}", file.display());
        assert_eq!(
            mode(file.parent().unwrap()),
            0o700,
            "{}",
            file.parent().unwrap().display()
        );
    }
    if privileged() {
        let id = d
            .client()
            .await
            .create_id(create_request("pvc-perm", 16 * MIB, ("ns", "perm")))
            .await;
        let (staging, target) = localvol_testkit::kubelet_paths(&d.path("kubelet"), "pv-perm", "pod-perm");
        let _cleanup = Cleanup {
            mounts: vec![staging.clone(), target.clone()],
            data: d.data_dir(),
        };
        let mut node = d.node().await;
        node.node_stage_volume(stage_request(&id, &staging, &mount_capability()))
            .await
            .unwrap();
        node.node_publish_volume(publish_request(&id, &staging, &target, &mount_capability()))
            .await
            .unwrap();
        for created in [staging.parent().unwrap(), target.parent().unwrap()] {
            assert_eq!(
                mode(created) & 0o007,
                0,
                "{} is not world-accessible",
                created.display()
            );
        }
        node.node_unpublish_volume(unpublish_request(&id, &target))
            .await
            .unwrap();
        node.node_unstage_volume(unstage_request(&id, &staging))
            .await
            .unwrap();
    }
    d.stop().await;
}

/// Symlinks planted in kubelet's directories, mount options that try to change the
/// mount's topology or smuggle in arguments, and volume context that tries to steer
/// the daemon: refused (or ignored) with nothing mounted where it should not be.
/// Confinement, ownership of mounts and the spec's limits, one hostile case at a time
/// (`tests/testkit/src/hostile/node_cases.rs`), in a sandbox.
#[test]
fn node_calls_act_only_on_what_belongs_to_the_volume() {
    if !privileged() {
        return;
    }
    let Some(scratch) = sandbox::run_sandboxed("node_calls_act_only_on_what_belongs_to_the_volume") else {
        return;
    };
    runtime().block_on(node_cases::run(scratch, node_cases::Backend::loop_files()));
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn symlinks_mount_option_and_context_injection() {
    if !privileged() {
        return;
    }
    if sandbox::run_sandboxed("symlinks_mount_option_and_context_injection").is_none() {
        return;
    }
    runtime().block_on(symlinks_mount_option_and_context_injection_inside());
}

async fn symlinks_mount_option_and_context_injection_inside() {
    let d = InProcessDaemon::start(&[]).await;
    let mut node = d.node().await;
    let id = d
        .client()
        .await
        .create_id(create_request("pvc-hostile", 32 * MIB, ("ns", "hostile")))
        .await;
    let staging = d.path("kubelet/stage/globalmount");
    let victim = d.path("victim");
    std::fs::create_dir_all(&victim).unwrap();
    let _cleanup = Cleanup {
        mounts: vec![staging.clone(), victim.clone(), d.path("kubelet/pods/a/mount")],
        data: d.data_dir(),
    };

    // Mount options: topology changes, option-like and shell-like strings.
    for flags in [
        &["bind"][..],
        &["remount,rw"],
        &["rshared"],
        &["-o", "exec"],
        &["--bind"],
        &["ro,x=$(id)"],
        &["nosuid;rm -rf /"],
        &["noatime ro"],
        &["context=\"system_u\""],
    ] {
        let status = node
            .node_stage_volume(stage_request(&id, &staging, &fs_capability("ext4", flags)))
            .await
            .unwrap_err();
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{flags:?}: {}",
            status.message()
        );
    }
    assert!(mounts_under(d.dir.path()).is_empty());
    assert!(loops_under(&d.data_dir()).is_empty(), "refused before attaching");

    // Volume context cannot steer the daemon: keys localvol does not know are refused
    // before anything is attached; known keys are carried as data, never as arguments.
    let mut req = stage_request(&id, &staging, &mount_capability());
    req.volume_context = HashMap::from(
        [
            ("fsType", "xfs -f"),
            ("localvol.csi.dev/device-class", "../../etc"),
            ("mkfsOptions", "-E root_owner=0:0"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    let status = node.node_stage_volume(req).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
    assert!(loops_under(&d.data_dir()).is_empty(), "refused before attaching");
    let mut req = stage_request(&id, &staging, &mount_capability());
    req.volume_context = HashMap::from(
        [
            ("localvol.csi.dev/device-class", "../../etc"),
            ("csi.storage.k8s.io/pod.name", "--help"),
            ("csi.storage.k8s.io/pod.namespace", "$(touch /tmp/localvol-pwned)"),
            ("csi.storage.k8s.io/pod.uid", "; reboot"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    node.node_stage_volume(req).await.unwrap();
    let mounted: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(staging.to_str().unwrap()))
        .map(str::to_string)
        .collect();
    assert_eq!(mounted.len(), 1, "{mounted:?}");
    assert!(
        mounted[0].contains(" - ext4 "),
        "the capability decides: {}",
        mounted[0]
    );
    assert!(!Path::new("/tmp/localvol-pwned").exists());

    // A target whose parent is a symlink to somewhere else: refused, nothing mounted
    // at the symlink's destination.
    std::fs::create_dir_all(d.path("kubelet/pods")).unwrap();
    std::os::unix::fs::symlink(&victim, d.path("kubelet/pods/a")).unwrap();
    let status = node
        .node_publish_volume(publish_request(
            &id,
            &staging,
            &d.path("kubelet/pods/a/mount"),
            &mount_capability(),
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
    assert!(
        !victim.join("mount").exists(),
        "nothing created through the symlink"
    );

    // A target that is itself a symlink to the staging mount: unpublish must not
    // unmount the staged volume through it.
    std::os::unix::fs::symlink(&staging, d.path("kubelet/pods/b")).unwrap();
    let status = node
        .node_unpublish_volume(unpublish_request(&id, &d.path("kubelet/pods/b")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
    assert_eq!(mounts_under(d.dir.path()), vec![staging.display().to_string()]);

    // Unstage through a staging path with a symlinked parent: refused, still staged.
    std::os::unix::fs::symlink(d.path("kubelet/stage"), d.path("kubelet/alias")).unwrap();
    let status = node
        .node_unstage_volume(unstage_request(&id, &d.path("kubelet/alias/globalmount")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
    assert_eq!(mounts_under(d.dir.path()), vec![staging.display().to_string()]);

    node.node_unstage_volume(unstage_request(&id, &staging))
        .await
        .unwrap();
    assert!(mounts_under(d.dir.path()).is_empty());
    assert!(loops_under(&d.data_dir()).is_empty());
    d.stop().await;
}
