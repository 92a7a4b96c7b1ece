"""The CPU graph pass: ``model.cpu.onnx``, ORT's fused attention, derived from the bundle's plain fp32 graph.

The bundle's ``model.onnx`` stays plain ONNX (TensorRT parses it; its own fusions do the rest). On a
CPU, ONNX Runtime's own session-time fusions already turn the plain graph's LayerNorm + residual
Add into SkipLayerNormalization and MatMul + bias + Gelu into BiasGelu/FastGelu-free kernels, but not
the attention: ORT's attention fusion (session-time ``AttentionFusion`` and the transformer
optimizer's ``FusionAttention``) matches BERT's three separate Q/K/V MatMuls, while the dynamo
exporter writes a ViT's attention as

    LN -> MatMul(x, W_qkv) -> Add(b_qkv) -> Reshape[B, L, 3, h, d_h] -> Transpose(2, 0, 3, 1, 4)
       -> Slice/Squeeze x3 (q, k, v) -> q * scale (or q * sqrt(scale), k * sqrt(scale) for SDPA)
       -> MatMul(q, k^T) -> Softmax -> MatMul(., v) -> Transpose(0, 2, 1, 3) -> Reshape[B, L, D]

(one packed QKV projection, the head split as slices), which matches none of ORT's patterns. This
module matches exactly that subgraph and replaces it with ONNX Runtime's ``com.microsoft.Attention``
(packed QKV weights [D, 3D] in (q, k, v) x head order, which is how W_qkv's columns are already laid
out), carrying the exporter's scale. The result is then gated against the plain graph like any
other derived precision (vitdeploy.compare: max |d|, per-image cosine, top-1 agreement) and written
atomically into the bundle with its record in the manifest.

Only ONNX and onnxruntime are needed (no torch; imported when a graph is fused): ``vitdeploy convert BUNDLE --target cpu``.
The runtime side (which file a CPU session opens: ``cpu_graph_for``) is ``vitdeploy.runtime.fused``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from vitdeploy import onnx_io
from vitdeploy.bundle import Bundle, embed_manifest
from vitdeploy.errors import CheckFailed, UserError
from vitdeploy.runtime.fused import CPU_FILE, CPU_KEY

logger = logging.getLogger(__name__)

MS_DOMAIN = "com.microsoft"
# Gates of the fused graph against the plain one: the same fp32 maths in another order of sums.
MAX_ABS_LIMIT = 1e-4
COSINE_MIN = 0.99999


# -- graph access -------------------------------------------------------------------------------
class _Graph:
    def __init__(self, model: Any):
        from onnx import numpy_helper

        self.model = model
        self.graph = model.graph
        self.producer = {o: n for n in self.graph.node for o in n.output}
        self.consumers: dict[str, list[Any]] = {}
        for n in self.graph.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.outputs = {o.name for o in self.graph.output}
        self.constants: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in self.graph.initializer}
        for n in self.graph.node:
            if n.op_type == "Constant":
                for a in n.attribute:
                    if a.name == "value":
                        self.constants[n.output[0]] = numpy_helper.to_array(a.t)

    def parent(self, node: Any, index: int, op_type: str) -> Any | None:
        if index >= len(node.input):
            return None
        p = self.producer.get(node.input[index])
        return p if p is not None and p.op_type == op_type else None

    def const(self, name: str) -> np.ndarray | None:
        if name in self.constants:
            return self.constants[name]
        p = self.producer.get(name)
        if p is not None and p.op_type == "Sqrt":  # SDPA's sqrt(scale), applied to q and to k
            inner = self.const(p.input[0])
            return None if inner is None else np.sqrt(inner)
        return None



def _attr(node: Any, name: str, default: Any = None) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


@dataclass
class _Match:
    nodes: list[Any]  # to remove
    x: str  # the attention's input [B, L, D] (the LayerNorm output)
    weight: np.ndarray  # [D, 3D]
    bias: np.ndarray  # [3D]
    heads: int
    scale: float
    output: str  # the tensor [B, L, D] the projection MatMul reads


def _scaled(g: _Graph, tensor_node: Any) -> tuple[Any, float] | None:
    """(node under an optional constant Mul, the Mul's scale)."""
    if tensor_node is not None and tensor_node.op_type == "Mul":
        for i in (0, 1):
            c = g.const(tensor_node.input[1 - i])
            p = g.producer.get(tensor_node.input[i])
            if c is not None and c.size == 1 and p is not None:
                return p, float(c.reshape(()))
        return None
    return tensor_node, 1.0


def _head(g: _Graph, node: Any) -> tuple[int, Any] | None:
    """Squeeze(Slice(T, start, start+1, axis 0)) -> (start, T) for one of q, k, v."""
    if node is None or node.op_type not in ("Squeeze", "Gather"):
        return None
    if node.op_type == "Gather":
        idx = g.const(node.input[1])
        if idx is None or idx.size != 1 or _attr(node, "axis", 0) != 0:
            return None
        src = g.producer.get(node.input[0])
        return (int(idx.reshape(())), [node], src) if src is not None else None  # type: ignore[return-value]
    sl = g.parent(node, 0, "Slice")
    if sl is None or len(sl.input) < 3:
        return None
    starts, ends = g.const(sl.input[1]), g.const(sl.input[2])
    axes = g.const(sl.input[3]) if len(sl.input) > 3 and sl.input[3] else np.zeros(1, np.int64)
    if starts is None or ends is None or axes is None or starts.size != 1 or int(axes.reshape(-1)[0]) != 0:
        return None
    start = int(starts.reshape(-1)[0])
    if int(ends.reshape(-1)[0]) != start + 1:
        return None
    src = g.producer.get(sl.input[0])
    return (start, [node, sl], src) if src is not None else None  # type: ignore[return-value]


def _match(g: _Graph, softmax: Any, num_heads: int, embed_dim: int) -> _Match | None:
    qk = g.parent(softmax, 0, "MatMul")
    av_list = g.consumers.get(softmax.output[0], [])
    if qk is None or len(av_list) != 1 or av_list[0].op_type != "MatMul" or av_list[0].input[0] != softmax.output[0]:
        return None
    av = av_list[0]
    q_scaled = _scaled(g, g.producer.get(qk.input[0]))
    k_path = _k_transposed(g, g.producer.get(qk.input[1]))
    if q_scaled is None or k_path is None:
        return None
    k_nodes, k_head, k_scale = k_path
    k_scaled = (k_head, k_scale)
    heads = {}
    for role, node in (("q", q_scaled[0]), ("k", k_scaled[0]), ("v", g.producer.get(av.input[1]))):
        found = _head(g, node)
        if found is None:
            return None
        heads[role] = found
    sources = {id(h[2]) for h in heads.values()}
    if len(sources) != 1 or sorted(h[0] for h in heads.values()) != [0, 1, 2] or [heads[r][0] for r in "qkv"] != [0, 1, 2]:
        return None
    split_t = heads["q"][2]
    if split_t.op_type != "Transpose" or list(_attr(split_t, "perm", [])) != [2, 0, 3, 1, 4]:
        return None
    reshape_in = g.parent(split_t, 0, "Reshape")
    if reshape_in is None:
        return None
    shape_in = g.const(reshape_in.input[1])  # [B, L, 3, h, d_h]; computed from Shape in dynamic graphs
    if shape_in is not None and (len(shape_in) != 5 or int(shape_in[2]) != 3 or int(shape_in[3]) != num_heads):
        return None
    hidden = embed_dim
    add_b = g.parent(reshape_in, 0, "Add")
    if add_b is not None:
        bias_i = 1 if g.const(add_b.input[1]) is not None else 0
        bias = g.const(add_b.input[bias_i])
        mm = g.parent(add_b, 1 - bias_i, "MatMul")
    else:  # a zero bias the simplifier folded away (random-init models), or a bias-free projection
        bias, mm = np.zeros(3 * hidden, np.float32), g.parent(reshape_in, 0, "MatMul")
    weight = g.const(mm.input[1]) if mm is not None else None
    if weight is None or bias is None or weight.shape != (hidden, 3 * hidden) or bias.shape != (3 * hidden,):
        return None
    out_t_list = g.consumers.get(av.output[0], [])
    if len(out_t_list) != 1 or out_t_list[0].op_type != "Transpose" or list(_attr(out_t_list[0], "perm", [])) != [0, 2, 1, 3]:
        return None
    out_t = out_t_list[0]
    out_r_list = g.consumers.get(out_t.output[0], [])
    if len(out_r_list) != 1 or out_r_list[0].op_type != "Reshape":
        return None
    out_r = out_r_list[0]
    shape_out = g.const(out_r.input[1])
    if shape_out is not None and (len(shape_out) != 3 or int(shape_out[2]) not in (hidden, -1)):
        return None
    nodes = [n for n in (mm, add_b) if n is not None]
    nodes += [reshape_in, split_t, *heads["q"][1], *heads["k"][1], *heads["v"][1], *k_nodes, qk, softmax, av, out_t, out_r]
    q_mul = g.producer.get(qk.input[0])
    nodes += [q_mul] if q_mul is not None and q_mul.op_type == "Mul" else []
    if any(o in g.outputs for n in nodes if n is not out_r for o in n.output):
        return None  # an intermediate tensor is a graph output (a tap): leave this block alone
    return _Match(nodes, mm.input[0], weight.astype(np.float32), bias.astype(np.float32), num_heads,
                  q_scaled[1] * k_scaled[1], out_r.output[0])


def _k_transposed(g: _Graph, node: Any) -> tuple[list[Any], Any, float] | None:
    """K^T as the exporter writes it: ([nodes], the k head node, k's scale). Two forms:
    Transpose(0, 1, 3, 2) of (k [* c]); or, from SDPA, Reshape(Transpose(0, 2, 1) of Reshape(k, [-1, L, d_h])) * c."""
    if node is None:
        return None
    scale, nodes = 1.0, []
    if node.op_type == "Mul":
        scaled = _scaled(g, node)
        if scaled is None:
            return None
        nodes.append(node)
        node, scale = scaled
    if node.op_type == "Transpose" and list(_attr(node, "perm", [])) == [0, 1, 3, 2]:
        inner = g.producer.get(node.input[0])
        nodes.append(node)
        if inner is not None and inner.op_type == "Mul":
            scaled = _scaled(g, inner)
            if scaled is None:
                return None
            nodes.append(inner)
            inner, s2 = scaled
            scale *= s2
        return (nodes, inner, scale) if inner is not None else None
    if node.op_type == "Reshape":
        t = g.parent(node, 0, "Transpose")
        r = g.parent(t, 0, "Reshape") if t is not None else None
        if t is None or r is None or list(_attr(t, "perm", [])) != [0, 2, 1]:
            return None
        head = g.producer.get(r.input[0])
        return (nodes + [node, t, r], head, scale) if head is not None else None
    return None


def fuse_attention(model: Any, num_heads: int, embed_dim: int) -> int:
    """Replace every matched ViT attention subgraph of ``model`` (in place) by com.microsoft.Attention.

    ``num_heads`` and ``embed_dim`` come from the bundle's spec: a dynamic graph computes its head
    split's shape at run time, so the graph alone does not say it."""
    from onnx import helper, numpy_helper

    g = _Graph(model)
    matches = [m for m in (_match(g, n, num_heads, embed_dim) for n in list(model.graph.node) if n.op_type == "Softmax") if m is not None]
    if not matches:
        return 0
    drop = set()
    new_nodes: dict[int, Any] = {}  # placed where the projection MatMul was, keeping topological order
    for index, m in enumerate(matches):
        w_name, b_name = f"vitdeploy_attn{index}_qkv_weight", f"vitdeploy_attn{index}_qkv_bias"
        model.graph.initializer.extend([numpy_helper.from_array(m.weight, w_name), numpy_helper.from_array(m.bias, b_name)])
        node = helper.make_node("Attention", [m.x, w_name, b_name], [m.output], name=f"vitdeploy_attention_{index}",
                                domain=MS_DOMAIN, num_heads=m.heads, scale=float(m.scale))
        new_nodes[id(m.nodes[-1])] = node
        drop.update(id(n) for n in m.nodes)
    kept = []
    for n in model.graph.node:
        if id(n) in new_nodes:
            kept.append(new_nodes[id(n)])
        elif id(n) not in drop:
            kept.append(n)
    kept = _live(kept, {o.name for o in model.graph.output})
    available = {t.name for t in model.graph.initializer} | {i.name for i in model.graph.input} | {o for n in kept for o in n.output}
    dangling = sorted({i for n in kept for i in n.input if i and i not in available})
    if dangling:  # a matched tensor is still read by a node that stays: refuse rather than guess
        raise UserError(f"attention fusion would leave {dangling[0]} without a producer; the plain graph stays what ONNX Runtime runs")
    del model.graph.node[:]
    model.graph.node.extend(kept)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    _drop_unused_initializers(model)
    return len(matches)


def _live(nodes: list[Any], outputs: set[str]) -> list[Any]:
    """Nodes whose results reach a graph output (the shape arithmetic of removed blocks goes)."""
    needed = set(outputs)
    live = []
    for n in reversed(nodes):
        if any(o in needed for o in n.output):
            live.append(n)
            needed.update(i for i in n.input if i)
    return live[::-1]


def _drop_unused_initializers(model: Any) -> None:
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    keep = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)


