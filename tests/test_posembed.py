"""2-D position-table interpolation (§39.3): the worked example, conventions, and refusals."""

import numpy as np
import pytest
import torch

from vitdeploy.errors import ConfigError
from vitdeploy.posembed import (
    EXPORT_DEFAULT,
    PosEmbedInterpolation,
    check_same_patch_size,
    resample_pos_embed,
    resample_pos_embed_np,
)


def chapter_table() -> torch.Tensor:
    """One position channel: CLS row 10, then the 2x2 grid [[0, 2], [4, 6]] row-major."""
    return torch.tensor([10.0, 0.0, 2.0, 4.0, 6.0]).reshape(1, 5, 1)


def test_chapter_example_bilinear_corner_aligned_to_3x3():
    out = resample_pos_embed(chapter_table(), (3, 3), (2, 2), 1, method="bilinear", align_corners=True)
    assert out.shape == (1, 10, 1)
    assert out[0, 0, 0].item() == 10.0  # the CLS position is kept, not mixed into the grid
    np.testing.assert_allclose(out[0, 1:, 0].reshape(3, 3).numpy(), [[0, 1, 2], [2, 3, 4], [4, 5, 6]], atol=1e-6)
    # the centre is the mean of the four corners (weights 1/4 each)
    assert out[0, 1 + 4, 0].item() == pytest.approx((0 + 2 + 4 + 6) / 4)


def test_conventions_differ_and_are_named():
    # 2x2 -> 3x3 is too small to separate them (bicubic on two points equals bilinear), so use 3x3 -> 5x5.
    table = torch.tensor([10.0, 0, 5, 1, 7, 2, 9, 3, 8, 4]).reshape(1, 10, 1)
    results = {}
    for method in ("bilinear", "bicubic"):
        for corners in (False, True):
            conv = PosEmbedInterpolation(method, corners)
            results[conv.name] = resample_pos_embed(table, (5, 5), (3, 3), 1, method, corners)[0, 1:, 0]
    assert set(results) == {"bilinear/centres", "bilinear/corners", "bicubic/centres", "bicubic/corners"}
    names = sorted(results)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not torch.allclose(results[a], results[b]), f"{a} and {b} should give different tables"
    # Corner alignment keeps the four corner values; centre alignment maps cell centres instead.
    corners = results["bilinear/corners"].reshape(5, 5)
    assert [corners[0, 0].item(), corners[0, -1].item(), corners[-1, 0].item(), corners[-1, -1].item()] == [0, 1, 3, 4]
    # On the chapter grid, centre-aligned 2 -> 3 samples src = (i + 0.5) * 2/3 - 0.5 = -1/6, 1/2, 7/6,
    # clamped at the edges: row 0 becomes [0, 1, 2] as with corners, but for a different reason.
    centres = resample_pos_embed(chapter_table(), (3, 3), (2, 2), 1, "bilinear", False)[0, 1:, 0].reshape(3, 3)
    np.testing.assert_allclose(centres.numpy(), [[0, 1, 2], [2, 3, 4], [4, 5, 6]], atol=1e-6)
    assert "align_corners=False" in EXPORT_DEFAULT.describe()
    assert "corner-aligned" in PosEmbedInterpolation("bilinear", True).describe()


def test_export_default_is_timm_convention():
    assert EXPORT_DEFAULT == PosEmbedInterpolation("bicubic", align_corners=False, antialias=False)
    assert PosEmbedInterpolation.from_dict(EXPORT_DEFAULT.to_dict()) == EXPORT_DEFAULT
    with pytest.raises(ConfigError, match="bicubic, bilinear"):
        PosEmbedInterpolation("nearest")
    with pytest.raises(ConfigError, match="unknown position-interpolation keys"):
        PosEmbedInterpolation.from_dict({"mode": "bilinear"})


