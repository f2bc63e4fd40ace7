#!/usr/bin/python
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_health_reader
short_description: Install gpufleet's GPU and engine health reader on the host, for its host-side scripts
version_added: "0.3.0"
description:
  - Writes the collection's health reader (C(plugins/module_utils/_gpu_health.py)) to I(dest) as a
    Python module, for the scripts that run on the host outside Ansible (the engine watchdog
    imports it to read DCGM's and the engine's Prometheus metrics).
  - The reader travels to the host inside this module's payload, the way Ansible ships every
    module's shared code, so the role that installs it does not reach into the collection's
    folders by path, and an installed collection or an execution environment work the same.
  - Writes only when the file differs (atomically); check mode and diff mode show what would change.
author:
  - gpufleet contributors (!UNKNOWN)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.files
options:
  dest:
    description:
      - Where the reader goes (a C(.py) file beside the script that imports it).
    type: path
    required: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Install the health reader beside the watchdog
  gpufleet.serving.gpu_health_reader:
    dest: /usr/local/libexec/gpufleet/_gpu_health.py
    owner: root
    group: root
    mode: "0644"
"""

RETURN = r"""
dest:
  description: The file written (or that would be written in check mode).
  returned: always
  type: str
checksum:
  description: SHA-1 of the reader's source, as Ansible's C(stat) reports it.
  returned: always
  type: str
"""

import hashlib
import inspect
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _gpu_health


def reader_source() -> bytes:
    """The reader's source as this payload carries it."""
    return inspect.getsource(_gpu_health).encode("utf-8")


def main():
    module = AnsibleModule(
        argument_spec={"dest": {"type": "path", "required": True}},
        add_file_common_args=True,
        supports_check_mode=True,
    )
    dest = module.params["dest"]
    wanted = reader_source()
    before = None
    if os.path.isdir(dest):
        module.fail_json(msg="dest=%s is a directory; give the file's path (for example %s/_gpu_health.py)."
                         % (dest, dest.rstrip("/")))  # fmt: skip
    if os.path.exists(dest):
        with open(dest, "rb") as f:
            before = f.read()
    changed = before != wanted
    result = {"dest": dest, "checksum": hashlib.sha1(wanted).hexdigest(), "changed": changed}
    if module._diff and changed:
        result["diff"] = {
            "before_header": dest,
            "after_header": dest,
            "before": (before or b"").decode("utf-8", "replace"),
            "after": wanted.decode("utf-8"),
        }
    if changed and not module.check_mode:
        folder = os.path.dirname(dest) or "."
        if not os.path.isdir(folder):
            module.fail_json(msg="dest=%s: the folder %s does not exist; create it first." % (dest, folder))
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".gpu_health.")
        with os.fdopen(fd, "wb") as f:
            f.write(wanted)
        module.atomic_move(tmp, dest)
    if os.path.exists(dest) or not module.check_mode:
        file_args = module.load_file_common_arguments(module.params, path=dest)
        result["changed"] = module.set_fs_attributes_if_different(file_args, result["changed"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
