"""`vitdeploy evaluate --occlusion-map`: occlusion sensitivity maps computed by the deployed graph, for
image files or one labelled source, written as .npy maps, PNG overlays and a JSON record (the rule,
what was compared, per-image clean probability, foreground vs background sensitivity).

The images are those a data source gives at the input contract's source size; the graph is fed them
through the contract (a variable-size bundle: each occluded image fitted into the canvas)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..bundle import Bundle
from ..errors import UserError
from .run import Progress, evaluation_contract, mean_rgb
from .runners import check_precisions, graph_scorer, refuse_embedding_model
from .transforms import OCCLUSION_FILLS, Context


@dataclass
class OcclusionOptions:
    patch: int | None = None  # default: two model patches
    stride: int | None = None  # default: one model patch
    fill: str = "border"  # erase to the background estimate (the image's border median colour)
    precision: str = "fp32"
    limit: int | None = None
    batch: int = 256
    threads: int | None = None
    overlays: int = 32  # images drawn in the PNG
    skip_unreadable: bool = False


def run_occlusion_map(path: str | Path, inputs: Sequence[str], out_dir: str | Path | None = None,
                      options: OcclusionOptions | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Occlusion sensitivity maps from the deployed graph for image files or one labelled source.

    Writes ``occlusion.npy`` (maps [N, H, W] float32), ``occlusion_targets.npy``, ``occlusion.png``
    (overlays) and ``occlusion.json`` (the rule, what was compared, per-image clean target
    probability and mean sensitivity on foreground vs background where separable)."""
    from ..data import open_labelled
    from ..fileio import atomic_path, atomic_write_json, signals_deferred
    from ..images import load_images, to_channel_order
    from .occlusion import occlusion_maps, occlusion_rule, write_overlays
    from .transforms import background_mask

    opts = options or OcclusionOptions()
    prog = progress or Progress()
    bundle = Bundle.open(path)
    refuse_embedding_model(bundle, "evaluate --occlusion-map")
    if opts.fill not in OCCLUSION_FILLS:
        raise UserError(f"unknown occlusion fill {opts.fill!r}; use {', '.join(OCCLUSION_FILLS)}")
    precision = check_precisions(bundle, [opts.precision])[0]
    contract = evaluation_contract(bundle)
    size = contract.source_size
    pre = bundle.preprocessing
    ph = int(bundle.spec.patch_size[0])
    patch = int(opts.patch or 2 * ph)
    stride = int(opts.stride or ph)
    if not inputs:
        raise UserError("no images for the occlusion map: give image files or one data source (digits:test, DIR, .npz)")
    files: list[str] | None = None
    single = inputs[0] if len(inputs) == 1 else None
    if single is not None and (single.startswith("digits:") or Path(single).is_dir() or Path(single).suffix.lower() == ".npz"):
        data = open_labelled(single, size, pre, bundle.labels or None, opts.limit, opts.skip_unreadable)
        images, targets, source = data.images, data.labels, data.source
        names = [f"#{i} label {bundle.labels[t] if bundle.labels else t}" for i, t in enumerate(targets)]
        files = data.files
    else:
        rgb = load_images(list(inputs), {**pre, "channel_order": "rgb"}, size)
        images, targets, source = rgb, None, "files"
        files = [str(p) for p in inputs]
        names = [Path(p).name[:18] for p in inputs]
    ctx = Context(patch=tuple(bundle.spec.patch_size), mean_rgb=mean_rgb(pre), occlusion_fill=opts.fill)
    scorer = graph_scorer(bundle, contract, precision, bundle.artifact_path(precision), opts.threads, opts.batch)
    prog.begin(len(images))
    result = occlusion_maps(scorer.probs, images, targets, patch, stride, ctx, to_graph=lambda x: to_channel_order(x, pre),
                            on_image=lambda k: [prog.step("occlusion map") for _ in range(k)])
    scorer.runner.close()
    maps = result["maps"]
    mask, separable = background_mask(images)
    per_image = []
    for i in range(len(images)):
        entry: dict[str, Any] = {"index": i, "name": names[i] if files is None else files[i], "target": int(result["targets"][i]),
                                 "clean_prob": float(result["clean_prob"][i]), "mean_sensitivity": float(maps[i].mean())}
        if separable[i] and (~mask[i]).any() and mask[i].any():
            entry["foreground_mean"] = float(maps[i][~mask[i]].mean())
            entry["background_mean"] = float(maps[i][mask[i]].mean())
        per_image.append(entry)
    both = [e for e in per_image if "foreground_mean" in e]
    out = Path(out_dir) if out_dir is not None else bundle.reports_dir() / "occlusion"
    with signals_deferred():  # maps, overlay and report land together
        out.mkdir(parents=True, exist_ok=True)
        for name, array in (("occlusion.npy", maps), ("occlusion_signed.npy", result["signed"]), ("occlusion_targets.npy", result["targets"])):
            with atomic_path(out / name, suffix=".npy") as tmp:
                with open(tmp, "wb") as fh:
                    np.save(fh, array)
        label = (lambda t: bundle.labels[t] if bundle.labels and t < len(bundle.labels) else str(t))
        titles = [f"{names[i]} -> {label(int(result['targets'][i]))} p={result['clean_prob'][i]:.2f}" for i in range(len(images))]
        shown = min(len(images), opts.overlays)
        write_overlays(images[:shown], maps[:shown], titles[:shown], out / "occlusion.png")
        fill = list(fill_colour_of(opts.fill, ctx, images))
        report = {
            "schema": "vitdeploy-occlusion/1",
            "bundle": str(bundle.root), "graph": bundle.artifact_path(precision).name, "precision": precision,
            "source": source, "count": int(len(images)), "size": list(size),
            "rule": occlusion_rule(patch, stride, opts.fill, fill),
            "patch": patch, "stride": stride, "fill": opts.fill, "fill_rgb": fill,
            "positions_per_image": int(len(result["tops"]) * len(result["lefts"])),
            "compared": "target-class probability of the deployed graph on the clean image vs the occluded image",
            "caveat": "occluders are out-of-distribution inputs; the map is this graph's response to this occluder, not a causal attribution",
            "foreground_rule": "foreground/background by the background rule of the transforms (border median colour +- 16)",
            "foreground_above_background": (sum(e["foreground_mean"] > e["background_mean"] for e in both) / len(both)) if both else None,
            "images_with_separable_background": len(both),
            "files": {"maps": "occlusion.npy", "signed": "occlusion_signed.npy", "targets": "occlusion_targets.npy", "overlay": "occlusion.png"},
            "images": per_image,
        }
        atomic_write_json(out / "occlusion.json", report)
    report["out_dir"] = str(out)
    return report


def fill_colour_of(fill: str, ctx: Context, images: np.ndarray) -> list[int]:
    from .transforms import fill_colour

    if fill == "border":
        return []  # per image: the border median colour (the rule text says so)
    colours = fill_colour(Context(patch=ctx.patch, mean_rgb=ctx.mean_rgb, occlusion_fill=fill), images[:1])
    return [int(v) for v in colours[0]]
