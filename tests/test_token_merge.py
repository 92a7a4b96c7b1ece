"""Token merging (issue 40): the PyTorch reference of the merge, its schedule and cost terms (fast),
and the merged graph (slow: exports) against that reference, `check`, and the TensorRT parser rules."""

from __future__ import annotations

import json

import pytest
import torch

from vitdeploy.costs import merge_costs, merged_patch_counts, parse_merge_schedule, vit_costs
from vitdeploy.errors import UsageError, UserError
from vitdeploy.spec import ViTSpec


def tiny_spec(**changes) -> ViTSpec:
    base = dict(image_size=(32, 32), patch_size=(4, 4), embed_dim=32, depth=3, num_heads=4, num_classes=5, mlp_ratio=2.0)
    return ViTSpec(**{**base, **changes})


def tiny_loaded(**changes):
    from vitdeploy.exporters.adapters.base import named_adapter
    from vitdeploy.exporters.sources import LoadedModel
    from vitdeploy.model import VisionTransformer

    torch.manual_seed(0)
    spec = tiny_spec(**changes)
    model = VisionTransformer(spec).eval()
    with torch.no_grad():  # init leaves prefix tokens ~0 and tables tiny: make every token distinct
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return LoadedModel(model, spec, {"mean": [0.5] * 3, "std": [0.5] * 3}, [str(i) for i in range(spec.num_classes)],
                       {"kind": "ref", "name": "tiny"}, adapter=named_adapter("reference-vit"))


# -- schedule and costs --------------------------------------------------------------------------
def test_schedule_constant_per_block_and_refusals():
    assert parse_merge_schedule("8", 3) == (8, 8, 8)
    assert parse_merge_schedule("8,4,0", 3) == (8, 4, 0)
    assert parse_merge_schedule(None, 2) == (0, 0)
    for bad in ("8,4", "x", "-1"):
        with pytest.raises(UsageError):
            parse_merge_schedule(bad, 3)
    spec = tiny_spec()  # 64 patches
    assert merged_patch_counts(spec, (16, 16, 8)) == [64, 48, 32, 24]
    with pytest.raises(UserError, match="block 2 has 16 patch tokens and can merge at most 8"):
        merged_patch_counts(spec, (32, 16, 9))


