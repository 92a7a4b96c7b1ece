"""BEiT's relative-position bias at another patch grid (issue 17).

A BEiT attention layer adds ``B[h, (r1,s1), (r2,s2)] = T[h, r1-r2+G_h-1, s1-s2+G_w-1]`` to its logits:
a table T of (2G_h-1) x (2G_w-1) offsets per head, plus three rows for CLS->token, token->CLS and
CLS->CLS, read through an index buffer of (N+1)^2 entries. At another grid G' both change: the
table must span (2G'_h-1) x (2G'_w-1) offsets and the index is rebuilt for N' = G'_h G'_w.

The table is re-sampled with timm's own rule (``timm.layers.resize_rel_pos_bias_table``, what
``Beit.set_input_size`` calls; from BEiT's unilm fine-tuning code): the old offsets are placed on a
geometric progression whose ratio is solved by bisection so that it reaches the new half-width,
and the new integer offsets are read off by linear interpolation, per axis; the CLS rows are
copied. Static exports call ``set_input_size`` itself. Dynamic exports need the same numbers from
the input's shape inside the graph, and the bisection is a float64 Python loop; but the rule is a
separable linear map whose weights depend on the grid alone, so this module asks timm's function
for those weights (one call per axis and size on one-hot tables) and stores, for every grid up to
``max_grid``, the two taps and weights of each new offset. The graph gathers the weights of its
grid, interpolates rows then columns, and gathers the bias through an index computed from
``arange(G'_h)``, ``arange(G'_w)``: no MatMul (nothing for INT8 to quantize), no Python loop.
The bundle declares ``max_grid``; larger inputs are refused by every stage (``ViTSpec.grid``).
"""

from __future__ import annotations

import copy
import types
from typing import Any, Sequence

import numpy as np
import torch

from vitdeploy.errors import ConfigError
from vitdeploy.posembed import PosEmbedInterpolation, resample_pos_embed

RULE = ("timm resize_rel_pos_bias_table: old offsets on a geometric progression reaching the new "
        "half-width (ratio by bisection, BEiT's unilm rule), linear interpolation at the new integer "
        "offsets per axis; CLS rows copied; index rebuilt for the new grid")
EXTRA_ROWS = 3  # CLS->token, token->CLS, CLS->CLS


def default_max_grid(native: Sequence[int]) -> tuple[int, int]:
    """Largest grid a dynamic BEiT graph carries weights for: 4x the native grid, at least 64."""
    return tuple(max(64, 4 * int(g)) for g in native)  # type: ignore[return-value]


