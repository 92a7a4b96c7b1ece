"""Atomic writes: every file vitdeploy writes appears whole or not at all.

Each writer creates a temporary file in the destination folder (same file system, so the final
``os.replace`` is atomic), fsyncs it and renames it over the target. An interrupted command leaves
the previous file, never a truncated one that looks valid.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import STORAGE_ERRNOS, Terminated, UserError
from .storage import STAGED_NAME, disk_errors, free_bytes, require_space, storage_error


def _default_mode(kind: str) -> int:
    """The permissions a plain open()/mkdir() would give (mkstemp/mkdtemp use 0600/0700)."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if kind == "dir" else 0o666) & ~umask


def _ensure_dir(directory: Path) -> list[Path]:
    """Create ``directory`` and its missing parents; the ones created, outermost first (removed again,
    when empty, if the write they were made for fails: see _remove_new)."""
    missing = []
    for parent in [directory, *directory.parents]:
        if parent.exists():
            break
        missing.append(parent)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _remove_new(missing[::-1])
        if exc.errno in STORAGE_ERRNOS:
            raise storage_error(exc.errno, Path(exc.filename or directory).parent) from None
        raise UserError(f"cannot create directory {directory}: {exc.strerror}; choose a writable location") from None
    if not directory.is_dir():
        raise UserError(f"{directory} is not a directory; choose another location")
    return missing[::-1]


def _remove_new(created: list[Path]) -> None:
    for path in reversed(created):
        with contextlib.suppress(OSError):
            path.rmdir()  # only when still empty: another writer may have put something there


def _create(folder: Path, make: Callable[[], Any]) -> Any:
    """``make()`` (a mkstemp or mkdtemp in ``folder``); an OSError that is no refused write (a virtual file
    system such as /proc answers ENOENT) is one line too."""
    try:
        return make()
    except OSError as exc:
        if exc.errno in STORAGE_ERRNOS:
            raise
        raise UserError(f"cannot write in {folder}: {exc.strerror}; choose a writable location") from None


def ensure_writable_dir(directory: str | os.PathLike, needed: int = 0, what: str | None = None) -> None:
    """Fail early, before expensive work, when nothing (or not ``needed`` bytes and the reserve) can be
    written in ``directory``.

    os.access is not enough (root passes it on read-only or virtual file systems): a probe file is
    created and removed.
    """
    directory = Path(directory)
    created = _ensure_dir(directory)
    try:
        with disk_errors(directory, needed or None, what):
            fd, probe = _create(directory, lambda: tempfile.mkstemp(prefix=f".vitdeploy.probe.{os.getpid()}.", dir=directory))
            os.close(fd)
            os.unlink(probe)
            require_space(directory, needed, what)
    finally:
        _remove_new(created)


@contextlib.contextmanager
def temp_file(target: str | os.PathLike, suffix: str | None = None, needed: int | None = None) -> Iterator[Path]:
    """A hidden, empty temporary file beside ``target`` (same file system, so a rename is atomic), named
    with this process's id so a later run can tell a dead writer's leftover (remove_stale); removed when
    the block ends unless renamed. Refused writes in the block become a StorageError; folders made for it
    are removed again when it fails."""
    target = Path(target)
    created = _ensure_dir(target.parent)
    tmp_path: Path | None = None

    def written() -> int:
        return needed or (tmp_path.stat().st_size if tmp_path is not None and tmp_path.exists() else 0)

    done = False
    try:
        with disk_errors(target.parent, written, target.name):
            if needed:
                require_space(target.parent, needed, target.name)
            fd, tmp = _create(target.parent, lambda: tempfile.mkstemp(prefix=f".{target.name}.tmp.{os.getpid()}.", suffix=suffix or "",
                                                                     dir=target.parent))
            os.close(fd)
            tmp_path = Path(tmp)
            os.chmod(tmp_path, _default_mode("file"))  # mkstemp's 0600 would make it unreadable to others
            yield tmp_path
        done = True
    finally:
        if tmp_path is not None:
            with contextlib.suppress(FileNotFoundError):
                tmp_path.unlink()
        if not done:
            _remove_new(created)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, suffix: str | None = None, needed: int | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; on success rename it onto ``target``.

    For writers that insist on a file name (``onnx.save``, ``torch.onnx.export``, TensorRT). A file that
    would leave less than the disk reserve free is refused (and removed) instead of renamed.
    """
    target = Path(target)
    with temp_file(target, suffix, needed) as tmp_path:
        yield tmp_path
        size = tmp_path.stat().st_size
        free = free_bytes(target.parent)
        require_space(target.parent, size, target.name, free=None if free is None else free + size)
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        if _held["depth"] and threading.current_thread() is threading.main_thread():
            landing = tmp_path.with_name(tmp_path.name + ".land")  # kept past temp_file's clean-up, until the block ends
            os.replace(tmp_path, landing)
            _held["landing"].append((landing, target))
        else:
            os.replace(tmp_path, target)


def atomic_write_bytes(target: str | os.PathLike, data: bytes) -> Path:
    with atomic_path(target, needed=len(data)) as tmp:
        tmp.write_bytes(data)
    return Path(target)


def atomic_write_text(target: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(target, text.encode("utf-8"))


def atomic_write_json(target: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(target, json.dumps(obj, indent=2, sort_keys=False, default=json_default) + "\n")


# the one deferral scope of this process; "landing": (temporary file, target) renames held to its end
_held: dict[str, Any] = {"depth": 0, "caught": [], "previous": {}, "landing": []}
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
    main thread receives signals, elsewhere this does nothing. Keep the block to renames and small writes.

    Files written with :func:`atomic_path` (and the atomic_write_* helpers) in the block are renamed into
    place when the outermost block ends without an error, so a write the disk refuses halfway (the third
    report of five) leaves none of them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _held["depth"] == 0:
        raise_if_interrupted()
        _held["caught"], _held["previous"], _held["landing"] = [], {}, []
        for sig in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) is not None:  # None: a handler Python did not install, left alone
                _held["previous"][sig] = signal.signal(sig, lambda number, _frame: _held["caught"].append(number))
    _held["depth"] += 1
    landed = False
    try:
        yield
        landed = True
    finally:
        _held["depth"] -= 1
        if _held["depth"] == 0:
            landing, _held["landing"] = _held["landing"], []
            try:
                for tmp, target in landing:
                    if landed:
                        os.replace(tmp, target)
            finally:
                for tmp, _ in landing:
                    with contextlib.suppress(FileNotFoundError):
                        tmp.unlink()
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


# -- what a killed writer left ---------------------------------------------------------------------------
# Every hidden file or folder vitdeploy writes beside its target is named ``.NAME.KIND.PID[.*]``: a
# temporary file (tmp), a staged graph (staged), a staged folder (staging) and the one it replaces (old),
# export's scratch folder (exporter), a command's work folder (work). SIGKILL or a power cut cannot be
# cleaned up after, so the next run of any command on that bundle removes those whose writer is gone.
_LEGACY_NAME = re.compile(r"\.(.+)\.[A-Za-z0-9_]{8}\.(?:staged|tmp)")  # before writers' pids were in the names
# When this process started (close enough: vitdeploy imports this module first thing). A leftover without
# a pid is stale when it is older than that.
PROCESS_START = time.time()


def _pid_alive(pid: int, since: float | None = None) -> bool:
    """Whether process ``pid`` runs and (Linux, ``since`` given) already ran at time ``since``: a pid the
    system reused for a later process is not the writer."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        pass
    except OSError:
        return False
    if since is None:
        return True
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
        started = boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return True
    return started <= since + 300.0  # slack for coarse ticks and a network file system's clock


