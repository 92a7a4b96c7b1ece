"""The TensorRT build knobs, each declared once: its option, its record in the plan, its words in the plan's
description, its trtexec flag and its builder call, per TensorRT version.

``plan.PlanOptions`` and ``plan.EnginePlan`` take their knob fields from ``KNOBS``; ``make_plan`` checks each
option with its knob, ``service.describe_plan``, ``trtexec.trtexec_command`` and ``builder.recipe`` write each
knob's part from here, and ``vitdeploy build-engine`` makes its options from the ``cli_*`` fields. Adding a
knob is one ``Knob(...)`` below (docs/DESIGN.md, "Adding an engine knob"); its TensorRT names are checked
against the real bindings by tests/test_engine_bindings.py through the recipe.

trtexec flags: ``samples/common/sampleOptions.cpp`` of NVIDIA/TensorRT at v8.6.1, v10.3.0, v10.16 and
release/11.1 (see ``trtexec``); builder calls: ``IBuilderConfig`` of the same versions.

The orders of the outputs are part of their formats (engine.json's plan keys, the trtexec line, the
recorded recipe): ``KNOBS`` is in option order, which is also the builder's; ``recorded_after`` and
``trtexec_after`` name where a knob added later sits in the other two.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..errors import ConfigError, UserError
from . import portable
from .versions import Capabilities

HARDWARE_COMPAT = ("none", "ampere+", "same-cc")
MAX_OPT_LEVEL = 5  # builder optimisation levels are 0..5 (trtexec help, TensorRT 8.6 to 11)
_HW_COMPAT_TRTEXEC = {"ampere+": "ampere+", "same-cc": "sameComputeCapability"}
_HW_COMPAT_ENUM = {"ampere+": "AMPERE_PLUS", "same-cc": "SAME_COMPUTE_CAPABILITY"}


@dataclass(frozen=True)
class Ref:
    """A name inside the tensorrt module, resolved only when the recipe is applied."""

    path: str


@dataclass(frozen=True)
class Step:
    """``config.<member>(*args)``, or ``config.<member> = args[0]`` when ``assign``."""

    member: str
    args: Tuple[Any, ...] = ()
    assign: bool = False


# -- sizes ------------------------------------------------------------------------------------------------
_SIZE_UNITS = {"": 1 << 20, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "b": 1}


def parse_workspace_size(text: str) -> int:
    """'4G', '512M', '1.5GiB', '2048' (a bare number is MiB, as trtexec reads it) -> bytes. Not the rule of
    ``onnx_io.parse_size`` (--external-data-threshold), where a bare number is bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtb]?)(?:i?b)?\s*", str(text).lower())
    if not match:
        raise UserError(f"size {text!r} is not a number with an optional K/M/G suffix (e.g. 4G or 512M)")
    value = float(match.group(1)) * _SIZE_UNITS[match.group(2)]
    if value < 1 << 20:
        raise UserError(f"workspace {text!r} is below 1 MiB; give e.g. 512M or 4G")
    return int(value)


def _mib(nbytes: int) -> str:
    mib = nbytes / (1 << 20)
    return str(int(mib)) if mib.is_integer() else f"{mib:.4f}".rstrip("0")


# -- each knob's rules --------------------------------------------------------------------------------------
def _check_workspace(value: Any, caps: Capabilities) -> Optional[int]:
    return parse_workspace_size(value) if value else None


def _check_opt_level(value: Any, caps: Capabilities) -> Optional[int]:
    if value is None:
        return None
    if not 0 <= int(value) <= MAX_OPT_LEVEL:
        raise UserError(f"--opt-level {value} is outside 0..{MAX_OPT_LEVEL}")
    if not caps.builder_optimization_level:
        raise ConfigError(f"TensorRT {caps.version} has no builder optimisation level (added in 8.6); drop --opt-level")
    return int(value)


def _check_hw_compat(value: Any, caps: Capabilities) -> str:
    hw = value or "none"
    if hw not in HARDWARE_COMPAT:
        raise UserError(f"--hardware-compat {hw!r} is not one of {', '.join(HARDWARE_COMPAT)}")
    if hw != "none" and not caps.hardware_compatibility:
        raise ConfigError(f"TensorRT {caps.version} has no hardware-compatible engines (added in 8.6)")
    if hw == "same-cc" and not caps.same_compute_capability:
        raise ConfigError(f"TensorRT {caps.version} has no same-compute-capability engines (added in 10.9); use ampere+ or none")
    return hw


