"""`vitdeploy export`: source model -> bundle (manifest.json, model.onnx, labels.txt), verified."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
import torch

import vitdeploy
from vitdeploy.bundle import ARTIFACT_FILES, FORMAT, LABELS, MANIFEST, Bundle, embed_manifest, read_labels, write_labels
from vitdeploy.errors import CheckFailed, UserError
from vitdeploy.fileio import atomic_path, atomic_write_json, ensure_writable_dir, sha256_file, staged_directory
from vitdeploy.posembed import PosEmbedInterpolation
from vitdeploy.preprocess import random_images

from .graph import INPUT_FORMATS, DeployGraph
from .onnx_export import OPSET, export_graph, module_output_map, patch_embed_tensors, simplify_if_identical, strip_trace_metadata
from .regrid import make_dynamic, regrid_static
from .sources import LoadedModel, load_source

RANDOM_INIT_SEED = 0  # timm/HF models without a checkpoint are seeded so the reference can be rebuilt


@dataclass
class ExportOptions:
    checkpoint: str | None = None
    num_classes: int | None = None
    model_kwargs: dict[str, Any] | None = None  # timm.create_model keyword arguments
    labels_file: str | None = None
    resolution: tuple[int, int] | None = None  # static export at this size (table re-interpolated)
    dynamic_resolution: bool = False
    resize: bool = False  # in-graph bilinear resize from any input size to the model resolution
    channel_order: str = "rgb"
    input_format: str = "uint8-nhwc"
    interpolation: PosEmbedInterpolation = PosEmbedInterpolation()
    precisions: tuple[str, ...] = ("fp32",)
    keep_fp32: tuple[str, ...] = ()
    simplify: bool = True
    check: bool = True
    check_images: int = 64
    opset: int = OPSET


def export(source: str | dict[str, Any] | None, out_dir: str | Path, options: ExportOptions | None = None,
           log: Callable[[str], None] = lambda _msg: None) -> Bundle:
    """Export ``source`` into the bundle folder ``out_dir`` and verify it against PyTorch."""
    opts = options or ExportOptions()
    _validate_options(opts)
    out_dir = Path(out_dir)
    ensure_writable_dir(out_dir.parent)  # before minutes of export work, not after
    labels = read_labels(opts.labels_file) if opts.labels_file else None
    torch.manual_seed(RANDOM_INIT_SEED)
    loaded = load_source(source, opts.checkpoint, opts.num_classes, labels, opts.model_kwargs)
    if loaded.source.get("random_init"):
        loaded.source["random_init_seed"] = RANDOM_INIT_SEED
    variant, resolution = _variant(loaded, opts)
    log(f"source {loaded.source['kind']}:{loaded.source['name']} - {loaded.spec.depth} blocks, d={loaded.spec.embed_dim}, "
        f"patch {loaded.spec.patch_size[0]}x{loaded.spec.patch_size[1]}, {loaded.spec.num_classes} classes")

    preprocessing = _preprocessing_contract(loaded, opts, resolution)
    height, width = resolution["height"], resolution["width"]
    resize_to = (height, width) if opts.resize else None
    module = DeployGraph(variant.model, preprocessing, opts.input_format, resize_to).eval()
    example = _example(opts, height, width, variant.spec.patch_size)
    model_proto, seconds = export_graph(module, example, dynamic_hw=opts.dynamic_resolution or opts.resize, opset=opts.opset)
    log(f"exported with torch.onnx (dynamo, opset {opts.opset}) in {seconds:.1f} s: {len(model_proto.graph.node)} nodes")
    strip_trace_metadata(model_proto)
    modules = module_output_map(model_proto, [f"model.{m}" for m in torch_module_names(variant)])
    simplify_record: dict[str, Any] = {"simplifier": None}
    if opts.simplify:
        model_proto, simplify_record = simplify_if_identical(model_proto, _probe(opts, height, width))
        log("simplified with onnxslim (outputs identical)" if simplify_record.get("applied") else f"kept the exporter's graph: {simplify_record.get('reason')}")
    tensors = {node_out for node in model_proto.graph.node for node_out in node.output}
    modules = {m: t for m, t in modules.items() if t in tensors}  # a simplifier may rename a few

    manifest = {
        "format": FORMAT,
        "vitdeploy_version": vitdeploy.__version__,
        "name": out_dir.name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source": loaded.source,
        "spec": variant.spec.to_dict(),
        "preprocessing": preprocessing,
        "labels": loaded.labels,
        "resolution": resolution,
        "graph": {
            "precision": "fp32",
            "opset": opts.opset,
            "exporter": "torch.onnx.export(dynamo=True)",
            "torch_version": torch.__version__,
            "input": {"name": "images", "dtype": "uint8" if opts.input_format == "uint8-nhwc" else "float32",
                      "layout": "NHWC" if opts.input_format == "uint8-nhwc" else "NCHW"},
            "outputs": ["logits", "probs"],
            # ONNX tensors holding PyTorch module outputs (for `check` localisation) and the
            # patch-embedding Conv (for the preprocessing and patch-grid protocol checks)
            "module_outputs": {m.removeprefix("model."): t for m, t in modules.items()},
            "patch_embed": patch_embed_tensors(model_proto) if opts.input_format == "uint8-nhwc" else None,
            **{f"simplify_{k}": v for k, v in simplify_record.items()},
        },
    }
    # Timing lives outside the manifest core, so the bytes of model.onnx depend only on the weights
    # and the contract: re-exporting the same model gives the same sha256 and keeps its engines.
    manifest["records"] = {"export": {"seconds": round(seconds, 2), "created": manifest["created"]}}
    with staged_directory(out_dir) as stage:
        _write_graph(stage / ARTIFACT_FILES["fp32"], model_proto, manifest)
        write_labels(stage / LABELS, loaded.labels)
        fp32_sha = sha256_file(stage / ARTIFACT_FILES["fp32"])
        manifest["artifacts"] = {"fp32": {"file": ARTIFACT_FILES["fp32"], "sha256": fp32_sha, "bytes": (stage / ARTIFACT_FILES["fp32"]).stat().st_size}}
        _carry_over(out_dir, stage, manifest, fp32_sha, log)
        atomic_write_json(stage / MANIFEST, manifest)
        bundle = Bundle(stage, manifest)
        if opts.check:
            record = verify_export(bundle, variant, opts.check_images, log)
            manifest.setdefault("records", {})["export_check"] = record
            atomic_write_json(stage / MANIFEST, manifest)
            if not record["passed"]:
                raise CheckFailed(f"exported graph does not match PyTorch: {'; '.join(record['failures'])} (bundle not written)")
        if "fp16" in opts.precisions:
            from .fp16 import add_fp16_to_bundle

            add_fp16_to_bundle(bundle, keep_fp32_ops=opts.keep_fp32)
            log("wrote model.fp16.onnx (LayerNorm, Softmax and preprocessing kept in fp32)")
    return Bundle.open(out_dir)


def _validate_options(opts: ExportOptions) -> None:
    if opts.input_format not in INPUT_FORMATS:
        raise UserError(f"--input must be one of {', '.join(INPUT_FORMATS)}, got {opts.input_format!r}")
    if opts.channel_order not in ("rgb", "bgr"):
        raise UserError(f"--channel-order must be rgb or bgr, got {opts.channel_order!r}")
    if opts.input_format == "float-nchw" and (opts.resize or opts.channel_order == "bgr"):
        raise UserError("--input float-nchw takes preprocessed tensors: --resize and --channel-order bgr do not apply")
    if opts.resize and opts.dynamic_resolution:
        raise UserError("--resize and --dynamic-resolution exclude each other: --resize feeds the model one fixed resolution")
    unknown = set(opts.precisions) - {"fp32", "fp16"}
    if unknown:
        raise UserError(f"export writes fp32 and fp16 graphs; {', '.join(sorted(unknown))} comes from `vitdeploy calibrate`")


def _variant(loaded: LoadedModel, opts: ExportOptions) -> tuple[LoadedModel, dict[str, Any]]:
    native = tuple(loaded.spec.image_size)
    interp = opts.interpolation
    base = {"native": list(native), "pos_embed_interpolation": {**interp.to_dict(), "description": interp.describe()}}
    if opts.dynamic_resolution:
        if opts.resolution:
            raise UserError("--resolution and --dynamic-resolution exclude each other")
        return make_dynamic(loaded, interp), {"mode": "dynamic", "height": native[0], "width": native[1], **base}
    if opts.resolution:
        height, width = opts.resolution
        return regrid_static(loaded, height, width, interp), {"mode": "static", "height": height, "width": width, **base}
    return loaded, {"mode": "static", "height": native[0], "width": native[1], **base}


def _preprocessing_contract(loaded: LoadedModel, opts: ExportOptions, resolution: dict[str, Any]) -> dict[str, Any]:
    pre = loaded.preprocessing
    size = [resolution["height"], resolution["width"]]
    return {
        "input": opts.input_format,
        "channel_order": opts.channel_order,
        "scale": "1/255",
        "mean": list(pre["mean"]),
        "std": list(pre["std"]),
        "input_size": None if (opts.dynamic_resolution or opts.resize) else size,
        "model_size": size,
        "in_graph_resize": {"method": "bilinear", "antialias": False, "align_corners": False, "to": size} if opts.resize else None,
        "host_resize": pre.get("host_resize", {"mode": "stretch", "interpolation": "bilinear", "crop_pct": None}),
        "config_source": pre.get("config_source", "vitdeploy reference config"),
    }


def _example(opts: ExportOptions, height: int, width: int, patch: tuple[int, int]) -> torch.Tensor:
    if opts.dynamic_resolution:
        # Trace at a non-native, non-square size: sources with a native-size shortcut (HF's
        # interpolate_pos_encoding returns the stored table when the grid matches) would otherwise
        # record the shortcut, and the graph would fail at every other size.
        width = width + 2 * patch[1]
    if opts.input_format == "float-nchw":
        return torch.randn(2, 3, height, width)
    if opts.resize:
        # a camera frame of another size, so the exporter cannot specialise on the model size
        return torch.randint(0, 256, (2, height + height // 2, width + width // 4, 3), dtype=torch.uint8)
    return torch.randint(0, 256, (2, height, width, 3), dtype=torch.uint8)


def _probe(opts: ExportOptions, height: int, width: int) -> np.ndarray:
    if opts.input_format == "float-nchw":
        return np.random.default_rng(1).standard_normal((2, 3, height, width)).astype(np.float32)
    return random_images(2, height, width, seed=1)


def _write_graph(path: Path, model_proto: Any, manifest: dict[str, Any]) -> None:
    embed_manifest(model_proto, manifest)
    model_proto.producer_name = "vitdeploy"
    model_proto.producer_version = vitdeploy.__version__
    with atomic_path(path) as tmp:
        onnx.save(model_proto, str(tmp))


def _carry_over(old_dir: Path, stage: Path, manifest: dict[str, Any], fp32_sha: str, log: Callable[[str], None]) -> None:
    """Re-export into an existing bundle: keep what was made from an identical fp32 graph, drop the rest."""
    if not (old_dir / MANIFEST).is_file():
        return
    try:
        old = Bundle.open(old_dir).manifest
    except UserError:
        return
    if old.get("artifacts", {}).get("fp32", {}).get("sha256") != fp32_sha:
        dropped = [k for k in ("fp16", "int8") if k in old.get("artifacts", {})] + [f"engine {t}" for t in old.get("engines", {})]
        if dropped:
            log(f"the fp32 graph changed: dropped {', '.join(dropped)} and old reports")
        return
    for precision in ("fp16", "int8"):
        record = old.get("artifacts", {}).get(precision)
        if record and (old_dir / record["file"]).is_file():
            shutil.copy2(old_dir / record["file"], stage / record["file"])
            manifest["artifacts"][precision] = record
    for sub in ("engines", "reports", "variants"):
        if (old_dir / sub).is_dir():
            shutil.copytree(old_dir / sub, stage / sub)
    if old.get("engines"):
        manifest["engines"] = old["engines"]
    if old.get("records"):
        kept = {k: v for k, v in old["records"].items() if k not in ("export_check", "export")}
        manifest["records"] = {**kept, **manifest.get("records", {})}


def torch_module_names(loaded: LoadedModel) -> list[str]:
    """PyTorch modules whose outputs localise a divergence: each block, the final norm, the head."""
    depth = loaded.spec.depth
    if loaded.family == "hf":
        names = {name for name, _ in loaded.model.named_modules()}
        base = "hf.deit" if "hf.deit" in names else "hf.vit"
        # transformers 5 keeps the blocks in `<base>.layers`, 4.x in `<base>.encoder.layer`
        blocks = f"{base}.layers" if f"{base}.layers.0" in names else f"{base}.encoder.layer"
        head = "hf.cls_classifier" if "hf.cls_classifier" in names else "hf.classifier"
        return [f"{blocks}.{i}" for i in range(depth)] + [f"{base}.layernorm", head]
    return [f"blocks.{i}" for i in range(depth)] + ["norm", "head"]


# -- verification ----------------------------------------------------------------------------------
def verify_export(bundle: Bundle, variant: LoadedModel, count: int, log: Callable[[str], None]) -> dict[str, Any]:
    """ORT vs PyTorch on seeded uint8 images at every size the graph declares."""
    from vitdeploy.checks.inputs import random_sets
    from vitdeploy.compare import compare_outputs
    from vitdeploy.runtime.ort import OrtRunner

    from .torch_runner import TorchRunner

    pre = bundle.preprocessing
    resize = tuple(pre["in_graph_resize"]["to"]) if pre.get("in_graph_resize") else None
    ort_runner = OrtRunner(bundle.artifact_path("fp32"))
    torch_runner = TorchRunner(variant, pre, resize_to=resize)
    results, failures = [], []
    for index, eval_set in enumerate(random_sets(bundle, count, seed=0)):
        h, w = eval_set.meta["height"], eval_set.meta["width"]
        images = eval_set.images
        if pre.get("input") == "float-nchw":
            images = np.random.default_rng(index).standard_normal((count, 3, h, w)).astype(np.float32)
        ref = torch_runner.infer_batched(images, 16)
        got = ort_runner.infer_batched(images, 16)
        stats = compare_outputs("logits", ref["logits"], got["logits"])
        limit = 1e-3 if resize else 1e-4  # in-graph uint8 resize: ORT's and torch's bilinear differ in rounding
        ok = stats.max_abs <= limit and stats.top1_agreement == 1.0
        results.append({"height": h, "width": w, "images": count, "seed": eval_set.meta["seed"], "limit_max_abs": limit, **stats.to_dict(), "passed": ok})
        log(f"check {h}x{w}: max |dlogit| {stats.max_abs:.2e}, top-1 agreement {stats.top1_agreement:.0%} on {count} images"
            f" -> {'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append(f"{h}x{w}: max |dlogit| {stats.max_abs:.2e} (limit {limit:g}), top-1 agreement {stats.top1_agreement:.1%}")
    return {"passed": not failures, "failures": failures, "sizes": results, "graph_sha256": bundle.artifact_record("fp32").get("sha256")}


# -- re-loading a bundle's source -------------------------------------------------------------------
def loaded_for_bundle(bundle: Bundle, resolution: tuple[int, int] | None = None) -> LoadedModel:
    """The bundle's PyTorch model, with the same weights and resolution handling as its graph."""
    source = bundle.manifest["source"]
    torch.manual_seed(source.get("random_init_seed", RANDOM_INIT_SEED))
    loaded = load_source(source)  # the source's own labels: `check` compares the bundle's with them
    if source.get("random_init"):
        from .sources import _state_sha256

        if _state_sha256(loaded.model) != source.get("weights_sha256"):
            raise UserError("the bundle's random-init source cannot be rebuilt with the same weights on this version of timm/torch")
    res = bundle.resolution
    interp = PosEmbedInterpolation.from_dict({k: v for k, v in res.get("pos_embed_interpolation", {}).items() if k != "description"})
    if res["mode"] == "dynamic":
        return make_dynamic(loaded, interp)
    height, width = resolution or (res["height"], res["width"])
    return regrid_static(loaded, height, width, interp)
