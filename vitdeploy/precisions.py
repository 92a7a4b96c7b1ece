"""The precisions vitdeploy writes and deploys: one entry each, and the only place their rules live.

A precision is a graph in the bundle (``model.onnx``, ``model.fp16.onnx``, ``model.int8.onnx``) whose
element types a pass decided, and everything downstream follows from its entry here: the file name,
the pass that writes it and the command that makes a missing one, its order for ``--precision best``,
which gate judges it, how TensorRT compiles it (strongly typed from 10.0; before 11 the weakly typed
path sets BuilderFlags, and trtexec the matching flags), and where it can run (the earliest TensorRT,
a minimum compute capability, DLA). The CLI choices, engine plans and trtexec lines, runner and
engine selection, Triton configs, serve, profile, evaluate and check read it.

Adding a precision is one more ``Precision(...)`` in ``REGISTRY`` plus the pass that writes its graph
(docs/DESIGN.md, "Adding a precision").

``model.cpu.onnx`` is not a precision: it is the fp32 graph with ONNX Runtime's fused attention, a
variant for one backend (``convert --target cpu``). It sits in ``VARIANTS``; it computes in fp32 and
is judged by the fp32 gate.

Core module: no imports beyond the standard library, valid on Python 3.8 (the device side).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

# The reference precision: the graph export always writes, and what every other graph is measured against.
REFERENCE = "fp32"
BEST = "best"  # a choice, not a precision: the highest-ranked one present

# TensorRT versions as (major, minor). The weakly typed precision path (BuilderFlag.FP16/INT8, trtexec
# --fp16/--int8) exists before 11.0; strongly typed networks from 10.0 (vitdeploy.engine.versions).
Version = Tuple[int, int]
WEAK_FLAGS_UNTIL: Version = (11, 0)
STRONGLY_TYPED_FROM: Version = (10, 0)


@dataclass(frozen=True)
class Precision:
    name: str
    artifact: str  # the graph's file name in a bundle
    graph_dtypes: Tuple[str, ...]  # ONNX element types the pass puts in the graph (besides its fp32 islands)
    passes: Tuple[str, ...]  # the commands that write the graph: export, convert, calibrate
    make_hint: str  # how to make a missing graph, as the refusal says it
    rank: int  # "best" takes the highest rank present (each graph's accuracy was gated when it was made)
    gate: str  # "exact": max |dlogit| against PyTorch; "reduced": cosine, top-1 agreement, accuracy drop
    # TensorRT: the BuilderFlags a weakly typed build sets (before 11: 8.x builds every graph weakly typed,
    # --legacy-precision the fp32 graph with these flags) and trtexec's spelling of them, in the same order.
    weak_builder_flags: Tuple[str, ...] = ()
    weak_trtexec_flags: Tuple[str, ...] = ()
    strongly_typed: bool = True  # compiled as a strongly typed network where TensorRT has them (10.0+)
    legacy_needs_calibration: bool = False  # --legacy-precision needs the implicit calibrator (data or cache)
    # Where it runs: the earliest TensorRT that builds it, the least compute capability (None: any GPU that
    # TensorRT version supports), and whether a DLA core runs it.
    min_trt: Version = (8, 5)
    min_compute_capability: Optional[Version] = None
    dla: bool = False
    gpu_peak_dtype: str = "fp32"  # the dense-GEMM probe a GPU profile cell is compared with
    torch_dtype: Optional[str] = None  # profile's PyTorch baseline on this precision (torch dtype name), None: none

    @property
    def reduced(self) -> bool:
        """Gated by agreement with fp32 rather than exactly; has a placement policy in its graph."""
        return self.gate == "reduced"

    @property
    def exported(self) -> bool:
        return "export" in self.passes

    def builder_flags(self, trt: Version) -> Tuple[str, ...]:
        """BuilderFlag names of a weakly typed build on TensorRT ``trt`` (none from 11.0: strongly typed only)."""
        return self.weak_builder_flags if tuple(trt) < WEAK_FLAGS_UNTIL else ()

    def trtexec_flags(self, trt: Version) -> Tuple[str, ...]:
        """trtexec's flags for a weakly typed build on TensorRT ``trt`` (--fp16/--int8 were removed in 11)."""
        return self.weak_trtexec_flags if tuple(trt) < WEAK_FLAGS_UNTIL else ()

    def why_not_on(self, trt: Version, compute_capability: Optional[Version] = None, dla: bool = False) -> Optional[str]:
        """None when a target with this TensorRT (and compute capability, DLA) runs it; else the reason."""
        if tuple(trt) < self.min_trt:
            return f"{self.name} needs TensorRT {self.min_trt[0]}.{self.min_trt[1]} or later"
        if compute_capability is not None and self.min_compute_capability and tuple(compute_capability) < self.min_compute_capability:
            need = self.min_compute_capability
            return f"{self.name} needs compute capability {need[0]}.{need[1]} or later"
        if dla and not self.dla:
            return f"DLA does not run {self.name}"
        return None


@dataclass(frozen=True)
class Variant:
    """A graph for one backend that is not a precision of its own: it computes in ``computes_in``."""

    name: str
    artifact: str
    computes_in: str
    made_by: str


