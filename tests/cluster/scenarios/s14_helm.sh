# shellcheck shell=bash  # sourced, never run
# Scenario 14: the Helm chart (deploy/helm/localvol): each ci/ values file accepted by
# the API server; helm install in place of the overlay, a claim, helm upgrade and
# rollback with the volume still served, helm uninstall leaving nothing; the overlay
# again. The loop class, on the host's node. The scenario is Rust:
# tests/scenarios/helm_install.rs.
s14_helm() { rust_scenario s14_helm; }   # lib.sh
