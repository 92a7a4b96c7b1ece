"""The one reader of a bundle's manifest: every key a command relies on is checked once, here.

A manifest is written by vitdeploy, but it is a file a user can edit, truncate or copy from another
version. Reading it through this module turns a missing or malformed key into one line that names
the key and the fix (re-export), instead of a KeyError deep inside whichever command met it first.
"""

from __future__ import annotations

import re
from typing import Any

from .errors import UserError

FORMAT = "vitdeploy-bundle/1"
SHA256 = re.compile(r"^[0-9a-f]{64}$")
CHANNEL_ORDERS = ("rgb", "bgr")
RESOLUTION_MODES = ("static", "dynamic", "variable")
# The keys bound into the graph itself (see bundle.CORE_KEYS) that every command reads.
REQUIRED_CORE = ("source", "spec", "preprocessing", "resolution")


# What a graph's outputs make of its model (issue 36): class scores make a classifier; a graph that
# declares outputs but none of these (embedding, patch_grid: a CLIP/SigLIP image tower, a DINOv2
# backbone) is an embedding model. check, evaluate and export's log all ask is_embedding_model.
CLASS_OUTPUTS = ("logits", "probs")


def is_embedding_model(outputs: Any) -> bool:
    """True when the declared outputs hold no class scores. A manifest from before graph.outputs was
    recorded declares none and is a classifier (every such export had logits)."""
    return bool(outputs) and not any(o in CLASS_OUTPUTS for o in outputs)


def model_kind(outputs: Any, embedding_width: int | None, classes: int) -> str:
    """One phrase for a log or report: 'an embedding model (512-d embedding, no classes)' or '1000 classes'."""
    if is_embedding_model(outputs):
        width = f"{embedding_width}-d embedding" if embedding_width else "patch grid only"
        return f"an embedding model ({width}, no classes)"
    return f"{classes} classes"


class ManifestError(UserError):
    """The manifest lacks a key, or holds a value of the wrong kind."""


def _fail(where: str, key: str, problem: str) -> None:
    raise ManifestError(f"{where}: `{key}` {problem}; re-export the bundle with `vitdeploy export` "
                        "(or restore the manifest that came with it)")


def _need(where: str, data: dict[str, Any], key: str, kind: type | tuple[type, ...], prefix: str = "") -> Any:
    name = f"{prefix}{key}"
    if key not in data:
        _fail(where, name, "is missing")
    value = data[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):  # True is an int
        want = " or ".join(k.__name__ for k in kinds)
        _fail(where, name, f"should be {want}, not {type(value).__name__}")
    return value


def _numbers(where: str, key: str, value: Any, count: int, positive: bool = False) -> None:
    ok = (isinstance(value, list) and len(value) == count
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value))
    if not ok:
        _fail(where, key, f"should be a list of {count} numbers, not {value!r:.80}")
    if positive and any(not v > 0 for v in value):
        _fail(where, key, f"should hold positive numbers, not {value!r:.80}")


def _size(where: str, key: str, value: Any) -> None:
    if value is None:
        return
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                                                for v in value)):
        _fail(where, key, f"should be [height, width] in whole pixels or null, not {value!r:.80}")


