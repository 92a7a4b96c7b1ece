"""FP16 mixed-precision pass: fp32 bundle graph -> ``model.fp16.onnx``.

TensorRT 11 builds networks strongly typed, so FP16 has to be decided in the ONNX graph (DESIGN.md,
"Precision lives in the ONNX graph"). The conversion is onnxconverter-common's
``float16.convert_float_to_float16`` with a block list; what we add is the ViT-aware policy:

* kept in fp32: the baked preprocessing (uint8 -> float, /255, mean/std, transpose; the pixel maths
  must not round), every ``LayerNormalization`` (the LayerNorm after attention overflows fp16 in
  real ViTs, a long-standing TensorRT issue), every ``Softmax`` (the attention weights and ``probs``),
  the converter's own default block list (Resize among them: the position-table interpolation of
  dynamic-resolution graphs) and any op type the user names (``--keep-fp32``); in a variable-size
  graph also the ``valid_hw`` mask path (:mod:`.mask_path`: masks, the -30000 key bias, per-sample
  position tables, masked-mean weights, and the nodes where they join the image stream), and the
  graph is gated on the invariance before it is written (:mod:`.variable_precision`);
* kept in fp32 because of the numbers (:mod:`.fp16_range`): every node whose values, measured on
  range images through the fp32 graph, exceed a safety threshold of fp16's range (the residual
  Adds and the layers that write a massive residual stream), and every module or ``MODULE/ROLE``
  cell the user names (``--keep-fp32 blocks.3,blocks.2/mlp-fc2``, what ``debug-precision`` finds);
* gated before it is written (:mod:`.fp16_gate`): finite outputs and the logit cosine on seeded
  images, and with labelled data the accuracy, agreement and cosine gate of INT8 and ``check``;
  a graph that fails is not written;
* unchanged interface: the uint8 ``images`` input and the fp32 ``logits``/``probs`` outputs
  (``keep_io_types``), so a deployment swaps the file and nothing else.

:func:`inspect_fp16_placement` re-reads a written graph and reports where that policy does not hold;
tests and ``vitdeploy check`` call it. This module imports only onnx/numpy at import time (no torch).
"""

from __future__ import annotations

import copy
import json
import logging
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence


from vitdeploy import onnx_io
from vitdeploy.bundle import ARTIFACT_FILES, METADATA_KEY, Bundle, embed_manifest
from vitdeploy.errors import InternalError, UserError
from vitdeploy.fileio import sha256_file
from vitdeploy.lazy import require

from .onnx_types import tensor_elem_types  # noqa: F401 - part of this module's API

logger = logging.getLogger(__name__)

# Op types that always stay fp32 in a vitdeploy fp16 graph (see the module docstring for why).
# Sin/Cos: rotary angles (EVA-02, RoPE ViTs) grow with the grid; timm computes them in fp32.
ALWAYS_FP32_OPS = ("LayerNormalization", "Softmax", "Sin", "Cos")


def preprocessing_nodes(model: Any, patch_input: str | None = None) -> list[str]:
    """Names of the nodes computing the baked preprocessing: every ancestor of the patch-embedding
    Conv's data input (cast, optional flip/resize, /255, mean/std, transpose).

    ``patch_input`` is the Conv's input tensor (the manifest's ``graph.patch_embed.input``); without
    it the first Conv of the graph is taken, which in a ViT is the patch embedding.
    """
    graph = model.graph
    if patch_input is None:
        conv = next((n for n in graph.node if n.op_type == "Conv"), None)
        if conv is None:
            return []
        patch_input = conv.input[0]
    producer = {out: node for node in graph.node for out in node.output}
    graph_inputs = {v.name for v in graph.input}
    # In an fp16 graph the normalised pixels reach the Conv through the converter's Cast to fp16:
    # that Cast is the boundary, not part of the (fp32) preprocessing.
    boundary = producer.get(patch_input)
    while boundary is not None and boundary.op_type == "Cast" and any(a.name == "to" and a.i == 10 for a in boundary.attribute):
        patch_input = boundary.input[0]
        boundary = producer.get(patch_input)
    found: dict[str, Any] = {}
    stack = [patch_input]
    while stack:
        tensor = stack.pop()
        node = producer.get(tensor)
        if node is None or tensor in graph_inputs or id(node) in found:
            continue
        found[id(node)] = node
        stack.extend(i for i in node.input if i)
    names = [n.name for n in found.values()]
    if any(not name for name in names):
        raise UserError("the fp32 graph has unnamed preprocessing nodes; re-export it with `vitdeploy export`")
    return names


