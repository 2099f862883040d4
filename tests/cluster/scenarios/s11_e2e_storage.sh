# shellcheck shell=bash  # sourced, never run
# Scenario 11: Kubernetes' own storage e2e suites (the kit's e2e.test, "External
# Storage") against the run's class, as the reference CSI driver runs them for
# conformance; every spec that runs must pass. LOCALVOL_E2E_FOCUS and LOCALVOL_E2E_PROCS
# choose the specs and processes (tests/plan.yaml's settings). The scenario is Rust:
# tests/scenarios/e2e_storage.rs; it takes the kit's recipe (KIT) for the suites' images
# and keeps ginkgo's log in the run's LOGS.
s11_e2e_storage() { rust_scenario s11_e2e_storage KIT="$KIT" LOGS="$LOGS"; }   # lib.sh
