"""Variable-size input (issue #13): pad + valid mask in the deployed graph, mixed sizes in one batch.

The acceptance is the invariance: each row of a padded mixed-size batch equals that image run alone
through a graph exported at its own size. Checked on the trained digits ViT (sizes 24-48 in a 48
canvas) against ONNX graphs exported per size, and on timm CLS and GAP ViTs (160-384 in a 384
canvas) whose position tables are scaled up so that position really moves the logits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vitdeploy.errors import UserError
from vitdeploy.posembed import PosEmbedInterpolation, resample_pos_embed, resample_pos_grid_per_sample
from vitdeploy.variable import check_sizes_for_canvas, fitted_size, pad_to_canvas

pytestmark = pytest.mark.slow


# -- the per-sample position grid (pure) -------------------------------------------------------
@pytest.mark.parametrize("method", ["bicubic", "bilinear"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_per_sample_grid_equals_resampling_each_grid_alone(method, align_corners):
    torch.manual_seed(0)
    rule = PosEmbedInterpolation(method, align_corners, False)
    table = torch.randn(1, 1 + 14 * 14, 16)
    grids = [(10, 24), (24, 24), (14, 14), (1, 7), (5, 1), (20, 9)]
    out = resample_pos_grid_per_sample(table, (14, 14), 1, torch.tensor(grids, dtype=torch.int32), (24, 24), rule)
    assert out.shape == (len(grids), 24 * 24, 16)
    for row, (h, w) in enumerate(grids):
        alone = resample_pos_embed(table, (h, w), (14, 14), 1, method, align_corners, False)[0, 1:].reshape(h, w, 16)
        laid = out[row].reshape(24, 24, 16)[:h, :w]
        assert torch.allclose(laid, alone, atol=2e-5), (h, w)


def test_antialiased_rule_has_no_per_sample_form():
    with pytest.raises(Exception, match="antialias"):
        resample_pos_grid_per_sample(torch.zeros(1, 5, 4), (2, 2), 1, torch.tensor([[2, 2]]), (4, 4), PosEmbedInterpolation("bicubic", False, True))


# -- the host policy and guards (pure) ----------------------------------------------------------
def test_fit_within_keeps_aspect_and_rounds_to_whole_patches():
    assert fitted_size((100, 50), (48, 48), (4, 4), "fit-within") == (48, 24)
    assert fitted_size((10, 30), (48, 48), (4, 4), "fit-within") == (16, 48)  # enlarged to the canvas width
    assert fitted_size((10, 30), (48, 48), (4, 4), "shrink-within") == (8, 28)  # never enlarged; floored to patches
    assert fitted_size((1, 300), (384, 384), (16, 16), "fit-within") == (16, 384)  # at least one patch
    h, w = fitted_size((480, 640), (384, 384), (16, 16), "fit-within")
    assert (h % 16, w % 16) == (0, 0) and w == 384 and abs(h / w - 480 / 640) < 16 / 384


@pytest.mark.parametrize(("valid", "message"), [
    ([[0, 8]], "at least one"),
    ([[52, 8]], "larger than the 48x48 canvas"),
    ([[10, 8]], "not whole 4x4 patches"),
    ([[8.0, 8.0]], "integers"),
])
def test_bad_valid_hw_is_refused_in_one_line(valid, message):
    with pytest.raises(UserError, match=message) as info:
        check_sizes_for_canvas(np.array(valid), (48, 48), (4, 4))
    assert "\n" not in str(info.value)


def test_image_larger_than_canvas_is_refused():
    with pytest.raises(UserError, match="larger than the 48x48 canvas"):
        pad_to_canvas([np.zeros((52, 8, 3), np.uint8)], (48, 48))


# -- the digits ViT: invariance against graphs exported per size --------------------------------
@pytest.fixture(scope="module")
def digits_variable(export_cached):
    return export_cached("builtin:digits", variable_size=True, canvas=(48, 48))


def _digit_crops(sizes: list[tuple[int, int]]) -> list[np.ndarray]:
    from PIL import Image

    from vitdeploy.builtin.digits import load_digits_split

    images, _ = load_digits_split("test")
    return [np.asarray(Image.fromarray(images[i]).resize((w, h), Image.BILINEAR)) for i, (h, w) in enumerate(sizes)]


def test_digits_padded_rows_equal_each_image_alone_at_its_own_size(digits_variable, export_cached):
    from vitdeploy.runtime.ort import OrtRunner

    record = digits_variable.manifest["records"]["export_check"]
    assert record["passed"] and record["max_abs"] <= 1e-4 and len(record["sizes"]) >= 6
    sizes = [(24, 48), (48, 24), (40, 28), (32, 32), (48, 48), (24, 24)]
    crops = _digit_crops(sizes)
    batch, valid = pad_to_canvas(crops, (48, 48), fill=255)  # padding that would change a digit if it leaked
    session = OrtRunner(digits_variable.artifact_path("fp32"), threads=1).session
    padded = session.run(["logits"], {"images": batch, "valid_hw": valid})[0]
    for (h, w), crop, row in zip(sizes[:3], crops, padded):  # three sizes with a graph of their own
        alone = export_cached("builtin:digits", resolution=(h, w), check=False)
        own = OrtRunner(alone.artifact_path("fp32"), threads=1).infer(crop[None])["logits"][0]
        assert np.abs(row - own).max() <= 1e-4, (h, w)
    # Without the per-image grids and the mask (every row told it fills the canvas) the answer changes:
    # the test can tell a graph that ignores valid_hw from one that honours it.
    full = np.full_like(valid, 48)
    ignored = session.run(["logits"], {"images": batch, "valid_hw": full})[0]
    assert np.abs(ignored[:4] - padded[:4]).max() > 1e-2


def test_digits_no_input_makes_nan(digits_variable):
    from vitdeploy.runtime.ort import OrtRunner

    session = OrtRunner(digits_variable.artifact_path("fp32"), threads=1).session
    batch = np.random.default_rng(0).integers(0, 256, (4, 48, 48, 3), dtype=np.uint8)
    for valid in ([[0, 0]] * 4, [[-5, 3], [1000, 1000], [1, 1], [2**31 - 1, -(2**31)]]):
        out = session.run(None, {"images": batch, "valid_hw": np.array(valid, dtype=np.int32)})
        assert all(np.isfinite(o).all() for o in out)


def test_classifier_takes_mixed_sizes_in_one_batch(digits_variable, tmp_path):
    from PIL import Image

    from vitdeploy.builtin.digits import load_digits_split
    from vitdeploy.runtime.classifier import Classifier

    images, labels = load_digits_split("test")
    rng = np.random.default_rng(3)
    mixed = [np.asarray(Image.fromarray(img).resize((int(rng.integers(12, 60)), int(rng.integers(12, 60))), Image.BILINEAR))
             for img in images[:60]]
    clf = Classifier.load(digits_variable, threads=1)
    assert clf.describe()["policy"] == "fit-within"
    top1 = [t[0].label for t in clf.classify(mixed, top_k=1)]
    accuracy = np.mean([int(p) == y for p, y in zip(top1, labels[:60])])
    assert accuracy >= 0.9  # aspect distortions of up to 5:1 on 8x8-pixel digits; native-size accuracy is 99.7%
    with pytest.raises(UserError, match="at least one"):
        clf.run_padded(np.zeros((1, 48, 48, 3), np.uint8), np.zeros((1, 2), np.int32))
    path = tmp_path / "wide.png"
    Image.fromarray(mixed[0]).save(path)
    assert clf.classify([str(path)], top_k=1)[0][0].label == top1[0]


def test_variable_size_refuses_clashing_options(export_cached):
    with pytest.raises(UserError, match="excludes --dynamic-resolution"):
        export_cached("builtin:digits", variable_size=True, canvas=(48, 48), dynamic_resolution=True)
    with pytest.raises(UserError, match="needs --canvas"):
        export_cached("builtin:digits", variable_size=True)


# -- timm CLS and GAP ViTs at 160-384 in a 384 canvas -------------------------------------------
@pytest.fixture(scope="module")
def timm_checkpoints(tmp_path_factory):
    """Two-block ViT-Ti checkpoints (CLS; GAP without class token) with position tables scaled so
    that position moves the logits: random-init tables (std 0.02) barely do."""
    import timm
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("var_ckpt")
    out = {}
    for name, kwargs in {"cls": {"depth": 2}, "gap": {"depth": 2, "class_token": False, "global_pool": "avg"}}.items():
        torch.manual_seed(1)
        model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, **kwargs)
        with torch.no_grad():
            model.pos_embed.mul_(50.0)
            model.head.weight.normal_(0, 0.5)
        path = root / f"{name}.safetensors"
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
        out[name] = (str(path), kwargs)
    return out


@pytest.mark.parametrize("kind", ["cls", "gap"])
def test_timm_padded_rows_equal_each_image_alone(kind, timm_checkpoints, export_cached):
    from vitdeploy.exporters.regrid import regrid_static
    from vitdeploy.exporters.sources import load_source
    from vitdeploy.exporters.torch_runner import TorchRunner
    from vitdeploy.posembed import PosEmbedInterpolation
    from vitdeploy.runtime.ort import OrtRunner

    checkpoint, kwargs = timm_checkpoints[kind]
    bundle = export_cached("timm:vit_tiny_patch16_224", checkpoint=checkpoint, model_kwargs=kwargs, variable_size=True, canvas=(384, 384))
    assert bundle.manifest["records"]["export_check"]["passed"]
    sizes = [(160, 384), (384, 160), (224, 224), (256, 320)]
    rng = np.random.default_rng(5)
    crops = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    batch, valid = pad_to_canvas(crops, (384, 384), fill=128)
    padded = OrtRunner(bundle.artifact_path("fp32"), threads=1).session.run(["logits"], {"images": batch, "valid_hw": valid})[0]
    loaded = load_source("timm:vit_tiny_patch16_224", checkpoint, model_kwargs=kwargs)
    spread = []
    for (h, w), crop, row in zip(sizes, crops, padded):
        alone = TorchRunner(regrid_static(loaded, h, w, PosEmbedInterpolation()), bundle.preprocessing).infer(crop[None])["logits"][0]
        assert np.abs(row - alone).max() <= 1e-4, (h, w)
        spread.append(alone)
    assert np.ptp(np.stack(spread), axis=0).max() > 1e-2  # the sizes really give different answers


# -- the rest of the toolchain on a variable-size bundle ----------------------------------------
def test_triton_config_declares_both_inputs(digits_variable, tmp_path):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from vitdeploy.triton import write_triton_repo

    model_dir = write_triton_repo(digits_variable, tmp_path / "repo")
    config = model_config_pb2.ModelConfig()
    text_format.Parse((model_dir / "config.pbtxt").read_text(), config)
    declared = [(i.name, model_config_pb2.DataType.Name(i.data_type), list(i.dims)) for i in config.input]
    assert declared == [("images", "TYPE_UINT8", [48, 48, 3]), ("valid_hw", "TYPE_INT32", [2])]


# build-engine and profile take variable-size bundles: tests/test_variable_engine_profile.py; fp16/int8: test_variable_precision.py


def test_canvas_without_variable_size_is_refused(export_cached):
    with pytest.raises(UserError, match="add --variable-size"):
        export_cached("builtin:digits", canvas=(48, 48))
