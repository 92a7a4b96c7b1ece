"""Export verification sized by the cost model (issue 15): the plan, its record, every output compared,
and the rough edges around it (a size that cannot fit in memory, a pickled checkpoint)."""

from __future__ import annotations

import pickle

import pytest
from click.testing import CliRunner

from vitdeploy.cli import main
from vitdeploy.costs import check_fits_memory, largest_square_that_fits, memory_estimate
from vitdeploy.errors import UserError
from vitdeploy.spec import ViTSpec

DINO_S = ViTSpec(image_size=(518, 518), patch_size=(14, 14), embed_dim=384, depth=12, num_heads=6, num_classes=0)
VIT_B = ViTSpec(image_size=(224, 224), patch_size=(16, 16), embed_dim=768, depth=12, num_heads=12, num_classes=1000)
VIT_T = ViTSpec(image_size=(224, 224), patch_size=(16, 16), embed_dim=192, depth=12, num_heads=3, num_classes=1000)
DYNAMIC_518 = [(518, 518), (462, 462), (574, 574), (518, 602)]
DYNAMIC_224 = [(224, 224), (160, 160), (288, 288), (224, 320)]


def test_plan_keeps_small_models_whole_and_cuts_large_ones_to_the_minimum():
    from vitdeploy.exporters.verify import DEFAULT_BUDGET_GMACS, MIN_IMAGES, plan_verification

    tiny = plan_verification(VIT_T, DYNAMIC_224, 16)
    assert [p.images for p in tiny] == [16] * 4 and all(p.batch == 16 for p in tiny)  # what was asked fits
    dino = plan_verification(DINO_S, DYNAMIC_518, 64)
    assert [p.images for p in dino] == [MIN_IMAGES] * 4  # ~200 GMAC per image set: only the minimum fits
    assert all(p.batch == MIN_IMAGES for p in dino)
    for spec in (VIT_T, VIT_B):
        plan = plan_verification(spec, DYNAMIC_224, 64)
        assert MIN_IMAGES <= plan[0].images < 64 and len({p.images for p in plan}) == 1  # the same count at every size
        total = sum(p.images * p.gmacs_per_image for p in plan)
        assert total <= DEFAULT_BUDGET_GMACS * 1.01 or plan[0].images == MIN_IMAGES
    assert plan_verification(VIT_T, DYNAMIC_224, 64)[0].images > plan_verification(VIT_B, DYNAMIC_224, 64)[0].images


def test_plan_batch_follows_the_memory_estimate():
    from vitdeploy.exporters.verify import plan_verification

    plan = plan_verification(DINO_S, [(574, 574)], 64, budget_gmacs=1e6, memory_budget_mb=400)
    per_image = memory_estimate(DINO_S, 574, 574).total_bytes / 2**20
    assert plan[0].images == 64 and plan[0].batch == int(400 // per_image) >= 2
    # never fewer images than asked for when the caller asks for fewer than the minimum
    assert plan_verification(DINO_S, [(518, 518)], 1)[0].images == 1


def test_memory_estimate_counts_materialised_attention_scores():
    est = memory_estimate(DINO_S, 518, 518, batch=2)
    length = 37 * 37 + 1
    assert est.attention_bytes == 2 * 2 * 6 * length * length * 4
    assert est.total_bytes > est.attention_bytes


def test_sizes_that_cannot_fit_are_refused_with_the_numbers():
    with pytest.raises(UserError) as err:
        check_fits_memory(VIT_B, 16000, 16000, what="--resolution", available=8 * 2**30)
    message = str(err.value)
    assert "--resolution 16000x16000 needs about" in message and "TiB" in message and "8.0 GiB available" in message
    fits = largest_square_that_fits(VIT_B, 8 * 2**30)
    assert fits and fits % 16 == 0 and f"at most about {fits}x{fits}" in message
    assert memory_estimate(VIT_B, fits, fits).total_bytes <= 8 * 2**30 < memory_estimate(VIT_B, fits + 16, fits + 16).total_bytes
    check_fits_memory(VIT_B, 384, 384, available=8 * 2**30)  # an ordinary size passes


def test_export_refuses_a_resolution_that_cannot_fit_in_one_line(tmp_path):
    res = CliRunner().invoke(main, ["export", "-o", str(tmp_path / "b"), "--resolution", "100000"])
    assert res.exit_code == 1
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --resolution 100000x100000 needs about"), res.output
    assert "available" in lines[0] and not (tmp_path / "b").exists()


@pytest.mark.slow
def test_pickled_checkpoint_is_refused_without_a_stray_warning(tmp_path):
    import datetime
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "ckpt.pt"
    with open(path, "wb") as fh:  # a plain pickle (protocol 4) of a class the weights-only unpickler refuses
        pickle.dump({"weight": 1, "obj": datetime.date(2020, 1, 1)}, fh, protocol=4)
    # a real process: pytest's own warning capture would hide the line the user saw
    cli = Path(sys.executable).with_name("vitdeploy")
    proc = subprocess.run([str(cli), "export", "timm:vit_tiny_patch16_224", "--checkpoint", str(path), "-o", str(tmp_path / "b")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot be loaded without executing code" in lines[0], lines


@pytest.mark.slow
def test_digits_verification_is_unchanged_and_records_its_plan(digits_bundle):
    record = digits_bundle.manifest["records"]["export_check"]
    assert record["passed"], record["failures"]
    assert record["outputs"] == ["logits", "probs"]
    (size,) = record["sizes"]
    assert size["images"] == 64 and size["batch"] == 16 and size["max_abs"] <= 1e-4 and size["top1_agreement"] == 1.0
    assert set(size["outputs"]) == {"logits", "probs"} and all(o["passed"] for o in size["outputs"].values())
    assert size["torch_s"] > 0 and size["ort_s"] > 0
    assert record["plan"]["sizes"][0]["images"] == 64


@pytest.mark.slow
def test_verification_compares_every_output_and_fails_on_a_wrong_one(digits_bundle, monkeypatch):
    """An output the graph returns is compared with PyTorch's of the same name; a graph output with
    no reference is a failure, not silently skipped."""
    from vitdeploy.exporters import loaded_for_bundle
    from vitdeploy.exporters.torch_runner import TorchRunner
    from vitdeploy.exporters.verify import verify_export

    variant = loaded_for_bundle(digits_bundle)
    real_run = TorchRunner._run

    def shifted(self, batch):
        out = real_run(self, batch)
        out["probs"] = out["probs"] + 1e-3  # a PyTorch side that disagrees on one output only
        return out

    monkeypatch.setattr(TorchRunner, "_run", shifted)
    record = verify_export(digits_bundle, variant, 4, lambda _m: None)
    assert not record["passed"]
    assert any("output probs: max |d|" in f for f in record["failures"])
    assert all(s["outputs"]["logits"]["passed"] for s in record["sizes"])

    monkeypatch.setattr(TorchRunner, "outputs", lambda self: ["logits"])
    record = verify_export(digits_bundle, variant, 2, lambda _m: None)
    assert any("graph output 'probs' has no PyTorch reference" in f for f in record["failures"])