def convert_to_fp16(
    src: str | Path,
    dst: str | Path,
    keep_fp32_ops: Sequence[str] = (),
    manifest: dict[str, Any] | None = None,
    keep_nodes: Sequence[str] = (),
    range_feeds: list[dict[str, Any]] | None = None,
    data_max: float = float("inf"),
) -> dict[str, Any]:
    """Write the fp16 mixed-precision version of the fp32 graph ``src`` to ``dst`` (atomically).

    ``manifest``: the bundle manifest whose core is embedded (with ``graph.precision = "fp16"``);
    by default the core already in ``src``'s metadata is carried over. Returns the record that
    describes the conversion (stored with the artifact).
    """
    model, record = _convert(Path(src), tuple(keep_fp32_ops), manifest, extra_nodes=tuple(keep_nodes), range_feeds=range_feeds,
                             data_max=data_max)
    if record.get("range_pass"):
        record["range_pass"].pop("_absmax", None)  # every tensor's max |x| and the outputs: for the gate, not the record
        record["range_pass"].pop("_outputs", None)
    record.update(onnx_io.save(model, dst, manifest=manifest))  # external data past the threshold
    return record


def add_fp16_to_bundle(bundle: Bundle, keep_fp32_ops: Iterable[str] = (), data: str | None = None, eval_data: str | None = None,
                       data_max: float | None = None, log: Callable[[str], None] | None = None, threads: int | None = None,
                       gate: Any = None) -> Path:
    """Convert the bundle's fp32 graph, write ``model.fp16.onnx`` atomically and record it.

    ``keep_fp32_ops``: op types, modules (``blocks.3``), roles (``mlp-fc2``) or cells
    (``blocks.2/mlp-fc2``) kept in fp32. ``data``: range images for the range pass (default: the
    bundle's calibration split, else seeded noise); labelled ones (or ``eval_data``, default the
    bundle's own test split) also gate accuracy. ``data_max``: the range pass threshold (None: fp16
    max / 8; ``inf`` turns the pass off). The graph is gated (:mod:`.fp16_gate`) before it replaces
    anything: a graph that fails, NaN included, never lands in the bundle (CheckFailed). ``gate``: a
    vitdeploy.gate.Gate (default: `check`'s).
    """
    from .fp16_gate import gate_fp16
    from .fp16_range import DEFAULT_DATA_MAX, describe, range_feeds

    log = log or logger.info

    src = bundle.artifact_path("fp32")
    if bundle.bare_onnx is not None:
        raise UserError(f"{bundle.bare_onnx} is a bare ONNX file; the fp16 pass writes into a bundle folder (export with -o DIR)")
    limit = DEFAULT_DATA_MAX if data_max is None else float(data_max)
    if not limit > 0:
        raise UserError(f"--data-max must be positive (inf turns the range pass off), got {data_max}")
    dst = bundle.root / ARTIFACT_FILES["fp16"]
    feeds = images = None
    if limit != float("inf"):
        feeds, images = range_feeds(bundle, data)
    model, record = _convert(src, tuple(keep_fp32_ops), bundle.manifest, range_feeds=feeds, data_max=limit, threads=threads)
    measured = None
    if record.get("range_pass") is not None:
        record["range_pass"]["images"] = images
        # max |x| of every fp32 tensor and the fp32 outputs on the range images: the gate reuses both
        measured = {"absmax": record["range_pass"].pop("_absmax"), "outputs": record["range_pass"].pop("_outputs"), "images": images}
        log(describe(record["range_pass"]))
    # graph, data file and the manifest's record land together, after the gates below
    with onnx_io.staged(dst, then=lambda: bundle.add_artifact("fp16", dst, record)) as tmp:
        record.update(onnx_io.save(model, tmp, manifest=bundle.manifest))
        del model  # on disk now: the sanity and gate sessions below run from the files
        if bundle.variable_size:
            from .variable_precision import gate_sanity, variable_sanity

            record["sanity"] = variable_sanity(src, tmp, bundle)
            gate_sanity(record["sanity"], "fp16", gate)
        # labelled range data gates accuracy too; the digits training split is gated on its test split
        labelled = eval_data or ("digits:test" if data == "digits:train" else data if data is not None and _labelled(data) else None)
        record["gate"] = gate_fp16(src, tmp, bundle, labelled, threads, gate, measured=measured, log=log)
        if not bundle.variable_size:
            record["sanity"] = record["gate"].pop("sanity")  # from the gate's own seeded runs
    return dst


