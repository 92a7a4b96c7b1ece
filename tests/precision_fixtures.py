"""Session fixtures for the precision tests: ViTs that fail reduced precision like real ones.

Built by calibration/stress_models.py (the construction is documented there): the trained digits
model with LayerNorm-output outliers (K = 64, 2 channels per norm1/norm2), with a massive residual
stream (C = 8192: past fp16's range), and with one planted block fault (blocks.2, K = 512, 4
channels); and a random-weight depth-2 timm ViT-Tiny with the same edits for the graph mechanics
(timm's graph: bias-free linears after onnxslim, shared LayerNorm initializers, a Gemm head).
Each is written as a checkpoint once per session and exported through ``export_cached``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

CHECK_IMAGES = 8  # the export's own verification against PyTorch (the tests compare graphs themselves)
TIMM = "timm:vit_tiny_patch16_224"


DIGITS_KINDS = ("outliers", "massive", "block-fault")
TIMM_KINDS = ("plain", "outliers", "massive")


# The checkpoints live in the run's shared artifact cache, not in a worker's temp folder: the exports are
# keyed on their paths, so one folder for every worker and every module that imports these fixtures
# means each variant is exported once per run (and reused by the next run while the code is unchanged).
@pytest.fixture(scope="session")
def variant_checkpoints(shared_artifact: Any) -> dict[str, Path]:
    def build(root: Path) -> None:
        from vitdeploy.calibration.stress_models import digits_variant, write_reference_checkpoint

        for kind in DIGITS_KINDS:
            model, config, record = digits_variant(kind)
            write_reference_checkpoint(model, config, record, root / f"digits-{kind}.safetensors")

    root = shared_artifact(["precision-variants", DIGITS_KINDS], build)
    return {kind: root / f"digits-{kind}.safetensors" for kind in DIGITS_KINDS}


def _export(export_cached: Any, checkpoints: dict[str, Path], kind: str, **options: Any) -> Any:
    return export_cached(f"ref:{checkpoints[kind]}", check_images=CHECK_IMAGES, **options)


@pytest.fixture(scope="session")
def outlier_bundle(export_cached: Any, variant_checkpoints: dict[str, Path]) -> Any:
    return _export(export_cached, variant_checkpoints, "outliers")


@pytest.fixture(scope="session")
def massive_bundle(export_cached: Any, variant_checkpoints: dict[str, Path]) -> Any:
    return _export(export_cached, variant_checkpoints, "massive")


@pytest.fixture(scope="session")
def fault_bundle(export_cached: Any, variant_checkpoints: dict[str, Path]) -> Any:
    return _export(export_cached, variant_checkpoints, "block-fault")


@pytest.fixture(scope="session")
def timm_variants(shared_artifact: Any) -> dict[str, Path]:
    """Depth-2 timm ViT-Tiny state dicts: random weights (seeded), with outliers, with a massive stream."""

    def build(root: Path) -> None:
        import torch

        from vitdeploy.calibration.stress_models import plant_massive_residual, plant_outliers, write_timm_checkpoint
        from vitdeploy.exporters.sources import load_source

        for kind in TIMM_KINDS:
            torch.manual_seed(0)
            model = load_source(TIMM, model_kwargs={"depth": 2}, random_init=True).model
            record: dict[str, Any] = {"kind": "plain"}
            if kind == "outliers":
                record = plant_outliers(model, 64.0)
            elif kind == "massive":
                record = plant_massive_residual(model, 2.0**15)
            write_timm_checkpoint(model, record, root / f"tiny2-{kind}.safetensors")

    root = shared_artifact(["timm-variants", TIMM, TIMM_KINDS], build)
    return {kind: root / f"tiny2-{kind}.safetensors" for kind in TIMM_KINDS}


def export_timm(export_cached: Any, paths: dict[str, Path], kind: str) -> Any:
    return export_cached(TIMM, checkpoint=str(paths[kind]), model_kwargs={"depth": 2}, check_images=2)
