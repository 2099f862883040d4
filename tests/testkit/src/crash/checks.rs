//! The checks of a crash lifecycle and its replay after a kill, shared by tests/crash.rs
//! and tests/crash_vm.rs (part of crash.rs, the crash kit).

use std::path::Path;
use std::time::Duration;

use super::{Answer, Endpoints, SOURCE, Step, Volume, call, writable_within};

/// The data checks after a publish in a crash lifecycle: the round's first publish
/// writes `content` (synced) and the unsynced file; every later one must read `content`
/// back, and a copy (`which` not SOURCE) must hold what [`check_copy`] says.
pub fn after_publish(v: &Volume, first: bool, which: usize, content: &[u8]) -> Result<(), String> {
    let file = v.target.join("data");
    if first {
        std::fs::write(&file, content).unwrap();
        std::fs::File::open(&file).unwrap().sync_all().unwrap();
        std::fs::File::open(&v.target).unwrap().sync_all().unwrap();
        // Not synced: in a snapshot only if the snapshot froze (flushed) the filesystem.
        std::fs::write(v.target.join(UNSYNCED), &content[..4096]).unwrap();
    } else {
        let back = std::fs::read(&file).map_err(|e| format!("{} lost its data: {e}", v.name))?;
        if back != content {
            return Err(format!("{} data differs", v.name));
        }
    }
    if which != SOURCE {
        check_copy(&v.target, &content[..4096]).map_err(|e| format!("{}: {e}", v.name))?;
    }
    Ok(())
}

/// A volume is formatted once, whatever was killed: the first filesystem UUID seen at
/// a stage is kept in `first`, and every later one must be the same. `Ok(true)` the
/// first time.
pub fn formatted_once(first: &mut Option<String>, now: String, name: &str) -> Result<bool, String> {
    match first {
        None => {
            *first = Some(now);
            Ok(true)
        }
        Some(seen) if *seen == now => Ok(false),
        Some(seen) => Err(format!(
            "{name} was formatted again: filesystem {seen}, now {now}"
        )),
    }
}

/// The checks every crash lifecycle makes after a step succeeded, but the stage's
/// (each test reads the filesystem's identity its own way): a publish writes or reads
/// back the data ([`after_publish`]; `publishes` counts them), a snapshot or clone
/// leaves the source as [`after_copy`] says, an unpublish removes the target.
pub fn after_step(
    step: Step,
    vols: &[Volume],
    which: usize,
    publishes: &mut usize,
    content: &[u8],
) -> Result<(), String> {
    let v = &vols[which];
    match step {
        Step::Publish => {
            *publishes += 1;
            after_publish(v, *publishes == 1, which, content)
        }
        Step::Snapshot | Step::Clone => after_copy(step, &vols[SOURCE].target),
        Step::Unpublish if v.target.exists() => Err(format!("unpublish leaves the target of {}", v.name)),
        _ => Ok(()),
    }
}

/// How a step's call is replayed after a kill: the codes kubelet and the sidecars retry
/// (ABORTED, UNAVAILABLE), every `pause`, for at most `deadline`.
pub struct Replay {
    pub deadline: Duration,
    pub pause: Duration,
}

/// The one replay loop of tests/crash.rs and tests/crash_vm.rs: sends the step's call
/// until it succeeds, as kubelet and external-provisioner would. A retryable code is
/// counted in `retryable` and tried again until the deadline; any other error fails the
/// test, named by `who` (seed, class) and explained by `details` (the daemon's log).
/// Returns the answer and the time from the first try.
pub async fn replay(
    endpoints: &Endpoints,
    step: Step,
    v: &Volume,
    policy: &Replay,
    retryable: &mut usize,
    who: &str,
    details: impl Fn() -> String,
) -> (Answer, Duration) {
    let started = std::time::Instant::now();
    loop {
        match call(endpoints, step, v).await {
            Ok(answer) => return (answer, started.elapsed()),
            Err(s) if matches!(s.code(), tonic::Code::Aborted | tonic::Code::Unavailable) => {
                *retryable += 1;
                assert!(
                    started.elapsed() < policy.deadline,
                    "{who}: {step:?} of {} still failing after {:?}: {s:?}",
                    v.name,
                    policy.deadline
                );
                tokio::time::sleep(policy.pause).await;
            }
            Err(s) => panic!(
                "{who}: {step:?} of {} failed: {:?} {}; {}",
                v.name,
                s.code(),
                s.message(),
                details()
            ),
        }
    }
}

/// Waits for a call the daemon was killed under: it ends one way or the other, and its
/// answer is not trusted.
pub async fn interrupted(inflight: tokio::task::JoinHandle<Result<Answer, tonic::Status>>) {
    let _ = tokio::time::timeout(Duration::from_secs(10), inflight)
        .await
        .expect("an interrupted call returns once the daemon is gone");
}

/// Written to the source at its first publish and not synced: a copy holds it only if
/// the copy froze (flushed) the filesystem first.
pub const UNSYNCED: &str = "unsynced";
/// Written to the source after the snapshot and the clone: no copy may hold it.
pub const AFTER: &str = "after";

/// After a snapshot or a clone of the published source at `target`: the filesystem
/// takes writes (it was thawed), and after the clone, [`AFTER`] is written.
pub fn after_copy(step: Step, target: &Path) -> Result<(), String> {
    if !writable_within(target, Duration::from_secs(20)) {
        return Err(format!("the source's filesystem stays frozen after {step:?}"));
    }
    if step == Step::Clone {
        std::fs::write(target.join(AFTER), b"after").map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// What a published copy must hold: the source's [`UNSYNCED`] bytes, and no [`AFTER`].
pub fn check_copy(target: &Path, unsynced: &[u8]) -> Result<(), String> {
    if std::fs::read(target.join(UNSYNCED)).unwrap_or_default() != unsynced {
        return Err(
            "what was written but not synced before the copy is missing: the filesystem was not frozen"
                .into(),
        );
    }
    if target.join(AFTER).exists() {
        return Err("it holds a file written after the copy".into());
    }
    Ok(())
}
