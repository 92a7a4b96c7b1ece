"""DLA feasibility report: which layers of a ViT graph Jetson's DLA could run, without a GPU.

Walks the ONNX graph at one concrete input shape (ONNX shape inference with data propagation),
maps each node to the TensorRT layer it becomes, and checks it against NVIDIA's published DLA rules
("DLA Supported Layers and Restrictions", TensorRT developer guide): FP16/INT8 only, no dynamic
dimensions, batch <= 4096 and other dimensions <= 8192, Convolution kernel 1..32 / stride 1..8 /
channels <= 8192, Softmax over the channel/spatial axes with axis <= 1024 (<= 8192 when every other
non-batch dimension is 1), Concatenation along channels only, Reduce MAX only, the activation and unary
subsets DLA implements. Layers outside DLA's list (MatrixMultiply, Gather, Normalization, Cast, Erf ...)
fall back to the GPU. Multiply-adds are counted per node (Conv, MatMul, Gemm) from the inferred shapes,
so the report says what share of the model's arithmetic would run on the GPU.

It is an estimate from documented rules, not TensorRT's verdict: on the device, ``build-engine
--dla-core N`` records TensorRT's own per-layer answer (``IBuilderConfig.can_run_on_DLA``) in engine.json.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..lazy import require

RULES_SOURCE = "NVIDIA TensorRT developer guide, 'DLA Supported Layers and Restrictions' (Jetson Orin DLA)"

MAX_BATCH = 4096
MAX_DIM = 8192
SOFTMAX_AXIS_MAX = 1024
SOFTMAX_AXIS_MAX_ALONE = 8192
CONV_KERNEL = (1, 32)
CONV_STRIDE = (1, 8)
CONV_CHANNELS = 8192

_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"}
_ACTIVATIONS = {"Relu", "Sigmoid", "Tanh", "LeakyRelu", "Clip", "PRelu"}
_UNARY_OK = {"Abs", "Sin", "Cos", "Atan"}
_UNARY_OTHER = {"Sqrt", "Exp", "Log", "Reciprocal", "Neg", "Floor", "Ceil", "Round", "Sign", "Not", "Erf", "Tan", "Asin", "Acos"}
_SHUFFLES = {"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze"}
_NO_OPS = {"Identity", "Dropout"}
_ALWAYS_FOLDED = {"Constant", "Shape", "Size", "ConstantOfShape"}
_QDQ = {"QuantizeLinear", "DequantizeLinear"}
_MAC_OPS = {"Conv", "MatMul", "Gemm"}


@dataclass
class NodeVerdict:
    name: str
    op_type: str
    device: str  # "dla", "gpu", "folded" (computed at build time), "fused" (Q/DQ merged into int8 layers)
    dtype: str
    macs: int | None
    reasons: list[tuple[str, str]] = field(default_factory=list)  # (rule, detail)
    # "mask": computed from the inputs beside the images alone (valid_hw: grids, masks, position weights)
    path: str = "main"


@dataclass
class DlaReport:
    graph: str
    precision: str
    input_shape: list[int]
    static_shapes: bool
    nodes: list[NodeVerdict]
    rules_source: str = RULES_SOURCE
    other_inputs: list[str] = field(default_factory=list)  # inputs beside the images (valid_hw)

    @property
    def counted(self) -> list[NodeVerdict]:
        return [n for n in self.nodes if n.device in ("dla", "gpu")]

    @property
    def macs_total(self) -> int:
        return sum(n.macs or 0 for n in self.counted)

    @property
    def macs_gpu(self) -> int:
        return sum(n.macs or 0 for n in self.counted if n.device == "gpu")

    @property
    def gpu_share(self) -> float:
        return self.macs_gpu / self.macs_total if self.macs_total else 0.0

    def by_rule(self, path: str | None = None) -> list[dict[str, Any]]:
        """Fallback grouped by rule, largest multiply-add share first (``path="mask"``: the mask path only)."""
        groups: dict[str, dict[str, Any]] = defaultdict(lambda: {"nodes": 0, "macs": 0, "ops": set(), "example": ""})
        for n in self.counted:
            if n.device != "gpu" or (path is not None and n.path != path):
                continue
            for rule, detail in n.reasons:
                g = groups[rule]
                g["nodes"] += 1
                g["macs"] += n.macs or 0
                g["ops"].add(n.op_type)
                g["example"] = g["example"] or f"{n.name}: {detail}"
        total = self.macs_total or 1
        rows = [
            {"rule": rule, "nodes": g["nodes"], "macs": g["macs"], "macs_share": g["macs"] / total, "ops": sorted(g["ops"]), "example": g["example"]}
            for rule, g in groups.items()
        ]
        return sorted(rows, key=lambda r: (-r["macs"], -r["nodes"], r["rule"]))

    def mask_path(self) -> dict[str, Any]:
        """The layers computed from the inputs beside the images alone (valid_hw -> patch grids, pixel and
        key masks, per-image interpolation weights and position tables): where each runs and why."""
        layers = [n for n in self.counted if n.path == "mask"]
        gpu = [n for n in layers if n.device == "gpu"]
        return {
            "inputs": self.other_inputs,
            "layers": len(layers),
            "dla": len(layers) - len(gpu),
            "gpu": len(gpu),
            "macs": sum(n.macs or 0 for n in layers),
            "macs_share": (sum(n.macs or 0 for n in layers) / self.macs_total) if self.macs_total else 0.0,
            "ops": sorted({n.op_type for n in layers}),
            "fallback": self.by_rule("mask"),
        }

    def to_dict(self) -> dict[str, Any]:
        counts: dict[str, int] = defaultdict(int)
        for n in self.nodes:
            counts[n.device] += 1
        unknown = [n.name for n in self.counted if n.op_type in _MAC_OPS and n.macs is None]
        extra = {"other_inputs": self.other_inputs, "mask_path": self.mask_path()} if self.other_inputs else {}
        return {
            **extra,
            "graph": self.graph,
            "precision": self.precision,
            "input_shape": self.input_shape,
            "static_shapes": self.static_shapes,
            "rules_source": self.rules_source,
            "macs_total": self.macs_total,
            "macs_gpu": self.macs_gpu,
            "gpu_share": round(self.gpu_share, 6),
            "layers": dict(counts),
            "macs_unknown_nodes": unknown,
            "fallback": self.by_rule(),
            "nodes": [dict(asdict(n), reasons=[{"rule": r, "detail": d} for r, d in n.reasons]) for n in self.nodes],
        }

    def summary_lines(self) -> list[str]:
        d = self.to_dict()
        layers = d["layers"]
        lines = [
            f"DLA feasibility of {Path(self.graph).name} ({self.precision}) at input {list(self.input_shape)}:",
            f"  {layers.get('dla', 0)} layers DLA-capable, {layers.get('gpu', 0)} fall back to the GPU "
            f"({layers.get('folded', 0)} folded at build time, {layers.get('fused', 0)} Q/DQ fused)",
            f"  multiply-adds on the GPU: {self.macs_gpu:,} of {self.macs_total:,} ({100 * self.gpu_share:.1f}%)",
        ]
        for row in d["fallback"][:8]:
            lines.append(f"  - {row['rule']}: {row['nodes']} nodes, {100 * row['macs_share']:.1f}% of MACs ({', '.join(row['ops'])}); e.g. {row['example']}")
        if self.other_inputs:
            mask = d["mask_path"]
            lines.append(
                f"  mask path (computed from {', '.join(self.other_inputs)} alone): {mask['layers']} layers, {mask['dla']} DLA-capable, "
                f"{mask['gpu']} on the GPU, {100 * mask['macs_share']:.1f}% of MACs ({', '.join(mask['ops'])})"
            )
            for row in mask["fallback"][:6]:
                lines.append(f"    - {row['rule']}: {row['nodes']} nodes ({', '.join(row['ops'])}); e.g. {row['example']}")
        if d["macs_unknown_nodes"]:
            lines.append(
                f"  ({len(d['macs_unknown_nodes'])} matmul/conv nodes had unresolved shapes and are not counted; "
                "ONNX Runtime's symbolic shape inference, which needs sympy, resolves more)"
            )
        lines.append(f"  rules: {self.rules_source}; TensorRT decides on the device (engine.json records its verdict)")
        return lines


# -- graph walking ----------------------------------------------------------------------------------
def _np_name(onnx: Any, elem_type: int) -> str:
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name
    except Exception:  # unknown/undefined element type
        return "unknown"


def _shape_of(value_info: Any) -> list[int] | None:
    tt = value_info.type.tensor_type
    if not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        elif d.HasField("dim_value") and d.dim_value == 0:
            dims.append(0)
        else:
            return None
    return dims


def analyse(
    graph: str | Path,
    input_shape: tuple[int, ...],
    precision: str,
    static_shapes: bool = True,
    flags_lower_fp32: bool = False,
    other_inputs: dict[str, tuple[int, ...]] | None = None,
) -> DlaReport:
    """Report for ``graph`` fed ``input_shape``; ``flags_lower_fp32``: legacy FP16/INT8 flags make fp32 layers eligible.

    ``other_inputs``: the shapes of the inputs beside the images (a variable-size graph's valid_hw
    [B, 2]); the layers computed from those inputs alone are the report's mask path."""
    onnx = require("onnx", "the DLA report")
    from .. import onnx_io

    model = onnx_io.load(graph, weights=False)  # layer types and shapes: the weights stay on disk
    inits = {i.name for i in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in inits]
    others = {name: tuple(int(d) for d in shape) for name, shape in (other_inputs or {}).items()}
    images = [v for v in inputs if v.name not in others]
    if len(images) != 1 or len(images[0].type.tensor_type.shape.dim) != len(input_shape):
        named = f" beside {', '.join(sorted(others))}" if others else ""
        raise UserError(f"{graph}: expected one image input of rank {len(input_shape)}{named}, got inputs {[v.name for v in inputs]}")
    missing = sorted(set(others) - {v.name for v in inputs})
    if missing:
        raise UserError(f"{graph} has no input {', '.join(missing)}")
    concrete = {images[0].name: tuple(int(v) for v in input_shape), **others}
    for value in inputs:
        dims = value.type.tensor_type.shape.dim
        if len(dims) != len(concrete[value.name]):
            raise UserError(f"{graph}: input {value.name!r} has rank {len(dims)}, given shape {list(concrete[value.name])}")
        for dim, size in zip(dims, concrete[value.name]):
            dim.Clear()
            dim.dim_value = int(size)
    # Exporters leave symbolic value_info (e.g. "(s90//16)"); drop it so every shape is recomputed
    # from the concrete input.
    del model.graph.value_info[:]
    model = _infer_shapes(onnx, model, graph, input_shape)

    types: dict[str, str] = {}
    shapes: dict[str, list[int] | None] = {}
    for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        types[v.name] = _np_name(onnx, v.type.tensor_type.elem_type)
        shapes[v.name] = _shape_of(v)
    for init in model.graph.initializer:
        types[init.name] = _np_name(onnx, init.data_type)
        shapes[init.name] = [int(d) for d in init.dims]

    constant: set[str] = set(inits) | {""}
    dequantized: set[str] = set()  # activations that come out of a DequantizeLinear (int8 on TensorRT)
    attrs_of = lambda node: {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}  # noqa: E731
    verdicts: list[NodeVerdict] = []
    # Which tensors the images reach and which the other inputs (valid_hw) reach: a layer reached by
    # valid_hw but not by the images belongs to the mask path (grids, masks, per-image position tables).
    from_images: set[str] = {images[0].name}
    from_others: set[str] = set(others)
    for node in model.graph.node:
        attrs = attrs_of(node)
        outs = [o for o in node.output if o]
        out_type = types.get(outs[0], "unknown") if outs else "unknown"
        acts = [i for i in node.input if i not in constant]
        by_images = any(i in from_images for i in acts)
        by_others = any(i in from_others for i in acts)
        if by_images:
            from_images.update(outs)
        if by_others:
            from_others.update(outs)
        path = "mask" if by_others and not by_images else "main"
        if node.op_type in _ALWAYS_FOLDED or not acts:
            constant.update(outs)
            from_images.difference_update(outs)  # static shapes: Shape/Size of an input is a build-time constant
            from_others.difference_update(outs)
            verdicts.append(NodeVerdict(node.name or outs[0], node.op_type, "folded", out_type, None))
            continue
        if node.op_type in _QDQ:
            if node.op_type == "DequantizeLinear":
                dequantized.update(outs)
            verdicts.append(NodeVerdict(node.name or outs[0], node.op_type, "fused", out_type, None, path=path))
            continue
        if node.op_type in _NO_OPS:
            verdicts.append(NodeVerdict(node.name or outs[0], node.op_type, "folded", out_type, None, path=path))
            if any(i in dequantized for i in acts):
                dequantized.update(outs)
            continue

        compute = types.get(acts[0], "unknown")
        if node.op_type in _MAC_OPS and any(i in dequantized for i in acts):
            compute = "int8"
        reasons: list[tuple[str, str]] = []
        if not static_shapes:
            reasons.append(("dynamic dimensions", "DLA needs min = opt = max in every profile"))
        if compute == "float32" and not flags_lower_fp32:
            reasons.append(("fp32 compute", "DLA runs FP16 and INT8 only"))
        elif compute not in ("float16", "float32", "int8", "uint8"):
            reasons.append(("integer/bool tensor math", f"{compute} tensors are not DLA data"))
        for name in acts + outs:
            shp = shapes.get(name)
            if shp is None:
                continue
            if len(shp) > 4:
                reasons.append(("tensor rank > 4", f"{name} is {len(shp)}-D; DLA layers take up to 4-D (N,C,H,W)"))
            elif shp and shp[0] > MAX_BATCH:
                reasons.append(("batch > 4096", f"{name} has batch {shp[0]}"))
            if len(shp) > 1 and max(shp[1:]) > MAX_DIM:
                reasons.append(("dimension > 8192", f"{name} is {shp}"))
        reasons += _op_rules(node, attrs, acts, outs, shapes)
        macs = _macs(node, attrs, shapes)
        unique = list(dict.fromkeys(reasons))
        verdicts.append(NodeVerdict(node.name or outs[0], node.op_type, "gpu" if unique else "dla", compute, macs, unique, path))
    return DlaReport(str(graph), precision, [int(v) for v in input_shape], static_shapes, verdicts, other_inputs=sorted(others))


