"""fp16 and int8 graphs of a variable-size (images, valid_hw) bundle (issue #13).

The trained digits ViT (CLS read-out) exported with --variable-size --canvas 48x48 gets an fp16 graph
(`vitdeploy convert`) and an int8 graph (`vitdeploy calibrate`, fed (images, valid_hw) pairs); a tiny
reference GAP ViT (masked-mean read-out) exported with --precision fp32,fp16 covers the masked sum.
Checked by walking the graphs (everything computed from valid_hw before it meets the image stays
fp32 / carries no Q/DQ), by the invariance (each row of a padded mixed-size batch vs the image alone
through PyTorch at its own size, within the fp16/int8 gates), by edge valid_hw rows (no NaN), and by
`vitdeploy check` scoring all three graphs.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from vitdeploy.bundle import Bundle
from vitdeploy.cli import main
from vitdeploy.exporters.mask_path import find_mask_path, qdq_on_mask_path
from vitdeploy.gate import Gate
from vitdeploy.variable import edge_valid_hw, pad_to_canvas, run_padded_graph

pytestmark = pytest.mark.slow

CANVAS = (48, 48)
COSINE_MIN = Gate().min_cosine  # check's fp16/int8 gate (--min-cosine)


@pytest.fixture(scope="module")
def digits_all(export_cached, tmp_path_factory) -> Bundle:
    """The digits variable-size bundle with fp16 (convert) and int8 (calibrate) graphs, via the CLI."""
    source = export_cached("builtin:digits", variable_size=True, canvas=CANVAS)
    root = tmp_path_factory.mktemp("varprec") / "digits"
    shutil.copytree(source.root, root)
    runner = CliRunner()
    result = runner.invoke(main, ["convert", str(root), "--precision", "fp16"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["calibrate", str(root), "--method", "minmax", "--samples", "96", "--eval-limit", "120",
                                  "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert "variable size: calibrated on (images, valid_hw) pairs" in result.output
    return Bundle.open(root)


def _float_types(model: onnx.ModelProto) -> dict[str, int]:
    from vitdeploy.exporters.fp16 import tensor_elem_types

    return tensor_elem_types(model)


def test_fp16_keeps_everything_computed_from_valid_hw_in_fp32(digits_all: Bundle) -> None:
    fp32 = onnx.load(str(digits_all.artifact_path("fp32")))
    fp16 = onnx.load(str(digits_all.artifact_path("fp16")))
    path = find_mask_path(fp16)  # re-found by value flow in the written graph, not taken from the record
    assert path is not None and path.nodes and path.linear  # masks, bias, per-sample table MatMuls
    by_name = {n.name: n for n in fp16.graph.node}
    joins = [by_name[n].op_type for n in path.joins]
    assert joins.count("Add") >= digits_all.spec.depth + 1  # the key bias in every block, the position add
    types = _float_types(fp16)
    fp32_float = onnx.TensorProto.FLOAT
    floats = (fp32_float, onnx.TensorProto.FLOAT16)
    for name in path.fp32_nodes:
        node = by_name[name]
        wrong = [t for t in list(node.input) + list(node.output) if t and types.get(t) in floats and types[t] != fp32_float]
        assert not wrong, f"{node.op_type} {name} computes in fp16: {wrong}"
    # the same nodes as in the fp32 graph (the policy was applied, not just re-derived)
    original = find_mask_path(fp32)
    assert set(original.nodes) <= set(path.nodes) and set(original.joins) <= set(path.joins)
    # the -30000 key bias is an fp32 constant, and the encoder really is fp16
    consts = [n.attribute[0].t for n in fp16.graph.node if n.op_type == "Constant" and n.attribute[0].name == "value"]
    consts += list(fp16.graph.initializer)
    bias = [t for t in consts if t.data_type in floats and onnx.numpy_helper.to_array(t).size == 1
            and float(onnx.numpy_helper.to_array(t)) == -30000.0]
    assert bias and all(t.data_type == fp32_float for t in bias)
    record = digits_all.artifact_record("fp16")
    assert record["placement"]["linear_ops_fp16"] >= 4 * digits_all.spec.depth
    assert record["mask_path"]["mask_path_linear"] == len(path.linear)
    assert record["sanity"]["gate"]["passed"] and record["sanity"]["edge_finite"]


def test_int8_has_no_qdq_on_the_mask_path(digits_all: Bundle) -> None:
    fp32 = onnx.load(str(digits_all.artifact_path("fp32")))
    int8 = onnx.load(str(digits_all.artifact_path("int8")))
    path = find_mask_path(int8)
    assert path is not None and path.linear
    assert qdq_on_mask_path(int8, path) == []
    assert not [n for n in int8.graph.node if n.name in set(path.nodes) and n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    producer = {o: n for n in int8.graph.node for o in n.output}
    for name in path.linear:  # the per-sample table MatMuls read float, not dequantized, inputs
        node = next(n for n in int8.graph.node if n.name == name)
        assert all(producer.get(i) is None or producer[i].op_type != "DequantizeLinear" for i in node.input)
    record = digits_all.artifact_record("int8")
    assert sorted(record["exclusions"]["by"]["valid_hw mask path"]) == sorted(find_mask_path(fp32).linear)
    assert record["placement"]["quantized_layers"] >= 4 * digits_all.spec.depth  # the encoder is int8
    assert record["calibration"]["variable_size"]["distinct_sizes"] >= 10
    gate = record["evaluation"]["gate"]
    assert gate["passed"] and record["evaluation"]["variable_size"]["reference"].startswith("fp32 graph, each image alone")
    assert record["sanity"]["edge_finite"]


def _digit_crops(sizes):
    from PIL import Image

    from vitdeploy.builtin.digits import load_digits_split

    images, _labels = load_digits_split("test")
    crops = [np.asarray(Image.fromarray(images[i]).resize((w, h), Image.BILINEAR)) for i, (h, w) in enumerate(sizes)]
    return crops


def _alone_in_pytorch(bundle: Bundle, crops):
    from vitdeploy.exporters.api import loaded_for_bundle
    from vitdeploy.exporters.regrid import regrid_static
    from vitdeploy.exporters.torch_runner import TorchRunner
    from vitdeploy.posembed import PosEmbedInterpolation

    loaded = loaded_for_bundle(bundle, resolution=tuple(bundle.spec.image_size))
    rule = PosEmbedInterpolation.from_dict({k: v for k, v in bundle.resolution["pos_embed_interpolation"].items() if k != "description"})
    rows = [TorchRunner(regrid_static(loaded, c.shape[0], c.shape[1], rule), bundle.preprocessing, threads=1).infer(c[None]) for c in crops]
    return {k: np.concatenate([r[k] for r in rows]) for k in ("logits", "probs")}


# int8 is gated in the execution its target runs (TensorRT: Q/DQ as fake-quant, ORT "basic"), as in `check`;
# this CPU's int8 kernels are reported there, not gated (they saturate on CPUs without VNNI)
@pytest.mark.parametrize(("precision", "optimization"), [("fp16", "all"), ("int8", "basic")])
def test_padded_rows_equal_each_image_alone_within_the_gates(digits_all: Bundle, precision: str, optimization: str) -> None:
    from vitdeploy.compare import compare_outputs
    from vitdeploy.runtime.ort import OrtRunner

    sizes = [(4, 4), (48, 48), (24, 48), (48, 16), (40, 28), (32, 32), (12, 44), (28, 8), (36, 36), (20, 20), (48, 40), (16, 24)]
    crops = _digit_crops(sizes)
    ref = _alone_in_pytorch(digits_all, crops)
    session = OrtRunner(digits_all.artifact_path(precision), precision=precision, optimization=optimization, threads=1).session
    batch, valid = pad_to_canvas(crops, CANVAS, fill=255)  # padding that would change a digit if it leaked
    got = run_padded_graph(session, batch, valid)
    for name in ("logits", "probs"):  # per-output gates
        stats = compare_outputs(name, ref[name], got[name])
        assert stats.cosine_p1 >= COSINE_MIN, (precision, optimization, name, stats)
    agree = float((got["logits"].argmax(1) == ref["logits"].argmax(1)).mean())
    assert agree >= 11 / 12, (precision, optimization, agree)
    # the padding is masked out, not merely small: other padding gives the same rows
    other, _ = pad_to_canvas(crops, CANVAS, fill=0)
    assert np.abs(run_padded_graph(session, other, valid)["logits"] - got["logits"]).max() <= 1e-3
    # and valid_hw is honoured (told every row fills the canvas, the answer moves)
    full = run_padded_graph(session, batch, np.full_like(valid, 48))["logits"]
    assert np.abs(full[:4] - got["logits"][:4]).max() > 1e-2


@pytest.mark.parametrize(("precision", "optimization"), [("fp16", "all"), ("int8", "basic"), ("int8", "all")])
def test_edge_valid_hw_rows_give_no_nan(digits_all: Bundle, precision: str, optimization: str) -> None:
    from vitdeploy.runtime.ort import OrtRunner

    session = OrtRunner(digits_all.artifact_path(precision), precision=precision, optimization=optimization, threads=1).session
    edge = edge_valid_hw(CANVAS, (4, 4))
    assert edge[0].tolist() == [4, 4] and edge[1].tolist() == [48, 48]  # one patch, the full canvas, then clamped values
    images = np.random.default_rng(0).integers(0, 256, (len(edge), *CANVAS, 3), dtype=np.uint8)
    out = run_padded_graph(session, images, edge)
    assert all(np.isfinite(v).all() for v in out.values())
    assert np.allclose(out["probs"].sum(1), 1.0, atol=1e-3)


def test_classifier_runs_the_reduced_precision_graphs(digits_all: Bundle) -> None:
    from vitdeploy.runtime.classifier import Classifier

    crops = _digit_crops([(24, 48), (48, 24), (32, 32), (40, 28), (48, 48), (16, 44)])
    top1 = {}
    for precision in ("fp32", "fp16", "int8"):
        clf = Classifier.load(digits_all, precision=precision, threads=1)
        assert clf.describe()["precision"] == precision
        top1[precision] = [t[0].label for t in clf.classify(crops, top_k=1)]
    assert top1["fp16"] == top1["fp32"]
    assert sum(a == b for a, b in zip(top1["int8"], top1["fp32"])) >= 5


def test_check_scores_fp32_fp16_and_int8(digits_all: Bundle, tmp_path) -> None:
    root = tmp_path / "b"
    shutil.copytree(digits_all.root, root)
    result = CliRunner().invoke(main, ["check", str(root), "--limit", "120", "--threads", "1"])
    assert result.exit_code == 0, result.output
    report = json.loads((root / "reports" / "check.json").read_text())
    assert report["kind"] == "variable-size" and report["passed"]
    rows = {(a["precision"], a["execution"]): a for a in report["artifacts"]}
    assert {p for p, _ in rows} == {"fp32", "fp16", "int8"} and len(rows) == 4  # int8 in both executions
    for (precision, _), entry in rows.items():
        assert entry["edge"]["nonfinite"] == 0
        if not entry["gated"]:
            continue
        assert entry["passed"], entry["failed_gates"]
        gates = {g["name"] for g in entry["gates"]}
        if precision == "fp32":
            assert {"max |dlogits| on task (rows vs alone)", "max |dprobs| on task (rows vs alone)"} <= gates
        else:
            assert {"logits cosine (1st percentile of rows) on task", "probs cosine (1st percentile of rows) on task"} <= gates
            assert entry["placement"]["mask_path"]["mask_path_nodes"] > 0 and not entry["placement"]["violations"]
    assert "fp16 / onnxruntime" in result.output and "int8 / reference (fake-quant)" in result.output
    task = report["task"]  # the fp32 graph's mixed-size task check
    assert task["distinct_sizes"] >= 5 and task["top1_agreement"] == 1.0 and task["max_abs"] <= 1e-4
    assert task["accuracy"] >= 0.9  # aspect ratios up to 3:1 on 8x8-pixel digits (99.7% at the native size)


# -- GAP: the masked mean ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def gap_bundle(tmp_path_factory) -> Bundle:
    """A tiny random reference ViT with a GAP read-out, exported with --variable-size --precision fp32,fp16."""
    import torch
    from safetensors.torch import save_file

    from vitdeploy.exporters import ExportOptions, export
    from vitdeploy.model import VisionTransformer
    from vitdeploy.spec import ViTSpec

    spec = ViTSpec(image_size=(32, 32), patch_size=(8, 8), embed_dim=32, depth=2, num_heads=2, num_classes=10,
                   class_token=False, global_pool="avg", pos_embed_prefix_rows=0)
    work = tmp_path_factory.mktemp("vargap")
    torch.manual_seed(0)
    model = VisionTransformer(spec)
    for param in model.parameters():
        torch.nn.init.normal_(param, std=0.05)
    with torch.no_grad():
        model.pos_embed.mul_(20.0)  # so that position (and so each image's own grid) moves the logits
        model.head.weight.normal_(0, 0.5)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(work / "gap.safetensors"))
    (work / "gap.json").write_text(json.dumps({"spec": spec.to_dict(), "labels": [str(i) for i in range(10)],
                                               "preprocessing": {"mean": [0.5] * 3, "std": [0.5] * 3, "scale": "1/255"}}))
    return export(f"ref:{work / 'gap.safetensors'}", work / "bundle",
                  ExportOptions(variable_size=True, canvas=CANVAS, precisions=("fp32", "fp16")))


def test_gap_masked_mean_stays_fp32_and_rows_equal_each_image_alone(gap_bundle: Bundle) -> None:
    from vitdeploy.compare import compare_outputs
    from vitdeploy.runtime.ort import OrtRunner

    fp16 = onnx.load(str(gap_bundle.artifact_path("fp16")))
    path = find_mask_path(fp16)
    assert path.reductions, "the masked sum of the GAP read-out is found"
    types = _float_types(fp16)
    by_name = {n.name: n for n in fp16.graph.node}
    for name in path.reductions + path.joins:
        node = by_name[name]
        assert all(types.get(t) != onnx.TensorProto.FLOAT16 for t in list(node.input) + list(node.output) if t), name
    rng = np.random.default_rng(4)
    sizes = [(8, 8), (48, 48), (16, 48), (48, 8), (32, 32), (24, 40)]
    crops = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    ref = _alone_in_pytorch(gap_bundle, crops)
    assert np.ptp(ref["logits"], axis=0).max() > 1e-1  # the sizes really give different answers
    batch, valid = pad_to_canvas(crops, CANVAS, fill=200)
    got = run_padded_graph(OrtRunner(gap_bundle.artifact_path("fp16"), precision="fp16", threads=1).session, batch, valid)
    for name in ("logits", "probs"):
        assert compare_outputs(name, ref[name], got[name]).cosine_p1 >= COSINE_MIN, name
    assert gap_bundle.artifact_record("fp16")["sanity"]["gate"]["passed"]


def test_gap_int8_from_an_npz_keeps_qdq_off_the_mask_path(gap_bundle: Bundle, tmp_path) -> None:
    from vitdeploy.calibration import api

    root = tmp_path / "gap"
    shutil.copytree(gap_bundle.root, root)
    data = tmp_path / "calib.npz"
    np.savez(data, images=np.random.default_rng(5).integers(0, 256, (32, 40, 24, 3), dtype=np.uint8))  # any size
    record = api.calibrate_bundle(root, api.CalibrateOptions(data=str(data), samples=32, method="minmax", threads=1))
    assert record["calibration"]["variable_size"]["distinct_sizes"] >= 5 and record["evaluation"] is None
    int8 = onnx.load(str(root / "model.int8.onnx"))
    assert qdq_on_mask_path(int8) == [] and record["placement"]["quantized_layers"] > 0
    assert record["sanity"]["edge_finite"] and record["sanity"]["finite"]
    # The masked mean in int8: each row of a padded mixed batch equals the same image alone through the
    # same int8 graph, whatever the padding holds (random weights and noise images have no task to gate
    # the quantization error on; the digits tests gate that against PyTorch)
    from vitdeploy.runtime.ort import OrtRunner

    rng = np.random.default_rng(6)
    crops = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in [(8, 8), (48, 48), (16, 48), (48, 8), (32, 32), (24, 40)]]
    session = OrtRunner(root / "model.int8.onnx", precision="int8", optimization="basic", threads=1).session
    batch, valid = pad_to_canvas(crops, CANVAS, fill=200)
    mixed = run_padded_graph(session, batch, valid)["logits"]
    alone = np.concatenate([run_padded_graph(session, *pad_to_canvas([c], CANVAS, fill=0))["logits"] for c in crops])
    assert np.abs(mixed - alone).max() <= 1e-5
    assert np.ptp(alone, axis=0).max() > 1e-2  # the sizes really give different answers