def _progression(src: int, dst: int) -> list[float]:
    """Where timm puts the ``src`` old offsets when the new span is ``dst`` (its ``_calc``, same arithmetic)."""
    left, right = 1.01, 1.5
    q = left
    while right - left > 1e-6:
        q = (left + right) / 2.0
        gp = (1.0 - q ** (src // 2)) / (1.0 - q)
        if gp > dst // 2:
            right = q
        else:
            left = q
    dis, cur = [], 1.0
    for i in range(src // 2):
        dis.append(cur)
        cur += q ** (i + 1)
    return [-d for d in reversed(dis)] + [0.0] + dis


def axis_taps(src_grid: int, dst_grid: int) -> tuple[np.ndarray, np.ndarray]:
    """timm's 1-D map from 2*src-1 old offsets to 2*dst-1 new ones as (index [D, 2], weight [D, 2]).

    timm places the old offsets with :func:`_progression` and interpolates linearly at the integer
    new offsets (``RegularGridInterpolator``: float32 points, clamped at the ends). timm applies this
    to BOTH axes whenever the 2-D table changes size, also to an axis whose size did not change
    (its offsets then spread by the ratio 1.01 floor), and leaves the table untouched only when
    both sizes are equal; :class:`RelPosBiasResampler` reproduces that with an identity entry.
    Tested against ``resize_rel_pos_bias_table`` itself to <= 1e-6.
    """
    src, dst = 2 * src_grid - 1, 2 * dst_grid - 1
    points = np.asarray(_progression(src, dst), dtype=np.float32)
    half = dst // 2
    targets = np.arange(-half, half + 1, dtype=np.float32)
    right = np.minimum(np.searchsorted(points, targets, side="left"), len(points) - 1)
    left = np.clip(right - 1, 0, len(points) - 1)
    d_left = np.maximum(targets - points[left], 0).astype(np.float32)
    d_right = np.maximum(points[right] - targets, 0).astype(np.float32)
    both_zero = (d_left == 0) & (d_right == 0)
    d_left[both_zero] = d_right[both_zero] = 1.0
    total = d_left + d_right
    index = np.stack([left, right], axis=1).astype(np.int64)
    weight = np.stack([d_right / total, d_left / total], axis=1).astype(np.float32)
    return index, weight


class RelPosBiasResampler(torch.nn.Module):
    """Builds the [1, heads, L', L'] bias of a BEiT table for any grid up to ``max_grid``, in-graph."""

    def __init__(self, native_grid: Sequence[int], max_grid: Sequence[int]):
        super().__init__()
        self.native_grid = tuple(int(g) for g in native_grid)
        self.max_grid = tuple(int(g) for g in max_grid)
        for axis, name in enumerate("hw"):
            src, top = self.native_grid[axis], self.max_grid[axis]
            # entries 0..top-1: timm's taps for a new grid of 1..top; entry top: identity, used only
            # when the whole grid is native (timm then keeps the table as it is)
            index = np.zeros((top + 1, 2 * top - 1, 2), dtype=np.int64)
            weight = np.zeros((top + 1, 2 * top - 1, 2), dtype=np.float32)
            for dst in range(1, top + 1):
                index[dst - 1, : 2 * dst - 1], weight[dst - 1, : 2 * dst - 1] = axis_taps(src, dst)
            index[top, : 2 * src - 1, 0] = index[top, : 2 * src - 1, 1] = np.arange(2 * src - 1)
            weight[top, : 2 * src - 1, 0] = 1.0
            # non-persistent: derived data, not weights (the state dict stays timm's)
            self.register_buffer(f"index_{name}", torch.from_numpy(index), persistent=False)
            self.register_buffer(f"weight_{name}", torch.from_numpy(weight), persistent=False)

    def table_for_grid(self, table: torch.Tensor, grid: Sequence[Any]) -> torch.Tensor:
        """[(2G'_h-1)(2G'_w-1) + 3, heads]: ``table`` re-sampled to ``grid`` (sizes may be symbolic)."""
        gh, gw = grid
        sh, sw = (2 * g - 1 for g in self.native_grid)
        heads = table.shape[1]
        if table.shape[0] != sh * sw + EXTRA_ROWS:
            raise ConfigError(f"relative bias table has {table.shape[0]} rows; a {self.native_grid} grid needs {sh * sw + EXTRA_ROWS}")
        grid_part = table[: sh * sw].t().reshape(heads, sh, sw).float()
        extra = table[sh * sw:]
        # the lookup entry of each axis: its grid size - 1, or the identity entry when the whole grid
        # is native; computed from tensors (no Python branch on symbolic sizes, no guard)
        size_h = torch.ones(gh, dtype=torch.int64, device=table.device).sum()
        size_w = torch.ones(gw, dtype=torch.int64, device=table.device).sum()
        native = ((size_h == self.native_grid[0]) & (size_w == self.native_grid[1])).to(torch.int64)
        entry_h = size_h - 1 + native * (self.max_grid[0] + 1 - size_h)
        entry_w = size_w - 1 + native * (self.max_grid[1] + 1 - size_w)
        iy, wy = self.index_h[entry_h][: 2 * gh - 1], self.weight_h[entry_h][: 2 * gh - 1]
        ix, wx = self.index_w[entry_w][: 2 * gw - 1], self.weight_w[entry_w][: 2 * gw - 1]
        rows = grid_part[:, iy[:, 0], :] * wy[:, 0, None] + grid_part[:, iy[:, 1], :] * wy[:, 1, None]  # [h, Dh, sw]
        both = rows[:, :, ix[:, 0]] * wx[:, 0] + rows[:, :, ix[:, 1]] * wx[:, 1]  # [h, Dh, Dw]
        return torch.cat([both.reshape(heads, -1).t().to(table.dtype), extra], dim=0)

    def bias_for_grid(self, table: torch.Tensor, grid: Sequence[Any]) -> torch.Tensor:
        """[1, heads, L', L'] with L' = G'_h G'_w + 1, as timm's ``_get_rel_pos_bias`` at that grid."""
        gh, gw = grid
        flat = self.table_for_grid(table, grid)
        index = relative_position_index(gh, gw, table.device)
        length = gh * gw + 1
        bias = flat[index.reshape(-1)].reshape(length, length, -1)
        return bias.permute(2, 0, 1).unsqueeze(0)


def relative_position_index(gh: Any, gw: Any, device: Any = None) -> torch.Tensor:
    """timm's BEiT ``gen_relative_position_index`` for a (possibly symbolic) grid, without in-place writes.

    Row 0 is the CLS query (every key: extra row 0), column 0 the CLS key (extra row 1), [0, 0]
    CLS->CLS (extra row 2); patch pairs read (dr + G_h - 1) * (2 G_w - 1) + (ds + G_w - 1).
    """
    rows = torch.arange(gh, device=device).view(-1, 1).expand(gh, gw).reshape(-1)
    cols = torch.arange(gw, device=device).view(1, -1).expand(gh, gw).reshape(-1)
    d_rows = rows.view(-1, 1) - rows.view(1, -1) + (gh - 1)
    d_cols = cols.view(-1, 1) - cols.view(1, -1) + (gw - 1)
    patches = d_rows * (2 * gw - 1) + d_cols  # [N, N]
    offsets = (2 * gh - 1) * (2 * gw - 1)
    cls_query = torch.full_like(patches[:1], 0) + offsets  # [1, N]: extra row 0
    body = torch.cat([cls_query, patches], dim=0)  # [N + 1, N]
    cls_key = torch.cat([torch.zeros_like(body[:1, :1]) + offsets + 2, torch.zeros_like(body[1:, :1]) + offsets + 1], dim=0)
    return torch.cat([cls_key, body], dim=1)  # [N + 1, N + 1]


# -- whole models -------------------------------------------------------------------------------
def beit_static(model: Any, size: tuple[int, int], interp: PosEmbedInterpolation, native_grid: tuple[int, int]) -> Any:
    """A copy of a timm Beit at a fixed size: timm's own ``set_input_size`` re-samples the bias tables
    and rebuilds the index buffers; an absolute table (if any) follows the bundle's convention."""
    out = copy.deepcopy(model)
    table = out.pos_embed.detach().clone() if out.pos_embed is not None else None
    out.set_input_size(img_size=size)
    if table is not None:
        new_grid = tuple(out.patch_embed.grid_size)
        with torch.no_grad():
            resampled = resample_pos_embed(table, new_grid, native_grid, 1, interp.method, interp.align_corners, interp.antialias)
        out.pos_embed = torch.nn.Parameter(resampled, requires_grad=False)
    return out.eval()


def beit_dynamic(model: Any, interp: PosEmbedInterpolation, max_grid: Sequence[int]) -> Any:
    """A copy of a timm Beit that takes any H/W (multiples of the patch, grid <= ``max_grid``)."""
    out = copy.deepcopy(model)
    native = tuple(int(g) for g in out.patch_embed.grid_size)
    patch = tuple(int(p) for p in out.patch_embed.patch_size)
    out.patch_embed.strict_img_size = False
    out.relpos_resampler = RelPosBiasResampler(native, max_grid)

    def _get_rel_pos_bias(attn: Any) -> torch.Tensor:
        return attn.vitdeploy_bias  # set by forward_features for the current grid

    for block in out.blocks:
        if block.attn.relative_position_bias_table is not None:
            block.attn._get_rel_pos_bias = types.MethodType(_get_rel_pos_bias, block.attn)

    def forward_features(self: Any, x: torch.Tensor) -> torch.Tensor:
        # timm's Beit.forward_features with every position term built for the input's grid
        grid = (x.shape[-2] // patch[0], x.shape[-1] // patch[1])
        x = self.patch_embed(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        if self.pos_embed is not None:
            x = x + resample_pos_embed(self.pos_embed, grid, native, 1, interp.method, interp.align_corners, interp.antialias)
        x = self.pos_drop(x)
        shared = None
        if self.rel_pos_bias is not None:
            shared = self.relpos_resampler.bias_for_grid(self.rel_pos_bias.relative_position_bias_table, grid)[0]
        for block in self.blocks:
            if block.attn.relative_position_bias_table is not None:
                block.attn.vitdeploy_bias = self.relpos_resampler.bias_for_grid(block.attn.relative_position_bias_table, grid)
            x = block(x, shared_rel_pos_bias=shared)
        return self.norm(x)

    out.forward_features = types.MethodType(forward_features, out)
    return out.eval()


def rel_pos_record(model: Any) -> dict[str, Any] | None:
    """The spec's ``rel_pos_bias`` entry of a timm Beit (None without relative bias)."""
    shared = getattr(model, "rel_pos_bias", None) is not None
    per_block = any(getattr(b.attn, "relative_position_bias_table", None) is not None for b in model.blocks)
    if not (shared or per_block):
        return None
    return {
        "scope": "+".join(k for k, on in (("shared", shared), ("per-block", per_block)) if on),
        "rule": RULE,
        "table": "(2G_h-1)(2G_w-1)+3 rows x heads",
        "timm_function": "timm.layers.resize_rel_pos_bias_table",
    }


# -- transformers' BEiT --------------------------------------------------------------------------
def hf_beit_traceable(model: Any) -> None:
    """Make each ``BeitRelativePositionBias`` of a transformers BEiT (in place) build its bias for a
    symbolic grid, by transformers' own rule.

    transformers' ``forward`` resizes the offset table bilinearly to the new grid (the same
    arithmetic below, including its width/height reshape order), but builds the index through an
    ``lru_cache``'d function of Python ints, which the exporter specialises to the traced size: the
    graph then fails at every other size. The index here is :func:`relative_position_index` (the
    same entries as ``generate_relative_position_index``, built from ``arange``). The final
    bilinear resize transformers applies with ``interpolate_pos_encoding`` maps the bias to its own
    size (L x L to L x L, align_corners=False): the identity, so it is left out.
    """
    import torch.nn.functional as F

    def forward(self: Any, window_size: Any, interpolate_pos_encoding: bool = False, dim_size: Any = None) -> torch.Tensor:
        gh, gw = window_size
        old_h, old_w = 2 * self.window_size[0] - 1, 2 * self.window_size[1] - 1
        table = self.relative_position_bias_table
        grid_rows = old_h * old_w
        sub = table[:grid_rows].reshape(1, old_w, old_h, -1).permute(0, 3, 1, 2)
        new = F.interpolate(sub, size=(2 * gh - 1, 2 * gw - 1), mode="bilinear")
        new = new.permute(0, 2, 3, 1).reshape((2 * gh - 1) * (2 * gw - 1), -1)
        full = torch.cat([new, table[grid_rows:]])
        index = relative_position_index(gh, gw, table.device)
        length = gh * gw + 1
        bias = full[index.reshape(-1)].reshape(length, length, -1)
        return bias.permute(2, 0, 1).contiguous().unsqueeze(0)

    for module in model.modules():
        if type(module).__name__ == "BeitRelativePositionBias":
            module.forward = types.MethodType(forward, module)  # this instance only
