"""Graphs with external data (issue 32): vitdeploy.onnx_io, and every pass on a bundle whose graphs
keep their weights in ``<graph>.onnx.data`` (the threshold forced to 0 on small models), which must
give what the single-file bundle gives."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from vitdeploy import onnx_io, onnx_wire
from vitdeploy.bundle import Bundle
from vitdeploy.cli import main
from vitdeploy.errors import UserError
from vitdeploy.preprocess import random_images
from vitdeploy.runtime.ort import OrtRunner


def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def outputs(path: Path, images: np.ndarray) -> dict[str, np.ndarray]:
    return OrtRunner(path, providers=["CPUExecutionProvider"], threads=1).infer(images)


SINGLE_FILE = 1 << 40  # a threshold no test graph reaches: one file, whatever VITDEPLOY_EXTERNAL_DATA_THRESHOLD says


@pytest.fixture(scope="module")
def digits_graph(digits_bundle: Any) -> Any:
    """The trained digits model's fp32 graph, every weight in the message (as a single-file export
    parses; onnx.load of external data marks each tensor's location DEFAULT explicitly: cleared)."""
    model = onnx.load(str(digits_bundle.artifact_path("fp32")))
    for tensor in model.graph.initializer:
        tensor.ClearField("data_location")
    return model


# -- onnx_io -----------------------------------------------------------------------------------
def test_single_file_save_is_byte_identical_to_protobuf(digits_graph: Any, tmp_path: Path):
    record = onnx_io.save(digits_graph, tmp_path / "m.onnx", threshold_bytes=SINGLE_FILE)
    written = (tmp_path / "m.onnx").read_bytes()
    assert written == digits_graph.SerializeToString()  # the same bytes, so the same sha256 as before
    assert record == {"file": "m.onnx", "sha256": hashlib.sha256(written).hexdigest(), "bytes": len(written)}
    assert not (tmp_path / "m.onnx.data").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # no temporary file left


