"""What a profile leaves behind: a terminal table (with a progress bar while the sweep runs),
``reports/profile.csv``, ``reports/profile.json`` and ``reports/profile.png``.

Schema ``vitdeploy-profile/1``
------------------------------
``profile.csv`` has one row per cell and exactly the columns of :data:`COLUMNS`, in that order
(empty where a value does not apply: a skipped cell has no latency, a CPU run no GPU memory); for a
variable-size bundle :data:`VARIABLE_COLUMNS` (canvas, fill, fill_actual) follow ``width``.

``profile.json`` is an object with:

* ``schema``: ``"vitdeploy-profile/1"``; ``created``: ISO time; ``wall_s``: the sweep's duration;
* ``bundle``: path, name, source, spec, resolution mode, precisions present;
* ``config``: the sweep request (resolutions, batches, precisions, backends, iterations or duration,
  warm-up, threads, device, CV threshold, ORT optimisation level, seed);
* ``machine``: platform, CPU model, CPU count and affinity, threads, ``pinned_cpus`` (with --pin),
  ``loadavg`` (other processes sharing the cores), library versions, GPU name, ``jetson``
  (nvpmodel mode, jetson_clocks state) or null;
* ``peaks``: the GEMM probes (device, dtype, library, n, threads, runs, best_s, gflops);
* ``cost_model``: the counting convention, the attention/MLP crossover L = (2 + rho) d, params;
* ``columns``: :data:`COLUMNS` (name -> meaning and unit);
* ``cells``: one object per cell with the CSV columns as keys, plus ``tegrastats`` (the cell's
  aggregated Jetson samples) where tegrastats ran.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from ..fileio import atomic_path, atomic_write_json, atomic_write_text
from .sweep import Cell, SweepResult

SCHEMA = "vitdeploy-profile/1"

COLUMNS: dict[str, str] = {
    "backend": "ort (ONNX Runtime), torch (PyTorch; see torch_mode) or tensorrt",
    "torch_mode": "torch backend: eager, cuda-graph or compile (what ran; --torch-mode auto picks the fastest without compiling)",
    "precision": "fp32, fp16 or int8: which graph (ort/tensorrt) or dtype (torch) ran",
    "device": "where it ran: cpu, cuda:0 (from the runner)",
    "height": "input height, pixels",
    "width": "input width, pixels",
    "batch": "images per inference call",
    "status": "ok, skipped (the cell cannot exist; see note) or failed (error in note)",
    "note": "why a cell was skipped or failed, or the instability warning",
    "graph": "the graph file (relative to the bundle) or model that ran",
    "seq_len": "L = patches + prefix tokens at this size (cost model)",
    "macs": "multiply-adds per call for the whole batch (cost model, vitdeploy.costs.vit_costs(...).macs_total)",
    "flops": "2 x macs",
    "attention_share": "share of the MACs in the two attention matmuls (QK^T and AV)",
    "crossover_seq_len": "L at which attention MACs equal projection+MLP MACs: (2 + rho) d",
    "threads": "intra-op threads the runner was pinned to (CPU backends)",
    "warmup": "untimed calls before the timed loop",
    "iterations": "timed calls",
    "p50_ms": "median latency of one call, ms (host wall time)",
    "p90_ms": "90th percentile latency, ms",
    "p99_ms": "99th percentile latency, ms",
    "mean_ms": "mean latency, ms",
    "std_ms": "sample standard deviation of the latency, ms",
    "min_ms": "fastest call, ms",
    "max_ms": "slowest call, ms",
    "cv": "coefficient of variation, std / mean",
    "unstable": "true when cv exceeds the threshold (config.cv_threshold)",
    "device_p50_ms": "median device time from CUDA events (tensorrt; torch on CUDA: the forward without the copies), ms",
    "throughput_ips": "images per second over the timed loop: batch x iterations / total time",
    "startup_s": "runner load (session / engine / model) to first result, s",
    "load_s": "runner construction alone, s",
    "peak_rss_mb": "peak resident memory of the process during the cell (VmHWM), MiB",
    "rss_added_mb": "peak_rss_mb minus the resident memory before the cell's runner was loaded: what the cell added, MiB",
    "rss_scope": "cell: the peak was reset before this cell; process: peak since the process started",
    "gpu_mem_mb": ("device memory the cell held, MiB; torch: its allocator's peak minus what was allocated before the cell "
                   "(weights, buffers, activations); ort/tensorrt: driver used after the loop minus before load; empty without a GPU"),
    "achieved_gflops": "flops / p50 latency / 1e9",
    "peak_gflops": "the machine's GEMM peak for this device and precision class, measured in this run",
    "peak_share": "achieved_gflops / peak_gflops",
    "jetson_power_mw": "mean input-rail power during the cell (VDD_IN / POM_5V_IN), mW; Jetson only",
    "jetson_gpu_load_pct": "mean GR3D (GPU) load during the cell, %; Jetson only",
    "jetson_ram_used_mb": "highest RAM in use during the cell (CPU + GPU share it), MB; Jetson only",
    # with --accuracy SOURCE (vitdeploy.profile.accuracy); empty otherwise
    "accuracy": "top-1 accuracy of this cell's runner on the --accuracy data at this size (same for every batch size)",
    "accuracy_ci95_low": "95% Wilson interval of the accuracy, lower bound",
    "accuracy_ci95_high": "95% Wilson interval of the accuracy, upper bound",
    "accuracy_n": "labelled images scored for the accuracy",
}

# Variable-size bundles (images in a canvas + valid_hw): these columns follow ``width`` in their reports
# only, so single-size reports keep exactly :data:`COLUMNS`.
VARIABLE_COLUMNS: dict[str, str] = {
    "canvas": "variable-size bundles: the canvas HxW the images are padded into (height and width above); the graph computes all of it",
    "fill": "variable-size bundles: the fill ratio asked for, mean valid area / canvas area (--fill)",
    "fill_actual": "variable-size bundles: the mean valid area / canvas area of the whole-patch sizes drawn for this cell",
}


# --merge-tokens sweeps (exporters/token_merge.py): this column follows ``width`` in their reports only.
MERGE_COLUMNS: dict[str, str] = {
    "merge_r": "--merge-tokens: tokens merged in every block of the graph timed (0: unmerged)",
    "agreement_unmerged": "--merge-tokens with --accuracy: top-1 agreement with the unmerged (r=0) graph of the same cell",
}


def columns_for(rows: list[dict[str, Any]]) -> dict[str, str]:
    """The report's columns: :data:`COLUMNS`, with :data:`VARIABLE_COLUMNS` after ``width`` when a row has a fill
    (and :data:`MERGE_COLUMNS` when a row has a merge r)."""
    fills, merges = any(r.get("fill") is not None for r in rows), any(r.get("merge_r") is not None for r in rows)
    if not fills and not merges:
        return COLUMNS
    out: dict[str, str] = {}
    for name, meaning in COLUMNS.items():
        out[name] = meaning
        if name == "width":
            out.update({**(VARIABLE_COLUMNS if fills else {}), **(MERGE_COLUMNS if merges else {})})
    return out


def _cell_dict(row: dict[str, Any], columns: dict[str, str] = COLUMNS) -> dict[str, Any]:
    out = {name: row.get(name) for name in columns}
    if "tegrastats" in row:
        out["tegrastats"] = row["tegrastats"]
    return out


def to_json(result: SweepResult) -> dict[str, Any]:
    columns = columns_for(result.rows)
    return {
        "schema": SCHEMA,
        "created": result.started,
        "wall_s": result.wall_s,
        "bundle": result.bundle,
        "config": result.config,
        "machine": result.machine,
        "peaks": [p.to_dict() for p in result.peaks],
        "cost_model": result.cost_model,
        "columns": columns,
        "cells": [_cell_dict(r, columns) for r in result.rows],
    }


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return value


def to_csv(result: SweepResult) -> str:
    buf = io.StringIO()
    columns = columns_for(result.rows)
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in result.rows:
        writer.writerow({k: _csv_value(row.get(k)) for k in columns})
    return buf.getvalue()


def write_reports(result: SweepResult, out_dir: str | Path, plot: bool = True) -> dict[str, Path]:
    """Write profile.csv, profile.json and (unless ``plot`` is false) profile.png, each atomically."""
    out_dir = Path(out_dir)
    paths = {
        "csv": atomic_write_text(out_dir / "profile.csv", to_csv(result)),
        "json": atomic_write_json(out_dir / "profile.json", to_json(result)),
    }
    if plot and any(r["status"] == "ok" for r in result.rows):
        paths["png"] = write_plot(result, out_dir / "profile.png")
    return paths


# -- plot --------------------------------------------------------------------------------------
def write_plot(result: SweepResult, target: str | Path) -> Path:
    """Latency (p50) and throughput against resolution, one line per backend x precision (a line
    style per batch size), with the cost model's GMACs per image on a second axis."""
    from ..lazy import require

    require("matplotlib", "the profile plot (or pass --no-plot)")
    # The object-oriented API with an Agg canvas: no pyplot global state, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ok = [r for r in result.rows if r["status"] == "ok"]
    if any(r.get("fill") is not None for r in ok):
        return _write_fill_plot(result, ok, target, Figure, FigureCanvasAgg)
    if any(r.get("merge_r") is not None for r in ok):  # --merge-tokens: latency and accuracy against r
        from .merge_report import write_merge_plot

        return write_merge_plot(result, ok, target, Figure, FigureCanvasAgg)
    sizes = sorted({(r["height"], r["width"]) for r in result.rows}, key=lambda hw: hw[0] * hw[1])
    xpos = {hw: math.sqrt(hw[0] * hw[1]) for hw in sizes}
    batches = sorted({r["batch"] for r in ok})
    series = sorted({(r["backend"], r["precision"]) for r in ok})
    styles = ["-", "--", ":", "-."]
    colours = [f"C{i}" for i in range(10)]

    fig = Figure(figsize=(12, 4.8), dpi=110)
    FigureCanvasAgg(fig)
    ax_lat, ax_thr = fig.subplots(1, 2)
    for si, (backend, precision) in enumerate(series):
        for bi, batch in enumerate(batches):
            pts = sorted(((xpos[(r["height"], r["width"])], r) for r in ok
                          if r["backend"] == backend and r["precision"] == precision and r["batch"] == batch), key=lambda t: t[0])
            if not pts:
                continue
            xs = [p[0] for p in pts]
            style = dict(color=colours[si % 10], linestyle=styles[bi % 4], marker="o", markersize=4)
            label = f"{backend} {precision} b{batch}"
            ax_lat.plot(xs, [p[1]["p50_ms"] for p in pts], label=label, **style)
            ax_thr.plot(xs, [p[1]["throughput_ips"] for p in pts], label=label, **style)

    # Analytic cost per image (batch-independent) on a second axis of each panel.
    cost_rows = {}
    for r in result.rows:
        cost_rows.setdefault((r["height"], r["width"]), r["macs"] / r["batch"])
    cx = [xpos[hw] for hw in sizes]
    cy = [cost_rows[hw] / 1e9 for hw in sizes]
    cost_handle = None
    for ax in (ax_lat, ax_thr):
        twin = ax.twinx()
        (cost_handle,) = twin.plot(cx, cy, color="0.45", linestyle="-", linewidth=2.5, alpha=0.35, label="cost model: GMACs / image")
        twin.set_ylabel("cost model: GMACs per image", color="0.35")
        twin.tick_params(axis="y", colors="0.35")
        if ax is ax_lat:
            _same_decades(ax, twin, [r["p50_ms"] for r in ok], cy)  # both log, same span: parallel lines = latency grows as the MACs do
        else:
            twin.set_ylim(bottom=0)
        ax.set_xticks(cx)
        ax.set_xticklabels([f"{h}x{w}" if h != w else str(h) for h, w in sizes])
        ax.set_xlabel("input resolution (pixels)")
        ax.grid(True, alpha=0.3)
        ax.set_zorder(twin.get_zorder() + 1)
        ax.patch.set_visible(False)
    ax_lat.set_ylabel("p50 latency per call (ms)")
    ax_lat.set_title("latency")
    ax_thr.set_ylabel("throughput (images/s)")
    ax_thr.set_title("throughput")
    handles, labels = ax_lat.get_legend_handles_labels()
    if cost_handle is not None:
        handles, labels = handles + [cost_handle], labels + [cost_handle.get_label()]
    ax_lat.legend(handles, labels, fontsize=7, loc="upper left")
    name = result.bundle.get("name", "")
    machine = result.machine.get("gpu") or result.machine.get("cpu") or ""
    fig.suptitle(f"vitdeploy profile: {name} on {machine} ({result.machine.get('threads')} threads)", fontsize=10)
    fig.tight_layout()
    with atomic_path(target, suffix=".png") as tmp:
        fig.savefig(tmp, format="png")
    return Path(target)


