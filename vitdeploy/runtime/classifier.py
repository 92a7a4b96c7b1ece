"""``Classifier``: the object an application embeds. Pixels or image files in, top-k labels out.

    clf = Classifier.load("bundle")                   # TensorRT engine if one fits this device, else ORT
    clf.classify("cat.jpg")                            # [[Top(label='cat', prob=0.93), ...]]
    clf.classify(frame_uint8_hwc, top_k=3)             # a camera frame, in the graph's channel order
    clf.classify(batch_uint8_nhwc)                     # any N: split to the engine's batch limits
    clf.embed(images)                                  # [N, d] pooled features (bundles exported with
    clf.patch_grid(images)                             # [N, d, G_h, G_w]    --outputs ...,embedding,patch_grid)

Backend choice (``prefer``, in order): "tensorrt" takes the bundle's engine whose fingerprint
(TensorRT version, GPU, compute capability) matches this device; "onnxruntime" runs the bundle's
graph with the CUDA provider when onnxruntime-gpu sees a GPU, else on the CPU. Why each backend was
passed over is kept in ``backend_reason``.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from ..bundle import Bundle
from ..errors import DeviceError, IntegrityError, UserError
from ..images import decode_image, model_input_size, resize_for_model, to_channel_order

BACKENDS = ("tensorrt", "onnxruntime")
PRECISION_CHOICES = ("best", "fp32", "fp16", "int8")
# "best" on a TensorRT engine: the lowest precision the bundle was built at (each graph's accuracy
# was measured when it was made). On ONNX Runtime: fp16 only with CUDA; on the CPU fp32, since
# fp16/int8 graphs gain nothing there and int8 integer kernels lose accuracy on CPUs without VNNI.
_TRT_BEST_ORDER = ("int8", "fp16", "fp32")
DEFAULT_ORT_BATCH = 32  # chunk size for dynamic-batch graphs: bounds host memory per call


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
    ):
        self.runner = runner
        self.bundle = bundle
        self.backend = backend
        self.precision = precision
        self.backend_reason = backend_reason
        self.input_size = input_size
        self.max_batch = max(1, int(max_batch))
        self.min_batch = max(1, int(min_batch))
        self.preprocessing = bundle.preprocessing
        self.in_graph_resize = bool(self.preprocessing.get("in_graph_resize"))
        self.float_input = self.preprocessing.get("input", "uint8-nhwc") == "float-nchw"
        num_classes = bundle.spec.num_classes
        labels = bundle.labels
        self.labels = labels if len(labels) == num_classes else [str(k) for k in range(num_classes)]
        self._lock = contextlib.nullcontext() if thread_safe else threading.Lock()
        # (H min, H max), (W min, W max) the backend accepts (an engine's profile); None: any size
        self.size_ranges: tuple[tuple[int, int], tuple[int, int]] | None = None

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
        prefer = tuple(prefer)
        unknown = [b for b in prefer if b not in BACKENDS]
        if unknown or not prefer:
            raise UserError(f"unknown backend {', '.join(unknown) or '(none)'}; choose from {', '.join(BACKENDS)}")
        if bundle.preprocessing.get("variable_size"):  # (images, valid_hw) graph: any size per image
            from .variable_classifier import VariableSizeClassifier

            return VariableSizeClassifier.load_variable(bundle, prefer, precision, providers, threads, max_batch)
        input_size = model_input_size(bundle.preprocessing, bundle.resolution, bundle.spec.patch_size, size)
        passed_over: list[str] = []
        for backend in prefer:
            try:
                if backend == "tensorrt":
                    return _load_tensorrt(cls, bundle, precision, input_size, passed_over)
                return _load_onnxruntime(cls, bundle, precision, providers, threads, input_size, max_batch, passed_over)
            except IntegrityError:  # a graph the manifest does not vouch for is refused, never passed over
                raise
            except (DeviceError, UserError) as exc:  # MissingDependencyError is a UserError
                if len(prefer) == 1:
                    raise
                passed_over.append(f"{backend}: {exc}")
        raise DeviceError(f"no backend can run {bundle.root} here ({'; '.join(passed_over)})")

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

    @property
    def outputs(self) -> list[str]:
        """The outputs the bundle's graph declares (logits, probs, embedding, patch_grid)."""
        return list(self.bundle.manifest.get("graph", {}).get("outputs") or ("logits", "probs"))

    def _require_output(self, name: str, *alternatives: str) -> None:
        have = self.outputs
        if name in have or any(a in have for a in alternatives):
            return
        what = {"embedding": "embeddings", "patch_grid": "patch grids", "probs": "class probabilities"}[name]
        hint = ("the model has no classification head" if name == "probs" and not self.bundle.spec.num_classes
                else f"re-export with --outputs {','.join(have + [name])}")
        raise UserError(f"bundle {self.bundle.root} gives no {what}: its graph's outputs are {','.join(have)}; {hint}")

    def _collect(self, images: ImageInput, name: str) -> np.ndarray:
        rows = [self._pick(self._run(batch), name) for batch in self._batches(images)]
        if not rows:
            raise UserError("no images given")
        if len({r.shape[1:] for r in rows}) > 1:
            raise UserError(f"the images give {name} of different shapes {sorted({r.shape[1:] for r in rows})}; "
                            "pass images of one size (or load with size=(H, W))")
        return np.concatenate(rows, axis=0)

    @staticmethod
    def _pick(out: Any, name: str) -> np.ndarray:
        # a subclass whose _run returns the probabilities array itself (the variable-size classifier)
        return out[name] if isinstance(out, dict) else out

    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        count = len(batch)
        if count < self.min_batch:  # an engine profile (or a fixed batch) that needs more rows
            pad = np.repeat(batch[-1:], self.min_batch - count, axis=0)
            batch = np.concatenate([batch, pad], axis=0)
        feed = _normalise(batch, self.preprocessing) if self.float_input else batch
        with self._lock:
            outputs = self.runner.infer(feed)
        out = {k: np.asarray(v, dtype=np.float32)[:count] for k, v in outputs.items()}
        if "probs" not in out and "logits" in out:
            out["probs"] = softmax(out["logits"].astype(np.float64)).astype(np.float32)
        return out

    # -- turning inputs into graph batches ----------------------------------------------------
    def prepare(self, image: Any) -> np.ndarray:
        """One input (path or uint8 HWC array) -> the uint8 HWC image the graph is fed.

        Files are decoded (EXIF upright, RGB), resized by the manifest's rule and put in the graph's
        channel order. Arrays are taken to be in the graph's channel order already; one at the
        model's input size goes in unchanged, another size is resized by the rule (or, when the
        graph resizes inside, passed through for the graph to resize).
        """
        if isinstance(image, (str, os.PathLike)):
            rgb = resize_for_model(decode_image(image), self.preprocessing, self.input_size)
            return to_channel_order(rgb, self.preprocessing)
        if isinstance(image, np.ndarray):
            if image.dtype != np.uint8:
                raise UserError(f"images must be uint8 pixels, got {image.dtype}; pass the raw image (the graph normalises it)")
            if image.ndim != 3 or image.shape[2] != 3:
                raise UserError(f"an image must be uint8 [H, W, 3] (or a batch [N, H, W, 3]), got shape {list(image.shape)}")
            if tuple(image.shape[:2]) == self.input_size or (self.in_graph_resize and self._accepts(*image.shape[:2])):
                return image
            return resize_for_model(image, self.preprocessing, self.input_size)
        raise UserError(f"cannot classify a {type(image).__name__}; give image paths or uint8 arrays")

    def _accepts(self, height: int, width: int) -> bool:
        if self.size_ranges is None:
            return True
        (h0, h1), (w0, w1) = self.size_ranges
        return h0 <= height <= h1 and w0 <= width <= w1

    def _items(self, images: ImageInput) -> Iterable[Any]:
        if isinstance(images, (str, os.PathLike)):
            return [images]
        if isinstance(images, np.ndarray):
            if images.ndim == 4:
                return list(images)
            return [images]
        if isinstance(images, (list, tuple)):
            return images
        raise UserError(f"cannot classify a {type(images).__name__}; give image paths or uint8 arrays")

    def _batches(self, images: ImageInput) -> Iterator[np.ndarray]:
        """Prepared images grouped into batches of at most ``max_batch`` with one shape each."""
        group: list[np.ndarray] = []
        for item in self._items(images):
            img = self.prepare(item)
            if group and (len(group) == self.max_batch or group[0].shape != img.shape):
                yield np.stack(group)
                group = []
            group.append(img)
        if group:
            yield np.stack(group)

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
        }

    def close(self) -> None:
        self.runner.close()

    def __enter__(self) -> "Classifier":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the `vitdeploy predict` entry point -----------------------------------------------------
