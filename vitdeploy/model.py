"""The reference Vision Transformer, exactly as the chapter defines it (§39.1–39.4, Algorithm 39.1).

Order of this file: patch embedding -> attention -> MLP -> block -> model -> resolution change ->
patch-embedding equivalence -> weight loading.

Module names follow timm's ``VisionTransformer`` (``patch_embed.proj``, ``cls_token``,
``dist_token``, ``reg_token``, ``pos_embed``, ``blocks.{i}.norm1/attn.qkv/attn.proj/norm2/mlp.fc1/
mlp.fc2``, ``norm``, ``head``, ``head_dist``), so timm-style state dicts of plain ViT / DeiT / ViT-reg
models load directly. There is no dropout and no stochastic depth: this model is for inference,
checks and the small builtin training run, and Algorithm 39.1 switches dropout off anyway.

Token order: [CLS, DIST, REG..., patches]. The position table has either one row per prefix token
plus one per patch (``pos_embed_prefix_rows == num_prefix_tokens``, standard ViT/DeiT) or patch rows
only (``pos_embed_prefix_rows == 0``, timm's ``no_embed_class``: prefix tokens get no position).
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

import torch
from torch import nn

from .errors import ConfigError, UserError
from .patches import patchify
from .posembed import EXPORT_DEFAULT, PosEmbedInterpolation, resample_pos_embed
from .spec import ViTSpec, check_resolution

DEFAULT_LAYER_NORM_EPS = 1e-6  # timm's ViT value; Hugging Face ViTs use 1e-12 (spec.extra["layer_norm_eps"])


def _is_symbolic(*sizes: Any) -> bool:
    """True while tracing with dynamic shapes (torch.export / dynamo): sizes are SymInts then."""
    return any(isinstance(s, torch.SymInt) for s in sizes)


class PatchEmbed(nn.Module):
    """Eq. (39.3)/(39.4): a Conv2d with kernel = stride = patch and no padding, then row-major flatten.

    Equivalent to ``patchify`` followed by one linear map W_E shared by all patches (§39.2); see
    :func:`patch_embed_as_linear`. Parameter count F*d + d, independent of the number of patches.
    """

    def __init__(self, patch_size: tuple[int, int], in_chans: int, embed_dim: int):
        super().__init__()
        self.patch_size = tuple(patch_size)
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[Any, Any]]:
        """[B, C, H, W] -> ([B, N, d], (G_h, G_w)); the grid sizes are SymInts under dynamic export."""
        feat = self.proj(x)  # [B, d, G_h, G_w]
        grid = (feat.shape[-2], feat.shape[-1])
        # [B, d, G_h, G_w] -> [B, G_h*G_w, d]: n = r*G_w + s, the same row-major rule as patchify.
        return feat.flatten(2).transpose(1, 2), grid


class Attention(nn.Module):
    """Multi-head self-attention over the whole visual sequence (Eq. 39.19): no causal mask.

    A key-validity mask removes padded positions. Explicit softmax (not SDPA) so the exported graph
    has plain MatMul/Softmax nodes that the fp16 and Q/DQ passes can see and keep in fp32.
    """

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each [B, a, L, d_h]
        scores = (q * self.scale) @ k.transpose(-2, -1)  # [B, a, L, L]
        if key_mask is not None and key_mask.dtype == torch.bool:
            # Callers guarantee every row keeps >= 1 visible key (VisionTransformer checks it), so -inf
            # never fills a whole row and softmax never sees an all-masked row.
            scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
        elif key_mask is not None:
            # An additive float bias per key [B, L] (0 valid, a large finite negative padded): the
            # deployed variable-size graph's form, which no input can turn into an all -inf row.
            scores = scores + key_mask[:, None, None, :].to(scores.dtype)
        weights = scores.softmax(dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(b, n, c)
        return self.proj(out)


class Mlp(nn.Module):
    """The position-wise feed-forward network: d -> rho*d -> d with exact (erf) GELU."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-LN encoder layer, Eq. (39.18): Z' = Z + MSA(LN(Z)); Z'' = Z' + MLP(LN(Z'))."""

    def __init__(self, dim: int, num_heads: int, mlp_hidden: int, eps: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, mlp_hidden)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), key_mask)
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """The chapter's ViT classifier built from a :class:`~vitdeploy.spec.ViTSpec`.

    ``forward(x)`` takes a float NCHW batch that is already preprocessed (the uint8 wrapper lives in
    the exporters). When H/W differ from ``spec.image_size`` the position table is resampled inside
    ``forward`` with ``interpolation`` (Algorithm 39.1, step 2). With ``dynamic_img_size=True``, or
    whenever the sizes are symbolic during export, the resampling always runs, so a dynamic-H/W
    graph carries it (at the native size it is the identity up to float rounding).

    ``spec.extra`` may hold ``layer_norm_eps`` (default 1e-6) and ``fc_norm`` (True: timm's
    arrangement for GAP models, final LayerNorm after pooling instead of before; default False,
    the chapter's LN-then-read-out).
    """

    def __init__(
        self,
        spec: ViTSpec,
        interpolation: PosEmbedInterpolation = EXPORT_DEFAULT,
        dynamic_img_size: bool = False,
    ):
        super().__init__()
        if spec.num_distill_tokens not in (0, 1):
            raise ConfigError(f"at most one distillation token is supported, spec has {spec.num_distill_tokens}")
        if spec.pos_embed_prefix_rows not in (0, spec.num_prefix_tokens):
            raise ConfigError(
                f"pos_embed_prefix_rows must be 0 or the number of prefix tokens ({spec.num_prefix_tokens}), "
                f"got {spec.pos_embed_prefix_rows}"
            )
        self.spec = spec
        self.interpolation = interpolation
        self.dynamic_img_size = dynamic_img_size
        d = spec.embed_dim
        eps = float(spec.extra.get("layer_norm_eps", DEFAULT_LAYER_NORM_EPS))
        self.use_fc_norm = bool(spec.extra.get("fc_norm", False))

        self.patch_embed = PatchEmbed(spec.patch_size, spec.in_chans, d)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if spec.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, d)) if spec.num_distill_tokens else None
        self.reg_token = nn.Parameter(torch.zeros(1, spec.num_reg_tokens, d)) if spec.num_reg_tokens else None
        self.pos_embed = nn.Parameter(torch.zeros(1, spec.pos_embed_prefix_rows + spec.num_patches(), d))
        hidden = int(round(spec.mlp_ratio * d))
        self.blocks = nn.ModuleList(Block(d, spec.num_heads, hidden, eps) for _ in range(spec.depth))
        self.norm = nn.Identity() if self.use_fc_norm else nn.LayerNorm(d, eps=eps)
        self.fc_norm = nn.LayerNorm(d, eps=eps) if self.use_fc_norm else nn.Identity()
        self.head = nn.Linear(d, spec.num_classes)
        self.head_dist = nn.Linear(d, spec.num_classes) if spec.num_distill_tokens else None
        self.reset_parameters()

    # -- initialisation (timm's scheme; only matters for training) --------------------------------
    def reset_parameters(self) -> None:
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for token in (self.cls_token, self.dist_token, self.reg_token):
            if token is not None:
                nn.init.normal_(token, std=1e-6)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    # -- sequence assembly (§39.3) ----------------------------------------------------------------
    def _prefix_tokens(self, batch: int) -> list[torch.Tensor]:
        tokens = [t for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        return [t.expand(batch, -1, -1) for t in tokens]

    def pos_embed_for_grid(self, grid: tuple[Any, Any]) -> torch.Tensor:
        """The position table for a G_h x G_w grid: stored as-is at the native grid, else resampled."""
        native = self.spec.native_grid
        symbolic = _is_symbolic(*grid)
        # A Python comparison of SymInts would specialise the export to one size, so symbolic grids
        # always take the resampling path.
        if not symbolic and not self.dynamic_img_size and tuple(int(g) for g in grid) == native:
            return self.pos_embed
        return resample_pos_embed(
            self.pos_embed,
            grid,
            native,
            self.spec.pos_embed_prefix_rows,
            self.interpolation.method,
            self.interpolation.align_corners,
            self.interpolation.antialias,
        )

    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() != 4 or x.shape[1] != self.spec.in_chans:
            raise UserError(
                f"expected a float [B, {self.spec.in_chans}, H, W] batch, got shape {tuple(x.shape)}"
            )
        if not x.is_floating_point():
            raise UserError(f"expected a preprocessed float batch, got dtype {x.dtype}; apply the preprocessing first")
        h, w = x.shape[-2], x.shape[-1]
        if not _is_symbolic(h, w):
            # The conv would silently drop the remainder; the graph must not (see DESIGN: sizes).
            check_resolution(int(h), int(w), self.spec.patch_size)

    def _full_mask(self, mask: torch.Tensor | None, batch: int, num_patches: Any) -> torch.Tensor | None:
        """Validity mask over all L positions (bool [B, L]); a [B, N] patch mask gets valid prefixes."""
        if mask is None:
            return None
        if mask.dtype != torch.bool or mask.dim() != 2:
            raise UserError(f"mask must be a bool [B, L] or [B, N] tensor, got {mask.dtype} {tuple(mask.shape)}")
        prefix = self.spec.num_prefix_tokens
        if mask.shape[1] == num_patches and prefix:
            mask = torch.cat([mask.new_ones(mask.shape[0], prefix), mask], dim=1)
        if mask.shape[0] != batch or mask.shape[1] != prefix + num_patches:
            raise UserError(
                f"mask shape {tuple(mask.shape)} does not match batch {batch} and L={prefix + num_patches} "
                f"(or N={num_patches}) positions"
            )
        if not torch.compiler.is_exporting():
            # Algorithm 39.1: every valid query needs a visible key; an all-masked row would make
            # softmax divide by zero. (Keys are masked per sample, so this is "any valid position".)
            empty = ~mask.any(dim=1)
            if bool(empty.any()):
                rows = empty.nonzero().flatten().tolist()
                raise UserError(f"mask leaves no visible position in batch rows {rows}; every image needs >= 1 valid patch")
        return mask

    def forward_features(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Preprocessed [B, C, H, W] -> Z_hat = LN(Z^(T)), [B, L, d] (Eqs. 39.3–39.18)."""
        self._check_input(x)
        tokens, grid = self.patch_embed(x)
        batch = tokens.shape[0]
        full_mask = self._full_mask(mask, batch, tokens.shape[1])
        pos = self.pos_embed_for_grid(grid)
        prefix = self._prefix_tokens(batch)
        if self.spec.pos_embed_prefix_rows:
            z = torch.cat(prefix + [tokens], dim=1) + pos
        else:
            z = torch.cat(prefix + [tokens + pos], dim=1)
        for block in self.blocks:
            z = block(z, full_mask)
        return self.norm(z)

    def pool(self, features: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Read-out h (§39.4): CLS row, or the mean over valid patch rows (GAP); DeiT adds the DIST row."""
        prefix = self.spec.num_prefix_tokens
        if self.spec.global_pool == "avg":
            patches = features[:, prefix:]
            if mask is None:
                h = patches.mean(dim=1)
            else:
                m = mask[:, -patches.shape[1]:].to(patches.dtype).unsqueeze(-1)  # patch part of [B, L] or [B, N]
                valid = m.sum(dim=1)
                if not torch.compiler.is_exporting() and bool((valid == 0).any()):
                    raise UserError("GAP read-out needs at least one valid patch per image (N_valid > 0)")
                h = (patches * m).sum(dim=1) / valid
        else:
            h = features[:, 0]
        h = self.fc_norm(h)
        if self.head_dist is not None:
            return h, features[:, 1]
        return h

    def forward_head(self, features: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Z_hat -> logits o = h W_C + b_C. A DeiT-distilled model averages its two heads."""
        h = self.pool(features, mask)
        if isinstance(h, tuple):
            return (self.head(h[0]) + self.head_dist(h[1])) / 2
        return self.head(h)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Preprocessed float [B, C, H, W] (optional bool validity mask [B, L] or [B, N]) -> logits [B, K]."""
        return self.forward_head(self.forward_features(x, mask), mask)


# -- resolution change ---------------------------------------------------------------------------
def with_resolution(
    model: VisionTransformer,
    height: int,
    width: int,
    interpolation: PosEmbedInterpolation | None = None,
) -> VisionTransformer:
    """A copy of ``model`` whose stored position table is resampled offline to height x width.

    For static exports at a non-native size: the graph then holds the new table as a constant and
    no Resize. The copy's spec has the new ``image_size`` and ``extra["pos_embed_resampled_from"]``.
    """
    interp = interpolation or model.interpolation
    new_grid = model.spec.grid(height, width)  # refuses sizes the patch does not tile
    spec_dict = model.spec.to_dict()
    spec_dict["image_size"] = [height, width]
    spec_dict["extra"] = dict(model.spec.extra)
    spec_dict["extra"]["pos_embed_resampled_from"] = {
        "image_size": list(model.spec.image_size),
        "interpolation": interp.to_dict(),
    }
    clone = copy.deepcopy(model)
    clone.spec = ViTSpec.from_dict(spec_dict)
    clone.interpolation = interp
    with torch.no_grad():
        table = resample_pos_embed(
            model.pos_embed.detach(),
            new_grid,
            model.spec.native_grid,
            model.spec.pos_embed_prefix_rows,
            interp.method,
            interp.align_corners,
            interp.antialias,
        )
    clone.pos_embed = nn.Parameter(table.clone(), requires_grad=model.pos_embed.requires_grad)
    return clone


# -- §39.2: the convolution is a patchify + one shared linear map ---------------------------------
def patch_embed_as_linear(model: VisionTransformer | PatchEmbed) -> nn.Linear:
    """The Linear(F, d) equal to the patch-embedding conv: W_E[f, j] = K[j, c, u, v], f = c*P_h*P_w + u*P_w + v.

    ``nn.Linear`` stores W_E transposed ([d, F]), which is exactly the conv kernel reshaped row-major.
    """
    embed = model.patch_embed if isinstance(model, VisionTransformer) else model
    conv = embed.proj
    d = conv.out_channels
    linear = nn.Linear(conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1], d, bias=conv.bias is not None)
    with torch.no_grad():
        linear.weight.copy_(conv.weight.reshape(d, -1))
        if conv.bias is not None:
            linear.bias.copy_(conv.bias)
    return linear.to(conv.weight.dtype)


def embed_patches_linear(model: VisionTransformer | PatchEmbed, x: torch.Tensor) -> torch.Tensor:
    """E = patchify(x) W_E + b (Eq. 39.3), [B, N, d]: the linear path that equals ``patch_embed(x)``."""
    embed = model.patch_embed if isinstance(model, VisionTransformer) else model
    return patch_embed_as_linear(embed)(patchify(x, embed.patch_size))


# -- weights -------------------------------------------------------------------------------------
def state_dict_problems(expected: Mapping[str, Any], state_dict: Mapping[str, Any], limit: int = 4) -> list[str]:
    """What keeps ``state_dict`` from loading strictly into a model with ``expected`` tensors:
    missing keys, unexpected keys and shape mismatches, the first few of each named."""

    def first(items: list[str]) -> str:
        return ", ".join(items[:limit]) + (" ..." if len(items) > limit else "")

    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    wrong = sorted(
        f"{k} {tuple(state_dict[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state_dict and tuple(state_dict[k].shape) != tuple(v.shape)
    )
    problems = []
    if missing:
        problems.append(f"missing keys {first(missing)}")
    if unexpected:
        problems.append(f"unexpected keys {first(unexpected)}")
    if wrong:
        problems.append(f"shape mismatch {'; '.join(wrong[:limit])}{' ...' if len(wrong) > limit else ''}")
    return problems


def load_weights(model: VisionTransformer, state_dict: Mapping[str, torch.Tensor], source: str = "weights") -> VisionTransformer:
    """Load a timm-style state dict strictly; a missing, extra or mis-shaped tensor is a ConfigError."""
    problems = state_dict_problems(model.state_dict(), state_dict, limit=5)
    if problems:
        raise ConfigError(f"{source} do not match the spec ({'; '.join(problems)}); use the config written with these weights")
    model.load_state_dict(dict(state_dict), strict=True)
    return model


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
