#!/usr/bin/python
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_placement
short_description: Read where each engine instance's processes may run, from the kernel
version_added: "0.2.0"
description:
  - For each engine instance, finds its container's main process (C(docker inspect)) and reads
    its placement as the kernel holds it, not as gpufleet configured it, the container's cpuset
    cgroup's effective CPUs and memory nodes (cgroup v1 C(cpuset.effective_cpus) and
    C(cpuset.effective_mems); cgroup v2 C(cpuset.cpus.effective) and C(cpuset.mems.effective)),
    and the process's C(Cpus_allowed_list) and C(Mems_allowed_list) from C(/proc/PID/status).
  - An instance whose container does not run is reported with C(pid) null.
  - Read-only; runs the same in check mode. Used by C(playbooks/status.yml) (C(gpufleet status)).
author:
  - gpufleet contributors (!UNKNOWN)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
options:
  names:
    description:
      - The engine instances (their names in C(gpufleet_engines)). Each one's container is
        C(container_prefix) followed by the name.
    type: list
    elements: str
    required: true
  container_prefix:
    description:
      - What the engine role puts before an instance's name to name its container.
    type: str
    default: gpufleet-
  cgroup_root:
    description:
      - Where the cgroup filesystems are mounted. Only changed for tests or chroots.
    type: path
    default: /sys/fs/cgroup
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Read where the engines run
  gpufleet.serving.engine_placement:
    names: [llama-70b, qwen-7b]
  register: placement

- name: Show the first one's effective CPUs
  ansible.builtin.debug:
    msg: "{{ placement.placement['llama-70b'].cpus }}"
"""

RETURN = r"""
placement:
  description: Per instance name, what the kernel holds for its container's main process.
  returned: always
  type: dict
  contains:
    pid:
      description: The container's main process (host PID namespace); null when it does not run.
      type: int
    cgroup_version:
      description: 1 (a v1 cpuset hierarchy) or 2 (the unified hierarchy).
      type: int
    cgroup:
      description: The process's cpuset cgroup, as C(/proc/PID/cgroup) names it.
      type: str
    cpus:
      description: The cgroup's effective CPUs (kernel list format, e.g. C(0-15,32-47)).
      type: str
    mems:
      description: The cgroup's effective memory (NUMA) nodes.
      type: str
    process_cpus:
      description: The process's C(Cpus_allowed_list).
      type: str
    process_mems:
      description: The process's C(Mems_allowed_list).
      type: str
    problem:
      description: What could not be read, or null.
      type: str
  sample:
    tiny:
      pid: 4242
      cgroup_version: 1
      cgroup: /docker/7e03...
      cpus: "1"
      mems: "0"
      process_cpus: "1"
      process_mems: "0"
      problem: null
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils._placement import read


def container_pid(module, docker, container):
    """(pid or None, problem or None) of a running container."""
    rc, out, err = module.run_command([docker, "inspect", "-f", "{{.State.Running}} {{.State.Pid}}", container])
    if rc != 0:
        return None, (err or out).strip() or "docker inspect %s: rc %d" % (container, rc)
    running, _sep, pid = out.strip().partition(" ")
    if running != "true" or not pid.isdigit() or int(pid) == 0:
        return None, "container %s does not run" % container
    return int(pid), None


def main():
    module = AnsibleModule(
        argument_spec={
            "names": {"type": "list", "elements": "str", "required": True},
            "container_prefix": {"type": "str", "default": "gpufleet-"},
            "cgroup_root": {"type": "path", "default": "/sys/fs/cgroup"},
        },
        supports_check_mode=True,
    )
    docker = module.get_bin_path("docker")
    placement = {}
    for name in module.params["names"]:
        if docker is None:
            placement[name] = {"pid": None, "problem": "docker is not installed on this host"}
            continue
        pid, problem = container_pid(module, docker, module.params["container_prefix"] + name)
        placement[name] = (
            read(pid, cgroup_root=module.params["cgroup_root"]) if pid else {"pid": None, "problem": problem}
        )
    module.exit_json(changed=False, placement=placement)


if __name__ == "__main__":
    main()
