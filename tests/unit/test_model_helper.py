"""gpufleet-model (roles/common/files/gpufleet-model), the hosts' model helper, run as the roles run
it (python3, a subprocess) against real folders and a real HTTP(S) server on loopback: a manifest
and its verification, the check an engine's start makes, a pull that stops and goes on from where
it stopped (an HTTP range), a file the store sends wrong named and fetched again, a copy that stays
wrong refused, a pull that does not fit refused before any byte, a fill from a folder and from an
archive (one that reaches outside its folder refused), and the pull's rate limit (its arithmetic,
with the clock replaced: no timed assertion)."""

from __future__ import annotations

import hashlib
import http.server
import importlib.machinery
import importlib.util
import io
import json
import os
import ssl
import subprocess
import sys
import tarfile
import threading

import pytest
from conftest import ROOT

HELPER = ROOT / "roles" / "common" / "files" / "gpufleet-model"


def run(*args):
    done = subprocess.run([sys.executable, str(HELPER), *map(str, args)], capture_output=True, text=True, check=False)
    return done.returncode, done.stdout.strip(), done.stderr.strip()


def model(folder, files=None):
    files = files or {"config.json": b'{"model_type": "llama"}', "model.safetensors": os.urandom(300_000),
                      "tokenizer/tokenizer.json": b"{}" * 1000}  # fmt: skip
    for name, data in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def flip(path, at=1000):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 1]))


def test_manifest_verify_and_check(tmp_path):
    src = tmp_path / "m"
    files = model(src)
    assert run("manifest", src, "--name", "tiny", "--revision", "r1")[0] == 0
    manifest = json.loads((src / ".gpufleet" / "manifest.json").read_text())
    assert manifest["total_size"] == sum(map(len, files.values()))
    assert {f["path"]: f["sha256"] for f in manifest["files"]} == {
        k: hashlib.sha256(v).hexdigest() for k, v in files.items()
    }
    assert run("check", src)[0] == 0 and run("verify", src)[0] == 0
    status = json.loads(run("status", src)[1])[0]
    assert status["verified"] and status["name"] == "tiny" and status["revision"] == "r1"
    # a flipped byte: the start's check sees the file changed, verify names its sha256
    flip(src / "model.safetensors")
    rc, _, err = run("check", src)
    assert rc == 3 and "model.safetensors changed since it was verified" in err, err
    rc, _, err = run("verify", src)
    assert rc == 3 and "model.safetensors: sha256" in err and "the manifest says" in err, err
    # a missing file and a cut one
    (src / "config.json").unlink()
    rc, _, err = run("check", src)
    assert rc == 3 and "config.json is missing" in err, err
    # a folder gpufleet never fetched
    rc, _, err = run("check", tmp_path)
    assert rc == 3 and "has no manifest" in err


class Store(http.server.ThreadingHTTPServer):
    """Serves FOLDER with ranges; `cut` files stop after half their bytes once; `bad` ones come
    with a flipped byte (`bad_times` times)."""

    daemon_threads = True

    def __init__(self, folder):
        self.folder, self.cut, self.bad, self.bad_times, self.ranges = folder, set(), set(), 1, []
        super().__init__(("127.0.0.1", 0), Handler)


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        st = self.server
        rel = self.path.lstrip("/")
        path = st.folder / rel
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        if rel in st.bad and st.bad_times > 0:
            st.bad_times -= 1
            data = data[:10] + bytes([data[10] ^ 1]) + data[11:]
        start = 0
        rng = self.headers.get("Range")
        if rng:
            st.ranges.append((rel, rng))
            start = int(rng.split("=")[1].split("-")[0])
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if rel in st.cut:
            st.cut.discard(rel)
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        self.wfile.write(body)


