"""``Classifier`` for variable-size bundles: images of any size and aspect ratio in one batch.

Each image is fitted into the canvas by the manifest's policy (vitdeploy.variable: keep the aspect
ratio, whole patches), padded top-left, and sent with its ``valid_hw``; mixed sizes share one call
instead of one call per size. Runs on the first backend of ``prefer`` that can: a TensorRT engine
built by `build-engine` (both inputs shaped by its profile; a batch under the profile's minimum is
padded with copies of its last row and cut back), or ONNX Runtime.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Sequence, Tuple

import numpy as np

from ..bundle import Bundle
from ..errors import DeviceError, IntegrityError, UserError
from ..images import decode_image, to_channel_order
from ..variable import VALID_INPUT, check_sizes_for_canvas, fit_image, pad_to_canvas
from . import classifier as classifier_module
from .classifier import DEFAULT_ORT_BATCH, Classifier, tensorrt_engine


class VariableSizeClassifier(Classifier):
    """A variable-size bundle on TensorRT or ONNX Runtime; same public API as :class:`Classifier`."""

    @classmethod
    def load_variable(cls, bundle: Bundle, prefer: Sequence[str], precision: str, providers: Sequence[str] | None,
                      threads: int | None, max_batch: int | None, policy: str | None = None) -> "VariableSizeClassifier":
        passed_over: list[str] = []
        for backend in prefer:
            try:
                if backend == "tensorrt":
                    clf = cls._load_tensorrt(bundle, precision, passed_over)
                else:
                    clf = cls._load_onnxruntime(bundle, precision, providers, threads, max_batch, passed_over)
            except IntegrityError:  # a graph the manifest does not vouch for is refused, never passed over
                raise
            except (DeviceError, UserError) as exc:
                if len(tuple(prefer)) == 1:
                    raise
                passed_over.append(f"{backend}: {exc}")
                continue
            clf.policy = policy or bundle.preprocessing["variable_size"].get("host_policy", "fit-within")
            return clf
        raise DeviceError(f"no backend can run {bundle.root} here ({'; '.join(passed_over)})")

    @classmethod
    def _load_tensorrt(cls, bundle: Bundle, precision: str, passed_over: list[str]) -> "VariableSizeClassifier":
        contract = bundle.preprocessing["variable_size"]
        canvas = (int(contract["canvas"][0]), int(contract["canvas"][1]))
        entry, profile, version, device = tensorrt_engine(bundle, precision, canvas)
        runner = classifier_module._tensorrt_runner(entry)  # the GPU-only piece (tests stand in for it)
        names = [i.name for i in runner.inputs()]
        if names != ["images", VALID_INPUT]:
            runner.close()
            raise UserError(f"{entry.dir}: a variable-size engine must take (images, {VALID_INPUT}), this one takes {names}")
        batch = entry.profiles[profile][0]
        reason = f"tensorrt {entry.precision} engine {entry.target} (TensorRT {version}, {device.gpu_name}; variable-size)"
        return cls(runner, bundle, backend="tensorrt", precision=entry.precision, backend_reason="; ".join(passed_over + [reason]),
                   input_size=canvas, max_batch=batch[2], min_batch=batch[0],
                   thread_safe=False)  # one execution context and its buffers: calls hold the lock

    @classmethod
    def _load_onnxruntime(cls, bundle: Bundle, precision: str, providers: Sequence[str] | None, threads: int | None,
                          max_batch: int | None, passed_over: list[str]) -> "VariableSizeClassifier":
        from .ort import OrtRunner, default_providers

        providers = list(providers or default_providers())
        # "best": the fp16 graph where ORT runs on CUDA, else fp32 (as for single-size bundles);
        # an explicit precision takes that graph (one line naming how to make it when absent)
        chosen = precision
        if precision == "best":
            chosen = "fp16" if "CUDAExecutionProvider" in providers and "fp16" in bundle.precisions() else "fp32"
        runner = OrtRunner(bundle.artifact_path(chosen), precision=chosen, providers=providers, threads=threads)
        if precision == "best" and chosen == "fp16" and runner.info.device == "cpu":  # CUDA listed, not usable
            runner.close()
            chosen = "fp32"
            runner = OrtRunner(bundle.artifact_path(chosen), precision=chosen, providers=providers, threads=threads)
        names = [i.name for i in runner.session.get_inputs()]
        if names != ["images", VALID_INPUT]:
            raise UserError(f"{bundle.root}: a variable-size graph must take (images, {VALID_INPUT}), this one takes {names}")
        contract = bundle.preprocessing["variable_size"]
        reason = f"onnxruntime {chosen} on {runner.info.device} (variable-size graph)"
        return cls(runner, bundle, backend="onnxruntime", precision=chosen, backend_reason="; ".join(passed_over + [reason]),
                   input_size=tuple(contract["canvas"]), max_batch=max_batch or DEFAULT_ORT_BATCH, thread_safe=True)

    # -- inputs ------------------------------------------------------------------------------
    def prepare(self, image: Any) -> np.ndarray:
        """One path or uint8 HWC array -> the image at its whole-patch size within the canvas."""
        if isinstance(image, (str, os.PathLike)):
            rgb = fit_image(decode_image(image), self.preprocessing, self.policy)
            return to_channel_order(rgb, self.preprocessing)
        if isinstance(image, np.ndarray):
            if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
                raise UserError(f"an image must be uint8 [H, W, 3], got {image.dtype} {list(image.shape)}")
            return fit_image(image, self.preprocessing, self.policy)
        raise UserError(f"cannot classify a {type(image).__name__}; give image paths or uint8 arrays")

    def _batches(self, images: Any) -> Iterator[Tuple[np.ndarray, np.ndarray]]:  # type: ignore[override]
        group: list = []
        for item in self._items(images):
            group.append(self.prepare(item))
            if len(group) == self.max_batch:
                yield pad_to_canvas(group, self.input_size)
                group = []
        if group:
            yield pad_to_canvas(group, self.input_size)

    def _run(self, batch: Tuple[np.ndarray, np.ndarray]) -> np.ndarray:  # type: ignore[override]
        return self.run_padded(*batch)

    def run_padded(self, images: np.ndarray, valid_hw: np.ndarray, output: str = "probs") -> np.ndarray:
        """``output`` (probs or logits) for a batch already padded into the canvas; ``valid_hw`` is checked first."""
        contract = self.preprocessing["variable_size"]
        if images.dtype != np.uint8 or images.ndim != 4 or tuple(images.shape[1:]) != (*self.input_size, 3):
            raise UserError(f"images must be uint8 [B, {self.input_size[0]}, {self.input_size[1]}, 3], got {images.dtype} {list(images.shape)}")
        check_sizes_for_canvas(valid_hw, contract["canvas"], contract["round_to"])
        if len(valid_hw) != len(images):
            raise UserError(f"valid_hw has {len(valid_hw)} rows for {len(images)} images")
        valid_hw = np.asarray(valid_hw, dtype=np.int32)
        count = len(images)
        if count < self.min_batch:  # an engine profile that needs more rows: copies of the last one, cut back below
            images = np.concatenate([images, np.repeat(images[-1:], self.min_batch - count, axis=0)])
            valid_hw = np.concatenate([valid_hw, np.repeat(valid_hw[-1:], self.min_batch - count, axis=0)])
        with self._lock:
            values = self.runner.run_feeds({"images": images, VALID_INPUT: valid_hw}, outputs=(output,))[output]
        return np.asarray(values[:count], dtype=np.float32)

    def describe(self) -> dict:
        info = super().describe()
        info.update(canvas=list(self.input_size), policy=self.policy)
        return info
