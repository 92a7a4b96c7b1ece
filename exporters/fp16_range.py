"""The fp16 range pass: which nodes must stay fp32 because their values do not fit fp16.

fp16 holds magnitudes up to 65504. Real ViTs' residual streams can carry "massive activations"
far above the typical scale (Sun et al., arXiv:2402.17762; Darcet et al., arXiv:2309.16588), and
LayerNorm then normalises them away, so a graph whose LayerNorms are fp32 still overflows in the
Adds and linear layers that write the stream: inf, then NaN after the next LayerNorm.

The pass runs the fp32 graph on range images (calibration data, else the bundle's own split, else
seeded noise, which the record says) and reads max |x| of every float tensor. A node stays fp32
when one of its float outputs, or a float input it would read as fp16, exceeds ``data_max`` (by
default fp16's max / 8: headroom for inputs the range images did not show), or when it reads a
weight beyond fp16's range (the converter would clamp it). This is ModelOpt AutoCast's rule for
node data and initializers (``data_max`` / ``init_max``, nvidia.github.io/Model-Optimizer
guides/8_autocast; its data_max default is 512), with a threshold tied to fp16 itself. The nodes,
their max |x| and the reason are returned for the record and printed by the commands.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from vitdeploy.bundle import Bundle
from vitdeploy.errors import MissingDependencyError
from vitdeploy.lazy import require

FP16_MAX = 65504.0
DEFAULT_HEADROOM = 8.0
DEFAULT_DATA_MAX = FP16_MAX / DEFAULT_HEADROOM
# Image counts asked for; the cost-model budget that export's verification and `check` use
# (vitdeploy/budget.py) cuts them for large models and sizes (a ViT-S/14 at 518x518: 4 images), so
# the pass costs what a verification costs, whatever the model.
RANGE_IMAGES = 64
NOISE_IMAGES = 16  # seeded noise (no data): one distribution, fewer images say as much
NOISE_SEED = 0


def image_budget(bundle: Any, requested: int) -> Any:
    """The budget's plan (images, batch, GMAC per image) for ``requested`` images at the graph's input size."""
    from vitdeploy.budget import plan_verification

    return plan_verification(bundle.spec, [input_size(bundle)], requested)[0]


def budget_record(plan: Any, requested: int) -> dict[str, Any]:
    from vitdeploy.budget import DEFAULT_BUDGET_GMACS

    return {"requested": requested, "images": plan.images, "batch": plan.batch, "gmacs_per_image": plan.gmacs_per_image,
            "budget_gmacs": DEFAULT_BUDGET_GMACS}


def range_feeds(bundle: Any, spec: str | None, count: int = RANGE_IMAGES) -> tuple[list[dict[str, np.ndarray]], dict[str, Any]]:
    """Batches of range images as graph feeds, and what they were. ``spec`` (a calibration data spec)
    is used when given; else the bundle's calibration default (the digits model's training split);
    else seeded uint8 noise at the input size (recorded as such: real images may reach further).
    ``count`` images are asked for; the cost-model budget decides how many are run, and the batch."""
    from vitdeploy.calibration.sources import default_source, open_source

    name = None if spec == "__noise__" else (spec or default_source(bundle))
    asked = count
    plan = image_budget(bundle, asked)
    images = valid = None
    record: dict[str, Any]
    if name is not None:
        try:
            source = open_source(name, bundle, plan.images)
        except (ImportError, MissingDependencyError):
            if spec is not None:
                raise
            source = None  # the default split needs scikit-learn (absent on a device): fall back to noise
        if source is not None:
            images, valid = source.images, source.valid_hw
            record = {"source": name, "count": len(source), "sha256": source.sha256}
    if images is None:
        asked = min(count, NOISE_IMAGES)
        plan = image_budget(bundle, asked)
        if bundle.variable_size:
            from vitdeploy.variable import mixed_sizes, padded_batch

            contract = bundle.variable_size
            sizes = mixed_sizes(contract["canvas"], contract["round_to"], tuple(bundle.spec.image_size), plan.images, seed=NOISE_SEED)
            rng = np.random.default_rng(NOISE_SEED)
            images, valid = padded_batch([rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes], contract["canvas"], seed=NOISE_SEED + 1)
        else:
            from vitdeploy.preprocess import random_images

            images = random_images(plan.images, *input_size(bundle), seed=NOISE_SEED)
        record = {"source": "seeded uint8 noise" + (" (no range data given: pass --data for real images)" if spec != "__noise__" else ""),
                  "count": int(len(images)), "seed": NOISE_SEED}
    batch = plan.batch  # the budget's: one forward pass's working set (the run frees each tensor once reduced)
    record["budget"] = budget_record(plan, asked)
    feeds = []
    for start in range(0, len(images), batch):
        feed = {"images": images[start : start + batch]}
        if valid is not None:
            from vitdeploy.variable import VALID_INPUT

            feed[VALID_INPUT] = valid[start : start + batch]
        feeds.append(feed)
    return feeds, record


def tensor_absmax(model: Any, feeds: Iterable[dict[str, np.ndarray]], float_tensors: Sequence[str], threads: int | None = None,
                  steps: list[float] | None = None, outputs: dict[str, np.ndarray] | None = None) -> dict[str, float]:
    """max |x| of each named float tensor over every feed; inf where the max or min is inf or NaN.

    The reductions run inside the graph: a copy of it gains, right after each tensor's producer,
    ReduceMax(x) and ReduceMin(x) as scalar outputs (max |x| = max(|max|, |min|)). Fetching the
    tensors themselves copied every one of a batch out at once and took as long again in numpy (a
    ViT-S/14 at 518x518, batch 4: 10 GB, 30 s per batch in ONNX Runtime plus 27 s in numpy; issue 36).
    A NaN that no reduction shows is caught by the gate, whose outputs must be finite.
    ``steps`` receives the seconds of each feed's run; ``outputs``, when given, receives the graph's
    own outputs on the feeds (the gate's fp32 reference on the same images). A signal stops a run
    within a second (:mod:`.ort_interrupt`)."""
    onnx = require("onnx", "the fp16 range pass")
    ort = require("onnxruntime", "the fp16 range pass")
    from . import ort_interrupt
    from .onnx_types import tensor_elem_types

    helper = onnx.helper
    types = tensor_elem_types(model)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    names = list(dict.fromkeys(float_tensors))
    index = {name: i for i, name in enumerate(names)}
    peaks = [f"__absmax_max_{i}" for i in range(len(names))]
    lows = [f"__absmax_min_{i}" for i in range(len(names))]
    kept_outputs = [o.name for o in model.graph.output] if outputs is not None else []

    def reductions(name: str) -> list[Any]:
        i = index[name]
        return [helper.make_node("ReduceMax", [name], [peaks[i]], name=f"__absmax_max_node_{i}", keepdims=0),
                helper.make_node("ReduceMin", [name], [lows[i]], name=f"__absmax_min_node_{i}", keepdims=0)]

    # each tensor's reductions right after the node that makes it, so it is read and freed while the
    # run goes on (at the end of the graph they would keep every tensor alive to the last node)
    made = {o for node in probe.graph.node for o in node.output}
    nodes = [r for name in names if name not in made for r in reductions(name)]  # graph inputs, initializers
    for node in probe.graph.node:
        nodes.append(node)
        nodes.extend(r for out in node.output if out in index for r in reductions(out))
    del probe.graph.node[:]
    probe.graph.node.extend(nodes)
    for i, name in enumerate(names):
        kind = types.get(name, onnx.TensorProto.FLOAT)
        probe.graph.output.extend([helper.make_tensor_value_info(peaks[i], kind, []), helper.make_tensor_value_info(lows[i], kind, [])])
    probe.graph.output.extend(o for o in model.graph.output if o.name in kept_outputs)
    options = ort.SessionOptions()
    # no fusion: every tensor the fp16 converter sees must exist in the session as it is in the graph
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    # run the nodes in the order given (a node's reductions right after it), so each tensor is freed
    # as soon as it is reduced; the default order ran them after the whole graph (all held at once)
    options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    if threads:
        options.intra_op_num_threads = threads
    serialized = probe.SerializeToString()
    del probe
    result = {name: 0.0 for name in names}
    if not names and not kept_outputs:
        return result
    session = None
    try:
        session = ort.InferenceSession(serialized, options, providers=["CPUExecutionProvider"])
        del serialized
        _reduce_feeds(session, feeds, names, peaks + lows + kept_outputs, result, steps, outputs)
    except KeyboardInterrupt as exc:  # SIGINT, and SIGTERM (the CLI's Terminated): free the session now
        session = None
        raise ort_interrupt.release(exc) from None
    return result


def _reduce_feeds(session: Any, feeds: Iterable[dict[str, np.ndarray]], names: list[str], fetch: list[str],
                  result: dict[str, float], steps: list[float] | None, outputs: dict[str, Any] | None) -> None:
    import time

    from . import ort_interrupt

    input_names = {i.name for i in session.get_inputs()}
    count = len(names)
    kept_outputs = fetch[2 * count :]
    for feed in feeds:
        feed = {k if k in input_names else session.get_inputs()[0].name: v for k, v in feed.items()}
        started = time.perf_counter()
        values = ort_interrupt.run(session, fetch, feed)
        if steps is not None:
            steps.append(time.perf_counter() - started)
        for name, high, low in zip(names, values[:count], values[count : 2 * count]):
            if float(high) < float(low):
                continue  # an empty tensor: max -inf, min +inf (it holds no value to overflow)
            value = max(abs(float(high)), abs(float(low)))
            result[name] = max(result[name], value if np.isfinite(value) else float("inf"))
        for name, value in zip(kept_outputs, values[2 * count :]):
            outputs.setdefault(name, []).append(np.asarray(value))  # type: ignore[union-attr]
    if outputs is not None:
        for name in kept_outputs:
            outputs[name] = np.concatenate(outputs[name])


def overflow_nodes(model: Any, feeds: list[dict[str, np.ndarray]], data_max: float = DEFAULT_DATA_MAX,
                   already_fp32: set[str] = frozenset(), threads: int | None = None) -> dict[str, Any]:
    """Nodes to keep in fp32 (beyond ``already_fp32``) and why: ``{"nodes": [...], "kept": [{node,
    op_type, reason, max_abs}], "peak": {...}}``."""
    onnx = require("onnx", "the fp16 range pass")
    from onnx import numpy_helper

    from .onnx_types import tensor_elem_types

    types = tensor_elem_types(model)
    fp32 = onnx.TensorProto.FLOAT
    initializers = {i.name: i for i in model.graph.initializer}
    produced = [o for n in model.graph.node for o in n.output if o and types.get(o) == fp32]
    graph_inputs = [i.name for i in model.graph.input if types.get(i.name) == fp32]
    steps: list[float] = []
    outputs: dict[str, Any] = {}
    absmax = tensor_absmax(model, feeds, produced + graph_inputs, threads, steps, outputs) if produced else {}
    kept: list[dict[str, Any]] = []
    init_peak: dict[str, float] = {}
    for node in model.graph.node:
        if node.name in already_fp32:
            continue
        reason = None
        for out in node.output:
            if absmax.get(out, 0.0) > data_max:
                reason = ("output", out, absmax[out])
                break
        if reason is None:
            for inp in node.input:
                if inp in initializers:
                    if initializers[inp].data_type != fp32:
                        continue
                    if inp not in init_peak:
                        init_peak[inp] = float(np.abs(numpy_helper.to_array(initializers[inp])).max(initial=0.0))
                    if init_peak[inp] > FP16_MAX:
                        reason = ("weight", inp, init_peak[inp])
                        break
                elif absmax.get(inp, 0.0) > data_max:
                    reason = ("input", inp, absmax[inp])
                    break
        if reason is not None:
            kept.append({"node": node.name, "op_type": node.op_type, "reason": reason[0], "tensor": reason[1],
                         "max_abs": reason[2]})
    # the largest value among what would be fp16 (the preprocessing's 0..255 and LayerNorm inputs are fp32 anyway)
    candidates = {o: absmax[o] for n in model.graph.node if n.name not in already_fp32 for o in n.output if o in absmax}
    peak_tensor = max(candidates, key=candidates.get) if candidates else None
    return {"nodes": [k["node"] for k in kept], "kept": kept, "data_max": data_max, "init_max": FP16_MAX,
            "tensors_measured": len(absmax), "_absmax": absmax, "_outputs": outputs, "step_seconds": [round(t, 3) for t in steps], "peak": {"tensor": peak_tensor, "max_abs": candidates.get(peak_tensor, 0.0) if peak_tensor else 0.0}}


def describe(range_record: dict[str, Any], limit: int = 6) -> str:
    """One line: how many nodes the range pass kept in fp32 and the largest of them."""
    kept = range_record["kept"]
    if not kept:
        peak = range_record["peak"]
        return (f"range pass: no tensor above {range_record['data_max']:.0f} on {range_record['images']['count']} images{steps_text(range_record)} "
                f"(largest fp16 candidate {peak['tensor']}: {peak['max_abs']:.3g}); nothing extra kept in fp32")
    by_op: dict[str, int] = {}
    for k in kept:
        by_op[k["op_type"]] = by_op.get(k["op_type"], 0) + 1
    top = sorted(kept, key=lambda k: -k["max_abs"])[:limit]
    ops = ", ".join(f"{n} {op}" for op, n in sorted(by_op.items(), key=lambda item: -item[1]))
    worst = "; ".join(f"{k['node']} ({k['reason']} {k['max_abs']:.3g})" for k in top)
    return (f"range pass: kept {len(kept)} more nodes in fp32 ({ops}) whose values exceed {range_record['data_max']:.0f} "
            f"on {range_record['images']['count']} images of {range_record['images']['source']}{steps_text(range_record)}; largest: {worst}")


def steps_text(record: dict[str, Any]) -> str:
    """' (cost-model budget: 4 of 16 images; 1 step of 4, 21.3 s each)' for a log line; '' without steps."""
    steps = record.get("step_seconds") or []
    if not steps:
        return ""
    budget = (record.get("images") or {}).get("budget") or record.get("budget") or {}
    cut = f"cost-model budget: {budget['images']} of {budget['requested']} images; " if budget and budget["images"] < budget["requested"] else ""
    each = f"{sum(steps) / len(steps):.1f} s each" if len(steps) > 1 else f"{steps[0]:.1f} s"
    return f" ({cut}{len(steps)} step{'s' if len(steps) != 1 else ''}, {each})"


def input_size(bundle: Bundle) -> tuple[int, int]:
    pre = bundle.preprocessing
    size = pre.get("input_size") or pre.get("model_size") or [bundle.resolution["height"], bundle.resolution["width"]]
    if pre.get("in_graph_resize"):
        size = pre["in_graph_resize"]["to"]
    return int(size[0]), int(size[1])
