"""Controller cost of the idempotent site.yml on 1, 4 and 8 lab hosts reached over SSH.

Run with `make bench-fleet`. It prints figures and asserts nothing about speed.

- **Hosts.** Eight light lab hosts: the lab host image (systemd, sshd), each with its own
  /var/lib/docker volume. They are reached over SSH with a key made for the run and a
  known_hosts file filled by ssh-keyscan; nothing is accepted blindly.
- **What they run.** Light means no engine: eight vLLM engines do not fit two cores. Each
  host takes the layers site.yml gives a GPU host that serves nothing yet: preflight,
  container runtime (Debian's docker.io), NCCL and the (empty) engines layer. The proxy
  layer runs only on hosts with engines, and the GPU-stack roles are skipped because the
  hosts have no GPU.
- **Sequence.** All eight hosts are converged once. Then site.yml runs again, unchanged, with
  --limit to 1, 4 and 8 hosts, per connection setup: SSH with pipelining and ControlPersist,
  as ansible.cfg sets it, and mitogen 0.3.54's strategy when it loads.
  - Each setup has two rows: facts gathered (an empty fact cache), then facts cached (the
    jsonfile cache of ansible.cfg, as a second run within the hour finds it).
- **Floor.** In the same run, a playbook of 20 `stat` tasks gives the controller's floor
  for the same hosts and connection.
- **Runs** go through ansible-runner, as `gpufleet deploy` runs site.yml (gpufleet.runner),
  so the wall time includes what that adds to ansible-playbook (its event callback).
- **Reported per run:** the wall time, the host-tasks (the tasks each host ran: ok, failed,
  skipped and ignored, from the run's stats), the milliseconds per host-task (wall time /
  host-tasks), and the changed count. An idempotent run must report changed=0.

Options:

    --keep       leave the hosts running for another run
    --hosts N    use N hosts instead of 8
    --no-mitogen skip the mitogen rows
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gpufleet import lab, runner  # noqa: E402

WORK = ROOT / ".cache" / "bench" / "fleet"
MITOGEN = ROOT / ".cache" / "bench" / "mitogen-0.3.54"
PREFIX = "gpufleet-bench-fleet-"
FLOOR = "20 x stat (floor)"
FLOOR_PLAYBOOK = """\
- name: Controller floor (20 stat tasks, no facts)
  hosts: gpu_hosts
  gather_facts: false
  tasks:
{tasks}
"""


def sh(*argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, text=True, capture_output=True, **kw)


def say(msg: str) -> None:
    print(f"bench-fleet: {msg}", file=sys.stderr, flush=True)


def start_hosts(count: int, pubkey: str) -> dict[str, str]:
    """Lab hosts (gpufleet.lab, the lab flags) with the run's key authorized for root; their addresses."""
    names = {f"{PREFIX}{i}": f"bench-{i}" for i in range(1, count + 1)}
    lab.start_hosts(names, lab.harness("image", "host"), scenario="bench_fleet", nested_docker=True)
    addresses = {}
    for name in names:
        sh(
            "docker", "exec", name, "sh", "-c",
            f"install -d -m 700 /root/.ssh && printf '%s\\n' '{pubkey}' > /root/.ssh/authorized_keys"
            " && chmod 600 /root/.ssh/authorized_keys && systemctl start ssh",
        )  # fmt: skip
        fmt = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
        addresses[name] = sh("docker", "inspect", "-f", fmt, name).stdout.strip()
    return addresses


def known_hosts(addresses: dict[str, str], path: Path) -> None:
    lines = []
    for addr in addresses.values():
        for _ in range(30):
            scan = sh("ssh-keyscan", "-T", "2", "-t", "ed25519", addr, check=False)
            if scan.stdout.strip():
                lines.append(scan.stdout.strip())
                break
            time.sleep(1)
        else:
            raise SystemExit(f"bench-fleet: sshd on {addr} did not answer ssh-keyscan")
    path.write_text("\n".join(lines) + "\n")


def write_inventory(addresses: dict[str, str], key: Path, kh: Path) -> Path:
    hosts = {"bench-" + name.removeprefix(PREFIX): {"ansible_host": addr} for name, addr in addresses.items()}
    inventory = {
        "all": {
            "children": {
                "gpu_hosts": {
                    "hosts": hosts,
                    "vars": {
                        "ansible_connection": "ssh",
                        "ansible_user": "root",
                        "ansible_ssh_private_key_file": str(key),
                        "ansible_ssh_common_args": f"-o UserKnownHostsFile={kh} -o StrictHostKeyChecking=yes",
                        "gpufleet_manage_driver": False,
                        "gpufleet_engines": [],
                    },
                }
            }
        }
    }
    path = WORK / "inventory.json"
    path.write_text(json.dumps(inventory, indent=2))
    return path


def mitogen_strategy() -> Path | None:
    strategy = MITOGEN / "ansible_mitogen" / "plugins" / "strategy"
    if not strategy.is_dir():
        pip = [str(ROOT / ".venv/bin/pip"), "install", "-q", "--target", str(MITOGEN), "mitogen==0.3.54"]
        if subprocess.run(pip, check=False).returncode != 0:
            return None
    return strategy if strategy.is_dir() else None


