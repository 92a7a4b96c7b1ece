"""Which linear layers stay in float: exclusions by op type, by PyTorch module, or by ViT role.

INT8 Q/DQ goes on the inputs of MatMul/Gemm/Conv only (the linear layers and the two attention
matmuls). A recipe can keep some of them in float:

* ``op_types``: e.g. ``Conv`` (the patch embedding) or ``Gemm`` (a 2-D classifier head);
* ``blocks``: PyTorch module names as the bundle's manifest maps them (``graph.module_outputs``:
  ``blocks.0`` .. ``blocks.N``, ``norm``, ``head``; Hugging Face names for hf bundles: each family
  adapter's ``module_names``, exporters/adapters/) plus ``patch_embed``. Node metadata does not survive the graph simplifier, so a module's nodes are
  found from the graph itself: the ancestors of the module's output tensor that are not ancestors
  of the previous module's output;
* ``roles``: ``qkv`` (the projections whose outputs feed the attention matmuls; Hugging Face's
  separate query/key/value layers are all three), ``attention-matmuls`` (the activation x
  activation matmuls q.k^T and attn.v, whose softmax-side input is the classic INT8 trouble spot),
  ``attn-proj`` (the linear layer reading the attention output), ``mlp-fc1`` (the linear layer
  GELU reads), ``mlp-fc2`` (the linear layer after GELU, whose input has a long positive tail),
  ``patch-embed`` (the Conv that reads the normalised pixels) and ``head`` (the classifier: the last
  linear layer before ``logits``). Roles are found from the graph's structure, so they mean the same
  for every model family (nothing here knows one);
* a **cell** ``MODULE/ROLE`` in ``blocks`` (``blocks.2/mlp-fc2``): the layers of that role inside that
  module only, the unit ``vitdeploy debug-precision`` ranks and writes recipes in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from vitdeploy.errors import UserError

QUANTIZABLE_OPS = ("MatMul", "Gemm", "Conv")
ROLES = ("attention-matmuls", "mlp-fc2", "patch-embed", "head", "qkv", "attn-proj", "mlp-fc1")
# the order a ViT computes them in (tables and plots list roles this way)
ROLE_ORDER = ("patch-embed", "qkv", "attention-matmuls", "attn-proj", "mlp-fc1", "mlp-fc2", "head")
CELL_SEP = "/"
PATCH_EMBED = "patch_embed"


@dataclass(frozen=True)
class Exclusions:
    op_types: tuple[str, ...] = ()
    blocks: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()  # node names (what debug-precision's one-at-a-time trials keep in float)

    def __post_init__(self) -> None:
        bad_ops = [op for op in self.op_types if op not in QUANTIZABLE_OPS]
        if bad_ops:
            raise UserError(f"--exclude-op-types {', '.join(bad_ops)}: only {', '.join(QUANTIZABLE_OPS)} are quantized, "
                            "so only they can be excluded")
        bad_roles = [r for r in self.roles if r not in ROLES]
        if bad_roles:
            raise UserError(f"--exclude-roles {', '.join(bad_roles)}: known roles are {', '.join(ROLE_ORDER)}")
        bad_cells = [b for b in self.blocks if CELL_SEP in b and b.split(CELL_SEP, 1)[1] not in ROLES]
        if bad_cells:
            raise UserError(f"--exclude-blocks {', '.join(bad_cells)}: a MODULE/ROLE cell needs one of the roles "
                            f"{', '.join(ROLE_ORDER)}")

    @property
    def label(self) -> str:
        parts = [*(f"op:{o}" for o in self.op_types), *self.blocks, *self.roles] + ([f"{len(self.nodes)} nodes"] if self.nodes else [])
        return ", ".join(parts) if parts else "none"

    def to_dict(self) -> dict[str, Any]:
        out = {"op_types": list(self.op_types), "blocks": list(self.blocks), "roles": list(self.roles)}
        if self.nodes:
            out["nodes"] = list(self.nodes)
        return out


@dataclass
class GraphIndex:
    """Producers, consumers and constants of a graph, for walking it."""

    model: Any
    producer: dict[str, Any] = field(default_factory=dict)
    consumers: dict[str, list[Any]] = field(default_factory=dict)
    constants: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, model: Any) -> "GraphIndex":
        index = cls(model)
        graph = model.graph
        index.constants = {i.name for i in graph.initializer}
        for node in graph.node:
            for out in node.output:
                index.producer[out] = node
            for inp in node.input:
                if inp:
                    index.consumers.setdefault(inp, []).append(node)
            if node.op_type == "Constant":
                index.constants.update(node.output)
        return index

    def ancestors(self, tensor: str) -> set[str]:
        """Names of the nodes ``tensor`` depends on (its producer included)."""
        seen: set[str] = set()
        stack = [tensor]
        visited_tensors: set[str] = set()
        while stack:
            t = stack.pop()
            if t in visited_tensors:
                continue
            visited_tensors.add(t)
            node = self.producer.get(t)
            if node is None or node.name in seen:
                continue
            seen.add(node.name)
            stack.extend(i for i in node.input if i)
        return seen

    def is_constant(self, tensor: str) -> bool:
        return tensor in self.constants


def quantizable_nodes(model: Any, op_types: tuple[str, ...] = QUANTIZABLE_OPS) -> list[Any]:
    from vitdeploy.exporters.position_nodes import position_linear_nodes

    position = set(position_linear_nodes(model))  # constants and the input's shape only: never quantized (qdq.py)
    return [n for n in model.graph.node if n.op_type in op_types and n.name not in position]


def module_nodes(model: Any, graph_meta: dict[str, Any], index: GraphIndex | None = None) -> dict[str, set[str]]:
    """Node names per PyTorch module (``patch_embed``, ``blocks.N``, ``norm``, ``head``...)."""
    index = index or GraphIndex.of(model)
    outputs: dict[str, str] = dict(graph_meta.get("module_outputs") or {})
    patch = (graph_meta.get("patch_embed") or {}).get("output")
    if patch is None:
        conv = next((n for n in model.graph.node if n.op_type == "Conv"), None)
        patch = conv.output[0] if conv is not None else None
    if patch is not None:
        outputs = {PATCH_EMBED: patch, **outputs}
    order = {out: i for i, node in enumerate(model.graph.node) for out in node.output}
    present = [(name, t) for name, t in outputs.items() if t in order]
    present.sort(key=lambda item: order[item[1]])
    result: dict[str, set[str]] = {}
    previous: set[str] = set()
    for name, tensor in present:
        mine = index.ancestors(tensor)
        result[name] = mine - previous
        previous = mine
    return result


def role_nodes(model: Any, role: str, index: GraphIndex | None = None) -> set[str]:
    index = index or GraphIndex.of(model)
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul"]
    if role == "attention-matmuls":
        return {n.name for n in matmuls if not any(index.is_constant(i) for i in n.input)}
    if role == "mlp-fc2":
        return {n.name for n in matmuls if _after_gelu(index, n.input[0])}
    if role == "patch-embed":
        return {n.name for n in model.graph.node if n.op_type == "Conv"}
    if role in ("qkv", "attn-proj", "mlp-fc1"):
        return _linear_role(model, role, index)
    if role == "head":
        # the linear layers between the final LayerNorm and the logits: one head, or DeiT's two
        outputs = [o.name for o in model.graph.output]
        logits = "logits" if "logits" in outputs else outputs[0]
        feeding = index.ancestors(logits)
        norms = [n for n in model.graph.node if n.op_type == "LayerNormalization" and n.name in feeding]
        before = index.ancestors(norms[-1].output[0]) if norms else set()
        return {n.name for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and n.name in feeding - before}
    raise UserError(f"unknown role {role!r}; known roles are {', '.join(ROLES)}")


# ops a walk between a linear layer and the attention matmuls / GELU may pass (bias adds, the head
# split, scaling, the erf formula of an unfused GELU)
_PASS_OPS = {"Add", "Reshape", "Transpose", "Split", "Slice", "Squeeze", "Unsqueeze", "Gather", "Mul", "Div", "Identity",
             "Cast", "Concat", "Erf", "Tanh", "Sqrt", "Pow", "Flatten", "Gelu", "FastGelu", "BiasGelu"}


def constant_linear(index: GraphIndex, node: Any) -> bool:
    """A MatMul/Gemm with a constant weight (a Linear), as opposed to an activation x activation matmul."""
    return node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and index.is_constant(node.input[1])


def _walk(index: GraphIndex, start: list[str], forward: bool, stop: Callable[[Any], bool], depth: int = 12) -> list[Any]:
    """Nodes satisfying ``stop`` reached from the tensors ``start`` through _PASS_OPS only."""
    found: dict[str, Any] = {}
    frontier, seen = list(start), set()
    for _ in range(depth):
        nxt: list[str] = []
        for tensor in frontier:
            nodes = index.consumers.get(tensor, []) if forward else [n for n in [index.producer.get(tensor)] if n is not None]
            for node in nodes:
                if node.name in seen:
                    continue
                seen.add(node.name)
                if stop(node):
                    found[node.name] = node
                elif node.op_type in _PASS_OPS:
                    nxt.extend(node.output if forward else [i for i in node.input if i and not index.is_constant(i)])
        frontier = nxt
    return list(found.values())


def _linear_role(model: Any, role: str, index: GraphIndex) -> set[str]:
    nodes = list(model.graph.node)
    if role == "mlp-fc1":
        # the linear layer whose output GELU reads: walk back from each fc2's input to a Linear
        fc2 = [n for n in nodes if n.op_type == "MatMul" and _after_gelu(index, n.input[0])]
        return {p.name for n in fc2 for p in _walk(index, [n.input[0]], False, lambda m: constant_linear(index, m)) if p.name != n.name}
    attention = [n for n in nodes if n.op_type == "MatMul" and not any(index.is_constant(i) for i in n.input)]
    if role == "qkv":
        return {p.name for n in attention for p in _walk(index, list(n.input), False, lambda m: constant_linear(index, m))}
    # attn-proj: the Linear reading the attention output (attn @ v, through the head merge)
    return {c.name for n in attention for c in _walk(index, list(n.output), True, lambda m: constant_linear(index, m))}


def layer_labels(model: Any, graph_meta: dict[str, Any], index: GraphIndex | None = None) -> dict[str, str]:
    """``{node name: "blocks.2/mlp-fc2"}`` for every quantizable node (``MODULE/ROLE``; ``MODULE`` alone
    where no role applies), the names recipes and precision reports use."""
    index = index or GraphIndex.of(model)
    modules = module_nodes(model, graph_meta, index)
    module_of = {name: module for module, names in modules.items() for name in names}
    role_of: dict[str, str] = {}
    for role in ROLE_ORDER:
        for name in role_nodes(model, role, index):
            role_of.setdefault(name, role)
    labels = {}
    for node in quantizable_nodes(model):
        module, role = module_of.get(node.name), role_of.get(node.name)
        if role in ("patch-embed", "head"):
            labels[node.name] = PATCH_EMBED if role == "patch-embed" else (module or "head")
        elif module and role:
            labels[node.name] = f"{module}{CELL_SEP}{role}"
        else:
            labels[node.name] = module or role or node.name
    return labels


def _after_gelu(index: GraphIndex, tensor: str, depth: int = 4) -> bool:
    """Is ``tensor`` a GELU output (a Gelu node, or the erf/tanh formula a few nodes back)?"""
    node = index.producer.get(tensor)
    if node is None:
        return False
    if node.op_type in ("Gelu", "FastGelu", "BiasGelu"):
        return True
    if node.op_type != "Mul" or depth == 0:
        return False
    if _quick_gelu(index, node):
        return True
    frontier, seen = list(node.input), set()
    for _ in range(depth):
        nxt = []
        for t in frontier:
            p = index.producer.get(t)
            if p is None or p.name in seen:
                continue
            seen.add(p.name)
            if p.op_type in ("Erf", "Tanh"):
                return True
            nxt.extend(p.input)
        frontier = nxt
    return False


def _quick_gelu(index: GraphIndex, mul: Any) -> bool:
    """x * Sigmoid(c * x) with a constant c: CLIP's QuickGELU (a SiLU, x * Sigmoid(x), has no scale and is not one)."""
    for x, gate in ((mul.input[0], mul.input[1]), (mul.input[1], mul.input[0])):
        sigmoid = index.producer.get(gate)
        scale = index.producer.get(sigmoid.input[0]) if sigmoid is not None and sigmoid.op_type == "Sigmoid" else None
        if scale is not None and scale.op_type == "Mul" and x in scale.input and any(index.is_constant(i) for i in scale.input):
            return True
    return False


