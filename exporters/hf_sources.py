"""`hf:ORG/NAME[@REVISION]` and `hf:DIR`: a transformers ViT-family model with its image processor and labels.

Model, config and image processor come from ``from_pretrained`` (the hub or its cache, pinned to
the commit the hub gave; a folder saved with ``save_pretrained``). Which classes are exported, and
everything that differs between them (spec, read-outs, positions), is their family adapter's
(exporters/adapters/hf_*.py: ViT, DeiT incl. ``...WithTeacher``, BEiT, DINOv2 classifier and
headless, the CLIP / SigLIP / SigLIP 2 image towers, whose dual encoders load as their image tower:
``load_plan``); anything else is refused in one line that names the class.

transformers would fill weights a checkpoint lacks (a classifier on a headless repository) with
random numbers and only log it; here that is refused, like every other way to random weights
except ``--random-init``. The processor's resize/crop rule, rescale and mean/std become the bundle's
preprocessing contract, read from the processor object (its class defaults apply, as in transformers).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Callable

from vitdeploy.errors import UserError
from vitdeploy.records import WeightsIdentity
from vitdeploy.lazy import require

from . import hub
from .adapters import hf_adapter
from .loaded import LoadedModel, file_weights, random_weights

# transformers' weight files, in the order from_pretrained looks for them (modeling_utils: safetensors first)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
PIL_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
ALTERNATIVES = "save the model with save_pretrained and export hf:DIR, or export random weights with --random-init; nothing was written"


def load_hf(ref: str, random_init: bool, seed: int, recorded: dict[str, Any] | None, log: Callable[[str], None]) -> LoadedModel:
    transformers = require("transformers", "Hugging Face sources")
    what = f"hf:{ref}"
    directory = Path(ref)
    access = None
    if directory.is_dir():
        if not (directory / "config.json").is_file():
            raise UserError(f"hf source {directory} has no config.json; save the model with save_pretrained()")
        if not (directory / "preprocessor_config.json").is_file():
            raise UserError(f"hf source {directory} has no preprocessor_config.json; save the image processor with it "
                            "(processor.save_pretrained(DIR)): its resize and mean/std are part of the bundle")
        location, kwargs = str(directory), {"local_files_only": True}
    else:
        repo_id, revision = hub.split_revision(ref)
        if not hub.is_repo_id(repo_id):
            raise UserError(f"hf source {ref!r} is neither a directory saved with save_pretrained() nor a hub id ORG/NAME[@REVISION]")
        weights = WeightsIdentity.of_source(recorded)
        config = weights.config or {}  # random weights: the hub architecture they were made on
        pin_revision, pin_file = (weights.revision, weights.file) if weights.origin == "hf-hub" else (config.get("revision"), config.get("file"))
        expect: tuple[str, ...] = ()
        if not revision and pin_revision:  # a bundle's own revision, again
            revision = pin_revision
            expect = ("config.json", "preprocessor_config.json") + ((pin_file,) if pin_file else ())
        access = hub.open_repo(repo_id, revision, what, expect=expect)
        location, kwargs = repo_id, {"revision": access.pin}
        if access.uses_network:  # a download may take a while: say what it is
            log(f"loading {repo_id}@{access.revision} from the Hugging Face hub")
    transformers.utils.logging.disable_progress_bar()  # one line per command, not a weights bar
    with _loading(access, what):
        config = transformers.AutoConfig.from_pretrained(location, **kwargs)
        adapter, arch = hf_adapter(config, what)
        built, built_config, headless = adapter.load_plan(config, arch)  # a dual encoder: its image tower
        model_cls = getattr(transformers, built)
        processor = transformers.AutoImageProcessor.from_pretrained(location, **kwargs)
        if random_init:
            require("torch").manual_seed(seed)
            model = model_cls(built_config)
            if hasattr(model, "set_attn_implementation"):  # transformers 5 has it; older ones keep the config's choice
                model.set_attn_implementation("eager")
        else:
            import inspect

            # a .bin checkpoint is read with torch.load(weights_only=True): transformers 5's default, asked for
            # explicitly where from_pretrained takes the argument
            safe = {"weights_only": True} if "weights_only" in inspect.signature(model_cls.from_pretrained).parameters else {}
            if built_config is not config:
                safe["config"] = built_config
            model, info = model_cls.from_pretrained(location, output_loading_info=True, attn_implementation="eager", **safe, **kwargs)
            _refuse_missing(info, arch, what)
    if access is not None and access.note():
        log(access.note())
    model.eval()
    spec = adapter.spec_from_config(config, model, arch, headless)
    pre, size = preprocessing_of(processor, what, adapter.fixed_size(processor))
    extra: dict[str, Any] = adapter.loaded_extra(model)
    if size != tuple(spec.image_size):
        if not adapter.keeps_trained_table:
            raise UserError(f"{what}: the image processor gives {size[0]}x{size[1]} images but the model's image_size is "
                            f"{spec.image_size[0]}x{spec.image_size[1]}; save the processor the model was trained with")
        # DINOv2 keeps its 518x518 table and interpolates it to every input; its processor crops to
        # 224: the bundle's default resolution is the processor's, with the table resampled by the
        # same rule transformers applies (bicubic, align_corners=False, no antialias)
        extra["default_resolution"] = size
    if random_init:
        weights = random_weights(model, seed)
        if access is not None:
            weights["config"] = {"repo_id": access.repo_id, "revision": _config_commit(access)}
    else:
        weights = _identity(directory if access is None else None, access, what)
    labels = [] if headless else [str(config.id2label.get(i, config.id2label.get(str(i), i))) for i in range(config.num_labels)]
    source = {
        "kind": "hf",
        "name": str(directory) if access is None else access.repo_id,
        "checkpoint": None,
        "weights_sha256": weights.pop("combined_sha256", None) or weights["sha256"],
        "weights": weights,
        "architecture": arch,
        "model_type": config.model_type,
        "transformers_version": transformers.__version__,
        "random_init": random_init,
    }
    if random_init:
        source["random_init_seed"] = int(seed)
    return LoadedModel(adapter.wrap(model), spec, pre, labels, source, adapter=adapter, extra=extra)


@contextlib.contextmanager
def _loading(access: hub.HubAccess | None, what: str) -> Any:
    context = access.loading() if access is not None else contextlib.nullcontext()
    try:
        with hub.quiet(), context:
            yield
    except UserError:
        raise
    except hub.hub_error_kinds() as exc:
        if access is not None:
            raise hub.not_loadable(access, what, exc, ALTERNATIVES) from None
        raise UserError(f"cannot load the hf model in {what[3:]}: {' '.join(str(exc).split())[:300]}") from None
    except Exception as exc:  # noqa: BLE001 - transformers raises ValueError/KeyError/... for configs it cannot read
        raise UserError(f"cannot load the hf model {what[3:]}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from None


def _refuse_missing(info: dict[str, Any], arch: str, what: str) -> None:
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise UserError(f"{what}: the checkpoint lacks {len(missing)} weights of {arch} ({', '.join(missing[:3])}"
                        f"{' ...' if len(missing) > 3 else ''}), which transformers would fill with random numbers; "
                        "export the class the repository was trained as, or give weights that have them")


# -- the image processor -------------------------------------------------------------------------
def _get(obj: Any, key: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, key, None)


def preprocessing_of(processor: Any, what: str, fixed: tuple[int, int] | None = None) -> tuple[dict[str, Any], tuple[int, int]]:
    """The processor's rule as the bundle's host resize + normalisation, and the size it gives (``fixed``, stretched
    to, where the processor has no size rule of its own: its family adapter's ``fixed_size``)."""
    name = type(processor).__name__
    if not bool(getattr(processor, "do_rescale", True)) or abs(float(getattr(processor, "rescale_factor", 1 / 255)) - 1 / 255) > 1e-9:
        raise UserError(f"{what}: the image processor ({name}) rescales by {getattr(processor, 'rescale_factor', None)} "
                        f"(do_rescale={getattr(processor, 'do_rescale', None)}); vitdeploy's uint8 contract expects 1/255")
    normalize = bool(getattr(processor, "do_normalize", True))
    mean = list(getattr(processor, "image_mean", None) or [0.5, 0.5, 0.5]) if normalize else [0.0, 0.0, 0.0]
    std = list(getattr(processor, "image_std", None) or [0.5, 0.5, 0.5]) if normalize else [1.0, 1.0, 1.0]
    size, crop = getattr(processor, "size", None), getattr(processor, "crop_size", None)
    do_crop = bool(getattr(processor, "do_center_crop", False)) and crop is not None
    height, width, shortest = _get(size, "height"), _get(size, "width"), _get(size, "shortest_edge")
    crop_hw = (int(_get(crop, "height")), int(_get(crop, "width"))) if do_crop else None
    if height and width:
        mode, resized = "stretch", (int(height), int(width))
        out = crop_hw or resized
        crop_pct = None
        if crop_hw:
            if crop_hw[0] > resized[0] or crop_hw[1] > resized[1] or abs(crop_hw[0] / resized[0] - crop_hw[1] / resized[1]) > 1e-9:
                raise UserError(f"{what}: the image processor ({name}) crops {crop_hw} from {resized}: not one crop fraction "
                                "for both sides, which vitdeploy's host resize rule expresses")
            crop_pct = _crop_pct(crop_hw[0], resized[0])
    elif shortest:
        if not crop_hw or crop_hw[0] != crop_hw[1]:
            raise UserError(f"{what}: the image processor ({name}) resizes the shortest edge to {shortest} without a square "
                            "centre crop, so images keep their aspect ratio; vitdeploy bundles take one fixed size")
        mode, out = "shorter-side-center-crop", crop_hw
        crop_pct = _crop_pct(crop_hw[0], int(shortest))
    elif fixed:
        mode, out, crop_pct = "stretch", tuple(fixed), None
    else:
        raise UserError(f"{what}: the image processor ({name}) has a size rule vitdeploy cannot express ({size!r})")
    resample = getattr(processor, "resample", 2)
    resample = getattr(resample, "value", resample)
    pre = {
        "mean": [float(v) for v in mean],
        "std": [float(v) for v in std],
        "channel_order": "rgb",
        "host_resize": {"mode": mode, "interpolation": PIL_RESAMPLE.get(int(resample), "bilinear"), "crop_pct": crop_pct},
        "config_source": f"preprocessor_config.json ({name})",
    }
    return pre, out


def _crop_pct(crop: int, resized: int) -> float:
    """crop / resized, such that vitdeploy's floor(crop / crop_pct) gives back ``resized`` exactly."""
    pct = crop / resized
    while math.floor(crop / pct) < resized:  # 224 / (224 / 248) may land a hair under 248
        pct = math.nextafter(pct, 0.0)
    return pct


# -- identity ----------------------------------------------------------------------------------------
def _identity(directory: Path | None, access: hub.HubAccess | None, what: str) -> dict[str, Any]:
    """The file transformers read (a hub snapshot's or the folder's), hashed; shards too."""
    from vitdeploy.errors import InternalError

    if access is not None:
        found = hub.file_identity(access, WEIGHT_FILES)
        if found is None:
            raise InternalError(f"{what}: transformers loaded {access.repo_id} but none of {', '.join(WEIGHT_FILES)} is in the cache")
        folder = hub.cached_path(access.repo_id, found["file"], found["revision"]).parent
    else:
        file = next((f for f in WEIGHT_FILES if (directory / f).is_file()), None)
        if file is None:
            raise InternalError(f"{what}: transformers loaded a model from {directory} but none of {', '.join(WEIGHT_FILES)} is there")
        found = file_weights("local-dir", directory / file)
        found["file"] = file
        folder = directory
    if found["file"].endswith(".index.json"):
        shards = sorted(set(json.loads((folder / found["file"]).read_text()).get("weight_map", {}).values()))
        found["shards"] = [{"file": s, "sha256": file_weights("shard", folder / s)["sha256"]} for s in shards]
        digest = hashlib.sha256("".join(f"{s['file']} {s['sha256']}\n" for s in found["shards"]).encode())
        found["combined_sha256"] = digest.hexdigest()  # what the shards hold together (weights_sha256)
    return found


def _config_commit(access: hub.HubAccess) -> str | None:
    path = hub.cached_path(access.repo_id, "config.json", access.pin)
    return (hub.snapshot_commit(path) if path else None) or access.pin