def test_native_grid_is_identity_for_centre_aligned_bicubic():
    table = torch.randn(1, 1 + 4 * 6, 8)
    out = resample_pos_embed(table, (4, 6), (4, 6), 1)
    assert torch.equal(out, table)


def test_interpolation_is_two_dimensional_not_along_the_sequence():
    # A table whose value depends only on the grid column s: a 2-D resample keeps every new row
    # identical; resampling the flattened sequence as one line would blend row ends into row starts.
    gh, gw = 3, 4
    cols = torch.arange(gw, dtype=torch.float32).repeat(gh)  # row-major: value = s
    table = torch.cat([torch.tensor([99.0]), cols]).reshape(1, -1, 1)
    out = resample_pos_embed(table, (5, 7), (gh, gw), 1, method="bilinear")[0, 1:, 0].reshape(5, 7)
    assert torch.allclose(out, out[0].expand(5, 7))
    assert torch.all(out[0, 1:] >= out[0, :-1])  # still increasing along each row


def test_prefix_rows_pass_through_unchanged_and_zero_prefix_works():
    table = torch.randn(1, 3 + 16, 5)
    out = resample_pos_embed(table, (2, 8), (4, 4), num_prefix_rows=3)
    assert out.shape == (1, 3 + 16, 5)
    assert torch.equal(out[:, :3], table[:, :3])
    no_prefix = resample_pos_embed(table[:, 3:], (6, 6), (4, 4), num_prefix_rows=0)
    assert no_prefix.shape == (1, 36, 5)


def test_fp16_table_is_resampled_in_fp32_and_returned_in_fp16():
    table = torch.randn(1, 1 + 9, 4)
    out16 = resample_pos_embed(table.half(), (5, 5), (3, 3))
    assert out16.dtype == torch.float16
    torch.testing.assert_close(out16.float(), resample_pos_embed(table, (5, 5), (3, 3)), atol=5e-3, rtol=5e-3)


def test_numpy_wrapper_matches_torch():
    table = np.random.default_rng(1).normal(size=(1 + 9, 4)).astype(np.float32)
    out = resample_pos_embed_np(table, (5, 2), (3, 3), 1, PosEmbedInterpolation("bilinear"))
    ref = resample_pos_embed(torch.from_numpy(table)[None], (5, 2), (3, 3), 1, "bilinear")[0].numpy()
    assert out.shape == (1 + 10, 4)
    np.testing.assert_allclose(out, ref)


def test_row_count_must_match_the_old_grid():
    with pytest.raises(ConfigError, match="position table has 5 rows"):
        resample_pos_embed(chapter_table(), (3, 3), (3, 3), 1)


def test_patch_size_change_raises_config_error():
    check_same_patch_size(16, (16, 16))  # same size in two spellings is fine
    with pytest.raises(ConfigError, match="cannot fix a patch-size change: W_E changes"):
        check_same_patch_size(16, 14)
    with pytest.raises(ConfigError, match="W_E changes"):
        check_same_patch_size((16, 16), (16, 8))


def test_antialiased_bicubic_differs_even_when_enlarging():
    # torch's antialiased bicubic is the a=-0.5 cubic; plain bicubic is a=-0.75. timm defaults to
    # antialias=True, so the flag must be named to reproduce a timm table at a larger size.
    table = torch.randn(1, 1 + 16, 3, generator=torch.Generator().manual_seed(0))
    plain = resample_pos_embed(table, (6, 6), (4, 4), 1, "bicubic", antialias=False)
    smooth = resample_pos_embed(table, (6, 6), (4, 4), 1, "bicubic", antialias=True)
    assert (plain - smooth).abs().max() > 1e-3
    assert "a=-0.5" in PosEmbedInterpolation("bicubic", antialias=True).describe()
    # bilinear is unaffected when enlarging
    torch.testing.assert_close(
        resample_pos_embed(table, (6, 6), (4, 4), 1, "bilinear", antialias=False),
        resample_pos_embed(table, (6, 6), (4, 4), 1, "bilinear", antialias=True),
    )
