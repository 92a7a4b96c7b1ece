"""One answer to "which runner runs this bundle here?": bundle + precision + backend + device -> runner,
with the reason for each backend passed over (issue 28). The Classifier (and so `predict`, `embed` and
`serve`), `check`, `evaluate` and `profile` resolve their graph runners here.

- ONNX Runtime: the graph of the precision asked for ("best": fp16 where ONNX Runtime really runs on
  CUDA, else fp32, since fp16/int8 graphs gain nothing on a CPU and int8 integer kernels lose accuracy
  on CPUs without VNNI); fp32 on a CPU runs the bundle's fused CPU graph (model.cpu.onnx) when it is
  current and passed its gate.
- TensorRT: the bundle's engine whose fingerprint (TensorRT version, GPU, compute capability) matches
  this device and one of whose profiles holds the contract's size; "best" is the lowest precision built.

Every runner comes back with the bundle's input contract narrowed to what it takes (an engine
profile's rows and H/W, a graph's fixed batch), after checking that its inputs are the contract's.
The PyTorch runners live with the exporters (they need torch); the layers above build them there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .. import precisions
from ..bundle import Bundle
from ..contract import InputContract
from ..errors import DeviceError, IntegrityError, MissingDependencyError, UserError
from .base import Runner
from .engines import TRT_BEST_ORDER, EngineEntry, engine_for, find_engines, this_device, why_not_here

BACKENDS = ("tensorrt", "onnxruntime")
PRECISION_CHOICES = precisions.choices(best=True)
DEVICES = ("auto", "cpu", "cuda")
DEFAULT_ORT_BATCH = 32  # rows per call for dynamic-batch graphs: bounds host memory per call
__all__ = ["BACKENDS", "DEFAULT_ORT_BATCH", "PRECISION_CHOICES", "TRT_BEST_ORDER", "EngineRun", "Selected", "engines_here",
           "onnxruntime_runner", "open_engine", "ort_providers", "select_runner", "tensorrt_runner"]


@dataclass
class Selected:
    """A runner chosen for a bundle, what it takes, and why it was chosen."""

    runner: Runner
    backend: str  # "tensorrt" | "onnxruntime"
    precision: str
    contract: InputContract  # narrowed to this runner (engine profile, fixed batch)
    reason: str  # what runs: backend, precision, device, artifact
    artifact: Path  # the graph file or the engine folder
    thread_safe: bool  # ONNX Runtime sessions take concurrent run() calls; a TensorRT context does not
    passed_over: list[str] = field(default_factory=list)  # "backend: why not" for each backend tried before
    engine: EngineEntry | None = None

    @property
    def backend_reason(self) -> str:
        return "; ".join(self.passed_over + [self.reason])


def ort_providers(device: str = "auto") -> list[str] | None:
    """Execution providers for a device: the CPU alone, CUDA then the CPU, or None (ONNX Runtime's
    default: CUDA when onnxruntime-gpu has it, then the CPU)."""
    if device not in DEVICES:
        raise UserError(f"unknown device {device!r}; choose from {', '.join(DEVICES)}")
    return {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"]}.get(device)


def graph_for(bundle: Bundle, precision: str, cuda: bool, fused_cpu: bool = True) -> Path:
    """The graph ONNX Runtime loads for ``precision``: on CPUs the fp32 precision uses the bundle's fused CPU
    graph (model.cpu.onnx: ORT's Attention op) when it was made from the current fp32 graph and passed its
    gate; everything else runs the plain graph (its sha256 checked against the manifest)."""
    if precision == "fp32" and not cuda and fused_cpu:
        from .fused import cpu_graph_for

        fused = cpu_graph_for(bundle)
        if fused is not None:
            return fused
    return bundle.artifact_path(precision)


def check_inputs(runner: Runner, contract: InputContract, what: Any) -> None:
    """The runner's inputs are the contract's (by name, in the contract's order), else one line."""
    names = runner.input_names()
    if sorted(names) != sorted(contract.input_names):
        runner.close()
        raise UserError(f"{what} takes inputs ({', '.join(names)}) but the bundle's manifest describes "
                        f"({', '.join(contract.input_names)}); re-export the bundle")


def onnxruntime_runner(bundle: Bundle, contract: InputContract | None = None, precision: str = "best",
                       providers: Sequence[str] | None = None, threads: int | None = None, optimization: str = "all",
                       fused_cpu: bool = True, graph: Path | None = None) -> Selected:
    """An ONNX Runtime session on the bundle's graph of ``precision`` ("best": see the module doc), or on
    ``graph`` (a re-exported variant) computing at that precision."""
    from .ort import OrtRunner, default_providers

    contract = contract or InputContract.from_bundle(bundle)
    providers = list(providers) if providers else default_providers()
    wants_cuda = "CUDAExecutionProvider" in providers
    have = bundle.precisions()
    chosen = precision
    if precision == "best":
        chosen = "fp16" if wants_cuda and "fp16" in have else "fp32"
        if chosen not in have and have:
            chosen = have[0]
    path = graph or graph_for(bundle, chosen, wants_cuda, fused_cpu)
    runner = OrtRunner(path, precision=chosen, providers=providers, threads=threads, optimization=optimization)
    if precision == "best" and chosen == "fp16" and runner.info.device == "cpu" and graph is None:
        # onnxruntime-gpu lists CUDA without a usable GPU and falls back silently: fp32 on the CPU.
        runner.close()
        chosen = "fp32"
        path = graph_for(bundle, chosen, False, fused_cpu)
        runner = OrtRunner(path, precision=chosen, providers=providers, threads=threads, optimization=optimization)
    check_inputs(runner, contract, path)
    batch_axis = runner.inputs()[0].shape[0] if runner.inputs()[0].shape else None
    if isinstance(batch_axis, int) and batch_axis > 0:  # a graph exported with a fixed batch
        contract = contract.narrowed(batch=(batch_axis, batch_axis))
    used = runner.info.details.get("providers", [])
    reason = f"onnxruntime {chosen} on {runner.info.device} ({', '.join(used)}); {path.name}{_kind_note(contract)}"
    return Selected(runner, "onnxruntime", chosen, contract, reason, path, thread_safe=True)


def _kind_note(contract: InputContract) -> str:
    details = contract.runtime_details()
    return f"; variable-size, {details['canvas'][0]}x{details['canvas'][1]} canvas" if "canvas" in details else ""


def open_engine(entry: EngineEntry) -> Runner:
    """The TensorRT runner of one engine (GPU-only; tests stand in for it). It checks the fingerprint
    again (cheap) and picks, per call, the profile covering the call's shapes."""
    from .tensorrt import TensorRTRunner

    return TensorRTRunner(entry.dir)


def tensorrt_runner(bundle: Bundle, contract: InputContract | None = None, precision: str = "best") -> Selected:
    """The bundle's engine that runs here and holds the contract's size (see the module doc)."""
    contract = contract or InputContract.from_bundle(bundle)
    entry, index, device = engine_for(bundle, precision, *contract.size)
    runner = open_engine(entry)
    check_inputs(runner, contract, f"engine {entry.dir}")
    reason = f"tensorrt {entry.precision} engine {entry.target} (TensorRT {device.trt_version}, {device.info.gpu_name}){_kind_note(contract)}"
    return Selected(runner, "tensorrt", entry.precision, entry.narrow(contract, index), reason, entry.dir,
                    thread_safe=False, engine=entry)


def select_runner(bundle: Bundle, contract: InputContract | None = None, prefer: Sequence[str] = BACKENDS, precision: str = "best",
                  providers: Sequence[str] | None = None, threads: int | None = None, device: str = "auto") -> Selected:
    """The first backend of ``prefer`` that can run ``bundle`` here; the reasons the others were passed
    over travel with it. With one backend asked for, its own error is the answer. A graph the manifest does
    not vouch for is refused, never passed over."""
    if precision not in PRECISION_CHOICES:
        raise UserError(f"precision must be one of {', '.join(PRECISION_CHOICES)}, got {precision!r}")
    prefer = tuple(prefer)
    unknown = [b for b in prefer if b not in BACKENDS]
    if unknown or not prefer:
        raise UserError(f"unknown backend {', '.join(unknown) or '(none)'}; choose from {', '.join(BACKENDS)}")
    contract = contract or InputContract.from_bundle(bundle)
    passed_over: list[str] = []
    for backend in prefer:
        try:
            if backend == "tensorrt":
                chosen = tensorrt_runner(bundle, contract, precision)
            else:
                chosen = onnxruntime_runner(bundle, contract, precision, providers or ort_providers(device), threads)
        except IntegrityError:
            raise
        except (DeviceError, UserError) as exc:  # MissingDependencyError is a UserError
            if len(prefer) == 1:
                raise
            passed_over.append(f"{backend}: {exc}")
            continue
        chosen.passed_over = passed_over
        return chosen
    raise DeviceError(f"no backend can run {bundle.root} here ({'; '.join(passed_over)})")


@dataclass
class EngineRun:
    """One engine of a bundle as `check` and `evaluate` meet it: a runner with its contract, or why not."""

    entry: EngineEntry
    runner: Runner | None = None
    contract: InputContract | None = None  # narrowed to the engine's first profile holding the contract's size
    skipped: str | None = None


def engines_here(bundle: Bundle, contract: InputContract, sizes: Sequence[tuple[int, int]] | None = None,
                 purpose: str = "checked") -> list[EngineRun]:
    """Every engine of the bundle: opened where it runs on this device and one of its profiles holds one of
    ``sizes`` (H, W; default: the contract's size), else the reason it was skipped (``purpose``: what the
    caller does with engines, for that line). The contract comes narrowed to the first profile holding the
    first such size."""
    entries = find_engines(bundle)
    if not entries:
        return []
    sizes = list(sizes or [contract.size])
    try:
        device = this_device()
    except MissingDependencyError:
        return [EngineRun(e, skipped=f"TensorRT is not installed on this machine (engines are {purpose} on their target GPU)")
                for e in entries]
    except (DeviceError, UserError) as exc:
        return [EngineRun(e, skipped=str(exc)) for e in entries]
    runs = []
    for entry in entries:
        why = why_not_here(entry, device)
        index = next((i for i in (entry.profile_for(h, w) for h, w in sizes) if i is not None), None)
        if index is None and entry.profiles:
            shown = ", ".join(f"{h}x{w}" for h, w in sizes)
            why.append(f"no optimisation profile of the engine takes {shown} ({entry.describe_profiles()})")
        if why:
            runs.append(EngineRun(entry, skipped="; ".join(why)))
            continue
        try:
            runner = open_engine(entry)
            check_inputs(runner, contract, f"engine {entry.dir}")
        except (DeviceError, UserError) as exc:
            runs.append(EngineRun(entry, skipped=str(exc)))
            continue
        runs.append(EngineRun(entry, runner, entry.narrow(contract, index) if index is not None else contract))
    return runs
