"""The cost model against the chapter's worked numbers (Table 39.2, §39.5) and against timm."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from vitdeploy.cli import main
from vitdeploy.costs import crossover_seq_len, param_count, vit_costs
from vitdeploy.errors import UserError
from vitdeploy.spec import ViTSpec, nearest_valid, parse_resolution


def base(patch: int, size: int = 224) -> ViTSpec:
    return ViTSpec(image_size=(size, size), patch_size=(patch, patch), embed_dim=768, depth=12, num_heads=12, num_classes=1000)


@pytest.mark.parametrize("patch,grid,n,l,l2", [(32, 7, 49, 50, 2500), (16, 14, 196, 197, 38809), (8, 28, 784, 785, 616225)])
def test_table_39_2(patch, grid, n, l, l2):
    c = vit_costs(base(patch))
    assert c.grid == (grid, grid) and c.num_patches == n and c.seq_len == l and c.attn_scores_per_head == l2


def test_384_with_patch_16():
    c = vit_costs(base(16), 384, 384)
    assert (c.grid, c.num_patches, c.seq_len, c.attn_scores_per_head) == ((24, 24), 576, 577, 332929)


def test_crossover_is_2_plus_rho_times_d():
    assert crossover_seq_len(base(16)) == 4608
    # at the crossover the attention matmuls cost exactly the projections + MLP
    spec = base(16)
    length = 4608
    d, rho = spec.embed_dim, spec.mlp_ratio
    assert 2 * length * length * d == 4 * length * d * d + 2 * length * rho * d * d


def test_mac_terms_follow_the_formula():
    spec = base(16)
    c = vit_costs(spec, batch=2)
    b, length, d = 2, 197, 768
    assert c.macs_per_layer_linear == 4 * b * length * d * d + 2 * b * length * 4 * d * d
    assert c.macs_per_layer_attention == 2 * b * length * length * d
    assert c.macs_patch_embed == b * 196 * (3 * 16 * 16) * d == b * 3 * 224 * 224 * d  # BNFd = BCHWd
    assert c.macs_total == c.macs_patch_embed + 12 * c.macs_per_layer + b * d * 1000
    assert c.flops_total == 2 * c.macs_total
    assert c.attn_score_elements == b * 12 * length * length and c.attn_score_bytes_fp16 == 2 * c.attn_score_elements
    assert 0 < c.attention_share < 0.1  # at 224 the quadratic term is small for ViT-B


def test_patch_projection_macs_do_not_depend_on_patch_area():
    assert vit_costs(base(32)).macs_patch_embed == vit_costs(base(16)).macs_patch_embed == vit_costs(base(8)).macs_patch_embed


@pytest.mark.parametrize("name,kwargs", [("vit_tiny_patch16_224", {}), ("deit_tiny_distilled_patch16_224", {}),
                                         ("vit_small_patch16_224", {"class_token": False, "global_pool": "avg"})])
def test_param_count_matches_timm(name, kwargs):
    timm = pytest.importorskip("timm")
    from vitdeploy.exporters.sources import spec_from_timm

    model = timm.create_model(name, pretrained=False, num_classes=10, **kwargs)
    spec = spec_from_timm(model, name)
    assert param_count(spec) == sum(p.numel() for p in model.parameters())


def test_resolution_parsing_and_nearest_sizes():
    assert parse_resolution("384") == (384, 384) and parse_resolution("224x320") == (224, 320)
    assert nearest_valid(225, 16) == [224, 240] and nearest_valid(224, 16) == [224]
    with pytest.raises(UserError, match=r"width 225 is not a multiple of the patch size 16 \(nearest valid: 224 or 240\)"):
        base(16).grid(224, 225)
    with pytest.raises(UserError):
        parse_resolution("big")


def test_costs_cli_json_and_table():
    result = CliRunner().invoke(main, ["costs", "--resolutions", "32,48", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["rows"]
    assert [r["seq_len"] for r in rows] == [65, 145]  # digits: patch 4, one CLS token
    table = CliRunner().invoke(main, ["costs", "--resolutions", "33"])
    assert table.exit_code == 1 and "not a multiple of the patch size 4" in table.output


def test_family_terms_reach_the_cost_model_as_spec_data():
    """A family's extra cost terms (its adapter fills spec.extra_terms) are in the MACs and the parameters, travel
    through the manifest's spec, and a spec without any is written exactly as before (no new key)."""
    import dataclasses

    plain = base(16)
    assert "extra_terms" not in plain.to_dict() and plain.to_dict()["family"] == plain.architecture == "vit"
    d, rho = plain.embed_dim, plain.mlp_ratio
    head = {"name": "map-head", "macs": [(2 + 2 * rho) * d * d, 2 * d * d + 2 * d], "params": 1234}
    pooled = dataclasses.replace(plain, global_pool="map", class_token=False, pos_embed_prefix_rows=0, extra_terms=(head,))
    again = ViTSpec.from_dict(json.loads(json.dumps(pooled.to_dict())))
    assert again.extra_terms == (head,) and again.global_pool == "map"
    without = dataclasses.replace(pooled, extra_terms=())
    length = 196  # no prefix tokens
    for batch in (1, 3):
        c, c0 = vit_costs(again, batch=batch), vit_costs(without, batch=batch)
        want = batch * int((2 + 2 * rho) * d * d + (2 * d * d + 2 * d) * length)
        assert c.macs_extra == want and c.macs_total - c0.macs_total == want and c0.macs_extra == 0
    assert param_count(again) - param_count(without) == 1234