def test_external_save_names_hashes_and_runs_like_the_single_file(digits_graph: Any, tmp_path: Path):
    single = tmp_path / "single.onnx"
    onnx_io.save(digits_graph, single, threshold_bytes=SINGLE_FILE)
    record = onnx_io.save(digits_graph, tmp_path / "ext.onnx", threshold_bytes=0)
    graph, data = tmp_path / "ext.onnx", tmp_path / "ext.onnx.data"
    assert record["sha256"] == sha(graph) and record["bytes"] == graph.stat().st_size
    assert record["data"] == {"file": "ext.onnx.data", "sha256": sha(data), "bytes": data.stat().st_size}
    assert graph.stat().st_size < data.stat().st_size  # the weights moved out
    assert onnx_io.referenced_files(graph) == [data]
    assert onnx_io.file_record(graph) == record
    assert onnx_io.check_files(tmp_path, record) == []
    images = random_images(3, 32, 32, seed=4)
    a, b = outputs(single, images), outputs(graph, images)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    loaded = onnx_io.load(graph)
    for mine, theirs in zip(loaded.graph.initializer, digits_graph.graph.initializer):
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(mine), onnx.numpy_helper.to_array(theirs))
    small = [t for t in onnx_io.load(graph, weights=False).graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    assert small and all(onnx_io.tensor_bytes(t) < onnx_io.MIN_EXTERNAL_TENSOR_BYTES for t in small)


def test_threshold_rule_explicit_then_the_bundles_then_env_then_default(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(onnx_io.THRESHOLD_ENV, raising=False)
    assert onnx_io.threshold() == onnx_io.DEFAULT_THRESHOLD_BYTES == 1 << 30
    monkeypatch.setenv(onnx_io.THRESHOLD_ENV, "2MiB")
    assert onnx_io.threshold() == 2 << 20
    manifest = {"storage": {"external_data_threshold": 123}}  # the export's own --external-data-threshold
    assert onnx_io.threshold(manifest=manifest) == 123
    assert onnx_io.threshold(7, manifest) == 7
    assert [onnx_io.parse_size(t) for t in ("0", "512MiB", "1.5G", "2GB", "100k", 42)] == [0, 512 << 20, 3 << 29, 2 * 10**9, 102400, 42]
    for bad in ("-1", "ten", "1 parsec", ""):
        with pytest.raises(UserError, match="expected a size"):
            onnx_io.parse_size(bad)


def test_weightless_load_copies_through_and_renames(digits_graph: Any, tmp_path: Path):
    record = onnx_io.save(digits_graph, tmp_path / "a.onnx", threshold_bytes=0)
    structure = onnx_io.load(tmp_path / "a.onnx", weights=False)
    again = onnx_io.save(structure, tmp_path / "b" / "a.onnx", threshold_bytes=0, source_dir=tmp_path)
    assert again["sha256"] == record["sha256"] and again["data"]["sha256"] == record["data"]["sha256"]
    # the same graph as one file again, from the weightless model: byte-identical to protobuf's
    back = onnx_io.save(structure, tmp_path / "c.onnx", threshold_bytes=SINGLE_FILE, source_dir=tmp_path)
    assert back["sha256"] == hashlib.sha256(digits_graph.SerializeToString()).hexdigest()
    # copying under another name renames the data file after the new graph (the rule)
    renamed = onnx_io.copy(tmp_path / "a.onnx", tmp_path / "d.onnx")
    assert renamed["data"]["file"] == "d.onnx.data" and renamed["data"]["sha256"] == record["data"]["sha256"]
    assert onnx_io.referenced_files(tmp_path / "d.onnx") == [tmp_path / "d.onnx.data"]
    same = onnx_io.copy(tmp_path / "a.onnx", tmp_path / "e" / "a.onnx")
    assert same == record  # same name: the bytes as they are


def test_structure_analysis_needs_no_weights(digits_graph: Any, tmp_path: Path):
    onnx_io.save(digits_graph, tmp_path / "m.onnx", threshold_bytes=0)
    structure = onnx_io.load(tmp_path / "m.onnx", weights=False)
    mine = onnx_io.infer_shapes(structure, strict_mode=False)
    theirs = onnx.shape_inference.infer_shapes(digits_graph, strict_mode=False)
    assert {v.name: v.type for v in mine.graph.value_info} == {v.name: v.type for v in theirs.graph.value_info}
    onnx_io.check_model(structure, full_check=True)  # the checker never looks for the data file
    in_place = onnx_io.infer_shapes(onnx.load(str(tmp_path / "m.onnx")), in_place=True)
    assert len(in_place.graph.value_info) == len(theirs.graph.value_info)
    assert all(t.HasField("raw_data") for t in in_place.graph.initializer if onnx_io.tensor_bytes(t) >= 1024)


def _another_graph(graph: Any) -> Any:
    """A copy of ``graph`` that differs from it (its producer version), to overwrite it with."""
    changed = onnx.ModelProto()
    changed.CopyFrom(graph)
    changed.producer_version = "other"
    return changed


def test_interrupted_write_leaves_nothing_and_keeps_the_old_pair(digits_graph: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    old = onnx_io.save(digits_graph, tmp_path / "m.onnx", threshold_bytes=0)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real = onnx_wire.Hashing.write
    calls = {"n": 0}

    def failing(self: Any, data: bytes) -> None:
        calls["n"] += 1
        if calls["n"] > 5:
            raise KeyboardInterrupt  # Ctrl-C half way through the tensors
        real(self, data)

    monkeypatch.setattr(onnx_wire.Hashing, "write", failing)
    changed = _another_graph(digits_graph)
    with pytest.raises(KeyboardInterrupt):
        onnx_io.save(changed, tmp_path / "m.onnx", threshold_bytes=0)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temporary file, old pair intact
    assert onnx_io.check_files(tmp_path, old) == []


def test_a_signal_during_the_renames_waits_for_both(digits_graph: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    onnx_io.save(digits_graph, tmp_path / "m.onnx", threshold_bytes=0)
    real_replace = os.replace
    seen: list[str] = []

    def replace_then_ctrl_c(src: Any, dst: Any) -> None:
        real_replace(src, dst)
        seen.append(Path(dst).name)
        if len(seen) == 1:
            os.kill(os.getpid(), signal.SIGINT)  # between the data file's rename and the graph's

    monkeypatch.setattr(onnx_io.os, "replace", replace_then_ctrl_c)
    changed = _another_graph(digits_graph)
    with pytest.raises(KeyboardInterrupt):
        onnx_io.save(changed, tmp_path / "m.onnx", threshold_bytes=0)
    monkeypatch.setattr(onnx_io.os, "replace", real_replace)
    assert "m.onnx.data" in seen and "m.onnx" in seen  # both renamed before the interrupt was raised
    assert onnx_io.load(tmp_path / "m.onnx").producer_version == "other"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]


def test_switching_between_one_file_and_external_data_leaves_no_stale_file(digits_graph: Any, tmp_path: Path):
    onnx_io.save(digits_graph, tmp_path / "m.onnx", threshold_bytes=0)
    onnx_io.save(digits_graph, tmp_path / "m.onnx", threshold_bytes=SINGLE_FILE)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    onnx_io.save(digits_graph, tmp_path / "m.onnx", threshold_bytes=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]
    onnx_io.remove(tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


def test_a_missing_or_short_data_file_is_one_line(digits_graph: Any, tmp_path: Path):
    onnx_io.save(digits_graph, tmp_path / "m.onnx", threshold_bytes=0)
    (tmp_path / "m.onnx.data").unlink()
    with pytest.raises(UserError, match=r"keeps its weights in m.onnx.data, which is missing beside it"):
        onnx_io.load(tmp_path / "m.onnx")
    with pytest.raises(UserError, match="does not exist"):
        onnx_io.load(tmp_path / "nothing.onnx")


# -- every pass on an external-data bundle ---------------------------------------------------------
@pytest.fixture(scope="module")
def pair(export_cached: Any) -> dict[str, Any]:
    """The digits model exported twice, fp32 + fp16: one file per graph, and external data (threshold 0)."""
    return {"single": export_cached("builtin:digits", precisions=("fp32", "fp16"), check_images=16, external_data_threshold=SINGLE_FILE),
            "external": export_cached("builtin:digits", precisions=("fp32", "fp16"), check_images=16, external_data_threshold=0)}


def _files(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_file())


@pytest.mark.slow
def test_export_and_fp16_with_external_data_match_the_single_file_bundle(pair: dict[str, Any]):
    single, external = pair["single"], pair["external"]
    assert {"model.onnx.data", "model.fp16.onnx.data"} <= set(_files(external.root))
    assert not any(name.endswith(".data") for name in _files(single.root))
    assert external.manifest["storage"] == {"external_data_threshold": 0}
    for precision in ("fp32", "fp16"):
        record = external.artifact_record(precision)
        assert record["data"]["file"] == f"{record['file']}.data"
        assert onnx_io.check_files(external.root, record) == []  # graph and data file hashes, as recorded
    assert external.manifest["records"]["export_check"]["passed"]
    images = random_images(4, 32, 32, seed=9)
    for precision in ("fp32", "fp16"):
        a, b = outputs(single.artifact_path(precision), images), outputs(external.artifact_path(precision), images)
        assert all(np.array_equal(a[k], b[k]) for k in a)
    # the same graph either way: only the weights' place differs
    plain = onnx.load(str(single.artifact_path("fp16")))
    moved = onnx.load(str(external.artifact_path("fp16")))
    assert [n.op_type for n in plain.graph.node] == [n.op_type for n in moved.graph.node]


@pytest.mark.slow
def test_calibrate_and_cpu_graph_follow_the_bundles_rule(pair: dict[str, Any], copy_bundle: Any, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(onnx_io.THRESHOLD_ENV, raising=False)  # the rule comes from the manifest
    roots = {kind: copy_bundle(bundle, kind) for kind, bundle in pair.items()}
    for root in roots.values():
        for args in (["calibrate", str(root), "--samples", "64", "--method", "minmax"], ["convert", str(root), "--target", "cpu"]):
            result = CliRunner().invoke(main, args)
            assert result.exit_code == 0, result.output
    ext = Bundle.open(roots["external"])
    assert {"model.int8.onnx.data", "model.cpu.onnx.data"} <= set(_files(ext.root))
    assert not any(name.endswith(".data") for name in _files(roots["single"]) if "int8" in name or "cpu" in name)
    for key in ("int8", "cpu"):
        assert onnx_io.check_files(ext.root, ext.manifest["artifacts"][key]) == []
    images = random_images(4, 32, 32, seed=2)
    for name in ("model.int8.onnx", "model.cpu.onnx"):
        a, b = outputs(roots["single"] / name, images), outputs(ext.root / name, images)
        assert all(np.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert not list(ext.root.glob(".*"))  # no staging folder or temporary file left


@pytest.mark.slow
def test_lowering_lint_dla_and_check_read_external_graphs(pair: dict[str, Any], copy_bundle: Any):
    root = copy_bundle(pair["external"], "ext")
    for args in (["--dry-run", "--trt-version", "8.6", "--precision", "fp16"], ["--dry-run", "--trt-version", "8.5", "--precision", "fp32"],
                 ["--lint", "--trt-version", "8.5", "--precision", "fp16"], ["--dla-report", "--precision", "fp16"]):
        result = CliRunner().invoke(main, ["build-engine", str(root), *args])
        assert result.exit_code == 0, result.output
    bundle = Bundle.open(root)
    lowered = bundle.manifest["parser_graphs"]["fp16@trt8.6"]
    assert lowered["file"] == "model.fp16.trt8.6.onnx" and lowered["data"]["file"] == "model.fp16.trt8.6.onnx.data"
    assert onnx_io.check_files(root, lowered) == [] and lowered["verification"]["passed"]
    plan = json.loads((root / "reports" / "engine-plan-trt8.6.0-fp16.json").read_text())
    assert Path(plan["plan"]["parse_graph"]).name == "model.fp16.trt8.6.onnx"  # TensorRT parses it from its path
    result = CliRunner().invoke(main, ["check", str(root), "--limit", "64"])
    assert result.exit_code == 0, result.output
    report = json.loads((root / "reports" / "check.json").read_text())
    assert all(a["data"]["file"].endswith(".onnx.data") for a in report["artifacts"])
    # a data file that no longer matches the manifest is refused before anything runs, by name, in one line
    data = root / "model.fp16.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 1
    data.write_bytes(bytes(raw))
    result = CliRunner().invoke(main, ["check", str(root), "--limit", "16"])
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert "model.fp16.onnx.data is not the external data of the fp16 graph" in lines[0]


@pytest.mark.slow
def test_triton_repo_serve_signature_and_remote_listing_carry_the_data_file(pair: dict[str, Any], tmp_path: Path):
    from vitdeploy.remote import agent
    from vitdeploy.triton import TritonOptions, model_tensors, write_triton_repo

    bundle = pair["external"]
    model = write_triton_repo(bundle, tmp_path / "models", TritonOptions(backend="onnxruntime", kind="gpu", precision="fp16"))
    version = model / "1"
    assert sorted(p.name for p in version.iterdir()) == ["model.fp16.onnx.data", "model.onnx"]
    assert sha(version / "model.onnx") == bundle.artifact_record("fp16")["sha256"]  # the bundle's graph, byte for byte
    provenance = json.loads((model / "vitdeploy.json").read_text())
    assert provenance["graph_data"]["sha256"] == sha(version / "model.fp16.onnx.data")
    images = random_images(2, 32, 32, seed=1)
    a, b = outputs(version / "model.onnx", images), outputs(bundle.artifact_path("fp16"), images)  # the copy resolves its data
    assert all(np.array_equal(a[k], b[k]) for k in a)
    inputs, outs = model_tensors(bundle, TritonOptions(backend="onnxruntime", kind="cpu", precision="fp32"))  # what serve binds
    assert [t.name for t in inputs] == ["images"] and {t.name for t in outs} == {"logits", "probs"}
    listed = agent.walk_files(bundle.root)  # what --on copies to the device, by sha256 (agent.index)
    assert {"model.onnx", "model.onnx.data", "model.fp16.onnx", "model.fp16.onnx.data"} <= set(listed)


@pytest.mark.slow
def test_small_timm_vit_dynamic_with_external_data(export_cached: Any, copy_bundle: Any):
    bundle = export_cached("timm:deit_tiny_patch16_224", model_kwargs={"depth": 2}, num_classes=3, dynamic_resolution=True,
                           precisions=("fp32", "fp16"), check_images=4, external_data_threshold=0, random_init=True)
    assert bundle.manifest["records"]["export_check"]["passed"]
    assert all(onnx_io.check_files(bundle.root, bundle.artifact_record(p)) == [] for p in ("fp32", "fp16"))
    assert all(bundle.artifact_record(p).get("data") for p in ("fp32", "fp16"))
    root = copy_bundle(bundle, "deit")
    for args in (["calibrate", str(root), "--data", "digits:train", "--samples", "16", "--method", "minmax"],
                 ["convert", str(root), "--target", "cpu"],
                 ["build-engine", str(root), "--dry-run", "--trt-version", "8.6", "--precision", "int8"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
    after = Bundle.open(root)
    assert after.artifact_record("int8")["data"]["file"] == "model.int8.onnx.data"
    assert onnx_io.check_files(root, after.manifest["parser_graphs"]["int8@trt8.6"]) == []
    report = CliRunner().invoke(main, ["inspect", str(root)])
    assert "model.onnx.data" in report.output and "(external data)" in report.output


# -- export memory (issue 32) ------------------------------------------------------------------------
def test_an_export_that_cannot_fit_is_refused_with_what_would(digits_bundle: Any, monkeypatch: pytest.MonkeyPatch):
    """ViT-H/14's numbers: refused with the estimate, the machine's memory and what fits instead."""
    import vitdeploy.exporters.export_memory as memory
    from vitdeploy.exporters import ExportOptions

    weights, now = 2_530_000_000, 3_400_000_000  # a ViT-H/14 in a process that loaded it
    monkeypatch.setattr(memory, "model_weight_bytes", lambda _model: weights)
    monkeypatch.setattr(memory, "current_rss_bytes", lambda: now)
    variant = type("Loaded", (), {"model": None})()
    with pytest.raises(UserError) as refused:
        memory.check_export_fits(variant, digits_bundle, ExportOptions(), print, available=6_000_000_000)
    line = str(refused.value)
    assert "\n" not in line and "needs about" in line and f"this machine has {memory.gib(now + 6_000_000_000)} for it" in line
    assert "what would fit: --no-simplify" in line and "--no-check --no-simplify" in line
    fits = memory.check_export_fits(variant, digits_bundle, ExportOptions(), print, available=20_000_000_000)
    assert fits["weights_bytes"] == weights and now + 2 * weights < fits["estimated_peak_bytes"] < now + 20_000_000_000
    with pytest.raises(UserError, match="nothing smaller fits either"):
        memory.check_export_fits(variant, digits_bundle, ExportOptions(), print, available=100_000_000)


def test_the_estimate_orders_the_options(monkeypatch: pytest.MonkeyPatch):
    from vitdeploy.exporters.export_memory import estimate_peak

    now, w = 2 << 30, 1 << 30
    verified = estimate_peak(now, w, check=True, simplify=True, activation_bytes=100 << 20)
    assert estimate_peak(now, w, True, False, 100 << 20) < verified  # no onnxslim copy
    assert estimate_peak(now, w, False, False, 0) <= estimate_peak(now, w, True, False, 100 << 20)
    assert estimate_peak(now, w, False, True, 0) > verified  # --no-check: onnxslim's identity check runs two sessions


@pytest.mark.slow
def test_the_exporter_no_longer_keeps_the_pytorch_model_alive(monkeypatch: pytest.MonkeyPatch):
    """onnxscript's rewrite rules kept the last graph they matched, and with it every parameter."""
    import gc
    import weakref

    import torch

    import vitdeploy.exporters.process_memory as process_memory

    monkeypatch.setattr(process_memory, "RELEASE_ABOVE_BYTES", 0)  # as in a process holding a ViT-L

    from vitdeploy.exporters.graph import DeployGraph
    from vitdeploy.exporters.onnx_export import export_graph
    from vitdeploy.exporters.sources import load_source

    loaded = load_source("builtin:digits")
    module = DeployGraph(loaded.model, loaded.preprocessing).eval()
    probe = weakref.ref(next(loaded.model.parameters()))
    proto, _ = export_graph(module, torch.zeros(2, 32, 32, 3, dtype=torch.uint8), dynamic_hw=False)
    assert len(proto.graph.node) > 10
    del module, loaded
    gc.collect()
    assert probe() is None


def test_onnxslim_keeps_no_node_of_the_graph_it_simplified(digits_graph: Any, monkeypatch: pytest.MonkeyPatch):
    import gc

    import vitdeploy.exporters.process_memory as process_memory

    monkeypatch.setattr(process_memory, "RELEASE_ABOVE_BYTES", 0)  # as in a process holding a ViT-L

    from vitdeploy.exporters.onnx_export import run_onnxslim

    slim, record = run_onnxslim(digits_graph)
    assert slim is not None and record["applied"]
    matchers = [obj for obj in gc.get_objects() if str(getattr(type(obj), "__module__", "")).startswith("onnxslim.")
                and any(c.__name__ == "PatternMatcher" for c in type(obj).__mro__)]
    assert matchers  # the registry's matchers exist, and none keeps a node of the graph it matched
    assert [name for m in matchers for name in m.__dict__.get("pattern_dict", {}) if name in m.__dict__] == []


def test_a_small_process_skips_the_heap_walks(monkeypatch: pytest.MonkeyPatch):
    """Each walk costs about 0.3 s with torch loaded; under the threshold nothing is walked or cleared."""
    import vitdeploy.exporters.process_memory as process_memory
    from vitdeploy.exporters.onnx_export import release_rewriter_matches, release_simplifier_matches

    monkeypatch.setattr(process_memory, "RELEASE_ABOVE_BYTES", 1 << 50)
    assert not process_memory.worth_releasing() and release_rewriter_matches() == 0 and release_simplifier_matches() == 0
    monkeypatch.setattr(process_memory, "RELEASE_ABOVE_BYTES", 0)
    assert process_memory.worth_releasing() and 0 < process_memory.current_rss_bytes() <= process_memory.peak_rss_bytes()


def test_a_bad_threshold_is_one_line(tmp_path: Path):
    result = CliRunner().invoke(main, ["export", "-o", str(tmp_path / "b"), "--external-data-threshold", "ten"])
    assert result.exit_code == 1
    assert result.output.strip().count("\n") == 0 and "--external-data-threshold 'ten': expected a size" in result.output
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_export_cli_writes_the_pair_and_prints_the_peak(tmp_path: Path):
    result = CliRunner().invoke(main, ["export", "-o", str(tmp_path / "b"), "--external-data-threshold", "0", "--check-images", "2"])
    assert result.exit_code == 0, result.output
    assert "model.onnx.data" in result.output and "peak resident memory of this process" in result.output
    bundle = Bundle.open(tmp_path / "b")
    assert _files(bundle.root) == ["labels.txt", "manifest.json", "model.onnx", "model.onnx.data"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]  # no staging folder, no exporter's temporary graph
