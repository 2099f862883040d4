# shellcheck shell=bash  # sourced, never run
# Scenario 13: encryption at rest under a real kubelet: a LUKS2 claim's pod on its
# dm-crypt mapping, no plaintext on the LV, the data kept through a second stage, online
# growth, and a Secret without a passphrase refused on its claim. Needs device-mapper
# (the guest's lvm-thin class). The scenario is Rust: tests/scenarios/encryption.rs.
s13_encryption() { rust_scenario s13_encryption; }   # lib.sh
