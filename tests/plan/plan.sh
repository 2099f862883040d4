# shellcheck shell=bash  # sourced, never run
# tests/plan/plan.sh - the test plan (tests/plan.yaml) for the test scripts. Sourced, it
# finds the `plan` binary tests/all.sh built (LOCALVOL_PLAN) or, run alone, builds it
# (cargo build -q --locked -p localvol-plan), and exports LOCALVOL_PLAN for the scripts
# and guests started from here (a guest's / is the host's, the target dir is shared).
#   plan ARGS...                   the binary (plan --help)
#   plan_words ARRAY ARGS...       ARRAY=(the words plan ARGS prints); fails as plan does
if [ -z "${LOCALVOL_PLAN:-}" ] || [ ! -x "$LOCALVOL_PLAN" ]; then
  LOCALVOL_PLAN=$(
    cd "$(dirname "${BASH_SOURCE[0]}")/../.." &&
      cargo build -q --locked -p localvol-plan >&2 &&
      echo "$(realpath "${CARGO_TARGET_DIR:-target}")/debug/plan"
  ) || { echo "$0: cannot build tests/plan (cargo build --locked -p localvol-plan)" >&2; exit 1; }
  export LOCALVOL_PLAN
fi
plan() { "$LOCALVOL_PLAN" "$@"; }
plan_words() {
  local -n plan_into=$1
  local out
  shift
  out=$(plan "$@") || return 1
  # shellcheck disable=SC2034  # the caller's array, by name
  read -r -a plan_into <<<"$out"
}
