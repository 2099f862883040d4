//! The plan's parsing, each check on a broken plan, and `not-for`'s answers for every
//! entry of the case table tests/vm/cluster-guest.sh had (not_for_class).

use std::collections::BTreeSet;

use crate::plan::{Mode, Overrides, Plan, scenario_number};
use crate::{default_plan, shell_functions};

fn text() -> String {
    std::fs::read_to_string(default_plan()).unwrap()
}

fn real() -> Plan {
    Plan::parse(&text()).unwrap()
}

/// The scenario functions of tests/cluster/scenarios and the extra files.
fn functions() -> (BTreeSet<String>, BTreeSet<String>) {
    let repo = default_plan().parent().unwrap().parent().unwrap().to_path_buf();
    let mut files: Vec<_> = std::fs::read_dir(repo.join("tests/cluster/scenarios"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "sh"))
        .collect();
    files.sort();
    let extra = [
        repo.join("bench/cluster/scenario.sh"),
        repo.join("bench/cluster/guest-scenario.sh"),
    ];
    (
        shell_functions(files.iter().map(|p| p.as_path())).unwrap(),
        shell_functions(extra.iter().map(|p| p.as_path())).unwrap(),
    )
}

/// The problems of the plan TEXT with FROM replaced by TO (which must occur).
fn problems_with(from: &str, to: &str) -> Vec<String> {
    let t = text();
    assert!(t.contains(from), "the plan has no {from:?}");
    let plan = Plan::parse(&t.replacen(from, to, 1)).unwrap();
    let (s, e) = functions();
    plan.problems(&s, &e)
}

fn assert_problem(from: &str, to: &str, expected: &str) {
    let p = problems_with(from, to);
    assert!(
        p.iter().any(|m| m.contains(expected)),
        "replacing {from:?} by {to:?}: expected a problem containing {expected:?}, got {p:#?}"
    );
}

