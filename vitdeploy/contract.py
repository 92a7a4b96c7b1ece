"""The input contract: what a bundle's graph takes, parsed once from its manifest (issue 28).

Every vitdeploy graph takes raw pixels; how they must arrive is one of three kinds:

    fixed    one H x W (a static graph); the host brings every image to it by the manifest's resize rule
    dynamic  any H x W (whole patches; any size at all when the graph resizes inside); the host feeds a
             chosen size (``size=``, else the manifest's resolution)
    canvas   images padded top-left into one H_c x W_c canvas plus ``valid_hw`` [B, 2] int32, each
             image's own whole-patch size (``export --variable-size``); the host fits each image into
             the canvas by the manifest's policy (vitdeploy.variable)

with the graph's dtype and layout (uint8 NHWC, or float NCHW already normalised for ``--input
float-nchw``), its channel order, the host resize rule, the in-graph resize, and the rows one call
takes (a fixed graph batch, or an engine profile's range, which also bounds H and W).

The contract prepares an image (a path or an array) for the graph, builds the named feeds of a batch
(``{"images": ...}`` or ``{"images": ..., "valid_hw": ...}``), checks feeds in one line each, pads a
batch to a minimum number of rows, and crops a batch back to each image at its own size (what the
PyTorch reference runs). Classifier, check, evaluate, profile, serve and triton-repo ask it instead
of branching on the bundle kind. Numpy and Pillow only: this runs on the device (Python 3.8).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .errors import UserError
from .variable import VALID_INPUT, check_sizes_for_canvas, fit_image, pad_to_canvas

FIXED, DYNAMIC, CANVAS = "fixed", "dynamic", "canvas"
KINDS = (FIXED, DYNAMIC, CANVAS)
IMAGE_INPUT = "images"  # the pixel input of every vitdeploy graph


@dataclass(frozen=True)
class InputContract:
    """What one graph (or one engine built from it) takes; build it with :meth:`from_bundle`."""

    kind: str  # fixed | dynamic | canvas
    size: Tuple[int, int]  # the size fed: the fixed size, a dynamic graph's chosen size, the canvas
    patch: Tuple[int, int]
    native: Tuple[int, int]  # the model's own size (its position table's grid)
    preprocessing: Dict[str, Any] = field(repr=False, compare=False)
    policy: Optional[str] = None  # canvas: how the host fits an image (fit-within, shrink-within, none)
    batch: Tuple[int, Optional[int]] = (1, None)  # rows one call takes: (min, max); max None: no bound
    heights: Optional[Tuple[int, int]] = None  # H / W an engine profile accepts (None: what the kind accepts)
    widths: Optional[Tuple[int, int]] = None
    max_grid: Optional[Tuple[int, int]] = None  # relative-position tables built for at most this grid
    image_input: str = IMAGE_INPUT  # the pixel input's name in the graph

    # -- parsing -----------------------------------------------------------------------------------
    @classmethod
    def from_bundle(cls, bundle: Any, size: Optional[Sequence[int]] = None, policy: Optional[str] = None) -> "InputContract":
        """The contract of ``bundle``'s graphs. ``size``: the H x W to feed a dynamic graph (default: the
        manifest's resolution; a fixed graph refuses another). ``policy``: a canvas's fit policy instead of
        the manifest's."""
        return cls.from_manifest(bundle.preprocessing, bundle.resolution, bundle.spec, size, policy, bundle.manifest.get("graph"))

    @classmethod
    def from_manifest(cls, preprocessing: Dict[str, Any], resolution: Dict[str, Any], spec: Any,
                      size: Optional[Sequence[int]] = None, policy: Optional[str] = None,
                      graph: Optional[Dict[str, Any]] = None) -> "InputContract":
        from .images import host_resize_rule, model_input_size

        host_resize_rule(preprocessing)  # a manifest with an unknown rule fails here, once
        patch = (int(spec.patch_size[0]), int(spec.patch_size[1]))
        native = (int(spec.image_size[0]), int(spec.image_size[1]))
        grid = getattr(spec, "max_grid", None)
        declared = (graph or {}).get("input")  # {"name": ..., "dtype": ..., "layout": ...}, or a bare name in older manifests
        name = str((declared.get("name") if isinstance(declared, dict) else declared) or IMAGE_INPUT)
        common = {"patch": patch, "native": native, "preprocessing": preprocessing, "image_input": name,
                  "max_grid": tuple(grid) if grid else None}
        canvas = preprocessing.get("variable_size")
        if canvas:
            from .variable import POLICIES

            chosen = policy or canvas.get("host_policy", "fit-within")
            if chosen not in POLICIES:
                raise UserError(f"unknown variable-size policy {chosen!r}; use one of {', '.join(POLICIES)}")
            hw = (int(canvas["canvas"][0]), int(canvas["canvas"][1]))
            if size is not None and tuple(int(v) for v in size) != hw:
                raise UserError(f"this bundle takes images of any size in a {hw[0]}x{hw[1]} canvas (--variable-size); "
                                "a size is not chosen at run time: each image keeps its own")
            return cls(CANVAS, hw, policy=chosen, **common)
        fed = model_input_size(preprocessing, resolution, patch, size)
        dynamic = resolution.get("mode") == "dynamic" or bool(preprocessing.get("in_graph_resize"))
        return cls(DYNAMIC if dynamic else FIXED, fed, **common)

    # -- what the graph takes ----------------------------------------------------------------------
    @property
    def input_names(self) -> Tuple[str, ...]:
        return (self.image_input, VALID_INPUT) if self.kind == CANVAS else (self.image_input,)

    @property
    def mixes_sizes(self) -> bool:
        """One call holds images of several sizes, each row with its own valid size (a canvas)."""
        return self.kind == CANVAS

    @property
    def float_input(self) -> bool:
        """The graph takes float NCHW already normalised (``--input float-nchw``): the host normalises."""
        return self.preprocessing.get("input", "uint8-nhwc") == "float-nchw"

    @property
    def in_graph_resize(self) -> Optional[Tuple[int, int]]:
        to = (self.preprocessing.get("in_graph_resize") or {}).get("to")
        return (int(to[0]), int(to[1])) if to else None

    @property
    def source_size(self) -> Tuple[int, int]:
        """The size a data source (a labelled set, a camera) is brought to before :meth:`prepare`: the fed
        size, or for a canvas the model's native size (the host policy then fits each image in)."""
        return self.native if self.kind == CANVAS else self.size

    def narrowed(self, batch: Optional[Tuple[int, Optional[int]]] = None, heights: Optional[Tuple[int, int]] = None,
                 widths: Optional[Tuple[int, int]] = None) -> "InputContract":
        """The contract of one runner of these graphs: a fixed graph batch, or an engine profile's ranges."""
        return replace(self, batch=batch or self.batch, heights=heights or self.heights, widths=widths or self.widths)

    def with_policy(self, policy: str) -> "InputContract":
        """A canvas contract whose host places images by ``policy`` (``none``: as they are)."""
        return replace(self, policy=policy) if self.kind == CANVAS else self

    def at_size(self, height: int, width: int) -> "InputContract":
        """The contract that feeds images of ``height`` x ``width`` as they are: a graph fed that size (a
        dynamic graph's chosen size, or a static re-export at it); a canvas places them unresized."""
        if self.kind == CANVAS:
            return self.with_policy("none")
        return replace(self, size=(int(height), int(width)))

    @property
    def min_rows(self) -> int:
        return max(1, int(self.batch[0]))

    def max_rows(self, default: int) -> int:
        """Rows per call: the contract's upper bound, or ``default`` where it has none."""
        return max(1, int(self.batch[1])) if self.batch[1] is not None else max(1, int(default))

    def accepts(self, height: int, width: int) -> bool:
        """Whether an image of this size is fed as it is (no host resize)."""
        try:
            self.check_size(height, width)
        except UserError:
            return False
        return True

    def check_size(self, height: int, width: int) -> None:
        """Refuse, in one line, an image size this graph (or engine profile) cannot take as it is."""
        h, w = int(height), int(width)
        if self.kind == CANVAS:
            check_sizes_for_canvas(np.array([[h, w]], dtype=np.int64), self.size, self.patch)
        elif self.kind == FIXED and (h, w) != self.size:
            raise UserError(f"this graph takes {self.size[0]}x{self.size[1]} images only (static resolution); got {h}x{w}")
        elif self.kind == DYNAMIC and self.in_graph_resize is None:
            from .spec import check_resolution

            check_resolution(h, w, self.patch)
            grid = (h // self.patch[0], w // self.patch[1])
            if self.max_grid is not None and (grid[0] > self.max_grid[0] or grid[1] > self.max_grid[1]):
                raise UserError(f"{h}x{w} gives a {grid[0]}x{grid[1]} patch grid, beyond the {self.max_grid[0]}x{self.max_grid[1]} "
                                "this graph's relative-position tables were built for")
        for name, value, bounds in (("height", h, self.heights), ("width", w, self.widths)):
            if bounds is not None and not bounds[0] <= value <= bounds[1]:
                raise UserError(f"image {name} {value} is outside the engine profile's {bounds[0]}..{bounds[1]}; "
                                "rebuild the engine with a wider --resolution")

    # -- images -> the graph ------------------------------------------------------------------------
    def prepare(self, image: Any) -> np.ndarray:
        """One input (an image file, or a uint8 [H, W, 3] array) -> the uint8 HWC image the graph is fed.

        Files are decoded (EXIF upright, RGB), brought to the graph by the manifest's rule and put in the
        graph's channel order. Arrays are taken to be in the graph's channel order already; one the graph
        takes as it is goes in unchanged (a fixed graph's size; any size in range when the graph resizes
        inside), another is resized by the rule; a canvas fits every image into itself by its policy.
        """
        from .images import decode_image, to_channel_order

        if isinstance(image, (str, os.PathLike)):
            return to_channel_order(self._to_graph_size(decode_image(image)), self.preprocessing)
        if isinstance(image, np.ndarray):
            if image.dtype != np.uint8:
                raise UserError(f"images must be uint8 pixels, got {image.dtype}; pass the raw image (the graph normalises it)")
            if image.ndim != 3 or image.shape[2] != 3:
                raise UserError(f"an image must be uint8 [H, W, 3] (or a batch [N, H, W, 3]), got shape {list(image.shape)}")
            return self._to_graph_size(image)
        raise UserError(f"cannot classify a {type(image).__name__}; give image paths or uint8 arrays")

    def takes_as_is(self, height: int, width: int) -> bool:
        """An array of this size goes to the graph unresized: the size fed, or any size in range when the
        graph resizes inside (a canvas always applies its fit policy, which keeps fitted sizes)."""
        if self.kind == CANVAS:
            return False
        return (int(height), int(width)) == self.size or (self.in_graph_resize is not None and self.accepts(height, width))

    def _to_graph_size(self, image: np.ndarray) -> np.ndarray:
        from .images import resize_for_model

        if self.kind == CANVAS:
            return fit_image(image, self.preprocessing, self.policy)
        if self.takes_as_is(*image.shape[:2]):
            return image
        return resize_for_model(image, self.preprocessing, self.size)

    def prepare_all(self, images: Iterable[Any]) -> List[np.ndarray]:
        return [self.prepare(image) for image in images]

    def group(self, images: Iterable[np.ndarray], max_rows: int) -> Iterator[List[np.ndarray]]:
        """Prepared images in runs that can share one call: at most ``max_rows``, one size each (a canvas
        mixes sizes: each row carries its own)."""
        run: List[np.ndarray] = []
        for image in images:
            if run and (len(run) == max_rows or (not self.mixes_sizes and run[0].shape != image.shape)):
                yield run
                run = []
            run.append(image)
        if run:
            yield run

    def feeds(self, images: Any) -> Dict[str, np.ndarray]:
        """Prepared images (a list of uint8 HWC arrays, or one [N, H, W, 3] array) -> the graph's named
        feeds, checked: the batch (normalised float NCHW for a float-input graph), and for a canvas the
        images padded top-left with ``valid_hw`` = each one's own size."""
        rows = list(images)
        if not rows:
            raise UserError("no images given")
        if self.kind == CANVAS:
            batch, valid = pad_to_canvas(rows, self.size)
            return self.check_feeds({self.image_input: batch, VALID_INPUT: valid})
        shapes = sorted({tuple(r.shape) for r in rows})
        if len(shapes) > 1:
            raise UserError(f"one batch holds images of several sizes {[list(s[:2]) for s in shapes]}; this graph takes one size per call")
        batch = np.stack(rows)
        if self.float_input:
            from .preprocess import normalise

            batch = normalise(batch, self.preprocessing)
        return self.check_feeds({self.image_input: batch})

    def feeds_for(self, images: Any) -> Dict[str, np.ndarray]:
        """uint8 images in the graph's channel order (an [N, H, W, 3] array or a list of HWC arrays) ->
        feeds, each image prepared as :meth:`prepare` does; a batch the graph takes as it is is not copied."""
        if (isinstance(images, np.ndarray) and images.ndim == 4 and images.dtype == np.uint8 and not self.float_input
                and self.takes_as_is(*images.shape[1:3])):
            return self.check_feeds({self.image_input: images})
        return self.feeds(self.prepare_all(images))

    def check_feeds(self, feeds: Mapping[str, Any]) -> Dict[str, np.ndarray]:
        """The feeds as the graph takes them (valid_hw as int32, contiguous), or one line saying what is wrong."""
        names = tuple(feeds)
        if set(names) != set(self.input_names):
            missing = [n for n in self.input_names if n not in feeds]
            hint = (f"; {VALID_INPUT} is each image's (height, width) in the canvas: build the feeds with "
                    "vitdeploy.contract.InputContract.feeds (or use the Classifier)") if VALID_INPUT in missing else ""
            raise UserError(f"the graph takes inputs ({', '.join(self.input_names)}), got ({', '.join(names) or 'none'}){hint}")
        name = self.image_input
        images = np.ascontiguousarray(feeds[name])
        if self.float_input and images.dtype not in (np.float32, np.float16):
            raise UserError(f"input {name!r} takes normalised float32 [N, 3, H, W] (--input float-nchw), got {images.dtype}")
        if not self.float_input and images.dtype != np.uint8:
            raise UserError(f"input {name!r} takes uint8, got {images.dtype}; pass the raw pixels (the graph normalises them)")
        channels = 1 if self.float_input else 3
        if images.ndim != 4 or images.shape[channels] != 3:
            layout = "[N, 3, H, W]" if self.float_input else "[N, H, W, 3]"
            raise UserError(f"input {name!r} must be {layout}, got shape {list(images.shape)}")
        rows = int(images.shape[0])
        if rows < 1:
            raise UserError("no images given")
        if self.batch[1] is not None and rows > self.batch[1]:
            raise UserError(f"{rows} images in one call; this runner takes at most {self.batch[1]} (split the batch)")
        height, width = (images.shape[2:4] if self.float_input else images.shape[1:3])
        out = {name: images}
        if self.kind == CANVAS:
            if (int(height), int(width)) != self.size:
                raise UserError(f"{name} must be [B, {self.size[0]}, {self.size[1]}, 3] (the canvas), got {list(images.shape)}")
            valid = np.asarray(feeds[VALID_INPUT])
            check_sizes_for_canvas(valid, self.size, self.patch)
            if len(valid) != rows:
                raise UserError(f"{VALID_INPUT} has {len(valid)} rows for {rows} images")
            out[VALID_INPUT] = np.ascontiguousarray(valid, dtype=np.int32)
        else:
            self.check_size(int(height), int(width))
        return out

    # -- batches ------------------------------------------------------------------------------------
    @staticmethod
    def rows(feeds: Mapping[str, np.ndarray]) -> int:
        return int(len(next(iter(feeds.values()))))

    @staticmethod
    def take(feeds: Mapping[str, np.ndarray], start: int, stop: int) -> Dict[str, np.ndarray]:
        """Rows start:stop of every feed."""
        return {name: value[start:stop] for name, value in feeds.items()}

    @staticmethod
    def pad_rows(feeds: Mapping[str, np.ndarray], rows: int) -> Dict[str, np.ndarray]:
        """Every feed grown to ``rows`` rows with copies of its last row (an engine profile's minimum);
        the caller cuts the outputs back."""
        have = InputContract.rows(feeds)
        if have >= rows:
            return dict(feeds)
        return {name: np.concatenate([value, np.repeat(value[-1:], rows - have, axis=0)]) for name, value in feeds.items()}

    def crops(self, feeds: Mapping[str, np.ndarray]) -> List[np.ndarray]:
        """Each row of uint8 feeds as the image it is: a canvas row cut to its valid size."""
        images = feeds[self.image_input]
        if self.kind != CANVAS:
            return list(images)
        return [images[i, :int(h), :int(w)] for i, (h, w) in enumerate(np.asarray(feeds[VALID_INPUT]).tolist())]

    def random_feeds(self, batch: int, height: int, width: int, seed: int = 0, dtype: Optional[str] = None,
                     valid_hw: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
        """Seeded synthetic feeds of the graph's own type (profile): uint8 NHWC pixels, or float NCHW
        (``dtype`` float16 for a graph whose float input is fp16); a canvas with ``valid_hw`` (default: full)."""
        rng = np.random.default_rng(seed)
        if self.float_input or dtype in ("float32", "float16"):
            pixels = rng.standard_normal((batch, 3, height, width)).astype(np.float16 if dtype == "float16" else np.float32)
        else:
            pixels = rng.integers(0, 256, size=(batch, height, width, 3), dtype=np.uint8)
        feeds = {self.image_input: pixels}
        if self.kind == CANVAS:
            valid = np.tile(np.array([[height, width]], dtype=np.int32), (batch, 1)) if valid_hw is None else valid_hw
            feeds[VALID_INPUT] = np.ascontiguousarray(valid, dtype=np.int32)
        return feeds

    # -- what a report says -------------------------------------------------------------------------
    def runtime_details(self) -> Dict[str, Any]:
        """What a runtime's description adds for this kind (a canvas: its size and fit policy)."""
        return {"canvas": list(self.size), "policy": self.policy} if self.kind == CANVAS else {}

    def describe(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"kind": self.kind, "inputs": list(self.input_names), "size": list(self.size),
                               "dtype": "float32" if self.float_input else "uint8", "layout": "NCHW" if self.float_input else "NHWC",
                               "channel_order": self.preprocessing.get("channel_order", "rgb"),
                               "batch": [self.batch[0], self.batch[1]]}
        if self.in_graph_resize is not None:
            out["in_graph_resize"] = list(self.in_graph_resize)
        if self.heights is not None or self.widths is not None:
            out["profile_hw"] = [list(self.heights or ()), list(self.widths or ())]
        out.update(self.runtime_details())
        return out
