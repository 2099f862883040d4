//! The loop class's fill (issue 47; the fill itself is localvol_testkit::fill): its
//! floor is a raw create's syscalls in a directory as full as the class's.

use std::path::Path;
use std::time::{Duration, Instant};

use localvol_testkit::bench::{MIB, percentile};
use localvol_testkit::fill::{CALLS, Fill, FillOf, fill_the_node};

/// The syscalls of a loop class's raw block create, in `dir`: a new sparse image under
/// a temporary name, renamed into place, then a small record written to a temporary
/// file, fsynced, renamed, and the directory fsynced.
fn raw_create(dir: &Path, name: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let (tmp, image) = (
        dir.join(format!("{name}.img.tmp")),
        dir.join(format!("{name}.img")),
    );
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .unwrap();
    file.set_len(MIB.unsigned_abs()).unwrap();
    std::fs::rename(&tmp, &image).unwrap();
    let (tmp, record) = (
        dir.join(format!("{name}.json.tmp")),
        dir.join(format!("{name}.json")),
    );
    let mut file = std::fs::File::create(&tmp).unwrap();
    file.write_all(&[b' '; 240]).unwrap();
    file.sync_all().unwrap();
    std::fs::rename(&tmp, &record).unwrap();
    std::fs::File::open(dir).unwrap().sync_all().unwrap();
}

/// The median of [`CALLS`] raw creates in `floor`, topped up first to as many entries as
/// `class_dir` holds; the creates' files are removed after.
fn raw_floor(class_dir: &Path, floor: &Path) -> Duration {
    let entries = |d: &Path| std::fs::read_dir(d).unwrap().count();
    for i in entries(floor)..entries(class_dir) {
        std::fs::File::create(floor.join(format!("filler-{i}"))).unwrap();
    }
    let mut times = Vec::with_capacity(CALLS);
    for i in 0..CALLS {
        let t = Instant::now();
        raw_create(floor, &format!("raw-{i}"));
        times.push(t.elapsed());
    }
    for i in 0..CALLS {
        for ext in ["img", "json"] {
            std::fs::remove_file(floor.join(format!("raw-{i}.{ext}"))).unwrap();
        }
    }
    times.sort();
    percentile(&times, 0.5)
}

/// The default (loop) class filled to each of `marks` volumes of 1 MiB by the daemon
/// `bin`, in `base/dir`.
pub async fn fill_loop(base: &Path, dir: &str, bin: &Path, marks: &[usize]) -> Fill {
    let of = FillOf {
        bin: bin.to_path_buf(),
        dir: base.join(dir),
        args: &[],
        class: None,
        bytes: MIB,
        marks,
        floor: "raw create's syscalls",
    };
    fill_the_node(of, async |daemon_dir: &Path| {
        // The raw floor's directory, on the same filesystem as the class's images.
        let class_dir = daemon_dir.join("data/loop/default");
        assert!(
            class_dir.is_dir(),
            "{} is the default class's directory",
            class_dir.display()
        );
        let floor = daemon_dir.join("raw-floor");
        std::fs::create_dir_all(&floor).unwrap();
        raw_floor(&class_dir, &floor)
    })
    .await
}
