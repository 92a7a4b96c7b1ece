"""`vitdeploy profile`: latency and throughput across resolution x batch x precision x backend,
each cell beside the analytic cost (chapter §39.5) and the machine's measured GEMM peak.

    plan.py           what was asked (SweepConfig), validated; the cells in run order, impossible ones skipped with why
    cells.py          what runs one cell (the runner and its feeds) and what it is timed on
    measure.py        one runner, one batch: start-up, latency distribution, throughput, memory, CV
    gemm_probe.py     this machine's dense-GEMM ceiling, measured in the same run
    sweep.py          the matrix of cells over the runner interface, with the cost model per cell
    rows.py           one row per cell (the schema of profile.csv/json) and what is said about the machine
    accuracy.py       --accuracy: the accuracy of what each cell timed
    variable.py       variable-size bundles: fill-ratio sizes (declared rule), the masked PyTorch forward
    tegrastats.py     Jetson telemetry: tegrastats parser and sampler, nvpmodel / jetson_clocks state
    report.py         terminal table + progress bar, reports/profile.csv / .json / .png
    merge_report.py   --merge-tokens: the latency/accuracy trade-off table and plot against the cost model's speed-up
    layers.py         trtexec's per-layer exports parsed (--exportProfile, --dumpProfile, --exportLayerInfo)
    layer_modules.py  TensorRT layers -> the ViT's PyTorch modules through the ONNX node names; time per block
    layer_report.py   --layers: which ViT block costs what inside a TensorRT engine

Only numpy (and the runners' own runtimes, imported when a cell needs them) at import time.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bundle import Bundle
from ..fileio import signals_deferred
from .measure import LatencyStats, Measurement, measure, summarize
from .sweep import BACKENDS, PRECISIONS, Cell, SweepConfig, SweepResult, plan_cells, run_sweep
from .tegrastats import TegraSample, parse_tegrastats_line

__all__ = [
    "BACKENDS", "PRECISIONS", "Cell", "LatencyStats", "Measurement", "ProfileOutcome", "SweepConfig", "SweepResult",
    "TegraSample", "measure", "parse_tegrastats_line", "plan_cells", "profile_bundle", "run_sweep", "summarize",
]


@dataclass
class ProfileOutcome:
    result: SweepResult
    paths: dict[str, Path]  # csv, json and (when plotted) png


def profile_bundle(
    path: str | Path,
    config: SweepConfig,
    out_dir: str | Path | None = None,
    plot: bool = True,
    progress_console: Any | None = None,
    accuracy: str | None = None,
) -> ProfileOutcome:
    """Profile a bundle (or a vitdeploy .onnx), write the reports and record them in the manifest.

    Reports go to ``out_dir`` or the bundle's ``reports/`` folder; the manifest gets a ``profile``
    record only when they go into the bundle itself.
    """
    from .report import SweepProgress, write_reports

    bundle = Bundle.open(path)
    if accuracy:
        from ..contract import InputContract

        if InputContract.from_bundle(bundle).mixes_sizes:
            from ..errors import UserError

            raise UserError("--accuracy scores single-size graphs; for a variable-size bundle `vitdeploy check` scores the "
                            "labelled data at mixed sizes and aspect ratios")
        from .accuracy import check_source

        check_source(accuracy)  # before the sweep, not after minutes of timing
    progress = SweepProgress(progress_console) if progress_console is not None else None
    with progress if progress is not None else contextlib.nullcontext():
        result = run_sweep(
            bundle,
            config,
            on_start=progress.on_start if progress else None,
            on_done=progress.on_done if progress else None,
            on_round=progress.on_round if progress else None,
        )
    if accuracy:  # `--accuracy SOURCE`: the accuracy of what each cell timed (vitdeploy.profile.accuracy)
        from .accuracy import add_accuracy

        add_accuracy(bundle, result, accuracy, config, int(result.machine.get("threads") or 1))
    target = Path(out_dir) if out_dir is not None else bundle.reports_dir()
    with signals_deferred():  # the reports and the manifest's record of them land together
        paths = write_reports(result, target, plot=plot)
        if accuracy and plot:
            from .accuracy import write_accuracy_plot

            accuracy_png = write_accuracy_plot(result, target / "profile_accuracy.png")
            if accuracy_png is not None:
                paths["accuracy_png"] = accuracy_png
        if out_dir is None and bundle.bare_onnx is None:
            statuses = [r["status"] for r in result.rows]
            bundle.set_record("profile", {
                "created": result.started,
                "files": {k: str(p.relative_to(bundle.root)) for k, p in paths.items()},
                "cells": len(statuses),
                "ok": statuses.count("ok"),
                "skipped": statuses.count("skipped"),
                "failed": statuses.count("failed"),
                "machine": result.machine.get("gpu") or result.machine.get("cpu"),
                "threads": result.machine.get("threads"),
            })
    return ProfileOutcome(result, paths)