# -- the bundle's CPU graph ---------------------------------------------------------------------
def build_cpu_graph(source: Path, spec: Any) -> tuple[Any, dict[str, Any]]:
    """The fused ModelProto from the plain fp32 graph file, and what was fused."""
    model = onnx_io.load(source)
    before = Counter(n.op_type for n in model.graph.node)
    fused = fuse_attention(model, spec.num_heads, spec.embed_dim)
    after = Counter(n.op_type for n in model.graph.node)
    record = {"attention_fused": fused, "blocks": spec.depth, "nodes_before": sum(before.values()), "nodes_after": sum(after.values()),
              "ops_after": dict(sorted(after.items()))}
    return model, record


def gate_cpu_graph(bundle: Bundle, fused: Path | bytes, images_per_size: int = 4, threads: int | None = None) -> dict[str, Any]:
    """The fused graph against the plain one on seeded images at every verification size (and the
    bundled model's real test split where there is one), on every output."""
    from vitdeploy.evalsets import real_set, verification_sizes
    from vitdeploy.data import default_data
    from vitdeploy.compare import Criterion, compare_outputs, parity_gates
    from vitdeploy.preprocess import random_images
    from vitdeploy.runtime.ort import OrtRunner

    plain = OrtRunner(bundle.artifact_path("fp32"), threads=threads, providers=["CPUExecutionProvider"])
    fused = OrtRunner(fused, threads=threads, providers=["CPUExecutionProvider"])
    sets = [(f"random {h}x{w}", random_images(images_per_size, h, w, seed=i)) for i, (h, w) in enumerate(_sizes(bundle, verification_sizes))]
    data = default_data(bundle)
    if data:
        sets.append((data, real_set(bundle, data, limit=256).images))
    gates, rows = [], []
    names = [n for n in plain.outputs() if n in fused.outputs()]
    if names != plain.outputs():
        raise CheckFailed(f"the fused graph lost outputs: {sorted(set(plain.outputs()) - set(names))}")
    for name, images in sets:
        ref = plain.infer_batched(images, 16, tuple(names))
        got = fused.infer_batched(images, 16, tuple(names))
        for out in names:
            r, c = ref[out], got[out]
            stats = compare_outputs(out, r.reshape(len(r), -1), c.reshape(len(c), -1))
            rows.append({"set": name, **stats.to_dict()})
            gates.extend(parity_gates(f" {out}", stats, MAX_ABS_LIMIT, f" on {name}"))
            gates.append(Criterion(f"worst cosine {out} on {name}", stats.cosine_min, COSINE_MIN, ">="))
            if out == "logits":
                gates.append(Criterion(f"top-1 agreement on {name}", stats.top1_agreement, 1.0, ">="))
    plain.close()
    fused.close()
    failed = [g.describe() for g in gates if not g.passed]
    return {"against": "fp32", "sets": rows, "gates": [g.to_dict() for g in gates], "failed_gates": failed, "passed": not failed}


