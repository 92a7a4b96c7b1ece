"""Model sources: turn `builtin:digits`, `timm:<name>`, `hf:<dir>` or `ref:<checkpoint>` into one
PyTorch classifier plus everything a deployment must carry with it (§39.6: weights, architecture,
image processor and label map are released together).

Every loader returns a LoadedModel whose ``model`` maps float NCHW (already normalised) to logits,
whose ``spec`` describes the architecture, and whose ``preprocessing`` comes from the model's own
config (timm ``pretrained_cfg``, the HF image processor, our manifest): never hard-coded numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitdeploy.errors import ConfigError, UserError
from vitdeploy.fileio import sha256_file
from vitdeploy.lazy import require
from vitdeploy.spec import ViTSpec

SOURCE_KINDS = ("builtin", "timm", "hf", "ref")


@dataclass
class LoadedModel:
    model: Any  # torch.nn.Module, eval mode: float NCHW (normalised) -> logits [N, K]
    spec: ViTSpec
    preprocessing: dict[str, Any]  # mean, std, scale, channel_order, host_resize, input_size
    labels: list[str]
    source: dict[str, Any]  # kind, name, checkpoint, weights_sha256, ...
    family: str = "reference"  # how to re-grid its positions: reference | timm | timm-beit | timm-eva | hf
    extra: dict[str, Any] = field(default_factory=dict)


def did_you_mean(name: str, known: list[str], count: int = 3) -> str:
    """"; did you mean vit_small_patch16_224?" for a typo: the closest names by difflib's ratio."""
    import difflib

    close = difflib.get_close_matches(name, known, n=count, cutoff=0.75)
    return f"; did you mean {', '.join(close)}?" if close else ""


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
) -> LoadedModel:
    """Load a source given as text (CLI) or as a manifest's ``source`` record (re-loading a bundle).

    ``model_kwargs`` are passed to timm.create_model (e.g. class_token=False, global_pool="avg",
    depth=6): the architecture a user fine-tuned, which the registered name alone may not give.
    """
    if isinstance(source, dict):
        kind, name = source["kind"], source["name"]
        checkpoint = checkpoint or source.get("checkpoint")
        num_classes = num_classes or source.get("num_classes")
        model_kwargs = model_kwargs or source.get("model_kwargs")
    else:
        kind, name = parse_source(source)
    if model_kwargs and kind != "timm":
        raise UserError("--model-arg applies to timm sources only")
    if kind == "builtin":
        loaded = _load_builtin(name)
    elif kind == "ref":
        loaded = _load_reference(Path(name))
    elif kind == "timm":
        loaded = _load_timm(name, checkpoint, num_classes, model_kwargs or {})
    else:
        loaded = _load_hf(Path(name))
    if isinstance(source, dict) and source.get("head") == "projection" and not source.get("labels_from"):
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