def remove_stale(folder: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Remove from ``folder`` the staging folders and temporary files (``.NAME.KIND.PID*``; only for
    ``name`` when given) whose writer is gone. A live writer's (a concurrent command) are left alone, and
    so are this process's; a leftover named before pids were (``.NAME.XXXXXXXX.staged``/``.tmp``) is
    removed when it predates this process. Best effort: what cannot be removed stays."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        match = STAGED_NAME.fullmatch(entry.name)
        legacy = _LEGACY_NAME.fullmatch(entry.name) if match is None else None
        found = match or legacy
        if found is None or (name is not None and found.group(1) != name):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if match is not None:
            pid = int(match.group(3))
            stale = pid != os.getpid() and not _pid_alive(pid, since=st.st_mtime)
        else:
            stale = st.st_mtime < PROCESS_START
        if not stale:
            continue
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
        if not os.path.lexists(path):
            removed.append(path)
    return removed


def remove_stale_staging(target: Path) -> list[Path]:
    """Remove what killed writers of ``target`` left beside it (see remove_stale)."""
    return remove_stale(Path(target).parent, Path(target).name)


_swept: set[str] = set()


def sweep_bundle(root: str | os.PathLike) -> None:
    """Once per process per bundle: remove what killed commands left in it (its top folder, reports/,
    engines/) and beside it (a killed export's staging folder)."""
    root = Path(root)
    key = os.path.abspath(root)
    if key in _swept:
        return
    _swept.add(key)
    for folder in (root, root / "reports", root / "engines"):
        remove_stale(folder)
    remove_stale(root.parent, root.name)


@contextlib.contextmanager
def hidden_dir(parent: str | os.PathLike, name: str, kind: str) -> Iterator[Path]:
    """A new hidden folder ``parent/.NAME.KIND.PID.*`` (see remove_stale), removed when the block ends;
    what killed writers left there is removed first. Refused writes in the block become a StorageError."""
    parent = Path(parent)
    created = _ensure_dir(parent)
    remove_stale(parent, name)
    folder: Path | None = None
    done = False
    try:
        with disk_errors(parent, what=f"the temporary files of {name}"):
            folder = Path(_create(parent, lambda: tempfile.mkdtemp(prefix=f".{name}.{kind}.{os.getpid()}.", dir=parent)))
            os.chmod(folder, _default_mode("dir"))
            yield folder
        done = True
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        if not done:
            _remove_new(created)


def _tree_bytes(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            total += path.lstat().st_size if path.is_file() else 0
    return total


@contextlib.contextmanager
def library_temp(folder: str | os.PathLike) -> Iterator[None]:
    """Point ``tempfile``'s default folder at ``folder`` (one of ours) while a library that makes its own
    temporary files runs (ORT's quantizer, onnx and onnxslim), so they land where we remove them."""
    previous = tempfile.tempdir
    tempfile.tempdir = os.fspath(folder)
    try:
        yield
    finally:
        tempfile.tempdir = previous


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
    with hidden_dir(target.parent, target.name, "staging") as staging, disk_errors(target.parent, lambda: _tree_bytes(staging), target.name):
        yield staging
        if before_swap is not None:
            before_swap()
        with signals_deferred():
            swap_dir(staging, target)
            if then is not None:
                then()


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
