"""The profile matrix: backend x precision x resolution x batch, each cell measured through the
runner interface and set beside what the cost model says it should cost.

A cell is one (backend, precision, height, width, batch). Each gets its own runner load (so start-up
and peak memory belong to it), a synthetic input batch of the graph's own input type, and:

* from the cost model (vitdeploy.costs, chapter §39.5): multiply-adds, attention share, L and the
  attention/MLP crossover L = (2 + rho) d;
* from the clock: the latency distribution, throughput, start-up, memory (vitdeploy.profile.measure);
* achieved GFLOP/s = 2 x MACs / p50 latency, and its share of the machine's GEMM peak measured in the
  same run (vitdeploy.profile.gemm_probe);
* on a Jetson, tegrastats samples taken while the cell ran.

The torch backend runs the fast PyTorch path (``exporters/torch_fast.py``: uint8 upload, normalisation
on the device, ``inference_mode``, CUDA-graph replay or ``torch.compile``), one cell per requested
``--torch-mode``; ``check`` keeps the reference runner that preprocesses on the host.

Cells that cannot exist (PyTorch has no int8 path; fp16 or CUDA graphs on a CPU) are kept in the matrix as
``skipped`` with the reason, so the table says why a row is empty. A cell that fails at run time is
``failed`` with the error and the sweep goes on; bad requests (unknown backend, a size the patches
don't tile, a precision the bundle lacks) are refused before anything runs.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..bundle import Bundle
from ..costs import CostReport, vit_costs
from ..errors import DeviceError, MissingDependencyError, UsageError, UserError, VitDeployError
from ..lazy import available, require
from ..runtime.base import Runner, TensorInfo
from ..runtime.devices import cuda_visible
from . import gemm_probe, tegrastats
from .measure import (
    DEFAULT_CV_THRESHOLD,
    DEFAULT_WARMUP,
    MIN_ITERATIONS,
    GpuMemoryProbe,
    LoadedRunner,
    Measurement,
    check_budget,
    cpu_affinity,
    current_rss_mb,
    default_threads,
    finish,
    load,
    measure,
    timed_calls,
)

BACKENDS = ("ort", "torch", "tensorrt")
PRECISIONS = ("fp32", "fp16", "int8")
DEVICES = ("auto", "cpu", "cuda")
GRAPH_BACKENDS = ("ort", "tensorrt")  # backends that run the bundle's ONNX graphs (need the artifact)
TORCH_MODES = ("auto", "eager", "cuda-graph", "compile")  # exporters/torch_fast.py


@dataclass
class SweepConfig:
    resolutions: list[tuple[int, int]] | None = None  # None: the bundle's native resolution
    batches: list[int] = field(default_factory=lambda: [1])
    precisions: list[str] | None = None  # None: every precision the bundle holds
    backends: list[str] = field(default_factory=lambda: ["ort"])
    iterations: int | None = None  # fixed count, or
    duration_s: float | None = None  # time budget per cell (default 3 s when neither is given)
    rounds: int | None = None  # interleave: every cell loaded, then its timed calls split over this many rounds
    warmup: int = DEFAULT_WARMUP
    threads: int | None = None  # intra-op threads for CPU backends; default: every CPU in the affinity mask
    pin: bool = False  # also restrict the process to the first `threads` CPUs of its affinity mask
    device: str = "auto"  # torch backend: cpu / cuda; ort: CPU or CUDA execution provider
    torch_modes: list[str] | None = None  # torch backend: eager / cuda-graph / compile / auto (None: auto), one cell each
    cv_threshold: float = DEFAULT_CV_THRESHOLD
    ort_optimization: str = "all"  # ORT graph optimisation level (see vitdeploy.runtime.ort)
    fused_cpu: bool = True  # ort fp32 on CPUs runs the bundle's fused model.cpu.onnx where there is one
    fills: list[float] | None = None  # variable-size bundles: fill ratios (vitdeploy.profile.variable; None: its defaults)
    tegrastats_interval_ms: int = 100
    probe_budget_s: float = gemm_probe.BUDGET_S
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["resolutions"] = [list(r) for r in self.resolutions] if self.resolutions else None
        if self.fills is None:
            del data["fills"]  # single-size bundles: the record stays as it was
        return data


@dataclass(frozen=True)
class Cell:
    backend: str
    precision: str
    height: int
    width: int
    batch: int
    skip_reason: str | None = None
    torch_mode: str | None = None  # torch cells: the requested mode (auto, eager, cuda-graph, compile)
    fill: float | None = None  # variable-size bundles: the share of the canvas (height x width) the images fill
    fill_actual: float | None = None  # the mean valid area / canvas area of the sizes drawn for ``fill``

    @property
    def label(self) -> str:
        backend = f"{self.backend} {self.torch_mode}" if self.torch_mode else self.backend
        fill = f" fill {self.fill:g}" if self.fill is not None else ""
        return f"{backend} {self.precision} {self.height}x{self.width}{fill} b{self.batch}"


@dataclass
class SweepResult:
    bundle: dict[str, Any]
    config: dict[str, Any]
    machine: dict[str, Any]
    peaks: list[gemm_probe.PeakProbe]
    cost_model: dict[str, Any]
    rows: list[dict[str, Any]]
    started: str
    wall_s: float

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["status"] == "failed"]


class _SkipCell(Exception):
    """Raised from inside a cell when the loaded graph cannot take the requested shape."""


# -- planning and validation -------------------------------------------------------------------
def _choose(values: list[str], allowed: tuple[str, ...], what: str) -> list[str]:
    out = []
    for v in values:
        v = v.strip().lower()
        if v not in allowed:
            raise UsageError(f"unknown {what} {v!r}; choose from {', '.join(allowed)}")
        if v not in out:
            out.append(v)
    if not out:
        raise UsageError(f"no {what} given; choose from {', '.join(allowed)}")
    return out


def _torch_device(config: SweepConfig) -> str:
    if config.device == "cpu":
        return "cpu"
    torch = require("torch", "the torch backend")
    if torch.cuda.is_available():
        return "cuda"
    if config.device == "cuda":
        raise DeviceError("--device cuda was asked for but torch sees no GPU; use --device cpu")
    return "cpu"


def plan_cells(bundle: Bundle, config: SweepConfig) -> list[Cell]:
    """Validate the request against the bundle and list the cells in run order."""
    spec = bundle.spec
    backends = _choose(config.backends, BACKENDS, "backend")
    if config.device not in DEVICES:
        raise UsageError(f"unknown device {config.device!r}; choose from {', '.join(DEVICES)}")
    present = bundle.precisions()
    precisions = _choose(config.precisions, PRECISIONS, "precision") if config.precisions else list(present)
    variable = bundle.variable_size  # (images in a canvas, valid_hw): cells by canvas and fill ratio
    fills: list[float | None] = [None]
    if variable:
        from .variable import DEFAULT_FILLS, parse_fills

        fills = list(parse_fills(config.fills if config.fills is not None else DEFAULT_FILLS))
    elif config.fills is not None:
        raise UserError("--fill applies to variable-size bundles (export --variable-size --canvas HxW); this graph takes one input size")
    resolutions = config.resolutions or [tuple(variable["canvas"]) if variable else tuple(spec.image_size)]
    for h, w in resolutions:
        spec.grid(h, w)  # one clear line naming the nearest valid sizes
    batches = sorted(dict.fromkeys(config.batches))
    if not batches or any(b < 1 for b in batches):
        raise UsageError(f"batch sizes must be positive integers, got {config.batches}")
    if config.threads is not None and config.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {config.threads}")
    if config.pin and (config.threads or 0) > len(cpu_affinity()):
        raise UsageError(f"--pin with --threads {config.threads}: this process may use only {len(cpu_affinity())} CPUs")
    if config.pin and not hasattr(os, "sched_setaffinity"):
        raise UserError("--pin needs CPU affinity control (Linux); run without --pin")
    check_budget(config.warmup, config.iterations, config.duration_s)
    if config.rounds is not None:
        if config.rounds < 2:
            raise UsageError(f"--rounds must be >= 2 (it splits each cell's timed calls into rounds), got {config.rounds}")
        if config.duration_s is not None:
            raise UsageError("--rounds splits a fixed --iterations count over the rounds; it does not combine with --duration")
        if config.iterations is not None and config.iterations < config.rounds:
            raise UsageError(f"--iterations {config.iterations} is fewer than --rounds {config.rounds}: each round times at least one call")
    if not config.cv_threshold > 0:
        raise UsageError(f"the CV threshold must be > 0, got {config.cv_threshold}")

    if any(b in GRAPH_BACKENDS for b in backends):
        for p in precisions:  # a missing graph says how to make it; a changed one is refused before any timing
            bundle.artifact_path(p)
    if "tensorrt" in backends and not cuda_visible():
        raise DeviceError("the tensorrt backend needs an NVIDIA GPU with TensorRT; this machine has none (use --backend ort,torch)")
    if "ort" in backends and config.device == "cuda":
        ort = require("onnxruntime", "the ort backend")
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise DeviceError("--device cuda needs onnxruntime-gpu (CUDAExecutionProvider); this onnxruntime has only CPU")
    mode = bundle.resolution.get("mode", "static")
    native = (int(bundle.resolution.get("height", spec.image_size[0])), int(bundle.resolution.get("width", spec.image_size[1])))
    if mode != "dynamic" and any(r != native for r in resolutions) and any(b in GRAPH_BACKENDS for b in backends):
        # Static graph at another size: re-exported (position table interpolated) by the exporters.
        if not available("vitdeploy.exporters.variants"):
            raise MissingDependencyError(
                f"the bundle's graph is static ({native[0]}x{native[1]}); profiling other sizes re-exports it, which needs "
                "vitdeploy's exporters: pip install 'vitdeploy[export]' (or export with --dynamic-resolution)"
            )
    torch_device = None
    torch_modes = _choose(config.torch_modes, TORCH_MODES, "torch mode") if config.torch_modes else ["auto"]
    if config.torch_modes and "torch" not in backends:
        raise UserError("--torch-mode applies to the torch backend; add --backend torch")
    if "torch" in backends:
        if not available("vitdeploy.exporters.torch_runner"):
            raise MissingDependencyError("the torch backend rebuilds the source model with vitdeploy's exporters: pip install 'vitdeploy[export]'")
        torch_device = _torch_device(config)
        if torch_device == "cpu" and torch_modes == ["cuda-graph"]:
            raise UserError("--torch-mode cuda-graph replays CUDA graphs and needs a GPU; torch runs on the CPU here (use eager or compile)")

    cells = []
    for backend in backends:
        for precision in precisions:
            for mode in torch_modes if backend == "torch" else [None]:
                reason = None
                if backend == "torch" and precision == "int8":
                    reason = "PyTorch has no int8 path here; the int8 graph is measured on ort/tensorrt"
                elif backend == "torch" and precision == "fp16" and torch_device == "cpu":
                    reason = "PyTorch fp16 is a GPU baseline; no GPU here"
                elif mode == "cuda-graph" and torch_device == "cpu":
                    reason = "CUDA graphs need a GPU; torch runs on the CPU here"
                if variable and reason is None:
                    reason = _variable_skip(backend, precision, mode)
                for h, w in resolutions:
                    for fill in fills:
                        for b in batches:
                            cell = Cell(backend, precision, int(h), int(w), int(b), reason, mode, fill)
                            if fill is not None:
                                from .variable import achieved_fill

                                cell = replace(cell, fill_actual=achieved_fill(cell_valid_hw(bundle, cell, config.seed), (h, w)))
                            cells.append(cell)
    return cells


def _variable_skip(backend: str, precision: str, mode: str | None) -> str | None:
    """Why a cell of a variable-size bundle cannot run here (None when it can)."""
    if backend == "torch" and precision != "fp32":
        return "the variable-size PyTorch reference (the masked forward the graph was exported from) runs fp32"
    if backend == "torch" and mode not in (None, "auto", "eager"):
        return f"the variable-size PyTorch reference runs eager, not {mode}"
    return None


# -- runners -----------------------------------------------------------------------------------
def graph_path(bundle: Bundle, precision: str, height: int, width: int) -> Path:
    """The ONNX graph that runs a cell: the bundle's own for a dynamic graph or the native size of a
    static one; otherwise a re-export at that size, cached in the bundle by the exporters."""
    res = bundle.resolution
    native = (int(res.get("height", bundle.spec.image_size[0])), int(res.get("width", bundle.spec.image_size[1])))
    if res.get("mode") == "dynamic" or (height, width) == native:
        return bundle.artifact_path(precision)
    from vitdeploy.exporters.variants import graph_for  # needs torch; checked in plan_cells

    return Path(graph_for(bundle, precision, height, width))


def _cuda_provider(providers: list[str] | None) -> bool:
    if providers is None:
        from ..runtime.ort import default_providers

        providers = default_providers()
    return "CUDAExecutionProvider" in providers


def _ort_providers(device: str) -> list[str] | None:
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device == "cuda":
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return None  # OrtRunner's default: CUDA when present, then CPU


def runner_factory(bundle: Bundle, cell: Cell, config: SweepConfig, threads: int) -> tuple[Callable[[], Runner], str]:
    """A zero-argument constructor for the cell's runner (timed as start-up) and what it runs."""
    if cell.fill is not None:
        return _variable_runner_factory(bundle, cell, config, threads)
    if cell.backend == "ort":
        from ..runtime.ort import OrtRunner

        path = graph_path(bundle, cell.precision, cell.height, cell.width)
        providers = _ort_providers(config.device)
        if config.fused_cpu and cell.precision == "fp32" and not _cuda_provider(providers) and path == bundle.artifact_path("fp32"):
            from ..runtime.fused import cpu_graph_for  # the bundle's model.cpu.onnx, when gated and current

            path = cpu_graph_for(bundle) or path

        def make() -> Runner:
            return OrtRunner(path, precision=cell.precision, providers=providers, threads=threads, optimization=config.ort_optimization)

        return make, _relative(bundle, path)
    if cell.backend == "torch":
        # The fast path (uint8 upload, normalisation on the device, CUDA graphs / torch.compile): the
        # PyTorch baseline a careful user runs. `check` keeps the host-preprocessing reference runner.
        from vitdeploy.exporters.torch_fast import FastTorchRunner

        device = _torch_device(config)
        # Runners are built for the native grid and re-gridded by the exporters for other sizes.
        resolution = (cell.height, cell.width)
        mode = cell.torch_mode or "auto"

        def make() -> Runner:
            return FastTorchRunner.from_bundle(bundle, device=device, dtype=cell.precision, resolution=resolution, threads=threads, mode=mode)

        return make, f"{bundle.manifest.get('source', {}).get('kind', 'source')}:{bundle.manifest.get('source', {}).get('name', '?')} (torch {mode})"
    if cell.backend == "tensorrt":
        entry = tensorrt_engine_for(bundle, cell)

        def make() -> Runner:
            from ..runtime.tensorrt import TensorRTRunner  # GPU only; imported when a cell needs it

            return TensorRTRunner(entry.dir)

        return make, _relative(bundle, entry.dir)
    raise UserError(f"unknown backend {cell.backend!r}")


