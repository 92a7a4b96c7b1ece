"""The bundle: one folder that every command reads and adds to.

    bundle/
      manifest.json      spec + preprocessing + labels + hashes + every record below
      model.onnx         fp32 graph, uint8 NHWC in, logits/probs out; metadata_props = manifest core
      model.fp16.onnx    mixed-precision graph                      (precision pass)
      model.int8.onnx    explicit Q/DQ graph                        (calibrate)
      model.cpu.onnx     fp32 graph with ORT-fused attention, CPUs  (convert --target cpu)
      labels.txt         one label per line, index order
      engines/<target>/  model.plan + engine.json                  (build-engine)
      reports/           check.json, profile.csv/json/png          (check / profile)

A bare ``.onnx`` written by vitdeploy is self-describing: its ``metadata_props`` hold the manifest
core under ``vitdeploy.manifest``, so every command also accepts one.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from .errors import IntegrityError, UsageError, UserError
from .fileio import atomic_write_json, atomic_write_text, sha256_cached, sweep_bundle
from .manifest import FORMAT, is_embedding_model, model_kind, validate_bundle_manifest, validate_core
from .precisions import ARTIFACT_FILES, BY_NAME, NAMES, REGISTRY, listing, writers_text  # noqa: F401 - ARTIFACT_FILES re-exported
from .precisions import manifest_record as precision_record
from .records import (ArtifactRecord, EngineRecord, GraphRecord, StorageRecord, WeightsIdentity, artifact_of, artifacts_of, engines_of,
                      graph_of, storage_of, weights_of)
from .spec import ViTSpec

MANIFEST = "manifest.json"
LABELS = "labels.txt"
METADATA_KEY = "vitdeploy.manifest"
# Graph files by manifest["artifacts"] key: the precisions and the backend variants ("cpu": the fp32 graph with
# ONNX Runtime's fused attention, `vitdeploy convert --target cpu`), all from vitdeploy.precisions.
PRECISIONS = NAMES

# Keys of the manifest that are bound into the ONNX file itself (the "manifest core"): everything
# needed to run and interpret the graph. Records of later steps (engines, reports) stay outside.
CORE_KEYS = ("format", "vitdeploy_version", "source", "spec", "preprocessing", "labels", "resolution", "graph")


def core_of(manifest: dict[str, Any]) -> dict[str, Any]:
    return {k: manifest[k] for k in CORE_KEYS if k in manifest}


class Bundle:
    """A bundle folder (or a bare vitdeploy ONNX file) and its manifest."""

    def __init__(self, root: Path, manifest: dict[str, Any], bare_onnx: Path | None = None):
        self.root = root
        self.manifest = manifest
        self.bare_onnx = bare_onnx

    # -- opening -----------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path) -> "Bundle":
        path = Path(path)
        if path.is_dir():
            mpath = path / MANIFEST
            if not mpath.is_file():
                raise UserError(f"{path} is not a vitdeploy bundle (no {MANIFEST}); create one with `vitdeploy export -o {path}`")
            try:
                manifest = json.loads(mpath.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
                raise UserError(f"{mpath} is unreadable or not JSON ({exc}); re-export the bundle") from None
            sweep_bundle(path)  # what a killed command (SIGKILL, power cut) left in it
            return cls(path, validate_bundle_manifest(manifest, str(mpath)))
        if path.is_file() and path.suffix == ".onnx":
            return cls(path.parent, read_onnx_manifest(path), bare_onnx=path)
        if not path.exists():
            raise UserError(f"{path} does not exist; give a bundle folder or a .onnx written by vitdeploy")
        raise UserError(f"{path} is neither a bundle folder nor a .onnx file")

    # -- views -------------------------------------------------------------------------------
    @property
    def spec(self) -> ViTSpec:
        return ViTSpec.from_dict(self.manifest["spec"])

    @property
    def labels(self) -> list[str]:
        return list(self.manifest.get("labels") or [])

    @property
    def embedding_model(self) -> bool:
        """No class scores among the graph's declared outputs (manifest.is_embedding_model): a CLIP/SigLIP
        tower or a backbone. Label-based checks and metrics do not apply to it."""
        return is_embedding_model(self.graph.outputs)

    @property
    def embedding_width(self) -> int | None:
        """d of the embedding output as the manifest declares it ([batch, d]); None without one."""
        shape = self.graph.output_detail("embedding").get("shape")
        return int(shape[-1]) if shape and isinstance(shape[-1], int) else None

    def kind(self) -> str:
        """'an embedding model (512-d embedding, no classes)' or 'N classes' (manifest.model_kind)."""
        return model_kind(self.graph.outputs, self.embedding_width, len(self.labels))

    @property
    def preprocessing(self) -> dict[str, Any]:
        return self.manifest["preprocessing"]

    @property
    def variable_size(self) -> dict[str, Any] | None:
        """The (images, valid_hw) contract of a --variable-size bundle; None for single-size graphs."""
        return self.manifest["preprocessing"].get("variable_size")

    @property
    def resolution(self) -> dict[str, Any]:
        return self.manifest["resolution"]

    @property
    def name(self) -> str:
        return self.manifest.get("name") or self.root.name

    def precisions(self) -> list[str]:
        """Precisions whose graph is present, in registry order (fp32 first)."""
        if self.bare_onnx is not None:
            return [self.graph.get("precision", "fp32")]
        arts = self.manifest.get("artifacts", {})
        return [p for p in PRECISIONS if p in arts and (self.root / arts[p]["file"]).is_file()]

    def artifact_path(self, precision: str = "fp32") -> Path:
        if self.bare_onnx is not None:
            have = self.graph.get("precision", "fp32")
            if precision != have:
                raise UserError(f"{self.bare_onnx} is a {have} graph; no {precision} graph (use a bundle folder)")
            return self.bare_onnx
        record = self.manifest.get("artifacts", {}).get(precision)
        if record is None or not (self.root / record["file"]).is_file():
            hint = BY_NAME[precision].make_hint if precision in BY_NAME else ""
            raise UserError(f"bundle {self.root} has no {precision} graph; {hint}")
        path = self.root / record["file"]
        self.verify_file(path, record["sha256"], f"{precision} graph")
        data = record.get("data")
        if data:  # a large graph's external data file: the weights, verified like the graph
            data_path = self.root / data["file"]
            if not data_path.is_file():
                raise UserError(f"bundle {self.root}: {data['file']} is missing (the weights of {record['file']}); copy the data file "
                                f"together with the graph, or re-create the {precision} graph")
            self.verify_file(data_path, data["sha256"], f"external data of the {precision} graph")
        return path

    def verify_file(self, path: Path, recorded: str, what: str) -> str:
        """The file's sha256 (cached by file identity), refused in one line when it is not the recorded one:
        a graph swapped in from another bundle, or edited after its checks, is never run as this one."""
        measured = sha256_cached(path)
        if measured != recorded:
            raise IntegrityError(f"{path} is not the {what} this bundle's manifest vouches for (sha256 {measured[:12]}… on disk, "
                                 f"{recorded[:12]}… recorded): it was changed or copied in from elsewhere; re-export the "
                                 "bundle, or put back the file that came with it")
        return measured

    def artifact_record(self, precision: str) -> dict[str, Any]:
        return dict(self.manifest.get("artifacts", {}).get(precision, {}))

    # -- typed records (vitdeploy.records): what consumers read instead of the JSON layout ---------------
    def artifact(self, key: str) -> ArtifactRecord | None:
        """The record of one graph (a precision or a variant such as ``cpu``); None when the bundle has none."""
        return artifact_of(self.manifest, key)

    def artifacts(self) -> dict[str, ArtifactRecord]:
        """Every graph's record, by key, in the manifest's order (whether the file is present or not)."""
        return artifacts_of(self.manifest)

    def artifact_sha256(self, key: str) -> str | None:
        """The recorded sha256 of one graph; None when the bundle has no such graph."""
        record = self.artifact(key)
        return record.sha256 if record else None

    def engines(self) -> dict[str, EngineRecord]:
        """The engines built into engines/<target>, by target, in the manifest's order."""
        return engines_of(self.manifest)

    @property
    def graph(self) -> GraphRecord:
        """What the manifest core says about the graph: precision, inputs, outputs and what each holds ..."""
        return graph_of(self.manifest)

    @property
    def weights(self) -> WeightsIdentity:
        """Where the weights came from (the manifest's source.weights, with an older bundle's flat keys)."""
        return weights_of(self.manifest)

    @property
    def storage(self) -> StorageRecord:
        """The bundle's storage rule (external-data threshold chosen at export)."""
        return storage_of(self.manifest)

    # -- writing -----------------------------------------------------------------------------
    def _require_folder(self) -> None:
        if self.bare_onnx is not None:
            raise UserError(f"{self.bare_onnx} is a bare ONNX file; this step writes into a bundle folder (export with -o DIR)")

    def save(self) -> None:
        self._require_folder()
        atomic_write_json(self.root / MANIFEST, self.manifest)

    def add_artifact(self, precision: str, file: Path, record: dict[str, Any] | ArtifactRecord | None = None) -> None:
        """Record a graph that is already in place (written atomically by its producer)."""
        self._require_folder()
        from .onnx_io import file_record

        if isinstance(record, ArtifactRecord):
            record = record.to_dict()
        # the producer's record when it hashed the files as it wrote them (onnx_io.save), else read them:
        # the graph, and its external data file when it has one
        rec = dict(record or {}) if (record or {}).get("sha256") else {**file_record(file), **(record or {})}
        rec["file"] = file.name
        self.manifest.setdefault("artifacts", {})[precision] = rec
        # A new graph invalidates what was measured or built from the old one.
        self.drop_stale_records()
        self.save()

    def record_engine(self, target: str, record: dict[str, Any] | EngineRecord) -> None:
        """Record an engine built into engines/<target>, with the precisions' "best" order from the registry,
        which readers without vitdeploy (the C++ host library's classify) choose an engine by."""
        self._require_folder()
        if isinstance(record, EngineRecord):
            record = record.to_dict()
        self.manifest.setdefault("engines", {})[target] = record
        self.manifest["precisions"] = precision_record()
        self.save()

    def set_record(self, key: str, value: Any) -> None:
        self._require_folder()
        self.manifest.setdefault("records", {})[key] = value
        self.save()

    def reports_dir(self) -> Path:
        return self.root / "reports"

    def drop_stale_records(self) -> None:
        """Forget engines and reports made from a graph whose hash no longer matches."""
        shas = {rec.sha256 for rec in self.artifacts().values()}
        engines = self.manifest.get("engines", {})
        for target, engine in self.engines().items():
            if engine.source_sha256 not in shas:
                del engines[target]
        records = self.manifest.get("records", {})
        for key in list(records):
            rec = records[key]
            if isinstance(rec, dict) and rec.get("graph_sha256") and rec["graph_sha256"] not in shas:
                del records[key]


