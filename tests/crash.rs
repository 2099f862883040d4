//! Crash consistency (root): the real daemon binary is killed with SIGKILL at random
//! points of many volume lifecycles, restarted, and each interrupted call is replayed
//! the way kubelet and external-provisioner would (the same call again until it
//! succeeds; ABORTED and UNAVAILABLE are retryable, any other error fails the test).
//!
//! Each lifecycle: create → stage → publish → write data → controller expand → node
//! expand → unpublish → unstage → stage → publish → check data → unpublish → unstage →
//! delete. The daemon runs in its own process group and the whole group is killed, as
//! a container runtime kills a restarting container: a tool it was running (mkfs,
//! losetup, xfs_growfs) dies with it.
//!
//! Checked: written data survives every crash; the filesystem UUID seen at every stage
//! is the one of the first stage (no second mkfs); a volume is never attached to two
//! loop devices; at the end no loop device is backed by the test's files, nothing is
//! mounted below the test directory, and the data directory holds no file. The loop
//! class's ledger, which GetCapacity answers from: after a crash in any call that
//! changes what exists and that call's replay, it equals what a clean restart counts
//! from the storage; at each lifecycle's end it promises nothing.
//!
//! Seeded and reproducible: `LOCALVOL_CRASH_SEED` (default fixed; printed first),
//! `LOCALVOL_CRASH_ROUNDS` lifecycles (default sized for about a minute on two cores).
//! Soak: `LOCALVOL_CRASH_ROUNDS=500 cargo test --test crash -- --nocapture`.
//! `LOCALVOL_CRASH_KILL=process` kills the daemon alone instead of its process group,
//! so an interrupted tool (mkfs, losetup) runs on while the next daemon replays.

use localvol_testkit::crash as kit;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kit::{Endpoints, Rng, SOURCE, Step, Timings, Volume, env_or, files_below, on};
use localvol_testkit::process::{DaemonProcess, Output, Spawn};
use localvol_testkit::{Cleanup, assert_released, kubelet_paths, loops_under, privileged};
use tonic::transport::Channel;

const MIB: i64 = 1 << 20;
/// mkfs.xfs refuses filesystems below 300 MiB.
const SIZE: i64 = 320 * MIB;
const GROWN: i64 = 384 * MIB;
/// The class's `--loop-capacity` (8Gi). The test's disk must hold more (see
/// [`nothing_left_promised`]), so that GetCapacity answers the limit less what the
/// volumes and snapshots promise: a figure the pod's writes do not move.
const LIMIT: i64 = 8 << 30;
const DEFAULT_SEED: u64 = 0x10ca_1b01;
const DEFAULT_ROUNDS: usize = 48;
/// Every this many lifecycles also snapshot, restore and clone the volume.
const COPY_EVERY: usize = 4;
/// How long one step may keep failing with a retryable code before the test gives up.
const STEP_DEADLINE: Duration = Duration::from_secs(90);

/// The daemon's log, outside the test directory so that it survives a failure.
fn log_path(seed: u64) -> PathBuf {
    std::env::temp_dir().join(format!("localvol-crash-{seed:x}.log"))
}

/// The last lines of the daemon's log, for a failure message (the next run replaces
/// the file).
fn log_tail(seed: u64) -> String {
    kit::log_tail(&log_path(seed), 40)
}

/// The daemon binary (tests/testkit/src/process.rs) in its own process group, logging to
/// [`log_path`]; returns it once its socket answers, and a channel to it.
async fn start_daemon(dir: &Path, seed: u64) -> (DaemonProcess, Channel) {
    let mut process = Spawn::new(localvol_testkit::localvol_bin!(), dir, "crash")
        .standalone()
        .args(["--loop-capacity", "8Gi"])
        .env("RUST_LOG", "info")
        .output(Output::AppendTo(log_path(seed)))
        .own_group()
        .spawn();
    if let Err(e) = process
        .wait_for_socket(Duration::from_secs(30), Duration::from_millis(20))
        .await
    {
        panic!("{e}; see {}", log_path(seed).display());
    }
    let channel = process.channel().await;
    (process, channel)
}

