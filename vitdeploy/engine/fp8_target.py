"""Where an FP8 graph runs and whether its attention fuses in FP8: the target rules build-engine plans with.

Whether TensorRT runs a precision at all is the registry's (``vitdeploy.precisions``: TensorRT 10.0+,
compute capability 8.9+, no DLA, via ``Precision.why_not_on``). What is FP8-specific is the
attention: the graph carries Q/DQ on Q, K, V and the softmax output (``calibrate --fp8-attention
fp8``) so that TensorRT's fused FP8 multi-head attention can engage. NVIDIA documents that fusion
for Hopper (compute capability 9.0) and, from TensorRT 10.6, for Ada (8.9; sequence length <= 3072,
head size <= 64: TensorRT 10.6.0 release notes, "FP8 Multi-Head Attention (MHA) on Ada GPUs",
https://docs.nvidia.com/deeplearning/tensorrt/latest/getting-started/release-notes-10/10.6.0.html),
with Blackwell MHA improvements in 10.13 (https://docs.nvidia.com/deeplearning/tensorrt/10.13.0/
getting-started/release-notes.html). Blackwell and Thor (above 9.0) are taken to fuse as Hopper
does: unconfirmed by a stored source, and said so in the plan. Where it would not fuse, the attention
matmuls of an fp8-attention graph run unfused; the plan says to calibrate with ``--fp8-attention
float`` (attention in fp16) there. Nothing here ran on a GPU.
"""

from __future__ import annotations

from typing import Optional, Tuple

Version = Tuple[int, int]
ADA: Version = (8, 9)
HOPPER: Version = (9, 0)
ADA_FP8_MHA_FROM: Version = (10, 6)
ADA_MAX_SEQUENCE = 3072
ADA_MAX_HEAD_DIM = 64


def parse_cc(text: Optional[str]) -> Optional[Version]:
    """'8.7' -> (8, 7); None or unreadable (a '?' marked row) -> None."""
    try:
        major, minor = str(text).rstrip("?").split(".")[:2]
        return int(major), int(minor)
    except (ValueError, AttributeError):
        return None


def attention_fuses(trt: Version, cc: Optional[Version], seq_len: Optional[int] = None, head_dim: Optional[int] = None) -> Tuple[Optional[bool], str]:
    """(fuses, why): True/False when the rule decides, None when the GPU is not known at plan time."""
    if cc is None:
        return None, "FP8 attention fuses on Hopper and later, and on Ada from TensorRT 10.6 (the GPU decides at build time)"
    if tuple(cc) >= HOPPER:
        note = "" if tuple(cc) == HOPPER else " (above Hopper: taken to fuse as Hopper does, unconfirmed)"
        return True, f"SM {cc[0]}.{cc[1]} fuses FP8 multi-head attention{note}"
    if tuple(cc) == ADA:
        if tuple(trt) < ADA_FP8_MHA_FROM:
            return False, f"Ada fuses FP8 attention from TensorRT {ADA_FP8_MHA_FROM[0]}.{ADA_FP8_MHA_FROM[1]}"
        if (seq_len or 0) > ADA_MAX_SEQUENCE or (head_dim or 0) > ADA_MAX_HEAD_DIM:
            return False, f"Ada's FP8 attention takes sequences <= {ADA_MAX_SEQUENCE} and head size <= {ADA_MAX_HEAD_DIM}"
        return True, "Ada fuses FP8 multi-head attention (TensorRT 10.6+)"
    return False, f"SM {cc[0]}.{cc[1]} has no FP8 attention"


def attention_note(placement: Optional[str], trt: Version, cc: Optional[Version], seq_len: Optional[int] = None,
                   head_dim: Optional[int] = None) -> str:
    """The plan's line about the graph's attention placement on this target."""
    fuses, why = attention_fuses(trt, cc, seq_len, head_dim)
    if placement == "float":
        extra = "; this target would fuse FP8 attention: calibrate with --fp8-attention fp8 for it" if fuses else ""
        return f"fp8 graph: attention matmuls in fp16 (no Q/DQ on Q, K, V, softmax){extra}"
    if fuses is False:
        return (f"fp8 graph: Q/DQ on Q, K, V and softmax, but {why}: attention will not run as fused FP8 here; "
                "calibrate with --fp8-attention float to keep it in fp16")
    return f"fp8 graph: Q/DQ on Q, K, V and softmax for fused FP8 attention; {why}"