def _check_version_compat(value: Any, caps: Capabilities) -> bool:
    if value and not caps.version_compatible:
        raise ConfigError(f"TensorRT {caps.version} has no version-compatible engines (added in 8.6)")
    return bool(value)


def _check_dla_core(value: Any, caps: Capabilities) -> Optional[int]:
    # the rest of DLA's rules (precision, static profiles, sizes) need the whole plan: plan.make_plan
    if value is not None and int(value) < 0:
        raise UserError(f"--dla-core {value} must be 0 or more")
    return int(value) if value is not None else None


def _strip_steps(plan: Any, caps: Capabilities) -> List[Step]:
    if not (caps.strip_plan and caps.refit_identical):
        raise ConfigError(f"TensorRT {caps.version} has no weight-stripped plans (STRIP_PLAN + REFIT_IDENTICAL, 10.0+)")
    return [Step("set_flag", (Ref(f"BuilderFlag.{flag}"),)) for flag in portable.recipe_flags(plan)]


def _dla_steps(plan: Any, caps: Capabilities) -> List[Step]:
    steps = [Step("default_device_type", (Ref("DeviceType.DLA"),), assign=True), Step("DLA_core", (int(plan.dla_core),), assign=True)]
    if plan.gpu_fallback:
        steps.append(Step("set_flag", (Ref("BuilderFlag.GPU_FALLBACK"),)))
    return steps


def _dla_flags(plan: Any, caps: Capabilities) -> List[str]:
    return [f"--useDLACore={plan.dla_core}"] + (["--allowGPUFallback"] if plan.gpu_fallback else [])


_Check = Callable[[Any, Capabilities], Any]
_Words = Callable[[Any], Optional[str]]
_Flags = Callable[[Any, Capabilities], List[str]]
_Steps = Callable[[Any, Capabilities], List[Step]]


def _as_given(value: Any, caps: Capabilities) -> Any:
    return value


def _nothing(*_: Any) -> Any:
    return None


def _no_flags(*_: Any) -> List[Any]:
    return []


@dataclass(frozen=True)
class Knob:
    """One build knob. ``option`` is the PlanOptions field, ``plan_field`` the EnginePlan field it becomes."""

    option: str
    option_type: str  # annotation of the PlanOptions field
    default: Any
    plan_field: str
    plan_type: str
    plan_default: Any
    cli: Tuple[str, ...]  # build-engine's option names, then the parameter name
    cli_help: str
    cli_kind: str = "value"  # value | int | flag | choice | path | no-flag (a --no-X flag that sets the knob False)
    cli_metavar: Optional[str] = None
    cli_choices: Tuple[str, ...] = ()  # the values a choice takes
    check: Optional[_Check] = _as_given  # option value -> plan value (one line when this TensorRT lacks it); None: set later
    words: _Words = _nothing  # plan -> the knob's words in the plan's description (None: no words)
    trtexec: _Flags = _no_flags  # (plan, caps) -> trtexec flags
    builder: _Steps = _no_flags  # (plan, caps) -> IBuilderConfig steps
    builder_after_precision: bool = False  # its steps follow the precision's BuilderFlags
    recorded_after: Optional[str] = None  # the EnginePlan field it is recorded after (None: the knob block)
    trtexec_after: Optional[str] = None  # the knob whose flags it follows on the trtexec line (None: table order)


