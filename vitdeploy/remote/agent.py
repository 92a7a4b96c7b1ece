"""The device side of ``--on``: ``vitdeploy remote-agent ACTION`` (hidden), run over ssh by the workstation.

Actions (JSON on stdout, one object):

- ``hello [--index DIR]...``: vitdeploy version, bundle and engine formats, Python, CPU architecture,
  host name, Jetson model: what the workstation compares before sending anything; with ``--index``
  also the listing of DIR (one ssh round trip instead of two).
- ``index DIR``: sha256 of every file under DIR (created if missing). Hashes are kept in the hash
  manifest ``DIR/.vitdeploy-hashes.json`` keyed by size and mtime, so a big graph is hashed once.
- ``receive DIR``: a tar stream on stdin, ending with a ``.vitdeploy-end.json`` member that lists every
  file with its sha256 and the files to delete. Files are staged in a hidden folder under DIR and
  moved into place (one rename each) only after the whole stream arrived and every hash matched:
  a connection lost mid-copy leaves DIR as it was.
- ``run DIR -- COMMAND ARGS...``: ``vitdeploy COMMAND ARGS`` with DIR as its current directory, its
  output streamed, stopped when the workstation's connection closes (Ctrl-C there, a dropped link).
- ``send DIR [PATH...] [--changed] [--whole engines]``: the same tar format on stdout for the files
  under the given relative paths; with ``--changed`` only those the command changed since the last
  index (so the run's results come back in one call).

Only the standard library and vitdeploy's light core: this runs on JetPack 5's Python 3.8.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import shutil
import socket
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import IO, Dict, Iterable, List, Optional, Tuple

from ..fileio import sha256_file

HASHES_FILE = ".vitdeploy-hashes.json"
END_MEMBER = ".vitdeploy-end.json"
STAGING_PREFIX = ".vitdeploy-incoming."
PROTOCOL = 1
_CHUNK = 1 << 20


class TransferError(Exception):
    """A tar stream that is incomplete, unsafe or does not match its own hash list."""


def is_private(rel: str) -> bool:
    """Hidden names (staging folders, temp files of atomic writes, the hash manifest) never travel."""
    return any(part.startswith(".") for part in rel.split("/"))


def walk_files(root: Path) -> Dict[str, Path]:
    """Relative POSIX path -> file, for every regular, non-hidden file under ``root``."""
    found: Dict[str, Path] = {}
    if not root.is_dir():
        return found
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                found[path.relative_to(root).as_posix()] = path
    return found


def safe_relpath(name: str) -> str:
    """A member name that stays inside the destination, or TransferError."""
    if not name or name.startswith("/") or "\\" in name:
        raise TransferError(f"refusing member name {name!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        raise TransferError(f"refusing member name {name!r}")
    return "/".join(parts)


# -- hash manifest -----------------------------------------------------------------------------
def index(root: Path) -> Dict[str, str]:
    """sha256 of every file under ``root``; unchanged files (same size and mtime) are not re-read."""
    root.mkdir(parents=True, exist_ok=True)
    cache_path = root / HASHES_FILE
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    hashes: Dict[str, str] = {}
    fresh = {}
    for rel, path in walk_files(root).items():
        st = path.stat()
        entry = cache.get(rel) if isinstance(cache, dict) else None
        if not (isinstance(entry, dict) and entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns):
            entry = {"sha256": sha256_file(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        fresh[rel] = entry
        hashes[rel] = entry["sha256"]
    try:
        _write_json_atomic(cache_path, fresh)
    except OSError:
        pass  # a read-only folder: hashed again next time, nothing else changes
    return hashes


def _write_json_atomic(path: Path, obj: object) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(obj, fh, indent=0, sort_keys=True)
    os.replace(tmp, path)


# -- tar streams -------------------------------------------------------------------------------
def write_stream(out: IO[bytes], files: Dict[str, Path], delete: Iterable[str] = ()) -> None:
    """``files`` (relative name -> file) as a tar stream, then the end member with their hashes."""
    listed: Dict[str, str] = {}
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(files):
            path = files[rel]
            info = tarfile.TarInfo(rel)
            info.size = path.stat().st_size
            info.mtime = int(path.stat().st_mtime)
            info.mode = 0o644
            digest = hashlib.sha256()
            with open(path, "rb") as fh:
                tar.addfile(info, _HashingReader(fh, digest))
            listed[rel] = digest.hexdigest()
        end = json.dumps({"protocol": PROTOCOL, "files": listed, "delete": sorted(delete)}).encode()
        info = tarfile.TarInfo(END_MEMBER)
        info.size = len(end)
        tar.addfile(info, io.BytesIO(end))


class _HashingReader:
    """A file wrapper that hashes what tarfile reads from it (one pass over big graphs)."""

    def __init__(self, fh: IO[bytes], digest: "hashlib._Hash"):
        self._fh, self._digest = fh, digest

    def read(self, size: int = -1) -> bytes:
        data = self._fh.read(size)
        self._digest.update(data)
        return data


def read_stream(source: IO[bytes], staging: Path) -> Tuple[Dict[str, str], List[str]]:
    """Unpack a stream written by :func:`write_stream` into ``staging``; check it is whole and intact.

    Returns (relative path -> sha256, paths to delete). Raises TransferError when the stream ended
    early, a member is unsafe, or a file's hash differs from the end member's list.
    """
    received: Dict[str, str] = {}
    end: Optional[dict] = None
    try:
        with tarfile.open(fileobj=source, mode="r|") as tar:
            for member in tar:
                if member.name == END_MEMBER:
                    fh = tar.extractfile(member)
                    end = json.loads(fh.read().decode()) if fh else None
                    continue
                if not member.isfile():
                    raise TransferError(f"refusing non-file member {member.name!r}")
                rel = safe_relpath(member.name)
                dest = staging / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                digest = hashlib.sha256()
                fh = tar.extractfile(member)
                with open(dest, "wb") as out:
                    for block in iter(lambda: fh.read(_CHUNK), b""):  # type: ignore[union-attr]
                        digest.update(block)
                        out.write(block)
                    out.flush()
                    os.fsync(out.fileno())
                os.utime(dest, (member.mtime, member.mtime))
                received[rel] = digest.hexdigest()
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise TransferError(str(exc) or type(exc).__name__) from None
    if end is None:
        raise TransferError("the stream ended before its end marker")
    if end.get("protocol") != PROTOCOL:
        raise TransferError(f"transfer protocol {end.get('protocol')!r}, expected {PROTOCOL}")
    expected = {safe_relpath(k): v for k, v in end.get("files", {}).items()}
    if expected != received:
        missing = sorted(set(expected) - set(received)) or sorted(k for k in expected if expected[k] != received.get(k))
        raise TransferError(f"the copy is incomplete or damaged ({', '.join(missing[:3]) or 'extra files'})")
    return received, [safe_relpath(p) for p in end.get("delete", [])]


def move_into_place(staging: Path, root: Path, files: Iterable[str]) -> None:
    """Rename each staged file onto its place under ``root`` (each rename is atomic)."""
    for rel in files:
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / rel, dest)


# -- actions -----------------------------------------------------------------------------------
def hello() -> dict:
    from .. import __version__
    from ..bundle import FORMAT as BUNDLE_FORMAT
    from ..engine.fingerprint import FORMAT as ENGINE_FORMAT

    model = None
    try:
        model = Path("/proc/device-tree/model").read_text(errors="replace").strip("\x00 \n") or None
    except OSError:
        pass
    return {
        "agent": PROTOCOL,
        "vitdeploy_version": __version__,
        "bundle_format": BUNDLE_FORMAT,
        "engine_format": ENGINE_FORMAT,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "hostname": socket.gethostname(),
        "device_model": model,
        "executable": sys.executable,
    }


def receive(root: Path, source: IO[bytes]) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(root)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=root))
    try:
        received, delete = read_stream(source, staging)
        move_into_place(staging, root, received)
        for rel in delete:
            target = root / rel
            if target.is_file():
                target.unlink()
        hashes = index(root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"received": len(received), "deleted": len(delete), "files": hashes}


def run_command(cwd: Path, args: List[str]) -> int:
    """Run ``vitdeploy ARGS`` in ``cwd`` and stop it when the workstation goes away.

    Without a terminal, ssh does not pass Ctrl-C on, and a dropped connection leaves the remote
    command running (a TensorRT build can take many minutes). The workstation holds this process's
    stdin open for the whole run; when it closes (the client exited, was interrupted, or the link
    dropped), the command's process group gets SIGTERM, then SIGKILL after 10 s.
    """
    import signal
    import subprocess
    import threading

    code = "import sys; from vitdeploy.cli import main; main(sys.argv[1:], prog_name='vitdeploy')"
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # stream lines as they come, not in 8 kB blocks
    child = subprocess.Popen([sys.executable, "-c", code, *args], cwd=str(cwd), stdin=subprocess.DEVNULL, env=env,
                             start_new_session=True)

    def stop_when_stdin_closes() -> None:
        try:  # os.read on the descriptor: no buffer lock held by this daemon thread at interpreter exit
            while os.read(0, 1 << 16):
                pass
        except OSError:
            pass
        if child.poll() is None:
            try:
                os.killpg(child.pid, signal.SIGTERM)
                child.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
            except OSError:
                pass

    threading.Thread(target=stop_when_stdin_closes, daemon=True).start()
    returncode = child.wait()
    return 128 - returncode if returncode < 0 else returncode  # killed by signal N: exit 128+N, as a shell says


def _remove_stale_staging(root: Path, older_than_s: float = 3600.0) -> None:
    """Staging folders left by an agent that was killed outright (an hour old: no live copy is that slow)."""
    import time

    for path in root.glob(STAGING_PREFIX + "*"):
        try:
            if time.time() - path.stat().st_mtime > older_than_s:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def _recorded_hashes(root: Path) -> Dict[str, str]:
    try:
        cache = json.loads((root / HASHES_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {rel: entry.get("sha256") for rel, entry in cache.items() if isinstance(entry, dict)} if isinstance(cache, dict) else {}


def send(root: Path, paths: Iterable[str], out: IO[bytes], changed: bool = False, whole: Iterable[str] = ()) -> None:
    """Stream the files under ``paths`` (all files when none are given).

    ``changed``: only files whose sha256 differs from the hash manifest, i.e. what the command run
    since the last ``index``/``receive`` wrote. ``whole``: folders whose direct sub-folders travel as one
    unit (``engines``: a changed engine.json brings its model.plan along, so the pair is swapped in whole).
    """
    before = _recorded_hashes(root) if changed else {}
    now = index(root) if changed else None
    files = walk_files(root)
    prefixes = [safe_relpath(p) for p in paths]

    def under(rel: str) -> bool:
        return not prefixes or any(rel == p or rel.startswith(p + "/") for p in prefixes)

    wanted = {rel for rel in files if under(rel) and (now is None or before.get(rel) != now.get(rel))}
    for folder in whole:
        folder = safe_relpath(folder)
        units = {"/".join(rel.split("/")[:2]) for rel in wanted if rel.startswith(folder + "/") and rel.count("/") >= 2}
        wanted |= {rel for rel in files if any(rel.startswith(u + "/") for u in units)}
    write_stream(out, {rel: files[rel] for rel in wanted})
