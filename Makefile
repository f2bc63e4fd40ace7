# gpufleet: one entry point for people and CI.
#   make demo      the whole stack on this machine without a GPU (gpufleet demo up); make demo-down
#   make test      what CI runs: installs what is missing, then proves each central promise once
#                  (unit, lint, the lab tests of the engine's plan, and the nccl, engine and fleet labs
#                  with their phases marked test-full left out); prints each tier's duration and
#                  `over budget` past 40 minutes (docs/testing.md lists which test proves each promise)
#   make test-full everything: every Python, every labtest, every scenario and every lab phase
#                  (over 40 minutes; run it before resolving a change to a lab-tested path)
#   make fast      the fast tier (unit + lint, the edge's Lua specs and luacheck among them), a couple of minutes
#   make pythons   unit tests and ansible-test sanity on the other supported ansible-core lines, each on
#                  its Python (PYTHONS="3.11:2.19 3.12:2.20"; in make test-full; the main venv is 3.13:2.21)
#   make unit | lint | labtests | molecule | lab | setup | clean-lab
#   make bench-stream  the streaming benchmark (direct vs gpufleet proxy vs stock nginx)
#   make bench-planner the memory planner vs vllm-wizard vs published figures
#   make fleet-lab     the fleet lab alone: site.yml, rollouts under load (also in make molecule)
#   make bench-rollout the fleet lab with the stop-before-start baseline: requests failed during the
#                      same change without start-before-stop, beside the 0 failed with it
#   make bench-scrape  the fleet lab with the monitoring scrape-cost benchmark (tokens/s with and without)
#   make bench-routing three replicas behind the edge's router: round robin vs cache_aware vs consistent_hash
#                      on a multi-turn workload, and the router's added latency
#   make bench-models  the edge's routing by model (Lua, per-model upstreams, key scopes) and its token quota
#                      against the same site without them: added p50 at concurrency 1 and 16, 2 KB and 200 KB;
#                      then a probe's latency on the edge's worker while 8 MB answers and a 30 MB body pass,
#                      the tokens counted, and 8 clients on a small limit (BEFORE=REV: also the Lua at REV)
#   make bench-fleet   controller cost of the idempotent site.yml on 1, 4 and 8 hosts over SSH
#   make bench-engine-start  the lab engine's start time, with and without its compiled bytecode
#   make bench-ready   an engine's restart to its first token with its compile cache kept against an
#                      empty one; the model store's fan-out to the fleet lab's gpu hosts against
#                      per-host fetches from a bandwidth-limited upstream (a stand-in for the hub)
#   make gpu-check     on a real GPU machine: capture its nvidia-smi/NVML outputs as fixtures, check its GPUs' health
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
# The main venv's Python: the newest of 3.13, 3.12 and 3.11 found on PATH, in pyenv or uv
# (tests/find-python.sh); PYTHON=... picks another. 3.13 and 3.12 take CI's pins
# (requirements/constraints.txt: ansible-core 2.21, which needs 3.12 or newer); 3.11 (a fresh
# Debian 12) takes ansible-core 2.19's (requirements/core-2.19.txt), which make pythons tests.
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell for v in 3.13 3.12 3.11; do tests/find-python.sh $$v 2>/dev/null && break; done || true)
PYTHON := $(or $(PYTHON),python3)
endif
PYVER := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
PINS := $(if $(filter 3.11,$(PYVER)),requirements/core-2.19.txt,requirements/constraints.txt)
VENV ?= .venv
BIN := $(CURDIR)/$(VENV)/bin
# one stamp per Python line: another Python makes the venv again
STAMP := $(VENV)/.installed-py$(PYVER)
export PATH := $(BIN):$(PATH)
# Molecule scenario to run (default: every one under molecule/ but the benchmark).
SCENARIO ?=

.PHONY: demo demo-down test test-full fast setup unit pythons lint labtests molecule bench-stream bench-planner bench-fleet bench-engine-start bench-rollout bench-scrape bench-routing bench-models bench-ready fleet-lab lab clean-lab constraints build-collection gpu-check

# Each tier's duration is printed at the end (tests/tiers.sh), passed or not. GPUFLEET_TEST_TIER
# tells the labs which entry point runs them: `test` leaves out what is marked test-full
# (`when: lab_full` in the scenarios, `@pytest.mark.full` in the labtests); unset means full.
# make test runs the nccl lab (light hosts, no engine), the labtests (engines in plain containers)
# and the engine lab (one engine host and an outsider) at once: they share nothing but the two cores.
test:
	@GPUFLEET_TEST_TIER=test tests/tiers.sh setup lab unit lint labtests+molecule:nccl+molecule:engine molecule:fleet

