#!/usr/bin/env bash
# One Molecule scenario, the way the entry point that runs it wants it:
#   tests/molecule.sh SCENARIO
# make test-full (GPUFLEET_TEST_TIER unset or full) runs `molecule test`: the whole sequence in
# the scenario's molecule.yml. make test (GPUFLEET_TEST_TIER=test) proves idempotence once, in the
# fleet lab (site.yml from bare on three hosts, then a second run with changed=0); the other
# scenarios run the same sequence without the idempotence step, and are destroyed whatever
# happened, as `molecule test` does.
set -uo pipefail
cd "$(dirname "$0")/.."
scenario=${1:?scenario}
molecule=${BIN:-$PWD/.venv/bin}/molecule
if [ "${GPUFLEET_TEST_TIER:-full}" != test ] || [ "$scenario" = fleet ]; then
  exec "$molecule" test -s "$scenario"
fi
rc=0
"$molecule" destroy -s "$scenario" || exit $?
for step in create prepare converge verify; do
  "$molecule" "$step" -s "$scenario" || { rc=$?; break; }
done
"$molecule" destroy -s "$scenario" || [ $rc -ne 0 ] || rc=$?
exit $rc
