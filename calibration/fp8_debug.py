"""debug-precision for FP8: graphs with a subset of the linear layers and attention matmuls in E4M3.

The units are INT8's (:func:`.precision_units.int8_units`: cells = one block's role, blocks, roles,
over the MatMul/Gemm/Conv nodes), since FP8 quantizes the same linear layers plus the attention
matmuls; each trial is an FP8 graph from one shared fp16 base and one amax calibration
(:class:`.fp8_api.Fp8Graphs`) with every other site left in float, scored in the reference
execution against the same gate as ``calibrate --precision fp8``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from vitdeploy.bundle import Bundle

from .evaluate import GATED_EXECUTION, fp32_accuracy_of, graph_outputs, score_graph
from .fp8_api import Fp8Graphs
from .precision_units import Trial, Unit, compact_keep, damage, int8_units
from .sources import open_source

FP8_DEBUG_METHOD = "max"  # ModelOpt's FP8 default; --method of debug-precision is INT8's


class Fp8Trials:
    """FP8 graphs of a node subset, scored in the reference (fake-quant) execution."""

    def __init__(self, bundle: Bundle, opts: Any, work: Path, log: Callable[[str], None], labelled: Any):
        self.bundle, self.opts, self.log, self.work = bundle, opts, log, work
        fp32 = bundle.artifact_path("fp32")
        source = open_source(opts.data, bundle, opts.samples)
        self.data = labelled
        self.execution = GATED_EXECUTION["tensorrt"]
        ref = graph_outputs(fp32, self.data.images, "all", opts.threads)
        self.ref = ref
        self.fp32_accuracy = fp32_accuracy_of(ref, self.data.labels)
        self.graphs = Fp8Graphs(bundle, source, "fp8", opts.data_max, opts.threads, work)
        self.units = int8_units(self.graphs.model32, bundle.manifest.get("graph") or {})
        sites = set(self.graphs.sites.linear) | set(self.graphs.sites.attention)
        self.units = {kind: [u for u in units if u.nodes & sites] for kind, units in self.units.items()}
        self.all_nodes = frozenset().union(*(u.nodes for u in self.units["cells"])) & frozenset(sites)
        self.cache: dict[frozenset, Trial] = {}
        self.source_record = source.record()
        self.count = 0

    def reduced(self, nodes: frozenset, label: str) -> Trial:
        """``nodes`` in FP8, every other site in float."""
        key = frozenset(nodes) & self.all_nodes
        if key not in self.cache:
            self.count += 1
            path = self.work / f"fp8-trial-{self.count}.onnx"
            _, placement = self.graphs.build(FP8_DEBUG_METHOD, path, keep=self.all_nodes - key)
            s = score_graph(path, self.data, self.ref, self.opts.threads, executions=(self.execution,))[self.execution]
            passed, failures = self.opts.gate.verdict(self.fp32_accuracy, s)
            reduced = placement["linear_fp8"] + placement["attention_fp8"]
            self.cache[key] = Trial(label, passed, failures, s, damage(self.opts.gate, self.fp32_accuracy, s), reduced, empty=not reduced)
            path.unlink(missing_ok=True)
        t = self.cache[key]
        return Trial(label, t.passed, t.failures, t.scores, t.damage, t.reduced_layers, t.overflow, t.empty)

    def keep(self, kept: list[Unit]) -> Trial:
        return self.reduced(self.all_nodes - frozenset().union(*(u.nodes for u in kept)) if kept else self.all_nodes,
                            "keep " + (", ".join(u.name for u in kept) or "nothing"))

    def recipe_fields(self, kept: list[Unit]) -> dict[str, Any]:
        return {"method": FP8_DEBUG_METHOD, "attention": "fp8",
                "keep_float": {"blocks": compact_keep(kept, self.units["cells"]),
                               "nodes": sorted(frozenset().union(*(u.nodes for u in kept)) & self.all_nodes) if kept else []},
                "calibration": self.source_record}