test-full:
	@GPUFLEET_TEST_TIER=full tests/tiers.sh setup lab unit lint pythons labtests molecule

fast:
	@GPUFLEET_TIERS_ENTRY="make fast" tests/tiers.sh setup unit lint

# One command from a fresh machine to a streaming endpoint (installs what it needs, cached).
demo: setup
	$(BIN)/gpufleet demo up

demo-down: setup
	$(BIN)/gpufleet demo down

# On a machine with NVIDIA GPUs (no network, no Ansible needed): captures nvidia-smi and NVML
# readings as fixtures, runs gpu_facts' parsers and GPU health checks on them, prints what it found.
gpu-check:
	python3 tools/gpu-check.py

# Python environment, pinned by $(PINS) (what CI tested: constraints.txt on 3.13).
setup: $(STAMP)
$(STAMP): pyproject.toml $(PINS)
	@case "$(PYVER)" in 3.11|3.12|3.13) ;; *) echo "make setup: gpufleet needs Python 3.11, 3.12 or 3.13;" \
	  "'$(PYTHON)' is $(or $(PYVER),missing). Install 3.13 (pyenv install 3.13, uv python install 3.13) or set" \
	  "PYTHON=/path/to/python3.X" >&2; exit 1 ;; esac
	@if [ "$(PYVER)" = 3.11 ]; then echo "make setup: Python 3.11 (no 3.12 or 3.13 found): ansible-core 2.19" \
	  "from $(PINS); CI runs 2.21 on Python 3.13" >&2; fi
	@# a venv of another Python is made anew
	@[ "$$($(BIN)/python -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$(PYVER)" ] \
	  || rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade 'pip>=24'
	$(BIN)/pip install --quiet -c $(PINS) -e '.[test]'
	touch $@

constraints: $(STAMP)
	{ echo '# Exact versions CI installs in the main venv (make setup: Python 3.13, ansible-core 2.21):'; \
	  echo '# pip install -c requirements/constraints.txt -e .[test]. Regenerate with `make constraints`'; \
	  echo '# after changing pyproject.toml ranges; the other ansible-core lines: requirements/core-2.*.txt.'; \
	  $(BIN)/pip freeze --exclude-editable | grep -v '^gpufleet'; } > requirements/constraints.txt

# The lab: a Docker engine on this machine and the cached lab host image.
lab:
	tests/lab/harness.sh docker
	tests/lab/harness.sh image host >/dev/null

# On every core (pytest-xdist); the tests share no files or ports.
unit: $(STAMP)
	tests/lua/run.sh test
	$(BIN)/pytest -q -n auto

# The unit tests and ansible-test sanity on each other supported ansible-core line, on its Python
# (the main venv is Python 3.13 with 2.21), each in its own venv from its pins (tests/pythons.sh).
PYTHONS ?= 3.11:2.19 3.12:2.20
pythons:
	PYTHONS="$(PYTHONS)" tests/pythons.sh

# Tests that need the lab's Docker engine and images, outside Molecule (e.g. every rendered
# vLLM command line through vLLM's own argument parser).
labtests: $(STAMP) lab
	$(BIN)/pytest -q --durations=0 $(if $(filter test,$(GPUFLEET_TEST_TIER)),-m 'not full') tests/labtests

lint: $(STAMP)
	tests/lua/run.sh lint
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python tests/lint/check_argument_specs.py
	$(BIN)/python tools/enginespec.py --check
	$(BIN)/python tools/roledocs.py --check
	$(BIN)/python tools/archmap.py --check
	$(BIN)/ansible-lint --profile production
	BIN=$(BIN) tests/sanity/run.sh
	$(BIN)/antsibull-changelog lint
	BIN=$(BIN) tests/lint/ee_create.sh

# In make test (GPUFLEET_TEST_TIER=test) only the fleet lab proves idempotence: the other
# scenarios run molecule's sequence without that step (tests/molecule.sh).
molecule: $(STAMP) lab
	@if [ -n "$(SCENARIO)" ]; then \
	  BIN=$(BIN) tests/molecule.sh $(SCENARIO); \
	else \
	  $(BIN)/molecule test --all --exclude bench_stream; \
	fi

