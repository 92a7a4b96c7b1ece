"""Analytic cost of a ViT (chapter §39.5): sequence sizes, multiply-adds, parameters, attention memory.

Counting convention, as in the chapter: one multiply-add (MAC) is one unit; biases, normalisation
and element-wise ops are ignored in the MAC terms. FLOPs = 2 x MACs and are labelled as such.

Per encoder layer, for batch B, sequence L, width d, MLP ratio rho:
    four projections (Q, K, V, output)  4 B L d^2
    QK^T and attention x V              2 B L^2 d
    MLP                                 2 B L rho d^2
The two kinds of term are equal at L = (2 + rho) d (the attention/MLP crossover).
Patch projection: B N F d = B C H W d. Classifier head: B d K.
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
    pos = (spec.pos_embed_prefix_rows + spec.num_patches()) * d
    attn = (3 * d * d + 3 * d) + (d * d + d)
    mlp = (d * hidden + hidden) + (hidden * d + d)
    norms = 2 * (2 * d)
    block = attn + mlp + norms
    head_in = d * (2 if spec.num_distill_tokens else 1)  # DeiT-distilled has a second (dist) head
    head = head_in * k + k * (2 if spec.num_distill_tokens else 1)
    return patch + tokens + pos + spec.depth * block + 2 * d + head


def crossover_seq_len(spec: ViTSpec) -> float:
    """L at which 2 B L^2 d equals 4 B L d^2 + 2 B L rho d^2, i.e. L = (2 + rho) d."""
    return (2 + spec.mlp_ratio) * spec.embed_dim


def vit_costs(spec: ViTSpec, height: int | None = None, width: int | None = None, batch: int = 1) -> CostReport:
    height = height or spec.image_size[0]
    width = width or spec.image_size[1]
    gh, gw = spec.grid(height, width)
    n = gh * gw
    length = n + spec.num_prefix_tokens
    d, b, rho = spec.embed_dim, batch, spec.mlp_ratio
    linear = 4 * b * length * d * d + int(round(2 * b * length * rho * d * d))
    attention = 2 * b * length * length * d
    per_layer = linear + attention
    patch = b * n * spec.patch_features * d
    head = b * d * spec.num_classes
    total = patch + spec.depth * per_layer + head
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
    )


def costs_table(spec: ViTSpec, resolutions: list[tuple[int, int]], batch: int = 1) -> list[CostReport]:
    return [vit_costs(spec, h, w, batch) for h, w in resolutions]
