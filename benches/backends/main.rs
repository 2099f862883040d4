//! `bench/run` runs this in the tests/vm guest (device-mapper and an emulated NVDIMM,
//! which the host lacks): one volume's lifecycle on LVM thick, LVM thin and PMEM
//! (fsdax, `mode: direct`) through the daemon's socket, against the same tools run
//! directly, measured in one run and reported as ratios, with the tool calls each side
//! made. Then the daemon's idle LVM command rate (only capacity polls), with no volume
//! and with 100 thin ones, against TopoLVM's figure at 100 volumes. Results print as a
//! table and go to `target/bench/backends.json`.
//!
//! `-- --only-thin-fill` runs instead the costs as an lvm-thin class fills (issue 47):
//! GetCapacity, CreateVolume and NodeGetVolumeStats at `fill::FILL_VOLUMES` thin LVs against
//! the empty pool's, beside raw lvcreates at the same fill, memory per volume, start-up
//! with them all, and the idle LVM command rate there (`bench/run --thin-fill`).
//!
//! It takes the guest's /dev/vda, /dev/vdb and region0 for itself: it refuses to run
//! anywhere else (`VMTEST_GUEST=1` is set by tests/vm/run.sh).

use std::path::{Path, PathBuf};
use std::time::Duration;

use localvol::backend::pmem::ndctl;
use serde_json::json;

mod fill;

use localvol_testkit::bench as harness;
use localvol_testkit::guest;
use localvol_testkit::process::DaemonProcess;

use harness::{
    Launch, StepClock, VOLUME_BYTES, lifecycle, ms, percentile, raw_mounts, start_daemon, step_p50,
};

const VG: &str = "benchvg";
const POOL: &str = "pool0";

const CONFIG: &str = "\
device-classes:
  - name: thick
    kind: lvm
    volume-group: benchvg
    spare-gb: 0
    default: true
  - name: thin
    kind: lvm-thin
    volume-group: benchvg
    thin-pool: {name: pool0, overprovision-ratio: 2.0}
  - name: pmem
    kind: pmem
    mode: direct
    region: region0
";

/// Thin volumes held while the idle rate is measured: TopoLVM runs about 40 LVM
/// commands a minute at this many (its issue #1221), the anchor of the comparison.
const IDLE_VOLUMES: usize = 100;
const TOPOLVM_IDLE_PER_MINUTE: f64 = 40.0;
/// localvol's own target, whatever the number of volumes.
const IDLE_TARGET_PER_MINUTE: f64 = 2.0;

/// The device classes measured, as named in [`CONFIG`].
const CLASSES: [&str; 3] = ["thick", "thin", "pmem"];

/// Fresh storage (tests/testkit/src/guest.rs): a VG on both disks with a zeroing thin pool,
/// and region0 emptied.
fn prepare_storage() {
    guest::volume_group(VG, &["/dev/vda", "/dev/vdb"]);
    guest::thin_pool(VG, POOL, "1G", true);
    guest::reset_region();
}

/// The region's alignment as the daemon uses it: its `align`, at least fsdax's.
fn region_align() -> u64 {
    guest::region()["align"]
        .as_u64()
        .unwrap_or(0)
        .max(ndctl::FSDAX_ALIGN)
}

/// The tools a person would run for the same new volume, and nothing else (no blkid:
/// the volume is known to be new), split as the CSI calls split the work. Returns each step's time and the programs run.
async fn raw_lifecycle(class: &str, base: &Path, name: &str) -> ([Duration; 6], Vec<String>) {
    let stage = base.join(format!("{name}-stage"));
    let target = base.join(format!("{name}-target"));
    std::fs::create_dir_all(&stage).unwrap();
    let mut tools = harness::RawTools::default();
    let size = format!("{VOLUME_BYTES}b");
    let lv = format!("{VG}/{name}");
    let mut clock = StepClock::start();
    let (device, namespace) = match class {
        "thick" => {
            tools
                .run("lvcreate", &["-y", "-n", name, "-L", &size, "-Wy", "-Zy", VG])
                .await;
            (format!("/dev/{lv}"), None)
        }
        "thin" => {
            tools
                .run(
                    "lvcreate",
                    &["-y", "-n", name, "-V", &size, "--thinpool", POOL, VG],
                )
                .await;
            (format!("/dev/{lv}"), None)
        }
        "pmem" => {
            let raw = ndctl::raw_for_usable(VOLUME_BYTES as u64, region_align()).to_string();
            let args = guest::fsdax_namespace_args(&raw, name);
            let out = tools
                .run("ndctl", &args.iter().map(String::as_str).collect::<Vec<_>>())
                .await;
            let ns = ndctl::parse_namespace(out.as_bytes()).unwrap();
            (
                format!("/dev/{}", ns.blockdev.expect("a block device")),
                Some(ns.dev),
            )
        }
        other => panic!("unknown class {other}"),
    };
    clock.lap();
    let mut mkfs = vec!["-F", "-q", "-E"];
    mkfs.push(match class {
        // As the daemon formats a thin LV with nothing mapped yet.
        "thin" => "lazy_itable_init=1,lazy_journal_init=1,assume_storage_prezeroed=1",
        _ => "lazy_itable_init=1,lazy_journal_init=1",
    });
    if namespace.is_some() {
        mkfs.extend(["-b", "4096"]);
    }
    mkfs.push(&device);
    tools.run("mkfs.ext4", &mkfs).await;
    let dax = namespace.is_some().then_some("dax");
    raw_mounts(&mut clock, &device, &stage, &target, dax).await;
    clock.lap();
    match namespace {
        Some(ns) => tools.run("ndctl", &["destroy-namespace", "-f", &ns]).await,
        None => tools.run("lvremove", &["-y", &lv]).await,
    };
    clock.lap();
    std::fs::remove_dir(&stage).unwrap();
    (clock.steps, tools.programs)
}

