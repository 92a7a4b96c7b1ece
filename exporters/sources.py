"""Model sources: turn `builtin:digits`, `timm:<name>`, `hf:<dir>` or `ref:<checkpoint>` into one
PyTorch classifier plus everything a deployment must carry with it (§39.6: weights, architecture,
image processor and label map are released together).

Every loader returns a LoadedModel whose ``model`` maps float NCHW (already normalised) to logits,
whose ``spec`` describes the architecture, and whose ``preprocessing`` comes from the model's own
config (timm ``pretrained_cfg``, the HF image processor, our manifest): never hard-coded numbers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from vitdeploy.errors import ConfigError, UserError
from vitdeploy.records import WeightsIdentity
from vitdeploy.spec import ViTSpec

# LoadedModel and the checkpoint helpers live in loaded.py (the per-library loaders import them from
# there); they are re-exported here, where the rest of vitdeploy has always found them.
from .adapters import named_adapter
from .loaded import (RANDOM_INIT_SEED, LoadedModel, apply_state_dict, file_weights, load_state_dict,  # noqa: F401
                     require_same_weights, set_projection_head, state_sha256)

SOURCE_KINDS = ("builtin", "timm", "hf", "ref")


def parse_source(text: str | None) -> tuple[str, str]:
    """'timm:vit_tiny_patch16_224' -> ('timm', 'vit_tiny_patch16_224'); None -> builtin digits."""
    if not text:
        return "builtin", "digits"
    if ":" not in text:
        raise UserError(f"source {text!r} has no kind; use builtin:digits, timm:<model>, hf:<dir> or ref:<checkpoint>")
    kind, name = text.split(":", 1)
    if kind not in SOURCE_KINDS:
        raise UserError(f"unknown source kind {kind!r} in {text!r}; use one of {', '.join(k + ':' for k in SOURCE_KINDS)}")
    if not name:
        raise UserError(f"source {text!r} names no model")
    return kind, name


def load_source(
    source: str | dict[str, Any] | None,
    checkpoint: str | Path | None = None,
    num_classes: int | None = None,
    labels: list[str] | None = None,
    model_kwargs: dict[str, Any] | None = None,
    random_init: bool = False,
    log: Callable[[str], None] = lambda _msg: None,
) -> LoadedModel:
    """Load a source given as text (CLI) or as a manifest's ``source`` record (re-loading a bundle).

    timm and Hugging Face sources load their published weights (exporters/timm_source.py,
    exporters/hf_sources.py); ``random_init`` (--random-init) is the only way to random weights.
    A record re-loads the same weights (the recorded revision, seed or checkpoint) or refuses in one
    line when their sha256 differs. ``model_kwargs`` are passed to timm.create_model (e.g.
    class_token=False, global_pool="avg", depth=6): the architecture a user fine-tuned, which the
    registered name alone may not give.
    """
    recorded = source if isinstance(source, dict) else None
    if recorded is not None:
        kind, name = recorded["kind"], recorded["name"]
        checkpoint = checkpoint or recorded.get("checkpoint")
        num_classes = num_classes or recorded.get("num_classes")
        model_kwargs = model_kwargs or recorded.get("model_kwargs")
        random_init = bool(recorded.get("random_init"))
        recorded_seed = WeightsIdentity.of_source(recorded).seed
        seed = int(recorded_seed if recorded_seed is not None else RANDOM_INIT_SEED)
    else:
        kind, name = parse_source(source)
        seed = RANDOM_INIT_SEED
        _check_weight_options(kind, checkpoint, random_init)
    if model_kwargs and kind != "timm":
        raise UserError("--model-arg applies to timm sources only")
    if kind == "builtin":
        loaded = _load_builtin(name)
    elif kind == "ref":
        loaded = _load_reference(Path(name))
    elif kind == "timm":
        from .timm_source import load_timm

        loaded = load_timm(name, checkpoint, num_classes, model_kwargs or {}, random_init, seed, recorded, log)
    else:
        from .hf_sources import load_hf

        loaded = load_hf(name, random_init, seed, recorded, log)
    if recorded is not None:
        require_same_weights(loaded, recorded)
        if recorded.get("head") == "projection" and not recorded.get("labels_from"):
            set_projection_head(loaded)  # re-loading a bundle's source: the head it was exported with
    if labels is not None:
        if len(labels) != loaded.spec.num_classes:
            raise UserError(f"labels file has {len(labels)} labels but the model's head has {loaded.spec.num_classes} classes")
        loaded.labels = list(labels)
        loaded.source["labels_from"] = "labels file"
        # named outputs are classes: a projection head the user labelled is a classifier
        loaded.extra.pop("projection_head", None)
        loaded.source.pop("head", None)
    loaded.model.eval()
    return loaded


def _check_weight_options(kind: str, checkpoint: str | Path | None, random_init: bool) -> None:
    if random_init and kind in ("builtin", "ref"):
        raise UserError(f"--random-init applies to timm: and hf: sources; {kind}: sources carry their own trained weights")
    if random_init and checkpoint:
        raise UserError("--random-init and --checkpoint exclude each other: the checkpoint gives the weights")
    if checkpoint and kind != "timm":
        raise UserError(f"--checkpoint applies to timm sources; {kind}: sources load their own weights"
                        + (" (save a fine-tuned transformers model with save_pretrained and export hf:DIR)" if kind == "hf" else ""))


# -- builtin and reference ViTs -------------------------------------------------------------------
def _load_builtin(name: str) -> LoadedModel:
    from vitdeploy import builtin
    from vitdeploy.builtin import digits

    entry = builtin.get_builtin(name)
    config = entry.load_config()
    spec = named_adapter("builtin-digits").spec(config)
    pre = dict(config["preprocessing"])
    pre.setdefault("channel_order", "rgb")
    pre.setdefault("config_source", f"vitdeploy builtin:{name} config")
    weights = file_weights("builtin", digits.HERE / digits.WEIGHTS_FILE) if name == "digits" else None
    if weights:
        weights["file"] = digits.WEIGHTS_FILE  # inside the installed package: the name, not this machine's path
    source = {"kind": "builtin", "name": name, "checkpoint": None,
              "weights_sha256": weights["sha256"] if weights else None, "weights": weights}
    labels = list(config.get("labels") or [str(i) for i in range(spec.num_classes)])
    return LoadedModel(entry.load_model(), spec, pre, labels, source, adapter=named_adapter("builtin-digits"))


def _load_reference(weights_path: Path, config_path: Path | None = None) -> LoadedModel:
    """A vitdeploy reference-ViT checkpoint: `<name>.safetensors` beside `<name>.json` (spec, preprocessing, labels)."""
    from vitdeploy.model import VisionTransformer

    weights_path = Path(weights_path)
    config_path = Path(config_path) if config_path else weights_path.with_suffix(".json")
    if not weights_path.is_file():
        raise UserError(f"reference checkpoint {weights_path} does not exist")
    if not config_path.is_file():
        raise UserError(f"reference checkpoint {weights_path} has no config {config_path.name} beside it (spec, preprocessing, labels)")
    try:
        config = json.loads(config_path.read_text())
        spec = named_adapter("reference-vit").spec(config)
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise UserError(f"config {config_path} is not a vitdeploy reference-ViT config ({exc})") from None
    model = VisionTransformer(spec)
    apply_state_dict(model, load_state_dict(weights_path), str(weights_path))
    pre = dict(config["preprocessing"])
    pre.setdefault("channel_order", "rgb")
    labels = list(config.get("labels") or [str(i) for i in range(spec.num_classes)])
    weights = file_weights("checkpoint", weights_path)
    source = {"kind": "ref", "name": str(weights_path), "checkpoint": str(weights_path), "weights_sha256": weights["sha256"],
              "weights": weights}
    return LoadedModel(model, spec, pre, labels, source, adapter=named_adapter("reference-vit"))


def spec_from_timm(model: Any, name: str) -> ViTSpec:
    """The ViTSpec of a timm VisionTransformer (exporters/adapters/timm_vit.py)."""
    from .adapters.timm_vit import spec_from_timm as spec_of

    return spec_of(model, name)


def require_same_patch(spec: ViTSpec, patch_size: tuple[int, int] | None) -> None:
    if patch_size is not None and tuple(patch_size) != tuple(spec.patch_size):
        raise ConfigError(
            f"patch size {tuple(patch_size)} differs from the model's {spec.patch_size}: that changes W_E, "
            "and interpolating the position table cannot fix it"
        )
