"""The steps every export shares, the one-size graph (api.py) and the variable-size one (variable_export.py)
alike: opening the source and the target folder, the manifest head, the preprocessing contract, writing
the graph, the PyTorch modules that localise a divergence, and re-loading a bundle's model."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch

import vitdeploy
from vitdeploy import onnx_io
from vitdeploy.bundle import FORMAT, Bundle, check_export_target, embed_manifest, read_labels
from vitdeploy.fileio import ensure_writable_dir
from vitdeploy.storage import disk_errors
from vitdeploy.posembed import PosEmbedInterpolation

from .regrid import make_dynamic, regrid_static
from .sources import LoadedModel, load_source


def open_export(source: Any, out_dir: str | Path, opts: Any, log: Callable[[str], None]) -> tuple[Path, LoadedModel]:
    """The target folder (refused in one line when it holds what vitdeploy did not write, or cannot be
    written) and the loaded source (its published weights, a checkpoint, or --random-init), before any
    export work."""
    out_dir = Path(out_dir).resolve()  # `-o .` names the folder by its real name
    check_export_target(out_dir)  # a folder of the user's own files is never replaced
    ensure_writable_dir(out_dir.parent)  # before minutes of export work, not after
    labels = read_labels(opts.labels_file) if opts.labels_file else None
    loaded = load_source(source, opts.checkpoint, opts.num_classes, labels, opts.model_kwargs, random_init=opts.random_init, log=log)
    # the fp32 graph holds the weights as float32: room for them (and the disk reserve), before the export
    weights = sum(4 * p.numel() for p in loaded.model.parameters()) + sum(b.numel() * b.element_size() for b in loaded.model.buffers())
    ensure_writable_dir(out_dir.parent, weights, out_dir.name)
    # `-o new/path/bundle`: the folders above the bundle, as `mkdir -p` (the probes above remove what they made)
    with disk_errors(out_dir.parent):
        out_dir.parent.mkdir(parents=True, exist_ok=True)
    return out_dir, loaded


def staged_bundle(out_dir: Path) -> Any:
    """The staging folder an export writes into; swapped in only while the target is still its to replace."""
    from vitdeploy.fileio import staged_directory

    return staged_directory(out_dir, before_swap=lambda: check_export_target(out_dir))


def log_weights(loaded: LoadedModel, log: Callable[[str], None]) -> None:
    """One line naming the weights the bundle will compute (the random-weights warning where so)."""
    from vitdeploy.weights import describe_weights, random_weights_notice

    notice = random_weights_notice(loaded.source, exporting=True)
    log(f"warning: {notice}" if notice else f"weights: {describe_weights(loaded.source)}")


def manifest_head(out_dir: Path, loaded: LoadedModel, spec: Any, preprocessing: dict[str, Any], resolution: dict[str, Any],
                  opset: int) -> dict[str, Any]:
    """The manifest every export writes, before its graph-specific entries (inputs, outputs, modules)."""
    return {
        "format": FORMAT,
        "vitdeploy_version": vitdeploy.__version__,
        "name": out_dir.name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source": loaded.source,
        "spec": spec.to_dict(),
        "preprocessing": preprocessing,
        "labels": loaded.labels,
        "resolution": resolution,
        "graph": {"precision": "fp32", "opset": opset, "exporter": "torch.onnx.export(dynamo=True)", "torch_version": torch.__version__},
    }


def preprocessing_contract(loaded: LoadedModel, opts: Any, resolution: dict[str, Any]) -> dict[str, Any]:
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


def write_graph(path: Path, model_proto: Any, manifest: dict[str, Any]) -> dict[str, Any]:
    """Write the graph (with external data past the bundle's threshold); returns its manifest record."""
    embed_manifest(model_proto, manifest)
    model_proto.producer_name = "vitdeploy"
    model_proto.producer_version = vitdeploy.__version__
    return onnx_io.save(model_proto, path, manifest=manifest)


def torch_module_names(loaded: LoadedModel) -> list[str]:
    """PyTorch modules whose outputs localise a divergence: each block, the final norm, the head (the family adapter's names)."""
    return loaded.adapter.module_names(loaded)


# -- re-loading a bundle's source -------------------------------------------------------------------
def loaded_for_bundle(bundle: Bundle, resolution: tuple[int, int] | None = None, merged: bool = True) -> LoadedModel:
    """The bundle's PyTorch model, with the same weights and resolution handling as its graph (and its
    token merging, exporters/token_merge.py, unless ``merged`` is False: the model the merge approximates)."""
    # the same weights (recorded revision, checkpoint or seed; sha256 checked) or one line why not;
    # the source's own labels: `check` compares the bundle's with them
    loaded = load_source(bundle.manifest["source"])
    res = bundle.resolution
    interp = PosEmbedInterpolation.from_dict({k: v for k, v in res.get("pos_embed_interpolation", {}).items() if k != "description"})
    if res["mode"] == "dynamic":
        return make_dynamic(loaded, interp)
    height, width = resolution or (res["height"], res["width"])
    loaded = regrid_static(loaded, height, width, interp)
    if merged and bundle.manifest.get("token_merge"):
        from .token_merge import merged_for_bundle

        loaded = merged_for_bundle(bundle.manifest, loaded, height, width)
    return loaded
