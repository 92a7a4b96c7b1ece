"""The shift suite: image perturbations as pure numpy/Pillow functions, each with a declared rule.

Every transform takes uint8 RGB images [N, H, W, 3] and a severity and returns new uint8 RGB images
of the same shape; nothing is random unless seeded (one seed per transform and severity, derived
from the run's seed), so a rerun perturbs the same pixels. Each has a ``rule`` (written into the
report as is), a severity unit, default severities and a valid range (a severity outside it is a
one-line error). Resampling uses Pillow's bilinear filter (antialiased when shrinking), the filter
the digits images and the host-resize rule use.

Foreground and background (for ``background-*`` and the object-size strata): an image has a
separable background when at least half of its 1-pixel border lies within ``tol`` (default 16 of
255, on every channel) of the border's median colour; its background is then every pixel within
``tol`` of that colour, the foreground the rest. The digits (white ink on black) satisfy this;
most photographs do not, and are left unchanged by the background transforms and counted as not
applicable.
"""

from __future__ import annotations

import io
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import UserError

BACKGROUND_TOL = 16  # |pixel - border median| <= tol on every channel -> background
SEPARABLE_BORDER_SHARE = 0.5  # at least this share of the border must be background


@dataclass
class Context:
    """What transforms may need besides the pixels."""

    seed: int = 0
    patch: tuple[int, int] = (16, 16)  # the model's patch size (patch-aligned occlusion)
    mean_rgb: tuple[int, int, int] = (128, 128, 128)  # the preprocessing mean as pixels (occlusion fill "mean")
    occlusion_fill: str = "mean"
    background_tol: int = BACKGROUND_TOL
    cache: dict[str, Any] = field(default_factory=dict)  # per-run: background masks of the clean images


@dataclass(frozen=True)
class Transform:
    name: str
    group: str  # what the plot groups by: crop, scale, jpeg, occlusion, background, photometric
    unit: str  # what a severity number means
    rule: str
    defaults: tuple[float, ...]  # the default ladder: mild to severe, 2-4 steps (LADDERS)
    low: float  # valid severities: low < s <= high (or low <= s with low_inclusive)
    high: float
    low_inclusive: bool
    fn: Callable[[np.ndarray, float, "Context", np.random.Generator], np.ndarray]
    integer: bool = False  # severities are whole numbers (JPEG quality, grey levels)
    needs_background: bool = False
    fine: tuple[float, ...] = ()  # the fine ladder (--ladder fine): the default's steps and the ones between

    def ladder(self, name: str = "default") -> tuple[float, ...]:
        if name not in LADDERS:
            raise UserError(f"unknown ladder {name!r}; choose from {', '.join(LADDERS)}")
        return self.fine if name == "fine" and self.fine else self.defaults

    def check(self, severity: float) -> float:
        ok_low = severity >= self.low if self.low_inclusive else severity > self.low
        if not (ok_low and severity <= self.high) or (self.integer and float(severity) != int(severity)):
            bracket = "[" if self.low_inclusive else "("
            kind = "a whole number " if self.integer else ""
            raise UserError(f"severity {severity:g} is out of range for {self.name}: {kind}in {bracket}{self.low:g}, {self.high:g}] "
                            f"({self.unit})")
        return float(severity)

    def apply(self, images: np.ndarray, severity: float, ctx: Context) -> np.ndarray:
        _check_batch(images)
        rng = np.random.default_rng([ctx.seed, zlib.crc32(self.name.encode()), int(round(severity * 1000))])
        out = self.fn(images, self.check(severity), ctx, rng)
        assert out.shape == images.shape and out.dtype == np.uint8
        return out

    def describe(self) -> dict[str, Any]:
        # the report keeps the key "family" (reports written so far read it)
        return {"name": self.name, "family": self.group, "unit": self.unit, "rule": self.rule,
                "valid": f"{'[' if self.low_inclusive else '('}{self.low:g}, {self.high:g}]"}


