#!/usr/bin/env bash
# Runs `make test`'s (or `make test-full`'s) tiers in order and prints each one's duration at
# the end, whether the run passed or stopped at a failing tier (CI keeps the last lines of the
# log), and `over budget` when the total passes the entry point's budget.
#   tests/tiers.sh TIER [TIER ...]   each TIER is a make target, or molecule:SCENARIO for one
#                                    scenario; molecule runs every scenario one at a time, so each
#                                    gets its own line. TIER+TIER runs tiers at once (light labs
#                                    that share nothing), each with its own log and line.
# GPUFLEET_TEST_TIER: test (make test: 40 minutes, the scenarios that prove the central promises)
# or full (make test-full, the default: 100 minutes, every scenario).
set -uo pipefail
cd "$(dirname "$0")/.."

export GPUFLEET_TEST_TIER=${GPUFLEET_TEST_TIER:-full}
# the entry point's name in the summary (make fast names itself)
case "$GPUFLEET_TEST_TIER" in
  test) entry=${GPUFLEET_TIERS_ENTRY:-make test}; budget=$((40 * 60)) ;;
  full) entry=${GPUFLEET_TIERS_ENTRY:-make test-full}; budget=$((100 * 60)) ;;
  *) echo "GPUFLEET_TEST_TIER=$GPUFLEET_TEST_TIER: use test (make test) or full (make test-full)" >&2; exit 2 ;;
esac
declare -a rows=()
started=$(date +%s)
status=0
# each tier's output is also kept here, so a failure's own lines can be printed again at the end
# (CI keeps only the tail of the log, which is otherwise the labs' teardown)
logs=$(mktemp -d "${TMPDIR:-/tmp}/gpufleet-tiers.XXXXXX")
trap 'rm -rf "$logs"' EXIT
failed_log=

fmt() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
log_of() { printf '%s/%s.log' "$logs" "$(printf '%s' "$1" | tr -c 'A-Za-z0-9_-' _)"; }

run_tier() {
  local name=$1; shift
  local t0 rc
  t0=$(date +%s)
  local log
  log=$(log_of "$name")
  printf '\n=== tier %s: %s\n' "$name" "$*"
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  # a passed tier's output is not needed again
  if [ $rc -eq 0 ]; then rm -f "$log"; else failed_log=$log; fi
  rows+=("$(printf '%-22s %8s  %s' "$name" "$(fmt $(($(date +%s) - t0)))" "$([ $rc -eq 0 ] && echo passed || echo "FAILED (exit $rc)")")")
  return $rc
}

command_of() {  # the command a tier name stands for
  case "$1" in
    molecule:*) echo make --no-print-directory molecule SCENARIO="${1#molecule:}" ;;
    *) echo make --no-print-directory "$1" ;;
  esac
}

run_group() {
  # Tiers at once: each writes its own log, printed whole once all have ended (interleaved lines
  # would be unreadable), and gets its own line with its own duration.
  local t0 name log rc secs grc=0
  t0=$(date +%s)
  printf '\n=== tiers at once: %s\n' "$*"
  for name in "$@"; do
    log=$(log_of "$name")
    # shellcheck disable=SC2046
    ( s=$(date +%s); $(command_of "$name") >"$log" 2>&1; echo "$? $(($(date +%s) - s))" >"$log.rc" ) &
  done
  wait
  for name in "$@"; do
    log=$(log_of "$name")
    printf '\n=== tier %s: %s (ran at once with: %s)\n' "$name" "$(command_of "$name")" "$*"
    cat "$log"
    read -r rc secs <"$log.rc" || { rc=1; secs=$(($(date +%s) - t0)); }
    rm -f "$log.rc"
    if [ "$rc" -eq 0 ]; then rm -f "$log"; else failed_log=$log; grc=$rc; fi
    rows+=("$(printf '%-22s %8s  %s' "$name" "$(fmt "$secs")" "$([ "$rc" -eq 0 ] && echo passed || echo "FAILED (exit $rc)")")")
  done
  rows+=("$(printf '%-22s %8s  %s' "  (at once, wall)" "$(fmt $(($(date +%s) - t0)))" "$*")")
  return $grc
}

scenarios() {
  # The tier `molecule` (make test-full): every scenario under molecule/ except the benchmark
  # (make bench-stream), light labs first, so a broken preflight fails in minutes. make test names
  # its three scenarios itself (molecule:nccl, molecule:engine, molecule:fleet).
  local s
  local order=(nccl gpu_stack engine fleet)
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
  elif [[ "$tier" == *+* ]]; then
    IFS=+ read -r -a group <<<"$tier"
    run_group "${group[@]}" || { status=$?; break; }
  else
    # shellcheck disable=SC2046
    run_tier "$tier" $(command_of "$tier") || { status=$?; break; }
  fi
done

if [ -n "$failed_log" ]; then
  # Ansible's failed tasks (their names and messages) and pytest's failures, each cut to 600 characters
  printf '\n=== what failed (from %s)\n' "$failed_log"
  grep -E -B3 'fatal: \[|failed: \[|FAILED!|^(FAILED|ERROR) |^E  ' "$failed_log" | grep -v -E '^\s*$' \
    | tail -n 40 | cut -c1-600
fi

total=$(($(date +%s) - started))
printf '\n=== %s: durations on %s (%s cores)\n' "$entry" "$(hostname)" "$(nproc)"
for row in "${rows[@]}"; do echo "  $row"; done
printf '  %-22s %8s  %s\n' total "$(fmt $total)" "$([ $status -eq 0 ] && echo passed || echo FAILED)"
# the budget is a figure to keep in sight, not a test: a run past it still passes or fails on its tests
if [ $total -gt $budget ]; then
  printf '  over budget: %s took %s, its budget is %s (docs/testing.md: what runs where)\n' \
    "$entry" "$(fmt $total)" "$(fmt $budget)"
fi
exit $status
