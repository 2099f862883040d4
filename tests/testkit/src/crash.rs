//! What a crash test needs beside a daemon to kill: a seeded random source, the CSI
//! (and csi-addons) calls of one lifecycle step, and how long each step usually takes
//! (to aim a kill inside a running call). Used by tests/crash.rs and tests/crash_vm.rs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use localvol::proto::csi::v1 as csi;
use localvol::proto::reclaimspace as rs;
use tonic::transport::Channel;

use crate::csi_client as req;

/// xorshift64*: tiny, deterministic, good enough to pick steps and delays.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    // An endless source, not an iterator: the crash tests call it as `rng.next()`.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A number from the environment, `default` when unset; anything else is a mistake.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// A hex seed (`0x` optional) from the environment, `default` when unset.
pub fn seed_from_env(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(s) => {
            let hex = s.trim_start_matches("0x");
            u64::from_str_radix(hex, 16).unwrap_or_else(|_| panic!("{name}={s:?}: hex"))
        }
        Err(_) => default,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    Create,
    Stage,
    Publish,
    /// csi-addons NodeReclaimSpace (FITRIM of the staged filesystem).
    Reclaim,
    ControllerExpand,
    NodeExpand,
    Unpublish,
    Unstage,
    Delete,
    /// CreateSnapshot of the volume `source` names, called `name`.
    Snapshot,
    /// CreateVolume from the snapshot `source` names.
    Restore,
    /// CreateVolume from the volume `source` names.
    Clone,
    DeleteSnapshot,
}

impl Step {
    pub fn key(self) -> &'static str {
        match self {
            Step::Create => "create",
            Step::Stage => "stage",
            Step::Publish => "publish",
            Step::Reclaim => "reclaim",
            Step::ControllerExpand => "controller-expand",
            Step::NodeExpand => "node-expand",
            Step::Unpublish => "unpublish",
            Step::Unstage => "unstage",
            Step::Delete => "delete",
            Step::Snapshot => "snapshot",
            Step::Restore => "restore",
            Step::Clone => "clone",
            Step::DeleteSnapshot => "delete-snapshot",
        }
    }
}

/// One volume of a lifecycle, as kubelet and external-provisioner know it.
#[derive(Clone)]
pub struct Volume {
    pub name: String,
    /// Empty until CreateVolume returned.
    pub id: String,
    pub cap: csi::VolumeCapability,
    pub staging: PathBuf,
    pub target: PathBuf,
    pub required_bytes: i64,
    pub grown_bytes: i64,
    /// For a snapshot, or a clone: the source volume's id; for a restore: the
    /// snapshot's id. `None` for a new empty volume.
    pub source: Option<String>,
}

/// The daemon's sockets.
#[derive(Clone)]
pub struct Endpoints {
    pub csi: Channel,
    /// The csi-addons socket, when the daemon serves one.
    pub addons: Option<Channel>,
}

pub fn mount_cap(fs: &str) -> csi::VolumeCapability {
    crate::csi_client::fs_capability(fs, &[])
}

/// What a step's call answered that the test checks: the new volume of a create, the
/// size an expansion reports.
#[derive(Debug, Default)]
pub struct Answer {
    /// The new volume's id (create, restore, clone) or the snapshot's (snapshot).
    pub volume_id: Option<String>,
    pub capacity_bytes: Option<i64>,
}

