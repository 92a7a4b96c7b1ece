"""``Classifier``: the object an application embeds. Pixels or image files in, top-k labels out.

    clf = Classifier.load("bundle")                   # TensorRT engine if one fits this device, else ORT
    clf.classify("cat.jpg")                            # [[Top(label='cat', prob=0.93), ...]]
    clf.classify(frame_uint8_hwc, top_k=3)             # a camera frame, in the graph's channel order
    clf.classify(batch_uint8_nhwc)                     # any N: split to the engine's batch limits
    clf.classify([photo_640x480, crop_120x300])        # a variable-size bundle: any sizes in one batch
    clf.embed(images)                                  # [N, d] pooled features (bundles exported with
    clf.patch_grid(images)                             # [N, d, G_h, G_w]    --outputs ...,embedding,patch_grid)

What the graph takes is the bundle's input contract (vitdeploy.contract): one size, a chosen size of
a dynamic graph, or a canvas with each image's valid size (``export --variable-size``: mixed sizes
share one call). The contract prepares each image and builds the named feeds; this class batches,
runs and reads the outputs, the same for every contract.

Backend choice (``prefer``, in order) is vitdeploy.runtime.select's: "tensorrt" takes the bundle's
engine whose fingerprint (TensorRT version, GPU, compute capability) matches this device;
"onnxruntime" runs the bundle's graph with the CUDA provider when onnxruntime-gpu sees a GPU, else on
the CPU. Why each backend was passed over is kept in ``backend_reason``.

Threads: one Classifier may be shared. ONNX Runtime sessions are documented as safe for concurrent
``run`` calls, so ORT calls go in parallel without a lock. A TensorRT execution context and its
device buffers are not: TensorRT calls hold a lock. One context (rather than one per thread) is a
deliberate choice: each context owns its activation memory, which on a Jetson comes out of the
memory the CPU shares, and one context already keeps the GPU busy with batches; a server that needs
concurrent engines runs several instances (Triton's instance_group).

Imports numpy and vitdeploy's light core only; onnxruntime/tensorrt are imported when a backend is
loaded, torch never.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any, Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from ..bundle import Bundle
from ..contract import InputContract
from ..errors import UserError
from .engines import EngineEntry, find_engines  # noqa: F401 - re-exported (vitdeploy.runtime.classifier.find_engines)
from .files import expand_image_paths, load_npy_images
from .select import BACKENDS, DEFAULT_ORT_BATCH, PRECISION_CHOICES, select_runner  # noqa: F401 - re-exported


class Top(NamedTuple):
    label: str
    prob: float


ImageInput = Any  # path, uint8 HWC array, uint8 NHWC array, or a sequence of paths/HWC arrays


class Classifier:
    """A loaded bundle on one backend. Build it with :meth:`load`."""

    def __init__(
        self,
        runner: Any,
        bundle: Bundle,
        *,
        backend: str,
        precision: str,
        backend_reason: str,
        input_size: tuple[int, int],
        max_batch: int,
        min_batch: int = 1,
        thread_safe: bool = False,
        contract: InputContract | None = None,
    ):
        self.runner = runner
        self.bundle = bundle
        self.backend = backend
        self.precision = precision
        self.backend_reason = backend_reason
        self.contract = contract or InputContract.from_bundle(bundle, size=input_size)
        self.input_size = tuple(self.contract.size)
        self.max_batch = max(1, int(max_batch))
        self.min_batch = max(1, int(min_batch))
        self.preprocessing = bundle.preprocessing
        num_classes = bundle.spec.num_classes
        labels = bundle.labels
        self.labels = labels if len(labels) == num_classes else [str(k) for k in range(num_classes)]
        self._lock = contextlib.nullcontext() if thread_safe else threading.Lock()

    @property
    def size_ranges(self) -> tuple[tuple[int, int], tuple[int, int]] | None:
        """(H min, H max), (W min, W max) the backend accepts (an engine's profile); None: any size."""
        c = self.contract
        return (c.heights, c.widths) if c.heights is not None and c.widths is not None else None

    # -- loading ------------------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        bundle: str | os.PathLike | Bundle,
        prefer: Sequence[str] = BACKENDS,
        precision: str = "best",
        providers: Sequence[str] | None = None,
        threads: int | None = None,
        size: Sequence[int] | None = None,
        max_batch: int | None = None,
    ) -> "Classifier":
        """Load ``bundle`` on the first backend of ``prefer`` that can run it here.

        ``precision``: "best" or one of fp32/fp16/int8 (that graph or engine must exist).
        ``providers``/``threads``: ONNX Runtime execution providers and intra-op threads.
        ``size``: (H, W) for a dynamic-resolution bundle (default: the manifest's resolution).
        ``max_batch``: split larger inputs into batches of this size (ORT; engines use their profile).
        """
        if not isinstance(bundle, Bundle):
            bundle = Bundle.open(bundle)
        if precision not in PRECISION_CHOICES:
            raise UserError(f"precision must be one of {', '.join(PRECISION_CHOICES)}, got {precision!r}")
        chosen = select_runner(bundle, InputContract.from_bundle(bundle, size=size), prefer, precision, providers, threads)
        contract = chosen.contract
        return cls(chosen.runner, bundle, backend=chosen.backend, precision=chosen.precision, backend_reason=chosen.backend_reason,
                   input_size=contract.size, max_batch=contract.max_rows(max_batch or DEFAULT_ORT_BATCH), min_batch=contract.min_rows,
                   thread_safe=chosen.thread_safe, contract=contract)

    # -- inference ----------------------------------------------------------------------------
    def classify(self, images: ImageInput, top_k: int = 5) -> list[list[Top]]:
        """Top-k (label, probability) per image, highest first (ties: lower class index first)."""
        if top_k < 1:
            raise UserError(f"top_k must be at least 1, got {top_k}")
        return [top_k_of(row, self.labels, top_k) for row in self.probabilities(images)]

    def probabilities(self, images: ImageInput) -> np.ndarray:
        """Class probabilities [N, K] (the graph's ``probs``, else softmax of its ``logits``)."""
        self._require_output("probs", "logits")
        return self._collect(images, "probs")

    def embed(self, images: ImageInput, normalize: bool = False) -> np.ndarray:
        """Pooled pre-head features [N, d]: the graph's ``embedding`` output (the model's own read-out,
        final-normalised; already L2-normalised when exported with --normalize-embedding).
        ``normalize=True`` L2-normalises here (for cosine retrieval on a graph that does not)."""
        self._require_output("embedding")
        out = self._collect(images, "embedding")
        if normalize:
            out = out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out

    def patch_grid(self, images: ImageInput) -> np.ndarray:
        """Final patch tokens [N, d, G_h, G_w] in row-major grid order (token n = r*G_w + s at
        [:, :, r, s]); prefix and register tokens excluded. All images must share one size here,
        since G_h x G_w follows the input size."""
        self._require_output("patch_grid")
        return self._collect(images, "patch_grid")

    def run_padded(self, images: np.ndarray, valid_hw: np.ndarray, output: str = "probs") -> np.ndarray:
        """``output`` for a variable-size batch already padded into the canvas (images [B, H_c, W_c, 3]
        and valid_hw [B, 2]), checked by the contract first."""
        feeds = self.contract.check_feeds({self.contract.image_input: images, "valid_hw": valid_hw})
        return self._run(feeds)[output]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every output for named feeds the contract accepts (split to the backend's batch limits)."""
        return self._run(self.contract.check_feeds(feeds))

    @property
    def outputs(self) -> list[str]:
        """The outputs the bundle's graph declares (logits, probs, embedding, patch_grid)."""
        return list(self.bundle.graph.outputs or ("logits", "probs"))

    def _require_output(self, name: str, *alternatives: str) -> None:
        have = self.outputs
        if name in have or any(a in have for a in alternatives):
            return
        what = {"embedding": "embeddings", "patch_grid": "patch grids", "probs": "class probabilities"}[name]
        hint = ("the model has no classification head" if name == "probs" and not self.bundle.spec.num_classes
                else f"re-export with --outputs {','.join(have + [name])}")
        raise UserError(f"bundle {self.bundle.root} gives no {what}: its graph's outputs are {','.join(have)}; {hint}")

    def _collect(self, images: ImageInput, name: str) -> np.ndarray:
        rows = [self._run(feeds)[name] for feeds in self._batches(images)]
        if not rows:
            raise UserError("no images given")
        if len({r.shape[1:] for r in rows}) > 1:
            raise UserError(f"the images give {name} of different shapes {sorted({r.shape[1:] for r in rows})}; "
                            "pass images of one size (or load with size=(H, W))")
        return np.concatenate(rows, axis=0)

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Checked feeds -> float32 outputs (probs derived from logits when the graph has none), in calls
        of at most ``max_batch`` rows, each padded to ``min_batch`` (an engine profile's minimum) and cut back."""
        parts = []
        total = self.contract.rows(feeds)
        for start in range(0, total, self.max_batch):
            chunk = self.contract.take(feeds, start, start + self.max_batch)
            count = self.contract.rows(chunk)
            with self._lock:
                outputs = self.runner.run(self.contract.pad_rows(chunk, self.min_batch))
            parts.append({k: np.asarray(v, dtype=np.float32)[:count] for k, v in outputs.items()})
        out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        if "probs" not in out and "logits" in out:
            out["probs"] = softmax(out["logits"].astype(np.float64)).astype(np.float32)
        return out

    # -- turning inputs into graph batches ----------------------------------------------------
    def prepare(self, image: Any) -> np.ndarray:
        """One input (path or uint8 HWC array) -> the uint8 HWC image the graph is fed (the contract's
        :meth:`~vitdeploy.contract.InputContract.prepare`: decoded, brought to the graph by the manifest's
        rule, in the graph's channel order)."""
        return self.contract.prepare(image)

    def _items(self, images: ImageInput) -> Iterable[Any]:
        if isinstance(images, (str, os.PathLike)):
            return [images]
        if isinstance(images, np.ndarray):
            return list(images) if images.ndim == 4 else [images]
        if isinstance(images, (list, tuple)):
            return images
        raise UserError(f"cannot classify a {type(images).__name__}; give image paths or uint8 arrays")

    def _batches(self, images: ImageInput) -> Iterator[dict[str, np.ndarray]]:
        """Named feeds of at most ``max_batch`` prepared images each (one size per call, except a canvas)."""
        prepared = (self.prepare(item) for item in self._items(images))
        for run in self.contract.group(prepared, self.max_batch):
            yield self.contract.feeds(run)

    # -- housekeeping -------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        return {
            "bundle": str(self.bundle.root),
            "backend": self.backend,
            "precision": self.precision,
            "device": getattr(getattr(self.runner, "info", None), "device", "?"),
            "input_size": list(self.input_size),
            "batch": [self.min_batch, self.max_batch],
            "backend_reason": self.backend_reason,
            **self.contract.runtime_details(),
        }

    def close(self) -> None:
        self.runner.close()

    def __enter__(self) -> "Classifier":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the `vitdeploy predict` and `vitdeploy embed` entry points -------------------------------------
def predict_files(
    bundle: str | os.PathLike | Bundle,
    images: Sequence[str | os.PathLike],
    top_k: int = 5,
    precision: str = "best",
    prefer: Sequence[str] = BACKENDS,
    size: Sequence[int] | None = None,
    strict: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Classify image files: ``[{"image": path, "top": [{"label", "prob"}, ...]}, ...]`` and the
    classifier's description (backend, precision, device, why).

    A file that cannot be read (not an image, truncated, too large) gets ``{"image": path, "error":
    one line}`` in its place and the others are still classified; ``strict`` stops at the first.
    """
    paths = expand_image_paths(images)
    with Classifier.load(bundle, prefer=prefer, precision=precision, size=size) as clf:
        prepared, errors = prepare_each(clf, paths, strict)
        tops = dict(zip([i for i, _ in prepared], clf.classify([a for _, a in prepared], top_k=top_k)))
        about = clf.describe()
    results = [
        {"image": str(path), "error": errors[i]} if i in errors else
        {"image": str(path), "top": [{"label": t.label, "prob": t.prob} for t in tops[i]]} for i, path in enumerate(paths)
    ]
    return results, about


def prepare_each(clf: Classifier, paths: Sequence[Path], strict: bool) -> tuple[list[tuple[int, np.ndarray]], dict[int, str]]:
    """Each file decoded and brought to the graph one by one, so one bad file names itself and costs only
    itself: (index, image) of those read, {index: one line} of those not; ``strict`` stops at the first."""
    prepared: list[tuple[int, np.ndarray]] = []
    errors: dict[int, str] = {}
    for i, path in enumerate(paths):
        try:
            prepared.append((i, clf.prepare(str(path))))
        except UserError as exc:
            if strict:
                raise
            errors[i] = str(exc)
    if not prepared:
        raise UserError(f"none of the {len(paths)} images could be read; first: {errors[0]}")
    return prepared, errors


def embed_files(
    bundle: str | os.PathLike | Bundle,
    images: Sequence[str | os.PathLike],
    patch_grid: bool = False,
    normalize: bool = False,
    precision: str = "best",
    prefer: Sequence[str] = BACKENDS,
    size: Sequence[int] | None = None,
    strict: bool = False,
) -> tuple[np.ndarray, list[str], dict[str, Any]]:
    """Features of image files (or one uint8 [N, H, W, 3] .npy array): the embedding [N, d], or with
    ``patch_grid`` the patch grid [N, d, G_h, G_w]; the image names in row order; the classifier's
    description, whose ``unreadable`` lists the files left out ({"file", "reason"}) as predict_files
    does: a file that cannot be read has no row and the others are embedded; ``strict`` stops at the first."""
    arrays = [Path(p) for p in images if str(p).endswith(".npy")]
    with Classifier.load(bundle, prefer=prefer, precision=precision, size=size) as clf:
        if arrays:
            if len(arrays) != len(images):
                raise UserError("give image files/folders or one .npy array, not both")
            loaded = [load_npy_images(p) for p in arrays]
            names = [f"{p}[{i}]" for p, a in zip(arrays, loaded) for i in range(len(a))]
            source: Any = np.concatenate(loaded)
            unreadable: list[dict[str, str]] = []
        else:
            paths = expand_image_paths(images)
            prepared, errors = prepare_each(clf, paths, strict)
            names = [str(paths[i]) for i, _ in prepared]
            source = [a for _, a in prepared]
            unreadable = [{"file": str(paths[i]), "reason": why} for i, why in errors.items()]
        feats = clf.patch_grid(source) if patch_grid else clf.embed(source, normalize=normalize)
        about = {**clf.describe(), "unreadable": unreadable}
    return feats, names, about


# -- top-k and softmax (the C++ example implements the same two functions) --------------------
def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def top_k_of(probs: np.ndarray, labels: Sequence[str], k: int) -> list[Top]:
    """The k most probable classes, highest first; ties go to the lower index (stable sort)."""
    order = np.argsort(-np.asarray(probs, dtype=np.float64), kind="stable")[: min(k, len(probs))]
    return [Top(labels[i], float(probs[i])) for i in order]
