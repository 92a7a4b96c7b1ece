"""`vitdeploy check` for variable-size bundles (images in a canvas + valid_hw).

Two pieces of evidence, both against PyTorch running each image ALONE at its own size (the position
table resampled offline to that grid with the bundle's declared rule):

- numbers: seeded random images of mixed whole-patch sizes (canvas, one patch, portrait, landscape,
  the native size, random) padded with noise into one batch; per-row max |dlogit| <= the fp32 gate;
- task: the labelled set with every image rescaled to a seeded random size and aspect ratio
  (0.5-1.5x the native side, aspect 1:3 to 3:1), fitted by the bundle's host policy, in mixed
  batches: accuracy of the graph and of PyTorch on the same pixels, their top-1 agreement and max |dlogit|.

The report is written to reports/check.json like every check report, with ``kind`` saying which.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from .. import __version__
from ..bundle import Bundle
from ..compare import accuracy, compare_outputs
from ..errors import UserError
from ..fileio import atomic_write_json

KIND = "variable-size"


def mixed_rescale(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The image at a seeded random scale (0.5-1.5x) and aspect ratio (1:3 to 3:1), bilinear."""
    from PIL import Image

    h, w = image.shape[:2]
    scale = rng.uniform(0.5, 1.5)
    aspect = float(np.exp(rng.uniform(np.log(1 / 3), np.log(3))))
    new_h = max(1, int(round(h * scale / np.sqrt(aspect))))
    new_w = max(1, int(round(w * scale * np.sqrt(aspect))))
    return np.asarray(Image.fromarray(image).resize((new_w, new_h), Image.BILINEAR), dtype=np.uint8)


def check_variable(bundle: Bundle, opts: Any, log: Callable[[str], None]) -> Dict[str, Any]:
    from ..data import open_labelled
    from ..images import to_channel_order
    from ..runtime.classifier import Classifier
    from .inputs import default_data

    try:
        from vitdeploy.exporters.api import loaded_for_bundle
        from vitdeploy.exporters.regrid import regrid_static
        from vitdeploy.exporters.torch_runner import TorchRunner
        from vitdeploy.exporters.variable_export import verify_invariance
        from vitdeploy.posembed import PosEmbedInterpolation
    except ImportError as exc:
        raise UserError(f"check compares with PyTorch, which is not importable ({exc}); pip install 'vitdeploy[export]'") from None
    precisions = list(opts.precisions or bundle.precisions())
    if precisions != ["fp32"]:
        raise UserError(f"variable-size bundles hold an fp32 graph only; got --precision {','.join(precisions)}")
    spec = bundle.spec
    native = tuple(spec.image_size)
    loaded = loaded_for_bundle(bundle, resolution=native)
    log(f"reference: PyTorch on {bundle.manifest['source']['kind']}:{bundle.manifest['source']['name']}, each image alone at its own size")
    numbers = verify_invariance(bundle, loaded, log, count=max(6, min(opts.random_count, 16)))
    failures = [f"numbers: {f}" for f in numbers["failures"]]

    task: Dict[str, Any] = {}
    data = opts.data or default_data(bundle)
    if data:
        labelled = open_labelled(data, native, bundle.preprocessing, classes=bundle.labels, limit=opts.limit)
        rng = np.random.default_rng(opts.seed)
        clf = Classifier.load(bundle, threads=opts.threads, max_batch=opts.batch)
        fitted = [clf.prepare(to_channel_order(mixed_rescale(img, rng), bundle.preprocessing)) for img in labelled.images]
        got = np.concatenate([clf.run_padded(*b, output="logits") for b in _batches(fitted, clf)])
        rule = PosEmbedInterpolation.from_dict({k: v for k, v in bundle.resolution["pos_embed_interpolation"].items() if k != "description"})
        runners: Dict[Tuple[int, int], Any] = {}
        ref_logits = []
        for img in fitted:
            size = tuple(img.shape[:2])
            if size not in runners:
                runners[size] = TorchRunner(regrid_static(loaded, size[0], size[1], rule), bundle.preprocessing, threads=opts.threads)
            ref_logits.append(runners[size].infer(img[None])["logits"][0])
        ref = np.stack(ref_logits)
        stats = compare_outputs("logits", ref, got)
        acc_graph, acc_ref = accuracy(got, labelled.labels), accuracy(ref, labelled.labels)
        drop = acc_ref - acc_graph
        sizes = sorted({tuple(i.shape[:2]) for i in fitted})
        task = {"data": labelled.record(), "policy": clf.policy, "distinct_sizes": len(sizes), "smallest": list(sizes[0]),
                "largest": list(sizes[-1]), "accuracy": acc_graph, "reference_accuracy": acc_ref, "accuracy_drop": drop,
                **{k: v for k, v in stats.to_dict().items() if k in ("max_abs", "top1_agreement", "cosine_min")}}
        log(f"task: {len(fitted)} images of {data} at {len(sizes)} sizes ({sizes[0][0]}x{sizes[0][1]} to {sizes[-1][0]}x{sizes[-1][1]}, "
            f"policy {clf.policy}): graph {acc_graph:.2%}, PyTorch alone {acc_ref:.2%}, agreement {stats.top1_agreement:.1%}, "
            f"max |dlogit| {stats.max_abs:.1e}")
        if stats.top1_agreement < 1.0 or stats.max_abs > opts.fp32_max_abs or drop > 0:
            failures.append(f"task: agreement {stats.top1_agreement:.1%}, max |dlogit| {stats.max_abs:.1e} "
                            f"(gate {opts.fp32_max_abs:g}), accuracy drop {drop * 100:+.2f} pt")
    report = {
        "kind": KIND,
        "bundle": str(bundle.root),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "vitdeploy": __version__,
        "canvas": [bundle.resolution["height"], bundle.resolution["width"]],
        "rule": bundle.preprocessing["variable_size"]["rule"],
        "numbers": numbers,
        "task": task,
        "failures": failures,
        "passed": not failures,
    }
    if opts.write_report and bundle.bare_onnx is None:
        atomic_write_json(bundle.root / "reports" / "check.json", report)
    return report


def _batches(images: List[np.ndarray], clf: Any) -> Any:
    from ..variable import pad_to_canvas

    for start in range(0, len(images), clf.max_batch):
        yield pad_to_canvas(images[start:start + clf.max_batch], clf.input_size)


def print_variable_report(report: Dict[str, Any], echo: Callable[[str], None]) -> None:
    numbers, task = report["numbers"], report["task"]
    echo(f"vitdeploy check (variable size, canvas {report['canvas'][0]}x{report['canvas'][1]}): {report['bundle']}")
    echo(f"  rule: {report['rule']}")
    echo(f"  numbers: {len(numbers['sizes'])} mixed sizes in one batch vs each alone: max |dlogit| {numbers['max_abs']:.2e} "
         f"(gate {numbers['limit_max_abs']:g}) -> {'pass' if numbers['passed'] else 'FAIL'}")
    if task:
        echo(f"  task: {task['data']['count']} images of {task['data']['source']} at {task['distinct_sizes']} sizes "
             f"(policy {task['policy']}): graph {task['accuracy']:.2%}, PyTorch alone {task['reference_accuracy']:.2%}, "
             f"agreement {task['top1_agreement']:.1%}")
    echo("PASS" if report["passed"] else "FAIL: " + "; ".join(report["failures"]))
