"""A real Hugging Face hub cache, written by tests from models they build (no network here).

The layout is huggingface_hub's (https://huggingface.co/docs/huggingface_hub/guides/manage-cache):

    <HF_HOME>/hub/models--<org>--<name>/
        refs/main                      the commit hash the branch points to
        blobs/<sha256>                 file contents
        snapshots/<commit>/<file>      relative symlinks into blobs/

so timm's and transformers' own loaders, run with ``HF_HOME`` and ``HF_HUB_OFFLINE=1``, resolve
``main`` to the commit and read the files exactly as they would from a downloaded cache.
``hub_env`` gives the environment for a CLI subprocess; ``offline_hub`` points the running
process's huggingface_hub at the cache (it reads HF_HUB_CACHE and HF_HUB_OFFLINE at import time,
so the module constants are patched as well as the variables).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest


def repo_folder(hf_home: Path, repo_id: str) -> Path:
    return Path(hf_home) / "hub" / f"models--{repo_id.replace('/', '--')}"


def write_snapshot(hf_home: Path, repo_id: str, files: dict[str, bytes | Path], commit: str | None = None, ref: str = "main") -> str:
    """Put ``files`` (name -> bytes or a file to copy) into the cache as ``repo_id`` at ``commit``; returns the commit."""
    blobs = {}
    for name, content in files.items():
        data = content if isinstance(content, bytes) else Path(content).read_bytes()
        blobs[name] = data
    if commit is None:  # a stable 40-hex id derived from the contents, like a git commit would be
        digest = hashlib.sha1()
        for name in sorted(blobs):
            digest.update(name.encode() + hashlib.sha256(blobs[name]).digest())
        commit = digest.hexdigest()
    folder = repo_folder(hf_home, repo_id)
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, data in blobs.items():
        blob_name = hashlib.sha256(data).hexdigest()
        (folder / "blobs" / blob_name).write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(os.path.relpath(folder / "blobs" / blob_name, link.parent))
    (folder / "refs" / ref).write_text(commit)
    return commit


def write_folder(hf_home: Path, repo_id: str, folder: Path, commit: str | None = None) -> str:
    """Every file of a save_pretrained()/save_for_hf() folder into the cache as ``repo_id``."""
    return write_snapshot(hf_home, repo_id, {p.name: p for p in Path(folder).iterdir() if p.is_file()}, commit)


def write_state_dict(hf_home: Path, repo_id: str, model: Any, extra: dict[str, bytes] | None = None) -> str:
    """A timm model's weights as timm publishes them on the hub: model.safetensors (+ config.json for hf-hub: names)."""
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
        return write_snapshot(hf_home, repo_id, {"model.safetensors": path.read_bytes(), **(extra or {})})


def timm_hub_folder(model: Any, folder: Path, model_args: dict[str, Any]) -> Path:
    """What timm's push_to_hf_hub uploads (config.json with pretrained_cfg and model_args, model.safetensors)."""
    from timm.models import save_for_hf

    save_for_hf(model, str(folder), model_args=model_args, safe_serialization=True)
    for extra in ("pytorch_model.bin",):  # safetensors only, as on the hub today
        if (folder / extra).exists():
            (folder / extra).unlink()
    return folder


def hub_env(hf_home: Path, offline: bool = True, **extra: str) -> dict[str, str]:
    """Environment for a CLI subprocess that must see this cache (and nothing else)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env.update(HF_HOME=str(hf_home), HF_HUB_CACHE=str(Path(hf_home) / "hub"), HF_HUB_DISABLE_TELEMETRY="1")
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    env.update(extra)
    return env


def offline_hub(monkeypatch: pytest.MonkeyPatch, hf_home: Path) -> None:
    """This process's huggingface_hub (imported already) reads ``hf_home`` and stays offline."""
    from huggingface_hub import constants

    hub = str(Path(hf_home) / "hub")
    for key, value in (("HF_HOME", str(hf_home)), ("HF_HUB_CACHE", hub), ("HF_HUB_OFFLINE", "1")):
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(constants, "HF_HOME", str(hf_home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", hub)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def copy_cache(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
