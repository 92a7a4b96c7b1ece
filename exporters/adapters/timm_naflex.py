"""timm's ``NaFlexVit`` (``naflexvit_*``: SigLIP 2 NaFlex encoders, C-RADIO v3/v4 backbones, the GAP/MAP
NaFlex ViTs): a ViT whose embedding module (``embeds``) patchifies the image (a Linear on flattened
(P_h, P_w, C) patches, or a patch Conv), keeps its position table at its own grid with no prefix rows
(learned 2-D, or factorized row + column tables: the ``_parfac_`` names; ``_par_``: aspect-preserving
resampling) and resamples it for every input by its own rule; prefix tokens are a class token and
registers; the read-out is CLS, a (masked) mean, or an attention-pool head (MAP).

- The spec's native size is the table's own grid (where the table applies as stored); the weight's
  preprocessing size (``pretrained_cfg`` input_size, e.g. 384 for a 16x16 table) is the default export
  size (``default_resolution``).
- Static sizes bake timm's own resampled table (its ``_apply_*_pos_embed`` on zeros) into the copy.
- Dynamic graphs and variable-size batches compute the same rule as interpolation matrices
  (timm_naflex_positions.py): no Resize in the graph, so an antialiased rule stays parseable.
- Variable size is NaFlex's own design: padded patches are masked as keys in every block and in the
  pooling (masked mean, or the MAP head's key mask), each image gets the table of its own grid.
- Rotary NaFlex variants (``rope_type``) and in-graph image padding (``dynamic_img_pad``) are refused.
"""

from __future__ import annotations

import copy
from typing import Any

from vitdeploy.errors import UserError
from vitdeploy.spec import ViTSpec

from .base import register_family
from .timm_common import TimmFamily, mlp_shape
from .timm_naflex_positions import naflex_positions, rule_text

READOUTS = ("token", "avg", "map")


