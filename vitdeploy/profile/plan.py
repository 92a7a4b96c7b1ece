"""Planning the profile matrix: what was asked (SweepConfig), validated against the bundle before
anything runs, and the cells in run order (backend x precision x resolution x fill x batch; cells that
cannot exist are kept as ``skipped`` with the reason)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from .. import precisions as registry
from ..bundle import Bundle
from ..contract import InputContract
from ..errors import DeviceError, MissingDependencyError, UsageError, UserError
from ..lazy import available, require
from ..runtime.devices import cuda_visible
from . import gemm_probe
from .measure import DEFAULT_CV_THRESHOLD, DEFAULT_WARMUP, check_budget, cpu_affinity

BACKENDS = ("ort", "torch", "tensorrt")
PRECISIONS = registry.NAMES
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
    merge_tokens: list[int] | None = None  # --merge-tokens 0,4,8: one re-exported graph per r (exporters/token_merge.py)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["resolutions"] = [list(r) for r in self.resolutions] if self.resolutions else None
        if self.fills is None:
            del data["fills"]  # single-size bundles: the record stays as it was
        if self.merge_tokens is None:
            del data["merge_tokens"]
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
    merge: int | None = None  # --merge-tokens: r tokens merged per block in this cell's graph (None: the bundle's own)

    @property
    def label(self) -> str:
        backend = f"{self.backend} {self.torch_mode}" if self.torch_mode else self.backend
        fill = f" fill {self.fill:g}" if self.fill is not None else ""
        merge = f" r{self.merge}" if self.merge is not None else ""
        return f"{backend} {self.precision} {self.height}x{self.width}{fill}{merge} b{self.batch}"


class SkipCell(Exception):
    """Raised from inside a cell when the loaded graph cannot take the requested shape."""


# -- planning and validation -------------------------------------------------------------------
def choose(values: list[str], allowed: tuple[str, ...], what: str) -> list[str]:
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


def torch_device(config: SweepConfig) -> str:
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
    backends = choose(config.backends, BACKENDS, "backend")
    if config.device not in DEVICES:
        raise UsageError(f"unknown device {config.device!r}; choose from {', '.join(DEVICES)}")
    present = bundle.precisions()
    precisions = choose(config.precisions, PRECISIONS, "precision") if config.precisions else list(present)
    contract = InputContract.from_bundle(bundle)
    mixes = contract.mixes_sizes  # (images in a canvas, valid_hw): cells by canvas and fill ratio
    fills: list[float | None] = [None]
    if mixes:
        from .variable import DEFAULT_FILLS, parse_fills

        fills = list(parse_fills(config.fills if config.fills is not None else DEFAULT_FILLS))
    elif config.fills is not None:
        raise UserError("--fill applies to variable-size bundles (export --variable-size --canvas HxW); this graph takes one input size")
    # a variable-size bundle's cells are canvases (other canvases: the same two-input graph re-exported)
    resolutions = config.resolutions or [contract.size if mixes else tuple(spec.image_size)]
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
    torch_on = None
    torch_modes = choose(config.torch_modes, TORCH_MODES, "torch mode") if config.torch_modes else ["auto"]
    if config.torch_modes and "torch" not in backends:
        raise UserError("--torch-mode applies to the torch backend; add --backend torch")
    if "torch" in backends:
        if not available("vitdeploy.exporters.torch_runner"):
            raise MissingDependencyError("the torch backend rebuilds the source model with vitdeploy's exporters: pip install 'vitdeploy[export]'")
        torch_on = torch_device(config)
        if torch_on == "cpu" and torch_modes == ["cuda-graph"]:
            raise UserError("--torch-mode cuda-graph replays CUDA graphs and needs a GPU; torch runs on the CPU here (use eager or compile)")

    merges: list[int | None] = list(config.merge_tokens) if config.merge_tokens is not None else [None]
    if config.merge_tokens is not None:
        check_merges(bundle, config.merge_tokens, resolutions, mixes)
    cells = []
    for backend in backends:
        for precision in precisions:
            for mode in torch_modes if backend == "torch" else [None]:
                reason = None
                if backend == "torch" and registry.get(precision).torch_dtype is None:
                    reason = f"PyTorch has no {precision} path here; the {precision} graph is measured on ort/tensorrt"
                elif backend == "torch" and precision == "fp16" and torch_on == "cpu":
                    reason = "PyTorch fp16 is a GPU baseline; no GPU here"
                elif mode == "cuda-graph" and torch_on == "cpu":
                    reason = "CUDA graphs need a GPU; torch runs on the CPU here"
                if mixes and reason is None:
                    reason = variable_skip(backend, precision, mode)
                if merges != [None] and backend != "ort" and reason is None:
                    reason = (f"--merge-tokens re-exports one graph per r and times it on ort; for {backend}, profile a bundle "
                              "exported with --merge-tokens R")
                for h, w in resolutions:
                    for fill in fills:
                        for merge, b in ((m, b) for m in merges for b in batches):
                            cell = Cell(backend, precision, int(h), int(w), int(b), reason, mode, fill, merge=merge)
                            if fill is not None:
                                from .variable import achieved_fill

                                cell = replace(cell, fill_actual=achieved_fill(cell_valid_hw(contract, cell, config.seed), (h, w)))
                            cells.append(cell)
    return cells


def variable_skip(backend: str, precision: str, mode: str | None) -> str | None:
    """Why a cell of a variable-size bundle cannot run here (None when it can)."""
    if backend == "torch" and precision != "fp32":
        return "the variable-size PyTorch reference (the masked forward the graph was exported from) runs fp32"
    if backend == "torch" and mode not in (None, "auto", "eager"):
        return f"the variable-size PyTorch reference runs eager, not {mode}"
    return None


def cell_valid_hw(contract: InputContract, cell: Cell, seed: int) -> np.ndarray:
    """The valid sizes of a variable-size cell: ``cell.batch`` rows drawn for ``cell.fill`` by the declared
    rule (vitdeploy.profile.variable), the same for every backend and precision of the sweep."""
    from .variable import sizes_for_fill

    return sizes_for_fill((cell.height, cell.width), contract.patch, float(cell.fill), cell.batch, seed)


# -- token merging (--merge-tokens; exporters/token_merge.py) ------------------------------------------
def check_merges(bundle: Bundle, merges: list[int], resolutions: list[tuple[int, int]], mixes: bool) -> None:
    """One line, before anything runs, for a merge sweep that cannot be exported."""
    from ..costs import merged_patch_counts

    if mixes:
        raise UserError("--merge-tokens needs one static token count; a variable-size bundle has none (export a fixed --resolution)")
    if bundle.resolution.get("mode") == "dynamic":
        raise UserError("--merge-tokens re-exports static graphs (r is a constant per block); this bundle has a dynamic "
                        "resolution: export it with --resolution and profile that")
    if bundle.bare_onnx is not None:
        raise UserError("--merge-tokens re-exports the bundle's source; a bare ONNX file needs its bundle folder")
    if any(r < 0 for r in merges) or not merges:
        raise UsageError(f"--merge-tokens takes r values >= 0, e.g. 0,4,8,12; got {merges}")
    if not available("vitdeploy.exporters.variants"):
        raise MissingDependencyError("--merge-tokens re-exports the model, which needs vitdeploy's exporters: pip install 'vitdeploy[export]'")
    for h, w in resolutions:
        for r in merges:
            merged_patch_counts(bundle.spec, (r,) * bundle.spec.depth, h, w)  # refuses an r that leaves too few tokens


def merge_schedule_for(bundle: Bundle, cell: Cell) -> tuple[int, ...] | None:
    """The merge schedule of the graph a cell runs: r per block for a --merge-tokens cell, else the
    bundle's own (a bundle exported with --merge-tokens), else None."""
    if cell.merge is not None:
        return (cell.merge,) * bundle.spec.depth if cell.merge else None
    record = bundle.manifest.get("token_merge") if bundle.bare_onnx is None else None
    return tuple(record["schedule"]) if record else None
