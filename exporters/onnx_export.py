"""PyTorch -> ONNX with the dynamo exporter (opset 20).

Why dynamo, not the TorchScript-based exporter (measured here, torch 2.13-2.14, see DESIGN.md):
the TorchScript exporter records timm's native-size shortcut, so its graph fails at any other size,
and it cannot export antialiased resizes; its graphs also ran 15-60% slower in ORT. The dynamo
exporter keeps symbolic H/W through the position-table Resize, emits one LayerNormalization per LN
(TensorRT's FP16-safe normalization layer) and a Gelu node at opset 20.
"""

from __future__ import annotations

import contextlib
import io
import time
import warnings
from typing import Any

import numpy as np
import torch

OPSET = 20
INPUT_NAME = "images"
OUTPUT_NAMES = ("logits", "probs")


def export_graph(module: torch.nn.Module, example: torch.Tensor, dynamic_hw: bool, opset: int = OPSET,
                 output_names: tuple[str, ...] = OUTPUT_NAMES) -> tuple[Any, float]:
    """Export ``module`` (images -> its declared outputs, in order); returns (onnx.ModelProto, seconds)."""
    from torch.export import Dim

    axes = {0: Dim.DYNAMIC}
    if dynamic_hw:
        hw_axes = (1, 2) if example.dim() == 4 and example.shape[-1] == 3 else (2, 3)
        axes.update({hw_axes[0]: Dim.DYNAMIC, hw_axes[1]: Dim.DYNAMIC})
    start = time.perf_counter()
    # verbose stays at its default: it keeps the per-node module scopes we map back to PyTorch;
    # the exporter's progress lines go to a buffer instead of the user's terminal.
    with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module,
            (example,),
            dynamo=True,
            opset_version=opset,
            input_names=[INPUT_NAME],
            output_names=list(output_names),
            dynamic_shapes={"images": axes},
            external_data=False,
        )
    model = program.model_proto
    del program
    release_rewriter_matches()
    drop_initializer_value_info(model)
    _name_dynamic_axes(model, dynamic_hw, hw_axes if dynamic_hw else ())
    name_grid_axes(model)
    return model, time.perf_counter() - start


def release_rewriter_matches() -> int:
    """Forget the last match of every onnxscript pattern matcher; returns how many were cleared.

    The exporter's optimizer (onnxscript 0.7) rewrites the graph with module-level rewrite rules whose
    matchers keep ``_graph``, ``_current_node`` and ``_match`` of the last graph they matched after the
    export returns. That graph is the ONNX IR model, whose initializers wrap the PyTorch parameters:
    the whole model stayed alive after the export (found here with gc referrers: ViT-S/16's 84 MB of
    parameters alive after every Python reference to the model was gone, freed once these are
    cleared; with ``optimize=False`` nothing stays). The matchers are found by type name, so a newer
    onnxscript that renames them costs nothing but this cleanup.
    """
    import gc

    from .process_memory import worth_releasing

    if not worth_releasing():  # a small graph kept by a matcher is bounded: not worth a heap walk
        return 0

    cleared = 0
    for obj in gc.get_objects():
        kind = type(obj)
        if kind.__name__.endswith("PatternMatcher") and str(getattr(kind, "__module__", "")).startswith("onnxscript."):
            for attr in ("_graph", "_current_node", "_match"):
                if getattr(obj, attr, None) is not None:
                    setattr(obj, attr, None)
                    cleared += 1
    return cleared