def _unresolved(model: Any) -> int:
    known = {v.name: _shape_of(v) for v in list(model.graph.value_info) + list(model.graph.output)}
    return sum(1 for n in model.graph.node for o in n.output if o and known.get(o) is None)


def _infer_shapes(onnx: Any, model: Any, graph: Any, input_shape: tuple[int, ...]) -> Any:
    """ONNX shape inference with data propagation; where shape arithmetic defeats it (integer Div in
    a dynamic-resolution position-table resize), ONNX Runtime's symbolic shape inference."""
    from .. import onnx_io

    try:
        inferred = onnx_io.infer_shapes(model, data_prop=True)  # on a weightless copy
    except Exception as exc:
        raise UserError(f"ONNX shape inference failed on {graph} at {list(input_shape)}: {exc}") from None
    if _unresolved(inferred) == 0:
        return inferred
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        symbolic = SymbolicShapeInference.infer_shapes(model, auto_merge=True)
    except Exception:  # optional refinement only; the report counts what stays unknown
        return inferred
    return symbolic if _unresolved(symbolic) < _unresolved(inferred) else inferred


def _rank_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _op_rules(node: Any, attrs: dict[str, Any], acts: list[str], outs: list[str], shapes: dict[str, Any]) -> list[tuple[str, str]]:
    op = node.op_type
    in_shape = shapes.get(acts[0])
    out_shape = shapes.get(outs[0]) if outs else None
    if op == "Conv":
        kernel = list(attrs.get("kernel_shape") or (shapes.get(node.input[1]) or [0, 0, 0, 0])[2:])
        strides = list(attrs.get("strides") or [1] * len(kernel))
        problems = []
        if len(kernel) != 2:
            problems.append(("Convolution not 2-D", f"{len(kernel)}-D kernel"))
        if any(not CONV_KERNEL[0] <= k <= CONV_KERNEL[1] for k in kernel):
            problems.append(("Convolution kernel > 32", f"kernel {kernel}"))
        if any(not CONV_STRIDE[0] <= s <= CONV_STRIDE[1] for s in strides):
            problems.append(("Convolution stride > 8", f"stride {strides} (a ViT patch embedding strides by the patch size)"))
        w = shapes.get(node.input[1])
        if w and max(w[0], w[1] * int(attrs.get("group", 1))) > CONV_CHANNELS:
            problems.append(("Convolution channels > 8192", f"weights {w}"))
        return problems
    if op in ("MatMul", "Gemm"):
        both = len(acts) >= 2
        detail = "activation x activation (attention)" if both else "linear layer on a token tensor"
        return [("MatrixMultiply is not a DLA layer", f"{detail}; DLA runs linear layers only as Convolution/FullyConnected over N,C,H,W")]
    if op in _ELEMENTWISE or op in _ACTIVATIONS or op in _UNARY_OK:
        return []
    if op == "Erf":
        return [("Erf (exact GELU) is not a DLA op", "DLA's unary ops are Abs, Sin, Cos, Atan")]
    if op == "Gelu":
        return [("GELU is not a DLA activation", "DLA activations: ReLU, Sigmoid, TanH, Clipped ReLU, Leaky ReLU")]
    if op in _UNARY_OTHER:
        return [(f"unary {op} is not a DLA op", "DLA's unary ops are Abs, Sin, Cos, Atan")]
    if op == "Softmax":
        if in_shape is None:
            return []
        rank = len(in_shape)
        axis = _rank_axis(int(attrs.get("axis", -1)), rank)
        if axis == 0:
            return [("Softmax over the batch axis", "DLA's Softmax runs over channel/spatial axes")]
        others = [d for i, d in enumerate(in_shape) if i not in (0, axis)]
        limit = SOFTMAX_AXIS_MAX_ALONE if all(d == 1 for d in others) else SOFTMAX_AXIS_MAX
        if in_shape[axis] > limit:
            return [("Softmax axis over DLA's size limit", f"axis size {in_shape[axis]} > {limit}")]
        return []
    if op in ("LayerNormalization", "GroupNormalization", "InstanceNormalization", "BatchNormalization"):
        if op == "BatchNormalization":
            return []  # folded into a Scale layer, which DLA runs
        return [(f"{op} is not a DLA layer", "TensorRT's Normalization layer runs on the GPU")]
    if op.startswith("Reduce"):
        if op != "ReduceMax":
            return [(f"{op} is not a DLA reduction", "DLA's Reduce takes MAX only")]
        return []
    if op == "Concat":
        if out_shape is None:
            return []
        rank = len(out_shape)
        axis = _rank_axis(int(attrs.get("axis", 0)), rank)
        channel = rank - 3 if rank >= 3 else None
        if axis != channel:
            return [("Concat not along channels", f"axis {axis} of a {rank}-D tensor (e.g. the class token)")]
        return []
    if op in _SHUFFLES:
        if in_shape is not None and out_shape is not None and in_shape and out_shape:
            moved = (op == "Transpose" and list(attrs.get("perm", [0]))[0] != 0) or in_shape[0] != out_shape[0]
            if moved:
                return [("Shuffle across the batch dimension", f"{in_shape} -> {out_shape}")]
        return []
    if op in ("Slice", "Split", "Resize", "MaxPool", "AveragePool", "Pad"):
        return []
    if op == "Cast":
        return [("Cast is not a DLA layer", "type conversions run on the GPU at the DLA boundary")]
    if op == "Gather":
        return [("Gather is not a DLA layer", "e.g. the class-token pick and the q/k/v split")]
    return [(f"{op} is not a DLA layer", "not in DLA's supported-layer list")]


def _macs(node: Any, attrs: dict[str, Any], shapes: dict[str, Any]) -> int | None:
    op = node.op_type
    if op not in _MAC_OPS:
        return 0
    out = shapes.get(node.output[0])
    if out is None:
        return None
    if op == "MatMul":
        a = shapes.get(node.input[0])
        if not a:
            return None
        k = a[-1]
        return _prod(out) * k
    if op == "Gemm":
        a = shapes.get(node.input[0])
        if not a or len(a) != 2:
            return None
        k = a[0] if attrs.get("transA", 0) else a[1]
        return _prod(out) * k
    w = shapes.get(node.input[1])  # Conv: out elements x (Cin/group x kernel)
    if not w:
        return None
    return _prod(out) * _prod(w[1:])


def _prod(values: list[int]) -> int:
    result = 1
    for v in values:
        result *= int(v)
    return result
