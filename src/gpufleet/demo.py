"""`gpufleet demo up | down | status`: the whole stack on this machine, with no GPU.

`up` installs what it needs (a Docker engine; the lab's host image, vLLM CPU image and tiny
model, each cached by the hash of its recipe), starts one lab host (a Debian 12 container with
systemd) for inventories/demo, runs the real site.yml against it, streams an answer through
the proxy and prints the endpoint, a curl line and the key. A second `up` reuses all of it
and is idempotent. `down` removes the containers, volumes and images `up` made (images that
were there before stay), and nothing else. `status` is `gpufleet status` on the demo.

The demo runs from a checkout (it builds its images from tests/lab/), and streams its answer
with the OpenAI client: gpufleet's bench extra, which `make demo` installs.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from gpufleet import bench, lab
from gpufleet._collection import locate_collection
from gpufleet.runner import RunRequest, cache_dir, run_playbook, run_status

HOSTS = {"gpufleet-demo-demo-gpu": "demo-gpu"}
PROXY_PORT = 8443  # the proxy's TLS port (proxy_tls_port)
MODEL = "tiny-llama"


def state_dir() -> Path:
    return cache_dir() / "demo"


def _say(msg: str) -> None:
    print("gpufleet demo: %s" % msg, file=sys.stderr, flush=True)


class Phases:
    """The demo's phases: each says when it starts, every `every` seconds while it runs (with its
    elapsed time), and when it ends if it took over 5 s; `table()` gives every phase's time.
    Phases may run at once (each from its own thread)."""

    def __init__(self, say: Callable[[str], None] | None = None, every: float = 10.0) -> None:
        self.say = say or _say
        self.every = every
        self.times: list[tuple[str, float]] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        self.say("%s ..." % name)
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.every):
                self.say("%s ... %.0f s" % (name, time.monotonic() - started))

        ticker = threading.Thread(target=beat, daemon=True)
        ticker.start()
        try:
            yield
        finally:
            stop.set()
            ticker.join()
            took = time.monotonic() - started
            with self._lock:
                self.times.append((name, took))
            if took > 5:
                self.say("%s: done in %.0f s" % (name, took))

    def table(self, total: float) -> str:
        width = max([len(n) for n, _ in self.times] + [len("total (wall clock)")])
        lines = ["%-*s  %7s" % (width, "phase", "seconds")]
        lines += ["%-*s  %7.1f" % (width, name, took) for name, took in self.times]
        lines.append("%-*s  %7.1f" % (width, "total (wall clock)", total))
        return "\n".join(lines)


def _docker(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    return lab._run(["docker", *args], check=check)


def _images() -> set[str]:
    out = _docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout
    return {line for line in out.splitlines() if line and "<none>" not in line}


def _inventory() -> Path:
    coll = locate_collection()
    if coll.packaged:
        raise lab.LabError("the demo builds its lab from a checkout (tests/lab); run it from a clone of gpufleet")
    return coll.root / "inventories" / "demo"


def _load_state() -> dict[str, Any]:
    path = state_dir() / "state.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _save_state(state: dict[str, Any]) -> None:
    state_dir().mkdir(parents=True, exist_ok=True)
    (state_dir() / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")


def _key() -> str:
    path = state_dir() / "key"
    if not path.is_file():
        state_dir().mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("gpufleet-demo-" + secrets.token_hex(24) + "\n")
    return path.read_text().strip()


def endpoint() -> str | None:
    """https://ADDRESS:8443 of the demo host's proxy on the lab network, or None when it is not running."""
    (container,) = HOSTS
    proc = _docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", container)
    address = proc.stdout.strip()
    return "https://%s:%d" % (address, PROXY_PORT) if proc.returncode == 0 and address else None


def ssh_dir() -> Path:
    """The demo host's ssh_config, known_hosts and Ansible's ControlPersist sockets (tests/lab/harness.sh ssh)."""
    return state_dir() / "ssh"


def _control_dir_file() -> Path:
    return ssh_dir() / "control-dir"  # where Ansible's ControlPersist sockets are, when not in ssh_dir()/cp


def _control_dir() -> Path:
    path = _control_dir_file()
    return Path(path.read_text().strip()) if path.is_file() else ssh_dir() / "cp"


def _drop_control_dir() -> None:
    if _control_dir_file().is_file():
        shutil.rmtree(_control_dir(), ignore_errors=True)
        _control_dir_file().unlink()


def write_ssh_access() -> None:
    """`harness.sh ssh` for the demo host: the lab key authorized for the login user, an ssh_config that maps the
    host's name to its address, its host key in known_hosts, and an empty folder for Ansible's ControlPersist
    sockets (a master left from an earlier host would take the connections to a container that is gone).
    A Unix socket's path holds at most 107 bytes and ssh first binds the socket's name plus 17 characters:
    under a deep cache folder (XDG_CACHE_HOME) the sockets go to a private folder of their own in the
    temporary folder, named in ssh_dir()/control-dir."""
    _drop_control_dir()
    lab.harness("ssh", str(ssh_dir()), *HOSTS)
    if len(str(ssh_dir() / "cp")) > 70:
        _control_dir_file().write_text(tempfile.mkdtemp(prefix="gpufleet-demo-cp-") + "\n")


