# -*- coding: utf-8 -*-
# Copyright: gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's models (private to gpufleet.serving): the model store's catalog and each gpu host's
pulls from it.

- plan_store: the catalog (gpufleet_models: each model once, from the hub at a pinned revision or
  from a folder or archive on the store host) checked and laid out in the store's folder, with the
  URL path each is served at.
- plan_pulls: a gpu host's engine_model_pulls (catalog name -> a folder on the host) checked
  against the catalog and the store, and, where the store's manifest and the host's free space are
  known, whether each pull fits (the model's size less what the host already holds of it, plus a
  margin), named with the host, the folder, the free bytes and the fix before any host changes.
Read by the model_store role, the engine role (its preflight and its pulls) and `gpufleet models`.
"""

from __future__ import annotations

import base64
import json
import posixpath
import re

# a catalog name: a folder of the store and a path of its URL
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# a hub repository (owner/name)
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
# a commit of the hub: the revision that does not move
COMMIT = re.compile(r"^[0-9a-f]{40}$")
REVISION = re.compile(r"^[A-Za-z0-9._/-]{1,128}$")
CATALOG_FIELDS = ("name", "repo_id", "revision", "source")


def _abs(path):
    """An absolute path without . or .. parts or doubled slashes."""
    return isinstance(path, str) and path.startswith("/") and posixpath.normpath(path) == (path.rstrip("/") or "/")


def plan_store(catalog, params):
    """catalog: gpufleet_models; params: {dir, port}. Returns {errors, warnings, models: [{name, kind
    (hub or source), repo_id, revision, source, folder, path (its URL path)}], hub (a hub model is
    in the catalog)}."""
    errors, warnings, models = [], [], []
    if not isinstance(catalog, list):
        errors.append(
            "gpufleet_models=%r must be a list of models ({name, repo_id, revision} from the hub, or {name, source} "
            "from a folder or archive on the store host)." % (catalog,)
        )
        catalog = []
    folder = params.get("dir")
    if not _abs(folder) or folder == "/":
        errors.append("model_store_dir=%r must be an absolute folder (not /), e.g. /srv/gpufleet/store." % (folder,))
    port = params.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        errors.append("model_store_port=%r must be a TCP port number (1-65535)." % (port,))
    seen = set()
    for i, m in enumerate(catalog):
        where = "gpufleet_models[%d]" % i
        if not isinstance(m, dict) or set(m) - set(CATALOG_FIELDS):
            extra = sorted(map(str, set(m) - set(CATALOG_FIELDS))) if isinstance(m, dict) else []
            spelling = " (it also has %s: check the spelling)" % ", ".join(extra) if extra else ""
            errors.append(
                "%s must be a mapping of name and either repo_id and revision (the hub) or source (a folder or archive "
                "on the store host)%s." % (where, spelling)
            )
            continue
        name = m.get("name")
        if not isinstance(name, str) or not MODEL_NAME.fullmatch(name):
            errors.append(
                "%s.name=%r: use 1-128 letters, digits and . _ -, starting with a letter or digit (it is a folder of "
                "the store and a path of its address)." % (where, name)
            )
            continue
        where = "gpufleet_models[%d] (%s)" % (i, name)
        if name in seen:
            errors.append("%s: the name %s is given twice; give each model its own." % (where, name))
        seen.add(name)
        repo, source, revision = m.get("repo_id"), m.get("source"), m.get("revision")
        if bool(repo) == bool(source):
            errors.append(
                "%s: give either repo_id (with revision: from the hub) or source (a folder or a .tar, .tar.gz or .tgz "
                "archive on the store host), not %s." % (where, "both" if repo else "neither")
            )
            continue
        if revision is not None and (not isinstance(revision, str) or not REVISION.fullmatch(revision)):
            errors.append(
                "%s.revision=%r must be a hub commit, branch or tag (or a label for a source)." % (where, revision)
            )
            continue
        if repo:
            if not isinstance(repo, str) or not REPO_ID.fullmatch(repo):
                errors.append("%s.repo_id=%r must be a hub repository like Qwen/Qwen2.5-7B-Instruct." % (where, repo))
                continue
            if not revision:
                errors.append(
                    "%s: repo_id %s needs a revision: the hub commit to serve (40 hex digits, from the model's page or "
                    "`huggingface-cli repo info`), so every host gets the same files." % (where, repo)
                )
                continue
            if not COMMIT.fullmatch(revision):
                warnings.append(
                    "%s: revision %s is a branch or tag, which moves: the store keeps what it fetched first and does "
                    "not follow it. Pin the commit (40 hex digits) to say which files the fleet serves."
                    % (where, revision)
                )
        else:
            if not _abs(source) or source == "/":
                errors.append(
                    "%s.source=%r must be an absolute folder or .tar, .tar.gz or .tgz archive on the store host."
                    % (where, source)
                )
                continue
        models.append(
            {
                "name": name,
                "kind": "hub" if repo else "source",
                "repo_id": repo or "",
                "revision": revision or "",
                "source": source or "",
                "folder": posixpath.join(folder, name) if _abs(folder) else "",
                "path": "/models/%s/" % name,
            }
        )
    return {"errors": errors, "warnings": warnings, "models": models, "hub": any(m["kind"] == "hub" for m in models)}


def plan_pulls(pulls, catalog_names, store, host, facts=None):
    """pulls: engine_model_pulls ([{name, path}]); catalog_names: the store's model names; store:
    {host, address, port} or None (no model_store host); host: this host's name. facts (optional):
    {PATH: {total_size (the store's manifest), free (bytes free where PATH goes), have (bytes of the
    model the host holds there already), margin}}: a pull that does not fit is named.

    Returns {errors, pulls: [{name, path, url, server_name}]}."""
    errors, out = [], []
    if not pulls:
        return {"errors": [], "pulls": []}
    if not isinstance(pulls, list):
        return {"errors": ["engine_model_pulls=%r must be a list of {name, path}." % (pulls,)], "pulls": []}
    if not store:
        errors.append(
            "engine_model_pulls is set and the inventory has no model_store host: add the host that keeps the fleet's "
            "models to the model_store group (with gpufleet_models), or use engine_model_downloads."
        )
    paths = set()
    for i, p in enumerate(pulls):
        where = "engine_model_pulls[%d]" % i
        if not isinstance(p, dict) or set(p) - {"name", "path"} or not p.get("name") or not p.get("path"):
            errors.append(
                "%s=%r must be a mapping of name (a model of gpufleet_models) and path (a folder here)." % (where, p)
            )
            continue
        name, path = p["name"], p["path"]
        if name not in catalog_names:
            errors.append(
                "%s: %s is not in gpufleet_models (%s): add it there, so the store holds it, or fix the name."
                % (where, name, ", ".join(catalog_names) or "none")
            )
        if not _abs(path) or path == "/":
            errors.append(
                "%s.path=%r must be an absolute folder (not /) for the model, e.g. /srv/models/%s."
                % (where, path, name)
            )
            continue
        path = path.rstrip("/")
        if path in paths:
            errors.append("%s: the path %s is given twice." % (where, path))
        paths.add(path)
        fact = (facts or {}).get(path)
        if fact and isinstance(fact.get("total_size"), int) and isinstance(fact.get("free"), int):
            need = max(fact["total_size"] - int(fact.get("have") or 0), 0) + int(fact.get("margin") or 0)
            if fact["free"] < need:
                have, margin = int(fact.get("have") or 0), int(fact.get("margin") or 0)
                errors.append(
                    "%s cannot take %s at %s: it needs %s more (the model's %s, less %s already there, plus a "
                    "margin of %s) and %s has %s free. Free space there, give the pull a path on a larger disk, or "
                    "lower engine_model_pull_margin."
                    % (host, name, path, _size(need), _size(fact["total_size"]), _size(have), _size(margin),
                       posixpath.dirname(path) or "/", _size(fact["free"]))
                )  # fmt: skip
        url = ""
        if store:
            url = "https://%s:%d/models/%s/" % (_url_host(store["address"]), int(store["port"]), name)
        # (the store's certificate is checked by its inventory name, which it always carries)
        out.append({"name": name, "path": path, "url": url, "server_name": store["host"] if store else ""})
    return {"errors": errors, "pulls": out}


def pull_facts(manifests, spaces, margin):
    """The facts plan_pulls sizes pulls by, from the engine role's reads: manifests, the slurps of the
    store's manifests (a result per pull: item {name, path}, content base64 when it was there);
    spaces, the reads of each path's "FREE HAVE" bytes (item {path}, stdout). A pull whose manifest
    or space could not be read is left out (its pull checks the space itself)."""
    free = {}
    for r in spaces or []:
        parts = str((r or {}).get("stdout") or "").split()
        if len(parts) == 2 and all(p.isdigit() for p in parts):
            free[(r.get("item") or {}).get("path")] = (int(parts[0]), int(parts[1]))
    out = {}
    for r in manifests or []:
        path = ((r or {}).get("item") or {}).get("path")
        if not r.get("content") or path not in free:
            continue
        try:
            total = json.loads(base64.b64decode(r["content"]))["total_size"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(total, int):
            out[path] = {"total_size": total, "free": free[path][0], "have": free[path][1], "margin": int(margin or 0)}
    return out


def _url_host(address):
    return "[%s]" % address if ":" in str(address) else str(address)


def _size(n):
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return "%.1f %s" % (n / scale, unit)
    return "%d bytes" % n
