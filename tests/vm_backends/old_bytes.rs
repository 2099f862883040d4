//! No bytes of a previous tenant: volumes made on storage full of old bytes read
//! zeros, thin pools zero new chunks, an old filesystem is never mounted.

use super::*;

/// `PV:first-last` extent ranges of an LV.
fn pe_ranges(vg: &str, lv: &str) -> Vec<(String, u64, u64)> {
    sh(
        "lvs",
        &[
            "--noheadings",
            "--segments",
            "-o",
            "seg_pe_ranges",
            &format!("{vg}/{lv}"),
        ],
    )
    .split_whitespace()
    .map(|r| {
        let (pv, extents) = r.rsplit_once(':').unwrap();
        let (a, b) = extents.split_once('-').unwrap();
        (pv.to_string(), a.parse().unwrap(), b.parse().unwrap())
    })
    .collect()
}

fn overlaps(a: &[(String, u64, u64)], b: &[(String, u64, u64)]) -> bool {
    a.iter()
        .any(|(pv, s, e)| b.iter().any(|(pv2, s2, e2)| pv == pv2 && s <= e2 && s2 <= e))
}

/// Leaves `OLD` bytes on storage the class will allocate next: an LV (or namespace)
/// made outside localvol, filled, and removed. Returns where it was.
pub(crate) fn dirty(class: &str, bytes: u64) -> Dirt {
    let fill = |dev: &str, n: u64| write_at(Path::new(dev), 0, &vec![OLD; n as usize]);
    if class == "pmem" {
        let raw = (bytes + 2 * MIB).div_ceil(16 * MIB) * 16 * MIB;
        let out = guest::fsdax_namespace(&raw.to_string(), "dirt");
        let dev = guest::json_field(&out, "dev");
        fill(
            &format!("/dev/{}", guest::json_field(&out, "blockdev")),
            fsdax_usable(raw),
        );
        let resource = namespace_resource(&dev);
        sh("ndctl", &["destroy-namespace", "-f", &dev]);
        return Dirt::Namespace(resource);
    }
    let vg = if class == "pmem-lvm" { PMEM_VG } else { VG };
    guest::plain_lv(vg, "dirt", &format!("{bytes}b"), &[]);
    fill(&format!("/dev/{vg}/dirt"), bytes);
    let ranges = pe_ranges(vg, "dirt");
    sh("lvremove", &["-q", "-y", &format!("{vg}/dirt")]);
    Dirt::Extents(ranges)
}

pub(crate) enum Dirt {
    Extents(Vec<(String, u64, u64)>),
    Namespace(String),
}

fn namespace_resource(dev: &str) -> String {
    std::fs::read_to_string(format!("/sys/bus/nd/devices/{dev}/resource"))
        .unwrap()
        .trim()
        .to_string()
}

/// Asserts the volume `name` sits on the dirtied storage (else the test proves nothing).
fn assert_on_dirt(class: &str, name: &str, dirt: &Dirt) {
    match dirt {
        Dirt::Extents(ranges) => {
            let vg = if class == "pmem-lvm" { PMEM_VG } else { VG };
            let lv = lvs_named(vg, name).pop().unwrap();
            let mine = pe_ranges(vg, &lv);
            assert!(
                overlaps(&mine, ranges),
                "{class}: {name} on {mine:?}, dirt was on {ranges:?}"
            );
        }
        Dirt::Namespace(resource) => {
            let ns = namespaces_named(name).pop().unwrap();
            let dev = ns["dev"].as_str().unwrap();
            assert_eq!(
                &namespace_resource(dev),
                resource,
                "{name} was placed where the dirt was"
            );
        }
    }
}

/// A raw block volume made on storage full of old bytes reads zeros everywhere, and
/// so does what an expansion adds.
async fn block_over_old_bytes(c: &Csi, class: &str) {
    let mut t = Steps::new(class);
    let name = format!("{class}-old-bytes");
    let cap = block_cap();
    let dirt = dirty(class, 16 * MIB);
    let vol = c.create(class, &name, 16 * MIB, &cap).await.unwrap();
    assert_on_dirt(class, &name, &dirt);
    c.stage(&vol.volume_id, &name, &cap).await.unwrap();
    c.publish(&vol.volume_id, &name, &cap).await.unwrap();
    let dev = c.target(&name);
    let size = vol.capacity_bytes as u64;
    assert!(
        read_all(&dev).iter().all(|b| *b == 0),
        "{class}: old bytes visible in a new volume"
    );
    t.done("new block volume on old bytes: zeros");
    if class != "pmem" {
        let dirt = dirty(class, 16 * MIB);
        c.expand_controller(&vol.volume_id, size + 16 * MIB)
            .await
            .unwrap();
        assert_on_dirt(class, &name, &dirt);
        let bytes = read_all(&dev);
        assert_eq!(bytes.len() as u64, size + 16 * MIB);
        assert!(
            bytes.iter().all(|b| *b == 0),
            "{class}: old bytes visible in the extension"
        );
        t.done("extension over old bytes: zeros");
    }
    c.unpublish(&vol.volume_id, &name).await.unwrap();
    c.unstage(&vol.volume_id, &name).await.unwrap();
    c.delete(&vol.volume_id).await.unwrap();
}

fn chunk_size(pool: &str) -> u64 {
    lvm_bytes("lvs", "chunk_size", &format!("{VG}/{pool}"))
}

/// Writes 4 KiB at the start of every pool chunk of a new 16 MiB thin device, then
/// returns the bytes of the device that were not written: what the pool provided.
fn unwritten_after_small_writes(dev: &Path, chunk: u64) -> Vec<u8> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dev)
        .unwrap();
    for offset in (0..16 * MIB).step_by(chunk as usize) {
        f.seek(SeekFrom::Start(offset)).unwrap();
        f.write_all(&[0x5A; 4096]).unwrap();
    }
    f.sync_all().unwrap();
    let bytes = read_all(dev);
    bytes
        .chunks(chunk as usize)
        .flat_map(|c| c[4096..].iter().copied())
        .collect()
}