def expand_image_paths(items: Sequence[str | os.PathLike]) -> list[Path]:
    """Files as given; a folder stands for the image files under it (sorted)."""
    from ..images import IMAGE_SUFFIXES

    paths: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise UserError(f"folder {path} holds no image files ({', '.join(IMAGE_SUFFIXES)})")
            paths.extend(found)
        else:
            paths.append(path)
    if not paths:
        raise UserError("no images given")
    return paths


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
        prepared: list[tuple[int, np.ndarray]] = []
        errors: dict[int, str] = {}
        for i, path in enumerate(paths):
            try:  # decoded and resized one by one, so one bad file names itself and costs only itself
                prepared.append((i, clf.prepare(str(path))))
            except UserError as exc:
                if strict:
                    raise
                errors[i] = str(exc)
        if not prepared:
            raise UserError(f"none of the {len(paths)} images could be read; first: {errors[0]}")
        tops = dict(zip([i for i, _ in prepared], clf.classify([a for _, a in prepared], top_k=top_k)))
        about = clf.describe()
    results = [
        {"image": str(path), "error": errors[i]} if i in errors else
        {"image": str(path), "top": [{"label": t.label, "prob": t.prob} for t in tops[i]]} for i, path in enumerate(paths)
    ]
    return results, about


def embed_files(
    bundle: str | os.PathLike | Bundle,
    images: Sequence[str | os.PathLike],
    patch_grid: bool = False,
    normalize: bool = False,
    precision: str = "best",
    prefer: Sequence[str] = BACKENDS,
    size: Sequence[int] | None = None,
) -> tuple[np.ndarray, list[str], dict[str, Any]]:
    """Features of image files (or one uint8 [N, H, W, 3] .npy array): the embedding [N, d], or with
    ``patch_grid`` the patch grid [N, d, G_h, G_w]; the image names in row order; the classifier's
    description."""
    arrays = [Path(p) for p in images if str(p).endswith(".npy")]
    with Classifier.load(bundle, prefer=prefer, precision=precision, size=size) as clf:
        if arrays:
            if len(arrays) != len(images):
                raise UserError("give image files/folders or one .npy array, not both")
            batch = np.concatenate([_load_npy_images(p) for p in arrays])
            names = [f"{p}[{i}]" for p in arrays for i in range(len(_load_npy_images(p)))]
            source: Any = batch
        else:
            paths = expand_image_paths(images)
            names = [str(p) for p in paths]
            source = names
        feats = clf.patch_grid(source) if patch_grid else clf.embed(source, normalize=normalize)
        about = clf.describe()
    return feats, names, about


