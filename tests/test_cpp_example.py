"""examples/cpp: build the host library with CMake, run its unit tests (ctest), and check that the C++
side feeds the graph what the Python side feeds it and reads the same top-k from the same logits.

Needs the Debian packages of scripts/install_system_deps.sh (`make test` installs them). Built once
per session in a temporary folder, without TensorRT (the `classify` program is GPU-only).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from synthetic_bundle import LABELS, half_red, make_bundle
from vitdeploy.images import load_images
from vitdeploy.runtime.classifier import Classifier, softmax, top_k_of
from vitdeploy.runtime.ort import OrtRunner

ROOT = Path(__file__).resolve().parents[1]
CPP = ROOT / "examples" / "cpp"
DEPS = ROOT / "scripts" / "install_system_deps.sh"


def run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, **kw)


@pytest.fixture(scope="session")
def cpp_build(tmp_path_factory):
    check = run(["bash", DEPS, "--check"])
    if check.returncode != 0:
        pytest.fail(f"{check.stderr.strip()}; install them with: bash scripts/install_system_deps.sh")
    build = tmp_path_factory.mktemp("cpp-build")
    configure = run(["cmake", "-S", CPP, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DVITDEPLOY_TENSORRT=OFF"])
    assert configure.returncode == 0, configure.stdout + configure.stderr
    compiled = run(["cmake", "--build", build, "--parallel", str(min(4, os.cpu_count() or 1))])
    assert compiled.returncode == 0, compiled.stdout[-4000:] + compiled.stderr[-4000:]
    return build


@pytest.fixture(scope="module")
def prep(cpp_build):
    return cpp_build / "vitdeploy-prep"


def test_host_library_unit_tests(cpp_build):
    result = run(["ctest", "--output-on-failure"], cwd=cpp_build)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "100% tests passed" in result.stdout


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """PNG and JPEG files like a user's: smooth colour, grayscale, RGBA, and all eight EXIF orientations."""
    d = tmp_path_factory.mktemp("cpp-images")
    rng = np.random.default_rng(0)
    smooth = np.asarray(Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)).resize((160, 120), Image.BICUBIC))
    Image.fromarray(smooth).save(d / "smooth.png")
    Image.fromarray(smooth[..., 1]).save(d / "gray.png")
    rgba = np.dstack([smooth, np.full(smooth.shape[:2], 128, np.uint8)])
    Image.fromarray(rgba, mode="RGBA").save(d / "rgba.png")
    jpegs = []
    for orientation in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = orientation
        path = d / f"orient{orientation}.jpg"
        # red on the left of the stored pixels plus texture: a wrong turn moves the red elsewhere
        Image.fromarray(np.maximum(half_red(96, 64, "left"), smooth[:96, :64] // 4)).save(path, quality=95, subsampling=0, exif=exif)
        jpegs.append(path)
    return {"png": [d / "smooth.png", d / "gray.png", d / "rgba.png"], "jpeg": jpegs}


def preprocess(prep, bundle, image, tmp_path):
    out = tmp_path / "tensor.bin"
    result = run([prep, "preprocess", bundle.root, image, out])
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    return np.fromfile(out, np.uint8).reshape(info["height"], info["width"], 3), info


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear", "bicubic"])
def test_cpp_preprocessing_matches_python(prep, photos, tmp_path, interpolation):
    bundle = make_bundle(
        tmp_path / "b", size=32, host_resize={"mode": "shorter-side-center-crop", "interpolation": interpolation, "crop_pct": 0.875}
    )
    runner = OrtRunner(bundle.artifact_path("fp32"))
    for image in photos["png"] + photos["jpeg"]:
        ours, info = preprocess(prep, bundle, image, tmp_path)
        ref = load_images([image], bundle.preprocessing, (32, 32))[0]
        assert ours.shape == ref.shape == (32, 32, 3)
        diff = np.abs(ours.astype(int) - ref.astype(int))
        if image.suffix == ".jpg":
            # stb_image's JPEG decoder is not libjpeg-turbo's: a level or two everywhere, never a wrong turn
            assert diff.mean() < 3.0, (image.name, diff.mean())
            assert info["orientation"] == int(image.stem[-1])
        elif interpolation == "nearest":
            np.testing.assert_array_equal(ours, ref)  # same decode, same pixel picks: exact
        else:
            # stb_image_resize's triangle/Catmull-Rom filters vs Pillow's bilinear/bicubic
            assert diff.mean() < 1.0 and np.percentile(diff, 99) <= 6, (image.name, diff.mean())
        # whatever the pixels, the graph reaches the same answer from either side
        both = runner.infer(np.stack([ours, ref]))["probs"]
        assert both[0].argmax() == both[1].argmax()
        np.testing.assert_allclose(both[0], both[1], atol=0.02)


def test_cpp_orientation_and_channel_order_drive_the_answer(prep, photos, tmp_path):
    bundle = make_bundle(tmp_path / "bgr", channel_order="bgr")
    clf = Classifier.load(bundle, prefer=("onnxruntime",))
    shown = {1: "red-left", 2: "red-right", 3: "red-right", 4: "red-left", 5: "red-top", 6: "red-top", 7: "red-bottom", 8: "red-bottom"}
    for image in photos["jpeg"]:
        tensor, info = preprocess(prep, bundle, image, tmp_path)
        assert info["channel_order"] == "bgr" and tensor[..., 2].mean() > tensor[..., 0].mean()  # red in the last channel
        cpp_top = clf.classify(tensor, top_k=1)[0][0].label  # the C++ tensor through the graph
        py_top = clf.classify(str(image), top_k=1)[0][0].label  # Python's own decode of the file
        assert cpp_top == py_top == shown[info["orientation"]], image.name


def test_cpp_top_k_matches_python(prep, tmp_path):
    bundle = make_bundle(tmp_path / "b")
    logits = np.array(
        [
            [0.5, 2.0, -1.0, 2.0, 0.0],  # a tie between classes 1 and 3
            [1000.0, 1001.0, 999.0, -1000.0, 1001.5],  # large values: needs the max subtracted
            [0.0, 0.0, 0.0, 0.0, 0.0],  # all equal
        ],
        dtype=np.float32,
    )
    logits = np.concatenate([logits, np.random.default_rng(3).normal(size=(5, 5)).astype(np.float32)])
    path = tmp_path / "logits.bin"
    logits.tofile(path)
    result = run([prep, "topk", bundle.root, path, "4"])
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert len(rows) == len(logits)
    for row, z in zip(rows, logits):
        ours = top_k_of(softmax(z.astype(np.float64)), LABELS, 4)
        assert [(r["label"], r["index"]) for r in row] == [(t.label, LABELS.index(t.label)) for t in ours]
        np.testing.assert_allclose([r["prob"] for r in row], [t.prob for t in ours], atol=1e-6)


def test_cpp_errors_are_one_line(prep, tmp_path):
    bundle = make_bundle(tmp_path / "b")
    bad = tmp_path / "broken.jpg"
    bad.write_text("not a jpeg")
    result = run([prep, "preprocess", bundle.root, bad, tmp_path / "o.bin"])
    assert result.returncode == 1
    assert result.stderr.startswith("error: cannot read image") and str(bad) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = run([prep, "preprocess", tmp_path / "nowhere", bad, tmp_path / "o.bin"])
    assert result.returncode == 1 and "manifest.json" in result.stderr


@pytest.mark.gpu
def test_cpp_classify_with_tensorrt_matches_python(tmp_path):
    """Build `classify` against TensorRT and run it on an engine built here (GPU machines only)."""
    pytest.importorskip("tensorrt")
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no NVIDIA GPU")
    from click.testing import CliRunner

    from vitdeploy.cli import main

    build = tmp_path / "build"
    configure = run(["cmake", "-S", CPP, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DVITDEPLOY_TENSORRT=ON"])
    if configure.returncode != 0:
        pytest.skip(f"TensorRT C++ headers/libraries not found: {configure.stderr.strip()[-300:]}")
    assert run(["cmake", "--build", build, "--parallel", "4"]).returncode == 0
    bundle = make_bundle(tmp_path / "b")
    built = CliRunner().invoke(main, ["build-engine", str(bundle.root), "--precision", "fp32", "--batch", "1:4:8"])
    assert built.exit_code == 0, built.output
    images = []
    for side in ("top", "bottom", "left", "right"):
        Image.fromarray(half_red(40, 40, side)).save(tmp_path / f"{side}.png")
        images.append(tmp_path / f"{side}.png")
    result = run([build / "classify", bundle.root, *images, "--top-k", "1"])
    assert result.returncode == 0, result.stderr
    got = [line.split(": ")[1].split()[0] for line in result.stdout.splitlines()]
    assert got == ["red-top", "red-bottom", "red-left", "red-right"]
