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
import PIL
import pytest
from PIL import Image

from synthetic_bundle import LABELS, half_red, make_bundle
from vitdeploy.images import load_images
from vitdeploy.runtime.classifier import Classifier, softmax, top_k_of
from vitdeploy.runtime.ort import OrtRunner

ROOT = Path(__file__).resolve().parents[1]
CPP = ROOT / "examples" / "cpp"
DEPS = ROOT / "scripts" / "install_system_deps.sh"


# resample.cpp follows Pillow 13's pass order; Pillow <= 12 always resamples horizontally first, which
# moves the last bit of some pixels of images whose height shrinks most.
PILLOW_13 = int(PIL.__version__.split(".")[0]) >= 13


def assert_same_pixels(ours, ref, what=""):
    if PILLOW_13:
        np.testing.assert_array_equal(ours, ref, err_msg=what)
    else:
        assert np.abs(ours.astype(int) - ref.astype(int)).max() <= 1, what


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


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear", "bicubic", "lanczos"])
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
        else:
            assert_same_pixels(ours, ref, image.name)  # same decoded pixels, Pillow's resampling: byte-identical
        # whatever the pixels, the graph reaches the same answer from either side
        both = runner.infer(np.stack([ours, ref]))["probs"]
        assert both[0].argmax() == both[1].argmax()
        np.testing.assert_allclose(both[0], both[1], atol=0.02)


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "lanczos", "box", "hamming"])
def test_cpp_resampling_is_pillows_at_any_scale(prep, tmp_path, interpolation):
    """Random noise (the hardest case for rounding) from random sizes to random sizes: up, down, mixed,
    and heights shrunk more than twice the width (the pass order Pillow 13 changes)."""
    bundle = make_bundle(tmp_path / "b", mode="dynamic", host_resize={"mode": "stretch", "interpolation": interpolation})
    rng = np.random.default_rng(11)
    pairs = [((37, 23), (8, 20)), ((9, 61), (44, 12)), ((64, 40), (16, 36))]
    pairs += [(tuple(rng.integers(5, 80, 2)), tuple(4 * rng.integers(1, 16, 2))) for _ in range(9)]
    for (h, w), (th, tw) in pairs:
        path = tmp_path / f"noise_{h}x{w}.png"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
        out = tmp_path / "t.bin"
        result = run([prep, "preprocess", bundle.root, path, out, f"{th}x{tw}"])
        assert result.returncode == 0, result.stderr
        ours = np.fromfile(out, np.uint8).reshape(th, tw, 3)
        ref = load_images([path], bundle.preprocessing, (th, tw))[0]
        assert_same_pixels(ours, ref, f"{h}x{w} -> {th}x{tw} {interpolation}")


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


# -- variable-size bundles (issue 13): canvas + valid_hw from C++ == Python ---------------------------
# Sizes 24..48 (the 48x48 canvas of the digits export), square and not, plus one larger than the canvas
# and one far from its aspect; PNG, so both sides decode the same pixels and must agree byte for byte.
VARIABLE_SIZES = [(24, 24), (24, 48), (48, 24), (30, 45), (37, 29), (48, 48), (41, 26), (33, 47), (60, 90), (13, 50)]


@pytest.fixture(scope="module")
def digits_variable(export_cached):
    return export_cached("builtin:digits", variable_size=True, canvas=(48, 48))


@pytest.fixture(scope="module")
def variable_photos(tmp_path_factory):
    d = tmp_path_factory.mktemp("cpp-variable-images")
    rng = np.random.default_rng(7)
    paths = []
    for h, w in VARIABLE_SIZES:
        # smooth colour with a dark digit-like stroke: real structure for the resampler and the model
        img = np.asarray(Image.fromarray(rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)).resize((w, h), Image.BICUBIC)).copy()
        img[h // 4 : 3 * h // 4, w // 2 - max(1, w // 10) : w // 2 + max(1, w // 10)] = 10
        paths.append(d / f"img_{h}x{w}.png")
        Image.fromarray(img).save(paths[-1])
    return paths


def canvas_batch(prep, bundle, images, out, *extra):
    out.mkdir(exist_ok=True)
    result = run([prep, "canvas", bundle.root, out, *images, *extra])
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    canvas = tuple(info["canvas"])
    pixels = np.fromfile(out / "images.bin", np.uint8).reshape(len(images), *canvas, 3)
    valid = np.fromfile(out / "valid_hw.bin", np.int32).reshape(len(images), 2)
    return pixels, valid, info


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["fit-within", "shrink-within"])
def test_cpp_canvas_matches_python_byte_for_byte(prep, digits_variable, variable_photos, tmp_path, policy):
    from vitdeploy.images import decode_image, to_channel_order
    from vitdeploy.variable import check_sizes_for_canvas, fit_image, pad_to_canvas

    pixels, valid, info = canvas_batch(prep, digits_variable, variable_photos, tmp_path / "out", "--policy", policy)
    pre = digits_variable.preprocessing
    ref_pixels, ref_valid = pad_to_canvas([to_channel_order(fit_image(decode_image(p), pre, policy), pre) for p in variable_photos], (48, 48))
    np.testing.assert_array_equal(valid, ref_valid)
    assert_same_pixels(pixels, ref_pixels, policy)  # resampled by Pillow's rule in C++: identical bytes
    check_sizes_for_canvas(valid, (48, 48), (4, 4))  # what C++ writes passes Python's guards
    assert info["policy"] == policy and info["canvas"] == [48, 48] and info["valid_hw"] == valid.tolist()
    assert f"--shapes=images:{len(variable_photos)}x48x48x3,valid_hw:{len(variable_photos)}x2" in info["trtexec"]
    assert len({tuple(v) for v in valid.tolist()}) > 3 and all(h % 4 == 0 and w % 4 == 0 for h, w in valid.tolist())
    if policy == "shrink-within":  # never enlarged: each side at most its own size, floored to patches
        assert all(v[0] <= s[0] and v[1] <= s[1] for v, s in zip(valid.tolist(), VARIABLE_SIZES))
    else:  # fit-within: one side reaches the canvas (within a patch)
        assert all(max(h, w) >= 44 for h, w in valid.tolist())


