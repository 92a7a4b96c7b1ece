"""`vitdeploy export --variable-size --canvas HxW`: the two-input bundle, verified by invariance.

The acceptance of a variable-size graph is not "ORT equals PyTorch on one size" but the invariance
Algorithm 39.1 promises: each row of a batch of images of different sizes, padded into one canvas,
gives the logits that the same image gives alone through the model at its own size (the position
table resampled offline to its grid, by the same declared rule). The export check runs exactly that
on seeded images of mixed sizes and refuses to write a bundle that fails it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from vitdeploy.bundle import (ARTIFACT_FILES, LABELS, MANIFEST, Bundle, refuse_export_precisions,
                              write_labels)
from vitdeploy.errors import CheckFailed, UsageError, UserError
from vitdeploy.records import ArtifactRecord, StorageRecord, set_artifact, set_storage
from vitdeploy.fileio import atomic_write_json
from vitdeploy.variable import VALID_INPUT, check_sizes_for_canvas, mixed_sizes, padded_batch  # noqa: F401 - re-exported

from .export_steps import (log_weights, manifest_head, open_export, preprocessing_contract, staged_bundle, torch_module_names,
                           write_graph)
from .features import has_head
from .onnx_export import strip_trace_metadata
from .sources import LoadedModel
from .variable_size import MASK_BIAS, RULE, VariableSizeGraph, export_variable_graph

LIMIT_MAX_ABS = 1e-4


def export_variable_size(source: Any, out_dir: str | Path, opts: Any, log: Callable[[str], None]) -> Bundle:
    """Export ``source`` with a (images, valid_hw) input at ``opts.canvas``; see the module doc."""
    from .onnx_export import module_output_map

    _validate(opts)
    out_dir, loaded = open_export(source, out_dir, opts, log)  # the same steps as a one-size export
    if loaded.adapter.variable_size_refusal is not None:
        loaded.adapter.variable_parts(loaded)  # the family's own reason comes first (one line)
    if not has_head(loaded):  # the masked graph returns class scores only
        raise UserError(f"--variable-size exports logits and probs; {loaded.source.get('kind')}:{loaded.source.get('name')} has no "
                        "classification head (an embedding model): export it per size (--resolution) or with --dynamic-resolution")
    canvas = tuple(int(v) for v in opts.canvas)
    spec = loaded.spec
    canvas_grid = spec.grid(*canvas)  # one line naming valid sizes when the patch does not tile the canvas
    log_weights(loaded, log)
    interp = opts.interpolation
    resolution = {
        "mode": "variable", "height": canvas[0], "width": canvas[1], "native": list(spec.image_size),
        "pos_embed_interpolation": {**interp.to_dict(), "description": interp.describe()},
    }
    preprocessing = preprocessing_contract(loaded, opts, resolution)
    preprocessing["input_size"] = list(canvas)
    preprocessing["variable_size"] = {
        "canvas": list(canvas), "canvas_grid": list(canvas_grid), "valid_input": VALID_INPUT, "round_to": list(spec.patch_size),
        "placement": "top-left", "host_policy": opts.variable_policy, "rule": RULE, "mask_bias": MASK_BIAS,
    }
    log(f"source {loaded.source['kind']}:{loaded.source['name']} - {spec.depth} blocks, d={spec.embed_dim}, "
        f"patch {spec.patch_size[0]}x{spec.patch_size[1]}; variable size in a {canvas[0]}x{canvas[1]} canvas "
        f"(grid {canvas_grid[0]}x{canvas_grid[1]})")
    module = VariableSizeGraph(loaded, preprocessing, canvas, interp).eval()
    model_proto, seconds = export_variable_graph(module, canvas, opts.opset)
    log(f"exported with torch.onnx (dynamo, opset {opts.opset}) in {seconds:.1f} s: {len(model_proto.graph.node)} nodes")
    strip_trace_metadata(model_proto)
    tensors = {out for node in model_proto.graph.node for out in node.output}
    modules = {m: t for m, t in module_output_map(model_proto, [f"model.{m}" for m in torch_module_names(loaded)]).items() if t in tensors}
    manifest = manifest_head(out_dir, loaded, spec, preprocessing, resolution, opts.opset)
    manifest["graph"].update({
            "input": {"name": "images", "dtype": "uint8", "layout": "NHWC"},
            "inputs": [
                {"name": "images", "dtype": "uint8", "layout": "NHWC", "shape": ["batch", canvas[0], canvas[1], 3]},
                {"name": VALID_INPUT, "dtype": "int32", "layout": "[batch, 2] = (valid height, valid width) in pixels",
                 "shape": ["batch", 2]},
            ],
            "outputs": ["logits", "probs"],
            "module_outputs": {m.removeprefix("model."): t for m, t in modules.items()},
            "patch_embed": None,
            "simplify_simplifier": None,
            "simplify_reason": "not applied to two-input graphs",
    })
    manifest["records"] = {"export": {"seconds": round(seconds, 2), "created": manifest["created"]}}
    if opts.external_data_threshold is not None:  # the bundle's later passes follow the same rule
        set_storage(manifest, StorageRecord(external_data_threshold=int(opts.external_data_threshold)))
    with staged_bundle(out_dir) as stage:
        path = stage / ARTIFACT_FILES["fp32"]
        set_artifact(manifest, "fp32", ArtifactRecord.from_dict(write_graph(path, model_proto, manifest)))
        del model_proto  # written: the verification runs from the file
        write_labels(stage / LABELS, loaded.labels)
        atomic_write_json(stage / MANIFEST, manifest)
        if opts.check:
            record = verify_invariance(Bundle(stage, manifest), loaded, log)
            manifest["records"]["export_check"] = record
            atomic_write_json(stage / MANIFEST, manifest)
            if not record["passed"]:
                raise CheckFailed(f"variable-size graph breaks the invariance: {'; '.join(record['failures'])} (bundle not written)")
        if "fp16" in opts.precisions:  # gated on the invariance as it is written (exporters/fp16.py)
            from .fp16 import add_fp16_to_bundle

            add_fp16_to_bundle(Bundle(stage, manifest), keep_fp32_ops=opts.keep_fp32, data=opts.fp16_data, log=log)
            log("wrote model.fp16.onnx (the valid_hw mask path, LayerNorm, Softmax and preprocessing kept in fp32)")
    return Bundle.open(out_dir)


def _validate(opts: Any) -> None:
    if not opts.canvas:
        raise UsageError("--variable-size needs --canvas HxW: the largest image size the graph serves")
    clashes = [flag for flag, on in (("--resolution", opts.resolution), ("--dynamic-resolution", opts.dynamic_resolution),
                                     ("--resize", opts.resize), ("--input float-nchw", opts.input_format == "float-nchw"))
               if on]
    if clashes:
        raise UsageError(f"--variable-size excludes {', '.join(clashes)}: the canvas and valid_hw replace them")
    refuse_export_precisions(opts.precisions)


def verify_invariance(bundle: Bundle, loaded: LoadedModel, log: Callable[[str], None], count: int = 8) -> dict[str, Any]:
    """ORT on one padded mixed-size batch vs PyTorch on each image alone at its own size (the one per-image
    reference: TorchRunner with the bundle's input contract, as `check` and `evaluate` use it)."""
    from vitdeploy.compare import FP32_SPREAD_LIMIT, compare_outputs
    from vitdeploy.contract import InputContract
    from vitdeploy.runtime.ort import OrtRunner

    from .torch_runner import TorchRunner, position_rule

    spec = loaded.spec
    contract = InputContract.from_bundle(bundle)
    canvas = tuple(contract.size)
    sizes = mixed_sizes(canvas, tuple(spec.patch_size), tuple(spec.image_size), count)
    check_sizes_for_canvas(np.array(sizes), canvas, tuple(spec.patch_size))
    rng = np.random.default_rng(0)
    crops = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    batch, valid = padded_batch(crops, canvas)
    feeds = {contract.image_input: batch, VALID_INPUT: valid}
    with OrtRunner(bundle.artifact_path("fp32")) as runner:
        got = runner.run(feeds, outputs=("logits",))["logits"]
    ref = TorchRunner(loaded, bundle.preprocessing, contract=contract, rule=position_rule(bundle)).run(feeds, outputs=("logits",))["logits"]
    stats = compare_outputs("logits", ref, got)
    finite = bool(np.isfinite(got).all())
    ok = (stats.max_abs <= LIMIT_MAX_ABS and (stats.max_abs_over_spread is None or stats.max_abs_over_spread <= FP32_SPREAD_LIMIT)
          and stats.top1_agreement == 1.0 and finite)
    log(f"check invariance: {len(sizes)} sizes from {min(sizes)} to {max(sizes)} in one {canvas[0]}x{canvas[1]} batch vs each "
        f"alone at its own size: max |dlogit| {stats.max_abs:.2e} -> {'ok' if ok else 'FAIL'}")
    spread_note = (f", {stats.max_abs_over_spread:.2%} of the spread across images (limit {FP32_SPREAD_LIMIT:.0%})"
                   if stats.max_abs_over_spread is not None else "")
    failures = [] if ok else [f"max |dlogit| {stats.max_abs:.2e} (limit {LIMIT_MAX_ABS:g}){spread_note}, top-1 agreement "
                              f"{stats.top1_agreement:.0%}{'' if finite else ', non-finite outputs'}"]
    return {"passed": ok, "failures": failures, "kind": "variable-size invariance", "canvas": list(canvas),
            "sizes": [list(s) for s in sizes], "limit_max_abs": LIMIT_MAX_ABS, **stats.to_dict(),
            "graph_sha256": bundle.artifact_sha256("fp32")}
