"""The family adapter: everything vitdeploy needs to know about one model family, in one class.

A *family* is a way a library builds a ViT (timm's ``VisionTransformer``, ``Beit``, ``Eva``;
transformers' ViT, DeiT, BEiT, DINOv2 classes; vitdeploy's reference ViT). What differs between
families, and nothing else, is asked of its adapter:

- the spec: ``spec(model, name)`` (timm, reference) or ``spec_from_config(...)`` (transformers), the
  ViTSpec every later stage reads; the cost model's family terms travel in the spec's fields
  (``rel_pos_bias``, ``rotary``, ``mlp_kind``, ``extra_terms``), so the core never imports an adapter;
- positions: ``regrid_static`` (a copy at a fixed size, tables resampled offline) and ``make_dynamic``
  (a copy that adapts its positions to each input in-graph), or ``dynamic_refusal`` saying why not;
- read-outs: ``readout`` ('cls', 'gap', 'cls+dist', 'cls|gap'), ``final_norms``, ``features`` (the
  tokens, the pooled embedding and the logits as the library computes them) and ``reference_calls``
  (the library call each output equals, written into the manifest);
- modules: ``module_names`` (blocks, final norm, head: what `check` localises and what recipes name;
  the quantization roles themselves are found from the graph's structure, calibration/exclusions.py);
- variable size: ``variable_parts`` (the masked forward's steps), or ``variable_size_refusal``;
- token merging: ``token_merge_blocks`` (whose blocks the merge wraps, or None: refused).

Adapters register themselves with :func:`register_family` (as timm's ``register_model`` does); the
loaders find them with :func:`timm_adapter` and :func:`hf_adapter`, never by testing names.
"""

from __future__ import annotations

from typing import Any, ClassVar

from vitdeploy.errors import UserError

# name -> adapter class, in registration order (the timm lookup asks each in this order)
FAMILY_ADAPTERS: dict[str, type["FamilyAdapter"]] = {}


class FamilyAdapter:
    """The base of every family adapter; see the module doc for what each answers."""

    name: ClassVar[str] = ""  # registry key (also in error messages)
    library: ClassVar[str] = ""  # "timm" | "transformers" | "vitdeploy"
    # None: --dynamic-resolution works; else the one-line reason it is refused
    dynamic_refusal: ClassVar[str | None] = None
    # None: --variable-size works; else the one-line reason it is refused
    variable_size_refusal: ClassVar[str | None] = "its encoder has no key-mask path here"
    # whose blocks `export --merge-tokens` wraps (exporters/token_merge.py): "timm" (timm's pre-norm Block) or
    # "reference" (vitdeploy.model); None: merging is refused for this family
    token_merge_blocks: ClassVar[str | None] = None

    # -- positions ---------------------------------------------------------------------------------
    def regrid_static(self, loaded: Any, height: int, width: int, interp: Any) -> Any:
        """A copy of ``loaded.model`` at a fixed height x width (position terms resampled offline)."""
        raise NotImplementedError

    def make_dynamic(self, loaded: Any, interp: Any) -> tuple[Any, Any]:
        """(a copy of ``loaded.model`` that takes any patch-multiple H/W, the spec its graph declares)."""
        if self.dynamic_refusal:
            raise UserError(f"--dynamic-resolution: {self.name} models {self.dynamic_refusal}; export per size (--resolution)")
        raise NotImplementedError

    def position_convention(self, requested: Any) -> Any:
        """The table-resampling convention (PosEmbedInterpolation) this family's export uses and records,
        given the one asked for: that one, unless the family's own rule fixes it (or refuses it)."""
        return requested

    # -- read-outs ---------------------------------------------------------------------------------
    def readout(self, loaded: Any) -> str:
        """'cls', 'gap', 'cls+dist' (mean of the CLS and DIST rows) or 'cls|gap' (both, concatenated)."""
        spec = loaded.spec
        if spec.global_pool == "avg":
            return "gap"
        return "cls+dist" if spec.num_distill_tokens else "cls"

    def final_norms(self, loaded: Any) -> tuple[str | None, str | None]:
        """(norm on the tokens / patch grid, norm on the pooled embedding): module names or None.

        The default reads timm's layout, which the reference ViT shares: ``norm`` on the tokens (an
        Identity in GAP models with fc_norm), ``fc_norm`` after pooling where it is not an Identity."""
        import torch

        model = loaded.model
        token_norm = None if isinstance(getattr(model, "norm", None), torch.nn.Identity) else "norm"
        fc_norm = not isinstance(getattr(model, "fc_norm", torch.nn.Identity()), torch.nn.Identity)
        return token_norm, ("fc_norm" if fc_norm else token_norm)

    def features(self, loaded: Any, model: Any, x: Any, need_logits: bool, need_embedding: bool) -> tuple[Any, Any, Any]:
        """(final tokens [B, L, d], pooled pre-head embedding or None, logits or None) of float NCHW ``x``."""
        raise NotImplementedError

    def reference_calls(self, loaded: Any) -> dict[str, str]:
        """The library call each output equals: {"logits", "embedding", "patch_grid"} -> text."""
        raise NotImplementedError

    # -- modules -----------------------------------------------------------------------------------
    def module_names(self, loaded: Any) -> list[str]:
        """PyTorch modules whose outputs localise a divergence: each block, the final norm, the head."""
        return [f"blocks.{i}" for i in range(loaded.spec.depth)] + ["norm", "head"]

    # -- variable size -----------------------------------------------------------------------------
    def variable_parts(self, loaded: Any) -> Any:
        """The masked forward's steps (patch_tokens, prefix_tokens, encode, head; table, prefix_rows)."""
        raise UserError(
            f"--variable-size supports the reference ViT and timm ViTs; {self.name} models: {self.variable_size_refusal}; "
            "export per size (--resolution) or with --dynamic-resolution"
        )


def register_family(cls: type[FamilyAdapter]) -> type[FamilyAdapter]:
    """Class decorator: add an adapter to the registry (one name, one class)."""
    if not cls.name or cls.name in FAMILY_ADAPTERS:
        raise ValueError(f"family adapter {cls.__name__} needs a name of its own (got {cls.name!r})")
    FAMILY_ADAPTERS[cls.name] = cls
    return cls


def adapters_of(library: str) -> list[type[FamilyAdapter]]:
    return [cls for cls in FAMILY_ADAPTERS.values() if cls.library == library]


def named_adapter(name: str) -> FamilyAdapter:
    return FAMILY_ADAPTERS[name]()
