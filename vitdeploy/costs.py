"""Analytic cost of a ViT (chapter §39.5): sequence sizes, multiply-adds, parameters, attention memory.

Counting convention, as in the chapter: one multiply-add (MAC) is one unit; biases, normalisation
and element-wise ops are ignored in the MAC terms. FLOPs = 2 x MACs and are labelled as such.

Per encoder layer, for batch B, sequence L, width d, MLP ratio rho:
    four projections (Q, K, V, output)  4 B L d^2
    QK^T and attention x V              2 B L^2 d
    MLP                                 2 B L rho d^2
The two kinds of term are equal at L = (2 + rho) d (the attention/MLP crossover).
Patch projection: B N F d = B C H W d. Classifier head: B d K.
A gated MLP (SwiGLU/GLU, EVA-02) has two input projections: 3 B L rho d^2.

Position terms are element-wise, so they stay out of the MACs and are reported beside them, per
layer: a relative-position bias (BEiT) adds one value to every attention score, B a L^2 adds;
rotary positions (EVA-02, RoPE ViTs) rotate q and k of the N patch tokens, x cos + rot(x) sin:
4 B N d multiplies and 2 B N d adds. The absolute table is one add per token per model (B L d).

Terms a family adds beyond these (an attention-pool head, a projection) come as data in the spec's
``extra_terms``, filled by the family's adapter: MACs per image as c0 + c1 L + c2 L^2, and parameters.
They are in the totals and, summed, in ``macs_extra``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .spec import ViTSpec


@dataclass(frozen=True)
class CostReport:
    height: int
    width: int
    batch: int
    grid: tuple[int, int]
    num_patches: int  # N
    seq_len: int  # L
    attn_scores_per_head: int  # L^2
    attn_score_elements: int  # B a L^2, one layer
    attn_score_bytes_fp32: int  # 4 B a L^2, one layer, if materialised
    attn_score_bytes_fp16: int
    macs_patch_embed: int  # B N F d
    macs_per_layer_linear: int  # 4 B L d^2 + 2 B L rho d^2
    macs_per_layer_attention: int  # 2 B L^2 d
    macs_per_layer: int
    macs_head: int  # B d K
    macs_total: int
    flops_total: int  # 2 x MACs
    attention_share: float  # attention-matmul MACs / total MACs
    crossover_seq_len: float  # L where attention MACs = projection + MLP MACs: (2 + rho) d
    params: int
    position_mults_per_layer: int = 0  # rotary: 4 B N d (not in the MACs: element-wise)
    position_adds_per_layer: int = 0  # relative bias: B a L^2; rotary: 2 B N d
    macs_extra: int = 0  # the spec's extra_terms (family-specific heads), in macs_total

    def to_dict(self) -> dict:
        data = asdict(self)
        data["grid"] = list(self.grid)
        return data


def param_count(spec: ViTSpec) -> int:
    """Parameters of the standard ViT the spec describes (weights and biases, LN scales/shifts)."""
    d, k = spec.embed_dim, spec.num_classes
    hidden = int(spec.mlp_ratio * d)
    patch = spec.patch_features * d + d  # F d + d, independent of the number of patches
    tokens = spec.num_prefix_tokens * d  # cls / dist / register vectors
    pos = (spec.pos_embed_prefix_rows + spec.num_patches()) * d if spec.abs_pos_embed else 0
    attn = (3 * d * d + 3 * d) + (d * d + d)
    mlp = (d * hidden + hidden) * (2 if spec.mlp_kind == "gated" else 1) + (hidden * d + d)
    if spec.rel_pos_bias:  # (2G_h - 1)(2G_w - 1) + 3 rows (CLS<->token, CLS<->CLS) x heads
        gh, gw = spec.native_grid
        rel = ((2 * gh - 1) * (2 * gw - 1) + 3) * spec.num_heads
        if spec.rel_pos_bias.get("scope") == "shared":
            pos += rel
        else:
            attn += rel
    norms = 2 * (2 * d)
    block = attn + mlp + norms
    head_in = d * (2 if spec.num_distill_tokens else 1)  # DeiT-distilled has a second (dist) head
    head = head_in * k + k * (2 if spec.num_distill_tokens else 1)
    return patch + tokens + pos + spec.depth * block + 2 * d + head + sum(int(t.get("params", 0)) for t in spec.extra_terms)


def crossover_seq_len(spec: ViTSpec) -> float:
    """L at which 2 B L^2 d equals 4 B L d^2 + 2 B L rho d^2, i.e. L = (2 + rho) d (gated MLP: (2 + 1.5 rho) d)."""
    return (2 + _mlp_mats(spec) / 2 * spec.mlp_ratio) * spec.embed_dim


def _mlp_mats(spec: ViTSpec) -> int:
    return 3 if spec.mlp_kind == "gated" else 2


def vit_costs(spec: ViTSpec, height: int | None = None, width: int | None = None, batch: int = 1) -> CostReport:
    height = height or spec.image_size[0]
    width = width or spec.image_size[1]
    gh, gw = spec.grid(height, width)
    n = gh * gw
    length = n + spec.num_prefix_tokens
    d, b, rho = spec.embed_dim, batch, spec.mlp_ratio
    linear = 4 * b * length * d * d + int(round(_mlp_mats(spec) * b * length * rho * d * d))
    attention = 2 * b * length * length * d
    per_layer = linear + attention
    patch = b * n * spec.patch_features * d
    head = b * d * spec.num_classes
    extra = b * sum(_term_macs(t, length) for t in spec.extra_terms)
    total = patch + spec.depth * per_layer + head + extra
    scores = b * spec.num_heads * length * length
    return CostReport(
        height=height,
        width=width,
        batch=b,
        grid=(gh, gw),
        num_patches=n,
        seq_len=length,
        attn_scores_per_head=length * length,
        attn_score_elements=scores,
        attn_score_bytes_fp32=4 * scores,
        attn_score_bytes_fp16=2 * scores,
        macs_patch_embed=patch,
        macs_per_layer_linear=linear,
        macs_per_layer_attention=attention,
        macs_per_layer=per_layer,
        macs_head=head,
        macs_total=total,
        flops_total=2 * total,
        attention_share=spec.depth * attention / total,
        crossover_seq_len=crossover_seq_len(spec),
        params=param_count(spec),
        position_mults_per_layer=4 * b * n * d if spec.rotary else 0,
        position_adds_per_layer=(scores if spec.rel_pos_bias else 0) + (2 * b * n * d if spec.rotary else 0),
        macs_extra=extra,
    )


def _term_macs(term: dict, length: int) -> int:
    """One image's MACs of an extra term: c0 + c1 L + c2 L^2."""
    return int(round(sum(float(c) * length ** power for power, c in enumerate(term.get("macs") or ()))))