# Streaming benchmark (figures, not assertions): direct vs gpufleet proxy vs stock nginx at
# concurrency 1, 8 and 32, plus the stock-vs-gpufleet outcomes table. Output also lands in
# .cache/bench-stream.txt.
bench-stream: $(STAMP) lab
	$(BIN)/molecule test -s bench_stream

# The fleet lab (three lab hosts, two real engines, a rollout under load and a failed one).
fleet-lab: $(STAMP) lab
	$(BIN)/molecule test -s fleet

# The fleet lab plus its baseline: the same change on one host with engine_surge=never under the
# same load; prints both counts (figures, not assertions about speed).
bench-rollout: $(STAMP) lab
	GPUFLEET_BENCH_ROLLOUT=1 $(BIN)/molecule test -s fleet

# The fleet lab with the scrape-cost benchmark at its end: engine output tokens/s with the
# monitoring host's Prometheus stopped and scraping, alternating rounds, and their ratio.
bench-scrape: $(STAMP) lab
	GPUFLEET_BENCH_SCRAPE=1 $(BIN)/molecule test -s fleet

# The fleet lab with three vLLM replicas behind the edge's router: round robin, cache_aware and
# consistent_hash under one multi-turn workload (TTFT, throughput, the engines' prefix cache hit
# rate), and the router's added latency against nginx alone; prints a table, also in
# .cache/bench-routing.txt.
bench-routing: $(STAMP) lab
	$(BIN)/molecule destroy -s fleet
	GPUFLEET_BENCH_ROUTING=1 GPUFLEET_FLEET_VERIFY=bench_routing.yml $(BIN)/molecule converge -s fleet
	GPUFLEET_BENCH_ROUTING=1 GPUFLEET_FLEET_VERIFY=bench_routing.yml $(BIN)/molecule verify -s fleet
	$(BIN)/molecule destroy -s fleet

# What routing by model and the token quota add at the edge: the edge role's site with its Lua step,
# and with a usage store (redis-server) and a key limit, against the same site without them (real
# nginx in a lab host container, fixed responders behind them, rotating rounds); prints a table,
# also in .cache/bench-models.txt.
bench-models: $(STAMP) lab
	$(BIN)/python tests/bench/models_bench.py
	$(BIN)/python tests/bench/edge_payloads.py $(if $(BEFORE),--before $(BEFORE))

# site.yml's controller cost on 1, 4 and 8 light lab hosts over SSH (and mitogen, opt-in);
# prints a table, also in .cache/bench-fleet.txt.
bench-fleet: $(STAMP) lab
	$(BIN)/python tests/bench/fleet_bench.py

# The lab's vLLM CPU engine (compilation on) restarting to its first token on its kept compile cache
# against an empty one (.cache/bench-cache-start.txt), then the model store's fan-out to the fleet
# lab's gpu hosts against every host fetching from a bandwidth-limited upstream (a stand-in for the
# hub); prints tables, also in .cache/bench-ready.txt.
bench-ready: $(STAMP) lab
	$(BIN)/python tests/bench/cache_start.py .cache/bench-cache-start.txt
	$(BIN)/molecule destroy -s fleet
	GPUFLEET_FLEET_VERIFY=bench_ready.yml $(BIN)/molecule converge -s fleet
	GPUFLEET_FLEET_VERIFY=bench_ready.yml $(BIN)/molecule verify -s fleet
	$(BIN)/molecule destroy -s fleet

# The lab's vLLM CPU engine from docker run to /health, with and without the image's bytecode.
bench-engine-start: $(STAMP) lab
	$(BIN)/python tests/bench/engine_start.py

# Memory planner vs vllm-wizard (PyPI) vs published figures, in one run; prints a table.
WIZARD_VENV := .cache/bench/wizard-venv
bench-planner: $(STAMP)
	test -x $(WIZARD_VENV)/bin/python || python3 -m venv $(WIZARD_VENV)
	$(WIZARD_VENV)/bin/pip install -q vllm-wizard==0.2.0
	$(BIN)/python tests/bench/planner_compare.py $(WIZARD_VENV)/bin/python | tee .cache/bench-planner.txt

build-collection: $(STAMP)
	$(BIN)/ansible-galaxy collection build --force --output-path .cache/dist

clean-lab:
	tests/lab/harness.sh clean
