"""TensorRT layers -> the ViT's PyTorch modules, through the ONNX graph's node names; time per block.

A layer names its ONNX nodes (``layers.nodes_in_name``, or ``Metadata`` of a detailed layer-info export).
Each node then gets a module path, from the best evidence the graph has:

1. the exporter's per-node scopes (``pkg.torch.onnx.name_scopes``, dynamo graphs before simplification);
2. scoped node names (``/blocks.3/attn/qkv/MatMul``: torch's TorchScript exporter since 1.13, Optimum);
3. the bundle's ``module_outputs`` (the tensor each block's output is, recorded at export): nodes are
   assigned to the block whose output comes next in graph order, and split inside a block at its second
   normalisation (norm1 + attention before, norm2 + MLP after) - what vitdeploy bundles, simplified by
   onnxslim (which drops the scopes), carry.

Without a graph, scoped names in the layer names themselves (case 2) still map. A module path becomes a
group: ``preprocess``, ``patch_embed``, ``embed`` (tokens, positions), ``blocks.N`` x (``attn`` | ``mlp`` |
``norm`` | ``other``), ``norm``, ``head``. A TensorRT layer fused across groups (a Myelin
``ForeignNode`` spanning blocks) is kept as one *span* row: its time is measured for the span, not per
block, and the report says so instead of guessing a split.
"""

from __future__ import annotations

import ast
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .layers import EngineLayers, LayerProfile, nodes_in_name

SCOPE_KEY = "pkg.torch.onnx.name_scopes"
_BLOCK = re.compile(r"(?:^|\.)(?:blocks|layers|layer|encoder_layer)\.(\d+)(?:\.|$)")
_ATTN = {"attn", "attention", "self_attn", "self_attention", "to_qkv", "qkv", "attend", "to_out", "q_proj", "k_proj",
         "v_proj", "out_proj", "query", "key", "value", "q", "k", "v", "proj_attn"}
_MLP = {"mlp", "ffn", "ff", "feed_forward", "intermediate", "output", "fc1", "fc2", "net", "w12", "w3"}
_NORM = re.compile(r"^(?:norm\d*|ln\w*|layernorm\w*|layer_norm\w*|ln_\d)$")
_PATCH = ("patch_embed", "patch_embeddings", "to_patch_embedding", "conv_proj", "patch_embedding")
_HEAD = ("head", "classifier", "mlp_head", "fc_norm", "head_drop", "cls_classifier", "heads")
_EMBED = ("cls_token", "pos_embed", "position_embeddings", "embeddings", "pos_drop", "reg_token", "pos_embedding")
_PRE = ("preprocess", "normalize", "prep")
_NORM_OPS = {"LayerNormalization", "ReduceMean"}


def group_of(module: str) -> Optional[str]:
    """'blocks.3.attn.qkv' -> 'blocks.3.attn'; 'patch_embed.proj' -> 'patch_embed'; None when unknown."""
    path = module.strip(".").replace("/", ".")
    while path.startswith(("model.", "hf.")):
        path = path.split(".", 1)[1]
    parts = [p for p in path.split(".") if p]
    if not parts:
        return None
    m = _BLOCK.search(path)
    if m:
        block = f"blocks.{m.group(1)}"
        rest = path[m.end():].split(".") if m.end() < len(path) else []
        if any(p in _ATTN for p in rest):
            return f"{block}.attn"
        if any(p in _MLP for p in rest):
            return f"{block}.mlp"
        if any(_NORM.match(p) for p in rest):
            return f"{block}.norm"
        return f"{block}.other"
    if any(p in _PATCH for p in parts):
        return "patch_embed"
    if any(p in _PRE for p in parts):
        return "preprocess"
    if any(p in _HEAD for p in parts):
        return "head"
    if any(p in _EMBED for p in parts):
        return "embed"
    if any(_NORM.match(p) for p in parts):
        return "norm"
    return None


def _scoped_module(name: str) -> Optional[str]:
    """'/blocks.3/attn/qkv/MatMul' -> 'blocks.3.attn.qkv' (the exporter writes the module path, then the op)."""
    if not name.startswith("/") or name.count("/") < 2:
        return None
    return ".".join(p for p in name.strip("/").split("/")[:-1] if p)


