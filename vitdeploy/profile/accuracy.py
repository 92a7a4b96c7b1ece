"""`profile --accuracy SOURCE`: the accuracy of what each cell timed, so one picture shows what a
resolution or precision costs in latency and what it buys (or loses) in accuracy.

Accuracy belongs to (backend, precision, height, width), not to the batch size: each distinct one is
scored once on the labelled data (:mod:`vitdeploy.data`, brought to the cell's size by the
manifest's host-resize rule) with the runner the cell used (the same graph file, ONNX Runtime
optimisation level and provider; the same PyTorch model), and the result is copied to every batch
size of it. Intervals are 95% Wilson intervals (:func:`vitdeploy.compare.wilson`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..bundle import Bundle
from ..errors import UserError, VitDeployError
from .cells import runner_factory
from .plan import Cell, SweepConfig
from .sweep import SweepResult

# The CSV/JSON columns these numbers land in are declared in vitdeploy.profile.report.COLUMNS.


def check_source(source: str) -> None:
    """Refuse a --accuracy source that cannot exist before the sweep spends minutes timing cells."""
    if source.startswith("digits:"):
        if source.split(":", 1)[1] not in ("train", "test"):
            raise UserError(f"--accuracy {source}: unknown digits split; use digits:test or digits:train")
        return
    path = Path(source).expanduser()
    if not path.exists():
        raise UserError(f"--accuracy {source} does not exist; give digits:test, a folder DIR/<class>/<image>, or a .npz with images + labels")
    if path.is_file() and path.suffix.lower() != ".npz":
        raise UserError(f"--accuracy {source} is a file but not a .npz with images + labels")


def add_accuracy(bundle: Bundle, result: SweepResult, source: str, config: SweepConfig, threads: int,
                 limit: int | None = None, batch: int = 64) -> dict[str, Any]:
    """Score every (backend, precision, size) of the sweep's ok cells; write the numbers into the rows."""
    from ..data import open_labelled
    from ..compare import wilson
    from ..images import to_channel_order

    pre = bundle.preprocessing
    if pre.get("input", "uint8-nhwc") != "uint8-nhwc":
        raise UserError("--accuracy feeds uint8 NHWC images; this graph takes another input format")
    keys = sorted({_key(r) for r in result.rows if r["status"] == "ok"}, key=lambda k: tuple(-1 if v is None else v for v in k))
    data_by_size: dict[tuple[int, int], Any] = {}
    scores: dict[tuple[Any, ...], dict[str, Any]] = {}
    predictions: dict[tuple[Any, ...], np.ndarray] = {}  # top-1 per key: agreement of merged graphs with the unmerged one
    for backend, precision, h, w, merge in keys:
        if (h, w) not in data_by_size:
            data_by_size[(h, w)] = open_labelled(source, (h, w), pre, bundle.labels or None, limit)
        data = data_by_size[(h, w)]
        cell = Cell(backend, precision, h, w, batch, merge=merge)
        try:
            make, _graph = runner_factory(bundle, cell, config, threads)
            runner = make()
            try:
                logits = runner.infer_batched(to_channel_order(data.images, pre), batch, outputs=("logits",))["logits"]
            finally:
                runner.close()
        except VitDeployError as exc:
            scores[(backend, precision, h, w, merge)] = {"error": str(exc)}
            continue
        predictions[(backend, precision, h, w, merge)] = logits.argmax(-1)
        correct = int((logits.argmax(-1) == data.labels).sum())
        lo, hi = wilson(correct, len(data))
        scores[(backend, precision, h, w, merge)] = {"accuracy": correct / len(data), "accuracy_ci95_low": lo, "accuracy_ci95_high": hi,
                                              "accuracy_n": len(data)}
    for key, top1 in predictions.items():  # --merge-tokens: how often the merged graph agrees with the unmerged (r=0) one
        unmerged = predictions.get(key[:4] + (0,))
        if key[4] is not None and unmerged is not None:
            scores[key]["agreement_unmerged"] = float((top1 == unmerged).mean())
    for row in result.rows:
        score = scores.get(_key(row))
        if score and "accuracy" in score:
            row.update(score)
        elif score:
            row["note"] = (row.get("note") + "; " if row.get("note") else "") + f"accuracy not scored: {score['error']}"
    first = next(iter(data_by_size.values()), None)
    record = {"source": source, "count": len(first) if first is not None else 0,
              "rule": "top-1 accuracy per (backend, precision, size) with the cell's own runner; images brought to each size "
                      "by the manifest's host-resize rule; 95% Wilson intervals"}
    result.config["accuracy"] = record
    return record


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    """What accuracy belongs to: backend, precision, size, and the merge r of a --merge-tokens cell."""
    return (row["backend"], row["precision"], row["height"], row["width"], row.get("merge_r"))


