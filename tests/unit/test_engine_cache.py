"""engine_compile_cache: each instance's compile caches in a host folder of its own, mounted into its
container, with the engine's cache variables (the engine registry's cache_env) pointing into it; off,
none of it. The rendered docker run arguments carry it all, so a change restarts the instance as
every other rendered change does (roles/engine/tasks/changes.yml compares docker-run.args)."""

from __future__ import annotations

import dataclasses

import pytest
from engine_role import ROLE_DEFAULTS, role_defaults
from test_engines import GPU, HOST, MODELS, chat

from ansible_collections.gpufleet.serving.plugins.module_utils import _engine_options
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_options import ENGINE_INFO
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_plan import plan
from ansible_collections.gpufleet.serving.plugins.module_utils._engine_render import CACHE_MOUNT, render

ROOT_DIR = "/var/cache/gpufleet/engines"


def _env(args):
    """{name: value} of the --env pairs of docker run arguments."""
    return dict(args[i + 1].split("=", 1) for i, arg in enumerate(args) if arg == "--env")


def _volumes(args):
    return [args[i + 1] for i, arg in enumerate(args) if arg == "--volume"]


def _planned(inst, **defaults):
    out = plan([inst], gpu=GPU, models=MODELS, host=HOST, defaults=role_defaults(**defaults))
    assert out["errors"] == [], out["errors"]
    return out["instances"][0]


def test_the_role_keeps_compile_caches_by_default():
    assert ROLE_DEFAULTS["engine_compile_cache"] is True
    assert ROLE_DEFAULTS["engine_cache_dir"] == ROOT_DIR
    assert role_defaults()["cache_dir"] == ROOT_DIR


@pytest.mark.parametrize("engine", sorted(ENGINE_INFO))
def test_the_mount_and_the_engines_variables(engine):
    inst = chat(engine=engine) if engine == "vllm" else chat(engine=engine, tensor_parallel_size=None)
    out = _planned(inst)
    args = out["docker_args"]
    assert out["cache_dir"] == ROOT_DIR + "/chat"
    assert "%s/chat:%s:rw" % (ROOT_DIR, CACHE_MOUNT) in _volumes(args)
    env = _env(args)
    expected = {name: "%s/%s" % (CACHE_MOUNT, sub) for name, sub in ENGINE_INFO[engine].cache_env}
    assert expected and {k: env.get(k) for k in expected} == expected
    # the surge copy (the new settings, started beside it) shares the folder: what it compiles, the restart loads
    assert "%s/chat:%s:rw" % (ROOT_DIR, CACHE_MOUNT) in _volumes(out["surge"]["docker_args"])
    # each engine's own variables, not the other's
    others = {n for e, info in ENGINE_INFO.items() if e != engine for n, _ in info.cache_env} - set(expected)
    assert not others & set(env)


def test_vllm_gets_its_cache_root_triton_and_flashinfer():
    env = _env(_planned(chat())["docker_args"])
    assert env["VLLM_CACHE_ROOT"] == CACHE_MOUNT + "/vllm"
    assert env["TRITON_CACHE_DIR"] == CACHE_MOUNT + "/triton"
    assert env["FLASHINFER_WORKSPACE_BASE"] == CACHE_MOUNT + "/flashinfer"
    # vLLM puts Inductor's cache under its own key folder itself (compiler_interface.py): not set
    assert "TORCHINDUCTOR_CACHE_DIR" not in env


def test_off_there_is_no_mount_and_no_variable():
    out = _planned(chat(), cache_dir="")
    args = out["docker_args"]
    assert out["cache_dir"] is None
    assert not [v for v in _volumes(args) if CACHE_MOUNT in v]
    names = {n for info in ENGINE_INFO.values() for n, _ in info.cache_env}
    assert not names & set(_env(args))


def test_turning_it_on_or_off_or_moving_it_changes_what_restarts_the_instance():
    # changes.yml writes docker_args, one per line, to docker-run.args and restarts the instance
    # whose file differs (as for any other rendered change)
    def run_file(**defaults):
        return "\n".join(_planned(chat(), **defaults)["docker_args"]) + "\n"

    on, off, moved = run_file(), run_file(cache_dir=""), run_file(cache_dir="/srv/cache")
    assert len({on, off, moved}) == 3
    assert run_file() == on  # and nothing else moves it: a second run restarts nothing


def test_rendering_follows_the_registry(monkeypatch):
    changed = dataclasses.replace(ENGINE_INFO["vllm"], cache_env=(("VLLM_CACHE_ROOT", "v"), ("X_CACHE", "x")))
    monkeypatch.setitem(_engine_options.ENGINE_INFO, "vllm", changed)
    env = _env(render(chat(), defaults=role_defaults())["docker_args"])
    assert env["VLLM_CACHE_ROOT"] == CACHE_MOUNT + "/v" and env["X_CACHE"] == CACHE_MOUNT + "/x"
    assert "TRITON_CACHE_DIR" not in env


def test_an_instances_own_env_wins():
    env = _env(_planned(chat(env={"TRITON_CACHE_DIR": "/scratch/triton"}))["docker_args"])
    assert env["TRITON_CACHE_DIR"] == "/scratch/triton"
    assert env["VLLM_CACHE_ROOT"] == CACHE_MOUNT + "/vllm"


@pytest.mark.parametrize("root", ["cache", "/var/cache:/x", "/var/../etc", "/var/cache\n/x"])
def test_a_cache_folder_docker_cannot_mount_is_refused(root):
    out = plan([chat()], gpu=GPU, models=MODELS, host=HOST, defaults=role_defaults(cache_dir=root))
    assert out["instances"] == []
    assert any("engine_cache_dir=%r" % root in e and "engine_compile_cache: false" in e for e in out["errors"])


def test_a_trailing_slash_is_the_same_folder():
    assert _planned(chat(), cache_dir=ROOT_DIR + "/")["cache_dir"] == ROOT_DIR + "/chat"
