"""Property-based tests of the readers that take a user's files and text (issue 31): whatever arrives, the
answer is a value or one UserError, never another exception. Hypothesis draws the inputs."""

from __future__ import annotations

import copy
import io
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from vitdeploy.bundle import Bundle, read_labels
from vitdeploy.errors import UserError

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _valid_manifest() -> dict[str, Any]:
    from synthetic_bundle import make_bundle

    with tempfile.TemporaryDirectory() as tmp:
        return make_bundle(Path(tmp) / "b").manifest


VALID = _valid_manifest()


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, prefix + (i,))
    return out


PATHS = _paths(VALID)


def _open(manifest_text: str | bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "manifest.json").write_bytes(manifest_text if isinstance(manifest_text, bytes) else manifest_text.encode())
        try:
            bundle = Bundle.open(root)
        except UserError as exc:
            assert "\n" not in str(exc)
            return
        # what the reader let through, every command can read without a KeyError or TypeError
        bundle.spec, bundle.labels, bundle.preprocessing, bundle.resolution, bundle.precisions()


@SETTINGS
@given(st.binary(max_size=200))
def test_any_bytes_as_a_manifest(data: bytes) -> None:
    _open(data)


@SETTINGS
@given(json_values)
def test_any_json_as_a_manifest(value: Any) -> None:
    _open(json.dumps(value))


@SETTINGS
@given(st.data())
def test_a_valid_manifest_with_one_value_replaced_or_removed(data: st.DataObject) -> None:
    manifest = copy.deepcopy(VALID)
    path = data.draw(st.sampled_from(PATHS))
    parent = manifest
    for key in path[:-1]:
        parent = parent[key]
    if data.draw(st.booleans()) and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(json_values)
    _open(json.dumps(manifest))


@SETTINGS
@given(st.binary(max_size=300), st.none() | st.integers(0, 5))
def test_any_bytes_as_a_labels_file(data: bytes, expected: int | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "labels.txt"
        path.write_bytes(data)
        try:
            labels = read_labels(path, expected)
        except UserError as exc:
            assert "\n" not in str(exc)
            return
        assert all(isinstance(x, str) and x.strip() and "\n" not in x for x in labels)
        assert expected is None or len(labels) == expected


def _encoded(kind: str, array: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format=kind)
    return buf.getvalue()


@SETTINGS
@given(st.sampled_from(["PNG", "BMP", "TIFF", "GIF"]), st.integers(1, 12), st.integers(1, 12), st.integers(0, 2**31 - 1),
       st.integers(0, 64), st.binary(max_size=16))
def test_any_damage_to_an_image_file(kind: str, h: int, w: int, seed: int, cut: int, junk: bytes) -> None:
    """A real image file, truncated and/or with junk appended: decoded to uint8 [H, W, 3], or one UserError."""
    from vitdeploy.images import decode_image

    rng = np.random.default_rng(seed)
    data = _encoded(kind, rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    data = data[: max(0, len(data) - cut)] + junk
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"x.{kind.lower()}"
        path.write_bytes(data)
        try:
            image = decode_image(path)
        except UserError as exc:
            assert "\n" not in str(exc)
            return
        assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3


@SETTINGS
@given(st.binary(max_size=100))
def test_any_bytes_as_an_image(data: bytes) -> None:
    from vitdeploy.images import decode_image

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.png"
        path.write_bytes(b"\x89PNG\r\n\x1a\n" + data)
        try:
            decode_image(path)
        except UserError:
            pass


@SETTINGS
@given(st.integers(0, 65535), st.integers(0, 65535))
def test_16_bit_decoding_is_monotonic(a: int, b: int) -> None:
    from PIL import Image

    from vitdeploy.images import decode_image

    assume(a <= b)
    with tempfile.TemporaryDirectory() as tmp:
        got = []
        for i, v in enumerate((a, b)):
            path = Path(tmp) / f"{i}.png"
            Image.fromarray(np.full((2, 2), v, np.uint16)).save(path)
            got.append(int(decode_image(path)[0, 0, 0]))
    assert got[0] <= got[1] and abs(got[0] - a / 257) <= 0.5 + 1e-9 and abs(got[1] - b / 257) <= 0.5 + 1e-9


@SETTINGS
@given(st.text(max_size=20))
def test_any_text_as_a_resolution(text: str) -> None:
    from vitdeploy.spec import MAX_SIDE, parse_resolution

    try:
        h, w = parse_resolution(text)
    except UserError as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(h, int) and isinstance(w, int) and 0 < h <= MAX_SIDE and 0 < w <= MAX_SIDE


@pytest.mark.parametrize("text,want", [("384", (384, 384)), ("224x320", (224, 320)), (" 224 X 320 ", (224, 320))])
def test_resolutions_that_parse(text: str, want: tuple[int, int]) -> None:
    from vitdeploy.spec import parse_resolution

    assert parse_resolution(text) == want


@SETTINGS
@given(st.lists(st.text(max_size=10), max_size=4))
def test_any_text_as_model_args(items: list[str]) -> None:
    import click

    from vitdeploy.cli.common import parse_model_args

    try:
        parse_model_args(tuple(items))
    except click.BadParameter:
        pass
