# shellcheck shell=bash  # sourced, never run
# Scenario 6: the daemon is SIGKILLed and its pod deleted while a workload has a
# volume mounted: the workload keeps its data, a new daemon pod becomes Ready (and is
# registered again), and the later unmount works. The scenario is Rust:
# tests/scenarios/daemon_restart.rs.
s6_daemon_restart() { rust_scenario s6_daemon_restart; }   # lib.sh