def _check_batch(images: np.ndarray) -> None:
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise UserError(f"transforms take uint8 RGB images [N,H,W,3], got {images.dtype} {list(images.shape)}")


# -- geometry ------------------------------------------------------------------------------------
def crop_box(height: int, width: int, area: float) -> tuple[int, int, int, int]:
    """(top, left, h, w) of the centred crop keeping ``area`` of the image: each side x sqrt(area),
    rounded to whole pixels (at least 1), offsets rounded towards the top-left."""
    scale = float(np.sqrt(area))
    h = max(1, int(round(height * scale)))
    w = max(1, int(round(width * scale)))
    return (height - h) // 2, (width - w) // 2, h, w


def _pil_resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(image).resize((width, height), resample=Image.BILINEAR), dtype=np.uint8)


def _crop(images: np.ndarray, area: float, ctx: Context, rng: np.random.Generator) -> np.ndarray:
    n, height, width, _ = images.shape
    top, left, h, w = crop_box(height, width, area)
    out = np.empty_like(images)
    for i in range(n):
        out[i] = _pil_resize(np.ascontiguousarray(images[i, top:top + h, left:left + w]), height, width)
    return out


def border_pixels(images: np.ndarray) -> np.ndarray:
    """The 1-pixel frame of each image: [N, 2H + 2W - 4, 3]."""
    top, bottom = images[:, 0], images[:, -1]
    left, right = images[:, 1:-1, 0], images[:, 1:-1, -1]
    return np.concatenate([top, bottom, left, right], axis=1)


def border_colour(images: np.ndarray) -> np.ndarray:
    """Per-image median colour of the 1-pixel frame, uint8 [N, 3] (the background estimate)."""
    return np.median(border_pixels(images), axis=1).round().astype(np.uint8)


def _scale(images: np.ndarray, factor: float, ctx: Context, rng: np.random.Generator) -> np.ndarray:
    n, height, width, _ = images.shape
    h, w = max(1, int(round(height * factor))), max(1, int(round(width * factor)))
    top, left = (height - h) // 2, (width - w) // 2
    fill = border_colour(images)
    out = np.empty_like(images)
    out[:] = fill[:, None, None, :]
    for i in range(n):
        out[i, top:top + h, left:left + w] = _pil_resize(images[i], h, w)
    return out


