"""The ViT architecture as data: what every stage (export, cost model, checks, engines) needs to
know about a model, independent of where the model came from (builtin, timm, Hugging Face).

Symbols follow the ViT chapter (Table 39.1): patch P_h x P_w, grid G_h x G_w, N = G_h G_w patches,
F = C P_h P_w values per patch, width d, a heads, T blocks, MLP width rho d, L = N + prefix tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import ConfigError, UserError


# The read-outs a spec can declare. Which of them a model family implements is its adapter's answer
# (exporters/adapters/): an attention-pool head ("map", SigLIP) brings its cost in ``extra_terms``.
READOUTS = ("token", "avg", "map")
# field -> manifest key where they differ (the manifest keeps the names bundles were written with)
MANIFEST_KEYS = {"architecture": "family"}
FIELD_OF_KEY = {key: name for name, key in MANIFEST_KEYS.items()}


@dataclass(frozen=True)
class ViTSpec:
    image_size: tuple[int, int]  # native (H, W): the grid the position table was trained for
    patch_size: tuple[int, int]  # (P_h, P_w)
    embed_dim: int  # d
    depth: int  # T
    num_heads: int  # a
    num_classes: int  # K
    in_chans: int = 3  # C
    mlp_ratio: float = 4.0  # rho
    class_token: bool = True
    num_reg_tokens: int = 0  # register tokens (timm `reg_tokens`)
    num_distill_tokens: int = 0  # DeiT distillation token
    global_pool: str = "token"  # one of READOUTS: "token" (CLS), "avg" (mean over patch tokens, GAP), "map" (attention pool)
    pos_embed_prefix_rows: int = 1  # rows of the position table that belong to prefix tokens
    # the architecture's label, free-form: vit, deit-distilled, vit-reg, beit, eva02, vit-rope, hf-dinov2, ...
    # (the manifest's key for it is "family", as every bundle since format 1 has it: MANIFEST_KEYS)
    architecture: str = "vit"
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    # How position enters (issue 17). Any combination: an absolute table added to the tokens (ViT,
    # DeiT, EVA-02), a relative-position bias table added to the attention logits (BEiT), rotary
    # frequencies multiplied into q and k (EVA-02, RoPE ViTs). The dicts name the rule that adapts
    # each to another grid (see position_rules()); a manifest without these fields is a plain ViT.
    abs_pos_embed: bool = True
    rel_pos_bias: dict[str, Any] | None = field(default=None, compare=False)  # {"scope": "per-block"|"shared", "rule", ...}
    rotary: dict[str, Any] | None = field(default=None, compare=False)  # {"type", "grid_indexing", "ref_feat_shape", ...}
    mlp_kind: str = "mlp"  # "mlp" (fc1, activation, fc2) or "gated" (SwiGLU/GLU: two input projections)
    max_grid: tuple[int, int] | None = None  # largest (G_h, G_w) a dynamic graph was built for; None: any
    # Cost-model terms a family adds beyond the standard ViT (its adapter fills them; costs.py reads
    # them without knowing the family), e.g. an attention-pool head: each
    # {"name": str, "macs": [c0, c1, c2] (per image: c0 + c1 L + c2 L^2), "params": int}.
    # Written to the manifest only when there are some.
    extra_terms: tuple[dict[str, Any], ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "image_size", tuple(int(v) for v in self.image_size))
        object.__setattr__(self, "patch_size", tuple(int(v) for v in self.patch_size))
        if self.max_grid is not None:
            object.__setattr__(self, "max_grid", tuple(int(v) for v in self.max_grid))
        if self.mlp_kind not in ("mlp", "gated"):
            raise ConfigError(f"mlp_kind must be 'mlp' or 'gated', got {self.mlp_kind!r}")
        if self.embed_dim % self.num_heads:
            raise ConfigError(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        if self.global_pool not in READOUTS:
            raise ConfigError(f"global_pool must be one of {', '.join(repr(r) for r in READOUTS)}, got {self.global_pool!r}")
        if self.global_pool == "token" and not self.class_token:
            raise ConfigError("global_pool='token' needs a class token")
        self.grid(*self.image_size)  # the native size must itself be valid

    # -- derived sizes -------------------------------------------------------------------------
    @property
    def num_prefix_tokens(self) -> int:
        return int(self.class_token) + self.num_distill_tokens + self.num_reg_tokens

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def patch_features(self) -> int:
        """F = C * P_h * P_w: values in one flattened patch."""
        return self.in_chans * self.patch_size[0] * self.patch_size[1]

    @property
    def native_grid(self) -> tuple[int, int]:
        return self.grid(*self.image_size)

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """(G_h, G_w) for an input of height x width; refuses sizes the patches don't tile."""
        check_resolution(height, width, self.patch_size)
        grid = (height // self.patch_size[0], width // self.patch_size[1])
        if self.max_grid is not None and (grid[0] > self.max_grid[0] or grid[1] > self.max_grid[1]):
            top = (self.max_grid[0] * self.patch_size[0], self.max_grid[1] * self.patch_size[1])
            raise UserError(
                f"{height}x{width} gives a {grid[0]}x{grid[1]} patch grid, beyond the {self.max_grid[0]}x{self.max_grid[1]} "
                f"this graph's relative-position tables were built for (at most {top[0]}x{top[1]}); "
                "export that size statically (--resolution), which resamples the tables offline"
            )
        return grid

    def num_patches(self, height: int | None = None, width: int | None = None) -> int:
        gh, gw = self.grid(height or self.image_size[0], width or self.image_size[1])
        return gh * gw

    def seq_len(self, height: int | None = None, width: int | None = None) -> int:
        """L = N + prefix tokens."""
        return self.num_patches(height, width) + self.num_prefix_tokens

    # -- (de)serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = {MANIFEST_KEYS.get(k, k): v for k, v in asdict(self).items()}
        if not self.extra_terms:
            del data["extra_terms"]
        else:
            data["extra_terms"] = [dict(t) for t in self.extra_terms]
        data["image_size"] = list(self.image_size)
        data["patch_size"] = list(self.patch_size)
        data["num_prefix_tokens"] = self.num_prefix_tokens
        data["max_grid"] = list(self.max_grid) if self.max_grid is not None else None
        data["position_kinds"] = list(self.position_kinds)
        return data

    @property
    def position_kinds(self) -> tuple[str, ...]:
        """What carries position, in the order the forward pass applies it."""
        kinds = []
        if self.abs_pos_embed:
            kinds.append("absolute table")
        if self.rel_pos_bias:
            kinds.append("relative bias table")
        if self.rotary:
            kinds.append("rotary")
        return tuple(kinds)

    def position_rules(self, abs_rule: str | None = None) -> list[str]:
        """One phrase per position kind: what it is and the rule that adapts it to another grid.

        ``abs_rule`` describes the absolute-table interpolation (it is a per-bundle choice recorded
        in the manifest's resolution, not part of the architecture).
        """
        rules = []
        own = self.extra.get("position_rule")  # a family whose table follows its own rule names it (timm NaFlexVit)
        if own:
            rules.append(own)
        elif self.abs_pos_embed:
            rules.append(f"absolute table ({abs_rule or 'resampled per grid'})")
        if self.rel_pos_bias:
            rel = self.rel_pos_bias
            rules.append(f"relative bias table, {rel.get('scope', 'per-block')} ({rel.get('rule', 'resampled per grid')})")
        if self.rotary:
            rules.append(f"rotary ({self.rotary.get('rule', self.rotary.get('type', 'axial'))})")
        return rules or ["none"]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ViTSpec":
        known = {f for f in cls.__dataclass_fields__}
        fields = {FIELD_OF_KEY.get(k, k): v for k, v in data.items()}
        if "extra_terms" in fields:
            fields["extra_terms"] = tuple(dict(t) for t in fields["extra_terms"] or ())
        return cls(**{k: v for k, v in fields.items() if k in known})

    def with_image_size(self, height: int, width: int) -> "ViTSpec":
        data = self.to_dict()
        data["image_size"] = [height, width]
        return ViTSpec.from_dict(data)


def nearest_valid(size: int, patch: int) -> list[int]:
    """The multiples of ``patch`` on either side of ``size`` (one value when it already fits)."""
    lower = max(patch, (size // patch) * patch)
    upper = lower if lower >= size else lower + patch
    return sorted({lower, upper})


def check_resolution(height: int, width: int, patch_size: tuple[int, int]) -> None:
    """Refuse a size the patch grid does not tile exactly, naming the nearest valid sizes.

    A dynamic-H/W ONNX graph silently accepts such sizes (PyTorch refuses them), so every stage
    calls this before it feeds an image.
    """
    ph, pw = patch_size
    problems = []
    for name, size, patch in (("height", height, ph), ("width", width, pw)):
        if size <= 0:
            raise UserError(f"{name} must be positive, got {size}")
        if size % patch:
            lo_hi = " or ".join(str(v) for v in nearest_valid(size, patch))
            problems.append(f"{name} {size} is not a multiple of the patch size {patch} (nearest valid: {lo_hi})")
    if problems:
        raise UserError("; ".join(problems))


MAX_SIDE = 1 << 20  # past a million pixels on a side a number is a typo (larger real sizes meet the memory check)


def parse_resolution(text: str) -> tuple[int, int]:
    """'384' -> (384, 384); '224x320' -> (224, 320) (height x width). ASCII digits only, each side 1..2**20."""
    import re

    match = re.fullmatch(r"\s*(\d+)\s*(?:[x×]\s*(\d+)\s*)?", str(text), re.ASCII | re.IGNORECASE)
    if match is None:
        raise UserError(f"resolution {text!r} is not N or HxW (e.g. 384 or 224x320)")
    height = int(match.group(1))
    width = int(match.group(2)) if match.group(2) is not None else height
    if not (0 < height <= MAX_SIDE and 0 < width <= MAX_SIDE):
        raise UserError(f"resolution {text!r}: each side must be between 1 and {MAX_SIDE} pixels")
    return height, width
