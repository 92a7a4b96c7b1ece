"""`vitdeploy export`: source model -> bundle (manifest.json, model.onnx, labels.txt), verified."""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from vitdeploy import onnx_io, precisions
from vitdeploy.bundle import (ARTIFACT_FILES, LABELS, MANIFEST, Bundle, refuse_export_precisions, write_labels)
from vitdeploy.errors import CheckFailed, UsageError, UserError
from vitdeploy.fileio import atomic_write_json, hidden_dir, library_temp
from vitdeploy.manifest import is_embedding_model, model_kind
from vitdeploy.posembed import PosEmbedInterpolation
from vitdeploy.preprocess import random_images
from vitdeploy.records import ArtifactRecord, StorageRecord, set_artifact, set_engines, set_storage

from .export_memory import check_export_fits, log_peak, release, release_torch_model
from .export_steps import (loaded_for_bundle, log_weights, manifest_head, open_export, preprocessing_contract,  # noqa: F401
                           staged_bundle, torch_module_names, write_graph)
from .features import describe_outputs, embedding_dim, output_doc, resolve_outputs
from .graph import INPUT_FORMATS, DeployGraph
from .loaded import RANDOM_INIT_SEED  # noqa: F401 - --random-init weights are seeded so `check` can rebuild them
from .onnx_export import (OPSET, export_graph, module_output_map, ort_difference, patch_embed_tensors, run_onnxslim,
                          simplify_if_identical, strip_trace_metadata)
from .regrid import make_dynamic, regrid_static
from .sources import LoadedModel
from .fp16_keep import fp16_summary
from .verify import reference_outputs, verify_export  # noqa: F401 - export() calls it through this module (tests patch it here)

logger = logging.getLogger(__name__)


@dataclass
class ExportOptions:
    checkpoint: str | None = None
    # timm/hf sources load their published weights; random ones only with random_init (--random-init)
    random_init: bool = False
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
    fp16_data: str | None = None  # range images (and, labelled, the accuracy gate) of the fp16 graph
    simplify: bool = True
    check: bool = True
    check_images: int = 64
    opset: int = OPSET
    # --variable-size: (images in a canvas, valid_hw) input; see exporters/variable_export.py
    variable_size: bool = False
    canvas: tuple[int, int] | None = None
    variable_policy: str = "fit-within"  # host policy recorded in the manifest (vitdeploy.variable.POLICIES)
    # --outputs: any of logits, probs, embedding, patch_grid (exporters/features.py); None: logits,probs
    # for a model with a head, embedding,patch_grid for a backbone without one
    outputs: tuple[str, ...] | None = None
    normalize_embedding: bool = False  # L2-normalise the embedding output inside the graph
    # weights above this many bytes go to model.onnx.data (vitdeploy.onnx_io); None: the env var or 1 GiB
    external_data_threshold: int | None = None
    # --merge-tokens: r merged per block, or one r per block (exporters/token_merge.py); None: no merging
    merge_tokens: str | tuple[int, ...] | None = None


