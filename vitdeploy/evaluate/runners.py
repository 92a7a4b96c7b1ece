"""What `evaluate` scores: every graph of the bundle in the execution it targets, its TensorRT
engines where they can run (skipped with the reason elsewhere), and the PyTorch reference through
the same Runner interface (rebuilt lazily; without torch the graphs are scored alone and the report
says so). One session per scorer, reused for every condition.

Every scorer is fed the bundle's input contract's feeds (vitdeploy.contract): a variable-size
bundle's graphs get each condition's images fitted into the canvas with their valid sizes, and its
reference is PyTorch on each image alone at its own size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import precisions as registry
from ..bundle import Bundle
from ..contract import InputContract
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
    min_rows: int = 1  # an engine profile's minimum batch (calls under it are padded and cut back)
    contract: InputContract | None = None  # what the runner takes; the feeds of images (occlusion maps)

    def predict(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Top-1 class per row of the contract's feeds."""
        out = self.runner.run_batched(feeds, self.batch, outputs=("logits",), min_rows=self.min_rows)
        return out["logits"].argmax(axis=-1).astype(np.int64)

    def probs(self, images: np.ndarray) -> np.ndarray:
        """Class probabilities of uint8 images in the graph's channel order (prepared by the contract)."""
        assert self.contract is not None
        return self.runner.run_batched(self.contract.feeds_for(images), self.batch, outputs=("probs",), min_rows=self.min_rows)["probs"]

    def record(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "precision": self.precision, **self.details}


def int8_execution(bundle: Bundle) -> tuple[str, str]:
    """(ORT optimisation level, description) of the execution an int8 graph targets: Q/DQ as
    fake-quant in float for TensorRT (ORT basic), integer kernels for a CPU target (ORT all)."""
    int8 = bundle.artifact("int8")
    target = int8.get("target", "tensorrt") if int8 else "tensorrt"  # absent: a graph made for TensorRT
    if target == "cpu":
        return "all", "this CPU's int8 kernels (ORT all optimizations; the graph targets the CPU)"
    return "basic", "reference semantics: Q/DQ as fake-quant in float (ORT basic), what TensorRT computes"


def graph_scorer(bundle: Bundle, contract: InputContract, precision: str, path: Path, threads: int | None, batch: int,
                 label: str = "") -> Scorer:
    from ..runtime.devices import cuda_visible
    from ..runtime.select import onnxruntime_runner

    level, execution = int8_execution(bundle) if precision == "int8" else ("all", "ONNX Runtime, all optimizations")
    providers = None if cuda_visible() else ["CPUExecutionProvider"]
    chosen = onnxruntime_runner(bundle, contract, precision, providers, threads, optimization=level, graph=path)
    runner = chosen.runner
    return Scorer(f"onnx {precision}{label}", "graph", precision, runner, max(1, min(batch, chosen.contract.max_rows(batch))),
                  {"graph": _relative(bundle, path), "execution": execution, "optimization": level,
                   "providers": runner.info.details.get("providers")}, chosen.contract.min_rows, chosen.contract)


def _relative(bundle: Bundle, path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(bundle.root.resolve()))
    except ValueError:
        return str(path)


def reference_scorer(bundle: Bundle, contract: InputContract, threads: int | None, batch: int,
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
    execution = "PyTorch eager, host-side numpy preprocessing from the manifest"
    if runner.per_image:
        execution += "; each image alone at its own size"
    return Scorer("pytorch fp32", "reference", "fp32", runner, batch,
                  {"model": f"{source.get('kind')}:{source.get('name')}", "torch": runner.info.details.get("torch"),
                   "execution": execution}, 1, contract), None


def engine_scorers(bundle: Bundle, contract: InputContract, batch: int) -> tuple[list[Scorer], list[dict[str, Any]]]:
    """TensorRT engines that can run here with a profile holding the contract's size, and a skip record
    (with the reason) for the others."""
    from ..runtime.select import engines_here

    scorers: list[Scorer] = []
    skipped: list[dict[str, Any]] = []
    for run in engines_here(bundle, contract, purpose="evaluated"):
        entry = run.entry
        base = {"id": f"tensorrt {entry.target}", "kind": "engine", "precision": entry.precision, "engine": _relative(bundle, entry.dir)}
        if run.runner is None or run.contract is None:
            skipped.append({**base, "skipped": run.skipped})
            continue
        narrowed = run.contract
        scorers.append(Scorer(base["id"], "engine", entry.precision, run.runner, max(1, min(batch, narrowed.max_rows(batch))),
                              {"engine": base["engine"], "execution": "TensorRT"}, narrowed.min_rows, narrowed))
    return scorers, skipped


def refuse_embedding_model(bundle: Bundle, what: str) -> None:
    """evaluate scores class predictions on labelled images; an embedding model (bundle.embedding_model:
    no logits/probs among its declared outputs) has none: one line saying what applies instead."""
    if bundle.embedding_model:
        outputs = ",".join(bundle.graph.outputs or [])
        raise UsageError(f"{bundle.root} is {bundle.kind()} (outputs {outputs}): {what} scores class predictions, which it has none of; "
                         "`vitdeploy check` measures its parity with PyTorch, `vitdeploy embed` writes its features")


def check_precisions(bundle: Bundle, precisions: list[str] | None) -> list[str]:
    present = bundle.precisions()
    if not precisions:
        return present
    out = []
    for p in precisions:
        if p not in registry.NAMES:
            raise UsageError(f"unknown precision {p!r}; choose from {', '.join(registry.NAMES)}")
        bundle.artifact_path(p)  # one line saying how to make a missing graph
        if p not in out:
            out.append(p)
    return out