KNOBS: Tuple[Knob, ...] = (
    Knob("workspace", "str | None", None, "workspace_bytes", "int | None", None,
         cli=("--workspace", "workspace"), cli_metavar="SIZE",
         cli_help="Workspace memory limit, e.g. 4G or 512M (plain numbers are MiB).",
         check=_check_workspace,
         words=lambda plan: f"workspace {plan.workspace_bytes / (1 << 20):.0f} MiB" if plan.workspace_bytes else None,
         trtexec=lambda plan, caps: [f"--memPoolSize=workspace:{_mib(plan.workspace_bytes)}"] if plan.workspace_bytes else [],
         builder=lambda plan, caps: [Step("set_memory_pool_limit", (Ref("MemoryPoolType.WORKSPACE"), int(plan.workspace_bytes)))]
         if plan.workspace_bytes else []),
    Knob("optimization_level", "int | None", None, "optimization_level", "int | None", None,
         cli=("--opt-level", "opt_level"), cli_kind="int",
         cli_help="Builder optimisation level 0..5 (TensorRT >= 8.6; its default is 3).",
         check=_check_opt_level,
         words=lambda plan: None if plan.optimization_level is None else f"opt level {plan.optimization_level}",
         trtexec=lambda plan, caps: [] if plan.optimization_level is None else [f"--builderOptimizationLevel={plan.optimization_level}"],
         builder=lambda plan, caps: [] if plan.optimization_level is None
         else [Step("builder_optimization_level", (int(plan.optimization_level),), assign=True)]),
    Knob("timing_cache", "str | None", None, "timing_cache", "str | None", None,
         cli=("--timing-cache", "timing_cache"), cli_kind="path",
         cli_help="Load/save a timing cache, keyed by TensorRT version and GPU.",
         check=lambda value, caps: str(value) if value else None,  # the builder loads and saves it (builder.build)
         words=lambda plan: f"timing cache {plan.timing_cache}" if plan.timing_cache else None,
         trtexec=lambda plan, caps: [f"--timingCacheFile={plan.timing_cache}"] if plan.timing_cache else []),
    Knob("hardware_compatibility", "str", "none", "hardware_compatibility", "str", "none",
         cli=("--hardware-compatible", "--hardware-compat", "hardware_compat"), cli_kind="choice", cli_choices=HARDWARE_COMPAT,
         cli_help="Hardware-compatible engine: other GPUs of that level, same platform (ampere+: TensorRT >= 8.6; same-cc: >= 10.9).",
         check=_check_hw_compat,
         words=lambda plan: None if plan.hardware_compatibility == "none" else f"hardware-compat {plan.hardware_compatibility}",
         trtexec=lambda plan, caps: [] if plan.hardware_compatibility == "none"
         else [f"--hardwareCompatibilityLevel={_HW_COMPAT_TRTEXEC[plan.hardware_compatibility]}"],
         builder=lambda plan, caps: [] if plan.hardware_compatibility == "none" else [Step(
             "hardware_compatibility_level", (Ref(f"HardwareCompatibilityLevel.{_HW_COMPAT_ENUM[plan.hardware_compatibility]}"),), assign=True)]),
    Knob("version_compatible", "bool", False, "version_compatible", "bool", False,
         cli=("--version-compatible", "version_compatible"), cli_kind="flag",
         cli_help="Version-compatible engine: runs on later TensorRT of the same major (>= 8.6).",
         check=_check_version_compat,
         words=lambda plan: "version-compatible" if plan.version_compatible else None,
         trtexec=lambda plan, caps: ["--versionCompatible"] if plan.version_compatible else [],
         builder=lambda plan, caps: [Step("set_flag", (Ref("BuilderFlag.VERSION_COMPATIBLE"),))] if plan.version_compatible else []),
    Knob("profile_layers", "bool", False, "profile_layers", "bool", False,
         cli=("--profile-layers", "profile_layers"), cli_kind="flag",
         cli_help="Build with detailed profiling verbosity, then profile per layer with trtexec (or print that command): "
                  "time per ViT block, attention/MLP, beside the cost model.",
         check=None,  # portable.apply sets it, with its note (profile.layer_report reads the engine)
         trtexec=lambda plan, caps: ["--profilingVerbosity=detailed"] if plan.profile_layers else [],
         builder=lambda plan, caps: [Step("profiling_verbosity", (Ref("ProfilingVerbosity.DETAILED"),), assign=True)]
         if plan.profile_layers else [],
         recorded_after="device_target", trtexec_after="strip_weights"),
    Knob("strip_weights", "bool", False, "strip_weights", "bool", False,
         cli=("--strip-weights", "strip_weights"), cli_kind="flag",
         cli_help="Weight-stripped plan (TensorRT >= 10): small engine, refit from the bundle's ONNX on the device before first use.",
         check=None,  # portable.apply validates it against the version and DLA
         words=lambda plan: "weight-stripped (refit from the ONNX on the device)" if plan.strip_weights else None,
         trtexec=lambda plan, caps: portable.trtexec_flags(plan, caps),
         builder=lambda plan, caps: _strip_steps(plan, caps) if plan.strip_weights else [],
         recorded_after="extra_inputs"),
    Knob("dla_core", "int | None", None, "dla_core", "int | None", None,
         cli=("--dla-core", "dla_core"), cli_kind="int",
         cli_help="Jetson: run on DLA core N with GPU fallback (fp16/int8, static shapes).",
         check=_check_dla_core,
         words=lambda plan: None if plan.dla_core is None
         else f"DLA core {plan.dla_core}" + (" with GPU fallback" if plan.gpu_fallback else " without GPU fallback"),
         trtexec=lambda plan, caps: [] if plan.dla_core is None else _dla_flags(plan, caps),
         builder=lambda plan, caps: [] if plan.dla_core is None else _dla_steps(plan, caps),
         builder_after_precision=True),
    # GPU fallback is part of the DLA knob's words, flags and calls; checked with the rest of DLA in make_plan
    Knob("gpu_fallback", "bool", True, "gpu_fallback", "bool", True,
         cli=("--no-gpu-fallback", "no_gpu_fallback"), cli_kind="no-flag",
         cli_help="With --dla-core: fail unless every layer runs on DLA.",
         check=lambda value, caps: bool(value)),
)
BY_OPTION: Dict[str, Knob] = {k.option: k for k in KNOBS}


