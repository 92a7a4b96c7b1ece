"""Classify images with a Triton server serving a vitdeploy bundle: `vitdeploy serve`, or a production
tritonserver loading the repository `vitdeploy triton-repo` wrote (same tensor names and types).

    python examples/python/triton_client.py --bundle BUNDLE IMAGE [IMAGE ...] [--url localhost:8000]
    python examples/python/triton_client.py --bundle BUNDLE --protocol grpc --url localhost:8001 cat.jpg --top-k 3

The server takes raw uint8 pixels, NHWC, at the model's input size: preprocessing (scale, mean,
std, layout) is inside the graph. The client only decodes each file and resizes it by the rule the
bundle's manifest records (so the pixels are the ones `vitdeploy predict` would feed), sends them
as one batch, and turns the ``probs`` output into top-k with the bundle's labels. It needs
tritonclient, numpy, Pillow and vitdeploy's light core (no PyTorch, no ONNX Runtime).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from vitdeploy.bundle import Bundle
from vitdeploy.errors import VitDeployError
from vitdeploy.images import decode_image, model_input_size, resize_for_model, to_channel_order
from vitdeploy.triton import model_name


def load_batch(bundle: Bundle, paths: list[str], size: tuple[int, int]) -> np.ndarray:
    """uint8 [N, H, W, 3] in the graph's channel order, resized by the manifest's host rule."""
    pixels = [to_channel_order(resize_for_model(decode_image(p), bundle.preprocessing, size), bundle.preprocessing) for p in paths]
    return np.ascontiguousarray(np.stack(pixels))


def infer(protocol: str, url: str, model: str, batch: np.ndarray) -> np.ndarray:
    """The ``probs`` output [N, classes]; one request per max_batch_size images."""
    if protocol == "grpc":
        import tritonclient.grpc as client_lib
    else:
        import tritonclient.http as client_lib
    with client_lib.InferenceServerClient(url) as client:
        if not client.is_model_ready(model):
            raise SystemExit(f"error: model {model!r} is not ready on {url} (is the server up? is --model right?)")
        # The input's name and type come from the server, as a client of any Triton model does.
        meta = client.get_model_metadata(model)
        meta_inputs = meta.inputs if protocol == "grpc" else meta["inputs"]
        first = meta_inputs[0]
        name, datatype = (first.name, first.datatype) if protocol == "grpc" else (first["name"], first["datatype"])
        if datatype != "UINT8":
            raise SystemExit(f"error: model {model!r} takes {datatype}, not raw uint8 pixels; it was not exported by vitdeploy with a uint8 input")
        config = client.get_model_config(model)
        max_batch = config.config.max_batch_size if protocol == "grpc" else config["max_batch_size"]
        rows = []
        for start in range(0, len(batch), max(1, max_batch)):  # requests above max_batch_size are refused
            chunk = batch[start : start + max(1, max_batch)]
            tensor = client_lib.InferInput(name, list(chunk.shape), datatype)
            tensor.set_data_from_numpy(chunk)
            wanted = [client_lib.InferRequestedOutput("probs")]
            rows.append(client.infer(model, [tensor], outputs=wanted).as_numpy("probs"))
        return np.concatenate(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("images", nargs="+")
    parser.add_argument("--bundle", required=True, help="the bundle the server serves (labels, input size, resize rule)")
    parser.add_argument("--url", default=None, help="host:port (default: localhost:8000 for http, localhost:8001 for grpc)")
    parser.add_argument("--protocol", choices=["http", "grpc"], default="http")
    parser.add_argument("--model", default=None, help="model name on the server (default: as `vitdeploy serve` names it)")
    parser.add_argument("--top-k", type=int, default=3)
    args = parser.parse_args(argv)
    url = args.url or ("localhost:8001" if args.protocol == "grpc" else "localhost:8000")

    try:
        bundle = Bundle.open(args.bundle)
        size = model_input_size(bundle.preprocessing, bundle.resolution, bundle.spec.patch_size, None)
        batch = load_batch(bundle, args.images, size)
    except VitDeployError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    labels = bundle.labels or [str(k) for k in range(bundle.spec.num_classes)]
    probs = infer(args.protocol, url, args.model or model_name(bundle), batch)
    for path, row in zip(args.images, probs):
        order = np.argsort(-row, kind="stable")[: args.top_k]  # ties: lower index first, as predict
        print(f"{path}: " + ", ".join(f"{labels[i]} {row[i]:.4f}" for i in order))
    return 0


if __name__ == "__main__":
    sys.exit(main())