def refuse_export_precisions(requested: tuple[str, ...] | list[str]) -> None:
    """`export --precision` writes fp32 and fp16; say where every other name comes from, or that it doesn't."""
    exported = [p.name for p in REGISTRY if p.exported]
    unknown = sorted(set(requested) - set(exported))
    calibrated = [p for p in unknown if p in BY_NAME and "calibrate" in BY_NAME[p].passes]
    if calibrated:
        raise UsageError(f"export writes {listing(exported)} graphs; {calibrated[0]} needs calibration images: export, then run "
                         "`vitdeploy calibrate BUNDLE --data DIR`")
    if unknown:
        raise UsageError(f"--precision {','.join(unknown)}: not a precision vitdeploy writes; it writes {writers_text()}")


def write_labels(path: Path, labels: list[str]) -> None:
    atomic_write_text(path, "".join(f"{label}\n" for label in labels))


def read_labels(path: str | Path, expected: int | None = None) -> list[str]:
    """Labels file: one label per line, index order, UTF-8; blank lines are skipped.

    Repeated display names are legitimate (ImageNet-1k names classes 134 and 517 both "crane"):
    a label file maps indices to names, so what matters is the count and the order, not uniqueness.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot read labels file {path}: {exc.strerror or exc.__class__.__name__}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"labels file {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8, one label per line") from None
    labels = [line.rstrip("\r\n") for line in text.splitlines() if line.strip()]
    if expected is not None and len(labels) != expected:
        raise UserError(f"labels file {path} has {len(labels)} labels but the model's head has {expected} classes")
    return labels


def read_onnx_manifest(path: Path) -> dict[str, Any]:
    """The manifest core stored in a vitdeploy ONNX file's metadata_props."""
    from .lazy import require

    onnx = require("onnx", "reading ONNX metadata")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError and friends
        raise UserError(f"{path} is not a readable ONNX file ({exc.__class__.__name__})") from None
    props = {p.key: p.value for p in model.metadata_props}
    if METADATA_KEY not in props:
        raise UserError(f"{path} carries no vitdeploy metadata; export it with `vitdeploy export`")
    try:
        manifest = json.loads(props[METADATA_KEY])
    except ValueError as exc:
        raise UserError(f"{path}: its {METADATA_KEY} metadata is not JSON ({exc}); re-export it with `vitdeploy export`") from None
    return validate_core(manifest, f"{path} (metadata {METADATA_KEY})")


