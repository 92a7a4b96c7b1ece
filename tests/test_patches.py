"""Patchification (§39.1, Eq. 39.2): the chapter's worked example and the bijection property."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vitdeploy.errors import UserError
from vitdeploy.patches import feature_index, patch_index, patchify, unpatchify

IMAGE_4X4 = np.arange(1, 17, dtype=np.float64).reshape(1, 1, 4, 4)  # rows [1 2 3 4] ... [13 14 15 16]


def test_chapter_example_2x2_patches():
    tokens = patchify(IMAGE_4X4, 2)
    np.testing.assert_array_equal(
        tokens[0],
        [[1, 2, 5, 6], [3, 4, 7, 8], [9, 10, 13, 14], [11, 12, 15, 16]],
    )


def test_index_map_matches_equation_39_2_elementwise():
    rng = np.random.default_rng(0)
    b, c, ph, pw, gh, gw = 2, 3, 2, 3, 2, 4
    images = rng.normal(size=(b, c, gh * ph, gw * pw))
    tokens = patchify(images, (ph, pw))
    assert tokens.shape == (b, gh * gw, c * ph * pw)
    for r in range(gh):
        for s in range(gw):
            for ch in range(c):
                for u in range(ph):
                    for v in range(pw):
                        n, f = patch_index(r, s, gw), feature_index(ch, u, v, (ph, pw))
                        assert tokens[1, n, f] == images[1, ch, r * ph + u, s * pw + v]


def test_unpatchify_restores_chapter_example_from_grid_or_size():
    tokens = patchify(IMAGE_4X4, 2)
    np.testing.assert_array_equal(unpatchify(tokens, 2, (4, 4)), IMAGE_4X4)
    np.testing.assert_array_equal(unpatchify(tokens, 2, grid=(2, 2)), IMAGE_4X4)


def test_torch_tensors_give_the_same_map():
    torch = pytest.importorskip("torch")
    images = torch.arange(2 * 3 * 8 * 12, dtype=torch.float32).reshape(2, 3, 8, 12)
    tokens = patchify(images, (4, 3))
    assert isinstance(tokens, torch.Tensor)
    np.testing.assert_array_equal(tokens.numpy(), patchify(images.numpy(), (4, 3)))
    assert torch.equal(unpatchify(tokens, (4, 3), (8, 12)), images)


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 3),
    c=st.integers(1, 4),
    ph=st.integers(1, 5),
    pw=st.integers(1, 5),
    gh=st.integers(1, 5),
    gw=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_round_trip_is_a_bijection(b, c, ph, pw, gh, gw, seed):
    images = np.random.default_rng(seed).integers(0, 1000, size=(b, c, gh * ph, gw * pw))
    tokens = patchify(images, (ph, pw))
    assert tokens.shape == (b, gh * gw, c * ph * pw)
    assert tokens.size == images.size  # BNF = BCHW
    # every pixel appears exactly once: the multiset of values is unchanged
    np.testing.assert_array_equal(np.sort(tokens, axis=None), np.sort(images, axis=None))
    np.testing.assert_array_equal(unpatchify(tokens, (ph, pw), (gh * ph, gw * pw), c), images)


def test_refuses_sizes_the_patch_does_not_tile():
    with pytest.raises(UserError, match="not a multiple of the patch size 4"):
        patchify(np.zeros((1, 3, 30, 32)), 4)


def test_refuses_wrong_rank_and_ambiguous_unpatchify():
    with pytest.raises(UserError, match=r"\[B, C, H, W\]"):
        patchify(np.zeros((3, 32, 32)), 4)
    tokens = patchify(np.zeros((1, 1, 4, 8)), 2)
    with pytest.raises(UserError, match="exactly one"):
        unpatchify(tokens, 2)
    with pytest.raises(UserError, match="N=8"):
        unpatchify(tokens, 2, (4, 4))
