"""Parse lint: every node of an ONNX graph that a given TensorRT's ONNX parser cannot take.

The rules are the data in ``parser_rules`` (read from the parser sources of each TensorRT line);
this module walks a graph node by node and reports, for each node the target cannot parse or would
parse into something else, the rule and where it was read. It needs only ``onnx``; nothing runs.

Findings marked ``lowerable`` are the ones ``lowering.lower_for`` rewrites (opset, Gelu,
LayerNormalization on 8.5, the opset-18 attribute-to-input changes); the rest need another graph.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..lazy import require
from .parser_rules import (
    ATTENTION_ISSUES,
    REDUCE_OPS_AXES_INPUT_18,
    RESIZE_MODES,
    RESIZE_TRANSFORMS,
    ParserRules,
)

# What lowering.lower_for rewrites for a parser without these importers.
LOWERABLE_OPS = frozenset({"Gelu", "LayerNormalization"})


@dataclass(frozen=True)
class Finding:
    node: str  # node name ("(model)" for graph-level findings)
    op_type: str
    rule: str  # short: "no importer for Gelu", "opset 20 > 17"
    detail: str
    source: str  # where the rule was read
    lowerable: bool = False

    def line(self) -> str:
        fix = " [lowered for this target]" if self.lowerable else ""
        where = "the graph" if self.node == "(model)" else f"{self.node} ({self.op_type})"
        return f"{where}: {self.rule} - {self.detail}{fix}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LintReport:
    graph: str
    rules: ParserRules
    opset: int
    nodes: int
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)  # facts that are not findings (an op the target parses, with its bugs)

    @property
    def blocking(self) -> list[Finding]:
        return [f for f in self.findings if not f.lowerable]

    @property
    def clean(self) -> bool:
        return not self.findings

    def by_rule(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for f in self.findings:
            counts[f.rule] = counts.get(f.rule, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph, "parser": self.rules.to_dict(), "opset": self.opset, "nodes": self.nodes,
            "findings": [f.to_dict() for f in self.findings], "by_rule": self.by_rule(), "notes": list(self.notes),
        }

    def lines(self, limit: int = 12) -> list[str]:
        name = Path(self.graph).name
        if self.clean:
            return [f"parse lint, TensorRT {self.rules.key} parser: {name} (opset {self.opset}, {self.nodes} nodes): nothing it cannot parse"] + \
                [f"  note: {n}" for n in self.notes]
        out = [f"parse lint, TensorRT {self.rules.key} parser: {name} (opset {self.opset}): {len(self.findings)} finding(s)"]
        for rule, count in self.by_rule().items():
            first = next(f for f in self.findings if f.rule == rule)
            out.append(f"  - {rule}: {count} node(s), e.g. {first.line()}")
            if len(out) > limit:
                out.append("  ...")
                break
        out += [f"  note: {n}" for n in self.notes]
        out.append(f"  rules read from {self.rules.source} (not run: no TensorRT parser ran here)")
        return out


def _attrs(onnx: Any, node: Any) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        value = onnx.helper.get_attribute_value(a)
        out[a.name] = value.decode() if isinstance(value, bytes) else value
    return out


def default_opset(model: Any) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 0


def _constants(onnx: Any, model: Any) -> dict[str, Any]:
    """Initializers and Constant outputs as numpy arrays (what the parser sees as weights); tensors
    kept in an external data file are not read (the rules look at axes, scales and zero points)."""
    from .. import onnx_io

    return onnx_io.inline_arrays(model)


def _infer(onnx: Any, model: Any) -> Any:
    from .. import onnx_io

    try:
        return onnx_io.infer_shapes(model, strict_mode=False)  # on a weightless copy
    except Exception:  # a graph ONNX cannot infer is still linted on the op rules
        return model


def _types(inferred: Any) -> dict[str, int]:
    """Element type of every tensor ONNX shape inference can name (types only, no data)."""
    types = {}
    for v in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        if v.type.tensor_type.elem_type:
            types[v.name] = v.type.tensor_type.elem_type
    for i in inferred.graph.initializer:
        types[i.name] = i.data_type
    return types


def _ranks(model: Any) -> dict[str, int]:
    ranks = {}
    for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        if v.type.tensor_type.HasField("shape"):
            ranks[v.name] = len(v.type.tensor_type.shape.dim)
    for i in model.graph.initializer:
        ranks[i.name] = len(i.dims)
    return ranks


def lint_model(model: Any, rules: ParserRules, graph_name: str = "graph") -> LintReport:
    """Every node of ``model`` (an onnx.ModelProto) the parser ``rules`` describe cannot take."""
    onnx = require("onnx", "the parse lint")
    findings: list[Finding] = []
    src = rules.source
    lowering = rules.needs_lowering

    def add(node: Any, rule: str, detail: str, lowerable: bool = False) -> None:
        name = node.name or (node.output[0] if node.output else node.op_type)
        findings.append(Finding(name, node.op_type, rule, detail, src, lowerable and lowering))

    opset = default_opset(model)
    if opset > rules.opset_max:
        findings.append(Finding("(model)", "opset", f"opset {opset} > {rules.opset_max}",
                                f"TensorRT {rules.key}'s parser reads operators up to opset {rules.opset_max}; "
                                "newer attribute/input forms are read the old way or refused", src, lowering))
    elif opset and opset < rules.opset_min:
        findings.append(Finding("(model)", "opset", f"opset {opset} < {rules.opset_min}",
                                f"TensorRT {rules.key} supports opset {rules.opset_min} and later", src, False))

    consts = _constants(onnx, model)
    inferred = _infer(onnx, model)
    types = _types(inferred)
    ranks = _ranks(inferred)
    graph_outputs = {o.name for o in model.graph.output}
    local_functions = {(f.domain, f.name) for f in model.functions}
    uint8 = onnx.TensorProto.UINT8

    for node in model.graph.node:
        op = node.op_type
        attrs = _attrs(onnx, node)
        if node.domain not in ("", "ai.onnx"):
            if (node.domain, op) in local_functions and rules.expands_functions:
                continue
            add(node, f"no importer for {node.domain}::{op}",
                "custom-domain ops go to FallbackPluginImporter: the parse fails unless a plugin of that name is registered")
            continue
        if op not in rules.importers:
            hint = (" (Attention parses from TensorRT 10.14; re-export at opset <= 22, vitdeploy's default 20, to keep "
                    "attention as MatMul/Softmax)") if op == "Attention" else ""
            add(node, f"no importer for {op}",
                f"TensorRT {rules.key} has no {op} importer; the node falls to FallbackPluginImporter "
                "('Attempting to import as plugin') and the parse fails" + hint, op in LOWERABLE_OPS)
            continue
        inputs = list(node.input)

        def const_input(index: int) -> bool:
            return index < len(inputs) and (not inputs[index] or inputs[index] in consts)

        if op == "LayerNormalization" and any(o for o in node.output[1:]):
            add(node, "LayerNormalization Mean/InvStdDev outputs", "only the first output Y is supported")
        elif op == "Resize":
            _resize_rules(node, attrs, inputs, consts, ranks, rules, add, opset)
        elif op in REDUCE_OPS_AXES_INPUT_18 and len(inputs) > 1 and inputs[1]:
            if not rules.reduce_axes_input:
                add(node, f"{op} axes given as an input (opset 18 form)",
                    f"TensorRT {rules.key}'s reduceTensor reads only the axes attribute and otherwise reduces over every axis "
                    "(a wrong result, not a parse error)", const_input(1))
            elif not const_input(1):
                add(node, f"{op} axes not an initializer", "axes must be an initializer")
        elif op == "Pad" and len(inputs) > 3 and inputs[3]:
            if not rules.pad_axes_input:
                add(node, "Pad axes given as an input (opset 18 form)", f"TensorRT {rules.key} reads pads for every axis and ignores axes")
            elif rules.pad_axes_constant and not const_input(3):
                add(node, "Pad axes not an initializer", "axes must be an initializer (tensor axes from TensorRT 10.4)")
        elif op == "Slice" and rules.slice_axes_constant and len(inputs) > 3 and not const_input(3):
            add(node, "Slice axes not an initializer", "dynamic Slice axes are not supported ('does not support dynamic axes')")
        elif op in ("Squeeze", "Unsqueeze") and len(inputs) > 1 and not const_input(1):
            add(node, f"{op} axes not constant", "axes must be an initializer / resolvable to a constant")
        elif op in ("QuantizeLinear", "DequantizeLinear"):
            _qdq_rules(node, attrs, inputs, consts, types, rules, add, uint8)
        elif op == "GridSample":
            mode = attrs.get("mode", "bilinear")
            if mode not in rules.gridsample_modes:
                add(node, f"GridSample mode {mode!r}", f"TensorRT {rules.key} reads the opset-16 names (bilinear, nearest, bicubic)",
                    mode in ("linear", "cubic"))
            rank = ranks.get(inputs[0]) if inputs else None
            if rank is not None and rank != 4:
                add(node, "GridSample input not 4-D", f"input is {rank}-D; only 4-D (N,C,H,W) is supported")
        elif op == "Cast" and rules.key == "8.5" and types.get(inputs[0]) == uint8 and attrs.get("to") not in (1, 10):
            add(node, "Cast from UINT8 to a non-float type", "8.5 casts UINT8 only to FLOAT/HALF")

        if rules.uint8_io_only:
            for out in node.output:
                if out and types.get(out) == uint8 and out not in graph_outputs and op != "Constant":
                    add(node, "UINT8 intermediate tensor", f"{out} is UINT8; UINT8 is allowed only as network input/output")
    for node, name, operand in shape_operand_uses(model, onnx):
        add(node, "integer input used as a shape tensor",
            f"graph input {name} reaches operand {operand} of this {node.op_type}, which TensorRT reads as a shape: {name} would "
            "become a shape tensor (profiled by value with set_shape_input), not the per-image data vitdeploy's profiles shape")
    report = LintReport(graph_name, rules, opset, len(model.graph.node), findings)
    report.notes.extend(rules.notes if rules.inferred else ())  # which parser source these facts stand on
    attention = sum(1 for n in model.graph.node if n.op_type == "Attention" and n.domain in ("", "ai.onnx"))
    if attention and rules.attention:
        report.notes.append(
            f"{attention} opset-23 Attention node(s): TensorRT {rules.key} parses them (IAttention) but has open bugs: "
            + "; ".join(ATTENTION_ISSUES) + ". vitdeploy's own graphs keep attention as MatMul/Softmax (opset 20)")
    return report


# Operands TensorRT reads as shapes (shape tensors): index lists per op.
_SHAPE_OPERANDS = {
    "Reshape": (1,), "Expand": (1,), "ConstantOfShape": (0,), "Tile": (1,), "Range": (0, 1, 2), "Slice": (1, 2, 3, 4),
    "Resize": (2, 3), "Upsample": (1,), "Pad": (1, 3), "Squeeze": (1,), "Unsqueeze": (1,), "TopK": (1,), "OneHot": (1,),
}


def shape_operand_uses(model: Any, onnx: Any) -> list[tuple[Any, str, int]]:
    """(node, graph input, operand index) where data computed from an integer graph input reaches an
    operand TensorRT reads as a shape. Data flow stops at Shape/Size, whose outputs depend on shapes
    only. A variable-size graph's valid_hw must never appear here: it is per-image data."""
    ints = {onnx.TensorProto.INT32, onnx.TensorProto.INT64}
    inits = {i.name for i in model.graph.initializer}
    reach: dict[str, str] = {v.name: v.name for v in model.graph.input
                             if v.name not in inits and v.type.tensor_type.elem_type in ints}
    uses = []
    if not reach:
        return uses
    for node in model.graph.node:
        for index in _SHAPE_OPERANDS.get(node.op_type, ()):
            if index < len(node.input) and node.input[index] in reach:
                uses.append((node, reach[node.input[index]], index))
        if node.op_type in ("Shape", "Size"):
            continue
        origin = next((reach[i] for i in node.input if i in reach), None)
        if origin is not None:
            for out in node.output:
                if out:
                    reach[out] = origin
    return uses


