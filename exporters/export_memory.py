"""Export memory (issue 32): what an export holds at its peak, refusing what cannot fit, freeing what is done.

Where a ViT-L/16 export (1.22 GB of fp32 weights) used to reach 11.1 GB (about 9x the weights), measured
phase by phase here (``/proc/self/status`` VmHWM reset before each step, ViT-B/16 and ViT-L/16):

* ``onnx.save`` of a single-file graph: ``SerializeToString`` needs about 4x the graph while it runs
  (upb grows its buffer, then copies it into a Python bytes object): +1.34 GB for ViT-B/16's 330 MB.
  Now :func:`vitdeploy.onnx_io.save` writes the protobuf wire format a tensor at a time: +34 MB.
* the PyTorch model held through onnxslim, the write and the ONNX Runtime session: now PyTorch's
  outputs for the verification are computed before the export and the model is freed after it
  (:func:`release_torch_model`); verification compares ONNX Runtime with those arrays.
* two libraries that kept the graph alive after they returned: onnxscript's rewrite rules (the
  exporter's optimizer) held the ONNX IR model and with it every PyTorch parameter, onnxslim's
  fusion patterns held nodes of the graph they simplified and with them its protobuf arena
  (``exporters/onnx_export.py``: ``release_rewriter_matches``, ``release_simplifier_matches``).
* the exporter's graph held beside onnxslim's and through the verification (kept in case onnxslim's
  graph fails it): it now waits in a temporary file.
* ONNX Runtime sessions built from bytes in memory, and sessions of single-file graphs (1.6x the
  graph; 1.0x with external data, whose tensors are mapped from the file).

What stays is onnxslim itself (its input, numpy copies of the weights and its output: about 2.2-2.5x
the weights over the loaded model, the peak of a verified export) and the dynamo export (the
ModelProto beside the model: 1.2-1.3x). :func:`estimate_peak` is that model with the measured
factors; :func:`check_export_fits` refuses an export it does not fit.
"""

from __future__ import annotations

from typing import Any, Callable

from vitdeploy.costs import available_memory_bytes, memory_estimate
from vitdeploy.errors import UserError

from .process_memory import current_rss_bytes, peak_rss_bytes  # noqa: F401 - tests patch them here
from .verify import DEFAULT_BUDGET_GMACS, DEFAULT_MEMORY_BUDGET_MB, plan_verification, release, verification_sizes_for

# Bytes per byte of fp32 weights an export adds at its peak over the process's size once the model is
# loaded (which holds the imports and one copy of the weights): the largest phase wins. Measured with
# VmHWM reset before each phase (2026-12-02; ViT-B/16 346 MB, ViT-L/16 1.22 GB of weights, dynamic):
# dynamo export 1.31 / 1.16, onnxslim 2.47 / 2.20 (its input beside its numpy copies and its output),
# one ORT session of the written graph with a verification batch 0.78 / 0.45.
EXPORT_FACTOR = 1.35
SLIM_FACTOR = 2.5
SESSION_FACTOR = 0.8  # plus the cost model's activations of the largest verification batch
IDENTITY_FACTOR = 2.7  # --no-check: onnxslim, then its identity check (two graphs, two sessions in turn)
HEADROOM_BYTES = 256 << 20  # allocator slack and the ORT/torch thread pools


def model_weight_bytes(model: Any) -> int:
    """Bytes of a torch module's parameters and buffers (each tensor counted once)."""
    seen, total = set(), 0
    for tensor in list(model.parameters()) + list(model.buffers()):
        key = (tensor.data_ptr(), tensor.numel())
        if key not in seen and tensor.device.type != "meta":
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total


def estimate_peak(now: int, weights: int, check: bool, simplify: bool, activation_bytes: int) -> int:
    """Bytes this export will reach (module docstring): ``now`` holds the imports and the model."""
    factor = EXPORT_FACTOR
    if simplify:
        factor = max(factor, SLIM_FACTOR if check else IDENTITY_FACTOR)
    extra = weights * factor
    if check:  # PyTorch's reference batches beside the model, then one session and its batches
        extra = max(extra, activation_bytes, weights * SESSION_FACTOR + activation_bytes)
    return int(now + extra + HEADROOM_BYTES)


def check_export_fits(variant: Any, plan_bundle: Any, opts: Any, log: Callable[[str], None],
                      available: int | None = None) -> dict[str, Any]:
    """Refuse, in one line, an export whose estimated peak exceeds the memory this machine has
    (this process's size now + what the OS can give it); say what would fit."""
    weights = model_weight_bytes(variant.model)
    now = current_rss_bytes()
    free = available if available is not None else available_memory_bytes()
    plans = plan_verification(plan_bundle.spec, verification_sizes_for(plan_bundle), opts.check_images, DEFAULT_BUDGET_GMACS,
                              DEFAULT_MEMORY_BUDGET_MB)
    activation = max((memory_estimate(plan_bundle.spec, p.height, p.width, p.batch).total_bytes for p in plans), default=0)
    peak = estimate_peak(now, weights, opts.check, opts.simplify, activation)
    record = {"weights_bytes": weights, "rss_before_bytes": now, "estimated_peak_bytes": peak, "available_bytes": free}
    if free is None or peak <= now + free:
        return record
    machine = now + free
    options = []
    if opts.simplify and opts.check:
        options.append(("--no-simplify (no onnxslim copy beside the exporter's graph)",
                        estimate_peak(now, weights, True, False, activation)))
    if opts.check:
        options.append(("--no-check --no-simplify (no ONNX Runtime session; verify later with `vitdeploy check` "
                        "on a larger machine)", estimate_peak(now, weights, False, False, 0)))
    fits = [f"{what}: about {gib(need)}" for what, need in options if need <= machine]
    raise UserError(
        f"this export needs about {gib(peak)} of memory at its peak ({gib(weights)} of fp32 weights: the PyTorch model, "
        f"one ONNX graph and one ONNX Runtime session), but this machine has {gib(machine)} for it "
        f"({gib(now)} in use by this process, {gib(free)} available); "
        + (f"what would fit: {'; '.join(fits)}" if fits else
           "nothing smaller fits either: export on a machine with more memory"))


def release_torch_model(*loaded: Any) -> None:
    """Drop the PyTorch model of each LoadedModel (the export's references hold its outputs) and give
    the memory back to the OS."""
    for item in loaded:
        item.model = None
    release()


def gib(value: float) -> str:
    """Bytes in GiB, MiB or KiB, whichever keeps the number at least 1."""
    for power, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if value >= 2**power:
            return f"{value / 2**power:.1f} {unit}"
    return f"{value:.0f} B"


def log_peak(log: Callable[[str], None], written: dict[str, Any]) -> None:
    """One line: the graph's size (and its data file's) and this process's peak resident memory."""
    data = written.get("data")
    files = f"{written['file']} {gib(written['bytes'])}" + (f" + {data['file']} {gib(data['bytes'])}" if data else "")
    log(f"fp32 graph {files}; peak resident memory of this process {gib(peak_rss_bytes())} (getrusage)")