# -- the records the plan types are made of ----------------------------------------------------------------
def option_fields() -> List[Tuple[str, str, Any]]:
    """(name, annotation, field) of PlanOptions' knob fields."""
    return [(k.option, k.option_type, field(default=k.default)) for k in KNOBS]


def record_fields(head: List[Tuple[str, str, Any]], tail: List[Tuple[str, str, Any]]) -> List[Tuple[str, str, Any]]:
    """EnginePlan's fields: ``head``, the knob block, ``tail``, with each late knob after the field it names."""
    out = list(head) + [(k.plan_field, k.plan_type, field(default=k.plan_default)) for k in KNOBS if k.recorded_after is None] + list(tail)
    for k in KNOBS:
        if k.recorded_after is not None:
            at = next(i for i, f in enumerate(out) if f[0] == k.recorded_after)
            out.insert(at + 1, (k.plan_field, k.plan_type, field(default=k.plan_default)))
    return out


def checked_values(options: Any, caps: Capabilities) -> Dict[str, Any]:
    """{EnginePlan field: value} for every knob ``make_plan`` sets, each checked against ``caps``."""
    return {k.plan_field: k.check(getattr(options, k.option), caps) for k in KNOBS if k.check is not None}


# -- what each output says -------------------------------------------------------------------------------
def description(plan: Any) -> List[str]:
    """The knobs' words in the plan's description, in table order."""
    return [w for w in (k.words(plan) for k in KNOBS) if w]


def _trtexec_order() -> List[Knob]:
    out = [k for k in KNOBS if k.trtexec_after is None]
    for k in KNOBS:
        if k.trtexec_after is not None:
            at = next(i for i, o in enumerate(out) if o.option == k.trtexec_after)
            out.insert(at + 1, k)
    return out


def trtexec_flags(plan: Any, caps: Capabilities) -> List[str]:
    """Every knob's trtexec flags for TensorRT ``caps``."""
    return [flag for k in _trtexec_order() for flag in k.trtexec(plan, caps)]


def builder_steps(plan: Any, caps: Capabilities, precision_flags: Tuple[str, ...]) -> List[Step]:
    """Every knob's IBuilderConfig steps, with the precision's BuilderFlags set before the device knobs."""
    steps: List[Step] = []
    for k in KNOBS:
        if not k.builder_after_precision:
            steps += k.builder(plan, caps)
    steps += [Step("set_flag", (Ref(f"BuilderFlag.{flag}"),)) for flag in precision_flags]
    for k in KNOBS:
        if k.builder_after_precision:
            steps += k.builder(plan, caps)
    return steps