def cell_valid_hw(bundle: Bundle, cell: Cell, seed: int) -> np.ndarray:
    """The valid sizes of a variable-size cell: ``cell.batch`` rows drawn for ``cell.fill`` by the declared
    rule (vitdeploy.profile.variable), the same for every backend and precision of the sweep."""
    from .variable import sizes_for_fill

    patch = bundle.variable_size["round_to"] if bundle.variable_size else bundle.spec.patch_size
    return sizes_for_fill((cell.height, cell.width), patch, float(cell.fill), cell.batch, seed)


def _variable_runner_factory(bundle: Bundle, cell: Cell, config: SweepConfig, threads: int) -> tuple[Callable[[], Runner], str]:
    """Runners of a variable-size cell: the graph on ONNX Runtime, the bundle's engine on TensorRT, or
    the masked forward in PyTorch, each fed the cell's images and its valid_hw."""
    valid = cell_valid_hw(bundle, cell, config.seed)
    if cell.backend == "ort":
        from .variable import VariableOrtRunner

        path = graph_path(bundle, cell.precision, cell.height, cell.width)  # the bundle's canvas, or a variant at another
        providers = _ort_providers(config.device)

        def make() -> Runner:
            return VariableOrtRunner(path, valid, precision=cell.precision, providers=providers, threads=threads,
                                     optimization=config.ort_optimization)

        return make, _relative(bundle, path)
    if cell.backend == "torch":
        from .variable import VariableTorchRunner

        device = _torch_device(config)

        def make() -> Runner:
            return VariableTorchRunner(bundle, valid, (cell.height, cell.width), device=device, threads=threads)

        source = bundle.manifest.get("source", {})
        return make, f"{source.get('kind', 'source')}:{source.get('name', '?')} (torch eager, masked forward)"
    if cell.backend == "tensorrt":
        entry = tensorrt_engine_for(bundle, cell)  # its profile holds the cell's batch on both inputs (build-engine)

        def make() -> Runner:
            from ..runtime.tensorrt import TensorRTRunner  # GPU only; imported when a cell needs it

            return TensorRTRunner(entry.dir, fixed_inputs={"valid_hw": valid})

        return make, _relative(bundle, entry.dir)
    raise UserError(f"backend {cell.backend} does not run variable-size cells")


