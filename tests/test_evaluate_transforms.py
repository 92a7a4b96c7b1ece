"""Each shift transform does what its declared rule says (pure numpy/Pillow; no model)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageEnhance

from vitdeploy.errors import UserError
from vitdeploy.evaluate.score import wilson
from vitdeploy.evaluate.transforms import (
    TRANSFORMS,
    Context,
    background_mask,
    crop_box,
    foreground_fraction,
    occlusion_side,
    parse_suite,
)


@pytest.fixture(scope="module")
def digits() -> np.ndarray:
    from vitdeploy.builtin.digits import load_digits_split

    return load_digits_split("test")[0][:48]


def photo_like(n: int = 6, size: int = 32, seed: int = 3) -> np.ndarray:
    """Smooth coloured images (JPEG-like content) with no pixel at 255."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    out = []
    for _ in range(n):
        f = rng.uniform(0.1, 0.4, size=3)
        img = np.stack([100 + 80 * np.sin(f[c] * (xx + 2 * yy) + c) for c in range(3)], axis=-1)
        out.append(np.clip(img + rng.normal(0, 6, img.shape), 0, 250))
    return np.asarray(out, dtype=np.uint8)


def test_crop_keeps_the_declared_area_and_matches_pillow() -> None:
    for area in (0.81, 0.64, 0.5, 0.25):
        top, left, h, w = crop_box(224, 224, area)
        assert abs(h * w / (224 * 224) - area) < 2 * 224 / (224 * 224) + 0.01  # rounding of one side only
        assert (top, left) == ((224 - h) // 2, (224 - w) // 2)
    images = photo_like()
    out = TRANSFORMS["crop"].apply(images, 0.25, Context())
    top, left, h, w = crop_box(32, 32, 0.25)
    assert (top, left, h, w) == (8, 8, 16, 16)
    expect = np.asarray(Image.fromarray(images[0][8:24, 8:24]).resize((32, 32), Image.BILINEAR))
    np.testing.assert_array_equal(out[0], expect)


def test_jpeg_is_really_reencoded_at_that_quality() -> None:
    images = photo_like()
    out = TRANSFORMS["jpeg"].apply(images, 30, Context())

    def pillow(img: np.ndarray, quality: int) -> np.ndarray:
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=quality)
        data = buf.getvalue()
        assert data[:2] == b"\xff\xd8"  # a JPEG stream
        return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))

    for i in range(len(images)):
        np.testing.assert_array_equal(out[i], pillow(images[i], 30))
        assert not np.array_equal(out[i], pillow(images[i], 90))  # the quality matters
        assert not np.array_equal(out[i], images[i])
    low = TRANSFORMS["jpeg"].apply(images, 5, Context())
    assert np.abs(low.astype(int) - images).mean() > np.abs(out.astype(int) - images).mean()  # lower quality, larger error


@pytest.mark.parametrize("name", ["occlusion", "occlusion-aligned"])
def test_occlusion_covers_exactly_the_declared_square(name: str) -> None:
    images = photo_like(n=20)  # no pixel is white, so the white fill marks the occluded area
    ctx = Context(seed=5, patch=(4, 4), occlusion_fill="white")
    for fraction in (0.125, 0.25, 0.5):
        out = TRANSFORMS[name].apply(images, fraction, ctx)
        side = occlusion_side(32, 32, fraction, (4, 4) if name == "occlusion-aligned" else None)
        occluded = (out == 255).all(axis=-1)
        assert (occluded.sum(axis=(1, 2)) == side * side).all()
        np.testing.assert_array_equal(out[~occluded], images[~occluded])  # nothing else changed
        corners = np.array([np.argwhere(m).min(axis=0) for m in occluded])
        if name == "occlusion-aligned":
            assert (corners % 4 == 0).all()
        else:
            assert ((corners % 4) != 0).all()  # straddles patch boundaries
    again = TRANSFORMS[name].apply(images, 0.25, ctx)
    np.testing.assert_array_equal(again, TRANSFORMS[name].apply(images, 0.25, ctx))  # seeded
    other = TRANSFORMS[name].apply(images, 0.25, Context(seed=6, patch=(4, 4), occlusion_fill="white"))
    assert not np.array_equal(again, other)