def costs_table(spec: ViTSpec, resolutions: list[tuple[int, int]], batch: int = 1) -> list[CostReport]:
    return [vit_costs(spec, h, w, batch) for h, w in resolutions]


# -- memory (issue 15: size verification batches, refuse sizes that cannot fit) ------------------
@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of one forward pass at (height, width, batch), fp32 unless ``dtype_bytes`` says otherwise.

    Counted as the largest set of tensors alive at once in an unfused runtime (ONNX Runtime's plain
    graph, PyTorch's math attention): the input pixels and their normalised float copy, the
    position table resampled to the grid, and inside the worst layer either the attention scores
    and their softmax (2 B a L^2, materialised unless the attention is fused) or the MLP hidden
    activation (B L rho d), beside the residual stream, its normalised copy and Q, K, V (5 B L d).
    Weights are not included (they do not grow with the size). It is an estimate for planning and
    refusal, not a measurement: fused attention (flash/SDPA) needs less, allocator slack more.
    """

    height: int
    width: int
    batch: int
    input_bytes: int  # uint8 pixels + float32 normalised copy
    pos_table_bytes: int  # (prefix rows + N) d, resampled to this grid
    attention_bytes: int  # scores + softmax, one layer
    mlp_bytes: int  # hidden activation, one layer
    stream_bytes: int  # residual, normalised copy, Q, K, V
    total_bytes: int

    def to_dict(self) -> dict:
        return asdict(self)


def memory_estimate(spec: ViTSpec, height: int | None = None, width: int | None = None, batch: int = 1,
                    dtype_bytes: int = 4) -> MemoryEstimate:
    height = height or spec.image_size[0]
    width = width or spec.image_size[1]
    gh, gw = spec.grid(height, width)
    n = gh * gw
    length = n + spec.num_prefix_tokens
    d, b = spec.embed_dim, batch
    pixels = b * height * width * spec.in_chans
    input_bytes = pixels * (1 + 2 * dtype_bytes)  # uint8 in, float copy, normalised float
    pos_table = (spec.pos_embed_prefix_rows + n) * d * dtype_bytes
    attention = 2 * b * spec.num_heads * length * length * dtype_bytes
    mlp = int(b * length * spec.mlp_ratio * d) * dtype_bytes
    stream = 5 * b * length * d * dtype_bytes
    total = input_bytes + pos_table + max(attention, mlp) + stream
    return MemoryEstimate(height, width, b, input_bytes, pos_table, attention, mlp, stream, total)


def available_memory_bytes() -> int | None:
    """Memory the OS can give this process now: MemAvailable (Linux), else physical pages; None if unknown."""
    import os

    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def _gib(value: float) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1 (MiB to EiB)."""
    for power, unit in ((60, "EiB"), (50, "PiB"), (40, "TiB"), (30, "GiB")):
        if value >= 2**power:
            return f"{value / 2**power:.1f} {unit}"
    return f"{value / 2**20:.0f} MiB"


def check_fits_memory(spec: ViTSpec, height: int, width: int, batch: int = 1, what: str = "resolution",
                      available: int | None = None) -> MemoryEstimate:
    """Refuse (one UserError line, with the numbers) a size whose forward pass cannot fit in memory.

    ``available`` defaults to the memory free on this machine now. Sizes the patches don't tile
    are refused first by ``spec.grid``.
    """
    from .errors import UserError

    est = memory_estimate(spec, height, width, batch)
    free = available if available is not None else available_memory_bytes()
    if free is not None and est.total_bytes > free:
        biggest = "attention scores" if est.attention_bytes >= est.mlp_bytes else "MLP activations"
        native = f"{spec.image_size[0]}x{spec.image_size[1]}"
        fits = largest_square_that_fits(spec, free, batch)
        hint = f"at most about {fits}x{fits} fits" if fits else "not even the smallest grid fits"
        raise UserError(
            f"{what} {height}x{width} needs about {_gib(est.total_bytes)} for one forward pass of {batch} image(s) "
            f"({biggest} {_gib(max(est.attention_bytes, est.mlp_bytes))} per layer at L = {spec.seq_len(height, width):,} tokens), "
            f"but this machine has {_gib(free)} available; choose a smaller size ({hint}; the model's native size is {native})")
    return est


def largest_square_that_fits(spec: ViTSpec, budget_bytes: int, batch: int = 1) -> int | None:
    """The largest square size (a multiple of the patch) whose estimate stays within ``budget_bytes``."""
    step = max(spec.patch_size)
    lo, hi = 0, 1
    while memory_estimate(spec, hi * step, hi * step, batch).total_bytes <= budget_bytes:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # invariant: lo fits (or is 0), hi does not
        mid = (lo + hi) // 2
        if memory_estimate(spec, mid * step, mid * step, batch).total_bytes <= budget_bytes:
            lo = mid
        else:
            hi = mid
    return lo * step or None


# -- token merging (issue 40; exporters/token_merge.py) -------------------------------------------
# Bolya et al., "Token Merging: Your ViT But Faster", ICLR 2023 (https://arxiv.org/abs/2210.09461).
# Block i attends over L_i tokens and merges r_i of them after its attention, so its MLP and every
# later block see L_i - r_i. The merge itself costs, per block: the cosine similarity of the
# ceil(n/2) x floor(n/2) patch-key pairs (n patch tokens, key width d), and the one-hot matrix
# product that adds the r merged tokens and their sizes into their partners (r x floor(n/2) x (d+1)).
def parse_merge_schedule(text: str | int | list[int] | tuple[int, ...] | None, depth: int) -> tuple[int, ...]:
    """'8' -> (8,) * depth; '8,8,4,...' (one per block) -> that tuple; None or '0' -> all zeros."""
    from .errors import UsageError

    if text is None:
        return (0,) * depth
    if isinstance(text, int):
        items = [text]
    elif isinstance(text, str):
        try:
            items = [int(t) for t in text.split(",") if t.strip()]
        except ValueError:
            raise UsageError(f"--merge-tokens takes r (tokens merged per block) or one r per block, comma-separated; "
                             f"got {text!r}") from None
    else:
        items = [int(t) for t in text]
    if not items or any(r < 0 for r in items):
        raise UsageError(f"--merge-tokens takes non-negative token counts, got {text!r}")
    if len(items) == 1:
        return (items[0],) * depth
    if len(items) != depth:
        raise UsageError(f"--merge-tokens gives {len(items)} values but the model has {depth} blocks: give one r for "
                         f"every block, or a single r for all")
    return tuple(items)


def merged_patch_counts(spec: ViTSpec, schedule: tuple[int, ...], height: int | None = None, width: int | None = None) -> list[int]:
    """Patch tokens entering each block (and, last, leaving the encoder); refuses a schedule that would
    merge more than half of a block's patch tokens (the A set holds at most that many)."""
    from .errors import UserError

    gh, gw = spec.grid(height or spec.image_size[0], width or spec.image_size[1])
    counts = [gh * gw]
    for index, r in enumerate(schedule):
        n = counts[-1]
        if r > n // 2:
            raise UserError(f"--merge-tokens: block {index} has {n} patch tokens and can merge at most {n // 2} "
                            f"(half of them), not r={r}; choose a smaller r or a decreasing schedule")
        counts.append(n - r)
    return counts


@dataclass(frozen=True)
class MergeCosts:
    schedule: tuple[int, ...]
    tokens_per_block: tuple[int, ...]  # L entering each block (prefix tokens included); the last: L out
    macs_merge: int  # the merge itself, all blocks: similarity + one-hot sum
    macs_total: int  # the merged model, merge included
    macs_unmerged: int
    macs_saved: int
    predicted_speedup: float  # unmerged MACs / merged MACs

    def to_dict(self) -> dict:
        data = asdict(self)
        data["schedule"], data["tokens_per_block"] = list(self.schedule), list(self.tokens_per_block)
        return data


def merge_costs(spec: ViTSpec, schedule: tuple[int, ...], height: int | None = None, width: int | None = None,
                batch: int = 1) -> MergeCosts:
    """The MACs of the merged model, per the chapter's convention (see the module doc) plus the merge's terms."""
    base = vit_costs(spec, height, width, batch)
    counts = merged_patch_counts(spec, tuple(schedule), height, width)
    prefix, d, b, rho = spec.num_prefix_tokens, spec.embed_dim, batch, spec.mlp_ratio
    mlp_mats = _mlp_mats(spec)
    total, merge = base.macs_patch_embed + base.macs_head, 0
    for n, r in zip(counts, schedule):
        length, after = n + prefix, n + prefix - r
        attention_part = 4 * b * length * d * d + 2 * b * length * length * d
        mlp_part = int(round(mlp_mats * b * after * rho * d * d))
        if r:
            na, nb = (n + 1) // 2, n // 2
            merge += b * na * nb * d + b * r * nb * (d + 1)
        total += attention_part + mlp_part
    total += merge
    return MergeCosts(tuple(schedule), tuple(c + prefix for c in counts), merge, total, base.macs_total,
                      base.macs_total - total, base.macs_total / total)