@pytest.fixture
def store(tmp_path):
    folder = tmp_path / "store" / "tiny" / "r1"
    model(folder)
    assert run("manifest", folder, "--name", "tiny", "--revision", "r1")[0] == 0
    server = Store(folder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def url(server):
    return "http://127.0.0.1:%d/" % server.server_address[1]


def test_a_pull_stopped_half_way_goes_on_from_where_it_stopped(tmp_path, store):
    dest = tmp_path / "models" / "tiny"
    partial = tmp_path / "models" / "tiny.gpufleet-partial"
    # a pull killed half-way leaves the staging folder with a part of a file, and nothing at DEST:
    # the engine's start refuses what is there
    partial.mkdir(parents=True)
    data = (store.folder / "model.safetensors").read_bytes()
    (partial / "model.safetensors").write_bytes(data[:100_000])
    assert run("check", dest)[0] == 3
    # the next pull asks only for the rest (an HTTP range), and a connection the store cuts
    # half-way through another file is resumed in the same run
    store.cut.add("tokenizer/tokenizer.json")
    rc, out, err = run("pull", url(store), dest)
    assert rc == 0 and out.startswith("fetched"), (out, err)
    assert ("model.safetensors", "bytes=100000-") in store.ranges, store.ranges
    assert ("tokenizer/tokenizer.json", "bytes=1000-") in store.ranges, store.ranges
    assert not partial.exists() and run("check", dest)[0] == 0
    assert (dest / "model.safetensors").read_bytes() == data
    # again: nothing to fetch
    rc, out, _ = run("pull", url(store), dest)
    assert rc == 0 and out.startswith("unchanged")


def test_a_file_that_fails_its_manifest_is_named_and_fetched_again(tmp_path, store):
    dest = tmp_path / "tiny"
    store.bad.add("model.safetensors")
    rc, out, err = run("pull", url(store), dest)
    assert rc == 0 and out.startswith("fetched"), (out, err)
    assert "model.safetensors: sha256" in err and "fetching it again" in err, err
    # a flipped byte on the host: the next pull finds it (its time changed) and fetches that file
    # again, alone: the others are kept from the folder (linked into the staging folder)
    flip(dest / "model.safetensors")
    store.ranges.clear()
    rc, out, err = run("pull", url(store), dest)
    assert rc == 0 and out.endswith("from the store: model.safetensors)"), (out, err)
    assert run("verify", dest, "--full")[0] == 0
    # the store's copy wrong every time: refused, the old copy kept
    store.bad_times = 2
    flip(dest / "model.safetensors")
    rc, _, err = run("pull", url(store), dest)
    assert rc == 3 and "fails its manifest twice" in err, err


def test_a_pull_that_does_not_fit_is_refused_before_any_byte(tmp_path, store):
    dest = tmp_path / "tiny"
    rc, _, err = run("pull", url(store), dest, "--margin", 10**18)
    assert rc == 4 and "not enough disk space for %s" % dest in err and "free" in err, err
    assert not (tmp_path / "tiny.gpufleet-partial").exists() and not dest.exists()


def test_a_manifest_that_leaves_its_folder_is_refused(tmp_path, store):
    manifest = json.loads((store.folder / ".gpufleet" / "manifest.json").read_text())
    manifest["files"][0]["path"] = "../../etc/passwd"
    (store.folder / ".gpufleet" / "manifest.json").write_text(json.dumps(manifest))
    rc, _, err = run("pull", url(store), tmp_path / "tiny")
    assert rc == 1 and "names a file gpufleet will not take" in err, err


def test_fill_from_a_folder_and_an_archive(tmp_path):
    src = tmp_path / "src"
    files = model(src)
    (src / "model.safetensors").chmod(0o600)  # (as transformers writes its shards)
    rc, out, _ = run("fill", src, tmp_path / "a", "--name", "tiny", "--revision", "r1")
    assert rc == 0 and out.startswith("fetched") and run("check", tmp_path / "a")[0] == 0
    # readable by the store's nginx and the engines' containers, whatever the source's modes
    assert {oct(p.stat().st_mode & 0o777) for p in (tmp_path / "a").rglob("*") if p.is_file()} == {"0o644"}
    assert run("fill", src, tmp_path / "a", "--name", "tiny", "--revision", "r1")[1].startswith("unchanged")
    archive = tmp_path / "tiny.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname="tiny-model")
    rc, out, _ = run("fill", archive, tmp_path / "b", "--name", "tiny")
    assert rc == 0 and sorted(p.name for p in (tmp_path / "b").iterdir() if p.name != ".gpufleet") == sorted(
        {k.split("/")[0] for k in files}
    )
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tar:
        info = tarfile.TarInfo("../outside")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    rc, _, err = run("fill", evil, tmp_path / "c", "--name", "evil")
    assert rc == 1 and "outside its folder" in err and not (tmp_path / "outside").exists()


def test_pull_over_tls_with_a_client_certificate(tmp_path, store):
    sys.path.insert(0, str(ROOT / "tests" / "labtests"))
    from fleet_certs import store_certificates

    tls = tmp_path / "tls"
    store_certificates(tls, {"gpu1": tmp_path / "client"}, "127.0.0.1")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tls / "fleet-ca.crt"))
    ctx.load_cert_chain(str(tls / "store.crt"), str(tls / "store.key"))
    ctx.verify_mode = ssl.CERT_REQUIRED
    store.socket = ctx.wrap_socket(store.socket, server_side=True)
    base = "https://127.0.0.1:%d/" % store.server_address[1]
    args = ["--ca", tls / "fleet-ca.crt", "--cert", tmp_path / "client" / "store-client.crt",
            "--key", tmp_path / "client" / "store-client.key"]  # fmt: skip
    rc, out, err = run("pull", base, tmp_path / "tiny", *args)
    assert rc == 0 and out.startswith("fetched"), (out, err)
    # by its address, the certificate checked by the store's name (the certificate names both here)
    rc, out, err = run("pull", base, tmp_path / "named", *args, "--server-name", "127.0.0.1")
    assert rc == 0 and out.startswith("fetched"), (out, err)
    # a name the certificate does not carry: refused
    rc, _, err = run("pull", base, tmp_path / "other", *args, "--server-name", "llm.example.com")
    assert rc == 1 and "certificate verify failed" in err, err
    # without the client certificate the store refuses
    rc, _, err = run("pull", base, tmp_path / "tiny2", "--ca", tls / "fleet-ca.crt")
    assert rc == 1 and "cannot read the store's manifest" in err, err


def _helper_module():
    loader = importlib.machinery.SourceFileLoader("gpufleet_model_helper", str(HELPER))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_rate_limit_keeps_the_pull_at_its_rate(monkeypatch):
    helper = _helper_module()
    clock = {"now": 100.0, "slept": 0.0}
    monkeypatch.setattr(helper.time, "monotonic", lambda: clock["now"])

    def sleep(s):
        clock["slept"] += s
        clock["now"] += s

    monkeypatch.setattr(helper.time, "sleep", sleep)
    limit = helper.Limiter(1_000_000)
    for _ in range(10):
        limit(250_000)  # 2.5 MB at 1 MB/s: 2.5 s in all, the transfer itself taking no time
    assert abs(clock["slept"] - 2.5) < 1e-9
    clock["slept"] = 0.0
    helper.Limiter(0)(10**9)
    assert clock["slept"] == 0.0
