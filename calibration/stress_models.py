"""ViTs that fail reduced precision the way real ones do, made by function-preserving edits.

The bundled digits model passes every INT8 recipe and the plain FP16 graph, so on it a good recipe
cannot be told from a bad one. Real ViTs differ in two documented ways, and both can be planted into
any ViT with timm's module names (``blocks.N.norm1`` / ``attn.qkv`` / ``attn.proj`` / ``norm2`` /
``mlp.fc1`` / ``mlp.fc2``: the reference ViT and timm's ``VisionTransformer``) without changing what
it computes in fp32:

* **LayerNorm-output outliers** (LLM.int8(), arXiv:2208.07339; SmoothQuant, arXiv:2211.10438; seen
  in CLIP, DeiT and DINOv2): :func:`plant_outliers` multiplies a few channels of a LayerNorm's
  gamma and beta by K and divides the same input columns of the Linear it feeds (``attn.qkv`` after
  ``norm1``, ``mlp.fc1`` after ``norm2``) by K. The Linear sees ``(W/K) (K y) = W y``; for K a power of
  two every product is exact in binary floating point, so the fp32 graph is bit-identical. A
  per-tensor INT8 scale on that input now spends its 127 levels on the K-times larger channels.
* **Massive residual activations** (Sun et al., "Massive activations in large language models",
  arXiv:2402.17762; Darcet et al., "Vision transformers need registers", arXiv:2309.16588):
  :func:`plant_massive_residual` scales the whole residual stream by C: the patch embedding, the
  prefix tokens, the position table and every layer that writes the stream (``attn.proj``,
  ``mlp.fc2``) by C, every LayerNorm's epsilon by C^2. ``LN(C x)`` with epsilon ``C^2 e`` equals
  ``LN(x)`` with ``e``, so fp32 is unchanged (exactly, for C a power of two); past C ~ 65504 /
  max|stream| the stream overflows fp16.
* **A planted block fault**: :func:`plant_outliers` on one block only, with a large K: the block a
  precision search (``vitdeploy debug-precision``) must name first.

Each function edits the model in place and returns a record of what it did (stored next to the
checkpoint and in the bundle's source config), so a variant can be rebuilt and audited.
:func:`write_reference_checkpoint` saves a reference-ViT variant as ``ref:`` source files
(``<name>.safetensors`` + ``<name>.json``); a timm variant is a plain safetensors state dict for
``timm:<name> --checkpoint``. Used by the tests (tests/test_smoothing.py, tests/test_fp16_range.py,
tests/test_debug_precision.py) and ``bench/bench_precision_variants.py``. torch is imported inside the
functions.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

NORM_TO_LINEAR = {"norm1": "attn.qkv", "norm2": "mlp.fc1"}
DEFAULT_OUTLIER_FACTOR = 64.0  # power of two in the 30..100 range real ViTs show (SmoothQuant Fig. 4)
DEFAULT_MASSIVE_FACTOR = 8192.0  # digits' stream peaks near 27: x 8192 passes fp16's 65504 by ~3x


def _is_power_of_two(value: float) -> bool:
    mantissa, _ = math.frexp(float(value))
    return value > 0 and mantissa == 0.5


def _get(module: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def _check_layout(model: Any) -> None:
    from vitdeploy.errors import UserError

    blocks = getattr(model, "blocks", None)
    if blocks is None or not len(blocks):
        raise UserError("the model has no `blocks`: the variants need timm's ViT module names (blocks.N.norm1, attn.qkv, ...)")
    for name in ("norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2"):
        try:
            _get(blocks[0], name)
        except AttributeError:
            raise UserError(f"blocks.0 has no {name}: the variants need timm's ViT block layout") from None


def plant_outliers(model: Any, factor: float = DEFAULT_OUTLIER_FACTOR, channels: int = 2, blocks: Sequence[int] | None = None,
                   norms: Sequence[str] = ("norm1", "norm2"), seed: int = 0) -> dict[str, Any]:
    """Scale ``channels`` seeded channels of each chosen LayerNorm by ``factor`` and the next Linear's
    input columns by 1/factor (in place). Returns the record: factor, and the channels per LayerNorm."""
    import numpy as np
    import torch

    from vitdeploy.errors import UserError

    if not _is_power_of_two(factor):
        raise UserError(f"outlier factor {factor:g} is not a power of two: the edit would no longer be exact in fp32")
    _check_layout(model)
    depth = len(model.blocks)
    chosen = list(range(depth)) if blocks is None else [int(b) for b in blocks]
    bad = [b for b in chosen if not 0 <= b < depth]
    if bad:
        raise UserError(f"blocks {bad} do not exist (the model has {depth})")
    rng = np.random.default_rng(seed)
    planted: dict[str, list[int]] = {}
    with torch.no_grad():
        for b in chosen:
            block = model.blocks[b]
            for norm_name in norms:
                norm, linear = _get(block, norm_name), _get(block, NORM_TO_LINEAR[norm_name])
                width = norm.weight.shape[0]
                picked = sorted(int(c) for c in rng.choice(width, size=min(channels, width), replace=False))
                idx = torch.tensor(picked)
                norm.weight[idx] *= factor
                if norm.bias is not None:
                    norm.bias[idx] *= factor
                linear.weight[:, idx] /= factor  # nn.Linear weight is [out, in]: input columns
                planted[f"blocks.{b}.{norm_name}"] = picked
    return {"kind": "layernorm-outliers", "factor": float(factor), "channels_per_norm": channels, "seed": seed,
            "norms": planted, "next_linear": dict(NORM_TO_LINEAR),
            "rule": "gamma, beta of the channels x factor; the next Linear's input columns / factor (exact for a power of two)"}


def plant_massive_residual(model: Any, factor: float = DEFAULT_MASSIVE_FACTOR) -> dict[str, Any]:
    """Scale the residual stream by ``factor`` (in place); every LayerNorm's epsilon by factor^2."""
    import torch

    from vitdeploy.errors import UserError

    if not _is_power_of_two(factor):
        raise UserError(f"massive factor {factor:g} is not a power of two: the edit would no longer be exact in fp32")
    _check_layout(model)
    norm_pre = getattr(model, "norm_pre", None)
    if isinstance(norm_pre, torch.nn.LayerNorm):
        raise UserError("the model normalises the stream before the blocks (norm_pre): scaling the patch embedding would not reach the stream")
    scaled: list[str] = []
    with torch.no_grad():
        for name in ("patch_embed.proj.weight", "patch_embed.proj.bias", "cls_token", "dist_token", "reg_token", "pos_embed"):
            try:
                tensor = _get(model, name)
            except AttributeError:
                continue
            if isinstance(tensor, torch.Tensor):
                tensor.mul_(factor)
                scaled.append(name)
        for b, block in enumerate(model.blocks):
            for layer in ("attn.proj", "mlp.fc2"):
                linear = _get(block, layer)
                linear.weight.mul_(factor)
                scaled.append(f"blocks.{b}.{layer}.weight")
                if linear.bias is not None:
                    linear.bias.mul_(factor)
                    scaled.append(f"blocks.{b}.{layer}.bias")
    norms = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.eps = float(module.eps) * factor * factor
            norms.append(name)
    return {"kind": "massive-residual", "factor": float(factor), "scaled": scaled, "layernorm_eps_scaled": norms,
            "rule": "stream writers x factor, LayerNorm epsilon x factor^2 (LN(Cx; C^2 e) = LN(x; e); exact for a power of two)"}