def connection(refresh: bool = False) -> dict[str, str]:
    """What inventories/demo needs to reach the demo host over SSH, as Ansible reaches a fleet (write_ssh_access).
    SSH with pipelining and ControlPersist costs less per task than `docker exec` (docs/benchmarks.md). Written
    again when asked (the host's address may have changed) or missing (a demo started by an older gpufleet)."""
    if refresh or not (ssh_dir() / "ssh_config").is_file():
        write_ssh_access()
    return {"gpufleet_demo_ssh_dir": str(ssh_dir()), "gpufleet_demo_control_path_dir": str(_control_dir())}


def lab_networks() -> list[str]:
    """The lab network's subnets. Clients reach the demo host by its address there (endpoint()), so
    site.yml gets them as gpufleet_tls_networks: the fleet CA names a host's own address only inside
    a declared network."""
    proc = _docker("network", "inspect", "-f", "{{range .IPAM.Config}}{{.Subnet}} {{end}}", "gpufleet-lab")
    return proc.stdout.split() if proc.returncode == 0 else []


def ca_file() -> Path:
    """The fleet CA's certificate, which site.yml copies here (gpufleet_tls_ca_copy): clients trust it."""
    return state_dir() / "ca.crt"


def stream_answer(base_url: str, key: str, prompt: str, out=None, cacert: Path | None = None) -> str:
    """Stream one chat completion through the proxy with the OpenAI client, trusting `cacert`;
    returns the text."""
    import ssl

    from openai import DefaultHttpxClient, OpenAI

    out = out or sys.stdout
    verify = ssl.create_default_context(cafile=str(cacert)) if cacert else True
    client = OpenAI(
        base_url=base_url + "/v1",
        api_key=key,
        max_retries=2,
        timeout=120,
        http_client=DefaultHttpxClient(verify=verify),
    )
    text = []
    out.write("> ")
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=48, stream=True
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            piece = chunk.choices[0].delta.content
            text.append(piece)
            out.write(piece)
            out.flush()
    out.write("\n")
    return "".join(text)


def _cli() -> str:
    """How to call this CLI from the user's shell: `gpufleet` when it is on PATH, else its path."""
    here = Path(sys.executable).parent / "gpufleet"
    on_path = shutil.which("gpufleet")
    return "gpufleet" if on_path and Path(on_path).resolve() == here.resolve() else str(here)


def ready_screen(url: str, key: str, took: float) -> str:
    """What `demo up` ends with: the endpoint, the key, a curl line and the next commands."""
    cli, keyfile, ca = _cli(), state_dir() / "key", ca_file()
    body = '{"model": "%s", "messages": [{"role": "user", "content": "Hello"}], "stream": true}' % MODEL
    return "\n".join(
        [
            "",
            "The demo is up (%.0f s)." % took,
            "  endpoint  %s/v1  (OpenAI-compatible; model %s)" % (url, MODEL),
            "  key       %s  (kept in %s)" % (key, keyfile),
            "  ca        %s  (the demo fleet's CA: TLS is verified against it)" % ca,
            "  try       curl -N --cacert %s %s/v1/chat/completions -H 'Authorization: Bearer %s' "
            "-H 'Content-Type: application/json' -d '%s'" % (ca, url, key, body),
            "  status    %s demo status" % cli,
            "  bench     GPUFLEET_API_KEY=$(cat %s) %s bench --cacert %s %s" % (keyfile, cli, ca, url),
            "  remove    %s demo down" % cli,
        ]
    )


def up(verbose: int = 0) -> int:
    started = time.monotonic()
    phases = Phases()
    try:
        return _up(phases, verbose, started)
    finally:
        if phases.times:
            print(
                "\nWhere the time went (phases side by side overlap; the images and the model are cached "
                "by the hash of their recipes)\n" + phases.table(time.monotonic() - started),
                file=sys.stderr,
            )


