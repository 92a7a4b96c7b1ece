"""Bad input to `vitdeploy export`: one clear line, a non-zero exit, nothing half-written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from vitdeploy.bundle import Bundle
from vitdeploy.cli import main


def export(*args: str):
    return CliRunner().invoke(main, ["export", *args])


def assert_one_line_error(result, *needles: str, code: int = 1) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    text = result.output.strip()
    for needle in needles:
        assert needle in text, text


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=4, depth=1)
    path = tmp_path_factory.mktemp("ckpt") / "tiny.safetensors"
    save_file(model.state_dict(), str(path))
    return path


def test_unknown_source_kind_and_model(tmp_path):
    assert_one_line_error(export("onnx:foo", "-o", str(tmp_path / "a")), "unknown source kind 'onnx'")
    assert_one_line_error(export("timm:vit_nonexistent_patch99", "-o", str(tmp_path / "b")), "timm has no model 'vit_nonexistent_patch99'")
    assert_one_line_error(export("builtin:cats", "-o", str(tmp_path / "c")), "unknown builtin model 'cats'")
    assert_one_line_error(export("timm:resnet18", "-o", str(tmp_path / "d"), "--num-classes", "3"), "not a ViT-family model")
    assert not any(tmp_path.iterdir())


def test_checkpoint_mismatch_names_keys(tmp_path, tiny_checkpoint):
    result = export("timm:vit_tiny_patch16_224", "--checkpoint", str(tiny_checkpoint), "--num-classes", "4", "-o", str(tmp_path / "a"))
    assert_one_line_error(result, "does not match the model", "missing keys blocks.1")


def test_pickle_checkpoint_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = tmp_path / "evil.pt"
    torch.save({"state_dict": Evil()}, str(path))
    result = export("timm:vit_tiny_patch16_224", "--checkpoint", str(path), "-o", str(tmp_path / "out"))
    assert_one_line_error(result, "cannot be loaded without executing code")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a whole export with its verification (about 5 s of CPU)
def test_pt_checkpoint_with_wrapper_loads(tmp_path, tiny_checkpoint):
    from safetensors.torch import load_file

    path = tmp_path / "ft.pth"
    torch.save({"model": load_file(str(tiny_checkpoint)), "epoch": 3}, str(path))
    result = export("timm:vit_tiny_patch16_224", "--checkpoint", str(path), "--model-arg", "depth=1", "-o", str(tmp_path / "out"),
                    "--check-images", "4")
    assert result.exit_code == 0, result.output
    bundle = Bundle.open(tmp_path / "out")
    assert bundle.spec.num_classes == 4 and bundle.spec.depth == 1  # head size read from the checkpoint


def test_patch_size_change_is_a_configuration_error(tmp_path, tiny_checkpoint):
    result = export("timm:vit_tiny_patch16_224", "--checkpoint", str(tiny_checkpoint), "--model-arg", "depth=1",
                    "--model-arg", "patch_size=14", "--model-arg", "img_size=224", "-o", str(tmp_path / "a"))
    assert_one_line_error(result, "patch-size change changes W_E", "cannot fix it")


def test_labels_file_count_mismatch(tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_text("a\nb\nc\n")
    assert_one_line_error(export("-o", str(tmp_path / "a"), "--labels", str(labels)), "has 3 labels but the model's head has 10 classes")


def test_resolution_not_divisible(tmp_path):
    assert_one_line_error(export("-o", str(tmp_path / "a"), "--resolution", "30"), "not a multiple of the patch size 4", "nearest valid: 28 or 32")
    assert_one_line_error(export("-o", str(tmp_path / "b"), "--resolution", "32x33"), "width 33")


def test_unwritable_output_directory(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            # root ignores permission bits; /proc refuses new entries to everyone
            assert_one_line_error(export("-o", "/proc/vitdeploy-bundle"), "cannot write in /proc", "choose a writable location")
        else:
            assert_one_line_error(export("-o", str(locked / "bundle")), "not writable")
    finally:
        locked.chmod(0o700)


def test_output_path_is_a_file(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    result = export("-o", str(target / "bundle"))
    assert_one_line_error(result, "cannot create directory")


@pytest.mark.slow
def test_interrupted_export_keeps_the_previous_bundle(tmp_path, monkeypatch, digits_bundle):
    out = tmp_path / "bundle"
    assert export("-o", str(out), "--check-images", "4").exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    import vitdeploy.exporters.api as api

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "verify_export", interrupted)
    result = export("-o", str(out), "--resolution", "40")
    assert result.exit_code == 130
    assert "interrupted" in result.output
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert after == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]  # no staging folder left behind


@pytest.mark.slow
def test_reexport_drops_records_that_no_longer_match(tmp_path):
    out = tmp_path / "bundle"
    assert export("-o", str(out), "--check-images", "4").exit_code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    sha = manifest["artifacts"]["fp32"]["sha256"]
    manifest["engines"] = {"gpu-test": {"source_sha256": sha, "plan": "engines/gpu-test/model.plan"}}
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / "reports").mkdir()
    (out / "reports" / "check.json").write_text("{}")
    # same weights, same graph: the engine record and reports are kept
    assert export("-o", str(out), "--check-images", "4").exit_code == 0
    assert "gpu-test" in Bundle.open(out).manifest.get("engines", {})
    assert (out / "reports" / "check.json").exists()
    # another resolution: another graph; the engine and the reports no longer match and are dropped
    result = export("-o", str(out), "--resolution", "40", "--check-images", "4")
    assert result.exit_code == 0, result.output
    assert "dropped engine gpu-test" in result.output
    assert not Bundle.open(out).manifest.get("engines") and not (out / "reports").exists()


@pytest.mark.slow
def test_mean_std_come_from_the_model_config(export_cached):
    """timm's augreg ViTs normalise with 0.5/0.5, not ImageNet numbers: the graph must carry that."""
    import onnx
    from onnx import numpy_helper

    bundle = export_cached("timm:vit_tiny_patch16_224.augreg_in21k_ft_in1k", model_kwargs={"depth": 1}, num_classes=3, random_init=True)
    assert bundle.preprocessing["mean"] == [0.5, 0.5, 0.5] and bundle.preprocessing["std"] == [0.5, 0.5, 0.5]
    assert "augreg" in bundle.preprocessing["config_source"]
    model = onnx.load(str(bundle.artifact_path("fp32")))
    consts = [numpy_helper.to_array(i) for i in model.graph.initializer if numpy_helper.to_array(i).size == 3]
    assert any(c.ravel().tolist() == [0.5, 0.5, 0.5] for c in consts)
    assert not any(abs(float(c.ravel()[0]) - 0.485) < 1e-6 for c in consts)
    default = export_cached("timm:deit_tiny_patch16_224", model_kwargs={"depth": 1}, num_classes=3, random_init=True)
    assert default.preprocessing["mean"] == pytest.approx([0.485, 0.456, 0.406])
