"""What `vitdeploy debug-precision` leaves behind: the recipe, a JSON report, a PNG and the table.

* ``reports/debug-precision-<precision>.json``: every trial (units alone, the search steps);
* ``reports/debug-precision-<precision>.png``: the damage of each cell as a block x role heat map
  (1.0 = the cell alone uses the whole gate), beside bars for each block and each role alone;
* the recipe (``reports/precision-recipe-<precision>.json`` unless ``--recipe PATH``).

All written atomically; matplotlib runs headless (Agg) and is imported here only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.bundle import Bundle
from vitdeploy.fileio import atomic_path, atomic_write_json

from .evaluate import percent
from .recipe_file import write_recipe

REPORTS = "reports"


def write_outputs(bundle: Bundle, report: dict[str, Any], recipe: dict[str, Any], recipe_path: str | None) -> dict[str, str]:
    precision = report["precision"]
    reports = bundle.root / REPORTS
    reports.mkdir(exist_ok=True)
    recipe_file = Path(recipe_path) if recipe_path else reports / f"precision-recipe-{precision}.json"
    write_recipe(recipe_file, recipe)
    png = reports / f"debug-precision-{precision}.png"
    plot_damage(report, png)
    paths = {"recipe_file": str(recipe_file), "png": str(png), "json": str(reports / f"debug-precision-{precision}.json")}
    atomic_write_json(Path(paths["json"]), {**report, **paths})
    return paths


def plot_damage(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocks, roles, grid = damage_matrix(report)
    singles = [(c["unit"], c["damage"]) for c in report["ranking"]["cells"] if "/" not in c["unit"]]
    fig, (ax_map, ax_bar) = plt.subplots(1, 2, figsize=(12, max(3.5, 0.45 * len(blocks) + 2)),
                                         gridspec_kw={"width_ratios": [max(len(roles), 1), 4]})
    shown = np.log10(np.clip(grid, 1e-3, None))
    image = ax_map.imshow(shown, cmap="magma_r", vmin=-3, vmax=max(1.0, np.nanmax(shown) if np.isfinite(shown).any() else 1.0),
                          aspect="auto")
    ax_map.set_xticks(range(len(roles)), roles, rotation=35, ha="right")
    ax_map.set_yticks(range(len(blocks)), blocks)
    for (i, j), value in np.ndenumerate(grid):
        if np.isfinite(value):
            ax_map.text(j, i, f"{value:.2g}", ha="center", va="center", fontsize=8, color="white" if value >= 0.3 else "black")
    ax_map.set_title(f"{report['precision']}: damage of each cell alone\n(share of the gate; 1 = fails alone)", fontsize=10)
    fig.colorbar(image, ax=ax_map, fraction=0.046, label="log10 damage")
    bars = [(r["unit"], r["damage"]) for r in report["ranking"]["blocks"]] + [(r["unit"], r["damage"]) for r in report["ranking"]["roles"]]
    bars += singles
    names = [b[0] for b in bars]
    values = [b[1] for b in bars]
    kept = set(report["kept"])
    colors = ["#c0392b" if v >= 1.0 else "#7f8c8d" for v in values]
    ax_bar.barh(range(len(bars)), values, color=colors)
    ax_bar.set_yticks(range(len(bars)), [f"{n} (kept)" if n in kept else n for n in names], fontsize=8)
    ax_bar.invert_yaxis()
    ax_bar.axvline(1.0, color="black", linestyle="--", linewidth=0.8)
    ax_bar.set_xscale("symlog", linthresh=0.01)
    ax_bar.set_xlabel("damage alone (share of the gate's tolerance)")
    ax_bar.set_title("blocks, roles, patch embedding, head alone", fontsize=10)
    fig.suptitle(f"debug-precision {report['precision']} on {report['eval']['data']}: keep {', '.join(report['kept']) or 'nothing'} "
                 "in higher precision", fontsize=10)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(str(tmp), dpi=110, format="png")
    plt.close(fig)


def render_table(report: dict[str, Any], limit: int = 12) -> Any:
    """A rich Table: the worst units alone, then the keep-set."""
    from rich.table import Table

    table = Table(title=f"debug-precision {report['precision']}: each unit alone in {report['precision']} (worst first)")
    for col in ("unit", "kind", "layers", "damage", "acc", "agree", "cos p1", "alone"):
        table.add_column(col, justify="left" if col in ("unit", "kind", "alone") else "right")
    rows = [r for kind in ("blocks", "roles", "cells") for r in report["ranking"][kind]]
    rows.sort(key=lambda r: -r["damage"])
    for r in rows[:limit]:
        acc = "n/a" if r["accuracy"] is None else f"{r['accuracy']:.2%}"
        extra = f" ({r['overflow_tensors']} overflow)" if r.get("overflow_tensors") else ""
        table.add_row(r["unit"], r["kind"], str(r["layers"]), f"{r['damage']:.3f}", acc, percent(r["top1_agreement"]),
                      f"{r['cosine_p1']:.4f}", ("fails gate" if not r["passed"] else "ok") + extra)
    return table


def damage_matrix(report: dict[str, Any]) -> tuple[list[str], list[str], np.ndarray]:
    """(blocks, roles, damage[block, role]) of the cells in a report (NaN where a block lacks the role)."""
    from .exclusions import CELL_SEP, ROLE_ORDER

    cells = [c for c in report["ranking"]["cells"] if CELL_SEP in c["unit"]]
    blocks = sorted({c["unit"].split(CELL_SEP)[0] for c in cells}, key=lambda b: (len(b), b))
    roles = [r for r in ROLE_ORDER if any(c["unit"].endswith(CELL_SEP + r) for c in cells)]
    grid = np.full((len(blocks), len(roles)), np.nan)
    for c in cells:
        block, role = c["unit"].split(CELL_SEP)
        grid[blocks.index(block), roles.index(role)] = c["damage"]
    return blocks, roles, grid
