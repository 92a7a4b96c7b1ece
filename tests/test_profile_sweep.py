"""`vitdeploy profile` end to end: a tiny reference ViT exported by vitdeploy (dynamic H/W, uint8
NHWC in) with a fp32 and an int8 graph; a 2 x 2 x 2 matrix on ONNX Runtime, the torch backend beside
it, the reports' schema, the MAC column against the cost model, and bad input refused in one line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from vitdeploy.bundle import Bundle
from vitdeploy.cli import main
from vitdeploy.costs import vit_costs
from vitdeploy.profile import SweepConfig, plan_cells, run_sweep
from vitdeploy.profile.report import COLUMNS, SCHEMA, to_csv, to_json
from vitdeploy.spec import ViTSpec

SPEC = ViTSpec(image_size=(32, 32), patch_size=(8, 8), embed_dim=32, depth=2, num_heads=2, num_classes=10)
FAST = ["--iterations", "3", "--warmup", "1", "--threads", "1"]


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny reference ViT checkpoint (random weights): tiny.safetensors + tiny.json."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    from vitdeploy.model import VisionTransformer

    work = tmp_path_factory.mktemp("profile")
    torch.manual_seed(0)
    model = VisionTransformer(SPEC)
    for param in model.parameters():
        torch.nn.init.normal_(param, std=0.05)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(work / "tiny.safetensors"))
    (work / "tiny.json").write_text(json.dumps({
        "spec": SPEC.to_dict(),
        "preprocessing": {"mean": [0.5] * 3, "std": [0.5] * 3, "scale": "1/255"},
        "labels": [str(i) for i in range(SPEC.num_classes)],
    }))
    return work / "tiny.safetensors"


@pytest.fixture(scope="module")
def tiny_bundle(tiny_weights: Path) -> Path:
    """The tiny ViT exported by vitdeploy's exporter with a dynamic H/W, plus an int8 graph so the
    matrix has two precisions."""
    from vitdeploy.exporters import ExportOptions, export

    root = tiny_weights.parent / "tiny"
    export(f"ref:{tiny_weights}", root, ExportOptions(dynamic_resolution=True, check=False, simplify=False))
    # int8 weights through ORT's dynamic quantisation (MatMulInteger): enough for a second precision
    # in the matrix; accuracy is not what this test is about.
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(root / "model.onnx"), str(root / "model.int8.onnx"), weight_type=QuantType.QInt8)
    Bundle.open(root).add_artifact("int8", root / "model.int8.onnx")
    return root


@pytest.mark.slow
def test_cli_sweep_writes_schema_and_matches_the_cost_model(tiny_bundle: Path):
    # a fixed width: the header words are asserted, and a narrower console (a pytest-xdist worker's) wraps them
    res = CliRunner(env={"COLUMNS": "160"}).invoke(main, ["profile", str(tiny_bundle), "--resolutions", "32,48", "--batch", "1,2",
                                                          "--precision", "fp32,int8", "--backend", "ort", *FAST])
    assert res.exit_code == 0, res.output
    assert "p50 ms" in res.output and "GEMM peak" in res.output, res.output
    reports = tiny_bundle / "reports"

    with open(reports / "profile.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == list(COLUMNS)
        rows = list(reader)
    assert len(rows) == 2 * 2 * 2
    assert {(r["precision"], r["height"], r["batch"]) for r in rows} == {
        (p, h, b) for p in ("fp32", "int8") for h in ("32", "48") for b in ("1", "2")}
    for r in rows:
        h, w, b = int(r["height"]), int(r["width"]), int(r["batch"])
        cost = vit_costs(SPEC, h, w, b)
        assert int(r["macs"]) == cost.macs_total  # the MAC column is the cost model's, exactly
        assert int(r["flops"]) == 2 * cost.macs_total
        assert int(r["seq_len"]) == cost.seq_len
        assert r["status"] == "ok" and r["device"] == "cpu" and r["threads"] == "1"
        assert int(r["iterations"]) == 3 and int(r["warmup"]) == 1
        p50, p90, p99, mn = (float(r[k]) for k in ("p50_ms", "p90_ms", "p99_ms", "min_ms"))
        assert 0 < mn <= p50 <= p90 <= p99
        gflops = float(r["achieved_gflops"])
        assert gflops == pytest.approx(cost.flops_total / (p50 / 1e3) / 1e9, rel=1e-3)
        assert float(r["peak_share"]) == pytest.approx(gflops / float(r["peak_gflops"]), rel=1e-3)
        assert float(r["throughput_ips"]) > 0 and float(r["startup_s"]) > 0 and float(r["peak_rss_mb"]) > 0
        assert r["gpu_mem_mb"] == ""  # no GPU here: empty, not zero

    report = json.loads((reports / "profile.json").read_text())
    assert report["schema"] == SCHEMA
    assert set(report) >= {"created", "bundle", "config", "machine", "peaks", "cost_model", "columns", "cells"}
    assert list(report["columns"]) == list(COLUMNS)
    assert report["cost_model"]["crossover_seq_len"] == (2 + SPEC.mlp_ratio) * SPEC.embed_dim
    assert report["machine"]["threads"] == 1 and report["machine"]["jetson"] is None
    assert any(p["library"].startswith("onnxruntime") for p in report["peaks"])
    assert all(set(c) >= set(COLUMNS) for c in report["cells"])
    assert [c["macs"] for c in report["cells"]] == [int(r["macs"]) for r in rows]

    png = (reports / "profile.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    record = Bundle.open(tiny_bundle).manifest["records"]["profile"]
    assert record["ok"] == 8 and record["failed"] == 0 and record["files"]["csv"] == "reports/profile.csv"


def test_torch_backend_beside_ort(tiny_bundle: Path, tmp_path: Path):
    res = CliRunner().invoke(main, ["profile", str(tiny_bundle), "--resolutions", "32,48", "--precision", "fp32,int8",
                                    "--backend", "ort,torch", "--device", "cpu", "--no-plot", "-o", str(tmp_path), *FAST])
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "profile.json").read_text())["cells"]
    status = {(r["backend"], r["precision"], r["height"]): r["status"] for r in rows}
    assert status == {("ort", "fp32", 32): "ok", ("ort", "fp32", 48): "ok", ("ort", "int8", 32): "ok", ("ort", "int8", 48): "ok",
                      ("torch", "fp32", 32): "ok", ("torch", "fp32", 48): "ok",
                      ("torch", "int8", 32): "skipped", ("torch", "int8", 48): "skipped"}
    torch_rows = [r for r in rows if r["backend"] == "torch" and r["status"] == "ok"]
    assert all(r["device"] == "cpu" and r["threads"] == 1 and r["p50_ms"] > 0 for r in torch_rows)
    ort_macs = {r["height"]: r["macs"] for r in rows if r["backend"] == "ort"}
    assert all(r["macs"] == ort_macs[r["height"]] for r in rows)  # the cost model does not depend on the backend


@pytest.mark.slow
def test_static_graph_is_reexported_per_resolution_and_cached(tiny_weights: Path):
    from vitdeploy.exporters import ExportOptions, export

    root = tiny_weights.parent / "tiny-static"
    export(f"ref:{tiny_weights}", root, ExportOptions(check=False, simplify=False))  # static 32x32
    args = ["profile", str(root), "--resolutions", "32,48", "--no-plot", *FAST]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    rows = json.loads((root / "reports" / "profile.json").read_text())["cells"]
    graphs = {r["height"]: r["graph"] for r in rows}
    assert graphs[32] == "model.onnx"  # the native size runs the bundle's own graph
    assert graphs[48].startswith("variants/") and (root / graphs[48]).is_file()  # 48x48: re-exported, table interpolated
    assert all(r["status"] == "ok" for r in rows)
    cached = (root / graphs[48]).stat().st_mtime_ns
    assert CliRunner().invoke(main, args).exit_code == 0
    assert (root / graphs[48]).stat().st_mtime_ns == cached  # the second profile reuses the cached variant


def test_library_sweep_skips_impossible_cells_with_a_reason(tiny_bundle: Path):
    bundle = Bundle.open(tiny_bundle)
    config = SweepConfig(resolutions=[(32, 32)], batches=[1], precisions=["int8"], backends=["torch"], iterations=2, warmup=0)
    cells = plan_cells(bundle, config)
    assert [c.skip_reason is not None for c in cells] == [True]
    result = run_sweep(bundle, config)
    row = result.rows[0]
    assert row["status"] == "skipped" and "no int8 path" in row["note"]
    assert row["macs"] == vit_costs(SPEC, 32, 32, 1).macs_total and row.get("p50_ms") is None
    # Skipped cells still serialise: empty CSV fields, null JSON values.
    line = to_csv(result).splitlines()[1].split(",")
    assert line[list(COLUMNS).index("p50_ms")] == ""
    assert to_json(result)["cells"][0]["p50_ms"] is None


def test_interleaved_rounds_time_every_cell(tiny_bundle: Path):
    bundle = Bundle.open(tiny_bundle)
    rounds_seen = []
    config = SweepConfig(resolutions=[(32, 32), (48, 48)], batches=[2], precisions=["fp32"], iterations=7, rounds=3, warmup=1, threads=1)
    result = run_sweep(bundle, config, on_round=lambda r, n: rounds_seen.append((r, n)))
    assert rounds_seen == [(0, 3), (1, 3), (2, 3)]
    assert [r["status"] for r in result.rows] == ["ok", "ok"]
    for row in result.rows:
        assert row["iterations"] == 7  # 3 + 2 + 2 over the rounds
        assert row["rss_scope"] == "sweep" and row["rss_added_mb"] is not None
        assert 0 < row["min_ms"] <= row["p50_ms"] <= row["p99_ms"]
    assert result.config["rounds"] == 3


def test_json_flag_prints_the_report_and_output_dir(tiny_bundle: Path, tmp_path: Path):
    import os

    out = tmp_path / "elsewhere"
    mask = os.sched_getaffinity(0)
    res = CliRunner().invoke(main, ["profile", str(tiny_bundle), "--precision", "fp32", "--json", "--no-plot", "--pin", "-o", str(out), *FAST])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output[res.output.index("{"):])
    assert report["schema"] == SCHEMA and len(report["cells"]) == 1
    assert report["machine"]["pinned_cpus"] == sorted(mask)[:1] and os.sched_getaffinity(0) == mask  # pinned, then restored
    cell = report["cells"][0]
    assert (cell["height"], cell["width"], cell["batch"]) == (32, 32, 1)  # defaults: native size, batch 1
    assert (out / "profile.csv").is_file() and (out / "profile.json").is_file() and not (out / "profile.png").exists()


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [  # 2: the command line cannot mean anything (usage); 1: it cannot run on this bundle or machine
        (["--resolutions", "36"], "height 36 is not a multiple of the patch size 8 (nearest valid: 32 or 40)", 1),
        (["--backend", "onnx"], "unknown backend 'onnx'; choose from ort, torch, tensorrt", 2),
        (["--precision", "fp4"], "unknown precision 'fp4'", 2),  # fp8 is a registered precision (vitdeploy/precisions.py)
        (["--precision", "fp8"], "has no fp8 graph", 1),
        (["--precision", "fp16"], "has no fp16 graph", 1),
        (["--backend", "tensorrt"], "needs an NVIDIA GPU", 1),
        (["--iterations", "5", "--duration", "1"], "not both", 2),
        (["--warmup", "-1"], "warm-up must be >= 0", 2),
        (["--rounds", "1"], "--rounds must be >= 2", 2),
        (["--rounds", "3", "--duration", "1"], "does not combine with --duration", 2),
        (["--rounds", "3", "--iterations", "2"], "fewer than --rounds", 2),
    ],
)
def test_bad_input_is_one_line_and_exit_1(tiny_bundle: Path, args: list[str], message: str, code: int):
    if "tensorrt" in args and Path("/dev/nvidia0").exists():
        pytest.skip("this machine has a GPU")
    res = CliRunner().invoke(main, ["profile", str(tiny_bundle), *args, "--no-plot", "-o", str(tiny_bundle / "bad")])
    assert res.exit_code == code, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], res.output
    assert "Traceback" not in res.output


def test_missing_bundle_is_one_line(tmp_path: Path):
    res = CliRunner().invoke(main, ["profile", str(tmp_path / "nope")])
    assert res.exit_code == 1 and res.output.count("\n") == 1 and "does not exist" in res.output


def test_tensorrt_cells_pick_the_engine_whose_profile_holds_them(tiny_bundle: Path, tmp_path: Path):
    import shutil

    from vitdeploy.fileio import atomic_write_json
    from vitdeploy.profile.cells import tensorrt_engine_for
    from vitdeploy.profile.plan import Cell, SkipCell

    root = tmp_path / "with-engines"
    shutil.copytree(tiny_bundle, root)
    for target, hw_max in (("small", 32), ("large", 64)):
        atomic_write_json(root / "engines" / target / "engine.json", {
            "precision": "fp16", "profiles": [{"batch": [1, 4, 8], "height": [32, 32, hw_max], "width": [32, 32, hw_max]}]})
    bundle = Bundle.open(root)
    bundle.manifest["engines"] = {t: {"dir": f"engines/{t}", "precision": "fp16"} for t in ("small", "large")}
    bundle.save()
    bundle = Bundle.open(root)
    assert tensorrt_engine_for(bundle, Cell("tensorrt", "fp16", 32, 32, 8)).target == "large"  # first in name order that fits
    assert tensorrt_engine_for(bundle, Cell("tensorrt", "fp16", 64, 48, 1)).target == "large"
    with pytest.raises(SkipCell, match="batch 16 at 32x32"):
        tensorrt_engine_for(bundle, Cell("tensorrt", "fp16", 32, 32, 16))
    with pytest.raises(SkipCell, match=r"no int8 engine .*engines: none.*vitdeploy build-engine"):
        tensorrt_engine_for(bundle, Cell("tensorrt", "int8", 32, 32, 1))


def test_synthetic_batch_follows_the_graph_input(tiny_bundle: Path):
    """A cell's feeds are built by the bundle's input contract in the loaded graph's own input type."""
    from dataclasses import replace

    from vitdeploy.contract import InputContract

    contract = InputContract.from_bundle(Bundle.open(tiny_bundle))
    pixels = contract.random_feeds(2, 48, 32, seed=0, dtype="uint8")["images"]
    assert pixels.dtype == np.uint8 and pixels.shape == (2, 48, 32, 3) and pixels.max() > 200
    raw_contract = replace(contract, preprocessing={**contract.preprocessing, "input": "float-nchw"})
    raw = raw_contract.random_feeds(1, 32, 32, seed=0, dtype="float32")["images"]
    assert raw.dtype == np.float32 and raw.shape == (1, 3, 32, 32)
    assert contract.random_feeds(1, 32, 32, seed=0, dtype="float16")["images"].dtype == np.float16  # an fp16 graph's float input


@pytest.mark.gpu
def test_torch_cuda_fp16_cells_report_device_memory_and_gpu_peak(tiny_bundle: Path, tmp_path: Path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    res = CliRunner().invoke(main, ["profile", str(tiny_bundle), "--backend", "torch", "--precision", "fp16", "--device", "cuda",
                                    "--batch", "1,4", "--no-plot", "-o", str(tmp_path), *FAST])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "profile.json").read_text())
    assert report["machine"]["gpu"] == torch.cuda.get_device_name(0)
    assert {p["dtype"] for p in report["peaks"] if p["device"].startswith("cuda")} == {"fp32", "fp16"}
    for cell in report["cells"]:
        assert cell["status"] == "ok" and cell["device"].startswith("cuda")
        assert cell["gpu_mem_mb"] is not None and cell["peak_share"] > 0