# -- compression ---------------------------------------------------------------------------------
def jpeg_roundtrip(image: np.ndarray, quality: int) -> np.ndarray:
    """Encode one uint8 RGB image as JPEG with Pillow at ``quality`` (4:2:0 chroma), then decode it."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=int(quality), subsampling="4:2:0", optimize=False)
    buffer.seek(0)
    with Image.open(buffer) as decoded:
        return np.asarray(decoded.convert("RGB"), dtype=np.uint8)


def _jpeg(images: np.ndarray, quality: float, ctx: Context, rng: np.random.Generator) -> np.ndarray:
    return np.stack([jpeg_roundtrip(np.ascontiguousarray(img), int(quality)) for img in images])


# -- occlusion -----------------------------------------------------------------------------------
def fill_colour(ctx: Context, images: np.ndarray) -> np.ndarray:
    """Per-image RGB fill [N, 3] for the occlusion rule named by ``ctx.occlusion_fill``."""
    n = len(images)
    named = {"mean": ctx.mean_rgb, "gray": (128, 128, 128), "black": (0, 0, 0), "white": (255, 255, 255)}
    if ctx.occlusion_fill in named:
        return np.tile(np.asarray(named[ctx.occlusion_fill], dtype=np.uint8), (n, 1))
    if ctx.occlusion_fill == "border":
        return border_colour(images)
    raise UserError(f"unknown occlusion fill {ctx.occlusion_fill!r}; use {', '.join(OCCLUSION_FILLS)}")


OCCLUSION_FILLS = ("mean", "gray", "black", "white", "border")


def occlusion_side(height: int, width: int, fraction: float, patch: tuple[int, int] | None = None) -> int:
    """Side in pixels of the square: fraction x the shorter image side, rounded (to whole patches
    when ``patch`` is given, at least one patch)."""
    side = max(1, int(round(fraction * min(height, width))))
    if patch is not None:
        p = min(patch)
        side = max(p, int(round(side / p)) * p)
    return min(side, height, width)


def occlusion_boxes(count: int, height: int, width: int, side: int, rng: np.random.Generator,
                    patch: tuple[int, int] | None = None, aligned: bool = False) -> np.ndarray:
    """Seeded top-left corners [count, 2] of squares lying fully inside the image.

    aligned: corners on the patch grid (the square covers whole patches); otherwise corners drawn
    off the grid wherever the image leaves room (the square straddles patch boundaries)."""
    ph, pw = patch or (1, 1)
    tops = np.arange(height - side + 1)
    lefts = np.arange(width - side + 1)
    if aligned:
        tops, lefts = tops[tops % ph == 0], lefts[lefts % pw == 0]
    else:
        off_t, off_l = tops[tops % ph != 0], lefts[lefts % pw != 0]
        tops = off_t if len(off_t) else tops
        lefts = off_l if len(off_l) else lefts
    return np.stack([rng.choice(tops, size=count), rng.choice(lefts, size=count)], axis=1)


def _occlude(aligned: bool) -> Callable[..., np.ndarray]:
    def run(images: np.ndarray, fraction: float, ctx: Context, rng: np.random.Generator) -> np.ndarray:
        n, height, width, _ = images.shape
        side = occlusion_side(height, width, fraction, ctx.patch if aligned else None)
        boxes = occlusion_boxes(n, height, width, side, rng, ctx.patch, aligned)
        fill = fill_colour(ctx, images)
        out = images.copy()
        for i, (top, left) in enumerate(boxes):
            out[i, top:top + side, left:left + side] = fill[i]
        return out

    return run


# -- background ----------------------------------------------------------------------------------
def background_mask(images: np.ndarray, tol: int = BACKGROUND_TOL) -> tuple[np.ndarray, np.ndarray]:
    """(mask [N, H, W] True on background pixels, separable [N] bool) by the module's rule."""
    colour = border_colour(images).astype(np.int16)
    close = (np.abs(images.astype(np.int16) - colour[:, None, None, :]) <= tol).all(axis=-1)
    border = np.abs(border_pixels(images).astype(np.int16) - colour[:, None, :]) <= tol
    separable = border.all(axis=-1).mean(axis=1) >= SEPARABLE_BORDER_SHARE
    return close & separable[:, None, None], separable


def foreground_fraction(images: np.ndarray, tol: int = BACKGROUND_TOL) -> np.ndarray:
    """Share of foreground pixels per image (object size); NaN where the background is not separable."""
    mask, separable = background_mask(images, tol)
    frac = 1.0 - mask.mean(axis=(1, 2))
    return np.where(separable, frac, np.nan)


