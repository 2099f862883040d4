//! The test plan (tests/plan.yaml) as types, its checks and its answers.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

/// A mode of `tests/all.sh`: each selects at least what the one before it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    Ci,
    Full,
    Soak,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Ci, Mode::Full, Mode::Soak];

    pub fn parse(word: &str) -> Result<Mode> {
        match word {
            "ci" => Ok(Mode::Ci),
            "full" => Ok(Mode::Full),
            "soak" => Ok(Mode::Soak),
            other => bail!("unknown mode {other:?} (ci, full or soak)"),
        }
    }

    /// The mode as tests/all.sh sets it: LOCALVOL_FULL=1 is full (soak with
    /// LOCALVOL_SOAK=1), LOCALVOL_FULL=0 is ci whatever LOCALVOL_SOAK says (the soak's
    /// LOCALVOL_FULL defaults to 1 only), and with LOCALVOL_FULL unset LOCALVOL_SOAK=1
    /// is soak.
    pub fn from_env(full: Option<&str>, soak: Option<&str>) -> Mode {
        let soak = soak == Some("1");
        match full {
            Some("1") if soak => Mode::Soak,
            Some("1") => Mode::Full,
            Some(_) => Mode::Ci,
            None if soak => Mode::Soak,
            None => Mode::Ci,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Ci => "ci",
            Mode::Full => "full",
            Mode::Soak => "soak",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A value the same in every mode, or given per mode: a mode left out takes the one
/// before it (soak from full, full from ci).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum PerMode<T> {
    ByMode(ByMode<T>),
    Same(T),
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ByMode<T> {
    pub ci: T,
    pub full: Option<T>,
    pub soak: Option<T>,
}

impl<T> PerMode<T> {
    pub fn get(&self, mode: Mode) -> &T {
        match self {
            PerMode::Same(v) => v,
            PerMode::ByMode(m) => match mode {
                Mode::Ci => &m.ci,
                Mode::Full => m.full.as_ref().unwrap_or(&m.ci),
                Mode::Soak => m.soak.as_ref().or(m.full.as_ref()).unwrap_or(&m.ci),
            },
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub modes: Modes,
    pub classes: Vec<Class>,
    pub suites: Vec<Suite>,
    pub vm: Vm,
    pub host_cluster: HostCluster,
    pub guest_cluster: GuestCluster,
    #[serde(default)]
    pub extra_scenario_files: Vec<String>,
    pub settings: Vec<Setting>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Modes {
    pub ci: ModeDef,
    pub full: ModeDef,
    pub soak: ModeDef,
}

impl Modes {
    pub fn get(&self, mode: Mode) -> &ModeDef {
        match mode {
            Mode::Ci => &self.ci,
            Mode::Full => &self.full,
            Mode::Soak => &self.soak,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModeDef {
    pub select: String,
    pub description: String,
    /// The settings (LOCALVOL_*) the mode gives a default, as tests/all.sh exports them
    /// when the mode is chosen and the setting is not set already.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Class {
    pub name: String,
    #[serde(default)]
    pub aliases: Vec<String>,
    /// A cluster configuration of several classes, not a device class.
    #[serde(default)]
    pub configuration: bool,
    pub what: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Suite {
    pub name: String,
    #[serde(rename = "where")]
    pub place: String,
    pub proves: String,
    /// The modes it runs in (all of them when left out).
    pub modes: Option<Vec<String>>,
    pub budget: Option<PerMode<u64>>,
    #[serde(default)]
    pub estimated: bool,
    pub enforced: Option<String>,
    pub basis: Option<String>,
}

impl Suite {
    pub fn runs_in(&self, mode: Mode) -> bool {
        self.modes
            .as_ref()
            .is_none_or(|m| m.iter().any(|w| w == mode.name()))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vm {
    pub parts: Vec<Part>,
    pub restart: PerMode<Vec<String>>,
    pub hostile: PerMode<Vec<String>>,
    pub sanity: Sanity,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Part {
    pub name: String,
    pub lane: String,
    pub what: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sanity {
    pub fs: PerMode<Vec<String>>,
    pub block: PerMode<Vec<String>>,
    pub encrypted: SanityEncrypted,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SanityEncrypted {
    pub fs: PerMode<Vec<String>>,
    pub block: PerMode<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostCluster {
    pub scenarios: PerMode<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestCluster {
    pub configurations: Vec<String>,
    pub default_classes: Vec<String>,
    pub default_scenarios: Vec<String>,
    pub extra_scenarios: Vec<String>,
    pub classes: PerMode<Vec<String>>,
    /// The classes of each guest tests/all.sh runs side by side: `classes`, shared out.
    pub lanes: Vec<Vec<String>>,
    pub udev_classes: Vec<String>,
    pub scenarios: PerMode<Vec<String>>,
    pub not_for: Vec<NotFor>,
    #[serde(default)]
    pub class_runs_only: Vec<ClassRunsOnly>,
    #[serde(default)]
    pub scenario_runs_only_on: Vec<ScenarioRunsOnlyOn>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotFor {
    pub scenario: String,
    pub classes: Vec<String>,
    pub reason: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassRunsOnly {
    pub class: String,
    pub scenarios: Vec<String>,
    pub reason: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioRunsOnlyOn {
    pub scenario: String,
    pub classes: Vec<String>,
    pub reason: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Setting {
    pub name: String,
    #[serde(rename = "for")]
    pub audience: String,
    pub read_by: Vec<String>,
    pub what: String,
}

/// A scenario name, or a prefix ending in `*`, matches SCENARIO.
pub fn scenario_matches(pattern: &str, scenario: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => scenario.starts_with(prefix),
        None => pattern == scenario,
    }
}

/// `s13_encryption` as `13`; a name without a number as itself.
pub fn scenario_number(name: &str) -> &str {
    name.strip_prefix('s')
        .and_then(|rest| rest.split_once('_'))
        .map(|(n, _)| n)
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .unwrap_or(name)
}

/// The selections a person replaces for one run: `LOCALVOL_SELECT`, entries
/// `KEY=WORDS` separated by `;`, the words by spaces or commas (an empty value selects
/// nothing), e.g. `LOCALVOL_SELECT='vm.hostile=pmem;vm.sanity.block='`. Only the
/// selections of classes can be replaced: which suites, parts and scenarios run is what
/// the plan is for, and tests/vm/cluster.sh takes its classes and scenarios as
/// arguments.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Overrides(BTreeMap<String, Vec<String>>);

/// The selections [`Overrides`] may replace: each a list of classes.
pub const CLASS_SELECTIONS: [&str; 7] = [
    "vm.restart",
    "vm.hostile",
    "vm.sanity.fs",
    "vm.sanity.block",
    "vm.sanity.encrypted.fs",
    "vm.sanity.encrypted.block",
    "guest_cluster.udev_classes",
];

impl Overrides {
    pub fn parse(text: &str) -> Result<Overrides> {
        let mut map = BTreeMap::new();
        for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let Some((key, words)) = entry.split_once('=') else {
                bail!("LOCALVOL_SELECT: {entry:?} is not KEY=WORDS");
            };
            let key = key.trim();
            if !CLASS_SELECTIONS.contains(&key) {
                bail!(
                    "LOCALVOL_SELECT: {key:?} is not a selection of classes ({})",
                    CLASS_SELECTIONS.join(", ")
                );
            }
            let words = words
                .split([' ', ','])
                .filter(|w| !w.is_empty())
                .map(str::to_string)
                .collect();
            if map.insert(key.to_string(), words).is_some() {
                bail!("LOCALVOL_SELECT: {key} is given twice");
            }
        }
        Ok(Overrides(map))
    }

    /// `LOCALVOL_SELECT`'s (none when it is unset).
    pub fn from_env() -> Result<Overrides> {
        Overrides::parse(&std::env::var("LOCALVOL_SELECT").unwrap_or_default())
    }
}

impl Plan {
    pub fn parse(text: &str) -> Result<Plan> {
        serde_yaml::from_str(text).context("the plan is not valid")
    }

    pub fn load(path: &Path) -> Result<Plan> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        Plan::parse(&text).with_context(|| path.display().to_string())
    }

    /// The selection KEY names, in mode MODE.
    pub fn get(&self, key: &str, mode: Mode) -> Result<Vec<String>> {
        let g = &self.guest_cluster;
        let list = match key {
            "vm.parts" => self.vm.parts.iter().map(|p| p.name.clone()).collect(),
            "vm.restart" => self.vm.restart.get(mode).clone(),
            "vm.hostile" => self.vm.hostile.get(mode).clone(),
            "vm.sanity.fs" => self.vm.sanity.fs.get(mode).clone(),
            "vm.sanity.block" => self.vm.sanity.block.get(mode).clone(),
            "vm.sanity.encrypted.fs" => self.vm.sanity.encrypted.fs.get(mode).clone(),
            "vm.sanity.encrypted.block" => self.vm.sanity.encrypted.block.get(mode).clone(),
            "host_cluster.scenarios" => self.host_cluster.scenarios.get(mode).clone(),
            "guest_cluster.configurations" => g.configurations.clone(),
            "guest_cluster.default_classes" => g.default_classes.clone(),
            "guest_cluster.default_scenarios" => g.default_scenarios.clone(),
            "guest_cluster.extra_scenarios" => g.extra_scenarios.clone(),
            "guest_cluster.classes" => g.classes.get(mode).clone(),
            "guest_cluster.udev_classes" => g.udev_classes.clone(),
            "guest_cluster.scenarios" => g.scenarios.get(mode).clone(),
            "suites" => self
                .suites
                .iter()
                .filter(|s| s.runs_in(mode))
                .map(|s| s.name.clone())
                .collect(),
            _ if key.starts_with("settings.") => {
                let name = &key["settings.".len()..];
                match self.modes.get(mode).settings.get(name) {
                    Some(v) => vec![v.clone()],
                    None => bail!("mode {mode} gives {name} no value in the plan"),
                }
            }
            "guest_cluster.lanes" => (1..=g.lanes.len()).map(|n| n.to_string()).collect(),
            _ if key.starts_with("guest_cluster.lanes.") => {
                let n = &key["guest_cluster.lanes.".len()..];
                match n
                    .parse::<usize>()
                    .ok()
                    .and_then(|n| g.lanes.get(n.checked_sub(1)?))
                {
                    Some(lane) => lane.clone(),
                    None => bail!(
                        "no selection {key:?}: the guest cluster's lanes are 1 to {}",
                        g.lanes.len()
                    ),
                }
            }
            _ => match key.strip_prefix("vm.lanes.") {
                Some(lane) if self.vm.parts.iter().any(|p| p.lane == lane) => self
                    .vm
                    .parts
                    .iter()
                    .filter(|p| p.lane == lane)
                    .map(|p| p.name.clone())
                    .collect(),
                _ => bail!("no selection {key:?} in the plan (plan get --help lists them)"),
            },
        };
        Ok(list)
    }

    /// The selection KEY names in mode MODE, or what `overrides` gives it; a class the
    /// plan does not know is refused (a misspelt one would select nothing, silently).
    pub fn select(&self, key: &str, mode: Mode, overrides: &Overrides) -> Result<Vec<String>> {
        let planned = self.get(key, mode)?;
        let Some(words) = overrides.0.get(key) else {
            return Ok(planned);
        };
        for w in words {
            if !self.classes.iter().any(|c| c.name == *w || c.aliases.contains(w)) {
                bail!("LOCALVOL_SELECT: {key}: unknown class {w} (tests/plan.yaml's classes)");
            }
        }
        Ok(words.clone())
    }

    /// tests/plan.yaml beside this crate's directory.
    pub fn default_path() -> PathBuf {
        let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        crate_dir.parent().unwrap_or(crate_dir).join("plan.yaml")
    }

    /// Why SCENARIO does not run on CLASS in the guest cluster, or None when it does.
    pub fn not_for(&self, scenario: &str, class: &str) -> Option<&str> {
        let g = &self.guest_cluster;
        if let Some(e) = g
            .not_for
            .iter()
            .find(|e| scenario_matches(&e.scenario, scenario) && e.classes.iter().any(|c| c == class))
        {
            return Some(&e.reason);
        }
        if let Some(e) = g
            .class_runs_only
            .iter()
            .find(|e| e.class == class && !e.scenarios.iter().any(|s| scenario_matches(s, scenario)))
        {
            return Some(&e.reason);
        }
        g.scenario_runs_only_on
            .iter()
            .find(|e| scenario_matches(&e.scenario, scenario) && !e.classes.iter().any(|c| c == class))
            .map(|e| e.reason.as_str())
    }

    /// SUITE's budget in MODE, in seconds.
    pub fn budget(&self, suite: &str, mode: Mode) -> Result<u64> {
        let s = self
            .suites
            .iter()
            .find(|s| s.name == suite)
            .with_context(|| format!("no suite {suite:?} in the plan"))?;
        if !s.runs_in(mode) {
            bail!("suite {suite} does not run in mode {mode}");
        }
        s.budget
            .as_ref()
            .map(|b| *b.get(mode))
            .with_context(|| format!("suite {suite} has no budget"))
    }

    fn known_class(&self, word: &str) -> bool {
        self.classes
            .iter()
            .any(|c| c.name == word || c.aliases.iter().any(|a| a == word))
    }

    /// Every problem of the plan, given the scenario functions that exist (`scenarios`:
    /// tests/cluster/scenarios'; `extra`: the extra scenario files'). Empty: it is valid.
    pub fn problems(&self, scenarios: &BTreeSet<String>, extra: &BTreeSet<String>) -> Vec<String> {
        let mut p = Vec::new();
        for mode in Mode::ALL {
            let m = self.modes.get(mode);
            if m.description.trim().is_empty() || m.select.trim().is_empty() {
                p.push(format!("modes.{mode}: no description or no select"));
            }
            for name in m.settings.keys() {
                if !self
                    .settings
                    .iter()
                    .any(|s| &s.name == name && s.audience == "people")
                {
                    p.push(format!(
                        "modes.{mode}.settings: {name} is not a setting for people in settings:"
                    ));
                }
            }
        }

        // Classes.
        let mut seen = BTreeSet::new();
        for c in &self.classes {
            for word in std::iter::once(&c.name).chain(&c.aliases) {
                if !seen.insert(word.clone()) {
                    p.push(format!("classes: {word} is named twice"));
                }
            }
        }
        let check_classes = |what: &str, words: &[String], p: &mut Vec<String>| {
            if words.is_empty() {
                p.push(format!("{what}: names no class"));
            }
            for w in words {
                if !self.known_class(w) {
                    p.push(format!("{what}: unknown class {w} (not in classes:)"));
                }
            }
        };
        let g = &self.guest_cluster;
        for mode in Mode::ALL {
            for (key, list) in [
                ("vm.restart", &self.vm.restart),
                ("vm.hostile", &self.vm.hostile),
                ("vm.sanity.fs", &self.vm.sanity.fs),
                ("vm.sanity.block", &self.vm.sanity.block),
                ("vm.sanity.encrypted.fs", &self.vm.sanity.encrypted.fs),
                ("vm.sanity.encrypted.block", &self.vm.sanity.encrypted.block),
                ("guest_cluster.classes", &g.classes),
            ] {
                check_classes(&format!("{key} ({mode})"), list.get(mode), &mut p);
            }
        }
        check_classes("guest_cluster.configurations", &g.configurations, &mut p);
        check_classes("guest_cluster.default_classes", &g.default_classes, &mut p);
        check_classes("guest_cluster.udev_classes", &g.udev_classes, &mut p);
        for mode in Mode::ALL {
            let mut joined: Vec<&String> = g.lanes.iter().flatten().collect();
            let mut classes: Vec<&String> = g.classes.get(mode).iter().collect();
            joined.sort();
            classes.sort();
            if g.lanes.iter().any(Vec::is_empty) || joined != classes {
                p.push(format!(
                    "guest_cluster.lanes: not guest_cluster.classes ({mode}) shared out, \
                     each class in one lane and each lane one class or more: {:?}",
                    g.lanes
                ));
            }
        }
        for mode in Mode::ALL {
            for c in g.classes.get(mode).iter().chain(&g.default_classes) {
                if !g.configurations.contains(c) {
                    p.push(format!(
                        "guest_cluster: class {c} is not among its configurations"
                    ));
                }
            }
        }
        for e in &g.not_for {
            check_classes(
                &format!("guest_cluster.not_for {}", e.scenario),
                &e.classes,
                &mut p,
            );
        }
        for e in &g.scenario_runs_only_on {
            check_classes(
                &format!("guest_cluster.scenario_runs_only_on {}", e.scenario),
                &e.classes,
                &mut p,
            );
        }
        for e in &g.class_runs_only {
            check_classes(
                "guest_cluster.class_runs_only",
                std::slice::from_ref(&e.class),
                &mut p,
            );
        }

        // Scenarios.
        let check_scenario = |what: &str, name: &str, p: &mut Vec<String>| {
            if let Some(prefix) = name.strip_suffix('*') {
                if prefix.is_empty() || !scenarios.iter().chain(extra).any(|s| s.starts_with(prefix)) {
                    p.push(format!("{what}: no scenario function matches {name}"));
                }
            } else if !scenarios.contains(name) {
                p.push(format!(
                    "{what}: no scenario {name} (no `{name}() {{` in tests/cluster/scenarios/*.sh)"
                ));
            }
        };
        for mode in Mode::ALL {
            for s in self.host_cluster.scenarios.get(mode) {
                check_scenario(&format!("host_cluster.scenarios ({mode})"), s, &mut p);
            }
            for s in g.scenarios.get(mode) {
                check_scenario(&format!("guest_cluster.scenarios ({mode})"), s, &mut p);
                if !g.default_scenarios.contains(s) && !g.extra_scenarios.contains(s) {
                    p.push(format!(
                        "guest_cluster.scenarios ({mode}): {s} is neither a default nor an extra scenario of tests/vm/cluster.sh"
                    ));
                }
            }
        }
        for s in g.default_scenarios.iter().chain(&g.extra_scenarios) {
            check_scenario("guest_cluster.default_scenarios/extra_scenarios", s, &mut p);
        }
        for e in &g.not_for {
            check_scenario("guest_cluster.not_for", &e.scenario, &mut p);
            if e.reason.trim().is_empty() {
                p.push(format!("guest_cluster.not_for {}: no reason", e.scenario));
            }
        }
        for e in &g.class_runs_only {
            for s in &e.scenarios {
                check_scenario(&format!("guest_cluster.class_runs_only {}", e.class), s, &mut p);
            }
            if e.reason.trim().is_empty() {
                p.push(format!("guest_cluster.class_runs_only {}: no reason", e.class));
            }
        }
        for e in &g.scenario_runs_only_on {
            check_scenario("guest_cluster.scenario_runs_only_on", &e.scenario, &mut p);
            if e.reason.trim().is_empty() {
                p.push(format!(
                    "guest_cluster.scenario_runs_only_on {}: no reason",
                    e.scenario
                ));
            }
        }

        // Each mode selects at least what the one before it does.
        let per_mode: [(&str, &PerMode<Vec<String>>); 9] = [
            ("vm.restart", &self.vm.restart),
            ("vm.hostile", &self.vm.hostile),
            ("vm.sanity.fs", &self.vm.sanity.fs),
            ("vm.sanity.block", &self.vm.sanity.block),
            ("vm.sanity.encrypted.fs", &self.vm.sanity.encrypted.fs),
            ("vm.sanity.encrypted.block", &self.vm.sanity.encrypted.block),
            ("host_cluster.scenarios", &self.host_cluster.scenarios),
            ("guest_cluster.classes", &g.classes),
            ("guest_cluster.scenarios", &g.scenarios),
        ];
        for (key, sel) in per_mode {
            for pair in Mode::ALL.windows(2) {
                let (small, big) = (sel.get(pair[0]), sel.get(pair[1]));
                let missing: Vec<&str> = small
                    .iter()
                    .filter(|w| !big.contains(w))
                    .map(String::as_str)
                    .collect();
                if !missing.is_empty() {
                    p.push(format!(
                        "{key}: {} selects {} that {} does not",
                        pair[0],
                        missing.join(" "),
                        pair[1]
                    ));
                }
            }
            for mode in Mode::ALL {
                let list = sel.get(mode);
                let unique: BTreeSet<&String> = list.iter().collect();
                if unique.len() != list.len() {
                    p.push(format!("{key} ({mode}): a word is named twice"));
                }
            }
        }
        for pair in Mode::ALL.windows(2) {
            for s in &self.suites {
                if s.runs_in(pair[0]) && !s.runs_in(pair[1]) {
                    p.push(format!(
                        "suites.{}: runs in {} but not in {}",
                        s.name, pair[0], pair[1]
                    ));
                }
            }
        }

        // VM parts and lanes.
        let mut parts = BTreeSet::new();
        for part in &self.vm.parts {
            if !parts.insert(&part.name) {
                p.push(format!("vm.parts: {} is named twice", part.name));
            }
            if part.lane != "A" && part.lane != "B" {
                p.push(format!("vm.parts {}: lane {:?} (A or B)", part.name, part.lane));
            }
        }

        // Suites and their budgets.
        let mut names = BTreeSet::new();
        for s in &self.suites {
            if !names.insert(&s.name) {
                p.push(format!("suites: {} is named twice", s.name));
            }
            if s.proves.trim().is_empty() || s.place.trim().is_empty() {
                p.push(format!("suites.{}: no `proves` or no `where`", s.name));
            }
            if let Some(modes) = &s.modes {
                for m in modes {
                    if let Err(e) = Mode::parse(m) {
                        p.push(format!("suites.{}: {e}", s.name));
                    }
                }
            }
            for mode in Mode::ALL.into_iter().filter(|&m| s.runs_in(m)) {
                match &s.budget {
                    None => p.push(format!("suites.{}: no budget", s.name)),
                    Some(b) if *b.get(mode) == 0 => {
                        p.push(format!("suites.{}: budget 0 in mode {mode}", s.name))
                    }
                    Some(_) => {}
                }
            }
            if s.enforced.is_none() && !s.estimated {
                p.push(format!(
                    "suites.{}: a budget neither enforced (enforced: WHAT) nor marked estimated",
                    s.name
                ));
            }
        }

        // Settings.
        let mut names = BTreeSet::new();
        for s in &self.settings {
            if !names.insert(&s.name) {
                p.push(format!("settings: {} is named twice", s.name));
            }
            if s.audience != "people" && s.audience != "internal" {
                p.push(format!(
                    "settings.{}: for {:?} (people or internal)",
                    s.name, s.audience
                ));
            }
            if s.what.trim().is_empty() || s.read_by.is_empty() {
                p.push(format!("settings.{}: no `what` or no `read_by`", s.name));
            }
        }
        p
    }

    /// What runs where in MODE, with budgets: a table for people.
    pub fn show(&self, mode: Mode) -> String {
        let mut out = String::new();
        let m = self.modes.get(mode);
        out += &format!("mode {mode} ({}): {}\n", m.select, m.description);
        for (name, value) in &m.settings {
            out += &format!("  {name}={value} unless set\n");
        }
        out += "\n";
        out += &format!("{:<14} {:>8}  {:<34} {}\n", "suite", "budget", "where", "proves");
        for s in &self.suites {
            let budget = if s.runs_in(mode) {
                match &s.budget {
                    Some(b) => format!("{}s{}", b.get(mode), if s.estimated { "~" } else { "" }),
                    None => "-".into(),
                }
            } else {
                "not run".into()
            };
            out += &format!("{:<14} {:>8}  {:<34} {}\n", s.name, budget, s.place, s.proves);
        }
        out += "(~: estimated, not enforced)\n\nVM suite (tests/vm/suite.sh)\n";
        for part in &self.vm.parts {
            out += &format!("  {} {:<11} {}\n", part.lane, part.name, part.what);
        }
        let words = |v: &[String]| v.join(" ");
        out += &format!(
            "  vm.restart                 {}\n",
            words(self.vm.restart.get(mode))
        );
        out += &format!(
            "  vm.hostile                 {}\n",
            words(self.vm.hostile.get(mode))
        );
        out += &format!(
            "  vm.sanity.fs               {}\n",
            words(self.vm.sanity.fs.get(mode))
        );
        out += &format!(
            "  vm.sanity.block            {}\n",
            words(self.vm.sanity.block.get(mode))
        );
        out += &format!(
            "  vm.sanity.encrypted.fs     {}\n",
            words(self.vm.sanity.encrypted.fs.get(mode))
        );
        out += &format!(
            "  vm.sanity.encrypted.block  {}\n",
            words(self.vm.sanity.encrypted.block.get(mode))
        );
        out += &format!(
            "\nhost cluster (tests/cluster/run.sh, loop): {}\n",
            words(self.host_cluster.scenarios.get(mode))
        );
        let g = &self.guest_cluster;
        let classes = g.classes.get(mode);
        let scenarios = g.scenarios.get(mode);
        out += "\nguest cluster (tests/vm/cluster.sh): RUN, or the reason it does not run\n";
        for s in scenarios {
            out += &format!("  {s}\n");
            for c in classes {
                match self.not_for(s, c) {
                    None => out += &format!("    {c:<12} RUN\n"),
                    Some(why) => out += &format!("    {c:<12} SKIP  {why}\n"),
                }
            }
        }
        out
    }
}