def write_accuracy_plot(result: SweepResult, target: str | Path) -> Path | None:
    """Accuracy against p50 latency per image, one point per ok cell with accuracy (95% bars),
    coloured by backend x precision, labelled with size and batch."""
    rows = [r for r in result.rows if r["status"] == "ok" and r.get("accuracy") is not None and r.get("p50_ms")]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..fileio import atomic_path

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(f"{r['backend']} {r['precision']}", []).append(r)
    for name, group in groups.items():
        xs = np.array([r["p50_ms"] / r["batch"] for r in group])
        ys = np.array([r["accuracy"] * 100 for r in group])
        # clipped at 0: at 100% (or 0%) the Wilson bound equals the accuracy up to rounding, which may be -1e-14
        err = np.maximum(np.array([[y - r["accuracy_ci95_low"] * 100 for y, r in zip(ys, group)],
                                   [r["accuracy_ci95_high"] * 100 - y for y, r in zip(ys, group)]]), 0.0)
        ax.errorbar(xs, ys, yerr=err, fmt="o", capsize=3, label=name, alpha=0.85)
        for x, y, r in zip(xs, ys, group):
            merge = f" r{r['merge_r']}" if r.get("merge_r") is not None else ""
            ax.annotate(f"{r['height']}x{r['width']}{merge} b{r['batch']}", (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("p50 latency per image, ms (call latency / batch; log scale)")
    ax.set_ylabel("top-1 accuracy, %")
    source = (result.config.get("accuracy") or {}).get("source", "")
    ax.set_title(f"{result.bundle.get('name')}: accuracy vs latency per cell on {source} (bars: 95% Wilson)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    target = Path(target)
    with atomic_path(target, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return target


def render_accuracy(result: SweepResult, console: Any) -> None:
    """One line per (backend, precision, size): accuracy with its interval and the fastest p50."""
    from rich.table import Table

    rows = [r for r in result.rows if r.get("accuracy") is not None]
    if not rows:
        return
    table = Table(title="accuracy per cell (--accuracy)", title_justify="left")
    merges = any(r.get("merge_r") is not None for r in rows)
    for name in ("backend", "precision", "size", "accuracy % (95% CI)", "n", "best p50 ms/img") + (("agree r0",) if merges else ()):
        table.add_column(name, justify="right" if name not in ("backend", "precision") else "left")
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        key = _key(r)
        per_image = r["p50_ms"] / r["batch"]
        if key not in seen or per_image < seen[key]["per_image"]:
            seen[key] = {**r, "per_image": per_image}
    for (backend, precision, h, w, merge), r in seen.items():
        agree = (f"{r['agreement_unmerged']:.2%}" if r.get("agreement_unmerged") is not None else "-",) if merges else ()
        table.add_row(backend, precision, f"{h}x{w}" + (f" r{merge}" if merge is not None else ""),
                      f"{r['accuracy'] * 100:.2f} ({r['accuracy_ci95_low'] * 100:.1f}-"
                      f"{r['accuracy_ci95_high'] * 100:.1f})", str(r["accuracy_n"]), f"{r['per_image']:.3f}", *agree)
    console.print(table)
