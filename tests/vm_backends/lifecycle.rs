//! Each class's whole volume life, filesystem and raw block: create, stage, publish,
//! write and read, stats, expand online, unpublish, unstage, delete, nothing left.

use super::*;

/// create, stage, publish, write+read, stats, expand online, unpublish, unstage,
/// delete, and nothing left: for one filesystem volume.
async fn filesystem_lifecycle(c: &Csi, class: &str, fs: &str, size: u64, grown: u64) {
    let mut t = Steps::new(class);
    let name = format!("{class}-{fs}");
    let cap = mount_cap(fs);
    let vol = c.create(class, &name, size, &cap).await.unwrap();
    let id = vol.volume_id.clone();
    let got = vol.capacity_bytes as u64;
    assert!(got >= size && got < size + 16 * MIB, "{class}: {got} for {size}");
    t.done(&format!("create {fs}"));
    if class != "pmem" {
        let lv = leftovers(class, &name);
        assert_eq!(lv.len(), 1, "one LV tagged with the volume's name: {lv:?}");
    }
    c.stage(&id, &name, &cap).await.unwrap();
    t.done(&format!("stage {fs} (mkfs+mount)"));
    if class.starts_with("pmem") {
        let line = mount_options(&c.staging(&name));
        assert!(line.contains("dax"), "{class} mounts with -o dax: {line}");
    }
    c.publish(&id, &name, &cap).await.unwrap();
    t.done("publish");
    let file = c.target(&name).join("data");
    std::fs::write(&file, b"localvol vm suite").unwrap();
    assert_eq!(std::fs::read(&file).unwrap(), b"localvol vm suite");
    t.done("write+read");
    let before = c.stats_total(&id, &name).await;
    assert!(
        before > got / 2 && before <= got,
        "{class}: fs of {before} bytes on {got}"
    );
    t.done("stats");
    if class == "pmem" {
        let err = c.expand_controller(&id, grown).await.unwrap_err();
        assert_eq!(err.code(), Code::OutOfRange, "{}", err.message());
        assert!(err.message().contains("cannot grow"), "{}", err.message());
        let same = c.expand_controller(&id, got).await.unwrap();
        assert_eq!(same.capacity_bytes as u64, got);
        t.done("expand refused (fixed size)");
    } else {
        let expanded = c.expand_controller(&id, grown).await.unwrap();
        assert_eq!(expanded.capacity_bytes as u64, grown);
        assert!(expanded.node_expansion_required);
        t.done("expand controller (lvextend)");
        let device = c.expand_node(&id, &name, grown, &cap).await.unwrap();
        assert_eq!(device, grown);
        let after = c.stats_total(&id, &name).await;
        assert!(
            after > before + (grown - size) / 2,
            "{class} {fs} grew online: {before} -> {after}"
        );
        t.done("expand node (fs grow online)");
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"localvol vm suite");
    c.unpublish(&id, &name).await.unwrap();
    t.done("unpublish");
    c.unstage(&id, &name).await.unwrap();
    t.done("unstage");
    c.delete(&id).await.unwrap();
    t.done("delete");
    assert!(
        leftovers(class, &name).is_empty(),
        "{class}: {:?}",
        leftovers(class, &name)
    );
    assert!(!c.listed(&id).await);
    c.delete(&id).await.unwrap();
}