def _up(phases: Phases, verbose: int, started: float) -> int:
    inventory = _inventory()
    try:
        bench.require_openai()  # the streamed answer at the end: say so before anything is built
    except bench.MissingClientError as exc:
        raise lab.LabError("%s; the demo streams its answer with it" % exc) from None
    state = _load_state()
    with phases.phase("Docker engine (installs docker.io and starts dockerd when missing)"):
        lab.harness("docker")
    if "images_before" not in state:
        state["images_before"] = sorted(_images())
        state["had_network"] = _docker("network", "inspect", "gpufleet-lab").returncode == 0
        _save_state(state)

    # Two lines at once: the host image, then the demo host booting, beside the engine image,
    # its archive for the host and the tiny model (the two cores share the builds' waits). When
    # one line fails, it is said at once and the other starts no further phase.
    failed = threading.Event()

    def step(name: str, work: Callable[[], Any]) -> Any:
        if failed.is_set():
            raise lab.LabError("%s not started: the other line failed" % name)
        try:
            with phases.phase(name):
                return work()
        except Exception as exc:
            failed.set()
            _say("%s failed: %s" % (name, exc))
            raise

    def host_line() -> None:
        host_image = step("host image", lambda: lab.harness("image", "host"))
        step(
            "demo host start (systemd)",
            lambda: lab.start_hosts(HOSTS, host_image, scenario="demo", nested_docker=True),
        )
        # a host started just now has a new address and host key: its SSH access is written again
        step("demo host SSH access", write_ssh_access)

    def engine_line() -> tuple[str, str, str]:
        vllm_image = step("engine image (vLLM CPU)", lambda: lab.harness("image", "vllm-cpu"))
        archive = Path(step("engine image archive", lambda: lab.harness("archive", "vllm-cpu"))).name
        model = Path(step("tiny model", lambda: lab.harness("model", MODEL))).name
        return vllm_image, archive, model

    with ThreadPoolExecutor(max_workers=2) as pool:
        host_done, engine_done = pool.submit(host_line), pool.submit(engine_line)
        wait([host_done, engine_done], return_when=FIRST_EXCEPTION)
        if failed.is_set() and not (host_done.done() and engine_done.done()):
            _say("waiting for the other line's running step to end (nothing new starts)")
    host_done.result()  # the first failure, raised
    vllm_image, archive, model = engine_done.result()
    key = _key()
    extravars = {
        "gpufleet_demo_image": vllm_image,
        "gpufleet_demo_archive": "/srv/gpufleet-lab/images/" + archive,
        "gpufleet_demo_model": "/srv/gpufleet-lab/models/" + model,
        "gpufleet_demo_key": key,
        **connection(),
        # the fleet CA's certificate for this machine's clients (the stream below, curl, bench)
        "gpufleet_tls_ca_copy": str(ca_file()),
        # the demo host's address on the lab network is a name in its certificate
        "gpufleet_tls_networks": lab_networks(),
        # the lab's ulimits (tests/lab/lab_vars.yml): the demo host's Docker cannot grant more
        **lab.lab_vars(),
    }
    with phases.phase("site.yml on inventories/demo"):
        rc = run_playbook(
            RunRequest(
                playbook="site", inventory=str(inventory), extravars=extravars, verbose=verbose, echo=verbose > 0
            )
        )
    if rc != 0:
        _say(
            "site.yml failed (exit %d); the demo host is left as it is for a look (gpufleet demo down removes it)" % rc
        )
        return rc
    url = endpoint()
    if url is None:
        _say("the demo host has no address on the lab network")
        return 1
    print(
        "\nA streamed answer through the proxy (%s). The tiny model's weights are random, so its words are\n"
        "noise: the demo shows the path (proxy, engine, stream), not a model." % url
    )
    try:
        with phases.phase("streamed answer"):
            stream_answer(url, key, "Say hello to a new gpufleet user.", cacert=ca_file())
    except Exception as exc:  # the client's errors: connection, HTTP status, timeout
        _say(
            "site.yml passed but the stream through %s failed (%s: %s); `gpufleet demo status` shows the engine"
            % (url, type(exc).__name__, exc)
        )
        return 1
    print(ready_screen(url, key, time.monotonic() - started))
    return 0


def down() -> int:
    state = _load_state()
    containers = list(HOSTS)
    _say("removing %s and its Docker volume" % ", ".join(containers))
    lab.remove_hosts(containers)
    if "images_before" in state:
        before = set(state["images_before"])
        for image in sorted(i for i in _images() - before if i.startswith("gpufleet-lab/")):
            _say("removing image %s (demo up built it)" % image)
            _docker("rmi", image)
        if not state.get("had_network"):
            users = _docker("network", "inspect", "-f", "{{len .Containers}}", "gpufleet-lab").stdout.strip()
            if users == "0":
                _docker("network", "rm", "gpufleet-lab")
    for name in ("state.json", "key", "ca.crt"):
        (state_dir() / name).unlink(missing_ok=True)
    _drop_control_dir()
    shutil.rmtree(ssh_dir(), ignore_errors=True)
    # harness.sh's machine cache (GPUFLEET_CACHE, else XDG_CACHE_HOME's or ~/.cache's gpufleet)
    machine = Path(os.environ.get("GPUFLEET_CACHE") or cache_dir())
    _say(
        "removed (the model and the image archives stay in the machine's cache, %s: the next up loads the "
        "images from them)" % (machine / "lab")
    )
    return 0


def status(as_json: bool = False) -> int:
    if endpoint() is None:
        _say("not running (gpufleet demo up starts it)")
        return 1
    # written again: a container restarted by hand may have another address
    return run_status(
        RunRequest(playbook="status", inventory=str(_inventory()), extravars=connection(refresh=True), json=as_json)
    )
