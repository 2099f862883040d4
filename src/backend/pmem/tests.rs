//! PMEM direct mode against a simulated ndctl: a region that answers `list -R -N -i`,
//! `create-namespace`, `destroy-namespace` and `enable-namespace` in ndctl 76's JSON
//! and error text (tests/fixtures/ndctl), and a real temporary record directory.

use std::sync::{Arc, Mutex};

use super::*;
use crate::backend::CreateSpec;
use crate::host::fake::{FakeCommands, FakeSyscalls, failed, succeeded as ok, take_scripted};

/// Records: unfinished creates, the format mark, older records.
mod records;
mod seeds;
/// Space: refused before ndctl while the listing knows the free sizes, by ndctl's own
/// refusal after our changes made them unknown; nothing left behind either way.
mod space;

const MIB: u64 = 1 << 20;
const ALIGN: u64 = 16 * MIB;

#[derive(Debug, Clone)]
struct FakeNs {
    dev: String,
    blockdev: String,
    raw: u64,
    name: Option<String>,
    busy: bool,
    enabled: bool,
    /// Left by a killed `ndctl create-namespace`: fsdax but disabled, listed without
    /// a size (tests/fixtures/ndctl/list-Ni-after-killed-create.json).
    half_made: bool,
    /// Idle, with the uuid an interrupted setup wrote
    /// (tests/fixtures/ndctl/list-RNi-setup-interrupted.json).
    uuid_set: bool,
}

#[derive(Debug, Default)]
struct FakeRegion {
    size: u64,
    namespaces: Vec<FakeNs>,
    next: usize,
    fail: Vec<(&'static str, String)>,
    /// `ndctl disable-region`: listed with `"state":"disabled"` and no namespaces
    /// (tests/fixtures/ndctl/list-RNi-region0-disabled.json); a create finds no space and
    /// a destroy no namespace, as ndctl says then; any other change panics.
    disabled: bool,
}

impl FakeRegion {
    fn available(&self) -> u64 {
        self.size - self.namespaces.iter().map(|n| n.raw).sum::<u64>()
    }

