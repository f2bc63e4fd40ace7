# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Multi-node engine instances (private to gpufleet.serving): one instance over several hosts.

An instance with ``nodes: [LEADER, WORKER, ...]`` is written once, in the leader's
``gpufleet_engines``. The leader (node rank 0) serves the API behind its proxy; every other
node runs the same container headless (node rank 1..N-1), with the same `gpus` indices on its
own board. The runtime is the engine's own multi-node support: vLLM's multiprocessing
executor across nodes (--nnodes, --node-rank, --master-addr, --master-port, workers
--headless), SGLang's --nnodes/--node-rank/--dist-init-addr; or, for vLLM with
``distributed_executor_backend: ray``, Ray: the leader's container starts a Ray head and then
vLLM (--distributed-executor-backend ray, which places its workers through Ray), each other
member's container runs a Ray worker node only, with Ray's token authentication on.

What each part reads from here: the engine role (which instances a host runs and at which
rank, the address and interface its sockets use), the firewall (the peers a member accepts
connections from), `gpufleet status` (the group in deployed.json).
"""

from __future__ import annotations

import hashlib
import ipaddress
from typing import List, Optional

# vLLM 0.32's --master-port default (its argument parser, checked in the lab image)
DEFAULT_MASTER_PORT = 29501
# distributed_executor_backend: vLLM's multiprocessing executor across nodes (mp, the default), or
# Ray (ray): a Ray head in the leader's container and a Ray worker node in each other member's,
# with Ray's token authentication.
BACKENDS = ("mp", "ray")
# Ray's defaults (`ray start --help`, Ray 2.60.0 in tests/lab/images/vllm-cpu-ray): the head's GCS
# port and its dashboard's port; the ports Ray binds on a node whatever gpufleet asks (the head's
# Ray client server, every node's dashboard agent: ray/_private/ray_constants.py
# DEFAULT_DASHBOARD_AGENT_LISTEN_PORT), which is why a host runs at most one Ray node.
DEFAULT_RAY_PORT = 6379
DEFAULT_RAY_DASHBOARD_PORT = 8265
RAY_CLIENT_SERVER_PORT = 10001
RAY_DASHBOARD_AGENT_PORT = 52365
# Ray's token authentication (RAY_AUTH_MODE=token on every node and process, the token in
# RAY_AUTH_TOKEN) came with Ray 2.52.0 (docs.ray.io, "Ray token authentication").
RAY_MIN_VERSION = "2.52.0"
RAY_TOKEN_MIN_LENGTH = 32


def address_of(hostvars, name) -> str:
    """A host's address as its peers reach it: ansible_host when it is an address, else the
    default IPv4 address its gathered facts name, else ansible_host (a name) or the inventory
    name."""
    hv = hostvars.get(name, {}) if hasattr(hostvars, "get") else {}
    facts = hv.get("ansible_facts") or {}
    fact_address = (facts.get("default_ipv4") or {}).get("address")
    given = hv.get("ansible_host")
    try:
        ipaddress.ip_address(str(given))
        return str(given)
    except ValueError:
        return str(fact_address or given or name)


def _nodes(inst) -> Optional[list]:
    nodes = inst.get("nodes") if isinstance(inst, dict) else None
    if isinstance(nodes, list) and nodes and all(isinstance(n, str) for n in nodes):
        return nodes
    return None


def groups(hosts, hostvars) -> List[dict]:
    """Every multi-node instance defined on `hosts` (each in its leader's gpufleet_engines):
    [{name, leader, nodes, addresses, master_port, instance}]."""
    out = []
    for host in hosts or []:
        hv = hostvars.get(host, {}) if hasattr(hostvars, "get") else {}
        engines = hv.get("gpufleet_engines") or []
        for inst in engines if isinstance(engines, list) else []:
            nodes = _nodes(inst)
            if not nodes or nodes[0] != host or len(nodes) < 2:
                continue
            out.append(
                {
                    "name": inst.get("name"),
                    "leader": host,
                    "nodes": list(nodes),
                    "addresses": [address_of(hostvars, n) for n in nodes],
                    "master_port": inst.get("master_port", DEFAULT_MASTER_PORT),
                    "instance": inst,
                }
            )
    return out


def memberships(all_groups, me) -> List[dict]:
    """The groups `me` joins as a worker: [{instance, rank, group}]."""
    out = []
    for group in all_groups or []:
        if me in group["nodes"][1:]:
            out.append({"instance": group["instance"], "rank": group["nodes"].index(me), "group": group})
    return out


def peers(all_groups, me) -> List[str]:
    """The addresses of every other member of the groups `me` belongs to (sorted, unique)."""
    out = set()
    for group in all_groups or []:
        if me in group["nodes"]:
            out.update(a for n, a in zip(group["nodes"], group["addresses"]) if n != me)
    return sorted(out)


def interface_of(address, facts) -> Optional[str]:
    """The network interface that holds `address`, from Ansible's network facts (ansible_facts:
    `interfaces` and one entry per interface with ipv4/ipv4_secondaries/ipv6)."""
    facts = facts or {}
    for name in facts.get("interfaces") or []:
        entry = facts.get(name.replace("-", "_")) or facts.get(name) or {}
        ipv4 = entry.get("ipv4")
        found = [ipv4.get("address")] if isinstance(ipv4, dict) else [a.get("address") for a in ipv4 or []]
        found += [a.get("address") for a in entry.get("ipv4_secondaries") or []]
        found += [a.get("address") for a in entry.get("ipv6") or []]
        if address in found:
            return name
    return None


def context(inst, me, all_groups, facts=None, ifname=None):
    """Where `me` stands in the instance's group: {rank, size, leader, nodes, addresses,
    master_addr, master_port, address, ifname, ifname_source}, or None for a single-host
    instance. The address is this node's inventory address (the group's network); the
    interface holding it carries NCCL's and Gloo's sockets unless `ifname` (the role's
    engine_group_ifname) names one."""
    nodes = _nodes(inst)
    if not nodes or len(nodes) < 2:
        return None
    group = next((g for g in all_groups or [] if g["name"] == inst.get("name") and g["nodes"] == nodes), None)
    addresses = group["addresses"] if group else list(nodes)
    rank = nodes.index(me) if me in nodes else 0
    found = interface_of(addresses[rank], facts)
    backend = inst.get("distributed_executor_backend", "mp")
    return {
        "rank": rank,
        "size": len(nodes),
        "leader": nodes[0],
        "nodes": list(nodes),
        "addresses": list(addresses),
        "master_addr": addresses[0],
        "master_port": inst.get("master_port", DEFAULT_MASTER_PORT),
        "address": addresses[rank],
        "ifname": ifname or found,
        "ifname_source": "engine_group_ifname" if ifname else "facts" if found else None,
        "backend": backend,
        "ray_port": inst.get("ray_port", DEFAULT_RAY_PORT) if backend == "ray" else None,
        "ray_dashboard_port": inst.get("ray_dashboard_port", DEFAULT_RAY_DASHBOARD_PORT) if backend == "ray" else None,
    }


def ray_start(group: dict, gpus: int) -> List[str]:
    """The `ray start` command of a Ray group's member (context): the head on the leader (its GCS
    on ray_port of this node's address, the dashboard on loopback only), a worker node elsewhere
    (joins the head, and blocks: the container lives as long as it). Ray reads RAY_AUTH_MODE and
    RAY_AUTH_TOKEN from the environment, never from here."""
    common = ["--node-ip-address=%s" % group["address"], "--num-gpus=%d" % gpus, "--disable-usage-stats"]
    if group["rank"] == 0:
        return ["ray", "start", "--head", "--port=%d" % group["ray_port"], "--dashboard-host=127.0.0.1",
                "--dashboard-port=%d" % group["ray_dashboard_port"], *common]  # fmt: skip
    return ["ray", "start", "--address=%s" % ray_address(group), *common, "--block"]


def host_port(host: str, port) -> str:
    """HOST:PORT, an IPv6 address in brackets."""
    return "[%s]:%s" % (host, port) if ":" in host else "%s:%s" % (host, port)


def ray_address(group: dict) -> str:
    """HOST:PORT of a Ray group's head (its GCS)."""
    return host_port(group["master_addr"], group["ray_port"])


