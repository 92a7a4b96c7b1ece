"""The profile's rows: one dict per cell (the schema of profile.csv/json; columns in report.COLUMNS), and
what the report says about the machine."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

import numpy as np

from ..contract import InputContract
from ..costs import CostReport
from ..errors import VitDeployError
from ..lazy import available
from . import gemm_probe, tegrastats
from .measure import Measurement, cpu_affinity
from .plan import Cell


def machine_info(threads: int, backends: list[str], cells: list[Cell]) -> dict[str, Any]:
    cpu_model = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "hardware")):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_model or platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "cpu_affinity": cpu_affinity(),
        "threads": threads,
        "python": platform.python_version(),
        "numpy": np.__version__,
        # Other processes share the cores: the 1/5/15-minute load when the report was written
        # explains unstable cells better than any statistic.
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    if "ort" in backends and available("onnxruntime"):
        import onnxruntime as ort

        info["onnxruntime"] = ort.__version__
        info["onnxruntime_providers"] = ort.get_available_providers()
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    info["jetson"] = tegrastats.jetson_power_state()
    return info


def make_row(cell: Cell, cost: CostReport, graph: str | None, status: str, note: str = "", m: Measurement | None = None,
         peak: gemm_probe.PeakProbe | None = None, tegra: dict[str, Any] | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "backend": cell.backend,
        # what ran (auto resolved by the runner), else what was asked for
        "torch_mode": ((m.runner.get("torch_mode") if m else None) or cell.torch_mode) if cell.backend == "torch" else None,
        "precision": cell.precision,
        "device": m.runner.get("device") if m else None,
        "height": cell.height,
        "width": cell.width,
        "batch": cell.batch,
        "status": status,
        "note": note,
        "graph": graph,
        "seq_len": cost.seq_len,
        "macs": cost.macs_total,
        "flops": cost.flops_total,
        "attention_share": cost.attention_share,
        "crossover_seq_len": cost.crossover_seq_len,
    }
    if cell.merge is not None:  # --merge-tokens cells: r tokens merged in every block of the graph timed
        row["merge_r"] = cell.merge
    if cell.fill is not None:  # variable-size cells: height x width is the canvas the graph computes in full
        row.update({"canvas": f"{cell.height}x{cell.width}", "fill": cell.fill, "fill_actual": cell.fill_actual})
    if m is not None:
        lat = m.latency
        gflops = cost.flops_total / lat.p50_s / 1e9 if lat.p50_s > 0 else None
        row.update({
            "threads": m.runner.get("threads"),
            "warmup": m.warmup,
            "iterations": lat.n,
            "p50_ms": lat.p50_s * 1e3,
            "p90_ms": lat.p90_s * 1e3,
            "p99_ms": lat.p99_s * 1e3,
            "mean_ms": lat.mean_s * 1e3,
            "std_ms": lat.std_s * 1e3,
            "min_ms": lat.min_s * 1e3,
            "max_ms": lat.max_s * 1e3,
            "cv": lat.cv,
            "unstable": m.unstable,
            "device_p50_ms": m.device_latency.p50_s * 1e3 if m.device_latency else None,
            "throughput_ips": m.throughput_ips,
            "startup_s": m.startup_s,
            "load_s": m.load_s,
            "peak_rss_mb": m.peak_rss_mb,
            "rss_added_mb": m.rss_added_mb,
            "rss_scope": m.rss_scope,
            "gpu_mem_mb": m.gpu_mem_mb,
            "achieved_gflops": gflops,
            "peak_gflops": peak.gflops if peak else None,
            "peak_share": gflops / peak.gflops if (peak and gflops) else None,
        })
    if tegra:
        row.update({
            "jetson_power_mw": tegra.get("input_power_mw_mean"),
            "jetson_gpu_load_pct": tegra.get("gpu_load_pct_mean"),
            "jetson_ram_used_mb": tegra.get("ram_used_mb_max"),
        })
        row["tegrastats"] = tegra
    return row


def contract_record(contract: InputContract) -> dict[str, Any]:
    """profile.json's record of a contract whose calls mix sizes (a canvas): its inputs and how fill sizes
    were drawn; nothing for one size per call (the record stays as it was)."""
    if not contract.mixes_sizes:
        return {}
    from .variable import FILL_RULE

    return {"variable_size": {"canvas": list(contract.size), "valid_input": contract.input_names[1],
                              "round_to": list(contract.patch), "fill_rule": FILL_RULE,
                              "cost_model": "macs/flops count the whole canvas: the graph computes every position and masks the padded keys"}}


def failure_note(exc: BaseException) -> str:
    if isinstance(exc, VitDeployError):
        return str(exc)
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0] if first else ''}"
