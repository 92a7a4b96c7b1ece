"""Mixed sizes in one padded batch vs the same images one by one (issue #13), ONNX Runtime on the CPU.

A server that receives images of different sizes and aspect ratios has three choices, timed here on
the same images in one run, interleaved round-robin so drift and other processes fall on all alike:

- ``padded``: the variable-size graph (``--variable-size --canvas``), batches of ``--batch`` images,
  each fitted into the canvas (fit-within, whole patches) and masked;
- ``one-by-one``: the dynamic-resolution graph of the same model, one call per image at its own size;
- ``by-size``: the dynamic-resolution graph, one call per distinct size (a bucketing server's best case).

Padding spends compute on masked positions (the canvas's L instead of each image's), batching saves
per-call overhead: which wins depends on the model size and on how full the canvas is, so the table
reports the fill ratio (valid patches / canvas patches) beside the throughput.

    .venv/bin/python bench/bench_variable_size.py                                   # digits, 48 canvas
    .venv/bin/python bench/bench_variable_size.py --source timm:vit_small_patch16_224 --canvas 384 \
        --min-side 160 --images 32 --batch 8 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ensure(work: Path, name: str, source: str, **options) -> "object":
    from vitdeploy.bundle import Bundle
    from vitdeploy.exporters import ExportOptions, export

    target = work / name
    if (target / "manifest.json").is_file():
        return Bundle.open(target)
    log(f"exporting {source} -> {target} ({options}) ...")
    options.setdefault("random_init", source.split(":", 1)[0] in ("timm", "hf"))  # timing: random weights, no hub
    return export(source, target, ExportOptions(check_images=4, **options), log=log)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="builtin:digits")
    parser.add_argument("--canvas", type=int, default=48)
    parser.add_argument("--min-side", type=int, default=16, help="smallest image side before fitting (pixels)")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--policy", default="shrink-within", help="host policy for the padded path (sizes stay mixed)")
    parser.add_argument("--work", default="/tmp/bench_variable_size")
    parser.add_argument("--json")
    args = parser.parse_args()

    from vitdeploy.runtime.ort import OrtRunner
    from vitdeploy.variable import fitted_size, pad_to_canvas

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    tag = args.source.replace(":", "_")
    variable = ensure(work, f"{tag}_var{args.canvas}", args.source, variable_size=True, canvas=(args.canvas, args.canvas))
    dynamic = ensure(work, f"{tag}_dyn", args.source, dynamic_resolution=True)
    patch = tuple(variable.spec.patch_size)

    rng = np.random.default_rng(0)
    images = []
    for _ in range(args.images):  # random aspect ratios and sizes, fitted to whole patches in the canvas
        src = (int(rng.integers(args.min_side, 2 * args.canvas)), int(rng.integers(args.min_side, 2 * args.canvas)))
        h, w = fitted_size(src, (args.canvas, args.canvas), patch, args.policy)
        images.append(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    fill = float(np.mean([(im.shape[0] // patch[0]) * (im.shape[1] // patch[1]) for im in images])) / (
        (args.canvas // patch[0]) * (args.canvas // patch[1]))
    batches = [pad_to_canvas(images[i:i + args.batch], (args.canvas, args.canvas)) for i in range(0, len(images), args.batch)]
    by_size: dict = {}
    for im in images:
        by_size.setdefault(im.shape, []).append(im)
    groups = [np.stack(v) for v in by_size.values()]

    var_sess = OrtRunner(variable.artifact_path("fp32"), threads=args.threads).session
    dyn_sess = OrtRunner(dynamic.artifact_path("fp32"), threads=args.threads).session

    def padded() -> None:
        for batch, valid in batches:
            var_sess.run(["probs"], {"images": batch, "valid_hw": valid})

    def one_by_one() -> None:
        for im in images:
            dyn_sess.run(["probs"], {"images": im[None]})

    def grouped() -> None:
        for group in groups:
            dyn_sess.run(["probs"], {"images": group})

    paths = {"padded": padded, "one-by-one": one_by_one, "by-size": grouped}
    for fn in paths.values():  # warm-up: sessions allocate per new shape
        fn()
    seconds: dict = {k: [] for k in paths}
    for _ in range(args.rounds):
        for name, fn in paths.items():
            start = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - start)
    result = {
        "source": args.source, "canvas": args.canvas, "images": len(images), "distinct_sizes": len(groups),
        "batch": args.batch, "fill_ratio": round(fill, 3), "threads": args.threads, "rounds": args.rounds,
        "policy": args.policy, "cpu": platform.processor() or platform.machine(), "loadavg": os.getloadavg(),
        "img_per_s": {k: {"min": len(images) / max(v), "median": len(images) / float(np.median(v)), "max": len(images) / min(v)}
                      for k, v in seconds.items()},
        "ratio_padded_vs_one_by_one_per_round": [o / p for p, o in zip(seconds["padded"], seconds["one-by-one"])],
        "ratio_padded_vs_by_size_per_round": [g / p for p, g in zip(seconds["padded"], seconds["by-size"])],
    }
    print(f"{args.source}: {len(images)} images, {len(groups)} distinct sizes, canvas {args.canvas}, fill {fill:.0%}, "
          f"{args.threads} thread(s), load {result['loadavg'][0]:.2f}")
    for name, stats in result["img_per_s"].items():
        print(f"  {name:<11} {stats['median']:9.1f} img/s (range {stats['min']:.1f}-{stats['max']:.1f})")
    r1, r2 = result["ratio_padded_vs_one_by_one_per_round"], result["ratio_padded_vs_by_size_per_round"]
    print(f"  padded / one-by-one throughput: {np.median(r1):.2f}x (range {min(r1):.2f}-{max(r1):.2f}); "
          f"padded / by-size: {np.median(r2):.2f}x (range {min(r2):.2f}-{max(r2):.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
