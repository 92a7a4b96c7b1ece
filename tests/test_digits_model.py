"""The bundled digits model: the SHIPPED weights (no retraining) and the data rule they were trained on."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vitdeploy.builtin import BUILTIN_MODELS, digits, get_builtin
from vitdeploy.errors import UserError
from vitdeploy.fileio import sha256_file
from vitdeploy.spec import ViTSpec

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")
safetensors_torch = pytest.importorskip("safetensors.torch")

from vitdeploy.preprocess import normalise  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def evaluate(model, images_u8, labels, preprocessing) -> int:
    x = torch.from_numpy(normalise(images_u8, preprocessing))
    with torch.no_grad():
        predictions = torch.cat([model(x[i : i + 128]).argmax(-1) for i in range(0, len(x), 128)])
    return int((predictions.numpy() == labels).sum())


def test_shipped_weights_reach_97_percent_on_the_test_split():
    config = digits.load_digits_config()
    model = digits.load_digits_model()
    assert not model.training
    images, labels = digits.load_digits_split("test")
    correct = evaluate(model, images, labels, config["preprocessing"])
    accuracy = correct / len(labels)
    assert accuracy >= 0.97, f"shipped digits model: test accuracy {accuracy:.4f} < 0.97"
    # the recorded number is the number these weights give (one image of slack for thread-order rounding)
    assert abs(correct - config["training"]["test_correct"]) <= 1
    assert config["training"]["test_accuracy"] == pytest.approx(config["training"]["test_correct"] / len(labels))


def test_config_matches_the_weights():
    config = digits.load_digits_config()
    spec = ViTSpec.from_dict(config["spec"])
    weights_path = digits.HERE / digits.WEIGHTS_FILE
    assert weights_path.stat().st_size < 2 * 1024 * 1024
    assert config["weights"]["sha256"] == sha256_file(weights_path)
    tensors = safetensors_torch.load_file(str(weights_path))
    from vitdeploy.model import VisionTransformer

    expected = {k: tuple(v.shape) for k, v in VisionTransformer(spec).state_dict().items()}
    assert {k: tuple(v.shape) for k, v in tensors.items()} == expected
    assert tensors["pos_embed"].shape == (1, 1 + spec.num_patches(), spec.embed_dim)
    assert tensors["head.weight"].shape == (len(config["labels"]), spec.embed_dim)
    assert all(v.dtype == torch.float32 for v in tensors.values())


def test_config_records_the_preprocessing_contract():
    config = digits.load_digits_config()
    spec = ViTSpec.from_dict(config["spec"])
    pre = config["preprocessing"]
    assert spec.image_size == (32, 32) and spec.patch_size == (4, 4) and spec.native_grid == (8, 8)
    assert pre["scale"] == "1/255" and pre["channel_order"] == "rgb"
    assert pre["input_size"] == [32, 32]
    assert pre["host_resize"] == {"mode": "stretch", "interpolation": "bilinear"}
    assert len(pre["mean"]) == len(pre["std"]) == spec.in_chans == 3
    # mean/std are those of the training split, measured, not ImageNet's or hard-coded
    train, _ = digits.load_digits_split("train")
    unit = train.reshape(-1, 3) / 255.0
    np.testing.assert_allclose(pre["mean"], unit.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(pre["std"], unit.std(axis=0), rtol=1e-6)
    assert config["labels"] == [str(k) for k in range(10)]
    record = config["training"]
    for key in ("seed", "split", "epochs", "test_accuracy", "command"):
        assert key in record
    assert record["split"]["random_state"] == 0 and record["split"]["stratify"] == "target"


def test_split_is_fixed_stratified_80_20():
    train_x, train_y = digits.load_digits_split("train")
    test_x, test_y = digits.load_digits_split("test")
    assert train_x.shape == (1437, 32, 32, 3) and test_x.shape == (360, 32, 32, 3)
    assert train_x.dtype == np.uint8 and train_y.dtype == np.int64
    assert set(np.bincount(test_y)) <= {35, 36, 37}  # ~10% of each class: stratified
    # replicated gray: the three channels are identical
    assert np.array_equal(test_x[..., 0], test_x[..., 2])
    with pytest.raises(UserError, match="unknown digits split"):
        digits.load_digits_split("val")


def test_image_rule_is_centre_aligned_bilinear_rounded_half_up():
    source = np.array([[[0, 16, 8, 4, 0, 2, 16, 1]] * 8], dtype=np.float64)
    rgb = digits.digits_to_rgb32(source)
    reference = torch.nn.functional.interpolate(
        torch.from_numpy(source * 255 / 16)[:, None], size=(32, 32), mode="bilinear", align_corners=False
    )[:, 0].numpy()
    np.testing.assert_array_equal(rgb[..., 1], np.floor(reference + 0.5).astype(np.uint8))
    assert rgb.shape == (1, 32, 32, 3)
    # weights sum to one and edges clamp: a full-ink image stays 255 everywhere, a blank one 0
    assert np.all(digits.digits_to_rgb32(np.full((1, 8, 8), 16)) == 255)
    assert np.all(digits.digits_to_rgb32(np.zeros((1, 64))) == 0)
    with pytest.raises(UserError, match="0..16"):
        digits.digits_to_rgb32(source + 1)


def test_registry_and_cheap_import():
    assert get_builtin("digits") is BUILTIN_MODELS["digits"]
    with pytest.raises(UserError, match="available: digits"):
        get_builtin("mnist")
    code = "import sys, vitdeploy.builtin; assert 'torch' not in sys.modules and 'sklearn' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.slow
def test_training_script_smoke_writes_a_loadable_model(tmp_path):
    cmd = [
        sys.executable, str(REPO / "scripts" / "train_digits.py"), "--epochs", "1", "--limit", "96",
        "--depth", "1", "--embed-dim", "16", "--heads", "2", "--out", str(tmp_path),
    ]
    subprocess.run(cmd, check=True, cwd=REPO, capture_output=True, timeout=120)
    config = digits.load_digits_config(tmp_path)
    assert config["training"]["epochs"] == 1 and config["training"]["limit"] == 96
    assert config["spec"]["depth"] == 1
    model = digits.load_digits_model(tmp_path)
    images, labels = digits.load_digits_split("test")
    assert 0 <= evaluate(model, images[:32], labels[:32], config["preprocessing"]) <= 32