def _load_npy_images(path: Path) -> np.ndarray:
    try:
        arr = np.load(path, allow_pickle=False, mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path} as a .npy array ({exc})") from None
    if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[-1] != 3:
        raise UserError(f"{path} holds {arr.dtype} {list(arr.shape)}; expected uint8 [N, H, W, 3] images in the graph's channel order")
    return np.asarray(arr)


# -- top-k and softmax (the C++ example implements the same two functions) --------------------
def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def top_k_of(probs: np.ndarray, labels: Sequence[str], k: int) -> list[Top]:
    """The k most probable classes, highest first; ties go to the lower index (stable sort)."""
    order = np.argsort(-np.asarray(probs, dtype=np.float64), kind="stable")[: min(k, len(probs))]
    return [Top(labels[i], float(probs[i])) for i in order]


def _normalise(batch: np.ndarray, preprocessing: dict[str, Any]) -> np.ndarray:
    from ..preprocess import normalise

    return normalise(batch, preprocessing)


# -- backends ---------------------------------------------------------------------------------
def _load_onnxruntime(cls, bundle, precision, providers, threads, input_size, max_batch, passed_over) -> Classifier:
    from .ort import OrtRunner, default_providers

    providers = list(providers) if providers else default_providers()
    wants_cuda = "CUDAExecutionProvider" in providers
    have = bundle.precisions()
    if precision == "best":
        chosen = "fp16" if wants_cuda and "fp16" in have else "fp32"
        if chosen not in have:
            chosen = have[0] if have else "fp32"
    else:
        chosen = precision
    runner = OrtRunner(_ort_graph(bundle, chosen, wants_cuda), precision=chosen, providers=providers, threads=threads)
    if precision == "best" and chosen == "fp16" and runner.info.device == "cpu":
        # onnxruntime-gpu lists CUDA without a usable GPU and falls back silently: fp32 on the CPU.
        runner.close()
        chosen = "fp32"
        runner = OrtRunner(_ort_graph(bundle, chosen, False), precision=chosen, providers=providers, threads=threads)
    batch_dim = runner.inputs()[0].shape[0]
    fixed = batch_dim if isinstance(batch_dim, int) and batch_dim > 0 else None
    used = runner.info.details.get("providers", [])
    graph = runner.info.details.get("graph")
    reason = f"onnxruntime {chosen} on {runner.info.device} ({', '.join(used)}){f'; {graph}' if graph else ''}"
    return cls(
        runner,
        bundle,
        backend="onnxruntime",
        precision=chosen,
        backend_reason="; ".join(passed_over + [reason]),
        input_size=input_size,
        max_batch=fixed or max_batch or DEFAULT_ORT_BATCH,
        min_batch=fixed or 1,
        thread_safe=True,  # InferenceSession.run may be called concurrently
    )