def tensorrt_engine_for(bundle: Bundle, cell: Cell) -> Any:
    """The bundle's engine of the cell's precision whose optimisation profile holds its
    (batch, height, width); a cell no engine covers is skipped with what to build."""
    from ..runtime.classifier import find_engines

    engines = [e for e in find_engines(bundle) if e.precision == cell.precision]
    for entry in engines:
        for batch, heights, widths in entry.profiles:
            if batch[0] <= cell.batch <= batch[2] and heights[0] <= cell.height <= heights[2] and widths[0] <= cell.width <= widths[2]:
                return entry
    have = "; ".join(f"{e.target}: {e.profiles}" for e in engines) or "none"
    raise _SkipCell(f"no {cell.precision} engine has a profile holding batch {cell.batch} at {cell.height}x{cell.width} "
                    f"(engines: {have}); build one with `vitdeploy build-engine {bundle.root}`")


def _relative(bundle: Bundle, path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(bundle.root.resolve()))
    except ValueError:
        return str(path)


def synthetic_batch(info: TensorInfo, preprocessing: dict[str, Any], batch: int, height: int, width: int, seed: int) -> np.ndarray:
    """Random input of the graph's own type: uint8 NHWC pixels (vitdeploy's contract) or, for graphs
    exported without baked preprocessing, float32 NCHW already normalised."""
    rng = np.random.default_rng(seed)
    if preprocessing.get("input") == "float-nchw" or info.dtype in ("float32", "float16"):
        dtype = np.float16 if info.dtype == "float16" else np.float32
        return rng.standard_normal((batch, 3, height, width)).astype(dtype)
    return rng.integers(0, 256, size=(batch, height, width, 3), dtype=np.uint8)


