"""What every model source returns (LoadedModel), checkpoint loading, and the identity of weights.

The identity is a ``weights`` record in the manifest's ``source`` (bound into model.onnx too): where
the weights came from and the sha256 of what was read, so a bundle names the weights it computes
and a re-load (``check``, variants) can refuse weights that are not the same ones.

    {"origin": "hf-hub", "repo_id": "timm/deit_tiny_patch16_224.fb_in1k", "revision": "<commit>",
     "requested_revision": null, "file": "model.safetensors", "sha256": "..."}
    {"origin": "checkpoint", "file": "/path/ft.safetensors", "sha256": "..."}
    {"origin": "random", "seed": 0, "sha256": "<hash of the state dict>"}        (--random-init only)
    {"origin": "builtin" | "local-dir" | "url", "file": ..., "sha256": ...}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitdeploy.errors import ConfigError, UserError
from vitdeploy.records import WeightsIdentity
from vitdeploy.lazy import require
from vitdeploy.spec import ViTSpec

# Random weights (--random-init only) are seeded so that `check` can rebuild the same reference.
RANDOM_INIT_SEED = 0


@dataclass
class LoadedModel:
    model: Any  # torch.nn.Module, eval mode: float NCHW (normalised) -> logits [N, K]
    spec: ViTSpec
    preprocessing: dict[str, Any]  # mean, std, scale, channel_order, host_resize, input_size
    labels: list[str]
    source: dict[str, Any]  # kind, name, checkpoint, weights_sha256, ...
    # its family adapter (exporters/adapters/): re-gridding, read-outs, module names, variable size
    adapter: Any = None
    extra: dict[str, Any] = field(default_factory=dict)



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


def state_sha256(model: Any) -> str:
    """Hash of the weights themselves (order-stable), for sources without a checkpoint file."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()



# -- the identity of the weights -----------------------------------------------------------------
def random_weights(model: Any, seed: int) -> dict[str, Any]:
    return {"origin": "random", "seed": int(seed), "sha256": state_sha256(model)}


def file_weights(origin: str, path: str | Path) -> dict[str, Any]:
    from vitdeploy.fileio import sha256_file

    return {"origin": origin, "file": str(path), "sha256": sha256_file(path)}


def require_same_weights(loaded: LoadedModel, recorded: dict[str, Any]) -> None:
    """A bundle's source, loaded again (``check``, variants), must give the weights it was exported
    from: same sha256, or one line saying what changed. Bundles without a recorded hash pass."""
    want, got = recorded.get("weights_sha256"), loaded.source.get("weights_sha256")
    if not want or want == got:
        return
    what = f"{recorded.get('kind')}:{recorded.get('name')}"
    weights = WeightsIdentity.of_source(recorded)
    origin = weights.origin or ("random" if weights.random else "file")
    if origin == "random":
        raise UserError(
            f"{what}: the bundle's random weights (seed {weights.seed}) cannot be rebuilt "
            "identically with this version of timm/transformers/torch; re-export with --random-init here")
    if origin == "hf-hub":
        raise UserError(
            f"{what}: {weights.file} of hub repository {weights.repo_id}@{weights.revision} in the cache is "
            f"not the file the bundle was exported from (sha256 {str(got)[:12]}... vs {want[:12]}...); delete that snapshot from "
            "the Hugging Face cache and let it download again")
    raise UserError(
        f"{what}: the weights file {weights.file or recorded.get('checkpoint')} changed since the bundle was exported "
        f"(sha256 {str(got)[:12]}... vs {want[:12]}...); restore it or re-export the bundle")


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


def set_projection_head(loaded: LoadedModel) -> None:
    """Mark a CLIP-style projection head: its output is the embedding (features.py), and it has no labels."""
    loaded.extra["projection_head"] = {"dim": loaded.spec.num_classes}
    loaded.source["head"] = "projection"
    loaded.labels = []
