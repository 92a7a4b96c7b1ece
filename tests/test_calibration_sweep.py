"""`calibrate --sweep`: recipes scored on held-out digits, the table, and the choice rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from vitdeploy.bundle import Bundle
from vitdeploy.calibration.exclusions import Exclusions
from vitdeploy.calibration.qdq import Recipe
from vitdeploy.calibration.sweep import PRESETS, Candidate, choose
from vitdeploy.cli import main


@pytest.mark.slow
def test_sweep_on_digits_records_table_and_choice(digits_bundle, copy_bundle) -> None:
    root = copy_bundle(digits_bundle)
    result = CliRunner().invoke(main, ["calibrate", str(root), "--sweep", "--sweep-methods", "minmax", "--samples", "64", "--smooth", "none"])
    assert result.exit_code == 0, result.output
    assert "INT8 sweep" in result.output and "attention-matmuls" in result.output and "sweep chose minmax" in result.output
    record = Bundle.open(root).artifact_record("int8")
    assert record["selection"]["mode"] == "sweep"
    rows = record["selection"]["candidates"]
    assert [r["exclusions"] for r in rows] == list(PRESETS)
    chosen = record["selection"]["chosen"]
    row = next(r for r in rows if r["exclusions"] == chosen["exclusions"])
    assert row["passed"]
    # TensorRT target: the most INT8 layers among the recipes inside the gate
    assert row["int8_layers"] == max(r["int8_layers"] for r in rows if r["passed"])
    assert record["exclusions"]["roles"] == list(PRESETS[chosen["exclusions"]].roles)
    # the chosen graph is the one written, with its own scores
    assert record["evaluation"]["reference"]["top1_agreement"] == row["reference"]["top1_agreement"]
    assert all(r["latency_ms_batch1"] > 0 for r in rows) and record["selection"]["fp32_latency_ms_batch1"] > 0
    # roles resolve to the expected layers of a depth-T ViT
    depth = Bundle.open(root).spec.depth
    layers = {r["exclusions"]: r["int8_layers"] for r in rows}
    total = layers["none"]
    assert total == 6 * depth + 2
    assert layers["attention-matmuls"] == total - 2 * depth and layers["mlp-fc2"] == total - depth
    assert layers["head"] == total - 1 and layers["patch-embed+head"] == total - 2


def test_sweep_needs_labelled_data(digits_bundle, copy_bundle, tmp_path: Path) -> None:
    import numpy as np

    root = copy_bundle(digits_bundle)
    np.save(tmp_path / "x.npy", np.zeros((20, 32, 32, 3), np.uint8))
    result = CliRunner().invoke(main, ["calibrate", str(root), "--sweep", "--eval-data", str(tmp_path / "x.npy"), "--sweep-methods", "minmax"])
    assert result.exit_code == 1 and "labelled held-out images" in result.output
    assert not (root / "model.int8.onnx").exists()


def _cand(name: str, layers: int, agree: float, acc: float, ms: float, passed: bool = True) -> Candidate:
    scores = {k: {"accuracy": acc, "top1_agreement": agree} for k in ("reference", "this_cpu")}
    quant = {"placement": {"quantized_layers": layers}, "excluded_nodes": []}
    return Candidate(name, Recipe("minmax", "tensorrt", Exclusions()), Path(name), quant, {}, scores, ms, passed)


def test_choice_rule_per_target() -> None:
    full = _cand("none", 38, 0.990, 0.985, 1.00)
    partial = _cand("attention-matmuls", 26, 1.000, 0.994, 0.80)
    almost = _cand("head", 37, 0.995, 0.990, 0.98)
    failing = _cand("mlp-fc2", 40, 0.900, 0.900, 0.50, passed=False)
    cands = [full, partial, almost, failing]
    assert choose(cands, "tensorrt") is full  # coverage first, the failing one never
    assert choose(cands, "cpu") is partial  # fastest within the gate
    tie = _cand("patch-embed+head", 36, 0.999, 0.99, 0.82)  # within 5% of the fastest: agreement decides
    assert choose([partial, tie], "cpu") is partial
    assert choose([failing], "tensorrt") is None
    first, same_but_faster = _cand("none", 38, 1.0, 0.99, 0.9), _cand("none", 38, 1.0, 0.99, 0.3)
    assert choose([first, same_but_faster], "tensorrt") is first  # a full tie is not decided by CPU noise


def test_exclusion_names_are_validated() -> None:
    from vitdeploy.errors import UserError

    with pytest.raises(UserError, match="only MatMul, Gemm, Conv"):
        Exclusions(op_types=("Add",))
    with pytest.raises(UserError, match="known roles"):
        Exclusions(roles=("softmax",))
