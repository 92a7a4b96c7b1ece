"""A write the file system refuses - full (ENOSPC) or over quota (EDQUOT), read-only (EROFS), not ours
(EACCES, EPERM) - as one line that names the folder and, for a full disk, about what the write needed.

Every writer in :mod:`vitdeploy.fileio` and :mod:`vitdeploy.onnx_io` runs its writes inside
:func:`disk_errors` and checks :func:`require_space` first; library steps that write on their own run
in a folder of ours with ``symptoms=True``; the CLI maps what still escapes (:func:`storage_cause`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path
from typing import Callable, Iterator

from .errors import STORAGE_ERRNOS, StorageError, UserError

# -- a write the file system refuses: one line, nothing left ------------------------------------------
# Every helper below turns ENOSPC, EDQUOT, EROFS, EACCES and EPERM at any write into one StorageError
# naming the folder (and for a full disk about what the write needed), and removes what it created;
# the CLI maps what escaped them (a library writing on its own) to the same line (storage_cause).
RESERVE_ENV = "VITDEPLOY_DISK_RESERVE"
# A write that would leave less than this free is refused: a disk filled to the last byte breaks the
# next command's temporary files (and every other program's), and a library that writes on a full disk
# may leave a truncated file instead of an error (ORT's quantizer did: issue 36).
DEFAULT_RESERVE_BYTES = 1 << 20


def disk_reserve() -> int:
    """Bytes every write leaves free: ``VITDEPLOY_DISK_RESERVE`` (bytes, ``0`` = none), else 1 MiB."""
    text = os.environ.get(RESERVE_ENV, "").strip()
    if not text:
        return DEFAULT_RESERVE_BYTES
    if not text.isdigit():
        raise UserError(f"{RESERVE_ENV} must be a number of bytes (0 = no reserve), got {text!r}")
    return int(text)


def human_bytes(n: float) -> str:
    for power, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 2**power:
            return f"{n / 2**power:.1f} {unit}"
    return f"{n:.0f} B"


def free_bytes(folder: str | os.PathLike) -> int | None:
    """Bytes an unprivileged write can still use on ``folder``'s file system (its nearest existing parent)."""
    path = Path(folder)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):  # no statvfs on Windows: no estimate
        return None
    return st.f_bavail * st.f_frsize


# The hidden files and folders vitdeploy writes beside a target (vitdeploy.fileio.remove_stale):
# ``.NAME.KIND.PID[.*]``. A refused write inside one is reported at the folder the user named.
STAGING_KINDS = ("tmp", "staged", "staging", "old", "exporter", "work", "probe")
STAGED_NAME = re.compile(r"\.(.+?)\.(" + "|".join(STAGING_KINDS) + r")\.(\d+)(?:\..*)?")


def visible_folder(folder: str | os.PathLike) -> Path:
    """``folder`` without the hidden staging folders of vitdeploy at its end."""
    folder = Path(folder)
    while STAGED_NAME.fullmatch(folder.name) and folder != folder.parent:
        folder = folder.parent
    return folder


def storage_error(code: int, folder: str | os.PathLike, needed: int | None = None, what: str | None = None,
                  free: int | None = None, at_least: bool = False) -> StorageError:
    """The one line for a write refused with ``code`` (an errno) in ``folder``: ``needed`` bytes (``at_least``:
    only what was written before the disk filled), ``free`` (else read now)."""
    folder = Path(folder)
    shown = visible_folder(folder)
    shown = Path(os.path.abspath(shown)) if str(shown) in (".", "") else shown
    if code in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        free = free_bytes(folder) if free is None else free
        quota = "the disk quota is used up" if code != errno.ENOSPC else "not enough free space"
        parts = []
        if needed:
            parts.append(f"{'writing ' + what if what else 'the write'} needs {'more than' if at_least else 'about'} "
                         f"{human_bytes(needed)}")
        if free is not None:
            parts.append(f"{human_bytes(free)} free")
        reserve = disk_reserve()
        if reserve:
            parts.append(f"vitdeploy leaves {human_bytes(reserve)} free")
        text = (f"{quota} in {shown}{': ' + ', '.join(parts) if parts else ''}; nothing was written - free some space "
                f"there or choose another location")
    elif code == errno.EROFS:
        text = f"{shown} is on a read-only file system; nothing was written - copy it to a writable location or choose another one"
    else:
        text = f"no permission to write in {shown}; nothing was written - choose a writable location or fix its permissions"
    return StorageError(text, code)


def require_space(folder: str | os.PathLike, needed: int, what: str | None = None, free: int | None = None) -> None:
    """Refuse, before anything is written, a write of ``needed`` bytes that would leave less than the reserve."""
    free = free_bytes(folder) if free is None else free
    if free is not None and free < needed + disk_reserve():
        raise storage_error(errno.ENOSPC, folder, needed, what, free)


def _filled(folder: Path) -> bool:
    free = free_bytes(folder)
    return free is not None and free < max(disk_reserve(), 64 << 10)


@contextlib.contextmanager
def disk_errors(folder: str | os.PathLike, needed: int | Callable[[], int] | None = None, what: str | None = None,
                symptoms: bool = False) -> Iterator[None]:
    """Turn a refused write in the block into a StorageError naming ``folder`` (``needed``: the bytes being
    written, or a callable giving them, read only when the write fails). ``symptoms``: for a library that
    writes on its own (ORT's quantizer re-reads the file it could not finish and fails to parse it), any
    error raised while ``folder``'s disk is left full is reported as the full disk it is."""
    folder = Path(folder)
    free = free_bytes(folder)  # when the write began: a failed one may have used it all
    try:
        yield
    except StorageError:
        raise
    except OSError as exc:
        if exc.errno not in STORAGE_ERRNOS:
            raise
        raise _refused(exc.errno, folder, needed, what, free) from None
    except Exception as exc:
        if not (symptoms and _filled(folder)):
            raise
        raise _refused(errno.ENOSPC, folder, needed, what, free) from exc


def _refused(code: int, folder: Path, needed: int | Callable[[], int] | None, what: str | None, free: int | None) -> StorageError:
    if not callable(needed):
        return storage_error(code, folder, needed, what, free)
    # a writer of unknown size: at least what it wrote before the disk filled (removed on the way out)
    return storage_error(code, folder, needed(), what, free, at_least=True)


def storage_cause(exc: BaseException) -> StorageError | None:
    """The StorageError for an exception whose cause chain holds a refused write (a library's own write
    that no helper here wrapped), or None. The folder is the file's; the size is not known here."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, StorageError):
            return exc
        if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
            name = exc.filename2 or exc.filename
            place = Path(os.fsdecode(name)) if name else Path.cwd()
            return storage_error(exc.errno, place if place.is_dir() else place.parent)
        exc = exc.__cause__ or exc.__context__
    return None
