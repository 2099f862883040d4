//! Root-only: ReclaimSpace on real loop devices and filesystems, over the daemon's
//! csi-addons socket and through `localvol reclaim`, measured on the backing image.

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use localvol::proto::csi::v1 as csi;
use localvol::proto::identity::{self as identity, identity_client::IdentityClient};
use localvol::proto::reclaimspace::{self as rs, reclaim_space_node_client::ReclaimSpaceNodeClient};
use localvol_testkit::csi_client::{NewVolume, block_capability, fs_capability};
use localvol_testkit::{InProcessDaemon, connect, guest, privileged};

const MIB: u64 = 1 << 20;

fn ext4() -> csi::VolumeCapability {
    fs_capability("ext4", &[])
}

fn block() -> csi::VolumeCapability {
    block_capability()
}

async fn create_and_stage(d: &InProcessDaemon, name: &str, size: u64, cap: &csi::VolumeCapability) -> String {
    let csi = d.client().await;
    let volume = NewVolume {
        capability: cap.clone(),
        ..NewVolume::new(name, size as i64)
    };
    let id = csi.create_id(volume.request()).await;
    std::fs::create_dir_all(d.path("stage")).unwrap();
    csi.stage(&id, &d.path("stage"), cap).await.unwrap();
    id
}

async fn unstage_and_delete(d: &InProcessDaemon, id: &str) {
    let csi = d.client().await;
    csi.unstage(id, &d.path("stage")).await.unwrap();
    csi.delete(id).await.unwrap();
}

/// Bytes the loop image takes on the host's disk.
fn allocated(image: &Path) -> u64 {
    std::fs::metadata(image).unwrap().blocks() * 512
}

/// Writes `size` bytes of non-zero data, makes it durable, then deletes it durably.
fn write_and_delete(path: &Path, size: u64) {
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0x5A; MIB as usize];
    for _ in 0..size / MIB {
        file.write_all(&chunk).unwrap();
    }
    file.sync_all().unwrap();
    drop(file);
    nix::unistd::sync();
    std::fs::remove_file(path).unwrap();
    nix::unistd::sync();
}

/// NodeReclaimSpace of volume `id` by id alone, as the csi-addons sidecar asks.
fn reclaim_request(id: &str) -> rs::NodeReclaimSpaceRequest {
    rs::NodeReclaimSpaceRequest {
        volume_id: id.to_string(),
        ..Default::default()
    }
}

async fn reclaim(
    d: &InProcessDaemon,
    request: rs::NodeReclaimSpaceRequest,
) -> (rs::NodeReclaimSpaceResponse, String) {
    let response = ReclaimSpaceNodeClient::new(connect(&d.addons_socket).await)
        .node_reclaim_space(request)
        .await
        .unwrap();
    let header = response
        .metadata()
        .get("localvol-reclaim")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (response.into_inner(), header)
}