def _check_shape(runner: Runner, cell: Cell) -> None:
    shape = runner.inputs()[0].shape
    if shape and isinstance(shape[0], int) and shape[0] != cell.batch:
        raise _SkipCell(f"the graph has a fixed batch of {shape[0]}; export with a dynamic batch to profile batch {cell.batch}")


# -- the sweep ---------------------------------------------------------------------------------
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


def _row(cell: Cell, cost: CostReport, graph: str | None, status: str, note: str = "", m: Measurement | None = None,
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


def run_sweep(
    bundle: Bundle,
    config: SweepConfig,
    on_start: Callable[[Cell, int, int], None] | None = None,
    on_done: Callable[[Cell, dict[str, Any]], None] | None = None,
    on_round: Callable[[int, int], None] | None = None,
) -> SweepResult:
    """Plan, probe the machine's GEMM peak, then measure every cell: one after the other, or with
    ``config.rounds`` all loaded and timed in interleaved rounds (``on_round(r, rounds)`` per round)."""
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    t_start = time.perf_counter()
    cells = plan_cells(bundle, config)
    threads = config.threads or default_threads()
    backends = sorted({c.backend for c in cells})
    spec = bundle.spec
    pre = bundle.preprocessing if "preprocessing" in bundle.manifest else {}
    # An in-graph resize runs the model at a fixed size whatever the input: the cost is at that size.
    model_size = tuple(pre["in_graph_resize"]["to"]) if pre.get("in_graph_resize") else None

    if "torch" in backends and any(c.skip_reason is None and c.backend == "torch" for c in cells):
        require("torch", "the torch backend")  # loaded before the probe so the probe can use it
    # Cells may run on a GPU (tensorrt always; ort and torch unless --device cpu): then the GPU's
    # GEMM peak is probed with torch where torch is installed, and device memory is tracked.
    cuda = config.device != "cpu" and cuda_visible()
    if cuda and "torch" not in sys.modules and available("torch"):
        require("torch")
    gpu = GpuMemoryProbe() if cuda else None
    tegra_exe = tegrastats.find_tegrastats()

    rows: list[dict[str, Any]] = []
    with _pinned(threads if config.pin else None):
        # Probed under the same pinning as the cells, so the peak is that of the cores they run on.
        peaks = gemm_probe.measure_peaks(threads, set(backends), cuda, budget_s=config.probe_budget_s)
        pinned_to = cpu_affinity()
        costs = [vit_costs(spec, *(model_size or (c.height, c.width)), c.batch) for c in cells]
        if config.rounds:
            rows = _run_interleaved(bundle, cells, costs, config, threads, peaks, gpu, tegra_exe, pre, on_start, on_done, on_round)
        else:
            for i, (cell, cost) in enumerate(zip(cells, costs)):
                if on_start:
                    on_start(cell, i, len(cells))
                if cell.skip_reason:
                    row = _row(cell, cost, None, "skipped", cell.skip_reason)
                else:
                    row = _run_cell(bundle, cell, config, threads, cost, peaks, gpu, tegra_exe, pre)
                rows.append(row)
                if on_done:
                    on_done(cell, row)

    first_cost = vit_costs(spec, *(model_size or (cells[0].height, cells[0].width)), 1)
    return SweepResult(
        bundle={
            "path": str(bundle.bare_onnx or bundle.root),
            "name": bundle.name,
            "source": bundle.manifest.get("source"),
            "spec": spec.to_dict(),
            "resolution": bundle.resolution,
            "precisions": bundle.precisions(),
            **_variable_record(bundle),
        },
        config=config.to_dict(),
        machine={**machine_info(threads, backends, cells), "pinned_cpus": pinned_to if config.pin else None},
        peaks=peaks,
        cost_model={
            "convention": "1 MAC = one multiply-add; FLOPs = 2 x MACs; biases, norms, softmax and GELU not counted (chapter §39.5)",
            "crossover_seq_len": first_cost.crossover_seq_len,
            "params": first_cost.params,
            "embed_dim": spec.embed_dim,
            "mlp_ratio": spec.mlp_ratio,
            "depth": spec.depth,
        },
        rows=rows,
        started=started,
        wall_s=time.perf_counter() - t_start,
    )


def _variable_record(bundle: Bundle) -> dict[str, Any]:
    """profile.json's record of a variable-size bundle: its canvas, inputs and how fill sizes were drawn."""
    contract = bundle.variable_size
    if not contract:
        return {}
    from .variable import FILL_RULE

    return {"variable_size": {"canvas": list(contract["canvas"]), "valid_input": contract.get("valid_input", "valid_hw"),
                              "round_to": list(contract["round_to"]), "fill_rule": FILL_RULE,
                              "cost_model": "macs/flops count the whole canvas: the graph computes every position and masks the padded keys"}}


def _failure_note(exc: BaseException) -> str:
    if isinstance(exc, VitDeployError):
        return str(exc)
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0] if first else ''}"