def export(source: str | dict[str, Any] | None, out_dir: str | Path, options: ExportOptions | None = None,
           log: Callable[[str], None] = logger.info) -> Bundle:
    """Export ``source`` into the bundle folder ``out_dir`` and verify it against PyTorch. Progress lines go
    to ``log``; debug detail (options, sizes, timings of the steps) to this module's logger."""
    opts = options or ExportOptions()
    started = time.perf_counter()
    logger.debug("options: opset %s, input %s, precisions %s, resolution %s, dynamic resolution %s, in-graph resize %s, simplify %s, "
                 "verify %s", opts.opset, opts.input_format, ",".join(opts.precisions), opts.resolution or "the source's",
                 opts.dynamic_resolution, opts.resize, opts.simplify, f"on {opts.check_images} images" if opts.check else "off")
    _validate_outputs(opts)
    if opts.merge_tokens is not None:
        from .token_merge import refuse_merge_options

        refuse_merge_options(opts)
    if opts.variable_size:
        from .variable_export import export_variable_size

        return export_variable_size(source, out_dir, opts, log)
    _validate_options(opts)
    out_dir, loaded = open_export(source, out_dir, opts, log)
    logger.debug("loaded %s:%s in %.1f s (%s parameters)", loaded.source["kind"], loaded.source["name"], time.perf_counter() - started,
                 f"{sum(p.numel() for p in loaded.model.parameters()):,}")
    if opts.resolution:  # before the position table is resampled: refuse what cannot fit, in one line
        from vitdeploy.costs import check_fits_memory

        check_fits_memory(loaded.spec, *opts.resolution, what="--resolution")
    outputs = resolve_outputs(loaded, opts.outputs)
    if opts.normalize_embedding and "embedding" not in outputs:
        raise UserError(f"--normalize-embedding applies to the embedding output, which this export does not write "
                        f"(outputs {','.join(outputs)}); add --outputs {','.join(outputs)},embedding")
    variant, resolution = _variant(loaded, opts)
    logger.debug("input %sx%s, %s: %s", resolution["height"], resolution["width"], resolution["mode"],
                 "--resolution" if opts.resolution else "nominal size of a dynamic-resolution graph" if opts.dynamic_resolution
                 else "the source preprocessing's size (the position table is resampled to it)"
                 if [resolution["height"], resolution["width"]] != resolution["native"] else "the model's native size")
    if opts.merge_tokens is not None:  # the merged model is the graph's reference (verification, `check`)
        from .token_merge import merge_variant

        variant = merge_variant(variant, opts.merge_tokens, resolution, log)
    log_weights(loaded, log)  # after the checks above: a refusal stays one line
    # the manifest's outputs decide classifier vs embedding model (vitdeploy.manifest.is_embedding_model)
    head = model_kind(outputs, embedding_dim(loaded) if "embedding" in outputs else None, loaded.spec.num_classes)
    if is_embedding_model(outputs) and loaded.extra.get("projection_head"):
        head += ": the head is a CLIP-style projection"
    log(f"source {loaded.source['kind']}:{loaded.source['name']} - {loaded.spec.depth} blocks, d={loaded.spec.embed_dim}, "
        f"patch {loaded.spec.patch_size[0]}x{loaded.spec.patch_size[1]}, {head}")
    if opts.outputs is None and is_embedding_model(outputs):
        log("the model has no classification head: exporting outputs embedding,patch_grid (the pooled feature and the patch grid)")
    else:
        log(f"outputs: {','.join(outputs)}")
    # the PyTorch reference (verification, `check`) returns the same outputs as the graph
    variant.extra = {**variant.extra, "outputs": outputs, "normalize_embedding": opts.normalize_embedding}

    preprocessing = preprocessing_contract(loaded, opts, resolution)
    height, width = resolution["height"], resolution["width"]
    resize_to = (height, width) if opts.resize else None
    module = DeployGraph(variant.model, preprocessing, opts.input_format, resize_to, outputs=outputs, loaded=variant,
                         normalize_embedding=opts.normalize_embedding).eval()
    example = _example(opts, height, width, variant.spec.patch_size)
    # Memory (issue 32): refuse up front what cannot fit; PyTorch's outputs for the verification are
    # computed now, so the model is freed before the graph is simplified, written and loaded.
    plan_bundle = Bundle(out_dir, manifest_head(out_dir, loaded, variant.spec, preprocessing, resolution, opts.opset))
    check_export_fits(variant, plan_bundle, opts, log)
    step = time.perf_counter()
    references = reference_outputs(plan_bundle, variant, opts.check_images, log) if opts.check else None
    if references is not None:
        logger.debug("PyTorch reference outputs for the verification computed in %.1f s", time.perf_counter() - step)
    model_proto, seconds = export_graph(module, example, dynamic_hw=opts.dynamic_resolution or opts.resize, opset=opts.opset,
                                        output_names=outputs)
    log(f"exported with torch.onnx (dynamo, opset {opts.opset}) in {seconds:.1f} s: {len(model_proto.graph.node)} nodes")
    strip_trace_metadata(model_proto)
    modules = module_output_map(model_proto, [f"model.{m}" for m in torch_module_names(variant)])
    grid_of = (f"model input after the in-graph resize to {height}x{width}" if opts.resize else "input image")
    output_details = describe_outputs(variant, outputs, opts.normalize_embedding, dynamic_grid=opts.dynamic_resolution, grid_of=grid_of)
    del module, example
    release_torch_model(loaded, variant)
    # the graph travels in a one-item list that finish() empties, so nothing here holds it once written
    exporter_graph = [model_proto]
    del model_proto

    def finish(graph: list[Any], simplify_record: dict[str, Any], slim_timing: dict[str, Any],
               diagnose: Callable[[Path], None] | None = None) -> Bundle:
        """Write the bundle around the graph in ``graph`` (taken out of it, so it is freed once written)
        and verify it (CheckFailed leaves nothing written; ``diagnose`` looks at the written graph first)."""
        proto = graph.pop()
        tensors = {node_out for node in proto.graph.node for node_out in node.output}
        _document_outputs(proto, output_details)
        # a module whose output is the embedding (a MAP head) is read where it is computed, not at the leaf Identity
        leaf = {n.output[0]: n.input[0] for n in proto.graph.node if n.op_type == "Identity" and n.name == f"{n.output[0]}_output"}
        kept_modules = {m: leaf.get(t, t) for m, t in modules.items() if t in tensors}  # a simplifier may rename a few
        manifest = manifest_head(out_dir, loaded, variant.spec, preprocessing, resolution, opts.opset)
        manifest["graph"].update({
                "input": {"name": "images", "dtype": "uint8" if opts.input_format == "uint8-nhwc" else "float32",
                          "layout": "NHWC" if opts.input_format == "uint8-nhwc" else "NCHW"},
                "outputs": list(outputs),
                # what each output holds: shape, read-out, normalisation, grid order, dropped tokens
                "output_details": output_details,
                # ONNX tensors holding PyTorch module outputs (for `check` localisation) and the
                # patch-embedding Conv (for the preprocessing and patch-grid protocol checks)
                "module_outputs": {m.removeprefix("model."): t for m, t in kept_modules.items()},
                "patch_embed": patch_embed_tensors(proto) if opts.input_format == "uint8-nhwc" else None,
                **{f"simplify_{k}": v for k, v in simplify_record.items()},
        })
        if variant.extra.get("token_merge"):
            manifest["token_merge"] = variant.extra["token_merge"]
        if opts.external_data_threshold is not None:  # the bundle's later passes follow the same rule
            set_storage(manifest, StorageRecord(external_data_threshold=int(opts.external_data_threshold)))
        # Timing lives outside the manifest core, so the bytes of model.onnx depend only on the weights
        # and the contract: re-exporting the same model gives the same sha256 and keeps its engines.
        manifest["records"] = {"export": {"seconds": round(seconds, 2), "created": manifest["created"],
                                          **({"simplify": slim_timing} if opts.simplify else {})}}
        with staged_bundle(out_dir) as stage:
            step = time.perf_counter()
            written = write_graph(stage / ARTIFACT_FILES["fp32"], proto, manifest)
            logger.debug("wrote %s (%s bytes%s) in %.2f s", written.get("file"), f"{written.get('bytes', 0):,}",
                         f", external data {written['data']['bytes']:,} bytes" if written.get("data") else "", time.perf_counter() - step)
            del proto
            release()
            write_labels(stage / LABELS, loaded.labels)
            set_artifact(manifest, "fp32", ArtifactRecord.from_dict(written))
            _carry_over(out_dir, stage, manifest, written["sha256"], log)
            atomic_write_json(stage / MANIFEST, manifest)
            bundle = Bundle(stage, manifest)
            if opts.check:
                record = verify_export(bundle, references, opts.check_images, log)
                manifest.setdefault("records", {})["export_check"] = record
                atomic_write_json(stage / MANIFEST, manifest)
                if not record["passed"]:
                    if diagnose is not None:
                        diagnose(stage / ARTIFACT_FILES["fp32"])
                    raise CheckFailed(f"exported graph does not match PyTorch: {'; '.join(record['failures'])} (bundle not written)")
            release()
            if "fp16" in opts.precisions:
                from .fp16 import add_fp16_to_bundle

                fp16 = Bundle.open(add_fp16_to_bundle(bundle, keep_fp32_ops=opts.keep_fp32, data=opts.fp16_data, log=log).parent)
                log(fp16_summary(fp16.artifact_record("fp16")))
            log_peak(log, written)
        logger.debug("export of %s:%s took %.1f s in all", loaded.source["kind"], loaded.source["name"], time.perf_counter() - started)
        return Bundle.open(out_dir)

    if not opts.simplify:
        return finish(exporter_graph, {"simplifier": None}, {})
    probe = _probe(opts, height, width, variant.spec.patch_size)
    probe_hw = list(probe.shape[1:3] if opts.input_format == "uint8-nhwc" else probe.shape[2:4])
    if not opts.check:
        # nothing verifies the graph afterwards: onnxslim's graph must give bit-identical ORT outputs
        proto, record = simplify_if_identical(exporter_graph.pop(), probe)
        timing = _pop_timing(record, probe_hw)
        took = (f" in {timing['slim_s']:.1f} s + identity check {timing['identity_check_s']:.1f} s "
                f"at {probe_hw[0]}x{probe_hw[1]}") if "identity_check_s" in timing else ""
        log(f"simplified with onnxslim (outputs identical){took}" if record.get("applied")
            else f"kept the exporter's graph: {record.get('reason')}")
        return finish([proto], record, timing)
    # The verification against PyTorch that follows gates onnxslim's graph like any other: a separate
    # identity check would build two more ORT sessions of the whole graph (ViT-B/16: 7-10 s and the
    # export's peak memory). Only when that verification fails does the probe say whose fault it is,
    # against the exporter's graph, which waits on disk meanwhile: onnxslim holds its input and output
    # (about 2.1x the weights), and only 1.1x when nothing else holds its input (measured, ViT-B/16).
    # named like the staging folder (writer's pid), so a killed export's leftover is removed by the next;
    # hidden_dir makes out_dir's parent when missing (ensure_writable_dir removes what its probe made, e.g. variants/)
    with hidden_dir(out_dir.parent, out_dir.name, "exporter") as keep:
        exporter_file = Path(keep) / ARTIFACT_FILES["fp32"]
        onnx_io.save(exporter_graph[0], exporter_file)
        with library_temp(keep):  # onnxslim's own temporary files (graphs past 2 GiB) in our folder, removed with it
            slim, record = run_onnxslim(exporter_graph.pop())
        release()
        if slim is None:
            log(f"kept the exporter's graph: {record.get('reason')}")
            return finish([onnx_io.load(exporter_file)], record, _pop_timing(record, None))
        record["gate"] = "the export's verification against PyTorch"
        timing = _pop_timing(record, None)
        log(f"simplified with onnxslim in {timing['slim_s']:.1f} s: {record['nodes_before']} -> {record['nodes_after']} nodes "
            "(gated by the verification below)")
        blame: dict[str, float] = {}

        def diagnose(slim_path: Path) -> None:
            blame["worst"] = ort_difference(exporter_file, slim_path, probe)

        slim_box = [slim]
        del slim
        try:
            return finish(slim_box, record, timing, diagnose)
        except CheckFailed as failure:
            worst = blame.get("worst", 0.0)
            if worst == 0.0:
                raise  # onnxslim's graph computes what the exporter's does: the export itself is wrong
            log(f"onnxslim's graph failed the verification ({failure}) and differs from the exporter's graph on a "
                f"{probe_hw[0]}x{probe_hw[1]} probe (max |d| {worst:.3g}): verifying the exporter's graph instead")
            kept = {"simplifier": "onnxslim", "applied": False, "reason": f"outputs changed (max |d| {worst:.3g}) and failed verification"}
            return finish([onnx_io.load(exporter_file)], kept, {**timing, "probe_hw": probe_hw})