# -- checkpoints ---------------------------------------------------------------------------------
def load_state_dict(path: str | Path) -> dict[str, Any]:
    """A state dict from safetensors, or from .pt/.pth through torch.load(weights_only=True).

    Pickles that need code execution are refused: weights_only=True raises on them.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError) as exc:
            raise UserError(f"checkpoint {path} is not a readable safetensors file ({exc})") from None
    refuse_non_pytorch_checkpoint(path)
    torch = require("torch", "loading checkpoints")
    import warnings

    try:
        # The weights-only unpickler warns about pickle protocols it was not written for (a plain
        # pickle.dump checkpoint) before it refuses or loads; that line would precede our one-line
        # error, so its warnings are kept to this call.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError, RuntimeError, ... depending on what is inside
        raise UserError(
            f"checkpoint {path} cannot be loaded without executing code ({exc.__class__.__name__}); "
            "save its state_dict with safetensors or torch.save(model.state_dict())"
        ) from None
    # Training scripts wrap the weights: {"state_dict": ...}, {"model": ...}, {"model_ema": ...}
    for key in ("state_dict", "model", "model_ema", "module"):
        if isinstance(state, dict) and key in state and isinstance(state[key], dict):
            state = state[key]
            break
    if not isinstance(state, dict):
        raise UserError(f"checkpoint {path} holds a {type(state).__name__}, not a state dict")
    # DataParallel / torch.compile prefixes
    return {k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in state.items()}


# What a file starts with: torch.save writes a zip archive (or, before torch 1.6, a pickle stream).
ZIP_MAGIC = b"PK\x03\x04"
PICKLE_MAGIC = b"\x80"
KNOWN_OTHER_FORMATS = {
    ".npz": "a NumPy .npz archive (Google's JAX ViT weights are published this way); timm loads those itself: use the "
            "timm name with its tag (e.g. timm:vit_base_patch16_224.augreg_in21k), or convert the file to safetensors",
    ".npy": "a NumPy array, not a state dict; save the model's state_dict with safetensors",
    ".onnx": "an ONNX graph, not weights; vitdeploy exports from the PyTorch model (pass its safetensors or .pt state dict)",
    ".h5": "a Keras/HDF5 file; convert the weights to a PyTorch state dict saved with safetensors",
    ".msgpack": "a Flax checkpoint; load it with transformers' from_pretrained(..., from_flax=True) and save_pretrained() it",
}


def refuse_non_pytorch_checkpoint(path: Path) -> None:
    """One line naming the format of a file that is not a PyTorch checkpoint at all, instead of the unpickler's
    complaint (which would read as "needs code execution")."""
    if path.suffix.lower() in KNOWN_OTHER_FORMATS:
        raise UserError(f"checkpoint {path} is {KNOWN_OTHER_FORMATS[path.suffix.lower()]}")
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise UserError(f"cannot read checkpoint {path}: {exc.strerror}") from None
    if not (head.startswith(ZIP_MAGIC) or head.startswith(PICKLE_MAGIC)):
        raise UserError(f"checkpoint {path} is not a PyTorch checkpoint (neither torch.save's zip nor a pickle); give a "
                        ".safetensors file or a state dict saved with torch.save")


def apply_state_dict(model: Any, state: dict[str, Any], where: str) -> None:
    """Strict load with an error that names the first mismatching keys and shapes."""
    from vitdeploy.model import state_dict_problems

    own = model.state_dict()
    key = next((k for k in own if k.endswith("patch_embed.proj.weight")), None)
    if key in state and tuple(state[key].shape[2:]) != tuple(own[key].shape[2:]):
        raise ConfigError(
            f"checkpoint {where} was trained with patch {tuple(state[key].shape[2:])} but the model uses "
            f"{tuple(own[key].shape[2:])}: a patch-size change changes W_E, and interpolating the position table "
            "cannot fix it; export with the model name of the trained patch size"
        )
    problems = state_dict_problems(own, state)
    if problems:
        raise UserError(f"checkpoint {where} does not match the model: {'; '.join(problems)} (wrong model name or --num-classes?)")
    model.load_state_dict(state, strict=True)


def _state_sha256(model: Any) -> str:
    """Hash of the weights themselves (order-stable), for sources without a checkpoint file."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


# -- builtin and reference ViTs -------------------------------------------------------------------
def _load_builtin(name: str) -> LoadedModel:
    from vitdeploy import builtin
    from vitdeploy.builtin import digits

    entry = builtin.get_builtin(name)
    config = entry.load_config()
    spec = ViTSpec.from_dict(config["spec"])
    pre = dict(config["preprocessing"])
    pre.setdefault("channel_order", "rgb")
    pre.setdefault("config_source", f"vitdeploy builtin:{name} config")
    weights = digits.HERE / digits.WEIGHTS_FILE if name == "digits" else None
    source = {"kind": "builtin", "name": name, "checkpoint": None,
              "weights_sha256": sha256_file(weights) if weights else None}
    labels = list(config.get("labels") or [str(i) for i in range(spec.num_classes)])
    return LoadedModel(entry.load_model(), spec, pre, labels, source, family="reference")


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
        spec = ViTSpec.from_dict(config["spec"])
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise UserError(f"config {config_path} is not a vitdeploy reference-ViT config ({exc})") from None
    model = VisionTransformer(spec)
    apply_state_dict(model, load_state_dict(weights_path), str(weights_path))
    pre = dict(config["preprocessing"])
    pre.setdefault("channel_order", "rgb")
    labels = list(config.get("labels") or [str(i) for i in range(spec.num_classes)])
    source = {"kind": "ref", "name": str(weights_path), "checkpoint": str(weights_path), "weights_sha256": sha256_file(weights_path)}
    return LoadedModel(model, spec, pre, labels, source, family="reference")


