"""`vitdeploy evaluate` on the trained digits bundle: the report, an independent recomputation of one
condition, occlusion maps that rank ink above background, and one-line errors for bad input."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from vitdeploy.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bundle_dir(digits_bundle, tmp_path_factory) -> Path:
    import shutil

    dst = tmp_path_factory.mktemp("evaluate") / "digits"
    shutil.copytree(digits_bundle.root, dst)
    return dst


def invoke(*args: str):
    return CliRunner().invoke(main, ["evaluate", *args], catch_exceptions=False)


def test_report_and_an_independent_recomputation(bundle_dir: Path) -> None:
    import onnxruntime as ort

    from vitdeploy.builtin.digits import load_digits_split
    from vitdeploy.data import subset_indices

    result = invoke(str(bundle_dir), "--suite", "jpeg,occlusion-aligned,background-solid", "--severity", "jpeg=30",
                    "--severity", "occlusion-aligned=0.25", "--severity", "background-solid=128", "--limit", "120",
                    "--threads", "1", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["schema"] == "vitdeploy-evaluate/1"
    assert report["data"]["count"] == 120 and report["data"]["unreadable_count"] == 0
    assert [s["id"] for s in report["scorers"]] == ["onnx fp32", "pytorch fp32"]
    assert report["reference"]["available"] is True
    assert [c["id"] for c in report["conditions"]] == ["clean", "jpeg@30", "occlusion-aligned@0.25", "background-solid@128"]
    assert all(t["rule"] and t["severities"] for t in report["transforms"])
    fp32 = report["results"]["onnx fp32"]
    assert fp32["clean"]["accuracy"] >= 0.98 and fp32["clean"]["ci95"][0] < fp32["clean"]["accuracy"] <= fp32["clean"]["ci95"][1]
    assert fp32["background-solid@128"]["drop_pt"] > 10  # the digits model relies on its black background
    assert sum(s["n"] for s in fp32["clean"]["per_class"].values()) == 120
    assert sum(s["n"] for s in fp32["clean"]["per_size"].values()) == 120
    assert fp32["jpeg@30"]["agreement"] >= 0.95  # ONNX fp32 follows PyTorch under the same perturbation

    # Independently: the same subset, Pillow JPEG at quality 30, the fp32 graph through a bare ORT session.
    images, labels = load_digits_split("test")
    index = subset_indices(360, 120)
    images, labels = images[index], labels[index]
    encoded = []
    for img in images:
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=30)
        encoded.append(np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB")))
    session = ort.InferenceSession(str(bundle_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    logits = session.run(["logits"], {session.get_inputs()[0].name: np.stack(encoded)})[0]
    correct = int((logits.argmax(-1) == labels).sum())
    assert fp32["jpeg@30"]["correct"] == correct and fp32["jpeg@30"]["accuracy"] == correct / 120

    reports = bundle_dir / "reports"
    for name in ("evaluate.json", "evaluate.csv", "evaluate_strata.csv", "evaluate.png", "evaluate_classes.png"):
        assert (reports / name).stat().st_size > 0
    rows = (reports / "evaluate.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 4
    assert json.loads((bundle_dir / "manifest.json").read_text())["records"]["evaluate"]["report"] == "reports/evaluate.json"


def test_occlusion_map_ranks_ink_above_background(bundle_dir: Path, tmp_path: Path) -> None:
    result = invoke(str(bundle_dir), "--occlusion-map", "digits:test", "--occlusion-patch", "8", "--occlusion-stride", "4",
                    "--batch", "512", "--threads", "1", "-o", str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["count"] == 360 and report["images_with_separable_background"] == 360
    assert report["positions_per_image"] == 49 and "p(target | clean) - p(target | occluded)" in report["rule"]
    assert report["foreground_above_background"] >= 0.9
    maps = np.load(tmp_path / "occlusion.npy")
    assert maps.shape == (360, 32, 32) and maps.dtype == np.float32
    assert (tmp_path / "occlusion.png").stat().st_size > 0
    # recompute the acceptance number from the saved maps and the background rule
    from vitdeploy.builtin.digits import load_digits_split
    from vitdeploy.evaluate.transforms import background_mask

    mask, _ = background_mask(load_digits_split("test")[0])
    ink_wins = [maps[i][~mask[i]].mean() > maps[i][mask[i]].mean() for i in range(360)]
    assert np.mean(ink_wins) == pytest.approx(report["foreground_above_background"])


def _folder(root: Path, per_class: int = 2) -> Path:
    from vitdeploy.builtin.digits import load_digits_split

    images, labels = load_digits_split("test")
    for k in range(10):
        (root / str(k)).mkdir(parents=True)
        for j, i in enumerate(np.flatnonzero(labels == k)[:per_class]):
            Image.fromarray(images[i]).save(root / str(k) / f"{j}.png")
    return root


def test_bad_input_is_one_line(bundle_dir: Path, tmp_path: Path) -> None:
    def fails(*args: str, match: str) -> None:
        result = invoke(str(bundle_dir), *args)
        assert result.exit_code == 1, result.output
        assert match in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1, result.output

    fails("--suite", "blur", match="unknown transform 'blur'")
    fails("--suite", "jpeg", "--severity", "jpeg=0", match="out of range for jpeg")
    fails("--suite", "occlusion", "--severity", "occlusion=2", match="out of range for occlusion")
    (tmp_path / "empty").mkdir()
    fails("--data", str(tmp_path / "empty"), match="no class sub-folders")
    wrong = _folder(tmp_path / "wrong", 1)
    (wrong / "3").rename(wrong / "three")
    fails("--data", str(wrong), match="three is not a label of this model")
    good = _folder(tmp_path / "good")
    (good / "7" / "broken.png").write_bytes(b"\x89PNG not really")
    fails("--data", str(good), "--suite", "none", match="7/broken.png")
    result = invoke(str(bundle_dir), "--data", str(good), "--suite", "none", "--no-reference", "--skip-unreadable",
                    "--no-plot", "-o", str(tmp_path / "out"), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)["data"]
    assert data["count"] == 20 and data["unreadable_count"] == 1 and data["unreadable"][0]["file"] == "7/broken.png"
    assert json.loads(result.output)["reference"]["note"] == "not requested (--no-reference)"


def test_profile_accuracy_column_and_plot(bundle_dir: Path, tmp_path: Path) -> None:
    import csv

    import onnxruntime as ort

    from vitdeploy.builtin.digits import load_digits_split

    images, labels = load_digits_split("test")
    images, labels = images[::9], labels[::9]  # 40 images
    np.savez(tmp_path / "few.npz", images=images, labels=labels)
    result = CliRunner().invoke(main, ["profile", str(bundle_dir), "--precision", "fp32", "--batch", "1,4", "--iterations", "3",
                                       "--warmup", "1", "--threads", "1", "--accuracy", str(tmp_path / "few.npz"),
                                       "-o", str(tmp_path / "prof")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = [r for r in csv.DictReader((tmp_path / "prof" / "profile.csv").open()) if r["status"] == "ok"]
    assert len(rows) == 2 and len({r["accuracy"] for r in rows}) == 1  # one accuracy per (precision, size)
    session = ort.InferenceSession(str(bundle_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    correct = int((session.run(["logits"], {session.get_inputs()[0].name: images})[0].argmax(-1) == labels).sum())
    assert float(rows[0]["accuracy"]) == pytest.approx(correct / 40, abs=1e-6) and rows[0]["accuracy_n"] == "40"
    assert float(rows[0]["accuracy_ci95_low"]) <= correct / 40 <= float(rows[0]["accuracy_ci95_high"])
    assert (tmp_path / "prof" / "profile_accuracy.png").stat().st_size > 0
    bad = CliRunner().invoke(main, ["profile", str(bundle_dir), "--accuracy", str(tmp_path / "missing.npz")])
    assert bad.exit_code == 1 and "--accuracy" in bad.output and "does not exist" in bad.output  # refused before the sweep


def test_resolution_sweep_through_a_static_variant(bundle_dir: Path, tmp_path: Path) -> None:
    result = invoke(str(bundle_dir), "--suite", "none", "--resolutions", "24", "--precision", "fp32", "--no-reference",
                    "--limit", "60", "--threads", "1", "--no-plot", "-o", str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    res = json.loads(result.output)["resolution"]
    assert res["native"] == [32, 32] and "re-exported offline" in res["rule"] and "bilinear" in res["rule"]
    (row,) = res["rows"]
    assert (row["runner"], row["height"], row["width"], row["n"]) == ("onnx fp32", 24, 24, 60)
    assert row["graph"].startswith("variants/24x24/")
    assert ("flag" in row) == (row["drop_pt"] > 2.0)
    bad = invoke(str(bundle_dir), "--suite", "none", "--resolutions", "30", "--no-reference")
    assert bad.exit_code == 1 and "Traceback" not in bad.output and len(bad.output.strip().splitlines()) == 1


def test_engines_are_skipped_with_the_reason_without_tensorrt(digits_bundle, tmp_path: Path) -> None:
    import shutil

    from vitdeploy.bundle import Bundle
    from vitdeploy.contract import InputContract
    from vitdeploy.evaluate.runners import engine_scorers
    from vitdeploy.lazy import available

    if available("tensorrt"):
        pytest.skip("TensorRT is importable here; the skip path is for machines without it")
    root = tmp_path / "b"
    shutil.copytree(digits_bundle.root, root)
    (root / "engines" / "sm90-int8").mkdir(parents=True)
    (root / "engines" / "sm90-int8" / "engine.json").write_text(json.dumps(
        {"precision": "int8", "profiles": [{"batch": [1, 8, 32], "height": [32, 32, 32], "width": [32, 32, 32]}]}))
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["engines"] = {"sm90-int8": {"dir": "engines/sm90-int8", "precision": "int8"}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    scorers, skipped = engine_scorers(Bundle.open(root), InputContract.from_bundle(Bundle.open(root)), 64)
    assert scorers == []
    assert skipped == [{"id": "tensorrt sm90-int8", "kind": "engine", "precision": "int8", "engine": "engines/sm90-int8",
                        "skipped": "TensorRT is not installed on this machine (engines are evaluated on their target GPU)"}]
