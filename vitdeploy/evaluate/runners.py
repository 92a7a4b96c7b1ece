"""What `evaluate` scores: every graph of the bundle in the execution it targets, its TensorRT
engines where they can run (skipped with the reason elsewhere), and the PyTorch reference through
the same Runner interface (rebuilt lazily; without torch the graphs are scored alone and the report
says so). One session per scorer, reused for every condition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..bundle import Bundle
from ..errors import UsageError, VitDeployError
from ..runtime.base import Runner


@dataclass
class Scorer:
    id: str  # "onnx fp32", "onnx int8", "pytorch fp32", "tensorrt sm90-int8"
    kind: str  # "graph" | "engine" | "reference"
    precision: str
    runner: Runner
    batch: int
    details: dict[str, Any] = field(default_factory=dict)

    def predict(self, images: np.ndarray) -> np.ndarray:
        """Top-1 class per image (images already in the graph's channel order)."""
        out = self.runner.infer_batched(images, self.batch, outputs=("logits",))
        return out["logits"].argmax(axis=-1).astype(np.int64)

    def probs(self, images: np.ndarray) -> np.ndarray:
        return self.runner.infer_batched(images, self.batch, outputs=("probs",))["probs"]

    def record(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "precision": self.precision, **self.details}


def int8_execution(bundle: Bundle) -> tuple[str, str]:
    """(ORT optimisation level, description) of the execution an int8 graph targets: Q/DQ as
    fake-quant in float for TensorRT (ORT basic), integer kernels for a CPU target (ORT all)."""
    target = bundle.artifact_record("int8").get("target", "tensorrt")
    if target == "cpu":
        return "all", "this CPU's int8 kernels (ORT all optimizations; the graph targets the CPU)"
    return "basic", "reference semantics: Q/DQ as fake-quant in float (ORT basic), what TensorRT computes"


def graph_scorer(bundle: Bundle, precision: str, path: Path, threads: int | None, batch: int, label: str = "") -> Scorer:
    from ..runtime.ort import OrtRunner

    level, execution = int8_execution(bundle) if precision == "int8" else ("all", "ONNX Runtime, all optimizations")
    runner = OrtRunner(path, precision=precision, optimization=level, threads=threads, providers=["CPUExecutionProvider"]
                       if _cpu_only() else None)
    return Scorer(f"onnx {precision}{label}", "graph", precision, runner, batch,
                  {"graph": _relative(bundle, path), "execution": execution, "optimization": level,
                   "providers": runner.info.details.get("providers")})


def _cpu_only() -> bool:
    from ..runtime.devices import cuda_visible

    return not cuda_visible()


def _relative(bundle: Bundle, path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(bundle.root.resolve()))
    except ValueError:
        return str(path)


def reference_scorer(bundle: Bundle, threads: int | None, batch: int,
                     resolution: tuple[int, int] | None = None) -> tuple[Scorer | None, str | None]:
    """The PyTorch reference, or (None, why not)."""
    try:
        from vitdeploy.exporters.torch_runner import TorchRunner
    except ImportError as exc:
        return None, f"PyTorch is not importable ({exc}); graphs are scored without the reference (pip install 'vitdeploy[export]')"
    try:
        runner = TorchRunner.from_bundle(bundle, threads=threads, resolution=resolution)
    except (VitDeployError, ImportError) as exc:  # e.g. a timm source on a machine without timm
        return None, f"the PyTorch reference cannot be rebuilt ({exc}); graphs are scored without it"
    source = bundle.manifest.get("source", {})
    return Scorer("pytorch fp32", "reference", "fp32", runner, batch,
                  {"model": f"{source.get('kind')}:{source.get('name')}", "torch": runner.info.details.get("torch"),
                   "execution": "PyTorch eager, host-side numpy preprocessing from the manifest"}), None


def engine_scorers(bundle: Bundle, batch: int, size: tuple[int, int]) -> tuple[list[Scorer], list[dict[str, Any]]]:
    """TensorRT engines that can run here, and a skip record (with the reason) for the others."""
    from ..lazy import available
    from ..runtime.classifier import find_engines

    scorers: list[Scorer] = []
    skipped: list[dict[str, Any]] = []
    for entry in find_engines(bundle):
        base = {"id": f"tensorrt {entry.target}", "kind": "engine", "precision": entry.precision, "engine": _relative(bundle, entry.dir)}
        if not available("tensorrt"):
            skipped.append({**base, "skipped": "TensorRT is not installed on this machine (engines are evaluated on their target GPU)"})
            continue
        fits = [p for p in entry.profiles if p[1][0] <= size[0] <= p[1][2] and p[2][0] <= size[1] <= p[2][2]]
        if entry.profiles and not fits:
            skipped.append({**base, "skipped": f"no optimisation profile of the engine takes {size[0]}x{size[1]} ({entry.profiles})"})
            continue
        try:
            from ..runtime.tensorrt import TensorRTRunner

            runner = TensorRTRunner(entry.dir)
        except VitDeployError as exc:
            skipped.append({**base, "skipped": str(exc)})
            continue
        max_batch = max((p[0][2] for p in fits), default=batch)
        scorers.append(Scorer(base["id"], "engine", entry.precision, runner, max(1, min(batch, int(max_batch))),
                              {"engine": base["engine"], "execution": "TensorRT"}))
    return scorers, skipped


def check_precisions(bundle: Bundle, precisions: list[str] | None) -> list[str]:
    present = bundle.precisions()
    if not precisions:
        return present
    out = []
    for p in precisions:
        if p not in ("fp32", "fp16", "int8"):
            raise UsageError(f"unknown precision {p!r}; choose from fp32, fp16, int8")
        bundle.artifact_path(p)  # one line saying how to make a missing graph
        if p not in out:
            out.append(p)
    return out