    fn json(&self) -> String {
        if self.disabled {
            return format!(
                r#"[{{"dev":"region0","size":{},"align":{ALIGN},"available_size":{a},"max_available_extent":{a},"type":"pmem","persistence_domain":"unknown","state":"disabled"}}]"#,
                self.size,
                a = self.available()
            );
        }
        let namespaces: Vec<String> = self
            .namespaces
            .iter()
            .map(|n| {
                let name = n.name.as_ref().map(|v| format!(r#","name":"{v}""#)).unwrap_or_default();
                if n.half_made {
                    format!(r#"{{"dev":"{}","mode":"fsdax","map":"dev","align":2097152,"state":"disabled"{name}}}"#, n.dev)
                } else if n.enabled {
                    format!(
                        r#"{{"dev":"{}","mode":"fsdax","map":"dev","size":{},"align":2097152,"blockdev":"{}"{name}}}"#,
                        n.dev,
                        ndctl::fsdax_usable(n.raw),
                        n.blockdev
                    )
                } else {
                    let uuid = if n.uuid_set { "0f7bd679-9ed3-44b5-aa23-452e6b52cafb" } else { "00000000-0000-0000-0000-000000000000" };
                    format!(r#"{{"dev":"{}","mode":"raw","size":{},"uuid":"{uuid}","state":"disabled"{name}}}"#, n.dev, n.raw)
                }
            })
            .collect();
        format!(
            r#"{{"regions":[{{"dev":"region0","size":{},"align":{ALIGN},"available_size":{a},"max_available_extent":{a},"type":"pmem","namespaces":[{}]}}]}}"#,
            self.size,
            namespaces.join(","),
            a = self.available()
        )
    }
}

type Shared = Arc<Mutex<FakeRegion>>;

fn simulate(commands: &FakeCommands, region: &Shared) {
    let failing =
        |region: &Shared, program: &'static str| take_scripted(&mut region.lock().unwrap().fail, program);
    {
        let region = Arc::clone(region);
        commands.on("ndctl", move |cmd| {
            let a: Vec<String> = cmd.args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
            let mut r = region.lock().unwrap();
            let flag = |name: &str| a.iter().position(|x| x == name).map(|i| a[i + 1].clone());
            match a[0].as_str() {
                "list" if flag("-r").as_deref() == Some("region0") => ok(r.json()),
                "list" => ok(String::new()),
                // As ndctl 76 answers while the region is disabled (its namespaces are
                // gone from sysfs): tests/fixtures/ndctl/*-region-disabled.txt.
                "create-namespace" if r.disabled => {
                    failed(cmd, 237, "failed to create namespace: No space left on device\n")
                }
                "destroy-namespace" if r.disabled => failed(
                    cmd,
                    250,
                    "error destroying namespaces: No such device or address\ndestroyed 0 namespaces\n",
                ),
                other if r.disabled => panic!("ndctl {other} in a disabled region"),
                "create-namespace" => {
                    let raw: u64 = flag("-s").unwrap().parse().unwrap();
                    if !raw.is_multiple_of(ALIGN) {
                        return failed(cmd, 234, "  Error: create namespace: region0: align setting is 0x1000000 size 0x4100000 is misaligned\n\n");
                    }
                    if raw > r.available() {
                        return failed(cmd, 237, "failed to create namespace: No space left on device\n");
                    }
                    // The kernel refuses the uuid of a namespace left mid-setup while no
                    // namespace holds storage; ndctl's cleanup then forgets that uuid.
                    if r.namespaces.iter().all(|n| n.raw == 0)
                        && let Some(stuck) = r.namespaces.iter_mut().find(|n| n.uuid_set)
                    {
                        stuck.uuid_set = false;
                        let text = format!("  Error: create namespace: {}: set_uuid failed: Device or resource busy\n\n", stuck.dev);
                        return failed(cmd, 240, &text);
                    }
                    let n = r.next;
                    r.next += 1;
                    let ns = FakeNs {
                        dev: format!("namespace0.{n}"),
                        blockdev: if n == 0 { "pmem0".into() } else { format!("pmem0.{n}") },
                        raw,
                        name: flag("-n"),
                        busy: false,
                        enabled: true,
                        half_made: false,
                        uuid_set: false,
                    };
                    let out = format!(
                        r#"{{"dev":"{}","mode":"fsdax","map":"dev","size":{},"align":2097152,"blockdev":"{}","name":"{}"}}"#,
                        ns.dev,
                        ndctl::fsdax_usable(raw),
                        ns.blockdev,
                        ns.name.clone().unwrap()
                    );
                    r.namespaces.push(ns);
                    ok(out)
                }
                "destroy-namespace" => {
                    let dev = a.last().unwrap();
                    match r.namespaces.iter().position(|n| &n.dev == dev) {
                        None => failed(cmd, 250, "error destroying namespaces: No such device or address\ndestroyed 0 namespaces\n"),
                        Some(i) if r.namespaces[i].busy => failed(cmd, 240, "error destroying namespaces: Device or resource busy\ndestroyed 0 namespaces\n"),
                        // Writing size 0 again forgets the uuid.
                        Some(i) if r.namespaces[i].uuid_set => {
                            r.namespaces[i].uuid_set = false;
                            ok("destroyed 1 namespace\n".to_string())
                        }
                        Some(i) if r.namespaces[i].raw == 0 => {
                            failed(cmd, 250, "error destroying namespaces: No such device or address\ndestroyed 0 namespaces\n")
                        }
                        // As the kernel does: the namespace becomes an idle seed of size
                        // 0 that keeps its label's name.
                        Some(i) => {
                            let ns = &mut r.namespaces[i];
                            ns.raw = 0;
                            ns.enabled = false;
                            ns.half_made = false;
                            ok(String::new())
                        }
                    }
                }
                "enable-namespace" => {
                    let dev = a.last().unwrap();
                    r.namespaces.iter_mut().find(|n| &n.dev == dev).unwrap().enabled = true;
                    ok(String::new())
                }
                other => panic!("unexpected ndctl {other}"),
            }
        });
    }
    for program in ["blkdiscard", "wipefs"] {
        let region = Arc::clone(region);
        commands.on(program, move |cmd| match failing(&region, program) {
            Some(stderr) => failed(cmd, 1, stderr),
            None => ok(String::new()),
        });
    }
}

/// Opens class `pmem` on `region_name` of the simulated `region`, records in a temp dir.
async fn open(
    region: &Shared,
    region_name: &str,
) -> (
    Arc<FakeCommands>,
    Result<PmemBackend, BackendError>,
    tempfile::TempDir,
    FakeSyscalls,
) {
    let commands = Arc::new(FakeCommands::default());
    simulate(&commands, region);
    let syscalls = FakeSyscalls::default();
    let host = Host {
        commands: commands.clone(),
        syscalls: Arc::new(syscalls.clone()),
    };
    let dir = tempfile::tempdir().unwrap();
    let class = ClassName::parse("pmem").unwrap();
    let opened = PmemBackend::open(class, region_name.into(), dir.path().join("pmem"), host).await;
    (commands, opened, dir, syscalls)
}

struct Fixture {
    region: Shared,
    commands: Arc<FakeCommands>,
    syscalls: FakeSyscalls,
    backend: PmemBackend,
    _dir: tempfile::TempDir,
}

impl Fixture {
    async fn new() -> Self {
        let region = Arc::new(Mutex::new(FakeRegion {
            size: 1 << 30,
            ..FakeRegion::default()
        }));
        let (commands, opened, dir, syscalls) = open(&region, "region0").await;
        Self {
            region,
            commands,
            syscalls,
            backend: opened.unwrap(),
            _dir: dir,
        }
    }

    /// A fixture holding volume `pvc-1` of 62 MiB, made with `mode`.
    async fn with_volume(mode: VolumeMode) -> (Self, Token) {
        let f = Self::new().await;
        f.backend.create(&spec("pvc-1", 62 * MIB, mode)).await.unwrap();
        (f, Token::for_name("pvc-1"))
    }

    fn names(&self) -> Vec<String> {
        self.region
            .lock()
            .unwrap()
            .namespaces
            .iter()
            .filter(|n| n.raw > 0)
            .filter_map(|n| n.name.clone())
            .collect()
    }

    fn records(&self) -> Vec<String> {
        let mut files: Vec<_> = std::fs::read_dir(&self.backend.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        files
    }

    fn changes(&self) -> Vec<String> {
        self.commands
            .calls()
            .into_iter()
            .filter(|c| !c.starts_with("ndctl list"))
            .collect()
    }
}

fn spec(name: &str, size: u64, mode: VolumeMode) -> CreateSpec {
    CreateSpec {
        token: Token::for_name(name),
        name: name.to_string(),
        size_bytes: size,
        mode,
        fs_type: None,
        claim: ClaimRef::default(),
        encryption: None,
    }
}

fn range(required: u64, limit: Option<u64>) -> CapacityRange {
    CapacityRange { required, limit }
}

#[tokio::test]
async fn sizes_are_rounded_up_to_usable_bytes_and_never_shrunk() {
    let f = Fixture::new().await;
    let b = &f.backend;
    assert_eq!(b.alignment(), ALIGN);
    // 100 MiB needs a 112 MiB namespace, which offers 110 MiB.
    assert_eq!(b.size_for(&range(100 * MIB, None)).unwrap(), 110 * MIB);
    assert_eq!(b.size_for(&range(62 * MIB, Some(62 * MIB))).unwrap(), 62 * MIB);
    let err = b.size_for(&range(100 * MIB, Some(100 * MIB))).unwrap_err();
    assert!(
        matches!(err, ValidationError::OutOfRange(ref m) if m.contains("117440512")),
        "{err}"
    );
    // No minimum: the largest namespace within the limit.
    assert_eq!(b.size_for(&range(0, Some(100 * MIB))).unwrap(), 94 * MIB);
    // Neither: the largest within the default size (1 GiB).
    let default = b.size_for(&range(0, None)).unwrap();
    assert!(default <= 1 << 30 && default > (1 << 30) - ALIGN, "{default}");
}

#[tokio::test]
async fn a_filesystem_volume_is_a_named_namespace_with_an_unformatted_record() {
    let f = Fixture::new().await;
    let b = &f.backend;
    let token = Token::for_name("pvc-1");
    let listings = || {
        f.commands
            .calls()
            .iter()
            .filter(|c| c.starts_with("ndctl list"))
            .count()
    };
    b.capacity().await.unwrap();
    let listed = listings();
    let record = b
        .create(&spec("pvc-1", 62 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    assert_eq!(record.size_bytes, 62 * MIB);
    assert_eq!(
        f.changes(),
        ["ndctl create-namespace -r region0 -m fsdax -M dev -s 67108864 -n pvc-1"],
        "nothing is wiped: the first stage formats over whatever the namespace holds"
    );
    assert!(b.format_unfinished(&token).await.unwrap());
    assert_eq!(f.records(), ["pvc-1.json"]);
    assert_eq!(b.get(&token).await.unwrap(), Some(record.clone()));
    assert_eq!(b.list().await.unwrap(), [record]);
    assert_eq!(b.device(&token).await.unwrap(), Some(PathBuf::from("/dev/pmem0")));
    assert_eq!(b.attach(&token).await.unwrap(), PathBuf::from("/dev/pmem0"));
    assert_eq!(
        listings(),
        listed,
        "the create was applied to the cached listing: lookups list nothing"
    );
    // Free space is ndctl's to say: capacity lists the region again.
    let cap = b.capacity().await.unwrap();
    assert_eq!(listings(), listed + 1);
    assert_eq!(cap.max_volume, ndctl::fsdax_usable((1 << 30) - 64 * MIB));
    assert_eq!(cap.total, 1 << 30);
}

#[tokio::test]
async fn a_block_volume_is_zeroed_whole() {
    let f = Fixture::new().await;
    f.backend
        .create(&spec("blk", 30 * MIB, VolumeMode::Block))
        .await
        .unwrap();
    assert_eq!(f.changes()[1], "blkdiscard -f -z /dev/pmem0");
}

#[tokio::test]
async fn a_failed_clear_destroys_the_namespace_and_the_record() {
    let f = Fixture::new().await;
    f.region
        .lock()
        .unwrap()
        .fail
        .push(("blkdiscard", "blkdiscard: error".into()));
    let err = f
        .backend
        .create(&spec("pvc-1", 62 * MIB, VolumeMode::Block))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("blkdiscard"), "{err}");
    assert!(f.names().is_empty());
    assert!(f.records().is_empty());
}

#[tokio::test]
async fn delete_is_idempotent_and_refuses_a_busy_namespace() {
    let (f, token) = Fixture::with_volume(VolumeMode::Filesystem).await;
    let b = &f.backend;
    f.region.lock().unwrap().namespaces[0].busy = true;
    let err = b.delete(&token).await.unwrap_err();
    assert!(matches!(err, BackendError::InUse { .. }), "{err}");
    assert_eq!(
        f.records(),
        ["pvc-1.json"],
        "the record stays while the namespace does"
    );
    f.region.lock().unwrap().namespaces[0].busy = false;
    b.delete(&token).await.unwrap();
    assert!(f.names().is_empty() && f.records().is_empty());
    b.delete(&token).await.unwrap();

    // A crash between destroying the namespace and removing the record: retried fine.
    b.create(&spec("pvc-2", 62 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    f.region.lock().unwrap().namespaces.clear();
    b.cache.invalidate();
    assert!(b.get(&Token::for_name("pvc-2")).await.unwrap().is_none());
    b.delete(&Token::for_name("pvc-2")).await.unwrap();
    assert!(f.records().is_empty());
}

#[tokio::test]
async fn namespaces_that_are_not_ours_are_never_touched() {
    let f = Fixture::new().await;
    f.region.lock().unwrap().namespaces.push(FakeNs {
        dev: "namespace0.7".into(),
        blockdev: "pmem0.7".into(),
        raw: 64 * MIB,
        name: Some("pvc-1".into()),
        busy: false,
        enabled: true,
        half_made: false,
        uuid_set: false,
    });
    f.backend.cache.invalidate();
    let token = Token::for_name("pvc-1");
    assert!(f.backend.get(&token).await.unwrap().is_none());
    f.backend.delete(&token).await.unwrap();
    let err = f
        .backend
        .create(&spec("pvc-1", 62 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap_err();
    assert!(
        matches!(err, BackendError::Pmem(PmemError::NameTaken { .. })),
        "{err}"
    );
    assert_eq!(f.names(), ["pvc-1"]);
    assert!(f.changes().is_empty(), "{:?}", f.changes());
}

#[tokio::test]
async fn a_namespace_cannot_grow() {
    let (f, token) = Fixture::with_volume(VolumeMode::Filesystem).await;
    assert_eq!(f.backend.expand(&token, 62 * MIB).await.unwrap(), 62 * MIB);
    let err = f.backend.expand(&token, 78 * MIB).await.unwrap_err();
    assert!(
        matches!(err, BackendError::Pmem(PmemError::FixedSize { .. })),
        "{err}"
    );
}

/// The kernel's list of bad sectors on a namespace's device makes the volume abnormal,
/// naming the namespace and how to clear them.
#[tokio::test]
async fn media_errors_on_a_namespace_make_its_volume_abnormal() {
    let (f, token) = Fixture::with_volume(VolumeMode::Filesystem).await;
    let dev = nix::sys::stat::makedev(259, 0);
    assert_eq!(
        f.backend.volume_health(&token, Some(dev)).await.unwrap(),
        VolumeHealth::Healthy
    );
    f.syscalls.set_bad_sectors((259, 0), 8);
    assert_eq!(
        f.backend.volume_health(&token, Some(dev)).await.unwrap(),
        VolumeHealth::Abnormal(
            "its namespace namespace0.0 has 8 bad sectors (media errors the kernel lists in \
             /sys/block/pmem0/badblocks): reads of them fail and what they held is lost; copy \
             off what reads, then clear them (ndctl clear-errors namespace0.0) or delete the \
             volume"
                .to_string()
        )
    );
}

/// A namespace disabled under its volume (`ndctl disable-namespace`, as the fake lists
/// it as ndctl does: tests/fixtures/ndctl/list-RNi-namespace-disabled.json) is why its
/// device is gone, read on a listing at most REFUSAL_TTL old; enabled, it is not.
#[tokio::test]
async fn a_disabled_namespace_is_why_its_volume_has_no_device() {
    let (f, token) = Fixture::with_volume(VolumeMode::Block).await;
    let made = f.changes().len();
    f.region.lock().unwrap().namespaces[0].enabled = false;
    f.backend.cache.invalidate();
    assert_eq!(f.backend.device(&token).await.unwrap(), None);
    assert_eq!(
        f.backend.volume_health(&token, None).await.unwrap(),
        VolumeHealth::Abnormal(health::namespace_disabled("namespace0.0"))
    );
    f.region.lock().unwrap().namespaces[0].enabled = true;
    f.backend.cache.invalidate();
    assert_eq!(
        f.backend.volume_health(&token, None).await.unwrap(),
        VolumeHealth::Healthy
    );
    assert_eq!(f.changes().len(), made, "only listed: {:?}", f.changes());
}

/// A disabled region lists no namespaces, which proves nothing of them: the class offers
/// nothing and refuses a create with RESOURCE_EXHAUSTED, calls on its volumes answer
/// UNAVAILABLE, its records are kept and listed, its storage is critical and its
/// volumes abnormal; nothing is run but `ndctl list`. Enabled again, all of it serves.
#[tokio::test]
async fn a_disabled_region_takes_no_volume_and_keeps_its_records() {
    let (f, token) = Fixture::with_volume(VolumeMode::Filesystem).await;
    let changes = f.changes().len();
    f.region.lock().unwrap().disabled = true;
    f.backend.cache.invalidate();
    let b = &f.backend;
    assert_eq!(
        b.capacity().await.unwrap(),
        ClassCapacity {
            available: 0,
            total: 1 << 30,
            max_volume: 0
        }
    );
    let StorageHealth::Critical(why) = b.storage_health().await.unwrap() else {
        panic!("not critical");
    };
    assert_eq!(why, health::disabled("region0"));
    let err = b
        .create(&spec("pvc-2", 62 * MIB, VolumeMode::Block))
        .await
        .unwrap_err();
    assert!(
        matches!(err, BackendError::Pmem(PmemError::RegionDisabled { .. })),
        "{err}"
    );
    assert_eq!(crate::error::code_of(&err), tonic::Code::ResourceExhausted);
    let listed = b.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].name.as_str(), listed[0].size_bytes),
        ("pvc-1", 62 * MIB)
    );
    assert_eq!(b.get(&token).await.unwrap().as_ref(), Some(&listed[0]));
    assert_eq!(b.device(&token).await.unwrap(), None);
    assert_eq!(
        b.volume_health(&token, None).await.unwrap(),
        VolumeHealth::Abnormal(health::disabled("region0"))
    );
    for err in [
        b.attach(&token).await.unwrap_err(),
        b.delete(&token).await.unwrap_err(),
        b.expand(&token, 62 * MIB).await.unwrap_err(),
    ] {
        assert!(
            matches!(err, BackendError::Pmem(PmemError::RegionUnreachable { .. })),
            "{err}"
        );
        assert_eq!(crate::error::code_of(&err), tonic::Code::Unavailable);
        assert!(err.to_string().ends_with("; nothing was changed"), "{err}");
    }
    assert_eq!(f.records(), ["pvc-1.json"]);
    assert_eq!(f.changes().len(), changes, "{:?}", f.changes());
    b.check_health()
        .await
        .expect("the region is listed: the daemon stays ready");

    f.region.lock().unwrap().disabled = false;
    f.backend.cache.invalidate();
    assert!(b.capacity().await.unwrap().available > 0);
    assert_eq!(b.storage_health().await.unwrap(), StorageHealth::Healthy);
    assert_eq!(b.device(&token).await.unwrap(), Some(PathBuf::from("/dev/pmem0")));
    b.delete(&token).await.unwrap();
    assert!(f.records().is_empty() && f.names().is_empty());
}

/// The region disabled after the class last listed it: the cached listing still shows
/// the namespace, and ndctl's answers are those of a missing namespace and a full
/// region. A fresh listing tells them apart: the record is kept (the namespace comes
/// back with the region) and the create is refused for the region, not for space.
#[tokio::test]
async fn a_region_disabled_behind_the_cached_listing_loses_no_record() {
    let (f, token) = Fixture::with_volume(VolumeMode::Filesystem).await;
    f.region.lock().unwrap().disabled = true;
    let b = &f.backend;
    let err = b.delete(&token).await.unwrap_err();
    assert!(
        matches!(err, BackendError::Pmem(PmemError::RegionUnreachable { .. })),
        "{err}"
    );
    assert_eq!(f.records(), ["pvc-1.json"]);
    // Listed enabled again (and cached), then disabled before the create runs ndctl.
    f.region.lock().unwrap().disabled = false;
    f.backend.cache.invalidate();
    assert!(b.capacity().await.unwrap().available > 0);
    f.region.lock().unwrap().disabled = true;
    let err = b
        .create(&spec("pvc-2", 62 * MIB, VolumeMode::Block))
        .await
        .unwrap_err();
    assert!(
        matches!(err, BackendError::Pmem(PmemError::RegionDisabled { .. })),
        "{err}"
    );
    assert_eq!(f.records(), ["pvc-1.json"], "the pending record is removed");

    f.region.lock().unwrap().disabled = false;
    f.backend.cache.invalidate();
    b.delete(&token).await.unwrap();
    assert!(f.records().is_empty() && f.names().is_empty());
}

/// The cached listing (issue 47's test of it): after two creates, a delete, the daemon
/// killed in a create after its namespace was made (its record still pending) and
/// restarted on that, and the retried create, what the RPCs read from the patched
/// listing (capacity, list, each device) is what a fresh `ndctl list` gives them.
#[tokio::test]
async fn the_patched_listing_says_what_a_fresh_listing_says() {
    let f = Fixture::new().await;
    let tokens = ["fs", "blk", "half"].map(Token::for_name);
    let seen = async |b: &PmemBackend| {
        let mut devices = Vec::new();
        for token in &tokens {
            devices.push(b.device(token).await.unwrap());
        }
        (b.capacity().await.unwrap(), b.list().await.unwrap(), devices)
    };
    let same_as_fresh = async |b: &PmemBackend, step: &str| {
        let patched = seen(b).await;
        b.cache.invalidate();
        assert_eq!(seen(b).await, patched, "after {step}");
    };
    let b = &f.backend;
    b.create(&spec("fs", 62 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    b.create(&spec("blk", 30 * MIB, VolumeMode::Block)).await.unwrap();
    same_as_fresh(b, "two creates").await;
    b.delete(&tokens[1]).await.unwrap();
    same_as_fresh(b, "a delete").await;
    // The daemon dies in a create after ndctl made the namespace: the record is pending.
    b.create(&spec("half", 30 * MIB, VolumeMode::Block))
        .await
        .unwrap();
    let mut file = b.read_record(&tokens[2]).await.unwrap().unwrap();
    file.pending = true;
    b.write_record(&tokens[2], &file).await.unwrap();
    let host = Host {
        commands: f.commands.clone(),
        syscalls: Arc::new(f.syscalls.clone()),
    };
    let again = PmemBackend::open(
        ClassName::parse("pmem").unwrap(),
        "region0".into(),
        b.dir.clone(),
        host,
    )
    .await
    .unwrap();
    same_as_fresh(&again, "a restart on the create the crash left").await;
    assert!(again.get(&tokens[2]).await.unwrap().is_none());
    again
        .create(&spec("half", 30 * MIB, VolumeMode::Block))
        .await
        .unwrap();
    same_as_fresh(&again, "the retried create").await;
    assert!(again.get(&tokens[2]).await.unwrap().is_some());
}

#[tokio::test]
async fn a_disabled_namespace_is_enabled_on_attach() {
    let (f, token) = Fixture::with_volume(VolumeMode::Filesystem).await;
    f.region.lock().unwrap().namespaces[0].enabled = false;
    f.backend.cache.invalidate();
    assert_eq!(f.backend.device(&token).await.unwrap(), None);
    assert_eq!(
        f.backend.attach(&token).await.unwrap(),
        PathBuf::from("/dev/pmem0")
    );
    assert_eq!(f.changes().last().unwrap(), "ndctl enable-namespace namespace0.0");
}

#[tokio::test]
async fn long_tokens_get_short_namespace_names() {
    let long = Token::for_name(&"a".repeat(90));
    let name = namespace_name(&long);
    assert!(name.starts_with("n+") && name.len() == 34, "{name}");
    assert_eq!(namespace_name(&Token::for_name("pvc-1")), "pvc-1");
    let hashed = Token::for_name("a/b");
    assert_eq!(namespace_name(&hashed), hashed.as_str());
}

#[tokio::test]
async fn a_missing_region_fails_at_open() {
    let (_, opened, _dir, _) = open(&Arc::new(Mutex::new(FakeRegion::default())), "region9").await;
    let err = opened.unwrap_err();
    assert!(
        matches!(err, BackendError::Pmem(PmemError::RegionNotFound { .. })),
        "{err}"
    );
}
