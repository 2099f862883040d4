//! What a call costs as the node fills up (issue 47): GetCapacity, CreateVolume and
//! NodeGetVolumeStats with thousands of volumes against the same calls on an empty
//! node, resident memory per volume, and start-up with every volume there. Raw block
//! volumes of 1 MiB: no mkfs, so what grows is only what localvol does per volume it
//! holds.

use std::path::Path;
use std::time::{Duration, Instant};

use localvol_testkit::CsiClient;
use localvol_testkit::bench::{Launch, MIB, ms, percentile, start_daemon};
use localvol_testkit::csi_client::{NewVolume, block_capability};
use serde_json::json;

/// The calls' medians with `volumes` on the node.
struct Mark {
    volumes: usize,
    capacity: Duration,
    /// The last 50 creates before the mark (for the empty node: the first 50).
    create: Duration,
    stats: Duration,
    rss_kib: u64,
    /// The same create done with the syscalls alone, in a directory holding as many
    /// entries as the class's: what the filesystem's own growth costs.
    raw_create: Duration,
}

pub struct Fill {
    empty: Mark,
    marks: Vec<Mark>,
    /// Start-up to a serving socket with the last mark's volumes.
    startup_full: Duration,
}

const CALLS: usize = 50;

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

async fn median_of<F: AsyncFnMut()>(mut call: F) -> Duration {
    let mut times = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let t = Instant::now();
        call().await;
        times.push(t.elapsed());
    }
    times.sort();
    percentile(&times, 0.5)
}

/// Fills a new node's default (loop) class to each of `marks` volumes, measuring at
/// the empty node and at each mark, then restarts the daemon on all of them.
pub async fn fill_the_node(base: &Path, marks: &[usize]) -> Fill {
    let dir = base.join("fill");
    let (mut daemon, _) = start_daemon(localvol_testkit::localvol_bin!(), &dir, Launch::default()).await;
    let channel = localvol::csi::socket::connect(&daemon.socket).await.unwrap();
    let csi = CsiClient::new(channel);
    let block = block_capability();
    let create = |name: String| {
        let (csi, block) = (csi.clone(), block.clone());
        async move {
            csi.create_id(
                NewVolume {
                    capability: block,
                    ..NewVolume::new(&name, MIB)
                }
                .request(),
            )
            .await
        }
    };
    // One published volume, whose stats kubelet would ask for every minute.
    let probe = create("probe".to_string()).await;
    let (staging, target) = (dir.join("probe-staging"), dir.join("probe-device"));
    std::fs::create_dir_all(&staging).unwrap();
    csi.stage(&probe, &staging, &block).await.unwrap();
    csi.publish(&probe, &staging, &target, &block).await.unwrap();

    // The raw floor's directory, on the same filesystem as the class's images.
    let class_dir = dir.join("data/loop/default");
    assert!(
        class_dir.is_dir(),
        "{} is the default class's directory",
        class_dir.display()
    );
    let floor = dir.join("raw-floor");
    std::fs::create_dir_all(&floor).unwrap();
    let mut made = 0usize;
    let measure = async |volumes: usize, made: &mut usize| {
        let mut creates = Vec::new();
        while *made < volumes.max(CALLS) {
            let t = Instant::now();
            create(format!("fill-{made}")).await;
            creates.push(t.elapsed());
            *made += 1;
        }
        let mut last = creates.split_off(creates.len().saturating_sub(CALLS));
        last.sort();
        Mark {
            volumes,
            create: percentile(&last, 0.5),
            capacity: median_of(async || {
                csi.capacity(None).await.unwrap();
            })
            .await,
            stats: median_of(async || {
                csi.stats(&probe, &target).await.unwrap();
            })
            .await,
            rss_kib: daemon.rss_kib(),
            raw_create: raw_floor(&class_dir, &floor),
        }
    };
    // The empty node's creates are its first 50; its calls are measured before them.
    let empty_capacity = median_of(async || {
        csi.capacity(None).await.unwrap();
    })
    .await;
    let empty_stats = median_of(async || {
        csi.stats(&probe, &target).await.unwrap();
    })
    .await;
    let empty_rss = daemon.rss_kib();
    let empty_raw = raw_floor(&class_dir, &floor);
    let first = measure(0, &mut made).await;
    let empty = Mark {
        volumes: 0,
        capacity: empty_capacity,
        stats: empty_stats,
        rss_kib: empty_rss,
        raw_create: empty_raw,
        ..first
    };
    let mut done = Vec::new();
    for &volumes in marks {
        done.push(measure(volumes, &mut made).await);
    }
    // Start-up with them all: the socket serves before anything is walked that need not be.
    daemon.terminate().await;
    let (mut again, startup_full) =
        start_daemon(localvol_testkit::localvol_bin!(), &dir, Launch::default()).await;
    let channel = localvol::csi::socket::connect(&again.socket).await.unwrap();
    let csi = CsiClient::new(channel);
    csi.unpublish(&probe, &target).await.unwrap();
    csi.unstage(&probe, &staging).await.unwrap();
    again.terminate().await;
    Fill {
        empty,
        marks: done,
        startup_full,
    }
}

