"""What a deployed graph returns besides class scores: the embedding and the patch grid (§39.4).

Algorithm 39.1 outputs class probabilities "and the patch representations as needed". Many deployed
ViTs are backbones: retrieval runs on the pooled embedding, dense heads on the G_h x G_w grid of
patch features, and DINOv2-style models ship without a classifier at all. This module holds the
output set and the manifest's description; which tensors those outputs are is each family adapter's
answer (exporters/adapters/: ``features``, ``readout``, ``final_norms``, ``reference_calls``), so
that the exported graph, the PyTorch reference and the manifest's description agree:

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

from .loaded import LoadedModel

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


# -- the tensors, per source family (each answered by its adapter, exporters/adapters/) ----------
def readout_of(loaded: LoadedModel) -> str:
    """'cls', 'gap', 'cls+dist' (mean of the CLS and DIST rows) or 'cls|gap' (both, concatenated), as the model reads out."""
    return loaded.adapter.readout(loaded)


def embedding_dim(loaded: LoadedModel) -> int:
    """d; 2d for HF DINOv2's classifier read-out (CLS and mean patch token side by side); the projection's
    width where the model's embedding is its projection head's output (CLIP-style)."""
    projection = loaded.extra.get("projection_head")
    if projection:
        return int(projection["dim"])
    return 2 * loaded.spec.embed_dim if readout_of(loaded) == "cls|gap" else loaded.spec.embed_dim


def final_norm_of(loaded: LoadedModel) -> tuple[str | None, str | None]:
    """(norm on the tokens / patch grid, norm on the pooled embedding): module names or None."""
    return loaded.adapter.final_norms(loaded)


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
    tokens, pooled, logits = loaded.adapter.features(loaded, model, x, "logits" in want or "probs" in want, "embedding" in want)
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
            # a norm the tokens do not get (timm's fc_norm, BEiT's pooler, CLIP's post_layernorm on the CLS row) follows pooling
            "final_norm_where": f"after pooling ({pooled_norm})" if pooled_norm and pooled_norm != token_norm else ("before the read-out" if pooled_norm else "none"),
            "l2_normalized": bool(normalize_embedding),
            "reference": (reference.get("projection", "timm forward_head(forward_features(x)) (the projection head)") if projection
                          else reference["embedding"])
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
    return loaded.adapter.reference_calls(loaded)


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