def _cached_mask(images: np.ndarray, ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    # The suite perturbs the same clean images once per severity: compute their mask once.
    hit = ctx.cache.get("background")
    if hit is None or hit[0] is not images:
        hit = (images, background_mask(images, ctx.background_tol))
        ctx.cache["background"] = hit
    return hit[1]


def _replace_background(make: Callable[[int, int, int, float, np.random.Generator], np.ndarray]) -> Callable[..., np.ndarray]:
    def run(images: np.ndarray, level: float, ctx: Context, rng: np.random.Generator) -> np.ndarray:
        n, height, width, _ = images.shape
        mask, _sep = _cached_mask(images, ctx)
        new = make(n, height, width, level, rng)
        return np.where(mask[..., None], new, images).astype(np.uint8)

    return run


def _solid(n: int, h: int, w: int, level: float, rng: np.random.Generator) -> np.ndarray:
    return np.full((n, h, w, 3), int(level), dtype=np.uint8)


def _noise(n: int, h: int, w: int, level: float, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, int(level) + 1, size=(n, h, w, 3), dtype=np.int64).astype(np.uint8)


def texture(n: int, h: int, w: int, level: float, rng: np.random.Generator) -> np.ndarray:
    """Procedural texture: per image, the mean of three sinusoidal gratings (random orientation,
    period 3-12 px, phase, per-channel colour weight), scaled to 0..level."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    out = np.zeros((n, h, w, 3), dtype=np.float64)
    for _ in range(3):
        theta = rng.uniform(0, np.pi, size=n)
        period = rng.uniform(3, 12, size=n)
        phase = rng.uniform(0, 2 * np.pi, size=n)
        colour = rng.uniform(0.5, 1.0, size=(n, 3))
        arg = (np.cos(theta)[:, None, None] * xx + np.sin(theta)[:, None, None] * yy) * (2 * np.pi / period)[:, None, None]
        wave = 0.5 + 0.5 * np.sin(arg + phase[:, None, None])
        out += wave[..., None] * colour[:, None, None, :]
    return np.clip(np.round(out / 3.0 * level), 0, 255).astype(np.uint8)


# -- photometric ---------------------------------------------------------------------------------
def _brightness(images: np.ndarray, factor: float, ctx: Context, rng: np.random.Generator) -> np.ndarray:
    return np.clip(np.round(images.astype(np.float64) * factor), 0, 255).astype(np.uint8)


def _contrast(images: np.ndarray, factor: float, ctx: Context, rng: np.random.Generator) -> np.ndarray:
    x = images.astype(np.float64)
    luma = (x[..., 0] * 0.299 + x[..., 1] * 0.587 + x[..., 2] * 0.114).mean(axis=(1, 2))
    return np.clip(np.round(luma[:, None, None, None] + factor * (x - luma[:, None, None, None])), 0, 255).astype(np.uint8)


# -- the registry --------------------------------------------------------------------------------
_BG_RULE = (f"background = pixels within {BACKGROUND_TOL} (of 255, every channel) of the median colour of the 1-px border, "
            f"for images whose border is at least {SEPARABLE_BORDER_SHARE:.0%} background (others unchanged, counted); "
            "foreground pixels untouched; ")

# Ladders: the default takes 2-4 severities per transform (29 conditions with clean), mild to severe,
# so that the whole suite on the digits bundle (360 images, 4 scorers) stays within a minute on 2 CPUs
# (docs/BENCHMARKS.md); "fine" adds the steps between (42 conditions). Every severity's images are
# the same in both (one seed per transform and severity), so the default is a subset of the fine one.
LADDERS = ("default", "fine")

TRANSFORMS: dict[str, Transform] = {t.name: t for t in (
    Transform("crop", "crop", "area fraction kept",
              "centred crop keeping this fraction of the image area (each side x sqrt(fraction), rounded), "
              "resized back to the input size with Pillow bilinear", (0.81, 0.49, 0.25), 0.0, 1.0, False, _crop,
              fine=(0.81, 0.64, 0.49, 0.36, 0.25)),
    Transform("scale", "scale", "object scale",
              "whole image shrunk to this fraction of each side (Pillow bilinear, antialiased), centred on a canvas of the "
              "input size filled with the image's border median colour", (0.9, 0.6, 0.4), 0.0, 1.0, False, _scale,
              fine=(0.9, 0.75, 0.6, 0.5, 0.4)),
    Transform("jpeg", "jpeg", "JPEG quality",
              "encoded with Pillow (libjpeg) at this quality, 4:2:0 chroma subsampling, then decoded",
              (90, 50, 15, 5), 1, 95, True, _jpeg, integer=True,
              fine=(90, 70, 50, 30, 15, 5)),
    Transform("occlusion", "occlusion", "square side / shorter image side",
              "one square per image, side = fraction x shorter side (rounded), at a seeded uniform position fully inside "
              "the image with its corner off the patch grid wherever possible (straddles patches), filled by the fill rule",
              (0.125, 0.25, 0.5), 0.0, 1.0, False, _occlude(aligned=False),
              fine=(0.125, 0.25, 0.375, 0.5)),
    Transform("occlusion-aligned", "occlusion", "square side / shorter image side",
              "one square per image, side = fraction x shorter side rounded to whole patches (at least one), at a seeded "
              "position on the patch grid (covers whole patches), filled by the fill rule",
              (0.125, 0.25, 0.5), 0.0, 1.0, False, _occlude(aligned=True),
              fine=(0.125, 0.25, 0.375, 0.5)),
    Transform("background-solid", "background", "grey level",
              _BG_RULE + "background replaced by this grey level", (64, 128, 192), 0, 255, True,
              _replace_background(_solid), integer=True, needs_background=True),
    Transform("background-noise", "background", "noise amplitude",
              _BG_RULE + "background replaced by seeded uniform colour noise in [0, amplitude]", (64, 128), 0, 255, False,
              _replace_background(_noise), integer=True, needs_background=True, fine=(32, 64, 128)),
    Transform("background-texture", "background", "texture amplitude",
              _BG_RULE + "background replaced by a seeded procedural texture (mean of three coloured sinusoidal gratings, "
              "period 3-12 px, random orientation) scaled to [0, amplitude]", (64, 128), 0, 255, False,
              _replace_background(texture), integer=True, needs_background=True, fine=(32, 64, 128)),
    Transform("brightness", "photometric", "brightness factor",
              "every pixel multiplied by the factor, rounded and clipped to 0..255 (Pillow ImageEnhance.Brightness)",
              (0.5, 1.5), 0.0, 4.0, False, _brightness,
              fine=(0.5, 0.75, 1.25, 1.5)),
    Transform("contrast", "photometric", "contrast factor",
              "blend with the image's mean luma (ITU-R 601): m + factor x (p - m), rounded and clipped "
              "(Pillow ImageEnhance.Contrast)", (0.25, 0.5, 1.5), 0.0, 4.0, False, _contrast,
              fine=(0.25, 0.5, 0.75, 1.5)),
)}


def get_transform(name: str) -> Transform:
    if name not in TRANSFORMS:
        raise UserError(f"unknown transform {name!r}; choose from {', '.join(TRANSFORMS)} (or all, none)")
    return TRANSFORMS[name]


def parse_suite(suite: str | None, severities: Sequence[str] = (), ladder: str = "default") -> list[tuple[Transform, tuple[float, ...]]]:
    """``--suite all|none|crop,jpeg,...``, ``--ladder`` and ``--severity jpeg=90,50`` -> [(transform, severities)]."""
    if ladder not in LADDERS:
        raise UserError(f"unknown ladder {ladder!r}; choose from {', '.join(LADDERS)}")
    text = (suite or "all").strip().lower()
    if text == "none":
        names: list[str] = []
    elif text == "all":
        names = list(TRANSFORMS)
    else:
        names = []
        for part in text.split(","):
            part = part.strip()
            if part and part not in names:
                get_transform(part)
                names.append(part)
    chosen: dict[str, tuple[float, ...]] = {n: TRANSFORMS[n].ladder(ladder) for n in names}
    for item in severities:
        name, sep, values = item.partition("=")
        name = name.strip().lower()
        if not sep:
            raise UserError(f"--severity {item!r} is not NAME=V1,V2 (e.g. jpeg=90,50,10)")
        transform = get_transform(name)
        try:
            levels = tuple(float(v) for v in values.split(",") if v.strip())
        except ValueError:
            raise UserError(f"--severity {item!r}: severities must be numbers (e.g. jpeg=90,50,10)") from None
        if not levels:
            raise UserError(f"--severity {item!r} names no severities")
        for level in levels:
            transform.check(level)
        chosen[name] = levels
    for name, levels in chosen.items():
        for level in levels:
            TRANSFORMS[name].check(level)
    return [(TRANSFORMS[n], chosen[n]) for n in chosen]
