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
from pathlib import Path
from typing import Any

from .errors import UserError
from .fileio import atomic_write_json, atomic_write_text
from .spec import ViTSpec

FORMAT = "vitdeploy-bundle/1"
MANIFEST = "manifest.json"
LABELS = "labels.txt"
METADATA_KEY = "vitdeploy.manifest"
# "cpu" is not a precision: the fp32 graph with ONNX Runtime's fused attention, for CPU targets only
# (`vitdeploy convert --target cpu`; vitdeploy.runtime.fused). TensorRT always gets the plain graph.
ARTIFACT_FILES = {"fp32": "model.onnx", "fp16": "model.fp16.onnx", "int8": "model.int8.onnx", "cpu": "model.cpu.onnx"}
PRECISIONS = ("fp32", "fp16", "int8")

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
                manifest = json.loads(mpath.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise UserError(f"{mpath} is unreadable or not JSON ({exc}); re-export the bundle") from None
            if manifest.get("format") != FORMAT:
                raise UserError(f"{mpath} has format {manifest.get('format')!r}, expected {FORMAT!r}")
            return cls(path, manifest)
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
        """Precisions whose graph is present, in fp32, fp16, int8 order."""
        if self.bare_onnx is not None:
            return [self.manifest.get("graph", {}).get("precision", "fp32")]
        arts = self.manifest.get("artifacts", {})
        return [p for p in PRECISIONS if p in arts and (self.root / arts[p]["file"]).is_file()]

    def artifact_path(self, precision: str = "fp32") -> Path:
        if self.bare_onnx is not None:
            have = self.manifest.get("graph", {}).get("precision", "fp32")
            if precision != have:
                raise UserError(f"{self.bare_onnx} is a {have} graph; no {precision} graph (use a bundle folder)")
            return self.bare_onnx
        record = self.manifest.get("artifacts", {}).get(precision)
        if record is None or not (self.root / record["file"]).is_file():
            hint = {
                "fp32": "re-export it with `vitdeploy export`",
                "fp16": "create it with `vitdeploy convert --precision fp16` or `export --precision fp16`",
                "int8": "create it with `vitdeploy calibrate`",
            }.get(precision, "")
            raise UserError(f"bundle {self.root} has no {precision} graph; {hint}")
        from .onnx_io import check_files

        # the external data file (large graphs): present and of the recorded size (hashes: onnx_io.check_files)
        problems = check_files(self.root, {"file": record["file"], "data": record["data"]}, hashes=False) if record.get("data") else []
        if problems:
            raise UserError(f"bundle {self.root}: {problems[0]} (the weights of {record['file']}); copy the data file together "
                            f"with the graph, or re-create the {precision} graph")
        return self.root / record["file"]

    def artifact_record(self, precision: str) -> dict[str, Any]:
        return dict(self.manifest.get("artifacts", {}).get(precision, {}))

    # -- writing -----------------------------------------------------------------------------
    def _require_folder(self) -> None:
        if self.bare_onnx is not None:
            raise UserError(f"{self.bare_onnx} is a bare ONNX file; this step writes into a bundle folder (export with -o DIR)")

    def save(self) -> None:
        self._require_folder()
        atomic_write_json(self.root / MANIFEST, self.manifest)

    def add_artifact(self, precision: str, file: Path, record: dict[str, Any] | None = None) -> None:
        """Record a graph that is already in place (written atomically by its producer)."""
        self._require_folder()
        from .onnx_io import file_record

        # the producer's record when it hashed the files as it wrote them (onnx_io.save), else read them:
        # the graph, and its external data file when it has one
        rec = dict(record or {}) if (record or {}).get("sha256") else {**file_record(file), **(record or {})}
        rec["file"] = file.name
        self.manifest.setdefault("artifacts", {})[precision] = rec
        # A new graph invalidates what was measured or built from the old one.
        self.drop_stale_records()
        self.save()

    def set_record(self, key: str, value: Any) -> None:
        self._require_folder()
        self.manifest.setdefault("records", {})[key] = value
        self.save()

    def reports_dir(self) -> Path:
        return self.root / "reports"

    def drop_stale_records(self) -> None:
        """Forget engines and reports made from a graph whose hash no longer matches."""
        shas = {rec.get("sha256") for rec in self.manifest.get("artifacts", {}).values()}
        engines = self.manifest.get("engines", {})
        for target in list(engines):
            if engines[target].get("source_sha256") not in shas:
                del engines[target]
        records = self.manifest.get("records", {})
        for key in list(records):
            rec = records[key]
            if isinstance(rec, dict) and rec.get("graph_sha256") and rec["graph_sha256"] not in shas:
                del records[key]


def write_labels(path: Path, labels: list[str]) -> None:
    atomic_write_text(path, "".join(f"{label}\n" for label in labels))


def read_labels(path: str | Path, expected: int | None = None) -> list[str]:
    """Labels file: one label per line, index order. Checks count and duplicates."""
    path = Path(path)
    try:
        labels = [line.rstrip("\r\n") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError as exc:
        raise UserError(f"cannot read labels file {path}: {exc.strerror}") from None
    if expected is not None and len(labels) != expected:
        raise UserError(f"labels file {path} has {len(labels)} labels but the model's head has {expected} classes")
    dupes = sorted({label for label in labels if labels.count(label) > 1})
    if dupes:
        raise UserError(f"labels file {path} repeats labels: {', '.join(dupes[:5])}")
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
    return json.loads(props[METADATA_KEY])


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