def _labelled(spec: str) -> bool:
    """Can ``spec`` give labels (digits splits, .npz with labels, DIR/<class>/...)? .npy cannot."""
    return not str(spec).endswith(".npy")


def _convert(src: Path, keep_fp32_ops: tuple[str, ...], manifest: dict[str, Any] | None, extra_nodes: tuple[str, ...] = (),
             range_feeds: list[dict[str, Any]] | None = None, data_max: float = float("inf"),
             threads: int | None = None) -> tuple[Any, dict[str, Any]]:
    float16 = require("onnxconverter_common.float16", "the fp16 pass")
    if not src.is_file():
        raise UserError(f"no fp32 graph at {src}; create it with `vitdeploy export`")
    model = onnx_io.load(src)
    if _has_float16(model):
        raise UserError(f"{src} already holds float16 tensors; the fp16 pass starts from the fp32 graph (model.onnx)")

    present = sorted({n.op_type for n in model.graph.node})
    items = [op.strip() for op in keep_fp32_ops if op.strip()]
    core = manifest if manifest is not None else _embedded_core(model)
    from .fp16_keep import precision_counts, resolve_keep

    user_ops, user_nodes = resolve_keep(model, (core or {}).get("graph") or {}, items)
    patch = ((core or {}).get("graph") or {}).get("patch_embed") or {}
    pre_nodes = preprocessing_nodes(model, patch.get("input"))
    # position machinery (exporters/position_nodes.py): the in-graph table/bias/sin-cos computation
    # and the rotary multiplies stay fp32, as timm computes them under autocast
    from .position_nodes import fp32_position_nodes

    position_nodes = [n for n in fp32_position_nodes(model) if n not in set(pre_nodes)]
    # variable-size graphs: everything computed from valid_hw before it meets the image (masks, the
    # -30000 key bias, per-sample interpolation matrices and tables, masked-mean weights), the joins
    # and the masked sums stay fp32 (exporters/mask_path.py: found by value flow, not names)
    from .mask_path import find_mask_path

    mask = find_mask_path(model)
    taken = set(pre_nodes) | set(position_nodes)
    mask_nodes = [n for n in dict.fromkeys(mask.fp32_nodes) if n not in taken] if mask is not None else []
    block_ops = sorted(set(float16.DEFAULT_OP_BLOCK_LIST) | set(ALWAYS_FP32_OPS) | set(user_ops))
    taken |= set(mask_nodes)
    named = [n for n in dict.fromkeys([m for names in user_nodes.values() for m in names] + list(extra_nodes)) if n not in taken]
    taken |= set(named)
    range_record = None
    range_nodes: list[str] = []
    if range_feeds is not None:
        # the numbers decide too: what overflows fp16 on the range images stays fp32 (exporters/fp16_range.py)
        from .fp16_range import overflow_nodes

        already = taken | {n.name for n in model.graph.node if n.op_type in block_ops}
        range_record = overflow_nodes(model, range_feeds, data_max, already, threads)
        range_nodes = range_record["nodes"]
    source_sha = sha256_file(src)
    _prepare_initializers(model, taken | set(range_nodes), set(block_ops))

    # the converter's own shape inference serialises the whole model (4x its memory; impossible past
    # 2 GiB): infer on a weightless copy instead, which gives the converter the same value_info
    onnx_io.infer_shapes(model, in_place=True)
    with warnings.catch_warnings(record=True) as caught:
        # the converter warns once per weight value it clamps to fp16's range; count them instead
        warnings.simplefilter("always")
        converted = float16.convert_float_to_float16(
            model,
            keep_io_types=True,  # uint8 in, fp32 logits/probs out: the bundle's contract does not change
            op_block_list=block_ops,
            node_block_list=pre_nodes + position_nodes + mask_nodes + named + range_nodes,
            disable_shape_infer=True,
        )
    del model
    clamped = sum(1 for w in caught if "truncated" in str(w.message))
    _drop_fp16_casts_on_outputs(converted)
    _drop_fp16_round_trips(converted)
    converted = _refresh_value_info(converted)
    if core is not None:
        fp16_core = copy.deepcopy(core)
        fp16_core.setdefault("graph", {})["precision"] = "fp16"
        fp16_core["graph"]["fp16"] = {"kept_fp32_op_types": sorted(set(ALWAYS_FP32_OPS) | set(user_ops)),
                                      "kept_fp32_modules": sorted(user_nodes), "range_pass_nodes_fp32": len(range_nodes)}
        embed_manifest(converted, fp16_core)
    placement = inspect_fp16_placement(converted, extra_fp32_ops=user_ops, preprocessing=pre_nodes)
    if placement["violations"]:
        # The converter did not honour the block list: a bug to report, not a graph to ship.
        raise InternalError("fp16 conversion broke the precision policy: " + "; ".join(placement["violations"][:5]))
    record = {
        "precision": "fp16",
        "converter": "onnxconverter-common float16.convert_float_to_float16",
        "converter_version": require("onnxconverter_common").__version__,
        "keep_io_types": True,
        "kept_fp32_op_types": sorted(set(ALWAYS_FP32_OPS) | set(user_ops)),
        "user_kept_fp32_op_types": user_ops,
        # --keep-fp32 modules / roles / cells and the nodes they name (debug-precision's recipes)
        "user_kept_fp32_modules": {item: len(names) for item, names in user_nodes.items()},
        "keep_fp32": items,
        "range_pass": range_record,
        "converter_default_block_list_in_graph": sorted(set(float16.DEFAULT_OP_BLOCK_LIST) & set(present)),
        "preprocessing_nodes_fp32": len(pre_nodes),
        "position_nodes_fp32": len(position_nodes),
        **({"mask_path": {**mask.summary(), "nodes_fp32": len(mask_nodes)}} if mask is not None else {}),
        "weights_clamped_to_fp16_range": clamped,
        "placement": {k: v for k, v in placement.items() if k != "violations"},
        "nodes": precision_counts(converted),
        "from_fp32_sha256": source_sha,
    }
    return converted, record