# -- timm -----------------------------------------------------------------------------------------
def _load_timm(name: str, checkpoint: str | Path | None, num_classes: int | None, model_kwargs: dict[str, Any]) -> LoadedModel:
    timm = require("timm", "timm sources")
    if not timm.is_model(name):
        raise UserError(f"timm has no model {name!r}{did_you_mean(name.split('.')[0], timm.list_models())}")
    kwargs = dict(model_kwargs)
    if num_classes:
        kwargs["num_classes"] = int(num_classes)
    state = None
    if checkpoint:
        state = load_state_dict(checkpoint)
        if not num_classes:
            # Infer the head from the checkpoint so a fine-tuned model loads without --num-classes.
            head = state.get("head.weight")
            if head is not None:
                kwargs["num_classes"] = int(head.shape[0])
    try:
        model = timm.create_model(name, pretrained=False, **kwargs)
    except Exception as exc:
        raise UserError(f"timm cannot build {name!r} with {kwargs}: {exc}") from None
    from .families import TIMM_BEIT, TIMM_EVA, spec_from_beit, spec_from_eva, timm_family

    family = timm_family(model, name)  # ViT, BEiT (relative bias) or EVA (rotary); else one line why not
    if state is not None:
        apply_state_dict(model, state, str(checkpoint))
    if family == TIMM_BEIT:
        spec = spec_from_beit(model, name)
    elif family == TIMM_EVA:
        spec = spec_from_eva(model, name)
    else:
        spec = spec_from_timm(model, name)
    cfg = model.pretrained_cfg
    crop_pct = cfg.get("crop_pct")
    pre = {
        "mean": [float(v) for v in cfg["mean"]],
        "std": [float(v) for v in cfg["std"]],
        "channel_order": "rgb",
        "host_resize": {
            "mode": "shorter-side-center-crop" if crop_pct else "stretch",
            "interpolation": cfg.get("interpolation", "bicubic"),
            "crop_pct": crop_pct,
        },
        "config_source": f"timm pretrained_cfg of {name} (tag {cfg.get('tag')})",
    }
    named = _timm_labels(model, spec.num_classes)
    projection = is_projection_head(model, spec.num_classes, num_classes)
    labels = [] if projection else (named or [str(i) for i in range(spec.num_classes)])
    source = {
        "kind": "timm",
        "name": name,
        "checkpoint": str(checkpoint) if checkpoint else None,
        "weights_sha256": sha256_file(checkpoint) if checkpoint else _state_sha256(model),
        "num_classes": spec.num_classes,
        "model_kwargs": dict(model_kwargs),
        "timm_version": timm.__version__,
        "random_init": checkpoint is None,
    }
    if projection:
        source["head"] = "projection"
    return LoadedModel(model, spec, pre, labels, source, family=family,
                       extra={"projection_head": {"dim": spec.num_classes}} if projection else {})


def _timm_labels(model: Any, num_classes: int) -> list[str] | None:
    """Class names of the ImageNet subset timm infers for this head (1k, 21k, 12k), else None: a head whose
    outputs nothing names (a fine-tune's indices, or a projection)."""
    try:
        from timm.data import ImageNetInfo, infer_imagenet_subset

        subset = infer_imagenet_subset(model)
        if subset:
            info = ImageNetInfo(subset)
            if info.num_classes() == num_classes:
                return [info.index_to_description(i) for i in range(num_classes)]
    except Exception:  # older timm without ImageNetInfo, or a subset it ships no names for
        pass
    return None