def _ort_graph(bundle: Bundle, precision: str, wants_cuda: bool) -> Path:
    """The graph ONNX Runtime loads: on CPUs the fp32 precision uses the bundle's fused CPU graph
    (model.cpu.onnx: ORT's Attention op) when it was made from the current fp32 graph and passed
    its gate; everything else runs the plain graph."""
    if precision == "fp32" and not wants_cuda:
        from .fused import cpu_graph_for

        fused = cpu_graph_for(bundle)
        if fused is not None:
            return fused
    return bundle.artifact_path(precision)


# -- TensorRT engines of a bundle -------------------------------------------------------------
@dataclass(frozen=True)
class EngineEntry:
    """One ``engines/<target>/`` of a bundle: its engine.json fingerprint and manifest record."""

    target: str
    dir: Path
    fingerprint: dict[str, Any]
    record: dict[str, Any]

    @property
    def precision(self) -> str:
        return str(self.fingerprint.get("precision") or self.record.get("precision") or "fp32")

    @property
    def source_precision(self) -> str:
        return str(self.fingerprint.get("source_precision") or self.record.get("source_precision") or "fp32")

    @property
    def plan_path(self) -> Path:
        return self.dir / "model.plan"

    @property
    def profiles(self) -> list[tuple[tuple[int, int, int], tuple[int, int, int], tuple[int, int, int]]]:
        """(batch, height, width) min/opt/max triples per optimisation profile."""
        return [
            (tuple(p["batch"]), tuple(p["height"]), tuple(p["width"]))  # type: ignore[misc]
            for p in self.fingerprint.get("profiles") or []
        ]

    @property
    def profile(self) -> tuple[tuple[int, int, int], tuple[int, int, int], tuple[int, int, int]]:
        if not self.profiles:
            raise UserError(f"engine {self.dir} lists no optimisation profile in engine.json; rebuild it")
        return self.profiles[0]

    def profile_for(self, height: int, width: int) -> int | None:
        """Index of the first profile whose H/W range holds (height, width)."""
        for i, (_, hs, ws) in enumerate(self.profiles):
            if hs[0] <= height <= hs[2] and ws[0] <= width <= ws[2]:
                return i
        return None


