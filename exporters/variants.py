"""Graphs of a static bundle at other resolutions, for `profile` sweeps.

A static graph holds its position table as a constant, so another resolution needs another graph:
each variant is a small bundle under ``variants/<H>x<W>/``, exported from the same source with the
same contract and the table re-interpolated offline, verified against PyTorch like any export, then
given the precisions asked for (fp16 pass; int8 calibrated with the parent's recorded recipe).
A dynamic-resolution bundle needs no variants: its own graphs take any valid size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from vitdeploy.bundle import Bundle
from vitdeploy.errors import UserError
from vitdeploy.posembed import PosEmbedInterpolation

from .api import ExportOptions, export

VARIANTS = "variants"


def graph_for(bundle: Bundle, precision: str, height: int, width: int, log: Callable[[str], None] = lambda _m: None,
              merge: int | None = None) -> Path:
    """The bundle's graph of ``precision`` that runs at height x width (exported once, then cached);
    ``merge``: the graph that merges r tokens per block (--merge-tokens; 0: unmerged), under variants/HxW-rR/."""
    bundle.spec.grid(height, width)  # refuses sizes the patch does not tile
    res = bundle.resolution
    if merge is None and (res["mode"] == "dynamic" or (res["height"], res["width"]) == (height, width)):
        return bundle.artifact_path(precision)
    if merge is not None and res["mode"] == "dynamic":
        raise UserError("--merge-tokens re-exports static graphs; this bundle has a dynamic resolution (export it with --resolution)")
    if bundle.preprocessing.get("in_graph_resize"):
        raise UserError("this bundle resizes every input to its model resolution inside the graph; "
                        "export with --dynamic-resolution to compare resolutions")
    if bundle.bare_onnx is not None:
        raise UserError("other resolutions of a bare ONNX file need its bundle folder (variants are cached there)")
    variant = _variant_bundle(bundle, height, width, log, merge)
    if precision not in variant.precisions():
        _add_precision(bundle, variant, precision, log)
        variant = Bundle.open(variant.root)
    return variant.artifact_path(precision)


def _variant_bundle(bundle: Bundle, height: int, width: int, log: Callable[[str], None], merge: int | None = None) -> Bundle:
    root = bundle.root / VARIANTS / (f"{height}x{width}" + (f"-r{merge}" if merge is not None else ""))
    # a merged parent's resolution variants merge by its schedule; --merge-tokens cells by their own r
    own = (bundle.manifest.get("token_merge") or {}).get("schedule")
    schedule = str(merge) if merge is not None else (",".join(map(str, own)) if own else None)
    parent_sha = bundle.artifact_sha256("fp32")
    if (root / "manifest.json").is_file():
        variant = Bundle.open(root)
        if variant.manifest.get("variant_of") == parent_sha:
            return variant
    pre = bundle.preprocessing
    interp = {k: v for k, v in bundle.resolution.get("pos_embed_interpolation", {}).items() if k != "description"}
    source = bundle.manifest["source"]
    options = ExportOptions(
        checkpoint=source.get("checkpoint"),
        num_classes=source.get("num_classes"),
        model_kwargs=source.get("model_kwargs"),
        resolution=(height, width),
        channel_order=pre.get("channel_order", "rgb"),
        input_format=pre.get("input", "uint8-nhwc"),
        interpolation=PosEmbedInterpolation.from_dict(interp),
        check_images=16,
        # the same outputs as the parent graph (a features bundle profiles its features)
        outputs=tuple(bundle.graph.outputs or ()) or None,
        normalize_embedding=bool(bundle.graph.output_detail("embedding").get("l2_normalized")),
        merge_tokens=schedule if schedule not in (None, "0") else None,
    )
    contract = bundle.variable_size
    if contract:  # a variable-size bundle's variant is the same two-input graph with another canvas
        from dataclasses import replace

        options = replace(options, resolution=None, variable_size=True, canvas=(height, width),
                          variable_policy=contract.get("host_policy", "fit-within"), outputs=None, normalize_embedding=False)
    log(f"exporting a {height}x{width} variant of {bundle.root.name} (position table re-interpolated"
        + (f", {merge} tokens merged per block)" if merge is not None else ")"))
    variant = export(source, root, options)
    variant.manifest["variant_of"] = parent_sha
    variant.save()
    return variant


def _add_precision(parent: Bundle, variant: Bundle, precision: str, log: Callable[[str], None]) -> None:
    if precision == "fp16":
        from .fp16 import add_fp16_to_bundle

        record = parent.artifact_record("fp16")
        # what the parent kept by name (op types, modules, cells); the range pass runs again on the variant
        add_fp16_to_bundle(variant, keep_fp32_ops=tuple(record.get("keep_fp32") or record.get("user_kept_fp32_op_types") or ()))
        return
    if precision == "int8":
        from vitdeploy.calibration.api import CalibrateOptions, calibrate_bundle

        record = parent.artifact_record("int8")
        if not record:
            raise UserError(f"bundle {parent.root} has no int8 graph to reproduce at another resolution; run `vitdeploy calibrate` first")
        options = _calibration_options(CalibrateOptions, record)
        log(f"calibrating the {variant.root.name} variant with the parent's recipe ({options.method}, {options.samples} samples)")
        calibrate_bundle(variant.root, options)
        return
    raise UserError(f"unknown precision {precision!r}; use fp32, fp16 or int8")


def _calibration_options(cls: Any, record: dict[str, Any]) -> Any:
    """The parent's recorded calibration recipe, applied again (images are resized by the manifest's rule)."""
    from vitdeploy.calibration.exclusions import Exclusions

    cal = record.get("calibration", {})
    excl = record.get("exclusions") or {}
    kwargs: dict[str, Any] = {
        "method": record.get("method", "entropy"),
        "target": record.get("target", "tensorrt"),
        "data": cal.get("source"),
        "samples": cal.get("count"),
    }
    known = {k: tuple(v) for k, v in excl.items() if k in Exclusions.__dataclass_fields__ and k != "nodes" and isinstance(v, (list, tuple))}
    if known:
        kwargs["exclusions"] = Exclusions(**known)
    smoothing = record.get("smoothing")  # the parent's smoothing, re-measured on the variant's activations
    kwargs["smoothing"] = smoothing["scope"] if smoothing else "none"
    if smoothing:
        kwargs["smooth_alpha"] = smoothing["alpha"]
    return cls(**{k: v for k, v in kwargs.items() if v is not None})
