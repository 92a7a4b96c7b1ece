"""Find the serve environment's Python and hand the process over to the server in it.

`vitdeploy serve` runs wherever vitdeploy is installed (usually the main environment, with torch
and numpy 2); Triton runs in the serve environment (PyTriton, numpy < 2, a distribution-built
Python). The CLI checks what it can cheaply, then *replaces itself* (exec) with
``SERVE_PYTHON -m vitdeploy.serve.server ...``: the process a supervisor started is the server, so
SIGTERM/SIGINT reach it directly and its exit status is the command's.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

from ..errors import MissingDependencyError
from .options import ServeOptions

SERVE_PYTHON_ENV = "VITDEPLOY_SERVE_PYTHON"
DEFAULT_SERVE_VENV = ".venv-serve"  # what `make serve-env` / scripts/install_serve_env.sh create
SERVE_ENV_HINT = (
    "create it with `make serve-env` (or `bash scripts/install_serve_env.sh`), or make a venv from the system "
    "python3 with `pip install 'vitdeploy[serve]'` and pass its python with --serve-python or VITDEPLOY_SERVE_PYTHON"
)


def _checkout_root() -> Optional[Path]:
    """The source checkout vitdeploy runs from (an editable install), if any."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else None


def resolve_serve_python(explicit: Optional[str] = None) -> tuple:
    """(python path, where the choice came from). Order: --serve-python, $VITDEPLOY_SERVE_PYTHON,
    this interpreter when it has PyTriton, the checkout's .venv-serve."""
    if explicit:
        return explicit, "--serve-python"
    if os.environ.get(SERVE_PYTHON_ENV):
        return os.environ[SERVE_PYTHON_ENV], SERVE_PYTHON_ENV
    if importlib.util.find_spec("pytriton") is not None:
        return sys.executable, "this Python (it has PyTriton)"
    root = _checkout_root()
    if root is not None:
        return str(root / DEFAULT_SERVE_VENV / "bin" / "python"), f"the default {DEFAULT_SERVE_VENV}"
    raise MissingDependencyError(f"`vitdeploy serve` needs a Python with PyTriton and none is configured; {SERVE_ENV_HINT}")


_PROBE = (
    "import importlib.util as u, sys\n"
    "missing = [m for m in ('pytriton', 'vitdeploy') if u.find_spec(m) is None]\n"
    "print(','.join(missing)); sys.exit(1 if missing else 0)\n"
)


def check_serve_python(python: str, source: str) -> None:
    """One clear line when the serve environment is absent or incomplete (a cheap probe, no imports)."""
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise MissingDependencyError(f"no serve environment: {python} ({source}) does not exist; {SERVE_ENV_HINT}")
    try:
        probe = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MissingDependencyError(f"the serve environment's python {python} does not run ({exc}); {SERVE_ENV_HINT}") from None
    if probe.returncode != 0:
        missing = probe.stdout.strip() or (probe.stderr.strip().splitlines() or ["?"])[-1]
        raise MissingDependencyError(f"the serve environment {python} lacks {missing}; {SERVE_ENV_HINT}")


def server_command(python: str, opts: ServeOptions) -> List[str]:
    return [python, "-m", "vitdeploy.serve.server", *opts.to_argv()]


def launch(opts: ServeOptions, serve_python: Optional[str] = None) -> None:
    """Check, then exec the server (does not return on success)."""
    from ..bundle import Bundle

    opts.validate()
    Bundle.open(opts.bundle)  # a wrong path or a broken bundle: one line here, before Triton starts
    python, source = resolve_serve_python(serve_python)
    check_serve_python(python, source)
    argv = server_command(python, dataclasses.replace(opts, bundle=str(Path(opts.bundle).resolve())))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(python, argv)
