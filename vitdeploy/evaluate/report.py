"""What `evaluate` leaves behind: ``reports/evaluate.json`` (schema ``vitdeploy-evaluate/1``),
``evaluate.csv`` (one row per scorer x condition), ``evaluate_strata.csv`` (per class and per
object size), ``evaluate.png`` (accuracy against severity per transform, 95% bands, one line per
scorer), ``evaluate_classes.png`` (class x condition heat table) and a compact terminal summary.

Schema ``vitdeploy-evaluate/1``: ``schema``, ``created``, ``bundle`` (path, source, resolution,
graph sha256s), ``data`` (source, count, per-class counts, sha256, ``unreadable`` files with reasons),
``options``, ``reference`` (PyTorch or why not, and what agreement is measured against),
``scorers`` (id, kind, precision, execution; skipped engines with the reason), ``transforms``
(rule, unit, valid range, severities, occlusion fill), ``strata`` (object-size rule and bins),
``conditions`` (id, transform, severity, applied_to, seed), ``results[scorer][condition]``
(accuracy, ci95, correct, n, drop_pt, agreement, agreement_ci95, agreement_drop_pt, per_class,
per_size, flag), ``resolution`` (rule, native, rows), ``flags``, ``statistics`` (what each number
means), ``timing``.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from ..fileio import atomic_path, atomic_write_json, atomic_write_text

CSV_COLUMNS = ("scorer", "precision", "condition", "transform", "severity", "unit", "n", "correct", "accuracy", "ci95_low",
               "ci95_high", "drop_pt", "agreement", "agreement_ci95_low", "agreement_ci95_high", "agreement_drop_pt", "flag")
STRATA_COLUMNS = ("scorer", "condition", "stratum_kind", "stratum", "n", "correct", "accuracy", "ci95_low", "ci95_high")


def _num(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return "" if value is None else value


def to_csv(report: dict[str, Any]) -> str:
    precision = {s["id"]: s.get("precision") for s in report["scorers"]}
    conds = {c["id"]: c for c in report["conditions"]}
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for scorer, results in report["results"].items():
        for cid, r in results.items():
            c = conds[cid]
            writer.writerow([_num(v) for v in (
                scorer, precision.get(scorer), cid, c["transform"], c["severity"], c["unit"], r["n"], r["correct"], r["accuracy"],
                r["ci95"][0], r["ci95"][1], r.get("drop_pt"), r.get("agreement"), (r.get("agreement_ci95") or [None, None])[0],
                (r.get("agreement_ci95") or [None, None])[1], r.get("agreement_drop_pt"), r.get("flag"))])
    for row in (report.get("resolution") or {}).get("rows", []):
        writer.writerow([_num(v) for v in (
            row["runner"], row["precision"], f"resolution@{row['height']}x{row['width']}", "resolution", f"{row['height']}x{row['width']}",
            "input size", row["n"], row["correct"], row["accuracy"], row["ci95"][0], row["ci95"][1], row.get("drop_pt"),
            None, None, None, None, row.get("flag"))])
    return buf.getvalue()


def strata_csv(report: dict[str, Any]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(STRATA_COLUMNS)
    for scorer, results in report["results"].items():
        for cid, r in results.items():
            for kind in ("per_class", "per_size"):
                for name, s in r.get(kind, {}).items():
                    writer.writerow([_num(v) for v in (scorer, cid, kind[4:], name, s["n"], s["correct"], s["accuracy"], s["ci95"][0], s["ci95"][1])])
    return buf.getvalue()


def write_reports(report: dict[str, Any], out_dir: str | Path, plot: bool = True) -> dict[str, Path]:
    out = Path(out_dir)  # made by the first write (and removed again if the disk refuses it)
    paths = {"json": out / "evaluate.json", "csv": out / "evaluate.csv", "strata_csv": out / "evaluate_strata.csv"}
    atomic_write_json(paths["json"], report)
    atomic_write_text(paths["csv"], to_csv(report))
    atomic_write_text(paths["strata_csv"], strata_csv(report))
    if plot:
        paths["png"] = write_severity_plot(report, out / "evaluate.png")
        paths["classes_png"] = write_class_heat(report, out / "evaluate_classes.png")
    return paths


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_severity_plot(report: dict[str, Any], target: str | Path) -> Path:
    """One panel per transform: accuracy against severity, a line and a 95% band per scorer; the
    clean accuracy is the dashed line of the same colour."""
    plt = _pyplot()
    conds = [c for c in report["conditions"] if c["transform"] != "clean" and not str(c.get("note", "")).startswith("skipped")]
    names = list(dict.fromkeys(c["transform"] for c in conds))
    res_rows = (report.get("resolution") or {}).get("rows", [])
    panels = names + (["resolution"] if res_rows else [])
    if not panels:
        panels = ["clean"]
    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    scorers = list(report["results"])
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, name in enumerate(panels):
        ax = axes[k // cols][k % cols]
        for j, scorer in enumerate(scorers):
            colour = colours[j % len(colours)]
            results = report["results"][scorer]
            if name == "resolution":
                pts = sorted((r["height"] * r["width"], r) for r in res_rows if r["runner"] == scorer)
                xs = [math.sqrt(a) for a, _ in pts]
                entries = [r for _, r in pts]
                ax.set_xlabel("input side (sqrt of H x W), px")
            else:
                cs = sorted((c for c in conds if c["transform"] == name), key=lambda c: c["severity"])
                xs = [c["severity"] for c in cs]
                entries = [results[c["id"]] for c in cs if c["id"] in results]
                ax.set_xlabel(cs[0]["unit"] if cs else "")
            if not entries:
                continue
            acc = [e["accuracy"] * 100 for e in entries]
            ax.plot(xs, acc, marker="o", ms=3, color=colour, label=scorer)
            ax.fill_between(xs, [e["ci95"][0] * 100 for e in entries], [e["ci95"][1] * 100 for e in entries], color=colour, alpha=0.15)
            if "clean" in results:
                ax.axhline(results["clean"]["accuracy"] * 100, color=colour, ls="--", lw=0.8)
        ax.set_title(name, fontsize=10)
        ax.set_ylabel("accuracy, %")
        ax.grid(alpha=0.3)
    for k in range(len(panels), rows * cols):
        axes[k // cols][k % cols].axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=max(1, len(labels)), fontsize=9, frameon=False)
    data = report["data"]
    fig.suptitle(f"{report['bundle']['name']}: accuracy under shift on {data['source']} ({data['count']} images); "
                 "bands: 95% Wilson intervals, dashed: clean", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    return _save(fig, plt, target)


def write_class_heat(report: dict[str, Any], target: str | Path, scorer: str | None = None) -> Path:
    """Class x condition accuracy table for one scorer (the first graph), counts in every cell."""
    plt = _pyplot()
    import numpy as np

    scorer = scorer or next(iter(report["results"]))
    results = report["results"][scorer]
    conds = list(results)
    classes = list(report["data"].get("per_class") or {})
    grid = np.full((len(classes), len(conds)), np.nan)
    text = [["" for _ in conds] for _ in classes]
    for j, cid in enumerate(conds):
        for i, name in enumerate(classes):
            cell = results[cid]["per_class"].get(name)
            if cell:
                grid[i, j] = cell["accuracy"] * 100
                text[i][j] = f"{cell['accuracy'] * 100:.0f}" if not cell["small"] else f"{cell['correct']}/{cell['n']}"
    fig, ax = plt.subplots(figsize=(max(6, 0.42 * len(conds) + 2), max(3, 0.35 * len(classes) + 1.8)))
    im = ax.imshow(grid, aspect="auto", cmap="RdYlGn", vmin=max(0, float(np.nanmin(grid)) if np.isfinite(grid).any() else 0), vmax=100)
    ax.set_xticks(range(len(conds)), conds, rotation=70, ha="right", fontsize=7)
    ax.set_yticks(range(len(classes)), classes, fontsize=8)
    if len(conds) * len(classes) <= 600:
        for i in range(len(classes)):
            for j in range(len(conds)):
                ax.text(j, i, text[i][j], ha="center", va="center", fontsize=5.5)
    fig.colorbar(im, ax=ax, label="accuracy, %")
    ax.set_title(f"{scorer}: accuracy per class (rows) and condition (columns); k/n where a class has < 30 images", fontsize=9)
    fig.tight_layout()
    return _save(fig, plt, target)


def _save(fig: Any, plt: Any, target: str | Path) -> Path:
    target = Path(target)
    with atomic_path(target, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return target


# -- terminal ------------------------------------------------------------------------------------
def render_summary(report: dict[str, Any], console: Any) -> None:
    """Per transform: the clean accuracy, then mean and worst accuracy over its severities, per scorer;
    agreement with the reference at the worst severity. Everything else is in the CSV and JSON."""
    from rich.markup import escape
    from rich.table import Table

    data = report["data"]
    ref = report["reference"]
    console.print(f"[bold]{report['bundle']['name']}[/bold] on {data['source']}: {data['count']} images"
                  + (f", [yellow]{data['unreadable_count']} unreadable (left out, named in the report)[/yellow]" if data["unreadable_count"] else "")
                  + f"; reference: {ref['id'] or 'none'}" + ("" if ref["available"] else f" ({ref['note']})"))
    scorers = list(report["results"])
    table = Table(title=escape("accuracy % (95% CI); per transform: mean over severities / worst [severity] and top-1 "
                                f"agreement (ag) with {ref['agreement_with']} at the worst; ! = flagged"), title_justify="left")
    table.add_column("condition")
    for s in scorers:
        table.add_column(s, justify="right")
    clean_row = ["clean"]
    for s in scorers:
        r = report["results"][s]["clean"]
        clean_row.append(f"{r['accuracy'] * 100:.1f} ({r['ci95'][0] * 100:.1f}-{r['ci95'][1] * 100:.1f})")
    table.add_row(*clean_row)
    by_transform: dict[str, list[dict[str, Any]]] = {}
    for c in report["conditions"]:
        if c["transform"] != "clean":
            by_transform.setdefault(c["transform"], []).append(c)
    for name, conds in by_transform.items():
        row = [name]
        for s in scorers:
            res = [(c, report["results"][s].get(c["id"])) for c in conds]
            res = [(c, r) for c, r in res if r is not None]
            if not res:
                row.append("skipped")
                continue
            mean = sum(r["accuracy"] for _, r in res) / len(res)
            worst_c, worst = min(res, key=lambda cr: cr[1]["accuracy"])
            agree = f" ag {worst['agreement'] * 100:.0f}" if "agreement" in worst else ""
            flag = " [red]![/red]" if any(r.get("flag") for _, r in res) else ""
            row.append(escape(f"{mean * 100:.1f} / {worst['accuracy'] * 100:.1f} [{worst_c['severity']:g}]{agree}") + flag)
        table.add_row(*row)
    res_rows = (report.get("resolution") or {}).get("rows", [])
    if res_rows:
        sizes = list(dict.fromkeys((r["height"], r["width"]) for r in res_rows))
        for h, w in sizes:
            row = [f"resolution {h}x{w}"]
            for s in scorers:
                r = next((x for x in res_rows if x["runner"] == s and (x["height"], x["width"]) == (h, w)), None)
                row.append("" if r is None else f"{r['accuracy'] * 100:.1f}" + (" [red]![/red]" if r.get("flag") else ""))
            table.add_row(*row)
    console.print(table)
    for flag in report["flags"][:10]:
        console.print(f"[red]flag[/red] {flag}")
    if len(report["flags"]) > 10:
        console.print(f"... and {len(report['flags']) - 10} more flags (evaluate.json)")
    skipped = [s for s in report["scorers"] if s.get("skipped")]
    for s in skipped:
        console.print(f"[dim]{s['id']}: skipped: {s['skipped']}[/dim]")
    console.print(f"[dim]{report['wall_s']:.1f} s; per-class and per-size strata in evaluate_strata.csv; rules in evaluate.json[/dim]")


class BarProgress:
    """A rich progress bar on stderr for the scorer passes (conditions x scorers)."""

    def __init__(self, console: Any):
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

        from ..console import lazy_progress

        self._progress = lazy_progress(console, TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        self._task = None

    def __enter__(self) -> "BarProgress":
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.__exit__(*exc)

    def begin(self, total: int) -> None:
        self._task = self._progress.add_task("evaluate", total=total)

    def step(self, label: str) -> None:
        if self._task is not None:
            self._progress.update(self._task, advance=1, description=f"evaluate {label:<40.40}")
