# shellcheck shell=bash  # sourced, never run
# Scenario 8: the daemon's API footprint grows with its own node's claims only, read
# from the API server's audit log. The scenario is Rust: tests/scenarios/api_load.rs.
s8_api_load() { rust_scenario s8_api_load; }   # lib.sh