# The flags that differ from node to node: the rest of a member's command line is the group's.
NODE_FLAGS = ("--node-rank", "--headless")


def fingerprint(rendered: dict, config_text) -> dict:
    """What must be the same on every member of a group: the image, the engine's command line
    but for the node's own flags, the executor and its settings, and the model's config.json
    (sha256).

    A Ray group's executor includes the interface NCCL uses: vLLM copies the leader's NCCL_*
    variables to its Ray workers on every node (vllm/ray/ray_env.py DEFAULT_ENV_VAR_PREFIXES,
    vLLM 0.32), so the leader's NCCL_SOCKET_IFNAME must name the interface on every node."""
    args, skip = [], False
    for arg in rendered["engine_args"]:
        if skip:
            skip = False
            continue
        if arg in NODE_FLAGS:
            skip = arg == "--node-rank"
            continue
        args.append(arg)
    digest = hashlib.sha256(config_text.encode("utf-8")).hexdigest() if config_text else None
    group = rendered.get("group") or {}
    executor = group.get("backend", "mp")
    if executor == "ray":
        executor = "ray (GCS port %s, dashboard port %s, NCCL interface %s)" % (
            group["ray_port"],
            group["ray_dashboard_port"],
            group["ifname"],
        )
    return {"image": rendered["image"], "engine_args": args, "executor": executor, "model_config_sha256": digest}


