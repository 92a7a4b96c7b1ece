"""Lower a bundle graph to what an older TensorRT's ONNX parser reads (TensorRT 8.5/8.6: opset 17).

The bundle's graphs are opset 20 with one ``Gelu`` per MLP and one ``LayerNormalization`` per norm.
TensorRT 8.x's parser reads operators up to opset 17, has no ``Gelu`` importer, and 8.5 has no
``LayerNormalization`` importer either (``parser_rules``). ``lower_for`` rewrites:

- ``Gelu`` -> ``0.5 * x * (1 + Erf(x / sqrt 2))`` (``approximate="tanh"``: the tanh form), in the
  node's own dtype, as the TorchScript exporter writes it and TensorRT 8.x fuses it;
- ``LayerNormalization`` (where the parser has no importer) -> ``ReduceMean``, ``Sub``, ``Pow``,
  ``ReduceMean``, ``Add`` eps, ``Sqrt``, ``Div``, ``Mul`` scale, ``Add`` bias, always in fp32 (Casts
  are inserted around an fp16 input, as the fp16 graph keeps LayerNorm in fp32);
- every node whose operator changed after the target opset, by the op's own rule: Reduce* axes
  input -> attribute (opset 18), ``Resize`` opset-18 attributes dropped when they hold their
  defaults, ``Split`` ``num_outputs`` -> an equal split by output count, ``GridSample`` opset-20
  mode names -> opset-16 ones, ``AveragePool`` unit dilations dropped, ``Cast``/``Q``/``DQ``
  ``saturate`` dropped; ops whose newer versions only added types keep their node as it is.
  Anything else is refused by name (no silent best effort);
- the opset import to the target and the IR version to 8 (what opset 17 belongs to).

Q/DQ nodes, their scales, zero points and per-channel axes are not touched. The result must pass
``onnx.checker`` with full shape inference at the target opset and the parse lint for the target;
``verify`` then compares it with the original on ONNX Runtime (``bundle_graph`` stores it).
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import numpy as np

from .. import precisions
from ..errors import UserError
from ..lazy import require
from .parser_rules import REDUCE_OPS_AXES_INPUT_18, ParserRules

IR_VERSION_FOR_OPSET17 = 8
FP32_MAX_ABS = 1e-5  # lowered fp32 graph vs the bundle's fp32 graph, every output


class LoweringError(UserError):
    """The graph holds something the lowering cannot rewrite for the target."""


class _Builder:
    """Fresh node/initializer names and a node list to splice in place of one node."""

    def __init__(self, onnx: Any, graph: Any, prefix: str):
        self.onnx = onnx
        self.graph = graph
        self.prefix = prefix
        self.nodes: list[Any] = []
        self.count = 0

    def name(self, what: str) -> str:
        self.count += 1
        return f"{self.prefix}/{what}_{self.count}"

    def const(self, what: str, value: np.ndarray) -> str:
        name = self.name(what)
        self.graph.initializer.append(self.onnx.numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], output: str | None = None, **attrs: Any) -> str:
        out = output or self.name(op.lower())
        self.nodes.append(self.onnx.helper.make_node(op, inputs, [out], name=self.name(op), **attrs))
        return out


def _np_dtype(onnx: Any, elem_type: int | None) -> Any:
    if not elem_type:
        return np.float32
    return onnx.helper.tensor_dtype_to_np_dtype(elem_type)


def _value_types(onnx: Any, model: Any) -> tuple[dict[str, int], dict[str, int]]:
    """(element type, rank) of every tensor shape inference can name."""
    from .. import onnx_io

    try:
        inferred = onnx_io.infer_shapes(model, strict_mode=False)  # on a weightless copy
    except Exception:
        inferred = model
    types: dict[str, int] = {}
    ranks: dict[str, int] = {}
    for v in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        tt = v.type.tensor_type
        if tt.elem_type:
            types[v.name] = tt.elem_type
        if tt.HasField("shape"):
            ranks[v.name] = len(tt.shape.dim)
    for init in inferred.graph.initializer:
        types[init.name] = init.data_type
        ranks[init.name] = len(init.dims)
    return types, ranks


def _attr(onnx: Any, node: Any, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            value = onnx.helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


def _drop_attrs(node: Any, names: set[str]) -> None:
    keep = [a for a in node.attribute if a.name not in names]
    del node.attribute[:]
    node.attribute.extend(keep)


def _gelu(b: _Builder, onnx: Any, node: Any, dtype: Any) -> None:
    x, y = node.input[0], node.output[0]
    half = b.const("half", np.array(0.5, dtype))
    one = b.const("one", np.array(1.0, dtype))
    if _attr(onnx, node, "approximate", "none") == "tanh":
        # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = b.node("Mul", [b.node("Mul", [x, x]), x])
        inner = b.node("Add", [x, b.node("Mul", [cube, b.const("c", np.array(0.044715, dtype))])])
        t = b.node("Tanh", [b.node("Mul", [inner, b.const("k", np.array(np.sqrt(2.0 / np.pi), dtype))])])
        gate = b.node("Add", [t, one])
    else:
        # 0.5 x (1 + erf(x / sqrt 2)): the exact form
        gate = b.node("Add", [b.node("Erf", [b.node("Div", [x, b.const("sqrt2", np.array(np.sqrt(2.0), dtype))])]), one])
    b.node("Mul", [b.node("Mul", [x, half]), gate], y)


def _layer_norm(b: _Builder, onnx: Any, node: Any, dtype: Any, rank: int | None, consts: dict[str, Any]) -> None:
    if any(o for o in node.output[1:]):
        raise LoweringError(f"LayerNormalization {node.name} uses its Mean/InvStdDev outputs; the lowering writes only Y")
    axis = int(_attr(onnx, node, "axis", -1))
    eps = float(_attr(onnx, node, "epsilon", 1e-5))
    if axis < 0:
        axes = list(range(axis, 0))
    elif rank is not None:
        axes = list(range(axis - rank, 0))
    else:
        raise LoweringError(f"LayerNormalization {node.name}: axis {axis} with an input of unknown rank")
    x, y = node.input[0], node.output[0]
    f32 = onnx.TensorProto.FLOAT
    low = np.dtype(dtype) != np.float32
    if low:  # normalise in fp32, as the fp16 graph keeps LayerNorm in fp32
        x = b.node("Cast", [x], to=f32)

    def fp32_param(name: str) -> str:
        if not name:
            return ""
        if name in consts:
            return b.const("param", consts[name].astype(np.float32))
        return b.node("Cast", [name], to=f32) if low else name

    mean = b.node("ReduceMean", [x], axes=axes, keepdims=1)
    centred = b.node("Sub", [x, mean])
    var = b.node("ReduceMean", [b.node("Pow", [centred, b.const("two", np.array(2.0, np.float32))])], axes=axes, keepdims=1)
    std = b.node("Sqrt", [b.node("Add", [var, b.const("eps", np.array(eps, np.float32))])])
    out = b.node("Mul", [b.node("Div", [centred, std]), fp32_param(node.input[1])])
    if len(node.input) > 2 and node.input[2]:
        out = b.node("Add", [out, fp32_param(node.input[2])])
    if low:
        b.node("Cast", [out], y, to=int(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))))
    else:
        b.node("Identity", [out], y)


# Ops whose versions after opset 17 only widened type constraints or added attributes that are
# dropped here when they hold their defaults; their node is kept.
_SATURATE_OPS = {"Cast", "CastLike", "QuantizeLinear", "DequantizeLinear"}


def _downgrade_node(onnx: Any, node: Any, source_opset: int, target: int, consts: dict[str, Any], counts: Counter) -> None:
    """Rewrite one default-domain node, in place, to its form at ``target`` opset."""
    defs = onnx.defs
    op = node.op_type
    try:
        newer = defs.get_schema(op, source_opset).since_version
    except Exception:
        raise LoweringError(f"{op} ({node.name}) has no ONNX schema at opset {source_opset}") from None
    if newer <= target:
        return
    try:
        older = defs.get_schema(op, target)
    except Exception:
        raise LoweringError(f"{op} ({node.name}) does not exist at opset {target}; no lowering for it") from None
    new_schema = defs.get_schema(op, source_opset)
    if op in REDUCE_OPS_AXES_INPUT_18:
        if len(node.input) > 1 and node.input[1]:
            if node.input[1] not in consts:
                raise LoweringError(f"{op} {node.name}: axes come from a computed tensor; opset {target} needs them constant")
            axes = [int(a) for a in consts[node.input[1]].reshape(-1)]
            del node.input[1:]
            node.attribute.append(onnx.helper.make_attribute("axes", axes))
        if int(_attr(onnx, node, "noop_with_empty_axes", 0)):
            raise LoweringError(f"{op} {node.name}: noop_with_empty_axes=1 has no opset-{target} form")
        _drop_attrs(node, {"noop_with_empty_axes"})
        counts[f"{op} axes input -> attribute"] += 1
        return
    if op == "Resize":
        if int(_attr(onnx, node, "antialias", 0)):
            raise LoweringError(f"Resize {node.name}: antialias=1 has no opset-{target} form and TensorRT 8.x does not antialias")
        if _attr(onnx, node, "keep_aspect_ratio_policy", "stretch") != "stretch":
            raise LoweringError(f"Resize {node.name}: keep_aspect_ratio_policy other than stretch has no opset-{target} form")
        if _attr(onnx, node, "axes") is not None:
            raise LoweringError(f"Resize {node.name}: the axes attribute has no opset-{target} form")
        if _attr(onnx, node, "coordinate_transformation_mode", "half_pixel") == "half_pixel_symmetric":
            raise LoweringError(f"Resize {node.name}: half_pixel_symmetric is an opset-19 mode TensorRT 8.x does not have")
        _drop_attrs(node, {"antialias", "keep_aspect_ratio_policy", "axes"})
        counts["Resize opset-18 attributes dropped (defaults)"] += 1
        return
    if op == "Split":
        if _attr(onnx, node, "num_outputs") is not None:
            if len(node.input) > 1 and node.input[1]:
                raise LoweringError(f"Split {node.name}: both split sizes and num_outputs")
            _drop_attrs(node, {"num_outputs"})  # opset 13: no split input -> equal parts, one per output
            counts["Split num_outputs -> equal split"] += 1
        return
    if op == "GridSample":
        mode = _attr(onnx, node, "mode", "linear")
        renamed = {"linear": "bilinear", "cubic": "bicubic", "nearest": "nearest"}.get(mode)
        if renamed is None:
            raise LoweringError(f"GridSample {node.name}: mode {mode!r} has no opset-{target} name")
        _drop_attrs(node, {"mode"})
        node.attribute.append(onnx.helper.make_attribute("mode", renamed))
        counts["GridSample mode renamed"] += 1
        return
    if op == "AveragePool":
        dil = _attr(onnx, node, "dilations")
        if dil is not None and any(int(d) != 1 for d in dil):
            raise LoweringError(f"AveragePool {node.name}: dilations {list(dil)} have no opset-{target} form")
        _drop_attrs(node, {"dilations"})
        return
    if op in _SATURATE_OPS:
        if _attr(onnx, node, "block_size"):
            raise LoweringError(f"{op} {node.name}: block quantization has no opset-{target} form")
        _drop_attrs(node, {"saturate", "output_dtype"} if op == "QuantizeLinear" else {"saturate"})
        return
    # Versions that only widened types: same inputs, outputs and attributes.
    same_io = [i.name for i in new_schema.inputs] == [i.name for i in older.inputs] and \
        [o.name for o in new_schema.outputs] == [o.name for o in older.outputs]
    if same_io and set(new_schema.attributes) == set(older.attributes):
        return
    raise LoweringError(f"{op} ({node.name}) changed between opset {target} and {source_opset} and vitdeploy has no rewrite for it")


def lower_for(model: Any, rules: ParserRules) -> tuple[Any, dict[str, Any]]:
    """A copy of ``model`` the parser ``rules`` describe can read, and what was rewritten."""
    onnx = require("onnx", "lowering graphs for TensorRT 8.x")
    from .lint import default_opset, lint_model

    out = copy.deepcopy(model)
    graph = out.graph
    source_opset = default_opset(out)
    target = min(source_opset, rules.opset_max)
    types, ranks = _value_types(onnx, out)
    from .. import onnx_io

    consts = onnx_io.inline_arrays(out)  # axes, split sizes, LayerNorm scales: never the external weights
    counts: Counter = Counter()
    new_nodes: list[Any] = []
    for index, node in enumerate(graph.node):
        op = node.op_type
        in_domain = node.domain in ("", "ai.onnx")
        if in_domain and op == "Gelu" and op not in rules.importers:
            b = _Builder(onnx, graph, f"{node.name or 'gelu'}.lowered")
            _gelu(b, onnx, node, _np_dtype(onnx, types.get(node.input[0])))
            new_nodes += b.nodes
            counts[f"Gelu -> {'tanh' if _attr(onnx, node, 'approximate', 'none') == 'tanh' else 'Erf'} form"] += 1
            continue
        if in_domain and op == "LayerNormalization" and op not in rules.importers:
            b = _Builder(onnx, graph, f"{node.name or 'ln'}.lowered")
            _layer_norm(b, onnx, node, _np_dtype(onnx, types.get(node.input[0])), ranks.get(node.input[0]), consts)
            new_nodes += b.nodes
            counts["LayerNormalization -> ReduceMean/Sub/Pow/Sqrt/Div (fp32)"] += 1
            continue
        if in_domain and target < source_opset:
            _downgrade_node(onnx, node, source_opset, target, consts, counts)
        new_nodes.append(node)
    del graph.node[:]
    graph.node.extend(new_nodes)
    if target < source_opset:
        for imp in out.opset_import:
            if imp.domain in ("", "ai.onnx"):
                imp.version = target
        out.ir_version = min(out.ir_version, IR_VERSION_FOR_OPSET17) if target <= 17 else out.ir_version
        counts[f"opset {source_opset} -> {target}"] += 1
    # Symbolic value_info of the exporter can name shapes the rewritten nodes no longer produce.
    del graph.value_info[:]
    try:
        onnx_io.check_model(out, full_check=True)  # the structure: external weights need not be loaded
    except Exception as exc:
        raise LoweringError(f"the lowered graph is not valid ONNX at opset {target}: {str(exc).splitlines()[0][:300]}") from None
    report = lint_model(out, rules, "lowered graph")
    if report.findings:
        raise LoweringError(f"the lowered graph still has what TensorRT {rules.key} cannot parse: {report.findings[0].line()}")
    record = {"parser": rules.key, "opset": [source_opset, target], "rewrites": dict(counts), "nodes": [len(model.graph.node), len(graph.node)]}
    return out, record


# -- verification and the bundle --------------------------------------------------------------------
def lowered_name(graph_file: str, rules_key: str) -> str:
    """'model.fp16.onnx' + '8.6' -> 'model.fp16.trt8.6.onnx'."""
    stem = graph_file[: -len(".onnx")] if graph_file.endswith(".onnx") else graph_file
    return f"{stem}.trt{rules_key}.onnx"


def verify(original: Any, lowered: Any, precision: str, bundle: Any, random_count: int = 16) -> dict[str, Any]:
    """Run both graphs on ONNX Runtime (no graph optimisation: each as written) and gate the lowered one.

    fp32: every output within ``FP32_MAX_ABS``. fp16/int8: the reduced-precision gates of
    ``vitdeploy check`` (1st-percentile cosine, top-1 agreement, accuracy drop) against the bundle's
    graph of the same precision, on its labelled test split when it has one, and cosine on seeded
    random images at every size the bundle is verified at. Raises ``LoweringError`` listing every
    failed gate; returns the record.
    """
    from ..evalsets import random_sets, real_set
    from ..data import default_data
    from ..compare import Criterion, accuracy, compare_outputs, parity_gates
    from ..gate import Gate
    from ..runtime.ort import OrtRunner

    gate = Gate()  # check's defaults
    ref = OrtRunner(original, precision, optimization="disable", threads=1)
    low = OrtRunner(lowered, precision, optimization="disable", threads=1)
    names = tuple(ref.outputs())
    primary = "logits" if "logits" in names else names[0]  # the output top-1 and accuracy are read from
    if tuple(low.outputs()) != names:
        raise LoweringError(f"the lowered graph's outputs {list(low.outputs())} differ from the original's {list(names)}")
    sets = []
    data = default_data(bundle) if bundle is not None and bundle.bare_onnx is None else None
    if data:
        sets.append(real_set(bundle, data))
    sets += random_sets(bundle, random_count, 0)
    gates: list[Criterion] = []
    rows = []
    run_both = _two_input_runs(ref, low, bundle, names)  # variable-size graphs: (images, valid_hw)
    for s in sets:
        if run_both is not None:
            a, b = run_both(s.images)
        else:
            a = ref.infer_batched(s.images, 16, names)
            b = low.infer_batched(s.images, 16, names)
        for name in names:
            if not np.issubdtype(a[name].dtype, np.floating):
                if not np.array_equal(a[name], b[name]):
                    gates.append(Criterion(f"{name} identical on {s.name}", 0.0, 1.0, ">="))
                continue
            stats = compare_outputs(name, a[name], b[name])
            rows.append({"set": s.name, "output": name, "max_abs": stats.max_abs, "cosine_p1": stats.cosine_p1, "top1_agreement": stats.top1_agreement})
            if not precisions.get(precision).reduced:
                gates.extend(parity_gates(name, stats, FP32_MAX_ABS, f" on {s.name}"))
                continue
            gates.extend(gate.numeric(precision, stats, name, f"{name} cosine (1st percentile)", f" on {s.name}"))
            if s.real and s.labels is not None and name == primary:
                gates.append(gate.agreement(precision, stats.top1_agreement, f"top-1 agreement on {s.name}"))
                drop = accuracy(a[name], s.labels) - accuracy(b[name], s.labels)
                gates.append(gate.accuracy_drop(precision, drop, f"accuracy drop on {s.name}"))
    ref.close()
    low.close()
    failed = [g.describe() for g in gates if not g.passed]
    if failed:
        raise LoweringError(f"the lowered {precision} graph differs from the bundle's: {'; '.join(failed)}")
    return {"passed": True, "execution": "onnxruntime, optimisations off", "gates": [g.to_dict() for g in gates], "rows": rows,
            "images": {s.name: int(len(s.images)) for s in sets}}


def _two_input_runs(ref: Any, low: Any, bundle: Any, names: tuple[str, ...]) -> Any:
    """For a variable-size graph, a function images -> (original outputs, lowered outputs) that feeds
    both graphs the same seeded whole-patch ``valid_hw`` (the canvas, one patch, then random sizes):
    the mask and the per-image position tables are what the lowering must keep. None for one input.
    The input names, canvas and patch come from the bundle's input contract."""
    from ..contract import InputContract

    inputs = tuple(i.name for i in ref.session.get_inputs())
    if len(inputs) == 1:
        return None
    contract = InputContract.from_bundle(bundle) if bundle is not None else None
    if contract is None or not contract.mixes_sizes or set(inputs) != set(contract.input_names):
        raise LoweringError(f"cannot verify a graph with inputs {list(inputs)}: vitdeploy feeds (images) or, for variable-size bundles, (images, valid_hw)")
    (canvas_h, canvas_w), patch = contract.size, contract.patch
    grid_h, grid_w = canvas_h // patch[0], canvas_w // patch[1]
    image_name, valid_name = contract.input_names

    def run(images: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        rng = np.random.default_rng(0)
        grids = rng.integers(1, [grid_h + 1, grid_w + 1], size=(len(images), 2))
        grids[:2] = [[grid_h, grid_w], [1, 1]][: len(images)]
        feeds = {image_name: images, valid_name: (grids * np.array(patch)).astype(np.int32)}
        outs = []
        for runner in (ref, low):
            parts = [runner.run(contract.take(feeds, i, i + 16), outputs=names) for i in range(0, len(images), 16)]
            outs.append({n: np.concatenate([p[n] for p in parts]) for n in names})
        return outs[0], outs[1]

    return run


def bundle_graph(bundle: Any, source: Any, precision: str, rules: ParserRules, log: Any = None) -> tuple[Any, dict[str, Any]]:
    """The graph TensorRT ``rules.key`` parses for ``source`` (a graph of ``bundle``): reused when the
    bundle already holds it for this very source, else lowered, verified and written atomically
    beside it (``model[.fp16|.int8].trt<key>.onnx``) and recorded under ``manifest["parser_graphs"]``."""
    from pathlib import Path

    from .. import onnx_io
    from ..fileio import sha256_file

    require("onnx", "lowering graphs for TensorRT 8.x")
    source = Path(source)
    dst = source.parent / lowered_name(source.name, rules.key)
    source_sha = sha256_file(source)
    key = f"{precision}@trt{rules.key}"
    folder = bundle.bare_onnx is None
    known = (bundle.manifest.get("parser_graphs") or {}).get(key) if folder else None
    if known and known.get("source_sha256") == source_sha and dst.is_file() and not onnx_io.check_files(dst.parent, known):
        return dst, known
    if log:
        log(f"lowering {source.name} for the TensorRT {rules.key} parser -> {dst.name} (verified with ONNX Runtime first)")
    # the rewrites touch nodes, not weights: external weights are streamed from the source's data file
    # into the lowered graph's, never loaded (graph and data file land together, once verified)
    model = onnx_io.load(source, weights=False)
    lowered, record = lower_for(model, rules)
    del model
    def record_it() -> None:  # in the same signal-free step as the graph's rename
        if folder:
            bundle.manifest.setdefault("parser_graphs", {})[key] = record
            bundle.save()

    with onnx_io.staged(dst, then=record_it) as tmp:
        written = onnx_io.save(lowered, tmp, source_dir=source.parent, manifest=bundle.manifest if folder else None)
        del lowered
        record["verification"] = verify(source, tmp, precision, bundle)
        record.update({**written, "source": source.name,  # file, sha256, bytes (and the data file's)
                       "source_sha256": source_sha, "precision": precision, "rules_source": rules.source})
    return dst, record
