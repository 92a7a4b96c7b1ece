"""Fixtures and helpers for the `vitdeploy report` tests: a digits bundle carrying the smallest real
evidence (check, evaluate, an occlusion map, profile), built once per run, and the reader that
resolves a page number's ``data-src`` back to the JSON value it claims to show."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
from click.testing import CliRunner

# the smallest runs that still leave every record the page reads (one check, one transform, four occlusion maps,
# one profile cell): what they cost is the session's, once per run
EVIDENCE_STEPS = (
    ("check", "--precision", "fp32", "--limit", "40", "--images", "8", "--threads", "1"),
    ("evaluate", "--suite", "jpeg", "--severity", "jpeg=30", "--limit", "40", "--threads", "1"),
    ("evaluate", "--occlusion-map", "digits:test", "--limit", "4", "--threads", "1"),
    ("profile", "--precision", "fp32", "--backend", "ort", "--batch", "1", "--iterations", "3", "--warmup", "1", "--threads", "1"),
)


def run_cli(*args: str) -> Any:
    from vitdeploy.cli import main

    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture(scope="session")
def evidence_bundle(digits_bundle: Any, shared_artifact: Callable[..., Path]) -> Path:
    """The trained digits bundle (fp32) with reports/check.json, evaluate.json + PNGs, occlusion/ and profile.json."""

    def build(folder: Path) -> None:
        target = folder / "bundle"
        shutil.copytree(digits_bundle.root, target)
        for command, *args in EVIDENCE_STEPS:
            result = run_cli(command, str(target), *args)
            assert result.exit_code == 0, result.output

    return shared_artifact(["report-evidence/1", str(digits_bundle.root), EVIDENCE_STEPS], build) / "bundle"


def copy_of(bundle_root: Path, tmp_path: Path, name: str = "bundle") -> Path:
    dst = tmp_path / name
    shutil.copytree(bundle_root, dst)
    return dst


def resolve(bundle_root: Path, src: str) -> Any:
    """The value a ``data-src`` names: ``FILE#/json/pointer`` inside the bundle, or ``cost-model:HxW#key``."""
    where, _, pointer = src.partition("#")
    if where.startswith("cost-model:"):
        from vitdeploy.bundle import Bundle
        from vitdeploy.costs import vit_costs

        h, w = (int(v) for v in where.split(":", 1)[1].split("x"))
        c = vit_costs(Bundle.open(bundle_root).spec, h, w, 1)
        return {"seq_len": c.seq_len, "gmacs": c.macs_total / 1e9, "attention_share": c.attention_share, "mparams": c.params / 1e6}[pointer]
    node: Any = json.loads((bundle_root / where).read_text(encoding="utf-8"))
    for token in pointer.lstrip("/").split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node


def check_numbers(bundle_root: Path, numbers: list[tuple[str, str, str, str]]) -> set[str]:
    """Every (data-src, data-value, data-fmt, shown text) equals its JSON source; returns the files the numbers came from."""
    assert numbers, "the page shows no sourced numbers"
    files = set()
    for src, value, spec, text in numbers:
        truth = resolve(bundle_root, src)
        assert json.loads(value) == pytest.approx(truth, rel=1e-12, abs=0), src
        assert text.strip() == format(truth, spec), (src, text, truth)
        files.add(src.partition("#")[0].split(":")[0])
    return files
