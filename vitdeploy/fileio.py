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
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import Terminated, UserError


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
    return atomic_write_text(target, json.dumps(obj, indent=2, sort_keys=False, default=json_default) + "\n")


_held: dict[str, Any] = {"depth": 0, "caught": [], "previous": {}}  # the one deferral scope of this process
_unwinding: list[int] = []  # signals whose exception was raised and not yet reported (see raise_if_interrupted)


def note_interrupt(signum: int) -> None:
    """A signal handler raised for ``signum``: remembered until the command reports it."""
    _unwinding.append(signum)


def interrupted() -> int | None:
    """The signal raised for and not yet reported, if any (clear it with :func:`forget_interrupt`)."""
    return _unwinding[0] if _unwinding else None


def forget_interrupt() -> None:
    _unwinding.clear()


def raise_if_interrupted() -> None:
    """Raise again an interruption some code swallowed. Python drops exceptions raised inside weakref
    callbacks and ``__del__`` (torch's GC hooks run them at any moment), so a Ctrl-C can land there and
    be lost; every commit point asks first, so no file lands after the user said stop."""
    if _unwinding:
        raise Terminated() if _unwinding[0] == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while files that must agree land together - a graph and the manifest that
    vouches for it, a command's reports and the record naming them - and re-deliver the first one when
    the outermost such block ends, so an interruption leaves all of them or none. Blocks nest; only the
    main thread receives signals, elsewhere this does nothing. Keep the block to renames and small writes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _held["depth"] == 0:
        raise_if_interrupted()
        _held["caught"], _held["previous"] = [], {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) is not None:  # None: a handler Python did not install, left alone
                _held["previous"][sig] = signal.signal(sig, lambda number, _frame: _held["caught"].append(number))
    _held["depth"] += 1
    try:
        yield
    finally:
        _held["depth"] -= 1
        if _held["depth"] == 0:
            for sig, handler in _held["previous"].items():
                signal.signal(sig, handler)
            for number in _held["caught"][:1]:
                os.kill(os.getpid(), number)


def json_default(obj: Any) -> Any:
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


# When this process started (close enough: vitdeploy imports this module first thing). A staging folder
# older than that, whose writer is gone, was left by a killed export (SIGKILL, power loss).
PROCESS_START = time.time()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def remove_stale_staging(target: Path) -> list[Path]:
    """Remove the staging, swap-out and scratch folders a killed export into ``target`` left beside it.

    Their names carry the writer's pid (``.NAME.staging.PID.*``, ``.NAME.old.PID``, ``.NAME.exporter.PID.*``): a folder whose
    writer is gone is removed; one whose writer still runs (a concurrent export) is left alone; an
    older name without a pid is removed when it predates this process.
    """
    removed = []
    for kind in ("staging", "old", "exporter"):
        for path in target.parent.glob(f".{target.name}.{kind}.*"):
            parts = path.name[len(f".{target.name}.{kind}."):].split(".")
            pid = int(parts[0]) if parts[0].isdigit() else None
            try:
                stale = (not _pid_alive(pid) and pid != os.getpid()) if pid is not None else path.stat().st_mtime < PROCESS_START
            except OSError:
                continue
            if stale and path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


@contextlib.contextmanager
def staged_directory(target: str | os.PathLike, before_swap: Callable[[], None] | None = None,
                     then: Callable[[], None] | None = None) -> Iterator[Path]:
    """Build a whole directory in a sibling staging folder, then swap it in.

    The previous directory stays intact until the new one is complete; the swap is two renames.
    ``before_swap`` runs just before them (export re-checks that the target is still its to replace);
    ``then`` (recording the folder in a manifest) runs with the swap in one signal-free step.
    Staging folders that killed runs left beside the target are removed first.
    """
    target = Path(target)
    _ensure_dir(target.parent)
    remove_stale_staging(target)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.staging.{os.getpid()}.", dir=target.parent))
    except OSError as exc:
        raise UserError(f"cannot write in {target.parent}: {exc.strerror}; choose a writable location") from None
    os.chmod(staging, _default_mode("dir"))
    try:
        yield staging
        if before_swap is not None:
            before_swap()
        with signals_deferred():
            swap_dir(staging, target)
            if then is not None:
                then()
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


# -- hashes that cost nothing on repeat ---------------------------------------------------------------
# Every command verifies a graph's sha256 against the manifest before it runs it. Hashing a ViT-L graph
# takes seconds, so the digest is remembered per file identity: device, inode, size, mtime and ctime.
# ctime cannot be set back by a user (`touch -d` or `cp -p` move it forward), so a file that was
# rewritten, replaced or swapped in from elsewhere always misses and is hashed again.
HASH_CACHE_ENTRIES = 512
_HASHES: dict[str, str] = {}


def _identity(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"


def _hash_cache_file() -> Path | None:
    root = os.environ.get("VITDEPLOY_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME") or (Path.home() / ".cache")
    if os.environ.get("VITDEPLOY_CACHE_DIR") is None:
        root = Path(root) / "vitdeploy"
    return Path(root) / "sha256-by-identity.json"


def _load_hash_cache(file: Path | None) -> dict[str, str]:
    if file is None or not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return {}  # a damaged cache is only a cache: hash again
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(data, dict) else {}


def sha256_cached(path: str | os.PathLike) -> str:
    """sha256 of a file, remembered (in this process and in the user's cache folder) by its identity."""
    path = Path(path)
    key = _identity(path)
    if key in _HASHES:
        return _HASHES[key]
    file = _hash_cache_file()
    stored = _load_hash_cache(file)
    digest = stored.get(key) or sha256_file(path)
    _HASHES[key] = digest
    if stored.get(key) != digest and file is not None:
        stored[key] = digest
        keep = dict(list(stored.items())[-HASH_CACHE_ENTRIES:])
        try:  # best effort: a read-only home only costs a re-hash next time
            file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(file, json.dumps(keep))
        except (OSError, UserError):
            pass
    return digest