def _sizes(bundle: Bundle, verification_sizes: Callable[[Bundle], list[tuple[int, int]]]) -> list[tuple[int, int]]:
    pre = bundle.preprocessing
    if pre.get("in_graph_resize"):
        to = pre["in_graph_resize"]["to"]
        return [(to[0] * 3 // 2, to[1] * 5 // 4)]
    return verification_sizes(bundle)


def add_cpu_graph_to_bundle(bundle: Bundle, log: Callable[[str], None] = logger.info, threads: int | None = None) -> Path:
    """Write ``model.cpu.onnx`` (fused for ONNX Runtime on CPUs) beside the plain graph, gated and recorded."""
    if bundle.bare_onnx is not None:
        raise UserError(f"{bundle.bare_onnx} is a bare ONNX file; the CPU graph is written into a bundle folder (export with -o DIR)")
    source = bundle.artifact_path("fp32")
    if len(bundle.graph.inputs or []) > 1:
        raise UserError("the CPU graph is made from single-input graphs; this bundle's graph takes several inputs (--variable-size)")
    t0 = time.perf_counter()
    model, record = build_cpu_graph(source, bundle.spec)
    if record["attention_fused"] == 0:
        raise UserError(f"no attention block of {source.name} matches the ViT pattern the CPU fusion knows "
                        "(packed QKV MatMul, head split, Softmax); the plain graph is what ONNX Runtime runs")
    manifest = bundle.manifest
    manifest_core = dict(manifest)
    manifest_core["graph"] = {**manifest.get("graph", {}), "variant": "cpu-fused", "derived_from": bundle.artifact_sha256("fp32")}
    embed_manifest(model, manifest_core)
    log(f"fused {record['attention_fused']} of {record['blocks']} attention blocks into com.microsoft.Attention "
        f"({record['nodes_before']} -> {record['nodes_after']} nodes)")
    target = bundle.root / CPU_FILE
    # written beside the bundle first (with external data past the threshold: no bytes form past 2 GiB)
    # and gated from that file; graph and data file land together only when the gate passes
    entry: dict[str, Any] = {"target": "cpu", "derived_from": bundle.artifact_sha256("fp32"), "fusion": record}
    with onnx_io.staged(target, then=lambda: bundle.add_artifact(CPU_KEY, target, entry)) as staged:  # with its manifest record
        entry.update(onnx_io.save(model, staged, manifest=manifest))
        del model
        gate = gate_cpu_graph(bundle, staged, threads=threads)
        if not gate["passed"]:
            raise CheckFailed(f"the fused CPU graph does not match the plain graph: {'; '.join(gate['failed_gates'][:3])} (not written)")
        entry.update({"gate": gate, "seconds": round(time.perf_counter() - t0, 2)})
    log("gated against model.onnx on every output: passed")
    return target