def _resize_rules(node: Any, attrs: dict[str, Any], inputs: list[str], consts: dict[str, Any], ranks: dict[str, int],
                  rules: ParserRules, add: Any, opset: int) -> None:
    mode = attrs.get("mode", "nearest")
    if mode not in RESIZE_MODES:
        add(node, f"Resize mode {mode!r}", "modes: nearest, linear, cubic")
    transform = attrs.get("coordinate_transformation_mode", "half_pixel")
    if transform not in RESIZE_TRANSFORMS:
        add(node, f"Resize coordinate_transformation_mode {transform!r}", f"supported: {', '.join(sorted(RESIZE_TRANSFORMS))}")
    if transform == "tf_half_pixel_for_nn" and attrs.get("nearest_mode", "round_prefer_floor") != "round_prefer_floor":
        add(node, "Resize tf_half_pixel_for_nn without round_prefer_floor", "only round_prefer_floor nearest mode with tf_half_pixel_for_nn")
    if int(attrs.get("antialias", 0)):
        what = "the parser does not read antialias and resizes without it (a different result)" if not rules.resize_opset18_attrs else "antialiasing is not supported"
        add(node, "Resize antialias=1", what)
    if attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        add(node, f"Resize keep_aspect_ratio_policy {attrs['keep_aspect_ratio_policy']!r}", "only 'stretch' is supported")
    rank = ranks.get(inputs[0]) if inputs else None
    axes = attrs.get("axes")
    if axes is not None and (rank is None or [a % rank for a in axes] != list(range(rank))):
        add(node, "Resize axes attribute", "axes must be an iota over every dimension (8.x ignores axes)")
    scales_index = 2 if opset >= 11 else 1
    sizes_given = len(inputs) > 3 and inputs[3]
    if not sizes_given and len(inputs) > scales_index and inputs[scales_index] in consts:
        scales = [float(s) for s in consts[inputs[scales_index]].reshape(-1)]
        inner = {"linear": 3, "cubic": 2}.get(mode)
        if inner and len(scales) > inner and any(s != 1.0 for s in scales[: len(scales) - inner]):
            add(node, f"Resize {mode} beyond the innermost {inner} dimensions",
                f"scales {scales}: TensorRT resizes {mode} only in the last {inner} dimensions (canUseNDResize)")


