//! `cargo bench --bench lifecycle` (root): localvol against the raw tools and syscalls
//! doing the same work, measured in one run and reported as ratios, plus concurrency
//! scaling, resident memory and start-up time of the real daemon process.
//!
//! Results print as a table and go to `target/bench/lifecycle.json`.
//! `-- --quick` runs fewer iterations (for CI smoke runs). `-- --only-fill` runs the
//! costs as the node fills alone (printed, not written); with `--before BIN` also an
//! earlier build's daemon `BIN` through the same fill, beside it. `-- --only-publish` runs
//! publish+unpublish alone, in a loop of `LOCALVOL_BENCH_ROUNDS` (default 2000), and
//! prints its figures: the loop to profile the daemon's node calls against.

use std::path::Path;
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, MsFlags};
use serde_json::json;
use tonic::transport::Channel;

mod bare_server;
mod fill;
mod pod_api;

use localvol_testkit::bench as harness;

use harness::{
    Csi, Launch, STEPS, StepClock, VOLUME_BYTES, lifecycle, ms, percentile, raw_mounts, run, start_daemon,
    step_p50,
};

/// The same work with the same tools and syscalls, and nothing else: sparse file,
/// losetup, mkfs, mount, bind mount, unmounts, detach, unlink. (No blkid: the volume
/// is known to be new, as the daemon knows from its record.) Returns the time
/// of each step, split as the CSI calls split the work, and the programs run.
async fn raw_lifecycle(base: &Path, name: &str) -> ([Duration; 6], Vec<String>) {
    let image = base.join(format!("{name}.img"));
    let stage = base.join(format!("{name}-stage"));
    let target = base.join(format!("{name}-target"));
    std::fs::create_dir_all(&stage).unwrap();
    let mut tools = harness::RawTools::default();
    let mut clock = StepClock::start();
    std::fs::File::create(&image)
        .unwrap()
        .set_len(VOLUME_BYTES as u64)
        .unwrap();
    clock.lap();
    let image_arg = image.to_str().unwrap();
    let device = tools.run("losetup", &["--find", "--show", image_arg]).await;
    tools
        .run(
            "mkfs.ext4",
            &[
                "-F",
                "-q",
                "-E",
                "lazy_itable_init=1,lazy_journal_init=1",
                &device,
            ],
        )
        .await;
    raw_mounts(&mut clock, &device, &stage, &target, None).await;
    tools.run("losetup", &["--detach", &device]).await;
    clock.lap();
    std::fs::remove_file(&image).unwrap();
    clock.lap();
    std::fs::remove_dir(&stage).unwrap();
    (clock.steps, tools.programs)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if let Some(socket) = bare_server::requested() {
        bare_server::serve(&socket).await;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("lifecycle bench needs root (loop devices, mounts)");
        std::process::exit(1);
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds = if quick { 3 } else { 15 };
    let publish_rounds = if quick { 50 } else { 300 };
    let base = tempfile::Builder::new()
        .prefix("localvol-bench-")
        .tempdir()
        .unwrap();
    let mut report = serde_json::Map::new();

    // 5. Start-up to a serving socket (median of several starts).
    let mut starts = Vec::new();
    for i in 0..if quick { 3 } else { 7 } {
        let (mut d, took) = start_daemon(
            localvol_testkit::localvol_bin!(),
            &base.path().join(format!("start-{i}")),
            Launch::default(),
        )
        .await;
        starts.push(took);
        d.terminate().await;
    }
    starts.sort();
    let startup = percentile(&starts, 0.5);

    if std::env::args().any(|a| a == "--only-publish") {
        return only_publish(base.path()).await;
    }
    // The fill alone (section 4), printed, not written: the costs as the node fills.
    if std::env::args().any(|a| a == "--only-fill") {
        let marks: &[usize] = if quick { &[500] } else { &[500, 5000] };
        let this = localvol_testkit::localvol_bin!();
        let fill = fill::fill_loop(base.path(), "fill", &this, marks).await;
        fill.print(None, startup);
        // An earlier build's daemon through the same fill, in the same run.
        let args: Vec<String> = std::env::args().collect();
        if let Some(earlier) = args.iter().position(|a| a == "--before").map(|i| &args[i + 1]) {
            let before = fill::fill_loop(base.path(), "fill-before", Path::new(earlier), marks).await;
            println!("\nbefore: {earlier}; after: this build\n");
            fill.print_beside(&before);
        }
        return;
    }

    let (mut daemon, _) = start_daemon(
        localvol_testkit::localvol_bin!(),
        &base.path().join("main"),
        Launch {
            log_commands: true,
            ..Launch::default()
        },
    )
    .await;
    let idle_rss = daemon.rss_kib();
    let channel = localvol::csi::socket::connect(&daemon.socket).await.unwrap();
    let work = daemon.dir.join("work");
    std::fs::create_dir_all(&work).unwrap();

    // 1. Lifecycle: ours and raw interleaved so both see the same machine noise.
    let (mut ours, mut raw) = (Vec::new(), Vec::new());
    let (mut ours_steps, mut raw_steps) = (Vec::new(), Vec::new());
    lifecycle(channel.clone(), &work, "warmup", None).await;
    raw_lifecycle(&work, "warmup-raw").await;
    let (mut ours_programs, mut raw_programs) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let before = daemon.commands_run().len();
        let steps = lifecycle(channel.clone(), &work, &format!("life-{i}"), None).await;
        ours_programs = daemon.commands_run().split_off(before);
        ours.push(steps.iter().sum::<Duration>());
        ours_steps.push(steps);
        let (steps, programs) = raw_lifecycle(&work, &format!("raw-{i}")).await;
        raw_programs = programs;
        raw.push(steps.iter().sum::<Duration>());
        raw_steps.push(steps);
    }
    ours.sort();
    raw.sort();
    let (ours_p50, raw_p50) = (percentile(&ours, 0.5), percentile(&raw, 0.5));

    // 2. Publish/unpublish of a staged volume against a bare bind mount.
    let steps: Vec<_> = (0..STEPS.len())
        .map(|i| (STEPS[i], step_p50(&ours_steps, i), step_p50(&raw_steps, i)))
        .collect();
    let latency = publish_latency(channel.clone(), &work, publish_rounds).await;
    let (empty_ours, empty_bare) = empty_calls(channel.clone(), &work, publish_rounds * 4).await;

    // 3. Throughput of concurrent lifecycles.
    let mut scaling = Vec::new();
    let total = if quick { 16 } else { 64 };
    for concurrency in [1usize, 8, 32, 64] {
        // `concurrency` lifecycles in flight at all times, as kubelet starts pods as
        // they come (not in batches that wait for their slowest member).
        let t = Instant::now();
        let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let workers: Vec<_> = (0..concurrency)
            .map(|_| {
                let (channel, work, next) = (channel.clone(), work.clone(), next.clone());
                tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        if i >= total {
                            break;
                        }
                        lifecycle(channel.clone(), &work, &format!("c{concurrency}-{i}"), None).await;
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.await.unwrap();
        }
        scaling.push((concurrency, total as f64 / t.elapsed().as_secs_f64()));
    }

    // 4. Costs as the node fills: GetCapacity and CreateVolume (the last 50 creates
    // before each mark) with 500 and 5,000 volumes against the same calls on an empty
    // node, resident memory per volume, and start-up with them all (raw block, 1 MiB:
    // no mkfs, so what grows is only what localvol does per volume it holds).
    daemon.terminate().await;
    let fills: &[usize] = if quick { &[500] } else { &[500, 5000] };
    let fill = fill::fill_loop(base.path(), "fill", &localvol_testkit::localvol_bin!(), fills).await;

    // 4b. Resident memory with the Kubernetes caches on: no pods, then 110 pods on the
    // node (kubelet's default maximum), each served by a mock API server.
    let mut rss_kube = Vec::new();
    for pods in [0usize, 110] {
        let dir = base.path().join(format!("kube-{pods}"));
        std::fs::create_dir_all(&dir).unwrap();
        let api = pod_api::PodApi::start(&dir, "bench", pods).await;
        let (mut daemon, _) = start_daemon(
            localvol_testkit::localvol_bin!(),
            &dir,
            Launch {
                args: &["--kube", "on"],
                kubeconfig: Some(&api.kubeconfig),
                ..Launch::default()
            },
        )
        .await;
        let t = Instant::now();
        while api.pod_watches.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "the daemon never listed the pods"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The watch opens once the list is in the cache; let the allocator settle.
        tokio::time::sleep(Duration::from_millis(500)).await;
        rss_kube.push((pods, daemon.rss_kib()));
        daemon.terminate().await;
    }

    let base_rate = scaling[0].1;
    println!(
        "\nlocalvol lifecycle benchmark ({} rounds; loop backend, 64 MiB ext4)\n",
        rounds
    );
    println!(
        "{:<44} {:>12} {:>12} {:>8}",
        "measure", "localvol", "baseline", "ratio"
    );
    println!(
        "{:<44} {:>10.2}ms {:>10.2}ms {:>8.3}",
        "lifecycle p50 (vs raw tools)",
        ms(ours_p50),
        ms(raw_p50),
        ms(ours_p50) / ms(raw_p50)
    );
    for (step, ours, raw) in &steps {
        println!(
            "{:<44} {:>10.2}ms {:>10.2}ms {:>8.3}",
            format!("  {step} p50"),
            ms(*ours),
            ms(*raw),
            ms(*ours) / ms(*raw)
        );
    }
    println!("  tools, localvol: {}", harness::tally_line(&ours_programs));
    println!("  tools, raw:      {}", harness::tally_line(&raw_programs));
    for (label, (p50, p99)) in [
        ("bind-mount syscalls", latency.syscall),
        ("mount/umount commands", latency.command),
    ] {
        println!(
            "{:<44} {:>10.3}ms {:>10.3}ms {:>8.3}",
            format!("publish+unpublish p50 (vs {label})"),
            ms(latency.ours.0),
            ms(p50),
            ms(latency.ours.0) / ms(p50)
        );
        println!(
            "{:<44} {:>10.3}ms {:>10.3}ms {:>8.3}",
            format!("publish+unpublish p99 (vs {label})"),
            ms(latency.ours.1),
            ms(p99),
            ms(latency.ours.1) / ms(p99)
        );
    }
    let work_p50 = latency.ours.0.saturating_sub(latency.rpc_floor);
    println!(
        "{:<44} {:>10.3}ms {:>12} {:>8.3}",
        "  of which 2 empty gRPC round trips",
        ms(latency.rpc_floor),
        "",
        ms(latency.rpc_floor) / ms(latency.ours.0)
    );
    println!(
        "{:<44} {:>10.3}ms {:>10.3}ms {:>8.3}",
        "  the rest (vs bind-mount syscalls)",
        ms(work_p50),
        ms(latency.syscall.0),
        ms(work_p50) / ms(latency.syscall.0)
    );
    println!(
        "{:<44} {:>10.3}ms {:>10.3}ms {:>8.3}",
        "GetPluginInfo p50 (vs a bare tonic server)",
        ms(empty_ours),
        ms(empty_bare),
        ms(empty_ours) / ms(empty_bare)
    );
    let rpc = latency.rpc_floor / 2;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").map_or(0, |t| t.lines().count());
    println!(
        "{:<44} {:>10.3}ms {:>10.3}ms {:>8.3}",
        format!("NodeGetVolumeStats p50, {mounts} mounts (vs an empty call)"),
        ms(latency.stats),
        ms(rpc),
        ms(latency.stats) / ms(rpc)
    );
    for (c, rate) in &scaling {
        println!(
            "{:<44} {:>9.1}/s {:>12} {:>8.2}",
            format!("throughput, {c} concurrent"),
            rate,
            "",
            rate / base_rate
        );
    }
    fill.print(Some(idle_rss), startup);
    for (pods, rss) in &rss_kube {
        println!(
            "{:<44} {:>10} KiB",
            format!("RSS, Kubernetes on, {pods} pods cached"),
            rss
        );
    }
    println!(
        "{:<44} {:>10.1}ms",
        "start-up to serving socket (median)",
        ms(startup)
    );

    report.insert("rounds".into(), json!(rounds));
    report.insert(
        "lifecycle_ms".into(),
        json!({"localvol_p50": ms(ours_p50), "raw_p50": ms(raw_p50), "ratio": ms(ours_p50) / ms(raw_p50),
               "localvol_programs": harness::tally(&ours_programs), "raw_programs": harness::tally(&raw_programs),
               "steps": steps.iter().map(|(step, ours, raw)| json!({
                   "step": step, "localvol_p50": ms(*ours), "raw_p50": ms(*raw)})).collect::<Vec<_>>()}),
    );
    report.insert(
        "publish_unpublish_ms".into(),
        json!({"localvol_p50": ms(latency.ours.0), "localvol_p99": ms(latency.ours.1),
               "syscall_p50": ms(latency.syscall.0), "syscall_p99": ms(latency.syscall.1),
               "command_p50": ms(latency.command.0), "command_p99": ms(latency.command.1),
               "ratio_p50_vs_syscall": ms(latency.ours.0) / ms(latency.syscall.0),
               "ratio_p50_vs_command": ms(latency.ours.0) / ms(latency.command.0),
               "rpc_floor_p50": ms(latency.rpc_floor),
               "ratio_p50_without_rpc_floor_vs_syscall": ms(work_p50) / ms(latency.syscall.0)}),
    );
    report.insert(
        "empty_call_ms".into(),
        json!({"localvol_p50": ms(empty_ours), "bare_tonic_p50": ms(empty_bare),
               "ratio_p50": ms(empty_ours) / ms(empty_bare)}),
    );
    report.insert(
        "stats_ms".into(),
        json!({"localvol_p50": ms(latency.stats), "empty_call_p50": ms(rpc),
               "ratio_p50_vs_empty_call": ms(latency.stats) / ms(rpc),
               "mounts_on_the_host": mounts}),
    );
    report.insert(
        "throughput_per_s".into(),
        json!(
            scaling
                .iter()
                .map(|(c, r)| json!({"concurrency": c, "rate": r, "speedup": r / base_rate}))
                .collect::<Vec<_>>()
        ),
    );
    report.insert("as_the_node_fills".into(), fill.report(startup));
    report.insert(
        "rss_kib".into(),
        json!({"idle": idle_rss, "kube_on_0_pods": rss_kube[0].1, "kube_on_110_pods": rss_kube[1].1}),
    );
    report.insert("startup_ms".into(), json!(ms(startup)));
    harness::write_report("lifecycle.json", report);
}

/// `--only-publish`: publish+unpublish and the empty calls alone, printed, not written.
async fn only_publish(base: &Path) {
    let rounds = std::env::var("LOCALVOL_BENCH_ROUNDS").map_or(2000, |r| r.parse().unwrap());
    let (mut daemon, _) = start_daemon(
        localvol_testkit::localvol_bin!(),
        &base.join("main"),
        Launch::default(),
    )
    .await;
    println!("daemon pid {}", daemon.pid);
    let channel = localvol::csi::socket::connect(&daemon.socket).await.unwrap();
    let work = daemon.dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let latency = publish_latency(channel.clone(), &work, rounds).await;
    let (empty_ours, empty_bare) = empty_calls(channel, &work, rounds).await;
    let work_p50 = latency.ours.0.saturating_sub(latency.rpc_floor);
    println!(
        "publish+unpublish p50 {:.3} ms, p99 {:.3} ms; bind-mount syscalls p50 {:.3} ms ({:.2}x); \
         2 empty calls {:.3} ms; the rest {:.3} ms ({:.2}x); stats {:.3} ms; \
         GetPluginInfo {:.3} ms, bare tonic {:.3} ms",
        ms(latency.ours.0),
        ms(latency.ours.1),
        ms(latency.syscall.0),
        ms(latency.ours.0) / ms(latency.syscall.0),
        ms(latency.rpc_floor),
        ms(work_p50),
        ms(work_p50) / ms(latency.syscall.0),
        ms(latency.stats),
        ms(empty_ours),
        ms(empty_bare),
    );
    daemon.terminate().await;
}

/// NodePublish+NodeUnpublish of one staged volume against mkdir + bind mount + umount +
/// rmdir done directly.
async fn publish_latency(channel: Channel, work: &Path, rounds: usize) -> Latencies {
    let mut csi = Csi::new(channel);
    let stage = work.join("pub-stage");
    std::fs::create_dir_all(&stage).unwrap();
    let id = csi.create("pub", VOLUME_BYTES, None).await;
    csi.stage(&id, &stage).await;
    let target = work.join("pub-target");
    let bare_target = work.join("bare-target");
    let (mut ours, mut bare, mut command) = (Vec::new(), Vec::new(), Vec::new());
    let (mut floor, mut stats) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        // What kubelet asks of every volume every minute, against one empty call.
        let t = Instant::now();
        csi.stats(&id, &stage).await;
        stats.push(t.elapsed());
        // The gRPC floor: two calls that do no work, as many round trips as the pair.
        let t = Instant::now();
        for _ in 0..2 {
            csi.nothing().await;
        }
        floor.push(t.elapsed());
        let t = Instant::now();
        csi.publish(&id, &stage, &target).await;
        csi.unpublish(&id, &target).await;
        ours.push(t.elapsed());
        let (s, b) = (stage.clone(), bare_target.clone());
        let t = Instant::now();
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir(&b).unwrap();
            nix::mount::mount(Some(&s), &b, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();
            nix::mount::umount2(&b, MntFlags::empty()).unwrap();
            std::fs::remove_dir(&b).unwrap();
        })
        .await
        .unwrap();
        bare.push(t.elapsed());
        let t = Instant::now();
        std::fs::create_dir(&bare_target).unwrap();
        run(
            "mount",
            &["--bind", stage.to_str().unwrap(), bare_target.to_str().unwrap()],
        )
        .await;
        run("umount", &[bare_target.to_str().unwrap()]).await;
        std::fs::remove_dir(&bare_target).unwrap();
        command.push(t.elapsed());
    }
    csi.unstage(&id, &stage).await;
    csi.delete(&id).await;
    ours.sort();
    bare.sort();
    command.sort();
    floor.sort();
    stats.sort();
    Latencies {
        rpc_floor: percentile(&floor, 0.5),
        stats: percentile(&stats, 0.5),
        ours: (percentile(&ours, 0.5), percentile(&ours, 0.99)),
        syscall: (percentile(&bare, 0.5), percentile(&bare, 0.99)),
        command: (percentile(&command, 0.5), percentile(&command, 0.99)),
    }
}

