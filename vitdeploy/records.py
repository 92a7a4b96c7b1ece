"""Typed records of a bundle's manifest: what an artifact, an engine, the weights and the storage rule hold.

The manifest is JSON a user may edit, and bundles written by older versions lack keys that newer ones
write. `vitdeploy.manifest` checks what every command relies on; this module turns the checked dicts
into frozen records, so a consumer asks ``bundle.artifact("fp16").sha256`` instead of knowing that it
lives at ``manifest["artifacts"]["fp16"]["sha256"]``.

Each record reads with ``from_dict`` (tolerant exactly as the reader is: a key an older manifest lacks
is None) and writes with ``to_dict``, which gives back the same JSON, key order included: the keys a
record does not name are kept in ``extras``, and the order the keys were read in is remembered, so
reading and re-writing a manifest never changes its bytes (tests/test_records.py).

Adding a record: a frozen dataclass with ``_record`` as base, its JSON keys in ``KEYS`` (key -> field
name), a ``from_dict`` that calls ``_read`` and a reader ``..._of(manifest)`` below; Bundle gains the
accessor. Core module: standard library only, valid Python 3.8 (it runs on the device).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Dict, Mapping, Optional, Tuple

STORAGE_THRESHOLD = "external_data_threshold"  # manifest["storage"][...]: the bundle's external-data rule


@dataclass(frozen=True)
class _Record:
    """Known keys as fields, the rest in ``extras``, and the key order they were read in."""

    KEYS: ClassVar[Dict[str, str]] = {}  # JSON key -> field name, in the order a new record writes them
    NESTED: ClassVar[Dict[str, Any]] = {}  # JSON key -> record class of a nested object

    extras: Mapping[str, Any] = field(default_factory=dict, repr=False)
    order: Tuple[str, ...] = field(default=(), repr=False, compare=False)
    # keys that were present (even as null): a key read as null is written back as null, an absent one stays absent
    present: Tuple[str, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def _read(cls, data: Mapping[str, Any] | None) -> Dict[str, Any]:
        data = dict(data or {})
        values: Dict[str, Any] = {}
        for key, name in cls.KEYS.items():
            if key in data:
                value = data[key]
                nested = cls.NESTED.get(key)
                values[name] = nested.from_dict(value) if nested is not None and isinstance(value, dict) else value
        values["extras"] = {k: v for k, v in data.items() if k not in cls.KEYS}
        values["order"] = tuple(data)
        values["present"] = tuple(k for k in data if k in cls.KEYS)
        return values

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Any:
        return cls(**cls._read(data))

    def with_extras(self, **extras: Any) -> Any:
        """A copy with these keys set among the extras (a key already there keeps its place in the JSON)."""
        return replace(self, extras={**self.extras, **extras})

    def get(self, key: str, default: Any = None) -> Any:
        """The value under JSON ``key`` (a named field or an extra), as the manifest holds it."""
        name = self.KEYS.get(key)
        if name is not None:
            value = getattr(self, name)
            if value is None and key not in self.present:
                return default
            return value.to_dict() if isinstance(value, _Record) else value
        return self.extras.get(key, default)

    def to_dict(self) -> Dict[str, Any]:
        """The JSON object: the keys as read, in their order; then fields set since, then new extras."""
        out: Dict[str, Any] = {}
        wanted = list(self.order) + [k for k in self.KEYS if k not in self.order] + [k for k in self.extras if k not in self.order]
        for key in wanted:
            if key in self.KEYS:
                value = getattr(self, self.KEYS[key])
                if value is None and key not in self.present:
                    continue
                out[key] = value.to_dict() if isinstance(value, _Record) else value
            elif key in self.extras:
                out[key] = self.extras[key]
        return out


@dataclass(frozen=True)
class DataFile(_Record):
    """A large graph's external data file (its weights), verified with the graph."""

    KEYS: ClassVar[Dict[str, str]] = {"file": "file", "sha256": "sha256", "bytes": "bytes"}

    file: str = ""
    sha256: Optional[str] = None
    bytes: Optional[int] = None