@register_family
class TimmNaFlex(TimmFamily):
    name = "timm-naflex"
    variable_size_refusal = None

    @classmethod
    def claims(cls, model: Any) -> bool:
        from timm.models.naflexvit import NaFlexVit

        return isinstance(model, NaFlexVit)

    def accept(self, model: Any, name: str) -> None:
        if getattr(model, "rope", None) is not None:
            raise UserError(f"timm model {name!r} is a NaFlexVit with rotary positions (rope); vitdeploy exports NaFlexVit "
                            "with learned, factorized or no position tables")
        if model.embeds.dynamic_img_pad:
            raise UserError(f"timm model {name!r} pads images to the patch size in-graph (dynamic_img_pad); export it without")
        if model.global_pool not in READOUTS:
            raise UserError(f"timm model {name!r} uses global_pool={model.global_pool!r}; vitdeploy exports NaFlexVit read-outs "
                            "'token' (CLS), 'avg' (GAP) and 'map' (attention pool)")
        if model.attn_pool is not None and (model.attn_pool.latent_len != 1 or model.attn_pool.pos_embed is not None):
            raise UserError(f"timm model {name!r} has an attention pool with {model.attn_pool.latent_len} latents or its own "
                            "position table; vitdeploy exports the one-query MAP head")
        # the image-tensor path with its patch Linear as the equal Conv (no parameter changes: --checkpoint,
        # the weights' identity and timm's NaFlex dict path are untouched)
        model.embeds.__class__ = _conv_embeds()

    def spec(self, model: Any, name: str) -> ViTSpec:
        embeds = model.embeds
        d = int(model.embed_dim)
        ratio, kind = mlp_shape(model.blocks[0], d)
        patch = tuple(int(p) for p in embeds.patch_size)
        grid = table_grid(model)
        terms = []
        prefix = int(model.num_prefix_tokens)
        if model.attn_pool is not None:
            pool = model.attn_pool
            rho = pool.mlp.fc1.out_features / d if pool.mlp is not None else 0.0
            c1 = 2 * d * d + 2 * d  # k, v of each token, one query row against each key and value
            pooled = 0 if model.pool_include_prefix else prefix  # the pool reads the patch tokens only: c1 (L - prefix)
            terms.append({"name": "map-head", "macs": [int((2 + 2 * rho) * d * d - c1 * pooled), c1, 0],
                          "params": sum(p.numel() for p in pool.parameters())})
        if embeds.pos_embed_type == "factorized":  # G0_h + G0_w rows instead of a G0_h x G0_w table
            terms.append({"name": "factorized-position-tables", "macs": [0, 0, 0],
                          "params": int(embeds.pos_embed_y.numel() + embeds.pos_embed_x.numel())})
        return ViTSpec(
            image_size=(grid[0] * patch[0], grid[1] * patch[1]),
            patch_size=patch,
            embed_dim=d,
            depth=len(model.blocks),
            num_heads=int(model.blocks[0].attn.num_heads),
            num_classes=int(model.num_classes),
            in_chans=int(embeds.in_chans),
            mlp_ratio=ratio,
            mlp_kind=kind,
            class_token=bool(model.has_class_token),
            num_reg_tokens=int(model.num_reg_tokens),
            global_pool=model.global_pool,
            pos_embed_prefix_rows=0,  # NaFlex's table holds patch positions only
            architecture="naflexvit",
            abs_pos_embed=embeds.pos_embed_type == "learned",
            extra={"position_rule": rule_text(embeds)},
            extra_terms=tuple(terms),
        )

    def default_resolution(self, model: Any) -> tuple[int, int] | None:
        size = (getattr(model, "pretrained_cfg", None) or {}).get("input_size")
        return (int(size[-2]), int(size[-1])) if size else None

    def readout(self, loaded: Any) -> str:
        return {"avg": "gap", "map": "map"}.get(loaded.spec.global_pool, "cls")

    def module_names(self, loaded: Any) -> list[str]:
        import torch

        model = loaded.model
        names = ["embeds"] + [f"blocks.{i}" for i in range(loaded.spec.depth)]  # embeds: the patch Linear, positions, prefix
        names += [n for n in ("norm", "attn_pool", "fc_norm", "head")
                  if getattr(model, n, None) is not None and not isinstance(getattr(model, n), torch.nn.Identity)]
        return names

    def reference_calls(self, loaded: Any) -> dict[str, str]:
        calls = super().reference_calls(loaded)
        calls["patch_grid"] = calls["patch_grid"].replace("forward_features(x)", "NaFlexVit.forward_features(x) (image-tensor path)")
        return calls

    # -- positions ---------------------------------------------------------------------------------
    def regrid_static(self, loaded: Any, height: int, width: int, interp: Any) -> Any:
        """A copy holding timm's own table for this grid (so its forward takes the no-resize path)."""
        import torch

        model = copy.deepcopy(loaded.model)
        embeds = model.embeds
        grid = [height // embeds.patch_size[0], width // embeds.patch_size[1]]
        if embeds.pos_embed_type == "none":
            return model
        zeros = torch.zeros(1, grid[0] * grid[1], model.embed_dim)
        with torch.no_grad():
            if embeds.pos_embed_type == "factorized":
                embeds._apply_factorized_pos_embed(zeros, grid_size=grid)
            else:
                embeds._apply_learned_pos_embed(zeros, grid_size=grid)
        embeds.pos_embed = torch.nn.Parameter(zeros.reshape(1, grid[0], grid[1], -1), requires_grad=False)
        embeds.pos_embed_y = embeds.pos_embed_x = None
        embeds.pos_embed_type = "learned"
        return model

    def make_dynamic(self, loaded: Any, interp: Any) -> tuple[Any, ViTSpec]:
        model = copy.deepcopy(loaded.model)
        model.embeds.__class__ = _in_graph_embeds()
        return model, loaded.spec

    def variable_parts(self, loaded: Any) -> Any:
        from ..features import has_head

        if not has_head(loaded):  # the variable-size graph returns class scores only
            raise UserError("--variable-size exports class scores (logits, probs) and this NaFlexVit has no classification head; "
                            "export its embedding per size (--resolution) or with --dynamic-resolution")
        return NaFlexParts(loaded.model)


def table_grid(model: Any) -> tuple[int, int]:
    """The grid the stored table applies to as is (no resampling): the spec's native grid."""
    embeds = model.embeds
    if embeds.pos_embed_type == "learned":
        return tuple(int(v) for v in embeds.pos_embed.shape[1:3])
    if embeds.pos_embed_type == "factorized":
        return int(embeds.pos_embed_y.shape[1]), int(embeds.pos_embed_x.shape[1])
    if embeds.pos_embed_grid_size is not None:
        return tuple(int(v) for v in embeds.pos_embed_grid_size)
    size = (getattr(model, "pretrained_cfg", None) or {}).get("input_size") or (3, 224, 224)
    return int(size[-2]) // embeds.patch_size[0], int(size[-1]) // embeds.patch_size[1]


def patch_conv(embeds: Any, x: Any) -> Any:
    """The patch Linear on flattened (P_h, P_w, C) patches, computed as the equal patch Conv: [B, d, G_h, G_w].

    The Linear's weight [d, P_h*P_w*C] is the Conv kernel [d, C, P_h, P_w] read in timm's patch layout
    (channels last unless ``patchify_channels_last=False``), so every graph gets the Conv that the fp16
    pass, the INT8 roles (patch-embed), check's patch taps and TensorRT know as a ViT's patch embedding."""
    import torch.nn.functional as F

    d, (ph, pw), c = embeds.proj.out_features, embeds.patch_size, embeds.in_chans
    weight = embeds.proj.weight
    kernel = weight.reshape(d, ph, pw, c).permute(0, 3, 1, 2) if embeds.channels_last else weight.reshape(d, c, ph, pw)
    return F.conv2d(x, kernel, embeds.proj.bias, stride=(ph, pw))


_EMBEDS: dict[str, type] = {}


def _conv_embeds() -> type:
    """NaFlexEmbeds whose image-tensor path runs the patch Linear as a Conv (same parameters, same state
    dict; the NaFlex dict path is timm's own)."""
    if "conv" in _EMBEDS:
        return _EMBEDS["conv"]
    import torch
    from timm.models.naflexvit import NaFlexEmbeds

    class NaFlexEmbedsConv(NaFlexEmbeds):
        def forward(self, x: Any, patch_coord: Any = None, patch_valid: Any = None) -> Any:
            if patch_coord is not None or not self.is_linear or self.norm_input is not None or self.dynamic_img_pad or x.ndim != 4:
                return super().forward(x, patch_coord=patch_coord, patch_valid=patch_valid)
            tokens = patch_conv(self, x)
            grid_size = tokens.shape[-2:]
            x = self.norm(tokens.flatten(2).transpose(1, 2))
            if self.pos_embed_type == "learned":
                self._apply_learned_pos_embed(x, grid_size=grid_size)
            elif self.pos_embed_type == "factorized":
                self._apply_factorized_pos_embed(x, grid_size=grid_size)
            prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
            return self.pos_drop(torch.cat(prefix + [x], dim=1) if prefix else x), grid_size

    _EMBEDS["conv"] = NaFlexEmbedsConv
    return NaFlexEmbedsConv


def _in_graph_embeds() -> type:
    """The Conv embeds whose table comes from interpolation matrices (any symbolic grid)."""
    if "in-graph" in _EMBEDS:
        return _EMBEDS["in-graph"]
    import torch

    class NaFlexEmbedsInGraph(_conv_embeds()):
        def _add_table(self, x: Any, grid_size: Any) -> None:
            gh, gw = grid_size
            # scalar_tensor keeps a symbolic size symbolic in the exported graph (as_tensor would bake the traced one)
            len_h, len_w = (torch.scalar_tensor(g, dtype=torch.float32, device=x.device) for g in (gh, gw))
            x.add_(naflex_positions(self, len_h, len_w, gh, gw).unsqueeze(0).to(x.dtype))

        def _apply_learned_pos_embed(self, x: Any, grid_size: Any) -> None:
            self._add_table(x, grid_size)

        def _apply_factorized_pos_embed(self, x: Any, grid_size: Any) -> None:
            self._add_table(x, grid_size)

    _EMBEDS["in-graph"] = NaFlexEmbedsInGraph
    return NaFlexEmbedsInGraph


class NaFlexParts:
    """A NaFlexVit split into the masked forward's steps (exporters/variable_size.py)."""

    def __init__(self, model: Any):
        import inspect

        if "attn_mask" not in inspect.signature(type(model.blocks[0]).forward).parameters:
            raise UserError("--variable-size: this NaFlexVit's blocks take no attention mask")
        self.model = model
        self.table = None  # positions() gives each image its table by NaFlex's own rule
        self.prefix_rows = 0

    def patch_tokens(self, x: Any) -> Any:
        from timm.models.naflexvit import batch_patchify

        embeds = self.model.embeds
        if embeds.is_linear and embeds.norm_input is not None:  # a norm over each flattened patch: timm's patchify
            patches, _ = batch_patchify(x, embeds.patch_size, pad=False, channels_last=embeds.channels_last)
            tokens = embeds.proj(embeds.norm_input(patches))
        else:
            tokens = (patch_conv(embeds, x) if embeds.is_linear else embeds.proj(x)).flatten(2).transpose(1, 2)
        return embeds.norm(tokens)

    def positions(self, grid: Any, canvas_grid: tuple[int, int]) -> Any:
        """[B, C_h*C_w, d]: each image's table for its own grid (rows, cols < its grid), by NaFlex's rule."""
        grid = grid.to(dtype=self.model.embeds.proj.weight.dtype)
        pos = naflex_positions(self.model.embeds, grid[:, 0], grid[:, 1], canvas_grid[0], canvas_grid[1])
        return 0.0 if pos is None else pos

    def prefix_tokens(self, batch: int) -> list[Any]:
        embeds = self.model.embeds
        return [t.expand(batch, -1, -1) for t in (embeds.cls_token, embeds.reg_token) if t is not None]

    def encode(self, z: Any, key_bias: Any) -> Any:
        m = self.model
        z = m.norm_pre(z)
        bias = key_bias[:, None, None, :]  # [B, 1, 1, L]: padded keys masked, as NaFlex's own attention mask
        for block in m.blocks:
            z = block(z, attn_mask=bias)
        return m.norm(z)

    def head(self, features: Any, valid: Any) -> Any:
        import torch

        from ..variable_size import MASK_BIAS

        m = self.model
        if m.attn_pool is None:
            return m.forward_head(features, patch_valid=valid)  # timm's masked mean (or the CLS row)
        keys = valid
        if m.pool_include_prefix:
            prefix = torch.ones(features.shape[0], m.num_prefix_tokens, dtype=torch.bool)  # batch read off the tokens
            keys = torch.cat([prefix, valid], dim=1)
        else:
            features = features[:, m.num_prefix_tokens:]
        zero = torch.zeros((), dtype=torch.float32)
        bias = torch.where(keys, zero, torch.full((), MASK_BIAS, dtype=torch.float32))[:, None, None, :]
        pooled = m.attn_pool(features, attn_mask=bias)  # the MAP head with NaFlex's key mask (finite, fp16-safe)
        return m.head(m.head_drop(m.fc_norm(pooled)))

