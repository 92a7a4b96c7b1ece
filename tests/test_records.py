"""Typed manifest records (vitdeploy.records, issue 37 item 4): read from a manifest and written back, a
record gives the same JSON, key order included, for every manifest the test fixtures write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vitdeploy.bundle import Bundle
from vitdeploy.records import (ArtifactRecord, EngineRecord, StorageRecord, WeightsIdentity, artifacts_of, engines_of, graph_of,
                               storage_of, weights_of)
from synthetic_bundle import fake_engine, make_bundle


def rewritten(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest with every typed part replaced by its record's to_dict (in place of the same key)."""
    out = dict(manifest)
    if "artifacts" in out:
        out["artifacts"] = {k: r.to_dict() for k, r in artifacts_of(manifest).items()}
    if "engines" in out:
        out["engines"] = {k: r.to_dict() for k, r in engines_of(manifest).items()}
    if "graph" in out:
        out["graph"] = graph_of(manifest).to_dict()
    if "storage" in out:
        out["storage"] = storage_of(manifest).to_dict()
    source = out.get("source")
    if isinstance(source, dict) and "weights" in source:
        out["source"] = {**source, "weights": WeightsIdentity.from_dict(source["weights"]).to_dict()}
    return out


def assert_round_trips(manifest: dict[str, Any]) -> None:
    assert json.dumps(rewritten(manifest), indent=2) == json.dumps(manifest, indent=2)


def test_synthetic_bundles_and_engines_round_trip(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b", fp16=True)
    fake_engine(bundle, "orin-fp16", "fp16")
    bundle = Bundle.open(bundle.root)
    manifest = json.loads((bundle.root / "manifest.json").read_text())
    assert set(manifest["artifacts"]) == {"fp32", "fp16"} and manifest["engines"]
    assert_round_trips(manifest)
    fp16 = bundle.artifact("fp16")
    assert isinstance(fp16, ArtifactRecord)
    assert fp16.file == "model.fp16.onnx" and fp16.sha256 == manifest["artifacts"]["fp16"]["sha256"]
    assert fp16.bytes == (bundle.root / "model.fp16.onnx").stat().st_size
    assert bundle.artifact("int8") is None and bundle.artifact_sha256("int8") is None
    assert bundle.graph.precision == "fp32" and bundle.graph.output_detail("embedding") == {}
    engine = bundle.engines()["orin-fp16"]
    assert isinstance(engine, EngineRecord) and engine.precision == "fp16" and engine.source_sha256 is None


def test_digits_export_round_trips(digits_bundle: Any) -> None:
    manifest = json.loads((digits_bundle.root / "manifest.json").read_text())
    assert_round_trips(manifest)
    weights = digits_bundle.weights
    assert weights.origin == "builtin" and weights.sha256 == manifest["source"]["weights"]["sha256"] and not weights.random


def test_every_cached_fixture_manifest_round_trips(digits_bundle: Any, artifact_cache: Any) -> None:
    """Every bundle manifest the fixtures left in this run's artifact cache (the digits export at least)."""
    cache = artifact_cache.root
    seen = 0
    for path in sorted(cache.rglob("manifest.json")):
        manifest = json.loads(path.read_text())
        if isinstance(manifest, dict) and manifest.get("format", "").startswith("vitdeploy-bundle"):
            assert_round_trips(manifest)
            seen += 1
    assert seen >= 1


def test_older_manifests_read_as_the_reader_tolerates() -> None:
    """Keys an older bundle lacks read as None and stay absent when written; a null stays null; unknown keys are kept."""
    record = {"sha256": "a" * 64, "file": "model.int8.onnx", "calibration": {"images": 8}, "bytes": None}
    art = ArtifactRecord.from_dict(record)
    assert art.data is None and art.derived_from is None and art.target is None and not art.passed
    assert art.get("target", "tensorrt") == "tensorrt" and art.get("calibration") == {"images": 8}
    assert list(art.to_dict()) == ["sha256", "file", "calibration", "bytes"] and art.to_dict() == record
    assert storage_of({}).external_data_threshold is None and storage_of({}).to_dict() == {}
    assert StorageRecord.from_dict({"external_data_threshold": 0}).external_data_threshold == 0
    old = weights_of({"source": {"kind": "timm", "name": "vit", "random_init": True, "random_init_seed": 3, "weights_sha256": "f" * 64}})
    assert old.random and old.seed == 3 and old.sha256 == "f" * 64 and old.origin is None
    new = weights_of({"source": {"weights": {"origin": "random", "seed": None}, "random_init_seed": 3}})
    assert new.random and new.seed is None  # the record's own seed key wins, as weights.py always read it


def test_new_records_write_their_fields_then_extras() -> None:
    art = ArtifactRecord(file="model.cpu.onnx", sha256="b" * 64, derived_from="c" * 64, gate={"passed": True},
                         extras={"fusion": {"attention": 2}})
    assert art.passed
    assert list(art.to_dict()) == ["file", "sha256", "derived_from", "gate", "fusion"]
    assert ArtifactRecord.from_dict(art.to_dict()) == art
    stamped = EngineRecord.from_dict({"dir": "engines/orin", "built_on": {"on": "old"}, "z": 1}).with_extras(built_on={"on": "new"})
    assert stamped.to_dict() == {"dir": "engines/orin", "built_on": {"on": "new"}, "z": 1}  # in place, as remote/session stamps it
    assert list(stamped.to_dict()) == ["dir", "built_on", "z"]
    assert StorageRecord(external_data_threshold=0).to_dict() == {"external_data_threshold": 0}  # what export writes
    with pytest.raises(AttributeError):
        art.file = "other.onnx"  # type: ignore[misc]  # frozen
