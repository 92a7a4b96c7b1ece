"""The units `vitdeploy debug-precision` ranks, and how one graph is scored against the gate.

Units are ViT terms, found from the graph's structure (calibration/exclusions.py):

* cells ``MODULE/ROLE``: one block's qkv, attention matmuls, attn-proj, mlp-fc1 or mlp-fc2, plus the
  patch embedding and the head (the unit recipes are written in);
* blocks ``blocks.N``: every layer of one block;
* roles: one role across every block.

For INT8 a unit's nodes are its MatMul/Gemm/Conv nodes (what Q/DQ goes on); for fp16 they are the
nodes the fp16 pass would keep in fp32 for that name (a cell: its linear layers and their bias Adds;
a block: every node of the module; calibration's ``--keep-fp32`` resolution).

:func:`damage` turns a trial's scores into the share of the gate's tolerance it uses: 1.0 means the
unit alone fails the gate (the largest of the agreement, accuracy-drop and cosine shares).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vitdeploy.gate import Gate
from .exclusions import CELL_SEP, PATCH_EMBED, ROLE_ORDER, GraphIndex, layer_labels


@dataclass(frozen=True)
class Unit:
    name: str  # "blocks.2/mlp-fc2", "blocks.2", "mlp-fc2", "patch_embed", "head"
    kind: str  # "cell" | "block" | "role"
    nodes: frozenset  # node names in this unit (see the module docstring)
    layers: int  # linear layers in it (MatMul/Gemm/Conv)

    @property
    def block(self) -> str | None:
        return self.name.split(CELL_SEP, 1)[0] if self.kind == "cell" and CELL_SEP in self.name else None

    @property
    def role(self) -> str | None:
        if self.kind == "cell":
            if self.name == PATCH_EMBED:
                return "patch-embed"
            return self.name.split(CELL_SEP, 1)[1] if CELL_SEP in self.name else "head"
        return self.name if self.kind == "role" else None


@dataclass
class Trial:
    """One graph scored against the gate: a unit alone in reduced precision, or a keep-set."""

    label: str
    passed: bool
    failures: list[str]
    scores: dict[str, Any]  # the gated execution's accuracy / agreement / cosine
    damage: float
    reduced_layers: int  # linear layers in reduced precision in this graph
    overflow: list[dict[str, Any]] = field(default_factory=list)  # fp16: tensors past 65504
    empty: bool = False  # nothing left in reduced precision (the fp32 end of a search)

    def row(self) -> dict[str, Any]:
        s = self.scores
        return {"label": self.label, "passed": self.passed, "failures": self.failures, "damage": round(self.damage, 4),
                "reduced_layers": self.reduced_layers, "accuracy": s.get("accuracy"), "top1_agreement": s.get("top1_agreement"),
                "cosine_p1": s["cosine_p1"], "overflow_tensors": len(self.overflow)}


def damage(gate: Gate, fp32_accuracy: float | None, scores: dict[str, Any], overflow: int = 0) -> float:
    """Share of the gate's tolerance a graph uses (>= 1: fails the gate; overflow counts as 10)."""
    parts = [(1.0 - scores["cosine_p1"]) / max(1.0 - gate.min_cosine, 1e-9)]
    if scores.get("top1_agreement") is not None:  # None: an embedding model (no classes)
        parts.append((1.0 - scores["top1_agreement"]) / max(1.0 - gate.min_agreement, 1e-9))
    acc = scores.get("accuracy")
    if fp32_accuracy is not None and acc is not None:
        parts.append(max(0.0, (fp32_accuracy - acc) * 100.0) / max(gate.max_drop_points, 1e-9))
    value = max(parts)
    return max(value, 10.0) if overflow else (value if value == value else 10.0)  # NaN scores count as broken


def int8_units(model: Any, graph_meta: dict[str, Any]) -> dict[str, list[Unit]]:
    """Cells, blocks and roles over the quantizable nodes."""
    labels = layer_labels(model, graph_meta, GraphIndex.of(model))
    cells: dict[str, set[str]] = {}
    for node, label in labels.items():
        cells.setdefault(label, set()).add(node)
    return _group(cells, {name: len(nodes) for name, nodes in cells.items()})


def fp16_units(model: Any, graph_meta: dict[str, Any]) -> dict[str, list[Unit]]:
    """Cells, blocks and roles over the nodes the fp16 pass keeps in fp32 for each name."""
    from vitdeploy.exporters.fp16_keep import resolve_keep

    labels = layer_labels(model, graph_meta, GraphIndex.of(model))
    linear: dict[str, int] = {}
    for label in labels.values():
        linear[label] = linear.get(label, 0) + 1
    _, cells = resolve_keep(model, graph_meta, list(linear))
    units = _group({k: set(v) for k, v in cells.items()}, linear)
    blocks = sorted({u.block for u in units["cells"] if u.block})
    _, modules = resolve_keep(model, graph_meta, blocks)
    units["blocks"] = [Unit(b, "block", frozenset(modules[b]), sum(u.layers for u in units["cells"] if u.block == b)) for b in blocks]
    return units


def _group(cells: dict[str, set[str]], layers: dict[str, int]) -> dict[str, list[Unit]]:
    cell_units = [Unit(name, "cell", frozenset(nodes), layers[name]) for name, nodes in cells.items()]
    cell_units.sort(key=_cell_order)
    blocks: dict[str, list[Unit]] = {}
    roles: dict[str, list[Unit]] = {}
    for unit in cell_units:
        if unit.block:
            blocks.setdefault(unit.block, []).append(unit)
        roles.setdefault(unit.role or unit.name, []).append(unit)
    block_units = [Unit(b, "block", frozenset().union(*(u.nodes for u in us)), sum(u.layers for u in us)) for b, us in blocks.items()]
    role_units = [Unit(r, "role", frozenset().union(*(u.nodes for u in us)), sum(u.layers for u in us))
                  for r, us in sorted(roles.items(), key=lambda item: ROLE_ORDER.index(item[0]) if item[0] in ROLE_ORDER else 99)
                  if len(us) > 1]  # a role with one cell (patch-embed, head) is that cell
    return {"cells": cell_units, "blocks": block_units, "roles": role_units}


def _cell_order(unit: Unit) -> tuple[int, int, int]:
    if unit.name == PATCH_EMBED:
        return (0, 0, 0)
    if unit.block is None:
        return (2, 0, 0)
    tail = unit.block.rsplit(".", 1)[-1]
    number = int(tail) if tail.isdigit() else 0
    return (1, number, ROLE_ORDER.index(unit.role) if unit.role in ROLE_ORDER else 99)


def compact_keep(kept: list[Unit], cells: list[Unit]) -> list[str]:
    """Recipe names for a kept set of cells: a block whose every cell is kept becomes ``blocks.N``."""
    names = {u.name for u in kept}
    out: list[str] = []
    blocks: dict[str, list[Unit]] = {}
    for u in cells:
        if u.block:
            blocks.setdefault(u.block, []).append(u)
    done: set[str] = set()
    for u in sorted(kept, key=_cell_order):
        if u.block and u.block not in done and all(c.name in names for c in blocks[u.block]):
            out.append(u.block)
            done.add(u.block)
        elif not (u.block and u.block in done):
            out.append(u.name)
    return out
