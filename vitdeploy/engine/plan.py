"""The engine build plan: everything a TensorRT build will do, as plain data, validated up front.

A plan is made from a bundle, the user's options and the target TensorRT's capabilities. It never
touches TensorRT, so ``--dry-run`` and ``--print-trtexec`` work on any machine, and every rule here
(precision path, profiles against the graph's input, DLA limits) is tested on the CPU. ``builder``
then applies a plan to a live TensorRT builder, and ``trtexec`` writes the same plan as a command line.

Precision paths:

- ``strongly-typed`` (TensorRT >= 10): the bundle's graph of the chosen precision (model.onnx,
  model.fp16.onnx or model.int8.onnx) is compiled as typed; the graph decides every layer's type.
- ``typed-graph+flags`` (TensorRT 8.x, which has no strong typing): the same graph, with the
  builder flag its types need (FP16 for the fp16 graph, INT8+FP16 for the Q/DQ graph).
- ``legacy-flags`` (``--legacy-precision``, TensorRT < 11 only): the fp32 graph with the FP16/INT8
  builder flags and, for INT8, the entropy calibrator fed from calibration data or a cache.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, make_dataclass, replace
from pathlib import Path
from typing import Any, Sequence, Tuple

from .. import precisions
from ..errors import ConfigError, UserError
from ..spec import check_resolution, parse_resolution
from . import knobs
from .graph_io import (BatchedInput, GraphTensor, InputLayout, graph_inputs, image_input,  # noqa: F401 - re-exported
                       read_graph_io)
from .versions import Capabilities

PRECISIONS = precisions.NAMES
PRECISION_CHOICES = precisions.choices(best=True, best_first=False)
PATH_STRONGLY_TYPED = "strongly-typed"
PATH_TYPED_GRAPH_FLAGS = "typed-graph+flags"
PATH_LEGACY = "legacy-flags"
HARDWARE_COMPAT, MAX_OPT_LEVEL = knobs.HARDWARE_COMPAT, knobs.MAX_OPT_LEVEL

# DLA limits from NVIDIA's "DLA Supported Layers and Restrictions" (general restrictions).
DLA_MAX_BATCH = 4096
DLA_MAX_DIM = 8192

Triple = Tuple[int, int, int]  # a run-time alias: typing.Tuple, since tuple[...] needs Python 3.9


# -- small parsers -------------------------------------------------------------------------------
def parse_triple(text: str, what: str) -> tuple[str, str, str]:
    """'1:8:32' -> ('1', '8', '32'); '8' -> ('8', '8', '8') (a static dimension)."""
    parts = [p.strip() for p in str(text).split(":")]
    if len(parts) == 1:
        parts = parts * 3
    if len(parts) != 3 or not all(parts):
        raise UserError(f"{what} {text!r} is not MIN:OPT:MAX or one value (e.g. 1:8:32 or 8)")
    return parts[0], parts[1], parts[2]


def parse_batch(text: str) -> Triple:
    raw = parse_triple(text, "--batch")
    try:
        values = tuple(int(v) for v in raw)
    except ValueError:
        raise UserError(f"--batch {text!r} must be integers MIN:OPT:MAX (e.g. 1:8:32)") from None
    _check_order(values, f"--batch {text}")
    return values  # type: ignore[return-value]


def parse_resolution_range(text: str) -> tuple[Triple, Triple]:
    """'224:224:384' -> ((224,224,384), (224,224,384)); '224x320' -> static 224x320."""
    sizes = [parse_resolution(part) for part in parse_triple(text, "--resolution")]
    heights = tuple(s[0] for s in sizes)
    widths = tuple(s[1] for s in sizes)
    _check_order(heights, f"--resolution {text} (height)")
    _check_order(widths, f"--resolution {text} (width)")
    return heights, widths  # type: ignore[return-value]


def _check_order(values: Sequence[int], what: str) -> None:
    lo, opt, hi = values
    if lo < 1:
        raise UserError(f"{what}: values must be positive")
    if not lo <= opt <= hi:
        raise UserError(f"{what}: need MIN <= OPT <= MAX, got {lo}:{opt}:{hi}")


# -- profiles ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Profile:
    """One optimisation profile: min/opt/max of batch, height and width."""

    batch: Triple
    height: Triple
    width: Triple

    @property
    def is_static(self) -> bool:
        return len(set(self.batch)) == len(set(self.height)) == len(set(self.width)) == 1

    def shapes(self, layout: InputLayout) -> dict[str, tuple[int, ...]]:
        return {
            key: layout.shape(self.batch[i], self.height[i], self.width[i])
            for i, key in enumerate(("min", "opt", "max"))
        }

    def describe(self) -> str:
        def tri(t: Triple) -> str:
            return str(t[0]) if len(set(t)) == 1 else f"{t[0]}:{t[1]}:{t[2]}"

        return f"batch {tri(self.batch)}, {tri(self.height)}x{tri(self.width)}"


def build_profiles(
    batches: Sequence[str],
    resolutions: Sequence[str],
    layout: InputLayout,
    default_hw: tuple[int, int],
    patch_size: tuple[int, int] | None,
    default_batch: str = "1:8:32",
    size_hint: str = "export with --dynamic-resolution for other sizes",
) -> list[Profile]:
    """Pair --batch and --resolution options into profiles and check them against the graph
    (``size_hint``: what to do when the graph's height/width are fixed and another size is asked for)."""
    batch_list = [parse_batch(b) for b in batches] or [parse_batch(layout_default_batch(layout, default_batch))]
    res_list = [parse_resolution_range(r) for r in resolutions]
    if not res_list:
        h = layout.fixed.get("H", default_hw[0])
        w = layout.fixed.get("W", default_hw[1])
        res_list = [((h, h, h), (w, w, w))]
    count = max(len(batch_list), len(res_list))
    for name, items in (("--batch", batch_list), ("--resolution", res_list)):
        if len(items) not in (1, count):
            raise UserError(
                f"{len(batch_list)} --batch and {len(res_list)} --resolution options: give one of each per "
                f"profile, or one {name} for all profiles"
            )
    profiles = []
    for i in range(count):
        batch = batch_list[i if len(batch_list) > 1 else 0]
        heights, widths = res_list[i if len(res_list) > 1 else 0]
        profiles.append(Profile(batch, heights, widths))
    for number, profile in enumerate(profiles):
        _check_profile_against_graph(profile, layout, patch_size, number, size_hint)
    if len(set(profiles)) != len(profiles):
        raise UserError("two optimisation profiles are identical; drop the repeated --batch/--resolution")
    return profiles


def layout_default_batch(layout: InputLayout, default: str) -> str:
    fixed = layout.fixed.get("N")
    return str(fixed) if fixed else default


def _check_profile_against_graph(profile: Profile, layout: InputLayout, patch: tuple[int, int] | None, number: int,
                                 size_hint: str = "export with --dynamic-resolution for other sizes") -> None:
    where = f"profile {number} ({profile.describe()})"
    for axis, values, option in (("N", profile.batch, "--batch"), ("H", profile.height, "--resolution"), ("W", profile.width, "--resolution")):
        fixed = layout.fixed.get(axis)
        if fixed is not None and set(values) != {fixed}:
            what = {"N": "batch", "H": "height", "W": "width"}[axis]
            raise UserError(
                f"{where}: the graph's {what} is fixed at {fixed}; use {option} {fixed}"
                + (f" ({size_hint})" if axis != "N" else "")
            )
    if patch is not None:
        for h in sorted(set(profile.height)):
            for w in sorted(set(profile.width)):
                try:
                    check_resolution(h, w, patch)
                except UserError as exc:
                    raise UserError(f"{where}: {exc}") from None


# -- options and plan ---------------------------------------------------------------------------
# What the user asked for (the CLI's options, unvalidated): the precision, the profiles, the legacy calibrator's
# inputs and the target, then one field per build knob (``knobs.KNOBS``).
_PlanOptionsFields = make_dataclass("PlanOptions", [
    ("precision", "str", field(default="best")),
    ("legacy_precision", "bool", field(default=False)),
    ("batch", "tuple[str, ...]", field(default=())),
    ("resolution", "tuple[str, ...]", field(default=())),
    *knobs.option_fields(),
    ("calib_data", "str | None", field(default=None)),
    ("calib_cache", "str | None", field(default=None)),
    ("calib_batch", "int", field(default=8)),
    ("target", "str | None", field(default=None)),
], frozen=True)


class PlanOptions(_PlanOptionsFields):  # type: ignore[valid-type,misc]
    """What the user asked for (the CLI's options, unvalidated)."""

    __slots__ = ()


# The plan's record (engine.json "plan", in this key order): the graph and precision path, the profiles, the
# knobs' values (``knobs.KNOBS``: each knob names its place), and what the plan records besides.
_EnginePlanFields = make_dataclass("EnginePlan", knobs.record_fields(
    head=[
        ("trt_version", "str", field()),
        ("source", "str", field()),  # the ONNX graph compiled
        ("source_sha256", "str", field()),
        ("source_precision", "str", field()),  # which bundle graph that is
        ("precision", "str", field()),  # what the engine computes (vitdeploy.precisions)
        ("requested_precision", "str", field()),
        ("precision_path", "str", field()),
        ("builder_flags", "tuple[str, ...]", field()),  # BuilderFlag names set for the precision (empty when strongly typed)
        ("input_name", "str", field()),
        ("input_dtype", "str", field()),
        ("input_layout", "str", field()),
        ("channels", "int", field()),
        ("profiles", "tuple[Profile, ...]", field()),
    ],
    tail=[
        ("calibration", "dict[str, Any] | None", field(default=None)),
        ("target", "str | None", field(default=None)),
        ("notes", "tuple[str, ...]", field(default=())),
        # The graph TensorRT parses when it is not ``source`` itself: the bundle graph lowered for an
        # older parser (``lowering``), with its hash and what was rewritten. ``source`` stays the bundle
        # graph whose contract the engine implements (and whose hash ties the engine to the bundle).
        ("parse_graph", "str | None", field(default=None)),
        ("parse_graph_sha256", "str | None", field(default=None)),
        ("lowering", "dict[str, Any] | None", field(default=None)),
        # Per-image inputs beside the images (variable-size bundles: valid_hw [B, 2]); shaped by each
        # profile's batch range. Empty for the single-input contract.
        ("extra_inputs", "tuple[BatchedInput, ...]", field(default=())),
        ("device_target", "dict[str, Any] | None", field(default=None)),  # the Jetson target the plan was made for (``targets``)
    ],
), frozen=True)


class EnginePlan(_EnginePlanFields):  # type: ignore[valid-type,misc]
    """Everything a TensorRT build will do, validated (engine.json records ``to_dict()``)."""

    __slots__ = ()

    @property
    def onnx_path(self) -> str:
        """The ONNX file handed to TensorRT's parser (trtexec --onnx, OnnxParser.parse_from_file)."""
        return self.parse_graph or self.source

    @property
    def layout(self) -> InputLayout:
        return InputLayout(self.input_name, self.input_dtype, self.input_layout, self.channels, {})

    def input_shapes(self, profile: Profile) -> dict[str, dict[str, tuple[int, ...]]]:
        """{input name: {min, opt, max}} for every graph input: the images, then the per-image inputs."""
        shapes = {self.input_name: profile.shapes(self.layout)}
        for extra in self.extra_inputs:
            shapes[extra.name] = {key: extra.shape(profile.batch[i]) for i, key in enumerate(("min", "opt", "max"))}
        return shapes

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        profiles = []
        for p in self.profiles:
            entry: dict[str, Any] = {"batch": list(p.batch), "height": list(p.height), "width": list(p.width),
                                     "shapes": {k: list(v) for k, v in p.shapes(self.layout).items()}}
            if self.extra_inputs:  # every input's shapes; single-input plans keep their record as it was
                entry["inputs"] = {name: {k: list(v) for k, v in s.items()} for name, s in self.input_shapes(p).items()}
            profiles.append(entry)
        data["profiles"] = profiles
        data["builder_flags"] = list(self.builder_flags)
        data["notes"] = list(self.notes)
        data["extra_inputs"] = [{"name": e.name, "dtype": e.dtype, "dims": list(e.dims)} for e in self.extra_inputs]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EnginePlan":
        known = set(cls.__dataclass_fields__)
        values = {k: v for k, v in data.items() if k in known}
        values["profiles"] = tuple(
            Profile(tuple(p["batch"]), tuple(p["height"]), tuple(p["width"])) for p in data["profiles"]  # type: ignore[arg-type]
        )
        values["builder_flags"] = tuple(data.get("builder_flags", ()))
        values["notes"] = tuple(data.get("notes", ()))
        values["extra_inputs"] = tuple(BatchedInput(e["name"], e["dtype"], tuple(e["dims"])) for e in data.get("extra_inputs") or ())
        return cls(**values)

    def with_target(self, target: str) -> "EnginePlan":
        return replace(self, target=target)

    def default_target(self, gpu_slug: str | None = None) -> str:
        """engines/<target>: GPU (when known), TensorRT version, precision and DLA core."""
        parts = ([gpu_slug] if gpu_slug else []) + [f"trt{self.trt_version}", self.precision]
        if self.dla_core is not None:
            parts.append(f"dla{self.dla_core}")
        return "-".join(parts)


def choose_precision(requested: str, available: Sequence[str], legacy: bool, has_calibration: bool) -> str:
    if requested not in PRECISION_CHOICES:
        raise UserError(f"precision {requested!r} is not one of {', '.join(PRECISION_CHOICES)}")
    if requested != "best":
        return requested
    if legacy:  # the fp32 graph with builder flags: the best precision the flags (and the calibrator's data) reach
        return next(p for p in precisions.BEST_ORDER if precisions.get(p).weak_builder_flags
                    and (has_calibration or not precisions.get(p).legacy_needs_calibration))
    best = precisions.best_of(available)  # the caller passes only the graphs the target runs
    if best is not None:
        return best
    raise UserError("the bundle has no graph to build; re-export it with `vitdeploy export`")


def make_plan(bundle: Any, options: PlanOptions, caps: Capabilities, compute_capability: tuple[int, int] | None = None) -> EnginePlan:
    """Validate ``options`` against the bundle's graph and the TensorRT ``caps`` (and the target's
    ``compute_capability`` when known: a Jetson target's row); return the plan."""
    from ..fileio import sha256_file

    notes: list[str] = []
    has_calib = bool(options.calib_data or options.calib_cache)
    if options.legacy_precision and not caps.legacy_precision:
        raise ConfigError(
            f"--legacy-precision needs TensorRT < 11: TensorRT {caps.version} has no FP16/INT8 builder flags "
            "and no implicit INT8 calibration; drop --legacy-precision to build the bundle's fp16/int8 graph "
            "strongly typed"
        )
    if has_calib and not options.legacy_precision:
        raise UserError(
            "--calib-data/--calib-cache feed the legacy INT8 calibrator; add --legacy-precision, or drop them: "
            "the bundle's int8 graph carries its own Q/DQ scales"
        )
    trt = (caps.trt_version.major, caps.trt_version.minor)
    on_dla = options.dla_core is not None
    runs_here = [p for p in bundle.precisions() if precisions.get(p).why_not_on(trt, compute_capability, on_dla) is None]
    precision = choose_precision(options.precision, runs_here, options.legacy_precision, has_calib)

    # Which graph, which path, which flags
    entry = precisions.get(precision)
    why_not = entry.why_not_on(trt, compute_capability)  # DLA refusals below name what DLA runs
    if why_not is not None:
        where = f"TensorRT {caps.version}" + (f" on SM {compute_capability[0]}.{compute_capability[1]}" if compute_capability else "")
        raise ConfigError(f"{why_not}; {where} cannot build the {precision} graph (choose another --precision or target)")
    if "float8e4m3fn" in entry.graph_dtypes:
        from .fp8_target import attention_note

        record = bundle.artifact_record(precision) if bundle.bare_onnx is None else {}
        spec = bundle.spec
        notes.append(attention_note((record.get("attention") or {}).get("placement"), trt, compute_capability,
                                    head_dim=spec.embed_dim // spec.num_heads))
    if options.legacy_precision and precision != precisions.REFERENCE and not entry.weak_builder_flags:
        raise ConfigError(f"--legacy-precision builds the fp32 graph with precision flags, and {precision} has none: "
                          f"drop --legacy-precision to build the {precision} graph strongly typed")
    if options.legacy_precision:
        path, source_precision = PATH_LEGACY, precisions.REFERENCE
        flags = entry.builder_flags(trt)
        if entry.legacy_needs_calibration:
            if not has_calib:
                raise UserError(
                    "legacy INT8 needs calibration data: give --calib-data IMAGES.npy (uint8 N,H,W,3) or an existing "
                    "--calib-cache FILE; or build the bundle's Q/DQ graph without --legacy-precision"
                )
            notes.append("legacy INT8+FP16 flags let TensorRT choose fp16 for LayerNorm/Softmax; the strongly typed fp16/int8 graphs keep them in fp32")
        elif precision == "fp16":
            notes.append("legacy FP16 flag lets TensorRT choose fp16 for LayerNorm/Softmax; the strongly typed fp16 graph keeps them in fp32")
    elif caps.strongly_typed:
        path, source_precision, flags = PATH_STRONGLY_TYPED, precision, ()
    else:
        path, source_precision = PATH_TYPED_GRAPH_FLAGS, precision
        flags = entry.builder_flags(trt)
        if precision != precisions.REFERENCE:
            notes.append(
                f"TensorRT {caps.version} has no strongly typed networks: the {precision} graph is built weakly typed "
                "with precision flags, and TensorRT may pick other types for layers the graph keeps in fp32"
            )
    source = Path(bundle.artifact_path(source_precision))

    # Profiles against the graph's real input
    inputs, _ = read_graph_io(source)
    spec = bundle.spec
    resolution = bundle.manifest.get("resolution") or {}
    preprocessing = bundle.manifest.get("preprocessing") or {}
    variable = preprocessing.get("variable_size")
    layout, extras = graph_inputs(inputs, spec.in_chans)
    if variable:
        # A variable-size graph: images [B, H_c, W_c, 3] in the canvas + valid_hw [B, 2]; both follow --batch.
        want = variable.get("valid_input", "valid_hw")
        if [e.name for e in extras] != [want]:
            raise UserError(f"{source.name} is a variable-size graph but takes {[layout.name] + [e.name for e in extras]}; "
                            f"expected (images, {want}); re-export it with `vitdeploy export --variable-size`")
        if entry.legacy_needs_calibration and path == PATH_LEGACY:
            raise ConfigError(
                "legacy INT8 calibration feeds the images input only and cannot shape valid_hw; build the bundle's "
                "Q/DQ int8 graph (without --legacy-precision) or --legacy-precision --precision fp16"
            )
        size_hint = (f"the {variable['canvas'][0]}x{variable['canvas'][1]} canvas is fixed at export; valid_hw carries each "
                     "image's size; re-export with another --canvas for a larger one")
    elif extras:
        raise UserError(f"{source.name} takes {len(inputs)} inputs ({', '.join(i.name for i in inputs)}); "
                        "vitdeploy engines take one image input, or (images, valid_hw) for variable-size bundles")
    else:
        size_hint = "export with --dynamic-resolution for other sizes"
    # The model itself runs at the fed size unless the graph resizes inside: then any size is valid.
    patch = None if preprocessing.get("in_graph_resize") else tuple(spec.patch_size)
    default_hw = (int(resolution.get("height") or spec.image_size[0]), int(resolution.get("width") or spec.image_size[1]))
    default_batch = "1" if options.dla_core is not None else "1:8:32"
    profiles = build_profiles(options.batch, options.resolution, layout, default_hw, patch, default_batch, size_hint)  # type: ignore[arg-type]
    if variable:
        notes.append(
            f"two inputs: {layout.name} {layout.dtype} [B, H_c, W_c, {layout.channels}] and " +
            ", ".join(f"{e.name} {e.dtype} [B, {', '.join(str(d) for d in e.dims)}]" for e in extras) +
            "; each profile shapes both from its batch range"
        )

    # Builder knobs against what this version has
    knob_values = knobs.checked_values(options, caps)

    # DLA: FP16/INT8 only, no dynamic dimensions
    if options.dla_core is not None:
        if not entry.dla:
            on_dla = [p.name for p in precisions.REGISTRY if p.dla]
            raise ConfigError(f"DLA runs {precisions.listing([n.upper() for n in on_dla])} only; use --precision "
                              f"{precisions.listing(on_dla, 'or')} with --dla-core")
        dynamic = [p.describe() for p in profiles if not p.is_static]
        if dynamic:
            raise ConfigError(
                "DLA has no dynamic dimensions: give one value per profile, e.g. --batch 8 --resolution 224 "
                f"(dynamic: {'; '.join(dynamic)})"
            )
        for p in profiles:
            if p.batch[0] > DLA_MAX_BATCH:
                raise ConfigError(f"DLA batch is at most {DLA_MAX_BATCH}; got {p.batch[0]}")
            if max(p.height[0], p.width[0]) > DLA_MAX_DIM:
                raise ConfigError(f"DLA dimensions are at most {DLA_MAX_DIM}; got {p.height[0]}x{p.width[0]}")
        if knob_values["hardware_compatibility"] != "none":
            raise ConfigError("hardware-compatible engines are GPU-only; drop --hardware-compat with --dla-core")
        if not options.gpu_fallback:
            notes.append("no GPU fallback: the build fails unless every layer runs on DLA (see --dla-report)")
    elif not options.gpu_fallback:
        raise UserError("--no-gpu-fallback only applies with --dla-core")

    calibration = None
    if path == PATH_LEGACY and entry.legacy_needs_calibration:
        if options.calib_batch < 1:
            raise UserError("--calib-batch must be at least 1")
        calibration = {
            "algorithm": "entropy2",
            "data": str(options.calib_data) if options.calib_data else None,
            "cache": str(options.calib_cache) if options.calib_cache else None,
            "batch": int(options.calib_batch),
        }

    return EnginePlan(
        trt_version=caps.version,
        source=str(source),
        source_sha256=sha256_file(source),
        source_precision=source_precision,
        precision=precision,
        requested_precision=options.precision,
        precision_path=path,
        builder_flags=tuple(flags),
        input_name=layout.name,
        input_dtype=layout.dtype,
        input_layout=layout.layout,
        channels=layout.channels,
        profiles=tuple(profiles),
        **knob_values,
        calibration=calibration,
        target=options.target,
        notes=tuple(notes),
        extra_inputs=tuple(extras),
    )
