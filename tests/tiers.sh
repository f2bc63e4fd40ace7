#!/usr/bin/env bash
# Runs `make test`'s tiers in order and prints each one's duration at the end, whether the
# run passed or stopped at a failing tier (CI keeps the last lines of the log).
#   tests/tiers.sh TIER [TIER ...]   each TIER is a make target; molecule runs one scenario
#                                    at a time so every scenario gets its own line.
set -uo pipefail
cd "$(dirname "$0")/.."

declare -a rows=()
started=$(date +%s)
status=0

fmt() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

run_tier() {
  local name=$1; shift
  local t0 rc
  t0=$(date +%s)
  printf '\n=== tier %s: %s\n' "$name" "$*"
  "$@"
  rc=$?
  rows+=("$(printf '%-22s %8s  %s' "$name" "$(fmt $(($(date +%s) - t0)))" "$([ $rc -eq 0 ] && echo passed || echo "FAILED (exit $rc)")")")
  return $rc
}

scenarios() {
  # Every scenario under molecule/ except the benchmark (make bench-stream), in the order
  # make test runs them: light labs first, so a broken preflight fails in minutes.
  local order=(nccl gpu_stack engine fleet)
  local s
  for s in "${order[@]}"; do [ -f "molecule/$s/molecule.yml" ] && echo "$s"; done
  for s in molecule/*/molecule.yml; do
    s=$(basename "$(dirname "$s")")
    [[ " ${order[*]} bench_stream " == *" $s "* ]] || echo "$s"
  done
}

for tier in "$@"; do
  if [ "$tier" = molecule ]; then
    for s in $(scenarios); do
      run_tier "molecule $s" make --no-print-directory molecule SCENARIO="$s" || { status=$?; break 2; }
    done
  else
    run_tier "$tier" make --no-print-directory "$tier" || { status=$?; break; }
  fi
done

printf '\n=== make test: durations on %s (%s cores)\n' "$(hostname)" "$(nproc)"
for row in "${rows[@]}"; do echo "  $row"; done
printf '  %-22s %8s  %s\n' total "$(fmt $(($(date +%s) - started)))" "$([ $status -eq 0 ] && echo passed || echo FAILED)"
exit $status