@dataclass
class NodeGroups:
    """Per ONNX node (by name, and by produced tensor): its position and its group."""

    order: Dict[str, int] = field(default_factory=dict)
    group: Dict[str, Optional[str]] = field(default_factory=dict)
    producer: Dict[str, str] = field(default_factory=dict)  # tensor -> node
    names: List[str] = field(default_factory=list)
    evidence: str = "none"

    @classmethod
    def from_onnx(cls, model: Any, module_outputs: Optional[Dict[str, str]] = None) -> "NodeGroups":
        index = cls()
        nodes = list(model.graph.node)
        index.names = [n.name or (n.output[0] if n.output else f"#{i}") for i, n in enumerate(nodes)]
        for i, (node, name) in enumerate(zip(nodes, index.names)):
            index.order[name] = i
            for out in node.output:
                if out:
                    index.producer[out] = name
        scoped = 0
        for node, name in zip(nodes, index.names):
            module = None
            for prop in node.metadata_props:
                if prop.key == SCOPE_KEY:
                    try:
                        scopes = [s for s in ast.literal_eval(prop.value)[:-1] if s]
                    except (ValueError, SyntaxError):
                        scopes = []
                    module = scopes[-1] if scopes else None
            module = module or _scoped_module(name)
            group = group_of(module) if module else None
            scoped += group is not None
            index.group[name] = group
        if scoped:
            index.evidence = "node scopes"
        if module_outputs and scoped < len(nodes) // 4:
            index._segment(nodes, module_outputs)
        return index

    def _segment(self, nodes: List[Any], module_outputs: Dict[str, str]) -> None:
        """Blocks from the recorded block-output tensors; attention | MLP split at the block's second norm."""
        ends: List[Tuple[int, str]] = []
        for module, tensor in module_outputs.items():
            node = self.producer.get(tensor)
            group = group_of(module)
            if node is not None and group is not None:
                ends.append((self.order[node], group.rsplit(".", 1)[0] if group.startswith("blocks.") else group))
        if not ends:
            return
        ends.sort()

        def norm_starts(span: range) -> List[int]:  # LayerNormalization, or the first ReduceMean of a decomposed one
            return [i for i in span if nodes[i].op_type in _NORM_OPS
                    and (i == span.start or nodes[i - 1].op_type not in _NORM_OPS)
                    and (nodes[i].op_type == "LayerNormalization" or not any(nodes[j].op_type == "ReduceMean" for j in range(max(span.start, i - 3), i)))]

        start, seen_block = 0, False
        for end, group in ends:
            if end < start:
                continue
            span = range(start, end + 1)
            if group.startswith("blocks."):
                norms = norm_starts(span)
                if not seen_block:  # before block 0's first norm: preprocessing, the patch Conv, tokens and positions
                    first = norms[0] if norms else span.start
                    conv = next((i for i in range(span.start, first) if nodes[i].op_type == "Conv"), None)
                    for i in range(span.start, first):
                        self.group[self.names[i]] = ("preprocess" if conv is None or i < conv else
                                                     "patch_embed" if i == conv else "embed")
                    span = range(first, end + 1)
                    norms = [n for n in norms if n >= first]
                    seen_block = True
                split = norms[1] if len(norms) > 1 else None
                for i in span:
                    role = "attn" if split is None or i < split else "mlp"
                    if nodes[i].op_type == "LayerNormalization":
                        role = "norm"
                    self.group[self.names[i]] = f"{group}.{role}"
            else:
                for i in span:
                    self.group[self.names[i]] = group
            start = end + 1
        for i in range(start, len(nodes)):  # after the last recorded module (the head): probs, argmax
            self.group[self.names[i]] = "head"
        self.evidence = "module_outputs + graph order"

    @classmethod
    def from_numbered_names(cls, tokens: Iterable[str]) -> Optional["NodeGroups"]:
        """Blocks of a pre-norm transformer from TorchScript-numbered node names alone (``Op_N``: torch < 1.13
        named every node by its type and position in the graph). Each LayerNorm shows as ``ReduceMean_N`` with
        ``Sub_{N+1}``; the 2k-th and (2k+1)-th of them open block k's attention and MLP; nodes before the first
        belong to the embedding, an unpaired last one is the final norm, and what follows it the head."""
        numbered: Dict[str, int] = {}
        for token in tokens:
            m = re.fullmatch(r"([A-Za-z]+)_(\d+)(?:_\d+)?", token)
            if m:
                numbered[token] = int(m.group(2))
        subs = {n for t, n in numbered.items() if t.startswith("Sub_")}
        ln = sorted({n for t, n in numbered.items() if t.startswith("ReduceMean_") and n + 1 in subs})
        if len(ln) < 2:
            return None
        index = cls(evidence="numbered node names (Op_N) + LayerNorm positions")
        final_norm = ln[-1] if len(ln) % 2 else None
        pairs = ln[: len(ln) - (1 if final_norm is not None else 0)]
        starts = pairs[0::2]
        for token, n in sorted(numbered.items(), key=lambda kv: kv[1]):
            index.order[token] = n
            if n < starts[0]:
                group = "embed"
            elif final_norm is not None and n >= final_norm:
                group = "norm" if n < final_norm + 9 else "head"
            else:
                block = max(i for i, start in enumerate(starts) if n >= start)
                group = f"blocks.{block}." + ("attn" if n < pairs[2 * block + 1] else "mlp")
            index.group[token] = group
        index.names = [t for t, _ in sorted(numbered.items(), key=lambda kv: kv[1])]
        return index

    def resolve(self, token: str) -> Optional[str]:
        """A name from a layer name or Metadata -> a node of this graph (tensor names and TensorRT's
        ``_N`` suffixes on multi-output layers resolved)."""
        if token in self.order:
            return token
        if token in self.producer:
            return self.producer[token]
        stripped = re.sub(r"_\d+$", "", token)
        if stripped != token and stripped in self.order:
            return stripped
        return None

    def span(self, first: str, last: str) -> List[str]:
        a, b = self.resolve(first), self.resolve(last)
        if a is None or b is None:
            return [n for n in (a, b) if n]
        lo, hi = sorted((self.order[a], self.order[b]))
        return self.names[lo:hi + 1]


