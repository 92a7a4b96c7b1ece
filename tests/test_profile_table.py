"""`profile`'s terminal table: fits 120 columns by default with no wrapped cell, skipped cells as one
summary line, failures one line each; --wide keeps every column and every cell."""

from __future__ import annotations

import io

from rich.console import Console

from vitdeploy.costs import vit_costs
from vitdeploy.profile.gemm_probe import PeakProbe
from vitdeploy.profile.report import TABLE_WIDTH, render_table, skipped_summary
from vitdeploy.profile.sweep import SweepResult
from vitdeploy.spec import ViTSpec

SPEC = ViTSpec(image_size=(224, 224), patch_size=(16, 16), embed_dim=384, depth=12, num_heads=6, num_classes=1000)
SIZES = [(160, 160), (224, 224), (288, 288), (384, 384)]


def _row(backend: str, precision: str, h: int, w: int, batch: int, status: str, note: str = "") -> dict:
    cost = vit_costs(SPEC, h, w, batch)
    row = {"backend": backend, "torch_mode": "eager" if backend == "torch" else None, "precision": precision,
           "height": h, "width": w, "batch": batch, "status": status, "note": note, "seq_len": cost.seq_len,
           "macs": cost.macs_total, "attention_share": cost.attention_share}
    if status == "ok":
        p50 = cost.macs_total * 2 / 60e9 * 1e3
        row.update({"p50_ms": p50, "p90_ms": p50 * 1.1, "p99_ms": p50 * 1.3, "cv": 0.123 if h == 384 else 0.02,
                    "unstable": h == 384, "throughput_ips": batch / p50 * 1e3, "achieved_gflops": 60.0, "peak_share": 0.5,
                    "startup_s": 1.23, "peak_rss_mb": 12345.0, "rss_added_mb": 1234.0})
    return row


def _result() -> SweepResult:
    rows = []
    for backend, precision in (("ort", "fp32"), ("ort", "int8"), ("torch", "fp32"), ("torch", "int8"), ("torch", "fp16")):
        for h, w in SIZES:
            for batch in (1, 64):
                if backend == "torch" and precision == "int8":
                    rows.append(_row(backend, precision, h, w, batch, "skipped",
                                     "PyTorch eager has no int8 path; the int8 graph is measured on ort/tensorrt"))
                elif backend == "torch" and precision == "fp16":
                    rows.append(_row(backend, precision, h, w, batch, "skipped", "PyTorch fp16 eager is a GPU baseline; no GPU here"))
                elif precision == "int8" and h == 288 and batch == 64:
                    rows.append(_row(backend, precision, h, w, batch, "failed", "ONNX Runtime failed on input uint8 [64, 288, 288, 3]: out of memory"))
                else:
                    rows.append(_row(backend, precision, h, w, batch, "ok"))
    peaks = [PeakProbe("cpu", "fp32", "onnxruntime", 1024, 2, 5, 0.01, 120.0)]
    return SweepResult(bundle={"name": "a-long-bundle-name-vit_small_patch16_224-dynamic"},
                       config={"cv_threshold": 0.10}, machine={"cpu": "AMD EPYC 9R14 96-Core Processor", "threads": 2},
                       peaks=peaks, cost_model={"crossover_seq_len": 1536.0}, rows=rows, started="", wall_s=1.0)


def _render(wide: bool, width: int = 200) -> list[str]:
    buf = io.StringIO()
    render_table(_result(), Console(file=buf, width=width, soft_wrap=False, color_system=None), wide=wide)
    return buf.getvalue().splitlines()


def test_default_table_fits_120_columns_one_line_per_cell():
    lines = _render(wide=False)
    table_lines = [line for line in lines if line.startswith(("ort ", "torch "))]
    assert max(len(line) for line in lines if not line.startswith(("skipped", "failed"))) <= TABLE_WIDTH
    # every measured or failed cell is exactly one line; skipped cells are not rows
    ok_or_failed = [r for r in _result().rows if r["status"] != "skipped"]
    assert len(table_lines) == len(ok_or_failed)
    assert sum(1 for line in lines if line.startswith("skipped ")) == 1
    summary = next(line for line in lines if line.startswith("skipped "))
    assert "skipped 16 of 40 cells" in summary and "torch eager int8 x8" in summary and "torch eager fp16 x8" in summary
    failed = [line for line in lines if line.startswith("failed: ")]
    assert failed == ["failed: ort int8 288x288 b64: ONNX Runtime failed on input uint8 [64, 288, 288, 3]: out of memory"]
    assert any("12.3%*" in line for line in table_lines), "unstable cells are marked"


def test_default_table_fits_a_120_column_terminal_without_wrapping():
    lines = _render(wide=False, width=TABLE_WIDTH)
    ok_or_failed = [r for r in _result().rows if r["status"] != "skipped"]
    rows = [line for line in lines if line.lstrip().startswith(("ort ", "torch "))]
    assert len(rows) == len(ok_or_failed)
    assert "p50 ms" in "\n".join(lines) and "GEMM peak" in "\n".join(lines)


def test_wide_table_keeps_every_cell_and_note():
    lines = _render(wide=True, width=400)
    text = "\n".join(lines)
    assert "p90 ms" in text and "start s" in text and "note" in text
    assert text.count("skipped: PyTorch eager has no int8 path") == 8


def test_skipped_summary_is_empty_without_skipped_cells():
    assert skipped_summary([r for r in _result().rows if r["status"] != "skipped"]) == ""
