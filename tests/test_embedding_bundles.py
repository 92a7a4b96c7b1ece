"""Embedding-only bundles (issue 36): a CLIP image tower exported from an offline timm hub cache is an
embedding model everywhere: the export log says so, `check` passes on parity and the protocol checks
and skips the label-based ones in one line, `evaluate` refuses in one line, and `embed` names an
unreadable file and goes on (--strict / --skip-unreadable as predict and evaluate).

The tower is timm's vit_base_patch32_clip_224 architecture shrunk by the hub config's ``model_args``
(what timm's push_to_hf_hub writes), with seeded weights moved away from timm's init so that a random
init could not pass for them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hf_cache import hub_env, timm_hub_folder, write_folder
from vitdeploy.manifest import is_embedding_model, model_kind

CLI = Path(sys.executable).parent / "vitdeploy"
REPO = "test-org/tiny-clip-tower"
ARCH = "vit_base_patch32_clip_224.openai"  # the tag: its pretrained config (512-d projection, CLIP mean/std)
ARGS = {"depth": 2, "embed_dim": 64, "num_heads": 2, "img_size": 64}  # 2x2 patches of 32: cheap, still a CLIP tower


def test_the_one_rule_reads_the_declared_outputs() -> None:
    assert is_embedding_model(["embedding", "patch_grid"]) and is_embedding_model(["patch_grid"])
    assert not is_embedding_model(["logits", "probs"]) and not is_embedding_model(["logits", "embedding"])
    assert not is_embedding_model(None) and not is_embedding_model([])  # manifests from before graph.outputs: classifiers
    assert model_kind(["embedding", "patch_grid"], 512, 0) == "an embedding model (512-d embedding, no classes)"
    assert model_kind(["logits", "probs"], None, 1000) == "1000 classes"


@pytest.fixture(scope="module")
def tower(tmp_path_factory) -> dict:
    """An offline HF cache holding the tower, and the bundle `vitdeploy export timm:hf-hub:...` wrote from it."""
    import timm
    import torch

    torch.manual_seed(0)
    model = timm.create_model(ARCH, pretrained=False, **ARGS).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    folder = timm_hub_folder(model, tmp_path_factory.mktemp("tower-folder"), ARGS)
    config = json.loads((folder / "config.json").read_text())
    assert config["num_classes"] == 512 and "label_names" not in config["pretrained_cfg"]  # a projection, as published
    home = tmp_path_factory.mktemp("hf-home")
    write_folder(home, REPO, folder)
    out = tmp_path_factory.mktemp("bundles") / "tower"
    env = hub_env(home)
    proc = _cli("export", f"timm:hf-hub:{REPO}", "-o", str(out), "--check-images", "4", env=env)
    return {"home": home, "env": env, "model": model, "out": out, "export": proc}


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow  # an export and a check, as processes
def test_clip_tower_exports_and_checks_as_an_embedding_model(tower) -> None:
    export = tower["export"]
    assert export.returncode == 0, export.stdout + export.stderr
    # progress lines are the log, on stderr (docs/DESIGN.md "Logging"); stdout holds the result alone
    assert "an embedding model (512-d embedding, no classes): the head is a CLIP-style projection" in export.stderr
    assert "512 classes" not in export.stdout + export.stderr
    assert export.stdout.strip() == f"bundle written: {tower['out']} (fp32)"
    manifest = json.loads((tower["out"] / "manifest.json").read_text())
    assert manifest["graph"]["outputs"] == ["embedding", "patch_grid"] and manifest["labels"] == []

    proc = _cli("check", str(tower["out"]), "--json", env=tower["env"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["passed"] and not report["failures"]
    fp32 = next(a for a in report["artifacts"] if a["precision"] == "fp32")
    row = fp32["sets"][0]
    assert row["embedding"]["cosine_min"] >= 0.9999 and row["patch_grid"]["cosine_min"] >= 0.9999
    assert row["embedding"]["max_rel"] <= 1e-4 and "logits" not in row
    gates = {g["name"] for g in fp32["gates"]}
    assert any(n.startswith("embedding cosine (worst image)") for n in gates)
    assert any(n.startswith("patch_grid cosine (worst image)") for n in gates)
    protocol = report["protocol"]
    assert protocol["preprocessing"]["passed"] and protocol["patch_grid"]["passed"]
    assert protocol["labels"]["passed"] is None and "an embedding model (512-d embedding" in protocol["labels"]["skipped"]

    # the embedding is timm's own forward of the tower (the projection), on images the graph preprocesses itself
    from vitdeploy.preprocess import normalise, random_images
    from vitdeploy.runtime.ort import OrtRunner

    import torch

    images = random_images(3, 64, 64, seed=7)
    got = OrtRunner(tower["out"] / "model.onnx").run({"images": images})["embedding"]
    x = torch.from_numpy(normalise(images, manifest["preprocessing"]).astype(np.float32))
    with torch.no_grad():
        want = tower["model"](x).numpy()
    assert got.shape == (3, 512) and np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))


@pytest.mark.slow
def test_check_says_in_one_line_why_label_metrics_are_skipped(tower) -> None:
    proc = _cli("check", str(tower["out"]), "--data", "digits:test", "--limit", "8", env=tower["env"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    skipped = [line for line in (proc.stdout + proc.stderr).splitlines() if "label-based metrics" in line]
    assert len(skipped) == 1 and "an embedding model (512-d embedding, no classes)" in skipped[0]
    assert "protocol - labels: skipped: an embedding model" in proc.stdout
    assert json.loads((tower["out"] / "reports" / "check.json").read_text())["reference"]["accuracy"] == {}


@pytest.mark.slow
def test_evaluate_refuses_an_embedding_model_in_one_line(tower) -> None:
    for extra in ([], ["--occlusion-map", "digits:test"]):
        proc = _cli("evaluate", str(tower["out"]), "--data", "digits:test", *extra, env=tower["env"])
        text = proc.stdout + proc.stderr
        assert proc.returncode == 2 and "Traceback" not in text, text
        line = text.strip().splitlines()[-1]
        assert "is an embedding model (512-d embedding, no classes) (outputs embedding,patch_grid)" in line
        assert "vitdeploy check" in line and "vitdeploy embed" in line
        assert not (tower["out"] / "reports" / "evaluate.json").exists()


@pytest.mark.slow
def test_embed_names_an_unreadable_file_and_goes_on(tower, tmp_path) -> None:
    from PIL import Image

    from vitdeploy.preprocess import random_images

    folder = tmp_path / "photos"
    folder.mkdir()
    for i, img in enumerate(random_images(3, 64, 64, seed=3)):
        Image.fromarray(img).save(folder / f"p{i}.png")
    (folder / "p1b.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")  # sorts between p1 and p2
    good = [str(folder / f"p{i}.png") for i in range(3)]
    bundle = str(tower["out"])

    out = tmp_path / "f.npy"
    proc = _cli("embed", bundle, str(folder), "-o", str(out))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 1 of 4 images could not be read (first: ") and "p1b.jpg" in last
    assert f"{folder / 'p1b.jpg'}: not embedded: cannot read image" in proc.stderr  # named in its place
    assert np.load(out).shape == (3, 512) and (tmp_path / "f.txt").read_text().splitlines() == good

    skip = tmp_path / "s.npy"
    proc = _cli("embed", bundle, str(folder), "-o", str(skip), "--skip-unreadable", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["shape"] == [3, 512] and [u["file"] for u in summary["unreadable"]] == [str(folder / "p1b.jpg")]
    assert np.array_equal(np.load(skip), np.load(out))

    strict = tmp_path / "t.npy"
    proc = _cli("embed", bundle, str(folder), "-o", str(strict), "--strict")
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith("error: cannot read image")
    assert not strict.exists() and not (tmp_path / "t.txt").exists()  # stopped before writing anything
    proc = _cli("embed", bundle, str(folder), "-o", str(strict), "--strict", "--skip-unreadable")
    assert proc.returncode == 2 and "give one of them" in proc.stderr


@pytest.mark.slow
def test_calibrate_and_convert_gate_an_embedding_model_on_its_embedding(tower, tmp_path) -> None:
    """An embedding model has no classes to agree on: `calibrate` (int8) and `convert --precision fp16`
    gate it on the embedding's cosine against fp32 on real images, say so, and refuse a graph below it."""
    import shutil

    bundle = tmp_path / "tower"
    shutil.copytree(tower["out"], bundle)
    proc = _cli("calibrate", str(bundle), "--data", "digits:train", "--samples", "64", "--eval-data", "digits:test",
                "--eval-limit", "48", "--method", "minmax", env=tower["env"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "embedding against fp32: int8 reference (fake-quant) cosine p1" in proc.stdout
    evaluation = json.loads((bundle / "manifest.json").read_text())["artifacts"]["int8"]["evaluation"]
    for execution in ("reference", "this_cpu"):
        scores = evaluation[execution]
        assert scores["scored"] == "embedding" and scores["accuracy"] is None and scores["top1_agreement"] is None
        assert 0.0 <= scores["neighbour_agreement"] <= 1.0
    assert evaluation["gate"]["passed"] and evaluation["reference"]["cosine_p1"] >= 0.99

    # the same gate refuses a graph below it, naming the embedding's cosine, and writes nothing
    strict = tmp_path / "strict"
    shutil.copytree(tower["out"], strict)
    proc = _cli("calibrate", str(strict), "--data", "digits:train", "--samples", "64", "--eval-data", "digits:test",
                "--eval-limit", "48", "--method", "minmax", "--min-cosine", "0.9999999", env=tower["env"])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert "embedding cosine (1st percentile of images)" in proc.stderr
    assert not (strict / "model.int8.onnx").exists()

    proc = _cli("convert", str(bundle), "--precision", "fp16", "--data", "digits:test", env=tower["env"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "embedding cosine p1" in proc.stdout
    wrote = next(line for line in proc.stdout.splitlines() if line.startswith("wrote model.fp16.onnx"))
    assert "max |d embedding|" in wrote and "agreement" not in wrote  # no classes to agree on
    gate = json.loads((bundle / "manifest.json").read_text())["artifacts"]["fp16"]["gate"]
    assert gate["passed"] and gate["task"]["scored"] == "embedding" and gate["task"]["cosine_p1"] >= 0.99
    assert gate["task"]["data"] == "digits:test" and gate["task"]["top1_agreement"] is None