@dataclass
class LayerAttribution:
    name: str
    avg_ms: float
    kind: str
    groups: Tuple[str, ...]  # distinct groups of its nodes (one: attributed; several: a span)
    named: int = 0  # ONNX node names the layer names
    found: int = 0  # of those, found in the graph


def name_coverage(attributions: Iterable[LayerAttribution]) -> float:
    """Share of the ONNX node names in the layer names that the graph has (1.0 without names): a profile of
    another engine than this graph's shares few of them."""
    named = sum(a.named for a in attributions)
    return sum(a.found for a in attributions) / named if named else 1.0


def attribute(profile: LayerProfile, graph: Optional[NodeGroups] = None, info: Optional[EngineLayers] = None) -> List[LayerAttribution]:
    """Each profiled layer with the groups of the ONNX nodes it ran."""
    meta = {li.name: li.onnx_nodes for li in (info.layers if info else []) if li.onnx_nodes}
    if graph is None:  # no graph: TorchScript-numbered names still place each node in its block
        every = [t for layer in profile.layers for t in (meta.get(layer.name) or nodes_in_name(layer.name).nodes)]
        if not any(_scoped_module(t) for t in every):
            graph = NodeGroups.from_numbered_names(every)
    out = []
    for layer in profile.layers:
        parsed = nodes_in_name(layer.name)
        tokens: List[str] = list(meta.get(layer.name, ())) or list(parsed.nodes)
        nodes: List[str] = []
        found = 0
        if graph is not None:
            for token in tokens:
                node = graph.resolve(token)
                if node:
                    nodes.append(node)
                    found += 1
            for first, last in parsed.spans:
                span = graph.span(first, last)
                found += 2 if len(span) > 1 else len(span)
                nodes += span
            groups = [graph.group.get(n) for n in nodes]
        else:
            groups = [group_of(_scoped_module(t) or "") for t in tokens]
            groups += [group_of(_scoped_module(t) or "") for span in parsed.spans for t in span]
            found = len(tokens) + 2 * len(parsed.spans)
        distinct = tuple(OrderedDict.fromkeys(g for g in groups if g))
        out.append(LayerAttribution(layer.name, layer.avg_ms, parsed.kind, _collapse(distinct), len(tokens) + 2 * len(parsed.spans), found))
    return out


