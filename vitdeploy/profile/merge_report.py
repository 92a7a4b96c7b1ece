"""`profile --merge-tokens`: the latency/accuracy trade-off of token merging (exporters/token_merge.py).

One row per (backend, precision, size, batch, r): p50 latency, the speed-up measured against the r=0
cell of the same sweep beside the cost model's predicted one (vitdeploy.costs.merge_costs), and with
--accuracy the accuracy and the top-1 agreement with the unmerged graph; the plot shows both against r.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..fileio import atomic_path


def merge_rows(result: Any) -> list[dict[str, Any]]:
    """The ok merge cells, each with ``speedup`` (p50 of its r=0 cell / its p50) and ``predicted``."""
    ok = [r for r in result.rows if r["status"] == "ok" and r.get("merge_r") is not None]
    base = {(r["backend"], r["precision"], r["height"], r["width"], r["batch"]): r for r in ok if r["merge_r"] == 0}
    out = []
    for r in ok:
        zero = base.get((r["backend"], r["precision"], r["height"], r["width"], r["batch"]))
        out.append({**r, "speedup": zero["p50_ms"] / r["p50_ms"] if zero else None,
                    "predicted": zero["macs"] / r["macs"] if zero else None})
    return out


def render_merge_table(result: Any, console: Any) -> None:
    from rich.table import Table

    rows = merge_rows(result)
    if not rows:
        return
    table = Table(title="token merging: latency and accuracy against r (speed-up vs the r=0 cell of this run)", title_justify="left")
    for name in ("cell", "r", "GMAC", "p50 ms", "speed-up", "cost model", "accuracy", "agree r0"):
        table.add_column(name, justify="left" if name == "cell" else "right")
    for r in rows:
        table.add_row(f"{r['backend']} {r['precision']} {r['height']}x{r['width']} b{r['batch']}", str(r["merge_r"]),
                      f"{r['macs'] / 1e9:.2f}", f"{r['p50_ms']:.2f}",
                      f"{r['speedup']:.2f}x" if r["speedup"] else "-", f"{r['predicted']:.2f}x" if r["predicted"] else "-",
                      f"{r['accuracy']:.2%}" if r.get("accuracy") is not None else "-",
                      f"{r['agreement_unmerged']:.2%}" if r.get("agreement_unmerged") is not None else "-")
    console.print(table)


def write_merge_plot(result: Any, ok: list[dict[str, Any]], target: str | Path, figure: Any, canvas: Any) -> Path:
    """Left: measured and predicted speed-up against r; right: accuracy (with --accuracy) against r."""
    rows = merge_rows(result)
    fig = figure(figsize=(11, 4.5), dpi=110)
    canvas(fig)
    ax_speed, ax_acc = fig.subplots(1, 2)
    series = sorted({(r["backend"], r["precision"], r["height"], r["width"], r["batch"]) for r in rows})
    for i, key in enumerate(series):
        pts = sorted((r for r in rows if (r["backend"], r["precision"], r["height"], r["width"], r["batch"]) == key),
                     key=lambda r: r["merge_r"])
        xs = [r["merge_r"] for r in pts]
        label = f"{key[0]} {key[1]} {key[2]}x{key[3]} b{key[4]}"
        ax_speed.plot(xs, [r["speedup"] or float("nan") for r in pts], marker="o", color=f"C{i % 10}", label=f"{label} measured")
        ax_speed.plot(xs, [r["predicted"] or float("nan") for r in pts], linestyle="--", color=f"C{i % 10}", alpha=0.6,
                      label=f"{label} cost model")
        accuracy = [r.get("accuracy") for r in pts]
        if any(a is not None for a in accuracy):
            ax_acc.plot(xs, [a * 100 if a is not None else float("nan") for a in accuracy], marker="o", color=f"C{i % 10}", label=label)
            agree = [r.get("agreement_unmerged") for r in pts]
            ax_acc.plot(xs, [a * 100 if a is not None else float("nan") for a in agree], marker="x", linestyle=":",
                        color=f"C{i % 10}", label=f"{label} agreement with r=0")
    ax_speed.set_xlabel("r (tokens merged per block)")
    ax_speed.set_ylabel("speed-up over r=0 (p50)")
    ax_speed.set_title("speed")
    ax_speed.grid(alpha=0.3)
    ax_speed.legend(fontsize=7)
    ax_acc.set_xlabel("r (tokens merged per block)")
    ax_acc.set_ylabel("%")
    ax_acc.set_title("accuracy (--accuracy), agreement with r=0")
    ax_acc.grid(alpha=0.3)
    if ax_acc.lines:
        ax_acc.legend(fontsize=7)
    fig.suptitle(f"vitdeploy profile --merge-tokens: {result.bundle.get('name', '')} on "
                 f"{result.machine.get('gpu') or result.machine.get('cpu') or ''}", fontsize=10)
    fig.tight_layout()
    with atomic_path(target, suffix=".png") as tmp:
        fig.savefig(tmp, format="png")
    return Path(target)
