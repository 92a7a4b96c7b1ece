"""One exception family. The CLI prints a VitDeployError as one line and exits with its code;
anything else is a bug in vitdeploy and keeps its traceback."""


class VitDeployError(Exception):
    """Base of every error vitdeploy raises on purpose. ``exit_code`` is what the CLI returns."""

    exit_code = 1


class UserError(VitDeployError):
    """Bad input the user can fix: a wrong path, an unknown model, a size that doesn't fit."""


class ConfigError(UserError):
    """A configuration that cannot work, e.g. a patch-size change or a spec/weights mismatch."""


class MissingDependencyError(UserError):
    """An optional module (torch, onnxruntime, tensorrt, ...) is needed and not installed."""


class DeviceError(UserError):
    """The hardware or runtime this needs is absent (no GPU, wrong TensorRT version, ...)."""


class CheckFailed(VitDeployError):
    """A verification gate did not hold (the artifact does not compute what the reference does)."""


class InternalError(VitDeployError):
    """A broken invariant inside vitdeploy: a bug to report, not a user mistake."""

    exit_code = 3
