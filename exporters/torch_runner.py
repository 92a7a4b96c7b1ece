"""PyTorch as a Runner: the reference every artifact is compared with.

It takes the same named feeds as the deployed graph (vitdeploy.contract) but preprocesses them on the
host with the contract's own numbers (vitdeploy.preprocess, numpy), not with the baked graph, so a
wrong baked mean/std or a missing /255 shows up as a difference.

For a variable-size bundle (images in a canvas + ``valid_hw``) the reference is defined here, once:
PyTorch on each image ALONE at its own size, cut from its canvas row by its valid size, the position
table resampled offline to that size's grid by the bundle's declared rule (exporters/regrid.py).
Images of one size go through together (rows of a ViT are independent); a padded row is never seen.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vitdeploy.bundle import Bundle
from vitdeploy.contract import InputContract
from vitdeploy.errors import UserError
from vitdeploy.posembed import PosEmbedInterpolation
from vitdeploy.preprocess import normalise
from vitdeploy.runtime.base import Runner, RunnerInfo, TensorInfo
from vitdeploy.variable import VALID_INPUT

from .features import default_outputs, forward_outputs
from .sources import LoadedModel


class TorchRunner(Runner):
    """Returns every output the deployed graph declares, by name (``outputs()``).

    The output set comes from ``outputs``, else from ``loaded.extra["outputs"]`` (set by the export
    that made the graph), else the model's default (logits, probs; embedding, patch_grid without a
    head). The embedding is L2-normalised when the graph's is.

    ``contract``: the inputs it takes (default: one image input). A contract with ``valid_hw`` makes
    it the per-image reference (see the module doc), ``rule`` being the position-table resampling.
    """

    CACHED_SIZES = 8  # models re-gridded per image size kept at once (a ViT-B copy is ~350 MB)

    def __init__(self, loaded: LoadedModel, preprocessing: dict[str, Any], device: str = "cpu", dtype: str = "fp32",
                 resize_to: tuple[int, int] | None = None, threads: int | None = None,
                 outputs: tuple[str, ...] | None = None, normalize_embedding: bool | None = None,
                 contract: InputContract | None = None, rule: PosEmbedInterpolation | None = None):
        if threads:
            torch.set_num_threads(int(threads))
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise UserError("the torch backend was asked for CUDA but torch sees no GPU; use --device cpu")
        if dtype == "fp16" and device == "cpu":
            raise UserError("PyTorch fp16 eager is a GPU baseline; on the CPU use fp32")
        self.loaded = loaded
        self.model = loaded.model.to(device).eval()
        self.torch_dtype = torch.float16 if dtype == "fp16" else torch.float32
        if dtype == "fp16":
            self.model = self.model.half()
        self.device = device
        self.preprocessing = preprocessing
        self.resize_to = resize_to
        self.output_names = tuple(outputs or loaded.extra.get("outputs") or default_outputs(loaded))
        self.normalize_embedding = bool(loaded.extra.get("normalize_embedding", False) if normalize_embedding is None else normalize_embedding)
        self.contract = contract
        self.per_image = contract is not None and VALID_INPUT in contract.input_names
        self.rule = rule or PosEmbedInterpolation()
        self._sized: OrderedDict[tuple[int, int], Any] = OrderedDict()  # (h, w) -> (LoadedModel, module on the device)
        details = {"torch": torch.__version__, "threads": torch.get_num_threads(), "source": loaded.source.get("name")}
        if self.per_image:
            details["reference"] = "each image alone at its own size (position table resampled offline per size)"
        self.info = RunnerInfo(backend="torch", precision=dtype, device=device, details=details)

    @classmethod
    def from_bundle(cls, bundle: Bundle, device: str = "cpu", dtype: str = "fp32", resolution: tuple[int, int] | None = None,
                    threads: int | None = None) -> "TorchRunner":
        """Rebuild the bundle's source model (same weights, same resolution handling) on PyTorch, at
        ``resolution`` (a static graph's re-export size). The per-image reference of a canvas is built at
        the native size whatever is asked: it re-grids itself to each image's own size."""
        contract = InputContract.from_bundle(bundle)
        per_image = VALID_INPUT in contract.input_names
        loaded, kwargs = bundle_contract(bundle, contract.source_size if per_image else (resolution or contract.source_size))
        return cls(loaded, device=device, dtype=dtype, threads=threads, contract=contract, rule=position_rule(bundle), **kwargs)

    def inputs(self) -> list[TensorInfo]:
        if self.contract is None:
            return [TensorInfo("images", "uint8", ("batch", "height", "width", 3))]
        out = [TensorInfo(self.contract.image_input, "float32" if self.contract.float_input else "uint8", ("batch", "height", "width", 3))]
        if self.per_image:
            out.append(TensorInfo(VALID_INPUT, "int32", ("batch", 2)))
        return out

    def outputs(self) -> list[str]:
        return list(self.output_names)

    def preprocess(self, batch: np.ndarray) -> torch.Tensor:
        if self.preprocessing.get("input") == "float-nchw":
            return torch.from_numpy(np.ascontiguousarray(batch, dtype=np.float32))
        if self.resize_to is None:
            return torch.from_numpy(normalise(batch, self.preprocessing))
        x = torch.from_numpy(batch).to(torch.float32)
        if self.preprocessing.get("channel_order") == "bgr":
            x = x.flip(-1)
        x = F.interpolate(x.permute(0, 3, 1, 2), size=self.resize_to, mode="bilinear", align_corners=False, antialias=False)
        mean = torch.tensor(self.preprocessing["mean"]).view(1, 3, 1, 1)
        std = torch.tensor(self.preprocessing["std"]).view(1, 3, 1, 1)
        return (x / 255.0 - mean) / std

    def _execute(self, feeds: dict[str, np.ndarray], outputs: list[str] | None) -> dict[str, np.ndarray]:
        if not self.per_image:
            return self._run(feeds[self.input_names()[0]])
        assert self.contract is not None
        crops = self.contract.crops(feeds)
        by_size: dict[tuple[int, int], list[int]] = {}
        for row, crop in enumerate(crops):
            by_size.setdefault((int(crop.shape[0]), int(crop.shape[1])), []).append(row)
        result: dict[str, np.ndarray] = {}
        for size, rows in by_size.items():
            loaded, model = self._model_at(size)
            got = self._forward(np.stack([crops[r] for r in rows]), loaded, model)
            for name, value in got.items():
                if name not in result:
                    result[name] = np.empty((len(crops), *value.shape[1:]), dtype=value.dtype)
                result[name][rows] = value
        return result

    def _model_at(self, size: tuple[int, int]) -> tuple[LoadedModel, Any]:
        """The model re-gridded to ``size`` (a small LRU: sizes repeat across the calls of one check)."""
        if size in self._sized:
            self._sized.move_to_end(size)
            return self._sized[size]
        from .regrid import regrid_static

        loaded = regrid_static(self.loaded, size[0], size[1], self.rule)
        model = loaded.model.to(self.device).eval()
        if self.torch_dtype == torch.float16:
            model = model.half()
        self._sized[size] = (loaded, model)
        while len(self._sized) > self.CACHED_SIZES:
            self._sized.popitem(last=False)
        return loaded, model

    @torch.no_grad()
    def _forward(self, batch: np.ndarray, loaded: LoadedModel, model: Any) -> dict[str, np.ndarray]:
        x = self.preprocess(batch).to(self.device, self.torch_dtype)
        out = forward_outputs(loaded, x, self.output_names, self.normalize_embedding, model=model)
        if "probs" in out:  # softmax in fp32 even for an fp16 model, as the deployed graph does
            out["probs"] = torch.softmax(out["logits"].float(), -1)
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        return {name: value.float().cpu().numpy() for name, value in out.items()}

    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        return self._forward(batch, self.loaded, self.model)

    @torch.no_grad()
    def capture(self, batch: np.ndarray, module_names: list[str]) -> dict[str, np.ndarray]:
        """Outputs of named submodules (``blocks.3``, ``norm``, ``head``) for one batch."""
        found: dict[str, np.ndarray] = {}
        modules = dict(self.model.named_modules())
        hooks = []
        for name in module_names:
            if name not in modules:
                raise UserError(f"the PyTorch model has no module {name!r}")
            hooks.append(modules[name].register_forward_hook(
                lambda _m, _i, out, name=name: found.__setitem__(name, (out[0] if isinstance(out, tuple) else out).float().cpu().numpy())))
        try:
            self.infer(batch)
        finally:
            for hook in hooks:
                hook.remove()
        return found


def bundle_contract(bundle: Bundle, resolution: tuple[int, int] | None = None) -> tuple[LoadedModel, dict[str, Any]]:
    """The bundle's PyTorch model and what a runner must reproduce of its graph: preprocessing,
    in-graph resize, declared outputs and embedding normalisation (runner keyword arguments)."""
    from .export_steps import loaded_for_bundle

    loaded = loaded_for_bundle(bundle, resolution)
    pre = bundle.preprocessing
    graph = bundle.manifest.get("graph", {})
    return loaded, {
        "preprocessing": pre,
        "resize_to": tuple(pre["in_graph_resize"]["to"]) if pre.get("in_graph_resize") else None,
        "outputs": tuple(graph.get("outputs") or ()) or None,
        "normalize_embedding": bool((graph.get("output_details") or {}).get("embedding", {}).get("l2_normalized", False)),
    }


def position_rule(bundle: Bundle) -> PosEmbedInterpolation:
    """How the bundle resamples its position table to another grid (the manifest's declared rule)."""
    interp = bundle.resolution.get("pos_embed_interpolation") or {}
    return PosEmbedInterpolation.from_dict({k: v for k, v in interp.items() if k != "description"})
