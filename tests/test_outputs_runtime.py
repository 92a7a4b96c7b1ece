"""The embedding and patch grid on the trained digits model: runtime, `vitdeploy embed`, `check`'s
per-output gates, the grid order proven by construction, and retrieval recall@1 for the fp32, fp16
and int8 graphs (cosine 1-NN, digits:train as index, digits:test as queries)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from vitdeploy.errors import UserError
from vitdeploy.gate import Gate

pytestmark = pytest.mark.slow

ALL = ("logits", "probs", "embedding", "patch_grid")


@pytest.fixture(scope="module")
def feat_bundle(export_cached):
    """The digits ViT with every output and an fp16 graph (verified against PyTorch on export)."""
    return export_cached("builtin:digits", outputs=ALL, precisions=("fp32", "fp16"), check_images=16)


@pytest.fixture(scope="module")
def int8_bundle(feat_bundle, tmp_path_factory):
    """A copy of it with a calibrated int8 graph (calibrate's gate includes the embedding)."""
    from vitdeploy.calibration.api import CalibrateOptions, calibrate_bundle

    root = tmp_path_factory.mktemp("int8") / "bundle"
    shutil.copytree(feat_bundle.root, root)
    record = calibrate_bundle(root, CalibrateOptions(method="percentile"))
    return root, record


def test_manifest_and_onnx_metadata_describe_every_output(feat_bundle):
    import onnx

    graph = feat_bundle.manifest["graph"]
    assert graph["outputs"] == list(ALL)
    details = graph["output_details"]
    assert details["embedding"]["readout"] == "cls" and details["embedding"]["l2_normalized"] is False
    assert details["patch_grid"]["shape"] == ["batch", 64, 8, 8]
    assert details["patch_grid"]["dropped_tokens"]["cls"] == 1 and "r*G_w + s" in details["patch_grid"]["order"]
    model = onnx.load(str(feat_bundle.artifact_path("fp32")))
    assert [o.name for o in model.graph.output] == list(ALL)
    props = {p.key: p.value for p in model.metadata_props}
    assert json.loads(props["vitdeploy.outputs"])["patch_grid"]["dropped_tokens"]["cls"] == 1
    docs = {o.name: o.doc_string for o in model.graph.output}
    assert "read-out cls" in docs["embedding"] and "row-major" in docs["patch_grid"]


def test_grid_order_by_construction(feat_bundle):
    """Changing the pixels of patch (r, s) changes patch_grid cell (r, s) more than any other cell."""
    from vitdeploy.builtin import get_builtin
    from vitdeploy.runtime.ort import OrtRunner

    images, _ = get_builtin("digits").load_split("test")
    base = images[:4]
    runner = OrtRunner(feat_bundle.artifact_path("fp32"))
    ref = runner.infer(base)["patch_grid"]
    p = feat_bundle.spec.patch_size[0]
    for r, s in [(0, 0), (1, 6), (6, 1), (7, 3), (3, 7)]:  # asymmetric cells: a transpose would show
        moved = base.copy()
        moved[:, r * p:(r + 1) * p, s * p:(s + 1) * p] = 255 - moved[:, r * p:(r + 1) * p, s * p:(s + 1) * p]
        change = np.linalg.norm(runner.infer(moved)["patch_grid"] - ref, axis=1)  # [B, G_h, G_w]
        for k in range(len(base)):
            assert np.unravel_index(change[k].argmax(), change[k].shape) == (r, s)


def test_classifier_embed_and_patch_grid(feat_bundle):
    from vitdeploy.builtin import get_builtin
    from vitdeploy.exporters.torch_runner import TorchRunner
    from vitdeploy.runtime.classifier import Classifier

    images, _ = get_builtin("digits").load_split("test")
    images = images[:10]
    ref = TorchRunner.from_bundle(feat_bundle).infer(images)
    with Classifier.load(feat_bundle.root, prefer=("onnxruntime",)) as clf:
        emb = clf.embed(images)
        grid = clf.patch_grid(list(images))
        unit = clf.embed(images[0], normalize=True)
        probs = clf.probabilities(images)
    assert emb.shape == (10, 64) and grid.shape == (10, 64, 8, 8)
    assert np.abs(emb - ref["embedding"]).max() <= 1e-4 and np.abs(grid - ref["patch_grid"]).max() <= 1e-4
    assert np.isclose(np.linalg.norm(unit), 1.0, atol=1e-5)
    assert np.abs(probs - ref["probs"]).max() <= 1e-5


def test_classifier_refuses_outputs_the_graph_lacks(digits_bundle):
    from vitdeploy.runtime.classifier import Classifier

    with Classifier.load(digits_bundle.root, prefer=("onnxruntime",)) as clf:
        with pytest.raises(UserError, match="re-export with --outputs logits,probs,embedding"):
            clf.embed(np.zeros((1, 32, 32, 3), np.uint8))


def test_embed_cli_writes_npy(feat_bundle, tmp_path):
    from click.testing import CliRunner
    from PIL import Image

    from vitdeploy.builtin import get_builtin
    from vitdeploy.cli import main

    images, _ = get_builtin("digits").load_split("test")
    for i in range(3):
        Image.fromarray(images[i]).save(tmp_path / f"d{i}.png")
    out = tmp_path / "f.npy"
    result = CliRunner().invoke(main, ["embed", str(feat_bundle.root), str(tmp_path), "-o", str(out), "--normalize"])
    assert result.exit_code == 0, result.output
    emb = np.load(out)
    assert emb.shape == (3, 64) and np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert (tmp_path / "f.txt").read_text().splitlines() == [str(tmp_path / f"d{i}.png") for i in range(3)]
    result = CliRunner().invoke(main, ["embed", str(feat_bundle.root), str(tmp_path / "d0.png"), "-o", str(tmp_path / "g.npy"), "--patch-grid"])
    assert result.exit_code == 0, result.output
    assert np.load(tmp_path / "g.npy").shape == (1, 64, 8, 8)
    result = CliRunner().invoke(main, ["embed", str(feat_bundle.root), str(tmp_path / "d0.png"), "-o", str(tmp_path / "g.bin")])
    assert result.exit_code == 2 and "ending in .npy" in result.output  # usage


def test_check_gates_every_output(feat_bundle, copy_bundle):
    from vitdeploy.checks import CheckOptions, run_check

    report = run_check(copy_bundle(feat_bundle), CheckOptions(random_count=8, precisions=("fp32", "fp16"), limit=64, write_report=False))
    assert report["passed"], report["failures"]
    fp32 = next(a for a in report["artifacts"] if a["precision"] == "fp32")
    names = {g["name"] for g in fp32["gates"]}
    assert any(n.startswith("max |dembedding|") for n in names) and any(n.startswith("patch_grid cosine (worst image)") for n in names)
    fp16 = next(a for a in report["artifacts"] if a["precision"] == "fp16")
    assert any(g["name"].startswith("embedding cosine (1st percentile") for g in fp16["gates"])
    # a gate that cannot pass shows the per-output gate is real
    strict = run_check(copy_bundle(feat_bundle, "strict"), CheckOptions(random_count=8, precisions=("fp16",), limit=64,
                                                                        gate=Gate(min_cosine=1.0), write_report=False))
    assert any("embedding cosine" in f for f in strict["failures"])


def test_retrieval_recall_fp32_fp16_int8(feat_bundle, int8_bundle):
    """Cosine 1-NN on the embedding: >= 97% recall@1 in fp32, int8 within 1 point of fp32."""
    from vitdeploy.retrieval import bundle_retrieval

    root, record = int8_bundle
    gate = record["evaluation"]["reference"]
    assert "embedding_cosine_p1" in gate and gate["embedding_cosine_p1"] >= 0.99  # calibrate's gate read it
    fp32 = bundle_retrieval(feat_bundle.root, "fp32")["recall_at_1"]
    fp16 = bundle_retrieval(feat_bundle.root, "fp16")["recall_at_1"]
    int8 = bundle_retrieval(root, "int8", optimization="basic")["recall_at_1"]  # TensorRT's arithmetic
    assert fp32 >= 0.97
    assert abs(fp16 - fp32) <= 0.01
    assert int8 >= fp32 - 0.01


def test_triton_repository_serves_the_feature_outputs(feat_bundle, export_cached, tmp_path):
    from vitdeploy.triton import TritonOptions, write_triton_repo

    model_dir = write_triton_repo(feat_bundle, tmp_path, TritonOptions(max_batch=8, kind="cpu"))
    config = (model_dir / "config.pbtxt").read_text()
    assert 'name: "embedding" data_type: TYPE_FP32 dims: [ 64 ]' in config
    assert 'name: "patch_grid" data_type: TYPE_FP32 dims: [ 64, 8, 8 ]' in config
    assert 'label_filename: "labels.txt"' in config
    provenance = json.loads((model_dir / "vitdeploy.json").read_text())
    assert provenance["outputs"]["patch_grid"]["dropped_tokens"]["cls"] == 1
    # a backbone bundle (the one tests/test_outputs.py exports): features only, no labels file
    dino = export_cached("timm:vit_small_patch14_reg4_dinov2", model_kwargs={"depth": 2, "img_size": 56}, check_images=8, random_init=True)
    model_dir = write_triton_repo(dino, tmp_path / "dino", TritonOptions(max_batch=4, kind="cpu", name="dino"))
    config = (model_dir / "config.pbtxt").read_text()
    assert 'name: "patch_grid" data_type: TYPE_FP32 dims: [ 384, 4, 4 ]' in config
    assert "probs" not in config and not (model_dir / "labels.txt").exists()


def test_classifier_export_is_unchanged_by_the_outputs_option(digits_bundle, export_cached):
    """--outputs logits,probs is the classifier graph as it always was (same bytes, same hash)."""
    explicit = export_cached("builtin:digits", outputs=("logits", "probs"))
    assert explicit.artifact_record("fp32")["sha256"] == digits_bundle.artifact_record("fp32")["sha256"]


def test_normalized_embedding_and_grid_after_in_graph_resize(export_cached):
    """--normalize-embedding gives unit rows; with --resize the grid is the resized model input's."""
    from vitdeploy.builtin import get_builtin
    from vitdeploy.exporters.torch_runner import TorchRunner
    from vitdeploy.runtime.ort import OrtRunner

    bundle = export_cached("builtin:digits", outputs=("embedding", "patch_grid"), normalize_embedding=True, resize=True, check_images=8)
    record = bundle.manifest["records"]["export_check"]
    assert record["passed"], record["failures"]
    details = bundle.manifest["graph"]["output_details"]
    assert details["embedding"]["l2_normalized"] is True
    assert "after the in-graph resize to 32x32" in details["patch_grid"]["order"]
    frames = np.stack([np.kron(img, np.ones((2, 3, 1), np.uint8)) for img in get_builtin("digits").load_split("test")[0][:4]])  # 64x96
    got = OrtRunner(bundle.artifact_path("fp32")).infer(frames)
    assert got["patch_grid"].shape == (4, 64, 8, 8)
    assert np.allclose(np.linalg.norm(got["embedding"], axis=1), 1.0, atol=1e-5)
    ref = TorchRunner.from_bundle(bundle).infer(frames)
    assert np.abs(ref["embedding"] - got["embedding"]).max() <= 1e-4


def test_check_on_a_backbone_bundle(export_cached):
    """A headless bundle (no logits) is checked on its embedding and grid; labels: 0 for 0 classes."""
    from vitdeploy.checks import CheckOptions, run_check

    dino = export_cached("timm:vit_small_patch14_reg4_dinov2", model_kwargs={"depth": 2, "img_size": 56}, check_images=8, random_init=True)
    report = run_check(dino.root, CheckOptions(random_count=8, write_report=False))
    assert report["passed"], report["failures"]
    gates = {g["name"].split(" on ")[0] for g in report["artifacts"][0]["gates"]}
    assert gates == {"max |dembedding|", "max |dembedding| / spread across images", "embedding cosine (worst image)",
                     "max |dpatch_grid|", "max |dpatch_grid| / spread across images", "patch_grid cosine (worst image)"}
    assert report["artifacts"][0]["batch_consistency"]["output"] == "embedding"