/// One class's results.
struct ClassResult {
    class: &'static str,
    ours: Vec<[Duration; 6]>,
    raw: Vec<[Duration; 6]>,
    /// Programs run per lifecycle (the last round's).
    ours_programs: Vec<String>,
    raw_programs: Vec<String>,
}

/// Whether `program` is one of LVM's (or device-mapper's, under it).
fn is_lvm(program: &str) -> bool {
    program == "lvm" || program == "dmsetup" || ["lv", "vg", "pv"].iter().any(|p| program.starts_with(p))
}

/// How often an idle node is asked for each class's capacity in the idle windows:
/// external-provisioner polls GetCapacity once a minute per class; this is six times
/// that, so that a cache which did not hold would show.
const CAPACITY_POLL: Duration = Duration::from_secs(10);

/// The LVM programs the daemon runs in `window` while only GetCapacity of every class
/// is asked (every [`CAPACITY_POLL`]), and their rate per minute.
async fn idle_lvm_commands(
    daemon: &DaemonProcess,
    csi: &mut harness::Csi,
    classes: &[&str],
    window: Duration,
) -> (f64, Vec<String>) {
    let before = daemon.commands_run().len();
    let start = std::time::Instant::now();
    while start.elapsed() < window {
        for class in classes {
            csi.capacity_of(class).await;
        }
        tokio::time::sleep(CAPACITY_POLL.min(window.saturating_sub(start.elapsed()))).await;
    }
    let mut programs = daemon.commands_run().split_off(before);
    programs.retain(|p| is_lvm(p));
    (programs.len() as f64 * 60.0 / window.as_secs_f64(), programs)
}

