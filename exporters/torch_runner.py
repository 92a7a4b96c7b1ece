"""PyTorch as a Runner: the reference every artifact is compared with.

It takes the same uint8 NHWC batch as the deployed graph but preprocesses it on the host with the
contract's own numbers (vitdeploy.preprocess, numpy), not with the baked graph, so a wrong baked
mean/std or a missing /255 shows up as a difference.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vitdeploy.bundle import Bundle
from vitdeploy.errors import UserError
from vitdeploy.preprocess import normalise
from vitdeploy.runtime.base import Runner, RunnerInfo, TensorInfo

from .features import default_outputs, forward_outputs
from .sources import LoadedModel


class TorchRunner(Runner):
    """Returns every output the deployed graph declares, by name (``outputs()``).

    The output set comes from ``outputs``, else from ``loaded.extra["outputs"]`` (set by the export
    that made the graph), else the model's default (logits, probs; embedding, patch_grid without a
    head). The embedding is L2-normalised when the graph's is.
    """

    def __init__(self, loaded: LoadedModel, preprocessing: dict[str, Any], device: str = "cpu", dtype: str = "fp32",
                 resize_to: tuple[int, int] | None = None, threads: int | None = None,
                 outputs: tuple[str, ...] | None = None, normalize_embedding: bool | None = None):
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
        self.info = RunnerInfo(backend="torch", precision=dtype, device=device,
                               details={"torch": torch.__version__, "threads": torch.get_num_threads(), "source": loaded.source.get("name")})

    @classmethod
    def from_bundle(cls, bundle: Bundle, device: str = "cpu", dtype: str = "fp32", resolution: tuple[int, int] | None = None,
                    threads: int | None = None) -> "TorchRunner":
        """Rebuild the bundle's source model (same weights, same resolution handling) on PyTorch."""
        loaded, contract = bundle_contract(bundle, resolution)
        return cls(loaded, device=device, dtype=dtype, threads=threads, **contract)

    def inputs(self) -> list[TensorInfo]:
        return [TensorInfo("images", "uint8", ("batch", "height", "width", 3))]

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

    @torch.no_grad()
    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        x = self.preprocess(batch).to(self.device, self.torch_dtype)
        out = forward_outputs(self.loaded, x, self.output_names, self.normalize_embedding, model=self.model)
        if "probs" in out:  # softmax in fp32 even for an fp16 model, as the deployed graph does
            out["probs"] = torch.softmax(out["logits"].float(), -1)
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        return {name: value.float().cpu().numpy() for name, value in out.items()}

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
            self._run(batch)
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