# -- inspection ------------------------------------------------------------------------------
def inspect_fp16_placement(
    model: Any,
    extra_fp32_ops: Sequence[str] = (),
    preprocessing: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Check the fp16 policy on a graph (ModelProto or path). Returns counts and ``violations``:

    * every LayerNormalization and Softmax (and each ``extra_fp32_ops`` type) reads and writes fp32;
    * the input keeps its dtype (uint8) and ``logits``/``probs`` stay fp32;
    * the preprocessing nodes compute in fp32;
    * the linear layers really are fp16 (at least one MatMul/Gemm/Conv reads fp16 weights).
    """
    onnx = require("onnx", "inspecting ONNX graphs")
    if isinstance(model, (str, Path)):
        model = onnx.load(str(model))
    types = tensor_elem_types(model)
    fp32, fp16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16
    name = onnx.TensorProto.DataType.Name
    violations: list[str] = []
    kept = set(ALWAYS_FP32_OPS) | set(extra_fp32_ops)
    counts = {op: 0 for op in sorted(kept)}

    def float_tensors(node: Any) -> list[tuple[str, int]]:
        return [(t, types[t]) for t in list(node.input) + list(node.output) if t and types.get(t) in (fp32, fp16)]

    for node in model.graph.node:
        if node.op_type in kept:
            counts[node.op_type] += 1
            wrong = [t for t, ty in float_tensors(node) if ty != fp32]
            if wrong:
                violations.append(f"{node.op_type} {node.name} has fp16 tensors {wrong[:3]}")
    pre = set(preprocessing if preprocessing is not None else preprocessing_nodes(model))
    for node in model.graph.node:
        if node.name in pre:
            wrong = [t for t, ty in float_tensors(node) if ty != fp32]
            if wrong:
                violations.append(f"preprocessing node {node.name} ({node.op_type}) computes in fp16")
    # variable-size graphs: the valid_hw mask path, its joins and masked sums, re-found in this graph
    from .mask_path import find_mask_path

    mask = find_mask_path(model)
    kept_mask = set(mask.fp32_nodes) if mask is not None else set()
    for node in model.graph.node:
        if node.name in kept_mask:
            wrong = [t for t, ty in float_tensors(node) if ty != fp32]
            if wrong:
                violations.append(f"valid_hw mask-path node {node.name} ({node.op_type}) computes in fp16 ({wrong[0]})")
    for out in model.graph.output:
        if out.type.tensor_type.elem_type != fp32:
            violations.append(f"output {out.name} is {name(out.type.tensor_type.elem_type)}, expected FLOAT")
    for inp in model.graph.input:
        if inp.type.tensor_type.elem_type == fp16:
            violations.append(f"input {inp.name} became FLOAT16; the input contract must not change")
    initializers = {i.name for i in model.graph.initializer}
    linear = [n for n in model.graph.node if n.op_type in ("MatMul", "Gemm", "Conv")]
    fp16_linear = [n for n in linear if any(types.get(t) == fp16 for t in n.input[1:2])]
    const_linear = [n for n in linear if len(n.input) > 1 and n.input[1] in initializers]
    if const_linear and not fp16_linear:
        violations.append("no MatMul/Gemm/Conv computes in fp16: the graph is not an fp16 graph")
    return {
        "fp32_op_counts": counts,
        "preprocessing_nodes": len(pre),
        "linear_ops": len(linear),
        "linear_ops_fp16": len(fp16_linear),
        **({"mask_path": mask.summary()} if mask is not None else {}),
        "violations": violations,
    }


def _prepare_initializers(model: Any, kept_nodes: set[str], block_ops: set[str]) -> int:
    """Make onnxconverter-common keep the initializers that fp32 nodes read in fp32.

    * value_info entries naming initializers are dropped (the initializer carries its type; the
      dynamo exporter writes them for un-simplified graphs such as the variable-size one): with one,
      the converter marks the tensor fp16, casts it back in front of each blocked reader and then
      rounds the initializer itself to fp16 - the normalisation mean, the patch size;
    * a float initializer read by fp32-kept nodes and by fp16 nodes is split, the kept readers get
      their own fp32 copy: the converter otherwise leaves it fp32 and hands the fp16 readers an fp32
      tensor (a type error ORT refuses). In a variable-size graph the position table is one: the
      fp32 per-sample resampling MatMuls and the fp16 prefix rows read it.

    Returns how many initializers were split.
    """
    onnx = require("onnx")
    graph = model.graph
    initializer_names = {i.name for i in graph.initializer}
    stale = [v for v in graph.value_info if v.name in initializer_names]
    for value in stale:
        graph.value_info.remove(value)
    floats = {i.name: i for i in graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
    names = {i.name for i in graph.initializer}
    readers: dict[str, list[tuple[Any, int]]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name in floats:
                readers.setdefault(name, []).append((node, index))
    split = 0
    for name, uses in readers.items():
        kept = [(node, index) for node, index in uses if node.name in kept_nodes or node.op_type in block_ops]
        if not kept or len(kept) == len(uses):
            continue
        copy_name = f"{name}_fp32"
        while copy_name in names:
            copy_name += "_"
        names.add(copy_name)
        copy = onnx.TensorProto()
        copy.CopyFrom(floats[name])
        copy.name = copy_name
        graph.initializer.append(copy)
        for node, index in kept:
            node.input[index] = copy_name
        split += 1
    return split


def _drop_fp16_casts_on_outputs(model: Any) -> None:
    """Undo the converter's Cast-to-fp16 behind a blocked node that produces a graph output.

    onnxconverter-common 1.16 (keep_io_types=True) still appends ``Cast(to=FLOAT16)`` after a
    blocked op whose output is a graph output - here the fp32 Softmax producing ``probs`` - and
    declares that output fp16. The contract says fp32 outputs: rewire the fp32 value to the output.
    """
    onnx = require("onnx")
    graph = model.graph
    fp16 = onnx.TensorProto.FLOAT16
    producer = {out: node for node in graph.node for out in node.output}
    for output in graph.output:
        cast = producer.get(output.name)
        if cast is None or cast.op_type != "Cast" or not any(a.name == "to" and a.i == fp16 for a in cast.attribute):
            continue
        source = cast.input[0]
        upstream = producer.get(source)
        if upstream is None:
            continue
        # the fp32 value takes the output's name; every other reader of it follows
        for node in graph.node:
            for i, name in enumerate(node.input):
                if name == source:
                    node.input[i] = output.name
        for i, name in enumerate(upstream.output):
            if name == source:
                upstream.output[i] = output.name
        graph.node.remove(cast)
        output.type.tensor_type.elem_type = onnx.TensorProto.FLOAT


def _drop_fp16_round_trips(model: Any) -> int:
    """Cast(to fp16) -> Cast(to fp32) becomes one Cast(to fp32) of the original tensor.

    The converter wraps every blocked node in casts and removes a pair only where the fp16 cast has
    one reader; a tensor read by several blocked nodes (a variable-size graph's masks and position
    coordinates) kept its round trip, i.e. fp32 values rounded to fp16 and back between two fp32
    nodes. Returns how many round trips were cut.
    """
    onnx = require("onnx")
    graph = model.graph
    fp16, fp32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT

    def cast_to(node: Any) -> int | None:
        return next((a.i for a in node.attribute if a.name == "to"), None) if node.op_type == "Cast" else None

    producer = {out: node for node in graph.node for out in node.output}
    cut = 0
    for node in graph.node:
        up = producer.get(node.input[0]) if cast_to(node) == fp32 else None
        if up is not None and cast_to(up) == fp16:
            node.input[0] = up.input[0]
            cut += 1
    read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    for node in [n for n in graph.node if cast_to(n) == fp16 and n.output[0] not in read]:
        graph.node.remove(node)  # a round trip's fp16 half nothing reads any more
    return cut


def _refresh_value_info(model: Any) -> Any:
    """Recompute value_info from the nodes. The converter leaves two entries (fp32 and fp16) for a
    tensor renamed around a blocked node, and ORT then refuses the graph on the stale one."""
    del model.graph.value_info[:]
    return onnx_io.infer_shapes(model, in_place=True, strict_mode=False)


def _has_float16(model: Any) -> bool:
    onnx = require("onnx")
    return any(init.data_type == onnx.TensorProto.FLOAT16 for init in model.graph.initializer)


def _embedded_core(model: Any) -> dict[str, Any] | None:
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            return json.loads(prop.value)
    return None
