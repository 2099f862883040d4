//! The real binary SIGKILLed between and during steps, restarted, and the step
//! retried as a CO retries it.

use super::*;
use crate::old_bytes::dirty;
use localvol_testkit::process::{DaemonProcess, Output, Spawn};

/// The real `localvol` binary (tests/testkit/src/process.rs), in its own process group, so
/// that a kill takes its children (lvcreate, blkdiscard, mkfs) with it, as a
/// container's death does.
pub(super) struct Process {
    process: DaemonProcess,
    pub csi: Csi,
}

impl Process {
    pub async fn start(dir: &Path, config: &Path) -> Self {
        let spawn = Spawn::new(localvol_testkit::localvol_bin!(), dir, "vm-node").env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        );
        Self::spawn(spawn, dir, config).await
    }

    /// As [`Process::start`], logging everything (`RUST_LOG=debug`) to `log`.
    pub async fn start_logging(dir: &Path, config: &Path, log: &Path) -> Self {
        let spawn = Spawn::new(localvol_testkit::localvol_bin!(), dir, "vm-node")
            .env("RUST_LOG", "debug")
            .output(Output::AppendTo(log.to_path_buf()));
        Self::spawn(spawn, dir, config).await
    }

    async fn spawn(spawn: Spawn<'_>, dir: &Path, config: &Path) -> Self {
        let started = Instant::now();
        let mut process = spawn
            .args(["--config".as_ref(), config.as_os_str()])
            .own_group()
            .spawn();
        if let Err(e) = process
            .wait_ready(Duration::from_secs(120), Duration::from_millis(50))
            .await
        {
            panic!("localvol did not become ready: {e}");
        }
        let csi = Csi::at(&process.socket, dir).await;
        step_time("daemon", "process start to ready", started.elapsed());
        Self { process, csi }
    }

    /// SIGKILL to the daemon and everything it started.
    pub async fn kill(mut self) {
        self.process.kill().await;
    }
}

