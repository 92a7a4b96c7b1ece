"""`timm:NAME[.TAG][@REVISION]` and `timm:hf-hub:ORG/NAME[@REVISION]`: a timm ViT with its published weights.

Pretrained by default, through timm's own loader (``timm.create_model(name, pretrained=True)``: the
weight's ``pretrained_cfg.hf_hub_id`` on the Hugging Face hub, timm's checkpoint filter, the head
and input-channel adaptation), pinned to the commit the hub gave for the requested revision
(``pretrained_cfg_overlay={"hf_hub_id": "repo@commit"}``, ``hf-hub:repo@commit``; timm splits the
``@``). ``--checkpoint`` gives the weights instead (strict load, head width inferred), and
``--random-init`` is the only way to random weights. Without either, weights that cannot be had
(offline and uncached, unknown tag, gated, no network, an architecture change the published
weights do not fit) are refused in one line: a bundle never holds random weights silently.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable

from vitdeploy.errors import UserError
from vitdeploy.records import WeightsIdentity
from vitdeploy.lazy import require
from vitdeploy.spec import ViTSpec

from . import hub
from .loaded import LoadedModel, apply_state_dict, file_weights, load_state_dict, random_weights, set_projection_head

HUB_PREFIX = "hf-hub:"
# timm's order for a hub weight without hf_hub_filename (timm/models/_hub.py load_state_dict_from_hf:
# the safetensors alternative of pytorch_model.bin first)
TIMM_HUB_FILES = ("model.safetensors", "pytorch_model.bin")
ALTERNATIVES = "give the weights with --checkpoint FILE, or export random weights with --random-init; nothing was written"


def load_timm(name: str, checkpoint: str | Path | None, num_classes: int | None, model_kwargs: dict[str, Any],
              random_init: bool, seed: int, recorded: dict[str, Any] | None, log: Callable[[str], None]) -> LoadedModel:
    timm = require("timm", "timm sources")
    base, revision = hub.split_revision(name)
    what = f"timm:{name}"
    on_hub = base.startswith(HUB_PREFIX)
    cfg = None if on_hub else _pretrained_cfg(timm, base)
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
    pretrained = state is None and not random_init
    repo_id = base[len(HUB_PREFIX):] if on_hub else (cfg.hf_hub_id if cfg is not None else None)
    if on_hub and not hub.is_repo_id(repo_id):
        raise UserError(f"{what}: {repo_id!r} is not a hub repository id (ORG/NAME)")
    expect: tuple[str, ...] = ()
    weights = WeightsIdentity.of_source(recorded)
    if not revision and weights.origin == "hf-hub":  # a bundle's own revision, again
        revision, expect = weights.revision, (weights.file,)
    elif not revision and (weights.config or {}).get("revision"):  # hf-hub architecture of random weights
        revision = (weights.config or {})["revision"]
    if revision and not repo_id:
        raise UserError(f"{what}: a revision (@{revision}) names a commit of a hub repository, and timm's {base} has none")
    if revision and recorded is None and not (pretrained or on_hub):
        raise UserError(f"{what}: a revision (@{revision}) selects published weights; --checkpoint and --random-init do not use them")
    if not on_hub:  # the architecture first (meta device: no weights, no download): non-ViTs are refused at once
        _check_architecture(timm, base, kwargs)
    if pretrained:
        _require_published(cfg, base, what, kwargs, repo_id)
    access = None
    if repo_id and (pretrained or on_hub):  # hf-hub: names read their config.json from the hub even without weights
        access = hub.open_repo(repo_id, revision, what, expect=expect or (("config.json",) if on_hub else ()))
    build_name, overlay = base, None
    if access is not None and access.pin:  # timm splits "repo@revision" (timm/models/_hub.py hf_split)
        if on_hub:
            build_name = f"{HUB_PREFIX}{repo_id}@{access.pin}"
        else:
            overlay = {"hf_hub_id": f"{repo_id}@{access.pin}"}
    if access is not None and pretrained and access.uses_network:  # a download may take a while: say what it is
        log(f"loading timm's published weights of {base} from the Hugging Face hub ({repo_id}@{access.revision})")
    if not pretrained and state is None:
        require("torch").manual_seed(seed)
    model = _create(timm, build_name, pretrained, overlay, kwargs, access, what)
    if access is not None and access.note():
        log(access.note())
    adapter, spec = _adapter_and_spec(model, base)
    if state is not None:
        apply_state_dict(model, state, str(checkpoint))
    if state is not None:
        weights = file_weights("checkpoint", checkpoint)
    elif pretrained:
        weights = _published_identity(model, cfg, access, what)
    else:
        weights = random_weights(model, seed)
        if access is not None:  # hf-hub: architecture from the hub's config.json
            config = hub.cached_path(repo_id, "config.json", access.pin)
            weights["config"] = {"repo_id": repo_id, "revision": (hub.snapshot_commit(config) if config else None) or access.pin}
    source = {
        "kind": "timm",
        "name": base,
        "checkpoint": str(checkpoint) if checkpoint else None,
        "weights_sha256": weights["sha256"],
        "weights": weights,
        "num_classes": spec.num_classes,
        "model_kwargs": dict(model_kwargs),
        "timm_version": timm.__version__,
        "random_init": weights["origin"] == "random",
    }
    if weights["origin"] == "random":
        source["random_init_seed"] = int(seed)
    loaded = LoadedModel(model, spec, _preprocessing(model.pretrained_cfg, base), _labels(model, spec.num_classes, published=state is None),
                         source, adapter=adapter)
    default = adapter.default_resolution(model)
    if default and tuple(default) != tuple(spec.image_size):  # exported at this size unless asked otherwise
        loaded.extra["default_resolution"] = tuple(default)
    if is_projection_head(model, spec.num_classes, num_classes, published=state is None):
        set_projection_head(loaded)  # CLIP-style: an embedding, unless the user names its outputs (--labels)
    # how regrid.py rebuilds this architecture (dynamic_img_size): the hub config pinned to its commit
    commit = weights.get("revision") or (weights.get("config") or {}).get("revision")
    loaded.extra["timm_name"] = f"{HUB_PREFIX}{repo_id}@{commit}" if on_hub and commit else base
    return loaded


def _preprocessing(pcfg: Any, base: str) -> dict[str, Any]:
    """The weight's own eval transform (timm pretrained_cfg): mean/std, crop_pct, interpolation."""
    crop_pct = pcfg.get("crop_pct")
    return {
        "mean": [float(v) for v in pcfg["mean"]],
        "std": [float(v) for v in pcfg["std"]],
        "channel_order": "rgb",
        "host_resize": {
            "mode": "shorter-side-center-crop" if crop_pct else "stretch",
            "interpolation": pcfg.get("interpolation", "bicubic"),
            "crop_pct": crop_pct,
        },
        "config_source": f"timm pretrained_cfg of {base} (tag {pcfg.get('tag')})",
    }


