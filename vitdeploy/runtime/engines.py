"""The TensorRT engines of a bundle, read from their engine.json: which exist, which profile holds a shape,
and which can run on this device (and why not). No TensorRT import until an engine is asked to run here.

The one place that answers "which optimisation profile of this engine holds (batch, H, W)": the
Classifier, check, evaluate, profile and triton-repo ask :meth:`EngineEntry.profile_for`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import precisions
from ..bundle import Bundle
from ..errors import DeviceError, UserError

Triple = tuple  # (min, opt, max)
# "best" on a TensorRT engine: the lowest precision the bundle was built at (each graph's accuracy
# was measured when it was made)
TRT_BEST_ORDER = precisions.BEST_ORDER


@dataclass(frozen=True)
class EngineEntry:
    """One ``engines/<target>/`` of a bundle: its engine.json fingerprint and manifest record."""

    target: str
    dir: Path
    fingerprint: dict[str, Any]
    record: dict[str, Any]

    @property
    def precision(self) -> str:
        return str(self.fingerprint.get("precision") or self.record.get("precision") or "fp32")

    @property
    def source_precision(self) -> str:
        return str(self.fingerprint.get("source_precision") or self.record.get("source_precision") or "fp32")

    @property
    def plan_path(self) -> Path:
        return self.dir / "model.plan"

    @property
    def profiles(self) -> list[tuple[Triple, Triple, Triple]]:
        """(batch, height, width) min/opt/max triples per optimisation profile (engine.json, else the
        manifest's record of the build)."""
        listed = self.fingerprint.get("profiles") or self.record.get("profiles") or []
        return [(tuple(p["batch"]), tuple(p["height"]), tuple(p["width"]))  # type: ignore[misc]
                for p in listed if isinstance(p, dict) and {"batch", "height", "width"} <= set(p)]

    @property
    def profile(self) -> tuple[Triple, Triple, Triple]:
        if not self.profiles:
            raise UserError(f"engine {self.dir} lists no optimisation profile in engine.json; rebuild it")
        return self.profiles[0]

    def profile_for(self, height: int | None = None, width: int | None = None, batch: int | None = None) -> int | None:
        """Index of the first profile holding ``batch`` rows of ``height`` x ``width`` (an axis left None is
        not asked about); None when no profile does."""
        for i, (batches, heights, widths) in enumerate(self.profiles):
            if all(value is None or lo <= value <= hi for value, (lo, _, hi) in ((batch, batches), (height, heights), (width, widths))):
                return i
        return None

    def narrow(self, contract: Any, index: int) -> Any:
        """``contract`` as profile ``index`` of this engine bounds it (rows, H and W)."""
        batches, heights, widths = self.profiles[index]
        return contract.narrowed(batch=(int(batches[0]), int(batches[2])), heights=(int(heights[0]), int(heights[2])),
                                 widths=(int(widths[0]), int(widths[2])))

    def describe_profiles(self) -> str:
        return "; ".join(f"batch {b[0]}..{b[2]}, {h[0]}..{h[2]} x {w[0]}..{w[2]}" for b, h, w in self.profiles) or "none listed"


def find_engines(bundle: Bundle) -> list[EngineEntry]:
    """The engines built from this bundle's graphs.

    A bundle folder lists them in ``manifest["engines"]`` (records of a graph that changed are
    dropped there). A bare .onnx has no manifest to record engines in: the ``engines/*/`` beside it
    count when their engine.json names this file's sha256 as their source.
    """
    from ..engine.fingerprint import FINGERPRINT_FILE, read_fingerprint

    if bundle.bare_onnx is not None:
        found = sorted(bundle.root.glob(f"engines/*/{FINGERPRINT_FILE}"))
        if not found:
            return []
        from ..fileio import sha256_file

        digest = sha256_file(bundle.bare_onnx)
        entries = []
        for path in found:
            fingerprint = read_fingerprint(path.parent)
            if fingerprint.get("source_sha256") == digest:
                entries.append(EngineEntry(path.parent.name, path.parent, fingerprint, {}))
        return entries
    entries = []
    for target, engine in sorted(bundle.engines().items()):
        record = engine.to_dict()
        engine_dir = bundle.root / (engine.dir or f"engines/{target}")
        try:
            fingerprint = read_fingerprint(engine_dir)
        except UserError:  # recorded but its engine.json is gone: listed, and it cannot run (says why when asked)
            fingerprint = {}
        entries.append(EngineEntry(target, engine_dir, fingerprint, record))
    return entries


@dataclass(frozen=True)
class Device:
    """This machine as an engine sees it: the installed TensorRT's version and the GPU."""

    trt_version: str
    info: Any  # engine.fingerprint.DeviceInfo


def this_device() -> Device:
    """TensorRT's version and the GPU; one line when TensorRT is missing or there is no usable GPU."""
    from ..engine import fingerprint as fpmod
    from ..engine.versions import import_tensorrt, installed_version

    import_tensorrt("running TensorRT engines")  # one clear line when it is missing
    return Device(str(installed_version()), fpmod.query_device())  # DeviceError without a usable GPU


def why_not_here(entry: EngineEntry, device: Device) -> list[str]:
    """What stops ``entry`` from running on ``device`` (empty: it can): TensorRT version, GPU, compute
    capability, architecture; then its plan file against the fingerprint's sha256."""
    from ..engine import fingerprint as fpmod

    if not entry.fingerprint:
        return [f"{entry.dir} has no engine.json; rebuild it with `vitdeploy build-engine`"]
    why = fpmod.mismatches(entry.fingerprint, device.info, device.trt_version)
    if not why:
        try:
            fpmod.verify_plan_file(entry.dir, entry.fingerprint)
        except (UserError, DeviceError) as exc:
            why.append(str(exc))
    return why


def engine_for(bundle: Bundle, precision: str, height: int, width: int) -> tuple[EngineEntry, int, Device]:
    """(engine, index of its profile holding ``height`` x ``width``, this device) of the bundle's engine
    that runs here, best precision first; DeviceError naming what is wrong with each one."""
    engines = find_engines(bundle)
    if not engines:
        raise DeviceError(f"the bundle has no TensorRT engine (build one on this device with `vitdeploy build-engine {bundle.root}`)")
    wanted = TRT_BEST_ORDER if precision == "best" else (precision,)
    candidates = [e for p in wanted for e in engines if e.precision == p]
    if not candidates:
        have = ", ".join(f"{e.target} ({e.precision})" for e in engines)
        raise DeviceError(f"the bundle has no {precision} engine (has: {have})")
    device = this_device()
    problems = []
    for entry in candidates:
        why = why_not_here(entry, device)
        index = entry.profile_for(height, width)
        if index is None:
            why.append(f"no profile covers {height}x{width}")
        if why:
            problems.append(f"{entry.target}: {'; '.join(why)}")
            continue
        return entry, index, device
    raise DeviceError(f"no engine of the bundle fits this device ({' | '.join(problems)}); "
                      f"rebuild on this device with `vitdeploy build-engine {bundle.root}`")
