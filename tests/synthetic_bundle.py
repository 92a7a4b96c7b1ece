"""Small bundles that follow the exported-graph contract, for the embedding tests (runtime, predict,
Triton, C++), built with onnx.helper in milliseconds and without torch.

The graph: uint8 NHWC ``images`` -> Cast -> [BGR->RGB] -> /255 -> (x - mean)/std -> NCHW ->
bilinear Resize to 2x2 (one sample per quadrant) -> a linear layer -> ``logits`` and ``probs``.
Its classes say where the red is, so a test can tell a correct image from a rotated, mirrored or
channel-swapped one:

    red-top, red-bottom, red-left, red-right  (the red half of a half-red, half-black image)
    uniform                                   (a bias that wins when nothing is half red)
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.bundle import FORMAT, Bundle, embed_manifest, write_labels

LABELS = ["red-top", "red-bottom", "red-left", "red-right", "uniform"]
MEAN = [0.5, 0.5, 0.5]
STD = [0.5, 0.5, 0.5]


def classifier_weights() -> tuple[np.ndarray, np.ndarray]:
    """[12, 5] weights over the red channel of the 2x2 quadrant features (NCHW flatten order)."""
    w = np.zeros((3, 2, 2, len(LABELS)), dtype=np.float32)
    red = w[0]
    red[0, :, 0], red[1, :, 0] = 1, -1  # red-top
    red[1, :, 1], red[0, :, 1] = 1, -1  # red-bottom
    red[:, 0, 2], red[:, 1, 2] = 1, -1  # red-left
    red[:, 1, 3], red[:, 0, 3] = 1, -1  # red-right
    bias = np.array([0, 0, 0, 0, 1], dtype=np.float32)
    return w.reshape(12, len(LABELS)), bias


def half_red(height: int, width: int, where: str) -> np.ndarray:
    """uint8 RGB [H, W, 3]: red on one half (top/bottom/left/right), black on the other."""
    img = np.zeros((height, width, 3), dtype=np.uint8)
    sl = {
        "top": np.s_[: height // 2, :],
        "bottom": np.s_[height // 2 :, :],
        "left": np.s_[:, : width // 2],
        "right": np.s_[:, width // 2 :],
    }[where]
    img[sl + (0,)] = 255
    return img


def expected_probs(images_rgb: np.ndarray) -> np.ndarray:
    """The graph's probabilities computed in numpy for block images (quadrant centre samples)."""
    n, h, w, _ = images_rgb.shape
    x = (images_rgb.astype(np.float32) / 255.0 - np.float32(0.5)) / np.float32(0.5)
    rows, cols = [h // 4, (3 * h) // 4], [w // 4, (3 * w) // 4]
    quad = x[:, rows][:, :, cols].transpose(0, 3, 1, 2).reshape(n, 12)
    weights, bias = classifier_weights()
    logits = quad @ weights + bias
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def make_graph(
    size: tuple[int, int] | None,
    *,
    channel_order: str = "rgb",
    resize_to: tuple[int, int] | None = None,
    fp16: bool = False,
    float_input: bool = False,
) -> Any:
    """The ONNX model; ``size=None`` gives symbolic H/W (dynamic resolution or in-graph resize).
    ``float_input``: the "float-nchw" contract, normalised float NCHW in (the caller preprocesses)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    height, width = size if size else ("height", "width")
    weights, bias = classifier_weights()
    mm_type = np.float16 if fp16 else np.float32
    inits = [
        numpy_helper.from_array(np.array(255.0, dtype=np.float32), "c255"),
        numpy_helper.from_array(np.array(MEAN, dtype=np.float32).reshape(1, 1, 1, 3), "mean"),
        numpy_helper.from_array(np.array(STD, dtype=np.float32).reshape(1, 1, 1, 3), "std"),
        numpy_helper.from_array(np.array([2, 2], dtype=np.int64), "hw2"),
        numpy_helper.from_array(weights.astype(mm_type), "W"),
        numpy_helper.from_array(bias.astype(mm_type), "B"),
        numpy_helper.from_array(np.array([2, 1, 0], dtype=np.int64), "bgr_idx"),
    ]
    if float_input:
        nodes = [helper.make_node("Identity", ["images"], ["x4"])]
    else:
        nodes = [helper.make_node("Cast", ["images"], ["x0"], to=TensorProto.FLOAT)]
        cur = "x0"
        if channel_order == "bgr":
            nodes.append(helper.make_node("Gather", [cur, "bgr_idx"], ["x_rgb"], axis=3))
            cur = "x_rgb"
        nodes += [
            helper.make_node("Div", [cur, "c255"], ["x1"]),
            helper.make_node("Sub", ["x1", "mean"], ["x2"]),
            helper.make_node("Div", ["x2", "std"], ["x3"]),
            helper.make_node("Transpose", ["x3"], ["x4"], perm=[0, 3, 1, 2]),
        ]
    nodes += [
        helper.make_node("Shape", ["x4"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "two"], ["nc"]),
    ]
    inits += [
        numpy_helper.from_array(np.array([0], dtype=np.int64), "zero"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "two"),
    ]
    cur = "x4"
    if resize_to is not None:
        inits.append(numpy_helper.from_array(np.array(resize_to, dtype=np.int64), "to_hw"))
        nodes += [
            helper.make_node("Concat", ["nc", "to_hw"], ["to_sizes"], axis=0),
            helper.make_node("Resize", [cur, "", "", "to_sizes"], ["x_in"], mode="linear", coordinate_transformation_mode="half_pixel"),
        ]
        cur = "x_in"
    nodes += [
        helper.make_node("Concat", ["nc", "hw2"], ["sizes"], axis=0),
        helper.make_node("Resize", [cur, "", "", "sizes"], ["q"], mode="linear", coordinate_transformation_mode="half_pixel"),
        helper.make_node("Flatten", ["q"], ["f"], axis=1),
    ]
    if fp16:
        nodes += [
            helper.make_node("Cast", ["f"], ["f16"], to=TensorProto.FLOAT16),
            helper.make_node("MatMul", ["f16", "W"], ["mm16"]),
            helper.make_node("Add", ["mm16", "B"], ["l16"]),
            helper.make_node("Cast", ["l16"], ["logits"], to=TensorProto.FLOAT),
        ]
    else:
        nodes += [helper.make_node("MatMul", ["f", "W"], ["mm"]), helper.make_node("Add", ["mm", "B"], ["logits"])]
    nodes.append(helper.make_node("Softmax", ["logits"], ["probs"], axis=-1))
    graph = helper.make_graph(
        nodes,
        "synthetic_quadrants",
        [
            helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, height, width])
            if float_input
            else helper.make_tensor_value_info("images", TensorProto.UINT8, ["batch", height, width, 3])
        ],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", len(LABELS)]),
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", len(LABELS)]),
        ],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def make_bundle(
    root: str | Path,
    *,
    size: int = 16,
    mode: str = "static",
    channel_order: str = "rgb",
    host_resize: dict[str, Any] | None = None,
    in_graph_resize: bool = False,
    fp16: bool = False,
    float_input: bool = False,
    name: str | None = None,
) -> Bundle:
    """Write a bundle folder (manifest, labels, model.onnx [, model.fp16.onnx]) and open it."""
    import onnx

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    dynamic = mode == "dynamic"
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "vitdeploy_version": "test",
        "name": name or root.name,
        "source": {"kind": "synthetic", "name": "quadrants"},
        "spec": {
            "image_size": [size, size],
            "patch_size": [4, 4],
            "embed_dim": 8,
            "depth": 1,
            "num_heads": 2,
            "num_classes": len(LABELS),
        },
        "preprocessing": {
            "input": "float-nchw" if float_input else "uint8-nhwc",
            "channel_order": channel_order,
            "scale": 1 / 255,
            "mean": MEAN,
            "std": STD,
            "input_size": None if (dynamic or in_graph_resize) else [size, size],
            "in_graph_resize": {"method": "bilinear", "antialias": False, "to": [size, size]} if in_graph_resize else None,
            "host_resize": host_resize or {"mode": "stretch", "interpolation": "bilinear", "crop_pct": None},
        },
        "labels": list(LABELS),
        "resolution": {"mode": "dynamic" if dynamic else "static", "height": size, "width": size},
        "graph": {"precision": "fp32", "opset": 18},
    }
    write_labels(root / "labels.txt", LABELS)
    bundle = Bundle(root, manifest)
    bundle.save()
    fixed = None if (dynamic or in_graph_resize) else (size, size)
    resize_to = (size, size) if in_graph_resize else None
    for precision, is16 in (("fp32", False), ("fp16", True)) if fp16 else (("fp32", False),):
        model = make_graph(fixed, channel_order=channel_order, resize_to=resize_to, fp16=is16, float_input=float_input)
        embed_manifest(model, manifest)
        path = root / ("model.onnx" if precision == "fp32" else "model.fp16.onnx")
        onnx.save(model, str(path))
        bundle.add_artifact(precision, path)
    return Bundle.open(root)


def fake_engine(bundle, target, precision, *, trt="10.3.0", gpu="Orin", cc="8.7", batch=(1, 4, 8), hw=16):
    """An engines/<target>/ with engine.json as vitdeploy.engine.fingerprint writes it, and a plan file
    that is not a real engine (TensorRT is GPU-only): for tests of engine choice and Triton configs."""
    from vitdeploy.engine.fingerprint import FORMAT

    edir = bundle.root / "engines" / target
    edir.mkdir(parents=True, exist_ok=True)
    (edir / "model.plan").write_bytes(b"plan bytes for " + target.encode())

    fingerprint = {
        "format": FORMAT,
        "tensorrt": trt,
        "device": {"gpu_name": gpu, "compute_capability": cc, "arch": platform.machine()},
        "precision": precision,
        "source_precision": precision,
        "source_sha256": bundle.artifact_record(precision)["sha256"],
        "plan_sha256": hashlib.sha256((edir / "model.plan").read_bytes()).hexdigest(),
        "input": {"name": "images", "dtype": "uint8", "layout": "NHWC"},
        "profiles": [{"batch": list(batch), "height": [hw] * 3, "width": [hw] * 3}],
        "hardware_compatibility": "none",
        "version_compatible": False,
    }
    (edir / "engine.json").write_text(json.dumps(fingerprint))
    bundle.manifest.setdefault("engines", {})[target] = {"dir": f"engines/{target}", "precision": precision}
    bundle.save()