def _pretrained_cfg(timm: Any, base: str) -> Any:
    if not timm.is_model(base):
        raise UserError(f"timm has no model {base!r}{did_you_mean(base.split('.')[0], timm.list_models())}")
    try:
        return timm.models.get_pretrained_cfg(base)
    except RuntimeError:  # an unknown tag: timm's own message is "Invalid pretrained tag (x) for y."
        arch, _, tag = base.partition(".")
        tags = timm.list_pretrained(f"{arch}.*")
        raise UserError(f"timm has no pretrained tag {tag!r} for {arch}; published: {', '.join(tags[:8]) or 'none'}") from None


def _adapter_and_spec(model: Any, base: str) -> tuple[Any, ViTSpec]:
    """The family adapter of a timm model (ViT, BEiT, EVA ...) and its spec; else one line why vitdeploy cannot export it."""
    from .adapters import timm_adapter

    adapter = timm_adapter(model, base)
    return adapter, adapter.spec(model, _arch_name(model, base))


def _check_architecture(timm: Any, base: str, kwargs: dict[str, Any]) -> None:
    torch = require("torch")
    try:
        with torch.device("meta"):
            skeleton = timm.create_model(base, pretrained=False, **kwargs)
    except Exception:  # noqa: BLE001 - an init that cannot run on meta: build it for real (and let that fail)
        try:
            skeleton = timm.create_model(base, pretrained=False, **kwargs)
        except Exception as exc:  # noqa: BLE001 - timm raises RuntimeError/TypeError/AssertionError for what it cannot build
            raise UserError(f"timm cannot build {base!r} with {kwargs}: {' '.join(str(exc).split())[:300]}") from None
    _adapter_and_spec(skeleton, base)


def _require_published(cfg: Any, base: str, what: str, kwargs: dict[str, Any], repo_id: str | None) -> None:
    """Refuse, before any download, what timm would fill with random numbers or could not load."""
    if cfg is not None and not (repo_id or cfg.url or cfg.file):
        raise UserError(f"{what}: timm publishes no weights for {base} (tag {cfg.tag!r}); {ALTERNATIVES}")
    if cfg is not None and not repo_id and cfg.url and hub.offline() and not _torch_hub_file(cfg.url).is_file():
        # weights published at a URL only: torch.hub would try to download them, HF_HUB_OFFLINE or not
        raise UserError(f"{what}: timm's weights for {base} are published at {cfg.url}, not on the Hugging Face hub, and "
                        f"are not in torch.hub's cache ({_torch_hub_file(cfg.url).parent}) while HF_HUB_OFFLINE=1; download "
                        f"the file there, {ALTERNATIVES}")
    published = getattr(cfg, "num_classes", None) if cfg is not None else None
    wanted = kwargs.get("num_classes")
    if wanted is not None and published is not None and int(wanted) != int(published):
        # timm would load the backbone and leave a randomly initialised head of the new width
        raise UserError(f"{what}: the published weights have a {published}-class head; --num-classes {wanted} would add a "
                        "random head: give the fine-tuned weights with --checkpoint FILE (the head width is read from it), "
                        "or export random weights with --random-init")