def embed_manifest(model: Any, manifest: dict[str, Any]) -> None:
    """Bind the manifest core into an onnx.ModelProto's metadata_props (in place).

    Besides the full JSON under ``vitdeploy.manifest``, a few flat keys make the contract readable
    by tools that don't parse JSON (Netron, onnx.helper printouts).
    """
    core = copy.deepcopy(core_of(manifest))
    flat = {
        METADATA_KEY: json.dumps(core, sort_keys=True),
        "vitdeploy.version": str(core.get("vitdeploy_version", "")),
        "vitdeploy.source": json.dumps(core.get("source", {}), sort_keys=True),
        "vitdeploy.labels": json.dumps(core.get("labels", [])),
        "vitdeploy.preprocessing": json.dumps(core.get("preprocessing", {}), sort_keys=True),
        # each output's meaning (shape, read-out, norm, grid order, dropped tokens)
        "vitdeploy.outputs": json.dumps(core.get("graph", {}).get("output_details")
                                        or {n: {} for n in core.get("graph", {}).get("outputs", [])}, sort_keys=True),
    }
    keep = [p for p in model.metadata_props if not p.key.startswith("vitdeploy.")]
    del model.metadata_props[:]
    for p in keep:
        model.metadata_props.add(key=p.key, value=p.value)
    for key, value in flat.items():
        model.metadata_props.add(key=key, value=value)


