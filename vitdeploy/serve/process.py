"""Run `vitdeploy serve` as a child process: free ports, wait until the model is ready, stop with SIGTERM.

For integration tests and load tests (ours and a user's CI). Standard library only: readiness is
Triton's own ``GET /v2/models/<name>/ready`` over HTTP.

    with ServeProcess("bundle", ["--max-batch", "16"]) as server:
        client = tritonclient.http.InferenceServerClient(server.http_url)
        ...
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import List, Optional, Sequence

from ..errors import UserError


def free_ports(count: int, host: str = "127.0.0.1") -> List[int]:
    """``count`` distinct ports the OS reports free on ``host`` right now (all held while choosing)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def vitdeploy_command() -> List[str]:
    """How to run this interpreter's `vitdeploy` CLI."""
    script = Path(sys.executable).with_name("vitdeploy")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from vitdeploy.cli import main; sys.exit(main())"]


class ServeProcess:
    """`vitdeploy serve BUNDLE` on 127.0.0.1 with free ports; the server's log goes to ``log_path``."""

    def __init__(
        self,
        bundle: str | os.PathLike,
        extra_args: Sequence[str] = (),
        model_name: Optional[str] = None,
        startup_timeout_s: float = 180.0,
        log_path: Optional[str | os.PathLike] = None,
    ):
        from ..bundle import Bundle
        from ..triton import TritonOptions, model_name as repo_model_name

        self.bundle = str(bundle)
        self.model_name = model_name or repo_model_name(Bundle.open(self.bundle), TritonOptions())
        self.host = "127.0.0.1"
        self.port, self.grpc_port, self.metrics_port = free_ports(3, self.host)
        self.extra_args = list(extra_args)
        self.startup_timeout_s = startup_timeout_s
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkdtemp(prefix="vitdeploy-serve-")) / "server.log"
        self.proc: Optional[subprocess.Popen] = None

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def command(self) -> List[str]:
        return vitdeploy_command() + [
            "serve", self.bundle, "--host", self.host, "--port", str(self.port),
            "--grpc-port", str(self.grpc_port), "--metrics-port", str(self.metrics_port), *self.extra_args,
        ]  # fmt: skip

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def start(self) -> "ServeProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            # A session of its own: a terminal's Ctrl-C reaches only the caller; stop() signals the server.
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise UserError(f"`vitdeploy serve` exited with status {self.proc.returncode} before its model was ready:\n{self.log_tail()}")
            if self.model_ready():
                return self
            time.sleep(0.25)
        self.kill()
        raise UserError(f"`vitdeploy serve` did not get model {self.model_name!r} ready within {self.startup_timeout_s:.0f} s:\n{self.log_tail()}")

    def model_ready(self) -> bool:
        url = f"http://{self.host}:{self.port}/v2/models/{self.model_name}/ready"
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                return reply.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout_s: float = 90.0) -> Optional[int]:
        """SIGTERM (the server drains, then exits); SIGKILL to its whole session after ``timeout_s``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the session this object started, nothing else
            except ProcessLookupError:
                pass
            self.proc.wait(30)

    def __enter__(self) -> "ServeProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