@contextlib.contextmanager
def environment(settings: dict[str, str]) -> Iterator[None]:
    """The run's ANSIBLE_* settings as the user's own environment, which gpufleet.runner keeps."""
    saved = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run(playbook: Path, inventory: Path, limit: str, env: dict[str, str]) -> dict:
    """One run through ansible-runner (gpufleet.runner); counts from the run's stats."""
    output = io.StringIO()
    view = runner.RunView(out=output, quiet=True, echo=True)
    request = runner.RunRequest(playbook=str(playbook), inventory=str(inventory), limit=limit)
    with environment(env):
        start = time.monotonic()
        outcome = runner.execute(request, view)
        wall = time.monotonic() - start
    hosts = view.hosts.values()
    tasks = sum(h.ok + h.failed + h.skipped + h.ignored for h in hosts)
    return {
        "rc": outcome.rc,
        "wall_s": wall,
        "host_tasks": tasks,
        "changed": sum(h.changed for h in hosts),
        "ms_per_host_task": wall * 1000 / tasks if tasks else float("nan"),
        "tail": output.getvalue()[-5000:],
    }


def main() -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--hosts", type=int, default=8)
    args.add_argument("--keep", action="store_true")
    args.add_argument("--no-mitogen", action="store_true")
    opts = args.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    key = WORK / "id_ed25519"
    if not key.exists():
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpufleet-bench-fleet", "-f", str(key))
    kh = WORK / "known_hosts"

    say(f"starting {opts.hosts} lab hosts")
    addresses = start_hosts(opts.hosts, (WORK / "id_ed25519.pub").read_text().strip())
    known_hosts(addresses, kh)
    inventory = write_inventory(addresses, key, kh)
    names = sorted(addresses, key=lambda n: int(n.rsplit("-", 1)[1]))
    hosts = [n.replace(PREFIX, "bench-") for n in names]
    site = ROOT / "site.yml"
    floor = WORK / "floor.yml"
    floor.write_text(
        FLOOR_PLAYBOOK.format(
            tasks="\n".join(
                f"    - name: stat {i}\n      ansible.builtin.stat:\n        path: /etc/hostname\n" for i in range(20)
            )
        )
    )

    # Fresh facts for every row: the fact cache would otherwise hide the gather cost.
    facts = Path(tempfile.mkdtemp(prefix="gpufleet-bench-facts-"))
    base_env = {"ANSIBLE_CACHE_PLUGIN_CONNECTION": str(facts), "ANSIBLE_SSH_CONTROL_PATH_DIR": str(WORK / "cp")}

    say(f"converging {len(hosts)} hosts with site.yml (first run installs Docker and nginx)")
    first = run(site, inventory, ",".join(hosts), base_env)
    print(f"converge of {len(hosts)} hosts: rc={first['rc']} wall {first['wall_s']:.1f} s changed={first['changed']}")
    if first["rc"] != 0:
        print(first["tail"])
        return 1

    setups = [("ssh+pipelining", {})]
    if not opts.no_mitogen:
        strategy = mitogen_strategy()
        if strategy is None:
            print("mitogen 0.3.54 could not be installed: its rows are left out")
        else:
            mitogen = {"ANSIBLE_STRATEGY_PLUGINS": str(strategy), "ANSIBLE_STRATEGY": "mitogen_linear"}
            setups.append(("mitogen 0.3.54", mitogen))

    sizes = [n for n in (1, 4, 8) if n <= len(hosts)]
    rows = []
    for label, env in setups:
        for playbook, what in ((site, "site.yml, facts gathered"), (site, "site.yml, facts cached"), (floor, FLOOR)):
            per = {}
            for n in sizes:
                if what != "site.yml, facts cached":  # the cached row reuses the facts its previous row gathered
                    shutil.rmtree(facts, ignore_errors=True)
                    facts.mkdir()
                result = run(playbook, inventory, ",".join(hosts[:n]), {**base_env, **env})
                if result["rc"] != 0:
                    print(f"{label} {what} on {n} hosts failed (rc={result['rc']}):\n{result['tail']}")
                per[n] = result
                say(f"{label} {what} {n} hosts: {result['wall_s']:.1f} s")
            rows.append((label, what, per))

    lines = [
        f"site.yml controller cost over SSH through ansible-runner, {len(hosts)} light lab hosts, "
        f"{os.cpu_count()} cores ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        "| connection | playbook | hosts | wall s | host-tasks | ms/host-task | changed | rc |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, what, per in rows:
        for n, r in per.items():
            lines.append(
                f"| {label} | {what} | {n} | {r['wall_s']:.1f} | {r['host_tasks']} | "
                f"{r['ms_per_host_task']:.0f} | {r['changed']} | {r['rc']} |"
            )
    lines += ["", "| connection | playbook | wall N hosts / 1 host | ms/host-task N hosts / 1 host |"]
    lines += ["|---|---|---|---|"]
    for label, what, per in rows:
        if 1 in per and max(per) > 1:
            big = per[max(per)]
            lines.append(
                f"| {label} | {what} | {big['wall_s'] / per[1]['wall_s']:.2f} | "
                f"{big['ms_per_host_task'] / per[1]['ms_per_host_task']:.2f} |"
            )
    text = "\n".join(lines)
    print(text)
    (ROOT / ".cache" / "bench-fleet.txt").write_text(text + "\n")
    shutil.rmtree(facts, ignore_errors=True)

    if not opts.keep:
        lab.remove_hosts(names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