# What an export may replace. A bundle folder holds only what vitdeploy wrote: these names, the graph
# files (model.onnx, model.<precision>.onnx and the 8.x lowerings, their external data), and the files
# the manifest records. engines/, reports/ and variants/ are vitdeploy's own sub-folders.
BUNDLE_NAMES = (MANIFEST, LABELS, "engines", "reports", "variants")
GRAPH_NAME = re.compile(r"model(\.[A-Za-z0-9_.-]+)?\.onnx(\.data)?|model(\.[A-Za-z0-9_.-]+)?\.data")
ATOMIC_TEMP = re.compile(r"\..+\.tmp")  # left by a write that was killed before its rename
OWN_HIDDEN = re.compile(r"\.vitdeploy[-\w.]*")  # e.g. the --on copies' .vitdeploy-hashes.json


def _first_file(folder: Path) -> str:
    """A file inside ``folder`` to name in a refusal: a top-level one if there is one."""
    entries = sorted(folder.iterdir(), key=lambda p: (p.is_dir() and not p.is_symlink(), p.name))
    for entry in entries:
        if not entry.is_dir() or entry.is_symlink():
            return entry.name
        inner = _first_file(entry)
        if inner:
            return f"{entry.name}/{inner}"
    return entries[0].name + "/" if entries else ""


def check_export_target(out_dir: Path) -> None:
    """Export writes only into a new folder, an empty one, or a vitdeploy bundle (replaced whole): refuse,
    in one line naming a file that would be lost, any folder that holds something vitdeploy did not write."""
    here = Path.cwd().resolve()
    if out_dir == here or out_dir in here.parents:
        raise UsageError(f"-o {out_dir} is the folder you are in (or holds it): export replaces that folder whole; "
                         "give a new folder name, e.g. -o bundle")
    if not out_dir.exists() and not out_dir.is_symlink():
        return
    if not out_dir.is_dir() or out_dir.is_symlink():
        raise UserError(f"-o {out_dir} is {'a link' if out_dir.is_symlink() else 'a file'}, not a folder; "
                        "give a new folder, an empty one or an existing bundle (nothing was written)")
    entries = sorted(out_dir.iterdir())
    if not entries:
        return
    manifest_path = out_dir / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.is_file() else None
    except (OSError, UnicodeDecodeError, ValueError):
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UserError(f"-o {out_dir} is not empty and is not a vitdeploy bundle (it holds {_first_file(out_dir)}): export "
                        "would replace the whole folder; choose a new or empty folder, or move those files away (nothing was written)")
    recorded = {rec.get("file") for rec in (manifest.get("artifacts") or {}).values() if isinstance(rec, dict)}
    recorded |= {rec.get("file") for rec in (manifest.get("parser_graphs") or {}).values() if isinstance(rec, dict)}
    for entry in entries:
        name = entry.name
        ours = (name in BUNDLE_NAMES and (entry.is_dir() == (name not in (MANIFEST, LABELS))) and not entry.is_symlink()) \
            or name in recorded or (GRAPH_NAME.fullmatch(name) and entry.is_file()) or ((ATOMIC_TEMP.fullmatch(name) or OWN_HIDDEN.fullmatch(name)) and entry.is_file())
        if not ours:
            shown = f"{name}/{_first_file(entry)}".rstrip("/") if entry.is_dir() and not entry.is_symlink() else name
            raise UserError(f"-o {out_dir} is a vitdeploy bundle but also holds {shown}, which vitdeploy did not write; re-export "
                            "replaces the whole folder, so move it out first or choose another -o (nothing was written)")
