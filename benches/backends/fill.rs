//! The thin fill (`-- --only-thin-fill`, issue 47): an lvm-thin class filled to
//! [`FILL_VOLUMES`] raw block LVs through localvol_testkit::fill, beside raw thin
//! lvcreates at the same fill, then the idle LVM command rate with them all.

use std::path::Path;
use std::time::Duration;

use localvol::backend::lvm::report::{REPORT_FIELDS, REPORT_FORMAT};
use localvol_testkit::bench::{Launch, ms, percentile, start_daemon};
use localvol_testkit::fill::{FillOf, fill_the_node};
use localvol_testkit::guest;

use super::{IDLE_TARGET_PER_MINUTE, POOL, VG, harness, idle_lvm_commands};

/// The thin fill's class alone: room in the pool's overprovisioning for every volume.
const FILL_CONFIG: &str = "\
device-classes:
  - name: thin
    kind: lvm-thin
    volume-group: benchvg
    default: true
    thin-pool: {name: pool0, overprovision-ratio: 16.0}
";
/// Issue 47's mark for lvm-thin in the guest.
pub const FILL_VOLUMES: usize = 1000;
/// One extent: raw block, no mkfs.
const FILL_BYTES: i64 = 4 << 20;
/// Raw lvcreates timed per floor (each is an LVM command under TCG: 0.4 to 2 s).
const FLOOR_CALLS: usize = 10;

/// The median of [`FLOOR_CALLS`] raw thin lvcreates of [`FILL_BYTES`] in the pool as it
/// is (removed again after): LVM's own cost at this fill.
fn raw_thin_floor() -> Duration {
    let size = format!("{FILL_BYTES}b");
    let mut times = Vec::with_capacity(FLOOR_CALLS);
    for i in 0..FLOOR_CALLS {
        let name = format!("raw-floor-{i}");
        let t = std::time::Instant::now();
        guest::sh(
            "lvcreate",
            &["-q", "-y", "-n", &name, "-V", &size, "--thinpool", POOL, VG],
        );
        times.push(t.elapsed());
    }
    for i in 0..FLOOR_CALLS {
        guest::sh("lvremove", &["-q", "-y", &format!("{VG}/raw-floor-{i}")]);
    }
    times.sort();
    percentile(&times, 0.5)
}

/// The median of three raw `lvs` of the VG with the daemon's fields: the one report of
/// the VG its start-up waits for.
fn raw_report_floor() -> Duration {
    let mut times: Vec<Duration> = (0..3)
        .map(|_| {
            let t = std::time::Instant::now();
            let args: Vec<&str> = REPORT_FORMAT
                .into_iter()
                .chain(["-o", REPORT_FIELDS, VG])
                .collect();
            guest::sh("lvs", &args);
            t.elapsed()
        })
        .collect();
    times.sort();
    percentile(&times, 0.5)
}

/// The thin class filled to [`FILL_VOLUMES`] (a tenth of it with `--quick`), then the
/// idle LVM command rate with them all. Prints the table; leaves the LVs to the guest's
/// end (removing them is as long as making them, and proves nothing here).
pub async fn thin_fill(quick: bool) {
    // A metadata area for a VG of a thousand tagged LVs: lvm's default (1 MiB, half of
    // it for each copy) holds some 700 of localvol's.
    guest::sh(
        "pvcreate",
        &["-q", "-y", "-ff", "--metadatasize", "16m", "/dev/vda", "/dev/vdb"],
    );
    guest::sh("vgcreate", &["-q", VG, "/dev/vda", "/dev/vdb"]);
    // And pool metadata for them: lvm sizes a 1 GiB pool's at 4 MiB, which refuses new
    // thin LVs at 75 % full, some 600 of them (measured).
    guest::sh(
        "lvcreate",
        &[
            "-q",
            "-y",
            "-T",
            &format!("{VG}/{POOL}"),
            "-L",
            "1G",
            "--poolmetadatasize",
            "64m",
            "-Zy",
        ],
    );
    let base = tempfile::Builder::new()
        .prefix("localvol-thin-fill-")
        .tempdir()
        .unwrap();
    let config = base.path().join("config.yaml");
    std::fs::write(&config, FILL_CONFIG).unwrap();
    let args = ["--kube", "off", "--config", config.to_str().unwrap()];
    let volumes = if quick { FILL_VOLUMES / 10 } else { FILL_VOLUMES };
    let marks = [volumes / 4, volumes];
    let of = FillOf {
        bin: localvol_testkit::localvol_bin!(),
        dir: base.path().join("daemon"),
        args: &args,
        class: Some("thin"),
        bytes: FILL_BYTES,
        marks: &marks,
        floor: "raw thin lvcreate",
    };
    // Start-up on the empty pool, the figure start-up with them all is set against.
    let startup = {
        let (mut daemon, took) = start_daemon(
            localvol_testkit::localvol_bin!(),
            &base.path().join("empty"),
            Launch {
                args: &args,
                ..Launch::default()
            },
        )
        .await;
        daemon.terminate().await;
        took
    };
    let report_empty = raw_report_floor();
    let fill = fill_the_node(of, async |_: &Path| raw_thin_floor()).await;
    println!("\nlocalvol as an lvm-thin class fills (tests/vm guest, {FILL_BYTES} B raw block volumes)\n");
    fill.print(None, startup);
    let report_full = raw_report_floor();
    println!(
        "{:<44} {:>10.1}ms {:>10.1}ms {:>8.3}",
        format!(
            "  raw lvs of the VG, {} volumes (vs none)",
            marks[marks.len() - 1]
        ),
        ms(report_full),
        ms(report_empty),
        ms(report_full) / ms(report_empty)
    );
    // Idle with them all, as the full bench measures it with 100.
    let (daemon, _) = start_daemon(
        localvol_testkit::localvol_bin!(),
        &base.path().join("daemon"),
        Launch {
            args: &args,
            log_commands: true,
            ..Launch::default()
        },
    )
    .await;
    let channel = localvol::csi::socket::connect(&daemon.socket).await.unwrap();
    let mut csi = harness::Csi::new(channel);
    let window = Duration::from_secs(if quick { 130 } else { 300 });
    let (rate, programs) = idle_lvm_commands(&daemon, &mut csi, &["thin"], window).await;
    println!(
        "{:<44} {:>10.2} {:>10.2} {:>8.3}",
        format!("idle LVM commands/min, {volumes} volumes (target)"),
        rate,
        IDLE_TARGET_PER_MINUTE,
        rate / IDLE_TARGET_PER_MINUTE
    );
    println!("  tools: {}", harness::tally_line(&programs));
}
