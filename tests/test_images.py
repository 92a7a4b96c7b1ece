"""vitdeploy.images: decoding (EXIF, colour modes, bad files), the host resize rule (folders: tests/test_data.py)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from synthetic_bundle import half_red
from vitdeploy.errors import ConfigError, UserError
from vitdeploy.images import (
    decode_image,
    load_images,
    model_input_size,
    resize_for_model,
    resize_geometry,
)

EXIF_ORIENTATION = 0x0112


def save_jpeg(path, rgb, orientation=None, quality=95):
    exif = Image.Exif()
    if orientation is not None:
        exif[EXIF_ORIENTATION] = orientation
    Image.fromarray(rgb).save(path, quality=quality, subsampling=0, exif=exif)
    return path


# -- decoding ----------------------------------------------------------------------------------
def test_rgb_png_roundtrips_exactly(tmp_path):
    rgb = np.random.default_rng(0).integers(0, 256, (7, 11, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "a.png")
    out = decode_image(tmp_path / "a.png")
    assert out.dtype == np.uint8 and out.shape == (7, 11, 3)
    np.testing.assert_array_equal(out, rgb)


def test_grayscale_rgba_palette_cmyk_become_rgb(tmp_path):
    gray = np.arange(48, dtype=np.uint8).reshape(6, 8) * 5
    Image.fromarray(gray, mode="L").save(tmp_path / "g.png")
    g = decode_image(tmp_path / "g.png")
    assert g.shape == (6, 8, 3)
    for c in range(3):
        np.testing.assert_array_equal(g[..., c], gray)

    rgba = np.zeros((4, 4, 4), dtype=np.uint8)
    rgba[...] = (200, 100, 50, 0)  # fully transparent: colour kept, alpha dropped (convert("RGB"))
    Image.fromarray(rgba, mode="RGBA").save(tmp_path / "a.png")
    assert decode_image(tmp_path / "a.png")[2, 2].tolist() == [200, 100, 50]

    pal = Image.new("P", (5, 5))
    pal.putpalette([0, 0, 0, 10, 220, 30] + [0] * 762)
    pal.putpixel((1, 1), 1)
    pal.save(tmp_path / "p.png")
    p = decode_image(tmp_path / "p.png")
    assert p[1, 1].tolist() == [10, 220, 30] and p[0, 0].tolist() == [0, 0, 0]

    Image.new("CMYK", (6, 6), (0, 255, 255, 0)).save(tmp_path / "c.jpg")  # pure red in CMYK
    c = decode_image(tmp_path / "c.jpg").astype(int)
    assert c[3, 3, 0] > 230 and c[3, 3, 1] < 30 and c[3, 3, 2] < 30


def test_16bit_grayscale_is_scaled_not_clipped(tmp_path):
    gray16 = np.array([[0, 257 * 100, 65535]], dtype=np.uint16)
    Image.fromarray(gray16).save(tmp_path / "g16.png")
    assert decode_image(tmp_path / "g16.png")[0, :, 0].tolist() == [0, 100, 255]


@pytest.mark.parametrize(
    "orientation, stored, shown",
    [
        (1, "left", "left"),
        (3, "left", "right"),  # rotate 180
        (6, "left", "top"),  # camera held 90 degrees: display rotates clockwise
        (8, "left", "bottom"),  # ... counter-clockwise
        (2, "left", "right"),  # mirrored
    ],
)
def test_exif_orientation_turns_photos_upright(tmp_path, orientation, stored, shown):
    path = save_jpeg(tmp_path / "photo.jpg", half_red(24, 40, stored), orientation)
    out = decode_image(path)
    expected_shape = (40, 24, 3) if orientation in (5, 6, 7, 8) else (24, 40, 3)
    assert out.shape == expected_shape
    want = half_red(*expected_shape[:2], shown).astype(int)
    assert np.abs(out.astype(int) - want).mean() < 6  # JPEG noise, far below a wrong half (~64)


def test_unreadable_files_are_one_clear_line(tmp_path):
    bad = tmp_path / "notes.jpg"
    bad.write_text("not an image")
    with pytest.raises(UserError, match=r"cannot read image .*notes\.jpg"):
        decode_image(bad)
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(tmp_path / "whole.png")
    data = (tmp_path / "whole.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="cut.png"):
        decode_image(tmp_path / "cut.png")
    with pytest.raises(UserError, match="does not exist"):
        decode_image(tmp_path / "missing.png")


# -- the resize rule ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "src, mode, crop_pct, size, expected",
    [
        ((300, 400), "shorter-side-center-crop", 0.875, (224, 224), ((256, 341), (16, 58))),
        ((401, 299), "shorter-side-center-crop", 0.9, (224, 224), ((332, 248), (54, 12))),
        ((500, 181), "shorter-side-center-crop", 1.0, (224, 320), ((884, 320), (330, 0))),
        ((97, 333), "shorter-side-center-crop", 0.875, (320, 224), ((365, 1253), (22, 514))),  # 22.5 -> 22
        ((300, 400), "stretch", None, (224, 224), ((224, 224), (0, 0))),
        ((300, 400), "stretch", 0.875, (224, 224), ((256, 256), (16, 16))),
    ],
)
def test_resize_geometry(src, mode, crop_pct, size, expected):
    assert resize_geometry(src, {"mode": mode, "crop_pct": crop_pct}, size) == expected


@pytest.mark.parametrize(
    "src, size, interpolation, crop_pct, crop_mode",
    [
        ((300, 400), (224, 224), "bicubic", 0.875, "center"),
        ((401, 299), (224, 224), "bilinear", 0.9, "center"),
        ((224, 224), (224, 224), "bicubic", 0.875, "center"),  # even the model's own size is re-cropped
        ((97, 333), (320, 224), "bicubic", 0.95, "center"),  # non-square: timm ResizeKeepRatio
        ((300, 400), (224, 224), "bilinear", 0.875, "squash"),
    ],
)
def test_resize_matches_timm_eval_transform_exactly(src, size, interpolation, crop_pct, crop_mode):
    timm_data = pytest.importorskip("timm.data")
    rgb = np.random.default_rng(1).integers(0, 256, src + (3,), dtype=np.uint8)
    tf = timm_data.create_transform(
        input_size=(3,) + size, interpolation=interpolation, crop_pct=crop_pct, crop_mode=crop_mode, is_training=False
    )
    img = Image.fromarray(rgb)
    for t in tf.transforms:
        if type(t).__name__ in ("ToTensor", "MaybeToTensor", "Normalize"):
            break
        img = t(img)
    mode = "stretch" if crop_mode == "squash" else "shorter-side-center-crop"
    ours = resize_for_model(rgb, {"host_resize": {"mode": mode, "interpolation": interpolation, "crop_pct": crop_pct}}, size)
    np.testing.assert_array_equal(ours, np.asarray(img))


def test_hf_integer_interpolation_and_bad_rules():
    rgb = np.full((20, 30, 3), 90, dtype=np.uint8)
    out = resize_for_model(rgb, {"host_resize": {"mode": "stretch", "interpolation": 3, "crop_pct": None}}, (8, 8))
    assert out.shape == (8, 8, 3) and (out == 90).all()
    for rule, what in [
        ({"mode": "squeeze"}, "squeeze"),
        ({"mode": "stretch", "crop_pct": 1.5}, "crop_pct"),
        ({"mode": "stretch", "interpolation": "cubic-ish"}, "cubic-ish"),
    ]:
        with pytest.raises(ConfigError, match=what):
            resize_for_model(rgb, {"host_resize": rule}, (8, 8))
    with pytest.raises(UserError, match="uint8"):
        resize_for_model(rgb.astype(np.float32), {}, (8, 8))


def test_model_input_size_rules():
    static = {"input_size": [32, 32], "in_graph_resize": None}
    assert model_input_size(static) == (32, 32)
    with pytest.raises(UserError, match="static resolution"):
        model_input_size(static, size=(64, 64))
    dynamic = {"input_size": None, "in_graph_resize": None}
    res = {"mode": "dynamic", "height": 224, "width": 224}
    assert model_input_size(dynamic, res, (16, 16)) == (224, 224)
    assert model_input_size(dynamic, res, (16, 16), size=(224, 320)) == (224, 320)
    with pytest.raises(UserError, match="nearest valid: 224 or 240"):
        model_input_size(dynamic, res, (16, 16), size=(230, 224))
    resize = {"input_size": None, "in_graph_resize": {"method": "bilinear", "antialias": False, "to": [32, 32]}}
    assert model_input_size(resize) == (32, 32)


def test_load_images_resizes_and_orders_channels(tmp_path):
    Image.fromarray(half_red(60, 40, "top")).save(tmp_path / "a.png")
    Image.fromarray(np.full((10, 10, 3), (0, 0, 255), np.uint8)).save(tmp_path / "b.png")
    pre = {"channel_order": "rgb", "host_resize": {"mode": "stretch", "interpolation": "bilinear"}}
    batch = load_images([tmp_path / "a.png", tmp_path / "b.png"], pre, (16, 16))
    assert batch.shape == (2, 16, 16, 3) and batch.dtype == np.uint8
    assert batch[0, 2, 8].tolist() == [255, 0, 0] and batch[0, 13, 8].tolist() == [0, 0, 0]
    bgr = load_images([tmp_path / "b.png"], dict(pre, channel_order="bgr"), (16, 16))
    assert bgr[0, 5, 5].tolist() == [255, 0, 0]  # blue pixel, BGR order