def _pop_timing(record: dict[str, Any], probe_hw: list[int] | None) -> dict[str, Any]:
    """Timings stay out of the graph's manifest (its bytes must not change from one export to the next)."""
    timing = {k: record.pop(k) for k in ("slim_s", "identity_check_s") if k in record}
    if probe_hw is not None:
        timing["probe_hw"] = probe_hw
    return timing


def _validate_outputs(opts: ExportOptions) -> None:
    from .features import parse_outputs

    opts.outputs = parse_outputs(opts.outputs)
    if opts.normalize_embedding and opts.outputs is not None and "embedding" not in opts.outputs:
        raise UsageError("--normalize-embedding applies to the embedding output; add embedding to --outputs")
    if opts.variable_size and opts.outputs not in (None, ("logits", "probs")):
        # one padded canvas holds images of different grids: a single [B, d, G_h, G_w] tensor has no
        # defined grid, and the masked read-out is not the model's own pre-logits path
        raise UsageError("--outputs other than logits,probs is not available with --variable-size: each image has its own "
                        "patch grid inside the canvas; export a static or --dynamic-resolution graph for embedding/patch_grid")


def _document_outputs(model_proto: Any, details: dict[str, dict[str, Any]]) -> None:
    """Each graph output's doc_string says what it holds (what Netron and onnx.helper show)."""
    from .onnx_export import name_grid_axes

    name_grid_axes(model_proto)  # again: the simplifier may have rewritten the output shapes
    _leaf_outputs(model_proto)
    for value in model_proto.graph.output:
        if value.name in details:
            value.doc_string = output_doc(value.name, details[value.name])


