"""Mixup in scripts/train_digits.py: the soft-label loss reproduces the chapter's worked number, and
a mixed batch combines inputs and labels with the same lambda."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_digits.py"


@pytest.fixture(scope="module")
def train() -> object:
    spec = importlib.util.spec_from_file_location("train_digits", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_soft_label_loss_reproduces_the_chapter(train) -> None:
    # lambda = 0.7: labels mix to (0.7, 0.3); the model predicts (0.8, 0.2)
    lam = 0.7
    targets = lam * torch.tensor([[1.0, 0.0]]) + (1 - lam) * torch.tensor([[0.0, 1.0]])
    logits = torch.log(torch.tensor([[0.8, 0.2]]))  # softmax(log p) = p
    loss = float(train.soft_cross_entropy(logits, targets))
    assert loss == pytest.approx(-0.7 * math.log(0.8) - 0.3 * math.log(0.2), abs=1e-6)
    assert round(loss, 4) == 0.6390
    # cross-entropy is linear in the target: the mixed loss is the lambda-weighted sum of the two
    ce = torch.nn.functional.cross_entropy
    split = lam * ce(logits, torch.tensor([0])) + (1 - lam) * ce(logits, torch.tensor([1]))
    assert loss == pytest.approx(float(split), abs=1e-6)


def test_mixup_batch_mixes_inputs_and_labels_with_one_lambda(train) -> None:
    x = torch.arange(4 * 3 * 2 * 2, dtype=torch.float32).reshape(4, 3, 2, 2)
    y = train.soft_targets(torch.tensor([0, 1, 2, 3]), 4, 0.0)
    mixed_x, mixed_y, lam = train.mixup_batch(x, y, 0.4, np.random.default_rng(0), torch.Generator().manual_seed(0))
    assert 0.0 <= lam <= 1.0
    partners = []
    for i in range(4):
        weights = mixed_y[i]
        assert float(weights.sum()) == pytest.approx(1.0)
        others = [k for k in range(4) if k != i and float(weights[k]) > 0]
        j = others[0] if others else i  # label k is image k's class, so the partner shows in the labels
        assert float(weights[i]) == pytest.approx(lam if j != i else 1.0)
        assert torch.allclose(mixed_x[i], lam * x[i] + (1 - lam) * x[j])  # same lambda for pixels and labels
        partners.append(j)
    assert sorted(partners) == [0, 1, 2, 3]  # a permutation of the batch
    smooth = train.soft_targets(torch.tensor([2]), 10, 0.1)
    assert float(smooth[0, 2]) == pytest.approx(0.91) and float(smooth.sum()) == pytest.approx(1.0)


@pytest.mark.slow
def test_training_with_mixup_runs_and_records_it(train, tmp_path: Path) -> None:
    config = train.main(["--epochs", "1", "--limit", "64", "--mixup", "0.4", "--threads", "1", "--out", str(tmp_path)])
    assert config["training"]["mixup_alpha"] == 0.4 and "Mixup" in config["training"]["augmentation"]
    assert (tmp_path / "digits.safetensors").is_file()
    with pytest.raises(SystemExit, match="--mixup ALPHA must be >= 0"):
        train.main(["--mixup", "-1", "--out", str(tmp_path)])