/// One CSI (or csi-addons) call of a step, as kubelet or a sidecar sends it.
pub async fn call(endpoints: &Endpoints, step: Step, v: &Volume) -> Result<Answer, tonic::Status> {
    let mut controller = csi::controller_client::ControllerClient::new(endpoints.csi.clone());
    let mut node = csi::node_client::NodeClient::new(endpoints.csi.clone());
    let mut answer = Answer::default();
    match step {
        Step::Create | Step::Restore | Step::Clone => {
            use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
            let source = |kind: fn(String) -> Type| {
                let id = v.source.clone().expect("a restore or a clone names its source");
                Some(csi::VolumeContentSource {
                    r#type: Some(kind(id)),
                })
            };
            let volume_content_source = match step {
                Step::Restore => source(|snapshot_id| Type::Snapshot(SnapshotSource { snapshot_id })),
                Step::Clone => source(|volume_id| Type::Volume(VolumeSource { volume_id })),
                _ => None,
            };
            let new = req::NewVolume {
                capability: v.cap.clone(),
                source: volume_content_source,
                ..req::NewVolume::new(&v.name, v.required_bytes)
            };
            let volume = controller
                .create_volume(new.request())
                .await?
                .into_inner()
                .volume
                .expect("CreateVolume answers a volume");
            answer.volume_id = Some(volume.volume_id);
            answer.capacity_bytes = Some(volume.capacity_bytes);
        }
        Step::Stage => {
            node.node_stage_volume(req::stage_request(&v.id, &v.staging, &v.cap))
                .await?;
        }
        Step::Publish => {
            node.node_publish_volume(req::publish_request(&v.id, &v.staging, &v.target, &v.cap))
                .await?;
        }
        Step::Reclaim => {
            let addons = endpoints
                .addons
                .clone()
                .expect("a Reclaim step needs the daemon's csi-addons socket");
            rs::reclaim_space_node_client::ReclaimSpaceNodeClient::new(addons)
                .node_reclaim_space(rs::NodeReclaimSpaceRequest {
                    volume_id: v.id.clone(),
                    staging_target_path: v.staging.display().to_string(),
                    ..Default::default()
                })
                .await?;
        }
        Step::ControllerExpand => {
            let grown = controller
                .controller_expand_volume(req::controller_expand_request(&v.id, v.grown_bytes))
                .await?
                .into_inner();
            answer.capacity_bytes = Some(grown.capacity_bytes);
        }
        Step::NodeExpand => {
            let grown = node
                .node_expand_volume(req::node_expand_request(
                    &v.id,
                    &v.target,
                    &v.staging,
                    v.grown_bytes,
                    &v.cap,
                ))
                .await?
                .into_inner();
            answer.capacity_bytes = Some(grown.capacity_bytes);
        }
        Step::Unpublish => {
            node.node_unpublish_volume(req::unpublish_request(&v.id, &v.target))
                .await?;
        }
        Step::Unstage => {
            node.node_unstage_volume(req::unstage_request(&v.id, &v.staging))
                .await?;
        }
        Step::Delete => {
            controller.delete_volume(req::delete_request(&v.id)).await?;
        }
        Step::Snapshot => {
            let source = v.source.as_deref().expect("a snapshot names its source");
            let snapshot = controller
                .create_snapshot(req::snapshot_request(&v.name, source))
                .await?
                .into_inner()
                .snapshot
                .expect("CreateSnapshot answers a snapshot");
            answer.volume_id = Some(snapshot.snapshot_id);
            answer.capacity_bytes = Some(snapshot.size_bytes);
        }
        Step::DeleteSnapshot => {
            controller
                .delete_snapshot(req::delete_snapshot_request(&v.id))
                .await?;
        }
    }
    Ok(answer)
}

/// How long each step took when it was not interrupted (a running average), so that a
/// kill can be aimed inside it.
pub struct Timings {
    averages: HashMap<Step, Duration>,
    first_guess: fn(Step) -> Duration,
}

impl Timings {
    pub fn new(first_guess: fn(Step) -> Duration) -> Self {
        Self {
            averages: HashMap::new(),
            first_guess,
        }
    }

    pub fn typical(&self, step: Step) -> Duration {
        self.averages
            .get(&step)
            .copied()
            .unwrap_or_else(|| (self.first_guess)(step))
    }

    pub fn record(&mut self, step: Step, took: Duration) {
        let avg = self.averages.entry(step).or_insert(took);
        *avg = (*avg * 3 + took) / 4;
    }