def _leaf_outputs(model_proto: Any) -> None:
    """A graph output that other nodes also read (the embedding feeds the head's Gemm) gets its own
    Identity, so every output is a leaf: the fp16 pass keeps graph outputs fp32 (keep_io_types) and
    would otherwise hand the fp16 Gemm a float input."""
    from onnx import helper

    graph = model_proto.graph
    consumed = {name for node in graph.node for name in node.input}
    for value in graph.output:
        # logits feed only Softmax, which the fp16 pass keeps fp32: classifier graphs stay as they were
        if value.name not in consumed or value.name not in ("embedding", "patch_grid"):
            continue
        inner = f"{value.name}_value"
        for node in graph.node:
            node.output[:] = [inner if o == value.name else o for o in node.output]
            node.input[:] = [inner if i == value.name else i for i in node.input]
        graph.node.append(helper.make_node("Identity", [inner], [value.name], name=f"{value.name}_output"))


def _validate_options(opts: ExportOptions) -> None:
    if opts.canvas and not opts.variable_size:
        raise UsageError("--canvas sets the size of a --variable-size graph; add --variable-size, or use --resolution for one fixed size")
    if opts.input_format not in INPUT_FORMATS:
        raise UsageError(f"--input must be one of {', '.join(INPUT_FORMATS)}, got {opts.input_format!r}")
    if opts.channel_order not in ("rgb", "bgr"):
        raise UsageError(f"--channel-order must be rgb or bgr, got {opts.channel_order!r}")
    if opts.input_format == "float-nchw" and (opts.resize or opts.channel_order == "bgr"):
        raise UsageError("--input float-nchw takes preprocessed tensors: --resize and --channel-order bgr do not apply")
    if opts.resize and opts.dynamic_resolution:
        raise UsageError("--resize and --dynamic-resolution exclude each other: --resize feeds the model one fixed resolution")
    refuse_export_precisions(opts.precisions)