/// p50 of an empty call (GetPluginInfo) to localvol and to a bare tonic server in
/// another process, interleaved: how much of localvol's transport floor is tonic's.
async fn empty_calls(localvol: Channel, work: &Path, rounds: usize) -> (Duration, Duration) {
    let bare = bare_server::BareServer::start(work).await;
    let bare_channel = localvol::csi::socket::connect(&bare.socket).await.unwrap();
    let mut clients =
        [localvol, bare_channel].map(localvol::proto::csi::v1::identity_client::IdentityClient::new);
    let mut times = [Vec::new(), Vec::new()];
    for _ in 0..rounds {
        for (client, times) in clients.iter_mut().zip(times.iter_mut()) {
            let t = Instant::now();
            client
                .get_plugin_info(localvol::proto::csi::v1::GetPluginInfoRequest {})
                .await
                .unwrap();
            times.push(t.elapsed());
        }
    }
    let [mut ours, mut bare_times] = times;
    ours.sort();
    bare_times.sort();
    (percentile(&ours, 0.5), percentile(&bare_times, 0.5))
}

/// p50 and p99 of publish+unpublish: localvol over gRPC, the bind mount as bare
/// syscalls, and as `mount --bind` + `umount` commands (what exec-based drivers run).
struct Latencies {
    /// p50 of two NodeGetCapabilities calls: the transport's share of the pair.
    rpc_floor: Duration,
    /// p50 of NodeGetVolumeStats on the staging mount.
    stats: Duration,
    ours: (Duration, Duration),
    syscall: (Duration, Duration),
    command: (Duration, Duration),
}