def digits_variant(kind: str, factor: float | None = None, **kwargs: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(model, config, record): the bundled digits model with a planted ``kind`` ("outliers",
    "massive", "block-fault"); the config is digits.json's spec/preprocessing/labels, the massive
    variant's LayerNorm epsilon written into ``spec.extra`` so the ``ref:`` source rebuilds it."""
    import copy

    from vitdeploy.builtin import load_digits_config, load_digits_model
    from vitdeploy.model import DEFAULT_LAYER_NORM_EPS

    model = load_digits_model()
    config = copy.deepcopy(load_digits_config())
    if kind == "outliers":
        record = plant_outliers(model, factor or DEFAULT_OUTLIER_FACTOR, **kwargs)
    elif kind == "block-fault":
        block = kwargs.pop("block", 2)
        record = plant_outliers(model, factor or BLOCK_FAULT_FACTOR, blocks=[block], channels=kwargs.pop("channels", 4), **kwargs)
        record["kind"] = "block-fault"
        record["block"] = f"blocks.{block}"
    elif kind == "massive":
        record = plant_massive_residual(model, factor or DEFAULT_MASSIVE_FACTOR)
        eps = float(config["spec"].get("extra", {}).get("layer_norm_eps", DEFAULT_LAYER_NORM_EPS))
        config["spec"].setdefault("extra", {})["layer_norm_eps"] = eps * record["factor"] ** 2
    else:
        from vitdeploy.errors import UserError

        raise UserError(f"unknown variant {kind!r}; use outliers, massive or block-fault")
    record["base"] = "builtin:digits"
    return model.eval(), config, record


BLOCK_FAULT_FACTOR = 512.0  # one block only, so it must hurt on its own


def write_reference_checkpoint(model: Any, config: dict[str, Any], record: dict[str, Any], path: str | Path) -> Path:
    """``path`` (.safetensors) + its .json beside it: a ``ref:`` source for ``vitdeploy export ref:PATH``."""
    from safetensors.torch import save_file

    from vitdeploy.fileio import atomic_path, atomic_write_json

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    with atomic_path(path) as tmp:
        save_file(state, str(tmp))
    atomic_write_json(path.with_suffix(".json"), {"spec": config["spec"], "preprocessing": config["preprocessing"],
                                                  "labels": config["labels"], "variant": record})
    return path


def write_timm_checkpoint(model: Any, record: dict[str, Any], path: str | Path) -> Path:
    """A timm variant's state dict (safetensors) and its record (.json beside it)."""
    from safetensors.torch import save_file

    from vitdeploy.fileio import atomic_path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(tmp))
    path.with_suffix(".json").write_text(json.dumps(record, indent=2))
    return path
