"""Embed a vitdeploy bundle in a Python application.

    python examples/python/classify.py BUNDLE IMAGE [IMAGE ...] [--top-k 3] [--threads 4]

What an app on a Jetson or a server does with a bundle: load it once (the TensorRT engine built for
this device when there is one, ONNX Runtime otherwise), then hand it pixels or files from any
number of threads. Preprocessing is inside the graph, so frames from a camera go in as uint8 HWC
arrays; files are decoded and resized by the bundle's own rule.

Needs only numpy, Pillow and onnxruntime (or tensorrt + cuda-python on the device) - no PyTorch.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor

from vitdeploy.errors import VitDeployError
from vitdeploy.images import decode_image
from vitdeploy.runtime.classifier import Classifier


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("images", nargs="+")
    parser.add_argument("--top-k", type=int, default=3)
    parser.add_argument("--threads", type=int, default=4, help="worker threads sharing one Classifier")
    args = parser.parse_args(argv)

    try:
        clf = Classifier.load(args.bundle)
        print(f"# {clf.backend} {clf.precision}, input {clf.input_size[0]}x{clf.input_size[1]} ({clf.backend_reason})")

        # 1. Files, one batch: decoded, EXIF-rotated, resized by the manifest's rule.
        for path, top in zip(args.images, clf.classify(args.images, top_k=args.top_k)):
            print(f"{path}: " + ", ".join(f"{t.label} {t.prob:.3f}" for t in top))

        # 2. Frames, as a camera loop would deliver them: uint8 HWC arrays, one call per frame,
        #    from several threads at once (one Classifier is shared; see its docstring).
        frames = [decode_image(p) for p in args.images]
        with ThreadPoolExecutor(max_workers=args.threads) as pool:
            answers = list(pool.map(lambda frame: clf.classify(frame, top_k=1)[0][0], frames))
        for path, top in zip(args.images, answers):
            print(f"{path} (frame): {top.label} {top.prob:.3f}")

        # 3. Probabilities for your own post-processing: [N, classes] float32.
        probs = clf.probabilities(frames)
        print(f"# probabilities {probs.shape}, rows sum to {probs.sum(axis=1).round(4).tolist()}")
    except VitDeployError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