fn words(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_plan_parses_and_is_valid() {
    let (s, e) = functions();
    assert!(s.contains("s1_registration") && s.contains("s13_encryption"));
    assert!(e.contains("bench_pod_start"));
    assert_eq!(real().problems(&s, &e), Vec::<String>::new());
}

#[test]
fn shell_functions_are_names_at_a_line_start() {
    let dir = std::env::temp_dir().join(format!("plan-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("s.sh");
    std::fs::write(
        &f,
        "s1_a() {\n  inner() { :; }\n# s2_b() {\nx=1 s3() {\ns4_d() {  # ok\n",
    )
    .unwrap();
    let names = shell_functions([f.as_path()]).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(names, ["s1_a", "s4_d"].iter().map(|s| s.to_string()).collect());
}

#[test]
fn per_mode_values_fall_back_to_the_mode_before() {
    let p = real();
    assert_eq!(
        p.get("vm.sanity.encrypted.fs", Mode::Soak).unwrap(),
        words(&["lvm"])
    );
    assert_eq!(
        p.get("vm.restart", Mode::Soak).unwrap(),
        p.get("vm.restart", Mode::Full).unwrap()
    );
    assert_eq!(p.budget("guest_cluster", Mode::Soak).unwrap(), 4500);
    assert_eq!(p.budget("host_cluster", Mode::Full).unwrap(), 1500);
    assert!(p.budget("fuzz", Mode::Ci).is_err());
    assert!(p.budget("nothing", Mode::Ci).is_err());
    assert!(p.get("vm.lanes.C", Mode::Ci).is_err());
    assert!(p.get("vm.nothing", Mode::Ci).is_err());
    assert_eq!(
        p.get("settings.LOCALVOL_CRASH_ROUNDS", Mode::Soak).unwrap(),
        words(&["500"])
    );
    assert_eq!(
        p.get("settings.LOCALVOL_FUZZ_SECONDS", Mode::Soak).unwrap(),
        words(&["600"])
    );
    assert_eq!(
        p.get("settings.LOCALVOL_FUZZ_RELEASE", Mode::Soak).unwrap(),
        words(&["1"])
    );
    assert!(p.get("settings.LOCALVOL_CRASH_ROUNDS", Mode::Full).is_err());
}

/// Today's values of the scripts (tests/all.sh, tests/vm/suite.sh, tests/vm/cluster.sh,
/// tests/cluster/run.sh, tests/sanity/vm.sh) before they read the plan, plus what was added
/// to the plan since (scenario 15 on the host cluster and on the guest's lvm-thin class): a
/// change of selection is made here too.
#[test]
fn the_selections_are_the_scripts_former_ones() {
    let p = real();
    let cases: &[(&str, Mode, &str)] = &[
        ("vm.lanes.A", Mode::Ci, "smoke privileged backends"),
        (
            "vm.lanes.B",
            Mode::Ci,
            "encryption crash reclaim hostile grow sanity",
        ),
        ("vm.restart", Mode::Ci, "thin pmem"),
        ("vm.restart", Mode::Full, "thick thin pmem pmem-lvm"),
        ("vm.hostile", Mode::Ci, "lvm-thin pmem"),
        ("vm.hostile", Mode::Full, "lvm lvm-thin pmem pmem-lvm"),
        ("vm.sanity.fs", Mode::Ci, "lvm lvm-thin pmem"),
        ("vm.sanity.fs", Mode::Full, "lvm lvm-thin pmem pmem-lvm"),
        ("vm.sanity.block", Mode::Ci, "lvm pmem"),
        ("vm.sanity.block", Mode::Full, "lvm lvm-thin pmem pmem-lvm"),
        ("vm.sanity.encrypted.fs", Mode::Ci, "lvm"),
        ("vm.sanity.encrypted.fs", Mode::Full, "lvm"),
        ("vm.sanity.encrypted.block", Mode::Ci, "loop"),
        ("vm.sanity.encrypted.block", Mode::Full, "loop lvm-thin pmem-lvm"),
        (
            "guest_cluster.classes",
            Mode::Ci,
            "lvm-thin lvm pmem pmem-lvm mixed",
        ),
        (
            "guest_cluster.classes",
            Mode::Full,
            "lvm-thin lvm pmem pmem-lvm mixed",
        ),
        (
            "guest_cluster.scenarios",
            Mode::Ci,
            "s1_registration s2_volumes s3_ephemeral s5_reclaim s9_snapshots s13_encryption s6_daemon_restart s4_expansion s15_volume_health s12_mixed_node",
        ),
        (
            "guest_cluster.scenarios",
            Mode::Full,
            "s1_registration s2_volumes s3_ephemeral s5_reclaim s9_snapshots s13_encryption s6_daemon_restart s4_expansion s11_e2e_storage s15_volume_health s12_mixed_node",
        ),
        (
            "guest_cluster.default_classes",
            Mode::Ci,
            "lvm-thin lvm pmem pmem-lvm",
        ),
        ("guest_cluster.udev_classes", Mode::Ci, "lvm-thin"),
        (
            "guest_cluster.default_scenarios",
            Mode::Ci,
            "s1_registration s2_volumes s3_ephemeral s6_daemon_restart s4_expansion",
        ),
        (
            "guest_cluster.extra_scenarios",
            Mode::Ci,
            "s5_reclaim s9_snapshots s11_e2e_storage s12_mixed_node s13_encryption s15_volume_health",
        ),
        (
            "host_cluster.scenarios",
            Mode::Ci,
            "s1_registration s2_volumes s3_ephemeral s4_expansion s5_reclaim s6_daemon_restart s7_metrics s8_api_load s9_snapshots s10_e2e_k8s s11_e2e_storage s14_helm s15_volume_health",
        ),
    ];
    for (key, mode, want) in cases {
        assert_eq!(p.get(key, *mode).unwrap().join(" "), *want, "{key} in {mode}");
    }
    let numbers: Vec<&str> = p
        .guest_cluster
        .scenarios
        .get(Mode::Full)
        .iter()
        .map(|s| scenario_number(s))
        .collect();
    assert_eq!(numbers.join(" "), "1 2 3 5 9 13 6 4 11 15 12");
    assert_eq!(p.budget("guest_cluster", Mode::Ci).unwrap(), 3600);
    assert_eq!(p.budget("vm_a", Mode::Ci).unwrap(), 4800);
    assert_eq!(p.budget("vm_b", Mode::Full).unwrap(), 4800);
}

#[test]
fn the_mode_comes_from_the_environment_as_tests_all_sh_sets_it() {
    assert_eq!(Mode::from_env(None, None), Mode::Ci);
    assert_eq!(Mode::from_env(Some("0"), None), Mode::Ci);
    assert_eq!(Mode::from_env(Some("1"), None), Mode::Full);
    assert_eq!(Mode::from_env(None, Some("1")), Mode::Soak);
    assert_eq!(Mode::from_env(Some("1"), Some("1")), Mode::Soak);
    // tests/all.sh: LOCALVOL_SOAK=1 sets LOCALVOL_FULL only when unset.
    assert_eq!(Mode::from_env(Some("0"), Some("1")), Mode::Ci);
    assert_eq!(Mode::from_env(None, Some("0")), Mode::Ci);
}

#[test]
fn scenario_numbers() {
    assert_eq!(scenario_number("s13_encryption"), "13");
    assert_eq!(scenario_number("s1_registration"), "1");
    assert_eq!(scenario_number("bench_pod_start"), "bench_pod_start");
    assert_eq!(scenario_number("s_x"), "s_x");
}

const MIXED: &str = "the mixed node runs scenario 12; each class's own run covers the rest";
const BENCH: &str = "the benchmark's configuration runs the benchmark only";
const OWN: &str = "a configuration of its own: the mixed run's";
const S15: &str = "under the guest's kubelet it fills the thin pool with a pod's writes; every class's failures are made for real in tests/vm_backends (health.rs, missing_vg.rs, encryption.rs) and the loop class's under the host's kubelet";

/// Every entry of not_for_class's case table, in its order, and its fall-through.
#[test]
fn not_for_answers_every_entry_of_the_former_case_table() {
    let p = real();
    let s3 = "the owner check does not depend on the backend, and an ephemeral volume's storage lives as s2's claims do; s3 runs on lvm-thin";
    let s6 = "the LVM backend's restart, which lvm-thin's run covers; s6 runs on lvm-thin and pmem";
    let s4 = "LVM thick growth (lvextend, then the filesystem), which lvm's run covers";
    let s11 = "the e2e driver definition's promises (snapshots, clones) hold on lvm-thin; the guest runs the suites there";
    let s5 = "a thick LV gives no space back to the node: a trim there reaches the disk under the VG, which the VM suite's reclaim test covers";
    let s5p = "an fsdax namespace gives no space back: its size is fixed";
    let s9 = "snapshots are served on loop and lvm-thin only (CreateSnapshot is not among this class's capabilities)";
    let s13 = "dm-crypt over an LV is the same on every LVM class (tests/vm_backends.rs runs each); s13 runs on lvm-thin";
    let s13p = "pmem direct refuses encryption: its namespaces are for DAX, which dm-crypt cannot carry";
    let table: &[(&str, &str, Option<&str>)] = &[
        ("s3_ephemeral", "lvm", Some(s3)),
        ("s3_ephemeral", "pmem", Some(s3)),
        ("s3_ephemeral", "pmem-lvm", Some(s3)),
        ("s6_daemon_restart", "lvm", Some(s6)),
        ("s6_daemon_restart", "pmem-lvm", Some(s6)),
        ("s4_expansion", "pmem-lvm", Some(s4)),
        ("s11_e2e_storage", "lvm", Some(s11)),
        ("s11_e2e_storage", "pmem", Some(s11)),
        ("s11_e2e_storage", "pmem-lvm", Some(s11)),
        ("s5_reclaim", "lvm", Some(s5)),
        ("s5_reclaim", "pmem-lvm", Some(s5)),
        ("s5_reclaim", "pmem", Some(s5p)),
        ("s9_snapshots", "lvm", Some(s9)),
        ("s9_snapshots", "pmem", Some(s9)),
        ("s9_snapshots", "pmem-lvm", Some(s9)),
        ("s13_encryption", "lvm", Some(s13)),
        ("s13_encryption", "pmem-lvm", Some(s13)),
        ("s13_encryption", "pmem", Some(s13p)),
        ("s12_mixed_node", "mixed", None),
        ("s1_registration", "mixed", Some(MIXED)),
        ("s3_ephemeral", "mixed", Some(MIXED)),
        ("bench_pod_start", "mixed", Some(MIXED)),
        ("bench_pod_start", "all-classes", None),
        ("s2_volumes", "all-classes", Some(BENCH)),
        ("s12_mixed_node", "all-classes", Some(BENCH)),
        ("bench_pod_start", "lvm-thin", Some(BENCH)),
        ("bench_cluster", "loop", Some(BENCH)),
        ("s12_mixed_node", "lvm-thin", Some(OWN)),
        ("s12_mixed_node", "pmem", Some(OWN)),
        ("s15_volume_health", "lvm", Some(S15)),
        ("s15_volume_health", "pmem", Some(S15)),
        ("s15_volume_health", "pmem-lvm", Some(S15)),
        ("s15_volume_health", "lvm-thin", None),
        // The rest runs.
        ("s1_registration", "lvm-thin", None),
        ("s2_volumes", "pmem", None),
        ("s3_ephemeral", "lvm-thin", None),
        ("s4_expansion", "lvm", None),
        ("s4_expansion", "pmem", None),
        ("s5_reclaim", "lvm-thin", None),
        ("s6_daemon_restart", "pmem", None),
        ("s9_snapshots", "lvm-thin", None),
        ("s11_e2e_storage", "lvm-thin", None),
        ("s13_encryption", "lvm-thin", None),
        ("s7_metrics", "loop", None),
    ];
    for (s, c, want) in table {
        assert_eq!(p.not_for(s, c), *want, "not-for {s} {c}");
    }
}

#[test]
fn a_scenario_without_its_function_fails_the_check() {
    assert_problem(
        "full: [s1_registration, s2_volumes, s3_ephemeral, s5_reclaim, s9_snapshots, s13_encryption, s6_daemon_restart, s4_expansion, s11_e2e_storage",
        "full: [s1_registration, s2_volumes, s3_ephemeral, s5_reclaim, s9_snapshots, s13_encryption, s6_daemon_restart, s4_expansion, s11_e2e_storag",
        "no scenario s11_e2e_storag (no `s11_e2e_storag() {` in tests/cluster/scenarios/*.sh)",
    );
    assert_problem(
        "s10_e2e_k8s, s11",
        "s10_e2e_k9s, s11",
        "host_cluster.scenarios (ci): no scenario s10_e2e_k9s",
    );
    assert_problem(
        "- scenario: s4_expansion",
        "- scenario: s4_expanse",
        "guest_cluster.not_for: no scenario s4_expanse",
    );
    assert_problem(
        "scenarios: [bench_*]",
        "scenarios: [benchmark_*]",
        "no scenario function matches benchmark_*",
    );
}

#[test]
fn an_unknown_class_fails_the_check() {
    assert_problem(
        "ci: [thin, pmem]",
        "ci: [thin, pmen]",
        "vm.restart (ci): unknown class pmen",
    );
    assert_problem(
        "ci: [lvm, pmem]",
        "ci: [lvm, pmem-thin]",
        "vm.sanity.block (ci): unknown class pmem-thin",
    );
    assert_problem(
        "classes: [lvm, pmem-lvm]\n      reason: \"the LVM",
        "classes: [lvm, pmem-lv]\n      reason: \"the LVM",
        "guest_cluster.not_for s6_daemon_restart: unknown class pmem-lv",
    );
    assert_problem(
        "classes: [lvm-thin, lvm, pmem, pmem-lvm, mixed]",
        "classes: [lvm-thin, lvm, pmem, pmem-lvm, loop]",
        "guest_cluster: class loop is not among its configurations",
    );
}

#[test]
fn guest_cluster_lanes_must_share_out_its_classes() {
    let expected = "guest_cluster.lanes: not guest_cluster.classes";
    let lane1 = "- [lvm-thin, pmem-lvm]";
    let lane2 = "- [pmem, lvm, mixed]";
    assert_problem(lane1, "- [lvm-thin, pmem-lvm, pmem]", expected);
    assert_problem(lane2, "- [pmem, mixed]", expected);
    assert_problem(lane2, "- [pmem, lvm, mixed, pmem-lvm]", expected);
    assert_problem(lane1, "- []\n    - [lvm-thin, pmem-lvm]", expected);
    assert!(problems_with(lane2, "- [mixed, lvm, pmem]").is_empty());
    let plan = real();
    assert_eq!(
        plan.get("guest_cluster.lanes", Mode::Ci).unwrap(),
        words(&["1", "2"])
    );
    assert_eq!(
        plan.get("guest_cluster.lanes.1", Mode::Full).unwrap(),
        words(&["lvm-thin", "pmem-lvm"])
    );
    assert_eq!(
        plan.get("guest_cluster.lanes.2", Mode::Ci).unwrap(),
        words(&["pmem", "lvm", "mixed"])
    );
    assert!(plan.get("guest_cluster.lanes.0", Mode::Ci).is_err());
    assert!(plan.get("guest_cluster.lanes.3", Mode::Ci).is_err());
}

#[test]
fn a_not_for_entry_without_a_reason_fails_the_check() {
    assert_problem(
        "reason: \"an fsdax namespace gives no space back: its size is fixed\"",
        "reason: \"\"",
        "guest_cluster.not_for s5_reclaim: no reason",
    );
    assert_problem(
        "reason: \"a configuration of its own: the mixed run's\"",
        "reason: \" \"",
        "guest_cluster.scenario_runs_only_on s12_mixed_node: no reason",
    );
    // A reason left out is no plan at all.
    let t = text().replacen(
        "      reason: \"an fsdax namespace gives no space back: its size is fixed\"\n",
        "",
        1,
    );
    let e = Plan::parse(&t).unwrap_err();
    assert!(format!("{e:#}").contains("missing field `reason`"), "{e:#}");
}

#[test]
fn a_mode_that_selects_less_than_the_one_before_fails_the_check() {
    assert_problem(
        "full: [thick, thin, pmem, pmem-lvm]",
        "full: [thick, pmem, pmem-lvm]",
        "vm.restart: ci selects thin that full does not",
    );
    assert_problem(
        "ci: [lvm-thin, pmem]\n    full: [lvm, lvm-thin, pmem, pmem-lvm]",
        "ci: [lvm-thin, pmem]\n    full: [lvm, lvm-thin, pmem, pmem-lvm]\n    soak: [lvm]",
        "vm.hostile: full selects lvm-thin pmem pmem-lvm that soak does not",
    );
    assert_problem(
        "modes: [soak]",
        "modes: [ci]",
        "suites.fuzz: runs in ci but not in full",
    );
}

#[test]
fn a_missing_budget_fails_the_check() {
    assert_problem("    budget: 300\n", "", "suites.host_sanity: no budget");
    assert_problem(
        "budget: {ci: 3600, full: 4500}",
        "budget: {ci: 3600, full: 0}",
        "suites.guest_cluster: budget 0 in mode full",
    );
    assert_problem(
        "    enforced: tests/all.sh\n    basis: \"tests/all.sh: about 830",
        "    basis: \"tests/all.sh: about 830",
        "suites.host_cluster: a budget neither enforced",
    );
}

#[test]
fn other_broken_plans_fail_the_check() {
    assert_problem(
        "lane: A, what: \"tests/privileged.rs",
        "lane: C, what: \"tests/privileged.rs",
        "vm.parts privileged: lane \"C\"",
    );
    assert_problem(
        "{name: LOCALVOL_VM_NICE, for: people",
        "{name: LOCALVOL_VM_NICE, for: someone",
        "settings.LOCALVOL_VM_NICE: for \"someone\"",
    );
    assert_problem(
        "aliases: [thick]",
        "aliases: [pmem]",
        "classes: pmem is named twice",
    );
    assert_problem(
        "description: what CI runs on its 2-core machine; one class of each backend where another class repeats the same calls",
        "description: \"\"",
        "modes.ci: no description or no select",
    );
}

#[test]
fn a_person_replaces_a_selection_of_classes_for_a_run() {
    let plan = real();
    let none = Overrides::default();
    assert_eq!(
        plan.select("vm.hostile", Mode::Ci, &none).unwrap(),
        plan.get("vm.hostile", Mode::Ci).unwrap()
    );
    let o = Overrides::parse(" vm.hostile=pmem,lvm-thin ; vm.sanity.block= ;guest_cluster.udev_classes=lvm")
        .unwrap();
    assert_eq!(
        plan.select("vm.hostile", Mode::Ci, &o).unwrap(),
        ["pmem", "lvm-thin"]
    );
    assert!(plan.select("vm.sanity.block", Mode::Full, &o).unwrap().is_empty());
    assert_eq!(
        plan.select("guest_cluster.udev_classes", Mode::Ci, &o).unwrap(),
        ["lvm"]
    );
    // An alias is a class's name too; the keys not replaced keep the plan's.
    let o = Overrides::parse("vm.restart=thin thick").unwrap();
    assert_eq!(
        plan.select("vm.restart", Mode::Ci, &o).unwrap(),
        ["thin", "thick"]
    );
    assert_eq!(
        plan.select("vm.sanity.fs", Mode::Ci, &o).unwrap(),
        plan.get("vm.sanity.fs", Mode::Ci).unwrap()
    );
}

#[test]
fn a_replacement_that_would_select_nothing_silently_is_refused() {
    let plan = real();
    let err = |text: &str| Overrides::parse(text).unwrap_err().to_string();
    assert!(
        err("vm.hostile").contains("is not KEY=WORDS"),
        "{}",
        err("vm.hostile")
    );
    assert!(err("vm.parts=smoke").contains("\"vm.parts\" is not a selection of classes"));
    assert!(err("vm.hostile=lvm;vm.hostile=pmem").contains("vm.hostile is given twice"));
    let typo = Overrides::parse("vm.hostile=lvm-tin").unwrap();
    let e = plan
        .select("vm.hostile", Mode::Ci, &typo)
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown class lvm-tin"), "{e}");
}
