"""The reference ViT: §39.2 equivalence, §39.3 permutation and interpolation, §39.4 masks and read-out."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from vitdeploy.errors import ConfigError, UserError
from vitdeploy.model import (
    PatchEmbed,
    VisionTransformer,
    count_parameters,
    embed_patches_linear,
    load_weights,
    patch_embed_as_linear,
    with_resolution,
)
from vitdeploy.patches import patchify, unpatchify
from vitdeploy.posembed import PosEmbedInterpolation
from vitdeploy.spec import ViTSpec

IMAGE_4X4 = torch.arange(1, 17, dtype=torch.float32).reshape(1, 1, 4, 4)


def small_spec(**overrides) -> ViTSpec:
    kwargs = dict(image_size=(16, 16), patch_size=(4, 4), embed_dim=32, depth=2, num_heads=4, num_classes=5, mlp_ratio=2.0)
    kwargs.update(overrides)
    return ViTSpec(**kwargs)


def trained_like(spec: ViTSpec, seed: int = 0) -> VisionTransformer:
    """A model with non-trivial weights everywhere (random-init biases are zero, tokens ~1e-6)."""
    torch.manual_seed(seed)
    model = VisionTransformer(spec).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


# -- §39.2 the worked projection and the conv == patchify + linear equivalence --------------------
def test_chapter_projection_example():
    w_rows = torch.tensor([[0.25, 0.25, 0.25, 0.25], [-0.5, 0.5, -0.5, 0.5]])  # one row per output channel
    embeddings = patchify(IMAGE_4X4, 2)[0] @ w_rows.T
    torch.testing.assert_close(embeddings, torch.tensor([[3.5, 1.0], [5.5, 1.0], [11.5, 1.0], [13.5, 1.0]]))


def test_chapter_conv_example_equals_linear_path():
    embed = PatchEmbed((2, 2), in_chans=1, embed_dim=2)
    with torch.no_grad():
        embed.proj.weight.copy_(torch.tensor([[[[1.0, 1.0], [1.0, 1.0]]], [[[1.0, -1.0], [1.0, -1.0]]]]))
        embed.proj.bias.zero_()
    grid = embed.proj(IMAGE_4X4)[0]  # [d, G_h, G_w]
    torch.testing.assert_close(grid[0], torch.tensor([[14.0, 22.0], [46.0, 54.0]]))
    torch.testing.assert_close(grid[1], torch.full((2, 2), -2.0))
    tokens, hw = embed(IMAGE_4X4)  # conv output reshaped row-major to [N, d]
    expected = torch.tensor([[14.0, -2.0], [22.0, -2.0], [46.0, -2.0], [54.0, -2.0]])
    assert hw == (2, 2)
    torch.testing.assert_close(tokens[0], expected)
    torch.testing.assert_close(embed_patches_linear(embed, IMAGE_4X4)[0], expected)


@settings(max_examples=25, deadline=None)
@given(
    c=st.integers(1, 3),
    ph=st.integers(1, 4),
    pw=st.integers(1, 4),
    gh=st.integers(1, 4),
    gw=st.integers(1, 4),
    d=st.integers(1, 8),
    seed=st.integers(0, 2**16),
)
def test_conv_equals_patchify_plus_shared_linear(c, ph, pw, gh, gw, d, seed):
    torch.manual_seed(seed)
    embed = PatchEmbed((ph, pw), c, d)
    x = torch.randn(2, c, gh * ph, gw * pw)
    conv_tokens, _ = embed(x)
    linear = patch_embed_as_linear(embed)
    torch.testing.assert_close(linear(patchify(x, (ph, pw))), conv_tokens, atol=1e-5, rtol=1e-5)
    # one shared W_E: F*d + d parameters, independent of the number of patches
    assert count_parameters(embed) == count_parameters(linear) == c * ph * pw * d + d


def test_patch_embed_parameter_count_is_Fd_plus_d():
    spec = small_spec(image_size=(64, 32))
    model = VisionTransformer(spec)
    assert count_parameters(model.patch_embed) == spec.patch_features * spec.embed_dim + spec.embed_dim
    assert count_parameters(model.patch_embed) == count_parameters(VisionTransformer(small_spec()).patch_embed)


# -- §39.3 permutation equivariance and position information ----------------------------------------
def _permute_patches(x: torch.Tensor, patch: int, perm: torch.Tensor) -> torch.Tensor:
    tokens = patchify(x, patch)
    return unpatchify(tokens[:, perm], patch, tuple(x.shape[-2:]))


@pytest.mark.parametrize("pool", ["token", "avg"])
def test_without_positions_permuting_patches_leaves_readout_unchanged(pool):
    model = trained_like(small_spec(global_pool=pool))
    x = torch.randn(2, 3, 16, 16)
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(1))
    x_perm = _permute_patches(x, 4, perm)
    with torch.no_grad():
        moved = model(x) - model(x_perm)
        assert moved.abs().max() > 1e-3  # with the position table the order matters
        model.pos_embed.zero_()
        torch.testing.assert_close(model(x), model(x_perm), atol=1e-5, rtol=1e-5)
        # and the patch rows are permuted, not changed (Eq. 39.12)
        feats, feats_perm = model.forward_features(x), model.forward_features(x_perm)
        torch.testing.assert_close(feats[:, 1:][:, perm], feats_perm[:, 1:], atol=1e-5, rtol=1e-5)


# -- §39.4 masks and read-out -----------------------------------------------------------------------
def test_all_masked_row_raises():
    model = trained_like(small_spec())
    x = torch.randn(2, 3, 16, 16)
    mask = torch.ones(2, 17, dtype=torch.bool)
    mask[1] = False
    with pytest.raises(UserError, match=r"no visible position in batch rows \[1\]"):
        model(x, mask)


def test_gap_reads_out_the_mean_over_valid_patches_only():
    model = trained_like(small_spec(global_pool="avg", class_token=False, pos_embed_prefix_rows=0))
    x = torch.randn(2, 3, 16, 16)
    valid = torch.ones(2, 16, dtype=torch.bool)
    valid[0, 10:] = False  # image 0: the last six patches are padding
    valid[1, ::2] = False
    with torch.no_grad():
        feats = model.forward_features(x, valid)
        h0 = feats[0, :10].mean(dim=0)
        torch.testing.assert_close(model.forward_head(feats, valid)[0], model.head(h0))
        # padded patches influence nothing: change their pixels, the logits stay
        x_changed = unpatchify(torch.where(valid[..., None], patchify(x, 4), torch.randn(2, 16, 48)), 4, (16, 16))
        torch.testing.assert_close(model(x, valid), model(x_changed, valid), atol=1e-5, rtol=1e-5)
        assert (model(x) - model(x_changed)).abs().max() > 1e-3
    with pytest.raises(UserError):
        model(x, torch.zeros(2, 16, dtype=torch.bool))


def test_cls_readout_with_patch_mask_matches_full_mask():
    model = trained_like(small_spec())
    x = torch.randn(1, 3, 16, 16)
    patch_mask = torch.rand(1, 16, generator=torch.Generator().manual_seed(3)) > 0.3
    full = torch.cat([torch.ones(1, 1, dtype=torch.bool), patch_mask], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(x, patch_mask), model(x, full))
    with pytest.raises(UserError, match="mask"):
        model(x, patch_mask.float())


# -- resolution: in-forward resampling vs offline, refusals ---------------------------------------
def test_other_resolution_resamples_the_table_in_forward_and_offline_alike():
    model = trained_like(small_spec())
    x = torch.randn(2, 3, 24, 20)
    static = with_resolution(model, 24, 20)
    assert static.spec.image_size == (24, 20)
    assert static.pos_embed.shape == (1, 1 + 6 * 5, 32)
    assert static.spec.extra["pos_embed_resampled_from"]["image_size"] == [16, 16]
    with torch.no_grad():
        torch.testing.assert_close(model(x), static(x))
        assert torch.equal(static.pos_embed_for_grid((6, 5)), static.pos_embed)  # stored table used as is
    assert model.pos_embed.shape == (1, 17, 32)  # the original is untouched


def test_interpolation_convention_changes_the_result():
    model = trained_like(small_spec())
    x = torch.randn(1, 3, 28, 28)
    bilinear = with_resolution(model, 28, 28, PosEmbedInterpolation("bilinear", align_corners=True))
    with torch.no_grad():
        assert (model(x) - bilinear(x)).abs().max() > 1e-4
        model.interpolation = PosEmbedInterpolation("bilinear", align_corners=True)
        torch.testing.assert_close(model(x), bilinear(x))


def test_sizes_not_divisible_by_the_patch_are_refused():
    model = trained_like(small_spec())
    with pytest.raises(UserError, match="height 18 is not a multiple of the patch size 4"):
        model(torch.randn(1, 3, 18, 16))
    with pytest.raises(UserError, match="nearest valid"):
        with_resolution(model, 16, 17)
    with pytest.raises(UserError, match="float"):
        model(torch.zeros(1, 3, 16, 16, dtype=torch.uint8))


def test_patch_size_change_is_a_config_error_when_loading_weights():
    weights = VisionTransformer(small_spec()).state_dict()
    with pytest.raises(ConfigError, match="patch_embed.proj.weight"):
        load_weights(VisionTransformer(small_spec(patch_size=(8, 8))), weights)


def test_prefix_tokens_distillation_and_registers():
    spec = small_spec(num_distill_tokens=1, num_reg_tokens=2, pos_embed_prefix_rows=0, architecture="deit-distilled")
    model = trained_like(spec)
    names = set(model.state_dict())
    assert {"cls_token", "dist_token", "reg_token", "head_dist.weight", "pos_embed"} <= names
    assert model.pos_embed.shape == (1, 16, 32)  # no rows for prefix tokens (timm no_embed_class)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        feats = model.forward_features(x)
        assert feats.shape == (2, 4 + 16, 32)
        torch.testing.assert_close(model(x), (model.head(feats[:, 0]) + model.head_dist(feats[:, 1])) / 2)
    with pytest.raises(ConfigError, match="pos_embed_prefix_rows"):
        VisionTransformer(small_spec(num_reg_tokens=2, pos_embed_prefix_rows=2))


# -- compatibility with timm state dicts ----------------------------------------------------------
@pytest.mark.slow
def test_timm_state_dict_loads_and_matches_timm_outputs():
    timm = pytest.importorskip("timm")
    spec = small_spec(image_size=(32, 32))
    ref = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=5,
        dynamic_img_size=True,
    ).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.1)
    model = load_weights(VisionTransformer(spec), ref.state_dict()).eval()
    # timm's dynamic_img_size resamples with antialias=True, which in torch also changes bicubic
    # *upsampling* (the antialiased kernel is the a=-0.5 cubic, the plain one a=-0.75).
    model.interpolation = PosEmbedInterpolation("bicubic", align_corners=False, antialias=True)
    with torch.no_grad():
        for size in (32, 48, 24):
            x = torch.randn(2, 3, size, size)
            torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
        model.interpolation = PosEmbedInterpolation("bicubic", align_corners=False, antialias=False)
        x = torch.randn(2, 3, 48, 48)
        assert (model(x) - ref(x)).abs().max() > 1e-6


# -- ONNX: dynamic H/W carries the resampling; LayerNorm is one node -------------------------------
@pytest.mark.slow
def test_dynamo_export_with_dynamic_hw_matches_eager(tmp_path):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    model = trained_like(small_spec(depth=1))
    path = tmp_path / "vit.onnx"
    torch.onnx.export(
        model, (torch.randn(1, 3, 16, 16),), str(path), dynamo=True, verbose=False,
        dynamic_shapes={"x": {0: "batch", 2: "height", 3: "width"}},
    )
    ops = [node.op_type for node in onnx.load(str(path)).graph.node]
    assert ops.count("LayerNormalization") == 3  # norm1, norm2, final norm: no decomposition
    assert "Resize" in ops  # the table resampling lives in the graph
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for h, w in ((16, 16), (24, 32)):
        x = torch.randn(2, 3, h, w)
        with torch.no_grad():
            ref = model(x).numpy()
        out = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
        np.testing.assert_allclose(out, ref, atol=1e-4, rtol=1e-4)


def test_module_names_follow_timm():
    model = VisionTransformer(small_spec())
    names = set(model.state_dict())
    for key in (
        "patch_embed.proj.weight", "cls_token", "pos_embed", "blocks.1.norm1.weight", "blocks.1.attn.qkv.weight",
        "blocks.1.attn.proj.bias", "blocks.1.norm2.bias", "blocks.1.mlp.fc1.weight", "blocks.1.mlp.fc2.bias",
        "norm.weight", "head.weight",
    ):
        assert key in names
    assert not any(isinstance(m, nn.Dropout) for m in model.modules())
