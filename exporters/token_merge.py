"""Token merging inside the model (issue 40): a ViT that does less work, with static shapes.

Written from the paper, Bolya et al., "Token Merging: Your ViT But Faster", ICLR 2023
(https://arxiv.org/abs/2210.09461, §3 "Token Merging"); no code of the authors' repository is used.

In each block, after attention and before the MLP, the patch tokens (never the prefix tokens: CLS,
distillation, registers) are split alternately into A (patch 0, 2, 4, ...) and B (1, 3, 5, ...).
Every A token finds its most similar B token by the cosine similarity of the attention keys averaged
over heads; the r A tokens with the highest similarity are merged into their B partner by a
size-weighted average, the others stay. A token's size is how many patches it stands for; the
attention is proportional (log size added to each key's logits) and a GAP read-out weighs tokens by
their size, so a merged token counts as the patches it replaced. The CLS read-out is unchanged.

Every shape is static (r is a constant per block), and the graph uses ops every target parses: the
similarity is a MatMul, the best partner a ReduceMax/ArgMax, the ranking a TopK with constant k, the
kept and merged tokens GatherElements, and the merge a one-hot MatMul (Equal + Where + MatMul) rather
than a ScatterElements with reduction, which TensorRT 8.5 does not parse.

Sequence order after a merge: [prefix, A tokens kept (most similar first), B tokens].
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from vitdeploy.costs import merge_costs, merged_patch_counts, parse_merge_schedule
from vitdeploy.errors import UserError

from .sources import LoadedModel

METHOD = ("ToMe (Bolya et al., ICLR 2023, arXiv:2210.09461): bipartite matching of alternate patch tokens by "
          "key cosine similarity, size-weighted merge after attention, proportional attention, size-weighted GAP")


# -- the merge ------------------------------------------------------------------------------------
def _gather_rows(tokens: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """tokens [B, N, C], index [B, K] -> [B, K, C] (GatherElements)."""
    return tokens.gather(1, index.unsqueeze(-1).expand(-1, -1, tokens.shape[-1]))


def merge_tokens(x: torch.Tensor, size: torch.Tensor, keys: torch.Tensor, r: int, prefix: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge r patch tokens of x [B, L, d] (sizes [B, L, 1], head-averaged keys [B, L, k]) -> L - r."""
    keys = keys / keys.norm(dim=-1, keepdim=True)
    scores = keys[:, prefix::2] @ keys[:, prefix + 1::2].transpose(-1, -2)  # [B, |A|, |B|]
    best, partner = scores.max(dim=-1)
    count_a, count_b = scores.shape[-2], scores.shape[-1]
    order = best.topk(count_a, dim=-1).indices  # A tokens, most similar first (TopK with constant k)
    merged, kept = order[:, :r], order[:, r:]
    size_a, size_b = size[:, prefix::2], size[:, prefix + 1::2]
    weighted_a = _gather_rows(x[:, prefix::2] * size_a, merged)
    merged_size = _gather_rows(size_a, merged)
    # one-hot [B, |B|, r]: which B token each merged A token joins; its product sums them in
    # (Where on two constants, not a Cast to float: the fp16 pass then makes the one-hot fp16 with x)
    into = torch.where(_gather_rows(partner.unsqueeze(-1), merged).transpose(1, 2)
                       == torch.arange(count_b, device=x.device).view(1, count_b, 1), x.new_ones(()), x.new_zeros(()))
    sum_b = x[:, prefix + 1::2] * size_b + into @ weighted_a
    new_size_b = size_b + into @ merged_size
    x = torch.cat([x[:, :prefix], _gather_rows(x[:, prefix::2], kept), sum_b / new_size_b], dim=1)
    size = torch.cat([size[:, :prefix], _gather_rows(size_a, kept), new_size_b], dim=1)
    return x, size