impl Fill {
    /// The table; `idle_rss`, the daemon's own idle figure, where one was measured.
    pub fn print(&self, idle_rss: Option<u64>, startup_empty: Duration) {
        for mark in &self.marks {
            let n = mark.volumes;
            for (label, full, empty) in [
                (
                    format!("GetCapacity p50 ({n} volumes vs none)"),
                    mark.capacity,
                    self.empty.capacity,
                ),
                (
                    format!("CreateVolume p50 (the last 50 of {n} vs the first)"),
                    mark.create,
                    self.empty.create,
                ),
                (
                    format!("NodeGetVolumeStats p50 ({n} volumes vs none)"),
                    mark.stats,
                    self.empty.stats,
                ),
                (
                    format!("  raw create's syscalls ({n} entries vs none)"),
                    mark.raw_create,
                    self.empty.raw_create,
                ),
            ] {
                println!(
                    "{:<44} {:>10.3}ms {:>10.3}ms {:>8.3}",
                    label,
                    ms(full),
                    ms(empty),
                    ms(full) / ms(empty)
                );
            }
            println!(
                "{:<44} {:>10} KiB {:>9.2} KiB/volume",
                format!("RSS with {n} volumes"),
                mark.rss_kib,
                self.per_volume_kib(mark)
            );
        }
        if let Some(idle_rss) = idle_rss {
            println!("{:<44} {:>10} KiB", "RSS idle", idle_rss);
        }
        if let Some(last) = self.marks.last() {
            println!(
                "{:<44} {:>10.1}ms {:>10.1}ms {:>8.3}",
                format!("start-up with {} volumes (vs none)", last.volumes),
                ms(self.startup_full),
                ms(startup_empty),
                ms(self.startup_full) / ms(startup_empty)
            );
        }
    }

    fn per_volume_kib(&self, mark: &Mark) -> f64 {
        mark.rss_kib.saturating_sub(self.empty.rss_kib) as f64 / mark.volumes.max(1) as f64
    }

    pub fn report(&self, startup_empty: Duration) -> serde_json::Value {
        json!({
            "empty": {"get_capacity_p50_ms": ms(self.empty.capacity),
                      "create_p50_ms_first_50": ms(self.empty.create),
                      "stats_p50_ms": ms(self.empty.stats), "rss_kib": self.empty.rss_kib,
                      "raw_create_p50_ms": ms(self.empty.raw_create)},
            "marks": self.marks.iter().map(|m| json!({
                "volumes": m.volumes,
                "get_capacity_p50_ms": ms(m.capacity),
                "get_capacity_ratio": ms(m.capacity) / ms(self.empty.capacity),
                "create_p50_ms_last_50": ms(m.create),
                "create_ratio": ms(m.create) / ms(self.empty.create),
                "stats_p50_ms": ms(m.stats),
                "stats_ratio": ms(m.stats) / ms(self.empty.stats),
                "raw_create_p50_ms": ms(m.raw_create),
                "raw_create_ratio": ms(m.raw_create) / ms(self.empty.raw_create),
                "rss_kib": m.rss_kib,
                "rss_kib_per_volume": self.per_volume_kib(m),
            })).collect::<Vec<_>>(),
            "startup_ms_full": ms(self.startup_full),
            "startup_ms_empty": ms(startup_empty),
            "startup_ratio": ms(self.startup_full) / ms(startup_empty),
        })
    }
}