def find_engines(bundle: Bundle) -> list[EngineEntry]:
    """The engines built from this bundle's graphs.

    A bundle folder lists them in ``manifest["engines"]`` (records of a graph that changed are
    dropped there). A bare .onnx has no manifest to record engines in: the ``engines/*/`` beside it
    count when their engine.json names this file's sha256 as their source.
    """
    from ..engine.fingerprint import FINGERPRINT_FILE, read_fingerprint

    if bundle.bare_onnx is not None:
        found = sorted(bundle.root.glob(f"engines/*/{FINGERPRINT_FILE}"))
        if not found:
            return []
        from ..fileio import sha256_file

        digest = sha256_file(bundle.bare_onnx)
        entries = []
        for path in found:
            fingerprint = read_fingerprint(path.parent)
            if fingerprint.get("source_sha256") == digest:
                entries.append(EngineEntry(path.parent.name, path.parent, fingerprint, {}))
        return entries
    entries = []
    for target, record in sorted((bundle.manifest.get("engines") or {}).items()):
        record = record if isinstance(record, dict) else {}
        engine_dir = bundle.root / (record.get("dir") or f"engines/{target}")
        entries.append(EngineEntry(target, engine_dir, read_fingerprint(engine_dir), record))
    return entries


def _load_tensorrt(cls, bundle, precision, input_size, passed_over) -> Classifier:
    entry, profile, version, device = tensorrt_engine(bundle, precision, input_size)
    runner = _tensorrt_runner(entry)
    batch, heights, widths = entry.profiles[profile]
    reason = f"tensorrt {entry.precision} engine {entry.target} (TensorRT {version}, {device.gpu_name})"
    clf = cls(
        runner,
        bundle,
        backend="tensorrt",
        precision=entry.precision,
        backend_reason="; ".join(passed_over + [reason]),
        input_size=input_size,
        max_batch=batch[2],
        min_batch=batch[0],
        thread_safe=False,  # one execution context and its buffers: calls hold the lock
    )
    clf.size_ranges = ((heights[0], heights[2]), (widths[0], widths[2]))
    return clf


def tensorrt_engine(bundle: Bundle, precision: str, input_size: tuple[int, int]) -> tuple[EngineEntry, int, str, Any]:
    """(engine, index of the profile holding ``input_size``, TensorRT version, device) of the bundle's
    engine that runs here, best precision first; DeviceError naming what is wrong with each one."""
    from ..engine import fingerprint as fpmod
    from ..engine.versions import import_tensorrt, installed_version

    engines = find_engines(bundle)
    if not engines:
        raise DeviceError(f"the bundle has no TensorRT engine (build one on this device with `vitdeploy build-engine {bundle.root}`)")
    wanted = _TRT_BEST_ORDER if precision == "best" else (precision,)
    candidates = [e for p in wanted for e in engines if e.precision == p]
    if not candidates:
        have = ", ".join(f"{e.target} ({e.precision})" for e in engines)
        raise DeviceError(f"the bundle has no {precision} engine (has: {have})")
    import_tensorrt("running TensorRT engines")  # one clear line when it is missing
    version = str(installed_version())
    device = fpmod.query_device()  # DeviceError without a usable GPU
    problems = []
    for entry in candidates:
        why = fpmod.mismatches(entry.fingerprint, device, version)
        profile = entry.profile_for(*input_size)
        if profile is None:
            why.append(f"no profile covers {input_size[0]}x{input_size[1]}")
        if why:
            problems.append(f"{entry.target}: {'; '.join(why)}")
            continue
        fpmod.verify_plan_file(entry.dir, entry.fingerprint)
        return entry, profile, version, device
    raise DeviceError(f"no engine of the bundle fits this device ({' | '.join(problems)}); rebuild on this device with `vitdeploy build-engine {bundle.root}`")


def _tensorrt_runner(entry: EngineEntry) -> Any:
    # The runner checks the fingerprint again (cheap) and picks, per call, the profile covering the
    # batch's shape; the batch limits above keep every call inside the profile chosen here.
    from .tensorrt import TensorRTRunner

    return TensorRTRunner(entry.dir)
