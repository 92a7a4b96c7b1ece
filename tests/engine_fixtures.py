"""Small vitdeploy-contract graphs for the engine tests, written with onnx.helper.

The graph follows the bundle contract: one uint8 NHWC input ``images`` -> Cast, /255, -mean, /std,
NHWC->NCHW -> a one-block ViT (patch Conv, class token, position table, LayerNormalization,
multi-head attention with Softmax, exact-GELU MLP through Erf) -> ``logits`` and ``probs`` [N, K].
Batch is dynamic; with ``dynamic_hw`` the height and width are symbolic and the position table is
resized to the runtime grid inside the graph. Weights are random but seeded, and ONNX Runtime runs
every graph these helpers write (``write_bundle`` checks that).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from vitdeploy.bundle import FORMAT, Bundle, embed_manifest, write_labels
from vitdeploy.fileio import atomic_path, atomic_write_json
from vitdeploy.spec import ViTSpec

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def make_spec(image: int = 32, patch: int = 8, dim: int = 32, heads: int = 2, classes: int = 10) -> ViTSpec:
    return ViTSpec(image_size=(image, image), patch_size=(patch, patch), embed_dim=dim, depth=1, num_heads=heads, num_classes=classes)


def mini_vit(spec: ViTSpec, dynamic_hw: bool = False, seed: int = 0, opset: int = 17, fp16: bool = False) -> onnx.ModelProto:
    """The fp32 graph, or with ``fp16`` the mixed-precision one: fp16 weights and activations, with the
    preprocessing, LayerNorm, Softmax and the outputs in fp32 (the precision pass's policy)."""
    rng = np.random.default_rng(seed)
    ftype = np.float16 if fp16 else np.float32
    d, heads, k = spec.embed_dim, spec.num_heads, spec.num_classes
    hd = d // heads
    ph, pw = spec.patch_size
    gh, gw = spec.native_grid
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(name: str, *shape: int, scale: float = 0.05) -> str:
        return const(name, (rng.standard_normal(shape) * scale).astype(np.float32).astype(ftype))

    def scalar(name: str, value: float) -> str:
        return const(name, np.array(value, ftype))

    def to32(inp: str) -> str:
        return node("Cast", [inp], f"{inp}/to32", to=TensorProto.FLOAT) if fp16 else inp

    def back(inp: str) -> str:
        return node("Cast", [inp], f"{inp}/to16", to=TensorProto.FLOAT16) if fp16 else inp

    def node(op: str, inputs: list[str], output: str, **attrs: object) -> str:
        nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    # preprocessing: uint8 NHWC pixels -> normalised float NCHW
    x = node("Cast", ["images"], "pre/cast", to=TensorProto.FLOAT)
    x = node("Div", [x, const("c255", np.array(255.0, np.float32))], "pre/scale")
    x = node("Sub", [x, const("mean", np.array(MEAN, np.float32))], "pre/sub_mean")
    x = node("Div", [x, const("std", np.array(STD, np.float32))], "pre/div_std")
    x = back(node("Transpose", [x], "pre/nchw", perm=[0, 3, 1, 2]))

    # patch embedding
    x = node("Conv", [x, weight("patch.w", d, 3, ph, pw), weight("patch.b", d)], "patch/conv", kernel_shape=[ph, pw], strides=[ph, pw])
    grid = x
    x = node("Reshape", [x, const("flat_shape", np.array([0, d, -1], np.int64))], "patch/flatten")
    x = node("Transpose", [x], "patch/tokens", perm=[0, 2, 1])  # [N, L, d]

    # class token: expand [1,1,d] to the runtime batch
    shape = node("Shape", [x], "cls/shape")
    batch = node("Slice", [shape, const("s0", np.array([0], np.int64)), const("s1", np.array([1], np.int64))], "cls/batch")
    cls_shape = node("Concat", [batch, const("one_d", np.array([1, d], np.int64))], "cls/expand_shape", axis=0)
    cls = node("Expand", [weight("cls_token", 1, 1, d), cls_shape], "cls/expand")
    x = node("Concat", [cls, x], "cls/concat", axis=1)

    # position table: [1, 1+L, d]; for dynamic H/W the patch rows are resized to the runtime grid
    if dynamic_hw:
        pos_grid = weight("pos.grid", 1, d, gh, gw)
        grid_hw = node("Slice", [node("Shape", [grid], "pos/shape"), const("s2", np.array([2], np.int64)), const("s4", np.array([4], np.int64))], "pos/hw")
        sizes = node("Concat", [const("one_d_sz", np.array([1, d], np.int64)), grid_hw], "pos/sizes", axis=0)
        resized = back(node("Resize", [to32(pos_grid), "", "", sizes], "pos/resize", mode="linear"))
        rows = node("Transpose", [node("Reshape", [resized, const("pos_flat", np.array([1, d, -1], np.int64))], "pos/flat")], "pos/rows", perm=[0, 2, 1])
        pos = node("Concat", [weight("pos.cls", 1, 1, d), rows], "pos/table", axis=1)
    else:
        pos = weight("pos.table", 1, 1 + gh * gw, d)
    x = node("Add", [x, pos], "pos/add")

    def layer_norm(inp: str, prefix: str) -> str:
        ln = node("LayerNormalization", [to32(inp), const(f"{prefix}.g", np.ones(d, np.float32)), const(f"{prefix}.b", np.zeros(d, np.float32))], f"{prefix}/ln", axis=-1, epsilon=1e-6)
        return back(ln)

    # attention
    h = layer_norm(x, "blk.norm1")
    qkv = node("Add", [node("MatMul", [h, weight("attn.qkv.w", d, 3 * d)], "attn/qkv_mm"), weight("attn.qkv.b", 3 * d)], "attn/qkv")
    qkv = node("Reshape", [qkv, const("qkv_shape", np.array([0, -1, 3, heads, hd], np.int64))], "attn/qkv_split")
    qkv = node("Transpose", [qkv], "attn/qkv_heads", perm=[2, 0, 3, 1, 4])  # [3, N, h, L, hd]
    q = node("Gather", [qkv, const("i0", np.array(0, np.int64))], "attn/q", axis=0)
    kk = node("Gather", [qkv, const("i1", np.array(1, np.int64))], "attn/k", axis=0)
    v = node("Gather", [qkv, const("i2", np.array(2, np.int64))], "attn/v", axis=0)
    scores = node("MatMul", [q, node("Transpose", [kk], "attn/kT", perm=[0, 1, 3, 2])], "attn/scores")
    scores = node("Mul", [scores, scalar("attn_scale", hd**-0.5)], "attn/scaled")
    probs = back(node("Softmax", [to32(scores)], "attn/softmax", axis=-1))
    ctx = node("MatMul", [probs, v], "attn/context")
    ctx = node("Reshape", [node("Transpose", [ctx], "attn/merge", perm=[0, 2, 1, 3]), const("merge_shape", np.array([0, -1, d], np.int64))], "attn/merged")
    out = node("Add", [node("MatMul", [ctx, weight("attn.proj.w", d, d)], "attn/proj_mm"), weight("attn.proj.b", d)], "attn/proj")
    x = node("Add", [x, out], "blk/res1")

    # MLP with exact GELU: 0.5 * x * (1 + erf(x / sqrt 2))
    h = layer_norm(x, "blk.norm2")
    h = node("Add", [node("MatMul", [h, weight("mlp.fc1.w", d, 4 * d)], "mlp/fc1_mm"), weight("mlp.fc1.b", 4 * d)], "mlp/fc1")
    erf = node("Erf", [node("Div", [h, scalar("sqrt2", np.sqrt(2.0))], "mlp/gelu_div")], "mlp/gelu_erf")
    gated = node("Mul", [h, node("Add", [erf, scalar("one", 1.0)], "mlp/gelu_add")], "mlp/gelu_mul")
    gelu = node("Mul", [gated, scalar("half", 0.5)], "mlp/gelu")
    h = node("Add", [node("MatMul", [gelu, weight("mlp.fc2.w", 4 * d, d)], "mlp/fc2_mm"), weight("mlp.fc2.b", d)], "mlp/fc2")
    x = node("Add", [x, h], "blk/res2")

    # head on the class token
    x = layer_norm(x, "head.norm")
    x = node("Gather", [x, const("cls_index", np.array(0, np.int64))], "head/cls", axis=1)
    nodes.append(helper.make_node("Gemm", [x, weight("head.w", d, k), weight("head.b", k)], ["head/logits" if fp16 else "logits"], name="head/fc"))
    if fp16:
        nodes.append(helper.make_node("Cast", ["head/logits"], ["logits"], name="head/logits_fp32", to=TensorProto.FLOAT))
    nodes.append(helper.make_node("Softmax", ["logits"], ["probs"], name="head/softmax", axis=-1))

    hw = ["height", "width"] if dynamic_hw else list(spec.image_size)
    graph = helper.make_graph(
        nodes,
        "mini_vit",
        [helper.make_tensor_value_info("images", TensorProto.UINT8, ["batch", hw[0], hw[1], 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", k]), helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", k])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="vitdeploy-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def manifest_for(spec: ViTSpec, dynamic_hw: bool) -> dict:
    return {
        "format": FORMAT,
        "vitdeploy_version": "test",
        "name": "mini-vit",
        "source": {"kind": "test", "name": "mini-vit"},
        "spec": spec.to_dict(),
        "preprocessing": {"mean": MEAN, "std": STD, "channel_order": "rgb", "input_size": list(spec.image_size)},
        "labels": [f"class{i}" for i in range(spec.num_classes)],
        "resolution": {"mode": "dynamic" if dynamic_hw else "static", "height": spec.image_size[0], "width": spec.image_size[1]},
        "graph": {"input": "images", "layout": "NHWC", "dtype": "uint8", "outputs": ["logits", "probs"], "precision": "fp32"},
    }


def write_bundle(root: Path, dynamic_hw: bool = False, precisions: tuple[str, ...] = ("fp32",), spec: ViTSpec | None = None) -> Bundle:
    """A bundle folder with the fp32 graph and, when asked, the fp16 mixed-precision graph and an int8 Q/DQ
    graph (ONNX Runtime static quantization, as `vitdeploy calibrate` writes)."""
    spec = spec or make_spec()
    root.mkdir(parents=True, exist_ok=True)
    manifest = manifest_for(spec, dynamic_hw)
    fp32 = mini_vit(spec, dynamic_hw)
    graphs = {"fp32": fp32}
    if "fp16" in precisions:
        graphs["fp16"] = mini_vit(spec, dynamic_hw, fp16=True)
    atomic_write_json(root / "manifest.json", {**manifest, "artifacts": {}})
    write_labels(root / "labels.txt", manifest["labels"])
    bundle = Bundle.open(root)
    for precision in ("fp32", "fp16"):
        if precision in graphs:
            _save(graphs[precision], root / {"fp32": "model.onnx", "fp16": "model.fp16.onnx"}[precision], manifest, precision)
            bundle.add_artifact(precision, root / {"fp32": "model.onnx", "fp16": "model.fp16.onnx"}[precision])
    if "int8" in precisions:
        _quantize(root / "model.onnx", root / "model.int8.onnx", spec, manifest)
        bundle.add_artifact("int8", root / "model.int8.onnx")
    return Bundle.open(root)


def _save(model: onnx.ModelProto, path: Path, manifest: dict, precision: str) -> None:
    core = json.loads(json.dumps(manifest))
    core["graph"]["precision"] = precision
    embed_manifest(model, core)
    with atomic_path(path, suffix=".onnx") as tmp:
        onnx.save(model, str(tmp))


def _quantize(src: Path, dst: Path, spec: ViTSpec, manifest: dict) -> None:
    """Q/DQ int8 on MatMul/Gemm/Conv inputs, as the calibrate step writes it (ORT static quantization)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(1)
            h, w = spec.image_size
            self.items = iter([{"images": rng.integers(0, 256, (2, h, w, 3), dtype=np.uint8)} for _ in range(2)])

        def get_next(self):  # noqa: ANN201 - ORT's interface
            return next(self.items, None)

    with atomic_path(dst, suffix=".onnx") as tmp:
        quantize_static(
            str(src), str(tmp), Reader(), quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul", "Gemm", "Conv"],
            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=True,
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
        )
        model = onnx.load(str(tmp))
        _save(model, tmp, manifest, "int8")
