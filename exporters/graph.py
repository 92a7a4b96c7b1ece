"""The deployable module: raw camera pixels in, the declared outputs out.

The preprocessing of the model's own config is baked in front of the network, so a deployment hands
over uint8 NHWC pixels and nothing else (§39.6): cast, optional BGR->RGB, NHWC->NCHW, optional
resize to the model resolution, /255, (x - mean)/std. What comes out is the output set the export
declared (exporters/features.py): logits and probs for a classifier; the pooled embedding and the
patch grid for a backbone (Algorithm 39.1: "class probabilities, and the patch representations as
needed"), in the canonical order logits, probs, embedding, patch_grid.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .features import HEAD_OUTPUTS, forward_outputs

INPUT_FORMATS = ("uint8-nhwc", "float-nchw")


class DeployGraph(torch.nn.Module):
    def __init__(
        self,
        model: torch.nn.Module,
        preprocessing: dict[str, Any],
        input_format: str = "uint8-nhwc",
        resize_to: tuple[int, int] | None = None,
        outputs: tuple[str, ...] = HEAD_OUTPUTS,
        loaded: Any = None,
        normalize_embedding: bool = False,
    ):
        super().__init__()
        self.model = model
        self.input_format = input_format
        self.bgr = preprocessing.get("channel_order", "rgb") == "bgr"
        self.resize_to = tuple(resize_to) if resize_to else None
        self.outputs = tuple(outputs)
        # the LoadedModel tells features.py which family's read-out and prefix tokens apply
        self._loaded = loaded
        self.normalize_embedding = normalize_embedding
        if tuple(self.outputs) != HEAD_OUTPUTS and loaded is None:
            raise ValueError("feature outputs need the LoadedModel (family, spec) of the model")
        self.register_buffer("mean", torch.tensor(preprocessing["mean"], dtype=torch.float32).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(preprocessing["std"], dtype=torch.float32).view(1, 3, 1, 1))

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        if self.input_format == "float-nchw":
            return images  # the caller already scaled and normalised
        x = images.to(torch.float32)
        if self.bgr:
            x = x.flip(-1)  # BGR camera frames -> the RGB order the model was trained on
        x = x.permute(0, 3, 1, 2)
        if self.resize_to is not None:
            # bilinear without antialias: what TensorRT's Resize implements; on 0..255 floats
            x = F.interpolate(x, size=self.resize_to, mode="bilinear", align_corners=False, antialias=False)
        x = x / 255.0
        return (x - self.mean) / self.std

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = self.preprocess(images)
        if self.outputs == HEAD_OUTPUTS:  # the classifier graph exactly as it always was
            logits = self.model(x)
            return logits, torch.softmax(logits, dim=-1)
        out = forward_outputs(self._loaded, x, self.outputs, self.normalize_embedding, model=self.model)
        return tuple(out[name] for name in self.outputs)
