"""`gpufleet lab test -i INVENTORY`: a user's fleet rehearsed on lab hosts, without GPUs.

Each host of the inventory's gpu_hosts group gets a lab host: a container with systemd,
made from the lab host image. On it, a HARDWARE STAND-IN nvidia-smi (tests/lab/nvidia-smi-standin)
replays that host's captured output, and the model folders get their real config.json files.
Two variables per host say where these come from:

    gpufleet_lab_gpu_fixture: captures/gpu-01   # a folder `gpufleet gpu capture FOLDER` wrote on the host
    gpufleet_lab_model_configs: {/srv/models/Qwen2.5-7B: captures/qwen2.5-7b/config.json}

Relative paths are taken from the inventory folder. A bare name is looked up among gpufleet's
own fixtures, in tests/fixtures/nvidia_smi/NAME/ and tests/fixtures/model_configs/NAME.json.

The test runs in stages; a failing stage ends the run.

1. **Preflight** (always). site.yml runs with `--check --diff --tags preflight` against the
   lab hosts, with the user's variables unchanged. Every check a real run makes first is made
   here on the same inputs: variable validation, memory plans on the captured GPUs, ports,
   the proxy and the driver settings against the GPUs. A plan that does not fit, a bad
   variable or a port clash fails here, as it would on the fleet. Nothing is changed.
2. **Check** (`--converge`). site.yml runs with `--check --diff` on the fresh lab hosts: the
   readable plan of changes a user reviews before a first run.
3. **Converge** (`--converge`). site.yml runs for real, then again to check that it is
   idempotent (changed=0). The edge hosts get lab hosts too. Only what a host without a GPU
   cannot do is overridden:
   - the GPU stack is skipped;
   - every engine instance becomes vLLM's CPU build serving the lab's tiny model;
   - the name, port and served model name of each instance are kept, so the proxy and edge
     routes are the user's own.
   site.yml ends by streaming a completion through every host's proxy.

Ansible reaches the lab hosts over SSH, as it reaches a fleet (tests/lab/harness.sh ssh: the
lab's key, an ssh_config that maps each lab host's name to its address, known_hosts read from
the hosts). The lab hosts are removed at the end unless `--keep` is given. Each run goes through
ansible-runner like `gpufleet deploy` (gpufleet.runner): Ansible's own output is printed from
the run's events, followed by each host's counts, and the idempotence check reads the counts
from the run's stats.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpufleet import runner
from gpufleet._collection import collection_root

PREFIX = "gpufleet-labtest-"
LABEL = "io.gpufleet.lab"
# Lab settings of the converge stage (the fleet lab's; shared/ENVIRONMENT.md explains the ulimits).
LAB_ENGINE = {"enforce_eager": True, "max_model_len": 2048, "kv_cache_space_gib": 1, "readiness_timeout": 600}


class LabError(RuntimeError):
    pass


def _run(argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, text=True, capture_output=True, check=False, **kw)
    if check and proc.returncode != 0:
        raise LabError("`%s` failed (%s): %s" % (" ".join(argv), proc.returncode, proc.stderr.strip()[-800:]))
    return proc


def _say(msg: str) -> None:
    print("gpufleet lab: %s" % msg, file=sys.stderr, flush=True)


def harness(*args: str) -> str:
    script = collection_root() / "tests" / "lab" / "harness.sh"
    if not script.is_file():
        raise LabError(
            "the lab is built from a checkout's tests/lab, which an installed gpufleet does not carry; "
            "run `gpufleet lab` and `gpufleet demo` from a clone of gpufleet (make setup)"
        )
    return _run([str(script), *args]).stdout.strip()


def lab_vars() -> dict:
    """The lab's settings that differ from a real host (tests/lab/lab_vars.yml: the engines'
    ulimits), shared with Molecule and the demo."""
    import yaml

    path = collection_root() / "tests" / "lab" / "lab_vars.yml"
    if not path.is_file():
        raise LabError("%s is missing; run `gpufleet lab` and `gpufleet demo` from a clone of gpufleet" % path)
    return yaml.safe_load(path.read_text())


def load_inventory(source: Path) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """Every host's variables (templated where they can be) and the groups, through Ansible's API."""
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[str(source)])
    manager = VariableManager(loader=loader, inventory=inventory)
    hosts = {}
    for host in inventory.get_hosts():
        variables = manager.get_vars(host=host)
        try:
            hosts[host.name] = Templar(loader=loader, variables=variables).template(variables)
        except AnsibleError:  # e.g. a vault variable: keep the raw values
            hosts[host.name] = variables
    groups = {name: [h.name for h in group.get_hosts()] for name, group in inventory.groups.items()}
    return hosts, groups


def _resolve(value: str, base: Path, fixtures: Path, suffix: str = "") -> Path | None:
    for candidate in (base / value, fixtures / (value + suffix)):
        if candidate.exists():
            return candidate.resolve()
    return None


def hardware_inputs(inventory: Path, hostvars: dict[str, dict], gpu_hosts: list[str]) -> tuple[dict, list[str]]:
    """Per gpu host: the capture folder and {model folder: config.json}; errors name host, variable and fix."""
    base = inventory if inventory.is_dir() else inventory.parent
    fixtures = collection_root() / "tests" / "fixtures"
    inputs, errors = {}, []
    for host in gpu_hosts:
        hv = hostvars[host]
        capture = hv.get("gpufleet_lab_gpu_fixture")
        folder = _resolve(str(capture), base, fixtures / "nvidia_smi") if capture else None
        if not capture:
            errors.append(
                "%s: gpufleet_lab_gpu_fixture is not set. Fix: run `gpufleet gpu capture FOLDER` on the host, "
                "copy FOLDER next to the inventory and set gpufleet_lab_gpu_fixture: FOLDER in its host_vars." % host
            )
        elif folder is None or not folder.is_dir():
            errors.append(
                "%s: gpufleet_lab_gpu_fixture=%s is not a folder (looked in %s and %s). Fix: point it at the folder "
                "`gpufleet gpu capture` wrote." % (host, capture, base, fixtures / "nvidia_smi")
            )
        configs = {}
        for model, config in (hv.get("gpufleet_lab_model_configs") or {}).items():
            path = _resolve(str(config), base, fixtures / "model_configs", ".json")
            if path is not None and path.is_dir():
                path = path / "config.json"
            if path is None or not path.is_file():
                errors.append(
                    "%s: gpufleet_lab_model_configs[%s]=%s is not a config.json (looked in %s and %s). Fix: copy the "
                    "model's config.json next to the inventory and name it there."
                    % (host, model, config, base, fixtures)
                )
            else:
                configs[str(model)] = path
        inputs[host] = {"capture": folder, "configs": configs}
    return inputs, errors


def start_hosts(names: dict[str, str], image: str, scenario: str, nested_docker: bool) -> None:
    """Start a lab host per {container name: hostname} with the flags of molecule/shared/create.yml."""
    _run(["docker", "network", "create", "--label", LABEL + "=network", "gpufleet-lab"], check=False)
    cache = collection_root() / ".cache" / "lab"
    for sub in ("images", "models"):
        (cache / sub).mkdir(parents=True, exist_ok=True)
    for container, hostname in names.items():
        if _run(["docker", "inspect", container], check=False).returncode == 0:
            continue
        argv = ["docker", "run", "-d", "--name", container, "--hostname", hostname]
        argv += ["--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN", "--cap-add", "SYS_NICE"]
        argv += ["--security-opt", "seccomp=unconfined"]
        argv += ["--security-opt", "apparmor=unconfined", "--cgroupns", "host"]
        argv += ["-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw"]
        argv += ["--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp", "--stop-signal", "SIGRTMIN+3"]
        argv += ["--network", "gpufleet-lab", "--label", LABEL + "=host", "--label", LABEL + ".scenario=" + scenario]
        for sub in ("images", "models"):
            argv += ["-v", "%s/%s:/srv/gpufleet-lab/%s:ro" % (cache, sub, sub)]
        if nested_docker:
            _run(["docker", "volume", "create", "--label", LABEL + "=volume", container + "-docker"])
            argv += ["-v", container + "-docker:/var/lib/docker"]
        _run([*argv, image, "/lib/systemd/systemd"])
    for container in names:
        # right after `docker run`, systemd may not have its bus up yet, or not even have marked the
        # system as booted (systemctl then says "offline"): ask again for up to a minute
        for _ in range(60):
            state = _run(["docker", "exec", container, "systemctl", "is-system-running", "--wait"], check=False)
            if state.stdout.strip() in ("running", "degraded"):
                break
            if "connect to bus" not in state.stderr and state.stdout.strip() not in ("offline", ""):
                break
            time.sleep(1)
        if state.stdout.strip() not in ("running", "degraded"):
            raise LabError("lab host %s did not boot: %s" % (container, state.stdout.strip() or state.stderr.strip()))
    harness("login-user", *names)  # the unprivileged login with sudo, as a cloud image's first boot makes


def remove_hosts(containers: list[str]) -> None:
    for container in containers:
        _run(["docker", "rm", "-f", container], check=False)
        _run(["docker", "volume", "rm", container + "-docker"], check=False)


def stage_hardware(container: str, inputs: dict) -> None:
    """The nvidia-smi stand-in with the host's capture, and the models' config.json files."""
    standin = collection_root() / "tests" / "lab" / "nvidia-smi-standin"
    if inputs["capture"] is not None:
        _run(["docker", "cp", str(standin), container + ":/usr/local/bin/nvidia-smi"])
        _run(["docker", "exec", container, "mkdir", "-p", "/etc/gpufleet-lab"])
        _run(["docker", "cp", str(inputs["capture"]) + "/.", container + ":/etc/gpufleet-lab/nvidia-smi"])
    for model, config in inputs["configs"].items():
        _run(["docker", "exec", container, "mkdir", "-p", model])
        _run(["docker", "cp", str(config), "%s:%s/config.json" % (container, model)])


def lab_engines(engines: list[dict], image: str, model: str) -> list[dict]:
    """The user's instances as CPU instances of the tiny model: name, port and served name kept."""
    out = []
    for inst in engines or []:
        keep = {k: inst[k] for k in ("name", "port", "served_model_name") if k in inst}
        keep.setdefault("served_model_name", inst.get("name"))
        out.append({**keep, "engine": "vllm", "accelerator": "cpu", "image": image, "model": model, **LAB_ENGINE})
    return out