def _create(timm: Any, build_name: str, pretrained: bool, overlay: dict[str, Any] | None, kwargs: dict[str, Any],
            access: hub.HubAccess | None, what: str) -> Any:
    context = access.loading() if access is not None else contextlib.nullcontext()
    extra = {"pretrained_cfg_overlay": overlay} if overlay else {}
    try:
        with hub.quiet(), context:
            return timm.create_model(build_name, pretrained=pretrained, **extra, **kwargs)
    except hub.hub_error_kinds() as exc:
        if access is not None:
            raise hub.not_loadable(access, what, exc, ALTERNATIVES) from None
        raise UserError(f"{what}: cannot get timm's published weights ({type(exc).__name__}: {exc}); {ALTERNATIVES}") from None
    except Exception as exc:  # noqa: BLE001 - timm raises RuntimeError/TypeError/AssertionError for what it cannot build
        text = " ".join(str(exc).split())
        if pretrained and ("state_dict" in text or "size mismatch" in text):
            raise UserError(f"{what}: the published weights do not fit the model built with {kwargs} ({text[:200]}); drop the "
                            "--model-arg that changes the architecture, or give matching weights with --checkpoint FILE") from None
        raise UserError(f"timm cannot build {build_name!r} with {kwargs}: {text[:300]}") from None


def _published_identity(model: Any, cfg: Any, access: hub.HubAccess | None, what: str) -> dict[str, Any]:
    """Which file timm read: the cached hub file of the pinned revision, or torch.hub's copy of the URL."""
    pcfg = model.pretrained_cfg
    if access is not None:
        filename = pcfg.get("hf_hub_filename")
        found = hub.file_identity(access, (filename,) if filename else TIMM_HUB_FILES)
        if found is None:
            from vitdeploy.errors import InternalError

            raise InternalError(f"{what}: timm loaded weights of {access.repo_id} but none of "
                                f"{filename or ', '.join(TIMM_HUB_FILES)} is in the cache {hub.cache_dir()}")
        return found
    url = pcfg.get("url") or getattr(cfg, "url", None)
    if pcfg.get("file"):
        return file_weights("file", pcfg["file"])
    weights = file_weights("url", _torch_hub_file(url))
    weights["url"] = url
    return weights


def _torch_hub_file(url: str) -> Path:
    """Where torch.hub keeps a downloaded checkpoint (timm loads URL weights through load_state_dict_from_url)."""
    import os
    from urllib.parse import urlparse

    return Path(require("torch").hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(url).path)


def _arch_name(model: Any, base: str) -> str:
    """The registered architecture (the BEiT and EVA adapters name BEiT v2 and EVA-02 by it) of a hub model."""
    return str(model.pretrained_cfg.get("architecture") or base) if base.startswith(HUB_PREFIX) else base


def did_you_mean(name: str, known: list[str], count: int = 3) -> str:
    """"; did you mean vit_small_patch16_224?" for a typo: the closest names by difflib's ratio."""
    import difflib

    close = difflib.get_close_matches(name, known, n=count, cutoff=0.75)
    return f"; did you mean {', '.join(close)}?" if close else ""


def is_projection_head(model: Any, num_classes: int, asked_classes: int | None, published: bool) -> bool:
    """A head that maps to a joint embedding space (CLIP/SigLIP image towers: 512-d, 768-d ...), not to
    classes: it is the published head (the size of the pretrained config's), nothing names its outputs,
    and the user did not ask for a number of classes. Such a model exports an embedding, not softmax
    "probs" over 512 meaningless "classes"."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    return (num_classes > 0 and asked_classes is None and int(cfg.get("num_classes") or -1) == num_classes
            and _named_labels(model, num_classes, published) is None)


def _labels(model: Any, num_classes: int, published: bool) -> list[str]:
    """The weight's own label names (hub config), ImageNet names for ImageNet heads, else indices."""
    return _named_labels(model, num_classes, published) or [str(i) for i in range(num_classes)]


def _named_labels(model: Any, num_classes: int, published: bool) -> list[str] | None:
    """The names a head's outputs have (hub config label_names, or the ImageNet subset timm infers), or None."""
    names = model.pretrained_cfg.get("label_names")
    if names and len(names) == num_classes:
        return [str(n) for n in names]
    subset = None
    try:
        from timm.data import ImageNetInfo, infer_imagenet_subset

        subset = infer_imagenet_subset(model) if published else ("imagenet-1k" if num_classes == 1000 else None)
        if subset:
            info = ImageNetInfo(subset)
            if info.num_classes() == num_classes:
                names = [info.index_to_description(i) for i in range(num_classes)]
                # ImageNet-1k describes two classes as "crane" (the bird, the machine): a label map
                # must be one-to-one, so a repeated description gets its synset id
                counts: dict[str, int] = {}
                for n in names:
                    counts[n] = counts.get(n, 0) + 1
                return [f"{n} ({info.index_to_label_name(i)})" if counts[n] > 1 else n for i, n in enumerate(names)]
    except Exception:  # noqa: BLE001 - an older timm without ImageNetInfo: indices
        pass
    return None