def _collapse(groups: Tuple[str, ...]) -> Tuple[str, ...]:
    """A fused layer that touches a block's norm and its attention is that block's attention (norms fold into
    the next op); other multi-group layers stay spans."""
    if len(groups) <= 1:
        return groups
    core = tuple(g for g in groups if not g.endswith((".norm", ".other")))
    return core if len(core) == 1 else groups


def _sort_key(group: str) -> Tuple[int, int, int]:
    order = {"preprocess": 0, "patch_embed": 1, "embed": 2, "norm": 10 ** 6, "head": 10 ** 6 + 1}
    if group.startswith("blocks."):
        _, n, role = group.split(".")
        return (3, int(n), ["norm", "attn", "mlp", "other"].index(role) if role in ("norm", "attn", "mlp", "other") else 9)
    return (order.get(group, 10 ** 6 + 2), 0, 0)


def group_macs(spec: Any, height: int, width: int, batch: int) -> Dict[str, int]:
    """The cost model's multiply-adds per group (vitdeploy.costs): per block attention = 4BLd^2 + 2BL^2d,
    MLP = 2BL(rho)d^2 (3x for gated MLPs), patch embedding BNFd, head BdK."""
    from ..costs import vit_costs

    c = vit_costs(spec, height, width, batch)
    b, length, d = batch, c.seq_len, spec.embed_dim
    attn = 4 * b * length * d * d + c.macs_per_layer_attention
    mlp = c.macs_per_layer - attn
    out = {"patch_embed": c.macs_patch_embed, "head": c.macs_head}
    for i in range(spec.depth):
        out[f"blocks.{i}.attn"] = attn
        out[f"blocks.{i}.mlp"] = mlp
    return out


@dataclass
class ModuleRow:
    group: str
    avg_ms: float
    share: float
    layers: int
    macs: Optional[int] = None

    @property
    def gflops(self) -> Optional[float]:
        if not self.macs or self.avg_ms <= 0:
            return None
        return 2.0 * self.macs / (self.avg_ms / 1000.0) / 1e9


def per_module(attributions: Iterable[LayerAttribution], macs: Optional[Dict[str, int]] = None) -> Dict[str, Any]:
    """Rows per group (spans as their own rows), the block totals, and how much time mapped to modules."""
    attributions = list(attributions)
    total = sum(a.avg_ms for a in attributions) or 1.0
    rows: Dict[str, ModuleRow] = {}
    unmapped = reformat = 0.0
    for a in attributions:
        if a.kind == "reformat":
            reformat += a.avg_ms
        if not a.groups:
            unmapped += a.avg_ms
            key = "(unmapped)"
        elif len(a.groups) == 1:
            key = a.groups[0]
        else:
            key = f"span {a.groups[0]} .. {a.groups[-1]}"
        row = rows.setdefault(key, ModuleRow(key, 0.0, 0.0, 0))
        row.avg_ms += a.avg_ms
        row.layers += 1
    for row in rows.values():
        row.share = row.avg_ms / total
        if macs and row.group in macs:
            row.macs = macs[row.group]
    ordered = sorted(rows.values(), key=lambda r: (r.group.startswith("("), r.group.startswith("span"),
                                                   _sort_key(r.group) if not r.group.startswith(("(", "span")) else (0, 0, 0)))
    blocks: Dict[str, float] = {}
    for row in ordered:
        m = re.match(r"^blocks\.(\d+)\.", row.group)
        if m:
            blocks[m.group(1)] = blocks.get(m.group(1), 0.0) + row.avg_ms
    return {"rows": ordered, "total_ms": total, "mapped_share": 1.0 - unmapped / total, "unmapped_ms": unmapped,
            "reformat_ms": reformat, "span_ms": sum(r.avg_ms for r in ordered if r.group.startswith("span")),
            "per_block_ms": {int(k): v for k, v in blocks.items()}}