    /// `step 1.23s, ...` for the steps timed so far, for a closing note.
    pub fn summary(&self) -> String {
        let mut steps: Vec<_> = self.averages.iter().collect();
        steps.sort_by_key(|(step, _)| step.key());
        steps
            .iter()
            .map(|(step, took)| format!("{} {:.2}s", step.key(), took.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// SIGKILL to the process group `pgid` (a daemon started with `process_group(0)` and
/// every tool it runs).
pub fn kill_group(pgid: i32) {
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pgid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// Waits until no member of group `pgid` is left. Call it after reaping the group's
/// leader: an unreaped zombie still counts as a member.
pub async fn wait_group_gone(pgid: i32) {
    for _ in 0..1000 {
        if nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), None).is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "processes of group {pgid} survived SIGKILL for 10s: {:?}",
        group_members(pgid)
    );
}

/// The last `n` lines of a log file, for a failure message.
pub fn log_tail(path: &Path, n: usize) -> String {
    // Lossy: a killed writer may have cut a character in two.
    let bytes = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes);
    // Backtrace frames (RUST_BACKTRACE set by CI) would push the error itself out.
    let is_frame = |l: &&str| {
        let t = l.trim_start();
        t.starts_with("at ") || t.split_once(": ").is_some_and(|(n, _)| n.parse::<u32>().is_ok())
    };
    let lines: Vec<&str> = text.lines().filter(|l| !is_frame(l)).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Regular files below `dir`.
pub fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() {
            found.extend(files_below(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// The comm names of the processes in group `pgid` (from /proc/PID/stat, whose second
/// field is the name in parentheses and whose fifth is the process group).
pub fn group_members(pgid: i32) -> Vec<String> {
    let mut names = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return names;
    };
    for entry in entries.flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let rest: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        // rest: state, ppid, pgrp, ...
        if rest.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid) {
            names.push(stat[open + 1..close].to_string());
        }
    }
    names
}

/// A file written to the mounted filesystem `dir` within `limit`: false when the write
/// blocks, as on a filesystem left frozen (FIFREEZE) by an interrupted snapshot.
pub fn writable_within(dir: &Path, limit: Duration) -> bool {
    let probe = dir.join(".frozen-probe");
    let (done, wait) = std::sync::mpsc::channel();
    // A write to a frozen filesystem blocks until the thaw: left running on its thread.
    std::thread::spawn(move || {
        let ok = std::fs::write(&probe, b"probe").is_ok()
            && std::fs::File::open(&probe).and_then(|f| f.sync_all()).is_ok()
            && std::fs::remove_file(&probe).is_ok();
        let _ = done.send(ok);
    });
    wait.recv_timeout(limit).unwrap_or(false)
}

mod checks;
pub use checks::*;

/// The volumes of a lifecycle with copies, by index: the source, its snapshot, the
/// restore of the snapshot and the clone of the source.
pub const SOURCE: usize = 0;
pub const SNAP: usize = 1;
pub const RESTORE: usize = 2;
pub const CLONE: usize = 3;

/// `source` and its snapshot, restore and clone (`<name>-snap`, ...), each with the
/// kubelet paths `paths` gives its name. The restore asks for `restore_bytes` (more
/// than the snapshot holds: it is grown); the others for the source's size.
pub fn with_copies(
    source: Volume,
    restore_bytes: i64,
    mut paths: impl FnMut(&str) -> (PathBuf, PathBuf),
) -> Vec<Volume> {
    let mut copy = |suffix: &str, required_bytes: i64| {
        let name = format!("{}-{suffix}", source.name);
        let (staging, target) = paths(&name);
        Volume {
            name,
            staging,
            target,
            required_bytes,
            ..source.clone()
        }
    };
    let copies = [
        copy("snap", source.required_bytes),
        copy("restore", restore_bytes),
        copy("clone", source.required_bytes),
    ];
    let mut all = vec![source];
    all.extend(copies);
    all
}

/// The end of a volume's lifecycle: unpublished, unstaged, staged and published again
/// (its data checked), then gone.
pub const RESTAGE_AND_DELETE: [Step; 7] = [
    Step::Unpublish,
    Step::Unstage,
    Step::Stage,
    Step::Publish,
    Step::Unpublish,
    Step::Unstage,
    Step::Delete,
];

/// Steps on the volume `which`.
pub fn on(which: usize, steps: &[Step]) -> Vec<(Step, usize)> {
    steps.iter().map(|s| (*s, which)).collect()
}

/// The copy steps taken while the source is staged and published (the freeze path).
pub fn copies_while_staged() -> Vec<(Step, usize)> {
    vec![(Step::Snapshot, SNAP), (Step::Clone, CLONE)]
}

/// The copy steps after the source was deleted: the restore and the clone stand on
/// their own; each is staged, published (its data checked), and deleted, and the
/// snapshot is deleted between them.
pub fn copies_after_source() -> Vec<(Step, usize)> {
    let life = [
        Step::Stage,
        Step::Publish,
        Step::Unpublish,
        Step::Unstage,
        Step::Delete,
    ];
    let mut plan = vec![(Step::Restore, RESTORE)];
    plan.extend(on(RESTORE, &life));
    plan.push((Step::DeleteSnapshot, SNAP));
    plan.extend(on(CLONE, &life));
    plan
}

/// Names the source of the step's call from what the earlier steps answered.
pub fn name_source(vols: &mut [Volume], step: Step, which: usize) {
    vols[which].source = match step {
        Step::Snapshot | Step::Clone => Some(vols[SOURCE].id.clone()),
        Step::Restore => Some(vols[SNAP].id.clone()),
        _ => vols[which].source.take(),
    };
}
