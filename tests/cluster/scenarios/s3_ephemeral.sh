# shellcheck shell=bash  # sourced, never run
# Scenario 3: a generic ephemeral volume follows its pod; a second pod naming that pod's
# claim is refused (FailedMount with FailedPrecondition, localvol's Warning on the
# claim). The scenario is Rust: tests/scenarios/ephemeral.rs.
s3_ephemeral() { rust_scenario s3_ephemeral; }   # lib.sh