def _variant(loaded: LoadedModel, opts: ExportOptions) -> tuple[LoadedModel, dict[str, Any]]:
    native = tuple(loaded.spec.image_size)
    interp = loaded.adapter.position_convention(opts.interpolation)
    base = {"native": list(native), "pos_embed_interpolation": {**interp.to_dict(), "description": interp.describe()}}
    if opts.dynamic_resolution:
        if opts.resolution:
            raise UsageError("--resolution and --dynamic-resolution exclude each other")
        # the nominal size: the source's preprocessing size (HF DINOv2's 224 crop of a 518 table), else native
        nominal = tuple(loaded.extra.get("default_resolution") or native)
        return make_dynamic(loaded, interp), {"mode": "dynamic", "height": nominal[0], "width": nominal[1], **base}
    if opts.resolution:
        height, width = opts.resolution
        return regrid_static(loaded, height, width, interp), {"mode": "static", "height": height, "width": width, **base}
    default = loaded.extra.get("default_resolution")
    if default and tuple(default) != native:
        # the size the source's own preprocessing gives (HF DINOv2: a 518 table, a 224 processor)
        height, width = default
        return regrid_static(loaded, height, width, interp), {"mode": "static", "height": height, "width": width, **base}
    return loaded, {"mode": "static", "height": native[0], "width": native[1], **base}


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