@pytest.mark.slow
def test_cpp_canvas_batch_gives_pythons_answers(prep, digits_variable, variable_photos, tmp_path):
    """The C++ canvas and valid_hw through the two-input graph = Python's own classify of the files."""
    clf = Classifier.load(digits_variable, prefer=("onnxruntime",), threads=1)
    pixels, valid, _ = canvas_batch(prep, digits_variable, variable_photos, tmp_path / "out")  # the manifest's policy
    ours = clf.run_padded(pixels, valid)
    ref = clf.classify([str(p) for p in variable_photos], top_k=10)
    for row, top in zip(ours, ref):
        assert [t.label for t in top] == [digits_variable.labels[i] for i in np.argsort(-row, kind="stable")]
        np.testing.assert_allclose(sorted(row, reverse=True), [t.prob for t in top], atol=1e-6)


@pytest.mark.slow
def test_cpp_canvas_guards_and_errors_are_one_line(prep, digits_variable, variable_photos, tmp_path):
    out = tmp_path / "out"
    out.mkdir()

    def refused(*args):
        result = run([prep, *args])
        assert result.returncode == 1 and result.stderr.startswith("error: "), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        return result.stderr

    # policy none: 30x45 is not whole 4x4 patches -> refused before anything is written
    odd = next(p for p in variable_photos if p.stem.endswith("30x45"))
    msg = refused("canvas", digits_variable.root, out, odd, "--policy", "none")
    assert "valid_hw row 0 is 30x45, not whole 4x4 patches" in msg and "use 28x44" in msg and str(odd) in msg
    assert not any(out.iterdir())
    big = next(p for p in variable_photos if p.stem.endswith("60x90"))
    assert "larger than the 48x48 canvas" in refused("canvas", digits_variable.root, out, big, "--policy", "none")
    assert "unknown variable-size policy 'stretch'" in refused("canvas", digits_variable.root, out, odd, "--policy", "stretch")
    # policy none with whole patches: the caller's pixels as they are, at their own size
    exact = tmp_path / "exact.png"
    pixels = np.random.default_rng(1).integers(0, 256, (28, 44, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(exact)
    batch, valid, _ = canvas_batch(prep, digits_variable, [exact], out, "--policy", "none")
    assert valid.tolist() == [[28, 44]]
    np.testing.assert_array_equal(batch[0, :28, :44], pixels)
    assert not batch[0, 28:].any() and not batch[0, :, 44:].any()
    # the single-input and two-input tools point at each other
    assert "vitdeploy-prep canvas" in refused("preprocess", digits_variable.root, exact, out / "x.bin")
    fixed = make_bundle(tmp_path / "fixed")
    assert "vitdeploy-prep preprocess" in refused("canvas", fixed.root, out, exact)


def _build_with_tensorrt(build):
    """The example with `classify` (VITDEPLOY_TENSORRT=ON); skips without a GPU or TensorRT's C++ SDK."""
    pytest.importorskip("tensorrt")
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no NVIDIA GPU")
    configure = run(["cmake", "-S", CPP, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DVITDEPLOY_TENSORRT=ON"])
    if configure.returncode != 0:
        pytest.skip(f"TensorRT C++ headers/libraries not found: {configure.stderr.strip()[-300:]}")
    assert run(["cmake", "--build", build, "--parallel", "4"]).returncode == 0
    return build


@pytest.mark.gpu
def test_cpp_classify_with_tensorrt_matches_python(tmp_path):
    """Build `classify` against TensorRT and run it on an engine built here (GPU machines only)."""
    build = _build_with_tensorrt(tmp_path / "build")
    from click.testing import CliRunner

    from vitdeploy.cli import main

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


@pytest.mark.gpu
@pytest.mark.slow
def test_cpp_classify_variable_size_engine_matches_python(digits_variable, variable_photos, tmp_path):
    """`classify` on a two-input engine: mixed sizes in one batch, same top-1 as Python on ORT (GPU only)."""
    build = _build_with_tensorrt(tmp_path / "build")
    from click.testing import CliRunner

    from vitdeploy.cli import main

    root = tmp_path / "bundle"
    shutil.copytree(digits_variable.root, root)
    built = CliRunner().invoke(main, ["build-engine", str(root), "--precision", "fp32", "--batch", "1:4:8"])
    assert built.exit_code == 0, built.output
    result = run([build / "classify", root, *variable_photos, "--top-k", "1"])
    assert result.returncode == 0, result.stderr
    got = [line.split(": ")[1].split()[0] for line in result.stdout.splitlines()]
    clf = Classifier.load(digits_variable, prefer=("onnxruntime",), threads=1)
    assert got == [top[0].label for top in clf.classify([str(p) for p in variable_photos], top_k=1)]