/// The same for a raw block volume: the device is published, written and read.
async fn block_lifecycle(c: &Csi, class: &str, size: u64, grown: u64) {
    let mut t = Steps::new(class);
    let name = format!("{class}-block");
    let cap = block_cap();
    let vol = c.create(class, &name, size, &cap).await.unwrap();
    let id = vol.volume_id.clone();
    let got = vol.capacity_bytes as u64;
    t.done("create block (zeroed)");
    c.stage(&id, &name, &cap).await.unwrap();
    c.publish(&id, &name, &cap).await.unwrap();
    t.done("stage+publish block");
    let dev = c.target(&name);
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(&dev).unwrap().file_type().is_block_device());
    assert_eq!(block_size(&dev), got, "{class}: the device is the volume's size");
    write_at(&dev, 0, &[0xC3; 4096]);
    write_at(&dev, got - 4096, &[0x3C; 4096]);
    let bytes = read_all(&dev);
    assert!(
        bytes[..4096].iter().all(|b| *b == 0xC3) && bytes[bytes.len() - 4096..].iter().all(|b| *b == 0x3C)
    );
    assert!(
        bytes[4096..bytes.len() - 4096].iter().all(|b| *b == 0),
        "{class}: a new block volume reads zeros"
    );
    t.done("write+read block");
    assert_eq!(c.stats_total(&id, &name).await, got);
    if class == "pmem" {
        let err = c.expand_controller(&id, grown).await.unwrap_err();
        assert_eq!(err.code(), Code::OutOfRange, "{}", err.message());
        // Media errors, as the kernel records them (the badblocks list the pmem driver
        // answers EIO from): the volume is abnormal. They go with the namespace.
        let disk = block_device_name(&dev);
        let sector = got / 512 / 2;
        std::fs::write(format!("/sys/block/{disk}/badblocks"), format!("{sector} 8")).unwrap();
        assert!(
            std::fs::File::open(&dev)
                .and_then(|mut f| {
                    f.seek(SeekFrom::Start(sector * 512))?;
                    f.read_exact(&mut [0u8; 512])
                })
                .is_err(),
            "a bad sector reads as an error"
        );
        let condition = c.client.stats(&id, &dev).await.unwrap().volume_condition.unwrap();
        assert!(condition.abnormal, "{condition:?}");
        assert!(
            condition.message.contains("has 8 bad sectors (media errors"),
            "{condition:?}"
        );
        t.done("media errors reported");
    } else {
        let expanded = c.expand_controller(&id, grown).await.unwrap();
        assert_eq!(expanded.capacity_bytes as u64, grown);
        assert!(!expanded.node_expansion_required, "an LV device grows by itself");
        assert_eq!(block_size(&dev), grown);
        let tail = read_all(&dev);
        assert!(
            tail[got as usize..].iter().all(|b| *b == 0),
            "{class}: the extension reads zeros"
        );
        assert_eq!(&tail[..4096], &[0xC3; 4096]);
        t.done(if class == "thin" {
            "expand block"
        } else {
            "expand block (pre-zeroed extents)"
        });
    }
    c.unpublish(&id, &name).await.unwrap();
    c.unstage(&id, &name).await.unwrap();
    c.delete(&id).await.unwrap();
    t.done("unpublish+unstage+delete");
    assert!(
        leftovers(class, &name).is_empty(),
        "{class}: {:?}",
        leftovers(class, &name)
    );
}

/// The kernel's name of the block device whose node is `dev` (`pmem0.1`).
fn block_device_name(dev: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let rdev = std::fs::metadata(dev).unwrap().rdev();
    let (major, minor) = (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev));
    let link = std::fs::read_link(format!("/sys/dev/block/{major}:{minor}")).unwrap();
    link.file_name().unwrap().to_string_lossy().into_owned()
}

/// ext4 and xfs filesystem volumes, then a block volume, in `class`; the xfs volume grows
/// to `xfs_grown` (pmem-lvm's VG is smaller than the others' disks).
async fn class_lifecycles(c: &Csi, class: &str, xfs_grown: u64) {
    filesystem_lifecycle(c, class, "ext4", 64 * MIB, 128 * MIB).await;
    filesystem_lifecycle(c, class, "xfs", 320 * MIB, xfs_grown).await;
    block_lifecycle(c, class, 16 * MIB, 32 * MIB).await;
}

pub async fn lvm_thick_lifecycle() {
    let d = daemon().await;
    let c = Csi::of(&d).await;
    class_lifecycles(&c, "thick", 480 * MIB).await;
    // Two stripes on two PVs; the extension is pre-zeroed on both.
    block_lifecycle(&c, "striped", 16 * MIB, 32 * MIB).await;
    d.stop().await;
}

pub async fn lvm_thin_lifecycle() {
    let d = daemon().await;
    class_lifecycles(&Csi::of(&d).await, "thin", 480 * MIB).await;
    d.stop().await;
}

pub async fn pmem_direct_lifecycle() {
    let d = daemon().await;
    class_lifecycles(&Csi::of(&d).await, "pmem", 480 * MIB).await;
    d.stop().await;
}

pub async fn pmem_lvm_lifecycle() {
    let d = daemon().await;
    class_lifecycles(&Csi::of(&d).await, "pmem-lvm", 400 * MIB).await;
    d.stop().await;
}
