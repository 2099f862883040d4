//! `plan`: reads tests/plan.yaml, the test suite's one list of what runs where, and
//! answers the scripts' questions about it (see the head of tests/plan.yaml).

use localvol_plan as plan;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};

use plan::{Mode, Overrides, Plan, scenario_number};

const USAGE: &str = "usage: plan [--plan FILE] COMMAND
  check                                validate the plan
  show [--mode M]                      what runs where in mode M, with budgets
  get KEY [--mode M] [--sep S] [--numbers]
                                       a selection, words separated by S (a space)
  not-for SCENARIO CLASS               the reason SCENARIO does not run on CLASS (exit 0),
                                       or exit 1 when it runs
  skips CLASS,... SCENARIO...          \"SCENARIO CLASS REASON\" lines (tab-separated)
                                       for each pair that does not run
  budget SUITE [--mode M]              seconds
The mode defaults from LOCALVOL_FULL and LOCALVOL_SOAK as tests/all.sh sets it.
LOCALVOL_SELECT='KEY=CLASS,...;...' replaces `get`'s selections of classes for a run.
The plan: --plan FILE, else LOCALVOL_PLAN_FILE, else tests/plan.yaml.
Keys: vm.parts vm.lanes.A vm.lanes.B vm.restart vm.hostile vm.sanity.fs vm.sanity.block
  vm.sanity.encrypted.fs vm.sanity.encrypted.block host_cluster.scenarios
  guest_cluster.classes guest_cluster.scenarios guest_cluster.configurations
  guest_cluster.udev_classes guest_cluster.lanes (1 2 ...) guest_cluster.lanes.N
  guest_cluster.default_classes guest_cluster.default_scenarios
  guest_cluster.extra_scenarios suites settings.NAME (a mode's value of setting NAME)";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("plan: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The default plan file: tests/plan.yaml.
fn default_plan() -> PathBuf {
    Plan::default_path()
}

/// The functions (`NAME() {` at a line's start) the shell files define.
pub fn shell_functions<'a>(files: impl IntoIterator<Item = &'a Path>) -> Result<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    for file in files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
        for line in text.lines() {
            if let Some((name, _)) = line.split_once("() {")
                && !name.is_empty()
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            {
                names.insert(name.to_string());
            }
        }
    }
    Ok(names)
}

/// Every problem of the plan at PATH, its scenarios looked for in the repository
/// around it (tests/plan.yaml: the repository is its directory's parent).
pub fn check(plan: &Plan, path: &Path) -> Result<Vec<String>> {
    let repo = path
        .canonicalize()
        .with_context(|| format!("cannot find {}", path.display()))?
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .context("the plan file has no repository around it")?;
    let dir = repo.join("tests/cluster/scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "sh"))
        .collect();
    files.sort();
    let scenarios = shell_functions(files.iter().map(PathBuf::as_path))?;
    let extra_files: Vec<PathBuf> = plan.extra_scenario_files.iter().map(|f| repo.join(f)).collect();
    let extra = shell_functions(extra_files.iter().map(PathBuf::as_path))?;
    Ok(plan.problems(&scenarios, &extra))
}

struct Args {
    words: Vec<String>,
    mode: Option<Mode>,
    sep: String,
    numbers: bool,
}

fn parse_args(args: Vec<String>) -> Result<(Option<PathBuf>, Args)> {
    let mut plan = None;
    let mut out = Args {
        words: Vec::new(),
        mode: None,
        sep: " ".into(),
        numbers: false,
    };
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--plan" => plan = Some(PathBuf::from(it.next().context("--plan FILE")?)),
            "--mode" => out.mode = Some(Mode::parse(&it.next().context("--mode ci|full|soak")?)?),
            "--sep" => out.sep = it.next().context("--sep SEPARATOR")?,
            "--numbers" => out.numbers = true,
            "-h" | "--help" => out.words = vec!["help".into()],
            _ if a.starts_with("--") => bail!("unknown option {a}\n{USAGE}"),
            _ => out.words.push(a),
        }
    }
    Ok((plan, out))
}

fn run(args: Vec<String>) -> Result<ExitCode> {
    let (path, args) = parse_args(args)?;
    let words: Vec<&str> = args.words.iter().map(String::as_str).collect();
    if matches!(words.first(), None | Some(&"help")) {
        println!("{USAGE}");
        return Ok(ExitCode::SUCCESS);
    }
    let path = path
        .or_else(|| std::env::var_os("LOCALVOL_PLAN_FILE").map(PathBuf::from))
        .unwrap_or_else(default_plan);
    let plan = Plan::load(&path)?;
    let mode = args.mode.unwrap_or_else(|| {
        Mode::from_env(
            std::env::var("LOCALVOL_FULL").ok().as_deref(),
            std::env::var("LOCALVOL_SOAK").ok().as_deref(),
        )
    });
    match words.as_slice() {
        ["check"] => {
            let problems = check(&plan, &path)?;
            if problems.is_empty() {
                println!("plan: {} is valid", path.display());
                Ok(ExitCode::SUCCESS)
            } else {
                for p in &problems {
                    eprintln!("plan: {}: {p}", path.display());
                }
                Ok(ExitCode::FAILURE)
            }
        }
        ["show"] => {
            print!("{}", plan.show(mode));
            Ok(ExitCode::SUCCESS)
        }
        ["get", key] => {
            let list = plan.select(key, mode, &Overrides::from_env()?)?;
            let list: Vec<&str> = list
                .iter()
                .map(|w| {
                    if args.numbers {
                        scenario_number(w)
                    } else {
                        w.as_str()
                    }
                })
                .collect();
            println!("{}", list.join(&args.sep));
            Ok(ExitCode::SUCCESS)
        }
        ["not-for", scenario, class] => match plan.not_for(scenario, class) {
            Some(why) => {
                println!("{why}");
                Ok(ExitCode::SUCCESS)
            }
            None => Ok(ExitCode::FAILURE),
        },
        ["skips", classes, scenarios @ ..] => {
            for class in classes.split(',').filter(|c| !c.is_empty()) {
                for s in scenarios {
                    if let Some(why) = plan.not_for(s, class) {
                        println!("{s}\t{class}\t{why}");
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        ["budget", suite] => {
            println!("{}", plan.budget(suite, mode)?);
            Ok(ExitCode::SUCCESS)
        }
        _ => bail!("unknown command line {}\n{USAGE}", args.words.join(" ")),
    }
}
