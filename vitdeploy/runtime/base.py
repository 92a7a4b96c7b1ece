"""One runner interface for every backend (PyTorch, ONNX Runtime, TensorRT).

``check`` and ``profile`` are written once against it: a runner takes the artifact's input batch
(uint8 NHWC for vitdeploy graphs) and returns every output by name, timing each call.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # numpy dtype name: "uint8", "float32", ...
    shape: tuple[Any, ...]  # ints for fixed axes, strings (symbol names) or None for dynamic ones


@dataclass
class RunnerInfo:
    backend: str  # "torch", "onnxruntime", "tensorrt"
    precision: str  # "fp32", "fp16", "int8"
    device: str  # "cpu", "cuda:0", ...
    details: dict[str, Any] = field(default_factory=dict)  # providers, threads, engine fingerprint ...


class Runner(ABC):
    """Run a classifier artifact on one backend."""

    info: RunnerInfo
    last_latency_s: float = float("nan")

    @abstractmethod
    def inputs(self) -> list[TensorInfo]: ...

    @abstractmethod
    def outputs(self) -> list[str]: ...

    @abstractmethod
    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]: ...

    def run_feeds(self, feeds: dict[str, np.ndarray], outputs: Any = None) -> dict[str, np.ndarray]:
        """Every input by name, for graphs with more than the image input (variable-size bundles:
        images and valid_hw); runners of one-input artifacts do not take it."""
        from ..errors import UserError

        raise UserError(f"the {self.info.backend} runner takes one image input, not ({', '.join(feeds)})")

    def infer(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        """Run one batch; ``last_latency_s`` is the host wall time of this call."""
        start = time.perf_counter()
        out = self._run(batch)
        self.last_latency_s = time.perf_counter() - start
        return out

    def infer_batched(self, images: np.ndarray, batch: int, outputs: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
        """Run ``images`` in chunks of ``batch`` and concatenate the named outputs (default: every
        output the artifact declares: logits/probs, embedding, patch_grid)."""
        parts = [self.infer(images[i:i + batch]) for i in range(0, len(images), batch)]
        names = tuple(outputs) if outputs is not None else tuple(parts[0]) if parts else ()
        return {k: np.concatenate([p[k] for p in parts]) for k in names}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release sessions, engines and device buffers."""

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