def test_merge_costs_count_the_smaller_sequences_and_the_merge():
    spec = ViTSpec(image_size=(224, 224), patch_size=(16, 16), embed_dim=768, depth=12, num_heads=12, num_classes=1000)
    zero = merge_costs(spec, (0,) * 12)
    assert zero.macs_total == vit_costs(spec).macs_total and zero.macs_merge == 0
    r13 = merge_costs(spec, (13,) * 12, batch=8)
    assert r13.tokens_per_block[0] == 197 and r13.tokens_per_block[-1] == 197 - 12 * 13
    # block 0: 98 x 98 key pairs of width 768, and 13 x 98 one-hot sums of 768 values + the size
    assert r13.macs_merge == sum(8 * ((n + 1) // 2) * (n // 2) * 768 + 8 * 13 * (n // 2) * 769
                                 for n in range(196, 196 - 12 * 13, -13))
    assert r13.macs_total < vit_costs(spec, batch=8).macs_total and 1.6 < r13.predicted_speedup < 1.8


# -- the merge on tensors ------------------------------------------------------------------------
def test_merge_keeps_prefix_rows_and_sizes_sum_to_patches():
    from vitdeploy.exporters.token_merge import merge_tokens

    torch.manual_seed(1)
    x, keys = torch.randn(2, 2 + 20, 8), torch.randn(2, 2 + 20, 4)
    keys[:, :2] = keys[:, 2:4]  # prefix keys equal to patch keys: still never merged
    out, size = merge_tokens(x, torch.ones(2, 22, 1), keys, 6, prefix=2)
    assert out.shape == (2, 16, 8) and torch.equal(out[:, :2], x[:, :2])
    assert torch.equal(size[:, :2], torch.ones(2, 2, 1)) and torch.equal(size[:, 2:].sum(dim=1), torch.full((2, 1), 20.0))
    # the merged tokens are size-weighted means: the size-weighted sum of the patch tokens is unchanged
    assert torch.allclose((out[:, 2:] * size[:, 2:]).sum(dim=1), x[:, 2:].sum(dim=1), atol=1e-5)


def test_merge_picks_the_most_similar_pairs():
    from vitdeploy.exporters.token_merge import merge_tokens

    keys = torch.eye(8).unsqueeze(0).repeat(1, 1, 1)  # 8 orthogonal patch keys, no prefix
    keys[0, 4] = keys[0, 1]  # A token 4 (alternate split: A = 0,2,4,6) duplicates B token 1
    x = torch.arange(8.0).view(1, 8, 1)
    out, size = merge_tokens(x, torch.ones(1, 8, 1), keys, 1, prefix=0)
    # kept A tokens first (0, 2, 6 in some order), then B = 1, 3, 5, 7 with token 4 merged into 1
    assert sorted(out[0, :3, 0].tolist()) == [0.0, 2.0, 6.0]
    assert out[0, 3:, 0].tolist() == [2.5, 3.0, 5.0, 7.0] and size[0, 3:, 0].tolist() == [2.0, 1.0, 1.0, 1.0]


def test_proportional_attention_makes_a_merged_duplicate_count_twice():
    """Two identical tokens merged into one of size 2 attend and are attended to as the two did."""
    from vitdeploy.exporters.token_merge import _attention

    loaded = tiny_loaded()
    attn = loaded.model.blocks[0].attn
    torch.manual_seed(2)
    tokens = torch.randn(1, 6, 32)
    doubled = torch.cat([tokens, tokens[:, 5:]], dim=1)  # token 5 twice
    with torch.no_grad():
        full, _ = _attention(attn, doubled, None)
        merged, _ = _attention(attn, tokens, torch.tensor([1.0, 1, 1, 1, 1, 2]).view(1, 6, 1))
    assert torch.allclose(full[:, :6], merged, atol=1e-5)


# -- the merged model -----------------------------------------------------------------------------
@pytest.mark.parametrize("changes", [{}, {"global_pool": "avg", "class_token": False, "pos_embed_prefix_rows": 0},
                                     {"num_distill_tokens": 1, "num_reg_tokens": 2, "pos_embed_prefix_rows": 0}])
def test_reference_vit_merged(changes):
    from vitdeploy.exporters.token_merge import with_token_merge

    loaded = tiny_loaded(**changes)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        plain = loaded.model(x)
        assert torch.equal(with_token_merge(loaded, (0, 0, 0), 32, 32).model(x), plain)  # r = 0: the model exactly
        merged = with_token_merge(loaded, (16, 8, 4), 32, 32)
        out = merged.model(x)
    assert out.shape == plain.shape and not torch.allclose(out, plain, atol=1e-4)  # the merge changed the work
    record = merged.extra["token_merge"]
    prefix = loaded.spec.num_prefix_tokens
    assert record["tokens_per_block"] == [64 + prefix, 48 + prefix, 40 + prefix, 36 + prefix]
    assert record["schedule"] == [16, 8, 4] and record["macs"] < record["macs_unmerged"]


def test_merged_blocks_never_merge_prefix_tokens_and_carry_sizes():
    from vitdeploy.exporters.token_merge import with_token_merge

    loaded = tiny_loaded(num_distill_tokens=1, num_reg_tokens=2, pos_embed_prefix_rows=0)
    merged = with_token_merge(loaded, (16, 16, 0), 32, 32).model
    seen = []
    for block in merged.blocks:
        block.register_forward_hook(lambda _m, _i, out: seen.append(out))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        embedded = merged.embed(x)
        merged(x)
    for i, (tokens, size) in enumerate(seen):
        assert size[:, :4].eq(1).all() and size[:, 4:].sum(dim=1).eq(64).all()
    # the prefix rows leave block 0 as the unmerged block 0 makes them (merging touches patches only)
    with torch.no_grad():
        assert torch.allclose(seen[0][0][:, :4], loaded.model.blocks[0](embedded)[:, :4], atol=1e-5)


def test_refusals_are_one_line():
    from vitdeploy.exporters import ExportOptions
    from vitdeploy.exporters.token_merge import refuse_merge_options, with_token_merge

    loaded = tiny_loaded()
    with pytest.raises(UserError, match="can merge at most"):
        with_token_merge(loaded, (32, 32, 32), 32, 32)
    for opts, what in ((ExportOptions(dynamic_resolution=True, merge_tokens="4"), "dynamic-resolution"),
                       (ExportOptions(variable_size=True, merge_tokens="4"), "variable-size"),
                       (ExportOptions(outputs=("logits", "patch_grid"), merge_tokens="4"), "patch grid")):
        with pytest.raises(UsageError, match=what):
            refuse_merge_options(opts)
    from vitdeploy.exporters.adapters.base import named_adapter

    loaded.adapter = named_adapter("timm-beit")  # a family whose adapter does not take the merge
    with pytest.raises(UserError, match="applies to timm ViT/DeiT and the reference ViT; ref:tiny is a timm-beit model"):
        with_token_merge(loaded, (4, 4, 4), 32, 32)


def test_cli_costs_shows_tokens_per_block(tmp_path):
    from click.testing import CliRunner

    from vitdeploy.cli import main

    result = CliRunner().invoke(main, ["costs", "builtin:digits", "--merge-tokens", "8", "--merge-tokens", "16,8,4,2", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["token_merge"][0]["schedules"]
    assert rows[0]["tokens_per_block"] == [65, 57, 49, 41, 33] and rows[1]["tokens_per_block"] == [65, 49, 41, 37, 35]
    bad = CliRunner().invoke(main, ["costs", "builtin:digits", "--merge-tokens", "30"])
    assert bad.exit_code != 0 and "can merge at most" in bad.output and "Traceback" not in bad.output


# -- the merged graph (exports: slow) -------------------------------------------------------------
def _graph_vs_reference(bundle, schedule):
    """ORT's outputs of the merged graph against the merged PyTorch reference, rebuilt from the manifest."""
    import numpy as np

    from vitdeploy.compare import reference_spread
    from vitdeploy.exporters.torch_runner import TorchRunner
    from vitdeploy.preprocess import random_images
    from vitdeploy.runtime.ort import OrtRunner

    assert bundle.manifest["token_merge"]["schedule"] == list(schedule)
    images = random_images(4, 224, 224, seed=3)
    runner = TorchRunner.from_bundle(bundle)
    sizes = []  # each merged block returns (tokens, size): how many patches every row stands for
    for block in runner.model.blocks:
        block.register_forward_hook(lambda _m, _i, out: sizes.append(out[1]))
    ref = runner.run({"images": images})["logits"]
    got = OrtRunner(bundle.artifact_path("fp32")).run({"images": images})["logits"]
    assert np.abs(ref - got).max() <= 1e-4 * max(1.0, reference_spread(ref))
    return ref, sizes


def _prefix_never_merged(sizes, prefix, patches=196):
    """Every block's size vector: each prefix row stands for itself alone, the patch rows for all patches."""
    assert sizes and all(size[:, :prefix].eq(1).all() and size[:, prefix:].sum(dim=1).eq(patches).all() for size in sizes)


def _lint_passes(bundle, tmp_path):
    from click.testing import CliRunner

    from vitdeploy.cli import main

    for version in ("10.3", "11.0", "8.6", "8.5"):
        result = CliRunner().invoke(main, ["build-engine", str(bundle.root), "--dry-run", "--lint", "--trt-version", version,
                                           "--precision", "fp32"])
        assert result.exit_code == 0, f"{version}: {result.output}"
        assert "nothing it cannot parse" in result.output or "every finding is rewritten by the lowering" in result.output


# The real timm architectures at their real width, patch and resolution (ViT-S/16 and DeiT-S distilled at
# 224: 196 patches, the same merge sizes as the full models), cut to SHALLOW blocks so the two exports stay
# cheap; LayerScale (init_values) puts the ls1/ls2 path of the merged block in the graph too. The full-depth
# (12-block) parity was verified by hand: docs/TOKEN_MERGING.md, "Verifying the full-depth graphs".
SHALLOW = 4
SHALLOW_KWARGS = {"depth": SHALLOW, "init_values": 0.5}


@pytest.mark.slow
def test_vit_s16_r8_graph_matches_merged_reference_and_passes_check_and_lint(export_cached, tmp_path):
    """ViT-S/16 width at 224, r = 8 in every block: the merged graph equals the merged PyTorch reference
    relative to the output spread, `check` passes, and the TensorRT lint passes (10.x/11.x as is, 8.5/8.6
    after the lowering). Depth cut to SHALLOW blocks for cost; full depth: see the module note above."""
    from vitdeploy.checks.run import CheckOptions, run_check

    bundle = export_cached("timm:vit_small_patch16_224", random_init=True, model_kwargs=SHALLOW_KWARGS, merge_tokens="8",
                           check_images=8)
    ref, sizes = _graph_vs_reference(bundle, (8,) * SHALLOW)
    _prefix_never_merged(sizes, prefix=1)
    assert bundle.manifest["token_merge"]["tokens_per_block"][-1] == 197 - 8 * SHALLOW
    report = run_check(bundle.root, CheckOptions(random_count=8, batch=4, localise="never", write_report=False))
    assert report["passed"], report.get("failures")
    _lint_passes(bundle, tmp_path)
    assert ref.shape == (4, 1000)


@pytest.mark.slow
def test_deit_s_distilled_decreasing_schedule_graph_matches_merged_reference(export_cached):
    """DeiT-S distilled width at 224 (CLS + DIST prefix) with a decreasing schedule: the graph equals the merged
    reference, the export's own check passed, and neither prefix token is ever merged. Depth cut to SHALLOW
    blocks for cost; full depth: see the module note above."""
    schedule = (16, 12, 8, 4)
    bundle = export_cached("timm:deit_small_distilled_patch16_224", random_init=True, model_kwargs=SHALLOW_KWARGS,
                           merge_tokens=",".join(map(str, schedule)), check_images=8)
    _, sizes = _graph_vs_reference(bundle, schedule)
    _prefix_never_merged(sizes, prefix=2)  # CLS and DIST
    assert bundle.manifest["token_merge"]["tokens_per_block"] == [198, 182, 170, 162, 158]
    assert bundle.manifest["records"]["export_check"]["passed"]


# -- profile --merge-tokens ------------------------------------------------------------------------
def test_profile_plans_one_cell_per_r_with_merged_costs(digits_bundle):
    from vitdeploy.profile import SweepConfig, plan_cells
    from vitdeploy.profile.sweep import cell_cost

    config = SweepConfig(batches=[1, 4], backends=["ort", "torch"], precisions=["fp32"], merge_tokens=[0, 4, 8], iterations=3)
    cells = plan_cells(digits_bundle, config)
    ort = [c for c in cells if c.backend == "ort"]
    assert [(c.merge, c.batch) for c in ort] == [(0, 1), (0, 4), (4, 1), (4, 4), (8, 1), (8, 4)]
    assert all(c.skip_reason and "--merge-tokens" in c.skip_reason for c in cells if c.backend == "torch")
    macs = [cell_cost(digits_bundle, c, None).macs_total for c in ort if c.batch == 1]
    assert macs[0] == vit_costs(digits_bundle.spec).macs_total and macs[0] > macs[1] > macs[2]
    assert "r4" in ort[2].label
    with pytest.raises(UserError, match="can merge at most"):
        plan_cells(digits_bundle, SweepConfig(merge_tokens=[0, 40], iterations=3))


@pytest.mark.slow
def test_profile_merge_sweep_with_accuracy(digits_bundle, copy_bundle):
    from vitdeploy.profile import SweepConfig, profile_bundle

    root = copy_bundle(digits_bundle)
    config = SweepConfig(batches=[8], precisions=["fp32"], merge_tokens=[0, 4], iterations=6, rounds=2, warmup=1, threads=1)
    outcome = profile_bundle(root, config, accuracy="digits:test")
    rows = {r["merge_r"]: r for r in outcome.result.rows}
    assert set(rows) == {0, 4} and all(r["status"] == "ok" for r in rows.values())
    assert rows[4]["graph"].startswith("variants/32x32-r4") and rows[0]["graph"] == "model.onnx"
    assert rows[4]["macs"] < rows[0]["macs"] and rows[4]["agreement_unmerged"] > 0.9 and rows[0]["accuracy"] > 0.9
    header = (root / "reports" / "profile.csv").read_text().splitlines()[0].split(",")
    assert "merge_r" in header and "agreement_unmerged" in header and outcome.paths.get("png") is not None