def mismatches(prints, hostvars, me, var="__engine_group_print") -> List[str]:
    """Every difference between this host's prints of its groups ({name: {group, print}}) and
    the other members' (their `var` in hostvars), and every member missing from the run."""
    errors = []
    for name, mine in sorted((prints or {}).items()):
        for node in mine["nodes"]:
            if node == me:
                continue
            theirs = ((hostvars.get(node, {}) if hasattr(hostvars, "get") else {}).get(var) or {}).get(name)
            if theirs is None:
                errors.append(
                    "multi-node instance %s: node %s is not in this run, so %s cannot tell whether it runs the same "
                    "image, model and settings; run with every node of the group (--limit %s)."
                    % (name, node, me, ",".join(mine["nodes"]))
                )
                continue
            for key in sorted(set(mine["print"]) | set(theirs["print"])):
                a, b = mine["print"].get(key), theirs["print"].get(key)
                if a != b:
                    errors.append(
                        "multi-node instance %s: %s differs between %s (%s) and %s (%s); every node must run the "
                        "same %s." % (name, key, me, _short(a), node, _short(b), key.replace("_", " "))
                    )
    return errors


def _short(value) -> str:
    text = " ".join(value) if isinstance(value, list) else str(value)
    return text if len(text) <= 200 else text[:197] + "..."


def rollout_batches(hosts, all_groups, batch=1) -> dict:
    """The rollout's batches when some hosts carry multi-node instances: the nodes of an
    instance roll together (a member restarted alone waits for the others forever). hosts: the
    gpu hosts in the run, in order; batch: hosts per batch, an integer or 'N%' (of the hosts),
    as gpufleet_rollout_batch. A group larger than the batch makes a batch of its own.

    Returns {order: hosts in rollout order, sizes: hosts per batch (Ansible's serial list),
    batches: the hosts of each batch, errors}."""
    hosts = list(hosts or [])
    text = str(batch).strip()
    try:
        size = -(-len(hosts) * float(text[:-1]) // 100) if text.endswith("%") else int(text)
        size = int(size)
        valid = size >= 1 and (not text.endswith("%") or 0 < float(text[:-1]) <= 100)
    except ValueError:
        valid = False
    if not valid:
        return {
            "order": hosts,
            "sizes": [1],
            "batches": [[h] for h in hosts],
            "errors": [
                "gpufleet_rollout_batch=%r must be a number of hosts (1, 2, ...) or a share of them ('25%%')."
                % (batch,)
            ],
        }
    # units: hosts joined by the groups they share (a host in two groups joins both)
    unit_of = {h: {h} for h in hosts}
    for group in all_groups or []:
        members = [n for n in group["nodes"] if n in unit_of]
        merged = set().union(*(unit_of[n] for n in members)) if members else set()
        for n in merged:
            unit_of[n] = merged
    order, sizes, current, seen = [], [], [], set()
    for host in hosts:
        if host in seen:
            continue
        unit = [h for h in hosts if h in unit_of[host]]
        seen.update(unit)
        if current and len(current) + len(unit) > size:
            sizes.append(len(current))
            current = []
        current += unit
        order += unit
    if current:
        sizes.append(len(current))
    batches, at = [], 0
    for size in sizes:
        batches.append(order[at : at + size])
        at += size
    return {"order": order, "sizes": sizes or [1], "batches": batches, "errors": []}


def group_restarts(restarts, instances, hostvars) -> List[str]:
    """This host's restarts and every multi-node instance of it that another of its nodes
    restarts (their gpufleet_engine_restarts in hostvars): a group restarts on all its nodes
    or on none."""
    out = list(restarts or [])
    for inst in instances or []:
        group = inst.get("group")
        if not group or inst["name"] in out:
            continue
        for node in group["nodes"]:
            hv = hostvars.get(node, {}) if hasattr(hostvars, "get") else {}
            if inst["name"] in (hv.get("gpufleet_engine_restarts") or []):
                out.append(inst["name"])
                break
    return out


def leader_port(group: dict) -> int:
    """The leader's port a worker connects to: Ray's GCS (ray_port) in a Ray group, else the
    rendezvous port (master_port)."""
    return group["ray_port"] if group.get("backend") == "ray" else group["master_port"]


def probes(instances) -> List[list]:
    """[address, port] pairs a node checks it reaches: the leader each worker, a worker its leader,
    on the port a worker joins the leader on (leader_port)."""
    out = []
    for inst in instances or []:
        group = inst.get("group")
        if not group:
            continue
        for address in group["addresses"][1:] if group["rank"] == 0 else [group["master_addr"]]:
            if [address, leader_port(group)] not in out:
                out.append([address, leader_port(group)])
    return out
