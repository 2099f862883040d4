//! Creates that died midway, made by hand with the tools, finished by a retry.

use super::*;

/// The states a create leaves when it dies midway, made by hand with the tools before
/// the daemon starts: the volume does not exist yet, and the retried create finishes it.
pub async fn half_done_creates_are_finished_on_retry() {
    let cap = block_cap();
    // Thick: lvcreate done, zeroing not: the LV still has its state=zeroing tag.
    let thick = "crash-thick";
    guest::plain_lv(
        VG,
        thick,
        "16M",
        &[
            "localvol.csi.dev/class=thick",
            "localvol.csi.dev/name=crash-thick",
            "localvol.csi.dev/mode=block",
            "localvol.csi.dev/state=zeroing",
        ],
    );
    write_at(
        Path::new("/dev/vmvg/crash-thick"),
        0,
        &vec![OLD; 16 * MIB as usize],
    );
    // PMEM: the pending record written and the namespace made, not yet cleared.
    let pmem = "crash-pmem";
    let out = guest::fsdax_namespace("32M", pmem);
    write_at(
        Path::new(&format!("/dev/{}", guest::json_field(&out, "blockdev"))),
        0,
        &vec![OLD; 30 * MIB as usize],
    );
    let dir = tempfile::Builder::new().prefix("localvol-vm-").tempdir().unwrap();
    let records = dir.path().join("data/pmem/pmem");
    std::fs::create_dir_all(&records).unwrap();
    std::fs::write(
        records.join(format!("{pmem}.json")),
        format!(
            r#"{{"name":"{pmem}","size_bytes":{},"mode":"block","namespace":"{pmem}","pending":true}}"#,
            30 * MIB
        ),
    )
    .unwrap();

    let d = InProcessDaemon::start_with_config(dir, "vm-node", &config_path()).await;
    let c = Csi::of(&d).await;
    for (class, name, size) in [("thick", thick, 16 * MIB), ("pmem", pmem, 30 * MIB)] {
        let mut t = Steps::new(class);
        assert!(
            !c.listed(&format!("{class}.{name}")).await,
            "{class}: half done is not a volume"
        );
        let vol = c.create(class, name, size, &cap).await.unwrap();
        if class == "thick" {
            let tags = sh("lvs", &["--noheadings", "-o", "lv_tags", &format!("{VG}/{name}")]);
            assert!(!tags.contains("state=zeroing"), "{tags}");
        } else {
            assert_eq!(namespaces_named(name).len(), 1);
        }
        c.stage(&vol.volume_id, name, &cap).await.unwrap();
        c.publish(&vol.volume_id, name, &cap).await.unwrap();
        assert!(
            read_all(&c.target(name)).iter().all(|b| *b == 0),
            "{class}: old bytes"
        );
        c.unpublish(&vol.volume_id, name).await.unwrap();
        c.unstage(&vol.volume_id, name).await.unwrap();
        c.delete(&vol.volume_id).await.unwrap();
        assert!(leftovers(class, name).is_empty(), "{:?}", leftovers(class, name));
        t.done("half-done create finished by retry");
    }
    assert!(files_under(&records).is_empty(), "{:?}", files_under(&records));
    d.stop().await;
}
