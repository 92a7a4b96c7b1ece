"""`vitdeploy evaluate` on a variable-size bundle (images in a canvas + valid_hw, issue 28): every
condition's images are fitted into the canvas by the bundle's policy and fed with their valid sizes,
and the numbers equal those of the per-image reference (PyTorch on each image alone at its own size),
recomputed here independently of the contract and the runners."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from vitdeploy.cli import main

pytestmark = pytest.mark.slow
LIMIT = 60


@pytest.fixture(scope="module")
def variable_bundle(export_cached):
    return export_cached("builtin:digits", variable_size=True, canvas=(48, 48))


def _alone_predictions(bundle, images: np.ndarray) -> np.ndarray:
    """Top-1 of PyTorch on each image alone: fitted by the manifest's policy, the model re-gridded to its size."""
    from vitdeploy.exporters.api import loaded_for_bundle
    from vitdeploy.exporters.regrid import regrid_static
    from vitdeploy.exporters.torch_runner import TorchRunner
    from vitdeploy.posembed import PosEmbedInterpolation
    from vitdeploy.variable import fit_image

    pre = bundle.preprocessing
    rule = PosEmbedInterpolation.from_dict({k: v for k, v in bundle.resolution["pos_embed_interpolation"].items() if k != "description"})
    loaded = loaded_for_bundle(bundle, resolution=tuple(bundle.spec.image_size))
    out = []
    for image in images:
        fitted = fit_image(image, pre, pre["variable_size"]["host_policy"])
        model = regrid_static(loaded, fitted.shape[0], fitted.shape[1], rule)
        out.append(int(TorchRunner(model, pre).infer(fitted[None])["logits"].argmax()))
    return np.array(out)


def _jpeg(images: np.ndarray, quality: int) -> np.ndarray:
    out = []
    for img in images:
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=quality)
        out.append(np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB")))
    return np.stack(out)


def test_evaluate_scores_the_canvas_graph_like_the_per_image_reference(variable_bundle, tmp_path):
    import onnxruntime as ort

    from vitdeploy.builtin.digits import load_digits_split
    from vitdeploy.data import subset_indices
    from vitdeploy.variable import fit_image, pad_to_canvas

    result = CliRunner().invoke(main, ["evaluate", str(variable_bundle.root), "--suite", "jpeg", "--severity", "jpeg=30", "--limit", str(LIMIT),
                                       "--threads", "1", "--resolutions", "24x40", "--no-plot", "-o", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [s["id"] for s in report["scorers"]] == ["onnx fp32", "pytorch fp32"]
    assert "each image alone at its own size" in report["scorers"][1]["execution"]
    assert report["bundle"]["input"]["kind"] == "canvas" and report["bundle"]["input"]["inputs"] == ["images", "valid_hw"]
    assert report["data"]["count"] == LIMIT

    images, labels = load_digits_split("test")
    index = subset_indices(len(images), LIMIT)
    images, labels = images[index], labels[index]
    session = ort.InferenceSession(str(variable_bundle.artifact_path("fp32")), providers=["CPUExecutionProvider"])
    policy = variable_bundle.preprocessing["variable_size"]["host_policy"]
    for condition, pixels in (("clean", images), ("jpeg@30", _jpeg(images, 30))):
        alone = _alone_predictions(variable_bundle, pixels)
        correct = int((alone == labels).sum())
        for scorer in ("onnx fp32", "pytorch fp32"):
            got = report["results"][scorer][condition]
            assert got["correct"] == correct and got["accuracy"] == correct / LIMIT, (scorer, condition)
        assert report["results"]["onnx fp32"][condition]["agreement"] == 1.0
        batch, valid = pad_to_canvas([fit_image(p, variable_bundle.preprocessing, policy) for p in pixels], (48, 48))
        graph = session.run(["logits"], {"images": batch, "valid_hw": valid})[0].argmax(-1)
        np.testing.assert_array_equal(graph, alone)  # the graph on one padded batch, by hand, gives the same answers
    # other sizes are placed in the canvas as they are (policy none): one row per scorer
    rows = report["resolution"]["rows"]
    assert {(r["runner"], r["height"], r["width"]) for r in rows} == {("onnx fp32", 24, 40), ("pytorch fp32", 24, 40)}
    assert rows[0]["correct"] == rows[1]["correct"] and "placed as they are in the canvas" in report["resolution"]["rule"]


def test_evaluate_refuses_sizes_the_canvas_cannot_hold_in_one_line(variable_bundle):
    for size, message in (("64", "larger than the 48x48 canvas"), ("30", "not a multiple of the patch size")):
        result = CliRunner().invoke(main, ["evaluate", str(variable_bundle.root), "--suite", "none", "--resolutions", size,
                                           "--no-reference", "--limit", "8"])
        assert result.exit_code == 1 and "Traceback" not in result.output and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


def test_occlusion_maps_of_a_variable_size_bundle(variable_bundle, tmp_path):
    result = CliRunner().invoke(main, ["evaluate", str(variable_bundle.root), "--occlusion-map", "digits:test", "--limit", "4",
                                       "--occlusion-patch", "8", "--occlusion-stride", "8", "-o", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    maps = np.load(tmp_path / "occlusion.npy")
    assert maps.shape == (4, 32, 32) and np.isfinite(maps).all() and report["count"] == 4
    assert all(0.0 <= e["clean_prob"] <= 1.0 for e in report["images"])