def site_request(inventory: Path, extravars: dict[str, Any], **options: Any) -> runner.RunRequest:
    """site.yml on the user's inventory with the lab's variables, Ansible's output shown."""
    return runner.RunRequest(playbook="site", inventory=str(inventory), extravars=extravars, echo=True, **options)


def _site(req: runner.RunRequest) -> runner.Outcome:
    flags = [flag for flag, on in (("--check", req.check), ("--diff", req.diff)) if on]
    flags += ["--tags " + req.tags] if req.tags else []
    _say("site.yml on %s %s" % (req.inventory, " ".join(flags)))
    return runner.play(req)


def lab_test(inventory: Path, converge: bool = False, keep: bool = False) -> int:
    hostvars, groups = load_inventory(inventory)
    gpu_hosts = groups.get("gpu_hosts", [])
    if not gpu_hosts:
        print("gpufleet lab: %s has no hosts in group gpu_hosts; nothing to test" % inventory, file=sys.stderr)
        return 1
    inputs, errors = hardware_inputs(inventory, hostvars, gpu_hosts)
    if errors:
        for error in errors:
            print("gpufleet lab: " + error, file=sys.stderr)
        return 1
    edge = [h for h in groups.get("edge", []) if h not in gpu_hosts] if converge else []
    containers = {PREFIX + h: h for h in gpu_hosts + edge}
    image = harness("image", "host")
    _say("starting %d lab hosts from %s" % (len(containers), image))
    start_hosts(containers, image, scenario="lab_test", nested_docker=converge)
    (collection_root() / ".cache" / "lab").mkdir(parents=True, exist_ok=True)
    ssh_dir = Path(tempfile.mkdtemp(prefix="lab_test-", dir=collection_root() / ".cache" / "lab"))
    try:
        for host in gpu_hosts:
            stage_hardware(PREFIX + host, inputs[host])
        # over SSH, as Ansible reaches the fleet: the harness authorizes the lab key and writes
        # an ssh_config (each lab host's name to its address) and a known_hosts read from the hosts
        ssh_config = harness("ssh", str(ssh_dir), *containers)
        connection = {
            "ansible_connection": "ssh",
            "ansible_host": PREFIX + "{{ inventory_hostname }}",
            "ansible_user": "root",
            "ansible_ssh_common_args": "-F " + ssh_config,
            "ansible_control_path_dir": str(ssh_dir / "cp"),
            "ansible_python_interpreter": "/usr/bin/python3",
        }
        _say("stage 1: preflight of every gpu host on its captured hardware (--check, nothing changes)")
        rc = _site(site_request(inventory, connection, check=True, diff=True, tags="preflight")).rc
        if rc != 0:
            _say("preflight failed (exit %d): the same run would fail on the fleet before changing any host" % rc)
            return rc
        if not converge:
            _say("preflight passed on %d hosts" % len(gpu_hosts))
            return 0
        vllm_image = harness("image-tag", "vllm-cpu")
        archive = Path(harness("archive", "vllm-cpu")).name
        model = "/srv/gpufleet-lab/models/" + Path(harness("model", "tiny-llama")).name
        overrides = {
            **connection,
            "gpufleet_manage_driver": False,
            "gpufleet_cuda_toolkit": False,
            "container_runtime_nvidia_toolkit": False,
            "container_runtime_image_archives": [
                {"image": vllm_image, "archive": "/srv/gpufleet-lab/images/" + archive}
            ],
            "engine_pull_images": False,
            **lab_vars(),
            "gpufleet_lab_engines": {
                h: lab_engines(hostvars[h].get("gpufleet_engines"), vllm_image, model) for h in gpu_hosts
            },
            "gpufleet_engines": "{{ gpufleet_lab_engines[inventory_hostname] | default([]) }}",
        }
        _say("stage 2: what site.yml would change on the fresh lab hosts (--check --diff)")
        rc = _site(site_request(inventory, overrides, check=True, diff=True)).rc
        if rc != 0:
            _say("the check-mode run failed (exit %d)" % rc)
            return rc
        _say("stage 3: converge (engines on vLLM's CPU build with the tiny model)")
        rc = _site(site_request(inventory, overrides)).rc
        if rc != 0:
            return rc
        _say("stage 3: the second run must change nothing")
        second = _site(site_request(inventory, overrides))
        changed = {host: state.changed for host, state in second.view.hosts.items() if state.changed}
        if second.rc != 0 or changed:
            _say("not idempotent: changed on %s" % changed if changed else "second run failed (exit %d)" % second.rc)
            return second.rc or 2  # it ran and did not pass
        _say("converged, idempotent and streaming on %d hosts" % len(containers))
        return 0
    finally:
        if keep:
            _say("kept: %s (Ansible reaches them with ssh -F %s/ssh_config)" % (" ".join(containers), ssh_dir))
        else:
            remove_hosts(list(containers))
            shutil.rmtree(ssh_dir, ignore_errors=True)
