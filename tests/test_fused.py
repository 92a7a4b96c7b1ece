"""The fused CPU graph (issue 15): `convert --target cpu` writes model.cpu.onnx with ORT's Attention op
in place of every attention block, gated against the plain graph; the runtime and `profile` use it on
CPUs; the plain graph (TensorRT's) is untouched; a wrong fusion is refused, not written."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from vitdeploy.bundle import Bundle
from vitdeploy.cli import main
from vitdeploy.errors import CheckFailed
from vitdeploy.preprocess import random_images
from vitdeploy.exporters import cpu_fused as fused_mod
from vitdeploy.runtime import fused as fused_reader
from vitdeploy.runtime.ort import OrtRunner

pytestmark = pytest.mark.slow


def _convert(path) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["convert", str(path), "--target", "cpu"])
    return res.exit_code, res.output


def test_convert_target_cpu_fuses_every_block_and_is_used_on_cpus(digits_bundle, copy_bundle):
    path = copy_bundle(digits_bundle)
    plain_before = (path / "model.onnx").read_bytes()
    code, out = _convert(path)
    assert code == 0, out
    assert "fused 4 of 4 attention blocks" in out and "passed" in out
    bundle = Bundle.open(path)
    record = bundle.artifact_record("cpu")
    assert record["file"] == "model.cpu.onnx" and record["derived_from"] == bundle.artifact_record("fp32")["sha256"]
    assert record["gate"]["passed"] and record["fusion"]["attention_fused"] == 4
    assert bundle.precisions() == ["fp32"], "the CPU graph is not a precision"
    assert (path / "model.onnx").read_bytes() == plain_before, "the plain (TensorRT) graph is untouched"

    ops = Counter((n.domain, n.op_type) for n in onnx.load(str(path / "model.cpu.onnx")).graph.node)
    assert ops[("com.microsoft", "Attention")] == 4 and ops[("", "Softmax")] == 1  # only probs' softmax is left

    from vitdeploy.runtime.classifier import Classifier

    with Classifier.load(path, prefer=["onnxruntime"], providers=["CPUExecutionProvider"]) as clf:
        assert clf.describe()["backend_reason"].endswith("model.cpu.onnx")
        images = random_images(6, 32, 32, seed=5)
        probs = clf.probabilities(images)
    plain = OrtRunner(path / "model.onnx", providers=["CPUExecutionProvider"]).infer(images)["probs"]
    assert np.abs(probs - plain).max() <= 1e-5

    res = CliRunner().invoke(main, ["profile", str(path), "--iterations", "10", "--warmup", "1", "--no-plot", "--json",
                                    "--device", "cpu", "-o", str(path / "prof")])
    assert res.exit_code == 0, res.output
    cells = json.loads(res.output[res.output.index("{"):])["cells"]
    assert [c["graph"] for c in cells if c["backend"] == "ort"] == ["model.cpu.onnx"]
    res = CliRunner().invoke(main, ["profile", str(path), "--iterations", "10", "--warmup", "1", "--no-plot", "--json",
                                    "--device", "cpu", "--plain-graph", "-o", str(path / "prof2")])
    assert [c["graph"] for c in json.loads(res.output[res.output.index("{"):])["cells"]] == ["model.onnx"]


def test_a_wrong_fusion_is_refused_and_nothing_is_written(digits_bundle, copy_bundle, monkeypatch):
    path = copy_bundle(digits_bundle)
    real = fused_mod.fuse_attention

    def wrong_scale(model, num_heads, embed_dim):
        count = real(model, num_heads, embed_dim)
        for node in model.graph.node:
            if node.op_type == "Attention":
                for attr in node.attribute:
                    if attr.name == "scale":
                        attr.f *= 2.0  # softmax temperature off by 2: a plausible, silent bug
        return count

    monkeypatch.setattr(fused_mod, "fuse_attention", wrong_scale)
    with pytest.raises(CheckFailed, match="does not match the plain graph"):
        fused_mod.add_cpu_graph_to_bundle(Bundle.open(path))
    assert not (path / "model.cpu.onnx").exists() and "cpu" not in Bundle.open(path).manifest.get("artifacts", {})


def test_stale_or_failed_cpu_graph_is_not_used(digits_bundle, copy_bundle):
    path = copy_bundle(digits_bundle)
    assert _convert(path)[0] == 0
    bundle = Bundle.open(path)
    assert fused_reader.cpu_graph_for(bundle) == path / "model.cpu.onnx"
    bundle.manifest["artifacts"]["cpu"]["derived_from"] = "0" * 64  # made from another fp32 graph
    assert fused_reader.cpu_graph_for(bundle) is None


def test_dynamic_timm_graph_with_sdpa_and_folded_biases_fuses(export_cached, tmp_path, copy_bundle):
    """timm's SDPA export (k scaled and reshaped, shapes computed at run time, zero qkv bias folded
    away by onnxslim) fuses too, and stays equal at sizes other than the traced one."""
    bundle = export_cached("timm:vit_tiny_patch16_224", model_kwargs={"depth": 2}, dynamic_resolution=True, check_images=2, random_init=True)
    path = copy_bundle(bundle)
    code, out = _convert(path)
    assert code == 0, out
    assert "fused 2 of 2 attention blocks" in out
    gate = Bundle.open(path).artifact_record("cpu")["gate"]
    assert {row["set"] for row in gate["sets"]} == {"random 224x224", "random 160x160", "random 288x288", "random 224x320"}
    plain = OrtRunner(path / "model.onnx", providers=["CPUExecutionProvider"])
    fused = OrtRunner(path / "model.cpu.onnx", providers=["CPUExecutionProvider"])
    images = random_images(2, 192, 256, seed=9)  # a size none of the gates used
    assert np.abs(plain.infer(images)["logits"] - fused.infer(images)["logits"]).max() <= 1e-4


def test_bare_onnx_and_unmatched_graphs_are_refused_in_one_line(digits_bundle, tmp_path):
    res = CliRunner().invoke(main, ["convert", str(digits_bundle.root / "model.onnx"), "--target", "cpu"])
    assert res.exit_code == 1 and res.output.count("\n") == 1 and "bundle folder" in res.output
    res = CliRunner().invoke(main, ["convert", str(digits_bundle.root)])
    assert res.exit_code == 2 and "give one of --precision fp16 or --target cpu" in res.output  # usage


def test_check_scores_the_fused_graph_against_pytorch_and_reexport_keeps_it(digits_bundle, copy_bundle):
    """`check` gates model.cpu.onnx like the fp32 graph (it is what the CPU runtime runs), and a
    re-export that writes the same fp32 graph keeps it (a changed graph drops it)."""
    from vitdeploy.checks.run import CheckOptions, run_check

    path = copy_bundle(digits_bundle)
    assert _convert(path)[0] == 0
    report = run_check(path, CheckOptions(random_count=8, limit=64, write_report=False))
    fused = [a for a in report["artifacts"] if a["precision"] == "cpu"]
    assert len(fused) == 1 and fused[0]["gated"] and fused[0]["passed"], fused
    assert fused[0]["file"] == "model.cpu.onnx" and fused[0]["execution"] == "onnxruntime (fused attention)"
    real = next(row for row in fused[0]["sets"] if row.get("accuracy") is not None)
    assert real["accuracy"] == report["reference"]["accuracy"][real["set"]]  # same top-1 as PyTorch on real digits
    assert report["passed"], report["failures"]

    res = CliRunner().invoke(main, ["export", "builtin:digits", "-o", str(path), "--check-images", "4"])
    assert res.exit_code == 0, res.output
    assert Bundle.open(path).artifact_record("cpu")["file"] == "model.cpu.onnx" and (path / "model.cpu.onnx").is_file()
    res = CliRunner().invoke(main, ["export", "builtin:digits", "-o", str(path), "--resolution", "40", "--check-images", "4"])
    assert res.exit_code == 0, res.output
    assert "dropped" in res.output and "cpu" in res.output
    assert "cpu" not in Bundle.open(path).manifest.get("artifacts", {}) and not (path / "model.cpu.onnx").exists()
