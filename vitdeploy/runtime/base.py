"""One runner interface for every backend (PyTorch, ONNX Runtime, TensorRT).

As Polygraphy's runners do, a runner takes its inputs by name and returns every output by name:
``run({"images": batch})`` for a vitdeploy graph, ``run({"images": canvas, "valid_hw": sizes})`` for
a variable-size one, timing each call (``last_latency_s``). ``infer(batch)`` is the one-input
convenience. ``check``, ``evaluate``, ``profile``, the Classifier and ``serve`` are written once
against it; what the feeds must hold is the bundle's input contract (vitdeploy.contract).

A backend implements ``_execute(feeds, outputs)``; a backend of one-input graphs may implement
``_run(batch)`` instead.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

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

    def input_names(self) -> list[str]:
        return [i.name for i in self.inputs()]

    def _execute(self, feeds: dict[str, np.ndarray], outputs: list[str] | None) -> dict[str, np.ndarray]:
        """The backend's call: named feeds -> named outputs (every output, or at least ``outputs``)."""
        names = self.input_names()
        if len(names) != 1:  # a backend with several inputs implements _execute itself
            raise NotImplementedError(f"{type(self).__name__} takes several inputs and must implement _execute")
        return self._run(feeds[names[0]])

    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        raise NotImplementedError(f"{type(self).__name__} implements neither _execute nor _run")

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Every input by name -> the named outputs (all of them, or ``outputs``); ``last_latency_s`` is
        the host wall time of the call. A feed the artifact does not take, or one it lacks, is one line."""
        from ..errors import UserError

        names = self.input_names()
        if set(feeds) != set(names):
            raise UserError(f"the {self.info.backend} runner takes inputs ({', '.join(names)}), got ({', '.join(feeds) or 'none'})"
                            + ("; valid_hw is each image's (height, width) in the canvas: build the feeds with the bundle's "
                               "input contract (vitdeploy.contract)" if "valid_hw" in set(names) - set(feeds) else ""))
        wanted = list(outputs) if outputs is not None else None
        start = time.perf_counter()
        out = self._execute(dict(feeds), wanted)
        self.last_latency_s = time.perf_counter() - start
        if wanted is None:
            return out
        missing = [n for n in wanted if n not in out]
        if missing:
            raise UserError(f"the {self.info.backend} runner gives no {', '.join(missing)} (its outputs: {', '.join(out)})")
        return {n: out[n] for n in wanted}

    def infer(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        """Run one batch of a one-input artifact (``run({"images": batch})``)."""
        from ..errors import UserError

        names = self.input_names()
        if len(names) != 1:
            raise UserError(f"the {self.info.backend} runner takes inputs ({', '.join(names)}); feed them by name with run()")
        return self.run({names[0]: batch})

    def run_batched(self, feeds: Mapping[str, np.ndarray], batch: int, outputs: Sequence[str] | None = None,
                    min_rows: int = 1) -> dict[str, np.ndarray]:
        """Run ``feeds`` in chunks of ``batch`` rows and concatenate the named outputs (default: every
        output the artifact declares). A chunk under ``min_rows`` (an engine profile's minimum) is padded
        with copies of its last row and its outputs cut back."""
        rows = int(len(next(iter(feeds.values()))))
        parts = []
        for start in range(0, rows, max(1, int(batch))):
            chunk = {name: value[start:start + batch] for name, value in feeds.items()}
            count = int(len(next(iter(chunk.values()))))
            if count < min_rows:
                chunk = {name: np.concatenate([v, np.repeat(v[-1:], min_rows - count, axis=0)]) for name, v in chunk.items()}
            parts.append({k: v[:count] for k, v in self.run(chunk, outputs).items()})
        names = tuple(outputs) if outputs is not None else tuple(parts[0]) if parts else ()
        return {k: np.concatenate([p[k] for p in parts]) for k in names}

    def infer_batched(self, images: np.ndarray, batch: int, outputs: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
        """One-input :meth:`run_batched`: ``images`` in chunks of ``batch``, the named outputs concatenated
        (default: every output the artifact declares: logits/probs, embedding, patch_grid)."""
        names = self.input_names()
        if len(names) != 1:
            from ..errors import UserError

            raise UserError(f"the {self.info.backend} runner takes inputs ({', '.join(names)}); feed them by name with run_batched()")
        return self.run_batched({names[0]: images}, batch, outputs)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release sessions, engines and device buffers."""

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