REGISTRY: Tuple[Precision, ...] = (
    Precision(
        name="fp32", artifact="model.onnx", graph_dtypes=("float32",), passes=("export",),
        make_hint="re-export it with `vitdeploy export`", rank=0, gate="exact",
        gpu_peak_dtype="fp32", torch_dtype="float32",
    ),
    Precision(
        name="fp16", artifact="model.fp16.onnx", graph_dtypes=("float16", "float32"), passes=("export", "convert"),
        make_hint="create it with `vitdeploy convert --precision fp16` or `export --precision fp16`", rank=1, gate="reduced",
        weak_builder_flags=("FP16",), weak_trtexec_flags=("--fp16",), dla=True,
        gpu_peak_dtype="fp16", torch_dtype="float16",
    ),
    Precision(
        # explicit Q/DQ (int8 weights and activations, per-tensor scales) around float compute
        name="int8", artifact="model.int8.onnx", graph_dtypes=("int8", "float32"), passes=("calibrate",),
        make_hint="create it with `vitdeploy calibrate`", rank=2, gate="reduced",
        weak_builder_flags=("INT8", "FP16"), weak_trtexec_flags=("--int8", "--fp16"), legacy_needs_calibration=True, dla=True,
        gpu_peak_dtype="fp16",
    ),
    Precision(
        # explicit E4M3 Q/DQ (per-tensor scales, amax/448) on the linear layers and, where the target's fused
        # attention takes FP8, on Q, K, V and the softmax output; the rest as the fp16 graph keeps it
        # (calibration/fp8.py). Strongly typed only: TensorRT's explicit quantization is meant with strong
        # typing and no precision flags ("Explicit Quantization", https://docs.nvidia.com/deeplearning/tensorrt/
        # latest/inference-library/quantized-types-explicit-quantization.html), which exist from 10.0; FP8
        # tensor cores from compute capability 8.9 (Ada; Hopper 9.0, Blackwell and Thor above). DLA has no FP8.
        name="fp8", artifact="model.fp8.onnx", graph_dtypes=("float8e4m3fn", "float16", "float32"), passes=("calibrate",),
        make_hint="create it with `vitdeploy calibrate --precision fp8`", rank=3, gate="reduced",
        min_trt=(10, 0), min_compute_capability=(8, 9), dla=False, gpu_peak_dtype="fp16",
    ),
)

VARIANTS: Tuple[Variant, ...] = (
    Variant(name="cpu", artifact="model.cpu.onnx", computes_in="fp32", made_by="convert --target cpu"),
)

BY_NAME: Dict[str, Precision] = {p.name: p for p in REGISTRY}
VARIANT_BY_NAME: Dict[str, Variant] = {v.name: v for v in VARIANTS}

# Every name, in registry order (fp32 first): CLI choices, a bundle's graphs as listed.
NAMES: Tuple[str, ...] = tuple(p.name for p in REGISTRY)
# "best": highest rank first.
BEST_ORDER: Tuple[str, ...] = tuple(p.name for p in sorted(REGISTRY, key=lambda p: -p.rank))
# The reduced precisions (gated against fp32), best first: debug-precision's choices.
REDUCED: Tuple[str, ...] = tuple(n for n in BEST_ORDER if BY_NAME[n].reduced)
# A bundle's graph files, precisions and variants: manifest["artifacts"] keys -> file names.
ARTIFACT_FILES: Dict[str, str] = {**{p.name: p.artifact for p in REGISTRY}, **{v.name: v.artifact for v in VARIANTS}}
# Graphs made from the fp32 graph: valid while it is unchanged.
DERIVED_ARTIFACTS: Tuple[str, ...] = tuple(k for k in ARTIFACT_FILES if k != REFERENCE)


def get(name: str) -> Precision:
    """The entry for ``name`` (KeyError for a name that is not a precision)."""
    return BY_NAME[name]


def computes_in(artifact: str) -> str:
    """The precision an artifact key computes in: itself, or a variant's (``cpu`` -> ``fp32``)."""
    variant = VARIANT_BY_NAME.get(artifact)
    return variant.computes_in if variant else artifact


def choices(best: bool = False, best_first: bool = True) -> Tuple[str, ...]:
    """The names a ``--precision`` option takes, with ``best`` first or last when asked."""
    if not best:
        return NAMES
    return (BEST,) + NAMES if best_first else NAMES + (BEST,)


def calibrated() -> Tuple[str, ...]:
    """The precisions `calibrate` writes (its --precision choices), in registry order."""
    return tuple(p.name for p in REGISTRY if "calibrate" in p.passes)


def best_of(available) -> Optional[str]:  # available: any container of names
    """The highest-ranked precision among ``available``, None when there is none."""
    return next((n for n in BEST_ORDER if n in available), None)


def listing(names=NAMES, word: str = "and") -> str:
    """'fp32, fp16 and int8' style text for messages (``word``: and / or)."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {word} {names[-1]}"


def writers_text() -> str:
    """What writes each precision, as the refusals say it, grouped by the passes that write them:
    'fp32 and fp16 (export, convert), int8 and fp8 (calibrate)'."""
    exported = [p for p in REGISTRY if p.exported]
    passes = []
    for p in exported:
        passes += [s for s in p.passes if s not in passes]
    groups: Dict[str, list] = {", ".join(passes): [p.name for p in exported]} if exported else {}
    for p in REGISTRY:
        if not p.exported:
            groups.setdefault(", ".join(p.passes), []).append(p.name)
    return ", ".join(f"{' and '.join(names)} ({writers})" for writers, names in groups.items())


def manifest_record() -> Dict[str, object]:
    """What a bundle records about the precisions (for readers without this module, e.g. the C++ host
    library): the "best" order and each graph's file."""
    return {"best_order": list(BEST_ORDER), "files": {p.name: p.artifact for p in REGISTRY}}
