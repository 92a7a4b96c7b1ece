"""Export options of the graph contract: in-graph resize, BGR input, float NCHW input, fp16 at export."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F

from vitdeploy.builtin import get_builtin
from vitdeploy.preprocess import random_images
from vitdeploy.runtime.ort import OrtRunner


def _reference(images: np.ndarray, size=None) -> np.ndarray:
    entry = get_builtin("digits")
    pre = entry.load_config()["preprocessing"]
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float()
    if size is not None:
        x = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=False)
    mean = torch.tensor(pre["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(pre["std"]).view(1, 3, 1, 1)
    with torch.no_grad():
        return entry.load_model()((x / 255.0 - mean) / std).numpy()


@pytest.mark.slow
def test_in_graph_resize_takes_any_camera_size(export_cached):
    bundle = export_cached("builtin:digits", resize=True)
    assert bundle.preprocessing["in_graph_resize"] == {"method": "bilinear", "antialias": False, "align_corners": False, "to": [32, 32]}
    assert bundle.preprocessing["input_size"] is None
    assert bundle.manifest["records"]["export_check"]["passed"]
    runner = OrtRunner(bundle.artifact_path("fp32"))
    for h, w in ((48, 40), (31, 77), (32, 32)):
        frames = random_images(8, h, w, seed=h)
        got = runner.infer(frames)["logits"]
        assert np.abs(got - _reference(frames, (32, 32))).max() <= 1e-3  # uint8 bilinear resize: rounding differs slightly
    ops = {n.op_type for n in onnx.load(str(bundle.artifact_path("fp32"))).graph.node}
    assert "Resize" in ops


@pytest.mark.slow
def test_bgr_input_reads_opencv_frames(export_cached):
    rgb = export_cached("builtin:digits")
    bgr = export_cached("builtin:digits", channel_order="bgr")
    frames = random_images(8, 32, 32, seed=3)
    out_rgb = OrtRunner(rgb.artifact_path("fp32")).infer(frames)["logits"]
    out_bgr = OrtRunner(bgr.artifact_path("fp32")).infer(np.ascontiguousarray(frames[..., ::-1]))["logits"]
    assert np.abs(out_rgb - out_bgr).max() <= 1e-5
    assert bgr.preprocessing["channel_order"] == "bgr"


@pytest.mark.slow
def test_float_nchw_input_for_pipelines_that_preprocess(export_cached):
    bundle = export_cached("builtin:digits", input_format="float-nchw")
    model = onnx.load(str(bundle.artifact_path("fp32")))
    value = model.graph.input[0]
    assert value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert [d.dim_value for d in value.type.tensor_type.shape.dim][1:] == [3, 32, 32]
    x = np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32)
    entry = get_builtin("digits")
    with torch.no_grad():
        ref = entry.load_model()(torch.from_numpy(x)).numpy()
    assert np.abs(OrtRunner(bundle.artifact_path("fp32")).infer(x)["logits"] - ref).max() <= 1e-4


@pytest.mark.slow
def test_fp16_at_export_time(export_cached):
    bundle = export_cached("builtin:digits", precisions=("fp32", "fp16"))
    assert bundle.precisions() == ["fp32", "fp16"]
    frames = random_images(8, 32, 32, seed=5)
    fp32 = OrtRunner(bundle.artifact_path("fp32")).infer(frames)["logits"]
    fp16 = OrtRunner(bundle.artifact_path("fp16")).infer(frames)
    assert fp16["logits"].dtype == np.float32 and fp16["probs"].dtype == np.float32  # outputs stay fp32
    assert np.abs(fp16["logits"] - fp32).max() < 5e-2
    assert (fp16["logits"].argmax(1) == fp32.argmax(1)).all()


def test_conflicting_options_are_refused(tmp_path):
    from click.testing import CliRunner

    from vitdeploy.cli import main

    result = CliRunner().invoke(main, ["export", "-o", str(tmp_path / "b"), "--resize", "--dynamic-resolution"])
    assert result.exit_code == 2 and "exclude each other" in result.output  # usage
    result = CliRunner().invoke(main, ["export", "-o", str(tmp_path / "c"), "--precision", "int8"])
    assert result.exit_code == 2 and "vitdeploy calibrate" in result.output