def _run_interleaved(bundle: Bundle, cells: list[Cell], costs: list[CostReport], config: SweepConfig, threads: int,
                     peaks: list[gemm_probe.PeakProbe], gpu: GpuMemoryProbe | None, tegra_exe: str | None,
                     pre: dict[str, Any], on_start: Callable[..., None] | None, on_done: Callable[..., None] | None,
                     on_round: Callable[[int, int], None] | None) -> list[dict[str, Any]]:
    """Load every cell's runner (start-up and memory measured one at a time), then time the cells in
    rounds, forward and backward in turn (A B C, C B A, ...): load from other processes, clock and
    thermal drift fall on every cell alike, so cells compare fairly on a shared or throttling
    machine. Each block starts with one untimed call, so a cell is timed warm, as in the sequential
    mode, not right after another model evicted its weights from the caches. Peak RSS is then that
    of the whole sweep (all runners resident); ``rss_added_mb`` is what each runner added when it
    was loaded."""
    rounds = int(config.rounds or 2)
    total = config.iterations if config.iterations is not None else max(MIN_ITERATIONS, rounds)
    blocks = [total // rounds + (1 if r < total % rounds else 0) for r in range(rounds)]
    rows: list[dict[str, Any] | None] = [None] * len(cells)
    loaded: dict[int, tuple[LoadedRunner, str, float | None]] = {}
    for i, (cell, cost) in enumerate(zip(cells, costs)):
        if on_start:
            on_start(cell, i, len(cells))
        if cell.skip_reason:
            rows[i] = _row(cell, cost, None, "skipped", cell.skip_reason)
            continue
        graph = None
        try:
            make, graph = runner_factory(bundle, cell, config, threads)
            lr = load(make, lambda r, c=cell: synthetic_batch(r.inputs()[0], pre, c.batch, c.height, c.width, config.seed),
                      warmup=config.warmup, gpu=gpu, on_runner=lambda r, c=cell: _check_shape(r, c))
            after = current_rss_mb()
            loaded[i] = (lr, graph, after - lr.rss_before_mb if after is not None and lr.rss_before_mb is not None else None)
        except _SkipCell as exc:
            rows[i] = _row(cell, cost, graph, "skipped", str(exc))
        except Exception as exc:  # one cell's load failure must not end the sweep
            rows[i] = _row(cell, cost, graph, "failed", _failure_note(exc))
    sampler = tegrastats.TegrastatsSampler(tegra_exe, config.tegrastats_interval_ms) if tegra_exe else None
    with sampler if sampler is not None else contextlib.nullcontext():
        for r, block in enumerate(blocks):
            if on_round:
                on_round(r, rounds)
            order = sorted(loaded) if r % 2 == 0 else sorted(loaded, reverse=True)
            for i in order:
                try:
                    lr = loaded[i][0]
                    lr.runner.infer(lr.batch)  # untimed: re-warms caches and thread pools after the switch
                    timed_calls(lr, iterations=block)
                except Exception as exc:
                    lr, graph, _ = loaded.pop(i)
                    lr.runner.close()
                    rows[i] = _row(cells[i], costs[i], graph, "failed", _failure_note(exc))
    tegra = sampler.summary() if sampler is not None else None
    for i, (lr, graph, added) in sorted(loaded.items()):
        m = finish(lr, config.cv_threshold, gpu, rss_scope="sweep", rss_added_mb=added, gpu_scope="load")
        peak = gemm_probe.peak_for(peaks, m.runner.get("device", "cpu"), cells[i].precision)
        note = f"unstable: CV {m.latency.cv:.0%} > {config.cv_threshold:.0%}" if m.unstable else ""
        # tegrastats ran over the whole interleaved phase: the same sweep-wide summary on every row
        rows[i] = _row(cells[i], costs[i], graph, "ok", note, m, peak, tegra)
    out = [row for row in rows if row is not None]
    if on_done:
        for cell, row in zip(cells, out):
            on_done(cell, row)
    return out


@contextlib.contextmanager
def _pinned(count: int | None) -> Iterator[None]:
    """Restrict this process (and the runtime threads it starts) to its first ``count`` CPUs, then
    restore the mask: fewer migrations and no hyper-thread siblings borrowed mid-run."""
    if not count:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(before)[:count])
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _run_cell(bundle: Bundle, cell: Cell, config: SweepConfig, threads: int, cost: CostReport,
              peaks: list[gemm_probe.PeakProbe], gpu: GpuMemoryProbe | None, tegra_exe: str | None,
              pre: dict[str, Any]) -> dict[str, Any]:
    graph = None

    def make_batch(runner: Runner) -> np.ndarray:
        # Built from the loaded graph's own input type (uint8 NHWC, or float NCHW for raw graphs).
        return synthetic_batch(runner.inputs()[0], pre, cell.batch, cell.height, cell.width, config.seed)

    def run() -> Measurement:
        return measure(make, make_batch, warmup=config.warmup, iterations=config.iterations, duration_s=config.duration_s,
                       cv_threshold=config.cv_threshold, gpu=gpu, on_runner=lambda r: _check_shape(r, cell))

    try:
        make, graph = runner_factory(bundle, cell, config, threads)
        if tegra_exe:
            with tegrastats.TegrastatsSampler(tegra_exe, config.tegrastats_interval_ms) as sampler:
                m = run()
            tegra = sampler.summary()
        else:
            m, tegra = run(), None
    except _SkipCell as exc:
        return _row(cell, cost, graph, "skipped", str(exc))
    except VitDeployError as exc:
        return _row(cell, cost, graph, "failed", str(exc))
    except Exception as exc:  # a runtime error (ORT, torch, TensorRT) in one cell must not end the sweep
        return _row(cell, cost, graph, "failed", _failure_note(exc))
    peak = gemm_probe.peak_for(peaks, m.runner.get("device", "cpu"), cell.precision)
    note = f"unstable: CV {m.latency.cv:.0%} > {config.cv_threshold:.0%}" if m.unstable else ""
    return _row(cell, cost, graph, "ok", note, m, peak, tegra)