def release_simplifier_matches() -> int:
    """Forget the nodes onnxslim's pattern matchers keep from their last match; returns how many.

    onnxslim 0.1's matchers (module-level, in its fusion-pattern registry) store each matched node as
    an attribute named after the pattern node (``setattr(self, pattern_node.name, node)``) and never
    clear it; the node's constants wrap TensorProtos of the graph that was simplified, which keeps
    that graph's whole protobuf arena alive (measured: ViT-B/16's 346 MB graph stayed resident after
    the input and the output of ``onnxslim.slim`` were both deleted; gc referrers lead to
    ``MatMulAddPatternMatcher`` in ``onnxslim.core.pattern.registry``).
    """
    import gc

    from .process_memory import worth_releasing

    if not worth_releasing():  # a small graph kept by a matcher is bounded: not worth a heap walk
        return 0

    cleared = 0
    for obj in gc.get_objects():
        kind = type(obj)
        # by class name: onnxslim's graph objects answer any unknown attribute (even __dict__ lookups)
        if not (str(getattr(kind, "__module__", "")).startswith("onnxslim.") and any(c.__name__ == "PatternMatcher" for c in kind.__mro__)):
            continue
        attrs = obj.__dict__
        for name in list(attrs.get("pattern_dict") or ()):
            if name in attrs:
                del attrs[name]
                cleared += 1
    return cleared


SCOPE_KEY = "pkg.torch.onnx.name_scopes"


def node_scopes(node: Any) -> list[str]:
    """Module paths a node was traced in (outermost first), from the dynamo exporter's metadata."""
    import ast

    for prop in node.metadata_props:
        if prop.key == SCOPE_KEY:
            try:
                scopes = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                return []
            return [s for s in scopes[:-1] if s]  # drop the root '' and the op's own name
    return []


def module_output_map(model: Any, module_paths: list[str]) -> dict[str, str]:
    """ONNX tensor that holds each PyTorch module's output: the last node traced inside it.

    This is what lets `check` name the PyTorch module (``blocks.3``) where an artifact diverges.
    """
    found: dict[str, str] = {}
    wanted = set(module_paths)
    for node in model.graph.node:  # topological order: later nodes overwrite earlier ones
        for scope in node_scopes(node):
            if scope in wanted and node.output:
                found[scope] = node.output[0]
    return {m: found[m] for m in module_paths if m in found}


def patch_embed_tensors(model: Any) -> dict[str, str] | None:
    """The patch-embedding Conv: its (preprocessed) input, output and weight names."""
    for node in model.graph.node:
        if node.op_type == "Conv":
            return {"input": node.input[0], "output": node.output[0], "weight": node.input[1],
                    "bias": node.input[2] if len(node.input) > 2 else None}
    return None


def drop_initializer_value_info(model: Any) -> int:
    """Remove value_info entries that describe initializers; returns how many.

    The dynamo exporter declares every weight twice: as an initializer and again in value_info. The
    copy is redundant (an initializer carries its own type and shape) and goes stale when a tool
    rewrites the weight: onnxruntime 1.30's quantizer turns Gemm into MatMul by transposing the
    head's weight in place ([K, d] -> [d, K]) without touching value_info, and its shape inference
    then fails with "Inferred shape and existing shape differ in dimension 0: (d) vs (K)" (issue 14).
    """
    weights = {init.name for init in model.graph.initializer}
    keep = [value for value in model.graph.value_info if value.name not in weights]
    dropped = len(model.graph.value_info) - len(keep)
    if dropped:
        del model.graph.value_info[:]
        model.graph.value_info.extend(keep)
    return dropped


def strip_trace_metadata(model: Any) -> None:
    """Drop the exporter's bulky per-node stack traces; keep only the module scopes."""
    for node in model.graph.node:
        keep = [(p.key, p.value) for p in node.metadata_props if p.key == SCOPE_KEY]
        del node.metadata_props[:]
        for key, value in keep:
            node.metadata_props.add(key=key, value=value)


def _name_dynamic_axes(model: Any, dynamic_hw: bool, hw_axes: tuple[int, ...]) -> None:
    """Give the symbolic dims readable names (batch, height, width) on inputs and outputs."""
    names = {0: "batch"}
    if dynamic_hw:
        names.update({hw_axes[0]: "height", hw_axes[1]: "width"})
    renames: dict[str, str] = {}
    for value in model.graph.input:
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.dim_param and axis in names:
                renames[dim.dim_param] = names[axis]
    for value in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in renames:
                dim.dim_param = renames[dim.dim_param]


