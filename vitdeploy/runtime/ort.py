"""ONNX Runtime runner (CPU; CUDA and TensorRT execution providers when present): every input of the
graph by name (``run``), one session for the runner's life."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import UserError
from ..lazy import require
from .base import Runner, RunnerInfo, TensorInfo

# What "optimization" means here: "all" lets ORT fuse Q/DQ into integer kernels (how this CPU would
# execute an int8 graph); "basic" keeps Q/DQ as fake-quant in float (what TensorRT computes).
_OPT_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


THREADS_ENV = "VITDEPLOY_ORT_THREADS"


def default_threads() -> int | None:
    """Intra-op threads for a session that asks for none: ``VITDEPLOY_ORT_THREADS`` when set, else
    ONNX Runtime's own default (one per core). Several processes sharing one machine (pytest-xdist
    workers, one server process per model instance) each start a pool of one spinning thread per
    core; on a 2-core VM two such pools cost more than they compute (docs/DESIGN.md, "Test tiers")."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise UserError(f"{THREADS_ENV}={value!r}: expected a whole number of threads >= 1 (or unset for one per core)")
    return int(value)


def default_providers() -> list[str]:
    ort = require("onnxruntime")
    available = ort.get_available_providers()
    wanted = [p for p in ("CUDAExecutionProvider",) if p in available]
    return wanted + ["CPUExecutionProvider"]


class OrtRunner(Runner):
    def __init__(
        self,
        model: str | Path | bytes,
        precision: str = "fp32",
        providers: Sequence[str] | None = None,
        threads: int | None = None,
        optimization: str = "all",
        extra_outputs: Sequence[str] = (),
        memory_arena: bool = True,
        spin: bool = True,
        external_data_dir: str | Path | None = None,
    ):
        ort = require("onnxruntime", "running ONNX graphs")
        opts = ort.SessionOptions()
        opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _OPT_LEVELS[optimization])
        # The CPU arena keeps its high-water mark for the session's life; verification across
        # sizes turns it off so each size's activations are returned before the next.
        opts.enable_cpu_mem_arena = bool(memory_arena)
        if not spin:
            # ORT's idle threads spin after each run; when PyTorch runs next on the same cores
            # (verification alternates them) the spinning steals its CPU time.
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        threads = threads or default_threads()
        if threads:
            opts.intra_op_num_threads = int(threads)
            opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        if external_data_dir is not None:
            # a graph given as bytes whose weights are in a data file: where ONNX Runtime finds it
            # (a session from a path looks beside the file itself)
            opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(external_data_dir))
        source = model if isinstance(model, bytes) else str(model)
        if not isinstance(model, bytes) and not Path(model).is_file():
            raise UserError(f"ONNX file {model} does not exist")
        try:
            self.session = ort.InferenceSession(source, sess_options=opts, providers=list(providers or default_providers()))
        except Exception as exc:  # ORT raises its own exception types per failure
            raise UserError(f"ONNX Runtime cannot load {model if not isinstance(model, bytes) else 'the graph'}: {exc}") from None
        # get_providers() after creation: onnxruntime-gpu lists CUDA as available even without a GPU,
        # and silently falls back; only the session knows what it really uses.
        used = self.session.get_providers()
        device = "cuda:0" if "CUDAExecutionProvider" in used or "TensorrtExecutionProvider" in used else "cpu"
        self._inputs = list(self.session.get_inputs())
        self._input_names = [i.name for i in self._inputs]
        self._outputs = [o.name for o in self.session.get_outputs()] + list(extra_outputs)
        self.info = RunnerInfo(
            backend="onnxruntime",
            precision=precision,
            device=device,
            details={
                "providers": used,
                "optimization": optimization,
                "threads": threads or os.cpu_count(),
                "onnxruntime": ort.__version__,
                "graph": None if isinstance(model, bytes) else Path(model).name,
            },
        )

    def inputs(self) -> list[TensorInfo]:
        return [TensorInfo(i.name, _ORT_TYPES.get(i.type, i.type), tuple(i.shape)) for i in self._inputs]

    def input_names(self) -> list[str]:
        return list(self._input_names)

    def outputs(self) -> list[str]:
        return list(self._outputs)

    def _execute(self, feeds: dict[str, np.ndarray], outputs: list[str] | None) -> dict[str, np.ndarray]:
        names = outputs if outputs is not None else self._outputs
        try:
            values = self.session.run(names, feeds)
        except Exception as exc:  # ORT's Fail/InvalidArgument carry the real reason in their text
            reason = str(exc).strip().splitlines()[0][:300]
            given = " + ".join(f"{name} {a.dtype} {list(a.shape)}" for name, a in feeds.items()) if len(feeds) > 1 else \
                " ".join(f"{a.dtype} {list(a.shape)}" for a in feeds.values())
            raise UserError(f"ONNX Runtime failed on input {given}: {reason}") from None
        return dict(zip(names, values))

    def describe(self) -> dict[str, Any]:
        return dict(self.info.details)

    def close(self) -> None:
        self.session = None  # type: ignore[assignment]


_ORT_TYPES = {
    "tensor(uint8)": "uint8",
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(int8)": "int8",
}