def _write_fill_plot(result: SweepResult, ok: list[dict[str, Any]], target: str | Path, figure: Any, canvas: Any) -> Path:
    """Variable-size bundles: latency (p50) and throughput against the fill ratio, one line per
    backend x precision x canvas x batch. The graph computes the whole canvas at every fill, so a
    line that is not flat is the runtime's kernels reacting to masked rows."""
    fig = figure(figsize=(12, 4.8), dpi=110)
    canvas(fig)
    ax_lat, ax_thr = fig.subplots(1, 2)
    series = sorted({(r["backend"], r["precision"], r["height"], r["width"], r["batch"]) for r in ok})
    styles = ["-", "--", ":", "-."]
    for si, (backend, precision, h, w, batch) in enumerate(series):
        pts = sorted((r["fill"], r) for r in ok
                     if (r["backend"], r["precision"], r["height"], r["width"], r["batch"]) == (backend, precision, h, w, batch))
        style = dict(color=f"C{si % 10}", linestyle=styles[(si // 10) % 4], marker="o", markersize=4)
        label = f"{backend} {precision} {h}x{w} b{batch}"
        ax_lat.plot([p[0] for p in pts], [p[1]["p50_ms"] for p in pts], label=label, **style)
        ax_thr.plot([p[0] for p in pts], [p[1]["throughput_ips"] for p in pts], label=label, **style)
    for ax, title, ylabel in ((ax_lat, "latency", "p50 latency per call (ms)"), (ax_thr, "throughput", "throughput (images/s)")):
        ax.set_xlabel("fill ratio (mean valid area / canvas area)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.set_xlim(0, 1.05)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    ax_lat.legend(fontsize=7, loc="best")
    machine = result.machine.get("gpu") or result.machine.get("cpu") or ""
    fig.suptitle(f"vitdeploy profile (variable size): {result.bundle.get('name', '')} on {machine} "
                 f"({result.machine.get('threads')} threads)", fontsize=10)
    fig.tight_layout()
    with atomic_path(target, suffix=".png") as tmp:
        fig.savefig(tmp, format="png")
    return Path(target)


def _same_decades(ax: Any, twin: Any, values: list[float], cost: list[float]) -> None:
    """Log scale on both axes with the same ratio top/bottom, each centred on its own data."""
    lo, hi = min(values), max(values)
    cmin, cmax = min(cost), max(cost)
    span = max(hi / lo, cmax / cmin) * 1.3
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _pos: f"{v:g}")  # 200, not 2 x 10^2
    # minor ticks: label only 2x and 5x a power of ten, or a short axis fills with numbers
    sparse = FuncFormatter(lambda v, _pos: f"{v:g}" if f"{v:.0e}"[0] in "25" else "")
    for axis, a, b in ((ax, lo, hi), (twin, cmin, cmax)):
        centre = math.sqrt(a * b)
        axis.set_yscale("log")
        axis.set_ylim(centre / math.sqrt(span), centre * math.sqrt(span))
        axis.yaxis.set_major_formatter(plain)
        axis.yaxis.set_minor_formatter(sparse)


# -- terminal ----------------------------------------------------------------------------------
def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


TABLE_WIDTH = 120  # the default table fits this many terminal columns; --wide shows every column


def render_table(result: SweepResult, console: Any, wide: bool = False) -> None:
    """The sweep as a terminal table.

    By default a compact table that fits :data:`TABLE_WIDTH` columns: one row per measured (or
    failed) cell with latency, throughput, efficiency and memory; cells that cannot exist are one
    summary line under it, and failures and instability are listed beneath, one line each.
    ``wide``: every column, every cell, notes inline (the CSV/JSON always hold everything).
    """
    if wide:
        _render_wide(result, console)
    else:
        _render_compact(result, console)
    _render_footer(result, console)


def _render_compact(result: SweepResult, console: Any) -> None:
    from rich import box
    from rich.table import Table

    title = f"profile: {result.bundle.get('name')}  ({result.machine.get('cpu') or ''}, {result.machine.get('threads')} threads)"
    # one space between columns (no vertical rules): 14 columns of numbers fit 120 terminal columns
    table = Table(title=title[:TABLE_WIDTH], title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  padding=(0, 1), collapse_padding=True)
    # GPU runs show device time and device memory in place of the attention share and added RSS
    gpu_cols = any(r.get("device_p50_ms") is not None or r.get("gpu_mem_mb") is not None for r in result.rows)
    tail = (("dev ms", "right"), ("GPU MiB", "right")) if gpu_cols else (("attn", "right"), ("+RSS", "right"))
    # variable-size bundles: the size is the canvas, and a fill column (mean valid area / canvas) follows it
    fills = any(r.get("fill") is not None for r in result.rows)
    head = (("cell", "left"), ("canvas", "right"), ("fill", "right")) if fills else (("cell", "left"), ("size", "right"))
    for name, justify in head + (("batch", "right"), ("L", "right"), ("p50 ms", "right"),
                          ("p99 ms", "right"), ("CV", "right"), ("img/s", "right"), ("GMAC", "right"), ("GFLOP/s", "right"),
                          ("% peak", "right"), ("RSS MiB", "right")) + tail:
        table.add_column(name, justify=justify, no_wrap=True)
    for r in result.rows:
        if r["status"] == "skipped":
            continue  # summarised in one line under the table
        ok = r["status"] == "ok"
        cv = _fmt(r.get("cv"), ".1%") if ok else "-"
        if ok and r.get("unstable"):
            cv = f"[yellow]{cv}*[/]"
        p50 = _fmt(r.get("p50_ms"), ".2f") if ok else "[red]failed[/]"
        last = ((_fmt(r.get("device_p50_ms"), ".3f"), _fmt(r.get("gpu_mem_mb"), ".0f")) if gpu_cols
                else (_fmt(r["attention_share"], ".0%"), _fmt(r.get("rss_added_mb"), ".0f")))
        merge = f" r{r['merge_r']}" if r.get("merge_r") is not None else ""  # --merge-tokens
        size = (f"{r['height']}x{r['width']}{merge}",) + ((_fmt(r.get("fill"), ".2f"),) if fills else ())
        table.add_row(
            _cell_name(r), *size, str(r["batch"]), str(r["seq_len"]), p50,
            _fmt(r.get("p99_ms"), ".2f"), cv, _fmt(r.get("throughput_ips"), ".1f"), _fmt(r["macs"] / 1e9, ".2f"),
            _fmt(r.get("achieved_gflops"), ".1f"), _fmt(r.get("peak_share"), ".0%"), _fmt(r.get("peak_rss_mb"), ".0f"), *last,
        )
    if table.row_count:
        console.print(table)
    skipped = skipped_summary(result.rows)
    if skipped:
        console.print(f"[dim]{skipped}[/]", soft_wrap=True)
    for r in result.rows:
        if r["status"] == "failed":
            fill = f" fill {r['fill']:g}" if r.get("fill") is not None else ""
            console.print(f"[red]failed: {_cell_name(r)} {r['height']}x{r['width']}{fill} b{r['batch']}: {r.get('note') or ''}[/]",
                          soft_wrap=True)


def _cell_name(r: dict[str, Any]) -> str:
    mode = f" {r['torch_mode']}" if r.get("torch_mode") else ""
    return f"{r['backend']}{mode} {r['precision']}"


def skipped_summary(rows: list[dict[str, Any]]) -> str:
    """Every skipped cell in one line, grouped by backend, precision and reason."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r["status"] == "skipped":
            groups.setdefault((_cell_name(r), r.get("note") or ""), []).append(r)
    if not groups:
        return ""
    total = sum(len(g) for g in groups.values())
    # the reason's first clause: the full text is in --wide, the CSV and the JSON
    parts = [f"{name} x{len(cells)} ({reason.split(';')[0].strip()})" for (name, reason), cells in groups.items()]
    return f"skipped {total} of {len(rows)} cells (--wide lists them): " + "; ".join(parts)


def _render_wide(result: SweepResult, console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"profile: {result.bundle.get('name')}  ({result.machine.get('cpu') or ''}, {result.machine.get('threads')} threads)",
                  title_justify="left")
    for name, justify in (("backend", "left"), ("prec", "left"), ("size", "right"), ("batch", "right"), ("L", "right"),
                          ("p50 ms", "right"), ("p90 ms", "right"), ("p99 ms", "right"), ("CV", "right"), ("img/s", "right"),
                          ("GMAC", "right"), ("GFLOP/s", "right"), ("% peak", "right"), ("attn", "right"),
                          ("start s", "right"), ("RSS MiB", "right"), ("+RSS", "right"), ("note", "left")):
        table.add_column(name, justify=justify, no_wrap=name != "note")
    # GPU runs: device time (CUDA events) and device memory beside the host numbers
    gpu_cols = any(r.get("device_p50_ms") is not None or r.get("gpu_mem_mb") is not None for r in result.rows)
    if gpu_cols:
        table.add_column("dev p50 ms", justify="right", no_wrap=True)
        table.add_column("GPU MiB", justify="right", no_wrap=True)
    for r in result.rows:
        ok = r["status"] == "ok"
        cv = _fmt(r.get("cv"), ".1%") if ok else "-"
        if ok and r.get("unstable"):
            cv = f"[yellow]{cv}[/]"
        note = r.get("note") or ""
        if r["status"] == "failed":
            note = f"[red]failed: {note}[/]"
        elif r["status"] == "skipped":
            note = f"[dim]skipped: {note}[/]"
        # variable-size cells: canvas and fill ratio, e.g. 48x48 fill 0.5
        size = (f"{r['height']}x{r['width']}" + (f" fill {r['fill']:g}" if r.get("fill") is not None else "")
                + (f" r{r['merge_r']}" if r.get("merge_r") is not None else ""))
        extra = (_fmt(r.get("device_p50_ms"), ".3f"), _fmt(r.get("gpu_mem_mb"), ".0f")) if gpu_cols else ()
        table.add_row(
            r["backend"] + (f" {r['torch_mode']}" if r.get("torch_mode") else ""), r["precision"], size, str(r["batch"]), str(r["seq_len"]),
            _fmt(r.get("p50_ms"), ".2f"), _fmt(r.get("p90_ms"), ".2f"), _fmt(r.get("p99_ms"), ".2f"), cv,
            _fmt(r.get("throughput_ips"), ".1f"), _fmt(r["macs"] / 1e9, ".2f"), _fmt(r.get("achieved_gflops"), ".1f"),
            _fmt(r.get("peak_share"), ".0%"), _fmt(r["attention_share"], ".1%"), _fmt(r.get("startup_s"), ".2f"),
            _fmt(r.get("peak_rss_mb"), ".0f"), _fmt(r.get("rss_added_mb"), ".0f"), note, *extra,
        )
    console.print(table)


def _render_footer(result: SweepResult, console: Any) -> None:
    graphs = sorted({str(r.get("graph")) for r in result.rows if r["backend"] == "ort" and r["status"] == "ok" and r.get("graph")})
    if any(g.endswith("model.cpu.onnx") for g in graphs):
        console.print("ort fp32 ran model.cpu.onnx (attention fused for CPUs; --plain-graph runs model.onnx)")
    peaks = ", ".join(f"{p.library} {p.dtype} {p.gflops:.0f} GFLOP/s" for p in result.peaks)
    console.print(f"GEMM peak probes (n={result.peaks[0].n if result.peaks else '-'}): {peaks}")
    console.print(f"attention/MLP crossover at L = (2 + rho) d = {result.cost_model['crossover_seq_len']:.0f} tokens")
    jetson = result.machine.get("jetson")
    if jetson:
        from .tegrastats import describe_power_state

        console.print(f"Jetson: {describe_power_state(jetson)}")
    unstable = [r for r in result.rows if r.get("unstable")]
    if unstable:
        console.print(f"[yellow]warning: {len(unstable)} cell(s) unstable (* CV > {result.config['cv_threshold']:.0%}): "
                      "busy or throttling machine; rerun with more --iterations or on a quiet one[/]")


class SweepProgress:
    """A rich progress bar on stderr while the sweep runs; feeds run_sweep's callbacks."""

    def __init__(self, console: Any):
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

        from ..console import lazy_progress

        # starts with the first cell: a sweep refused before it times anything prints no blank line
        self.progress = lazy_progress(console, TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        self.task: Any = None
        self.round_task: Any = None

    def __enter__(self) -> "SweepProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def on_start(self, cell: Cell, index: int, total: int) -> None:
        if self.task is None:
            self.task = self.progress.add_task("profiling", total=total)
        self.progress.update(self.task, description=f"profiling {cell.label}")

    def on_round(self, index: int, total: int) -> None:
        if self.round_task is None:
            self.round_task = self.progress.add_task("timing cells in interleaved rounds", total=total)
        self.progress.update(self.round_task, completed=index, description=f"round {index + 1}/{total}")

    def on_done(self, cell: Cell, row: dict[str, Any]) -> None:
        self.progress.advance(self.task)
        if row["status"] == "ok":
            self.progress.console.log(f"{cell.label}: p50 {row['p50_ms']:.2f} ms, {row['throughput_ips']:.1f} img/s")