def _probe(opts: ExportOptions, height: int, width: int, patch: tuple[int, int]) -> np.ndarray:
    """Two images for onnxslim's identity check. A dynamic graph runs every node at any size, so it
    is probed at about half the native side (whole patches, at least two): the same ops, a quarter of
    the compute (ViT-B/16: 112x112 instead of 224x224)."""
    if opts.dynamic_resolution:
        height, width = (max(2 * p, (side // 2) // p * p) for side, p in ((height, patch[0]), (width, patch[1])))
    if opts.input_format == "float-nchw":
        return np.random.default_rng(1).standard_normal((2, 3, height, width)).astype(np.float32)
    return random_images(2, height, width, seed=1)


# graphs made from the fp32 graph (reduced precision, and the fused CPU graph): valid while it is unchanged
DERIVED_GRAPHS = precisions.DERIVED_ARTIFACTS


def _carry_over(old_dir: Path, stage: Path, manifest: dict[str, Any], fp32_sha: str, log: Callable[[str], None]) -> None:
    """Re-export into an existing bundle: keep what was made from an identical fp32 graph, drop the rest."""
    if not (old_dir / MANIFEST).is_file():
        return
    try:
        old_bundle = Bundle.open(old_dir)
    except UserError:
        return
    old, old_artifacts, old_engines = old_bundle.manifest, old_bundle.artifacts(), old_bundle.engines()
    if old_bundle.artifact_sha256("fp32") != fp32_sha:
        dropped = [k for k in DERIVED_GRAPHS if k in old_artifacts] + [f"engine {t}" for t in old_engines]
        if dropped:
            log(f"the fp32 graph changed: dropped {', '.join(dropped)} and old reports")
        return
    for precision in DERIVED_GRAPHS:
        record = old_artifacts.get(precision)
        if record and not onnx_io.check_files(old_dir, record.to_dict(), hashes=False):
            for entry in [record] + ([record.data] if record.data else []):  # the graph and its data file
                shutil.copy2(old_dir / entry.file, stage / entry.file)
            set_artifact(manifest, precision, record)
    for sub in ("engines", "reports", "variants"):
        if (old_dir / sub).is_dir():
            shutil.copytree(old_dir / sub, stage / sub)
    if old_engines:
        set_engines(manifest, old_engines)
        manifest["precisions"] = precisions.manifest_record()  # the order engines are chosen by (Bundle.record_engine)
    if old.get("records"):
        kept = {k: v for k, v in old["records"].items() if k not in ("export_check", "export")}
        manifest["records"] = {**kept, **manifest.get("records", {})}