/// Thin volumes rely on the pool zeroing newly provisioned chunks. A first tenant fills
/// all but a few chunks of the pool with old bytes and is deleted; a second one writes
/// 4 KiB into each of its chunks: most of them must be the first tenant's (there are
/// not enough never-used chunks), and the rest of every chunk must read zeros. The
/// same on the pool without zeroing, with plain lvm, is the control: old bytes show.
async fn thin_zeroing(c: &Csi) {
    let mut t = Steps::new("thin");
    let fill = |pool: &str| lvm_bytes("lvs", "lv_size", &format!("{VG}/{pool}")) - 4 * MIB;
    let chunk = chunk_size("pool1");
    let a = fill("pool1");
    sh(
        "lvcreate",
        &[
            "-q",
            "-y",
            "-n",
            "ctl-a",
            "-V",
            &format!("{a}b"),
            "--thinpool",
            "pool1",
            VG,
        ],
    );
    write_at(Path::new("/dev/vmvg/ctl-a"), 0, &vec![OLD; a as usize]);
    sh("lvremove", &["-q", "-y", "vmvg/ctl-a"]);
    sh(
        "lvcreate",
        &["-q", "-y", "-n", "ctl-b", "-V", "16M", "--thinpool", "pool1", VG],
    );
    let control = unwritten_after_small_writes(Path::new("/dev/vmvg/ctl-b"), chunk);
    sh("lvremove", &["-q", "-y", "vmvg/ctl-b"]);
    let stale = control.iter().filter(|b| **b == OLD).count();
    assert!(
        stale > control.len() / 2,
        "control: a pool without zeroing shows old bytes ({stale})"
    );
    eprintln!(
        "thin control (pool1, no zeroing): {stale} of {} unwritten bytes are old",
        control.len()
    );
    t.done("control: pool without zeroing leaks");

    let cap = block_cap();
    let chunk = chunk_size("pool0");
    let a = fill("pool0");
    for (name, size) in [("thin-tenant-a", a), ("thin-tenant-b", 16 * MIB)] {
        let vol = c.create("thin", name, size, &cap).await.unwrap();
        c.stage(&vol.volume_id, name, &cap).await.unwrap();
        c.publish(&vol.volume_id, name, &cap).await.unwrap();
        let dev = c.target(name);
        if size == a {
            write_at(&dev, 0, &vec![OLD; a as usize]);
        } else {
            let unwritten = unwritten_after_small_writes(&dev, chunk);
            let old = unwritten.iter().filter(|b| **b != 0).count();
            assert_eq!(old, 0, "thin: {old} bytes of a deleted volume visible");
        }
        c.unpublish(&vol.volume_id, name).await.unwrap();
        c.unstage(&vol.volume_id, name).await.unwrap();
        c.delete(&vol.volume_id).await.unwrap();
    }
    t.done("pool0 zeroes: no old bytes");
}

/// A filesystem volume on a region where an old filesystem was: never mounted.
async fn pmem_old_filesystem(c: &Csi) {
    let mut t = Steps::new("pmem");
    let out = guest::fsdax_namespace("80M", "dirt");
    let dev = guest::json_field(&out, "dev");
    let blockdev = format!("/dev/{}", guest::json_field(&out, "blockdev"));
    sh("mkfs.ext4", &["-q", "-b", "4096", &blockdev]);
    let mnt = Path::new(CONFIG_DIR).join("old-fs");
    std::fs::create_dir_all(&mnt).unwrap();
    sh("mount", &[&blockdev, mnt.to_str().unwrap()]);
    std::fs::write(mnt.join("previous-tenant"), b"secret").unwrap();
    sh("umount", &[mnt.to_str().unwrap()]);
    let dirt = Dirt::Namespace(namespace_resource(&dev));
    sh("ndctl", &["destroy-namespace", "-f", &dev]);

    let name = "pmem-old-fs";
    let cap = mount_cap("ext4");
    // The ndctl commands above ran beside the daemon. Once (a CI rehearsal, 2026-11-29)
    // the daemon's listing of the region around then did not parse ("did not match
    // any variant"; not reproduced, its cause not known), and it answered UNAVAILABLE
    // for the moments it keeps a failed listing. A CO retries UNAVAILABLE; so does
    // this test, for half a minute, saying so.
    let mut tries = 0;
    let vol = loop {
        match c.create("pmem", name, 78 * MIB, &cap).await {
            Err(e) if e.code() == Code::Unavailable && tries < 10 => {
                tries += 1;
                eprintln!("pmem: CreateVolume UNAVAILABLE, retried in 3 s: {}", e.message());
                tokio::time::sleep(std::time::Duration::from_secs(3)).await;
            }
            other => break other.unwrap(),
        }
    };
    assert_on_dirt("pmem", name, &dirt);
    c.stage(&vol.volume_id, name, &cap).await.unwrap();
    assert!(
        !c.staging(name).join("previous-tenant").exists(),
        "the old filesystem must not be what gets mounted"
    );
    c.unstage(&vol.volume_id, name).await.unwrap();
    c.delete(&vol.volume_id).await.unwrap();
    t.done("old filesystem wiped, new one made");
}

pub async fn no_bytes_of_a_previous_tenant() {
    let d = daemon().await;
    let c = Csi::of(&d).await;
    for class in ["thick", "pmem", "pmem-lvm"] {
        block_over_old_bytes(&c, class).await;
    }
    thin_zeroing(&c).await;
    pmem_old_filesystem(&c).await;
    d.stop().await;
}
