"""`vitdeploy debug-precision`: units in ViT terms, damage alone, the keep-set search, the recipe.

The planted fault (blocks.2's LayerNorms carry 4 channels x 512, the next Linears' input columns /
512: fp32 unchanged) must come out first, and the recipe it writes must pass through
`calibrate --recipe`. The massive-residual variant with the range pass off shows the fp16 side.
The search itself is checked on a fake trial runner whose answer is known.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from precision_fixtures import fault_bundle, massive_bundle, variant_checkpoints  # noqa: F401
from vitdeploy.bundle import Bundle
from vitdeploy.calibration.debug_precision import search_keep
from vitdeploy.gate import Gate
from vitdeploy.calibration.precision_units import Trial, Unit, compact_keep, damage, int8_units
from vitdeploy.cli import main
from vitdeploy.errors import CheckFailed


def test_units_of_the_digits_graph(digits_bundle) -> None:
    model = onnx.load(str(digits_bundle.artifact_path("fp32")))
    units = int8_units(model, digits_bundle.manifest["graph"])
    cells = {u.name: u for u in units["cells"]}
    assert len(cells) == 22 and sum(u.layers for u in cells.values()) == 26
    assert [u.name for u in units["cells"]][:3] == ["patch_embed", "blocks.0/qkv", "blocks.0/attention-matmuls"]
    assert cells["blocks.1/attention-matmuls"].layers == 2 and cells["head"].layers == 1
    assert [u.name for u in units["blocks"]] == [f"blocks.{i}" for i in range(4)] and all(u.layers == 6 for u in units["blocks"])
    assert [u.name for u in units["roles"]] == ["qkv", "attention-matmuls", "attn-proj", "mlp-fc1", "mlp-fc2"]
    assert compact_keep([cells[f"blocks.3/{r}"] for r in ("qkv", "attention-matmuls", "attn-proj", "mlp-fc1", "mlp-fc2")]
                        + [cells["head"]], units["cells"]) == ["blocks.3", "head"]


def test_damage_is_the_share_of_the_gate() -> None:
    gate = Gate()
    assert damage(gate, 0.99, {"top1_agreement": 1.0, "cosine_p1": 1.0, "accuracy": 0.99}) == 0.0
    assert damage(gate, 0.99, {"top1_agreement": 0.99, "cosine_p1": 1.0, "accuracy": 0.99}) == pytest.approx(1.0)
    assert damage(gate, 0.99, {"top1_agreement": 1.0, "cosine_p1": 0.995, "accuracy": 0.985}) == pytest.approx(0.5)
    assert damage(gate, 0.99, {"top1_agreement": 1.0, "cosine_p1": 1.0, "accuracy": 0.99}, overflow=3) == 10.0


class _FakeTrials:
    """Passes exactly when every unit in ``needed`` is kept; 'empty' when all are kept."""

    def __init__(self, units: list[Unit], needed: set[str]):
        self.units, self.needed, self.calls = units, needed, 0

    def keep(self, kept: list[Unit]) -> Trial:
        self.calls += 1
        names = {u.name for u in kept}
        empty = len(names) == len(self.units)
        ok = self.needed <= names and not empty
        return Trial(", ".join(sorted(names)), ok, [] if ok else ["fails"], {"top1_agreement": 1.0, "cosine_p1": 1.0}, 0.0 if ok else 2.0,
                     len(self.units) - len(names), empty=empty)


def _units(n: int) -> list[Unit]:
    return [Unit(f"blocks.{i}/qkv", "cell", frozenset({f"n{i}"}), 1) for i in range(n)]


def test_search_finds_the_needed_units_and_drops_the_rest() -> None:
    ranked = _units(12)
    fake = _FakeTrials(ranked, {"blocks.0/qkv", "blocks.5/qkv"})
    kept, best, steps = search_keep(fake, ranked, lambda _m: None)
    assert {u.name for u in kept} == {"blocks.0/qkv", "blocks.5/qkv"} and best.passed
    assert fake.calls <= 4 + 6  # bisection over 12 + one drop try per kept unit of the prefix
    with pytest.raises(CheckFailed, match="even with"):
        search_keep(_FakeTrials(ranked[:3], {"nothing-can-pass"}), ranked[:3], lambda _m: None)


@pytest.mark.slow
def test_int8_names_the_planted_block_first_and_its_recipe_passes(fault_bundle, copy_bundle) -> None:
    root = copy_bundle(fault_bundle)
    runner = CliRunner()
    result = runner.invoke(main, ["debug-precision", str(root), "--precision", "int8", "--data", "digits:train", "--samples", "128",
                                  "--eval-data", "digits:test", "--threads", "1"])
    assert result.exit_code == 0, result.output
    report = json.loads((root / "reports" / "debug-precision-int8.json").read_text())
    assert not report["baseline"]["passed"]  # the fault fails the whole-INT8 graph
    assert report["ranking"]["blocks"][0]["unit"] == "blocks.2" and report["ranking"]["blocks"][0]["damage"] >= 1.0
    assert all(b["damage"] < 1.0 for b in report["ranking"]["blocks"][1:])
    assert report["ranking"]["cells"][0]["unit"].startswith("blocks.2/")
    assert report["kept"] and all(k.startswith("blocks.2") for k in report["kept"]) and report["result"]["passed"]
    assert report["result"]["reduced_layers"] >= 24
    png = (root / "reports" / "debug-precision-int8.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    recipe = root / "reports" / "precision-recipe-int8.json"
    assert "keep in higher precision: blocks.2" in result.output and f"--recipe {recipe}" in result.output
    again = runner.invoke(main, ["calibrate", str(root), "--recipe", str(recipe), "--data", "digits:train", "--samples", "128",
                                 "--eval-data", "digits:test"])
    assert again.exit_code == 0, again.output
    record = Bundle.open(root).artifact_record("int8")
    assert record["exclusions"]["blocks"] == json.loads(recipe.read_text())["keep_fp32"]["blocks"]
    assert record["evaluation"]["gate"]["passed"] and record["placement"]["quantized_layers"] == report["result"]["reduced_layers"]


@pytest.mark.slow
def test_fp16_search_on_the_massive_stream_and_convert_reproduces_it(massive_bundle, copy_bundle) -> None:
    root = copy_bundle(massive_bundle)
    runner = CliRunner()
    result = runner.invoke(main, ["debug-precision", str(root), "--precision", "fp16", "--data", "digits:train", "--eval-data",
                                  "digits:test", "--eval-limit", "120", "--data-max", "inf"])
    assert result.exit_code == 0, result.output
    report = json.loads((root / "reports" / "debug-precision-fp16.json").read_text())
    assert "past 65504" in "; ".join(report["baseline"]["failures"])
    overflowing = [b for b in report["ranking"]["blocks"] if b["overflow_tensors"]]
    assert overflowing and report["result"]["passed"] and report["result"]["reduced_layers"] >= 1
    recipe = root / "reports" / "precision-recipe-fp16.json"
    converted = runner.invoke(main, ["convert", str(root), "--precision", "fp16", "--recipe", str(recipe), "--data-max", "inf",
                                     "--eval-data", "digits:test"])
    assert converted.exit_code == 0, converted.output
    assert Bundle.open(root).artifact_record("fp16")["keep_fp32"] == json.loads(recipe.read_text())["keep_fp32"]


@pytest.mark.slow
def test_fp16_with_the_range_pass_needs_nothing_more(massive_bundle, copy_bundle) -> None:
    root = copy_bundle(massive_bundle)
    result = CliRunner().invoke(main, ["debug-precision", str(root), "--precision", "fp16", "--data", "digits:train", "--eval-data",
                                       "digits:test", "--eval-limit", "90", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["baseline"]["passed"] and report["kept"] == [] and report["search"] == []


def test_needs_labelled_data_and_a_bundle(fault_bundle, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["debug-precision", str(fault_bundle.root), "--precision", "int8", "--data", "digits:train"])
    assert result.exit_code == 1 and "labelled held-out images" in result.output and len(result.output.strip().splitlines()) == 1
    result = CliRunner().invoke(main, ["debug-precision", str(fault_bundle.root)])
    assert result.exit_code == 2 and "--precision" in result.output
    help_text = CliRunner().invoke(main, ["debug-precision", "--help"]).output
    assert "Example:" in help_text
