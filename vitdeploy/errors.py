"""One exception family. The CLI prints a VitDeployError as one line and exits with its code;
anything else is a bug in vitdeploy and keeps its traceback."""

from __future__ import annotations


class VitDeployError(Exception):
    """Base of every error vitdeploy raises on purpose. ``exit_code`` is what the CLI returns."""

    exit_code = 1


class UserError(VitDeployError):
    """Bad input the user can fix: a wrong path, an unknown model, a size that doesn't fit."""


class UsageError(UserError):
    """A command line that cannot mean anything (options that exclude each other, a value outside the
    choices): exit code 2, as for Click's own usage errors. Everything else a user can fix is 1."""

    exit_code = 2


class ConfigError(UserError):
    """A configuration that cannot work, e.g. a patch-size change or a spec/weights mismatch."""


class MissingDependencyError(UserError):
    """An optional module (torch, onnxruntime, tensorrt, ...) is needed and not installed."""


class DeviceError(UserError):
    """The hardware or runtime this needs is absent (no GPU, wrong TensorRT version, ...)."""


class IntegrityError(UserError):
    """A file's content is not what the manifest recorded (a graph swapped or edited after export)."""


class CheckFailed(VitDeployError):
    """A verification gate did not hold (the artifact does not compute what the reference does)."""


class InternalError(VitDeployError):
    """A broken invariant inside vitdeploy: a bug to report, not a user mistake."""

    exit_code = 3


class Terminated(KeyboardInterrupt):
    """SIGTERM (a service manager, `kill`, a CI timeout): unwound like Ctrl-C, so every staged or
    temporary file is removed on the way out, then reported as 143 (128 + SIGTERM)."""


class StorageError(UserError):
    """A write the file system refused: full (ENOSPC) or over quota (EDQUOT), read-only (EROFS), or not
    ours to write (EACCES, EPERM). Its one line names the folder and, for a full disk, about how much
    the write needed (vitdeploy.fileio.storage_error); nothing was left behind."""

    def __init__(self, message: str, errno: int | None = None):
        super().__init__(message)
        self.errno = errno


def _storage_errnos() -> frozenset[int]:
    import errno

    return frozenset(code for code in (errno.ENOSPC, getattr(errno, "EDQUOT", None), errno.EROFS, errno.EACCES, errno.EPERM)
                     if code is not None)


# The errno values of an OSError that means "this place cannot take the write" rather than a bug.
STORAGE_ERRNOS = _storage_errnos()
