"""The ViT architecture as data: what every stage (export, cost model, checks, engines) needs to
know about a model, independent of where the model came from (builtin, timm, Hugging Face).

Symbols follow the ViT chapter (Table 39.1): patch P_h x P_w, grid G_h x G_w, N = G_h G_w patches,
F = C P_h P_w values per patch, width d, a heads, T blocks, MLP width rho d, L = N + prefix tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import ConfigError, UserError


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
    global_pool: str = "token"  # "token" (CLS readout) or "avg" (mean over patch tokens, GAP)
    pos_embed_prefix_rows: int = 1  # rows of the position table that belong to prefix tokens
    family: str = "vit"  # free-form: vit, deit, deit-distilled, vit-reg, ...
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "image_size", tuple(int(v) for v in self.image_size))
        object.__setattr__(self, "patch_size", tuple(int(v) for v in self.patch_size))
        if self.embed_dim % self.num_heads:
            raise ConfigError(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        if self.global_pool not in ("token", "avg"):
            raise ConfigError(f"global_pool must be 'token' or 'avg', got {self.global_pool!r}")
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
        return height // self.patch_size[0], width // self.patch_size[1]

    def num_patches(self, height: int | None = None, width: int | None = None) -> int:
        gh, gw = self.grid(height or self.image_size[0], width or self.image_size[1])
        return gh * gw

    def seq_len(self, height: int | None = None, width: int | None = None) -> int:
        """L = N + prefix tokens."""
        return self.num_patches(height, width) + self.num_prefix_tokens

    # -- (de)serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["image_size"] = list(self.image_size)
        data["patch_size"] = list(self.patch_size)
        data["num_prefix_tokens"] = self.num_prefix_tokens
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ViTSpec":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

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


def parse_resolution(text: str) -> tuple[int, int]:
    """'384' -> (384, 384); '224x320' -> (224, 320) (height x width)."""
    raw = text.strip().lower()
    try:
        if "x" in raw:
            h, w = raw.split("x", 1)
            return int(h), int(w)
        return int(raw), int(raw)
    except ValueError:
        raise UserError(f"resolution {text!r} is not N or HxW (e.g. 384 or 224x320)") from None
