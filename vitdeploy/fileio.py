"""Atomic writes: every file vitdeploy writes appears whole or not at all.

Each writer creates a temporary file in the destination folder (same file system, so the final
``os.replace`` is atomic), fsyncs it and renames it over the target. An interrupted command leaves
the previous file, never a truncated one that looks valid.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from .errors import UserError


def _default_mode(kind: str) -> int:
    """The permissions a plain open()/mkdir() would give (mkstemp/mkdtemp use 0600/0700)."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if kind == "dir" else 0o666) & ~umask


def _ensure_dir(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create directory {directory}: {exc.strerror}; choose a writable location") from None
    if not os.access(directory, os.W_OK):
        raise UserError(f"directory {directory} is not writable; choose a writable location")


def ensure_writable_dir(directory: str | os.PathLike) -> None:
    """Fail early, before expensive work, when nothing can be written in ``directory``.

    os.access is not enough (root passes it on read-only or virtual file systems): a probe file is
    created and removed.
    """
    directory = Path(directory)
    _ensure_dir(directory)
    try:
        fd, probe = tempfile.mkstemp(prefix=".vitdeploy-probe.", dir=directory)
    except OSError as exc:
        raise UserError(f"cannot write in {directory}: {exc.strerror}; choose a writable location") from None
    os.close(fd)
    os.unlink(probe)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; on success rename it onto ``target``.

    For writers that insist on a file name (``onnx.save``, ``torch.onnx.export``, TensorRT).
    """
    target = Path(target)
    _ensure_dir(target.parent)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix or ".tmp", dir=target.parent)
    except OSError as exc:
        raise UserError(f"cannot write in {target.parent}: {exc.strerror}; choose a writable location") from None
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, _default_mode("file"))
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def atomic_write_bytes(target: str | os.PathLike, data: bytes) -> Path:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)
    return Path(target)


def atomic_write_text(target: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(target, text.encode("utf-8"))


def atomic_write_json(target: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(target, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    # numpy scalars and arrays show up in reports; keep them readable without importing numpy here.
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def swap_dir(new: Path, target: Path) -> None:
    """Replace folder ``target`` with the complete folder ``new`` (same file system): two renames,
    the old folder removed only after the new one is in place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old.{os.getpid()}")
        os.replace(target, old)
    os.replace(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def staged_directory(target: str | os.PathLike) -> Iterator[Path]:
    """Build a whole directory in a sibling staging folder, then swap it in.

    The previous directory stays intact until the new one is complete; the swap is two renames.
    """
    target = Path(target)
    _ensure_dir(target.parent)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.staging.", dir=target.parent))
    except OSError as exc:
        raise UserError(f"cannot write in {target.parent}: {exc.strerror}; choose a writable location") from None
    os.chmod(staging, _default_mode("dir"))
    try:
        yield staging
        swap_dir(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
