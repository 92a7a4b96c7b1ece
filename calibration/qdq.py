"""INT8 Q/DQ graphs with onnxruntime.quantization: calibrate ranges, insert Q/DQ, verify placement.

Two steps, so that a sweep calibrates once per method and quantizes many times:

1. :func:`compute_ranges` runs ORT's calibrator (MinMax, Entropy or Percentile) over a
   CalibrationSource a few batches at a time (histogram calibrators keep every collected tensor of a
   call in memory; chunking bounds that) and saves the tensor ranges as ORT's calibration cache;
2. :func:`quantize_graph` calls ``quantize_static`` with that cache and the target's settings
   (TensorRT: symmetric int8 activations and per-channel int8 weights, biases left float; CPU: see
   :mod:`.cpu_int8`), on the inputs of MatMul/Gemm/Conv only (``OpTypesToExcludeOutputQuantization``
   keeps their outputs float, so no Q/DQ lands in front of Softmax, GELU or the residual Adds), then
   checks the placement (:mod:`.inspect`) and embeds the manifest core with ``graph.precision = int8``.

Variable-size graphs (images + valid_hw): calibration feeds (images, valid_hw) pairs (:mod:`.sources`),
and the linear layers of the valid_hw mask path (the per-sample position-table MatMuls,
:mod:`vitdeploy.exporters.mask_path`) are always excluded, so no Q/DQ lands on anything computed from
valid_hw before it joins the token stream; the key-bias Add and Softmax stay float as everywhere.

No ``quant_pre_process``: it re-runs ORT's optimizer over the graph, which renames the tensors the
manifest's module map points at (``check`` localisation, ``--exclude-blocks``) and changes the graph
TensorRT later parses; ``quantize_static`` does the shape inference it needs itself.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from vitdeploy import onnx_io
from vitdeploy.bundle import embed_manifest
from vitdeploy.errors import InternalError, UserError
from vitdeploy.fileio import hidden_dir, library_temp
from vitdeploy.lazy import require
from vitdeploy.storage import disk_errors, require_space

from .exclusions import QUANTIZABLE_OPS, Exclusions, resolve
from .inspect import inspect_qdq_placement
from .settings import TENSORRT, QuantSettings  # noqa: F401 - QuantSettings is part of this module's API
from .smooth import Smoothing
from .sources import CalibrationSource

METHODS = ("entropy", "minmax", "percentile")
TARGETS = ("tensorrt", "cpu")
# Fewest calibration images per method. Entropy and percentile choose a clipping threshold from a
# histogram of each tensor: with a handful of images the histogram's tail is one image's outliers.
MIN_SAMPLES = {"minmax": 16, "entropy": 64, "percentile": 64}
# Histogram settings, written out so the manifest records them. Entropy keeps ORT's 128 bins: on a
# digits ViT, 512 and 1024 bins (TensorRT's calibrator uses 2048) were 5-12x slower to calibrate in
# ORT's Python KL search and no more accurate (99.2% / 98.9% / 98.3% for 128 / 512 / 1024 bins).
METHOD_OPTIONS: dict[str, dict[str, Any]] = {
    "minmax": {},
    "entropy": {"num_bins": 128, "num_quantized_bins": 128},
    "percentile": {"num_bins": 2048, "percentile": 99.999},
}
CALIBRATION_BATCH = 8
BATCHES_PER_COLLECT = 4  # batches held in memory per collect_data call (fewer for large models)
COLLECT_BUDGET_BYTES = 512 << 20  # calibrated tensors held per collect_data call (collection_plan)


def settings_for(target: str) -> QuantSettings:
    if target == "tensorrt":
        return TENSORRT
    if target == "cpu":
        from .cpu_int8 import cpu_settings

        return cpu_settings()
    raise UserError(f"--target must be one of {', '.join(TARGETS)}, got {target!r}")


@dataclass(frozen=True)
class Recipe:
    method: str = "entropy"
    target: str = "tensorrt"
    exclusions: Exclusions = Exclusions()
    # SmoothQuant-style migration applied to the fp32 graph before calibration (calibration/smooth.py)
    smoothing: Smoothing | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UserError(f"--method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.target not in TARGETS:
            raise UserError(f"--target must be one of {', '.join(TARGETS)}, got {self.target!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "target": self.target, "exclusions": self.exclusions.to_dict(),
                "smoothing": self.smoothing.to_dict() if self.smoothing is not None else None}

    @property
    def smoothing_label(self) -> str:
        return self.smoothing.label if self.smoothing is not None else "none"


class _Batches:
    """ORT CalibrationDataReader protocol (get_next) over a slice of a source's feeds
    (the images, and valid_hw for a variable-size graph)."""

    def __init__(self, feeds: list[dict[str, Any]]):
        self._iter = iter(feeds)

    def get_next(self) -> dict[str, Any] | None:
        return next(self._iter, None)


def collection_plan(fp32_path: str | Path, images: np.ndarray, budget_bytes: int = COLLECT_BUDGET_BYTES) -> tuple[int, int]:
    """(batch, batches per collect_data call) whose calibrated tensors stay within ``budget_bytes``.

    ORT's calibrators hold every calibrated tensor (the inputs of each MatMul/Gemm/Conv) of all the
    batches of one collect_data call, and the histogram collector stacks them once more: for ViT-L/16
    at 224 that is about 250 MB per image (24 blocks x 197 tokens x (6d + MLP width + heads x tokens)
    floats), so 32 images per call (8 x 4, right for the digits model's 0.8 MB) would hold 8 GB. The
    per-image bytes come from the ViT spec bound in the graph (issue 32: calibration memory that grows
    with the model, not with the images); a graph without it keeps the fixed plan.
    """
    from vitdeploy.bundle import read_onnx_manifest
    from vitdeploy.spec import ViTSpec

    try:
        spec = ViTSpec.from_dict(read_onnx_manifest(Path(fp32_path))["spec"])
    except (UserError, KeyError, TypeError, ValueError):
        return CALIBRATION_BATCH, BATCHES_PER_COLLECT
    height, width = (int(v) for v in images.shape[1:3])
    tokens = spec.seq_len(height, width)
    mlp = int(spec.embed_dim * spec.mlp_ratio)
    per_image = 4 * spec.depth * tokens * (6 * spec.embed_dim + mlp + spec.num_heads * tokens)
    fit = max(1, budget_bytes // max(1, 2 * per_image))  # x2: the collector's stacked copy
    batch = min(CALIBRATION_BATCH, fit)
    return batch, max(1, min(BATCHES_PER_COLLECT, fit // batch))


def _chunks(feeds: list[dict[str, Any]], per_call: int = BATCHES_PER_COLLECT) -> list[list[dict[str, Any]]]:
    """Groups of up to ``per_call`` batches of one shape: ORT's histogram collector stacks
    the outputs of one collect_data call, so a shorter last batch must go in a call of its own."""
    groups: list[list[dict[str, Any]]] = []
    for feed in feeds:
        if groups and len(groups[-1]) < per_call and _shapes(groups[-1][0]) == _shapes(feed):
            groups[-1].append(feed)
        else:
            groups.append([feed])
    return groups


def _shapes(feed: dict[str, Any]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(v.shape) for v in feed.values())


def check_sample_count(source: CalibrationSource, method: str) -> None:
    need = MIN_SAMPLES[method]
    if len(source) < need:
        raise UserError(f"{method} calibration needs at least {need} images, {source.name} gave {len(source)}; "
                        f"add images{' or use --method minmax' if method != 'minmax' else ''}")


def compute_ranges(
    fp32_path: str | Path,
    source: CalibrationSource,
    method: str,
    target: str,
    cache_path: str | Path,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Calibrate the fp32 graph's MatMul/Gemm/Conv tensors on ``source``; write ORT's range cache."""
    quant = require("onnxruntime.quantization", "INT8 calibration")
    calibrate = require("onnxruntime.quantization.calibrate", "INT8 calibration")
    onnx = require("onnx")
    check_sample_count(source, method)
    settings = settings_for(target)
    input_name = onnx.load(str(fp32_path), load_external_data=False).graph.input[0].name
    external = bool(onnx_io.referenced_files(fp32_path))  # past 2 GiB the augmented graph can only be so
    options = dict(METHOD_OPTIONS[method])
    # TensorRT takes symmetric activation scales: calibrate symmetric ranges to begin with.
    options["symmetric"] = settings.activation_symmetric
    start = time.perf_counter()
    with _library_step(Path(fp32_path), Path(cache_path).parent, "ONNX Runtime's calibration graphs", copies=2) as (tmp, graph):
        with _quiet():
            calibrator = quant.create_calibrator(
                graph,
                list(QUANTIZABLE_OPS),
                augmented_model_path=str(tmp / "augmented.onnx"),
                calibrate_method=_method_enum(quant, method),
                use_external_data_format=external,
                extra_options=options,
            )
        done = 0
        batch, per_call = collection_plan(fp32_path, source.images)
        for chunk in _chunks(list(source.feeds(input_name, batch)), per_call):
            with _quiet():
                calibrator.collect_data(_Batches(chunk))
            done += sum(len(feed[input_name]) for feed in chunk)
            if progress:
                progress(done, len(source))
        with _quiet():
            ranges = calibrator.compute_data()
        del calibrator
        calibrate.save_tensors_data(ranges, Path(cache_path))
    return {
        "method": method,
        "method_options": {k: v for k, v in options.items()},
        "images": len(source),
        "batch": batch,
        "batches_per_collect": per_call,
        "tensors": len(ranges.data),
        "seconds": round(time.perf_counter() - start, 2),
    }


def quantize_graph(
    fp32_path: str | Path,
    out_path: str | Path,
    ranges_path: str | Path,
    recipe: Recipe,
    manifest: dict[str, Any] | None,
) -> dict[str, Any]:
    """Write the Q/DQ graph of ``recipe`` to ``out_path`` (a plain path: the caller makes it atomic).

    Raises InternalError when the written graph breaks the placement policy (never shipped).
    """
    quant = require("onnxruntime.quantization", "INT8 quantization")
    settings = settings_for(recipe.target)
    model = onnx_io.load(fp32_path, weights=False)  # names and structure only: the weights stay on disk
    graph_meta = ((manifest or {}).get("graph") or {})
    excluded = resolve(model, graph_meta, recipe.exclusions)
    # variable-size graphs: no Q/DQ on what is computed from valid_hw before it meets the image (the
    # per-sample position-table MatMuls; masks and the key bias have no linear layer), found by value flow
    from vitdeploy.exporters.mask_path import find_mask_path

    mask = find_mask_path(model)
    if mask is not None and mask.linear:
        excluded = {"nodes": sorted(set(excluded["nodes"]) | set(mask.linear)),
                    "by": {**excluded["by"], "valid_hw mask path": sorted(mask.linear)}}
    # dynamic graphs that resample a position table with MatMuls on constants and the input's shape
    # (exporters/position_nodes.py): never activations, so never Q/DQ
    from vitdeploy.exporters.position_nodes import position_linear_nodes

    position = position_linear_nodes(model)
    if position:
        excluded = {"nodes": sorted(set(excluded["nodes"]) | set(position)), "by": {**excluded["by"], "position subgraph": position}}
    op_types = [op for op in QUANTIZABLE_OPS if op not in recipe.exclusions.op_types]
    if not op_types:
        raise UserError("every quantizable op type is excluded; nothing would be INT8")
    extra = {
        "ActivationSymmetric": settings.activation_symmetric,
        "WeightSymmetric": True,
        "QuantizeBias": settings.quantize_bias,
        # Q/DQ on the inputs of the linear layers only: their outputs feed Softmax, GELU, the
        # residual Adds and LayerNorm, which stay float.
        "OpTypesToExcludeOutputQuantization": list(QUANTIZABLE_OPS),
        "QDQKeepRemovableActivations": True,
        **settings.extra,
    }
    start = time.perf_counter()
    with _library_step(Path(fp32_path), Path(out_path).parent, f"{Path(out_path).name} (ONNX Runtime's quantizer)", copies=2) as (_, graph), \
            _quiet():
        quant.quantize_static(
            str(graph),
            str(out_path),
            calibration_data_reader=None,
            quant_format=quant.QuantFormat.QDQ,
            op_types_to_quantize=op_types,
            per_channel=True,
            reduce_range=settings.reduce_range,
            activation_type=getattr(quant.QuantType, settings.activation_type),
            weight_type=getattr(quant.QuantType, settings.weight_type),
            nodes_to_exclude=list(excluded["nodes"]),
            calibrate_method=_method_enum(quant, recipe.method),
            extra_options=extra,
            calibration_cache_path=str(ranges_path),
            # ORT's quantizer writes <out>.data, vitdeploy's rule too (vitdeploy.onnx_io)
            use_external_data_format=bool(onnx_io.referenced_files(fp32_path)),
        )
    seconds = time.perf_counter() - start
    qmodel = onnx_io.load(out_path)
    placement = inspect_qdq_placement(qmodel, excluded["nodes"], recipe.target)
    if placement["violations"]:
        raise InternalError("the Q/DQ graph breaks the ViT placement policy: " + "; ".join(placement["violations"][:5]))
    if manifest is not None:
        core = copy.deepcopy(manifest)
        core.setdefault("graph", {})["precision"] = "int8"
        core["graph"]["quantization"] = {**recipe.to_dict(), **settings.to_dict()}
        embed_manifest(qmodel, core)
        onnx_io.save(qmodel, out_path, manifest=manifest)  # external data past the bundle's threshold
    return {
        "recipe": recipe.to_dict(),
        "settings": settings.to_dict(),
        "op_types_quantized": op_types,
        "excluded_nodes": excluded["nodes"],
        "excluded_by": excluded["by"],
        "placement": {k: v for k, v in placement.items() if k != "violations"},
        "quantize_seconds": round(seconds, 2),
    }


@contextlib.contextmanager
def _library_step(graph: Path, parent: Path, what: str, copies: int = 1) -> Iterator[tuple[Path, Path]]:
    """(folder, graph) for a step of ORT's quantizer: it writes ``<graph>-inferred.onnx`` beside the graph
    it is given and its other files in tempfile's folder, so it gets a link to ``graph`` (and a copy of its data file)
    in a hidden folder of ours under ``parent``, and that folder as its temporary folder; all of it is
    removed when the step ends, whatever happens. On a full disk it writes a truncated file and fails
    parsing it (DecodeError): that is reported as the full disk it is (vitdeploy.storage.disk_errors)."""
    files = onnx_io.graph_files(graph)
    # the graph file is a symbolic link; its external data files are copies, because onnx (>= 1.17) refuses
    # external data in a symbolic link or a file with several hard links (a path-traversal guard)
    data = [f for f in files if f != graph]
    needed = copies * sum(f.stat().st_size for f in files)  # its copies of the graph (shape-inferred, augmented, quantized)
    needed += sum(f.stat().st_size for f in data)
    require_space(parent, needed, what)
    with hidden_dir(parent, "onnxruntime", "work") as folder:
        with disk_errors(folder, needed, what, symptoms=True):
            for src in files:
                if src in data:
                    shutil.copyfile(src, folder / src.name)
                    continue
                try:
                    (folder / src.name).symlink_to(src.resolve())
                except OSError:  # no symlinks on this file system: a copy
                    shutil.copyfile(src, folder / src.name)
        with library_temp(folder), disk_errors(folder, needed, what, symptoms=True):
            yield folder, folder / graph.name


@contextlib.contextmanager
def _quiet():
    """ORT's quantizer prints progress and logs a pre-processing hint on the root logger; vitdeploy
    reports progress itself (and skips pre-processing on purpose, see the module docstring)."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(level)


def _method_enum(quant: Any, method: str) -> Any:
    return {"minmax": quant.CalibrationMethod.MinMax, "entropy": quant.CalibrationMethod.Entropy,
            "percentile": quant.CalibrationMethod.Percentile}[method]