@dataclass(frozen=True)
class ArtifactRecord(_Record):
    """One graph of the bundle (manifest["artifacts"][name]): its file, digest, size, external data file, the
    graph it was made from and the gate it passed; what one precision adds (fp16's blocked ops, int8's
    calibration, the cpu variant's fusion) stays in ``extras``."""

    KEYS: ClassVar[Dict[str, str]] = {"file": "file", "sha256": "sha256", "bytes": "bytes", "data": "data",
                                      "derived_from": "derived_from", "target": "target", "gate": "gate"}
    NESTED: ClassVar[Dict[str, Any]] = {"data": DataFile}

    file: str = ""
    sha256: Optional[str] = None
    bytes: Optional[int] = None
    data: Optional[DataFile] = None
    derived_from: Optional[str] = None  # sha256 of the fp32 graph this one was made from (variants)
    target: Optional[str] = None  # the runtime an int8 graph was made for ("tensorrt", "cpu")
    gate: Optional[Mapping[str, Any]] = None

    @property
    def passed(self) -> bool:
        """True when the record carries a gate that passed (the cpu variant's accuracy gate)."""
        return bool((self.gate or {}).get("passed"))


@dataclass(frozen=True)
class EngineRecord(_Record):
    """An engine built into engines/<target> (manifest["engines"][target]): the plan's digest, the graph it
    was built from, and what it was built with; the rest (profiles, DLA, build time) in ``extras``."""

    KEYS: ClassVar[Dict[str, str]] = {"dir": "dir", "plan_sha256": "plan_sha256", "source_sha256": "source_sha256",
                                      "source_precision": "source_precision", "precision": "precision",
                                      "tensorrt": "tensorrt", "gpu_name": "gpu_name", "compute_capability": "compute_capability"}

    dir: Optional[str] = None
    plan_sha256: Optional[str] = None
    source_sha256: Optional[str] = None
    source_precision: Optional[str] = None
    precision: Optional[str] = None
    tensorrt: Optional[str] = None
    gpu_name: Optional[str] = None
    compute_capability: Any = None


@dataclass(frozen=True)
class WeightsIdentity(_Record):
    """Where the weights came from (manifest["source"]["weights"]): origin (hf-hub, checkpoint, builtin,
    local-dir, url, random), the file read and its sha256, the hub revision, or the seed of random weights.
    ``of_source`` folds in the keys bundles wrote before this record (weights_sha256, random_init ...)."""

    KEYS: ClassVar[Dict[str, str]] = {"origin": "origin", "file": "file", "sha256": "sha256", "seed": "seed",
                                      "repo_id": "repo_id", "revision": "revision", "requested_revision": "requested_revision",
                                      "shards": "shards", "url": "url", "config": "config"}

    origin: Optional[str] = None
    file: Optional[str] = None
    sha256: Optional[str] = None
    seed: Optional[int] = None
    repo_id: Optional[str] = None
    revision: Optional[str] = None
    requested_revision: Optional[str] = None
    shards: Optional[list] = None
    url: Optional[str] = None
    config: Optional[Mapping[str, Any]] = None  # random weights on a hub architecture: where its config came from
    random: bool = field(default=False, compare=False)  # origin "random", or an older bundle's random_init flag

    @classmethod
    def of_source(cls, source: Mapping[str, Any] | None) -> "WeightsIdentity":
        """The identity a manifest's ``source`` records, with an older bundle's flat keys as fallbacks."""
        source = source or {}
        values = cls._read(source.get("weights") or {})
        random = values.get("origin") == "random" or bool(source.get("random_init"))
        # a normalised view: to_dict of it writes the fallbacks too (from_dict of the weights record round-trips)
        if not values.get("sha256") and source.get("weights_sha256") is not None:
            values["sha256"] = values.get("sha256") or source.get("weights_sha256")
        if "seed" not in values and source.get("random_init_seed") is not None:
            values["seed"] = source.get("random_init_seed")
        return cls(random=random, **values)