/// A config with only `class` of CONFIG (a restart then opens just that class).
pub(super) fn single_class_config(class: &str) -> PathBuf {
    let start = CONFIG.find(&format!("  - name: {class}\n")).unwrap();
    let rest = &CONFIG[start + 1..];
    let end = rest
        .find("\n  - name:")
        .map_or(CONFIG.len(), |i| start + 1 + i + 1);
    let yaml = format!("device-classes:\n{}", &CONFIG[start..end]);
    let path = Path::new(CONFIG_DIR).join(format!("{class}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    path
}

/// Retries a call the way a CO does while a killed call's leftovers settle.
async fn retried<T, F, Fut>(what: &str, mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    for attempt in 1.. {
        match call().await {
            Ok(v) => return v,
            Err(s)
                if attempt < 10
                    && matches!(
                        s.code(),
                        Code::Aborted | Code::Unavailable | Code::FailedPrecondition
                    ) =>
            {
                eprintln!(
                    "{what}: attempt {attempt}: {:?} {}; retrying",
                    s.code(),
                    s.message()
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(s) => panic!("{what}: {:?} {}", s.code(), s.message()),
        }
    }
    unreachable!()
}

/// A filesystem volume's whole life with the daemon SIGKILLed after every step; each
/// step is then repeated against the new daemon, which must accept it.
async fn restart_lifecycle(class: &str) {
    let dir = tempfile::Builder::new()
        .prefix("localvol-vm-restart-")
        .tempdir()
        .unwrap();
    let config = single_class_config(class);
    let name = format!("{class}-restart");
    let cap = mount_cap("ext4");
    let mut t = Steps::new(class);
    let mut p = Process::start(dir.path(), &config).await;
    macro_rules! step {
        ($label:expr, |$c:ident| $call:expr) => {{
            let first = {
                let $c = &p.csi;
                $call
                    .await
                    .unwrap_or_else(|s| panic!("{}: {:?} {}", $label, s.code(), s.message()))
            };
            p.kill().await;
            p = Process::start(dir.path(), &config).await;
            let again = {
                let $c = &p.csi;
                retried($label, || $call).await
            };
            t.done(concat!($label, " +kill+retry"));
            (first, again)
        }};
    }
    let (vol, again) = step!("create", |c| c.create(class, &name, 64 * MIB, &cap));
    assert_eq!(vol.volume_id, again.volume_id);
    assert_eq!(vol.capacity_bytes, again.capacity_bytes);
    let id = vol.volume_id.clone();
    step!("stage", |c| c.stage(&id, &name, &cap));
    step!("publish", |c| c.publish(&id, &name, &cap));
    std::fs::write(p.csi.target(&name).join("kept"), b"across restarts").unwrap();
    if class == "pmem" {
        let err = p.csi.expand_controller(&id, 128 * MIB).await.unwrap_err();
        assert_eq!(err.code(), Code::OutOfRange);
    } else {
        step!("expand controller", |c| c.expand_controller(&id, 128 * MIB));
        step!("expand node", |c| c.expand_node(&id, &name, 128 * MIB, &cap));
    }
    assert_eq!(
        std::fs::read(p.csi.target(&name).join("kept")).unwrap(),
        b"across restarts"
    );
    step!("unpublish", |c| c.unpublish(&id, &name));
    step!("unstage", |c| c.unstage(&id, &name));
    step!("delete", |c| c.delete(&id));
    assert!(
        leftovers(class, &name).is_empty(),
        "{class}: {:?}",
        leftovers(class, &name)
    );
    assert!(!p.csi.listed(&id).await);
    p.kill().await;
}

/// When to kill the daemon during a create.
#[derive(Clone, Copy, Debug)]
enum KillAt {
    /// A fixed time after the call was sent.
    After(Duration),
    /// As soon as the LV's device node or the namespace exists, before the create
    /// could finish (it still has to zero the volume and commit its record).
    Visible,
}

fn visible(class: &str, name: &str) -> bool {
    if class == "pmem" {
        sh("ndctl", &["list", "-N", "-r", REGION]).contains(&format!("\"name\":\"{name}\""))
    } else {
        Path::new("/dev").join(VG).join(name).exists()
    }
}

/// Kills the daemon (and its lvcreate/ndctl/blkdiscard) while a block volume is being
/// created; the retried create must finish a whole, zeroed volume.
async fn killed_during_create(class: &str) {
    let dir = tempfile::Builder::new()
        .prefix("localvol-vm-kill-")
        .tempdir()
        .unwrap();
    let config = single_class_config(class);
    let cap = block_cap();
    for kill_at in [KillAt::After(Duration::from_millis(300)), KillAt::Visible] {
        let mut t = Steps::new(class);
        let name = format!(
            "{class}-kill-{}",
            if matches!(kill_at, KillAt::Visible) {
                "visible"
            } else {
                "early"
            }
        );
        // Old bytes where the volume will likely be placed, so "reads zeros" means zeroed.
        dirty(class, 32 * MIB);
        let p = Process::start(dir.path(), &config).await;
        let socket = p.process.socket.clone();
        let (class_owned, name_owned) = (class.to_string(), name.clone());
        let dir_owned = dir.path().to_path_buf();
        let call = tokio::spawn(async move {
            let c = Csi::at(&socket, &dir_owned).await;
            c.create(&class_owned, &name_owned, 32 * MIB, &block_cap()).await
        });
        match kill_at {
            KillAt::After(delay) => tokio::time::sleep(delay).await,
            KillAt::Visible => {
                let started = Instant::now();
                while !visible(class, &name) {
                    assert!(
                        !call.is_finished(),
                        "{class}: the create finished before it could be seen"
                    );
                    assert!(
                        started.elapsed() < Duration::from_secs(120),
                        "{class}: {name} never appeared"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        p.kill().await;
        let outcome = call.await.unwrap();
        let state = match class {
            "pmem" => format!("namespaces {:?}", namespaces_named(&name).len()),
            _ => sh("lvs", &["--noheadings", "-o", "lv_name,lv_tags", VG])
                .lines()
                .filter(|l| l.contains(&name))
                .map(|l| l.trim().to_string())
                .collect::<Vec<_>>()
                .join("; "),
        };
        eprintln!(
            "killed {class} create ({kill_at:?}): the call {}; left: {state}",
            if outcome.is_ok() {
                "had returned"
            } else {
                "was cut off"
            }
        );
        let p = Process::start(dir.path(), &config).await;
        let vol = retried("create after kill", || p.csi.create(class, &name, 32 * MIB, &cap)).await;
        p.csi.stage(&vol.volume_id, &name, &cap).await.unwrap();
        p.csi.publish(&vol.volume_id, &name, &cap).await.unwrap();
        let bytes = read_all(&p.csi.target(&name));
        assert_eq!(bytes.len() as u64, vol.capacity_bytes as u64);
        assert!(
            bytes.iter().all(|b| *b == 0),
            "{class}: the finished volume reads zeros"
        );
        p.csi.unpublish(&vol.volume_id, &name).await.unwrap();
        p.csi.unstage(&vol.volume_id, &name).await.unwrap();
        p.csi.delete(&vol.volume_id).await.unwrap();
        assert!(leftovers(class, &name).is_empty());
        if class != "pmem" {
            let zeroing: Vec<_> = sh("lvs", &["--noheadings", "-o", "lv_name,lv_tags", VG])
                .lines()
                .filter(|l| l.contains("state=zeroing") || l.contains("zeroing-for"))
                .map(str::to_string)
                .collect();
            assert!(zeroing.is_empty(), "{zeroing:?}");
        }
        t.done(&format!("kill in create ({kill_at:?}), retry"));
        p.kill().await;
    }
}

/// The classes of CONFIG whose whole lifecycle can be killed and retried step by step.
const RESTART_CLASSES: [&str; 4] = ["thick", "thin", "pmem", "pmem-lvm"];

/// The classes to kill step by step: the plan's `vm.restart` (CI: one class of each
/// backend), each one of [`RESTART_CLASSES`].
fn restart_classes() -> Vec<String> {
    let classes = localvol_testkit::plan::classes("vm.restart");
    for class in &classes {
        assert!(
            RESTART_CLASSES.contains(&class.as_str()),
            "vm.restart: class {class:?} is not one of {RESTART_CLASSES:?}"
        );
    }
    classes
}

pub async fn restarts_between_and_during_steps() {
    for class in restart_classes() {
        restart_lifecycle(&class).await;
    }
    killed_during_create("thick").await;
    killed_during_create("pmem").await;
}
