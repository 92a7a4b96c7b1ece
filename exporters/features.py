"""What a deployed graph returns besides class scores: the embedding and the patch grid (§39.4).

Algorithm 39.1 outputs class probabilities "and the patch representations as needed". Many deployed
ViTs are backbones: retrieval runs on the pooled embedding, dense heads on the G_h x G_w grid of
patch features, and DINOv2-style models ship without a classifier at all. This module defines, per
source family, exactly which tensors those outputs are, so that the exported graph, the PyTorch
reference and the manifest's description agree:

- ``embedding`` [B, d]: the pooled, final-normalised, pre-head feature of the model's own read-out.
  timm: ``forward_head(forward_features(x), pre_logits=True)`` (timm's own path, so GAP models get
  their fc_norm after pooling and DeiT-distilled the mean of its CLS and DIST rows); Hugging Face:
  what its classifier reads: ``last_hidden_state[:, 0]`` (ViT, DeiT, the headless DINOv2; the mean
  of rows 0 and 1 for DeiT-with-teacher, as timm), BEiT's ``pooler_output`` (LayerNorm of the mean
  of the patch tokens), and for ``Dinov2ForImageClassification`` [CLS, mean of the patch tokens]
  concatenated ([B, 2d]); the reference ViT: ``pool`` + ``fc_norm`` (Eqs. 39.17-39.18).
- ``patch_grid`` [B, d, G_h, G_w]: the tokens of ``forward_features`` (after the final LayerNorm
  where the model has one before the read-out) with the prefix rows (CLS, DIST, registers) dropped,
  reshaped row-major: token n = r * G_w + s goes to ``[:, :, r, s]`` (Eq. 39.2's patch order).
  A GAP model with timm's fc_norm arrangement has no LayerNorm before pooling; its grid holds the
  last block's tokens un-normalised, as timm's own ``forward_features`` and
  ``forward_intermediates(norm=True)`` return them, and the manifest says so.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from vitdeploy.errors import UsageError, UserError

from .sources import LoadedModel

OUTPUTS = ("logits", "probs", "embedding", "patch_grid")
HEAD_OUTPUTS = ("logits", "probs")
FEATURE_OUTPUTS = ("embedding", "patch_grid")


# -- which outputs --------------------------------------------------------------------------------
def has_head(loaded: LoadedModel) -> bool:
    """A classification head: outputs that are classes (a CLIP-style projection head is not one)."""
    return int(loaded.spec.num_classes) > 0 and not loaded.extra.get("projection_head")


def default_outputs(loaded: LoadedModel) -> tuple[str, ...]:
    """logits,probs for a classifier; embedding,patch_grid for a backbone without a head."""
    return HEAD_OUTPUTS if has_head(loaded) else FEATURE_OUTPUTS


def parse_outputs(text: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...] | None:
    """'logits,embedding' -> ('logits', 'embedding') in the canonical order; None stays None (default)."""
    if text is None:
        return None
    items = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t and t.strip()]
    if not items:
        raise UsageError(f"--outputs names no output; choose from {','.join(OUTPUTS)}")
    unknown = [t for t in items if t not in OUTPUTS]
    if unknown:
        raise UsageError(f"--outputs: unknown output {', '.join(unknown)}; choose any of {','.join(OUTPUTS)}")
    return tuple(o for o in OUTPUTS if o in items)


def resolve_outputs(loaded: LoadedModel, requested: tuple[str, ...] | None) -> tuple[str, ...]:
    """The output set of this export; a head output from a model without a head is one clear line."""
    if requested is None:
        return default_outputs(loaded)
    if not has_head(loaded):
        wants = [o for o in requested if o in HEAD_OUTPUTS]
        if wants:
            raise UserError(
                f"{'/'.join(wants)} asked for, but {loaded.source.get('kind')}:{loaded.source.get('name')} has no classification head "
                "(0 classes); export --outputs embedding,patch_grid, or give the fine-tuned head (--checkpoint, --num-classes)"
            )
    return requested


# -- the tensors, per source family --------------------------------------------------------------
def _hf_dinov2_head(loaded: LoadedModel) -> bool:
    """Dinov2ForImageClassification: its head reads [CLS, mean of the patch tokens], concatenated."""
    return loaded.family == "hf" and loaded.source.get("model_type") == "dinov2" and has_head(loaded)


def readout_of(loaded: LoadedModel) -> str:
    """'cls', 'gap', 'cls+dist' (mean of the CLS and DIST rows) or 'cls|gap' (both, concatenated), as the model reads out."""
    spec = loaded.spec
    if spec.global_pool == "avg":
        return "gap"
    if loaded.family == "hf":
        if _hf_dinov2_head(loaded):
            return "cls|gap"
        return "cls+dist" if str(loaded.source.get("architecture", "")).endswith("WithTeacher") else "cls"
    return "cls+dist" if spec.num_distill_tokens else "cls"


def embedding_dim(loaded: LoadedModel) -> int:
    """d; 2d for HF DINOv2's classifier read-out (CLS and mean patch token side by side); the projection's
    width where the model's embedding is its projection head's output (CLIP-style)."""
    projection = loaded.extra.get("projection_head")
    if projection:
        return int(projection["dim"])
    return 2 * loaded.spec.embed_dim if readout_of(loaded) == "cls|gap" else loaded.spec.embed_dim


def final_norm_of(loaded: LoadedModel) -> tuple[str | None, str | None]:
    """(norm on the tokens / patch grid, norm on the pooled embedding): module names or None."""
    if loaded.family == "hf":
        if loaded.spec.global_pool == "avg":  # BEiT's mean pooling: the backbone's layernorm is Identity, the pooler's follows the mean
            return None, "pooler.layernorm"
        return "layernorm", "layernorm"
    model = loaded.model
    token_norm = None if isinstance(getattr(model, "norm", None), torch.nn.Identity) else "norm"
    fc_norm = not isinstance(getattr(model, "fc_norm", torch.nn.Identity()), torch.nn.Identity)
    return token_norm, ("fc_norm" if fc_norm else token_norm)


def forward_outputs(loaded: LoadedModel, x: torch.Tensor, outputs: tuple[str, ...], normalize_embedding: bool = False,
                    model: Any = None) -> dict[str, torch.Tensor]:
    """Preprocessed float NCHW -> the requested outputs by name (logits before probs).

    ``model`` overrides ``loaded.model`` (the runner may hold a moved/half copy). A logits-only
    export keeps calling the model's own ``forward`` so its graph is what it always was.
    """
    model = loaded.model if model is None else model
    want = set(outputs)
    if not want & set(FEATURE_OUTPUTS):
        logits = model(x)
        return _with_probs({"logits": logits}, want)
    if loaded.family == "hf":
        tokens, pooled, logits = _hf_features(loaded, model, x, "logits" in want or "probs" in want)
    else:  # timm and the reference ViT share the forward_features / forward_head split
        tokens = model.forward_features(x)
        logits = model.forward_head(tokens) if ("logits" in want or "probs" in want) else None
        pooled = _pre_logits(loaded, model, tokens) if "embedding" in want else None
    out: dict[str, torch.Tensor] = {}
    if logits is not None:
        out["logits"] = logits
    if "embedding" in want:
        out["embedding"] = F.normalize(pooled, dim=-1, eps=1e-12) if normalize_embedding else pooled
    if "patch_grid" in want:
        out["patch_grid"] = tokens_to_grid(tokens, loaded.spec.num_prefix_tokens, x.shape[-2] // loaded.spec.patch_size[0],
                                           x.shape[-1] // loaded.spec.patch_size[1])
    return _with_probs(out, want)


def _with_probs(out: dict[str, torch.Tensor], want: set[str]) -> dict[str, torch.Tensor]:
    if "probs" in want:
        out["probs"] = torch.softmax(out["logits"], dim=-1)
    return {k: out[k] for k in OUTPUTS if k in want}


def _pre_logits(loaded: LoadedModel, model: Any, tokens: torch.Tensor) -> torch.Tensor:
    if loaded.extra.get("projection_head"):  # CLIP-style: the embedding is the projection of the read-out
        return model.forward_head(tokens)
    if loaded.family.startswith("timm"):  # ViT, BEiT, EVA
        return model.forward_head(tokens, pre_logits=True)  # timm's own semantics (fc_norm, DeiT's mean)
    pooled = model.pool(tokens)  # reference ViT: CLS or GAP, fc_norm applied; DeiT: (h, dist row)
    if isinstance(pooled, tuple):
        return (pooled[0] + pooled[1]) / 2
    return pooled


def _hf_features(loaded: LoadedModel, model: Any, x: torch.Tensor, need_logits: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """HF: last_hidden_state (after the final layernorm, where the model has one), the pre-head
    feature its classifier reads, and, when asked, the logits computed from them as transformers does."""
    out = model.backbone(x)
    tokens = out.last_hidden_state
    hf = model.hf
    readout = readout_of(loaded)
    if readout == "gap":  # BEiT: BeitPooler, layernorm(mean of the patch tokens)
        pooled = out.pooler_output
    elif readout == "cls|gap":  # Dinov2ForImageClassification
        pooled = torch.cat([tokens[:, 0], tokens[:, 1:].mean(dim=1)], dim=1)
    elif readout == "cls+dist":
        pooled = (tokens[:, 0] + tokens[:, 1]) / 2
    else:
        pooled = tokens[:, 0]
    if not need_logits:
        return tokens, pooled, None
    if hasattr(hf, "cls_classifier"):  # DeiTForImageClassificationWithTeacher: mean of both heads
        return tokens, pooled, (hf.cls_classifier(tokens[:, 0]) + hf.distillation_classifier(tokens[:, 1])) / 2
    return tokens, pooled, hf.classifier(pooled if readout in ("gap", "cls|gap") else tokens[:, 0])


def tokens_to_grid(tokens: torch.Tensor, num_prefix: int, grid_h: Any, grid_w: Any) -> torch.Tensor:
    """[B, prefix + G_h*G_w, d] -> [B, d, G_h, G_w], token n = r*G_w + s at [:, :, r, s]."""
    patches = tokens[:, num_prefix:]
    batch, _, dim = patches.shape
    return patches.reshape(batch, grid_h, grid_w, dim).permute(0, 3, 1, 2)


# -- what the manifest says about each output -----------------------------------------------------
def describe_outputs(loaded: LoadedModel, outputs: tuple[str, ...], normalize_embedding: bool, dynamic_grid: bool,
                     grid_of: str) -> dict[str, dict[str, Any]]:
    """Per output: shape (symbolic axes named), dtype and meaning, for the manifest and ONNX metadata."""
    spec = loaded.spec
    d = spec.embed_dim
    token_norm, pooled_norm = final_norm_of(loaded)
    readout = readout_of(loaded)
    reference = _reference_call(loaded)
    dropped = {"cls": int(spec.class_token), "distillation": spec.num_distill_tokens, "registers": spec.num_reg_tokens}
    grid = ["grid_h", "grid_w"] if dynamic_grid else list(spec.native_grid)
    details: dict[str, dict[str, Any]] = {}
    if "logits" in outputs:
        details["logits"] = {"shape": ["batch", spec.num_classes], "dtype": "float32",
                             "meaning": "class scores: the head on the read-out" + (" (mean of the CLS and DIST heads)" if readout == "cls+dist" else ""),
                             "reference": reference["logits"]}
    if "probs" in outputs:
        details["probs"] = {"shape": ["batch", spec.num_classes], "dtype": "float32", "meaning": "softmax(logits) over the classes in labels.txt"}
    if "embedding" in outputs:
        projection = loaded.extra.get("projection_head")
        details["embedding"] = {
            "shape": ["batch", embedding_dim(loaded)], "dtype": "float32",
            "meaning": ("the read-out through the model's pretrained projection head (a joint image-text space, CLIP-style)"
                        if projection else "pooled pre-head feature of the model's own read-out")
                       + (", L2-normalised" if normalize_embedding else ""),
            "readout": readout,
            "final_norm": pooled_norm,
            "final_norm_where": f"after pooling ({pooled_norm})" if pooled_norm in ("fc_norm", "pooler.layernorm") else ("before the read-out" if pooled_norm else "none"),
            "l2_normalized": bool(normalize_embedding),
            "reference": ("timm forward_head(forward_features(x)) (the projection head)" if projection else reference["embedding"])
                         + (", then L2-normalised" if normalize_embedding else ""),
        }
    if "patch_grid" in outputs:
        details["patch_grid"] = {
            "shape": ["batch", d, *grid], "dtype": "float32", "layout": "NCHW (d, G_h, G_w)",
            "meaning": "final patch tokens on the patch grid",
            "order": "row-major: token n = r*G_w + s is patch_grid[:, :, r, s]; patch (r, s) covers input rows "
                     "r*P_h..(r+1)*P_h-1, columns s*P_w..(s+1)*P_w-1 of the " + grid_of,
            "patch_size": list(spec.patch_size),
            "grid": "input H / P_h x input W / P_w" if dynamic_grid else list(spec.native_grid),
            "dropped_tokens": dropped,
            "final_norm": token_norm,
            "normalized": token_norm is not None,
            "note": None if token_norm else "this model applies its final LayerNorm after pooling (fc_norm): the grid holds the last block's tokens un-normalised, as the source's forward_features returns them",
            "reference": reference["patch_grid"],
        }
    return details


def _reference_call(loaded: LoadedModel) -> dict[str, str]:
    if loaded.family.startswith("timm"):
        return {"logits": "timm model(x)", "embedding": "timm forward_head(forward_features(x), pre_logits=True)",
                "patch_grid": "timm forward_features(x)[:, num_prefix_tokens:] reshaped row-major to [B, G_h, G_w, d], permuted to [B, d, G_h, G_w]"}
    if loaded.family == "hf":
        row = {"cls+dist": "mean of last_hidden_state[:, 0] and [:, 1] (after the final layernorm)",
               "gap": "pooler_output (layernorm of the mean of the patch tokens)",
               "cls|gap": "[last_hidden_state[:, 0], mean of last_hidden_state[:, 1:]] concatenated (after the final layernorm)",
               }.get(readout_of(loaded), "last_hidden_state[:, 0] (after the final layernorm)")
        return {"logits": "transformers model(pixel_values).logits", "embedding": f"transformers {row}",
                "patch_grid": "transformers last_hidden_state[:, prefix:] reshaped row-major, permuted to [B, d, G_h, G_w]"}
    return {"logits": "vitdeploy.model.VisionTransformer forward(x)", "embedding": "VisionTransformer pool(forward_features(x)) (CLS row or GAP, then fc_norm where the spec has one; DeiT: mean of the CLS and DIST rows)",
            "patch_grid": "VisionTransformer forward_features(x)[:, num_prefix_tokens:] reshaped row-major, permuted to [B, d, G_h, G_w]"}


def output_doc(name: str, detail: dict[str, Any]) -> str:
    """One line for the ONNX graph output's doc_string (what Netron shows)."""
    shape = "[" + ", ".join(str(s) for s in detail["shape"]) + "]"
    extra = ""
    if name == "embedding":
        extra = f"; read-out {detail['readout']}, norm {detail['final_norm'] or 'none'}, L2 {'yes' if detail['l2_normalized'] else 'no'}"
    elif name == "patch_grid":
        dropped = ", ".join(f"{k} {v}" for k, v in detail["dropped_tokens"].items() if v) or "none"
        extra = f"; {detail['order'].split(';')[0]}; prefix tokens dropped: {dropped}; norm {detail['final_norm'] or 'none'}"
    return f"{name} {shape}: {detail['meaning']}{extra}"