/// The UUID of the filesystem on the one loop device backed by `data`, read from the
/// device itself (`blkid -p` bypasses blkid's cache).
fn filesystem_uuid(data: &Path) -> String {
    let loops = loops_under(data);
    assert_eq!(loops.len(), 1, "one volume, one loop device: {loops:?}");
    let out = std::process::Command::new("blkid")
        .args(["-p", "-s", "UUID", "-o", "value"])
        .arg(Path::new("/dev").join(&loops[0]))
        .output()
        .unwrap();
    let uuid = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(!uuid.is_empty(), "a staged volume has a filesystem UUID");
    uuid
}

#[derive(Default, Debug)]
struct Counts {
    lifecycles: usize,
    kills: usize,
    /// Kills that landed while the interrupted call was still running.
    inside_call: usize,
    replays: usize,
    retryable_errors: usize,
    /// Ledgers compared with a restart's count after a crash in a call that changes
    /// what exists.
    ledger_checks: usize,
}

/// Until a step has been timed: a guess at how long it takes.
fn first_guess(step: Step) -> Duration {
    match step {
        Step::Stage | Step::NodeExpand | Step::Snapshot | Step::Restore | Step::Clone => {
            Duration::from_millis(300)
        }
        _ => Duration::from_millis(10),
    }
}

struct Run {
    dir: PathBuf,
    seed: u64,
    rng: Rng,
    process: DaemonProcess,
    channel: Channel,
    counts: Counts,
    timings: Timings,
    /// Kill the daemon's whole process group (a container restart) or the daemon alone.
    kill_group: bool,
}

impl Run {
    fn endpoints(&self) -> Endpoints {
        Endpoints {
            csi: self.channel.clone(),
            addons: None,
        }
    }

    /// Runs `step`, killing the daemon after a random delay when `kill` is set, then
    /// replays the step against the restarted daemon until it succeeds.
    async fn step(&mut self, step: Step, v: &mut Volume, kill: bool) {
        if kill {
            // Uniform over 0..1.25x the step's usual duration: most kills land inside
            // the call (inside mkfs, losetup, growfs), some just after it returned.
            let window = self.timings.typical(step).as_micros() as u64 * 5 / 4;
            let delay = Duration::from_micros(self.rng.below(window.max(1000)));
            let endpoints = self.endpoints();
            let vol = v.clone();
            let inflight = tokio::spawn(async move { kit::call(&endpoints, step, &vol).await });
            tokio::time::sleep(delay).await;
            let was_running = !inflight.is_finished();
            if self.kill_group {
                self.process.kill().await;
                kit::wait_group_gone(self.process.pid).await;
            } else {
                self.process.kill_daemon_only().await;
            }
            self.counts.kills += 1;
            if was_running {
                self.counts.inside_call += 1;
            }
            kit::interrupted(inflight).await;
            let (process, channel) = start_daemon(&self.dir, self.seed).await;
            self.process = process;
            self.channel = channel;
            self.counts.replays += 1;
        }
        let policy = kit::Replay {
            deadline: STEP_DEADLINE,
            pause: Duration::from_millis(50),
        };
        let who = format!("seed {:#x}", self.seed);
        let details = || {
            format!(
                "daemon log {}, last lines:\n{}",
                log_path(self.seed).display(),
                log_tail(self.seed)
            )
        };
        let (answer, took) = kit::replay(
            &self.endpoints(),
            step,
            v,
            &policy,
            &mut self.counts.retryable_errors,
            &who,
            details,
        )
        .await;
        if !kill {
            self.timings.record(step, took);
        }
        match step {
            Step::Create | Step::Snapshot | Step::Restore | Step::Clone => {
                let id = answer.volume_id.unwrap();
                assert!(v.id.is_empty() || v.id == id, "{step:?} returned another id");
                v.id = id;
                assert_eq!(answer.capacity_bytes, Some(v.required_bytes), "{step:?}");
            }
            Step::ControllerExpand | Step::NodeExpand => {
                assert_eq!(answer.capacity_bytes, Some(GROWN), "{step:?}");
            }
            _ => {}
        }
        if kill && changes_promises(step) {
            self.ledger_is_the_storages(step).await;
        }
    }