def set_projection_head(loaded: "LoadedModel") -> None:
    loaded.extra["projection_head"] = {"dim": loaded.spec.num_classes}
    loaded.source["head"] = "projection"
    loaded.labels = []


def is_projection_head(model: Any, num_classes: int, asked_classes: int | None) -> bool:
    """A head that maps to a joint embedding space (CLIP/SigLIP image towers: 512-d, 768-d ...), not to
    classes: it is the published head (the size of the pretrained config's), nothing names its outputs,
    and the user did not ask for a number of classes. Such a model exports an embedding, not softmax
    "probs" over 512 meaningless "classes"."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    return (num_classes > 0 and asked_classes is None and int(cfg.get("num_classes") or -1) == num_classes
            and not cfg.get("label_names") and _timm_labels(model, num_classes) is None)


def spec_from_timm(model: Any, name: str) -> ViTSpec:
    blocks = list(model.blocks)
    embed_dim = int(model.embed_dim)
    from .families import mlp_shape

    mlp_ratio, mlp_kind = mlp_shape(blocks[0], embed_dim)  # plain fc1/fc2, or gated (SwiGLU/GLU)
    num_heads = int(blocks[0].attn.num_heads)
    dist = 1 if getattr(model, "dist_token", None) is not None else 0
    regs = int(model.reg_token.shape[1]) if getattr(model, "reg_token", None) is not None else 0
    pool = model.global_pool
    if pool not in ("token", "avg"):
        raise UserError(f"timm model {name!r} uses global_pool={pool!r}; vitdeploy supports 'token' and 'avg'")
    if getattr(model, "pos_embed", None) is None:
        raise UserError(f"timm model {name!r} has no learned absolute position table")
    prefix_rows = 0 if model.no_embed_class else int(model.num_prefix_tokens)
    return ViTSpec(
        image_size=tuple(model.patch_embed.img_size),
        patch_size=tuple(model.patch_embed.patch_size),
        embed_dim=embed_dim,
        depth=len(blocks),
        num_heads=num_heads,
        num_classes=int(model.num_classes),
        in_chans=int(model.patch_embed.proj.in_channels),
        mlp_ratio=mlp_ratio,
        mlp_kind=mlp_kind,
        class_token=model.cls_token is not None,
        num_reg_tokens=regs,
        num_distill_tokens=dist,
        global_pool=pool,
        pos_embed_prefix_rows=prefix_rows,
        family="deit-distilled" if dist else ("vit-reg" if regs else "vit"),
    )


# -- Hugging Face transformers --------------------------------------------------------------------
_PIL_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def _load_hf(directory: Path) -> LoadedModel:
    transformers = require("transformers", "Hugging Face sources")
    if not directory.is_dir():
        raise UserError(f"hf source {directory} is not a directory saved with save_pretrained()")
    if not (directory / "config.json").is_file():
        raise UserError(f"hf source {directory} has no config.json; save the model with save_pretrained()")
    transformers.utils.logging.disable_progress_bar()  # one line per command, not a weights bar
    config = transformers.AutoConfig.from_pretrained(str(directory), local_files_only=True)
    if config.model_type not in ("vit", "deit"):
        raise UserError(f"hf model type {config.model_type!r} is not supported; vitdeploy exports ViT and DeiT classifiers")
    arch = (config.architectures or ["ViTForImageClassification"])[0]
    model_cls = getattr(transformers, arch, None)
    if model_cls is None or "ImageClassification" not in arch:
        raise UserError(f"hf architecture {arch!r} is not an image classifier (expected ViTForImageClassification or DeiT)")
    try:
        model = model_cls.from_pretrained(str(directory), local_files_only=True, attn_implementation="eager")
    except Exception as exc:
        raise UserError(f"cannot load the hf model in {directory}: {exc}") from None
    processor_path = directory / "preprocessor_config.json"
    if not processor_path.is_file():
        raise UserError(f"hf source {directory} has no preprocessor_config.json; save the image processor with it")
    proc = json.loads(processor_path.read_text())
    size = proc.get("size") or {}
    height = size.get("height") or size.get("shortest_edge") or config.image_size
    width = size.get("width") or size.get("shortest_edge") or config.image_size
    mean = proc.get("image_mean", [0.5, 0.5, 0.5]) if proc.get("do_normalize", True) else [0.0, 0.0, 0.0]
    std = proc.get("image_std", [0.5, 0.5, 0.5]) if proc.get("do_normalize", True) else [1.0, 1.0, 1.0]
    scale = proc.get("rescale_factor", 1 / 255) if proc.get("do_rescale", True) else 1.0
    if abs(scale - 1 / 255) > 1e-9:
        raise UserError(f"hf image processor rescales by {scale}; vitdeploy's uint8 contract expects 1/255")
    distilled = arch.endswith("WithTeacher")
    image_size = config.image_size if isinstance(config.image_size, int) else config.image_size[0]
    patch = config.patch_size if isinstance(config.patch_size, int) else config.patch_size[0]
    prefix = 2 if config.model_type == "deit" else 1
    spec = ViTSpec(
        image_size=(image_size, image_size),
        patch_size=(patch, patch),
        embed_dim=config.hidden_size,
        depth=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        num_classes=config.num_labels,
        in_chans=config.num_channels,
        mlp_ratio=config.intermediate_size / config.hidden_size,
        num_distill_tokens=prefix - 1,
        pos_embed_prefix_rows=prefix,
        family=f"hf-{config.model_type}" + ("-distilled" if distilled else ""),
    )
    if (height, width) != spec.image_size:
        raise UserError(f"hf processor size {height}x{width} differs from the model's image_size {spec.image_size}")
    labels = [str(config.id2label.get(i, config.id2label.get(str(i), i))) for i in range(config.num_labels)]
    pre = {
        "mean": [float(v) for v in mean],
        "std": [float(v) for v in std],
        "channel_order": "rgb",
        "host_resize": {"mode": "stretch", "interpolation": _PIL_RESAMPLE.get(proc.get("resample", 2), "bilinear"), "crop_pct": None},
        "config_source": f"{processor_path.name} ({proc.get('image_processor_type', 'image processor')})",
    }
    weights = [p for p in directory.iterdir() if p.suffix in (".safetensors", ".bin")]
    source = {
        "kind": "hf",
        "name": str(directory),
        "checkpoint": str(weights[0]) if weights else None,
        "weights_sha256": sha256_file(weights[0]) if weights else _state_sha256(model),
        "architecture": arch,
        "transformers_version": transformers.__version__,
    }
    return LoadedModel(_hf_logits_module(model), spec, pre, labels, source, family="hf")


def _hf_logits_module(model: Any) -> Any:
    """Wrap an HF classifier so forward(pixel_values) returns the logits tensor (the class is made
    here so that importing this module does not import torch)."""
    torch = require("torch")

    class HFLogits(torch.nn.Module):
        def __init__(self, inner: Any):
            super().__init__()
            self.hf = inner
            self.interpolate_pos_encoding = False

        def forward(self, pixel_values):
            out = self.hf(pixel_values=pixel_values, interpolate_pos_encoding=self.interpolate_pos_encoding)
            return out.logits

    return HFLogits(model)


def require_same_patch(spec: ViTSpec, patch_size: tuple[int, int] | None) -> None:
    if patch_size is not None and tuple(patch_size) != tuple(spec.patch_size):
        raise ConfigError(
            f"patch size {tuple(patch_size)} differs from the model's {spec.patch_size}: that changes W_E, "
            "and interpolating the position table cannot fix it"
        )