def name_grid_axes(model: Any) -> None:
    """A dynamic patch_grid output [B, d, G_h, G_w]: call its symbolic grid axes grid_h, grid_w."""
    for value in model.graph.output:
        if value.name != "patch_grid":
            continue
        dims = value.type.tensor_type.shape.dim
        for axis, name in ((2, "grid_h"), (3, "grid_w")):
            if len(dims) > axis and not dims[axis].HasField("dim_value"):
                dims[axis].dim_param = name


def run_onnxslim(model: Any) -> tuple[Any | None, dict[str, Any]]:
    """onnxslim's graph (or None, with the reason) and a record; no gate yet: the caller decides
    whether ORT identity on a probe or the verification against PyTorch accepts it."""
    from vitdeploy.lazy import available

    if not available("onnxslim"):
        return None, {"simplifier": None, "reason": "onnxslim not installed"}
    import onnxslim

    start = time.perf_counter()
    try:
        # no_shape_infer: onnxslim's own shape inference serialises the whole model (weights included)
        # about 18 times, 75-85% of its time (cProfile, ViT-B/16: 15.6 of 20.1 s); without it the graphs
        # come out with the same nodes (digits, ViT-S/16, DeiT-Ti, ViT-B/16, BEiT-B; static and dynamic)
        # in 2.0 instead of 11.4 s for ViT-B/16 (docs/BENCHMARKS.md, "Export at real model sizes")
        slim = onnxslim.slim(model, no_shape_infer=True)
    except Exception as exc:  # a simplifier bug must not break the export
        return None, {"simplifier": "onnxslim", "applied": False, "reason": f"onnxslim failed: {exc.__class__.__name__}"}
    finally:
        release_simplifier_matches()
    return slim, {"simplifier": "onnxslim", "version": onnxslim.__version__, "applied": True,
                  "nodes_before": len(model.graph.node), "nodes_after": len(slim.graph.node),
                  "slim_s": round(time.perf_counter() - start, 2)}


def simplify_if_identical(model: Any, probe: np.ndarray) -> tuple[Any, dict[str, Any]]:
    """Run onnxslim and keep its graph only if ORT outputs stay identical on ``probe``.

    Simplifiers may fold or drop nodes; we accept the cleaner graph only when every output is
    bit-identical on real-looking input, otherwise keep the exporter's graph and say why. This is
    the gate when the export is not verified against PyTorch (--no-check); a verified export gates
    the simplified graph by that verification instead (exporters/api.py), which runs anyway.
    """
    slim, record = run_onnxslim(model)
    if slim is None:
        return model, record
    start = time.perf_counter()
    worst = ort_difference(model, slim, probe)
    record["identity_check_s"] = round(time.perf_counter() - start, 2)
    if worst == 0.0:
        return slim, {**record, "gate": "ORT outputs bit-identical to the exporter's graph on a probe"}
    return model, {"simplifier": "onnxslim", "applied": False, "reason": f"outputs changed (max |d| {worst:.3g})",
                   **{k: record[k] for k in ("slim_s", "identity_check_s")}}


def ort_difference(model: Any, other: Any, probe: np.ndarray) -> float:
    """Largest |difference| between two graphs' ORT outputs on ``probe`` (0.0: bit-identical).

    Each graph is a ModelProto or a file; a ModelProto is written to a temporary folder first (with
    external data past the threshold), so the sessions are made from files, one at a time: a graph
    over 2 GiB has no bytes form, and a session from bytes holds the graph twice.
    """
    import tempfile
    from pathlib import Path

    from vitdeploy import onnx_io
    from vitdeploy.runtime.ort import OrtRunner

    outputs = []
    with tempfile.TemporaryDirectory(prefix="vitdeploy-probe.") as tmp:
        for index, graph in enumerate((model, other)):
            path = graph
            if not isinstance(graph, (str, Path)):
                path = Path(tmp) / f"graph{index}.onnx"
                onnx_io.save(graph, path)
            runner = OrtRunner(path, threads=1)
            outputs.append(runner.infer(probe))
            runner.close()
            del runner
    before, after = outputs
    if all(np.array_equal(before[k], after[k]) for k in before):
        return 0.0
    return max(float(np.abs(before[k].astype(np.float64) - after[k]).max()) for k in before)