#[tokio::test]
async fn fitrim_on_a_loop_volume_gives_the_deleted_space_back() {
    if !privileged() {
        return;
    }
    let d = InProcessDaemon::start(&[]).await;

    // The csi-addons identity the sidecar checks.
    let mut ident = IdentityClient::new(connect(&d.addons_socket).await);
    let me = ident
        .get_identity(identity::GetIdentityRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(me.name, "localvol.csi.dev");
    let caps = ident
        .get_capabilities(identity::GetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert!(caps.iter().any(|c| matches!(
        c.r#type,
        Some(identity::capability::Type::ReclaimSpace(identity::capability::ReclaimSpace { r#type }))
            if r#type == identity::capability::reclaim_space::Type::Online as i32
    )));

    let id = create_and_stage(&d, "pvc-reclaim", 256 * MIB, &ext4()).await;
    let image = d.path("data/loop/default/pvc-reclaim.img");
    let empty = allocated(&image);
    write_and_delete(&d.path("stage/big"), 64 * MIB);
    let before = allocated(&image);
    assert!(
        before >= empty + 60 * MIB,
        "the deleted file's blocks are still allocated in the image: {empty} -> {before}"
    );

    let (reply, header) = reclaim(
        &d,
        rs::NodeReclaimSpaceRequest {
            volume_id: id.clone(),
            staging_target_path: d.path("stage").display().to_string(),
            ..Default::default()
        },
    )
    .await;
    let after = allocated(&image);
    let dropped = before.saturating_sub(after);
    eprintln!(
        "MEASURED loop ext4: image allocated {before} -> {after} bytes; dropped {dropped} of {} deleted ({:.1} %); \
         response pre {:?} post {:?}; {header}",
        64 * MIB,
        dropped as f64 * 100.0 / (64 * MIB) as f64,
        reply.pre_usage,
        reply.post_usage,
    );
    assert!(dropped * 10 >= 64 * MIB * 9, "dropped only {dropped} bytes");
    // A fresh thin LV is formatted as prezeroed: ext4 maps its metadata, not zeroed
    // inode tables (≈ 5 MiB of this 256 MiB volume, written in the background).
    assert!(
        after < 4 * MIB,
        "the empty filesystem maps {after} bytes of the pool"
    );
    let pre = reply.pre_usage.unwrap().usage_bytes as u64;
    let post = reply.post_usage.unwrap().usage_bytes as u64;
    assert!(pre.abs_diff(before) <= 4 * MIB, "pre {pre} vs measured {before}");
    assert!(post.abs_diff(after) <= 4 * MIB, "post {post} vs measured {after}");
    assert!((pre - post) * 10 >= 64 * MIB * 9, "pre {pre} post {post}");
    assert!(header.starts_with("reclaimed "), "{header}");

    // Again through the command line, for every volume of the node.
    write_and_delete(&d.path("stage/big"), 32 * MIB);
    let before = allocated(&image);
    // tokio's Command: the daemon serving the CLI runs on this test's runtime.
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_localvol"))
        .args([
            "reclaim",
            "--all",
            "--endpoint",
            &format!("unix://{}", d.addons_socket.display()),
            "--csi-endpoint",
            &format!("unix://{}", d.socket.display()),
        ])
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!(
        "localvol reclaim --all:\n{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success());
    assert!(stdout.contains(&format!("{id}: reclaimed ")), "{stdout}");
    assert!(stdout.contains("1 volume(s)"), "{stdout}");
    let dropped = before.saturating_sub(allocated(&image));
    assert!(
        dropped * 10 >= 32 * MIB * 9,
        "the CLI run dropped only {dropped} bytes"
    );

    // A volume nobody asked for: NOT_FOUND; a bad path: INVALID_ARGUMENT.
    let mut client = ReclaimSpaceNodeClient::new(connect(&d.addons_socket).await);
    let err = client
        .node_reclaim_space(rs::NodeReclaimSpaceRequest {
            volume_id: "default.pvc-nope".to_string(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    let err = client
        .node_reclaim_space(rs::NodeReclaimSpaceRequest {
            volume_id: id.clone(),
            volume_path: "relative/path".to_string(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    // Unstaged, a volume cannot be trimmed: FAILED_PRECONDITION.
    d.client().await.unstage(&id, &d.path("stage")).await.unwrap();
    let err = client.node_reclaim_space(reclaim_request(&id)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{}", err.message());
    d.client().await.delete(&id).await.unwrap();
    d.stop().await;
}

#[tokio::test]
async fn a_raw_block_volume_is_not_discarded() {
    if !privileged() {
        return;
    }
    let d = InProcessDaemon::start(&[]).await;
    let id = create_and_stage(&d, "pvc-raw", 16 * MIB, &block()).await;
    let image = d.path("data/loop/default/pvc-raw.img");
    // Write through the attached loop device (staging a block volume attaches it).
    let device = std::fs::read_dir("/sys/block")
        .unwrap()
        .flatten()
        .find(|e| {
            std::fs::read_to_string(e.path().join("loop/backing_file"))
                .is_ok_and(|b| b.trim_end() == image.to_str().unwrap())
        })
        .map(|e| Path::new("/dev").join(e.file_name()))
        .expect("the block volume's loop device");
    {
        let mut dev = std::fs::OpenOptions::new().write(true).open(&device).unwrap();
        dev.write_all(&vec![0xA5; 4 * MIB as usize]).unwrap();
        dev.sync_all().unwrap();
    }
    let before = allocated(&image);

    let (reply, header) = reclaim(&d, reclaim_request(&id)).await;
    assert_eq!(
        reply,
        rs::NodeReclaimSpaceResponse::default(),
        "no usage for a block volume"
    );
    assert!(header.starts_with("not discarded: raw block volume"), "{header}");
    assert_eq!(allocated(&image), before, "nothing was discarded");
    let mut data = vec![0; 4 * MIB as usize];
    std::fs::File::open(&device)
        .unwrap()
        .read_exact(&mut data)
        .unwrap();
    assert!(data.iter().all(|b| *b == 0xA5), "the data is intact");

    unstage_and_delete(&d, &id).await;
    d.stop().await;
}

/// Runs `program args` and returns its stdout; panics with stderr on failure.
fn run(program: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Bytes of the thin pool's data in use, from lvs' JSON report.
fn pool_data_bytes(pool: &str) -> u64 {
    let json = run(
        "lvs",
        &[
            "--reportformat",
            "json",
            "--units",
            "b",
            "--nosuffix",
            "-o",
            "lv_size,data_percent",
            pool,
        ],
    );
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    let lv = &report["report"][0]["lv"][0];
    let size: f64 = lv["lv_size"].as_str().unwrap().parse().unwrap();
    let percent: f64 = lv["data_percent"].as_str().unwrap().parse().unwrap();
    (size * percent / 100.0) as u64
}

/// In the tests/vm guest only (it needs device-mapper's thin target and a disk to give
/// LVM): the same 64 MiB written and deleted on an lvm-thin volume must come back to the
/// pool. tests/vm/suite.sh runs it (part `reclaim`); by hand:
/// `LOCALVOL_VM_SUITE=1 tests/vm/run.sh -- cargo test --test reclaim_privileged lvm_thin`.
/// The disk is `LOCALVOL_VM_DISK` (default /dev/vda), wiped.
#[tokio::test]
async fn fitrim_on_an_lvm_thin_volume_gives_the_pool_its_space_back() {
    if std::env::var("VMTEST_GUEST").as_deref() != Ok("1") {
        // Under LOCALVOL_VM_SUITE=1 the test must run, so being outside the guest is a failure.
        assert_ne!(
            std::env::var("LOCALVOL_VM_SUITE").as_deref(),
            Ok("1"),
            "LOCALVOL_VM_SUITE=1 but this is not the tests/vm guest"
        );
        eprintln!(
            "fitrim_on_an_lvm_thin_volume_gives_the_pool_its_space_back: NOT RUN: only in the tests/vm guest (tests/vm/suite.sh reclaim)"
        );
        return;
    }
    let disk = std::env::var("LOCALVOL_VM_DISK").unwrap_or_else(|_| "/dev/vda".to_owned());
    guest::thin_pool_on_wiped_disk("vg-reclaim", "pool0", &disk, "1G");
    let dir = tempfile::Builder::new()
        .prefix("localvol-test-")
        .tempdir()
        .unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "device-classes:\n  - name: thin\n    kind: lvm-thin\n    volume-group: vg-reclaim\n    \
         default: true\n    thin-pool: {name: pool0, overprovision-ratio: 10.0}\n",
    )
    .unwrap();
    let d = InProcessDaemon::start_in(dir, &["--config", config.to_str().unwrap()]).await;
    let id = create_and_stage(&d, "pvc-thin", 256 * MIB, &ext4()).await;
    write_and_delete(&d.path("stage/big"), 64 * MIB);
    let before = pool_data_bytes("vg-reclaim/pool0");
    let (reply, header) = reclaim(&d, reclaim_request(&id)).await;
    let after = pool_data_bytes("vg-reclaim/pool0");
    let dropped = before.saturating_sub(after);
    eprintln!(
        "MEASURED lvm-thin ext4: pool data {before} -> {after} bytes; dropped {dropped} of {} deleted; \
         response pre {:?} post {:?}; {header}",
        64 * MIB,
        reply.pre_usage,
        reply.post_usage,
    );
    assert!(
        dropped * 10 >= 64 * MIB * 9,
        "the pool got back only {dropped} bytes"
    );
    let pre = reply.pre_usage.unwrap().usage_bytes as u64;
    let post = reply.post_usage.unwrap().usage_bytes as u64;
    assert!(
        pre.saturating_sub(post) * 10 >= 64 * MIB * 9,
        "the response reports the pool's usage: pre {pre} post {post}"
    );
    unstage_and_delete(&d, &id).await;
    d.stop().await;
    run("vgremove", &["-ff", "-y", "vg-reclaim"]);
}