def _attention(attn: nn.Module, x: torch.Tensor, size: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's own attention with proportional logits; returns (output, keys averaged over heads)."""
    b, n, _ = x.shape
    qkv = attn.qkv(x).reshape(b, n, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # [B, heads, L, d_h]
    q, k = getattr(attn, "q_norm", nn.Identity())(q), getattr(attn, "k_norm", nn.Identity())(k)
    scores = (q * attn.scale) @ k.transpose(-2, -1)
    if size is not None:
        scores = scores + size.log().view(b, 1, 1, n)  # proportional attention: a key counts size times
    out = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, n, -1)
    out = getattr(attn, "norm", nn.Identity())(out)
    return attn.proj(out), k.mean(dim=1)


class MergeBlock(nn.Module):
    """One encoder block (timm's or the reference ViT's) that merges r tokens after its attention."""

    def __init__(self, block: nn.Module, r: int, prefix: int):
        super().__init__()
        self.block, self.r, self.prefix = block, int(r), int(prefix)

    def forward(self, x: torch.Tensor, size: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        # size None: no token merged yet (every size 1): a block that merges nothing is the model's own
        if size is None and self.r == 0:
            return self.block(x), None
        blk = self.block
        out, keys = _attention(blk.attn, blk.norm1(x), size)
        x = x + getattr(blk, "ls1", nn.Identity())(out)
        if self.r:
            size = size if size is not None else x.new_ones(x.shape[0], x.shape[1], 1)
            x, size = merge_tokens(x, size, keys, self.r, self.prefix)
        return x + getattr(blk, "ls2", nn.Identity())(blk.mlp(blk.norm2(x))), size


class MergedViT(nn.Module):
    """A timm ViT/DeiT (distilled too) or the reference ViT whose blocks merge tokens by ``schedule``.

    Module names ``blocks.{i}``, ``norm`` and ``head`` are the model's, so `check` localises a
    divergence as for the unmerged model; ``vit`` holds the rest (patch embedding, tokens, table).
    """

    def __init__(self, model: nn.Module, schedule: tuple[int, ...], prefix: int, timm: bool):
        super().__init__()
        self.blocks = nn.ModuleList(MergeBlock(b, r, prefix) for b, r in zip(model.blocks, schedule))
        self.norm, self.head = model.norm, model.head
        self.vit = model
        self.schedule, self.prefix, self.timm = tuple(schedule), prefix, timm

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        vit = self.vit
        if self.timm:
            return vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(x))))
        vit._check_input(x)
        tokens, grid = vit.patch_embed(x)
        pos = vit.pos_embed_for_grid(grid)
        prefix = vit._prefix_tokens(tokens.shape[0])
        if vit.spec.pos_embed_prefix_rows:
            return torch.cat(prefix + [tokens], dim=1) + pos
        return torch.cat(prefix + [tokens + pos], dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, size = self.embed(x), None
        for block in self.blocks:
            x, size = block(x, size)
        x = self.norm(x)
        vit = self.vit
        if size is None or not self._gap():  # CLS (and DIST) read-out: unchanged by merging
            return vit.forward_head(x)
        first = 0 if getattr(vit, "pool_include_prefix", False) else self.prefix
        h = (x[:, first:] * size[:, first:]).sum(dim=1) / size[:, first:].sum(dim=1)  # size-weighted GAP
        h = vit.fc_norm(h)
        if self.timm:
            return vit.head(vit.head_drop(h))
        if vit.head_dist is not None:
            return (vit.head(h) + vit.head_dist(x[:, 1])) / 2
        return vit.head(h)

    def _gap(self) -> bool:
        if self.timm:  # timm's distilled DeiT reads rows 0 and 1 whatever its global_pool says
            return self.vit.global_pool == "avg" and getattr(self.vit, "dist_token", None) is None
        return self.vit.spec.global_pool == "avg"


# -- wrapping a loaded model ----------------------------------------------------------------------
def _refuse_unsupported(loaded: LoadedModel) -> bool:
    """True for a timm ViT; False for the reference ViT; else one line why merging does not apply."""
    what = f"{loaded.source.get('kind')}:{loaded.source.get('name')}"
    blocks = loaded.adapter.token_merge_blocks
    if blocks == "reference":
        return False
    if blocks != "timm":
        raise UserError(f"--merge-tokens applies to timm ViT/DeiT and the reference ViT; {what} is a {loaded.adapter.name} model "
                        "(relative-position or rotary attention, or a transformers model): export it without --merge-tokens")
    from timm.models.vision_transformer import Attention, Block

    model = loaded.model
    if getattr(model, "attn_pool", None) is not None:
        raise UserError(f"--merge-tokens: {what} reads out by attention pooling (global_pool='map'); merging supports CLS and GAP read-outs")
    if getattr(model, "dynamic_img_size", False):
        raise UserError(f"--merge-tokens: {what} takes dynamic image sizes; the merge schedule needs one static token count")
    for index, block in enumerate(model.blocks):
        if type(block) is not Block or type(block.attn) is not Attention or getattr(block.attn, "gate", None) is not None:
            raise UserError(f"--merge-tokens: block {index} of {what} is a {type(block).__name__} with {type(block.attn).__name__}; "
                            "merging wraps timm's pre-norm Block with plain Attention only")
    return True


def with_token_merge(loaded: LoadedModel, schedule: tuple[int, ...], height: int, width: int) -> LoadedModel:
    """``loaded`` whose model merges tokens by ``schedule`` at height x width (validated; an all-zero
    schedule wraps too, and is then the model's own forward exactly)."""
    spec = loaded.spec
    if len(schedule) != spec.depth:
        raise UserError(f"--merge-tokens: the schedule has {len(schedule)} values for {spec.depth} blocks")
    counts = merged_patch_counts(spec, tuple(schedule), height, width)  # refuses a schedule that leaves too few
    timm = _refuse_unsupported(loaded)
    model = MergedViT(loaded.model, tuple(schedule), spec.num_prefix_tokens, timm).eval()
    record = merge_record(spec, tuple(schedule), height, width, counts)
    return dataclasses.replace(loaded, model=model, extra={**loaded.extra, "token_merge": record})


def merge_record(spec: Any, schedule: tuple[int, ...], height: int, width: int, counts: list[int] | None = None) -> dict[str, Any]:
    """The manifest's ``token_merge`` entry: schedule, tokens per block, MACs saved (vitdeploy.costs)."""
    costs = merge_costs(spec, schedule, height, width)
    return {
        "schedule": list(schedule),
        "tokens_per_block": list(costs.tokens_per_block),
        "prefix_tokens": spec.num_prefix_tokens,
        "at": [height, width],
        "macs": costs.macs_total,
        "macs_unmerged": costs.macs_unmerged,
        "macs_merge_itself": costs.macs_merge,
        "predicted_speedup": round(costs.predicted_speedup, 4),
        "method": METHOD,
    }


def schedule_of(text: Any, depth: int) -> tuple[int, ...] | None:
    """--merge-tokens text -> a per-block schedule, or None when nothing merges."""
    schedule = parse_merge_schedule(text, depth)
    return schedule if any(schedule) else None


def merged_for_bundle(manifest: dict[str, Any], loaded: LoadedModel, height: int, width: int) -> LoadedModel:
    """The bundle's reference: merged as its graph is, when its manifest records a schedule."""
    record = manifest.get("token_merge")
    if not record:
        return loaded
    return with_token_merge(loaded, tuple(record["schedule"]), height, width)


# -- export options -------------------------------------------------------------------------------
def refuse_merge_options(opts: Any) -> None:
    """One line for what a merged graph cannot be: every token count in it is static."""
    from vitdeploy.errors import UsageError

    if opts.variable_size:
        raise UsageError("--merge-tokens and --variable-size exclude each other: a canvas with padded patches has no static "
                         "token count to merge from; export a fixed --resolution")
    if opts.dynamic_resolution:
        raise UsageError("--merge-tokens needs one static resolution (r is a constant per block, the token counts follow "
                         "the grid); drop --dynamic-resolution, or export one bundle per --resolution")
    if opts.outputs and set(opts.outputs) - {"logits", "probs"}:
        raise UsageError("--merge-tokens exports logits,probs only: merged tokens no longer form the patch grid "
                         f"(and the pooled embedding is not verified merged); drop --outputs {','.join(opts.outputs)}")


def merge_variant(variant: LoadedModel, text: Any, resolution: dict[str, Any], log: Any) -> LoadedModel:
    """The export's model with the merge of ``--merge-tokens`` applied (an all-zero schedule: unchanged)."""
    from .features import has_head

    schedule = parse_merge_schedule(text, variant.spec.depth)
    if not has_head(variant):
        raise UserError("--merge-tokens exports logits,probs, and this model has no classification head; "
                        "export it without --merge-tokens")
    if not any(schedule):
        log("--merge-tokens 0: nothing merged, the graph is the unmerged model's")
        return variant
    merged = with_token_merge(variant, schedule, resolution["height"], resolution["width"])
    record = merged.extra["token_merge"]
    log(f"token merging: r = {','.join(map(str, schedule))}; tokens per block {record['tokens_per_block'][0]} -> "
        f"{record['tokens_per_block'][-1]}; {record['macs'] / 1e9:.2f} GMACs of {record['macs_unmerged'] / 1e9:.2f} "
        f"(cost model: {record['predicted_speedup']:.2f}x fewer, the merge itself included)")
    return merged