def resolve(model: Any, graph_meta: dict[str, Any], exclusions: Exclusions) -> dict[str, Any]:
    """Quantizable nodes each exclusion removes: {"nodes": [...], "by": {rule: [nodes]}}."""
    index = GraphIndex.of(model)
    candidates = {n.name: n for n in quantizable_nodes(model)}
    by: dict[str, list[str]] = {}
    for op in exclusions.op_types:
        by[f"op:{op}"] = sorted(name for name, n in candidates.items() if n.op_type == op)
    if exclusions.blocks:
        modules = module_nodes(model, graph_meta, index)
        unknown = [b for b in exclusions.blocks if b.split(CELL_SEP, 1)[0] not in modules]
        if unknown:
            raise UserError(f"--exclude-blocks {', '.join(unknown)}: not a module of this graph; known: {_known(modules)}")
        for block in exclusions.blocks:
            module, _, role = block.partition(CELL_SEP)
            names = modules[module] & role_nodes(model, role, index) if role else modules[module]
            by[block] = sorted(name for name in names if name in candidates)
    for role in exclusions.roles:
        by[role] = sorted(name for name in role_nodes(model, role, index) if name in candidates)
    if exclusions.nodes:
        missing = [n for n in exclusions.nodes if n not in candidates]
        if missing:
            raise UserError(f"{', '.join(missing[:3])}: not a MatMul/Gemm/Conv node of this graph")
        by["nodes"] = sorted(exclusions.nodes)
    nodes = sorted({name for names in by.values() for name in names})
    unnamed = [n for n in candidates.values() if not n.name]
    if unnamed:
        raise UserError("the graph has unnamed MatMul/Gemm/Conv nodes, which cannot be excluded by name; re-export it with `vitdeploy export`")
    return {"nodes": nodes, "by": by}


def _known(modules: dict[str, set[str]]) -> str:
    names = list(modules)
    if len(names) > 8:
        names = names[:4] + ["..."] + names[-3:]
    return ", ".join(names)
