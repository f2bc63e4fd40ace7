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
# each tier's output is also kept here, so a failure's own lines can be printed again at the end
# (CI keeps only the tail of the log, which is otherwise the labs' teardown)
logs=$(mktemp -d "${TMPDIR:-/tmp}/gpufleet-tiers.XXXXXX")
trap 'rm -rf "$logs"' EXIT
failed_log=

fmt() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

run_tier() {
  local name=$1; shift
  local t0 rc
  t0=$(date +%s)
  local log
  log="$logs/$(printf '%s' "$name" | tr -c 'A-Za-z0-9_-' _).log"
  printf '\n=== tier %s: %s\n' "$name" "$*"
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  # a passed tier's output is not needed again
  if [ $rc -eq 0 ]; then rm -f "$log"; else failed_log=$log; fi
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

if [ -n "$failed_log" ]; then
  # Ansible's failed tasks (their names and messages) and pytest's failures, each cut to 600 characters
  printf '\n=== what failed (from %s)\n' "$failed_log"
  grep -E -B3 'fatal: \[|failed: \[|FAILED!|^(FAILED|ERROR) |^E  ' "$failed_log" | grep -v -E '^\s*$' \
    | tail -n 40 | cut -c1-600
fi

printf '\n=== make test: durations on %s (%s cores)\n' "$(hostname)" "$(nproc)"
for row in "${rows[@]}"; do echo "  $row"; done
printf '  %-22s %8s  %s\n' total "$(fmt $(($(date +%s) - started)))" "$([ $status -eq 0 ] && echo passed || echo FAILED)"
exit $status
