"""Artifacts the tests build once per run and share across pytest-xdist workers (and across runs).

An export takes seconds to a minute; many tests read the same bundle. Each artifact lives in its own
folder under one cache root, built by the first worker that asks for it while it holds a file lock;
the others wait on the lock and then read it. The key holds everything that can change what gets
built: the caller's key (source, options), the content of every file or folder the key names, the
library versions that shape an export, and a hash of the project's source files (so an edit to the
exporter rebuilds; an edit to a test does not).

A folder is complete when its stamp exists. The stamp also lists every file's size and mtime, so a
test that changed a shared bundle instead of copying it is caught at the next use: the entry is
rebuilt and a warning names it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
import warnings
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

REPO = Path(__file__).resolve().parents[1]
STAMP = ".artifact-stamp.json"
# The project's own code and data that an artifact is made from.
SOURCE_TREES = ("vitdeploy", "exporters", "calibration")
# Libraries whose versions change exported graphs, checkpoints or verification numbers.
LIBRARIES = ("torch", "torchvision", "timm", "transformers", "onnx", "onnxruntime", "onnxscript", "onnxslim",
             "numpy", "safetensors", "huggingface_hub", "scikit-learn", "pillow")
# Environment variables that change what a source resolves to (a hub cache) or how it is exported.
ENV_PREFIXES = ("HF_", "HUGGINGFACE_", "TIMM_", "VITDEPLOY_")
ENV_IGNORED = ("VITDEPLOY_ORT_THREADS",)  # threads change speed, not results
UNUSED_DAYS = 7  # entries untouched this long are removed at the end of a run


@lru_cache(maxsize=1)
def source_hash() -> str:
    digest = hashlib.sha256()
    for tree in SOURCE_TREES:
        for path in sorted((REPO / tree).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(REPO)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()


@lru_cache(maxsize=1)
def library_versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": sys.version.split()[0]}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def _path_fingerprint(value: str) -> str | None:
    """sha256 of a file's bytes, or of a folder's relative paths and bytes; None if ``value`` is no path."""
    if len(value) > 4096 or "\n" in value:
        return None
    try:
        path = Path(value.split(":", 1)[1] if value.split(":", 1)[0] in ("hf", "ref") else value)
        if not path.exists():
            return None
    except (OSError, ValueError):
        return None
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        digest.update(str(file.relative_to(path) if file != path else file.name).encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def _with_contents(value: Any) -> Any:
    """The key as given, with every path in it paired with a hash of what it points at."""
    if isinstance(value, dict):
        return {str(k): _with_contents(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_with_contents(v) for v in value]
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        fingerprint = _path_fingerprint(value)
        return [value, fingerprint] if fingerprint else value
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return repr(value)  # dataclasses such as PosEmbedInterpolation: their repr lists every field


def cache_key(key: Any) -> str:
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) and k not in ENV_IGNORED}
    body = json.dumps([_with_contents(key), library_versions(), source_hash(), env], sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:24]


def _listing(root: Path) -> dict[str, list[int]]:
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != STAMP and "__pycache__" not in path.parts:
            st = path.stat()
            out[str(path.relative_to(root))] = [st.st_size, st.st_mtime_ns]
    return out


def _cpu_seconds() -> float:
    """This process's CPU time and its waited-for children's: what a build cost (the stamp records it, so
    the suite's costliest shared artifacts can be listed from the cache folder)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@contextmanager
def _locked(lock: Path) -> Iterator[None]:
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class ArtifactCache:
    """``get(key, build)``: the folder for ``key``, made once by ``build(folder)``."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def get(self, key: Any, build: Callable[[Path], None], label: str = "") -> Path:
        name = cache_key(key)
        folder = self.root / name
        stamp = folder / STAMP
        with _locked(self.root / f"{name}.lock"):
            if stamp.is_file():
                recorded = json.loads(stamp.read_text())
                if recorded["files"] == _listing(folder):
                    os.utime(stamp)  # last use, for pruning
                    return folder
                now = _listing(folder)
                changed = sorted(k for k in set(recorded["files"]) | set(now) if recorded["files"].get(k) != now.get(k))[:3]
                warnings.warn(f"cached test artifact {label or key!r} was changed since it was built "
                              f"({', '.join(changed)}); rebuilt. A test that changes a shared "
                              "bundle must copy it first (copy_bundle).", stacklevel=3)
            if folder.exists():  # changed, or a build that died before its stamp
                shutil.rmtree(folder)
            folder.mkdir()
            cpu_before = _cpu_seconds()
            try:
                build(folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            stamp.write_text(json.dumps({"key": _with_contents(key), "label": label, "built": time.time(),
                                         "build_cpu_s": round(_cpu_seconds() - cpu_before, 2), "files": _listing(folder)}, default=str))
            return folder

    def prune(self, days: float = UNUSED_DAYS) -> int:
        """Remove entries not used for ``days`` (the stamp's mtime is the last use)."""
        cutoff = time.time() - days * 86400
        removed = 0
        for stamp in self.root.glob(f"*/{STAMP}"):
            if stamp.stat().st_mtime < cutoff:
                with _locked(self.root / f"{stamp.parent.name}.lock"):
                    shutil.rmtree(stamp.parent, ignore_errors=True)
                (self.root / f"{stamp.parent.name}.lock").unlink(missing_ok=True)
                removed += 1
        return removed
