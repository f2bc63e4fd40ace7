#!/usr/bin/env bash
# One Molecule scenario, the way the entry point that runs it wants it:
#   tests/molecule.sh SCENARIO
# make test-full (GPUFLEET_TEST_TIER unset or full) runs `molecule test`: the whole sequence in
# the scenario's molecule.yml. make test (GPUFLEET_TEST_TIER=test) proves idempotence once, in the
# fleet lab (site.yml from bare on three hosts, then a second run with changed=0); the other
# scenarios run their own test_sequence (nccl's side_effect, its gate, included) step by step
# without the idempotence step, and are destroyed whatever happened, as `molecule test` does.
set -uo pipefail
cd "$(dirname "$0")/.."
scenario=${1:?scenario}
bin=${BIN:-$PWD/.venv/bin}
if [ "${GPUFLEET_TEST_TIER:-full}" != test ] || [ "$scenario" = fleet ]; then
  exec "$bin/molecule" test -s "$scenario"
fi
# the scenario's test_sequence, else the one every scenario inherits (.config/molecule/config.yml)
steps=$("$bin/python" - "$scenario" <<'PY'
import sys, yaml
def seq(path):
    with open(path) as f:
        return ((yaml.safe_load(f) or {}).get("scenario") or {}).get("test_sequence")
steps = seq(f"molecule/{sys.argv[1]}/molecule.yml") or seq(".config/molecule/config.yml")
if not steps:
    sys.exit(f"molecule/{sys.argv[1]}: no test_sequence in its molecule.yml or .config/molecule/config.yml")
# the steps as molecule's commands spell them (side_effect is `molecule side-effect`)
print(" ".join(s.replace("_", "-") for s in steps if s != "idempotence"))
PY
) || exit 2
echo "molecule.sh: $scenario without idempotence (make test): $steps"
rc=0
for step in $steps; do
  "$bin/molecule" "$step" -s "$scenario" || { rc=$?; break; }
done
if [ $rc -ne 0 ]; then "$bin/molecule" destroy -s "$scenario" || true; fi
exit $rc
