"""Issue 26: a bundle with random weights (only `--random-init` makes one) says so in one line wherever
it is used: inspect, predict, check, evaluate, profile, embed, serve, and engine.json of its engines.
The line comes from one place (vitdeploy.weights.random_weights_notice)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from vitdeploy.cli import main
from vitdeploy.weights import describe_weights, random_weights_notice, weights_record

NOTICE = "the weights of this bundle are RANDOM"


@pytest.fixture(scope="module")
def random_bundle(export_cached):
    """A real --random-init export (timm ViT, one block, 32x32, ten classes so digits data fits) with an embedding output."""
    return export_cached("timm:vit_tiny_patch16_224", model_kwargs={"depth": 1, "img_size": 32}, num_classes=10, random_init=True,
                         outputs=("logits", "probs", "embedding"), check_images=2)


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    from PIL import Image

    path = tmp_path_factory.mktemp("img") / "x.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(path)
    return path


def _one_notice(result) -> None:
    """The notice once, as a warning line on stderr (stdout keeps the command's own output, e.g. JSON)."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("warning: ") and NOTICE in line]
    assert len(lines) == 1, result.output
    assert "--random-init, seed 0" in lines[0]


def test_the_notice_is_one_line_from_one_place(random_bundle):
    source = random_bundle.manifest["source"]
    notice = random_weights_notice(source)
    assert notice and "\n" not in notice and "timm:vit_tiny_patch16_224" in notice
    assert describe_weights(source).startswith("RANDOM (--random-init, seed 0)")
    record = weights_record(source)
    assert record["random"] and record["origin"] == "random" and record["notice"] == notice
    # trained weights: no notice; a bundle written before the weights record still counts as random
    assert random_weights_notice({"kind": "builtin", "name": "digits", "weights": {"origin": "builtin"}}) is None
    assert random_weights_notice({"kind": "timm", "name": "x", "random_init": True})


def test_inspect_says_so(random_bundle):
    result = CliRunner().invoke(main, ["inspect", str(random_bundle.root)])
    assert result.exit_code == 0, result.output
    _one_notice(CliRunner().invoke(main, ["inspect", str(random_bundle.root), "--json"]))
    as_json = CliRunner().invoke(main, ["inspect", str(random_bundle.root), "--json"])
    assert json.loads(as_json.stdout)["weights"]["random"] is True  # stdout stays JSON: the line is on stderr
    assert "RANDOM" in result.stdout  # and the table's weights row says it too


def test_predict_and_embed_say_so(random_bundle, image, tmp_path):
    result = CliRunner().invoke(main, ["predict", str(random_bundle.root), str(image), "--top-k", "2"])
    assert result.exit_code == 0, result.output
    _one_notice(result)
    result = CliRunner().invoke(main, ["embed", str(random_bundle.root), str(image), "-o", str(tmp_path / "f.npy")])
    assert result.exit_code == 0, result.output
    _one_notice(result)


@pytest.mark.slow  # check and evaluate re-load the PyTorch reference
def test_check_and_evaluate_say_so(random_bundle, copy_bundle):
    root = copy_bundle(random_bundle)
    result = CliRunner().invoke(main, ["check", str(root), "--images", "2"])
    assert result.exit_code == 0 and "PASS" in result.output, result.output  # random, but the graph computes them
    _one_notice(result)
    result = CliRunner().invoke(main, ["evaluate", str(root), "--data", "digits:test", "--suite", "none", "--limit", "8", "--no-plot"])
    assert result.exit_code == 0, result.output
    _one_notice(result)


def test_profile_says_so(random_bundle, copy_bundle):
    root = copy_bundle(random_bundle)
    result = CliRunner().invoke(main, ["profile", str(root), "--resolutions", "32", "--batch", "1", "--precision", "fp32",
                                       "--backend", "ort", "--iterations", "4", "--rounds", "2", "--warmup", "1", "--no-plot"])
    assert result.exit_code == 0, result.output
    _one_notice(result)


def test_serve_says_so_before_anything_else(random_bundle, tmp_path):
    result = CliRunner().invoke(main, ["serve", str(random_bundle.root), "--serve-python", str(tmp_path / "no-python")])
    assert result.exit_code != 0  # no serve environment at that path: one line says so
    _one_notice(result)
    assert result.output.splitlines()[0].startswith("warning: ")


def test_engine_json_records_the_random_weights(random_bundle, copy_bundle, monkeypatch):
    """engine.json as service._build writes it, with TensorRT's builder and the GPU query stood in for (no GPU here)."""
    from vitdeploy.bundle import Bundle
    from vitdeploy.engine import builder, fingerprint, service, versions
    from vitdeploy.engine.plan import PlanOptions, make_plan

    bundle = Bundle.open(copy_bundle(random_bundle))
    caps = versions.capabilities_for("10.3.0")
    plan = make_plan(bundle, PlanOptions(precision="fp32"), caps).with_target("t")
    monkeypatch.setattr(builder, "create_builder", lambda trt, logger: object())
    monkeypatch.setattr(builder, "build", lambda *a, **k: SimpleNamespace(plan_bytes=b"plan", seconds=0.1, dla_layers=None, timing_cache=None))
    monkeypatch.setattr(fingerprint, "query_device", lambda index=0: fingerprint.DeviceInfo("Stand-in GPU", "8.7"))
    monkeypatch.setattr(service, "capabilities_of", lambda trt: caps)
    trt = SimpleNamespace(Logger=type("Logger", (), {"WARNING": 2, "__init__": lambda self, level: None}))
    service._build(bundle, plan, trt)
    record = json.loads((bundle.root / "engines" / "t" / fingerprint.FINGERPRINT_FILE).read_text())
    assert record["weights"]["random"] is True and record["weights"]["notice"] == random_weights_notice(bundle.manifest["source"])