@dataclass(frozen=True)
class GraphRecord(_Record):
    """What the manifest core says about the graph itself (manifest["graph"]): the precision it computes in,
    its inputs and outputs and what each output holds, the ONNX tensors of PyTorch modules (check's
    localisation, calibration's units) and of the patch embedding (the protocol check); the rest
    (opset, simplify_*, a pass's own notes such as fp16 or quantization) in ``extras``."""

    KEYS: ClassVar[Dict[str, str]] = {"precision": "precision", "inputs": "inputs", "outputs": "outputs",
                                      "output_details": "output_details", "module_outputs": "module_outputs",
                                      "patch_embed": "patch_embed", "variant": "variant", "derived_from": "derived_from"}

    precision: Optional[str] = None
    inputs: Optional[list] = None
    outputs: Optional[list] = None
    output_details: Optional[Mapping[str, Any]] = None
    module_outputs: Optional[Mapping[str, Any]] = None
    patch_embed: Optional[Mapping[str, Any]] = None
    variant: Optional[str] = None
    derived_from: Optional[str] = None

    def output_detail(self, name: str) -> Mapping[str, Any]:
        """What one output holds (shape, read-out, norm ...); empty when the manifest does not say."""
        return (self.output_details or {}).get(name) or {}


@dataclass(frozen=True)
class StorageRecord(_Record):
    """The bundle's storage rule (manifest["storage"]): the weight size above which later passes write a
    graph with external data, as the export chose it (None: the environment's default applies)."""

    KEYS: ClassVar[Dict[str, str]] = {STORAGE_THRESHOLD: "external_data_threshold"}

    external_data_threshold: Optional[int] = None


# -- readers of a manifest (already checked by vitdeploy.manifest, or an old one read for its records) --
def artifacts_of(manifest: Mapping[str, Any] | None) -> Dict[str, ArtifactRecord]:
    """Every artifact record, by key (precisions and variants), in the manifest's order."""
    arts = (manifest or {}).get("artifacts") or {}
    return {k: ArtifactRecord.from_dict(v) for k, v in arts.items() if isinstance(v, dict)}


def artifact_of(manifest: Mapping[str, Any] | None, key: str) -> Optional[ArtifactRecord]:
    record = ((manifest or {}).get("artifacts") or {}).get(key)
    return ArtifactRecord.from_dict(record) if isinstance(record, dict) else None


def engines_of(manifest: Mapping[str, Any] | None) -> Dict[str, EngineRecord]:
    """Every engine record, by target, in the manifest's order (an entry that is not an object: an empty record,
    listed so that its engine is reported as unusable rather than skipped)."""
    engines = (manifest or {}).get("engines") or {}
    return {k: EngineRecord.from_dict(v if isinstance(v, dict) else {}) for k, v in engines.items()}


def set_artifact(manifest: Dict[str, Any], key: str, record: ArtifactRecord) -> None:
    """Write one artifact record into a manifest (a dict being built or loaded)."""
    manifest.setdefault("artifacts", {})[key] = record.to_dict()


def set_engines(manifest: Dict[str, Any], engines: Mapping[str, EngineRecord]) -> None:
    """Write the engine records of a manifest (replacing those it held)."""
    manifest["engines"] = {target: engine.to_dict() for target, engine in engines.items()}


def set_storage(manifest: Dict[str, Any], storage: StorageRecord) -> None:
    manifest["storage"] = storage.to_dict()


def graph_of(manifest: Mapping[str, Any] | None) -> GraphRecord:
    """The graph record of a manifest or a manifest core (empty for one that records nothing about its graph)."""
    graph = (manifest or {}).get("graph")
    return GraphRecord.from_dict(graph if isinstance(graph, dict) else {})


def storage_of(manifest: Mapping[str, Any] | None) -> StorageRecord:
    return StorageRecord.from_dict((manifest or {}).get("storage") or {})


def weights_of(manifest: Mapping[str, Any] | None) -> WeightsIdentity:
    """The weights identity of a manifest (its ``source``)."""
    return WeightsIdentity.of_source((manifest or {}).get("source"))


def record_fields(cls: type) -> Tuple[str, ...]:
    """The field names a record class declares (its JSON keys' fields), for docs and tests."""
    return tuple(f.name for f in fields(cls) if f.name not in ("extras", "order", "present"))
