#!/usr/bin/python
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_phase
short_description: Read where each engine instance is in its start, from its engine's log
version_added: "0.2.0"
description:
  - For each engine instance, reads when its container started (C(docker inspect)) and its engine's
    log (C(docker logs --timestamps)), and says which start phase it is in (initializing, loading weights,
    profiling memory, compiling, capturing graphs, warming up, starting server, serving), for how long,
    and how long each phase before it took. The log lines that begin each phase are the engine
    registry's (C(module_utils/_engine_options.py), per engine).
  - The engine of an instance is read from the C(deployed.json) the engine role writes in its folder
    (vLLM when there is none). Reading stops at the line that says the engine serves, or after
    O(max_bytes) bytes of log.
  - An instance whose container does not run is reported with C(running) false and no phase.
  - Read-only; runs the same in check mode. Used by C(playbooks/status.yml) (C(gpufleet status)) and the
    engine role's readiness check (each restart prints how the instance started).
author:
  - gpufleet contributors (!UNKNOWN)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
options:
  names:
    description:
      - The engine instances (their names in C(gpufleet_engines)).
    type: list
    elements: str
    required: true
  surge:
    description:
      - Read the instances' surge copies (container C(PREFIXNAME-surge)) instead of the instances.
    type: bool
    default: false
  container_prefix:
    description:
      - What the engine role puts before an instance's name to name its container.
    type: str
    default: gpufleet-
  config_dir:
    description:
      - The engine role's folder of per-instance files (its C(engine_config_dir)), where each instance's
        C(deployed.json) names its engine.
    type: path
    default: /etc/gpufleet/engines
  max_bytes:
    description:
      - The most bytes of each log read (a start's log is some tens of kilobytes; a long-serving engine's
        log goes on with its requests, and reading stops at the line that says it serves).
    type: int
    default: 4194304
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Read how the engines started
  gpufleet.serving.engine_phase:
    names: [llama-70b, qwen-7b]
  register: phases

- name: Show the first one's
  ansible.builtin.debug:
    msg: "{{ phases.phases['llama-70b'].summary }}"
"""

RETURN = r"""
phases:
  description: Per instance name, where its start is.
  returned: always
  type: dict
  contains:
    container:
      description: The container read.
      type: str
    running:
      description: Whether the container runs.
      type: bool
    engine:
      description: The instance's engine, whose log lines were read.
      type: str
    started_at:
      description: When the container started (Docker's C(State.StartedAt)).
      type: str
    phase:
      description: The phase it is in (C(serving) once its log says it serves); null when the container does not run.
      type: str
    note:
      description: What the phase's log line adds (e.g. compiled artefacts loaded from the cache), or null.
      type: str
    phase_s:
      description: Seconds in the current phase (null once it serves).
      type: float
    elapsed_s:
      description: Seconds since the container started.
      type: float
    ready_s:
      description: Seconds from the container's start to serving (null while it starts).
      type: float
    phases:
      description: Each phase in turn, with C(phase), C(note), C(start_s) (seconds after the container started) and
        C(seconds) (how long it took; the current one's so far).
      type: list
      elements: dict
    line:
      description: The last log line that began a phase (cut to 240 characters).
      type: str
    summary:
      description: All of it in one sentence.
      type: str
    problem:
      description: What could not be read, or null.
      type: str
  sample:
    tiny:
      container: gpufleet-tiny
      running: true
      engine: vllm
      started_at: "2026-12-07T21:24:03.479507558Z"
      phase: compiling
      note: null
      phase_s: 12.4
      elapsed_s: 50.1
      ready_s: null
      phases:
        - {phase: initializing, note: null, start_s: 0.0, seconds: 33.5}
        - {phase: loading weights, note: null, start_s: 33.5, seconds: 0.1}
        - {phase: profiling memory, note: null, start_s: 33.6, seconds: 1.3}
        - {phase: compiling, note: null, start_s: 34.9, seconds: 12.4}
      line: "(Worker pid=130) INFO 12-07 21:24:38 [cpu_model_runner.py:87] Warming up model for the compilation..."
      summary: "compiling for 12.4 s (up 50.1 s): initializing 33.5 s, ..."
      problem: null
"""

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import INSTANCE_DEFAULTS
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_phase import docker_time, start_phases

# the log through `head -c`: reading stops after max_bytes (docker logs ends on the closed pipe)
READ_LOG = '"$1" logs --timestamps "$2" 2>&1 | head -c "$3"'


def engine_of(config_dir, name):
    """The instance's engine from its deployed.json (the registry's default without one)."""
    try:
        with open(os.path.join(config_dir, name, "deployed.json")) as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        record = None
    engine = record.get("engine") if isinstance(record, dict) else None
    return engine if isinstance(engine, str) and engine else INSTANCE_DEFAULTS["engine"]


def read(module, docker, container, engine, max_bytes):
    """The start of one container (its phase record, or running false with the problem)."""
    out = {"container": container, "engine": engine, "running": False, "started_at": None, "phase": None,
           "problem": None}  # fmt: skip
    rc, text, err = module.run_command([docker, "inspect", "-f", "{{.State.Running}} {{.State.StartedAt}}", container])
    if rc != 0:
        out["problem"] = (err or text).strip() or "docker inspect %s: rc %d" % (container, rc)
        return out
    running, _sep, started = text.strip().partition(" ")
    out["started_at"] = started or None
    if running != "true":
        out["problem"] = "container %s does not run" % container
        return out
    out["running"] = True
    rc, log, err = module.run_command(["/bin/sh", "-c", READ_LOG, "engine_phase", docker, container, str(max_bytes)])
    now = time.time()
    if rc != 0 and not log:
        out["problem"] = (err or "").strip() or "docker logs %s: rc %d" % (container, rc)
        return out
    out.update(start_phases(log.splitlines(), engine, started_at=docker_time(started), now=now))
    return out


def main():
    module = AnsibleModule(
        argument_spec={
            "names": {"type": "list", "elements": "str", "required": True},
            "surge": {"type": "bool", "default": False},
            "container_prefix": {"type": "str", "default": "gpufleet-"},
            "config_dir": {"type": "path", "default": "/etc/gpufleet/engines"},
            "max_bytes": {"type": "int", "default": 4194304},
        },
        supports_check_mode=True,
    )
    params = module.params
    docker = module.get_bin_path("docker")
    phases = {}
    for name in params["names"]:
        container = params["container_prefix"] + name + ("-surge" if params["surge"] else "")
        engine = engine_of(params["config_dir"], name)
        if docker is None:
            phases[name] = {"container": container, "engine": engine, "running": False, "started_at": None,
                            "phase": None, "problem": "docker is not installed on this host"}  # fmt: skip
            continue
        phases[name] = read(module, docker, container, engine, params["max_bytes"])
    module.exit_json(changed=False, phases=phases)


if __name__ == "__main__":
    main()
