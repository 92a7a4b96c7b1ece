"""`vitdeploy predict` on image files the tests write, and the Python embedding example."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from synthetic_bundle import LABELS, half_red, make_bundle
from vitdeploy.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    # A host rule with a centre crop, as timm models have: files of any size go through it.
    return make_bundle(
        tmp_path_factory.mktemp("predict") / "quadrants",
        host_resize={"mode": "shorter-side-center-crop", "interpolation": "bicubic", "crop_pct": 0.875},
    )


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Files in the formats a user has, each with a known answer."""
    d = tmp_path_factory.mktemp("images")
    out = {}
    Image.fromarray(half_red(48, 48, "top")).save(d / "top.png")
    out["top.png"] = "red-top"
    Image.fromarray(half_red(60, 80, "left")).save(d / "left.jpg", quality=95)
    out["left.jpg"] = "red-left"
    gray = np.zeros((40, 40), np.uint8)
    gray[20:] = 255  # white bottom half: gray has red in every channel -> "red-bottom"
    Image.fromarray(gray, mode="L").save(d / "gray.png")
    out["gray.png"] = "red-bottom"
    rgba = np.zeros((40, 40, 4), np.uint8)
    rgba[:, 20:] = (255, 0, 0, 255)
    rgba[:, :20, 3] = 0  # transparent black left half
    Image.fromarray(rgba, mode="RGBA").save(d / "rgba.png")
    out["rgba.png"] = "red-right"
    # Stored red-left, EXIF says "rotate 90 clockwise to display": the photo is red-top.
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(half_red(40, 64, "left")).save(d / "rotated.jpg", quality=95, exif=exif)
    out["rotated.jpg"] = "red-top"
    return d, out


def run(*args):
    return CliRunner().invoke(main, ["predict", *map(str, args)])


def test_predict_files_of_every_kind(bundle, images):
    folder, expected = images
    paths = [folder / name for name in expected]
    result = run(bundle.root, *paths, "--top-k", "2")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if not line.startswith("#")]
    assert len(lines) == len(paths)
    for line, path in zip(lines, paths):
        assert line.startswith(f"{path}: {expected[path.name]} ")


def test_predict_json(bundle, images):
    folder, expected = images
    result = run(bundle.root, folder, "--json", "--top-k", "3", "--backend", "onnxruntime")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert sorted(Path(item["image"]).name for item in data) == sorted(expected)  # a folder expands
    for item in data:
        top = item["top"]
        assert [set(t) for t in top] == [{"label", "prob"}] * 3
        assert top[0]["label"] == expected[Path(item["image"]).name]
        probs = [t["prob"] for t in top]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0 + 1e-6
        assert all(t["label"] in LABELS for t in top)


def test_unreadable_file_is_one_line_and_exit_1(bundle, images, tmp_path):
    folder, _ = images
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not really a jpeg")
    result = run(bundle.root, folder / "top.png", bad)
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert [line for line in lines if line.startswith("error:")] == [lines[-1]]  # one error line, last
    assert lines[-1].startswith("error: 1 of 2 images could not be read (first: ") and "broken.jpg" in lines[-1]
    assert any(line.startswith(f"{bad}: not classified: cannot read image") for line in lines)  # named in its place
    assert any(line.startswith(str(folder / "top.png") + ": ") and "not classified" not in line for line in lines)
    assert "Traceback" not in result.output
    strict = run(bundle.root, folder / "top.png", bad, "--strict")
    assert strict.exit_code == 1 and strict.output.strip().splitlines()[-1].startswith("error: cannot read image")
    for args, what in [
        ((tmp_path / "no-bundle", folder / "top.png"), "does not exist"),
        ((bundle.root, tmp_path / "missing.png"), "does not exist"),
        ((bundle.root, folder / "top.png", "--backend", "tensorrt"), "no TensorRT engine"),
        ((bundle.root, folder / "top.png", "--resolution", "32"), "static resolution"),
    ]:
        result = run(*args)
        assert result.exit_code == 1 and what in result.output and "Traceback" not in result.output, result.output


def test_predict_help_has_an_example():
    result = CliRunner().invoke(main, ["predict", "--help"])
    assert result.exit_code == 0 and "Example:" in result.output and "vitdeploy predict bundle" in result.output


def test_python_example_runs(bundle, images):
    folder, expected = images
    paths = [str(folder / name) for name in ("top.png", "rotated.jpg")]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "python" / "classify.py"), str(bundle.root), *paths, "--top-k", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"{paths[0]}: red-top" in out and f"{paths[1]}: red-top" in out
    assert f"{paths[1]} (frame): red-top" in out
    assert "probabilities (2, 5)" in out


def test_predict_digits_from_png_and_jpeg(digits_bundle, tmp_path):
    """Acceptance on the real model: digit images saved as grayscale PNG and JPEG files."""
    from vitdeploy.builtin import BUILTIN_MODELS
    from vitdeploy.runtime.ort import OrtRunner

    images, _ = BUILTIN_MODELS["digits"].load_split("test")
    images = images[:24]
    reference = OrtRunner(digits_bundle.artifact_path("fp32")).infer(images)["probs"].argmax(1)
    paths = []
    for i, img in enumerate(images):
        gray = Image.fromarray(img[..., 0], mode="L")  # the digits are gray: store them as such
        paths.append(tmp_path / f"d{i:02d}.png")
        gray.save(paths[-1])
        paths.append(tmp_path / f"d{i:02d}.jpg")
        gray.save(paths[-1], quality=95)
    result = run(digits_bundle.root, *paths, "--json", "--top-k", "1")
    assert result.exit_code == 0, result.output
    got = {Path(item["image"]).name: item["top"][0]["label"] for item in json.loads(result.stdout)}
    labels = digits_bundle.labels
    png = [got[f"d{i:02d}.png"] == labels[reference[i]] for i in range(len(images))]
    jpg = [got[f"d{i:02d}.jpg"] == labels[reference[i]] for i in range(len(images))]
    assert all(png)  # lossless: exactly the pixels the runner saw
    assert sum(jpg) >= len(images) - 1  # JPEG's few-level noise may flip at most a borderline digit