@pytest.mark.parametrize("name", ["background-solid", "background-noise", "background-texture"])
def test_background_replaced_and_digit_pixels_untouched(name: str, digits: np.ndarray) -> None:
    mask, separable = background_mask(digits)
    assert separable.all() and 0.2 < mask.mean() < 0.6
    level = 128
    out = TRANSFORMS[name].apply(digits, level, Context(seed=1))
    np.testing.assert_array_equal(out[~mask], digits[~mask])  # foreground (ink) untouched
    changed = (out != digits).any(axis=-1)
    if name == "background-solid":
        assert (out[mask] == level).all()
    else:
        assert changed[mask].mean() > 0.8  # noise/texture rarely hit the old value exactly
        assert out[mask].max() <= level
    assert not changed[~mask].any()


def test_scale_shrinks_the_object_and_fills_the_border(digits: np.ndarray) -> None:
    out = TRANSFORMS["scale"].apply(digits, 0.5, Context())
    assert (out[:, :8] == 0).all() and (out[:, :, :8] == 0).all()  # border median of the digits: black
    before, after = foreground_fraction(digits), foreground_fraction(out)
    ratio = np.nanmean(after) / np.nanmean(before)
    assert 0.2 < ratio < 0.35  # area scales with 0.5^2 (plus resampling blur)


def test_photometric_rules() -> None:
    images = photo_like()
    bright = TRANSFORMS["brightness"].apply(images, 1.5, Context())
    pil = np.asarray(ImageEnhance.Brightness(Image.fromarray(images[0])).enhance(1.5))
    assert np.abs(bright[0].astype(int) - pil).max() <= 1
    low = TRANSFORMS["contrast"].apply(images, 0.5, Context())
    assert low.astype(float).std() < images.astype(float).std() * 0.55


def test_suite_parsing_and_bad_severities() -> None:
    assert [t.name for t, _ in parse_suite("all")] == list(TRANSFORMS)
    assert parse_suite("none") == []
    chosen = parse_suite("jpeg,crop", ("jpeg=50,10",))
    assert [(t.name, levels) for t, levels in chosen] == [("jpeg", (50.0, 10.0)), ("crop", TRANSFORMS["crop"].defaults)]
    with pytest.raises(UserError, match="unknown transform 'blur'"):
        parse_suite("jpeg,blur")
    with pytest.raises(UserError, match="out of range for jpeg"):
        parse_suite("jpeg", ("jpeg=120",))
    with pytest.raises(UserError, match="out of range for crop"):
        parse_suite("crop", ("crop=1.5",))
    with pytest.raises(UserError, match="not NAME="):
        parse_suite("crop", ("crop",))


def test_wilson_interval_known_values() -> None:
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and abs(hi - 0.2775) < 1e-3
    lo, hi = wilson(359, 360)
    assert abs(lo - 0.98447) < 1e-4 and abs(hi - 0.99951) < 1e-4
    lo, hi = wilson(50, 100)
    assert abs(lo - 0.4038) < 1e-3 and abs(hi - 0.5962) < 1e-3


def test_evaluate_imports_without_heavy_modules() -> None:
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "onnxruntime", "tensorrt", "timm", "transformers", "sklearn"):
                    raise ImportError("blocked " + name)
                return None
        sys.meta_path.insert(0, Block())
        import vitdeploy.data, vitdeploy.evaluate, vitdeploy.evaluate.report, vitdeploy.evaluate.occlusion, vitdeploy.profile.accuracy
        import vitdeploy.cli.cmd_evaluate
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_the_default_ladder_is_a_shorter_subset_of_the_fine_one():
    default = parse_suite("all")
    fine = parse_suite("all", ladder="fine")
    assert [t.name for t, _ in default] == [t.name for t, _ in fine] == list(TRANSFORMS)
    assert 1 + sum(len(levels) for _, levels in default) == 29  # conditions with clean
    assert 1 + sum(len(levels) for _, levels in fine) == 42
    for (transform, short), (_, full) in zip(default, fine):
        assert 2 <= len(short) <= len(full)
        assert set(short) <= set(full), transform.name
        assert short[-1] == full[-1], transform.name  # the most severe step is in both
    with pytest.raises(UserError, match="unknown ladder 'coarse'; choose from default, fine"):
        parse_suite("all", ladder="coarse")