def validate_core(manifest: Any, where: str) -> dict[str, Any]:
    """Check what every command reads: source, spec, preprocessing, resolution, labels, graph."""
    from .spec import ViTSpec

    if not isinstance(manifest, dict):
        raise ManifestError(f"{where} holds {type(manifest).__name__}, not a manifest object; re-export the bundle")
    for key in REQUIRED_CORE:
        _need(where, manifest, key, dict)
    source = manifest["source"]
    _need(where, source, "kind", str, "source.")
    _need(where, source, "name", str, "source.")

    spec = manifest["spec"]
    for key in ("image_size", "patch_size"):
        _size(where, f"spec.{key}", _need(where, spec, key, list, "spec."))
    for key in ("embed_dim", "depth", "num_heads", "num_classes"):
        if _need(where, spec, key, int, "spec.") < (0 if key == "num_classes" else 1):  # 0 classes: a backbone
            _fail(where, f"spec.{key}", f"should be a {'non-negative' if key == 'num_classes' else 'positive'} integer, not {spec[key]!r}")
    try:
        ViTSpec.from_dict(spec)
    except (TypeError, ValueError, UserError) as exc:
        _fail(where, "spec", f"does not describe a ViT ({exc})")

    pre = manifest["preprocessing"]
    _numbers(where, "preprocessing.mean", _need(where, pre, "mean", list, "preprocessing."), 3)
    _numbers(where, "preprocessing.std", _need(where, pre, "std", list, "preprocessing."), 3, positive=True)
    if pre.get("channel_order", "rgb") not in CHANNEL_ORDERS:
        _fail(where, "preprocessing.channel_order", f"should be one of {', '.join(CHANNEL_ORDERS)}, not {pre['channel_order']!r}")
    _size(where, "preprocessing.input_size", pre.get("input_size"))
    for key in ("host_resize", "in_graph_resize", "variable_size"):
        if pre.get(key) is not None and not isinstance(pre[key], dict):
            _fail(where, f"preprocessing.{key}", f"should be an object or null, not {type(pre[key]).__name__}")

    resolution = manifest["resolution"]
    if _need(where, resolution, "mode", str, "resolution.") not in RESOLUTION_MODES:
        _fail(where, "resolution.mode", f"should be one of {', '.join(RESOLUTION_MODES)}, not {resolution['mode']!r}")

    labels = manifest.get("labels", [])
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        _fail(where, "labels", "should be a list of strings")
    if labels and len(labels) != spec["num_classes"]:
        _fail(where, "labels", f"has {len(labels)} entries but spec.num_classes is {spec['num_classes']}")
    graph = manifest.get("graph", {})
    if not isinstance(graph, dict):
        _fail(where, "graph", f"should be an object, not {type(graph).__name__}")
    outputs = graph.get("outputs", [])
    if not isinstance(outputs, list) or not all(isinstance(x, str) for x in outputs):
        _fail(where, "graph.outputs", "should be a list of output names")
    return manifest


def _plain_file(where: str, key: str, name: str) -> None:
    # a record names a file inside the bundle, nothing else: no folders, no way out of the bundle
    if not name or "/" in name or "\\" in name or name in (".", "..") or name.startswith("."):
        _fail(where, key, f"should be a file name inside the bundle, not {name!r}")


def validate_bundle_manifest(manifest: Any, where: str) -> dict[str, Any]:
    """A bundle folder's manifest.json: the core, the format, and the artifact records."""
    if not isinstance(manifest, dict):
        raise ManifestError(f"{where} holds {type(manifest).__name__}, not a manifest object; re-export the bundle")
    if manifest.get("format") != FORMAT:
        raise ManifestError(f"{where} has format {manifest.get('format')!r}, expected {FORMAT!r}; "
                            "re-export the bundle with this vitdeploy")
    validate_core(manifest, where)
    artifacts = manifest.get("artifacts", {})
    if not isinstance(artifacts, dict):
        _fail(where, "artifacts", f"should be an object, not {type(artifacts).__name__}")
    for precision, record in artifacts.items():
        key = f"artifacts.{precision}"
        if not isinstance(record, dict):
            _fail(where, key, f"should be an object, not {type(record).__name__}")
        _plain_file(where, f"{key}.file", _need(where, record, "file", str, f"{key}."))
        if not SHA256.match(str(_need(where, record, "sha256", str, f"{key}."))):
            _fail(where, f"{key}.sha256", f"should be 64 hex digits, not {record['sha256']!r:.80}")
        data = record.get("data")
        if data is not None:  # a large graph's external data file, verified with the graph
            if not isinstance(data, dict):
                _fail(where, f"{key}.data", f"should be an object, not {type(data).__name__}")
            _plain_file(where, f"{key}.data.file", _need(where, data, "file", str, f"{key}.data."))
            if not SHA256.match(str(_need(where, data, "sha256", str, f"{key}.data."))):
                _fail(where, f"{key}.data.sha256", f"should be 64 hex digits, not {data['sha256']!r:.80}")
    for key in ("records", "engines"):
        if not isinstance(manifest.get(key, {}), dict):
            _fail(where, key, f"should be an object, not {type(manifest[key]).__name__}")
    return manifest
