//! What tests/plan.yaml selects for this run, for a test that picks its own classes (the
//! plan's `vm.restart`, `vm.hostile`): in the mode LOCALVOL_FULL and LOCALVOL_SOAK set,
//! with a person's LOCALVOL_SELECT, as `plan get` answers the scripts.

use localvol_plan::{Mode, Overrides, Plan};

/// The classes the selection `key` names for this run; a plan or LOCALVOL_SELECT that
/// cannot be read, or that names no class, fails the test.
pub fn classes(key: &str) -> Vec<String> {
    let path = Plan::default_path();
    let plan = Plan::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    let mode = Mode::from_env(
        std::env::var("LOCALVOL_FULL").ok().as_deref(),
        std::env::var("LOCALVOL_SOAK").ok().as_deref(),
    );
    let overrides = Overrides::from_env().unwrap_or_else(|e| panic!("{e:#}"));
    let classes = plan
        .select(key, mode, &overrides)
        .unwrap_or_else(|e| panic!("{key}: {e:#}"));
    assert!(!classes.is_empty(), "{key} selects no class in mode {mode}");
    classes
}