fn total_p50(runs: &[[Duration; 6]]) -> Duration {
    let mut totals: Vec<Duration> = runs.iter().map(|r| r.iter().sum()).collect();
    totals.sort();
    percentile(&totals, 0.5)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::var("VMTEST_GUEST").as_deref() != Ok("1") || !nix::unistd::geteuid().is_root() {
        eprintln!(
            "the backends bench takes /dev/vda, /dev/vdb and region0 for itself: run it through bench/run \
             (in the tests/vm guest)"
        );
        std::process::exit(1);
    }
    let quick = std::env::args().any(|a| a == "--quick");
    if std::env::args().any(|a| a == "--only-thin-fill") {
        return fill::thin_fill(quick).await;
    }
    let rounds = if quick { 2 } else { 5 };
    prepare_storage();
    let base = tempfile::Builder::new()
        .prefix("localvol-bench-")
        .tempdir()
        .unwrap();
    let config = base.path().join("config.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let (mut daemon, _) = start_daemon(
        localvol_testkit::localvol_bin!(),
        &base.path().join("daemon"),
        Launch {
            args: &["--kube", "off", "--config", config.to_str().unwrap()],
            log_commands: true,
            ..Launch::default()
        },
    )
    .await;
    let channel = localvol::csi::socket::connect(&daemon.socket).await.unwrap();
    // Below the daemon's kubelet root (its data directory here): stage and publish
    // paths are confined there.
    let work: PathBuf = daemon.dir.join("work");
    std::fs::create_dir_all(&work).unwrap();

    let mut results = Vec::new();
    for class in CLASSES {
        // Ours and raw interleaved so both see the same machine noise; one warm-up each.
        lifecycle(channel.clone(), &work, &format!("{class}-warm"), Some(class)).await;
        raw_lifecycle(class, &work, &format!("{class}-rawwarm")).await;
        let mut result = ClassResult {
            class,
            ours: Vec::new(),
            raw: Vec::new(),
            ours_programs: Vec::new(),
            raw_programs: Vec::new(),
        };
        for i in 0..rounds {
            let before = daemon.commands_run().len();
            let steps = lifecycle(channel.clone(), &work, &format!("{class}-{i}"), Some(class)).await;
            result.ours.push(steps);
            result.ours_programs = daemon.commands_run().split_off(before);
            let (steps, programs) = raw_lifecycle(class, &work, &format!("{class}-raw{i}")).await;
            result.raw.push(steps);
            result.raw_programs = programs;
        }
        results.push(result);
    }

    // Idle: only capacity polls for a window, first with no volume, then with
    // IDLE_VOLUMES thin ones. The window spans the report cache's lifetime (60 s) twice
    // at least.
    let window = Duration::from_secs(if quick { 130 } else { 300 });
    let mut csi = harness::Csi::new(channel.clone());
    let (rate_empty, programs_empty) = idle_lvm_commands(&daemon, &mut csi, &CLASSES, window).await;
    let mut ids = Vec::new();
    for i in 0..IDLE_VOLUMES {
        ids.push(csi.create(&format!("idle-{i}"), 16 << 20, Some("thin")).await);
    }
    let (rate_full, programs_full) = idle_lvm_commands(&daemon, &mut csi, &CLASSES, window).await;
    for id in &ids {
        csi.delete(id).await;
    }
    daemon.terminate().await;

    println!("\nlocalvol backends benchmark ({rounds} rounds; tests/vm guest, 64 MiB ext4)\n");
    println!(
        "{:<34} {:>11} {:>11} {:>7}",
        "measure (p50)", "localvol", "raw tools", "ratio"
    );
    let mut report = serde_json::Map::new();
    for r in &results {
        let (ours, raw) = (total_p50(&r.ours), total_p50(&r.raw));
        println!(
            "{:<34} {:>9.0}ms {:>9.0}ms {:>7.3}",
            format!("{} lifecycle", r.class),
            ms(ours),
            ms(raw),
            ms(ours) / ms(raw)
        );
        let mut steps = Vec::new();
        for (i, step) in harness::STEPS.iter().enumerate() {
            let (o, w) = (step_p50(&r.ours, i), step_p50(&r.raw, i));
            println!(
                "{:<34} {:>9.0}ms {:>9.0}ms {:>7.3}",
                format!("  {step}"),
                ms(o),
                ms(w),
                ms(o) / ms(w)
            );
            steps.push(json!({"step": step, "localvol_p50": ms(o), "raw_p50": ms(w)}));
        }
        println!("  tools, localvol: {}", harness::tally_line(&r.ours_programs));
        println!("  tools, raw:      {}", harness::tally_line(&r.raw_programs));
        report.insert(
            r.class.to_string(),
            json!({"localvol_p50_ms": ms(ours), "raw_p50_ms": ms(raw), "ratio": ms(ours) / ms(raw),
                   "steps": steps,
                   "localvol_programs": harness::tally(&r.ours_programs),
                   "raw_programs": harness::tally(&r.raw_programs)}),
        );
    }
    println!(
        "\nidle LVM commands per minute ({}s windows, GetCapacity of each class every {}s)\n",
        window.as_secs(),
        CAPACITY_POLL.as_secs()
    );
    println!(
        "{:<34} {:>11} {:>11} {:>7}",
        "measure", "localvol", "against", "ratio"
    );
    println!("{:<34} {:>11.2} {:>11} {:>7}", "no volume", rate_empty, "", "");
    for (against, other) in [
        ("no volume", rate_empty),
        (&format!("TopoLVM at {IDLE_VOLUMES}"), TOPOLVM_IDLE_PER_MINUTE),
        ("target", IDLE_TARGET_PER_MINUTE),
    ] {
        println!(
            "{:<34} {:>11.2} {:>11.2} {:>7.3}",
            format!("{IDLE_VOLUMES} volumes / {against}"),
            rate_full,
            other,
            rate_full / other.max(f64::MIN_POSITIVE)
        );
    }
    println!("  tools, no volume:   {}", harness::tally_line(&programs_empty));
    println!(
        "  tools, {IDLE_VOLUMES} volumes: {}",
        harness::tally_line(&programs_full)
    );
    report.insert(
        "idle_lvm".into(),
        json!({"window_s": window.as_secs(), "volumes": IDLE_VOLUMES,
               "per_minute_no_volume": rate_empty, "per_minute_with_volumes": rate_full,
               "topolvm_per_minute": TOPOLVM_IDLE_PER_MINUTE, "target_per_minute": IDLE_TARGET_PER_MINUTE,
               "programs_no_volume": harness::tally(&programs_empty),
               "programs_with_volumes": harness::tally(&programs_full)}),
    );
    report.insert("rounds".into(), json!(rounds));
    harness::write_report("backends.json", report);
}
