"""engine-run (roles/engine/files/engine-run), the command gpufleet-engine@NAME.service runs: a
model gpufleet fetched (it has a manifest) starts only whole and verified (issue 48: an interrupted
download started an engine on a partial model); a folder gpufleet did not fetch starts as before.
Docker is replaced by echo (GPUFLEET_DOCKER) to see what would run."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT

RUN = ROOT / "roles" / "engine" / "files" / "engine-run"
HELPER = ROOT / "roles" / "common" / "files" / "gpufleet-model"


def engine_run(tmp_path, model):
    conf = tmp_path / "engines" / "tiny"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "docker-run.args").write_text("--name\ngpufleet-tiny\n--volume\n%s:/models/tiny:ro\nimage:1\n" % model)
    helper = tmp_path / "helper"
    helper.write_text('#!/bin/sh\nexec %s %s "$@"\n' % (sys.executable, HELPER))
    helper.chmod(0o755)
    env = dict(os.environ, GPUFLEET_ENGINE_DIR=str(tmp_path / "engines"), GPUFLEET_DOCKER="/bin/echo",
               GPUFLEET_MODEL_HELPER=str(helper))  # fmt: skip
    return subprocess.run(["bash", str(RUN), "tiny"], capture_output=True, text=True, env=env, check=False)


def test_a_fetched_model_starts_only_whole(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(os.urandom(1000))
    subprocess.run([sys.executable, str(HELPER), "manifest", str(model), "--name", "tiny"], check=True)
    ok = engine_run(tmp_path, model)
    assert ok.returncode == 0 and ok.stdout.split() == ["run", "--name", "gpufleet-tiny", "--volume",
                                                        "%s:/models/tiny:ro" % model, "image:1"]  # fmt: skip
    # a shard gone (an interrupted download): not started, the file named
    (model / "model.safetensors").unlink()
    cut = engine_run(tmp_path, model)
    assert cut.returncode == 3 and cut.stdout == "", cut
    assert "model.safetensors is missing" in cut.stderr and "not whole: not started" in cut.stderr


def test_a_folder_gpufleet_did_not_fetch_starts_as_before(tmp_path):
    model = tmp_path / "own"
    model.mkdir()
    done = engine_run(tmp_path, model)
    assert done.returncode == 0 and done.stdout.startswith("run --name gpufleet-tiny"), done