def _qdq_rules(node: Any, attrs: dict[str, Any], inputs: list[str], consts: dict[str, Any], types: dict[str, int],
               rules: ParserRules, add: Any, uint8: int) -> None:
    import numpy as np

    op = node.op_type
    zp = inputs[2] if len(inputs) > 2 and inputs[2] else None
    if zp is None and rules.qdq_zero_point_required:
        add(node, f"{op} without a zero-point input", f"TensorRT {rules.key} requires 3 inputs for INT8 Q/DQ")
    if zp is not None:
        if types.get(zp) == uint8 or (zp in consts and consts[zp].dtype == np.uint8):
            add(node, f"{op} with a UINT8 zero point", "only symmetric INT8 quantization (UINT8 Q/DQ is refused)")
        elif zp in consts and np.any(consts[zp] != 0):
            add(node, f"{op} zero point not zero", "TensorRT only supports symmetric quantization: the zero point must be all zeros")
    fp8 = 17  # onnx.TensorProto.FLOAT8E4M3FN
    quantized = [t for t in (inputs[0] if op == "DequantizeLinear" else "", zp or "") if t]
    if not rules.fp8_qdq and any(types.get(t) == fp8 for t in quantized):
        add(node, f"{op} with FP8 (float8e4m3fn)", f"TensorRT {rules.key}'s ONNX parser takes INT8 Q/DQ only (FP8 from the 9.x/10.x parsers)")
    scale = inputs[1] if len(inputs) > 1 else ""
    if scale in consts and not np.all(consts[scale] > 0):
        add(node, f"{op} scale not positive", "scale coefficients must all be positive")
    if int(attrs.get("block_size", 0)) and not rules.block_quantization:
        add(node, f"{op} block quantization", f"TensorRT {rules.key} has per-tensor and per-channel Q/DQ only")


def lint_file(path: str | Path, rules: ParserRules) -> LintReport:
    from .. import onnx_io

    # the structure is enough: external weights stay on disk (a 2.5 GB ViT-H graph lints in its 1 MB)
    return lint_model(onnx_io.load(path, weights=False), rules, str(path))
