//! What a call costs as the node fills up (issue 47), for any device class:
//! GetCapacity, CreateVolume and NodeGetVolumeStats with many volumes against the same
//! calls on an empty node, resident memory per volume, and start-up with every volume
//! there. Raw block volumes, so no mkfs: what grows is only what localvol does per
//! volume it holds, beside a floor the caller measures (the same create done with the
//! raw syscalls or tools in storage as full as the class's). The loop class's fill is
//! benches/lifecycle's, lvm-thin's benches/backends' (in the tests/vm guest).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::CsiClient;
use crate::bench::{Launch, ms, percentile, start_daemon};
use crate::csi_client::{NewVolume, block_capability};

/// The calls' medians with `volumes` on the node.
pub struct Mark {
    volumes: usize,
    capacity: Duration,
    /// The last 50 creates before the mark (for the empty node: the first 50).
    create: Duration,
    stats: Duration,
    rss_kib: u64,
    /// The caller's floor: the same create done by the raw syscalls or tools in
    /// storage as full as the class's, what the storage's own growth costs.
    raw_create: Duration,
}

pub struct Fill {
    /// What the floor is, for the table.
    floor: &'static str,
    empty: Mark,
    marks: Vec<Mark>,
    /// Start-up to a serving socket with the last mark's volumes.
    startup_full: Duration,
}

/// Calls timed per figure.
pub const CALLS: usize = 50;

/// One fill: the daemon `bin` on `dir` with `args`, raw block volumes of `bytes` in
/// `class` (the default when `None`), measured at the empty node and at each of
/// `marks` volumes; `floor` names the caller's floor for the table.
pub struct FillOf<'a> {
    pub bin: PathBuf,
    pub dir: PathBuf,
    pub args: &'a [&'a str],
    pub class: Option<&'a str>,
    pub bytes: i64,
    pub marks: &'a [usize],
    pub floor: &'static str,
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

/// Fills a new node's class to each of `of.marks` volumes, measuring at the empty node
/// and at each mark (`floor` times the caller's raw create, given the daemon's
/// directory), then restarts the daemon on all of them.
pub async fn fill_the_node(of: FillOf<'_>, floor: impl AsyncFn(&Path) -> Duration) -> Fill {
    let FillOf {
        bin,
        dir,
        args,
        class,
        bytes,
        marks,
        floor: floor_name,
    } = of;
    let launch = || Launch {
        args,
        ..Launch::default()
    };
    let (mut daemon, _) = start_daemon(bin.clone(), &dir, launch()).await;
    let channel = localvol::csi::socket::connect(&daemon.socket).await.unwrap();
    let csi = CsiClient::new(channel);
    let block = block_capability();
    let create = |name: String| {
        let (csi, block) = (csi.clone(), block.clone());
        async move {
            csi.create_id(
                NewVolume {
                    capability: block,
                    class,
                    ..NewVolume::new(&name, bytes)
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

    let mut made = 0usize;
    // Creates until `volumes` (at least CALLS) exist: the last CALLS creates' median.
    let creates_to = async |volumes: usize, made: &mut usize| {
        let mut creates = Vec::new();
        while *made < volumes.max(CALLS) {
            let t = Instant::now();
            create(format!("fill-{made}")).await;
            creates.push(t.elapsed());
            *made += 1;
            // Progress for a fill that runs long (an hour of LVM under TCG).
            if made.is_multiple_of(100) {
                eprintln!(
                    "fill: {made} volumes, the last create {:.1} ms",
                    ms(creates[creates.len() - 1])
                );
            }
        }
        let mut last = creates.split_off(creates.len().saturating_sub(CALLS));
        last.sort();
        percentile(&last, 0.5)
    };
    // The calls' medians, the memory and the floor with `volumes` on the node.
    let calls_at = async |volumes: usize, create: Duration| Mark {
        volumes,
        create,
        capacity: median_of(async || {
            csi.capacity(class).await.unwrap();
        })
        .await,
        stats: median_of(async || {
            csi.stats(&probe, &target).await.unwrap();
        })
        .await,
        rss_kib: daemon.rss_kib(),
        raw_create: floor(&dir).await,
    };
    // The empty node's calls are measured before its creates, which are its first 50.
    let empty = calls_at(0, Duration::ZERO).await;
    let empty = Mark {
        create: creates_to(0, &mut made).await,
        ..empty
    };
    let mut done = Vec::new();
    for &volumes in marks {
        let create = creates_to(volumes, &mut made).await;
        done.push(calls_at(volumes, create).await);
    }
    // Start-up with them all: the socket serves before anything is walked that need not be.
    daemon.terminate().await;
    let (mut again, startup_full) = start_daemon(bin, &dir, launch()).await;
    let channel = localvol::csi::socket::connect(&again.socket).await.unwrap();
    let csi = CsiClient::new(channel);
    csi.unpublish(&probe, &target).await.unwrap();
    csi.unstage(&probe, &staging).await.unwrap();
    again.terminate().await;
    Fill {
        floor: floor_name,
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
                    format!("  {} ({n} vs none)", self.floor),
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

    /// The same calls' table for an earlier build's fill (`before`, same marks, same
    /// run) beside this one's: each figure and its ratio to its own empty node.
    pub fn print_beside(&self, before: &Fill) {
        println!(
            "{:<34} {:>10} {:>8} {:>10} {:>8}",
            "p50 (ratio to the empty node)", "before", "", "after", ""
        );
        let rows = |f: &Fill| {
            let mut rows = vec![(
                "GetCapacity, no volume".to_string(),
                f.empty.capacity,
                f.empty.capacity,
            )];
            rows.push(("CreateVolume, first 50".into(), f.empty.create, f.empty.create));
            for m in &f.marks {
                let n = m.volumes;
                rows.push((format!("GetCapacity, {n} volumes"), m.capacity, f.empty.capacity));
                rows.push((format!("CreateVolume, last 50 of {n}"), m.create, f.empty.create));
                rows.push((format!("NodeGetVolumeStats, {n} volumes"), m.stats, f.empty.stats));
                rows.push((
                    format!("  raw create, {n} entries"),
                    m.raw_create,
                    f.empty.raw_create,
                ));
            }
            rows
        };
        for ((label, b, b_empty), (_, a, a_empty)) in rows(before).into_iter().zip(rows(self)) {
            println!(
                "{label:<34} {:>8.3}ms {:>7.2}x {:>8.3}ms {:>7.2}x",
                ms(b),
                ms(b) / ms(b_empty),
                ms(a),
                ms(a) / ms(a_empty)
            );
        }
        for (b, a) in before.marks.iter().zip(&self.marks) {
            println!(
                "{:<34} {:>7}KiB {:>8} {:>7}KiB {:>8}",
                format!(
                    "RSS, {} volumes (none: b {}, a {})",
                    a.volumes, before.empty.rss_kib, self.empty.rss_kib
                ),
                b.rss_kib,
                "",
                a.rss_kib,
                ""
            );
        }
        println!(
            "{:<34} {:>8.1}ms {:>8} {:>8.1}ms",
            format!("start-up, {} volumes", self.marks.last().map_or(0, |m| m.volumes)),
            ms(before.startup_full),
            "",
            ms(self.startup_full)
        );
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
