"""What `vitdeploy serve` is asked to do, checked once, and its round trip through a command line.

The CLI (main environment) validates these and hands them to the server process (serve
environment) as arguments of ``python -m vitdeploy.serve.server``; both sides use this module so
the two cannot drift apart.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import List, Optional

from .. import precisions
from ..errors import UserError

SERVE_BACKENDS = ("auto", "tensorrt", "onnxruntime")
PRECISIONS = precisions.choices(best=True)


@dataclass(frozen=True)
class ServeOptions:
    bundle: str
    host: str = "127.0.0.1"  # loopback unless asked: a model server is not exposed by accident
    port: int = 8000  # HTTP/REST (KServe v2)
    grpc_port: int = 8001
    metrics_port: int = 8002  # Prometheus text at /metrics
    max_batch: int = 32  # Triton max_batch_size: the largest batch one execution gets
    dynamic_batching: bool = True
    max_queue_delay_us: int = 500  # dynamic batcher: longest wait for a fuller batch
    instances: int = 1  # model instances (one Classifier each)
    backend: str = "auto"
    precision: str = "best"
    name: Optional[str] = None  # model name (default: as triton-repo names it)
    threads: Optional[int] = None  # ONNX Runtime intra-op threads per instance
    drain_timeout_s: int = 30  # on SIGTERM/SIGINT: longest wait for in-flight requests

    def validate(self) -> "ServeOptions":
        if self.backend not in SERVE_BACKENDS:
            raise UserError(f"--backend must be one of {', '.join(SERVE_BACKENDS)}, got {self.backend!r}")
        if self.precision not in PRECISIONS:
            raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        ports = {"--port": self.port, "--grpc-port": self.grpc_port, "--metrics-port": self.metrics_port}
        for flag, value in ports.items():
            if not 1 <= value <= 65535:
                raise UserError(f"{flag} must be a TCP port (1-65535), got {value}")
        if len(set(ports.values())) != len(ports):
            raise UserError(f"--port, --grpc-port and --metrics-port must differ, got {self.port}, {self.grpc_port}, {self.metrics_port}")
        if self.max_batch < 1:
            raise UserError(f"--max-batch must be at least 1 (Triton batches along the graph's batch axis), got {self.max_batch}")
        if self.max_queue_delay_us < 0:
            raise UserError(f"--max-queue-delay-us must be >= 0, got {self.max_queue_delay_us}")
        if self.instances < 1:
            raise UserError(f"--instances must be at least 1, got {self.instances}")
        if self.threads is not None and self.threads < 1:
            raise UserError(f"--threads must be at least 1, got {self.threads}")
        if self.drain_timeout_s < 0:
            raise UserError(f"--drain-timeout must be >= 0 seconds, got {self.drain_timeout_s}")
        return self

    @property
    def prefer(self) -> tuple:
        """Backends in the order ``Classifier.load`` tries them (as `predict --backend`)."""
        return ("tensorrt", "onnxruntime") if self.backend == "auto" else (self.backend,)

    # -- the server process's command line ------------------------------------------------------
    def to_argv(self) -> List[str]:
        argv = [self.bundle]
        for field in fields(self):
            if field.name == "bundle":
                continue
            value = getattr(self, field.name)
            flag = "--" + field.name.replace("_", "-")
            if isinstance(value, bool):
                argv.append(flag if value else "--no-" + field.name.replace("_", "-"))
            elif value is not None:
                argv += [flag, str(value)]
        return argv

    @classmethod
    def from_argv(cls, argv: List[str]) -> "ServeOptions":
        parser = argparse.ArgumentParser(prog="python -m vitdeploy.serve.server", description="The Triton process of `vitdeploy serve`.")
        parser.add_argument("bundle")
        for field in fields(cls):
            if field.name == "bundle":
                continue
            flag = "--" + field.name.replace("_", "-")
            if field.type in ("bool", bool):
                parser.add_argument(flag, dest=field.name, action="store_true", default=field.default)
                parser.add_argument("--no-" + field.name.replace("_", "-"), dest=field.name, action="store_false")
            elif "int" in str(field.type):
                parser.add_argument(flag, dest=field.name, type=int, default=field.default)
            else:
                parser.add_argument(flag, dest=field.name, default=field.default)
        return cls(**vars(parser.parse_args(argv))).validate()