    /// The class's ledger (what GetCapacity answers from) after a crash in `step` and
    /// its replay, against the one a clean restart counts from the storage alone.
    async fn ledger_is_the_storages(&mut self, step: Step) {
        let kept = capacity(&self.channel).await;
        self.process.terminate().await;
        let (process, channel) = start_daemon(&self.dir, self.seed).await;
        (self.process, self.channel) = (process, channel);
        let counted = capacity(&self.channel).await;
        self.counts.ledger_checks += 1;
        assert_eq!(
            kept, counted,
            "seed {:#x}: after a crash in {step:?} and its replay, GetCapacity said {kept}; \
             a restart counting the storage says {counted}",
            self.seed
        );
    }
}

/// Whether `step` changes what the class's volumes and snapshots promise.
fn changes_promises(step: Step) -> bool {
    matches!(
        step,
        Step::Create
            | Step::ControllerExpand
            | Step::Delete
            | Step::Snapshot
            | Step::Restore
            | Step::Clone
            | Step::DeleteSnapshot
    )
}

/// The default class's GetCapacity, in bytes.
async fn capacity(channel: &Channel) -> i64 {
    localvol_testkit::CsiClient::new(channel.clone())
        .capacity(None)
        .await
        .unwrap()
        .available_capacity
}

/// The check of a round's end: with nothing left, GetCapacity is the whole limit (no
/// promise or reservation leaked), which needs a disk with room beyond it.
async fn nothing_left_promised(channel: &Channel, seed: u64, round: usize) {
    assert_eq!(
        capacity(channel).await,
        LIMIT,
        "seed {seed:#x} round {round}: with every volume deleted GetCapacity is the class's limit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_points_loses_nothing() {
    if !privileged() {
        return;
    }
    let seed: u64 = std::env::var("LOCALVOL_CRASH_SEED")
        .ok()
        .map(|s| {
            let s = s.trim_start_matches("0x");
            u64::from_str_radix(s, 16).unwrap_or_else(|_| panic!("LOCALVOL_CRASH_SEED={s:?}: hex"))
        })
        .unwrap_or(DEFAULT_SEED);
    let rounds: usize = env_or("LOCALVOL_CRASH_ROUNDS", DEFAULT_ROUNDS);
    let kill_group = match std::env::var("LOCALVOL_CRASH_KILL").as_deref() {
        Err(_) | Ok("group") => true,
        Ok("process") => false,
        Ok(other) => panic!("LOCALVOL_CRASH_KILL={other:?}: group or process"),
    };
    eprintln!(
        "crash test: LOCALVOL_CRASH_SEED={seed:#x} LOCALVOL_CRASH_ROUNDS={rounds}, daemon log {}",
        log_path(seed).display()
    );
    let _ = std::fs::remove_file(log_path(seed));
    let ext4_grows = localvol_testkit::has_cap_sys_resource();
    if !ext4_grows {
        eprintln!(
            "NOTE: no CAP_SYS_RESOURCE: ext4 volumes skip the node-expand step (the kernel refuses \
             ext4 online resize); xfs volumes run it"
        );
    }

    let tmp = tempfile::Builder::new()
        .prefix("localvol-crash-")
        .tempdir()
        .unwrap();
    let dir = tmp.path().to_path_buf();
    let data = dir.join("data");
    let kubelet = dir.join("kubelet");
    let mut cleanup = Cleanup {
        mounts: Vec::new(),
        data: data.clone(),
    };
    let free = nix::sys::statvfs::statvfs(&dir).unwrap();
    let free = free.blocks_available() as u64 * free.fragment_size() as u64;
    assert!(
        free > LIMIT as u64 + (4 << 30),
        "the crash test needs {} GiB free under {} for its capacity checks; {} GiB are",
        (LIMIT >> 30) + 4,
        dir.display(),
        free >> 30
    );
    let (process, channel) = start_daemon(&dir, seed).await;
    let mut run = Run {
        dir: dir.clone(),
        seed,
        rng: Rng::new(seed),
        process,
        channel,
        counts: Counts::default(),
        timings: Timings::new(first_guess),
        kill_group,
    };
    let started = Instant::now();
    for round in 0..rounds {
        let fs = if run.rng.below(2) == 0 { "ext4" } else { "xfs" };
        let (staging, target) = kubelet_paths(&kubelet, &format!("pv-{round}"), &format!("pod-{round}"));
        cleanup.mounts.extend([staging.clone(), target.clone()]);
        let source = Volume {
            name: format!("pvc-crash-{round}"),
            id: String::new(),
            cap: kit::mount_cap(fs),
            staging,
            target,
            required_bytes: SIZE,
            grown_bytes: GROWN,
            source: None,
        };
        let mut vols = kit::with_copies(source, GROWN, |copy| {
            let paths = kubelet_paths(&kubelet, copy, &format!("pod-{copy}"));
            cleanup.mounts.extend([paths.0.clone(), paths.1.clone()]);
            paths
        });
        // Snapshots, restores and clones in every COPY_EVERY-th lifecycle: the run
        // stays about as long as before they existed.
        let copies = round % COPY_EVERY == 0;
        let mut plan = on(SOURCE, &[Step::Create, Step::Stage, Step::Publish]);
        if copies {
            plan.extend(kit::copies_while_staged());
        }
        plan.extend(on(SOURCE, &[Step::ControllerExpand, Step::NodeExpand]));
        plan.extend(on(SOURCE, &kit::RESTAGE_AND_DELETE));
        if copies {
            plan.extend(kit::copies_after_source());
        }
        if fs == "ext4" && !ext4_grows {
            plan.retain(|(s, _)| *s != Step::NodeExpand);
        }
        // One or two kills per lifecycle, at random steps.
        let kills: Vec<usize> = (0..1 + run.rng.below(2))
            .map(|_| run.rng.below(plan.len() as u64) as usize)
            .collect();
        let content: Vec<u8> = (0..64 * 1024)
            .map(|i| (i as u64 ^ seed ^ round as u64) as u8)
            .collect();
        let mut uuid: Option<String> = None;
        let mut publishes = 0;
        for (i, (step, which)) in plan.iter().copied().enumerate() {
            kit::name_source(&mut vols, step, which);
            run.step(step, &mut vols[which], kills.contains(&i)).await;
            let v = &vols[which];
            match step {
                Step::Stage => {
                    // A copy holds its source's filesystem: the same UUID.
                    if let Err(e) = kit::formatted_once(&mut uuid, filesystem_uuid(&data), &v.name) {
                        panic!("seed {seed:#x} (round {round}, {fs}): {e}");
                    }
                }
                _ => {
                    if let Err(e) = kit::after_step(step, &vols, which, &mut publishes, &content) {
                        panic!("seed {seed:#x} (round {round}): {e}");
                    }
                }
            }
        }
        assert_released(&dir, &data, &format!("seed {seed:#x} round {round}"));
        nothing_left_promised(&run.channel, seed, round).await;
        run.counts.lifecycles += 1;
    }
    let elapsed = started.elapsed();
    run.process.kill().await;
    kit::wait_group_gone(run.process.pid).await;
    let leftovers = files_below(&data);
    assert!(
        leftovers.is_empty(),
        "seed {seed:#x}: files left behind: {leftovers:?}"
    );
    assert_released(&dir, &data, &format!("seed {seed:#x}, at the end"));
    let c = &run.counts;
    eprintln!(
        "crash test: seed {seed:#x}: {} lifecycles, {} SIGKILLs ({} inside a running call), \
         {} replays recovered, {} retryable errors, {} ledgers as the storage counts, nothing \
         lost, in {:.1}s",
        c.lifecycles,
        c.kills,
        c.inside_call,
        c.replays,
        c.retryable_errors,
        c.ledger_checks,
        elapsed.as_secs_f64()
    );
    drop(cleanup);
}
